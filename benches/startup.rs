//! Start-to-ready of `drafs init` against the test API server with injected latency.
//!
//! Run: `cargo bench --bench startup`. Prints a Markdown table: wall time from
//! spawning the binary to its exit (tree written), the API requests it made and
//! how many of them had to wait for each other (sequential round trips).

use drafs_test_support as support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

const RUNS: usize = 15;

struct Scenario {
    name: &'static str,
    setup: fn(&TestApi),
    namespace: &'static str,
    pod: &'static str,
}

fn node_local(api: &TestApi) {
    api.load_yaml(&read("examples/offline/gpu-training.yaml"));
}

fn network_attached(api: &TestApi) {
    api.apply(pod("ml", "p", "n1", &[("gpu", Ok("c")), ("net", Ok("fabric"))], &[]));
    api.apply(claim("ml", "c", Some(&[("gpu", "gpu.example.com", "n1", "g0")])));
    api.apply(claim("ml", "fabric", Some(&[("ib", "net.example.com", "fabric", "nic-1")])));
    api.apply(slice("n1", "gpu.example.com", "n1", 1, Some("n1"), &[("g0", json!({"uuid": {"string": "G0"}}))]));
    api.apply(slice(
        "fabric",
        "net.example.com",
        "fabric",
        1,
        None,
        &[("nic-1", json!({"ifName": {"string": "ib0"}}))],
    ));
}

fn eight_gpus(api: &TestApi) {
    eight_device_pod(api);
    eight_device_slice(api, 0);
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Median and p90 start-to-ready, requests and round trips of the last run.
fn measure(
    s: &Scenario,
    latency: Duration,
    out_base: &std::path::Path,
    events: bool,
) -> (Duration, Duration, usize, usize) {
    let api = api_for(s.namespace);
    (s.setup)(&api);
    api.set_latency(latency);
    let env = Env::new(&api, s.namespace, s.pod, TOKEN);
    let out_dir = tempfile::tempdir_in(out_base).unwrap();
    let dir = out_dir.path().join("dra");
    let mut times = Vec::new();
    let (mut requests, mut trips) = (0, 0);
    for _ in 0..RUNS {
        api.clear_requests();
        let start = Instant::now();
        // The default records no Normal event; `--events=all` does (one more request).
        let events_flag = if events { "--events=all" } else { "--events=warnings" };
        // Blocking wait, not polling: the time is the process's own.
        let out = env.command(&["init", "--dir", dir.to_str().unwrap(), events_flag]).output().unwrap();
        times.push(start.elapsed());
        assert!(out.status.success(), "{}", stderr(&out));
        let log = api.requests();
        requests = log.iter().filter(|r| r.verb == "get" || r.verb == "list").count();
        trips = sequential_round_trips(&log);
    }
    times.sort();
    (percentile(&times, 0.5), percentile(&times, 0.9), requests, trips)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let scenarios = [
        Scenario { name: "1 GPU, node-local slices", setup: node_local, namespace: "ml", pod: "trainer-0" },
        Scenario {
            name: "GPU + network-attached NIC (allNodes slice)",
            setup: network_attached,
            namespace: "ml",
            pod: "p",
        },
        Scenario { name: "8 GPUs x 30 attributes, node-local", setup: eight_gpus, namespace: "ml", pod: "p" },
    ];
    // The tree goes to tmpfs, like the recommended `emptyDir: {medium: Memory}`.
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    println!("tree written under {} ({RUNS} runs each; times are spawn-to-exit of the binary)\n", base.display());
    println!(
        "| scenario | median, 0 ms latency | median, 20 ms latency | p90, 20 ms latency | median, 20 ms, `--events=all` | API reads | sequential round trips of reads |"
    );
    println!("|---|---|---|---|---|---|---|");
    let latency = Duration::from_millis(20);
    for s in &scenarios {
        let (fast, _, _, _) = measure(s, Duration::ZERO, &base, false);
        let (median, p90, requests, trips) = measure(s, latency, &base, false);
        let (with_event, _, _, _) = measure(s, latency, &base, true);
        println!(
            "| {} | {} | {} | {} | {} | {requests} | {trips} |",
            s.name,
            ms(fast),
            ms(median),
            ms(p90),
            ms(with_event)
        );
    }
}
