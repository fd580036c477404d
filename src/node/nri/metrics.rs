//! What the NRI door counts, and whether it is ready: connected to the
//! runtime, registered and synchronized.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::node::grpc::Code;
use crate::node::metrics::{Latency, code_name, lock};
use crate::node::nri::policy::Skip;
use crate::publish::prometheus::{Kind, Text};

/// Where the door stands with the runtime.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Link {
    /// No runtime socket at the path (a runtime without NRI, or not started):
    /// nothing to serve through it, and the agent is ready without it.
    #[default]
    NoSocket,
    /// Connecting, registering, or waiting for the runtime's synchronization.
    Joining(String),
    /// Synchronized: the runtime calls the plugin for every container.
    Serving,
    /// It cannot join: why.
    Failing(String),
}

impl Link {
    /// `{"state": ..., "detail": ...}`, as `/status` says it.
    pub fn to_json(&self) -> serde_json::Value {
        let (state, detail) = match self {
            Link::NoSocket => ("no_socket", None),
            Link::Joining(what) => ("joining", Some(what)),
            Link::Serving => ("serving", None),
            Link::Failing(why) => ("failing", Some(why)),
        };
        serde_json::json!({"state": state, "detail": detail})
    }
}

/// The door's counters.
#[derive(Debug, Default)]
pub struct NriMetrics {
    link: Mutex<Link>,
    /// Times the plugin (re)joined the runtime.
    joins: AtomicU64,
    /// Containers given their mounts.
    adjusted: AtomicU64,
    /// Time to answer a CreateContainer that was given its mounts.
    answered: Mutex<Latency>,
    /// CreateContainer answered with an error, by code.
    refused: Mutex<BTreeMap<&'static str, u64>>,
    /// Containers of opted-in pods left as they are, by reason.
    skipped: Mutex<BTreeMap<&'static str, u64>>,
    synchronized_pods: AtomicU64,
}

impl NriMetrics {
    pub fn link(&self, link: Link) {
        if link == Link::Serving {
            self.joins.fetch_add(1, Ordering::Relaxed);
        }
        *lock(&self.link) = link;
    }

    pub fn current_link(&self) -> Link {
        lock(&self.link).clone()
    }

    pub fn synchronized(&self, pods: usize) {
        self.synchronized_pods.store(pods as u64, Ordering::Relaxed);
    }

    pub fn adjusted(&self, took: Duration) {
        self.adjusted.fetch_add(1, Ordering::Relaxed);
        lock(&self.answered).observe(took);
    }

    pub fn refused(&self, code: Code, _took: Duration) {
        *lock(&self.refused).entry(code_name(Some(code))).or_default() += 1;
    }

    pub fn skipped(&self, skip: Skip) {
        *lock(&self.skipped).entry(skip.name()).or_default() += 1;
    }

    /// None while it serves, or has no runtime socket to serve; why not otherwise.
    pub fn unready_reason(&self) -> Option<String> {
        match &*lock(&self.link) {
            Link::NoSocket | Link::Serving => None,
            Link::Joining(what) => Some(format!("NRI: {what}")),
            Link::Failing(why) => Some(format!("NRI: {why}")),
        }
    }

    pub fn render(&self, out: &mut Text) {
        let link = lock(&self.link).clone();
        let name = "drafs_node_nri_up";
        out.family(name, Kind::Gauge, "1 while the plugin is registered with the runtime and synchronized; the state is a label (no_socket, joining, serving, failing).");
        let state = match link {
            Link::NoSocket => "no_socket",
            Link::Joining(_) => "joining",
            Link::Serving => "serving",
            Link::Failing(_) => "failing",
        };
        out.sample(name, &[("state", state)], u8::from(state == "serving"));
        out.single(
            "drafs_node_nri_joins_total",
            Kind::Counter,
            "Times the plugin registered with the runtime and was synchronized.",
            self.joins.load(Ordering::Relaxed),
        );
        out.single(
            "drafs_node_nri_containers_adjusted_total",
            Kind::Counter,
            "Containers given their tree's mounts.",
            self.adjusted.load(Ordering::Relaxed),
        );
        let answered = *lock(&self.answered);
        answered.render(
            out,
            "drafs_node_nri_create_duration_seconds",
            "Time to answer the creation of a container given its mounts (its wait for its tree included).",
        );
        let name = "drafs_node_nri_containers_refused_total";
        out.family(name, Kind::Counter, "Container creations answered with an error (the kubelet retries), by code: Unavailable (its tree not ready), ResourceExhausted (no place), InvalidArgument (the pod's annotations), FailedPrecondition (its own mount where the tree goes).");
        for (code, n) in lock(&self.refused).iter() {
            out.sample(name, &[("code", code)], n);
        }
        let name = "drafs_node_nri_containers_skipped_total";
        out.family(
            name,
            Kind::Counter,
            "Containers of opted-in pods left as they are, by reason (no_device, has_drafs, occupied).",
        );
        for (reason, n) in lock(&self.skipped).iter() {
            out.sample(name, &[("reason", reason)], n);
        }
        out.single(
            "drafs_node_nri_synchronized_pods",
            Kind::Gauge,
            "Pod sandboxes the runtime listed at the last synchronization.",
            self.synchronized_pods.load(Ordering::Relaxed),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_says_whether_it_is_ready_and_the_counts_are_exposed() {
        let m = NriMetrics::default();
        assert_eq!(m.unready_reason(), None, "no socket: nothing to serve through NRI");
        m.link(Link::Joining("registering".into()));
        assert_eq!(m.unready_reason().as_deref(), Some("NRI: registering"));
        m.link(Link::Serving);
        assert_eq!(m.unready_reason(), None);
        m.adjusted(Duration::from_millis(3));
        m.refused(Code::Unavailable, Duration::from_millis(900));
        m.skipped(Skip::NoDevice);
        let mut out = Text::default();
        m.render(&mut out);
        let text = out.into_text();
        for line in [
            "drafs_node_nri_up{state=\"serving\"} 1\n",
            "drafs_node_nri_joins_total 1\n",
            "drafs_node_nri_containers_adjusted_total 1\n",
            "drafs_node_nri_create_duration_seconds_bucket{le=\"0.005\"} 1\n",
            "drafs_node_nri_containers_refused_total{code=\"Unavailable\"} 1\n",
            "drafs_node_nri_containers_skipped_total{reason=\"no_device\"} 1\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from:\n{text}");
        }
    }
}
