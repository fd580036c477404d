//! `drafs init`: resolve, write the tree, exit 0 once everything asked for is
//! there (an init container); a failure also goes to the termination log.

use tracing::info;

use crate::cmd::cli::InitArgs;
use crate::cmd::config::{Output, Select, Source};
use crate::cmd::{Failure, Publishing, Stop, fail_on, file_tree, logged, open_dir, publisher, run_failure};
use crate::engine::reconcile::Mode;
use crate::publish::outputs::TreeOutput;

#[derive(Debug)]
pub struct Config {
    pub source: Source,
    pub select: Select,
    pub output: Output,
}

impl Config {
    pub fn from_args(args: &InitArgs) -> Result<Self, Failure> {
        let output = Output::from_args(&args.output)?;
        Ok(Config { source: Source::from_args(&args.source)?, select: Select::from_args(&args.select), output })
    }
}

/// Stopped before it is done, `init` fails (the pod does not start half-ready),
/// and says so in the termination log like any other failure.
pub async fn run(c: Config, stop: Stop) -> Result<(), Failure> {
    logged(&c.output.termination_log, fail_on(stop, write_tree(&c)).await)
}

async fn write_tree(c: &Config) -> Result<(), Failure> {
    let out = &c.output;
    let metrics = crate::cmd::start_metrics(out.metrics_addr).await?;
    let mut publisher = publisher(TreeOutput::Files(open_dir(&out.dir)?), out)?;
    let (pod_name, namespace) = match &c.source {
        Source::File { path, pod_name } => {
            let (res, built) = file_tree(path, pod_name.as_deref(), &c.select, &out.require)?;
            if !built.is_ready() {
                return Err(Failure::Failed(format!("not ready: {}", built.missing.join("; "))));
            }
            publisher.publish(&res, &built).map_err(|e| Failure::Failed(e.to_string()))?;
            info!(dir = %out.dir.display(), files = built.tree.len(), "tree written");
            return Ok(());
        }
        Source::Api { pod_name, namespace } => (pod_name, namespace),
    };
    let mut run =
        Publishing::connect(pod_name, namespace, Mode::UntilReady, None, &c.select, out, publisher, metrics).await?;
    match run.drive(true).await {
        Ok(_) => {
            run.finish().await;
            Ok(())
        }
        Err(e) => Err(run.fail(run_failure(e, c.select.timeout)).await),
    }
}
