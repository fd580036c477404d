//! A list and a watch of one collection of the API server, each object handed
//! over as the JSON the server sent: the process-wide followers (the node's
//! slices, shared by every run; the node's pods, watched by the node agent)
//! keep or look at what they need of it, and decode nothing else.

use futures::{AsyncBufReadExt, StreamExt};
use kube::Client;
use kube::api::{ListParams, WatchParams};
use kube::core::Request;

use crate::engine::api::ApiError;
use crate::engine::source::{WATCH_IDLE, object_meta};
use crate::model::slices::{RawEvent, RawList};
use crate::publish::call::{REQUEST_TIMEOUT, bounded};

/// A collection and the field selector that narrows it (what errors name).
#[derive(Debug, Clone)]
pub struct Collection {
    /// The collection's path (`/apis/resource.k8s.io/v1/resourceslices`).
    pub url: &'static str,
    /// Its resource, as RBAC names it (`resourceslices`).
    pub resource: &'static str,
    pub field_selector: String,
}

/// One change a watch reported.
pub enum WatchChange<'a> {
    /// Added or modified: the object's JSON.
    Put(&'a str),
    Deleted(&'a str),
}

impl Collection {
    fn failed(&self, verb: &'static str, message: String) -> ApiError {
        ApiError::Failed {
            verb,
            resource: self.resource.into(),
            scope: format!(" ({})", self.field_selector),
            message,
            code: None,
        }
    }

    /// Every object, page by page, each handed to `each` (an `Err` from it
    /// ends the list as malformed); the list's resource version.
    pub async fn list(
        &self,
        client: &Client,
        page_size: u32,
        mut each: impl FnMut(&str) -> Result<(), String>,
    ) -> Result<String, ApiError> {
        let mut continue_token = None;
        loop {
            let params = ListParams {
                field_selector: Some(self.field_selector.clone()),
                limit: Some(page_size),
                continue_token: continue_token.take(),
                ..Default::default()
            };
            let request = Request::new(self.url).list(&params).map_err(|e| self.failed("list", e.to_string()))?;
            let body = bounded(REQUEST_TIMEOUT, client.request_text(request))
                .await
                .map_err(|e| ApiError::named(e, "list", self.resource, format!(" ({})", self.field_selector)))?;
            let page: RawList =
                serde_json::from_str(&body).map_err(|e| self.failed("list", format!("malformed: {e}")))?;
            for raw in page.items {
                each(raw.get()).map_err(|e| self.failed("list", e))?;
            }
            continue_token = page.metadata.continue_token.filter(|t| !t.is_empty());
            if continue_token.is_none() {
                return Ok(page.metadata.resource_version.unwrap_or_default());
            }
        }
    }

    /// One watch from `resource_version` (bookmarks asked for), each change
    /// handed to `each`; the last version seen when the server closed it
    /// (None: the version expired, list again).
    pub async fn watch(
        &self,
        client: &Client,
        resource_version: &str,
        seconds: u32,
        mut each: impl FnMut(WatchChange<'_>) -> Result<(), String>,
    ) -> Result<Option<String>, ApiError> {
        let params = WatchParams {
            field_selector: Some(self.field_selector.clone()),
            timeout: Some(seconds),
            bookmarks: true,
            ..Default::default()
        };
        let request =
            Request::new(self.url).watch(&params, resource_version).map_err(|e| self.failed("watch", e.to_string()))?;
        let stream = bounded(REQUEST_TIMEOUT, client.request_stream(request))
            .await
            .map_err(|e| ApiError::named(e, "watch", self.resource, format!(" ({})", self.field_selector)))?;
        let mut lines = std::pin::pin!(stream.lines());
        let mut last = resource_version.to_string();
        loop {
            let line = match tokio::time::timeout(WATCH_IDLE, lines.next()).await {
                Err(_) => return Err(self.failed("watch", "silent too long".into())),
                Ok(None) => return Ok(Some(last)),
                Ok(Some(Err(e))) => return Err(self.failed("watch", e.to_string())),
                Ok(Some(Ok(line))) if line.trim().is_empty() => continue,
                Ok(Some(Ok(line))) => line,
            };
            let event: RawEvent =
                serde_json::from_str(&line).map_err(|e| self.failed("watch", format!("malformed: {e}")))?;
            let object = event.object.get();
            match event.kind.as_str() {
                "ADDED" | "MODIFIED" => each(WatchChange::Put(object)).map_err(|e| self.failed("watch", e))?,
                "DELETED" => each(WatchChange::Deleted(object)).map_err(|e| self.failed("watch", e))?,
                "ERROR" => return Ok(None),
                _ => {}
            }
            if let Some(rv) = object_meta(object).and_then(|(_, rv)| rv) {
                last = rv;
            }
        }
    }
}
