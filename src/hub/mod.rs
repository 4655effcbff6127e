//! The federation side: membership and health, fencing leases, policy matching,
//! scheduling, propagation, status aggregation and failover. Placement is pure code in
//! `placement/` (added with the placement issue).
//!
//! Membership (this module's part so far): [`members`] keeps one client per member in an
//! `ArcSwap` snapshot, [`prober`] probes each member and writes its health, conditions and
//! taints, [`disruption`] derives zone states and the frozen state, [`lease`] renews the
//! fencing Lease in every member. Other hub controllers read [`HubState`].

pub mod federation;
pub mod membership;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use kube::runtime::events::{Recorder, Reporter};

use crate::Result;
use crate::process::{ClientOptions, Process, ServeOptions};
use membership::{disruption, lease, members, metrics, prober, tasks, tokens, zones};

pub use members::{MemberHandle, MemberSnapshot, Registry};
pub use zones::HubHealth;

/// The CRDs the hub needs on the hub API server.
pub const HUB_CRDS: &[&str] = &[
    "memberclusters.federation.example.com",
    "propagationpolicies.federation.example.com",
    "clusterpropagationpolicies.federation.example.com",
    "resourcebindings.federation.example.com",
    "resourceinterpreters.federation.example.com",
    "overridepolicies.federation.example.com",
    "clusteroverridepolicies.federation.example.com",
    "mydatabases.example.com",
];

/// `bulkhead hub` options.
#[derive(clap::Args, Clone, Debug)]
pub struct HubOptions {
    #[command(flatten)]
    pub client: ClientOptions,
    #[command(flatten)]
    pub serve: ServeOptions,
    /// Time between renewals of the fencing Lease in each member, e.g. `2s` or `500ms`.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub lease_renew_interval: Duration,
    /// `leaseDurationSeconds` of the fencing Lease: how long a member's agent waits after
    /// the last renewal it saw before it fences itself.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// The hub's identity, written as the Lease's holderIdentity and Event instance
    /// (default: the host name).
    #[arg(long, env = "BULKHEAD_HUB_IDENTITY")]
    pub identity: Option<String>,
    /// How often a healthy member's version and capacity are refreshed.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub capacity_interval: Duration,
    /// How often the hub looks at the expiry of its member tokens (it renews a token once
    /// a third of its lifetime is left).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub token_check_interval: Duration,
    /// Share of a member token's lifetime after which the hub renews it (0 to 1).
    #[arg(long, default_value_t = tokens::DEFAULT_RENEW_FRACTION)]
    pub token_renew_fraction: f64,
    /// Drift repair and watch liveness: every this often the hub lists every member's
    /// copies again (a watch that silently died is replaced) and applies every copy
    /// again, as it would now (edits made in a member, a `kubectl scale`, changed
    /// ConfigMap data are undone; an apply that changes nothing is free in the member).
    /// The pass is spread over the interval. At least 10s.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub resync_interval: Duration,
    /// How long a planned switchover of a MyDatabase's replica clusters may take to demote
    /// the old primary cluster, have the new one catch up with its last WAL position and
    /// have every member hold the raised primary term. Past it, with nothing promoted, the
    /// hub gives the switchover up (`status.abortedSwitchover`) and the old primary cluster
    /// takes writes again: the database is read-only at most this long. At least 10s.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub switchover_deadline: Duration,
    /// Failover evictions allowed per second, over all bindings (a token bucket with a
    /// burst of one second's worth). Each binding that moves replicas off a failed cluster
    /// takes one; the others wait for the next pass.
    #[arg(long, default_value_t = 10.0)]
    pub eviction_rate: f64,
    /// Keep a MutatingAdmissionPolicy in the hub API server that adds the cleanup
    /// finalizer to templates the policies select as they are created (no hub write, no
    /// round trip before the copies go out; docs/placement.md). Off (`=false`), the hub
    /// deletes it and adds every finalizer itself. Needs Kubernetes 1.36 or later.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub finalizer_admission_policy: bool,
    /// A namespace whose objects are never propagated, besides `bulkhead-system` and
    /// `kube-*` (repeatable): a name, or a prefix ending in `*`. For namespaces a tenant
    /// could create on the hub to reach same-named ones in the members (`default`,
    /// `cert-manager`, ...). Copies already in members are left alone.
    #[arg(long = "exclude-namespace")]
    pub exclude_namespaces: Vec<String>,
    /// When given (repeatable), only objects in these namespaces are propagated: a name,
    /// or a prefix ending in `*`. `--exclude-namespace` still wins, and the hub's own
    /// namespace (`POD_NAMESPACE`), `bulkhead-system` and `kube-*` are never propagated.
    #[arg(long = "include-namespace")]
    pub include_namespaces: Vec<String>,
    /// Also serve the admission webhook in this process and install the hub-side webhook
    /// configurations into the hub (the webhook flags below apply; see docs/admission.md).
    #[arg(long)]
    pub webhook: bool,
    #[command(flatten)]
    pub webhook_options: crate::webhook::WebhookServerOptions,
    #[command(flatten)]
    pub leader_election: crate::leader::LeaderElectionOptions,
}

/// Parses `2s`, `500ms`, `1m` or a plain number of seconds.
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 2s, 500ms or 1m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("{text:?}: unknown unit {unit:?}; use ms, s or m")),
    };
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(format!("{text:?} must be positive"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "bulkhead-hub".to_string())
}

/// What the hub's membership controllers publish for the others (placement, failover).
/// Every field is cheap to clone and read without locks.
#[derive(Clone)]
pub struct HubState {
    /// The members and their clients.
    pub registry: Registry,
    /// Every member's current health verdict.
    pub board: prober::HealthBoard,
    /// Whether the hub is frozen (every zone in FullDisruption) and since when; failover
    /// and eviction must do nothing while `frozen`, and count grace periods from
    /// [`HubHealth::grace_start`].
    pub hub_health: Arc<ArcSwap<HubHealth>>,
    /// Whether this replica leads (`--leader-elect`); only the leader writes. Always the
    /// leader without leader election.
    pub leadership: crate::leader::Leadership,
    /// Fresh positive evidence of each member: what a stateful delete or shrink needs of
    /// every cluster involved (DESIGN.md section 5).
    pub evidence: membership::evidence::Evidence,
    /// The kinds the policies select (or the workloads' dependencies need) that the hub
    /// cannot federate, with why and the fix; reported on policies and bindings.
    pub refusals: Arc<ArcSwap<Vec<federation::discovery::Refusal>>>,
}

impl Default for HubState {
    fn default() -> Self {
        HubState {
            registry: Registry::default(),
            board: prober::HealthBoard::default(),
            hub_health: Arc::new(ArcSwap::from_pointee(HubHealth::default())),
            leadership: crate::leader::Leadership::always(),
            evidence: membership::evidence::Evidence::default(),
            refusals: Arc::default(),
        }
    }
}

/// Runs the hub until SIGTERM.
/// The numeric settings, each checked against what it is for: an error names the flag.
fn check_settings(options: &HubOptions) -> Result<()> {
    if !(0.0..=1.0).contains(&options.token_renew_fraction) {
        return Err(crate::Error::InvalidOption {
            option: "--token-renew-fraction".into(),
            reason: format!(
                "{} must be between 0 and 1 (the share of a token's lifetime after which it is renewed)",
                options.token_renew_fraction
            ),
        });
    }
    if !(options.eviction_rate.is_finite() && options.eviction_rate > 0.0) {
        return Err(crate::Error::InvalidOption {
            option: "--eviction-rate".into(),
            reason: format!(
                "{} must be a positive number of evictions per second",
                options.eviction_rate
            ),
        });
    }
    if options.resync_interval < Duration::from_secs(10) {
        return Err(crate::Error::InvalidOption {
            option: "--resync-interval".into(),
            reason: format!(
                "{:?} is too short: every copy in every member is listed and applied again each interval; use 10s or more (default 10m)",
                options.resync_interval
            ),
        });
    }
    if options.switchover_deadline < Duration::from_secs(10) {
        return Err(crate::Error::InvalidOption {
            option: "--switchover-deadline".into(),
            reason: format!(
                "{:?} is too short: the old primary cluster must demote, the new one catch up and every member hold the raised term within it; use 10s or more (default 60s)",
                options.switchover_deadline
            ),
        });
    }
    if options.lease_renew_interval >= options.lease_duration {
        return Err(crate::Error::InvalidOption {
            option: "--lease-renew-interval".into(),
            reason: format!(
                "{:?} must be shorter than --lease-duration {:?}, or members fence between renewals",
                options.lease_renew_interval, options.lease_duration
            ),
        });
    }
    Ok(())
}

pub async fn run(options: HubOptions) -> Result<()> {
    crate::hub::federation::scheduler::set_namespace_filter(
        crate::hub::federation::scheduler::NamespaceFilter {
            exclude: options.exclude_namespaces.clone(),
            include: options.include_namespaces.clone(),
            own: std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|n| !n.is_empty()),
        },
    )
    .map_err(|reason| crate::Error::InvalidOption {
        option: "--exclude-namespace/--include-namespace".into(),
        reason,
    })?;
    check_settings(&options)?;
    let election_timing = options.leader_election.validate()?;
    let process = Process::start("hub", &options.client, &options.serve).await?;
    let wait = Duration::from_secs(options.serve.crd_wait_seconds);
    if process.wait_for_crds(HUB_CRDS, wait).await? {
        let identity = options.identity.clone().unwrap_or_else(host_name);
        let election = options.leader_election.leader_elect.then(|| {
            let gap = election_timing.worst_fencing_gap(options.lease_renew_interval);
            if gap >= options.lease_duration {
                tracing::warn!(
                    ?gap,
                    fencing_lease_duration = ?options.lease_duration,
                    "if the leader crashes, members may go up to {gap:?} without a fencing-Lease renewal and fence (read-only) until the standby takes over; lower --leader-elect-lease-duration or raise --lease-duration"
                );
            }
            crate::leader::ElectionSettings {
                namespace: options.leader_election.leader_elect_namespace.clone(),
                lease_name: options.leader_election.leader_elect_lease_name.clone(),
                identity: identity.clone(),
                timing: election_timing,
            }
        });
        tracing::info!(
            %identity,
            lease_renew_interval = ?options.lease_renew_interval,
            lease_duration = ?options.lease_duration,
            "hub ready"
        );
        if options.webhook {
            let targets = vec![(
                "hub".to_string(),
                process.client.clone(),
                crate::webhook::configurations::ClusterRole::Hub,
            )];
            crate::webhook::start(&process, &options.webhook_options, targets).await?;
        }
        // A standby is ready too: it serves probes and metrics, and takes over at once.
        let (leadership, election) = crate::leader::start(
            process.client.clone(),
            election,
            &process.metrics,
            hub_recorder(&process, &identity),
            process.shutdown.clone(),
        );
        if !options.webhook {
            // With the webhook, its task says ready once the tenant rules are listed.
            process.readiness.set_ready();
        }
        let state = HubState {
            leadership,
            evidence: membership::evidence::Evidence::new(options.lease_renew_interval)
                .with_lease_duration(options.lease_duration),
            ..HubState::default()
        };
        run_membership(&process, &options, identity, state).await;
        // Every writer has stopped: a standby may take over now.
        election.release().await;
    }
    process.finish().await;
    Ok(())
}

/// The hub's Event recorder (controller `bulkhead-hub`, instance = identity).
fn hub_recorder(process: &Process, identity: &str) -> Recorder {
    Recorder::new(
        process.client.clone(),
        Reporter {
            controller: "bulkhead-hub".to_string(),
            instance: Some(identity.to_string()),
        },
    )
}

/// Runs the registry, probers and zone controller on every replica, and the lease and
/// token renewers and the federation controller while this replica leads
/// (`state.leadership`), until shutdown.
pub async fn run_membership(
    process: &Process,
    options: &HubOptions,
    identity: String,
    state: HubState,
) {
    let hub = process.client.clone();
    let shutdown = process.shutdown.clone();
    let hub_metrics = metrics::HubMetrics::register(&process.metrics);
    let recorder = hub_recorder(process, &identity);
    // How long a leader-only task gets to stop when leadership ends: within the margin
    // between the renew deadline and the lease duration with leader election; as long as
    // at shutdown without.
    let stop_grace = if options.leader_election.leader_elect {
        options
            .leader_election
            .validate()
            .map(|timing| timing.stop_grace())
            .unwrap_or(tasks::SHUTDOWN_GRACE)
    } else {
        2 * tasks::SHUTDOWN_GRACE
    };

    let controller_recorder = recorder.clone();
    let registry_task = tokio::spawn(members::run(
        hub.clone(),
        state.registry.clone(),
        state.leadership.clone(),
        shutdown.clone(),
    ));

    let prober_context = prober::ProberContext {
        hub: hub.clone(),
        registry: state.registry.clone(),
        board: state.board.clone(),
        metrics: hub_metrics.clone(),
        recorder: recorder.clone(),
        capacity_interval: options.capacity_interval,
        cluster_ids: Arc::default(),
        leadership: state.leadership.clone(),
        evidence: state.evidence.clone(),
    };
    let probers = tokio::spawn(tasks::per_member(
        state.registry.clone(),
        shutdown.clone(),
        move |name, cancel| prober::probe_member(prober_context.clone(), name, cancel),
    ));

    let terms = membership::terms::Terms::default();
    let terms_task = tokio::spawn(membership::terms::run(
        hub.clone(),
        terms.clone(),
        shutdown.clone(),
    ));
    let lease_settings = lease::LeaseSettings {
        leadership: state.leadership.clone(),
        evidence: state.evidence.clone(),
        identity,
        renew_interval: options.lease_renew_interval,
        duration: options.lease_duration,
        terms,
    };
    let lease_registry = state.registry.clone();
    let lease_metrics = hub_metrics.clone();
    let renew_lease = move |name, cancel| {
        lease::renew_member(
            lease_registry.clone(),
            lease_settings.clone(),
            lease_metrics.clone(),
            name,
            cancel,
        )
    };
    let registry = state.registry.clone();
    let leases = tokio::spawn(crate::leader::run_while_leader(
        state.leadership.clone(),
        shutdown.clone(),
        stop_grace,
        "fencing lease renewal",
        move |cancel| tasks::per_member(registry.clone(), cancel, renew_lease.clone()),
    ));

    let token_context = tokens::TokenContext {
        hub: hub.clone(),
        registry: state.registry.clone(),
        metrics: hub_metrics.clone(),
        recorder: recorder.clone(),
        check_interval: options.token_check_interval,
        renew_fraction: options.token_renew_fraction,
        leadership: state.leadership.clone(),
    };
    let renew_token =
        move |name, cancel| tokens::renew_member_token(token_context.clone(), name, cancel);
    let registry = state.registry.clone();
    let token_tasks = tokio::spawn(crate::leader::run_while_leader(
        state.leadership.clone(),
        shutdown.clone(),
        stop_grace,
        "token renewal",
        move |cancel| tasks::per_member(registry.clone(), cancel, renew_token.clone()),
    ));

    let zones_task = tokio::spawn(disruption::run(
        disruption::DisruptionContext {
            hub,
            registry: state.registry.clone(),
            board: state.board.clone(),
            metrics: hub_metrics,
            recorder,
            hub_health: state.hub_health.clone(),
            leadership: state.leadership.clone(),
        },
        shutdown.clone(),
    ));

    // The federation controller runs as a whole on the leader; a new term starts it cold
    // (it writes nothing that is already right).
    // Its hub writes also check leadership at each request (a pass still running, or a
    // process resuming from a freeze, cannot write through it once the term is over).
    let controller_client =
        crate::leader::write_gated(process.client.clone(), state.leadership.clone());
    let controller_state = state.clone();
    // Registered once: the controller restarts with each leadership term.
    let controller_metrics = federation::register_metrics(&process.metrics);
    let eviction_rate = options.eviction_rate;
    let resync_interval = options.resync_interval;
    let switchover_deadline = options.switchover_deadline;
    let finalizer_admission_policy = options.finalizer_admission_policy;
    let scheduler_task = tokio::spawn(crate::leader::run_while_leader(
        state.leadership.clone(),
        shutdown.clone(),
        stop_grace,
        "federation controller",
        move |cancel| {
            federation::run(
                controller_client.clone(),
                controller_state.clone(),
                controller_recorder.clone(),
                controller_metrics.clone(),
                federation::ControllerOptions {
                    eviction_rate,
                    resync_interval,
                    finalizer_admission_policy,
                    switchover_deadline,
                },
                cancel,
            )
        },
    ));

    shutdown.cancelled().await;
    for task in [
        registry_task,
        terms_task,
        probers,
        leases,
        token_tasks,
        zones_task,
        scheduler_task,
    ] {
        let abort = task.abort_handle();
        if tokio::time::timeout(2 * tasks::SHUTDOWN_GRACE, task)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_the_units_people_type() {
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("2h").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[derive(clap::Parser)]
    struct Command {
        #[command(flatten)]
        hub: HubOptions,
    }

    fn options(args: &[&str]) -> HubOptions {
        use clap::Parser;
        Command::try_parse_from(std::iter::once("hub").chain(args.iter().copied()))
            .expect("arguments parse")
            .hub
    }

    #[test]
    fn a_switchover_deadline_too_short_to_switch_over_is_refused_by_name() {
        let defaults = options(&[]);
        assert_eq!(defaults.switchover_deadline, Duration::from_secs(60));
        assert!(check_settings(&defaults).is_ok());
        assert!(check_settings(&options(&["--switchover-deadline", "3m"])).is_ok());
        let error = check_settings(&options(&["--switchover-deadline", "5s"]))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--switchover-deadline") && error.contains("10s or more"),
            "{error}"
        );
    }
}
