//! `drafs check`: read what decides whether drafs works for a namespace or a
//! pod (the webhook configurations, the Namespace, the Pod and its Events),
//! ask the API server what the service account may do, reach the webhook,
//! and print the report `admission::check` makes of it. Exit 0: every check
//! passed (warnings allowed); 1: one failed; 2: bad flags or no cluster.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, Service};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::admission::check::{self, Check, Probe, Reach, Report, Status};
use crate::admission::inject::{self, Mode};
use crate::admission::manifests::{self, Grant};
use crate::cmd::Failure;
use crate::cmd::cli::{CheckArgs, CheckOutput};

#[derive(Debug)]
pub struct Config {
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub service_account: Option<String>,
    /// HOST:PORT where a Service-backed webhook can be reached from here (a port-forward).
    pub webhook_address: Option<String>,
    pub output: CheckOutput,
    pub warn_days: i64,
    /// Each request's limit.
    pub timeout: Duration,
}

impl Config {
    pub fn from_args(args: &CheckArgs) -> Result<Self, Failure> {
        if let Some(address) = &args.webhook_address {
            split_host_port(address, None).ok_or_else(|| {
                Failure::Usage(format!("--webhook-address {address:?}: expected HOST:PORT, e.g. 127.0.0.1:8443"))
            })?;
        }
        if args.timeout.is_zero() {
            return Err(Failure::Usage("--timeout must be more than 0".into()));
        }
        Ok(Config {
            namespace: args.namespace.clone(),
            pod: args.pod.clone(),
            service_account: args.service_account.clone(),
            webhook_address: args.webhook_address.clone(),
            output: args.output,
            warn_days: i64::from(args.expiry_warning_days),
            timeout: args.timeout,
        })
    }
}

pub async fn run(c: Config) -> Result<(), Failure> {
    let client = Client::try_default().await.map_err(|e| {
        Failure::Usage(format!("no cluster to check: {}", e.to_string().replace("'\"", "'").replace("\"'", "'")))
    })?;
    let namespace = c.namespace.clone().unwrap_or_else(|| client.default_namespace().to_string());
    let report = gather(&client, &c, &namespace).await;
    let text = match c.output {
        CheckOutput::Text => report.to_text(),
        CheckOutput::Json => format!("{:#}\n", report.to_json()),
    };
    let mut out = std::io::stdout().lock();
    if let Err(e) = std::io::Write::write_all(&mut out, text.as_bytes())
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        return Err(Failure::Failed(format!("cannot write to stdout: {e}")));
    }
    match report.failed() {
        0 => Ok(()),
        n => Err(Failure::Failed(format!("{n} check{} failed", if n == 1 { "" } else { "s" }))),
    }
}

/// Why a call to the API server failed; the RBAC check branches on a refusal.
#[derive(Debug, thiserror::Error)]
enum CallError {
    /// The API server answered with this status (403: the caller may not).
    #[error("HTTP {code}: {message}")]
    Status { code: u16, message: String },
    #[error("no answer within {}s", .0.as_secs())]
    Timeout(Duration),
    #[error("{0}")]
    Other(kube::Error),
}

impl From<kube::Error> for CallError {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(status) => CallError::Status { code: status.code, message: status.message },
            other => CallError::Other(other),
        }
    }
}

impl CallError {
    fn is_forbidden(&self) -> bool {
        matches!(self, CallError::Status { code: 403, .. })
    }
}

async fn within<T>(limit: Duration, work: impl Future<Output = Result<T, kube::Error>>) -> Result<T, CallError> {
    match tokio::time::timeout(limit, work).await {
        Ok(result) => result.map_err(CallError::from),
        Err(_) => Err(CallError::Timeout(limit)),
    }
}

async fn gather(client: &Client, c: &Config, namespace: &str) -> Report {
    let mut checks = Vec::new();
    let configurations =
        within(c.timeout, Api::<MutatingWebhookConfiguration>::all(client.clone()).list(&ListParams::default()))
            .await
            .map(|l| l.items);
    let configurations = match configurations {
        Ok(list) => {
            checks.push(check::configuration(&list));
            list
        }
        Err(e) => {
            checks.push(Check {
                name: "configuration",
                status: Status::Fail,
                message: format!("cannot list mutatingwebhookconfigurations: {e}"),
                fix: None,
                details: serde_json::json!({"configurations": [], "entries": [], "error": e.to_string()}),
            });
            Vec::new()
        }
    };
    let entries = check::drafs_entries(&configurations);
    let namespace_mode = namespace_mode(client, c.timeout, &entries).await;
    let ns = within(c.timeout, Api::<Namespace>::all(client.clone()).get_opt(namespace)).await;
    let pod = match &c.pod {
        None => None,
        Some(name) => Some(
            within(c.timeout, Api::<Pod>::namespaced(client.clone(), namespace).get_opt(name))
                .await
                .map(|p| p.map(|p| serde_json::to_value(p).unwrap_or_default())),
        ),
    };
    // Injection: the namespace's, or the pod's.
    let labels = match &ns {
        Ok(Some(ns)) => Ok(check::namespace_labels(namespace, ns.metadata.labels.as_ref())),
        Ok(None) => Err(format!("namespace {namespace} does not exist")),
        Err(e) => Err(format!("cannot read namespace {namespace}: {e}")),
    };
    let pod_value = match (&pod, &c.pod) {
        (Some(Ok(Some(p))), _) => Some(p.clone()),
        // No namespace, no pod: said once, below.
        (Some(Ok(None)), Some(_)) if labels.is_err() => None,
        (Some(Ok(None)), Some(name)) => {
            checks.push(failed("injection", format!("pod {namespace}/{name} does not exist")));
            None
        }
        (Some(Err(e)), Some(name)) => {
            checks.push(failed("injection", format!("cannot read pod {namespace}/{name}: {e}")));
            None
        }
        _ => None,
    };
    let pod_missing = c.pod.is_some() && pod_value.is_none();
    match (&labels, &pod_value) {
        (Err(e), _) => checks.push(failed("injection", e.clone())),
        (Ok(labels), Some(pod)) => checks.push(check::pod_injection(&configurations, labels, pod, namespace_mode)),
        (Ok(labels), None) if !pod_missing => {
            checks.push(check::namespace_injection(&configurations, namespace, labels, namespace_mode))
        }
        _ => {}
    }
    // RBAC: the account drafs runs as.
    let account = c.service_account.clone().unwrap_or_else(|| match &pod_value {
        Some(pod) => inject::account_of(&pod["spec"]),
        None => manifests::DEFAULT_ACCOUNT.to_string(),
    });
    let answers = access(client, c.timeout, namespace, &account).await;
    checks.push(check::rbac(namespace, &account, answers));
    // The webhook, per entry.
    let now = i64::try_from(UnixTime::now().as_secs()).unwrap_or(i64::MAX);
    // Entries that share an endpoint (both of drafs's do) share one probe;
    // the endpoints are probed at once, all within one --timeout.
    let mut unique: Vec<(EndpointKey, &MutatingWebhook)> = Vec::new();
    for (_, entry) in &entries {
        let key = endpoint_key(&entry.client_config);
        if !unique.iter().any(|(k, _)| *k == key) {
            unique.push((key, entry));
        }
    }
    let deadline = tokio::time::Instant::now() + c.timeout;
    let probed: Vec<(EndpointKey, Probe)> =
        futures::future::join_all(unique.into_iter().map(|(key, entry)| async move {
            let probe = match tokio::time::timeout_at(deadline, probe(client, c, entry)).await {
                Ok(probe) => probe,
                Err(_) => Probe {
                    entry: entry.name.clone(),
                    endpoint: endpoint_of(entry),
                    server_name: String::new(),
                    ca_bundle: entry.client_config.ca_bundle.as_ref().map(|b| b.0.clone()).unwrap_or_default(),
                    reach: Reach::Failed {
                        error: format!("no answer within {}s", c.timeout.as_secs()),
                        through: endpoint_of(entry),
                    },
                    served: None,
                },
            };
            (key, probe)
        }))
        .await;
    for (_, entry) in &entries {
        let key = endpoint_key(&entry.client_config);
        let Some((_, earlier)) = probed.iter().find(|(k, _)| *k == key) else { continue };
        let probe = Probe {
            entry: entry.name.clone(),
            endpoint: endpoint_of(entry),
            ca_bundle: entry.client_config.ca_bundle.as_ref().map(|b| b.0.clone()).unwrap_or_default(),
            ..earlier.clone()
        };
        checks.push(check::webhook(&probe, now, c.warn_days));
    }
    // The pod's drafs container.
    if let Some(pod) = &pod_value {
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let params = ListParams::default().fields(&format!("involvedObject.uid={uid}"));
        let events = within(c.timeout, Api::<Event>::namespaced(client.clone(), namespace).list(&params)).await;
        let events: Vec<Value> = match events {
            Ok(list) => list.items.into_iter().filter_map(|e| serde_json::to_value(e).ok()).collect(),
            Err(e) => {
                tracing::warn!("cannot list the pod's events: {e}");
                Vec::new()
            }
        };
        checks.push(check::pod_status(pod, &events));
    }
    Report { namespace: namespace.to_string(), pod: c.pod.clone(), checks }
}

fn failed(name: &'static str, message: String) -> Check {
    Check { name, status: Status::Fail, details: serde_json::json!({"error": message}), message, fix: None }
}

/// The webhook's `--namespace-mode`, read from the Deployment behind the
/// entries' Service (`None`: a URL entry, or not readable).
async fn namespace_mode(client: &Client, limit: Duration, entries: &[(String, &MutatingWebhook)]) -> Option<Mode> {
    let service = entries.iter().find_map(|(_, e)| e.client_config.service.as_ref())?;
    let svc =
        within(limit, Api::<Service>::namespaced(client.clone(), &service.namespace).get(&service.name)).await.ok()?;
    let selector = svc.spec?.selector?;
    let deployments =
        within(limit, Api::<Deployment>::namespaced(client.clone(), &service.namespace).list(&ListParams::default()))
            .await
            .ok()?;
    let deployment = deployments.items.into_iter().find(|d| {
        let labels = d.spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
        selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    })?;
    let containers = deployment.spec.template.spec?.containers;
    containers.iter().find_map(|container| {
        let args = container.args.clone().unwrap_or_default();
        if !args.iter().any(|a| a == "webhook") {
            return None;
        }
        let from_args = args.iter().enumerate().find_map(|(i, a)| match a.strip_prefix("--namespace-mode") {
            Some(rest) if rest.starts_with('=') => Some(rest[1..].to_string()),
            Some("") => args.get(i + 1).cloned(),
            _ => None,
        });
        let from_env =
            || container.env.iter().flatten().find(|e| e.name == "DRAFS_NAMESPACE_MODE").and_then(|e| e.value.clone());
        let text = from_args.or_else(from_env).unwrap_or_else(|| Mode::Init.label().to_string());
        crate::admission::policy::parse_mode(&text).ok()
    })
}

/// Whether `account` may do what drafs needs, one SubjectAccessReview per
/// permission; `Err` when the caller may not ask. A caller who may not
/// create SubjectAccessReviews but is that very account (`drafs check` in
/// the pod) asks SelfSubjectAccessReviews instead, which everyone may.
async fn access(
    client: &Client,
    limit: Duration,
    namespace: &str,
    account: &str,
) -> Result<Vec<(Grant, bool)>, String> {
    let user = format!("system:serviceaccount:{namespace}:{account}");
    let grants = manifests::grants(namespace, account);
    let attributes = |grant: &Grant| ResourceAttributes {
        namespace: grant.namespace.clone(),
        verb: Some(grant.verb.clone()),
        group: Some(grant.group.clone()),
        resource: Some(grant.resource.clone()),
        ..Default::default()
    };
    let api = Api::<SubjectAccessReview>::all(client.clone());
    let mut answers = Vec::new();
    let mut forbidden = None;
    for grant in &grants {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.clone()),
                groups: Some(vec![
                    "system:serviceaccounts".into(),
                    format!("system:serviceaccounts:{namespace}"),
                    "system:authenticated".into(),
                ]),
                resource_attributes: Some(attributes(grant)),
                ..Default::default()
            },
            ..Default::default()
        };
        match within(limit, api.create(&PostParams::default(), &review)).await {
            Ok(answer) => answers.push((grant.clone(), answer.status.is_some_and(|s| s.allowed))),
            Err(e) if e.is_forbidden() => {
                forbidden = Some(e);
                break;
            }
            Err(e) => return Err(format!("a SubjectAccessReview failed: {e}")),
        }
    }
    let Some(forbidden) = forbidden else { return Ok(answers) };
    let me = within(
        limit,
        Api::<SelfSubjectReview>::all(client.clone()).create(&PostParams::default(), &SelfSubjectReview::default()),
    )
    .await
    .ok()
    .and_then(|r| r.status?.user_info?.username);
    if me.as_deref() != Some(user.as_str()) {
        return Err(format!("you may not create subjectaccessreviews ({forbidden})"));
    }
    let api = Api::<SelfSubjectAccessReview>::all(client.clone());
    let mut answers = Vec::new();
    for grant in grants {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec { resource_attributes: Some(attributes(&grant)), ..Default::default() },
            ..Default::default()
        };
        let answer = within(limit, api.create(&PostParams::default(), &review))
            .await
            .map_err(|e| format!("a SelfSubjectAccessReview failed: {e}"))?;
        answers.push((grant, answer.status.is_some_and(|s| s.allowed)));
    }
    Ok(answers)
}

/// `host:port` (brackets around an IPv6 host) as (host, port); `default` when no port is given.
fn split_host_port(text: &str, default: Option<u16>) -> Option<(String, u16)> {
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
type EndpointKey = (Option<(String, String, i32)>, String);

fn endpoint_key(config: &k8s_openapi::api::admissionregistration::v1::WebhookClientConfig) -> EndpointKey {
    let service = config.service.as_ref().map(|s| (s.namespace.clone(), s.name.clone(), s.port.unwrap_or(443)));
    let url = config.url.as_deref().unwrap_or_default();
    let authority =
        url.parse::<http::Uri>().ok().and_then(|u| u.authority().map(|a| a.to_string())).unwrap_or_default();
    (service, authority)
}

/// How an entry's endpoint is shown: its URL, or `service NS/NAME:PORT/PATH`.
fn endpoint_of(entry: &MutatingWebhook) -> String {
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

/// What the entry's endpoint answers: directly for a URL (or a Service with
/// --webhook-address), else through the API server's service proxy.
async fn probe(client: &Client, c: &Config, entry: &MutatingWebhook) -> Probe {
    let config = &entry.client_config;
    let ca_bundle = config.ca_bundle.as_ref().map(|b| b.0.clone()).unwrap_or_default();
    if let Some(service) = &config.service {
        let port = service.port.unwrap_or(443);
        let endpoint = endpoint_of(entry);
        let server_name = format!("{}.{}.svc", service.name, service.namespace);
        if let Some(address) = &c.webhook_address {
            let (host, port) = split_host_port(address, None).unwrap_or_default();
            let (reach, served) = handshake(&host, port, &server_name, c.timeout, &format!("at {address}")).await;
            return Probe { entry: entry.name.clone(), endpoint, server_name, ca_bundle, reach, served: Some(served) };
        }
        let through = "through the API server's service proxy".to_string();
        let proxy =
            format!("/api/v1/namespaces/{}/services/https:{}:{port}/proxy/healthz", service.namespace, service.name);
        let reach = match http::Request::get(&proxy).body(Vec::new()) {
            Ok(request) => match tokio::time::timeout(c.timeout, proxied_status(client, request)).await {
                Ok(Ok(status)) => Reach::Answered { status, through },
                Ok(Err(error)) => Reach::Failed { error, through },
                Err(_) => Reach::Failed { error: format!("no answer within {}s", c.timeout.as_secs()), through },
            },
            Err(e) => Reach::Failed { error: e.to_string(), through },
        };
        return Probe { entry: entry.name.clone(), endpoint, server_name, ca_bundle, reach, served: None };
    }
    let url = config.url.clone().unwrap_or_default();
    let parsed = url.parse::<http::Uri>().ok();
    let host =
        parsed.as_ref().and_then(|u| u.host()).map(|h| h.trim_start_matches('[').trim_end_matches(']').to_string());
    let Some(host) = host else {
        let reach = Reach::Failed {
            error: format!("clientConfig has no service and no valid url ({url:?})"),
            through: "nowhere".into(),
        };
        return Probe {
            entry: entry.name.clone(),
            endpoint: url,
            server_name: String::new(),
            ca_bundle,
            reach,
            served: None,
        };
    };
    let port = parsed.as_ref().and_then(|u| u.port_u16()).unwrap_or(443);
    let address = c.webhook_address.clone().and_then(|a| split_host_port(&a, None)).unwrap_or((host.clone(), port));
    let through = format!("at {}:{}", address.0, address.1);
    let (reach, served) = handshake(&address.0, address.1, &host, c.timeout, &through).await;
    Probe { entry: entry.name.clone(), endpoint: url, server_name: host, ca_bundle, reach, served: Some(served) }
}

/// The most of an answer's body `check` reads through the service proxy: a
/// webhook (or whatever answers there) may send an endless body.
const PROXY_BODY_LIMIT: usize = 4096;

/// GET through the API server's service proxy: the status when it is a
/// success, else an error with the API server's message or the first
/// [`PROXY_BODY_LIMIT`] bytes of the body, escaped. Never reads more.
async fn proxied_status(client: &Client, request: http::Request<Vec<u8>>) -> Result<u16, String> {
    use http_body_util::BodyExt;
    let response =
        client.send(request.map(kube::client::Body::from)).await.map_err(|e| CallError::from(e).to_string())?;
    let status = response.status();
    if status.is_success() {
        return Ok(status.as_u16());
    }
    let mut body = response.into_body();
    let mut prefix = Vec::new();
    while prefix.len() < PROXY_BODY_LIMIT {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    prefix.extend_from_slice(&data);
                }
            }
            _ => break,
        }
    }
    prefix.truncate(PROXY_BODY_LIMIT);
    let message = serde_json::from_slice::<Value>(&prefix)
        .ok()
        .and_then(|s| s["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&prefix).trim().to_string());
    Err(format!("HTTP {}: {}", status.as_u16(), crate::cmd::get::printable(&message)))
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
async fn handshake(
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
        Err(_) => {
            Reach::Failed { error: format!("no answer within {}s", limit.as_secs()), through: through.to_string() }
        }
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
