//! `drafs exec` and `drafs copy-self`: apps that only read environment
//! variables; and what the commands say when their input is missing.

use drafs_test_support as support;

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
fn exec_sets_the_consumed_share_from_the_api() {
    let (_api, env) = example("serving", "inference-0", "examples/offline/shared-gpu.yaml");
    let out = env.run(
        &[
            "exec",
            "--env",
            "GPU_MEMORY=gpu/gpu/0/.consumed/gpu.nvidia.com/memory",
            "--env",
            "NIC_QUEUES=net/nic/.consumed/dra.net/queues",
            "--",
            "sh",
            "-c",
            r#"printf '%s|%s' "$GPU_MEMORY" "$NIC_QUEUES""#,
        ],
        LIMIT,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "20Gi|4");
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

/// A CPU driver's consumable capacity: the number of CPUs a pod got reaches a
/// program as an environment variable, next to the NUMA node they are on.
#[test]
fn the_cpus_a_shared_cpu_claim_got_reach_the_environment() {
    let (_api, env) = example("telco", "packet-worker-2", "examples/offline/cpu-share.yaml");
    let out = env.run(
        &[
            "exec",
            "--env",
            "CPUS=cpus/cpu/0/.consumed/dra.cpu/cpu",
            "--env",
            "OF=cpus/cpu/0/.capacity/dra.cpu/cpu",
            "--env",
            "NUMA=cpus/cpu/0/numaNodeID",
            "--",
            "sh",
            "-c",
            r#"printf '%s of %s on NUMA node %s' "$CPUS" "$OF" "$NUMA""#,
        ],
        LIMIT,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "8 of 64 on NUMA node 1");
}

#[test]
fn exec_sets_driver_data_members_from_the_api_and_a_tree() {
    let (_api, env) = example("research", "notebook-0", "examples/offline/mig-dynamic.yaml");
    let vars = [
        "--env",
        "MIG_UUID=mig/mig/0/.status/data.d/uuid",
        "--env",
        "MIG_GPU=mig/mig/0/.status/data.d/gpu/index",
        "--env",
        "ALL_MIGS=mig/mig/.status/data.d/uuid",
    ];
    let script = r#"printf '%s|%s|%s' "$MIG_UUID" "$MIG_GPU" "$ALL_MIGS""#;
    let want = "MIG-5c8a2f1e-7b3d-5e9a-8c4f-1d2e3f4a5b6c|0|MIG-5c8a2f1e-7b3d-5e9a-8c4f-1d2e3f4a5b6c";
    let mut args = vec!["exec"];
    args.extend(vars);
    args.extend(["--", "sh", "-c", script]);
    let out = env.run(&args, LIMIT);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), want);

    let dir = env.path("dra");
    assert!(env.run(&["init", "--dir", dir.to_str().unwrap()], LIMIT).status.success());
    let mut args = vec!["exec", "--from-dir", dir.to_str().unwrap()];
    args.extend(vars);
    args.extend(["--", "sh", "-c", script]);
    let out = env.run(&args, LIMIT);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), want);
}

/// `--claim` and `--timeout` choose what is resolved and how long to wait for
/// it, and `--from-file` where from; with `--from-dir` nothing is resolved, so
/// giving them is a mistake, said at once (exit 2), not silently ignored.
#[test]
fn flags_that_from_dir_would_ignore_are_refused() {
    for extra in [["--claim", "gpu"], ["--timeout", "5s"], ["--from-file", "x.yaml"]] {
        let mut args = vec!["exec", "--from-dir", "/nonexistent/dra", "--env", "U=gpu/gpu/0/uuid"];
        args.extend(extra);
        args.extend(["--", "true"]);
        let out = std::process::Command::new(drafs_bin()).args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("cannot be used with"), "{extra:?}: {}", stderr(&out));
    }
}
