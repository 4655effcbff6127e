//! `bulkhead webhook`: validating and mutating admission over TLS (rustls), with
//! per-tenant rules, certificate rotation without restart, and installation of the
//! webhook configurations into the hub and members.
//!
//! - `validate` / `mutate`: the rules (pure);
//! - `tenants`: which tenant an object belongs to (its namespace's label, the single
//!   rule), and tenant rules from ConfigMaps, swapped in atomically;
//! - `admission`: AdmissionReview decoding and dispatch;
//! - `convert`: MyDatabase v1 <-> v1alpha1 conversion (ConversionReview);
//! - `tls`: self-issued or file-based certificates, served per handshake;
//! - `configurations`: the Validating/MutatingWebhookConfigurations.

pub mod admission;
pub mod configurations;
pub mod convert;
pub mod mutate;
pub mod secret_certificates;
pub mod tenants;
pub mod tls;
pub mod validate;

#[cfg(test)]
mod fuzz_tests;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};

use kube::runtime::events::{Recorder, Reporter};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::api::SYSTEM_NAMESPACE;
use crate::process::{ClientOptions, Process, ServeOptions};
use crate::{Error, Result};
use admission::{AdmissionState, Hook};
use configurations::{ClusterRole, ConfigurationSpec, Endpoint};
use tenants::TenantRegistry;

/// Largest review body accepted: the API server sends requests of up to 3 MiB (a large
/// ConversionReview batch, or an UPDATE's AdmissionReview carrying object and oldObject),
/// plus room for the review's own envelope.
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// Longest time a request may take to arrive and be answered.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Reviews read and answered at once, at most: each may hold a body of up to
/// [`MAX_BODY_BYTES`] and its parsed forms, so this bounds the memory requests can take.
/// A review is answered in milliseconds; one that finds every slot taken waits up to
/// [`REVIEW_SLOT_WAIT`], then gets 503.
const REVIEW_SLOTS: usize = 4;
const REVIEW_SLOT_WAIT: Duration = Duration::from_secs(2);

/// The kinds the webhook has rules for; the metrics' `kind` label is one of them or
/// `other` (a label taken from the request would grow without bound).
const REVIEWED_KINDS: [&str; 8] = [
    "MyDatabase",
    "PropagationPolicy",
    "ClusterPropagationPolicy",
    "OverridePolicy",
    "ClusterOverridePolicy",
    "MemberCluster",
    "ResourceInterpreter",
    "StatefulSet",
];

/// The metrics' `kind` label for a request's kind.
fn metric_kind(kind: &str) -> String {
    if REVIEWED_KINDS.contains(&kind) {
        kind.to_string()
    } else {
        "other".to_string()
    }
}

/// A review as the API server sends it (`apiVersion`, `kind`, `request`). Serde would
/// read a struct from a JSON array too (`"request": ["", "", []]`), which the API server
/// never sends: `request` must be a JSON object.
#[derive(serde::Deserialize)]
struct Envelope<R> {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default = "Option::default")]
    request: Option<ObjectOnly<R>>,
}

/// A value that deserializes only from a JSON object.
struct ObjectOnly<T>(T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("the review's request as a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        deserializer
            .deserialize_map(Visit(std::marker::PhantomData))
            .map(ObjectOnly)
    }
}

/// Reads a review body: its `apiVersion`/`kind` and its request. Errors name `what`
/// (AdmissionReview, ConversionReview) and what is wrong. Parsed whole into a JSON value
/// first: a typed parse skips unknown fields without checking them (the fuzz tests found
/// invalid UTF-8 inside a skipped field accepted), and a body that is not JSON must be
/// refused, not half-read.
fn read_review<R: serde::de::DeserializeOwned>(
    body: &[u8],
    what: &str,
) -> std::result::Result<(kube::core::TypeMeta, R), String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not a {what}: {e}"))?;
    let envelope: Envelope<R> =
        serde_json::from_value(value).map_err(|e| format!("the body is not a {what}: {e}"))?;
    let types = kube::core::TypeMeta {
        api_version: envelope.api_version,
        kind: envelope.kind,
    };
    let request = envelope
        .request
        .ok_or_else(|| format!("the {what} has no request"))?;
    Ok((types, request.0))
}

/// `bulkhead webhook` options.
#[derive(clap::Args, Clone, Debug)]
pub struct WebhookOptions {
    #[command(flatten)]
    pub client: ClientOptions,
    #[command(flatten)]
    pub serve: ServeOptions,
    #[command(flatten)]
    pub server: WebhookServerOptions,
    /// Install the hub-side configurations into the cluster of --kubeconfig.
    #[arg(long)]
    pub configure_hub: bool,
    /// Install the member-side configurations into the cluster of this kubeconfig (repeatable).
    #[arg(long)]
    pub configure_member: Vec<PathBuf>,
}

/// How the webhook server runs, standalone or inside `bulkhead hub`/`bulkhead agent`.
#[derive(clap::Args, Clone, Debug)]
pub struct WebhookServerOptions {
    /// HTTPS address for /validate and /mutate.
    #[arg(long, default_value = "0.0.0.0:9443")]
    pub listen: SocketAddr,
    /// Serving certificate (PEM), re-read when it changes. Without it the webhook issues
    /// its own CA and certificate and publishes the CA as caBundle.
    #[arg(long, requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key for --tls-cert-file (PEM).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// CA bundle (PEM) to publish when serving from files; re-read when it changes.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Keep the CA and serving certificate in this Secret (`namespace/name`): every
    /// process serving the webhook reads it, the first to find a certificate due renews
    /// it (the chart's default mode; docs/admission.md, "Certificates").
    #[arg(long, conflicts_with_all = ["tls_cert_file", "ca_file"])]
    pub tls_secret: Option<String>,
    /// Lifetime of a serving certificate issued into --tls-secret (renewed when a third
    /// is left).
    #[arg(long, default_value_t = 90 * 86400)]
    pub serving_cert_validity_seconds: u64,
    /// Lifetime of a CA issued into --tls-secret (renewed when a third is left; the old CA
    /// stays in the bundle until it expires).
    #[arg(long, default_value_t = 3650 * 86400)]
    pub ca_validity_seconds: u64,
    /// Never write caBundle: cert-manager's CA injector writes it (the chart's
    /// certManager mode).
    #[arg(long)]
    pub ca_bundle_injected: bool,
    /// Subject alternative names of a self-issued certificate.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "127.0.0.1,localhost,bulkhead-webhook.bulkhead-system.svc"
    )]
    pub cert_sans: Vec<String>,
    /// Re-issue a self-issued serving certificate this often (same CA, so the caBundle
    /// stays valid).
    #[arg(long, default_value_t = 86400)]
    pub rotate_every_seconds: u64,
    /// How API servers reach the webhook: a base URL (e.g. https://127.0.0.1:9443)...
    #[arg(long)]
    pub url: Option<String>,
    /// ...or a Service `namespace/name[:port]` (default bulkhead-system/bulkhead-webhook:443).
    #[arg(long)]
    pub service: Option<String>,
    /// Base name of the webhook configurations.
    #[arg(long, default_value = "bulkhead")]
    pub configuration_name: String,
    /// Only admit objects (and namespaces) carrying this `key=value` label.
    #[arg(long)]
    pub selector_label: Option<String>,
    /// Serve MyDatabase v1alpha1 through this webhook's /convert in every configured
    /// cluster (sets the CRD's conversion webhook and caBundle, and keeps them set).
    #[arg(long)]
    pub conversion: bool,
    /// Reject policies that name clusters not registered as MemberClusters.
    #[arg(long)]
    pub strict: bool,
    /// Namespace holding the tenant rule ConfigMaps.
    #[arg(long, default_value = SYSTEM_NAMESPACE)]
    pub tenant_namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    webhook: String,
    kind: String,
    operation: String,
    result: String,
}

#[derive(Clone)]
struct WebhookMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: Histogram,
}

struct Server {
    state: AdmissionState,
    metrics: WebhookMetrics,
    /// [`REVIEW_SLOTS`] permits.
    reviews: tokio::sync::Semaphore,
}

fn respond(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

/// The review endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReviewPath {
    Validate,
    Mutate,
    Convert,
}

impl ReviewPath {
    fn name(self) -> &'static str {
        match self {
            ReviewPath::Validate => "validate",
            ReviewPath::Mutate => "mutate",
            ReviewPath::Convert => "convert",
        }
    }
}

impl Server {
    async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = match request.uri().path() {
            "/convert" => ReviewPath::Convert,
            "/validate" => ReviewPath::Validate,
            "/mutate" => ReviewPath::Mutate,
            "/healthz" => return respond(StatusCode::OK, "text/plain", b"ok\n".to_vec()),
            "/readyz" => {
                return match self.state.tenants.snapshot().waiting_for() {
                    None => respond(StatusCode::OK, "text/plain", b"ok\n".to_vec()),
                    Some(waiting) => respond(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain",
                        format!("not ready: still listing {waiting}\n").into_bytes(),
                    ),
                };
            }
            _ => {
                return respond(
                    StatusCode::NOT_FOUND,
                    "text/plain",
                    b"not found; the webhook serves /validate, /mutate and /convert\n".to_vec(),
                );
            }
        };
        if request.method() != Method::POST {
            let what: &[u8] = if path == ReviewPath::Convert {
                b"POST a ConversionReview\n"
            } else {
                b"POST an AdmissionReview\n"
            };
            return respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain", what.to_vec());
        }
        let _slot = match self.review_slot().await {
            Ok(slot) => slot,
            Err(busy) => return busy,
        };
        let body = match Limited::new(request.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
        {
            Ok(collected) => collected.to_bytes(),
            Err(error) => {
                return respond(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "text/plain",
                    format!("cannot read the body (at most {MAX_BODY_BYTES} bytes): {error}\n")
                        .into_bytes(),
                );
            }
        };
        self.answer(path, &body)
    }

    /// One of the [`REVIEW_SLOTS`], or 503 once none came free in [`REVIEW_SLOT_WAIT`].
    async fn review_slot(
        &self,
    ) -> std::result::Result<tokio::sync::SemaphorePermit<'_>, Response<Full<Bytes>>> {
        match tokio::time::timeout(REVIEW_SLOT_WAIT, self.reviews.acquire()).await {
            Ok(Ok(slot)) => Ok(slot),
            _ => Err(respond(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!(
                    "too many reviews at once ({REVIEW_SLOTS} are answered at a time); try again\n"
                )
                .into_bytes(),
            )),
        }
    }

    /// Answers one review body posted to `path`: every request goes through here once
    /// its body is read, and the fuzz test drives it directly. 200 with a review answering
    /// the request (same uid), or 400 when the body is not such a review.
    fn answer(&self, path: ReviewPath, body: &[u8]) -> Response<Full<Bytes>> {
        let started = Instant::now();
        let (response, kind, operation, result) = match path {
            ReviewPath::Convert => match convert::review(body) {
                Ok(answer) => (
                    respond(StatusCode::OK, "application/json", answer),
                    "MyDatabase".to_string(),
                    "CONVERT".to_string(),
                    "converted",
                ),
                Err(message) => (
                    respond(
                        StatusCode::BAD_REQUEST,
                        "text/plain",
                        format!("{message}\n").into_bytes(),
                    ),
                    "MyDatabase".to_string(),
                    "CONVERT".to_string(),
                    "malformed",
                ),
            },
            ReviewPath::Validate | ReviewPath::Mutate => {
                let hook = if path == ReviewPath::Validate {
                    Hook::Validate
                } else {
                    Hook::Mutate
                };
                match admission::decode(body) {
                    Ok(request) => {
                        let (response, outcome) = admission::review(hook, &request, &self.state);
                        if outcome == admission::Outcome::Denied {
                            tracing::info!(kind = %request.kind.kind, name = %request.name, message = %response.result.message, "denied");
                        }
                        (
                            respond(
                                StatusCode::OK,
                                "application/json",
                                admission::encode(response),
                            ),
                            metric_kind(&request.kind.kind),
                            format!("{:?}", request.operation).to_uppercase(),
                            outcome.as_str(),
                        )
                    }
                    Err(message) => (
                        respond(
                            StatusCode::BAD_REQUEST,
                            "text/plain",
                            format!("{message}\n").into_bytes(),
                        ),
                        "unknown".to_string(),
                        "unknown".to_string(),
                        admission::Outcome::Malformed.as_str(),
                    ),
                }
            }
        };
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                webhook: path.name().into(),
                kind,
                operation,
                result: result.into(),
            })
            .inc();
        self.metrics
            .duration
            .observe(started.elapsed().as_secs_f64());
        response
    }
}

/// The webhook's listener: the API servers keep a few connections each; anything on the
/// pod network can connect.
const WEBHOOK_LIMITS: crate::server::ConnectionLimits = crate::server::ConnectionLimits {
    max_connections: 256,
    header_read_timeout: Duration::from_secs(10),
    // Under the idle timeout: an API server's idle HTTP/2 connection answers the pings
    // and stays (until its maximum age), a silent client goes.
    keep_alive_interval: Duration::from_secs(20),
    idle_timeout: Duration::from_secs(30),
    max_age: Duration::from_secs(600),
};

/// Serves HTTPS on `listener` until shutdown; every handshake uses the store's current
/// certificate.
async fn serve(
    listener: tokio::net::TcpListener,
    acceptor: TlsAcceptor,
    server: Arc<Server>,
    shutdown: CancellationToken,
) {
    crate::server::serve_limited(
        listener,
        WEBHOOK_LIMITS,
        "webhook",
        move |stream| {
            let acceptor = acceptor.clone();
            async move {
                let peer = stream.peer_addr().ok();
                match acceptor.accept(stream).await {
                    Ok(tls) => Some(tls),
                    Err(error) => {
                        tracing::debug!(?peer, %error, "TLS handshake failed");
                        None
                    }
                }
            }
        },
        move || {
            let server = server.clone();
            hyper::service::service_fn(move |request| {
                let server = server.clone();
                async move {
                    let answer =
                        tokio::time::timeout(REQUEST_TIMEOUT, server.handle(request)).await;
                    Ok::<_, Infallible>(answer.unwrap_or_else(|_| {
                        respond(
                            StatusCode::REQUEST_TIMEOUT,
                            "text/plain",
                            b"the request took too long\n".to_vec(),
                        )
                    }))
                }
            })
        },
        shutdown,
    )
    .await;
}

fn endpoint(options: &WebhookServerOptions) -> Endpoint {
    if let Some(url) = &options.url {
        return Endpoint::Url(url.clone());
    }
    let text = options
        .service
        .clone()
        .unwrap_or_else(|| format!("{SYSTEM_NAMESPACE}/bulkhead-webhook:443"));
    let (namespace, rest) = text
        .split_once('/')
        .unwrap_or((SYSTEM_NAMESPACE, text.as_str()));
    let (name, port) = rest
        .split_once(':')
        .map(|(n, p)| (n, p.parse().unwrap_or(443)))
        .unwrap_or((rest, 443));
    Endpoint::Service {
        namespace: namespace.into(),
        name: name.into(),
        port,
    }
}

/// Runs the webhook until SIGTERM.
pub async fn run(options: WebhookOptions) -> Result<()> {
    let process = Process::start("webhook", &options.client, &options.serve).await?;
    let mut targets = vec![];
    if options.configure_hub {
        targets.push(("hub".to_string(), process.client.clone(), ClusterRole::Hub));
    }
    for kubeconfig in &options.configure_member {
        let member = crate::process::connect(&ClientOptions {
            kubeconfig: Some(kubeconfig.clone()),
            context: None,
        })
        .await?;
        targets.push((
            kubeconfig.display().to_string(),
            member,
            ClusterRole::Member,
        ));
    }
    // Ready once the tenant rules are listed (the webhook's own task says so).
    let serving = start(&process, &options.server, targets).await?;
    let _ = serving.await;
    process.finish().await;
    Ok(())
}

/// Starts the webhook inside `process`: certificates, tenant rules, the HTTPS listener,
/// then the configurations in every target cluster. Returns the serving task.
pub async fn start(
    process: &Process,
    options: &WebhookServerOptions,
    targets: Vec<(String, kube::Client, ClusterRole)>,
) -> Result<tokio::task::JoinHandle<()>> {
    let client = process.client.clone();

    // Certificates. The bundle to publish is empty until it is known (a Secret not read
    // yet); the configurations wait for it.
    let bundle = Arc::new(ArcSwap::from_pointee(String::new()));
    let bundle_changed = Arc::new(tokio::sync::Notify::new());
    let issue_error = |e: tls::TlsError| Error::Io {
        action: "issuing the webhook certificate".into(),
        source: std::io::Error::other(e.to_string()),
    };
    let store = match (
        &options.tls_cert_file,
        &options.tls_key_file,
        &options.tls_secret,
    ) {
        (Some(cert), Some(key), _) => {
            let loaded = tls::load_files(cert, key).map_err(|e| Error::Io {
                action: "loading the serving certificate".into(),
                source: std::io::Error::other(e.to_string()),
            })?;
            let store = tls::CertificateStore::new(loaded);
            tokio::spawn(tls::watch_files(
                store.clone(),
                cert.clone(),
                key.clone(),
                Duration::from_secs(2),
                process.shutdown.clone(),
            ));
            // Without --ca-file the certificate file's chain is published.
            let ca_path = options.ca_file.clone().unwrap_or_else(|| cert.clone());
            let pem = std::fs::read_to_string(&ca_path).map_err(|source| Error::Io {
                action: format!("reading {}", ca_path.display()),
                source,
            })?;
            bundle.store(Arc::new(pem));
            tokio::spawn(tls::watch_bundle_file(
                ca_path,
                bundle.clone(),
                bundle_changed.clone(),
                Duration::from_secs(2),
                process.shutdown.clone(),
            ));
            store
        }
        (_, _, Some(secret)) => {
            let (namespace, name) = secret
                .split_once('/')
                .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
                .ok_or_else(|| Error::InvalidOption {
                    option: format!("--tls-secret {secret:?}"),
                    reason: "give the Secret as namespace/name, e.g. bulkhead-system/bulkhead-webhook-certs".into(),
                })?;
            // Served until the Secret was read (the process is not ready meanwhile, and
            // no configuration names this certificate's CA).
            let placeholder = tls::CertificateAuthority::new("bulkhead-webhook-placeholder")
                .and_then(|ca| ca.issue(&options.cert_sans))
                .and_then(|i| tls::certified_key(&i.cert_pem, &i.key_pem))
                .map_err(issue_error)?;
            let store = tls::CertificateStore::new(placeholder);
            tokio::spawn(secret_certificates::keep(
                client.clone(),
                secret_certificates::SecretSource {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    sans: options.cert_sans.clone(),
                    lifetimes: secret_certificates::Lifetimes {
                        serving: Duration::from_secs(options.serving_cert_validity_seconds.max(60)),
                        ca: Duration::from_secs(options.ca_validity_seconds.max(180)),
                    },
                },
                secret_certificates::Published {
                    store: store.clone(),
                    bundle: bundle.clone(),
                    changed: bundle_changed.clone(),
                },
                process.shutdown.clone(),
            ));
            store
        }
        _ => {
            let authority =
                tls::CertificateAuthority::new("bulkhead-webhook-ca").map_err(issue_error)?;
            let issued = authority.issue(&options.cert_sans).map_err(issue_error)?;
            let key = tls::certified_key(&issued.cert_pem, &issued.key_pem).map_err(issue_error)?;
            bundle.store(Arc::new(issued.ca_pem));
            let store = tls::CertificateStore::new(key);
            tokio::spawn(rotate_self_issued(
                authority,
                store.clone(),
                options.cert_sans.clone(),
                Duration::from_secs(options.rotate_every_seconds.max(1)),
                process.shutdown.clone(),
            ));
            store
        }
    };

    // Tenants and (strict mode) known clusters.
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "bulkhead-webhook".into(),
            instance: std::env::var("HOSTNAME").ok(),
        },
    );
    let tenants = TenantRegistry::new();
    tokio::spawn(tenants::watch(
        client.clone(),
        options.tenant_namespace.clone(),
        tenants.clone(),
        recorder,
        process.shutdown.clone(),
    ));
    let known_clusters = if options.strict {
        let known = Arc::new(ArcSwap::from_pointee(Vec::<String>::new()));
        tokio::spawn(watch_cluster_names(
            client.clone(),
            known.clone(),
            process.shutdown.clone(),
        ));
        Some(known)
    } else {
        None
    };

    let metrics = WebhookMetrics {
        requests: Family::default(),
        duration: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
    };
    process.metrics.register(
        "webhook_requests",
        "Admission requests by webhook, kind, operation and result",
        metrics.requests.clone(),
    );
    process.metrics.register(
        "webhook_request_duration_seconds",
        "Time to answer one admission request",
        metrics.duration.clone(),
    );

    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|source| Error::Bind {
            addr: options.listen.to_string(),
            source,
        })?;
    tracing::info!(address = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), "serving admission over HTTPS");
    let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(store)));
    let server = Arc::new(Server {
        state: AdmissionState {
            tenants: tenants.clone(),
            known_clusters,
        },
        metrics,
        reviews: tokio::sync::Semaphore::new(REVIEW_SLOTS),
    });
    let serving = tokio::spawn(serve(listener, acceptor, server, process.shutdown.clone()));

    // Not ready until the tenant rules and namespace labels are listed: until then the
    // server answers, but denies tenant-governed requests (configurations left by an
    // earlier run already send them here). The configurations are installed only after,
    // so a first start has no such window at all. All of it in the background: a webhook
    // that cannot be set up (a permission missing, an API server slow) never holds up the
    // process that serves it (the hub's leader election and controller go on).
    let spec = ConfigurationSpec {
        name: options.configuration_name.clone(),
        endpoint: endpoint(options),
        ca_bundle_pem: None,
        selector_label: options
            .selector_label
            .as_ref()
            .and_then(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string())),
    };
    let readiness = process.readiness.clone();
    let shutdown = process.shutdown.clone();
    let tenant_namespace = options.tenant_namespace.clone();
    let conversion = options.conversion;
    let published = PublishedBundle {
        bundle,
        changed: bundle_changed,
        injected: options.ca_bundle_injected,
    };
    let secret = options.tls_secret.clone();
    tokio::spawn(async move {
        if !wait_for_tenants(&readiness, &shutdown, &tenants, &tenant_namespace).await {
            return;
        }
        if let Some(secret) = secret
            && !wait_for_certificate(&readiness, &shutdown, &published, &secret).await
        {
            return;
        }
        readiness.set_ready();
        keep_configurations(targets, spec, published, conversion, shutdown).await;
    });
    Ok(serving)
}

/// How often the configurations are checked. One found missing at two checks in a row
/// is created again: `helm uninstall` deletes the configurations a moment before it
/// deletes the Deployment, and a webhook that re-created them in that moment would leave
/// configurations behind that point at nothing (with `failurePolicy: Fail`, they would
/// block every write of their kinds); the pod is told to stop well within a check.
const CONFIGURATIONS_EVERY: Duration = Duration::from_secs(15);

/// Installs the webhook configurations in every target, then keeps them: one deleted (and
/// still missing a check later) is created again, the MyDatabase conversion (with
/// `conversion`) is set again when the CRD was re-applied. A failure is logged with its
/// fix and tried again; it never ends the process.
async fn keep_configurations(
    targets: Vec<(String, kube::Client, ClusterRole)>,
    mut spec: ConfigurationSpec,
    published: PublishedBundle,
    conversion: bool,
    shutdown: CancellationToken,
) {
    // Per target: installed once, with which bundle, and what was missing at the last check.
    let mut installed = vec![false; targets.len()];
    let mut installed_bundle: Vec<Option<String>> = vec![None; targets.len()];
    let mut missing_before: Vec<Vec<String>> = vec![vec![]; targets.len()];
    loop {
        spec.ca_bundle_pem = published.current();
        let mut failed = false;
        for (i, (name, cluster, role)) in targets.iter().enumerate() {
            let mut recreate = vec![];
            // A new CA bundle (certificates renewed, or files replaced) is written at once.
            if installed[i] && installed_bundle[i] != spec.ca_bundle_pem {
                match configurations::install(cluster, &spec, *role).await {
                    Ok(()) => {
                        tracing::info!(cluster = %name, "webhook configurations carry the new CA bundle");
                        installed_bundle[i] = spec.ca_bundle_pem.clone();
                    }
                    Err(error) => {
                        failed = true;
                        tracing::warn!(cluster = %name, %error, "cannot write the new CA bundle into the webhook configurations; trying again");
                    }
                }
            }
            if installed[i] {
                match configurations::missing(cluster, &spec).await {
                    Ok(missing) => {
                        recreate = missing
                            .iter()
                            .filter(|m| missing_before[i].contains(m))
                            .cloned()
                            .collect();
                        if !missing.is_empty() && recreate.is_empty() {
                            tracing::warn!(cluster = %name, missing = %missing.join(", "), "webhook configurations deleted; creating them again if they are still missing at the next check");
                        }
                        missing_before[i] = missing;
                    }
                    Err(error) => {
                        tracing::warn!(cluster = %name, %error, "cannot read the webhook configurations (the webhook needs get, create and patch on its own Validating- and MutatingWebhookConfiguration)");
                        failed = true;
                        continue;
                    }
                }
            }
            if !installed[i] || !recreate.is_empty() {
                match configurations::install(cluster, &spec, *role).await {
                    Ok(()) if installed[i] => {
                        tracing::warn!(cluster = %name, created = %recreate.join(", "), "webhook configurations were deleted; created them again");
                        missing_before[i].clear();
                    }
                    Ok(()) => {
                        tracing::info!(cluster = %name, ?role, "webhook configurations installed");
                        installed[i] = true;
                        installed_bundle[i] = spec.ca_bundle_pem.clone();
                    }
                    Err(error) => {
                        failed = true;
                        tracing::warn!(cluster = %name, ?role, %error, "cannot install the webhook configurations; trying again (the webhook needs get, create and patch on {}-validating and {}-mutating)", spec.name, spec.name);
                    }
                }
            }
            if conversion && installed[i] {
                match configurations::ensure_conversion(cluster, &spec).await {
                    Ok(true) => {
                        tracing::info!(cluster = %name, "MyDatabase v1alpha1 served through this webhook (conversion configured)")
                    }
                    Ok(false) => {}
                    Err(error) => {
                        failed = true;
                        tracing::warn!(cluster = %name, %error, "cannot configure the MyDatabase conversion webhook; trying again");
                    }
                }
            }
        }
        let wait = if failed {
            Duration::from_secs(5)
        } else {
            CONFIGURATIONS_EVERY
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            _ = published.changed.notified() => {}
        }
    }
}

/// The CA bundle the configurations carry.
struct PublishedBundle {
    bundle: Arc<ArcSwap<String>>,
    changed: Arc<tokio::sync::Notify>,
    /// cert-manager's CA injector writes caBundle; the webhook leaves it alone.
    injected: bool,
}

impl PublishedBundle {
    fn current(&self) -> Option<String> {
        (!self.injected).then(|| self.bundle.load().to_string())
    }
}

/// Waits until the certificates of `--tls-secret` were read (not ready meanwhile).
async fn wait_for_certificate(
    readiness: &crate::server::Readiness,
    shutdown: &CancellationToken,
    published: &PublishedBundle,
    secret: &str,
) -> bool {
    let started = Instant::now();
    while published.bundle.load().is_empty() {
        readiness.set_not_ready(format!(
            "webhook: reading its certificate from Secret {secret}"
        ));
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = published.changed.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(15)) => {
                tracing::warn!(waited = ?started.elapsed(), %secret, "still no webhook certificate; the webhook is not ready (check its permission to get, create and update that Secret)");
            }
        }
    }
    true
}

/// Re-issues a self-issued serving certificate every `every` (same CA, so the published
/// bundle stays valid).
async fn rotate_self_issued(
    authority: tls::CertificateAuthority,
    store: Arc<tls::CertificateStore>,
    sans: Vec<String>,
    every: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        match authority
            .issue(&sans)
            .and_then(|i| tls::certified_key(&i.cert_pem, &i.key_pem))
        {
            Ok(key) => {
                store.replace(key);
                tracing::info!("serving certificate rotated");
            }
            Err(error) => {
                tracing::warn!(%error, "certificate rotation failed; keeping the current one")
            }
        }
    }
}

async fn wait_for_tenants(
    readiness: &crate::server::Readiness,
    shutdown: &CancellationToken,
    tenants: &TenantRegistry,
    tenant_namespace: &str,
) -> bool {
    let started = Instant::now();
    loop {
        let Some(waiting) = tenants.snapshot().waiting_for() else {
            tracing::info!(waited = ?started.elapsed(), "tenant rules and namespace labels synced");
            return true;
        };
        readiness.set_not_ready(format!(
            "webhook: listing {waiting} (rules in namespace {tenant_namespace}); tenant-governed requests are denied until then"
        ));
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tenants.wait_until_synced() => {}
            _ = tokio::time::sleep(Duration::from_secs(15)) => {
                tracing::warn!(waited = ?started.elapsed(), %waiting, namespace = %tenant_namespace, "still listing tenant rules; the webhook is not ready and denies tenant-governed requests (check its permission to list and watch namespaces and ConfigMaps there)");
            }
        }
    }
}

async fn watch_cluster_names(
    client: kube::Client,
    known: Arc<ArcSwap<Vec<String>>>,
    shutdown: CancellationToken,
) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let (store, writer) = reflector::store::<crate::api::MemberCluster>();
    let mut stream = reflector(
        writer,
        watcher(kube::Api::all(client), watcher::Config::default()),
    )
    .default_backoff()
    .boxed();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            event = stream.next() => {
                if event.is_none() { return; }
                let mut names: Vec<String> = store.state().iter().filter_map(|c| c.metadata.name.clone()).collect();
                names.sort();
                known.store(Arc::new(names));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A registry that has listed everything (and found no tenants).
    pub(super) fn synced_registry() -> Arc<TenantRegistry> {
        let tenants = TenantRegistry::new();
        tenants.store_rules(Default::default());
        tenants.store_namespaces(Default::default());
        tenants
    }

    #[tokio::test(start_paused = true)]
    async fn reviews_beyond_the_slots_wait_then_get_503() {
        let server = test_server(synced_registry());
        let taken = server
            .reviews
            .acquire_many(REVIEW_SLOTS as u32)
            .await
            .unwrap();
        let busy = server.review_slot().await.expect_err("every slot is taken");
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        drop(taken);
        assert!(server.review_slot().await.is_ok());
    }

    #[test]
    fn the_kind_label_is_one_of_a_fixed_set() {
        assert_eq!(metric_kind("MyDatabase"), "MyDatabase");
        assert_eq!(metric_kind("Anything-a-caller-sends-1234"), "other");
    }

    pub(super) fn test_server(tenants: Arc<TenantRegistry>) -> Server {
        Server {
            state: AdmissionState {
                tenants,
                known_clusters: None,
            },
            metrics: WebhookMetrics {
                requests: Family::default(),
                duration: Histogram::new(exponential_buckets(0.001, 2.0, 4)),
            },
            reviews: tokio::sync::Semaphore::new(REVIEW_SLOTS),
        }
    }

    async fn start_server() -> (SocketAddr, String, CancellationToken) {
        start_server_with(synced_registry()).await
    }

    async fn start_server_with(
        tenants: Arc<TenantRegistry>,
    ) -> (SocketAddr, String, CancellationToken) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let authority = tls::CertificateAuthority::new("test-ca").unwrap();
        let issued = authority.issue(&["127.0.0.1".into()]).unwrap();
        let store = tls::CertificateStore::new(
            tls::certified_key(&issued.cert_pem, &issued.key_pem).unwrap(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = Arc::new(test_server(tenants));
        let shutdown = CancellationToken::new();
        let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(store)));
        tokio::spawn(serve(listener, acceptor, server, shutdown.clone()));
        (addr, issued.ca_pem, shutdown)
    }

    /// Sends one HTTP/1.1 request over TLS, trusting `ca_pem`; returns status and body.
    async fn send(
        addr: SocketAddr,
        ca_pem: &str,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> (u16, String) {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = connector.connect(name, tcp).await.unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        let _ = tls.write_all(body).await;
        // What rustls still holds goes out now: without it the end of a body can stay in
        // the client's buffer while it waits for the answer (seen: a body of 4 MiB + 1 KiB
        // stalled until the server's request timeout, a 408 instead of the 413).
        let _ = tls.flush().await;
        let mut raw = Vec::new();
        let _ = tls.read_to_end(&mut raw).await;
        let text = String::from_utf8_lossy(&raw).to_string();
        let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        (
            status,
            text.split_once("\r\n\r\n")
                .map(|(_, b)| b.to_string())
                .unwrap_or_default(),
        )
    }

    #[tokio::test]
    async fn malformed_requests_get_clean_4xx_answers_over_tls() {
        let (addr, ca, shutdown) = start_server().await;
        for body in [
            &b""[..],
            b"{",
            b"null",
            b"[1,2]",
            b"{\"request\":{}}",
            b"\xff\xfe\xfd",
        ] {
            let (status, answer) = send(addr, &ca, "POST", "/validate", body).await;
            assert_eq!(
                status,
                400,
                "{:?} -> {answer}",
                String::from_utf8_lossy(body)
            );
        }
        assert_eq!(
            send(addr, &ca, "POST", "/convert", b"{nonsense").await.0,
            400
        );
        assert_eq!(send(addr, &ca, "GET", "/nowhere", b"").await.0, 404);
        assert_eq!(send(addr, &ca, "GET", "/validate", b"").await.0, 405);
        let huge = vec![b' '; MAX_BODY_BYTES + 1024];
        assert_eq!(send(addr, &ca, "POST", "/mutate", &huge).await.0, 413);
        // And a well-formed review still gets its answer.
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"group": "example.com", "version": "v1", "kind": "MyDatabase"},
                        "resource": {"group": "example.com", "version": "v1", "resource": "mydatabases"},
                        "name": "a", "namespace": "n", "operation": "CREATE", "userInfo": {},
                        "object": {"apiVersion": "example.com/v1", "kind": "MyDatabase", "metadata": {"name": "a"}, "spec": {"replicas": 20}}}
        });
        let (status, answer) = send(
            addr,
            &ca,
            "POST",
            "/validate",
            &serde_json::to_vec(&review).unwrap(),
        )
        .await;
        assert_eq!(status, 200);
        assert!(
            answer.contains("\"allowed\":false") && answer.contains("spec.replicas is 20"),
            "{answer}"
        );
        shutdown.cancel();
    }

    /// The API server sends up to 3 MiB; a 2.5 MiB ConversionReview (a large batch) is
    /// converted, not refused for its size.
    #[tokio::test]
    async fn a_large_conversion_batch_is_converted() {
        let (addr, ca, shutdown) = start_server().await;
        let object = |i: usize| {
            serde_json::json!({"apiVersion": "example.com/v1", "kind": "MyDatabase",
                "metadata": {"name": format!("db-{i}"), "namespace": "shop",
                             "annotations": {"padding": "x".repeat(2000)}},
                "spec": {"replicas": 3, "version": "16", "storage": {"size": "1Gi"}}})
        };
        let mut objects = vec![];
        let mut review = serde_json::json!({});
        let mut body = vec![];
        while body.len() < 5 * 1024 * 1024 / 2 {
            objects.push(object(objects.len()));
            if objects.len() % 100 == 0 || body.is_empty() {
                review = serde_json::json!({
                    "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
                    "request": {"uid": "big-batch", "desiredAPIVersion": "example.com/v1alpha1", "objects": objects}
                });
                body = serde_json::to_vec(&review).unwrap();
            }
        }
        assert!(body.len() > 2 * 1024 * 1024 + 512 * 1024 && body.len() < MAX_BODY_BYTES);
        let count = review["request"]["objects"].as_array().unwrap().len();
        let (status, answer) = send(addr, &ca, "POST", "/convert", &body).await;
        assert_eq!(status, 200, "{}", &answer[..answer.len().min(300)]);
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["response"]["uid"], "big-batch");
        assert_eq!(answer["response"]["result"]["status"], "Success");
        let converted = answer["response"]["convertedObjects"].as_array().unwrap();
        assert_eq!(converted.len(), count);
        assert_eq!(converted[count - 1]["spec"]["instances"], 3);
        shutdown.cancel();
    }

    /// The webhook port's /readyz follows the tenant sync, and a tenant-governed request
    /// sent before it is denied with the reason.
    #[tokio::test]
    async fn not_ready_and_denying_until_the_tenant_rules_are_synced() {
        let tenants = TenantRegistry::new();
        let (addr, ca, shutdown) = start_server_with(tenants.clone()).await;
        let (status, body) = send(addr, &ca, "GET", "/readyz", b"").await;
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("tenant rule ConfigMaps"), "{body}");
        let review = serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"group": "example.com", "version": "v1", "kind": "MyDatabase"},
                        "resource": {"group": "example.com", "version": "v1", "resource": "mydatabases"},
                        "name": "a", "namespace": "n", "operation": "CREATE", "userInfo": {},
                        "object": {"apiVersion": "example.com/v1", "kind": "MyDatabase", "metadata": {"name": "a"}, "spec": {"replicas": 2}}}
        }))
        .unwrap();
        let (status, answer) = send(addr, &ca, "POST", "/validate", &review).await;
        assert_eq!(status, 200);
        assert!(
            answer.contains("\"allowed\":false") && answer.contains("still syncing"),
            "{answer}"
        );
        tenants.store_rules(Default::default());
        assert_eq!(send(addr, &ca, "GET", "/readyz", b"").await.0, 503);
        tenants.store_namespaces(Default::default());
        assert_eq!(send(addr, &ca, "GET", "/readyz", b"").await.0, 200);
        let (_, answer) = send(addr, &ca, "POST", "/validate", &review).await;
        assert!(answer.contains("\"allowed\":true"), "{answer}");
        shutdown.cancel();
    }
}
