//! Connection slots: which connections a listener serves, and which one
//! makes room at the limit. The webhook's port and every metrics and probe
//! port use the same rule.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

/// The connections being served, for the connection limit. A listener never
/// stops accepting: at the limit, a new connection closes one that waits on
/// its client (a TLS handshake not finished, a kept-alive connection between
/// requests, a request still arriving), of the peer holding the most
/// connections, the one that has waited longest. So idle or slow clients
/// cannot lock others out, and one client opening connections as fast as it
/// can closes only its own: the kubelet's probe, one connection from its own
/// address, is answered whatever a pod does. A connection whose request is
/// being decided is never closed.
#[derive(Debug, Default)]
pub struct Slots {
    next: u64,
    open: BTreeMap<u64, Open>,
    /// Connections told to close to make room that have not ended yet.
    closing: usize,
}

#[derive(Debug)]
struct Open {
    peer: IpAddr,
    /// Since when it waits on its client (None: busy deciding).
    since: Option<Instant>,
    close: Arc<Notify>,
}

/// A connection admitted: its id, how it is told to close, and the
/// connection it replaces (to be told to close), if any.
pub type Admitted = (u64, Arc<Notify>, Option<Evicted>);

/// A connection closed to make room: how to tell it, and its peer (for the log).
#[derive(Debug, Clone)]
pub struct Evicted {
    pub close: Arc<Notify>,
    pub peer: IpAddr,
}

impl Slots {
    /// Room for a connection from `peer` accepted at `now`, or None when
    /// `limit` connections are all busy (wait for one to end).
    pub fn admit(&mut self, peer: IpAddr, now: Instant, limit: usize) -> Option<Admitted> {
        let evicted = if self.open.len() >= limit {
            let mut held: HashMap<IpAddr, usize> = HashMap::new();
            for open in self.open.values() {
                *held.entry(open.peer).or_default() += 1;
            }
            *held.entry(peer).or_default() += 1;
            let (_, _, victim) = self
                .open
                .iter()
                .filter_map(|(id, o)| o.since.map(|since| (held[&o.peer], std::cmp::Reverse(since), *id)))
                .max()?;
            let evicted = self.open.remove(&victim).map(|o| Evicted { close: o.close, peer: o.peer });
            self.closing += 1;
            evicted
        } else {
            None
        };
        let id = self.next;
        self.next += 1;
        let close = Arc::new(Notify::new());
        self.open.insert(id, Open { peer, since: Some(now), close: close.clone() });
        Some((id, close, evicted))
    }

    /// The connection is deciding a request (`busy`), or waits on its client again.
    pub fn set_busy(&mut self, id: u64, busy: bool, now: Instant) {
        if let Some(open) = self.open.get_mut(&id) {
            open.since = if busy { None } else { Some(now) };
        }
    }

    pub fn is_busy(&self, id: u64) -> bool {
        self.open.get(&id).is_some_and(|o| o.since.is_none())
    }

    /// The connection `id` ended (it may have been told to close).
    pub fn release(&mut self, id: u64) {
        if self.open.remove(&id).is_none() {
            self.closing = self.closing.saturating_sub(1);
        }
    }

    /// Connections told to close that have not ended yet: a listener waits
    /// for them before it accepts again, so that it never holds more than
    /// its limit (and one) of descriptors, however fast they come.
    pub fn closing(&self) -> usize {
        self.closing
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

/// Until `closing()` says every connection told to close has ended, or
/// [`CLOSE_WAIT`] (a task that does not end is not waited for forever).
pub async fn until_closed(closing: impl Fn() -> usize) {
    let until = tokio::time::Instant::now() + CLOSE_WAIT;
    while closing() > 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// Longest a listener waits for the connections it closed.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    fn is(evicted: &Option<Evicted>, close: &Arc<Notify>) -> bool {
        evicted.as_ref().is_some_and(|e| Arc::ptr_eq(&e.close, close))
    }

    #[test]
    fn at_the_limit_the_connection_waiting_longest_makes_room_never_a_busy_one() {
        let t0 = Instant::now();
        let t = |ms: u64| t0 + Duration::from_millis(ms);
        let mut slots = Slots::default();
        let (a, _, none) = slots.admit(A, t(0), 3).unwrap();
        assert!(none.is_none());
        let (b, b_close, _) = slots.admit(A, t(1), 3).unwrap();
        let (c, _, _) = slots.admit(A, t(2), 3).unwrap();
        slots.set_busy(a, true, t(3));
        // Full: b has waited longest (a is older but busy).
        let (_, d_close, evicted) = slots.admit(A, t(4), 3).unwrap();
        assert!(is(&evicted, &b_close));
        assert!(!slots.open.contains_key(&b) && slots.is_busy(a));
        // c answered a request at 5 and waits from then: d is the oldest now.
        slots.set_busy(c, true, t(5));
        slots.set_busy(c, false, t(5));
        let (e, _, evicted) = slots.admit(A, t(6), 3).unwrap();
        assert!(is(&evicted, &d_close));
        // All busy: no room until one ends.
        slots.set_busy(c, true, t(7));
        slots.set_busy(e, true, t(7));
        assert!(slots.admit(A, t(8), 3).is_none());
        slots.release(c);
        let (_, _, evicted) = slots.admit(A, t(9), 3).unwrap();
        assert!(evicted.is_none());
        assert_eq!(slots.len(), 3);
        // Told to close: counted until its task ends.
        assert_eq!(slots.closing(), 2, "b and d");
        slots.release(b);
        slots.release(e);
        assert_eq!(slots.closing(), 1, "b ended; e ended by itself");
    }

    /// A flood from one address closes only its own connections, however
    /// fast it comes; the other peer's (the kubelet's probe) stays.
    #[test]
    fn the_peer_holding_the_most_gives_up_its_oldest() {
        let t0 = Instant::now();
        let t = |ms: u64| t0 + Duration::from_millis(ms);
        let mut slots = Slots::default();
        let (_, probe, _) = slots.admit(B, t(0), 4).unwrap();
        for ms in 1..4 {
            slots.admit(A, t(ms), 4).unwrap();
        }
        for ms in 4..1000 {
            let (_, _, evicted) = slots.admit(A, t(ms), 4).unwrap();
            assert_eq!(evicted.map(|e| e.peer), Some(A), "at {ms} ms");
        }
        assert!(slots.open.values().any(|o| Arc::ptr_eq(&o.close, &probe)), "the probe's connection is kept");
        // The probe's peer comes again: still the flood's connection goes.
        let (_, _, evicted) = slots.admit(B, t(1000), 4).unwrap();
        assert_eq!(evicted.map(|e| e.peer), Some(A));
        // Two peers holding as many: the longest waiting goes.
        let mut even = Slots::default();
        let (_, a_old, _) = even.admit(A, t(0), 2).unwrap();
        even.admit(B, t(1), 2).unwrap();
        let (_, _, evicted) = even.admit(B, t(2), 2).unwrap();
        assert!(evicted.is_some_and(|e| e.peer == B), "B holds 2 with the newcomer: its own goes");
        assert!(even.open.values().any(|o| Arc::ptr_eq(&o.close, &a_old)));
    }
}
