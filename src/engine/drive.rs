//! The drive loop: the reconciler (pure) and the engine (its I/O half) run
//! together, and each step's publication goes to the outputs. Inputs are
//! taken in batches (everything queued at once) while trees are written in the
//! background, and resolved when no write is running, so a burst costs a few
//! resolutions, not one per event.

use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use crate::engine::EngineError;
use crate::engine::reconcile::{Action, Input, Objects, Phase, Reconciler, Step};
use crate::model::resolve::Resolution;
use crate::publish::outputs::{Outputs, PublishError, Written};

/// Why a run ended without a result.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("cannot write the outputs: {0}")]
    Output(#[from] PublishError),
}

/// Where the reconciler's inputs come from: the API server
/// ([`ApiFeed`](crate::engine::source::ApiFeed)) or a
/// file ([`FileFeed`](crate::engine::file::FileFeed)).
pub trait Feed {
    /// Carry out the reconciler's actions (their answers come as inputs).
    fn execute(&mut self, actions: Vec<Action>);
    /// The inputs queued, at least one (waits for it).
    fn next_batch(&mut self) -> impl std::future::Future<Output = Vec<Input>>;
    /// The run is ready: its deadline no longer applies.
    fn clear_deadline(&mut self) {}
    /// What the objects it feeds can do (the API server's change; a file's do not).
    fn objects(&self) -> Objects {
        Objects::Live
    }
}

/// Where a run stands, for whoever waits on it while it drives (the node
/// agent answers the kubelet's publish from it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Progress {
    /// No resolution yet.
    #[default]
    Starting,
    /// Not ready: what is still missing (as the timeout message says it).
    Waiting(Vec<String>),
    /// A ready tree is written (and served from then on, even when degraded).
    Published,
    /// A ready tree is written, and the pod has no claim: it never changes.
    NothingToServe,
    /// The run ended without a result.
    Failed(String),
}

/// What woke the drive loop.
enum Wake {
    Inputs(Vec<Input>),
    Written(Box<Option<Written>>),
    /// A failed write to retry, or superseded payloads to remove.
    Timer,
}

/// Drive the reconciler with the engine until the run is done. Outputs are
/// published as the steps say (`None`: `get`/`exec`, nothing to publish); a
/// failed write ends the run only when `fail_on_output_error` (`init`), else
/// it is retried (`serve`).
pub async fn drive(
    engine: &mut impl Feed,
    reconciler: &mut Reconciler,
    outputs: Option<&mut Outputs>,
    fail_on_output_error: bool,
) -> Result<Resolution, DriveError> {
    drive_reporting(engine, reconciler, outputs, fail_on_output_error, None).await
}

/// [`drive`], telling `progress` where the run stands after each step.
pub async fn drive_reporting(
    engine: &mut impl Feed,
    reconciler: &mut Reconciler,
    mut outputs: Option<&mut Outputs>,
    fail_on_output_error: bool,
    progress: Option<&tokio::sync::watch::Sender<Progress>>,
) -> Result<Resolution, DriveError> {
    let mut step = reconciler.start(std::time::Instant::now());
    loop {
        for w in step.warnings.drain(..) {
            warn!("{w}");
        }
        engine.execute(std::mem::take(&mut step.actions));
        if let Some(out) = outputs.as_deref_mut() {
            out.submit(step.publish.take(), step.transition.take(), reconciler.pod_uid());
        }
        if let Some(progress) = progress {
            report(progress, reconciler, outputs.as_deref());
        }
        if let Some(done) = step.done.take() {
            if let Some(out) = outputs.as_deref_mut()
                && let Err(e) = out.flush().await
                && fail_on_output_error
            {
                return Err(DriveError::Output(e));
            }
            return Ok(done?);
        }
        if matches!(reconciler.phase(), Phase::Ready | Phase::Degraded) {
            engine.clear_deadline();
        }
        let timer_at = outputs.as_ref().and_then(|o| o.timer_at());
        let wake = tokio::select! {
            inputs = engine.next_batch() => Wake::Inputs(inputs),
            written = write_done(outputs.as_deref_mut()) => Wake::Written(Box::new(written)),
            _ = sleep_until_opt(timer_at) => Wake::Timer,
        };
        step = Step::default();
        let busy = |outputs: &Option<&mut Outputs>| outputs.as_ref().is_some_and(|o| o.is_writing());
        match wake {
            Wake::Inputs(inputs) => {
                // While a tree is being written, inputs only go into the state:
                // it is resolved once that write is done.
                step = reconciler.absorb(std::time::Instant::now(), inputs);
                if step.done.is_none() && !busy(&outputs) {
                    step.merge(reconciler.settle(std::time::Instant::now()));
                }
            }
            Wake::Written(written) => {
                if let Some(out) = outputs.as_deref_mut()
                    && let Err(e) = out.finish_write(*written)
                    && fail_on_output_error
                {
                    return Err(DriveError::Output(e));
                }
                if !busy(&outputs) {
                    step = reconciler.settle(std::time::Instant::now());
                }
            }
            Wake::Timer => {
                if let Some(out) = outputs.as_deref_mut() {
                    out.timer_fired();
                }
            }
        }
    }
}

/// Tell `progress` where the run stands: published once a ready tree is
/// written (no write under way, none failed).
fn report(progress: &tokio::sync::watch::Sender<Progress>, reconciler: &Reconciler, outputs: Option<&Outputs>) {
    let written = outputs.is_some_and(|o| !o.is_writing() && o.retry_at().is_none());
    let now = if reconciler.phase().was_ever_ready() {
        if written || matches!(*progress.borrow(), Progress::Published | Progress::NothingToServe) {
            if reconciler.serves_nothing() { Progress::NothingToServe } else { Progress::Published }
        } else {
            return;
        }
    } else if reconciler.is_unsettled() {
        return;
    } else {
        Progress::Waiting(reconciler.waiting_for())
    };
    progress.send_if_modified(|p| {
        let changed = *p != now;
        *p = now;
        changed
    });
}

/// Until the write in progress is done (forever without outputs).
async fn write_done(outputs: Option<&mut Outputs>) -> Option<Written> {
    match outputs {
        Some(out) => out.write_done().await,
        None => std::future::pending().await,
    }
}

/// The deadline of a run that may last `timeout` (0: none).
pub fn deadline(timeout: Duration) -> Option<Instant> {
    (!timeout.is_zero()).then(|| Instant::now() + timeout)
}

/// Sleep until `at`, or forever when there is no such time.
pub async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
