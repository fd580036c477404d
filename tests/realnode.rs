//! The real-node tier: drafs the way users run it. A real kubelet starts the
//! pods (containerd, runc, CNI, projected tokens, Pod Security admission),
//! after the real scheduler allocated a device from a real DRA driver (the
//! upstream test driver's kubelet plugin, publishing devices with realistic
//! attributes), and the app container reads what drafs wrote. The cluster runs
//! in namespaces of its own (tests/support/node.rs, tests/node/node.sh).
//!
//! Fails, not skips, when the node cannot be built or started; outside CI,
//! DRAFS_NO_NODE_TESTS=1 skips it (loudly). nextest runs these tests one at a
//! time (.config/nextest.toml): each starts its own node.

use drafs_test_support as support;

use std::time::Duration;

use serde_json::{Value, json};
use support::node::{
    self, DRAFS_IMAGE, GPU_DRIVER, NIC_DRIVER, Node, SHELL_IMAGE, gpu_pod, log_line, read_in_app, wait_read_in_app,
};
use support::*;

/// The examples' placeholders, made local: the image drafs's tests build, and
/// the shell image (with stand-ins for the examples' programs) for the apps.
fn localize(yaml: &str) -> String {
    yaml.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            let indent = &line[..line.len() - trimmed.len()];
            if trimmed.starts_with("image: registry.example/") {
                format!("{indent}image: {SHELL_IMAGE}")
            } else {
                line.replace("drafs:0.1.0", DRAFS_IMAGE)
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every file of an example directory, in order, localized.
fn example(dir: &str) -> String {
    yaml_files_in(&format!("examples/{dir}"))
        .iter()
        .map(|f| localize(&std::fs::read_to_string(f).unwrap()))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// `drafs inject` on the host, as a user would before `kubectl apply`.
fn inject(yaml: &str, args: &[&str]) -> String {
    let mut cmd = std::process::Command::new(drafs_bin());
    cmd.arg("inject").args(["--image", DRAFS_IMAGE]).args(args);
    let out = wait_output(
        {
            let mut child = cmd
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::Write;
            child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
            child
        },
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "drafs inject {args:?}: {}", stderr(&out));
    stdout(&out)
}

#[test]
fn each_mode_serves_the_allocated_device_in_a_real_pod() {
    let Some(node) = node::shared() else { return };
    let ns = "modes";
    // FUSE needs a privileged container: this namespace allows it.
    node.namespace(ns, Some("privileged"));
    node.claim_template(ns, "one-gpu", "gpu.nvidia.com", "gpu");
    let modes = [("init", "app-init"), ("sidecar-files", "app-files"), ("sidecar-fuse", "app-fuse")];
    for (mode, pod) in modes {
        node.kubectl_apply(&inject(&gpu_pod(ns, pod, "one-gpu"), &["--mode", mode, "--require", "gpu/gpu/0/uuid"]));
    }
    for (mode, pod) in modes {
        let running = node.wait_running(ns, pod);
        let (driver, device) = node.allocated(ns, &running, "gpu");
        assert_eq!(driver, GPU_DRIVER);
        let uuid = node.slice_attribute(&driver, &device, "uuid");
        let product = node.slice_attribute(&driver, &device, "productName");
        let line = log_line(node, ns, pod, "app", "uuid=");
        assert_eq!(line, format!("uuid={uuid} product={product}"), "{mode}: the app read another device's values");
        // The file as the app sees it, exactly the value: no trailing newline.
        assert_eq!(node.exec(ns, pod, "app", &["cat", "/dra/gpu/gpu/0/uuid"]), uuid, "{mode}");
    }

    // The driver changes an attribute of every GPU and republishes its slice:
    // the live modes follow, through files and through FUSE; init wrote once.
    node.set_devices(GPU_DRIVER, &node::devices(GPU_DRIVER, " (rev 2)"));
    for pod in ["app-files", "app-fuse"] {
        wait_read_in_app(node, ns, pod, "/dra/gpu/gpu/0/productName", "NVIDIA H200 (rev 2)");
    }
    assert_eq!(node.exec(ns, "app-init", "app", &["cat", "/dra/gpu/gpu/0/productName"]), "NVIDIA H200");
}

/// Write a network device's status into a claim, as a network driver does
/// after the sandbox starts (through the status subresource).
fn set_interface_names(node: &Node, ns: &str, claim: &str) {
    let mut c = Value::Null;
    let allocated = wait_for(Duration::from_secs(60), || {
        c = node.get_json(&["resourceclaim", "-n", ns, claim]).unwrap_or(Value::Null);
        c["status"]["allocation"].is_object()
    });
    assert!(allocated, "claim {ns}/{claim} not allocated: {c}");
    let devices: Vec<Value> = c["status"]["allocation"]["devices"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, r)| {
            json!({"driver": r["driver"], "pool": r["pool"], "device": r["device"],
                   "networkData": {"interfaceName": format!("net{}", i + 1), "ips": [format!("192.0.2.{}/24", 10 + i)]}})
        })
        .collect();
    let patch = json!({"status": {"devices": devices}}).to_string();
    node.kubectl_ok(&["patch", "resourceclaim", "-n", ns, claim, "--subresource=status", "--type=merge", "-p", &patch]);
}

#[test]
fn the_examples_run_unchanged_on_a_real_node() {
    let Some(node) = node::shared() else { return };
    let dirs = [
        "gpu-init",
        "gpu-sidecar-files",
        "gpu-exec-wrapper",
        "kubevirt-launcher",
        "rdma-sidecar-fuse",
        "gpu-extended-resource",
    ];
    for dir in dirs {
        node.kubectl_apply(&example(dir));
    }
    // The NIC driver reports interface names after prepare, as network drivers do.
    let nics = node.claim_of("drafs-rdma", "allreduce-worker-3", "nics");
    set_interface_names(node, "drafs-rdma", &nics);

    let gpu = |ns: &str, pod: &str, claim: &str, attribute: &str| {
        let running = node.wait_running(ns, pod);
        let (driver, device) = node.allocated(ns, &running, claim);
        node.slice_attribute(&driver, &device, attribute)
    };
    let uuid = gpu("drafs-gpu-init", "trainer-0", "gpu", "uuid");
    let pci = gpu("drafs-gpu-init", "trainer-0", "gpu", "resource.kubernetes.io/pciBusID");
    assert_eq!(log_line(node, "drafs-gpu-init", "trainer-0", "trainer", "GPU "), format!("GPU {uuid} at {pci}"));

    // The GPU asked for as an extended resource (nvidia.com/gpu, KEP-5004).
    let running = node.wait_running("drafs-gpu-extended", "inference-0");
    let (_, _, driver, device) = extended_device(node, "drafs-gpu-extended", &running, "trainer");
    let uuid = node.slice_attribute(&driver, &device, "uuid");
    let pci = node.slice_attribute(&driver, &device, "resource.kubernetes.io/pciBusID");
    assert_eq!(log_line(node, "drafs-gpu-extended", "inference-0", "trainer", "GPU "), format!("GPU {uuid} at {pci}"));

    let uuid = gpu("drafs-gpu-sidecar", "trainer-0", "gpu", "uuid");
    assert_eq!(log_line(node, "drafs-gpu-sidecar", "trainer-0", "trainer", "GPU "), format!("GPU {uuid}"));

    // The exec wrapper: the trainer's environment, set by `drafs exec`.
    let uuid = gpu("drafs-gpu-exec", "trainer-0", "gpu", "uuid");
    let pci = gpu("drafs-gpu-exec", "trainer-0", "gpu", "resource.kubernetes.io/pciBusID");
    assert_eq!(log_line(node, "drafs-gpu-exec", "trainer-0", "trainer", "GPU_UUID="), format!("GPU_UUID={uuid}"));
    assert_eq!(log_line(node, "drafs-gpu-exec", "trainer-0", "trainer", "GPU_UUIDS="), format!("GPU_UUIDS={uuid}"));
    assert_eq!(
        log_line(node, "drafs-gpu-exec", "trainer-0", "trainer", "GPU_PCI_BUS_ID="),
        format!("GPU_PCI_BUS_ID={pci}")
    );

    // KubeVirt's launcher reads the PCI address from the standard view with jq.
    let pci = gpu("drafs-vm", "virt-launcher-win11-abcde", "passthrough", "resource.kubernetes.io/pciBusID");
    assert_eq!(
        log_line(node, "drafs-vm", "virt-launcher-win11-abcde", "compute", "passing through"),
        format!("passing through PCI device {pci}")
    );
    assert_eq!(
        log_line(node, "drafs-vm", "virt-launcher-win11-abcde", "compute", "virt-launcher"),
        format!("virt-launcher --hostdev {pci}")
    );

    // FUSE sidecar: the interface names the driver reported, through the mount's propagation.
    node.wait_running("drafs-rdma", "allreduce-worker-3");
    assert_eq!(
        log_line(node, "drafs-rdma", "allreduce-worker-3", "worker", "NCCL_SOCKET_IFNAME="),
        "NCCL_SOCKET_IFNAME=net1,net2"
    );
}

/// Every `*-metadata.json` under the standard view's request directories, as
/// the app sees them: `path\tcontent` lines, sorted.
fn standard_view(node: &Node, ns: &str, pod: &str) -> Vec<(String, String)> {
    let root = "/var/run/kubernetes.io/dra-device-attributes";
    let listing = node.exec(ns, pod, "app", &["sh", "-c", &format!("find {root} -name '*-metadata.json' | sort")]);
    listing
        .lines()
        .map(|path| (path.trim_start_matches(root).to_string(), node.exec(ns, pod, "app", &["cat", path])))
        .collect()
}

/// The first document's attributes of every device in a standard-view file.
fn metadata_attributes(content: &str) -> Vec<Value> {
    // A stream of JSON documents (one per schema version), pretty or not.
    let first = serde_json::Deserializer::from_str(content).into_iter::<Value>().next().and_then(Result::ok);
    let first = first.unwrap_or(Value::Null);
    first["requests"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| d["attributes"].clone())
        .collect()
}

#[test]
fn the_standard_view_coexists_with_metadata_a_driver_writes() {
    let Some(node) = node::shared() else { return };
    let ns = "coexist";
    node.namespace(ns, Some("restricted"));
    node.claim_template(ns, "one-gpu", "gpu.nvidia.com", "gpu");
    node.claim_template(ns, "one-nic", "dra.net", "nic");
    let mut pod: Value = serde_json::from_str(&gpu_pod(ns, "both", "one-gpu")).unwrap();
    pod["spec"]["resourceClaims"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "nic", "resourceClaimTemplateName": "one-nic"}));
    pod["spec"]["containers"][0]["resources"]["claims"].as_array_mut().unwrap().push(json!({"name": "nic"}));
    // The NIC driver writes its own KEP-5304 metadata; drafs is told to leave it alone.
    let injected = inject(
        &pod.to_string(),
        &[
            "--mode",
            "sidecar-files",
            "--metadata-dir",
            "/var/run/kubernetes.io/dra-device-attributes",
            "--metadata-from-driver",
            NIC_DRIVER,
        ],
    );
    node.kubectl_apply(&injected);
    let running = node.wait_running(ns, "both");
    let (_, gpu_device) = node.allocated(ns, &running, "gpu");

    let before = standard_view(node, ns, "both");
    let names: Vec<&str> = before.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        names,
        [
            "/resourceclaimtemplates/gpu/gpu/gpu.nvidia.com-metadata.json",
            "/resourceclaimtemplates/nic/nic/dra.net-metadata.json"
        ],
        "exactly one file per request directory"
    );
    // The GPU's file is drafs's (every attribute of the slice); the NIC's is the driver's own.
    let gpu_attrs = metadata_attributes(&before[0].1);
    assert_eq!(gpu_attrs.len(), 1, "{}", before[0].1);
    let pci = node.slice_attribute(GPU_DRIVER, &gpu_device, "resource.kubernetes.io/pciBusID");
    assert_eq!(gpu_attrs[0]["resource.kubernetes.io/pciBusID"]["string"], pci.as_str(), "{}", before[0].1);
    let nic_attrs = metadata_attributes(&before[1].1);
    assert_eq!(nic_attrs.len(), 1, "{}", before[1].1);
    assert_eq!(nic_attrs[0]["driverName"]["string"], NIC_DRIVER, "the driver's own file: {}", before[1].1);

    // drafs publishes an update of both devices: the GPU's file follows, the driver's stays as it was.
    node.set_devices(GPU_DRIVER, &node::devices(GPU_DRIVER, " (updated)"));
    let mut nic = node::devices(NIC_DRIVER, "");
    for d in nic.as_array_mut().unwrap() {
        d["attributes"]["firmware"] = json!({"version": "28.40.1000"});
    }
    node.set_devices(NIC_DRIVER, &nic);
    let mut after = Vec::new();
    let updated = wait_for(Duration::from_secs(60), || {
        after = standard_view(node, ns, "both");
        after.first().is_some_and(|(_, c)| c.contains("NVIDIA H200 (updated)"))
    });
    assert!(updated, "drafs's GPU file did not follow the update: {after:?}");
    // drafs's tree saw the NIC's change too, so drafs did publish it.
    wait_until("the NIC's new firmware in the tree", Duration::from_secs(60), || {
        node.exec(ns, "both", "app", &["sh", "-c", "cat /dra/nic/nic/0/firmware 2>/dev/null || true"]) == "28.40.1000"
    });
    let after = standard_view(node, ns, "both");
    assert_eq!(after.len(), 2, "{after:?}");
    assert_eq!(after[1], before[1], "the driver's file must stay exactly as the driver wrote it");
}

#[test]
fn failures_show_in_kubectl_describe() {
    let Some(node) = node::shared() else { return };
    // No RBAC: the service account exists, nothing is bound to it.
    let ns = "no-rbac";
    node.kubectl_apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}).to_string());
    node.kubectl_apply(
        &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "drafs", "namespace": ns}})
            .to_string(),
    );
    node.claim_template(ns, "one-gpu", "gpu.nvidia.com", "gpu");
    node.kubectl_apply(&inject(&gpu_pod(ns, "app", "one-gpu"), &["--mode", "init", "--timeout", "20s"]));
    let failed = node.wait_pod(ns, "app", "failed in its init container", Duration::from_secs(90), |p| {
        p["status"]["initContainerStatuses"][0]["lastState"]["terminated"].is_object()
            || p["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"]
                .as_i64()
                .is_some_and(|c| c != 0)
    });
    let status = &failed["status"]["initContainerStatuses"][0];
    let terminated = if status["state"]["terminated"].is_object() {
        &status["state"]["terminated"]
    } else {
        &status["lastState"]["terminated"]
    };
    let message = terminated["message"].as_str().unwrap_or_default();
    assert!(message.contains("forbidden") || message.contains("403"), "termination message: {message}");
    assert!(message.contains("pods") && message.contains("get"), "names the verb and resource: {message}");
    let describe = node.kubectl_ok(&["describe", "pod", "-n", ns, "app"]);
    assert!(describe.contains(message.lines().next().unwrap()), "kubectl describe shows it:\n{describe}");

    // A required path that never appears: the pod fails with the path named.
    let ns = "missing";
    node.namespace(ns, Some("restricted"));
    node.claim_template(ns, "one-gpu", "gpu.nvidia.com", "gpu");
    let mut pod: Value = serde_json::from_str(&gpu_pod(ns, "app", "one-gpu")).unwrap();
    pod["spec"]["restartPolicy"] = json!("Never");
    node.kubectl_apply(&inject(
        &pod.to_string(),
        &["--mode", "init", "--require", "gpu/gpu/0/noSuchAttribute", "--timeout", "5s"],
    ));
    let failed = node.wait_pod(ns, "app", "Failed", Duration::from_secs(90), |p| p["status"]["phase"] == "Failed");
    let message =
        failed["status"]["initContainerStatuses"][0]["state"]["terminated"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("gpu/gpu/0/noSuchAttribute"), "termination message: {message}");
    let describe = node.kubectl_ok(&["describe", "pod", "-n", ns, "app"]);
    assert!(describe.contains("gpu/gpu/0/noSuchAttribute"), "kubectl describe:\n{describe}");
}

/// `drafs webhook` on the node's loopback with a certificate for 127.0.0.1,
/// and the shipped MutatingWebhookConfiguration pointed at it by URL (the
/// only change). Returns the webhook and its metrics address.
fn start_webhook(node: &Node, dir: &std::path::Path) -> (std::process::Child, String) {
    tls::ca(dir, "ca").unwrap();
    tls::serving(dir, "ca", "tls", "IP:127.0.0.1,DNS:localhost", 2).unwrap();
    let (addr, metrics) = ("127.0.0.1:8443", "127.0.0.1:9443".to_string());
    let hook = node.spawn_in_node(
        &drafs_bin(),
        &[
            "webhook",
            "--addr",
            addr,
            "--image",
            DRAFS_IMAGE,
            "--metrics-addr",
            &metrics,
            "--tls-cert",
            dir.join("tls.crt").to_str().unwrap(),
            "--tls-key",
            dir.join("tls.key").to_str().unwrap(),
        ],
        "webhook.log",
    );
    let config = support::webhook::configuration_by_url(&format!("https://{addr}/mutate"), &dir.join("ca.crt"));
    node.kubectl_apply(&config.to_string());
    (hook, metrics)
}

/// Wait until a server-side dry run of `pod` comes back with drafs in it: the
/// API server picks up a new webhook configuration asynchronously.
fn wait_for_injection(node: &Node, pod: &str) {
    let picked_up = wait_for(Duration::from_secs(30), || {
        let out = node.kubectl_stdin(&["create", "--dry-run=server", "-o", "json", "-f", "-"], Some(pod));
        out.status.success() && stdout(&out).contains("\"name\": \"drafs\"")
    });
    assert!(
        picked_up,
        "the API server never called the webhook:\n{}",
        std::fs::read_to_string(node.work().join("webhook.log")).unwrap_or_default()
    );
}

/// The webhook's count of reviews answered, from its metrics (inside the node).
fn reviews(node: &Node, metrics: &str) -> u64 {
    let out = node.in_node("busybox").args(["wget", "-qO-", &format!("http://{metrics}/metrics")]).output().unwrap();
    support::webhook::reviews_answered(&stdout(&out))
}

fn labelled(pod: &str, mode: &str) -> String {
    let mut p: Value = serde_json::from_str(pod).unwrap();
    p["metadata"]["labels"] = json!({"drafs.dev/inject": mode});
    p.to_string()
}

#[test]
fn restricted_namespaces_admit_drafs_from_inject_and_the_webhook() {
    let Some(node) = node::shared() else { return };
    let ns = "restricted";
    node.namespace(ns, Some("restricted"));
    node.claim_template(ns, "one-gpu", "gpu.nvidia.com", "gpu");
    // Admitted without drafs: the pod itself meets the restricted level.
    let plain = node.kubectl_stdin(&["create", "--dry-run=server", "-f", "-"], Some(&gpu_pod(ns, "plain", "one-gpu")));
    assert!(plain.status.success(), "the pod itself is not restricted: {}", stderr(&plain));

    // drafs inject: init and sidecar-files are admitted and run.
    for (mode, pod) in [("init", "inj-init"), ("sidecar-files", "inj-files")] {
        let out =
            node.kubectl_stdin(&["apply", "-f", "-"], Some(&inject(&gpu_pod(ns, pod, "one-gpu"), &["--mode", mode])));
        assert!(out.status.success(), "{mode}: refused at restricted: {}", stderr(&out));
        assert!(!stderr(&out).contains("violate"), "{mode}: a PodSecurity warning: {}", stderr(&out));
    }
    // FUSE needs privileged: a denial that names the reason, never a pod stuck in Init.
    let fuse = node.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&inject(&gpu_pod(ns, "inj-fuse", "one-gpu"), &["--mode", "sidecar-fuse"])),
    );
    assert!(!fuse.status.success(), "a privileged FUSE sidecar was admitted at restricted");
    assert!(stderr(&fuse).contains("privileged"), "the denial names the reason: {}", stderr(&fuse));

    // The webhook, as shipped: labelled pods created with kubectl get drafs and run.
    let certs = tempfile::tempdir().unwrap();
    let (mut hook, metrics) = start_webhook(node, certs.path());
    let first = labelled(&gpu_pod(ns, "hook-init", "one-gpu"), "init");
    wait_for_injection(node, &first);
    node.kubectl_apply(&first);
    node.kubectl_apply(&labelled(&gpu_pod(ns, "hook-files", "one-gpu"), "sidecar-files"));
    let denied = node
        .kubectl_stdin(&["create", "-f", "-"], Some(&labelled(&gpu_pod(ns, "hook-fuse", "one-gpu"), "sidecar-fuse")));
    assert!(!denied.status.success(), "a privileged FUSE sidecar was admitted at restricted through the webhook");
    assert!(stderr(&denied).contains("privileged"), "the denial names the reason: {}", stderr(&denied));

    for pod in ["inj-init", "inj-files", "hook-init", "hook-files"] {
        let running = node.wait_running(ns, pod);
        let (driver, device) = node.allocated(ns, &running, "gpu");
        let uuid = node.slice_attribute(&driver, &device, "uuid");
        assert!(log_line(node, ns, pod, "app", "uuid=").starts_with(&format!("uuid={uuid} ")), "{pod}");
        // drafs ran as a non-root user, as the restricted level asks.
        let drafs = running["spec"]["initContainers"][0].clone();
        assert_eq!(drafs["name"], "drafs", "{pod}");
        let security = &drafs["securityContext"];
        assert_eq!(security["runAsNonRoot"], true, "{pod}: {drafs}");
        assert_eq!(security["allowPrivilegeEscalation"], false, "{pod}: {drafs}");
        assert_eq!(security["readOnlyRootFilesystem"], true, "{pod}: {drafs}");
        assert_eq!(security["capabilities"]["drop"], json!(["ALL"]), "{pod}: {drafs}");
        assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault", "{pod}: {drafs}");
        // And the kubelet ran it as that user.
        let user = &running["status"]["initContainerStatuses"][0]["user"]["linux"]["uid"];
        assert_eq!(user, &json!(65532), "{pod}: {}", running["status"]);
    }

    // An unlabelled pod never reaches the webhook and gets no drafs.
    let before = reviews(node, &metrics);
    node.kubectl_apply(&gpu_pod(ns, "unlabelled", "one-gpu"));
    let pod = node.get_json(&["pod", "-n", ns, "unlabelled"]).unwrap();
    assert!(pod["spec"]["initContainers"].is_null(), "{}", pod["spec"]);
    assert_eq!(reviews(node, &metrics), before, "the API server called the webhook for an unlabelled pod");
    let _ = hook.kill();
    let _ = hook.wait();
}

/// The FUSE mounts in the node's mount namespace whose mount point is under a
/// pod's directory.
fn fuse_mounts_of(node: &Node, uid: &str) -> Vec<String> {
    node.mountinfo().lines().filter(|l| l.contains(" - fuse") && l.contains(uid)).map(str::to_string).collect()
}

/// The host PID of the process that serves a pod's FUSE tree: the `drafs
/// serve` process with /dev/fuse open (its supervisor has not).
fn fuse_server_pid(uid: &str) -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        if cmdline.starts_with(b"/drafs\0serve")
            && (cgroup.contains(uid) || cgroup.contains(&uid.replace('-', "_")))
            && holds_dev_fuse(pid)
        {
            return Some(pid);
        }
    }
    None
}

/// The drafs sidecar's restart count.
fn drafs_restarts(pod: &Value) -> i64 {
    pod["status"]["initContainerStatuses"][0]["restartCount"].as_i64().unwrap_or(0)
}

#[test]
fn deleting_a_pod_with_a_fuse_sidecar_leaves_no_mount_even_after_a_hard_kill() {
    let Some(node) = node::shared() else { return };
    let ns = "fuse";
    node.namespace(ns, Some("privileged"));
    node.claim_template(ns, "one-gpu", "gpu.nvidia.com", "gpu");
    let pods = ["graceful", "killed", "restarted"];
    for pod in pods {
        node.kubectl_apply(&inject(&gpu_pod(ns, pod, "one-gpu"), &["--mode", "sidecar-fuse"]));
    }
    for pod in pods {
        let running = node.wait_running(ns, pod);
        let uid = running["metadata"]["uid"].as_str().unwrap().to_string();
        assert_eq!(fuse_mounts_of(node, &uid).len(), 1, "{pod}: drafs's mount under the pod's volume");
        let server = fuse_server_pid(&uid).expect("drafs serve runs on the node");
        match pod {
            // As a crash does, or the OOM killer choosing the process with the
            // most memory (cgroup v1, or v2 without memory.oom.group; with it,
            // the supervisor is exempt: tests/serve.rs checks its score):
            // SIGKILL, no chance to unmount.
            "killed" | "restarted" => {
                // SAFETY: a plain kill(2) of a process of the test's own node.
                assert_eq!(unsafe { libc::kill(server, libc::SIGKILL) }, 0);
            }
            _ => {}
        }
        if pod == "restarted" {
            // Not deleted: the kubelet restarts the sidecar and the app reads
            // the device's values again.
            let (driver, device) = node.allocated(ns, &running, "gpu");
            let uuid = node.slice_attribute(&driver, &device, "uuid");
            node.wait_pod(ns, pod, "with drafs restarted", Duration::from_secs(60), |p| drafs_restarts(p) >= 1);
            let mut seen = String::new();
            let again = wait_for(Duration::from_secs(60), || {
                seen = node.exec(ns, pod, "app", &["sh", "-c", "cat /dra/gpu/gpu/0/uuid 2>&1"]);
                seen == uuid
            });
            assert!(again, "{pod}: after the sidecar's restart the app reads {seen:?}");
            assert_eq!(fuse_mounts_of(node, &uid).len(), 1, "{pod}: one mount, the new server's");
        }
        let started = std::time::Instant::now();
        node.kubectl_ok(&["delete", "pod", "-n", ns, pod, "--wait=false"]);
        let gone = wait_for(Duration::from_secs(60), || node.get_json(&["pod", "-n", ns, pod]).is_none());
        let took = started.elapsed();
        assert!(
            gone,
            "{pod}: still there a minute after deletion:\n{}",
            node.kubectl_ok(&["describe", "pod", "-n", ns, pod])
        );
        // The grace period is 5 s; stuck is what the issue saw: more than 30 s.
        assert!(took < Duration::from_secs(30), "{pod}: stuck Terminating for {took:?}");
        assert!(
            fuse_mounts_of(node, &uid).is_empty(),
            "{pod}: a drafs mount was left: {:?}",
            fuse_mounts_of(node, &uid)
        );
    }
}

fn pod_ready(pod: &Value) -> Option<bool> {
    let conditions = pod["status"]["conditions"].as_array()?;
    conditions.iter().find(|c| c["type"] == "Ready").map(|c| c["status"] == "True")
}

/// The driver reports its GPU Unhealthy over DRAResourceHealth; the kubelet
/// writes that into the pod's status (KEP-4680); the sidecar, which watches
/// its pod, serves it as `.health`, and with `--ready-when-healthy` the pod
/// leaves Ready (and its Services' endpoints) until the GPU is healthy again.
/// What the driver learned at prepare time, written into the claim's
/// `status.devices[].data` as a driver does, reaches the app as files too.
#[test]
fn device_health_a_driver_reports_reaches_the_tree_and_the_pods_readiness() {
    let Some(node) = node::shared() else { return };
    let ns = "health";
    node.namespace(ns, Some("restricted"));
    node.claim_template(ns, "one-gpu", "gpu.nvidia.com", "gpu");
    let args = ["--mode", "sidecar-files", "--require", "gpu/gpu/0/uuid", "--ready-when-healthy"];
    node.kubectl_apply(&inject(&gpu_pod(ns, "app", "one-gpu"), &args));
    node.wait_running(ns, "app");
    let gpu = node.allocated_device(ns, "app", "gpu");
    let (claim_name, driver, pool, device) = (&gpu.claim, &gpu.driver, &gpu.pool, &gpu.device);

    // The driver's prepare-time data (a MIG device it created), through the status subresource.
    let data = json!({"uuid": "MIG-1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9", "profile": "1g.18gb", "gpu": {"index": 0}});
    let patch = json!({"status": {"devices": [{"driver": driver, "pool": pool, "device": device, "data": data}]}});
    let patch = patch.to_string();
    node.kubectl_ok(&[
        "patch",
        "resourceclaim",
        "-n",
        ns,
        claim_name,
        "--subresource=status",
        "--type=merge",
        "-p",
        &patch,
    ]);
    let uuid = "/dra/gpu/gpu/0/.status/data.d/uuid";
    wait_read_in_app(node, ns, "app", uuid, "MIG-1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9");
    assert_eq!(read_in_app(node, ns, "app", "/dra/gpu/gpu/0/.status/data.d/gpu/index"), "0");
    assert_eq!(read_in_app(node, ns, "app", "/dra/gpu/gpu/0/.status/data.d/profile"), "1g.18gb");
    let health = "/dra/gpu/gpu/0/.health";
    // Nothing reported yet: the kubelet says Unknown (the file says what the kubelet says).
    wait_read_in_app(node, ns, "app", health, "Unknown");

    let report = |state: &str, message: &str| node.report_gpu_health(&gpu, state, message);
    report("Unhealthy", "XID 79 (from the test)");
    wait_read_in_app(node, ns, "app", health, "Unhealthy");
    assert_eq!(read_in_app(node, ns, "app", "/dra/gpu/gpu/0/.healthMessage"), "XID 79 (from the test)");
    node.wait_pod(ns, "app", "NotReady while its GPU is Unhealthy", Duration::from_secs(60), |p| {
        pod_ready(p) == Some(false)
    });

    report("Healthy", "");
    wait_read_in_app(node, ns, "app", health, "Healthy");
    node.wait_pod(ns, "app", "Ready again", Duration::from_secs(60), |p| pod_ready(p) == Some(true));
    // The app kept running throughout: readiness, not restarts.
    let pod = node.get_json(&["pod", "-n", ns, "app"]).unwrap();
    assert_eq!(pod["status"]["containerStatuses"][0]["restartCount"], 0, "{}", pod["status"]);
    assert_eq!(drafs_restarts(&pod), 0);
}

/// Consumable capacity (KEP-5075) with the real scheduler: two pods each ask
/// for 20Gi of the GPU shared by memory; the scheduler puts both on it, each
/// allocation with its own share ID and the 20Gi it consumed, and each app
/// reads its share (`.consumed/`) beside the device's total (`.capacity/`).
#[test]
fn two_pods_sharing_a_gpu_by_memory_each_read_their_share() {
    let Some(node) = node::shared() else { return };
    let ns = "shared-gpu";
    node.namespace(ns, Some("restricted"));
    node.shared_gpu_template(ns, "gpu-20gi", "20Gi");
    let pods = ["inference-a", "inference-b"];
    for pod in pods {
        node.kubectl_apply(&inject(&gpu_pod(ns, pod, "gpu-20gi"), &["--mode", "init", "--require", "gpu/gpu/0/uuid"]));
    }
    let mut shares = Vec::new();
    for pod in pods {
        node.wait_running(ns, pod);
        let read = |path: &str| node.exec(ns, pod, "app", &["cat", &format!("/dra/gpu/gpu/0/{path}")]);
        assert_eq!(read(".device"), "gpu-shared", "{pod}");
        assert_eq!(read(".consumed/gpu.nvidia.com/memory"), "20Gi", "{pod}");
        assert_eq!(read(".capacity/gpu.nvidia.com/memory"), "80Gi", "{pod}");
        assert_eq!(read("uuid"), "GPU-5c1f7e2a-3b4d-4e6f-8a9b-0c1d2e3f4a5b", "{pod}");
        // What the scheduler wrote, as drafs serves it.
        let claim = node.get_json(&["resourceclaim", "-n", ns, &node.claim_of(ns, pod, "gpu")]).unwrap();
        let result = &claim["status"]["allocation"]["devices"]["results"][0];
        assert_eq!(result["consumedCapacity"]["memory"], "20Gi", "{claim}");
        assert_eq!(read(".shareID"), result["shareID"].as_str().unwrap(), "{pod}");
        shares.push(read(".shareID"));
    }
    assert_ne!(shares[0], shares[1], "two allocations of one device, two shares");
}

/// A pod that asks for one `resource` in each of `containers` the
/// device-plugin way (`resources.limits`, no claim), at the `restricted`
/// level; each container prints the uuid drafs serves for it at
/// `/dra/<resource>/<container>/0/uuid`, then sleeps.
fn extended_pod(ns: &str, name: &str, resource: &str, containers: &[&str]) -> String {
    let containers: Vec<Value> = containers
        .iter()
        .map(|c| {
            json!({
                "name": c, "image": SHELL_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", format!("echo \"uuid=$(cat /dra/{resource}/{c}/0/uuid)\"; exec sleep 3600")],
                "resources": {"limits": {resource: "1"}},
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            })
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": containers,
        },
    })
    .to_string()
}

/// The device the scheduler gave `container` for its extended resource: the
/// generated claim from the pod's status, the container's request in it, the
/// result for that request. (claim, request, driver, device)
fn extended_device(node: &Node, ns: &str, pod: &Value, container: &str) -> (String, String, String, String) {
    let status = &pod["status"]["extendedResourceClaimStatus"];
    let claim_name = status["resourceClaimName"].as_str().unwrap_or_else(|| panic!("no claim: {}", pod["status"]));
    let mapping = status["requestMappings"].as_array().unwrap().iter().find(|m| m["containerName"] == container);
    let request = mapping.unwrap_or_else(|| panic!("{container} has no mapping: {status}"))["requestName"].clone();
    let claim = node.get_json(&["resourceclaim", "-n", ns, claim_name]).expect("the generated claim");
    let results = claim["status"]["allocation"]["devices"]["results"].as_array().unwrap();
    let result = results.iter().find(|r| r["request"] == request).expect("a result for the request");
    let text = |v: &Value| v.as_str().unwrap().to_string();
    (claim_name.to_string(), text(&request), text(&result["driver"]), text(&result["device"]))
}

/// Extended resources backed by DRA (KEP-5004), through the real scheduler:
/// no claim in the pod, the scheduler makes one. drafs serves the device at
/// `<resource>/<container>/0/` in each mode, to each of two containers their
/// own, and its standard view never keeps the app of a driver that writes
/// its own metadata from starting (the runtime mounts the driver's file on
/// the directories drafs made).
#[test]
fn extended_resources_reach_each_container_in_every_mode() {
    let Some(node) = node::shared() else { return };
    let ns = "extended";
    node.namespace(ns, Some("privileged"));
    let view = ["--metadata-dir", "/var/run/kubernetes.io/dra-device-attributes"];
    let modes = [("init", "ext-init"), ("sidecar-files", "ext-files"), ("sidecar-fuse", "ext-fuse")];
    for (mode, pod) in modes {
        let args = [&["--mode", mode, "--require", "nvidia.com/gpu/app/0/uuid"][..], &view[..]].concat();
        node.kubectl_apply(&inject(&extended_pod(ns, pod, node::GPU_RESOURCE, &["app"]), &args));
    }
    node.kubectl_apply(&inject(&extended_pod(ns, "pair", node::GPU_RESOURCE, &["left", "right"]), &["--mode", "init"]));
    // The NIC driver writes its own KEP-5304 file, which the runtime mounts
    // at resourceclaims/<generated claim>/<request>/: drafs's view is on.
    node.kubectl_apply(&inject(
        &extended_pod(ns, "nic", node::NIC_RESOURCE, &["app"]).replace("/0/uuid", "/0/ifName"),
        &[&["--mode", "sidecar-files"][..], &view[..]].concat(),
    ));

    for (mode, pod) in modes {
        let running = node.wait_running(ns, pod);
        assert!(running["spec"]["resourceClaims"].is_null(), "{mode}: the pod has no claim of its own");
        let (claim, request, driver, device) = extended_device(node, ns, &running, "app");
        assert_eq!(driver, GPU_DRIVER);
        let uuid = node.slice_attribute(&driver, &device, "uuid");
        assert_eq!(log_line(node, ns, pod, "app", "uuid="), format!("uuid={uuid}"), "{mode}");
        assert_eq!(node.exec(ns, pod, "app", &["cat", "/dra/nvidia.com/gpu/app/0/.request"]), request, "{mode}");
        let files = standard_view(node, ns, pod);
        let paths: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, vec![format!("/resourceclaims/{claim}/{request}/{GPU_DRIVER}-metadata.json")], "{mode}");
        assert_eq!(metadata_attributes(&files[0].1)[0]["uuid"]["string"], uuid.as_str(), "{mode}");
    }

    let running = node.wait_running(ns, "pair");
    let mut seen = Vec::new();
    for container in ["left", "right"] {
        let (_, _, driver, device) = extended_device(node, ns, &running, container);
        let uuid = node.slice_attribute(&driver, &device, "uuid");
        assert_eq!(log_line(node, ns, "pair", container, "uuid="), format!("uuid={uuid}"), "{container}");
        seen.push(uuid);
    }
    assert_ne!(seen[0], seen[1], "each container reads its own GPU");

    let running = node.wait_running(ns, "nic");
    let (claim, request, driver, device) = extended_device(node, ns, &running, "app");
    assert_eq!(driver, NIC_DRIVER);
    let if_name = node.slice_attribute(&driver, &device, "ifName");
    assert_eq!(log_line(node, ns, "nic", "app", "uuid="), format!("uuid={if_name}"));
    let files = standard_view(node, ns, "nic");
    let paths: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(paths, vec![format!("/resourceclaims/{claim}/{request}/{NIC_DRIVER}-metadata.json")]);
    let attributes = metadata_attributes(&files[0].1);
    assert_eq!(attributes.len(), 1, "exactly one valid file: {}", files[0].1);
}

/// A namespace opted in to the webhook: an unlabelled pod that asks for an
/// extended resource gets drafs like a pod with a claim, and a pod that asks
/// for no device is never sent (so a webhook outage cannot block it).
#[test]
fn an_opted_in_namespace_gives_drafs_to_extended_resource_pods() {
    let Some(node) = node::shared() else { return };
    let ns = "extended-hook";
    node.namespace(ns, Some("restricted"));
    node.kubectl_ok(&["label", "namespace", ns, "drafs.dev/inject=enabled"]);
    let certs = tempfile::tempdir().unwrap();
    let (mut hook, metrics) = start_webhook(node, certs.path());
    let pod = extended_pod(ns, "gpu", node::GPU_RESOURCE, &["app"]);
    wait_for_injection(node, &pod);
    node.kubectl_apply(&pod);
    let running = node.wait_running(ns, "gpu");
    assert_eq!(running["spec"]["initContainers"][0]["name"], "drafs");
    let (_, _, driver, device) = extended_device(node, ns, &running, "app");
    let uuid = node.slice_attribute(&driver, &device, "uuid");
    assert_eq!(log_line(node, ns, "gpu", "app", "uuid="), format!("uuid={uuid}"));

    // A pod without devices is not sent, and with the webhook down is still created.
    let plain = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": ns},
        "spec": {"securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [{"name": "app", "image": SHELL_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "3600"],
                   "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}})
    .to_string();
    let before = reviews(node, &metrics);
    let out = node.kubectl_stdin(&["create", "--dry-run=server", "-f", "-"], Some(&plain));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(reviews(node, &metrics), before, "a pod without devices was sent to the webhook");
    let _ = hook.kill();
    let _ = hook.wait();
    let out = node.kubectl_stdin(&["create", "-f", "-"], Some(&plain));
    assert!(out.status.success(), "the webhook's outage blocked a pod without devices: {}", stderr(&out));
    let refused =
        node.kubectl_stdin(&["create", "-f", "-"], Some(&extended_pod(ns, "gpu-2", node::GPU_RESOURCE, &["app"])));
    assert!(!refused.status.success(), "a device pod started without drafs while the webhook was down");
    assert!(stderr(&refused).contains("namespaces.drafs.dev"), "{}", stderr(&refused));
}
