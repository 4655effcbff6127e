//! kube clients as `kube::Client::try_from(config)` builds them (TLS from the kubeconfig,
//! its credentials, retries as configured, its connect/read/write timeouts), with the
//! HTTP connections' memory bounded.
//!
//! HTTP/1.1 carries one request at a time per connection, so a client with 32 requests
//! in flight opens 32 connections, and every watch holds one for as long as it runs.
//! Measured with heaptrack on a hub after a 200-template burst (docs/benchmarks.md,
//! "Where the heap goes"): about 120 connections held 7.6 MB, most of it read buffers.
//! hyper grows a connection's read buffer up to 400 KiB while large responses or watch
//! events arrive back to back and keeps it for the connection's life, and kube's default
//! pool keeps an idle connection 90 s. Here a read buffer grows to at most
//! [`MAX_READ_BUFFER`] (a larger response takes more reads, not more memory), and an idle
//! connection closes after the caller's `idle`.
//!
//! No request lands late. A request sent while the path to the API server drops packets
//! sits in the kernel's send queue, and TCP retransmits it with growing pauses: the 60-minute
//! chaos run found a hub's DELETE of a database copy executed 7 s after it was sent (and
//! after its sender had given up), and an apply that re-created a copy 9 s after the
//! hub had deleted it, sent by a hub that had been killed meanwhile (the kernel goes on
//! sending what a closed socket still holds). So every connection closes abortively
//! (`SO_LINGER` 0: a dropped or closed connection, or a killed process, discards what it
//! had not delivered), and with [`Limits::unacknowledged`] (member clients) the kernel
//! aborts a connection whose sent data is not acknowledged within that time
//! (`TCP_USER_TIMEOUT`), discarding the request instead of delivering it after a
//! partition heals.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::{ClientBuilder, ConfigExt};
use kube::{Client, Config};
use tower::{BoxError, ServiceBuilder};

/// The most a connection's read buffer grows to. TLS records are 16 KiB, so this is four
/// records per read.
pub const MAX_READ_BUFFER: usize = 64 * 1024;

/// How long an unused connection stays open in a client whose requests come in bursts
/// (writes, lists): past a burst, its connections close within this.
pub const BULK_IDLE: Duration = Duration::from_secs(10);

/// How a client's connections are pooled and bounded.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// An idle connection closes after this.
    pub idle: Duration,
    /// Requests in flight; more wait their turn (None: unbounded).
    pub in_flight: Option<usize>,
    /// How long a request may wait for its response headers, counted from when it is
    /// sent (inside the in-flight limit, so waiting for a turn does not count). None: no
    /// deadline beyond the connection's read timeout.
    pub request_timeout: Option<Duration>,
    /// How long sent data may stay unacknowledged before the kernel aborts the
    /// connection and discards it (`TCP_USER_TIMEOUT`, Linux). None: the kernel's default
    /// (many minutes of retransmissions).
    pub unacknowledged: Option<Duration>,
}

impl Limits {
    /// A client for bursts of writes and lists, with no limit of its own.
    pub const BULK: Limits = Limits {
        idle: BULK_IDLE,
        in_flight: None,
        request_timeout: None,
        unacknowledged: None,
    };
}

/// A client for `config`, its connections bounded as [`Limits`] says.
pub fn build(config: Config, limits: Limits) -> Result<Client, kube::Error> {
    build_gated(config, limits, None)
}

/// [`build`], with every write gated by `leadership` when it gets its turn
/// ([`crate::leader::LeaderGateLayer`], inside the in-flight limit).
pub fn build_gated(
    config: Config,
    limits: Limits,
    leadership: Option<crate::leader::Leadership>,
) -> Result<Client, kube::Error> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_tcp_user_timeout(limits.unacknowledged);
    let https = config.rustls_https_connector_with_connector(AbortOnClose(http))?;
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let http_client = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        .pool_idle_timeout(limits.idle)
        .http1_max_buf_size(MAX_READ_BUFFER)
        .build(connector);
    let retry = config
        .default_retry
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http_client);
    // The last layer added is the outermost: the limit queues, then the leadership gate
    // looks, then the deadline runs.
    let builder = ClientBuilder::new(service, config.default_namespace)
        .with_layer(&tower::util::option_layer(
            limits
                .request_timeout
                .map(tower::timeout::TimeoutLayer::new),
        ))
        .with_layer(&tower::util::option_layer(
            leadership.map(|leadership| crate::leader::LeaderGateLayer { leadership }),
        ))
        .with_layer(&tower::util::option_layer(
            limits
                .in_flight
                .map(tower::limit::ConcurrencyLimitLayer::new),
        ));
    Ok(builder.build())
}

/// [`HttpConnector`], its connections set to close abortively (`SO_LINGER` 0): what a
/// dropped connection, or the socket of a killed process, had not delivered is discarded,
/// never sent later.
#[derive(Clone)]
struct AbortOnClose(HttpConnector);

impl tower::Service<http::Uri> for AbortOnClose {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx).map_err(BoxError::from)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            let io = connecting.await.map_err(BoxError::from)?;
            io.inner().set_zero_linger()?;
            Ok(io)
        })
    }
}

/// How soon a watch of a member's API server (the agent's watches of its own cluster, the
/// hub's watches of the copies) is tried again after an error: from 100 ms, doubling, at
/// most every 2 s, and from the start again once the watch delivers.
///
/// kube's default waits up to 30 s and starts again only after 120 s without an error.
/// Where one backoff serves several watches (a controller's own and owned kinds), each
/// error pauses all of them: after a member's API server came back from a restart, each
/// watch ran into its `410 Gone` in turn, 30 s apart, and the agent took 100 s to see a
/// MyDatabase created meanwhile (the chaos run of seed 917466720). Trying every 2 s while
/// an API server is down costs it little.
#[derive(Clone, Debug)]
pub struct WatchBackoff {
    next: Duration,
}

const WATCH_RETRY_FIRST: Duration = Duration::from_millis(100);
const WATCH_RETRY_MAX: Duration = Duration::from_secs(2);

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff {
            next: WATCH_RETRY_FIRST,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = (self.next * 2).min(WATCH_RETRY_MAX);
        Some(delay)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        *self = WatchBackoff::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_client_is_built_from_a_kubeconfig_with_its_limits() {
        // No server is contacted: building checks the TLS material and credentials.
        let kubeconfig = kube::config::Kubeconfig::from_yaml(
            r#"
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: "t"}
contexts:
- name: x
  context: {cluster: c, user: u, namespace: shop}
current-context: x
"#,
        )
        .unwrap();
        let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        let client = build(
            config,
            Limits {
                idle: Duration::from_secs(1),
                in_flight: Some(2),
                request_timeout: Some(Duration::from_millis(200)),
                unacknowledged: Some(Duration::from_secs(1)),
            },
        )
        .unwrap();
        assert_eq!(client.default_namespace(), "shop");
        // Nothing listens on port 1: the request fails rather than hangs.
        let error = client.apiserver_version().await.unwrap_err();
        assert!(
            matches!(error, kube::Error::HyperError(_) | kube::Error::Service(_)),
            "{error:?}"
        );
    }

    #[test]
    fn a_watch_is_retried_within_2_s_and_from_the_start_once_it_works() {
        use kube::runtime::utils::Backoff;
        let mut backoff = WatchBackoff::default();
        let delays: Vec<u128> = backoff.by_ref().take(7).map(|d| d.as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 2000, 2000]);
        backoff.reset();
        assert_eq!(backoff.next(), Some(Duration::from_millis(100)));
    }
}
