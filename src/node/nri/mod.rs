//! drafs node as an NRI plugin: the container runtime tells the agent of
//! every pod sandbox and container it creates, and drafs answers a container
//! of an opted-in pod that uses a claim with a read-only bind mount of that
//! container's own tree, which the agent keeps ready before the runtime asks
//! (docs/nri.md). Nothing is added to the pod.
//!
//! Owns: NRI's messages (`api`), the wire (`wire`: the multiplexer and
//! ttrpc, by hand), which containers get what mounts (`policy`, pure), each namespace's share of the time a creation
//! may hold the runtime (`shares`, pure), the door the runtime's calls come through (`door`), what it counts
//! (`metrics`), and whether a stop is for good (`uninstall`: the trees go).
//!
//! May use: `node::served` (the node's served pods, one home for both doors),
//! `node::grpc`'s status codes, `engine`, `publish` and `model`.

pub mod api;
pub mod door;
pub mod metrics;
pub mod plugin;
pub mod policy;
pub mod shares;
pub mod uninstall;
pub mod wire;
