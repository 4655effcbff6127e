//! `ResourceBinding` (federation.example.com/v1alpha1, namespaced): one per propagated
//! template. The spec is the hub's scheduling decision; the status explains it and
//! reports what happened in each member.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The placement of one template: which member clusters run it, how many replicas each,
/// which policy decided that, and why each cluster was or was not chosen. Written by the
/// hub; users read it (`kubectl get rb`, `bulkhead get bindings`).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "federation.example.com",
    version = "v1alpha1",
    kind = "ResourceBinding",
    doc = "The placement of one template on member clusters: the decision, the policy behind it, and what happened in each member.",
    plural = "resourcebindings",
    singular = "resourcebinding",
    shortname = "rb",
    namespaced,
    status = "ResourceBindingStatus",
    derive = "PartialEq",
    printcolumn(
        name = "Kind",
        type_ = "string",
        json_path = ".spec.resource.kind",
        description = "Kind of the template"
    ),
    printcolumn(
        name = "Template",
        type_ = "string",
        json_path = ".spec.resource.name",
        description = "Name of the template"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".spec.replicas",
        description = "Replicas of the template"
    ),
    printcolumn(
        name = "Scheduled",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Scheduled\")].status",
        description = "Whether a placement was found"
    ),
    printcolumn(
        name = "Healthy",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Healthy\")].status",
        description = "Whether every placement is applied and healthy"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceBindingSpec {
    /// The template this binding places.
    pub resource: ObjectReference,
    /// The policy that selected the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyReference>,
    /// Replicas of the template (for Divided kinds, the total shared out).
    #[serde(default)]
    pub replicas: i32,
    /// The decision: member clusters and their replicas.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub clusters: Vec<TargetCluster>,
}

/// A template on the hub.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    /// API version, for example apps/v1.
    pub api_version: String,
    /// Kind, for example Deployment.
    pub kind: String,
    /// Namespace of the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the template.
    pub name: String,
    /// UID of the template, so a re-created template of the same name is told apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// metadata.generation of the template this decision was made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

/// The policy that selected a template.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PolicyReference {
    /// PropagationPolicy or ClusterPropagationPolicy.
    pub kind: String,
    /// Namespace of a PropagationPolicy; empty for a ClusterPropagationPolicy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the policy.
    pub name: String,
    /// The selector that matched, for example `resourceSelectors[0]: name pattern web-*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected_by: Option<String>,
    /// Why this policy won over the next policy that selects the template (priority,
    /// selector strength, scope, name order); absent when no other policy selects it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precedence: Option<String>,
}

/// A member cluster chosen for the template.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TargetCluster {
    /// MemberCluster name.
    pub name: String,
    /// Replicas in this cluster (for Duplicated kinds, the template's full count).
    #[serde(default)]
    pub replicas: i32,
}

/// Health of a template's copy in one member.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PlacementHealth {
    /// The copy exists and reports itself ready.
    Healthy,
    /// The copy exists but is not ready, or could not be applied.
    Unhealthy,
    /// The cluster cannot be reached or the copy has not been seen yet.
    #[default]
    Unknown,
}

/// Observed state of the placement.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResourceBindingStatus {
    /// The template generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Scheduled, Propagated, Healthy and Degraded, in the metav1.Condition shape.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// Why each known member cluster was or was not chosen, one row per cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["cluster"]))]
    pub decisions: Vec<ClusterDecision>,

    /// How the template's kind was read: `built-in`, `ResourceInterpreter/<name>` or
    /// `default (Duplicated)` (docs/interpreters.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interpreter: Option<String>,

    /// What happened in each member: applied, health, ready replicas, last seen, fencing
    /// and pending cleanup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub clusters: Vec<ClusterPlacementStatus>,

    /// The template's rollout, when its policy has `spec.rollout`: revision, wave,
    /// phase and the current wave's analysis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::api::rollout::RolloutStatus>,
}

/// Why one cluster was or was not chosen.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterDecision {
    /// MemberCluster name.
    pub cluster: String,
    /// Whether the cluster was chosen.
    pub selected: bool,
    /// Replicas given to the cluster when chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// The reason, in words, for example "taint federation.example.com/unreachable not tolerated".
    pub reason: String,
}

/// The template's copy in one member.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPlacementStatus {
    /// MemberCluster name.
    pub name: String,
    /// The copy was applied for the current decision.
    #[serde(default)]
    pub applied: bool,
    /// Healthy, Unhealthy or Unknown.
    #[serde(default)]
    pub health: PlacementHealth,
    /// Ready replicas reported by the copy; 0 while the cluster is unreachable.
    #[serde(default)]
    pub ready_replicas: i32,
    /// When the hub last read the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<Time>,
    /// The placement is stateful and its cluster unreachable: the hub assumes the agent
    /// has fenced it read-only.
    #[serde(default)]
    pub fenced: bool,
    /// The copy must be deleted once the cluster is reachable again.
    #[serde(default)]
    pub pending_cleanup: bool,
    /// Why the copy is not applied or not healthy, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The override policies that changed this cluster's copy, in the order they
    /// applied, e.g. `ClusterOverridePolicy/registry-mirror`, `OverridePolicy/web-east`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<String>,
    /// An override failed on the template for this cluster (the message says which
    /// policy, rule, overrider and path): nothing was applied there, and the copy the
    /// cluster already holds, if any, is left exactly as it is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub override_failed: bool,
}
