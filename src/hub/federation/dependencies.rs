//! Dependencies follow their workload (`propagateDeps: true` on a policy): the pure core.
//! Rules and a worked example are in docs/dependencies.md.
//!
//! Three pieces, each pure:
//! - [`references`] / [`references_in`]: what a workload references (its pod template's
//!   ConfigMaps, Secrets, ServiceAccounts and PersistentVolumeClaims, and the fields an
//!   interpreter names for a custom kind, as [`ReferenceRule`]s);
//! - [`DependencyGraph`]: who depends on what, kept incrementally, and the clusters each
//!   dependency must be in (the union of its workloads' clusters, through chains of
//!   custom references, cycles included);
//! - the rules: [`DependencyGraph::placement_for`] (a dependency with its own policy keeps
//!   it; one that follows workloads goes where any of them goes; before the graph is
//!   synced, nothing is known) and [`departures`] (which copies may leave which clusters:
//!   never while unknown, and a PersistentVolumeClaim never while a stateful workload
//!   that used it is still there or a cluster involved is not Ready).
//!
//! The hub reads templates, registers them here ([`DependencyGraph::set_workload`] for
//! templates of a `propagateDeps` policy, [`DependencyGraph::set_references`] for
//! dependencies whose kind has reference rules), and asks [`DependencyGraph::placement_for`]
//! for every dependency it sees.

mod graph;
mod references;
mod rules;
#[cfg(test)]
mod tests;

use std::fmt;

pub use graph::DependencyGraph;
pub use references::{
    DEFAULT_SERVICE_ACCOUNT, FieldPath, PathError, ReferenceRule, pod_template, references,
    references_in,
};
pub use rules::{Departures, DependencyPlacement, Hold, Presence, departures};

/// One object on the hub: a workload, a dependency, or both (a custom object with
/// references of its own).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    /// `v1`, `apps/v1`, `example.com/v1`.
    pub api_version: String,
    /// `ConfigMap`, `Deployment`, ...
    pub kind: String,
    /// The namespace (dependencies are always in their workload's namespace).
    pub namespace: String,
    /// The name.
    pub name: String,
}

/// What a workload references. The same shape as [`ObjectRef`]: a dependency is an object
/// like any other, and may itself be a workload.
pub type DependencyRef = ObjectRef;

impl ObjectRef {
    /// An object reference from its four parts.
    pub fn new(api_version: &str, kind: &str, namespace: &str, name: &str) -> ObjectRef {
        ObjectRef {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// The API group (`""` for the core group).
    pub fn group(&self) -> &str {
        group_of(&self.api_version)
    }

    /// A PersistentVolumeClaim: holds data, so the stateful rule of [`departures`] applies.
    pub fn is_persistent_volume_claim(&self) -> bool {
        self.group().is_empty() && self.kind == "PersistentVolumeClaim"
    }
}

impl fmt::Display for ObjectRef {
    /// `ConfigMap shop/settings`, as the binding's explanation names it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// The kinds a pod template references: ConfigMap, Secret, ServiceAccount and
/// PersistentVolumeClaim (core group). Custom kinds become dependencies only through an
/// interpreter's [`ReferenceRule`]s.
pub fn is_pod_dependency_kind(api_version: &str, kind: &str) -> bool {
    group_of(api_version).is_empty()
        && matches!(
            kind,
            "ConfigMap" | "Secret" | "ServiceAccount" | "PersistentVolumeClaim"
        )
}

fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(group, _)| group)
}
