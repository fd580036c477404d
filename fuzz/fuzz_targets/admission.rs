//! Any request body the webhook could be sent, on either of its paths (the
//! first input byte picks `OptIn::Pod` or `OptIn::Namespace(mode)`, any mode; the rest
//! is the body): never a panic; a review it answers is an AdmissionReview for
//! the same uid, allowed unless denied; and a patch it returns is the one the
//! answer carries, and (for a review that is JSON throughout, as an API
//! server sends) applies (RFC 6902, as the API server applies it) to the pod
//! it was given and makes of it what `drafs inject` makes of the whole pod,
//! which `inject` then leaves as it is.
#![no_main]

use drafs::admission::decision::{self, Verdict};
use drafs::admission::inject::{self, Mode, Outcome};
use drafs::admission::policy::{self, INJECT_LABEL, OptIn};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const IMAGE: &str = "drafs:fuzz";

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else { return };
    let opt_in = match selector % 5 {
        0 => OptIn::Pod,
        1 => OptIn::Namespace(Mode::Init),
        2 => OptIn::Namespace(Mode::SidecarFuse),
        3 => OptIn::Namespace(Mode::SidecarFiles),
        _ => OptIn::Namespace(Mode::Csi),
    };
    let defaults = policy::Defaults::new(IMAGE);
    let Ok((answer, verdict)) = decision::review(body, &defaults, opt_in) else { return };
    // The webhook reads only the parts of the review it uses: the rest may be
    // what no JSON parser takes (bytes that are not UTF-8, numbers out of
    // range, in a member it skips). Its uid is read as the webhook reads it.
    let uid = serde_json::from_slice::<Envelope>(body).expect("a reviewed body has a request").request.uid;
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    let response = &answer["response"];
    assert_eq!(response["uid"], uid.expect("a reviewed request has a uid"));
    assert_eq!(response["allowed"], !matches!(verdict, Verdict::Denied { .. }), "{answer}");
    let Verdict::Patched { patch, .. } = verdict else {
        assert!(response.get("patch").is_none(), "a patch in an answer that is not Patched: {answer}");
        return;
    };
    // The answer carries the verdict's patch, base64-encoded.
    assert_eq!(response["patchType"], "JSONPatch");
    let carried: k8s_openapi::ByteString =
        serde_json::from_value(response["patch"].clone()).expect("the answer's patch is base64");
    assert_eq!(carried.0, patch.as_bytes(), "the answer carries another patch than the verdict's");
    let patch: Vec<Value> = serde_json::from_str(&patch).expect("the patch is a JSON array");
    assert!(patch.iter().all(|op| op["path"].as_str().is_some_and(|p| p.starts_with("/spec/"))), "{patch:?}");
    // What follows needs the whole pod: a review an API server could send (JSON throughout).
    let Ok(request) = serde_json::from_slice::<Value>(body) else { return };
    let pod = &request["request"]["object"];
    let mut patched = pod.clone();
    if let Err(e) = json_patch::apply(&mut patched, &patch) {
        panic!("the patch does not apply to the pod: {e}\npod: {pod}\npatch: {patch:?}");
    }
    // The webhook's options come from the pod (a pod of an opted-in namespace
    // without the label gets the namespace's mode): inject on the whole pod with them.
    let mut labelled = pod.clone();
    if let OptIn::Namespace(mode) = opt_in
        && labelled.pointer("/metadata/labels").and_then(|l| l.get(INJECT_LABEL)).is_none()
    {
        // Whatever shape the metadata had, the webhook read no label from it
        // (indexing a null makes it an object; any other non-object would panic).
        if !labelled["metadata"].is_object() {
            labelled["metadata"] = Value::Null;
        }
        if !labelled["metadata"]["labels"].is_object() {
            labelled["metadata"]["labels"] = Value::Null;
        }
        labelled["metadata"]["labels"][INJECT_LABEL] = mode.label().into();
    }
    let opts = policy::options_of(&labelled, &defaults).expect("a patched pod has valid options");
    let mut injected = pod.clone();
    injected["kind"] = "Pod".into();
    inject::inject_value(&mut injected, &opts, &mut Vec::new()).expect("inject accepts a pod the webhook patched");
    patched["kind"] = "Pod".into();
    assert_eq!(patched, injected, "the patched pod is not what inject makes of it");
    // The patched pod has drafs: inject leaves it as it is.
    let mut again = patched.clone();
    let mut outcomes = Vec::new();
    inject::inject_value(&mut again, &opts, &mut outcomes).expect("inject accepts the patched pod");
    assert!(matches!(outcomes.as_slice(), [Outcome::AlreadyInjected(_)]), "{outcomes:?}");
    assert_eq!(again, patched, "inject changed a pod the webhook had patched");
});

/// The review's uid, its other members skipped (not parsed) as the webhook skips them.
#[derive(serde::Deserialize)]
struct Envelope {
    request: Request,
}

#[derive(serde::Deserialize)]
struct Request {
    #[serde(default)]
    uid: Option<Value>,
}

/// A JSON Patch (RFC 6902) applier for the operations the webhook sends
/// (`add`, `remove`, `replace`), strict as the API server's: written here,
/// not taken from drafs, so the webhook's patches are checked against the RFC.
mod json_patch {
    use serde_json::Value;

    pub fn apply(doc: &mut Value, patch: &[Value]) -> Result<(), String> {
        for op in patch {
            let path = op.get("path").and_then(Value::as_str).ok_or_else(|| format!("no path: {op}"))?;
            let tokens = pointer(path)?;
            let Some((last, parents)) = tokens.split_last() else {
                return Err(format!("an operation on the whole document: {op}"));
            };
            let mut parent = &mut *doc;
            for token in parents {
                parent = match parent {
                    Value::Object(map) => map.get_mut(token),
                    Value::Array(items) => index(token).and_then(|i| items.get_mut(i)),
                    _ => None,
                }
                .ok_or_else(|| format!("no parent: {op}"))?;
            }
            let value = || op.get("value").cloned().ok_or_else(|| format!("no value: {op}"));
            match (op.get("op").and_then(Value::as_str), parent) {
                (Some("add"), Value::Object(map)) => {
                    map.insert(last.clone(), value()?);
                }
                (Some("add"), Value::Array(items)) => {
                    let at = if last == "-" { Some(items.len()) } else { index(last) };
                    match at {
                        Some(at) if at <= items.len() => items.insert(at, value()?),
                        _ => return Err(format!("bad array index: {op}")),
                    }
                }
                (Some("remove"), Value::Object(map)) => {
                    map.shift_remove(last).ok_or_else(|| format!("nothing to remove: {op}"))?;
                }
                (Some("remove"), Value::Array(items)) => match index(last) {
                    Some(at) if at < items.len() => {
                        items.remove(at);
                    }
                    _ => return Err(format!("bad array index: {op}")),
                },
                (Some("replace"), Value::Object(map)) => {
                    let new = value()?;
                    *map.get_mut(last).ok_or_else(|| format!("nothing to replace: {op}"))? = new;
                }
                (Some("replace"), Value::Array(items)) => {
                    let new = value()?;
                    *index(last).and_then(|i| items.get_mut(i)).ok_or_else(|| format!("bad array index: {op}"))? = new;
                }
                (Some("add" | "remove" | "replace"), _) => return Err(format!("the parent is a scalar: {op}")),
                _ => return Err(format!("not an operation the webhook sends: {op}")),
            }
        }
        Ok(())
    }

    /// The reference tokens of a JSON Pointer (RFC 6901).
    fn pointer(path: &str) -> Result<Vec<String>, String> {
        if path.is_empty() {
            return Ok(Vec::new());
        }
        let rest = path.strip_prefix('/').ok_or_else(|| format!("pointer {path:?} does not start with /"))?;
        rest.split('/')
            .map(|raw| {
                let mut token = String::new();
                let mut chars = raw.chars();
                while let Some(c) = chars.next() {
                    if c != '~' {
                        token.push(c);
                        continue;
                    }
                    match chars.next() {
                        Some('0') => token.push('~'),
                        Some('1') => token.push('/'),
                        _ => return Err(format!("bad escape in pointer {path:?}")),
                    }
                }
                Ok(token)
            })
            .collect()
    }

    /// An array index: `0` or digits without a leading zero.
    fn index(token: &str) -> Option<usize> {
        let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
        (digits && (token == "0" || !token.starts_with('0'))).then(|| token.parse().ok()).flatten()
    }
}
