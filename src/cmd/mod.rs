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
use std::sync::Arc;
use std::time::Duration;

use crate::engine::EngineError;
use crate::engine::drive::{self, DriveError};
use crate::engine::file::resolve_file;
use crate::engine::reconcile::{Mode, Reconciler};
use crate::engine::source::{Engine, connect};
use crate::model::resolve::Resolution;
use crate::model::tree::{self, BuiltTree, RequirePath};
use crate::publish::events::{self, Events, Note};
use crate::publish::files::AtomicDir;
use crate::publish::metrics::{self, Metrics};
use crate::publish::outputs::{Outputs, Publisher, TreeOutput};

pub mod check;
pub mod cli;
pub mod config;
pub mod copy_self;
pub mod exec;
pub mod get;
pub mod init;
pub mod inject;
pub mod manifests;
pub mod probe;
pub mod serve;
pub mod unmount;
pub mod webhook;

use cli::{Backend, Command, ManifestsCommand};
use config::{Output, Select, Source};

/// How a command failed; the exit code follows from it.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Bad flags or environment: exit 2.
    #[error("{0}")]
    Usage(String),
    /// Anything else: exit 1, and for `init` the message goes to the termination log.
    #[error("{0}")]
    Failed(String),
}

impl Failure {
    pub fn exit_code(&self) -> i32 {
        match self {
            Failure::Usage(_) => 2,
            Failure::Failed(_) => 1,
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
            Command::Webhook(args) => Config::Webhook(webhook::config(args)),
            Command::Check(args) => Config::Check(check::Config::from_args(args)?),
        })
    }

    /// The directory of a FUSE tree this command serves (it runs under a supervisor).
    pub fn fuse_dir(&self) -> Option<&Path> {
        match self {
            Config::Serve(c) if c.backend == Backend::Fuse => Some(&c.output.dir),
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
    match source {
        Source::File { path, pod_name } => {
            resolve_file(path, pod_name.as_deref(), &select.selection).map_err(|e| Failure::Failed(e.to_string()))
        }
        Source::Api { pod_name, namespace } => {
            let (client, pod) = connect(pod_name.clone(), namespace.clone()).await.map_err(usage)?;
            drive::resolve_once(client, pod, select.selection.clone(), select.timeout)
                .await
                .map_err(|e| run_failure(e, select.timeout))
        }
    }
}

fn usage(e: impl std::fmt::Display) -> Failure {
    Failure::Usage(e.to_string())
}

/// The tree of the file's pod (`init`, `serve`), its warnings logged.
fn file_tree(
    path: &Path,
    pod_name: Option<&str>,
    select: &Select,
    require: &[RequirePath],
) -> Result<(Resolution, BuiltTree), Failure> {
    let res = resolve_file(path, pod_name, &select.selection).map_err(|e| Failure::Failed(e.to_string()))?;
    let built = tree::build(&res, require);
    log_tree_warnings(&res, &built);
    Ok((res, built))
}

/// Warnings of laying out the tree (entries dropped on a path conflict) that the
/// resolver's own warnings, logged already, do not include.
fn log_tree_warnings(res: &Resolution, built: &BuiltTree) {
    for w in built.warnings.iter().filter(|w| !res.warnings.contains(w)) {
        tracing::warn!("{w}");
    }
}

/// A run's failure, the deadline said in the flag's terms.
fn run_failure(e: DriveError, timeout: Duration) -> Failure {
    match e {
        DriveError::Engine(EngineError::Timeout { waiting_for }) => {
            Failure::Failed(format!("not ready after {}: {}", humanize(timeout), waiting_for.join("; ")))
        }
        other => Failure::Failed(other.to_string()),
    }
}

fn humanize(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 => format!("{}ms", d.as_millis()),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Metrics for a run; serves them when `addr` is set.
async fn start_metrics(addr: Option<std::net::SocketAddr>) -> Result<Arc<Metrics>, Failure> {
    let m = Arc::new(Metrics::default());
    if let Some(addr) = addr {
        let listener = metrics::bind(addr).await.map_err(|e| Failure::Usage(format!("--metrics-addr {addr}: {e}")))?;
        tokio::spawn(metrics::serve(listener, m.clone()));
    }
    Ok(m)
}

/// A failure's message also goes to the termination log, for `kubectl describe pod`.
fn logged(termination_log: &Path, result: Result<(), Failure>) -> Result<(), Failure> {
    if let Err(Failure::Failed(message)) = &result {
        let file = std::fs::OpenOptions::new().write(true).truncate(true).open(termination_log);
        if let Err(e) = file.and_then(|mut f| std::io::Write::write_all(&mut f, message.as_bytes())) {
            tracing::debug!(path = %termination_log.display(), "termination log not written: {e}");
        }
    }
    result
}

/// A run against the API server that publishes (`init`, `serve`): the
/// outputs, the engine and the reconciler, wired.
struct Publishing {
    outputs: Outputs,
    engine: Engine,
    reconciler: Reconciler,
}

impl Publishing {
    /// Connect, and wire `publisher` to a reconciler in `mode` (`serve` names its backend).
    #[allow(clippy::too_many_arguments)]
    async fn connect(
        pod_name: &str,
        namespace: &Option<String>,
        mode: Mode,
        backend: Option<Backend>,
        select: &Select,
        out: &Output,
        publisher: Publisher,
        metrics: Arc<Metrics>,
    ) -> Result<Self, Failure> {
        let (client, pod) = connect(pod_name.to_string(), namespace.clone()).await.map_err(usage)?;
        let shown = format!("{}/{}", pod.namespace, pod.name);
        match backend {
            Some(backend) => tracing::info!(pod = %shown, ?backend, "resolving"),
            None => tracing::info!(pod = %shown, "resolving"),
        }
        let events = Events::start(client.clone(), pod.clone(), out.events);
        let outputs = Outputs::new(publisher, metrics.clone(), events, &out.dir);
        let engine = Engine::new(client, pod.clone(), drive::deadline(select.timeout)).with_metrics(Some(metrics));
        let reconciler = Reconciler::new(mode, pod, select.selection.clone(), out.require.clone());
        Ok(Publishing { outputs, engine, reconciler })
    }

    /// Drive until the run is done.
    async fn drive(&mut self, fail_on_output_error: bool) -> Result<Resolution, DriveError> {
        drive::drive(&mut self.engine, &mut self.reconciler, Some(&mut self.outputs), fail_on_output_error).await
    }

    /// Stop asking the API, record why the run failed on the pod, and send the Events.
    async fn fail(self, failure: Failure) -> Failure {
        let Publishing { outputs, engine, reconciler } = self;
        drop(engine);
        let message = failure.to_string();
        outputs.record(Note { warning: true, reason: events::NOT_READY, message, uid: reconciler.pod_uid() });
        outputs.finish().await;
        failure
    }

    /// Send the Events still queued.
    async fn finish(self) {
        drop(self.engine);
        self.outputs.finish().await;
    }
}

/// The tree's directory, taken for this writer (a second one is refused).
fn open_dir(dir: &Path) -> Result<AtomicDir, Failure> {
    AtomicDir::open(dir).map_err(|e| Failure::Failed(format!("tree: {e}")))
}

/// The fan-out to `tree` and, when asked, the standard view.
fn publisher(tree: TreeOutput, out: &Output) -> Result<Publisher, Failure> {
    Publisher::new(tree, out.metadata_dir.as_deref(), &out.metadata_from_drivers)
        .map_err(|e| Failure::Failed(e.to_string()))
}
