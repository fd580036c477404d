//! What each input does to the reconciler's state: the pod, a scope's list,
//! a watch event or its end, an error, the deadline.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use super::{Input, Mode, Reconciler, Step};
use crate::engine::EngineError;
use crate::engine::api::ApiError;
use crate::engine::store::{Item, Scope};
use crate::model::backoff::{RetryBackoff, cut_short};
use crate::model::resolve::{Resolution, claim_names};
use crate::model::slices::{self, DeviceFilter};

impl Reconciler {
    /// One input into the state; false when it changed nothing to resolve.
    pub(super) fn apply(&mut self, now: Instant, input: Input, step: &mut Step) -> bool {
        match input {
            Input::Pod(pod) => match self.other_pod(&pod) {
                Some(error) => return self.apply(now, Input::PodFailed(error), step),
                None => self.on_pod(*pod, step),
            },
            Input::PodFailed(error) => {
                let scope = self.pod_scope();
                self.requests(&scope).listing = false;
                if self.fatal(&error, step) {
                    return false;
                }
                self.requests(&scope).error = Some(error.to_string());
                step.warnings.extend(self.warn_once(format!("{error}; retrying")));
                // Start-up waits for the pod: quick retries. Once ready, a refetch
                // (its watch expired) is trouble like any other scope's.
                let after = if self.phase.was_ever_ready() {
                    self.trouble.next(now)
                } else {
                    self.requests(&scope).startup.next().unwrap_or_default()
                };
                self.ask(scope, after, step);
            }
            Input::Listed { scope, items, resource_version, decoded_with } => {
                return self.on_listed(scope, items, resource_version, decoded_with, step);
            }
            Input::Applied { scope, item: Item::Pod(pod) } => {
                // The watched pod: as if fetched, unless it is another one.
                if let Some(error) = self.other_pod(&pod) {
                    return self.on_failed(now, scope, error, step);
                }
                self.on_pod(*pod, step);
            }
            Input::Applied { scope, item } => {
                if let Some(item) = self.admit(&scope, vec![item], step).pop() {
                    self.store.apply(&scope, item);
                }
                self.requests(&scope).error = None;
            }
            Input::Deleted { scope, name, resource_version } => self.store.delete(&scope, &name, resource_version),
            Input::Bookmark { scope, resource_version } => self.store.bookmark(&scope, resource_version),
            Input::WatchEnded { scope, lasted, changes } => {
                let after = cut_short(lasted, changes).then(|| self.trouble.next(now));
                let requests = self.requests(&scope);
                requests.watching = false;
                if after.is_some() {
                    requests.watch_after = after;
                }
            }
            Input::Expired(scope) => {
                self.requests(&scope).watching = false;
                let after = self.trouble.next(now);
                self.list(scope, after, step);
            }
            Input::Failed { scope, error } => return self.on_failed(now, scope, error, step),
            Input::Deadline => {
                // The deadline only bounds the way to the first ready tree.
                if !self.phase.was_ever_ready() {
                    self.finish(Err(EngineError::Timeout { waiting_for: self.waiting_for() }), step);
                    return false;
                }
            }
            Input::Recheck => {}
        }
        true
    }

    /// Defence in depth: the object must be the pod asked for (and, when
    /// known, the very pod: its uid).
    pub(super) fn other_pod(&self, pod: &Pod) -> Option<ApiError> {
        let (name, namespace) = (pod.metadata.name.as_deref(), pod.metadata.namespace.as_deref());
        if name == Some(self.pod_ref.name.as_str()) && namespace.is_none_or(|ns| ns == self.pod_ref.namespace) {
            let found = pod.metadata.uid.as_deref().unwrap_or_default();
            return match &self.expected_uid {
                Some(expected) if expected != found => Some(ApiError::OtherPod {
                    namespace: self.pod_ref.namespace.clone(),
                    name: self.pod_ref.name.clone(),
                    found: found.to_string(),
                    expected: expected.clone(),
                }),
                _ => None,
            };
        }
        Some(ApiError::Failed {
            verb: "get",
            resource: "pods".into(),
            scope: format!(" ({}/{})", self.pod_ref.namespace, self.pod_ref.name),
            message: format!("the server answered with pod {}/{}", namespace.unwrap_or("?"), name.unwrap_or("?")),
            code: None,
        })
    }

    /// A whole list of a scope: it replaces what the store held.
    pub(super) fn on_listed(
        &mut self,
        scope: Scope,
        items: Vec<Item>,
        resource_version: String,
        decoded_with: Option<DeviceFilter>,
        step: &mut Step,
    ) -> bool {
        self.requests(&scope).listing = false;
        if !self.store.has_scope(&scope) {
            return false;
        }
        let items = self.admit(&scope, items, step);
        self.store.replace(&scope, items, resource_version);
        let stale = scope.is_slices() && {
            let with = decoded_with.unwrap_or_default();
            let stale = self.filter.as_ref().is_some_and(|f| !f.is_subset(&with));
            self.requests(&scope).decoded_with = Some(with);
            stale
        };
        let requests = self.requests(&scope);
        requests.error = None;
        requests.startup = RetryBackoff::default();
        if stale {
            // The filter grew while this list was under way.
            self.list(scope, Duration::ZERO, step);
        }
        true
    }

    /// A list or watch of a scope failed: fatal, or retried after a delay.
    pub(super) fn on_failed(&mut self, now: Instant, scope: Scope, error: ApiError, step: &mut Step) -> bool {
        let is_pod = matches!(scope, Scope::Pod(_));
        let requests = self.requests(&scope);
        let was_watch = std::mem::take(&mut requests.watching);
        if !is_pod {
            // The pod's get answers as `Pod` or `PodFailed`: this was its watch.
            requests.listing = false;
        }
        if is_pod && error.is_fatal() {
            // Only health follows the pod's watch: without the permission (RBAC
            // from before it was needed), serve goes on without it.
            self.store.remove_scope(&scope);
            let requests = self.requests(&scope);
            requests.watch_after = None;
            requests.refused = true;
            step.warnings.extend(self.warn_once(format!(
                "{error}: device health will not follow the pod's status; \
                 grant `watch` on pods (drafs manifests rbac) and restart drafs"
            )));
            return false;
        }
        if self.fatal(&error, step) {
            return false;
        }
        step.warnings.extend(self.warn_once(format!("{error}; retrying")));
        self.requests(&scope).error = Some(error.to_string());
        if !self.store.is_listed(&scope) {
            // The first list: retried quickly, start-up is waiting for it.
            let after = self.requests(&scope).startup.next().unwrap_or_default();
            self.list(scope, after, step);
        } else if was_watch && error.is_watch() {
            // What the store holds is still good from its version: watch again, later.
            let after = self.trouble.next(now);
            self.requests(&scope).watch_after = Some(after);
        } else {
            let after = self.trouble.next(now);
            self.list(scope, after, step);
        }
        true
    }

    pub(super) fn on_pod(&mut self, pod: Pod, step: &mut Step) {
        let scope = self.pod_scope();
        // The start-up backoff stays: the pod is fetched again only while its
        // status lacks a generated claim, and an answer that still lacks it
        // must not bring the next request closer.
        let requests = self.requests(&scope);
        requests.listing = false;
        requests.error = None;
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty());
        let claims: BTreeSet<String> = claim_names(&pod, &self.selection).into_iter().collect();
        if self.mode == Mode::Follow {
            // serve watches the pod from the version it was fetched at, for the
            // health the kubelet writes into its status: no request more at start.
            let version = pod.metadata.resource_version.clone().filter(|v| !v.is_empty());
            if let Some(version) = version {
                if self.store.has_scope(&scope) {
                    self.store.bookmark(&scope, version);
                } else if !self.requests(&scope).refused {
                    self.store.add_scope(scope.clone());
                    self.store.replace(&scope, Vec::new(), version);
                }
            }
        }
        self.store.pod = Some(pod);
        for claim in claims {
            self.add_and_list(Scope::Claim(claim), step);
        }
        if let Some(node) = node {
            self.add_and_list(Scope::NodeSlices(node), step);
        }
    }

    /// 401/403/404 end a run that has not been ready yet; afterwards nothing does.
    pub(super) fn fatal(&mut self, error: &ApiError, step: &mut Step) -> bool {
        if error.is_fatal() && !self.phase.was_ever_ready() {
            self.finish(Err(EngineError::Api(error.clone())), step);
            return true;
        }
        false
    }

    pub(super) fn finish(&mut self, result: Result<Resolution, EngineError>, step: &mut Step) {
        self.done = true;
        step.done = Some(result);
    }

    /// Objects that belong to the scope (slices trimmed to the filter); the
    /// rest are reported once and dropped.
    pub(super) fn admit(&mut self, scope: &Scope, items: Vec<Item>, step: &mut Step) -> Vec<Item> {
        let node = self.node();
        let filter = self.filter.clone().unwrap_or_default();
        let mut kept = Vec::with_capacity(items.len());
        for item in items {
            let admitted = match &item {
                Item::Claim(c) => scope.admits_claim(c, &self.pod_ref.namespace),
                Item::Slice(s) => scope.admits_slice(s),
                // The pod is taken in by `apply`, never kept among a scope's objects.
                Item::Pod(_) => false,
            };
            if !admitted {
                let warning = format!(
                    "ignoring {} {:?}: it does not match {scope} (the server ignored the selector?)",
                    scope.resource(),
                    item.name()
                );
                step.warnings.extend(self.warn_once(warning));
                continue;
            }
            match item {
                Item::Slice(s) => {
                    if let Some(s) = slices::trim(*s, &filter, node.as_deref()) {
                        kept.push(Item::Slice(Box::new(s)));
                    }
                }
                claim => kept.push(claim),
            }
        }
        kept
    }

    pub(super) fn node(&self) -> Option<String> {
        self.store
            .pod
            .as_ref()
            .and_then(|p| p.spec.as_ref())
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty())
    }
}
