//! The Kubernetes API types Bulkhead defines, one file per kind.

// kube's printcolumn(...) attributes repeat keys such as `type_` by design.
#![allow(clippy::duplicated_attributes)]

pub mod condition;
pub mod instance;
pub mod member_cluster;
pub mod mydatabase;
pub mod mydatabase_v1alpha1;
pub mod override_policy;
pub mod propagation_policy;
pub mod resource_binding;
pub mod resource_interpreter;
pub mod rollout;

pub use condition::{
    ConditionStatus, find_condition, is_condition_true, new_condition, set_condition,
};
pub use member_cluster::{MemberCluster, MemberClusterSpec, MemberClusterStatus};
pub use mydatabase::{MyDatabase, MyDatabaseSpec, MyDatabaseStatus};
pub use override_policy::{
    ClusterOverridePolicy, ClusterOverridePolicySpec, OverridePolicy, OverrideSpec,
};
pub use propagation_policy::{
    ClusterPropagationPolicy, ClusterPropagationPolicySpec, PropagationPolicy, PropagationSpec,
};
pub use resource_binding::{ResourceBinding, ResourceBindingSpec, ResourceBindingStatus};
pub use resource_interpreter::{ResourceInterpreter, ResourceInterpreterSpec};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The Bulkhead image of this version: the hub, the agent, and the init container that
/// puts `bulkhead instance` into every database pod.
pub const DEFAULT_IMAGE: &str = concat!("bulkhead:", env!("CARGO_PKG_VERSION"));

/// Label on every object the hub creates in a member.
pub const LABEL_MANAGED_BY: &str = "federation.example.com/managed-by";
/// Annotation (value `"true"`) the hub sets on a member copy, just before deleting it,
/// only when the user deleted the hub template. It tells the member's agent that the
/// deletion is the user's, so `spec.storage.reclaimPolicy: Delete` may delete the volumes;
/// a copy deleted without it (placement change, unjoin) always keeps them.
pub const ANNOTATION_TEMPLATE_DELETED: &str = "federation.example.com/template-deleted";
/// Annotation on every member copy: a hash of everything else the hub applied. The hub
/// keeps only a summary of each copy (not its body), and tells by this hash whether the
/// copy already holds what it would apply.
pub const ANNOTATION_APPLIED_HASH: &str = "federation.example.com/applied-hash";
/// Annotation on every member copy of a hub MyDatabase with replica clusters: the member
/// cluster that holds the primary, recorded with the copies themselves.
pub const ANNOTATION_PRIMARY_CLUSTER: &str = "federation.example.com/primary-cluster";
/// Annotation on the copies of a hub MyDatabase while the hub moves its primary to
/// another cluster (a switchover): the cluster it moves to.
pub const ANNOTATION_SWITCHOVER_TO: &str = "federation.example.com/switchover-to";
/// Annotation on the old primary cluster's copy during a switchover: when the hub started
/// it (RFC 3339). A switchover that has not promoted the new primary cluster by the
/// deadline is aborted from it.
pub const ANNOTATION_SWITCHOVER_STARTED: &str = "federation.example.com/switchover-started";
/// Annotation on the new primary cluster's copy once the hub told it to promote (the old
/// primary cluster's name): from then on the switchover only goes forward.
pub const ANNOTATION_SWITCHOVER_PROMOTED: &str = "federation.example.com/switchover-promoted";
/// Annotation on a hub MyDatabase with replica clusters, set by `bulkhead promote
/// --accept-data-loss`: the cluster to promote while the primary cluster is lost. The hub
/// removes it once the promotion is recorded (or refused: `status.promotion` says why).
pub const ANNOTATION_PROMOTE: &str = "federation.example.com/promote";
/// Annotation on a member copy of a MyDatabase with replica clusters: the federation's
/// primary term it was written under (absent: 1). A switchover or a disaster promotion raises the term.
pub const ANNOTATION_PRIMARY_TERM: &str = "federation.example.com/primary-term";
/// Annotation on the hub's fencing Lease in each member: a JSON object of `namespace/name`
/// to the primary term of each MyDatabase whose term a switchover or a disaster promotion raised. A copy
/// written under a lower term is deposed: its agent keeps it read-only, whatever the
/// Lease's freshness, until the hub writes it anew under the new term.
pub const ANNOTATION_PRIMARY_TERMS: &str = "federation.example.com/primary-terms";
/// Label naming the template a member copy belongs to: a hash of `<namespace>.<name>`
/// (always a valid label value); the annotation of the same key holds the full name.
pub const LABEL_BINDING: &str = "federation.example.com/binding";
/// Label/annotation naming an object's tenant.
pub const LABEL_TENANT: &str = "federation.example.com/tenant";
/// Finalizer on hub templates until member copies are cleaned up.
pub const FINALIZER_CLEANUP: &str = "federation.example.com/cleanup";
/// Namespace Bulkhead's own objects live in, on the hub and in members.
pub const SYSTEM_NAMESPACE: &str = "bulkhead-system";

/// Every CRD Bulkhead defines, with the file name it is committed under in `config/crd/`.
pub fn all_crds() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("example.com_mydatabases.yaml", mydatabase_crd()),
        (
            "federation.example.com_memberclusters.yaml",
            MemberCluster::crd(),
        ),
        (
            "federation.example.com_propagationpolicies.yaml",
            PropagationPolicy::crd(),
        ),
        (
            "federation.example.com_clusterpropagationpolicies.yaml",
            ClusterPropagationPolicy::crd(),
        ),
        (
            "federation.example.com_resourcebindings.yaml",
            resource_binding_crd(),
        ),
        (
            "federation.example.com_resourceinterpreters.yaml",
            ResourceInterpreter::crd(),
        ),
        (
            "federation.example.com_overridepolicies.yaml",
            OverridePolicy::crd(),
        ),
        (
            "federation.example.com_clusteroverridepolicies.yaml",
            ClusterOverridePolicy::crd(),
        ),
    ]
}

/// The ResourceBinding CRD, without the status subresource: the hub is the only writer of
/// a binding, and one scheduling decision (spec plus its explanation in status) must cost
/// one write (DESIGN.md section 9). The scheduler and the propagator each server-side
/// apply their own fields (docs/placement.md, "One write per decision").
pub fn resource_binding_crd() -> CustomResourceDefinition {
    let mut crd = ResourceBinding::crd();
    for version in &mut crd.spec.versions {
        version.subresources = None;
    }
    crd
}

/// The MyDatabase CRD: `v1` (served, storage) and `v1alpha1`. v1alpha1 ships with
/// `served: false` because it needs the conversion webhook; `bulkhead webhook` turns it
/// on together with the webhook's client configuration when it installs itself.
pub fn mydatabase_crd() -> CustomResourceDefinition {
    let mut crd = kube::core::crd::merge_crds(
        vec![MyDatabase::crd(), mydatabase_v1alpha1::MyDatabase::crd()],
        "v1",
    )
    .expect("both MyDatabase versions share group, kind and scope");
    for version in &mut crd.spec.versions {
        if version.name == "v1alpha1" {
            version.served = false;
        }
    }
    crd
}

/// Renders a CRD as YAML, the form committed in `config/crd/` and printed by `bulkhead crd`.
pub fn crd_yaml(crd: &CustomResourceDefinition) -> String {
    let body = serde_yaml::to_string(crd).expect("a CRD always serializes");
    format!(
        "# Generated by `bulkhead crd`; do not edit. Run `make crds` after changing src/api/.\n{body}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn crd(name: &str) -> CustomResourceDefinition {
        all_crds()
            .into_iter()
            .map(|(_, crd)| crd)
            .find(|crd| crd.metadata.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no CRD {name}"))
    }

    fn schema(crd: &CustomResourceDefinition) -> Value {
        let version = &crd.spec.versions[0];
        serde_json::to_value(&version.schema.as_ref().unwrap().open_api_v3_schema).unwrap()
    }

    fn at<'a>(value: &'a Value, path: &str) -> &'a Value {
        path.split('.').fold(value, |v, key| &v["properties"][key])
    }

    fn printer_columns(crd: &CustomResourceDefinition) -> Vec<String> {
        crd.spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.clone())
            .collect()
    }

    #[test]
    fn mydatabase_crd_matches_the_design() {
        let crd = crd("mydatabases.example.com");
        assert_eq!(crd.spec.group, "example.com");
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.short_names, Some(vec!["db".to_string()]));
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1");
        assert!(version.storage && version.served);
        assert_eq!(
            printer_columns(&crd),
            ["Replicas", "Ready", "Version", "Phase", "Age"]
        );
        let subresources = version.subresources.as_ref().unwrap();
        assert!(subresources.status.is_some());
        let scale = subresources.scale.as_ref().unwrap();
        assert_eq!(scale.spec_replicas_path, ".spec.replicas");
        assert_eq!(scale.status_replicas_path, ".status.replicas");

        let schema = schema(&crd);
        let replicas = at(&schema, "spec.replicas");
        assert_eq!(replicas["minimum"], 1.0);
        assert_eq!(replicas["maximum"], 10.0);
        assert_eq!(at(&schema, "spec.version")["default"], "14");
        assert!(at(&schema, "spec.version")["pattern"].is_string());
        let storage_rules = &at(&schema, "spec.storage")["x-kubernetes-validations"];
        assert_eq!(storage_rules[0]["rule"], "self == oldSelf");
        let phases: Vec<&str> = at(&schema, "status.phase")["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(
            phases,
            [
                "Pending",
                "Provisioning",
                "Ready",
                "Degraded",
                "ReadOnly",
                "Deleting"
            ]
        );
        assert_eq!(
            at(&schema, "status.conditions")["x-kubernetes-list-type"],
            "map"
        );
    }

    #[test]
    fn membercluster_crd_matches_the_design() {
        let crd = crd("memberclusters.federation.example.com");
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.short_names, Some(vec!["mc".to_string()]));
        assert_eq!(crd.spec.versions[0].name, "v1alpha1");
        assert!(
            crd.spec.versions[0]
                .subresources
                .as_ref()
                .unwrap()
                .status
                .is_some()
        );
        assert!(printer_columns(&crd).contains(&"Ready".to_string()));
        let schema = schema(&crd);
        let required = at(&schema, "spec")["required"].as_array().unwrap();
        assert!(required.contains(&"secretRef".into()) && required.contains(&"zone".into()));
        assert_eq!(at(&schema, "spec.probe.intervalSeconds")["default"], 5);
        assert_eq!(at(&schema, "spec.probe.timeoutSeconds")["default"], 3);
        assert_eq!(at(&schema, "spec.probe.failureThreshold")["default"], 3);
        assert_eq!(at(&schema, "spec.probe.successThreshold")["default"], 2);
        assert!(at(&schema, "spec.zone")["pattern"].is_string());
        let states = &at(&schema, "status.zoneState")["enum"];
        assert_eq!(
            states,
            &serde_json::json!(["Normal", "PartialDisruption", "FullDisruption"])
        );
    }

    #[test]
    fn both_policy_kinds_share_one_spec_schema() {
        let namespaced = crd("propagationpolicies.federation.example.com");
        let cluster = crd("clusterpropagationpolicies.federation.example.com");
        assert_eq!(namespaced.spec.scope, "Namespaced");
        assert_eq!(cluster.spec.scope, "Cluster");
        let mut namespaced_spec = at(&schema(&namespaced), "spec").clone();
        let mut cluster_spec = at(&schema(&cluster), "spec").clone();
        // Only the top-level description differs.
        namespaced_spec["description"] = Value::Null;
        cluster_spec["description"] = Value::Null;
        assert_eq!(namespaced_spec, cluster_spec);

        let schema = schema(&namespaced);
        assert_eq!(at(&schema, "spec.resourceSelectors")["minItems"], 1);
        let scheduling = at(&schema, "spec.placement.replicaScheduling");
        assert_eq!(
            at(scheduling, "type")["enum"],
            serde_json::json!(["Duplicated", "Divided"])
        );
        assert_eq!(
            at(scheduling, "divisionPreference")["enum"],
            serde_json::json!(["Weighted", "Aggregated"])
        );
        let weight =
            &at(scheduling, "weightPreference.staticWeightList")["items"]["properties"]["weight"];
        assert_eq!(weight["minimum"], 0.0);
        let spread = &at(&schema, "spec.placement.spreadConstraints")["items"];
        assert_eq!(
            at(spread, "spreadByField")["enum"],
            serde_json::json!(["zone", "region", "cluster"])
        );
        assert_eq!(
            at(&schema, "spec.failover.stateless.tolerationSeconds")["default"],
            60
        );
        assert_eq!(
            at(&schema, "spec.failover.stateful")["enum"],
            serde_json::json!(["Fence", "Preserve"])
        );
        assert_eq!(
            at(&schema, "spec.conflictResolution")["enum"],
            serde_json::json!(["Abort", "Overwrite"])
        );
    }

    #[test]
    fn resourcebinding_crd_matches_the_design() {
        let crd = crd("resourcebindings.federation.example.com");
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.short_names, Some(vec!["rb".to_string()]));
        assert!(
            crd.spec.versions[0].subresources.is_none(),
            "no status subresource: a decision and its explanation are one write"
        );
        let schema = schema(&crd);
        for field in ["resource", "policy", "replicas", "clusters"] {
            assert!(
                at(&schema, "spec")["properties"][field].is_object(),
                "spec.{field}"
            );
        }
        for field in ["conditions", "decisions", "clusters"] {
            assert!(
                at(&schema, "status")["properties"][field].is_object(),
                "status.{field}"
            );
        }
        let health = &at(&schema, "status.clusters")["items"]["properties"]["health"]["enum"];
        assert_eq!(
            health,
            &serde_json::json!(["Healthy", "Unhealthy", "Unknown"])
        );
    }

    /// `kubectl explain` must read well: every field of every CRD has a description.
    #[test]
    fn every_field_has_a_description() {
        fn walk(path: &str, schema: &Value, missing: &mut Vec<String>) {
            if let Some(properties) = schema["properties"].as_object() {
                for (name, property) in properties {
                    let path = format!("{path}.{name}");
                    if property["description"].as_str().is_none_or(str::is_empty) {
                        missing.push(path.clone());
                    }
                    walk(&path, property, missing);
                }
            }
            if schema["items"].is_object() {
                walk(&format!("{path}[]"), &schema["items"], missing);
            }
            if schema["additionalProperties"].is_object() {
                walk(
                    &format!("{path}{{}}"),
                    &schema["additionalProperties"],
                    missing,
                );
            }
        }
        let mut missing = vec![];
        for (_, crd) in all_crds() {
            let schema = schema(&crd);
            for top in ["spec", "status"] {
                if schema["properties"][top].is_object() {
                    let name = format!("{}.{top}", crd.spec.names.kind);
                    if schema["properties"][top]["description"].as_str().is_none() && top == "spec"
                    {
                        missing.push(name.clone());
                    }
                    walk(&name, &schema["properties"][top], &mut missing);
                }
            }
        }
        assert!(
            missing.is_empty(),
            "fields without a description: {missing:#?}"
        );
    }

    #[test]
    fn crd_yaml_round_trips() {
        for (_, crd) in all_crds() {
            let yaml = crd_yaml(&crd);
            assert!(yaml.starts_with("# Generated by `bulkhead crd`"));
            let parsed: CustomResourceDefinition = serde_yaml::from_str(&yaml).unwrap();
            assert_eq!(parsed, crd);
        }
    }
}
