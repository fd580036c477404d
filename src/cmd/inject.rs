//! `drafs inject`: add drafs to the workloads of manifests (files,
//! directories or standard input) and print them.

use std::io::Write;
use std::path::{Path, PathBuf};

use tracing::{info, warn};

use crate::admission::inject;
use crate::cmd::Failure;
use crate::cmd::cli::InjectArgs;
use crate::model::tree::require_at_publish;

#[derive(Debug)]
pub struct Config {
    /// What to read; `-` is standard input.
    pub paths: Vec<PathBuf>,
    pub options: inject::Options,
}

impl Config {
    pub fn from_args(args: &InjectArgs) -> Result<Self, Failure> {
        let mut options = inject::Options::new(args.mode.into(), args.image.clone());
        options.dir = args.dir.clone();
        options.require = args.require.clone();
        options.timeout = args.timeout;
        options.csi_driver = args.csi.csi_driver.clone();
        options.resources = args.resources.resources().map_err(Failure::Usage)?;
        options.platform_uid = args.platform_uid;
        if args.ready_when_healthy && inject::Mode::from(args.mode) == inject::Mode::Init {
            return Err(Failure::Usage(
                "--ready-when-healthy needs a sidecar mode (an init container has no readiness)".into(),
            ));
        }
        options.ready_when_healthy = args.ready_when_healthy;
        if options.mode == inject::Mode::Csi {
            // (--metadata-dir is a second volume of drafs node's: the standard view.)
            let resources = &args.resources;
            let flag = [
                (args.timeout.is_some(), "--timeout"),
                (args.ready_when_healthy, "--ready-when-healthy"),
                (resources.cpu_request.is_some(), "--cpu-request"),
                (resources.memory_request.is_some(), "--memory-request"),
                (resources.cpu_limit.is_some(), "--cpu-limit"),
                (resources.memory_limit.is_some(), "--memory-limit"),
            ]
            .into_iter()
            .find_map(|(set, flag)| set.then_some(flag));
            if let Some(flag) = flag {
                return Err(Failure::Usage(format!(
                    "{flag} is for a drafs container; --mode csi adds none (the kubelet waits for the volume, docs/node-mode.md)"
                )));
            }
            // drafs node would refuse every publish of such a volume: the pod would never start.
            require_at_publish(&options.require).map_err(|e| Failure::Usage(format!("--require {e}")))?;
        }
        if let Some(m) = &args.metadata_dir {
            inject::check_metadata_dir(m, &options.dir)
                .map_err(|p| Failure::Usage(format!("--metadata-dir {m:?} {p}")))?;
            options.metadata_dir = Some(m.clone());
        }
        options.metadata_from_drivers = args.metadata_from_drivers.clone();
        let mut paths: Vec<PathBuf> = args.files.iter().chain(&args.filenames).cloned().collect();
        if paths.is_empty() {
            paths.push(PathBuf::from("-"));
        }
        Ok(Config { paths, options })
    }
}

/// `inject`: stdin to stdout.
pub fn run(c: &Config) -> Result<(), Failure> {
    let mut out = String::new();
    for (name, text) in inputs(&c.paths)? {
        let (injected, outcomes) =
            inject::inject(&text, &c.options).map_err(|e| Failure::Failed(format!("{name}: {e}")))?;
        if outcomes.is_empty() {
            return Err(Failure::Usage(format!(
                "{name}: no manifests in it; give files (drafs inject FILE, -f DIR) or YAML on standard input"
            )));
        }
        for outcome in outcomes {
            match outcome {
                inject::Outcome::Injected(what) => info!("{what}: drafs added"),
                inject::Outcome::InjectedKeepingAccount { what, account } => warn!(
                    "{what}: drafs added; the pod keeps its service account {account:?}, which needs drafs's RBAC (drafs manifests rbac --namespace NS --service-account {account}), and its token stays mounted in every container"
                ),
                inject::Outcome::AlreadyInjected(what) => info!("{what}: already has drafs, unchanged"),
                inject::Outcome::NoDevices(what) => {
                    warn!("{what}: no resourceClaims and no extended resources, unchanged")
                }
                inject::Outcome::NotAWorkload(_) => {}
            }
        }
        if !out.is_empty() {
            out.push_str("---\n");
        }
        out.push_str(&injected);
    }
    std::io::stdout().write_all(out.as_bytes()).map_err(|e| Failure::Failed(format!("cannot write stdout: {e}")))
}

/// The manifests `inject` reads, each with the name its messages use.
fn inputs(paths: &[PathBuf]) -> Result<Vec<(String, String)>, Failure> {
    let mut inputs = Vec::new();
    for path in paths.iter().cloned() {
        if path == Path::new("-") {
            if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                eprintln!(
                    "drafs inject: reading manifests from standard input (end with Ctrl-D), or give files: drafs inject FILE|DIR"
                );
            }
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .map_err(|e| Failure::Failed(format!("cannot read standard input: {e}")))?;
            inputs.push(("standard input".to_string(), text));
            continue;
        }
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|e| Failure::Failed(format!("cannot read {}: {e}", p.display())))
        };
        if path.is_dir() {
            let entries = std::fs::read_dir(&path)
                .map_err(|e| Failure::Failed(format!("cannot read directory {}: {e}", path.display())))?;
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml" || x == "json"))
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(Failure::Usage(format!("{}: no .yaml, .yml or .json files in it", path.display())));
            }
            for file in files {
                inputs.push((file.display().to_string(), read(&file)?));
            }
        } else {
            inputs.push((path.display().to_string(), read(&path)?));
        }
    }
    Ok(inputs)
}
