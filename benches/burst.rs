//! `drafs serve` under a burst of changes: 1,000 changes of the pod's slice
//! in 0.4 s (8 devices x 30 attributes, every value new each time), as a
//! driver rewriting its slices in a loop would send them.
//!
//! Run: `cargo bench --bench burst` (as root, with /dev/fuse, for the FUSE
//! row). For each backend, a fresh `serve` (log level info) against the test
//! API server; prints a Markdown table: the trees written for the burst (from
//! `drafs_tree_updates_total`), the time from the burst's last change until
//! its value is read from the tree, and the process's resident set before the
//! burst and at its peak (VmHWM). `DRAFS_BIN=path` measures another binary.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use support::*;

const CHANGES: usize = 1000;
const BURST: Duration = Duration::from_millis(400);
/// Long enough for a binary that writes every change (the figures before coalescing).
const LIMIT: Duration = Duration::from_secs(600);

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn tree_updates(addr: &str) -> u64 {
    let (_, body) = http_get(addr, "/metrics").expect("metrics answer");
    body.lines()
        .find_map(|l| l.strip_prefix("drafs_tree_updates_total ")?.parse().ok())
        .expect("drafs_tree_updates_total")
}

struct Row {
    writes: u64,
    burst: Duration,
    visible_after: Duration,
    rss_before: u64,
    peak: u64,
}

fn burst(backend: &str, dir: &Path, log: &Path) -> Row {
    let api = api_for("ml");
    eight_device_pod(&api);
    eight_device_slice(&api, 0);
    let env = Env::new(&api, "ml", "p", TOKEN);
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child: Child = env
        .command(&["serve", "--backend", backend, "--dir", dir.to_str().unwrap(), "--metrics-addr", &addr])
        .env("DRAFS_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    wait_until("serve ready", Duration::from_secs(60), || {
        std::fs::read_to_string(dir.join(".ready")).is_ok() && http_get(&addr, "/metrics").is_some()
    });
    let pid = child.id();
    let rss_before = status_kib(pid, "VmRSS:");
    let before = tree_updates(&addr);
    let start = Instant::now();
    for generation in 1..=CHANGES {
        eight_device_slice(&api, generation);
        // Paced over BURST (as fast as the test server goes if it is slower).
        let due = start + BURST * generation as u32 / CHANGES as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    let burst = start.elapsed();
    let want = format!("value-7-29-{CHANGES}");
    let last = dir.join("gpu/gpu/7/attr29");
    wait_until("the last value", LIMIT, || std::fs::read_to_string(&last).is_ok_and(|v| v == want));
    let visible_after = start.elapsed() - burst;
    let writes = tree_updates(&addr) - before;
    let peak = status_kib(pid, "VmHWM:");
    let _ = child.kill();
    let _ = child.wait();
    if backend == "fuse" {
        detach(dir);
    }
    Row { writes, burst, visible_after, rss_before, peak }
}

fn main() {
    let scratch = tempfile::tempdir().unwrap();
    let shm = Path::new("/dev/shm");
    let tmpfs = tempfile::tempdir_in(if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() }).unwrap();
    let mut cases = vec![
        ("files, tmpfs", "files", tmpfs.path().join("dra")),
        ("files, ext4 disk", "files", scratch.path().join("dra")),
    ];
    if require_fuse() {
        cases.insert(0, ("FUSE", "fuse", scratch.path().join("mnt")));
    }
    println!("### A burst: {CHANGES} changes of 8 devices x 30 attributes in {} ms\n", BURST.as_millis());
    println!(
        "| backend | trees written | burst took | last value read after the burst | VmRSS before | peak (VmHWM) |"
    );
    println!("|---|---|---|---|---|---|");
    for (name, backend, dir) in cases {
        let row = burst(backend, &dir, &scratch.path().join(format!("{backend}.log")));
        println!(
            "| {name} | {} | {:.0} ms | {:.1} ms | {:.1} MiB | {:.1} MiB |",
            row.writes,
            row.burst.as_secs_f64() * 1e3,
            row.visible_after.as_secs_f64() * 1e3,
            row.rss_before as f64 / 1024.0,
            row.peak as f64 / 1024.0,
        );
    }
}
