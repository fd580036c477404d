//! Connection slots: which connections the webhook serves, and which one
//! makes room at the limit.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

/// The connections being served, for the connection limit. At the limit, a
/// new connection closes the one that has waited on its client longest: a
/// TLS handshake not finished, a kept-alive connection between requests, a
/// request body still arriving. So idle or slow clients cannot lock others
/// out; a connection whose review is being decided is never closed.
#[derive(Debug, Default)]
pub(super) struct Slots {
    next: u64,
    /// By id: since when the connection waits on its client (None: busy
    /// deciding), and how to tell it to close.
    open: BTreeMap<u64, (Option<Instant>, Arc<Notify>)>,
}

/// A connection admitted: its id, how it is told to close, and the
/// connection it replaces (to be told to close), if any.
pub(super) type Admitted = (u64, Arc<Notify>, Option<Arc<Notify>>);

impl Slots {
    /// Room for a connection accepted at `now`, or None when `limit`
    /// connections are all busy (wait for one to end).
    pub(super) fn admit(&mut self, now: Instant, limit: usize) -> Option<Admitted> {
        let evicted = if self.open.len() >= limit {
            let (_, oldest) = self.open.iter().filter_map(|(id, (since, _))| since.map(|s| (s, *id))).min()?;
            self.open.remove(&oldest).map(|(_, close)| close)
        } else {
            None
        };
        let id = self.next;
        self.next += 1;
        let close = Arc::new(Notify::new());
        self.open.insert(id, (Some(now), close.clone()));
        Some((id, close, evicted))
    }

    /// The connection is deciding a review (`busy`), or waits on its client again.
    pub(super) fn set_busy(&mut self, id: u64, busy: bool, now: Instant) {
        if let Some((since, _)) = self.open.get_mut(&id) {
            *since = if busy { None } else { Some(now) };
        }
    }

    pub(super) fn is_busy(&self, id: u64) -> bool {
        self.open.get(&id).is_some_and(|(since, _)| since.is_none())
    }

    pub(super) fn release(&mut self, id: u64) {
        self.open.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn at_the_limit_the_connection_waiting_longest_makes_room_never_a_busy_one() {
        let t0 = Instant::now();
        let t = |ms: u64| t0 + Duration::from_millis(ms);
        let mut slots = Slots::default();
        let (a, _, none) = slots.admit(t(0), 3).unwrap();
        assert!(none.is_none());
        let (b, b_close, _) = slots.admit(t(1), 3).unwrap();
        let (c, _, _) = slots.admit(t(2), 3).unwrap();
        slots.set_busy(a, true, t(3));
        // Full: b has waited longest (a is older but busy).
        let (_, d_close, evicted) = slots.admit(t(4), 3).unwrap();
        assert!(Arc::ptr_eq(&evicted.unwrap(), &b_close));
        assert!(!slots.open.contains_key(&b) && slots.is_busy(a));
        // c answered a request at 5 and waits from then: d is the oldest now.
        slots.set_busy(c, true, t(5));
        slots.set_busy(c, false, t(5));
        let (e, _, evicted) = slots.admit(t(6), 3).unwrap();
        assert!(Arc::ptr_eq(&evicted.unwrap(), &d_close));
        // All busy: no room until one ends.
        slots.set_busy(c, true, t(7));
        slots.set_busy(e, true, t(7));
        assert!(slots.admit(t(8), 3).is_none());
        slots.release(c);
        let (_, _, evicted) = slots.admit(t(9), 3).unwrap();
        assert!(evicted.is_none());
        assert_eq!(slots.open.len(), 3);
    }
}
