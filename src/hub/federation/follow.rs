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
    DependencyGraph, DependencyPlacement, ObjectRef, references_in,
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

/// The graph, what each workload last told it, and the references of the templates no
/// policy places whose kind names reference fields (followers: a Widget naming its
/// ConfigMap passes on to it whatever reaches the Widget).
#[derive(Default)]
pub struct Follow {
    graph: DependencyGraph,
    workloads: HashMap<ObjectKey, (Vec<ObjectRef>, BTreeSet<String>)>,
    followers: HashMap<ObjectKey, Vec<ObjectRef>>,
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

/// What a template references, read from its whole template: its pod template's
/// ConfigMaps, Secrets, ServiceAccounts and claims, and the reference fields its kind's
/// interpreter names.
pub fn workload_references(kinds: &Kinds, key: &ObjectKey, template: &Value) -> Vec<ObjectRef> {
    let Some((resource, interpretation)) = kinds.get(key.kind) else {
        return vec![];
    };
    references_in(
        &resource.api_version,
        &resource.kind,
        template,
        interpretation.pod_template.as_ref(),
        &interpretation.references,
    )
}

/// Whether the kind's interpreter names reference fields: its templates that no policy
/// places pass on what reaches them.
pub fn has_reference_fields(kinds: &Kinds, key: &ObjectKey) -> bool {
    kinds
        .get(key.kind)
        .is_some_and(|(_, interpretation)| !interpretation.references.is_empty())
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
        followers: impl IntoIterator<Item = (ObjectKey, ObjectRef, Vec<ObjectRef>)>,
    ) {
        for (key, object, deps, clusters) in workloads {
            self.graph
                .set_workload(object, deps.clone(), clusters.clone());
            self.workloads.insert(key, (deps, clusters));
        }
        for (key, object, deps) in followers {
            if deps.is_empty() || self.workloads.contains_key(&key) {
                continue;
            }
            self.graph.set_references(object, deps.clone());
            self.followers.insert(key, deps);
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
                self.workloads.remove(key);
                match self.followers.get(key) {
                    // No workload any more, but still a follower with references.
                    Some(deps) => self.graph.set_references(object, deps.clone()),
                    None => self.graph.remove_workload(&object),
                }
            }
        }
        self.touched(kinds, touched)
    }

    /// Tells the graph what a template no policy places references through its kind's
    /// reference fields (empty: nothing, or it is gone). Returns the objects whose
    /// placement may have changed, to reconcile them.
    pub fn set_references(
        &mut self,
        kinds: &Kinds,
        key: &ObjectKey,
        deps: Vec<ObjectRef>,
    ) -> Vec<ObjectKey> {
        let before = self.followers.get(key).cloned().unwrap_or_default();
        if before == deps {
            return vec![];
        }
        let Some(object) = object_ref(kinds, key) else {
            return vec![];
        };
        let mut touched: BTreeSet<ObjectRef> = before.into_iter().collect();
        touched.extend(deps.iter().cloned());
        if deps.is_empty() {
            self.followers.remove(key);
        } else {
            self.followers.insert(key.clone(), deps.clone());
        }
        // A workload's references are its workload registration's; the follower's are
        // kept for when it stops being one.
        if !self.workloads.contains_key(key) {
            if deps.is_empty() {
                self.graph.remove_workload(&object);
            } else {
                self.graph.set_references(object, deps);
            }
        }
        self.touched(kinds, touched)
    }

    /// The keys of `direct` and of what they pass on to through followers.
    fn touched(&self, kinds: &Kinds, direct: BTreeSet<ObjectRef>) -> Vec<ObjectKey> {
        let start: Vec<ObjectRef> = direct.iter().cloned().collect();
        let mut all = direct;
        all.extend(self.graph.passed_on(&start));
        let mut keys: Vec<ObjectKey> = all.iter().filter_map(|d| key_of(kinds, d)).collect();
        keys.dedup();
        keys
    }

    /// The reference cycle the template is in, if any (only reference fields make one).
    pub fn cycle_of(&self, kinds: &Kinds, key: &ObjectKey) -> Vec<ObjectRef> {
        match object_ref(kinds, key) {
            Some(object) if self.followers.contains_key(key) => self.graph.cycle_of(&object),
            _ => vec![],
        }
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

/// Whether a dependency that no placed workload references any more leaves the clusters
/// it followed its workloads to. A claim does not: it holds data, and only deleting it on
/// the hub deletes its copies.
pub fn leaves_when_unreferenced(object: &ObjectRef) -> bool {
    !object.is_persistent_volume_claim()
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
        follow.build([], []);
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
    fn a_claim_never_leaves_a_cluster_its_workload_left_nor_when_none_references_it() {
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
        // The workload was deleted, stopped naming it, or its policy went: nothing
        // follows any more, and the claim is still placed where it is.
        assert_eq!(
            following_clusters(&claim, &BTreeSet::new(), &current),
            clusters(&["west"])
        );
        assert!(!leaves_when_unreferenced(&claim));
        assert!(leaves_when_unreferenced(&config));
    }

    /// Kinds 0 Gizmo (its interpreter names a ConfigMap and partner Gizmos), 1 ConfigMap.
    fn gizmo_kinds() -> Kinds {
        let interpreter: crate::api::ResourceInterpreter = serde_json::from_value(serde_json::json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "ResourceInterpreter",
            "metadata": {"name": "gizmos"},
            "spec": {"target": {"apiVersion": "example.org/v1", "kind": "Gizmo"},
                     "dependencies": [
                         {"path": ".spec.configRef.name", "apiVersion": "v1", "kind": "ConfigMap"},
                         {"path": ".spec.partners[]", "apiVersion": "example.org/v1", "kind": "Gizmo"}]}
        }))
        .unwrap();
        let (interpreters, verdicts) =
            crate::hub::federation::interpreter::Interpreters::with_resources(&[
                std::sync::Arc::new(interpreter),
            ]);
        assert_eq!(verdicts[0].accepted, Ok(()));
        let gizmo = ApiResource {
            group: "example.org".into(),
            version: "v1".into(),
            api_version: "example.org/v1".into(),
            kind: "Gizmo".into(),
            plural: "gizmos".into(),
        };
        crate::hub::federation::discovery::kinds(
            &[
                gizmo,
                ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            ],
            &interpreters,
        )
    }

    fn gizmo(name: &str, config: &str, partners: &[&str]) -> Value {
        serde_json::json!({
            "apiVersion": "example.org/v1", "kind": "Gizmo",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"configRef": {"name": config}, "partners": partners}
        })
    }

    #[test]
    fn reference_fields_chain_through_followers_and_cycles_are_found() {
        let kinds = gizmo_kinds();
        assert!(has_reference_fields(&kinds, &key(0, "a")));
        assert!(!has_reference_fields(&kinds, &key(1, "a-config")));
        // a (a workload) -> b (no policy: a follower) -> b-config, and b -> a: a cycle.
        let a = workload_references(&kinds, &key(0, "a"), &gizmo("a", "a-config", &["b"]));
        assert_eq!(
            a.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
            ["Gizmo shop/b", "ConfigMap shop/a-config"]
        );
        let b = workload_references(&kinds, &key(0, "b"), &gizmo("b", "b-config", &["a"]));
        let mut follow = Follow::default();
        follow.build(
            [],
            [(
                key(0, "b"),
                object_ref(&kinds, &key(0, "b")).unwrap(),
                b.clone(),
            )],
        );
        let touched = follow.set(
            &kinds,
            &key(0, "a"),
            Some((a.clone(), clusters(&["east", "west"]))),
        );
        // What a passes on to through b is reconciled too, b-config included.
        for name in ["a-config", "b-config"] {
            assert!(touched.contains(&key(1, name)), "{name}: {touched:?}");
        }
        assert!(touched.contains(&key(0, "b")));
        for (kind, name) in [(1, "a-config"), (0, "b"), (1, "b-config")] {
            let (placed, dependents) = follow.placement(&kinds, &key(kind, name)).unwrap();
            assert_eq!(placed, clusters(&["east", "west"]), "{name}");
            assert_eq!(dependents.len(), 1);
            assert_eq!(dependents[0].name, "a");
        }
        assert_eq!(
            follow
                .cycle_of(&kinds, &key(0, "b"))
                .iter()
                .map(|o| o.to_string())
                .collect::<Vec<_>>(),
            ["Gizmo shop/a", "Gizmo shop/b"]
        );
        assert!(follow.cycle_of(&kinds, &key(1, "b-config")).is_empty());
        // b names another ConfigMap: the old one leaves, the new one follows.
        let b2 = workload_references(&kinds, &key(0, "b"), &gizmo("b", "c-config", &[]));
        let touched = follow.set_references(&kinds, &key(0, "b"), b2);
        assert!(touched.contains(&key(1, "b-config")) && touched.contains(&key(1, "c-config")));
        assert_eq!(
            follow.placement(&kinds, &key(1, "b-config")).unwrap().0,
            BTreeSet::new()
        );
        assert_eq!(
            follow.placement(&kinds, &key(1, "c-config")).unwrap().0,
            clusters(&["east", "west"])
        );
        assert!(
            follow.cycle_of(&kinds, &key(0, "b")).is_empty(),
            "no cycle any more"
        );
        // a no longer names b: b and everything it passed on leave.
        let a2 = workload_references(&kinds, &key(0, "a"), &gizmo("a", "a-config", &[]));
        let touched = follow.set(
            &kinds,
            &key(0, "a"),
            Some((a2, clusters(&["east", "west"]))),
        );
        assert!(
            touched.contains(&key(0, "b")) && touched.contains(&key(1, "c-config")),
            "{touched:?}"
        );
        for name in ["b", "c-config"] {
            let kind = if name == "b" { 0 } else { 1 };
            assert_eq!(
                follow.placement(&kinds, &key(kind, name)).unwrap().0,
                BTreeSet::new(),
                "{name}"
            );
        }
        // b deleted: its references go.
        let touched = follow.set_references(&kinds, &key(0, "b"), vec![]);
        assert!(touched.contains(&key(1, "c-config")));
    }
}
