//! The engine: follows the pod, its claims and its node's slices on the API
//! server and says when the tree changes.
//!
//! Owns: the reconciler (`reconcile`, pure: inputs in, actions and
//! publications out) and its store (`store`, pure: each scope in one entry),
//! the I/O half that carries the actions out against the API server
//! (`source`'s `ApiFeed`, over `api`), the drive loop that runs the two
//! together and hands publications to the outputs (`drive`), the other
//! source, a file of objects (`file`), one run of it all for a command
//! (`run`), and slices shared by the runs of a process (`shared`, the node
//! agent's), over a list and watch of a collection as raw JSON
//! (`collection`).
//!
//! May use: `publish` (the outputs it drives) and `model`.

pub mod api;
pub mod collection;
pub mod drive;
pub mod file;
pub mod reconcile;
pub mod run;
pub mod shared;
pub mod source;
pub mod store;

pub use crate::model::PodRef;

/// Why a run stopped without a result.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Api(#[from] api::ApiError),
    /// Waiting cannot help: the pod's spec (immutable) asks for something that cannot be.
    #[error("{0}")]
    Permanent(crate::model::resolve::Missing),
    /// The deadline passed; the strings say what was still missing.
    #[error("timed out")]
    Timeout { waiting_for: Vec<String> },
    /// Not ready, and the source cannot change (a file): waiting cannot help.
    #[error("not ready: {}", missing.join("; "))]
    NotReady { missing: Vec<String> },
}
