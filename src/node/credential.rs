//! Reading the API as the pod, over the node's one connection pool.
//!
//! Every volume's run reads its pod and claims with the pod's own token. A
//! client per volume would hold a TLS configuration and a connection pool per
//! pod; instead each run's client is a thin layer over one client the agent
//! shares (made without credentials) that puts the pod's token on each
//! request. The token is swapped in place when the kubelet refreshes it, so a
//! refresh restarts nothing: the next request carries the new token.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::AUTHORIZATION;
use http::{HeaderValue, Request, Response};
use kube::client::Body;

/// A token that cannot be a header value (the kubelet sent something odd).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the pod's token cannot be sent as a header")]
pub struct InvalidToken;

/// A pod's service-account token, shared by its run's requests and replaced
/// in place. Never printed.
#[derive(Clone)]
pub struct PodToken(Arc<RwLock<HeaderValue>>);

impl std::fmt::Debug for PodToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PodToken(..)")
    }
}

fn bearer(token: &str) -> Result<HeaderValue, InvalidToken> {
    let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| InvalidToken)?;
    value.set_sensitive(true);
    Ok(value)
}

impl PodToken {
    pub fn new(token: &str) -> Result<Self, InvalidToken> {
        Ok(PodToken(Arc::new(RwLock::new(bearer(token)?))))
    }

    /// Use `token` from the next request on; whether it differed.
    pub fn replace(&self, token: &str) -> Result<bool, InvalidToken> {
        let value = bearer(token)?;
        let mut current = self.0.write().unwrap_or_else(|e| e.into_inner());
        let changed = *current != value;
        *current = value;
        Ok(changed)
    }

    fn header(&self) -> HeaderValue {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Each pooled connection's read buffer at most. hyper's default (about
/// 400 KiB) is kept by a connection while it idles in the pool: a tenant's
/// large pod or claim, read once, would leave that much behind per
/// connection for as long as the pool keeps it. A larger object is read in
/// more steps.
const READ_BUFFER: usize = 64 * 1024;
/// Idle connections kept, and for how long: enough for the next publishes to
/// reuse, not one for every read a burst of publishes made at once.
const IDLE_CONNECTIONS: usize = 8;
const IDLE_FOR: Duration = Duration::from_secs(30);

/// The agent's client: as `kube::Client::try_from(config)` (TLS, the
/// config's credentials and headers, retries of 429/503/504), over a
/// connection pool whose memory does not grow with what tenants write.
pub fn pooled_client(config: &kube::Config) -> Result<kube::Client, kube::Error> {
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::{TokioExecutor, TokioTimer};
    use kube::client::ConfigExt;
    use kube::client::retry::RetryPolicy;
    use tower::retry::RetryLayer;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    let https = config.rustls_https_connector_with_connector(http)?;
    let pool = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http1_max_buf_size(READ_BUFFER)
        .pool_max_idle_per_host(IDLE_CONNECTIONS)
        .pool_idle_timeout(IDLE_FOR)
        .pool_timer(TokioTimer::new())
        .build(https);
    let retries = config.default_retry.then(|| RetryLayer::new(RetryPolicy::server_retry()));
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retries)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(pool);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// A client that reads as the pod whose token it carries, through `shared`
/// (a client without credentials of its own: it adds no Authorization).
pub fn client_as(shared: &kube::Client, token: PodToken, namespace: &str) -> kube::Client {
    kube::Client::new(AsPod { shared: shared.clone(), token }, namespace)
}

/// The service under [`client_as`]'s client.
struct AsPod {
    shared: kube::Client,
    token: PodToken,
}

impl tower_service::Service<Request<Body>> for AsPod {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        request.headers_mut().insert(AUTHORIZATION, self.token.header());
        let shared = self.shared.clone();
        Box::pin(async move { shared.send(request).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_replaced_in_place_and_never_printed() {
        let token = PodToken::new("eyJ.a.b").unwrap();
        let shared = token.clone();
        assert_eq!(shared.header(), "Bearer eyJ.a.b");
        assert!(shared.header().is_sensitive());
        assert_eq!(token.replace("eyJ.a.b"), Ok(false));
        assert_eq!(token.replace("eyJ.c.d"), Ok(true));
        assert_eq!(shared.header(), "Bearer eyJ.c.d", "every holder sees the new token");
        assert_eq!(token.replace("a\nb"), Err(InvalidToken));
        assert_eq!(shared.header(), "Bearer eyJ.c.d", "a bad token changes nothing");
        assert!(!format!("{token:?}").contains("eyJ"));
    }
}
