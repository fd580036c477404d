//! `drafs webhook`: the admission webhook server (TLS, HTTP/1.1).
//!
//! The decisions are in [`crate::admission::decision`]; this is the I/O around them: a
//! TLS listener whose certificate follows its files (cert-manager rotates
//! them in place, and a renewal that is expired, not yet valid or not for
//! `--dns-name` is refused), bounded connections and bodies, `POST /mutate`,
//! `GET /healthz` and `GET /readyz`, metrics, and a drain on shutdown.
//!
//! With `failurePolicy: Fail`, a webhook that does not answer stops labelled
//! pods from being created, so nothing a client does may lock others out:
//! idle connections make room for new ones ([`Slots`]), a large review is
//! read and decided one at a time on a thread of lower priority (small ones
//! are answered meanwhile), and on SIGTERM the port stays open for the drain.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpListener;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tracing::{debug, info, warn};

use crate::admission::contain::contain;
use crate::admission::decision::{self as admission, OptIn};
use crate::admission::inject::Mode;
use crate::publish::metrics::Exposition;

/// An AdmissionReview larger than this is refused. The API server's request
/// limit (3 MiB) bounds what a client sends, not the review: the pod comes
/// back with its defaults filled in and as JSON (a protobuf request can
/// double in size), so the bound is looser; memory is bounded by what is
/// built from the review ([`admission::MAX_TREE`]), not by this.
pub const MAX_BODY: usize = 8 << 20;
/// Reviews larger than this are read and decided one at a time, on their
/// own thread; smaller ones (a pod of 40 containers is 38 KB) on the
/// connection's task.
pub const SMALL_BODY: usize = 64 << 10;
/// Connections served at once; a new one beyond closes the one that has
/// waited on its client longest ([`Slots`]).
pub const MAX_CONNECTIONS: usize = 256;
/// A TLS handshake must finish within this time: the API server waits at
/// most 5 s (the configuration's timeoutSeconds) for a whole review.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A request head must arrive within this time (also on an idle kept-alive connection).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(15);
/// A review's body must arrive within this time: the API server waits at
/// most 10 s (the configuration's timeoutSeconds) anyway.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the certificate files are checked for a change.
pub const CERT_CHECK: Duration = Duration::from_secs(2);
/// After the drain, how long the reviews in flight may take to finish.
pub const FINISH: Duration = REVIEW_TIMEOUT;

#[derive(Debug, Clone)]
pub struct Config {
    pub addr: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub image: String,
    pub metrics_addr: Option<SocketAddr>,
    /// After SIGTERM, how long to go on accepting and answering (with
    /// `/readyz` at 503) before closing the port.
    pub drain: Duration,
    /// Names the serving certificate must be valid for (the Service's DNS
    /// name); a certificate that is not is refused.
    pub dns_names: Vec<String>,
    /// The mode a pod without the label gets in a namespace labelled
    /// `drafs.dev/inject=enabled` (`POST /mutate/namespace`).
    pub namespace_mode: Mode,
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
    #[error("{0}: certificate {1} is not a readable X.509 certificate")]
    Unreadable(PathBuf, usize),
    #[error("{0}: certificate {1} expired at {2}")]
    Expired(PathBuf, usize, jiff::Timestamp),
    #[error("{0}: certificate {1} is not valid before {2}")]
    NotYetValid(PathBuf, usize, jiff::Timestamp),
    #[error("{0}: not valid for {1} (--dns-name); its DNS names: {2}")]
    WrongName(PathBuf, String, String),
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("TLS certificate: {0}")]
    Cert(#[from] CertError),
    #[error("--dns-name {0:?} is not a DNS name or IP address")]
    BadName(String),
    #[error("cannot listen on {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error("--metrics-addr {0}: {1}")]
    MetricsBind(SocketAddr, std::io::Error),
    #[error("TLS setup: {0}")]
    Tls(rustls::Error),
    #[error("cannot start the large-review thread: {0}")]
    Thread(std::io::Error),
}

/// The certificate and key files, and the names the certificate must cover.
#[derive(Debug, Clone)]
struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    names: Vec<ServerName<'static>>,
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

    /// The certificate and key, if they belong together and the chain can be
    /// served now: every certificate within its validity period, the first
    /// one valid for every expected name.
    fn load(&self, now: SystemTime) -> Result<Arc<CertifiedKey>, CertError> {
        let cert_pem = std::fs::read(&self.cert).map_err(|e| CertError::Read(self.cert.clone(), e))?;
        let key_pem = std::fs::read(&self.key).map_err(|e| CertError::Read(self.key.clone(), e))?;
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(&cert_pem).filter_map(Result::ok).collect();
        if chain.is_empty() {
            return Err(CertError::NoCertificate(self.cert.clone()));
        }
        check_chain(&chain, &self.names, now).map_err(|p| p.at(&self.cert))?;
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

/// What is wrong with a certificate chain (numbered from 1, the serving certificate).
#[derive(Debug, PartialEq, Eq)]
enum ChainProblem {
    Unreadable(usize),
    Expired(usize, i64),
    NotYetValid(usize, i64),
    WrongName(String, Vec<String>),
}

impl ChainProblem {
    fn at(self, cert: &Path) -> CertError {
        let time = |s: i64| jiff::Timestamp::from_second(s).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
        let cert = cert.to_path_buf();
        match self {
            ChainProblem::Unreadable(n) => CertError::Unreadable(cert, n),
            ChainProblem::Expired(n, at) => CertError::Expired(cert, n, time(at)),
            ChainProblem::NotYetValid(n, at) => CertError::NotYetValid(cert, n, time(at)),
            ChainProblem::WrongName(name, has) => {
                let has = if has.is_empty() { "none".to_string() } else { has.join(", ") };
                CertError::WrongName(cert, name, has)
            }
        }
    }
}

/// Whether `chain` can be served at `now` to clients asking for `names`.
fn check_chain(chain: &[CertificateDer], names: &[ServerName], now: SystemTime) -> Result<(), ChainProblem> {
    let now = match now.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(_) => 0,
    };
    for (n, cert) in chain.iter().enumerate().map(|(i, c)| (i + 1, c)) {
        let (not_before, not_after) = validity(cert).ok_or(ChainProblem::Unreadable(n))?;
        if now > not_after {
            return Err(ChainProblem::Expired(n, not_after));
        }
        if now < not_before {
            return Err(ChainProblem::NotYetValid(n, not_before));
        }
    }
    let leaf = webpki::EndEntityCert::try_from(&chain[0]).map_err(|_| ChainProblem::Unreadable(1))?;
    for name in names {
        if leaf.verify_is_valid_for_subject_name(name).is_err() {
            let has = leaf.valid_dns_names().map(str::to_string).collect();
            return Err(ChainProblem::WrongName(name.to_str().into_owned(), has));
        }
    }
    Ok(())
}

/// The validity period (notBefore, notAfter) of a DER X.509 certificate, in
/// Unix seconds (RFC 5280 4.1: the fifth field of the TBSCertificate).
pub(crate) fn validity(der: &[u8]) -> Option<(i64, i64)> {
    let (certificate, _) = der_take(der, 0x30)?;
    let (tbs, _) = der_take(certificate, 0x30)?;
    let mut fields = tbs;
    if fields.first() == Some(&0xa0) {
        fields = der_take(fields, 0xa0)?.1; // [0] version
    }
    for tag in [0x02, 0x30, 0x30] {
        fields = der_take(fields, tag)?.1; // serialNumber, signature, issuer
    }
    let (validity, _) = der_take(fields, 0x30)?;
    let (not_before, rest) = der_time(validity)?;
    let (not_after, _) = der_time(rest)?;
    Some((not_before, not_after))
}

/// The contents of the DER element at the start of `input` if it has this
/// tag, and what follows it.
fn der_take(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&found, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    if found != tag {
        return None;
    }
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (len, rest) = rest.split_at(n);
        (len.iter().fold(0usize, |acc, b| (acc << 8) | usize::from(*b)), rest)
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// A DER UTCTime or GeneralizedTime (`YYMMDDHHMMSSZ`, `YYYYMMDDHHMMSSZ`) in
/// Unix seconds, and what follows it.
fn der_time(input: &[u8]) -> Option<(i64, &[u8])> {
    let tag = *input.first()?;
    let (text, rest) = der_take(input, tag)?;
    let digits = text.strip_suffix(b"Z")?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let number = |d: &[u8]| d.iter().fold(0i16, |acc, b| acc * 10 + i16::from(b - b'0'));
    let (year, rest_digits) = match (tag, digits.len()) {
        // RFC 5280 4.1.2.5.1: two-digit years are 1950 to 2049.
        (0x17, 12) => {
            let yy = number(&digits[..2]);
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &digits[2..])
        }
        (0x18, 14) => (number(&digits[..4]), &digits[4..]),
        _ => return None,
    };
    let pair = |i: usize| i8::try_from(number(&rest_digits[i..i + 2])).ok();
    let date = jiff::civil::Date::new(year, pair(0)?, pair(2)?).ok()?;
    let time = jiff::civil::Time::new(pair(4)?, pair(6)?, pair(8)?, 0).ok()?;
    let at = jiff::tz::TimeZone::UTC.to_timestamp(date.to_datetime(time)).ok()?;
    Some((at.as_second(), rest))
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
    evictions: AtomicU64,
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
                "Changed certificate files that could not be loaded or were refused (expired, not yet valid, not for --dns-name); the previous certificate stays.",
                &self.cert_errors,
            ),
            (
                "drafs_webhook_connections_evicted_total",
                "Connections closed at the connection limit because they had waited on their client longest.",
                &self.evictions,
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

/// The connections being served, for the connection limit. At the limit, a
/// new connection closes the one that has waited on its client longest: a
/// TLS handshake not finished, a kept-alive connection between requests, a
/// request body still arriving. So idle or slow clients cannot lock others
/// out; a connection whose review is being decided is never closed.
#[derive(Debug, Default)]
struct Slots {
    next: u64,
    /// By id: since when the connection waits on its client (None: busy
    /// deciding), and how to tell it to close.
    open: BTreeMap<u64, (Option<Instant>, Arc<Notify>)>,
}

/// A connection admitted: its id, how it is told to close, and the
/// connection it replaces (to be told to close), if any.
type Admitted = (u64, Arc<Notify>, Option<Arc<Notify>>);

impl Slots {
    /// Room for a connection accepted at `now`, or None when `limit`
    /// connections are all busy (wait for one to end).
    fn admit(&mut self, now: Instant, limit: usize) -> Option<Admitted> {
        let evicted = if self.open.len() >= limit {
            let (_, oldest) = self.open.iter().filter_map(|(id, (since, _))| since.map(|s| (s, *id))).min()?;
            self.open.remove(&oldest).map(|(_, close)| close)
        } else {
            None
        };
        let id = self.next;
        self.next += 1;
        let close = Arc::new(Notify::new());
        self.open.insert(id, (Some(now), close.clone()));
        Some((id, close, evicted))
    }

    /// The connection is deciding a review (`busy`), or waits on its client again.
    fn set_busy(&mut self, id: u64, busy: bool, now: Instant) {
        if let Some((since, _)) = self.open.get_mut(&id) {
            *since = if busy { None } else { Some(now) };
        }
    }

    fn is_busy(&self, id: u64) -> bool {
        self.open.get(&id).is_some_and(|(since, _)| since.is_none())
    }

    fn release(&mut self, id: u64) {
        self.open.remove(&id);
    }
}

/// A large review to decide, with what to do with the answer.
type LargeJob = Box<dyn FnOnce() + Send>;

/// The thread large reviews are decided on, one at a time (they hold the
/// large-review permit), at nice 10: when the CPUs are busy, the thread that
/// accepts connections and answers small reviews goes first.
fn large_review_thread() -> std::io::Result<std::sync::mpsc::Sender<LargeJob>> {
    let (jobs, queue) = std::sync::mpsc::channel::<LargeJob>();
    std::thread::Builder::new().name("drafs-large-reviews".into()).spawn(move || {
        // Linux: the nice value is per thread; lowering it needs no privilege.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::id_t;
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, 10) } != 0 {
            debug!("cannot lower the large-review thread's priority: {}", std::io::Error::last_os_error());
        }
        for job in queue {
            job();
        }
    })?;
    Ok(jobs)
}

/// What every connection shares.
struct State {
    image: String,
    namespace_mode: Mode,
    metrics: Arc<WebhookMetrics>,
    slots: Mutex<Slots>,
    /// Told when a connection ends (the accept loop may be waiting for room).
    freed: Notify,
    /// One large review at a time (see [`SMALL_BODY`]).
    large: Arc<Semaphore>,
    large_jobs: std::sync::mpsc::Sender<LargeJob>,
}

impl State {
    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Ends a connection's slot when its task ends, however it ends.
struct Release(Arc<State>, u64);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.slots().release(self.1);
        self.0.freed.notify_waiters();
    }
}

fn text(code: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = code;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain"));
    r
}

async fn handle(state: Arc<State>, id: u64, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let mut response = match (req.method(), path.as_str()) {
        (&Method::POST, "/mutate" | "/mutate/namespace") => {
            let opt_in = if path == "/mutate" { OptIn::Pod } else { OptIn::Namespace(state.namespace_mode) };
            let started = Instant::now();
            let (response, verdict) = mutate(&state, id, req, opt_in).await;
            state.slots().set_busy(id, false, Instant::now());
            state.metrics.review(verdict, started.elapsed());
            response
        }
        (_, "/mutate" | "/mutate/namespace") => {
            text(StatusCode::METHOD_NOT_ALLOWED, "POST an AdmissionReview to /mutate or /mutate/namespace\n")
        }
        (&Method::GET, "/healthz" | "/readyz") => {
            let (code, _, body) = state.metrics.respond(&path);
            text(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body)
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: the webhook answers POST /mutate, POST /mutate/namespace, GET /healthz, GET /readyz\n",
        ),
    };
    // While draining, each answer closes its connection, so that the client's
    // next request opens a new one (to a replica that is not stopping)
    // instead of racing the close at the end of the drain.
    if !state.metrics.is_ready() {
        response.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
    }
    Ok(response)
}

/// A request body of at most [`MAX_BODY`] bytes. Over [`SMALL_BODY`], it is
/// read only with the large-review permit, returned with it.
async fn read_body(
    state: &State,
    req: Request<Incoming>,
) -> Result<(Vec<u8>, Option<OwnedSemaphorePermit>), Response<Full<Bytes>>> {
    let too_large = || text(StatusCode::PAYLOAD_TOO_LARGE, format!("AdmissionReview larger than {MAX_BODY} bytes\n"));
    let declared =
        req.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY) {
        return Err(too_large());
    }
    let mut permit = None;
    if declared.is_some_and(|n| n > SMALL_BODY) {
        permit = state.large.clone().acquire_owned().await.ok();
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(0).min(MAX_BODY));
    let mut incoming = req.into_body();
    while let Some(frame) = incoming.frame().await {
        let frame = frame.map_err(|e| text(StatusCode::BAD_REQUEST, format!("cannot read the request body: {e}\n")))?;
        let Ok(data) = frame.into_data() else { continue };
        if body.len() + data.len() > MAX_BODY {
            return Err(too_large());
        }
        if body.len() + data.len() > SMALL_BODY && permit.is_none() {
            permit = state.large.clone().acquire_owned().await.ok();
        }
        body.extend_from_slice(&data);
    }
    Ok((body, permit))
}

/// An answer: (status, content type, body, verdict label).
type Answer = (StatusCode, &'static str, Bytes, &'static str);

/// The answer to one review body. A panic while deciding it (a bug) fails
/// this review alone: 500, counted as verdict `panicked`, and the webhook
/// keeps serving the others.
fn answer(body: &[u8], image: &str, opt_in: OptIn) -> Answer {
    contained(|| decide(body, image, opt_in))
}

fn contained(decide: impl FnOnce() -> Answer) -> Answer {
    contain(decide).unwrap_or_else(|_| {
        let message = "internal error: drafs could not decide this review (a bug, logged by the webhook)\n";
        (StatusCode::INTERNAL_SERVER_ERROR, "text/plain", Bytes::from(message), "panicked")
    })
}

fn decide(body: &[u8], image: &str, opt_in: OptIn) -> Answer {
    // Debug builds only (the tests' binary): a review holding the bytes of
    // DRAFS_TEST_PANIC_ON panics, to show that the panic stays contained.
    #[cfg(debug_assertions)]
    if let Some(marker) = std::env::var_os("DRAFS_TEST_PANIC_ON").filter(|m| !m.is_empty())
        && body.windows(marker.len()).any(|w| w == marker.as_encoded_bytes())
    {
        panic!("DRAFS_TEST_PANIC_ON matched this review");
    }
    match admission::review(body, image, opt_in) {
        Ok((answer, verdict)) => {
            if let admission::Verdict::Denied { message } = &verdict {
                info!("denied: {message}");
            }
            let bytes = serde_json::to_vec(&answer).expect("a JSON value serializes");
            (StatusCode::OK, "application/json", Bytes::from(bytes), verdict.label())
        }
        Err(e @ admission::ReviewError::Internal(_)) => {
            warn!("{e}");
            (StatusCode::INTERNAL_SERVER_ERROR, "text/plain", Bytes::from(format!("{e}\n")), "bad_request")
        }
        Err(e) => {
            debug!("bad request: {e}");
            (StatusCode::BAD_REQUEST, "text/plain", Bytes::from(format!("{e}\n")), "bad_request")
        }
    }
}

/// Read the review (bounded), decide, answer. A large review is decided on
/// the large-review thread, holding the large-review permit until its memory
/// is freed.
async fn mutate(
    state: &State,
    id: u64,
    req: Request<Incoming>,
    opt_in: OptIn,
) -> (Response<Full<Bytes>>, &'static str) {
    let (body, permit) = match tokio::time::timeout(REVIEW_TIMEOUT, read_body(state, req)).await {
        Ok(Ok(read)) => read,
        Ok(Err(response)) => return (response, "bad_request"),
        Err(_) => return (text(StatusCode::REQUEST_TIMEOUT, "request body not received in time\n"), "bad_request"),
    };
    state.slots().set_busy(id, true, Instant::now());
    let (code, content_type, bytes, verdict) = match permit {
        None => answer(&body, &state.image, opt_in),
        Some(permit) => {
            info!(bytes = body.len(), "large review: deciding it on the large-review thread");
            let image = state.image.clone();
            let (done, decided) = tokio::sync::oneshot::channel();
            let job: LargeJob = Box::new(move || {
                let _ = done.send(answer(&body, &image, opt_in));
                // The permit goes when the review's memory has been freed.
                drop(body);
                drop(permit);
            });
            let sent = state.large_jobs.send(job).is_ok();
            match decided.await {
                Ok(decided) if sent => decided,
                _ => {
                    warn!("the large-review thread is gone");
                    (StatusCode::INTERNAL_SERVER_ERROR, "text/plain", Bytes::from("internal error\n"), "bad_request")
                }
            }
        }
    };
    let mut r = Response::new(Full::new(bytes));
    *r.status_mut() = code;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    (r, verdict)
}

/// Check the certificate files every [`CERT_CHECK`]; load them when they
/// changed, and keep the previous certificate if the new one is unusable
/// (cert-manager may write the two files one after the other) or refused.
/// One not valid yet (a clock behind the issuer's) is tried again until it is.
async fn follow_certs(files: CertFiles, current: Arc<CurrentCert>, metrics: Arc<WebhookMetrics>) {
    let mut last = files.stamps();
    let mut waiting = false;
    loop {
        tokio::time::sleep(CERT_CHECK).await;
        let now = files.stamps();
        if now == last && !waiting {
            continue;
        }
        let changed = now != last;
        // A file that does not load is tried again at its next change.
        last = now;
        match files.load(SystemTime::now()) {
            Ok(cert) => {
                if let Ok(mut c) = current.0.write() {
                    *c = cert;
                }
                waiting = false;
                metrics.cert_reloads.fetch_add(1, Ordering::Relaxed);
                info!(cert = %files.cert.display(), "certificate reloaded");
            }
            Err(e) => {
                waiting = matches!(e, CertError::NotYetValid(..));
                if changed {
                    metrics.cert_errors.fetch_add(1, Ordering::Relaxed);
                    warn!("certificate files changed but cannot be used, keeping the previous one: {e}");
                }
            }
        }
    }
}

/// Serve one accepted connection until it ends, is closed to make room, or
/// the server shuts down.
async fn connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    state: Arc<State>,
    (id, close): (u64, Arc<Notify>),
    mut shutdown: watch::Receiver<bool>,
) {
    let _release = Release(state.clone(), id);
    let tls = tokio::select! {
        handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)) => match handshake {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => return debug!(%peer, "TLS handshake failed: {e}"),
            Err(_) => return debug!(%peer, "TLS handshake timed out"),
        },
        _ = close.notified() => return debug!(%peer, "connection limit: closed before its TLS handshake"),
        _ = shutdown.wait_for(|stop| *stop) => return,
    };
    state.slots().set_busy(id, false, Instant::now());
    let service_state = state.clone();
    let service = hyper::service::service_fn(move |req| handle(service_state.clone(), id, req));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(IDLE_TIMEOUT).max_buf_size(64 << 10);
    let conn = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    debug!(%peer, "connection: {e}");
                }
                return;
            }
            _ = close.notified() => {
                if !state.slots().is_busy(id) {
                    return debug!(%peer, "connection limit: closed while waiting on its client");
                }
                conn.as_mut().graceful_shutdown();
            }
            _ = shutdown.wait_for(|stop| *stop), if !closing => {
                // Idle: closed now; a request in flight is answered first.
                closing = true;
                conn.as_mut().graceful_shutdown();
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
    drain: Duration,
}

impl Webhook {
    pub async fn bind(config: &Config) -> Result<Self, WebhookError> {
        let names = config
            .dns_names
            .iter()
            .map(|n| ServerName::try_from(n.clone()).map_err(|_| WebhookError::BadName(n.clone())))
            .collect::<Result<_, _>>()?;
        let files = CertFiles { cert: config.cert.clone(), key: config.key.clone(), names };
        let current = Arc::new(CurrentCert(RwLock::new(files.load(SystemTime::now())?)));
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
        let state = State {
            image: config.image.clone(),
            namespace_mode: config.namespace_mode,
            metrics: Arc::new(WebhookMetrics::default()),
            slots: Mutex::new(Slots::default()),
            freed: Notify::new(),
            large: Arc::new(Semaphore::new(1)),
            large_jobs: large_review_thread().map_err(WebhookError::Thread)?,
        };
        Ok(Webhook {
            listener,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(tls)),
            files,
            current,
            state: Arc::new(state),
            metrics_listener,
            drain: config.drain,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn metrics(&self) -> Arc<WebhookMetrics> {
        self.state.metrics.clone()
    }

    /// Accept and serve connections until `stop` resolves.
    async fn accept_until(&self, stop: impl std::future::Future<Output = ()>, shutdown: &watch::Sender<bool>) {
        let mut accept_backoff = Duration::from_millis(50);
        tokio::pin!(stop);
        loop {
            let (tcp, peer) = tokio::select! {
                _ = &mut stop => return,
                accepted = self.listener.accept() => match accepted {
                    Ok(a) => { accept_backoff = Duration::from_millis(50); a }
                    Err(e) => {
                        debug!("accept: {e}; retrying in {} ms", accept_backoff.as_millis());
                        tokio::time::sleep(accept_backoff).await;
                        accept_backoff = (accept_backoff * 2).min(Duration::from_secs(1));
                        continue;
                    }
                },
            };
            // Answers are small and written at once: do not let Nagle hold
            // their last segment for the client's delayed ACK (40 ms).
            if let Err(e) = tcp.set_nodelay(true) {
                debug!(%peer, "TCP_NODELAY: {e}");
            }
            // Room for it: at the limit, the connection that has waited on
            // its client longest is closed; if every one is busy deciding a
            // review, wait for one to end.
            let (id, close, evicted) = loop {
                let freed = self.state.freed.notified();
                tokio::pin!(freed);
                freed.as_mut().enable();
                if let Some(admitted) = self.state.slots().admit(Instant::now(), MAX_CONNECTIONS) {
                    break admitted;
                }
                tokio::select! {
                    _ = &mut stop => return,
                    _ = freed => {}
                }
            };
            if let Some(evicted) = evicted {
                evicted.notify_one();
                self.state.metrics.evictions.fetch_add(1, Ordering::Relaxed);
            }
            tokio::spawn(connection(
                tcp,
                peer,
                self.acceptor.clone(),
                self.state.clone(),
                (id, close),
                shutdown.subscribe(),
            ));
        }
    }

    /// Serve until `shutdown` resolves; then drain: go on accepting and
    /// answering for the drain period with `/readyz` at 503 (the API server
    /// keeps calling this replica until its endpoints are updated), then
    /// close the port and let the reviews in flight finish (at most [`FINISH`]).
    pub async fn serve(mut self, shutdown: impl std::future::Future<Output = ()>) {
        info!(addr = %self.listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), image = %self.state.image, "webhook listening");
        let state = self.state.clone();
        let reloader = tokio::spawn(follow_certs(self.files.clone(), self.current.clone(), state.metrics.clone()));
        let metrics_server = self
            .metrics_listener
            .take()
            .map(|l| tokio::spawn(crate::publish::metrics::serve(l, state.metrics.clone())));
        let drain = self.drain;
        let (stop_connections, _) = watch::channel(false);
        self.accept_until(shutdown, &stop_connections).await;
        state.metrics.draining.store(true, Ordering::Relaxed);
        info!("shutting down: /readyz answers 503; reviews are answered for {} s more", drain.as_secs_f64());
        self.accept_until(tokio::time::sleep(drain), &stop_connections).await;
        drop(self);
        info!("drained: port closed, finishing the reviews in flight");
        let _ = stop_connections.send(true);
        if tokio::time::timeout(FINISH, stop_connections.closed()).await.is_err() {
            warn!("reviews still in flight after {} s; stopping anyway", FINISH.as_secs());
        }
        reloader.abort();
        if let Some(m) = metrics_server {
            m.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// For DNS:drafs-webhook.drafs-system.svc, DNS:*.example.com,
    /// IP:127.0.0.1, valid 2020-01-01 to 2030-01-01 (UTCTime).
    const CERT_2030: &str = r"-----BEGIN CERTIFICATE-----
MIIBnzCCAUSgAwIBAgICEAAwCgYIKoZIzj0EAwIwDTELMAkGA1UEAwwCY2EwHhcN
MjAwMTAxMDAwMDAwWhcNMzAwMTAxMDAwMDAwWjAPMQ0wCwYDVQQDDARsZWFmMFkw
EwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEKDWj0eufiod6/feoF6stNI0wP2Nzf7A0
pzu98nBXJZkK+8jssU0/qFk0O7jIhQami/VLHuySccYCTPVqxj0646OBkTCBjjA+
BgNVHREENzA1gh5kcmFmcy13ZWJob29rLmRyYWZzLXN5c3RlbS5zdmOCDSouZXhh
bXBsZS5jb22HBH8AAAEwDAYDVR0TAQH/BAIwADAdBgNVHQ4EFgQUtnhg6UEh5ZXj
S0jf4R1BP/X7shQwHwYDVR0jBBgwFoAUZsY/DkeO7XhuUk0e5lSeWUsbb4gwCgYI
KoZIzj0EAwIDSQAwRgIhAJnSEk3t+8g8SnpQH2VoZ+E9PHYO9tVuD8j2lHcCRlnJ
AiEAwEhhZyJOAWmuBvDnPoTqMrXPu2Pceic09DJqe3EBlkY=
-----END CERTIFICATE-----
";
    /// The same key and names, valid 2020-01-01 to 2051-01-01 (GeneralizedTime after 2049).
    const CERT_2051: &str = r"-----BEGIN CERTIFICATE-----
MIIBnzCCAUagAwIBAgICEAEwCgYIKoZIzj0EAwIwDTELMAkGA1UEAwwCY2EwIBcN
MjAwMTAxMDAwMDAwWhgPMjA1MTAxMDEwMDAwMDBaMA8xDTALBgNVBAMMBGxlYWYw
WTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAAQoNaPR65+Kh3r996gXqy00jTA/Y3N/
sDSnO73ycFclmQr7yOyxTT+oWTQ7uMiFBqaL9Use7JJxxgJM9WrGPTrjo4GRMIGO
MD4GA1UdEQQ3MDWCHmRyYWZzLXdlYmhvb2suZHJhZnMtc3lzdGVtLnN2Y4INKi5l
eGFtcGxlLmNvbYcEfwAAATAMBgNVHRMBAf8EAjAAMB0GA1UdDgQWBBS2eGDpQSHl
leNLSN/hHUE/9fuyFDAfBgNVHSMEGDAWgBRmxj8OR47teG5STR7mVJ5ZSxtviDAK
BggqhkjOPQQDAgNHADBEAiBPeuXJCKvdIHQo+UegPP/Ufk+UC3wlJn1aKz7lUUvH
hgIgcK1pwlfjGSk0j5+GieSe8WtFNTQt78EGHDUGDj3L5Uo=
-----END CERTIFICATE-----
";
    const Y2020: i64 = 1_577_836_800;
    const Y2030: i64 = 1_893_456_000;
    const Y2051: i64 = 2_556_144_000;

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    fn at(secs: i64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
    }

    fn name(n: &str) -> ServerName<'static> {
        ServerName::try_from(n.to_string()).unwrap()
    }

    #[test]
    fn validity_reads_both_time_encodings_and_never_panics() {
        assert_eq!(validity(&der(CERT_2030)), Some((Y2020, Y2030)));
        assert_eq!(validity(&der(CERT_2051)), Some((Y2020, Y2051)));
        let whole = der(CERT_2030);
        for cut in 0..whole.len() {
            assert_eq!(validity(&whole[..cut]), None, "cut at {cut}");
        }
        assert_eq!(validity(b"\x30\x84\xff\xff\xff\xff\x30"), None);
        assert_eq!(der_time(b"\x17\x0d991301000000Z"), None, "month 13");
        assert_eq!(der_time(b"\x17\x0d4912312359+9Z"), None);
        assert_eq!(der_time(b"\x17\x0d491231235959Z").map(|t| t.0), Some(2_524_607_999), "49 is 2049");
        assert_eq!(der_time(b"\x17\x0d500101000000Z").map(|t| t.0), Some(-631_152_000), "50 is 1950");
    }

    #[test]
    fn a_chain_is_served_only_within_its_dates_and_for_its_names() {
        let chain = [der(CERT_2030)];
        let names = [name("drafs-webhook.drafs-system.svc"), name("127.0.0.1"), name("x.example.com")];
        assert_eq!(check_chain(&chain, &names, at(1_700_000_000)), Ok(()));
        assert_eq!(check_chain(&chain, &[], at(Y2030 + 1)), Err(ChainProblem::Expired(1, Y2030)));
        assert_eq!(check_chain(&chain, &[], at(Y2020 - 1)), Err(ChainProblem::NotYetValid(1, Y2020)));
        assert_eq!(
            check_chain(&chain, &[name("drafs-webhook.other.svc")], at(1_700_000_000)),
            Err(ChainProblem::WrongName(
                "drafs-webhook.other.svc".into(),
                vec!["drafs-webhook.drafs-system.svc".into(), "*.example.com".into()]
            ))
        );
        assert!(matches!(
            check_chain(&chain, &[name("10.0.0.1")], at(1_700_000_000)),
            Err(ChainProblem::WrongName(..))
        ));
        // Every certificate of the chain is within its dates.
        assert_eq!(
            check_chain(&[der(CERT_2051), der(CERT_2030)], &[], at(Y2030 + 1)),
            Err(ChainProblem::Expired(2, Y2030))
        );
        assert_eq!(
            check_chain(&[CertificateDer::from(vec![0x30, 0x00])], &[], at(0)),
            Err(ChainProblem::Unreadable(1))
        );
        let message = ChainProblem::Expired(1, Y2030).at(Path::new("/tls/tls.crt")).to_string();
        assert_eq!(message, "/tls/tls.crt: certificate 1 expired at 2030-01-01T00:00:00Z");
    }

    #[test]
    fn at_the_limit_the_connection_waiting_longest_makes_room_never_a_busy_one() {
        let t0 = Instant::now();
        let t = |ms: u64| t0 + Duration::from_millis(ms);
        let mut slots = Slots::default();
        let (a, _, none) = slots.admit(t(0), 3).unwrap();
        assert!(none.is_none());
        let (b, b_close, _) = slots.admit(t(1), 3).unwrap();
        let (c, _, _) = slots.admit(t(2), 3).unwrap();
        slots.set_busy(a, true, t(3));
        // Full: b has waited longest (a is older but busy).
        let (_, d_close, evicted) = slots.admit(t(4), 3).unwrap();
        assert!(Arc::ptr_eq(&evicted.unwrap(), &b_close));
        assert!(!slots.open.contains_key(&b) && slots.is_busy(a));
        // c answered a request at 5 and waits from then: d is the oldest now.
        slots.set_busy(c, true, t(5));
        slots.set_busy(c, false, t(5));
        let (e, _, evicted) = slots.admit(t(6), 3).unwrap();
        assert!(Arc::ptr_eq(&evicted.unwrap(), &d_close));
        // All busy: no room until one ends.
        slots.set_busy(c, true, t(7));
        slots.set_busy(e, true, t(7));
        assert!(slots.admit(t(8), 3).is_none());
        slots.release(c);
        let (_, _, evicted) = slots.admit(t(9), 3).unwrap();
        assert!(evicted.is_none());
        assert_eq!(slots.open.len(), 3);
    }
}
