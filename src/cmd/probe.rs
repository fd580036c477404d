//! `drafs probe`: is the tree at `--dir` there and ready (a startupProbe or
//! readinessProbe), and with `--healthy`, is no device reported Unhealthy?
//! One line on stdout, exit 0 when ready.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::cmd::Failure;
use crate::model::layout;
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
    let record = || std::fs::read(dir.join(layout::RECORD)).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    if !ready {
        return Err(Failure::Failed(format!("not ready: {}", not_ready_reason(dir, record().as_ref()))));
    }
    if config.healthy {
        let unhealthy = record().as_ref().map(unhealthy_devices).unwrap_or_default();
        if !unhealthy.is_empty() {
            return Err(Failure::Failed(format!("unhealthy: {}", unhealthy.join("; "))));
        }
    }
    println!("ready");
    Ok(())
}

fn not_ready_reason(dir: &Path, record: Option<&Value>) -> String {
    match record {
        Some(v) => v["missing"]
            .as_array()
            .map(|m| m.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join("; "))
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "resolution incomplete".into()),
        None if dir.join(layout::RECORD).exists() => "resolution incomplete".into(),
        None => format!("no tree at {} yet (not mounted or not written)", dir.display()),
    }
}

/// `claim/request/index (device): message` of every device reported Unhealthy in a `.json` record.
fn unhealthy_devices(record: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for claim in record["claims"].as_array().into_iter().flatten() {
        for device in claim["devices"].as_array().into_iter().flatten() {
            if device["health"]["state"] != "Unhealthy" {
                continue;
            }
            let request = device["request"].as_str().unwrap_or("?");
            let request = request.split('/').next().unwrap_or(request);
            let mut line = format!(
                "{}/{request}/{} ({}/{}/{}) is Unhealthy",
                claim["name"].as_str().unwrap_or("?"),
                device["index"],
                device["driver"].as_str().unwrap_or("?"),
                device["pool"].as_str().unwrap_or("?"),
                device["device"].as_str().unwrap_or("?"),
            );
            if let Some(message) = device["health"]["message"].as_str() {
                line += &format!(": {message}");
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

    #[test]
    fn only_unhealthy_devices_are_named_with_their_message() {
        let record = json!({"claims": [{"name": "gpus", "devices": [
            {"request": "gpu", "index": 0, "driver": "d", "pool": "p", "device": "g0", "health": {"state": "Healthy"}},
            {"request": "gpu/large", "index": 1, "driver": "d", "pool": "p", "device": "g1",
             "health": {"state": "Unhealthy", "message": "XID 79"}},
            {"request": "gpu", "index": 2, "driver": "d", "pool": "p", "device": "g2", "health": {"state": "Unknown"}},
            {"request": "gpu", "index": 3, "driver": "d", "pool": "p", "device": "g3"}]}]});
        assert_eq!(unhealthy_devices(&record), ["gpus/gpu/1 (d/p/g1) is Unhealthy: XID 79"]);
        assert!(unhealthy_devices(&json!({"claims": "not a list"})).is_empty());
    }
}
