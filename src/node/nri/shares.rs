//! How long each namespace's container creations may hold the runtime (pure).
//!
//! The runtime creates a node's containers one at a time as far as NRI goes
//! (containerd holds one lock across every plugin's CreateContainer), so
//! while a creation waits for its tree every other pod of the node waits
//! too. Each opted-in namespace has a share of that time: a bucket full at
//! `4 x --nri-wait` that fills again in a minute. A creation waits at most
//! what its namespace has left and is charged what it took, so one tenant's
//! containers that never get ready cost the node at most a few seconds a
//! minute, whoever else creates containers there.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How many of `--nri-wait` a namespace's bucket holds.
const WAITS_PER_BUCKET: u32 = 4;
/// How long an empty bucket takes to fill.
const REFILL: Duration = Duration::from_secs(60);

/// The namespaces' shares of the runtime's time.
#[derive(Debug)]
pub struct WaitShares {
    capacity: Duration,
    /// What each namespace had left when last charged (a full one is absent).
    buckets: HashMap<String, (Duration, Instant)>,
}

impl WaitShares {
    /// Shares for creations that wait at most `wait` each.
    pub fn new(wait: Duration) -> WaitShares {
        WaitShares { capacity: wait * WAITS_PER_BUCKET, buckets: HashMap::new() }
    }

    /// What `namespace` has left at `now`.
    pub fn left(&self, namespace: &str, now: Instant) -> Duration {
        match self.buckets.get(namespace) {
            Some(&(left, at)) => self.refilled(left, at, now),
            None => self.capacity,
        }
    }

    /// Charge `namespace` for a creation that held the runtime `took`.
    pub fn charge(&mut self, namespace: &str, took: Duration, now: Instant) {
        let left = self.left(namespace, now).saturating_sub(took);
        // Buckets that are full again are dropped: they are what an absent one says.
        let capacity = self.capacity;
        self.buckets.retain(|_, &mut (left, at)| refilled(capacity, left, at, now) < capacity);
        if left < self.capacity {
            self.buckets.insert(namespace.to_string(), (left, now));
        }
    }

    fn refilled(&self, left: Duration, at: Instant, now: Instant) -> Duration {
        refilled(self.capacity, left, at, now)
    }

    /// Namespaces with less than a full bucket (for tests and `/status`).
    pub fn drawn(&self) -> usize {
        self.buckets.len()
    }
}

fn refilled(capacity: Duration, left: Duration, at: Instant, now: Instant) -> Duration {
    let since = now.saturating_duration_since(at);
    let gained = capacity.mul_f64((since.as_secs_f64() / REFILL.as_secs_f64()).min(1.0));
    (left + gained).min(capacity)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_millis(500);

    #[test]
    fn a_namespace_starts_with_four_waits_and_spends_them() {
        let now = Instant::now();
        let mut shares = WaitShares::new(WAIT);
        assert_eq!(shares.left("a", now), Duration::from_secs(2));
        for _ in 0..4 {
            shares.charge("a", WAIT, now);
        }
        assert_eq!(shares.left("a", now), Duration::ZERO);
        shares.charge("a", WAIT, now);
        assert_eq!(shares.left("a", now), Duration::ZERO, "never below empty");
    }

    #[test]
    fn one_namespace_spending_leaves_the_others_whole() {
        let now = Instant::now();
        let mut shares = WaitShares::new(WAIT);
        shares.charge("greedy", Duration::from_secs(10), now);
        assert_eq!(shares.left("greedy", now), Duration::ZERO);
        assert_eq!(shares.left("other", now), Duration::from_secs(2));
    }

    #[test]
    fn a_bucket_fills_again_in_a_minute_and_is_then_forgotten() {
        let start = Instant::now();
        let mut shares = WaitShares::new(WAIT);
        shares.charge("a", Duration::from_secs(2), start);
        assert_eq!(shares.left("a", start + Duration::from_secs(30)), Duration::from_secs(1));
        assert_eq!(shares.left("a", start + Duration::from_secs(90)), Duration::from_secs(2));
        assert_eq!(shares.drawn(), 1);
        shares.charge("b", Duration::from_millis(1), start + Duration::from_secs(90));
        assert_eq!(shares.drawn(), 1, "a's full bucket dropped, b's kept");
        assert_eq!(shares.left("a", start + Duration::from_secs(90)), Duration::from_secs(2));
    }

    #[test]
    fn a_quick_answer_costs_almost_nothing() {
        let now = Instant::now();
        let mut shares = WaitShares::new(WAIT);
        for _ in 0..1000 {
            shares.charge("a", Duration::from_micros(100), now);
        }
        assert_eq!(shares.left("a", now), Duration::from_millis(1900));
    }
}
