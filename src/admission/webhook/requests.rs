//! One HTTP request to the webhook: routed by path, its body read within
//! bounds, the review decided (a large one on a thread of lower priority, a
//! panic contained to it), the answer counted.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::OwnedSemaphorePermit;
use tracing::{debug, info, warn};

use super::{MAX_BODY, REVIEW_TIMEOUT, SMALL_BODY, State};
use crate::admission::contain::contain;
use crate::admission::decision;
use crate::admission::policy::{Defaults, OptIn};
use crate::publish::metrics::Exposition;

/// A large review to decide, with what to do with the answer.
pub(super) type LargeJob = Box<dyn FnOnce() + Send>;

/// The thread large reviews are decided on, one at a time (they hold the
/// large-review permit), 10 nice steps below the webhook's own (at most 19):
/// when the CPUs are busy, the thread that accepts connections and answers
/// small reviews goes first, also when the webhook itself runs niced.
pub(super) fn large_review_thread() -> std::io::Result<std::sync::mpsc::Sender<LargeJob>> {
    let (jobs, queue) = std::sync::mpsc::channel::<LargeJob>();
    std::thread::Builder::new().name("drafs-large-reviews".into()).spawn(move || {
        // Linux: the nice value is per thread; lowering it needs no privilege.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::id_t;
        // getpriority may return -1 as a value: errno tells an error apart.
        unsafe { *libc::__errno_location() = 0 };
        let current = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
        let current = if std::io::Error::last_os_error().raw_os_error().unwrap_or(0) == 0 { current } else { 0 };
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, lowered(current)) } != 0 {
            debug!("cannot lower the large-review thread's priority: {}", std::io::Error::last_os_error());
        }
        for job in queue {
            job();
        }
    })?;
    Ok(jobs)
}

/// The nice value 10 steps below `current`, within Linux's range.
fn lowered(current: i32) -> i32 {
    (current + 10).clamp(-20, 19)
}

fn text(code: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = code;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain"));
    r
}

pub(super) async fn handle(
    state: Arc<State>,
    id: u64,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let mut response = match (req.method(), path.as_str()) {
        (&Method::POST, "/mutate" | "/mutate/namespace") => {
            let opt_in = if path == "/mutate" { OptIn::Pod } else { OptIn::Namespace(state.namespace_mode) };
            let started = Instant::now();
            let (response, verdict) = mutate(&state, id, req, opt_in).await;
            state.slots().set_busy(id, false, Instant::now());
            state.metrics.review(verdict, started.elapsed());
            response
        }
        (_, "/mutate" | "/mutate/namespace") => {
            text(StatusCode::METHOD_NOT_ALLOWED, "POST an AdmissionReview to /mutate or /mutate/namespace\n")
        }
        (&Method::GET, "/healthz" | "/readyz") => {
            let (code, _, body) = state.metrics.respond(&path);
            text(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body)
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: the webhook answers POST /mutate, POST /mutate/namespace, GET /healthz, GET /readyz\n",
        ),
    };
    // While draining, each answer closes its connection, so that the client's
    // next request opens a new one (to a replica that is not stopping)
    // instead of racing the close at the end of the drain.
    if !state.metrics.is_ready() {
        response.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
    }
    Ok(response)
}

/// A request body of at most [`MAX_BODY`] bytes. Over [`SMALL_BODY`], it is
/// read only with the large-review permit, returned with it.
async fn read_body(
    state: &State,
    req: Request<Incoming>,
) -> Result<(Vec<u8>, Option<OwnedSemaphorePermit>), Response<Full<Bytes>>> {
    let too_large = || text(StatusCode::PAYLOAD_TOO_LARGE, format!("AdmissionReview larger than {MAX_BODY} bytes\n"));
    let declared =
        req.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY) {
        return Err(too_large());
    }
    let mut permit = None;
    if declared.is_some_and(|n| n > SMALL_BODY) {
        permit = state.large.clone().acquire_owned().await.ok();
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(0).min(MAX_BODY));
    let mut incoming = req.into_body();
    while let Some(frame) = incoming.frame().await {
        let frame = frame.map_err(|e| text(StatusCode::BAD_REQUEST, format!("cannot read the request body: {e}\n")))?;
        let Ok(data) = frame.into_data() else { continue };
        if body.len() + data.len() > MAX_BODY {
            return Err(too_large());
        }
        if body.len() + data.len() > SMALL_BODY && permit.is_none() {
            permit = state.large.clone().acquire_owned().await.ok();
        }
        body.extend_from_slice(&data);
    }
    Ok((body, permit))
}

/// An answer: (status, content type, body, verdict label).
type Answer = (StatusCode, &'static str, Bytes, &'static str);

/// The answer to one review body. A panic while deciding it (a bug) fails
/// this review alone: 500, counted as verdict `panicked`, and the webhook
/// keeps serving the others.
fn answer(body: &[u8], defaults: &Defaults, opt_in: OptIn) -> Answer {
    contained(|| decide(body, defaults, opt_in))
}

fn contained(decide: impl FnOnce() -> Answer) -> Answer {
    contain(decide).unwrap_or_else(|_| {
        let message = "internal error: drafs could not decide this review (a bug, logged by the webhook)\n";
        (StatusCode::INTERNAL_SERVER_ERROR, "text/plain", Bytes::from(message), "panicked")
    })
}

fn decide(body: &[u8], defaults: &Defaults, opt_in: OptIn) -> Answer {
    // Debug builds only (the tests' binary): a review holding the bytes of
    // DRAFS_TEST_PANIC_ON panics, to show that the panic stays contained.
    #[cfg(debug_assertions)]
    if let Some(marker) = std::env::var_os("DRAFS_TEST_PANIC_ON").filter(|m| !m.is_empty())
        && body.windows(marker.len()).any(|w| w == marker.as_encoded_bytes())
    {
        panic!("DRAFS_TEST_PANIC_ON matched this review");
    }
    match decision::review(body, defaults, opt_in) {
        Ok((answer, verdict)) => {
            if let decision::Verdict::Denied { message } = &verdict {
                info!("denied: {message}");
            }
            let bytes = serde_json::to_vec(&answer).expect("a JSON value serializes");
            (StatusCode::OK, "application/json", Bytes::from(bytes), verdict.label())
        }
        Err(e @ decision::ReviewError::Internal(_)) => {
            warn!("{e}");
            (StatusCode::INTERNAL_SERVER_ERROR, "text/plain", Bytes::from(format!("{e}\n")), "bad_request")
        }
        Err(e) => {
            debug!("bad request: {e}");
            (StatusCode::BAD_REQUEST, "text/plain", Bytes::from(format!("{e}\n")), "bad_request")
        }
    }
}

/// Read the review (bounded), decide, answer. A large review is decided on
/// the large-review thread, holding the large-review permit until its memory
/// is freed.
async fn mutate(
    state: &State,
    id: u64,
    req: Request<Incoming>,
    opt_in: OptIn,
) -> (Response<Full<Bytes>>, &'static str) {
    let (body, permit) = match tokio::time::timeout(REVIEW_TIMEOUT, read_body(state, req)).await {
        Ok(Ok(read)) => read,
        Ok(Err(response)) => return (response, "bad_request"),
        Err(_) => return (text(StatusCode::REQUEST_TIMEOUT, "request body not received in time\n"), "bad_request"),
    };
    state.slots().set_busy(id, true, Instant::now());
    let (code, content_type, bytes, verdict) = match permit {
        None => answer(&body, &state.defaults, opt_in),
        Some(permit) => {
            info!(bytes = body.len(), "large review: deciding it on the large-review thread");
            let defaults = state.defaults.clone();
            let (done, decided) = tokio::sync::oneshot::channel();
            let job: LargeJob = Box::new(move || {
                let _ = done.send(answer(&body, &defaults, opt_in));
                // The permit goes when the review's memory has been freed.
                drop(body);
                drop(permit);
            });
            let sent = state.large_jobs.send(job).is_ok();
            match decided.await {
                Ok(decided) if sent => decided,
                _ => {
                    warn!("the large-review thread is gone");
                    (StatusCode::INTERNAL_SERVER_ERROR, "text/plain", Bytes::from("internal error\n"), "bad_request")
                }
            }
        }
    };
    let mut r = Response::new(Full::new(bytes));
    *r.status_mut() = code;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    (r, verdict)
}

#[cfg(test)]
mod tests {
    #[test]
    fn large_reviews_run_below_the_webhook_however_niced() {
        assert_eq!(super::lowered(0), 10);
        assert_eq!(super::lowered(10), 19, "a webhook run at nice 10 still puts large reviews below itself");
        assert_eq!(super::lowered(19), 19);
        assert_eq!(super::lowered(-20), -10);
    }
}
