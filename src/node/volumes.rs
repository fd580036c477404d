//! The CSI door: the volumes the kubelet publishes. For each, a slot of the
//! node's served pods ([`Served`]) whose tmpfs is at the kubelet's target and
//! whose run reads the API as the pod's own service account.
//!
//! A publish answers once the tree is written (the kubelet starts no container
//! before), or after [`PUBLISH_WAIT`] with what is still missing (the kubelet
//! shows it in the pod's events and calls again). Publishing is idempotent: a
//! second call for a volume finds its run; a refreshed token is swapped into
//! the run in place; a run that failed is started again on the same tree; a
//! tmpfs of drafs's already at the target (the agent restarted) is taken over
//! as it is, so the tree stays readable meanwhile. A pod gets one volume of
//! each view (the tree, the standard view), and no other volume once one of
//! its volumes was unpublished (it is being deleted).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{Instrument, info, info_span, warn};

use crate::engine::drive::Progress;
use crate::engine::run::TreeBackend;
use crate::node::credential::{PodToken, client_as};
use crate::node::grpc::{Code, Status};
use crate::node::mounts::Mounts;
use crate::node::request::{Publish, View, volume_dir_pod};
use crate::node::served::{
    Published, RunSpec, Served, Slot, SlotFor, SlotKind, SlotState, reclaimed_status, wait_published,
};

/// Longest a publish waits for the tree before it answers with what is
/// missing (the kubelet calls again, backing off from 0.5 s to 2 min).
pub const PUBLISH_WAIT: Duration = Duration::from_secs(20);

impl View {
    fn kind(&self) -> SlotKind {
        match self {
            View::Tree => SlotKind::Tree,
            View::Standard { .. } => SlotKind::Standard,
        }
    }
}

impl<M: Mounts> Served<M> {
    /// Publish `p`, waiting at most `wait` for its tree.
    pub async fn publish(&self, p: Publish, wait: Duration) -> Result<(), Status> {
        let span = info_span!("volume", pod = %format!("{}/{}", p.pod.namespace, p.pod.name), volume = %p.volume_id);
        async {
            let (slot, progress, call) = loop {
                let (slot, call, reclaimed) = self.volume_slot(&p)?;
                self.tear_down(reclaimed).await;
                let mut state = slot.state.lock().await;
                if state.gone {
                    // Unpublished while this call waited: look the volume up again.
                    continue;
                }
                if slot.is_reclaimed() {
                    return Err(reclaimed_status());
                }
                if slot.is_settled() {
                    return Ok(());
                }
                match self.serve_volume(&slot, &mut state, &p) {
                    Ok(progress) => break (slot.clone(), progress, call),
                    Err(e) => {
                        if state.turns.is_none() && state.run.is_none() {
                            // Nothing was made for it: it holds no place.
                            state.gone = true;
                            self.forget(&slot, false);
                        }
                        return Err(e);
                    }
                }
            };
            let answer = wait_published(progress, wait).await;
            if let Some(mut call) = call {
                call.ready = answer.is_ok();
            }
            if answer == Ok(Published::NothingToServe) {
                self.settle(&slot).await;
            }
            answer.map(|_| ())
        }
        .instrument(span)
        .await
    }

    /// The slot of `p`'s volume: found, or added if the pod has no other
    /// volume of its view (now or lately); with the call on the pod's place.
    fn volume_slot(&self, p: &Publish) -> Result<SlotFor<'_, M>, Status> {
        if let Some(slot) = self.slot(&p.volume_id) {
            if slot.target != p.target {
                let target = slot.target.display();
                return Err(Status::new(Code::AlreadyExists, format!("volume published already at {target}")));
            }
            return self.call_on(slot, &p.pod.namespace);
        }
        let kind = p.view.kind();
        {
            let mut table = self.table();
            if let Some(other) = table.slots.values().find(|s| s.pod_uid == p.pod_uid && s.kind == kind) {
                return Err(Status::new(
                    Code::FailedPrecondition,
                    format!(
                        "pod {} has a drafs volume of view {} already ({:?}): drafs serves one of each view per pod; mount that one in each container that reads it",
                        other.pod,
                        kind.name(),
                        other.volume_name()
                    ),
                ));
            }
            if let Some(e) = table.ended_of(&p.pod_uid, Instant::now()).filter(|e| e.key != p.volume_id) {
                return Err(Status::new(
                    Code::FailedPrecondition,
                    format!(
                        "pod {}'s drafs volume ({:?}) was unpublished: the pod is going away, and drafs serves no other volume of it",
                        e.pod, e.volume_name
                    ),
                ));
            }
        }
        let mut slot = Slot::new(p.volume_id.clone(), p.target.clone(), &p.pod, &p.pod_uid, kind);
        slot.selinux_context = p.selinux_context.clone();
        self.add_slot(slot, &p.pod.namespace)
    }

    /// Mount and lock the tree if not yet, and make sure a run serves it with
    /// `p`'s token; the run's progress.
    fn serve_volume(
        &self,
        slot: &Slot,
        state: &mut SlotState,
        p: &Publish,
    ) -> Result<watch::Receiver<Progress>, Status> {
        let turns = self.mounted(slot, state)?;
        match &mut state.run {
            Some(run) if run.is_serving() => {
                let token = run.token.as_ref().expect("a volume's run reads as its pod");
                let refreshed =
                    token.replace(&p.token).map_err(|e| Status::new(Code::InvalidArgument, e.to_string()))?;
                if refreshed {
                    info!("a refreshed token: used from the next request on");
                }
                // A republish: the pod and its claims are asked again once per refresh.
                if run.poked.elapsed() >= self.timing.refresh {
                    slot.poke.send_modify(|n| *n += 1);
                    run.poked = Instant::now();
                }
                Ok(run.progress.clone())
            }
            _ => {
                // None yet, or one that failed: a new run on the same tree.
                let token = PodToken::new(&p.token).map_err(|e| Status::new(Code::InvalidArgument, e.to_string()))?;
                // The tree, or the standard view alone, written at the target.
                let (backend, metadata_dir, metadata_from_drivers) = match &p.view {
                    View::Tree => (TreeBackend::Files, None, Vec::new()),
                    View::Standard { from_drivers } => {
                        (TreeBackend::None, Some(p.target.clone()), from_drivers.clone())
                    }
                };
                let spec = RunSpec {
                    client: client_as(&self.shared, token.clone(), &p.pod.namespace),
                    token: Some(token),
                    pod: p.pod.clone(),
                    selection: p.selection.clone(),
                    require: p.require.clone(),
                    backend,
                    metadata_dir,
                    metadata_from_drivers,
                    containers: Vec::new(),
                    watch_for: self.timing.watch_for,
                };
                let run = self.start(slot, spec, turns);
                let progress = run.progress.clone();
                state.run = Some(run);
                Ok(progress)
            }
        }
    }

    /// Unpublish the volume at `target`: stop its run, unmount drafs's tmpfs,
    /// remove the directory. Done already is done; a target that is not the
    /// volume's is left alone.
    pub async fn unpublish(&self, volume_id: &str, target: &Path) -> Result<(), Status> {
        let slot = self.slot(volume_id);
        // The pod as the agent knows it, else (an agent restarted since the
        // publish) the uid in the target's path.
        let uid = target.to_str().and_then(|t| volume_dir_pod(&self.kubelet_dir, t));
        let pod = match (&slot, uid) {
            (Some(slot), _) => slot.pod.clone(),
            (None, Some(uid)) => format!("uid {uid}"),
            (None, None) => String::new(),
        };
        let span = info_span!("volume", %pod, volume = %volume_id);
        let outcome = self.unpublish_slot(volume_id, slot, target, uid.is_some()).instrument(span.clone()).await;
        if let Err(status) = &outcome {
            span.in_scope(
                || warn!(target = %target.display(), code = ?status.code, "unpublish refused: {}", status.message),
            );
        }
        outcome
    }

    /// `in_pods`: the target is a pod volume directory of the kubelet.
    async fn unpublish_slot(
        &self,
        volume_id: &str,
        slot: Option<Arc<Slot>>,
        target: &Path,
        in_pods: bool,
    ) -> Result<(), Status> {
        if !in_pods {
            return Err(Status::new(
                Code::InvalidArgument,
                format!(
                    "{} is not a pod volume directory of the kubelet at {}",
                    target.display(),
                    self.kubelet_dir.display()
                ),
            ));
        }
        let holder = self.table().slots.values().find(|s| s.target == target && s.key != volume_id).cloned();
        if let Some(other) = holder.or_else(|| slot.clone().filter(|s| s.target != target)) {
            return Err(Status::new(
                Code::FailedPrecondition,
                format!(
                    "{} is not volume {volume_id}'s target (volume {} is published at {}); nothing was done",
                    target.display(),
                    other.key,
                    other.target.display()
                ),
            ));
        }
        match &slot {
            Some(slot) => self.remove(slot, true).await?,
            None => self.remove_target(target)?,
        }
        info!(target = %target.display(), "unpublished");
        Ok(())
    }
}
