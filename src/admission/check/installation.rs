//! `drafs check --installation`: drafs node across the cluster, before a pod
//! lands anywhere. The CSIDriver is as drafs node needs it and named as the
//! webhook names its volumes; an agent runs, ready, on every Linux node, and
//! that node's kubelet lists the driver; the service accounts of the pods
//! that use the volume have drafs's RBAC (the agent reads as each pod).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{Check, Status, named};
use crate::admission::manifests::Grant;

/// The CSIDriver's annotation naming the DaemonSet of its agents
/// (`NAMESPACE/NAME`, the chart writes it): only cluster administrators
/// write a CSIDriver, so the agents it names are the installation's, where a
/// label or a command line any tenant can copy into a pod of its own.
pub const AGENT_ANNOTATION: &str = "drafs.dev/agent";

/// A pod of drafs node's DaemonSet, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPod {
    pub name: String,
    pub node: String,
    pub ready: bool,
}

/// The (namespace, name) of the DaemonSet the CSIDriver names as its agents'.
pub fn agent_daemonset(name: &str, driver: &Value) -> Result<(String, String), Box<Check>> {
    let named = driver["metadata"]["annotations"][AGENT_ANNOTATION].as_str().unwrap_or_default();
    match named.split_once('/') {
        Some((ns, ds)) if !ns.is_empty() && !ds.is_empty() && !ds.contains('/') => Ok((ns.into(), ds.into())),
        _ => Err(Box::new(Check::new(
            "agents",
            Status::Fail,
            format!(
                "the CSIDriver {name} does not name its agents' DaemonSet (annotation {AGENT_ANNOTATION}: NAMESPACE/NAME, which the chart writes): which pods are the installation's agents cannot be told from pods anyone could label alike"
            ),
            json!({"driver": name, "annotation": named}),
        )
        .with_fix(format!(
            "kubectl annotate csidriver {name} {AGENT_ANNOTATION}=drafs-system/drafs-node (the namespace and name of the agents' DaemonSet), or install drafs node with the chart"
        )))),
    }
}

/// The CSIDriver `name` (`driver`: the object, if any), and the driver the
/// webhook names (`webhook_driver`: None when no webhook of drafs's was found).
pub fn csi_driver(name: &str, driver: Option<&Value>, webhook_driver: Option<&str>) -> Check {
    let details = json!({"driver": name, "csiDriver": driver.is_some(), "webhookDriver": webhook_driver});
    let Some(driver) = driver else {
        return Check::new(
            "csi-driver",
            Status::Fail,
            format!(
                "no CSIDriver {name}: drafs node is not installed (a pod with its volume waits in ContainerCreating)"
            ),
            details,
        )
        .with_fix(
            "helm upgrade --install drafs deploy/helm/drafs -n drafs-system --reuse-values --set node.enabled=true",
        );
    };
    let lacks = super::node::driver_lacks(driver);
    if !lacks.is_empty() {
        let message = format!("the CSIDriver {name} lacks {} (docs/node-mode.md)", lacks.join(", "));
        return Check::new("csi-driver", Status::Fail, message, details);
    }
    match webhook_driver {
        Some(w) if w != name => Check::new(
            "csi-driver",
            Status::Fail,
            format!(
                "the webhook gives pods volumes of driver {w}, not {name}: they would wait for a driver no agent serves"
            ),
            details,
        )
        .with_fix(format!(
            "give both one name: the chart's node.driverName sets the CSIDriver, the agents and the webhook's --csi-driver (or check --csi-driver {w})"
        )),
        Some(_) => Check::new(
            "csi-driver",
            Status::Ok,
            format!("CSIDriver {name} as drafs node needs it, the driver the webhook's volumes name"),
            details,
        ),
        None => Check::new(
            "csi-driver",
            Status::Ok,
            format!("CSIDriver {name} as drafs node needs it (no webhook of drafs's found: volumes come from inject or by hand)"),
            details,
        ),
    }
}

/// Whether every Linux node (`nodes`) has an agent, ready, that its kubelet
/// registered (`registered`: each node's CSINode lists the driver).
pub fn agents(
    name: &str,
    (namespace, daemonset): (&str, &str),
    nodes: &[String],
    agents: &[AgentPod],
    registered: &BTreeMap<String, bool>,
) -> Check {
    let (mut absent, mut unready, mut unregistered) = (Vec::new(), Vec::new(), Vec::new());
    for node in nodes {
        let on_node: Vec<&AgentPod> = agents.iter().filter(|a| &a.node == node).collect();
        if on_node.is_empty() {
            absent.push(node.as_str());
        } else if !on_node.iter().any(|a| a.ready) {
            unready.push(node.as_str());
        } else if !registered.get(node).copied().unwrap_or(false) {
            unregistered.push(node.as_str());
        }
    }
    let details = json!({"driver": name, "daemonSet": format!("{namespace}/{daemonset}"), "linuxNodes": nodes.len(),
                         "agents": agents.len(), "withoutAgent": absent, "agentNotReady": unready,
                         "notRegistered": unregistered});
    if nodes.is_empty() {
        return Check::new("agents", Status::Warn, "no Linux node in the cluster: drafs node serves none", details);
    }
    let unregistered_label = format!("the kubelet lists no {name} on");
    let mut parts = Vec::new();
    for (what, list) in
        [("no agent on", &absent), ("the agent not ready on", &unready), (unregistered_label.as_str(), &unregistered)]
    {
        if !list.is_empty() {
            parts.push(format!("{what} {}", named(list)));
        }
    }
    if parts.is_empty() {
        return Check::new(
            "agents",
            Status::Ok,
            format!("drafs node runs, ready and registered with the kubelet, on every Linux node ({})", nodes.len()),
            details,
        );
    }
    let short = absent.len() + unready.len() + unregistered.len();
    Check::new(
        "agents",
        Status::Fail,
        format!(
            "drafs node does not serve {short} of {} Linux nodes ({}): pods there with its volume wait in ContainerCreating",
            nodes.len(),
            parts.join("; ")
        ),
        details,
    )
    .with_fix(format!(
        "kubectl get daemonset,pods -n {namespace} -o wide (the DaemonSet {daemonset}); a node it skips has a taint it does not tolerate (the chart's node.tolerations) or misses node.nodeSelector"
    ))
}

/// Whether the agents serve containers through NRI: each node's agent's
/// `/status` (read through the API server's pod proxy), or why it could not
/// be read. `enabled`: the agents run with `--nri`.
pub fn nri(enabled: bool, statuses: &[(String, Result<Value, String>)]) -> Check {
    if !enabled {
        return Check::new(
            "nri",
            Status::Skip,
            "drafs node does not serve through NRI here (node.nri.enabled=false): pods get /dra from the CSI volume or a container",
            json!({"enabled": false}),
        );
    }
    let (mut serving, mut no_socket, mut failing, mut unknown) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (node, status) in statuses {
        let state = status.as_ref().map(|s| (s["nri"]["state"].as_str().unwrap_or(""), s["nri"]["detail"].as_str()));
        match state {
            Ok(("serving", _)) => serving.push(node.as_str()),
            Ok(("no_socket", _)) => no_socket.push(node.as_str()),
            Ok((state, detail)) if !state.is_empty() => failing.push(format!("{node} ({})", detail.unwrap_or(state))),
            Ok(_) => unknown.push(format!("{node} (its agent does not say)")),
            Err(why) => unknown.push(format!("{node} ({why})")),
        }
    }
    let details =
        json!({"enabled": true, "serving": serving, "noSocket": no_socket, "failing": failing, "unknown": unknown});
    let total = statuses.len();
    if !failing.is_empty() {
        return Check::new(
            "nri",
            Status::Fail,
            format!(
                "drafs node cannot serve through NRI on {} of {total} nodes: {}: opted-in pods there start without /dra",
                failing.len(),
                failing.join("; ")
            ),
            details,
        )
        .with_fix("kubectl logs -n drafs-system -l app.kubernetes.io/name=drafs-node; the runtime's NRI must be on (containerd: [plugins.'io.containerd.nri.v1.nri'] disable = false)");
    }
    let mut parts = vec![format!("serves containers through NRI on {} of {total} nodes", serving.len())];
    if !no_socket.is_empty() {
        parts.push(format!(
            "the runtime has no NRI socket on {} (opted-in pods there get no /dra through NRI)",
            named(&no_socket)
        ));
    }
    if !unknown.is_empty() {
        parts.push(format!("cannot tell on {}", unknown.join(", ")));
    }
    let status = if no_socket.is_empty() && unknown.is_empty() { Status::Ok } else { Status::Warn };
    Check::new("nri", status, format!("drafs node {}", parts.join("; ")), details)
}

/// One service account whose pods use the volume, and what the access
/// reviews answered for it (`Err`: why they could not be asked).
pub type AccountAccess = ((String, String), Result<Vec<(Grant, bool)>, String>);

/// Whether the service accounts of the pods that use the volume have what
/// the agent reads as each pod (`manifests::Reader::NodeVolume`: the pod and
/// its claims, not the slices, which the agent reads as itself). Every
/// account is asked about: none is left out for a tenant's many others.
pub fn volume_rbac(name: &str, accounts: &[AccountAccess], shared_role: Option<&str>) -> Check {
    let mut lacking = Vec::new();
    let mut unknown = Vec::new();
    for ((ns, account), answers) in accounts {
        match answers {
            Ok(answers) => {
                let missing = super::rbac::missing_required(answers);
                if !missing.is_empty() {
                    lacking.push((format!("{ns}/{account}"), missing, (ns, account)));
                }
            }
            Err(why) => unknown.push(format!("{ns}/{account}: {why}")),
        }
    }
    let details = json!({
        "driver": name,
        "accounts": accounts.iter().map(|((ns, a), _)| format!("{ns}/{a}")).collect::<Vec<_>>(),
        "lacking": lacking.iter().map(|(a, m, _)| json!({"serviceAccount": a, "missing": m})).collect::<Vec<_>>(),
        "unknown": unknown,
    });
    if let Some((_, _, (ns, account))) = lacking.first() {
        let which: Vec<String> = lacking.iter().map(|(a, m, _)| format!("{a} may not {}", m.join(", "))).collect();
        return Check::new(
            "volume-rbac",
            Status::Fail,
            format!("pods using the {name} volume run as accounts without drafs's RBAC: {}", which.join("; ")),
            details,
        )
        .with_fix(format!("{} | kubectl apply -f -", super::rbac::grant_command(ns, account, shared_role)));
    }
    if !unknown.is_empty() {
        return Check::new(
            "volume-rbac",
            Status::Warn,
            format!("cannot tell whether these accounts have drafs's RBAC: {}", unknown.join("; ")),
            details,
        );
    }
    if accounts.is_empty() {
        return Check::new("volume-rbac", Status::Ok, format!("no pod uses a {name} volume yet"), details);
    }
    let message = format!("the {} service accounts whose pods use the {name} volume have drafs's RBAC", accounts.len());
    Check::new("volume-rbac", Status::Ok, message, details)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::check::node::tests::driver;

    #[test]
    fn the_csi_driver_is_right_and_named_as_the_webhook_names_it() {
        assert_eq!(csi_driver("drafs.dev", None, None).status, Status::Fail);
        let ok = csi_driver("drafs.dev", Some(&driver()), Some("drafs.dev"));
        assert_eq!(ok.status, Status::Ok, "{}", ok.message);
        assert_eq!(csi_driver("drafs.dev", Some(&driver()), None).status, Status::Ok);
        let other = csi_driver("drafs.dev", Some(&driver()), Some("node.drafs.example"));
        assert_eq!(other.status, Status::Fail);
        assert!(
            other.message.starts_with("the webhook gives pods volumes of driver node.drafs.example"),
            "{}",
            other.message
        );
        let mut bare = driver();
        bare["spec"]["podInfoOnMount"] = json!(false);
        assert!(csi_driver("drafs.dev", Some(&bare), None).message.contains("lacks podInfoOnMount"));
    }

    #[test]
    fn every_linux_node_needs_a_ready_registered_agent() {
        let nodes: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
        let pod = |node: &str, ready| AgentPod { name: format!("drafs-node-{node}"), node: node.into(), ready };
        let registered: BTreeMap<String, bool> =
            [("a", true), ("b", true), ("c", false), ("d", true)].iter().map(|(n, r)| (n.to_string(), *r)).collect();
        let all = [pod("a", true), pod("b", true), pod("c", true), pod("d", true)];
        let everywhere: BTreeMap<String, bool> = nodes.iter().map(|n| (n.clone(), true)).collect();
        let ds = ("drafs-system", "drafs-node");
        assert_eq!(agents("drafs.dev", ds, &nodes, &all, &everywhere).status, Status::Ok);
        let some = [pod("b", false), pod("c", true), pod("d", true)];
        let c = agents("drafs.dev", ds, &nodes, &some, &registered);
        assert_eq!(c.status, Status::Fail);
        assert_eq!(
            c.message,
            "drafs node does not serve 3 of 4 Linux nodes (no agent on a; the agent not ready on b; the kubelet lists no drafs.dev on c): pods there with its volume wait in ContainerCreating"
        );
        assert_eq!(c.details["withoutAgent"], json!(["a"]));
        assert_eq!(agents("drafs.dev", ds, &[], &[], &BTreeMap::new()).status, Status::Warn);
        let many: Vec<String> = (0..25).map(|i| format!("n{i}")).collect();
        let c = agents("drafs.dev", ds, &many, &[], &BTreeMap::new());
        assert!(c.message.contains("n9 and 15 more"), "{}", c.message);
    }

    #[test]
    fn nri_is_reported_by_node_serving_without_a_socket_or_failing() {
        assert_eq!(nri(false, &[]).status, Status::Skip);
        let status =
            |state: &str, detail: Option<&str>| Ok(json!({"ready": true, "nri": {"state": state, "detail": detail}}));
        let all = [("a".to_string(), status("serving", None)), ("b".to_string(), status("serving", None))];
        let c = nri(true, &all);
        assert_eq!(c.status, Status::Ok, "{}", c.message);
        assert_eq!(c.message, "drafs node serves containers through NRI on 2 of 2 nodes");
        let some = [("a".to_string(), status("serving", None)), ("b".to_string(), status("no_socket", None))];
        let c = nri(true, &some);
        assert_eq!(c.status, Status::Warn);
        assert!(c.message.contains("no NRI socket on b"), "{}", c.message);
        let bad = [
            ("a".to_string(), status("failing", Some("the runtime refused the registration"))),
            ("b".to_string(), Err("HTTP 503".into())),
        ];
        let c = nri(true, &bad);
        assert_eq!(c.status, Status::Fail);
        assert!(c.message.contains("a (the runtime refused the registration)"), "{}", c.message);
        assert_eq!(c.details["unknown"], json!(["b (HTTP 503)"]));
    }

    #[test]
    fn the_agents_are_those_of_the_daemonset_the_csi_driver_names() {
        let mut d = driver();
        let missing = agent_daemonset("drafs.dev", &d).unwrap_err();
        assert_eq!(missing.status, Status::Fail);
        assert!(missing.message.contains(AGENT_ANNOTATION), "{}", missing.message);
        for bad in ["drafs-node", "/drafs-node", "ns/", "a/b/c"] {
            d["metadata"]["annotations"] = json!({AGENT_ANNOTATION: bad});
            assert!(agent_daemonset("drafs.dev", &d).is_err(), "{bad}");
        }
        d["metadata"]["annotations"] = json!({AGENT_ANNOTATION: "drafs-system/drafs-node"});
        assert_eq!(agent_daemonset("drafs.dev", &d).unwrap(), ("drafs-system".into(), "drafs-node".into()));
    }

    #[test]
    fn accounts_whose_pods_use_the_volume_need_drafs_rbac() {
        use crate::admission::manifests::{Reader, grants_for};
        let grants = grants_for("ml", "trainer", Reader::NodeVolume);
        let all = |except: &str| grants.iter().map(|g| (g.clone(), g.to_string() != except)).collect::<Vec<_>>();
        let ok: AccountAccess = (("ml".into(), "trainer".into()), Ok(all("")));
        assert_eq!(volume_rbac("drafs.dev", std::slice::from_ref(&ok), None).status, Status::Ok);
        assert_eq!(volume_rbac("drafs.dev", &[], None).status, Status::Ok);
        assert!(grants.iter().all(|g| g.resource != "resourceslices"), "the agent reads the slices: {grants:?}");
        let missing = grants.iter().find(|g| !g.optional).unwrap().to_string();
        let lacking: AccountAccess = (("web".into(), "default".into()), Ok(all(&missing)));
        let c = volume_rbac("drafs.dev", &[ok.clone(), lacking], None);
        assert_eq!(c.status, Status::Fail);
        assert!(c.message.contains(&format!("web/default may not {missing}")), "{}", c.message);
        assert_eq!(c.fix.unwrap(), "drafs manifests rbac -n web --service-account default | kubectl apply -f -");
        let unknown: AccountAccess = (("x".into(), "y".into()), Err("HTTP 403".into()));
        assert_eq!(volume_rbac("drafs.dev", &[ok, unknown], None).status, Status::Warn);
    }
}
