//! Facts about template kinds and member clusters that placement, propagation, failover
//! and `bulkhead plan` share (one place for each rule).

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::member_cluster::TAINT_UNREACHABLE;
use crate::api::{MemberCluster, is_condition_true};
use crate::hub::placement::ClusterView;

fn group(api_version: &str) -> &str {
    api_version
        .split_once('/')
        .map(|(group, _)| group)
        .unwrap_or("")
}

/// Kinds whose replicas are divided among clusters: Deployment, StatefulSet, MyDatabase.
/// Every other kind is Duplicated.
pub fn is_divisible(api_version: &str, kind: &str) -> bool {
    matches!(
        (group(api_version), kind),
        ("apps", "Deployment") | ("apps", "StatefulSet") | ("example.com", "MyDatabase")
    )
}

/// Kinds that hold data: never moved by failover, fenced instead.
pub fn is_stateful(api_version: &str, kind: &str) -> bool {
    matches!(
        (group(api_version), kind),
        ("apps", "StatefulSet") | ("example.com", "MyDatabase")
    )
}

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
    }
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
    fn divisible_and_stateful_kinds() {
        assert!(is_divisible("apps/v1", "Deployment") && !is_stateful("apps/v1", "Deployment"));
        assert!(is_divisible("apps/v1", "StatefulSet") && is_stateful("apps/v1", "StatefulSet"));
        assert!(
            is_divisible("example.com/v1", "MyDatabase")
                && is_stateful("example.com/v1", "MyDatabase")
        );
        assert!(!is_divisible("v1", "ConfigMap") && !is_stateful("v1", "ConfigMap"));
        assert!(!is_divisible("other.io/v1", "Deployment"));
    }

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
        let failed = failed(&view, jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(failed.taints.len(), 1);
        assert_eq!(failed.taints[0].effect, "NoExecute");
    }
}
