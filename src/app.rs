//! The commands: wiring of source, resolver, tree and outputs.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use std::os::unix::process::CommandExt;

use crate::cli::{
    Backend, CopySelfArgs, ExecArgs, GetArgs, Global, InitArgs, InjectArgs, Output, OutputArgs, ProbeArgs, SelectArgs,
    ServeArgs,
};
use crate::envvars;
use crate::events::{self, Events, Note};
use crate::files::AtomicDir;
use crate::fuse::FuseMount;
use crate::inject;
use crate::metadata::{self, Generations};
use crate::metrics::{self, Metrics};
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
    let snapshot =
        objects.into_snapshot(&shown, global.pod_name.as_deref()).map_err(|e| Failure::Failed(e.to_string()))?;
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
    let name =
        global.pod_name.clone().or_else(|| std::env::var("HOSTNAME").ok()).filter(|n| !n.is_empty()).ok_or_else(
            || {
                Failure::Usage(
                    "cannot tell which pod to read: set POD_NAME (downward API metadata.name) or --pod-name".into(),
                )
            },
        )?;
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

/// Where the tree goes: files swapped atomically, or a FUSE mount.
enum TreeOutput {
    Files(AtomicDir),
    Fuse(FuseMount),
}

/// Publishes each new tree and, when asked, the metadata view.
struct Publisher {
    tree: TreeOutput,
    metadata: Option<(AtomicDir, Generations)>,
}

impl Publisher {
    fn new(tree: TreeOutput, args: &OutputArgs) -> Self {
        Publisher { tree, metadata: args.metadata_dir.as_ref().map(|d| (AtomicDir::new(d), Generations::default())) }
    }

    fn publish(&mut self, res: &Resolution, built: &BuiltTree) -> Result<(), String> {
        if let Some((dir, generations)) = &mut self.metadata {
            let mut warnings = Vec::new();
            let view = metadata::build(res, generations, &mut warnings);
            for w in warnings {
                warn!("{w}");
            }
            dir.write(&view).map_err(|e| format!("metadata view: {e}"))?;
        }
        match &mut self.tree {
            TreeOutput::Files(dir) => {
                dir.write(&built.tree).map_err(|e| e.to_string())?;
            }
            TreeOutput::Fuse(mount) => mount.update(&built.tree),
        }
        Ok(())
    }
}

fn deadline(timeout: Duration) -> Option<Instant> {
    (!timeout.is_zero()).then(|| Instant::now() + timeout)
}

/// Metrics for a run; serves them when `--metrics-addr` is set.
async fn start_metrics(out: &OutputArgs) -> Result<Arc<Metrics>, Failure> {
    let m = Arc::new(Metrics::default());
    if let Some(addr) = out.metrics_addr {
        let listener = metrics::bind(addr).await.map_err(|e| Failure::Usage(format!("--metrics-addr {addr}: {e}")))?;
        tokio::spawn(metrics::serve(listener, m.clone()));
    }
    Ok(m)
}

pub async fn init(global: &Global, args: &InitArgs) -> Result<(), Failure> {
    logged(&args.output, init_inner(global, args).await)
}

/// A failure's message also goes to the termination log, for `kubectl describe pod`.
fn logged(out: &OutputArgs, result: Result<(), Failure>) -> Result<(), Failure> {
    if let Err(Failure::Failed(message)) = &result {
        write_termination_log(&out.termination_log, message);
    }
    result
}

async fn init_inner(global: &Global, args: &InitArgs) -> Result<(), Failure> {
    let sel = selection(&args.select);
    let out = &args.output;
    let metrics = start_metrics(out).await?;
    let mut publisher = Publisher::new(TreeOutput::Files(AtomicDir::new(&out.dir)), out);
    if let Some(path) = &global.from_file {
        let res = resolve_file(global, path, &sel)?;
        let built = tree::build(&res, &out.require);
        if !built.is_ready() {
            return Err(Failure::Failed(format!("not ready: {}", built.missing.join("; "))));
        }
        publisher.publish(&res, &built).map_err(Failure::Failed)?;
        info!(dir = %out.dir.display(), files = built.tree.len(), "tree written");
        return Ok(());
    }
    let (client, pod) = client_and_pod(global).await?;
    info!(pod = %format!("{}/{}", pod.namespace, pod.name), "resolving");
    let events = Events::start(client.clone(), pod.clone(), out.events);
    let started = Instant::now();
    let mut engine = Engine::new(client, pod, sel).with_metrics(Some(metrics.clone()));
    let mut missing: Vec<String> = Vec::new();
    let mut summary = String::new();
    let result = engine
        .run(deadline(args.select.timeout), false, |res| {
            let built = tree::build(res, &out.require);
            if !built.is_ready() {
                metrics.tree_published(false, built.tree.len(), &built.missing);
                if built.missing != missing {
                    info!("waiting for: {}", built.missing.join("; "));
                    missing = built.missing;
                }
                return Ok(Flow::Continue);
            }
            publisher.publish(res, &built).map_err(EngineError::Output)?;
            metrics.tree_published(true, built.tree.len(), &[]);
            let elapsed_ms = started.elapsed().as_millis() as u64;
            info!(dir = %out.dir.display(), files = built.tree.len(), elapsed_ms, "tree written, ready");
            summary = ready_summary(res, elapsed_ms);
            Ok(Flow::Stop)
        })
        .await;
    let uid = engine.pod_uid();
    let outcome = match result {
        Ok(_) => {
            events.record(Note { warning: false, reason: events::READY, message: summary, uid });
            Ok(())
        }
        Err(e) => {
            let failure = engine_failure(e, args.select.timeout, &missing);
            events.record(Note { warning: true, reason: events::NOT_READY, message: failure.to_string(), uid });
            Err(failure)
        }
    };
    events.finish().await;
    outcome
}

/// "2 devices of 1 claim ready after 12 ms".
fn ready_summary(res: &Resolution, elapsed_ms: u64) -> String {
    let devices: usize = res.claims.iter().map(|c| c.devices.len()).sum();
    let plural = |n: usize, word: &str| if n == 1 { format!("{n} {word}") } else { format!("{n} {word}s") };
    format!("{} of {} ready after {elapsed_ms} ms", plural(devices, "device"), plural(res.claims.len(), "claim"))
}

/// Serve until stopped; fails only if not ready by the deadline (or at start-up).
pub async fn serve(global: &Global, args: &ServeArgs) -> Result<(), Failure> {
    logged(&args.output, serve_inner(global, args).await)
}

async fn serve_inner(global: &Global, args: &ServeArgs) -> Result<(), Failure> {
    let sel = selection(&args.select);
    let out = &args.output;
    let metrics = start_metrics(out).await?;
    let tree_output = match args.backend {
        Backend::Fuse => TreeOutput::Fuse(
            FuseMount::mount(&out.dir, Some(metrics.clone())).map_err(|e| Failure::Failed(e.to_string()))?,
        ),
        Backend::Files => TreeOutput::Files(AtomicDir::new(&out.dir)),
    };
    let mut publisher = Publisher::new(tree_output, out);
    if let Some(path) = &global.from_file {
        let res = resolve_file(global, path, &sel)?;
        let built = tree::build(&res, &out.require);
        publisher.publish(&res, &built).map_err(Failure::Failed)?;
        metrics.tree_published(built.is_ready(), built.tree.len(), &built.missing);
        if !built.is_ready() {
            warn!("not ready: {}", built.missing.join("; "));
        }
        info!(dir = %out.dir.display(), files = built.tree.len(), ready = built.is_ready(), "serving a file's resolution until stopped");
        return std::future::pending().await;
    }
    let (client, pod) = client_and_pod(global).await?;
    info!(pod = %format!("{}/{}", pod.namespace, pod.name), backend = ?args.backend, "resolving");
    let events = Events::start(client.clone(), pod.clone(), out.events);
    let started = Instant::now();
    let mut engine = Engine::new(client, pod, sel).with_metrics(Some(metrics.clone()));
    let mut missing: Vec<String> = Vec::new();
    let mut was_ready = false;
    let mut updates: u64 = 0;
    let mut uid: Option<String> = None;
    let result = engine
        .run(deadline(args.select.timeout), false, |res| {
            let built = tree::build(res, &out.require);
            publisher.publish(res, &built).map_err(EngineError::Output)?;
            metrics.tree_published(built.is_ready(), built.tree.len(), &built.missing);
            updates += 1;
            uid = Some(res.pod.uid.clone()).filter(|u| !u.is_empty());
            let elapsed_ms = started.elapsed().as_millis() as u64;
            match (was_ready, built.is_ready()) {
                (false, true) => {
                    info!(files = built.tree.len(), elapsed_ms, "ready");
                    let message = ready_summary(res, elapsed_ms);
                    events.record(Note { warning: false, reason: events::READY, message, uid: uid.clone() });
                }
                (true, false) => {
                    let message = format!("no longer ready, values removed: {}", built.missing.join("; "));
                    warn!("{message}");
                    events.record(Note { warning: true, reason: events::NOT_READY, message, uid: uid.clone() });
                }
                (true, true) => info!(files = built.tree.len(), updates, "tree updated"),
                (false, false) if built.missing != missing => info!("waiting for: {}", built.missing.join("; ")),
                (false, false) => {}
            }
            was_ready = built.is_ready();
            missing = built.missing;
            Ok(if was_ready { Flow::Ready } else { Flow::Continue })
        })
        .await;
    // The engine only returns with an error (serve has no end but a signal).
    let failure = match result {
        Ok(_) => return Ok(()),
        Err(e) => engine_failure(e, args.select.timeout, &missing),
    };
    let uid = uid.or_else(|| engine.pod_uid());
    events.record(Note { warning: true, reason: events::NOT_READY, message: failure.to_string(), uid });
    events.finish().await;
    Err(failure)
}

/// `probe`: one line on stdout, exit 0 when ready.
pub fn probe(args: &ProbeArgs) -> Result<(), Failure> {
    let dir = &args.dir;
    if crate::fuse::is_stale_mount(dir) {
        return Err(Failure::Failed(format!("{} is a stale FUSE mount (its server is gone)", dir.display())));
    }
    if dir.join(".ready").exists() {
        println!("ready");
        return Ok(());
    }
    let reason = match std::fs::read(dir.join(".json")) {
        Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| {
                v["missing"].as_array().map(|m| m.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join("; "))
            })
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "resolution incomplete".into()),
        Err(_) => format!("no tree at {} yet (not mounted or not written)", dir.display()),
    };
    Err(Failure::Failed(format!("not ready: {reason}")))
}

fn write_termination_log(path: &Path, message: &str) {
    let file = std::fs::OpenOptions::new().write(true).truncate(true).open(path);
    match file.and_then(|mut f| f.write_all(message.as_bytes())) {
        Ok(()) => {}
        Err(e) => tracing::debug!(path = %path.display(), "termination log not written: {e}"),
    }
}

/// Resolve once, from the file or the API, without waiting for what is missing.
async fn resolve_once(global: &Global, select: &SelectArgs) -> Result<Resolution, Failure> {
    let sel = selection(select);
    match &global.from_file {
        Some(path) => resolve_file(global, path, &sel),
        None => {
            let (client, pod) = client_and_pod(global).await?;
            let mut engine = Engine::new(client, pod, sel);
            engine
                .run(deadline(select.timeout), true, |_| Ok(Flow::Continue))
                .await
                .map_err(|e| engine_failure(e, select.timeout, &[]))
        }
    }
}

pub async fn get(global: &Global, args: &GetArgs) -> Result<(), Failure> {
    let res = resolve_once(global, &args.select).await?;
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
    if built.is_ready() { Ok(()) } else { Err(Failure::Failed(format!("incomplete: {}", built.missing.join("; ")))) }
}

/// `exec`: set the variables and replace this process with the command.
pub async fn exec(global: &Global, args: &ExecArgs) -> Result<(), Failure> {
    let vars = match &args.from_dir {
        Some(dir) => envvars::values(&args.env, &envvars::DirSource(dir.clone()), args.optional),
        None => {
            let res = resolve_once(global, &args.select).await?;
            envvars::values(&args.env, &tree::build(&res, &[]).tree, args.optional)
        }
    }
    .map_err(|e| Failure::Failed(e.to_string()))?;
    let (program, rest) =
        args.command.split_first().ok_or_else(|| Failure::Usage("no command given after --".into()))?;
    for (name, value) in &vars {
        info!(%name, %value, "setting");
    }
    let err = std::process::Command::new(program).args(rest).envs(vars).exec();
    Err(Failure::Failed(format!("cannot run {program}: {err}")))
}

/// `inject`: stdin to stdout.
pub fn inject(args: &InjectArgs) -> Result<(), Failure> {
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
        .map_err(|e| Failure::Failed(format!("cannot read stdin: {e}")))?;
    let opts = inject::Options { mode: args.mode, image: args.image.clone(), dir: args.dir.clone() };
    let (out, outcomes) = inject::inject(&text, &opts).map_err(|e| Failure::Failed(e.to_string()))?;
    for outcome in outcomes {
        match outcome {
            inject::Outcome::Injected(what) => info!("{what}: drafs added"),
            inject::Outcome::AlreadyInjected(what) => info!("{what}: already has drafs, unchanged"),
            inject::Outcome::NoClaims(what) => warn!("{what}: no resourceClaims, unchanged"),
            inject::Outcome::NotAWorkload(_) => {}
        }
    }
    std::io::stdout().write_all(out.as_bytes()).map_err(|e| Failure::Failed(format!("cannot write stdout: {e}")))
}

/// `copy-self`: install this binary as DIR/drafs (atomically, mode 0755).
pub fn copy_self(args: &CopySelfArgs) -> Result<(), Failure> {
    let failed = |what: &str, e: std::io::Error| Failure::Failed(format!("copy-self: cannot {what}: {e}"));
    let me = std::env::current_exe().map_err(|e| failed("find this binary", e))?;
    std::fs::create_dir_all(&args.to).map_err(|e| failed(&format!("create {}", args.to.display()), e))?;
    let tmp = args.to.join(".drafs.tmp");
    let dest = args.to.join("drafs");
    std::fs::copy(&me, &tmp).map_err(|e| failed(&format!("write {}", tmp.display()), e))?;
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(|e| failed(&format!("chmod {}", tmp.display()), e))?;
    std::fs::rename(&tmp, &dest).map_err(|e| failed(&format!("rename to {}", dest.display()), e))?;
    info!(to = %dest.display(), "copied");
    Ok(())
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
    let mut rows =
        vec![["CLAIM", "REQUEST", "INDEX", "DRIVER", "DEVICE", "ATTRIBUTE", "VALUE"].map(String::from).to_vec()];
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
