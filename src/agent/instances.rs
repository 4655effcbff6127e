//! The agent's side of each database's instances. Every round it asks each pod's instance
//! manager (`bulkhead instance`) for its status, decides the roles ([`roles::decide`]),
//! records a new primary and term in the MyDatabase's status before any instance hears of
//! them, tells every instance its role (which is also how an instance knows the agent is
//! there), and labels each pod with the role PostgreSQL runs in, which the Services
//! select by. What it saw goes into the MyDatabase's status through the reconciler
//! ([`Views`]): instances, `PrimaryAvailable`, `ReplicationHealthy`. A version upgrade
//! replaces the pods one by one, standbys first and the primary after a switchover
//! ([`upgrade::next`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::builders::{self, LABEL_DATABASE, LABEL_ROLE, POSTGRES_PORT, ReadOnlyReason};
use super::roles::{self, Recorded, RoleDecision, RoleInput};
use super::upgrade::{self, UpgradeInput, UpgradePod, UpgradeStep};
use crate::api::MyDatabase;
use crate::api::instance::{INSTANCE_PORT, InstanceStatus, Role, parse_lsn};
use crate::api::mydatabase::{DatabaseInstanceStatus, ReplicaSource};
use crate::instance::client;

/// How long a round waits for an instance it just told to promote to run as primary.
const PROMOTION_WAIT: Duration = Duration::from_secs(3);

/// A switchover that has not completed in this time is given up: the primary is promoted
/// again, and the next attempt waits [`SWITCHOVER_HOLD_OFF`].
const SWITCHOVER_TIMEOUT: Duration = Duration::from_secs(30);
const SWITCHOVER_HOLD_OFF: Duration = Duration::from_secs(300);

/// A standby further behind than this is not counted healthy.
pub const MAX_HEALTHY_LAG_BYTES: u64 = 16 * 1024 * 1024;

/// How the loop runs.
#[derive(Clone, Debug)]
pub struct InstanceSettings {
    /// How often every instance is asked and told.
    pub round: Duration,
    /// How long the recorded primary may not answer before a standby is promoted.
    pub failover_after: Duration,
    /// How long one request to an instance may take.
    pub request_timeout: Duration,
    /// The instances' own lease (`bulkhead instance --agent-lease`): a primary that has
    /// not accepted a command for this long demotes itself.
    pub instance_lease: Duration,
    /// The pod annotation holding a pod's address from other clusters (None: its IP).
    pub external_address_annotation: Option<String>,
    /// The primary terms the hub's Lease carries (see `fence.rs`).
    pub terms: Terms,
}

/// The primary terms the hub's Lease last carried, shared by the Lease watcher, the
/// instance loop and the reconciler.
pub type Terms = std::sync::Arc<arc_swap::ArcSwap<builders::PrimaryTerms>>;

impl Default for InstanceSettings {
    fn default() -> Self {
        InstanceSettings {
            round: Duration::from_secs(1),
            failover_after: Duration::from_secs(5),
            request_timeout: Duration::from_secs(1),
            instance_lease: Duration::from_secs(10),
            external_address_annotation: None,
            terms: Terms::default(),
        }
    }
}

/// A condition as the loop sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConditionParts {
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// What the loop saw of one database's instances in its last round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InstancesView {
    pub instances: Vec<DatabaseInstanceStatus>,
    pub primary_available: ConditionParts,
    pub replication_healthy: ConditionParts,
    /// Where other clusters reach the recorded primary (`status.endpoint`).
    pub endpoint: Option<ReplicaSource>,
}

/// WAL positions and lag alone move with every write: they reach the status at most this
/// often (roles, readiness and conditions at once).
pub const POSITION_REFRESH: Duration = Duration::from_secs(30);

/// How often positions reach the status of a copy the hub is switching over (annotation
/// `federation.example.com/switchover-to`): the hub waits for the new primary cluster to
/// have received the old one's last WAL.
pub const SWITCHOVER_POSITION_REFRESH: Duration = Duration::from_secs(1);

/// The last view of each database (`namespace/name`), shared with the reconciler.
#[derive(Clone, Default)]
pub struct Views(Arc<Mutex<HashMap<String, Seen>>>);

/// What the loop last saw of a database, and what it last had the reconciler write.
struct Seen {
    latest: InstancesView,
    published: InstancesView,
    at: Instant,
}

/// The view without what moves with every write.
fn without_positions(view: &InstancesView) -> InstancesView {
    let mut view = view.clone();
    for instance in &mut view.instances {
        instance.lsn = None;
        instance.lag_bytes = None;
    }
    view
}

impl Views {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The view of `key`, if the loop has seen the database.
    pub fn get(&self, key: &str) -> Option<InstancesView> {
        self.lock().get(key).map(|seen| seen.latest.clone())
    }

    /// Stores a view; whether the status should be written now: something other than a
    /// WAL position changed, or positions did and the last write is `refresh` old
    /// ([`POSITION_REFRESH`], or [`SWITCHOVER_POSITION_REFRESH`] while the hub moves the
    /// primary between clusters).
    /// A position held back is compared with what was last published, not with the
    /// view before it: it is published once `refresh` has passed even if it does not move
    /// again (a switchover waits for exactly that last position).
    pub fn set(&self, key: &str, view: InstancesView, now: Instant, refresh: Duration) -> bool {
        let mut views = self.lock();
        let publish = match views.get(key) {
            None => true,
            Some(seen) if seen.published == view => false,
            Some(seen) => {
                without_positions(&seen.published) != without_positions(&view)
                    || now.duration_since(seen.at) >= refresh
            }
        };
        let seen = match views.remove(key) {
            Some(seen) if !publish => Seen {
                latest: view,
                ..seen
            },
            _ => Seen {
                latest: view.clone(),
                published: view,
                at: now,
            },
        };
        views.insert(key.to_string(), seen);
        publish
    }

    fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|key, _| keep(key));
    }
}

/// What a primary whose lease ran out may take to stop acknowledging writes: the instance
/// looks at its lease once a second (`instance::TICK`), then shuts PostgreSQL down fast
/// (sessions end at once), plus a margin.
pub const DEMOTION_ALLOWANCE: Duration = Duration::from_secs(2);

/// The shortest `failover_after` that never promotes a standby before the primary can
/// have demoted itself: the instances' lease, the allowance, and one round of the agent.
pub fn shortest_safe_failover(instance_lease: Duration, round: Duration) -> Duration {
    instance_lease + DEMOTION_ALLOWANCE + round
}

/// What the loop keeps per database between rounds.
struct Tracked {
    /// The newest record this agent wrote or read (the store may lag a write).
    recorded: Recorded,
    /// The primary `primary_seen` is about, and when it last answered (or became the
    /// recorded primary, or the agent first saw the database: a restarted agent waits
    /// `failover_after` before it promotes anyone).
    primary: Option<String>,
    primary_seen: Instant,
    /// When the recorded primary last accepted a command (its answer received: its own
    /// lease began no later), or became the recorded primary, or the agent first saw the
    /// database (a restarted agent does not know when its predecessor last spoke).
    primary_told: Instant,
    token: Option<String>,
    /// When the switchover under way began.
    switchover: Option<Instant>,
    /// No switchover begins before this (the last one did not complete in time).
    switchover_hold: Option<Instant>,
    /// The pod an upgrade deleted last (name, UID): nothing else is replaced while it is
    /// still listed.
    replaced: Option<(String, String)>,
    /// The primary an upgrade is switching over (asked for until the record names
    /// another instance, through the rounds in which the upgrade waits).
    upgrade_switchover: Option<String>,
}

/// Everything one round needs.
struct Loop {
    client: Client,
    pods: Store<Pod>,
    statefulsets: Store<StatefulSet>,
    fenced: watch::Receiver<bool>,
    views: Views,
    changed: mpsc::Sender<ObjectRef<MyDatabase>>,
    recorder: Recorder,
    settings: InstanceSettings,
}

/// The lease the recorded primary demotes itself by: the one its pod was started with
/// when that is longer than the agent's own (a pod older than a change of the flag), so
/// the order of the two timers holds whatever the flags were when each pod was made.
fn primary_lease(
    settings: &InstanceSettings,
    pods: &[Arc<Pod>],
    primary: Option<&str>,
) -> Duration {
    let own = primary
        .and_then(|name| pods.iter().find(|p| p.name_any() == name))
        .and_then(|pod| builders::pod_agent_lease(pod));
    own.map_or(settings.instance_lease, |own| {
        own.max(settings.instance_lease)
    })
}

/// `key` and the object's UID: one life of a database.
fn life(database: &MyDatabase) -> String {
    format!("{}/{}", key(database), database.uid().unwrap_or_default())
}

fn key(database: &MyDatabase) -> String {
    format!(
        "{}/{}",
        database.namespace().unwrap_or_default(),
        database.name_any()
    )
}

/// Runs the loop until `shutdown`. `changed` receives each database whose view changed
/// (the reconciler writes its status).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    namespace: Option<String>,
    fenced: watch::Receiver<bool>,
    views: Views,
    changed: mpsc::Sender<ObjectRef<MyDatabase>>,
    recorder: Recorder,
    settings: InstanceSettings,
    shutdown: CancellationToken,
) {
    let (databases_api, pods_api, statefulsets_api): (Api<MyDatabase>, Api<Pod>, Api<StatefulSet>) =
        match &namespace {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
            ),
            None => (
                Api::all(client.clone()),
                Api::all(client.clone()),
                Api::all(client.clone()),
            ),
        };
    let (databases, databases_writer) = reflector::store();
    let (pods, pods_writer) = reflector::store();
    let database_watch = watcher(databases_api, watcher::Config::default())
        .backoff(crate::client::WatchBackoff::default())
        .reflect(databases_writer)
        .for_each(|_| async {});
    let children = format!("app.kubernetes.io/managed-by=bulkhead-agent,{LABEL_DATABASE}");
    let pod_watch = watcher(pods_api, watcher::Config::default().labels(&children))
        .backoff(crate::client::WatchBackoff::default())
        .reflect(pods_writer)
        .for_each(|_| async {});
    let (statefulsets, statefulsets_writer) = reflector::store();
    let statefulset_watch = watcher(
        statefulsets_api,
        watcher::Config::default().labels(&children),
    )
    .backoff(crate::client::WatchBackoff::default())
    .reflect(statefulsets_writer)
    .for_each(|_| async {});
    let watches = tokio::spawn(async move {
        futures::join!(database_watch, pod_watch, statefulset_watch);
    });
    let context = Loop {
        client,
        pods,
        statefulsets,
        fenced,
        views,
        changed,
        recorder,
        settings,
    };
    let mut tracked: HashMap<String, Tracked> = HashMap::new();
    let mut ticker = tokio::time::interval(context.settings.round);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let current: Vec<Arc<MyDatabase>> = databases.state();
        let keys: Vec<String> = current.iter().map(|d| key(d)).collect();
        // What a round remembers belongs to one object: a database deleted and created
        // again under its name (its UID changes) starts from its own status, never from
        // the record of the one before.
        let lives: Vec<String> = current.iter().map(|d| life(d)).collect();
        tracked.retain(|k, _| lives.contains(k));
        context.views.retain(|k| keys.iter().any(|c| c == k));
        let now = Instant::now();
        for database in &current {
            tracked.entry(life(database)).or_insert_with(|| Tracked {
                recorded: Recorded::default(),
                primary: None,
                primary_seen: now,
                primary_told: now,
                token: None,
                switchover: None,
                switchover_hold: None,
                replaced: None,
                upgrade_switchover: None,
            });
        }
        // Every database's round at once: a silent pod costs its database the request
        // timeout, not the others.
        let rounds = tracked.iter_mut().filter_map(|(k, t)| {
            let database = current.iter().find(|d| life(d) == *k)?.clone();
            Some(context.round(database, t))
        });
        futures::future::join_all(rounds).await;
    }
    watches.abort();
}

/// Whether the pod's Ready condition is True.
fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// A pod's ordinal (`orders-2` -> 2).
fn ordinal(pod: &Pod) -> u32 {
    roles::ordinal_of(&pod.name_any()).unwrap_or(u32::MAX)
}

fn pod_ip(pod: &Pod) -> Option<IpAddr> {
    pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()
}

impl Loop {
    async fn round(&self, database: Arc<MyDatabase>, tracked: &mut Tracked) {
        if database.metadata.deletion_timestamp.is_some() {
            return;
        }
        let database_key = key(&database);
        let namespace = database.namespace().unwrap_or_default();
        let name = database.name_any();
        let mut pods: Vec<Arc<Pod>> = self
            .pods
            .state()
            .into_iter()
            .filter(|p| {
                p.namespace().as_deref() == Some(namespace.as_str())
                    && p.labels().get(LABEL_DATABASE) == Some(&name)
                    && p.metadata.deletion_timestamp.is_none()
            })
            .collect();
        pods.sort_by_key(|p| ordinal(p));

        if tracked.token.is_none() {
            let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
            match secrets
                .get_opt(&builders::instance_secret_name(&name))
                .await
            {
                Ok(Some(secret)) => {
                    tracked.token = secret
                        .data
                        .as_ref()
                        .and_then(|d| d.get("token"))
                        .map(|t| String::from_utf8_lossy(&t.0).trim().to_string());
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::debug!(database = %database_key, %error, "reading the instance Secret")
                }
            }
        }

        // Ask every instance.
        let timeout = self.settings.request_timeout;
        let asked = futures::future::join_all(pods.iter().map(|pod| async move {
            match pod_ip(pod) {
                Some(ip) => client::status(SocketAddr::new(ip, INSTANCE_PORT), timeout)
                    .await
                    .ok(),
                None => None,
            }
        }))
        .await;
        let hosts: Vec<String> = pods
            .iter()
            .map(|p| pod_ip(p).map(|ip| ip.to_string()).unwrap_or_default())
            .collect();
        let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();

        let from_status = database
            .status
            .as_ref()
            .map(|s| Recorded {
                primary: s.primary.clone(),
                term: s.term,
            })
            .unwrap_or_default();
        if from_status.term >= tracked.recorded.term {
            tracked.recorded = from_status;
        }
        let read_only = builders::read_only_reason(
            &database,
            *self.fenced.borrow(),
            &self.settings.terms.load(),
        );
        let replica_of = builders::replica_source(&database);
        let synchronous = database
            .spec
            .topology
            .as_ref()
            .map(|t| t.synchronous)
            .unwrap_or(0)
            .min(pods.len().saturating_sub(1) as u32);

        let now = Instant::now();
        // Replicas 0 stops every instance: nothing to switch over to.
        let keep = u32::try_from(database.spec.replicas)
            .ok()
            .filter(|k| *k > 0)
            .unwrap_or(u32::MAX);
        let switchover_allowed = tracked.switchover_hold.is_none_or(|until| now >= until);
        let upgrade = self.upgrade_step(&database, &pods, &names, &asked, read_only, tracked);
        tracked.upgrade_switchover = upgrade::switching_over(
            upgrade.as_ref(),
            tracked.upgrade_switchover.take(),
            tracked.recorded.primary.as_deref(),
        );
        let replacing = tracked.upgrade_switchover.clone();
        let mut told: Option<RoleDecision> = None;
        // At most two decisions: a new record, then the roles under it.
        for _ in 0..2 {
            let recorded = tracked.recorded.clone();
            if tracked.primary != recorded.primary {
                tracked.primary = recorded.primary.clone();
                tracked.primary_seen = now;
                tracked.primary_told = now;
            }
            let primary_answers = recorded
                .primary
                .as_ref()
                .and_then(|p| names.iter().position(|n| n == p))
                .is_some_and(|i| asked[i].is_some());
            if primary_answers {
                tracked.primary_seen = now;
            }
            let instances: Vec<roles::Instance<'_>> = names
                .iter()
                .enumerate()
                .map(|(i, pod)| roles::Instance {
                    pod,
                    host: &hosts[i],
                    status: asked[i].as_ref(),
                })
                .collect();
            let fenced_why = read_only.filter(|r| r.fences()).map(ReadOnlyReason::words);
            let decision = roles::decide(&RoleInput {
                instances: &instances,
                recorded: &recorded,
                fenced: fenced_why,
                primary_silent_for: (!primary_answers).then(|| now - tracked.primary_seen),
                failover_after: self.settings.failover_after,
                primary_may_write_for: (tracked.primary_told
                    + primary_lease(&self.settings, &pods, recorded.primary.as_deref())
                    + DEMOTION_ALLOWANCE)
                    .saturating_duration_since(now),
                port: POSTGRES_PORT as u16,
                synchronous,
                keep,
                replacing: replacing.as_deref(),
                switchover_allowed,
                replica_of: replica_of.as_ref(),
            });
            match decision {
                RoleDecision::Record {
                    primary,
                    term,
                    why,
                    switchover,
                } => {
                    if !self
                        .record(&database, &primary, term, &why, switchover)
                        .await
                    {
                        break;
                    }
                    tracked.switchover = None;
                    tracked.recorded = Recorded {
                        primary: Some(primary),
                        term,
                    };
                }
                tell @ RoleDecision::Tell { .. } => {
                    told = Some(tell);
                    break;
                }
            }
        }
        let Some(RoleDecision::Tell {
            mut desired,
            message,
            switching_to,
        }) = told
        else {
            return;
        };
        match (&switching_to, tracked.switchover) {
            (None, _) => tracked.switchover = None,
            (Some(_), None) => tracked.switchover = Some(now),
            (Some(to), Some(began)) if now.duration_since(began) >= SWITCHOVER_TIMEOUT => {
                // Given up: the primary is told to lead again next round.
                tracked.switchover = None;
                tracked.switchover_hold = Some(now + SWITCHOVER_HOLD_OFF);
                let note = format!(
                    "the switchover to {to} did not complete in {}s: the primary leads again, and the scale-down waits {}s for the next attempt",
                    SWITCHOVER_TIMEOUT.as_secs(),
                    SWITCHOVER_HOLD_OFF.as_secs()
                );
                tracing::warn!(database = %database_key, "{note}");
                super::reconciler::publish(
                    &self.recorder,
                    &database,
                    EventType::Warning,
                    "SwitchoverTimedOut",
                    note,
                    "Switchover",
                )
                .await;
            }
            (Some(_), Some(_)) => {}
        }
        // While the recorded primary, told to lead, still runs as a standby (being
        // promoted), the others are given nothing to follow yet: a standby rewound against
        // a primary whose promotion is not complete would find no new timeline to rewind
        // to. (A primary being demoted for a switchover is still followed: the standby
        // taking over receives its last WAL from it.)
        let promoting = tracked.recorded.primary.as_ref().is_some_and(|p| {
            let told_to_lead = desired
                .iter()
                .any(|(pod, d)| pod == p && d.role == Role::Primary);
            told_to_lead
                && names
                    .iter()
                    .position(|n| n == p)
                    .and_then(|i| asked[i].as_ref())
                    .is_some_and(|s| s.role == Some(Role::Standby))
        });
        if promoting {
            for (pod, wanted) in desired.iter_mut() {
                if Some(pod.as_str()) != tracked.recorded.primary.as_deref() {
                    wanted.upstream = None;
                }
            }
        }

        // Tell every instance that answered this round (a silent one would only cost the
        // round another timeout; it hears its role once it answers again); its answer is
        // its newest status.
        let token = tracked.token.clone();
        let answered: Vec<bool> = asked.iter().map(Option::is_some).collect();
        let telling_started = Instant::now();
        let token_refused = std::sync::atomic::AtomicBool::new(false);
        let token_refused = &token_refused;
        let answers = futures::future::join_all(pods.iter().enumerate().map(|(i, pod)| {
            let wanted = desired
                .iter()
                .find(|(p, _)| *p == names[i])
                .filter(|_| answered[i])
                .map(|(_, d)| d.clone());
            let token = token.clone();
            let database_key = database_key.clone();
            async move {
                let (Some(ip), Some(wanted), Some(token)) = (pod_ip(pod), wanted, token) else {
                    return None;
                };
                match client::tell(SocketAddr::new(ip, INSTANCE_PORT), &token, &wanted, timeout)
                    .await
                {
                    Ok(status) => Some(status),
                    Err(error) => {
                        let text = format!("{error:#}");
                        if text.contains("(401") {
                            // A Secret made again (the database deleted and created anew):
                            // read the token again next round.
                            token_refused.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                        if text.contains("refused the role") {
                            tracing::info!(database = %database_key, pod = %pod.name_any(), error = %text, "an instance refused its role");
                        } else {
                            tracing::debug!(database = %database_key, pod = %pod.name_any(), error = %text, "telling an instance its role");
                        }
                        None
                    }
                }
            }
        }))
        .await;
        if token_refused.load(std::sync::atomic::Ordering::Relaxed) {
            tracked.token = None;
        }
        // The recorded primary's own lease runs from the command it just accepted; from a
        // command it did not answer, it may still run from as late as that command can be
        // delivered (a cut delays it, the instance acts on it within a bound).
        if let Some(i) = tracked
            .recorded
            .primary
            .as_ref()
            .and_then(|p| names.iter().position(|n| n == p))
        {
            let sent = answered[i]
                && tracked.token.is_some()
                && desired.iter().any(|(p, _)| *p == names[i]);
            if answers[i].is_some() {
                tracked.primary_told = tracked.primary_told.max(Instant::now());
            } else if sent {
                tracked.primary_told = tracked
                    .primary_told
                    .max(telling_started + crate::instance::COMMAND_DELIVERY_BOUND);
            }
        }
        let mut latest: Vec<Option<InstanceStatus>> = answers
            .into_iter()
            .zip(asked)
            .map(|(answer, asked)| answer.or(asked))
            .collect();
        // A promotion (`pg_promote`) takes a moment after the word: wait for it here, so
        // the read-write Services select the new primary this round, not the next.
        for (i, pod) in pods.iter().enumerate() {
            let promoting = desired
                .iter()
                .any(|(p, d)| *p == names[i] && d.role == Role::Primary)
                && latest[i]
                    .as_ref()
                    .is_some_and(|s| s.role == Some(Role::Standby));
            let Some(ip) = pod_ip(pod).filter(|_| promoting) else {
                continue;
            };
            let deadline = Instant::now() + PROMOTION_WAIT;
            tracing::info!(database = %database_key, pod = %names[i], "waiting for the promotion");
            while Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Ok(status) =
                    client::status(SocketAddr::new(ip, INSTANCE_PORT), timeout).await
                {
                    let promoted = status.role == Some(Role::Primary);
                    latest[i] = Some(status);
                    if promoted {
                        break;
                    }
                }
            }
        }

        // Label each pod with the role its PostgreSQL runs in: `primary` only once it is
        // both told and running as primary, so the read-write Services never select a
        // server that refuses writes or one the agent has not made primary.
        for (i, pod) in pods.iter().enumerate() {
            let wanted_role = desired
                .iter()
                .find(|(p, _)| *p == names[i])
                .map(|(_, d)| d.role);
            let running = latest[i].as_ref().and_then(|s| s.role);
            let label = match (wanted_role, running) {
                (Some(Role::Primary), Some(Role::Primary)) => Some(Role::Primary),
                (Some(Role::Standby), _) | (_, Some(Role::Standby)) => Some(Role::Standby),
                _ => None,
            };
            if let Some(role) = label {
                self.label(pod, role).await;
            }
        }

        if let Some(UpgradeStep::Replace { pod, why }) = &upgrade
            && switching_to.is_none()
            && let Some(target) = pods.iter().find(|p| p.name_any() == *pod)
        {
            self.replace(&database, target, why, tracked).await;
        }

        let mut view = view(
            &names,
            &latest,
            tracked.recorded.primary.as_deref(),
            read_only,
            &message,
        );
        view.endpoint = tracked
            .recorded
            .primary
            .as_ref()
            .and_then(|primary| pods.iter().find(|p| p.name_any() == *primary))
            .and_then(|pod| {
                external_address(pod, self.settings.external_address_annotation.as_deref())
            })
            .map(|host| ReplicaSource {
                host,
                port: POSTGRES_PORT,
            });
        let refresh = if database
            .annotations()
            .contains_key(crate::api::ANNOTATION_SWITCHOVER_TO)
        {
            SWITCHOVER_POSITION_REFRESH
        } else {
            POSITION_REFRESH
        };
        if self.views.set(&database_key, view, Instant::now(), refresh) {
            let _ = self
                .changed
                .try_send(ObjectRef::from_obj(database.as_ref()));
        }
    }

    /// Records `primary` and `term` in the database's status, only if the database has not
    /// changed since it was read (a concurrent record wins; the next round reads it).
    async fn record(
        &self,
        database: &MyDatabase,
        primary: &str,
        term: u64,
        why: &str,
        switchover: bool,
    ) -> bool {
        let api: Api<MyDatabase> = Api::namespaced(
            self.client.clone(),
            &database.namespace().unwrap_or_default(),
        );
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": database.resource_version()},
            "status": {"primary": primary, "term": term},
        });
        match api
            .patch_status(
                &database.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(database = %key(database), primary, term, why, "recorded the primary");
                let (type_, reason) = match (switchover, term > 1) {
                    (true, _) => (EventType::Normal, "Switchover"),
                    (false, true) => (EventType::Warning, "Failover"),
                    (false, false) => (EventType::Normal, "PrimaryElected"),
                };
                super::reconciler::publish(
                    &self.recorder,
                    database,
                    type_,
                    reason,
                    format!("{primary} is the primary under term {term}: {why}"),
                    reason,
                )
                .await;
                true
            }
            Err(error) => {
                tracing::info!(database = %key(database), %error, "recording the primary failed; trying again next round");
                false
            }
        }
    }

    /// What a version upgrade does this round (None: the StatefulSet is not known yet).
    fn upgrade_step(
        &self,
        database: &MyDatabase,
        pods: &[Arc<Pod>],
        names: &[String],
        asked: &[Option<InstanceStatus>],
        read_only: Option<ReadOnlyReason>,
        tracked: &mut Tracked,
    ) -> Option<UpgradeStep> {
        let mut key = ObjectRef::new(&database.name_any());
        if let Some(namespace) = database.namespace() {
            key = key.within(&namespace);
        }
        let statefulset = self.statefulsets.get(&key)?;
        if let Some((_, uid)) = &tracked.replaced {
            if pods.iter().any(|p| p.uid().as_ref() == Some(uid)) {
                return Some(UpgradeStep::Wait("a replaced pod is still going".into()));
            }
            tracked.replaced = None;
        }
        let status = statefulset.status.as_ref();
        let update_revision = status.and_then(|s| s.update_revision.as_deref());
        let observed = update_revision.is_some()
            && status.and_then(|s| s.observed_generation) >= statefulset.metadata.generation;
        let upgrade_pods: Vec<UpgradePod<'_>> = pods
            .iter()
            .zip(names)
            .zip(asked)
            .map(|((pod, name), answer)| UpgradePod {
                name,
                updated: pod
                    .labels()
                    .get("controller-revision-hash")
                    .map(String::as_str)
                    == update_revision,
                ready: pod_ready(pod),
                answers: answer.is_some(),
            })
            .collect();
        Some(upgrade::next(&UpgradeInput {
            pods: &upgrade_pods,
            replicas: statefulset
                .spec
                .as_ref()
                .and_then(|s| s.replicas)
                .unwrap_or(1)
                .max(0) as usize,
            primary: tracked.recorded.primary.as_deref(),
            fenced: read_only.filter(|r| r.fences()).map(ReadOnlyReason::words),
            switching: tracked.switchover.is_some(),
            observed,
        }))
    }

    /// Deletes a database pod still on an old template (by name, with its UID as a
    /// precondition); the StatefulSet creates it again from the current one.
    async fn replace(&self, database: &MyDatabase, pod: &Pod, why: &str, tracked: &mut Tracked) {
        let name = pod.name_any();
        let pods: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: pod.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match pods.delete(&name, &params).await {
            Ok(_) => {
                tracing::info!(database = %key(database), pod = %name, why, "replacing a pod with the new template");
                tracked.replaced = pod.uid().map(|uid| (name.clone(), uid));
                super::reconciler::publish(
                    &self.recorder,
                    database,
                    EventType::Normal,
                    "Upgrading",
                    format!("replacing {name} with the new pod template: {why}"),
                    "Upgrade",
                )
                .await;
            }
            Err(error) => {
                tracing::info!(database = %key(database), pod = %name, %error, "replacing a pod failed; trying again next round");
            }
        }
    }

    async fn label(&self, pod: &Pod, role: Role) {
        let value = builders::role_label(role);
        if pod.labels().get(LABEL_ROLE).map(String::as_str) == Some(value) {
            return;
        }
        tracing::info!(pod = %pod.name_any(), role = value, "labelling the pod with its role");
        let pods: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let patch = serde_json::json!({"metadata": {"labels": {LABEL_ROLE: value}}});
        if let Err(error) = pods
            .patch(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            tracing::info!(pod = %pod.name_any(), %error, "labelling a database pod with its role");
        }
    }
}

/// The address other clusters reach `pod` at: the value of `annotation` when one is
/// configured (None while the pod lacks it: its IP is not reachable from there), else the
/// pod IP.
pub fn external_address(pod: &Pod, annotation: Option<&str>) -> Option<String> {
    match annotation {
        Some(key) => pod
            .annotations()
            .get(key)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty()),
        None => pod_ip(pod).map(|ip| ip.to_string()),
    }
}

/// The view of one round: each instance, and the two conditions.
pub fn view(
    names: &[String],
    statuses: &[Option<InstanceStatus>],
    primary: Option<&str>,
    read_only: Option<ReadOnlyReason>,
    message: &str,
) -> InstancesView {
    let primary_index = primary.and_then(|p| names.iter().position(|n| n == p));
    let primary_lsn = primary_index
        .and_then(|i| statuses[i].as_ref())
        .and_then(|s| s.lsn.as_deref())
        .and_then(parse_lsn);
    let instances: Vec<DatabaseInstanceStatus> = names
        .iter()
        .zip(statuses)
        .enumerate()
        .map(|(i, (name, status))| match status {
            Some(status) => DatabaseInstanceStatus {
                name: name.clone(),
                role: status.role.map(|r| format!("{r:?}")),
                ready: status.ready,
                term: status.term,
                lsn: status.lsn.clone(),
                lag_bytes: (Some(i) != primary_index)
                    .then(|| {
                        let own = status.lsn.as_deref().and_then(parse_lsn)?;
                        Some(primary_lsn?.saturating_sub(own))
                    })
                    .flatten(),
                message: status.message.clone(),
            },
            None => DatabaseInstanceStatus {
                name: name.clone(),
                message: "the instance manager does not answer".into(),
                ..Default::default()
            },
        })
        .collect();

    let primary_available = match (read_only, primary_index) {
        (Some(ReadOnlyReason::ReplicaCluster), _) => ConditionParts {
            status: false,
            reason: crate::api::mydatabase::REASON_REPLICA_CLUSTER.into(),
            message: format!(
                "a replica cluster: no primary here, {}",
                primary.map_or_else(
                    || "no designated primary yet".to_string(),
                    |p| format!("{p} is the designated primary (a hot standby of the source)")
                )
            ),
        },
        (Some(reason), _) => ConditionParts {
            status: false,
            reason: "Fenced".into(),
            message: format!(
                "read-only ({}): every instance is a hot standby and refuses writes",
                reason.words()
            ),
        },
        (None, Some(i))
            if instances[i].role.as_deref() == Some("Primary") && instances[i].ready =>
        {
            ConditionParts {
                status: true,
                reason: "PrimaryReady".into(),
                message: format!("{} is the primary (term {})", names[i], instances[i].term),
            }
        }
        _ => ConditionParts {
            status: false,
            reason: "PrimaryUnavailable".into(),
            message: message.to_string(),
        },
    };

    let standbys: Vec<&DatabaseInstanceStatus> = instances
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != primary_index)
        .map(|(_, s)| s)
        .collect();
    let unhealthy: Vec<String> = standbys
        .iter()
        .filter_map(|s| {
            if s.role.is_none() {
                Some(format!("{} does not answer", s.name))
            } else if !s.ready {
                Some(format!("{} is not ready", s.name))
            } else if s.lag_bytes.is_some_and(|lag| lag > MAX_HEALTHY_LAG_BYTES) {
                Some(format!(
                    "{} is {} bytes behind",
                    s.name,
                    s.lag_bytes.unwrap_or_default()
                ))
            } else {
                None
            }
        })
        .collect();
    let replication_healthy = if standbys.is_empty() {
        ConditionParts {
            status: true,
            reason: "NoStandbys".into(),
            message: "a single instance: nothing to replicate".into(),
        }
    } else if unhealthy.is_empty() {
        ConditionParts {
            status: true,
            reason: "StandbysStreaming".into(),
            message: format!(
                "{} standbys ready, each less than {} MiB behind",
                standbys.len(),
                MAX_HEALTHY_LAG_BYTES / (1024 * 1024)
            ),
        }
    } else {
        ConditionParts {
            status: false,
            reason: "StandbysBehind".into(),
            message: unhealthy.join("; "),
        }
    };
    InstancesView {
        instances,
        primary_available,
        replication_healthy,
        endpoint: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(role: Role, lsn: &str, term: u64) -> Option<InstanceStatus> {
        Some(InstanceStatus {
            role: Some(role),
            ready: true,
            term,
            lsn: Some(lsn.into()),
            ..Default::default()
        })
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("orders-{i}")).collect()
    }

    #[test]
    fn a_streaming_database_has_its_primary_and_healthy_standbys() {
        let view = view(
            &names(3),
            &[
                status(Role::Primary, "0/3000100", 2),
                status(Role::Standby, "0/3000000", 2),
                status(Role::Standby, "0/3000100", 2),
            ],
            Some("orders-0"),
            None,
            "orders-0 is the primary (term 2)",
        );
        assert!(view.primary_available.status);
        assert_eq!(view.primary_available.reason, "PrimaryReady");
        assert!(view.replication_healthy.status, "{view:?}");
        assert_eq!(view.instances[0].lag_bytes, None, "the primary has no lag");
        assert_eq!(view.instances[1].lag_bytes, Some(0x100));
        assert_eq!(view.instances[2].lag_bytes, Some(0));
        assert_eq!(view.instances[1].role.as_deref(), Some("Standby"));
    }

    #[test]
    fn fenced_there_is_no_primary_and_the_reason_says_why() {
        let view = view(
            &names(2),
            &[
                status(Role::Standby, "0/3000100", 1),
                status(Role::Standby, "0/3000100", 1),
            ],
            Some("orders-0"),
            Some(ReadOnlyReason::HubUnreachable),
            "fenced",
        );
        assert!(!view.primary_available.status);
        assert_eq!(view.primary_available.reason, "Fenced");
        assert!(
            view.primary_available
                .message
                .contains("the hub's lease is stale")
        );
    }

    #[test]
    fn a_silent_or_far_behind_standby_is_named() {
        let view = view(
            &names(3),
            &[
                status(Role::Primary, "1/00000000", 1),
                None,
                status(Role::Standby, "0/00000000", 1),
            ],
            Some("orders-0"),
            None,
            "",
        );
        assert!(!view.replication_healthy.status);
        assert!(
            view.replication_healthy
                .message
                .contains("orders-1 does not answer")
                && view
                    .replication_healthy
                    .message
                    .contains("orders-2 is 4294967296 bytes behind"),
            "{}",
            view.replication_healthy.message
        );
        assert_eq!(
            view.instances[1].message,
            "the instance manager does not answer"
        );
    }

    #[test]
    fn a_primary_that_does_not_answer_is_unavailable_with_the_decision_in_words() {
        let view = view(
            &names(2),
            &[None, status(Role::Standby, "0/1", 1)],
            Some("orders-0"),
            None,
            "the primary orders-0 has not answered for 3s; a standby takes over after 6s",
        );
        assert!(!view.primary_available.status);
        assert_eq!(view.primary_available.reason, "PrimaryUnavailable");
        assert!(
            view.primary_available
                .message
                .contains("takes over after 6s")
        );
    }

    #[test]
    fn the_external_address_is_the_annotation_when_one_is_named_else_the_pod_ip() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "orders-0"},
            "status": {"podIP": "10.201.1.4"}
        }))
        .unwrap();
        assert_eq!(external_address(&pod, None).as_deref(), Some("10.201.1.4"));
        let key = "example.net/external-address";
        assert_eq!(
            external_address(&pod, Some(key)),
            None,
            "the pod IP is not reachable from elsewhere when the network names another"
        );
        pod.metadata.annotations = Some([(key.to_string(), "10.201.101.4".to_string())].into());
        assert_eq!(
            external_address(&pod, Some(key)).as_deref(),
            Some("10.201.101.4")
        );
    }

    #[test]
    fn a_single_instance_needs_no_replication() {
        let view = view(
            &names(1),
            &[status(Role::Primary, "0/1", 1)],
            Some("orders-0"),
            None,
            "",
        );
        assert!(view.replication_healthy.status);
        assert_eq!(view.replication_healthy.reason, "NoStandbys");
    }

    #[test]
    fn views_publish_role_changes_at_once_and_positions_at_most_every_30_s() {
        let views = Views::default();
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let one = |role: Role, lsn: &str| {
            view(
                &names(1),
                &[status(role, lsn, 1)],
                Some("orders-0"),
                None,
                "",
            )
        };
        assert!(views.set(
            "shop/orders",
            one(Role::Primary, "0/10"),
            at(0),
            POSITION_REFRESH
        ));
        assert!(
            !views.set(
                "shop/orders",
                one(Role::Primary, "0/10"),
                at(1),
                POSITION_REFRESH
            ),
            "no change"
        );
        assert!(
            !views.set(
                "shop/orders",
                one(Role::Primary, "0/20"),
                at(2),
                POSITION_REFRESH
            ),
            "a new WAL position alone waits"
        );
        assert_eq!(
            views.get("shop/orders").unwrap().instances[0]
                .lsn
                .as_deref(),
            Some("0/20"),
            "but is kept for the next status write"
        );
        assert!(
            views.set(
                "shop/orders",
                one(Role::Standby, "0/20"),
                at(3),
                POSITION_REFRESH
            ),
            "a role change is written at once"
        );
        assert!(!views.set(
            "shop/orders",
            one(Role::Standby, "0/30"),
            at(20),
            POSITION_REFRESH
        ));
        assert!(
            views.set(
                "shop/orders",
                one(Role::Standby, "0/40"),
                at(34),
                POSITION_REFRESH
            ),
            "positions 30 s after the last write"
        );
        assert!(
            views.set(
                "shop/orders",
                one(Role::Standby, "0/50"),
                at(35),
                SWITCHOVER_POSITION_REFRESH
            ),
            "every second during a switchover"
        );
        // The last position of a demoted primary arrives within the second after the
        // last write and never moves again: it is still published, a second later.
        assert!(!views.set(
            "shop/orders",
            one(Role::Standby, "0/60"),
            at(35) + Duration::from_millis(500),
            SWITCHOVER_POSITION_REFRESH
        ));
        assert!(
            views.set(
                "shop/orders",
                one(Role::Standby, "0/60"),
                at(36),
                SWITCHOVER_POSITION_REFRESH
            ),
            "a held-back position is published once the refresh has passed, moved or not"
        );
        assert!(!views.set(
            "shop/orders",
            one(Role::Standby, "0/60"),
            at(40),
            SWITCHOVER_POSITION_REFRESH
        ));
        views.retain(|_| false);
        assert!(views.get("shop/orders").is_none());
    }
}
