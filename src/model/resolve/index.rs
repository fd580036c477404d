//! The node's pools as the scheduler sees them: for each (driver, pool), the
//! generation that counts and its devices, from the slices of a snapshot.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::resource::v1::Device;

use crate::model::objects::Snapshot;
use crate::model::pools::{GenerationSeen, PoolGenerations};

/// One generation of a pool as the slices seen so far publish it.
struct Generation<'a> {
    slices: HashSet<&'a str>,
    slice_count: i64,
    devices: HashMap<&'a str, &'a Device>,
}

impl Generation<'_> {
    fn seen(&self) -> GenerationSeen {
        GenerationSeen { slices: self.slices.len(), slice_count: self.slice_count }
    }
}

/// The generation of a pool that counts, with its devices, and the newest one seen.
struct PoolView<'a> {
    generation: i64,
    current: Generation<'a>,
    newest: Option<(i64, usize, i64)>,
}

pub(super) struct SliceIndex<'a> {
    pools: HashMap<(&'a str, &'a str), PoolView<'a>>,
}

impl<'a> SliceIndex<'a> {
    /// Pools as the scheduler sees them for `node`: a slice bound to another
    /// node contributes neither devices nor a generation. The generation that
    /// counts is [`PoolGenerations::in_use`]'s: the newest complete one.
    pub(super) fn new(snapshot: &'a Snapshot, node: Option<&str>) -> Self {
        let mut all: HashMap<(&str, &str), BTreeMap<i64, Generation>> = HashMap::new();
        for (key, slice) in &snapshot.slices {
            let spec = &slice.spec;
            if !crate::model::slices::eligible_for(spec, node) {
                continue;
            }
            let pool = (spec.driver.as_str(), spec.pool.name.as_str());
            let generation = all.entry(pool).or_default().entry(spec.pool.generation).or_insert_with(|| Generation {
                slices: HashSet::new(),
                slice_count: 0,
                devices: HashMap::new(),
            });
            generation.slices.insert(slice.metadata.name.as_deref().unwrap_or(key));
            generation.slice_count = generation.slice_count.max(spec.pool.resource_slice_count);
            for device in spec.devices.iter().flatten() {
                generation.devices.insert(device.name.as_str(), device);
            }
        }
        let pools = all
            .into_iter()
            .filter_map(|(pool, mut generations)| {
                let seen: PoolGenerations = generations.iter().map(|(g, generation)| (*g, generation.seen())).collect();
                let (newest, last) = seen.newest()?;
                let newest_seen = (newest, last.slices, last.slice_count);
                let counts = seen.in_use()?;
                let current = generations.remove(&counts)?;
                let newest = (newest != counts).then_some(newest_seen);
                Some((pool, PoolView { generation: counts, current, newest }))
            })
            .collect();
        SliceIndex { pools }
    }

    /// The device, or why it is not there and whether its whole pool is gone.
    pub(super) fn find(&self, driver: &str, pool: &str, device: &str) -> Result<&'a Device, (String, bool)> {
        let Some(view) = self.pools.get(&(driver, pool)) else {
            return Err((format!("no ResourceSlice of driver {driver} publishes pool {pool}"), true));
        };
        if let Some(found) = view.current.devices.get(device) {
            return Ok(found);
        }
        let current = &view.current;
        let mut detail = if current.seen().is_complete() {
            format!("pool {pool} at generation {} does not list it", view.generation)
        } else {
            format!(
                "pool {pool} has {} of {} ResourceSlices at generation {} and none lists it",
                current.slices.len(),
                current.slice_count,
                view.generation
            )
        };
        if let Some((newest, seen, count)) = view.newest {
            detail += &format!(" (generation {newest} is being published: {seen} of {count} ResourceSlices so far)");
        }
        Err((detail, false))
    }
}
