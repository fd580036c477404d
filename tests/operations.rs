//! What an operator relies on while drafs serves: the metrics and health
//! endpoints (bounded against a flood of clients), and serving on through a
//! full disk.

use drafs_test_support as support;

use std::time::Duration;

use support::*;

const LIMIT: Duration = Duration::from_secs(60);

/// The value of an unlabelled (or exactly labelled) sample.
fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn metrics_and_health_endpoints() {
    let (api, env) = example("hpc", "allreduce-worker-3", "examples/offline/rdma-network.yaml");
    let addr = format!("127.0.0.1:{}", free_port());
    let dir = env.path("dra");
    // --require on a value that is not there: not ready at first.
    let mut serve =
        Serve::start(&env, &dir, &["--backend", "files", "--metrics-addr", &addr, "--require", "nics/rdma/0/serial"]);
    wait_until("the metrics endpoint", LIMIT, || http_get(&addr, "/healthz").is_some_and(|(c, _)| c == 200));
    wait_until("a first tree", LIMIT, || dir.join(".json").exists());
    wait_until("readyz 503 naming the missing path", LIMIT, || {
        http_get(&addr, "/readyz").is_some_and(|(code, body)| code == 503 && body.contains("nics/rdma/0/serial"))
    });
    let metrics = http_get(&addr, "/metrics").unwrap().1;
    assert_eq!(sample(&metrics, "drafs_ready"), Some(0.0), "{metrics}");
    assert!(!metrics.contains("drafs_time_to_ready_seconds "));

    // The value appears: ready, with a time to ready.
    let mut s = api.get("ResourceSlice", "", "node-rdma-02-dra.net-7fk2l").unwrap();
    s["spec"]["devices"][1]["attributes"]["serial"] = serde_json::json!({"string": "SN1"});
    api.apply(s);
    serve.wait_for(".ready", Some(""), LIMIT);
    wait_until("readyz 200", LIMIT, || http_get(&addr, "/readyz").is_some_and(|(c, _)| c == 200));
    let metrics = http_get(&addr, "/metrics").unwrap().1;
    assert_eq!(sample(&metrics, "drafs_ready"), Some(1.0));
    assert!(sample(&metrics, "drafs_time_to_ready_seconds").is_some_and(|t| t > 0.0), "{metrics}");
    assert!(sample(&metrics, "drafs_tree_updates_total").is_some_and(|n| n >= 2.0));
    assert_eq!(sample(&metrics, "drafs_values_served"), Some(read_tree(&dir).len() as f64));

    // A failing API and an expired watch are counted.
    api.inject(Fault { verb: Some("list".into()), resource: Some(Res::ResourceSlices), status: 500, count: 1 });
    // History moves past what drafs has seen (a change it does not watch), then is compacted.
    api.apply(slice("elsewhere", "x.example.com", "p", 1, Some("other-node"), &[]));
    api.compact();
    wait_until("the 500 to be counted", LIMIT, || {
        http_get(&addr, "/metrics")
            .is_some_and(|(_, m)| sample(&m, "drafs_api_errors_total{code=\"500\"}") == Some(1.0))
    });
    wait_until("watch restarts to be counted", LIMIT, || {
        http_get(&addr, "/metrics")
            .is_some_and(|(_, m)| sample(&m, "drafs_watch_restarts_total").is_some_and(|n| n >= 1.0))
    });
    assert_eq!(http_get(&addr, "/nope").unwrap().0, 404);
}

#[test]
fn serve_keeps_serving_through_a_full_disk_and_recovers_by_itself() {
    // A tiny tmpfs of our own (needs root, like the FUSE tests).
    if !require_fuse() {
        return;
    }
    let (api, env) = example("hpc", "allreduce-worker-3", "examples/offline/rdma-network.yaml");
    let disk = env.path("disk");
    std::fs::create_dir(&disk).unwrap();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=512k", "drafs-test-full", disk.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success(), "mount tmpfs");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            detach(&self.0);
        }
    }
    let _unmount = Unmount(disk.clone());
    let dir = disk.join("dra");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut serve = Serve::start_ready(&env, &dir, &["--backend", "files", "--metrics-addr", &addr], LIMIT);

    // The disk fills up, then a value changes: the write fails.
    let mut filler = std::fs::File::create(disk.join("filler")).unwrap();
    let _ = std::io::Write::write_all(&mut filler, &vec![0u8; 1024 * 1024]);
    drop(filler);
    let mut s = api.get("ResourceSlice", "", "node-rdma-02-dra.net-7fk2l").unwrap();
    s["spec"]["devices"][1]["attributes"]["dra.net/ifName"] = serde_json::json!({"string": "after-full-disk"});
    api.apply(s);
    // Not ready while the tree is stale; still running, /readyz says why.
    serve.wait_for(".ready", None, LIMIT);
    wait_until("readyz 503 naming the output", LIMIT, || {
        http_get(&addr, "/readyz").is_some_and(|(c, body)| c == 503 && body.contains("output failed"))
    });
    let probe = env.run(&["probe", "--dir", dir.to_str().unwrap()], LIMIT);
    assert_eq!(probe.status.code(), Some(1));

    // Room again: drafs retries by itself and is ready with the new value.
    std::fs::remove_file(disk.join("filler")).unwrap();
    serve.wait_for("nics/rdma/0/ifName", Some("after-full-disk"), LIMIT);
    serve.wait_for(".ready", Some(""), LIMIT);
    wait_until("readyz 200", LIMIT, || http_get(&addr, "/readyz").is_some_and(|(c, _)| c == 200));
    assert!(serve.child.as_mut().unwrap().try_wait().unwrap().is_none(), "serve never exited");
}

#[test]
fn a_flood_of_slow_metrics_clients_is_bounded_and_probes_still_answer() {
    let (_api, env) = example("hpc", "allreduce-worker-3", "examples/offline/rdma-network.yaml");
    let dir = env.path("dra");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut serve = Serve::start_ready(&env, &dir, &["--backend", "files", "--metrics-addr", &addr], LIMIT);
    let pid = serve.child.as_ref().unwrap().id();
    let fds = || std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
    let baseline = fds();
    // 120 clients that each send one byte and then trickle nothing more.
    let mut slow: Vec<std::net::TcpStream> = (0..120)
        .filter_map(|_| std::net::TcpStream::connect(&addr).ok())
        .inspect(|mut s| {
            let _ = std::io::Write::write_all(&mut s, b"G");
        })
        .collect();
    assert!(slow.len() > 100);
    // The server holds at most a bounded number of them at a time...
    for _ in 0..20 {
        assert!(fds() <= baseline + drafs::publish::metrics::MAX_CONNECTIONS + 4, "{} descriptors", fds());
        std::thread::sleep(Duration::from_millis(50));
    }
    // ...answers an honest probe all the same...
    wait_until("healthz through the flood", LIMIT, || http_get(&addr, "/healthz").is_some_and(|(c, _)| c == 200));
    // ...and closes every slow client by itself.
    for s in &mut slow {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut byte = [0u8; 1];
        let n = std::io::Read::read(s, &mut byte).unwrap_or(0);
        assert_eq!(n, 0, "a slow client was answered or kept open");
    }
    assert!(serve.child.as_mut().unwrap().try_wait().unwrap().is_none());
}
