//! The pods this node serves: one home for their trees, whichever door they
//! came through (a CSI volume the kubelet publishes, `volumes`; the
//! containers the runtime creates through NRI, `nri`).
//!
//! Each tree lives in a slot: a tmpfs of drafs's (at the kubelet's target for
//! a volume, in the agent's own directory for a pod served through NRI) and
//! one `serve`-like run that keeps it current. Whatever the door, a pod holds
//! one place under the node's cap and its namespace's share ([`Places`]: a
//! pod with no claim gives its place back, one never ready makes room when
//! the node is full), each tmpfs is as large as [`Limits::room`] allows, the
//! same health and metrics count it, and no lock is held across slow work
//! for more than one slot (the node-wide table is held only to look a slot
//! up).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, warn};

use crate::engine::PodRef;
use crate::engine::drive::Progress;
use crate::engine::reconcile::{Mode, VANISHED_POOL_GRACE};
use crate::engine::run::{ContainerOutput, OutputSettings, Run, Sharing, Source, TreeBackend};
use crate::engine::shared::SharedSlices;
use crate::engine::source::Polling;
use crate::model::resolve::Selection;
use crate::model::tree::RequirePath;
use crate::node::credential::PodToken;
use crate::node::grpc::{Code, Status};
use crate::node::metrics::NodeMetrics;
use crate::node::mounts::{AtTarget, Mounts};
use crate::node::places::{PlaceLimits, Places, Taken};
use crate::publish::events::EventsMode;
use crate::publish::files::{DirTurns, Room, WriteError};

/// Longest an unpublish waits for the run to finish a write.
const STOP_WAIT: Duration = Duration::from_secs(5);
/// How long a pod whose tree was removed is remembered: the kubelet may
/// still be publishing another volume of that pod (it retries the refused
/// ones until the pod's containers are gone), and that one must not be served
/// to a pod on its way out. Longer than a publish the kubelet has under way.
const ENDED_MEMORY: Duration = Duration::from_secs(300);

/// What the node serves at most, whatever its pods ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Pods served at once, and of one namespace ([`Places`]): more are
    /// refused with `ResourceExhausted` until one goes.
    pub places: PlaceLimits,
    /// Each tree's tmpfs: bytes and inodes (the tree, the next one during a
    /// swap, and the superseded ones kept for readers).
    pub volume: Room,
}

impl Limits {
    /// The tmpfs of a slot: a tree's is [`Limits::volume`]; a standard view
    /// alone a quarter of it (one file per request, replaced in place:
    /// nothing superseded is kept); a pod served through NRI, whose
    /// containers' trees and standard views share one, all of it and a quarter.
    pub fn room(&self, kind: SlotKind) -> Room {
        let Room { bytes, inodes } = self.volume;
        match kind {
            SlotKind::Tree => self.volume,
            SlotKind::Standard => Room { bytes: bytes / 4, inodes: (inodes / 4).max(64) },
            SlotKind::Containers => Room { bytes: bytes + bytes / 4, inodes: inodes + inodes / 4 },
        }
    }
}

/// When a slot's run asks for its pod and claims.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// After the first publish, they are watched this long (what a driver
    /// reports when it prepares the device, and the first health reports, come then);
    pub watch_for: Duration,
    /// then asked again at a republish at most this often.
    pub refresh: Duration,
    /// A place whose tree was never ready is kept this long after the
    /// kubelet last asked for it, when another pod needs it
    /// ([`crate::node::places::PENDING_HOLD`]).
    pub pending_hold: Duration,
}

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    /// A CSI volume of the tree.
    Tree,
    /// A CSI volume of the standard view.
    Standard,
    /// A pod served through NRI: each container's tree and standard view.
    Containers,
}

impl SlotKind {
    pub fn name(self) -> &'static str {
        match self {
            SlotKind::Tree => "tree",
            SlotKind::Standard => "standard",
            SlotKind::Containers => "containers",
        }
    }
}

/// A slot's run.
pub(super) struct SlotRun {
    pub(super) progress: watch::Receiver<Progress>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    /// The pod's own token, when the run reads as the pod (a CSI volume).
    pub(super) token: Option<PodToken>,
    /// When the slot's poke was last sent for a refresh.
    pub(super) poked: Instant,
}

impl SlotRun {
    pub(super) fn is_serving(&self) -> bool {
        !self.task.is_finished() && !matches!(*self.progress.borrow(), Progress::Failed(_))
    }

    /// Stop the run (a write under way is finished) and wait for it, at most
    /// [`STOP_WAIT`]: a write still running then ends on its own, holding
    /// the tree's turn so that the next run's first write waits for it.
    pub(super) async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(STOP_WAIT, &mut self.task).await.is_err() {
            self.task.abort();
        }
    }
}

/// One tree: fixed when it is made, its state behind a lock of its own.
pub(super) struct Slot {
    /// The CSI volume id, or for a pod served through NRI `nri/<uid>`.
    pub(super) key: String,
    /// Where its tmpfs is mounted.
    pub(super) target: PathBuf,
    pub(super) pod_uid: String,
    /// `namespace/name`.
    pub(super) pod: String,
    pub(super) kind: SlotKind,
    /// The label the kubelet asked the volume's files to have (`Publish::selinux_context`).
    pub(super) selinux_context: Option<String>,
    /// Asks the slot's run, whichever it is, to read its pod and claims again
    /// (once its own watches are parked).
    pub(super) poke: watch::Sender<u64>,
    /// Its pod's place was given to another pod: it is being torn down.
    pub(super) reclaimed: AtomicBool,
    /// Its tree is final (the pod has no claim): served without a run or a place.
    pub(super) settled: AtomicBool,
    pub(super) state: tokio::sync::Mutex<SlotState>,
}

#[derive(Default)]
pub(super) struct SlotState {
    /// The tree's lock, held from the mount until the slot goes and lent to each run.
    pub(super) turns: Option<Arc<DirTurns>>,
    pub(super) run: Option<SlotRun>,
    /// Gone: a call that waited for this slot must look again.
    pub(super) gone: bool,
}

impl Slot {
    pub(super) fn new(key: String, target: PathBuf, pod: &PodRef, uid: &str, kind: SlotKind) -> Slot {
        Slot {
            key,
            target,
            pod_uid: uid.to_string(),
            pod: format!("{}/{}", pod.namespace, pod.name),
            kind,
            selinux_context: None,
            poke: watch::Sender::new(0),
            reclaimed: AtomicBool::new(false),
            settled: AtomicBool::new(false),
            state: Default::default(),
        }
    }

    /// The name of the pod's volume (`.../kubernetes.io~csi/<name>/mount`).
    pub(super) fn volume_name(&self) -> String {
        self.target.parent().and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }

    pub(super) fn is_reclaimed(&self) -> bool {
        self.reclaimed.load(Ordering::Acquire)
    }

    pub(super) fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }
}

/// The node-wide table.
pub(super) struct Table {
    /// Every slot, by key.
    pub(super) slots: HashMap<String, Arc<Slot>>,
    /// Who holds the node's places (a pod's slots share one).
    pub(super) places: Places,
    /// Pods whose tree was removed lately, by pod uid.
    pub(super) ended: HashMap<String, Ended>,
}

/// A pod's slot removed (its volume unpublished, its sandbox removed): no
/// other slot of that pod is made after it.
pub(super) struct Ended {
    pub(super) key: String,
    pub(super) volume_name: String,
    pub(super) pod: String,
    at: Instant,
}

impl Table {
    /// Report the slots, the pods they belong to, and the places held.
    fn report(&self, metrics: &NodeMetrics) {
        let pods: std::collections::HashSet<&str> = self.slots.values().map(|s| s.pod_uid.as_str()).collect();
        metrics.served(self.slots.len(), pods.len());
        metrics.places(self.places.counts());
    }

    /// Give `uid`'s place back if none of its slots is left.
    fn release_if_unused(&mut self, uid: &str) {
        if !self.slots.values().any(|s| s.pod_uid == uid) {
            self.places.release(uid);
        }
    }

    /// Remember that `slot` was removed, forgetting what is older than [`ENDED_MEMORY`].
    fn ended(&mut self, slot: &Slot, now: Instant) {
        self.ended.retain(|_, e| now.duration_since(e.at) < ENDED_MEMORY);
        let ended = Ended { key: slot.key.clone(), volume_name: slot.volume_name(), pod: slot.pod.clone(), at: now };
        self.ended.insert(slot.pod_uid.clone(), ended);
    }

    /// The slot removed lately of pod `uid`, if any.
    pub(super) fn ended_of(&mut self, uid: &str, now: Instant) -> Option<&Ended> {
        self.ended.retain(|_, e| now.duration_since(e.at) < ENDED_MEMORY);
        self.ended.get(uid)
    }
}

/// How a slot's run is made.
pub(super) struct RunSpec {
    /// The client it reads with (the pod's token in it, or the agent's own).
    pub(super) client: kube::Client,
    pub(super) token: Option<PodToken>,
    pub(super) pod: PodRef,
    pub(super) selection: Selection,
    pub(super) require: Vec<RequirePath>,
    pub(super) backend: TreeBackend,
    pub(super) metadata_dir: Option<PathBuf>,
    pub(super) metadata_from_drivers: Vec<String>,
    pub(super) containers: Vec<ContainerOutput>,
    /// How long its pod and claims are watched before they are only asked when poked.
    pub(super) watch_for: Duration,
}

/// Every slot of this node.
pub struct Served<M: Mounts> {
    pub(super) kubelet_dir: PathBuf,
    /// The API server without credentials, shared by every run that reads as
    /// its pod (each adds its pod's token).
    pub(super) shared: kube::Client,
    /// The node's slices, one watch for every slot (read as the agent).
    pub(super) slices: Arc<SharedSlices>,
    pub(super) timing: Timing,
    pub(super) limits: Limits,
    pub(super) mounts: M,
    pub(super) metrics: Arc<NodeMetrics>,
    /// Held only to look up, add or remove a slot; never across a wait.
    table: std::sync::Mutex<Table>,
}

impl<M: Mounts> Served<M> {
    /// `shared` must carry no credentials: every request gets its pod's token.
    pub fn new(
        kubelet_dir: PathBuf,
        shared: kube::Client,
        slices: Arc<SharedSlices>,
        timing: Timing,
        limits: Limits,
        mounts: M,
        metrics: Arc<NodeMetrics>,
    ) -> Arc<Self> {
        Arc::new(Served {
            kubelet_dir,
            shared,
            slices,
            timing,
            limits,
            mounts,
            metrics,
            table: std::sync::Mutex::new(Table {
                slots: HashMap::new(),
                places: Places::new(limits.places, timing.pending_hold),
                ended: HashMap::new(),
            }),
        })
    }

    pub fn kubelet_dir(&self) -> &Path {
        &self.kubelet_dir
    }

    pub(super) fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot at `key`, if any.
    pub(super) fn slot(&self, key: &str) -> Option<Arc<Slot>> {
        self.table().slots.get(key).cloned()
    }

    /// Add `slot`, with a call on its pod's place; the pods whose places
    /// were taken back for it. `namespace`: its pod's. A slot made at its
    /// key meanwhile (two calls for one tree at once) is the one returned.
    pub(super) fn add_slot(&self, slot: Slot, namespace: &str) -> Result<SlotFor<'_, M>, Status> {
        let mut table = self.table();
        if let Some(existing) = table.slots.get(&slot.key).cloned() {
            drop(table);
            return self.call_on(existing, namespace);
        }
        let (call, taken) = self.place_call(&mut table, &slot.pod_uid, namespace)?;
        let slot = Arc::new(slot);
        table.slots.insert(slot.key.clone(), slot.clone());
        table.report(&self.metrics);
        Ok((slot, Some(call), taken))
    }

    /// A call on the place of `slot`'s pod (none for a settled slot), the
    /// slot found at its key.
    pub(super) fn call_on(&self, slot: Arc<Slot>, namespace: &str) -> Result<SlotFor<'_, M>, Status> {
        if slot.is_reclaimed() {
            return Err(reclaimed_status());
        }
        if slot.is_settled() {
            return Ok((slot, None, Vec::new()));
        }
        let mut table = self.table();
        let (call, taken) = self.place_call(&mut table, &slot.pod_uid, namespace)?;
        Ok((slot, Some(call), taken))
    }

    /// A call on pod `uid`'s place ([`Places::call`]): the pods whose
    /// places were taken back are marked for their tear-down at once.
    fn place_call(&self, table: &mut Table, uid: &str, namespace: &str) -> Result<(PlaceCall<'_, M>, Taken), Status> {
        let taken = table.places.call(uid, namespace, Instant::now()).map_err(|refusal| {
            self.metrics.refused(refusal.reason());
            Status::new(Code::ResourceExhausted, refusal.to_string())
        })?;
        for slot in table.slots.values().filter(|s| taken.contains(&s.pod_uid)) {
            slot.reclaimed.store(true, Ordering::Release);
        }
        if !taken.is_empty() {
            self.metrics.reclaimed(taken.len());
        }
        table.report(&self.metrics);
        Ok((PlaceCall { served: self, uid: uid.to_string(), ready: false }, taken))
    }

    /// The pod has no claim: its tree is final. The run stops, the tree
    /// stays, and the pod's place is given back.
    pub(super) async fn settle(&self, slot: &Arc<Slot>) {
        let mut state = slot.state.lock().await;
        if state.gone || slot.settled.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(run) = state.run.take() {
            run.stop().await;
        }
        info!("the pod has no claim: its (empty) tree is final, served without a run or a place under --max-pods");
        let mut table = self.table();
        table.places.release(&slot.pod_uid);
        table.report(&self.metrics);
    }

    /// Tear down the slots of pods whose places were given to another:
    /// their trees were never ready (no container reads them), and their
    /// door asks for them again later.
    pub(super) async fn tear_down(&self, pods: Taken) {
        for uid in pods {
            let slots: Vec<Arc<Slot>> = self.table().slots.values().filter(|s| s.pod_uid == uid).cloned().collect();
            for slot in slots {
                if let Err(e) = self.remove(&slot, false).await {
                    warn!(pod = %slot.pod, slot = %slot.key, "its place was given to another pod, but: {}", e.message);
                }
                info!(pod = %slot.pod, slot = %slot.key, "its tree was never ready and nothing had asked for it for {} s: its place went to another pod", self.timing.pending_hold.as_secs_f64());
            }
        }
    }

    /// Remove `slot`: stop its run, unmount drafs's tmpfs, remove the
    /// directory, forget it (`ended`: and remember its pod went).
    pub(super) async fn remove(&self, slot: &Arc<Slot>, ended: bool) -> Result<(), Status> {
        let mut state = slot.state.lock().await;
        if let Some(run) = state.run.take() {
            run.stop().await;
        }
        state.turns = None;
        state.gone = true;
        self.forget(slot, ended);
        self.remove_target(&slot.target)
    }

    /// Take `slot` out of the table, if it is still the one there, and
    /// remember its pod if it `ended`.
    pub(super) fn forget(&self, slot: &Arc<Slot>, ended: bool) {
        let mut table = self.table();
        if table.slots.get(&slot.key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            table.slots.remove(&slot.key);
            table.release_if_unused(&slot.pod_uid);
            if ended {
                table.ended(slot, Instant::now());
            }
        }
        table.report(&self.metrics);
    }

    /// The slot's tmpfs mounted and its lock taken, if not yet: the lock.
    /// Nothing stays of a mount that cannot be locked.
    pub(super) fn mounted(&self, slot: &Slot, state: &mut SlotState) -> Result<Arc<DirTurns>, Status> {
        if let Some(turns) = &state.turns {
            return Ok(turns.clone());
        }
        let made = self.mount(&slot.target, self.limits.room(slot.kind), slot.selinux_context.as_deref())?;
        let turns = DirTurns::take(&slot.target).inspect_err(|_| {
            if made {
                // Nothing may stay of a refused call: nobody removes it after a final error.
                let _ = self.remove_target(&slot.target);
            }
        });
        let turns = turns.map_err(|e| match e {
            WriteError::Busy { .. } => Status::new(
                Code::Unavailable,
                format!("{e}: another drafs agent on this node still serves the tree (one being replaced?)"),
            ),
            e => Status::new(Code::Internal, e.to_string()),
        })?;
        state.turns = Some(turns.clone());
        Ok(turns)
    }

    /// Remove the tree at `target` left by an earlier agent, unless a slot
    /// is at `key` (made or taken back by this one): a slot standing for the
    /// removal is at the key meanwhile, so that nothing makes one there
    /// until the tree is gone. Whether it was removed.
    pub(super) fn remove_left_over(&self, key: &str, target: &Path, pod: &PodRef, uid: &str) -> Result<bool, Status> {
        let slot = {
            let mut table = self.table();
            if table.slots.contains_key(key) {
                return Ok(false);
            }
            let slot = Arc::new(Slot::new(key.to_string(), target.to_path_buf(), pod, uid, SlotKind::Containers));
            slot.reclaimed.store(true, Ordering::Release);
            table.slots.insert(key.to_string(), slot.clone());
            slot
        };
        let removed = self.remove_target(target);
        self.forget(&slot, false);
        removed.map(|()| true)
    }

    /// Unmount drafs's tmpfs at `target` and remove the directory.
    pub(super) fn remove_target(&self, target: &Path) -> Result<(), Status> {
        match self.mounts.at(target).map_err(|e| internal("read the mount table", target, e))? {
            AtTarget::Ours => self.mounts.unmount(target).map_err(|e| internal("unmount", target, e))?,
            AtTarget::Nothing => {}
            AtTarget::Foreign => {
                return Err(Status::new(
                    Code::FailedPrecondition,
                    format!("{} holds a mount drafs did not make; it is left as it is", target.display()),
                ));
            }
        }
        match std::fs::remove_dir(target) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            // Files under the mount point are not drafs's (it writes only in
            // its tmpfs): left as they are, and the pod not held up for them.
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
                warn!(target = %target.display(), "left in place: files under the mount point that drafs did not write");
                Ok(())
            }
            Err(e) => Err(internal("remove", target, e)),
        }
    }

    /// A tmpfs of drafs's at `target`: made (true), or found (the agent restarted).
    fn mount(&self, target: &Path, room: Room, selinux_context: Option<&str>) -> Result<bool, Status> {
        match self.mounts.at(target).map_err(|e| internal("read the mount table", target, e))? {
            AtTarget::Ours => Ok(false),
            AtTarget::Foreign => Err(Status::new(
                Code::FailedPrecondition,
                format!("{} holds a mount drafs did not make", target.display()),
            )),
            AtTarget::Nothing => {
                std::fs::create_dir_all(target).map_err(|e| internal("create", target, e))?;
                let what = match selinux_context {
                    Some(label) => format!("mount a tmpfs labelled {label:?} (the kubelet's SELinux context) at"),
                    None => "mount a tmpfs at".into(),
                };
                self.mounts.mount_tmpfs(target, room, selinux_context).map_err(|e| internal(&what, target, e))?;
                Ok(true)
            }
        }
    }

    /// Stop every run, leaving the trees mounted and readable (the agent stops
    /// or is upgraded; each is taken over again by the next agent).
    pub async fn stop_all(&self) {
        let slots: Vec<Arc<Slot>> = self.table().slots.drain().map(|(_, s)| s).collect();
        futures::future::join_all(slots.iter().map(|slot| async move {
            let mut state = slot.state.lock().await;
            state.gone = true;
            if let Some(run) = state.run.take() {
                run.stop().await;
            }
        }))
        .await;
    }

    /// A pod's device status changed (the node's pod watch saw it): its
    /// slots' runs read the pod and its claims again. Pods not served are
    /// not drafs's business.
    pub fn status_changed(&self, pod_uid: &str) {
        let slots: Vec<Arc<Slot>> = self.table().slots.values().filter(|s| s.pod_uid == pod_uid).cloned().collect();
        if slots.is_empty() {
            return;
        }
        self.metrics.status_changed();
        for slot in slots {
            debug!(pod = %slot.pod, slot = %slot.key, "device status changed: read again");
            slot.poke.send_modify(|n| *n += 1);
        }
    }

    /// The slots, and how many of their runs have failed.
    pub fn census(&self) -> (usize, usize) {
        let slots: Vec<Arc<Slot>> = self.table().slots.values().cloned().collect();
        let failing = slots
            .iter()
            .filter(|s| s.state.try_lock().is_ok_and(|state| state.run.as_ref().is_some_and(|r| !r.is_serving())))
            .count();
        (slots.len(), failing)
    }

    /// The slots' tmpfs mounts (their usage is a metric).
    pub fn targets(&self) -> Vec<PathBuf> {
        self.table().slots.values().map(|s| s.target.clone()).collect()
    }

    /// Start the run that keeps `slot`'s tree current.
    pub(super) fn start(&self, slot: &Slot, spec: RunSpec, turns: Arc<DirTurns>) -> SlotRun {
        let (tx, progress) = watch::channel(Progress::Starting);
        let (stop, stopped) = oneshot::channel();
        let polling = Polling { poke: slot.poke.subscribe(), live_until: (Instant::now() + spec.watch_for).into() };
        let sharing = Some(Sharing { slices: self.slices.clone(), polling });
        let publishing = OutputSettings {
            backend: spec.backend,
            dir: slot.target.clone(),
            metadata_dir: spec.metadata_dir,
            metadata_from_drivers: spec.metadata_from_drivers,
            require: spec.require,
            metrics_addr: None,
            events: EventsMode::Warnings,
            turns: Some(turns),
            pool_grace: VANISHED_POOL_GRACE,
            containers: spec.containers,
        };
        let source = Source::Connected { client: spec.client, pod: spec.pod, uid: Some(slot.pod_uid.clone()), sharing };
        let selection = spec.selection;
        let task = tokio::spawn(
            async move {
                let started = Run::publishing(&source, Mode::Follow, selection, Duration::ZERO, &publishing).await;
                let mut run = match started {
                    Ok(run) => run,
                    Err(e) => {
                        warn!("cannot start: {e}");
                        tx.send_replace(Progress::Failed(e.to_string()));
                        return;
                    }
                };
                run.report_to(tx.clone());
                tokio::pin!(stopped);
                let ended = tokio::select! {
                    result = run.drive() => result,
                    _ = &mut stopped => {
                        run.stop().await;
                        return;
                    }
                };
                let message = match ended {
                    Ok(_) => "the run ended".to_string(),
                    Err(e) => e.to_string(),
                };
                warn!("stopped serving: {message}");
                tx.send_replace(Progress::Failed(message));
                run.finish().await;
            }
            .in_current_span(),
        );
        info!(target = %slot.target.display(), kind = slot.kind.name(), "serving");
        SlotRun { progress, stop: Some(stop), task, token: spec.token, poked: Instant::now() }
    }
}

/// The node's pod watch, for CSI volumes alone: a device-status change has
/// the pod's runs read again.
impl<M: Mounts> crate::node::node_pods::NodePods for Arc<Served<M>> {
    fn status_changed(&self, uid: &str) {
        Served::status_changed(self, uid);
    }
}

pub(super) fn internal(op: &str, path: &Path, e: std::io::Error) -> Status {
    Status::new(Code::Internal, format!("cannot {op} {}: {e}", path.display()))
}

/// How a call was answered with a ready tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Published {
    /// Live from here on.
    Live,
    /// The pod has no claim: the (empty) tree is final.
    NothingToServe,
}

/// Until the run has written a ready tree, it failed, or `wait` passed.
pub(super) async fn wait_published(
    mut progress: watch::Receiver<Progress>,
    wait: Duration,
) -> Result<Published, Status> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match &*progress.borrow_and_update() {
            Progress::Published => return Ok(Published::Live),
            Progress::NothingToServe => return Ok(Published::NothingToServe),
            Progress::Failed(message) => {
                return Err(Status::new(Code::Unavailable, format!("drafs cannot serve the pod's devices: {message}")));
            }
            Progress::Starting | Progress::Waiting(_) => {}
        }
        match tokio::time::timeout_at(deadline, progress.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(Status::new(Code::Unavailable, "drafs stopped serving the pod's devices")),
            Err(_) => break,
        }
    }
    let waiting = match &*progress.borrow() {
        Progress::Waiting(missing) => missing.join("; "),
        _ => "no answer from the API server yet".to_string(),
    };
    Err(Status::new(Code::Unavailable, format!("drafs is waiting for the pod's devices: {waiting}")))
}

/// The answer to a call of a pod whose place went to another pod.
pub(super) fn reclaimed_status() -> Status {
    Status::new(
        Code::Unavailable,
        "drafs gave this pod's place to another pod while the node was full: its tree was never ready and nothing had asked for it a while; it takes a place again at the next call if one is free",
    )
}

/// A slot, the call on its pod's place (none for a settled slot), and the
/// pods whose places were taken back for it.
pub(super) type SlotFor<'a, M> = (Arc<Slot>, Option<PlaceCall<'a, M>>, Taken);

/// A call on a pod's place, counted until it is dropped
/// ([`Places::call_ended`]): a place is never taken back while a call on
/// it is under way.
pub(super) struct PlaceCall<'a, M: Mounts> {
    served: &'a Served<M>,
    uid: String,
    /// The call answered with a ready tree.
    pub(super) ready: bool,
}

impl<M: Mounts> Drop for PlaceCall<'_, M> {
    fn drop(&mut self) {
        let mut table = self.served.table();
        table.places.call_ended(&self.uid, self.ready, Instant::now());
        table.report(&self.served.metrics);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_answers_when_the_tree_is_written_or_says_what_is_missing() {
        let (tx, rx) = watch::channel(Progress::Starting);
        tx.send_replace(Progress::Waiting(vec!["claim gpu not allocated yet".into()]));
        let err = wait_published(rx.clone(), Duration::from_millis(10)).await.unwrap_err();
        assert_eq!(err.code, Code::Unavailable);
        assert!(err.message.ends_with("claim gpu not allocated yet"), "{}", err.message);

        let waiting = tokio::spawn(wait_published(rx.clone(), Duration::from_secs(60)));
        tx.send_replace(Progress::Published);
        assert_eq!(waiting.await.unwrap(), Ok(Published::Live));
        tx.send_replace(Progress::NothingToServe);
        assert_eq!(wait_published(rx.clone(), Duration::ZERO).await, Ok(Published::NothingToServe));

        tx.send_replace(Progress::Failed("forbidden".into()));
        assert!(wait_published(rx.clone(), Duration::ZERO).await.unwrap_err().message.contains("forbidden"));
        drop(tx);
        let (tx, rx) = watch::channel(Progress::Starting);
        drop(tx);
        assert_eq!(wait_published(rx, Duration::from_secs(60)).await.unwrap_err().code, Code::Unavailable);
    }

    #[test]
    fn a_pod_served_through_nri_has_room_for_its_trees_and_standard_views() {
        let limits = Limits {
            places: PlaceLimits { max_pods: 1, per_namespace: 1 },
            volume: Room { bytes: 12 << 20, inodes: 4096 },
        };
        assert_eq!(limits.room(SlotKind::Tree), limits.volume);
        assert_eq!(limits.room(SlotKind::Standard), Room { bytes: 3 << 20, inodes: 1024 });
        assert_eq!(limits.room(SlotKind::Containers), Room { bytes: 15 << 20, inodes: 5120 });
    }
}
