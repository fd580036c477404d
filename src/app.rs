//! The commands: wiring of source, resolver, tree and outputs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use std::os::unix::process::CommandExt;

use crate::api::{EngineError, PodRef, RetryBackoff};
use crate::cli::{
    Backend, CopySelfArgs, ExecArgs, GetArgs, InitArgs, InjectArgs, Output, OutputArgs, ProbeArgs, SelectArgs,
    ServeArgs, SourceArgs,
};
use crate::envvars;
use crate::events::{self, Events, Note};
use crate::files::AtomicDir;
use crate::files::WriteError;
use crate::fuse::FuseMount;
use crate::inject;
use crate::layout;
use crate::metadata::{self, Generations};
use crate::metadata_dir::MetadataDir;
use crate::metrics::{self, Metrics};
use crate::objects::FileObjects;
use crate::reconcile::{Mode, Phase, Publication, Reconciler, Step, Transition};
use crate::resolve::{Resolution, Selection, resolve};
use crate::source::{Engine, sleep_until_opt};
use crate::tree::{self, BuiltTree, EntryKind};

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

const SA_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

fn selection(args: &SelectArgs) -> Selection {
    Selection { claims: args.claims.clone() }
}

/// Resolve from a file: no waiting, the file will not change.
fn resolve_file(source: &SourceArgs, path: &Path, sel: &Selection) -> Result<Resolution, Failure> {
    let objects = FileObjects::read(path).map_err(|e| Failure::Failed(e.to_string()))?;
    if !objects.ignored.is_empty() {
        info!(kinds = ?objects.ignored, "ignoring objects of other kinds in {}", path.display());
    }
    let shown = if path == Path::new("-") { "standard input".to_string() } else { path.display().to_string() };
    let snapshot =
        objects.into_snapshot(&shown, source.pod_name.as_deref()).map_err(|e| Failure::Failed(e.to_string()))?;
    let mut res = resolve(&snapshot, sel);
    for w in &res.warnings {
        warn!("{w}");
    }
    // A claim the file does not hold is not "not found" in a cluster: say
    // where it is missing and how to add it.
    let namespace = res.pod.namespace.clone();
    for missing in &mut res.missing {
        if let crate::resolve::Missing::ClaimNotFound { pod_claim, claim_name } = missing {
            *missing = crate::resolve::Missing::Invalid {
                what: format!("claim {pod_claim}"),
                problem: format!(
                    "ResourceClaim {claim_name} is not in {shown} (add it: kubectl get resourceclaim -n {namespace} {claim_name} -o yaml)"
                ),
            };
        }
    }
    Ok(res)
}

/// Warnings of laying out the tree (entries dropped on a path conflict) that the
/// resolver's own warnings, logged already, do not include.
fn log_tree_warnings(res: &Resolution, built: &BuiltTree) {
    for w in built.warnings.iter().filter(|w| !res.warnings.contains(w)) {
        warn!("{w}");
    }
}

async fn client_and_pod(source: &SourceArgs) -> Result<(kube::Client, PodRef), Failure> {
    let client = kube::Client::try_default().await.map_err(|e| {
        // kube quotes a kubeconfig path twice ('"/path"'); show it once.
        let e = e.to_string().replace("'\"", "'").replace("\"'", "'");
        Failure::Usage(format!(
            "cannot find cluster credentials ({e}); run inside a pod with a service account, set KUBECONFIG, or use --from-file"
        ))
    })?;
    let namespace = match &source.pod_namespace {
        Some(ns) => ns.clone(),
        None => std::fs::read_to_string(SA_NAMESPACE_FILE)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| client.default_namespace().to_string()),
    };
    let name =
        source.pod_name.clone().or_else(|| std::env::var("HOSTNAME").ok()).filter(|n| !n.is_empty()).ok_or_else(
            || {
                Failure::Usage(
                    "cannot tell which pod to read: set POD_NAME (downward API metadata.name) or --pod-name".into(),
                )
            },
        )?;
    Ok((client, PodRef { namespace, name }))
}

/// Why a run against the API ended without a result.
#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("cannot write the outputs: {0}")]
    Output(#[from] PublishError),
}

fn engine_failure(e: RunError, timeout: Duration) -> Failure {
    match e {
        RunError::Engine(EngineError::Timeout { waiting_for }) => {
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

/// Where the tree goes: files swapped atomically, or a FUSE mount.
enum TreeOutput {
    Files(AtomicDir),
    Fuse(FuseMount),
}

/// An output that could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("tree: {0}")]
    Tree(#[source] WriteError),
    #[error("metadata view: {0}")]
    Metadata(#[source] crate::metadata_dir::MetadataDirError),
    #[error("the writer stopped unexpectedly")]
    WriterGone,
}

/// Publishes each new tree and, when asked, the metadata view.
struct Publisher {
    tree: TreeOutput,
    metadata: Option<(MetadataDir, Generations)>,
}

impl Publisher {
    /// Takes the metadata directory for this writer (a second one is refused).
    fn new(tree: TreeOutput, args: &OutputArgs) -> Result<Self, Failure> {
        // Generations go on from what is in the directory (a restart, or serve after init).
        let metadata = match &args.metadata_dir {
            Some(d) => Some((
                MetadataDir::open(d, args.metadata_from_drivers.iter().cloned())
                    .map_err(|e| Failure::Failed(e.to_string()))?,
                Generations::read_back(d),
            )),
            None => None,
        };
        Ok(Publisher { tree, metadata })
    }

    /// Write every output; one that fails does not keep the others from being written.
    fn publish(&mut self, res: &Resolution, built: &BuiltTree) -> Result<(), PublishError> {
        let mut failed = None;
        // The standard view is written only when complete, like the kubelet's
        // files: until then, and when a device drops out later, the last
        // complete files stay.
        if let Some((dir, generations)) = self.metadata.as_mut().filter(|_| res.is_complete()) {
            let mut warnings = Vec::new();
            let view = metadata::build(res, generations, &mut warnings);
            for w in warnings {
                warn!("{w}");
            }
            if let Err(e) = dir.write(&view) {
                failed = Some(PublishError::Metadata(e));
            }
        }
        match &mut self.tree {
            TreeOutput::Files(dir) => {
                if let Err(e) = dir.write(&built.tree) {
                    // What is there is stale now: not ready until a write succeeds.
                    dir.withdraw_ready();
                    failed = Some(PublishError::Tree(e));
                }
            }
            TreeOutput::Fuse(mount) => mount.update(&built.tree),
        }
        failed.map_or(Ok(()), Err)
    }
}

/// A readiness change, reported once the tree that carries it is written.
struct Report {
    transition: Transition,
    uid: Option<String>,
}

/// What a write off the runtime thread gives back.
type Written = (Publisher, Publication, Result<(), PublishError>);

/// Writes trees off the runtime thread (a slow disk must not stall watches or
/// `/readyz`), one at a time: a publication that comes while a write runs
/// waits, and a newer one replaces it (the latest state wins), so a burst of
/// changes costs the write in progress and one more. A failed write is
/// retried with backoff. Readiness changes are reported to the log, the
/// metrics and the pod's Events from one place, once the tree that carries
/// them is written.
struct Outputs {
    /// None while a write runs (it has the publisher).
    publisher: Option<Publisher>,
    writing: Option<tokio::task::JoinHandle<Written>>,
    /// Reported when the write in progress is done.
    writing_reports: Vec<Report>,
    /// The newest publication not written yet.
    pending: Option<Publication>,
    pending_reports: Vec<Report>,
    metrics: Arc<Metrics>,
    events: Events,
    dir: std::path::PathBuf,
    /// The last write failed (its publication is pending again).
    failing: bool,
    /// Files in the last tree written.
    files: usize,
    retry: RetryBackoff,
    retry_at: Option<Instant>,
}

impl Outputs {
    fn new(publisher: Publisher, metrics: Arc<Metrics>, events: Events, dir: &Path) -> Self {
        Outputs {
            publisher: Some(publisher),
            writing: None,
            writing_reports: Vec::new(),
            pending: None,
            pending_reports: Vec::new(),
            metrics,
            events,
            dir: dir.to_path_buf(),
            failing: false,
            files: 0,
            retry: RetryBackoff::default(),
            retry_at: None,
        }
    }

    /// Take a step's publication and transition: written at once if no write
    /// runs, else after it (replacing a publication still waiting).
    fn submit(&mut self, publication: Option<Publication>, transition: Option<Transition>, uid: Option<String>) {
        if let Some(transition) = transition {
            self.pending_reports.push(Report { transition, uid });
        }
        if let Some(publication) = publication {
            if !publication.built.is_ready() {
                // Not ready is true already before the files are written; ready only after.
                self.metrics.not_ready(&publication.built.missing);
            }
            self.pending = Some(publication);
            // A new state is written at once, even while an older one waits for its retry.
            self.retry_at = None;
        }
        self.start_next();
    }

    /// Start writing the pending publication if nothing is being written and
    /// no retry is due later; report what waits for no tree.
    fn start_next(&mut self) {
        if self.writing.is_some() || self.retry_at.is_some() {
            return;
        }
        let Some(publication) = self.pending.take() else {
            for report in std::mem::take(&mut self.pending_reports) {
                self.report(report, self.files);
            }
            return;
        };
        let Some(mut publisher) = self.publisher.take() else {
            self.pending = Some(publication);
            return;
        };
        self.writing_reports = std::mem::take(&mut self.pending_reports);
        self.writing = Some(tokio::task::spawn_blocking(move || {
            let result = publisher.publish(&publication.resolution, &publication.built);
            (publisher, publication, result)
        }));
    }

    /// Until the write in progress is done (forever when none runs).
    async fn write_done(writing: &mut Option<tokio::task::JoinHandle<Written>>) -> Option<Written> {
        match writing {
            Some(task) => {
                let written = task.await.ok();
                *writing = None;
                written
            }
            None => std::future::pending().await,
        }
    }

    /// A write ended: count it, report its transitions, and start the next one.
    fn finish_write(&mut self, written: Option<Written>) -> Result<(), PublishError> {
        let Some((publisher, publication, result)) = written else {
            return Err(PublishError::WriterGone);
        };
        self.publisher = Some(publisher);
        let built = &publication.built;
        let files = built.tree.len();
        match &result {
            Ok(()) => {
                self.files = files;
                self.metrics.tree_published(built.is_ready(), files, &built.missing);
                if std::mem::take(&mut self.failing) {
                    info!("outputs written again");
                }
                self.retry.reset();
            }
            Err(e) => {
                self.metrics.not_ready(&[format!("output failed: {e}")]);
                let after = self.retry.next().unwrap_or_default();
                warn!("cannot write the outputs ({e}); retrying in {} ms", after.as_millis());
                if !std::mem::replace(&mut self.failing, true) {
                    let message = format!("cannot write the outputs: {e}; retrying");
                    self.events.record(Note { warning: true, reason: events::NOT_READY, message, uid: None });
                }
                // Written again later, unless a newer state came meanwhile.
                if self.pending.is_none() {
                    self.pending = Some(publication);
                    self.retry_at = Some(Instant::now() + after);
                }
            }
        }
        for report in std::mem::take(&mut self.writing_reports) {
            self.report(report, files);
        }
        self.start_next();
        result
    }

    fn retry_failed(&mut self) {
        self.retry_at = None;
        self.start_next();
    }

    /// At the end of a run: write what is pending now (no retry is waited
    /// for) and wait for the writes; the first error, if any.
    async fn flush(&mut self) -> Result<(), PublishError> {
        let mut outcome = Ok(());
        self.retry_at = None;
        self.start_next();
        while self.writing.is_some() {
            let written = Self::write_done(&mut self.writing).await;
            if let Err(e) = self.finish_write(written)
                && outcome.is_ok()
            {
                outcome = Err(e);
            }
        }
        outcome
    }

    fn report(&self, report: Report, files: usize) {
        let Report { transition, uid } = report;
        let note =
            |warning: bool, reason: &'static str, message: String| Note { warning, reason, message, uid: uid.clone() };
        match transition {
            Transition::Waiting { missing } => info!("waiting for: {}", missing.join("; ")),
            Transition::Ready { summary } => {
                info!(dir = %self.dir.display(), files, %summary, "ready");
                self.events.record(note(false, events::READY, summary));
            }
            Transition::Updated => info!(files, "tree updated"),
            Transition::Lost { missing } => {
                let message = format!("no longer ready, values removed: {}", missing.join("; "));
                warn!("{message}");
                self.events.record(note(true, events::NOT_READY, message));
            }
            Transition::Recovered => {
                info!(files, "ready again");
                self.events.record(note(false, events::READY, "ready again".into()));
            }
        }
    }
}

/// What woke the drive loop.
enum Wake {
    Inputs(Vec<crate::reconcile::Input>),
    Written(Box<Option<Written>>),
    Retry,
}

/// Drive the reconciler with the engine until the run is done. Outputs are
/// published as the steps say (`None`: `get`/`exec`, nothing to publish).
/// Inputs are taken in batches (everything queued at once) while trees are
/// written in the background, and resolved when no write is running.
async fn drive(
    engine: &mut Engine,
    reconciler: &mut Reconciler,
    mut outputs: Option<&mut Outputs>,
    fail_on_output_error: bool,
) -> Result<Resolution, RunError> {
    let mut step = reconciler.start();
    loop {
        for w in step.warnings.drain(..) {
            warn!("{w}");
        }
        engine.execute(std::mem::take(&mut step.actions));
        if let Some(out) = outputs.as_deref_mut() {
            out.submit(step.publish.take(), step.transition.take(), reconciler.pod_uid());
        }
        if let Some(done) = step.done.take() {
            if let Some(out) = outputs.as_deref_mut()
                && let Err(e) = out.flush().await
                && fail_on_output_error
            {
                return Err(RunError::Output(e));
            }
            return Ok(done?);
        }
        if matches!(reconciler.phase(), Phase::Ready | Phase::Degraded) {
            engine.clear_deadline();
        }
        let retry_at = outputs.as_ref().and_then(|o| o.retry_at);
        let mut no_write = None;
        let writing = match outputs.as_deref_mut() {
            Some(out) => &mut out.writing,
            None => &mut no_write,
        };
        let wake = tokio::select! {
            inputs = engine.next_batch() => Wake::Inputs(inputs),
            written = Outputs::write_done(writing) => Wake::Written(Box::new(written)),
            _ = sleep_until_opt(retry_at) => Wake::Retry,
        };
        step = Step::default();
        let busy = |outputs: &Option<&mut Outputs>| outputs.as_ref().is_some_and(|o| o.writing.is_some());
        match wake {
            Wake::Inputs(inputs) => {
                // While a tree is being written, inputs only go into the state:
                // it is resolved once that write is done, so a burst costs a
                // few resolutions, not one per event.
                step = reconciler.absorb(inputs);
                if step.done.is_none() && !busy(&outputs) {
                    step.merge(reconciler.settle());
                }
            }
            Wake::Written(written) => {
                if let Some(out) = outputs.as_deref_mut()
                    && let Err(e) = out.finish_write(*written)
                    && fail_on_output_error
                {
                    return Err(RunError::Output(e));
                }
                if !busy(&outputs) {
                    step = reconciler.settle();
                }
            }
            Wake::Retry => {
                if let Some(out) = outputs.as_deref_mut() {
                    out.retry_failed();
                }
            }
        }
    }
}

fn deadline(timeout: Duration) -> Option<Instant> {
    (!timeout.is_zero()).then(|| Instant::now() + timeout)
}

/// Metrics for a run; serves them when `--metrics-addr` is set.
async fn start_metrics(out: &OutputArgs) -> Result<Arc<Metrics>, Failure> {
    let m = Arc::new(Metrics::default());
    if let Some(addr) = out.metrics_addr {
        let listener = metrics::bind(addr).await.map_err(|e| Failure::Usage(format!("--metrics-addr {addr}: {e}")))?;
        tokio::spawn(metrics::serve(listener, m.clone()));
    }
    Ok(m)
}

pub async fn init(args: &InitArgs) -> Result<(), Failure> {
    logged(&args.output, init_inner(args).await)
}

/// A failure's message also goes to the termination log, for `kubectl describe pod`.
fn logged(out: &OutputArgs, result: Result<(), Failure>) -> Result<(), Failure> {
    if let Err(Failure::Failed(message)) = &result {
        write_termination_log(&out.termination_log, message);
    }
    result
}

async fn init_inner(args: &InitArgs) -> Result<(), Failure> {
    let sel = selection(&args.select);
    let out = &args.output;
    check_output_dirs(out)?;
    let metrics = start_metrics(out).await?;
    let mut publisher = Publisher::new(TreeOutput::Files(open_dir(&out.dir)?), out)?;
    if let Some(path) = &args.source.from_file {
        let res = resolve_file(&args.source, path, &sel)?;
        let built = tree::build(&res, &out.require);
        log_tree_warnings(&res, &built);
        if !built.is_ready() {
            return Err(Failure::Failed(format!("not ready: {}", built.missing.join("; "))));
        }
        publisher.publish(&res, &built).map_err(|e| Failure::Failed(e.to_string()))?;
        info!(dir = %out.dir.display(), files = built.tree.len(), "tree written");
        return Ok(());
    }
    let (client, pod) = client_and_pod(&args.source).await?;
    info!(pod = %format!("{}/{}", pod.namespace, pod.name), "resolving");
    let events = Events::start(client.clone(), pod.clone(), out.events);
    let mut outputs = Outputs::new(publisher, metrics.clone(), events, &out.dir);
    let mut engine = Engine::new(client, pod.clone(), deadline(args.select.timeout)).with_metrics(Some(metrics));
    let mut reconciler = Reconciler::new(Mode::UntilReady, pod, sel, out.require.clone());
    let result = drive(&mut engine, &mut reconciler, Some(&mut outputs), true).await;
    drop(engine);
    let outcome = match result {
        Ok(_) => Ok(()),
        Err(e) => {
            let failure = engine_failure(e, args.select.timeout);
            let note = Note {
                warning: true,
                reason: events::NOT_READY,
                message: failure.to_string(),
                uid: reconciler.pod_uid(),
            };
            outputs.events.record(note);
            Err(failure)
        }
    };
    outputs.events.finish().await;
    outcome
}

/// Serve until stopped; fails only if not ready by the deadline (or at start-up).
pub async fn serve(args: &ServeArgs) -> Result<(), Failure> {
    logged(&args.output, serve_inner(args).await)
}

async fn serve_inner(args: &ServeArgs) -> Result<(), Failure> {
    let sel = selection(&args.select);
    let out = &args.output;
    check_output_dirs(out)?;
    let metrics = start_metrics(out).await?;
    let tree_output = match args.backend {
        Backend::Fuse => TreeOutput::Fuse(
            FuseMount::mount(&out.dir, Some(metrics.clone())).map_err(|e| Failure::Failed(e.to_string()))?,
        ),
        Backend::Files => TreeOutput::Files(open_dir(&out.dir)?),
    };
    let mount_id = match &tree_output {
        TreeOutput::Fuse(m) => m.mount_id(),
        TreeOutput::Files(_) => None,
    };
    let mut publisher = Publisher::new(tree_output, out)?;
    if let Some(path) = &args.source.from_file {
        let res = resolve_file(&args.source, path, &sel)?;
        let built = tree::build(&res, &out.require);
        log_tree_warnings(&res, &built);
        publisher.publish(&res, &built).map_err(|e| Failure::Failed(e.to_string()))?;
        metrics.tree_published(built.is_ready(), built.tree.len(), &built.missing);
        if !built.is_ready() {
            warn!("not ready: {}", built.missing.join("; "));
        }
        info!(dir = %out.dir.display(), files = built.tree.len(), ready = built.is_ready(), "serving a file's resolution until stopped");
        return std::future::pending().await;
    }
    let (client, pod) = client_and_pod(&args.source).await?;
    info!(pod = %format!("{}/{}", pod.namespace, pod.name), backend = ?args.backend, "resolving");
    let events = Events::start(client.clone(), pod.clone(), out.events);
    let mut outputs = Outputs::new(publisher, metrics.clone(), events, &out.dir);
    let mut engine = Engine::new(client, pod.clone(), deadline(args.select.timeout)).with_metrics(Some(metrics));
    let mut reconciler = Reconciler::new(Mode::Follow, pod, sel, out.require.clone());
    // Serve has no end but a signal: drive only returns with an error, and the
    // mount only goes away if someone removes it.
    let failure = tokio::select! {
        result = drive(&mut engine, &mut reconciler, Some(&mut outputs), false) => match result {
            Ok(_) => return Ok(()),
            Err(e) => engine_failure(e, args.select.timeout),
        },
        () = mount_lost(mount_id) => Failure::Failed(format!(
            "the FUSE mount at {} was removed (drafs unmount, or by hand); exiting so that the kubelet restarts the sidecar",
            out.dir.display()
        )),
    };
    drop(engine);
    let note =
        Note { warning: true, reason: events::NOT_READY, message: failure.to_string(), uid: reconciler.pod_uid() };
    outputs.events.record(note);
    outputs.events.finish().await;
    Err(failure)
}

/// The tree's directory, taken for this writer (a second one is refused).
fn open_dir(dir: &Path) -> Result<AtomicDir, Failure> {
    AtomicDir::open(dir).map_err(|e| Failure::Failed(format!("tree: {e}")))
}

/// `--dir` and `--metadata-dir` must not hold one another: each writer owns its
/// directory's top-level names, so one would hide or refuse the other's files.
fn check_output_dirs(out: &OutputArgs) -> Result<(), Failure> {
    let Some(meta) = &out.metadata_dir else { return Ok(()) };
    let (a, b) = (real_path(&out.dir), real_path(meta));
    if a.starts_with(&b) || b.starts_with(&a) {
        return Err(Failure::Usage(format!(
            "--metadata-dir {} overlaps --dir {}: the standard view and the tree each need a directory of their own",
            meta.display(),
            out.dir.display()
        )));
    }
    Ok(())
}

/// `path` made absolute with `.`, `..` and symlinks resolved as far as it exists.
fn real_path(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = if path.is_absolute() { PathBuf::new() } else { std::env::current_dir().unwrap_or_default() };
    for part in path.components() {
        match part {
            Component::Prefix(_) | Component::CurDir => {}
            Component::RootDir => out.push("/"),
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => {
                out.push(name);
                if let Ok(real) = std::fs::canonicalize(&out) {
                    out = real;
                }
            }
        }
    }
    out
}

/// Resolves when the FUSE mount `id` is no longer mounted (never for the files backend).
async fn mount_lost(id: Option<u64>) {
    let Some(id) = id else { return std::future::pending().await };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        if !crate::fuse::is_mounted_id(id) {
            return;
        }
    }
}

/// `probe`: one line on stdout, exit 0 when ready.
pub fn probe(args: &ProbeArgs) -> Result<(), Failure> {
    let dir = &args.dir;
    if crate::fuse::is_stale_mount(dir) {
        return Err(Failure::Failed(format!("{} is a stale FUSE mount (its server is gone)", dir.display())));
    }
    if dir.join(layout::READY).exists() {
        println!("ready");
        return Ok(());
    }
    let reason = match std::fs::read(dir.join(layout::RECORD)) {
        Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| {
                v["missing"].as_array().map(|m| m.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join("; "))
            })
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "resolution incomplete".into()),
        Err(_) => format!("no tree at {} yet (not mounted or not written)", dir.display()),
    };
    Err(Failure::Failed(format!("not ready: {reason}")))
}

fn write_termination_log(path: &Path, message: &str) {
    let file = std::fs::OpenOptions::new().write(true).truncate(true).open(path);
    match file.and_then(|mut f| f.write_all(message.as_bytes())) {
        Ok(()) => {}
        Err(e) => tracing::debug!(path = %path.display(), "termination log not written: {e}"),
    }
}

/// Resolve once, from the file or the API, without waiting for what is missing.
async fn resolve_once(source: &SourceArgs, select: &SelectArgs) -> Result<Resolution, Failure> {
    let sel = selection(select);
    match &source.from_file {
        Some(path) => resolve_file(source, path, &sel),
        None => {
            let (client, pod) = client_and_pod(source).await?;
            let mut engine = Engine::new(client, pod.clone(), deadline(select.timeout));
            let mut reconciler = Reconciler::new(Mode::Once, pod, sel, Vec::new());
            drive(&mut engine, &mut reconciler, None, true).await.map_err(|e| engine_failure(e, select.timeout))
        }
    }
}

pub async fn get(args: &GetArgs) -> Result<(), Failure> {
    let res = resolve_once(&args.source, &args.select).await?;
    let built = tree::build(&res, &[]);
    if args.source.from_file.is_some() {
        log_tree_warnings(&res, &built);
    }
    let mut out = std::io::stdout().lock();
    let printed = match args.output {
        Output::Json => out.write_all(built.tree.get(layout::RECORD).unwrap_or_default()).and_then(|_| writeln!(out)),
        Output::Table => out.write_all(table(&res).as_bytes()),
        Output::Tree => out.write_all(tree_listing(&built).as_bytes()),
    };
    match printed {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(Failure::Failed(format!("cannot write to stdout: {e}")));
        }
        _ => {}
    }
    if built.is_ready() { Ok(()) } else { Err(Failure::Failed(format!("incomplete: {}", built.missing.join("; ")))) }
}

/// `exec`: set the variables and replace this process with the command.
pub async fn exec(args: &ExecArgs) -> Result<(), Failure> {
    let vars = match &args.from_dir {
        // No tree there is a mistake (a wrong path, a missing mount), not a missing value.
        Some(dir) if !dir.join(layout::RECORD).exists() => {
            return Err(Failure::Failed(format!(
                "no drafs tree at {} (no {} there): check --from-dir and that the volume is mounted",
                dir.display(),
                layout::RECORD
            )));
        }
        Some(dir) => envvars::values(&args.env, &envvars::DirSource(dir.clone()), args.optional),
        None => {
            let res = resolve_once(&args.source, &args.select).await?;
            envvars::values(&args.env, &tree::build(&res, &[]).tree, args.optional)
        }
    }
    .map_err(|e| Failure::Failed(e.to_string()))?;
    let (program, rest) =
        args.command.split_first().ok_or_else(|| Failure::Usage("no command given after --".into()))?;
    // A value is a driver's text: escaped, it cannot forge a log line or drive a terminal.
    for (name, value) in &vars {
        info!(%name, value = %printable(value), "setting");
    }
    let err = std::process::Command::new(program).args(rest).envs(vars).exec();
    Err(Failure::Failed(format!("cannot run {program}: {err}")))
}

/// `inject`: stdin to stdout.
pub fn inject(args: &InjectArgs) -> Result<(), Failure> {
    let mut opts = inject::Options::new(args.mode, args.image.clone());
    opts.dir = args.dir.clone();
    opts.require = args.require.clone();
    opts.timeout = args.timeout;
    if let Some(m) = &args.metadata_dir {
        inject::check_metadata_dir(m, &opts.dir).map_err(|p| Failure::Usage(format!("--metadata-dir {m:?} {p}")))?;
        opts.metadata_dir = Some(m.clone());
    }
    opts.metadata_from_drivers = args.metadata_from_drivers.clone();
    let mut out = String::new();
    for (name, text) in inject_inputs(args)? {
        let (injected, outcomes) = inject::inject(&text, &opts).map_err(|e| Failure::Failed(format!("{name}: {e}")))?;
        if outcomes.is_empty() {
            return Err(Failure::Usage(format!(
                "{name}: no manifests in it; give files (drafs inject FILE, -f DIR) or YAML on standard input"
            )));
        }
        for outcome in outcomes {
            match outcome {
                inject::Outcome::Injected(what) => info!("{what}: drafs added"),
                inject::Outcome::InjectedKeepingAccount { what, account } => warn!(
                    "{what}: drafs added; the pod keeps its service account {account:?}, which needs drafs's RBAC (drafs manifests rbac --namespace NS --service-account {account}), and its token stays mounted in every container"
                ),
                inject::Outcome::AlreadyInjected(what) => info!("{what}: already has drafs, unchanged"),
                inject::Outcome::NoClaims(what) => warn!("{what}: no resourceClaims, unchanged"),
                inject::Outcome::NotAWorkload(_) => {}
            }
        }
        if !out.is_empty() {
            out.push_str("---\n");
        }
        out.push_str(&injected);
    }
    std::io::stdout().write_all(out.as_bytes()).map_err(|e| Failure::Failed(format!("cannot write stdout: {e}")))
}

/// The manifests `inject` reads, each with the name its messages use.
fn inject_inputs(args: &InjectArgs) -> Result<Vec<(String, String)>, Failure> {
    let mut paths: Vec<PathBuf> = args.files.iter().chain(&args.filenames).cloned().collect();
    if paths.is_empty() {
        paths.push(PathBuf::from("-"));
    }
    let mut inputs = Vec::new();
    for path in paths {
        if path == Path::new("-") {
            if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                eprintln!(
                    "drafs inject: reading manifests from standard input (end with Ctrl-D), or give files: drafs inject FILE|DIR"
                );
            }
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .map_err(|e| Failure::Failed(format!("cannot read standard input: {e}")))?;
            inputs.push(("standard input".to_string(), text));
            continue;
        }
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|e| Failure::Failed(format!("cannot read {}: {e}", p.display())))
        };
        if path.is_dir() {
            let entries = std::fs::read_dir(&path)
                .map_err(|e| Failure::Failed(format!("cannot read directory {}: {e}", path.display())))?;
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml" || x == "json"))
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(Failure::Usage(format!("{}: no .yaml, .yml or .json files in it", path.display())));
            }
            for file in files {
                inputs.push((file.display().to_string(), read(&file)?));
            }
        } else {
            inputs.push((path.display().to_string(), read(&path)?));
        }
    }
    Ok(inputs)
}

/// `webhook`: bind (bad addresses and certificates fail here, with exit 2),
/// then serve until `shutdown`.
pub async fn webhook(
    args: &crate::cli::WebhookArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Failure> {
    let config = crate::webhook::Config {
        addr: args.addr,
        cert: args.tls_cert.clone(),
        key: args.tls_key.clone(),
        image: args.image.clone(),
        metrics_addr: args.metrics_addr,
        drain: args.drain,
        dns_names: args.dns_names.clone(),
    };
    let server = crate::webhook::Webhook::bind(&config).await.map_err(|e| Failure::Usage(e.to_string()))?;
    server.serve(shutdown).await;
    Ok(())
}

/// `manifests rbac`: the RBAC for one namespace, on stdout.
pub fn manifests_rbac(args: &crate::cli::RbacArgs) -> Result<(), Failure> {
    let docs = crate::manifests::rbac(&args.namespace, &args.service_account, args.events);
    let text = crate::manifests::to_yaml(&docs).map_err(|e| Failure::Failed(format!("cannot write YAML: {e}")))?;
    std::io::stdout().write_all(text.as_bytes()).map_err(|e| Failure::Failed(format!("cannot write stdout: {e}")))
}

/// `copy-self`: install this binary as DIR/drafs (atomically, mode 0755).
///
/// The directory is shared with other containers, so nothing in it is
/// trusted: the copy goes to a new file of a fresh name, created exclusively
/// and never through a link, and is renamed over `drafs` (which replaces a link
/// there rather than writing through it).
pub fn copy_self(args: &CopySelfArgs) -> Result<(), Failure> {
    use std::os::unix::fs::OpenOptionsExt;
    let failed = |what: &str, e: std::io::Error| Failure::Failed(format!("copy-self: cannot {what}: {e}"));
    let me = std::env::current_exe().map_err(|e| failed("find this binary", e))?;
    std::fs::create_dir_all(&args.to).map_err(|e| failed(&format!("create {}", args.to.display()), e))?;
    let dest = args.to.join("drafs");
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let tmp = args.to.join(format!(".drafs.{}.{nanos}.tmp", std::process::id()));
    let write = || -> Result<(), Failure> {
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(|e| failed(&format!("create {}", tmp.display()), e))?;
        let mut src = std::fs::File::open(&me).map_err(|e| failed(&format!("read {}", me.display()), e))?;
        std::io::copy(&mut src, &mut out).map_err(|e| failed(&format!("write {}", tmp.display()), e))?;
        // fchmod on the open file: the umask may have narrowed the mode.
        out.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| failed(&format!("chmod {}", tmp.display()), e))?;
        out.sync_all().map_err(|e| failed(&format!("sync {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &dest).map_err(|e| failed(&format!("rename to {}", dest.display()), e))
    };
    let result = write();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    info!(to = %dest.display(), "copied");
    Ok(())
}

/// Text safe for a terminal: control characters (escape sequences, newlines)
/// in values a driver or a claim wrote are shown escaped, never sent raw.
pub fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// Every file of the tree and its content; JSON records are summarized.
pub fn tree_listing(built: &BuiltTree) -> String {
    let mut text = String::new();
    for (path, content) in built.tree.files() {
        let shown = if path.ends_with(layout::RECORD) {
            format!("({} bytes of JSON)", content.len())
        } else {
            printable(&String::from_utf8_lossy(content))
        };
        text.push_str(&format!("{}  {shown}\n", printable(path)));
    }
    text
}

/// One row per attribute, capacity and status value, in aligned columns.
pub fn table(res: &Resolution) -> String {
    let mut rows =
        vec![["CLAIM", "REQUEST", "INDEX", "DRIVER", "DEVICE", "ATTRIBUTE", "VALUE"].map(String::from).to_vec()];
    for claim in &res.claims {
        for device in &claim.devices {
            for (name, kind, value) in tree::device_entries(device) {
                if matches!(kind, EntryKind::Attribute | EntryKind::Capacity | EntryKind::Status) {
                    let row = [
                        claim.pod_claim.as_str(),
                        device.full_request.as_str(),
                        &device.index.to_string(),
                        device.driver.as_str(),
                        device.device.as_str(),
                        &name,
                        &value,
                    ];
                    rows.push(row.iter().map(|cell| printable(cell)).collect());
                }
            }
        }
    }
    let widths: Vec<usize> = (0..7).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut text = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        text.push_str(cells.join("  ").trim_end());
        text.push('\n');
    }
    text
}
