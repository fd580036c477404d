//! `drafs probe`: is the tree at `--dir` there and ready (a startupProbe or
//! readinessProbe), and with `--healthy`, is no device reported Unhealthy?
//! One line on stdout, exit 0 when ready.

use std::path::{Path, PathBuf};

use crate::cmd::Failure;
use crate::cmd::get::printable_bounded;
use crate::model::layout;
use crate::model::record::Record;
use crate::publish::fuse::is_stale_mount;

/// What `probe` checks.
#[derive(Debug)]
pub struct Config {
    pub dir: PathBuf,
    /// Fail while a device's health is Unhealthy.
    pub healthy: bool,
}

/// `probe`: one line on stdout, exit 0 when ready.
pub fn run(config: &Config) -> Result<(), Failure> {
    let dir = config.dir.as_path();
    if is_stale_mount(dir) {
        return Err(Failure::Failed(format!("{} is a stale FUSE mount (its server is gone)", dir.display())));
    }
    let ready = dir.join(layout::READY).exists();
    // The record is read only when needed (a ready probe without --healthy is
    // one stat), and once: it is one consistent tree, whatever changes meanwhile.
    let record =
        || std::fs::read(dir.join(layout::RECORD)).ok().and_then(|b| serde_json::from_slice::<Record>(&b).ok());
    // Everything said comes from the cluster (a driver's message, a claim's
    // name): escaped, and bounded, for a terminal and the kubelet's events.
    if !ready {
        let reason = printable_bounded(&not_ready_reason(dir, record().as_ref()), MAX_LINE);
        return Err(Failure::Failed(format!("not ready: {reason}")));
    }
    if config.healthy {
        let unhealthy = record().as_ref().map(unhealthy_devices).unwrap_or_default();
        if !unhealthy.is_empty() {
            return Err(Failure::Failed(format!("unhealthy: {}", printable_bounded(&unhealthy.join("; "), MAX_LINE))));
        }
    }
    println!("ready");
    Ok(())
}

/// The most characters of cluster text a probe line holds.
const MAX_LINE: usize = 1024;
/// The most characters of one driver's health message.
const MAX_MESSAGE: usize = 256;

fn not_ready_reason(dir: &Path, record: Option<&Record>) -> String {
    match record {
        Some(r) if !r.missing.is_empty() => r.missing.join("; "),
        Some(_) => "resolution incomplete".into(),
        None if dir.join(layout::RECORD).exists() => "resolution incomplete".into(),
        None => format!("no tree at {} yet (not mounted or not written)", dir.display()),
    }
}

/// `claim/directory/index (device): message` of every device reported Unhealthy in a `.json` record.
fn unhealthy_devices(record: &Record) -> Vec<String> {
    let mut out = Vec::new();
    for claim in &record.claims {
        for device in claim.devices.iter().filter(|d| d.is_unhealthy()) {
            let mut line = format!(
                "{}/{}/{} ({}/{}/{}) is Unhealthy",
                claim.name,
                device.directory(),
                device.index,
                device.driver,
                device.pool,
                device.device,
            );
            if let Some(message) = device.health.as_ref().and_then(|h| h.message.as_deref()) {
                line += &format!(": {}", printable_bounded(message, MAX_MESSAGE));
            }
            out.push(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(v: serde_json::Value) -> Record {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_unhealthy_devices_are_named_with_their_message() {
        let record = record(json!({"claims": [{"name": "gpus", "devices": [
            {"request": "gpu", "index": 0, "driver": "d", "pool": "p", "device": "g0", "health": {"state": "Healthy"}},
            {"request": "gpu/large", "index": 1, "driver": "d", "pool": "p", "device": "g1",
             "health": {"state": "Unhealthy", "message": "XID 79"}},
            {"request": "gpu", "index": 2, "driver": "d", "pool": "p", "device": "g2", "health": {"state": "Unknown"}},
            {"request": "gpu", "index": 3, "driver": "d", "pool": "p", "device": "g3"}]}]}));
        assert_eq!(unhealthy_devices(&record), ["gpus/gpu/1 (d/p/g1) is Unhealthy: XID 79"]);
        assert!(serde_json::from_value::<Record>(json!({"claims": "not a list"})).is_err());
    }

    #[test]
    fn messages_are_escaped_and_bounded_and_extended_resources_named_by_container() {
        let hostile = format!("\u{1b}[2J\u{1b}]0;owned\u{7}{}", "x".repeat(100_000));
        let record = record(json!({"claims": [{"name": "nvidia.com/gpu", "extendedResource": true, "devices": [
            {"request": "container-1-request-0", "container": "trainer", "index": 0, "driver": "d", "pool": "p",
             "device": "g0", "health": {"state": "Unhealthy", "message": hostile}}]}]}));
        let lines = unhealthy_devices(&record);
        assert!(
            lines[0].starts_with("nvidia.com/gpu/trainer/0 (d/p/g0) is Unhealthy: \\u{1b}[2J"),
            "{}",
            &lines[0][..80]
        );
        assert!(!lines[0].contains('\u{1b}') && !lines[0].contains('\u{7}'));
        assert!(lines[0].chars().count() < 400, "{}", lines[0].len());
    }
}
