//! The objects a chaos run writes: hub templates of every kind at a revision, the
//! policies placing them, the Shard kind federated mid-run, and the edits a person makes
//! to a member's copy. Pure JSON, no I/O.

use serde_json::{Value, json};

use super::schedule::{TemplateKind, claim_of, config_of};

/// The Shard custom kind (group `chaos.example.org`, the lab's member audit policy
/// records it with bodies): `spec.replicas` divided by its interpreter, `spec.note` a
/// field the nemesis edits.
pub fn shard_crd() -> Value {
    crate::support::test_crd(
        TemplateKind::Shard.group(),
        TemplateKind::Shard.kind(),
        TemplateKind::Shard.plural(),
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "replicas": {"type": "integer"}, "note": {"type": "string"}}}}}),
        false,
    )
}

/// The `--federate` argument that lets the hub write Shards in the members.
pub fn shard_federate_argument() -> String {
    format!(
        "{}.{}",
        TemplateKind::Shard.plural(),
        TemplateKind::Shard.group()
    )
}

/// The interpreter that makes Shard a stateful, divided kind.
pub fn shard_interpreter(name: &str) -> Value {
    json!({
        "apiVersion": "federation.example.com/v1alpha1", "kind": "ResourceInterpreter",
        "metadata": {"name": name},
        "spec": {"target": {"apiVersion": api_version(TemplateKind::Shard), "kind": "Shard"},
                 "replicas": ".spec.replicas", "stateful": true}
    })
}

/// `apiVersion` of a kind's objects.
pub fn api_version(kind: TemplateKind) -> String {
    match kind.group() {
        "" => "v1".to_string(),
        group => format!("{group}/v1"),
    }
}

/// The policy placing every template of `kind` in the namespace: divided by equal
/// weights over the three members. The Deployments' policy propagates their
/// dependencies and moves their replicas off a failed member after 5 s.
pub fn policy(namespace: &str, kind: TemplateKind) -> Value {
    let mut spec = json!({
        "resourceSelectors": [{"apiVersion": api_version(kind), "kind": kind.kind()}],
        "placement": {"replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted"}},
    });
    if kind == TemplateKind::Deployment {
        spec["propagateDeps"] = json!(true);
        spec["failover"] = json!({"stateless": {"tolerationSeconds": 5}});
    }
    json!({
        "apiVersion": "federation.example.com/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": format!("chaos-{}", kind.plural()), "namespace": namespace},
        "spec": spec,
    })
}

/// The kinds a policy selects (ConfigMaps and claims follow their Deployment instead).
pub const POLICY_KINDS: [TemplateKind; 4] = [
    TemplateKind::Database,
    TemplateKind::StatefulSet,
    TemplateKind::Deployment,
    TemplateKind::Shard,
];

/// The hub template `name` of `kind` with `replicas` (divided kinds) at `revision` (each
/// edit on the hub is a new revision: a new image, version or data).
pub fn template(kind: TemplateKind, name: &str, replicas: i64, revision: u32) -> Value {
    let metadata = json!({"name": name});
    match kind {
        TemplateKind::Database => json!({
            "apiVersion": "example.com/v1", "kind": "MyDatabase", "metadata": metadata,
            "spec": {"replicas": replicas, "version": database_version(revision),
                     "storage": {"size": "1Gi"}}
        }),
        TemplateKind::StatefulSet => crate::federation::statefulset_template(
            name,
            replicas,
            &format!("postgres:16.{revision}"),
        ),
        TemplateKind::Deployment => {
            let mut volumes = vec![];
            let mut mounts = vec![];
            // Every fourth revision stops naming the claim: the claim stays in the members.
            if revision % 4 != 3 {
                volumes.push(json!({"name": "data",
                    "persistentVolumeClaim": {"claimName": claim_of(name)}}));
                mounts.push(json!({"name": "data", "mountPath": "/data"}));
            }
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": "web", "image": format!("nginx:1.{revision}"),
                                    "envFrom": [{"configMapRef": {"name": config_of(name)}}],
                                    "volumeMounts": mounts}],
                                 "volumes": volumes}}
                }
            })
        }
        TemplateKind::ConfigMap => json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
            "data": {"revision": revision.to_string()}
        }),
        TemplateKind::Claim => json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata,
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "kwok-volume",
                     "resources": {"requests": {"storage": "1Gi"}}}
        }),
        TemplateKind::Shard => json!({
            "apiVersion": api_version(kind), "kind": "Shard", "metadata": metadata,
            "spec": {"replicas": replicas, "note": format!("revision {revision}")}
        }),
    }
}

/// MyDatabase versions must look like `16` or `16.2` (two digits at most after the dot).
fn database_version(revision: u32) -> String {
    match revision % 100 {
        0 => "16".to_string(),
        minor => format!("16.{minor}"),
    }
}

/// Where in a copy the nemesis's edits land, and where the hub's drift repair must put
/// the template's value back (a JSON pointer).
pub fn edited_field(kind: TemplateKind) -> Option<&'static str> {
    match kind {
        TemplateKind::Database => Some("/spec/version"),
        TemplateKind::StatefulSet | TemplateKind::Deployment => {
            Some("/spec/template/spec/containers/0/image")
        }
        TemplateKind::ConfigMap => Some("/data"),
        TemplateKind::Shard => Some("/spec/note"),
        TemplateKind::Claim => None,
    }
}

/// The patch a person's edit of a member copy makes: a value no template revision ever
/// has, marked `mark`, at [`edited_field`]. A strategic merge patch for the built-in kinds
/// (containers merge by name, so only the image changes) and a merge patch for the custom
/// ones: [`edit_is_strategic`] says which.
pub fn copy_edit(kind: TemplateKind, mark: u32) -> Option<Value> {
    let image = |container: &str, image: String| json!({"spec": {"template": {"spec": {"containers": [{"name": container, "image": image}]}}}});
    Some(match kind {
        TemplateKind::Database => json!({"spec": {"version": "15"}}),
        TemplateKind::StatefulSet => image("app", format!("postgres:edited-{mark}")),
        TemplateKind::Deployment => image("web", format!("nginx:edited-{mark}")),
        TemplateKind::ConfigMap => json!({"data": {"revision": format!("edited-{mark}")}}),
        TemplateKind::Shard => json!({"spec": {"note": format!("edited {mark}")}}),
        TemplateKind::Claim => return None,
    })
}

/// Whether [`copy_edit`]'s patch for `kind` is a strategic merge patch (built-in kinds)
/// rather than a merge patch (custom kinds, which have no strategy).
pub fn edit_is_strategic(kind: TemplateKind) -> bool {
    kind.group() != "example.com" && kind.group() != TemplateKind::Shard.group()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_template_with_its_name_and_replicas_where_divided() {
        for kind in TemplateKind::ALL {
            let object = template(kind, "x-1", 3, 2);
            assert_eq!(object["kind"], kind.kind());
            assert_eq!(object["apiVersion"], api_version(kind));
            assert_eq!(object["metadata"]["name"], "x-1");
            if kind.is_divided() {
                assert_eq!(object["spec"]["replicas"], 3, "{kind:?}");
            }
            if let Some(field) = edited_field(kind) {
                let ours = object.pointer(field).unwrap().clone();
                let edit = copy_edit(kind, 7).unwrap();
                let edited = edit.pointer(field).expect("the edit changes the field");
                assert_ne!(*edited, ours, "{kind:?}: an edit differs from the template");
            }
        }
    }

    #[test]
    fn a_deployment_names_its_configmap_and_every_fourth_revision_drops_the_claim() {
        let with_claim = template(TemplateKind::Deployment, "web-1", 2, 0);
        let pod = &with_claim["spec"]["template"]["spec"];
        assert_eq!(
            pod["containers"][0]["envFrom"][0]["configMapRef"]["name"],
            "web-1-config"
        );
        assert_eq!(
            pod["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "web-1-data"
        );
        let without = template(TemplateKind::Deployment, "web-1", 2, 3);
        assert_eq!(without["spec"]["template"]["spec"]["volumes"], json!([]));
    }

    #[test]
    fn database_versions_stay_valid() {
        assert_eq!(database_version(0), "16");
        assert_eq!(database_version(7), "16.7");
        assert_eq!(database_version(100), "16");
        assert_eq!(database_version(199), "16.99");
    }

    #[test]
    fn the_deployment_policy_propagates_dependencies_and_fails_over() {
        let deployments = policy("chaos", TemplateKind::Deployment);
        assert_eq!(deployments["spec"]["propagateDeps"], true);
        assert_eq!(deployments["metadata"]["namespace"], "chaos");
        let databases = policy("chaos", TemplateKind::Database);
        assert!(databases["spec"].get("propagateDeps").is_none());
        assert_eq!(
            databases["spec"]["resourceSelectors"][0]["apiVersion"],
            "example.com/v1"
        );
        assert_eq!(shard_federate_argument(), "shards.chaos.example.org");
        assert_eq!(shard_crd()["metadata"]["name"], "shards.chaos.example.org");
        assert!(edit_is_strategic(TemplateKind::Deployment));
        assert!(edit_is_strategic(TemplateKind::ConfigMap));
        assert!(!edit_is_strategic(TemplateKind::Database));
        assert!(!edit_is_strategic(TemplateKind::Shard));
    }
}
