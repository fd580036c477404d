//! `drafs webhook`: the admission webhook server (TLS, HTTP/1.1).
//!
//! The decisions are in [`crate::admission`]; this is the I/O around them: a
//! TLS listener whose certificate follows its files (cert-manager rotates
//! them in place), bounded connections and bodies, `POST /mutate`, `GET
//! /healthz` and `GET /readyz`, metrics, and a drain on shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::admission;
use crate::metrics::Exposition;

/// An AdmissionReview larger than this is refused (the API server's own
/// request limit is 3 MiB per object; a review carries at most two).
pub const MAX_BODY: usize = 8 << 20;
/// Connections served at once; more wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 256;
/// A TLS handshake must finish, and a request head arrive (also on an idle
/// kept-alive connection), within this time.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(15);
/// A whole review (body read, decision) within this time: the API server waits
/// at most 10 s (the configuration's timeoutSeconds) anyway.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the certificate files are checked for a change.
pub const CERT_CHECK: Duration = Duration::from_secs(2);
/// How long in-flight reviews may take to finish after SIGTERM.
pub const DRAIN: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct Config {
    pub addr: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub image: String,
    pub metrics_addr: Option<SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0}: no PEM certificate in it")]
    NoCertificate(PathBuf),
    #[error("{0}: no PEM private key in it (PKCS#8, PKCS#1 or SEC1)")]
    NoKey(PathBuf),
    #[error("{0}: {1}")]
    BadKey(PathBuf, rustls::Error),
    #[error("{cert} and {key} do not belong together: {source}")]
    Mismatch { cert: PathBuf, key: PathBuf, source: rustls::Error },
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("TLS certificate: {0}")]
    Cert(#[from] CertError),
    #[error("cannot listen on {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error("--metrics-addr {0}: {1}")]
    MetricsBind(SocketAddr, std::io::Error),
    #[error("TLS setup: {0}")]
    Tls(rustls::Error),
}

/// The certificate and key files, and what they were when last read.
#[derive(Debug, Clone)]
struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
}

/// What identifies a file's content without reading it: a rotation (a new
/// file renamed into place, or a symlink swapped) changes one of these.
type Stamp = Option<(u64, u64, SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.modified().ok()?, m.len()))
}

impl CertFiles {
    fn stamps(&self) -> (Stamp, Stamp) {
        (stamp(&self.cert), stamp(&self.key))
    }

    fn load(&self) -> Result<Arc<CertifiedKey>, CertError> {
        let cert_pem = std::fs::read(&self.cert).map_err(|e| CertError::Read(self.cert.clone(), e))?;
        let key_pem = std::fs::read(&self.key).map_err(|e| CertError::Read(self.key.clone(), e))?;
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(&cert_pem).filter_map(Result::ok).collect();
        if chain.is_empty() {
            return Err(CertError::NoCertificate(self.cert.clone()));
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| CertError::NoKey(self.key.clone()))?;
        let provider = rustls::crypto::ring::default_provider();
        let certified = CertifiedKey::from_der(chain, key, &provider).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => {
                CertError::Mismatch { cert: self.cert.clone(), key: self.key.clone(), source: e }
            }
            other => CertError::BadKey(self.key.clone(), other),
        })?;
        Ok(Arc::new(certified))
    }
}

/// The certificate served, swapped when the files change.
#[derive(Debug)]
struct CurrentCert(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().ok().map(|c| c.clone())
    }
}

/// Counters and the latency histogram of the reviews.
#[derive(Debug, Default)]
pub struct WebhookMetrics {
    /// Reviews by verdict: allowed, patched, denied, bad_request.
    reviews: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Cumulative counts per bucket of [`BUCKETS`], then the sum in microseconds.
    latency: Mutex<([u64; BUCKETS.len()], u64, u64)>,
    cert_reloads: AtomicU64,
    cert_errors: AtomicU64,
    draining: AtomicBool,
}

/// Latency buckets, in seconds.
const BUCKETS: [f64; 9] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0, 10.0];

impl WebhookMetrics {
    fn review(&self, verdict: &'static str, took: Duration) {
        if let Ok(mut m) = self.reviews.lock() {
            *m.entry(verdict).or_default() += 1;
        }
        if let Ok(mut l) = self.latency.lock() {
            let secs = took.as_secs_f64();
            for (i, bound) in BUCKETS.iter().enumerate() {
                if secs <= *bound {
                    l.0[i] += 1;
                }
            }
            l.1 += 1;
            l.2 += took.as_micros() as u64;
        }
    }

    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let reviews = self.reviews.lock().map(|m| m.clone()).unwrap_or_default();
        let _ = writeln!(
            out,
            "# HELP drafs_webhook_reviews_total Admission reviews answered, by verdict.\n# TYPE drafs_webhook_reviews_total counter"
        );
        for (verdict, n) in reviews {
            let _ = writeln!(out, "drafs_webhook_reviews_total{{verdict=\"{verdict}\"}} {n}");
        }
        let (buckets, count, sum_us) = self.latency.lock().map(|l| *l).unwrap_or_default();
        let _ = writeln!(
            out,
            "# HELP drafs_webhook_review_seconds Time to answer a review, from its request head to its response.\n# TYPE drafs_webhook_review_seconds histogram"
        );
        for (bound, n) in BUCKETS.iter().zip(buckets) {
            let _ = writeln!(out, "drafs_webhook_review_seconds_bucket{{le=\"{bound}\"}} {n}");
        }
        let _ = writeln!(out, "drafs_webhook_review_seconds_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "drafs_webhook_review_seconds_sum {:.6}", sum_us as f64 / 1e6);
        let _ = writeln!(out, "drafs_webhook_review_seconds_count {count}");
        for (name, help, value) in [
            (
                "drafs_webhook_cert_reloads_total",
                "Certificates reloaded after their files changed.",
                &self.cert_reloads,
            ),
            (
                "drafs_webhook_cert_errors_total",
                "Changed certificate files that could not be loaded (the previous certificate stays).",
                &self.cert_errors,
            ),
        ] {
            let _ =
                writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", value.load(Ordering::Relaxed));
        }
        out
    }

    fn is_ready(&self) -> bool {
        !self.draining.load(Ordering::Relaxed)
    }
}

impl Exposition for WebhookMetrics {
    fn respond(&self, path: &str) -> (u16, &'static str, String) {
        match path {
            "/metrics" => (200, "text/plain; version=0.0.4", self.render()),
            "/healthz" => (200, "text/plain", "ok\n".into()),
            "/readyz" if self.is_ready() => (200, "text/plain", "ready\n".into()),
            "/readyz" => (503, "text/plain", "not ready: shutting down\n".into()),
            _ => (404, "text/plain", "not found\n".into()),
        }
    }
}

/// What every connection shares.
struct State {
    image: String,
    metrics: Arc<WebhookMetrics>,
}

fn text(code: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = code;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain"));
    r
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let response = match (req.method(), path.as_str()) {
        (&Method::POST, "/mutate") => {
            let started = Instant::now();
            let (response, verdict) = match tokio::time::timeout(REVIEW_TIMEOUT, mutate(&state, req)).await {
                Ok(answer) => answer,
                Err(_) => (text(StatusCode::REQUEST_TIMEOUT, "request body not received in time\n"), "bad_request"),
            };
            state.metrics.review(verdict, started.elapsed());
            response
        }
        (_, "/mutate") => text(StatusCode::METHOD_NOT_ALLOWED, "POST an AdmissionReview to /mutate\n"),
        (&Method::GET, "/healthz" | "/readyz") => {
            let (code, _, body) = state.metrics.respond(&path);
            text(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body)
        }
        _ => text(StatusCode::NOT_FOUND, "not found: the webhook answers POST /mutate, GET /healthz, GET /readyz\n"),
    };
    Ok(response)
}

/// Read the review (bounded), decide, answer.
async fn mutate(state: &State, req: Request<Incoming>) -> (Response<Full<Bytes>>, &'static str) {
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            let msg = format!("AdmissionReview larger than {MAX_BODY} bytes\n");
            return (text(StatusCode::PAYLOAD_TOO_LARGE, msg), "bad_request");
        }
        Err(e) => {
            return (text(StatusCode::BAD_REQUEST, format!("cannot read the request body: {e}\n")), "bad_request");
        }
    };
    match admission::review(&body, &state.image) {
        Ok((answer, verdict)) => {
            if let admission::Verdict::Denied { message } = &verdict {
                info!("denied: {message}");
            }
            let bytes = serde_json::to_vec(&answer).expect("a JSON value serializes");
            let mut r = Response::new(Full::new(Bytes::from(bytes)));
            r.headers_mut()
                .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
            (r, verdict.label())
        }
        Err(e) => {
            debug!("bad request: {e}");
            (text(StatusCode::BAD_REQUEST, format!("{e}\n")), "bad_request")
        }
    }
}

/// Check the certificate files every [`CERT_CHECK`]; load them when they
/// changed, and keep the previous certificate if the new one is unusable
/// (cert-manager may write the two files one after the other).
async fn follow_certs(files: CertFiles, current: Arc<CurrentCert>, metrics: Arc<WebhookMetrics>) {
    let mut last = files.stamps();
    loop {
        tokio::time::sleep(CERT_CHECK).await;
        let now = files.stamps();
        if now == last {
            continue;
        }
        // A file that does not load is tried again at its next change.
        last = now;
        match files.load() {
            Ok(cert) => {
                if let Ok(mut c) = current.0.write() {
                    *c = cert;
                }
                metrics.cert_reloads.fetch_add(1, Ordering::Relaxed);
                info!(cert = %files.cert.display(), "certificate reloaded");
            }
            Err(e) => {
                metrics.cert_errors.fetch_add(1, Ordering::Relaxed);
                warn!("certificate files changed but cannot be used, keeping the previous one: {e}");
            }
        }
    }
}

/// A bound webhook, ready to serve (bind errors and bad certificates are
/// reported before anything is served).
pub struct Webhook {
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    files: CertFiles,
    current: Arc<CurrentCert>,
    state: Arc<State>,
    metrics_listener: Option<TcpListener>,
}

impl Webhook {
    pub async fn bind(config: &Config) -> Result<Self, WebhookError> {
        let files = CertFiles { cert: config.cert.clone(), key: config.key.clone() };
        let current = Arc::new(CurrentCert(RwLock::new(files.load()?)));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(WebhookError::Tls)?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let listener = TcpListener::bind(config.addr).await.map_err(|e| WebhookError::Bind(config.addr, e))?;
        let metrics_listener = match config.metrics_addr {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(|e| WebhookError::MetricsBind(addr, e))?),
            None => None,
        };
        let metrics = Arc::new(WebhookMetrics::default());
        Ok(Webhook {
            listener,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(tls)),
            files,
            current,
            state: Arc::new(State { image: config.image.clone(), metrics }),
            metrics_listener,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn metrics(&self) -> Arc<WebhookMetrics> {
        self.state.metrics.clone()
    }

    /// Serve until `shutdown` resolves; then stop accepting, report not
    /// ready, and let in-flight reviews finish (at most [`DRAIN`]).
    pub async fn serve(self, shutdown: impl std::future::Future<Output = ()>) {
        let Webhook { listener, acceptor, files, current, state, metrics_listener } = self;
        info!(addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), image = %state.image, "webhook listening");
        let reloader = tokio::spawn(follow_certs(files, current, state.metrics.clone()));
        let metrics_server = metrics_listener.map(|l| tokio::spawn(crate::metrics::serve(l, state.metrics.clone())));
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let mut accept_backoff = Duration::from_millis(50);
        tokio::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                _ = &mut shutdown => break,
                permit = permits.clone().acquire_owned() => match permit { Ok(p) => p, Err(_) => break },
            };
            let (tcp, peer) = tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok(a) => { accept_backoff = Duration::from_millis(50); a }
                    Err(e) => {
                        debug!("accept: {e}; retrying in {} ms", accept_backoff.as_millis());
                        tokio::time::sleep(accept_backoff).await;
                        accept_backoff = (accept_backoff * 2).min(Duration::from_secs(1));
                        continue;
                    }
                },
            };
            let acceptor = acceptor.clone();
            let state = state.clone();
            let watcher = graceful.watcher();
            tokio::spawn(async move {
                let _permit = permit;
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => return debug!(%peer, "TLS handshake failed: {e}"),
                    Err(_) => return debug!(%peer, "TLS handshake timed out"),
                };
                let service = hyper::service::service_fn(move |req| handle(state.clone(), req));
                let mut builder = hyper::server::conn::http1::Builder::new();
                builder.timer(TokioTimer::new()).header_read_timeout(IDLE_TIMEOUT).max_buf_size(64 << 10);
                let conn = builder.serve_connection(TokioIo::new(tls), service);
                if let Err(e) = watcher.watch(conn).await {
                    debug!(%peer, "connection: {e}");
                }
            });
        }
        state.metrics.draining.store(true, Ordering::Relaxed);
        info!("shutting down: finishing the reviews in flight");
        drop(listener);
        if tokio::time::timeout(DRAIN, graceful.shutdown()).await.is_err() {
            warn!("reviews still in flight after {} s; stopping anyway", DRAIN.as_secs());
        }
        reloader.abort();
        if let Some(m) = metrics_server {
            m.abort();
        }
    }
}
