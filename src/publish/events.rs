//! Kubernetes Events on the pod, so `kubectl describe pod` tells why drafs is
//! (not) ready. Needs `create events`, granted by the optional Role in
//! `drafs manifests rbac --events`; when forbidden, drafs says so once and goes on.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tracing::{debug, warn};

use crate::model::PodRef;

/// Which Events drafs records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventsMode {
    All,
    Warnings,
    None,
}

pub const READY: &str = "DeviceAttributesReady";
pub const NOT_READY: &str = "DeviceAttributesNotReady";

/// Longest message sent; the API server rejects longer ones for events.k8s.io.
const MAX_MESSAGE: usize = 1024;

/// One event to record.
#[derive(Debug, Clone)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
    /// The pod's uid, when known, ties the event to this incarnation of the pod.
    pub uid: Option<String>,
}

/// Queues events to a background task, so recording never blocks serving.
pub struct Events {
    tx: Option<tokio::sync::mpsc::UnboundedSender<Note>>,
    task: Option<tokio::task::JoinHandle<()>>,
    mode: EventsMode,
}

impl Events {
    /// No events at all (`get`, `exec`, or `--events=none`).
    pub fn none() -> Self {
        Events { tx: None, task: None, mode: EventsMode::None }
    }

    pub fn start(client: Client, pod: PodRef, mode: EventsMode) -> Self {
        if mode == EventsMode::None {
            return Events::none();
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Note>();
        let mut recorder = Recorder { api: Api::namespaced(client, &pod.namespace), pod, enabled: true };
        let task = tokio::spawn(async move {
            while let Some(note) = rx.recv().await {
                recorder.emit(&note).await;
            }
        });
        Events { tx: Some(tx), task: Some(task), mode }
    }

    /// Queue `note` if the mode records it (Normal events only with `all`).
    pub fn record(&self, note: Note) {
        if !note.warning && self.mode != EventsMode::All {
            return;
        }
        if let Some(tx) = &self.tx {
            let _ = tx.send(note);
        }
    }

    /// Wait until the queued events are sent (each bounded by a 2 s timeout).
    pub async fn finish(mut self) {
        self.tx.take();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

struct Recorder {
    api: Api<Event>,
    pod: PodRef,
    enabled: bool,
}

impl Recorder {
    async fn emit(&mut self, note: &Note) {
        let (type_, reason, message, uid) =
            (if note.warning { "Warning" } else { "Normal" }, note.reason, &note.message, &note.uid);
        if !self.enabled {
            return;
        }
        let now = jiff_now();
        let mut message = message.to_string();
        if message.len() > MAX_MESSAGE {
            let mut cut = MAX_MESSAGE - 3;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str("...");
        }
        let event = Event {
            metadata: ObjectMeta { generate_name: Some(format!("{}.drafs-", self.pod.name)), ..Default::default() },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(self.pod.name.clone()),
                namespace: Some(self.pod.namespace.clone()),
                uid: uid.clone(),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message),
            type_: Some(type_.into()),
            source: Some(EventSource { component: Some("drafs".into()), host: None }),
            reporting_component: Some("drafs".into()),
            reporting_instance: Some(self.pod.name.clone()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            action: Some(if type_ == "Normal" { "Resolved".into() } else { "Resolving".into() }),
            count: Some(1),
            ..Default::default()
        };
        match tokio::time::timeout(Duration::from_secs(2), self.api.create(&PostParams::default(), &event)).await {
            Ok(Ok(_)) => debug!(reason, "event recorded"),
            Ok(Err(kube::Error::Api(status))) if status.code == 403 => {
                warn!(
                    "cannot create events ({}); grant it (drafs manifests rbac --namespace NS --events) to see drafs in `kubectl describe pod`",
                    status.message
                );
                self.enabled = false;
            }
            Ok(Err(e)) => warn!(reason, "event not recorded: {e}"),
            Err(_) => warn!(reason, "event not recorded: the API server did not answer within 2s"),
        }
    }
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}
