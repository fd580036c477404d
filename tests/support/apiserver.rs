//! A small Kubernetes API server for tests.
//!
//! It speaks the real HTTP protocol for pods, resourceclaims and resourceslices
//! (resource.k8s.io/v1): GET, LIST and WATCH (streamed JSON events with
//! resourceVersion, bookmarks and 410 Gone), the field selectors drafs uses,
//! bearer-token authentication, and authorization from the RBAC objects in
//! `drafs manifests rbac` — anything those do not grant is answered 403, so the
//! shipped RBAC is proven sufficient. Tests change objects while the binary runs,
//! inject latency and failures, and count requests.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

/// The resources the server knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Res {
    Pods,
    ResourceClaims,
    ResourceSlices,
    Events,
}

impl Res {
    fn from_kind(kind: &str) -> Option<Res> {
        match kind {
            "Pod" => Some(Res::Pods),
            "ResourceClaim" => Some(Res::ResourceClaims),
            "ResourceSlice" => Some(Res::ResourceSlices),
            "Event" => Some(Res::Events),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Res::Pods => "pods",
            Res::ResourceClaims => "resourceclaims",
            Res::ResourceSlices => "resourceslices",
            Res::Events => "events",
        }
    }
    fn group(self) -> &'static str {
        match self {
            Res::Pods | Res::Events => "",
            _ => "resource.k8s.io",
        }
    }
    fn api_version(self) -> &'static str {
        match self {
            Res::Pods | Res::Events => "v1",
            _ => "resource.k8s.io/v1",
        }
    }
    fn kind(self) -> &'static str {
        match self {
            Res::Pods => "Pod",
            Res::ResourceClaims => "ResourceClaim",
            Res::ResourceSlices => "ResourceSlice",
            Res::Events => "Event",
        }
    }
    fn namespaced(self) -> bool {
        self != Res::ResourceSlices
    }
    fn field_labels(self) -> &'static [&'static str] {
        match self {
            Res::Pods => &["metadata.name", "metadata.namespace", "spec.nodeName"],
            Res::ResourceClaims => &["metadata.name", "metadata.namespace"],
            Res::ResourceSlices => &["metadata.name", "spec.nodeName", "spec.driver"],
            Res::Events => &["metadata.name", "involvedObject.name"],
        }
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    /// When the request arrived (before any injected latency).
    pub started: Instant,
    /// When the answer (or, for a watch, its first bytes) left.
    pub at: Instant,
    pub verb: String,
    pub resource: String,
    pub path: String,
    pub query: String,
    /// The decoded `fieldSelector` parameter ("" when absent).
    pub field_selector: String,
    pub status: u16,
    /// The bearer token presented ("" without one).
    pub token: String,
}

/// An injected failure: the next `count` requests matching verb/resource get `status`
/// (0 = the connection is dropped without an answer).
#[derive(Debug, Clone)]
pub struct Fault {
    pub verb: Option<String>,
    pub resource: Option<Res>,
    pub status: u16,
    pub count: usize,
}

/// How every watch answers, whatever it asks for (requests are still logged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WatchFault {
    /// Watches work.
    #[default]
    None,
    /// An `ERROR` event with a 410 Gone Status, then the end of the stream, as
    /// the real server answers a watch from a compacted resourceVersion.
    Gone,
    /// The stream ends at once without a single event (a proxy cutting watches).
    CloseAtOnce,
}

#[derive(Debug, Clone)]
struct Event {
    rv: u64,
    res: Res,
    old: Option<Value>,
    new: Option<Value>,
}

#[derive(Debug, Default)]
struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    names: Vec<String>,
}

impl Rule {
    fn matches(&self, verb: &str, group: &str, resource: &str, name: Option<&str>) -> bool {
        let has = |list: &Vec<String>, v: &str| list.iter().any(|x| x == "*" || x == v);
        has(&self.groups, group)
            && has(&self.resources, resource)
            && has(&self.verbs, verb)
            && (self.names.is_empty() || name.is_some_and(|n| self.names.iter().any(|x| x == n)))
    }
}

/// Grants read from RBAC objects: (user, namespace or None for cluster-wide) -> rules.
#[derive(Debug, Default)]
pub struct Rbac {
    grants: Vec<(String, Option<String>, Rule)>,
}

impl Rbac {
    /// Load Role/ClusterRole/RoleBinding/ClusterRoleBinding documents, as `kubectl
    /// apply -n <namespace>` would: objects and subjects in `default` move to `namespace`.
    pub fn from_yaml(text: &str, namespace: &str) -> Rbac {
        let docs: Vec<Value> = serde_saphyr::from_multiple(text).expect("rbac yaml parses");
        let ns_of = |v: &Value| {
            let ns = v.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
            if ns == "default" { namespace.to_string() } else { ns.to_string() }
        };
        let rules_of = |v: &Value| -> Vec<Rule> {
            let strs = |r: &Value, k: &str| -> Vec<String> {
                r.get(k)
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect())
                    .unwrap_or_default()
            };
            v.get("rules")
                .and_then(Value::as_array)
                .map(|rs| {
                    rs.iter()
                        .map(|r| Rule {
                            groups: strs(r, "apiGroups"),
                            resources: strs(r, "resources"),
                            verbs: strs(r, "verbs"),
                            names: strs(r, "resourceNames"),
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut roles: HashMap<(String, Option<String>), Value> = HashMap::new();
        for d in &docs {
            let name = d.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
            match d.get("kind").and_then(Value::as_str) {
                Some("Role") => {
                    roles.insert((name, Some(ns_of(d))), d.clone());
                }
                Some("ClusterRole") => {
                    roles.insert((name, None), d.clone());
                }
                _ => {}
            }
        }
        let mut rbac = Rbac::default();
        for d in &docs {
            let kind = d.get("kind").and_then(Value::as_str).unwrap_or("");
            if kind != "RoleBinding" && kind != "ClusterRoleBinding" {
                continue;
            }
            let role_kind = d.pointer("/roleRef/kind").and_then(Value::as_str).unwrap_or("");
            let role_name = d.pointer("/roleRef/name").and_then(Value::as_str).unwrap_or("").to_string();
            let scope = if kind == "RoleBinding" { Some(ns_of(d)) } else { None };
            let role = match role_kind {
                "Role" => roles.get(&(role_name, scope.clone())),
                _ => roles.get(&(role_name, None)),
            };
            let Some(role) = role else { continue };
            for subject in d.get("subjects").and_then(Value::as_array).into_iter().flatten() {
                let user = match subject.get("kind").and_then(Value::as_str) {
                    Some("ServiceAccount") => format!(
                        "system:serviceaccount:{}:{}",
                        ns_of(
                            &json!({"metadata": {"namespace": subject.get("namespace").cloned().unwrap_or(json!("default"))}})
                        ),
                        subject.get("name").and_then(Value::as_str).unwrap_or("")
                    ),
                    _ => subject.get("name").and_then(Value::as_str).unwrap_or("").to_string(),
                };
                for rule in rules_of(role) {
                    rbac.grants.push((user.clone(), scope.clone(), rule));
                }
            }
        }
        rbac
    }

    pub fn allows(&self, user: &str, verb: &str, res: Res, namespace: Option<&str>, name: Option<&str>) -> bool {
        self.grants.iter().any(|(u, scope, rule)| {
            u == user
                && (scope.is_none() || scope.as_deref() == namespace)
                && rule.matches(verb, res.group(), res.name(), name)
        })
    }
}

struct State {
    rv: u64,
    objects: BTreeMap<(Res, String, String), Value>,
    events: Vec<Event>,
    compacted: u64,
    tokens: HashMap<String, String>,
    rbac: Rbac,
    latency: Duration,
    faults: Vec<Fault>,
    watch_fault: WatchFault,
    requests: Vec<RequestRecord>,
    bookmark_interval: Duration,
    /// (placeholder, JSON text): see [`TestApi::send_raw`].
    raw_texts: Vec<(String, String)>,
}

impl State {
    /// The JSON text of `value` as the server sends it, placeholders replaced.
    fn encode(&self, value: &Value) -> String {
        let mut text = value.to_string();
        for (placeholder, raw) in &self.raw_texts {
            text = text.replace(&format!("\"{placeholder}\""), raw);
        }
        text
    }
}

struct Shared {
    state: Mutex<State>,
    /// Bumped on every change; watches wake on it.
    changed: watch::Sender<u64>,
    /// Bumped to end every open watch (an API server restart, a compaction).
    epoch: watch::Sender<u64>,
}

/// A running test API server.
pub struct TestApi {
    shared: Arc<Shared>,
    addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for TestApi {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl TestApi {
    /// Start with no objects, authorizing by the RBAC text for `namespace`.
    pub fn start(rbac_yaml: &str, namespace: &str) -> TestApi {
        let (changed, _) = watch::channel(0);
        let (epoch, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                rv: 100,
                objects: BTreeMap::new(),
                events: Vec::new(),
                compacted: 0,
                tokens: HashMap::new(),
                rbac: Rbac::from_yaml(rbac_yaml, namespace),
                latency: Duration::ZERO,
                faults: Vec::new(),
                watch_fault: WatchFault::None,
                requests: Vec::new(),
                bookmark_interval: Duration::from_secs(1),
                raw_texts: Vec::new(),
            }),
            changed,
            epoch,
        });
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut api = TestApi { shared, addr, runtime: Some(runtime), server: None };
        api.serve(listener);
        api
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let shared = self.shared.clone();
        let rt = self.runtime.as_ref().unwrap();
        self.server = Some(rt.spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let shared = shared.clone();
                connections.spawn(async move {
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        }));
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stop accepting and cut every connection, then listen again on the same port.
    pub fn restart(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
        self.shared.epoch.send_modify(|e| *e += 1);
        let rt = self.runtime.as_ref().unwrap();
        let addr = self.addr;
        let listener = rt.block_on(async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => return l,
                    Err(e) if Instant::now() < deadline => {
                        let _ = e;
                        tokio::time::sleep(Duration::from_millis(20)).await
                    }
                    Err(e) => panic!("rebind {addr}: {e}"),
                }
            }
        });
        self.serve(listener);
    }

    pub fn add_token(&self, token: &str, user: &str) {
        self.state().tokens.insert(token.into(), user.into());
    }

    pub fn set_latency(&self, latency: Duration) {
        self.state().latency = latency;
    }

    pub fn set_bookmark_interval(&self, interval: Duration) {
        self.state().bookmark_interval = interval;
    }

    pub fn inject(&self, fault: Fault) {
        self.state().faults.push(fault);
    }

    /// Make every watch from now on answer as `fault` says (`WatchFault::None` heals).
    pub fn set_watch_fault(&self, fault: WatchFault) {
        self.state().watch_fault = fault;
    }

    pub fn clear_faults(&self) {
        let mut s = self.state();
        s.faults.clear();
        s.watch_fault = WatchFault::None;
    }

    pub fn requests(&self) -> Vec<RequestRecord> {
        self.state().requests.clone()
    }

    pub fn clear_requests(&self) {
        self.state().requests.clear();
    }

    /// Forget the event history: watches resuming from an older resourceVersion get
    /// 410 Gone, and open watches are ended so that they have to resume.
    pub fn compact(&self) {
        {
            let mut s = self.state();
            s.compacted = s.rv;
            s.events.clear();
        }
        self.shared.epoch.send_modify(|e| *e += 1);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap()
    }

    /// Create or replace an object (the JSON form, with kind and metadata).
    pub fn apply(&self, mut object: Value) {
        let res = Res::from_kind(object["kind"].as_str().unwrap_or("")).expect("a Pod, ResourceClaim or ResourceSlice");
        object["apiVersion"] = json!(res.api_version());
        let ns = if res.namespaced() {
            object["metadata"]["namespace"].as_str().unwrap_or("default").to_string()
        } else {
            String::new()
        };
        let name = object["metadata"]["name"].as_str().expect("metadata.name").to_string();
        {
            let mut s = self.state();
            s.rv += 1;
            let rv = s.rv;
            object["metadata"]["resourceVersion"] = json!(rv.to_string());
            let old = s.objects.insert((res, ns, name), object.clone());
            s.events.push(Event { rv, res, old, new: Some(object) });
        }
        self.shared.changed.send_modify(|c| *c += 1);
    }

    pub fn delete(&self, kind: &str, namespace: &str, name: &str) -> bool {
        let res = Res::from_kind(kind).expect("known kind");
        let ns = if res.namespaced() { namespace.to_string() } else { String::new() };
        let removed = {
            let mut s = self.state();
            match s.objects.remove(&(res, ns, name.to_string())) {
                Some(mut old) => {
                    s.rv += 1;
                    let rv = s.rv;
                    old["metadata"]["resourceVersion"] = json!(rv.to_string());
                    s.events.push(Event { rv, res, old: Some(old), new: None });
                    true
                }
                None => false,
            }
        };
        self.shared.changed.send_modify(|c| *c += 1);
        removed
    }

    /// Events created by clients, oldest first.
    pub fn events(&self) -> Vec<Value> {
        let mut events: Vec<Value> =
            self.state().objects.iter().filter(|((r, _, _), _)| *r == Res::Events).map(|(_, o)| o.clone()).collect();
        events.sort_by_key(|e| e["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse::<u64>().ok()));
        events
    }

    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let res = Res::from_kind(kind)?;
        let ns = if res.namespaced() { namespace.to_string() } else { String::new() };
        self.state().objects.get(&(res, ns, name.to_string())).cloned()
    }

    /// Send the JSON text `raw` wherever an object holds the string
    /// `placeholder`, in every answer from now on: a driver's data with numbers
    /// a `serde_json::Value` cannot hold (beyond 64 bits), or escapes it would
    /// rewrite, as the real API server sends the bytes a driver stored.
    pub fn send_raw(&self, placeholder: &str, raw: &str) {
        self.state().raw_texts.push((placeholder.to_string(), raw.to_string()));
    }

    /// Load every Pod, ResourceClaim and ResourceSlice of a YAML text.
    pub fn load_yaml(&self, text: &str) {
        let docs: Vec<Value> = serde_saphyr::from_multiple(text).expect("fixture parses");
        for doc in docs {
            if doc.get("kind").and_then(Value::as_str).and_then(Res::from_kind).is_some() {
                self.apply(doc);
            }
        }
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn status_response(code: u16, reason: &str, message: &str) -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code});
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap()
}

fn json_response(text: String) -> Response<Body> {
    Response::builder().header("content-type", "application/json").body(Full::new(Bytes::from(text)).boxed()).unwrap()
}

struct Route {
    res: Res,
    namespace: Option<String>,
    name: Option<String>,
}

fn route(path: &str) -> Option<Route> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (res, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => (None, rest),
        ["apis", "resource.k8s.io", "v1", rest @ ..] => (Some(()), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] => (Some(ns.to_string()), rest),
        other => (None, other),
    };
    let (resource, name) = match rest {
        [r] => (*r, None),
        [r, n] => (*r, Some(n.to_string())),
        _ => return None,
    };
    let res = match (res, resource) {
        (None, "pods") => Res::Pods,
        (None, "events") => Res::Events,
        (Some(()), "resourceclaims") => Res::ResourceClaims,
        (Some(()), "resourceslices") => Res::ResourceSlices,
        _ => return None,
    };
    if res.namespaced() != namespace.is_some() && name.is_some() {
        return None;
    }
    if !res.namespaced() && namespace.is_some() {
        return None;
    }
    Some(Route { res, namespace, name })
}

fn query_params(query: &str) -> HashMap<String, String> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A parsed field selector: (field, wanted value, equal?) terms.
type Selector = Vec<(String, String, bool)>;

fn parse_selector(res: Res, text: &str) -> Result<Selector, String> {
    let mut terms = Vec::new();
    for term in text.split(',').filter(|t| !t.is_empty()) {
        let (field, value, eq) = if let Some((f, v)) = term.split_once("!=") {
            (f, v, false)
        } else if let Some((f, v)) = term.split_once("==") {
            (f, v, true)
        } else if let Some((f, v)) = term.split_once('=') {
            (f, v, true)
        } else {
            return Err(format!("invalid selector: {term:?}"));
        };
        if !res.field_labels().contains(&field) {
            return Err(format!("field label not supported: {field}"));
        }
        terms.push((field.to_string(), value.to_string(), eq));
    }
    Ok(terms)
}

fn field_value(object: &Value, field: &str) -> String {
    let pointer = format!("/{}", field.replace('.', "/"));
    object.pointer(&pointer).and_then(Value::as_str).unwrap_or("").to_string()
}

fn selected(object: &Value, namespace: Option<&str>, selector: &Selector) -> bool {
    if let Some(ns) = namespace
        && object.pointer("/metadata/namespace").and_then(Value::as_str) != Some(ns)
    {
        return false;
    }
    selector.iter().all(|(field, value, eq)| (field_value(object, field) == *value) == *eq)
}

async fn handle(shared: Arc<Shared>, req: Request<hyper::body::Incoming>) -> Result<Response<Body>, std::io::Error> {
    let arrived = Instant::now();
    let token = req
        .headers()
        .get("authorization")
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(String::from);
    let bearer = token.clone().unwrap_or_default();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let params = query_params(&query);
    let Some(route) = route(&path) else {
        return Ok(record(
            &shared,
            arrived,
            &bearer,
            "",
            "",
            &path,
            &query,
            status_response(404, "NotFound", &format!("the server could not find the requested resource ({path})")),
        ));
    };
    let is_watch = matches!(params.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = match (req.method().as_str(), &route.name, is_watch) {
        ("POST", None, _) if route.res == Res::Events => "create",
        ("GET", Some(_), _) => "get",
        ("GET", None, true) => "watch",
        ("GET", None, false) => "list",
        _ => {
            return Ok(record(
                &shared,
                arrived,
                &bearer,
                "",
                route.res.name(),
                &path,
                &query,
                status_response(405, "MethodNotAllowed", "only reads are served"),
            ));
        }
    };
    let latency = shared.state.lock().unwrap().latency;
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let response = {
        let mut s = shared.state.lock().unwrap();
        let user = token.and_then(|t| s.tokens.get(&t).cloned());
        let fault = s.faults.iter_mut().find(|f| {
            f.count > 0 && f.verb.as_deref().is_none_or(|v| v == verb) && f.resource.is_none_or(|r| r == route.res)
        });
        if let Some(fault) = fault {
            fault.count -= 1;
            let status = fault.status;
            let field_selector = params.get("fieldSelector").cloned().unwrap_or_default();
            s.requests.push(RequestRecord {
                started: arrived,
                at: Instant::now(),
                verb: verb.into(),
                resource: route.res.name().into(),
                path: path.clone(),
                query: query.clone(),
                field_selector,
                status,
                token: bearer.clone(),
            });
            if status == 0 {
                return Err(std::io::Error::other("injected connection drop"));
            }
            return Ok(status_response(status, "InternalError", "injected failure"));
        }
        match user {
            None => Some(status_response(401, "Unauthorized", "Unauthorized")),
            Some(user) if !s.rbac.allows(&user, verb, route.res, route.namespace.as_deref(), route.name.as_deref()) => {
                let scope = match &route.namespace {
                    Some(ns) => format!(" in the namespace \"{ns}\""),
                    None => " at the cluster scope".to_string(),
                };
                let what = match &route.name {
                    Some(n) => format!("{} \"{n}\"", route.res.name()),
                    None => route.res.name().to_string(),
                };
                Some(status_response(
                    403,
                    "Forbidden",
                    &format!(
                        "{what} is forbidden: User \"{user}\" cannot {verb} resource \"{}\" in API group \"{}\"{scope}",
                        route.res.name(),
                        route.res.group()
                    ),
                ))
            }
            Some(_) => None,
        }
    };
    // An answer to this request that ends it early, recorded like any other.
    let resource = route.res.name();
    let early = |response| Ok(record(&shared, arrived, &bearer, verb, resource, &path, &query, response));
    if let Some(denied) = response {
        return early(denied);
    }
    let selector = match parse_selector(route.res, params.get("fieldSelector").map(String::as_str).unwrap_or("")) {
        Ok(s) => s,
        Err(e) => {
            return early(status_response(400, "BadRequest", &e));
        }
    };
    let response = match verb {
        "create" => {
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => return Ok(status_response(400, "BadRequest", "unreadable body")),
            };
            match serde_json::from_slice::<Value>(&body) {
                Ok(mut object) if object["kind"] == "Event" => {
                    let name = match object["metadata"]["name"].as_str() {
                        Some(n) => n.to_string(),
                        None => {
                            let mut s = shared.state.lock().unwrap();
                            s.rv += 1;
                            format!("{}{:05x}", object["metadata"]["generateName"].as_str().unwrap_or("event-"), s.rv)
                        }
                    };
                    object["metadata"]["name"] = json!(name);
                    object["metadata"]["namespace"] = json!(route.namespace.clone().unwrap_or_default());
                    let mut s = shared.state.lock().unwrap();
                    s.rv += 1;
                    object["metadata"]["resourceVersion"] = json!(s.rv.to_string());
                    s.objects.insert((Res::Events, route.namespace.clone().unwrap_or_default(), name), object.clone());
                    let mut response = json_response(object.to_string());
                    *response.status_mut() = StatusCode::CREATED;
                    response
                }
                _ => status_response(400, "BadRequest", "the body is not an Event"),
            }
        }
        "get" => {
            let s = shared.state.lock().unwrap();
            let key = (route.res, route.namespace.clone().unwrap_or_default(), route.name.clone().unwrap());
            match s.objects.get(&key) {
                Some(o) => json_response(s.encode(o)),
                None => status_response(404, "NotFound", &format!("{} \"{}\" not found", route.res.name(), key.2)),
            }
        }
        "list" => {
            let s = shared.state.lock().unwrap();
            // Paging as the real server does it: `limit`, and a `continue` token that
            // carries the list's resource version and where the next page starts;
            // a token older than the last compaction is 410 Gone.
            let limit = params.get("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0);
            let (list_rv, after) = match params.get("continue").filter(|c| !c.is_empty()) {
                None => (s.rv, None),
                Some(token) => match token.split_once('|').and_then(|(rv, key)| Some((rv.parse::<u64>().ok()?, key))) {
                    Some((rv, _)) if rv < s.compacted => {
                        return early(status_response(
                            410,
                            "Expired",
                            "The provided continue parameter is too old to display a consistent list result.",
                        ));
                    }
                    Some((rv, key)) => (rv, Some(key.to_string())),
                    None => {
                        return early(status_response(400, "BadRequest", "invalid continue token"));
                    }
                },
            };
            let matching: Vec<(String, &Value)> = s
                .objects
                .iter()
                .filter(|((r, _, _), o)| *r == route.res && selected(o, route.namespace.as_deref(), &selector))
                .map(|((_, ns, name), o)| (format!("{ns}/{name}"), o))
                .filter(|(key, _)| after.as_ref().is_none_or(|a| key > a))
                .collect();
            let take = limit.unwrap_or(usize::MAX).min(matching.len());
            let items: Vec<Value> = matching[..take].iter().map(|(_, o)| (*o).clone()).collect();
            let more = take < matching.len();
            let last_key = matching[..take].last().map(|(k, _)| k.clone()).unwrap_or_default();
            let mut metadata = json!({"resourceVersion": list_rv.to_string()});
            if more {
                metadata["continue"] = json!(format!("{list_rv}|{last_key}"));
            }
            json_response(s.encode(&json!({
                "kind": format!("{}List", route.res.kind()),
                "apiVersion": route.res.api_version(),
                "metadata": metadata,
                "items": items,
            })))
        }
        _ => watch_response(shared.clone(), route, selector, &params),
    };
    Ok(record(&shared, arrived, &bearer, verb, "", &path, &query, response))
}

#[allow(clippy::too_many_arguments)]
fn record(
    shared: &Shared,
    started: Instant,
    token: &str,
    verb: &str,
    resource: &str,
    path: &str,
    query: &str,
    response: Response<Body>,
) -> Response<Body> {
    let resource = if resource.is_empty() { route(path).map(|r| r.res.name()).unwrap_or("") } else { resource };
    shared.state.lock().unwrap().requests.push(RequestRecord {
        started,
        at: Instant::now(),
        verb: verb.into(),
        resource: resource.into(),
        path: path.into(),
        query: query.into(),
        field_selector: query_params(query).get("fieldSelector").cloned().unwrap_or_default(),
        status: response.status().as_u16(),
        token: token.into(),
    });
    response
}

fn watch_response(
    shared: Arc<Shared>,
    route: Route,
    selector: Selector,
    params: &HashMap<String, String>,
) -> Response<Body> {
    let since: Option<u64> = params.get("resourceVersion").and_then(|v| v.parse().ok()).filter(|v| *v > 0);
    let bookmarks = params.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let mut changed = shared.changed.subscribe();
    let mut epoch = shared.epoch.subscribe();
    epoch.mark_unchanged();
    tokio::spawn(async move {
        let end = tokio::time::Instant::now() + timeout;
        let line = |v: Value| Bytes::from(format!("{v}\n"));
        // Initial state: synthetic ADDED events when no resourceVersion was given.
        let mut cursor = {
            let s = shared.state.lock().unwrap();
            match s.watch_fault {
                WatchFault::None => {}
                WatchFault::Gone => {
                    let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410, "message": "too old resource version (injected)"}});
                    let _ = tx.try_send(line(gone));
                    return;
                }
                WatchFault::CloseAtOnce => return,
            }
            match since {
                Some(rv) if rv < s.compacted => {
                    let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410, "message": format!("too old resource version: {rv} ({})", s.compacted)}});
                    let _ = tx.try_send(line(gone));
                    return;
                }
                Some(rv) => rv,
                None => {
                    for ((r, _, _), o) in &s.objects {
                        if *r == route.res && selected(o, route.namespace.as_deref(), &selector) {
                            let _ = tx.try_send(Bytes::from(s.encode(&json!({"type": "ADDED", "object": o})) + "\n"));
                        }
                    }
                    s.rv
                }
            }
        };
        let interval = shared.state.lock().unwrap().bookmark_interval;
        let mut next_bookmark = tokio::time::Instant::now() + interval;
        loop {
            let batch: Vec<Bytes> = {
                let s = shared.state.lock().unwrap();
                let mut out = Vec::new();
                for e in s.events.iter().filter(|e| e.rv > cursor && e.res == route.res) {
                    let was = e.old.as_ref().is_some_and(|o| selected(o, route.namespace.as_deref(), &selector));
                    let is = e.new.as_ref().is_some_and(|o| selected(o, route.namespace.as_deref(), &selector));
                    let (kind, obj) = match (was, is) {
                        (false, true) => ("ADDED", e.new.clone()),
                        (true, true) => ("MODIFIED", e.new.clone()),
                        (true, false) => ("DELETED", e.new.clone().or_else(|| e.old.clone())),
                        (false, false) => continue,
                    };
                    out.push(Bytes::from(s.encode(&json!({"type": kind, "object": obj})) + "\n"));
                }
                cursor = s.rv;
                out
            };
            for b in batch {
                if tx.send(b).await.is_err() {
                    return;
                }
            }
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                _ = epoch.changed() => return,
                _ = tokio::time::sleep_until(next_bookmark), if bookmarks => {
                    next_bookmark = tokio::time::Instant::now() + interval;
                    let rv = shared.state.lock().unwrap().rv;
                    let bookmark = json!({"type": "BOOKMARK", "object": {"kind": route.res.kind(), "apiVersion": route.res.api_version(), "metadata": {"resourceVersion": rv.to_string()}}});
                    if tx.send(line(bookmark)).await.is_err() {
                        return;
                    }
                }
                _ = tokio::time::sleep_until(end) => return,
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(StreamBody::new(stream).boxed())
        .unwrap()
}

/// The number of sequential round trips among the reads (GET, LIST): the longest
/// chain of reads each sent only after the previous one was answered.
pub fn sequential_round_trips(requests: &[RequestRecord]) -> usize {
    let mut reads: Vec<&RequestRecord> = requests.iter().filter(|r| r.verb == "get" || r.verb == "list").collect();
    reads.sort_by_key(|r| r.started);
    let mut depth: Vec<usize> = Vec::with_capacity(reads.len());
    for (i, r) in reads.iter().enumerate() {
        let before = (0..i).filter(|&j| reads[j].at <= r.started).map(|j| depth[j]).max().unwrap_or(0);
        depth.push(before + 1);
    }
    depth.into_iter().max().unwrap_or(0)
}
