//! `drafs serve`: read path, update propagation and memory.
//!
//! Run: `cargo bench --bench serve` (as root, with /dev/fuse). Prints Markdown.
//! - read path: open+read+close of one attribute file, 100k times, through the
//!   FUSE mount and through the same tree written by `init` on tmpfs;
//! - update propagation: from the change in the test API server (20 ms of latency
//!   injected per request) to the new value read through the mount;
//! - health propagation: from the kubelet's health report in the pod's status
//!   (written to the test API server, 20 ms of latency) to `.health` read;
//! - memory: resident set size of `serve` with 8 devices x 30 attributes after
//!   10k reads and 100 updates.

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use support::*;

const READS: usize = 100_000;
const UPDATES: usize = 100;

fn setup() -> (TestApi, Env) {
    let api = api_for("ml");
    eight_device_pod(&api);
    eight_device_slice(&api, 0);
    let env = Env::new(&api, "ml", "p", TOKEN);
    (api, env)
}

fn read_loop(path: &Path, n: usize) -> Duration {
    let mut buf = [0u8; 256];
    let start = Instant::now();
    for _ in 0..n {
        let mut f = std::fs::File::open(path).unwrap();
        let len = f.read(&mut buf).unwrap();
        assert!(len > 0);
    }
    start.elapsed()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// The time from `start` until `file` reads `want` (spinning: a sleep would be the figure).
fn until_reads(file: &Path, want: &str, start: Instant) -> Duration {
    loop {
        if std::fs::read_to_string(file).is_ok_and(|v| v == want) {
            return start.elapsed();
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{} never read {want:?}", file.display());
        std::hint::spin_loop();
    }
}

/// Change attr0 of g0 `UPDATES` times and time each change until `file` shows it.
fn propagation(api: &TestApi, file: &Path, serve: &mut Serve) -> Vec<Duration> {
    let mut times = Vec::new();
    for generation in 1..=UPDATES {
        let want = format!("value-0-0-{generation}");
        let start = Instant::now();
        eight_device_slice(api, generation);
        times.push(until_reads(file, &want, start));
        let _ = serve;
    }
    times.sort();
    times
}

/// Flip g0's health in the pod's status (as the kubelet writes it) `UPDATES`
/// times and time each flip until `file` (its `.health`) shows it.
fn health_propagation(api: &TestApi, file: &Path) -> Vec<Duration> {
    let mut times = Vec::new();
    for i in 0..UPDATES {
        let want = if i % 2 == 0 { "Unhealthy" } else { "Healthy" };
        let mut pod = api.get("Pod", "ml", "p").unwrap();
        pod["status"]["containerStatuses"] = serde_json::json!([{
            "name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
            "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": [
                {"resourceID": "gpu.example.com/n1/g0", "health": want}]}]}]);
        let start = Instant::now();
        api.apply(pod);
        times.push(until_reads(file, want, start));
    }
    times.sort();
    times
}

fn main() {
    if !require_fuse() {
        return;
    }
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };

    // Read path.
    let (api, env) = setup();
    let scratch = tempfile::tempdir_in(&base).unwrap();
    let tmpfs_dir = scratch.path().join("init");
    let out = env.run(&["init", "--dir", tmpfs_dir.to_str().unwrap()], Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    let mnt = env.path("mnt");
    let mut serve = Serve::start(&env, &mnt, &[]);
    serve.wait_for(".ready", Some(""), Duration::from_secs(60));
    let rel = "gpu/gpu/3/attr7";
    read_loop(&mnt.join(rel), 1000); // warm up both
    read_loop(&tmpfs_dir.join(rel), 1000);
    let fuse = read_loop(&mnt.join(rel), READS);
    let tmpfs = read_loop(&tmpfs_dir.join(rel), READS);
    let per = |d: Duration| d.as_nanos() as f64 / READS as f64 / 1000.0;
    println!("### Read path: open+read+close of one attribute, {READS} times\n");
    println!("| tree | total | per read |");
    println!("|---|---|---|");
    println!("| FUSE mount (`serve`) | {} | {:.2} µs |", ms(fuse), per(fuse));
    println!("| tmpfs written by `init` | {} | {:.2} µs |", ms(tmpfs), per(tmpfs));
    println!("\nFUSE / tmpfs: {:.2}x\n", fuse.as_secs_f64() / tmpfs.as_secs_f64());

    // Update propagation through FUSE and through the files backend, 20 ms latency.
    api.set_latency(Duration::from_millis(20));
    let fuse_times = propagation(&api, &mnt.join("gpu/gpu/0/attr0"), &mut serve);
    let files_dir = scratch.path().join("files");
    let mut files = Serve::start(&env, &files_dir, &["--backend", "files"]);
    files.wait_for(".ready", Some(""), Duration::from_secs(60));
    let files_times = propagation(&api, &files_dir.join("gpu/gpu/0/attr0"), &mut files);
    println!(
        "### Update propagation: change in the API server to the new value read ({UPDATES} updates, 20 ms latency per request)\n"
    );
    println!("| backend | median | p90 | max |");
    println!("|---|---|---|---|");
    for (name, t) in [("FUSE", &fuse_times), ("files", &files_times)] {
        println!("| {name} | {} | {} | {} |", ms(percentile(t, 0.5)), ms(percentile(t, 0.9)), ms(*t.last().unwrap()));
    }

    let fuse_health = health_propagation(&api, &mnt.join("gpu/gpu/0/.health"));
    let files_health = health_propagation(&api, &files_dir.join("gpu/gpu/0/.health"));
    println!(
        "\n### Health propagation: the kubelet's report in the pod's status to `.health` read ({UPDATES} flips, 20 ms latency per request)\n"
    );
    println!("| backend | median | p90 | max |");
    println!("|---|---|---|---|");
    for (name, t) in [("FUSE", &fuse_health), ("files", &files_health)] {
        println!("| {name} | {} | {} | {} |", ms(percentile(t, 0.5)), ms(percentile(t, 0.9)), ms(*t.last().unwrap()));
    }

    // Memory after 10k reads (plus the reads above) and the 100 updates above.
    read_loop(&mnt.join(rel), 10_000);
    // The FUSE server, not the supervisor that `serve --backend fuse` forks it from.
    let pid = serve.fuse_server_pid().expect("the FUSE server") as u32;
    let files_pid = files.child.as_ref().unwrap().id();
    println!(
        "\n### Memory: 8 devices x 30 attributes, after {} reads, {UPDATES} updates and {} health flips\n",
        READS + 12_000,
        2 * UPDATES
    );
    println!("| backend | VmRSS |");
    println!("|---|---|");
    println!("| FUSE | {:.1} MiB |", rss_kib(pid) as f64 / 1024.0);
    println!("| files | {:.1} MiB |", rss_kib(files_pid) as f64 / 1024.0);
}
