//! The API layer: get the Pod, watch its claims and the slices of its devices.
//!
//! Round trips are what an init container's start-up time is made of, so the order
//! is fixed: GET the Pod; then, concurrently, list each claim (`metadata.name`) and
//! the node's slices (`spec.nodeName`); only when a device is still not found, list
//! the slices of its driver bound to no single node (`spec.driver=..,spec.nodeName=`).
//! All lists continue as watches, so waiting costs no polling. The Pod itself is
//! only fetched again while a generated claim has not appeared in its status (the
//! shipped RBAC grants `get pods`, not `watch`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::runtime::utils::{Backoff, StreamBackoff};
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
use crate::resolve::{Missing, Resolution, Selection, claim_names, resolve};
use crate::store::{Scope, ScopeEvent, Store};

/// Errors talking to the API server. Only `Failed` is worth retrying.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    #[error(
        "forbidden: the service account may not {verb} {resource}{scope} ({message}); grant it with the Role and ClusterRole of examples/rbac.yaml"
    )]
    Forbidden { verb: &'static str, resource: String, scope: String, message: String },
    #[error(
        "unauthorized: the API server rejected the credentials for {verb} {resource} ({message}); check the service account token or kubeconfig"
    )]
    Unauthorized { verb: &'static str, resource: String, message: String },
    #[error(
        "pod {namespace}/{name} not found; set POD_NAME and POD_NAMESPACE from the downward API (metadata.name, metadata.namespace) or pass --pod-name/--pod-namespace"
    )]
    PodNotFound { namespace: String, name: String },
    #[error("cannot {verb} {resource}{scope}: {message}")]
    Failed { verb: &'static str, resource: String, scope: String, message: String, code: Option<u16> },
}

impl ApiError {
    pub fn is_fatal(&self) -> bool {
        !matches!(self, ApiError::Failed { .. })
    }

    /// The HTTP status the API server answered with, if it answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiError::Forbidden { .. } => Some(403),
            ApiError::Unauthorized { .. } => Some(401),
            ApiError::PodNotFound { .. } => Some(404),
            ApiError::Failed { code, .. } => *code,
        }
    }

    fn is_watch(&self) -> bool {
        matches!(self, ApiError::Failed { verb: "watch", .. } | ApiError::Forbidden { verb: "watch", .. })
    }

    fn classify(err: &kube::Error, verb: &'static str, resource: &str, scope: String) -> Self {
        let resource = resource.to_string();
        match err {
            kube::Error::Api(status) if status.code == 403 => {
                ApiError::Forbidden { verb, resource, scope, message: status.message.clone() }
            }
            kube::Error::Api(status) if status.code == 401 => {
                ApiError::Unauthorized { verb, resource, message: status.message.clone() }
            }
            kube::Error::Api(status) => ApiError::Failed {
                verb,
                resource,
                scope,
                message: format!("HTTP {} {}: {}", status.code, status.reason, status.message),
                code: Some(status.code),
            },
            other => ApiError::Failed { verb, resource, scope, message: error_chain(other), code: None },
        }
    }
}

/// An error and its causes on one line ("connection refused" is usually a cause).
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Why the engine stopped without a result.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("{0}")]
    Permanent(String),
    /// The deadline passed; the strings say what the API layer was still waiting for.
    #[error("timed out")]
    Timeout { waiting_for: Vec<String> },
    #[error("{0}")]
    Output(String),
}

/// Exponential retry delays: 200 ms doubling to 5 s, reset after a success.
#[derive(Debug, Clone)]
pub struct RetryBackoff {
    next: Duration,
}

impl RetryBackoff {
    const FIRST: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(5);
}

impl Default for RetryBackoff {
    fn default() -> Self {
        RetryBackoff { next: Self::FIRST }
    }
}

impl Iterator for RetryBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        Some(now)
    }
}

impl Backoff for RetryBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

enum Update {
    Event(Scope, Box<ScopeEvent>),
    Error(Scope, ApiError),
    /// A watch expired (410 Gone) and relists.
    Expired(Scope),
}

/// Which pod to read.
#[derive(Debug, Clone)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

/// Keeps a [`Store`] current from the API and hands each new resolution to a callback.
pub struct Engine {
    client: Client,
    pod: PodRef,
    selection: Selection,
    store: Store,
    tx: mpsc::UnboundedSender<Update>,
    rx: mpsc::UnboundedReceiver<Update>,
    tasks: Vec<JoinHandle<()>>,
    errors: BTreeMap<String, String>,
    pod_backoff: RetryBackoff,
    pod_fetch_at: Option<Instant>,
    /// Set once the callback said `Ready`.
    serving: bool,
    metrics: Option<Arc<Metrics>>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// What the callback wants after seeing a resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep going; the deadline still applies.
    Continue,
    /// Keep going: what was asked for is there, so the deadline no longer applies
    /// and API errors are no longer fatal (the last good tree keeps being served).
    Ready,
    Stop,
}

impl Engine {
    pub fn new(client: Client, pod: PodRef, selection: Selection) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Engine {
            client,
            pod,
            selection,
            store: Store::default(),
            tx,
            rx,
            tasks: Vec::new(),
            errors: BTreeMap::new(),
            pod_backoff: RetryBackoff::default(),
            pod_fetch_at: Some(Instant::now()),
            serving: false,
            metrics: None,
        }
    }

    /// Count API errors and watch restarts into `metrics`.
    pub fn with_metrics(mut self, metrics: Option<Arc<Metrics>>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The pod's uid, once fetched.
    pub fn pod_uid(&self) -> Option<String> {
        self.store.pod.as_ref().and_then(|p| p.metadata.uid.clone())
    }

    fn count_error(&self, error: &ApiError) {
        if let Some(m) = &self.metrics {
            m.api_error(error.code());
            if error.is_watch() {
                m.watch_restarted();
            }
        }
    }

    /// Run until the callback says stop, `once` and a full first resolution, a fatal
    /// error, or the deadline. Returns the last resolution handed out.
    pub async fn run<F>(
        &mut self,
        mut deadline: Option<Instant>,
        once: bool,
        mut on_change: F,
    ) -> Result<Resolution, EngineError>
    where
        F: FnMut(&Resolution) -> Result<Flow, EngineError>,
    {
        let mut last: Option<Resolution> = None;
        loop {
            if self.pod_fetch_at.is_some_and(|at| at <= Instant::now()) {
                self.fetch_pod().await?;
            }
            if self.store.pod.is_some() && self.store.unsynced().is_empty() {
                let res = resolve(&self.store.snapshot(), &self.selection);
                if let Some(permanent) = res.missing.iter().find(|m| m.is_permanent()) {
                    return Err(EngineError::Permanent(permanent.to_string()));
                }
                let new_drivers: Vec<Scope> = res
                    .drivers_with_unpublished_devices()
                    .into_iter()
                    .map(Scope::DriverSlices)
                    .filter(|s| !self.store.has_scope(s))
                    .collect();
                if new_drivers.is_empty() {
                    if last.as_ref() != Some(&res) {
                        for w in &res.warnings {
                            if !last.as_ref().is_some_and(|l| l.warnings.contains(w)) {
                                warn!("{w}");
                            }
                        }
                        let flow = on_change(&res)?;
                        last = Some(res.clone());
                        match flow {
                            Flow::Stop => return Ok(res),
                            Flow::Ready => {
                                self.serving = true;
                                deadline = None;
                            }
                            Flow::Continue => {}
                        }
                    }
                    if once {
                        return Ok(res);
                    }
                    if self.pod_fetch_at.is_none() && needs_pod_refresh(&res) {
                        self.pod_fetch_at = Some(Instant::now() + self.pod_backoff.next().unwrap_or_default());
                    }
                } else {
                    for scope in new_drivers {
                        info!(%scope, "devices not on the node's slices; watching the driver's slices bound to no single node");
                        self.start_watch(scope);
                    }
                }
            }
            let wake = match (deadline, self.pod_fetch_at) {
                (Some(d), Some(p)) => Some(d.min(p)),
                (d, p) => d.or(p),
            };
            tokio::select! {
                update = self.rx.recv() => {
                    if let Some(update) = update {
                        self.apply(update)?;
                    }
                    while let Ok(update) = self.rx.try_recv() {
                        self.apply(update)?;
                    }
                }
                _ = sleep_until_opt(wake) => {}
            }
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return Err(EngineError::Timeout { waiting_for: self.waiting_for() });
            }
        }
    }

    /// What the API side is still waiting for, with the last error of each.
    fn waiting_for(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.store.pod.is_none() {
            let error = self.errors.get("pod").map(|e| format!(": {e}")).unwrap_or_default();
            out.push(format!("pod {}/{} not fetched yet{error}", self.pod.namespace, self.pod.name));
        }
        for scope in self.store.unsynced() {
            let key = scope.to_string();
            let error = self.errors.get(&key).map(|e| format!(": {e}")).unwrap_or_default();
            out.push(format!("{key} not listed yet{error}"));
        }
        out
    }

    fn apply(&mut self, update: Update) -> Result<(), EngineError> {
        match update {
            Update::Event(scope, event) => {
                self.errors.remove(&scope.to_string());
                self.store.apply(&scope, *event);
            }
            Update::Expired(scope) => {
                debug!(%scope, "watch expired (410 Gone); relisting");
                if let Some(m) = &self.metrics {
                    m.watch_restarted();
                }
            }
            Update::Error(scope, error) => {
                self.count_error(&error);
                if error.is_fatal() && !self.serving {
                    return Err(error.into());
                }
                let text = error.to_string();
                if self.errors.get(&scope.to_string()) != Some(&text) {
                    warn!(%scope, "{text}; retrying");
                }
                self.errors.insert(scope.to_string(), text);
            }
        }
        Ok(())
    }

    async fn fetch_pod(&mut self) -> Result<(), EngineError> {
        self.pod_fetch_at = None;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.pod.namespace);
        match api.get(&self.pod.name).await {
            Ok(pod) => {
                debug!(pod = %self.pod.name, "fetched pod");
                self.errors.remove("pod");
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty());
                let claims: BTreeSet<String> = claim_names(&pod, &self.selection).into_iter().collect();
                self.store.pod = Some(pod);
                for claim in claims {
                    self.start_watch(Scope::Claim(claim));
                }
                if let Some(node) = node {
                    self.start_watch(Scope::NodeSlices(node));
                }
            }
            Err(kube::Error::Api(status)) if status.code == 404 && !self.serving => {
                return Err(ApiError::PodNotFound {
                    namespace: self.pod.namespace.clone(),
                    name: self.pod.name.clone(),
                }
                .into());
            }
            Err(e) => {
                let error =
                    ApiError::classify(&e, "get", "pods", format!(" ({}/{})", self.pod.namespace, self.pod.name));
                self.count_error(&error);
                if error.is_fatal() && !self.serving {
                    return Err(error.into());
                }
                let text = error.to_string();
                if self.errors.get("pod") != Some(&text) {
                    warn!("{text}; retrying");
                }
                self.errors.insert("pod".into(), text);
                self.pod_fetch_at = Some(Instant::now() + self.pod_backoff.next().unwrap_or_default());
            }
        }
        Ok(())
    }

    fn start_watch(&mut self, scope: Scope) {
        if self.store.has_scope(&scope) {
            return;
        }
        self.store.add_scope(scope.clone());
        let config = watcher::Config::default().fields(&scope.field_selector());
        let tx = self.tx.clone();
        let task = match &scope {
            Scope::Claim(_) => {
                let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &self.pod.namespace);
                tokio::spawn(forward(watcher(api, config), scope, tx, ScopeEvent::Claim))
            }
            _ => {
                let api: Api<ResourceSlice> = Api::all(self.client.clone());
                tokio::spawn(forward(watcher(api, config), scope, tx, ScopeEvent::Slice))
            }
        };
        self.tasks.push(task);
    }
}

fn needs_pod_refresh(res: &Resolution) -> bool {
    res.missing.iter().any(|m| matches!(m, Missing::ClaimStatusPending { .. } | Missing::NotScheduled))
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Pump one watcher into the engine's channel, with backoff between failures.
async fn forward<K, S>(
    stream: S,
    scope: Scope,
    tx: mpsc::UnboundedSender<Update>,
    wrap: fn(watcher::Event<K>) -> ScopeEvent,
) where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    let mut stream = std::pin::pin!(StreamBackoff::new(stream, RetryBackoff::default()));
    while let Some(item) = stream.next().await {
        let update = match item {
            Ok(event) => Update::Event(scope.clone(), Box::new(wrap(event))),
            Err(e) => {
                let selector = format!(" ({})", scope.field_selector());
                let resource = scope.resource();
                let error = match &e {
                    watcher::Error::WatchError(status) if status.code == 410 => {
                        if tx.send(Update::Expired(scope.clone())).is_err() {
                            return;
                        }
                        continue;
                    }
                    watcher::Error::InitialListFailed(inner) => ApiError::classify(inner, "list", resource, selector),
                    watcher::Error::WatchStartFailed(inner) | watcher::Error::WatchFailed(inner) => {
                        ApiError::classify(inner, "watch", resource, selector)
                    }
                    watcher::Error::WatchError(status) => {
                        ApiError::classify(&kube::Error::Api(status.clone()), "watch", resource, selector)
                    }
                    other => ApiError::Failed {
                        verb: "watch",
                        resource: resource.into(),
                        scope: selector,
                        message: error_chain(other),
                        code: None,
                    },
                };
                Update::Error(scope.clone(), error)
            }
        };
        if tx.send(update).is_err() {
            return;
        }
    }
}
