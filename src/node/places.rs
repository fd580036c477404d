//! Who holds the node's places: the rule that keeps one tenant from taking
//! the agent from the others (pure: the caller passes the time).
//!
//! A place is a pod's, whatever it mounts (a tree and a standard view share
//! one). The node has [`PlaceLimits::max_pods`]; a namespace holds at most
//! [`PlaceLimits::per_namespace`] of them, so that the others always find
//! room; a pod with nothing to serve (no claim) gives its place back once
//! its empty tree is written; and a place whose tree was never ready is
//! held only while the kubelet keeps asking for it: when the node is full,
//! one not asked for in [`PENDING_HOLD`] makes room for the newcomer.
//! Places already serving are never taken back: their pods run.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long after its last publish call ended a place whose tree was never
/// ready is kept when another pod needs it. The kubelet calls again after
/// 0.5, 1, 2 ... 122 s: a pod still waiting finds a place again at its next
/// call if one is free.
pub const PENDING_HOLD: Duration = Duration::from_secs(30);

/// What the node serves at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaceLimits {
    /// Pods served at once.
    pub max_pods: usize,
    /// Pods of one namespace served at once.
    pub per_namespace: usize,
}

impl PlaceLimits {
    /// The default share of one namespace: half the node's places (at least one).
    pub fn default_share(max_pods: usize) -> usize {
        max_pods.div_ceil(2).max(1)
    }
}

/// A pod's place.
#[derive(Debug, Clone)]
struct Place {
    namespace: String,
    /// A ready tree was written: the pod runs with it.
    serving: bool,
    /// Publish calls under way for the pod.
    calls: u32,
    /// When the last call ended (or the place was taken).
    last_call: Instant,
}

/// Why a pod gets no place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "drafs on this node serves {held} pods already, its limit (drafs node --max-pods); the pod waits until another one goes"
    )]
    NodeFull { held: usize },
    #[error(
        "namespace {namespace} has {held} pods served by drafs on this node already, its share of the node's {max_pods} (drafs node --max-pods-per-namespace), so that other namespaces find room; the pod waits until one of them goes"
    )]
    NamespaceShare { namespace: String, held: usize, max_pods: usize },
}

impl Refusal {
    /// Its name in the metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NodeFull { .. } => "node_full",
            Refusal::NamespaceShare { .. } => "namespace_share",
        }
    }
}

/// A place taken: the pods whose places were taken back to make room for it
/// (their volumes are to be torn down).
pub type Taken = Vec<String>;

/// The node's places, by pod uid.
#[derive(Debug)]
pub struct Places {
    limits: PlaceLimits,
    /// How long a place never ready is kept once not asked for ([`PENDING_HOLD`]; tests shorten it).
    hold: Duration,
    held: HashMap<String, Place>,
}

impl Places {
    pub fn new(limits: PlaceLimits, hold: Duration) -> Self {
        Places { limits, hold, held: HashMap::new() }
    }

    pub fn limits(&self) -> PlaceLimits {
        self.limits
    }

    /// A publish call for pod `uid` of `namespace` starts at `now`: its
    /// place, kept or taken (making room if it can), and the call counted
    /// until [`Places::call_ended`].
    pub fn call(&mut self, uid: &str, namespace: &str, now: Instant) -> Result<Taken, Refusal> {
        let reclaimed = if self.held.contains_key(uid) { Vec::new() } else { self.take(namespace, now)? };
        let place = self.held.entry(uid.to_string()).or_insert_with(|| Place {
            namespace: namespace.to_string(),
            serving: false,
            calls: 0,
            last_call: now,
        });
        place.calls += 1;
        Ok(reclaimed)
    }

    /// Room for a new pod of `namespace`: the share first, then the node,
    /// taking back the longest idle places that never served if it must.
    fn take(&mut self, namespace: &str, now: Instant) -> Result<Taken, Refusal> {
        let in_namespace = self.held.values().filter(|p| p.namespace == namespace).count();
        if in_namespace >= self.limits.per_namespace {
            let idle = self.idle(now, Some(namespace));
            if idle.is_empty() {
                let (held, max_pods) = (in_namespace, self.limits.max_pods);
                return Err(Refusal::NamespaceShare { namespace: namespace.to_string(), held, max_pods });
            }
            // The namespace's own idle place makes room, within its share.
            return Ok(self.release_all(&idle[..1]));
        }
        if self.held.len() < self.limits.max_pods {
            return Ok(Vec::new());
        }
        match self.idle(now, None).first() {
            Some(uid) => Ok(self.release_all(std::slice::from_ref(uid))),
            None => Err(Refusal::NodeFull { held: self.held.len() }),
        }
    }

    /// Places never serving, without a call under way, last asked for at
    /// least the hold ago (of `namespace` if given), longest idle first.
    fn idle(&self, now: Instant, namespace: Option<&str>) -> Vec<String> {
        let mut idle: Vec<(Instant, &String)> = self
            .held
            .iter()
            .filter(|(_, p)| !p.serving && p.calls == 0 && now.saturating_duration_since(p.last_call) >= self.hold)
            .filter(|(_, p)| namespace.is_none_or(|n| p.namespace == n))
            .map(|(uid, p)| (p.last_call, uid))
            .collect();
        idle.sort();
        idle.into_iter().map(|(_, uid)| uid.clone()).collect()
    }

    fn release_all(&mut self, uids: &[String]) -> Taken {
        for uid in uids {
            self.held.remove(uid);
        }
        uids.to_vec()
    }

    /// A publish call for `uid` ended at `now`; `served`: with a ready tree.
    pub fn call_ended(&mut self, uid: &str, served: bool, now: Instant) {
        if let Some(place) = self.held.get_mut(uid) {
            place.calls = place.calls.saturating_sub(1);
            place.last_call = now;
            place.serving |= served;
        }
    }

    /// The pod gives its place back: unpublished, or nothing to serve.
    pub fn release(&mut self, uid: &str) {
        self.held.remove(uid);
    }

    pub fn holds(&self, uid: &str) -> bool {
        self.held.contains_key(uid)
    }

    /// (serving, pending) places.
    pub fn counts(&self) -> (usize, usize) {
        let serving = self.held.values().filter(|p| p.serving).count();
        (serving, self.held.len() - serving)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places(max_pods: usize, per_namespace: usize) -> Places {
        Places::new(PlaceLimits { max_pods, per_namespace }, PENDING_HOLD)
    }

    /// A pod whose publish call started and ended at `at`, served or not.
    fn asked(p: &mut Places, uid: &str, ns: &str, at: Instant, served: bool) -> Result<Taken, Refusal> {
        let taken = p.call(uid, ns, at)?;
        p.call_ended(uid, served, at);
        Ok(taken)
    }

    #[test]
    fn a_namespace_cannot_take_the_places_other_namespaces_need() {
        let t0 = Instant::now();
        let mut p = places(4, PlaceLimits::default_share(4));
        assert_eq!(PlaceLimits::default_share(4), 2);
        for uid in ["a1", "a2"] {
            asked(&mut p, uid, "tenant-a", t0, true).unwrap();
        }
        let refused = asked(&mut p, "a3", "tenant-a", t0, false).unwrap_err();
        assert_eq!(refused, Refusal::NamespaceShare { namespace: "tenant-a".into(), held: 2, max_pods: 4 });
        assert!(refused.to_string().contains("--max-pods-per-namespace"), "{refused}");
        // Another tenant still finds room, up to the node's cap.
        for uid in ["b1", "b2"] {
            asked(&mut p, uid, "tenant-b", t0, true).unwrap();
        }
        assert_eq!(asked(&mut p, "c1", "tenant-c", t0, false).unwrap_err(), Refusal::NodeFull { held: 4 });
        assert_eq!(p.counts(), (4, 0));
        // A place given back is taken again.
        p.release("a1");
        asked(&mut p, "c1", "tenant-c", t0, true).unwrap();
        assert!(p.holds("c1") && !p.holds("a1"));
    }

    #[test]
    fn a_pod_that_is_asked_for_again_keeps_its_place_and_takes_no_second() {
        let t0 = Instant::now();
        let mut p = places(1, 1);
        asked(&mut p, "a1", "ns", t0, false).unwrap();
        // Its second view, or the kubelet's next call: the same place.
        assert_eq!(asked(&mut p, "a1", "ns", t0 + Duration::from_secs(1), true), Ok(vec![]));
        assert_eq!(p.counts(), (1, 0));
    }

    #[test]
    fn a_place_never_ready_makes_room_once_the_kubelet_stopped_asking_for_it() {
        let t0 = Instant::now();
        let mut p = places(2, 2);
        asked(&mut p, "stuck", "tenant-a", t0, false).unwrap();
        asked(&mut p, "ok", "tenant-a", t0, true).unwrap();
        // Asked for lately: kept.
        let soon = t0 + PENDING_HOLD - Duration::from_secs(1);
        assert_eq!(asked(&mut p, "new", "tenant-b", soon, false), Err(Refusal::NodeFull { held: 2 }));
        // A call under way: kept, however long.
        p.call("stuck", "tenant-a", t0).unwrap();
        let later = t0 + PENDING_HOLD * 4;
        assert_eq!(asked(&mut p, "new", "tenant-b", later, false), Err(Refusal::NodeFull { held: 2 }));
        p.call_ended("stuck", false, t0);
        // Idle long enough: it makes room; the serving one never does.
        assert_eq!(asked(&mut p, "new", "tenant-b", later, false), Ok(vec!["stuck".to_string()]));
        assert!(!p.holds("stuck") && p.holds("ok") && p.holds("new"));
        // The stuck pod's next call waits for a place like any other.
        assert_eq!(asked(&mut p, "stuck", "tenant-a", later, false), Err(Refusal::NodeFull { held: 2 }));
    }

    #[test]
    fn at_its_share_a_namespace_makes_room_only_from_its_own_idle_places() {
        let t0 = Instant::now();
        let mut p = places(4, 2);
        asked(&mut p, "a-stuck", "tenant-a", t0, false).unwrap();
        asked(&mut p, "a-ok", "tenant-a", t0, true).unwrap();
        asked(&mut p, "b-stuck", "tenant-b", t0, false).unwrap();
        let later = t0 + PENDING_HOLD;
        assert_eq!(asked(&mut p, "a-new", "tenant-a", later, true), Ok(vec!["a-stuck".to_string()]));
        assert!(p.holds("b-stuck"), "another tenant's place is not taken for tenant-a");
    }
}
