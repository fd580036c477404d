//! `drafs node`: the per-node agent. Registers with the kubelet as a CSI
//! driver and serves each pod's `csi:` volume until stopped; a stop leaves the
//! published trees mounted and readable (the agent restarted or upgraded
//! takes them over at their next publish).

use std::path::PathBuf;
use std::sync::Arc;

use tracing::info;

use crate::cmd::cli::NodeArgs;
use crate::cmd::{Failure, Stop};
use crate::engine::shared::SharedSlices;
use crate::node::csi::Service;
use crate::node::grpc;
use crate::node::mounts::SystemMounts;
use crate::node::volumes::{Timing, Volumes};

#[derive(Debug)]
pub struct Config {
    pub node_name: String,
    pub kubelet_dir: PathBuf,
    pub driver: String,
    pub endpoint: PathBuf,
    /// The registration socket the kubelet finds.
    pub registration: PathBuf,
    pub refresh: std::time::Duration,
    pub watch_for: std::time::Duration,
}

impl Config {
    pub fn from_args(args: &NodeArgs) -> Result<Self, Failure> {
        if !args.kubelet_dir.is_absolute() {
            return Err(Failure::Usage(format!("--kubelet-dir {} must be absolute", args.kubelet_dir.display())));
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
            registration: registration_dir.join(format!("{}-reg.sock", args.driver_name)),
            refresh: args.refresh,
            watch_for: args.watch_for,
        })
    }
}

fn failed(what: String) -> impl FnOnce(std::io::Error) -> Failure {
    move |e| Failure::Failed(format!("{what}: {e}"))
}

pub async fn run(c: Config, stop: Stop) -> Result<(), Failure> {
    let cluster = kube::Config::infer()
        .await
        .map_err(|e| Failure::Usage(format!("cannot find the API server (in-cluster or kubeconfig): {e}")))?;
    // The agent's own account reads the node's slices, once for every volume.
    let own = kube::Client::try_from(cluster.clone())
        .map_err(|e| Failure::Failed(format!("cannot make an API client: {e}")))?;
    let slices = SharedSlices::new(own);
    let volumes = Volumes::new(
        c.kubelet_dir.clone(),
        cluster,
        slices,
        Timing { refresh: c.refresh, watch_for: c.watch_for },
        SystemMounts,
    );
    let service = Arc::new(Service {
        driver: c.driver.clone(),
        node_name: c.node_name.clone(),
        endpoint: c.endpoint.clone(),
        volumes: volumes.clone(),
    });
    for socket in [&c.endpoint, &c.registration] {
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).map_err(failed(format!("cannot create {}", dir.display())))?;
        }
    }
    let endpoint = grpc::listen(&c.endpoint).map_err(failed(format!("cannot listen on {}", c.endpoint.display())))?;
    // The registration socket last: the kubelet calls the endpoint as soon as it finds it.
    let registration =
        grpc::listen(&c.registration).map_err(failed(format!("cannot listen on {}", c.registration.display())))?;
    info!(driver = %c.driver, node = %c.node_name, endpoint = %c.endpoint.display(), "serving CSI volumes");
    let signal = tokio::select! {
        () = grpc::serve(endpoint, service.clone()) => unreachable!("serves until dropped"),
        () = grpc::serve(registration, service.clone()) => unreachable!("serves until dropped"),
        signal = stop.signalled() => signal,
    };
    info!("{signal}: stopping; the published trees stay mounted");
    // Unregister first: the kubelet stops calling a plugin whose socket is gone.
    let _ = std::fs::remove_file(&c.registration);
    volumes.stop_all().await;
    let _ = std::fs::remove_file(&c.endpoint);
    Ok(())
}
