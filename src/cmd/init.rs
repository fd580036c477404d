//! `drafs init`: resolve, write the tree, exit 0 once everything asked for is
//! there (an init container); a failure also goes to the termination log.

use crate::cmd::cli::InitArgs;
use crate::cmd::config::{self, Output, Select, Source};
use crate::cmd::{Failure, Stop, fail_on, logged, run_failure};
use crate::engine::reconcile::Mode;
use crate::engine::run::{Run, TreeBackend};

#[derive(Debug)]
pub struct Config {
    pub source: Source,
    pub select: Select,
    pub output: Output,
}

impl Config {
    pub fn from_args(args: &InitArgs) -> Result<Self, Failure> {
        let output = Output::from_args(&args.output, TreeBackend::Files)?;
        Ok(Config { source: config::source(&args.source)?, select: Select::from_args(&args.select), output })
    }
}

/// Stopped before it is done, `init` fails (the pod does not start half-ready),
/// and says so in the termination log like any other failure.
pub async fn run(c: Config, stop: Stop) -> Result<(), Failure> {
    logged(&c.output.termination_log, fail_on(stop, write_tree(&c)).await)
}

async fn write_tree(c: &Config) -> Result<(), Failure> {
    let (select, publishing) = (&c.select, &c.output.publishing);
    let mut run = Run::publishing(&c.source, Mode::UntilReady, select.selection.clone(), select.timeout, publishing)
        .await
        .map_err(|e| run_failure(e, select.timeout))?;
    match run.drive().await {
        Ok(_) => {
            run.finish().await;
            Ok(())
        }
        Err(e) => {
            let failure = run_failure(e.into(), select.timeout);
            run.fail(failure.to_string()).await;
            Err(failure)
        }
    }
}
