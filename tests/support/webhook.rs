//! `drafs webhook` as a process, and a TLS client that talks to it as the API
//! server does.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

/// A running `drafs webhook` with certificates from its own test CA.
pub struct WebhookProcess {
    pub child: Child,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    /// stderr lines so far (the log).
    pub log: Arc<Mutex<Vec<String>>>,
}

impl WebhookProcess {
    /// Make a CA and a serving certificate for 127.0.0.1, laid out as the
    /// kubelet lays out a Secret volume, and start the webhook on a free port.
    pub fn start(extra: &[&str]) -> WebhookProcess {
        Self::start_with_image("registry.example/drafs:test", extra)
    }

    /// [`start`](Self::start), injecting `image` (as a Deployment sets `DRAFS_IMAGE`).
    pub fn start_with_image(image: &str, extra: &[&str]) -> WebhookProcess {
        Self::start_with(image, extra, &[])
    }

    /// [`start_with_image`](Self::start_with_image), with `env` added to the process's environment.
    pub fn start_with(image: &str, extra: &[&str], env: &[(&str, &str)]) -> WebhookProcess {
        let dir = tempfile::tempdir().unwrap();
        super::tls::ca(dir.path(), "ca").unwrap();
        super::tls::serving(dir.path(), "ca", "tls", "IP:127.0.0.1,DNS:localhost", 2).unwrap();
        let secret = dir.path().join("secret");
        std::fs::create_dir(&secret).unwrap();
        for file in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{file}"), secret.join(file)).unwrap();
        }
        publish_secret(&secret, "..v1", &dir.path().join("tls.crt"), &dir.path().join("tls.key"));
        let mut child = Command::new(super::drafs_bin())
            .args(["webhook", "--addr", "127.0.0.1:0", "--image", image])
            .arg("--tls-cert")
            .arg(secret.join("tls.crt"))
            .arg("--tls-key")
            .arg(secret.join("tls.key"))
            .args(extra)
            .env("DRAFS_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.split("addr=").nth(1).and_then(|a| a.split_whitespace().next()) {
                    let _ = tx.send(addr.to_string());
                }
                lines.lock().unwrap().push(line);
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("webhook did not start: {:?}", log.lock().unwrap()))
            .parse()
            .unwrap();
        WebhookProcess { child, addr, dir, log }
    }

    /// Serve this certificate and key next, swapped in at once as a Secret
    /// volume update does (a new `..data` link).
    pub fn rotate(&self, version: &str, cert: &Path, key: &Path) {
        publish_secret(&self.dir.path().join("secret"), version, cert, key);
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for WebhookProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An AdmissionReview of the API server creating `pod`, as a request body.
pub fn create_review(pod: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "b0a5a1f2-0000-4000-8000-000000000001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "ml",
            "object": pod,
        }
    }))
    .unwrap()
}

/// A labelled pod's review, `containers` containers of about 1 KB each (ten
/// env vars, two mounts) and two volumes per container: 40 make about 38 KB,
/// 1,500 about 1.4 MB, 3,100 about 3 MB (the API server's request limit).
pub fn pod_review(containers: usize) -> Vec<u8> {
    use serde_json::{Value, json};
    let list: Vec<Value> = (0..containers)
        .map(|i| {
            json!({"name": format!("c{i}"), "image": "registry.example/app:1",
                   "resources": {"claims": [{"name": "gpu"}]},
                   "env": (0..10).map(|e| json!({"name": format!("VAR_{e}"), "value": "x".repeat(40)})).collect::<Vec<_>>(),
                   "volumeMounts": [{"name": format!("data-{i}"), "mountPath": format!("/data/{i}")},
                                    {"name": format!("cfg-{i}"), "mountPath": format!("/etc/cfg/{i}")}]})
        })
        .collect();
    let volumes: Vec<Value> = (0..containers)
        .flat_map(|i| {
            [
                json!({"name": format!("data-{i}"), "emptyDir": {}}),
                json!({"name": format!("cfg-{i}"), "configMap": {"name": format!("cfg-{i}")}}),
            ]
        })
        .collect();
    create_review(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "trainer-", "labels": {"drafs.dev/inject": "sidecar-files"},
                     "annotations": {"drafs.dev/metadata-dir": "/var/run/kubernetes.io/dra-device-attributes"}},
        "spec": {"serviceAccountName": "default",
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}],
                 "containers": list, "volumes": volumes}}))
}

/// A labelled pod's review whose spec carries `zeros` supplemental groups,
/// all 0: two bytes of JSON per value, the densest a pod spec allows (4.19
/// million make an 8 MiB body).
pub fn zeros_review(zeros: usize) -> Vec<u8> {
    let marker = "\"supplementalGroups\":[0]";
    let body = create_review(serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "crafted-", "labels": {"drafs.dev/inject": "init"}},
        "spec": {"securityContext": {"supplementalGroups": [0]},
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}],
                 "containers": [{"name": "app", "image": "app", "resources": {"claims": [{"name": "gpu"}]}}]}}));
    let text = String::from_utf8(body).expect("JSON is UTF-8");
    let at = text.find(marker).expect("the marker is in the review") + marker.len() - 2;
    let mut out = String::with_capacity(text.len() + 2 * zeros);
    out.push_str(&text[..at]);
    out.push('0');
    for _ in 1..zeros {
        out.push_str(",0");
    }
    out.push_str(&text[at + 1..]);
    out.into_bytes()
}

/// A client trusting only `ca`.
pub fn tls_config(ca: &Path) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// One HTTPS request on a new connection: (status, body), or the error
/// (a failed handshake, a closed connection).
pub async fn request_async(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> Result<(u16, Vec<u8>), String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(config);
    let name = ServerName::IpAddress(addr.ip().into());
    let tls = connector.connect(name, tcp).await.map_err(|e| format!("TLS: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes().to_vec();
    Ok((status, body))
}

/// A kept-alive HTTPS connection to the webhook, as the API server keeps them.
pub type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

pub async fn connect(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> Result<Sender, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One review on `sender`: (status, answer, time from request sent to answer read).
pub async fn post(sender: &mut Sender, body: Bytes) -> Result<(u16, Bytes, Duration), String> {
    let req = hyper::Request::post("/mutate")
        .header("host", "webhook")
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap();
    sender.ready().await.map_err(|e| e.to_string())?;
    let started = std::time::Instant::now();
    let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let answer = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((status, answer, started.elapsed()))
}

/// Whether an answer carries a patch.
pub fn patched(answer: &[u8]) -> bool {
    answer.windows(9).any(|w| w == b"JSONPatch")
}

/// [`request_async`] from synchronous test code.
pub fn request(addr: SocketAddr, ca: &Path, method: &str, path: &str, body: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(request_async(addr, tls_config(ca), method, path, body.to_vec()))
}

/// Copy cert and key into `secret/VERSION/` and point `secret/..data` at it atomically.
fn publish_secret(secret: &Path, version: &str, cert: &Path, key: &Path) {
    let dir = secret.join(version);
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(cert, dir.join("tls.crt")).unwrap();
    std::fs::copy(key, dir.join("tls.key")).unwrap();
    let tmp = secret.join("..data_tmp");
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, secret.join("..data")).unwrap();
}

/// The shipped webhook configuration, pointed at a `drafs webhook` by URL
/// (test clusters have no Service routing) and trusting the CA in `ca`.
/// `url` is the first entry's (`.../mutate`); every entry keeps its own path.
pub fn configuration_by_url(url: &str, ca: &Path) -> serde_json::Value {
    let mut config = super::yaml_docs(&super::read("deploy/webhook/core/mutatingwebhookconfiguration.yaml")).remove(0);
    let ca = serde_json::to_value(k8s_openapi::ByteString(std::fs::read(ca).unwrap())).unwrap();
    let base = url.trim_end_matches("/mutate");
    for entry in config["webhooks"].as_array_mut().unwrap() {
        let path = entry["clientConfig"]["service"]["path"].as_str().unwrap().to_string();
        entry["clientConfig"] = serde_json::json!({"url": format!("{base}{path}"), "caBundle": ca});
    }
    config
}

/// The reviews a webhook answered, summed over verdicts, from its metrics text.
pub fn reviews_answered(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("drafs_webhook_reviews_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}
