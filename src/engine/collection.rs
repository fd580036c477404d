//! A list and a watch of one collection of the API server, each object handed
//! over as the JSON the server sent: the process-wide followers (the node's
//! slices, shared by every run; the node's pods, watched by the node agent)
//! keep or look at what they need of it, and decode nothing else.
//!
//! A follower lists, then watches from the list's version, resuming each
//! watch the server closes. What it does after each request is
//! [`FollowState`]'s (pure): the runs' rule, so that a failing API server or
//! a proxy that cuts watches sees every node back off as it sees every pod
//! back off: quick retries until the first list, then [`WatchBackoff`] for
//! any trouble (a failed list or watch, 410 Gone, a watch closed early
//! without a change), reset only by two minutes without any.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{AsyncBufReadExt, StreamExt};
use kube::Client;
use kube::api::{ListParams, WatchParams};
use kube::core::Request;
use tracing::{debug, warn};

use crate::engine::api::{ApiError, WATCH_IDLE, WATCH_SECONDS_MAX, WATCH_SECONDS_MIN, object_meta};
use crate::model::backoff::{RetryBackoff, WatchBackoff, cut_short, seed_of, watch_timeout};
use crate::model::slices::{RawEvent, RawList};
use crate::publish::call::{REQUEST_TIMEOUT, bounded};

/// A collection and the field selector that narrows it (what errors name).
#[derive(Debug, Clone)]
pub struct Collection {
    /// The collection's path (`/apis/resource.k8s.io/v1/resourceslices`).
    pub url: &'static str,
    /// Its resource, as RBAC names it (`resourceslices`).
    pub resource: &'static str,
    pub field_selector: String,
    /// Only the objects with these labels ("" for all).
    pub label_selector: String,
}

/// One change a watch reported.
pub enum WatchChange<'a> {
    /// Added or modified: the object's JSON.
    Put(&'a str),
    Deleted(&'a str),
}

/// How a watch ended without failing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Watched {
    /// The server closed it: the last version seen, and the changes it reported.
    Closed { last: String, changes: usize },
    /// 410 Gone: the version is too old, list again.
    Expired,
}

impl Collection {
    fn failed(&self, verb: &'static str, message: String) -> ApiError {
        ApiError::Failed {
            verb,
            resource: self.resource.into(),
            scope: format!(" ({})", self.field_selector),
            message,
            code: None,
        }
    }

    /// Every object, page by page, each handed to `each` (an `Err` from it
    /// ends the list as malformed); the list's resource version.
    pub async fn list(
        &self,
        client: &Client,
        page_size: u32,
        mut each: impl FnMut(&str) -> Result<(), String>,
    ) -> Result<String, ApiError> {
        let mut continue_token = None;
        loop {
            let params = ListParams {
                field_selector: Some(self.field_selector.clone()).filter(|s| !s.is_empty()),
                label_selector: Some(self.label_selector.clone()).filter(|s| !s.is_empty()),
                limit: Some(page_size),
                continue_token: continue_token.take(),
                ..Default::default()
            };
            let request = Request::new(self.url).list(&params).map_err(|e| self.failed("list", e.to_string()))?;
            let body = bounded(REQUEST_TIMEOUT, client.request_text(request))
                .await
                .map_err(|e| ApiError::named(e, "list", self.resource, format!(" ({})", self.field_selector)))?;
            let page: RawList =
                serde_json::from_str(&body).map_err(|e| self.failed("list", format!("malformed: {e}")))?;
            for raw in page.items {
                each(raw.get()).map_err(|e| self.failed("list", e))?;
            }
            continue_token = page.metadata.continue_token.filter(|t| !t.is_empty());
            if continue_token.is_none() {
                return Ok(page.metadata.resource_version.unwrap_or_default());
            }
        }
    }

    /// One watch from `resource_version` (bookmarks asked for), each change
    /// handed to `each`, until the server closes it or it expires.
    pub async fn watch(
        &self,
        client: &Client,
        resource_version: &str,
        seconds: u32,
        mut each: impl FnMut(WatchChange<'_>) -> Result<(), String>,
    ) -> Result<Watched, ApiError> {
        let params = WatchParams {
            field_selector: Some(self.field_selector.clone()).filter(|s| !s.is_empty()),
            label_selector: Some(self.label_selector.clone()).filter(|s| !s.is_empty()),
            timeout: Some(seconds),
            bookmarks: true,
            ..Default::default()
        };
        let request =
            Request::new(self.url).watch(&params, resource_version).map_err(|e| self.failed("watch", e.to_string()))?;
        let stream = bounded(REQUEST_TIMEOUT, client.request_stream(request))
            .await
            .map_err(|e| ApiError::named(e, "watch", self.resource, format!(" ({})", self.field_selector)))?;
        let mut lines = std::pin::pin!(stream.lines());
        let mut last = resource_version.to_string();
        let mut changes = 0;
        loop {
            let line = match tokio::time::timeout(WATCH_IDLE, lines.next()).await {
                Err(_) => return Err(self.failed("watch", "silent too long".into())),
                Ok(None) => return Ok(Watched::Closed { last, changes }),
                Ok(Some(Err(e))) => return Err(self.failed("watch", e.to_string())),
                Ok(Some(Ok(line))) if line.trim().is_empty() => continue,
                Ok(Some(Ok(line))) => line,
            };
            let event: RawEvent =
                serde_json::from_str(&line).map_err(|e| self.failed("watch", format!("malformed: {e}")))?;
            let object = event.object.get();
            let change = match event.kind.as_str() {
                "ADDED" | "MODIFIED" => Some(WatchChange::Put(object)),
                "DELETED" => Some(WatchChange::Deleted(object)),
                "ERROR" => return self.watch_error(object),
                _ => None,
            };
            if let Some(change) = change {
                changes += 1;
                each(change).map_err(|e| self.failed("watch", e))?;
            }
            if let Some(rv) = object_meta(object).and_then(|(_, rv)| rv) {
                last = rv;
            }
        }
    }

    /// An `ERROR` event: 410 Gone expires the version; any other status is a failure.
    fn watch_error(&self, object: &str) -> Result<Watched, ApiError> {
        match serde_json::from_str::<kube::core::Status>(object) {
            Ok(status) if status.code == 410 => Ok(Watched::Expired),
            Ok(status) => Err(self.failed("watch", format!("{} ({})", status.message, status.code))),
            Err(e) => Err(self.failed("watch", format!("malformed error event: {e}"))),
        }
    }

    /// List and watch the collection for as long as the future is polled,
    /// under [`FollowState`]'s backoff; `on` is told what is seen, `health`
    /// counts the trouble, and the log says each time how long it waits.
    pub async fn follow(
        &self,
        client: &Client,
        page_size: u32,
        health: &FollowHealth,
        mut on: impl FnMut(Followed<'_>) -> Result<(), String>,
    ) {
        let mut state = FollowState::new(seed_of(&format!("{} {}", self.resource, self.field_selector)));
        let mut next = Next { request: Ask::List, after: Duration::ZERO, trouble: None };
        loop {
            health.waiting(next.after);
            if !next.after.is_zero() {
                tokio::time::sleep(next.after).await;
                health.waiting(Duration::ZERO);
            }
            let outcome = match next.request {
                Ask::List => {
                    let listed = self.list(client, page_size, |raw| on(Followed::Listing(raw))).await;
                    match listed {
                        Ok(resource_version) => match on(Followed::Listed) {
                            Ok(()) => Outcome::Listed { resource_version },
                            Err(e) => Outcome::ListFailed(self.failed("list", e)),
                        },
                        Err(error) => Outcome::ListFailed(error),
                    }
                }
                Ask::Watch { from, seconds } => {
                    let started = Instant::now();
                    match self.watch(client, &from, seconds, |change| on(Followed::Changed(change))).await {
                        Ok(Watched::Closed { last, changes }) => {
                            Outcome::WatchClosed { last, lasted: started.elapsed(), changes }
                        }
                        Ok(Watched::Expired) => Outcome::WatchExpired,
                        Err(error) => Outcome::WatchFailed(error),
                    }
                }
            };
            health.outcome(&outcome);
            if let Outcome::ListFailed(error) | Outcome::WatchFailed(error) = &outcome {
                let _ = on(Followed::Failing(error));
            }
            let what = format!("{} ({})", self.resource, self.field_selector);
            next = state.next(Instant::now(), &outcome);
            if let Some(trouble) = next.trouble {
                health.trouble(trouble);
                let said = match &outcome {
                    Outcome::ListFailed(e) | Outcome::WatchFailed(e) => e.to_string(),
                    Outcome::WatchExpired => "the watch expired (410 Gone)".into(),
                    Outcome::WatchClosed { lasted, .. } => {
                        format!("the server closed the watch after {:.1} s without a change", lasted.as_secs_f64())
                    }
                    Outcome::Listed { .. } => String::new(),
                };
                let again = if matches!(next.request, Ask::List) { "listing again" } else { "watching again" };
                warn!(watch = %what, reason = trouble.name(), "{said}; {again} in {:.1} s", next.after.as_secs_f64());
            } else if let Outcome::Listed { .. } = outcome {
                debug!(watch = %what, "listed; watching");
            }
        }
    }
}

/// What a follower is told.
pub enum Followed<'a> {
    /// An object of a list under way (a list starts afresh: what the last one
    /// gave is replaced by this one's objects once it is [`Followed::Listed`]).
    Listing(&'a str),
    /// The list is complete.
    Listed,
    /// A watch's change.
    Changed(WatchChange<'a>),
    /// A list or watch failed (the follower retries after a delay).
    Failing(&'a ApiError),
}

/// How a request of a follower ended.
#[derive(Debug)]
pub enum Outcome {
    Listed { resource_version: String },
    ListFailed(ApiError),
    WatchClosed { last: String, lasted: Duration, changes: usize },
    WatchExpired,
    WatchFailed(ApiError),
}

/// Why a follower waits before its next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trouble {
    ListFailed,
    WatchFailed,
    /// 410 Gone.
    Expired,
    /// Closed early without a change ([`cut_short`]).
    CutShort,
}

impl Trouble {
    pub const ALL: [Trouble; 4] = [Trouble::ListFailed, Trouble::WatchFailed, Trouble::Expired, Trouble::CutShort];

    /// Its name in the log and the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Trouble::ListFailed => "list_failed",
            Trouble::WatchFailed => "watch_failed",
            Trouble::Expired => "expired",
            Trouble::CutShort => "cut_short",
        }
    }
}

/// The request a follower makes next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    List,
    Watch { from: String, seconds: u32 },
}

/// What a follower does next, after how long, and for which trouble.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Next {
    pub request: Ask,
    pub after: Duration,
    pub trouble: Option<Trouble>,
}

/// Where a follower stands: a plain value fed how each request ended with
/// the time it ended, which says what to ask next and when.
#[derive(Debug, Clone)]
pub struct FollowState {
    /// Until the first list succeeds: quick retries (what waits for it
    /// waits for a pod's start).
    startup: Option<RetryBackoff>,
    trouble: WatchBackoff,
    seed: u64,
    watches: u64,
}

impl FollowState {
    pub fn new(seed: u64) -> Self {
        FollowState { startup: Some(RetryBackoff::default()), trouble: WatchBackoff::new(seed), seed, watches: 0 }
    }

    /// The next request after `outcome`, which ended at `now`.
    pub fn next(&mut self, now: Instant, outcome: &Outcome) -> Next {
        let (request, trouble) = match outcome {
            Outcome::Listed { resource_version } => {
                self.startup = None;
                (self.watch_from(resource_version.clone()), None)
            }
            Outcome::ListFailed(_) => (Ask::List, Some(Trouble::ListFailed)),
            Outcome::WatchFailed(_) => (Ask::List, Some(Trouble::WatchFailed)),
            Outcome::WatchExpired => (Ask::List, Some(Trouble::Expired)),
            Outcome::WatchClosed { last, lasted, changes } => {
                (self.watch_from(last.clone()), cut_short(*lasted, *changes).then_some(Trouble::CutShort))
            }
        };
        let after = match (trouble, &mut self.startup) {
            (None, _) => Duration::ZERO,
            (Some(_), Some(startup)) => startup.next().unwrap_or_default(),
            (Some(_), None) => self.trouble.next(now),
        };
        Next { request, after, trouble }
    }

    fn watch_from(&mut self, from: String) -> Ask {
        self.watches += 1;
        Ask::Watch { from, seconds: watch_timeout(self.seed, self.watches, WATCH_SECONDS_MIN, WATCH_SECONDS_MAX) }
    }
}

/// What a follower's trouble has been, for the metrics: restarts by
/// [`Trouble`], and the delay it waits now.
#[derive(Debug, Default)]
pub struct FollowHealth {
    restarts: Mutex<[u64; Trouble::ALL.len()]>,
    waiting_ms: AtomicU64,
    /// Listed, and no list or watch failed since.
    up: AtomicBool,
}

impl FollowHealth {
    fn outcome(&self, outcome: &Outcome) {
        match outcome {
            Outcome::Listed { .. } => self.up.store(true, Ordering::Relaxed),
            Outcome::ListFailed(_) | Outcome::WatchFailed(_) | Outcome::WatchExpired => {
                self.up.store(false, Ordering::Relaxed)
            }
            Outcome::WatchClosed { .. } => {}
        }
    }

    /// Listed, and no list or watch failed since.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// The follower of `resource` in `scope`, as the metrics and readiness read it.
    pub fn report(&self, resource: &'static str, scope: String) -> FollowReport {
        FollowReport { resource, scope, up: self.is_up(), restarts: self.restarts(), backoff: self.backoff() }
    }

    fn trouble(&self, trouble: Trouble) {
        let i = Trouble::ALL.iter().position(|t| *t == trouble).unwrap_or_default();
        self.restarts.lock().unwrap_or_else(|e| e.into_inner())[i] += 1;
    }

    fn waiting(&self, after: Duration) {
        self.waiting_ms.store(after.as_millis() as u64, Ordering::Relaxed);
    }

    /// Restarts so far, by trouble.
    pub fn restarts(&self) -> Vec<(Trouble, u64)> {
        let counts = *self.restarts.lock().unwrap_or_else(|e| e.into_inner());
        Trouble::ALL.into_iter().zip(counts).collect()
    }

    /// The delay being waited now before the next request (zero while none).
    pub fn backoff(&self) -> Duration {
        Duration::from_millis(self.waiting_ms.load(Ordering::Relaxed))
    }
}

/// A follower's state now: what the node agent's metrics and readiness show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowReport {
    /// The resource, as RBAC names it.
    pub resource: &'static str,
    /// The field selector.
    pub scope: String,
    /// Listed, and no list or watch failed since.
    pub up: bool,
    /// Restarts by trouble.
    pub restarts: Vec<(Trouble, u64)>,
    /// The delay waited now before the next request.
    pub backoff: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closed(lasted_s: u64, changes: usize) -> Outcome {
        Outcome::WatchClosed { last: "9".into(), lasted: Duration::from_secs(lasted_s), changes }
    }

    fn failed() -> ApiError {
        ApiError::Failed {
            verb: "watch",
            resource: "pods".into(),
            scope: String::new(),
            message: "500".into(),
            code: None,
        }
    }

    /// Run `outcomes` through a follower from `t0`, each ending when the last delay did.
    fn delays(state: &mut FollowState, t0: Instant, outcomes: Vec<Outcome>) -> Vec<(Duration, Option<Trouble>)> {
        let mut now = t0;
        outcomes
            .iter()
            .map(|o| {
                let next = state.next(now, o);
                now += next.after;
                (next.after, next.trouble)
            })
            .collect()
    }

    #[test]
    fn a_watch_the_server_closes_at_once_is_resumed_only_after_a_growing_delay() {
        let mut state = FollowState::new(1);
        let t0 = Instant::now();
        let listed = state.next(t0, &Outcome::Listed { resource_version: "5".into() });
        assert!(
            matches!(listed.request, Ask::Watch { ref from, seconds } if from == "5" && (300..600).contains(&seconds))
        );
        assert_eq!(listed.after, Duration::ZERO);
        let got = delays(&mut state, t0, (0..6).map(|_| closed(0, 0)).collect());
        assert!(got.iter().all(|(_, t)| *t == Some(Trouble::CutShort)), "{got:?}");
        assert!(got[0].0 >= WatchBackoff::INITIAL, "{got:?}");
        assert!(got.windows(2).all(|w| w[1].0 >= w[0].0 || w[1].0 >= Duration::from_secs(20)), "grows: {got:?}");
        assert!(got.iter().all(|(d, _)| *d <= WatchBackoff::CAP), "bounded: {got:?}");
        // Closed after its time, or with changes: resumed at once.
        assert_eq!(state.next(t0, &closed(400, 0)).after, Duration::ZERO);
        assert_eq!(state.next(t0, &closed(1, 3)).after, Duration::ZERO);
    }

    #[test]
    fn expiry_and_failures_list_again_after_the_trouble_delay_which_a_list_does_not_reset() {
        let mut state = FollowState::new(2);
        let t0 = Instant::now();
        state.next(t0, &Outcome::Listed { resource_version: "5".into() });
        // 410 then a list that succeeds then 410 again: the delay still grows.
        let got = delays(
            &mut state,
            t0,
            vec![
                Outcome::WatchExpired,
                Outcome::Listed { resource_version: "6".into() },
                Outcome::WatchExpired,
                Outcome::Listed { resource_version: "7".into() },
                Outcome::WatchFailed(failed()),
            ],
        );
        assert_eq!(got[0].1, Some(Trouble::Expired));
        assert_eq!(got[1], (Duration::ZERO, None));
        assert!(got[2].0 >= Duration::from_secs(2), "the second expiry waits longer: {got:?}");
        assert!(got[4].0 >= Duration::from_secs(4) && got[4].1 == Some(Trouble::WatchFailed), "{got:?}");
        assert_eq!(state.next(t0, &Outcome::WatchExpired).request, Ask::List);
    }

    #[test]
    fn before_the_first_list_failures_retry_quickly() {
        let mut state = FollowState::new(3);
        let got = delays(&mut state, Instant::now(), (0..3).map(|_| Outcome::ListFailed(failed())).collect());
        assert_eq!(
            got.iter().map(|(d, _)| d.as_millis()).collect::<Vec<_>>(),
            [200, 400, 800],
            "start-up retries: {got:?}"
        );
        assert!(got.iter().all(|(_, t)| *t == Some(Trouble::ListFailed)));
    }

    #[test]
    fn health_counts_restarts_by_trouble() {
        let health = FollowHealth::default();
        health.trouble(Trouble::CutShort);
        health.trouble(Trouble::CutShort);
        health.trouble(Trouble::Expired);
        health.waiting(Duration::from_millis(1500));
        let restarts = health.restarts();
        assert!(restarts.contains(&(Trouble::CutShort, 2)) && restarts.contains(&(Trouble::Expired, 1)));
        assert_eq!(health.backoff(), Duration::from_millis(1500));
    }
}
