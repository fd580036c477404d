//! For a pod served by drafs's CSI volume (mode `csi`): is the CSIDriver as
//! `drafs node` needs it, and does the kubelet of the pod's node list the
//! driver (its agent registered there)?

use serde_json::{Value, json};

use crate::admission::check::{Check, Status};

/// `driver`: the CSIDriver object, if any; `node`: the pod's node and the
/// drivers its CSINode lists (None: not scheduled, or not readable).
pub fn node_agent(name: &str, driver: Option<&Value>, node: Option<(&str, Vec<String>)>) -> Check {
    let details = json!({"driver": name, "csiDriver": driver.is_some(),
                         "node": node.as_ref().map(|(n, _)| *n), "registered": node.as_ref().map(|(_, d)| d.iter().any(|x| x == name))});
    let Some(driver) = driver else {
        return Check::new(
            "node",
            Status::Fail,
            format!("no CSIDriver {name}: the pod's volume has no driver"),
            details,
        )
        .with_fix(
            "helm upgrade --install drafs deploy/helm/drafs -n drafs-system --reuse-values --set node.enabled=true",
        );
    };
    let wrong = driver_lacks(driver);
    if !wrong.is_empty() {
        let message = format!("the CSIDriver {name} lacks {} (docs/node-mode.md)", wrong.join(", "));
        return Check::new("node", Status::Fail, message, details);
    }
    match node {
        None => Check::new(
            "node",
            Status::Ok,
            format!("CSIDriver {name} as drafs node needs it; the pod has no node yet"),
            details,
        ),
        Some((node, drivers)) if drivers.iter().any(|d| d == name) => Check::new(
            "node",
            Status::Ok,
            format!("CSIDriver {name} as drafs node needs it, registered by the kubelet of node {node}"),
            details,
        ),
        Some((node, _)) => Check::new(
            "node",
            Status::Fail,
            format!(
                "the kubelet of node {node} lists no {name}: drafs node is not running there (its pod waits in ContainerCreating)"
            ),
            details,
        ),
    }
}

/// What a CSIDriver object lacks for drafs node (nothing: it is right).
pub(super) fn driver_lacks(driver: &Value) -> Vec<&'static str> {
    let spec = &driver["spec"];
    let mut wrong = Vec::new();
    if spec["podInfoOnMount"] != true {
        wrong.push("podInfoOnMount: true");
    }
    if !spec["volumeLifecycleModes"].as_array().is_some_and(|m| m.iter().any(|x| x == "Ephemeral")) {
        wrong.push("volumeLifecycleModes: [Ephemeral]");
    }
    if !spec["tokenRequests"].as_array().is_some_and(|t| t.iter().any(|r| r["audience"] == "")) {
        wrong.push("tokenRequests: [{audience: \"\"}]");
    }
    wrong
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub fn driver() -> Value {
        json!({"spec": {"podInfoOnMount": true, "volumeLifecycleModes": ["Ephemeral"], "tokenRequests": [{"audience": ""}]}})
    }

    #[test]
    fn the_driver_and_its_registration_are_checked() {
        let ok = node_agent("drafs.dev", Some(&driver()), Some(("n1", vec!["drafs.dev".into()])));
        assert_eq!(ok.status, Status::Ok);
        assert!(ok.message.ends_with("registered by the kubelet of node n1"), "{}", ok.message);
        let missing = node_agent("drafs.dev", None, None);
        assert_eq!(missing.status, Status::Fail);
        assert!(missing.fix.unwrap().contains("node.enabled=true"));
        let unregistered = node_agent("drafs.dev", Some(&driver()), Some(("n1", vec!["other".into()])));
        assert!(unregistered.message.contains("drafs node is not running there"), "{}", unregistered.message);
        let mut bare = driver();
        bare["spec"]["tokenRequests"] = json!([{"audience": "vault"}]);
        bare["spec"]["podInfoOnMount"] = json!(false);
        let wrong = node_agent("drafs.dev", Some(&bare), None);
        assert_eq!(
            wrong.message,
            "the CSIDriver drafs.dev lacks podInfoOnMount: true, tokenRequests: [{audience: \"\"}] (docs/node-mode.md)"
        );
    }
}
