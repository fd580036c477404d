//! Resolving what the store holds and concluding: the tree, the
//! transition, what to publish and what to watch next.

use std::collections::BTreeSet;
use std::time::Instant;

use super::phase::{Event, Phase, TransitionKind, transition, waiting_phase};
use super::{Action, Mode, Objects, Reconciler, Step};
use crate::engine::EngineError;
use crate::engine::store::Scope;
use crate::model::publication::{Publication, Transition};
use crate::model::resolve::{Missing, Resolution, resolve};
use crate::model::tree::{self, BuiltTree};

impl Reconciler {
    /// Resolve, when every input it needs is in, and decide what the run does.
    pub(super) fn evaluate(&mut self, now: Instant, step: &mut Step) {
        if self.done {
            return;
        }
        let Some(res) = self.resolvable(step) else { return };
        if let Some(permanent) = res.missing.iter().find(|m| m.is_permanent()) {
            self.finish(Err(EngineError::Permanent(permanent.clone())), step);
            return;
        }
        if self.list_unbound_slices(&res, step) {
            self.advance(Event::Awaiting(Phase::WaitingForDevices));
            return;
        }
        let built = tree::build(&res, &self.require);
        for w in built.warnings.clone() {
            step.warnings.extend(self.warn_once(w));
        }
        let ready = built.is_ready();
        if !ready && needs_pod_refresh(&res) && self.mode != Mode::Once && self.objects.can_change() {
            let scope = self.pod_scope();
            if !self.requests(&scope).listing {
                let after = self.requests(&scope).startup.next().unwrap_or_default();
                self.ask(scope, after, step);
            }
        }
        match self.mode {
            Mode::Once => self.finish(Ok(res), step),
            Mode::UntilReady if !ready && !self.objects.can_change() => {
                self.finish(Err(EngineError::NotReady { missing: built.missing }), step);
            }
            Mode::UntilReady | Mode::Follow => self.conclude(now, res, built, step),
        }
    }

    /// The resolution, once the pod, every claim and every slice decoded with
    /// the current filter are in; until then, the phase says what is awaited.
    pub(super) fn resolvable(&mut self, step: &mut Step) -> Option<Resolution> {
        if self.store.pod.is_none() {
            self.advance(Event::Awaiting(Phase::WaitingForPod));
            return None;
        }
        self.update_filter(step);
        let unlisted = self.store.unlisted();
        if unlisted.iter().any(|s| !s.is_slices()) {
            self.advance(Event::Awaiting(Phase::WaitingForClaims));
            return None;
        }
        // Slices decoded without a device now wanted are being listed again: wait for them.
        let filter = self.filter.clone().unwrap_or_default();
        if !unlisted.is_empty() || !self.decoded_without(&filter).is_empty() {
            self.advance(Event::Awaiting(Phase::WaitingForDevices));
            return None;
        }
        let mut res = resolve(&self.store.snapshot(), &self.selection);
        if let Objects::Fixed { shown } = &self.objects {
            explain_claims_not_in(shown, &mut res);
        }
        Some(res)
    }

    /// Devices not on the node's slices may be on slices bound to no single
    /// node: list their drivers' (true when a new scope is being listed).
    pub(super) fn list_unbound_slices(&mut self, res: &Resolution, step: &mut Step) -> bool {
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

    /// Move the run by the transition table: the only place its phase changes.
    fn advance(&mut self, event: Event) -> Option<TransitionKind> {
        let change;
        (self.phase, change) = transition(self.phase, event);
        change
    }

    /// Move the run by the transition table, publish what changed, and watch
    /// what the mode follows: `init` what is missing, `serve` everything.
    pub(super) fn conclude(&mut self, now: Instant, res: Resolution, built: BuiltTree, step: &mut Step) {
        let ready = built.is_ready();
        if self.holding(now, ready, &res, step) {
            self.advance(Event::Holding);
            self.watch_every_scope(step);
            return;
        }
        let missing_changed = built.missing != self.last_missing;
        let tree_changed = self.published.as_ref() != Some(&built.tree);
        let resolved = Event::Resolved { ready, missing_changed, tree_changed, waiting: waiting_phase(&res) };
        step.transition = self.advance(resolved).map(|c| match c {
            TransitionKind::Waiting => Transition::Waiting { missing: built.missing.clone() },
            TransitionKind::Ready => Transition::Ready { summary: self.summary(&res, now) },
            TransitionKind::Updated => Transition::Updated,
            TransitionKind::Lost => Transition::Lost { missing: built.missing.clone() },
            TransitionKind::Recovered => Transition::Recovered,
        });
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

    /// Keep the ready tree served (publish nothing, change no phase) while
    /// what it lacks now is only devices whose pools are gone, for at most
    /// the pool grace; then the loss is published as any other.
    pub(super) fn holding(&mut self, now: Instant, ready: bool, res: &Resolution, step: &mut Step) -> bool {
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

    pub(super) fn summary(&self, res: &Resolution, now: Instant) -> String {
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
