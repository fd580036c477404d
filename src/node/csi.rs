//! The gRPC services the kubelet calls: plugin registration (on the
//! registration socket), CSI Identity and CSI Node (on the endpoint). drafs has
//! no controller and no staging: a volume is published straight into the
//! pod's directory.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{debug, error, info, warn};

use crate::node::grpc::{Code, Handler, Status};
use crate::node::metrics::NodeMetrics;
use crate::node::mounts::Mounts;
use crate::node::proto::{self, NodePublishVolumeRequest, NodeUnpublishVolumeRequest, RegistrationStatus, Writer};
use crate::node::request::{Publish, TokenIn};
use crate::node::served::Served;
use crate::node::volumes::PUBLISH_WAIT;
use crate::publish::metrics::Exposition;

/// The CSI versions drafs speaks (the kubelet asks at registration).
pub const CSI_VERSIONS: [&str; 1] = ["1.0.0"];
/// What a publish leaves for its answer: the kubelet's deadline less this.
const ANSWER_MARGIN: Duration = Duration::from_secs(2);

/// The node agent's services.
pub struct Service<M: Mounts> {
    pub driver: String,
    pub node_name: String,
    /// The CSI endpoint, as the kubelet is told at registration.
    pub endpoint: PathBuf,
    /// Where the kubelet puts the pod's token (the CSIDriver's setting).
    pub token_in: TokenIn,
    pub volumes: Arc<Served<M>>,
    pub metrics: Arc<NodeMetrics>,
    /// What `/readyz` answers, which CSI's `Probe` answers too (None: always ready).
    pub readiness: Option<Arc<dyn Exposition>>,
}

impl<M: Mounts> Handler for Service<M> {
    async fn call(&self, method: &str, message: Bytes, timeout: Option<Duration>) -> Result<Vec<u8>, Status> {
        let decode =
            |e: proto::DecodeError| Status::new(Code::InvalidArgument, format!("malformed {method} request: {e}"));
        let mut out = Writer::new();
        match method {
            "/pluginregistration.Registration/GetInfo" => {
                out.string(1, "CSIPlugin").string(2, &self.driver).string(3, &self.endpoint.to_string_lossy());
                for v in CSI_VERSIONS {
                    out.string(4, v);
                }
            }
            "/pluginregistration.Registration/NotifyRegistrationStatus" => {
                let status = RegistrationStatus::decode(&message).map_err(decode)?;
                if status.plugin_registered {
                    info!(driver = %self.driver, "registered with the kubelet");
                } else {
                    error!(driver = %self.driver, "the kubelet refused the registration: {}", status.error);
                }
                self.metrics.registration(status.plugin_registered, &status.error);
            }
            "/csi.v1.Identity/GetPluginInfo" => {
                out.string(1, &self.driver).string(2, env!("CARGO_PKG_VERSION"));
            }
            "/csi.v1.Identity/GetPluginCapabilities" | "/csi.v1.Node/NodeGetCapabilities" => {
                proto::check(&message).map_err(decode)?;
            }
            "/csi.v1.Identity/Probe" => {
                // Ready as /readyz says: registered, both sockets the agent's.
                let unready = self.readiness.as_ref().and_then(|r| r.unready_reason());
                if let Some(reason) = &unready {
                    debug!("probed: not ready: {reason}");
                }
                let mut ready = Writer::new();
                ready.boolean(1, unready.is_none());
                out.message(1, ready);
            }
            "/csi.v1.Node/NodeGetInfo" => {
                out.string(1, &self.node_name);
            }
            "/csi.v1.Node/NodePublishVolume" => {
                let started = Instant::now();
                let result = self.publish(&message, timeout).await;
                self.metrics.published(result.as_ref().err().map(|e| e.code), started.elapsed());
                result?;
            }
            "/csi.v1.Node/NodeUnpublishVolume" => {
                let result = self.unpublish(&message).await;
                self.metrics.unpublished(result.as_ref().err().map(|e| e.code));
                result?;
            }
            _ => return Err(Status::new(Code::Unimplemented, format!("drafs does not implement {method}"))),
        }
        Ok(out.finish())
    }
}

impl<M: Mounts> Service<M> {
    async fn publish(&self, message: &[u8], timeout: Option<Duration>) -> Result<(), Status> {
        let req = NodePublishVolumeRequest::decode(message)
            .map_err(|e| Status::new(Code::InvalidArgument, format!("malformed NodePublishVolume request: {e}")))?;
        let publish = Publish::check(&req, self.volumes.kubelet_dir(), &self.driver, self.token_in).map_err(|e| {
            let pod = |key: &str| req.volume_context.get(key).map_or("?", String::as_str);
            let pod = format!("{}/{}", pod("csi.storage.k8s.io/pod.namespace"), pod("csi.storage.k8s.io/pod.name"));
            warn!(%pod, volume = %req.volume_id, "publish refused: {e}");
            Status::new(Code::InvalidArgument, e.to_string())
        })?;
        let wait = timeout.map_or(PUBLISH_WAIT, |t| t.saturating_sub(ANSWER_MARGIN).min(PUBLISH_WAIT));
        self.volumes.publish(publish, wait).await
    }

    async fn unpublish(&self, message: &[u8]) -> Result<(), Status> {
        let req = NodeUnpublishVolumeRequest::decode(message)
            .map_err(|e| Status::new(Code::InvalidArgument, format!("malformed NodeUnpublishVolume request: {e}")))?;
        if req.volume_id.is_empty() || req.target_path.is_empty() {
            return Err(Status::new(Code::InvalidArgument, "volume_id and target_path are required"));
        }
        self.volumes.unpublish(&req.volume_id, req.target_path.as_ref()).await
    }
}
