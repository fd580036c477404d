//! The webhook check: is each entry's endpoint reachable, does the chain it
//! serves verify against the entry's caBundle for the name the API server
//! uses, and how long do the certificate and the CA have left.
//!
//! Pure: what was measured (`admission::probe`, `cmd/check.rs`) comes in as
//! a [`Probe`]; dates are read with the webhook's own parser (`x509`).

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::json;

use super::{Check, Status};
use crate::admission::x509::validity;

/// Certificates (the served leaf, the CA in `caBundle`) that expire within
/// this many days are a warning: cert-manager, as shipped, renews the serving
/// certificate 15 days before it expires, so one with less left was not renewed.
pub const EXPIRY_WARNING_DAYS: i64 = 14;

/// Whether the webhook answered its health endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// `GET /healthz` answered with this HTTP status (`through` says how: directly, or the API server's service proxy).
    Answered { status: u16, through: String },
    /// No answer: why.
    Failed { error: String, through: String },
}

impl Reach {
    /// No answer within `limit` (the probe's --timeout).
    pub fn no_answer(limit: std::time::Duration, through: impl Into<String>) -> Reach {
        Reach::Failed { error: format!("no answer within {}s", limit.as_secs()), through: through.into() }
    }
}

/// What was measured of one webhook entry's endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    pub entry: String,
    /// The URL, or `service NS/NAME:PORT/PATH`.
    pub endpoint: String,
    /// The name the API server checks the certificate for (the URL's host, or NAME.NS.svc).
    pub server_name: String,
    /// The entry's caBundle (PEM).
    pub ca_bundle: Vec<u8>,
    pub reach: Reach,
    /// The chain the webhook served in a TLS handshake; `None`: no handshake was made (a Service without --webhook-address).
    pub served: Option<Result<Vec<CertificateDer<'static>>, String>>,
}

fn days(n: i64) -> String {
    if n == 1 { "1 day".into() } else { format!("{n} days") }
}

fn date(seconds: i64) -> String {
    jiff::Timestamp::from_second(seconds).map(|t| t.to_string()).unwrap_or_else(|_| seconds.to_string())
}

/// The webhook check for one entry: reachable, the served chain verifies
/// against caBundle for the name the API server uses, and how long it has left.
pub fn webhook(probe: &Probe, now: i64, warn_days: i64) -> Check {
    let name: &'static str = "webhook";
    let mut problems: Vec<(Status, String)> = Vec::new();
    let mut facts: Vec<String> = Vec::new();
    let mut details = json!({"entry": probe.entry, "endpoint": probe.endpoint, "serverName": probe.server_name,
                             "reachable": null, "healthStatus": null, "certificate": null, "ca": null});
    match &probe.reach {
        Reach::Answered { status, through } => {
            details["reachable"] = json!(true);
            details["healthStatus"] = json!(status);
            if *status == 200 {
                facts.push(format!("/healthz answers 200 ({through})"));
            } else {
                problems.push((Status::Fail, format!("/healthz answers {status} ({through})")));
            }
        }
        Reach::Failed { error, through } => {
            details["reachable"] = json!(false);
            problems.push((Status::Fail, format!("unreachable ({through}): {error}")));
        }
    }
    // The CA the API server trusts.
    let anchors: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&probe.ca_bundle).filter_map(Result::ok).collect();
    if anchors.is_empty() {
        problems.push((
            Status::Fail,
            "caBundle is empty or holds no PEM certificate: the API server cannot verify the webhook".into(),
        ));
    } else if let Some((_, not_after)) = validity(&anchors[0]) {
        let left = (not_after - now).div_euclid(86_400);
        details["ca"] = json!({"notAfter": date(not_after), "daysLeft": left});
        if not_after < now {
            problems.push((Status::Fail, format!("the CA in caBundle expired at {}", date(not_after))));
        } else if left < warn_days {
            problems.push((
                Status::Warn,
                format!("the CA in caBundle expires at {} ({} left)", date(not_after), days(left)),
            ));
        }
    }
    match &probe.served {
        None => facts.push(
            "served certificate not checked (a Service is not reachable from here: give --webhook-address after kubectl port-forward)"
                .into(),
        ),
        Some(Err(e)) => problems.push((Status::Fail, format!("TLS handshake failed: {e}"))),
        Some(Ok(chain)) if chain.is_empty() => problems.push((Status::Fail, "no certificate served".into())),
        Some(Ok(chain)) => {
            let verified = verify(chain, &anchors, &probe.server_name, now);
            let not_after = validity(&chain[0]).map(|(_, a)| a);
            let left = not_after.map(|a| (a - now).div_euclid(86_400));
            details["certificate"] = json!({
                "verified": verified.is_ok(),
                "error": verified.as_ref().err(),
                "notAfter": not_after.map(date),
                "daysLeft": left,
            });
            match verified {
                Err(e) => problems.push((
                    Status::Fail,
                    format!("the served certificate does not verify against caBundle for {}: {e}", probe.server_name),
                )),
                Ok(()) => facts.push(format!("certificate verifies against caBundle for {}", probe.server_name)),
            }
            if let (Some(a), Some(left)) = (not_after, left) {
                if a < now {
                    problems.push((Status::Fail, format!("the served certificate expired at {}", date(a))));
                } else if left < warn_days {
                    problems.push((
                        Status::Warn,
                        format!("the served certificate expires at {} ({} left, under {warn_days})", date(a), days(left)),
                    ));
                } else {
                    facts.push(format!("expires at {} ({} left)", date(a), days(left)));
                }
            }
        }
    }
    let status = problems.iter().map(|(s, _)| *s).max().unwrap_or(Status::Ok);
    let mut parts: Vec<String> = problems.into_iter().map(|(_, p)| p).collect();
    parts.extend(facts);
    Check::new(name, status, format!("{} ({}): {}", probe.entry, probe.endpoint, parts.join("; ")), details)
}

/// Verify `chain` as the API server would: issued by a CA of `anchors`,
/// valid now, for `server_name`.
pub fn verify(
    chain: &[CertificateDer<'static>],
    anchors: &[CertificateDer<'static>],
    server_name: &str,
    now: i64,
) -> Result<(), String> {
    use rustls::client::danger::ServerCertVerifier;
    let mut roots = rustls::RootCertStore::empty();
    for anchor in anchors {
        roots.add(anchor.clone()).map_err(|e| format!("caBundle: {e}"))?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(std::sync::Arc::new(roots), provider)
        .build()
        .map_err(|e| format!("caBundle: {e}"))?;
    let name = ServerName::try_from(server_name.to_string()).map_err(|e| format!("{server_name:?}: {e}"))?;
    let (leaf, intermediates) = chain.split_first().ok_or("no certificate")?;
    let now = UnixTime::since_unix_epoch(std::time::Duration::from_secs(u64::try_from(now).unwrap_or(0)));
    verifier.verify_server_cert(leaf, intermediates, &name, &[], now).map(|_| ()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_unreachable_or_without_a_ca_fails_and_a_service_says_how_to_check_its_certificate() {
        let probe = |reach: Reach, ca: &[u8]| Probe {
            entry: "pods.drafs.dev".into(),
            endpoint: "service drafs-system/drafs-webhook:443/mutate".into(),
            server_name: "drafs-webhook.drafs-system.svc".into(),
            ca_bundle: ca.to_vec(),
            reach,
            served: None,
        };
        let through = "through the API server's service proxy".to_string();
        let c = webhook(
            &probe(Reach::Failed { error: "HTTP 503: no endpoints".into(), through: through.clone() }, b""),
            0,
            14,
        );
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.message.contains("unreachable (through the API server's service proxy): HTTP 503: no endpoints"),
            "{}",
            c.message
        );
        assert!(c.message.contains("caBundle is empty"), "{}", c.message);
        assert_eq!(c.details["reachable"], false);
        let c = webhook(&probe(Reach::Answered { status: 200, through }, b"not a PEM"), 0, 14);
        assert_eq!(c.status, Status::Fail);
        assert!(c.message.contains("give --webhook-address"), "{}", c.message);
    }
}
