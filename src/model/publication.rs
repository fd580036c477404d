//! What the engine hands to the outputs: a tree to publish, and the
//! readiness change it carries (to log, count and record as an Event).

use crate::model::resolve::Resolution;
use crate::model::tree::BuiltTree;

/// A readiness change, to log, count and record as an Event.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// Not ready yet, and what is missing changed.
    Waiting { missing: Vec<String> },
    /// Everything asked for is there, for the first time.
    Ready { summary: String },
    /// Still ready, with new values.
    Updated,
    /// Was ready; these went missing and their values were removed.
    Lost { missing: Vec<String> },
    /// Ready again after `Lost`.
    Recovered,
}

/// A tree to publish, with the resolution it came from.
#[derive(Debug, Clone)]
pub struct Publication {
    pub resolution: Resolution,
    pub built: BuiltTree,
}
