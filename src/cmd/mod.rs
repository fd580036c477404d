//! The commands, one file each: turn the flags into a checked config (before
//! any I/O), wire the pieces, and map the outcome to an exit code.
//!
//! Every command gets the same [`Stop`], listening for SIGTERM, SIGINT, SIGHUP
//! and SIGQUIT, which `main` holds back from its first instruction until the
//! handlers are in place, and decides what a stop means for it: the webhook
//! drains, `serve` unmounts and exits 0, the others fail.
//!
//! May use: every layer below (`engine`, `admission`, `publish`, `model`).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::engine::EngineError;
use crate::engine::drive::DriveError;
use crate::engine::run::{Run, RunError, TreeBackend};
use crate::model::resolve::Resolution;
use crate::model::tree::BuiltTree;

pub mod check;
pub mod cli;
pub mod config;
pub mod copy_self;
pub mod exec;
pub mod get;
pub mod init;
pub mod inject;
pub mod manifests;
pub mod node;
pub mod probe;
pub mod serve;
pub mod unmount;
pub mod webhook;

use cli::{Command, ManifestsCommand};
use config::{Select, Source};

/// How a command failed; the exit code follows from it.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Bad flags or environment: exit 2.
    #[error("{0}")]
    Usage(String),
    /// Anything else: exit 1, and for `init` the message goes to the termination log.
    #[error("{0}")]
    Failed(String),
    /// A run's failure, kept typed: its exit code follows from its type
    /// ([`RunError::is_usage`]); `timeout` words a run that timed out.
    #[error("{}", run_message(error, *timeout))]
    Run { error: Box<RunError>, timeout: Duration },
}

impl Failure {
    pub fn exit_code(&self) -> i32 {
        match self {
            Failure::Usage(_) => 2,
            Failure::Run { error, .. } if error.is_usage() => 2,
            Failure::Failed(_) | Failure::Run { .. } => 1,
        }
    }
}

/// A command with its flags checked: what [`run`] runs.
#[derive(Debug)]
pub enum Config {
    Init(init::Config),
    Serve(serve::Config),
    Probe(probe::Config),
    Unmount(PathBuf),
    Get(get::Config),
    Exec(exec::Config),
    CopySelf(PathBuf),
    Inject(inject::Config),
    Manifests(manifests::Config),
    Webhook(crate::admission::webhook::Config),
    Check(check::Config),
    Node(node::Config),
}

impl Config {
    /// Check the flags of `command` and resolve what they leave open (the pod,
    /// its namespace), without starting anything.
    pub fn from_command(command: &Command) -> Result<Self, Failure> {
        Ok(match command {
            Command::Init(args) => Config::Init(init::Config::from_args(args)?),
            Command::Serve(args) => Config::Serve(serve::Config::from_args(args)?),
            Command::Probe(args) => Config::Probe(probe::Config { dir: args.dir.dir.clone(), healthy: args.healthy }),
            Command::Unmount(args) => Config::Unmount(args.dir.clone()),
            Command::Get(args) => Config::Get(get::Config::from_args(args)?),
            Command::Exec(args) => Config::Exec(exec::Config::from_args(args)?),
            Command::CopySelf(args) => Config::CopySelf(args.to.clone()),
            Command::Inject(args) => Config::Inject(inject::Config::from_args(args)?),
            Command::Manifests(ManifestsCommand::Rbac(args)) => Config::Manifests(manifests::Config::from_args(args)),
            Command::Webhook(args) => Config::Webhook(webhook::config(args)?),
            Command::Check(args) => Config::Check(check::Config::from_args(args)?),
            Command::Node(args) => Config::Node(node::Config::from_args(args)?),
        })
    }

    /// The directory of a FUSE tree this command serves (it runs under a supervisor).
    pub fn fuse_dir(&self) -> Option<&Path> {
        match self {
            Config::Serve(c) if c.output.publishing.backend == TreeBackend::Fuse => Some(&c.output.publishing.dir),
            _ => None,
        }
    }
}

/// Run a checked command until it is done or stopped.
pub async fn run(config: Config, stop: Stop) -> Result<(), Failure> {
    match config {
        Config::Init(c) => init::run(c, stop).await,
        Config::Serve(c) => serve::run(c, stop).await,
        Config::Probe(c) => blocking(stop, move || probe::run(&c)).await,
        Config::Unmount(dir) => blocking(stop, move || unmount::run(&dir)).await,
        Config::Get(c) => fail_on(stop, get::run(c)).await,
        Config::Exec(c) => fail_on(stop, exec::run(c)).await,
        Config::CopySelf(to) => blocking(stop, move || copy_self::run(&to)).await,
        Config::Inject(c) => blocking(stop, move || inject::run(&c)).await,
        Config::Manifests(c) => blocking(stop, move || manifests::run(&c)).await,
        Config::Webhook(c) => webhook::run(c, stop).await,
        Config::Check(c) => fail_on(stop, check::run(c)).await,
        Config::Node(c) => node::run(c, stop).await,
    }
}

/// The signals that stop a command: SIGTERM (the kubelet), SIGINT (a
/// terminal), SIGHUP and SIGQUIT (what a supervisor or a runtime may send,
/// and what the FUSE supervisor passes on).
const STOP_SIGNALS: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

fn stop_signal_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut set);
        for signal in STOP_SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
    }
    set
}

/// Hold the stop signals back from the first instruction of `main` until
/// [`Stop::install`] listens for them: one that comes meanwhile (while the
/// runtime starts, or the FUSE server is forked) waits instead of taking its
/// default action. Threads started meanwhile inherit the mask, so the signal
/// goes to the main thread once it unblocks.
pub fn hold_stop_signals() {
    let set = stop_signal_set();
    // SAFETY: a valid set; blocking signals in this thread only.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// The stop signals, listened for from its creation on: create it before a
/// command starts, so that a signal that comes early never takes its default
/// action (killing drafs with a FUSE tree mounted or an init half done).
pub struct Stop {
    signals: Option<Vec<(tokio::signal::unix::Signal, &'static str)>>,
}

impl Stop {
    /// Install the handlers (on the runtime: call it inside `block_on`), then
    /// let the signals [`hold_stop_signals`] held back through: one that came
    /// early is received now.
    pub fn install() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        let kinds = [
            (SignalKind::terminate(), "SIGTERM"),
            (SignalKind::interrupt(), "SIGINT"),
            (SignalKind::hangup(), "SIGHUP"),
            (SignalKind::quit(), "SIGQUIT"),
        ];
        let signals: Option<Vec<_>> =
            kinds.into_iter().map(|(kind, name)| signal(kind).ok().map(|s| (s, name))).collect();
        let set = stop_signal_set();
        // SAFETY: a valid set; the handlers are installed (or the default
        // action is all there is, as before).
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
        Stop { signals }
    }

    /// Resolves on a stop signal, naming it (never, when the handlers could
    /// not be installed).
    pub async fn signalled(self) -> &'static str {
        let Some(signals) = self.signals else { return std::future::pending().await };
        let waits = signals.into_iter().map(|(mut s, name)| Box::pin(async move { s.recv().await.map(|_| name) }));
        match futures::future::select_all(waits).await {
            (Some(name), _, _) => name,
            // A signal stream never ends while the runtime runs.
            (None, _, _) => std::future::pending().await,
        }
    }
}

/// A command that has nothing to finish on a stop: it is dropped and fails.
async fn fail_on(stop: Stop, work: impl Future<Output = Result<(), Failure>>) -> Result<(), Failure> {
    tokio::select! {
        result = work => result,
        signal = stop.signalled() => Err(Failure::Failed(format!("stopped by {signal}"))),
    }
}

/// A command without I/O to wait for, run off the runtime thread so that a
/// stop still ends it (reading standard input, say).
async fn blocking(stop: Stop, work: impl FnOnce() -> Result<(), Failure> + Send + 'static) -> Result<(), Failure> {
    fail_on(stop, async {
        tokio::task::spawn_blocking(work)
            .await
            .unwrap_or_else(|e| Err(Failure::Failed(format!("the command stopped unexpectedly: {e}"))))
    })
    .await
}

/// Resolve once, from the file or the API, without waiting for what is missing.
async fn resolve_once(source: &Source, select: &Select) -> Result<Resolution, Failure> {
    Run::resolve_once(source, select.selection.clone(), select.timeout)
        .await
        .map_err(|e| run_failure(e, select.timeout))
}

fn usage(e: impl std::fmt::Display) -> Failure {
    Failure::Usage(e.to_string())
}

/// Warnings of laying out the tree (entries dropped on a path conflict) that the
/// resolver's own warnings, logged already, do not include.
fn log_tree_warnings(res: &Resolution, built: &BuiltTree) {
    for w in built.warnings.iter().filter(|w| !res.warnings.contains(w)) {
        tracing::warn!("{w}");
    }
}

/// A run's failure in the flags' terms: the deadline as `--timeout` said it,
/// an address `--metrics-addr` gave; credentials and addresses are usage errors.
fn run_failure(error: RunError, timeout: Duration) -> Failure {
    Failure::Run { error: Box::new(error), timeout }
}

/// How a run's failure reads: a timeout says what was still missing.
fn run_message(error: &RunError, timeout: Duration) -> String {
    match error {
        RunError::Drive(DriveError::Engine(EngineError::Timeout { waiting_for })) => {
            format!("not ready after {}: {}", crate::model::names::duration_text(timeout), waiting_for.join("; "))
        }
        RunError::MetricsAddr { addr, source } => format!("--metrics-addr {addr}: {source}"),
        other => other.to_string(),
    }
}

/// A failure's message also goes to the termination log, for `kubectl describe pod`.
fn logged(termination_log: &Path, result: Result<(), Failure>) -> Result<(), Failure> {
    if let Err(failure) = &result
        && failure.exit_code() == 1
    {
        let message = failure.to_string();
        let file = std::fs::OpenOptions::new().write(true).truncate(true).open(termination_log);
        if let Err(e) = file.and_then(|mut f| std::io::Write::write_all(&mut f, message.as_bytes())) {
            tracing::debug!(path = %termination_log.display(), "termination log not written: {e}");
        }
    }
    result
}
