//! Mangled inputs: whatever the objects look like, drafs gives a result or a
//! clear error, never a panic, and never a path outside the tree.

use drafs_test_support as support;

use drafs::model::objects::FileObjects;
use drafs::model::resolve::{Selection, resolve};
use drafs::model::tree::{self, is_clean_relative};
use support::read;

/// A small deterministic generator (no dependency, reproducible failures).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const HOSTILE: &[&str] = &[
    "..",
    "../../etc/passwd",
    "/abs",
    "",
    "a/b/c",
    ".ready",
    "x\u{0}y",
    "{}",
    "[]",
    "-1",
    "99999999999999999999",
    "null",
    "\"\"",
    "{int: x}",
    "{bools: [1, 2]}",
];

/// Replace a value, drop a line, or duplicate a line.
fn mangle(text: &str, rng: &mut Lcg) -> String {
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    for _ in 0..1 + rng.below(4) {
        let i = rng.below(lines.len());
        match rng.below(3) {
            0 => {
                if let Some((key, _)) = lines[i].split_once(": ") {
                    let value = HOSTILE[rng.below(HOSTILE.len())];
                    lines[i] = format!("{key}: {value}");
                }
            }
            1 => {
                lines.remove(i);
            }
            _ => {
                let line = lines[i].clone();
                lines.insert(i, line);
            }
        }
    }
    lines.join("\n")
}

#[test]
fn mangled_objects_never_panic_or_escape() {
    let mut rng = Lcg(0x5eed);
    let mut resolved = 0;
    for file in [
        "examples/offline/gpu-training.yaml",
        "examples/offline/rdma-network.yaml",
        "examples/offline/vm-passthrough.yaml",
        "examples/offline/mig-dynamic.yaml",
    ] {
        let text = read(file);
        for round in 0..300 {
            let input = mangle(&text, &mut rng);
            let outcome = std::panic::catch_unwind(|| {
                let Ok(objects) = FileObjects::parse("mangled", &input) else { return None };
                let Ok(snapshot) = objects.into_snapshot("mangled", None) else { return None };
                let res = resolve(&snapshot, &Selection::default());
                let built = tree::build(&res, &[]);
                Some(built.tree.files().map(|(p, _)| p.to_string()).collect::<Vec<_>>())
            });
            let paths = outcome.unwrap_or_else(|_| panic!("{file} round {round} panicked on:\n{input}"));
            if let Some(paths) = paths {
                resolved += 1;
                for p in paths {
                    assert!(is_clean_relative(&p), "{file} round {round}: path {p:?} from:\n{input}");
                }
            }
        }
    }
    assert!(resolved > 100, "most mangled inputs still parse ({resolved})");
}

#[test]
fn mangled_manifests_never_panic_inject() {
    let mut rng = Lcg(0xfeed);
    let mut opts = drafs::admission::inject::Options::new(drafs::admission::inject::Mode::SidecarFuse, "drafs:test");
    opts.metadata_dir = Some("/var/run/kubernetes.io/dra-device-attributes".into());
    for file in
        ["tests/inject/workloads.yaml", "tests/inject/deployment.yaml", "examples/gpu-sidecar-files/30-pod.yaml"]
    {
        let text = read(file);
        for round in 0..300 {
            let input = mangle(&text, &mut rng);
            let result =
                std::panic::catch_unwind(|| drafs::admission::inject::inject(&input, &opts).map(|(out, _)| out));
            let Ok(result) = result else { panic!("{file} round {round} panicked on:\n{input}") };
            // What parses is written so that it reads back as meant (inject checks
            // it): an input drafs reads is never one it cannot write.
            match &result {
                Err(e @ drafs::admission::inject::InjectError::Write(_)) => {
                    panic!("{file} round {round}: {e}\non:\n{input}")
                }
                Ok(out) => {
                    let again = drafs::admission::inject::inject(out, &opts).map(|(again, _)| again);
                    assert_eq!(again.as_ref().ok(), Some(out), "{file} round {round}: injecting twice differs");
                }
                Err(_) => {}
            }
        }
    }
}
