//! Each warning reported once, in bounded memory.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

use super::Reconciler;

/// Distinct warnings remembered by [`Warned`].
pub(super) const WARNED_MAX: usize = 1024;

/// The warnings reported so far, so that each is reported once: the same
/// error on every retry, the same skipped attribute on every resolution.
/// Bounded: only the last [`WARNED_MAX`] distinct warnings are remembered,
/// each by a hash (8 bytes, however long the message), so a flood of distinct
/// ones (a server that ignores the field selector sends every object of the
/// cluster, each named in its warning; an API error whose message changes)
/// costs a fixed amount of memory. A warning forgotten that way is reported
/// once more if it comes back.
#[derive(Debug, Default)]
pub(super) struct Warned {
    seen: HashSet<u64>,
    /// The same hashes, oldest first.
    order: VecDeque<u64>,
}

impl Warned {
    /// True the first time `warning` comes (or again once it was forgotten).
    pub(super) fn first(&mut self, warning: &str) -> bool {
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
    pub(super) fn len(&self) -> usize {
        self.seen.len()
    }
}

impl Reconciler {
    pub(super) fn warn_once(&mut self, warning: String) -> Option<String> {
        self.warned.first(&warning).then_some(warning)
    }
}
