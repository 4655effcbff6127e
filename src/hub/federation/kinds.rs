//! Facts about member clusters and failover that placement, propagation and `bulkhead
//! plan` share (one place for each rule); how each template kind is read is
//! `interpreter`'s.

use k8s_openapi::api::core::v1::{Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::member_cluster::{TAINT_NOT_READY, TAINT_UNREACHABLE};
use crate::api::propagation_policy::{PropagationSpec, StatefulFailover};
use crate::api::{MemberCluster, find_condition, is_condition_true};
use crate::hub::federation::placement::capacity::FreeResources;
use crate::hub::federation::placement::{ClusterView, toleration_matches};
use crate::hub::membership::taints::{HUB_TAINT_KEYS, is_hub_taint};
use crate::hub::membership::zones::HubHealth;

/// What placement sees of a MemberCluster. A cluster without status has not been probed:
/// it counts as Ready only when `assume_ready` (offline planning from files).
pub fn cluster_view(cluster: &MemberCluster, assume_ready: bool) -> ClusterView {
    let ready = match &cluster.status {
        Some(status) if !status.conditions.is_empty() => {
            is_condition_true(&status.conditions, "Ready")
        }
        _ => assume_ready,
    };
    ClusterView {
        name: cluster.metadata.name.clone().unwrap_or_default(),
        labels: cluster.metadata.labels.clone().unwrap_or_default(),
        zone: cluster.spec.zone.clone(),
        region: cluster.spec.region.clone(),
        taints: cluster.spec.taints.clone(),
        ready,
        available_replicas: None,
        capacity: cluster
            .status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(FreeResources::from_capacity),
    }
}

/// A MemberCluster the hub refuses because another one, registered earlier, points at
/// the same cluster (`Ready=False, reason=DuplicateCluster`). Federation treats it as not
/// joined at all: no placement, no copies read or written through it.
pub fn is_refused_duplicate(cluster: &MemberCluster) -> bool {
    cluster
        .status
        .as_ref()
        .and_then(|s| find_condition(&s.conditions, "Ready"))
        .is_some_and(|c| c.status == "False" && c.reason == "DuplicateCluster")
}

/// What placement sees of a MemberCluster on the hub, where the hub's own taints must say
/// exactly what the Ready condition says. The prober writes the condition and the taint
/// in two requests, so for a moment one may lag the other; a Ready cluster's stale hub
/// taint must not evict anything, and a not-Ready cluster whose taint is not written yet
/// must not lose its replicas at once (it gets the taint, dated from the condition's
/// transition). Hub taints count from [`HubHealth::grace_start`], so every grace period
/// restarts when the hub leaves the frozen state, or from the cluster's
/// `status.failoverGraceStart` (the same moment, as stored by the hub before a restart).
pub fn hub_cluster_view(cluster: &MemberCluster, health: &HubHealth) -> ClusterView {
    let mut view = cluster_view(cluster, false);
    if view.ready {
        view.taints.retain(|t| !is_hub_taint(t));
        return view;
    }
    let has_hub_taint = view
        .taints
        .iter()
        .any(|t| is_hub_taint(t) && t.effect == "NoExecute");
    if !has_hub_taint {
        let ready = cluster
            .status
            .as_ref()
            .and_then(|s| find_condition(&s.conditions, "Ready"));
        let key = match ready.map(|c| c.reason.as_str()) {
            Some("NotReady") => TAINT_NOT_READY,
            _ => TAINT_UNREACHABLE,
        };
        view.taints.push(Taint {
            key: key.into(),
            effect: "NoExecute".into(),
            time_added: ready.map(|c| c.last_transition_time.clone()),
            value: None,
        });
    }
    // The grace start this hub knows, or the one a previous hub stored on the cluster.
    let stored = cluster
        .status
        .as_ref()
        .and_then(|s| s.failover_grace_start.as_ref())
        .map(|t| t.0);
    for taint in view.taints.iter_mut().filter(|t| is_hub_taint(t)) {
        if let Some(added) = taint.time_added.as_mut() {
            added.0 = health.grace_start(added.0);
            if let Some(stored) = stored {
                added.0 = added.0.max(stored);
            }
        }
    }
    view
}

/// The tolerations placement uses for one template: the policy's, plus failover's
/// toleration of the hub's NoExecute taints (DESIGN.md section 5):
/// - stateless kinds keep a failed cluster's replicas for
///   `failover.stateless.tolerationSeconds`, unless a policy toleration for that taint
///   says otherwise (the policy wins);
/// - stateful kinds and every kind while the hub is `frozen` tolerate the hub's taints
///   forever: they are never moved by failover.
pub fn placement_tolerations(
    policy: &PropagationSpec,
    stateful: bool,
    frozen: bool,
) -> Vec<Toleration> {
    let forever = stateful || frozen;
    let mut tolerations: Vec<Toleration> = policy
        .placement
        .cluster_tolerations
        .iter()
        .filter(|toleration| {
            !forever
                || !HUB_TAINT_KEYS
                    .iter()
                    .any(|key| tolerates_hub_taint(toleration, key))
        })
        .cloned()
        .collect();
    for key in HUB_TAINT_KEYS {
        if forever || !tolerations.iter().any(|t| tolerates_hub_taint(t, key)) {
            tolerations.push(Toleration {
                key: Some(key.to_string()),
                operator: Some("Exists".into()),
                effect: Some("NoExecute".into()),
                toleration_seconds: (!forever)
                    .then_some(policy.failover.stateless.toleration_seconds),
                value: None,
            });
        }
    }
    tolerations
}

fn tolerates_hub_taint(toleration: &Toleration, key: &str) -> bool {
    toleration_matches(
        toleration,
        &Taint {
            key: key.into(),
            effect: "NoExecute".into(),
            ..Default::default()
        },
    )
}

/// Whether the policy wants stateful placements in unreachable clusters marked fenced.
pub fn marks_fenced(policy: &PropagationSpec) -> bool {
    policy.failover.stateful == StatefulFailover::Fence
}

/// The cluster as the hub would see it once it has been unreachable since `since`: not
/// Ready, with the unreachable NoExecute taint.
pub fn failed(view: &ClusterView, since: jiff::Timestamp) -> ClusterView {
    let mut failed = view.clone();
    failed.ready = false;
    failed.taints.retain(|t| t.key != TAINT_UNREACHABLE);
    failed.taints.push(Taint {
        key: TAINT_UNREACHABLE.into(),
        effect: "NoExecute".into(),
        time_added: Some(Time(since)),
        value: None,
    });
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_from_member_clusters() {
        let mut cluster: MemberCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "MemberCluster",
            "metadata": {"name": "east", "labels": {"tier": "prod"}},
            "spec": {"secretRef": {"namespace": "bulkhead-system", "name": "member-east"}, "zone": "zone-a", "region": "region-1"}
        }))
        .unwrap();
        assert!(
            cluster_view(&cluster, true).ready,
            "unprobed counts as Ready offline"
        );
        assert!(
            !cluster_view(&cluster, false).ready,
            "unprobed is not Ready for the hub"
        );
        cluster.status = Some(serde_json::from_value(serde_json::json!({
            "conditions": [{"type": "Ready", "status": "False", "reason": "Unreachable", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        })).unwrap());
        let view = cluster_view(&cluster, true);
        assert!(!view.ready);
        assert_eq!(
            (view.zone.as_str(), view.labels["tier"].as_str()),
            ("zone-a", "prod")
        );
        let hub_view = hub_cluster_view(&cluster, &HubHealth::default());
        assert_eq!(hub_view.taints.len(), 1, "the lagging taint is synthesized");
        assert_eq!(hub_view.taints[0].key, TAINT_UNREACHABLE);
        assert_eq!(
            hub_view.taints[0].time_added.as_ref().unwrap().0,
            jiff::Timestamp::from_second(1_767_225_600).unwrap(),
            "dated from the Ready transition"
        );
        let thawed = HubHealth {
            unfrozen_at: Some(jiff::Timestamp::from_second(1_800_000_000).unwrap()),
            ..Default::default()
        };
        assert_eq!(
            hub_cluster_view(&cluster, &thawed).taints[0]
                .time_added
                .as_ref()
                .unwrap()
                .0,
            jiff::Timestamp::from_second(1_800_000_000).unwrap(),
            "grace restarts after a freeze"
        );
        // A restarted hub (no unfrozen_at in memory) reads the stored grace start.
        let mut stored = cluster.clone();
        stored.status.as_mut().unwrap().failover_grace_start =
            Some(Time(jiff::Timestamp::from_second(1_800_000_100).unwrap()));
        assert_eq!(
            hub_cluster_view(&stored, &HubHealth::default()).taints[0]
                .time_added
                .as_ref()
                .unwrap()
                .0,
            jiff::Timestamp::from_second(1_800_000_100).unwrap(),
            "the grace survives a hub restart"
        );
        let failed = failed(&view, jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(failed.taints.len(), 1);
        assert_eq!(failed.taints[0].effect, "NoExecute");
    }

    #[test]
    fn a_ready_cluster_has_no_stale_hub_taint() {
        let cluster: MemberCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "MemberCluster",
            "metadata": {"name": "east"},
            "spec": {"secretRef": {"namespace": "bulkhead-system", "name": "member-east"}, "zone": "zone-a",
                     "taints": [{"key": TAINT_UNREACHABLE, "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"},
                                {"key": "example.com/maintenance", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Healthy", "message": "", "lastTransitionTime": "2026-01-01T00:01:00Z"}]}
        }))
        .unwrap();
        let view = hub_cluster_view(&cluster, &HubHealth::default());
        assert!(view.ready);
        assert_eq!(view.taints.len(), 1);
        assert_eq!(
            view.taints[0].key, "example.com/maintenance",
            "user taints stay"
        );
    }

    fn policy(tolerations: serde_json::Value, seconds: i64) -> PropagationSpec {
        serde_json::from_value(serde_json::json!({
            "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}],
            "placement": {"clusterTolerations": tolerations},
            "failover": {"stateless": {"tolerationSeconds": seconds}}
        }))
        .unwrap()
    }

    fn seconds_for(tolerations: &[Toleration], key: &str) -> Vec<Option<i64>> {
        tolerations
            .iter()
            .filter(|t| tolerates_hub_taint(t, key))
            .map(|t| t.toleration_seconds)
            .collect()
    }

    #[test]
    fn failover_tolerates_hub_taints_for_the_policy_seconds() {
        let stateless = placement_tolerations(&policy(serde_json::json!([]), 30), false, false);
        assert_eq!(seconds_for(&stateless, TAINT_UNREACHABLE), [Some(30)]);
        assert_eq!(seconds_for(&stateless, TAINT_NOT_READY), [Some(30)]);

        let stateful = placement_tolerations(&policy(serde_json::json!([]), 30), true, false);
        assert_eq!(
            seconds_for(&stateful, TAINT_UNREACHABLE),
            [None],
            "never moved"
        );

        let frozen = placement_tolerations(&policy(serde_json::json!([]), 30), false, true);
        assert_eq!(
            seconds_for(&frozen, TAINT_UNREACHABLE),
            [None],
            "no eviction while frozen"
        );
    }

    #[test]
    fn a_policy_toleration_of_a_hub_taint_wins_for_stateless_kinds_only() {
        let own = serde_json::json!([{"key": TAINT_UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}]);
        let stateless = placement_tolerations(&policy(own.clone(), 30), false, false);
        assert_eq!(seconds_for(&stateless, TAINT_UNREACHABLE), [Some(5)]);
        assert_eq!(seconds_for(&stateless, TAINT_NOT_READY), [Some(30)]);
        let stateful = placement_tolerations(&policy(own, 30), true, false);
        assert_eq!(seconds_for(&stateful, TAINT_UNREACHABLE), [None]);
    }
}
