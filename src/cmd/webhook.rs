//! `drafs webhook`: serve the mutating admission webhook until stopped, then
//! drain the reviews in flight.

use tracing::info;

use crate::admission::webhook::{Config, Webhook};
use crate::cmd::cli::WebhookArgs;
use crate::cmd::{Failure, Stop, usage};

pub fn config(args: &WebhookArgs) -> Result<Config, Failure> {
    Ok(Config {
        addr: args.addr,
        cert: args.tls_cert.clone(),
        key: args.tls_key.clone(),
        image: args.image.clone(),
        metrics_addr: args.metrics_addr,
        drain: args.drain,
        dns_names: args.dns_names.clone(),
        namespace_mode: args.namespace_mode.into(),
        csi_driver: args.csi.csi_driver.clone(),
        resources: args.resources.resources().map_err(Failure::Usage)?,
        platform_uid: args.platform_uid,
    })
}

/// Bind (bad addresses and certificates fail here, with exit 2), then serve;
/// a stop drains the reviews in flight instead of dropping them.
pub async fn run(config: Config, stop: Stop) -> Result<(), Failure> {
    let server = Webhook::bind(&config).await.map_err(usage)?;
    server
        .serve(async {
            let signal = stop.signalled().await;
            info!("{signal}: stopping");
        })
        .await;
    Ok(())
}
