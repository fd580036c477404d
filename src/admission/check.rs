//! `drafs check`: will drafs work for a namespace or a pod, and if not, why.
//!
//! Pure: the objects `cmd/check.rs` read (the webhook configurations, the
//! Namespace, the Pod and its Events) and what it measured (the access
//! reviews, the webhook's answer and served certificate) go in; a report of
//! one line per check, with a fix where there is one, comes out. The opt-in
//! rules are the webhook's own (`policy::requested`), the permissions the
//! ones `drafs manifests rbac` prints (`manifests::grants`).

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::core::{Expression, SelectorExt};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::{Value, json};

use crate::admission::inject::{self, Mode};
use crate::admission::manifests::Grant;
use crate::admission::policy::{self, INJECT_LABEL, OptIn, Requested};
use crate::publish::events::{NOT_READY, READY};

/// The names of drafs's entries in a MutatingWebhookConfiguration (the
/// kustomize base and the chart both use them): how `check` finds drafs's
/// configurations whatever they are called.
pub const ENTRY_NAMES: [&str; 2] = ["pods.drafs.dev", "namespaces.drafs.dev"];

/// Certificates (the served leaf, the CA in `caBundle`) that expire within
/// this many days are a warning: cert-manager, as shipped, renews the serving
/// certificate 15 days before it expires, so one with less left was not renewed.
pub const EXPIRY_WARNING_DAYS: i64 = 14;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Ok,
    /// Works, but look at it (never changes the exit code).
    Warn,
    /// drafs will not work: exit 1.
    Fail,
    /// Does not apply here (no pod given, no drafs container).
    Skip,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// configuration, injection, rbac, webhook, pod.
    pub name: &'static str,
    pub status: Status,
    /// One line.
    pub message: String,
    /// A command that fixes it.
    pub fix: Option<String>,
    /// The facts behind the message, for `-o json`.
    pub details: Value,
}

impl Check {
    fn new(name: &'static str, status: Status, message: impl Into<String>, details: Value) -> Self {
        Check { name, status, message: one_line(&message.into()), fix: None, details }
    }

    fn with_fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

/// What was checked, and how it came out.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub namespace: String,
    pub pod: Option<String>,
    pub checks: Vec<Check>,
}

impl Report {
    /// The checks that failed: any makes the exit code 1.
    pub fn failed(&self) -> usize {
        self.checks.iter().filter(|c| c.status == Status::Fail).count()
    }

    fn subject(&self) -> String {
        match &self.pod {
            Some(pod) => format!("pod {}/{pod}", self.namespace),
            None => format!("namespace {}", self.namespace),
        }
    }

    /// The report as `-o json` prints it (docs/operations.md documents the shape).
    pub fn to_json(&self) -> Value {
        let checks: Vec<Value> = self
            .checks
            .iter()
            .map(|c| {
                let mut v =
                    json!({"name": c.name, "status": c.status.label(), "message": c.message, "details": c.details});
                if let Some(fix) = &c.fix {
                    v["fix"] = json!(fix);
                }
                v
            })
            .collect();
        json!({
            "namespace": self.namespace,
            "pod": self.pod,
            "verdict": if self.failed() == 0 { "ok" } else { "fail" },
            "failed": self.failed(),
            "checks": checks,
        })
    }

    /// One line per check, its fix under it, and the verdict.
    pub fn to_text(&self) -> String {
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        let mut out = format!("drafs check: {}\n", self.subject());
        for c in &self.checks {
            let status = match c.status {
                Status::Fail => "FAIL",
                other => other.label(),
            };
            // Every check's text may hold the cluster's words: one line, bounded, whatever built it.
            out.push_str(&format!("{status:<4}  {:<width$}  {}\n", c.name, shown(&c.message)));
            if let Some(fix) = &c.fix {
                out.push_str(&format!("      {:<width$}  fix: {}\n", "", shown(fix)));
            }
        }
        match self.failed() {
            0 => out.push_str(&format!("verdict: ok, drafs will work for {}\n", self.subject())),
            n => out.push_str(&format!(
                "verdict: FAIL, {n} check{} failed: drafs will not work for {}\n",
                if n == 1 { "" } else { "s" },
                self.subject()
            )),
        }
        out
    }
}

/// The most characters of one check's message on a terminal.
const MAX_MESSAGE: usize = 2048;

/// [`one_line`], cut at [`MAX_MESSAGE`] characters.
fn shown(text: &str) -> String {
    let line = one_line(text);
    match crate::model::names::cut(&line, MAX_MESSAGE) {
        (head, true) => format!("{head}…"),
        (_, false) => line,
    }
}

/// Text for one line of a terminal: control characters (newlines in a
/// termination message, escape sequences) become spaces, runs of spaces one.
fn one_line(text: &str) -> String {
    text.split(|c: char| c.is_control() || c == ' ').filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" ")
}

// ---------------------------------------------------------------------------
// Label selectors, as the API server evaluates a webhook's.

/// Whether `selector` selects `labels`: `Err` names the first requirement
/// that does not hold. No selector, or an empty one, selects everything.
///
/// Each requirement is evaluated by kube-core (`Expression`, the matching
/// `Selector::matches` runs one expression at a time), in the order the API
/// server reads them (`matchLabels`, then `matchExpressions`). Not
/// `Selector::matches` on the whole selector: it answers only yes or no,
/// and the report says which requirement left the namespace or pod out.
pub fn selects(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> Result<(), String> {
    let Some(selector) = selector else { return Ok(()) };
    for (key, want) in selector.match_labels.iter().flatten() {
        if !Expression::Equal(key.clone(), want.clone()).matches(labels) {
            return Err(match labels.get(key) {
                Some(have) => format!("{key}={want} (it is {key}={have})"),
                None => format!("{key}={want} (no such label)"),
            });
        }
    }
    for req in selector.match_expressions.iter().flatten() {
        let values = req.values.clone().unwrap_or_default();
        // kube-core refuses `In` and `NotIn` without a list (so does the
        // API server); as an empty list they select nothing and everything.
        let requirement = LabelSelectorRequirement { values: Some(values.clone()), ..req.clone() };
        let Ok(expression) = Expression::try_from(requirement) else {
            return Err(format!("{} {}: not an operator the API server accepts", req.key, req.operator));
        };
        if !expression.matches(labels) {
            let it = match labels.get(&req.key) {
                Some(h) => format!("it is {}={h}", req.key),
                None => "no such label".to_string(),
            };
            let list = if values.is_empty() { String::new() } else { format!(" [{}]", values.join(", ")) };
            return Err(format!("{} {}{list} ({it})", req.key, req.operator));
        }
    }
    Ok(())
}

/// Whether the entry's rules send pod creations (`CREATE` of `v1` `pods`).
fn covers_pod_create(entry: &MutatingWebhook) -> bool {
    let has = |list: &Option<Vec<String>>, want: &str| list.iter().flatten().any(|v| v == want || v == "*");
    entry.rules.iter().flatten().any(|r| {
        has(&r.operations, "CREATE")
            && has(&r.api_groups, "")
            && has(&r.api_versions, "v1")
            && r.resources.iter().flatten().any(|v| v == "pods" || v == "*" || v == "*/*")
            && r.scope.as_deref().is_none_or(|s| s == "*" || s == "Namespaced")
    })
}

/// The path the API server posts the entry's reviews to.
pub fn entry_path(entry: &MutatingWebhook) -> String {
    let config = &entry.client_config;
    if let Some(service) = &config.service {
        return service.path.clone().unwrap_or_else(|| "/".into());
    }
    let url = config.url.as_deref().unwrap_or_default();
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.find('/').map_or("/".into(), |at| rest[at..].split(['?', '#']).next().unwrap_or("/").to_string())
}

/// drafs's entries, with the name of the configuration holding each.
pub fn drafs_entries(configurations: &[MutatingWebhookConfiguration]) -> Vec<(String, &MutatingWebhook)> {
    configurations
        .iter()
        .flat_map(|c| {
            let name = c.metadata.name.clone().unwrap_or_default();
            c.webhooks
                .iter()
                .flatten()
                .filter(|w| ENTRY_NAMES.contains(&w.name.as_str()))
                .map(move |w| (name.clone(), w))
        })
        .collect()
}

/// The configuration check: drafs's entries were found.
pub fn configuration(configurations: &[MutatingWebhookConfiguration]) -> Check {
    let entries = drafs_entries(configurations);
    if entries.is_empty() {
        // Pods may carry drafs in their manifests (`drafs inject`, the
        // examples): a supported way to run drafs, so a warning.
        return Check::new(
            "configuration",
            Status::Warn,
            format!(
                "no MutatingWebhookConfiguration has an entry named {}: the webhook is not installed, so only pods whose manifests carry drafs (drafs inject, the examples) get it",
                ENTRY_NAMES.join(" or ")
            ),
            json!({"configurations": [], "entries": []}),
        )
        .with_fix("helm install drafs deploy/helm/drafs -n drafs-system --create-namespace (or kubectl apply -k deploy/webhook)");
    }
    let names: Vec<String> = entries.iter().map(|(c, e)| format!("{c}/{}", e.name)).collect();
    let mut configs: Vec<&String> = entries.iter().map(|(c, _)| c).collect();
    configs.dedup();
    Check::new(
        "configuration",
        Status::Ok,
        format!("webhook entries {}", names.join(", ")),
        json!({"configurations": configs, "entries": names}),
    )
}

// ---------------------------------------------------------------------------
// Injection.

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
                "pods labelled {INJECT_LABEL}=<mode> (init, sidecar-files, sidecar-fuse) get drafs; namespace {namespace} is not opted in, so unlabelled pods do not"
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

/// The drafs container of a pod (an init container, native sidecar or not), if it has one.
pub fn drafs_container(pod: &Value) -> Option<&Value> {
    ["initContainers", "containers"]
        .iter()
        .flat_map(|k| pod["spec"][*k].as_array().into_iter().flatten())
        .find(|c| c["name"] == inject::CONTAINER)
}

fn is_sidecar(container: &Value) -> bool {
    container["restartPolicy"] == "Always"
}

fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

/// The injection check for an existing pod: does it run drafs, and if not, why not.
pub fn pod_injection(
    configurations: &[MutatingWebhookConfiguration],
    namespace_labels: &BTreeMap<String, String>,
    pod: &Value,
    namespace_mode: Option<Mode>,
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

// ---------------------------------------------------------------------------
// RBAC.

/// The RBAC check: `answers` pairs each permission with whether a
/// SubjectAccessReview allowed it; `Err` says why they could not be asked.
pub fn rbac(namespace: &str, account: &str, answers: Result<Vec<(Grant, bool)>, String>) -> Check {
    let fix_base = format!("drafs manifests rbac -n {namespace} --service-account {account}");
    let answers = match answers {
        Ok(a) => a,
        Err(why) => {
            return Check::new(
                "rbac",
                Status::Warn,
                format!("cannot tell whether service account {namespace}/{account} has drafs's permissions: {why}"),
                json!({"serviceAccount": account, "known": false, "missing": [], "optionalMissing": []}),
            )
            .with_fix(format!(
                "ask someone who may create subjectaccessreviews, or apply: {fix_base} | kubectl apply -f -"
            ));
        }
    };
    let missing: Vec<String> =
        answers.iter().filter(|(g, ok)| !ok && !g.optional).map(|(g, _)| g.to_string()).collect();
    let optional: Vec<String> =
        answers.iter().filter(|(g, ok)| !ok && g.optional).map(|(g, _)| g.to_string()).collect();
    let details = json!({"serviceAccount": account, "known": true, "missing": missing, "optionalMissing": optional,
               "checked": answers.iter().map(|(g, _)| g.to_string()).collect::<Vec<_>>()});
    if !missing.is_empty() {
        return Check::new(
            "rbac",
            Status::Fail,
            format!("service account {namespace}/{account} may not {}", missing.join(", ")),
            details,
        )
        .with_fix(format!("{fix_base} | kubectl apply -f -"));
    }
    if !optional.is_empty() {
        let mut lost = Vec::new();
        if optional.iter().any(|g| g.contains("events")) {
            lost.push("drafs's Events do not show in kubectl describe pod");
        }
        if optional.iter().any(|g| g.starts_with("watch pods")) {
            lost.push("a sidecar's device health does not follow the pod's status");
        }
        return Check::new(
            "rbac",
            Status::Warn,
            format!(
                "service account {namespace}/{account} has every permission drafs needs, but may not {}: {}",
                optional.join(", "),
                lost.join("; ")
            ),
            details,
        )
        .with_fix(format!("{fix_base} --events | kubectl apply -f -"));
    }
    Check::new(
        "rbac",
        Status::Ok,
        format!("service account {namespace}/{account} has every permission drafs needs ({} checked)", answers.len()),
        details,
    )
}

// ---------------------------------------------------------------------------
// The webhook.

/// Whether the webhook answered its health endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// `GET /healthz` answered with this HTTP status (`through` says how: directly, or the API server's service proxy).
    Answered { status: u16, through: String },
    /// No answer: why.
    Failed { error: String, through: String },
}

/// What was measured of one webhook entry's endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    pub entry: String,
    /// The URL, or `service NS/NAME:PORT/PATH`.
    pub endpoint: String,
    /// The name the API server checks the certificate for (the URL's host, or NAME.NS.svc).
    pub server_name: String,
    /// The entry's caBundle (PEM).
    pub ca_bundle: Vec<u8>,
    pub reach: Reach,
    /// The chain the webhook served in a TLS handshake; `None`: no handshake was made (a Service without --webhook-address).
    pub served: Option<Result<Vec<CertificateDer<'static>>, String>>,
}

fn days(n: i64) -> String {
    if n == 1 { "1 day".into() } else { format!("{n} days") }
}

fn date(seconds: i64) -> String {
    jiff::Timestamp::from_second(seconds).map(|t| t.to_string()).unwrap_or_else(|_| seconds.to_string())
}

/// The webhook check for one entry: reachable, the served chain verifies
/// against caBundle for the name the API server uses, and how long it has left.
pub fn webhook(probe: &Probe, now: i64, warn_days: i64) -> Check {
    let name: &'static str = "webhook";
    let mut problems: Vec<(Status, String)> = Vec::new();
    let mut facts: Vec<String> = Vec::new();
    let mut details = json!({"entry": probe.entry, "endpoint": probe.endpoint, "serverName": probe.server_name,
                             "reachable": null, "healthStatus": null, "certificate": null, "ca": null});
    match &probe.reach {
        Reach::Answered { status, through } => {
            details["reachable"] = json!(true);
            details["healthStatus"] = json!(status);
            if *status == 200 {
                facts.push(format!("/healthz answers 200 ({through})"));
            } else {
                problems.push((Status::Fail, format!("/healthz answers {status} ({through})")));
            }
        }
        Reach::Failed { error, through } => {
            details["reachable"] = json!(false);
            problems.push((Status::Fail, format!("unreachable ({through}): {error}")));
        }
    }
    // The CA the API server trusts.
    let anchors: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&probe.ca_bundle).filter_map(Result::ok).collect();
    if anchors.is_empty() {
        problems.push((
            Status::Fail,
            "caBundle is empty or holds no PEM certificate: the API server cannot verify the webhook".into(),
        ));
    } else if let Some((_, not_after)) = crate::admission::x509::validity(&anchors[0]) {
        let left = (not_after - now).div_euclid(86_400);
        details["ca"] = json!({"notAfter": date(not_after), "daysLeft": left});
        if not_after < now {
            problems.push((Status::Fail, format!("the CA in caBundle expired at {}", date(not_after))));
        } else if left < warn_days {
            problems.push((
                Status::Warn,
                format!("the CA in caBundle expires at {} ({} left)", date(not_after), days(left)),
            ));
        }
    }
    match &probe.served {
        None => facts.push(
            "served certificate not checked (a Service is not reachable from here: give --webhook-address after kubectl port-forward)"
                .into(),
        ),
        Some(Err(e)) => problems.push((Status::Fail, format!("TLS handshake failed: {e}"))),
        Some(Ok(chain)) if chain.is_empty() => problems.push((Status::Fail, "no certificate served".into())),
        Some(Ok(chain)) => {
            let verified = verify(chain, &anchors, &probe.server_name, now);
            let not_after = crate::admission::x509::validity(&chain[0]).map(|(_, a)| a);
            let left = not_after.map(|a| (a - now).div_euclid(86_400));
            details["certificate"] = json!({
                "verified": verified.is_ok(),
                "error": verified.as_ref().err(),
                "notAfter": not_after.map(date),
                "daysLeft": left,
            });
            match verified {
                Err(e) => problems.push((
                    Status::Fail,
                    format!("the served certificate does not verify against caBundle for {}: {e}", probe.server_name),
                )),
                Ok(()) => facts.push(format!("certificate verifies against caBundle for {}", probe.server_name)),
            }
            if let (Some(a), Some(left)) = (not_after, left) {
                if a < now {
                    problems.push((Status::Fail, format!("the served certificate expired at {}", date(a))));
                } else if left < warn_days {
                    problems.push((
                        Status::Warn,
                        format!("the served certificate expires at {} ({} left, under {warn_days})", date(a), days(left)),
                    ));
                } else {
                    facts.push(format!("expires at {} ({} left)", date(a), days(left)));
                }
            }
        }
    }
    let status = problems.iter().map(|(s, _)| *s).max().unwrap_or(Status::Ok);
    let mut parts: Vec<String> = problems.into_iter().map(|(_, p)| p).collect();
    parts.extend(facts);
    Check::new(name, status, format!("{} ({}): {}", probe.entry, probe.endpoint, parts.join("; ")), details)
}

/// Verify `chain` as the API server would: issued by a CA of `anchors`,
/// valid now, for `server_name`.
pub fn verify(
    chain: &[CertificateDer<'static>],
    anchors: &[CertificateDer<'static>],
    server_name: &str,
    now: i64,
) -> Result<(), String> {
    use rustls::client::danger::ServerCertVerifier;
    let mut roots = rustls::RootCertStore::empty();
    for anchor in anchors {
        roots.add(anchor.clone()).map_err(|e| format!("caBundle: {e}"))?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(std::sync::Arc::new(roots), provider)
        .build()
        .map_err(|e| format!("caBundle: {e}"))?;
    let name = ServerName::try_from(server_name.to_string()).map_err(|e| format!("{server_name:?}: {e}"))?;
    let (leaf, intermediates) = chain.split_first().ok_or("no certificate")?;
    let now = UnixTime::since_unix_epoch(std::time::Duration::from_secs(u64::try_from(now).unwrap_or(0)));
    verifier.verify_server_cert(leaf, intermediates, &name, &[], now).map(|_| ()).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------
// The pod's drafs container.

fn container_status<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    ["initContainerStatuses", "containerStatuses"]
        .iter()
        .flat_map(|k| pod["status"][*k].as_array().into_iter().flatten())
        .find(|s| s["name"] == name)
}

/// The time an Event last happened, for ordering (RFC 3339 text sorts).
fn event_time(event: &Value) -> String {
    ["eventTime", "lastTimestamp", "firstTimestamp"]
        .iter()
        .find_map(|k| event[*k].as_str())
        .or_else(|| event["metadata"]["creationTimestamp"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Whether drafs recorded the Event.
fn by_drafs(event: &Value) -> bool {
    event["reportingComponent"] == "drafs"
        || event["source"]["component"] == "drafs"
        || event["reason"] == READY
        || event["reason"] == NOT_READY
}

/// The pod check: what the drafs container reports (its state, exit code,
/// termination message, readiness, restarts) and the last Event drafs recorded.
pub fn pod_status(pod: &Value, events: &[Value]) -> Check {
    let Some(container) = drafs_container(pod) else {
        return Check::new("pod", Status::Skip, "no drafs container in the pod", json!({"container": null}));
    };
    let sidecar = is_sidecar(container);
    let last = events.iter().filter(|e| by_drafs(e)).max_by_key(|e| event_time(e));
    let last_event = last.map(|e| {
        json!({"type": e["type"], "reason": e["reason"], "message": one_line(e["message"].as_str().unwrap_or_default()),
               "time": event_time(e)})
    });
    let status = container_status(pod, inject::CONTAINER);
    let mut details = json!({
        "container": inject::CONTAINER,
        "sidecar": sidecar,
        "state": null, "reason": null, "exitCode": null, "message": null,
        "ready": status.map(|s| s["ready"].as_bool().unwrap_or(false)),
        "restarts": status.map(|s| s["restartCount"].as_i64().unwrap_or(0)),
        "lastEvent": last_event,
    });
    let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
    let (mut verdict, mut message) = match status {
        None => (Status::Warn, format!("drafs has not started yet (pod phase {phase})")),
        Some(s) => {
            let restarts = s["restartCount"].as_i64().unwrap_or(0);
            let ready = s["ready"].as_bool().unwrap_or(false);
            let state = &s["state"];
            let last_term = &s["lastState"]["terminated"];
            let terminated = |t: &Value| {
                let code = t["exitCode"].as_i64().unwrap_or(-1);
                let text = one_line(t["message"].as_str().unwrap_or_default());
                let reason = t["reason"].as_str().unwrap_or_default();
                (code, if text.is_empty() { reason.to_string() } else { text })
            };
            if let Some(t) = state.get("terminated").filter(|t| t.is_object()) {
                let (code, text) = terminated(t);
                details["state"] = json!("terminated");
                details["exitCode"] = json!(code);
                details["message"] = json!(text);
                details["reason"] = t["reason"].clone();
                if code == 0 && !sidecar {
                    (Status::Ok, "drafs finished: exit 0, the tree is written".to_string())
                } else if code == 0 {
                    (Status::Warn, "drafs (sidecar) exited 0: the tree is no longer kept current".to_string())
                } else {
                    (Status::Fail, format!("drafs exited {code}: {text}"))
                }
            } else if let Some(w) = state.get("waiting").filter(|w| w.is_object()) {
                let reason = w["reason"].as_str().unwrap_or("Waiting").to_string();
                details["state"] = json!("waiting");
                details["reason"] = json!(reason);
                let previous = last_term.is_object().then(|| terminated(last_term));
                if let Some((code, text)) = &previous {
                    details["exitCode"] = json!(code);
                    details["message"] = json!(text);
                }
                match (reason.as_str(), previous) {
                    ("CrashLoopBackOff", Some((code, text))) => (
                        Status::Fail,
                        format!("drafs is crash-looping ({restarts} restarts), last exit {code}: {text}"),
                    ),
                    ("CrashLoopBackOff", None) => {
                        (Status::Fail, format!("drafs is crash-looping ({restarts} restarts)"))
                    }
                    (r, _) if r.contains("Err") || r.contains("BackOff") || r.contains("Invalid") => {
                        let text = one_line(w["message"].as_str().unwrap_or_default());
                        (Status::Fail, format!("drafs cannot start: {r} {text}").trim_end().to_string())
                    }
                    (r, _) => (Status::Warn, format!("drafs is waiting: {r}")),
                }
            } else if state.get("running").is_some_and(Value::is_object) {
                details["state"] = json!("running");
                match (sidecar, ready) {
                    (true, true) => (Status::Ok, format!("drafs is running and ready ({restarts} restarts)")),
                    (true, false) => (Status::Warn, "drafs is running, not ready yet (waiting for the devices)".into()),
                    (false, _) => (Status::Warn, "drafs is running: still waiting for the devices".into()),
                }
            } else {
                (Status::Warn, format!("drafs has no state yet (pod phase {phase})"))
            }
        }
    };
    if let Some(e) = last {
        let text = one_line(e["message"].as_str().unwrap_or_default());
        let reason = e["reason"].as_str().unwrap_or_default();
        if e["type"] == "Warning" {
            message.push_str(&format!("; last event: {reason}: {text}"));
            if verdict == Status::Ok {
                verdict = Status::Warn;
            }
        } else {
            message.push_str(&format!("; last event: {reason}"));
        }
    }
    Check::new("pod", verdict, message, details)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn req(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn exprs(reqs: Vec<LabelSelectorRequirement>) -> LabelSelector {
        LabelSelector { match_expressions: Some(reqs), match_labels: None }
    }

    /// A check built without `Check::new` (an API error, a probe failure)
    /// still reaches the terminal as one escaped, bounded line.
    #[test]
    fn the_text_report_escapes_and_bounds_what_the_cluster_said() {
        let raw = format!("HTTP 500: \u{1b}]0;owned\u{7}\nsecond line {}", "y".repeat(10_000));
        let report = Report {
            namespace: "ml".into(),
            pod: None,
            checks: vec![Check {
                name: "configuration",
                status: Status::Fail,
                message: raw.clone(),
                fix: Some(raw),
                details: json!({}),
            }],
        };
        let text = report.to_text();
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{:?}", &text[..200]);
        assert_eq!(text.lines().count(), 4, "one line each for the header, message, fix and verdict");
        assert!(text.lines().all(|l| l.chars().count() < MAX_MESSAGE + 64));
    }

    #[test]
    fn selectors_evaluate_as_the_api_server_does() {
        let l = labels(&[("a", "1"), ("b", "2")]);
        assert!(selects(None, &l).is_ok());
        assert!(selects(Some(&LabelSelector::default()), &BTreeMap::new()).is_ok());
        let ml = LabelSelector { match_labels: Some(labels(&[("a", "1")])), match_expressions: None };
        assert!(selects(Some(&ml), &l).is_ok());
        let ml2 = LabelSelector { match_labels: Some(labels(&[("a", "2")])), match_expressions: None };
        assert_eq!(selects(Some(&ml2), &l).unwrap_err(), "a=2 (it is a=1)");
        assert_eq!(selects(Some(&ml2), &BTreeMap::new()).unwrap_err(), "a=2 (no such label)");
        for (r, want) in [
            (req("a", "In", &["1", "3"]), true),
            (req("a", "In", &["3"]), false),
            (req("c", "In", &["1"]), false),
            (req("a", "NotIn", &["3"]), true),
            (req("a", "NotIn", &["1"]), false),
            // NotIn holds for a missing label.
            (req("c", "NotIn", &["1"]), true),
            (req("a", "Exists", &[]), true),
            (req("c", "Exists", &[]), false),
            (req("c", "DoesNotExist", &[]), true),
            (req("a", "DoesNotExist", &[]), false),
            (req("a", "Gt", &["0"]), false),
        ] {
            let shown = format!("{} {}", r.key, r.operator);
            assert_eq!(selects(Some(&exprs(vec![r])), &l).is_ok(), want, "{shown}");
        }
        // Without a list, In selects nothing and NotIn everything (the API
        // server refuses both; kube-core too, so they are read as empty lists).
        let no_list = |op: &str| LabelSelectorRequirement { key: "a".into(), operator: op.into(), values: None };
        assert_eq!(selects(Some(&exprs(vec![no_list("In")])), &l).unwrap_err(), "a In (it is a=1)");
        assert!(selects(Some(&exprs(vec![no_list("NotIn")])), &l).is_ok());
        assert_eq!(
            selects(Some(&exprs(vec![req("a", "Gt", &["0"])])), &l).unwrap_err(),
            "a Gt: not an operator the API server accepts"
        );
        // Empty lists of labels and requirements select everything, no labels included.
        let empty = LabelSelector { match_labels: Some(BTreeMap::new()), match_expressions: Some(Vec::new()) };
        assert!(selects(Some(&empty), &l).is_ok() && selects(Some(&empty), &BTreeMap::new()).is_ok());
        // matchLabels first, then the expressions in their order.
        let mixed = LabelSelector {
            match_labels: Some(labels(&[("b", "3")])),
            match_expressions: Some(vec![req("c", "Exists", &[])]),
        };
        assert_eq!(selects(Some(&mixed), &l).unwrap_err(), "b=3 (it is b=2)");
        // All requirements must hold; the message names the first that does not.
        let both = exprs(vec![req("a", "Exists", &[]), req("b", "NotIn", &["2", "3"])]);
        assert_eq!(selects(Some(&both), &l).unwrap_err(), "b NotIn [2, 3] (it is b=2)");
    }

    /// The shipped kustomize configuration.
    fn shipped() -> Vec<MutatingWebhookConfiguration> {
        let text = include_str!("../../deploy/webhook/core/mutatingwebhookconfiguration.yaml");
        vec![serde_saphyr::from_str(text).unwrap()]
    }

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
        assert_eq!(configuration(&[]).status, Status::Warn);
        let none = namespace_injection(&[], "ml", &opted, None);
        assert_eq!(none.status, Status::Warn);
        assert!(
            none.message.starts_with("no webhook: pods of namespace ml get drafs only from their manifests"),
            "{}",
            none.message
        );
        assert_eq!(configuration(&configs).message, "webhook entries drafs/pods.drafs.dev, drafs/namespaces.drafs.dev");
    }

    fn pod(labels: Value, claims: bool, drafs: Option<Value>) -> Value {
        let mut pod = json!({"metadata": {"name": "p", "labels": labels}, "spec": {"containers": [{"name": "app"}]}});
        if claims {
            pod["spec"]["resourceClaims"] = json!([{"name": "gpu"}]);
        }
        if let Some(c) = drafs {
            pod["spec"]["initContainers"] = json!([c]);
        }
        pod
    }

    #[test]
    fn a_pod_says_why_it_has_or_lacks_drafs() {
        let configs = shipped();
        let plain = namespace_labels("ml", None);
        let check = |p: &Value| pod_injection(&configs, &plain, p, Some(Mode::Init));
        let c = check(&pod(json!({INJECT_LABEL: "disabled"}), true, None));
        assert_eq!(
            (c.status, c.message.as_str()),
            (Status::Fail, "not injected: the pod opted out with label drafs.dev/inject=disabled")
        );
        let opted = namespace_labels("ml", Some(&labels(&[(INJECT_LABEL, "enabled")])));
        let c = pod_injection(&configs, &opted, &pod(json!({INJECT_LABEL: "disabled"}), true, None), None);
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

    #[test]
    fn rbac_names_the_missing_verb_and_the_fix() {
        let grants = crate::admission::manifests::grants("ml", "trainer");
        let all = |except: &str| grants.iter().map(|g| (g.clone(), g.to_string() != except)).collect::<Vec<_>>();
        let c = rbac("ml", "trainer", Ok(all("")));
        assert_eq!(c.status, Status::Ok);
        let c = rbac("ml", "trainer", Ok(all("list resourceslices.resource.k8s.io (cluster-wide)")));
        assert_eq!(c.status, Status::Fail);
        assert_eq!(c.message, "service account ml/trainer may not list resourceslices.resource.k8s.io (cluster-wide)");
        assert_eq!(c.fix.unwrap(), "drafs manifests rbac -n ml --service-account trainer | kubectl apply -f -");
        let c = rbac("ml", "trainer", Ok(all("create events in ml")));
        assert_eq!(c.status, Status::Warn);
        assert!(c.fix.unwrap().contains("--events"));
        let c = rbac("ml", "trainer", Err("HTTP 403".into()));
        assert_eq!(c.status, Status::Warn);
        assert_eq!(c.details["known"], false);
    }

    #[test]
    fn the_drafs_container_state_in_one_line() {
        let init = json!({"name": "drafs", "args": ["init"]});
        let with_status = |status: Value| {
            let mut p = pod(json!({}), true, Some(init.clone()));
            p["status"] = json!({"phase": "Pending", "initContainerStatuses": [status]});
            p
        };
        let c = pod_status(
            &with_status(json!({"name": "drafs", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "not ready after 5m:\nclaim gpu\tnot allocated"}}})),
            &[],
        );
        assert_eq!(
            (c.status, c.message.as_str()),
            (Status::Fail, "drafs exited 1: not ready after 5m: claim gpu not allocated")
        );
        assert_eq!(c.details["exitCode"], 1);
        let c = pod_status(
            &with_status(json!({"name": "drafs", "ready": true, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}})),
            &[],
        );
        assert_eq!(c.status, Status::Ok);
        let events = [
            json!({"type": "Normal", "reason": READY, "message": "ready", "eventTime": "2026-01-01T00:00:00.000000Z"}),
            json!({"type": "Warning", "reason": NOT_READY, "message": "values\nlost", "eventTime": "2026-01-01T00:00:05.000000Z"}),
            json!({"type": "Warning", "reason": "Other", "message": "someone else's", "eventTime": "2026-01-01T00:00:09.000000Z"}),
        ];
        let c = pod_status(
            &with_status(json!({"name": "drafs", "ready": true, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0}}})),
            &events,
        );
        assert_eq!(c.status, Status::Warn);
        assert!(c.message.ends_with("; last event: DeviceAttributesNotReady: values lost"), "{}", c.message);
        let c = pod_status(
            &with_status(json!({"name": "drafs", "ready": false, "restartCount": 4,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": {"terminated": {"exitCode": 1, "message": "forbidden"}}})),
            &[],
        );
        assert_eq!(
            (c.status, c.message.as_str()),
            (Status::Fail, "drafs is crash-looping (4 restarts), last exit 1: forbidden")
        );
        let c = pod_status(&pod(json!({}), true, Some(init.clone())), &[]);
        assert_eq!(c.status, Status::Warn);
        assert_eq!(pod_status(&pod(json!({}), true, None), &[]).status, Status::Skip);
    }

    #[test]
    fn a_webhook_unreachable_or_without_a_ca_fails_and_a_service_says_how_to_check_its_certificate() {
        let probe = |reach: Reach, ca: &[u8]| Probe {
            entry: "pods.drafs.dev".into(),
            endpoint: "service drafs-system/drafs-webhook:443/mutate".into(),
            server_name: "drafs-webhook.drafs-system.svc".into(),
            ca_bundle: ca.to_vec(),
            reach,
            served: None,
        };
        let through = "through the API server's service proxy".to_string();
        let c = webhook(
            &probe(Reach::Failed { error: "HTTP 503: no endpoints".into(), through: through.clone() }, b""),
            0,
            14,
        );
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.message.contains("unreachable (through the API server's service proxy): HTTP 503: no endpoints"),
            "{}",
            c.message
        );
        assert!(c.message.contains("caBundle is empty"), "{}", c.message);
        assert_eq!(c.details["reachable"], false);
        let c = webhook(&probe(Reach::Answered { status: 200, through }, b"not a PEM"), 0, 14);
        assert_eq!(c.status, Status::Fail);
        assert!(c.message.contains("give --webhook-address"), "{}", c.message);
    }

    #[test]
    fn the_report_exits_1_on_a_failure_and_prints_one_line_per_check() {
        let mut report = Report { namespace: "ml".into(), pod: None, checks: vec![configuration(&shipped())] };
        assert_eq!(report.failed(), 0);
        assert!(report.to_text().ends_with("verdict: ok, drafs will work for namespace ml\n"), "{}", report.to_text());
        report.checks.push(rbac(
            "ml",
            "drafs",
            Ok(vec![(crate::admission::manifests::grants("ml", "drafs")[0].clone(), false)]),
        ));
        assert_eq!(report.failed(), 1);
        let text = report.to_text();
        assert!(text.contains("FAIL  rbac           service account ml/drafs may not get pods in ml\n"), "{text}");
        assert!(
            text.contains("fix: drafs manifests rbac -n ml --service-account drafs | kubectl apply -f -"),
            "{text}"
        );
        let json = report.to_json();
        assert_eq!(json["verdict"], "fail");
        assert_eq!(json["checks"][1]["status"], "fail");
        assert_eq!(json["checks"][1]["details"]["missing"][0], "get pods in ml");
    }
}
