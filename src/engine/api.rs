//! The API server's vocabulary for the engine: how a request failed, and
//! how long the server keeps a watch open.

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
            ApiError::Failed { code, .. } => *code,
        }
    }

    pub fn is_watch(&self) -> bool {
        matches!(self, ApiError::Failed { verb: "watch", .. } | ApiError::Forbidden { verb: "watch", .. })
    }

    /// Name what failed: 403 and 401 by their meaning, the rest with the server's status or the transport error.
    pub fn classify(err: &kube::Error, verb: &'static str, resource: &str, scope: String) -> Self {
        let resource = resource.to_string();
        match err {
            kube::Error::Api(status) if status.code == 403 => {
                ApiError::Forbidden { verb, resource, scope, message: status.message.clone() }
            }
            kube::Error::Api(status) if status.code == 401 => {
                ApiError::Unauthorized { verb, resource, message: status.message.clone() }
            }
            kube::Error::Api(status) => ApiError::Failed {
                verb,
                resource,
                scope,
                message: format!("HTTP {} {}: {}", status.code, status.reason, status.message),
                code: Some(status.code),
            },
            other => ApiError::Failed { verb, resource, scope, message: error_chain(other), code: None },
        }
    }
}

/// An error and its causes on one line ("connection refused" is usually a cause).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
