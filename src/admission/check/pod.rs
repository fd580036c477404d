//! The pod check: what the pod's drafs container reports (its state, exit
//! code, termination message, readiness, restarts) and the last Event drafs
//! recorded for it.

use serde_json::{Value, json};

use super::{Check, Status, one_line};
use crate::admission::inject;
use crate::publish::events::{NOT_READY, READY};

/// The drafs container of a pod (an init container, native sidecar or not), if it has one.
pub fn drafs_container(pod: &Value) -> Option<&Value> {
    ["initContainers", "containers"]
        .iter()
        .flat_map(|k| pod["spec"][*k].as_array().into_iter().flatten())
        .find(|c| c["name"] == inject::CONTAINER)
}

/// Whether the container is a native sidecar (an init container that keeps
/// running beside the app), as `inject` adds drafs in the sidecar modes.
pub(super) fn is_sidecar(container: &Value) -> bool {
    container["restartPolicy"] == "Always"
}

fn container_status<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    ["initContainerStatuses", "containerStatuses"]
        .iter()
        .flat_map(|k| pod["status"][*k].as_array().into_iter().flatten())
        .find(|s| s["name"] == name)
}

/// The time an Event last happened, for ordering (RFC 3339 text sorts).
fn event_time(event: &Value) -> String {
    ["eventTime", "lastTimestamp", "firstTimestamp"]
        .iter()
        .find_map(|k| event[*k].as_str())
        .or_else(|| event["metadata"]["creationTimestamp"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Whether drafs recorded the Event.
fn by_drafs(event: &Value) -> bool {
    event["reportingComponent"] == "drafs"
        || event["source"]["component"] == "drafs"
        || event["reason"] == READY
        || event["reason"] == NOT_READY
}

/// The pod check: what the drafs container reports (its state, exit code,
/// termination message, readiness, restarts) and the last Event drafs recorded.
pub fn pod_status(pod: &Value, events: &[Value]) -> Check {
    let Some(container) = drafs_container(pod) else {
        return Check::new("pod", Status::Skip, "no drafs container in the pod", json!({"container": null}));
    };
    let sidecar = is_sidecar(container);
    let last = events.iter().filter(|e| by_drafs(e)).max_by_key(|e| event_time(e));
    let last_event = last.map(|e| {
        json!({"type": e["type"], "reason": e["reason"], "message": one_line(e["message"].as_str().unwrap_or_default()),
               "time": event_time(e)})
    });
    let status = container_status(pod, inject::CONTAINER);
    let mut details = json!({
        "container": inject::CONTAINER,
        "sidecar": sidecar,
        "state": null, "reason": null, "exitCode": null, "message": null,
        "ready": status.map(|s| s["ready"].as_bool().unwrap_or(false)),
        "restarts": status.map(|s| s["restartCount"].as_i64().unwrap_or(0)),
        "lastEvent": last_event,
    });
    let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
    let (mut verdict, mut message) = match status {
        None => (Status::Warn, format!("drafs has not started yet (pod phase {phase})")),
        Some(s) => {
            let restarts = s["restartCount"].as_i64().unwrap_or(0);
            let ready = s["ready"].as_bool().unwrap_or(false);
            let state = &s["state"];
            let last_term = &s["lastState"]["terminated"];
            let terminated = |t: &Value| {
                let code = t["exitCode"].as_i64().unwrap_or(-1);
                let text = one_line(t["message"].as_str().unwrap_or_default());
                let reason = t["reason"].as_str().unwrap_or_default();
                (code, if text.is_empty() { reason.to_string() } else { text })
            };
            if let Some(t) = state.get("terminated").filter(|t| t.is_object()) {
                let (code, text) = terminated(t);
                details["state"] = json!("terminated");
                details["exitCode"] = json!(code);
                details["message"] = json!(text);
                details["reason"] = t["reason"].clone();
                if code == 0 && !sidecar {
                    (Status::Ok, "drafs finished: exit 0, the tree is written".to_string())
                } else if code == 0 {
                    (Status::Warn, "drafs (sidecar) exited 0: the tree is no longer kept current".to_string())
                } else {
                    (Status::Fail, format!("drafs exited {code}: {text}"))
                }
            } else if let Some(w) = state.get("waiting").filter(|w| w.is_object()) {
                let reason = w["reason"].as_str().unwrap_or("Waiting").to_string();
                details["state"] = json!("waiting");
                details["reason"] = json!(reason);
                let previous = last_term.is_object().then(|| terminated(last_term));
                if let Some((code, text)) = &previous {
                    details["exitCode"] = json!(code);
                    details["message"] = json!(text);
                }
                match (reason.as_str(), previous) {
                    ("CrashLoopBackOff", Some((code, text))) => (
                        Status::Fail,
                        format!("drafs is crash-looping ({restarts} restarts), last exit {code}: {text}"),
                    ),
                    ("CrashLoopBackOff", None) => {
                        (Status::Fail, format!("drafs is crash-looping ({restarts} restarts)"))
                    }
                    (r, _) if r.contains("Err") || r.contains("BackOff") || r.contains("Invalid") => {
                        let text = one_line(w["message"].as_str().unwrap_or_default());
                        (Status::Fail, format!("drafs cannot start: {r} {text}").trim_end().to_string())
                    }
                    (r, _) => (Status::Warn, format!("drafs is waiting: {r}")),
                }
            } else if state.get("running").is_some_and(Value::is_object) {
                details["state"] = json!("running");
                match (sidecar, ready) {
                    (true, true) => (Status::Ok, format!("drafs is running and ready ({restarts} restarts)")),
                    (true, false) => (Status::Warn, "drafs is running, not ready yet (waiting for the devices)".into()),
                    (false, _) => (Status::Warn, "drafs is running: still waiting for the devices".into()),
                }
            } else {
                (Status::Warn, format!("drafs has no state yet (pod phase {phase})"))
            }
        }
    };
    if let Some(e) = last {
        let text = one_line(e["message"].as_str().unwrap_or_default());
        let reason = e["reason"].as_str().unwrap_or_default();
        if e["type"] == "Warning" {
            message.push_str(&format!("; last event: {reason}: {text}"));
            if verdict == Status::Ok {
                verdict = Status::Warn;
            }
        } else {
            message.push_str(&format!("; last event: {reason}"));
        }
    }
    Check::new("pod", verdict, message, details)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::check::tests::pod;

    #[test]
    fn the_drafs_container_state_in_one_line() {
        let init = json!({"name": "drafs", "args": ["init"]});
        let with_status = |status: Value| {
            let mut p = pod(json!({}), true, Some(init.clone()));
            p["status"] = json!({"phase": "Pending", "initContainerStatuses": [status]});
            p
        };
        let c = pod_status(
            &with_status(json!({"name": "drafs", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "not ready after 5m:\nclaim gpu\tnot allocated"}}})),
            &[],
        );
        assert_eq!(
            (c.status, c.message.as_str()),
            (Status::Fail, "drafs exited 1: not ready after 5m: claim gpu not allocated")
        );
        assert_eq!(c.details["exitCode"], 1);
        let c = pod_status(
            &with_status(json!({"name": "drafs", "ready": true, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}})),
            &[],
        );
        assert_eq!(c.status, Status::Ok);
        let events = [
            json!({"type": "Normal", "reason": READY, "message": "ready", "eventTime": "2026-01-01T00:00:00.000000Z"}),
            json!({"type": "Warning", "reason": NOT_READY, "message": "values\nlost", "eventTime": "2026-01-01T00:00:05.000000Z"}),
            json!({"type": "Warning", "reason": "Other", "message": "someone else's", "eventTime": "2026-01-01T00:00:09.000000Z"}),
        ];
        let c = pod_status(
            &with_status(json!({"name": "drafs", "ready": true, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0}}})),
            &events,
        );
        assert_eq!(c.status, Status::Warn);
        assert!(c.message.ends_with("; last event: DeviceAttributesNotReady: values lost"), "{}", c.message);
        let c = pod_status(
            &with_status(json!({"name": "drafs", "ready": false, "restartCount": 4,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": {"terminated": {"exitCode": 1, "message": "forbidden"}}})),
            &[],
        );
        assert_eq!(
            (c.status, c.message.as_str()),
            (Status::Fail, "drafs is crash-looping (4 restarts), last exit 1: forbidden")
        );
        let c = pod_status(&pod(json!({}), true, Some(init.clone())), &[]);
        assert_eq!(c.status, Status::Warn);
        assert_eq!(pod_status(&pod(json!({}), true, None), &[]).status, Status::Skip);
    }
}
