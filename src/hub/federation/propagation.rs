//! Propagation (DESIGN.md section 4), pure: given a template, its binding's decision and
//! what the hub last saw in every member, which copies to apply and which to delete.
//!
//! Deletion has exactly three causes, and only two of them are decided here:
//! - the template is being deleted (`deleting`): every copy goes, reachable clusters now,
//!   the others when they return (pending cleanup);
//! - the placement moved replicas away from a cluster, and the replacement is Ready
//!   (make-before-break): until then the old copy keeps its replicas.
//!
//! A copy is deleted only when the hub has positive evidence of it: the cluster is
//! reachable, its copies have been listed since the hub started (the cache is synced),
//! and the copy is in that list. A restart, a lost cache or an unreachable cluster
//! therefore never deletes anything; at worst it postpones a cleanup.
//!
//! Stateful kinds (StatefulSet, MyDatabase) add the **partition freeze**: while any
//! cluster of the current or the new placement is not Ready, no copy is deleted or
//! shrunk anywhere, whatever changed the placement; growth to Ready clusters still goes
//! out. The plan names the clusters it waits for ([`Plan::waiting_for`]).
//!
//! An unreachable cluster's copy never counts as Ready for make-before-break: what the
//! hub last saw of it may be minutes old.
//!
//! For stateful kinds "Ready" is not enough: the MemberCluster's condition lags a cut by
//! the probe thresholds while the cut-off member's agent fences at the lease duration. A
//! cluster without fresh positive evidence ([`MemberCopy::doubt`]: one failed probe or
//! lease renewal, evidence older than its window, copies not listed since it was last
//! suspect) counts as not Ready for the freeze and for make-before-break, and every
//! stateful delete or shrink carries the clusters the writer must find trusted again
//! right before it sends the request ([`Apply::guard`], [`Delete::guard`]).

use std::collections::BTreeMap;

use kube::api::DynamicObject;
use serde_json::Value;

use crate::api::resource_binding::TargetCluster;
use crate::hub::federation::copies::member_copy;
use crate::hub::federation::interpreter::Interpretation;
use crate::hub::federation::overrides::{OverrideError, TemplateOverrides};

/// What the hub knows about one member cluster and the template's copy in it.
#[derive(Clone, Copy, Debug)]
pub struct MemberCopy<'a> {
    pub cluster: &'a str,
    /// The MemberCluster is Ready: requests to it are expected to work.
    pub reachable: bool,
    /// The hub's cache of this cluster's managed copies holds a complete list.
    pub synced: bool,
    /// The member refuses to list the kind to the hub (403/404): `synced` holds, with
    /// nothing in the list, but the hub does not know what the member holds, so a
    /// cleanup recorded for it stays recorded.
    pub refused: bool,
    /// The managed copy as last seen (possibly stale while the cluster is unreachable).
    pub copy: Option<&'a DynamicObject>,
    /// Stateful kinds: why the hub lacks fresh positive evidence of the cluster
    /// (`membership::evidence`), which makes it count as not Ready for the partition
    /// freeze and make-before-break. None: it has the evidence (or the kind is
    /// stateless, for which the Ready condition decides).
    pub doubt: Option<&'a str>,
}

/// One propagation question.
#[derive(Clone, Copy, Debug)]
pub struct PlanInput<'a> {
    /// The hub template, as JSON.
    pub template: &'a Value,
    /// The binding label value `<namespace>.<name>`.
    pub binding: &'a str,
    /// How the kind is read: divisible kinds get per-cluster replicas; stateful kinds
    /// (StatefulSet, MyDatabase, ...) get the partition freeze.
    pub interpretation: &'a Interpretation,
    /// The binding's decision before this one (what the current placement was).
    pub previous: &'a [TargetCluster],
    /// The binding's decision.
    pub targets: &'a [TargetCluster],
    /// The template has a deletionTimestamp: remove every copy.
    pub deleting: bool,
    /// Every registered member.
    pub members: &'a [MemberCopy<'a>],
    /// Clusters the binding's status records as still holding a copy to delete.
    pub pending: &'a [String],
    /// The override policies of the template, applied to each cluster's copy (None: no
    /// overrides).
    pub overrides: Option<&'a TemplateOverrides<'a>>,
    /// A resync pass is on for this template, and these clusters' copies were applied
    /// again in it already: every other placed copy is applied again, even one whose
    /// applied-hash says it holds what the hub would apply (someone may have changed it
    /// since, in a way the hub's summary does not show). None: no pass.
    pub resync: Option<&'a [String]>,
    /// A rollout is on (the policy has `spec.rollout`): the revision each cluster's copy
    /// holds, and the template it is built from. None: every copy from `template`.
    pub rollout: Option<&'a BTreeMap<String, ClusterRevision>>,
    /// A MyDatabase with replica clusters: which cluster holds the primary, and whether
    /// each other placed cluster holds its Secrets. None: the copies are independent.
    pub replica_clusters: Option<&'a ReplicaClusters>,
}

/// What the hub decided and did for a MyDatabase with replica clusters
/// ([`replica_clusters`](crate::hub::federation::replica_clusters)).
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaClusters {
    /// The cluster that holds the primary, or why none can be chosen (then nothing is
    /// applied anywhere).
    pub primary: Result<String, String>,
    /// Each other placed cluster: its `<name>-instance` and `<name>-app` Secrets hold the
    /// primary cluster's (Ok), or why not yet. A replica cluster's copy waits for them:
    /// its agent would otherwise make passwords of its own.
    pub credentials: BTreeMap<String, Result<(), String>>,
    /// Where a switchover of the primary cluster stands.
    pub switchover: crate::hub::federation::replica_clusters::Switchover,
    /// When the switchover started (RFC 3339), recorded on the old primary cluster's copy
    /// while it is on: the deadline counts from it.
    pub switchover_started: Option<String>,
    /// The federation's primary term (1 until a switchover or a disaster promotion
    /// raises it); written on every copy when above 1.
    pub term: u64,
    /// The term the primary cluster's copy was written under: kept on it while a
    /// switchover moves the primary away, so that once the members hold the raised term
    /// its agent counts it deposed, whatever else its spec says.
    pub demoted_term: u64,
    /// The clusters whose copies of this kind the hub had listed when it read them for
    /// this setup. The primary cluster and the switchover's stage are decided from those
    /// copies; a cluster listed only afterwards (a hub that just started) gets no copy
    /// built from a decision made without it: it waits for the next reconcile.
    pub listed: std::collections::BTreeSet<String>,
}

/// What a cluster's copy is built from during a rollout.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterRevision {
    pub revision: i64,
    /// The template of that revision; None when the hub does not hold it (pruned, or
    /// not listed yet): nothing is applied there.
    pub template: Option<Value>,
}

/// Server-side apply of a copy to a member.
#[derive(Clone, Debug, PartialEq)]
pub struct Apply {
    pub cluster: String,
    pub object: Value,
    /// The hub has not seen a managed copy there: the executor must first check for an
    /// unmanaged object of the same name (conflictResolution).
    pub check_conflict: bool,
    /// A stateful copy shrinks: the clusters of the current and new placement, each of
    /// which the writer must find trusted right before it sends the request. Empty for
    /// every other apply.
    pub guard: Vec<String>,
    /// Applied by the resync pass (it is applied whatever the hub believes the copy
    /// holds, however recently it was written).
    pub resync: bool,
}

/// Deletion of a managed copy, guarded by its UID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delete {
    pub cluster: String,
    pub uid: Option<String>,
    /// The user deleted the template (not a placement change): the executor marks a
    /// stateful copy so its agent may apply `reclaimPolicy: Delete` to the volumes.
    pub template_deleted: bool,
    /// A stateful copy removed by a placement change: the clusters the writer must find
    /// trusted right before it sends the request (see [`Apply::guard`]).
    pub guard: Vec<String>,
}

/// The answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub applies: Vec<Apply>,
    pub deletes: Vec<Delete>,
    /// Clusters that still hold (or may hold) a copy the hub must delete later.
    pub pending_cleanup: Vec<String>,
    /// Per-cluster explanations of what the hub is waiting for.
    pub notes: BTreeMap<String, String>,
    /// Deleting, and no copy is left anywhere: the finalizer can go.
    pub cleanup_done: bool,
    /// Stateful only: the clusters of the current or new placement that are not Ready,
    /// when that held back a delete or a shrink (the partition freeze). Empty otherwise.
    pub waiting_for: Vec<String>,
    /// The clusters whose copy the freeze keeps as it is (not deleted, not shrunk).
    pub held: Vec<String>,
    /// Every placed cluster whose copy was built: the override policies that applied to
    /// it, in order (empty when none did).
    pub overrides: BTreeMap<String, Vec<String>>,
    /// Placed clusters where an override failed: nothing is applied there (the existing
    /// copy, if any, stays as it is). The message says which policy, rule and path.
    pub override_failures: BTreeMap<String, String>,
    /// Placed clusters whose copy was not built at all: unreachable, or its copies not
    /// listed yet. A resync pass is not over while one is left (the copy there is
    /// applied again once it can be).
    pub deferred: Vec<String>,
    /// A MyDatabase with replica clusters: the cluster that holds the primary.
    pub primary_cluster: Option<String>,
}

/// A count from a member's copy, clamped to `0..=i32::MAX` (never truncated: a value
/// past `i32` must not read as a small one).
pub(crate) fn count(value: i64) -> i32 {
    value.clamp(0, i64::from(i32::MAX)) as i32
}

/// `spec.replicas` of a copy.
pub fn copy_replicas(copy: &DynamicObject) -> Option<i32> {
    copy.data["spec"]["replicas"].as_i64().map(count)
}

/// Ready replicas a copy reports.
pub fn copy_ready(copy: &DynamicObject) -> i32 {
    copy.data["status"]["readyReplicas"]
        .as_i64()
        .map_or(0, count)
}

/// Whether the member copy already holds what the hub would apply: the copy's
/// applied-hash annotation equals the desired one. The hub's caches keep only a summary
/// of each copy, not its body, so this hash is what it compares; a copy without it
/// (applied by an older hub) is applied once more, which adds it.
pub fn copy_matches(desired: &Value, existing: &DynamicObject) -> bool {
    use crate::hub::federation::copies::ANNOTATION_HASH_KEY;
    if existing.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let wanted = desired["metadata"]["annotations"][ANNOTATION_HASH_KEY].as_str();
    let held = existing
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_HASH_KEY));
    matches!((wanted, held), (Some(wanted), Some(held)) if wanted == held)
}

/// Plans one template; see the module documentation.
pub fn plan(input: &PlanInput<'_>) -> Plan {
    let mut plan = Plan::default();
    if input.deleting {
        plan_cleanup(input, &mut plan);
        return plan;
    }
    // The primary cluster of replica clusters that the placement dropped stays a target
    // with the replicas its copy has until the primary moved elsewhere: its copy is
    // applied as before (demoted and marked by the switchover that moves the primary).
    let kept_primary = kept_primary(input);
    if let Some(kept) = &kept_primary {
        plan.pending_cleanup.push(kept.name.clone());
    }
    let target = |cluster: &str| {
        input
            .targets
            .iter()
            .find(|t| t.name == cluster && t.replicas > 0)
            .or(kept_primary.as_ref().filter(|t| t.name == cluster))
            .or_else(|| input.targets.iter().find(|t| t.name == cluster))
    };
    let replacement_ready = replacement_ready(input);
    let involved = stateful_placement(input);
    let frozen_by: Vec<String> = involved
        .iter()
        .filter(|cluster| !trusted(input, cluster))
        .map(|cluster| cluster.to_string())
        .collect();
    let frozen = !frozen_by.is_empty();
    let guard: Vec<String> = involved.iter().map(|c| c.to_string()).collect();
    let waiting = || {
        format!(
            "waiting for the partition: {} not Ready, so no copy of this stateful template is deleted or shrunk anywhere",
            frozen_by
                .iter()
                .map(|cluster| not_ready_because(input, cluster))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let mut held: Vec<String> = vec![];

    for member in input.members {
        let cluster = member.cluster.to_string();
        match target(member.cluster) {
            Some(t) => {
                if !member.reachable {
                    // A shrink of the cut-off cluster itself waits for it too.
                    if frozen
                        && input.interpretation.divisible()
                        && member
                            .copy
                            .and_then(copy_replicas)
                            .is_some_and(|current| current > t.replicas)
                    {
                        held.push(cluster.clone());
                    }
                    plan.notes.insert(
                        cluster.clone(),
                        "cluster unreachable; the copy is applied when it returns".into(),
                    );
                    plan.deferred.push(cluster);
                    continue;
                }
                if !member.synced {
                    plan.notes.insert(
                        cluster.clone(),
                        "listing the cluster's copies; applied once they are known".into(),
                    );
                    plan.deferred.push(cluster);
                    continue;
                }
                let mut replicas = t.replicas;
                let current = member.copy.and_then(copy_replicas);
                if input.interpretation.divisible()
                    && let Some(current) = current
                    && current > replicas
                {
                    if frozen {
                        plan.notes.insert(
                            cluster.clone(),
                            format!("{}: keeping {current} replicas, then {replicas}", waiting()),
                        );
                        replicas = current;
                        held.push(cluster.clone());
                    } else if !replacement_ready {
                        plan.notes.insert(
                            cluster.clone(),
                            format!(
                                "keeping {current} replicas until the new placement is Ready elsewhere (make-before-break), then {replicas}"
                            ),
                        );
                        replicas = current;
                    }
                }
                let (template, revision) = match input.rollout.map(|r| r.get(member.cluster)) {
                    Some(Some(ClusterRevision {
                        revision,
                        template: Some(template),
                    })) => (template, Some(*revision)),
                    Some(Some(ClusterRevision {
                        revision,
                        template: None,
                    })) => {
                        plan.notes.insert(
                            cluster.clone(),
                            format!("revision {revision} is not known to the hub; the copy is left as it is"),
                        );
                        plan.deferred.push(cluster);
                        continue;
                    }
                    // A placed cluster the rollout did not assign: nothing new goes there.
                    Some(None) => {
                        plan.deferred.push(cluster);
                        continue;
                    }
                    None => (input.template, None),
                };
                let mut desired = member_copy(
                    template,
                    input.binding,
                    Some(replicas),
                    input.interpretation,
                );
                if let Some(revision) = revision {
                    desired["metadata"]["annotations"][crate::api::rollout::ANNOTATION_REVISION] =
                        Value::String(revision.to_string());
                    crate::hub::federation::copies::restamp(&mut desired);
                }
                // Overrides per cluster; one that fails applies nothing there.
                let desired = match input.overrides {
                    None => desired,
                    Some(overrides) => match overrides.copy_for(member.cluster, desired) {
                        Ok((overridden, applied)) => {
                            plan.overrides.insert(cluster.clone(), applied);
                            overridden
                        }
                        Err(error) => {
                            let message = override_failure(&error, member.cluster);
                            plan.notes.insert(cluster.clone(), message.clone());
                            plan.override_failures.insert(cluster, message);
                            continue;
                        }
                    },
                };
                // Replica clusters: the primary cluster recorded on every copy, the
                // others streaming from it; a replica waits for its source and Secrets.
                let desired = match input.replica_clusters {
                    None => desired,
                    Some(setup) => {
                        match replica_copy(input, setup, member.cluster, desired, &mut plan.notes) {
                            Ok(desired) => desired,
                            Err(note) => {
                                plan.notes.insert(cluster.clone(), note);
                                plan.deferred.push(cluster);
                                continue;
                            }
                        }
                    }
                };
                if kept_primary.as_ref().is_some_and(|k| k.name == cluster) {
                    let how = plan.notes.remove(&cluster).unwrap_or_else(|| {
                        "set spec.topology.primaryCluster to a placed cluster (or unset it), or use `bulkhead switchover`".into()
                    });
                    plan.notes.insert(
                        cluster.clone(),
                        format!(
                            "removed from the placement, but it holds the primary of the replica clusters: its copy stays until the primary moved to a placed cluster; {how}"
                        ),
                    );
                }
                let resync = input
                    .resync
                    .is_some_and(|done| !done.iter().any(|c| c == member.cluster));
                if !resync && member.copy.is_some_and(|copy| copy_matches(&desired, copy)) {
                    continue;
                }
                let shrinks = input.interpretation.divisible()
                    && current.is_some_and(|current| current > replicas);
                plan.applies.push(Apply {
                    cluster,
                    object: desired,
                    check_conflict: member.copy.is_none(),
                    guard: if shrinks { guard.clone() } else { vec![] },
                    resync,
                });
            }
            None => {
                let recorded = input.pending.iter().any(|p| p == member.cluster);
                // Placed by the decision before this one: the cluster may hold a copy
                // the hub has not seen, and is recorded until its copies are listed
                // (a cluster removed while cut off would otherwise drop out of the
                // stateful placement, and its copy out of the freeze, the moment the
                // decision is written).
                let placed = input.previous.iter().any(|t| t.name == member.cluster);
                let holds = member.copy.is_some();
                if member.reachable && member.synced && !(member.refused && recorded) {
                    if !holds {
                        continue;
                    }
                    if frozen {
                        plan.notes.insert(
                            cluster.clone(),
                            format!("removed from the placement; {}: the copy stays", waiting()),
                        );
                        held.push(cluster.clone());
                    } else if replacement_ready {
                        plan.deletes.push(Delete {
                            cluster: cluster.clone(),
                            uid: member.copy.and_then(|c| c.metadata.uid.clone()),
                            template_deleted: false,
                            guard: guard.clone(),
                        });
                        plan.notes.insert(
                            cluster.clone(),
                            "removed from the placement; deleting the copy".into(),
                        );
                    } else {
                        plan.notes.insert(
                            cluster.clone(),
                            "removed from the placement; the copy stays until the new placement is Ready (make-before-break)".into(),
                        );
                    }
                    plan.pending_cleanup.push(cluster);
                } else if holds || recorded || placed {
                    // Its removal waits for the cluster: for a stateful kind, that is the
                    // partition freeze too.
                    if frozen {
                        held.push(cluster.clone());
                    }
                    plan.notes.insert(
                        cluster.clone(),
                        "removed from the placement; the copy is deleted once the cluster is reachable and the new placement is Ready".into(),
                    );
                    plan.pending_cleanup.push(cluster);
                }
            }
        }
    }
    if !held.is_empty() {
        plan.waiting_for = frozen_by;
        plan.held = held;
    }
    plan.primary_cluster = input
        .replica_clusters
        .and_then(|setup| setup.primary.clone().ok());
    plan
}

/// The primary cluster of replica clusters when the placement no longer gives it
/// replicas, as a target with the replicas its copy has: removing it would leave no
/// writable copy anywhere, so it stays until a switchover moved the primary.
/// Not when the whole database is scaled to zero (its target there has 0 replicas and no
/// other cluster has any): that copy goes to 0 replicas as any copy does.
fn kept_primary(input: &PlanInput<'_>) -> Option<TargetCluster> {
    let primary = input.replica_clusters?.primary.as_ref().ok()?;
    let placed_here = input.targets.iter().find(|t| t.name == *primary);
    let placed_elsewhere = input
        .targets
        .iter()
        .any(|t| t.name != *primary && t.replicas > 0);
    match placed_here {
        Some(t) if t.replicas > 0 => return None,
        Some(_) if !placed_elsewhere => return None,
        _ => {}
    }
    let copy = input.members.iter().find(|m| m.cluster == primary)?.copy?;
    Some(TargetCluster {
        name: primary.clone(),
        replicas: copy_replicas(copy)?.max(1),
    })
}

/// A cluster's copy of a MyDatabase with replica clusters: the primary cluster recorded
/// on it, and for a replica cluster where it streams from. `Err`: why it is not applied
/// yet.
fn replica_copy(
    input: &PlanInput<'_>,
    setup: &ReplicaClusters,
    cluster: &str,
    mut desired: Value,
    notes: &mut BTreeMap<String, String>,
) -> Result<Value, String> {
    use crate::hub::federation::replica_clusters::endpoint;
    let primary = setup
        .primary
        .as_deref()
        .map_err(|why| format!("not applied: {why}"))?;
    // Built only from a setup that saw this cluster's copies and the primary cluster's
    // (which carry whether a switchover is under way): a hub that just started must not
    // write the old primary cluster's copy writable from a stage decided without it.
    if !setup.listed.contains(primary) {
        return Err(format!(
            "listing {primary}'s copies (the primary cluster's copy says whether a switchover is under way); applied once they are known"
        ));
    }
    if !setup.listed.contains(cluster) {
        return Err("listing the cluster's copies; applied once they are known".into());
    }
    let moving_to = setup.switchover.started_to();
    if let Some(note) = setup.switchover.describe(primary)
        && (cluster == primary || Some(cluster) == setup.switchover.target())
    {
        notes.insert(cluster.to_string(), note);
    }
    let source = if cluster == primary {
        if let Some(to) = moving_to {
            // Demoted first, and read-only until it follows the new primary cluster.
            desired["spec"]["readOnly"] = Value::Bool(true);
            desired["metadata"]["annotations"][crate::api::ANNOTATION_SWITCHOVER_TO] =
                Value::String(to.to_string());
            if let Some(started) = &setup.switchover_started {
                desired["metadata"]["annotations"][crate::api::ANNOTATION_SWITCHOVER_STARTED] =
                    Value::String(started.clone());
            }
        }
        None
    } else if Some(cluster) == moving_to && setup.switchover.promotes() {
        // It has all of the old primary's WAL: promoted, streaming from nothing, and
        // marked so (the switchover only goes forward from here).
        desired["metadata"]["annotations"][crate::api::ANNOTATION_SWITCHOVER_TO] =
            Value::String(cluster.to_string());
        desired["metadata"]["annotations"][crate::api::ANNOTATION_SWITCHOVER_PROMOTED] =
            Value::String(primary.to_string());
        None
    } else {
        if Some(cluster) == moving_to {
            // Its agent reports its position every second meanwhile.
            desired["metadata"]["annotations"][crate::api::ANNOTATION_SWITCHOVER_TO] =
                Value::String(cluster.to_string());
        }
        let name = input.template["metadata"]["name"]
            .as_str()
            .unwrap_or_default();
        let source = input
            .members
            .iter()
            .find(|m| m.cluster == primary)
            .and_then(|m| m.copy)
            .and_then(endpoint)
            .ok_or_else(|| {
                format!(
                    "a replica cluster of {primary}: applied once {primary}'s copy publishes where its primary is reached (status.endpoint)"
                )
            })?;
        match setup.credentials.get(cluster) {
            Some(Ok(())) => {}
            Some(Err(why)) => return Err(why.clone()),
            None => {
                return Err(format!(
                    "a replica cluster of {primary}: applied once {primary}'s Secrets {name}-instance and {name}-app are copied here"
                ));
            }
        }
        Some(source)
    };
    if !desired["spec"]["topology"].is_object() {
        desired["spec"]["topology"] = Value::Object(Default::default());
    }
    let topology = desired["spec"]["topology"]
        .as_object_mut()
        .expect("an object: set just above");
    match source {
        Some(source) => {
            topology.insert(
                "replicaOf".into(),
                serde_json::to_value(source).unwrap_or_default(),
            );
        }
        None => {
            topology.remove("replicaOf");
        }
    }
    desired["metadata"]["annotations"][crate::api::ANNOTATION_PRIMARY_CLUSTER] =
        Value::String(primary.to_string());
    let term = if cluster == primary && moving_to.is_some() {
        setup.demoted_term.min(setup.term)
    } else {
        setup.term
    };
    if term > 1 {
        // Written under the raised term: the agent no longer counts the copy deposed.
        desired["metadata"]["annotations"][crate::api::ANNOTATION_PRIMARY_TERM] =
            Value::String(term.to_string());
    }
    crate::hub::federation::copies::restamp(&mut desired);
    Ok(desired)
}

/// The binding row's message for an override that failed on `cluster`.
pub fn override_failure(error: &OverrideError, cluster: &str) -> String {
    format!(
        "override failed: {error}; nothing of this template is applied to {cluster} until the override policy is fixed (the copy there, if any, is left as it is)"
    )
}

/// Whether a cluster counts as Ready for a stateful template's deletes and shrinks: its
/// MemberCluster is Ready and the hub has fresh positive evidence of it. A cluster the
/// hub no longer knows (unjoined) does not.
fn trusted(input: &PlanInput<'_>, cluster: &str) -> bool {
    input
        .members
        .iter()
        .any(|m| m.cluster == cluster && m.reachable && m.synced && m.doubt.is_none())
}

/// `cluster`, and why it is not trusted when the Ready condition does not say it.
fn not_ready_because(input: &PlanInput<'_>, cluster: &str) -> String {
    match input.members.iter().find(|m| m.cluster == cluster) {
        Some(MemberCopy {
            reachable: true,
            doubt: Some(doubt),
            ..
        }) => format!("{cluster} ({doubt})"),
        Some(MemberCopy {
            reachable: true,
            synced: false,
            ..
        }) => format!("{cluster} (its copies are not listed yet)"),
        _ => cluster.to_string(),
    }
}

/// Stateful kinds only: the clusters of the current placement (the previous decision,
/// every cluster the hub last saw holding a copy, recorded cleanups, and every member
/// whose copies the hub has not listed: it may hold one, as far as the hub knows) and
/// the new one. Every one of them must be trusted for a copy to be deleted or shrunk
/// anywhere.
fn stateful_placement<'a>(input: &PlanInput<'a>) -> Vec<&'a str> {
    if !input.interpretation.stateful {
        return vec![];
    }
    let mut placement: Vec<&str> = input
        .targets
        .iter()
        .chain(input.previous)
        .map(|t| t.name.as_str())
        .chain(
            input
                .members
                .iter()
                .filter(|m| m.copy.is_some() || !m.synced)
                .map(|m| m.cluster),
        )
        .chain(input.pending.iter().map(String::as_str))
        .collect();
    placement.sort_unstable();
    placement.dedup();
    placement
}

/// Every cluster that keeps or gains replicas is Ready at its target: only then may a
/// shrinking or removed cluster lose its replicas. An unreachable target never counts as
/// Ready unless it is itself shrinking: the copy the hub last saw there may be stale.
fn replacement_ready(input: &PlanInput<'_>) -> bool {
    input.targets.iter().all(|t| {
        let member = input.members.iter().find(|m| m.cluster == t.name);
        let copy = member.and_then(|m| m.copy);
        let current = copy.and_then(copy_replicas);
        if input.interpretation.divisible() && current.is_some_and(|c| c > t.replicas) {
            // Shrinking itself: a replacement once it holds its new share Ready (a copy
            // scaled up a moment ago and down again may hold none of it yet).
            let known = member.is_some_and(|m| m.reachable && m.synced && m.doubt.is_none());
            if !known {
                // Stateless: what an unreachable cluster holds is not waited for.
                return !input.interpretation.stateful;
            }
            // By the kind's health rule: a kind that reports no readiness is Ready as
            // applied (the chaos run found a stateful custom kind's shrink waiting for a
            // ready count it never reports).
            return copy.is_some_and(|c| ready_at_target(input.interpretation, c, t.replicas));
        }
        match member {
            Some(m) if m.reachable && m.synced && m.doubt.is_none() => match copy {
                None => false,
                Some(copy) if !input.interpretation.divisible() => {
                    copy.metadata.deletion_timestamp.is_none()
                }
                Some(copy) => {
                    current == Some(t.replicas)
                        && ready_at_target(input.interpretation, copy, t.replicas)
                }
            },
            _ => false,
        }
    })
}

/// Whether a copy that holds its target replicas is Ready by its kind's health rule: its
/// ready count reaches them (`ReadyReplicas`), its condition holds (`Condition`), or it is
/// there as applied (`Present`: a kind that reports no readiness is Ready once its copy
/// carries the new count, or make-before-break would wait for it forever).
pub fn ready_at_target(
    interpretation: &Interpretation,
    copy: &DynamicObject,
    replicas: i32,
) -> bool {
    if copy.metadata.deletion_timestamp.is_some() {
        return false;
    }
    if !observed_current(copy) {
        return false;
    }
    if interpretation.reports_readiness() {
        return copy_ready(copy) >= replicas;
    }
    interpretation.condition_healthy(copy.data.get("status")) != Some(false)
}

/// Whether a copy has finished rolling out its current spec: Ready at `replicas` by its
/// kind's health rule and, where its status says so, every replica updated and none of
/// an older spec left. A Deployment in the middle of a rolling update still counts its
/// old pods as ready; a rollout wave must not pass on them (the lab showed it: a wave
/// judged healthy while its new pods had not started).
pub fn rolled_out(interpretation: &Interpretation, copy: &DynamicObject, replicas: i32) -> bool {
    if !ready_at_target(interpretation, copy, replicas) {
        return false;
    }
    let status = &copy.data["status"];
    // Right after a spec change a Deployment's controller reports no `updatedReplicas`
    // at all (a 0 is left out) while its old pods are still Ready.
    let updated = status["updatedReplicas"]
        .as_i64()
        .map(count)
        .or(interpretation.quirks.omits_zero_counts.then_some(0));
    let total = status["replicas"].as_i64().map(count);
    updated.is_none_or(|u| u >= replicas) && total.is_none_or(|t| t <= replicas)
}

/// Whether the copy's controller has observed its current generation (or does not say):
/// Ready counts for the copy's current spec only, a status written for an earlier
/// generation says nothing of the spec the hub just applied.
fn observed_current(copy: &DynamicObject) -> bool {
    match (
        copy.metadata.generation,
        copy.data["status"]["observedGeneration"].as_i64(),
    ) {
        (Some(generation), Some(observed)) => observed >= generation,
        _ => true,
    }
}

/// Whether a (slim) copy is Ready at the replicas it holds, by its kind's health rule (a
/// copy without a replica count holds one, as a Deployment does).
pub fn copy_settled(interpretation: &Interpretation, copy: &DynamicObject) -> bool {
    ready_at_target(interpretation, copy, copy_replicas(copy).unwrap_or(1))
}

fn plan_cleanup(input: &PlanInput<'_>, plan: &mut Plan) {
    for member in input.members {
        let cluster = member.cluster.to_string();
        let recorded = input.pending.iter().any(|p| p == member.cluster);
        if member.reachable && member.synced && !(member.refused && recorded) {
            if let Some(copy) = member.copy {
                if copy.metadata.deletion_timestamp.is_none() {
                    plan.deletes.push(Delete {
                        cluster: cluster.clone(),
                        uid: copy.metadata.uid.clone(),
                        template_deleted: true,
                        guard: vec![],
                    });
                }
                plan.notes
                    .insert(cluster.clone(), "deleting the copy".into());
                plan.pending_cleanup.push(cluster);
            }
        } else {
            let placed = input.targets.iter().any(|t| t.name == member.cluster);
            // Copies never listed (this term's watch has not listed the cluster yet) may
            // hold one the hub does not know of: a template deleted before its binding
            // was written (a new one whose copies had not converged) names no cluster,
            // and a previous leader may have applied its copies anywhere.
            let unknown = !member.synced;
            if member.copy.is_some() || placed || recorded || unknown {
                plan.notes.insert(
                    cluster.clone(),
                    "template deleted; the copy is deleted once the cluster is reachable".into(),
                );
                plan.pending_cleanup.push(cluster);
            }
        }
    }
    plan.cleanup_done = plan.pending_cleanup.is_empty();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built_in(api_version: &str, kind: &str) -> &'static Interpretation {
        let interpretation =
            crate::hub::federation::interpreter::Interpreters::built_in().get(api_version, kind);
        Box::leak(Box::new((*interpretation).clone()))
    }

    /// The copy with the built-in interpretation of the template's kind.
    fn copy_of(template: &Value, binding: &str, replicas: Option<i32>) -> Value {
        let interpretation = crate::hub::federation::interpreter::Interpreters::built_in().get(
            template["apiVersion"].as_str().unwrap_or_default(),
            template["kind"].as_str().unwrap_or_default(),
        );
        crate::hub::federation::copies::member_copy(template, binding, replicas, &interpretation)
    }
    use kube::ResourceExt;
    use serde_json::json;

    fn template(replicas: i64) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "uid": "hub-uid", "labels": {"app": "web"}},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "web", "image": "nginx"}]}}}
        })
    }

    /// A member copy as the hub's cache would hold it.
    fn copy(replicas: i32, ready: i32, uid: &str) -> DynamicObject {
        let mut value = copy_of(&template(6), "shop.web", Some(replicas));
        value["metadata"]["uid"] = json!(uid);
        value["spec"]["progressDeadlineSeconds"] = json!(600);
        value["status"] = json!({"replicas": replicas, "readyReplicas": ready});
        serde_json::from_value(value).unwrap()
    }

    fn targets(list: &[(&str, i32)]) -> Vec<TargetCluster> {
        list.iter()
            .map(|(name, replicas)| TargetCluster {
                name: name.to_string(),
                replicas: *replicas,
            })
            .collect()
    }

    /// A member the hub cannot reach, with the copy it last saw there.
    fn unreachable<'a>(cluster: &'a str, copy: Option<&'a DynamicObject>) -> MemberCopy<'a> {
        MemberCopy {
            reachable: false,
            ..member(cluster, copy)
        }
    }

    fn member<'a>(cluster: &'a str, copy: Option<&'a DynamicObject>) -> MemberCopy<'a> {
        MemberCopy {
            cluster,
            reachable: true,
            synced: true,
            refused: false,
            copy,
            doubt: None,
        }
    }

    fn input<'a>(
        template: &'a Value,
        targets: &'a [TargetCluster],
        members: &'a [MemberCopy<'a>],
    ) -> PlanInput<'a> {
        PlanInput {
            template,
            binding: "shop.web",
            interpretation: built_in("apps/v1", "Deployment"),
            previous: &[],
            targets,
            deleting: false,
            members,
            pending: &[],
            overrides: None,
            resync: None,
            rollout: None,
            replica_clusters: None,
        }
    }

    #[test]
    fn new_copies_are_applied_with_each_clusters_share_and_checked_for_conflicts() {
        let template = template(6);
        let targets = targets(&[("east", 4), ("west", 2)]);
        let members = [
            member("east", None),
            member("west", None),
            member("north", None),
        ];
        let plan = plan(&input(&template, &targets, &members));
        let applied: Vec<(&str, i64, bool)> = plan
            .applies
            .iter()
            .map(|a| {
                (
                    a.cluster.as_str(),
                    a.object["spec"]["replicas"].as_i64().unwrap(),
                    a.check_conflict,
                )
            })
            .collect();
        assert_eq!(applied, [("east", 4, true), ("west", 2, true)]);
        assert!(plan.deletes.is_empty() && plan.pending_cleanup.is_empty());
    }

    /// Overrides per cluster: east gets its override (and a hash of its own, so a change
    /// of the override re-applies it), west the plain copy; a failing override applies
    /// nothing there and leaves the copy as it is, while the other clusters go on.
    #[test]
    fn overrides_change_only_their_clusters_and_a_failure_applies_nothing_there() {
        use crate::api::override_policy::{
            ImageComponent, ImageOverrider, Operator, OverrideRule, OverrideSpec, Overriders,
            PatchOp, PlaintextOverrider,
        };
        use crate::api::propagation_policy::{ClusterAffinity, ResourceSelector};
        use crate::hub::federation::matching::PolicyScope;
        use crate::hub::federation::overrides::{OverridePolicyRef, WorkloadPaths};
        use crate::hub::federation::placement::ClusterView;
        let rule = |zone: &str, overriders: Overriders| OverrideRule {
            target_cluster: Some(ClusterAffinity {
                zones: vec![zone.into()],
                ..Default::default()
            }),
            overriders,
        };
        let spec = OverrideSpec {
            resource_selectors: vec![ResourceSelector {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                ..Default::default()
            }],
            override_rules: vec![
                rule(
                    "zone-a",
                    Overriders {
                        image_overrider: vec![ImageOverrider {
                            component: ImageComponent::Registry,
                            operator: Operator::Replace,
                            value: "mirror.east.example".into(),
                            container_names: vec![],
                        }],
                        ..Default::default()
                    },
                ),
                rule(
                    "zone-c",
                    Overriders {
                        plaintext: vec![PlaintextOverrider {
                            op: PatchOp::Replace,
                            path: "/spec/nothing".into(),
                            value: Some(serde_json::json!(1)),
                            from: None,
                        }],
                        ..Default::default()
                    },
                ),
            ],
        };
        let views: Vec<ClusterView> = [("east", "zone-a"), ("west", "zone-b"), ("north", "zone-c")]
            .iter()
            .map(|(name, zone)| ClusterView {
                name: name.to_string(),
                zone: zone.to_string(),
                ready: true,
                ..Default::default()
            })
            .collect();
        let overrides = TemplateOverrides {
            policies: vec![OverridePolicyRef {
                scope: PolicyScope::Namespaced,
                namespace: Some("shop"),
                name: "web-zones",
                spec: &spec,
            }],
            clusters: &views,
            paths: WorkloadPaths::builtin("apps/v1", "Deployment"),
        };
        let template = template(6);
        let targets = targets(&[("east", 2), ("west", 2), ("north", 2)]);
        let west = copy(2, 2, "w");
        let north = copy(1, 1, "n");
        let members = [
            member("east", None),
            member("west", Some(&west)),
            member("north", Some(&north)),
        ];
        let plan = plan(&PlanInput {
            overrides: Some(&overrides),
            ..input(&template, &targets, &members)
        });
        let applied: Vec<&str> = plan.applies.iter().map(|a| a.cluster.as_str()).collect();
        assert_eq!(applied, ["east"], "west matches already, north fails");
        let image = &plan.applies[0].object["spec"]["template"]["spec"]["containers"][0]["image"];
        assert_eq!(image, "mirror.east.example/nginx");
        assert_eq!(plan.overrides["east"], ["OverridePolicy/web-zones"]);
        assert!(plan.overrides["west"].is_empty());
        let failure = &plan.override_failures["north"];
        assert!(
            failure.starts_with("override failed: OverridePolicy/shop/web-zones spec.overrideRules[1].overriders.plaintext[0] at /spec/nothing")
                && failure.contains("nothing of this template is applied to north"),
            "{failure}"
        );
        assert_eq!(plan.notes["north"], *failure);
        assert!(plan.deletes.is_empty(), "a failure never deletes");
    }

    #[test]
    fn a_matching_copy_costs_no_write_and_a_drifted_one_is_reapplied() {
        let template = template(6);
        let targets = targets(&[("east", 4), ("west", 2)]);
        let east = copy(4, 4, "e");
        let west = copy(2, 2, "w");
        let members = [member("east", Some(&east)), member("west", Some(&west))];
        assert_eq!(plan(&input(&template, &targets, &members)), Plan::default());

        // Applied for another version of the template: another hash.
        let mut stale = copy(4, 4, "e");
        stale
            .annotations_mut()
            .insert(crate::api::ANNOTATION_APPLIED_HASH.into(), "0".into());
        let members = [member("east", Some(&stale)), member("west", Some(&west))];
        let first = plan(&input(&template, &targets, &members));
        assert_eq!(first.applies.len(), 1);
        assert!(!first.applies[0].check_conflict, "ours already");

        // Applied by an older hub (no hash): applied once more, which adds it.
        let mut legacy = copy(4, 4, "e");
        legacy
            .annotations_mut()
            .remove(crate::api::ANNOTATION_APPLIED_HASH);
        let members = [member("east", Some(&legacy)), member("west", Some(&west))];
        assert_eq!(plan(&input(&template, &targets, &members)).applies.len(), 1);
    }

    #[test]
    fn shrinking_waits_for_the_growing_cluster_to_be_ready() {
        let template = template(6);
        // Weights changed from 4/2 to 3/3: west grows first, east keeps 4.
        let targets = targets(&[("east", 3), ("west", 3)]);
        let east = copy(4, 4, "e");
        let west_old = copy(2, 2, "w");
        let members = [member("east", Some(&east)), member("west", Some(&west_old))];
        let first = plan(&input(&template, &targets, &members));
        let replicas: Vec<(&str, i64)> = first
            .applies
            .iter()
            .map(|a| {
                (
                    a.cluster.as_str(),
                    a.object["spec"]["replicas"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(replicas, [("west", 3)], "east is held at 4");
        assert!(first.notes["east"].contains("make-before-break"));

        let west_growing = copy(3, 2, "w");
        let members = [
            member("east", Some(&east)),
            member("west", Some(&west_growing)),
        ];
        assert!(
            plan(&input(&template, &targets, &members))
                .applies
                .is_empty(),
            "still waiting"
        );

        let west_ready = copy(3, 3, "w");
        let members = [
            member("east", Some(&east)),
            member("west", Some(&west_ready)),
        ];
        let last = plan(&input(&template, &targets, &members));
        assert_eq!(last.applies.len(), 1);
        assert_eq!(
            (
                last.applies[0].cluster.as_str(),
                last.applies[0].object["spec"]["replicas"].as_i64()
            ),
            ("east", Some(3))
        );
    }

    #[test]
    fn a_removed_cluster_is_deleted_only_after_the_replacement_is_ready() {
        let template = template(6);
        let targets = targets(&[("west", 3), ("north", 3)]);
        let east = copy(2, 2, "e");
        let west = copy(2, 2, "w");
        let north = copy(2, 2, "n");
        let members = [
            member("east", Some(&east)),
            member("west", Some(&west)),
            member("north", Some(&north)),
        ];
        let first = plan(&input(&template, &targets, &members));
        assert!(first.deletes.is_empty());
        assert_eq!(first.pending_cleanup, ["east"]);
        assert_eq!(first.applies.len(), 2);

        let west = copy(3, 3, "w");
        let north = copy(3, 3, "n");
        let members = [
            member("east", Some(&east)),
            member("west", Some(&west)),
            member("north", Some(&north)),
        ];
        let last = plan(&input(&template, &targets, &members));
        assert_eq!(
            last.deletes,
            [Delete {
                cluster: "east".into(),
                uid: Some("e".into()),
                template_deleted: false,
                guard: vec![],
            }]
        );
    }

    #[test]
    fn nothing_is_deleted_in_a_cluster_the_hub_cannot_see() {
        let template = template(6);
        let targets = targets(&[("west", 3), ("north", 3)]);
        let east = copy(2, 2, "e");
        let west = copy(3, 3, "w");
        let north = copy(3, 3, "n");
        let cut_off_east = unreachable("east", Some(&east));
        let members = [
            cut_off_east,
            member("west", Some(&west)),
            member("north", Some(&north)),
        ];
        let plan_unreachable = plan(&input(&template, &targets, &members));
        assert!(plan_unreachable.deletes.is_empty());
        assert_eq!(plan_unreachable.pending_cleanup, ["east"]);

        // A restarted hub that has not listed east yet, with the cleanup recorded.
        let mut unsynced = member("east", None);
        unsynced.synced = false;
        let members = [
            unsynced,
            member("west", Some(&west)),
            member("north", Some(&north)),
        ];
        let pending = vec!["east".to_string()];
        let mut restarted = input(&template, &targets, &members);
        restarted.pending = &pending;
        let plan_restarted = plan(&restarted);
        assert!(plan_restarted.deletes.is_empty());
        assert_eq!(plan_restarted.pending_cleanup, ["east"], "still pending");

        // Synced and empty: nothing to delete, nothing pending.
        let members = [
            member("east", None),
            member("west", Some(&west)),
            member("north", Some(&north)),
        ];
        let mut synced = input(&template, &targets, &members);
        synced.pending = &pending;
        assert_eq!(plan(&synced).pending_cleanup, Vec::<String>::new());
    }

    #[test]
    fn an_unreachable_target_is_left_alone_and_never_counts_as_ready() {
        let template = template(6);
        let targets = targets(&[("east", 2), ("west", 2), ("north", 2)]);
        // East was last seen Ready with 2: stale evidence, so west and north wait.
        let east = copy(2, 2, "e");
        let west = copy(3, 3, "w");
        let north = copy(3, 3, "n");
        let cut_off_east = unreachable("east", Some(&east));
        let members = [
            cut_off_east,
            member("west", Some(&west)),
            member("north", Some(&north)),
        ];
        let kept = plan(&input(&template, &targets, &members));
        assert!(kept.applies.is_empty(), "{:?}", kept.applies);
        assert!(kept.notes["west"].contains("make-before-break"));

        // The first scenario: the removed cluster's copy is not deleted because
        // an unreachable target's stale copy looks big enough.
        let targets = targets_of(&[("east", 1)]);
        let east = copy(1, 1, "e");
        let west = copy(1, 1, "w");
        let cut_off_east = unreachable("east", Some(&east));
        let members = [cut_off_east, member("west", Some(&west))];
        let plan = plan(&input(&template, &targets, &members));
        assert!(plan.deletes.is_empty(), "{:?}", plan.deletes);
        assert_eq!(plan.pending_cleanup, ["west"]);
    }

    fn targets_of(list: &[(&str, i32)]) -> Vec<TargetCluster> {
        targets(list)
    }

    fn database(replicas: i64) -> Value {
        json!({
            "apiVersion": "example.com/v1", "kind": "MyDatabase",
            "metadata": {"name": "orders", "namespace": "shop", "uid": "hub-db"},
            "spec": {"replicas": replicas, "version": "16"}
        })
    }

    fn database_copy(replicas: i32, ready: i32, uid: &str) -> DynamicObject {
        let mut value = copy_of(&database(2), "shop.orders", Some(replicas));
        value["metadata"]["uid"] = json!(uid);
        value["status"] = json!({"replicas": replicas, "readyReplicas": ready});
        serde_json::from_value(value).unwrap()
    }

    fn stateful<'a>(
        template: &'a Value,
        targets: &'a [TargetCluster],
        previous: &'a [TargetCluster],
        members: &'a [MemberCopy<'a>],
    ) -> PlanInput<'a> {
        PlanInput {
            template,
            binding: "shop.orders",
            interpretation: built_in("example.com/v1", "MyDatabase"),
            previous,
            targets,
            deleting: false,
            members,
            pending: &[],
            overrides: None,
            resync: None,
            rollout: None,
            replica_clusters: None,
        }
    }

    use crate::hub::federation::replica_clusters::Switchover;

    /// Every cluster these tests place in, its copies listed.
    fn listed() -> std::collections::BTreeSet<String> {
        ["east", "west", "north", "south"].map(String::from).into()
    }

    fn replica_setup(primary: &str, ready: &[&str]) -> ReplicaClusters {
        ReplicaClusters {
            primary: Ok(primary.into()),
            credentials: ready.iter().map(|c| (c.to_string(), Ok(()))).collect(),
            switchover: Switchover::None,
            switchover_started: None,
            term: 1,
            demoted_term: 1,
            listed: listed(),
        }
    }

    fn with_endpoint(mut copy: DynamicObject, host: &str) -> DynamicObject {
        copy.data["status"]["endpoint"] = json!({"host": host, "port": 5432});
        copy
    }

    /// A hub that just started decides the primary cluster and the switchover's stage
    /// from the copies listed when its setup read them. A cluster listed only by the time
    /// it plans (its copy seen there, but not by the setup) gets no copy built from that
    /// decision: the old primary cluster's copy, marked for a switchover the setup could
    /// not see, would otherwise be written writable and unmarked. Without the primary
    /// cluster's copies nothing is applied; without a replica cluster's, only it waits.
    #[test]
    fn a_copy_is_built_only_from_a_setup_that_saw_the_cluster_listed() {
        let template = database(2);
        let placed = targets(&[("east", 1), ("west", 1), ("north", 1)]);
        let mut west_copy = with_endpoint(database_copy(1, 1, "w"), "10.0.1.7");
        let annotations = west_copy.metadata.annotations.get_or_insert_default();
        annotations.insert(crate::api::ANNOTATION_SWITCHOVER_TO.into(), "east".into());
        annotations.insert(
            crate::api::ANNOTATION_SWITCHOVER_STARTED.into(),
            "2026-12-07T05:00:00Z".into(),
        );
        west_copy.data["spec"]["readOnly"] = json!(true);
        let east_copy = database_copy(1, 1, "e");
        let north_copy = database_copy(1, 1, "n");
        let members = [
            member("east", Some(&east_copy)),
            member("west", Some(&west_copy)),
            member("north", Some(&north_copy)),
        ];
        // The setup saw no mark (west not listed yet): no switchover, as far as it knows.
        let blind = ReplicaClusters {
            listed: ["east", "north"].map(String::from).into(),
            ..replica_setup("west", &["east", "north"])
        };
        let plan = super::plan(&PlanInput {
            replica_clusters: Some(&blind),
            ..stateful(&template, &placed, &[], &members)
        });
        assert!(plan.applies.is_empty(), "{:?}", plan.applies);
        for cluster in ["east", "west", "north"] {
            assert!(
                plan.notes[cluster].contains("listing west's copies"),
                "{cluster}: {:?}",
                plan.notes
            );
        }
        let mut deferred = plan.deferred.clone();
        deferred.sort();
        assert_eq!(deferred, ["east", "north", "west"]);

        // The primary cluster listed, north not: only north waits.
        let north_unlisted = ReplicaClusters {
            listed: ["east", "west"].map(String::from).into(),
            switchover: Switchover::Demoting { to: "east".into() },
            switchover_started: Some("2026-12-07T05:00:00Z".into()),
            ..replica_setup("west", &["east", "north"])
        };
        let plan = super::plan(&PlanInput {
            replica_clusters: Some(&north_unlisted),
            ..stateful(&template, &placed, &[], &members)
        });
        assert_eq!(plan.deferred, ["north"]);
        assert!(plan.notes["north"].contains("listing the cluster's copies"));
        assert!(plan.applies.iter().all(|a| a.cluster != "north"));
        let west = plan.applies.iter().find(|a| a.cluster == "west");
        let west = west.expect("the primary cluster's copy, built from a stage that saw it");
        assert_eq!(west.object["spec"]["readOnly"], true, "still demoted");
    }

    /// The primary cluster's copy goes out first; a replica cluster's waits for the
    /// primary to publish its endpoint and for its Secrets, then streams from it, and
    /// every copy records the primary cluster.
    #[test]
    fn replica_clusters_wait_for_the_primarys_endpoint_and_secrets_then_stream_from_it() {
        let template = database(2);
        let placed = targets(&[("east", 1), ("west", 1)]);
        let setup = replica_setup("east", &["west"]);
        let members = [member("east", None), member("west", None)];
        let plan = super::plan(&PlanInput {
            replica_clusters: Some(&setup),
            ..stateful(&template, &placed, &[], &members)
        });
        assert_eq!(plan.applies.len(), 1, "only the primary cluster's copy");
        let east = &plan.applies[0].object;
        assert_eq!(plan.applies[0].cluster, "east");
        assert_eq!(
            east["metadata"]["annotations"][crate::api::ANNOTATION_PRIMARY_CLUSTER],
            "east"
        );
        assert!(east["spec"]["topology"]["replicaOf"].is_null());
        assert!(
            plan.notes["west"].contains("publishes where its primary is reached"),
            "{:?}",
            plan.notes
        );
        assert_eq!(plan.deferred, ["west"]);
        assert_eq!(plan.primary_cluster.as_deref(), Some("east"));

        // East publishes its endpoint; west's Secrets are not copied yet.
        let east_copy = with_endpoint(database_copy(1, 1, "e"), "10.0.1.7");
        let members = [member("east", Some(&east_copy)), member("west", None)];
        let waiting = replica_setup("east", &[]);
        let plan_waiting = super::plan(&PlanInput {
            replica_clusters: Some(&waiting),
            ..stateful(&template, &placed, &[], &members)
        });
        assert!(plan_waiting.applies.iter().all(|a| a.cluster != "west"));
        assert!(plan_waiting.notes["west"].contains("orders-instance and orders-app"));

        let refused = ReplicaClusters {
            primary: Ok("east".into()),
            credentials: [(
                "west".to_string(),
                Err("west already holds the Secret".to_string()),
            )]
            .into(),
            switchover: Switchover::None,
            switchover_started: None,
            term: 1,
            demoted_term: 1,
            listed: listed(),
        };
        let plan_refused = super::plan(&PlanInput {
            replica_clusters: Some(&refused),
            ..stateful(&template, &placed, &[], &members)
        });
        assert!(plan_refused.applies.iter().all(|a| a.cluster != "west"));
        assert_eq!(plan_refused.notes["west"], "west already holds the Secret");

        let plan = super::plan(&PlanInput {
            replica_clusters: Some(&setup),
            ..stateful(&template, &placed, &[], &members)
        });
        let west = plan.applies.iter().find(|a| a.cluster == "west").unwrap();
        assert_eq!(
            west.object["spec"]["topology"]["replicaOf"],
            json!({"host": "10.0.1.7", "port": 5432})
        );
        assert_eq!(
            west.object["metadata"]["annotations"][crate::api::ANNOTATION_PRIMARY_CLUSTER],
            "east"
        );
        assert_eq!(west.object["spec"]["replicas"], 1);
        // The hash covers what was added: a changed endpoint is applied again.
        let mut moved = west.object.clone();
        moved["spec"]["topology"]["replicaOf"]["host"] = json!("10.0.1.8");
        crate::hub::federation::copies::restamp(&mut moved);
        assert_ne!(
            moved["metadata"]["annotations"][crate::api::ANNOTATION_APPLIED_HASH],
            west.object["metadata"]["annotations"][crate::api::ANNOTATION_APPLIED_HASH]
        );
    }

    /// A switchover from east to west, as the copies carry it: east read-only and marked
    /// from the start; west streaming (and marked) until it has east's last WAL, then
    /// without `replicaOf`; north, another replica, untouched until the record.
    #[test]
    fn a_switchover_makes_the_old_primary_read_only_and_promotes_the_new_one_last() {
        let template = database(3);
        let placed = targets(&[("east", 1), ("west", 1), ("north", 1)]);
        let east = with_endpoint(database_copy(1, 1, "e"), "10.0.1.7");
        let members = [
            member("east", Some(&east)),
            member("west", None),
            member("north", None),
        ];
        let to = "west".to_string();
        for (stage, west_streams) in [
            (Switchover::Demoting { to: to.clone() }, true),
            (
                Switchover::CatchingUp {
                    to: to.clone(),
                    last: 7,
                },
                true,
            ),
            (
                Switchover::RaisingTerm {
                    to: to.clone(),
                    term: 2,
                },
                true,
            ),
            (
                Switchover::RecordingTerm {
                    to: to.clone(),
                    term: 2,
                    lacking: vec!["north".into()],
                },
                true,
            ),
            (Switchover::Promoting { to: to.clone() }, false),
        ] {
            let raised = !matches!(
                stage,
                Switchover::Demoting { .. } | Switchover::CatchingUp { .. }
            );
            let setup = ReplicaClusters {
                switchover: stage.clone(),
                switchover_started: Some("2026-12-06T12:00:00Z".into()),
                term: if raised { 2 } else { 1 },
                demoted_term: 1,
                ..replica_setup("east", &["west", "north"])
            };
            let plan = super::plan(&PlanInput {
                replica_clusters: Some(&setup),
                ..stateful(&template, &placed, &[], &members)
            });
            let copy = |cluster: &str| {
                &plan
                    .applies
                    .iter()
                    .find(|a| a.cluster == cluster)
                    .unwrap()
                    .object
            };
            let switchover_to = |cluster: &str| {
                copy(cluster)["metadata"]["annotations"][crate::api::ANNOTATION_SWITCHOVER_TO]
                    .clone()
            };
            assert_eq!(copy("east")["spec"]["readOnly"], true, "{stage:?}");
            let annotation =
                |cluster: &str, key: &str| copy(cluster)["metadata"]["annotations"][key].clone();
            assert_eq!(switchover_to("east"), "west");
            assert_eq!(switchover_to("west"), "west");
            assert_eq!(switchover_to("north"), Value::Null);
            assert_eq!(
                annotation("east", crate::api::ANNOTATION_SWITCHOVER_STARTED),
                "2026-12-06T12:00:00Z"
            );
            assert_eq!(
                annotation("west", crate::api::ANNOTATION_SWITCHOVER_PROMOTED),
                if west_streams {
                    Value::Null
                } else {
                    json!("east")
                },
                "{stage:?}"
            );
            assert_eq!(
                copy("west")["spec"]["topology"]["replicaOf"].is_object(),
                west_streams,
                "{stage:?}"
            );
            assert_eq!(
                copy("north")["spec"]["topology"]["replicaOf"]["host"],
                "10.0.1.7"
            );
            // Once raised, the term is written on every copy but the old primary
            // cluster's: that one stays under its own term, deposed wherever the members
            // hold the raised one, until it follows the new primary cluster.
            let term = |cluster: &str| annotation(cluster, crate::api::ANNOTATION_PRIMARY_TERM);
            assert_eq!(term("east"), Value::Null, "{stage:?}");
            let raised_term = if raised { json!("2") } else { Value::Null };
            assert_eq!(term("west"), raised_term, "{stage:?}");
            assert_eq!(term("north"), raised_term, "{stage:?}");
            assert!(
                plan.notes["east"].starts_with("switchover from east to west"),
                "{:?}",
                plan.notes
            );
            assert!(!plan.notes.contains_key("north"));
        }
    }

    /// No primary cluster can be chosen (a primaryCluster outside the placement): nothing
    /// is applied anywhere, and every cluster says why.
    #[test]
    fn without_a_primary_cluster_nothing_is_applied() {
        let template = database(2);
        let placed = targets(&[("east", 1), ("west", 1)]);
        let setup = ReplicaClusters {
            primary: Err("spec.topology.primaryCluster names south".into()),
            credentials: BTreeMap::new(),
            switchover: Switchover::None,
            switchover_started: None,
            term: 1,
            demoted_term: 1,
            listed: listed(),
        };
        let members = [member("east", None), member("west", None)];
        let plan = super::plan(&PlanInput {
            replica_clusters: Some(&setup),
            ..stateful(&template, &placed, &[], &members)
        });
        assert!(plan.applies.is_empty());
        assert!(
            plan.notes["east"].contains("names south")
                && plan.notes["west"].contains("names south")
        );
        assert_eq!(plan.primary_cluster, None);
    }

    /// A placement change that drops the primary cluster keeps its copy (the replicas
    /// stream from it); a dropped replica cluster goes as any copy does.
    #[test]
    fn the_primary_clusters_copy_stays_when_the_placement_drops_it() {
        let template = database(2);
        let previous = targets(&[("east", 1), ("west", 1), ("north", 1)]);
        let east = with_endpoint(database_copy(1, 1, "e"), "10.0.1.7");
        let west = database_copy(1, 1, "w");
        let north = database_copy(1, 1, "n");
        let members = [
            member("east", Some(&east)),
            member("west", Some(&west)),
            member("north", Some(&north)),
        ];
        let setup = replica_setup("east", &["west", "north"]);
        let new = targets(&[("west", 1), ("north", 1)]);
        let plan = super::plan(&PlanInput {
            replica_clusters: Some(&setup),
            ..stateful(&template, &new, &previous, &members)
        });
        assert!(plan.deletes.is_empty(), "{:?}", plan.deletes);
        assert!(
            plan.notes["east"].contains("holds the primary"),
            "{:?}",
            plan.notes
        );
        assert!(plan.pending_cleanup.contains(&"east".to_string()));
        // A switchover moving the primary away: the dropped cluster's copy is applied
        // demoted and marked, with the replicas it has, so the switchover can run.
        let moving = ReplicaClusters {
            switchover: Switchover::Demoting { to: "west".into() },
            ..replica_setup("east", &["west", "north"])
        };
        let plan = super::plan(&PlanInput {
            replica_clusters: Some(&moving),
            ..stateful(&template, &new, &previous, &members)
        });
        assert!(plan.deletes.is_empty(), "{:?}", plan.deletes);
        let applied = plan
            .applies
            .iter()
            .find(|a| a.cluster == "east")
            .expect("the old primary cluster's copy is applied");
        assert_eq!(applied.object["spec"]["readOnly"], true);
        assert_eq!(applied.object["spec"]["replicas"], 1);
        assert_eq!(
            applied.object["metadata"]["annotations"][crate::api::ANNOTATION_SWITCHOVER_TO],
            "west"
        );
        assert!(
            plan.notes["east"].contains("removed from the placement")
                && plan.notes["east"].contains("switchover from east to west"),
            "{:?}",
            plan.notes
        );
        // Scaled to zero everywhere: the primary cluster's copy goes to 0 as any copy.
        let zero = targets(&[("east", 0), ("west", 0), ("north", 0)]);
        let plan = super::plan(&PlanInput {
            replica_clusters: Some(&setup),
            ..stateful(&template, &zero, &previous, &members)
        });
        assert!(
            !plan
                .notes
                .get("east")
                .is_some_and(|n| n.contains("holds the primary")),
            "{:?}",
            plan.notes
        );
        assert!(plan.deletes.is_empty(), "{:?}", plan.deletes);
        let new = targets(&[("east", 1), ("west", 1)]);
        let plan = super::plan(&PlanInput {
            replica_clusters: Some(&setup),
            ..stateful(&template, &new, &previous, &members)
        });
        assert_eq!(
            plan.deletes
                .iter()
                .map(|d| d.cluster.as_str())
                .collect::<Vec<_>>(),
            ["north"]
        );
    }

    #[test]
    fn a_stateful_scale_down_during_a_partition_deletes_and_shrinks_nothing() {
        let template = database(1);
        let previous = targets(&[("east", 1), ("west", 1)]);
        let east = database_copy(1, 1, "e");
        let west = database_copy(1, 1, "w");
        let cut_off = unreachable("east", Some(&east));
        let members = [cut_off, member("west", Some(&west))];
        // Whichever cluster the new decision drops, nothing goes.
        for new in [targets(&[("east", 1)]), targets(&[("west", 1)])] {
            let plan = plan(&stateful(&template, &new, &previous, &members));
            assert!(plan.deletes.is_empty(), "{:?}", plan.deletes);
            assert!(plan.applies.is_empty(), "{:?}", plan.applies);
            assert_eq!(plan.waiting_for, ["east"]);
        }
        // A shrink in a Ready cluster waits too.
        let west = database_copy(3, 3, "w");
        let members = [cut_off, member("west", Some(&west))];
        let previous = targets(&[("east", 1), ("west", 3)]);
        let new = targets(&[("east", 1), ("west", 1)]);
        let plan = plan(&stateful(&template, &new, &previous, &members));
        assert!(plan.applies.is_empty(), "west keeps 3: {:?}", plan.applies);
        assert!(plan.notes["west"].contains("waiting for the partition"));
        assert_eq!(plan.waiting_for, ["east"]);
    }

    /// The moment right after a cut: east's agent has fenced (or is about to), and the
    /// hub still counts east Ready, but one failed renewal made it suspect. Scaling the
    /// database from 1 + 1 to 1 must keep both copies, whichever the decision drops.
    #[test]
    fn a_suspect_cluster_freezes_a_stateful_change_before_it_loses_ready() {
        let template = database(1);
        let previous = targets(&[("east", 1), ("west", 1)]);
        let east = database_copy(1, 1, "e");
        let west = database_copy(1, 1, "w");
        let suspect = MemberCopy {
            doubt: Some("the fencing-lease renewal in east failed"),
            ..member("east", Some(&east))
        };
        let members = [suspect, member("west", Some(&west))];
        for new in [targets(&[("east", 1)]), targets(&[("west", 1)])] {
            let plan = plan(&stateful(&template, &new, &previous, &members));
            assert!(plan.deletes.is_empty(), "{:?}", plan.deletes);
            assert_eq!(plan.waiting_for, ["east"]);
            let note = plan
                .notes
                .values()
                .find(|n| n.contains("waiting for the partition"));
            assert!(
                note.is_some_and(|n| n.contains("east (the fencing-lease renewal in east failed")),
                "{:?}",
                plan.notes
            );
        }
        // A suspect cluster's copy is no Ready replacement either.
        let new = targets(&[("east", 1)]);
        let members = [suspect, member("west", Some(&west))];
        let kept = plan(&stateful(&template, &new, &new, &members));
        assert!(kept.deletes.is_empty());

        // Trusted again: the delete goes out, carrying every cluster of the placement for
        // the writer to check once more right before the request.
        let members = [member("east", Some(&east)), member("west", Some(&west))];
        let plan = plan(&stateful(&template, &new, &previous, &members));
        assert_eq!(plan.deletes.len(), 1);
        assert_eq!(plan.deletes[0].cluster, "west");
        assert_eq!(plan.deletes[0].guard, ["east", "west"]);
    }

    /// A copy that holds what the hub applied (by its applied-hash) is left alone, except
    /// in a resync pass: a `kubectl scale` or an edit of a field the summary does not
    /// show leaves the hash as it was, so the pass applies every copy again.
    #[test]
    fn a_resync_applies_a_copy_that_looks_as_applied() {
        let template = template(2);
        let targets = targets(&[("east", 2)]);
        let mut east = copy(2, 2, "e");
        let wanted = copy_of(&template, "shop.web", Some(2));
        east.metadata.annotations =
            serde_json::from_value(wanted["metadata"]["annotations"].clone()).ok();
        let members = [member("east", Some(&east))];
        let quiet = plan(&input(&template, &targets, &members));
        assert!(quiet.applies.is_empty(), "{:?}", quiet.applies);
        let mut pass = input(&template, &targets, &members);
        pass.resync = Some(&[]);
        let again = plan(&pass);
        assert_eq!(again.applies.len(), 1);
        assert!(!again.applies[0].check_conflict);
        assert!(again.applies[0].resync);
        assert!(again.deferred.is_empty(), "the pass is over for it");
    }

    /// A resync pass that meets a member whose copies are being listed again (the
    /// periodic relist runs at the same interval) or that is unreachable is not over: it
    /// names that cluster, and a later plan of the same pass applies only there.
    #[test]
    fn a_resync_pass_waits_for_a_member_being_listed_and_applies_each_copy_once() {
        let template = template(2);
        let targets = targets(&[("east", 1), ("west", 1)]);
        let wanted = copy_of(&template, "shop.web", Some(1));
        let mut held = copy(1, 1, "e");
        held.metadata.annotations =
            serde_json::from_value(wanted["metadata"]["annotations"].clone()).ok();
        let listing = MemberCopy {
            synced: false,
            ..member("west", Some(&held))
        };
        let members = [member("east", Some(&held)), listing];
        let mut first = input(&template, &targets, &members);
        first.resync = Some(&[]);
        let first = plan(&first);
        let applied: Vec<_> = first.applies.iter().map(|a| a.cluster.as_str()).collect();
        assert_eq!(applied, ["east"]);
        assert_eq!(first.deferred, ["west"]);

        let members = [member("east", Some(&held)), member("west", Some(&held))];
        let done = ["east".to_string()];
        let mut second = input(&template, &targets, &members);
        second.resync = Some(&done);
        let second = plan(&second);
        let applied: Vec<_> = second.applies.iter().map(|a| a.cluster.as_str()).collect();
        assert_eq!(applied, ["west"], "east was applied in this pass already");
        assert!(second.deferred.is_empty());

        let members = [
            unreachable("east", Some(&held)),
            member("west", Some(&held)),
        ];
        let mut cut = input(&template, &targets, &members);
        cut.resync = Some(&[]);
        assert_eq!(plan(&cut).deferred, ["east"]);
    }

    /// A member that refuses to list the kind to the hub (its role lost the permission,
    /// its CRD went) shows no copy: a cleanup recorded for it stays recorded, for a
    /// placement change and for a deleted template alike.
    #[test]
    fn a_refused_kind_keeps_its_recorded_cleanups() {
        let template = template(2);
        let targets = targets(&[("west", 2)]);
        let west = copy(2, 2, "w");
        let refused = MemberCopy {
            refused: true,
            ..member("east", None)
        };
        let members = [refused, member("west", Some(&west))];
        let pending = ["east".to_string()];
        let mut moved = input(&template, &targets, &members);
        moved.pending = &pending;
        assert_eq!(plan(&moved).pending_cleanup, ["east"]);
        moved.deleting = true;
        let deleting = plan(&moved);
        assert!(deleting.pending_cleanup.contains(&"east".to_string()));
        assert!(!deleting.cleanup_done);
        // Not recorded: nothing is known to be there, nothing is kept pending.
        moved.pending = &[];
        moved.deleting = false;
        assert!(plan(&moved).pending_cleanup.is_empty());
    }

    /// A member whose copies the hub has not listed (a new leader's watches, a member cut
    /// off before they could list) may hold a copy the binding does not name: found by
    /// the chaos run, where a new leader shrank a StatefulSet copy while such a member,
    /// holding another, was cut off. It holds every stateful delete and shrink back.
    #[test]
    fn a_member_whose_copies_are_unknown_freezes_stateful_changes() {
        let template = database(1);
        let previous = targets(&[("east", 1), ("west", 1)]);
        let new = targets(&[("east", 1)]);
        let east = database_copy(1, 1, "e");
        let west = database_copy(1, 1, "w");
        let unknown = MemberCopy {
            synced: false,
            ..unreachable("north", None)
        };
        let members = [
            member("east", Some(&east)),
            unknown,
            member("west", Some(&west)),
        ];
        let frozen = plan(&stateful(&template, &new, &previous, &members));
        assert!(frozen.deletes.is_empty(), "{:?}", frozen.deletes);
        assert_eq!(frozen.waiting_for, ["north"]);
        // Listed, reachable and trusted: west's copy goes, north in the guard.
        let listed = member("north", None);
        let members = [
            member("east", Some(&east)),
            listed,
            member("west", Some(&west)),
        ];
        let plan = plan(&stateful(&template, &new, &previous, &members));
        assert_eq!(plan.deletes.len(), 1);
        assert_eq!(plan.deletes[0].guard, ["east", "west"]);
    }

    #[test]
    fn a_copy_in_the_middle_of_its_rolling_update_has_not_rolled_out() {
        let interpretation = built_in("apps/v1", "Deployment");
        let mut copy = copy(2, 2, "e");
        copy.data["status"] = json!({"replicas": 3, "readyReplicas": 2, "updatedReplicas": 1});
        assert!(
            ready_at_target(interpretation, &copy, 2),
            "ready, by its old pods"
        );
        assert!(!rolled_out(interpretation, &copy, 2));
        copy.data["status"] = json!({"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2});
        assert!(rolled_out(interpretation, &copy, 2));
        // The lab: the status the controller writes as it takes a new spec leaves out a
        // 0 `updatedReplicas`; the next cluster of a `maxUnavailable: 1` wave was updated
        // 0.1 s after the first on it.
        copy.data["status"] = json!({"replicas": 2, "readyReplicas": 2});
        assert!(!rolled_out(interpretation, &copy, 2));
        let database = built_in("example.com/v1", "MyDatabase");
        assert!(
            rolled_out(database, &copy, 2),
            "an agent that does not report the count is not waited for"
        );
        // An agent replacing its pods one at a time (OnDelete): both Ready, one on the
        // new version.
        copy.data["status"] = json!({"replicas": 2, "readyReplicas": 2, "updatedReplicas": 1,
                                     "phase": "Ready"});
        assert!(!rolled_out(database, &copy, 2));
        copy.data["status"]["updatedReplicas"] = json!(2);
        assert!(rolled_out(database, &copy, 2));
    }

    /// The 60-minute chaos run of seed 613575190: a database at 1/1/1 over east, west and
    /// north, scaled to 1 while west was cut off and a new leader had not listed west's
    /// copies. The decision (north=1) was written at once; at the next reconcile west was
    /// no longer in the previous decision, not recorded for cleanup, and a starting API
    /// server's 403 made its copies look listed and empty: east's copy was deleted while
    /// west, holding one, was still cut off. A cluster removed while its copies are
    /// unknown stays recorded, so it stays in the freeze until it is listed.
    #[test]
    fn a_cluster_removed_while_its_copies_are_unknown_stays_in_the_freeze() {
        let template = database(1);
        let all = targets(&[("east", 1), ("north", 1), ("west", 1)]);
        let new = targets(&[("north", 1)]);
        let east = database_copy(1, 1, "e");
        let north = database_copy(1, 1, "n");
        let unknown = MemberCopy {
            synced: false,
            ..unreachable("west", None)
        };
        let members = [
            member("east", Some(&east)),
            member("north", Some(&north)),
            unknown,
        ];
        let first = plan(&stateful(&template, &new, &all, &members));
        assert!(first.deletes.is_empty(), "{:?}", first.deletes);
        assert_eq!(first.waiting_for, ["west"]);
        assert!(first.pending_cleanup.contains(&"west".to_string()));
        // The decision is written: west is only in the recorded cleanups now, and its
        // kind looks listed and empty (refused) while it is still not Ready.
        let refused = MemberCopy {
            synced: true,
            refused: true,
            ..unreachable("west", None)
        };
        let members = [
            member("east", Some(&east)),
            member("north", Some(&north)),
            refused,
        ];
        let mut next = stateful(&template, &new, &new, &members);
        next.pending = &first.pending_cleanup;
        let second = plan(&next);
        assert!(second.deletes.is_empty(), "{:?}", second.deletes);
        assert_eq!(second.waiting_for, ["west"]);
        assert!(second.pending_cleanup.contains(&"west".to_string()));
        // Listed at last, holding its copy: both removed copies go, west in the guard.
        let west = database_copy(1, 1, "w");
        let members = [
            member("east", Some(&east)),
            member("north", Some(&north)),
            member("west", Some(&west)),
        ];
        let mut healed = stateful(&template, &new, &new, &members);
        healed.pending = &second.pending_cleanup;
        let healed = plan(&healed);
        assert_eq!(healed.deletes.len(), 2, "{:?}", healed.deletes);
        assert!(
            healed
                .deletes
                .iter()
                .all(|d| d.guard.contains(&"west".to_string()))
        );
    }

    /// A stateful kind that reports no readiness (health `Present`, as a custom kind's
    /// interpreter may say) shrinks and loses a cluster once the shrink is applied; it
    /// never waits for a ready count it does not report.
    #[test]
    fn a_kind_without_readiness_shrinks_and_moves_without_a_ready_count() {
        let mut interpretation = (*crate::hub::federation::interpreter::Interpreters::built_in()
            .get("example.com/v1", "MyDatabase"))
        .clone();
        interpretation.health = crate::api::resource_interpreter::HealthRule {
            type_: crate::api::resource_interpreter::HealthType::Present,
            condition: None,
        };
        assert!(!interpretation.reports_readiness());
        let template = database(1);
        let previous = targets(&[("east", 5), ("west", 1)]);
        let new = targets(&[("east", 1)]);
        let east = database_copy(5, 0, "e");
        let west = database_copy(1, 0, "w");
        let members = [member("east", Some(&east)), member("west", Some(&west))];
        let mut input = stateful(&template, &new, &previous, &members);
        input.interpretation = &interpretation;
        let planned = plan(&input);
        assert_eq!(planned.applies.len(), 1, "east shrinks");
        assert_eq!(planned.deletes.len(), 1, "west leaves");
    }

    /// Doubt is for stateful kinds only: a Deployment's scale-down goes ahead on Ready.
    #[test]
    fn stateless_deletes_and_shrinks_carry_no_guard() {
        let template = template(2);
        let new = targets(&[("west", 2)]);
        let east = copy(2, 2, "e");
        let west = copy(2, 2, "w");
        let members = [member("east", Some(&east)), member("west", Some(&west))];
        let plan = plan(&input(&template, &new, &members));
        assert_eq!(plan.deletes.len(), 1);
        assert!(plan.deletes[0].guard.is_empty());
    }

    #[test]
    fn a_stateful_shrink_carries_the_placement_as_its_guard() {
        let template = database(2);
        let previous = targets(&[("east", 1), ("west", 2)]);
        let new = targets(&[("east", 1), ("west", 1)]);
        let east = database_copy(1, 1, "e");
        let west = database_copy(2, 2, "w");
        let members = [member("east", Some(&east)), member("west", Some(&west))];
        let plan = plan(&stateful(&template, &new, &previous, &members));
        assert_eq!(plan.applies.len(), 1);
        assert_eq!(plan.applies[0].cluster, "west");
        assert_eq!(plan.applies[0].guard, ["east", "west"]);
    }

    /// A copy whose controller has not observed its current generation is not Ready for
    /// make-before-break, whatever its ready count says.
    #[test]
    fn a_replacement_is_ready_only_for_its_current_generation() {
        let template = database(1);
        let previous = targets(&[("east", 1), ("west", 1)]);
        let new = targets(&[("east", 1)]);
        let mut east = database_copy(1, 1, "e");
        east.metadata.generation = Some(3);
        east.data["status"]["observedGeneration"] = json!(2);
        let west = database_copy(1, 1, "w");
        let members = [member("east", Some(&east)), member("west", Some(&west))];
        let stale = plan(&stateful(&template, &new, &previous, &members));
        assert!(stale.deletes.is_empty(), "{:?}", stale.deletes);
        east.data["status"]["observedGeneration"] = json!(3);
        let members = [member("east", Some(&east)), member("west", Some(&west))];
        let current = plan(&stateful(&template, &new, &previous, &members));
        assert_eq!(current.deletes.len(), 1);
    }

    #[test]
    fn a_stateful_scale_up_during_a_partition_grows_the_ready_cluster() {
        let template = database(4);
        let previous = targets(&[("east", 1), ("west", 1)]);
        let new = targets(&[("east", 1), ("west", 3)]);
        let east = database_copy(1, 1, "e");
        let west = database_copy(1, 1, "w");
        let cut_off = unreachable("east", Some(&east));
        let members = [cut_off, member("west", Some(&west))];
        let plan = plan(&stateful(&template, &new, &previous, &members));
        let applied: Vec<(&str, i64)> = plan
            .applies
            .iter()
            .map(|a| {
                (
                    a.cluster.as_str(),
                    a.object["spec"]["replicas"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(applied, [("west", 3)]);
        assert!(plan.waiting_for.is_empty(), "nothing held back");
    }

    #[test]
    fn the_freeze_covers_every_cause_and_lifts_when_every_cluster_is_ready() {
        let template = database(1);
        let east = database_copy(1, 1, "e");
        let west = database_copy(1, 1, "w");
        let north = database_copy(1, 1, "n");
        // North is cut off and not part of the new placement (affinity or a policy
        // changed): it was part of the current one, so the freeze holds.
        let previous = targets(&[("east", 1), ("north", 1), ("west", 1)]);
        let new = targets(&[("east", 1)]);
        let cut_off = unreachable("north", Some(&north));
        let members = [
            member("east", Some(&east)),
            cut_off,
            member("west", Some(&west)),
        ];
        let frozen = plan(&stateful(&template, &new, &previous, &members));
        assert!(frozen.deletes.is_empty());
        assert_eq!(frozen.waiting_for, ["north"]);
        assert_eq!(
            frozen.held,
            ["north", "west"],
            "the cut-off copy is held too"
        );
        assert_eq!(frozen.pending_cleanup, ["north", "west"]);

        // A cluster the hub no longer knows (unjoined without cleanup) counts as not Ready.
        let members = [member("east", Some(&east)), member("west", Some(&west))];
        let unjoined = plan(&stateful(&template, &new, &previous, &members));
        assert!(unjoined.deletes.is_empty());
        assert_eq!(unjoined.waiting_for, ["north"]);

        // Every cluster Ready: make-before-break deletes west (east is Ready at 1).
        let members = [
            member("east", Some(&east)),
            member("north", Some(&north)),
            member("west", Some(&west)),
        ];
        let healed = plan(&stateful(&template, &new, &new, &members));
        let deleted: Vec<&str> = healed.deletes.iter().map(|d| d.cluster.as_str()).collect();
        assert_eq!(deleted, ["north", "west"]);
        assert!(healed.deletes.iter().all(|d| !d.template_deleted));
        assert!(healed.waiting_for.is_empty());
    }

    /// A divisible custom kind whose interpreter names no ready count (`health: Present`):
    /// once the kept copy carries its new count, the removed cluster's copy goes (make-
    /// before-break completes); with `Condition` health, only when the condition holds.
    #[test]
    fn make_before_break_follows_the_kinds_health_rule() {
        let spec = |health: Value| -> crate::api::resource_interpreter::ResourceInterpreterSpec {
            serde_json::from_value(json!({
                "target": {"apiVersion": "example.org/v1", "kind": "Vault"},
                "replicas": ".spec.replicas", "stateful": true, "health": health
            }))
            .unwrap()
        };
        let present = Interpretation::from_spec(
            &spec(json!({})),
            crate::hub::federation::interpreter::Source::Default,
        )
        .unwrap();
        let condition = Interpretation::from_spec(
            &spec(json!({"type": "Condition", "condition": {"type": "Available"}})),
            crate::hub::federation::interpreter::Source::Default,
        )
        .unwrap();
        let template = template(1);
        let previous = targets(&[("east", 1), ("west", 1)]);
        let new = targets(&[("west", 1)]);
        let vault = |replicas: i32, uid: &str, status: Value| -> DynamicObject {
            let mut value = copy_of(&template, "shop.web", Some(replicas));
            value["metadata"]["uid"] = json!(uid);
            value["status"] = status;
            serde_json::from_value(value).unwrap()
        };
        let east = vault(1, "e", Value::Null);
        let west = vault(1, "w", Value::Null);
        let members = [member("east", Some(&east)), member("west", Some(&west))];
        let mut input = input(&template, &new, &members);
        input.previous = &previous;
        input.interpretation = &present;
        let deleted: Vec<String> = plan(&input)
            .deletes
            .into_iter()
            .map(|d| d.cluster)
            .collect();
        assert_eq!(deleted, ["east"], "Present: west at its count is Ready");

        input.interpretation = &condition;
        let west_unavailable = vault(
            1,
            "w",
            json!({"conditions": [{"type": "Available", "status": "False"}]}),
        );
        let members = [
            member("east", Some(&east)),
            member("west", Some(&west_unavailable)),
        ];
        input.members = &members;
        assert!(
            plan(&input).deletes.is_empty(),
            "Condition False: east keeps its copy"
        );
        let west_available = vault(
            1,
            "w",
            json!({"conditions": [{"type": "Available", "status": "True"}]}),
        );
        let members = [
            member("east", Some(&east)),
            member("west", Some(&west_available)),
        ];
        input.members = &members;
        let deleted: Vec<String> = plan(&input)
            .deletes
            .into_iter()
            .map(|d| d.cluster)
            .collect();
        assert_eq!(deleted, ["east"]);
    }

    #[test]
    fn stateless_kinds_are_not_frozen() {
        let template = template(3);
        let previous = targets(&[("east", 3), ("west", 3)]);
        let new = targets(&[("east", 3), ("west", 0)]);
        let east = copy(3, 3, "e");
        let west = copy(3, 3, "w");
        let cut_off = unreachable("east", Some(&east));
        let members = [cut_off, member("west", Some(&west))];
        let mut input = input(&template, &new, &members);
        input.previous = &previous;
        assert!(plan(&input).waiting_for.is_empty());
    }

    #[test]
    fn deleting_removes_reachable_copies_now_and_the_rest_later() {
        let template = template(6);
        let targets = targets(&[("east", 2), ("west", 2), ("north", 2)]);
        let east = copy(2, 2, "e");
        let west = copy(2, 2, "w");
        let cut_off_east = unreachable("east", Some(&east));
        let members = [
            cut_off_east,
            member("west", Some(&west)),
            member("north", None),
        ];
        let mut deleting = input(&template, &targets, &members);
        deleting.deleting = true;
        let plan_now = plan(&deleting);
        assert_eq!(
            plan_now.deletes,
            [Delete {
                cluster: "west".into(),
                uid: Some("w".into()),
                template_deleted: true,
                guard: vec![],
            }]
        );
        assert_eq!(plan_now.pending_cleanup, ["east", "west"]);
        assert!(!plan_now.cleanup_done);

        let members = [
            member("east", None),
            member("west", None),
            member("north", None),
        ];
        let mut done = input(&template, &targets, &members);
        done.deleting = true;
        let plan_done = plan(&done);
        assert!(plan_done.cleanup_done && plan_done.deletes.is_empty());
    }

    #[test]
    fn a_template_deleted_before_its_binding_waits_for_clusters_never_listed() {
        // No binding yet (a new stateless template's is written once its copies
        // converge): no target, no recorded cleanup. A cluster this term has not listed
        // may hold a copy a previous leader applied.
        let template = template(6);
        let mut never_listed = unreachable("east", None);
        never_listed.synced = false;
        let members = [never_listed, member("west", None), member("north", None)];
        let mut deleting = input(&template, &[], &members);
        deleting.deleting = true;
        let waiting = plan(&deleting);
        assert_eq!(waiting.pending_cleanup, ["east"]);
        assert!(!waiting.cleanup_done);
        // Listed, and nothing there: done.
        let members = [
            member("east", None),
            member("west", None),
            member("north", None),
        ];
        let mut deleting = input(&template, &[], &members);
        deleting.deleting = true;
        assert!(plan(&deleting).cleanup_done);
    }

    #[test]
    fn duplicated_kinds_replace_without_replica_math() {
        let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n"}, "data": {"k": "v"}});
        let targets = targets(&[("east", 1), ("west", 1)]);
        let members = [member("east", None), member("west", None)];
        let plan = plan(&PlanInput {
            template: &config,
            binding: "n.c",
            interpretation: built_in("v1", "ConfigMap"),
            previous: &[],
            targets: &targets,
            deleting: false,
            members: &members,
            pending: &[],
            overrides: None,
            resync: None,
            rollout: None,
            replica_clusters: None,
        });
        assert_eq!(plan.applies.len(), 2);
        assert_eq!(plan.applies[0].object["data"]["k"], "v");
        assert!(plan.applies[0].object["spec"].is_null());
    }
}
