//! Where a run stands, and the table that moves it: the only place a run's
//! [`Phase`] changes.

use crate::model::resolve::{Missing, Resolution};

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
pub enum TransitionKind {
    Waiting,
    Ready,
    Updated,
    Lost,
    Recovered,
}

/// What moves a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Nothing can be resolved yet: the inputs of this waiting phase are awaited.
    Awaiting(Phase),
    /// A ready tree is kept while its devices' pools are gone (for the pool grace).
    Holding,
    /// A resolution: whether it is ready, whether what is missing (when not
    /// ready) or the tree (when ready) changed since the last one, and what a
    /// resolution that is not ready waits for ([`waiting_phase`]).
    Resolved { ready: bool, missing_changed: bool, tree_changed: bool, waiting: Phase },
}

/// The transition table: the phase after `event`, and what it reports. A run
/// that has been ready never waits again (its tree stays served); `init` ends
/// at the first `Ready`, so it only ever takes the waiting rows and that one.
pub fn transition(was: Phase, event: Event) -> (Phase, Option<TransitionKind>) {
    let ever_ready = was.was_ever_ready();
    match event {
        Event::Awaiting(_) | Event::Holding if ever_ready => (was, None),
        Event::Awaiting(waiting) => (waiting, None),
        Event::Holding => (was, None),
        Event::Resolved { ready: true, tree_changed, .. } => match was {
            Phase::Ready => (Phase::Ready, tree_changed.then_some(TransitionKind::Updated)),
            Phase::Degraded => (Phase::Ready, Some(TransitionKind::Recovered)),
            _ => (Phase::Ready, Some(TransitionKind::Ready)),
        },
        Event::Resolved { ready: false, missing_changed, waiting, .. } => match was {
            Phase::Ready => (Phase::Degraded, Some(TransitionKind::Lost)),
            Phase::Degraded => (Phase::Degraded, None),
            _ => (waiting, missing_changed.then_some(TransitionKind::Waiting)),
        },
    }
}

/// What a resolution that is not ready waits for.
pub fn waiting_phase(res: &Resolution) -> Phase {
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

#[cfg(test)]
mod tests {
    use super::*;

    const PHASES: [Phase; 5] =
        [Phase::WaitingForPod, Phase::WaitingForClaims, Phase::WaitingForDevices, Phase::Ready, Phase::Degraded];
    const WAITING: [Phase; 3] = [Phase::WaitingForPod, Phase::WaitingForClaims, Phase::WaitingForDevices];

    /// Every resolution row, as a reader of `serve`'s Events expects them: the
    /// first ready, a loss, a recovery, updates only while ready, and while
    /// waiting only a change of what is missing.
    #[test]
    fn resolutions() {
        use TransitionKind::*;
        for was in PHASES {
            for bits in 0..8 {
                let (ready, missing_changed, tree_changed) = (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
                let waiting = Phase::WaitingForDevices;
                let want = match (was, ready) {
                    (Phase::Ready, true) => (Phase::Ready, tree_changed.then_some(Updated)),
                    (Phase::Ready, false) => (Phase::Degraded, Some(Lost)),
                    (Phase::Degraded, true) => (Phase::Ready, Some(Recovered)),
                    (Phase::Degraded, false) => (Phase::Degraded, None),
                    (_, true) => (Phase::Ready, Some(Ready)),
                    (_, false) => (waiting, missing_changed.then_some(Waiting)),
                };
                assert_eq!(
                    transition(was, Event::Resolved { ready, missing_changed, tree_changed, waiting }),
                    want,
                    "from {was:?}, ready {ready}, missing changed {missing_changed}, tree changed {tree_changed}"
                );
            }
        }
    }

    /// Waiting moves only a run that was never ready; holding moves nothing;
    /// neither reports a change.
    #[test]
    fn waits_and_holds() {
        for was in PHASES {
            for waiting in WAITING {
                let want = if was.was_ever_ready() { was } else { waiting };
                assert_eq!(transition(was, Event::Awaiting(waiting)), (want, None), "from {was:?} to {waiting:?}");
            }
            assert_eq!(transition(was, Event::Holding), (was, None), "holding from {was:?}");
        }
    }
}
