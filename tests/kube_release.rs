//! The chart as a release publishes it, from an OCI registry, signed: a
//! registry (CNCF Distribution, built with cosign by `tests/go/build.sh
//! release`) on 127.0.0.1, the chart of `release/chart.sh` pushed with
//! `helm push`, signed with cosign and a key made for the test, verified
//! against that key and refused against another, then installed with `helm
//! install oci://…` into the kube tier's real API server; a chart pushed over
//! the signed one is refused. (`tests/release.sh`, which `.ci/run` runs, does
//! the same for the whole release: the image index, attestations, SHA256SUMS,
//! `release/verify.sh` and each tampering.)

use drafs_test_support as support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::controlplane::{self, ControlPlane};
use support::*;

/// A registry on 127.0.0.1, on the port it chose; stopped when dropped.
struct Registry {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Registry {
    fn start(bin: &Path) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.yml");
        let log = dir.path().join("registry.log");
        std::fs::create_dir(dir.path().join("storage")).unwrap();
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog: {{level: info, formatter: text, accesslog: {{disabled: true}}}}\n\
                 storage: {{filesystem: {{rootdirectory: {}}}}}\nhttp: {{addr: \"127.0.0.1:0\"}}\n",
                dir.path().join("storage").display()
            ),
        )
        .unwrap();
        let mut child = Command::new(bin)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("the registry starts");
        let listening = |text: &str| {
            text.split("listening on 127.0.0.1:")
                .nth(1)
                .map(|rest| rest.chars().take_while(char::is_ascii_digit).collect::<String>())
        };
        let mut port = None;
        let up = wait_for(Duration::from_secs(60), || {
            port = listening(&std::fs::read_to_string(&log).unwrap_or_default());
            port.is_some() || child.try_wait().unwrap().is_some()
        });
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let Some(port) = port.filter(|_| up) else {
            let _ = child.kill();
            panic!("the registry did not listen within 60 s: {text}");
        };
        Registry { child, addr: format!("127.0.0.1:{port}"), _dir: dir }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// cosign, its TUF metadata and registry credentials in `dir` (nothing read
/// from or written to the caller's home).
fn cosign(tools: &Path, dir: &Path, args: &[&str]) -> Output {
    Command::new(tools.join("cosign"))
        .args(args)
        .current_dir(dir)
        .env("COSIGN_PASSWORD", "test")
        .env("TUF_ROOT", dir.join("sigstore"))
        .env("DOCKER_CONFIG", dir.join("docker"))
        .stdin(Stdio::null())
        .output()
        .expect("cosign runs")
}

fn helm_ok(cp: &ControlPlane, args: &[&str]) -> String {
    let out = helm::run(cp, args);
    assert!(out.status.success(), "helm {args:?}: {}", stderr(&out));
    format!("{}{}", stdout(&out), stderr(&out))
}

/// `helm push` prints the manifest's digest.
fn pushed_digest(text: &str) -> String {
    let digest = text.lines().find_map(|l| l.strip_prefix("Digest: ")).unwrap_or_else(|| panic!("no digest in {text}"));
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{digest}");
    digest.to_string()
}

/// The chart as release/chart.sh packages it for the registry `addr`.
fn chart(dir: &Path, addr: &str) -> PathBuf {
    let out = Command::new(repo_path("release/chart.sh"))
        .arg(dir)
        .env("DRAFS_REGISTRY", addr)
        .env("HELM", helm::binary())
        .output()
        .unwrap();
    assert!(out.status.success(), "release/chart.sh: {}", stderr(&out));
    PathBuf::from(stdout(&out).trim())
}

#[test]
fn the_signed_chart_installs_from_an_oci_registry_and_a_chart_pushed_over_it_is_refused() {
    let Some(cp) = controlplane::private() else { return };
    let tools = controlplane::cached_build(&["tests/go/build.sh", "release"])
        .unwrap_or_else(|e| panic!("cosign and the registry could not be built: {e}"));
    let registry = Registry::start(&tools.join("registry"));
    let addr = registry.addr.as_str();
    let version = env!("CARGO_PKG_VERSION");
    let scratch = tempfile::tempdir().unwrap();
    let s = scratch.path();

    // Published: the chart pushed, signed with the test's key.
    let archive = chart(&s.join("chart"), addr);
    let pushed = helm_ok(&cp, &["push", archive.to_str().unwrap(), &format!("oci://{addr}/charts"), "--plain-http"]);
    let digest = pushed_digest(&pushed);
    let signed = format!("{addr}/charts/drafs@{digest}");
    let by_tag = format!("{addr}/charts/drafs:{version}");
    std::fs::create_dir(s.join("other")).unwrap();
    for dir in [s.to_path_buf(), s.join("other")] {
        let out = cosign(&tools, &dir, &["generate-key-pair"]);
        assert!(out.status.success(), "cosign generate-key-pair: {}", stderr(&out));
    }
    let http = ["--allow-http-registry=true", "--allow-insecure-registry=true"];
    let mut sign = vec!["sign", "--yes", "--key", "cosign.key", "--tlog-upload=false", "--use-signing-config=false"];
    sign.extend(http);
    sign.push(&signed);
    let out = cosign(&tools, s, &sign);
    assert!(out.status.success(), "cosign sign: {}", stderr(&out));

    // Verified against the key, refused against another.
    let verify = |key: &str, reference: &str| {
        let mut args = vec!["verify", "--key", key, "--insecure-ignore-tlog=true"];
        args.extend(http);
        args.push(reference);
        cosign(&tools, s, &args)
    };
    let out = verify("cosign.pub", &by_tag);
    assert!(out.status.success(), "cosign verify --key: {}", stderr(&out));
    let payloads: Vec<Value> = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(
        payloads.iter().all(|p| p["critical"]["image"]["docker-manifest-digest"] == digest.as_str()),
        "{payloads:?}"
    );
    let out = verify("other/cosign.pub", &by_tag);
    assert!(!out.status.success(), "verified against another key: {}", stdout(&out));

    // Installed from the registry into the real API server: the webhook runs
    // the image the release names, and injects it.
    cp.ensure(&json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "drafs-system", "labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
    }));
    let installed = helm_ok(
        &cp,
        &[
            "install",
            "drafs",
            &format!("oci://{addr}/charts/drafs"),
            "--version",
            version,
            "--plain-http",
            "--namespace",
            "drafs-system",
        ],
    );
    assert!(installed.contains(&digest), "helm install named another digest than the signed one: {installed}");
    let deployment = cp
        .get(&json!({"apiVersion": "apps/v1", "kind": "Deployment",
                     "metadata": {"name": "drafs-webhook", "namespace": "drafs-system"}}))
        .expect("the chart's Deployment");
    let image = format!("{addr}/drafs:{version}");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], image.as_str());
    assert!(container["env"].as_array().unwrap().iter().any(|e| e["value"] == image.as_str()), "{container}");
    helm_ok(&cp, &["uninstall", "drafs", "--namespace", "drafs-system", "--wait"]);

    // Another chart pushed over the same version (its image elsewhere): the
    // tag now names a manifest no one signed.
    let unpacked = s.join("tampered");
    std::fs::create_dir(&unpacked).unwrap();
    let status = Command::new("tar").arg("-xzf").arg(&archive).arg("-C").arg(&unpacked).status().unwrap();
    assert!(status.success());
    let values = unpacked.join("drafs/values.yaml");
    let text = std::fs::read_to_string(&values).unwrap();
    let ours = format!("  repository: {addr}/drafs\n");
    assert!(text.contains(&ours), "{text}");
    std::fs::write(&values, text.replace(&ours, "  repository: evil.example/drafs\n")).unwrap();
    helm_ok(&cp, &["package", unpacked.join("drafs").to_str().unwrap(), "--destination", unpacked.to_str().unwrap()]);
    let tampered = unpacked.join(format!("drafs-{version}.tgz"));
    let pushed = helm_ok(&cp, &["push", tampered.to_str().unwrap(), &format!("oci://{addr}/charts"), "--plain-http"]);
    assert_ne!(pushed_digest(&pushed), digest);
    let out = verify("cosign.pub", &by_tag);
    assert!(!out.status.success(), "the chart pushed over the signed one verified: {}", stdout(&out));
    let out = verify("cosign.pub", &signed);
    assert!(out.status.success(), "the signed chart, by its digest, no longer verifies: {}", stderr(&out));
}
