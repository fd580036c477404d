//! `drafs get` against the test API server and from a file, run as the real
//! binary: the table and JSON it prints, what it says when resolution is
//! incomplete, and what it escapes for a terminal.

use drafs_test_support as support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

/// A safety net only: every run normally ends by itself long before.
const LIMIT: Duration = Duration::from_secs(90);

#[test]
fn get_prints_table_and_json_from_the_api() {
    let (_api, env) = example("hpc", "allreduce-worker-3", "examples/offline/rdma-network.yaml");
    let out = env.run(&["get"], LIMIT);
    assert_ok(&out);
    let table = stdout(&out);
    let header = table.lines().next().unwrap();
    assert!(header.starts_with("CLAIM") && header.contains("ATTRIBUTE") && header.contains("VALUE"), "{table}");
    let row = table.lines().find(|l| l.contains(".status/interfaceName") && l.contains("net2")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells, vec!["nics", "rdma", "1", "dra.net", "pci-0000-41-00-0", ".status/interfaceName", "net2"]);

    let out = env.run(&["get", "-o", "json"], LIMIT);
    assert_ok(&out);
    let whole: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(whole["ready"], true);
    assert_eq!(whole["claims"][0]["devices"][1]["status"]["interfaceName"], "net2");
}

#[test]
fn get_reports_incomplete_resolution() {
    let api = api_for("ml");
    api.apply(pod("ml", "p", "n1", &[("gpu", Ok("c"))], &[]));
    api.apply(claim("ml", "c", None));
    let env = Env::new(&api, "ml", "p", TOKEN);
    let out = env.run(&["get", "--timeout", "30s"], LIMIT);
    let err = assert_failed(&out);
    assert!(err.contains("ResourceClaim c is not allocated yet"), "{err}");
}

#[test]
fn from_file_needs_no_cluster() {
    let env_dir = tempfile::tempdir().unwrap();
    let dir = env_dir.path().join("dra");
    let run = |args: &[&str]| {
        let child = std::process::Command::new(drafs_bin())
            .args(args)
            .env_clear()
            .env("HOME", env_dir.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_output(child, LIMIT)
    };
    let example = repo_path("examples/offline/vm-passthrough.yaml");
    let out = run(&["init", "--from-file", example.to_str().unwrap(), "--dir", dir.to_str().unwrap()]);
    assert_ok(&out);
    assert_eq!(read_tree(&dir)["passthrough/pgpu/0/resource.kubernetes.io/pciBusID"], "0000:af:00.0");

    let out = run(&["get", "--from-file", example.to_str().unwrap(), "-o", "tree"]);
    assert_ok(&out);
    assert!(stdout(&out).lines().any(|l| l == "passthrough/pgpu/0/resource.kubernetes.io/pciBusID  0000:af:00.0"));

    // A file whose device is not published: a clear error at once, nothing written.
    let broken = env_dir.path().join("broken.yaml");
    let text = read("examples/offline/vm-passthrough.yaml").replace("name: gpu-vfio-1", "name: gpu-vfio-9");
    std::fs::write(&broken, text).unwrap();
    let dir2 = env_dir.path().join("dra2");
    let out = run(&[
        "init",
        "--from-file",
        broken.to_str().unwrap(),
        "--dir",
        dir2.to_str().unwrap(),
        "--termination-log",
        "/nonexistent/log",
    ]);
    let err = assert_failed(&out);
    assert!(err.contains("gpu.nvidia.com/metal-12/gpu-vfio-1"), "{err}");
    assert!(!dir2.exists());
}

#[test]
fn get_escapes_control_characters_for_terminals() {
    let api = api_for("ml");
    api.apply(pod("ml", "p", "n1", &[("gpu", Ok("c"))], &[]));
    api.apply(claim("ml", "c", Some(&[("gpu", "gpu.example.com", "n1", "g0")])));
    let hostile = "red\u{1b}[31mALERT\u{1b}[0m\nfake-row\r\u{7}";
    api.apply(slice("s", "gpu.example.com", "n1", 1, Some("n1"), &[("g0", json!({"uuid": {"string": hostile}}))]));
    let env = Env::new(&api, "ml", "p", TOKEN);
    for format in ["table", "tree"] {
        let out = env.run(&["get", "-o", format], LIMIT);
        assert_ok(&out);
        let text = stdout(&out);
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{format}: {text:?}");
        assert!(text.contains("red\\u{1b}[31mALERT\\u{1b}[0m\\nfake-row\\r\\u{7}"), "{format}: {text}");
        assert!(!text.lines().any(|l| l.starts_with("fake-row")), "{format}: a value cannot start a line");
    }
    // The file itself holds the exact value.
    let dir = env.path("dra");
    assert_ok(&env.init(&[]));
    assert_eq!(std::fs::read_to_string(dir.join("gpu/gpu/0/uuid")).unwrap(), hostile);
}
