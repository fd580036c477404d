//! drafs per node: one agent on each node, a CSI driver for ephemeral inline
//! volumes. The kubelet publishes a pod's `csi:` volume before any of its
//! containers start; drafs mounts a tmpfs there and keeps the pod's tree
//! current in it, as `serve --backend files` would from inside the pod
//! (docs/node-mode.md).
//!
//! Owns: the wire format (`proto`, pure), unary gRPC on a Unix socket
//! (`grpc`, with `authority`: the fix for the kubelet's registration client), the kubelet's services (`csi`), a publish request checked
//! (`request`, pure), the mounts (`mounts`, behind a trait), who holds the
//! node's places (`places`, pure), the published
//! volumes with their runs (`volumes`, reading as each pod through
//! `credential`), the agent's sockets and health (`agent`, `metrics`), and the node's pods
//! watched for device-status changes (`node_pods`, opt-in).
//!
//! May use: `engine` (one run per volume), `publish` and `model`.

pub mod agent;
pub mod authority;
pub mod credential;
pub mod csi;
pub mod grpc;
pub mod metrics;
pub mod mounts;
pub mod node_pods;
pub mod nri;
pub mod places;
pub mod proto;
pub mod request;
pub mod served;
pub mod volumes;

/// The CSI driver's name, unless `--driver-name` says otherwise.
pub const DEFAULT_DRIVER: &str = crate::model::names::DEFAULT_CSI_DRIVER;
