//! `drafs inject`: manifests in, the same manifests with drafs added out, as
//! kubectl reads them; files, directories and standard input.

use drafs_test_support as support;

use support::*;

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
/// them back as they were (tests/kube_manifests.rs checks the meaning with kubectl itself).
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

/// Whether process `pid` handles SIGTERM (rather than dying of it).
fn catches_sigterm(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGTERM - 1)) != 0)
}

#[test]
fn a_signal_stops_inject_waiting_for_standard_input_like_any_command() {
    let mut child = std::process::Command::new(drafs_bin())
        .arg("inject")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Standard input stays open: inject waits for it.
    let _stdin = child.stdin.take();
    wait_until("drafs handles SIGTERM", std::time::Duration::from_secs(30), || catches_sigterm(child.id()));
    // SAFETY: a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = wait_output(child, std::time::Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("stopped by SIGTERM"), "{}", stderr(&out));
    assert_eq!(stdout(&out), "", "nothing half written");
}

#[test]
fn ready_when_healthy_puts_healthy_on_the_sidecars_readiness_probe_and_refuses_init() {
    let text = read("tests/inject/deployment.yaml");
    let out = drafs_with_stdin(
        &["inject", "--mode", "sidecar-files", "--image", "drafs:test", "--ready-when-healthy"],
        &text,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let docs = yaml_docs(&stdout(&out));
    let drafs = &docs[0]["spec"]["template"]["spec"]["initContainers"][0];
    assert_eq!(drafs["name"], "drafs");
    assert_eq!(
        drafs["readinessProbe"]["exec"]["command"],
        serde_json::json!(["/drafs", "probe", "--dir=/dra", "--healthy"])
    );
    assert_eq!(drafs["startupProbe"]["exec"]["command"], serde_json::json!(["/drafs", "probe", "--dir=/dra"]));
    let init = drafs_with_stdin(&["inject", "--mode", "init", "--image", "drafs:test", "--ready-when-healthy"], &text);
    assert_eq!(init.status.code(), Some(2), "a usage error");
    assert!(stderr(&init).contains("needs a sidecar mode"), "{}", stderr(&init));
}

/// `drafs node` refuses to publish a volume that requires a value known only
/// after prepare (the kubelet prepares after the publish), so the pod would
/// never start: `inject --mode csi` refuses it first, with the node's own
/// words; the modes that run after prepare keep taking it.
#[test]
fn csi_mode_refuses_a_require_the_node_could_never_meet() {
    let text = read("tests/inject/deployment.yaml");
    for prepared in ["nic/nic/0/.status/interfaceName", "gpu/gpu/0/.health"] {
        let args = ["inject", "--mode", "csi", "--require", "gpu/gpu/0/uuid", "--require", prepared];
        let out = drafs_with_stdin(&args, &text);
        assert_eq!(out.status.code(), Some(2), "{prepared}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!(
                "--require {prepared} is a value the driver reports when it prepares the device, after the volume is published"
            )),
            "{}",
            stderr(&out)
        );
        assert!(stdout(&out).is_empty(), "nothing written");
        for mode in ["init", "sidecar-files", "sidecar-fuse"] {
            let out = drafs_with_stdin(&["inject", "--mode", mode, "--require", prepared], &text);
            assert!(out.status.success(), "{mode}: {}", stderr(&out));
            assert!(stdout(&out).contains(&format!("--require={prepared}")), "{mode}: {}", stdout(&out));
        }
    }
    // What the scheduler decided can be required: it goes into the volume's attributes.
    let out = drafs_with_stdin(&["inject", "--mode", "csi", "--require", "gpu/gpu/0/uuid"], &text);
    assert!(out.status.success(), "{}", stderr(&out));
    let volume = &yaml_docs(&stdout(&out))[0]["spec"]["template"]["spec"]["volumes"][0];
    assert_eq!(volume["csi"]["volumeAttributes"]["require"], "gpu/gpu/0/uuid", "{volume}");
}

/// A chart that renames the driver (`node.driverName`) registers that name:
/// `--csi-driver` (or `DRAFS_CSI_DRIVER`) puts it in the volume, and a pod
/// with a volume of it already has drafs.
#[test]
fn csi_mode_names_the_driver_it_is_told_and_knows_its_volume_again() {
    let text = read("tests/inject/deployment.yaml");
    let driver_of = |out: &str| {
        yaml_docs(out)[0]["spec"]["template"]["spec"]["volumes"][0]["csi"]["driver"].as_str().unwrap().to_string()
    };
    let out = drafs_with_stdin(&["inject", "--mode", "csi", "--csi-driver", "node.drafs.example"], &text);
    assert!(out.status.success(), "{}", stderr(&out));
    let once = stdout(&out);
    assert_eq!(driver_of(&once), "node.drafs.example");
    let again = drafs_with_stdin(&["inject", "--mode", "csi", "--csi-driver", "node.drafs.example"], &once);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(stdout(&again), once, "the volume of the driver it names is drafs's: nothing added");
    assert!(stderr(&again).contains("already has drafs"), "{}", stderr(&again));
    let env = std::process::Command::new(drafs_bin())
        .args(["inject", "--mode", "csi", "tests/inject/deployment.yaml"])
        .env("DRAFS_CSI_DRIVER", "env.drafs.example")
        .output()
        .unwrap();
    assert!(env.status.success(), "{}", stderr(&env));
    assert_eq!(driver_of(&stdout(&env)), "env.drafs.example");
    // Validated as drafs node validates its --driver-name.
    for bad in ["Drafs.Dev", "drafs_dev", "", &format!("{}.dev", "a".repeat(60))] {
        let out = drafs_with_stdin(&["inject", "--mode", "csi", "--csi-driver", bad], &text);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("is not a CSI driver name"), "{bad:?}: {}", stderr(&out));
    }
}
