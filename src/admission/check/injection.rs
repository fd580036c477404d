//! The injection check: whether a pod created now, or an existing pod, gets
//! drafs, and if not, why not, by the configurations' selectors and the
//! webhook's own rules (`policy`).

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use serde_json::{Value, json};

use super::configuration::{covers_pod_create, drafs_entries, entry_path, selects};
use super::pod::{drafs_container, is_sidecar};
use super::{Check, Status};
use crate::admission::inject::{self, Mode};
use crate::admission::policy::{self, INJECT_LABEL, OptIn, Requested};

/// What the API server and the webhook would do with a pod created now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Injection {
    /// The entry `entry` (of `configuration`) sends it, and the webhook does `requested`.
    Sent { configuration: String, entry: String, requested: Requested },
    /// The entry sends it to a path the webhook does not answer (it is refused under failurePolicy Fail).
    UnknownPath { entry: String, path: String },
    /// No entry sends it: why not, per entry.
    NotSent { reasons: Vec<String> },
}

/// What happens to a pod with `pod_labels` created in a namespace with
/// `namespace_labels`, by the configurations' selectors and the webhook's rules.
pub fn injection(
    configurations: &[MutatingWebhookConfiguration],
    namespace_labels: &BTreeMap<String, String>,
    pod_labels: &BTreeMap<String, String>,
    namespace_mode: Mode,
) -> Injection {
    let entries = drafs_entries(configurations);
    if entries.is_empty() {
        return Injection::NotSent { reasons: vec!["no webhook configuration has drafs's entries".into()] };
    }
    let mut reasons = Vec::new();
    for (configuration, entry) in entries {
        if !covers_pod_create(entry) {
            reasons.push(format!("{}: its rules do not cover creating pods", entry.name));
            continue;
        }
        if let Err(why) = selects(entry.namespace_selector.as_ref(), namespace_labels) {
            reasons.push(format!("{}: the namespace does not match {why}", entry.name));
            continue;
        }
        if let Err(why) = selects(entry.object_selector.as_ref(), pod_labels) {
            reasons.push(format!("{}: the pod does not match {why}", entry.name));
            continue;
        }
        let path = entry_path(entry);
        let Some(opt_in) = policy::opt_in_of_path(&path, namespace_mode) else {
            return Injection::UnknownPath { entry: entry.name.clone(), path };
        };
        let requested = policy::requested(pod_labels.get(INJECT_LABEL).map(String::as_str), opt_in);
        return Injection::Sent { configuration, entry: entry.name.clone(), requested };
    }
    Injection::NotSent { reasons }
}

/// The namespace's labels as the API server sees them (it sets
/// `kubernetes.io/metadata.name` on every namespace).
pub fn namespace_labels(name: &str, labels: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
    let mut labels = labels.cloned().unwrap_or_default();
    labels.entry("kubernetes.io/metadata.name".into()).or_insert_with(|| name.to_string());
    labels
}

fn mode_source(mode: Mode, known: bool) -> String {
    if known {
        format!("{}, the webhook's --namespace-mode", mode.label())
    } else {
        format!("{}, the default: the webhook's --namespace-mode could not be read", mode.label())
    }
}

/// The injection check for a namespace: what an unlabelled pod with resource
/// claims gets, and what a labelled one gets.
pub fn namespace_injection(
    configurations: &[MutatingWebhookConfiguration],
    namespace: &str,
    labels: &BTreeMap<String, String>,
    namespace_mode: Option<Mode>,
) -> Check {
    let mode = namespace_mode.unwrap_or(Mode::Init);
    let unlabelled = injection(configurations, labels, &BTreeMap::new(), mode);
    let labelled_pod = BTreeMap::from([(INJECT_LABEL.to_string(), Mode::Init.label().to_string())]);
    let labelled = injection(configurations, labels, &labelled_pod, mode);
    let ns_label = labels.get(INJECT_LABEL).map(|v| format!("{INJECT_LABEL}={v}"));
    let gets = |i: &Injection| matches!(i, Injection::Sent { requested: Requested::Mode(Ok(_)), .. });
    let entry_of = |i: &Injection| match i {
        Injection::Sent { entry, .. } => Some(entry.clone()),
        _ => None,
    };
    let details = json!({
        "namespaceLabel": labels.get(INJECT_LABEL),
        "unlabelledPods": {"injected": gets(&unlabelled), "entry": entry_of(&unlabelled),
                           "mode": gets(&unlabelled).then(|| mode.label())},
        "labelledPods": {"injected": gets(&labelled), "entry": entry_of(&labelled)},
        "namespaceMode": mode.label(),
        "namespaceModeKnown": namespace_mode.is_some(),
    });
    if let Injection::UnknownPath { entry, path } = unlabelled.clone() {
        return Check::new(
            "injection",
            Status::Fail,
            format!(
                "{entry} posts to {path}, which drafs webhook does not answer (only /mutate and /mutate/namespace): pods are refused or admitted without drafs"
            ),
            details,
        );
    }
    match (gets(&unlabelled), gets(&labelled)) {
        (true, _) => Check::new(
            "injection",
            Status::Ok,
            format!(
                "injected, mode {}: namespace {namespace} is labelled {} ({}); every pod that asks for devices (resource claims or extended resources) gets drafs unless labelled {INJECT_LABEL}=disabled, a pod's {INJECT_LABEL}=<mode> label chooses its mode",
                mode.label(),
                ns_label.unwrap_or_default(),
                mode_source(mode, namespace_mode.is_some()),
            ),
            details,
        ),
        (false, true) => Check::new(
            "injection",
            Status::Ok,
            format!(
                "pods labelled {INJECT_LABEL}=<mode> (init, sidecar-files, sidecar-fuse, csi) get drafs; namespace {namespace} is not opted in, so unlabelled pods do not"
            ),
            details,
        )
        .with_fix(format!("kubectl label namespace {namespace} {INJECT_LABEL}=enabled (to inject every pod that asks for devices)")),
        (false, false) if drafs_entries(configurations).is_empty() => Check::new(
            "injection",
            Status::Warn,
            format!(
                "no webhook: pods of namespace {namespace} get drafs only from their manifests (drafs inject --mode MODE, or as in examples/)"
            ),
            details,
        )
        .with_fix("helm install drafs deploy/helm/drafs -n drafs-system --create-namespace (to add drafs at admission)"),
        (false, false) => {
            let reasons = match labelled {
                Injection::NotSent { reasons } => reasons.join("; "),
                _ => String::new(),
            };
            Check::new("injection", Status::Fail, format!("no pod of namespace {namespace} gets drafs: {reasons}"), details)
        }
    }
}

fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

/// The injection check for an existing pod: does it run drafs, and if not,
/// why not. `csi_driver`: the driver a drafs volume names (mode csi).
pub fn pod_injection(
    configurations: &[MutatingWebhookConfiguration],
    namespace_labels: &BTreeMap<String, String>,
    pod: &Value,
    namespace_mode: Option<Mode>,
    csi_driver: &str,
) -> Check {
    let mode = namespace_mode.unwrap_or(Mode::Init);
    let labels = labels_of(pod);
    let outcome = injection(configurations, namespace_labels, &labels, mode);
    let has_claims = pod["spec"]["resourceClaims"].as_array().is_some_and(|c| !c.is_empty());
    let asks_for_devices = inject::spec_asks_for_devices(&pod["spec"]);
    let label = labels.get(INJECT_LABEL);
    let mut details = json!({"injected": false, "mode": null, "entry": null, "podLabel": label,
                             "namespaceLabel": namespace_labels.get(INJECT_LABEL), "resourceClaims": has_claims,
                             "asksForDevices": asks_for_devices});
    if let Injection::Sent { entry, .. } = &outcome {
        details["entry"] = json!(entry);
    }
    if let Some(volume) = inject::csi_volume_of(&pod["spec"], csi_driver) {
        details["injected"] = json!(true);
        details["mode"] = json!(Mode::Csi.label());
        return Check::new(
            "injection",
            Status::Ok,
            format!(
                "injected, mode csi: volume {volume} is served by drafs node on the pod's node (kubectl describe pod shows a FailedMount while it waits)"
            ),
            details,
        );
    }
    if let Some(container) = drafs_container(pod) {
        let kind = if is_sidecar(container) { "a native sidecar" } else { "an init container" };
        let shown = container_mode(container);
        details["injected"] = json!(true);
        details["mode"] = json!(shown);
        let why = match (&outcome, label) {
            (Injection::Sent { entry, .. }, Some(l)) => format!("label {INJECT_LABEL}={l}, entry {entry}"),
            (Injection::Sent { entry, .. }, None) => format!("namespace opted in, entry {entry}"),
            _ => "added to its manifest (drafs inject) or by a webhook configuration since changed".to_string(),
        };
        return Check::new(
            "injection",
            Status::Ok,
            format!("injected, mode {shown}: drafs runs as {kind} ({why})"),
            details,
        );
    }
    // Opted out whether or not an entry sends the pod (in an opted-in namespace none does).
    let opted_out = policy::requested(label.map(String::as_str), OptIn::Pod) == Requested::OptedOut;
    let opted_out_message =
        || format!("not injected: the pod opted out with label {INJECT_LABEL}={}", policy::DISABLED);
    let (status, message) = match &outcome {
        _ if !asks_for_devices => (
            Status::Fail,
            "not injected: the pod asks for no device (no spec.resourceClaims, no extended resource in a container's resources), drafs is only added to pods that do"
                .to_string(),
        ),
        _ if opted_out => (Status::Fail, opted_out_message()),
        Injection::Sent { requested: Requested::OptedOut, .. } => (Status::Fail, opted_out_message()),
        Injection::Sent { requested: Requested::Mode(Err(message)), .. } => {
            (Status::Fail, format!("not injected: {message} (the webhook denies such a pod)"))
        }
        Injection::Sent { requested: Requested::Nothing, entry, .. } => {
            (Status::Fail, format!("not injected: {entry} sends the pod but it has no {INJECT_LABEL} label"))
        }
        Injection::Sent { requested: Requested::Mode(Ok(m)), entry, .. } => (
            Status::Fail,
            format!(
                "no drafs container, though a pod like it created now gets drafs (mode {}, entry {entry}): it was created before the webhook or its label; recreate it",
                m.label()
            ),
        ),
        Injection::UnknownPath { entry, path } => {
            (Status::Fail, format!("not injected: {entry} posts to {path}, which drafs webhook does not answer"))
        }
        Injection::NotSent { reasons } if label.is_none() => (
            Status::Fail,
            format!(
                "not injected: the pod has no {INJECT_LABEL} label and its namespace is not opted in ({})",
                reasons.join("; ")
            ),
        ),
        Injection::NotSent { reasons } => (Status::Fail, format!("not injected: {}", reasons.join("; "))),
    };
    Check::new("injection", status, message, details)
}

/// The mode an injected container runs in, from its arguments.
fn container_mode(container: &Value) -> &'static str {
    let args: Vec<&str> = container["args"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if !is_sidecar(container) {
        Mode::Init.label()
    } else if args.windows(2).any(|w| w == ["--backend", "files"]) || args.contains(&"--backend=files") {
        Mode::SidecarFiles.label()
    } else {
        Mode::SidecarFuse.label()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::check::configuration;
    use crate::admission::check::tests::{labels, pod, shipped};

    #[test]
    fn the_shipped_configuration_follows_the_documented_precedence() {
        let configs = shipped();
        let ns = |name: &str, extra: &[(&str, &str)]| namespace_labels(name, Some(&labels(extra)));
        let sent = |ns_labels: &BTreeMap<String, String>, pod: &[(&str, &str)]| match injection(
            &configs,
            ns_labels,
            &labels(pod),
            Mode::SidecarFiles,
        ) {
            Injection::Sent { entry, requested, .. } => format!("{entry} {requested:?}"),
            Injection::NotSent { .. } => "not sent".into(),
            Injection::UnknownPath { .. } => "unknown path".into(),
        };
        let opted = ns("ml", &[(INJECT_LABEL, "enabled")]);
        let plain = ns("ml", &[]);
        let label = |v| [(INJECT_LABEL, v)];
        assert_eq!(sent(&opted, &[]), "namespaces.drafs.dev Mode(Ok(SidecarFiles))");
        assert_eq!(sent(&opted, &label("init")), "namespaces.drafs.dev Mode(Ok(Init))");
        assert_eq!(sent(&opted, &label("disabled")), "not sent");
        assert_eq!(sent(&plain, &[]), "not sent");
        assert_eq!(sent(&plain, &label("sidecar-fuse")), "pods.drafs.dev Mode(Ok(SidecarFuse))");
        assert_eq!(sent(&plain, &label("disabled")), "pods.drafs.dev OptedOut");
        assert!(sent(&plain, &label("nonsense")).starts_with("pods.drafs.dev Mode(Err("));
        assert_eq!(sent(&ns("kube-system", &[(INJECT_LABEL, "enabled")]), &label("init")), "not sent");

        let check = namespace_injection(&configs, "ml", &opted, None);
        assert_eq!(check.status, Status::Ok);
        assert!(check.message.starts_with("injected, mode init:"), "{}", check.message);
        assert!(check.message.contains("could not be read"), "{}", check.message);
        let check = namespace_injection(&configs, "ml", &plain, Some(Mode::Init));
        assert_eq!(check.status, Status::Ok);
        assert!(check.fix.unwrap().contains("kubectl label namespace ml drafs.dev/inject=enabled"));
        let check = namespace_injection(&configs, "kube-system", &ns("kube-system", &[]), Some(Mode::Init));
        assert_eq!(check.status, Status::Fail);
        assert!(check.message.contains("kubernetes.io/metadata.name NotIn [drafs-system, kube-system] (it is kubernetes.io/metadata.name=kube-system)"), "{}", check.message);
        // No webhook: drafs from manifests is a supported way, a warning (exit 0).
        assert_eq!(configuration::configuration(&[]).status, Status::Warn);
        let none = namespace_injection(&[], "ml", &opted, None);
        assert_eq!(none.status, Status::Warn);
        assert!(
            none.message.starts_with("no webhook: pods of namespace ml get drafs only from their manifests"),
            "{}",
            none.message
        );
        assert_eq!(
            configuration::configuration(&configs).message,
            "webhook entries drafs/pods.drafs.dev, drafs/namespaces.drafs.dev"
        );
    }

    #[test]
    fn a_pod_says_why_it_has_or_lacks_drafs() {
        let configs = shipped();
        let plain = namespace_labels("ml", None);
        let check = |p: &Value| pod_injection(&configs, &plain, p, Some(Mode::Init), "drafs.dev");
        let c = check(&pod(json!({INJECT_LABEL: "disabled"}), true, None));
        assert_eq!(
            (c.status, c.message.as_str()),
            (Status::Fail, "not injected: the pod opted out with label drafs.dev/inject=disabled")
        );
        let opted = namespace_labels("ml", Some(&labels(&[(INJECT_LABEL, "enabled")])));
        let c = pod_injection(&configs, &opted, &pod(json!({INJECT_LABEL: "disabled"}), true, None), None, "drafs.dev");
        assert_eq!(c.message, "not injected: the pod opted out with label drafs.dev/inject=disabled");
        let c = check(&pod(json!({}), false, None));
        assert!(c.message.contains("asks for no device"), "{}", c.message);
        // An extended resource (KEP-5004) is a device request too.
        let mut extended = pod(json!({}), false, None);
        extended["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
        let c = check(&extended);
        assert!(c.message.contains("has no drafs.dev/inject label"), "{}", c.message);
        assert_eq!(c.details["asksForDevices"], true);
        let c = check(&pod(json!({}), true, None));
        assert!(
            c.message
                .starts_with("not injected: the pod has no drafs.dev/inject label and its namespace is not opted in"),
            "{}",
            c.message
        );
        let c = check(&pod(json!({INJECT_LABEL: "init"}), true, None));
        assert!(c.message.contains("recreate it"), "{}", c.message);
        let sidecar = json!({"name": "drafs", "restartPolicy": "Always", "args": ["serve", "--backend", "files"]});
        let c = check(&pod(json!({INJECT_LABEL: "sidecar-files"}), true, Some(sidecar)));
        assert_eq!(c.status, Status::Ok);
        assert!(
            c.message.starts_with("injected, mode sidecar-files: drafs runs as a native sidecar (label"),
            "{}",
            c.message
        );
        assert_eq!(c.details["mode"], "sidecar-files");
    }

    /// A pod's drafs volume is known by the driver the chart installed (`--csi-driver`).
    #[test]
    fn a_csi_pod_is_known_by_the_driver_it_names() {
        let configs = shipped();
        let plain = namespace_labels("ml", None);
        let mut p = pod(json!({INJECT_LABEL: "csi"}), true, None);
        p["spec"]["volumes"] = json!([{"name": "devices", "csi": {"driver": "node.drafs.example", "readOnly": true}}]);
        let c = pod_injection(&configs, &plain, &p, None, "node.drafs.example");
        assert_eq!((c.status, &c.details["mode"]), (Status::Ok, &json!("csi")), "{}", c.message);
        assert!(c.message.starts_with("injected, mode csi: volume devices is served by drafs node"), "{}", c.message);
        let c = pod_injection(&configs, &plain, &p, None, "drafs.dev");
        assert_eq!((c.status, &c.details["injected"]), (Status::Fail, &json!(false)), "{}", c.message);
    }
}
