//! What the watches have seen so far, as a plain value.
//!
//! Every watch (one per ResourceClaim, one for the node's slices, one per driver
//! for slices bound to no single node) is a [`Scope`]. The store applies watcher
//! events to its scope, swapping a relisted scope in whole at `InitDone`, and says
//! whether every scope has been listed once. It never does I/O, so it is fed
//! directly in tests.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::runtime::watcher::Event;

use crate::objects::Snapshot;

/// One watch: what it selects and which RBAC verb/resource it uses.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// One ResourceClaim, by name (field selector `metadata.name`).
    Claim(String),
    /// The slices of one node (`spec.nodeName=<node>`).
    NodeSlices(String),
    /// The slices of one driver bound to no single node (`spec.driver=<d>,spec.nodeName=`).
    DriverSlices(String),
}

impl Scope {
    pub fn field_selector(&self) -> String {
        match self {
            Scope::Claim(name) => format!("metadata.name={name}"),
            Scope::NodeSlices(node) => format!("spec.nodeName={node}"),
            Scope::DriverSlices(driver) => format!("spec.driver={driver},spec.nodeName="),
        }
    }

    pub fn resource(&self) -> &'static str {
        match self {
            Scope::Claim(_) => "resourceclaims",
            Scope::NodeSlices(_) | Scope::DriverSlices(_) => "resourceslices",
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.resource(), self.field_selector())
    }
}

/// An event of one watch.
#[derive(Debug, Clone)]
pub enum ScopeEvent {
    Claim(Event<ResourceClaim>),
    Slice(Event<ResourceSlice>),
}

#[derive(Debug, Default, Clone)]
struct ScopeState<K> {
    synced: bool,
    relist: Option<BTreeMap<String, K>>,
    objects: BTreeMap<String, K>,
}

impl<K: kube::Resource + Clone> ScopeState<K> {
    fn apply(&mut self, event: Event<K>) {
        let name = |o: &K| o.meta().name.clone().unwrap_or_default();
        match event {
            Event::Init => self.relist = Some(BTreeMap::new()),
            Event::InitApply(o) => {
                self.relist.get_or_insert_with(BTreeMap::new).insert(name(&o), o);
            }
            Event::InitDone => {
                self.objects = self.relist.take().unwrap_or_default();
                self.synced = true;
            }
            Event::Apply(o) => {
                self.objects.insert(name(&o), o);
            }
            Event::Delete(o) => {
                self.objects.remove(&name(&o));
            }
        }
    }
}

/// The pod and everything the watches have listed.
#[derive(Debug, Default, Clone)]
pub struct Store {
    pub pod: Option<Pod>,
    claims: BTreeMap<Scope, ScopeState<ResourceClaim>>,
    slices: BTreeMap<Scope, ScopeState<ResourceSlice>>,
}

impl Store {
    /// Register a watch; its objects count once its first list is done.
    pub fn add_scope(&mut self, scope: Scope) {
        match scope {
            Scope::Claim(_) => {
                self.claims.entry(scope).or_default();
            }
            _ => {
                self.slices.entry(scope).or_default();
            }
        }
    }

    pub fn has_scope(&self, scope: &Scope) -> bool {
        self.claims.contains_key(scope) || self.slices.contains_key(scope)
    }

    pub fn apply(&mut self, scope: &Scope, event: ScopeEvent) {
        match event {
            ScopeEvent::Claim(e) => self.claims.entry(scope.clone()).or_default().apply(e),
            ScopeEvent::Slice(e) => self.slices.entry(scope.clone()).or_default().apply(e),
        }
    }

    /// Scopes whose first list has not completed.
    pub fn unsynced(&self) -> Vec<Scope> {
        let claims = self.claims.iter().filter(|(_, s)| !s.synced).map(|(k, _)| k.clone());
        let slices = self.slices.iter().filter(|(_, s)| !s.synced).map(|(k, _)| k.clone());
        claims.chain(slices).collect()
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            pod: self.pod.clone(),
            claims: self.claims.values().flat_map(|s| s.objects.clone()).collect(),
            slices: self.slices.values().flat_map(|s| s.objects.clone()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn slice(name: &str) -> ResourceSlice {
        ResourceSlice { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() }
    }

    #[test]
    fn relist_replaces_a_scope_whole() {
        let mut store = Store::default();
        let node = Scope::NodeSlices("n".into());
        store.add_scope(node.clone());
        assert_eq!(store.unsynced(), vec![node.clone()]);
        for e in [Event::Init, Event::InitApply(slice("a")), Event::InitApply(slice("b")), Event::InitDone] {
            store.apply(&node, ScopeEvent::Slice(e));
        }
        assert!(store.unsynced().is_empty());
        assert_eq!(store.snapshot().slices.len(), 2);
        store.apply(&node, ScopeEvent::Slice(Event::Delete(slice("a"))));
        store.apply(&node, ScopeEvent::Slice(Event::Apply(slice("c"))));
        assert_eq!(store.snapshot().slices.keys().collect::<Vec<_>>(), vec!["b", "c"]);
        // A relist (after 410 Gone) keeps serving old objects until it is done.
        store.apply(&node, ScopeEvent::Slice(Event::Init));
        store.apply(&node, ScopeEvent::Slice(Event::InitApply(slice("d"))));
        assert_eq!(store.snapshot().slices.len(), 2);
        store.apply(&node, ScopeEvent::Slice(Event::InitDone));
        assert_eq!(store.snapshot().slices.keys().collect::<Vec<_>>(), vec!["d"]);
    }

    #[test]
    fn selectors() {
        assert_eq!(
            Scope::DriverSlices("d.example.com".into()).field_selector(),
            "spec.driver=d.example.com,spec.nodeName="
        );
        assert_eq!(Scope::Claim("c".into()).to_string(), "resourceclaims (metadata.name=c)");
    }
}
