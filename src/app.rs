//! The commands: wiring of source, resolver, tree and outputs.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::cli::{GetArgs, Global, InitArgs, Output, SelectArgs};
use crate::files::AtomicDir;
use crate::metadata::{self, Generations};
use crate::objects::FileObjects;
use crate::resolve::{Resolution, Selection, resolve};
use crate::source::{Engine, EngineError, Flow, PodRef};
use crate::tree::{self, BuiltTree, EntryKind};

/// How a command failed; the exit code follows from it.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Bad flags or environment: exit 2.
    #[error("{0}")]
    Usage(String),
    /// Anything else: exit 1, and for `init` the message goes to the termination log.
    #[error("{0}")]
    Failed(String),
}

impl Failure {
    pub fn exit_code(&self) -> i32 {
        match self {
            Failure::Usage(_) => 2,
            Failure::Failed(_) => 1,
        }
    }
}

const SA_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

fn selection(args: &SelectArgs) -> Selection {
    Selection { claims: args.claims.clone() }
}

/// Resolve from a file: no waiting, the file will not change.
fn resolve_file(global: &Global, path: &Path, sel: &Selection) -> Result<Resolution, Failure> {
    let objects = FileObjects::read(path).map_err(|e| Failure::Failed(e.to_string()))?;
    if !objects.ignored.is_empty() {
        info!(kinds = ?objects.ignored, "ignoring objects of other kinds in {}", path.display());
    }
    let shown = path.display().to_string();
    let snapshot = objects.into_snapshot(&shown, global.pod_name.as_deref()).map_err(|e| Failure::Failed(e.to_string()))?;
    let res = resolve(&snapshot, sel);
    for w in &res.warnings {
        warn!("{w}");
    }
    Ok(res)
}

async fn client_and_pod(global: &Global) -> Result<(kube::Client, PodRef), Failure> {
    let client = kube::Client::try_default().await.map_err(|e| {
        Failure::Usage(format!(
            "cannot find cluster credentials ({e}); run inside a pod with a service account, set KUBECONFIG, or use --from-file"
        ))
    })?;
    let namespace = match &global.pod_namespace {
        Some(ns) => ns.clone(),
        None => std::fs::read_to_string(SA_NAMESPACE_FILE)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| client.default_namespace().to_string()),
    };
    let name = global
        .pod_name
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Failure::Usage("cannot tell which pod to read: set POD_NAME (downward API metadata.name) or --pod-name".into()))?;
    Ok((client, PodRef { namespace, name }))
}

fn engine_failure(e: EngineError, timeout: Duration, missing: &[String]) -> Failure {
    match e {
        EngineError::Timeout { waiting_for } => {
            let mut what: Vec<String> = waiting_for;
            what.extend(missing.iter().cloned());
            if what.is_empty() {
                what.push("no resolution yet".into());
            }
            Failure::Failed(format!("not ready after {}: {}", humanize(timeout), what.join("; ")))
        }
        other => Failure::Failed(other.to_string()),
    }
}

fn humanize(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 => format!("{}ms", d.as_millis()),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Writes the tree and, when asked, the metadata view.
struct Outputs {
    tree: AtomicDir,
    metadata: Option<(AtomicDir, Generations)>,
}

impl Outputs {
    fn write(&mut self, res: &Resolution, built: &BuiltTree) -> Result<(), String> {
        if let Some((dir, generations)) = &mut self.metadata {
            let mut warnings = Vec::new();
            let view = metadata::build(res, generations, &mut warnings);
            for w in warnings {
                warn!("{w}");
            }
            dir.write(&view).map_err(|e| format!("metadata view: {e}"))?;
        }
        self.tree.write(&built.tree).map_err(|e| e.to_string())?;
        Ok(())
    }
}

pub async fn init(global: &Global, args: &InitArgs) -> Result<(), Failure> {
    let result = init_inner(global, args).await;
    if let Err(Failure::Failed(message)) = &result {
        write_termination_log(&args.termination_log, message);
    }
    result
}

async fn init_inner(global: &Global, args: &InitArgs) -> Result<(), Failure> {
    let sel = selection(&args.select);
    let mut outputs = Outputs {
        tree: AtomicDir::new(&args.dir),
        metadata: args.metadata_dir.as_ref().map(|d| (AtomicDir::new(d), Generations::default())),
    };
    if let Some(path) = &global.from_file {
        let res = resolve_file(global, path, &sel)?;
        let built = tree::build(&res, &args.require);
        if !built.is_ready() {
            return Err(Failure::Failed(format!("not ready: {}", built.missing.join("; "))));
        }
        outputs.write(&res, &built).map_err(Failure::Failed)?;
        info!(dir = %args.dir.display(), files = built.tree.len(), "tree written");
        return Ok(());
    }
    let (client, pod) = client_and_pod(global).await?;
    info!(pod = %format!("{}/{}", pod.namespace, pod.name), "resolving");
    let started = Instant::now();
    let deadline = started + args.select.timeout;
    let mut engine = Engine::new(client, pod, sel);
    let mut missing: Vec<String> = Vec::new();
    let result = engine
        .run(Some(deadline), false, |res| {
            let built = tree::build(res, &args.require);
            if !built.is_ready() {
                if built.missing != missing {
                    info!("waiting for: {}", built.missing.join("; "));
                    missing = built.missing;
                }
                return Ok(Flow::Continue);
            }
            outputs.write(res, &built).map_err(EngineError::Output)?;
            info!(dir = %args.dir.display(), files = built.tree.len(), elapsed_ms = started.elapsed().as_millis() as u64, "tree written, ready");
            Ok(Flow::Stop)
        })
        .await;
    result.map(|_| ()).map_err(|e| engine_failure(e, args.select.timeout, &missing))
}

fn write_termination_log(path: &Path, message: &str) {
    let file = std::fs::OpenOptions::new().write(true).truncate(true).open(path);
    match file.and_then(|mut f| f.write_all(message.as_bytes())) {
        Ok(()) => {}
        Err(e) => tracing::debug!(path = %path.display(), "termination log not written: {e}"),
    }
}

pub async fn get(global: &Global, args: &GetArgs) -> Result<(), Failure> {
    let sel = selection(&args.select);
    let res = match &global.from_file {
        Some(path) => resolve_file(global, path, &sel)?,
        None => {
            let (client, pod) = client_and_pod(global).await?;
            let mut engine = Engine::new(client, pod, sel);
            let deadline = Instant::now() + args.select.timeout;
            engine
                .run(Some(deadline), true, |_| Ok(Flow::Continue))
                .await
                .map_err(|e| engine_failure(e, args.select.timeout, &[]))?
        }
    };
    let built = tree::build(&res, &[]);
    let mut out = std::io::stdout().lock();
    let printed = match args.output {
        Output::Json => out.write_all(built.tree.get(".json").unwrap_or_default()).and_then(|_| writeln!(out)),
        Output::Table => out.write_all(table(&res).as_bytes()),
        Output::Tree => out.write_all(tree_listing(&built).as_bytes()),
    };
    match printed {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(Failure::Failed(format!("cannot write to stdout: {e}")));
        }
        _ => {}
    }
    if built.is_ready() {
        Ok(())
    } else {
        Err(Failure::Failed(format!("incomplete: {}", built.missing.join("; "))))
    }
}

/// Every file of the tree and its content; JSON records are summarized.
pub fn tree_listing(built: &BuiltTree) -> String {
    let mut text = String::new();
    for (path, content) in built.tree.files() {
        let shown = if path.ends_with(".json") {
            format!("({} bytes of JSON)", content.len())
        } else {
            String::from_utf8_lossy(content).into_owned()
        };
        text.push_str(&format!("{path}  {shown}\n"));
    }
    text
}

/// One row per attribute, capacity and status value, in aligned columns.
pub fn table(res: &Resolution) -> String {
    let mut rows = vec![["CLAIM", "REQUEST", "INDEX", "DRIVER", "DEVICE", "ATTRIBUTE", "VALUE"].map(String::from).to_vec()];
    for claim in &res.claims {
        for device in &claim.devices {
            for (name, kind, value) in tree::device_entries(device) {
                if matches!(kind, EntryKind::Attribute | EntryKind::Capacity | EntryKind::Status) {
                    rows.push(vec![
                        claim.pod_claim.clone(),
                        device.full_request.clone(),
                        device.index.to_string(),
                        device.driver.clone(),
                        device.device.clone(),
                        name,
                        value,
                    ]);
                }
            }
        }
    }
    let widths: Vec<usize> = (0..7).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut text = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        text.push_str(cells.join("  ").trim_end());
        text.push('\n');
    }
    text
}
