//! The webhook's serving certificate: loaded from its files, refused when it
//! cannot be served (expired, not yet valid, not for `--dns-name`, a key
//! that does not belong to it), and followed as cert-manager rotates the
//! files in place, without a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tracing::{info, warn};

use super::CERT_CHECK;
use super::metrics::WebhookMetrics;
use crate::admission::x509::{ChainProblem, check_chain};

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

/// The certificate and key files, and the names the certificate must cover.
#[derive(Debug, Clone)]
pub(super) struct CertFiles {
    pub(super) cert: PathBuf,
    pub(super) key: PathBuf,
    pub(super) names: Vec<ServerName<'static>>,
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
    pub(super) fn load(&self, now: SystemTime) -> Result<Arc<CertifiedKey>, CertError> {
        let cert_pem = std::fs::read(&self.cert).map_err(|e| CertError::Read(self.cert.clone(), e))?;
        let key_pem = std::fs::read(&self.key).map_err(|e| CertError::Read(self.key.clone(), e))?;
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(&cert_pem).filter_map(Result::ok).collect();
        if chain.is_empty() {
            return Err(CertError::NoCertificate(self.cert.clone()));
        }
        check_chain(&chain, &self.names, now).map_err(|p| cert_error(p, &self.cert))?;
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

/// What is wrong with the chain in `cert`, as the error the webhook reports.
fn cert_error(problem: ChainProblem, cert: &Path) -> CertError {
    let time = |s: i64| jiff::Timestamp::from_second(s).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    let cert = cert.to_path_buf();
    match problem {
        ChainProblem::Unreadable(n) => CertError::Unreadable(cert, n),
        ChainProblem::Expired(n, at) => CertError::Expired(cert, n, time(at)),
        ChainProblem::NotYetValid(n, at) => CertError::NotYetValid(cert, n, time(at)),
        ChainProblem::WrongName(name, has) => {
            let has = if has.is_empty() { "none".to_string() } else { has.join(", ") };
            CertError::WrongName(cert, name, has)
        }
    }
}

/// The certificate served, swapped when the files change.
#[derive(Debug)]
pub(super) struct CurrentCert(pub(super) RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().ok().map(|c| c.clone())
    }
}

/// Check the certificate files every [`CERT_CHECK`]; load them when they
/// changed, and keep the previous certificate if the new one is unusable
/// (cert-manager may write the two files one after the other) or refused.
/// One not valid yet (a clock behind the issuer's) is tried again until it is.
pub(super) async fn follow_certs(files: CertFiles, current: Arc<CurrentCert>, metrics: Arc<WebhookMetrics>) {
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
                metrics.cert_served(&cert.cert);
                if let Ok(mut c) = current.0.write() {
                    *c = cert;
                }
                waiting = false;
                metrics.cert_reloaded();
                info!(cert = %files.cert.display(), "certificate reloaded");
            }
            Err(e) => {
                waiting = matches!(e, CertError::NotYetValid(..));
                if changed {
                    metrics.cert_refused();
                    warn!("certificate files changed but cannot be used, keeping the previous one: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::x509::tests::Y2030;

    #[test]
    fn a_refused_chain_is_reported_with_its_file_and_date() {
        let message = cert_error(ChainProblem::Expired(1, Y2030), Path::new("/tls/tls.crt")).to_string();
        assert_eq!(message, "/tls/tls.crt: certificate 1 expired at 2030-01-01T00:00:00Z");
    }
}
