//! The health prober: one task per member probes `GET /readyz` every
//! `spec.probe.intervalSeconds`, feeds the [`HealthTracker`], and reports the verdict:
//! conditions, taints, version and capacity in the MemberCluster, the shared
//! [`HealthBoard`] the zone controller reads, metrics and Events.
//!
//! Every hub replica probes (a standby's verdicts are warm when it takes over); only the
//! leader writes status and taints and publishes Events. A standby follows the status the
//! leader recorded, so on taking over it writes only what its own verdict changes.
//!
//! Status is written only when something a reader would notice changed (conditions,
//! version, capacity). `lastProbeTime` alone is refreshed at most every
//! [`PROBE_TIME_REFRESH`], so a steady member costs two status writes a minute, not one
//! per probe.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::member_cluster::ClusterCapacity;
use crate::api::{MemberCluster, set_condition};
use crate::hub::membership::capacity;
use crate::hub::membership::health::{
    CONDITION_READY, FailureKind, Health, HealthTracker, ProbeOutcome, Thresholds, conditions_for,
    health_from_conditions, wanted_taint,
};
use crate::hub::membership::members::{MemberHandle, MemberSnapshot, Registry};
use crate::hub::membership::metrics::{ClusterLabels, HubMetrics, ProbeLabels};
use crate::hub::membership::taints::reconcile_taints;

/// The field manager the hub's health writes use.
pub const FIELD_MANAGER: &str = "bulkhead-hub";
/// How often `lastProbeTime` is refreshed when nothing else changed.
pub const PROBE_TIME_REFRESH: Duration = Duration::from_secs(30);

/// One member's verdict as the zone controller sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct BoardEntry {
    pub zone: String,
    pub health: Health,
}

/// Every member's current verdict, shared between the probers and the zone controller.
#[derive(Clone)]
pub struct HealthBoard {
    entries: Arc<Mutex<HashMap<String, BoardEntry>>>,
    changed: watch::Sender<u64>,
}

impl Default for HealthBoard {
    fn default() -> Self {
        HealthBoard {
            entries: Arc::default(),
            changed: watch::Sender::new(0),
        }
    }
}

impl HealthBoard {
    /// Records a verdict; wakes subscribers when it changed.
    pub fn set(&self, name: &str, entry: BoardEntry) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.get(name) != Some(&entry) {
            entries.insert(name.to_string(), entry);
            drop(entries);
            self.changed.send_modify(|g| *g += 1);
        }
    }

    /// Forgets a member that left.
    pub fn remove(&self, name: &str) {
        let removed = self
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name)
            .is_some();
        if removed {
            self.changed.send_modify(|g| *g += 1);
        }
    }

    /// A copy of every verdict.
    pub fn entries(&self) -> HashMap<String, BoardEntry> {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Wakes on every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// What every prober shares.
#[derive(Clone)]
pub struct ProberContext {
    pub hub: Client,
    pub registry: Registry,
    pub board: HealthBoard,
    pub metrics: HubMetrics,
    pub recorder: Recorder,
    /// How often version and capacity are refreshed while the member is healthy.
    pub capacity_interval: Duration,
    /// Member name -> the UID of its kube-system namespace (the cluster's identity), as
    /// each prober last read it.
    pub cluster_ids: Arc<Mutex<HashMap<String, String>>>,
    /// Only the leader writes.
    pub leadership: crate::leader::Leadership,
    /// Every probe's outcome is recorded here (one failure makes a member suspect for
    /// stateful purposes at once).
    pub evidence: crate::hub::membership::evidence::Evidence,
}

/// The condition that says whether the hub verifies the member's TLS certificate.
pub const CONDITION_TLS_VERIFIED: &str = "TLSVerified";

/// `TLSVerified`: False while the MemberCluster accepts an unverified server.
pub fn tls_condition(member: &MemberCluster, generation: Option<i64>) -> Condition {
    if member.spec.insecure_skip_tls_verify {
        crate::api::new_condition(
            CONDITION_TLS_VERIFIED,
            crate::api::ConditionStatus::False,
            "InsecureSkipTLSVerify",
            "spec.insecureSkipTLSVerify is true: the hub does not verify the member's certificate and sends its token to whoever answers at the address",
            generation,
        )
    } else {
        crate::api::new_condition(
            CONDITION_TLS_VERIFIED,
            crate::api::ConditionStatus::True,
            "Verified",
            "the hub verifies the member's certificate against the CA in its kubeconfig",
            generation,
        )
    }
}

/// Reads the member's identity: the UID of its kube-system namespace.
async fn read_cluster_id(client: &Client, timeout: Duration) -> Option<String> {
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    match tokio::time::timeout(timeout, namespaces.get("kube-system")).await {
        Ok(Ok(namespace)) => namespace.metadata.uid,
        Ok(Err(error)) => {
            tracing::debug!(%error, "cannot read the member's kube-system namespace");
            None
        }
        Err(_) => None,
    }
}

/// The member registered before `name` that points at the same cluster, if any. The
/// older MemberCluster (creationTimestamp, then name) keeps the cluster; a later one is
/// refused, whichever prober reads the identity first.
pub fn duplicate_of(
    name: &str,
    id: &str,
    ids: &HashMap<String, String>,
    snapshot: &MemberSnapshot,
) -> Option<String> {
    let rank = |member: &str| {
        snapshot.get(member).map(|h| {
            (
                h.object.metadata.creation_timestamp.as_ref().map(|t| t.0),
                member.to_string(),
            )
        })
    };
    let mine = rank(name)?;
    ids.iter()
        .filter(|(other, other_id)| other.as_str() != name && other_id.as_str() == id)
        .filter_map(|(other, _)| rank(other).map(|r| (r, other)))
        .filter(|(r, _)| *r < mine)
        .min()
        .map(|(_, other)| other.clone())
}

/// Probes `/readyz` once, within `timeout`.
pub async fn probe_readyz(client: &Client, timeout: Duration) -> ProbeOutcome {
    let request = http::Request::get("/readyz")
        .body(kube::client::Body::empty())
        .expect("a static request is valid");
    match tokio::time::timeout(timeout, client.send(request)).await {
        Err(_) => ProbeOutcome::Failed {
            kind: FailureKind::Unreachable,
            message: format!("/readyz did not answer within {timeout:?}"),
        },
        Ok(Err(error)) => ProbeOutcome::Failed {
            kind: FailureKind::Unreachable,
            message: format!("/readyz failed: {error}"),
        },
        Ok(Ok(response)) => classify_status(response.status().as_u16()),
    }
}

/// The outcome an HTTP status of `/readyz` means.
pub fn classify_status(status: u16) -> ProbeOutcome {
    match status {
        200 => ProbeOutcome::Healthy,
        401 | 403 => ProbeOutcome::Failed {
            kind: FailureKind::CredentialsInvalid,
            message: format!("/readyz answered {status}: the hub's credentials are rejected"),
        },
        _ => ProbeOutcome::Failed {
            kind: FailureKind::NotReady,
            message: format!("/readyz answered {status}"),
        },
    }
}

fn result_label(outcome: &ProbeOutcome) -> &'static str {
    match outcome {
        ProbeOutcome::Healthy => "healthy",
        ProbeOutcome::Failed { kind, .. } => match kind {
            FailureKind::Unreachable => "unreachable",
            FailureKind::NotReady => "not_ready",
            FailureKind::CredentialsInvalid => "credentials_invalid",
            FailureKind::DuplicateCluster => "duplicate_cluster",
        },
    }
}

/// What the prober last wrote (or found) in the status.
#[derive(Clone, Debug, Default, PartialEq)]
struct HealthStatus {
    conditions: Vec<Condition>,
    kubernetes_version: Option<String>,
    capacity: Option<ClusterCapacity>,
}

/// Reads version and capacity from a healthy member.
async fn read_inventory(
    client: &Client,
    timeout: Duration,
) -> (Option<String>, Option<ClusterCapacity>) {
    let version = tokio::time::timeout(timeout, client.apiserver_version())
        .await
        .ok()
        .and_then(|r| r.ok())
        .map(|info| info.git_version);
    let lists = async {
        let nodes = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await?;
        let pods = active_pods(client).await?;
        Ok::<_, kube::Error>(capacity::summarize(&nodes.items, &pods))
    };
    let capacity = match tokio::time::timeout(timeout, lists).await {
        Ok(Ok(capacity)) => Some(capacity),
        Ok(Err(error)) => {
            tracing::debug!(%error, "cannot read member capacity");
            None
        }
        Err(_) => None,
    };
    (version, capacity)
}

/// Pods per page of the capacity list: a page's text and parse are what the hub holds
/// at once, whatever the member runs.
const PODS_PER_PAGE: u32 = 250;

/// The member's pods that are not finished, page by page, as what capacity reads of them.
async fn active_pods(client: &Client) -> Result<Vec<capacity::PodRequests>, kube::Error> {
    let mut pods = vec![];
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default()
            .fields("status.phase!=Succeeded,status.phase!=Failed")
            .limit(PODS_PER_PAGE);
        if let Some(token) = &token {
            params = params.continue_token(token);
        }
        let request = kube::core::Request::new("/api/v1/pods")
            .list(&params)
            .map_err(kube::Error::BuildRequest)?;
        let page: capacity::PodRequestsPage = client.request(request).await?;
        pods.extend(page.items);
        match page.metadata.continue_token.filter(|t| !t.is_empty()) {
            Some(next) => token = Some(next),
            None => return Ok(pods),
        }
    }
}

/// Probes one member until it leaves the registry or `cancel` fires.
pub async fn probe_member(context: ProberContext, name: String, cancel: CancellationToken) {
    let Some(first) = context.registry.get(&name) else {
        return;
    };
    let recorded = first.object.status.clone().unwrap_or_default();
    let mut tracker = HealthTracker::new(health_from_conditions(&recorded.conditions));
    let ours = |c: &Condition| {
        c.type_ == CONDITION_READY || c.type_ == "Reachable" || c.type_ == CONDITION_TLS_VERIFIED
    };
    let recorded_health =
        |recorded: &crate::api::member_cluster::MemberClusterStatus| HealthStatus {
            conditions: recorded
                .conditions
                .iter()
                .filter(|c| ours(c))
                .cloned()
                .collect(),
            kubernetes_version: recorded.kubernetes_version.clone(),
            capacity: recorded.capacity.clone(),
        };
    let mut written = recorded_health(&recorded);
    let mut last_probe_written = recorded.last_probe_time.as_ref().map(|t| t.0);
    let mut desired = written.clone();
    let mut last_inventory: Option<Instant> = None;
    let mut cluster_id: Option<String> = None;
    let labels = ClusterLabels {
        cluster: name.clone(),
    };

    loop {
        let started = Instant::now();
        let Some(handle) = context.registry.get(&name) else {
            break;
        };
        let probe = &handle.probe;
        let timeout = Duration::from_secs(probe.timeout_seconds.max(1) as u64);
        let interval = Duration::from_secs(probe.interval_seconds.max(1) as u64);

        let changed = match &handle.connection {
            Err(reason) => {
                context.evidence.probed(&name, false);
                tracker.force(Health::Unhealthy {
                    kind: FailureKind::CredentialsInvalid,
                    message: reason.clone(),
                })
            }
            Ok(connection) => {
                if (cluster_id.is_none()
                    || last_inventory.is_none_or(|t| t.elapsed() >= context.capacity_interval))
                    && let Some(id) = read_cluster_id(&connection.control, timeout).await
                {
                    context
                        .cluster_ids
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(name.clone(), id.clone());
                    cluster_id = Some(id);
                }
                let original = cluster_id.as_ref().and_then(|id| {
                    let ids = context
                        .cluster_ids
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    duplicate_of(&name, id, &ids, &context.registry.snapshot())
                });
                if let Some(original) = original {
                    context.evidence.probed(&name, false);
                    tracker.force(Health::Unhealthy {
                        kind: FailureKind::DuplicateCluster,
                        message: format!(
                            "points at the same cluster as member {original} (kube-system uid {}); the hub refuses it: unjoin one of the two",
                            cluster_id.as_deref().unwrap_or_default()
                        ),
                    })
                } else {
                    let outcome = probe_readyz(&connection.control, timeout).await;
                    context
                        .metrics
                        .probe_duration
                        .get_or_create(&ProbeLabels {
                            cluster: name.clone(),
                            result: result_label(&outcome).to_string(),
                        })
                        .observe(started.elapsed().as_secs_f64());
                    tracing::trace!(member = %name, ?outcome, "probed");
                    context
                        .evidence
                        .probed(&name, matches!(outcome, ProbeOutcome::Healthy));
                    tracker.observe(outcome, Thresholds::from(probe))
                }
            }
        };
        let health = tracker.health().clone();
        context.board.set(
            &name,
            BoardEntry {
                zone: handle.zone.clone(),
                health: health.clone(),
            },
        );
        context
            .metrics
            .member_ready
            .get_or_create(&labels)
            .set(i64::from(health.is_healthy()));
        let leading = context.leadership.is_leader();
        if changed && leading {
            report_transition(&context, &handle, &health).await;
        }

        if let (true, Some(client)) = (health.is_healthy(), handle.client())
            && last_inventory.is_none_or(|t| t.elapsed() >= context.capacity_interval)
        {
            let (version, capacity) =
                read_inventory(client, timeout.max(Duration::from_secs(5))).await;
            last_inventory = Some(Instant::now());
            if version.is_some() {
                desired.kubernetes_version = version;
            }
            if capacity.is_some() {
                desired.capacity = capacity;
            }
        }

        if !leading {
            // What the leader recorded is what is written; this replica's verdict goes on
            // top of it below, so a takeover writes only what differs.
            let recorded = handle.object.status.clone().unwrap_or_default();
            written = recorded_health(&recorded);
            last_probe_written = recorded.last_probe_time.as_ref().map(|t| t.0);
            desired.conditions = written.conditions.clone();
        }
        for condition in conditions_for(&health, handle.object.metadata.generation) {
            set_condition(&mut desired.conditions, condition);
        }
        set_condition(
            &mut desired.conditions,
            tls_condition(&handle.object, handle.object.metadata.generation),
        );
        let now = jiff::Timestamp::now();
        let refresh_due = last_probe_written
            .is_none_or(|t| now.duration_since(t).unsigned_abs() >= PROBE_TIME_REFRESH);
        if leading && (desired != written || refresh_due) {
            match write_status(&context, &handle, &desired, now).await {
                Ok(()) => {
                    written = desired.clone();
                    last_probe_written = Some(now);
                    context.metrics.status_writes.get_or_create(&labels).inc();
                }
                Err(error) => {
                    tracing::warn!(member = %name, %error, "cannot write MemberCluster status")
                }
            }
        }
        let taints = if leading {
            ensure_taints(&context.hub, &handle, &health).await
        } else {
            Ok(())
        };
        match taints {
            Ok(()) => {}
            // Someone changed the MemberCluster between our read and write; the next probe
            // recomputes from the new version.
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::debug!(member = %name, "taint update conflicted; retrying at the next probe");
            }
            Err(error) => {
                tracing::warn!(member = %name, %error, "cannot update the member's hub taints")
            }
        }

        let next = tokio::time::Instant::from_std(started + interval);
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep_until(next) => {}
        }
    }
    context.board.remove(&name);
    context.evidence.remove(&name);
    context
        .cluster_ids
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&name);
    context.metrics.forget_member(&name);
}

async fn report_transition(context: &ProberContext, handle: &MemberHandle, health: &Health) {
    let (type_, reason, note) = match health {
        Health::Healthy => (
            EventType::Normal,
            "Healthy",
            "the member answers /readyz with 200".to_string(),
        ),
        Health::Unknown => (
            EventType::Normal,
            "Probing",
            "probing the member".to_string(),
        ),
        Health::Unhealthy { kind, message } => (EventType::Warning, kind.reason(), message.clone()),
    };
    tracing::info!(member = %handle.name, reason, %note, "member health changed");
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: "Probe".to_string(),
        secondary: None,
    };
    if let Err(error) = context
        .recorder
        .publish(&event, &handle.object.object_ref(&()))
        .await
    {
        tracing::warn!(member = %handle.name, %error, "cannot publish an Event");
    }
}

async fn write_status(
    context: &ProberContext,
    handle: &MemberHandle,
    desired: &HealthStatus,
    now: jiff::Timestamp,
) -> Result<(), kube::Error> {
    let transition = desired
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_READY)
        .map(|c| c.last_transition_time.clone());
    let body = serde_json::json!({
        "apiVersion": "federation.example.com/v1alpha1",
        "kind": "MemberCluster",
        "metadata": {"name": handle.name},
        "status": {
            "conditions": desired.conditions,
            "kubernetesVersion": desired.kubernetes_version,
            "lastProbeTime": Time(now),
            "lastTransitionTime": transition,
            "capacity": desired.capacity,
        }
    });
    let body = strip_nulls(body);
    Api::<MemberCluster>::all(context.hub.clone())
        .patch_status(
            &handle.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map(|_| ())
}

/// Server-side apply treats `null` as "set to null"; absent fields are what we mean.
fn strip_nulls(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => serde_json::Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        other => other,
    }
}

/// Adds or removes the hub taint the verdict calls for, keeping user taints. The patch
/// carries the resourceVersion it was computed from, so a concurrent user edit makes it
/// fail (and the next probe retries) instead of being overwritten.
async fn ensure_taints(
    hub: &Client,
    handle: &MemberHandle,
    health: &Health,
) -> Result<(), kube::Error> {
    if *health == Health::Unknown {
        return Ok(());
    }
    let wanted = wanted_taint(health);
    let now = Time(jiff::Timestamp::now());
    if reconcile_taints(&handle.object.spec.taints, wanted, now.clone()).is_none() {
        return Ok(());
    }
    let api = Api::<MemberCluster>::all(hub.clone());
    let fresh = api.get(&handle.name).await?;
    let Some(taints) = reconcile_taints(&fresh.spec.taints, wanted, now) else {
        return Ok(());
    };
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": fresh.metadata.resource_version},
        "spec": {"taints": taints},
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    };
    api.patch(&handle.name, &params, &Patch::Merge(&patch))
        .await?;
    tracing::info!(member = %handle.name, ?wanted, "updated the member's hub taints");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(name: &str, created: i64) -> MemberHandle {
        let object: MemberCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "MemberCluster",
            "metadata": {"name": name, "creationTimestamp": Time(jiff::Timestamp::from_second(created).unwrap())},
            "spec": {"secretRef": {"namespace": "bulkhead-system", "name": format!("member-{name}")}, "zone": "zone-a"}
        }))
        .unwrap();
        MemberHandle {
            name: name.into(),
            zone: "zone-a".into(),
            region: None,
            probe: object.spec.probe.clone(),
            object: Arc::new(object),
            connection: Err("not needed".into()),
        }
    }

    #[test]
    fn the_later_of_two_members_on_one_cluster_is_the_duplicate() {
        let snapshot: MemberSnapshot = Arc::new(HashMap::from([
            ("east".to_string(), handle("east", 1_000)),
            ("east-again".to_string(), handle("east-again", 2_000)),
            ("west".to_string(), handle("west", 500)),
        ]));
        let ids = HashMap::from([
            ("east".to_string(), "uid-a".to_string()),
            ("east-again".to_string(), "uid-a".to_string()),
            ("west".to_string(), "uid-b".to_string()),
        ]);
        assert_eq!(
            duplicate_of("east-again", "uid-a", &ids, &snapshot).as_deref(),
            Some("east")
        );
        assert_eq!(
            duplicate_of("east", "uid-a", &ids, &snapshot),
            None,
            "the original keeps it"
        );
        assert_eq!(duplicate_of("west", "uid-b", &ids, &snapshot), None);
        // The original is unjoined: the other one is no longer a duplicate.
        let alone: MemberSnapshot = Arc::new(HashMap::from([(
            "east-again".to_string(),
            handle("east-again", 2_000),
        )]));
        assert_eq!(duplicate_of("east-again", "uid-a", &ids, &alone), None);
    }

    #[test]
    fn http_statuses_map_to_reasons() {
        assert_eq!(classify_status(200), ProbeOutcome::Healthy);
        assert!(matches!(
            classify_status(401),
            ProbeOutcome::Failed {
                kind: FailureKind::CredentialsInvalid,
                ..
            }
        ));
        assert!(matches!(
            classify_status(403),
            ProbeOutcome::Failed {
                kind: FailureKind::CredentialsInvalid,
                ..
            }
        ));
        assert!(matches!(
            classify_status(500),
            ProbeOutcome::Failed {
                kind: FailureKind::NotReady,
                ..
            }
        ));
    }

    use kube::client::Body;

    /// Probes a mocked API server that answers `status`, or never answers.
    async fn probe_with(status: Option<u16>) -> ProbeOutcome {
        let (service, mut handle) =
            tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let client = Client::new(service, "default");
        let server = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.expect("one request");
            assert_eq!(request.uri().path(), "/readyz");
            match status {
                Some(status) => respond.send_response(
                    http::Response::builder()
                        .status(status)
                        .body(Body::from(b"ok".to_vec()))
                        .unwrap(),
                ),
                // Hold the request open, as a partitioned connection does.
                None => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    drop(respond);
                }
            }
        });
        let outcome = probe_readyz(&client, Duration::from_millis(200)).await;
        server.abort();
        outcome
    }

    #[tokio::test]
    async fn probes_classify_what_the_api_server_does() {
        assert_eq!(probe_with(Some(200)).await, ProbeOutcome::Healthy);
        assert!(matches!(
            probe_with(Some(500)).await,
            ProbeOutcome::Failed {
                kind: FailureKind::NotReady,
                ..
            }
        ));
        assert!(matches!(
            probe_with(Some(401)).await,
            ProbeOutcome::Failed {
                kind: FailureKind::CredentialsInvalid,
                ..
            }
        ));
        let started = Instant::now();
        assert!(matches!(
            probe_with(None).await,
            ProbeOutcome::Failed {
                kind: FailureKind::Unreachable,
                ..
            }
        ));
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "bounded by the probe timeout"
        );
    }

    #[test]
    fn nulls_are_left_out_of_applied_status() {
        let body = strip_nulls(serde_json::json!({"status": {"a": null, "b": 1}}));
        assert_eq!(body, serde_json::json!({"status": {"b": 1}}));
    }

    #[test]
    fn the_board_wakes_only_on_change() {
        let board = HealthBoard::default();
        let mut changes = board.subscribe();
        let entry = BoardEntry {
            zone: "zone-a".into(),
            health: Health::Healthy,
        };
        board.set("east", entry.clone());
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        board.set("east", entry);
        assert!(!changes.has_changed().unwrap());
        board.remove("east");
        assert!(changes.has_changed().unwrap());
    }
}
