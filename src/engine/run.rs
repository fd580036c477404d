//! One run, whichever the source: the metrics, the outputs (tree, standard
//! view, Events), the source of the inputs (the API server or a file) and
//! the reconciler, wired once for every command that resolves (`init`,
//! `serve`, `get`, `exec`). The commands only turn flags into a [`Source`]
//! and an [`OutputSettings`], and a [`RunError`] into an exit code.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::{Instrument, info, info_span};

use kube::Client;
use tokio::sync::watch;

use crate::engine::PodRef;
use crate::engine::drive::{self, DriveError, Feed, Progress};
use crate::engine::file::{FileFeed, FileSource};
use crate::engine::reconcile::{Action, Input, Mode, Objects, Reconciler};
use crate::engine::shared::SharedSlices;
use crate::engine::source::{ApiFeed, NoCredentials, Polling, connect};
use crate::model::objects::LoadError;
use crate::model::resolve::{ContainerClaims, Resolution, Selection};
use crate::model::tree::RequirePath;
use crate::publish::events::{self, Events, EventsMode, Note};
use crate::publish::files::{AtomicDir, DirTurns, RETENTION, Retention, WriteError};
use crate::publish::fuse::{FuseError, FuseMount};
use crate::publish::metadata_dir::{DriverOwned, MetadataDir, MetadataDirError};
use crate::publish::metrics::{self, Metrics};
use crate::publish::outputs::{ContainerWriters, Outputs, TreeOutput, TreeWriters};

/// How long a stop waits for a write under way (the kubelet's grace period is
/// 30 s by default).
pub const STOP_WRITE_LIMIT: Duration = Duration::from_secs(10);

/// Where the pod's objects come from.
#[derive(Clone)]
pub enum Source {
    /// A file of objects (`-`: standard input), and which of its pods.
    File { path: PathBuf, pod_name: Option<String> },
    /// The API server, with the cluster's credentials.
    Api {
        pod_name: String,
        /// None: the kubeconfig context's.
        namespace: Option<String>,
    },
    /// The API server through a client the caller made (the node agent's,
    /// with a pod's own token), and the pod (only the one with `uid`, when
    /// given); slices shared with other runs.
    Connected { client: Client, pod: PodRef, uid: Option<String>, sharing: Option<Sharing> },
}

/// What a run of the node agent shares with the others on its node: the
/// slices, from one hub; and its pod and claims, asked when poked.
#[derive(Clone)]
pub struct Sharing {
    pub slices: Arc<SharedSlices>,
    pub polling: Polling,
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::File { path, pod_name } => {
                f.debug_struct("File").field("path", path).field("pod_name", pod_name).finish()
            }
            Source::Api { pod_name, namespace } => {
                f.debug_struct("Api").field("pod_name", pod_name).field("namespace", namespace).finish()
            }
            Source::Connected { pod, .. } => f.debug_struct("Connected").field("pod", pod).finish_non_exhaustive(),
        }
    }
}

/// How the tree is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeBackend {
    /// Files swapped in atomically.
    Files,
    /// A FUSE mount.
    Fuse,
    /// No tree: the standard view alone (`metadata_dir`, a node volume of
    /// `view: standard`).
    None,
}

/// Where and how a run publishes (`init`, `serve`).
#[derive(Debug, Clone)]
pub struct OutputSettings {
    pub backend: TreeBackend,
    pub dir: PathBuf,
    pub metadata_dir: Option<PathBuf>,
    pub metadata_from_drivers: Vec<String>,
    pub require: Vec<RequirePath>,
    pub metrics_addr: Option<SocketAddr>,
    pub events: EventsMode,
    /// The tree directory's lock, held by the caller and lent to this run
    /// (the node agent's volume, whose runs take turns on one tree); None:
    /// the run takes the lock itself.
    pub turns: Option<Arc<DirTurns>>,
    /// How long a followed tree outlives the pools of its devices
    /// ([`crate::engine::reconcile::VANISHED_POOL_GRACE`] by default).
    pub pool_grace: Duration,
    /// Each container's own tree and standard view, beside the pod's (the
    /// node agent's NRI mounts; they take turns on `turns`).
    pub containers: Vec<ContainerOutput>,
}

/// Where one container's own outputs go.
#[derive(Debug, Clone)]
pub struct ContainerOutput {
    pub claims: ContainerClaims,
    pub tree_dir: PathBuf,
    /// Its standard view, if the pod asks for one; the drivers that write
    /// their own files there, which the caller may add to.
    pub metadata: Option<(PathBuf, DriverOwned)>,
}

/// Why a run could not start, or ended without a result.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No usable cluster credentials (a usage error for the commands).
    #[error(transparent)]
    Credentials(#[from] NoCredentials),
    #[error("cannot serve metrics on {addr}: {source}")]
    MetricsAddr { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    File(#[from] LoadError),
    #[error("tree: {0}")]
    Tree(#[from] WriteError),
    #[error(transparent)]
    Fuse(#[from] FuseError),
    #[error(transparent)]
    Metadata(#[from] MetadataDirError),
    #[error(transparent)]
    Drive(#[from] DriveError),
    /// Containers' outputs share one directory's lock, which the caller holds.
    #[error("containers' outputs need the lock of the directory they share")]
    ContainersWithoutTurns,
}

impl RunError {
    /// What the command was given cannot work (credentials, the metrics
    /// address): a usage error, not a failure of the run.
    pub fn is_usage(&self) -> bool {
        matches!(self, RunError::Credentials(_) | RunError::MetricsAddr { .. })
    }
}

/// The inputs of a run: the API server's answers, or a file's.
/// (One per run, made once: the sizes of the two variants do not matter.)
#[allow(clippy::large_enum_variant)]
enum Inputs {
    Api(ApiFeed),
    File(FileFeed),
}

impl Feed for Inputs {
    fn execute(&mut self, actions: Vec<Action>) {
        match self {
            Inputs::Api(engine) => Feed::execute(engine, actions),
            Inputs::File(file) => file.execute(actions),
        }
    }

    async fn next_batch(&mut self) -> Vec<Input> {
        match self {
            Inputs::Api(engine) => Feed::next_batch(engine).await,
            Inputs::File(file) => file.next_batch().await,
        }
    }

    fn clear_deadline(&mut self) {
        if let Inputs::Api(engine) = self {
            engine.clear_deadline();
        }
    }

    fn objects(&self) -> Objects {
        match self {
            Inputs::Api(engine) => engine.objects(),
            Inputs::File(file) => file.objects(),
        }
    }
}

/// One run: its inputs, the reconciler, and (when it publishes) the outputs.
pub struct Run {
    inputs: Inputs,
    reconciler: Reconciler,
    /// What every line the run logs is about: the pod it serves (a node
    /// agent's log holds many) and its mode.
    span: tracing::Span,
    outputs: Option<Outputs>,
    mount_id: Option<u64>,
    progress: Option<watch::Sender<Progress>>,
}

/// One container's writers, taking turns on the lock of the directory its outputs are in.
fn container_writers(c: &ContainerOutput, require: &[RequirePath], turns: &Arc<DirTurns>) -> ContainerWriters {
    let tree = AtomicDir::taking_turns(&c.tree_dir, turns.clone()).with_retention(RETENTION);
    let metadata =
        c.metadata.as_ref().map(|(dir, owned)| MetadataDir::sharing_owners(dir, owned.clone(), turns.clone()));
    ContainerWriters::new(c.claims.clone(), require, tree, metadata)
}

impl Run {
    /// Resolve once, without waiting for what is missing, and publish nothing (`get`, `exec`).
    pub async fn resolve_once(
        source: &Source,
        selection: Selection,
        timeout: Duration,
    ) -> Result<Resolution, RunError> {
        let mut run = Run::wire(source, Mode::Once, selection, timeout, Vec::new(), None).await?;
        Ok(run.drive().await?)
    }

    /// Take the outputs (metrics address, tree directory or mount point, the
    /// standard view's directory), then read the file or connect, and wire a
    /// reconciler in `mode` (`init`: until ready; `serve`: follow).
    pub async fn publishing(
        source: &Source,
        mode: Mode,
        selection: Selection,
        timeout: Duration,
        out: &OutputSettings,
    ) -> Result<Run, RunError> {
        let metrics = Arc::new(Metrics::default());
        if let Some(addr) = out.metrics_addr {
            let listener = metrics::bind(addr).await.map_err(|source| RunError::MetricsAddr { addr, source })?;
            tokio::spawn(metrics::serve(listener, metrics.clone()));
        }
        let tree = match out.backend {
            TreeBackend::Fuse => TreeOutput::Fuse(FuseMount::mount(&out.dir, Some(metrics.clone()))?),
            TreeBackend::Files => {
                let dir = match &out.turns {
                    Some(turns) => AtomicDir::taking_turns(&out.dir, turns.clone()),
                    None => AtomicDir::open(&out.dir)?,
                };
                // `init` writes before the app starts and exits: nobody is
                // inside a tree it replaces, so it keeps none.
                let retention = if mode == Mode::Follow { RETENTION } else { Retention::NONE };
                TreeOutput::Files(dir.with_retention(retention))
            }
            TreeBackend::None => TreeOutput::None,
        };
        let mount_id = match &tree {
            TreeOutput::Fuse(m) => m.mount_id(),
            TreeOutput::Files(_) | TreeOutput::None => None,
        };
        let from_drivers = out.metadata_from_drivers.iter().cloned();
        let metadata = match (&out.metadata_dir, &out.turns) {
            // The lent lock is the standard view's when there is no tree.
            (Some(d), Some(turns)) if out.backend == TreeBackend::None => {
                Some(MetadataDir::taking_turns(d, from_drivers, turns.clone()))
            }
            (Some(d), _) => Some(MetadataDir::open(d, from_drivers)?),
            (None, _) => None,
        };
        let containers = match (&out.turns, out.containers.is_empty()) {
            (_, true) => Vec::new(),
            (Some(turns), false) => out.containers.iter().map(|c| container_writers(c, &out.require, turns)).collect(),
            (None, false) => return Err(RunError::ContainersWithoutTurns),
        };
        let writers = TreeWriters::new(tree, metadata).with_containers(containers);
        let wired = (writers, metrics, out);
        let mut run = Run::wire(source, mode, selection, timeout, out.require.clone(), Some(wired)).await?;
        run.mount_id = mount_id;
        Ok(run)
    }

    async fn wire(
        source: &Source,
        mode: Mode,
        selection: Selection,
        timeout: Duration,
        require: Vec<RequirePath>,
        publish: Option<(TreeWriters, Arc<Metrics>, &OutputSettings)>,
    ) -> Result<Run, RunError> {
        let (inputs, reconciler, events, pod) = match source {
            Source::File { path, pod_name } => {
                let file = FileSource::read(path, pod_name.as_deref())?;
                let reconciler =
                    Reconciler::new(mode, file.pod.clone(), selection, require).reading(file.feed.objects());
                (Inputs::File(file.feed), reconciler, Events::none(), file.pod)
            }
            Source::Api { .. } | Source::Connected { .. } => {
                let (client, pod, uid, sharing) = match source {
                    Source::Connected { client, pod, uid, sharing } => {
                        (client.clone(), pod.clone(), uid.clone(), sharing.clone())
                    }
                    Source::Api { pod_name, namespace } => {
                        let (client, pod) = connect(pod_name.clone(), namespace.clone()).await?;
                        (client, pod, None, None)
                    }
                    Source::File { .. } => unreachable!("matched above"),
                };
                info!(pod = %format!("{}/{}", pod.namespace, pod.name), ?mode, "resolving");
                let events = match &publish {
                    Some((_, _, out)) => Events::start(client.clone(), pod.clone(), out.events),
                    None => Events::none(),
                };
                let metrics = publish.as_ref().map(|(_, m, _)| m.clone());
                let mut engine = ApiFeed::new(client, pod.clone(), drive::deadline(timeout)).with_metrics(metrics);
                if let Some(Sharing { slices, polling }) = sharing {
                    engine = engine.with_shared_slices(slices).with_polling(polling);
                }
                let mut reconciler = Reconciler::new(mode, pod.clone(), selection, require).expecting_uid(uid);
                if let Some((_, _, out)) = &publish {
                    reconciler = reconciler.keeping_gone_pools_for(out.pool_grace);
                }
                (Inputs::Api(engine), reconciler, events, pod)
            }
        };
        let outputs = publish.map(|(writers, metrics, out)| Outputs::new(writers, metrics, events, &out.dir));
        let span = info_span!("run", pod = %format!("{}/{}", pod.namespace, pod.name), ?mode);
        Ok(Run { inputs, reconciler, span, outputs, mount_id: None, progress: None })
    }

    /// The FUSE mount this run serves, by mount id.
    pub fn mount_id(&self) -> Option<u64> {
        self.mount_id
    }

    /// Tell `progress` where the run stands as it drives.
    pub fn report_to(&mut self, progress: watch::Sender<Progress>) {
        self.progress = Some(progress);
    }

    /// Drive until the run is done: a failed write ends a run that stops at
    /// ready (`init`); one that follows (`serve`) writes again later.
    pub async fn drive(&mut self) -> Result<Resolution, DriveError> {
        let until_ready = self.reconciler.mode() != Mode::Follow;
        let progress = self.progress.as_ref();
        drive::drive_reporting(&mut self.inputs, &mut self.reconciler, self.outputs.as_mut(), until_ready, progress)
            .instrument(self.span.clone())
            .await
    }

    /// Stop asking for inputs, record why the run failed on the pod, and send the Events.
    pub async fn fail(self, message: String) {
        let Run { inputs, reconciler, outputs, .. } = self;
        drop(inputs);
        if let Some(outputs) = outputs {
            outputs.record(Note { warning: true, reason: events::NOT_READY, message, uid: reconciler.pod_uid() });
            outputs.finish().await;
        }
    }

    /// Stopped by a signal: a write under way is finished (within
    /// [`STOP_WRITE_LIMIT`]) and the outputs dropped, so that a FUSE tree is
    /// unmounted here rather than left to the supervisor.
    pub async fn stop(self) {
        drop(self.inputs);
        if let Some(outputs) = self.outputs {
            outputs.stop(STOP_WRITE_LIMIT).await;
        }
    }

    /// Send the Events still queued.
    pub async fn finish(self) {
        drop(self.inputs);
        if let Some(outputs) = self.outputs {
            outputs.finish().await;
        }
    }
}
