//! Unary gRPC over HTTP/2 on a Unix socket, as the kubelet calls a CSI
//! plugin: the hyper already linked for the webhook, with its HTTP/2 half, and
//! the framing by hand (a 5-byte prefix per message, the status in trailers).
//! drafs needs no streaming, no compression and no TLS here; a gRPC stack
//! (tonic) would bring tower, generated code and `protoc` at build time for
//! a handful of unary calls. The same trade for NRI's ttrpc was measured:
//! docs/architecture.md, "Why the wire is hand-written".

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixListener;
use tracing::{debug, warn};

use crate::node::authority;

/// The largest request read (gRPC's default limit; a publish request with a
/// token is a few KiB).
pub const MAX_REQUEST: usize = 4 << 20;

/// A gRPC status code (the ones drafs answers with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok = 0,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
}

/// A call's failure, as the caller sees it (`kubectl describe` shows the
/// message of a failed publish).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct Status {
    pub code: Code,
    pub message: String,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Status { code, message: message.into() }
    }
}

/// What answers the calls: the full method name (`/csi.v1.Node/NodePublishVolume`),
/// the request message, and how long the caller waits (its `grpc-timeout`).
pub trait Handler: Send + Sync + 'static {
    fn call(
        &self,
        method: &str,
        message: Bytes,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<Vec<u8>, Status>> + Send;
}

/// Listen on `path`, replacing a socket left there by an earlier run (a
/// regular file or directory there is not ours: an error).
pub fn listen(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    UnixListener::bind(path)
}

/// Serve calls on `listener` until the future is dropped.
pub async fn serve<H: Handler>(listener: UnixListener, handler: Arc<H>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                warn!("gRPC socket: cannot accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| answer(handler.clone(), req));
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .max_concurrent_streams(64)
                .serve_connection(TokioIo::new(authority::fixed(stream)), service);
            if let Err(e) = conn.await {
                debug!("gRPC connection ended: {e}");
            }
        });
    }
}

type Body = StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

async fn answer<H: Handler>(handler: Arc<H>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let method = req.uri().path().to_string();
    let timeout = req.headers().get("grpc-timeout").and_then(|v| parse_timeout(v.to_str().ok()?));
    let outcome = match read_message(req).await {
        Ok(message) => handler.call(&method, message, timeout).await,
        Err(status) => Err(status),
    };
    if let Err(status) = &outcome {
        debug!(%method, ?status.code, "gRPC call failed: {}", status.message);
    }
    Ok(respond(outcome))
}

/// The one message of a unary call.
async fn read_message(req: Request<Incoming>) -> Result<Bytes, Status> {
    if req.method() != http::Method::POST {
        return Err(Status::new(Code::Unimplemented, "gRPC calls are POST requests"));
    }
    let body = Limited::new(req.into_body(), MAX_REQUEST + 5)
        .collect()
        .await
        .map_err(|e| Status::new(Code::InvalidArgument, format!("cannot read the request: {e}")))?
        .to_bytes();
    unframe(body)
}

/// The message in one length-prefixed frame (uncompressed: drafs offers no encoding).
pub fn unframe(mut body: Bytes) -> Result<Bytes, Status> {
    if body.len() < 5 {
        return Err(Status::new(Code::InvalidArgument, "the request has no message"));
    }
    let compressed = body.get_u8();
    let len = body.get_u32() as usize;
    if compressed != 0 {
        return Err(Status::new(Code::Unimplemented, "compressed messages are not supported"));
    }
    if len != body.len() {
        return Err(Status::new(Code::InvalidArgument, "a unary call carries exactly one message"));
    }
    Ok(body)
}

/// `message` in a frame.
pub fn frame(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out.into()
}

fn respond(outcome: Result<Vec<u8>, Status>) -> Response<Body> {
    let mut frames = Vec::new();
    let mut trailers = HeaderMap::new();
    match outcome {
        Ok(message) => {
            frames.push(Ok(Frame::data(frame(&message))));
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
        }
        Err(status) => {
            trailers.insert("grpc-status", HeaderValue::from(status.code as u32));
            if let Ok(message) = HeaderValue::from_str(&percent_encode(&status.message)) {
                trailers.insert("grpc-message", message);
            }
        }
    }
    frames.push(Ok(Frame::trailers(trailers)));
    let mut response = Response::new(StreamBody::new(futures::stream::iter(frames)));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// gRPC's `grpc-message` encoding: every byte outside printable ASCII, and `%`, as `%XX`.
pub fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A `grpc-timeout` header value: up to 8 digits and a unit (H, M, S, m, u, n).
pub fn parse_timeout(value: &str) -> Option<Duration> {
    let unit = value.chars().last()?;
    let digits = &value[..value.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(n * 3600),
        'M' => Duration::from_secs(n * 60),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_read_as_grpc_writes_them() {
        assert_eq!(parse_timeout("119996955u"), None, "nine digits are too many");
        assert_eq!(parse_timeout("11999695u"), Some(Duration::from_micros(11_999_695)));
        assert_eq!(parse_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_timeout("5x"), None);
        assert_eq!(parse_timeout("S"), None);
        assert_eq!(parse_timeout(""), None);
        assert_eq!(parse_timeout("-1S"), None);
        assert_eq!(parse_timeout("1é"), None);
    }

    #[test]
    fn messages_are_framed_and_unframed() {
        let framed = frame(b"abc");
        assert_eq!(&framed[..], &[0, 0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(unframe(framed).unwrap(), Bytes::from_static(b"abc"));
        assert_eq!(unframe(Bytes::from_static(&[0, 0, 0, 0, 0])).unwrap(), Bytes::new());
        assert_eq!(unframe(Bytes::from_static(&[0, 0, 0])).unwrap_err().code, Code::InvalidArgument);
        assert_eq!(unframe(Bytes::from_static(&[0, 0, 0, 0, 9, 1])).unwrap_err().code, Code::InvalidArgument);
        assert_eq!(unframe(Bytes::from_static(&[1, 0, 0, 0, 1, 1])).unwrap_err().code, Code::Unimplemented);
    }

    #[test]
    fn status_messages_are_percent_encoded() {
        assert_eq!(percent_encode("waiting: 100% of claim \"gpu\"\nnext"), "waiting: 100%25 of claim \"gpu\"%0Anext");
        assert_eq!(percent_encode("é"), "%C3%A9");
    }
}
