//! What the node agent counts, and how it says whether it is ready: the
//! counters are atomics the CSI calls update; the rest (volumes, failing
//! runs, the slice watch, tmpfs use, the sockets) is read when asked, as a
//! [`Census`], so nothing is kept twice.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::engine::collection::FollowReport;
use crate::node::grpc::Code;
use crate::publish::prometheus::{Kind, Text};

/// Upper bounds of the publish latency histogram, in seconds (a publish
/// answers in milliseconds once the tree is written; 20 s is its longest wait).
const LATENCY_BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 20.0];

/// A latency histogram: cumulative counts per bucket of [`LATENCY_BUCKETS`],
/// the sum and the count.
#[derive(Debug, Default, Clone, Copy)]
pub struct Latency {
    buckets: [u64; LATENCY_BUCKETS.len()],
    sum_us: u64,
    count: u64,
}

impl Latency {
    pub fn observe(&mut self, took: Duration) {
        let seconds = took.as_secs_f64();
        for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                self.buckets[i] += 1;
            }
        }
        self.sum_us += took.as_micros() as u64;
        self.count += 1;
    }

    pub fn render(&self, out: &mut Text, name: &str, help: &str) {
        out.histogram(name, help, &LATENCY_BUCKETS, &self.buckets, self.count, self.sum_us as f64 / 1e6);
    }
}

/// The agent's counters.
#[derive(Debug, Default)]
pub struct NodeMetrics {
    publishes: Mutex<BTreeMap<&'static str, u64>>,
    unpublishes: Mutex<BTreeMap<&'static str, u64>>,
    latency: Mutex<Latency>,
    volumes: AtomicU64,
    pods: AtomicU64,
    /// Device-status changes of served pods the node's pod watch passed on.
    status_changes: AtomicU64,
    /// Places held: (serving, pending).
    places: Mutex<(usize, usize)>,
    /// Pods refused a place, by reason (node_full, namespace_share).
    refused: Mutex<BTreeMap<&'static str, u64>>,
    /// Places never ready taken back for another pod.
    reclaimed: AtomicU64,
    registered: AtomicBool,
    registration_error: Mutex<Option<String>>,
}

/// What the agent is serving now, read when the metrics or the readiness are asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Census {
    pub max_pods: usize,
    /// Volumes whose run has failed (the pod waits, or reads a tree no longer live).
    pub failing_runs: usize,
    /// Bytes used in the volumes' tmpfs mounts.
    pub tmpfs_bytes: u64,
    /// The agent's own watches: the shared slice scopes, the node's pods.
    pub watches: Vec<FollowReport>,
    /// Why a socket is not the agent's (missing, or another agent's), if one is not.
    pub sockets: Option<String>,
}

pub fn code_name(code: Option<Code>) -> &'static str {
    match code {
        None => "OK",
        Some(Code::Ok) => "OK",
        Some(Code::InvalidArgument) => "InvalidArgument",
        Some(Code::DeadlineExceeded) => "DeadlineExceeded",
        Some(Code::NotFound) => "NotFound",
        Some(Code::AlreadyExists) => "AlreadyExists",
        Some(Code::ResourceExhausted) => "ResourceExhausted",
        Some(Code::FailedPrecondition) => "FailedPrecondition",
        Some(Code::Unimplemented) => "Unimplemented",
        Some(Code::Internal) => "Internal",
        Some(Code::Unavailable) => "Unavailable",
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl NodeMetrics {
    /// A publish answered with `code` (None: OK) after `took`.
    pub fn published(&self, code: Option<Code>, took: Duration) {
        *lock(&self.publishes).entry(code_name(code)).or_default() += 1;
        lock(&self.latency).observe(took);
    }

    pub fn unpublished(&self, code: Option<Code>) {
        *lock(&self.unpublishes).entry(code_name(code)).or_default() += 1;
    }

    /// The volumes served, and the pods they belong to (a pod has at most
    /// one of each view).
    pub fn served(&self, volumes: usize, pods: usize) {
        self.volumes.store(volumes as u64, Ordering::Relaxed);
        self.pods.store(pods as u64, Ordering::Relaxed);
    }

    /// The places held now: (serving, pending).
    pub fn places(&self, counts: (usize, usize)) {
        *lock(&self.places) = counts;
    }

    /// A pod was refused a place for `reason`.
    pub fn refused(&self, reason: &'static str) {
        *lock(&self.refused).entry(reason).or_default() += 1;
    }

    /// Places that were never ready were taken back for another pod.
    pub fn reclaimed(&self, n: usize) {
        self.reclaimed.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A served pod's device status changed (`--watch-node-pods`): its volumes read it again.
    pub fn status_changed(&self) {
        self.status_changes.fetch_add(1, Ordering::Relaxed);
    }

    /// The kubelet's answer to the registration.
    pub fn registration(&self, registered: bool, error: &str) {
        self.registered.store(registered, Ordering::Relaxed);
        *lock(&self.registration_error) = (!registered).then(|| error.to_string());
    }

    /// The registration socket was made again: the kubelet registers the
    /// agent anew through it, and until it confirms, the agent is not ready.
    pub fn registration_pending(&self) {
        self.registered.store(false, Ordering::Relaxed);
        *lock(&self.registration_error) = None;
    }

    /// None while ready: registered by the kubelet, both sockets the agent's.
    pub fn unready_reason(&self, census: &Census) -> Option<String> {
        if let Some(sockets) = &census.sockets {
            return Some(sockets.clone());
        }
        if !self.registered.load(Ordering::Relaxed) {
            return Some(match &*lock(&self.registration_error) {
                Some(error) => format!("the kubelet refused the registration: {error}"),
                None => "the kubelet has not confirmed the registration yet".into(),
            });
        }
        None
    }

    /// The agent's own watches: up, restarts by reason, the delay waited now.
    fn render_watches(&self, out: &mut Text, watches: &[FollowReport]) {
        let name = "drafs_node_watch_up";
        out.family(name, Kind::Gauge, "1 while the agent's watch of a collection is listed and not failing.");
        for w in watches {
            out.sample(name, &[("resource", w.resource), ("scope", &w.scope)], u8::from(w.up));
        }
        let name = "drafs_node_watch_restarts_total";
        out.family(
            name,
            Kind::Counter,
            "Lists and watches of the agent's own started again after trouble, by reason (list_failed, watch_failed, expired, cut_short), each after a backoff.",
        );
        for w in watches {
            for (trouble, n) in &w.restarts {
                out.sample(name, &[("resource", w.resource), ("scope", &w.scope), ("reason", trouble.name())], n);
            }
        }
        let name = "drafs_node_watch_backoff_seconds";
        out.family(name, Kind::Gauge, "The delay an agent's watch waits now before its next request (0: none).");
        for w in watches {
            let seconds = format!("{:.3}", w.backoff.as_secs_f64());
            out.sample(name, &[("resource", w.resource), ("scope", &w.scope)], seconds);
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self, census: &Census) -> String {
        let mut out = Text::default();
        let calls = |out: &mut Text, name: &str, help: &str, counts: &BTreeMap<&'static str, u64>| {
            out.family(name, Kind::Counter, help);
            for (code, n) in counts {
                out.sample(name, &[("code", code)], n);
            }
        };
        calls(&mut out, "drafs_node_publishes_total", "NodePublishVolume calls by gRPC code.", &lock(&self.publishes));
        calls(
            &mut out,
            "drafs_node_unpublishes_total",
            "NodeUnpublishVolume calls by gRPC code.",
            &lock(&self.unpublishes),
        );
        let latency = *lock(&self.latency);
        latency.render(&mut out, "drafs_node_publish_duration_seconds", "Time from a publish call to its answer.");
        let volumes = self.volumes.load(Ordering::Relaxed);
        out.single(
            "drafs_node_volumes",
            Kind::Gauge,
            "Volumes served (a tree and a standard view per pod at most).",
            volumes,
        );
        let pods = self.pods.load(Ordering::Relaxed);
        out.single("drafs_node_pods", Kind::Gauge, "Pods served.", pods);
        out.single(
            "drafs_node_status_changes_total",
            Kind::Counter,
            "Device-status changes of served pods seen by the node's pod watch (--watch-node-pods) and passed to their volumes.",
            self.status_changes.load(Ordering::Relaxed),
        );
        out.single("drafs_node_max_pods", Kind::Gauge, "Pods the agent serves at most (--max-pods).", census.max_pods);
        let (serving, pending) = *lock(&self.places);
        let name = "drafs_node_places";
        out.family(name, Kind::Gauge, "Places held under --max-pods: serving (a ready tree written) or pending.");
        out.sample(name, &[("state", "serving")], serving);
        out.sample(name, &[("state", "pending")], pending);
        let name = "drafs_node_places_refused_total";
        out.family(
            name,
            Kind::Counter,
            "Publishes refused a place, by reason (node_full: --max-pods; namespace_share: --max-pods-per-namespace).",
        );
        for (reason, n) in lock(&self.refused).iter() {
            out.sample(name, &[("reason", reason)], n);
        }
        out.single(
            "drafs_node_places_reclaimed_total",
            Kind::Counter,
            "Places whose tree was never ready, taken back for another pod when the node was full.",
            self.reclaimed.load(Ordering::Relaxed),
        );
        out.single(
            "drafs_node_failing_runs",
            Kind::Gauge,
            "Volumes whose run has failed (started again at the kubelet's next publish).",
            census.failing_runs,
        );
        out.single(
            "drafs_node_tmpfs_bytes",
            Kind::Gauge,
            "Bytes used in the volumes' tmpfs mounts.",
            census.tmpfs_bytes,
        );
        self.render_watches(&mut out, &census.watches);
        out.single(
            "drafs_node_registered",
            Kind::Gauge,
            "1 once the kubelet has confirmed the registration.",
            u8::from(self.registered.load(Ordering::Relaxed)),
        );
        out.into_text()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::collection::Trouble;

    #[test]
    fn calls_latency_and_state_are_exposed() {
        let m = NodeMetrics::default();
        let census = Census {
            max_pods: 110,
            failing_runs: 2,
            tmpfs_bytes: 8192,
            watches: vec![FollowReport {
                resource: "resourceslices",
                scope: "spec.nodeName=n1".into(),
                up: true,
                restarts: vec![(Trouble::CutShort, 3), (Trouble::Expired, 0)],
                backoff: Duration::from_millis(2500),
            }],
            ..Default::default()
        };
        assert_eq!(m.unready_reason(&census).unwrap(), "the kubelet has not confirmed the registration yet");
        m.registration(false, "version mismatch");
        assert!(m.unready_reason(&census).unwrap().contains("version mismatch"));
        m.registration(true, "");
        assert_eq!(m.unready_reason(&census), None);
        let lost = Census { sockets: Some("the registration socket is gone".into()), ..census.clone() };
        assert_eq!(m.unready_reason(&lost).unwrap(), "the registration socket is gone");

        m.published(None, Duration::from_millis(3));
        m.published(Some(Code::Unavailable), Duration::from_secs(20));
        m.published(Some(Code::ResourceExhausted), Duration::from_micros(40));
        m.unpublished(None);
        m.served(3, 2);
        m.places((2, 1));
        m.refused("namespace_share");
        m.reclaimed(1);
        m.status_changed();
        let text = m.render(&census);
        for line in [
            "drafs_node_publishes_total{code=\"OK\"} 1\n",
            "drafs_node_publishes_total{code=\"Unavailable\"} 1\n",
            "drafs_node_publishes_total{code=\"ResourceExhausted\"} 1\n",
            "drafs_node_unpublishes_total{code=\"OK\"} 1\n",
            "drafs_node_publish_duration_seconds_bucket{le=\"0.005\"} 2\n",
            "drafs_node_publish_duration_seconds_bucket{le=\"20\"} 3\n",
            "drafs_node_publish_duration_seconds_bucket{le=\"+Inf\"} 3\n",
            "drafs_node_publish_duration_seconds_count 3\n",
            "drafs_node_volumes 3\n",
            "drafs_node_pods 2\n",
            "drafs_node_status_changes_total 1\n",
            "drafs_node_max_pods 110\n",
            "drafs_node_places{state=\"serving\"} 2\n",
            "drafs_node_places{state=\"pending\"} 1\n",
            "drafs_node_places_refused_total{reason=\"namespace_share\"} 1\n",
            "drafs_node_places_reclaimed_total 1\n",
            "drafs_node_watch_up{resource=\"resourceslices\",scope=\"spec.nodeName=n1\"} 1\n",
            "drafs_node_watch_restarts_total{resource=\"resourceslices\",scope=\"spec.nodeName=n1\",reason=\"cut_short\"} 3\n",
            "drafs_node_watch_backoff_seconds{resource=\"resourceslices\",scope=\"spec.nodeName=n1\"} 2.500\n",
            "drafs_node_registered 1\n",
            "drafs_node_failing_runs 2\n",
            "drafs_node_tmpfs_bytes 8192\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from:\n{text}");
        }
    }
}
