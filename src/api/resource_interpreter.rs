//! `ResourceInterpreter` (cluster-scoped, federation.example.com/v1alpha1): how the hub
//! reads a kind it does not know, declared instead of coded. It names the replica field
//! (which makes the kind divisible), the status fields summed on the hub, the health
//! rule, whether the kind is stateful (then every stateful-safety rule applies), where
//! its pod template is, and the fields the member owns (never sent to it). The built-in
//! kinds (Deployment, StatefulSet, MyDatabase, Job, the core kinds) are written in the
//! same form in `hub::federation::interpreter`; docs/interpreters.md has the reference.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// How the hub interprets one kind of template: replicas, status, health, statefulness
/// and the fields the member owns. Paths are dotted field paths from the object's root,
/// such as `.spec.replicas` or `.metadata.labels['app.kubernetes.io/name']`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "federation.example.com",
    version = "v1alpha1",
    kind = "ResourceInterpreter",
    doc = "How the hub divides, reads and protects one kind of template it does not know.",
    plural = "resourceinterpreters",
    singular = "resourceinterpreter",
    shortname = "ri",
    status = "ResourceInterpreterStatus",
    derive = "PartialEq",
    printcolumn(
        name = "API-Version",
        type_ = "string",
        json_path = ".spec.target.apiVersion"
    ),
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.target.kind"),
    printcolumn(
        name = "Replicas",
        type_ = "string",
        json_path = ".spec.replicas",
        description = "The replica field; empty: Duplicated"
    ),
    printcolumn(name = "Stateful", type_ = "boolean", json_path = ".spec.stateful"),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceInterpreterSpec {
    /// The kind this interpreter is for. Every version of the group is interpreted alike.
    pub target: InterpreterTarget,

    /// Path of the replica count in the template, e.g. `.spec.replicas`. Set: the kind
    /// is divisible (each cluster's copy gets its share at this path). Unset: the kind is
    /// Duplicated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<String>,

    /// The kind holds data: failover never moves it (it is fenced in place), and no copy
    /// is deleted or shrunk while a cluster of its placement is not Ready.
    #[serde(default)]
    pub stateful: bool,

    /// Path of the pod template, e.g. `.spec.template` (used for per-replica resource
    /// requests, image overrides and dependencies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<String>,

    /// Status fields of the member copies, summed into the hub template's status at the
    /// same paths.
    #[serde(default)]
    pub status: InterpreterStatusFields,

    /// When one copy is healthy.
    #[serde(default)]
    pub health: HealthRule,

    /// Paths the member owns: removed from every copy before it is sent (for example
    /// addresses the member allocates).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub member_owned_fields: Vec<String>,

    /// Other objects this kind references by name, beyond its pod template's: with
    /// `propagateDeps: true` on the policy that places it, they follow it to its clusters
    /// (docs/dependencies.md). A referenced object may be a custom kind with references of
    /// its own; the chain is followed, and a cycle is reported on the following bindings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<InterpreterDependency>,
}

/// One reference field of a kind: the objects of `kind` whose names are at `path`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterpreterDependency {
    /// Where the names are, under `.spec`: a string (`.spec.configName`), an object with
    /// `name` (`.spec.configRef`, the same as `.spec.configRef.name`), or every element of
    /// a list (`.spec.secrets[].name`). Only objects of the template's namespace follow.
    pub path: String,
    /// apiVersion of the referenced objects, e.g. `v1` or `example.org/v1`.
    pub api_version: String,
    /// Kind of the referenced objects, e.g. `ConfigMap`.
    pub kind: String,
}

/// The kind an interpreter is for.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterpreterTarget {
    /// `group/version` (the version only picks nothing: every version of the group is
    /// interpreted alike), e.g. `example.org/v1`.
    pub api_version: String,
    /// The kind, as the API serves it, e.g. `Widget`.
    pub kind: String,
}

/// Paths of the status fields the hub sums over the copies, each in the copy and in the
/// hub template (the same path in both).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterpreterStatusFields {
    /// Replicas that exist, e.g. `.status.replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<String>,
    /// Replicas that are ready, e.g. `.status.readyReplicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    /// Replicas that are available, e.g. `.status.availableReplicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<String>,
    /// Replicas that run the current spec, e.g. `.status.updatedReplicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<String>,
    /// The generation the member's controller has seen, e.g.
    /// `.status.observedGeneration`; the hub writes the template's generation there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<String>,
}

/// When a copy counts as healthy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthRule {
    /// `Present` (default): healthy once it exists in the member as applied.
    /// `ReadyReplicas`: healthy when the ready field (`status.ready`) reaches the
    /// cluster's replicas. `Condition`: healthy when the copy's condition `condition.type`
    /// has `condition.status`.
    #[serde(default, rename = "type")]
    pub type_: HealthType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<HealthCondition>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum HealthType {
    #[default]
    Present,
    ReadyReplicas,
    Condition,
}

/// The condition that says a copy is healthy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthCondition {
    /// Condition type in `.status.conditions`, e.g. `Available`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The status that means healthy: `True` (default) or `False`.
    #[serde(default = "condition_true")]
    pub status: String,
    /// A copy without the condition yet counts as healthy (for example `type: Failed,
    /// status: "False"` for a Job that is still running).
    #[serde(default)]
    pub absent_is_healthy: bool,
}

fn condition_true() -> String {
    "True".into()
}

/// Whether the hub accepted the interpreter (`Accepted`), and why not.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceInterpreterStatus {
    /// `Accepted`: whether the hub reads the kind this way, and if not, the field and the
    /// fix.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
