//! `drafs serve` under a burst of changes: 1,000 changes of the pod's slice
//! in 0.4 s (8 devices x 30 attributes, every value new each time), as a
//! driver rewriting its slices in a loop would send them.
//!
//! Run: `cargo bench --bench burst` (as root, with /dev/fuse, for the FUSE
//! row). For each backend, a fresh `serve` (log level info) against the test
//! API server; prints a Markdown table: the trees written for the burst (from
//! `drafs_tree_updates_total`), the time from the burst's last change until
//! its value is read from the tree, and the process's resident set before the
//! burst and at its peak (VmHWM), of the FUSE server (not its supervisor)
//! with FUSE. `DRAFS_BIN=path` measures another binary;
//! `cargo bench --bench burst -- FUSE tmpfs` runs only the rows named so.

use drafs_test_support as support;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use support::*;

const CHANGES: usize = 1000;
const BURST: Duration = Duration::from_millis(400);
/// Long enough for a binary that writes every change (the figures before coalescing).
const LIMIT: Duration = Duration::from_secs(600);

/// A bare watch of the node's slices on the test server, read on a thread:
/// when the event holding `marker` arrived (what the server's own streaming
/// takes, to tell apart from what drafs takes).
fn watch_for(api: &TestApi, marker: String) -> std::thread::JoinHandle<Instant> {
    use std::io::{Read, Write};
    let addr = api.url().trim_start_matches("http://").to_string();
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "GET /apis/resource.k8s.io/v1/resourceslices?watch=true&fieldSelector=spec.nodeName%3Dn1 HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    )
    .unwrap();
    std::thread::spawn(move || {
        let mut seen: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = stream.read(&mut buf).unwrap();
            assert!(n > 0, "the watch ended before {marker}");
            let from = seen.len().saturating_sub(marker.len());
            seen.extend_from_slice(&buf[..n]);
            if seen[from..].windows(marker.len()).any(|w| w == marker.as_bytes()) {
                return Instant::now();
            }
            // Keep only a tail long enough to find a marker cut between reads.
            if seen.len() > 1 << 20 {
                seen.drain(..seen.len() - marker.len());
            }
        }
    })
}

/// CPU time the process used so far (user + system).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name (in parentheses), utime and stime are the 12th and 13th fields.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<u64> = rest.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis((fields.get(11).unwrap_or(&0) + fields.get(12).unwrap_or(&0)) * 1000 / ticks)
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
    delivered_after: Duration,
    cpu: Duration,
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
    // The FUSE server, not the supervisor that `serve --backend fuse` forks it from.
    let pid = if backend == "fuse" { fuse_server_of(child.id()).expect("the FUSE server") as u32 } else { child.id() };
    let rss_before = proc_status_kib(pid, "VmRSS:");
    let before = tree_updates(&addr);
    let cpu_before = cpu_time(pid);
    let changes: Vec<_> = (1..=CHANGES).map(eight_device_slice_object).collect();
    let watcher = watch_for(&api, format!("value-7-29-{CHANGES}\""));
    let start = Instant::now();
    for (i, change) in changes.into_iter().enumerate() {
        let generation = i + 1;
        api.apply(change);
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
    let delivered_after = watcher.join().unwrap().duration_since(start).saturating_sub(burst);
    let writes = tree_updates(&addr) - before;
    let cpu = cpu_time(pid) - cpu_before;
    let peak = proc_status_kib(pid, "VmHWM:");
    let _ = child.kill();
    let _ = child.wait();
    if backend == "fuse" {
        detach(dir);
    }
    Row { writes, burst, visible_after, delivered_after, cpu, rss_before, peak }
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
    // `cargo bench --bench burst -- tmpfs`: only the rows whose name has a given word.
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    cases.retain(|(name, ..)| only.is_empty() || only.iter().any(|w| name.contains(w.as_str())));
    println!("### A burst: {CHANGES} changes of 8 devices x 30 attributes in {} ms\n", BURST.as_millis());
    println!(
        "| backend | trees written | burst took | last value read after the burst (a bare watch got it after) | CPU time of drafs | VmRSS before | peak (VmHWM) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, backend, dir) in cases {
        let row = burst(backend, &dir, &scratch.path().join(format!("{backend}.log")));
        println!(
            "| {name} | {} | {:.0} ms | {:.1} ms ({:.1} ms) | {:.2} s | {:.1} MiB | {:.1} MiB |",
            row.writes,
            row.burst.as_secs_f64() * 1e3,
            row.visible_after.as_secs_f64() * 1e3,
            row.delivered_after.as_secs_f64() * 1e3,
            row.cpu.as_secs_f64(),
            row.rss_before as f64 / 1024.0,
            row.peak as f64 / 1024.0,
        );
    }
}
