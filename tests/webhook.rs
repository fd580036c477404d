//! `drafs webhook` as a process over real TLS: reviews, bad requests, certificate
//! rotation, bad certificates, shutdown.

use drafs_test_support as support;

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use support::webhook::{
    WebhookProcess, connect, create_review, patched, pod_review, post, request, request_async, tls_config, zeros_review,
};
use support::{Build, PodBuilder, drafs_bin, free_port, http_get, tls, wait_for, wait_output, wait_until};

const LIMIT: Duration = Duration::from_secs(30);

fn review(labels: Value) -> Vec<u8> {
    create_review(trainer(labels).build())
}

/// A pod as a controller sends it for admission (the review has the
/// namespace), its app container using a claim from template single-gpu.
fn trainer(labels: Value) -> PodBuilder {
    PodBuilder::from_prefix("", "trainer-")
        .labels(labels)
        .template_claim("gpu", "single-gpu")
        .container("app", "app")
        .uses("gpu")
}

fn json_body(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

#[test]
fn reviews_over_tls_and_bad_requests_never_stop_the_server() {
    let hook = WebhookProcess::start(&[]);
    let ca = hook.ca();
    let (status, body) =
        request(hook.addr, &ca, "POST", "/mutate", &review(json!({"drafs.dev/inject": "init"}))).unwrap();
    assert_eq!(status, 200);
    let answer = json_body(&body);
    assert_eq!(answer["response"]["uid"], "b0a5a1f2-0000-4000-8000-000000000001");
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["patchType"], "JSONPatch");

    let (status, body) =
        request(hook.addr, &ca, "POST", "/mutate", &review(json!({"drafs.dev/inject": "sidecar"}))).unwrap();
    assert_eq!(status, 200);
    let answer = json_body(&body);
    assert_eq!(answer["response"]["allowed"], false);
    assert!(
        answer["response"]["status"]["message"].as_str().unwrap().contains("init, sidecar-fuse, sidecar-files or csi")
    );

    // Malformed bodies: 400 with the reason, and the next review is answered.
    for bad in [&b"{not json"[..], b"{}", b"[]", b""] {
        let (status, body) = request(hook.addr, &ca, "POST", "/mutate", bad).unwrap();
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    }
    // Too large: refused as soon as the head says so, without reading the body.
    let head = format!("POST /mutate HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n", webhook_max_body() + 1);
    let answer = raw_tls(hook.addr, &ca, head.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(answer.contains(&format!("AdmissionReview larger than {} bytes", webhook_max_body())), "{answer}");
    // Not TLS at all: the handshake fails, the server goes on.
    let mut plain = std::net::TcpStream::connect(hook.addr).unwrap();
    std::io::Write::write_all(&mut plain, b"POST /mutate HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}").unwrap();
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut plain, &mut sink);
    assert!(!String::from_utf8_lossy(&sink).contains("HTTP/1.1 200"));

    assert_eq!(request(hook.addr, &ca, "GET", "/healthz", b"").unwrap().0, 200);
    assert_eq!(request(hook.addr, &ca, "GET", "/readyz", b"").unwrap().0, 200);
    assert_eq!(request(hook.addr, &ca, "GET", "/mutate", b"").unwrap().0, 405);
    assert_eq!(request(hook.addr, &ca, "GET", "/", b"").unwrap().0, 404);
    let (status, _) = request(hook.addr, &ca, "POST", "/mutate", &review(json!({"drafs.dev/inject": "init"}))).unwrap();
    assert_eq!(status, 200, "still serving: {}", hook.log_text());
}

/// Send `bytes` over TLS as they are; what comes back until the server closes.
fn raw_tls(addr: std::net::SocketAddr, ca: &std::path::Path, bytes: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
        let mut tls = tokio_rustls::TlsConnector::from(tls_config(ca)).connect(name, tcp).await.unwrap();
        tls.write_all(bytes).await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(LIMIT, tls.read_to_end(&mut answer)).await;
        String::from_utf8_lossy(&answer).into_owned()
    })
}

fn webhook_max_body() -> usize {
    drafs::admission::webhook::MAX_BODY
}

#[test]
fn rotated_certificates_are_served_without_a_restart_and_broken_ones_are_not() {
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let hook = WebhookProcess::start(&["--metrics-addr", &metrics_addr]);
    let dir = hook.dir.path();
    // A new CA and certificate, swapped in as a Secret volume update does.
    tls::ca(dir, "ca2").unwrap();
    // Valid until 2030-01-01T00:00:00Z, which the expiry gauge must then say.
    tls::serving_dated(dir, "ca2", "next", "IP:127.0.0.1", 3, Some(("20250101000000Z", "20300101000000Z"))).unwrap();
    let new_ca = dir.join("ca2.crt");
    let first = sample(&metrics_text(&metrics_addr), "drafs_webhook_cert_expiry_timestamp_seconds");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(
        first.is_some_and(|at| at > now && at < now + 3.0 * 86400.0),
        "the first certificate's two days: {first:?}"
    );
    assert!(request(hook.addr, &new_ca, "GET", "/healthz", b"").is_err(), "the new CA is not trusted yet");
    hook.rotate("..v2", &dir.join("next.crt"), &dir.join("next.key"));
    wait_until("the rotated certificate is served", LIMIT, || {
        request(hook.addr, &new_ca, "GET", "/healthz", b"").is_ok_and(|(s, _)| s == 200)
    });
    assert!(request(hook.addr, &hook.ca(), "GET", "/healthz", b"").is_err(), "the old certificate is gone");
    let rotated = sample(&metrics_text(&metrics_addr), "drafs_webhook_cert_expiry_timestamp_seconds");
    assert_eq!(rotated, Some(1_893_456_000.0), "the rotated certificate's notAfter");

    // A broken certificate keeps the last good one, with a warning.
    std::fs::write(dir.join("broken.crt"), "not a certificate").unwrap();
    hook.rotate("..v3", &dir.join("broken.crt"), &dir.join("next.key"));
    wait_until("the broken certificate is reported", LIMIT, || hook.log_text().contains("keeping the previous one"));
    assert_eq!(request(hook.addr, &new_ca, "GET", "/readyz", b"").unwrap().0, 200);
    let metrics = metrics_text(&metrics_addr);
    assert!(metrics.contains("drafs_webhook_cert_reloads_total 1\n"), "{metrics}");
    assert!(metrics.contains("drafs_webhook_cert_errors_total 1\n"), "{metrics}");
    let kept = sample(&metrics, "drafs_webhook_cert_expiry_timestamp_seconds");
    assert_eq!(kept, Some(1_893_456_000.0), "a refused certificate leaves the served one's expiry: {metrics}");
}

/// The value of the sample `name` (with no labels) in `metrics`.
fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

fn metrics_text(addr: &str) -> String {
    let (code, text) = http_get(addr, "/metrics").expect("metrics answer");
    assert_eq!(code, 200, "{text}");
    text
}

#[test]
fn reviews_are_counted_and_timed_in_the_metrics() {
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let hook = WebhookProcess::start(&["--metrics-addr", &metrics_addr]);
    for labels in [json!({"drafs.dev/inject": "init"}), json!({"drafs.dev/inject": "x"}), json!({})] {
        request(hook.addr, &hook.ca(), "POST", "/mutate", &review(labels)).unwrap();
    }
    request(hook.addr, &hook.ca(), "POST", "/mutate", b"nope").unwrap();
    let text = metrics_text(&metrics_addr);
    for line in [
        "drafs_webhook_reviews_total{verdict=\"patched\"} 1\n",
        "drafs_webhook_reviews_total{verdict=\"denied\"} 1\n",
        "drafs_webhook_reviews_total{verdict=\"allowed\"} 1\n",
        "drafs_webhook_reviews_total{verdict=\"bad_request\"} 1\n",
        "drafs_webhook_review_seconds_count 4\n",
        "drafs_webhook_review_seconds_bucket{le=\"+Inf\"} 4\n",
    ] {
        assert!(text.contains(line), "{line} missing in:\n{text}");
    }
}

#[test]
fn a_panic_deciding_a_review_fails_that_review_alone_and_the_webhook_keeps_serving() {
    // The tests' (debug) binary panics on a review holding this marker.
    let marker = "panic-marker-5e1f";
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let hook = WebhookProcess::start_with(
        "registry.example/drafs:test",
        &["--metrics-addr", &metrics_addr],
        &[("DRAFS_TEST_PANIC_ON", marker)],
    );
    let ca = hook.ca();
    let panicking = review(json!({"drafs.dev/inject": "init", "note": marker}));
    let (status, body) = request(hook.addr, &ca, "POST", "/mutate", &panicking).unwrap();
    assert_eq!(status, 500, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("could not decide this review"));
    // A large review is decided on its own thread: a panic there is contained too.
    let mut large = pod_review(3000);
    let at = large.len() - 2;
    large.splice(at..at, format!(",\"note\":\"{marker}\"").into_bytes());
    let (status, _) = request(hook.addr, &ca, "POST", "/mutate", &large).unwrap();
    assert_eq!(status, 500, "{}", hook.log_text());
    // The process lives and goes on answering, small and large reviews alike.
    let (status, body) =
        request(hook.addr, &ca, "POST", "/mutate", &review(json!({"drafs.dev/inject": "init"}))).unwrap();
    assert!(status == 200 && patched(&body), "{status}: {}", hook.log_text());
    let (status, body) = request(hook.addr, &ca, "POST", "/mutate", &pod_review(3000)).unwrap();
    assert!(status == 200 && patched(&body), "{status}: {}", hook.log_text());
    let text = metrics_text(&metrics_addr);
    assert!(text.contains("drafs_webhook_reviews_total{verdict=\"panicked\"} 2\n"), "{text}");
    assert!(text.contains("drafs_webhook_reviews_total{verdict=\"patched\"} 2\n"), "{text}");
    let log = hook.log_text();
    assert!(log.contains("contained a panic") && log.contains("DRAFS_TEST_PANIC_ON matched"), "{log}");
}

#[test]
fn bad_certificates_and_addresses_fail_at_start_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    tls::ca(dir.path(), "ca").unwrap();
    tls::serving(dir.path(), "ca", "a", "IP:127.0.0.1", 2).unwrap();
    tls::serving(dir.path(), "ca", "b", "IP:127.0.0.1", 3).unwrap();
    tls::serving_dated(dir.path(), "ca", "old", "IP:127.0.0.1", 4, Some(("20200101000000Z", "20200201000000Z")))
        .unwrap();
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    let cases = [
        (p("a.crt"), p("b.key"), "do not belong together"),
        (p("old.crt"), p("old.key"), "certificate 1 expired at 2020-02-01T00:00:00Z"),
        (p("missing.crt"), p("a.key"), "cannot read"),
        (p("a.key"), p("a.key"), "no PEM certificate"),
        (p("a.crt"), p("a.crt"), "no PEM private key"),
    ];
    for (cert, key, expected) in cases {
        let child = std::process::Command::new(drafs_bin())
            .args(["webhook", "--addr", "127.0.0.1:0", "--image", "drafs:test", "--tls-cert", &cert, "--tls-key", &key])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait_output(child, LIMIT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(expected), "{expected}: {err}");
    }
    let out = std::process::Command::new(drafs_bin()).args(["webhook", "--tls-cert", &p("a.crt")]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--image"));
    let out = std::process::Command::new(drafs_bin())
        .args(["webhook", "--image", "has space", "--tls-cert", &p("a.crt"), "--tls-key", &p("a.key")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    for (flag, value, expected) in [("--dns-name", "not a name!", "is not a DNS name"), ("--drain", "soon", "--drain")]
    {
        let out = std::process::Command::new(drafs_bin())
            .args(["webhook", "--addr", "127.0.0.1:0", "--image", "drafs:test", flag, value])
            .args(["--tls-cert", &p("a.crt"), "--tls-key", &p("a.key")])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(expected), "{expected}: {err}");
    }
}

#[test]
fn sigterm_drains_answering_with_readyz_503_then_exits_0() {
    let mut hook = WebhookProcess::start(&["--drain", "5s"]);
    let ca = hook.ca();
    assert_eq!(request(hook.addr, &ca, "GET", "/readyz", b"").unwrap().0, 200);
    unsafe { libc::kill(hook.child.id() as i32, libc::SIGTERM) };
    let signalled = std::time::Instant::now();
    // The port stays open: /readyz says why it is not ready, reviews are answered.
    let draining = wait_for(Duration::from_secs(10), || {
        request(hook.addr, &ca, "GET", "/readyz", b"")
            .is_ok_and(|(status, body)| status == 503 && String::from_utf8_lossy(&body).contains("shutting down"))
    });
    assert!(
        draining,
        "no 503 from /readyz after SIGTERM: {:?}\n{}",
        request(hook.addr, &ca, "GET", "/readyz", b""),
        hook.log_text()
    );
    let (status, body) =
        request(hook.addr, &ca, "POST", "/mutate", &review(json!({"drafs.dev/inject": "init"}))).unwrap();
    assert_eq!(status, 200);
    assert!(patched(&body));
    assert!(hook.child.try_wait().unwrap().is_none(), "exited during the drain");
    // Then the port closes and the process exits 0, no sooner than the drain.
    let status = loop {
        if let Some(status) = hook.child.try_wait().unwrap() {
            break status;
        }
        assert!(signalled.elapsed() < LIMIT, "webhook did not stop after its drain");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}: {}", hook.log_text());
    assert!(signalled.elapsed() >= Duration::from_secs(5), "stopped {:?} after SIGTERM", signalled.elapsed());
    assert!(request(hook.addr, &ca, "GET", "/healthz", b"").is_err(), "the port is closed");
    wait_until("the log says why it stopped", LIMIT, || hook.log_text().contains("SIGTERM"));
}

#[test]
fn idle_connections_never_lock_a_client_out() {
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let hook = WebhookProcess::start(&["--metrics-addr", &metrics_addr]);
    let config = tls_config(&hook.ca());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // More idle connections than the webhook serves at once: some with
        // their TLS handshake done, most without; none sends a request.
        let mut idle_tls = Vec::new();
        for _ in 0..16 {
            idle_tls.push(connect(hook.addr, config.clone()).await.unwrap());
        }
        let mut idle = Vec::new();
        for _ in 0..drafs::admission::webhook::MAX_CONNECTIONS + 16 {
            idle.push(tokio::net::TcpStream::connect(hook.addr).await.unwrap());
        }
        // A new client still gets its handshake and its answer, while they
        // are all still open (the API server waits 5 s, a probe 1 s).
        let answer = tokio::time::timeout(
            Duration::from_secs(3),
            request_async(hook.addr, config.clone(), "GET", "/healthz", vec![]),
        )
        .await;
        assert!(matches!(answer, Ok(Ok((200, _)))), "{answer:?}");
        drop((idle, idle_tls));
    });
    let metrics = metrics_text(&metrics_addr);
    let evicted: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("drafs_webhook_connections_evicted_total "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(evicted > 0, "{metrics}");
}

#[test]
fn a_small_review_is_answered_while_a_large_one_is_decided() {
    let hook = WebhookProcess::start(&[]);
    let config = tls_config(&hook.ca());
    let large = Bytes::from(pod_review(3000));
    let small = Bytes::from(review(json!({"drafs.dev/inject": "init"})));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let mut small_sender = connect(hook.addr, config.clone()).await.unwrap();
        let mut large_sender = connect(hook.addr, config.clone()).await.unwrap();
        let large_task = tokio::spawn(async move { post(&mut large_sender, large).await });
        let deciding = "large review: deciding it on the large-review thread";
        let log = hook.log.clone();
        let seen = tokio::task::spawn_blocking(move || {
            wait_for(LIMIT, || log.lock().unwrap().iter().any(|l| l.contains(deciding)))
        });
        assert!(seen.await.unwrap(), "the large review was never decided: {}", hook.log_text());
        // The large review is being decided: a small one is answered before it.
        let (status, answer, _) = post(&mut small_sender, small).await.unwrap();
        assert!(status == 200 && patched(&answer), "{status}");
        assert!(!large_task.is_finished(), "the large review was answered first");
        let (status, answer, _) = large_task.await.unwrap().unwrap();
        assert!(status == 200 && patched(&answer), "{status}: {}", String::from_utf8_lossy(&answer));
    });
    // Large reviews are decided at a lower CPU priority than the rest.
    let tasks = std::fs::read_dir(format!("/proc/{}/task", hook.child.id())).unwrap();
    let nice: Vec<(String, i64)> = tasks
        .filter_map(|t| {
            let stat = std::fs::read_to_string(t.ok()?.path().join("stat")).ok()?;
            let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
            Some((name.to_string(), rest.split(' ').nth(16)?.parse().ok()?))
        })
        .collect();
    // Relative to the webhook's own (the test may itself run under `nice`),
    // clamped at the lowest priority, 19.
    let own = nice.iter().find(|(name, _)| name == "drafs").map(|(_, n)| *n).expect("the main thread");
    let want = (own + 10).min(19);
    assert!(nice.iter().any(|(name, n)| name.starts_with("drafs-large") && *n == want), "{nice:?}");
}

#[test]
fn a_pod_too_large_to_read_is_denied_and_a_crafted_8_mib_body_is_answered() {
    let hook = WebhookProcess::start(&[]);
    let ca = hook.ca();
    let mut labels = json!({"drafs.dev/inject": "init"});
    for i in 0..200_000 {
        labels[format!("l{i}")] = json!("");
    }
    let (status, body) = request(hook.addr, &ca, "POST", "/mutate", &review(labels)).unwrap();
    assert_eq!(status, 200);
    let answer = json_body(&body);
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("too large for the drafs webhook"), "{message}");
    // Four million zeros where drafs never looks, as many as 8 MiB holds.
    let crafted = zeros_review(((drafs::admission::webhook::MAX_BODY) - zeros_review(1).len()) / 2 + 1);
    assert!(crafted.len() <= drafs::admission::webhook::MAX_BODY);
    let (status, body) = request(hook.addr, &ca, "POST", "/mutate", &crafted).unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body[..body.len().min(200)]));
    assert!(patched(&body));
    assert!(body.len() < 16 << 10, "the answer repeats the pod: {} bytes", body.len());
}

#[test]
fn a_renewed_certificate_that_is_expired_or_not_yet_valid_is_refused() {
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let hook = WebhookProcess::start(&["--metrics-addr", &metrics_addr]);
    let dir = hook.dir.path();
    tls::ca(dir, "ca2").unwrap();
    let san = "IP:127.0.0.1,DNS:localhost";
    tls::serving_dated(dir, "ca2", "expired", san, 3, Some(("20200101000000Z", "20200201000000Z"))).unwrap();
    hook.rotate("..v2", &dir.join("expired.crt"), &dir.join("expired.key"));
    wait_until("the expired certificate is refused", LIMIT, || {
        hook.log_text().contains("certificate 1 expired at 2020-02-01T00:00:00Z")
    });
    tls::serving_dated(dir, "ca2", "future", san, 4, Some(("20991231000000Z", "21000101000000Z"))).unwrap();
    hook.rotate("..v3", &dir.join("future.crt"), &dir.join("future.key"));
    wait_until("the not yet valid certificate is refused", LIMIT, || {
        hook.log_text().contains("certificate 1 is not valid before 2099-12-31T00:00:00Z")
    });
    // The first certificate is still served; the refusals are warnings, counted.
    assert_eq!(request(hook.addr, &hook.ca(), "GET", "/healthz", b"").unwrap().0, 200);
    assert!(!hook.log_text().contains("certificate reloaded"), "{}", hook.log_text());
    let warnings = hook
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("WARN") && l.contains("keeping the previous one"))
        .count();
    assert_eq!(warnings, 2, "{}", hook.log_text());
    let metrics = metrics_text(&metrics_addr);
    assert!(metrics.contains("drafs_webhook_cert_errors_total 2\n"), "{metrics}");
    assert!(metrics.contains("drafs_webhook_cert_reloads_total 0\n"), "{metrics}");
}

#[test]
fn a_certificate_for_other_names_is_refused_at_start_and_when_renewed() {
    let hook = WebhookProcess::start(&["--dns-name", "localhost", "--dns-name", "127.0.0.1"]);
    let dir = hook.dir.path();
    tls::ca(dir, "ca2").unwrap();
    tls::serving(dir, "ca2", "other", "DNS:drafs-webhook.other.svc", 3).unwrap();
    hook.rotate("..v2", &dir.join("other.crt"), &dir.join("other.key"));
    wait_until("the certificate for other names is refused", LIMIT, || {
        hook.log_text().contains("not valid for localhost (--dns-name); its DNS names: drafs-webhook.other.svc")
    });
    assert_eq!(request(hook.addr, &hook.ca(), "GET", "/healthz", b"").unwrap().0, 200, "the first one is served");
    // At start: exit 2, saying why.
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let child = std::process::Command::new(drafs_bin())
        .args(["webhook", "--addr", "127.0.0.1:0", "--image", "drafs:test", "--dns-name", "localhost"])
        .args(["--tls-cert", &p("other.crt"), "--tls-key", &p("other.key")])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_output(child, LIMIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("not valid for localhost"), "{err}");
}

/// The shipped manifests agree with the webhook: the name it checks its
/// certificate against is the Service's and the certificate's, the grace
/// period covers the drain and the last reviews, and the optional network
/// policy selects its pods and opens their ports.
#[test]
fn the_shipped_manifests_fit_the_drain_the_names_and_the_ports() {
    use support::{read, yaml_docs};
    let deployment = yaml_docs(&read("deploy/webhook/core/deployment.yaml")).remove(0);
    let service = yaml_docs(&read("deploy/webhook/core/service.yaml")).remove(0);
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    let arg = |flag: &str| {
        container["args"].as_array().unwrap().iter().filter_map(Value::as_str).find_map(|a| a.strip_prefix(flag))
    };
    let host = format!(
        "{}.{}.svc",
        service["metadata"]["name"].as_str().unwrap(),
        service["metadata"]["namespace"].as_str().unwrap()
    );
    assert_eq!(arg("--dns-name="), Some(host.as_str()));
    let certificate = yaml_docs(&read("deploy/webhook/certificate.yaml"))
        .into_iter()
        .find(|d| d["kind"] == "Certificate" && d["metadata"]["name"] == "drafs-webhook")
        .unwrap();
    assert!(certificate["spec"]["dnsNames"].as_array().unwrap().contains(&json!(host)));
    assert!(read("deploy/webhook/manual/certs.sh").contains(&format!("service={host}\n")));
    let drain = drafs::cmd::cli::parse_duration(arg("--drain=").unwrap()).unwrap();
    let grace = Duration::from_secs(pod["spec"]["terminationGracePeriodSeconds"].as_u64().unwrap());
    assert!(
        drain + drafs::admission::webhook::FINISH < grace,
        "{drain:?} + {:?} >= {grace:?}",
        drafs::admission::webhook::FINISH
    );

    let policy = yaml_docs(&read("deploy/webhook/networkpolicy.yaml")).remove(0);
    assert_eq!(policy["metadata"]["namespace"], deployment["metadata"]["namespace"]);
    assert_eq!(policy["spec"]["podSelector"]["matchLabels"], pod["metadata"]["labels"]);
    let open: Vec<&Value> = policy["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["ports"].as_array().unwrap())
        .map(|p| &p["port"])
        .collect();
    for port in container["ports"].as_array().unwrap() {
        assert!(open.contains(&&port["containerPort"]), "port {port} not opened: {policy}");
    }
}

/// `--namespace-mode csi` with a renamed driver (the chart passes its
/// `node.driverName` as `--csi-driver`): an unlabelled pod of an opted-in
/// namespace gets a volume of that driver, a pod with one already is left
/// alone, and a require drafs node could never meet is denied.
#[test]
fn the_namespace_mode_csi_names_the_driver_it_is_told() {
    let hook = WebhookProcess::start(&["--namespace-mode", "csi", "--csi-driver", "node.drafs.example"]);
    let ca = hook.ca();
    let ask = |path: &str, body: &[u8]| {
        let (status, body) = request(hook.addr, &ca, "POST", path, body).unwrap();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        json_body(&body)["response"].clone()
    };
    let answer = ask("/mutate/namespace", &review(json!({})));
    assert_eq!(answer["allowed"], true, "{answer}");
    let bytes: k8s_openapi::ByteString = serde_json::from_value(answer["patch"].clone()).expect("a patch");
    let patch: Value = serde_json::from_slice(&bytes.0).unwrap();
    let volume = patch.as_array().unwrap().iter().find(|op| op["path"] == "/spec/volumes").expect("volumes added");
    assert_eq!(volume["value"], json!([{"name": "dra", "csi": {"driver": "node.drafs.example", "readOnly": true}}]));
    assert!(!patch.to_string().contains("initContainers"), "no container: {patch}");

    // The pod as the API server stored it: already served by that driver.
    let mut served = trainer(json!({"drafs.dev/inject": "csi"})).build();
    served["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "dra", "mountPath": "/dra", "readOnly": true}]);
    served["spec"]["volumes"] = json!([{"name": "dra", "csi": {"driver": "node.drafs.example", "readOnly": true}}]);
    let served = create_review(served);
    for path in ["/mutate", "/mutate/namespace"] {
        let answer = ask(path, &served);
        assert_eq!(answer["allowed"], true, "{path}: {answer}");
        assert!(answer.get("patch").is_none(), "{path}: the pod has drafs already: {answer}");
    }

    let mut prepared: Value = serde_json::from_slice(&review(json!({}))).unwrap();
    prepared["request"]["object"]["metadata"]["annotations"] =
        json!({"drafs.dev/require": "nic/nic/0/.status/interfaceName"});
    let answer = ask("/mutate/namespace", &serde_json::to_vec(&prepared).unwrap());
    assert_eq!(answer["allowed"], false, "{answer}");
    let message = answer["status"]["message"].as_str().unwrap();
    assert!(message.contains("is a value the driver reports when it prepares the device"), "{message}");
}
