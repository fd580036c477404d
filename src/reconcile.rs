//! The reconciler: what drafs knows, what it publishes, and what it asks the
//! API for next, as a plain value.
//!
//! It never does I/O. The engine in `source` feeds it [`Input`]s (the pod, a
//! list, a watch event, an error, the deadline) and carries out the
//! [`Action`]s of each [`Step`] (get the pod, list a scope, watch it from a
//! resource version, decode slices with a new device filter); the command
//! publishes what the step says and reports its [`Transition`]. `init`, `serve`,
//! `get` and `exec` differ only in their [`Mode`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::api::{ApiError, EngineError, PodRef, RetryBackoff};
use crate::resolve::{Missing, Resolution, Selection, claim_names, resolve};
use crate::slices::{self, DeviceFilter};
use crate::store::{Item, Scope, Store};
use crate::tree::{self, BuiltTree, RequirePath, Tree};

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
    Listed { scope: Scope, items: Vec<Item>, resource_version: String, decoded_with: Option<DeviceFilter> },
    Applied { scope: Scope, item: Item },
    Deleted { scope: Scope, name: String, resource_version: Option<String> },
    Bookmark { scope: Scope, resource_version: String },
    /// The server closed a watch in the ordinary way (its timeout).
    WatchEnded(Scope),
    /// 410 Gone: the resource version is too old; list again.
    Expired(Scope),
    Failed { scope: Scope, error: ApiError },
    Deadline,
}

/// What the engine should do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    GetPod { after: Duration },
    List { scope: Scope, after: Duration },
    Watch { scope: Scope, resource_version: String, after: Duration },
    /// Decode slices with this filter from now on.
    Filter(DeviceFilter),
}

/// A readiness change, to log, count and record as an Event.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// Not ready yet, and what is missing changed.
    Waiting { missing: Vec<String> },
    /// Everything asked for is there, for the first time.
    Ready { summary: String },
    /// Still ready, with new values.
    Updated,
    /// Was ready; these went missing and their values were removed.
    Lost { missing: Vec<String> },
    /// Ready again after `Lost`.
    Recovered,
}

/// A tree to publish, with the resolution it came from.
#[derive(Debug, Clone)]
pub struct Publication {
    pub resolution: Resolution,
    pub built: BuiltTree,
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
    backoff: BTreeMap<String, RetryBackoff>,
    /// The last error of the pod ("pod") or of each scope, for the timeout message.
    errors: BTreeMap<String, String>,
    warned: BTreeSet<String>,
    published: Option<Tree>,
    last_missing: Vec<String>,
    started: std::time::Instant,
}

const POD_KEY: &str = "pod";

impl Reconciler {
    pub fn new(mode: Mode, pod_ref: PodRef, selection: Selection, require: Vec<RequirePath>) -> Self {
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
            backoff: BTreeMap::new(),
            errors: BTreeMap::new(),
            warned: BTreeSet::new(),
            published: None,
            last_missing: Vec::new(),
            started: std::time::Instant::now(),
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
        let mut step = Step::default();
        if self.done {
            return step;
        }
        match input {
            Input::Pod(pod) => self.on_pod(*pod, &mut step),
            Input::PodFailed(error) => {
                self.pod_pending = false;
                if self.fatal(&error, &mut step) {
                    return step;
                }
                self.errors.insert(POD_KEY.into(), error.to_string());
                step.warnings.extend(self.warn_once(format!("{error}; retrying")));
                let after = self.next_backoff(POD_KEY);
                self.pod_pending = true;
                step.actions.push(Action::GetPod { after });
            }
            Input::Listed { scope, items, resource_version, decoded_with } => {
                self.listing.remove(&scope);
                if !self.store.has_scope(&scope) {
                    return step;
                }
                let items = self.admit(&scope, items, &mut step);
                self.store.replace(&scope, items, resource_version);
                self.errors.remove(&scope.to_string());
                self.backoff.remove(&scope.to_string());
                if scope.is_slices() {
                    let with = decoded_with.unwrap_or_default();
                    let stale = self.filter.as_ref().is_some_and(|f| !f.is_subset(&with));
                    self.listed_with.insert(scope.clone(), with);
                    if stale {
                        // The filter grew while this list was under way.
                        self.list(scope, Duration::ZERO, &mut step);
                    }
                }
            }
            Input::Applied { scope, item } => {
                if let Some(item) = self.admit(&scope, vec![item], &mut step).pop() {
                    self.store.apply(&scope, item);
                }
                self.errors.remove(&scope.to_string());
            }
            Input::Deleted { scope, name, resource_version } => self.store.delete(&scope, &name, resource_version),
            Input::Bookmark { scope, resource_version } => self.store.bookmark(&scope, resource_version),
            Input::WatchEnded(scope) => {
                self.watching.remove(&scope);
            }
            Input::Expired(scope) => {
                self.watching.remove(&scope);
                self.list(scope, Duration::ZERO, &mut step);
            }
            Input::Failed { scope, error } => {
                self.watching.remove(&scope);
                self.listing.remove(&scope);
                if self.fatal(&error, &mut step) {
                    return step;
                }
                let key = scope.to_string();
                step.warnings.extend(self.warn_once(format!("{error}; retrying")));
                self.errors.insert(key.clone(), error.to_string());
                let after = self.next_backoff(&key);
                self.list(scope, after, &mut step);
            }
            Input::Deadline => {
                // The deadline only bounds the way to the first ready tree.
                if !self.ever_ready {
                    self.finish(Err(EngineError::Timeout { waiting_for: self.waiting_for() }), &mut step);
                    return step;
                }
            }
        }
        self.evaluate(&mut step);
        step
    }

    fn on_pod(&mut self, pod: Pod, step: &mut Step) {
        self.pod_pending = false;
        self.errors.remove(POD_KEY);
        self.backoff.remove(POD_KEY);
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty());
        let claims: BTreeSet<String> = claim_names(&pod, &self.selection).into_iter().collect();
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
            };
            if !admitted {
                let warning =
                    format!("ignoring {} {:?}: it does not match {scope} (the server ignored the selector?)", scope.resource(), item.name());
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
        self.store.pod.as_ref().and_then(|p| p.spec.as_ref()).and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty())
    }

    fn add_and_list(&mut self, scope: Scope, step: &mut Step) {
        if self.store.has_scope(&scope) {
            return;
        }
        self.store.add_scope(scope.clone());
        self.list(scope, Duration::ZERO, step);
    }

    fn list(&mut self, scope: Scope, after: Duration, step: &mut Step) {
        if self.listing.insert(scope.clone()) {
            self.watching.remove(&scope);
            step.actions.push(Action::List { scope, after });
        }
    }

    fn watch(&mut self, scope: &Scope, step: &mut Step) {
        if self.watching.contains(scope) || self.listing.contains(scope) || !self.store.is_listed(scope) {
            return;
        }
        let Some(rv) = self.store.resource_version(scope).map(String::from) else { return };
        self.watching.insert(scope.clone());
        step.actions.push(Action::Watch { scope: scope.clone(), resource_version: rv, after: Duration::ZERO });
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
                _ => devices,
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
        let error = |key: &str| self.errors.get(key).map(|e| format!(": {e}")).unwrap_or_default();
        if self.store.pod.is_none() {
            out.push(format!("pod {}/{} not fetched yet{}", self.pod_ref.namespace, self.pod_ref.name, error(POD_KEY)));
        }
        for scope in self.store.unlisted() {
            out.push(format!("{scope} not listed yet{}", error(&scope.to_string())));
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
