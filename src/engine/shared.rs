//! One list and watch of a scope of slices (the node's, or a driver's
//! network-attached ones), shared by every run in the process: the node
//! agent serves many pods on one node, which would otherwise each watch the
//! same slices. The hub keeps each slice's JSON as the server sent it; each
//! run decodes only the slices that changed, with its own device filter
//! (see `source`), so its memory still follows its own devices.
//!
//! A run sees the hub as it sees the API server: a list (the slices now), then
//! changes (what differs from the last set it saw). When the hub's own watch
//! breaks it lists again and publishes the new set; the runs see the
//! difference, never the break.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use kube::Client;
use tokio::sync::watch;
use tracing::debug;

use crate::engine::api::{ApiError, object_meta};
use crate::engine::collection::{Collection, FollowHealth, FollowReport, Followed, WatchChange};
use crate::engine::store::Scope;

const RESOURCE: &str = "resourceslices";
/// Slices per list page (the hub holds them all anyway; pages bound one answer).
const PAGE_SIZE: u32 = 64;

/// The slices of one scope, as last seen; a new value on every change.
#[derive(Debug, Default)]
pub struct SliceSet {
    /// Counts the sets published.
    pub generation: u64,
    /// Listed at least once: the set is complete.
    pub listed: bool,
    /// By name, the JSON the API server sent.
    pub slices: BTreeMap<String, Arc<str>>,
    /// Why the last list or watch failed, while it keeps failing.
    pub error: Option<ApiError>,
}

impl SliceSet {
    /// What changed from `earlier` to this set: (changed or new, removed).
    pub fn changes_since<'a>(&'a self, earlier: &'a SliceSet) -> (Vec<&'a Arc<str>>, Vec<&'a str>) {
        let changed = self
            .slices
            .iter()
            .filter(|(name, raw)| earlier.slices.get(*name).is_none_or(|old| !Arc::ptr_eq(old, raw)))
            .map(|(_, raw)| raw)
            .collect();
        let removed = earlier.slices.keys().filter(|n| !self.slices.contains_key(*n)).map(String::as_str).collect();
        (changed, removed)
    }
}

/// One shared scope: its sets, and how its follower fares.
struct Hub {
    tx: Arc<watch::Sender<Arc<SliceSet>>>,
    health: Arc<FollowHealth>,
}

/// The shared scopes, each followed by one task from its first subscriber
/// until its last one goes.
pub struct SharedSlices {
    client: Client,
    scopes: Mutex<HashMap<Scope, Hub>>,
}

impl SharedSlices {
    /// Slices read with `client` (the node agent's own account).
    pub fn new(client: Client) -> Arc<Self> {
        Arc::new(SharedSlices { client, scopes: Mutex::new(HashMap::new()) })
    }

    fn scopes(&self) -> std::sync::MutexGuard<'_, HashMap<Scope, Hub>> {
        self.scopes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The scope's sets, following it from now on if nobody did yet.
    pub fn subscribe(self: &Arc<Self>, scope: &Scope) -> watch::Receiver<Arc<SliceSet>> {
        let mut scopes = self.scopes();
        if let Some(hub) = scopes.get(scope) {
            return hub.tx.subscribe();
        }
        let (tx, rx) = watch::channel(Arc::new(SliceSet::default()));
        let hub = Hub { tx: Arc::new(tx), health: Arc::default() };
        tokio::spawn(follow_while_subscribed(self.clone(), scope.clone(), hub.tx.clone(), hub.health.clone()));
        scopes.insert(scope.clone(), hub);
        rx
    }

    /// The scopes followed now, by field selector.
    pub fn status(&self) -> Vec<FollowReport> {
        let mut out: Vec<_> =
            self.scopes().iter().map(|(scope, hub)| hub.health.report(RESOURCE, scope.field_selector())).collect();
        out.sort_by(|a, b| a.scope.cmp(&b.scope));
        out
    }
}

/// [`follow`] until the scope's last subscriber goes; then the scope is
/// forgotten (a later subscriber starts it again).
async fn follow_while_subscribed(
    hub: Arc<SharedSlices>,
    scope: Scope,
    tx: Arc<watch::Sender<Arc<SliceSet>>>,
    health: Arc<FollowHealth>,
) {
    loop {
        tokio::select! {
            () = follow(hub.client.clone(), scope.clone(), &tx, &health) => return,
            () = tx.closed() => {}
        }
        let mut scopes = hub.scopes();
        // A subscriber may have come between the last going and this lock.
        if tx.receiver_count() == 0 {
            if scopes.get(&scope).is_some_and(|h| Arc::ptr_eq(&h.tx, &tx)) {
                scopes.remove(&scope);
            }
            debug!(%scope, "shared slices: no subscriber left; stopped");
            return;
        }
    }
}

/// List, then watch, under the followers' backoff ([`Collection::follow`]), forever.
async fn follow(client: Client, scope: Scope, tx: &watch::Sender<Arc<SliceSet>>, health: &FollowHealth) {
    let mut listing = BTreeMap::new();
    collection(&scope)
        .follow(&client, PAGE_SIZE, health, |seen| {
            match seen {
                Followed::Listing(raw) => {
                    let name = name_of(raw).ok_or("a slice without a name")?;
                    listing.insert(name, Arc::from(raw));
                }
                Followed::Listed => {
                    let slices = std::mem::take(&mut listing);
                    publish(tx, |set| {
                        set.listed = true;
                        set.error = None;
                        set.slices = slices;
                    });
                }
                Followed::Changed(change) => {
                    let (WatchChange::Put(raw) | WatchChange::Deleted(raw)) = change;
                    let name = name_of(raw).ok_or("a slice without a name")?;
                    match change {
                        WatchChange::Put(raw) => publish(tx, |set| {
                            set.slices.insert(name, Arc::from(raw));
                        }),
                        WatchChange::Deleted(_) => publish(tx, |set| {
                            set.slices.remove(&name);
                        }),
                    }
                }
                Followed::Failing(error) => {
                    listing.clear();
                    // Runs waiting for the first list are told; listed, they keep the last set.
                    if !tx.borrow().listed {
                        publish(tx, |set| set.error = Some(error.clone()));
                    }
                }
            }
            Ok(())
        })
        .await
}

/// Change the current set with `f` and publish the result as a new set.
fn publish(tx: &watch::Sender<Arc<SliceSet>>, f: impl FnOnce(&mut SliceSet)) {
    let current = tx.borrow().clone();
    let mut next = SliceSet {
        generation: current.generation + 1,
        listed: current.listed,
        slices: current.slices.clone(),
        error: current.error.clone(),
    };
    f(&mut next);
    tx.send_replace(Arc::new(next));
}

/// The slices of `scope`, as a collection.
fn collection(scope: &Scope) -> Collection {
    Collection {
        url: "/apis/resource.k8s.io/v1/resourceslices",
        resource: RESOURCE,
        field_selector: scope.field_selector(),
        label_selector: String::new(),
    }
}

fn name_of(raw: &str) -> Option<String> {
    object_meta(raw).map(|(name, _)| name).filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(slices: &[(&str, &Arc<str>)]) -> SliceSet {
        SliceSet {
            listed: true,
            slices: slices.iter().map(|(n, r)| (n.to_string(), Arc::clone(r))).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_run_sees_what_changed_since_its_last_set() {
        let (a, b, b2, c): (Arc<str>, Arc<str>, Arc<str>, Arc<str>) = ("a".into(), "b".into(), "b".into(), "c".into());
        let before = set(&[("a", &a), ("b", &b)]);
        let after = set(&[("a", &a), ("b", &b2), ("c", &c)]);
        let (changed, removed) = after.changes_since(&before);
        assert_eq!(
            changed.iter().map(|r| &***r).collect::<Vec<_>>(),
            ["b", "c"],
            "b was replaced, even with equal text"
        );
        assert!(removed.is_empty());
        let (changed, removed) = before.changes_since(&after);
        assert_eq!(changed.len(), 1);
        assert_eq!(removed, ["c"]);
        assert_eq!(after.changes_since(&after), (vec![], vec![]));
    }
}
