//! How long to wait before asking again: pure timing policies, shared by the
//! engine (the API server) and the outputs (a failed write).

use std::time::{Duration, Instant};

/// Start-up retries (the pod, a scope until its first list): 200 ms doubling
/// to 5 s, quick because a pod's start waits for them. Once a scope is listed,
/// [`WatchBackoff`] takes over.
#[derive(Debug, Clone)]
pub struct RetryBackoff {
    next: Duration,
}

impl RetryBackoff {
    const FIRST: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(5);

    /// Start again from the first delay (after a success).
    pub fn reset(&mut self) {
        *self = RetryBackoff::default();
    }
}

impl Default for RetryBackoff {
    fn default() -> Self {
        RetryBackoff { next: Self::FIRST }
    }
}

impl Iterator for RetryBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        Some(now)
    }
}

/// Delays before asking again about a scope that was listed once and then
/// went wrong: a failed list or watch, a watch answering 410 Gone, a watch the
/// server closed early without a change. Like client-go's reflector, and for
/// the same reason (every pod running drafs multiplies the load a failing
/// server sees), the delay is not reset by a successful list, only by
/// [`WatchBackoff::RESET_AFTER`] without trouble: a watch that a list always
/// precedes and that always fails must still slow down. One value serves all
/// of a run's scopes, so a server failing every watch sees one retry
/// sequence per pod, not one per scope.
///
/// Delays start at [`WatchBackoff::INITIAL`] and double; each gets up to 50%
/// random jitter (so the pods of a node do not retry in step after an
/// outage), and none is longer than [`WatchBackoff::CAP`]: a server that heals
/// is used again within the cap.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    base: Duration,
    /// When the last delay ends: health is counted from there.
    until: Option<Instant>,
    random: u64,
}

impl WatchBackoff {
    pub const INITIAL: Duration = Duration::from_secs(1);
    pub const CAP: Duration = Duration::from_secs(30);
    pub const RESET_AFTER: Duration = Duration::from_secs(120);
    /// The largest base delay: with its jitter it stays within the cap.
    const MAX_BASE: Duration = Duration::from_secs(20);

    /// `seed` picks the jitter: the same seed gives the same delays.
    pub fn new(seed: u64) -> Self {
        WatchBackoff { base: Self::INITIAL, until: None, random: seed }
    }

    /// The delay before the next attempt, for trouble that happened at `now`.
    pub fn next(&mut self, now: Instant) -> Duration {
        if self.until.is_some_and(|until| now.saturating_duration_since(until) >= Self::RESET_AFTER) {
            self.base = Self::INITIAL;
        }
        let base = self.base;
        self.base = (base * 2).min(Self::MAX_BASE);
        let delay = (base + base.mul_f64(self.uniform() / 2.0)).min(Self::CAP);
        self.until = Some(now + delay);
        delay
    }

    /// A number in [0, 1) from splitmix64: no dependency, reproducible.
    fn uniform(&mut self) -> f64 {
        self.random = self.random.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.random;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Whether to tell of a failure that keeps coming back (a write refused for
/// room while the app holds old trees open, every new tree failing again):
/// the first of a streak, then at most once per [`FailureStreak::EVERY`],
/// with how many went untold; a success ends the streak.
#[derive(Debug, Clone, Default)]
pub struct FailureStreak {
    /// When it was last told (None: not failing).
    told: Option<Instant>,
    untold: u64,
}

impl FailureStreak {
    pub const EVERY: Duration = Duration::from_secs(60);

    /// A failure at `now`: `Some(failures since the last told, this one
    /// included)` when it is to be told, None when it is to stay quiet.
    pub fn failed(&mut self, now: Instant) -> Option<u64> {
        self.untold += 1;
        match self.told {
            Some(told) if now.saturating_duration_since(told) < Self::EVERY => None,
            _ => {
                self.told = Some(now);
                Some(std::mem::take(&mut self.untold))
            }
        }
    }

    /// A success: whether it ends a streak.
    pub fn succeeded(&mut self) -> bool {
        self.untold = 0;
        self.told.take().is_some()
    }

    pub fn is_failing(&self) -> bool {
        self.told.is_some()
    }
}

/// A watch that ends with no change sooner than this was cut short (drafs
/// asks for at least 5 minutes, `engine::api::WATCH_SECONDS_MIN`: a proxy or
/// a restarting server closed it): resumed only after a delay, like any
/// other trouble.
pub const WATCH_CUT_SHORT: Duration = Duration::from_secs(30);

/// Whether a watch that the server closed after `lasted`, having reported
/// `changes`, was cut short: the one rule for the runs' watches and the node
/// agent's.
pub fn cut_short(lasted: Duration, changes: usize) -> bool {
    changes == 0 && lasted < WATCH_CUT_SHORT
}

/// The `timeoutSeconds` of the `n`th watch of a run seeded with `seed`:
/// uniform in `[min, max)`. Pure (the caller picks the seed), so a test can
/// check the spread.
pub fn watch_timeout(seed: u64, n: u64, min: u32, max: u32) -> u32 {
    let mut b = WatchBackoff::new(seed.wrapping_add(n.wrapping_mul(0x2545_f491_4f6c_dd1d)));
    let span = max.saturating_sub(min).max(1);
    min + (b.uniform() * f64::from(span)) as u32 % span
}

/// A seed for [`WatchBackoff`] from a text (the pod's name): stable for one
/// pod, different between pods (FNV-1a).
pub fn seed_of(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delays(backoff: &mut WatchBackoff, start: Instant, n: usize) -> Vec<Duration> {
        let mut now = start;
        (0..n)
            .map(|_| {
                let d = backoff.next(now);
                now += d;
                d
            })
            .collect()
    }

    #[test]
    fn watch_backoff_doubles_with_jitter_up_to_the_cap() {
        let mut b = WatchBackoff::new(seed_of("ml/p"));
        let got = delays(&mut b, Instant::now(), 12);
        let bases = [1, 2, 4, 8, 16, 20, 20, 20, 20, 20, 20, 20];
        for (d, base) in got.iter().zip(bases) {
            let base = Duration::from_secs(base);
            assert!(*d >= base && *d < base.mul_f64(1.5) && *d <= WatchBackoff::CAP, "{got:?}");
        }
        assert!(got.windows(2).any(|w| w[0] != w[1] && w[0] >= Duration::from_secs(20)), "jitter at the cap: {got:?}");
        // The same seed gives the same delays; another pod's differ.
        assert_eq!(delays(&mut WatchBackoff::new(seed_of("ml/p")), Instant::now(), 12), got);
        assert_ne!(delays(&mut WatchBackoff::new(seed_of("ml/q")), Instant::now(), 12), got);
    }

    #[test]
    fn a_failure_streak_is_told_first_then_once_a_minute_with_what_went_untold() {
        let t0 = Instant::now();
        let mut streak = FailureStreak::default();
        assert_eq!(streak.failed(t0), Some(1), "the first is told");
        let told: Vec<Option<u64>> = (1..=150).map(|i| streak.failed(t0 + Duration::from_millis(i * 330))).collect();
        // 150 failures over 49.5 s: none told; at 60 s the 151 untold ones with the next.
        assert!(told.iter().all(Option::is_none), "{told:?}");
        assert_eq!(streak.failed(t0 + FailureStreak::EVERY), Some(151));
        assert!(streak.is_failing() && streak.succeeded() && !streak.is_failing());
        assert!(!streak.succeeded(), "no streak to end");
        assert_eq!(streak.failed(t0 + FailureStreak::EVERY), Some(1), "a new streak is told at once");
    }

    #[test]
    fn watch_timeouts_spread_over_their_range() {
        let seconds: Vec<u32> = (0..1000).map(|n| watch_timeout(seed_of("ml/p"), n, 300, 600)).collect();
        assert!(seconds.iter().all(|s| (300..600).contains(s)), "{seconds:?}");
        // Spread: every 30 s bucket of the range is used.
        for bucket in 0..10 {
            assert!(seconds.iter().any(|s| (s - 300) / 30 == bucket), "bucket {bucket} empty");
        }
        let other: Vec<u32> = (0..1000).map(|n| watch_timeout(seed_of("ml/q"), n, 300, 600)).collect();
        assert_ne!(seconds, other, "another pod's watches end at other times");
    }

    #[test]
    fn watch_backoff_survives_successes_and_resets_only_after_two_minutes_of_health() {
        let mut b = WatchBackoff::new(1);
        let start = Instant::now();
        let first = b.next(start);
        // Trouble again right after the retry (a list succeeded, the watch failed): longer.
        let second = b.next(start + first);
        assert!(second >= Duration::from_secs(2), "{second:?}");
        let end = start + first + second;
        // Trouble 119 s after the last delay ended: still backing off.
        let third = b.next(end + Duration::from_secs(119));
        assert!(third >= Duration::from_secs(4), "{third:?}");
        // 2 min without trouble: from the start again.
        let after_health = b.next(end + Duration::from_secs(119) + third + WatchBackoff::RESET_AFTER);
        assert!(after_health < Duration::from_millis(1500), "{after_health:?}");
    }
}
