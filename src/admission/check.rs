//! `drafs check`: will drafs work for a namespace or a pod, and if not, why.
//!
//! Pure: the objects `cmd/check.rs` read (the webhook configurations, the
//! Namespace, the Pod and its Events) and what it measured (the access
//! reviews, the webhook's answer and served certificate: `admission::probe`)
//! go in; a report of one line per check, with a fix where there is one,
//! comes out. This file is the report; each check has a file of its own
//! (`configuration`, `injection`, `rbac`, `webhook`, `pod`). The opt-in
//! rules are the webhook's own (`policy::requested`), the permissions the
//! ones `drafs manifests rbac` prints (`manifests::grants`).

use serde_json::{Value, json};

mod configuration;
mod in_use;
mod injection;
mod installation;
mod node;
mod pod;
mod rbac;
mod versions;
mod webhook;

pub use configuration::{
    ENTRY_NAMES, configuration, drafs_entries, entry_path, selects, webhook_csi_driver, webhook_image,
    webhook_namespace_mode,
};
pub use in_use::{VolumeUser, has_volume_of, in_use, no_csi_driver, volume_user};
pub use injection::{Injection, injection, namespace_injection, namespace_labels, pod_injection};
pub use installation::{
    AGENT_ANNOTATION, AccountAccess, AgentPod, agent_daemonset, agents, csi_driver, nri, volume_rbac,
};
pub use node::node_agent;
pub use pod::{drafs_container, pod_status};
pub use rbac::rbac;
pub use versions::{StalePod, injected_image, stale, versions};
pub use webhook::{EXPIRY_WARNING_DAYS, Probe, Reach, verify, webhook};

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
    /// `--uninstall`'s report: whether drafs node may go, not whether it works.
    pub uninstall: bool,
}

impl Report {
    /// The checks that failed: any makes the exit code 1.
    pub fn failed(&self) -> usize {
        self.checks.iter().filter(|c| c.status == Status::Fail).count()
    }

    fn subject(&self) -> String {
        if self.uninstall {
            return "uninstalling drafs node".to_string();
        }
        if self.namespace.is_empty() && self.pod.is_none() {
            return "drafs node's installation".to_string();
        }
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
        let (works, fails) = match self.uninstall {
            true => ("nothing needs drafs node: it may be uninstalled".to_string(), "drafs node is in use".to_string()),
            false => (
                format!("drafs will work for {}", self.subject()),
                format!("drafs will not work for {}", self.subject()),
            ),
        };
        match self.failed() {
            0 => out.push_str(&format!("verdict: ok, {works}\n")),
            n => out.push_str(&format!("verdict: FAIL, {n} check{} failed: {fails}\n", if n == 1 { "" } else { "s" })),
        }
        out
    }
}

/// Names (nodes, pods) a message gives at most; the rest are counted (all
/// are in the check's details).
const NAMED: usize = 10;

/// The first [`NAMED`] of `names`, and how many more.
fn named<T: AsRef<str>>(names: &[T]) -> String {
    let mut out = names.iter().take(NAMED).map(AsRef::as_ref).collect::<Vec<_>>().join(", ");
    if names.len() > NAMED {
        out.push_str(&format!(" and {} more", names.len() - NAMED));
    }
    out
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

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use drafs_test_support::{Build, PodBuilder};
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;

    use super::*;

    pub(crate) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The shipped kustomize configuration.
    pub(crate) fn shipped() -> Vec<MutatingWebhookConfiguration> {
        let text = include_str!("../../deploy/webhook/core/mutatingwebhookconfiguration.yaml");
        vec![serde_saphyr::from_str(text).unwrap()]
    }

    /// A pod with these labels, a resource claim or not, and this drafs init container.
    pub(crate) fn pod(labels: Value, claims: bool, drafs: Option<Value>) -> Value {
        let mut p = PodBuilder::new("", "p").labels(labels);
        if claims {
            p = p.template_claim("gpu", "gpu");
        }
        let mut pod = p.container("app", "app").build();
        if let Some(c) = drafs {
            pod["spec"]["initContainers"] = json!([c]);
        }
        pod
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
            uninstall: false,
        };
        let text = report.to_text();
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{:?}", &text[..200]);
        assert_eq!(text.lines().count(), 4, "one line each for the header, message, fix and verdict");
        assert!(text.lines().all(|l| l.chars().count() < MAX_MESSAGE + 64));
    }

    #[test]
    fn the_report_exits_1_on_a_failure_and_prints_one_line_per_check() {
        let mut report =
            Report { namespace: "ml".into(), pod: None, checks: vec![configuration(&shipped())], uninstall: false };
        assert_eq!(report.failed(), 0);
        assert!(report.to_text().ends_with("verdict: ok, drafs will work for namespace ml\n"), "{}", report.to_text());
        report.checks.push(rbac(
            "ml",
            "drafs",
            Ok(vec![(crate::admission::manifests::grants("ml", "drafs")[0].clone(), false)]),
            None,
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

    #[test]
    fn the_uninstall_report_says_whether_drafs_node_may_go() {
        let user = VolumeUser { namespace: "ml".into(), name: "t".into(), node: "n1".into() };
        let mut report =
            Report { namespace: String::new(), pod: None, checks: vec![in_use("drafs.dev", &[])], uninstall: true };
        let text = report.to_text();
        assert!(text.starts_with("drafs check: uninstalling drafs node\n"), "{text}");
        assert!(text.ends_with("verdict: ok, nothing needs drafs node: it may be uninstalled\n"), "{text}");
        report.checks = vec![in_use("drafs.dev", &[user])];
        let text = report.to_text();
        assert!(text.ends_with("verdict: FAIL, 1 check failed: drafs node is in use\n"), "{text}");
        assert_eq!(report.to_json()["verdict"], "fail");
    }
}
