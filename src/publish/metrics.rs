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
use tracing::{debug, info};

use crate::model::health::HealthState;
use crate::model::resolve::Resolution;
use crate::publish::prometheus::{self, Kind, Text};

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

    /// (status, content type, body) for a GET of `path`.
    fn respond(&self, path: &str) -> (u16, &'static str, String) {
        match path {
            "/metrics" => (200, prometheus::CONTENT_TYPE, self.text()),
            "/healthz" => (200, "text/plain", "ok\n".into()),
            "/readyz" => match self.unready_reason() {
                None => (200, "text/plain", "ready\n".into()),
                Some(reason) => (503, "text/plain", format!("not ready: {reason}\n")),
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

/// Connections served at once; more wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 32;
/// A request must arrive whole, and its answer leave, within this time (a
/// client that trickles bytes cannot keep a connection).
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Answer until the task is dropped. Bounded in connections and time, so a
/// flood of slow or idle clients costs a fixed amount of memory and descriptors
/// and can never starve the tree's writes of them.
pub async fn serve<E: Exposition + ?Sized + 'static>(listener: TcpListener, metrics: Arc<E>) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut accept_backoff = std::time::Duration::from_millis(50);
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((s, _)) => {
                accept_backoff = std::time::Duration::from_millis(50);
                s
            }
            Err(e) => {
                // Out of descriptors (EMFILE) and the like: wait instead of spinning.
                debug!("accept: {e}; retrying in {} ms", accept_backoff.as_millis());
                tokio::time::sleep(accept_backoff).await;
                accept_backoff = (accept_backoff * 2).min(std::time::Duration::from_secs(1));
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req| {
                let answer = answer(&req, &*metrics);
                async move { Ok::<_, std::convert::Infallible>(answer) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            // The head must arrive within the time; one request per connection
            // (a permit is held per connection); the smallest buffer hyper takes.
            builder.timer(TokioTimer::new()).header_read_timeout(REQUEST_TIMEOUT).keep_alive(false).max_buf_size(8192);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, connection).await;
        });
    }
}

/// The answer to one request: [`Exposition::respond`] for a GET, 405 otherwise.
fn answer<E: Exposition + ?Sized, B>(req: &Request<B>, metrics: &E) -> Response<Full<Bytes>> {
    let (code, content_type, body) = if req.method() == Method::GET {
        metrics.respond(req.uri().path())
    } else {
        (405, "text/plain", "only GET\n".into())
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
