//! What every long-running subcommand shares: connecting to an API server, the probe and
//! metrics server, waiting for CRDs, and shutting down cleanly on SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, Config};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::server::{ProbeServer, Readiness, ServerState};
use crate::{Error, Result};

/// Which cluster to talk to.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ClientOptions {
    /// Kubeconfig file. Without it: $KUBECONFIG, ~/.kube/config, or the in-cluster
    /// service account.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Context in the kubeconfig; defaults to its current context.
    #[arg(long)]
    pub context: Option<String>,
}

/// How a long-running process serves probes and metrics and waits for its CRDs.
#[derive(clap::Args, Clone, Debug)]
pub struct ServeOptions {
    /// Address for /healthz, /readyz and /metrics.
    #[arg(
        long = "probe-address",
        visible_alias = "metrics-address",
        default_value = "0.0.0.0:8080"
    )]
    pub probe_address: SocketAddr,
    /// How long to wait at start for the CRDs to be installed and Established.
    #[arg(long, default_value_t = 120)]
    pub crd_wait_seconds: u64,
}

/// Builds a client from the options (see [`ClientOptions`] for the search order).
pub async fn connect(options: &ClientOptions) -> Result<Client> {
    let kube_options = KubeConfigOptions {
        context: options.context.clone(),
        ..Default::default()
    };
    let config =
        match &options.kubeconfig {
            Some(path) => {
                let kubeconfig_error = |source| Error::Kubeconfig {
                    path: path.display().to_string(),
                    source,
                };
                let kubeconfig = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
                Config::from_custom_kubeconfig(kubeconfig, &kube_options)
                    .await
                    .map_err(kubeconfig_error)?
            }
            None if options.context.is_some() => Config::from_kubeconfig(&kube_options)
                .await
                .map_err(|source| Error::Kubeconfig {
                    path: "$KUBECONFIG".to_string(),
                    source,
                })?,
            None => Config::infer().await.map_err(Error::InferConfig)?,
        };
    let what = config.cluster_url.to_string();
    crate::client::build(config, crate::client::Limits::BULK)
        .map_err(|source| Error::Client { what, source })
}

/// A running process: its client, metrics, readiness and shutdown signal.
pub struct Process {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    /// Cancelled on SIGTERM or Ctrl-C; every loop of the process stops on it.
    pub shutdown: CancellationToken,
    /// The address the probe server listens on.
    pub probe_address: SocketAddr,
    server: JoinHandle<()>,
}

impl Process {
    /// Starts the probe server (not ready), installs the signal handlers, connects and
    /// checks that the API server answers.
    pub async fn start(name: &str, client: &ClientOptions, serve: &ServeOptions) -> Result<Self> {
        let metrics = Arc::new(Metrics::new(name));
        let readiness = Readiness::not_ready("connecting to the API server");
        let shutdown = CancellationToken::new();
        spawn_signal_handler(shutdown.clone());

        let state = ServerState {
            metrics: metrics.clone(),
            readiness: readiness.clone(),
        };
        let server = ProbeServer::bind(serve.probe_address, state).await?;
        let probe_address = server.local_addr();
        let server = tokio::spawn(server.run(shutdown.clone()));
        tracing::info!(%probe_address, "serving /healthz, /readyz and /metrics");

        let client = connect(client).await?;
        let version = client
            .apiserver_version()
            .await
            .map_err(|source| Error::api("reading the API server version", source))?;
        tracing::info!(version = %version.git_version, "connected to the API server");

        Ok(Process {
            client,
            metrics,
            readiness,
            shutdown,
            probe_address,
            server,
        })
    }

    /// Waits until every named CRD is Established, reporting not-ready meanwhile.
    /// Returns `Ok(false)` when shutdown was requested while waiting.
    pub async fn wait_for_crds(&self, names: &[&str], timeout: Duration) -> Result<bool> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        for name in names {
            self.readiness
                .set_not_ready(format!("waiting for CustomResourceDefinition {name}"));
            tracing::info!(crd = name, "waiting for CRD to be established");
            let established = await_condition(api.clone(), name, conditions::is_crd_established());
            tokio::select! {
                _ = self.shutdown.cancelled() => return Ok(false),
                result = tokio::time::timeout(timeout, established) => match result {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => {
                        return Err(Error::Io {
                            action: format!("watching CustomResourceDefinition {name}"),
                            source: std::io::Error::other(error.to_string()),
                        })
                    }
                    Err(_) => return Err(Error::CrdNotEstablished { name: name.to_string(), waited: timeout }),
                },
            }
        }
        Ok(true)
    }

    /// Stops the probe server and waits for it; call after the main loop returned.
    pub async fn finish(self) {
        self.shutdown.cancel();
        let _ = self.server.await;
        tracing::info!("stopped");
    }
}

/// Cancels `shutdown` on SIGTERM or Ctrl-C.
pub fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(error) => {
                    tracing::error!(%error, "cannot install the SIGTERM handler");
                    return;
                }
            };
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM received, shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received, shutting down"),
            _ = shutdown.cancelled() => return,
        }
        shutdown.cancel();
    });
}

/// The controller loop every process starts with before its real reconcilers land: it
/// watches `api`, logs and counts every object it sees, and stops on shutdown. It proves
/// the process can list and watch its kinds with its credentials.
pub async fn observe_kind<K>(process: &Process, api: Api<K>, controller: &'static str)
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + std::fmt::Debug + Unpin,
{
    use futures::StreamExt;
    use kube::runtime::controller::{Action, Controller};
    use kube::runtime::watcher;

    struct Context {
        metrics: Arc<Metrics>,
        controller: &'static str,
    }

    async fn reconcile<K: kube::Resource>(
        object: Arc<K>,
        context: Arc<Context>,
    ) -> std::result::Result<Action, std::convert::Infallible> {
        let started = std::time::Instant::now();
        tracing::debug!(
            controller = context.controller,
            name = %object.meta().name.as_deref().unwrap_or_default(),
            namespace = object.meta().namespace.as_deref().unwrap_or_default(),
            "observed"
        );
        context.metrics.observe_reconcile(
            context.controller,
            started.elapsed().as_secs_f64(),
            true,
        );
        Ok(Action::await_change())
    }

    fn error_policy<K>(_: Arc<K>, _: &std::convert::Infallible, _: Arc<Context>) -> Action {
        Action::await_change()
    }

    let context = Arc::new(Context {
        metrics: process.metrics.clone(),
        controller,
    });
    let shutdown = process.shutdown.clone();
    Controller::new(api, watcher::Config::default())
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::warn!(controller, %error, "controller event failed");
            }
        })
        .await;
}
