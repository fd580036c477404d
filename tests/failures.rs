//! How `drafs init`, `get` and `exec` fail, run as the real binary against the
//! test API server: missing RBAC, bad tokens, unreachable or stalled API
//! servers, malformed and hostile objects, bad flags: a clear error, the
//! right exit code, and nothing half-written.

use drafs_test_support as support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use support::*;

/// A safety net only: every run normally ends by itself long before.
const LIMIT: Duration = Duration::from_secs(90);

#[test]
fn forbidden_names_verb_resource_and_the_rbac_example() {
    let api = api_for("ml");
    api.load_yaml(&read("examples/offline/gpu-training.yaml"));
    api.add_token("other", "system:serviceaccount:ml:someone-else");
    let env = Env::new(&api, "ml", "trainer-0", "other");
    let err = assert_failed(&env.init(&["--timeout", "60s"]));
    assert!(err.contains("forbidden") && err.contains("get pods") && err.contains("drafs manifests rbac"), "{err}");
    assert!(env.termination_log().contains("get pods"));

    // Without the ClusterRoleBinding the slices are the missing grant.
    let rbac: String = rbac_yaml("ml");
    let without: Vec<&str> = rbac.split("\n---\n").filter(|d| !d.contains("kind: ClusterRoleBinding")).collect();
    let api = TestApi::start(&without.join("\n---\n"), "ml");
    api.add_token(TOKEN, "system:serviceaccount:ml:drafs");
    api.load_yaml(&read("examples/offline/gpu-training.yaml"));
    let env = Env::new(&api, "ml", "trainer-0", TOKEN);
    let err = assert_failed(&env.init(&["--timeout", "60s"]));
    assert!(err.contains("may not list resourceslices") && err.contains("spec.nodeName=gpu-node-7"), "{err}");
    assert_eq!(api.events()[0]["type"], "Warning", "the failure is also an event");
}

#[test]
fn unauthorized_token() {
    let api = api_for("ml");
    api.load_yaml(&read("examples/offline/gpu-training.yaml"));
    let env = Env::new(&api, "ml", "trainer-0", "wrong-token");
    let err = assert_failed(&env.init(&["--timeout", "60s"]));
    assert!(err.contains("unauthorized"), "{err}");
}

#[test]
fn shipped_rbac_is_exactly_what_is_used() {
    // A run that waits (claim allocated late, slice published late) uses every
    // verb: get, list and watch, and create for the Normal event with --events=all.
    let api = api_for("ml");
    api.apply(pod("ml", "p", "n1", &[("gpu", Ok("c"))], &[]));
    api.apply(claim("ml", "c", None));
    let env = Env::new(&api, "ml", "p", TOKEN);
    let dir = env.path("dra");
    let child = env.spawn(&["init", "--dir", dir.to_str().unwrap(), "--events=all"]);
    let watches = |api: &TestApi| {
        api.requests().iter().filter(|r| r.verb == "watch").map(|r| r.field_selector.clone()).collect::<BTreeSet<_>>()
    };
    wait_until("a watch on the unallocated claim", LIMIT, || watches(&api).len() == 1);
    api.apply(claim("ml", "c", Some(&[("gpu", "gpu.example.com", "shared-pool", "g0")])));
    wait_until("watches on node slices and driver slices", LIMIT, || watches(&api).len() == 3);
    api.apply(slice("s", "gpu.example.com", "shared-pool", 1, None, &[("g0", json!({"uuid": {"string": "X"}}))]));
    assert_ok(&wait_output(child, LIMIT));
    let used: BTreeSet<(String, String)> = api
        .requests()
        .iter()
        .filter(|r| (200..300).contains(&r.status))
        .map(|r| (r.verb.clone(), r.resource.clone()))
        .collect();
    let expected: BTreeSet<(String, String)> = [
        ("create", "events"),
        ("get", "pods"),
        ("list", "resourceclaims"),
        ("watch", "resourceclaims"),
        ("list", "resourceslices"),
        ("watch", "resourceslices"),
    ]
    .iter()
    .map(|(v, r)| (v.to_string(), r.to_string()))
    .collect();
    assert_eq!(used, expected);
    // The Roles and the ClusterRole grant exactly these and nothing else.
    let rbac = yaml_docs(&rbac_yaml("ml"));
    let mut granted = BTreeSet::new();
    for doc in rbac.iter().filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole") {
        for rule in doc["rules"].as_array().unwrap() {
            for res in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    granted.insert((verb.as_str().unwrap().to_string(), res.as_str().unwrap().to_string()));
                }
            }
        }
    }
    // serve also watches the pod, for device health (tests/serve.rs sees it used).
    let mut for_serve = expected.clone();
    for_serve.insert(("watch".to_string(), "pods".to_string()));
    assert_eq!(granted, for_serve);
    assert!(api.requests().iter().all(|r| r.status != 403));
}

#[test]
fn transient_failures_are_retried() {
    let api = api_for("ml");
    api.load_yaml(&read("examples/offline/gpu-training.yaml"));
    api.inject(Fault { verb: Some("get".into()), resource: Some(Res::Pods), status: 503, count: 2 });
    api.inject(Fault { verb: Some("list".into()), resource: Some(Res::ResourceSlices), status: 500, count: 1 });
    api.inject(Fault { verb: Some("list".into()), resource: Some(Res::ResourceClaims), status: 0, count: 1 });
    let env = Env::new(&api, "ml", "trainer-0", TOKEN);
    let out = env.init(&["--timeout", "60s"]);
    assert_ok(&out);
    assert_eq!(read_tree(&env.path("dra"))["gpu/gpu/0/productName"], "NVIDIA H200");
    let failed = api.requests().iter().filter(|r| !(200..300).contains(&r.status)).count();
    assert_eq!(failed, 4);
}

#[test]
fn unreachable_api_server_times_out_with_the_cause() {
    let api = api_for("ml");
    let env = Env::new(&api, "ml", "p", TOKEN);
    drop(api); // nothing listens on its port any more
    let err = assert_failed(&env.init(&["--timeout", "2s"]));
    assert!(err.contains("not ready after 2s") && err.contains("pod ml/p not fetched yet"), "{err}");
    assert!(err.to_lowercase().contains("connect"), "the cause is named: {err}");
}

#[test]
fn pod_not_found() {
    let api = api_for("ml");
    let env = Env::new(&api, "ml", "ghost", TOKEN);
    let err = assert_failed(&env.init(&["--timeout", "60s"]));
    assert!(err.contains("pod ml/ghost not found") && err.contains("POD_NAME"), "{err}");
}

#[test]
fn unknown_claim_selection_fails_at_once() {
    let (_api, env) = example("ml", "trainer-0", "examples/offline/gpu-training.yaml");
    let err = assert_failed(&env.init(&["--claim", "gpus", "--timeout", "60s"]));
    assert!(err.contains("no resource claim named \"gpus\"") && err.contains("it has: gpu"), "{err}");
}

#[test]
fn hostile_and_malformed_attributes_are_skipped_with_warnings() {
    let api = api_for("ml");
    api.apply(pod("ml", "p", "n1", &[("gpu", Ok("c"))], &[]));
    api.apply(claim("ml", "c", Some(&[("gpu", "gpu.example.com", "n1", "g0")])));
    api.apply(slice(
        "s",
        "gpu.example.com",
        "n1",
        1,
        Some("n1"),
        &[(
            "g0",
            json!({
                "uuid": {"string": "OK"},
                "../../../escape": {"string": "x"},
                "evil.com/../../x": {"string": "x"},
                ".ready": {"string": "x"},
                "float": {"float": 1.5},
                "two": {"int": 1, "string": "1"},
            }),
        )],
    ));
    let env = Env::new(&api, "ml", "p", TOKEN);
    let before: BTreeSet<_> = std::fs::read_dir(env.dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    let out = env.init(&[]);
    assert_ok(&out);
    let after: BTreeSet<_> = std::fs::read_dir(env.dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(after.difference(&before).count(), 1, "only the dra directory is new");
    let tree = read_tree(&env.path("dra"));
    let attrs: Vec<&String> = tree.keys().filter(|k| !k.contains("/.") && k.starts_with("gpu/")).collect();
    assert_eq!(attrs, vec!["gpu/gpu/0/gpu.example.com/uuid", "gpu/gpu/0/uuid"]);
    let err = stderr(&out);
    for key in ["../../../escape", "evil.com/../../x", ".ready", "float", "two"] {
        assert!(err.contains(&format!("attribute {key:?} skipped")), "no warning for {key}: {err}");
    }
}

#[test]
fn malformed_objects_give_a_clear_error() {
    // A slice the API returns in a shape no ResourceSlice has.
    let api = api_for("ml");
    api.apply(pod("ml", "p", "n1", &[("gpu", Ok("c"))], &[]));
    api.apply(claim("ml", "c", Some(&[("gpu", "gpu.example.com", "n1", "")])));
    let mut bad = slice("s", "gpu.example.com", "n1", 1, Some("n1"), &[]);
    bad["spec"]["pool"]["generation"] = json!("many");
    api.apply(bad);
    let env = Env::new(&api, "ml", "p", TOKEN);
    let err = assert_failed(&env.init(&["--timeout", "2s"]));
    assert!(err.contains("cannot list resourceslices (spec.nodeName=n1)") && err.contains("invalid type"), "{err}");

    // An allocation result without a device.
    api.delete("ResourceSlice", "", "s");
    let err = assert_failed(&env.init(&["--timeout", "2s"]));
    assert!(err.contains("lacks driver, pool or device"), "{err}");
}

#[test]
fn bad_flags_exit_with_usage_code() {
    let out = std::process::Command::new(drafs_bin()).args(["init", "--require", "../../etc/passwd"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = std::process::Command::new(drafs_bin()).args(["init", "--timeout", "soon"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("invalid duration"));
    // Out of range: a usage error, never an overflow panic.
    for huge in ["18446744073709551615s", "18446744073709551615", "9999999999h"] {
        let out = std::process::Command::new(drafs_bin()).args(["init", "--timeout", huge]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{huge}: {}", stderr(&out));
        assert!(stderr(&out).contains("longer than the maximum"), "{}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"));
    }
}

#[test]
fn a_pod_that_cannot_be_named_is_a_usage_error_before_anything_starts() {
    let scratch = tempfile::tempdir().unwrap();
    let tree = scratch.path().join("dra");
    let log = scratch.path().join("termination-log");
    std::fs::write(&log, "").unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    for command in ["init", "serve"] {
        let mut args = vec![command, "--dir", tree.to_str().unwrap(), "--metrics-addr", &addr];
        args.extend(["--termination-log", log.to_str().unwrap()]);
        if command == "serve" {
            args.extend(["--backend", "files"]);
        }
        // No POD_NAME, no HOSTNAME, no credentials.
        let out = std::process::Command::new(drafs_bin()).args(&args).env_clear().output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{command}: {}", stderr(&out));
        assert!(stderr(&out).contains("cannot tell which pod to read"), "{}", stderr(&out));
        assert!(!tree.exists(), "{command}: nothing written");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "", "a usage error is not a pod's failure");
    }
}

#[test]
fn overlapping_dir_and_metadata_dir_are_refused_before_anything_is_written() {
    let (_api, env) = example("ml", "trainer-0", "examples/offline/gpu-training.yaml");
    let fixture = repo_path("examples/offline/gpu-training.yaml");
    let base = env.path("out");
    let same = base.join("dra");
    let cases = [
        (same.clone(), same.clone()),
        (same.clone(), same.join("meta")),
        (same.join("tree"), same.clone()),
        (same.clone(), base.join("x/../dra/")),
    ];
    for (command, backend) in [("init", None), ("serve", Some("files"))] {
        for (dir, meta) in &cases {
            let mut args = vec![command, "--dir", dir.to_str().unwrap(), "--metadata-dir", meta.to_str().unwrap()];
            args.extend(["--from-file", fixture.to_str().unwrap()]);
            if let Some(b) = backend {
                args.extend(["--backend", b]);
            }
            let out = env.run(&args, LIMIT);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
            let err = stderr(&out);
            assert!(err.contains("--metadata-dir") && err.contains("overlaps"), "{args:?}: {err}");
            assert!(!base.exists(), "{args:?}: something was written");
        }
    }
    // Side by side is fine.
    let out = env.run(
        &["init", "--dir", same.to_str().unwrap(), "--metadata-dir", base.join("dra-meta").to_str().unwrap()],
        LIMIT,
    );
    assert_ok(&out);
    assert!(same.join(".ready").exists() && !read_tree(&base.join("dra-meta")).is_empty());
}

#[test]
fn a_stalled_api_server_is_bounded_by_the_timeout_for_init_get_and_exec() {
    // The server accepts the connection and never answers.
    let (api, env) = example("ml", "trainer-0", "examples/offline/gpu-training.yaml");
    api.set_latency(Duration::from_secs(3600));
    for args in [
        vec!["init", "--dir", env.path("dra").to_str().unwrap(), "--timeout", "2s"],
        vec!["get", "--timeout", "2s"],
        vec!["exec", "--timeout", "2s", "--env", "U=gpu/gpu/0/uuid", "--", "true"],
    ] {
        let started = std::time::Instant::now();
        let out = env.run(&args, LIMIT);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(started.elapsed() < Duration::from_secs(20), "{args:?} took {:?}", started.elapsed());
        let err = stderr(&out);
        assert!(err.contains("not ready after 2s") && err.contains("not fetched yet"), "{args:?}: {err}");
        assert!(err.contains("no answer"), "{args:?}: {err}");
    }
}

/// A filesystem too small for the tree (a tmpfs of a few pages or inodes, as
/// `drafs node` sizes each volume): a clear error before anything is written,
/// and nothing left in the directory. The tmpfs lives in a mount namespace of
/// the command's own and goes with it.
#[test]
fn a_tree_that_outgrows_its_filesystem_is_refused_whole() {
    if !require_fuse() {
        return;
    }
    let run = |options: &str| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dra");
        std::fs::create_dir(&dir).unwrap();
        let script = r#"mount -t tmpfs -o "$4" drafs-test "$1" || exit 99
"$2" init --from-file "$3" --dir "$1"; rc=$?
ls -A "$1"; exit $rc"#;
        let mut cmd = std::process::Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c", script, "sh"])
            .arg(&dir)
            .arg(drafs_bin())
            .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/offline/gpu-training.yaml"))
            .arg(options);
        run_captured(cmd, LIMIT)
    };
    for (options, short_of) in
        [("size=16k,nr_inodes=1024", "(too few bytes)"), ("size=1m,nr_inodes=12", "(too few inodes)")]
    {
        let out = run(options);
        assert_ne!(out.status.code(), Some(99), "mount: {}", stderr(&out));
        let err = assert_failed(&out);
        assert!(err.contains("no room for the tree") && err.contains(short_of), "{options}: {err}");
        assert_eq!(stdout(&out).trim(), "", "{options}: left behind in the directory");
    }
    let out = run("size=1m,nr_inodes=1024");
    assert_ok(&out);
    assert!(stdout(&out).contains("..data"), "{}", stdout(&out));
}

/// A tree that keeps finding no room (a tmpfs too small for the next tree
/// beside the one served, as when an app holds its old trees open and their
/// pages stay allocated) fails every write while a driver changes its
/// devices every 300 ms: the tree served stays, the writes are retried, and
/// the log says so once, not at every tree (153 warnings in 50 s before).
#[test]
fn a_write_that_keeps_finding_no_room_is_told_once_not_at_every_tree() {
    if !require_fuse() {
        return;
    }
    let api = api_for("ml");
    eight_device_slice(&api, 1);
    eight_device_pod(&api);
    let env = Env::new(&api, "ml", "p", TOKEN);
    let dir = env.path("dra");
    // Room for one tree of 8 GPUs (2.1 MiB), not for the next beside it.
    let _tmpfs = Tmpfs::mount(&dir, "3m");
    let mut serve = Serve::start_ready(&env, &dir, &["--backend", "files"], LIMIT);
    for generation in 2..=11 {
        eight_device_slice(&api, generation);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(serve.read("gpu/gpu/7/attr29").as_deref(), Some("value-7-29-1"), "the tree served stays");
    serve.signal(libc::SIGTERM);
    let log = stderr(&serve.wait(LIMIT));
    let told: Vec<&str> =
        log.lines().filter(|l| l.contains(" WARN ") && l.contains("cannot write the outputs")).collect();
    assert_eq!(told.len(), 1, "{}", told.join("\n"));
    assert!(told[0].contains("no room for the tree"), "{}", told[0]);
}
