//! `drafs webhook`: time per admission review as the API server sees it, over
//! TLS on loopback, on kept-alive connections (the API server reuses them).
//! Small pods (one container) and large ones (40 containers, 80 volumes,
//! about 60 KB of JSON), one connection and four at once. Also the server's
//! own histogram and the webhook's peak memory.
//!
//! Run: `cargo bench --bench webhook` (release build). Prints a Markdown table.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use support::webhook::{WebhookProcess, create_review, tls_config};

const REVIEWS: usize = 2000;

fn review(containers: usize) -> Vec<u8> {
    let containers: Vec<Value> = (0..containers)
        .map(|i| {
            json!({"name": format!("c{i}"), "image": "registry.example/app:1",
                   "resources": {"claims": [{"name": "gpu"}]},
                   "env": (0..10).map(|e| json!({"name": format!("VAR_{e}"), "value": "x".repeat(40)})).collect::<Vec<_>>(),
                   "volumeMounts": [{"name": format!("data-{i}"), "mountPath": format!("/data/{i}")},
                                    {"name": format!("cfg-{i}"), "mountPath": format!("/etc/cfg/{i}")}]})
        })
        .collect();
    let volumes: Vec<Value> = (0..containers.len())
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
                 "containers": containers, "volumes": volumes}}))
}

/// `reviews` reviews on one kept-alive connection; the time of each.
async fn connection(
    hook: std::net::SocketAddr,
    config: Arc<rustls::ClientConfig>,
    body: Bytes,
    reviews: usize,
) -> Vec<Duration> {
    let tcp = tokio::net::TcpStream::connect(hook).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(rustls_pki_types::ServerName::IpAddress(hook.ip().into()), tcp)
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    let mut times = Vec::with_capacity(reviews);
    for _ in 0..reviews {
        let req = hyper::Request::post("/mutate")
            .header("host", "webhook")
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))
            .unwrap();
        sender.ready().await.unwrap();
        let started = Instant::now();
        let response = sender.send_request(req).await.unwrap();
        assert_eq!(response.status(), 200);
        let answer = response.into_body().collect().await.unwrap().to_bytes();
        times.push(started.elapsed());
        assert!(answer.windows(9).any(|w| w == b"JSONPatch"), "not patched");
    }
    times
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    let hook = WebhookProcess::start(&[]);
    let config = tls_config(&hook.ca());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    println!("| pod | connections | reviews | p50 ms | p99 ms | max ms | reviews/s |");
    println!("|---|---|---|---|---|---|---|");
    for (name, containers) in [("1 container", 1), ("40 containers", 40)] {
        let body = Bytes::from(review(containers));
        // Warm up (first handshake, allocator).
        rt.block_on(connection(hook.addr, config.clone(), body.clone(), 50));
        for conns in [1usize, 4] {
            let started = Instant::now();
            let mut times: Vec<Duration> = rt.block_on(async {
                let tasks: Vec<_> = (0..conns)
                    .map(|_| tokio::spawn(connection(hook.addr, config.clone(), body.clone(), REVIEWS / conns)))
                    .collect();
                let mut all = Vec::new();
                for t in tasks {
                    all.extend(t.await.unwrap());
                }
                all
            });
            let wall = started.elapsed().as_secs_f64();
            times.sort();
            println!(
                "| {name} ({} KB) | {conns} | {} | {:.3} | {:.3} | {:.3} | {:.0} |",
                body.len() / 1024,
                times.len(),
                percentile(&times, 0.50),
                percentile(&times, 0.99),
                percentile(&times, 1.0),
                times.len() as f64 / wall
            );
        }
    }
    println!("\npeak RSS of the webhook: {:.1} MiB", peak_rss_kib(hook.child.id()) as f64 / 1024.0);
}
