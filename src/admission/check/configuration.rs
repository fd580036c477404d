//! The configuration check: drafs's entries in the cluster's
//! MutatingWebhookConfigurations, which pods their rules and selectors send
//! to the webhook, and the mode the webhook's Deployment gives an unlabelled
//! pod of an opted-in namespace.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::core::{Expression, Selector, SelectorExt};
use serde_json::json;

use super::{Check, Status};
use crate::admission::inject::Mode;
use crate::admission::policy;

/// The names of drafs's entries in a MutatingWebhookConfiguration (the
/// kustomize base and the chart both use them): how `check` finds drafs's
/// configurations whatever they are called.
pub const ENTRY_NAMES: [&str; 2] = ["pods.drafs.dev", "namespaces.drafs.dev"];

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
pub(super) fn covers_pod_create(entry: &MutatingWebhook) -> bool {
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

/// The webhook's `--namespace-mode`, as the Deployment that runs it says:
/// the first of `deployments` whose pods the entries' Service selects
/// (`service_selector`, matched by kube-core's `Selector`), its container
/// running `webhook`, the flag as `--namespace-mode=M` or `--namespace-mode
/// M`, else `DRAFS_NAMESPACE_MODE`, else the default (`init`). `None` when
/// no Deployment matches, its container is not found, or the mode is not one.
/// An empty Service selector selects no pod (as for the API server: such a
/// Service's endpoints are written by hand), where an empty label selector
/// would select them all.
pub fn webhook_namespace_mode(deployments: &[Deployment], service_selector: &BTreeMap<String, String>) -> Option<Mode> {
    let container = webhook_container(deployments, service_selector)?;
    let text = setting(container, "--namespace-mode", "DRAFS_NAMESPACE_MODE")
        .unwrap_or_else(|| Mode::Init.label().to_string());
    policy::parse_mode(&text).ok()
}

/// The CSI driver the webhook's mode csi names (`--csi-driver`, its
/// default when unset), read from the same Deployment.
pub fn webhook_csi_driver(deployments: &[Deployment], service_selector: &BTreeMap<String, String>) -> Option<String> {
    let container = webhook_container(deployments, service_selector)?;
    Some(
        setting(container, "--csi-driver", "DRAFS_CSI_DRIVER")
            .unwrap_or_else(|| crate::model::names::DEFAULT_CSI_DRIVER.to_string()),
    )
}

/// The drafs image the webhook injects (`--image`, `DRAFS_IMAGE`), from the
/// Deployment the Service selects.
pub fn webhook_image(deployments: &[Deployment], service_selector: &BTreeMap<String, String>) -> Option<String> {
    setting(webhook_container(deployments, service_selector)?, "--image", "DRAFS_IMAGE")
}

/// The container running `drafs webhook` in the Deployment the Service selects.
fn webhook_container<'a>(
    deployments: &'a [Deployment],
    service_selector: &BTreeMap<String, String>,
) -> Option<&'a k8s_openapi::api::core::v1::Container> {
    if service_selector.is_empty() {
        return None;
    }
    let selector: Selector = service_selector.clone().into_iter().collect();
    let deployment = deployments.iter().find(|d| {
        let labels = d.spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
        selector.matches(&labels)
    })?;
    let containers = &deployment.spec.template.spec.as_ref()?.containers;
    containers.iter().find(|c| c.args.iter().flatten().any(|a| a == "webhook"))
}

/// A flag's value in a container's args (`--flag=v` or `--flag v`), else its environment variable's.
fn setting(container: &k8s_openapi::api::core::v1::Container, flag: &str, env: &str) -> Option<String> {
    let args = container.args.clone().unwrap_or_default();
    let from_args = args.iter().enumerate().find_map(|(i, a)| match a.strip_prefix(flag) {
        Some(rest) if rest.starts_with('=') => Some(rest[1..].to_string()),
        Some("") => args.get(i + 1).cloned(),
        _ => None,
    });
    from_args.or_else(|| container.env.iter().flatten().find(|e| e.name == env).and_then(|e| e.value.clone()))
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::Value;

    use super::*;
    use crate::admission::check::tests::labels;

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

    #[test]
    fn the_namespace_mode_is_read_from_the_deployment_the_service_selects() {
        let deployment = |labels: Value, args: Value, env: Value| -> Deployment {
            serde_json::from_value(json!({"spec": {"selector": {}, "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "sidecar", "args": ["webhook", "--namespace-mode=sidecar-fuse"]},
                                        {"name": "drafs", "args": args, "env": env}]}}}}))
            .unwrap()
        };
        let selector = labels(&[("app", "drafs-webhook")]);
        let ours = json!({"app": "drafs-webhook", "tier": "x"});
        let mode = |args: Value, env: Value| {
            let other = deployment(json!({"app": "other"}), json!(["webhook", "--namespace-mode=init"]), json!([]));
            webhook_namespace_mode(&[other, deployment(ours.clone(), args, env)], &selector)
        };
        // The first container running `webhook` in the selected Deployment.
        assert_eq!(mode(json!(["webhook"]), json!([])), Some(Mode::SidecarFuse));
        let only = |args: Value, env: Value| {
            let mut d = deployment(ours.clone(), args, env);
            d.spec.template.spec.as_mut().unwrap().containers.remove(0);
            webhook_namespace_mode(&[d], &selector)
        };
        assert_eq!(only(json!(["webhook", "--namespace-mode=sidecar-files"]), json!([])), Some(Mode::SidecarFiles));
        assert_eq!(only(json!(["webhook", "--namespace-mode", "sidecar-fuse"]), json!([])), Some(Mode::SidecarFuse));
        assert_eq!(
            only(json!(["webhook", "--namespace-mode=csi", "--csi-driver=x.example"]), json!([])),
            Some(Mode::Csi)
        );
        let env = json!([{"name": "DRAFS_NAMESPACE_MODE", "value": "sidecar-files"}]);
        assert_eq!(only(json!(["webhook"]), env.clone()), Some(Mode::SidecarFiles));
        assert_eq!(only(json!(["webhook", "--namespace-mode=init"]), env), Some(Mode::Init), "the flag wins");
        assert_eq!(only(json!(["webhook"]), json!([])), Some(Mode::Init), "the default");
        assert_eq!(only(json!(["webhook", "--namespace-mode=nope"]), json!([])), None);
        assert_eq!(only(json!(["serve"]), json!([])), None);
        // No Deployment whose pods the Service selects.
        let d = deployment(json!({"app": "other"}), json!(["webhook"]), json!([]));
        assert_eq!(webhook_namespace_mode(&[d], &selector), None);
        // A Service with an empty selector selects no pod (its endpoints are
        // written by hand), not every pod.
        let d = deployment(ours.clone(), json!(["webhook", "--namespace-mode=sidecar-fuse"]), json!([]));
        assert_eq!(webhook_namespace_mode(&[d], &BTreeMap::new()), None);
    }
}
