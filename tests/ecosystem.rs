//! `drafs exec` and `drafs copy-self`: apps that only read environment variables.

mod support;

use std::time::Duration;

use support::*;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn exec_sets_variables_from_a_tree_and_from_the_api() {
    let (_api, env) = example("hpc", "allreduce-worker-3", "examples/offline/rdma-network.yaml");
    let dir = env.path("dra");
    assert!(env.run(&["init", "--dir", dir.to_str().unwrap()], LIMIT).status.success());
    let script = r#"printf '%s|%s|%s' "$IFS_ALL" "$MTU0" "${UNSET-unset}""#;
    let vars = ["--env", "IFS_ALL=nics/rdma/.status/interfaceName", "--env", "MTU0=nics/rdma/0/dra.net/mtu"];
    let mut args = vec!["exec", "--from-dir", dir.to_str().unwrap()];
    args.extend(vars);
    args.extend(["--", "sh", "-c", script]);
    let out = env.run(&args, LIMIT);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "net1,net2|9000|unset");

    // The same values straight from the API (no tree).
    let mut args = vec!["exec"];
    args.extend(vars);
    args.extend(["--", "sh", "-c", script]);
    let out = env.run(&args, LIMIT);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "net1,net2|9000|unset");
}

#[test]
fn exec_refuses_missing_values_unless_optional() {
    let (_api, env) = example("ml", "trainer-0", "examples/offline/gpu-training.yaml");
    let dir = env.path("dra");
    assert!(env.run(&["init", "--dir", dir.to_str().unwrap()], LIMIT).status.success());
    let marker = env.path("ran");
    let cmd = format!("touch {}", marker.display());
    let out = env.run(
        &["exec", "--from-dir", dir.to_str().unwrap(), "--env", "SERIAL=gpu/gpu/0/serial", "--", "sh", "-c", &cmd],
        LIMIT,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("SERIAL: no value at gpu/gpu/0/serial"), "{}", stderr(&out));
    assert!(!marker.exists(), "the command does not run");

    let out = env.run(
        &[
            "exec",
            "--optional",
            "--from-dir",
            dir.to_str().unwrap(),
            "--env",
            "SERIAL=gpu/gpu/0/serial",
            "--env",
            "UUID=gpu/gpu/0/uuid",
            "--",
            "sh",
            "-c",
            r#"printf '%s/%s' "${SERIAL-unset}" "$UUID""#,
        ],
        LIMIT,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "unset/GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b");

    let out = env.run(&["exec", "--env", "1BAD=gpu/gpu/0/uuid", "--", "true"], LIMIT);
    assert_eq!(out.status.code(), Some(2), "bad variable names are usage errors");
}

#[test]
fn exec_logs_device_values_escaped_and_passes_them_exact() {
    let api = api_for("ml");
    api.apply(pod("ml", "p", "n1", &[("gpu", Ok("c"))], &[]));
    api.apply(claim("ml", "c", Some(&[("gpu", "gpu.example.com", "n1", "g0")])));
    // A driver's value that would forge a log line and drive the terminal.
    let hostile = "GPU-1\n2026-01-01T00:00:00Z  INFO forged line\u{1b}[2J\u{7}";
    api.apply(slice(
        "s",
        "gpu.example.com",
        "n1",
        1,
        Some("n1"),
        &[("g0", serde_json::json!({"uuid": {"string": hostile}}))],
    ));
    let env = Env::new(&api, "ml", "p", TOKEN);
    let dir = env.path("dra");
    assert!(env.run(&["init", "--dir", dir.to_str().unwrap()], LIMIT).status.success());
    let from_dir = ["exec", "--from-dir", dir.to_str().unwrap()];
    for source in [&from_dir[..], &["exec"][..]] {
        let mut args = source.to_vec();
        args.extend(["--env", "UUID=gpu/gpu/0/uuid", "--", "sh", "-c", r#"printf '%s' "$UUID""#]);
        let out = env.run(&args, LIMIT);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(stdout(&out), hostile, "the command gets the exact value");
        let log = stderr(&out);
        assert!(log.contains("setting"), "the info line is there: {log}");
        assert!(!log.lines().any(|l| l.contains("forged line") && !l.contains("setting")), "a forged line: {log}");
        assert!(!log.chars().any(|c| c.is_control() && c != '\n'), "control characters in the log: {log:?}");
        assert!(log.contains(r"GPU-1\n2026-01-01T00:00:00Z  INFO forged line\u{1b}[2J\u{7}"), "{log}");
    }
}

#[test]
fn copy_self_installs_a_runnable_copy() {
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("shared");
    let out = std::process::Command::new(drafs_bin()).args(["copy-self", "--to"]).arg(&to).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    use std::os::unix::fs::PermissionsExt;
    let copy = to.join("drafs");
    assert_eq!(std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777, 0o755);
    let out = std::process::Command::new(&copy).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(stdout(&out).starts_with("drafs "), "{}", stdout(&out));
    assert!(!to.join(".drafs.tmp").exists());
}

fn inject(mode: &str, input: &str) -> String {
    let out = drafs_with_stdin(&["inject", "--mode", mode, "--image", "drafs:test"], input);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

#[test]
fn inject_matches_the_expected_yaml_and_is_idempotent() {
    for input in ["deployment", "workloads", "scalars"] {
        let text = read(&format!("tests/inject/{input}.yaml"));
        for mode in ["init", "sidecar-fuse", "sidecar-files"] {
            let expected = read(&format!("tests/inject/{input}.{mode}.yaml"));
            let once = inject(mode, &text);
            assert_eq!(once, expected, "{input} in mode {mode}");
            assert_eq!(inject(mode, &once), once, "injecting twice changes nothing ({input}, {mode})");
        }
    }
}

/// kubectl reads YAML 1.1: each of these means something else to a YAML 1.2
/// writer (`0644` is the mode 420, `YES` true, `08` the number 8). drafs writes
/// them back as they were (tests/kube.rs checks the meaning with kubectl itself).
#[test]
fn inject_writes_every_scalar_it_does_not_change_as_it_was() {
    let input = read("tests/inject/scalars.yaml");
    for mode in ["init", "sidecar-fuse", "sidecar-files"] {
        let out = inject(mode, &input);
        for kept in [
            "defaultMode: 0644\n",
            "mode: 0755\n",
            "defaultMode: 0400\n",
            "defaultMode: 0440\n",
            "mode: 0600\n",
            "runAsUser: 01750\n",
            "replicas: 0x2\n",
            "revisionHistoryLimit: 010\n",
            "terminationGracePeriodSeconds: 1_0\n",
            "containerPort: 08080\n",
            "readOnly: YES\n",
            "enableServiceLinks: Off\n",
            "tty: On\n",
            "stdin: n\n",
            "allowPrivilegeEscalation: NO\n",
            "suspend: off\n",
            "backoffLimit: 0o3\n",
            "activeDeadlineSeconds: 3.6e3\n",
            "cpu: .5\n",
            "deployed: 2024-01-02\n",
            "build: \"0644\"\n",
            "ratio: '1e3'\n",
            "note: 'it''s \"quoted\"'\n",
            "canary: 'no'\n",
            "- 'on'\n",
            "value: 2001-12-14\n",
            "value: \"yes\"\n",
            "- !!str 0644\n",
            "- !!str yes\n",
            "  y: \"a key that YAML 1.1 reads as true\"\n",
            "env: *env\n",
            "<<: *req\n",
            "schedule: 0 3 * * *\n",
            "    exec app --mode=0644\n",
        ] {
            assert!(out.contains(kept), "{mode}: {kept:?} is not in the output:\n{out}");
        }
        assert_eq!(inject(mode, &out), out, "{mode}: injecting twice changes nothing");
    }
}

#[test]
fn injected_pod_is_a_valid_pod_with_the_example_wiring() {
    let out = inject("sidecar-fuse", &read("tests/inject/workloads.yaml"));
    let docs = yaml_docs(&out);
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(docs[0].clone()).unwrap();
    let spec = pod.spec.unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("launcher"), "an existing service account is kept");
    let init = spec.init_containers.unwrap();
    assert_eq!(init[0].name, "drafs");
    assert_eq!(init[0].restart_policy.as_deref(), Some("Always"));
    assert_eq!(init[1].name, "prepare");
    let prepare_mount = &init[1].volume_mounts.as_ref().unwrap()[0];
    assert_eq!(prepare_mount.mount_propagation.as_deref(), Some("HostToContainer"));
    let compute = &spec.containers[0];
    assert_eq!(compute.volume_mounts.as_ref().unwrap().len(), 2, "the existing mount is kept, /dra added");
    // Other documents pass through: the Service is still there, the StatefulSet unchanged.
    assert_eq!(docs.len(), 6);
    assert_eq!(docs[4]["kind"], "Service");
    // An empty serviceAccountName counts as none.
    assert_eq!(docs[5]["spec"]["template"]["spec"]["serviceAccountName"], "drafs");
    assert!(docs[3]["spec"]["template"]["spec"].get("initContainers").is_none());
}

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
fn copy_self_never_writes_through_a_planted_link() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let to = tmp.path().join("bin");
    std::fs::create_dir(&to).unwrap();
    let victim = tmp.path().join("secret");
    std::fs::write(&victim, "do not touch").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Links planted where a temp file or the target could be written.
    for name in [".drafs.tmp", "drafs.tmp", ".drafs"] {
        std::os::unix::fs::symlink(&victim, to.join(name)).unwrap();
    }
    let out = std::process::Command::new(drafs_bin()).args(["copy-self", "--to"]).arg(&to).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "do not touch");
    assert_eq!(std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777, 0o600);
    let copied = std::fs::symlink_metadata(to.join("drafs")).unwrap();
    assert!(copied.is_file() && copied.permissions().mode() & 0o777 == 0o755);
    // A link at the destination itself is replaced, not written through.
    std::fs::remove_file(to.join("drafs")).unwrap();
    std::os::unix::fs::symlink(&victim, to.join("drafs")).unwrap();
    let out = std::process::Command::new(drafs_bin()).args(["copy-self", "--to"]).arg(&to).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "do not touch");
    assert!(std::fs::symlink_metadata(to.join("drafs")).unwrap().is_file());
    // Nothing left behind but the binary and the planted links.
    let names: std::collections::BTreeSet<String> =
        std::fs::read_dir(&to).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, [".drafs", ".drafs.tmp", "drafs", "drafs.tmp"].iter().map(|s| s.to_string()).collect());
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

#[test]
fn messages_for_a_missing_tree_and_stdin_input() {
    // exec from a directory with no tree: says so, even with --optional.
    for optional in [false, true] {
        let mut args = vec!["exec", "--from-dir", "/nonexistent/dra", "--env", "U=gpu/gpu/0/uuid"];
        if optional {
            args.push("--optional");
        }
        args.extend(["--", "true"]);
        let out = std::process::Command::new(drafs_bin()).args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(stderr(&out).contains("no drafs tree at /nonexistent/dra"), "{}", stderr(&out));
    }
    // --from-file - reads standard input.
    use std::io::Write;
    let mut child = std::process::Command::new(drafs_bin())
        .args(["get", "--from-file", "-", "-o", "json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(read("examples/offline/gpu-training.yaml").as_bytes()).unwrap();
    let out = wait_output(child, LIMIT);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b"));
}

fn drafs_with_stdin(args: &[&str], input: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new(drafs_bin())
        .args(args)
        .current_dir(repo_path(""))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    wait_output(child, LIMIT)
}

#[test]
fn inject_reads_files_directories_and_stdin_and_refuses_what_it_cannot_use() {
    let deployment = read("tests/inject/deployment.yaml");
    let expected = read("tests/inject/deployment.init.yaml");
    // A file argument, -f FILE, -f - and standard input all give the same.
    for args in [
        vec!["inject", "--image", "drafs:test", "tests/inject/deployment.yaml"],
        vec!["inject", "--image", "drafs:test", "-f", "tests/inject/deployment.yaml"],
        vec!["inject", "--image", "drafs:test", "-f", "-"],
        vec!["inject", "--image", "drafs:test"],
    ] {
        let out = drafs_with_stdin(&args, &deployment);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), expected, "{args:?}");
        assert!(stdout(&out).ends_with('\n'));
    }
    // A directory: its .yaml files in name order, as one stream.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.yaml"), &deployment).unwrap();
    std::fs::write(dir.path().join("a.yaml"), "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n").unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a manifest").unwrap();
    let out = drafs_with_stdin(&["inject", "--image", "drafs:test", "-f", dir.path().to_str().unwrap()], "");
    assert!(out.status.success(), "{}", stderr(&out));
    let docs = yaml_docs(&stdout(&out));
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0]["kind"], "ConfigMap");
    assert_eq!(docs[1]["spec"]["template"]["spec"]["initContainers"][0]["name"], "drafs");

    // Options reach drafs's arguments and mounts.
    let out = drafs_with_stdin(
        &[
            "inject",
            "--mode",
            "sidecar-fuse",
            "--image",
            "drafs:test",
            "--metadata-dir",
            "/var/run/kubernetes.io/dra-device-attributes",
            "--require",
            "gpu/gpu/0/uuid",
            "--timeout",
            "90s",
        ],
        &deployment,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let spec = &yaml_docs(&stdout(&out))[0]["spec"]["template"]["spec"];
    let drafs = &spec["initContainers"][0];
    let args: Vec<&str> = drafs["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(
        args,
        [
            "serve",
            "--backend=fuse",
            "--dir=/dra",
            "--metadata-dir=/var/run/kubernetes.io/dra-device-attributes",
            "--require=gpu/gpu/0/uuid",
            "--timeout=90s"
        ]
    );
    assert_eq!(drafs["startupProbe"]["failureThreshold"], 100);
    assert_eq!(drafs["readinessProbe"]["exec"]["command"][1], "probe", "the FUSE sidecar has a readiness probe");
    let app_mounts = spec["containers"][0]["volumeMounts"].as_array().unwrap();
    assert!(
        app_mounts
            .iter()
            .any(|m| m["mountPath"] == "/var/run/kubernetes.io/dra-device-attributes" && m["readOnly"] == true)
    );

    // Refusals, each with what to do.
    let cases: [(&[&str], &str, &str); 6] = [
        (&["inject"], "", "no manifests"),
        (&["inject"], "# only a comment\n", "no manifests"),
        (&["inject", "missing.yaml"], "", "cannot read missing.yaml"),
        (&["inject", "--metadata-dir", "/dra/meta"], "", "overlaps the tree's directory /dra"),
        (&["inject", "--dir", "relative"], "", "must be an absolute path"),
        (&["inject", "--image", ""], "", "not an image reference"),
    ];
    for (args, input, expected) in cases {
        let out = drafs_with_stdin(args, input);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr(&out).contains(expected), "{args:?}: {}", stderr(&out));
        assert!(stdout(&out).is_empty(), "{args:?}: nothing half-written");
    }
}

#[test]
fn inject_refuses_a_live_pod_and_names_its_owner() {
    let live = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: trainer-7d9f-x2k\n  namespace: ml\n  uid: 0f8e\n  resourceVersion: \"4711\"\n  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: trainer-7d9f, uid: 1a2b, controller: true}]\nspec:\n  resourceClaims: [{name: gpu, resourceClaimTemplateName: single-gpu}]\n  containers: [{name: app, image: app, resources: {claims: [{name: gpu}]}}]\nstatus: {phase: Running}\n";
    let out = drafs_with_stdin(&["inject"], live);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("Pod trainer-7d9f-x2k is a live object")
            && err.contains("the ReplicaSet trainer-7d9f that owns it"),
        "{err}"
    );
    assert!(stdout(&out).is_empty());
}

#[test]
fn a_file_without_the_claim_says_so_and_how_to_add_it() {
    let full = read("examples/offline/gpu-training.yaml");
    let pod_only: String = full.split("\n---\n").next().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pod.yaml");
    std::fs::write(&file, &pod_only).unwrap();
    let out = std::process::Command::new(drafs_bin()).args(["get", "--from-file"]).arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("ResourceClaim trainer-0-gpu-x7k2p is not in {}", file.display()))
            && err.contains("kubectl get resourceclaim -n ml trainer-0-gpu-x7k2p -o yaml"),
        "{err}"
    );
    // From standard input the message names it.
    let out = drafs_with_stdin(&["get", "--from-file", "-"], &pod_only);
    assert!(stderr(&out).contains("is not in standard input"), "{}", stderr(&out));
}

#[test]
fn a_missing_kubeconfig_is_named_once_quoted() {
    let out = std::process::Command::new(drafs_bin())
        .args(["get", "--pod-name", "p", "--pod-namespace", "ns"])
        .env("KUBECONFIG", "/nonexistent/drafs-config")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("'/nonexistent/drafs-config'") && !err.contains("'\"/nonexistent"), "{err}");
}
