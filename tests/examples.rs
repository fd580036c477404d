//! The manifests in examples/ run as written: their drafs args, probes and hooks
//! are executed for real (directories moved into scratch space).

use drafs_test_support as support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use support::*;

const LIMIT: Duration = Duration::from_secs(60);

/// Every document of an example directory, in the order `kubectl apply -f DIR` applies them.
fn manifest(dir: &str) -> Vec<Value> {
    yaml_files_in(dir).iter().flat_map(|f| yaml_docs(&std::fs::read_to_string(f).unwrap())).collect()
}

fn pod_spec(docs: &[Value]) -> &Value {
    &docs.iter().find(|d| d["kind"] == "Pod").expect("a Pod")["spec"]
}

fn drafs_container(spec: &Value) -> &Value {
    spec["initContainers"].as_array().unwrap().iter().find(|c| c["name"] == "drafs").expect("a drafs init container")
}

/// Strings of a JSON array with in-pod paths replaced by scratch paths.
fn remap(list: &Value, dirs: &[(&str, &Path)]) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let mut s = a.as_str().unwrap().to_string();
            for (from, to) in dirs {
                s = replace_path(&s, from, &to.display().to_string());
            }
            s
        })
        .collect()
}

/// Replace `from` where it is a whole path (followed by nothing or `/`), so that
/// remapping `/dra` leaves `/drafs` alone.
fn replace_path(s: &str, from: &str, to: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find(from) {
        let after = &rest[i + from.len()..];
        out.push_str(&rest[..i]);
        if after.is_empty() || after.starts_with('/') {
            out.push_str(to);
        } else {
            out.push_str(from);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Run an exec probe or hook command (`/drafs ...`) with the binary under test.
fn exec(env: &Env, command: &[String]) -> std::process::Output {
    assert_eq!(command[0], "/drafs", "the image's binary is /drafs");
    let args: Vec<&str> = command[1..].iter().map(String::as_str).collect();
    env.run(&args, LIMIT)
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn downward_api_env(container: &Value) {
    let env = container["env"].as_array().unwrap();
    for (name, field) in [("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")] {
        let var = env.iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("{name} not set"));
        assert_eq!(var["valueFrom"]["fieldRef"]["fieldPath"], field);
    }
}

#[test]
fn init_container_example() {
    let docs = manifest("examples/gpu-init");
    let spec = pod_spec(&docs);
    let init = drafs_container(spec);
    downward_api_env(init);
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    let (_api, env) = example("ml", "trainer-0", "examples/offline/gpu-training.yaml");
    let dra = env.path("dra");
    let meta = env.path("meta");
    let args = remap(&init["args"], &[("/var/run/kubernetes.io/dra-device-attributes", &meta), ("/dra", &dra)]);
    let out = env.run(&as_strs(&args), LIMIT);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(read_tree(&dra).contains_key("gpu/gpu/0/uuid"));
    assert!(read_tree(&meta).contains_key("resourceclaimtemplates/gpu/gpu/gpu.nvidia.com-metadata.json"));
}

/// The GPU asked for as an extended resource: the example's drafs args
/// against the dump of such a pod (its scheduler-made claim), and the path
/// the trainer reads.
#[test]
fn extended_resource_example() {
    let docs = manifest("examples/gpu-extended-resource");
    let spec = pod_spec(&docs);
    let init = drafs_container(spec);
    downward_api_env(init);
    assert!(spec["resourceClaims"].is_null(), "the pod names no claim");
    let (_api, env) = example("ml", "inference-0", "examples/offline/extended-gpu.yaml");
    let dra = env.path("dra");
    let meta = env.path("meta");
    let args = remap(&init["args"], &[("/var/run/kubernetes.io/dra-device-attributes", &meta), ("/dra", &dra)]);
    let out = env.run(&as_strs(&args), LIMIT);
    assert!(out.status.success(), "{}", stderr(&out));
    let tree = read_tree(&dra);
    let command = spec["containers"][0]["command"][2].as_str().unwrap();
    for path in ["nvidia.com/gpu/trainer/0/uuid", "nvidia.com/gpu/trainer/0/resource.kubernetes.io/pciBusID"] {
        assert!(command.contains(&format!("/dra/{path}")), "the trainer reads {path}: {command}");
        assert!(tree.contains_key(path), "{path}");
    }
    assert!(read_tree(&meta).keys().all(|k| k.starts_with("resourceclaims/inference-0-extended-resources-q8w2z/")));
}

#[test]
fn fuse_sidecar_example() {
    if !require_fuse() {
        return;
    }
    let docs = manifest("examples/rdma-sidecar-fuse");
    let spec = pod_spec(&docs);
    let sidecar = drafs_container(spec);
    downward_api_env(sidecar);
    assert_eq!(sidecar["restartPolicy"], "Always", "a native sidecar");
    assert_eq!(sidecar["volumeMounts"][0]["mountPropagation"], "Bidirectional");
    assert_eq!(spec["containers"][0]["volumeMounts"][0]["mountPropagation"], "HostToContainer");
    let (_api, env) = example("hpc", "allreduce-worker-3", "examples/offline/rdma-network.yaml");
    let dra = env.path("dra");
    let args = remap(&sidecar["args"], &[("/dra", &dra)]);
    let mut serve = Serve { child: Some(env.spawn(&as_strs(&args))), dir: dra.clone() };
    let probe = remap(&sidecar["startupProbe"]["exec"]["command"], &[("/dra", &dra)]);
    wait_until("the startupProbe to pass", LIMIT, || exec(&env, &probe).status.success());
    assert_eq!(serve.read("nics/rdma/0/.status/interfaceName").as_deref(), Some("net1"));
    let pre_stop = remap(&sidecar["lifecycle"]["preStop"]["exec"]["command"], &[("/dra", &dra)]);
    assert!(exec(&env, &pre_stop).status.success());
    assert!(!is_mounted(&dra), "preStop unmounts");
    serve.signal(libc::SIGTERM);
    // The kubelet sends SIGTERM once preStop is done; serve, which checks its
    // mount every second, may see the mount gone first and exit 1 saying so.
    // Either ends a terminating pod's sidecar (the kubelet restarts none then).
    let out = serve.wait(LIMIT);
    let mount_seen_gone = out.status.code() == Some(1) && stderr(&out).contains("was removed (drafs unmount");
    assert!(out.status.code() == Some(0) || mount_seen_gone, "{:?}: {}", out.status, stderr(&out));
}

#[test]
fn files_sidecar_example() {
    let docs = manifest("examples/gpu-sidecar-files");
    let spec = pod_spec(&docs);
    let sidecar = drafs_container(spec);
    downward_api_env(sidecar);
    assert_eq!(sidecar["restartPolicy"], "Always");
    assert!(sidecar["securityContext"].get("privileged").is_none());
    let (_api, env) = example("ml", "trainer-0", "examples/offline/gpu-training.yaml");
    let dra = env.path("dra");
    let args = remap(&sidecar["args"], &[("/dra", &dra)]);
    let mut serve = Serve { child: Some(env.spawn(&as_strs(&args))), dir: dra.clone() };
    let probe = remap(&sidecar["startupProbe"]["exec"]["command"], &[("/dra", &dra)]);
    wait_until("the startupProbe to pass", LIMIT, || exec(&env, &probe).status.success());
    assert_eq!(serve.read("gpu/gpu/0/uuid").as_deref(), Some("GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b"));
    serve.signal(libc::SIGTERM);
    assert_eq!(serve.wait(LIMIT).status.code(), Some(0));
}

#[test]
fn kubevirt_launcher_reads_the_standard_metadata() {
    let docs = manifest("examples/kubevirt-launcher");
    let spec = pod_spec(&docs);
    let init = drafs_container(spec);
    let (_api, env) = example("vms", "virt-launcher-win11-abcde", "examples/offline/vm-passthrough.yaml");
    let meta: PathBuf = env.path("meta");
    let dra = env.path("dra");
    let std_dir = "/var/run/kubernetes.io/dra-device-attributes";
    let args = remap(&init["args"], &[(std_dir, &meta), ("/dra", &dra)]);
    let out = env.run(&as_strs(&args), LIMIT);
    assert!(out.status.success(), "{}", stderr(&out));

    // The launcher script, reading from the scratch copy, with the final exec shown instead of run.
    let config = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let script = config["data"]["launch.sh"]
        .as_str()
        .unwrap()
        .replace(std_dir, &meta.display().to_string())
        .replace("exec /usr/bin/virt-launcher", "echo virt-launcher");
    let out = std::process::Command::new("sh").arg("-c").arg(&script).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "passing through PCI device 0000:af:00.0\nvirt-launcher --hostdev 0000:af:00.0\n");
    // Real drivers may pretty-print the file: the script reads JSON, not lines.
    let file = std::fs::canonicalize(meta.join("resourceclaims/win11-vgpu/pgpu/gpu.nvidia.com-metadata.json")).unwrap();
    let compact = std::fs::read_to_string(&file).unwrap();
    let pretty: String = compact
        .lines()
        .map(|l| serde_json::to_string_pretty(&serde_json::from_str::<Value>(l).unwrap()).unwrap() + "\n")
        .collect();
    assert!(pretty.lines().count() > 20);
    let pretty_dir = env.path("pretty");
    let pretty_file = pretty_dir.join("resourceclaims/win11-vgpu/pgpu/gpu.nvidia.com-metadata.json");
    std::fs::create_dir_all(pretty_file.parent().unwrap()).unwrap();
    std::fs::write(&pretty_file, pretty).unwrap();
    let script = script.replace(&meta.display().to_string(), &pretty_dir.display().to_string());
    let out = std::process::Command::new("sh").arg("-c").arg(&script).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "passing through PCI device 0000:af:00.0\nvirt-launcher --hostdev 0000:af:00.0\n");
}

#[test]
fn exec_wrapper_example() {
    let docs = manifest("examples/gpu-exec-wrapper");
    let spec = pod_spec(&docs);
    let inits = spec["initContainers"].as_array().unwrap();
    let (_api, env) = example("ml", "trainer-0", "examples/offline/gpu-training.yaml");
    let shared = env.path("shared");
    let dra = env.path("dra");
    let dirs: [(&str, &Path); 2] = [("/shared", &shared), ("/dra", &dra)];
    // Both init containers, in order, then the app's entrypoint with the app replaced by `env`.
    for init in inits {
        let args = remap(&init["args"], &dirs);
        let out = env.run(&as_strs(&args), LIMIT);
        assert!(out.status.success(), "{}: {}", init["name"], stderr(&out));
    }
    let command = remap(&spec["containers"][0]["command"], &dirs);
    assert_eq!(command[0], format!("{}/drafs", shared.display()));
    let sep = command.iter().position(|a| a == "--").unwrap();
    let mut argv: Vec<&str> = as_strs(&command[..=sep]);
    argv.push("env");
    let out = std::process::Command::new(argv[0]).args(&argv[1..]).env_clear().output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let vars = stdout(&out);
    assert!(vars.lines().any(|l| l == "GPU_UUID=GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b"), "{vars}");
    assert!(vars.lines().any(|l| l == "GPU_PCI_BUS_ID=0000:5e:00.0"), "{vars}");
    assert!(vars.lines().any(|l| l == "GPU_UUIDS=GPU-9e8d7c6b-5a4f-4e3d-2c1b-0a9f8e7d6c5b"), "{vars}");
}

/// The example directories (everything in examples/ but the offline inputs).
fn example_dirs() -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(repo_path("examples"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir() && e.file_name() != "offline")
        .map(|e| format!("examples/{}", e.file_name().to_string_lossy()))
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn every_example_directory_applies_on_its_own() {
    let dirs = example_dirs();
    assert!(dirs.len() >= 5, "{dirs:?}");
    for dir in dirs {
        let docs = manifest(&dir);
        // The namespace first, and everything in it.
        let Some(ns) = docs.iter().find(|d| d["kind"] == "Namespace").and_then(|d| d["metadata"]["name"].as_str())
        else {
            continue; // examples that need an operator's own objects (the VMI) say so themselves
        };
        assert_eq!(docs[0]["kind"], "Namespace", "{dir}: the Namespace must be applied first");
        for doc in &docs[1..] {
            let cluster_scoped = matches!(doc["kind"].as_str(), Some("ClusterRole" | "ClusterRoleBinding"));
            if !cluster_scoped {
                assert_eq!(doc["metadata"]["namespace"], ns, "{dir}: {} {}", doc["kind"], doc["metadata"]["name"]);
            }
        }
        // The RBAC is exactly what `drafs manifests rbac` prints for that namespace.
        let rbac = read(&format!("{dir}/10-rbac.yaml"));
        let out = std::process::Command::new(drafs_bin())
            .args(["manifests", "rbac", "--namespace", ns, "--events"])
            .output()
            .unwrap();
        assert_eq!(
            rbac,
            format!("# drafs manifests rbac --namespace {ns} --events\n{}", stdout(&out)),
            "{dir}: regenerate 10-rbac.yaml"
        );
        // Every claim the pods use is defined here, and only drafs gets a token.
        for pod in docs.iter().filter(|d| d["kind"] == "Pod") {
            let spec = &pod["spec"];
            for claim in spec["resourceClaims"].as_array().into_iter().flatten() {
                let (kind, name) = match claim.get("resourceClaimTemplateName") {
                    Some(t) => ("ResourceClaimTemplate", t),
                    None => ("ResourceClaim", &claim["resourceClaimName"]),
                };
                assert!(
                    docs.iter().any(|d| d["kind"] == kind && d["metadata"]["name"] == *name),
                    "{dir}: no {kind} {name}"
                );
            }
            assert_eq!(spec["automountServiceAccountToken"], false, "{dir}: the token would go to every container");
            for c in
                ["initContainers", "containers"].iter().flat_map(|k| spec[*k].as_array().cloned().unwrap_or_default())
            {
                let has_token = c["volumeMounts"].as_array().into_iter().flatten().any(|m| m["name"] == "drafs-token");
                assert_eq!(has_token, c["name"] == "drafs", "{dir}: container {}", c["name"]);
            }
        }
    }
}
