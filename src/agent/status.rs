//! A MyDatabase's status, computed as a pure function of what the agent observed.

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt;

use super::builders::ReadOnlyReason;
use super::instances::InstancesView;
use crate::api::mydatabase::DatabasePhase;
use crate::api::{ConditionStatus, MyDatabase, MyDatabaseStatus, new_condition, set_condition};

/// What the reconciler saw, as input to [`compute_status`].
pub struct Observed<'a> {
    pub database: &'a MyDatabase,
    /// The StatefulSet, after this reconcile applied it (None when it does not exist).
    pub statefulset: Option<&'a StatefulSet>,
    pub read_only: Option<ReadOnlyReason>,
    /// Set when a storage change was refused, with the message for the user.
    pub storage_refused: Option<&'a str>,
    pub deleting: bool,
    /// What the instance loop saw of the instances (None before its first round).
    pub instances: Option<&'a InstancesView>,
}

/// Replica counts from a StatefulSet's status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaCounts {
    pub desired: i32,
    pub current: i32,
    pub ready: i32,
    pub updated: i32,
    /// The StatefulSet controller has seen the latest spec.
    pub observed_latest: bool,
}

fn replica_counts(desired: i32, statefulset: Option<&StatefulSet>) -> ReplicaCounts {
    let Some(statefulset) = statefulset else {
        return ReplicaCounts {
            desired,
            ..Default::default()
        };
    };
    let status = statefulset.status.clone().unwrap_or_default();
    let generation = statefulset.metadata.generation;
    let updated_to_current =
        status.update_revision.is_none() || status.current_revision == status.update_revision;
    ReplicaCounts {
        desired,
        current: status.replicas,
        ready: status.ready_replicas.unwrap_or(0),
        updated: if updated_to_current {
            status.updated_replicas.unwrap_or(status.replicas)
        } else {
            status.updated_replicas.unwrap_or(0)
        },
        observed_latest: status.observed_generation.is_some()
            && status.observed_generation == generation,
    }
}

/// Computes the new status from the previous one (to keep condition transition times).
pub fn compute_status(observed: &Observed) -> MyDatabaseStatus {
    let database = observed.database;
    let generation = database.metadata.generation;
    let previous = database.status.clone().unwrap_or_default();
    let counts = replica_counts(database.spec.replicas, observed.statefulset);
    let mut conditions = previous.conditions.clone();

    let settled = observed.statefulset.is_some()
        && counts.observed_latest
        && counts.current == counts.desired
        && counts.updated == counts.desired;
    let all_ready = settled && counts.ready == counts.desired;

    let (progressing, progressing_reason, progressing_message) = if observed.statefulset.is_none() {
        (true, "Creating", "creating the StatefulSet".to_string())
    } else if !counts.observed_latest {
        (
            true,
            "Updating",
            "the StatefulSet controller has not seen the latest spec yet".to_string(),
        )
    } else if counts.current != counts.desired {
        let reason = if counts.current < counts.desired {
            "ScalingUp"
        } else {
            "ScalingDown"
        };
        let held = super::builders::statefulset_replicas(database);
        let message = if held > database.spec.replicas {
            format!(
                "{} of {} replicas exist; the scale-down keeps {}-{} until the primary is switched over to an instance it keeps",
                counts.current,
                counts.desired,
                database.name_any(),
                held - 1
            )
        } else {
            format!("{} of {} replicas exist", counts.current, counts.desired)
        };
        (true, reason, message)
    } else if counts.updated != counts.desired {
        (
            true,
            "RollingUpdate",
            format!(
                "{} of {} replicas run the new version",
                counts.updated, counts.desired
            ),
        )
    } else if counts.ready != counts.desired {
        (
            true,
            "WaitingForReady",
            format!("{} of {} replicas ready", counts.ready, counts.desired),
        )
    } else {
        (
            false,
            "Stable",
            "every replica runs the current spec".to_string(),
        )
    };
    set_condition(
        &mut conditions,
        new_condition(
            "Progressing",
            ConditionStatus::from_bool(progressing),
            progressing_reason,
            progressing_message,
            generation,
        ),
    );

    let ready_message = format!("{} of {} replicas ready", counts.ready, counts.desired);
    let (ready_status, ready_reason) = if all_ready {
        (true, "AllReplicasReady")
    } else {
        (false, "ReplicasNotReady")
    };
    set_condition(
        &mut conditions,
        new_condition(
            "Ready",
            ConditionStatus::from_bool(ready_status),
            ready_reason,
            ready_message,
            generation,
        ),
    );

    let (read_only_status, read_only_reason, read_only_message) = match observed.read_only {
        Some(ReadOnlyReason::HubUnreachable) => (
            true,
            "HubUnreachable",
            if database.spec.read_only {
                "the hub's lease is stale, so the agent fenced the database (spec.readOnly is also set)".to_string()
            } else {
                "the hub's lease is stale, so the agent fenced the database; writes resume when the hub is back".to_string()
            },
        ),
        Some(ReadOnlyReason::Requested) => (true, "Requested", "spec.readOnly is true".to_string()),
        Some(ReadOnlyReason::Deposed) => (
            true,
            "Deposed",
            format!(
                "{}: the hub's lease says so; writes go to the cluster the hub promoted",
                ReadOnlyReason::Deposed.words()
            ),
        ),
        Some(ReadOnlyReason::ReplicaCluster) => (
            true,
            crate::api::mydatabase::REASON_REPLICA_CLUSTER,
            super::builders::replica_source(database).map_or_else(String::new, |source| {
                format!(
                    "a replica cluster: it streams from {}:{} and serves reads; writes go to the source's cluster",
                    source.host, source.port
                )
            }),
        ),
        None => (
            false,
            "ReadWrite",
            "the database accepts writes".to_string(),
        ),
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

    // Degraded: a refused change, or replicas missing once nothing is in progress.
    let (degraded, degraded_reason, degraded_message) =
        if let Some(message) = observed.storage_refused {
            (true, "StorageChangeRefused", message.to_string())
        } else if settled && counts.ready < counts.desired {
            (
                true,
                "ReplicasUnavailable",
                format!("only {} of {} replicas ready", counts.ready, counts.desired),
            )
        } else {
            (
                false,
                "AsExpected",
                "no refused change and no missing replica".to_string(),
            )
        };
    set_condition(
        &mut conditions,
        new_condition(
            "Degraded",
            ConditionStatus::from_bool(degraded),
            degraded_reason,
            degraded_message,
            generation,
        ),
    );

    if let Some(view) = observed.instances {
        for (type_, parts) in [
            ("PrimaryAvailable", &view.primary_available),
            ("ReplicationHealthy", &view.replication_healthy),
        ] {
            set_condition(
                &mut conditions,
                new_condition(
                    type_,
                    ConditionStatus::from_bool(parts.status),
                    &parts.reason,
                    parts.message.clone(),
                    generation,
                ),
            );
        }
    }

    let phase = if observed.deleting {
        DatabasePhase::Deleting
    } else if observed.read_only.is_some() {
        DatabasePhase::ReadOnly
    } else if degraded {
        DatabasePhase::Degraded
    } else if all_ready {
        DatabasePhase::Ready
    } else if observed.statefulset.is_some() {
        DatabasePhase::Provisioning
    } else {
        DatabasePhase::Pending
    };

    MyDatabaseStatus {
        observed_generation: generation,
        phase: Some(phase),
        // Recorded by the hub on its template, never in a member.
        primary_cluster: None,
        aborted_switchover: None,
        primary_term: None,
        switchover: None,
        promotion: None,
        replicas: counts.current,
        ready_replicas: counts.ready,
        // Before the StatefulSet controller has seen the spec just applied, its counts are
        // the previous version's: none of them runs this one yet.
        updated_replicas: observed.statefulset.map(|_| {
            if counts.observed_latest {
                counts.updated
            } else {
                0
            }
        }),
        conditions,
        clusters: previous.clusters,
        // The instance loop's record, kept as read (`report` never writes these back).
        primary: previous.primary,
        term: previous.term,
        endpoint: observed
            .instances
            .map_or(previous.endpoint, |v| v.endpoint.clone()),
        instances: observed
            .instances
            .map(|v| v.instances.clone())
            .unwrap_or(previous.instances),
    }
}

/// Whether two statuses differ in anything a reader would notice (condition timestamps
/// of unchanged conditions are kept by `set_condition`, so plain equality works).
pub fn status_changed(old: Option<&MyDatabaseStatus>, new: &MyDatabaseStatus) -> bool {
    old != Some(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MyDatabaseSpec, find_condition};
    use k8s_openapi::api::apps::v1::StatefulSetStatus;

    fn database(replicas: i32) -> MyDatabase {
        let mut db = MyDatabase::new(
            "orders",
            MyDatabaseSpec {
                replicas,
                ..Default::default()
            },
        );
        db.metadata.generation = Some(2);
        db
    }

    fn statefulset(replicas: i32, ready: i32, updated: i32, observed: i64) -> StatefulSet {
        let mut sts = StatefulSet::default();
        sts.metadata.generation = Some(4);
        sts.status = Some(StatefulSetStatus {
            replicas,
            ready_replicas: Some(ready),
            updated_replicas: Some(updated),
            observed_generation: Some(observed),
            current_revision: Some("r1".into()),
            update_revision: Some(if updated == replicas { "r1" } else { "r2" }.into()),
            ..Default::default()
        });
        sts
    }

    fn observe(
        db: &MyDatabase,
        sts: Option<&StatefulSet>,
        read_only: Option<ReadOnlyReason>,
    ) -> MyDatabaseStatus {
        compute_status(&Observed {
            database: db,
            statefulset: sts,
            read_only,
            storage_refused: None,
            deleting: false,
            instances: None,
        })
    }

    fn reason(status: &MyDatabaseStatus, type_: &str) -> (String, String) {
        let c = find_condition(&status.conditions, type_).unwrap();
        (c.status.clone(), c.reason.clone())
    }

    #[test]
    fn pending_without_statefulset() {
        let status = observe(&database(3), None, None);
        assert_eq!(status.phase, Some(DatabasePhase::Pending));
        assert_eq!(
            reason(&status, "Progressing"),
            ("True".into(), "Creating".into())
        );
        assert_eq!(
            reason(&status, "Ready"),
            ("False".into(), "ReplicasNotReady".into())
        );
        assert_eq!(status.observed_generation, Some(2));
    }

    #[test]
    fn provisioning_while_scaling_up() {
        let sts = statefulset(1, 1, 1, 4);
        let status = observe(&database(3), Some(&sts), None);
        assert_eq!(status.phase, Some(DatabasePhase::Provisioning));
        assert_eq!(
            reason(&status, "Progressing"),
            ("True".into(), "ScalingUp".into())
        );
        assert_eq!(status.replicas, 1);
        assert_eq!(status.ready_replicas, 1);
    }

    #[test]
    fn ready_when_every_replica_is_ready_and_current() {
        let sts = statefulset(3, 3, 3, 4);
        let status = observe(&database(3), Some(&sts), None);
        assert_eq!(status.phase, Some(DatabasePhase::Ready));
        assert_eq!(
            reason(&status, "Ready"),
            ("True".into(), "AllReplicasReady".into())
        );
        assert_eq!(
            reason(&status, "Progressing"),
            ("False".into(), "Stable".into())
        );
        assert_eq!(
            reason(&status, "ReadOnly"),
            ("False".into(), "ReadWrite".into())
        );
        assert_eq!(
            reason(&status, "Degraded"),
            ("False".into(), "AsExpected".into())
        );
    }

    #[test]
    fn rolling_update_is_progressing() {
        let sts = statefulset(3, 3, 1, 4);
        let status = observe(&database(3), Some(&sts), None);
        assert_eq!(
            reason(&status, "Progressing"),
            ("True".into(), "RollingUpdate".into())
        );
        assert_eq!(status.phase, Some(DatabasePhase::Provisioning));
        assert_eq!(status.updated_replicas, Some(1), "what a rollout waits on");
        let done = observe(&database(3), Some(&statefulset(3, 3, 3, 4)), None);
        assert_eq!(done.updated_replicas, Some(3));
    }

    #[test]
    fn stale_statefulset_status_is_not_ready() {
        let sts = statefulset(3, 3, 3, 3);
        let status = observe(&database(3), Some(&sts), None);
        assert_eq!(
            reason(&status, "Progressing"),
            ("True".into(), "Updating".into())
        );
        assert_eq!(reason(&status, "Ready").0, "False");
        assert_eq!(
            status.updated_replicas,
            Some(0),
            "the counts are the previous spec's"
        );
        assert_eq!(observe(&database(3), None, None).updated_replicas, None);
    }

    #[test]
    fn missing_replicas_once_settled_are_degraded() {
        let sts = statefulset(3, 2, 3, 4);
        let status = observe(&database(3), Some(&sts), None);
        // All exist and are current, one is not ready: still waiting, and degraded.
        assert_eq!(
            reason(&status, "Degraded"),
            ("True".into(), "ReplicasUnavailable".into())
        );
        assert_eq!(status.phase, Some(DatabasePhase::Degraded));
    }

    #[test]
    fn read_only_phase_and_reasons() {
        let sts = statefulset(3, 3, 3, 4);
        let fenced = observe(
            &database(3),
            Some(&sts),
            Some(ReadOnlyReason::HubUnreachable),
        );
        assert_eq!(fenced.phase, Some(DatabasePhase::ReadOnly));
        assert_eq!(
            reason(&fenced, "ReadOnly"),
            ("True".into(), "HubUnreachable".into())
        );
        // Readiness is independent of read-only: every replica still serves reads.
        assert_eq!(reason(&fenced, "Ready").0, "True");
        let requested = observe(&database(3), Some(&sts), Some(ReadOnlyReason::Requested));
        assert_eq!(
            reason(&requested, "ReadOnly"),
            ("True".into(), "Requested".into())
        );
    }

    #[test]
    fn refused_storage_change_is_degraded_with_the_message() {
        let db = database(3);
        let sts = statefulset(3, 3, 3, 4);
        let status = compute_status(&Observed {
            database: &db,
            statefulset: Some(&sts),
            read_only: None,
            storage_refused: Some("spec.storage asks for 2Gi"),
            deleting: false,
            instances: None,
        });
        assert_eq!(
            reason(&status, "Degraded"),
            ("True".into(), "StorageChangeRefused".into())
        );
        assert_eq!(status.phase, Some(DatabasePhase::Degraded));
    }

    #[test]
    fn deleting_wins() {
        let db = database(3);
        let status = compute_status(&Observed {
            database: &db,
            statefulset: None,
            read_only: Some(ReadOnlyReason::HubUnreachable),
            storage_refused: None,
            deleting: true,
            instances: None,
        });
        assert_eq!(status.phase, Some(DatabasePhase::Deleting));
    }

    #[test]
    fn recomputing_an_unchanged_state_is_no_change() {
        let sts = statefulset(3, 3, 3, 4);
        let mut db = database(3);
        let first = observe(&db, Some(&sts), None);
        db.status = Some(first.clone());
        let second = observe(&db, Some(&sts), None);
        assert!(
            !status_changed(Some(&first), &second),
            "no write when nothing changed"
        );
    }
}
