//! One request to the API server, bounded in time, and how it ended: the one
//! place where a `kube::Error` or a stall becomes something drafs can branch
//! on and print. Every caller (the engine's lists and watches, the shared
//! slice watch, Events, `drafs check`) goes through [`bounded`]; the engine
//! names the request in `ApiError`, `check` reports it as it is.

use std::future::Future;
use std::time::Duration;

/// Longest wait for one request's answer (a watch: for its first byte), unless
/// the caller has less time left.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How a request failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CallError {
    /// The API server answered with this status (403: the caller may not).
    #[error("HTTP {code} {reason}: {message}")]
    Status { code: u16, reason: String, message: String },
    /// No answer in time: the API server is stalled or unreachable.
    #[error("no answer within {} ms (the API server is stalled or unreachable)", .0.as_millis())]
    Timeout(Duration),
    /// No answer at all: the connection, TLS or the response's decoding
    /// failed (the error and its causes, on one line).
    #[error("{0}")]
    Transport(String),
}

impl CallError {
    /// The HTTP status the API server answered with, if it answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            CallError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub fn is_forbidden(&self) -> bool {
        self.code() == Some(403)
    }

    /// The server's own message for a status, the whole text otherwise.
    pub fn message(&self) -> String {
        match self {
            CallError::Status { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }
}

impl From<kube::Error> for CallError {
    fn from(err: kube::Error) -> Self {
        match err {
            kube::Error::Api(status) => {
                CallError::Status { code: status.code, reason: status.reason, message: status.message }
            }
            other => CallError::Transport(error_chain(&other)),
        }
    }
}

/// `work`, given at most `limit` to answer.
pub async fn bounded<T>(limit: Duration, work: impl Future<Output = Result<T, kube::Error>>) -> Result<T, CallError> {
    match tokio::time::timeout(limit, work).await {
        Ok(result) => result.map_err(CallError::from),
        Err(_) => Err(CallError::Timeout(limit)),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stall_is_a_timeout_and_a_status_keeps_its_code_and_message() {
        let stalled = bounded::<()>(Duration::from_millis(5), std::future::pending()).await;
        assert_eq!(stalled, Err(CallError::Timeout(Duration::from_millis(5))));
        assert!(stalled.unwrap_err().to_string().contains("no answer within 5 ms"));

        let status = kube::core::Status::failure("pods is forbidden", "Forbidden").with_code(403);
        let refused = bounded::<()>(Duration::from_secs(1), async { Err(kube::Error::Api(Box::new(status))) }).await;
        let refused = refused.unwrap_err();
        assert!(refused.is_forbidden());
        assert_eq!(refused.message(), "pods is forbidden");
        assert_eq!(refused.to_string(), "HTTP 403 Forbidden: pods is forbidden");
    }
}
