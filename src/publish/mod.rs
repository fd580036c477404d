//! The outputs: everything drafs writes for the pod's containers and its
//! operators to read.
//!
//! Owns: the fan-out of each new tree to its outputs, one write at a time off
//! the runtime thread (`outputs`); the tree as atomically swapped files
//! (`files`) or a FUSE mount (`fuse`, over its tested model `fsmodel`, with
//! the `supervisor` that unmounts it when the server dies); the standard
//! metadata files (`metadata_dir`); `/metrics` and probes (`metrics`, in the
//! text format `prometheus` writes for the webhook's metrics too); the
//! pod's Events (`events`); which connections a listener serves at its
//! limit (`slots`, the webhook's port and every metrics port); one bounded request to the API server and how it
//! ended (`call`, for Events here and for every layer above).
//!
//! May use: `model`.

pub mod call;
pub mod events;
pub mod files;
pub mod fsmodel;
pub mod fuse;
pub mod metadata_dir;
pub mod metrics;
pub mod outputs;
pub mod process;
pub mod prometheus;
pub mod slots;
pub mod supervisor;
