//! `MyDatabase` `example.com/v1alpha1`: the older shape, served beside `v1` (the storage
//! version) through the conversion webhook. Fields: `instances` = `replicas`,
//! `postgresVersion` = `version`, `storageSize` = `storage.size`, `storageClass` =
//! `storage.storageClassName`. What v1alpha1 lacks (`image`, `resources`, `readOnly`,
//! `storage.reclaimPolicy`) survives a round trip in the annotation `example.com/v1-spec`.
//! An object created through v1alpha1 has no such annotation and gets the v1 defaults,
//! `reclaimPolicy: Retain` included: a v1alpha1 client can never ask for volumes to be
//! deleted.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The annotation holding the v1 spec while an object is read as v1alpha1.
pub const V1_SPEC_ANNOTATION: &str = "example.com/v1-spec";

/// A PostgreSQL database (deprecated v1alpha1 shape; use example.com/v1).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "example.com",
    version = "v1alpha1",
    kind = "MyDatabase",
    plural = "mydatabases",
    singular = "mydatabase",
    shortname = "db",
    namespaced,
    doc = "A PostgreSQL database (v1alpha1 shape, served through the conversion webhook; prefer example.com/v1).",
    status = "crate::api::MyDatabaseStatus",
    derive = "PartialEq",
    scale(
        spec_replicas_path = ".spec.instances",
        status_replicas_path = ".status.replicas"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".spec.instances",
        description = "Desired replicas"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Ready replicas"
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".spec.postgresVersion",
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
    /// Number of replicas, 1 to 10 (v1: spec.replicas).
    #[serde(default = "default_instances")]
    #[schemars(range(min = 1, max = 10))]
    pub instances: i32,
    /// PostgreSQL version (v1: spec.version).
    #[serde(default = "default_version")]
    #[schemars(regex(pattern = r"^[0-9]{1,2}(\.[0-9]{1,2})?$"))]
    pub postgres_version: String,
    /// Volume size per replica (v1: spec.storage.size).
    #[serde(default = "default_size")]
    pub storage_size: String,
    /// StorageClass (v1: spec.storage.storageClassName).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
}

fn default_instances() -> i32 {
    1
}
fn default_version() -> String {
    "14".into()
}
fn default_size() -> String {
    "1Gi".into()
}
