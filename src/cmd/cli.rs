//! Command line and environment: every flag can also be set by an env variable,
//! so a pod manifest can configure drafs without touching its args.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::admission::inject::Mode;
use crate::admission::manifests;
use crate::model::envvars::EnvSpec;
use crate::model::names::is_dns_label;
pub use crate::model::names::{parse_driver_name, parse_duration};
use crate::model::tree::RequirePath;
use crate::node::request::TokenIn;
use crate::publish::events::EventsMode;

/// What `drafs --version` says: the version of Cargo.toml (the release's,
/// the chart's and the image tag's), and the commit it was built from
/// (`build.rs`: `DRAFS_REVISION`, else the checkout's HEAD).
pub fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| match option_env!("DRAFS_REVISION") {
        Some(revision) if !revision.is_empty() => format!("{} ({revision})", env!("CARGO_PKG_VERSION")),
        _ => env!("CARGO_PKG_VERSION").to_string(),
    })
}

#[derive(Debug, Parser)]
#[command(name = "drafs", version = version(), about = "The attributes of a pod's DRA-allocated devices, as files", long_about = None)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct Global {
    /// Log format.
    #[arg(long, env = "DRAFS_LOG_FORMAT", global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Which pod, and where its objects come from (for the commands that resolve).
#[derive(Debug, Args)]
pub struct SourceArgs {
    /// Name of the pod to resolve (set it from the downward API: metadata.name). Default: $HOSTNAME.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Namespace of the pod (downward API: metadata.namespace). Default: the service account's
    /// namespace in a pod, the kubeconfig context's elsewhere.
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// Read the Pod, ResourceClaims and ResourceSlices from this YAML/JSON file instead of the API.
    #[arg(long, env = "DRAFS_FROM_FILE", value_name = "FILE")]
    pub from_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Resolve, write the tree, exit 0 once everything asked for is there (init container).
    Init(InitArgs),
    /// Serve the tree and keep it current (native sidecar), through FUSE or atomically written files.
    Serve(ServeArgs),
    /// Exit 0 if the tree at --dir is there and ready, 1 otherwise (startupProbe/readinessProbe).
    Probe(ProbeArgs),
    /// Unmount a FUSE tree at --dir (lazily if files are open); for a preStop hook.
    Unmount(DirArgs),
    /// Set environment variables from device values and run a command in place of drafs.
    Exec(ExecArgs),
    /// Copy this static binary into a directory (a shared emptyDir), to use as an entrypoint wrapper.
    CopySelf(CopySelfArgs),
    /// Print Kubernetes manifests drafs needs (`drafs manifests rbac --namespace NS | kubectl apply -f -`).
    #[command(subcommand)]
    Manifests(ManifestsCommand),
    /// Add drafs to Pod/Deployment/StatefulSet/Job/DaemonSet manifests (files, directories or stdin); print them.
    Inject(InjectArgs),
    /// Resolve once and print the devices and their attributes.
    Get(GetArgs),
    /// Serve the mutating admission webhook that injects drafs into pods labelled drafs.dev/inject.
    Webhook(WebhookArgs),
    /// Will drafs work for a namespace or a pod, and if not, why (exit 0: yes, 1: a check failed, 2: usage).
    Check(CheckArgs),
    /// Serve every pod on this node that asks with a CSI volume (a DaemonSet: drafs per node).
    Node(NodeArgs),
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// This node's name (downward API spec.nodeName): the CSI node id.
    #[arg(long, env = "NODE_NAME", value_parser = parse_name)]
    pub node_name: String,
    /// The kubelet's root directory: pods' volumes are published under its pods/.
    #[arg(long, env = "DRAFS_KUBELET_DIR", default_value = "/var/lib/kubelet", value_name = "DIR")]
    pub kubelet_dir: PathBuf,
    /// The CSI driver's name (the CSIDriver object's and the pods' `csi.driver`).
    #[arg(long, env = "DRAFS_DRIVER_NAME", default_value = crate::node::DEFAULT_DRIVER, value_parser = parse_csi_driver_name)]
    pub driver_name: String,
    /// The CSI endpoint. Default: <kubelet-dir>/plugins/<driver-name>/csi.sock.
    #[arg(long, env = "DRAFS_CSI_ENDPOINT", value_name = "SOCKET")]
    pub endpoint: Option<PathBuf>,
    /// Where the kubelet looks for plugins to register. Default: <kubelet-dir>/plugins_registry.
    #[arg(long, env = "DRAFS_REGISTRATION_DIR", value_name = "DIR")]
    pub registration_dir: Option<PathBuf>,
    /// How often a volume's pod and claims are read again once its first two minutes (watched) are
    /// over, at the kubelet's republish (about once a minute); the node's slices are always watched.
    #[arg(long, env = "DRAFS_REFRESH", default_value = "5m", value_name = "DURATION", value_parser = parse_duration)]
    pub refresh: std::time::Duration,
    /// How long a new volume's pod and claims are watched (what the driver reports when it prepares
    /// the device comes then) before they are only read again at each refresh.
    #[arg(long, env = "DRAFS_WATCH_FOR", default_value = "2m", value_name = "DURATION", value_parser = parse_duration)]
    pub watch_for: std::time::Duration,
    /// Watch the node's pods with the agent's own account (one watch, `spec.nodeName`): a served
    /// pod's device health or claim statuses changing after --watch-for reaches its volume within a
    /// second, not at the refresh. Needs get, list and watch of pods for the agent (docs/node-mode.md).
    #[arg(long, env = "DRAFS_WATCH_NODE_PODS")]
    pub watch_node_pods: bool,
    /// Pods served at once (a pod's tree and standard view share its place; a pod without claims
    /// takes none); a pod beyond is refused (ResourceExhausted) until one goes.
    /// With --volume-size, it bounds the tmpfs memory charged to the agent (docs/node-mode.md).
    #[arg(long, env = "DRAFS_MAX_PODS", default_value_t = 110, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_pods: u32,
    /// Pods of one namespace served at once, so that one tenant cannot take every place of the
    /// node. Default: half of --max-pods.
    #[arg(long, env = "DRAFS_MAX_PODS_PER_NAMESPACE", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_pods_per_namespace: Option<u32>,
    /// The largest tmpfs of a volume: its tree, the next one while it is swapped in, and the
    /// superseded ones kept for readers still inside them (12Mi: four 8-GPU trees of 2.1 MiB).
    /// A tree that outgrows it is refused.
    #[arg(long, env = "DRAFS_VOLUME_SIZE", default_value = "12Mi", value_name = "SIZE", value_parser = crate::model::names::parse_size)]
    pub volume_size: u64,
    /// The most files, directories and links a volume's tmpfs holds (as --volume-size, in inodes).
    #[arg(long, env = "DRAFS_VOLUME_INODES", default_value_t = 4096, value_name = "N", value_parser = clap::value_parser!(u64).range(64..=1_000_000))]
    pub volume_inodes: u64,
    /// Serve /metrics, /healthz and /readyz (ready once the kubelet confirmed the registration and
    /// while both sockets are the agent's) over plain HTTP on this address; off by default.
    #[arg(long, env = "DRAFS_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Where the kubelet puts the pod's service-account token, as the CSIDriver's
    /// serviceAccountTokenInSecrets says (secrets: true, Kubernetes 1.35+); the other place is the pod's
    /// own (its volumeAttributes, its nodePublishSecretRef), and a token there is never used.
    #[arg(long, env = "DRAFS_TOKEN_IN", value_enum, default_value_t = TokenIn::VolumeContext, value_name = "WHERE")]
    pub token_in: TokenIn,
    /// Also serve as an NRI plugin of the container runtime: a container of an opted-in pod (label
    /// drafs.dev/nri=enabled on it or its namespace) that uses a claim gets its own tree mounted at
    /// /dra, with nothing in the pod's spec (docs/nri.md). Implies --watch-node-pods. Needs
    /// get, list and watch of pods and resourceclaims, list and watch of namespaces.
    #[arg(long, env = "DRAFS_NRI")]
    pub nri: bool,
    /// The runtime's NRI socket (while it is missing, containers are not served through NRI).
    #[arg(long, env = "DRAFS_NRI_SOCKET", default_value = "/var/run/nri/nri.sock", value_name = "SOCKET")]
    pub nri_socket: PathBuf,
    /// The agent's directory of the pods it serves through NRI, a host path the runtime binds from
    /// (a tmpfs per pod in it).
    #[arg(long, env = "DRAFS_NRI_DIR", default_value = "/var/run/drafs/nri", value_name = "DIR")]
    pub nri_dir: PathBuf,
    /// Longest a container's creation waits for its tree before it is refused with what is missing
    /// (the kubelet retries): every container creation on the node waits behind it.
    #[arg(long, env = "DRAFS_NRI_WAIT", default_value = "500ms", value_name = "DURATION", value_parser = parse_duration)]
    pub nri_wait: std::time::Duration,
    /// The agent's own DaemonSet (NAMESPACE/NAME): at a stop, if it is gone or being deleted
    /// (uninstalled), the trees served through NRI are removed from the node; otherwise they stay for
    /// the next agent. Needs get of that DaemonSet; without the flag, they always stay.
    #[arg(long, env = "DRAFS_DAEMONSET", value_name = "NAMESPACE/NAME", value_parser = parse_namespaced)]
    pub daemonset: Option<(String, String)>,
    /// The plugin's place among the runtime's NRI plugins (two digits; they are called in order).
    #[arg(long, env = "DRAFS_NRI_PLUGIN_INDEX", default_value = "90", value_name = "NN", value_parser = parse_plugin_index)]
    pub nri_plugin_index: String,
    /// Serve only /healthz and /readyz on this address, for the kubelet's probes (which must reach
    /// it) while /metrics stays on --metrics-addr (which need not: e.g. 127.0.0.1); off by default.
    #[arg(long, env = "DRAFS_HEALTH_ADDR", value_name = "ADDR")]
    pub health_addr: Option<std::net::SocketAddr>,
}

/// Two digits, as NRI orders its plugins.
/// `NAMESPACE/NAME` of a namespaced object.
fn parse_namespaced(s: &str) -> Result<(String, String), String> {
    use crate::model::names::{is_dns_label, is_dns_subdomain};
    match s.split_once('/') {
        Some((namespace, name)) if is_dns_label(namespace) && is_dns_subdomain(name) => {
            Ok((namespace.to_string(), name.to_string()))
        }
        _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
    }
}

fn parse_plugin_index(s: &str) -> Result<String, String> {
    if s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit()) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not two digits (00 to 99)"))
    }
}

/// The injected drafs container's requests and limits (`inject`, `webhook`):
/// each flag over drafs's defaults (docs/deploy.md).
#[derive(Debug, Args, Default)]
pub struct ResourcesArgs {
    /// The drafs container's CPU request (default 10m; empty: none).
    #[arg(long, value_name = "QUANTITY", value_parser = parse_quantity_or_none)]
    pub cpu_request: Option<String>,
    /// Its memory request (default 16Mi; empty: none).
    #[arg(long, value_name = "QUANTITY", value_parser = parse_quantity_or_none)]
    pub memory_request: Option<String>,
    /// Its CPU limit (default none), for a namespace whose ResourceQuota covers limits.cpu.
    #[arg(long, value_name = "QUANTITY", value_parser = parse_quantity_or_none)]
    pub cpu_limit: Option<String>,
    /// Its memory limit (default 32Mi, at least 32Mi; empty: none).
    #[arg(long, value_name = "QUANTITY", value_parser = parse_quantity_or_none)]
    pub memory_limit: Option<String>,
}

impl ResourcesArgs {
    /// The flags over drafs's defaults, checked together (a request above its limit).
    pub fn resources(&self) -> Result<crate::admission::resources::Resources, String> {
        let pairs: Vec<String> = [
            ("cpu-request", &self.cpu_request),
            ("memory-request", &self.memory_request),
            ("cpu-limit", &self.cpu_limit),
            ("memory-limit", &self.memory_limit),
        ]
        .iter()
        .filter_map(|(key, value)| value.as_ref().map(|v| format!("{key}={v}")))
        .collect();
        crate::admission::resources::Resources::default().with(&pairs.join(",")).map_err(|e| {
            format!("the drafs container's --cpu-request, --memory-request, --cpu-limit, --memory-limit: {e}")
        })
    }
}

/// A quantity, or "" (none).
fn parse_quantity_or_none(text: &str) -> Result<String, String> {
    if text.is_empty() { Ok(String::new()) } else { crate::admission::resources::check_quantity(text) }
}

/// `--csi-driver`, for the commands that name or recognize the volume of mode
/// csi: the driver's name is the chart's to choose (`node.driverName`).
#[derive(Debug, Args)]
pub struct CsiDriverArgs {
    /// The CSI driver that serves mode csi's volume (`drafs node --driver-name`, the chart's node.driverName):
    /// the `csi.driver` an injected volume names, and by which a pod's drafs volume is known.
    #[arg(long, env = "DRAFS_CSI_DRIVER", value_name = "NAME", default_value = crate::model::names::DEFAULT_CSI_DRIVER,
          value_parser = parse_csi_driver_name)]
    pub csi_driver: String,
}

/// A CSI driver name: a DNS subdomain of at most 63 characters, as the CSIDriver object's.
fn parse_csi_driver_name(s: &str) -> Result<String, String> {
    if s.len() <= 63 && parse_driver_name(s).is_ok() {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a CSI driver name (a lowercase DNS subdomain of at most 63 characters)"))
    }
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The pod to check (injected? its service account's RBAC? what drafs reported?); without it, the namespace.
    #[arg(value_name = "POD", value_parser = parse_name)]
    pub pod: Option<String>,
    /// The namespace. Default: the kubeconfig context's (in a pod: the service account's).
    #[arg(long, short = 'n', env = "DRAFS_CHECK_NAMESPACE", value_parser = parse_namespace)]
    pub namespace: Option<String>,
    /// The service account whose RBAC to check. Default: the one drafs runs as in the pod (drafs
    /// for a pod that chose none), drafs for a namespace.
    #[arg(long, env = "DRAFS_CHECK_SERVICE_ACCOUNT", value_parser = parse_name)]
    pub service_account: Option<String>,
    /// HOST:PORT to reach the webhook at for its TLS handshake (a Service is not reachable from outside
    /// the cluster: `kubectl port-forward -n drafs-system svc/drafs-webhook 8443:443`, then 127.0.0.1:8443).
    #[arg(long, env = "DRAFS_CHECK_WEBHOOK_ADDRESS", value_name = "HOST:PORT")]
    pub webhook_address: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = CheckOutput::Text)]
    pub output: CheckOutput,
    /// Warn when a certificate (the webhook's, its CA) expires within this many days.
    #[arg(long, env = "DRAFS_CHECK_EXPIRY_WARNING_DAYS", default_value_t = crate::admission::check::EXPIRY_WARNING_DAYS as u32,
          value_parser = clap::value_parser!(u32).range(0..=3650), value_name = "DAYS")]
    pub expiry_warning_days: u32,
    /// How long each request may take.
    #[arg(long, env = "DRAFS_CHECK_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub timeout: Duration,
    /// Check drafs node across the cluster instead of a namespace or a pod: the CSIDriver (and the
    /// driver the webhook's volumes name), an agent ready and registered on every Linux node, and the
    /// RBAC of the service accounts whose pods use the volume.
    #[arg(long, conflicts_with_all = ["pod", "namespace", "service_account"])]
    pub installation: bool,
    /// Whether drafs node may be uninstalled: fails while pods use the volume (the kubelet could not
    /// unpublish it without the agent), naming them. The chart's pre-delete hook runs it.
    #[arg(long, conflicts_with_all = ["pod", "namespace", "service_account", "installation", "webhook_address"])]
    pub uninstall: bool,
    #[command(flatten)]
    pub csi: CsiDriverArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CheckOutput {
    /// One line per check and a verdict.
    Text,
    /// One JSON object (docs/operations.md describes its shape).
    Json,
}

/// A pod or service account name: a DNS subdomain (lowercase letters, digits, '-' and '.').
fn parse_name(text: &str) -> Result<String, String> {
    let ok = !text.is_empty() && text.len() <= 253 && text.split('.').all(is_dns_label);
    if ok {
        Ok(text.to_string())
    } else {
        Err(format!("{text:?} is not a valid name (lowercase letters, digits, '-' and '.')"))
    }
}

#[derive(Debug, Args)]
pub struct WebhookArgs {
    /// Address to serve the webhook on (TLS).
    #[arg(long, env = "DRAFS_WEBHOOK_ADDR", default_value = "0.0.0.0:8443", value_name = "ADDR")]
    pub addr: std::net::SocketAddr,
    /// PEM certificate chain for the webhook's Service name; reloaded when the file changes.
    #[arg(long, env = "DRAFS_TLS_CERT", value_name = "FILE", default_value = "/etc/drafs/tls/tls.crt")]
    pub tls_cert: PathBuf,
    /// PEM private key of the certificate; reloaded when the file changes.
    #[arg(long, env = "DRAFS_TLS_KEY", value_name = "FILE", default_value = "/etc/drafs/tls/tls.key")]
    pub tls_key: PathBuf,
    /// The drafs image the injected container runs (the image your nodes pull, e.g. registry.example/drafs:0.1.0).
    #[arg(long, env = "DRAFS_IMAGE", value_name = "IMAGE", value_parser = parse_image)]
    pub image: String,
    /// Serve /metrics, /healthz and /readyz over plain HTTP on this address; off by default.
    #[arg(long, env = "DRAFS_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// After SIGTERM, go on answering for this long (/readyz answers 503), then close the port
    /// (keep it under the pod's terminationGracePeriodSeconds minus 10 s).
    #[arg(long, env = "DRAFS_WEBHOOK_DRAIN", value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub drain: std::time::Duration,
    /// A name the serving certificate must be valid for, e.g. the Service's
    /// drafs-webhook.drafs-system.svc (repeatable); a certificate that is not is refused.
    #[arg(long = "dns-name", env = "DRAFS_WEBHOOK_DNS_NAMES", value_name = "NAME", value_delimiter = ',')]
    pub dns_names: Vec<String>,
    /// The mode for a pod without the drafs.dev/inject label in a namespace labelled drafs.dev/inject=enabled
    /// (the API server sends those to /mutate/namespace).
    #[arg(long, env = "DRAFS_NAMESPACE_MODE", value_enum, default_value_t = ModeArg::Init, value_name = "MODE")]
    pub namespace_mode: ModeArg,
    #[command(flatten)]
    pub csi: CsiDriverArgs,
    /// The injected container's requests and limits (a pod's drafs.dev/resources annotation goes over them).
    #[command(flatten)]
    pub resources: ResourcesArgs,
    /// The platform assigns the injected container's uid (OpenShift's restricted-v2): no runAsUser or runAsGroup.
    #[arg(long, env = "DRAFS_PLATFORM_UID")]
    pub platform_uid: bool,
}

#[derive(Debug, Args)]
pub struct InjectArgs {
    /// Manifests to read: files, directories (their .yaml, .yml and .json files) or - for standard input.
    /// Standard input when none is given.
    #[arg(value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Also a manifest to read, as with kubectl and linkerd (repeatable).
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-")]
    pub filenames: Vec<PathBuf>,
    /// How drafs runs in the pod.
    #[arg(long, value_enum, default_value_t = ModeArg::Init)]
    pub mode: ModeArg,
    /// The drafs image to use (push the image to a registry your nodes pull from and name it here).
    #[arg(long, default_value = concat!("drafs:", env!("CARGO_PKG_VERSION")), value_parser = parse_image)]
    pub image: String,
    /// Where the tree is mounted in the containers.
    #[arg(long, default_value = "/dra", value_parser = parse_container_path)]
    pub dir: String,
    /// Also write the standard KEP-5304 view here, mounted read-only in every container that uses a claim
    /// (e.g. /var/run/kubernetes.io/dra-device-attributes).
    #[arg(long, value_name = "DIR", value_parser = parse_container_path)]
    pub metadata_dir: Option<String>,
    /// Passed to drafs: a driver that writes its own standard metadata files, left to it (repeatable).
    #[arg(long = "metadata-from-driver", value_name = "DRIVER", requires = "metadata_dir", value_parser = parse_driver_name)]
    pub metadata_from_drivers: Vec<String>,
    /// Passed to drafs: not ready until this path exists, CLAIM/REQUEST/INDEX/ATTRIBUTE (repeatable).
    #[arg(long = "require", value_name = "PATH")]
    pub require: Vec<RequirePath>,
    /// Passed to drafs: how long to wait for everything asked for (its default: 5m).
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Sidecar modes: the sidecar's readinessProbe also fails while the kubelet reports a device
    /// Unhealthy, so the pod leaves its Services' endpoints until the device is healthy again.
    #[arg(long)]
    pub ready_when_healthy: bool,
    #[command(flatten)]
    pub csi: CsiDriverArgs,
    #[command(flatten)]
    pub resources: ResourcesArgs,
    /// The platform assigns the drafs container's uid (OpenShift's restricted-v2): no runAsUser or runAsGroup.
    #[arg(long)]
    pub platform_uid: bool,
}

/// An image reference: not empty, no spaces or control characters.
fn parse_image(text: &str) -> Result<String, String> {
    if text.is_empty() || text.len() > 1024 || !text.chars().all(|c| c.is_ascii_graphic()) {
        return Err(format!("{text:?} is not an image reference (e.g. registry.example/drafs:0.1.0)"));
    }
    Ok(text.to_string())
}

/// A container path for drafs's files.
fn parse_container_path(text: &str) -> Result<String, String> {
    crate::admission::inject::check_container_path(text).map(|()| text.to_string()).map_err(|p| format!("{text:?} {p}"))
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// NAME=CLAIM/REQUEST/INDEX/ATTRIBUTE, or NAME=CLAIM/REQUEST/ATTRIBUTE for all devices joined with ','.
    #[arg(long = "env", env = "DRAFS_ENV", value_delimiter = ',', required = true, value_name = "NAME=PATH")]
    pub env: Vec<EnvSpec>,
    /// Read values from a tree written by `init` or served by `serve`, instead of asking the API
    /// (nothing is resolved then: --claim, --timeout and --from-file do not apply).
    #[arg(long, env = "DRAFS_FROM_DIR", value_name = "DIR", conflicts_with_all = ["claims", "timeout", "from_file"])]
    pub from_dir: Option<PathBuf>,
    /// Leave a variable unset when its value is missing, instead of failing.
    #[arg(long, env = "DRAFS_OPTIONAL")]
    pub optional: bool,
    #[command(flatten)]
    pub select: SelectArgs,
    #[command(flatten)]
    pub source: SourceArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum ManifestsCommand {
    /// The least-privilege RBAC for drafs in one namespace (installing it for several never collides),
    /// or one RoleBinding of the shared role the chart installs (--cluster-role).
    Rbac(RbacArgs),
}

#[derive(Debug, Args)]
pub struct RbacArgs {
    /// The namespace of the pods that run drafs.
    #[arg(long, short = 'n', value_parser = parse_namespace, required_unless_present = "shared_roles")]
    pub namespace: Option<String>,
    /// The service account the pods run drafs as.
    #[arg(long, default_value = manifests::DEFAULT_ACCOUNT, value_parser = parse_namespace)]
    pub service_account: String,
    /// Also let drafs record Events on its pod (create events), for `kubectl describe pod`.
    #[arg(long, conflicts_with = "cluster_role")]
    pub events: bool,
    /// Only a RoleBinding of this shared ClusterRole (the chart's `tenants.roles`, or --shared-roles;
    /// it includes create events), and no cluster-scoped object for the namespace.
    #[arg(long, value_name = "NAME", num_args = 0..=1, default_missing_value = manifests::TENANT_CLUSTER_ROLE)]
    pub cluster_role: Option<String>,
    /// The cluster-scoped objects every namespace shares, as the chart makes them: the ClusterRoles
    /// drafs-tenant and drafs-resourceslices, and a binding of the latter to every service account
    /// (or to those of --slices-for).
    #[arg(long, conflicts_with_all = ["namespace", "service_account", "events", "cluster_role"])]
    pub shared_roles: bool,
    /// With --shared-roles: only these namespaces' service accounts read ResourceSlices.
    #[arg(long, value_name = "NS", value_delimiter = ',', value_parser = parse_namespace, conflicts_with = "namespace")]
    pub slices_for: Vec<String>,
}

/// A DNS label, as namespace and service account names are.
fn parse_namespace(text: &str) -> Result<String, String> {
    if is_dns_label(text) {
        Ok(text.to_string())
    } else {
        Err(format!("{text:?} is not a valid name (a DNS label: lowercase letters, digits and '-', at most 63)"))
    }
}

#[derive(Debug, Args)]
pub struct CopySelfArgs {
    /// Directory to copy the binary into (as `drafs`).
    #[arg(long, env = "DRAFS_COPY_TO", value_name = "DIR")]
    pub to: PathBuf,
}

/// Where and how the tree is published.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Directory for the tree (an emptyDir shared with the app).
    #[arg(long, env = "DRAFS_DIR", default_value = "/dra")]
    pub dir: PathBuf,
    /// Also write the standard KEP-5304 metadata files here (mount it at /var/run/kubernetes.io/dra-device-attributes).
    #[arg(long, env = "DRAFS_METADATA_DIR", value_name = "DIR")]
    pub metadata_dir: Option<PathBuf>,
    /// A driver that writes its own standard metadata files (KEP-5304 opt-in): drafs leaves its files to it and
    /// only makes their mount points (repeatable; env: comma-separated).
    #[arg(long = "metadata-from-driver", env = "DRAFS_METADATA_FROM_DRIVERS", value_delimiter = ',',
          value_name = "DRIVER", requires = "metadata_dir", value_parser = parse_driver_name)]
    pub metadata_from_drivers: Vec<String>,
    /// Not ready until this path exists: CLAIM/REQUEST/INDEX/ATTRIBUTE (repeatable; env: comma-separated).
    #[arg(long = "require", env = "DRAFS_REQUIRE", value_delimiter = ',', value_name = "PATH")]
    pub require: Vec<RequirePath>,
    /// Where to write the failure message so that `kubectl describe pod` shows it.
    #[arg(long, env = "DRAFS_TERMINATION_LOG", default_value = "/dev/termination-log", value_name = "FILE")]
    pub termination_log: PathBuf,
    /// Serve /metrics, /healthz and /readyz on this address (e.g. 0.0.0.0:9090); off by default.
    #[arg(long, env = "DRAFS_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Which Kubernetes Events to record on the pod: warnings (not ready by the deadline, values lost),
    /// all (also a Normal event once ready, one more request), or none. Needs the optional events Role.
    #[arg(long, env = "DRAFS_EVENTS", value_enum, default_value_t = EventsArg::Warnings, value_name = "WHICH")]
    pub events: EventsArg,
    /// serve: how long the tree keeps the devices of a pool whose ResourceSlices are all gone (a
    /// kubelet starting deletes its node's slices until each driver publishes them again); 0s: at once.
    #[arg(long, env = "DRAFS_POOL_GRACE", default_value = "90s", value_name = "DURATION", value_parser = parse_duration)]
    pub pool_grace: std::time::Duration,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// How the tree is served: a live FUSE mount, or files rewritten atomically (no privileges).
    #[arg(long, env = "DRAFS_BACKEND", value_enum, default_value_t = Backend::Fuse)]
    pub backend: Backend,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub select: SelectArgs,
    #[command(flatten)]
    pub source: SourceArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    Fuse,
    Files,
}

#[derive(Debug, Args)]
pub struct DirArgs {
    /// The tree's directory.
    #[arg(long, env = "DRAFS_DIR", default_value = "/dra")]
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// Also fail while the kubelet reports a device Unhealthy (a readinessProbe
    /// that takes the pod out of Service endpoints while its GPU is broken).
    #[arg(long, env = "DRAFS_PROBE_HEALTHY")]
    pub healthy: bool,
}

/// What to resolve.
#[derive(Debug, Args)]
pub struct SelectArgs {
    /// Only these pod claims, or extended resources by name (DOMAIN/NAME), (repeatable; env: comma-separated).
    #[arg(long = "claim", env = "DRAFS_CLAIMS", value_delimiter = ',', value_name = "NAME")]
    pub claims: Vec<String>,
    /// How long to wait for the API and for everything asked for, e.g. 90s, 5m, 1h (0: no limit).
    #[arg(long, env = "DRAFS_TIMEOUT", value_parser = parse_duration, default_value = "5m")]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub select: SelectArgs,
    #[command(flatten)]
    pub source: SourceArgs,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(flatten)]
    pub select: SelectArgs,
    #[command(flatten)]
    pub source: SourceArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// One row per attribute, capacity, consumed capacity and status value.
    Table,
    /// The whole resolution (the tree's `.json`).
    Json,
    /// Every file of the tree with its content, as `init` would write it.
    Tree,
}

/// `--mode`, `--namespace-mode`: how drafs runs in a pod (the flag's
/// spelling of [`Mode`], so that clap stays in `cmd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// `drafs init` as an init container: values written once, no privileges.
    Init,
    /// `drafs serve` as a native sidecar with the FUSE backend: live values, privileged.
    SidecarFuse,
    /// `drafs serve` as a native sidecar with the files backend: live values, no privileges.
    SidecarFiles,
    /// No container: a CSI volume served by `drafs node` on the pod's node; live values, no privileges.
    Csi,
}

impl From<ModeArg> for Mode {
    fn from(arg: ModeArg) -> Mode {
        match arg {
            ModeArg::Init => Mode::Init,
            ModeArg::SidecarFuse => Mode::SidecarFuse,
            ModeArg::SidecarFiles => Mode::SidecarFiles,
            ModeArg::Csi => Mode::Csi,
        }
    }
}

/// `--events`: which Events drafs records (the flag's spelling of [`EventsMode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EventsArg {
    #[value(alias = "true")]
    All,
    Warnings,
    #[value(alias = "false")]
    None,
}

impl From<EventsArg> for EventsMode {
    fn from(arg: EventsArg) -> EventsMode {
        match arg {
            EventsArg::All => EventsMode::All,
            EventsArg::Warnings => EventsMode::Warnings,
            EventsArg::None => EventsMode::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flag spells a mode as the `drafs.dev/inject` label does.
    #[test]
    fn mode_flags_spell_the_label_values() {
        for arg in ModeArg::value_variants() {
            let name = arg.to_possible_value().unwrap();
            assert_eq!(name.get_name(), Mode::from(*arg).label());
        }
        assert_eq!(EventsMode::from(EventsArg::from_str("true", false).unwrap()), EventsMode::All);
        assert_eq!(EventsMode::from(EventsArg::from_str("false", false).unwrap()), EventsMode::None);
    }

    #[test]
    fn a_namespaced_name_is_two_names() {
        assert_eq!(parse_namespaced("drafs-system/drafs-node"), Ok(("drafs-system".into(), "drafs-node".into())));
        for bad in ["drafs-node", "/drafs-node", "ns/", "a/b/c", "Ns/x", "ns/X y"] {
            assert!(parse_namespaced(bad).unwrap_err().contains("NAMESPACE/NAME"), "{bad}");
        }
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "drafs",
            "init",
            "--dir",
            "/x",
            "--claim",
            "gpu",
            "--require",
            "gpu/gpu/0/uuid",
            "--timeout",
            "10s",
        ])
        .unwrap();
        let Command::Init(args) = cli.command else { panic!("not init") };
        assert_eq!(args.output.dir, PathBuf::from("/x"));
        assert_eq!(args.select.claims, vec!["gpu"]);
        assert_eq!(args.select.timeout, Duration::from_secs(10));
        assert!(Cli::try_parse_from(["drafs", "init", "--require", "../x"]).is_err());
        // Flags are declared only where they mean something.
        assert!(Cli::try_parse_from(["drafs", "probe", "--from-file", "x.yaml"]).is_err());
        assert!(Cli::try_parse_from(["drafs", "inject", "--pod-name", "p"]).is_err());
        assert!(Cli::try_parse_from(["drafs", "unmount", "--pod-namespace", "ns"]).is_err());
        assert!(Cli::try_parse_from(["drafs", "copy-self", "--to", "/x", "--from-file", "f"]).is_err());
        assert!(Cli::try_parse_from(["drafs", "get", "--from-file", "f", "--pod-name", "p"]).is_ok());
        assert!(Cli::try_parse_from(["drafs", "probe", "--log-format", "json"]).is_ok());
    }

    /// The commands that name or recognize mode csi's volume take the driver's name, checked as `node` checks its own.
    #[test]
    fn csi_driver_flags_parse_like_the_nodes_driver_name() {
        let driver = |args: &[&str]| match Cli::try_parse_from(args).map(|c| c.command) {
            Ok(Command::Inject(a)) => Ok(a.csi.csi_driver),
            Ok(Command::Webhook(a)) => Ok(a.csi.csi_driver),
            Ok(Command::Check(a)) => Ok(a.csi.csi_driver),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(driver(&["drafs", "inject"]), Ok("drafs.dev".into()));
        assert_eq!(driver(&["drafs", "inject", "--csi-driver", "node.drafs.example"]), Ok("node.drafs.example".into()));
        assert_eq!(
            driver(&["drafs", "webhook", "--image", "i", "--csi-driver=node.drafs.example", "--namespace-mode", "csi"]),
            Ok("node.drafs.example".into())
        );
        assert_eq!(driver(&["drafs", "check", "--csi-driver", "node.drafs.example"]), Ok("node.drafs.example".into()));
        for bad in ["Drafs.dev", "drafs_dev", "-drafs.dev"] {
            for command in ["inject", "check"] {
                let err = driver(&["drafs", command, &format!("--csi-driver={bad}")]).unwrap_err();
                assert!(err.contains("is not a CSI driver name"), "{command} {bad}: {err}");
            }
        }
    }
}
