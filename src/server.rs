//! The HTTP server every long-running process runs for `/healthz`, `/readyz` and
//! `/metrics`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::{Error, Result};

/// Whether the process is ready to do its job, with the reason when it is not.
/// Cloning shares the state; readers never lock.
#[derive(Clone)]
pub struct Readiness {
    not_ready_reason: Arc<ArcSwapOption<String>>,
}

impl Readiness {
    /// Starts not ready, for `reason`.
    pub fn not_ready(reason: impl Into<String>) -> Self {
        Readiness {
            not_ready_reason: Arc::new(ArcSwapOption::from_pointee(reason.into())),
        }
    }

    /// Marks the process ready.
    pub fn set_ready(&self) {
        self.not_ready_reason.store(None);
    }

    /// Marks the process not ready, for `reason`.
    pub fn set_not_ready(&self, reason: impl Into<String>) {
        self.not_ready_reason.store(Some(Arc::new(reason.into())));
    }

    /// `None` when ready, else why not.
    pub fn reason(&self) -> Option<Arc<String>> {
        self.not_ready_reason.load_full()
    }
}

/// What the endpoints serve.
#[derive(Clone)]
pub struct ServerState {
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
}

/// A bound, not yet serving, probe and metrics server.
pub struct ProbeServer {
    listener: TcpListener,
    state: ServerState,
}

impl ProbeServer {
    /// Binds `addr` (port 0 picks a free port).
    pub async fn bind(addr: SocketAddr, state: ServerState) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind {
                addr: addr.to_string(),
                source,
            })?;
        Ok(ProbeServer { listener, state })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serves until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let ProbeServer { listener, state } = self;
        while let Some(stream) = next_connection(&listener, &shutdown, "probe server").await {
            let state = state.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(respond(&request, &state)) }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let connection = builder.serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = connection => {}
                    _ = shutdown.cancelled() => {}
                }
            });
        }
    }
}

/// The next accepted connection, or None once `shutdown` is cancelled. A failed accept
/// is logged (`what` names the server) and the next one awaited.
pub async fn next_connection(
    listener: &TcpListener,
    shutdown: &CancellationToken,
    what: &str,
) -> Option<tokio::net::TcpStream> {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => return Some(stream),
                Err(error) => tracing::warn!(%error, "{what}: accept failed"),
            },
        }
    }
}

fn respond(request: &Request<Incoming>, state: &ServerState) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET is served\n".to_string(),
        );
    }
    match request.uri().path() {
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n".to_string()),
        "/readyz" => match state.readiness.reason() {
            None => text(StatusCode::OK, "ok\n".to_string()),
            Some(reason) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {reason}\n"),
            ),
        },
        "/metrics" => {
            let mut response = text(StatusCode::OK, state.metrics.encode());
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            response
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /healthz, /readyz or /metrics\n".to_string(),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await.unwrap();
        let status = raw[9..12].parse().unwrap();
        let body = raw
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    }

    #[tokio::test]
    async fn serves_probes_and_metrics_and_stops_on_shutdown() {
        let readiness = Readiness::not_ready("waiting for CRDs");
        let state = ServerState {
            metrics: Arc::new(Metrics::new("test")),
            readiness: readiness.clone(),
        };
        let server = ProbeServer::bind("127.0.0.1:0".parse().unwrap(), state)
            .await
            .unwrap();
        let addr = server.local_addr();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server.run(shutdown.clone()));

        assert_eq!(get(addr, "/healthz").await.0, 200);
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503);
        assert!(body.contains("waiting for CRDs"), "{body}");
        readiness.set_ready();
        assert_eq!(get(addr, "/readyz").await.0, 200);
        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(body.contains("bulkhead_build_info"), "{body}");
        assert_eq!(get(addr, "/nope").await.0, 404);

        shutdown.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("server stops on shutdown")
            .unwrap();
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "listener is closed"
        );
    }
}
