//! The capacity summary of a member: allocatable and requested cpu, memory and pods over
//! its Ready, schedulable nodes. Pure code; the prober lists nodes and pods.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Deserialize;

use crate::api::member_cluster::ClusterCapacity;

/// Parses a Kubernetes quantity (`500m`, `2`, `32Gi`, `1e3`, `128974848`) into a number
/// of base units (cores, bytes, pods). `None` when it does not parse.
pub fn parse_quantity(text: &str) -> Option<f64> {
    const SUFFIXES: [(&str, f64); 15] = [
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("Pi", 1125899906842624.0),
        ("Ei", 1152921504606846976.0),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    let text = text.trim();
    for (suffix, multiplier) in SUFFIXES {
        if let Some(number) = text.strip_suffix(suffix)
            && let Ok(n) = number.parse::<f64>()
        {
            return Some(n * multiplier);
        }
    }
    text.parse::<f64>().ok().filter(|n| n.is_finite())
}

fn node_is_usable(node: &Node) -> bool {
    let schedulable = !node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    schedulable && ready
}

/// What the summary reads of a pod: its node, its phase and its containers' requests,
/// deserialized straight from a member's pod list with every other field skipped. A
/// member runs thousands of pods; typed `Pod`s (managed fields, status, the whole spec)
/// of all of them every capacity interval were the largest allocation of a burst's hub
/// (heaptrack: the pod list's text and objects were most of its peak heap).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodRequests {
    spec: Option<PodRequestsSpec>,
    status: Option<PodPhase>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodRequestsSpec {
    node_name: Option<String>,
    containers: Option<Vec<ContainerRequests>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct ContainerRequests {
    resources: Option<ContainerResources>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct ContainerResources {
    requests: Option<BTreeMap<String, Quantity>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct PodPhase {
    phase: Option<String>,
}

/// One page of a pod list, read as [`PodRequests`].
#[derive(Debug, Default, Deserialize)]
pub struct PodRequestsPage {
    #[serde(default)]
    pub metadata: PageMeta,
    #[serde(default)]
    pub items: Vec<PodRequests>,
}

/// What a pager needs of a list's metadata.
#[derive(Debug, Default, Deserialize)]
pub struct PageMeta {
    #[serde(rename = "continue")]
    pub continue_token: Option<String>,
}

fn pod_is_active(pod: &PodRequests) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded") | Some("Failed"))
}

/// Sums allocatable over Ready, schedulable nodes and the requests of the non-terminated
/// pods bound to them. cpu is written in millicores, memory in bytes, pods as a count.
pub fn summarize(nodes: &[Node], pods: &[PodRequests]) -> ClusterCapacity {
    let usable: Vec<&Node> = nodes.iter().filter(|n| node_is_usable(n)).collect();
    let names: HashSet<&str> = usable
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    let mut allocatable = [0.0_f64; 3];
    for node in &usable {
        let values = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        for (i, resource) in ["cpu", "memory", "pods"].iter().enumerate() {
            if let Some(q) = values.and_then(|v| v.get(*resource)) {
                allocatable[i] += parse_quantity(&q.0).unwrap_or(0.0);
            }
        }
    }
    let mut requested = [0.0_f64; 3];
    for pod in pods.iter().filter(|p| pod_is_active(p)) {
        let on_usable_node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| names.contains(n));
        if !on_usable_node {
            continue;
        }
        requested[2] += 1.0;
        for container in pod.spec.iter().flat_map(|s| s.containers.iter().flatten()) {
            let requests = container
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref());
            for (i, resource) in ["cpu", "memory"].iter().enumerate() {
                if let Some(q) = requests.and_then(|r| r.get(*resource)) {
                    requested[i] += parse_quantity(&q.0).unwrap_or(0.0);
                }
            }
        }
    }
    ClusterCapacity {
        allocatable: quantities(allocatable),
        requested: quantities(requested),
        nodes: usable.len() as i32,
    }
}

fn quantities([cpu, memory, pods]: [f64; 3]) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        (
            "cpu".to_string(),
            Quantity(format!("{}m", (cpu * 1000.0).round() as i64)),
        ),
        (
            "memory".to_string(),
            Quantity(format!("{}", memory.round() as i64)),
        ),
        (
            "pods".to_string(),
            Quantity(format!("{}", pods.round() as i64)),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_quantity_forms_kubernetes_writes() {
        assert_eq!(parse_quantity("500m"), Some(0.5));
        assert_eq!(parse_quantity("8"), Some(8.0));
        assert_eq!(
            parse_quantity("32Gi"),
            Some(32.0 * 1024.0 * 1024.0 * 1024.0)
        );
        assert_eq!(parse_quantity("1k"), Some(1000.0));
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("110"), Some(110.0));
        assert_eq!(parse_quantity("2E"), Some(2e18));
        assert_eq!(parse_quantity("12Zi"), None);
        assert_eq!(parse_quantity("abc"), None);
    }

    fn node(name: &str, ready: bool, unschedulable: bool) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"unschedulable": unschedulable},
            "status": {
                "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]
            }
        }))
        .unwrap()
    }

    fn pod(node: &str, phase: &str, cpu: &str) -> PodRequests {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"nodeName": node, "containers": [
                {"name": "a", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}},
                {"name": "b"}
            ]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_list_page_reads_only_what_capacity_needs() {
        let page: PodRequestsPage = serde_json::from_value(serde_json::json!({
            "kind": "PodList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "9", "continue": "next-page"},
            "items": [{
                "metadata": {"name": "p", "managedFields": [{"manager": "kubelet"}]},
                "spec": {"nodeName": "a", "containers": [
                    {"name": "c", "image": "nginx", "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}}}
                ]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            }, {"metadata": {"name": "q"}}]
        }))
        .unwrap();
        assert_eq!(page.metadata.continue_token.as_deref(), Some("next-page"));
        assert_eq!(page.items.len(), 2);
        let capacity = summarize(&[node("a", true, false)], &page.items);
        assert_eq!(capacity.requested["cpu"].0, "100m");
        assert_eq!(
            capacity.requested["pods"].0, "1",
            "a pod on no node is not counted"
        );
        let last: PodRequestsPage =
            serde_json::from_value(serde_json::json!({"metadata": {}, "items": []})).unwrap();
        assert!(last.metadata.continue_token.is_none());
    }

    #[test]
    fn sums_ready_schedulable_nodes_and_their_active_pods() {
        let nodes = [
            node("a", true, false),
            node("b", true, false),
            node("c", false, false),
            node("d", true, true),
        ];
        let pods = [
            pod("a", "Running", "500m"),
            pod("b", "Pending", "250m"),
            pod("a", "Succeeded", "4"),
            pod("c", "Running", "1"),
        ];
        let capacity = summarize(&nodes, &pods);
        assert_eq!(capacity.nodes, 2);
        assert_eq!(capacity.allocatable["cpu"].0, "16000m");
        assert_eq!(capacity.allocatable["memory"].0, (64_i64 << 30).to_string());
        assert_eq!(capacity.allocatable["pods"].0, "220");
        assert_eq!(capacity.requested["cpu"].0, "750m");
        assert_eq!(capacity.requested["memory"].0, (2_i64 << 30).to_string());
        assert_eq!(capacity.requested["pods"].0, "2");
    }
}
