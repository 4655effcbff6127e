//! The placement kernel: which member clusters run a template, how many replicas each,
//! and a reason for every cluster. Pure code: no I/O and no clock (the caller passes
//! `now`), and the same inputs always give the same output, so the hub, a standby hub and
//! `bulkhead plan` agree. The rules are in docs/placement.md; DESIGN.md section 3 is the
//! contract.
//!
//! The pipeline, one function per step:
//! 1. candidates (`candidates.rs`): clusterAffinity, readiness, taints vs tolerations;
//! 2. weights: static list, dynamic (available replicas), or 1 each;
//! 3. spread constraints (`spread.rs`): pick zones/regions/clusters within min/max groups;
//! 4. replicas (`divide.rs`): Duplicated, Divided/Weighted (Webster), Divided/Aggregated;
//! 5. explanation (`reason.rs`): one [`ClusterDecision`] per known cluster.

mod candidates;
pub mod capacity;
mod divide;
mod reason;
mod spread;
mod ties;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;

use crate::api::propagation_policy::{
    DivisionPreference, Placement, ReplicaSchedulingType, SpreadByField, StaticClusterWeight,
};
use crate::api::resource_binding::{ClusterDecision, TargetCluster};

pub use candidates::{label_selector_matches, toleration_matches};
pub use divide::{divide_by_weight, stable_hash};
pub use ties::{Tie, last_seat_tie, uid_tie};

use candidates::{Admission, Affinity, Exclusion};
use divide::{Bin, Party};
use spread::Groups;

/// What placement knows about one member cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    /// MemberCluster name.
    pub name: String,
    /// MemberCluster labels, matched by label selectors.
    pub labels: BTreeMap<String, String>,
    /// `spec.zone`.
    pub zone: String,
    /// `spec.region`.
    pub region: Option<String>,
    /// User and hub taints, with `time_added`.
    pub taints: Vec<Taint>,
    /// The MemberCluster's Ready condition is True.
    pub ready: bool,
    /// Estimated replicas of this template the cluster can still fit (for dynamic weights
    /// and Aggregated); None = unknown. Filled per template from `capacity` by
    /// [`capacity::with_estimates`].
    pub available_replicas: Option<i64>,
    /// What the member has free (allocatable minus requested), from its
    /// `status.capacity`; None = not reported.
    pub capacity: Option<capacity::FreeResources>,
}

/// One placement question: a template's policy placement, replica count and the clusters.
#[derive(Clone, Copy, Debug)]
pub struct PlacementRequest<'a> {
    /// From `PropagationSpec.placement`.
    pub placement: &'a Placement,
    /// The template's `spec.replicas` (1 for kinds without replicas).
    pub replicas: i32,
    /// Deployment/StatefulSet/MyDatabase: true; other kinds are always Duplicated.
    pub divisible: bool,
    /// StatefulSet/MyDatabase: a NoExecute taint never evicts their replicas (a cluster
    /// that holds some keeps them and gains none).
    pub stateful: bool,
    /// Template UID, for deterministic tie-breaks.
    pub uid: &'a str,
    /// Every known member cluster.
    pub clusters: &'a [ClusterView],
    /// The current assignment: Aggregated prefers clusters that already hold replicas, and
    /// a cluster that is not Ready keeps its replicas while its taints are tolerated.
    pub current: &'a [TargetCluster],
    /// For tolerationSeconds against a taint's `time_added`.
    pub now: jiff::Timestamp,
    /// The staticWeightList of `placement` already resolved against `clusters`
    /// ([`StaticWeights::resolve`]), for a caller that keeps one per policy and member
    /// registry snapshot: the weights depend on the clusters' names, zones and labels,
    /// never on the template. None (or one resolved for another number of clusters):
    /// the kernel matches the list itself.
    pub static_weights: Option<&'a StaticWeights>,
    /// A cluster whose first replica comes before every other cluster's first one when
    /// replicas are divided (a MyDatabase's primary cluster of replica clusters: a
    /// scale-down removes replica clusters first). Later replicas follow the weights.
    pub first_seat: Option<&'a str>,
}

/// A staticWeightList resolved against a list of clusters: each cluster's weight and the
/// entry it came from, in the order of the clusters. Resolving costs a label lookup per
/// key and a match per entry for every cluster (about half of a static decision over 100
/// clusters); the hub does it once per policy and member registry snapshot, not once per
/// template (docs/placement.md, "Performance").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticWeights {
    weights: Vec<(u64, StaticSource)>,
}

impl StaticWeights {
    /// `list` matched against every one of `clusters`, in their order.
    pub fn resolve(list: &[StaticClusterWeight], clusters: &[ClusterView]) -> Self {
        let targets = (!list.is_empty()).then(|| candidates::WeightTargets::new(list));
        let mut values = Vec::new();
        StaticWeights {
            weights: clusters
                .iter()
                .map(|cluster| static_weight(cluster, list, targets.as_ref(), &mut values))
                .collect(),
        }
    }

    /// How many clusters it was resolved for.
    pub fn len(&self) -> usize {
        self.weights.len()
    }

    /// Whether it was resolved for no cluster at all.
    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }
}

/// The answer.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacementResult {
    /// Chosen clusters with their replicas, sorted by name. Empty when unschedulable.
    pub targets: Vec<TargetCluster>,
    /// One row per known cluster, selected or not, with a reason a person understands;
    /// sorted by cluster name.
    pub decisions: Vec<ClusterDecision>,
    /// `Err(reason)` when no placement satisfies the policy (for `Scheduled=False`).
    pub scheduled: Result<(), String>,
    /// Scheduled, but not as the policy asked: `minPerCluster` needs more replicas than
    /// the template has. Says the numbers and the fix (for the `Scheduled` message).
    pub notice: Option<String>,
}

/// How replicas are scheduled, resolved from the policy and the kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Duplicated,
    Weighted { dynamic: bool },
    Aggregated,
}

impl Mode {
    /// `minPerCluster` for Divided placements (0 = none; Duplicated has none).
    fn minimum(self, request: &PlacementRequest<'_>) -> u32 {
        match self {
            Mode::Duplicated => 0,
            Mode::Weighted { .. } | Mode::Aggregated => request
                .placement
                .replica_scheduling
                .as_ref()
                .map_or(0, |s| u32::try_from(s.min_per_cluster).unwrap_or(0)),
        }
    }

    fn of(request: &PlacementRequest<'_>) -> Mode {
        let Some(scheduling) = request.placement.replica_scheduling.as_ref() else {
            return Mode::Duplicated;
        };
        if !request.divisible || scheduling.type_ == ReplicaSchedulingType::Duplicated {
            return Mode::Duplicated;
        }
        match scheduling.division_preference.unwrap_or_default() {
            DivisionPreference::Weighted => Mode::Weighted {
                dynamic: scheduling
                    .weight_preference
                    .as_ref()
                    .is_some_and(|w| w.dynamic_weight.is_some()),
            },
            DivisionPreference::Aggregated => Mode::Aggregated,
        }
    }
}

/// Where a cluster's weight came from (for the reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WeightSource {
    /// No staticWeightList: every candidate weighs 1.
    Uniform,
    /// staticWeightList entry at this index.
    Entry(usize),
    /// A staticWeightList exists but no entry matches: weight 0.
    NoEntry,
    /// dynamicWeight AvailableReplicas.
    Available,
    /// dynamicWeight, but the estimate is unknown: the static weight stands in.
    AvailableUnknown(StaticSource),
}

/// The static part of [`WeightSource`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StaticSource {
    Uniform,
    Entry(usize),
    NoEntry,
}

/// Where a cluster stands in the pipeline.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum State<'a> {
    Excluded(Exclusion<'a>),
    Candidate(Admission<'a>),
    /// A spread constraint counts a field the cluster does not have (no region).
    NoSpreadGroup(SpreadByField),
    /// A spread constraint chose other groups.
    SpreadNotChosen {
        field: SpreadByField,
        max_groups: i32,
    },
}

/// Everything placement works out about one cluster.
#[derive(Clone, Debug)]
pub(crate) struct Slot<'a> {
    pub cluster: &'a ClusterView,
    pub state: State<'a>,
    pub weight: u64,
    pub weight_source: WeightSource,
    /// Aggregated only: the cluster holds replicas of the template now.
    pub holds_replicas: bool,
    /// A kept cluster (not Ready, or a taint that blocks new replicas) gets at most
    /// the replicas it holds now.
    pub cap: Option<u32>,
    pub replicas: u32,
}

impl Slot<'_> {
    pub(crate) fn is_candidate(&self) -> bool {
        matches!(self.state, State::Candidate(_))
    }
}

/// Places one template and renders the whole explanation; see the module documentation
/// and docs/placement.md. Equivalent to `decide(request).into_result()`.
pub fn place(request: &PlacementRequest<'_>) -> PlacementResult {
    decide(request).into_result()
}

/// A placement decided but not yet written out: the kernel's result before the
/// per-cluster strings are built. The hub decides on every change of a template, a policy
/// or a cluster, but writes a binding only when the decision differs
/// ([`Decision::has_targets`]); building 100 reason strings for a decision that is thrown
/// away would cost more than deciding it, so rendering is a separate, lazy step.
#[derive(Clone, Debug)]
pub struct Decision<'a> {
    slots: Vec<Slot<'a>>,
    mode: Mode,
    total: u32,
    scheduled: Result<(), String>,
    /// `minPerCluster`, 0 when unset or not Divided.
    minimum: u32,
    /// The selected clusters' floors did not all fit in the total.
    shortfall: Option<Shortfall>,
}

/// `minPerCluster` asks for more replicas than the template has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shortfall {
    pub minimum: u32,
    /// Clusters that take part in the division (positive weight, or every candidate for
    /// Aggregated).
    pub clusters: usize,
    pub replicas: u32,
}

/// Decides one placement without rendering the reasons; see [`place`].
pub fn decide<'a>(request: &PlacementRequest<'a>) -> Decision<'a> {
    let mode = Mode::of(request);
    let total = u32::try_from(request.replicas).unwrap_or(0);
    let placement = request.placement;
    let now_millis = request.now.as_millisecond();
    let current = CurrentReplicas::new(request.current);

    // 1. Candidates.
    let affinity = Affinity::new(placement.cluster_affinity.as_ref());
    let mut slots: Vec<Slot<'a>> = request
        .clusters
        .iter()
        .map(|cluster| {
            let state = match candidates::check(
                cluster,
                &affinity,
                &placement.cluster_tolerations,
                || current.get(&cluster.name) > 0,
                request.stateful,
                now_millis,
            ) {
                Ok(admission) => State::Candidate(admission),
                Err(exclusion) => State::Excluded(exclusion),
            };
            let cap = matches!(state, State::Candidate(Admission::Kept(_)))
                .then(|| u32::try_from(current.get(&cluster.name)).unwrap_or(0));
            Slot {
                cluster,
                state,
                weight: 1,
                weight_source: WeightSource::Uniform,
                holds_replicas: false,
                cap,
                replicas: 0,
            }
        })
        .collect();

    let minimum = mode.minimum(request);
    let scheduled = schedule(request, mode, total, minimum, &current, &mut slots);
    let shortfall = (scheduled.is_ok() && minimum > 0 && total > 0)
        .then(|| {
            let clusters = slots
                .iter()
                .filter(|s| s.is_candidate() && (mode == Mode::Aggregated || s.weight > 0))
                .count();
            Shortfall {
                minimum,
                clusters,
                replicas: total,
            }
        })
        .filter(|s| u64::from(s.replicas) < u64::from(s.minimum) * s.clusters as u64);
    Decision {
        slots,
        mode,
        total,
        scheduled,
        minimum,
        shortfall,
    }
}

/// Steps 2 to 4; leaves `replicas` on the slots.
fn schedule(
    request: &PlacementRequest<'_>,
    mode: Mode,
    total: u32,
    minimum: u32,
    current: &CurrentReplicas<'_>,
    slots: &mut [Slot<'_>],
) -> Result<(), String> {
    let placement = request.placement;
    if slots.is_empty() {
        return Err("no member clusters are known".to_string());
    }
    if !slots.iter().any(Slot::is_candidate) {
        return Err(format!(
            "no candidate cluster: all {} member {} filtered out",
            slots.len(),
            if slots.len() == 1 {
                "cluster is"
            } else {
                "clusters are"
            }
        ));
    }

    // 2. Weights (they also rank groups for spread constraints).
    if let Mode::Weighted { dynamic } = mode {
        let list = placement.static_weight_list();
        let resolved = request
            .static_weights
            .filter(|w| w.len() == request.clusters.len());
        debug_assert!(
            resolved.is_none_or(|w| *w == StaticWeights::resolve(list, request.clusters)),
            "static weights resolved for other clusters or another list"
        );
        let targets =
            (resolved.is_none() && !list.is_empty()).then(|| candidates::WeightTargets::new(list));
        let mut values = Vec::new();
        for (index, slot) in slots.iter_mut().enumerate() {
            if !slot.is_candidate() {
                continue;
            }
            let held = || current.get(&slot.cluster.name);
            let fixed = || match resolved {
                Some(weights) => weights.weights[index],
                None => static_weight(slot.cluster, list, targets.as_ref(), &mut values),
            };
            (slot.weight, slot.weight_source) = weight_of(slot.cluster, fixed, dynamic, held);
        }
    }

    // 3. Spread constraints.
    let groups = spread::choose_groups(&placement.spread_constraints, slots)?;
    if !slots.iter().any(Slot::is_candidate) {
        return Err("no candidate cluster is left after the spread constraints".to_string());
    }

    // 4. Replicas.
    if total == 0 {
        // Scaled to zero is not "deleted": every candidate keeps an object with 0 replicas.
        return Ok(());
    }
    match mode {
        Mode::Duplicated => {
            for slot in slots.iter_mut().filter(|s| s.is_candidate()) {
                slot.replicas = slot.cap.map_or(total, |cap| cap.min(total));
            }
        }
        Mode::Weighted { .. } => {
            divide_weighted(request.uid, total, minimum, request.first_seat, slots)?
        }
        Mode::Aggregated => fill_aggregated(total, minimum, current, &groups, slots)?,
    }
    spread::check_after_division(&groups, slots, total)
}

/// A cluster's room for a template: what still fits plus what it holds. `available` may
/// be negative: [`capacity::with_estimates`] takes off the held replicas that do not run
/// (still pending), which the member's free capacity does not count.
fn room(available: i64, held: i32) -> u64 {
    u64::try_from(available.saturating_add(i64::from(held))).unwrap_or(0)
}

/// A cluster's weight from the staticWeightList (`targets` is the prepared list, None
/// when there is none; `values` its scratch space): the first entry that matches it, 0
/// when none does, 1 without a list.
fn static_weight<'c>(
    cluster: &'c ClusterView,
    list: &[StaticClusterWeight],
    targets: Option<&candidates::WeightTargets<'_>>,
    values: &mut Vec<Option<&'c str>>,
) -> (u64, StaticSource) {
    match targets {
        None => (1, StaticSource::Uniform),
        Some(targets) => {
            targets
                .first_match(cluster, values)
                .map_or((0, StaticSource::NoEntry), |index| {
                    (
                        u64::try_from(list[index].weight).unwrap_or(0),
                        StaticSource::Entry(index),
                    )
                })
        }
    }
}

/// The weight of a candidate and where it came from. `fixed` is its weight from the
/// staticWeightList ([`static_weight`]). A dynamic weight is the template's room in the
/// cluster: what still fits plus what it holds now (as Aggregated counts room), so the
/// division does not move replicas because its own replicas filled the cluster.
fn weight_of(
    cluster: &ClusterView,
    fixed: impl FnOnce() -> (u64, StaticSource),
    dynamic: bool,
    held: impl Fn() -> i32,
) -> (u64, WeightSource) {
    if dynamic && let Some(available) = cluster.available_replicas {
        return (room(available, held()), WeightSource::Available);
    }
    let (weight, source) = fixed();
    let source = match (dynamic, source) {
        (true, source) => WeightSource::AvailableUnknown(source),
        (false, StaticSource::Uniform) => WeightSource::Uniform,
        (false, StaticSource::Entry(index)) => WeightSource::Entry(index),
        (false, StaticSource::NoEntry) => WeightSource::NoEntry,
    };
    (weight, source)
}

fn divide_weighted(
    uid: &str,
    total: u32,
    minimum: u32,
    first_seat: Option<&str>,
    slots: &mut [Slot<'_>],
) -> Result<(), String> {
    let prefix = divide::stable_hash_prefix(uid);
    let mut members = Vec::with_capacity(slots.len());
    let mut parties = Vec::with_capacity(slots.len());
    for (index, slot) in slots.iter().enumerate() {
        if slot.is_candidate() {
            members.push(index);
            let party = Party::new(&slot.cluster.name, slot.weight, prefix);
            parties.push(if first_seat == Some(slot.cluster.name.as_str()) {
                party.seated_first()
            } else {
                party
            });
        }
    }
    if parties.iter().all(|p| p.weight == 0) {
        return Err("no candidate cluster has a positive weight".to_string());
    }
    let mut shares = divide::divide_with_minimum(total, &parties, minimum);
    // A kept cluster gets at most what it holds; its surplus goes to the others by the
    // same division. Fixing a capped cluster only raises the others' shares (house
    // monotone), so each round caps at least one more cluster and this ends.
    // (Nothing to do, and nothing allocated, when no cluster is kept: the common case.)
    let capped = members.iter().any(|&m| slots[m].cap.is_some());
    let mut fixed = vec![false; if capped { parties.len() } else { 0 }];
    loop {
        if !capped {
            break;
        }
        let over: Vec<usize> = (0..parties.len())
            .filter(|&i| !fixed[i])
            .filter(|&i| slots[members[i]].cap.is_some_and(|cap| shares[i] > cap))
            .collect();
        if over.is_empty() {
            break;
        }
        let mut left = total;
        for &i in &over {
            fixed[i] = true;
        }
        for i in 0..parties.len() {
            if fixed[i] {
                shares[i] = slots[members[i]].cap.unwrap_or(0);
                left = left.saturating_sub(shares[i]);
            }
        }
        let open: Vec<usize> = (0..parties.len()).filter(|&i| !fixed[i]).collect();
        let rest: Vec<Party<'_>> = open.iter().map(|&i| parties[i].clone()).collect();
        if left > 0 && rest.iter().all(|p| p.weight == 0) {
            let kept: Vec<&str> = (0..parties.len())
                .filter(|&i| fixed[i])
                .map(|i| parties[i].name)
                .collect();
            return Err(format!(
                "{left} more {} cannot be placed: {} keep at most the replicas they hold (not Ready or tainted) and no other candidate can take more; waiting",
                if left == 1 { "replica" } else { "replicas" },
                kept.join(", ")
            ));
        }
        for (&i, share) in open
            .iter()
            .zip(divide::divide_with_minimum(left, &rest, minimum))
        {
            shares[i] = share;
        }
    }
    for (index, share) in members.into_iter().zip(shares) {
        slots[index].replicas = share;
    }
    Ok(())
}

/// Divided/Aggregated: as few clusters as possible. Preference: clusters that hold
/// replicas now, then the most room (available replicas plus what the cluster holds;
/// unknown = unlimited), then name. One cluster per missing spread group is required
/// first, so minGroups holds; then every candidate gets `minimum` (minPerCluster) in that
/// order, then the fill.
fn fill_aggregated(
    total: u32,
    minimum: u32,
    current: &CurrentReplicas<'_>,
    groups: &[Groups<'_>],
    slots: &mut [Slot<'_>],
) -> Result<(), String> {
    let mut order: Vec<(usize, Option<u64>)> = Vec::new();
    for (index, slot) in slots.iter_mut().enumerate() {
        if !slot.is_candidate() {
            continue;
        }
        let held = u64::try_from(current.get(&slot.cluster.name)).unwrap_or(0);
        slot.holds_replicas = held > 0;
        let room = slot
            .cluster
            .available_replicas
            .map(|available| room(available, i32::try_from(held).unwrap_or(i32::MAX)));
        // A kept cluster takes at most what it holds.
        let room = match slot.cap {
            Some(cap) => Some(room.map_or(u64::from(cap), |r| r.min(u64::from(cap)))),
            None => room,
        };
        order.push((index, room));
    }
    order.sort_by(|&(a, room_a), &(b, room_b)| {
        let room = |r: Option<u64>| r.unwrap_or(u64::MAX);
        slots[b]
            .holds_replicas
            .cmp(&slots[a].holds_replicas)
            .then(room(room_b).cmp(&room(room_a)))
            .then(slots[a].cluster.name.cmp(&slots[b].cluster.name))
    });

    // Walk the preference order; a cluster that brings a new group to a constraint still
    // short of minGroups is required.
    let mut covered: Vec<Vec<bool>> = groups.iter().map(|g| vec![false; g.names.len()]).collect();
    let mut counts = vec![0usize; groups.len()];
    let mut bins = Vec::with_capacity(order.len());
    for &(index, capacity) in &order {
        let brings_new_group = groups.iter().enumerate().any(|(g, constraint)| {
            let group = constraint.group_of[index];
            counts[g] < constraint.min_groups
                && group != spread::NO_GROUP
                && !covered[g][group as usize]
        });
        if brings_new_group {
            for (g, constraint) in groups.iter().enumerate() {
                let group = constraint.group_of[index];
                if group != spread::NO_GROUP && !covered[g][group as usize] {
                    covered[g][group as usize] = true;
                    counts[g] += 1;
                }
            }
        }
        bins.push(Bin {
            capacity,
            required: brings_new_group,
        });
    }
    match divide::fill_aggregated_with_minimum(total, &bins, minimum) {
        Ok(shares) => {
            for (&(index, _), share) in order.iter().zip(shares) {
                slots[index].replicas = share;
            }
            Ok(())
        }
        Err(left) => Err(format!(
            "not enough room: {total} {} to place, the candidates can take {}",
            if total == 1 { "replica" } else { "replicas" },
            u64::from(total) - left
        )),
    }
}

/// Replicas each cluster holds now, by name.
struct CurrentReplicas<'a> {
    targets: &'a [TargetCluster],
    sorted: bool,
}

impl<'a> CurrentReplicas<'a> {
    fn new(targets: &'a [TargetCluster]) -> Self {
        CurrentReplicas {
            targets,
            sorted: targets.is_sorted_by(|a, b| a.name < b.name),
        }
    }

    fn find(&self, name: &str) -> Option<&'a TargetCluster> {
        if self.sorted {
            self.targets
                .binary_search_by(|t| t.name.as_str().cmp(name))
                .ok()
                .map(|i| &self.targets[i])
        } else {
            self.targets.iter().find(|t| t.name == name)
        }
    }

    fn get(&self, name: &str) -> i32 {
        self.find(name).map_or(0, |t| t.replicas)
    }
}

impl Decision<'_> {
    /// `Err(reason)` when no placement satisfies the policy.
    pub fn scheduled(&self) -> Result<(), &str> {
        self.scheduled.as_ref().map(|_| ()).map_err(String::as_str)
    }

    fn is_selected(&self, slot: &Slot<'_>) -> bool {
        self.scheduled.is_ok()
            && slot.is_candidate()
            && (slot.replicas > 0
                || (self.total == 0
                    && !(matches!(self.mode, Mode::Weighted { .. }) && slot.weight == 0)))
    }

    /// Slot indices in cluster-name order.
    fn name_order(&self) -> Vec<usize> {
        let slots = &self.slots;
        let mut order: Vec<usize> = (0..slots.len()).collect();
        if !slots.is_sorted_by(|a, b| a.cluster.name <= b.cluster.name) {
            order.sort_by(|&a, &b| slots[a].cluster.name.cmp(&slots[b].cluster.name));
        }
        order
    }

    /// Whether the chosen clusters and replicas are exactly `targets` (in any order), so
    /// the caller can skip a write; allocates nothing.
    pub fn has_targets(&self, targets: &[TargetCluster]) -> bool {
        let current = CurrentReplicas::new(targets);
        let mut selected = 0;
        for slot in &self.slots {
            if self.is_selected(slot) {
                selected += 1;
                if current
                    .find(&slot.cluster.name)
                    .is_none_or(|t| t.replicas != slot.replicas as i32)
                {
                    return false;
                }
            }
        }
        selected == targets.len()
    }

    /// The chosen clusters with their replicas, sorted by name; empty when unschedulable.
    pub fn targets(&self) -> Vec<TargetCluster> {
        self.name_order()
            .into_iter()
            .map(|index| &self.slots[index])
            .filter(|slot| self.is_selected(slot))
            .map(|slot| TargetCluster {
                name: slot.cluster.name.clone(),
                replicas: slot.replicas as i32,
            })
            .collect()
    }

    /// One row per known cluster, sorted by name, with its reason.
    pub fn decisions(&self) -> Vec<ClusterDecision> {
        let context = self.reason_context();
        self.name_order()
            .into_iter()
            .map(|index| {
                let slot = &self.slots[index];
                let chosen = self.is_selected(slot);
                ClusterDecision {
                    cluster: slot.cluster.name.clone(),
                    selected: chosen,
                    replicas: chosen.then_some(slot.replicas as i32),
                    reason: reason::render(slot, &context),
                }
            })
            .collect()
    }

    fn reason_context(&self) -> reason::Context<'_> {
        reason::Context {
            mode: self.mode,
            total: self.total,
            positive_weights: self
                .slots
                .iter()
                .filter(|s| s.is_candidate() && s.weight > 0)
                .count(),
            selected: self.slots.iter().filter(|s| self.is_selected(s)).count(),
            error: self.scheduled.as_ref().err().map(String::as_str),
            minimum: self.minimum,
            shortfall: self.shortfall,
        }
    }

    /// Scheduled, but `minPerCluster` could not be met everywhere: what happened and the
    /// fix, for the binding's `Scheduled` condition.
    pub fn notice(&self) -> Option<String> {
        self.shortfall
            .map(|shortfall| reason::shortfall_notice(shortfall, self.mode))
    }

    /// Targets, decisions and the scheduling result, in one pass.
    pub fn into_result(self) -> PlacementResult {
        let context = self.reason_context();
        let mut targets = Vec::with_capacity(context.selected);
        let mut decisions = Vec::with_capacity(self.slots.len());
        for index in self.name_order() {
            let slot = &self.slots[index];
            let chosen = self.is_selected(slot);
            if chosen {
                targets.push(TargetCluster {
                    name: slot.cluster.name.clone(),
                    replicas: slot.replicas as i32,
                });
            }
            decisions.push(ClusterDecision {
                cluster: slot.cluster.name.clone(),
                selected: chosen,
                replicas: chosen.then_some(slot.replicas as i32),
                reason: reason::render(slot, &context),
            });
        }
        PlacementResult {
            notice: self.notice(),
            targets,
            decisions,
            scheduled: self.scheduled,
        }
    }
}

#[cfg(test)]
mod tests;
