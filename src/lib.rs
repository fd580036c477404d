//! drafs: the attributes of a pod's DRA-allocated devices, as files.
//!
//! The folders are the layers, and a module uses only the layers below its own
//! (docs/architecture.md):
//!
//! - [`cmd`]: one file per subcommand: flags to a checked config, wiring, exit code;
//! - [`engine`]: follows the API server (the pure reconciler, its I/O half, the drive loop);
//! - [`admission`]: adds drafs to pods (`inject`, the webhook, the RBAC manifests);
//! - [`node`]: drafs per node, a CSI driver that publishes each pod's tree into its volume;
//! - [`publish`]: writes what the engine resolved (files, FUSE, the standard view, metrics, Events);
//! - [`model`]: the objects, their resolution and the tree, pure: no I/O.

pub mod admission;
pub mod cmd;
pub mod engine;
pub mod model;
pub mod node;
pub mod publish;
