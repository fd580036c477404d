//! The reconciler's vocabulary: how long a run lasts ([`Mode`]), what
//! happens ([`Input`]), what to do next ([`Action`]) and the outcome of one
//! batch of inputs ([`Step`]).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::engine::EngineError;
use crate::engine::api::ApiError;
use crate::engine::store::{Item, Scope};
use crate::model::publication::{Publication, Transition};
use crate::model::resolve::Resolution;
use crate::model::slices::DeviceFilter;

/// How long a run lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `get`, `exec`: one resolution once everything is listed, ready or not.
    Once,
    /// `init`: until ready, watching only what is still missing.
    UntilReady,
    /// `serve`: forever, following every change.
    Follow,
}

#[derive(Debug)]
pub enum Input {
    Pod(Box<Pod>),
    PodFailed(ApiError),
    /// A scope's complete list (all pages); slices were decoded with `decoded_with`.
    Listed {
        scope: Scope,
        items: Vec<Item>,
        resource_version: String,
        decoded_with: Option<DeviceFilter>,
    },
    Applied {
        scope: Scope,
        item: Item,
    },
    Deleted {
        scope: Scope,
        name: String,
        resource_version: Option<String>,
    },
    Bookmark {
        scope: Scope,
        resource_version: String,
    },
    /// The server closed a watch without an error, after `lasted`, having
    /// sent `changes` objects (added, modified, deleted; bookmarks not counted).
    WatchEnded {
        scope: Scope,
        lasted: Duration,
        changes: usize,
    },
    /// 410 Gone: the resource version is too old; list again.
    Expired(Scope),
    Failed {
        scope: Scope,
        error: ApiError,
    },
    Deadline,
    /// The time asked for by [`Action::Recheck`] has come.
    Recheck,
}

/// What the engine should do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    GetPod {
        after: Duration,
    },
    List {
        scope: Scope,
        after: Duration,
    },
    Watch {
        scope: Scope,
        resource_version: String,
        after: Duration,
    },
    /// Decode slices with this filter from now on.
    Filter(DeviceFilter),
    /// Resolve again after this long, inputs or not ([`Input::Recheck`]).
    Recheck {
        after: Duration,
    },
}

/// The outcome of one input.
#[derive(Debug, Default)]
pub struct Step {
    pub actions: Vec<Action>,
    pub publish: Option<Publication>,
    pub transition: Option<Transition>,
    /// Warnings not reported before (resolver and tree).
    pub warnings: Vec<String>,
    /// The run is over: its last resolution, or why it failed.
    pub done: Option<Result<Resolution, EngineError>>,
}

impl Step {
    /// Add a later step's outcome to this one.
    pub fn merge(&mut self, later: Step) {
        self.actions.extend(later.actions);
        self.warnings.extend(later.warnings);
        if later.publish.is_some() {
            self.publish = later.publish;
        }
        if later.transition.is_some() {
            self.transition = later.transition;
        }
        if later.done.is_some() {
            self.done = later.done;
        }
    }
}

/// What the objects' source can do, as it declares it ([`crate::engine::drive::Feed::objects`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Objects {
    /// The API server: objects change, are watched and can be asked for again.
    #[default]
    Live,
    /// A file, named `shown` in messages: every get and list is answered at
    /// once and nothing ever changes, so nothing is waited for or watched.
    Fixed { shown: String },
}

impl Objects {
    /// Waiting can bring something new (a watch, a second get).
    pub fn can_change(&self) -> bool {
        matches!(self, Objects::Live)
    }
}
