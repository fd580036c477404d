//! `drafs serve`: serve the tree and keep it current (a native sidecar),
//! through FUSE or atomically written files, until stopped.

use std::time::Duration;

use tracing::info;

use crate::cmd::cli::{Backend, ServeArgs};
use crate::cmd::config::{self, Output, Select, Source};
use crate::cmd::{Failure, Stop, logged, run_failure};
use crate::engine::reconcile::Mode;
use crate::engine::run::{Run, TreeBackend};
use crate::publish::fuse::is_mounted_id;

#[derive(Debug)]
pub struct Config {
    pub source: Source,
    pub select: Select,
    pub output: Output,
}

impl Config {
    pub fn from_args(args: &ServeArgs) -> Result<Self, Failure> {
        let backend = match args.backend {
            Backend::Fuse => TreeBackend::Fuse,
            Backend::Files => TreeBackend::Files,
        };
        let output = Output::from_args(&args.output, backend)?;
        Ok(Config { source: config::source(&args.source)?, select: Select::from_args(&args.select), output })
    }
}

/// Serve until stopped: a stop is the normal end (exit 0). A write under way
/// is finished first and the run dropped, which unmounts a FUSE tree. Fails
/// only if not ready by the deadline (or at start-up), or when the mount is
/// taken away.
pub async fn run(c: Config, stop: Stop) -> Result<(), Failure> {
    logged(&c.output.termination_log, serve(&c, stop).await)
}

async fn serve(c: &Config, stop: Stop) -> Result<(), Failure> {
    let (select, publishing) = (&c.select, &c.output.publishing);
    let stopped = stop.signalled();
    tokio::pin!(stopped);
    let started = Run::publishing(&c.source, Mode::Follow, select.selection.clone(), select.timeout, publishing);
    let mut run = tokio::select! {
        run = started => run.map_err(|e| run_failure(e, select.timeout))?,
        signal = &mut stopped => {
            info!("{signal}: stopping");
            return Ok(());
        }
    };
    // Serve has no end but a signal: the drive only returns with an error,
    // and the mount only goes away if someone removes it.
    let mount_id = run.mount_id();
    let failure = tokio::select! {
        result = run.drive() => match result {
            Ok(_) => return Ok(()),
            Err(e) => run_failure(e.into(), select.timeout),
        },
        () = mount_lost(mount_id) => mount_removed(&publishing.dir),
        signal = &mut stopped => {
            info!("{signal}: stopping");
            run.stop().await;
            return Ok(());
        }
    };
    run.fail(failure.to_string()).await;
    Err(failure)
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
