//! The agent as a whole: its two sockets kept in place, its health, and its
//! stop.
//!
//! The kubelet finds the agent by the registration socket and calls it on
//! the endpoint; if either goes (removed by hand, by a cleanup, by the
//! kubelet's own directory being recreated), the kubelet loses the driver and
//! pods wait. The agent checks both every [`SOCKET_CHECK`] and makes a
//! missing one again (the kubelet registers it anew). A socket another
//! process put at the path (a newer agent during an upgrade) is left to it:
//! the agent is then not ready, and on stop removes only what is still its
//! own.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::engine::collection::FollowHealth;
use crate::engine::shared::SharedSlices;
use crate::node::csi::Service;
use crate::node::grpc;
use crate::node::metrics::{Census, NodeMetrics};
use crate::node::mounts::Mounts;
use crate::node::node_pods;
use crate::node::nri::metrics::NriMetrics;
use crate::node::served::{Limits, Served};
use crate::publish::metrics::Exposition;

/// How often the sockets are checked.
pub const SOCKET_CHECK: Duration = Duration::from_secs(5);

/// Whose a socket path is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketState {
    Ours,
    Missing,
    /// Something else is at the path (another agent's socket, say).
    Replaced,
}

/// A socket the agent listens on, known by its inode.
#[derive(Debug)]
pub struct OwnSocket {
    pub path: PathBuf,
    id: Mutex<(u64, u64)>,
}

fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    let meta = std::fs::symlink_metadata(path)?;
    Ok((meta.dev(), meta.ino()))
}

impl OwnSocket {
    /// Listen at `path` (its directory made if needed; a stale socket there replaced).
    pub fn bind(path: &Path) -> std::io::Result<(OwnSocket, UnixListener)> {
        let listener = Self::listen(path)?;
        Ok((OwnSocket { path: path.to_path_buf(), id: Mutex::new(identity(path)?) }, listener))
    }

    fn listen(path: &Path) -> std::io::Result<UnixListener> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        grpc::listen(path)
    }

    pub fn state(&self) -> SocketState {
        match identity(&self.path) {
            Ok(id) if id == *self.id.lock().unwrap_or_else(|e| e.into_inner()) => SocketState::Ours,
            Ok(_) => SocketState::Replaced,
            Err(_) => SocketState::Missing,
        }
    }

    /// Listen again at the path (it went missing).
    pub fn rebind(&self) -> std::io::Result<UnixListener> {
        let listener = Self::listen(&self.path)?;
        *self.id.lock().unwrap_or_else(|e| e.into_inner()) = identity(&self.path)?;
        Ok(listener)
    }

    /// Remove the socket, if it is still this agent's.
    pub fn remove_if_ours(&self) {
        if self.state() == SocketState::Ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What `/metrics`, `/healthz` and `/readyz` of the agent read.
pub struct Health<M: Mounts> {
    pub metrics: Arc<NodeMetrics>,
    pub volumes: Arc<Served<M>>,
    pub slices: Arc<SharedSlices>,
    /// The node's pods' watch (`--watch-node-pods`), if the agent keeps one.
    pub node_pods: Option<(String, Arc<FollowHealth>)>,
    /// The NRI door's, when the agent serves through NRI too.
    pub nri: Option<Arc<NriMetrics>>,
    pub sockets: [Arc<OwnSocket>; 2],
    pub limits: Limits,
}

impl<M: Mounts> Health<M> {
    fn census(&self) -> Census {
        let (_, failing_runs) = self.volumes.census();
        let tmpfs_bytes = self.volumes.targets().iter().filter_map(|t| used_bytes(t)).sum();
        let mut watches = self.slices.status();
        if let Some((node, health)) = &self.node_pods {
            watches.push(health.report("pods", node_pods::field_selector(node)));
        }
        let sockets = self.sockets.iter().find_map(|s| match s.state() {
            SocketState::Ours => None,
            SocketState::Missing => {
                Some(format!("{} is missing (made again within {SOCKET_CHECK:?})", s.path.display()))
            }
            SocketState::Replaced => Some(format!("{} is another process's (a newer agent?)", s.path.display())),
        });
        Census { max_pods: self.limits.places.max_pods, failing_runs, tmpfs_bytes, watches, sockets }
    }
}

impl<M: Mounts> Exposition for Health<M> {
    fn text(&self) -> String {
        let mut text = self.metrics.render(&self.census());
        if let Some(nri) = &self.nri {
            let mut out = crate::publish::prometheus::Text::default();
            nri.render(&mut out);
            text.push_str(&out.into_text());
        }
        text
    }

    fn unready_reason(&self) -> Option<String> {
        self.metrics.unready_reason(&self.census()).or_else(|| self.nri.as_ref().and_then(|n| n.unready_reason()))
    }

    /// Ready or why not, and whether it serves through NRI: what `drafs
    /// check --installation` reads through the API server's pod proxy.
    fn status(&self) -> Option<serde_json::Value> {
        let reason = self.unready_reason();
        let nri = self.nri.as_ref().map(|n| n.current_link().to_json());
        Some(serde_json::json!({"ready": reason.is_none(), "reason": reason, "nri": nri}))
    }
}

/// Bytes used on the filesystem at `dir` (a volume's tmpfs).
fn used_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills the struct it is given; the path is NUL-terminated and outlives the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_blocks.saturating_sub(st.f_bfree)) as u64 * st.f_frsize as u64)
}

/// Where the registration socket is in `serve_sockets`' pair.
const REGISTRATION: usize = 1;

/// Make a missing socket again. The kubelet registers the agent anew through
/// a registration socket made again: until it confirms, `/readyz` says so.
fn remake(socket: &OwnSocket, registration: bool, metrics: &NodeMetrics) -> Option<UnixListener> {
    match socket.rebind() {
        Ok(listener) => {
            if registration {
                metrics.registration_pending();
            }
            info!(socket = %socket.path.display(), "the socket was gone: listening again");
            Some(listener)
        }
        Err(e) => {
            warn!(socket = %socket.path.display(), "the socket is gone and cannot be made again: {e}");
            None
        }
    }
}

/// Serve the endpoint and the registration socket until `stop` resolves,
/// making either again when it goes missing.
pub async fn serve_sockets<M: Mounts>(
    service: Arc<Service<M>>,
    endpoint: (Arc<OwnSocket>, UnixListener),
    registration: (Arc<OwnSocket>, UnixListener),
    stop: impl std::future::Future<Output = ()>,
) {
    let spawn = |listener: UnixListener| -> JoinHandle<()> { tokio::spawn(grpc::serve(listener, service.clone())) };
    // The endpoint first: the kubelet calls it as soon as it finds the registration socket.
    let mut served = [(endpoint.0, spawn(endpoint.1)), (registration.0, spawn(registration.1))];
    let mut ticks = tokio::time::interval(SOCKET_CHECK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    let mut replaced_told = [false, false];
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = ticks.tick() => {}
        }
        for (i, (socket, task)) in served.iter_mut().enumerate() {
            match socket.state() {
                SocketState::Ours => replaced_told[i] = false,
                SocketState::Missing => {
                    if let Some(listener) = remake(socket, i == REGISTRATION, &service.metrics) {
                        task.abort();
                        *task = spawn(listener);
                    }
                }
                SocketState::Replaced => {
                    if !std::mem::replace(&mut replaced_told[i], true) {
                        warn!(socket = %socket.path.display(), "another process listens at the socket now; it is left to it");
                    }
                }
            }
        }
    }
    for (_, task) in &served {
        task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_socket_is_known_by_its_inode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugins/drafs.dev/csi.sock");
        let (socket, listener) = OwnSocket::bind(&path).unwrap();
        assert_eq!(socket.state(), SocketState::Ours);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(socket.state(), SocketState::Missing);
        drop(listener);
        let _again = socket.rebind().unwrap();
        assert_eq!(socket.state(), SocketState::Ours);
        // Another agent binds the path (it replaces the socket file).
        let (newer, _newer_listener) = OwnSocket::bind(&path).unwrap();
        assert_eq!(socket.state(), SocketState::Replaced);
        socket.remove_if_ours();
        assert_eq!(newer.state(), SocketState::Ours, "the newer agent's socket is left to it");
        newer.remove_if_ours();
        assert!(!path.exists());
    }

    /// A registration socket made again is not ready until the kubelet has
    /// registered the agent through it again; the endpoint's changes nothing.
    #[tokio::test]
    async fn a_registration_socket_made_again_waits_for_the_kubelet_again() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = NodeMetrics::default();
        metrics.registration(true, "");
        let quiet = Census::default();
        for (name, registration) in [("csi.sock", false), ("drafs.dev-reg.sock", true)] {
            let path = dir.path().join(name);
            let (socket, _listener) = OwnSocket::bind(&path).unwrap();
            std::fs::remove_file(&path).unwrap();
            let _again = remake(&socket, registration, &metrics).expect("made again");
            assert_eq!(socket.state(), SocketState::Ours);
            let reason = metrics.unready_reason(&quiet);
            if registration {
                assert_eq!(reason.as_deref(), Some("the kubelet has not confirmed the registration yet"));
            } else {
                assert_eq!(reason, None, "the endpoint's socket does not need a registration");
            }
        }
        metrics.registration(true, "");
        assert_eq!(metrics.unready_reason(&quiet), None);
    }
}
