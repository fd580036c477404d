//! Reaching a webhook endpoint from `drafs check`: a TLS handshake that
//! records the chain the webhook serves (judged afterwards, in
//! `check::webhook`, against the entry's caBundle), then `GET /healthz` on
//! the same connection; and the small helpers that name an entry's endpoint.
//!
//! The GET is a few lines written by hand: only the status line is read
//! (at most 4 KiB), so whatever listens there, however it answers after
//! that line, gets its status reported. The API server's service proxy, the
//! other way to reach a Service, is a call through the kube client
//! (`cmd/check.rs`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, WebhookClientConfig};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::admission::check::Reach;

/// `host:port` (brackets around an IPv6 host) as (host, port); `default` when no port is given.
pub fn split_host_port(text: &str, default: Option<u16>) -> Option<(String, u16)> {
    let (host, port) = match text.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.chars().all(|c| c.is_ascii_digit()) && !h.ends_with(':') => {
            (h, p.parse().ok()?)
        }
        _ => (text, default?),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty() && !host.contains(['/', ' '])).then(|| (host.to_string(), port))
}

/// What makes two entries' probes the same: the Service or the URL's
/// scheme and authority (not the path: /healthz is asked either way).
pub type EndpointKey = (Option<(String, String, i32)>, String);

pub fn endpoint_key(config: &WebhookClientConfig) -> EndpointKey {
    let service = config.service.as_ref().map(|s| (s.namespace.clone(), s.name.clone(), s.port.unwrap_or(443)));
    let url = config.url.as_deref().unwrap_or_default();
    let authority =
        url.parse::<http::Uri>().ok().and_then(|u| u.authority().map(|a| a.to_string())).unwrap_or_default();
    (service, authority)
}

/// How an entry's endpoint is shown: its URL, or `service NS/NAME:PORT/PATH`.
pub fn endpoint_of(entry: &MutatingWebhook) -> String {
    match &entry.client_config.service {
        Some(s) => format!(
            "service {}/{}:{}{}",
            s.namespace,
            s.name,
            s.port.unwrap_or(443),
            s.path.clone().unwrap_or_default()
        ),
        None => entry.client_config.url.clone().unwrap_or_default(),
    }
}

/// Records the chain the server sends and accepts it: the chain is judged
/// afterwards against caBundle (`check::verify`), so that a mismatch is
/// reported with the certificate's dates rather than as a failed handshake.
/// Nothing secret is sent over the connection (a GET /healthz).
#[derive(Debug)]
struct Capture {
    chain: Mutex<Vec<CertificateDer<'static>>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for Capture {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let mut chain = vec![end_entity.clone().into_owned()];
        chain.extend(intermediates.iter().map(|c| c.clone().into_owned()));
        *self.chain.lock().unwrap_or_else(|e| e.into_inner()) = chain;
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// A TLS handshake with `host:port` for `server_name`, then `GET /healthz` on
/// it: whether it answered, and the chain it served.
pub async fn handshake(
    host: &str,
    port: u16,
    server_name: &str,
    limit: Duration,
    through: &str,
) -> (Reach, Result<Vec<CertificateDer<'static>>, String>) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let capture = Arc::new(Capture { chain: Mutex::new(Vec::new()), provider: provider.clone() });
    let failed = |error: String| (Reach::Failed { error: error.clone(), through: through.to_string() }, Err(error));
    let config = match rustls::ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions() {
        Ok(b) => b.dangerous().with_custom_certificate_verifier(capture.clone()).with_no_client_auth(),
        Err(e) => return failed(e.to_string()),
    };
    let name = match ServerName::try_from(server_name.to_string()) {
        Ok(n) => n,
        Err(e) => return failed(format!("{server_name:?} is not a server name: {e}")),
    };
    let connect = async {
        let tcp = tokio::net::TcpStream::connect((host, port)).await.map_err(|e| format!("connect: {e}"))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        Ok::<_, String>(tls)
    };
    let mut tls = match tokio::time::timeout(limit, connect).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => return failed(e),
        Err(_) => return failed(format!("no TLS handshake within {}s", limit.as_secs())),
    };
    let chain = capture.chain.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let ask = async {
        let request = format!("GET /healthz HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n");
        tls.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
        let mut head = Vec::new();
        let mut buf = [0u8; 512];
        while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 4096 {
            let n = tls.read(&mut buf).await.map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        let line = String::from_utf8_lossy(&head);
        line.split_whitespace()
            .nth(1)
            .and_then(|code| code.parse::<u16>().ok())
            .ok_or_else(|| format!("not an HTTP answer: {:?}", line.lines().next().unwrap_or_default()))
    };
    let reach = match tokio::time::timeout(limit, ask).await {
        Ok(Ok(status)) => Reach::Answered { status, through: through.to_string() },
        Ok(Err(error)) => Reach::Failed { error, through: through.to_string() },
        Err(_) => Reach::no_answer(limit, through),
    };
    (reach, Ok(chain))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port() {
        assert_eq!(split_host_port("127.0.0.1:8443", None), Some(("127.0.0.1".into(), 8443)));
        assert_eq!(split_host_port("[::1]:8443", None), Some(("::1".into(), 8443)));
        assert_eq!(split_host_port("webhook", Some(443)), Some(("webhook".into(), 443)));
        assert_eq!(split_host_port("webhook", None), None);
        assert_eq!(split_host_port(":80", None), None);
        assert_eq!(split_host_port("a b:80", None), None);
        assert_eq!(split_host_port("host:99999", None), None);
    }
}
