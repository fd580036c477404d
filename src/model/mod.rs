//! The model: what drafs knows about a pod's devices, as pure functions of
//! the objects (no I/O, no clock but what a caller passes in).
//!
//! Owns: decoding the API's objects (`objects`, `slices`; JSON read as text: `json_text`), resolving a pod's
//! claims to devices (`resolve`, from only what `retained` keeps of the objects; which generation of a pool counts: `pools`), laying them out as a tree of files (`tree`,
//! `layout`, `names`; a driver's status data as files: `status_data`), the standard KEP-5304 view (`metadata`), the values of
//! `drafs exec`'s variables (`envvars`), where drafs may mount its files in a container (`container_path`), and the small vocabulary the layers
//! above share: which pod ([`PodRef`]), what a run publishes
//! (`publication`) and how long to wait before trying again (`backoff`).
//!
//! May use: nothing else of drafs.

pub mod backoff;
pub mod container_path;
pub mod envvars;
pub mod extended;
pub mod health;
pub mod json_text;
pub mod layout;
pub mod metadata;
pub mod names;
pub mod objects;
pub mod pools;
pub mod publication;
pub mod record;
pub mod resolve;
pub mod retained;
pub mod slices;
pub mod status_data;
pub mod tree;

/// Which pod to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}
