//! Status aggregation (DESIGN.md section 4), pure: what the hub writes into a binding and
//! its template from what it last saw of each member copy. An unreachable cluster's
//! replicas count as not ready, its row keeps `lastSeen`, and the template says
//! `Degraded=True, reason=ClusterUnreachable`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::Value;

use crate::api::mydatabase::{ClusterRole, DatabaseClusterStatus, DatabasePhase};
use crate::api::resource_binding::{ClusterPlacementStatus, PlacementHealth};
use crate::api::{ConditionStatus, MyDatabaseStatus, new_condition, set_condition};
use crate::hub::federation::replica_clusters::{lag_bytes, runs_as_replica_cluster};

/// What the hub knows about one member copy of a template.
#[derive(Clone, Debug, Default)]
pub struct CopyObservation {
    pub cluster: String,
    /// Replicas the binding gives this cluster.
    pub assigned_replicas: i32,
    /// The cluster is Ready (reachable, credentials valid) right now.
    pub reachable: bool,
    /// The copy was applied for the current decision.
    pub applied: bool,
    /// When the hub last read the copy.
    pub last_seen: Option<Time>,
    /// The copy's `.status` as last seen.
    pub status: Option<Value>,
    /// Stateful placement in an unreachable cluster under `failover.stateful: Fence`.
    pub fenced: bool,
    /// Why the copy is not applied, if known (a conflict, an apply error).
    pub message: Option<String>,
    /// The copy exists in the member, as last seen.
    pub present: bool,
    /// The kind reports ready replicas (Deployment, StatefulSet, MyDatabase); a copy of
    /// another kind (ConfigMap, Service, ...) is healthy once it is there and applied.
    pub reports_readiness: bool,
    /// For a kind whose health is a condition: whether the copy's condition says healthy.
    pub condition_healthy: Option<bool>,
    /// The override policies applied to the copy, in order.
    pub overrides: Vec<String>,
    /// An override failed for this cluster: nothing is applied there.
    pub override_failed: bool,
}

/// A count a member reports, as the hub trusts it: 0 when absent, negative or not an
/// integer, at most `i32::MAX` (a member's status is the member's to write, and a hostile
/// or broken one must not wrap a sum or panic the hub).
fn int(status: &Option<Value>, field: &str) -> i32 {
    status
        .as_ref()
        .and_then(|s| s[field].as_i64())
        .map_or(0, crate::hub::federation::propagation::count)
}

/// Ready replicas that count: none from an unreachable cluster.
fn ready(observation: &CopyObservation) -> i32 {
    if observation.reachable {
        int(&observation.status, "readyReplicas")
    } else {
        0
    }
}

/// Sums of Deployment status over the member copies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeploymentSums {
    pub replicas: i32,
    pub ready_replicas: i32,
    pub available_replicas: i32,
    pub updated_replicas: i32,
}

/// Deployment status for the hub template.
pub fn deployment_sums(observations: &[CopyObservation]) -> DeploymentSums {
    let mut sums = DeploymentSums::default();
    for observation in observations {
        let add = |sum: &mut i32, field: &str| {
            *sum = sum.saturating_add(int(&observation.status, field));
        };
        add(&mut sums.replicas, "replicas");
        if observation.reachable {
            add(&mut sums.ready_replicas, "readyReplicas");
            add(&mut sums.available_replicas, "availableReplicas");
            add(&mut sums.updated_replicas, "updatedReplicas");
        }
    }
    sums
}

fn copy_phase(observation: &CopyObservation) -> Option<DatabasePhase> {
    observation
        .status
        .as_ref()
        .and_then(|s| serde_json::from_value(s["phase"].clone()).ok())
}

fn copy_read_only(observation: &CopyObservation) -> bool {
    let status = observation.status.as_ref();
    status
        .and_then(|s| s["conditions"].as_array())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "ReadOnly" && c["status"] == "True")
        })
        || copy_phase(observation) == Some(DatabasePhase::ReadOnly)
}

/// One placement's health for the binding.
pub fn placement_health(observation: &CopyObservation) -> PlacementHealth {
    if !observation.reachable || !observation.present {
        PlacementHealth::Unknown
    } else if !observation.reports_readiness {
        if observation.applied && observation.condition_healthy != Some(false) {
            PlacementHealth::Healthy
        } else {
            PlacementHealth::Unhealthy
        }
    } else if observation.status.is_none() {
        PlacementHealth::Unknown
    } else if observation.applied && ready(observation) >= observation.assigned_replicas {
        PlacementHealth::Healthy
    } else {
        PlacementHealth::Unhealthy
    }
}

/// The binding's per-cluster rows.
pub fn binding_rows(
    observations: &[CopyObservation],
    pending_cleanup: &[String],
) -> Vec<ClusterPlacementStatus> {
    let mut rows: Vec<ClusterPlacementStatus> = observations
        .iter()
        .map(|o| ClusterPlacementStatus {
            name: o.cluster.clone(),
            applied: o.applied,
            health: placement_health(o),
            ready_replicas: ready(o),
            last_seen: o.last_seen.clone(),
            fenced: o.fenced,
            pending_cleanup: pending_cleanup.contains(&o.cluster),
            message: o.message.clone(),
            overrides: o.overrides.clone(),
            override_failed: o.override_failed,
        })
        .collect();
    for cluster in pending_cleanup {
        if !rows.iter().any(|r| &r.name == cluster) {
            rows.push(ClusterPlacementStatus {
                name: cluster.clone(),
                pending_cleanup: true,
                message: Some(
                    "removed from the placement; the copy is deleted once the cluster is reachable"
                        .into(),
                ),
                ..Default::default()
            });
        }
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

fn unreachable_message(observations: &[CopyObservation]) -> Option<String> {
    let gone: Vec<String> = observations
        .iter()
        .filter(|o| !o.reachable)
        .map(|o| match &o.last_seen {
            Some(seen) => format!("{} (last seen {})", o.cluster, seen.0),
            None => format!("{} (never seen)", o.cluster),
        })
        .collect();
    (!gone.is_empty()).then(|| {
        format!(
            "unreachable: {}; their replicas count as not ready",
            gone.join(", ")
        )
    })
}

/// Sets the template conditions every kind shares: Degraded (ClusterUnreachable or
/// ReplicasNotReady) and Ready.
pub fn template_conditions(
    conditions: &mut Vec<Condition>,
    observations: &[CopyObservation],
    desired: i32,
    ready_total: i32,
    generation: Option<i64>,
) {
    let (degraded, reason, message) = match unreachable_message(observations) {
        Some(message) => (true, "ClusterUnreachable", message),
        None if ready_total < desired && observations.iter().all(|o| o.applied) => (
            true,
            "ReplicasNotReady",
            format!("{ready_total} of {desired} replicas ready across clusters"),
        ),
        None => (
            false,
            "AsExpected",
            format!("{ready_total} of {desired} replicas ready across clusters"),
        ),
    };
    set_condition(
        conditions,
        new_condition(
            "Degraded",
            ConditionStatus::from_bool(degraded),
            reason,
            message,
            generation,
        ),
    );
    let all_ready = !observations.is_empty() && ready_total >= desired;
    set_condition(
        conditions,
        new_condition(
            "Ready",
            ConditionStatus::from_bool(all_ready),
            if all_ready {
                "AllReplicasReady"
            } else {
                "ReplicasNotReady"
            },
            format!("{ready_total} of {desired} replicas ready across clusters"),
            generation,
        ),
    );
}

/// The binding's own conditions from its rows: Propagated (every placement applied),
/// Healthy (every placement Healthy) and Degraded (ClusterUnreachable while a placed
/// cluster cannot be reached), keeping transition times of unchanged conditions.
/// The Propagated reason while a stateful template's placement change waits for a
/// partition to heal.
pub const WAITING_FOR_PARTITION: &str = "WaitingForPartition";

/// The Propagated reason while an override fails on the template for a placed cluster
/// (nothing is applied there; the row says which policy, rule and path).
pub const OVERRIDE_FAILED: &str = "OverrideFailed";

/// `waiting_for` names the not-Ready clusters a stateful template's placement change
/// waits for (the partition freeze): `Propagated=False, reason=WaitingForPartition`.
pub fn binding_conditions(
    conditions: &mut Vec<Condition>,
    observations: &[CopyObservation],
    rows: &[ClusterPlacementStatus],
    waiting_for: &[String],
    generation: Option<i64>,
) {
    let placed: Vec<&ClusterPlacementStatus> = rows
        .iter()
        .filter(|r| observations.iter().any(|o| o.cluster == r.name))
        .collect();
    let not_applied: Vec<String> = placed
        .iter()
        .filter(|r| !r.applied)
        .map(|r| match &r.message {
            Some(message) => format!("{}: {message}", r.name),
            None => r.name.clone(),
        })
        .collect();
    let conflict = placed.iter().any(|r| {
        !r.applied
            && r.message
                .as_deref()
                .is_some_and(|m| m.contains("not managed by Bulkhead"))
    });
    let (propagated, reason, message) = if !waiting_for.is_empty() {
        (
            false,
            WAITING_FOR_PARTITION,
            format!(
                "the placement change waits: {} not Ready, and no copy of a stateful template is deleted or shrunk while a cluster of its placement is not Ready; it completes once {} Ready again",
                waiting_for.join(", "),
                if waiting_for.len() == 1 {
                    "it is"
                } else {
                    "they are"
                }
            ),
        )
    } else if placed.is_empty() {
        (false, "NoPlacement", "no cluster is placed".to_string())
    } else if not_applied.is_empty() {
        (
            true,
            "Applied",
            format!("applied to {} cluster(s)", placed.len()),
        )
    } else if conflict {
        (false, "Conflict", not_applied.join("; "))
    } else if placed.iter().any(|r| r.override_failed) {
        (false, OVERRIDE_FAILED, not_applied.join("; "))
    } else {
        (false, "Pending", not_applied.join("; "))
    };
    set_condition(
        conditions,
        new_condition(
            "Propagated",
            ConditionStatus::from_bool(propagated),
            reason,
            message,
            generation,
        ),
    );
    let unhealthy: Vec<String> = placed
        .iter()
        .filter(|r| r.health != PlacementHealth::Healthy)
        .map(|r| format!("{} {:?} ({} ready)", r.name, r.health, r.ready_replicas))
        .collect();
    let healthy = !placed.is_empty() && unhealthy.is_empty();
    set_condition(
        conditions,
        new_condition(
            "Healthy",
            ConditionStatus::from_bool(healthy),
            if healthy {
                "AllPlacementsHealthy"
            } else {
                "PlacementsNotHealthy"
            },
            if healthy {
                "every placement is applied and ready".to_string()
            } else {
                unhealthy.join(", ")
            },
            generation,
        ),
    );
    let (degraded, reason, message) = match unreachable_message(observations) {
        Some(message) => (true, "ClusterUnreachable", message),
        None => (
            false,
            "AsExpected",
            "every placed cluster is reachable".to_string(),
        ),
    };
    set_condition(
        conditions,
        new_condition(
            "Degraded",
            ConditionStatus::from_bool(degraded),
            reason,
            message,
            generation,
        ),
    );
}

/// Keeps each row's `lastSeen` from `previous` unless the row changed while its cluster
/// was reachable, when it becomes `now`. So `lastSeen` moves only with writes the row
/// needs anyway, and freezes while the cluster is unreachable.
pub fn stamp_last_seen(
    rows: &mut [ClusterPlacementStatus],
    previous: &[ClusterPlacementStatus],
    reachable: impl Fn(&str) -> bool,
    now: &Time,
) {
    for row in rows.iter_mut() {
        let before = previous.iter().find(|p| p.name == row.name);
        row.last_seen = before.and_then(|p| p.last_seen.clone());
        if !reachable(&row.name) || row.pending_cleanup && row.health == PlacementHealth::Unknown {
            continue;
        }
        let changed = before.is_none_or(|p| {
            let mut p = p.clone();
            p.last_seen = row.last_seen.clone();
            &p != row
        });
        if changed || row.last_seen.is_none() {
            row.last_seen = Some(now.clone());
        }
    }
}

/// The status the hub writes into a Deployment or StatefulSet template: the sums, the
/// template's generation, and Degraded/Ready in the apps condition shape.
pub fn workload_status(
    previous: &Value,
    observations: &[CopyObservation],
    desired: i32,
    generation: Option<i64>,
) -> Value {
    let sums = deployment_sums(observations);
    let mut conditions: Vec<Condition> = previous["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| serde_json::from_value(c.clone()).ok())
        .collect();
    template_conditions(
        &mut conditions,
        observations,
        desired,
        sums.ready_replicas,
        generation,
    );
    let conditions: Vec<Value> = conditions
        .iter()
        .map(|c| {
            serde_json::json!({
                "type": c.type_, "status": c.status, "reason": c.reason, "message": c.message,
                "lastTransitionTime": c.last_transition_time, "lastUpdateTime": c.last_transition_time,
            })
        })
        .collect();
    let mut status = serde_json::json!({
        "replicas": sums.replicas,
        "readyReplicas": sums.ready_replicas,
        "availableReplicas": sums.available_replicas,
        "updatedReplicas": sums.updated_replicas,
        "conditions": conditions,
    });
    if let Some(generation) = generation {
        status["observedGeneration"] = generation.into();
    }
    status
}

/// The hub MyDatabase template's status: one row per placement, sums, phase and
/// conditions (keeping the previous conditions' transition times).
pub fn mydatabase_status(
    previous: Option<&MyDatabaseStatus>,
    observations: &[CopyObservation],
    desired: i32,
    generation: Option<i64>,
    deleting: bool,
    primary_cluster: Option<&str>,
) -> MyDatabaseStatus {
    let primary_status = primary_cluster
        .and_then(|primary| observations.iter().find(|o| o.cluster == primary))
        .and_then(|o| o.status.as_ref());
    // A replica cluster is one whose agent says so: a copy the hub could not make one (a
    // cluster holding a database of its own) is not, whatever the hub wants.
    let role = |o: &CopyObservation| match primary_cluster {
        Some(primary) if primary == o.cluster => Some(ClusterRole::Primary),
        Some(_) if o.status.as_ref().is_some_and(runs_as_replica_cluster) => {
            Some(ClusterRole::Replica)
        }
        _ => None,
    };
    let clusters: Vec<DatabaseClusterStatus> = {
        let mut rows: Vec<DatabaseClusterStatus> = observations
            .iter()
            .map(|o| DatabaseClusterStatus {
                role: role(o),
                lag_bytes: match (role(o), primary_status, o.status.as_ref()) {
                    (Some(ClusterRole::Replica), Some(primary), Some(replica)) => {
                        lag_bytes(primary, replica)
                    }
                    _ => None,
                },
                name: o.cluster.clone(),
                replicas: o.assigned_replicas,
                ready_replicas: ready(o),
                // A fenced placement serves read-only even though we cannot see it.
                read_only: copy_read_only(o) || o.fenced,
                fenced: o.fenced,
                phase: copy_phase(o),
                last_seen: o.last_seen.clone(),
            })
            .collect();
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        rows
    };
    let replicas: i32 = observations
        .iter()
        .map(|o| int(&o.status, "replicas"))
        .fold(0, i32::saturating_add);
    let ready_total: i32 = clusters
        .iter()
        .map(|c| c.ready_replicas)
        .fold(0, i32::saturating_add);
    // Reported once every reachable copy reports it (an agent of an earlier version
    // does not): a partial sum would read as replicas still on the old version.
    let updated_replicas = observations
        .iter()
        .filter(|o| o.reachable)
        .map(|o| {
            o.status
                .as_ref()
                .and_then(|s| s["updatedReplicas"].as_i64())
        })
        .try_fold(0_i32, |sum, n| {
            n.map(|n| sum.saturating_add(crate::hub::federation::propagation::count(n)))
        });
    let mut conditions = previous.map(|p| p.conditions.clone()).unwrap_or_default();
    template_conditions(
        &mut conditions,
        observations,
        desired,
        ready_total,
        generation,
    );
    // With replica clusters only the primary cluster takes writes: the replicas are
    // read-only by design, not a loss of writes.
    let writable: Vec<&DatabaseClusterStatus> = clusters
        .iter()
        .filter(|c| c.role != Some(ClusterRole::Replica))
        .collect();
    let read_only: Vec<&str> = writable
        .iter()
        .filter(|c| c.read_only)
        .map(|c| c.name.as_str())
        .collect();
    let replicas_named: Vec<&str> = clusters
        .iter()
        .filter(|c| c.role == Some(ClusterRole::Replica))
        .map(|c| c.name.as_str())
        .collect();
    let (read_only_status, read_only_reason, read_only_message) = if read_only.is_empty() {
        (
            false,
            "ReadWrite",
            match primary_cluster {
                Some(primary) if !replicas_named.is_empty() => format!(
                    "writes go to the primary cluster {primary}; {} serve reads as replica clusters",
                    replicas_named.join(", ")
                ),
                _ => "every placement accepts writes".to_string(),
            },
        )
    } else if writable.iter().any(|c| c.fenced) {
        (
            true,
            "Fenced",
            format!(
                "read-only in {} (fenced while the hub cannot reach them)",
                read_only.join(", ")
            ),
        )
    } else {
        (
            true,
            "ReadOnlyPlacements",
            format!("read-only in {}", read_only.join(", ")),
        )
    };
    set_condition(
        &mut conditions,
        new_condition(
            "ReadOnly",
            ConditionStatus::from_bool(read_only_status),
            read_only_reason,
            read_only_message,
            generation,
        ),
    );
    let unreachable = observations.iter().any(|o| !o.reachable);
    let phase = if deleting {
        DatabasePhase::Deleting
    } else if observations.is_empty() {
        DatabasePhase::Pending
    } else if unreachable
        || clusters
            .iter()
            .any(|c| c.phase == Some(DatabasePhase::Degraded))
    {
        DatabasePhase::Degraded
    } else if !read_only.is_empty() && read_only.len() == writable.len() {
        DatabasePhase::ReadOnly
    } else if ready_total >= desired {
        DatabasePhase::Ready
    } else {
        DatabasePhase::Provisioning
    };
    MyDatabaseStatus {
        observed_generation: generation,
        phase: Some(phase),
        primary_cluster: primary_cluster.map(str::to_string),
        replicas,
        ready_replicas: ready_total,
        updated_replicas,
        conditions,
        clusters,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::find_condition;
    use serde_json::json;

    fn seen(seconds: i64) -> Option<Time> {
        Some(Time(
            jiff::Timestamp::from_second(1_800_000_000 + seconds).unwrap(),
        ))
    }

    fn copy(cluster: &str, assigned: i32, status: Value, reachable: bool) -> CopyObservation {
        CopyObservation {
            cluster: cluster.into(),
            assigned_replicas: assigned,
            reachable,
            applied: true,
            last_seen: seen(0),
            status: Some(status),
            fenced: false,
            message: None,
            present: true,
            reports_readiness: true,
            ..Default::default()
        }
    }

    #[test]
    fn deployment_sums_count_unreachable_replicas_as_not_ready() {
        let observations = [
            copy(
                "east",
                4,
                json!({"replicas": 4, "readyReplicas": 4, "availableReplicas": 4, "updatedReplicas": 4}),
                true,
            ),
            copy(
                "west",
                2,
                json!({"replicas": 2, "readyReplicas": 2, "availableReplicas": 2, "updatedReplicas": 2}),
                false,
            ),
        ];
        assert_eq!(
            deployment_sums(&observations),
            DeploymentSums {
                replicas: 6,
                ready_replicas: 4,
                available_replicas: 4,
                updated_replicas: 4
            }
        );
    }

    #[test]
    fn hostile_counts_neither_wrap_nor_panic() {
        let huge = json!({"replicas": i64::MAX, "readyReplicas": 4_000_000_000_i64,
                          "availableReplicas": -7, "updatedReplicas": "many"});
        let observations = [
            copy("east", 1, huge.clone(), true),
            copy("west", 1, huge, true),
        ];
        assert_eq!(
            deployment_sums(&observations),
            DeploymentSums {
                replicas: i32::MAX,
                ready_replicas: i32::MAX,
                available_replicas: 0,
                updated_replicas: 0
            }
        );
    }

    #[test]
    fn binding_rows_say_health_and_pending_cleanup() {
        let observations = [
            copy("east", 4, json!({"readyReplicas": 4}), true),
            copy("west", 2, json!({"readyReplicas": 1}), true),
            copy("north", 2, json!({"readyReplicas": 2}), false),
        ];
        let rows = binding_rows(&observations, &["south".to_string()]);
        let health: Vec<(&str, PlacementHealth, i32, bool)> = rows
            .iter()
            .map(|r| {
                (
                    r.name.as_str(),
                    r.health,
                    r.ready_replicas,
                    r.pending_cleanup,
                )
            })
            .collect();
        assert_eq!(
            health,
            [
                ("east", PlacementHealth::Healthy, 4, false),
                ("north", PlacementHealth::Unknown, 0, false),
                ("south", PlacementHealth::Unknown, 0, true),
                ("west", PlacementHealth::Unhealthy, 1, false),
            ]
        );
    }

    #[test]
    fn mydatabase_ready_across_clusters() {
        let observations = [
            copy(
                "east",
                4,
                json!({"replicas": 4, "readyReplicas": 4, "phase": "Ready"}),
                true,
            ),
            copy(
                "west",
                2,
                json!({"replicas": 2, "readyReplicas": 2, "phase": "Ready"}),
                true,
            ),
        ];
        let status = mydatabase_status(None, &observations, 6, Some(1), false, None);
        assert_eq!(status.phase, Some(DatabasePhase::Ready));
        assert_eq!((status.replicas, status.ready_replicas), (6, 6));
        assert_eq!(status.clusters.len(), 2);
        assert_eq!(
            status.updated_replicas, None,
            "agents that do not report it"
        );
        let mut upgrading = observations.clone();
        upgrading[0].status.as_mut().unwrap()["updatedReplicas"] = json!(3);
        upgrading[1].status.as_mut().unwrap()["updatedReplicas"] = json!(2);
        let status = mydatabase_status(None, &upgrading, 6, Some(1), false, None);
        assert_eq!(status.updated_replicas, Some(5));
        assert_eq!(
            find_condition(&status.conditions, "Degraded")
                .unwrap()
                .status,
            "False"
        );
        assert_eq!(
            find_condition(&status.conditions, "Ready").unwrap().status,
            "True"
        );
    }

    /// Replica clusters: each row says its role and how far behind it is; the replicas'
    /// read-only state is by design, so the database is ReadWrite while the primary
    /// cluster takes writes, and ReadOnly when it does not.
    #[test]
    fn replica_clusters_show_roles_and_lag_and_only_the_primary_decides_read_only() {
        let replica_status = |lsn: &str| {
            json!({"replicas": 1, "readyReplicas": 1, "phase": "ReadOnly", "primary": "orders-0",
                   "conditions": [{"type": "ReadOnly", "status": "True", "reason": "ReplicaCluster",
                                   "message": "", "lastTransitionTime": "2027-01-01T00:00:00Z"}],
                   "instances": [{"name": "orders-0", "lsn": lsn}]})
        };
        let observations = [
            copy(
                "east",
                1,
                json!({"replicas": 1, "readyReplicas": 1, "phase": "Ready", "primary": "orders-0",
                       "instances": [{"name": "orders-0", "lsn": "0/3000100"}]}),
                true,
            ),
            copy("west", 1, replica_status("0/3000000"), true),
            copy("north", 1, replica_status("0/3000100"), true),
        ];
        let status = mydatabase_status(None, &observations, 3, Some(1), false, Some("east"));
        assert_eq!(status.primary_cluster.as_deref(), Some("east"));
        let rows: Vec<(&str, Option<ClusterRole>, Option<u64>)> = status
            .clusters
            .iter()
            .map(|c| (c.name.as_str(), c.role, c.lag_bytes))
            .collect();
        assert_eq!(
            rows,
            [
                ("east", Some(ClusterRole::Primary), None),
                ("north", Some(ClusterRole::Replica), Some(0)),
                ("west", Some(ClusterRole::Replica), Some(0x100)),
            ]
        );
        let read_only = find_condition(&status.conditions, "ReadOnly").unwrap();
        assert_eq!(read_only.status, "False");
        assert!(
            read_only.message.contains("primary cluster east")
                && read_only.message.contains("north, west"),
            "{}",
            read_only.message
        );
        assert_eq!(status.phase, Some(DatabasePhase::Ready));

        let mut fenced = observations.clone();
        fenced[0].status.as_mut().unwrap()["phase"] = json!("ReadOnly");
        let status = mydatabase_status(None, &fenced, 3, Some(1), false, Some("east"));
        let read_only = find_condition(&status.conditions, "ReadOnly").unwrap();
        assert_eq!(
            (read_only.status.as_str(), read_only.message.as_str()),
            ("True", "read-only in east")
        );
        assert_eq!(status.phase, Some(DatabasePhase::ReadOnly));

        // A copy the hub could not make a replica cluster (it holds a database of its
        // own) is no replica, and takes writes.
        let mut refused = observations.clone();
        refused[1].status = Some(json!({"replicas": 1, "readyReplicas": 1, "phase": "Ready"}));
        let status = mydatabase_status(None, &refused, 3, Some(1), false, Some("east"));
        let west = status.clusters.iter().find(|c| c.name == "west").unwrap();
        assert_eq!((west.role, west.lag_bytes), (None, None));
        let read_only = find_condition(&status.conditions, "ReadOnly").unwrap();
        assert!(!read_only.message.contains("west"), "{}", read_only.message);

        let independent = mydatabase_status(None, &observations, 3, Some(1), false, None);
        assert!(
            independent
                .clusters
                .iter()
                .all(|c| c.role.is_none() && c.lag_bytes.is_none())
        );
        assert_eq!(independent.primary_cluster, None);
    }

    #[test]
    fn an_unreachable_fenced_placement_degrades_the_template_and_keeps_last_seen() {
        let mut east = copy(
            "east",
            4,
            json!({"replicas": 4, "readyReplicas": 4, "phase": "Ready"}),
            false,
        );
        east.fenced = true;
        east.last_seen = seen(42);
        let observations = [
            east,
            copy(
                "west",
                2,
                json!({"replicas": 2, "readyReplicas": 2, "phase": "Ready"}),
                true,
            ),
        ];
        let status = mydatabase_status(None, &observations, 6, Some(1), false, None);
        assert_eq!(status.phase, Some(DatabasePhase::Degraded));
        assert_eq!(
            status.ready_replicas, 2,
            "east's replicas count as not ready"
        );
        let degraded = find_condition(&status.conditions, "Degraded").unwrap();
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "ClusterUnreachable")
        );
        assert!(
            degraded.message.contains("east (last seen"),
            "{}",
            degraded.message
        );
        let east_row = status.clusters.iter().find(|c| c.name == "east").unwrap();
        assert!(east_row.fenced && east_row.read_only);
        assert_eq!(east_row.last_seen, seen(42));
        assert_eq!(
            find_condition(&status.conditions, "ReadOnly")
                .unwrap()
                .reason,
            "Fenced"
        );
    }

    #[test]
    fn nothing_placed_is_pending_and_deleting_wins() {
        assert_eq!(
            mydatabase_status(None, &[], 3, None, false, None).phase,
            Some(DatabasePhase::Pending)
        );
        assert_eq!(
            mydatabase_status(None, &[], 3, None, true, None).phase,
            Some(DatabasePhase::Deleting)
        );
    }

    #[test]
    fn recomputing_keeps_transition_times() {
        let observations = [copy(
            "east",
            2,
            json!({"replicas": 2, "readyReplicas": 2, "phase": "Ready"}),
            true,
        )];
        let first = mydatabase_status(None, &observations, 2, Some(1), false, None);
        let second = mydatabase_status(Some(&first), &observations, 2, Some(1), false, None);
        assert_eq!(first, second, "no change, no write");
    }

    #[test]
    fn copies_without_readiness_are_healthy_once_applied() {
        let mut config = copy("east", 1, json!({}), true);
        config.status = None;
        config.reports_readiness = false;
        assert_eq!(placement_health(&config), PlacementHealth::Healthy);
        config.applied = false;
        assert_eq!(placement_health(&config), PlacementHealth::Unhealthy);
        config.present = false;
        assert_eq!(placement_health(&config), PlacementHealth::Unknown);
    }

    #[test]
    fn binding_conditions_follow_the_rows() {
        let observations = vec![
            copy("east", 2, json!({"readyReplicas": 2}), true),
            copy("west", 2, json!({"readyReplicas": 1}), true),
        ];
        let rows = binding_rows(&observations, &[]);
        let mut conditions = vec![];
        binding_conditions(&mut conditions, &observations, &rows, &[], Some(1));
        let status = |t: &str| find_condition(&conditions, t).unwrap().status.clone();
        assert_eq!(
            (status("Propagated"), status("Healthy"), status("Degraded")),
            ("True".into(), "False".into(), "False".into())
        );

        let mut cut = observations.clone();
        cut[0].reachable = false;
        cut[1].applied = false;
        cut[1].message = Some(
            "Deployment shop/web already exists in west and is not managed by Bulkhead".into(),
        );
        let rows = binding_rows(&cut, &[]);
        binding_conditions(&mut conditions, &cut, &rows, &[], Some(1));
        let propagated = find_condition(&conditions, "Propagated").unwrap();
        assert_eq!(
            (propagated.status.as_str(), propagated.reason.as_str()),
            ("False", "Conflict")
        );
        let degraded = find_condition(&conditions, "Degraded").unwrap();
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "ClusterUnreachable")
        );

        // An override that fails for one cluster: Propagated=False(OverrideFailed), the
        // row says it and lists no override; the other row lists its overrides.
        let mut failing = observations.clone();
        failing[0].overrides = vec!["ClusterOverridePolicy/mirror".into()];
        failing[1].applied = false;
        failing[1].override_failed = true;
        failing[1].message = Some("override failed: OverridePolicy/shop/p ...".into());
        let rows = binding_rows(&failing, &[]);
        assert_eq!(rows[0].overrides, ["ClusterOverridePolicy/mirror"]);
        assert!(rows[1].override_failed && rows[1].overrides.is_empty());
        binding_conditions(&mut conditions, &failing, &rows, &[], Some(1));
        let propagated = find_condition(&conditions, "Propagated").unwrap();
        assert_eq!(
            (propagated.status.as_str(), propagated.reason.as_str()),
            ("False", OVERRIDE_FAILED)
        );
        assert!(
            propagated
                .message
                .starts_with("west: override failed: OverridePolicy/shop/p"),
            "{}",
            propagated.message
        );
    }

    #[test]
    fn last_seen_moves_only_with_a_changed_row_of_a_reachable_cluster() {
        let observations = vec![copy("east", 2, json!({"readyReplicas": 2}), true)];
        let mut previous = binding_rows(&observations, &[]);
        previous[0].last_seen = seen(0);
        let now = seen(60).unwrap();
        let mut same = binding_rows(&observations, &[]);
        stamp_last_seen(&mut same, &previous, |_| true, &now);
        assert_eq!(same[0].last_seen, seen(0), "unchanged row, no write");

        let changed_obs = vec![copy("east", 2, json!({"readyReplicas": 1}), true)];
        let mut changed = binding_rows(&changed_obs, &[]);
        stamp_last_seen(&mut changed, &previous, |_| true, &now);
        assert_eq!(changed[0].last_seen, seen(60));

        let cut_obs = vec![copy("east", 2, json!({"readyReplicas": 2}), false)];
        let mut cut = binding_rows(&cut_obs, &[]);
        stamp_last_seen(&mut cut, &previous, |_| false, &now);
        assert_eq!(cut[0].last_seen, seen(0), "frozen while unreachable");
    }

    #[test]
    fn workload_status_sums_and_says_degraded() {
        let observations = vec![
            copy(
                "east",
                3,
                json!({"replicas": 3, "readyReplicas": 3, "availableReplicas": 3, "updatedReplicas": 3}),
                true,
            ),
            copy(
                "west",
                3,
                json!({"replicas": 3, "readyReplicas": 3, "availableReplicas": 3, "updatedReplicas": 3}),
                false,
            ),
        ];
        let status = workload_status(&Value::Null, &observations, 6, Some(4));
        assert_eq!(status["replicas"], 6);
        assert_eq!(status["readyReplicas"], 3);
        assert_eq!(status["observedGeneration"], 4);
        let degraded = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Degraded")
            .unwrap();
        assert_eq!(
            (degraded["status"].as_str(), degraded["reason"].as_str()),
            (Some("True"), Some("ClusterUnreachable"))
        );
        assert!(
            degraded.get("observedGeneration").is_none(),
            "apps condition shape"
        );
    }
}
