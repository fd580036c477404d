//! The volumes the node agent published: for each, a tmpfs at the kubelet's
//! target and one `serve`-like run that keeps the pod's tree current there,
//! reading the API as the pod's own service account.
//!
//! A publish answers once the tree is written (the kubelet starts no container
//! before), or after [`PUBLISH_WAIT`] with what is still missing (the kubelet
//! shows it in the pod's events and calls again). Publishing is idempotent: a
//! second call for a volume finds its run; a refreshed token is swapped into
//! the run in place; a run that failed is started again on the same tree; a
//! tmpfs of drafs's already at the target (the agent restarted) is taken over
//! as it is, so the tree stays readable meanwhile.
//!
//! One tenant must not cost another its service: a pod gets one volume of each
//! view (the tree, the standard view), both in one place under the node's
//! cap and its namespace's share ([`Places`]: a pod with no claim gives its
//! place back, one never ready makes room when the node is full), no other
//! volume of a pod whose volume was unpublished (it is being deleted), each
//! tmpfs is as large as [`Limits::room`] allows, and no lock is held across
//! slow work for more than one volume (the node-wide table is held only to
//! look a volume up).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::engine::drive::Progress;
use crate::engine::reconcile::{Mode, VANISHED_POOL_GRACE};
use crate::engine::run::{OutputSettings, Run, Sharing, Source, TreeBackend};
use crate::engine::shared::SharedSlices;
use crate::engine::source::Polling;
use crate::node::credential::{PodToken, client_as};
use crate::node::grpc::{Code, Status};
use crate::node::metrics::NodeMetrics;
use crate::node::mounts::{AtTarget, Mounts};
use crate::node::places::{PlaceLimits, Places, Taken};
use crate::node::request::{Publish, View, volume_dir_pod};
use crate::publish::events::EventsMode;
use crate::publish::files::{DirTurns, Room, WriteError};

/// Longest a publish waits for the tree before it answers with what is
/// missing (the kubelet calls again, backing off from 0.5 s to 2 min).
pub const PUBLISH_WAIT: Duration = Duration::from_secs(20);
/// Longest an unpublish waits for the run to finish a write.
const STOP_WAIT: Duration = Duration::from_secs(5);
/// How long a pod whose volume was unpublished is remembered: the kubelet
/// may still be publishing another volume of that pod (it retries the refused
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
    /// The tmpfs of a volume of `view`: the tree's is [`Limits::volume`]; the
    /// standard view's a quarter of it (one file per request, replaced in
    /// place: nothing superseded is kept).
    pub fn room(&self, view: &View) -> Room {
        match view {
            View::Tree => self.volume,
            View::Standard { .. } => Room { bytes: self.volume.bytes / 4, inodes: (self.volume.inodes / 4).max(64) },
        }
    }
}

/// When a volume's run asks for its pod and claims.
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

/// A volume's run.
struct VolumeRun {
    progress: watch::Receiver<Progress>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    token: PodToken,
    /// When the slot's poke was last sent for a refresh.
    poked: Instant,
}

impl VolumeRun {
    fn is_serving(&self) -> bool {
        !self.task.is_finished() && !matches!(*self.progress.borrow(), Progress::Failed(_))
    }

    /// Stop the run (a write under way is finished) and wait for it, at most
    /// [`STOP_WAIT`]: a write still running then ends on its own, holding
    /// the tree's turn so that the next run's first write waits for it.
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(STOP_WAIT, &mut self.task).await.is_err() {
            self.task.abort();
        }
    }
}

/// One published volume: fixed at its first publish, its state behind a lock
/// of its own.
struct Slot {
    volume_id: String,
    target: PathBuf,
    pod_uid: String,
    pod: String,
    /// `tree` or `standard` ([`View::name`]): a pod has at most one of each.
    view: &'static str,
    /// Asks the slot's run, whichever it is, to read its pod and claims again
    /// (once its own watches are parked).
    poke: watch::Sender<u64>,
    /// Its pod's place was given to another pod: it is being torn down.
    reclaimed: AtomicBool,
    /// Its tree is final (the pod has no claim): served without a run or a place.
    settled: AtomicBool,
    state: tokio::sync::Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    /// The tree's lock, held from the mount until the unpublish and lent to each run.
    turns: Option<Arc<DirTurns>>,
    run: Option<VolumeRun>,
    /// Unpublished: a publish that waited for this slot must look again.
    gone: bool,
}

impl Slot {
    /// The name of the pod's volume (`.../kubernetes.io~csi/<name>/mount`).
    fn volume_name(&self) -> String {
        self.target.parent().and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }
}

/// The node-wide table.
struct Table {
    /// Every published volume, by volume id.
    slots: HashMap<String, Arc<Slot>>,
    /// Who holds the node's places (a pod's volumes share one).
    places: Places,
    /// Pods whose volume was unpublished lately, by pod uid.
    ended: HashMap<String, Ended>,
}

/// A pod's volume unpublished: no other volume of that pod is served after it.
struct Ended {
    volume_id: String,
    volume_name: String,
    pod: String,
    at: Instant,
}

impl Table {
    /// Report the volumes served, the pods they belong to, and the places held.
    fn report(&self, metrics: &NodeMetrics) {
        let pods: std::collections::HashSet<&str> = self.slots.values().map(|s| s.pod_uid.as_str()).collect();
        metrics.served(self.slots.len(), pods.len());
        metrics.places(self.places.counts());
    }

    /// Give `uid`'s place back if none of its volumes is left.
    fn release_if_unused(&mut self, uid: &str) {
        if !self.slots.values().any(|s| s.pod_uid == uid) {
            self.places.release(uid);
        }
    }

    /// Remember that `slot`'s volume was unpublished, forgetting what is older than [`ENDED_MEMORY`].
    fn ended(&mut self, slot: &Slot, now: Instant) {
        self.ended.retain(|_, e| now.duration_since(e.at) < ENDED_MEMORY);
        let ended = Ended {
            volume_id: slot.volume_id.clone(),
            volume_name: slot.volume_name(),
            pod: slot.pod.clone(),
            at: now,
        };
        self.ended.insert(slot.pod_uid.clone(), ended);
    }

    /// Refuse a new volume of a pod whose volume was unpublished lately.
    fn refuse_after_end(&mut self, p: &Publish, now: Instant) -> Result<(), Status> {
        self.ended.retain(|_, e| now.duration_since(e.at) < ENDED_MEMORY);
        match self.ended.get(&p.pod_uid) {
            Some(e) if e.volume_id != p.volume_id => Err(Status::new(
                Code::FailedPrecondition,
                format!(
                    "pod {}'s drafs volume ({:?}) was unpublished: the pod is going away, and drafs serves no other volume of it",
                    e.pod, e.volume_name
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// Every published volume of this node, by volume id.
pub struct Volumes<M: Mounts> {
    kubelet_dir: PathBuf,
    /// The API server without credentials, shared by every run (each adds its pod's token).
    shared: kube::Client,
    /// The node's slices, one watch for every volume (read as the agent).
    slices: Arc<SharedSlices>,
    timing: Timing,
    limits: Limits,
    mounts: M,
    metrics: Arc<NodeMetrics>,
    /// Held only to look up, add or remove a slot; never across a wait.
    table: std::sync::Mutex<Table>,
}

impl<M: Mounts> Volumes<M> {
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
        Arc::new(Volumes {
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

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publish `p`, waiting at most `wait` for its tree.
    pub async fn publish(&self, p: Publish, wait: Duration) -> Result<(), Status> {
        let span = info_span!("volume", pod = %format!("{}/{}", p.pod.namespace, p.pod.name), volume = %p.volume_id);
        async {
            let (slot, progress, call) = loop {
                let (slot, call, reclaimed) = self.slot_for(&p)?;
                self.tear_down(reclaimed).await;
                let mut state = slot.state.lock().await;
                if state.gone {
                    // Unpublished while this call waited: look the volume up again.
                    continue;
                }
                if slot.reclaimed.load(Ordering::Acquire) {
                    return Err(reclaimed_status());
                }
                if slot.settled.load(Ordering::Acquire) {
                    return Ok(());
                }
                match self.serve(&slot, &mut state, &p) {
                    Ok(progress) => break (slot.clone(), progress, call),
                    Err(e) => {
                        if state.turns.is_none() && state.run.is_none() {
                            // Nothing was made for it: it holds no place.
                            state.gone = true;
                            self.forget(&slot, false);
                        }
                        return Err(e);
                    }
                }
            };
            let answer = wait_published(progress, wait).await;
            if let Some(mut call) = call {
                call.served = answer.is_ok();
            }
            if answer == Ok(Published::NothingToServe) {
                self.settle(&slot).await;
            }
            answer.map(|_| ())
        }
        .instrument(span)
        .await
    }

    /// The pod has no claim: its tree is final. The run stops, the tree
    /// stays, and the pod's place is given back.
    async fn settle(&self, slot: &Arc<Slot>) {
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

    /// Tear down the volumes of pods whose places were given to another:
    /// their trees were never ready (no container reads them), and the
    /// kubelet publishes them again later.
    async fn tear_down(&self, pods: Taken) {
        for uid in pods {
            let slots: Vec<Arc<Slot>> = self.table().slots.values().filter(|s| s.pod_uid == uid).cloned().collect();
            for slot in slots {
                let mut state = slot.state.lock().await;
                if let Some(run) = state.run.take() {
                    run.stop().await;
                }
                state.turns = None;
                state.gone = true;
                if let Err(e) = self.remove_target(&slot.target) {
                    warn!(pod = %slot.pod, volume = %slot.volume_id, "its place was given to another pod, but: {}", e.message);
                }
                self.forget(&slot, false);
                info!(pod = %slot.pod, volume = %slot.volume_id, "its tree was never ready and the kubelet had not asked for it for {} s: its place went to another pod", self.timing.pending_hold.as_secs_f64());
            }
        }
    }

    /// The slot of `p`'s volume: found, or added if the pod has no other
    /// volume of its view (now or lately); with the pod's place, kept or
    /// taken (a settled slot needs none), and the pods whose places were
    /// taken back for it.
    fn slot_for(&self, p: &Publish) -> Result<SlotFor<'_, M>, Status> {
        let mut table = self.table();
        if let Some(slot) = table.slots.get(&p.volume_id).cloned() {
            if slot.target != p.target {
                let target = slot.target.display();
                return Err(Status::new(Code::AlreadyExists, format!("volume published already at {target}")));
            }
            if slot.reclaimed.load(Ordering::Acquire) {
                return Err(reclaimed_status());
            }
            if slot.settled.load(Ordering::Acquire) {
                return Ok((slot, None, Vec::new()));
            }
            let (call, taken) = self.place_call(&mut table, p)?;
            return Ok((slot, Some(call), taken));
        }
        let view = p.view.name();
        if let Some(other) = table.slots.values().find(|s| s.pod_uid == p.pod_uid && s.view == view) {
            return Err(Status::new(
                Code::FailedPrecondition,
                format!(
                    "pod {} has a drafs volume of view {view} already ({:?}): drafs serves one of each view per pod; mount that one in each container that reads it",
                    other.pod,
                    other.volume_name()
                ),
            ));
        }
        table.refuse_after_end(p, Instant::now())?;
        let (call, taken) = self.place_call(&mut table, p)?;
        let slot = Arc::new(Slot {
            volume_id: p.volume_id.clone(),
            target: p.target.clone(),
            pod_uid: p.pod_uid.clone(),
            pod: format!("{}/{}", p.pod.namespace, p.pod.name),
            view,
            poke: watch::Sender::new(0),
            reclaimed: AtomicBool::new(false),
            settled: AtomicBool::new(false),
            state: Default::default(),
        });
        table.slots.insert(p.volume_id.clone(), slot.clone());
        table.report(&self.metrics);
        Ok((slot, Some(call), taken))
    }

    /// A call on `p`'s pod's place ([`Places::call`]): the pods whose
    /// places were taken back are marked for their tear-down at once.
    fn place_call(&self, table: &mut Table, p: &Publish) -> Result<(PlaceCall<'_, M>, Taken), Status> {
        let taken = table.places.call(&p.pod_uid, &p.pod.namespace, Instant::now()).map_err(|refusal| {
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
        Ok((PlaceCall { volumes: self, uid: p.pod_uid.clone(), served: false }, taken))
    }

    /// Take `slot` out of the table, if it is still the one there, and
    /// remember its pod if the volume was `unpublished`.
    fn forget(&self, slot: &Arc<Slot>, unpublished: bool) {
        let mut table = self.table();
        if table.slots.get(&slot.volume_id).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            table.slots.remove(&slot.volume_id);
            table.release_if_unused(&slot.pod_uid);
            if unpublished {
                table.ended(slot, Instant::now());
            }
        }
        table.report(&self.metrics);
    }

    /// Mount and lock the tree if not yet, and make sure a run serves it with
    /// `p`'s token; the run's progress.
    fn serve(&self, slot: &Slot, state: &mut SlotState, p: &Publish) -> Result<watch::Receiver<Progress>, Status> {
        let turns = match &state.turns {
            Some(turns) => turns.clone(),
            None => {
                let made = self.mount(&p.target, self.limits.room(&p.view))?;
                let turns = DirTurns::take(&p.target).inspect_err(|_| {
                    if made {
                        // Nothing may stay of a refused publish: the kubelet does not unpublish after a final error.
                        let _ = self.remove_target(&p.target);
                    }
                });
                let turns = turns.map_err(|e| match e {
                    WriteError::Busy { .. } => Status::new(
                        Code::Unavailable,
                        format!("{e}: another drafs agent on this node still serves the volume (one being replaced?)"),
                    ),
                    e => Status::new(Code::Internal, e.to_string()),
                })?;
                state.turns = Some(turns.clone());
                turns
            }
        };
        match &mut state.run {
            Some(run) if run.is_serving() => {
                let refreshed =
                    run.token.replace(&p.token).map_err(|e| Status::new(Code::InvalidArgument, e.to_string()))?;
                if refreshed {
                    info!("a refreshed token: used from the next request on");
                }
                // A republish: the pod and its claims are asked again once per refresh.
                if run.poked.elapsed() >= self.timing.refresh {
                    slot.poke.send_modify(|n| *n += 1);
                    run.poked = Instant::now();
                }
                Ok(run.progress.clone())
            }
            _ => {
                // None yet, or one that failed: a new run on the same tree.
                let run = self.start(slot, p, turns)?;
                let progress = run.progress.clone();
                state.run = Some(run);
                Ok(progress)
            }
        }
    }

    /// Unpublish the volume at `target`: stop its run, unmount drafs's tmpfs,
    /// remove the directory. Done already is done; a target that is not the
    /// volume's is left alone.
    pub async fn unpublish(&self, volume_id: &str, target: &Path) -> Result<(), Status> {
        let slot = self.table().slots.get(volume_id).cloned();
        // The pod as the agent knows it, else (an agent restarted since the
        // publish) the uid in the target's path.
        let uid = target.to_str().and_then(|t| volume_dir_pod(&self.kubelet_dir, t));
        let pod = match (&slot, uid) {
            (Some(slot), _) => slot.pod.clone(),
            (None, Some(uid)) => format!("uid {uid}"),
            (None, None) => String::new(),
        };
        let span = info_span!("volume", %pod, volume = %volume_id);
        let outcome = self.unpublish_slot(volume_id, slot, target, uid.is_some()).instrument(span.clone()).await;
        if let Err(status) = &outcome {
            span.in_scope(
                || warn!(target = %target.display(), code = ?status.code, "unpublish refused: {}", status.message),
            );
        }
        outcome
    }

    /// `in_pods`: the target is a pod volume directory of the kubelet.
    async fn unpublish_slot(
        &self,
        volume_id: &str,
        slot: Option<Arc<Slot>>,
        target: &Path,
        in_pods: bool,
    ) -> Result<(), Status> {
        if !in_pods {
            return Err(Status::new(
                Code::InvalidArgument,
                format!(
                    "{} is not a pod volume directory of the kubelet at {}",
                    target.display(),
                    self.kubelet_dir.display()
                ),
            ));
        }
        let holder = self.table().slots.values().find(|s| s.target == target && s.volume_id != volume_id).cloned();
        if let Some(other) = holder.or_else(|| slot.clone().filter(|s| s.target != target)) {
            return Err(Status::new(
                Code::FailedPrecondition,
                format!(
                    "{} is not volume {volume_id}'s target (volume {} is published at {}); nothing was done",
                    target.display(),
                    other.volume_id,
                    other.target.display()
                ),
            ));
        }
        if let Some(slot) = &slot {
            let mut state = slot.state.lock().await;
            if let Some(run) = state.run.take() {
                run.stop().await;
            }
            state.turns = None;
            state.gone = true;
            self.forget(slot, true);
        }
        self.remove_target(target)?;
        info!(target = %target.display(), "unpublished");
        Ok(())
    }

    /// Unmount drafs's tmpfs at `target` and remove the directory.
    fn remove_target(&self, target: &Path) -> Result<(), Status> {
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

    /// Stop every run, leaving the trees mounted and readable (the agent stops
    /// or is upgraded; the next publish of each volume makes it live again).
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
    /// volumes' runs read the pod and its claims again. Pods not served are
    /// not drafs's business.
    pub fn status_changed(&self, pod_uid: &str) {
        let slots: Vec<Arc<Slot>> = self.table().slots.values().filter(|s| s.pod_uid == pod_uid).cloned().collect();
        if slots.is_empty() {
            return;
        }
        self.metrics.status_changed();
        for slot in slots {
            debug!(pod = %slot.pod, volume = %slot.volume_id, "device status changed: read again");
            slot.poke.send_modify(|n| *n += 1);
        }
    }

    /// The volumes served, and how many of their runs have failed.
    pub fn census(&self) -> (usize, usize) {
        let slots: Vec<Arc<Slot>> = self.table().slots.values().cloned().collect();
        let failing = slots
            .iter()
            .filter(|s| s.state.try_lock().is_ok_and(|state| state.run.as_ref().is_some_and(|r| !r.is_serving())))
            .count();
        (slots.len(), failing)
    }

    /// The targets of the volumes served (their tmpfs usage is a metric).
    pub fn targets(&self) -> Vec<PathBuf> {
        self.table().slots.values().map(|s| s.target.clone()).collect()
    }

    /// A tmpfs of drafs's at `target`: made (true), or found (the agent restarted).
    fn mount(&self, target: &Path, room: Room) -> Result<bool, Status> {
        match self.mounts.at(target).map_err(|e| internal("read the mount table", target, e))? {
            AtTarget::Ours => Ok(false),
            AtTarget::Foreign => Err(Status::new(
                Code::FailedPrecondition,
                format!("{} holds a mount drafs did not make", target.display()),
            )),
            AtTarget::Nothing => {
                std::fs::create_dir_all(target).map_err(|e| internal("create", target, e))?;
                self.mounts.mount_tmpfs(target, room).map_err(|e| internal("mount a tmpfs at", target, e))?;
                Ok(true)
            }
        }
    }

    /// Start the run that keeps `p`'s tree current, reading as the pod.
    fn start(&self, slot: &Slot, p: &Publish, turns: Arc<DirTurns>) -> Result<VolumeRun, Status> {
        let token = PodToken::new(&p.token).map_err(|e| Status::new(Code::InvalidArgument, e.to_string()))?;
        let client = client_as(&self.shared, token.clone(), &p.pod.namespace);
        let (tx, progress) = watch::channel(Progress::Starting);
        let (stop, stopped) = oneshot::channel();
        let polling =
            Polling { poke: slot.poke.subscribe(), live_until: (Instant::now() + self.timing.watch_for).into() };
        let sharing = Some(Sharing { slices: self.slices.clone(), polling });
        // The tree, or the standard view alone, written at the target.
        let (backend, metadata_dir, metadata_from_drivers) = match &p.view {
            View::Tree => (TreeBackend::Files, None, Vec::new()),
            View::Standard { from_drivers } => (TreeBackend::None, Some(p.target.clone()), from_drivers.clone()),
        };
        let publishing = OutputSettings {
            backend,
            dir: p.target.clone(),
            metadata_dir,
            metadata_from_drivers,
            require: p.require.clone(),
            metrics_addr: None,
            events: EventsMode::Warnings,
            turns: Some(turns),
            pool_grace: VANISHED_POOL_GRACE,
            containers: Vec::new(),
        };
        let source = Source::Connected { client, pod: p.pod.clone(), uid: Some(slot.pod_uid.clone()), sharing };
        let selection = p.selection.clone();
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
        info!(target = %p.target.display(), view = p.view.name(), "publishing");
        Ok(VolumeRun { progress, stop: Some(stop), task, token, poked: Instant::now() })
    }
}

fn internal(op: &str, path: &Path, e: std::io::Error) -> Status {
    Status::new(Code::Internal, format!("cannot {op} {}: {e}", path.display()))
}

/// How a publish was answered with a ready tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Published {
    /// Live from here on.
    Live,
    /// The pod has no claim: the (empty) tree is final.
    NothingToServe,
}

/// Until the run has written a ready tree, it failed, or `wait` passed.
async fn wait_published(mut progress: watch::Receiver<Progress>, wait: Duration) -> Result<Published, Status> {
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

/// The answer to a publish of a pod whose place went to another pod.
fn reclaimed_status() -> Status {
    Status::new(
        Code::Unavailable,
        "drafs gave this pod's place to another pod while the node was full: its tree was never ready and the kubelet had stopped asking for it a while; it takes a place again at the next call if one is free",
    )
}

/// A volume's slot, the call on its pod's place (none for a settled slot),
/// and the pods whose places were taken back for it.
type SlotFor<'a, M> = (Arc<Slot>, Option<PlaceCall<'a, M>>, Taken);

/// A publish call on a pod's place, counted until it is dropped
/// ([`Places::call_ended`]): a place is never taken back while a call on
/// it is under way.
struct PlaceCall<'a, M: Mounts> {
    volumes: &'a Volumes<M>,
    uid: String,
    /// The call answered with a ready tree.
    served: bool,
}

impl<M: Mounts> Drop for PlaceCall<'_, M> {
    fn drop(&mut self) {
        let mut table = self.volumes.table();
        table.places.call_ended(&self.uid, self.served, Instant::now());
        table.report(&self.volumes.metrics);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_publish_answers_when_the_tree_is_written_or_says_what_is_missing() {
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
}
