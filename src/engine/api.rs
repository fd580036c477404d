//! The API server's vocabulary for the engine: how a request failed, how
//! long the server keeps a watch open, and the metadata every object has.

use std::time::Duration;

use crate::engine::store::Scope;
use crate::publish::call::CallError;

/// A watch silent this long (no event, no bookmark, no close) is restarted:
/// two and a half of the API server's bookmark periods (about a minute).
pub const WATCH_IDLE: Duration = Duration::from_secs(150);

/// The server closes each watch after a random time between these (as
/// client-go's reflector asks: 5 to 10 minutes), and drafs resumes it from the
/// last version. Random, so that watches opened together (a job's pods
/// started at once) do not re-open together.
pub const WATCH_SECONDS_MIN: u32 = 300;
pub const WATCH_SECONDS_MAX: u32 = 600;

/// Errors talking to the API server. Only `Failed` is worth retrying.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    #[error(
        "forbidden: the service account may not {verb} {resource}{scope} ({message}); grant it: drafs manifests rbac --namespace NS | kubectl apply -f -"
    )]
    Forbidden { verb: &'static str, resource: String, scope: String, message: String },
    #[error(
        "unauthorized: the API server rejected the credentials for {verb} {resource} ({message}); check the service account token or kubeconfig"
    )]
    Unauthorized { verb: &'static str, resource: String, message: String },
    #[error(
        "pod {namespace}/{name} not found; set POD_NAME and POD_NAMESPACE from the downward API (metadata.name, metadata.namespace) or pass --pod-name/--pod-namespace"
    )]
    PodNotFound { namespace: String, name: String },
    /// The pod of that name is not the one served (deleted and made again
    /// with the same name, as a StatefulSet's are): its devices are another pod's.
    #[error(
        "pod {namespace}/{name} is another pod now (uid {found}), not the one this volume belongs to (uid {expected}); its devices are not served here"
    )]
    OtherPod { namespace: String, name: String, found: String, expected: String },
    #[error("cannot {verb} {resource}{scope}: {message}")]
    Failed { verb: &'static str, resource: String, scope: String, message: String, code: Option<u16> },
}

impl ApiError {
    pub fn is_fatal(&self) -> bool {
        !matches!(self, ApiError::Failed { .. })
    }

    /// The HTTP status the API server answered with, if it answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiError::Forbidden { .. } => Some(403),
            ApiError::Unauthorized { .. } => Some(401),
            ApiError::PodNotFound { .. } => Some(404),
            ApiError::OtherPod { .. } => None,
            ApiError::Failed { code, .. } => *code,
        }
    }

    pub fn is_watch(&self) -> bool {
        matches!(self, ApiError::Failed { verb: "watch", .. } | ApiError::Forbidden { verb: "watch", .. })
    }

    /// Name what failed: 403 and 401 by their meaning, the rest with the
    /// server's status, the stall or the transport error.
    pub fn named(err: CallError, verb: &'static str, resource: &str, scope: String) -> Self {
        let resource = resource.to_string();
        match err {
            CallError::Status { code: 403, message, .. } => ApiError::Forbidden { verb, resource, scope, message },
            CallError::Status { code: 401, message, .. } => ApiError::Unauthorized { verb, resource, message },
            other => ApiError::Failed { verb, resource, scope, code: other.code(), message: other.to_string() },
        }
    }

    /// [`ApiError::named`] for a list or watch of `scope`: its resource and
    /// field selector name it.
    pub fn named_on(err: CallError, verb: &'static str, scope: &Scope) -> Self {
        Self::named(err, verb, scope.resource(), selector_text(scope))
    }

    /// A list or watch of `scope` that failed without a status: `message` says why.
    pub fn failed_on(verb: &'static str, scope: &Scope, message: String) -> Self {
        ApiError::Failed { verb, resource: scope.resource().into(), scope: selector_text(scope), message, code: None }
    }
}

/// How an error names a scope after its resource: " (field selector)".
fn selector_text(scope: &Scope) -> String {
    format!(" ({})", scope.field_selector())
}

/// Name and resource version of an object, reading nothing else.
pub(crate) fn object_meta(raw: &str) -> Option<(String, Option<String>)> {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(default)]
        name: Option<String>,
        #[serde(default, rename = "resourceVersion")]
        resource_version: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Object {
        metadata: Meta,
    }
    let object: Object = serde_json::from_str(raw).ok()?;
    Some((object.metadata.name.unwrap_or_default(), object.metadata.resource_version))
}
