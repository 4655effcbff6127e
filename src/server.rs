//! The HTTP server every long-running process runs for `/healthz`, `/readyz` and
//! `/metrics`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
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
        serve_limited(
            listener,
            PROBE_LIMITS,
            "probe server",
            |stream| async move { Some(stream) },
            move || {
                let state = state.clone();
                hyper::service::service_fn(move |request| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(respond(&request, &state)) }
                })
            },
            shutdown,
        )
        .await;
    }
}

/// What one HTTP listener allows a client: anything on the pod network can connect, so
/// no client may hold a connection, a task or memory for ever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections at most; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// The TLS handshake (if any) and each request's headers must arrive within this;
    /// it is also how long an idle HTTP/1 keep-alive connection is kept.
    pub header_read_timeout: Duration,
    /// HTTP/2: a ping every this long, and the connection closed when it goes
    /// unanswered for as long.
    pub keep_alive_interval: Duration,
    /// A connection with no byte read or written for this long is closed: one that never
    /// sends a request (HTTP/2 keep-alive pings count as traffic). Longer than the
    /// slowest answer of the server's handlers.
    pub idle_timeout: Duration,
    /// A connection is asked to close (gracefully: requests under way finish) after this
    /// long, and closed for good `header_read_timeout` later, whatever its client does.
    pub max_age: Duration,
}

/// An I/O stream that notes when bytes last moved either way.
struct Watched<IO> {
    io: IO,
    started: std::time::Instant,
    /// Milliseconds from `started` to the last read or write of a byte.
    last: Arc<std::sync::atomic::AtomicU64>,
}

impl<IO> Watched<IO> {
    fn touch(&self) {
        self.last.store(
            self.started.elapsed().as_millis() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

impl<IO: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        result
    }
}

impl<IO: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let result = std::pin::Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(result, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        result
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The probe and metrics listener: kubelet and Prometheus, a few connections.
pub const PROBE_LIMITS: ConnectionLimits = ConnectionLimits {
    max_connections: 64,
    header_read_timeout: Duration::from_secs(5),
    keep_alive_interval: Duration::from_secs(10),
    idle_timeout: Duration::from_secs(15),
    max_age: Duration::from_secs(300),
};

/// Serves HTTP/1 and HTTP/2 on `listener` within `limits` until `shutdown`: each
/// accepted connection goes through `handshake` (TLS, or none; `None` drops it), then
/// is served by a service from `make_service`. `what` names the listener in the log.
pub async fn serve_limited<IO, H, HF, M, S, B>(
    listener: TcpListener,
    limits: ConnectionLimits,
    what: &'static str,
    handshake: H,
    make_service: M,
    shutdown: CancellationToken,
) where
    H: Fn(TcpStream) -> HF + Send + Sync + 'static,
    HF: Future<Output = Option<IO>> + Send + 'static,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    M: Fn() -> S,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let handshake = Arc::new(handshake);
    let mut refused: u64 = 0;
    while let Some(stream) = next_connection(&listener, &shutdown, what).await {
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Closed at once: the client sees the connection end and may try again.
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    listener = what,
                    refused,
                    max = limits.max_connections,
                    "too many open connections: closing new ones"
                );
            }
            drop(stream);
            continue;
        };
        let handshake = handshake.clone();
        let service = make_service();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let io = match tokio::time::timeout(limits.header_read_timeout, handshake(stream)).await
            {
                Ok(Some(io)) => io,
                _ => return,
            };
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(limits.keep_alive_interval)
                .keep_alive_timeout(limits.keep_alive_interval)
                .max_concurrent_streams(32);
            let last = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let started = std::time::Instant::now();
            let watched = Watched {
                io,
                started,
                last: last.clone(),
            };
            let connection = builder.serve_connection(TokioIo::new(watched), service);
            tokio::pin!(connection);
            let aged = tokio::time::sleep(limits.max_age);
            tokio::pin!(aged);
            loop {
                let idle_since =
                    Duration::from_millis(last.load(std::sync::atomic::Ordering::Relaxed));
                let idle_deadline =
                    tokio::time::Instant::from_std(started + idle_since + limits.idle_timeout);
                tokio::select! {
                    _ = connection.as_mut() => return,
                    _ = shutdown.cancelled() => return,
                    _ = aged.as_mut() => break,
                    _ = tokio::time::sleep_until(idle_deadline) => {
                        let now_idle = started.elapsed().saturating_sub(Duration::from_millis(
                            last.load(std::sync::atomic::Ordering::Relaxed),
                        ));
                        if now_idle >= limits.idle_timeout {
                            // Nothing moved for the whole time: closed.
                            return;
                        }
                    }
                }
            }
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(limits.header_read_timeout, connection).await;
        });
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

    /// GET / on a new connection: the status, or None when the server closed it.
    async fn get_or_closed(addr: SocketAddr) -> (Option<u16>, String) {
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            return (None, String::new());
        };
        let request = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        if stream.write_all(request).await.is_err() {
            return (None, String::new());
        }
        let mut raw = String::new();
        let _ = stream.read_to_string(&mut raw).await;
        (raw.get(9..12).and_then(|s| s.parse().ok()), raw)
    }

    /// A plain listener within `limits` answering every request 200 "ok".
    async fn limited(limits: ConnectionLimits) -> (SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        tokio::spawn(serve_limited(
            listener,
            limits,
            "test",
            |stream| async move { Some(stream) },
            || {
                hyper::service::service_fn(|_request| async {
                    Ok::<_, Infallible>(text(StatusCode::OK, "ok\n".into()))
                })
            },
            shutdown.clone(),
        ));
        (addr, shutdown)
    }

    /// Reads until the server closes the connection (or `within` passes: then false).
    async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
        let mut buffer = [0u8; 1024];
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }

    #[tokio::test]
    async fn slow_headers_silent_and_idle_connections_are_closed() {
        let (addr, _shutdown) = limited(ConnectionLimits {
            max_connections: 8,
            header_read_timeout: Duration::from_millis(300),
            keep_alive_interval: Duration::from_secs(10),
            idle_timeout: Duration::from_millis(600),
            max_age: Duration::from_secs(60),
        })
        .await;
        // Headers that never end (slowloris).
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"POST /validate HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .unwrap();
        // A connection that never sends a byte.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        assert!(closed_within(&mut slow, Duration::from_secs(5)).await);
        assert!(closed_within(&mut silent, Duration::from_secs(5)).await);
        // A keep-alive connection is served, then closed once idle.
        let mut kept = TcpStream::connect(addr).await.unwrap();
        kept.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = [0u8; 12];
        kept.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"HTTP/1.1 200");
        assert!(closed_within(&mut kept, Duration::from_secs(5)).await);
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_are_closed_at_once_and_served_again_when_one_ends() {
        let (addr, _shutdown) = limited(ConnectionLimits {
            max_connections: 2,
            header_read_timeout: Duration::from_secs(30),
            keep_alive_interval: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_age: Duration::from_secs(60),
        })
        .await;
        let first = TcpStream::connect(addr).await.unwrap();
        let _second = TcpStream::connect(addr).await.unwrap();
        // Both slots are taken once the server has accepted them.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut third = TcpStream::connect(addr).await.unwrap();
        assert!(
            closed_within(&mut third, Duration::from_secs(2)).await,
            "a connection beyond the cap is closed"
        );
        drop(first);
        // The server notices the close at its next read; until then a new one may be
        // closed too.
        let mut served = false;
        for _ in 0..50 {
            let (status, _) = get_or_closed(addr).await;
            if status == Some(200) {
                served = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(served, "served again once a slot is free");
    }

    #[tokio::test]
    async fn a_connection_is_closed_at_its_maximum_age() {
        let (addr, _shutdown) = limited(ConnectionLimits {
            max_connections: 8,
            header_read_timeout: Duration::from_secs(30),
            keep_alive_interval: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_age: Duration::from_millis(300),
        })
        .await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(closed_within(&mut stream, Duration::from_secs(5)).await);
    }
}
