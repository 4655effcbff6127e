//! What happens to a database's volumes, as pure functions: whether a deletion may delete
//! them, how retained claims are marked "released", and how a new database of the same
//! name takes them back.
//!
//! The rule (DESIGN.md section 4, "stateful data is never lost by a placement change"):
//! volumes are deleted only when `spec.storage.reclaimPolicy` is `Delete` **and** the
//! deletion is the user's: the MyDatabase is not managed by the hub (a user deleted it in
//! this cluster), or the hub marked its copy with `federation.example.com/template-deleted`
//! because the user deleted the hub template. Everything else (the hub moving the copy to
//! another cluster, unjoin with cleanup, `reclaimPolicy: Retain`) keeps the claims.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use serde_json::{Value, json};

use super::builders::LABEL_DATABASE;
use crate::api::mydatabase::ReclaimPolicy;
use crate::api::{ANNOTATION_TEMPLATE_DELETED, LABEL_MANAGED_BY, MyDatabase};
use crate::hub::federation::copies::MANAGED_BY;

/// Label (value `"true"`) on a claim kept after its database was deleted.
pub const LABEL_RELEASED: &str = "example.com/released";
/// Annotation on a released claim: when it was released (RFC 3339).
pub const ANNOTATION_RELEASED_AT: &str = "example.com/released-at";

/// Why a deletion keeps the volumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetainReason {
    /// `spec.storage.reclaimPolicy` is `Retain`.
    ReclaimPolicyRetain,
    /// `reclaimPolicy: Delete`, but this is a hub copy deleted without the user deleting
    /// the template: a placement change moved it away, the cluster was unjoined, or
    /// someone deleted the copy in this cluster (if the hub applies it again, the new copy
    /// reuses the claims).
    MovedByHub,
}

impl RetainReason {
    /// The explanation in the `VolumesRetained` Event.
    pub fn explanation(self) -> &'static str {
        match self {
            RetainReason::ReclaimPolicyRetain => "spec.storage.reclaimPolicy is Retain",
            RetainReason::MovedByHub => {
                "this is a copy managed by the federation hub and its template was not deleted (the hub moved the copy away from this cluster, the cluster was unjoined, or someone deleted the copy here); a hub copy's volumes are deleted only when its template is deleted with reclaimPolicy Delete"
            }
        }
    }
}

/// What the finalizer does with the claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeDecision {
    /// Delete each claim (by name, with a UID precondition).
    Delete,
    /// Keep them and mark them released.
    Retain(RetainReason),
}

/// The hub manages this MyDatabase (it is a member copy of a hub template).
pub fn is_managed_by_hub(database: &MyDatabase) -> bool {
    database.labels().get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY)
}

/// The hub marked this copy as deleted because the user deleted the template.
pub fn template_deleted(database: &MyDatabase) -> bool {
    database
        .annotations()
        .get(ANNOTATION_TEMPLATE_DELETED)
        .map(String::as_str)
        == Some("true")
}

/// Whether deleting `database` deletes its volumes.
pub fn reclaim_decision(database: &MyDatabase) -> VolumeDecision {
    if database.spec.storage.reclaim_policy != ReclaimPolicy::Delete {
        VolumeDecision::Retain(RetainReason::ReclaimPolicyRetain)
    } else if !is_managed_by_hub(database) || template_deleted(database) {
        VolumeDecision::Delete
    } else {
        VolumeDecision::Retain(RetainReason::MovedByHub)
    }
}

/// Selects every claim of the database `name` (the claim template and the StatefulSet's
/// selector both carry the label, so every claim the StatefulSet creates has it).
pub fn claims_selector(name: &str) -> String {
    format!("{LABEL_DATABASE}={name}")
}

/// Selects the claims of the database `name` that an earlier database of that name left
/// behind.
pub fn released_claims_selector(name: &str) -> String {
    format!("{LABEL_DATABASE}={name},{LABEL_RELEASED}=true")
}

/// The claim is already marked released (a retried cleanup keeps its first release time).
pub fn is_released(claim: &PersistentVolumeClaim) -> bool {
    claim.labels().get(LABEL_RELEASED).map(String::as_str) == Some("true")
}

fn owned_by_the_statefulset(reference: &Value, database: &str) -> bool {
    reference["kind"] == "StatefulSet"
        && reference["apiVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("apps/"))
        && reference["name"] == database
}

/// The merge patch that marks a kept claim released at `now`.
///
/// Claims created while the StatefulSet had `whenDeleted: Delete` (agents before this
/// rule) are owned by the StatefulSet, and the garbage collector would delete them with
/// it. The patch drops that ownerReference; since a merge patch replaces the whole list, it
/// then carries the listed resourceVersion, so a concurrent change is a conflict (retried)
/// rather than lost.
pub fn release_patch(claim: &PersistentVolumeClaim, database: &str, now: jiff::Timestamp) -> Value {
    let mut metadata = json!({
        "labels": {LABEL_RELEASED: "true"},
        "annotations": {ANNOTATION_RELEASED_AT: now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()},
    });
    let references: Vec<Value> = claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|r| serde_json::to_value(r).expect("an OwnerReference serializes"))
        .collect();
    if references
        .iter()
        .any(|r| owned_by_the_statefulset(r, database))
    {
        let kept: Vec<Value> = references
            .into_iter()
            .filter(|r| !owned_by_the_statefulset(r, database))
            .collect();
        metadata["ownerReferences"] = if kept.is_empty() {
            Value::Null
        } else {
            Value::Array(kept)
        };
        if let Some(version) = &claim.metadata.resource_version {
            metadata["resourceVersion"] = json!(version);
        }
    }
    json!({ "metadata": metadata })
}

/// The merge patch that takes a released claim back into use.
pub fn reuse_patch() -> Value {
    json!({"metadata": {
        "labels": {LABEL_RELEASED: null},
        "annotations": {ANNOTATION_RELEASED_AT: null},
    }})
}

/// Whether `apply` must look for released claims to take back.
///
/// Claims are released only by the cleanup of a deleted database, and a database of the
/// same name can exist again only after that cleanup finished. So released claims can be
/// waiting only when this database's StatefulSet does not exist yet or still belongs to an
/// earlier database of the same name (another UID). The StatefulSet is read on every
/// reconcile anyway, so this costs no request once the StatefulSet is ours: the steady
/// state pays nothing, and there is no extra status field to write (or for the hub to
/// carry). The check runs before the StatefulSet is applied, so a failed un-labelling is
/// retried by the next reconcile.
pub fn needs_reuse_check(database: &MyDatabase, existing: Option<&StatefulSet>) -> bool {
    let Some(existing) = existing else {
        return true;
    };
    let uid = database.metadata.uid.as_deref();
    !existing
        .owner_references()
        .iter()
        .any(|r| r.controller == Some(true) && Some(r.uid.as_str()) == uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MyDatabaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn database(policy: ReclaimPolicy, managed: bool, template_deleted: bool) -> MyDatabase {
        let mut db = MyDatabase::new("orders", MyDatabaseSpec::default());
        db.metadata.namespace = Some("shop".into());
        db.metadata.uid = Some("uid-1".into());
        db.spec.storage.reclaim_policy = policy;
        if managed {
            db.labels_mut()
                .insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
        }
        if template_deleted {
            db.annotations_mut()
                .insert(ANNOTATION_TEMPLATE_DELETED.into(), "true".into());
        }
        db
    }

    #[test]
    fn only_a_users_deletion_with_reclaim_policy_delete_deletes_volumes() {
        use ReclaimPolicy::{Delete, Retain};
        use VolumeDecision::Retain as Kept;
        let cases = [
            // policy, managed by the hub, template deleted -> decision
            (
                Retain,
                false,
                false,
                Kept(RetainReason::ReclaimPolicyRetain),
            ),
            (Retain, true, false, Kept(RetainReason::ReclaimPolicyRetain)),
            (Retain, true, true, Kept(RetainReason::ReclaimPolicyRetain)),
            (Delete, false, false, VolumeDecision::Delete),
            (Delete, true, false, Kept(RetainReason::MovedByHub)),
            (Delete, true, true, VolumeDecision::Delete),
        ];
        for (policy, managed, deleted, expected) in cases {
            assert_eq!(
                reclaim_decision(&database(policy, managed, deleted)),
                expected,
                "{policy:?} managed={managed} template-deleted={deleted}"
            );
        }
    }

    #[test]
    fn only_the_hubs_label_value_and_a_true_annotation_count() {
        let mut db = database(ReclaimPolicy::Delete, false, false);
        db.labels_mut()
            .insert(LABEL_MANAGED_BY.into(), "someone-else".into());
        assert!(!is_managed_by_hub(&db));
        let mut copy = database(ReclaimPolicy::Delete, true, false);
        copy.annotations_mut()
            .insert(ANNOTATION_TEMPLATE_DELETED.into(), "false".into());
        assert_eq!(
            reclaim_decision(&copy),
            VolumeDecision::Retain(RetainReason::MovedByHub)
        );
    }

    fn claim(owners: Vec<OwnerReference>) -> PersistentVolumeClaim {
        let mut claim = PersistentVolumeClaim::default();
        claim.metadata.name = Some("data-orders-0".into());
        claim.metadata.resource_version = Some("42".into());
        if !owners.is_empty() {
            claim.metadata.owner_references = Some(owners);
        }
        claim
    }

    fn owner(api_version: &str, kind: &str, name: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("{name}-uid"),
            ..Default::default()
        }
    }

    #[test]
    fn a_release_labels_and_timestamps_the_claim() {
        let now: jiff::Timestamp = "2030-01-02T03:04:05.678Z".parse().unwrap();
        assert_eq!(
            release_patch(&claim(vec![]), "orders", now),
            json!({"metadata": {
                "labels": {"example.com/released": "true"},
                "annotations": {"example.com/released-at": "2030-01-02T03:04:05Z"},
            }})
        );
    }

    #[test]
    fn a_release_drops_an_old_statefulset_ownership_guarded_by_resource_version() {
        let now = jiff::Timestamp::UNIX_EPOCH;
        let only_sts = release_patch(
            &claim(vec![owner("apps/v1", "StatefulSet", "orders")]),
            "orders",
            now,
        );
        assert_eq!(only_sts["metadata"]["ownerReferences"], Value::Null);
        assert!(
            only_sts["metadata"]
                .as_object()
                .unwrap()
                .contains_key("ownerReferences"),
            "null removes the list in a merge patch"
        );
        assert_eq!(only_sts["metadata"]["resourceVersion"], "42");

        let mixed = release_patch(
            &claim(vec![
                owner("apps/v1", "StatefulSet", "orders"),
                owner("example.com/v1", "Backup", "nightly"),
            ]),
            "orders",
            now,
        );
        let kept = mixed["metadata"]["ownerReferences"].as_array().unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0]["name"], "nightly");

        let other = release_patch(
            &claim(vec![owner("apps/v1", "StatefulSet", "payments")]),
            "orders",
            now,
        );
        assert!(
            other["metadata"].get("ownerReferences").is_none()
                && other["metadata"].get("resourceVersion").is_none(),
            "someone else's ownership is left alone: {other}"
        );
    }

    #[test]
    fn reuse_removes_the_release_marks() {
        assert_eq!(
            reuse_patch(),
            json!({"metadata": {"labels": {"example.com/released": null}, "annotations": {"example.com/released-at": null}}})
        );
        assert_eq!(
            released_claims_selector("orders"),
            "example.com/database=orders,example.com/released=true"
        );
        assert_eq!(claims_selector("orders"), "example.com/database=orders");
    }

    #[test]
    fn released_claims_are_looked_for_only_until_the_statefulset_is_ours() {
        let db = database(ReclaimPolicy::Retain, false, false);
        assert!(needs_reuse_check(&db, None), "no StatefulSet yet");
        let ours = super::super::builders::statefulset(&db, &Default::default());
        assert!(!needs_reuse_check(&db, Some(&ours)), "steady state");
        let mut earlier = db.clone();
        earlier.metadata.uid = Some("uid-0".into());
        let theirs = super::super::builders::statefulset(&earlier, &Default::default());
        assert!(
            needs_reuse_check(&db, Some(&theirs)),
            "still the StatefulSet of an earlier database of that name"
        );
    }
}
