//! `OverridePolicy` (namespaced) and `ClusterOverridePolicy` (cluster-scoped),
//! federation.example.com/v1alpha1: per target cluster changes to the copies of the
//! templates they select (image registry, repository or tag, container command, args and
//! env, labels, annotations, and RFC 6902 JSON patches). Both kinds share
//! [`OverrideSpec`]. What the hub does with them is in docs/overrides.md and
//! `hub/federation/overrides.rs`.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};

use k8s_openapi::api::core::v1::EnvVar;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::api::propagation_policy::{ClusterAffinity, ResourceSelector};

/// Changes the member copies of the templates it selects in its own namespace, per
/// target cluster. Every override policy that selects a template applies, in a fixed
/// order: ClusterOverridePolicies first, then OverridePolicies (so a namespace's own
/// policy has the last word), each kind by name; within a policy its rules in order.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "federation.example.com",
    version = "v1alpha1",
    kind = "OverridePolicy",
    doc = "Changes the member copies of the templates it selects in its namespace, per target cluster: images, command, args, env, labels, annotations and JSON patches.",
    plural = "overridepolicies",
    singular = "overridepolicy",
    shortname = "op",
    namespaced,
    derive = "PartialEq",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct OverrideSpec {
    /// Templates this policy changes; a template matching any selector is selected (the
    /// same selectors as a PropagationPolicy's). An override policy does not place
    /// anything: it changes the copies a propagation policy places.
    #[schemars(length(min = 1))]
    pub resource_selectors: Vec<ResourceSelector>,
    /// The rules, applied in order; each one to the clusters its targetCluster matches.
    #[schemars(length(min = 1))]
    pub override_rules: Vec<OverrideRule>,
}

/// Like an OverridePolicy, but selects templates in every namespace (or the namespaces
/// its selectors name). It applies before the OverridePolicies of the template's
/// namespace, so those have the last word.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "federation.example.com",
    version = "v1alpha1",
    kind = "ClusterOverridePolicy",
    doc = "Changes the member copies of the templates it selects in any namespace, per target cluster: images, command, args, env, labels, annotations and JSON patches.",
    plural = "clusteroverridepolicies",
    singular = "clusteroverridepolicy",
    shortname = "cop",
    derive = "PartialEq",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct ClusterOverridePolicySpec {
    /// The shared fields, flattened so both kinds have the same spec shape.
    #[serde(flatten)]
    pub policy: OverrideSpec,
}

impl Deref for ClusterOverridePolicySpec {
    type Target = OverrideSpec;
    fn deref(&self) -> &OverrideSpec {
        &self.policy
    }
}

impl DerefMut for ClusterOverridePolicySpec {
    fn deref_mut(&mut self) -> &mut OverrideSpec {
        &mut self.policy
    }
}

/// What to change in the copies for the clusters `targetCluster` matches.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct OverrideRule {
    /// The clusters this rule applies to, by name, labels, zone or region (the
    /// clusterAffinity shape of a PropagationPolicy: every non-empty field must match;
    /// `exclude` removes). Without it the rule applies to every cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_cluster: Option<ClusterAffinity>,
    /// The changes, applied in this order whatever the order written: image, command,
    /// args, env, labels, annotations, plaintext.
    pub overriders: Overriders,
}

/// The changes of one rule. Each list applies in order.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Overriders {
    /// Changes to container images: registry, repository or tag.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_overrider: Vec<ImageOverrider>,
    /// Changes to one container's command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command_overrider: Vec<ListOverrider>,
    /// Changes to one container's args.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args_overrider: Vec<ListOverrider>,
    /// Changes to one container's environment variables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_overrider: Vec<EnvOverrider>,
    /// Changes to the copy's labels (metadata.labels). Bulkhead's own labels
    /// (federation.example.com/...) cannot be changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels_overrider: Vec<MapOverrider>,
    /// Changes to the copy's annotations (metadata.annotations). Bulkhead's own
    /// annotations (federation.example.com/...) cannot be changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotations_overrider: Vec<MapOverrider>,
    /// JSON patch operations (RFC 6902) on the whole copy, the general case; applied last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plaintext: Vec<PlaintextOverrider>,
}

/// add, remove or replace.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Operator {
    /// Add (see each overrider for what adding means there).
    Add,
    /// Remove.
    Remove,
    /// Replace.
    Replace,
}

impl Operator {
    /// The operator as written in a policy.
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::Add => "add",
            Operator::Remove => "remove",
            Operator::Replace => "replace",
        }
    }
}

/// The part of an image reference `[registry/]repository[:tag][@digest]` an image
/// overrider changes.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImageComponent {
    /// The registry host (and port, and path prefix), e.g. `mirror.example.com` or
    /// `localhost:5000`. An image that names none (`nginx`) is pulled from Docker Hub.
    Registry,
    /// The repository path, e.g. `library/nginx` or `team/web`.
    Repository,
    /// The tag (`1.27`) or the digest (`sha256:...`).
    Tag,
}

impl ImageComponent {
    /// The component as written in a policy.
    pub fn as_str(self) -> &'static str {
        match self {
            ImageComponent::Registry => "Registry",
            ImageComponent::Repository => "Repository",
            ImageComponent::Tag => "Tag",
        }
    }
}

/// Changes one component of container images.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ImageOverrider {
    /// Registry, Repository or Tag.
    pub component: ImageComponent,
    /// Registry: add (only to an image that names no registry), replace (set it, also
    /// on an image that names none) or remove. Repository: replace. Tag: add (only to an
    /// image without tag or digest), replace (set the tag or, given `sha256:...`, the
    /// digest) or remove (tag and digest).
    pub operator: Operator,
    /// The new registry, repository, or tag or digest; empty for remove.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// Only these containers (and init containers), by name; empty: every one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_names: Vec<String>,
}

/// Changes one container's command or args.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListOverrider {
    /// The container (or init container), by name. A template without that container is
    /// left unchanged by this overrider.
    pub container_name: String,
    /// add: append the values. remove: remove every occurrence of each value.
    pub operator: Operator,
    /// The values to append or remove.
    #[schemars(length(min = 1))]
    pub value: Vec<String>,
}

/// Changes one container's environment variables.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EnvOverrider {
    /// The container (or init container), by name. A template without that container is
    /// left unchanged by this overrider.
    pub container_name: String,
    /// add: set each variable (appended when the container does not have it). replace:
    /// set only the variables the container already has. remove: remove the variables
    /// of these names (their values are ignored).
    pub operator: Operator,
    /// The variables (the core EnvVar shape: name, and value or valueFrom).
    #[schemars(length(min = 1))]
    pub value: Vec<EnvVar>,
}

/// Changes labels or annotations.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MapOverrider {
    /// add: set each key (added when absent). replace: set only the keys already there.
    /// remove: remove the keys (their values are ignored).
    pub operator: Operator,
    /// The keys and values.
    #[schemars(length(min = 1))]
    pub value: BTreeMap<String, String>,
}

/// An RFC 6902 operation.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum PatchOp {
    /// Add a member or array element (replacing a member that exists).
    Add,
    /// Remove what `path` points at; it must exist.
    Remove,
    /// Replace what `path` points at; it must exist.
    Replace,
    /// Fail the whole patch unless `path` holds `value`.
    Test,
    /// Move what `from` points at to `path`.
    Move,
    /// Copy what `from` points at to `path`.
    Copy,
}

impl PatchOp {
    /// The op as written in a policy.
    pub fn as_str(self) -> &'static str {
        match self {
            PatchOp::Add => "add",
            PatchOp::Remove => "remove",
            PatchOp::Replace => "replace",
            PatchOp::Test => "test",
            PatchOp::Move => "move",
            PatchOp::Copy => "copy",
        }
    }
}

/// One JSON patch operation on the copy (RFC 6902). A failing operation (a path that
/// does not exist, a failed test) fails the whole template for that cluster: nothing is
/// applied there, and the binding says why.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PlaintextOverrider {
    /// add, remove, replace, test, move or copy.
    pub op: PatchOp,
    /// A JSON pointer into the copy, e.g. `/spec/template/spec/containers/0/image`
    /// (`~1` stands for `/` and `~0` for `~` in a key).
    pub path: String,
    /// The value, for add, replace and test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub value: Option<serde_json::Value>,
    /// The source pointer, for move and copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}
