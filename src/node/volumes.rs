//! The volumes the node agent published: for each, a tmpfs at the kubelet's
//! target and one `serve`-like run that keeps the pod's tree current there,
//! reading the API as the pod's own service account.
//!
//! A publish answers once the tree is written (the kubelet starts no container
//! before), or after [`PUBLISH_WAIT`] with what is still missing (the kubelet
//! shows it in the pod's events and calls again). Publishing is idempotent: a
//! second call for a volume finds its run; a refreshed token restarts the run
//! on the same tree; a run that failed is started again; a tmpfs of drafs's
//! already at the target (the agent restarted) is taken over as it is, so the
//! tree stays readable meanwhile.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Client;
use tokio::sync::{Mutex, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::engine::drive::Progress;
use crate::engine::reconcile::Mode;
use crate::engine::run::{Publishing, Run, Sharing, Source, TreeBackend};
use crate::engine::shared::SharedSlices;
use crate::engine::source::Polling;
use crate::node::grpc::{Code, Status};
use crate::node::mounts::{AtTarget, Mounts};
use crate::node::request::{Publish, volume_dir_pod};
use crate::publish::events::EventsMode;

/// Longest a publish waits for the tree before it answers with what is
/// missing (the kubelet calls again, backing off from 0.5 s to 2 min).
pub const PUBLISH_WAIT: Duration = Duration::from_secs(20);
/// Longest an unpublish waits for the run to finish a write.
const STOP_WAIT: Duration = Duration::from_secs(5);

struct Volume {
    publish: Publish,
    progress: watch::Receiver<Progress>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    /// Asks the run to read its pod and claims again.
    poke: watch::Sender<u64>,
    poked: Instant,
}

impl Volume {
    /// Stop the run (a write under way is finished) and wait for it.
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(STOP_WAIT, &mut self.task).await.is_err() {
            self.task.abort();
        }
    }
}

/// When a volume's run asks for its pod and claims.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// After the first publish, they are watched this long (what a driver
    /// reports when it prepares the device, and the first health reports, come then);
    pub watch_for: Duration,
    /// then asked again at a republish at most this often.
    pub refresh: Duration,
}

/// Every published volume of this node, by volume id.
pub struct Volumes<M: Mounts> {
    kubelet_dir: PathBuf,
    /// The API server (address, CA), without credentials: each run adds its pod's token.
    cluster: kube::Config,
    /// The node's slices, one watch for every volume (read as the agent).
    slices: Arc<SharedSlices>,
    timing: Timing,
    mounts: M,
    published: Mutex<HashMap<String, Volume>>,
}

impl<M: Mounts> Volumes<M> {
    pub fn new(
        kubelet_dir: PathBuf,
        mut cluster: kube::Config,
        slices: Arc<SharedSlices>,
        timing: Timing,
        mounts: M,
    ) -> Arc<Self> {
        cluster.auth_info = kube::config::AuthInfo::default();
        Arc::new(Volumes { kubelet_dir, cluster, slices, timing, mounts, published: Mutex::new(HashMap::new()) })
    }

    pub fn kubelet_dir(&self) -> &Path {
        &self.kubelet_dir
    }

    /// Publish `p`, waiting at most `wait` for its tree.
    pub async fn publish(&self, p: Publish, wait: Duration) -> Result<(), Status> {
        let progress = {
            let mut published = self.published.lock().await;
            let old = published.remove(&p.volume_id);
            let keep = old.as_ref().is_some_and(|v| {
                v.publish.token == p.token
                    && !v.task.is_finished()
                    && !matches!(*v.progress.borrow(), Progress::Failed(_))
            });
            let volume = match old {
                Some(v) if v.publish.target != p.target => {
                    let target = v.publish.target.display().to_string();
                    published.insert(p.volume_id.clone(), v);
                    return Err(Status::new(Code::AlreadyExists, format!("volume published already at {target}")));
                }
                Some(mut v) if keep => {
                    // A republish: the pod and its claims are asked again once per refresh.
                    if v.poked.elapsed() >= self.timing.refresh {
                        v.poke.send_modify(|n| *n += 1);
                        v.poked = Instant::now();
                    }
                    v
                }
                old => {
                    if let Some(old) = old {
                        // A new token (or a failed run): the same tree, a new run.
                        old.stop().await;
                    } else {
                        self.mount(&p.target)?;
                    }
                    self.start(p.clone())?
                }
            };
            let progress = volume.progress.clone();
            published.insert(p.volume_id.clone(), volume);
            progress
        };
        wait_published(progress, wait).await
    }

    /// Unpublish the volume at `target`: stop its run, unmount drafs's tmpfs,
    /// remove the directory. Done already is done.
    pub async fn unpublish(&self, volume_id: &str, target: &Path) -> Result<(), Status> {
        if target.to_str().and_then(|t| volume_dir_pod(&self.kubelet_dir, t)).is_none() {
            return Err(Status::new(
                Code::InvalidArgument,
                format!(
                    "{} is not a pod volume directory of the kubelet at {}",
                    target.display(),
                    self.kubelet_dir.display()
                ),
            ));
        }
        let volume = self.published.lock().await.remove(volume_id);
        if let Some(volume) = volume {
            volume.stop().await;
        }
        match self.mounts.at(target).map_err(|e| internal("read the mount table", target, e))? {
            AtTarget::Ours => self.mounts.unmount(target).map_err(|e| internal("unmount", target, e))?,
            AtTarget::Nothing => {}
            AtTarget::Foreign => {
                return Err(Status::new(
                    Code::FailedPrecondition,
                    format!("{} holds a mount drafs did not make; it is left as it is", target.display()),
                ));
            }
        }
        match std::fs::remove_dir(target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // Files under the mount point are not drafs's (it writes only in
            // its tmpfs): left as they are, and the pod not held up for them.
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
                warn!(target = %target.display(), "left in place: files under the mount point that drafs did not write");
            }
            Err(e) => return Err(internal("remove", target, e)),
        }
        info!(volume = volume_id, target = %target.display(), "unpublished");
        Ok(())
    }

    /// Stop every run, leaving the trees mounted and readable (the agent stops
    /// or is upgraded; the next publish of each volume makes it live again).
    pub async fn stop_all(&self) {
        let volumes: Vec<Volume> = self.published.lock().await.drain().map(|(_, v)| v).collect();
        futures::future::join_all(volumes.into_iter().map(Volume::stop)).await;
    }

    /// A tmpfs of drafs's at `target`: made, or found (the agent restarted).
    fn mount(&self, target: &Path) -> Result<(), Status> {
        match self.mounts.at(target).map_err(|e| internal("read the mount table", target, e))? {
            AtTarget::Ours => Ok(()),
            AtTarget::Foreign => Err(Status::new(
                Code::FailedPrecondition,
                format!("{} holds a mount drafs did not make", target.display()),
            )),
            AtTarget::Nothing => {
                std::fs::create_dir_all(target).map_err(|e| internal("create", target, e))?;
                self.mounts.mount_tmpfs(target).map_err(|e| internal("mount a tmpfs at", target, e))
            }
        }
    }

    /// Start the run that keeps `p`'s tree current.
    fn start(&self, p: Publish) -> Result<Volume, Status> {
        let mut config = self.cluster.clone();
        config.auth_info.token = Some(p.token.clone().into());
        let client = Client::try_from(config)
            .map_err(|e| Status::new(Code::Internal, format!("cannot make an API client: {e}")))?;
        let (tx, progress) = watch::channel(Progress::Starting);
        let (stop, stopped) = oneshot::channel();
        let (poke, poked) = watch::channel(0);
        let polling = Polling { poke: poked, live_until: (Instant::now() + self.timing.watch_for).into() };
        let sharing = Some(Sharing { slices: self.slices.clone(), polling });
        let publishing = Publishing {
            backend: TreeBackend::Files,
            dir: p.target.clone(),
            metadata_dir: None,
            metadata_from_drivers: Vec::new(),
            require: p.require.clone(),
            metrics_addr: None,
            events: EventsMode::Warnings,
        };
        let source = Source::Connected { client, pod: p.pod.clone(), sharing };
        let (selection, volume) = (p.selection.clone(), p.volume_id.clone());
        let task = tokio::spawn(async move {
            let started = Run::publishing(&source, Mode::Follow, selection, Duration::ZERO, &publishing).await;
            let mut run = match started {
                Ok(run) => run,
                Err(e) => {
                    warn!(%volume, "cannot start: {e}");
                    tx.send_replace(Progress::Failed(e.to_string()));
                    return;
                }
            };
            run.report_to(tx.clone());
            tokio::pin!(stopped);
            let ended = tokio::select! {
                result = run.drive() => result,
                _ = &mut stopped => {
                    run.stop().await;
                    return;
                }
            };
            let message = match ended {
                Ok(_) => "the run ended".to_string(),
                Err(e) => e.to_string(),
            };
            warn!(%volume, "stopped serving: {message}");
            tx.send_replace(Progress::Failed(message));
            run.finish().await;
        });
        info!(volume = %p.volume_id, pod = %format!("{}/{}", p.pod.namespace, p.pod.name), target = %p.target.display(), "publishing");
        Ok(Volume { publish: p, progress, stop: Some(stop), task, poke, poked: Instant::now() })
    }
}

fn internal(op: &str, path: &Path, e: std::io::Error) -> Status {
    Status::new(Code::Internal, format!("cannot {op} {}: {e}", path.display()))
}

/// Until the run has written a ready tree, it failed, or `wait` passed.
async fn wait_published(mut progress: watch::Receiver<Progress>, wait: Duration) -> Result<(), Status> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match &*progress.borrow_and_update() {
            Progress::Published => return Ok(()),
            Progress::Failed(message) => {
                return Err(Status::new(Code::Unavailable, format!("drafs cannot serve the pod's devices: {message}")));
            }
            Progress::Starting | Progress::Waiting(_) => {}
        }
        match tokio::time::timeout_at(deadline, progress.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(Status::new(Code::Unavailable, "drafs stopped serving the pod's devices")),
            Err(_) => break,
        }
    }
    let waiting = match &*progress.borrow() {
        Progress::Waiting(missing) => missing.join("; "),
        _ => "no answer from the API server yet".to_string(),
    };
    Err(Status::new(Code::Unavailable, format!("drafs is waiting for the pod's devices: {waiting}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_publish_answers_when_the_tree_is_written_or_says_what_is_missing() {
        let (tx, rx) = watch::channel(Progress::Starting);
        tx.send_replace(Progress::Waiting(vec!["claim gpu not allocated yet".into()]));
        let err = wait_published(rx.clone(), Duration::from_millis(10)).await.unwrap_err();
        assert_eq!(err.code, Code::Unavailable);
        assert!(err.message.ends_with("claim gpu not allocated yet"), "{}", err.message);

        let waiting = tokio::spawn(wait_published(rx.clone(), Duration::from_secs(60)));
        tx.send_replace(Progress::Published);
        assert_eq!(waiting.await.unwrap(), Ok(()));

        tx.send_replace(Progress::Failed("forbidden".into()));
        assert!(wait_published(rx.clone(), Duration::ZERO).await.unwrap_err().message.contains("forbidden"));
        drop(tx);
        let (tx, rx) = watch::channel(Progress::Starting);
        drop(tx);
        assert_eq!(wait_published(rx, Duration::from_secs(60)).await.unwrap_err().code, Code::Unavailable);
    }
}
