//! Capacity estimates for `dynamicWeight: AvailableReplicas` and `Divided/Aggregated`:
//! how many more replicas of one template a member can fit, from the member's free
//! resources (allocatable minus requested, summed over its Ready, schedulable nodes, as
//! the hub's prober records them in `MemberCluster.status.capacity`) and the template's
//! per-replica requests. Pure code; docs/capacity.md has the rules and a worked example.
//!
//! The estimate is a sum over nodes, not a bin packing: a member with ten nodes that each
//! have 1 free core counts 3 replicas of a 3-core pod although none fits on one node. It
//! is a weight and an Aggregated fill order, and the member's own scheduler still has
//! the last word (a replica that does not fit stays Pending there).

use std::borrow::Cow;

use serde_json::Value;

use super::ClusterView;
use crate::api::member_cluster::ClusterCapacity;
use crate::api::propagation_policy::{DivisionPreference, Placement, ReplicaSchedulingType};
use crate::hub::membership::capacity::parse_quantity;

/// What a member has free: allocatable minus requested, per resource; `None` when the
/// member does not report that resource (no limit from it). Never negative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreeResources {
    pub cpu_millis: Option<i64>,
    pub memory_bytes: Option<i64>,
    pub pods: Option<i64>,
}

impl FreeResources {
    /// From the prober's summary; `None` when it reports none of cpu, memory or pods.
    pub fn from_capacity(capacity: &ClusterCapacity) -> Option<FreeResources> {
        let free = |resource: &str, scale: f64| -> Option<i64> {
            let allocatable = parse_quantity(&capacity.allocatable.get(resource)?.0)?;
            let requested = capacity
                .requested
                .get(resource)
                .and_then(|q| parse_quantity(&q.0))
                .unwrap_or(0.0);
            Some((((allocatable - requested) * scale).floor() as i64).max(0))
        };
        let resources = FreeResources {
            cpu_millis: free("cpu", 1000.0),
            memory_bytes: free("memory", 1.0),
            pods: free("pods", 1.0),
        };
        (resources != FreeResources::default()).then_some(resources)
    }
}

/// What one replica of a template requests. Every replica is one pod.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaRequests {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
}

/// The per-replica requests of a template (its JSON object):
/// - a pod template (`spec.template.spec`, as in Deployment and StatefulSet): the sum of
///   its containers' requests, or the largest init container's when that is larger (the
///   Kubernetes rule for a pod's effective request);
/// - otherwise `spec.resources` (one container per replica, as in MyDatabase);
/// - a container without a request for a resource but with a limit requests the limit
///   (what the API server defaults).
///
/// A template that requests nothing gets zero requests: its replicas are counted by pods
/// alone.
pub fn replica_requests(template: &Value) -> ReplicaRequests {
    let spec = &template["spec"];
    let pod = &spec["template"]["spec"];
    let resources_of = |containers: &Value| -> Vec<ReplicaRequests> {
        containers
            .as_array()
            .map(|list| {
                list.iter()
                    .map(|c| container_requests(&c["resources"]))
                    .collect()
            })
            .unwrap_or_default()
    };
    if pod.is_object() {
        let containers = resources_of(&pod["containers"]);
        let sum = containers
            .iter()
            .fold(ReplicaRequests::default(), |sum, c| ReplicaRequests {
                cpu_millis: sum.cpu_millis.saturating_add(c.cpu_millis),
                memory_bytes: sum.memory_bytes.saturating_add(c.memory_bytes),
            });
        resources_of(&pod["initContainers"])
            .iter()
            .fold(sum, |most, c| ReplicaRequests {
                cpu_millis: most.cpu_millis.max(c.cpu_millis),
                memory_bytes: most.memory_bytes.max(c.memory_bytes),
            })
    } else {
        container_requests(&spec["resources"])
    }
}

/// One container's `resources`: requests, falling back to limits per resource.
fn container_requests(resources: &Value) -> ReplicaRequests {
    let amount = |resource: &str, scale: f64| -> i64 {
        let text = resources["requests"][resource]
            .as_str()
            .or_else(|| resources["limits"][resource].as_str());
        // A number without quotes (`cpu: 1`) is a quantity too.
        let number = resources["requests"][resource]
            .as_f64()
            .or_else(|| resources["limits"][resource].as_f64());
        let value = text.and_then(parse_quantity).or(number).unwrap_or(0.0);
        ((value * scale).ceil() as i64).max(0)
    };
    ReplicaRequests {
        cpu_millis: amount("cpu", 1000.0),
        memory_bytes: amount("memory", 1.0),
    }
}

/// How many replicas with `per_replica` requests fit in `free`: the smallest of what the
/// free cpu, memory and pods allow, counting only the resources the replica requests and
/// the member reports. `None` when nothing limits it (no resource known).
pub fn available_replicas(free: &FreeResources, per_replica: &ReplicaRequests) -> Option<i64> {
    let by = |free: Option<i64>, request: i64| match free {
        Some(free) if request > 0 => Some(free / request),
        _ => None,
    };
    [
        free.pods,
        by(free.cpu_millis, per_replica.cpu_millis),
        by(free.memory_bytes, per_replica.memory_bytes),
    ]
    .into_iter()
    .flatten()
    .min()
}

/// Whether the placement uses capacity: Divided with `dynamicWeight`, or Aggregated.
pub fn uses_capacity(placement: &Placement) -> bool {
    placement.replica_scheduling.as_ref().is_some_and(|s| {
        s.type_ == ReplicaSchedulingType::Divided
            && (s.division_preference == Some(DivisionPreference::Aggregated)
                || s.weight_preference
                    .as_ref()
                    .is_some_and(|w| w.dynamic_weight.is_some()))
    })
}

/// The views with `available_replicas` estimated for `template` when the placement uses
/// capacity, less `not_running(cluster)`: the replicas the template holds there that do
/// not run yet (pending pods request nothing of the member's free capacity, so counting
/// them as held room would overcommit the cluster). Only Ready clusters are adjusted.
/// When a member reports it; borrowed unchanged otherwise (no copy for the
/// common, static placements). A view without a capacity summary keeps what it has
/// (unknown: the static weight stands in, Aggregated counts it as unlimited).
pub fn with_estimates<'v>(
    views: &'v [ClusterView],
    placement: &Placement,
    template: &Value,
    not_running: &dyn Fn(&str) -> i64,
) -> Cow<'v, [ClusterView]> {
    if !uses_capacity(placement) || views.iter().all(|v| v.capacity.is_none()) {
        return Cow::Borrowed(views);
    }
    let per_replica = replica_requests(template);
    Cow::Owned(
        views
            .iter()
            .map(|view| {
                let mut view = view.clone();
                if let Some(free) = &view.capacity {
                    view.available_replicas = available_replicas(free, &per_replica)
                        .map(|available| {
                            // Placement adds the replicas a cluster holds to its room;
                            // the held replicas still pending use none of its free
                            // capacity, so they are not room.
                            if view.ready {
                                available - not_running(&view.name)
                            } else {
                                available
                            }
                        })
                        .or(view.available_replicas);
                }
                view
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn capacity(allocatable: &[(&str, &str)], requested: &[(&str, &str)]) -> ClusterCapacity {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, Quantity> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect()
        };
        ClusterCapacity {
            allocatable: map(allocatable),
            requested: map(requested),
            nodes: 1,
        }
    }

    fn deployment(containers: Value, init: Value) -> Value {
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {"replicas": 3, "template": {"spec": {"containers": containers, "initContainers": init}}}
        })
    }

    #[test]
    fn free_is_allocatable_minus_requested_never_negative() {
        let free = FreeResources::from_capacity(&capacity(
            &[("cpu", "16000m"), ("memory", "64Gi"), ("pods", "220")],
            &[("cpu", "750m"), ("memory", "70Gi"), ("pods", "2")],
        ))
        .unwrap();
        assert_eq!(
            free,
            FreeResources {
                cpu_millis: Some(15_250),
                memory_bytes: Some(0),
                pods: Some(218),
            }
        );
        let unknown = FreeResources::from_capacity(&capacity(&[("gpu", "1")], &[]));
        assert_eq!(unknown, None, "no cpu, memory or pods: no estimate");
        let cpu_only = FreeResources::from_capacity(&capacity(&[("cpu", "2")], &[])).unwrap();
        assert_eq!(
            (cpu_only.cpu_millis, cpu_only.pods),
            (Some(2000), None),
            "a resource not reported limits nothing"
        );
    }

    #[test]
    fn requests_sum_containers_and_take_the_larger_init_container() {
        let template = deployment(
            serde_json::json!([
                {"name": "app", "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}},
                {"name": "sidecar", "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "64Mi"}}},
                {"name": "bare"}
            ]),
            serde_json::json!([{"name": "migrate", "resources": {"requests": {"cpu": 2, "memory": "1Mi"}}}]),
        );
        assert_eq!(
            replica_requests(&template),
            ReplicaRequests {
                cpu_millis: 2000,
                memory_bytes: (256 + 64) << 20,
            }
        );
        let none = deployment(serde_json::json!([{"name": "app"}]), Value::Null);
        assert_eq!(replica_requests(&none), ReplicaRequests::default());
    }

    #[test]
    fn a_kind_without_a_pod_template_uses_spec_resources() {
        let database = serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "MyDatabase",
            "spec": {"replicas": 3, "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}
        });
        assert_eq!(
            replica_requests(&database),
            ReplicaRequests {
                cpu_millis: 1000,
                memory_bytes: 2 << 30,
            }
        );
    }

    #[test]
    fn available_replicas_is_the_scarcest_resource() {
        let free = FreeResources {
            cpu_millis: Some(4000),
            memory_bytes: Some(10 << 30),
            pods: Some(100),
        };
        let per = |cpu_millis, memory_bytes| ReplicaRequests {
            cpu_millis,
            memory_bytes,
        };
        assert_eq!(available_replicas(&free, &per(500, 1 << 30)), Some(8));
        assert_eq!(available_replicas(&free, &per(100, 1 << 30)), Some(10));
        assert_eq!(
            available_replicas(&free, &per(0, 0)),
            Some(100),
            "no requests: pods only"
        );
        assert_eq!(available_replicas(&free, &per(4001, 0)), Some(0));
        let cpu_only = FreeResources {
            cpu_millis: Some(1000),
            ..FreeResources::default()
        };
        assert_eq!(available_replicas(&cpu_only, &per(0, 1 << 30)), None);
        assert_eq!(available_replicas(&cpu_only, &per(250, 0)), Some(4));
    }

    fn placement(json: Value) -> Placement {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn estimates_are_filled_only_for_placements_that_use_them() {
        let views = vec![
            ClusterView {
                name: "east".into(),
                capacity: Some(FreeResources {
                    cpu_millis: Some(3000),
                    memory_bytes: None,
                    pods: Some(50),
                }),
                ..ClusterView::default()
            },
            ClusterView {
                name: "west".into(),
                ..ClusterView::default()
            },
        ];
        let template = deployment(
            serde_json::json!([{"name": "app", "resources": {"requests": {"cpu": "1"}}}]),
            Value::Null,
        );
        let dynamic = placement(serde_json::json!({"replicaScheduling": {"type": "Divided",
            "weightPreference": {"dynamicWeight": "AvailableReplicas"}}}));
        let estimated = with_estimates(&views, &dynamic, &template, &|_| 0);
        assert!(matches!(estimated, Cow::Owned(_)));
        assert_eq!(estimated[0].available_replicas, Some(3));
        assert_eq!(estimated[1].available_replicas, None, "no summary: unknown");

        let aggregated = placement(serde_json::json!({"replicaScheduling": {"type": "Divided",
            "divisionPreference": "Aggregated"}}));
        assert_eq!(
            with_estimates(&views, &aggregated, &template, &|_| 0)[0].available_replicas,
            Some(3)
        );
        let static_weights =
            placement(serde_json::json!({"replicaScheduling": {"type": "Divided"}}));
        assert!(matches!(
            with_estimates(&views, &static_weights, &template, &|_| 0),
            Cow::Borrowed(_)
        ));
        assert!(!uses_capacity(&Placement::default()));

        // Two held replicas still pending in a Ready east: no room for them (placement
        // adds the held replicas back); a cluster that is not Ready is left as it is.
        let mut ready = views.clone();
        ready[0].ready = true;
        let pending = |cluster: &str| if cluster == "east" { 2 } else { 0 };
        assert_eq!(
            with_estimates(&ready, &aggregated, &template, &pending)[0].available_replicas,
            Some(1)
        );
        assert_eq!(
            with_estimates(&views, &aggregated, &template, &pending)[0].available_replicas,
            Some(3),
            "not Ready: unchanged"
        );
    }
}
