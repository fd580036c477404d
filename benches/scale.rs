//! drafs on a node that publishes many devices: peak memory and time to ready
//! of `drafs init` and `drafs serve`, and the requests they make, against the
//! test API server (which pages lists like the real one).
//!
//! Run: `cargo bench --bench scale`. The node publishes N slices x 128 devices
//! x 30 string attributes in one pool; the pod holds 8 devices spread over the
//! slices. Prints a Markdown table; `DRAFS_BIN=path` measures another binary
//! (e.g. the image's).

use drafs_test_support as support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

const DEVICES_PER_SLICE: usize = 128;
const ATTRIBUTES: usize = 30;
const HELD: usize = 8;
const RUNS: usize = 5;

fn node(api: &TestApi, slices: usize) {
    for s in 0..slices {
        let devices: Vec<Value> = (0..DEVICES_PER_SLICE)
            .map(|d| {
                let attrs: serde_json::Map<String, Value> = (0..ATTRIBUTES)
                    .map(|a| (format!("attr{a}"), json!({"string": format!("value-{s}-{d}-{a}-0123456789abcdef")})))
                    .collect();
                json!({"name": format!("dev-{s}-{d}"), "attributes": attrs})
            })
            .collect();
        api.apply(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("n1-slice-{s}")},
            "spec": {"driver": "cpu.example.com", "nodeName": "n1",
                "pool": {"name": "n1", "generation": 1, "resourceSliceCount": slices}, "devices": devices},
        }));
    }
    // The pod's 8 devices, spread over the slices.
    let held: Vec<String> =
        (0..HELD).map(|i| format!("dev-{}-{}", (i * slices) / HELD, (i * 37) % DEVICES_PER_SLICE)).collect();
    let results: Vec<(&str, &str, &str, &str)> =
        held.iter().map(|d| ("cpu", "cpu.example.com", "n1", d.as_str())).collect();
    api.apply(pod("ml", "p", "n1", &[("cpu", Ok("c"))], &[]));
    api.apply(claim("ml", "c", Some(&results)));
}

/// Peak RSS (KiB) of a child that has exited, from wait4's rusage. Linux keeps
/// in it the RSS of the forked copy of the parent at exec, so the child must be
/// forked from a small process: see [`measure_child`].
fn wait_peak_rss(child: &mut std::process::Child) -> (std::process::ExitStatus, u64) {
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child's pid.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert!(pid > 0, "wait4 failed");
    (std::os::unix::process::ExitStatusExt::from_raw(status), usage.ru_maxrss as u64)
}

fn peak_rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// `scale --measure-child CMD...`: run CMD from this freshly started (small)
/// process and print its exit code and peak RSS in KiB.
fn measure_child(cmd: &[String]) -> ! {
    let mut child = std::process::Command::new(&cmd[0]).args(&cmd[1..]).spawn().unwrap();
    let (status, peak) = wait_peak_rss(&mut child);
    println!("{} {peak}", status.code().unwrap_or(-1));
    std::process::exit(0)
}

/// Run a prepared drafs command through [`measure_child`]: (success, peak RSS KiB).
fn measured(cmd: &std::process::Command) -> (bool, u64) {
    let mut wrapped = std::process::Command::new(std::env::current_exe().unwrap());
    wrapped.arg("--measure-child").arg(cmd.get_program()).args(cmd.get_args()).env_clear();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            wrapped.env(k, v);
        }
    }
    let out = wrapped.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace();
    let code: i32 = parts.next().and_then(|c| c.parse().ok()).unwrap_or(-1);
    let peak: u64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (code == 0, peak)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--measure-child") {
        measure_child(&args[i + 1..]);
    }
    println!(
        "| slices on the node (x128 devices x30 attributes) | bytes of slices served | `init` time to ready (median of {RUNS}) | `init` peak RSS | `serve --backend files` peak RSS at ready | `init` requests |"
    );
    println!("|---|---|---|---|---|---|");
    for slices in [1usize, 8, 64] {
        let api = api_for("ml");
        node(&api, slices);
        let env = Env::new(&api, "ml", "p", TOKEN);
        // Trees go to tmpfs, like the recommended `emptyDir: {medium: Memory}` (file
        // creation on this VM's ext4 would dominate the time).
        let shm = std::path::Path::new("/dev/shm");
        let out = tempfile::tempdir_in(if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() }).unwrap();
        let mut times = Vec::new();
        let mut rss = Vec::new();
        let mut requests = String::new();
        let mut bytes = 0u64;
        for run in 0..RUNS {
            api.clear_requests();
            let dir = out.path().join(format!("init-{run}"));
            let started = Instant::now();
            let mut cmd = env.command(&["init", "--dir", dir.to_str().unwrap()]);
            cmd.env("DRAFS_LOG", "warn");
            let status = cmd.status().unwrap();
            times.push(started.elapsed().as_secs_f64() * 1000.0);
            assert!(status.success(), "init failed");
            let reqs = api.requests();
            let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
            for r in &reqs {
                *counts.entry(format!("{} {}", r.verb, r.resource)).or_default() += 1;
            }
            requests = format!(
                "{}: {}",
                reqs.len(),
                counts.iter().map(|(k, n)| format!("{n} {k}")).collect::<Vec<_>>().join(", ")
            );
            assert_eq!(read_tree(&dir).keys().filter(|k| k.ends_with("/attr0")).count(), HELD * 2, "8 devices");
        }
        // Peak memory of one more run, measured from a small parent (after the timed runs).
        for run in 0..2 {
            let dir = out.path().join(format!("rss-{run}"));
            let mut cmd = env.command(&["init", "--dir", dir.to_str().unwrap()]);
            cmd.env("DRAFS_LOG", "warn");
            let (ok, peak) = measured(&cmd);
            assert!(ok, "init failed");
            rss.push(peak as f64 / 1024.0);
        }
        // The slices as served: one unpaged list's size.
        for s in 0..slices {
            bytes += api.get("ResourceSlice", "", &format!("n1-slice-{s}")).unwrap().to_string().len() as u64;
        }
        // serve: peak RSS once ready.
        let dir = out.path().join("serve");
        let mut serve = env
            .command(&["serve", "--backend", "files", "--dir", dir.to_str().unwrap()])
            .env("DRAFS_LOG", "warn")
            .spawn()
            .unwrap();
        wait_until("serve ready", Duration::from_secs(60), || dir.join(".ready").exists());
        let serve_rss = peak_rss_of(serve.id()) as f64 / 1024.0;
        let _ = serve.kill();
        let _ = serve.wait();
        println!(
            "| {slices} | {:.1} MB | {:.1} ms | {:.1} MiB | {serve_rss:.1} MiB | {requests} |",
            bytes as f64 / 1e6,
            median(times),
            rss.iter().cloned().fold(0.0, f64::max),
        );
    }
}
