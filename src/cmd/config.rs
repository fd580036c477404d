//! The flags several commands share, checked and resolved once, before any
//! I/O: a bad combination is a usage error (exit 2) before anything starts,
//! and the code below `cmd` never sees a flag.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cmd::Failure;
use crate::cmd::cli::{OutputArgs, SelectArgs, SourceArgs};
pub use crate::engine::run::Source;
use crate::engine::run::{OutputSettings, TreeBackend};
use crate::model::resolve::Selection;

const SA_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Where the pod's objects come from: `--from-file`, or the API server and
/// which pod (`--pod-name` or `POD_NAME`, else `HOSTNAME`; the namespace from
/// `--pod-namespace`, else the service account's).
pub fn source(args: &SourceArgs) -> Result<Source, Failure> {
    if let Some(path) = &args.from_file {
        return Ok(Source::File { path: path.clone(), pod_name: args.pod_name.clone() });
    }
    let pod_name =
        args.pod_name.clone().or_else(|| std::env::var("HOSTNAME").ok()).filter(|n| !n.is_empty()).ok_or_else(
            || {
                Failure::Usage(
                    "cannot tell which pod to read: set POD_NAME (downward API metadata.name) or --pod-name".into(),
                )
            },
        )?;
    let namespace = args
        .pod_namespace
        .clone()
        .or_else(|| std::fs::read_to_string(SA_NAMESPACE_FILE).ok().map(|s| s.trim().to_string()));
    Ok(Source::Api { pod_name, namespace })
}

/// What to resolve and how long to wait for it.
#[derive(Debug, Clone)]
pub struct Select {
    pub selection: Selection,
    /// Zero: no limit.
    pub timeout: Duration,
}

impl Select {
    pub fn from_args(args: &SelectArgs) -> Self {
        Select { selection: Selection { claims: args.claims.clone() }, timeout: args.timeout }
    }
}

/// Where and how `init` and `serve` publish, and where a failure is told.
#[derive(Debug, Clone)]
pub struct Output {
    pub publishing: OutputSettings,
    pub termination_log: PathBuf,
}

impl Output {
    pub fn from_args(args: &OutputArgs, backend: TreeBackend) -> Result<Self, Failure> {
        check_output_dirs(&args.dir, args.metadata_dir.as_deref())?;
        let publishing = OutputSettings {
            backend,
            dir: args.dir.clone(),
            metadata_dir: args.metadata_dir.clone(),
            metadata_from_drivers: args.metadata_from_drivers.clone(),
            require: args.require.clone(),
            metrics_addr: args.metrics_addr,
            events: args.events.into(),
            turns: None,
            pool_grace: args.pool_grace,
            containers: Vec::new(),
        };
        Ok(Output { publishing, termination_log: args.termination_log.clone() })
    }
}

/// `--dir` and `--metadata-dir` must not hold one another: each writer owns its
/// directory's top-level names, so one would hide or refuse the other's files.
fn check_output_dirs(dir: &Path, meta: Option<&Path>) -> Result<(), Failure> {
    let Some(meta) = meta else { return Ok(()) };
    let (a, b) = (real_path(dir), real_path(meta));
    if a.starts_with(&b) || b.starts_with(&a) {
        return Err(Failure::Usage(format!(
            "--metadata-dir {} overlaps --dir {}: the standard view and the tree each need a directory of their own",
            meta.display(),
            dir.display()
        )));
    }
    Ok(())
}

/// `path` made absolute with `.`, `..` and symlinks resolved as far as it exists.
fn real_path(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = if path.is_absolute() { PathBuf::new() } else { std::env::current_dir().unwrap_or_default() };
    for part in path.components() {
        match part {
            Component::Prefix(_) | Component::CurDir => {}
            Component::RootDir => out.push("/"),
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => {
                out.push(name);
                if let Ok(real) = std::fs::canonicalize(&out) {
                    out = real;
                }
            }
        }
    }
    out
}
