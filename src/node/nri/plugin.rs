//! The plugin's life beside the runtime: connect to its NRI socket, register,
//! and serve its calls (Configure, Synchronize, then the events) until the
//! connection ends; then connect again, as often as the runtime restarts.
//! Without a socket at the path (a runtime without NRI) it looks again now
//! and then and stays out of the agent's readiness.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tracing::{info, warn};

use crate::model::backoff::RetryBackoff;
use crate::node::mounts::Mounts;
use crate::node::nri::api::{self, RUNTIME_SERVICE};
use crate::node::nri::door::NriDoor;
use crate::node::nri::metrics::Link;
use crate::node::nri::wire::Connection;

/// How the plugin joins the runtime.
#[derive(Debug, Clone)]
pub struct PluginSettings {
    /// The runtime's NRI socket.
    pub socket: PathBuf,
    /// The plugin's name, as the runtime logs it.
    pub name: String,
    /// Two digits: the plugin's place among the runtime's plugins (they are
    /// called in this order).
    pub index: String,
}

/// How long registering may take (the runtime's own limit is 5 s).
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a missing socket is looked for again.
const SOCKET_CHECK: Duration = Duration::from_secs(5);
/// The longest wait between tries to join a runtime that refuses.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Join the runtime and serve it, forever (drop the future to stop).
pub async fn serve<M: Mounts>(door: Arc<NriDoor<M>>, settings: PluginSettings) {
    let mut retry = RetryBackoff::default();
    loop {
        if !settings.socket.exists() {
            if door.metrics.current_link() != Link::NoSocket {
                info!(socket = %settings.socket.display(), "NRI: no runtime socket; containers are not served through NRI until it is back");
            }
            door.metrics.link(Link::NoSocket);
            tokio::time::sleep(SOCKET_CHECK).await;
            continue;
        }
        door.metrics.link(Link::Joining(format!("connecting to {}", settings.socket.display())));
        let trouble = match join(&door, &settings).await {
            Ok(connection) => {
                retry.reset();
                let ended = connection.closed().await;
                warn!("NRI: {ended}; joining again");
                format!("the connection ended: {ended}")
            }
            Err(why) => {
                warn!(socket = %settings.socket.display(), "NRI: cannot join the runtime: {why}");
                why
            }
        };
        door.metrics.link(Link::Failing(trouble));
        tokio::time::sleep(retry.next().unwrap_or(RETRY_MAX).min(RETRY_MAX)).await;
    }
}

/// Connect and register; the runtime then configures and synchronizes the
/// plugin on the connection returned.
async fn join<M: Mounts>(door: &Arc<NriDoor<M>>, settings: &PluginSettings) -> Result<Arc<Connection>, String> {
    let socket = tokio::net::UnixStream::connect(&settings.socket).await.map_err(|e| e.to_string())?;
    let connection = Connection::start(socket, door.clone());
    door.metrics.link(Link::Joining("registering".into()));
    let request = api::RegisterPluginRequest {
        plugin_name: settings.name.clone(),
        plugin_idx: settings.index.clone(),
        nri_version: String::new(),
    };
    connection
        .call(RUNTIME_SERVICE, "RegisterPlugin", request.encode_to_vec(), REGISTER_TIMEOUT)
        .await
        .map_err(|e| format!("the runtime refused the registration: {}", e.message))?;
    info!(name = %settings.name, index = %settings.index, "NRI: registered with the runtime");
    Ok(connection)
}
