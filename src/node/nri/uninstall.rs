//! Whether the agent stops for good or to come back.
//!
//! An agent restarted or rolled keeps the trees it served through NRI: the
//! next one takes them back at the runtime's synchronization. An agent whose
//! DaemonSet is uninstalled has no next one: it removes them, so that
//! nothing of drafs stays on the node (running containers keep the last
//! tree they were given, no longer live: their bind mounts hold it). The
//! DaemonSet says which: gone, or being deleted, at the stop. Uninstalling
//! deletes the DaemonSet before its pods, and with it the grant to read it,
//! so a read refused at the stop that was allowed at the start counts as
//! gone; a read that fails otherwise (the API server away) keeps the trees.

use k8s_openapi::api::apps::v1::DaemonSet;
use tracing::{info, warn};

use crate::publish::call::{CallError, bounded};

/// How long the stop waits for the DaemonSet's read.
const READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What a read of the agent's DaemonSet found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// There; `deleting`: with a deletion timestamp.
    Present { deleting: bool },
    /// 404.
    Gone,
    /// 401 or 403.
    Refused,
    /// Anything else: the API server away, slow, or failing.
    Unknown,
}

impl Found {
    fn of(read: Result<DaemonSet, CallError>) -> Found {
        match read {
            Ok(ds) => Found::Present { deleting: ds.metadata.deletion_timestamp.is_some() },
            Err(e) => match e.code() {
                Some(404) => Found::Gone,
                Some(401 | 403) => Found::Refused,
                _ => Found::Unknown,
            },
        }
    }
}

/// Whether a stop is for good, from what the stop's read `found` and
/// whether the start's read was allowed (pure).
pub fn for_good(found: &Found, readable_at_start: bool) -> bool {
    match found {
        Found::Present { deleting } => *deleting,
        Found::Gone => true,
        Found::Refused => readable_at_start,
        Found::Unknown => false,
    }
}

/// The agent's own DaemonSet (`--daemonset`).
pub struct Owner {
    api: kube::Api<DaemonSet>,
    name: String,
    readable_at_start: bool,
}

impl Owner {
    /// Read `namespace/name` once: a grant missing now means a refused read
    /// at the stop says nothing.
    pub async fn start(client: kube::Client, namespace: &str, name: &str) -> Owner {
        let api = kube::Api::namespaced(client, namespace);
        let found = Found::of(read(&api, name).await);
        let readable_at_start = matches!(found, Found::Present { .. });
        if !readable_at_start {
            warn!(daemonset = %format!("{namespace}/{name}"), ?found, "cannot read the agent's DaemonSet: the trees served through NRI stay at every stop, uninstalled or not");
        }
        Owner { api, name: name.to_string(), readable_at_start }
    }

    /// Whether this stop is for good: the DaemonSet is uninstalled.
    pub async fn stopping_for_good(&self) -> bool {
        let found = Found::of(read(&self.api, &self.name).await);
        let good = for_good(&found, self.readable_at_start);
        info!(daemonset = %self.name, ?found, for_good = good, "the agent's DaemonSet at the stop");
        good
    }
}

async fn read(api: &kube::Api<DaemonSet>, name: &str) -> Result<DaemonSet, CallError> {
    bounded(READ_LIMIT, api.get(name)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_daemonset_gone_or_going_is_a_stop_for_good() {
        assert!(!for_good(&Found::Present { deleting: false }, true), "restarted or rolled");
        assert!(for_good(&Found::Present { deleting: true }, true));
        assert!(for_good(&Found::Gone, true));
        assert!(for_good(&Found::Gone, false), "gone is gone");
        assert!(for_good(&Found::Refused, true), "its grant deleted with it");
        assert!(!for_good(&Found::Refused, false), "never readable: says nothing");
        assert!(!for_good(&Found::Unknown, true), "the API server away: keep them");
    }
}
