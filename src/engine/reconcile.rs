//! The reconciler: what drafs knows, what it publishes, and what it asks the
//! API for next, as a plain value.
//!
//! It never does I/O and never reads the clock. The drive loop (`drive`)
//! feeds it [`Input`]s (the pod, a list, a watch event, an error, the
//! deadline) with the time they arrived, carries out the [`Action`]s of each
//! [`Step`] (get the pod, list a scope, watch it from a resource version,
//! decode slices with a new device filter), and hands what the step
//! publishes and its [`Transition`] to the outputs. `init`, `serve`, `get`
//! and `exec` differ only in their [`Mode`].
//!
//! Its state is three things: the objects ([`Store`]), one [`Tracker`] per
//! scope (what is asked for, how its retries wait, its last error; the pod
//! is a scope whose list is a GET), and where the run stands ([`Phase`],
//! moved by the table in [`change`]).

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use crate::engine::api::ApiError;
use crate::engine::store::{Item, Scope, Store};
use crate::engine::{EngineError, PodRef};
use crate::model::backoff::{RetryBackoff, WatchBackoff, seed_of};
pub use crate::model::publication::{Publication, Transition};
use crate::model::resolve::{Missing, Resolution, Selection, claim_names, resolve};
use crate::model::slices::{self, DeviceFilter};
use crate::model::tree::{self, BuiltTree, RequirePath, Tree};

/// How long a run lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `get`, `exec`: one resolution once everything is listed, ready or not.
    Once,
    /// `init`: until ready, watching only what is still missing.
    UntilReady,
    /// `serve`: forever, following every change.
    Follow,
}

/// Where a run stands. Once it has been ready, it stays `Ready` or
/// `Degraded`: the tree it published is served while scopes are listed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    WaitingForPod,
    WaitingForClaims,
    WaitingForDevices,
    Ready,
    /// Was ready, and values went missing since.
    Degraded,
}

impl Phase {
    /// The run has published a ready tree at least once.
    pub fn was_ever_ready(self) -> bool {
        matches!(self, Phase::Ready | Phase::Degraded)
    }
}

/// What one resolution reports, without its details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Waiting,
    Ready,
    Updated,
    Lost,
    Recovered,
}

/// The transition table: what a resolution reports, from the phase the run
/// was in, whether the resolution is ready, and whether what is missing (when
/// not ready) or the tree (when ready) changed since the last one. `init`
/// ends at the first `Ready`, so it only ever takes the first two rows.
pub fn change(was: Phase, ready: bool, missing_changed: bool, tree_changed: bool) -> Option<Change> {
    match (was.was_ever_ready(), was == Phase::Ready, ready) {
        (false, _, true) => Some(Change::Ready),
        (false, _, false) if missing_changed => Some(Change::Waiting),
        (true, false, true) => Some(Change::Recovered),
        (true, true, false) => Some(Change::Lost),
        (true, true, true) if tree_changed => Some(Change::Updated),
        _ => None,
    }
}

/// The phase after a resolution: ready, degraded once it has been ready, or
/// waiting for what the resolution lacks.
fn phase_after(was: Phase, ready: bool, res: &Resolution) -> Phase {
    match (ready, was.was_ever_ready()) {
        (true, _) => Phase::Ready,
        (false, true) => Phase::Degraded,
        (false, false) => waiting_phase(res),
    }
}

/// What happened, as the engine tells it.
#[derive(Debug)]
pub enum Input {
    Pod(Box<Pod>),
    PodFailed(ApiError),
    /// A scope's complete list (all pages); slices were decoded with `decoded_with`.
    Listed {
        scope: Scope,
        items: Vec<Item>,
        resource_version: String,
        decoded_with: Option<DeviceFilter>,
    },
    Applied {
        scope: Scope,
        item: Item,
    },
    Deleted {
        scope: Scope,
        name: String,
        resource_version: Option<String>,
    },
    Bookmark {
        scope: Scope,
        resource_version: String,
    },
    /// The server closed a watch without an error, after `lasted`, having
    /// sent `changes` objects (added, modified, deleted; bookmarks not counted).
    WatchEnded {
        scope: Scope,
        lasted: Duration,
        changes: usize,
    },
    /// 410 Gone: the resource version is too old; list again.
    Expired(Scope),
    Failed {
        scope: Scope,
        error: ApiError,
    },
    Deadline,
    /// The time asked for by [`Action::Recheck`] has come.
    Recheck,
}

/// What the engine should do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    GetPod {
        after: Duration,
    },
    List {
        scope: Scope,
        after: Duration,
    },
    Watch {
        scope: Scope,
        resource_version: String,
        after: Duration,
    },
    /// Decode slices with this filter from now on.
    Filter(DeviceFilter),
    /// Resolve again after this long, inputs or not ([`Input::Recheck`]).
    Recheck {
        after: Duration,
    },
}

/// The outcome of one input.
#[derive(Debug, Default)]
pub struct Step {
    pub actions: Vec<Action>,
    pub publish: Option<Publication>,
    pub transition: Option<Transition>,
    /// Warnings not reported before (resolver and tree).
    pub warnings: Vec<String>,
    /// The run is over: its last resolution, or why it failed.
    pub done: Option<Result<Resolution, EngineError>>,
}

impl Step {
    /// Add a later step's outcome to this one.
    pub fn merge(&mut self, later: Step) {
        self.actions.extend(later.actions);
        self.warnings.extend(later.warnings);
        if later.publish.is_some() {
            self.publish = later.publish;
        }
        if later.transition.is_some() {
            self.transition = later.transition;
        }
        if later.done.is_some() {
            self.done = later.done;
        }
    }
}

/// One scope's requests. The pod has one too (its list is a GET).
#[derive(Debug, Default)]
struct Tracker {
    /// A list (the pod: a get) is asked for and not answered yet.
    listing: bool,
    /// A watch is open or asked for.
    watching: bool,
    /// The next watch waits this long (the last one failed or was cut short).
    watch_after: Option<Duration>,
    /// Quick retries until the first answer (start-up is waiting for it).
    startup: RetryBackoff,
    /// The last error, for the timeout message; an answer clears it.
    error: Option<String>,
    /// Slices: the device filter their last list was decoded with.
    decoded_with: Option<DeviceFilter>,
}

/// The reconciler.
#[derive(Debug)]
pub struct Reconciler {
    mode: Mode,
    pod_ref: PodRef,
    selection: Selection,
    require: Vec<RequirePath>,
    store: Store,
    /// Every scope asked for, the pod's included.
    trackers: BTreeMap<Scope, Tracker>,
    phase: Phase,
    /// The run is over (its last step said why).
    done: bool,
    /// The filter the engine decodes with, once every claim is listed.
    filter: Option<DeviceFilter>,
    /// The pod's watch was refused (401/403): serve goes on without it.
    pod_watch_refused: bool,
    /// Retries of scopes answered once (see [`WatchBackoff`]): one for the run.
    trouble: WatchBackoff,
    warned: Warned,
    published: Option<Tree>,
    last_missing: Vec<String>,
    /// When [`Reconciler::start`] was called.
    started: Option<Instant>,
    /// Inputs were taken in since the last resolution.
    unsettled: bool,
    /// The objects come from this file: every get and list is answered at
    /// once and nothing ever changes, so nothing is waited for or watched.
    fixed: Option<String>,
    /// The uid of the pod served, when the caller knows it (the node agent).
    expected_uid: Option<String>,
    /// Since when a ready tree's devices are missing only because their
    /// pools are gone, and the tree is kept (for `pool_grace`).
    holding_since: Option<Instant>,
    pool_grace: Duration,
}

/// How long a served tree outlives the pools of its devices. Starting, a
/// kubelet deletes every ResourceSlice of its node, and each driver publishes
/// its pools again only after its slice controller's sync delay (30 s by
/// default): the devices, still allocated to the pod, have not changed.
pub const VANISHED_POOL_GRACE: Duration = Duration::from_secs(90);

/// Distinct warnings remembered by [`Warned`].
const WARNED_MAX: usize = 1024;

/// The warnings reported so far, so that each is reported once: the same
/// error on every retry, the same skipped attribute on every resolution.
/// Bounded: only the last [`WARNED_MAX`] distinct warnings are remembered,
/// each by a hash (8 bytes, however long the message), so a flood of distinct
/// ones (a server that ignores the field selector sends every object of the
/// cluster, each named in its warning; an API error whose message changes)
/// costs a fixed amount of memory. A warning forgotten that way is reported
/// once more if it comes back.
#[derive(Debug, Default)]
struct Warned {
    seen: HashSet<u64>,
    /// The same hashes, oldest first.
    order: VecDeque<u64>,
}

impl Warned {
    /// True the first time `warning` comes (or again once it was forgotten).
    fn first(&mut self, warning: &str) -> bool {
        // A fixed hasher: the reconciler stays a deterministic value.
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(warning);
        if !self.seen.insert(hash) {
            return false;
        }
        self.order.push_back(hash);
        if self.order.len() > WARNED_MAX
            && let Some(oldest) = self.order.pop_front()
        {
            self.seen.remove(&oldest);
        }
        true
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.seen.len()
    }
}

/// A watch the server ends sooner than this without sending a change was cut
/// short (drafs asks for at least [`crate::engine::api::WATCH_SECONDS_MIN`]: a proxy or a
/// restarting server closed it): resumed only after a delay.
const WATCH_CUT_SHORT: Duration = Duration::from_secs(30);

impl Reconciler {
    pub fn new(mode: Mode, pod_ref: PodRef, selection: Selection, require: Vec<RequirePath>) -> Self {
        let seed = seed_of(&format!("{}/{}", pod_ref.namespace, pod_ref.name));
        Reconciler {
            mode,
            pod_ref,
            selection,
            require,
            store: Store::default(),
            trackers: BTreeMap::new(),
            phase: Phase::WaitingForPod,
            done: false,
            filter: None,
            pod_watch_refused: false,
            trouble: WatchBackoff::new(seed),
            warned: Warned::default(),
            published: None,
            last_missing: Vec::new(),
            started: None,
            unsettled: false,
            fixed: None,
            expected_uid: None,
            holding_since: None,
            pool_grace: VANISHED_POOL_GRACE,
        }
    }

    /// Serve only the pod with this uid (the node agent's volume belongs to
    /// one pod; another of the same name is refused).
    pub fn expecting_uid(mut self, uid: Option<String>) -> Self {
        self.expected_uid = uid;
        self
    }

    /// Keep a followed tree this long when its devices' pools are gone.
    pub fn keeping_gone_pools_for(mut self, grace: Duration) -> Self {
        self.pool_grace = grace;
        self
    }

    /// The objects come from a file, named `shown` in messages.
    pub fn fixed(mut self, shown: String) -> Self {
        self.fixed = Some(shown);
        self
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn pod_uid(&self) -> Option<String> {
        self.store.pod.as_ref().and_then(|p| p.metadata.uid.clone()).filter(|u| !u.is_empty())
    }

    /// The scopes with a watch open or asked for.
    pub fn watching(&self) -> impl Iterator<Item = &Scope> {
        self.trackers.iter().filter(|(_, t)| t.watching).map(|(scope, _)| scope)
    }

    /// The first step, at `now`: fetch the pod.
    pub fn start(&mut self, now: Instant) -> Step {
        self.started = Some(now);
        let mut step = Step::default();
        self.list(self.pod_scope(), Duration::ZERO, &mut step);
        step
    }

    /// Take in one input that arrived at `now`, and resolve.
    pub fn handle(&mut self, now: Instant, input: Input) -> Step {
        self.handle_all(now, [input])
    }

    /// Take in every input, then resolve once: a burst of watch events costs
    /// one resolution and at most one tree, of the latest state.
    pub fn handle_all(&mut self, now: Instant, inputs: impl IntoIterator<Item = Input>) -> Step {
        let mut step = self.absorb(now, inputs);
        step.merge(self.settle(now));
        step
    }

    /// Take in inputs without resolving yet (the caller is still writing the
    /// last tree): only what the inputs themselves call for (retries, the
    /// end of a run) is in the step.
    pub fn absorb(&mut self, now: Instant, inputs: impl IntoIterator<Item = Input>) -> Step {
        let mut step = Step::default();
        for input in inputs {
            if self.done {
                break;
            }
            self.unsettled |= self.apply(now, input, &mut step);
        }
        step
    }

    /// Resolve what the inputs taken in since the last resolution changed.
    pub fn settle(&mut self, now: Instant) -> Step {
        let mut step = Step::default();
        if std::mem::take(&mut self.unsettled) {
            self.evaluate(now, &mut step);
        }
        step
    }

    /// Inputs were taken in and not resolved yet.
    pub fn is_unsettled(&self) -> bool {
        self.unsettled && !self.done
    }

    fn pod_scope(&self) -> Scope {
        Scope::Pod(self.pod_ref.name.clone())
    }

    fn tracker(&mut self, scope: &Scope) -> &mut Tracker {
        if !self.trackers.contains_key(scope) {
            self.trackers.insert(scope.clone(), Tracker::default());
        }
        self.trackers.get_mut(scope).expect("inserted above")
    }

    /// One input into the state; false when it changed nothing to resolve.
    fn apply(&mut self, now: Instant, input: Input, step: &mut Step) -> bool {
        match input {
            Input::Pod(pod) => match self.other_pod(&pod) {
                Some(error) => return self.apply(now, Input::PodFailed(error), step),
                None => self.on_pod(*pod, step),
            },
            Input::PodFailed(error) => {
                let scope = self.pod_scope();
                self.tracker(&scope).listing = false;
                if self.fatal(&error, step) {
                    return false;
                }
                self.tracker(&scope).error = Some(error.to_string());
                step.warnings.extend(self.warn_once(format!("{error}; retrying")));
                // Start-up waits for the pod: quick retries. Once ready, a refetch
                // (its watch expired) is trouble like any other scope's.
                let after = if self.phase.was_ever_ready() {
                    self.trouble.next(now)
                } else {
                    self.tracker(&scope).startup.next().unwrap_or_default()
                };
                self.ask(scope, after, step);
            }
            Input::Listed { scope, items, resource_version, decoded_with } => {
                return self.on_listed(scope, items, resource_version, decoded_with, step);
            }
            Input::Applied { scope, item: Item::Pod(pod) } => {
                // The watched pod: as if fetched, unless it is another one.
                if let Some(error) = self.other_pod(&pod) {
                    return self.on_failed(now, scope, error, step);
                }
                self.on_pod(*pod, step);
            }
            Input::Applied { scope, item } => {
                if let Some(item) = self.admit(&scope, vec![item], step).pop() {
                    self.store.apply(&scope, item);
                }
                self.tracker(&scope).error = None;
            }
            Input::Deleted { scope, name, resource_version } => self.store.delete(&scope, &name, resource_version),
            Input::Bookmark { scope, resource_version } => self.store.bookmark(&scope, resource_version),
            Input::WatchEnded { scope, lasted, changes } => {
                let cut_short = changes == 0 && lasted < WATCH_CUT_SHORT;
                let after = cut_short.then(|| self.trouble.next(now));
                let tracker = self.tracker(&scope);
                tracker.watching = false;
                if after.is_some() {
                    tracker.watch_after = after;
                }
            }
            Input::Expired(scope) => {
                self.tracker(&scope).watching = false;
                let after = self.trouble.next(now);
                self.list(scope, after, step);
            }
            Input::Failed { scope, error } => return self.on_failed(now, scope, error, step),
            Input::Deadline => {
                // The deadline only bounds the way to the first ready tree.
                if !self.phase.was_ever_ready() {
                    self.finish(Err(EngineError::Timeout { waiting_for: self.waiting_for() }), step);
                    return false;
                }
            }
            Input::Recheck => {}
        }
        true
    }

    /// Defence in depth: the object must be the pod asked for (and, when
    /// known, the very pod: its uid).
    fn other_pod(&self, pod: &Pod) -> Option<ApiError> {
        let (name, namespace) = (pod.metadata.name.as_deref(), pod.metadata.namespace.as_deref());
        if name == Some(self.pod_ref.name.as_str()) && namespace.is_none_or(|ns| ns == self.pod_ref.namespace) {
            let found = pod.metadata.uid.as_deref().unwrap_or_default();
            return match &self.expected_uid {
                Some(expected) if expected != found => Some(ApiError::OtherPod {
                    namespace: self.pod_ref.namespace.clone(),
                    name: self.pod_ref.name.clone(),
                    found: found.to_string(),
                    expected: expected.clone(),
                }),
                _ => None,
            };
        }
        Some(ApiError::Failed {
            verb: "get",
            resource: "pods".into(),
            scope: format!(" ({}/{})", self.pod_ref.namespace, self.pod_ref.name),
            message: format!("the server answered with pod {}/{}", namespace.unwrap_or("?"), name.unwrap_or("?")),
            code: None,
        })
    }

    /// A whole list of a scope: it replaces what the store held.
    fn on_listed(
        &mut self,
        scope: Scope,
        items: Vec<Item>,
        resource_version: String,
        decoded_with: Option<DeviceFilter>,
        step: &mut Step,
    ) -> bool {
        self.tracker(&scope).listing = false;
        if !self.store.has_scope(&scope) {
            return false;
        }
        let items = self.admit(&scope, items, step);
        self.store.replace(&scope, items, resource_version);
        let stale = scope.is_slices() && {
            let with = decoded_with.unwrap_or_default();
            let stale = self.filter.as_ref().is_some_and(|f| !f.is_subset(&with));
            self.tracker(&scope).decoded_with = Some(with);
            stale
        };
        let tracker = self.tracker(&scope);
        tracker.error = None;
        tracker.startup = RetryBackoff::default();
        if stale {
            // The filter grew while this list was under way.
            self.list(scope, Duration::ZERO, step);
        }
        true
    }

    /// A list or watch of a scope failed: fatal, or retried after a delay.
    fn on_failed(&mut self, now: Instant, scope: Scope, error: ApiError, step: &mut Step) -> bool {
        let is_pod = matches!(scope, Scope::Pod(_));
        let tracker = self.tracker(&scope);
        let was_watch = std::mem::take(&mut tracker.watching);
        if !is_pod {
            // The pod's get answers as `Pod` or `PodFailed`: this was its watch.
            tracker.listing = false;
        }
        if is_pod && error.is_fatal() {
            // Only health follows the pod's watch: without the permission (RBAC
            // from before it was needed), serve goes on without it.
            self.store.remove_scope(&scope);
            self.tracker(&scope).watch_after = None;
            self.pod_watch_refused = true;
            step.warnings.extend(self.warn_once(format!(
                "{error}: device health will not follow the pod's status; \
                 grant `watch` on pods (drafs manifests rbac) and restart drafs"
            )));
            return false;
        }
        if self.fatal(&error, step) {
            return false;
        }
        step.warnings.extend(self.warn_once(format!("{error}; retrying")));
        self.tracker(&scope).error = Some(error.to_string());
        if !self.store.is_listed(&scope) {
            // The first list: retried quickly, start-up is waiting for it.
            let after = self.tracker(&scope).startup.next().unwrap_or_default();
            self.list(scope, after, step);
        } else if was_watch && error.is_watch() {
            // What the store holds is still good from its version: watch again, later.
            let after = self.trouble.next(now);
            self.tracker(&scope).watch_after = Some(after);
        } else {
            let after = self.trouble.next(now);
            self.list(scope, after, step);
        }
        true
    }

    fn on_pod(&mut self, pod: Pod, step: &mut Step) {
        let scope = self.pod_scope();
        // The start-up backoff stays: the pod is fetched again only while its
        // status lacks a generated claim, and an answer that still lacks it
        // must not bring the next request closer.
        let tracker = self.tracker(&scope);
        tracker.listing = false;
        tracker.error = None;
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty());
        let claims: BTreeSet<String> = claim_names(&pod, &self.selection).into_iter().collect();
        if self.mode == Mode::Follow {
            // serve watches the pod from the version it was fetched at, for the
            // health the kubelet writes into its status: no request more at start.
            let version = pod.metadata.resource_version.clone().filter(|v| !v.is_empty());
            if let Some(version) = version {
                if self.store.has_scope(&scope) {
                    self.store.bookmark(&scope, version);
                } else if !self.pod_watch_refused {
                    self.store.add_scope(scope.clone());
                    self.store.replace(&scope, Vec::new(), version);
                }
            }
        }
        self.store.pod = Some(pod);
        for claim in claims {
            self.add_and_list(Scope::Claim(claim), step);
        }
        if let Some(node) = node {
            self.add_and_list(Scope::NodeSlices(node), step);
        }
    }

    /// 401/403/404 end a run that has not been ready yet; afterwards nothing does.
    fn fatal(&mut self, error: &ApiError, step: &mut Step) -> bool {
        if error.is_fatal() && !self.phase.was_ever_ready() {
            self.finish(Err(EngineError::Api(error.clone())), step);
            return true;
        }
        false
    }

    fn finish(&mut self, result: Result<Resolution, EngineError>, step: &mut Step) {
        self.done = true;
        step.done = Some(result);
    }

    /// Objects that belong to the scope (slices trimmed to the filter); the
    /// rest are reported once and dropped.
    fn admit(&mut self, scope: &Scope, items: Vec<Item>, step: &mut Step) -> Vec<Item> {
        let node = self.node();
        let filter = self.filter.clone().unwrap_or_default();
        let mut kept = Vec::with_capacity(items.len());
        for item in items {
            let admitted = match &item {
                Item::Claim(c) => scope.admits_claim(c, &self.pod_ref.namespace),
                Item::Slice(s) => scope.admits_slice(s),
                // The pod is taken in by `apply`, never kept among a scope's objects.
                Item::Pod(_) => false,
            };
            if !admitted {
                let warning = format!(
                    "ignoring {} {:?}: it does not match {scope} (the server ignored the selector?)",
                    scope.resource(),
                    item.name()
                );
                step.warnings.extend(self.warn_once(warning));
                continue;
            }
            match item {
                Item::Slice(s) => {
                    if let Some(s) = slices::trim(*s, &filter, node.as_deref()) {
                        kept.push(Item::Slice(Box::new(s)));
                    }
                }
                claim => kept.push(claim),
            }
        }
        kept
    }

    fn node(&self) -> Option<String> {
        self.store
            .pod
            .as_ref()
            .and_then(|p| p.spec.as_ref())
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty())
    }

    fn add_and_list(&mut self, scope: Scope, step: &mut Step) {
        if self.store.has_scope(&scope) {
            return;
        }
        self.store.add_scope(scope.clone());
        self.list(scope, Duration::ZERO, step);
    }

    /// List a scope again from scratch (the pod: get it; its watch resumes
    /// from the answer): a watch of it ends.
    fn list(&mut self, scope: Scope, after: Duration, step: &mut Step) {
        let tracker = self.tracker(&scope);
        tracker.watching = false;
        tracker.watch_after = None;
        self.ask(scope, after, step);
    }

    /// Ask for a scope's list (the pod: a get) after `after`, unless one is
    /// under way; a watch of it goes on (the answer only renews its version).
    fn ask(&mut self, scope: Scope, after: Duration, step: &mut Step) {
        if std::mem::replace(&mut self.tracker(&scope).listing, true) {
            return;
        }
        step.actions.push(match scope {
            Scope::Pod(_) => Action::GetPod { after },
            scope => Action::List { scope, after },
        });
    }

    /// Watch a listed scope from its version, unless a list or watch of it is under way.
    fn watch(&mut self, scope: &Scope, step: &mut Step) {
        if self.fixed.is_some() || !self.store.is_listed(scope) {
            return;
        }
        let Some(rv) = self.store.resource_version(scope).map(String::from) else { return };
        let tracker = self.tracker(scope);
        if tracker.watching || tracker.listing {
            return;
        }
        tracker.watching = true;
        let after = tracker.watch_after.take().unwrap_or_default();
        step.actions.push(Action::Watch { scope: scope.clone(), resource_version: rv, after });
    }

    fn warn_once(&mut self, warning: String) -> Option<String> {
        self.warned.first(&warning).then_some(warning)
    }

    /// The devices the pod's listed claims are allocated.
    fn wanted_devices(&self) -> DeviceFilter {
        DeviceFilter::new(self.store.claims().flat_map(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.devices.as_ref())
                .and_then(|d| d.results.as_ref())
                .into_iter()
                .flatten()
                .map(|r| (r.driver.clone(), r.pool.clone(), r.device.clone()))
        }))
    }

    /// Slice scopes whose last list was decoded without a device in `filter`.
    fn decoded_without(&self, filter: &DeviceFilter) -> Vec<Scope> {
        self.trackers
            .iter()
            .filter(|(scope, t)| {
                t.decoded_with.as_ref().is_some_and(|with| !filter.is_subset(with)) && self.store.is_listed(scope)
            })
            .map(|(scope, _)| scope.clone())
            .collect()
    }

    /// Once every claim is listed, the slices can be decoded: tell the engine
    /// which devices to keep, and list again the slices that were decoded
    /// without a device now wanted.
    fn update_filter(&mut self, step: &mut Step) {
        let claims_listed = self.store.scopes().filter(|s| !s.is_slices()).all(|s| self.store.is_listed(s));
        if !claims_listed || self.store.pod.is_none() {
            return;
        }
        let wanted = self.wanted_devices();
        if self.filter.as_ref() == Some(&wanted) {
            return;
        }
        self.filter = Some(wanted.clone());
        step.actions.push(Action::Filter(wanted.clone()));
        for scope in self.decoded_without(&wanted) {
            self.list(scope, Duration::ZERO, step);
        }
    }

    /// Wait in `phase`, unless the run was ready once: its tree stays served.
    fn wait_in(&mut self, phase: Phase) {
        if !self.phase.was_ever_ready() {
            self.phase = phase;
        }
    }

    /// Resolve, when every input it needs is in, and decide what the run does.
    fn evaluate(&mut self, now: Instant, step: &mut Step) {
        if self.done {
            return;
        }
        let Some(res) = self.resolvable(step) else { return };
        if let Some(permanent) = res.missing.iter().find(|m| m.is_permanent()) {
            self.finish(Err(EngineError::Permanent(permanent.clone())), step);
            return;
        }
        if self.list_unbound_slices(&res, step) {
            self.wait_in(Phase::WaitingForDevices);
            return;
        }
        let built = tree::build(&res, &self.require);
        for w in built.warnings.clone() {
            step.warnings.extend(self.warn_once(w));
        }
        let ready = built.is_ready();
        if !ready && needs_pod_refresh(&res) && self.mode != Mode::Once && self.fixed.is_none() {
            let scope = self.pod_scope();
            if !self.tracker(&scope).listing {
                let after = self.tracker(&scope).startup.next().unwrap_or_default();
                self.ask(scope, after, step);
            }
        }
        match self.mode {
            Mode::Once => self.finish(Ok(res), step),
            Mode::UntilReady if !ready && self.fixed.is_some() => {
                self.finish(Err(EngineError::NotReady { missing: built.missing }), step);
            }
            Mode::UntilReady | Mode::Follow => self.conclude(now, res, built, step),
        }
    }

    /// The resolution, once the pod, every claim and every slice decoded with
    /// the current filter are in; until then, the phase says what is awaited.
    fn resolvable(&mut self, step: &mut Step) -> Option<Resolution> {
        if self.store.pod.is_none() {
            self.wait_in(Phase::WaitingForPod);
            return None;
        }
        self.update_filter(step);
        let unlisted = self.store.unlisted();
        if unlisted.iter().any(|s| !s.is_slices()) {
            self.wait_in(Phase::WaitingForClaims);
            return None;
        }
        // Slices decoded without a device now wanted are being listed again: wait for them.
        let filter = self.filter.clone().unwrap_or_default();
        if !unlisted.is_empty() || !self.decoded_without(&filter).is_empty() {
            self.wait_in(Phase::WaitingForDevices);
            return None;
        }
        let mut res = resolve(&self.store.snapshot(), &self.selection);
        if let Some(shown) = &self.fixed {
            explain_claims_not_in(shown, &mut res);
        }
        Some(res)
    }

    /// Devices not on the node's slices may be on slices bound to no single
    /// node: list their drivers' (true when a new scope is being listed).
    fn list_unbound_slices(&mut self, res: &Resolution, step: &mut Step) -> bool {
        let mut new_scopes = false;
        for driver in res.drivers_with_unpublished_devices() {
            let scope = Scope::DriverSlices(driver);
            if !self.store.has_scope(&scope) {
                new_scopes = true;
                self.add_and_list(scope, step);
            }
        }
        new_scopes
    }

    /// Move the run by the transition table, publish what changed, and watch
    /// what the mode follows: `init` what is missing, `serve` everything.
    fn conclude(&mut self, now: Instant, res: Resolution, built: BuiltTree, step: &mut Step) {
        let ready = built.is_ready();
        if self.holding(now, ready, &res, step) {
            self.watch_every_scope(step);
            return;
        }
        let missing_changed = built.missing != self.last_missing;
        let tree_changed = self.published.as_ref() != Some(&built.tree);
        step.transition = change(self.phase, ready, missing_changed, tree_changed).map(|c| match c {
            Change::Waiting => Transition::Waiting { missing: built.missing.clone() },
            Change::Ready => Transition::Ready { summary: self.summary(&res, now) },
            Change::Updated => Transition::Updated,
            Change::Lost => Transition::Lost { missing: built.missing.clone() },
            Change::Recovered => Transition::Recovered,
        });
        self.phase = phase_after(self.phase, ready, &res);
        self.last_missing = built.missing.clone();
        if self.mode == Mode::UntilReady {
            if ready {
                step.publish = Some(Publication { resolution: res.clone(), built });
                self.finish(Ok(res), step);
            } else {
                self.watch_what_is_missing(&res, &built, step);
            }
            return;
        }
        if tree_changed {
            self.published = Some(built.tree.clone());
            step.publish = Some(Publication { resolution: res, built });
        }
        self.watch_every_scope(step);
    }

    fn watch_every_scope(&mut self, step: &mut Step) {
        let scopes: Vec<Scope> = self.store.scopes().cloned().collect();
        for scope in scopes {
            self.watch(&scope, step);
        }
    }

    /// Keep the ready tree served (publish nothing, change no phase) while
    /// what it lacks now is only devices whose pools are gone, for at most
    /// the pool grace; then the loss is published as any other.
    fn holding(&mut self, now: Instant, ready: bool, res: &Resolution, step: &mut Step) -> bool {
        let pools_gone = self.mode == Mode::Follow
            && !self.pool_grace.is_zero()
            && self.phase == Phase::Ready
            && !ready
            && !res.missing.is_empty()
            && res.missing.iter().all(|m| matches!(m, Missing::Device { pool_gone: true, .. }));
        if !pools_gone {
            self.holding_since = None;
            return false;
        }
        let grace = self.pool_grace;
        let since = *self.holding_since.get_or_insert_with(|| {
            step.actions.push(Action::Recheck { after: grace });
            let pools: BTreeSet<String> = res
                .missing
                .iter()
                .filter_map(|m| match m {
                    Missing::Device { driver, pool, .. } => Some(format!("{driver}/{pool}")),
                    _ => None,
                })
                .collect();
            step.warnings.push(format!(
                "no ResourceSlice publishes pool {} any more: the tree is kept for up to {} s while the driver publishes it again",
                pools.into_iter().collect::<Vec<_>>().join(", "),
                grace.as_secs()
            ));
            now
        });
        now.saturating_duration_since(since) < grace
    }

    /// `init` waits by watching only the scopes that can bring what is missing.
    fn watch_what_is_missing(&mut self, res: &Resolution, built: &BuiltTree, step: &mut Step) {
        // A missing --require path may be a device value or a claim's status.
        let requirement_missing = built.missing.len() > res.missing.len();
        let mut claims: BTreeSet<String> = BTreeSet::new();
        let mut devices = requirement_missing;
        for m in &res.missing {
            match m {
                Missing::ClaimNotFound { claim_name, .. } | Missing::ClaimNotAllocated { claim_name, .. } => {
                    claims.insert(claim_name.clone());
                }
                Missing::Device { .. } => devices = true,
                _ => {}
            }
        }
        let scopes: Vec<Scope> = self
            .store
            .scopes()
            .filter(|s| match s {
                Scope::Claim(name) => requirement_missing || claims.contains(name),
                Scope::NodeSlices(_) | Scope::DriverSlices(_) => devices,
                Scope::Pod(_) => false,
            })
            .cloned()
            .collect();
        for scope in scopes {
            self.watch(&scope, step);
        }
    }

    fn summary(&self, res: &Resolution, now: Instant) -> String {
        let devices: usize = res.claims.iter().map(|c| c.devices.len()).sum();
        let plural = |n: usize, word: &str| if n == 1 { format!("{n} {word}") } else { format!("{n} {word}s") };
        let elapsed = self.started.map(|s| now.saturating_duration_since(s)).unwrap_or_default();
        format!(
            "{} of {} ready after {} ms",
            plural(devices, "device"),
            plural(res.claims.len(), "claim"),
            elapsed.as_millis()
        )
    }

    /// What the run is still waiting for, with the last error of each, for the timeout message.
    pub fn waiting_for(&self) -> Vec<String> {
        let mut out = Vec::new();
        let error = |scope: &Scope| match self.trackers.get(scope) {
            Some(Tracker { error: Some(e), .. }) => format!(": {e}"),
            Some(Tracker { listing: true, .. }) => ": no answer from the API server yet".into(),
            _ => String::new(),
        };
        if self.store.pod.is_none() {
            let pod = format!("pod {}/{}", self.pod_ref.namespace, self.pod_ref.name);
            out.push(format!("{pod} not fetched yet{}", error(&self.pod_scope())));
        }
        for scope in self.store.unlisted() {
            out.push(format!("{scope} not listed yet{}", error(&scope)));
        }
        if out.is_empty() {
            out.extend(self.last_missing.iter().cloned());
        }
        if out.is_empty() {
            out.push("no resolution yet".into());
        }
        out
    }
}

/// What a resolution that is not ready waits for.
fn waiting_phase(res: &Resolution) -> Phase {
    let claims_pending = res.missing.iter().any(|m| {
        matches!(
            m,
            Missing::NotScheduled
                | Missing::ClaimStatusPending { .. }
                | Missing::ClaimNotFound { .. }
                | Missing::ClaimNotAllocated { .. }
        )
    });
    if claims_pending { Phase::WaitingForClaims } else { Phase::WaitingForDevices }
}
/// A claim a file does not hold is not "not found" in a cluster: say where
/// it is missing and how to add it.
fn explain_claims_not_in(shown: &str, res: &mut Resolution) {
    let namespace = res.pod.namespace.clone();
    for missing in &mut res.missing {
        if let Missing::ClaimNotFound { pod_claim, claim_name } = missing {
            *missing = Missing::Invalid {
                what: format!("claim {pod_claim}"),
                problem: format!(
                    "ResourceClaim {claim_name} is not in {shown} (add it: kubectl get resourceclaim -n {namespace} {claim_name} -o yaml)"
                ),
            };
        }
    }
}

fn needs_pod_refresh(res: &Resolution) -> bool {
    res.missing.iter().any(|m| matches!(m, Missing::ClaimStatusPending { .. } | Missing::NotScheduled))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    const NS: &str = "ns";

    /// The time every input of a test arrives at, unless it says otherwise.
    fn t0() -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now)
    }

    fn pod_ref() -> PodRef {
        PodRef { namespace: NS.into(), name: "p".into() }
    }

    fn pod(claims: &[(&str, &str)], generated: &[(&str, &str)]) -> Input {
        let spec: Vec<_> = claims
            .iter()
            .map(|(n, c)| match c.strip_prefix("template:") {
                Some(t) => json!({"name": n, "resourceClaimTemplateName": t}),
                None => json!({"name": n, "resourceClaimName": c}),
            })
            .collect();
        let statuses: Vec<_> = generated.iter().map(|(n, c)| json!({"name": n, "resourceClaimName": c})).collect();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": NS, "uid": "u1"},
            "spec": {"nodeName": "n1", "resourceClaims": spec, "containers": []},
            "status": {"resourceClaimStatuses": statuses}}))
        .unwrap();
        Input::Pod(Box::new(pod))
    }

    fn claim(name: &str, devices: &[&str]) -> Item {
        let mut c = json!({"metadata": {"name": name, "namespace": NS, "resourceVersion": "5"}, "spec": {}});
        if !devices.is_empty() {
            let results: Vec<_> = devices
                .iter()
                .map(|d| json!({"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": d}))
                .collect();
            c["status"] = json!({"allocation": {"devices": {"results": results}}});
        }
        Item::Claim(Box::new(serde_json::from_value::<ResourceClaim>(c).unwrap()))
    }

    fn slice(name: &str, node: Option<&str>, generation: i64, devices: &[(&str, &str)]) -> Item {
        let devices: Vec<_> =
            devices.iter().map(|(d, uuid)| json!({"name": d, "attributes": {"uuid": {"string": uuid}}})).collect();
        let mut s = json!({"metadata": {"name": name, "resourceVersion": "9"},
            "spec": {"driver": "gpu.example.com", "pool": {"name": "n1", "generation": generation, "resourceSliceCount": 1},
                "devices": devices}});
        match node {
            Some(n) => s["spec"]["nodeName"] = json!(n),
            None => s["spec"]["allNodes"] = json!(true),
        }
        Item::Slice(Box::new(serde_json::from_value::<ResourceSlice>(s).unwrap()))
    }

    fn claim_scope(name: &str) -> Scope {
        Scope::Claim(name.into())
    }

    fn node_scope() -> Scope {
        Scope::NodeSlices("n1".into())
    }

    fn ended(scope: Scope, lasted: Duration, changes: usize) -> Input {
        Input::WatchEnded { scope, lasted, changes }
    }

    fn listed(scope: Scope, items: Vec<Item>, filter: Option<&DeviceFilter>) -> Input {
        Input::Listed { scope, items, resource_version: "10".into(), decoded_with: filter.cloned() }
    }

    fn filter_of(step: &Step) -> Option<DeviceFilter> {
        step.actions.iter().find_map(|a| match a {
            Action::Filter(f) => Some(f.clone()),
            _ => None,
        })
    }

    fn lists(step: &Step) -> Vec<Scope> {
        step.actions
            .iter()
            .filter_map(|a| match a {
                Action::List { scope, .. } => Some(scope.clone()),
                _ => None,
            })
            .collect()
    }

    fn watches(step: &Step) -> Vec<Scope> {
        step.actions
            .iter()
            .filter_map(|a| match a {
                Action::Watch { scope, .. } => Some(scope.clone()),
                _ => None,
            })
            .collect()
    }

    fn uuid(p: &Publication) -> String {
        String::from_utf8(p.built.tree.get("gpu/gpu/0/uuid").unwrap_or_default().to_vec()).unwrap()
    }

    /// Pod, then its claim and the node's slices listed: the first reads.
    fn first_reads(r: &mut Reconciler, devices: &[&str], slices: Vec<Item>) -> (Step, Step) {
        assert_eq!(r.start(t0()).actions, vec![Action::GetPod { after: Duration::ZERO }]);
        let step = r.handle(t0(), pod(&[("gpu", "c")], &[]));
        assert_eq!(lists(&step), vec![claim_scope("c"), node_scope()], "claim and slices listed together");
        assert_eq!(r.phase(), Phase::WaitingForClaims);
        let claims = r.handle(t0(), listed(claim_scope("c"), vec![claim("c", devices)], None));
        let filter = filter_of(&claims).expect("the filter once the claims are listed");
        let slices = r.handle(t0(), listed(node_scope(), slices, Some(&filter)));
        (claims, slices)
    }

    #[test]
    fn init_ready_from_the_first_reads_publishes_and_stops_without_a_watch() {
        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
        let (claims, step) =
            first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "U0"), ("g1", "U1")])]);
        assert_eq!(filter_of(&claims).unwrap().len(), 1);
        assert!(matches!(step.transition, Some(Transition::Ready { .. })), "{:?}", step.transition);
        assert_eq!(uuid(step.publish.as_ref().unwrap()), "U0");
        assert!(step.publish.as_ref().unwrap().built.tree.get("gpu/gpu/1/uuid").is_none());
        assert!(matches!(step.done, Some(Ok(_))));
        assert!(watches(&step).is_empty() && lists(&step).is_empty(), "{:?}", step.actions);
        assert_eq!(r.phase(), Phase::Ready);
        // Nothing after the end.
        assert!(r.handle(t0(), Input::Deadline).done.is_none());
    }

    #[test]
    fn init_watches_only_the_unallocated_claim_then_fetches_the_devices_again() {
        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
        let (_, step) = first_reads(&mut r, &[], vec![slice("s", Some("n1"), 1, &[("g0", "U0")])]);
        assert!(step.done.is_none() && step.publish.is_none());
        assert_eq!(watches(&step), vec![claim_scope("c")], "only the claim can bring what is missing");
        assert!(
            matches!(&step.transition, Some(Transition::Waiting { missing }) if missing[0].contains("not allocated"))
        );
        assert_eq!(r.phase(), Phase::WaitingForClaims);
        // The allocation arrives: the slices were kept without g0, so they are listed again.
        let step = r.handle(t0(), Input::Applied { scope: claim_scope("c"), item: claim("c", &["g0"]) });
        let filter = filter_of(&step).unwrap();
        assert_eq!(lists(&step), vec![node_scope()]);
        assert!(step.publish.is_none(), "no resolution from slices decoded without the device");
        let step =
            r.handle(t0(), listed(node_scope(), vec![slice("s", Some("n1"), 1, &[("g0", "U0")])], Some(&filter)));
        assert_eq!(uuid(step.publish.as_ref().unwrap()), "U0");
        assert!(matches!(step.done, Some(Ok(_))));
    }

    #[test]
    fn a_device_on_no_node_slice_lists_then_watches_its_drivers_unbound_slices() {
        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
        let (_, step) = first_reads(&mut r, &["g0"], vec![]);
        let driver = Scope::DriverSlices("gpu.example.com".into());
        assert_eq!(lists(&step), vec![driver.clone()]);
        assert!(watches(&step).is_empty(), "first the unbound slices are listed");
        let filter = r.filter.clone().unwrap();
        let step = r.handle(t0(), listed(driver.clone(), vec![], Some(&filter)));
        assert_eq!(watches(&step), vec![node_scope(), driver.clone()], "the claim is there: only slices are watched");
        assert_eq!(r.phase(), Phase::WaitingForDevices);
        let step =
            r.handle(t0(), Input::Applied { scope: driver, item: slice("shared", None, 1, &[("g0", "SHARED")]) });
        assert_eq!(uuid(step.publish.as_ref().unwrap()), "SHARED");
        assert!(matches!(step.done, Some(Ok(_))));
    }

    #[test]
    fn serve_follows_every_scope_once_and_reports_each_transition() {
        let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
        let (_, step) = first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
        assert!(matches!(step.transition, Some(Transition::Ready { .. })));
        assert!(step.done.is_none());
        assert_eq!(watches(&step), vec![claim_scope("c"), node_scope()]);
        // An update: published, and no second watch for the same scope.
        let step =
            r.handle(t0(), Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", "B")]) });
        assert_eq!(step.transition, Some(Transition::Updated));
        assert_eq!(uuid(step.publish.as_ref().unwrap()), "B");
        assert!(watches(&step).is_empty());
        // The same again: nothing to publish.
        let step =
            r.handle(t0(), Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", "B")]) });
        assert!(step.publish.is_none() && step.transition.is_none());
        // The slice goes: first the driver's unbound slices are looked at,
        // then the tree is kept while the pool may come back, then the values are lost.
        let step = r.handle(
            t0(),
            Input::Deleted { scope: node_scope(), name: "s".into(), resource_version: Some("11".into()) },
        );
        let driver = Scope::DriverSlices("gpu.example.com".into());
        assert_eq!(lists(&step), vec![driver.clone()]);
        assert!(step.transition.is_none());
        let filter = r.filter.clone().unwrap();
        let step = r.handle(t0(), listed(driver.clone(), vec![], Some(&filter)));
        assert!(step.transition.is_none() && step.publish.is_none(), "kept while its pool may come back");
        assert!(step.actions.contains(&Action::Recheck { after: VANISHED_POOL_GRACE }));
        assert_eq!(watches(&step), vec![driver], "the new scope is followed too");
        let step = r.handle(t0() + VANISHED_POOL_GRACE, Input::Recheck);
        assert!(matches!(&step.transition, Some(Transition::Lost { missing }) if !missing.is_empty()));
        assert_eq!(r.phase(), Phase::Degraded);
        let step =
            r.handle(t0(), Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 2, &[("g0", "C")]) });
        assert_eq!(step.transition, Some(Transition::Recovered));
        assert_eq!(uuid(step.publish.as_ref().unwrap()), "C");
        // A watch that ends is resumed from the last version seen; an expired one is listed again.
        let step =
            r.handle(t0(), ended(node_scope(), Duration::from_secs(crate::engine::api::WATCH_SECONDS_MIN.into()), 0));
        assert!(
            matches!(&step.actions[..], [Action::Watch { scope, resource_version, after }] if *scope == node_scope() && resource_version == "9" && after.is_zero())
        );
        let step = r.handle(t0(), Input::Expired(node_scope()));
        assert_eq!(lists(&step), vec![node_scope()]);
        assert!(watches(&step).is_empty(), "no watch while the relist runs");
        // After ready, the deadline no longer applies.
        assert!(r.handle(t0(), Input::Deadline).done.is_none());
    }

    /// A kubelet starting deletes its node's slices; the driver publishes
    /// them again a while later: the tree served meanwhile is the last one,
    /// whole, and what changed while the pool was gone shows once it is back.
    #[test]
    fn a_pool_gone_for_a_while_keeps_the_tree_and_one_the_driver_changed_does_not() {
        let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
        let driver = Scope::DriverSlices("gpu.example.com".into());
        first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
        r.handle(t0(), Input::Deleted { scope: node_scope(), name: "s".into(), resource_version: None });
        let filter = r.filter.clone().unwrap();
        let step = r.handle(t0(), listed(driver.clone(), vec![], Some(&filter)));
        assert!(step.publish.is_none() && step.transition.is_none());
        assert!(
            step.warnings.iter().any(|w| w.contains("gpu.example.com/n1") && w.contains("kept")),
            "{:?}",
            step.warnings
        );
        assert_eq!(r.phase(), Phase::Ready);
        // Back before the grace ends, changed: published as an update, the loss never shown.
        let later = t0() + VANISHED_POOL_GRACE / 2;
        let step =
            r.handle(later, Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 2, &[("g0", "B")]) });
        assert_eq!(step.transition, Some(Transition::Updated));
        assert_eq!(uuid(step.publish.as_ref().unwrap()), "B");
        // The recheck asked for then finds nothing to do.
        let step = r.handle(t0() + VANISHED_POOL_GRACE, Input::Recheck);
        assert!(step.publish.is_none() && step.transition.is_none());
        // Gone a second time: a new grace from then, not what is left of the first.
        let again = t0() + VANISHED_POOL_GRACE * 2;
        let step = r.handle(again, Input::Deleted { scope: node_scope(), name: "s".into(), resource_version: None });
        assert!(step.transition.is_none() && step.actions.contains(&Action::Recheck { after: VANISHED_POOL_GRACE }));
        let step = r.handle(again + VANISHED_POOL_GRACE / 2, Input::Recheck);
        assert!(step.transition.is_none(), "still within the second grace");
        // A pool that is there and no longer lists the device: lost at once.
        let step = r.handle(
            again + VANISHED_POOL_GRACE / 2,
            Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 3, &[("g1", "C")]) },
        );
        assert!(
            matches!(&step.transition, Some(Transition::Lost { missing }) if missing[0].contains("does not list it")),
            "{:?}",
            step.transition
        );
    }

    /// The pod as fetched at resource version `rv`, with the kubelet's health of g0.
    fn pod_at(rv: &str, health: Option<&str>) -> Box<Pod> {
        let Input::Pod(mut p) = pod(&[("gpu", "c")], &[]) else { unreachable!() };
        p.metadata.resource_version = Some(rv.into());
        if let Some(h) = health {
            p.status.as_mut().unwrap().container_statuses = Some(vec![
                serde_json::from_value(json!({
                "name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": [
                    {"resourceID": "gpu.example.com/n1/g0", "health": h}]}]}))
                .unwrap(),
            ]);
        }
        p
    }

    /// `serve` ready from the first reads, the pod fetched at version 3: the
    /// reconciler and the step that made it ready.
    fn serving_pod_at_version_3() -> (Reconciler, Step) {
        let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
        r.start(t0());
        r.handle(t0(), Input::Pod(pod_at("3", None)));
        let claims = r.handle(t0(), listed(claim_scope("c"), vec![claim("c", &["g0"])], None));
        let filter = filter_of(&claims).unwrap();
        let step = r.handle(t0(), listed(node_scope(), vec![slice("s", Some("n1"), 1, &[("g0", "A")])], Some(&filter)));
        (r, step)
    }

    #[test]
    fn serve_watches_the_pod_from_its_fetched_version_and_only_gets_it_again() {
        let pod_scope = Scope::Pod("p".into());
        let (mut r, step) = serving_pod_at_version_3();
        assert!(matches!(step.transition, Some(Transition::Ready { .. })));
        assert!(step.actions.iter().any(|a| matches!(a, Action::Watch { scope, resource_version, .. }
            if *scope == pod_scope && resource_version == "3")));
        assert!(step.publish.unwrap().built.tree.get("gpu/gpu/0/.health").is_none());
        // The kubelet reports the device: the watch brings the pod, the tree has its health.
        let step = r
            .handle(t0(), Input::Applied { scope: pod_scope.clone(), item: Item::Pod(pod_at("4", Some("Unhealthy"))) });
        assert_eq!(step.transition, Some(Transition::Updated));
        assert_eq!(step.publish.unwrap().built.tree.get("gpu/gpu/0/.health"), Some(&b"Unhealthy"[..]));
        // Another pod on the pod's watch is not taken.
        let mut other = pod_at("5", Some("Healthy"));
        other.metadata.name = Some("q".into());
        let step = r.handle(t0(), Input::Applied { scope: pod_scope.clone(), item: Item::Pod(other) });
        assert!(step.publish.is_none());
        assert!(step.actions.iter().any(|a| matches!(a, Action::GetPod { .. })), "the pod is fetched again");
        r.handle(t0(), Input::Pod(pod_at("6", Some("Unhealthy"))));
        // 410 Gone: the pod is fetched again (never listed), and watched from that answer.
        r.handle(t0(), ended(pod_scope.clone(), Duration::from_secs(crate::engine::api::WATCH_SECONDS_MIN.into()), 1));
        let step = r.handle(t0(), Input::Expired(pod_scope.clone()));
        assert!(step.actions.iter().any(|a| matches!(a, Action::GetPod { .. })), "{:?}", step.actions);
        assert!(lists(&step).is_empty() && watches(&step).is_empty());
        let step = r.handle(t0(), Input::Pod(pod_at("9", Some("Healthy"))));
        assert!(step.actions.iter().any(|a| matches!(a, Action::Watch { scope, resource_version, .. }
            if *scope == pod_scope && resource_version == "9")));
        assert_eq!(step.publish.unwrap().built.tree.get("gpu/gpu/0/.health"), Some(&b"Healthy"[..]));
        // Forbidden (RBAC without watch on pods): a warning, and no more tries.
        let forbidden =
            ApiError::Forbidden { verb: "watch", resource: "pods".into(), scope: String::new(), message: "no".into() };
        let step = r.handle(t0(), Input::Failed { scope: pod_scope.clone(), error: forbidden });
        assert!(step.done.is_none(), "serve goes on");
        assert!(step.warnings.iter().any(|w| w.contains("device health will not follow")), "{:?}", step.warnings);
        assert!(step.actions.is_empty());
        let step = r.handle(t0(), Input::Pod(pod_at("12", Some("Unhealthy"))));
        assert!(watches(&step).is_empty(), "{:?}", step.actions);
    }

    /// After ready, fetching the pod again (its watch expired) during an outage
    /// retries on the run's trouble backoff (up to 30 s), not the start-up one
    /// (up to 5 s): an outage costs as few requests as for any other scope.
    #[test]
    fn refetching_the_pod_after_ready_backs_off_like_every_other_scope() {
        let (mut r, ready) = serving_pod_at_version_3();
        assert!(matches!(ready.transition, Some(Transition::Ready { .. })));
        let step = r.handle(t0(), Input::Expired(Scope::Pod("p".into())));
        assert!(step.actions.iter().any(|a| matches!(a, Action::GetPod { .. })));
        let mut delays = Vec::new();
        for _ in 0..6 {
            let failed = ApiError::Failed {
                verb: "get",
                resource: "pods".into(),
                scope: String::new(),
                message: "HTTP 503".into(),
                code: Some(503),
            };
            let step = r.handle(t0(), Input::PodFailed(failed));
            assert!(step.done.is_none(), "serve goes on");
            delays.extend(step.actions.iter().filter_map(|a| match a {
                Action::GetPod { after } => Some(*after),
                _ => None,
            }));
        }
        assert_eq!(delays.len(), 6, "one retry per failure");
        assert!(delays.iter().max().unwrap() > &Duration::from_secs(5), "{delays:?}");
    }

    /// `init` never watches the pod.
    #[test]
    fn init_does_not_follow_the_pod() {
        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
        r.start(t0());
        let step = r.handle(t0(), Input::Pod(pod_at("3", None)));
        assert!(!r.store.has_scope(&Scope::Pod("p".into())));
        assert!(watches(&step).is_empty());
    }

    #[test]
    fn api_errors_end_a_run_only_while_not_ready() {
        let forbidden = ApiError::Forbidden {
            verb: "list",
            resource: "resourceslices".into(),
            scope: String::new(),
            message: "no".into(),
        };
        let failed = ApiError::Failed {
            verb: "list",
            resource: "resourceslices".into(),
            scope: String::new(),
            message: "HTTP 500".into(),
            code: Some(500),
        };
        // Before ready: 403 ends the run; 500 is retried with growing delays.
        let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
        r.start(t0());
        r.handle(t0(), pod(&[("gpu", "c")], &[]));
        let step = r.handle(t0(), Input::Failed { scope: node_scope(), error: failed.clone() });
        assert!(matches!(&step.actions[..], [Action::List { after, .. }] if *after == Duration::from_millis(200)));
        assert_eq!(step.warnings.len(), 1);
        let step = r.handle(t0(), Input::Failed { scope: node_scope(), error: failed.clone() });
        assert!(matches!(&step.actions[..], [Action::List { after, .. }] if *after == Duration::from_millis(400)));
        assert!(step.warnings.is_empty(), "the same warning is not repeated");
        let waiting = r.waiting_for().join("; ");
        assert!(waiting.contains("not listed yet: cannot list") || waiting.contains("HTTP 500"), "{waiting}");
        let step = r.handle(t0(), Input::Failed { scope: node_scope(), error: forbidden.clone() });
        assert!(matches!(step.done, Some(Err(EngineError::Api(ApiError::Forbidden { .. })))));
        // After ready: the same 403 is retried and the last tree stays.
        let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
        first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
        let step = r.handle(t0(), Input::Failed { scope: node_scope(), error: forbidden });
        assert!(step.done.is_none() && step.publish.is_none());
        assert_eq!(lists(&step), vec![node_scope()]);
    }

    #[test]
    fn the_deadline_says_what_is_still_missing() {
        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
        r.start(t0());
        let step = r.handle(
            t0(),
            Input::PodFailed(ApiError::Failed {
                verb: "get",
                resource: "pods".into(),
                scope: " (ns/p)".into(),
                message: "no answer within 3000 ms".into(),
                code: None,
            }),
        );
        assert!(matches!(step.actions[..], [Action::GetPod { .. }]));
        let step = r.handle(t0(), Input::Deadline);
        let Some(Err(EngineError::Timeout { waiting_for })) = step.done else { panic!("{:?}", step.done) };
        assert_eq!(waiting_for.len(), 1);
        assert!(
            waiting_for[0].contains("pod ns/p not fetched yet") && waiting_for[0].contains("no answer"),
            "{waiting_for:?}"
        );

        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
        first_reads(&mut r, &[], vec![]);
        let Some(Err(EngineError::Timeout { waiting_for })) = r.handle(t0(), Input::Deadline).done else { panic!() };
        assert!(waiting_for[0].contains("ResourceClaim c is not allocated yet"), "{waiting_for:?}");
    }

    #[test]
    fn a_generated_claim_not_in_the_pod_status_refetches_the_pod() {
        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
        r.start(t0());
        let step = r.handle(t0(), pod(&[("gpu", "template:t")], &[]));
        assert_eq!(lists(&step), vec![node_scope()], "no claim to list yet");
        let filter = filter_of(&step).unwrap();
        let step = r.handle(t0(), listed(node_scope(), vec![], Some(&filter)));
        assert!(
            matches!(&step.actions[..], [Action::GetPod { after }] if *after > Duration::ZERO),
            "{:?}",
            step.actions
        );
        assert_eq!(r.phase(), Phase::WaitingForClaims);
        let step = r.handle(t0(), pod(&[("gpu", "template:t")], &[("gpu", "p-gpu-x")]));
        assert_eq!(lists(&step), vec![claim_scope("p-gpu-x")]);
    }

    #[test]
    fn a_claim_the_pod_does_not_have_ends_the_run_at_once() {
        let sel = Selection { claims: vec!["nope".into()] };
        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), sel, vec![]);
        r.start(t0());
        let step = r.handle(t0(), pod(&[("gpu", "c")], &[]));
        let step = if step.done.is_some() { step } else { r.handle(t0(), listed(node_scope(), vec![], None)) };
        assert!(
            matches!(step.done, Some(Err(EngineError::Permanent(Missing::UnknownClaim { .. })))),
            "{:?}",
            step.done
        );
    }

    #[test]
    fn a_pod_that_is_not_the_one_asked_for_is_not_used() {
        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
        r.start(t0());
        let Input::Pod(mut other) = pod(&[("gpu", "c")], &[]) else { unreachable!() };
        other.metadata.name = Some("someone-else".into());
        let step = r.handle(t0(), Input::Pod(other));
        assert!(
            matches!(&step.actions[..], [Action::GetPod { after }] if *after > Duration::ZERO),
            "{:?}",
            step.actions
        );
        assert!(step.warnings[0].contains("answered with pod ns/someone-else"), "{:?}", step.warnings);
        assert_eq!(r.phase(), Phase::WaitingForPod);
    }

    #[test]
    fn objects_outside_a_scope_are_ignored_with_a_warning() {
        let mut r = Reconciler::new(Mode::Once, pod_ref(), Selection::default(), vec![]);
        r.start(t0());
        r.handle(t0(), pod(&[("gpu", "c")], &[]));
        // A server that ignored the selectors: another claim, and a claim of another namespace.
        let mut foreign: ResourceClaim = match claim("c", &["g0"]) {
            Item::Claim(c) => *c,
            _ => unreachable!(),
        };
        foreign.metadata.namespace = Some("other".into());
        let step =
            r.handle(t0(), listed(claim_scope("c"), vec![claim("x", &["g9"]), Item::Claim(Box::new(foreign))], None));
        assert_eq!(step.warnings.len(), 2, "{:?}", step.warnings);
        let filter = filter_of(&step).unwrap();
        assert!(filter.is_empty(), "nothing of the foreign claims is wanted");
        // Another node's slice on the node's watch is ignored too.
        let step = r.handle(t0(), listed(node_scope(), vec![slice("s", Some("n2"), 1, &[("g0", "X")])], Some(&filter)));
        assert_eq!(step.warnings.len(), 1);
        let Some(Ok(res)) = step.done else { panic!() };
        assert!(res.missing.iter().any(|m| matches!(m, Missing::ClaimNotFound { .. })));
    }

    #[test]
    fn a_flood_of_distinct_warnings_is_reported_once_each_and_remembered_within_a_bound() {
        let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
        first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
        assert_eq!(r.phase(), Phase::Ready);
        // A server that ignores the claim watch's field selector sends every
        // claim of the cluster: 100,000 distinct ones, each ignored with a warning.
        let other = |i: usize| {
            let metadata =
                ObjectMeta { name: Some(format!("other-{i}")), namespace: Some(NS.into()), ..Default::default() };
            let claim = ResourceClaim { metadata, ..Default::default() };
            Input::Applied { scope: claim_scope("c"), item: Item::Claim(Box::new(claim)) }
        };
        let mut reported = 0;
        for i in 0..100_000 {
            reported += r.absorb(t0(), [other(i)]).warnings.len();
            assert!(r.warned.len() <= WARNED_MAX, "{} warnings kept", r.warned.len());
        }
        assert_eq!(reported, 100_000, "each reported once");
        // The last WARNED_MAX are remembered: not reported again.
        assert!(r.absorb(t0(), [other(99_999), other(100_000 - WARNED_MAX)]).warnings.is_empty());
        // The first were forgotten: reported once more.
        assert_eq!(r.absorb(t0(), [other(0)]).warnings.len(), 1);
        // The pod's tree is unchanged throughout.
        let step = r.settle(t0());
        assert!(step.publish.is_none() && step.warnings.is_empty(), "{:?}", step.warnings);
        assert_eq!(r.phase(), Phase::Ready);
    }

    #[test]
    fn once_mode_answers_after_the_lists_without_watching() {
        let mut r = Reconciler::new(Mode::Once, pod_ref(), Selection::default(), vec![]);
        let (_, step) = first_reads(&mut r, &["g0"], vec![]);
        // A device is missing: the driver's unbound slices are listed first.
        let driver = Scope::DriverSlices("gpu.example.com".into());
        assert_eq!(lists(&step), vec![driver.clone()]);
        let filter = r.filter.clone().unwrap();
        let step = r.handle(t0(), listed(driver, vec![], Some(&filter)));
        assert!(watches(&step).is_empty() && step.publish.is_none());
        let Some(Ok(res)) = step.done else { panic!("{:?}", step.done) };
        assert!(!res.is_complete());
    }

    fn watch_after(step: &Step, want: &Scope) -> Option<Duration> {
        step.actions.iter().find_map(|a| match a {
            Action::Watch { scope, after, .. } if scope == want => Some(*after),
            _ => None,
        })
    }

    fn list_after(step: &Step, want: &Scope) -> Option<Duration> {
        step.actions.iter().find_map(|a| match a {
            Action::List { scope, after } if scope == want => Some(*after),
            _ => None,
        })
    }

    #[test]
    fn failing_watches_back_off_and_a_successful_list_does_not_reset_it() {
        let failed = |verb| Input::Failed {
            scope: node_scope(),
            error: ApiError::Forbidden {
                verb,
                resource: "resourceslices".into(),
                scope: String::new(),
                message: "no watch".into(),
            },
        };
        let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
        let (_, step) = first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
        assert_eq!(watch_after(&step, &node_scope()), Some(Duration::ZERO), "the first watch at once");
        // A watch the server refuses: watched again from the same version, later (no list needed).
        let step = r.handle(t0(), failed("watch"));
        let first = watch_after(&step, &node_scope()).expect("watched again");
        assert!(first >= WatchBackoff::INITIAL, "{first:?}");
        assert!(lists(&step).is_empty() && step.publish.is_none());
        let step = r.handle(t0(), failed("watch"));
        let second = watch_after(&step, &node_scope()).unwrap();
        assert!(second >= 2 * WatchBackoff::INITIAL, "{second:?} after {first:?}");
        // 410 Gone: listed again after a delay; the list succeeds, and the
        // next trouble still waits longer (client-go's reflector does the same).
        let step = r.handle(t0(), Input::Expired(node_scope()));
        let relist = list_after(&step, &node_scope()).expect("relisted");
        assert!(relist >= 4 * WatchBackoff::INITIAL, "{relist:?}");
        let step =
            r.handle(t0(), listed(node_scope(), vec![slice("s", Some("n1"), 1, &[("g0", "A")])], r.filter.as_ref()));
        assert_eq!(watch_after(&step, &node_scope()), Some(Duration::ZERO), "a fresh list is watched at once");
        let step = r.handle(t0(), Input::Expired(node_scope()));
        let later = list_after(&step, &node_scope()).unwrap();
        assert!(later >= 8 * WatchBackoff::INITIAL && later <= WatchBackoff::CAP, "{later:?}");
        // One backoff for the run: another scope's trouble goes on from there.
        let step = r.handle(t0(), Input::Expired(claim_scope("c")));
        let claim = list_after(&step, &claim_scope("c")).unwrap();
        assert!(claim >= 16 * WatchBackoff::INITIAL && claim <= WatchBackoff::CAP, "{claim:?}");
    }

    #[test]
    fn a_watch_cut_short_without_a_change_is_resumed_later() {
        let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
        first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
        // Closed at once with nothing: resumed after a delay that grows.
        let step = r.handle(t0(), ended(node_scope(), Duration::from_millis(3), 0));
        let first = watch_after(&step, &node_scope()).expect("resumed");
        assert!(first >= WatchBackoff::INITIAL, "{first:?}");
        let step = r.handle(t0(), ended(node_scope(), Duration::from_millis(3), 0));
        assert!(watch_after(&step, &node_scope()).unwrap() > first);
        // Closed early, but it brought a change: resumed at once.
        let step = r.handle(t0(), ended(node_scope(), Duration::from_millis(3), 1));
        assert_eq!(watch_after(&step, &node_scope()), Some(Duration::ZERO));
        // Closed when its time was up: resumed at once.
        let step = r.handle(t0(), ended(claim_scope("c"), WATCH_CUT_SHORT, 0));
        assert_eq!(watch_after(&step, &claim_scope("c")), Some(Duration::ZERO));
    }

    #[test]
    fn the_pod_is_fetched_again_with_growing_delays_while_its_claim_is_pending() {
        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
        r.start(t0());
        let step = r.handle(t0(), pod(&[("gpu", "template:t")], &[]));
        let filter = filter_of(&step).unwrap();
        let step = r.handle(t0(), listed(node_scope(), vec![], Some(&filter)));
        let mut delays = Vec::new();
        let mut step = step;
        for _ in 0..4 {
            let after = step.actions.iter().find_map(|a| match a {
                Action::GetPod { after } => Some(*after),
                _ => None,
            });
            delays.push(after.expect("the pod again"));
            // The pod comes back, still without the generated claim.
            step = r.handle(t0(), pod(&[("gpu", "template:t")], &[]));
        }
        assert!(delays.windows(2).all(|w| w[1] > w[0]), "an answer does not reset the delay: {delays:?}");
    }

    #[test]
    fn a_batch_of_inputs_resolves_once_to_the_latest_state() {
        let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
        first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
        let burst = ["B", "C", "D"]
            .map(|uuid| Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", uuid)]) });
        let step = r.handle_all(t0(), burst);
        assert_eq!(uuid(step.publish.as_ref().expect("one publication")), "D");
        assert_eq!(step.transition, Some(Transition::Updated));
        // A change and its undoing in one batch: nothing to publish.
        let step = r.handle_all(
            t0(),
            [
                Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", "E")]) },
                Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", "D")]) },
            ],
        );
        assert!(step.publish.is_none() && step.transition.is_none());
        // Taken in while a tree is written, resolved once afterwards.
        for uuid in ["F", "G"] {
            let step = r.absorb(
                t0(),
                [Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", uuid)]) }],
            );
            assert!(step.publish.is_none() && step.actions.is_empty());
        }
        assert!(r.is_unsettled());
        assert_eq!(uuid(r.settle(t0()).publish.as_ref().unwrap()), "G");
        assert!(!r.is_unsettled() && r.settle(t0()).publish.is_none());
    }

    /// Every row of the transition table, as a reader of `serve`'s Events
    /// expects them: the first ready, a loss, a recovery, updates only while
    /// ready, and while waiting only a change of what is missing.
    #[test]
    fn the_transition_table() {
        use Change::*;
        let phases =
            [Phase::WaitingForPod, Phase::WaitingForClaims, Phase::WaitingForDevices, Phase::Ready, Phase::Degraded];
        for was in phases {
            for (ready, missing_changed, tree_changed) in
                (0..8).map(|bits| (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0))
            {
                let want = match (was, ready) {
                    (Phase::Ready, true) => tree_changed.then_some(Updated),
                    (Phase::Ready, false) => Some(Lost),
                    (Phase::Degraded, true) => Some(Recovered),
                    (Phase::Degraded, false) => None,
                    (_, true) => Some(Ready),
                    (_, false) => missing_changed.then_some(Waiting),
                };
                assert_eq!(
                    change(was, ready, missing_changed, tree_changed),
                    want,
                    "from {was:?}, ready {ready}, missing changed {missing_changed}, tree changed {tree_changed}"
                );
            }
        }
    }

    /// Once ready, a run never goes back to waiting: the pod gains a claim
    /// (its status names a generated one) and while that claim is listed, the
    /// tree published stays served and the run stays ready.
    #[test]
    fn a_ready_run_stays_ready_while_a_new_scope_is_listed() {
        let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
        first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
        assert_eq!(r.phase(), Phase::Ready);
        let step = r.handle(t0(), pod(&[("gpu", "c"), ("extra", "template:t")], &[("extra", "p-extra-x")]));
        assert_eq!(lists(&step), vec![claim_scope("p-extra-x")]);
        assert_eq!(r.phase(), Phase::Ready, "the published tree is still served");
        assert!(step.transition.is_none() && step.publish.is_none());
        assert!(r.handle(t0(), Input::Deadline).done.is_none(), "no deadline after ready");
    }

    /// The clock is an input: the summary counts from `start`, and the run's
    /// backoff forgets trouble after a quiet spell of RESET_AFTER.
    #[test]
    fn time_comes_with_the_inputs() {
        let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
        r.start(t0());
        let later = t0() + Duration::from_millis(1500);
        r.handle(later, pod(&[("gpu", "c")], &[]));
        let claims = r.handle(later, listed(claim_scope("c"), vec![claim("c", &["g0"])], None));
        let filter = filter_of(&claims).unwrap();
        let step =
            r.handle(later, listed(node_scope(), vec![slice("s", Some("n1"), 1, &[("g0", "A")])], Some(&filter)));
        assert!(
            matches!(&step.transition, Some(Transition::Ready { summary }) if summary.ends_with("after 1500 ms")),
            "{:?}",
            step.transition
        );
        let mut at = later;
        let mut last = Duration::ZERO;
        for _ in 0..4 {
            let step = r.handle(at, Input::Expired(node_scope()));
            last = list_after(&step, &node_scope()).unwrap();
            r.handle(at, listed(node_scope(), vec![slice("s", Some("n1"), 1, &[("g0", "A")])], Some(&filter)));
        }
        assert!(last >= 8 * WatchBackoff::INITIAL, "{last:?}");
        at += last + WatchBackoff::RESET_AFTER;
        let step = r.handle(at, Input::Expired(node_scope()));
        let after = list_after(&step, &node_scope()).unwrap();
        assert!(after < 2 * WatchBackoff::INITIAL, "a quiet spell resets the backoff: {after:?}");
    }
}
