//! The wire to the runtime: one Unix socket, NRI's multiplexer on it, and
//! ttrpc on each of its connections.
//!
//! The multiplexer cuts the socket into logical connections: every frame is
//! `[connection id: u32 BE][length: u32 BE][bytes]`; the plugin's service
//! (which the runtime calls) is connection 1, the runtime's (which the
//! plugin calls) connection 2. On each, ttrpc: `[length: u32 BE][stream id:
//! u32 BE][type: u8][flags: u8]` then a protobuf `Request` (type 1) or
//! `Response` (type 2); a caller numbers its streams with odd ids and the
//! answer carries the same id. A message spans frames as the sender's
//! writes cut it, so each connection's bytes are read as a stream.
//!
//! Written here rather than with the `ttrpc` crate: drafs needs unary calls
//! on two connections of one socket, which is this file; the crate would add
//! a second protobuf runtime, a second `nix`, vsock support and about 22
//! crates, 192 KiB of the binary and three to four times the build
//! (docs/architecture.md has the measurement).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use crate::node::grpc::{Code, Handler, Status};

/// The plugin's service: the runtime's requests come on it.
pub const PLUGIN_CONN: u32 = 1;
/// The runtime's service: the plugin's requests go on it.
pub const RUNTIME_CONN: u32 = 2;

const MUX_HEADER: usize = 8;
const TTRPC_HEADER: usize = 10;
/// ttrpc's largest message: what the runtime sends is bounded by it too.
pub const MAX_MESSAGE: usize = 4 << 20;
const REQUEST: u8 = 1;
const RESPONSE: u8 = 2;
/// Frames waiting to be written at most: a handler that answers waits while it is full.
const WRITE_QUEUE: usize = 64;

#[derive(Clone, PartialEq, prost::Message)]
struct WireRequest {
    #[prost(string, tag = "1")]
    service: String,
    #[prost(string, tag = "2")]
    method: String,
    #[prost(bytes = "bytes", tag = "3")]
    payload: Bytes,
    #[prost(int64, tag = "4")]
    timeout_nano: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct WireStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct WireResponse {
    #[prost(message, optional, tag = "1")]
    status: Option<WireStatus>,
    #[prost(bytes = "bytes", tag = "2")]
    payload: Bytes,
}

/// Why the connection ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the runtime closed the connection")]
    Closed,
    #[error("reading the runtime's socket: {0}")]
    Read(String),
    #[error("writing to the runtime's socket: {0}")]
    Write(String),
    #[error("the runtime sent {0}")]
    Protocol(String),
}

/// One ttrpc message of a connection, its header read.
#[derive(Debug, PartialEq, Eq)]
struct TtrpcMessage {
    stream: u32,
    kind: u8,
    body: Bytes,
}

/// A connection's bytes as they come, cut into ttrpc messages.
#[derive(Default)]
struct TtrpcReader {
    pending: BytesMut,
}

impl TtrpcReader {
    /// Take `bytes` in; every message they complete.
    fn feed(&mut self, bytes: &[u8]) -> Result<Vec<TtrpcMessage>, WireError> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        while self.pending.len() >= TTRPC_HEADER {
            let length = u32::from_be_bytes(self.pending[0..4].try_into().expect("4 bytes")) as usize;
            if length > MAX_MESSAGE {
                return Err(WireError::Protocol(format!("a message of {length} bytes (at most {MAX_MESSAGE})")));
            }
            if self.pending.len() < TTRPC_HEADER + length {
                break;
            }
            let mut message = self.pending.split_to(TTRPC_HEADER + length);
            let stream = u32::from_be_bytes(message[4..8].try_into().expect("4 bytes"));
            let kind = message[8];
            message.advance(TTRPC_HEADER);
            out.push(TtrpcMessage { stream, kind, body: message.freeze() });
        }
        Ok(out)
    }
}

/// A mux frame holding one ttrpc message.
fn frame(conn: u32, stream: u32, kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MUX_HEADER + TTRPC_HEADER + body.len());
    out.extend_from_slice(&conn.to_be_bytes());
    out.extend_from_slice(&((TTRPC_HEADER + body.len()) as u32).to_be_bytes());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(&[kind, 0]);
    out.extend_from_slice(body);
    out
}

fn code_of(status: i32) -> Code {
    match status {
        3 => Code::InvalidArgument,
        4 => Code::DeadlineExceeded,
        5 => Code::NotFound,
        6 => Code::AlreadyExists,
        8 => Code::ResourceExhausted,
        9 => Code::FailedPrecondition,
        12 => Code::Unimplemented,
        14 => Code::Unavailable,
        _ => Code::Internal,
    }
}

type Pending = Arc<Mutex<HashMap<u32, oneshot::Sender<Result<Bytes, Status>>>>>;

/// A live connection to the runtime: the plugin's calls go out on it, the
/// runtime's calls are answered by its handler.
pub struct Connection {
    writes: mpsc::Sender<Vec<u8>>,
    pending: Pending,
    next_stream: Mutex<u32>,
    ended: tokio::sync::watch::Receiver<Option<WireError>>,
}

impl Connection {
    /// Serve the runtime's calls on `socket` with `handler`, and make the
    /// plugin's through the connection returned; the tasks end with the socket.
    pub fn start<S, H>(socket: S, handler: Arc<H>) -> Arc<Connection>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
        H: Handler,
    {
        let (read, mut write) = tokio::io::split(socket);
        let (writes, mut queued) = mpsc::channel::<Vec<u8>>(WRITE_QUEUE);
        let (end, ended) = tokio::sync::watch::channel(None);
        let pending: Pending = Arc::default();
        let end = Arc::new(end);
        let writer_end = end.clone();
        tokio::spawn(async move {
            while let Some(bytes) = queued.recv().await {
                if let Err(e) = write.write_all(&bytes).await {
                    writer_end.send_if_modified(|e2| e2.replace(WireError::Write(e.to_string())).is_none());
                    return;
                }
            }
        });
        let connection = Arc::new(Connection { writes, pending, next_stream: Mutex::new(1), ended });
        let pending = connection.pending.clone();
        let reader = Reader { handler, writes: connection.writes.clone(), pending: pending.clone() };
        tokio::spawn(async move {
            let error = reader.run(read).await;
            debug!("NRI connection ended: {error}");
            end.send_if_modified(|e| e.replace(error).is_none());
            // The calls still waiting are answered: the connection is gone.
            pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
        });
        connection
    }

    /// Call `method` of `service` on the runtime, waiting at most `timeout`.
    pub async fn call(
        &self,
        service: &str,
        method: &str,
        request: Vec<u8>,
        timeout: Duration,
    ) -> Result<Bytes, Status> {
        let stream = {
            let mut next = self.next_stream.lock().unwrap_or_else(|e| e.into_inner());
            let stream = *next;
            *next = next.wrapping_add(2);
            stream
        };
        let wire = WireRequest {
            service: service.into(),
            method: method.into(),
            payload: request.into(),
            timeout_nano: timeout.as_nanos().min(i64::MAX as u128) as i64,
        };
        let (tx, rx) = oneshot::channel();
        if self.ended.borrow().is_some() {
            return Err(Status::new(Code::Unavailable, "the connection to the runtime is closed"));
        }
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(stream, tx);
        let sent = self.writes.send(frame(RUNTIME_CONN, stream, REQUEST, &wire.encode_to_vec())).await;
        let answer = match sent {
            Err(_) => Err(Status::new(Code::Unavailable, "the connection to the runtime is closed")),
            Ok(()) => match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) => Err(Status::new(Code::Unavailable, "the connection to the runtime closed")),
                Err(_) => Err(Status::new(Code::DeadlineExceeded, format!("no answer within {timeout:?}"))),
            },
        };
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&stream);
        answer
    }

    /// Until the connection ends; why.
    pub async fn closed(&self) -> WireError {
        let mut ended = self.ended.clone();
        match ended.wait_for(Option::is_some).await {
            Ok(error) => error.clone().unwrap_or(WireError::Closed),
            Err(_) => WireError::Closed,
        }
    }
}

/// The socket's read half: frames to connections, messages to the handler
/// (requests) or to the calls waiting for them (responses).
struct Reader<H> {
    handler: Arc<H>,
    writes: mpsc::Sender<Vec<u8>>,
    pending: Pending,
}

impl<H: Handler> Reader<H> {
    async fn run(self, mut read: impl AsyncRead + Unpin) -> WireError {
        let mut connections: HashMap<u32, TtrpcReader> = HashMap::new();
        let mut header = [0u8; MUX_HEADER];
        loop {
            if let Err(e) = read.read_exact(&mut header).await {
                return match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => WireError::Closed,
                    _ => WireError::Read(e.to_string()),
                };
            }
            let conn = u32::from_be_bytes(header[0..4].try_into().expect("4 bytes"));
            let length = u32::from_be_bytes(header[4..8].try_into().expect("4 bytes")) as usize;
            if length > TTRPC_HEADER + MAX_MESSAGE {
                return WireError::Protocol(format!("a frame of {length} bytes"));
            }
            let mut bytes = vec![0u8; length];
            if let Err(e) = read.read_exact(&mut bytes).await {
                return WireError::Read(e.to_string());
            }
            if conn != PLUGIN_CONN && conn != RUNTIME_CONN {
                warn!(conn, "NRI: a frame for an unknown connection, skipped");
                continue;
            }
            let messages = match connections.entry(conn).or_default().feed(&bytes) {
                Ok(messages) => messages,
                Err(e) => return e,
            };
            for message in messages {
                self.take(conn, message);
            }
        }
    }

    fn take(&self, conn: u32, message: TtrpcMessage) {
        match (conn, message.kind) {
            (PLUGIN_CONN, REQUEST) => self.serve(message),
            (RUNTIME_CONN, RESPONSE) => {
                let waiting = self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&message.stream);
                let Some(waiting) = waiting else {
                    return debug!(stream = message.stream, "NRI: an answer nobody waits for (late)");
                };
                let answer = match WireResponse::decode(message.body) {
                    Err(e) => Err(Status::new(Code::Internal, format!("a malformed answer: {e}"))),
                    Ok(r) => match r.status.filter(|s| s.code != 0) {
                        Some(s) => Err(Status::new(code_of(s.code), s.message)),
                        None => Ok(r.payload),
                    },
                };
                let _ = waiting.send(answer);
            }
            (conn, kind) => debug!(conn, kind, "NRI: a message of an unexpected kind, skipped"),
        }
    }

    /// Answer one request of the runtime's, on a task of its own.
    fn serve(&self, message: TtrpcMessage) {
        let (handler, writes) = (self.handler.clone(), self.writes.clone());
        tokio::spawn(async move {
            let response = match WireRequest::decode(message.body) {
                Err(e) => WireResponse {
                    status: Some(WireStatus { code: Code::InvalidArgument as i32, message: format!("malformed: {e}") }),
                    payload: Bytes::new(),
                },
                Ok(request) => {
                    let timeout = u64::try_from(request.timeout_nano).ok().filter(|n| *n > 0).map(Duration::from_nanos);
                    let method = format!("/{}/{}", request.service, request.method);
                    match handler.call(&method, request.payload, timeout).await {
                        Ok(payload) => WireResponse { status: None, payload: payload.into() },
                        Err(status) => WireResponse {
                            status: Some(WireStatus { code: status.code as i32, message: status.message }),
                            payload: Bytes::new(),
                        },
                    }
                }
            };
            let _ = writes.send(frame(PLUGIN_CONN, message.stream, RESPONSE, &response.encode_to_vec())).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo;

    impl Handler for Echo {
        async fn call(&self, method: &str, message: Bytes, timeout: Option<Duration>) -> Result<Vec<u8>, Status> {
            match method {
                "/test.Service/Echo" => Ok(message.to_vec()),
                "/test.Service/Slow" => {
                    tokio::time::sleep(timeout.unwrap_or_default() / 2).await;
                    Ok(b"slow".to_vec())
                }
                _ => Err(Status::new(Code::Unimplemented, format!("no {method}"))),
            }
        }
    }

    #[test]
    fn a_message_cut_across_frames_is_read_whole_and_two_in_one_frame_both() {
        let body = WireRequest { service: "s".into(), method: "m".into(), ..Default::default() }.encode_to_vec();
        let framed = frame(PLUGIN_CONN, 3, REQUEST, &body);
        let ttrpc = &framed[MUX_HEADER..];
        let mut reader = TtrpcReader::default();
        assert!(reader.feed(&ttrpc[..5]).unwrap().is_empty(), "half a header");
        assert!(reader.feed(&ttrpc[5..12]).unwrap().is_empty(), "the header, not the body");
        let one = reader.feed(&ttrpc[12..]).unwrap();
        assert_eq!(one, [TtrpcMessage { stream: 3, kind: REQUEST, body: Bytes::from(body.clone()) }]);
        let twice = [ttrpc, ttrpc].concat();
        assert_eq!(reader.feed(&twice).unwrap().len(), 2);
        let mut too_long = ttrpc.to_vec();
        too_long[0..4].copy_from_slice(&((MAX_MESSAGE + 1) as u32).to_be_bytes());
        assert!(matches!(TtrpcReader::default().feed(&too_long), Err(WireError::Protocol(_))));
    }

    /// The runtime's side of a socket, as a test plays it: its requests on
    /// connection 1, its answers to the plugin on connection 2.
    struct Runtime {
        socket: tokio::net::UnixStream,
        reader: TtrpcReader,
    }

    impl Runtime {
        async fn send(&mut self, conn: u32, stream: u32, kind: u8, body: &[u8]) {
            self.socket.write_all(&frame(conn, stream, kind, body)).await.unwrap();
        }

        async fn next(&mut self) -> (u32, TtrpcMessage) {
            loop {
                let mut header = [0u8; MUX_HEADER];
                self.socket.read_exact(&mut header).await.unwrap();
                let conn = u32::from_be_bytes(header[0..4].try_into().unwrap());
                let mut bytes = vec![0u8; u32::from_be_bytes(header[4..8].try_into().unwrap()) as usize];
                self.socket.read_exact(&mut bytes).await.unwrap();
                if let Some(message) = self.reader.feed(&bytes).unwrap().pop() {
                    return (conn, message);
                }
            }
        }
    }

    fn request(method: &str, payload: &[u8], timeout: Duration) -> Vec<u8> {
        let request = WireRequest {
            service: "test.Service".into(),
            method: method.into(),
            payload: Bytes::copy_from_slice(payload),
            timeout_nano: timeout.as_nanos() as i64,
        };
        request.encode_to_vec()
    }

    #[tokio::test]
    async fn the_runtimes_calls_are_answered_and_the_plugins_calls_answered_by_stream() {
        let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        let connection = Connection::start(ours, Arc::new(Echo));
        let mut runtime = Runtime { socket: theirs, reader: TtrpcReader::default() };
        // The runtime calls the plugin, twice at once; the answers carry their streams.
        runtime.send(PLUGIN_CONN, 5, REQUEST, &request("Slow", b"", Duration::from_millis(100))).await;
        runtime.send(PLUGIN_CONN, 7, REQUEST, &request("Echo", b"hello", Duration::from_secs(1))).await;
        runtime.send(PLUGIN_CONN, 9, REQUEST, &request("Nope", b"", Duration::from_secs(1))).await;
        let mut answers = HashMap::new();
        for _ in 0..3 {
            let (conn, message) = runtime.next().await;
            assert_eq!((conn, message.kind), (PLUGIN_CONN, RESPONSE));
            answers.insert(message.stream, WireResponse::decode(message.body).unwrap());
        }
        assert_eq!(answers[&7].payload, Bytes::from_static(b"hello"));
        assert_eq!(answers[&5].payload, Bytes::from_static(b"slow"));
        assert_eq!(answers[&9].status.as_ref().unwrap().code, Code::Unimplemented as i32);
        // The plugin calls the runtime; the runtime answers with an error status.
        let call = tokio::spawn({
            let connection = connection.clone();
            async move { connection.call("rt.Runtime", "Register", b"x".to_vec(), Duration::from_secs(5)).await }
        });
        let (conn, message) = runtime.next().await;
        assert_eq!((conn, message.kind, message.stream % 2), (RUNTIME_CONN, REQUEST, 1));
        let asked = WireRequest::decode(message.body).unwrap();
        assert_eq!((asked.service.as_str(), asked.method.as_str()), ("rt.Runtime", "Register"));
        assert!(asked.timeout_nano > 0);
        let refused =
            WireResponse { status: Some(WireStatus { code: 3, message: "bad name".into() }), payload: Bytes::new() };
        runtime.send(RUNTIME_CONN, message.stream, RESPONSE, &refused.encode_to_vec()).await;
        assert_eq!(call.await.unwrap(), Err(Status::new(Code::InvalidArgument, "bad name")));
        // The runtime goes away: the connection says so, and calls fail at once.
        drop(runtime);
        assert_eq!(connection.closed().await, WireError::Closed);
        let after = connection.call("rt.Runtime", "Register", Vec::new(), Duration::from_secs(5)).await;
        assert_eq!(after.unwrap_err().code, Code::Unavailable);
    }

    #[tokio::test]
    async fn a_call_the_runtime_does_not_answer_ends_at_its_deadline() {
        let (ours, _theirs) = tokio::net::UnixStream::pair().unwrap();
        let connection = Connection::start(ours, Arc::new(Echo));
        let started = std::time::Instant::now();
        let late = connection.call("rt.Runtime", "Register", Vec::new(), Duration::from_millis(50)).await;
        assert_eq!(late.unwrap_err().code, Code::DeadlineExceeded);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
