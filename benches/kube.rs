//! `drafs init` against the real kube-apiserver on loopback (the kube tier's
//! control plane): time from spawning the binary to its exit with the tree
//! written, and the requests it made as the API server itself counts them
//! (`apiserver_request_total`, not drafs's own count).
//!
//! Then what `serve` costs the API server while nothing changes: N sidecars
//! (the files backend, as many pods' worth) running for a window, counted by
//! the API server (`apiserver_longrunning_requests{verb="WATCH"}` for the
//! open watches, `apiserver_request_total{verb="WATCH"}` for the watches
//! opened in the window, `apiserver_watch_events_sizes_sum` for the bytes of
//! the events and bookmarks sent).
//!
//! Run: `cargo bench --bench kube` (builds the control plane on first use, like
//! the kube tests); `DRAFS_BENCH_PODS` (20) and `DRAFS_BENCH_WINDOW` (seconds,
//! 180) size the second part. Prints Markdown tables.

use drafs_test_support as support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::cluster::Scenario;
use support::controlplane::{self, ControlPlane};
use support::*;

const RUNS: usize = 10;

/// The resources drafs reads or writes; the API server's own background
/// requests (leases and the like) are left out.
const RESOURCES: [&str; 4] = ["pods", "resourceclaims", "resourceslices", "events"];

/// apiserver_request_total summed per "VERB resource" over the resources above.
fn request_counts(cp: &ControlPlane) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in cp.metrics_text().lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let label = |name: &str| {
            let start = line.find(&format!("{name}=\""))? + name.len() + 2;
            let end = line[start..].find('"')? + start;
            Some(line[start..end].to_string())
        };
        let (Some(verb), Some(resource), Some(sub)) = (label("verb"), label("resource"), label("subresource")) else {
            continue;
        };
        if !RESOURCES.contains(&resource.as_str()) || !sub.is_empty() {
            continue;
        }
        let value: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        *out.entry(format!("{verb} {resource}")).or_insert(0.0) += value;
    }
    out
}

fn diff(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0.0);
            (d > 0.0).then(|| (k.clone(), d.round() as u64))
        })
        .collect()
}

fn run_once(cp: &ControlPlane, fixture: &str, extra: &[&str]) -> (Duration, BTreeMap<String, u64>) {
    let mut sc = Scenario::from_fixture(cp, &read(fixture));
    sc.create_all();
    let dir = sc.path("dra");
    let mut args = vec!["init", "--dir", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let mut cmd = sc.kubeconfig_command(&args);
    cmd.env("DRAFS_LOG", "warn");
    let before = request_counts(cp);
    let start = Instant::now();
    let out = cmd.output().unwrap();
    let elapsed = start.elapsed();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Watches are counted when they end; let the server finish counting them.
    let mut after = request_counts(cp);
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(50));
        let again = request_counts(cp);
        if again == after {
            break;
        }
        after = again;
    }
    (elapsed, diff(&before, &after))
}

/// A metric's value summed over the series whose line contains every one of `with`.
fn metric_sum(text: &str, name: &str, with: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| with.iter().all(|w| l.contains(w)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Open watches, watches opened so far, and bytes of watch events sent so far, on drafs's resources.
fn watch_counters(cp: &ControlPlane) -> (f64, f64, f64) {
    let text = cp.metrics_text();
    let mut open = 0.0;
    let mut opened = 0.0;
    let mut bytes = 0.0;
    for resource in ["pods", "resourceclaims", "resourceslices"] {
        let r = format!("resource=\"{resource}\"");
        open += metric_sum(&text, "apiserver_longrunning_requests", &["verb=\"WATCH\"", &r]);
        opened += metric_sum(&text, "apiserver_request_total", &["verb=\"WATCH\"", &r]);
        bytes += metric_sum(&text, "apiserver_watch_events_sizes_sum", &[&r]);
    }
    (open, opened, bytes)
}

/// N `serve` sidecars of the 2-NIC pod, idle for `window`: what they hold and cost.
fn steady_state(cp: &ControlPlane, pods: usize, window: Duration) {
    let mut sc = Scenario::from_fixture(cp, &read("examples/offline/rdma-network.yaml"));
    sc.create_all();
    let (open_before, _, _) = watch_counters(cp);
    let mut children = Vec::new();
    for i in 0..pods {
        let dir = sc.path(&format!("dra-{i}"));
        let mut cmd = sc.kubeconfig_command(&["serve", "--backend", "files", "--dir", dir.to_str().unwrap()]);
        cmd.env("DRAFS_LOG", "warn").stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
        children.push((cmd.spawn().unwrap(), dir));
    }
    let ready = Instant::now() + Duration::from_secs(120);
    while children.iter().any(|(_, d)| !d.join(".ready").exists()) {
        assert!(Instant::now() < ready, "the sidecars were not ready within 2 minutes");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Let every watch be open and counted.
    std::thread::sleep(Duration::from_secs(5));
    let (open_start, opened_start, bytes_start) = watch_counters(cp);
    std::thread::sleep(window);
    let (open_end, opened_end, bytes_end) = watch_counters(cp);
    for (mut child, _) in children {
        let _ = child.kill();
        let _ = child.wait();
    }
    let per_pod = (open_start - open_before) / pods as f64;
    let minutes = window.as_secs_f64() / 60.0;
    println!(
        "| {pods} `serve` sidecars, 2-NIC pod, idle | {:.0} s | {per_pod:.1} | {:.0} | {:.2} | {:.0} B |",
        window.as_secs_f64(),
        open_end - open_before,
        (opened_end - opened_start) / pods as f64 / minutes,
        (bytes_end - bytes_start) / pods as f64 / minutes,
    );
}

fn main() {
    let cp = controlplane::shared().expect("the control plane (unset DRAFS_NO_KUBE_TESTS)");
    println!("| scenario | flags | median | p90 | requests per pod start (apiserver_request_total) |");
    println!("|---|---|---|---|---|");
    for (name, fixture) in [
        ("1 GPU, template claim", "examples/offline/gpu-training.yaml"),
        ("2 NICs with device status", "examples/offline/rdma-network.yaml"),
    ] {
        for extra in [&[][..], &["--events=all"][..]] {
            // One warm-up run (first connection, caches), then the measured ones.
            run_once(cp, fixture, extra);
            let mut times = Vec::new();
            let mut requests = BTreeMap::new();
            for _ in 0..RUNS {
                let (t, r) = run_once(cp, fixture, extra);
                times.push(t);
                requests = r;
            }
            times.sort();
            let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
            let total: u64 = requests.values().sum();
            let list: Vec<String> = requests.iter().map(|(k, v)| format!("{v} {k}")).collect();
            println!(
                "| {name} | {} | {} | {} | {total}: {} |",
                if extra.is_empty() { "(defaults)".to_string() } else { extra.join(" ") },
                ms(times[RUNS / 2]),
                ms(times[(RUNS * 9) / 10 - 1]),
                list.join(", ")
            );
        }
    }
    let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let pods = env("DRAFS_BENCH_PODS", 20) as usize;
    let window = Duration::from_secs(env("DRAFS_BENCH_WINDOW", 180));
    println!();
    println!(
        "| steady state | window | open watches per pod | open watches at the end | watches re-opened per pod and minute | watch bytes per pod and minute |"
    );
    println!("|---|---|---|---|---|---|");
    steady_state(cp, pods, window);
}
