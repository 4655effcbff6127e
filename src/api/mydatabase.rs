//! `MyDatabase` (example.com/v1): a PostgreSQL database run by the member agent as a
//! StatefulSet. On the hub it is a template whose `spec.replicas` is the total across
//! clusters; on a member it is the local instance.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A PostgreSQL database. The member agent turns it into a StatefulSet with a read-write
/// Service `<name>`, a read-only Service `<name>-ro` and a ConfigMap `<name>-config`. On
/// the federation hub, `spec.replicas` is the total to place across member clusters.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "example.com",
    version = "v1",
    kind = "MyDatabase",
    doc = "A PostgreSQL database run as a StatefulSet by the Bulkhead agent; on the federation hub, a template placed across member clusters.",
    plural = "mydatabases",
    singular = "mydatabase",
    shortname = "db",
    namespaced,
    status = "MyDatabaseStatus",
    derive = "PartialEq",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".spec.replicas",
        description = "Desired replicas (on the hub: total across clusters)"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Replicas that pass their readiness probe"
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".spec.version",
        description = "PostgreSQL major version"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Lifecycle phase"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MyDatabaseSpec {
    /// Number of PostgreSQL replicas, 1 to 10. On the federation hub this is the total
    /// across all member clusters; in a member cluster it is the local count.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 10))]
    pub replicas: i32,

    /// PostgreSQL major version, used as the image tag (for example "14" or "16.2").
    #[serde(default = "default_version")]
    #[schemars(regex(pattern = r"^[0-9]{1,2}(\.[0-9]{1,2})?$"), length(max = 5))]
    pub version: String,

    /// Image repository to run instead of the default `postgres`; the tag is always
    /// `spec.version`. Tenants may set a default for this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub image: Option<String>,

    /// Persistent storage for each replica, and what happens to it when the database is
    /// deleted. Immutable after creation: a StatefulSet's volume claim templates cannot
    /// change, so create a new database to resize.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.storage is immutable after creation; create a new MyDatabase to change size, class or reclaim policy"))]
    pub storage: DatabaseStorage,

    /// CPU and memory requests and limits for each replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Serve read-only when true. Fencing (the hub's lease going stale) also makes the
    /// database read-only; it adds to this setting and never clears it.
    #[serde(default)]
    pub read_only: bool,

    /// How the replicas in one cluster replicate: one primary, the others streaming hot
    /// standbys of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<DatabaseTopology>,
}

/// Replication between a database's instances in one cluster.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseTopology {
    /// How many standbys must have a commit before the primary acknowledges it
    /// (`synchronous_standby_names = 'ANY N (...)'`). 0 (default): asynchronous, a failover
    /// may lose the last commits. With N >= 1 no acknowledged commit is lost when the
    /// primary dies, and commits wait while fewer than N standbys stream. Capped at the
    /// number of standbys in the cluster (replicas - 1).
    #[serde(default)]
    #[schemars(range(min = 0, max = 9))]
    pub synchronous: u32,

    /// Makes this copy a replica cluster of another cluster's database: its designated
    /// primary (the instance `status.primary` names) streams from this address, as a hot
    /// standby, and its other instances stream from the designated primary. Nothing in a
    /// replica cluster accepts writes: `<name>-rw` has no endpoints, `<name>-ro` serves
    /// reads, and nothing is ever promoted (condition `ReadOnly`, reason
    /// `ReplicaCluster`). The `<name>-instance` and `<name>-app` Secrets must hold the
    /// source's passwords (its data is a copy of the source's). An instance that holds
    /// another database's data is copied anew, its old data directory kept beside.
    /// Set it when the copy is created: the pods read the Secrets when they start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_of: Option<ReplicaSource>,

    /// On the federation hub: how the copies in different member clusters relate.
    /// Independent (default): each cluster's copy is a database of its own. ReplicaClusters:
    /// one cluster holds the primary (`primaryCluster`) and every other cluster's copy is a
    /// replica cluster of it (the hub sets its `replicaOf` and copies the primary cluster's
    /// Secrets there first). Once the hub has recorded a primary cluster
    /// (`status.primaryCluster`) the copies stay replica clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub across_clusters: Option<AcrossClusters>,

    /// On the federation hub, with ReplicaClusters (setting it implies ReplicaClusters):
    /// the member cluster that holds the primary. Unset: the first cluster of the placement,
    /// in the order the policy's `clusterAffinity.clusterNames` lists them (by name for
    /// clusters it does not list). Read when the hub first records the primary cluster;
    /// changing it afterwards does not move the primary (a switchover does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"))]
    pub primary_cluster: Option<String>,
}

/// How a federated database's copies in different member clusters relate.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AcrossClusters {
    /// Each cluster's copy is a database of its own.
    #[default]
    Independent,
    /// One cluster holds the primary; the others stream from it as replica clusters.
    ReplicaClusters,
}

/// The role of a cluster's copy of a federated database with replica clusters.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterRole {
    /// Holds the primary: the only cluster whose copy accepts writes.
    Primary,
    /// A replica cluster: streams from the primary cluster and serves reads.
    Replica,
}

/// The reason of a replica cluster's `ReadOnly` and `PrimaryAvailable` conditions.
pub const REASON_REPLICA_CLUSTER: &str = "ReplicaCluster";

/// Where a replica cluster streams from: the source cluster's primary, at an address
/// this cluster reaches.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaSource {
    /// Host name or IP address of the source's primary.
    #[schemars(regex(pattern = r"^[A-Za-z0-9]([A-Za-z0-9.:-]{0,251}[A-Za-z0-9])?$"))]
    pub host: String,

    /// PostgreSQL's port there.
    #[serde(default = "default_postgres_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

fn default_postgres_port() -> i32 {
    5432
}

fn default_replicas() -> i32 {
    1
}

fn default_version() -> String {
    "14".to_string()
}

/// Storage for each replica's data volume.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseStorage {
    /// Size of each replica's volume, as a Kubernetes quantity (for example 1Gi).
    #[serde(default = "default_storage_size")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"))]
    pub size: String,

    /// StorageClass for the volumes; empty uses the cluster's default class. Tenants may
    /// set a default for this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,

    /// What happens to the volumes when this MyDatabase is deleted. Retain (default): the
    /// PersistentVolumeClaims stay, labelled `example.com/released: "true"`, and a new
    /// MyDatabase of the same name in the same namespace reuses them. Delete: the claims
    /// are deleted, but only when a user deleted the database (directly in a cluster, or
    /// its federation template on the hub); a copy the hub moves to another cluster or
    /// removes on unjoin always keeps its volumes. Set at creation, like the rest of
    /// spec.storage; kept claims can always be deleted by hand (docs/mydatabase.md).
    #[serde(default)]
    pub reclaim_policy: ReclaimPolicy,
}

/// What happens to a database's volumes when it is deleted.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReclaimPolicy {
    /// Keep the volume claims, labelled `example.com/released: "true"`, for reuse by a
    /// MyDatabase of the same name or deletion by hand.
    #[default]
    Retain,
    /// Delete the volume claims when a user deletes the database; never when the
    /// federation hub moves the copy away from a cluster.
    Delete,
}

fn default_storage_size() -> String {
    "1Gi".to_string()
}

impl Default for DatabaseStorage {
    fn default() -> Self {
        DatabaseStorage {
            size: default_storage_size(),
            storage_class_name: None,
            reclaim_policy: ReclaimPolicy::default(),
        }
    }
}

impl Default for MyDatabaseSpec {
    fn default() -> Self {
        MyDatabaseSpec {
            replicas: default_replicas(),
            version: default_version(),
            image: None,
            storage: DatabaseStorage::default(),
            resources: None,
            read_only: false,
            topology: None,
        }
    }
}

/// Lifecycle phase of a MyDatabase.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DatabasePhase {
    /// Accepted, nothing created yet.
    #[default]
    Pending,
    /// The StatefulSet exists and replicas are starting or updating.
    Provisioning,
    /// Every replica is ready and the database accepts writes.
    Ready,
    /// Some replicas are not ready, or a requested change was refused.
    Degraded,
    /// Serving reads only: requested by `spec.readOnly` or fenced because the hub is unreachable.
    ReadOnly,
    /// Being deleted.
    Deleting,
}

/// Observed state of a MyDatabase.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MyDatabaseStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Lifecycle phase: Pending, Provisioning, Ready, Degraded, ReadOnly or Deleting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<DatabasePhase>,

    /// Replicas that exist (on the hub: summed over member clusters).
    #[serde(default)]
    pub replicas: i32,

    /// Replicas that pass their readiness probe (on the hub: summed over reachable clusters).
    #[serde(default)]
    pub ready_replicas: i32,

    /// Replicas that run the current spec (its version): counted from the StatefulSet
    /// once its controller has seen the latest spec, 0 before (on the hub: summed over
    /// reachable clusters). A rollout judges a cluster's copy by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,

    /// Ready, Progressing, ReadOnly and Degraded, in the metav1.Condition shape.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// On the hub only: one row per member cluster the database is placed in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub clusters: Vec<DatabaseClusterStatus>,

    /// On the hub, with replica clusters: the member cluster that holds the primary, as
    /// the hub recorded it (it does not move when `spec.topology.primaryCluster` changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_cluster: Option<String>,

    /// On the hub, with replica clusters: the last switchover the hub gave up (the old
    /// primary cluster took writes again). The hub does not try a switchover to the same
    /// cluster again until it is asked anew (`bulkhead switchover` clears this record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aborted_switchover: Option<AbortedSwitchover>,

    /// On the hub, with replica clusters: the federation's primary term (absent: 1). A
    /// switchover and a disaster promotion raise it; a copy written under a lower term
    /// never takes a write (its agent keeps it read-only until the hub writes it anew).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_term: Option<u64>,

    /// On the hub, with replica clusters: the planned switchover whose new primary
    /// cluster has every write of the old one, and the primary term the hub raised for it
    /// (recorded before any member holds the raised term, kept once done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switchover: Option<PlannedSwitchover>,

    /// On the hub, with replica clusters: the last disaster promotion asked for with
    /// `bulkhead promote --accept-data-loss`, done or refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promotion: Option<DisasterPromotion>,

    /// In a member: the instance (pod) the agent made primary. Recorded before the
    /// instance is promoted, so a restarted agent or an old primary finds the decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,

    /// In a member: the term of the current primary, raised before every promotion. An
    /// instance refuses a lower term than it has seen, so an old primary never takes a
    /// write again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub term: u64,

    /// In a member: where other clusters reach the recorded primary's PostgreSQL (its
    /// pod's address from outside the cluster), the source a replica cluster streams
    /// from (`spec.topology.replicaOf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<ReplicaSource>,

    /// In a member: each instance as its instance manager reported it last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub instances: Vec<DatabaseInstanceStatus>,
}

/// A switchover the hub gave up: it had not promoted the new primary cluster by the
/// deadline, and the old primary cluster takes writes again.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AbortedSwitchover {
    /// The primary cluster, which keeps the primary.
    pub from: String,
    /// The cluster the primary was to move to.
    pub to: String,
    /// When the hub gave it up (RFC 3339).
    pub time: String,
    /// Where it stood and why it did not go on.
    pub message: String,
}

/// A planned switchover (`bulkhead switchover`, `spec.topology.primaryCluster`) once the
/// new primary cluster had received the old one's last WAL position: the term raised for
/// it. The new primary cluster promotes only once every member the hub reaches holds it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PlannedSwitchover {
    /// The primary cluster the primary moves from.
    pub from: String,
    /// The cluster it moves to.
    pub to: String,
    /// When the switchover started (RFC 3339; the old primary cluster's copy carries it
    /// in `federation.example.com/switchover-started`): a switchover asked again after an
    /// abort raises a term of its own.
    pub started: String,
    /// When the hub raised the term (RFC 3339).
    pub time: String,
    /// The primary term raised for it.
    pub term: u64,
    /// When the hub recorded that it tells the new primary cluster to promote (RFC 3339),
    /// written before it does: from then on the switchover only goes forward (no deadline),
    /// also for a hub that restarts and cannot see that cluster's copy. Empty before.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub promoting: String,
}

/// A promotion of a replica cluster while the primary cluster is lost, accepting the
/// loss of what it had not sent.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DisasterPromotion {
    /// The cluster that was lost: the primary cluster, or the target of a switchover
    /// that had told it to promote.
    pub from: String,
    /// The cluster asked to hold the primary.
    pub to: String,
    /// When the hub recorded it (RFC 3339).
    pub time: String,
    /// The primary term it raised (0 when refused).
    #[serde(default)]
    pub term: u64,
    /// Refused: why (nothing changed). Empty when done.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub refused: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One PostgreSQL instance of a database in a member cluster.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseInstanceStatus {
    /// The pod's name.
    pub name: String,
    /// `Primary` or `Standby` as PostgreSQL runs now; empty while the instance does not
    /// answer or PostgreSQL is not running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// PostgreSQL accepts connections.
    #[serde(default)]
    pub ready: bool,
    /// The highest term the instance has seen.
    #[serde(default)]
    pub term: u64,
    /// WAL position: a primary's write position, a standby's received position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lsn: Option<String>,
    /// For a standby: bytes of WAL behind the primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_bytes: Option<u64>,
    /// What the instance is doing, in words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The state of one placement of a MyDatabase in a member cluster (hub only).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseClusterStatus {
    /// Member cluster name.
    pub name: String,

    /// Replicas placed in this cluster.
    #[serde(default)]
    pub replicas: i32,

    /// Replicas ready in this cluster when it was last seen; 0 while it is unreachable.
    #[serde(default)]
    pub ready_replicas: i32,

    /// The member copy reports that it serves read-only.
    #[serde(default)]
    pub read_only: bool,

    /// The hub cannot reach this cluster and assumes its agent has fenced the database
    /// read-only (the agent does so when the hub's lease goes stale).
    #[serde(default)]
    pub fenced: bool,

    /// Phase reported by the member copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<DatabasePhase>,

    /// When the hub last read this cluster's copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<Time>,

    /// With replica clusters: Primary or Replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<ClusterRole>,

    /// A replica cluster: bytes of WAL its designated primary has received less than the
    /// primary cluster's primary has written, from the positions both clusters last
    /// reported (the agents refresh them at least every 30 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn storage_schema() -> Value {
        let crd = crate::api::mydatabase_crd();
        let v1 = crd.spec.versions.iter().find(|v| v.name == "v1").unwrap();
        let schema = serde_json::to_value(&v1.schema.as_ref().unwrap().open_api_v3_schema).unwrap();
        schema["properties"]["spec"]["properties"]["storage"].clone()
    }

    /// The API server's structural defaulting, enough for `spec.storage`: a missing
    /// property with a `default` gets it, recursively into objects.
    fn apply_defaults(schema: &Value, value: &mut Value) {
        let Some(properties) = schema["properties"].as_object() else {
            return;
        };
        let Some(object) = value.as_object_mut() else {
            return;
        };
        for (name, property) in properties {
            if !object.contains_key(name)
                && let Some(default) = property.get("default")
            {
                object.insert(name.clone(), default.clone());
            }
            if let Some(child) = object.get_mut(name) {
                apply_defaults(property, child);
            }
        }
    }

    #[test]
    fn reclaim_policy_is_a_documented_enum_defaulting_to_retain() {
        let storage = storage_schema();
        let policy = &storage["properties"]["reclaimPolicy"];
        assert_eq!(policy["enum"], json!(["Retain", "Delete"]));
        assert_eq!(policy["default"], "Retain");
        let description = policy["description"].as_str().unwrap();
        assert!(
            description.contains("Retain (default)") && description.contains("Delete:"),
            "each value is explained for kubectl explain: {description}"
        );
        assert_eq!(
            storage["default"],
            json!({"size": "1Gi", "reclaimPolicy": "Retain"})
        );
        assert_eq!(
            storage["x-kubernetes-validations"][0]["rule"],
            "self == oldSelf"
        );
    }

    /// The CEL rule `self == oldSelf` compares defaulted objects: the API server defaults
    /// the stored object when it reads it from etcd (oldSelf) and the request (self). An
    /// object stored before reclaimPolicy existed therefore still updates.
    #[test]
    fn an_object_stored_without_reclaim_policy_still_passes_the_immutability_rule() {
        let schema = storage_schema();
        let mut stored = json!({"size": "1Gi"});
        apply_defaults(&schema, &mut stored);
        for request in [
            json!({"size": "1Gi"}),
            json!({"size": "1Gi", "reclaimPolicy": "Retain"}),
        ] {
            let mut request = request;
            apply_defaults(&schema, &mut request);
            assert_eq!(request, stored, "self == oldSelf holds");
        }
        let mut spec = json!({"replicas": 1});
        apply_defaults(
            &json!({"properties": {"storage": schema.clone()}}),
            &mut spec,
        );
        assert_eq!(spec["storage"], stored, "no storage at all defaults alike");
        let mut switched = json!({"size": "1Gi", "reclaimPolicy": "Delete"});
        apply_defaults(&schema, &mut switched);
        assert_ne!(switched, stored, "changing the policy is a change");
    }

    #[test]
    fn a_spec_without_the_field_reads_as_retain() {
        let spec: MyDatabaseSpec =
            serde_json::from_value(json!({"storage": {"size": "2Gi"}})).unwrap();
        assert_eq!(spec.storage.reclaim_policy, ReclaimPolicy::Retain);
        let delete: DatabaseStorage =
            serde_json::from_value(json!({"size": "2Gi", "reclaimPolicy": "Delete"})).unwrap();
        assert_eq!(delete.reclaim_policy, ReclaimPolicy::Delete);
        assert!(
            serde_json::from_value::<DatabaseStorage>(json!({"reclaimPolicy": "Recycle"})).is_err()
        );
    }
}
