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
//!   10k reads and 100 updates, and where it is at each phase (at ready, after
//!   the reads, the updates, the flips, and 12 s idle): /proc/PID/status and
//!   the kinds of mappings in /proc/PID/smaps (the heap, other anonymous
//!   mappings: malloc arenas and thread stacks).
//!
//! `DRAFS_BENCH_UPDATES=N` changes the number of updates and of flips (100);
//! `DRAFS_BENCH_SMAPS=DIR` keeps a copy of each process's smaps at each phase.

use drafs_test_support as support;

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use support::*;

const READS: usize = 100_000;

/// Updates of the slice (and flips of the health) per backend.
fn updates() -> usize {
    std::env::var("DRAFS_BENCH_UPDATES").ok().and_then(|v| v.parse().ok()).unwrap_or(100)
}

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

fn status_field(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    status_field(&std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap(), "VmRSS:")
}

/// Where a process's resident memory is, in KiB: /proc/PID/status, and
/// /proc/PID/smaps summed by kind of mapping.
struct Mem {
    phase: String,
    rss: u64,
    anon: u64,
    file: u64,
    threads: u64,
    /// The brk heap: glibc's main malloc arena (musl's malloc hardly uses it).
    heap: u64,
    /// Anonymous mappings other than the heap (glibc's per-thread arenas,
    /// musl's malloc, thread stacks, large allocations), with how many of
    /// them hold pages.
    other_anon: u64,
    other_anon_maps: usize,
}

impl Mem {
    fn sample(pid: u32, phase: &str) -> Mem {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
        if let Some(dir) = std::env::var_os("DRAFS_BENCH_SMAPS") {
            let name = format!("{pid}-{}.smaps", phase.replace(' ', "-"));
            std::fs::write(Path::new(&dir).join(name), &smaps).unwrap();
        }
        let (mut heap, mut other_anon, mut other_anon_maps) = (0, 0, 0);
        let mut name = String::new();
        for line in smaps.lines() {
            let mut fields = line.split_whitespace();
            let first = fields.next().unwrap_or("");
            if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
                // A mapping's header: range, perms, offset, dev, inode, [path].
                name = fields.nth(4).unwrap_or("").to_string();
            } else if first == "Rss:" {
                let kib: u64 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                match name.as_str() {
                    "[heap]" => heap += kib,
                    "" if kib > 0 => {
                        other_anon += kib;
                        other_anon_maps += 1;
                    }
                    _ => {}
                }
            }
        }
        Mem {
            phase: phase.to_string(),
            rss: status_field(&status, "VmRSS:"),
            anon: status_field(&status, "RssAnon:"),
            file: status_field(&status, "RssFile:"),
            threads: status_field(&status, "Threads:"),
            heap,
            other_anon,
            other_anon_maps,
        }
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

fn print_mem(backend: &str, samples: &[Mem]) {
    println!("\n#### {backend}: where the resident memory is (MiB)\n");
    println!("| phase | VmRSS | RssAnon | RssFile | heap (brk) | other anonymous (mappings) | threads |");
    println!("|---|---|---|---|---|---|---|");
    for m in samples {
        println!(
            "| {} | {} | {} | {} | {} | {} ({}) | {} |",
            m.phase,
            mib(m.rss),
            mib(m.anon),
            mib(m.file),
            mib(m.heap),
            mib(m.other_anon),
            m.other_anon_maps,
            m.threads
        );
    }
}

/// Read everything a process writes to its output, so that a long run never
/// blocks on a full pipe.
fn drain(child: &mut std::process::Child) {
    let mut sinks: Vec<Box<dyn Read + Send>> = Vec::new();
    if let Some(out) = child.stdout.take() {
        sinks.push(Box::new(out));
    }
    if let Some(err) = child.stderr.take() {
        sinks.push(Box::new(err));
    }
    for mut r in sinks {
        std::thread::spawn(move || std::io::copy(&mut r, &mut std::io::sink()));
    }
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

/// Change every value `updates()` times, from generation `from` on, and
/// time each change until `file` (attr0 of g0) shows it.
fn propagation(api: &TestApi, file: &Path, from: usize) -> Vec<Duration> {
    let mut times = Vec::new();
    for generation in from..from + updates() {
        let want = format!("value-0-0-{generation}");
        let start = Instant::now();
        eight_device_slice(api, generation);
        times.push(until_reads(file, &want, start));
    }
    times.sort();
    times
}

/// Flip g0's health in the pod's status (as the kubelet writes it) `updates()`
/// times and time each flip until `file` (its `.health`) shows it.
fn health_propagation(api: &TestApi, file: &Path) -> Vec<Duration> {
    let mut times = Vec::new();
    for i in 0..updates() {
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
    drain(serve.child.as_mut().unwrap());
    // The FUSE server, not the supervisor that `serve --backend fuse` forks it from.
    let pid = serve.fuse_server_pid().expect("the FUSE server") as u32;
    let mut fuse_mem = vec![Mem::sample(pid, "ready")];
    let rel = "gpu/gpu/3/attr7";
    read_loop(&mnt.join(rel), 1000); // warm up both
    read_loop(&tmpfs_dir.join(rel), 1000);
    let fuse = read_loop(&mnt.join(rel), READS);
    let tmpfs = read_loop(&tmpfs_dir.join(rel), READS);
    fuse_mem.push(Mem::sample(pid, &format!("after {} reads", READS + 1000)));
    let per = |d: Duration| d.as_nanos() as f64 / READS as f64 / 1000.0;
    println!("### Read path: open+read+close of one attribute, {READS} times\n");
    println!("| tree | total | per read |");
    println!("|---|---|---|");
    println!("| FUSE mount (`serve`) | {} | {:.2} µs |", ms(fuse), per(fuse));
    println!("| tmpfs written by `init` | {} | {:.2} µs |", ms(tmpfs), per(tmpfs));
    println!("\nFUSE / tmpfs: {:.2}x\n", fuse.as_secs_f64() / tmpfs.as_secs_f64());

    // Update propagation through FUSE and through the files backend, 20 ms
    // latency. The FUSE server also follows the files backend's updates.
    let n = updates();
    api.set_latency(Duration::from_millis(20));
    let fuse_times = propagation(&api, &mnt.join("gpu/gpu/0/attr0"), 1);
    fuse_mem.push(Mem::sample(pid, &format!("after {n} updates")));
    let files_dir = scratch.path().join("files");
    let mut files = Serve::start(&env, &files_dir, &["--backend", "files"]);
    files.wait_for(".ready", Some(""), Duration::from_secs(60));
    drain(files.child.as_mut().unwrap());
    let files_pid = files.child.as_ref().unwrap().id();
    let mut files_mem = vec![Mem::sample(files_pid, "ready")];
    let files_times = propagation(&api, &files_dir.join("gpu/gpu/0/attr0"), n + 1);
    fuse_mem.push(Mem::sample(pid, &format!("after {} updates", 2 * n)));
    files_mem.push(Mem::sample(files_pid, &format!("after {n} updates")));
    println!(
        "### Update propagation: change in the API server to the new value read ({n} updates, 20 ms latency per request)\n"
    );
    println!("| backend | median | p90 | max |");
    println!("|---|---|---|---|");
    for (name, t) in [("FUSE", &fuse_times), ("files", &files_times)] {
        println!("| {name} | {} | {} | {} |", ms(percentile(t, 0.5)), ms(percentile(t, 0.9)), ms(*t.last().unwrap()));
    }

    let fuse_health = health_propagation(&api, &mnt.join("gpu/gpu/0/.health"));
    let files_health = health_propagation(&api, &files_dir.join("gpu/gpu/0/.health"));
    fuse_mem.push(Mem::sample(pid, &format!("and {} flips", 2 * n)));
    files_mem.push(Mem::sample(files_pid, &format!("and {} flips", 2 * n)));
    println!(
        "\n### Health propagation: the kubelet's report in the pod's status to `.health` read ({n} flips, 20 ms latency per request)\n"
    );
    println!("| backend | median | p90 | max |");
    println!("|---|---|---|---|");
    for (name, t) in [("FUSE", &fuse_health), ("files", &files_health)] {
        println!("| {name} | {} | {} | {} |", ms(percentile(t, 0.5)), ms(percentile(t, 0.9)), ms(*t.last().unwrap()));
    }

    // Memory after 10k reads (plus the reads above) and the updates above.
    read_loop(&mnt.join(rel), 10_000);
    let (fuse_rss, files_rss) = (rss_kib(pid), rss_kib(files_pid));
    println!(
        "\n### Memory: 8 devices x 30 attributes, after {} reads, {n} updates and {} health flips\n",
        READS + 12_000,
        2 * n
    );
    println!("| backend | VmRSS |");
    println!("|---|---|");
    println!("| FUSE | {:.1} MiB |", fuse_rss as f64 / 1024.0);
    println!("| files | {:.1} MiB |", files_rss as f64 / 1024.0);

    // Idle past tokio's 10 s keep-alive of its blocking threads.
    std::thread::sleep(Duration::from_secs(12));
    fuse_mem.push(Mem::sample(pid, "12 s idle"));
    files_mem.push(Mem::sample(files_pid, "12 s idle"));
    print_mem("FUSE server", &fuse_mem);
    print_mem("files", &files_mem);
}
