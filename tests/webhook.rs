//! `drafs webhook` as a process over real TLS: reviews, bad requests, certificate
//! rotation, bad certificates, shutdown.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::webhook::{WebhookProcess, create_review, request};
use support::{drafs_bin, free_port, http_get, tls, wait_output, wait_until};

const LIMIT: Duration = Duration::from_secs(30);

fn review(labels: Value) -> Vec<u8> {
    create_review(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "trainer-", "labels": labels},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}],
            "containers": [{"name": "app", "image": "app", "resources": {"claims": [{"name": "gpu"}]}}]
        }
    }))
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
    assert!(answer["response"]["status"]["message"].as_str().unwrap().contains("init, sidecar-fuse or sidecar-files"));

    // Malformed bodies: 400 with the reason, and the next review is answered.
    for bad in [&b"{not json"[..], b"{}", b"[]", b""] {
        let (status, body) = request(hook.addr, &ca, "POST", "/mutate", bad).unwrap();
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    }
    let huge = vec![b' '; webhook_max_body() + 1];
    let (status, _) = request(hook.addr, &ca, "POST", "/mutate", &huge).unwrap();
    assert_eq!(status, 413);
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

fn webhook_max_body() -> usize {
    drafs::webhook::MAX_BODY
}

#[test]
fn rotated_certificates_are_served_without_a_restart_and_broken_ones_are_not() {
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let hook = WebhookProcess::start(&["--metrics-addr", &metrics_addr]);
    let dir = hook.dir.path();
    // A new CA and certificate, swapped in as a Secret volume update does.
    tls::ca(dir, "ca2").unwrap();
    tls::serving(dir, "ca2", "next", "IP:127.0.0.1", 3).unwrap();
    let new_ca = dir.join("ca2.crt");
    assert!(request(hook.addr, &new_ca, "GET", "/healthz", b"").is_err(), "the new CA is not trusted yet");
    hook.rotate("..v2", &dir.join("next.crt"), &dir.join("next.key"));
    wait_until("the rotated certificate is served", LIMIT, || {
        request(hook.addr, &new_ca, "GET", "/healthz", b"").is_ok_and(|(s, _)| s == 200)
    });
    assert!(request(hook.addr, &hook.ca(), "GET", "/healthz", b"").is_err(), "the old certificate is gone");

    // A broken certificate keeps the last good one, with a warning.
    std::fs::write(dir.join("broken.crt"), "not a certificate").unwrap();
    hook.rotate("..v3", &dir.join("broken.crt"), &dir.join("next.key"));
    wait_until("the broken certificate is reported", LIMIT, || hook.log_text().contains("keeping the previous one"));
    assert_eq!(request(hook.addr, &new_ca, "GET", "/readyz", b"").unwrap().0, 200);
    let metrics = metrics_text(&metrics_addr);
    assert!(metrics.contains("drafs_webhook_cert_reloads_total 1\n"), "{metrics}");
    assert!(metrics.contains("drafs_webhook_cert_errors_total 1\n"), "{metrics}");
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
fn bad_certificates_and_addresses_fail_at_start_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    tls::ca(dir.path(), "ca").unwrap();
    tls::serving(dir.path(), "ca", "a", "IP:127.0.0.1", 2).unwrap();
    tls::serving(dir.path(), "ca", "b", "IP:127.0.0.1", 3).unwrap();
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    let cases = [
        (p("a.crt"), p("b.key"), "do not belong together"),
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
}

#[test]
fn sigterm_finishes_and_exits_0() {
    let mut hook = WebhookProcess::start(&[]);
    assert_eq!(request(hook.addr, &hook.ca(), "GET", "/readyz", b"").unwrap().0, 200);
    unsafe { libc::kill(hook.child.id() as i32, libc::SIGTERM) };
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = hook.child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < LIMIT, "webhook did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}: {}", hook.log_text());
    wait_until("the log says why it stopped", LIMIT, || hook.log_text().contains("SIGTERM"));
}
