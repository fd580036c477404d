//! Every scope of a run, each in one place: what the reconciler asks of it
//! and what its lists and watches have brought, as a plain value.
//!
//! Every list/watch (one per ResourceClaim, one for the node's slices, one per
//! driver for slices bound to no single node, the pod's own) is a [`Scope`],
//! and its [`ScopeState`] holds both halves: its [`Requests`] (the lists and
//! watches asked for, their retries, the last error) and, once the scope is
//! registered for the resolver, its objects. A list replaces a scope's
//! objects whole (so a relist after 410 Gone keeps serving the old ones until
//! it is done), a watch event changes one object, and the store says which
//! scopes have been listed and from which resource version a watch resumes.
//! It never does I/O, so it is fed directly in tests.
//!
//! A driver republishes a pool slice by slice, each at the new
//! `spec.pool.generation`; until the new generation has all its
//! `resourceSliceCount` slices, the ResourceSlice API tells consumers to wait.
//! So when a change leaves a pool's newest generation incomplete, the store
//! keeps the slices of the generation that was complete before (the versions
//! the change replaced or deleted), and hands them to the resolver with the
//! rest until the new generation is complete or the pool has no slice left
//! (which generation is complete: `model::pools`, the resolver's rule too).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

use crate::model::backoff::RetryBackoff;
use crate::model::objects::Snapshot;
use crate::model::pools::PoolGenerations;
use crate::model::slices::DeviceFilter;

/// One list/watch: what it selects and which RBAC verb/resource it uses.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// One ResourceClaim, by name (field selector `metadata.name`).
    Claim(String),
    /// The slices of one node (`spec.nodeName=<node>`).
    NodeSlices(String),
    /// The slices of one driver bound to no single node (`spec.driver=<d>,spec.nodeName=`).
    DriverSlices(String),
    /// The pod itself (`metadata.name=<pod>`), watched by `serve` for what the
    /// kubelet writes into its status (device health). Only ever watched: its
    /// "list" is a get of the pod, which needs no `list` permission.
    Pod(String),
}

impl Scope {
    pub fn field_selector(&self) -> String {
        match self {
            Scope::Claim(name) => format!("metadata.name={name}"),
            Scope::NodeSlices(node) => format!("spec.nodeName={node}"),
            Scope::DriverSlices(driver) => format!("spec.driver={driver},spec.nodeName="),
            Scope::Pod(name) => format!("metadata.name={name}"),
        }
    }

    pub fn resource(&self) -> &'static str {
        match self {
            Scope::Claim(_) => "resourceclaims",
            Scope::NodeSlices(_) | Scope::DriverSlices(_) => "resourceslices",
            Scope::Pod(_) => "pods",
        }
    }

    pub fn is_slices(&self) -> bool {
        matches!(self, Scope::NodeSlices(_) | Scope::DriverSlices(_))
    }

    /// Whether an object the server sent for this scope really belongs to it
    /// (a server, or a proxy in front of it, may ignore the field selector).
    pub fn admits_claim(&self, claim: &ResourceClaim, namespace: &str) -> bool {
        matches!(self, Scope::Claim(name) if claim.metadata.name.as_deref() == Some(name.as_str())
            && claim.metadata.namespace.as_deref().is_none_or(|ns| ns == namespace))
    }

    pub fn admits_slice(&self, slice: &ResourceSlice) -> bool {
        let node = slice.spec.node_name.as_deref().unwrap_or("");
        match self {
            Scope::Claim(_) | Scope::Pod(_) => false,
            Scope::NodeSlices(n) => node == n,
            Scope::DriverSlices(d) => node.is_empty() && slice.spec.driver == *d,
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.resource(), self.field_selector())
    }
}

/// One object of a scope.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Claim(Box<ResourceClaim>),
    Slice(Box<ResourceSlice>),
    /// The pod, from its watch; the reconciler keeps it as `Store::pod`, never among a scope's objects.
    Pod(Box<Pod>),
}

impl Item {
    pub fn name(&self) -> &str {
        match self {
            Item::Claim(c) => c.metadata.name.as_deref().unwrap_or(""),
            Item::Slice(s) => s.metadata.name.as_deref().unwrap_or(""),
            Item::Pod(p) => p.metadata.name.as_deref().unwrap_or(""),
        }
    }

    pub fn resource_version(&self) -> Option<&str> {
        match self {
            Item::Claim(c) => c.metadata.resource_version.as_deref(),
            Item::Slice(s) => s.metadata.resource_version.as_deref(),
            Item::Pod(p) => p.metadata.resource_version.as_deref(),
        }
    }
}

/// One scope, whole.
#[derive(Debug, Default, Clone)]
pub struct ScopeState {
    /// What is asked of it.
    pub requests: Requests,
    /// Its objects, once it is registered for the resolver ([`Store::add_scope`]):
    /// the pod's own scope has none until `serve` follows it, nor after its
    /// watch is refused.
    held: Option<ScopeObjects>,
}

/// What the reconciler asks of one scope. The pod has one too (its list is a GET).
#[derive(Debug, Default, Clone)]
pub struct Requests {
    /// A list (the pod: a get) is asked for and not answered yet.
    pub listing: bool,
    /// A watch is open or asked for.
    pub watching: bool,
    /// The next watch waits this long (the last one failed or was cut short).
    pub watch_after: Option<std::time::Duration>,
    /// Quick retries until the first answer (start-up is waiting for it).
    pub startup: RetryBackoff,
    /// The last error, for the timeout message; an answer clears it.
    pub error: Option<String>,
    /// Slices: the device filter their last list was decoded with.
    pub decoded_with: Option<DeviceFilter>,
    /// Its watch was refused (401/403: the pod's, by RBAC from before
    /// `serve` needed it): it is not asked for again.
    pub refused: bool,
}

/// What a scope's lists and watches have brought.
#[derive(Debug, Default, Clone)]
struct ScopeObjects {
    listed: bool,
    resource_version: Option<String>,
    objects: BTreeMap<String, Item>,
    /// Per pool whose newest generation is incomplete: the last complete one.
    kept: BTreeMap<PoolKey, KeptGeneration>,
}

/// A pool: (driver, pool name).
type PoolKey = (String, String);

/// The slices of a pool's last complete generation that changed since to a
/// newer, still incomplete generation (or were deleted), by name.
#[derive(Debug, Clone)]
struct KeptGeneration {
    generation: i64,
    slices: BTreeMap<String, Item>,
}

/// A slice's pool, generation and slice count.
fn pool_of(item: &Item) -> Option<(PoolKey, i64, i64)> {
    match item {
        Item::Slice(s) => Some((
            (s.spec.driver.clone(), s.spec.pool.name.clone()),
            s.spec.pool.generation,
            s.spec.pool.resource_slice_count,
        )),
        Item::Claim(_) | Item::Pod(_) => None,
    }
}

/// The newest generation of `pool` among `objects` when all its slices are there.
fn complete_generation(objects: &BTreeMap<String, Item>, pool: &PoolKey) -> Option<i64> {
    let mut generations = PoolGenerations::default();
    for (key, generation, count) in objects.values().filter_map(pool_of) {
        if key == *pool {
            generations.add(generation, count);
        }
    }
    generations.newest_complete()
}

impl ScopeObjects {
    /// The pools of these items, each with its complete generation now (call before a change).
    fn pools_before<'a>(&self, items: impl IntoIterator<Item = &'a Item>) -> BTreeMap<PoolKey, Option<i64>> {
        items
            .into_iter()
            .filter_map(pool_of)
            .map(|(key, ..)| {
                let complete = complete_generation(&self.objects, &key);
                (key, complete)
            })
            .collect()
    }

    /// After a change to the pools of `before` that replaced or removed `old`:
    /// keep what the last complete generation needs, drop what it no longer does.
    fn keep_complete_generations(&mut self, before: BTreeMap<PoolKey, Option<i64>>, old: Vec<Item>) {
        for (pool, complete_before) in before {
            let current = |objects: &BTreeMap<String, Item>, name: &str, generation: i64| {
                objects.get(name).and_then(pool_of).is_some_and(|(key, g, _)| key == pool && g == generation)
            };
            let has_slices = self.objects.values().filter_map(pool_of).any(|(key, ..)| key == pool);
            if !has_slices || complete_generation(&self.objects, &pool).is_some() {
                // The new generation is complete, or the pool is gone.
                self.kept.remove(&pool);
                continue;
            }
            let Some(generation) = self.kept.get(&pool).map(|k| k.generation).or(complete_before) else {
                continue;
            };
            let kept =
                self.kept.entry(pool.clone()).or_insert_with(|| KeptGeneration { generation, slices: BTreeMap::new() });
            for item in &old {
                let at_kept = pool_of(item).is_some_and(|(key, g, _)| key == pool && g == generation);
                if at_kept && !current(&self.objects, item.name(), generation) {
                    kept.slices.insert(item.name().to_string(), item.clone());
                }
            }
            // A slice back at the kept generation is served as it is now.
            kept.slices.retain(|name, _| !current(&self.objects, name, generation));
        }
    }
}

/// The pod and every scope.
#[derive(Debug, Default, Clone)]
pub struct Store {
    pub pod: Option<Pod>,
    scopes: BTreeMap<Scope, ScopeState>,
}

impl Store {
    /// Register a scope for the resolver; its objects count once its first list is done.
    pub fn add_scope(&mut self, scope: Scope) {
        self.scopes.entry(scope).or_default().held.get_or_insert_default();
    }

    /// No longer resolve with a scope's objects; what was asked of it stays known.
    pub fn remove_scope(&mut self, scope: &Scope) {
        if let Some(state) = self.scopes.get_mut(scope) {
            state.held = None;
        }
    }

    pub fn has_scope(&self, scope: &Scope) -> bool {
        self.held(scope).is_some()
    }

    /// The scopes registered for the resolver.
    pub fn scopes(&self) -> impl Iterator<Item = &Scope> {
        self.scopes.iter().filter(|(_, s)| s.held.is_some()).map(|(scope, _)| scope)
    }

    /// What is asked of a scope (made empty the first time).
    pub fn requests(&mut self, scope: &Scope) -> &mut Requests {
        if !self.scopes.contains_key(scope) {
            self.scopes.insert(scope.clone(), ScopeState::default());
        }
        &mut self.scopes.get_mut(scope).expect("inserted above").requests
    }

    pub fn requests_of(&self, scope: &Scope) -> Option<&Requests> {
        self.scopes.get(scope).map(|s| &s.requests)
    }

    /// Every scope ever asked about, with what is asked of it.
    pub fn all_requests(&self) -> impl Iterator<Item = (&Scope, &Requests)> {
        self.scopes.iter().map(|(scope, s)| (scope, &s.requests))
    }

    fn held(&self, scope: &Scope) -> Option<&ScopeObjects> {
        self.scopes.get(scope).and_then(|s| s.held.as_ref())
    }

    /// A scope's objects, registering it if it was not.
    fn held_mut(&mut self, scope: &Scope) -> &mut ScopeObjects {
        self.scopes.entry(scope.clone()).or_default().held.get_or_insert_default()
    }

    fn all_held(&self) -> impl Iterator<Item = &ScopeObjects> {
        self.scopes.values().filter_map(|s| s.held.as_ref())
    }

    pub fn is_listed(&self, scope: &Scope) -> bool {
        self.held(scope).is_some_and(|s| s.listed)
    }

    /// Registered scopes whose first list has not completed.
    pub fn unlisted(&self) -> Vec<Scope> {
        self.scopes.iter().filter(|(_, s)| s.held.as_ref().is_some_and(|o| !o.listed)).map(|(k, _)| k.clone()).collect()
    }

    pub fn resource_version(&self, scope: &Scope) -> Option<&str> {
        self.held(scope).and_then(|s| s.resource_version.as_deref())
    }

    /// A completed list: the scope's objects are exactly these.
    pub fn replace(&mut self, scope: &Scope, items: Vec<Item>, resource_version: String) {
        let state = self.held_mut(scope);
        let objects: BTreeMap<String, Item> = items.into_iter().map(|i| (i.name().to_string(), i)).collect();
        let before = state.pools_before(state.objects.values().chain(objects.values()));
        let old = std::mem::replace(&mut state.objects, objects).into_values().collect();
        state.keep_complete_generations(before, old);
        state.resource_version = Some(resource_version);
        state.listed = true;
    }

    pub fn apply(&mut self, scope: &Scope, item: Item) {
        let state = self.held_mut(scope);
        if let Some(rv) = item.resource_version() {
            state.resource_version = Some(rv.to_string());
        }
        let before = state.pools_before(state.objects.get(item.name()).into_iter().chain([&item]));
        let old = state.objects.insert(item.name().to_string(), item);
        state.keep_complete_generations(before, old.into_iter().collect());
    }

    pub fn delete(&mut self, scope: &Scope, name: &str, resource_version: Option<String>) {
        let state = self.held_mut(scope);
        let before = state.pools_before(state.objects.get(name));
        let old = state.objects.remove(name);
        state.keep_complete_generations(before, old.into_iter().collect());
        if resource_version.is_some() {
            state.resource_version = resource_version;
        }
    }

    pub fn bookmark(&mut self, scope: &Scope, resource_version: String) {
        self.held_mut(scope).resource_version = Some(resource_version);
    }

    pub fn claims(&self) -> impl Iterator<Item = &ResourceClaim> {
        self.all_held().flat_map(|s| s.objects.values()).filter_map(|i| match i {
            Item::Claim(c) => Some(c.as_ref()),
            Item::Slice(_) | Item::Pod(_) => None,
        })
    }

    /// The resolver's input. Slices are kept trimmed (see `slices`), so this
    /// copy is as small as the pod's devices. Slices kept for a pool's last
    /// complete generation come in beside the current ones, keyed
    /// `<name> (generation <n>)` (a space is never in an object's name).
    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot { pod: self.pod.clone(), ..Default::default() };
        for item in self.all_held().flat_map(|s| s.objects.values()) {
            match item {
                Item::Claim(c) => {
                    snapshot.claims.insert(item.name().to_string(), c.as_ref().clone());
                }
                Item::Slice(s) => {
                    snapshot.slices.insert(item.name().to_string(), s.as_ref().clone());
                }
                Item::Pod(_) => {}
            }
        }
        for kept in self.all_held().flat_map(|s| s.kept.values()) {
            for (name, item) in &kept.slices {
                if let Item::Slice(s) = item {
                    snapshot.slices.insert(format!("{name} (generation {})", kept.generation), s.as_ref().clone());
                }
            }
        }
        snapshot
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drafs_test_support::{Build, SliceBuilder};

    fn slice(name: &str, rv: &str) -> Item {
        Item::Slice(Box::new(SliceBuilder::new(name, "d", "p").resource_version(rv).decode()))
    }

    #[test]
    fn a_list_replaces_a_scope_whole_and_watches_resume_from_the_last_version() {
        let mut store = Store::default();
        let node = Scope::NodeSlices("n".into());
        store.add_scope(node.clone());
        assert_eq!(store.unlisted(), vec![node.clone()]);
        store.replace(&node, vec![slice("a", "1"), slice("b", "2")], "5".into());
        assert!(store.unlisted().is_empty());
        assert_eq!(store.resource_version(&node), Some("5"));
        store.delete(&node, "a", Some("6".into()));
        store.apply(&node, slice("c", "7"));
        assert_eq!(store.snapshot().slices.keys().collect::<Vec<_>>(), vec!["b", "c"]);
        assert_eq!(store.resource_version(&node), Some("7"));
        store.bookmark(&node, "9".into());
        assert_eq!(store.resource_version(&node), Some("9"));
        store.replace(&node, vec![slice("d", "10")], "11".into());
        assert_eq!(store.snapshot().slices.keys().collect::<Vec<_>>(), vec!["d"]);
    }

    /// A scope's requests and objects share its one entry: asking about a
    /// scope does not register it for the resolver, and unregistering it
    /// drops its objects but not what was asked of it.
    #[test]
    fn a_scope_is_one_entry_of_requests_and_objects() {
        let mut store = Store::default();
        let pod = Scope::Pod("p".into());
        store.requests(&pod).listing = true;
        assert!(!store.has_scope(&pod));
        assert_eq!(store.scopes().count(), 0);
        assert!(store.unlisted().is_empty());
        store.add_scope(pod.clone());
        store.replace(&pod, vec![], "3".into());
        assert!(store.is_listed(&pod));
        assert!(store.requests_of(&pod).is_some_and(|r| r.listing), "the requests stay beside the objects");
        store.requests(&pod).refused = true;
        store.remove_scope(&pod);
        assert!(!store.has_scope(&pod) && !store.is_listed(&pod) && store.resource_version(&pod).is_none());
        assert!(store.requests_of(&pod).is_some_and(|r| r.refused), "what was asked of it is still known");
        assert_eq!(store.all_requests().count(), 1);
    }

    #[test]
    fn selectors_and_admission() {
        assert_eq!(
            Scope::DriverSlices("d.example.com".into()).field_selector(),
            "spec.driver=d.example.com,spec.nodeName="
        );
        assert_eq!(Scope::Claim("c".into()).to_string(), "resourceclaims (metadata.name=c)");
        let mut s = ResourceSlice::default();
        s.spec.driver = "d".into();
        assert!(Scope::DriverSlices("d".into()).admits_slice(&s));
        assert!(!Scope::NodeSlices("n".into()).admits_slice(&s));
        s.spec.node_name = Some("n".into());
        assert!(Scope::NodeSlices("n".into()).admits_slice(&s));
        assert!(!Scope::DriverSlices("d".into()).admits_slice(&s));
        let mut c = ResourceClaim::default();
        c.metadata.name = Some("c".into());
        c.metadata.namespace = Some("other".into());
        assert!(!Scope::Claim("c".into()).admits_claim(&c, "ns"));
        c.metadata.namespace = Some("ns".into());
        assert!(Scope::Claim("c".into()).admits_claim(&c, "ns"));
        assert!(!Scope::Claim("d".into()).admits_claim(&c, "ns"));
    }

    /// A slice of pool d/p at `generation` of 2 slices.
    fn pooled(name: &str, generation: i64) -> Item {
        let s = SliceBuilder::new(name, "d", "p").resource_version(&generation.to_string());
        Item::Slice(Box::new(s.generation(generation).slice_count(2).decode()))
    }

    /// The snapshot's slices as `key@generation`.
    fn slices(store: &Store) -> Vec<String> {
        store.snapshot().slices.iter().map(|(k, s)| format!("{k}@{}", s.spec.pool.generation)).collect()
    }

    #[test]
    fn a_pool_republished_slice_by_slice_keeps_its_last_complete_generation() {
        let mut store = Store::default();
        let node = Scope::NodeSlices("n".into());
        store.replace(&node, vec![pooled("a", 1), pooled("b", 1)], "5".into());
        // a moves to generation 2, which has 1 of its 2 slices: a at generation 1 stays too.
        store.apply(&node, pooled("a", 2));
        assert_eq!(slices(&store), vec!["a@2", "a (generation 1)@1", "b@1"]);
        // A relist in between finds the same: still kept.
        store.replace(&node, vec![pooled("a", 2), pooled("b", 1)], "6".into());
        assert_eq!(slices(&store), vec!["a@2", "a (generation 1)@1", "b@1"]);
        // b follows: generation 2 is complete, generation 1 is let go.
        store.apply(&node, pooled("b", 2));
        assert_eq!(slices(&store), vec!["a@2", "b@2"]);
    }

    #[test]
    fn kept_slices_follow_deletions_and_go_with_the_pool() {
        let mut store = Store::default();
        let node = Scope::NodeSlices("n".into());
        store.replace(&node, vec![pooled("a", 1), pooled("b", 1)], "5".into());
        // Republished by deleting and creating: both deleted slices of generation 1 are kept.
        store.delete(&node, "a", None);
        assert_eq!(slices(&store), vec!["a (generation 1)@1", "b@1"]);
        store.apply(&node, pooled("a", 2));
        store.delete(&node, "b", None);
        assert_eq!(slices(&store), vec!["a@2", "a (generation 1)@1", "b (generation 1)@1"]);
        // The pool's last slice goes: nothing of it is kept.
        store.delete(&node, "a", None);
        assert!(slices(&store).is_empty(), "{:?}", slices(&store));
    }

    #[test]
    fn nothing_is_kept_without_a_complete_generation_before() {
        let mut store = Store::default();
        let node = Scope::NodeSlices("n".into());
        // Listed in the middle of a republish: no complete generation was ever seen.
        store.replace(&node, vec![pooled("a", 2), pooled("b", 1)], "5".into());
        store.apply(&node, pooled("c", 3));
        assert_eq!(slices(&store), vec!["a@2", "b@1", "c@3"]);
        // A slice changed within its generation replaces the old version.
        let mut store = Store::default();
        store.replace(&node, vec![pooled("a", 1), pooled("b", 1)], "5".into());
        store.apply(&node, pooled("a", 1));
        assert_eq!(slices(&store), vec!["a@1", "b@1"]);
    }
}
