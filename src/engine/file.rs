//! The other source: the pod, its claims and slices from a file
//! (`--from-file`), fed to the same reconciler as the API server's answers.
//! The file answers every get and list at once, from memory, and no watch
//! ever brings a change: the feed says so ([`Feed::objects`]: fixed), and the
//! reconciler, reading it, decides without waiting for one.

use std::collections::VecDeque;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use tracing::info;

use crate::engine::drive::Feed;
use crate::engine::reconcile::{Action, Input, Objects};
use crate::engine::store::{Item, Scope};
use crate::model::PodRef;
use crate::model::objects::{FileObjects, LoadError, Snapshot};
use crate::model::slices::DeviceFilter;

/// The objects of one file, answering the reconciler's actions.
pub struct FileFeed {
    pod: Pod,
    namespace: String,
    objects: Snapshot,
    /// The filter of the last [`Action::Filter`]: every list says it was
    /// decoded with it, since the file's slices hold every device.
    filter: DeviceFilter,
    answers: VecDeque<Input>,
    /// How messages name the file.
    shown: String,
}

/// A file's feed and the pod it holds.
pub struct FileSource {
    pub feed: FileFeed,
    pub pod: PodRef,
}

impl FileSource {
    /// Read the file at `path` (`-`: standard input) and choose its pod.
    pub fn read(path: &Path, pod_name: Option<&str>) -> Result<Self, LoadError> {
        let objects = FileObjects::read(path)?;
        if !objects.ignored.is_empty() {
            info!(kinds = ?objects.ignored, "ignoring objects of other kinds in {}", path.display());
        }
        let shown = if path == Path::new("-") { "standard input".to_string() } else { path.display().to_string() };
        let mut objects = objects.into_snapshot(&shown, pod_name)?;
        let Some(pod) = objects.pod.take() else {
            return Err(LoadError::NoPod { path: shown, hint: String::new() });
        };
        let namespace = pod.metadata.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".into());
        let pod_ref = PodRef { namespace: namespace.clone(), name: pod.metadata.name.clone().unwrap_or_default() };
        let filter = DeviceFilter::default();
        let feed = FileFeed { pod, namespace, objects, filter, answers: VecDeque::new(), shown };
        Ok(FileSource { feed, pod: pod_ref })
    }
}

impl FileFeed {
    /// The objects of `scope` in the file.
    fn list(&self, scope: &Scope) -> Vec<Item> {
        match scope {
            Scope::Claim(_) => (self.objects.claims.values())
                .filter(|c| scope.admits_claim(c, &self.namespace))
                .map(|c| Item::Claim(Box::new(c.clone())))
                .collect(),
            Scope::NodeSlices(_) | Scope::DriverSlices(_) => (self.objects.slices.values())
                .filter(|s| scope.admits_slice(s))
                .map(|s| Item::Slice(Box::new(s.clone())))
                .collect(),
            Scope::Pod(_) => Vec::new(),
        }
    }
}

impl Feed for FileFeed {
    fn execute(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::GetPod { .. } => self.answers.push_back(Input::Pod(Box::new(self.pod.clone()))),
                Action::List { scope, .. } => {
                    let items = self.list(&scope);
                    let decoded_with = Some(self.filter.clone());
                    self.answers.push_back(Input::Listed { scope, items, resource_version: "0".into(), decoded_with });
                }
                // Nothing in a file changes.
                Action::Watch { .. } | Action::Recheck { .. } => {}
                Action::Filter(filter) => self.filter = filter,
            }
        }
    }

    fn objects(&self) -> Objects {
        Objects::Fixed { shown: self.shown.clone() }
    }

    /// Everything answered so far; then nothing, ever.
    async fn next_batch(&mut self) -> Vec<Input> {
        if self.answers.is_empty() {
            return std::future::pending().await;
        }
        self.answers.drain(..).collect()
    }
}
