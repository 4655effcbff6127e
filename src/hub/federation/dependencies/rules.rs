//! Where a dependency goes and which of its copies may leave which clusters.

use std::collections::{BTreeMap, BTreeSet};

use super::ObjectRef;

/// Where a dependency goes, as [`super::DependencyGraph::placement_for`] decides it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DependencyPlacement {
    /// Selected by a policy of its own: that policy's binding places it, the workloads
    /// that use it do not.
    Own,
    /// Follows workloads: it goes to `clusters`, the union of the placements of
    /// `dependents` (sorted). `clusters` is empty when none of them is placed anywhere.
    Follows {
        /// Where it goes.
        clusters: BTreeSet<String>,
        /// Why: the workloads that need it.
        dependents: Vec<ObjectRef>,
    },
    /// No workload needs it and no policy selects it: the copies the hub made of it as a
    /// dependency leave every cluster (see [`departures`]).
    None,
    /// The hub does not know yet (the graph is not synced): create nothing, delete nothing.
    Unknown,
}

impl DependencyPlacement {
    /// The clusters the dependency follows its workloads to: `Some` only for
    /// [`DependencyPlacement::Follows`] and [`DependencyPlacement::None`] (empty).
    pub fn followed_clusters(&self) -> Option<BTreeSet<String>> {
        match self {
            DependencyPlacement::Follows { clusters, .. } => Some(clusters.clone()),
            DependencyPlacement::None => Some(BTreeSet::new()),
            DependencyPlacement::Own | DependencyPlacement::Unknown => None,
        }
    }
}

/// What the caller knows of a dependency's copies and of the clusters, for [`departures`].
#[derive(Clone, Copy, Debug)]
pub struct Presence<'a> {
    /// Clusters that hold the copy the hub made of the dependency.
    pub present: &'a BTreeSet<String>,
    /// Member clusters whose Ready condition is True.
    pub ready: &'a BTreeSet<String>,
    /// Clusters where a stateful workload (a kind with the stateful-safety rules) that
    /// references this dependency, or referenced it before its placement changed, still
    /// has a copy, as the hub's copy caches see it.
    pub stateful_users: &'a BTreeSet<String>,
}

/// Which copies of a dependency leave which clusters now, and which stay for now and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Departures {
    /// Clusters whose copy may be deleted now.
    pub leave: BTreeSet<String>,
    /// Clusters whose copy is no longer wanted but stays for now.
    pub held: BTreeMap<String, Hold>,
}

/// Why an unwanted copy of a dependency stays.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// The dependency graph is not synced: the hub does not know who needs it.
    NotSynced,
    /// A PersistentVolumeClaim whose stateful workload is still in that cluster.
    StatefulWorkloadPresent,
    /// A PersistentVolumeClaim, and this cluster (of the claim's old or new placement)
    /// is not Ready: nothing can be confirmed there.
    ClusterNotReady(String),
}

impl Hold {
    /// A CamelCase reason for the binding's explanation.
    pub fn reason(&self) -> &'static str {
        match self {
            Hold::NotSynced => "DependenciesNotSynced",
            Hold::StatefulWorkloadPresent => "StatefulWorkloadPresent",
            Hold::ClusterNotReady(_) => "ClusterNotReady",
        }
    }
}

/// Which copies of `dependency` leave which clusters after a placement change.
///
/// Candidates are the clusters of `presence.present` outside the followed clusters
/// ([`DependencyPlacement::followed_clusters`]). What it guarantees:
/// - [`DependencyPlacement::Own`]: nothing leaves and nothing is held here: the
///   dependency's own binding decides its copies.
/// - [`DependencyPlacement::Unknown`]: nothing leaves; every present copy is held
///   ([`Hold::NotSynced`]). A dependency is never deleted because the hub does not know
///   yet.
/// - Any dependency but a PersistentVolumeClaim: every candidate leaves.
/// - A PersistentVolumeClaim (the stateful rule): a candidate cluster leaves only when
///   (1) no stateful workload that used the claim still has a copy there
///   ([`Hold::StatefulWorkloadPresent`]), and (2) every cluster of the claim's old
///   placement (`present`) and new placement (the followed clusters) is Ready
///   ([`Hold::ClusterNotReady`], naming the candidate itself when it is not Ready, else
///   the first, in name order, that is not). So a claim never leaves
///   because of a placement change while the workload that used it is still there, or
///   while a cluster involved cannot be observed; it leaves once both are true.
///
/// This covers placement changes only; a dependency deleted on the hub is cleaned up as
/// any deleted template is.
pub fn departures(
    dependency: &ObjectRef,
    placement: &DependencyPlacement,
    presence: &Presence<'_>,
) -> Departures {
    let wanted = match placement {
        DependencyPlacement::Own => return Departures::default(),
        DependencyPlacement::Unknown => {
            return Departures {
                leave: BTreeSet::new(),
                held: presence
                    .present
                    .iter()
                    .map(|c| (c.clone(), Hold::NotSynced))
                    .collect(),
            };
        }
        DependencyPlacement::Follows { clusters, .. } => clusters.clone(),
        DependencyPlacement::None => BTreeSet::new(),
    };
    let candidates = presence.present.difference(&wanted);
    if !dependency.is_persistent_volume_claim() {
        return Departures {
            leave: candidates.cloned().collect(),
            held: BTreeMap::new(),
        };
    }
    let not_ready = presence
        .present
        .union(&wanted)
        .find(|c| !presence.ready.contains(*c));
    let mut result = Departures::default();
    for cluster in candidates {
        let hold = if presence.stateful_users.contains(cluster) {
            Some(Hold::StatefulWorkloadPresent)
        } else if !presence.ready.contains(cluster) {
            Some(Hold::ClusterNotReady(cluster.clone()))
        } else {
            not_ready.map(|c| Hold::ClusterNotReady(c.clone()))
        };
        match hold {
            Some(hold) => {
                result.held.insert(cluster.clone(), hold);
            }
            None => {
                result.leave.insert(cluster.clone());
            }
        }
    }
    result
}
