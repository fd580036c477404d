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
//! Its state is two things: the [`Store`], one entry per scope holding both
//! what is asked of it (lists and watches, how its retries wait, its last
//! error; the pod is a scope whose list is a GET) and what it brought, and
//! where the run stands ([`Phase`], moved only by the table in
//! [`phase::transition`]). Run-wide beside them are only the facts of the
//! run as a whole: the one device filter the engine decodes every slice
//! scope with, and the one backoff that paces every scope's retries.
//!
//! By concern: the words it speaks (`vocabulary`), what each input does to
//! the state (`inputs`), what it asks of the API server per scope
//! (`requests`), resolving and concluding (`resolving`), the phase and its
//! table (`phase`), and each warning once (`warned`).

mod inputs;
mod phase;
mod requests;
mod resolving;
#[cfg(test)]
mod tests;
mod vocabulary;
mod warned;

use std::time::{Duration, Instant};

use crate::engine::PodRef;
use crate::engine::store::{Scope, Store};
use crate::model::backoff::{WatchBackoff, seed_of};
pub use crate::model::publication::{Publication, Transition};
use crate::model::resolve::{Selection, has_claims};
use crate::model::slices::DeviceFilter;
use crate::model::tree::{RequirePath, Tree};
pub use phase::{Phase, TransitionKind};
pub use vocabulary::{Action, Input, Mode, Objects, Step};
use warned::Warned;

/// The reconciler.
#[derive(Debug)]
pub struct Reconciler {
    mode: Mode,
    pod_ref: PodRef,
    selection: Selection,
    require: Vec<RequirePath>,
    store: Store,
    phase: Phase,
    /// The run is over (its last step said why).
    done: bool,
    /// The filter the engine decodes every slice scope with, once every
    /// claim is listed (what each scope was decoded with is in its entry).
    filter: Option<DeviceFilter>,
    /// Retries of scopes answered once (see [`WatchBackoff`]): one for the
    /// run, so a failing server sees one retry sequence per pod, not one per scope.
    trouble: WatchBackoff,
    warned: Warned,
    published: Option<Tree>,
    last_missing: Vec<String>,
    /// When [`Reconciler::start`] was called.
    started: Option<Instant>,
    /// Inputs were taken in since the last resolution.
    unsettled: bool,
    /// Where the objects come from, and so whether waiting can help.
    objects: Objects,
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
            done: false,
            filter: None,
            trouble: WatchBackoff::new(seed),
            warned: Warned::default(),
            published: None,
            last_missing: Vec::new(),
            started: None,
            unsettled: false,
            objects: Objects::Live,
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

    /// Read objects from a source that can do what `objects` says.
    pub fn reading(mut self, objects: Objects) -> Self {
        self.objects = objects;
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

    /// The pod is known and asks for no device at all (no claim, no
    /// extended resource backed by one): its tree can never change.
    pub fn serves_nothing(&self) -> bool {
        self.store.pod.as_ref().is_some_and(|pod| !has_claims(pod))
    }

    /// The scopes with a watch open or asked for.
    pub fn watching(&self) -> impl Iterator<Item = &Scope> {
        self.store.all_requests().filter(|(_, r)| r.watching).map(|(scope, _)| scope)
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

    pub(super) fn pod_scope(&self) -> Scope {
        Scope::Pod(self.pod_ref.name.clone())
    }
}
