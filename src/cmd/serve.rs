//! `drafs serve`: serve the tree and keep it current (a native sidecar),
//! through FUSE or atomically written files, until stopped.

use std::time::Duration;

use tracing::{info, warn};

use crate::cmd::cli::{Backend, ServeArgs};
use crate::cmd::config::{Output, Select, Source};
use crate::cmd::{Failure, Publishing, Stop, file_tree, logged, open_dir, publisher, run_failure};
use crate::engine::reconcile::Mode;
use crate::publish::fuse::{FuseMount, is_mounted_id};
use crate::publish::outputs::TreeOutput;

#[derive(Debug)]
pub struct Config {
    pub backend: Backend,
    pub source: Source,
    pub select: Select,
    pub output: Output,
}

impl Config {
    pub fn from_args(args: &ServeArgs) -> Result<Self, Failure> {
        let output = Output::from_args(&args.output)?;
        let (source, select) = (Source::from_args(&args.source)?, Select::from_args(&args.select));
        Ok(Config { backend: args.backend, source, select, output })
    }
}

/// Serve until stopped: a stop is the normal end (exit 0), and dropping the
/// run unmounts a FUSE tree. Fails only if not ready by the deadline (or at
/// start-up), or when the mount is taken away.
pub async fn run(c: Config, stop: Stop) -> Result<(), Failure> {
    tokio::select! {
        result = serve(&c) => logged(&c.output.termination_log, result),
        signal = stop.signalled() => {
            info!("{signal}: stopping");
            Ok(())
        }
    }
}

async fn serve(c: &Config) -> Result<(), Failure> {
    let out = &c.output;
    let metrics = crate::cmd::start_metrics(out.metrics_addr).await?;
    let tree_output = match c.backend {
        Backend::Fuse => TreeOutput::Fuse(
            FuseMount::mount(&out.dir, Some(metrics.clone())).map_err(|e| Failure::Failed(e.to_string()))?,
        ),
        Backend::Files => TreeOutput::Files(open_dir(&out.dir)?),
    };
    let mount_id = match &tree_output {
        TreeOutput::Fuse(m) => m.mount_id(),
        TreeOutput::Files(_) => None,
    };
    let mut publisher = publisher(tree_output, out)?;
    let (pod_name, namespace) = match &c.source {
        Source::File { path, pod_name } => {
            let (res, built) = file_tree(path, pod_name.as_deref(), &c.select, &out.require)?;
            publisher.publish(&res, &built).map_err(|e| Failure::Failed(e.to_string()))?;
            metrics.tree_published(built.is_ready(), built.tree.len(), &built.missing);
            metrics.device_health(&res);
            if !built.is_ready() {
                warn!("not ready: {}", built.missing.join("; "));
            }
            info!(dir = %out.dir.display(), files = built.tree.len(), ready = built.is_ready(), "serving a file's resolution until stopped");
            mount_lost(mount_id).await;
            return Err(mount_removed(&out.dir));
        }
        Source::Api { pod_name, namespace } => (pod_name, namespace),
    };
    let mut run =
        Publishing::connect(pod_name, namespace, Mode::Follow, Some(c.backend), &c.select, out, publisher, metrics)
            .await?;
    // Serve has no end but a signal: drive only returns with an error, and the
    // mount only goes away if someone removes it.
    let failure = tokio::select! {
        result = run.drive(false) => match result {
            Ok(_) => return Ok(()),
            Err(e) => run_failure(e, c.select.timeout),
        },
        () = mount_lost(mount_id) => mount_removed(&out.dir),
    };
    Err(run.fail(failure).await)
}

fn mount_removed(dir: &std::path::Path) -> Failure {
    Failure::Failed(format!(
        "the FUSE mount at {} was removed (drafs unmount, or by hand); exiting so that the kubelet restarts the sidecar",
        dir.display()
    ))
}

/// Resolves when the FUSE mount `id` is no longer mounted (never for the files backend).
async fn mount_lost(id: Option<u64>) {
    let Some(id) = id else { return std::future::pending().await };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        if !is_mounted_id(id) {
            return;
        }
    }
}
