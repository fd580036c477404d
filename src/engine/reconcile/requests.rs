//! What the reconciler asks of the API server, per scope: the [`Requests`]
//! of each in its store entry (the pod's too: its list is a GET), the lists, gets and watches
//! asked for, the device filter slices are decoded with, and what is still
//! awaited when the deadline comes.

use std::collections::BTreeSet;
use std::time::Duration;

use super::{Action, Reconciler, Step};
use crate::engine::store::{Requests, Scope};
use crate::model::resolve::{Missing, Resolution};
use crate::model::slices::DeviceFilter;
use crate::model::tree::BuiltTree;

impl Reconciler {
    /// What is asked of a scope (the other half of its state, its objects,
    /// is in the same entry of the store).
    pub(super) fn requests(&mut self, scope: &Scope) -> &mut Requests {
        self.store.requests(scope)
    }

    pub(super) fn add_and_list(&mut self, scope: Scope, step: &mut Step) {
        if self.store.has_scope(&scope) {
            return;
        }
        self.store.add_scope(scope.clone());
        self.list(scope, Duration::ZERO, step);
    }

    /// List a scope again from scratch (the pod: get it; its watch resumes
    /// from the answer): a watch of it ends.
    pub(super) fn list(&mut self, scope: Scope, after: Duration, step: &mut Step) {
        let requests = self.requests(&scope);
        requests.watching = false;
        requests.watch_after = None;
        self.ask(scope, after, step);
    }

    /// Ask for a scope's list (the pod: a get) after `after`, unless one is
    /// under way; a watch of it goes on (the answer only renews its version).
    pub(super) fn ask(&mut self, scope: Scope, after: Duration, step: &mut Step) {
        if std::mem::replace(&mut self.requests(&scope).listing, true) {
            return;
        }
        step.actions.push(match scope {
            Scope::Pod(_) => Action::GetPod { after },
            scope => Action::List { scope, after },
        });
    }

    /// Watch a listed scope from its version, unless a list or watch of it is under way.
    pub(super) fn watch(&mut self, scope: &Scope, step: &mut Step) {
        if !self.objects.can_change() || !self.store.is_listed(scope) {
            return;
        }
        let Some(rv) = self.store.resource_version(scope).map(String::from) else { return };
        let requests = self.requests(scope);
        if requests.watching || requests.listing {
            return;
        }
        requests.watching = true;
        let after = requests.watch_after.take().unwrap_or_default();
        step.actions.push(Action::Watch { scope: scope.clone(), resource_version: rv, after });
    }

    pub(super) fn watch_every_scope(&mut self, step: &mut Step) {
        let scopes: Vec<Scope> = self.store.scopes().cloned().collect();
        for scope in scopes {
            self.watch(&scope, step);
        }
    }

    /// `init` waits by watching only the scopes that can bring what is missing.
    pub(super) fn watch_what_is_missing(&mut self, res: &Resolution, built: &BuiltTree, step: &mut Step) {
        // A missing --require path may be a device value or a claim's status.
        let requirement_missing = built.missing.len() > res.missing.len();
        let mut claims: BTreeSet<String> = BTreeSet::new();
        let mut devices = requirement_missing;
        for m in &res.missing {
            match m {
                Missing::ClaimNotFound { claim_name, .. } | Missing::ClaimNotAllocated { claim_name, .. } => {
                    claims.insert(claim_name.clone());
                }
                Missing::Device { .. } => devices = true,
                _ => {}
            }
        }
        let scopes: Vec<Scope> = self
            .store
            .scopes()
            .filter(|s| match s {
                Scope::Claim(name) => requirement_missing || claims.contains(name),
                Scope::NodeSlices(_) | Scope::DriverSlices(_) => devices,
                Scope::Pod(_) => false,
            })
            .cloned()
            .collect();
        for scope in scopes {
            self.watch(&scope, step);
        }
    }

    /// The devices the pod's listed claims are allocated.
    pub(super) fn wanted_devices(&self) -> DeviceFilter {
        DeviceFilter::new(self.store.claims().flat_map(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.devices.as_ref())
                .and_then(|d| d.results.as_ref())
                .into_iter()
                .flatten()
                .map(|r| (r.driver.clone(), r.pool.clone(), r.device.clone()))
        }))
    }

    /// Slice scopes whose last list was decoded without a device in `filter`.
    pub(super) fn decoded_without(&self, filter: &DeviceFilter) -> Vec<Scope> {
        self.store
            .all_requests()
            .filter(|(scope, t)| {
                t.decoded_with.as_ref().is_some_and(|with| !filter.is_subset(with)) && self.store.is_listed(scope)
            })
            .map(|(scope, _)| scope.clone())
            .collect()
    }

    /// Once every claim is listed, the slices can be decoded: tell the engine
    /// which devices to keep, and list again the slices that were decoded
    /// without a device now wanted.
    pub(super) fn update_filter(&mut self, step: &mut Step) {
        let claims_listed = self.store.scopes().filter(|s| !s.is_slices()).all(|s| self.store.is_listed(s));
        if !claims_listed || self.store.pod.is_none() {
            return;
        }
        let wanted = self.wanted_devices();
        if self.filter.as_ref() == Some(&wanted) {
            return;
        }
        self.filter = Some(wanted.clone());
        step.actions.push(Action::Filter(wanted.clone()));
        for scope in self.decoded_without(&wanted) {
            self.list(scope, Duration::ZERO, step);
        }
    }

    /// What the run is still waiting for, with the last error of each, for the timeout message.
    pub fn waiting_for(&self) -> Vec<String> {
        let mut out = Vec::new();
        let error = |scope: &Scope| match self.store.requests_of(scope) {
            Some(Requests { error: Some(e), .. }) => format!(": {e}"),
            Some(Requests { listing: true, .. }) => ": no answer from the API server yet".into(),
            _ => String::new(),
        };
        if self.store.pod.is_none() {
            let pod = format!("pod {}/{}", self.pod_ref.namespace, self.pod_ref.name);
            out.push(format!("{pod} not fetched yet{}", error(&self.pod_scope())));
        }
        for scope in self.store.unlisted() {
            out.push(format!("{scope} not listed yet{}", error(&scope)));
        }
        if out.is_empty() {
            out.extend(self.last_missing.iter().cloned());
        }
        if out.is_empty() {
            out.push("no resolution yet".into());
        }
        out
    }
}
