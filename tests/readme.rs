//! The README's front door runs as written: its commands are the ones CI
//! runs, its quick start prints what it shows, and every file it or docs/
//! names exists.

use drafs_test_support as support;

use support::*;

/// The commands of the README's first `sh` block (comments and blank lines left out).
fn readme_commands() -> Vec<String> {
    let readme = read("README.md");
    let start = readme.find("```sh\n").expect("a sh block") + 6;
    let end = start + readme[start..].find("```").unwrap();
    readme[start..end]
        .lines()
        .map(|l| l.split(" # ").next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

#[test]
fn the_readme_has_two_set_up_commands_a_tree_and_the_ci_test_command() {
    let commands = readme_commands();
    assert_eq!(commands.len(), 4, "{commands:?}");
    assert!(commands[2].starts_with("cargo run -q -- get --from-file examples/"), "{commands:?}");
    let test = &commands[3];
    let ci = read(".ci/run");
    // Exactly the README's command: the suite CI runs is the one a reader runs.
    assert!(ci.lines().any(|l| l.trim() == test), ".ci/run does not run exactly the README's test command {test:?}");
    assert!(test.contains("--no-fail-fast"), "the test command stops at the first failure: {test:?}");
    // The set-up CI does is the README's (nothing installed by hand).
    for setup in &commands[..2] {
        assert!(ci.lines().any(|l| l.trim() == setup), ".ci/run does not run the README's set-up {setup:?}");
    }
}

#[test]
fn the_quick_start_prints_what_the_readme_shows() {
    let commands = readme_commands();
    let args: Vec<&str> = commands[2].strip_prefix("cargo run -q -- ").unwrap().split_whitespace().collect();
    let out = std::process::Command::new(drafs_bin()).args(&args).current_dir(repo_path("")).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let actual: Vec<String> = stdout(&out).lines().map(|l| l.trim_end().to_string()).collect();
    // The console block after the sh block: its lines, in order, with `...` for lines left out.
    let readme = read("README.md");
    let after = &readme[readme.find("```console\n").expect("the quick start's output") + 11..];
    let shown: Vec<&str> = after[..after.find("```").unwrap()].lines().map(str::trim_end).collect();
    assert!(shown.len() > 5, "{shown:?}");
    let mut at = 0;
    let mut skipping = false;
    for line in shown {
        if line == "..." {
            skipping = true;
            continue;
        }
        let found = if skipping {
            actual[at..].iter().position(|a| a == line).map(|i| at + i)
        } else {
            (actual.get(at).map(String::as_str) == Some(line)).then_some(at)
        };
        let Some(i) = found else {
            panic!(
                "README shows {line:?} where the command prints {:?}\nwhole output:\n{}",
                actual.get(at),
                actual.join("\n")
            )
        };
        at = i + 1;
        skipping = false;
    }
    assert_eq!(at, actual.len(), "the README's excerpt must end where the output ends");
}

#[test]
fn every_path_the_docs_name_exists() {
    let mut docs = vec!["README.md".to_string()];
    docs.extend(
        std::fs::read_dir(repo_path("docs"))
            .unwrap()
            .flatten()
            .map(|e| format!("docs/{}", e.file_name().to_string_lossy())),
    );
    let mut checked = 0;
    for doc in docs {
        let text = read(&doc);
        for prefix in ["examples/", "deploy/", "docs/", "image/", "tests/", "benches/", "fuzz/", "src/"] {
            for (i, _) in text.match_indices(prefix) {
                // Only whole paths: preceded by a space, backtick, parenthesis or line start.
                if i > 0 && !matches!(text.as_bytes()[i - 1], b' ' | b'`' | b'(' | b'\n' | b'[') {
                    continue;
                }
                let path: String = text[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-'))
                    .collect();
                let path = path.trim_end_matches('.');
                if path.ends_with('/') && path.matches('/').count() == 1 {
                    continue; // the bare directory prefix itself
                }
                if path.split('/').any(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_uppercase())) {
                    continue; // a placeholder: examples/NAME/
                }
                // Links from docs/ are relative to it.
                let from_docs = doc.starts_with("docs/") && !text[..i].ends_with("](../");
                let exists = repo_path(path).exists() || (from_docs && repo_path(&format!("docs/{path}")).exists());
                assert!(exists, "{doc} names {path}, which does not exist");
                checked += 1;
            }
        }
    }
    assert!(checked > 30, "only {checked} paths checked");
}
