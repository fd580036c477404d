//! `drafs init` against the real kube-apiserver on loopback (the kube tier's
//! control plane): time from spawning the binary to its exit with the tree
//! written, and the requests it made as the API server itself counts them
//! (`apiserver_request_total`, not drafs's own count).
//!
//! Run: `cargo bench --bench kube` (builds the control plane on first use, like
//! the kube tests). Prints a Markdown table.

#[path = "../tests/support/mod.rs"]
mod support;

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
}
