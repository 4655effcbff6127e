//! The member side: the MyDatabase operator and the fence watcher.
//!
//! - `builders`: the children of a MyDatabase (pure);
//! - `status`: its status (pure);
//! - `fence`: the hub-lease watcher that decides whether this member is fenced;
//! - `volumes`: what a deletion does with the volumes, and their reuse (pure);
//! - `roles`: which instance of a database is its primary (pure);
//! - `upgrade`: which database pod a version upgrade replaces next (pure);
//! - `instances`: asks and tells each database pod's instance manager, every round;
//! - `reconciler`: read -> build -> apply -> report.

pub mod builders;
pub mod fence;
pub mod instances;
pub mod reconciler;
pub mod roles;
pub mod status;
pub mod upgrade;
pub mod volumes;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Api;
use kube::runtime::controller::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;
use tokio::sync::watch;

use crate::Result;
use crate::api::{MyDatabase, SYSTEM_NAMESPACE};
use crate::process::{ClientOptions, Process, ServeOptions};
use fence::FenceSettings;
use reconciler::{AgentMetrics, Context};

fn parse_label(text: &str) -> std::result::Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!(
            "{text:?} is not KEY=VALUE (for example --database-node-selector=node-role/db=true)"
        )),
    }
}

/// The CRDs the agent needs in its member cluster.
pub const AGENT_CRDS: &[&str] = &["mydatabases.example.com"];

/// `bulkhead agent` options.
#[derive(clap::Args, Clone, Debug)]
pub struct AgentOptions {
    #[command(flatten)]
    pub client: ClientOptions,
    #[command(flatten)]
    pub serve: ServeOptions,
    /// Manage MyDatabases in this namespace only (default: every namespace).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Standalone use without a hub: never fence.
    #[arg(long)]
    pub no_fencing: bool,
    /// Namespace of the hub's fencing Lease.
    #[arg(long, default_value = SYSTEM_NAMESPACE)]
    pub lease_namespace: String,
    /// Name of the hub's fencing Lease.
    #[arg(long, default_value = "bulkhead-hub")]
    pub lease_name: String,
    /// Lease duration assumed until the Lease states its own (seconds).
    #[arg(long, default_value_t = 10.0)]
    pub lease_duration_seconds: f64,
    /// How long the Lease must be fresh again before writes resume (seconds; default 2 x
    /// the hub's 2 s renew interval).
    #[arg(long, default_value_t = 4.0)]
    pub unfence_after_seconds: f64,
    /// Upper bound for one reconcile (seconds).
    #[arg(long, default_value_t = 30)]
    pub reconcile_timeout_seconds: u64,
    /// Also serve the admission webhook in this process and install the member-side
    /// webhook configurations into this cluster (the webhook flags below apply).
    #[arg(long)]
    pub webhook: bool,
    /// The image holding the `bulkhead` binary, copied into every database pod by an init
    /// container to run `bulkhead instance` (default: this version's Bulkhead image).
    #[arg(long, default_value = crate::api::DEFAULT_IMAGE)]
    pub instance_image: String,
    /// How long a database's primary may not answer before its most advanced standby is
    /// promoted (seconds). At least --lease-duration-seconds + 3 (the primary's own lease,
    /// which is that value, the time it takes to demote itself, and a round): a shorter
    /// value is refused at start. Unset: exactly that.
    #[arg(long)]
    pub failover_after_seconds: Option<f64>,
    /// A node label database pods must run on, `KEY=VALUE` (repeatable): dedicated
    /// database nodes.
    #[arg(long, value_parser = parse_label)]
    pub database_node_selector: Vec<(String, String)>,
    /// A taint key database pods tolerate (any value and effect; repeatable).
    #[arg(long)]
    pub database_toleration: Vec<String>,
    /// A pod annotation holding the address other clusters reach a database pod at (set
    /// by your network: a per-pod load balancer, an egress gateway). Unset: the pod IP
    /// (pod networks routed between clusters). Published as `status.endpoint` for
    /// replica clusters.
    #[arg(long)]
    pub external_address_annotation: Option<String>,
    #[command(flatten)]
    pub webhook_options: crate::webhook::WebhookServerOptions,
}

/// How long a silent primary waits before a standby is promoted, from the flags: never
/// shorter than the primary's own lease (`--lease-duration-seconds`, given to every
/// instance as `--agent-lease`) plus its demotion and a round, so a standby is never
/// promoted while the old primary may still acknowledge a write.
pub fn failover_after(options: &AgentOptions) -> std::result::Result<Duration, String> {
    // Seconds as a duration: positive and representable (a flag of 1e30 or NaN is an
    // error here, not a panic later).
    let seconds = |flag: &str, value: f64| {
        Duration::try_from_secs_f64(value)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("{flag} {value} is not a positive number of seconds"))
    };
    let lease = seconds("--lease-duration-seconds", options.lease_duration_seconds)?;
    let shortest =
        instances::shortest_safe_failover(lease, instances::InstanceSettings::default().round);
    let Some(asked) = options.failover_after_seconds else {
        return Ok(shortest);
    };
    let asked = seconds("--failover-after-seconds", asked)?;
    if asked >= shortest {
        return Ok(asked);
    }
    Err(format!(
        "--failover-after-seconds {} is shorter than --lease-duration-seconds {} plus {} s: a database's primary demotes itself only {} s after the agent last reached it, so a standby promoted sooner could take writes beside it, and writes acknowledged by the old primary would be lost. Set --failover-after-seconds to at least {}, or leave it unset",
        asked.as_secs_f64(),
        options.lease_duration_seconds,
        (shortest - lease).as_secs_f64(),
        options.lease_duration_seconds,
        shortest.as_secs_f64()
    ))
}

/// Runs the agent until SIGTERM.
pub async fn run(options: AgentOptions) -> Result<()> {
    let failover_after =
        failover_after(&options).map_err(|reason| crate::error::Error::InvalidOption {
            option: "--failover-after-seconds".into(),
            reason,
        })?;
    let process = Process::start("agent", &options.client, &options.serve).await?;
    let wait = Duration::from_secs(options.serve.crd_wait_seconds);
    if !process.wait_for_crds(AGENT_CRDS, wait).await? {
        process.finish().await;
        return Ok(());
    }
    let client = process.client.clone();
    if options.webhook {
        let targets = vec![(
            "this cluster".to_string(),
            client.clone(),
            crate::webhook::configurations::ClusterRole::Member,
        )];
        crate::webhook::start(&process, &options.webhook_options, targets).await?;
    }
    let agent_metrics = AgentMetrics::register(&process.metrics);
    let reporter = Reporter {
        controller: "bulkhead-agent".into(),
        instance: std::env::var("POD_NAME")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok()),
    };
    let recorder = Recorder::new(client.clone(), reporter);

    let (fenced_tx, fenced_rx) = watch::channel(!options.no_fencing);
    let terms = instances::Terms::default();
    if options.no_fencing {
        tracing::warn!(
            "fencing disabled (--no-fencing): databases stay writable whatever the hub does"
        );
    } else {
        let settings = FenceSettings {
            namespace: options.lease_namespace.clone(),
            name: options.lease_name.clone(),
            lease_duration: Duration::from_secs_f64(options.lease_duration_seconds),
            unfence_after: Duration::from_secs_f64(options.unfence_after_seconds),
        };
        tokio::spawn(fence::watch_lease(
            client.clone(),
            settings,
            fenced_tx,
            terms.clone(),
            recorder.clone(),
            process.shutdown.clone(),
        ));
    }
    let gauge = agent_metrics.fenced.clone();
    let fence_changes = futures::stream::unfold(fenced_rx.clone(), move |mut rx| {
        let gauge = gauge.clone();
        async move {
            gauge.set(i64::from(*rx.borrow_and_update()));
            rx.changed().await.ok()?;
            gauge.set(i64::from(*rx.borrow()));
            Some(((), rx))
        }
    });

    let views = instances::Views::default();
    let (views_changed, views_changed_rx) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(instances::run(
        client.clone(),
        options.namespace.clone(),
        fenced_rx.clone(),
        views.clone(),
        views_changed,
        recorder.clone(),
        instances::InstanceSettings {
            failover_after,
            instance_lease: Duration::from_secs_f64(options.lease_duration_seconds),
            external_address_annotation: options.external_address_annotation.clone(),
            terms: terms.clone(),
            ..Default::default()
        },
        process.shutdown.clone(),
    ));
    let view_changes = futures::stream::unfold(views_changed_rx, |mut rx| async move {
        let database = rx.recv().await?;
        Some((database, rx))
    });
    let context = Arc::new(
        Context::new(
            client.clone(),
            process.metrics.clone(),
            agent_metrics,
            recorder,
            fenced_rx,
            Duration::from_secs(options.reconcile_timeout_seconds),
            views,
            builders::PodSettings {
                instance_image: options.instance_image.clone(),
                agent_lease_seconds: options.lease_duration_seconds,
                node_selector: options.database_node_selector.iter().cloned().collect(),
                tolerations: options.database_toleration.clone(),
            },
        )
        .with_terms(terms),
    );
    let databases: Api<MyDatabase> = match &options.namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let (statefulsets, services) = reconciler::owned_kinds(&client, options.namespace.as_deref());
    let children = watcher::Config::default().labels("app.kubernetes.io/managed-by=bulkhead-agent");
    if !options.webhook {
        // With the webhook, its task says ready once the tenant rules are listed.
        process.readiness.set_ready();
    }
    tracing::info!(
        namespace = options.namespace.as_deref().unwrap_or("<all>"),
        "agent ready"
    );

    let shutdown = process.shutdown.clone();
    Controller::new(databases, watcher::Config::default())
        .trigger_backoff(crate::client::WatchBackoff::default())
        .owns(statefulsets, children.clone())
        .owns(services, children)
        .reconcile_all_on(fence_changes)
        .reconcile_on(view_changes)
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconciler::reconcile, reconciler::error_policy, context)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile event");
            }
        })
        .await;
    process.finish().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        agent: AgentOptions,
    }

    fn options(args: &[&str]) -> AgentOptions {
        Flags::parse_from(std::iter::once("agent").chain(args.iter().copied())).agent
    }

    #[test]
    fn a_failover_sooner_than_the_primary_can_demote_itself_is_refused_at_start() {
        assert_eq!(failover_after(&options(&[])), Ok(Duration::from_secs(13)));
        assert_eq!(
            failover_after(&options(&["--lease-duration-seconds", "3"])),
            Ok(Duration::from_secs(6))
        );
        assert_eq!(
            failover_after(&options(&["--failover-after-seconds", "20"])),
            Ok(Duration::from_secs(20))
        );
        let refused = failover_after(&options(&["--failover-after-seconds", "5"]))
            .expect_err("5 s is sooner than the primary's 10 s lease");
        for (flag, value) in [
            ("--failover-after-seconds", "1e30"),
            ("--failover-after-seconds=-1", ""),
            ("--lease-duration-seconds", "NaN"),
        ] {
            let args: Vec<&str> = [flag, value]
                .into_iter()
                .filter(|a| !a.is_empty())
                .collect();
            let refused =
                failover_after(&options(&args)).expect_err("not a usable number of seconds");
            let flag = flag.split('=').next().unwrap_or_default();
            assert!(
                refused.contains(flag) && refused.contains("positive"),
                "{refused}"
            );
        }
        assert!(
            refused.contains("--failover-after-seconds 5")
                && refused.contains("--lease-duration-seconds 10")
                && refused.contains("at least 13"),
            "{refused}"
        );
    }
}
