//! `MemberCluster` (federation.example.com/v1alpha1, cluster-scoped): a cluster the hub
//! places workloads in, with the credentials to reach it and its failure domain.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The taint the hub adds to a member it cannot reach (probe timeouts or refusals).
pub const TAINT_UNREACHABLE: &str = "federation.example.com/unreachable";
/// The taint the hub adds to a member whose `/readyz` answers but not with 200.
pub const TAINT_NOT_READY: &str = "federation.example.com/not-ready";

/// A member cluster registered with the federation hub. `bulkhead join` creates it together
/// with the kubeconfig Secret it references. Its labels are matched by placement label
/// selectors; its zone and region are the failure domains for spread and disruption.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "federation.example.com",
    version = "v1alpha1",
    kind = "MemberCluster",
    doc = "A member cluster registered with the Bulkhead federation hub: how to reach it, its failure domain, and its observed health.",
    plural = "memberclusters",
    singular = "membercluster",
    shortname = "mc",
    status = "MemberClusterStatus",
    derive = "PartialEq",
    printcolumn(
        name = "Zone",
        type_ = "string",
        json_path = ".spec.zone",
        description = "Failure domain"
    ),
    printcolumn(
        name = "Region",
        type_ = "string",
        json_path = ".spec.region",
        description = "Region"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the hub can reach and use the cluster"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        description = "Why the cluster is or is not Ready"
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".status.kubernetesVersion",
        description = "Kubernetes version of the member's API server"
    ),
    printcolumn(
        name = "Zone-State",
        type_ = "string",
        json_path = ".status.zoneState",
        description = "Disruption state of the member's zone",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MemberClusterSpec {
    /// The Secret on the hub that holds this member's kubeconfig under the key `kubeconfig`.
    pub secret_ref: SecretReference,

    /// Failure domain used for spreading replicas and judging disruption, for example
    /// `zone-a`. Lower-case letters, digits and '-' (a DNS label).
    #[schemars(
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
        length(min = 1, max = 63)
    )]
    pub zone: String,

    /// Region that holds the zone, for example `east-1`. Lower-case letters, digits and '-'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
        length(min = 1, max = 63)
    )]
    pub region: Option<String>,

    /// Taints on the cluster, in the core Taint shape. Placement avoids clusters whose
    /// NoSchedule/NoExecute taints a policy does not tolerate. Users may add their own; the
    /// hub adds `federation.example.com/unreachable` and `federation.example.com/not-ready`
    /// (effect NoExecute) while the cluster is unhealthy and removes them when it recovers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,

    /// How the hub probes the member API server's `/readyz`.
    #[serde(default)]
    pub probe: ProbeSpec,

    /// Accept a kubeconfig whose cluster sets `insecure-skip-tls-verify: true`: the hub
    /// then does not verify the member's certificate and sends its token to whoever
    /// answers at the address. Off by default (such a kubeconfig is refused with
    /// `Ready=False, reason=CredentialsInvalid`); for labs only. Shown as the
    /// `TLSVerified=False` condition and in `bulkhead get clusters`.
    #[serde(
        default,
        rename = "insecureSkipTLSVerify",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub insecure_skip_tls_verify: bool,
}

/// A reference to a Secret by namespace and name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    /// Namespace of the Secret on the hub, usually `bulkhead-system`.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Health probing of a member. Health changes only after `failureThreshold` consecutive
/// failures or `successThreshold` consecutive successes, so one lost request never moves
/// workloads.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.timeoutSeconds <= self.intervalSeconds").message("probe.timeoutSeconds must not exceed probe.intervalSeconds"))]
pub struct ProbeSpec {
    /// Seconds between probes.
    #[serde(default = "default_interval")]
    #[schemars(range(min = 1, max = 300))]
    pub interval_seconds: i32,
    /// Seconds before a probe counts as failed (Unreachable).
    #[serde(default = "default_timeout")]
    #[schemars(range(min = 1, max = 300))]
    pub timeout_seconds: i32,
    /// Consecutive failures that make the cluster not Ready.
    #[serde(default = "default_failure_threshold")]
    #[schemars(range(min = 1, max = 100))]
    pub failure_threshold: i32,
    /// Consecutive successes that make a not-Ready cluster Ready again.
    #[serde(default = "default_success_threshold")]
    #[schemars(range(min = 1, max = 100))]
    pub success_threshold: i32,
}

fn default_interval() -> i32 {
    5
}
fn default_timeout() -> i32 {
    3
}
fn default_failure_threshold() -> i32 {
    3
}
fn default_success_threshold() -> i32 {
    2
}

impl Default for ProbeSpec {
    fn default() -> Self {
        ProbeSpec {
            interval_seconds: default_interval(),
            timeout_seconds: default_timeout(),
            failure_threshold: default_failure_threshold(),
            success_threshold: default_success_threshold(),
        }
    }
}

/// Disruption state of a zone, from the share of its members that are unhealthy.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ZoneState {
    /// Fewer than 55% of the zone's members are unhealthy (or the zone has one member that is healthy).
    #[default]
    Normal,
    /// At least 55% of the zone's members are unhealthy, the zone has more than one member, and one is healthy.
    PartialDisruption,
    /// No member of the zone is healthy.
    FullDisruption,
}

/// Observed state of a member cluster, written by the hub.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MemberClusterStatus {
    /// Ready (reasons Healthy, Unreachable, NotReady, CredentialsInvalid), Reachable and
    /// Fenced, in the metav1.Condition shape.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// Version reported by the member's API server, for example v1.36.3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,

    /// When the hub last probed the member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,

    /// When the Ready condition last changed status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,

    /// Capacity summary from the member's nodes and pods, used for dynamic weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<ClusterCapacity>,

    /// Disruption state of this member's zone: Normal, PartialDisruption or FullDisruption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone_state: Option<ZoneState>,

    /// When the hub last left its frozen state (every zone was in FullDisruption, so the
    /// hub assumed it was the one cut off). Failover grace periods (the tolerationSeconds
    /// of the hub's NoExecute taints) count from this time when it is later than the
    /// taint's timeAdded; it is kept here so that a restarted hub keeps counting from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover_grace_start: Option<Time>,

    /// Copies in this member whose template was deleted, with its namespace, while this
    /// member was unreachable. The namespace on the hub could not wait for the member, so
    /// the hub keeps the cleanup here instead of on the template: once the member is back,
    /// each copy is deleted as for any template deleted during a partition (stateless
    /// copies removed; a MyDatabase copy deleted so its agent applies its reclaimPolicy,
    /// the claims kept under Retain), and its row goes. A template of the same kind,
    /// namespace and name created on the hub meanwhile takes over the copy where it
    /// places one. Written by the hub (field manager bulkhead-hub-cleanups).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["apiVersion", "kind", "namespace", "name"]))]
    pub pending_cleanups: Vec<PendingCleanup>,
}

/// A copy the hub still has to delete from a member (see `status.pendingCleanups`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PendingCleanup {
    /// The template's apiVersion, for example apps/v1.
    pub api_version: String,
    /// The template's kind, for example Deployment.
    pub kind: String,
    /// The template's namespace on the hub (and the copy's in the member).
    pub namespace: String,
    /// The template's name (and the copy's).
    pub name: String,
    /// The uid of the deleted template on the hub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_uid: Option<String>,
    /// When the hub recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

/// Resources of a member cluster, summed over its schedulable nodes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCapacity {
    /// Allocatable resources (cpu, memory, pods) summed over Ready, schedulable nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocatable: BTreeMap<String, Quantity>,
    /// Resources requested by the pods running on those nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requested: BTreeMap<String, Quantity>,
    /// Number of Ready, schedulable nodes the sums cover.
    #[serde(default)]
    pub nodes: i32,
}
