//! Who depends on what, and the clusters every dependency must be in.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use petgraph::Direction;
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;

use super::ObjectRef;
use super::rules::DependencyPlacement;

/// The dependency graph of the hub's templates: nodes are objects, an edge `a -> b` says
/// "a depends on b" (a's pod template or a reference field names b).
///
/// An object is registered in one of two roles:
/// - a **workload** ([`set_workload`](Self::set_workload)): a template placed by its own
///   policy, with the clusters that placement chose;
/// - a **follower with references** ([`set_references`](Self::set_references)): a
///   dependency of a custom kind that references further objects, placed by nothing of
///   its own (a `Widget` naming a ConfigMap).
///
/// Every other node is a plain dependency, kept only while something references it.
///
/// Clusters flow along the edges: a dependency is needed in every cluster of every
/// workload that reaches it through a chain of followers. A workload is where the chain
/// stops: what it passes on is its own placement, not what flows into it (a Widget with a
/// policy of its own is in that policy's clusters, so its ConfigMap goes there, not to
/// the clusters of the Deployments that reference the Widget). Cycles are fine: a
/// cycle's members are needed wherever the workloads reaching the cycle are.
///
/// Cost: each node keeps the set of workloads reaching it (its "sources") and, per
/// cluster, how many of them are placed there. A change to one workload walks only what
/// that workload reaches (its few dependencies), so [`clusters_for`](Self::clusters_for)
/// is a map read and nothing is ever rebuilt from scratch. Changing the references of a
/// follower re-walks the workloads that reach it (rare: custom references change with
/// their spec), and dropping a reference costs as many steps as the dropped dependency
/// has dependents (petgraph's edge lists). Memory is one entry per (workload, object it reaches).
#[derive(Debug, Default)]
pub struct DependencyGraph {
    graph: StableDiGraph<Node, ()>,
    index: HashMap<Identity, NodeIndex>,
    synced: bool,
}

/// What identifies an object across API versions: its group, not its version (a custom
/// reference rule may name `example.com/v1beta1` for a template served as `v1`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Identity {
    group: String,
    kind: String,
    namespace: String,
    name: String,
}

impl Identity {
    fn of(object: &ObjectRef) -> Identity {
        Identity {
            group: object.group().to_string(),
            kind: object.kind.clone(),
            namespace: object.namespace.clone(),
            name: object.name.clone(),
        }
    }
}

#[derive(Debug)]
struct Node {
    object: ObjectRef,
    role: Role,
    /// Workloads reaching this node through followers only.
    sources: BTreeSet<NodeIndex>,
    /// For each cluster, how many of `sources` are placed there (never zero).
    clusters: BTreeMap<String, usize>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Role {
    /// Only referenced: no references of its own registered.
    Dependency,
    /// Registered references; follows the workloads that reach it.
    Follower,
    /// Placed by its own policy on these clusters.
    Workload(BTreeSet<String>),
}

impl DependencyGraph {
    /// An empty graph, not synced.
    pub fn new() -> DependencyGraph {
        DependencyGraph::default()
    }

    /// Registers (or updates) a workload placed by its own policy: what it depends on and
    /// the clusters its placement chose. Dependencies outside the workload's namespace are
    /// ignored (only objects of the workload's namespace are dependencies), as is a
    /// repeated one. Nothing is done when nothing changed.
    pub fn set_workload(
        &mut self,
        workload: ObjectRef,
        deps: Vec<ObjectRef>,
        clusters: BTreeSet<String>,
    ) {
        self.register(workload, Role::Workload(clusters), deps);
    }

    /// Registers (or updates) the references of an object placed by no policy of its own
    /// (a custom kind whose interpreter names reference fields): what reaches it reaches
    /// them too. The namespace rule of [`set_workload`](Self::set_workload) applies.
    pub fn set_references(&mut self, object: ObjectRef, deps: Vec<ObjectRef>) {
        self.register(object, Role::Follower, deps);
    }

    /// Forgets what [`set_workload`](Self::set_workload) or
    /// [`set_references`](Self::set_references) registered for the object (it was
    /// deleted, or its policy no longer propagates dependencies). It stays a plain
    /// dependency while something still references it.
    pub fn remove_workload(&mut self, workload: &ObjectRef) {
        if let Some(&node) = self.index.get(&Identity::of(workload)) {
            self.change(node, Role::Dependency, BTreeSet::new());
        }
    }

    /// Whether every template has been registered since the hub started (the caller says
    /// so once its initial lists are in); until then [`placement_for`](Self::placement_for)
    /// answers [`DependencyPlacement::Unknown`].
    pub fn set_synced(&mut self, synced: bool) {
        self.synced = synced;
    }

    /// See [`set_synced`](Self::set_synced).
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// The clusters `dependency` must be in for the workloads that depend on it (directly
    /// or through followers): the union of their placements. Empty for an object nothing
    /// depends on.
    pub fn clusters_for(&self, dependency: &ObjectRef) -> BTreeSet<String> {
        self.node(dependency)
            .map(|n| self.graph[n].clusters.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The workloads whose placement `dependency` follows (directly or through
    /// followers), sorted: what the binding's explanation names.
    pub fn dependents(&self, dependency: &ObjectRef) -> Vec<ObjectRef> {
        let Some(node) = self.node(dependency) else {
            return vec![];
        };
        let mut dependents: Vec<ObjectRef> = self.graph[node]
            .sources
            .iter()
            .map(|&s| self.graph[s].object.clone())
            .collect();
        dependents.sort();
        dependents
    }

    /// What `object` references directly, sorted (as registered).
    pub fn dependencies_of(&self, object: &ObjectRef) -> Vec<ObjectRef> {
        let Some(node) = self.node(object) else {
            return vec![];
        };
        let mut deps: Vec<ObjectRef> = self
            .graph
            .neighbors_directed(node, Direction::Outgoing)
            .map(|n| self.graph[n].object.clone())
            .collect();
        deps.sort();
        deps
    }

    /// The cycles of references: every group of objects that reference each other in a
    /// ring (an object referencing itself included), each sorted, sorted. Only custom
    /// reference rules can make one; its members still follow every workload that
    /// reaches the cycle.
    pub fn cycles(&self) -> Vec<Vec<ObjectRef>> {
        let mut cycles: Vec<Vec<ObjectRef>> = petgraph::algo::tarjan_scc(&self.graph)
            .into_iter()
            .filter(|component| {
                component.len() > 1 || self.graph.contains_edge(component[0], component[0])
            })
            .map(|component| {
                let mut members: Vec<ObjectRef> = component
                    .into_iter()
                    .map(|n| self.graph[n].object.clone())
                    .collect();
                members.sort();
                members
            })
            .collect();
        cycles.sort();
        cycles
    }

    /// The reference cycle `object` is in (sorted; empty when it is in none). A walk of
    /// the whole graph, so asked only about objects with references of their own.
    pub fn cycle_of(&self, object: &ObjectRef) -> Vec<ObjectRef> {
        let Some(node) = self.node(object) else {
            return vec![];
        };
        if self
            .graph
            .neighbors_directed(node, Direction::Outgoing)
            .next()
            .is_none()
        {
            return vec![];
        }
        let identity = Identity::of(object);
        self.cycles()
            .into_iter()
            .find(|cycle| cycle.iter().any(|o| Identity::of(o) == identity))
            .unwrap_or_default()
    }

    /// `objects` and, for those that are not workloads, what they reference, and so on
    /// through followers (a workload on the way is included but not walked through: it
    /// passes on its own placement). What the hub reconciles again when the clusters
    /// reaching `objects` change.
    pub fn passed_on(&self, objects: &[ObjectRef]) -> Vec<ObjectRef> {
        let mut seen = HashSet::new();
        let mut out = vec![];
        let mut stack: Vec<NodeIndex> = objects.iter().filter_map(|o| self.node(o)).collect();
        while let Some(node) = stack.pop() {
            if !seen.insert(node) {
                continue;
            }
            out.push(self.graph[node].object.clone());
            if !matches!(self.graph[node].role, Role::Workload(_)) {
                stack.extend(self.graph.neighbors_directed(node, Direction::Outgoing));
            }
        }
        out.sort();
        out
    }

    /// Where `dependency` goes (the rules of docs/dependencies.md):
    /// - selected by a policy of its own (`has_own_policy`, as the caller's policy
    ///   matching says): [`DependencyPlacement::Own`], whatever depends on it;
    /// - otherwise, before the graph is synced: [`DependencyPlacement::Unknown`] (the
    ///   caller must neither create nor delete a copy of it);
    /// - needed by at least one workload: [`DependencyPlacement::Follows`] the union of
    ///   their clusters (possibly empty, when none of them is placed anywhere);
    /// - needed by none: [`DependencyPlacement::None`].
    pub fn placement_for(
        &self,
        dependency: &ObjectRef,
        has_own_policy: bool,
    ) -> DependencyPlacement {
        if has_own_policy {
            return DependencyPlacement::Own;
        }
        if !self.synced {
            return DependencyPlacement::Unknown;
        }
        let dependents = self.dependents(dependency);
        if dependents.is_empty() {
            return DependencyPlacement::None;
        }
        DependencyPlacement::Follows {
            clusters: self.clusters_for(dependency),
            dependents,
        }
    }

    /// Objects the graph holds (registered or referenced).
    pub fn len(&self) -> usize {
        self.graph.node_count()
    }

    /// Whether the graph holds nothing.
    pub fn is_empty(&self) -> bool {
        self.graph.node_count() == 0
    }

    fn node(&self, object: &ObjectRef) -> Option<NodeIndex> {
        self.index.get(&Identity::of(object)).copied()
    }

    fn node_or_insert(&mut self, object: &ObjectRef) -> NodeIndex {
        let identity = Identity::of(object);
        if let Some(&node) = self.index.get(&identity) {
            return node;
        }
        let node = self.graph.add_node(Node {
            object: object.clone(),
            role: Role::Dependency,
            sources: BTreeSet::new(),
            clusters: BTreeMap::new(),
        });
        self.index.insert(identity, node);
        node
    }

    fn register(&mut self, object: ObjectRef, role: Role, deps: Vec<ObjectRef>) {
        let node = self.node_or_insert(&object);
        let namespace = object.namespace.clone();
        // The registered object's own apiVersion is the one the hub serves it as.
        self.graph[node].object = object;
        let targets: BTreeSet<NodeIndex> = deps
            .iter()
            .filter(|d| d.namespace == namespace)
            .map(|d| self.node_or_insert(d))
            .collect();
        self.change(node, role, targets);
    }

    /// Changes a node's role and out-edges, keeping every node's sources and cluster
    /// counts exact: the workloads whose walk may pass through the node (those reaching
    /// it, and the node itself if it is a workload) are retracted, the node changed, and
    /// they are spread again.
    fn change(&mut self, node: NodeIndex, role: Role, targets: BTreeSet<NodeIndex>) {
        let current: BTreeSet<NodeIndex> = self
            .graph
            .neighbors_directed(node, Direction::Outgoing)
            .collect();
        if self.graph[node].role == role && current == targets {
            self.collect_garbage(targets.into_iter().chain([node]));
            return;
        }
        let was_workload = matches!(self.graph[node].role, Role::Workload(_));
        let is_workload = matches!(role, Role::Workload(_));
        // Walks of the workloads reaching the node pass through it unless it is a
        // workload (a workload passes on its own placement, not what reaches it).
        let mut affected = if was_workload && is_workload {
            BTreeSet::new()
        } else {
            self.graph[node].sources.clone()
        };
        if was_workload {
            affected.insert(node);
        }
        for &source in &affected {
            self.retract(source);
        }
        // Only the edges that change: removing one walks the target's list of incoming
        // edges (petgraph keeps them linked), long for a ConfigMap every workload uses.
        let dropped: Vec<_> = self
            .graph
            .edges_directed(node, Direction::Outgoing)
            .filter(|e| !targets.contains(&e.target()))
            .map(|e| e.id())
            .collect();
        for edge in dropped {
            self.graph.remove_edge(edge);
        }
        for &target in targets.difference(&current) {
            self.graph.add_edge(node, target, ());
        }
        self.graph[node].role = role;
        if is_workload {
            affected.insert(node);
        } else {
            affected.remove(&node);
        }
        for &source in &affected {
            self.spread(source);
        }
        self.collect_garbage(current.into_iter().chain(targets).chain([node]));
    }

    /// The nodes a workload's placement reaches: its dependencies, theirs when they are
    /// followers, and so on (a workload on the way is reached but not walked through).
    fn reach(&self, workload: NodeIndex) -> Vec<NodeIndex> {
        let mut seen = HashSet::new();
        let mut stack: Vec<NodeIndex> = self
            .graph
            .neighbors_directed(workload, Direction::Outgoing)
            .collect();
        let mut reached = vec![];
        while let Some(node) = stack.pop() {
            if !seen.insert(node) {
                continue;
            }
            reached.push(node);
            if !matches!(self.graph[node].role, Role::Workload(_)) {
                stack.extend(self.graph.neighbors_directed(node, Direction::Outgoing));
            }
        }
        reached
    }

    fn own_clusters(&self, workload: NodeIndex) -> BTreeSet<String> {
        match &self.graph[workload].role {
            Role::Workload(clusters) => clusters.clone(),
            _ => BTreeSet::new(),
        }
    }

    fn spread(&mut self, workload: NodeIndex) {
        let clusters = self.own_clusters(workload);
        for node in self.reach(workload) {
            let node = &mut self.graph[node];
            node.sources.insert(workload);
            for cluster in &clusters {
                *node.clusters.entry(cluster.clone()).or_default() += 1;
            }
        }
    }

    fn retract(&mut self, workload: NodeIndex) {
        let clusters = self.own_clusters(workload);
        for node in self.reach(workload) {
            let node = &mut self.graph[node];
            node.sources.remove(&workload);
            for cluster in &clusters {
                if let Some(count) = node.clusters.get_mut(cluster) {
                    *count -= 1;
                    if *count == 0 {
                        node.clusters.remove(cluster);
                    }
                }
            }
        }
    }

    /// Drops plain dependencies nothing references any more.
    fn collect_garbage(&mut self, candidates: impl IntoIterator<Item = NodeIndex>) {
        for node in candidates {
            let Some(weight) = self.graph.node_weight(node) else {
                continue;
            };
            let unused = weight.role == Role::Dependency
                && self
                    .graph
                    .neighbors_directed(node, Direction::Incoming)
                    .next()
                    .is_none()
                && self
                    .graph
                    .neighbors_directed(node, Direction::Outgoing)
                    .next()
                    .is_none();
            if unused {
                let weight = self.graph.remove_node(node).expect("node checked above");
                self.index.remove(&Identity::of(&weight.object));
            }
        }
    }
}
