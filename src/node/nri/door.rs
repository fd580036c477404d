//! The NRI door: the runtime's calls about pod sandboxes and containers,
//! answered from the node's served pods ([`Served`], the CSI volumes' home
//! too).
//!
//! An opted-in pod's slot (a tmpfs at `<nri-dir>/<pod uid>`, one run that
//! writes each of its device-using containers a tree of its own and, when
//! asked, a standard view) is made as soon as the node's pod watch sees the
//! pod bound to the node, before the kubelet prepares its devices; the
//! run reads as the agent. RunPodSandbox, which comes once the devices are
//! prepared, has the run read the claims again (what the drivers wrote at
//! prepare); CreateContainer then finds the container's tree ready and is
//! answered at once with its mounts, or, after at most `--nri-wait` (well
//! before the runtime's deadline), with an error that names what is
//! missing: the kubelet shows `CreateContainerError` with it and retries.
//! RemovePodSandbox removes the slot. A restarted agent takes its pods' slots
//! back at Synchronize and removes those of pods that are gone.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use k8s_openapi::api::core::v1::Pod;
use prost::Message;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::engine::PodRef;
use crate::engine::run::{ContainerOutput, TreeBackend};
use crate::model::layout;
use crate::model::record::Record;
use crate::model::resolve::Selection;
use crate::node::grpc::{Code, Handler, Status};
use crate::node::mounts::{AtTarget, Mounts};
use crate::node::node_pods::NodePods;
use crate::node::nri::api::{self, Event, PLUGIN_SERVICE};
use crate::node::nri::metrics::{Link, NriMetrics};
use crate::node::nri::policy::{self, MountOptions, PodFacts, Skip};
use crate::node::nri::shares::WaitShares;
use crate::node::served::{RunSpec, Served, Slot, SlotKind, internal};
use crate::publish::files::DATA_LINK;
use crate::publish::metadata_dir::{DriverOwned, read_regular};

/// An answer this much before the runtime's deadline: later, the runtime
/// drops the plugin and creates the container without its mounts.
const ANSWER_MARGIN: Duration = Duration::from_millis(250);
/// The keys of the slots of pods served through NRI: this, then the pod's uid.
const SLOT_PREFIX: &str = "nri/";
/// How often a container's tree is looked at while its creation waits.
const READY_POLL: Duration = Duration::from_millis(10);
/// The runtime's deadline for a call, until Configure says otherwise.
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// How the door serves.
#[derive(Debug, Clone)]
pub struct NriSettings {
    /// The agent's directory of pods served through NRI (a host path the
    /// runtime binds from; the agent mounts a tmpfs per pod in it).
    pub dir: PathBuf,
    /// drafs's own CSI driver: a pod with a volume of it has drafs already.
    pub csi_driver: String,
    /// Longest a container's creation waits for its tree.
    pub wait: Duration,
}

/// What the door keeps of a pod it serves: each container's drivers that
/// bind their own standard-view files.
struct NriPod {
    owned: HashMap<String, DriverOwned>,
}

/// The NRI door of the node's served pods.
pub struct NriDoor<M: Mounts> {
    /// Itself, for the tasks its calls start.
    me: std::sync::Weak<NriDoor<M>>,
    served: Arc<Served<M>>,
    /// The agent's own client: an NRI pod's run reads as the agent.
    own: kube::Client,
    settings: NriSettings,
    /// The node's pods that use a device, as the pod watch last saw them.
    pods: Mutex<HashMap<String, PodFacts>>,
    /// The pods served, by uid.
    serving: Mutex<HashMap<String, NriPod>>,
    /// Namespaces labelled `drafs.dev/nri=enabled`.
    namespaces: Mutex<BTreeSet<String>>,
    /// Pod sandboxes the runtime runs, by id: their pod's uid.
    sandboxes: Mutex<HashMap<String, String>>,
    request_timeout: Mutex<Duration>,
    /// Each namespace's share of the time creations hold the runtime.
    shares: Mutex<WaitShares>,
    pub metrics: Arc<NriMetrics>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<M: Mounts> NriDoor<M> {
    pub fn new(
        served: Arc<Served<M>>,
        own: kube::Client,
        settings: NriSettings,
        metrics: Arc<NriMetrics>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| NriDoor {
            me: me.clone(),
            served,
            own,
            pods: Mutex::default(),
            serving: Mutex::default(),
            namespaces: Mutex::default(),
            sandboxes: Mutex::default(),
            request_timeout: Mutex::new(DEFAULT_REQUEST_TIMEOUT),
            shares: Mutex::new(WaitShares::new(settings.wait)),
            settings,
            metrics,
        })
    }

    /// Have every pod served through NRI read its pod and claims again every
    /// `refresh` (what changes later without a health change: a claim's
    /// status a driver updates), as a CSI volume's republish does.
    pub async fn refresh_every(self: Arc<Self>, refresh: Duration) {
        let mut ticks = tokio::time::interval(refresh.max(Duration::from_secs(1)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let uids: Vec<String> = lock(&self.serving).keys().cloned().collect();
            for uid in uids {
                if let Some(slot) = self.served.slot(&Self::slot_key(&uid)) {
                    slot.poke.send_modify(|n| *n += 1);
                }
            }
        }
    }

    /// The opted-in namespaces now (the namespace watch lists them again).
    pub fn namespaces_listed(&self, names: BTreeSet<String>) {
        *lock(&self.namespaces) = names;
    }

    pub fn namespace_changed(&self, name: &str, enabled: bool) {
        let mut namespaces = lock(&self.namespaces);
        if enabled {
            namespaces.insert(name.to_string());
        } else {
            namespaces.remove(name);
        }
    }

    fn namespace_enabled(&self, name: &str) -> bool {
        lock(&self.namespaces).contains(name)
    }

    /// A pod of the node as the pod watch saw it: remembered if it uses a
    /// device; its slot made at once if it asks for drafs, so that its
    /// containers find their trees ready.
    pub fn pod_seen(self: &Arc<Self>, pod: &Pod) {
        let facts = PodFacts::of(pod, &self.settings.csi_driver);
        if facts.containers.is_empty() || facts.uid.is_empty() {
            return;
        }
        let finished =
            pod.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|p| matches!(p, "Succeeded" | "Failed"));
        let early = !finished && pod.metadata.deletion_timestamp.is_none() && self.wants(&facts);
        lock(&self.pods).insert(facts.uid.clone(), facts.clone());
        if early && !lock(&self.serving).contains_key(&facts.uid) {
            let door = self.clone();
            tokio::spawn(async move {
                if let Err(e) = door.ensure_serving(&facts).await {
                    debug!(pod = %format!("{}/{}", facts.namespace, facts.name), "not served yet: {}", e.message);
                }
            });
        }
    }

    /// A pod gone from the API: forgotten; its slot goes too if no sandbox
    /// of it runs (its sandbox's removal removes it otherwise).
    pub fn pod_deleted(self: &Arc<Self>, uid: &str) {
        lock(&self.pods).remove(uid);
        let runs = lock(&self.sandboxes).values().any(|u| u == uid);
        if !runs {
            let door = self.clone();
            let uid = uid.to_string();
            tokio::spawn(async move { door.stop_serving(&uid).await });
        }
    }

    /// The pod asks for drafs through NRI, and has no drafs of its own.
    fn wants(&self, facts: &PodFacts) -> bool {
        policy::opted_in(facts.label.as_deref(), self.namespace_enabled(&facts.namespace)) && !facts.has_drafs
    }

    fn slot_key(uid: &str) -> String {
        format!("{SLOT_PREFIX}{uid}")
    }

    /// The pod's slot, made (a place taken, its tmpfs mounted, its run
    /// started) if it has none.
    async fn ensure_serving(&self, facts: &PodFacts) -> Result<Arc<Slot>, Status> {
        if !policy::plain_component(&facts.uid) {
            return Err(Status::new(Code::InvalidArgument, format!("drafs cannot serve a pod uid {:?}", facts.uid)));
        }
        let options = facts.options.clone().map_err(|e| Status::new(Code::InvalidArgument, e))?;
        let pod = PodRef { namespace: facts.namespace.clone(), name: facts.name.clone() };
        loop {
            let found = self.served.slot(&Self::slot_key(&facts.uid));
            let (slot, _call, taken) = match found {
                Some(slot) => self.served.call_on(slot, &facts.namespace)?,
                None => {
                    let target = self.settings.dir.join(&facts.uid);
                    let slot = Slot::new(Self::slot_key(&facts.uid), target, &pod, &facts.uid, SlotKind::Containers);
                    self.served.add_slot(slot, &facts.namespace)?
                }
            };
            self.served.tear_down(taken).await;
            let mut state = slot.state.lock().await;
            if state.gone {
                continue;
            }
            if state.run.as_ref().is_some_and(|r| r.is_serving()) {
                return Ok(slot.clone());
            }
            let turns = match self.served.mounted(&slot, &mut state) {
                Ok(turns) => turns,
                Err(e) => {
                    if state.turns.is_none() {
                        state.gone = true;
                        self.served.forget(&slot, false);
                    }
                    return Err(e);
                }
            };
            // Each container's directories, in the pod's tmpfs: the run writes into them.
            for c in &facts.containers {
                let standard = options.metadata_dir.as_ref().map(|_| standard_dir(&slot.target, &c.container));
                for dir in std::iter::once(slot.target.join(&c.container)).chain(standard) {
                    if let Err(e) = std::fs::create_dir_all(&dir) {
                        return Err(internal("create", &dir, e));
                    }
                }
            }
            let owned: HashMap<String, DriverOwned> =
                facts.containers.iter().map(|c| (c.container.clone(), DriverOwned::default())).collect();
            let containers = facts
                .containers
                .iter()
                .map(|c| ContainerOutput {
                    claims: c.clone(),
                    tree_dir: slot.target.join(&c.container),
                    metadata: options
                        .metadata_dir
                        .as_ref()
                        .map(|_| (standard_dir(&slot.target, &c.container), owned[&c.container].clone())),
                })
                .collect();
            let spec = RunSpec {
                client: self.own.clone(),
                token: None,
                pod: pod.clone(),
                selection: Selection::default(),
                require: options.require.clone(),
                backend: TreeBackend::None,
                metadata_dir: None,
                metadata_from_drivers: Vec::new(),
                containers,
                // No watch of its own: read again when the sandbox runs, when
                // a container waits, and when the node's pod watch sees a change.
                watch_for: Duration::ZERO,
            };
            let span = info_span!("nri", pod = %format!("{}/{}", facts.namespace, facts.name));
            let run = span.in_scope(|| self.served.start(&slot, spec, turns));
            state.run = Some(run);
            lock(&self.serving).insert(facts.uid.clone(), NriPod { owned });
            return Ok(slot.clone());
        }
    }

    /// Remove every pod's slot: the agent is uninstalled. Their containers
    /// keep the last tree (their bind mounts hold it), no longer live.
    pub async fn remove_all(&self) {
        let keys: Vec<String> =
            self.served.table().slots.keys().filter(|k| k.starts_with(SLOT_PREFIX)).cloned().collect();
        let uids: Vec<&str> = keys.iter().map(|k| &k[SLOT_PREFIX.len()..]).collect();
        futures::future::join_all(uids.iter().map(|uid| self.stop_serving(uid))).await;
    }

    /// Remove the pod's slot, if it has one.
    async fn stop_serving(&self, uid: &str) {
        lock(&self.serving).remove(uid);
        if let Some(slot) = self.served.slot(&Self::slot_key(uid))
            && let Err(e) = self.served.remove(&slot, true).await
        {
            warn!(pod = %slot.pod, "cannot remove its tree: {}", e.message);
        }
    }

    /// The pod's facts: as the watch saw them, or read now.
    async fn facts_of(&self, sandbox: &api::PodSandbox, limit: Duration) -> Result<PodFacts, Status> {
        if let Some(facts) = lock(&self.pods).get(&sandbox.uid).cloned() {
            return Ok(facts);
        }
        let api: kube::Api<Pod> = kube::Api::namespaced(self.own.clone(), &sandbox.namespace);
        let pod = crate::publish::call::bounded(limit, api.get(&sandbox.name)).await.map_err(|e| {
            Status::new(Code::Unavailable, format!("cannot read pod {}/{}: {e}", sandbox.namespace, sandbox.name))
        })?;
        let facts = PodFacts::of(&pod, &self.settings.csi_driver);
        if facts.uid != sandbox.uid {
            return Err(Status::new(Code::Unavailable, "the pod read is another one of the same name"));
        }
        Ok(facts)
    }

    /// RunPodSandbox: remember the sandbox; an opted-in pod's slot is made
    /// if not yet, and its run reads the claims again (their drivers
    /// prepared the devices just now).
    async fn pod_sandbox_runs(&self, pod: api::PodSandbox) {
        lock(&self.sandboxes).insert(pod.id.clone(), pod.uid.clone());
        if !policy::opted_in(
            pod.labels.get(policy::NRI_LABEL).map(String::as_str),
            self.namespace_enabled(&pod.namespace),
        ) {
            return;
        }
        let limit = self.answer_within(None);
        let facts = match self.facts_of(&pod, limit).await {
            Ok(facts) if !facts.containers.is_empty() && !facts.has_drafs => facts,
            Ok(_) => return,
            Err(e) => return warn!(pod = %format!("{}/{}", pod.namespace, pod.name), "{}", e.message),
        };
        match self.ensure_serving(&facts).await {
            Ok(slot) => slot.poke.send_modify(|n| *n += 1),
            Err(e) => warn!(pod = %format!("{}/{}", pod.namespace, pod.name), "not served yet: {}", e.message),
        }
    }

    /// RemovePodSandbox: the pod's tree goes.
    async fn pod_sandbox_removed(&self, pod: api::PodSandbox) {
        lock(&self.sandboxes).remove(&pod.id);
        self.stop_serving(&pod.uid).await;
    }

    /// How long a call may take: what the runtime gives (`timeout`, or
    /// its configured timeout) less the margin, and at most `--nri-wait`.
    fn answer_within(&self, timeout: Option<Duration>) -> Duration {
        let deadline = timeout.unwrap_or(*lock(&self.request_timeout));
        deadline.saturating_sub(ANSWER_MARGIN).min(self.settings.wait)
    }

    /// CreateContainer: the container's mounts, or why it must wait.
    async fn container_created(
        &self,
        request: api::CreateContainerRequest,
        timeout: Option<Duration>,
    ) -> Result<api::CreateContainerResponse, Status> {
        let started = Instant::now();
        let (Some(sandbox), Some(container)) = (request.pod, request.container) else {
            return Err(Status::new(Code::InvalidArgument, "CreateContainer without its pod or container"));
        };
        let label = sandbox.labels.get(policy::NRI_LABEL).map(String::as_str);
        if !policy::opted_in(label, self.namespace_enabled(&sandbox.namespace)) {
            // Every container of the node comes through here: nothing to do is answered at once.
            return Ok(api::CreateContainerResponse::default());
        }
        // They name the tree's directory: never a path elsewhere.
        for (what, name) in [("pod uid", &sandbox.uid), ("container name", &container.name)] {
            if !policy::plain_component(name) {
                return Err(Status::new(Code::InvalidArgument, format!("drafs cannot serve a {what} {name:?}")));
            }
        }
        let share = lock(&self.shares).left(&sandbox.namespace, started);
        let full = self.answer_within(timeout);
        let budget = full.min(share);
        let span =
            info_span!("nri", pod = %format!("{}/{}", sandbox.namespace, sandbox.name), container = %container.name);
        async {
            let mut answer = self.mounts_for(&sandbox, &container, started + budget).await;
            lock(&self.shares).charge(&sandbox.namespace, started.elapsed(), Instant::now());
            if let Err(e) = &mut answer
                && e.code == Code::Unavailable
                && share < full
            {
                e.message.push_str(&format!(
                    " (waited {} ms, not {} ms: namespace {} has spent its share of the node's container-creation time for now)",
                    budget.as_millis(),
                    full.as_millis(),
                    sandbox.namespace
                ));
            }
            match &answer {
                Ok(Some(mounts)) => {
                    self.metrics.adjusted(started.elapsed());
                    info!(mounts = mounts.len(), waited_ms = started.elapsed().as_millis() as u64, "mounted its tree");
                }
                Ok(None) => {}
                Err(e) => {
                    self.metrics.refused(e.code, started.elapsed());
                    warn!("its creation waits: {}", e.message);
                }
            }
            answer.map(|mounts| api::CreateContainerResponse {
                adjust: mounts.map(|mounts| api::ContainerAdjustment { mounts }),
            })
        }
        .instrument(span)
        .await
    }

    /// The mounts of `container` (None: it gets none), within `until`.
    async fn mounts_for(
        &self,
        sandbox: &api::PodSandbox,
        container: &api::Container,
        until: Instant,
    ) -> Result<Option<Vec<api::Mount>>, Status> {
        let facts = self.facts_of(sandbox, until.saturating_duration_since(Instant::now())).await?;
        let skip = if facts.has_drafs {
            Some(Skip::HasDrafs)
        } else if facts.container(&container.name).is_none() {
            Some(Skip::NoDevice)
        } else {
            None
        };
        if let Some(skip) = skip {
            self.metrics.skipped(skip);
            return Ok(None);
        }
        let options: MountOptions = facts.options.clone().map_err(|e| Status::new(Code::InvalidArgument, e))?;
        for dir in std::iter::once(&options.dir).chain(&options.metadata_dir) {
            if policy::occupied(&container.mounts, dir) {
                self.metrics.skipped(Skip::Occupied);
                return Err(Status::new(
                    Code::FailedPrecondition,
                    format!(
                        "the container mounts something of its own at {dir}, where drafs mounts its tree: move it, or set annotation drafs.dev/dir"
                    ),
                ));
            }
        }
        let slot = self.ensure_serving(&facts).await?;
        let (_, call, _) = self.served.call_on(slot.clone(), &facts.namespace)?;
        let tree = slot.target.join(&container.name);
        if !self.wait_ready(&slot, &tree, until).await {
            // Read again now: a value a driver writes late is there at the kubelet's next try.
            slot.poke.send_modify(|n| *n += 1);
            return Err(Status::new(
                Code::Unavailable,
                format!("drafs is waiting for the container's devices: {}", missing(&tree)),
            ));
        }
        let mut mounts = vec![policy::bind(&tree, &options.dir)];
        if let Some(standard) = &options.metadata_dir {
            let dir = standard_dir(&slot.target, &container.name);
            self.make_room_for_drivers(
                &slot,
                &facts.uid,
                &container.name,
                &dir,
                &policy::driver_binds(&container.mounts, standard),
            )
            .await?;
            mounts.push(policy::bind(&dir, standard));
        }
        if let Some(mut call) = call {
            call.ready = true;
        }
        Ok(Some(mounts))
    }

    /// Until the container's tree is ready, or `until`.
    async fn wait_ready(&self, slot: &Slot, tree: &Path, until: Instant) -> bool {
        let ready = tree.join(layout::READY);
        loop {
            if std::fs::symlink_metadata(&ready).is_ok() {
                return true;
            }
            if Instant::now() + READY_POLL > until || slot.is_reclaimed() {
                return false;
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// The drivers that bind their own standard-view files into the
    /// container get their mount points in its standard view (the runtime
    /// cannot make them in a read-only bind), and drafs never writes those
    /// files again: a file replaced under a mount in another namespace
    /// would take the driver's file out of the container.
    async fn make_room_for_drivers(
        &self,
        slot: &Slot,
        uid: &str,
        container: &str,
        dir: &Path,
        binds: &[(String, String)],
    ) -> Result<(), Status> {
        if binds.is_empty() {
            return Ok(());
        }
        let owned = lock(&self.serving).get(uid).and_then(|p| p.owned.get(container).cloned());
        let state = slot.state.lock().await;
        let Some(turns) = &state.turns else { return Err(Status::new(Code::Unavailable, "the pod's tree is gone")) };
        let _turn = turns.turn();
        if let Some(owned) = owned {
            lock(&owned).extend(binds.iter().map(|(_, driver)| driver.clone()));
        }
        for (rel, _) in binds {
            placeholder(&dir.join(rel))?;
        }
        Ok(())
    }

    /// Synchronize: take back the slots of the pods that still run (their
    /// tmpfs is still mounted), and remove those of pods gone while the
    /// agent was away.
    async fn synchronize(&self, request: api::SynchronizeRequest) {
        let running: HashMap<String, api::PodSandbox> = request.pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
        {
            let mut sandboxes = lock(&self.sandboxes);
            for pod in running.values() {
                sandboxes.insert(pod.id.clone(), pod.uid.clone());
            }
        }
        let Ok(entries) = std::fs::read_dir(&self.settings.dir) else { return };
        for entry in entries.flatten() {
            let uid = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if !matches!(self.served.mounts.at(&path), Ok(AtTarget::Ours)) {
                continue;
            }
            match running.get(&uid) {
                Some(sandbox) => {
                    let Some(door) = self.me.upgrade() else { return };
                    let sandbox = sandbox.clone();
                    tokio::spawn(async move {
                        let limit = door.answer_within(None);
                        match door.facts_of(&sandbox, limit * 4).await {
                            Ok(facts) => match door.ensure_serving(&facts).await {
                                Ok(_) => {
                                    info!(pod = %format!("{}/{}", facts.namespace, facts.name), "its tree taken back")
                                }
                                Err(e) => {
                                    warn!(pod = %format!("{}/{}", facts.namespace, facts.name), "cannot take its tree back: {}", e.message)
                                }
                            },
                            Err(e) => {
                                warn!(pod = %format!("{}/{}", sandbox.namespace, sandbox.name), "cannot take its tree back: {}", e.message)
                            }
                        }
                    });
                }
                // A pod the node's pod watch knows: its tree is being made anew for it.
                None if lock(&self.pods).contains_key(&uid) => {}
                None => {
                    let pod = PodRef { namespace: String::new(), name: format!("uid {uid}") };
                    match self.served.remove_left_over(&Self::slot_key(&uid), &path, &pod, &uid) {
                        Ok(true) => {
                            info!(dir = %path.display(), "the tree of a pod gone while the agent was away: removed")
                        }
                        Ok(false) => {}
                        Err(e) => warn!(dir = %path.display(), "cannot remove a tree of a pod gone: {}", e.message),
                    }
                }
            }
        }
    }
}

/// The node's pod watch, with the NRI door: a pod that uses a device is
/// remembered (and served early if it asks for drafs), a device-status
/// change has the pod's runs read again, whichever door they came through.
impl<M: Mounts> NodePods for Arc<NriDoor<M>> {
    fn status_changed(&self, uid: &str) {
        self.served.status_changed(uid);
    }

    fn seen(&self, raw: &str) {
        // Most pods use no device: they are not decoded.
        if !raw.contains("\"resourceClaims\"") && !raw.contains("\"extendedResourceClaimStatus\"") {
            return;
        }
        match serde_json::from_str::<Pod>(raw) {
            Ok(pod) => self.pod_seen(&pod),
            Err(e) => debug!("node pods: a pod the NRI door cannot read: {e}"),
        }
    }

    fn deleted(&self, uid: &str) {
        self.pod_deleted(uid);
    }
}

/// A container's standard view, beside its tree in the pod's tmpfs.
fn standard_dir(target: &Path, container: &str) -> PathBuf {
    // Container names are DNS labels: none has a dot, so none is another's standard view.
    target.join(format!("{container}.metadata"))
}

/// An empty file at `path` (and its directories) if nothing is there.
fn placeholder(path: &Path) -> Result<(), Status> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(|e| internal("create", parent, e))?;
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(internal("create", path, e)),
    }
}

/// What a container's tree still misses, from its record (in the payload
/// `..data` leads to: the record's name in the tree is a link, never followed).
fn missing(tree: &Path) -> String {
    let path = tree.join(DATA_LINK).join(layout::RECORD);
    let record = read_regular(&path).and_then(|text| serde_json::from_slice::<Record>(&text).ok());
    match record {
        Some(record) if !record.missing.is_empty() => record.missing.join("; "),
        Some(_) => "its tree is being written".into(),
        None => "no answer from the API server yet".into(),
    }
}

impl<M: Mounts> Handler for NriDoor<M> {
    async fn call(&self, method: &str, message: Bytes, timeout: Option<Duration>) -> Result<Vec<u8>, Status> {
        let decode = |e: prost::DecodeError| Status::new(Code::InvalidArgument, format!("malformed {method}: {e}"));
        let Some(name) = method.strip_prefix(&format!("/{PLUGIN_SERVICE}/")) else {
            return Err(Status::new(Code::Unimplemented, format!("drafs does not serve {method}")));
        };
        match name {
            "Configure" => {
                let request = api::ConfigureRequest::decode(message).map_err(decode)?;
                if request.request_timeout > 0 {
                    *lock(&self.request_timeout) = Duration::from_millis(request.request_timeout as u64);
                }
                info!(runtime = %request.runtime_name, version = %request.runtime_version, request_timeout_ms = request.request_timeout, "NRI: configured by the runtime");
                self.metrics.link(Link::Joining("waiting for the runtime's synchronization".into()));
                let events = [Event::RunPodSandbox, Event::RemovePodSandbox, Event::CreateContainer];
                Ok(api::ConfigureResponse { events: events.iter().map(|e| e.bit()).sum() }.encode_to_vec())
            }
            "Synchronize" => {
                let request = api::SynchronizeRequest::decode(message).map_err(decode)?;
                let more = request.more;
                self.metrics.synchronized(request.pods.len());
                self.synchronize(request).await;
                if !more {
                    self.metrics.link(Link::Serving);
                    info!("NRI: synchronized with the runtime: serving its containers");
                }
                Ok(api::SynchronizeResponse { more }.encode_to_vec())
            }
            "RunPodSandbox" => {
                let request = api::PodSandboxRequest::decode(message).map_err(decode)?;
                if let Some(pod) = request.pod {
                    self.pod_sandbox_runs(pod).await;
                }
                Ok(api::Empty {}.encode_to_vec())
            }
            "RemovePodSandbox" => {
                let request = api::PodSandboxRequest::decode(message).map_err(decode)?;
                if let Some(pod) = request.pod {
                    self.pod_sandbox_removed(pod).await;
                }
                Ok(api::Empty {}.encode_to_vec())
            }
            "CreateContainer" => {
                let request = api::CreateContainerRequest::decode(message).map_err(decode)?;
                Ok(self.container_created(request, timeout).await?.encode_to_vec())
            }
            "StopPodSandbox" | "Shutdown" => Ok(api::Empty {}.encode_to_vec()),
            _ => Err(Status::new(Code::Unimplemented, format!("drafs does not serve {method}"))),
        }
    }
}
