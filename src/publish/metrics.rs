//! Prometheus metrics, `/healthz` and `/readyz` (off unless `--metrics-addr`).
//!
//! The counters are plain atomics updated by the engine and the commands; the
//! HTTP side is hyper's HTTP/1.1 server (already linked for the webhook and
//! `drafs node`), GET only, one request per connection, bounded in
//! connections and time.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::model::health::HealthState;
use crate::model::resolve::Resolution;
use crate::publish::prometheus::{self, Kind, Text};
use crate::publish::slots::{Slots, until_closed};

/// The labels that name a device in `drafs_device_health`.
type DeviceLabels = Vec<(&'static str, String)>;

#[derive(Debug)]
pub struct Metrics {
    started: Instant,
    /// Milliseconds from start to the first ready tree, +1 (0: not yet).
    ready_after_ms: AtomicU64,
    ready: AtomicBool,
    not_ready_reason: Mutex<String>,
    tree_updates: AtomicU64,
    watch_restarts: AtomicU64,
    values_served: AtomicU64,
    fuse_reads: AtomicU64,
    api_errors: Mutex<BTreeMap<String, u64>>,
    /// Each device the kubelet reports health for: its labels and state.
    device_health: Mutex<Vec<(DeviceLabels, HealthState)>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            started: Instant::now(),
            ready_after_ms: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            not_ready_reason: Mutex::new("starting".into()),
            tree_updates: AtomicU64::new(0),
            watch_restarts: AtomicU64::new(0),
            values_served: AtomicU64::new(0),
            fuse_reads: AtomicU64::new(0),
            api_errors: Mutex::new(BTreeMap::new()),
            device_health: Mutex::new(Vec::new()),
        }
    }
}

impl Metrics {
    /// Record a published tree: its readiness and how many values it holds.
    pub fn tree_published(&self, ready: bool, values: usize, missing: &[String]) {
        self.tree_updates.fetch_add(1, Ordering::Relaxed);
        self.values_served.store(values as u64, Ordering::Relaxed);
        if ready {
            self.ready.store(true, Ordering::Relaxed);
            let ms = self.started.elapsed().as_millis() as u64 + 1;
            let _ = self.ready_after_ms.compare_exchange(0, ms, Ordering::Relaxed, Ordering::Relaxed);
        } else {
            self.not_ready(missing);
        }
    }

    /// The health of the published tree's devices (those the kubelet reports on).
    pub fn device_health(&self, res: &Resolution) {
        let samples = res
            .claims
            .iter()
            .flat_map(|c| c.devices.iter().map(move |d| (c, d)))
            .filter_map(|(c, d)| {
                let health = d.health.as_ref()?;
                let labels = vec![
                    ("claim", c.pod_claim.clone()),
                    ("request", d.request.clone()),
                    ("index", d.index.to_string()),
                    ("driver", d.driver.clone()),
                    ("pool", d.pool.clone()),
                    ("device", d.device.clone()),
                ];
                Some((labels, health.state))
            })
            .collect();
        if let Ok(mut h) = self.device_health.lock() {
            *h = samples;
        }
    }

    /// Not ready, for these reasons (without counting a published tree).
    pub fn not_ready(&self, reasons: &[String]) {
        self.ready.store(false, Ordering::Relaxed);
        if let Ok(mut r) = self.not_ready_reason.lock() {
            *r = reasons.join("; ");
        }
    }

    pub fn watch_restarted(&self) {
        self.watch_restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// Count an API error by HTTP status code ("none" for transport errors).
    pub fn api_error(&self, code: Option<u16>) {
        let key = code.map_or_else(|| "none".to_string(), |c| c.to_string());
        if let Ok(mut m) = self.api_errors.lock() {
            *m.entry(key).or_default() += 1;
        }
    }

    pub fn fuse_read(&self) {
        self.fuse_reads.fetch_add(1, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = Text::default();
        let ready_ms = self.ready_after_ms.load(Ordering::Relaxed);
        if ready_ms > 0 {
            let seconds = format!("{:.3}", (ready_ms - 1) as f64 / 1000.0);
            out.single(
                "drafs_time_to_ready_seconds",
                Kind::Gauge,
                "Seconds from start to the first ready tree.",
                seconds,
            );
        }
        out.single(
            "drafs_ready",
            Kind::Gauge,
            "1 while everything asked for is in the tree.",
            u8::from(self.is_ready()),
        );
        let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
        out.single("drafs_tree_updates_total", Kind::Counter, "Trees published.", count(&self.tree_updates));
        out.single(
            "drafs_watch_restarts_total",
            Kind::Counter,
            "Watches re-established after an error or 410 Gone.",
            count(&self.watch_restarts),
        );
        let name = "drafs_api_errors_total";
        out.family(name, Kind::Counter, "Failed API requests by HTTP status code (none: no response).");
        for (code, n) in self.api_errors.lock().map(|m| m.clone()).unwrap_or_default() {
            out.sample(name, &[("code", &code)], n);
        }
        out.single("drafs_values_served", Kind::Gauge, "Files in the current tree.", count(&self.values_served));
        let name = "drafs_device_health";
        out.family(
            name,
            Kind::Gauge,
            "1 for the health the kubelet reports for an allocated device (Healthy, Unhealthy or Unknown), 0 for the others.",
        );
        for (device, state) in self.device_health.lock().map(|h| h.clone()).unwrap_or_default() {
            for s in HealthState::ALL {
                let mut labels: Vec<(&str, &str)> = device.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let state_name = s.to_string();
                labels.push(("state", &state_name));
                out.sample(name, &labels, u8::from(s == state));
            }
        }
        out.single(
            "drafs_fuse_reads_total",
            Kind::Counter,
            "Reads that reached drafs through FUSE (most are answered from the kernel page cache).",
            count(&self.fuse_reads),
        );
        out.into_text()
    }
}

/// What a metrics endpoint serves: the Prometheus text and the readiness
/// behind `/readyz`. The endpoints themselves (`/metrics`, `/healthz`,
/// `/readyz`, their codes and bodies) are [`Exposition::respond`]'s, the
/// same for `init`/`serve` and the webhook.
pub trait Exposition: Send + Sync {
    /// The Prometheus text exposition (`GET /metrics`).
    fn text(&self) -> String;

    /// `None` while ready; why not otherwise (`GET /readyz` answers 503).
    fn unready_reason(&self) -> Option<String>;

    /// Where it stands, for `drafs check` (`GET /status`, JSON); None: not served.
    fn status(&self) -> Option<serde_json::Value> {
        None
    }

    /// (status, content type, body) for a GET of `path`.
    fn respond(&self, path: &str) -> (u16, &'static str, String) {
        match path {
            "/metrics" => {
                (200, prometheus::CONTENT_TYPE, self.text() + &prometheus::build_info() + &super::process::exposition())
            }
            "/healthz" => (200, "text/plain", "ok\n".into()),
            "/readyz" => match self.unready_reason() {
                None => (200, "text/plain", "ready\n".into()),
                Some(reason) => (503, "text/plain", format!("not ready: {reason}\n")),
            },
            "/status" => match self.status() {
                Some(status) => (200, "application/json", format!("{status}\n")),
                None => (404, "text/plain", "not found\n".into()),
            },
            _ => (404, "text/plain", "not found\n".into()),
        }
    }
}

impl Exposition for Metrics {
    fn text(&self) -> String {
        self.render()
    }

    fn unready_reason(&self) -> Option<String> {
        (!self.is_ready()).then(|| self.not_ready_reason.lock().map(|r| r.clone()).unwrap_or_default())
    }
}

/// Bind `addr` (bad addresses fail at start-up, not later).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind(addr).await?;
    info!(addr = %listener.local_addr()?, "metrics listening");
    Ok(listener)
}

/// Connections served at once; at the limit a new one closes another
/// ([`Slots`]: the longest waiting of the peer holding the most).
pub const MAX_CONNECTIONS: usize = 32;
/// A request must arrive whole, and its answer leave, within this time (a
/// client that trickles bytes cannot keep a connection).
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// At most one warning this often about connections closed to make room.
const EVICTION_WARNING: std::time::Duration = std::time::Duration::from_secs(60);

/// Which paths a listener answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paths {
    /// `/metrics`, `/healthz` and `/readyz`.
    All,
    /// `/healthz`, `/readyz` and `/status` only: the kubelet's probes (and
    /// `drafs check`), on a port that must stay reachable while `/metrics`
    /// need not be.
    Probes,
}

/// Answer `/metrics`, `/healthz` and `/readyz` until the task is dropped.
pub async fn serve<E: Exposition + ?Sized + 'static>(listener: TcpListener, metrics: Arc<E>) {
    serve_paths(listener, metrics, Paths::All).await
}

/// Answer `paths` until the task is dropped. Bounded in connections and
/// time, so a flood of slow or idle clients costs a fixed amount of memory
/// and descriptors and can never starve the tree's writes of them; never
/// stops accepting, so a flood cannot starve the kubelet's probes either
/// (a new connection closes one of the flood's, [`Slots`]).
pub async fn serve_paths<E: Exposition + ?Sized + 'static>(listener: TcpListener, metrics: Arc<E>, paths: Paths) {
    let slots = Arc::new(Mutex::new(Slots::default()));
    let mut accept_backoff = std::time::Duration::from_millis(50);
    let mut evictions = Evictions::default();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => {
                accept_backoff = std::time::Duration::from_millis(50);
                accepted
            }
            Err(e) => {
                // Out of descriptors (EMFILE) and the like: wait instead of spinning.
                debug!("accept: {e}; retrying in {} ms", accept_backoff.as_millis());
                tokio::time::sleep(accept_backoff).await;
                accept_backoff = (accept_backoff * 2).min(std::time::Duration::from_secs(1));
                continue;
            }
        };
        // No connection here is ever busy (an answer is made at once), so there is always room.
        let admitted = lock(&slots).admit(peer.ip(), Instant::now(), MAX_CONNECTIONS);
        let Some((id, close, evicted)) = admitted else { continue };
        spawn_connection(stream, id, close, &metrics, &slots, paths);
        if let Some(evicted) = evicted {
            evicted.close.notify_one();
            evictions.count(evicted.peer, listener.local_addr().ok());
            until_closed(|| lock(&slots).closing()).await;
        }
    }
}

/// Serve one connection in a task of its own.
fn spawn_connection<E: Exposition + ?Sized + Send + Sync + 'static>(
    stream: tokio::net::TcpStream,
    id: u64,
    close: Arc<tokio::sync::Notify>,
    metrics: &Arc<E>,
    slots: &Arc<Mutex<Slots>>,
    paths: Paths,
) {
    let (metrics, slots) = (metrics.clone(), slots.clone());
    tokio::spawn(async move {
        let _release = Release(slots, id);
        let service = hyper::service::service_fn(move |req| {
            let answer = answer(&req, &*metrics, paths);
            async move { Ok::<_, std::convert::Infallible>(answer) }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        // The head must arrive within the time; one request per connection
        // (a slot is held per connection); the smallest buffer hyper takes.
        builder.timer(TokioTimer::new()).header_read_timeout(REQUEST_TIMEOUT).keep_alive(false).max_buf_size(8192);
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        tokio::select! {
            _ = tokio::time::timeout(REQUEST_TIMEOUT, connection) => {}
            () = close.notified() => {}
        }
    });
}

fn lock(slots: &Mutex<Slots>) -> std::sync::MutexGuard<'_, Slots> {
    slots.lock().unwrap_or_else(|e| e.into_inner())
}

/// Frees a connection's slot when its task ends, however it ends.
struct Release(Arc<Mutex<Slots>>, u64);

impl Drop for Release {
    fn drop(&mut self) {
        lock(&self.0).release(self.1);
    }
}

/// Connections closed to make room, told in the log at most once per [`EVICTION_WARNING`].
#[derive(Default)]
struct Evictions {
    since_warned: u64,
    warned: Option<Instant>,
}

impl Evictions {
    fn count(&mut self, peer: std::net::IpAddr, addr: Option<SocketAddr>) {
        self.since_warned += 1;
        if self.warned.is_none_or(|at| at.elapsed() >= EVICTION_WARNING) {
            let addr = addr.map(|a| a.to_string()).unwrap_or_default();
            warn!(
                %addr,
                %peer,
                closed = self.since_warned,
                "{MAX_CONNECTIONS} connections open, the most from {peer}: closed its longest waiting to make room (a client holding connections open?)"
            );
            self.since_warned = 0;
            self.warned = Some(Instant::now());
        }
    }
}

/// The answer to one request: [`Exposition::respond`] for a GET of one of
/// `paths`, 404 for another path, 405 for another method.
fn answer<E: Exposition + ?Sized, B>(req: &Request<B>, metrics: &E, paths: Paths) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    let (code, content_type, body) = if req.method() != Method::GET {
        (405, "text/plain", "only GET\n".into())
    } else if paths == Paths::Probes && !matches!(path, "/healthz" | "/readyz" | "/status") {
        (404, "text/plain", "not found (/metrics is on the metrics port)\n".into())
    } else {
        metrics.respond(path)
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition() {
        let m = Metrics::default();
        assert!(!m.render().contains("drafs_time_to_ready_seconds"));
        m.tree_published(false, 3, &["claim gpu: not allocated".into()]);
        assert_eq!(m.respond("/readyz").0, 503);
        assert!(m.respond("/readyz").2.contains("not allocated"));
        m.tree_published(true, 50, &[]);
        m.api_error(Some(500));
        m.api_error(Some(500));
        m.api_error(None);
        m.watch_restarted();
        let text = m.render();
        assert!(text.contains("drafs_time_to_ready_seconds "), "{text}");
        assert!(text.contains("drafs_tree_updates_total 2\n"));
        assert!(text.contains("drafs_api_errors_total{code=\"500\"} 2\n"));
        assert!(text.contains("drafs_api_errors_total{code=\"none\"} 1\n"));
        assert!(text.contains("drafs_values_served 50\n"));
        assert!(text.contains("drafs_watch_restarts_total 1\n"));
        assert!(text.contains("# TYPE drafs_ready gauge\ndrafs_ready 1\n"));
        assert_eq!(m.respond("/readyz").0, 200);
        assert_eq!(m.respond("/healthz").0, 200);
        assert_eq!(m.respond("/nope").0, 404);
        // Every endpoint says which drafs answers.
        let (_, _, body) = m.respond("/metrics");
        let version = format!("drafs_build_info{{version=\"{}\",revision=\"", env!("CARGO_PKG_VERSION"));
        assert!(body.contains("# TYPE drafs_build_info gauge\n") && body.contains(&version), "{body}");
        assert!(body.lines().any(|l| l.starts_with("drafs_build_info{") && l.ends_with("\"} 1")), "{body}");
        // And the process's own figures, under the names every Prometheus client uses.
        assert!(body.contains("# TYPE process_open_fds gauge\n"), "{body}");
    }

    struct Answers;

    impl Exposition for Answers {
        fn text(&self) -> String {
            "up 1\n".into()
        }
        fn unready_reason(&self) -> Option<String> {
            None
        }
    }

    /// GET `path` from a socket bound to `from`, within the kubelet's default probe timeout (1 s).
    async fn probe(addr: SocketAddr, from: &str, path: &str) -> Result<String, String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let exchange = async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(format!("{from}:0").parse().unwrap())?;
            let mut stream = socket.connect(addr).await?;
            stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        };
        match tokio::time::timeout(std::time::Duration::from_secs(1), exchange).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer within 1 s".into()),
        }
    }

    /// Any pod that reaches the port holds 64 idle connections, opening each
    /// again as soon as it closes: the kubelet's probes, from another
    /// address, are still answered every time (they timed out 18 times in 19
    /// when the port stopped accepting at its limit).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn probes_are_answered_while_a_flood_holds_every_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_paths(listener, Arc::new(Answers), Paths::Probes));
        let opened = Arc::new(AtomicU64::new(0));
        let mut flood = tokio::task::JoinSet::new();
        for _ in 0..64 {
            let opened = opened.clone();
            flood.spawn(async move {
                use tokio::io::AsyncReadExt;
                loop {
                    if let Ok(mut idle) = tokio::net::TcpStream::connect(addr).await {
                        opened.fetch_add(1, Ordering::Relaxed);
                        let _ = idle.read(&mut [0u8; 1]).await;
                    }
                }
            });
        }
        while opened.load(Ordering::Relaxed) < 2 * MAX_CONNECTIONS as u64 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        for i in 0..10 {
            let answer = probe(addr, "127.0.0.2", "/healthz").await.unwrap_or_else(|e| panic!("probe {i}: {e}"));
            assert!(answer.starts_with("HTTP/1.1 200"), "probe {i}: {answer}");
        }
        let readyz = probe(addr, "127.0.0.2", "/readyz").await.unwrap();
        assert!(readyz.starts_with("HTTP/1.1 200"), "{readyz}");
        let metrics = probe(addr, "127.0.0.2", "/metrics").await.unwrap();
        assert!(metrics.starts_with("HTTP/1.1 404"), "the probe port serves no metrics: {metrics}");
        flood.abort_all();
    }

    #[test]
    fn device_health_is_one_hot_per_device_the_kubelet_reports_on() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/offline/unhealthy-gpu.yaml"));
        let objects = crate::model::objects::FileObjects::parse("unhealthy-gpu.yaml", &text.unwrap()).unwrap();
        let snapshot = objects.into_snapshot("unhealthy-gpu.yaml", None).unwrap();
        let res = crate::model::resolve::resolve(&snapshot, &Default::default());
        let m = Metrics::default();
        m.device_health(&res);
        let text = m.render();
        let gpu3 = r#"claim="gpus",request="gpu",index="1",driver="gpu.nvidia.com",pool="gpu-node-7",device="gpu-3""#;
        assert!(text.contains(&format!("drafs_device_health{{{gpu3},state=\"Unhealthy\"}} 1\n")), "{text}");
        assert!(text.contains(&format!("drafs_device_health{{{gpu3},state=\"Healthy\"}} 0\n")), "{text}");
        assert_eq!(text.lines().filter(|l| l.starts_with("drafs_device_health{")).count(), 6, "{text}");
    }
}
