//! The fan-out: each tree the engine resolves goes to every output (the tree,
//! and the standard view when asked), written off the runtime thread, one
//! write at a time, retried when it fails; readiness changes are reported to
//! the log, the metrics and the pod's Events once the tree that carries them
//! is written.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::model::backoff::{FailureStreak, RetryBackoff};
use crate::model::metadata::{self, Generations};
use crate::model::publication::{Publication, Transition};
use crate::model::resolve::{ContainerClaims, Resolution, for_container};
use crate::model::tree::{BuiltTree, RequirePath};
use crate::publish::events::{self, Events, Note};
use crate::publish::files::{AtomicDir, WriteError};
use crate::publish::fuse::FuseMount;
use crate::publish::metadata_dir::{MetadataDir, MetadataDirError, read_generations};
use crate::publish::metrics::Metrics;

/// Where the tree goes: files swapped atomically, a FUSE mount, or nowhere
/// (a node volume of the standard view alone).
pub enum TreeOutput {
    Files(AtomicDir),
    Fuse(FuseMount),
    None,
}

/// An output that could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("tree: {0}")]
    Tree(#[source] WriteError),
    #[error("metadata view: {0}")]
    Metadata(#[source] MetadataDirError),
    #[error("the writer stopped unexpectedly")]
    WriterGone,
}

/// Publishes each new tree and, when asked, the metadata view: the fan-out.
pub struct TreeWriters {
    tree: TreeOutput,
    metadata: Option<(MetadataDir, Generations)>,
    /// Each container's own tree and standard view (the node agent's NRI
    /// mounts): its share of the resolution, written beside the pod's.
    containers: Vec<ContainerWriters>,
}

/// One container's own outputs: its share of each resolution
/// ([`for_container`]) as a tree of its own, ready when its claims are and
/// its own required paths exist, and, when asked, a standard view of its own.
pub struct ContainerWriters {
    claims: ContainerClaims,
    /// The pod's required paths that lie in this container's claims.
    require: Vec<RequirePath>,
    tree: AtomicDir,
    metadata: Option<(MetadataDir, Generations)>,
}

impl ContainerWriters {
    /// `require`: the pod's required paths; those outside the container's
    /// claims are not its to wait for.
    pub fn new(
        claims: ContainerClaims,
        require: &[RequirePath],
        tree: AtomicDir,
        metadata: Option<MetadataDir>,
    ) -> Self {
        let require = require.iter().filter(|r| claims.sees_path(r.as_str())).cloned().collect();
        let metadata = metadata.map(|dir| {
            let generations = read_generations(dir.path());
            (dir, generations)
        });
        ContainerWriters { claims, require, tree, metadata }
    }

    fn write(&mut self, res: &Resolution) -> Result<(), PublishError> {
        let own = for_container(res, &self.claims);
        let built = crate::model::tree::build(&own, &self.require);
        let mut failed = None;
        if let Some((dir, generations)) = self.metadata.as_mut().filter(|_| own.is_complete()) {
            let mut warnings = Vec::new();
            let view = metadata::build(&own, generations, &mut warnings);
            if let Err(e) = dir.write(&view) {
                failed = Some(PublishError::Metadata(e));
            }
        }
        if let Err(e) = self.tree.write(&built.tree) {
            self.tree.withdraw_ready();
            failed = Some(PublishError::Tree(e));
        }
        failed.map_or(Ok(()), Err)
    }
}

impl TreeWriters {
    /// The tree's output and the standard view's, if asked for (its
    /// directory taken for this writer: [`MetadataDir::open`]).
    pub fn new(tree: TreeOutput, metadata: Option<MetadataDir>) -> Self {
        // Generations go on from what is in the directory (a restart, or serve after init).
        let metadata = metadata.map(|dir| {
            let generations = read_generations(dir.path());
            (dir, generations)
        });
        TreeWriters { tree, metadata, containers: Vec::new() }
    }

    /// Write each container's own outputs too.
    pub fn with_containers(mut self, containers: Vec<ContainerWriters>) -> Self {
        self.containers = containers;
        self
    }

    /// Every tree written as files: the pod's, and each container's.
    fn atomic_dirs(&mut self) -> impl Iterator<Item = &mut AtomicDir> {
        let pods = match &mut self.tree {
            TreeOutput::Files(dir) => Some(dir),
            TreeOutput::Fuse(_) | TreeOutput::None => None,
        };
        pods.into_iter().chain(self.containers.iter_mut().map(|c| &mut c.tree))
    }

    /// Remove the superseded payloads of the trees whose time is up.
    pub fn tidy(&mut self) -> Result<(), PublishError> {
        let now = std::time::Instant::now();
        let mut failed = None;
        for dir in self.atomic_dirs() {
            if let Err(e) = dir.tidy(now) {
                failed = Some(PublishError::Tree(e));
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// When [`TreeWriters::tidy`] has something to do.
    pub fn next_tidy(&self) -> Option<std::time::Instant> {
        let pods = match &self.tree {
            TreeOutput::Files(dir) => dir.next_tidy(),
            TreeOutput::Fuse(_) | TreeOutput::None => None,
        };
        pods.into_iter().chain(self.containers.iter().filter_map(|c| c.tree.next_tidy())).min()
    }

    /// Write every output; one that fails does not keep the others from being written.
    pub fn publish(&mut self, res: &Resolution, built: &BuiltTree) -> Result<(), PublishError> {
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
            TreeOutput::None => {}
        }
        for container in &mut self.containers {
            if let Err(e) = container.write(res) {
                failed = Some(e);
            }
        }
        failed.map_or(Ok(()), Err)
    }
}

/// A readiness change, reported once the tree that carries it is written.
struct Report {
    transition: Transition,
    uid: Option<String>,
}

/// What a write off the runtime thread gives back (no publication: it tidied).
pub type Written = (TreeWriters, Option<Publication>, Result<(), PublishError>);

/// Writes trees off the runtime thread (a slow disk must not stall watches or
/// `/readyz`), one at a time: a publication that comes while a write runs
/// waits, and a newer one replaces it (the latest state wins), so a burst of
/// changes costs the write in progress and one more. A failed write is
/// retried with backoff. Readiness changes are reported to the log, the
/// metrics and the pod's Events from one place, once the tree that carries
/// them is written.
pub struct Outputs {
    /// None while a write runs (it has the writers).
    writers: Option<TreeWriters>,
    writing: Option<tokio::task::JoinHandle<Written>>,
    /// Reported when the write in progress is done.
    writing_reports: Vec<Report>,
    /// The newest publication not written yet.
    pending: Option<Publication>,
    pending_reports: Vec<Report>,
    metrics: Arc<Metrics>,
    events: Events,
    dir: PathBuf,
    /// Failed writes in a row, told at most once a minute (its publication is pending again).
    failing: FailureStreak,
    /// Files in the last tree written.
    files: usize,
    retry: RetryBackoff,
    retry_at: Option<Instant>,
    /// When superseded payloads are due for removal.
    tidy_at: Option<Instant>,
}

impl Outputs {
    pub fn new(writers: TreeWriters, metrics: Arc<Metrics>, events: Events, dir: &Path) -> Self {
        Outputs {
            writers: Some(writers),
            writing: None,
            writing_reports: Vec::new(),
            pending: None,
            pending_reports: Vec::new(),
            metrics,
            events,
            dir: dir.to_path_buf(),
            failing: FailureStreak::default(),
            files: 0,
            retry: RetryBackoff::default(),
            retry_at: None,
            tidy_at: None,
        }
    }

    /// Take a step's publication and transition: written at once if no write
    /// runs, else after it (replacing a publication still waiting).
    pub fn submit(&mut self, publication: Option<Publication>, transition: Option<Transition>, uid: Option<String>) {
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
        if self.writing.is_some() {
            return;
        }
        if self.retry_at.is_none() {
            if let Some(publication) = self.pending.take() {
                let dir = self.dir.clone();
                let Some(mut writers) = self.writers.take() else {
                    self.pending = Some(publication);
                    return;
                };
                self.writing_reports = std::mem::take(&mut self.pending_reports);
                self.writing = Some(tokio::task::spawn_blocking(move || {
                    slow_write_for_tests(&dir);
                    let result = writers.publish(&publication.resolution, &publication.built);
                    (writers, Some(publication), result)
                }));
                return;
            }
            for report in std::mem::take(&mut self.pending_reports) {
                self.report(report, self.files);
            }
        }
        // Superseded payloads whose time is up, even while a failed write waits for its retry.
        if self.tidy_at.is_some_and(|at| at <= Instant::now())
            && let Some(mut writers) = self.writers.take()
        {
            self.tidy_at = None;
            self.writing = Some(tokio::task::spawn_blocking(move || {
                let result = writers.tidy();
                (writers, None, result)
            }));
        }
    }

    /// Until the write in progress is done (forever when none runs).
    pub async fn write_done(&mut self) -> Option<Written> {
        Self::wait_for(&mut self.writing).await
    }

    async fn wait_for(writing: &mut Option<tokio::task::JoinHandle<Written>>) -> Option<Written> {
        match writing {
            Some(task) => {
                let written = task.await.ok();
                *writing = None;
                written
            }
            None => std::future::pending().await,
        }
    }

    /// A write is in progress.
    pub fn is_writing(&self) -> bool {
        self.writing.is_some()
    }

    /// When a failed write is tried again, if one failed.
    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// When [`Outputs::timer_fired`] has something to do: a retry, or
    /// superseded payloads to remove.
    pub fn timer_at(&self) -> Option<Instant> {
        match (self.retry_at, self.tidy_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Queue an Event on the pod (the run's outcome, say).
    pub fn record(&self, note: Note) {
        self.events.record(note);
    }

    /// The end of a stopped run: wait up to `limit` for a write under way, so
    /// that the tree is dropped (a FUSE tree unmounted) here and complete.
    pub async fn stop(mut self, limit: std::time::Duration) {
        if let Some(task) = self.writing.take()
            && tokio::time::timeout(limit, task).await.is_err()
        {
            warn!("a write still runs after {limit:?}: stopping without it");
        }
    }

    /// Send the Events still queued, as far as the API server lets them through.
    pub async fn finish(self) {
        self.events.finish().await;
    }

    /// A write ended: count it, report its transitions, and start the next one.
    pub fn finish_write(&mut self, written: Option<Written>) -> Result<(), PublishError> {
        let Some((writers, publication, result)) = written else {
            return Err(PublishError::WriterGone);
        };
        self.tidy_at = writers.next_tidy().map(Instant::from_std);
        self.writers = Some(writers);
        let Some(publication) = publication else {
            // A tidy: a payload that could not be removed is tried again at the next write.
            if let Err(e) = result {
                warn!("cannot remove a superseded tree: {e}");
            }
            self.start_next();
            return Ok(());
        };
        let built = &publication.built;
        let files = built.tree.len();
        match &result {
            Ok(()) => {
                self.files = files;
                self.metrics.tree_published(built.is_ready(), files, &built.missing);
                self.metrics.device_health(&publication.resolution);
                if self.failing.succeeded() {
                    info!("outputs written again");
                }
                self.retry.reset();
            }
            Err(e) => {
                self.metrics.not_ready(&[format!("output failed: {e}")]);
                let after = self.retry.next().unwrap_or_default();
                let first = !self.failing.is_failing();
                match self.failing.failed(std::time::Instant::now()) {
                    Some(1) => warn!("cannot write the outputs ({e}); retrying in {} ms", after.as_millis()),
                    Some(n) => warn!(
                        "still cannot write the outputs ({e}): {n} attempts failed since the last warning a minute ago; retrying in {} ms",
                        after.as_millis()
                    ),
                    None => debug!("cannot write the outputs ({e}); retrying in {} ms", after.as_millis()),
                }
                if first {
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

    /// The time of [`Outputs::timer_at`] came: retry a failed write, or tidy.
    pub fn timer_fired(&mut self) {
        if self.retry_at.is_some_and(|at| at <= Instant::now()) {
            self.retry_at = None;
        }
        self.start_next();
    }

    /// At the end of a run: write what is pending now (no retry is waited
    /// for) and wait for the writes; the first error, if any.
    pub async fn flush(&mut self) -> Result<(), PublishError> {
        let mut outcome = Ok(());
        self.retry_at = None;
        self.start_next();
        while self.writing.is_some() {
            let written = self.write_done().await;
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

/// Debug builds only (the tests' binary): with
/// `DRAFS_TEST_SLOW_WRITE=MS:PATH[:DIR]` every write (of a tree under DIR,
/// when given) creates PATH and then takes MS longer, so that a test can stop
/// drafs while a tree is being written.
fn slow_write_for_tests(dir: &Path) {
    #[cfg(debug_assertions)]
    if let Some((ms, rest)) = std::env::var("DRAFS_TEST_SLOW_WRITE").ok().as_deref().and_then(|v| v.split_once(':'))
        && let Ok(ms) = ms.parse::<u64>()
    {
        let (path, only) = match rest.split_once(':') {
            Some((path, only)) => (path, Some(Path::new(only))),
            None => (rest, None),
        };
        if only.is_none_or(|only| dir.starts_with(only)) {
            let _ = std::fs::write(path, b"");
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = dir;
}
