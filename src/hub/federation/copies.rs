//! Member copies of hub templates (DESIGN.md section 4), pure: what the hub server-side
//! applies to a member, whether an object already there is ours, and whether it already
//! matches (so an unchanged copy costs no write).

use serde_json::{Map, Value};

use crate::api::propagation_policy::ConflictResolution;
use crate::api::{ANNOTATION_APPLIED_HASH, LABEL_BINDING, LABEL_MANAGED_BY};
use crate::hub::federation::interpreter::Interpretation;

/// Value of the managed-by label on every copy.
pub const MANAGED_BY: &str = "bulkhead";

/// Metadata fields that belong to the hub's copy of the object, not to the template.
const SERVER_METADATA: [&str; 9] = [
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "ownerReferences",
    "finalizers",
];

/// The binding label value: a hash of `<namespace>.<name>` that always fits a label
/// value (63 characters; a namespace and a name can be 63 and 253). The full name is in
/// the annotation of the same key ([`binding_annotation`]).
pub fn binding_label(namespace: &str, name: &str) -> String {
    let full = binding_annotation(namespace, name);
    format!(
        "b{:016x}",
        crate::hub::federation::placement::stable_hash(&full, "binding")
    )
}

/// The binding annotation value: `<namespace>.<name>` of the hub template.
pub fn binding_annotation(namespace: &str, name: &str) -> String {
    format!("{namespace}.{name}")
}

/// The object the hub applies to a member: the template without server-owned metadata,
/// status or hub finalizers, with the managed-by and binding labels (and the binding
/// annotation with the template's full name), and `spec.replicas` set to the cluster's
/// share for divided kinds (at the kind's replica path). The fields the kind's
/// interpretation gives to the member are left to it (a Service's addresses, except
/// `clusterIP: None`, which makes it headless); a StatefulSet copy always retains its
/// volume claims (a copy removed by a placement change must keep its data).
pub fn member_copy(
    template: &Value,
    binding: &str,
    replicas: Option<i32>,
    interpretation: &Interpretation,
) -> Value {
    let mut copy = Map::new();
    copy.insert("apiVersion".into(), template["apiVersion"].clone());
    copy.insert("kind".into(), template["kind"].clone());
    let mut metadata = template["metadata"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for field in SERVER_METADATA {
        metadata.remove(field);
    }
    if let Some(annotations) = metadata
        .get_mut("annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        // `bulkhead rollout` commands are for the hub, not the members.
        annotations.remove(crate::api::rollout::ANNOTATION_ROLLOUT_COMMAND);
        if annotations.is_empty() {
            metadata.remove("annotations");
        }
    }
    let labels = metadata
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(labels) = labels.as_object_mut() {
        labels.insert(LABEL_MANAGED_BY.into(), Value::String(MANAGED_BY.into()));
        labels.insert(LABEL_BINDING.into(), Value::String(binding.into()));
    }
    let full_name = binding_annotation(
        template["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default(),
        template["metadata"]["name"].as_str().unwrap_or_default(),
    );
    if let Some(annotations) = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
    {
        annotations.insert(LABEL_BINDING.into(), Value::String(full_name));
    }
    copy.insert("metadata".into(), Value::Object(metadata));
    for (key, value) in template.as_object().into_iter().flatten() {
        if !matches!(key.as_str(), "apiVersion" | "kind" | "metadata" | "status") {
            copy.insert(key.clone(), value.clone());
        }
    }
    let headless = interpretation.quirks.keeps_headless
        && template["spec"]["clusterIP"].as_str() == Some("None");
    let mut copy = Value::Object(copy);
    interpretation.strip_member_owned(&mut copy);
    if headless {
        // Allocated by the hub's API server from the hub's range, each member allocates
        // its own address; `None` is not an address but the headless choice.
        copy["spec"]["clusterIP"] = Value::String("None".into());
    }
    if interpretation.quirks.retains_claims
        && let Some(spec) = copy.get_mut("spec").and_then(Value::as_object_mut)
    {
        spec.insert(
            "persistentVolumeClaimRetentionPolicy".into(),
            serde_json::json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
        );
    }
    if let Some(replicas) = replicas
        && let Some(path) = &interpretation.replicas
    {
        path.set(&mut copy, Value::from(replicas));
    }
    let hash = applied_hash(&copy);
    if let Some(annotations) = copy["metadata"]["annotations"].as_object_mut() {
        annotations.insert(ANNOTATION_APPLIED_HASH.into(), Value::String(hash));
    }
    copy
}

/// Recomputes a copy's applied-hash annotation over its body as it is now (after the
/// overrides changed it). The same body gives the same hash as [`member_copy`] gives it.
pub fn restamp(copy: &mut Value) {
    if let Some(annotations) = copy["metadata"]["annotations"].as_object_mut() {
        annotations.remove(ANNOTATION_APPLIED_HASH);
    }
    let hash = applied_hash(copy);
    if let Some(annotations) = copy["metadata"]
        .as_object_mut()
        .map(|m| {
            m.entry("annotations")
                .or_insert_with(|| Value::Object(Map::new()))
        })
        .and_then(Value::as_object_mut)
    {
        annotations.insert(ANNOTATION_APPLIED_HASH.into(), Value::String(hash));
    }
}

/// The hash of a copy's body (what [`ANNOTATION_APPLIED_HASH`] records), stable across
/// processes and versions: the same template gives the same hash on every hub.
pub fn applied_hash(copy: &Value) -> String {
    format!(
        "{:016x}",
        crate::hub::federation::placement::stable_hash(&copy.to_string(), "applied")
    )
}

/// The key of the applied-hash annotation.
pub const ANNOTATION_HASH_KEY: &str = ANNOTATION_APPLIED_HASH;

/// Whether an object found in a member is one of ours: it carries the managed-by label,
/// or (someone removed that label, which takes the copy out of the hub's watch) the
/// binding label the hub gives its copy of this very namespace and name.
pub fn is_managed(existing: &Value) -> bool {
    let metadata = &existing["metadata"];
    let labels = &metadata["labels"];
    labels[LABEL_MANAGED_BY].as_str() == Some(MANAGED_BY)
        || labels[LABEL_BINDING].as_str().is_some_and(|binding| {
            binding
                == binding_label(
                    metadata["namespace"].as_str().unwrap_or_default(),
                    metadata["name"].as_str().unwrap_or_default(),
                )
        })
}

/// What to do about an object of the same name already in a member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Nothing there, or ours: apply.
    Apply,
    /// Someone else's, and the policy says Overwrite: take it over.
    TakeOver,
    /// Someone else's under Abort: leave it alone and report this on the binding.
    Conflict(String),
}

/// Decides about `existing` (None when the member has no such object).
pub fn ownership(
    existing: Option<&Value>,
    resolution: ConflictResolution,
    cluster: &str,
) -> Ownership {
    match existing {
        None => Ownership::Apply,
        Some(object) if is_managed(object) => Ownership::Apply,
        Some(object) => match resolution {
            ConflictResolution::Overwrite => Ownership::TakeOver,
            ConflictResolution::Abort => Ownership::Conflict(format!(
                "{} {}/{} already exists in {cluster} and is not managed by Bulkhead; left untouched (set conflictResolution: Overwrite to take it over)",
                object["kind"].as_str().unwrap_or_default(),
                object["metadata"]["namespace"].as_str().unwrap_or_default(),
                object["metadata"]["name"].as_str().unwrap_or_default(),
            )),
        },
    }
}

/// True when every field of `desired` has the same value in `existing` (fields others
/// added, defaults and status are ignored): applying would change nothing.
pub fn already_matches(desired: &Value, existing: &Value) -> bool {
    match (desired, existing) {
        (Value::Object(want), Value::Object(have)) => want.iter().all(|(key, value)| {
            have.get(key)
                .is_some_and(|present| already_matches(value, present))
        }),
        (Value::Array(want), Value::Array(have)) => {
            want.len() == have.len() && want.iter().zip(have).all(|(w, h)| already_matches(w, h))
        }
        _ => desired == existing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy whose managed-by label someone removed is still the hub's (its binding
    /// label names it): applied again, which puts the label back, not a conflict.
    #[test]
    fn a_copy_without_its_managed_by_label_is_still_ours() {
        let unlabelled = serde_json::json!({"kind": "ConfigMap", "metadata": {
            "name": "settings", "namespace": "shop",
            "labels": {LABEL_BINDING: binding_label("shop", "settings")}}});
        assert_eq!(
            ownership(Some(&unlabelled), ConflictResolution::Abort, "east"),
            Ownership::Apply
        );
        let elsewhere = serde_json::json!({"kind": "ConfigMap", "metadata": {
            "name": "settings", "namespace": "shop",
            "labels": {LABEL_BINDING: binding_label("shop", "other")}}});
        assert!(matches!(
            ownership(Some(&elsewhere), ConflictResolution::Abort, "east"),
            Ownership::Conflict(_)
        ));
    }

    /// The copy with the built-in interpretation of the template's kind.
    fn copy_of(template: &Value, binding: &str, replicas: Option<i32>) -> Value {
        let interpretation = crate::hub::federation::interpreter::Interpreters::built_in().get(
            template["apiVersion"].as_str().unwrap_or_default(),
            template["kind"].as_str().unwrap_or_default(),
        );
        crate::hub::federation::copies::member_copy(template, binding, replicas, &interpretation)
    }
    use serde_json::json;

    fn template() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "42", "generation": 3,
                "creationTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["federation.example.com/cleanup"],
                "managedFields": [{}], "labels": {"app": "web"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "team": "a"}
            },
            "spec": {"replicas": 6, "template": {"spec": {"containers": [{"name": "web", "image": "nginx"}]}}},
            "status": {"replicas": 6}
        })
    }

    #[test]
    fn copies_carry_what_the_hub_owns_and_nothing_server_side() {
        let copy = copy_of(&template(), "shop.web", Some(4));
        assert_eq!(copy["spec"]["replicas"], 4);
        assert_eq!(copy["metadata"]["labels"]["app"], "web");
        assert_eq!(copy["metadata"]["labels"][LABEL_MANAGED_BY], MANAGED_BY);
        assert_eq!(copy["metadata"]["labels"][LABEL_BINDING], "shop.web");
        let hash = copy["metadata"]["annotations"][ANNOTATION_APPLIED_HASH].clone();
        assert_eq!(
            copy["metadata"]["annotations"],
            json!({"team": "a", LABEL_BINDING: "shop.web", ANNOTATION_APPLIED_HASH: hash})
        );
        // The hash covers the body: another share of replicas is another hash, the same
        // template the same one.
        let other = copy_of(&template(), "shop.web", Some(2));
        assert_ne!(
            other["metadata"]["annotations"][ANNOTATION_APPLIED_HASH],
            hash
        );
        let again = copy_of(&template(), "shop.web", Some(4));
        assert_eq!(
            again["metadata"]["annotations"][ANNOTATION_APPLIED_HASH],
            hash
        );
        for field in SERVER_METADATA {
            assert!(copy["metadata"].get(field).is_none(), "{field}");
        }
        assert!(copy.get("status").is_none());
        assert_eq!(copy["spec"]["template"], template()["spec"]["template"]);
    }

    #[test]
    fn the_binding_label_always_fits_and_the_annotation_has_the_full_name() {
        let namespace = "n".repeat(63);
        let name = "a-very-long-deployment-name-".repeat(9);
        let label = binding_label(&namespace, &name);
        assert!(label.len() <= 63, "{label}");
        assert!(
            label.chars().all(|c| c.is_ascii_alphanumeric()),
            "a valid label value: {label}"
        );
        assert_ne!(label, binding_label(&namespace, "other"));
        assert_eq!(label, binding_label(&namespace, &name), "stable");
        let template = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}});
        let copy = copy_of(&template, &label, None);
        assert_eq!(copy["metadata"]["labels"][LABEL_BINDING], label.as_str());
        assert_eq!(
            copy["metadata"]["annotations"][LABEL_BINDING],
            format!("{namespace}.{name}")
        );
    }

    #[test]
    fn headless_services_stay_headless() {
        let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db", "namespace": "shop"},
            "spec": {"clusterIP": "None", "clusterIPs": ["None"], "ports": [{"port": 5432}], "selector": {"app": "db"}}});
        let copy = copy_of(&service, "x", None);
        assert_eq!(copy["spec"]["clusterIP"], "None");
        assert!(copy["spec"].get("clusterIPs").is_none());
    }

    #[test]
    fn statefulset_copies_always_retain_their_claims() {
        let statefulset = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "pg", "namespace": "shop"},
            "spec": {"replicas": 3, "serviceName": "pg",
                     "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Delete"}}});
        let copy = copy_of(&statefulset, "x", Some(1));
        assert_eq!(
            copy["spec"]["persistentVolumeClaimRetentionPolicy"],
            json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
        );
        assert_eq!(copy["spec"]["replicas"], 1);
    }

    #[test]
    fn duplicated_kinds_keep_their_spec() {
        let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n"}, "data": {"k": "v"}});
        let copy = copy_of(&config, "n.c", Some(2));
        assert_eq!(copy["data"]["k"], "v");
        assert!(copy.get("spec").is_none());
    }

    #[test]
    fn services_leave_address_allocation_to_the_member() {
        let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.0.0.12", "clusterIPs": ["10.0.0.12"], "type": "NodePort",
                     "ports": [{"port": 80, "nodePort": 30080}], "selector": {"app": "web"}}});
        let copy = copy_of(&service, "shop.web", None);
        assert!(
            copy["spec"].get("clusterIP").is_none() && copy["spec"].get("clusterIPs").is_none()
        );
        assert!(copy["spec"]["ports"][0].get("nodePort").is_none());
        assert_eq!(copy["spec"]["ports"][0]["port"], 80);
        assert_eq!(copy["spec"]["selector"]["app"], "web");
    }

    #[test]
    fn foreign_objects_are_conflicts_unless_overwrite() {
        let ours = copy_of(&template(), "shop.web", Some(1));
        let theirs = json!({"kind": "Deployment", "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}}});
        assert_eq!(
            ownership(None, ConflictResolution::Abort, "east"),
            Ownership::Apply
        );
        assert_eq!(
            ownership(Some(&ours), ConflictResolution::Abort, "east"),
            Ownership::Apply
        );
        assert_eq!(
            ownership(Some(&theirs), ConflictResolution::Overwrite, "east"),
            Ownership::TakeOver
        );
        match ownership(Some(&theirs), ConflictResolution::Abort, "east") {
            Ownership::Conflict(message) => assert!(
                message.contains("Deployment shop/web already exists in east"),
                "{message}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unchanged_copy_needs_no_write() {
        let desired = copy_of(&template(), "shop.web", Some(4));
        let mut existing = desired.clone();
        existing["metadata"]["uid"] = json!("member-uid");
        existing["spec"]["progressDeadlineSeconds"] = json!(600);
        existing["status"] = json!({"readyReplicas": 4});
        assert!(
            already_matches(&desired, &existing),
            "server defaults and status do not count"
        );
        existing["spec"]["replicas"] = json!(3);
        assert!(
            !already_matches(&desired, &existing),
            "a drifted replica count does"
        );
    }
}
