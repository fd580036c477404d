//! `drafs webhook`: the admission webhook server (TLS, HTTP/1.1).
//!
//! The decisions are in [`crate::admission::decision`]; this is the I/O around them: a
//! TLS listener whose certificate follows its files (cert-manager rotates
//! them in place, and a renewal that is expired, not yet valid or not for
//! `--dns-name` is refused: [`tls`]), bounded connections (`publish::slots`) and
//! bodies, `POST /mutate`, `GET /healthz` and `GET /readyz` (`requests`),
//! metrics ([`metrics`]), and a drain on shutdown (here, with the accept loop).
//!
//! With `failurePolicy: Fail`, a webhook that does not answer stops labelled
//! pods from being created, so nothing a client does may lock others out:
//! idle connections make room for new ones (`Slots`), a large review is
//! read and decided one at a time on a thread of lower priority (small ones
//! are answered meanwhile), and on SIGTERM the port stays open for the drain.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use hyper_util::rt::{TokioIo, TokioTimer};
use rustls_pki_types::ServerName;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore, watch};
use tracing::{debug, info, warn};

use crate::admission::inject::Mode;
use crate::admission::policy::Defaults;
use crate::admission::resources::Resources;

pub mod metrics;
mod requests;
pub mod tls;

use crate::publish::slots::{Slots, until_closed};
use metrics::WebhookMetrics;
use requests::{LargeJob, handle, large_review_thread};
pub use tls::CertError;
use tls::{CertFiles, CurrentCert, follow_certs};

/// An AdmissionReview larger than this is refused. The API server's request
/// limit (3 MiB) bounds what a client sends, not the review: the pod comes
/// back with its defaults filled in and as JSON (a protobuf request can
/// double in size), so the bound is looser; memory is bounded by what is
/// built from the review ([`crate::admission::decision::MAX_TREE`]), not by this.
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
    /// The CSI driver mode csi's volume names (the chart's `node.driverName`).
    pub csi_driver: String,
    /// The injected container's requests and limits, unless a pod's annotation says otherwise.
    pub resources: Resources,
    /// The platform assigns the injected container's uid (`--platform-uid`).
    pub platform_uid: bool,
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

/// What every connection shares.
struct State {
    defaults: Defaults,
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
        let first = files.load(SystemTime::now())?;
        let metrics = Arc::new(WebhookMetrics::default());
        metrics.cert_served(&first.cert);
        let current = Arc::new(CurrentCert(RwLock::new(first)));
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
            defaults: Defaults {
                image: config.image.clone(),
                csi_driver: config.csi_driver.clone(),
                resources: config.resources.clone(),
                platform_uid: config.platform_uid,
            },
            namespace_mode: config.namespace_mode,
            metrics,
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
                if let Some(admitted) = self.state.slots().admit(peer.ip(), Instant::now(), MAX_CONNECTIONS) {
                    break admitted;
                }
                tokio::select! {
                    _ = &mut stop => return,
                    _ = freed => {}
                }
            };
            let evicted = evicted.inspect(|evicted| {
                evicted.close.notify_one();
                self.state.metrics.evicted();
            });
            tokio::spawn(connection(
                tcp,
                peer,
                self.acceptor.clone(),
                self.state.clone(),
                (id, close),
                shutdown.subscribe(),
            ));
            if evicted.is_some() {
                // Never more than the limit's descriptors, however fast they come.
                until_closed(|| self.state.slots().closing()).await;
            }
        }
    }

    /// Serve until `shutdown` resolves; then drain: go on accepting and
    /// answering for the drain period with `/readyz` at 503 (the API server
    /// keeps calling this replica until its endpoints are updated), then
    /// close the port and let the reviews in flight finish (at most [`FINISH`]).
    pub async fn serve(mut self, shutdown: impl std::future::Future<Output = ()>) {
        info!(addr = %self.listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), image = %self.state.defaults.image, csi_driver = %self.state.defaults.csi_driver, "webhook listening");
        let state = self.state.clone();
        let reloader = tokio::spawn(follow_certs(self.files.clone(), self.current.clone(), state.metrics.clone()));
        let metrics_server = self
            .metrics_listener
            .take()
            .map(|l| tokio::spawn(crate::publish::metrics::serve(l, state.metrics.clone())));
        let drain = self.drain;
        let (stop_connections, _) = watch::channel(false);
        self.accept_until(shutdown, &stop_connections).await;
        state.metrics.start_draining();
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
