//! The reconciler: what drafs knows, what it publishes, and what it asks the
//! API for next, as a plain value.
//!
//! It never does I/O. The engine in `source` feeds it [`Input`]s (the pod, a
//! list, a watch event, an error, the deadline) and carries out the
//! [`Action`]s of each [`Step`] (get the pod, list a scope, watch it from a
//! resource version, decode slices with a new device filter); the drive loop
//! (`drive`) hands what the step publishes and its [`Transition`] to the outputs. `init`, `serve`,
//! `get` and `exec` differ only in their [`Mode`].

use std::collections::{BTreeMap, BTreeSet};
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

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    WaitingForPod,
    WaitingForClaims,
    WaitingForDevices,
    Ready,
    /// Was ready, and values went missing since.
    Degraded,
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

/// The reconciler.
#[derive(Debug)]
pub struct Reconciler {
    mode: Mode,
    pod_ref: PodRef,
    selection: Selection,
    require: Vec<RequirePath>,
    store: Store,
    phase: Phase,
    ever_ready: bool,
    ready: bool,
    done: bool,
    /// The filter the engine decodes with, once every claim is listed.
    filter: Option<DeviceFilter>,
    /// The filter each slice scope was last listed with.
    listed_with: BTreeMap<Scope, DeviceFilter>,
    listing: BTreeSet<Scope>,
    watching: BTreeSet<Scope>,
    pod_pending: bool,
    /// The pod's watch was refused (401/403): serve goes on without it.
    pod_watch_refused: bool,
    /// Start-up retries: the pod, and each scope until its first list.
    backoff: BTreeMap<String, RetryBackoff>,
    /// Retries of scopes listed once (see [`WatchBackoff`]).
    trouble: WatchBackoff,
    /// Scopes whose next watch waits this long (it failed or was cut short).
    watch_after: BTreeMap<Scope, Duration>,
    /// The last error of the pod ("pod") or of each scope, for the timeout message.
    errors: BTreeMap<String, String>,
    warned: BTreeSet<String>,
    published: Option<Tree>,
    last_missing: Vec<String>,
    started: Instant,
    /// Inputs were taken in since the last resolution.
    unsettled: bool,
}

const POD_KEY: &str = "pod";

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
            phase: Phase::WaitingForPod,
            ever_ready: false,
            ready: false,
            done: false,
            filter: None,
            listed_with: BTreeMap::new(),
            listing: BTreeSet::new(),
            watching: BTreeSet::new(),
            pod_pending: false,
            pod_watch_refused: false,
            backoff: BTreeMap::new(),
            trouble: WatchBackoff::new(seed),
            watch_after: BTreeMap::new(),
            errors: BTreeMap::new(),
            warned: BTreeSet::new(),
            published: None,
            last_missing: Vec::new(),
            started: Instant::now(),
            unsettled: false,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn pod_uid(&self) -> Option<String> {
        self.store.pod.as_ref().and_then(|p| p.metadata.uid.clone()).filter(|u| !u.is_empty())
    }

    pub fn watching(&self) -> impl Iterator<Item = &Scope> {
        self.watching.iter()
    }

    /// The first step: fetch the pod.
    pub fn start(&mut self) -> Step {
        self.pod_pending = true;
        Step { actions: vec![Action::GetPod { after: Duration::ZERO }], ..Default::default() }
    }

    pub fn handle(&mut self, input: Input) -> Step {
        self.handle_all([input])
    }

    /// Take in every input, then resolve once: a burst of watch events costs
    /// one resolution and at most one tree, of the latest state.
    pub fn handle_all(&mut self, inputs: impl IntoIterator<Item = Input>) -> Step {
        let mut step = self.absorb(inputs);
        step.merge(self.settle());
        step
    }

    /// Take in inputs without resolving yet (the caller is still writing the
    /// last tree): only what the inputs themselves call for (retries, the
    /// end of a run) is in the step.
    pub fn absorb(&mut self, inputs: impl IntoIterator<Item = Input>) -> Step {
        let mut step = Step::default();
        for input in inputs {
            if self.done {
                break;
            }
            self.unsettled |= self.apply(input, &mut step);
        }
        step
    }

    /// Resolve what the inputs taken in since the last resolution changed.
    pub fn settle(&mut self) -> Step {
        let mut step = Step::default();
        if std::mem::take(&mut self.unsettled) {
            self.evaluate(&mut step);
        }
        step
    }

    /// Inputs were taken in and not resolved yet.
    pub fn is_unsettled(&self) -> bool {
        self.unsettled && !self.done
    }

    /// One input into the state; false when it changed nothing to resolve.
    fn apply(&mut self, input: Input, step: &mut Step) -> bool {
        match input {
            Input::Pod(pod) => match self.other_pod(&pod) {
                Some(error) => return self.apply(Input::PodFailed(error), step),
                None => self.on_pod(*pod, step),
            },
            Input::PodFailed(error) => {
                self.pod_pending = false;
                if self.fatal(&error, step) {
                    return false;
                }
                self.errors.insert(POD_KEY.into(), error.to_string());
                step.warnings.extend(self.warn_once(format!("{error}; retrying")));
                // Start-up waits for the pod: quick retries. Once ready, a refetch
                // (its watch expired) is trouble like any other scope's.
                let after =
                    if self.ever_ready { self.trouble.next(Instant::now()) } else { self.next_backoff(POD_KEY) };
                self.pod_pending = true;
                step.actions.push(Action::GetPod { after });
            }
            Input::Listed { scope, items, resource_version, decoded_with } => {
                return self.on_listed(scope, items, resource_version, decoded_with, step);
            }
            Input::Applied { scope, item: Item::Pod(pod) } => {
                // The watched pod: as if fetched, unless it is another one.
                if let Some(error) = self.other_pod(&pod) {
                    return self.on_failed(scope, error, step);
                }
                self.on_pod(*pod, step);
            }
            Input::Applied { scope, item } => {
                if let Some(item) = self.admit(&scope, vec![item], step).pop() {
                    self.store.apply(&scope, item);
                }
                self.errors.remove(&scope.to_string());
            }
            Input::Deleted { scope, name, resource_version } => self.store.delete(&scope, &name, resource_version),
            Input::Bookmark { scope, resource_version } => self.store.bookmark(&scope, resource_version),
            Input::WatchEnded { scope, lasted, changes } => {
                self.watching.remove(&scope);
                if changes == 0 && lasted < WATCH_CUT_SHORT {
                    let after = self.trouble.next(Instant::now());
                    self.watch_after.insert(scope, after);
                }
            }
            Input::Expired(scope) => {
                self.watching.remove(&scope);
                let after = self.trouble.next(Instant::now());
                self.list(scope, after, step);
            }
            Input::Failed { scope, error } => return self.on_failed(scope, error, step),
            Input::Deadline => {
                // The deadline only bounds the way to the first ready tree.
                if !self.ever_ready {
                    self.finish(Err(EngineError::Timeout { waiting_for: self.waiting_for() }), step);
                    return false;
                }
            }
        }
        true
    }

    /// Defence in depth: the object must be the pod asked for.
    fn other_pod(&self, pod: &Pod) -> Option<ApiError> {
        let (name, namespace) = (pod.metadata.name.as_deref(), pod.metadata.namespace.as_deref());
        if name == Some(self.pod_ref.name.as_str()) && namespace.is_none_or(|ns| ns == self.pod_ref.namespace) {
            return None;
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
        self.listing.remove(&scope);
        if !self.store.has_scope(&scope) {
            return false;
        }
        let items = self.admit(&scope, items, step);
        self.store.replace(&scope, items, resource_version);
        self.errors.remove(&scope.to_string());
        self.backoff.remove(&scope.to_string());
        if scope.is_slices() {
            let with = decoded_with.unwrap_or_default();
            let stale = self.filter.as_ref().is_some_and(|f| !f.is_subset(&with));
            self.listed_with.insert(scope.clone(), with);
            if stale {
                // The filter grew while this list was under way.
                self.list(scope, Duration::ZERO, step);
            }
        }
        true
    }

    /// A list or watch of a scope failed: fatal, or retried after a delay.
    fn on_failed(&mut self, scope: Scope, error: ApiError, step: &mut Step) -> bool {
        let was_watch = self.watching.remove(&scope);
        self.listing.remove(&scope);
        if matches!(scope, Scope::Pod(_)) && error.is_fatal() {
            // Only health follows the pod's watch: without the permission (RBAC
            // from before it was needed), serve goes on without it.
            self.store.remove_scope(&scope);
            self.watch_after.remove(&scope);
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
        let key = scope.to_string();
        step.warnings.extend(self.warn_once(format!("{error}; retrying")));
        self.errors.insert(key.clone(), error.to_string());
        if !self.store.is_listed(&scope) {
            // The first list: retried quickly, start-up is waiting for it.
            let after = self.next_backoff(&key);
            self.list(scope, after, step);
        } else if was_watch && error.is_watch() {
            // What the store holds is still good from its version: watch again, later.
            let after = self.trouble.next(Instant::now());
            self.watch_after.insert(scope, after);
        } else {
            let after = self.trouble.next(Instant::now());
            self.list(scope, after, step);
        }
        true
    }

    fn on_pod(&mut self, pod: Pod, step: &mut Step) {
        self.pod_pending = false;
        self.errors.remove(POD_KEY);
        // The backoff stays: the pod is fetched again only while its status
        // lacks a generated claim, and an answer that still lacks it must not
        // bring the next request closer.
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty());
        let claims: BTreeSet<String> = claim_names(&pod, &self.selection).into_iter().collect();
        if self.mode == Mode::Follow {
            // serve watches the pod from the version it was fetched at, for the
            // health the kubelet writes into its status: no request more at start.
            let scope = Scope::Pod(self.pod_ref.name.clone());
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
        if error.is_fatal() && !self.ever_ready {
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

    fn list(&mut self, scope: Scope, after: Duration, step: &mut Step) {
        if let Scope::Pod(_) = scope {
            // The pod is fetched, never listed; the watch resumes from the answer.
            self.watching.remove(&scope);
            self.watch_after.remove(&scope);
            if !self.pod_pending {
                self.pod_pending = true;
                step.actions.push(Action::GetPod { after });
            }
            return;
        }
        if self.listing.insert(scope.clone()) {
            self.watching.remove(&scope);
            self.watch_after.remove(&scope);
            step.actions.push(Action::List { scope, after });
        }
    }

    fn watch(&mut self, scope: &Scope, step: &mut Step) {
        if self.watching.contains(scope) || self.listing.contains(scope) || !self.store.is_listed(scope) {
            return;
        }
        if matches!(scope, Scope::Pod(_)) && self.pod_pending {
            // Its version is being renewed by a get.
            return;
        }
        let Some(rv) = self.store.resource_version(scope).map(String::from) else { return };
        self.watching.insert(scope.clone());
        let after = self.watch_after.remove(scope).unwrap_or_default();
        step.actions.push(Action::Watch { scope: scope.clone(), resource_version: rv, after });
    }

    fn next_backoff(&mut self, key: &str) -> Duration {
        self.backoff.entry(key.to_string()).or_default().next().unwrap_or_default()
    }

    fn warn_once(&mut self, warning: String) -> Option<String> {
        self.warned.insert(warning.clone()).then_some(warning)
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
        let stale: Vec<Scope> = self
            .listed_with
            .iter()
            .filter(|(scope, with)| self.store.is_listed(scope) && !wanted.is_subset(with))
            .map(|(scope, _)| scope.clone())
            .collect();
        for scope in stale {
            self.list(scope, Duration::ZERO, step);
        }
    }

    fn evaluate(&mut self, step: &mut Step) {
        if self.done {
            return;
        }
        if self.store.pod.is_none() {
            self.phase = Phase::WaitingForPod;
            return;
        }
        self.update_filter(step);
        let unlisted = self.store.unlisted();
        if unlisted.iter().any(|s| !s.is_slices()) {
            self.phase = Phase::WaitingForClaims;
            return;
        }
        // Slices decoded without a device now wanted are being listed again: wait for them.
        let filter = self.filter.clone().unwrap_or_default();
        let incomplete = self.listed_with.values().any(|with| !filter.is_subset(with));
        if !unlisted.is_empty() || incomplete {
            if !self.ever_ready {
                self.phase = Phase::WaitingForDevices;
            }
            return;
        }
        let res = resolve(&self.store.snapshot(), &self.selection);
        if let Some(permanent) = res.missing.iter().find(|m| m.is_permanent()) {
            self.finish(Err(EngineError::Permanent(permanent.clone())), step);
            return;
        }
        // Devices not on the node's slices may be on slices bound to no single node.
        let mut new_scopes = false;
        for driver in res.drivers_with_unpublished_devices() {
            let scope = Scope::DriverSlices(driver);
            if !self.store.has_scope(&scope) {
                new_scopes = true;
                self.add_and_list(scope, step);
            }
        }
        if new_scopes {
            self.phase = Phase::WaitingForDevices;
            return;
        }
        let built = tree::build(&res, &self.require);
        for w in built.warnings.clone() {
            step.warnings.extend(self.warn_once(w));
        }
        let ready = built.is_ready();
        if !ready && needs_pod_refresh(&res) && !self.pod_pending && self.mode != Mode::Once {
            self.pod_pending = true;
            let after = self.next_backoff(POD_KEY);
            step.actions.push(Action::GetPod { after });
        }
        match self.mode {
            Mode::Once => self.finish(Ok(res), step),
            Mode::UntilReady => {
                if ready {
                    step.transition = Some(Transition::Ready { summary: self.summary(&res) });
                    self.phase = Phase::Ready;
                    self.ever_ready = true;
                    step.publish = Some(Publication { resolution: res.clone(), built });
                    self.finish(Ok(res), step);
                } else {
                    self.phase = phase_of(&res);
                    if built.missing != self.last_missing {
                        step.transition = Some(Transition::Waiting { missing: built.missing.clone() });
                        self.last_missing = built.missing.clone();
                    }
                    self.watch_what_is_missing(&res, &built, step);
                }
            }
            Mode::Follow => {
                step.transition = match (self.ever_ready, self.ready, ready) {
                    (false, _, true) => Some(Transition::Ready { summary: self.summary(&res) }),
                    (true, false, true) => Some(Transition::Recovered),
                    (true, true, false) => Some(Transition::Lost { missing: built.missing.clone() }),
                    (false, _, false) if built.missing != self.last_missing => {
                        Some(Transition::Waiting { missing: built.missing.clone() })
                    }
                    (true, true, true) if self.published.as_ref() != Some(&built.tree) => Some(Transition::Updated),
                    _ => None,
                };
                self.ready = ready;
                self.ever_ready |= ready;
                self.phase = match (ready, self.ever_ready) {
                    (true, _) => Phase::Ready,
                    (false, true) => Phase::Degraded,
                    (false, false) => phase_of(&res),
                };
                self.last_missing = built.missing.clone();
                if self.published.as_ref() != Some(&built.tree) {
                    self.published = Some(built.tree.clone());
                    step.publish = Some(Publication { resolution: res, built });
                }
                let scopes: Vec<Scope> = self.store.scopes().cloned().collect();
                for scope in scopes {
                    self.watch(&scope, step);
                }
            }
        }
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

    fn summary(&self, res: &Resolution) -> String {
        let devices: usize = res.claims.iter().map(|c| c.devices.len()).sum();
        let plural = |n: usize, word: &str| if n == 1 { format!("{n} {word}") } else { format!("{n} {word}s") };
        format!(
            "{} of {} ready after {} ms",
            plural(devices, "device"),
            plural(res.claims.len(), "claim"),
            self.started.elapsed().as_millis()
        )
    }

    /// What the run is still waiting for, with the last error of each, for the timeout message.
    pub fn waiting_for(&self) -> Vec<String> {
        let mut out = Vec::new();
        let error = |key: &str, asking: bool| match self.errors.get(key) {
            Some(e) => format!(": {e}"),
            None if asking => ": no answer from the API server yet".into(),
            None => String::new(),
        };
        if self.store.pod.is_none() {
            let pod = format!("pod {}/{}", self.pod_ref.namespace, self.pod_ref.name);
            out.push(format!("{pod} not fetched yet{}", error(POD_KEY, self.pod_pending)));
        }
        for scope in self.store.unlisted() {
            out.push(format!("{scope} not listed yet{}", error(&scope.to_string(), self.listing.contains(&scope))));
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

fn phase_of(res: &Resolution) -> Phase {
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

fn needs_pod_refresh(res: &Resolution) -> bool {
    res.missing.iter().any(|m| matches!(m, Missing::ClaimStatusPending { .. } | Missing::NotScheduled))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
    use serde_json::json;

    const NS: &str = "ns";

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
        assert_eq!(r.start().actions, vec![Action::GetPod { after: Duration::ZERO }]);
        let step = r.handle(pod(&[("gpu", "c")], &[]));
        assert_eq!(lists(&step), vec![claim_scope("c"), node_scope()], "claim and slices listed together");
        assert_eq!(r.phase(), Phase::WaitingForClaims);
        let claims = r.handle(listed(claim_scope("c"), vec![claim("c", devices)], None));
        let filter = filter_of(&claims).expect("the filter once the claims are listed");
        let slices = r.handle(listed(node_scope(), slices, Some(&filter)));
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
        assert!(r.handle(Input::Deadline).done.is_none());
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
        let step = r.handle(Input::Applied { scope: claim_scope("c"), item: claim("c", &["g0"]) });
        let filter = filter_of(&step).unwrap();
        assert_eq!(lists(&step), vec![node_scope()]);
        assert!(step.publish.is_none(), "no resolution from slices decoded without the device");
        let step = r.handle(listed(node_scope(), vec![slice("s", Some("n1"), 1, &[("g0", "U0")])], Some(&filter)));
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
        let step = r.handle(listed(driver.clone(), vec![], Some(&filter)));
        assert_eq!(watches(&step), vec![node_scope(), driver.clone()], "the claim is there: only slices are watched");
        assert_eq!(r.phase(), Phase::WaitingForDevices);
        let step = r.handle(Input::Applied { scope: driver, item: slice("shared", None, 1, &[("g0", "SHARED")]) });
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
        let step = r.handle(Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", "B")]) });
        assert_eq!(step.transition, Some(Transition::Updated));
        assert_eq!(uuid(step.publish.as_ref().unwrap()), "B");
        assert!(watches(&step).is_empty());
        // The same again: nothing to publish.
        let step = r.handle(Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", "B")]) });
        assert!(step.publish.is_none() && step.transition.is_none());
        // The slice goes: first the driver's unbound slices are looked at, then the values are lost.
        let step =
            r.handle(Input::Deleted { scope: node_scope(), name: "s".into(), resource_version: Some("11".into()) });
        let driver = Scope::DriverSlices("gpu.example.com".into());
        assert_eq!(lists(&step), vec![driver.clone()]);
        assert!(step.transition.is_none());
        let filter = r.filter.clone().unwrap();
        let step = r.handle(listed(driver.clone(), vec![], Some(&filter)));
        assert!(matches!(&step.transition, Some(Transition::Lost { missing }) if !missing.is_empty()));
        assert_eq!(watches(&step), vec![driver], "the new scope is followed too");
        assert_eq!(r.phase(), Phase::Degraded);
        let step = r.handle(Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 2, &[("g0", "C")]) });
        assert_eq!(step.transition, Some(Transition::Recovered));
        assert_eq!(uuid(step.publish.as_ref().unwrap()), "C");
        // A watch that ends is resumed from the last version seen; an expired one is listed again.
        let step = r.handle(ended(node_scope(), Duration::from_secs(crate::engine::api::WATCH_SECONDS_MIN.into()), 0));
        assert!(
            matches!(&step.actions[..], [Action::Watch { scope, resource_version, after }] if *scope == node_scope() && resource_version == "9" && after.is_zero())
        );
        let step = r.handle(Input::Expired(node_scope()));
        assert_eq!(lists(&step), vec![node_scope()]);
        assert!(watches(&step).is_empty(), "no watch while the relist runs");
        // After ready, the deadline no longer applies.
        assert!(r.handle(Input::Deadline).done.is_none());
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
        r.start();
        r.handle(Input::Pod(pod_at("3", None)));
        let claims = r.handle(listed(claim_scope("c"), vec![claim("c", &["g0"])], None));
        let filter = filter_of(&claims).unwrap();
        let step = r.handle(listed(node_scope(), vec![slice("s", Some("n1"), 1, &[("g0", "A")])], Some(&filter)));
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
        let step =
            r.handle(Input::Applied { scope: pod_scope.clone(), item: Item::Pod(pod_at("4", Some("Unhealthy"))) });
        assert_eq!(step.transition, Some(Transition::Updated));
        assert_eq!(step.publish.unwrap().built.tree.get("gpu/gpu/0/.health"), Some(&b"Unhealthy"[..]));
        // Another pod on the pod's watch is not taken.
        let mut other = pod_at("5", Some("Healthy"));
        other.metadata.name = Some("q".into());
        let step = r.handle(Input::Applied { scope: pod_scope.clone(), item: Item::Pod(other) });
        assert!(step.publish.is_none());
        assert!(step.actions.iter().any(|a| matches!(a, Action::GetPod { .. })), "the pod is fetched again");
        r.handle(Input::Pod(pod_at("6", Some("Unhealthy"))));
        // 410 Gone: the pod is fetched again (never listed), and watched from that answer.
        r.handle(ended(pod_scope.clone(), Duration::from_secs(crate::engine::api::WATCH_SECONDS_MIN.into()), 1));
        let step = r.handle(Input::Expired(pod_scope.clone()));
        assert!(step.actions.iter().any(|a| matches!(a, Action::GetPod { .. })), "{:?}", step.actions);
        assert!(lists(&step).is_empty() && watches(&step).is_empty());
        let step = r.handle(Input::Pod(pod_at("9", Some("Healthy"))));
        assert!(step.actions.iter().any(|a| matches!(a, Action::Watch { scope, resource_version, .. }
            if *scope == pod_scope && resource_version == "9")));
        assert_eq!(step.publish.unwrap().built.tree.get("gpu/gpu/0/.health"), Some(&b"Healthy"[..]));
        // Forbidden (RBAC without watch on pods): a warning, and no more tries.
        let forbidden =
            ApiError::Forbidden { verb: "watch", resource: "pods".into(), scope: String::new(), message: "no".into() };
        let step = r.handle(Input::Failed { scope: pod_scope.clone(), error: forbidden });
        assert!(step.done.is_none(), "serve goes on");
        assert!(step.warnings.iter().any(|w| w.contains("device health will not follow")), "{:?}", step.warnings);
        assert!(step.actions.is_empty());
        let step = r.handle(Input::Pod(pod_at("12", Some("Unhealthy"))));
        assert!(watches(&step).is_empty(), "{:?}", step.actions);
    }

    /// After ready, fetching the pod again (its watch expired) during an outage
    /// retries on the run's trouble backoff (up to 30 s), not the start-up one
    /// (up to 5 s): an outage costs as few requests as for any other scope.
    #[test]
    fn refetching_the_pod_after_ready_backs_off_like_every_other_scope() {
        let (mut r, ready) = serving_pod_at_version_3();
        assert!(matches!(ready.transition, Some(Transition::Ready { .. })));
        let step = r.handle(Input::Expired(Scope::Pod("p".into())));
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
            let step = r.handle(Input::PodFailed(failed));
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
        r.start();
        let step = r.handle(Input::Pod(pod_at("3", None)));
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
        r.start();
        r.handle(pod(&[("gpu", "c")], &[]));
        let step = r.handle(Input::Failed { scope: node_scope(), error: failed.clone() });
        assert!(matches!(&step.actions[..], [Action::List { after, .. }] if *after == Duration::from_millis(200)));
        assert_eq!(step.warnings.len(), 1);
        let step = r.handle(Input::Failed { scope: node_scope(), error: failed.clone() });
        assert!(matches!(&step.actions[..], [Action::List { after, .. }] if *after == Duration::from_millis(400)));
        assert!(step.warnings.is_empty(), "the same warning is not repeated");
        let waiting = r.waiting_for().join("; ");
        assert!(waiting.contains("not listed yet: cannot list") || waiting.contains("HTTP 500"), "{waiting}");
        let step = r.handle(Input::Failed { scope: node_scope(), error: forbidden.clone() });
        assert!(matches!(step.done, Some(Err(EngineError::Api(ApiError::Forbidden { .. })))));
        // After ready: the same 403 is retried and the last tree stays.
        let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
        first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
        let step = r.handle(Input::Failed { scope: node_scope(), error: forbidden });
        assert!(step.done.is_none() && step.publish.is_none());
        assert_eq!(lists(&step), vec![node_scope()]);
    }

    #[test]
    fn the_deadline_says_what_is_still_missing() {
        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
        r.start();
        let step = r.handle(Input::PodFailed(ApiError::Failed {
            verb: "get",
            resource: "pods".into(),
            scope: " (ns/p)".into(),
            message: "no answer within 3000 ms".into(),
            code: None,
        }));
        assert!(matches!(step.actions[..], [Action::GetPod { .. }]));
        let step = r.handle(Input::Deadline);
        let Some(Err(EngineError::Timeout { waiting_for })) = step.done else { panic!("{:?}", step.done) };
        assert_eq!(waiting_for.len(), 1);
        assert!(
            waiting_for[0].contains("pod ns/p not fetched yet") && waiting_for[0].contains("no answer"),
            "{waiting_for:?}"
        );

        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
        first_reads(&mut r, &[], vec![]);
        let Some(Err(EngineError::Timeout { waiting_for })) = r.handle(Input::Deadline).done else { panic!() };
        assert!(waiting_for[0].contains("ResourceClaim c is not allocated yet"), "{waiting_for:?}");
    }

    #[test]
    fn a_generated_claim_not_in_the_pod_status_refetches_the_pod() {
        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
        r.start();
        let step = r.handle(pod(&[("gpu", "template:t")], &[]));
        assert_eq!(lists(&step), vec![node_scope()], "no claim to list yet");
        let filter = filter_of(&step).unwrap();
        let step = r.handle(listed(node_scope(), vec![], Some(&filter)));
        assert!(
            matches!(&step.actions[..], [Action::GetPod { after }] if *after > Duration::ZERO),
            "{:?}",
            step.actions
        );
        assert_eq!(r.phase(), Phase::WaitingForClaims);
        let step = r.handle(pod(&[("gpu", "template:t")], &[("gpu", "p-gpu-x")]));
        assert_eq!(lists(&step), vec![claim_scope("p-gpu-x")]);
    }

    #[test]
    fn a_claim_the_pod_does_not_have_ends_the_run_at_once() {
        let sel = Selection { claims: vec!["nope".into()] };
        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), sel, vec![]);
        r.start();
        let step = r.handle(pod(&[("gpu", "c")], &[]));
        let step = if step.done.is_some() { step } else { r.handle(listed(node_scope(), vec![], None)) };
        assert!(
            matches!(step.done, Some(Err(EngineError::Permanent(Missing::UnknownClaim { .. })))),
            "{:?}",
            step.done
        );
    }

    #[test]
    fn a_pod_that_is_not_the_one_asked_for_is_not_used() {
        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
        r.start();
        let Input::Pod(mut other) = pod(&[("gpu", "c")], &[]) else { unreachable!() };
        other.metadata.name = Some("someone-else".into());
        let step = r.handle(Input::Pod(other));
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
        r.start();
        r.handle(pod(&[("gpu", "c")], &[]));
        // A server that ignored the selectors: another claim, and a claim of another namespace.
        let mut foreign: ResourceClaim = match claim("c", &["g0"]) {
            Item::Claim(c) => *c,
            _ => unreachable!(),
        };
        foreign.metadata.namespace = Some("other".into());
        let step = r.handle(listed(claim_scope("c"), vec![claim("x", &["g9"]), Item::Claim(Box::new(foreign))], None));
        assert_eq!(step.warnings.len(), 2, "{:?}", step.warnings);
        let filter = filter_of(&step).unwrap();
        assert!(filter.is_empty(), "nothing of the foreign claims is wanted");
        // Another node's slice on the node's watch is ignored too.
        let step = r.handle(listed(node_scope(), vec![slice("s", Some("n2"), 1, &[("g0", "X")])], Some(&filter)));
        assert_eq!(step.warnings.len(), 1);
        let Some(Ok(res)) = step.done else { panic!() };
        assert!(res.missing.iter().any(|m| matches!(m, Missing::ClaimNotFound { .. })));
    }

    #[test]
    fn once_mode_answers_after_the_lists_without_watching() {
        let mut r = Reconciler::new(Mode::Once, pod_ref(), Selection::default(), vec![]);
        let (_, step) = first_reads(&mut r, &["g0"], vec![]);
        // A device is missing: the driver's unbound slices are listed first.
        let driver = Scope::DriverSlices("gpu.example.com".into());
        assert_eq!(lists(&step), vec![driver.clone()]);
        let filter = r.filter.clone().unwrap();
        let step = r.handle(listed(driver, vec![], Some(&filter)));
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
        let step = r.handle(failed("watch"));
        let first = watch_after(&step, &node_scope()).expect("watched again");
        assert!(first >= WatchBackoff::INITIAL, "{first:?}");
        assert!(lists(&step).is_empty() && step.publish.is_none());
        let step = r.handle(failed("watch"));
        let second = watch_after(&step, &node_scope()).unwrap();
        assert!(second >= 2 * WatchBackoff::INITIAL, "{second:?} after {first:?}");
        // 410 Gone: listed again after a delay; the list succeeds, and the
        // next trouble still waits longer (client-go's reflector does the same).
        let step = r.handle(Input::Expired(node_scope()));
        let relist = list_after(&step, &node_scope()).expect("relisted");
        assert!(relist >= 4 * WatchBackoff::INITIAL, "{relist:?}");
        let step = r.handle(listed(node_scope(), vec![slice("s", Some("n1"), 1, &[("g0", "A")])], r.filter.as_ref()));
        assert_eq!(watch_after(&step, &node_scope()), Some(Duration::ZERO), "a fresh list is watched at once");
        let step = r.handle(Input::Expired(node_scope()));
        let later = list_after(&step, &node_scope()).unwrap();
        assert!(later >= 8 * WatchBackoff::INITIAL && later <= WatchBackoff::CAP, "{later:?}");
        // One backoff for the run: another scope's trouble goes on from there.
        let step = r.handle(Input::Expired(claim_scope("c")));
        let claim = list_after(&step, &claim_scope("c")).unwrap();
        assert!(claim >= 16 * WatchBackoff::INITIAL && claim <= WatchBackoff::CAP, "{claim:?}");
    }

    #[test]
    fn a_watch_cut_short_without_a_change_is_resumed_later() {
        let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
        first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
        // Closed at once with nothing: resumed after a delay that grows.
        let step = r.handle(ended(node_scope(), Duration::from_millis(3), 0));
        let first = watch_after(&step, &node_scope()).expect("resumed");
        assert!(first >= WatchBackoff::INITIAL, "{first:?}");
        let step = r.handle(ended(node_scope(), Duration::from_millis(3), 0));
        assert!(watch_after(&step, &node_scope()).unwrap() > first);
        // Closed early, but it brought a change: resumed at once.
        let step = r.handle(ended(node_scope(), Duration::from_millis(3), 1));
        assert_eq!(watch_after(&step, &node_scope()), Some(Duration::ZERO));
        // Closed when its time was up: resumed at once.
        let step = r.handle(ended(claim_scope("c"), WATCH_CUT_SHORT, 0));
        assert_eq!(watch_after(&step, &claim_scope("c")), Some(Duration::ZERO));
    }

    #[test]
    fn the_pod_is_fetched_again_with_growing_delays_while_its_claim_is_pending() {
        let mut r = Reconciler::new(Mode::UntilReady, pod_ref(), Selection::default(), vec![]);
        r.start();
        let step = r.handle(pod(&[("gpu", "template:t")], &[]));
        let filter = filter_of(&step).unwrap();
        let step = r.handle(listed(node_scope(), vec![], Some(&filter)));
        let mut delays = Vec::new();
        let mut step = step;
        for _ in 0..4 {
            let after = step.actions.iter().find_map(|a| match a {
                Action::GetPod { after } => Some(*after),
                _ => None,
            });
            delays.push(after.expect("the pod again"));
            // The pod comes back, still without the generated claim.
            step = r.handle(pod(&[("gpu", "template:t")], &[]));
        }
        assert!(delays.windows(2).all(|w| w[1] > w[0]), "an answer does not reset the delay: {delays:?}");
    }

    #[test]
    fn a_batch_of_inputs_resolves_once_to_the_latest_state() {
        let mut r = Reconciler::new(Mode::Follow, pod_ref(), Selection::default(), vec![]);
        first_reads(&mut r, &["g0"], vec![slice("s", Some("n1"), 1, &[("g0", "A")])]);
        let burst = ["B", "C", "D"]
            .map(|uuid| Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", uuid)]) });
        let step = r.handle_all(burst);
        assert_eq!(uuid(step.publish.as_ref().expect("one publication")), "D");
        assert_eq!(step.transition, Some(Transition::Updated));
        // A change and its undoing in one batch: nothing to publish.
        let step = r.handle_all([
            Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", "E")]) },
            Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", "D")]) },
        ]);
        assert!(step.publish.is_none() && step.transition.is_none());
        // Taken in while a tree is written, resolved once afterwards.
        for uuid in ["F", "G"] {
            let step =
                r.absorb([Input::Applied { scope: node_scope(), item: slice("s", Some("n1"), 1, &[("g0", uuid)]) }]);
            assert!(step.publish.is_none() && step.actions.is_empty());
        }
        assert!(r.is_unsettled());
        assert_eq!(uuid(r.settle().publish.as_ref().unwrap()), "G");
        assert!(!r.is_unsettled() && r.settle().publish.is_none());
    }
}
