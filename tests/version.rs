//! One version everywhere: the version of Cargo.toml is what `drafs --version`
//! prints, the chart's `version` and `appVersion` (its default image tag), the
//! kustomize image, and every `drafs:X.Y.Z` image the manifests, examples and
//! docs name. A release changes Cargo.toml and this test says what else to change.

use drafs_test_support as support;

use std::path::Path;

use support::*;

fn cargo_version() -> String {
    let text = read("Cargo.toml");
    let line = text.lines().find(|l| l.starts_with("version = ")).expect("Cargo.toml has a version");
    line.trim_start_matches("version = ").trim_matches('"').to_string()
}

/// `key: value` of a YAML file's top level (quotes removed).
fn yaml_field(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.split('#').next().unwrap_or_default().trim().trim_matches('"').to_string())
}

/// Every `drafs:X.Y.Z` image reference under `rel` (a file or a directory), with where it is.
fn image_tags(rel: &str, out: &mut Vec<(String, String)>) {
    let path = repo_path(rel);
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(&path).unwrap().flatten().map(|e| e.path()).collect();
        entries.sort();
        for entry in entries {
            let name = entry.strip_prefix(repo_path("")).unwrap().to_string_lossy().into_owned();
            image_tags(&name, out);
        }
        return;
    }
    let keep = ["md", "yaml", "yml", "tpl", "txt"];
    if !Path::new(rel).extension().is_some_and(|e| keep.iter().any(|k| e == *k)) {
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    for (at, _) in text.match_indices("drafs:") {
        let tag: String = text[at + "drafs:".len()..].chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
        let tag = tag.trim_end_matches('.');
        if tag.split('.').count() == 3 && tag.split('.').all(|p| !p.is_empty()) {
            let line = text[..at].lines().count();
            out.push((format!("{rel}:{line}"), tag.to_string()));
        }
    }
}

#[test]
fn one_version_in_the_binary_the_chart_the_manifests_and_the_docs() {
    let version = cargo_version();
    let chart = read("deploy/helm/drafs/Chart.yaml");
    assert_eq!(yaml_field(&chart, "version").as_deref(), Some(version.as_str()), "Chart.yaml version");
    assert_eq!(yaml_field(&chart, "appVersion").as_deref(), Some(version.as_str()), "Chart.yaml appVersion");
    // The chart's default image tag is its appVersion.
    let values = read("deploy/helm/drafs/values.yaml");
    assert!(values.contains("  tag: \"\""), "values.yaml image.tag must stay empty (the appVersion)");
    let kustomize = read("deploy/webhook/core/kustomization.yaml");
    assert!(kustomize.contains(&format!("  newTag: {version}\n")), "deploy/webhook/core/kustomization.yaml newTag");

    let mut tags = Vec::new();
    for rel in ["README.md", "docs", "examples", "deploy", "image"] {
        image_tags(rel, &mut tags);
    }
    assert!(tags.len() > 10, "the scan found the images: {tags:?}");
    let other: Vec<_> = tags.iter().filter(|(_, tag)| *tag != version).collect();
    assert!(other.is_empty(), "images not at version {version}: {other:?}");

    let out = std::process::Command::new(drafs_bin()).arg("--version").output().unwrap();
    let printed = stdout(&out);
    // Built in a checkout: the commit it was built from (a build without the
    // repository, given no DRAFS_REVISION, prints the version alone).
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success());
    let want = match (std::env::var("DRAFS_REVISION"), head) {
        (Ok(given), _) if given.is_empty() => format!("drafs {version}"),
        (Ok(given), _) => format!("drafs {version} ({given})"),
        (Err(_), Some(head)) => format!("drafs {version} ({})", stdout(&head).trim()),
        (Err(_), None) => format!("drafs {version}"),
    };
    assert_eq!(printed.trim(), want, "drafs --version");
}
