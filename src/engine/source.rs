//! The I/O half: carries out the reconciler's actions against the API server
//! and turns what comes back into its inputs.
//!
//! Every request is bounded in time (a stalled server cannot hold a run past
//! its deadline), lists are paged (`limit` + `continue`) and slices are decoded
//! with the reconciler's device filter (see `slices`), so memory follows the
//! pod's devices and one page, not the node. Watches ask the server to close
//! them after a random 5 to 10 minutes ([`WATCH_SECONDS_MIN`]..[`WATCH_SECONDS_MAX`])
//! and for bookmarks, which the API server sends about once a minute: a
//! watch silent for [`WATCH_IDLE`] is given up as broken, so a connection that
//! died without a word is noticed.
//! The first page of the node's slices is requested together with the claims;
//! it is decoded once the claims say which devices to keep.
//!
//! Results queue for the reconciler in a bounded channel ([`INPUT_QUEUE`]): a
//! burst of watch events waits in the server's stream, not in drafs's memory,
//! and the feed's `next_batch` hands over all that is queued at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{ListParams, WatchParams};
use kube::core::Request;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info};

use crate::engine::PodRef;
use crate::engine::api::{ApiError, WATCH_IDLE, WATCH_SECONDS_MAX, WATCH_SECONDS_MIN, object_meta};
use crate::engine::drive::{Feed, sleep_until_opt};
use crate::engine::reconcile::{Action, Input};
use crate::engine::shared::{SharedSlices, SliceSet};
use crate::engine::store::{Item, Scope};
use crate::model::retained;
use crate::model::slices::{self, DeviceFilter, RawEvent, RawList};
use crate::publish::call::{CallError, REQUEST_TIMEOUT, bounded};
use crate::publish::metrics::Metrics;

/// Objects per list page: a page of slices (at most 128 devices each) is what
/// memory holds at once, so pages are small; more pages only cost round trips.
pub const PAGE_SIZE: u32 = 4;
/// Inputs queued for the reconciler at most; a watch waits while it is full.
pub const INPUT_QUEUE: usize = 16;

/// Runs the actions' requests as tasks and queues their results as inputs.
pub struct ApiFeed {
    client: Client,
    pod: PodRef,
    tx: mpsc::Sender<Input>,
    rx: mpsc::Receiver<Input>,
    tasks: HashMap<Scope, JoinHandle<()>>,
    pod_task: Option<JoinHandle<()>>,
    /// The reconciler asked to look again at a time (a held loss ends).
    recheck_task: Option<JoinHandle<()>>,
    filter: watch::Sender<Option<DeviceFilter>>,
    deadline: Option<Instant>,
    metrics: Option<Arc<Metrics>>,
    page_size: u32,
    watch_idle: Duration,
    /// Seeds each watch's random timeout: this pod and this process.
    watch_seed: u64,
    watches: u64,
    /// Slices from a hub shared with other runs, instead of watches of this run's own.
    shared: Option<Arc<SharedSlices>>,
    /// The last set of each shared scope this run was given (what its changes are counted from).
    seen: Arc<std::sync::Mutex<HashMap<Scope, Arc<SliceSet>>>>,
    /// This run's subscription to each shared scope it reads, held for the
    /// run's life: the hub follows a scope while anyone holds one, so the
    /// moment between a list and the watch after it never stops it.
    subscriptions: HashMap<Scope, watch::Receiver<Arc<SliceSet>>>,
    polling: Option<Polling>,
    /// The pod's watch was parked once (said once in the log).
    parked: bool,
}

/// The pod and its claims asked again when poked, instead of watched, once a
/// time has passed: the node agent serves many pods, and an open watch costs
/// the API server about 80 KiB (docs/node-mode.md).
#[derive(Debug, Clone)]
pub struct Polling {
    /// Changes when the pod and its claims should be asked again.
    pub poke: watch::Receiver<u64>,
    /// Until then, watched as usual (the values a driver reports at prepare come then).
    pub live_until: Instant,
}

impl Drop for ApiFeed {
    fn drop(&mut self) {
        for task in self.tasks.values().chain(self.pod_task.iter()).chain(self.recheck_task.iter()) {
            task.abort();
        }
    }
}

impl ApiFeed {
    pub fn new(client: Client, pod: PodRef, deadline: Option<Instant>) -> Self {
        let (tx, rx) = mpsc::channel(INPUT_QUEUE);
        ApiFeed {
            client,
            tx,
            rx,
            tasks: HashMap::new(),
            pod_task: None,
            recheck_task: None,
            filter: watch::Sender::new(None),
            deadline,
            metrics: None,
            page_size: PAGE_SIZE,
            watch_idle: WATCH_IDLE,
            watch_seed: crate::model::backoff::seed_of(&format!("{}/{}", pod.namespace, pod.name))
                ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64),
            watches: 0,
            shared: None,
            seen: Arc::default(),
            subscriptions: HashMap::new(),
            polling: None,
            parked: false,
            pod,
        }
    }

    /// Take slices from `shared`, the hub of the process, instead of listing and watching them.
    pub fn with_shared_slices(mut self, shared: Arc<SharedSlices>) -> Self {
        self.shared = Some(shared);
        self
    }

    /// Ask for the pod and its claims when poked, once the live period is over.
    pub fn with_polling(mut self, polling: Polling) -> Self {
        self.polling = Some(polling);
        self
    }

    /// Count API errors and watch restarts into `metrics`.
    pub fn with_metrics(mut self, metrics: Option<Arc<Metrics>>) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn with_page_size(mut self, page_size: u32) -> Self {
        self.page_size = page_size.max(1);
        self
    }

    /// How long a watch may stay silent before it is restarted (tests shorten it).
    pub fn with_watch_idle(mut self, idle: Duration) -> Self {
        self.watch_idle = idle;
        self
    }

    /// The run's subscription to a shared scope of slices (None: not shared).
    fn subscription(&mut self, scope: &Scope) -> Option<watch::Receiver<Arc<SliceSet>>> {
        let shared = self.shared.as_ref().filter(|_| scope.is_slices())?;
        Some(self.subscriptions.entry(scope.clone()).or_insert_with(|| shared.subscribe(scope)).clone())
    }

    fn replace_task(&mut self, scope: Scope, task: JoinHandle<()>) {
        if let Some(old) = self.tasks.insert(scope, task) {
            old.abort();
        }
    }

    fn context(&self, scope: Scope) -> ScopeContext {
        ScopeContext {
            client: self.client.clone(),
            namespace: self.pod.namespace.clone(),
            scope,
            tx: self.tx.clone(),
            filter: self.filter.subscribe(),
            deadline: self.deadline,
            metrics: self.metrics.clone(),
            page_size: self.page_size,
            watch_idle: self.watch_idle,
        }
    }

    /// The next input: a result of a request, or `Deadline` when it passes first.
    pub async fn next(&mut self) -> Input {
        let deadline = self.deadline;
        tokio::select! {
            input = self.rx.recv() => input.unwrap_or(Input::Deadline),
            _ = sleep_until_opt(deadline) => Input::Deadline,
        }
    }
}

/// The API server's feed: every action a request (a task), every answer an input.
impl Feed for ApiFeed {
    fn execute(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::GetPod { after } => {
                    if let Some(task) = self.pod_task.take() {
                        task.abort();
                    }
                    let (client, pod, tx, deadline) =
                        (self.client.clone(), self.pod.clone(), self.tx.clone(), self.deadline);
                    self.pod_task = Some(tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        let _ = tx.send(get_pod(&client, &pod, deadline).await).await;
                    }));
                }
                Action::Recheck { after } => {
                    if let Some(task) = self.recheck_task.take() {
                        task.abort();
                    }
                    let tx = self.tx.clone();
                    self.recheck_task = Some(tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        let _ = tx.send(Input::Recheck).await;
                    }));
                }
                Action::List { scope, after } => {
                    let ctx = self.context(scope.clone());
                    let task = match self.subscription(&scope) {
                        Some(sets) => tokio::spawn(shared_list(ctx, sets, self.seen.clone(), after)),
                        None => tokio::spawn(list(ctx, after)),
                    };
                    self.replace_task(scope, task);
                }
                Action::Watch { scope, resource_version, after } => {
                    let ctx = self.context(scope.clone());
                    if let Some(sets) = self.subscription(&scope) {
                        let task = tokio::spawn(shared_watch(ctx, sets, self.seen.clone(), after));
                        self.replace_task(scope, task);
                        continue;
                    }
                    self.watches += 1;
                    let mut seconds = crate::model::backoff::watch_timeout(
                        self.watch_seed,
                        self.watches,
                        WATCH_SECONDS_MIN,
                        WATCH_SECONDS_MAX,
                    );
                    if let Some(polling) = &self.polling {
                        let left = polling.live_until.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            if matches!(scope, Scope::Pod(_)) && !std::mem::replace(&mut self.parked, true) {
                                info!("watch window over: the pod and its claims are read again when poked");
                            }
                            // A poke from now on asks again, even one that comes before the task runs.
                            let seen = *polling.poke.borrow();
                            let poke = polling.poke.clone();
                            let task = tokio::spawn(parked_watch(ctx, resource_version, after, poke, seen));
                            self.replace_task(scope, task);
                            continue;
                        }
                        seconds = seconds.min(u32::try_from(left.as_secs()).unwrap_or(u32::MAX).max(1));
                    }
                    let task = tokio::spawn(watch_scope(ctx, resource_version, after, seconds));
                    self.replace_task(scope, task);
                }
                Action::Filter(filter) => {
                    self.filter.send_replace(Some(filter));
                }
            }
        }
    }

    /// The next input and every one queued behind it (at most [`INPUT_QUEUE`]),
    /// for the reconciler to take in at once.
    async fn next_batch(&mut self) -> Vec<Input> {
        let mut batch = vec![self.next().await];
        while batch.len() < INPUT_QUEUE {
            match self.rx.try_recv() {
                Ok(input) => batch.push(input),
                Err(_) => break,
            }
        }
        batch
    }

    /// The deadline no longer applies (the run was ready once).
    fn clear_deadline(&mut self) {
        self.deadline = None;
    }
}

/// How long a request may take: [`REQUEST_TIMEOUT`], and never past the deadline.
fn request_budget(deadline: Option<Instant>) -> Duration {
    match deadline {
        Some(d) => d.saturating_duration_since(Instant::now()).min(REQUEST_TIMEOUT),
        None => REQUEST_TIMEOUT,
    }
}

async fn get_pod(client: &Client, pod: &PodRef, deadline: Option<Instant>) -> Input {
    let scope = format!(" ({}/{})", pod.namespace, pod.name);
    let url = format!("/api/v1/namespaces/{}/pods", pod.namespace);
    let request = match Request::new(url).get(&pod.name, &Default::default()) {
        Ok(r) => r,
        Err(e) => {
            let message = e.to_string();
            return Input::PodFailed(ApiError::Failed {
                verb: "get",
                resource: "pods".into(),
                scope,
                message,
                code: None,
            });
        }
    };
    let budget = request_budget(deadline);
    match bounded(budget, client.request::<Pod>(request)).await {
        Ok(p) => {
            debug!(pod = %pod.name, "fetched pod");
            // Only what resolution reads, as from a list or a watch: a pod's
            // annotations or commands must not cost a run (the node agent's runs) its memory.
            Input::Pod(Box::new(retained::pod(p)))
        }
        Err(e) if e.code() == Some(404) => {
            Input::PodFailed(ApiError::PodNotFound { namespace: pod.namespace.clone(), name: pod.name.clone() })
        }
        Err(e) => Input::PodFailed(ApiError::named(e, "get", "pods", scope)),
    }
}

/// What a list or watch task needs.
struct ScopeContext {
    client: Client,
    namespace: String,
    scope: Scope,
    tx: mpsc::Sender<Input>,
    filter: watch::Receiver<Option<DeviceFilter>>,
    deadline: Option<Instant>,
    metrics: Option<Arc<Metrics>>,
    page_size: u32,
    watch_idle: Duration,
}

impl ScopeContext {
    fn url(&self) -> String {
        match &self.scope {
            Scope::Claim(_) => format!("/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims", self.namespace),
            Scope::Pod(_) => format!("/api/v1/namespaces/{}/pods", self.namespace),
            Scope::NodeSlices(_) | Scope::DriverSlices(_) => "/apis/resource.k8s.io/v1/resourceslices".to_string(),
        }
    }

    async fn fail(&self, error: ApiError) {
        if let Some(m) = &self.metrics {
            m.api_error(error.code());
            if error.is_watch() {
                m.watch_restarted();
            }
        }
        let _ = self.tx.send(Input::Failed { scope: self.scope.clone(), error }).await;
    }

    fn malformed(&self, verb: &'static str, e: impl std::fmt::Display) -> ApiError {
        ApiError::failed_on(verb, &self.scope, format!("malformed answer: {e}"))
    }

    /// The filter to decode slices with, waiting until the claims have told it.
    async fn current_filter(&mut self) -> Option<DeviceFilter> {
        match self.filter.wait_for(Option::is_some).await {
            Ok(f) => f.clone(),
            Err(_) => None,
        }
    }

    fn decode(&self, raw: &str, filter: &DeviceFilter, node: Option<&str>) -> Result<Option<Item>, serde_json::Error> {
        Ok(match self.scope {
            // Only what resolution reads is kept: a tenant's annotations or driver configuration never become our memory.
            Scope::Claim(_) => Some(Item::Claim(Box::new(retained::claim(slices::decode_claim(raw)?)))),
            Scope::Pod(_) => Some(Item::Pod(Box::new(retained::pod(serde_json::from_str(raw)?)))),
            Scope::NodeSlices(_) | Scope::DriverSlices(_) => {
                slices::decode(raw, filter, node)?.map(|s| Item::Slice(Box::new(s)))
            }
        })
    }
}

/// List a scope, page by page, and send it whole.
async fn list(mut ctx: ScopeContext, after: Duration) {
    tokio::time::sleep(after).await;
    let node = match &ctx.scope {
        Scope::NodeSlices(n) => Some(n.clone()),
        _ => None,
    };
    'restart: loop {
        let mut items = Vec::new();
        let mut continue_token: Option<String> = None;
        let mut decoded_with: Option<DeviceFilter> = None;
        loop {
            let params = ListParams {
                field_selector: Some(ctx.scope.field_selector()),
                limit: Some(ctx.page_size),
                continue_token: continue_token.clone(),
                ..Default::default()
            };
            let request = match Request::new(ctx.url()).list(&params) {
                Ok(r) => r,
                Err(e) => return ctx.fail(ctx.malformed("list", e)).await,
            };
            let budget = request_budget(ctx.deadline);
            let body = match bounded(budget, read_body(&ctx.client, request)).await {
                Err(e) => return ctx.fail(ApiError::named_on(e, "list", &ctx.scope)).await,
                Ok(body) => body,
            };
            let page: RawList = match serde_json::from_slice(&body) {
                Ok(p) => p,
                Err(e) => return ctx.fail(ctx.malformed("list", e)).await,
            };
            let filter = if ctx.scope.is_slices() {
                ctx.current_filter().await.unwrap_or_default()
            } else {
                DeviceFilter::default()
            };
            if ctx.scope.is_slices() {
                match &decoded_with {
                    Some(earlier) if *earlier != filter => continue 'restart,
                    _ => decoded_with = Some(filter.clone()),
                }
            }
            for raw in page.items {
                match ctx.decode(raw.get(), &filter, node.as_deref()) {
                    Ok(Some(item)) => items.push(item),
                    Ok(None) => {}
                    Err(e) => return ctx.fail(ctx.malformed("list", e)).await,
                }
            }
            let resource_version = page.metadata.resource_version.unwrap_or_default();
            continue_token = page.metadata.continue_token.filter(|t| !t.is_empty());
            if continue_token.is_none() {
                let scope = ctx.scope.clone();
                let decoded_with = if scope.is_slices() { decoded_with } else { None };
                let _ = ctx.tx.send(Input::Listed { scope, items, resource_version, decoded_with }).await;
                return;
            }
        }
    }
}

/// A response body read into one buffer (a page of slices is the largest thing
/// drafs holds: it is not copied again).
async fn read_body(client: &Client, request: http::Request<Vec<u8>>) -> Result<Vec<u8>, kube::Error> {
    let mut reader = std::pin::pin!(client.request_stream(request).await?);
    let mut body = Vec::new();
    futures::AsyncReadExt::read_to_end(&mut reader, &mut body).await.map_err(kube::Error::ReadEvents)?;
    Ok(body)
}

/// Watch a scope from a resource version until the server closes the watch.
async fn watch_scope(ctx: ScopeContext, resource_version: String, after: Duration, seconds: u32) {
    tokio::time::sleep(after).await;
    watch_from(ctx, resource_version, seconds, Instant::now()).await
}

/// How long a poll's watch stays open: long enough for the events since the
/// version to come, short enough to cost the API server nothing after.
const POLL_SECONDS: u32 = 1;

/// A watch that waits to be poked (past `seen`, the count when it was
/// parked), then asks for what changed since the version (a watch the server
/// closes after [`POLL_SECONDS`]). Its `lasted` counts from the wait's start:
/// a poll is not a watch cut short.
async fn parked_watch(
    ctx: ScopeContext,
    resource_version: String,
    after: Duration,
    mut poke: watch::Receiver<u64>,
    seen: u64,
) {
    let started = Instant::now();
    tokio::time::sleep(after).await;
    if poke.wait_for(|n| *n > seen).await.is_err() {
        return;
    }
    watch_from(ctx, resource_version, POLL_SECONDS, started).await
}

/// The slices of a shared scope now, decoded with this run's filter.
async fn shared_list(
    mut ctx: ScopeContext,
    mut sets: watch::Receiver<Arc<SliceSet>>,
    seen: Arc<std::sync::Mutex<HashMap<Scope, Arc<SliceSet>>>>,
    after: Duration,
) {
    tokio::time::sleep(after).await;
    let set = match sets.wait_for(|s| s.listed || s.error.is_some()).await {
        Ok(set) => set.clone(),
        Err(_) => return,
    };
    if !set.listed
        && let Some(error) = &set.error
    {
        return ctx.fail(error.clone()).await;
    }
    let filter = ctx.current_filter().await.unwrap_or_default();
    let node = match &ctx.scope {
        Scope::NodeSlices(n) => Some(n.clone()),
        _ => None,
    };
    let mut items = Vec::new();
    for raw in set.slices.values() {
        match ctx.decode(raw, &filter, node.as_deref()) {
            Ok(Some(item)) => items.push(item),
            Ok(None) => {}
            Err(e) => return ctx.fail(ctx.malformed("list", e)).await,
        }
    }
    seen.lock().unwrap_or_else(|e| e.into_inner()).insert(ctx.scope.clone(), set.clone());
    let (scope, resource_version) = (ctx.scope.clone(), set.generation.to_string());
    let _ = ctx.tx.send(Input::Listed { scope, items, resource_version, decoded_with: Some(filter) }).await;
}

/// The changes of a shared scope since the set this run saw last, as a watch's events.
async fn shared_watch(
    ctx: ScopeContext,
    mut sets: watch::Receiver<Arc<SliceSet>>,
    seen: Arc<std::sync::Mutex<HashMap<Scope, Arc<SliceSet>>>>,
    after: Duration,
) {
    tokio::time::sleep(after).await;
    let node = match &ctx.scope {
        Scope::NodeSlices(n) => Some(n.clone()),
        _ => None,
    };
    let Some(mut base) = seen.lock().unwrap_or_else(|e| e.into_inner()).get(&ctx.scope).cloned() else {
        let _ = ctx.tx.send(Input::Expired(ctx.scope.clone())).await;
        return;
    };
    loop {
        let next = match sets.wait_for(|s| s.listed && s.generation > base.generation).await {
            Ok(set) => set.clone(),
            Err(_) => return,
        };
        let filter = ctx.filter.borrow().clone().unwrap_or_default();
        let (changed, removed) = next.changes_since(&base);
        let mut inputs = Vec::with_capacity(changed.len() + removed.len());
        for raw in changed {
            let scope = ctx.scope.clone();
            match ctx.decode(raw, &filter, node.as_deref()) {
                Ok(Some(item)) => inputs.push(Input::Applied { scope, item }),
                // A slice that no longer holds anything wanted: as if deleted.
                Ok(None) => {
                    if let Some((name, resource_version)) = object_meta(raw) {
                        inputs.push(Input::Deleted { scope, name, resource_version });
                    }
                }
                Err(e) => return ctx.fail(ctx.malformed("watch", e)).await,
            }
        }
        for name in removed {
            inputs.push(Input::Deleted { scope: ctx.scope.clone(), name: name.to_string(), resource_version: None });
        }
        for input in inputs {
            if ctx.tx.send(input).await.is_err() {
                return;
            }
        }
        seen.lock().unwrap_or_else(|e| e.into_inner()).insert(ctx.scope.clone(), next.clone());
        base = next;
    }
}

/// Watch from a version for `seconds`, reporting how long since `started` it lasted.
async fn watch_from(ctx: ScopeContext, resource_version: String, seconds: u32, started: Instant) {
    let node = match &ctx.scope {
        Scope::NodeSlices(n) => Some(n.clone()),
        _ => None,
    };
    let params = WatchParams {
        field_selector: Some(ctx.scope.field_selector()),
        timeout: Some(seconds),
        bookmarks: true,
        ..Default::default()
    };
    let request = match Request::new(ctx.url()).watch(&params, &resource_version) {
        Ok(r) => r,
        Err(e) => return ctx.fail(ctx.malformed("watch", e)).await,
    };
    let mut changes = 0;
    let budget = request_budget(None);
    let stream = match bounded(budget, ctx.client.request_stream(request)).await {
        Err(e) => return ctx.fail(ApiError::named_on(e, "watch", &ctx.scope)).await,
        Ok(s) => s,
    };
    let mut lines = std::pin::pin!(stream.lines());
    loop {
        let line = match tokio::time::timeout(ctx.watch_idle, lines.next()).await {
            Err(_) => {
                let message = format!("silent for {} ms without closing; restarting it", ctx.watch_idle.as_millis());
                return ctx.fail(ctx.watch_failed(message)).await;
            }
            Ok(None) => {
                let (scope, lasted) = (ctx.scope.clone(), started.elapsed());
                let _ = ctx.tx.send(Input::WatchEnded { scope, lasted, changes }).await;
                return;
            }
            Ok(Some(Err(e))) => return ctx.fail(ctx.watch_failed(e.to_string())).await,
            Ok(Some(Ok(line))) => line,
        };
        if line.trim().is_empty() {
            continue;
        }
        let input = match ctx.event(&line, node.as_deref()) {
            Event::Input(input) => input,
            Event::Skip => continue,
            Event::Expired => {
                debug!(scope = %ctx.scope, "watch expired (410 Gone); relisting");
                if let Some(m) = &ctx.metrics {
                    m.watch_restarted();
                }
                let _ = ctx.tx.send(Input::Expired(ctx.scope.clone())).await;
                return;
            }
            Event::Failed(error) => return ctx.fail(error).await,
        };
        if matches!(input, Input::Applied { .. } | Input::Deleted { .. }) {
            changes += 1;
        }
        if ctx.tx.send(input).await.is_err() {
            return;
        }
    }
}

/// What one line of a watch means for the reconciler.
enum Event {
    Input(Input),
    /// Nothing to tell (a bookmark without a version, a type drafs does not use).
    Skip,
    /// 410 Gone: the version is too old, list again.
    Expired,
    /// The watch is broken.
    Failed(ApiError),
}

impl ScopeContext {
    fn watch_failed(&self, message: String) -> ApiError {
        ApiError::failed_on("watch", &self.scope, message)
    }

    /// Decode one watch event (a line of the stream) into what it means.
    fn event(&self, line: &str, node: Option<&str>) -> Event {
        let event: RawEvent = match serde_json::from_str(line) {
            Ok(e) => e,
            Err(e) => return Event::Failed(self.malformed("watch", e)),
        };
        let scope = self.scope.clone();
        let deleted = |scope| {
            object_meta(event.object.get()).map(|(name, rv)| Input::Deleted { scope, name, resource_version: rv })
        };
        match event.kind.as_str() {
            "ADDED" | "MODIFIED" => {
                let filter = self.filter.borrow().clone().unwrap_or_default();
                match self.decode(event.object.get(), &filter, node) {
                    Ok(Some(item)) => Event::Input(Input::Applied { scope, item }),
                    // A slice that no longer holds anything wanted: as if deleted.
                    Ok(None) => deleted(scope).map_or(Event::Skip, Event::Input),
                    Err(e) => Event::Failed(self.malformed("watch", e)),
                }
            }
            "DELETED" => match deleted(scope) {
                Some(input) => Event::Input(input),
                None => Event::Failed(self.malformed("watch", "a DELETED event without a name")),
            },
            "BOOKMARK" => match object_meta(event.object.get()).and_then(|(_, rv)| rv) {
                Some(resource_version) => Event::Input(Input::Bookmark { scope, resource_version }),
                None => Event::Skip,
            },
            "ERROR" => match serde_json::from_str::<kube::core::Status>(event.object.get()) {
                Err(e) => Event::Failed(self.malformed("watch", e)),
                Ok(status) if status.code == 410 => Event::Expired,
                Ok(status) => Event::Failed(ApiError::named_on(
                    CallError::from(kube::Error::Api(Box::new(status))),
                    "watch",
                    &self.scope,
                )),
            },
            _ => Event::Skip,
        }
    }
}

/// The cluster's credentials cannot be found.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot find cluster credentials ({0}); run inside a pod with a service account, set KUBECONFIG, or use --from-file"
)]
pub struct NoCredentials(String);

/// A client from the pod's service account or the kubeconfig, and the pod
/// `name` in `namespace` (when not given: the kubeconfig context's).
pub async fn connect(name: String, namespace: Option<String>) -> Result<(Client, PodRef), NoCredentials> {
    let client = Client::try_default().await.map_err(|e| {
        // kube quotes a kubeconfig path twice ('"/path"'); show it once.
        NoCredentials(e.to_string().replace("'\"", "'").replace("\"'", "'"))
    })?;
    let namespace = namespace.unwrap_or_else(|| client.default_namespace().to_string());
    Ok((client, PodRef { namespace, name }))
}
