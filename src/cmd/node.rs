//! `drafs node`: the per-node agent. Registers with the kubelet as a CSI
//! driver and serves each pod's `csi:` volume until stopped; a stop leaves the
//! published trees mounted and readable (the agent restarted or upgraded
//! takes them over at their next publish).

use std::path::PathBuf;
use std::sync::Arc;

use tracing::info;

use crate::cmd::cli::NodeArgs;
use crate::cmd::{Failure, Stop};
use crate::engine::collection::FollowHealth;
use crate::engine::shared::SharedSlices;
use crate::node::agent::{self, Health, OwnSocket};
use crate::node::credential::pooled_client;
use crate::node::csi::Service;
use crate::node::metrics::NodeMetrics;
use crate::node::mounts::SystemMounts;
use crate::node::node_pods;
use crate::node::nri::{
    self, door::NriDoor, door::NriSettings, metrics::NriMetrics, plugin::PluginSettings, uninstall::Owner,
};
use crate::node::places::{PENDING_HOLD, PlaceLimits};
use crate::node::request::TokenIn;
use crate::node::served::{Limits, Served, Timing};
use crate::publish::files::Room;
use crate::publish::metrics::{self, Paths};

#[derive(Debug)]
pub struct Config {
    pub node_name: String,
    pub kubelet_dir: PathBuf,
    pub driver: String,
    pub endpoint: PathBuf,
    pub token_in: TokenIn,
    /// The registration socket the kubelet finds.
    pub registration: PathBuf,
    pub timing: Timing,
    /// Follow the node's pods for device-status changes (`--watch-node-pods`).
    pub watch_node_pods: bool,
    pub limits: Limits,
    pub metrics_addr: Option<std::net::SocketAddr>,
    pub health_addr: Option<std::net::SocketAddr>,
    /// Serve through NRI too (`--nri`).
    pub nri: Option<(NriSettings, PluginSettings)>,
    /// The agent's own DaemonSet (`--daemonset`): uninstalled at a stop, the NRI trees go.
    pub daemonset: Option<(String, String)>,
}

impl Config {
    pub fn from_args(args: &NodeArgs) -> Result<Self, Failure> {
        for (flag, dir) in [("--kubelet-dir", &args.kubelet_dir), ("--nri-dir", &args.nri_dir)] {
            if !dir.is_absolute() {
                return Err(Failure::Usage(format!("{flag} {} must be absolute", dir.display())));
            }
        }
        let endpoint = args
            .endpoint
            .clone()
            .unwrap_or_else(|| args.kubelet_dir.join("plugins").join(&args.driver_name).join("csi.sock"));
        let registration_dir =
            args.registration_dir.clone().unwrap_or_else(|| args.kubelet_dir.join("plugins_registry"));
        Ok(Config {
            node_name: args.node_name.clone(),
            kubelet_dir: args.kubelet_dir.clone(),
            driver: args.driver_name.clone(),
            endpoint,
            token_in: args.token_in,
            registration: registration_dir.join(format!("{}-reg.sock", args.driver_name)),
            timing: Timing { refresh: args.refresh, watch_for: args.watch_for, pending_hold: PENDING_HOLD },
            watch_node_pods: args.watch_node_pods,
            limits: Limits {
                places: PlaceLimits {
                    max_pods: args.max_pods as usize,
                    per_namespace: args
                        .max_pods_per_namespace
                        .map_or_else(|| PlaceLimits::default_share(args.max_pods as usize), |n| n as usize),
                },
                volume: Room { bytes: args.volume_size, inodes: args.volume_inodes },
            },
            metrics_addr: args.metrics_addr,
            health_addr: args.health_addr,
            nri: args.nri.then(|| {
                let door = NriSettings {
                    dir: args.nri_dir.clone(),
                    csi_driver: args.driver_name.clone(),
                    wait: args.nri_wait,
                };
                let plugin = PluginSettings {
                    socket: args.nri_socket.clone(),
                    name: "drafs".into(),
                    index: args.nri_plugin_index.clone(),
                };
                (door, plugin)
            }),
            daemonset: args.daemonset.clone(),
        })
    }
}

fn failed(what: String) -> impl FnOnce(std::io::Error) -> Failure {
    move |e| Failure::Failed(format!("{what}: {e}"))
}

pub async fn run(c: Config, stop: Stop) -> Result<(), Failure> {
    let mut cluster = kube::Config::infer()
        .await
        .map_err(|e| Failure::Usage(format!("cannot find the API server (in-cluster or kubeconfig): {e}")))?;
    // The agent's own account reads the node's slices, once for every volume.
    let own = pooled_client(&cluster).map_err(|e| Failure::Failed(format!("cannot make an API client: {e}")))?;
    let slices = SharedSlices::new(own.clone());
    // Every pod's reads go through one client without credentials: each carries its pod's token.
    cluster.auth_info = kube::config::AuthInfo::default();
    let shared = pooled_client(&cluster).map_err(|e| Failure::Failed(format!("cannot make an API client: {e}")))?;
    let node_metrics = Arc::new(NodeMetrics::default());
    let timing = c.timing;
    let volumes = Served::new(
        c.kubelet_dir.clone(),
        shared,
        slices.clone(),
        timing,
        c.limits,
        SystemMounts,
        node_metrics.clone(),
    );
    let nri = match &c.nri {
        Some(nri) => Some(serve_nri(&c, nri, &volumes, &own).await?),
        None => None,
    };
    let node_pods = (c.watch_node_pods || nri.is_some()).then(|| {
        let health = Arc::new(FollowHealth::default());
        let follow = match &nri {
            Some(nri) => {
                tokio::spawn(node_pods::follow(own.clone(), c.node_name.clone(), health.clone(), nri.door.clone()))
            }
            None => tokio::spawn(node_pods::follow(own.clone(), c.node_name.clone(), health.clone(), volumes.clone())),
        };
        drop(follow);
        (c.node_name.clone(), health)
    });
    let bind = |path: &PathBuf| OwnSocket::bind(path).map_err(failed(format!("cannot listen on {}", path.display())));
    let (endpoint, endpoint_listener) = bind(&c.endpoint)?;
    // The registration socket last: the kubelet calls the endpoint as soon as it finds it.
    let (registration, registration_listener) = bind(&c.registration)?;
    let (endpoint, registration) = (Arc::new(endpoint), Arc::new(registration));
    let health = Arc::new(Health {
        metrics: node_metrics.clone(),
        volumes: volumes.clone(),
        slices,
        node_pods,
        nri: nri.as_ref().map(|nri| nri.metrics.clone()),
        sockets: [endpoint.clone(), registration.clone()],
        limits: c.limits,
    });
    let service = Arc::new(Service {
        driver: c.driver.clone(),
        node_name: c.node_name.clone(),
        endpoint: c.endpoint.clone(),
        token_in: c.token_in,
        volumes: volumes.clone(),
        metrics: node_metrics,
        readiness: Some(health.clone()),
    });
    for (addr, paths, what) in [(c.metrics_addr, Paths::All, "metrics"), (c.health_addr, Paths::Probes, "the probes")] {
        if let Some(addr) = addr {
            let listener = metrics::bind(addr).await.map_err(failed(format!("cannot serve {what} on {addr}")))?;
            tokio::spawn(metrics::serve_paths(listener, health.clone(), paths));
        }
    }
    info!(driver = %c.driver, node = %c.node_name, endpoint = %c.endpoint.display(), max_pods = c.limits.places.max_pods, per_namespace = c.limits.places.per_namespace, watch_node_pods = c.watch_node_pods, "serving CSI volumes");
    let (signalled, signal) = tokio::sync::oneshot::channel();
    let sockets = agent::serve_sockets(
        service,
        (endpoint.clone(), endpoint_listener),
        (registration.clone(), registration_listener),
        async move {
            let _ = signalled.send(stop.signalled().await);
        },
    );
    sockets.await;
    let signal = signal.await.map_or_else(|_| "stopped".to_string(), |s| s.to_string());
    info!("{signal}: stopping; the published trees stay mounted");
    // Unregister first: the kubelet stops calling a plugin whose socket is gone.
    registration.remove_if_ours();
    if let Some(Nri { door, owner: Some(owner), .. }) = &nri
        && owner.stopping_for_good().await
    {
        info!("the agent's DaemonSet is uninstalled: removing the trees served through NRI");
        door.remove_all().await;
    }
    volumes.stop_all().await;
    endpoint.remove_if_ours();
    Ok(())
}

/// What serves through NRI: the door, its metrics, the agent's DaemonSet.
struct Nri {
    door: Arc<NriDoor<SystemMounts>>,
    metrics: Arc<NriMetrics>,
    owner: Option<Owner>,
}

/// Through NRI: the door, the plugin, the opted-in namespaces, the node's
/// served pods read again every `--refresh` (the node's pods are then
/// watched whatever `--watch-node-pods` says).
async fn serve_nri(
    c: &Config,
    (settings, plugin): &(NriSettings, PluginSettings),
    volumes: &Arc<Served<SystemMounts>>,
    own: &kube::Client,
) -> Result<Nri, Failure> {
    std::fs::create_dir_all(&settings.dir).map_err(failed(format!("cannot make {}", settings.dir.display())))?;
    let metrics = Arc::new(NriMetrics::default());
    let door = NriDoor::new(volumes.clone(), own.clone(), settings.clone(), metrics.clone());
    tokio::spawn(nri::plugin::serve(door.clone(), plugin.clone()));
    let (listed, changed) = (door.clone(), door.clone());
    tokio::spawn(node_pods::follow_namespaces(
        own.clone(),
        format!("{}=enabled", nri::policy::NRI_LABEL),
        Arc::new(FollowHealth::default()),
        move |names| listed.namespaces_listed(names),
        move |name, enabled| changed.namespace_changed(name, enabled),
    ));
    tokio::spawn(door.clone().refresh_every(c.timing.refresh));
    info!(socket = %plugin.socket.display(), dir = %settings.dir.display(), "serving through NRI too, once the runtime's socket is there");
    let owner = match &c.daemonset {
        Some((namespace, name)) => Some(Owner::start(own.clone(), namespace, name).await),
        None => None,
    };
    Ok(Nri { door, metrics, owner })
}
