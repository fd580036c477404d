//! What the lists and watches have seen so far, as a plain value.
//!
//! Every list/watch (one per ResourceClaim, one for the node's slices, one per
//! driver for slices bound to no single node) is a [`Scope`]. A list replaces a
//! scope's objects whole (so a relist after 410 Gone keeps serving the old ones
//! until it is done), a watch event changes one object, and the store says
//! which scopes have been listed and from which resource version a watch
//! resumes. It never does I/O, so it is fed directly in tests.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

use crate::objects::Snapshot;

/// One list/watch: what it selects and which RBAC verb/resource it uses.
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

    pub fn is_slices(&self) -> bool {
        !matches!(self, Scope::Claim(_))
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
            Scope::Claim(_) => false,
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
}

impl Item {
    pub fn name(&self) -> &str {
        match self {
            Item::Claim(c) => c.metadata.name.as_deref().unwrap_or(""),
            Item::Slice(s) => s.metadata.name.as_deref().unwrap_or(""),
        }
    }

    pub fn resource_version(&self) -> Option<&str> {
        match self {
            Item::Claim(c) => c.metadata.resource_version.as_deref(),
            Item::Slice(s) => s.metadata.resource_version.as_deref(),
        }
    }
}

#[derive(Debug, Default, Clone)]
struct ScopeState {
    listed: bool,
    resource_version: Option<String>,
    objects: BTreeMap<String, Item>,
}

/// The pod and everything the lists and watches have seen.
#[derive(Debug, Default, Clone)]
pub struct Store {
    pub pod: Option<Pod>,
    scopes: BTreeMap<Scope, ScopeState>,
}

impl Store {
    /// Register a scope; its objects count once its first list is done.
    pub fn add_scope(&mut self, scope: Scope) {
        self.scopes.entry(scope).or_default();
    }

    pub fn has_scope(&self, scope: &Scope) -> bool {
        self.scopes.contains_key(scope)
    }

    pub fn scopes(&self) -> impl Iterator<Item = &Scope> {
        self.scopes.keys()
    }

    pub fn is_listed(&self, scope: &Scope) -> bool {
        self.scopes.get(scope).is_some_and(|s| s.listed)
    }

    /// Scopes whose first list has not completed.
    pub fn unlisted(&self) -> Vec<Scope> {
        self.scopes.iter().filter(|(_, s)| !s.listed).map(|(k, _)| k.clone()).collect()
    }

    pub fn resource_version(&self, scope: &Scope) -> Option<&str> {
        self.scopes.get(scope).and_then(|s| s.resource_version.as_deref())
    }

    /// A completed list: the scope's objects are exactly these.
    pub fn replace(&mut self, scope: &Scope, items: Vec<Item>, resource_version: String) {
        let state = self.scopes.entry(scope.clone()).or_default();
        state.objects = items.into_iter().map(|i| (i.name().to_string(), i)).collect();
        state.resource_version = Some(resource_version);
        state.listed = true;
    }

    pub fn apply(&mut self, scope: &Scope, item: Item) {
        let state = self.scopes.entry(scope.clone()).or_default();
        if let Some(rv) = item.resource_version() {
            state.resource_version = Some(rv.to_string());
        }
        state.objects.insert(item.name().to_string(), item);
    }

    pub fn delete(&mut self, scope: &Scope, name: &str, resource_version: Option<String>) {
        let state = self.scopes.entry(scope.clone()).or_default();
        state.objects.remove(name);
        if resource_version.is_some() {
            state.resource_version = resource_version;
        }
    }

    pub fn bookmark(&mut self, scope: &Scope, resource_version: String) {
        self.scopes.entry(scope.clone()).or_default().resource_version = Some(resource_version);
    }

    pub fn claims(&self) -> impl Iterator<Item = &ResourceClaim> {
        self.scopes.values().flat_map(|s| s.objects.values()).filter_map(|i| match i {
            Item::Claim(c) => Some(c.as_ref()),
            Item::Slice(_) => None,
        })
    }

    /// The resolver's input. Slices are kept trimmed (see `slices`), so this
    /// copy is as small as the pod's devices.
    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot { pod: self.pod.clone(), ..Default::default() };
        for item in self.scopes.values().flat_map(|s| s.objects.values()) {
            match item {
                Item::Claim(c) => {
                    snapshot.claims.insert(item.name().to_string(), c.as_ref().clone());
                }
                Item::Slice(s) => {
                    snapshot.slices.insert(item.name().to_string(), s.as_ref().clone());
                }
            }
        }
        snapshot
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn slice(name: &str, rv: &str) -> Item {
        Item::Slice(Box::new(ResourceSlice {
            metadata: ObjectMeta { name: Some(name.into()), resource_version: Some(rv.into()), ..Default::default() },
            ..Default::default()
        }))
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
}
