//! Which generation of a ResourceSlice pool counts, the one rule the store
//! (which slices to keep) and the resolver (which devices to serve) share.
//!
//! A driver republishes a pool by writing every slice of it again at a higher
//! `spec.pool.generation`; each slice says how many the generation has
//! (`resourceSliceCount`). Until the newest generation has them all, the
//! ResourceSlice API asks consumers to use the newest complete one; with no
//! complete generation, the newest serves what it lists.

use std::collections::BTreeMap;

/// One generation of a pool as the slices seen so far publish it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GenerationSeen {
    /// Distinct slices seen at this generation.
    pub slices: usize,
    /// The largest `resourceSliceCount` they state.
    pub slice_count: i64,
}

impl GenerationSeen {
    pub fn is_complete(&self) -> bool {
        i64::try_from(self.slices).unwrap_or(i64::MAX) >= self.slice_count
    }
}

/// A pool's generations, from what its slices say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolGenerations(BTreeMap<i64, GenerationSeen>);

impl PoolGenerations {
    /// One more distinct slice, at `generation`, stating `slice_count`.
    pub fn add(&mut self, generation: i64, slice_count: i64) {
        self.insert(generation, GenerationSeen { slices: 1, slice_count });
    }

    /// More distinct slices of one generation at once.
    pub fn insert(&mut self, generation: i64, seen: GenerationSeen) {
        let at = self.0.entry(generation).or_default();
        at.slices += seen.slices;
        at.slice_count = at.slice_count.max(seen.slice_count);
    }

    /// The newest generation seen, and how far it is published.
    pub fn newest(&self) -> Option<(i64, GenerationSeen)> {
        self.0.last_key_value().map(|(g, seen)| (*g, *seen))
    }

    /// The newest generation, if it is complete (a pool being republished has none).
    pub fn newest_complete(&self) -> Option<i64> {
        self.newest().filter(|(_, seen)| seen.is_complete()).map(|(g, _)| g)
    }

    /// The generation that counts: the newest complete one, else the newest.
    pub fn in_use(&self) -> Option<i64> {
        let complete = self.0.iter().rev().find(|(_, seen)| seen.is_complete()).map(|(g, _)| *g);
        complete.or_else(|| self.newest().map(|(g, _)| g))
    }
}

impl FromIterator<(i64, GenerationSeen)> for PoolGenerations {
    fn from_iter<I: IntoIterator<Item = (i64, GenerationSeen)>>(iter: I) -> Self {
        let mut pool = PoolGenerations::default();
        for (generation, seen) in iter {
            pool.insert(generation, seen);
        }
        pool
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (generation, resourceSliceCount) of each slice.
    fn pool(slices: &[(i64, i64)]) -> PoolGenerations {
        let mut pool = PoolGenerations::default();
        for (generation, count) in slices {
            pool.add(*generation, *count);
        }
        pool
    }

    #[test]
    fn a_complete_newest_generation_counts() {
        let p = pool(&[(1, 2), (1, 2), (2, 2), (2, 2)]);
        assert_eq!(p.in_use(), Some(2));
        assert_eq!(p.newest_complete(), Some(2));
    }

    #[test]
    fn while_the_newest_is_published_the_last_complete_one_counts() {
        let p = pool(&[(1, 2), (1, 2), (2, 3), (2, 3)]);
        assert_eq!(p.in_use(), Some(1));
        assert_eq!(p.newest_complete(), None, "the newest is not complete");
        assert_eq!(p.newest(), Some((2, GenerationSeen { slices: 2, slice_count: 3 })));
    }

    #[test]
    fn with_no_complete_generation_the_newest_counts() {
        let p = pool(&[(1, 3), (2, 3)]);
        assert_eq!(p.in_use(), Some(2));
        assert_eq!(p.newest_complete(), None);
        assert_eq!(PoolGenerations::default().in_use(), None);
    }

    #[test]
    fn the_largest_slice_count_a_generation_states_holds() {
        // One slice says 1, another of the same generation says 2: both are needed.
        let p = pool(&[(1, 1), (3, 1), (3, 2)]);
        assert_eq!(p.in_use(), Some(3));
        let p = pool(&[(1, 1), (3, 2)]);
        assert_eq!(p.in_use(), Some(1));
        assert!(GenerationSeen { slices: 0, slice_count: 0 }.is_complete(), "a generation of no slices is");
    }
}
