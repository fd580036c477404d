//! Kubernetes Events on the pod, so `kubectl describe pod` tells why drafs is
//! (not) ready. Needs `create events`, granted by the optional Role in
//! `drafs manifests rbac --events`; when forbidden, drafs says so once and goes on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tracing::{debug, warn};

use crate::model::PodRef;
use crate::publish::call::bounded;

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
/// An Event is a courtesy: it never holds up the run for long.
const EVENT_TIMEOUT: Duration = Duration::from_secs(2);

/// Events waiting to be sent at most; newer ones are dropped while the queue
/// is full (as client-go's recorder does), and the log says so once. Each
/// waits up to 2 s for the API server, so events that come faster than a slow
/// server takes them (a device whose health flaps, with `--ready-when-healthy`:
/// a Warning per flap, and a Normal one with `--events=all`) grew the queue
/// without bound.
pub const QUEUED_MAX: usize = 32;

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
    tx: Option<tokio::sync::mpsc::Sender<Note>>,
    task: Option<tokio::task::JoinHandle<()>>,
    mode: EventsMode,
    /// Events dropped because [`QUEUED_MAX`] were waiting.
    dropped: AtomicU64,
}

impl Events {
    /// No events at all (`get`, `exec`, or `--events=none`).
    pub fn none() -> Self {
        Events { tx: None, task: None, mode: EventsMode::None, dropped: AtomicU64::new(0) }
    }

    pub fn start(client: Client, pod: PodRef, mode: EventsMode) -> Self {
        if mode == EventsMode::None {
            return Events::none();
        }
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Note>(QUEUED_MAX);
        let mut recorder = Recorder { api: Api::namespaced(client, &pod.namespace), pod, enabled: true };
        let task = tokio::spawn(async move {
            while let Some(note) = rx.recv().await {
                recorder.emit(&note).await;
            }
        });
        Events { tx: Some(tx), task: Some(task), mode, dropped: AtomicU64::new(0) }
    }

    /// Queue `note` if the mode records it (Normal events only with `all`),
    /// unless [`QUEUED_MAX`] wait already.
    pub fn record(&self, note: Note) {
        if !note.warning && self.mode != EventsMode::All {
            return;
        }
        let Some(tx) = &self.tx else { return };
        if let Err(tokio::sync::mpsc::error::TrySendError::Full(note)) = tx.try_send(note)
            && self.dropped.fetch_add(1, Ordering::Relaxed) == 0
        {
            warn!(
                reason = note.reason,
                "{QUEUED_MAX} events wait to be recorded (is the API server slow?): newer ones are dropped until they are sent"
            );
        }
    }

    /// Events dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
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
        match bounded(EVENT_TIMEOUT, self.api.create(&PostParams::default(), &event)).await {
            Ok(_) => debug!(reason, "event recorded"),
            Err(e) if e.is_forbidden() => {
                warn!(
                    "cannot create events ({}); grant it (drafs manifests rbac --namespace NS --events) to see drafs in `kubectl describe pod`",
                    e.message()
                );
                self.enabled = false;
            }
            Err(e) => warn!(reason, "event not recorded: {e}"),
        }
    }
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_flood_of_events_waits_in_a_bounded_queue() {
        // An API server that accepts connections and never answers.
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = kube::Config::new(format!("http://{}", server.local_addr().unwrap()).parse().unwrap());
        let pod = PodRef { namespace: "ns".into(), name: "p".into() };
        let events = Events::start(Client::try_from(config).unwrap(), pod, EventsMode::All);
        // A device whose health flaps: a Warning and a Normal event per flap.
        for i in 0..10_000 {
            let (warning, reason) = if i % 2 == 0 { (true, NOT_READY) } else { (false, READY) };
            events.record(Note { warning, reason, message: format!("flap {i}"), uid: None });
        }
        let tx = events.tx.as_ref().unwrap();
        assert_eq!(tx.max_capacity() - tx.capacity(), QUEUED_MAX, "what waits is bounded");
        assert_eq!(events.dropped(), (10_000 - QUEUED_MAX) as u64, "the rest is dropped, and counted");
    }
}
