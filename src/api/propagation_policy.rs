//! `PropagationPolicy` (namespaced) and `ClusterPropagationPolicy` (cluster-scoped),
//! federation.example.com/v1alpha1: which templates go to which member clusters, and how
//! their replicas are divided. Both kinds share [`PropagationSpec`].

use std::ops::{Deref, DerefMut};

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Selects templates in its own namespace and places them on member clusters. When several
/// policies select a template, the highest `priority` wins; then an exact name beats a name
/// pattern (the more specific pattern first) beats a label selector beats a kind-wide
/// selector (`name: "*"` is kind-wide); then a PropagationPolicy beats a
/// ClusterPropagationPolicy; then name order. The choice is recorded on the ResourceBinding.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "federation.example.com",
    version = "v1alpha1",
    kind = "PropagationPolicy",
    doc = "Places the templates it selects in its namespace on member clusters, and says how their replicas are divided.",
    plural = "propagationpolicies",
    singular = "propagationpolicy",
    shortname = "pp",
    namespaced,
    status = "PropagationPolicyStatus",
    derive = "PartialEq",
    printcolumn(
        name = "Priority",
        type_ = "integer",
        json_path = ".spec.priority",
        description = "Precedence among policies selecting the same template"
    ),
    printcolumn(
        name = "Scheduling",
        type_ = "string",
        json_path = ".spec.placement.replicaScheduling.type",
        description = "Duplicated or Divided"
    ),
    printcolumn(
        name = "Selected",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Selected\")].status",
        description = "Whether the policy selects any template"
    ),
    printcolumn(
        name = "Placing",
        type_ = "integer",
        json_path = ".status.placedTemplates",
        description = "Templates this policy places (the others it selects go to a policy with higher precedence)"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PropagationSpec {
    /// Precedence when several policies select the same template; higher wins.
    #[serde(default)]
    pub priority: i32,

    /// Templates this policy selects; a template matching any selector is selected.
    #[schemars(length(min = 1))]
    pub resource_selectors: Vec<ResourceSelector>,

    /// Where the selected templates go and how replicas are divided.
    #[serde(default)]
    pub placement: Placement,

    /// What happens when a cluster becomes unhealthy.
    #[serde(default)]
    pub failover: FailoverPolicy,

    /// What to do when a member already has an object of the same name that Bulkhead does
    /// not manage: Abort (default) reports the conflict on the binding and leaves the
    /// object alone; Overwrite takes it over.
    #[serde(default)]
    pub conflict_resolution: ConflictResolution,

    /// When true, the ConfigMaps, Secrets, ServiceAccounts and PersistentVolumeClaims the
    /// selected workloads' pod templates reference (in the workload's namespace) follow
    /// the workloads: they go to every cluster a workload that uses them goes to, and
    /// leave a cluster when no workload there needs them any more. A dependency selected
    /// by a policy of its own keeps that policy's placement; the `default` ServiceAccount
    /// is never a dependency (every namespace has one). See docs/dependencies.md.
    #[serde(default)]
    pub propagate_deps: bool,

    /// How a change of a selected template goes out: wave by wave, each wave gated by
    /// readiness, `minHealthySeconds` and an optional Prometheus analysis, rolled back
    /// automatically when the analysis fails. Without it a change goes to every cluster
    /// at once. See docs/rollouts.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::api::rollout::RolloutStrategy>,
}

/// Cluster-wide placement rules: like a PropagationPolicy, but selects templates in every
/// namespace (or the namespaces its selectors name). A PropagationPolicy of equal priority
/// and selector strength wins over it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "federation.example.com",
    version = "v1alpha1",
    kind = "ClusterPropagationPolicy",
    doc = "Places the templates it selects in any namespace on member clusters, and says how their replicas are divided.",
    plural = "clusterpropagationpolicies",
    singular = "clusterpropagationpolicy",
    shortname = "cpp",
    status = "PropagationPolicyStatus",
    derive = "PartialEq",
    printcolumn(
        name = "Priority",
        type_ = "integer",
        json_path = ".spec.priority",
        description = "Precedence among policies selecting the same template"
    ),
    printcolumn(
        name = "Scheduling",
        type_ = "string",
        json_path = ".spec.placement.replicaScheduling.type",
        description = "Duplicated or Divided"
    ),
    printcolumn(
        name = "Selected",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Selected\")].status",
        description = "Whether the policy selects any template"
    ),
    printcolumn(
        name = "Placing",
        type_ = "integer",
        json_path = ".status.placedTemplates",
        description = "Templates this policy places (the others it selects go to a policy with higher precedence)"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct ClusterPropagationPolicySpec {
    /// The shared policy fields, flattened so both kinds have the same spec shape.
    #[serde(flatten)]
    pub policy: PropagationSpec,
}

impl Deref for ClusterPropagationPolicySpec {
    type Target = PropagationSpec;
    fn deref(&self) -> &PropagationSpec {
        &self.policy
    }
}

impl DerefMut for ClusterPropagationPolicySpec {
    fn deref_mut(&mut self) -> &mut PropagationSpec {
        &mut self.policy
    }
}

/// What the hub sees a policy select (both policy kinds), written by the leading hub
/// when it changes (at most every few seconds per policy).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PropagationPolicyStatus {
    /// The policy generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Templates the policy's resource selectors match.
    #[serde(default)]
    pub selected_templates: i64,
    /// Of those, the templates this policy places; the others go to a policy of higher
    /// precedence (priority, then selector strength, then scope, then name).
    #[serde(default)]
    pub placed_templates: i64,
    /// `Selected`: True with the counts when the policy selects templates; False with
    /// reason `NothingSelected` and a hint per selector when it selects none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Selects templates by API version and kind, and optionally by name or labels. With
/// neither name nor labelSelector it selects every object of the kind.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.name) && has(self.labelSelector))").message("set name or labelSelector in a resource selector, not both"))]
pub struct ResourceSelector {
    /// API version of the template, for example `apps/v1` or `example.com/v1`.
    #[schemars(length(min = 1))]
    pub api_version: String,
    /// Kind of the template, for example `Deployment` or `MyDatabase`.
    #[schemars(length(min = 1))]
    pub kind: String,
    /// Name of one template, or a glob pattern: `*` matches any run of characters, `?`
    /// one character (`web-*`, `db-?`). `*` alone selects every object of the kind. An
    /// exact name beats a pattern, a pattern beats a label selector, and a label
    /// selector beats a kind-wide selector (see docs/placement.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Namespace of the templates; only for ClusterPropagationPolicy (a PropagationPolicy
    /// selects in its own namespace). Empty selects in every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Labels the templates must carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
}

/// Where templates go and how replicas are divided.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Which member clusters are candidates. Empty means every member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_affinity: Option<ClusterAffinity>,

    /// Cluster taints this placement tolerates (core Toleration shape). A toleration with
    /// tolerationSeconds keeps a tainted cluster only until that many seconds have passed
    /// since the taint was added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_tolerations: Vec<Toleration>,

    /// How many zones, regions or clusters the placement must spread over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spread_constraints: Vec<SpreadConstraint>,

    /// Duplicated (every chosen cluster runs spec.replicas) or Divided (the replicas are
    /// shared out). Defaults to Duplicated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_scheduling: Option<ReplicaScheduling>,
}

impl Placement {
    /// `replicaScheduling.weightPreference.staticWeightList`, empty when unset.
    pub fn static_weight_list(&self) -> &[StaticClusterWeight] {
        self.replica_scheduling
            .as_ref()
            .and_then(|s| s.weight_preference.as_ref())
            .map_or(&[][..], |w| &w.static_weight_list[..])
    }
}

/// Candidate member clusters. Each non-empty field narrows the set; `exclude` removes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAffinity {
    /// Only these clusters, by MemberCluster name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_names: Vec<String>,
    /// Never these clusters, by MemberCluster name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Only clusters whose MemberCluster labels match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    /// Only clusters in these zones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
    /// Only clusters in these regions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<String>,
}

/// The failure-domain level a spread constraint counts.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum SpreadByField {
    /// Spread over zones.
    #[default]
    Zone,
    /// Spread over regions.
    Region,
    /// Spread over individual clusters.
    Cluster,
}

/// Chooses between minGroups and maxGroups groups (zones, regions or clusters). A
/// constraint that cannot be met leaves the binding Scheduled=False with the reason.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.maxGroups == 0 || self.maxGroups >= self.minGroups").message("spreadConstraints: maxGroups must be 0 (no limit) or at least minGroups"))]
pub struct SpreadConstraint {
    /// What to count: zone, region or cluster.
    pub spread_by_field: SpreadByField,
    /// The fewest groups to use.
    #[serde(default = "default_min_groups")]
    #[schemars(range(min = 1))]
    pub min_groups: i32,
    /// The most groups to use; 0 means no limit.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub max_groups: i32,
}

fn default_min_groups() -> i32 {
    1
}

/// How replicas are scheduled over the chosen clusters.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.type == 'Divided' || (!has(self.divisionPreference) && !has(self.weightPreference))").message("replicaScheduling: divisionPreference and weightPreference apply only to type Divided"))]
#[x_kube(validation = Rule::new("self.type == 'Divided' || !has(self.minPerCluster) || self.minPerCluster == 0").message("replicaScheduling: minPerCluster applies only to type Divided (Duplicated already runs spec.replicas in every cluster): set type Divided or remove minPerCluster"))]
pub struct ReplicaScheduling {
    /// Duplicated: each chosen cluster gets spec.replicas. Divided: the replicas are
    /// shared out over the chosen clusters.
    #[serde(rename = "type", default)]
    pub type_: ReplicaSchedulingType,
    /// For Divided: Weighted (default; Webster/Sainte-Laguë by weight) or Aggregated (as
    /// few clusters as possible).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub division_preference: Option<DivisionPreference>,
    /// For Divided/Weighted: the weights. Without it every candidate has weight 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_preference: Option<WeightPreference>,
    /// For Divided: every selected cluster gets at least this many replicas before the
    /// rest is divided by weight (Weighted) or aggregated (Aggregated). When spec.replicas
    /// is too small for every selected cluster, the minimum goes to as many clusters as
    /// the replicas allow, in weight order, and the binding says so. 0 (default) means
    /// no minimum.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0))]
    pub min_per_cluster: i32,
}

fn is_zero(value: &i32) -> bool {
    *value == 0
}

/// Duplicated or Divided.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReplicaSchedulingType {
    /// Every chosen cluster runs the template's full replica count.
    #[default]
    Duplicated,
    /// The template's replicas are shared out over the chosen clusters.
    Divided,
}

/// How Divided replicas are shared out.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DivisionPreference {
    /// In proportion to weights, by the Webster/Sainte-Laguë method.
    #[default]
    Weighted,
    /// Into as few clusters as possible, preferring clusters that already hold replicas.
    Aggregated,
}

/// Largest `staticWeightList[].weight` the schema and the webhook accept: weights are
/// ratios, and a bound keeps every sum and product over them far from overflow.
pub const MAX_WEIGHT: i64 = 10_000;
/// Most `staticWeightList` entries the schema and the webhook accept.
pub const MAX_STATIC_WEIGHTS: usize = 100;

/// Weights for Divided/Weighted scheduling.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct WeightPreference {
    /// Weights for groups of clusters, at most 100 entries (one entry can target many
    /// clusters). A cluster takes the weight of the first entry that matches it; clusters
    /// no entry matches get weight 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_STATIC_WEIGHTS))]
    #[x_kube(validation = Rule::new("self.size() == 0 || self.exists(w, w.weight > 0)").message("staticWeightList: at least one weight must be positive"))]
    pub static_weight_list: Vec<StaticClusterWeight>,
    /// Use each member's estimated available replicas as its weight (overrides the static
    /// weights).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_weight: Option<DynamicWeight>,
}

/// A weight for the clusters a target matches.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct StaticClusterWeight {
    /// The clusters this weight applies to.
    pub target_cluster: ClusterTarget,
    /// The weight, 0 to 10000. Only ratios matter (2 and 1 divide like 2000 and 1000).
    #[schemars(range(min = 0, max = MAX_WEIGHT))]
    pub weight: i64,
}

/// Clusters matched by name, labels or zone (any non-empty field must match).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterTarget {
    /// MemberCluster names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_names: Vec<String>,
    /// MemberCluster labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    /// Zones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
}

/// Source of dynamic weights.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DynamicWeight {
    /// Each member's estimated number of replicas it can still fit, from its capacity and
    /// the template's per-replica requests.
    AvailableReplicas,
}

/// Reaction to an unhealthy cluster.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FailoverPolicy {
    /// Stateless kinds (Deployment): moved to healthy clusters after a grace period.
    #[serde(default)]
    pub stateless: StatelessFailover,
    /// Stateful kinds (StatefulSet, MyDatabase) are never moved. Fence (default): the
    /// placement is marked fenced and the member's agent serves it read-only while the hub
    /// is unreachable. Preserve: left as it is, without marking.
    #[serde(default)]
    pub stateful: StatefulFailover,
}

/// Stateless failover timing.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StatelessFailover {
    /// Seconds a cluster may be unhealthy (its NoExecute taint untolerated) before its
    /// replicas are re-divided over the surviving clusters.
    #[serde(default = "default_toleration_seconds")]
    #[schemars(range(min = 0))]
    pub toleration_seconds: i64,
}

fn default_toleration_seconds() -> i64 {
    60
}

impl Default for StatelessFailover {
    fn default() -> Self {
        StatelessFailover {
            toleration_seconds: default_toleration_seconds(),
        }
    }
}

/// Fence or Preserve.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StatefulFailover {
    /// Keep the placement and mark it fenced (read-only in the member).
    #[default]
    Fence,
    /// Keep the placement without marking it.
    Preserve,
}

/// Abort or Overwrite.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ConflictResolution {
    /// Report the conflict on the binding and leave the member's object alone.
    #[default]
    Abort,
    /// Take over the member's object.
    Overwrite,
}
