//! `drafs check`: read what decides whether drafs works for a namespace or a
//! pod (the webhook configurations, the Namespace, the Pod and its Events),
//! ask the API server what the service account may do, reach the webhook,
//! and print the report `admission::check` makes of it. Exit 0: every check
//! passed (warnings allowed); 1: one failed; 2: bad flags or no cluster.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, Service};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use rustls_pki_types::UnixTime;
use serde_json::Value;

use crate::admission::check::{self, Check, Probe, Reach, Report, Status};
use crate::admission::inject::{self, Mode};
use crate::admission::manifests::{self, Grant, Reader};
use crate::admission::probe::{EndpointKey, endpoint_key, endpoint_of, handshake, split_host_port};
use crate::cmd::Failure;
use crate::cmd::cli::{CheckArgs, CheckOutput};
use crate::publish::call::{CallError, bounded};

#[derive(Debug)]
pub struct Config {
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub service_account: Option<String>,
    /// HOST:PORT where a Service-backed webhook can be reached from here (a port-forward).
    pub webhook_address: Option<String>,
    pub output: CheckOutput,
    pub warn_days: i64,
    /// Each request's limit.
    pub timeout: Duration,
    /// The CSI driver a pod's drafs volume names (mode csi).
    pub csi_driver: String,
    /// Check drafs node across the cluster instead of a namespace or a pod.
    pub installation: bool,
    /// Check whether drafs node may be uninstalled.
    pub uninstall: bool,
}

impl Config {
    pub fn from_args(args: &CheckArgs) -> Result<Self, Failure> {
        if let Some(address) = &args.webhook_address {
            split_host_port(address, None).ok_or_else(|| {
                Failure::Usage(format!("--webhook-address {address:?}: expected HOST:PORT, e.g. 127.0.0.1:8443"))
            })?;
        }
        if args.timeout.is_zero() {
            return Err(Failure::Usage("--timeout must be more than 0".into()));
        }
        Ok(Config {
            namespace: args.namespace.clone(),
            pod: args.pod.clone(),
            service_account: args.service_account.clone(),
            webhook_address: args.webhook_address.clone(),
            output: args.output,
            warn_days: i64::from(args.expiry_warning_days),
            timeout: args.timeout,
            csi_driver: args.csi.csi_driver.clone(),
            installation: args.installation,
            uninstall: args.uninstall,
        })
    }
}

pub async fn run(c: Config) -> Result<(), Failure> {
    let client = Client::try_default().await.map_err(|e| {
        Failure::Usage(format!("no cluster to check: {}", e.to_string().replace("'\"", "'").replace("\"'", "'")))
    })?;
    let report = if c.uninstall {
        uninstall(&client, &c).await
    } else if c.installation {
        installation(&client, &c).await
    } else {
        let namespace = c.namespace.clone().unwrap_or_else(|| client.default_namespace().to_string());
        gather(&client, &c, &namespace).await
    };
    let text = match c.output {
        CheckOutput::Text => report.to_text(),
        CheckOutput::Json => format!("{:#}\n", report.to_json()),
    };
    let mut out = std::io::stdout().lock();
    if let Err(e) = std::io::Write::write_all(&mut out, text.as_bytes())
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        return Err(Failure::Failed(format!("cannot write to stdout: {e}")));
    }
    match report.failed() {
        0 => Ok(()),
        n => Err(Failure::Failed(format!("{n} check{} failed", if n == 1 { "" } else { "s" }))),
    }
}

/// The CSIDriver and the CSINode of the pod's node, read for `check::node_agent`.
async fn node_agent_check(client: &Client, timeout: std::time::Duration, pod: &Value, name: &str) -> check::Check {
    use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
    let driver = match bounded(timeout, Api::<CSIDriver>::all(client.clone()).get_opt(name)).await {
        Ok(driver) => driver.and_then(|d| serde_json::to_value(d).ok()),
        Err(e) => return failed("node", format!("cannot read CSIDriver {name}: {e}")),
    };
    let node = match pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
        None => None,
        Some(node) => {
            let csinode = bounded(timeout, Api::<CSINode>::all(client.clone()).get_opt(node)).await.ok().flatten();
            let drivers = csinode.map(|n| n.spec.drivers.into_iter().map(|d| d.name).collect()).unwrap_or_default();
            Some((node, drivers))
        }
    };
    check::node_agent(name, driver.as_ref(), node)
}

async fn gather(client: &Client, c: &Config, namespace: &str) -> Report {
    let (configurations, mut checks) = configurations(client, c).await;
    let entries = check::drafs_entries(&configurations);
    let namespace_mode = namespace_mode(client, c.timeout, &entries).await;
    let pod = injection(client, c, namespace, &configurations, namespace_mode, &mut checks).await;
    // RBAC: the account drafs runs as.
    let account = c.service_account.clone().unwrap_or_else(|| match &pod {
        Some(pod) => inject::account_of(&pod["spec"]),
        None => manifests::DEFAULT_ACCOUNT.to_string(),
    });
    // A pod served by drafs node's volume needs only what the agent reads as it.
    let served_by_node = pod.as_ref().is_some_and(|p| inject::csi_volume_of(&p["spec"], &c.csi_driver).is_some());
    let reader = if served_by_node { Reader::NodeVolume } else { Reader::Pod };
    let answers = access(client, c.timeout, namespace, &account, reader).await;
    let shared = shared_role(client, c.timeout).await;
    checks.push(check::rbac(namespace, &account, answers, shared.as_deref()));
    checks.extend(webhooks(client, c, &entries).await);
    if let Some(pod) = &pod {
        // A pod served by drafs node: its CSIDriver and its node's registration.
        if inject::csi_volume_of(&pod["spec"], &c.csi_driver).is_some() {
            checks.push(node_agent_check(client, c.timeout, pod, &c.csi_driver).await);
        }
        checks.push(drafs_container(client, c, namespace, pod).await);
    }
    Report { namespace: namespace.to_string(), pod: c.pod.clone(), checks, uninstall: false }
}

/// The cluster's MutatingWebhookConfigurations and the check of drafs's.
async fn configurations(client: &Client, c: &Config) -> (Vec<MutatingWebhookConfiguration>, Vec<Check>) {
    let listed =
        bounded(c.timeout, Api::<MutatingWebhookConfiguration>::all(client.clone()).list(&ListParams::default())).await;
    match listed {
        Ok(list) => {
            let check = check::configuration(&list.items);
            (list.items, vec![check])
        }
        Err(e) => {
            let check = Check {
                name: "configuration",
                status: Status::Fail,
                message: format!("cannot list mutatingwebhookconfigurations: {e}"),
                fix: None,
                details: serde_json::json!({"configurations": [], "entries": [], "error": e.to_string()}),
            };
            (Vec::new(), vec![check])
        }
    }
}

/// Whether the namespace's pods (or `--pod`) get drafs, checked into
/// `checks`; the pod, when asked for and found.
async fn injection(
    client: &Client,
    c: &Config,
    namespace: &str,
    configurations: &[MutatingWebhookConfiguration],
    namespace_mode: Option<Mode>,
    checks: &mut Vec<Check>,
) -> Option<Value> {
    let ns = bounded(c.timeout, Api::<Namespace>::all(client.clone()).get_opt(namespace)).await;
    let pod = match &c.pod {
        None => None,
        Some(name) => Some(
            bounded(c.timeout, Api::<Pod>::namespaced(client.clone(), namespace).get_opt(name))
                .await
                .map(|p| p.map(|p| serde_json::to_value(p).unwrap_or_default())),
        ),
    };
    let labels = match &ns {
        Ok(Some(ns)) => Ok(check::namespace_labels(namespace, ns.metadata.labels.as_ref())),
        Ok(None) => Err(format!("namespace {namespace} does not exist")),
        Err(e) => Err(format!("cannot read namespace {namespace}: {e}")),
    };
    let pod_value = match (pod, &c.pod) {
        (Some(Ok(Some(p))), _) => Some(p),
        // No namespace, no pod: said once, below.
        (Some(Ok(None)), Some(_)) if labels.is_err() => None,
        (Some(Ok(None)), Some(name)) => {
            checks.push(failed("injection", format!("pod {namespace}/{name} does not exist")));
            None
        }
        (Some(Err(e)), Some(name)) => {
            checks.push(failed("injection", format!("cannot read pod {namespace}/{name}: {e}")));
            None
        }
        _ => None,
    };
    let pod_missing = c.pod.is_some() && pod_value.is_none();
    match (labels, &pod_value) {
        (Err(e), _) => checks.push(failed("injection", e)),
        (Ok(labels), Some(pod)) => {
            checks.push(check::pod_injection(configurations, &labels, pod, namespace_mode, &c.csi_driver))
        }
        (Ok(labels), None) if !pod_missing => {
            checks.push(check::namespace_injection(configurations, namespace, &labels, namespace_mode))
        }
        _ => {}
    }
    pod_value
}

/// The webhook, per drafs entry. Entries that share an endpoint (both of
/// drafs's do) share one probe; the endpoints are probed at once, all within
/// one --timeout.
async fn webhooks(client: &Client, c: &Config, entries: &[(String, &MutatingWebhook)]) -> Vec<Check> {
    let now = i64::try_from(UnixTime::now().as_secs()).unwrap_or(i64::MAX);
    let mut unique: Vec<(EndpointKey, &MutatingWebhook)> = Vec::new();
    for (_, entry) in entries {
        let key = endpoint_key(&entry.client_config);
        if !unique.iter().any(|(k, _)| *k == key) {
            unique.push((key, entry));
        }
    }
    let deadline = tokio::time::Instant::now() + c.timeout;
    let probed: Vec<(EndpointKey, Probe)> =
        futures::future::join_all(unique.into_iter().map(|(key, entry)| async move {
            let probe = match tokio::time::timeout_at(deadline, probe(client, c, entry)).await {
                Ok(probe) => probe,
                Err(_) => Probe {
                    entry: entry.name.clone(),
                    endpoint: endpoint_of(entry),
                    server_name: String::new(),
                    ca_bundle: entry.client_config.ca_bundle.as_ref().map(|b| b.0.clone()).unwrap_or_default(),
                    reach: Reach::no_answer(c.timeout, endpoint_of(entry)),
                    served: None,
                },
            };
            (key, probe)
        }))
        .await;
    let mut checks = Vec::new();
    for (_, entry) in entries {
        let key = endpoint_key(&entry.client_config);
        let Some((_, earlier)) = probed.iter().find(|(k, _)| *k == key) else { continue };
        let probe = Probe {
            entry: entry.name.clone(),
            endpoint: endpoint_of(entry),
            ca_bundle: entry.client_config.ca_bundle.as_ref().map(|b| b.0.clone()).unwrap_or_default(),
            ..earlier.clone()
        };
        checks.push(check::webhook(&probe, now, c.warn_days));
    }
    checks
}

/// The pod's drafs container, from its status and its Events.
async fn drafs_container(client: &Client, c: &Config, namespace: &str, pod: &Value) -> Check {
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let params = ListParams::default().fields(&format!("involvedObject.uid={uid}"));
    let events = bounded(c.timeout, Api::<Event>::namespaced(client.clone(), namespace).list(&params)).await;
    let events: Vec<Value> = match events {
        Ok(list) => list.items.into_iter().filter_map(|e| serde_json::to_value(e).ok()).collect(),
        Err(e) => {
            tracing::warn!("cannot list the pod's events: {e}");
            Vec::new()
        }
    };
    check::pod_status(pod, &events)
}

fn failed(name: &'static str, message: String) -> Check {
    Check { name, status: Status::Fail, details: serde_json::json!({"error": message}), message, fix: None }
}

/// The webhook's `--namespace-mode`, read from the Deployment behind the
/// entries' Service (`None`: a URL entry, or not readable).
async fn namespace_mode(client: &Client, limit: Duration, entries: &[(String, &MutatingWebhook)]) -> Option<Mode> {
    let (deployments, selector) = webhook_deployments(client, limit, entries).await?;
    check::webhook_namespace_mode(&deployments, &selector)
}

/// The Deployments of the namespace of the entries' Service, and its selector.
async fn webhook_deployments(
    client: &Client,
    limit: Duration,
    entries: &[(String, &MutatingWebhook)],
) -> Option<(Vec<Deployment>, std::collections::BTreeMap<String, String>)> {
    let service = entries.iter().find_map(|(_, e)| e.client_config.service.as_ref())?;
    let svc =
        bounded(limit, Api::<Service>::namespaced(client.clone(), &service.namespace).get(&service.name)).await.ok()?;
    let selector = svc.spec?.selector?;
    let deployments =
        bounded(limit, Api::<Deployment>::namespaced(client.clone(), &service.namespace).list(&ListParams::default()))
            .await
            .ok()?;
    Some((deployments.items, selector))
}

/// The chart's tenant ClusterRole (`tenants.roles`), when the cluster has it
/// and it may be read: the fixes then bind it rather than print a namespace's own roles.
async fn shared_role(client: &Client, limit: Duration) -> Option<String> {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let name = manifests::TENANT_CLUSTER_ROLE;
    let found = bounded(limit, Api::<ClusterRole>::all(client.clone()).get_opt(name)).await.ok().flatten();
    found.map(|_| name.to_string())
}

/// Pods read per page when looking for the volume's users.
const POD_PAGE: u32 = 500;
/// Service accounts asked about at once (every one is asked about).
const ACCOUNTS_AT_ONCE: usize = 8;

/// `check --installation`: drafs node across the cluster.
async fn installation(client: &Client, c: &Config) -> Report {
    use k8s_openapi::api::storage::v1::CSIDriver;
    let name = c.csi_driver.as_str();
    let mut checks = Vec::new();

    // The CSIDriver, and the driver the webhook's volumes name.
    let (configurations, _) = configurations(client, c).await;
    let entries = check::drafs_entries(&configurations);
    let (webhook_driver, installed_image) = match webhook_deployments(client, c.timeout, &entries).await {
        Some((deployments, selector)) => {
            (check::webhook_csi_driver(&deployments, &selector), check::webhook_image(&deployments, &selector))
        }
        None => (None, None),
    };
    let driver = match bounded(c.timeout, Api::<CSIDriver>::all(client.clone()).get_opt(name)).await {
        Ok(driver) => {
            let driver = driver.and_then(|d| serde_json::to_value(d).ok());
            checks.push(check::csi_driver(name, driver.as_ref(), webhook_driver.as_deref()));
            driver
        }
        Err(e) => {
            checks.push(failed("csi-driver", format!("cannot read CSIDriver {name}: {e}")));
            None
        }
    };

    // An agent of the installation's, ready and registered, on every Linux node.
    if let Some(driver) = &driver {
        match check::agent_daemonset(name, driver) {
            Ok(daemonset) => checks.extend(agents(client, c.timeout, name, daemonset).await),
            Err(check) => checks.push(*check),
        }
    }

    // The RBAC of the accounts whose pods use the volume (the agent reads as each pod),
    // and the pods whose drafs is not the one the webhook injects now.
    match scan_pods(client, c.timeout, name, installed_image.as_deref()).await {
        Ok(PodScan { accounts, current, stale, .. }) => {
            if let Some(installed) = &installed_image {
                checks.push(check::versions(installed, current, &stale));
            }
            let asked = futures::stream::iter(accounts)
                .map(|(ns, account)| async move {
                    let access = access(client, c.timeout, &ns, &account, Reader::NodeVolume).await;
                    ((ns, account), access)
                })
                .buffered(ACCOUNTS_AT_ONCE);
            let answers: Vec<check::AccountAccess> = asked.collect().await;
            let shared = shared_role(client, c.timeout).await;
            checks.push(check::volume_rbac(name, &answers, shared.as_deref()));
        }
        Err(e) => checks.push(failed("volume-rbac", format!("cannot list the pods: {e}"))),
    }
    Report { namespace: String::new(), pod: None, checks, uninstall: false }
}

/// `--uninstall`: the pods that still use the volume. Pods that cannot be
/// listed fail the check: the guard refuses what it cannot see. A driver
/// name the cluster has no CSIDriver of is a warning (a hand-run check
/// without the installation's `--csi-driver` would look for the wrong volumes).
async fn uninstall(client: &Client, c: &Config) -> Report {
    use k8s_openapi::api::storage::v1::CSIDriver;
    let name = c.csi_driver.as_str();
    let mut checks = Vec::new();
    if let Ok(None) = bounded(c.timeout, Api::<CSIDriver>::all(client.clone()).get_opt(name)).await {
        checks.push(check::no_csi_driver(name));
    }
    checks.push(match scan_pods(client, c.timeout, name, None).await {
        Ok(scan) => check::in_use(name, &scan.users),
        Err(e) => Check {
            fix: Some(
                "run it as an account that may list pods in every namespace, or uninstall without the check (helm \
                 uninstall --no-hooks) knowing that pods with the volume then stay Terminating"
                    .into(),
            ),
            ..failed("in-use", format!("cannot list the pods: {e}"))
        },
    });
    Report { namespace: String::new(), pod: None, checks, uninstall: true }
}

/// The agents check: the pods of the DaemonSet `(namespace, name)` (those
/// its controller made, by their owner), against the Linux nodes and the
/// drivers their kubelets registered; and the NRI check, from each ready
/// agent's `/status` through the API server's pod proxy.
async fn agents(client: &Client, limit: Duration, driver: &str, (namespace, name): (String, String)) -> Vec<Check> {
    let (check, pods) = agents_of(client, limit, driver, (&namespace, &name)).await;
    let mut checks = vec![check];
    let enabled = pods
        .iter()
        .any(|p| p.spec.iter().flat_map(|s| &s.containers).any(|c| c.args.iter().flatten().any(|a| a == "--nri")));
    let mut statuses = Vec::new();
    for pod in pods.iter().filter(|_| enabled) {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        statuses.push((node, agent_status(client, limit, &namespace, pod).await));
    }
    checks.push(check::nri(enabled, &statuses));
    checks
}

/// An agent's `/status`, on its probe port, through the API server's pod proxy.
async fn agent_status(client: &Client, limit: Duration, namespace: &str, pod: &Pod) -> Result<Value, String> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let port = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("healthz"))
        .map(|p| p.container_port)
        .ok_or("its container has no port named healthz")?;
    let path = format!("/api/v1/namespaces/{namespace}/pods/{name}:{port}/proxy/status");
    let request = http::Request::get(path).body(Vec::new()).map_err(|e| e.to_string())?;
    let text = bounded(limit, client.request_text(request)).await.map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("its /status is not JSON: {e}"))
}

/// The agents check, and the DaemonSet's pods it counted.
async fn agents_of(
    client: &Client,
    limit: Duration,
    driver: &str,
    (namespace, name): (&str, &str),
) -> (Check, Vec<Pod>) {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::storage::v1::CSINode;
    let daemonset = match bounded(limit, Api::<DaemonSet>::namespaced(client.clone(), namespace).get_opt(name)).await {
        Ok(Some(ds)) => ds,
        Ok(None) => {
            let message = format!(
                "the CSIDriver {driver} names the DaemonSet {namespace}/{name} as its agents', and there is none: no node is served"
            );
            return (failed("agents", message), Vec::new());
        }
        Err(e) => return (failed("agents", format!("cannot read the DaemonSet {namespace}/{name}: {e}")), Vec::new()),
    };
    let uid = daemonset.metadata.uid.clone().unwrap_or_default();
    let linux = ListParams::default().labels("kubernetes.io/os=linux");
    let nodes = bounded(limit, Api::<Node>::all(client.clone()).list(&linux)).await;
    let pods = bounded(limit, Api::<Pod>::namespaced(client.clone(), namespace).list(&ListParams::default())).await;
    let csinodes = bounded(limit, Api::<CSINode>::all(client.clone()).list(&ListParams::default())).await;
    match (nodes, pods, csinodes) {
        (Ok(nodes), Ok(pods), Ok(csinodes)) => {
            let nodes: Vec<String> = nodes.items.into_iter().filter_map(|n| n.metadata.name).collect();
            let owned: Vec<Pod> = pods.items.into_iter().filter(|p| agent_pod(p, &uid).is_some()).collect();
            let agents: Vec<check::AgentPod> = owned.iter().filter_map(|p| agent_pod(p, &uid)).collect();
            let registered = csinodes
                .items
                .into_iter()
                .filter_map(|n| Some((n.metadata.name?, n.spec.drivers.iter().any(|d| d.name == driver))))
                .collect();
            let ready: Vec<Pod> = owned.into_iter().filter(|p| agent_pod(p, &uid).is_some_and(|a| a.ready)).collect();
            (check::agents(driver, (namespace, name), &nodes, &agents, &registered), ready)
        }
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            (failed("agents", format!("cannot list the nodes, the agents and the CSINodes: {e}")), Vec::new())
        }
    }
}

/// A pod its DaemonSet (of uid `owner`) made, or None.
fn agent_pod(pod: &Pod, owner: &str) -> Option<check::AgentPod> {
    let owned = pod.metadata.owner_references.iter().flatten().any(|o| o.controller == Some(true) && o.uid == owner);
    let spec = pod.spec.as_ref().filter(|_| owned && !owner.is_empty())?;
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    Some(check::AgentPod {
        name: pod.metadata.name.clone().unwrap_or_default(),
        node: spec.node_name.clone().unwrap_or_default(),
        ready,
    })
}

/// What one pass over the cluster's pods found (a page at a time, only
/// this kept).
#[derive(Default)]
struct PodScan {
    /// The (namespace, account) of every pod with a volume of the driver.
    accounts: std::collections::BTreeSet<(String, String)>,
    /// Pods whose injected drafs is the installed image.
    current: usize,
    /// Pods whose injected drafs is another.
    stale: Vec<check::StalePod>,
    /// Unfinished pods with a volume of the driver.
    users: Vec<check::VolumeUser>,
}

/// Every pod, a page at a time: those using the volume of `driver` and
/// their accounts, and how many run the `installed` drafs and which do not.
async fn scan_pods(
    client: &Client,
    limit: Duration,
    driver: &str,
    installed: Option<&str>,
) -> Result<PodScan, CallError> {
    let api = Api::<Pod>::all(client.clone());
    let mut scan = PodScan::default();
    let mut params = ListParams::default().limit(POD_PAGE);
    loop {
        let page = bounded(limit, api.list(&params)).await?;
        for pod in &page.items {
            if let Some(installed) = installed {
                match check::stale(pod, installed) {
                    Some(stale) => scan.stale.push(stale),
                    None => scan.current += usize::from(check::injected_image(pod).is_some()),
                }
            }
            scan.users.extend(check::volume_user(pod, driver));
            if check::has_volume_of(pod, driver) {
                let account = pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).filter(|a| !a.is_empty());
                scan.accounts.insert((
                    pod.metadata.namespace.clone().unwrap_or_default(),
                    account.unwrap_or_else(|| "default".into()),
                ));
            }
        }
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(scan),
        }
    }
}

/// Whether `account` may do what drafs needs, one SubjectAccessReview per
/// permission; `Err` when the caller may not ask. A caller who may not
/// create SubjectAccessReviews but is that very account (`drafs check` in
/// the pod) asks SelfSubjectAccessReviews instead, which everyone may.
async fn access(
    client: &Client,
    limit: Duration,
    namespace: &str,
    account: &str,
    reader: Reader,
) -> Result<Vec<(Grant, bool)>, String> {
    let user = format!("system:serviceaccount:{namespace}:{account}");
    let grants = manifests::grants_for(namespace, account, reader);
    let attributes = |grant: &Grant| ResourceAttributes {
        namespace: grant.namespace.clone(),
        verb: Some(grant.verb.clone()),
        group: Some(grant.group.clone()),
        resource: Some(grant.resource.clone()),
        ..Default::default()
    };
    let api = Api::<SubjectAccessReview>::all(client.clone());
    let mut answers = Vec::new();
    let mut forbidden = None;
    for grant in &grants {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.clone()),
                groups: Some(vec![
                    "system:serviceaccounts".into(),
                    format!("system:serviceaccounts:{namespace}"),
                    "system:authenticated".into(),
                ]),
                resource_attributes: Some(attributes(grant)),
                ..Default::default()
            },
            ..Default::default()
        };
        match bounded(limit, api.create(&PostParams::default(), &review)).await {
            Ok(answer) => answers.push((grant.clone(), answer.status.is_some_and(|s| s.allowed))),
            Err(e) if e.is_forbidden() => {
                forbidden = Some(e);
                break;
            }
            Err(e) => return Err(format!("a SubjectAccessReview failed: {e}")),
        }
    }
    let Some(forbidden) = forbidden else { return Ok(answers) };
    let me = bounded(
        limit,
        Api::<SelfSubjectReview>::all(client.clone()).create(&PostParams::default(), &SelfSubjectReview::default()),
    )
    .await
    .ok()
    .and_then(|r| r.status?.user_info?.username);
    if me.as_deref() != Some(user.as_str()) {
        return Err(format!("you may not create subjectaccessreviews ({forbidden})"));
    }
    let api = Api::<SelfSubjectAccessReview>::all(client.clone());
    let mut answers = Vec::new();
    for grant in grants {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec { resource_attributes: Some(attributes(&grant)), ..Default::default() },
            ..Default::default()
        };
        let answer = bounded(limit, api.create(&PostParams::default(), &review))
            .await
            .map_err(|e| format!("a SelfSubjectAccessReview failed: {e}"))?;
        answers.push((grant, answer.status.is_some_and(|s| s.allowed)));
    }
    Ok(answers)
}

/// What the entry's endpoint answers: directly for a URL (or a Service with
/// --webhook-address), else through the API server's service proxy.
async fn probe(client: &Client, c: &Config, entry: &MutatingWebhook) -> Probe {
    let config = &entry.client_config;
    let ca_bundle = config.ca_bundle.as_ref().map(|b| b.0.clone()).unwrap_or_default();
    if let Some(service) = &config.service {
        let port = service.port.unwrap_or(443);
        let endpoint = endpoint_of(entry);
        let server_name = format!("{}.{}.svc", service.name, service.namespace);
        if let Some(address) = &c.webhook_address {
            let (host, port) = split_host_port(address, None).unwrap_or_default();
            let (reach, served) = handshake(&host, port, &server_name, c.timeout, &format!("at {address}")).await;
            return Probe { entry: entry.name.clone(), endpoint, server_name, ca_bundle, reach, served: Some(served) };
        }
        let through = "through the API server's service proxy".to_string();
        let proxy =
            format!("/api/v1/namespaces/{}/services/https:{}:{port}/proxy/healthz", service.namespace, service.name);
        let reach = match http::Request::get(&proxy).body(Vec::new()) {
            Ok(request) => match tokio::time::timeout(c.timeout, proxied_status(client, request)).await {
                Ok(Ok(status)) => Reach::Answered { status, through },
                Ok(Err(error)) => Reach::Failed { error, through },
                Err(_) => Reach::Failed { error: CallError::Timeout(c.timeout).to_string(), through },
            },
            Err(e) => Reach::Failed { error: e.to_string(), through },
        };
        return Probe { entry: entry.name.clone(), endpoint, server_name, ca_bundle, reach, served: None };
    }
    let url = config.url.clone().unwrap_or_default();
    let parsed = url.parse::<http::Uri>().ok();
    let host =
        parsed.as_ref().and_then(|u| u.host()).map(|h| h.trim_start_matches('[').trim_end_matches(']').to_string());
    let Some(host) = host else {
        let reach = Reach::Failed {
            error: format!("clientConfig has no service and no valid url ({url:?})"),
            through: "nowhere".into(),
        };
        return Probe {
            entry: entry.name.clone(),
            endpoint: url,
            server_name: String::new(),
            ca_bundle,
            reach,
            served: None,
        };
    };
    let port = parsed.as_ref().and_then(|u| u.port_u16()).unwrap_or(443);
    let address = c.webhook_address.clone().and_then(|a| split_host_port(&a, None)).unwrap_or((host.clone(), port));
    let through = format!("at {}:{}", address.0, address.1);
    let (reach, served) = handshake(&address.0, address.1, &host, c.timeout, &through).await;
    Probe { entry: entry.name.clone(), endpoint: url, server_name: host, ca_bundle, reach, served: Some(served) }
}

/// The most of an answer's body `check` reads through the service proxy: a
/// webhook (or whatever answers there) may send an endless body.
const PROXY_BODY_LIMIT: usize = 4096;

/// GET through the API server's service proxy: the status when it is a
/// success, else an error with the API server's message or the first
/// [`PROXY_BODY_LIMIT`] bytes of the body, escaped. Never reads more.
async fn proxied_status(client: &Client, request: http::Request<Vec<u8>>) -> Result<u16, String> {
    use http_body_util::BodyExt;
    let response =
        client.send(request.map(kube::client::Body::from)).await.map_err(|e| CallError::from(e).to_string())?;
    let status = response.status();
    if status.is_success() {
        return Ok(status.as_u16());
    }
    let mut body = response.into_body();
    let mut prefix = Vec::new();
    while prefix.len() < PROXY_BODY_LIMIT {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    prefix.extend_from_slice(&data);
                }
            }
            _ => break,
        }
    }
    prefix.truncate(PROXY_BODY_LIMIT);
    let message = serde_json::from_slice::<Value>(&prefix)
        .ok()
        .and_then(|s| s["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&prefix).trim().to_string());
    Err(format!("HTTP {}: {}", status.as_u16(), crate::cmd::get::printable(&message)))
}
