//! Dependencies follow their workload (`propagateDeps: true`, docs/dependencies.md): the
//! hub's side of [`dependencies`](super::dependencies). Each reconcile of a workload
//! tells the graph what it references and where it is placed; a template no policy
//! selects that a placed workload references gets a binding of its own that follows the
//! workloads' clusters (Duplicated), and loses it when no workload needs it any more.
//!
//! The rules on top of the graph's:
//! - Nothing follows before the graph is built from every template the hub has listed
//!   ([`Follow::build`]): a dependency is never deleted because the hub does not know yet.
//! - A dependency with a policy of its own keeps that policy.
//! - A PersistentVolumeClaim that followed a workload never leaves a cluster because the
//!   workload left it: a claim is data. Deleting the claim on the hub deletes its copies.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

use crate::api::resource_binding::TargetCluster;
use crate::hub::federation::copy_cache::Kinds;
use crate::hub::federation::dependencies::{
    DependencyGraph, DependencyPlacement, ObjectRef, references,
};
use crate::hub::federation::writer::ObjectKey;

/// Reason on a following binding's `Scheduled` condition.
pub const FOLLOWS_WORKLOADS: &str = "FollowsWorkloads";

/// The kinds a pod template references: federated whenever a policy propagates
/// dependencies.
pub const DEPENDENCY_KINDS: [(&str, &str); 4] = [
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "ServiceAccount"),
    ("v1", "PersistentVolumeClaim"),
];

/// The graph and what each workload last told it.
#[derive(Default)]
pub struct Follow {
    graph: DependencyGraph,
    workloads: HashMap<ObjectKey, (Vec<ObjectRef>, BTreeSet<String>)>,
}

/// The graph's name for a template.
pub fn object_ref(kinds: &Kinds, key: &ObjectKey) -> Option<ObjectRef> {
    let (resource, _) = kinds.get(key.kind)?;
    Some(ObjectRef::new(
        &resource.api_version,
        &resource.kind,
        &key.namespace,
        &key.name,
    ))
}

/// The template key of a graph object, if its kind is federated.
pub fn key_of(kinds: &Kinds, object: &ObjectRef) -> Option<ObjectKey> {
    let kind = kinds
        .iter()
        .position(|(r, _)| r.group == object.group() && r.kind == object.kind)?;
    Some(ObjectKey {
        kind,
        namespace: object.namespace.clone(),
        name: object.name.clone(),
    })
}

/// What a workload references, read from its whole template.
pub fn workload_references(kinds: &Kinds, key: &ObjectKey, template: &Value) -> Vec<ObjectRef> {
    let Some((resource, interpretation)) = kinds.get(key.kind) else {
        return vec![];
    };
    let path = interpretation.pod_template.as_ref().map(|p| p.to_string());
    references(
        &resource.api_version,
        &resource.kind,
        template,
        path.as_deref(),
    )
}

/// The clusters a decision places the workload in.
pub fn placed_clusters(targets: &[TargetCluster]) -> BTreeSet<String> {
    targets.iter().map(|t| t.name.clone()).collect()
}

impl Follow {
    /// The graph from every template listed at start: `workloads` are the templates of a
    /// `propagateDeps` policy with their references and current clusters. From here on
    /// the graph is synced and dependencies follow.
    pub fn build(
        &mut self,
        workloads: impl IntoIterator<Item = (ObjectKey, ObjectRef, Vec<ObjectRef>, BTreeSet<String>)>,
    ) {
        for (key, object, deps, clusters) in workloads {
            self.graph
                .set_workload(object, deps.clone(), clusters.clone());
            self.workloads.insert(key, (deps, clusters));
        }
        self.graph.set_synced(true);
    }

    /// Tells the graph that `key` is a workload with these references and clusters
    /// (`Some`) or no workload (`None`: not placed, its policy does not propagate
    /// dependencies, or it is gone). Returns the dependencies whose placement may have
    /// changed, to reconcile them.
    pub fn set(
        &mut self,
        kinds: &Kinds,
        key: &ObjectKey,
        workload: Option<(Vec<ObjectRef>, BTreeSet<String>)>,
    ) -> Vec<ObjectKey> {
        let before = self.workloads.get(key).cloned();
        if before == workload {
            return vec![];
        }
        let Some(object) = object_ref(kinds, key) else {
            return vec![];
        };
        let mut touched: BTreeSet<ObjectRef> = before
            .iter()
            .flat_map(|(deps, _)| deps.iter().cloned())
            .collect();
        match workload {
            Some((deps, clusters)) => {
                touched.extend(deps.iter().cloned());
                self.graph
                    .set_workload(object, deps.clone(), clusters.clone());
                self.workloads.insert(key.clone(), (deps, clusters));
            }
            None => {
                self.graph.remove_workload(&object);
                self.workloads.remove(key);
            }
        }
        touched.iter().filter_map(|d| key_of(kinds, d)).collect()
    }

    /// Where a template no policy selects goes as a dependency: `None` when it does not
    /// follow anything (or the hub does not know yet), else the clusters and the
    /// workloads that need it (clusters empty: it leaves).
    pub fn placement(
        &self,
        kinds: &Kinds,
        key: &ObjectKey,
    ) -> Option<(BTreeSet<String>, Vec<ObjectRef>)> {
        let object = object_ref(kinds, key)?;
        match self.graph.placement_for(&object, false) {
            DependencyPlacement::Follows {
                clusters,
                dependents,
            } => Some((clusters, dependents)),
            DependencyPlacement::None => Some((BTreeSet::new(), vec![])),
            DependencyPlacement::Own | DependencyPlacement::Unknown => None,
        }
    }

    /// Whether the graph has been built.
    pub fn synced(&self) -> bool {
        self.graph.is_synced()
    }
}

/// The clusters a following dependency is placed in: where its workloads are, and for a
/// claim also wherever it already is (a claim never leaves because its workload did).
pub fn following_clusters(
    object: &ObjectRef,
    follow: &BTreeSet<String>,
    current: &[TargetCluster],
) -> BTreeSet<String> {
    let mut clusters = follow.clone();
    if object.is_persistent_volume_claim() {
        clusters.extend(current.iter().map(|t| t.name.clone()));
    }
    clusters
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ApiResource;

    fn kinds() -> Kinds {
        crate::hub::federation::discovery::kinds(
            &[
                ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
                ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
                ApiResource::erase::<k8s_openapi::api::core::v1::PersistentVolumeClaim>(&()),
            ],
            &crate::hub::federation::interpreter::Interpreters::built_in(),
        )
    }

    fn key(kind: usize, name: &str) -> ObjectKey {
        ObjectKey {
            kind,
            namespace: "shop".into(),
            name: name.into(),
        }
    }

    fn clusters(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_dependency_follows_its_workloads_and_leaves_with_them() {
        let kinds = kinds();
        let web = serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx",
                "envFrom": [{"configMapRef": {"name": "settings"}}]}],
                "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}}}
        });
        let deps = workload_references(&kinds, &key(0, "web"), &web);
        assert_eq!(
            deps.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
            ["ConfigMap shop/settings", "PersistentVolumeClaim shop/data"]
        );
        let mut follow = Follow::default();
        assert_eq!(
            follow.placement(&kinds, &key(1, "settings")),
            None,
            "not synced: nothing follows, nothing leaves"
        );
        follow.build([]);
        let touched = follow.set(
            &kinds,
            &key(0, "web"),
            Some((deps.clone(), clusters(&["east", "west"]))),
        );
        assert_eq!(touched, [key(1, "settings"), key(2, "data")]);
        let (placed, dependents) = follow.placement(&kinds, &key(1, "settings")).unwrap();
        assert_eq!(placed, clusters(&["east", "west"]));
        assert_eq!(dependents[0].name, "web");
        assert!(
            follow
                .set(
                    &kinds,
                    &key(0, "web"),
                    Some((deps.clone(), clusters(&["east", "west"])))
                )
                .is_empty(),
            "nothing changed"
        );
        // The workload leaves west, then goes away.
        follow.set(&kinds, &key(0, "web"), Some((deps, clusters(&["east"]))));
        assert_eq!(
            follow.placement(&kinds, &key(1, "settings")).unwrap().0,
            clusters(&["east"])
        );
        follow.set(&kinds, &key(0, "web"), None);
        assert_eq!(
            follow.placement(&kinds, &key(1, "settings")).unwrap().0,
            BTreeSet::new(),
            "no workload needs it: it leaves"
        );
    }

    #[test]
    fn a_claim_never_leaves_a_cluster_its_workload_left() {
        let claim = ObjectRef::new("v1", "PersistentVolumeClaim", "shop", "data");
        let config = ObjectRef::new("v1", "ConfigMap", "shop", "settings");
        let current = [TargetCluster {
            name: "west".into(),
            replicas: 1,
        }];
        assert_eq!(
            following_clusters(&claim, &clusters(&["east"]), &current),
            clusters(&["east", "west"])
        );
        assert_eq!(
            following_clusters(&config, &clusters(&["east"]), &current),
            clusters(&["east"])
        );
    }
}
