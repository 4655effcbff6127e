//! Leader election for `bulkhead hub` (DESIGN.md section 8, docs/high-availability.md).
//!
//! Several hub replicas may run against one hub API server; one of them leads. Every
//! replica probes the members (so a standby's health verdicts are warm when it takes
//! over); only the leader writes: MemberCluster status, taints, zone states, fencing
//! Leases, token renewals and the whole federation controller.
//!
//! The Lease on the hub is held through the `kube-lease-manager` crate (acquisition,
//! renewal every retry period, takeover of an expired Lease, release). On top of it this
//! module keeps one rule the crate does not: a replica leads only while the Lease, as the
//! hub API server last showed it (a watch on that one Lease), names this replica as holder
//! with a `renewTime` less than the renew deadline old. `renewTime` was written by this
//! replica with its own clock, so the rule needs no clock comparison between machines:
//! the leader stops at `renewTime + renew deadline`, a standby may take over only after
//! `renewTime + lease duration` by its clock, and the difference is the margin for the
//! writers to stop and for clock skew. A Lease showing another holder, or a lease manager
//! that says it lost the Lease, ends leadership at once.
//!
//! [`Leadership`] is the handle the rest of the hub reads (`is_leader`, `changed`);
//! [`run_while_leader`] runs a task for as long as this replica leads and stops it, with a
//! bound, when it no longer does.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering as AtomicOrdering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::hub::parse_duration;
use crate::metrics::Metrics;
use crate::{Error, Result};

/// Default name of the leader Lease on the hub (the fencing Lease in the members is
/// `bulkhead-hub`; the two must not be confused).
pub const DEFAULT_LEASE_NAME: &str = "bulkhead-hub-leader";
/// Namespace of the leader Lease when neither the flag nor `POD_NAMESPACE` says.
pub const DEFAULT_NAMESPACE: &str = "bulkhead-system";
/// How long a deposed leader's writers get to stop before they are aborted, at most.
const MAX_STOP_GRACE: Duration = Duration::from_secs(2);
/// How long releasing the Lease at shutdown may take before the process gives up on it
/// (the Lease then expires by itself).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest [`Leadership::leading_for`] answers (a process without an election leads
/// for ever; a write's deadline needs a finite number).
const LEADING_AT_MOST: Duration = Duration::from_secs(24 * 3600);
/// Why a leader that received SIGTERM stops leading.
const SHUTTING_DOWN: &str = "the process is shutting down; it releases the Lease";

/// `bulkhead hub` leader election flags.
#[derive(clap::Args, Clone, Debug)]
pub struct LeaderElectionOptions {
    /// Elect one leader among the hub replicas through a Lease on the hub API server. Only
    /// the leader writes; the others probe members and wait. Without it this process
    /// always leads (run one replica only).
    #[arg(long)]
    pub leader_elect: bool,
    /// Namespace of the leader Lease on the hub (default: $POD_NAMESPACE, else
    /// bulkhead-system).
    #[arg(long, env = "POD_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    pub leader_elect_namespace: String,
    /// Name of the leader Lease on the hub.
    #[arg(long, default_value = DEFAULT_LEASE_NAME)]
    pub leader_elect_lease_name: String,
    /// How long after the leader's last renewal a standby may take the Lease over (whole
    /// seconds; written as `leaseDurationSeconds`). A crashed leader is replaced after
    /// about this long.
    #[arg(long, default_value = "6s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader goes on leading without a renewal the API server confirmed;
    /// then it stops every writer at once. Shorter than the lease duration: the difference
    /// is the margin for stopping and for clock skew between replicas.
    #[arg(long, default_value = "4s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// Time between the leader's renewals of the Lease (whole seconds).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
}

impl Default for LeaderElectionOptions {
    fn default() -> Self {
        LeaderElectionOptions {
            leader_elect: false,
            leader_elect_namespace: DEFAULT_NAMESPACE.to_string(),
            leader_elect_lease_name: DEFAULT_LEASE_NAME.to_string(),
            leader_elect_lease_duration: Duration::from_secs(6),
            leader_elect_renew_deadline: Duration::from_secs(4),
            leader_elect_retry_period: Duration::from_secs(1),
        }
    }
}

/// The election's timing, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElectionTiming {
    /// `leaseDurationSeconds`.
    pub lease_duration_seconds: u64,
    /// The lease manager's grace: it renews this long before the Lease would expire, so
    /// every `lease duration - grace` = every retry period.
    pub grace_seconds: u64,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl ElectionTiming {
    /// The lease duration.
    pub fn lease_duration(&self) -> Duration {
        Duration::from_secs(self.lease_duration_seconds)
    }

    /// How long a deposed leader's writers get to stop before they are aborted: half the
    /// margin between the renew deadline and the lease duration, at most 2 s.
    pub fn stop_grace(&self) -> Duration {
        ((self.lease_duration() - self.renew_deadline) / 2).min(MAX_STOP_GRACE)
    }

    /// The longest a member may go without a fencing-Lease renewal when the leader
    /// crashes: the fencing renew interval before the crash, the leader Lease running
    /// out, and up to a second for the standby to take it (the lease manager waits a
    /// random 0.1-1 s after clearing an expired Lease). Members fence when this reaches
    /// the fencing lease duration.
    pub fn worst_fencing_gap(&self, fencing_renew_interval: Duration) -> Duration {
        fencing_renew_interval + self.lease_duration() + Duration::from_secs(1)
    }
}

fn whole_seconds(value: Duration) -> Option<u64> {
    (value.subsec_nanos() == 0).then_some(value.as_secs())
}

impl LeaderElectionOptions {
    /// Checks the flags; the error names the flag and how to fix it.
    pub fn validate(&self) -> Result<ElectionTiming> {
        let invalid = |option: &str, reason: String| Error::InvalidOption {
            option: option.to_string(),
            reason,
        };
        let name = &self.leader_elect_lease_name;
        if name.is_empty() || !is_dns_subdomain(name) {
            return Err(invalid(
                "--leader-elect-lease-name",
                format!(
                    "{name:?} is not a valid object name (lower-case letters, digits, '-' and '.')"
                ),
            ));
        }
        if name == crate::hub::membership::lease::LEASE_NAME {
            return Err(invalid(
                "--leader-elect-lease-name",
                format!(
                    "{name:?} is the name of the fencing Lease the hub renews in every member; choose another name, e.g. the default {DEFAULT_LEASE_NAME}"
                ),
            ));
        }
        let namespace = &self.leader_elect_namespace;
        if namespace.is_empty() || !is_dns_label(namespace) {
            return Err(invalid(
                "--leader-elect-namespace",
                format!("{namespace:?} is not a valid namespace name"),
            ));
        }
        let duration = self.leader_elect_lease_duration;
        let lease_duration_seconds = whole_seconds(duration).filter(|s| *s >= 2).ok_or_else(|| {
            invalid(
                "--leader-elect-lease-duration",
                format!(
                    "{duration:?} must be a whole number of seconds, at least 2s (the Lease stores leaseDurationSeconds)"
                ),
            )
        })?;
        let retry = self.leader_elect_retry_period;
        let retry_seconds = whole_seconds(retry).filter(|s| *s >= 1).ok_or_else(|| {
            invalid(
                "--leader-elect-retry-period",
                format!(
                    "{retry:?} must be a whole number of seconds, at least 1s (the lease manager renews in whole seconds)"
                ),
            )
        })?;
        let deadline = self.leader_elect_renew_deadline;
        if deadline >= duration {
            return Err(invalid(
                "--leader-elect-renew-deadline",
                format!(
                    "{deadline:?} must be shorter than --leader-elect-lease-duration {duration:?}: a leader that cannot renew must stop writing before a standby may take the Lease over; lower it or raise the lease duration"
                ),
            ));
        }
        if retry >= deadline {
            return Err(invalid(
                "--leader-elect-retry-period",
                format!(
                    "{retry:?} must be shorter than --leader-elect-renew-deadline {deadline:?}, or the leader gives up before it could renew; lower it or raise the renew deadline"
                ),
            ));
        }
        Ok(ElectionTiming {
            lease_duration_seconds,
            grace_seconds: lease_duration_seconds - retry_seconds,
            renew_deadline: deadline,
            retry_period: retry,
        })
    }
}

fn is_dns_label(text: &str) -> bool {
    text.len() <= 63
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !text.starts_with('-')
        && !text.ends_with('-')
}

fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253
        && text
            .split('.')
            .all(|part| !part.is_empty() && is_dns_label(part))
}

/// Whether this process leads, and a way to wait for that to change. Cheap to clone;
/// every clone sees the same value.
///
/// [`Leadership::is_leader`] also checks the renew deadline itself, by the clock, at
/// every call: a process that was frozen (SIGSTOP, a paused VM) past its deadline reads
/// `false` the instant it resumes, before the election task has run and flipped the
/// value. Check it right before each write.
#[derive(Clone, Debug)]
pub struct Leadership {
    receiver: watch::Receiver<bool>,
    /// Unix microseconds until which the current term is valid without another renewal.
    until: Arc<AtomicI64>,
}

impl Leadership {
    /// A process without leader election: it always leads.
    pub fn always() -> Self {
        let (_, receiver) = watch::channel(true);
        Leadership {
            receiver,
            until: Arc::new(AtomicI64::new(i64::MAX)),
        }
    }

    /// A handle whose value the returned sender sets (tests, and embedders that elect a
    /// leader in their own way); no deadline applies.
    pub fn manual(initial: bool) -> (watch::Sender<bool>, Self) {
        let (sender, receiver) = watch::channel(initial);
        let until = Arc::new(AtomicI64::new(i64::MAX));
        (sender, Leadership { receiver, until })
    }

    /// Sets the instant past which this replica no longer leads unless it is set again.
    fn set_until(&self, until: jiff::Timestamp) {
        self.until
            .store(until.as_microsecond(), AtomicOrdering::SeqCst);
    }

    /// Whether this process leads now.
    pub fn is_leader(&self) -> bool {
        *self.receiver.borrow()
            && jiff::Timestamp::now().as_microsecond() < self.until.load(AtomicOrdering::SeqCst)
    }

    /// How much longer this process leads without another confirmed renewal (None: it
    /// does not lead now). Without an election: a day, renewed at every call.
    pub fn leading_for(&self) -> Option<Duration> {
        if !*self.receiver.borrow() {
            return None;
        }
        let until = self.until.load(AtomicOrdering::SeqCst);
        let left = until.saturating_sub(jiff::Timestamp::now().as_microsecond());
        (left > 0).then(|| Duration::from_micros(left as u64).min(LEADING_AT_MOST))
    }

    /// Waits until the value changes and returns the new one. Once the election has
    /// stopped (the process is shutting down) it never changes again and this waits
    /// forever; select it against the shutdown token.
    pub async fn changed(&mut self) -> bool {
        if self.receiver.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        *self.receiver.borrow_and_update()
    }

    /// Returns once `is_leader() == leader` (at once when it already is).
    pub async fn wait_until(&mut self, leader: bool) {
        while *self.receiver.borrow_and_update() != leader {
            if self.receiver.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Default for Leadership {
    fn default() -> Self {
        Leadership::always()
    }
}

/// Runs the task `start` makes while this process leads: started when leadership is
/// gained, and when it is lost (or at shutdown) its token is cancelled, it gets
/// `stop_grace` to return and is then aborted. Returns at shutdown. `what` names the task
/// in logs.
pub async fn run_while_leader<F, Fut>(
    mut leadership: Leadership,
    shutdown: CancellationToken,
    stop_grace: Duration,
    what: &'static str,
    mut start: F,
) where
    F: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = leadership.wait_until(true) => {}
        }
        let cancel = shutdown.child_token();
        let mut task = tokio::spawn(start(cancel.clone()));
        tracing::debug!(task = what, "started: this hub leads");
        let mut finished = false;
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = leadership.wait_until(false) => {}
            _ = &mut task => finished = true,
        }
        cancel.cancel();
        if finished {
            // Not expected while leading; wait for the next term instead of spinning.
            tracing::warn!(task = what, "leader-only task ended on its own");
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = leadership.wait_until(false) => continue,
            }
        }
        let abort = task.abort_handle();
        if tokio::time::timeout(stop_grace, task).await.is_err() {
            tracing::warn!(task = what, grace = ?stop_grace, "did not stop in time after leadership ended; aborted");
            abort.abort();
        } else {
            tracing::debug!(task = what, "stopped: this hub no longer leads");
        }
        if shutdown.is_cancelled() {
            return;
        }
    }
}

/// A client that sends reads always and writes (every method but GET, HEAD, OPTIONS) only
/// while `leadership` leads, checked when each request is sent: a deposed leader's
/// controller, still finishing a pass or resuming from a freeze, cannot write to the hub
/// through it. A refused write fails like a request that did not reach the server.
pub fn write_gated(client: Client, leadership: Leadership) -> Client {
    let namespace = client.default_namespace().to_string();
    Client::new(
        LeaderGate {
            inner: Sender(client),
            leadership,
        },
        namespace,
    )
}

/// A client as a tower service: what [`write_gated`] puts its gate in front of.
#[derive(Clone)]
struct Sender(Client);

impl tower::Service<http::Request<kube::client::Body>> for Sender {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future =
        futures::future::BoxFuture<'static, std::result::Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let client = self.0.clone();
        Box::pin(async move { client.send(request).await })
    }
}

/// Why a gated write was not sent.
#[derive(Debug, thiserror::Error)]
#[error("this hub is not the leader: {method} {path} not sent")]
pub struct NotLeader {
    pub method: String,
    pub path: String,
}

/// A tower layer for the member clients, placed inside their in-flight limit: a write
/// (every method but GET, HEAD, OPTIONS) is sent only if this process leads when it gets
/// its turn (not when it started waiting for one), and is abandoned when the leadership
/// term runs out before the member answers. So every write an old leader makes is over
/// by its renew deadline, before a standby may take the Lease over (the election's
/// margin: lease duration minus renew deadline); a request already on the wire when it
/// is abandoned may still be carried out by the member, which no client can prevent.
#[derive(Clone)]
pub struct LeaderGateLayer {
    pub leadership: Leadership,
}

impl<S> tower::Layer<S> for LeaderGateLayer {
    type Service = LeaderGate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LeaderGate {
            inner,
            leadership: self.leadership.clone(),
        }
    }
}

/// See [`LeaderGateLayer`].
#[derive(Clone)]
pub struct LeaderGate<S> {
    inner: S,
    leadership: Leadership,
}

impl<S, B> tower::Service<http::Request<B>> for LeaderGate<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = S::Response;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future =
        futures::future::BoxFuture<'static, std::result::Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let read = matches!(
            *request.method(),
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        );
        if read {
            let answer = self.inner.call(request);
            return Box::pin(async move { answer.await.map_err(Into::into) });
        }
        let refused = NotLeader {
            method: request.method().to_string(),
            path: request.uri().path().to_string(),
        };
        let Some(left) = self.leadership.leading_for() else {
            return Box::pin(async move { Err(refused.into()) });
        };
        let answer = self.inner.call(request);
        Box::pin(async move {
            match tokio::time::timeout(left, answer).await {
                Ok(answer) => answer.map_err(Into::into),
                Err(_) => Err(refused.into()),
            }
        })
    }
}

/// The leader Lease as the hub API server last showed it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseView {
    /// False until the first list answered.
    pub known: bool,
    /// `holderIdentity` (None when empty or the Lease is gone).
    pub holder: Option<String>,
    /// `renewTime`.
    pub renew_time: Option<jiff::Timestamp>,
    pub resource_version: Option<String>,
    pub uid: Option<String>,
}

impl LeaseView {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        LeaseView {
            known: true,
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty()),
            renew_time: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
            resource_version: lease.metadata.resource_version.clone(),
            uid: lease.metadata.uid.clone(),
        }
    }

    fn gone() -> Self {
        LeaseView {
            known: true,
            ..Default::default()
        }
    }
}

/// Whether this replica leads, from what the lease manager says and what the API server
/// shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Leads until this instant unless a renewal is seen before.
    Leading { until: jiff::Timestamp },
    /// Does not lead, and why.
    Standby(String),
}

/// The rule of this module (see the module documentation), as a pure function.
pub fn verdict(
    manager_holds: bool,
    view: &LeaseView,
    identity: &str,
    now: jiff::Timestamp,
    renew_deadline: Duration,
) -> Verdict {
    if !manager_holds {
        return Verdict::Standby(match &view.holder {
            Some(holder) if holder != identity => format!("the Lease is held by {holder}"),
            _ => "this hub does not hold the Lease".to_string(),
        });
    }
    match (&view.holder, view.renew_time) {
        (Some(holder), Some(renewed)) if holder == identity => {
            let deadline = jiff::SignedDuration::try_from(renew_deadline).unwrap_or_default();
            let until = renewed.checked_add(deadline).unwrap_or(renewed);
            if now < until {
                Verdict::Leading { until }
            } else {
                Verdict::Standby(format!(
                    "no renewal confirmed since {renewed}: the renew deadline ({renew_deadline:?}) passed"
                ))
            }
        }
        (Some(holder), _) if holder != identity => {
            Verdict::Standby(format!("the Lease is held by {holder}"))
        }
        _ => Verdict::Standby("the Lease does not name this hub as holder yet".to_string()),
    }
}

/// What the election needs.
#[derive(Clone, Debug)]
pub struct ElectionSettings {
    pub namespace: String,
    pub lease_name: String,
    /// `holderIdentity`; unique per replica (the host name is, for pods).
    pub identity: String,
    pub timing: ElectionTiming,
}

/// The lease manager's task and its state channel.
type ManagerTask = (
    watch::Receiver<bool>,
    JoinHandle<kube_lease_manager::Result<LeaseManager>>,
);

/// The running election; [`Election::release`] ends it.
pub struct Election {
    task: Option<JoinHandle<Option<ManagerTask>>>,
}

impl Election {
    /// After shutdown, once every leader-only task has stopped: releases the Lease if
    /// this replica holds it, so a standby takes over at once instead of after the lease
    /// duration. Bounded; a Lease that cannot be released expires by itself.
    pub async fn release(self) {
        let Some(task) = self.task else { return };
        // The election publishes its last change (an Event, bounded) before it returns.
        let Ok(Ok(Some((state, manager)))) = tokio::time::timeout(3 * RELEASE_TIMEOUT, task).await
        else {
            return;
        };
        if !*state.borrow() {
            manager.abort();
            return;
        }
        // Closing the state channel makes the lease manager release the Lease and return.
        drop(state);
        let abort = manager.abort_handle();
        match tokio::time::timeout(RELEASE_TIMEOUT, manager).await {
            Ok(Ok(Ok(_))) => tracing::info!("released the leader Lease"),
            Ok(Ok(Err(error))) => {
                tracing::warn!(%error, "cannot release the leader Lease; it expires by itself")
            }
            Ok(Err(error)) => tracing::warn!(%error, "the lease manager failed"),
            Err(_) => {
                abort.abort();
                tracing::warn!("releasing the leader Lease timed out; it expires by itself");
            }
        }
    }
}

/// Leadership metrics.
#[derive(Clone)]
struct ElectionMetrics {
    leader: Gauge,
    transitions: Counter,
}

impl ElectionMetrics {
    fn register(metrics: &Metrics) -> Self {
        let m = ElectionMetrics {
            leader: Gauge::default(),
            transitions: Counter::default(),
        };
        metrics.register(
            "hub_leader",
            "1 while this hub process leads (and writes), 0 while it is a standby",
            m.leader.clone(),
        );
        metrics.register(
            "hub_leadership_changes",
            "Times this hub process gained or lost leadership",
            m.transitions.clone(),
        );
        m
    }
}

/// Starts leader election when `enabled`; otherwise returns a [`Leadership`] that always
/// leads. Returns at once: the Lease is acquired in the background.
pub fn start(
    client: Client,
    settings: Option<ElectionSettings>,
    metrics: &Metrics,
    recorder: Recorder,
    shutdown: CancellationToken,
) -> (Leadership, Election) {
    let election_metrics = ElectionMetrics::register(metrics);
    let Some(settings) = settings else {
        election_metrics.leader.set(1);
        return (Leadership::always(), Election { task: None });
    };
    let (sender, leadership) = Leadership::manual(false);
    leadership.set_until(jiff::Timestamp::UNIX_EPOCH);
    election_metrics.leader.set(0);
    tracing::info!(
        namespace = %settings.namespace,
        lease = %settings.lease_name,
        identity = %settings.identity,
        lease_duration = ?settings.timing.lease_duration(),
        renew_deadline = ?settings.timing.renew_deadline,
        retry_period = ?settings.timing.retry_period,
        "leader election on: this hub writes only while it holds the Lease"
    );
    let elector = Elector {
        client,
        settings,
        sender,
        leadership: leadership.clone(),
        metrics: election_metrics,
        recorder,
    };
    let task = tokio::spawn(elector.run(shutdown));
    (leadership, Election { task: Some(task) })
}

struct Elector {
    client: Client,
    settings: ElectionSettings,
    sender: watch::Sender<bool>,
    /// The handle's deadline, moved forward at every confirmed renewal.
    leadership: Leadership,
    metrics: ElectionMetrics,
    recorder: Recorder,
}

impl Elector {
    async fn manager(&self) -> kube_lease_manager::Result<ManagerTask> {
        let timing = &self.settings.timing;
        let manager = LeaseManagerBuilder::new(self.client.clone(), &self.settings.lease_name)
            .with_namespace(&self.settings.namespace)
            .with_identity(&self.settings.identity)
            .with_duration(timing.lease_duration_seconds)
            .with_grace(timing.grace_seconds)
            .build()
            .await?;
        Ok(manager.watch().await)
    }

    /// Publishes a change of leadership: the handle, the metric, a log line and an Event.
    async fn publish(&self, leading: bool, reason: &str, view: &LeaseView) {
        self.sender.send_replace(leading);
        self.metrics.leader.set(i64::from(leading));
        self.metrics.transitions.inc();
        let settings = &self.settings;
        let (type_, event_reason, note) = if leading {
            tracing::info!(identity = %settings.identity, lease = %settings.lease_name, "this hub is the leader now");
            (
                EventType::Normal,
                "LeaderElected",
                format!(
                    "hub {} holds the leader Lease and writes",
                    settings.identity
                ),
            )
        } else {
            tracing::warn!(identity = %settings.identity, %reason, "this hub is no longer the leader: its writers stop");
            (
                if reason == SHUTTING_DOWN {
                    EventType::Normal
                } else {
                    EventType::Warning
                },
                "LeaderStopped",
                format!("hub {} stopped leading: {reason}", settings.identity),
            )
        };
        let reference = ObjectReference {
            api_version: Some("coordination.k8s.io/v1".to_string()),
            kind: Some("Lease".to_string()),
            name: Some(settings.lease_name.clone()),
            namespace: Some(settings.namespace.clone()),
            uid: view.uid.clone(),
            ..Default::default()
        };
        let event = Event {
            type_,
            reason: event_reason.to_string(),
            note: Some(note),
            action: "LeaderElection".to_string(),
            secondary: None,
        };
        // Bounded: a deposed leader is often one that cannot reach the API server.
        match tokio::time::timeout(
            Duration::from_secs(2),
            self.recorder.publish(&event, &reference),
        )
        .await
        {
            Ok(Err(error)) => tracing::debug!(%error, "cannot publish the leadership Event"),
            Err(_) => tracing::debug!("publishing the leadership Event timed out"),
            Ok(Ok(())) => {}
        }
    }

    async fn run(self, shutdown: CancellationToken) -> Option<ManagerTask> {
        let (view_sender, mut view) = watch::channel(LeaseView::default());
        let observer = tokio::spawn(observe(
            Api::<Lease>::namespaced(self.client.clone(), &self.settings.namespace),
            self.settings.lease_name.clone(),
            view_sender,
        ));
        let retry = self.settings.timing.retry_period;
        let mut manager: Option<ManagerTask> = None;
        let mut leading = false;
        let mut failing = false;
        // The resourceVersion of a free Lease the manager was last restarted for.
        let mut restarted_for: Option<Option<String>> = None;
        loop {
            if manager.is_none() {
                match self.manager().await {
                    Ok(task) => {
                        manager = Some(task);
                        failing = false;
                    }
                    Err(error) => {
                        if !failing {
                            tracing::warn!(%error, namespace = %self.settings.namespace, lease = %self.settings.lease_name, "cannot set up the leader Lease; retrying");
                            failing = true;
                        }
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = tokio::time::sleep(retry) => continue,
                        }
                    }
                }
            }
            let Some((state, _)) = manager.as_mut() else {
                continue;
            };
            let holds = *state.borrow_and_update();
            let current = view.borrow_and_update().clone();
            let verdict = verdict(
                holds,
                &current,
                &self.settings.identity,
                jiff::Timestamp::now(),
                self.settings.timing.renew_deadline,
            );
            let wake = match &verdict {
                Verdict::Leading { until } => {
                    self.leadership.set_until(*until);
                    if !leading {
                        leading = true;
                        self.publish(true, "", &current).await;
                    }
                    Some(*until)
                }
                Verdict::Standby(reason) => {
                    self.leadership.set_until(jiff::Timestamp::UNIX_EPOCH);
                    if leading {
                        leading = false;
                        self.publish(false, reason, &current).await;
                    }
                    None
                }
            };
            // The lease manager of a standby sleeps until the expiry it last read. When the
            // Lease is released (a leader shutting down) or deleted, a new manager reads it
            // now and takes it at once.
            if !holds
                && current.known
                && current.holder.is_none()
                && restarted_for.as_ref() != Some(&current.resource_version)
            {
                restarted_for = Some(current.resource_version.clone());
                if let Some((_, task)) = manager.take() {
                    task.abort();
                }
                tracing::debug!("the leader Lease is free: taking it");
                continue;
            }
            let Some((state, _)) = manager.as_mut() else {
                continue;
            };
            let sleep = async {
                match wake {
                    Some(until) => {
                        let left = until.duration_since(jiff::Timestamp::now());
                        let left = Duration::try_from(left).unwrap_or_default();
                        tokio::time::sleep(left).await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                changed = state.changed() => {
                    if changed.is_err() {
                        // The lease manager's task ended (it gives up only on a closed
                        // channel); start another.
                        manager = None;
                    }
                }
                _ = view.changed() => {}
                _ = sleep => {}
            }
        }
        self.leadership.set_until(jiff::Timestamp::UNIX_EPOCH);
        if leading {
            let last = view.borrow().clone();
            self.publish(false, SHUTTING_DOWN, &last).await;
        }
        observer.abort();
        manager
    }
}

/// Watches the one Lease and publishes what the API server shows of it.
async fn observe(api: Api<Lease>, name: String, sender: watch::Sender<LeaseView>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut seen_in_list = false;
    while let Some(event) = events.next().await {
        let next = match event {
            Ok(WatchEvent::Apply(lease)) | Ok(WatchEvent::InitApply(lease)) => {
                seen_in_list = true;
                LeaseView::of(&lease)
            }
            Ok(WatchEvent::Delete(_)) => LeaseView::gone(),
            Ok(WatchEvent::Init) => {
                seen_in_list = false;
                continue;
            }
            Ok(WatchEvent::InitDone) => {
                if seen_in_list {
                    continue;
                }
                LeaseView::gone()
            }
            Err(error) => {
                tracing::debug!(%error, "watching the leader Lease failed; retrying");
                continue;
            }
        };
        sender.send_if_modified(|view| {
            let changed = *view != next;
            *view = next;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> LeaderElectionOptions {
        LeaderElectionOptions {
            leader_elect: true,
            ..Default::default()
        }
    }

    fn error_of(options: &LeaderElectionOptions) -> (String, String) {
        match options.validate() {
            Err(Error::InvalidOption { option, reason }) => (option, reason),
            other => panic!("expected an invalid option, got {other:?}"),
        }
    }

    #[test]
    fn the_defaults_are_valid_and_renew_every_retry_period() {
        let timing = options().validate().unwrap();
        assert_eq!(timing.lease_duration_seconds, 6);
        assert_eq!(timing.grace_seconds, 5, "renews every 6 - 5 = 1 s");
        assert_eq!(timing.renew_deadline, Duration::from_secs(4));
        assert_eq!(timing.stop_grace(), Duration::from_secs(1));
    }

    /// The timing of kube components: 15 s / 10 s / 2 s.
    fn kube_like() -> ElectionTiming {
        LeaderElectionOptions {
            leader_elect_lease_duration: Duration::from_secs(15),
            leader_elect_renew_deadline: Duration::from_secs(10),
            leader_elect_retry_period: Duration::from_secs(2),
            ..options()
        }
        .validate()
        .unwrap()
    }

    #[test]
    fn the_kube_component_timing_is_valid_too() {
        let timing = kube_like();
        assert_eq!(timing.grace_seconds, 13);
        assert_eq!(timing.stop_grace(), Duration::from_secs(2), "capped");
    }

    #[test]
    fn invalid_flags_are_named_with_the_fix() {
        let secs = Duration::from_secs;
        let millis = Duration::from_millis;
        let cases: Vec<(LeaderElectionOptions, &str, &str)> = vec![
            (
                LeaderElectionOptions {
                    leader_elect_renew_deadline: secs(6),
                    ..options()
                },
                "--leader-elect-renew-deadline",
                "shorter than --leader-elect-lease-duration",
            ),
            (
                LeaderElectionOptions {
                    leader_elect_retry_period: secs(4),
                    ..options()
                },
                "--leader-elect-retry-period",
                "shorter than --leader-elect-renew-deadline",
            ),
            (
                LeaderElectionOptions {
                    leader_elect_lease_duration: millis(6500),
                    ..options()
                },
                "--leader-elect-lease-duration",
                "whole number of seconds",
            ),
            (
                LeaderElectionOptions {
                    leader_elect_lease_duration: secs(1),
                    leader_elect_renew_deadline: millis(800),
                    leader_elect_retry_period: millis(500),
                    ..options()
                },
                "--leader-elect-lease-duration",
                "at least 2s",
            ),
            (
                LeaderElectionOptions {
                    leader_elect_retry_period: millis(500),
                    ..options()
                },
                "--leader-elect-retry-period",
                "whole number of seconds",
            ),
            (
                LeaderElectionOptions {
                    leader_elect_lease_name: "bulkhead-hub".into(),
                    ..options()
                },
                "--leader-elect-lease-name",
                "fencing Lease",
            ),
            (
                LeaderElectionOptions {
                    leader_elect_lease_name: "Bulkhead_Leader".into(),
                    ..options()
                },
                "--leader-elect-lease-name",
                "not a valid object name",
            ),
            (
                LeaderElectionOptions {
                    leader_elect_namespace: "".into(),
                    ..options()
                },
                "--leader-elect-namespace",
                "not a valid namespace name",
            ),
        ];
        for (options, flag, fix) in cases {
            let (option, reason) = error_of(&options);
            assert_eq!(option, flag, "{options:?}");
            assert!(reason.contains(fix), "{flag}: {reason}");
        }
    }

    #[test]
    fn the_default_timing_replaces_a_crashed_leader_before_members_fence() {
        let timing = options().validate().unwrap();
        // The hub's defaults: fencing Lease renewed every 2 s, 10 s duration.
        assert!(timing.worst_fencing_gap(Duration::from_secs(2)) < Duration::from_secs(10));
        assert!(kube_like().worst_fencing_gap(Duration::from_secs(2)) >= Duration::from_secs(10));
    }

    fn at(second: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(second).unwrap()
    }

    fn held_by(holder: &str, renewed: i64) -> LeaseView {
        LeaseView {
            known: true,
            holder: Some(holder.into()),
            renew_time: Some(at(renewed)),
            ..Default::default()
        }
    }

    #[test]
    fn a_replica_leads_only_while_its_own_renewal_is_fresh() {
        let deadline = Duration::from_secs(4);
        assert_eq!(
            verdict(true, &held_by("hub-a", 100), "hub-a", at(102), deadline),
            Verdict::Leading { until: at(104) }
        );
        // The renew deadline passed without a renewal the API server confirmed.
        assert!(matches!(
            verdict(true, &held_by("hub-a", 100), "hub-a", at(104), deadline),
            Verdict::Standby(reason) if reason.contains("renew deadline")
        ));
        // The manager thinks it holds the Lease, the API server shows another holder.
        assert!(matches!(
            verdict(true, &held_by("hub-b", 103), "hub-a", at(103), deadline),
            Verdict::Standby(reason) if reason.contains("held by hub-b")
        ));
        // The API server shows this replica, the manager lost it.
        assert!(matches!(
            verdict(false, &held_by("hub-a", 103), "hub-a", at(103), deadline),
            Verdict::Standby(_)
        ));
        // Acquired, but the renewal is not visible yet.
        assert!(matches!(
            verdict(true, &LeaseView::gone(), "hub-a", at(103), deadline),
            Verdict::Standby(_)
        ));
    }

    #[test]
    fn a_term_past_its_deadline_does_not_lead_even_before_the_election_notices() {
        let (_sender, leadership) = Leadership::manual(true);
        assert!(leadership.is_leader());
        leadership.set_until(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(5));
        assert!(leadership.is_leader());
        leadership.set_until(jiff::Timestamp::now() - jiff::SignedDuration::from_millis(1));
        assert!(
            !leadership.is_leader(),
            "the flag still says true; the clock says no"
        );
    }

    #[tokio::test]
    async fn a_standby_sends_reads_but_no_writes() {
        use kube::client::Body;
        let (service, mut handle) =
            tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let (sender, leadership) = Leadership::manual(false);
        let gated = write_gated(Client::new(service, "default"), leadership);
        let server = tokio::spawn(async move {
            let mut methods = vec![];
            while let Some((request, respond)) = handle.next_request().await {
                methods.push(request.method().clone());
                respond.send_response(
                    http::Response::builder()
                        .body(Body::from(
                            br#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x"}}"#
                                .to_vec(),
                        ))
                        .unwrap(),
                );
            }
            methods
        });
        let api = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(gated, "default");
        assert!(api.get("x").await.is_ok(), "reads go through");
        assert!(
            api.delete("x", &Default::default()).await.is_err(),
            "a standby's write is refused"
        );
        sender.send_replace(true);
        assert!(api.delete("x", &Default::default()).await.is_ok());
        drop(api);
        let methods = server.await.unwrap();
        assert_eq!(methods, vec![http::Method::GET, http::Method::DELETE]);
    }

    /// Inside an in-flight limit (as the member clients have it), a write is judged when
    /// it gets its turn: one queued behind a slow request while this hub led, and whose
    /// turn came after the leadership ended, is never sent.
    #[tokio::test]
    async fn a_write_waiting_for_its_turn_is_judged_when_it_gets_it() {
        use kube::client::Body;
        use tower::{Service, ServiceBuilder, ServiceExt};
        let (service, mut handle) =
            tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let (sender, leadership) = Leadership::manual(true);
        let mut gated = ServiceBuilder::new()
            .concurrency_limit(1)
            .layer(LeaderGateLayer { leadership })
            .service(service);
        let request = |method: http::Method| {
            http::Request::builder()
                .method(method)
                .uri("/api/v1/namespaces/shop/configmaps/x")
                .body(Body::empty())
                .unwrap()
        };
        let slow = gated
            .ready()
            .await
            .unwrap()
            .call(request(http::Method::GET));
        let mut queued = gated.clone();
        let write = tokio::spawn(async move {
            queued
                .ready()
                .await
                .unwrap()
                .call(request(http::Method::PATCH))
                .await
        });
        let (_, respond) = handle.next_request().await.unwrap();
        // Leadership ends while the write waits for the only slot.
        sender.send_replace(false);
        respond.send_response(http::Response::builder().body(Body::empty()).unwrap());
        slow.await.unwrap();
        let refused = write.await.unwrap().unwrap_err();
        assert!(refused.to_string().contains("not the leader"), "{refused}");
        assert!(
            tokio::time::timeout(Duration::from_millis(100), handle.next_request())
                .await
                .is_err(),
            "the write never reached the member"
        );
    }

    #[tokio::test]
    async fn leadership_waits_for_changes() {
        let (sender, mut leadership) = Leadership::manual(false);
        assert!(!leadership.is_leader());
        let waiter = {
            let mut leadership = leadership.clone();
            tokio::spawn(async move { leadership.wait_until(true).await })
        };
        sender.send_replace(true);
        waiter.await.unwrap();
        sender.send_replace(false);
        assert!(!leadership.changed().await);
        assert!(Leadership::always().is_leader());
        // An always-leading handle never changes.
        let mut always = Leadership::always();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), always.changed())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn leader_only_tasks_run_per_term_and_stop_when_leadership_ends() {
        let (sender, leadership) = Leadership::manual(false);
        let shutdown = CancellationToken::new();
        let (started_sender, mut started) = tokio::sync::mpsc::unbounded_channel();
        let (stopped_sender, mut stopped) = tokio::sync::mpsc::unbounded_channel();
        let runner = tokio::spawn(run_while_leader(
            leadership,
            shutdown.clone(),
            Duration::from_millis(200),
            "test",
            move |cancel: CancellationToken| {
                let started = started_sender.clone();
                let stopped = stopped_sender.clone();
                async move {
                    started.send(()).unwrap();
                    cancel.cancelled().await;
                    stopped.send(()).unwrap();
                }
            },
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(started.try_recv().is_err(), "a standby runs nothing");
        for _ in 0..2 {
            sender.send_replace(true);
            started.recv().await.unwrap();
            sender.send_replace(false);
            stopped.recv().await.unwrap();
        }
        shutdown.cancel();
        runner.await.unwrap();
    }

    #[tokio::test]
    async fn a_task_that_ignores_cancellation_is_aborted_after_the_grace() {
        let (sender, leadership) = Leadership::manual(true);
        let shutdown = CancellationToken::new();
        let (alive_sender, mut alive) = tokio::sync::mpsc::unbounded_channel::<()>();
        let runner = tokio::spawn(run_while_leader(
            leadership,
            shutdown.clone(),
            Duration::from_millis(100),
            "stubborn",
            move |_cancel| {
                let alive = alive_sender.clone();
                async move {
                    loop {
                        let _ = alive.send(());
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            },
        ));
        alive.recv().await.unwrap();
        sender.send_replace(false);
        tokio::time::sleep(Duration::from_millis(300)).await;
        while alive.try_recv().is_ok() {}
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(alive.try_recv().is_err(), "aborted");
        shutdown.cancel();
        runner.await.unwrap();
    }
}
