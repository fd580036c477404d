//! `drafs webhook`: time per admission review as the API server sees it, over
//! TLS on loopback, on kept-alive connections (the API server reuses them).
//! Small pods (one container) and large ones (40 containers, 80 volumes,
//! about 60 KB of JSON), one connection and four at once. Also the server's
//! own histogram and the webhook's peak memory.
//!
//! Then the large reviews, each sent to a fresh webhook process: the peak
//! memory (VmHWM) after one valid 1.4 MB and 3 MB review and one crafted
//! 8 MiB body (4 million zeros), and the time of small reviews on another
//! connection while 3 MB reviews are answered.
//!
//! Run: `cargo bench --bench webhook` (release build). Prints Markdown tables.
//! `cargo bench --bench webhook -- large` runs only the large-review part,
//! `-- throughput` only the first, `-- shapes` only the worst shapes (the
//! pods with the most memory per byte of JSON the webhook still answers).

use drafs_test_support as support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use support::webhook::{WebhookProcess, connect, patched, pod_review, post, tls_config, zeros_review};

const REVIEWS: usize = 2000;

/// `reviews` reviews on one kept-alive connection; the time of each.
async fn connection(
    hook: std::net::SocketAddr,
    config: Arc<rustls::ClientConfig>,
    body: Bytes,
    reviews: usize,
) -> Vec<Duration> {
    let mut sender = connect(hook, config).await.unwrap();
    let mut times = Vec::with_capacity(reviews);
    for _ in 0..reviews {
        let (status, answer, took) = post(&mut sender, body.clone()).await.unwrap();
        assert_eq!(status, 200);
        assert!(patched(&answer), "not patched");
        times.push(took);
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

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn throughput() {
    let hook = WebhookProcess::start(&[]);
    let config = tls_config(&hook.ca());
    let rt = runtime();
    println!("| pod | connections | reviews | p50 ms | p99 ms | max ms | reviews/s |");
    println!("|---|---|---|---|---|---|---|");
    for (name, containers) in [("1 container", 1), ("40 containers", 40)] {
        let body = Bytes::from(pod_review(containers));
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
    println!("\npeak RSS of the webhook: {:.1} MiB", mib(peak_rss_kib(hook.child.id())));
}

/// Containers that make a [`pod_review`] of about `bytes`.
fn containers_for(bytes: usize) -> usize {
    let per = pod_review(100).len() - pod_review(0).len();
    (bytes - pod_review(0).len()) / (per / 100)
}

/// Peak memory of a fresh webhook answering one `body`.
fn memory(rt: &tokio::runtime::Runtime, name: &str, body: Vec<u8>) {
    let hook = WebhookProcess::start(&[]);
    let config = tls_config(&hook.ca());
    let small = Bytes::from(pod_review(1));
    let len = body.len();
    let (status, answer, took) = rt.block_on(async {
        let mut sender = connect(hook.addr, config.clone()).await.unwrap();
        post(&mut sender, small).await.unwrap();
        post(&mut sender, Bytes::from(body)).await.unwrap()
    });
    let verdict = if status == 200 && patched(&answer) {
        "200, patched".to_string()
    } else {
        format!("{status}: {}", String::from_utf8_lossy(&answer[..answer.len().min(90)]).trim_end())
    };
    println!(
        "| {name} | {:.2} MiB | {verdict} | {:.0} ms | {:.1} MiB | {} KB |",
        len as f64 / (1 << 20) as f64,
        took.as_secs_f64() * 1000.0,
        mib(peak_rss_kib(hook.child.id())),
        answer.len() / 1024,
    );
}

/// Small reviews on one connection while `large` reviews are answered on
/// another, `rounds` times in a row.
fn small_during_large(rt: &tokio::runtime::Runtime, large: Vec<u8>, rounds: usize) {
    let hook = WebhookProcess::start(&[]);
    let config = tls_config(&hook.ca());
    let small = Bytes::from(pod_review(1));
    let large = Bytes::from(large);
    let (mut during, larges) = rt.block_on(async {
        let mut small_sender = connect(hook.addr, config.clone()).await.unwrap();
        let mut large_sender = connect(hook.addr, config.clone()).await.unwrap();
        for _ in 0..50 {
            post(&mut small_sender, small.clone()).await.unwrap();
        }
        let busy = Arc::new(AtomicBool::new(true));
        let done = busy.clone();
        let large_task = tokio::spawn(async move {
            let mut times = Vec::new();
            for _ in 0..rounds {
                let (status, _, took) = post(&mut large_sender, large.clone()).await.unwrap();
                times.push((status, took));
            }
            done.store(false, Ordering::Relaxed);
            times
        });
        let mut during = Vec::new();
        while busy.load(Ordering::Relaxed) {
            let (status, answer, took) = post(&mut small_sender, small.clone()).await.unwrap();
            assert!(status == 200 && patched(&answer), "small review: {status}");
            during.push(took);
        }
        (during, large_task.await.unwrap())
    });
    during.sort();
    let large_ms: Vec<String> =
        larges.iter().map(|(s, t)| format!("{s} in {:.0} ms", t.as_secs_f64() * 1000.0)).collect();
    println!("\nlarge reviews: {}", large_ms.join(", "));
    println!("| small reviews during them | p50 ms | p99 ms | max ms |\n|---|---|---|---|");
    println!(
        "| {} | {:.3} | {:.3} | {:.3} |",
        during.len(),
        percentile(&during, 0.5),
        percentile(&during, 0.99),
        percentile(&during, 1.0)
    );
}

/// A labelled pod's review with `n` copies of an element where drafs reads
/// it whole: the shapes that take the most memory per byte of JSON; or
/// [`pod_review`] with `n` containers.
fn shaped(shape: &str, n: usize) -> Vec<u8> {
    let mut pod: serde_json::Value = serde_json::from_slice(&pod_review(1)).unwrap();
    let pod = &mut pod["request"]["object"];
    match shape {
        "containers" => return pod_review(n),
        "labels" => {
            for i in 0..n {
                pod["metadata"]["labels"][format!("l{i}")] = serde_json::json!("");
            }
        }
        "mounts" => pod["spec"]["containers"][0]["volumeMounts"] = serde_json::json!(vec![serde_json::json!({}); n]),
        "claims" => pod["spec"]["containers"][0]["resources"]["claims"] = serde_json::json!(vec![0; n]),
        "resourceClaims" => pod["spec"]["resourceClaims"] = serde_json::json!(vec![vec![0]; n]),
        _ => unreachable!(),
    }
    support::webhook::create_review(pod.take())
}

/// The largest `n` (up to what fits in 8 MiB) for which a [`shaped`] review is still patched.
fn largest_answered(rt: &tokio::runtime::Runtime, shape: &str) -> usize {
    let hook = WebhookProcess::start(&[]);
    let config = tls_config(&hook.ca());
    // At most what fits in 8 MiB.
    let (mut low, mut high) = (1usize, if shape == "containers" { 9_000 } else { 8 << 20 });
    while high - low > high / 100 {
        let mid = (low + high) / 2;
        let body = shaped(shape, mid);
        let answered = body.len() <= 8 << 20
            && rt.block_on(async {
                let mut sender = connect(hook.addr, config.clone()).await.unwrap();
                let (status, answer, _) = post(&mut sender, Bytes::from(body)).await.unwrap();
                status == 200 && patched(&answer)
            });
        if answered { low = mid } else { high = mid }
    }
    low
}

fn large() {
    let rt = runtime();
    let idle = WebhookProcess::start(&[]);
    let rss_idle = peak_rss_kib(idle.child.id());
    drop(idle);
    println!("\npeak RSS of an idle webhook: {:.1} MiB", mib(rss_idle));
    println!("\n| review | body | answer | time | peak RSS | answer size |\n|---|---|---|---|---|---|");
    memory(&rt, "1 container", pod_review(1));
    let mid = pod_review(containers_for(1_430_000));
    memory(&rt, "1,500 containers (valid)", mid);
    let big = pod_review(containers_for(2_970_000));
    memory(&rt, "3,100 containers (valid)", big.clone());
    // As many zeros as fit in 8 MiB.
    let crafted = zeros_review(((8 << 20) - zeros_review(1).len()) / 2 + 1);
    assert!(crafted.len() <= 8 << 20);
    memory(&rt, "4M supplementalGroups (crafted)", crafted);
    small_during_large(&rt, big, 5);
}

/// The shapes that take the most memory per byte, each as large as the
/// webhook still answers (found by bisection on another webhook process).
fn shapes() {
    let rt = runtime();
    println!("\n| review | body | answer | time | peak RSS | answer size |\n|---|---|---|---|---|---|");
    for shape in ["containers", "labels", "mounts", "claims", "resourceClaims"] {
        let n = largest_answered(&rt, shape);
        let body = shaped(shape, n);
        memory(&rt, &format!("{n} {shape} (the most answered)"), body.clone());
        if shape == "mounts" {
            // The same, padded to 8 MiB with what drafs does not read.
            let mut pod: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let zeros = ((8 << 20) - body.len() - 100) / 2;
            pod["request"]["object"]["spec"]["securityContext"] =
                serde_json::json!({"supplementalGroups": vec![0; zeros]});
            let padded = serde_json::to_vec(&pod).unwrap();
            assert!(padded.len() <= 8 << 20);
            memory(&rt, &format!("{n} mounts and {zeros} supplementalGroups"), padded);
        }
    }
}

fn main() {
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let wants = |part: &str| only.is_empty() || only.iter().any(|o| o == part);
    if wants("throughput") {
        throughput();
    }
    if wants("large") {
        large();
    }
    if wants("shapes") {
        shapes();
    }
}
