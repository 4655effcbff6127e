//! One template's reconcile: match -> decide -> bind -> hand the copies to the member
//! writers -> status. Reads only the hub's stores and caches; writes the template's
//! finalizer, its binding (decision and status in one write) and its status, each only
//! when it changes; returns when to look again if time alone can change something (a
//! toleration expiring, a status waiting to be written, a rate limit).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::api::propagation_policy::ConflictResolution;
use crate::api::propagation_policy::PropagationSpec;
use crate::api::resource_binding::{ResourceBindingStatus, TargetCluster};
use crate::api::{
    ConditionStatus, FINALIZER_CLEANUP, LABEL_MANAGED_BY, ResourceBinding, find_condition,
    new_condition, set_condition,
};
use crate::error::{ApiErrorKind, classify};
use crate::hub::federation::aggregate::WAITING_FOR_PARTITION;
use crate::hub::federation::context::full_template;
use crate::hub::federation::context::{
    ClusterLabel, ClusterSet, Context, TemplateReport, binding_status_key, candidates,
};
use crate::hub::federation::copies::binding_label;
use crate::hub::federation::follow;
use crate::hub::federation::matching::{PolicyCandidate, PolicyScope, policy_reference};
use crate::hub::federation::overrides::{self, TemplateOverrides, WorkloadPaths};
use crate::hub::federation::pending_cleanups;
use crate::hub::federation::placement::ClusterView;
use crate::hub::federation::propagation::{self, MemberCopy, Plan, PlanInput};
use crate::hub::federation::scheduler::{
    DesiredBinding, FIELD_MANAGER as BINDING_FIELD_MANAGER, binding_name, desired_binding,
    evicted_clusters, is_excluded_namespace, scheduler_status,
};
use crate::hub::federation::status::{
    self, BuiltStatus, Member, STATUS_COALESCE, previous_rows, propagation_conditions,
};
use crate::hub::federation::writer::{CopyOp, ObjectKey};

/// A copy written less than this long ago is not written again for the same decision
/// even when it does not look like it (a member that rewrites a field the hub sets).
const REWRITE_AFTER: Duration = Duration::from_secs(10);

/// When to look again after a failed write to the hub.
const RETRY: Duration = Duration::from_secs(2);

fn sooner(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Reconciles one template (or what is left of it: its binding). Returns when to look
/// again, if nothing else will trigger it.
pub(super) async fn reconcile(context: &Arc<Context>, key: &ObjectKey) -> Option<Duration> {
    if is_excluded_namespace(&key.namespace) {
        return None;
    }
    let (resource, _) = context.kinds.get(key.kind).cloned()?;
    let template = context.template(key);
    let binding = context.binding(key, &binding_name(&key.name, &resource.kind));
    let clusters = context.views();
    let views = &clusters.views[..];
    let now = jiff::Timestamp::now();
    let binding_deleting = binding
        .as_ref()
        .is_some_and(|b| b.metadata.deletion_timestamp.is_some());
    if template
        .as_ref()
        .is_none_or(|t| t.metadata.deletion_timestamp.is_some())
    {
        // A workload (or a follower) going away: what followed it may leave.
        let touched = {
            let mut follow = context.follow.lock().unwrap_or_else(|p| p.into_inner());
            let mut touched = follow.set(&context.kinds, key, None);
            touched.extend(follow.set_references(&context.kinds, key, vec![]));
            touched
        };
        for dependency in touched {
            context.queue.add(dependency);
        }
    }
    match template {
        None => match binding {
            None => {
                let recorded = recorded_cleanups(context, key, &resource);
                if !recorded.is_empty() {
                    return cleanup_recorded(context, key, &resource, &recorded, views).await;
                }
                context.forget(key, None);
                None
            }
            Some(binding) if binding_deleting => {
                cleanup_after_template(context, key, &resource, &binding, views, now).await
            }
            // Its owner is gone: the garbage collector deletes it (or it was orphaned
            // on purpose, and then it stays, copies included).
            Some(_) => None,
        },
        Some(template) if template.metadata.deletion_timestamp.is_some() => {
            delete_template(context, key, &resource, &template, binding, views, now).await
        }
        Some(template) => {
            if !context.bodies.contains(key) {
                // Its body is what the copies are built from: without it nothing is
                // written (a copy applied without it would lose its spec in the member).
                // Not expected: the watch keeps the body with the template.
                tracing::warn!(namespace = %key.namespace, name = %key.name, "the template's body is not known; its copies wait");
                return Some(Duration::from_secs(5));
            }
            if let Some(binding) = binding.as_ref().filter(|_| binding_deleting) {
                // The binding alone was deleted (or belongs to an earlier template of the
                // same name): nothing of the copies goes, the next reconcile binds anew.
                release_binding(context, binding).await;
                return Some(Duration::from_millis(200));
            }
            place_template(context, key, &resource, &template, binding, &clusters, now).await
        }
    }
}

/// What the hub knows of every member for `key`, and the plan.
struct Planned {
    members: Vec<Member>,
    plan: Plan,
}

#[allow(clippy::too_many_arguments)]
fn plan(
    context: &Context,
    key: &ObjectKey,
    resource: &ApiResource,
    template: Option<&DynamicObject>,
    previous: &[TargetCluster],
    targets: &[TargetCluster],
    pending: &[String],
    deleting: bool,
    views: &[ClusterView],
    overrides: Option<&TemplateOverrides<'_>>,
    rollout: Option<&BTreeMap<String, propagation::ClusterRevision>>,
    replica_clusters: Option<&propagation::ReplicaClusters>,
) -> Planned {
    let mut members: Vec<Member> = views
        .iter()
        .map(|view| {
            let cache = context.caches.member(&view.name);
            let synced = cache.as_ref().is_some_and(|c| c.synced(resource));
            let refused = cache
                .as_ref()
                .is_some_and(|c| c.unavailable(resource).is_some());
            let cached = cache.and_then(|c| c.get(resource, &key.namespace, &key.name));
            let mut copy = context.writers.fresh(&view.name, key, cached);
            if let Some(held) = copy.as_ref()
                && context.writers.drifted(&view.name, key, held)
            {
                // Changed in the member since the hub applied it: no longer what the hub
                // applied, whatever its applied-hash says.
                let mut changed = (**held).clone();
                changed
                    .annotations_mut()
                    .remove(crate::api::ANNOTATION_APPLIED_HASH);
                copy = Some(Arc::new(changed));
            }
            Member {
                cluster: view.name.clone(),
                reachable: view.ready,
                synced,
                refused,
                copy,
                op: None,
                outcome: None,
                applying: false,
            }
        })
        .collect();
    let template_value = template
        .map(|t| {
            crate::hub::federation::context::full_template(t, context.bodies.get(key).as_deref())
        })
        .unwrap_or(Value::Null);
    let label = binding_label(&key.namespace, &key.name);
    let interpretation = context.interpretation(key);
    // Stateful kinds: what the hub lacks of fresh positive evidence of each member.
    let doubts: Vec<Option<String>> = members
        .iter()
        .map(|m| {
            interpretation
                .stateful
                .then(|| context.doubt(&m.cluster))
                .flatten()
        })
        .collect();
    let copies: Vec<MemberCopy<'_>> = members
        .iter()
        .zip(&doubts)
        .map(|(m, doubt)| MemberCopy {
            cluster: &m.cluster,
            reachable: m.reachable,
            synced: m.synced,
            refused: m.refused,
            copy: m.copy.as_deref(),
            doubt: doubt.as_deref(),
        })
        .collect();
    let resync = if deleting {
        None
    } else {
        context
            .resync
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    };
    let plan = propagation::plan(&PlanInput {
        template: &template_value,
        binding: &label,
        interpretation: &interpretation,
        previous,
        targets,
        deleting,
        members: &copies,
        pending,
        overrides,
        resync: resync.as_deref(),
        rollout,
        replica_clusters,
    });
    drop(copies);
    // The pass is over for this template once every placed copy was built: one in a
    // member whose copies are being listed again (the periodic relist runs at the same
    // interval) or that is unreachable gets it when the member is back.
    if resync.is_some() {
        let mut marked = context.resync.lock().unwrap_or_else(|p| p.into_inner());
        if plan.deferred.is_empty() {
            marked.remove(key);
        } else if let Some(done) = marked.get_mut(key) {
            done.extend(
                plan.applies
                    .iter()
                    .filter(|a| a.resync)
                    .map(|a| a.cluster.clone()),
            );
        }
    }
    Planned {
        members: std::mem::take(&mut members),
        plan,
    }
}

/// Hands the plan's writes to the member writers (and tells the others that nothing is
/// wanted from them), then reads back where each one stands. Returns when to look again
/// for a copy written recently that still does not look written.
fn hand_off(
    context: &Context,
    key: &ObjectKey,
    planned: &mut Planned,
    resolution: ConflictResolution,
) -> Option<Duration> {
    let mut again = None;
    for member in planned.members.iter_mut() {
        let op = planned
            .plan
            .applies
            .iter()
            .find(|a| a.cluster == member.cluster)
            .map(|a| {
                (
                    CopyOp::Apply {
                        object: a.object.clone(),
                        check_conflict: a.check_conflict,
                        resolution,
                        guard: a.guard.clone(),
                    },
                    a.resync,
                )
            })
            .or_else(|| {
                planned
                    .plan
                    .deletes
                    .iter()
                    .find(|d| d.cluster == member.cluster)
                    .map(|d| {
                        (
                            CopyOp::Delete {
                                uid: d.uid.clone(),
                                template_deleted: d.template_deleted,
                                guard: d.guard.clone(),
                            },
                            false,
                        )
                    })
            });
        let (op, resync) = match op {
            Some((op, resync)) => (Some(op), resync),
            None => (None, false),
        };
        match &op {
            Some(op) => {
                // A copy written a moment ago may have been changed in the member since
                // (a ConfigMap's data has no generation to show it): the resync writes
                // it anyway, once per pass.
                let again_after = if resync {
                    Duration::ZERO
                } else {
                    REWRITE_AFTER
                };
                context
                    .writers
                    .want(&member.cluster, key, op.clone(), again_after);
            }
            None => context.writers.forget(&member.cluster, key),
        }
        let state = context.writers.state(&member.cluster, key, op.as_ref());
        member.applying = state.as_ref().is_some_and(|s| s.applying);
        if let (Some(_), Some(state)) = (&op, &state)
            && state.current
        {
            member.outcome = state.outcome.clone();
            if let (Some(crate::hub::federation::writer::Outcome::Done), Some(ago)) =
                (&state.outcome, state.finished_ago)
            {
                again = sooner(again, Some(REWRITE_AFTER.saturating_sub(ago)));
            }
        }
        member.op = op;
    }
    again
}

/// The clusters a binding's status records as still holding a copy to delete.
fn pending_cleanups(binding: Option<&ResourceBinding>) -> Vec<String> {
    previous_rows(binding)
        .iter()
        .filter(|r| r.pending_cleanup)
        .map(|r| r.name.clone())
        .collect()
}

/// Deleting: every copy is gone, and no apply is still on its way to a member (it would
/// leave a copy behind).
fn cleanup_done(planned: &Planned) -> bool {
    planned.plan.cleanup_done && !planned.members.iter().any(|m| m.applying)
}

/// A template with a deletionTimestamp: its copies go (reachable clusters now, the others
/// when they return), then its finalizer and its binding's.
async fn delete_template(
    context: &Arc<Context>,
    key: &ObjectKey,
    resource: &ApiResource,
    template: &DynamicObject,
    binding: Option<Arc<ResourceBinding>>,
    views: &[ClusterView],
    now: jiff::Timestamp,
) -> Option<Duration> {
    let has_finalizer = template.finalizers().iter().any(|f| f == FINALIZER_CLEANUP);
    // A new template's binding is written once its copies are Ready: deleted before
    // that, its copies are known from the members' caches and the writers alone.
    let targets = binding
        .as_ref()
        .map(|b| b.spec.clusters.clone())
        .unwrap_or_default();
    let pending = pending_cleanups(binding.as_deref());
    let planned = delete_copies(
        context,
        key,
        resource,
        Some(template),
        &targets,
        &pending,
        views,
    );
    let handed_over = if cleanup_done(&planned) {
        false
    } else {
        match hand_over(context, key, resource, &planned, template.uid().as_deref()).await {
            Ok(handed_over) => handed_over,
            Err(retry) => return Some(retry),
        }
    };
    if let Some(binding) = binding.as_deref()
        && !handed_over
        && !unsynced(&planned.members, &targets)
    {
        let built = status::build(
            &context.interpretation(key),
            template.metadata.generation,
            &targets,
            &planned.members,
            &planned.plan,
            Some(binding),
            false,
            true,
            now,
        );
        if let Some(desired) = kept_decision(binding) {
            write_binding(context, key, &desired, Some(binding), &built, false).await;
        }
        status::write_template_status(
            context,
            key,
            resource,
            &context.interpretation(key),
            template,
            &targets,
            &built.observations,
            true,
            true,
            None,
        )
        .await;
    }
    if !cleanup_done(&planned) && !handed_over {
        return None;
    }
    if handed_over {
        tracing::info!(template = %format!("{}/{}", key.namespace, key.name), kind = %resource.kind, "its namespace is being deleted: the copies left in unreachable members are deleted when they return (MemberCluster status.pendingCleanups)");
    } else {
        tracing::info!(template = %format!("{}/{}", key.namespace, key.name), kind = %resource.kind, "every copy is gone");
    }
    if let Some(binding) = binding.as_deref()
        && binding.metadata.deletion_timestamp.is_some()
    {
        release_binding(context, binding).await;
    }
    if has_finalizer {
        return remove_template_finalizer(context, key, resource, template).await;
    }
    None
}

/// The template is deleted (or gone): plans the deletion of its copies (those `targets`
/// and `pending` name, and any a member's listing shows) and hands the deletes to the
/// member writers.
fn delete_copies(
    context: &Context,
    key: &ObjectKey,
    resource: &ApiResource,
    template: Option<&DynamicObject>,
    targets: &[TargetCluster],
    pending: &[String],
    views: &[ClusterView],
) -> Planned {
    let mut planned = plan(
        context, key, resource, template, targets, targets, pending, true, views, None, None, None,
    );
    hand_off(context, key, &mut planned, ConflictResolution::Abort);
    planned
}

/// The decision a binding holds, to write its status beside it unchanged.
fn kept_decision(binding: &ResourceBinding) -> Option<DesiredBinding> {
    let owner = binding.owner_references().first()?.clone();
    Some(DesiredBinding {
        namespace: binding.namespace().unwrap_or_default(),
        name: binding.name_any(),
        owner,
        spec: binding.spec.clone(),
        status: scheduler_status(binding.status.as_ref()),
        conflict_resolution: ConflictResolution::Abort,
        rollout: None,
        fence: false,
        next_change: None,
    })
}

/// The template is gone and its binding is being deleted: delete what copies are left,
/// then let the binding go.
async fn cleanup_after_template(
    context: &Arc<Context>,
    key: &ObjectKey,
    resource: &ApiResource,
    binding: &ResourceBinding,
    views: &[ClusterView],
    _now: jiff::Timestamp,
) -> Option<Duration> {
    if !binding.finalizers().iter().any(|f| f == FINALIZER_CLEANUP) {
        return None;
    }
    let targets = binding.spec.clusters.clone();
    let pending = pending_cleanups(Some(binding));
    let planned = delete_copies(context, key, resource, None, &targets, &pending, views);
    if cleanup_done(&planned) {
        release_binding(context, binding).await;
        return None;
    }
    match hand_over(
        context,
        key,
        resource,
        &planned,
        binding.spec.resource.uid.as_deref(),
    )
    .await
    {
        Ok(true) => {
            release_binding(context, binding).await;
            None
        }
        Ok(false) => None,
        Err(retry) => Some(retry),
    }
}

/// The members holding a `status.pendingCleanups` row for `key`.
fn recorded_cleanups(context: &Context, key: &ObjectKey, resource: &ApiResource) -> Vec<String> {
    pending_cleanups::recorded(
        &context.stores.members.state(),
        &pending_cleanups::Named::of(resource, &key.namespace, &key.name),
    )
}

/// A template deleted while its copies were left in cut-off members, and whose namespace
/// is being deleted: the copies' cleanup moves to those members' `status.pendingCleanups`
/// (written before anything lets the template go). Ok(true): handed over, the template's
/// and its binding's finalizers may go; Ok(false): the template keeps waiting (a Ready
/// member's copy is still being deleted or listed, or the namespace stays).
async fn hand_over(
    context: &Context,
    key: &ObjectKey,
    resource: &ApiResource,
    planned: &Planned,
    uid: Option<&str>,
) -> Result<bool, Duration> {
    let ready = |cluster: &str| {
        planned
            .members
            .iter()
            .any(|m| m.cluster == cluster && m.reachable)
    };
    let Some(clusters) = pending_cleanups::handover(&planned.plan.pending_cleanup, ready) else {
        return Ok(false);
    };
    if planned.members.iter().any(|m| m.applying) {
        return Ok(false);
    }
    match pending_cleanups::namespace_going(&context.hub, &key.namespace).await {
        Ok(true) => {}
        Ok(false) => return Ok(false),
        Err(error) => {
            tracing::warn!(namespace = %key.namespace, %error, "cannot read the namespace to see whether it is being deleted");
            return Err(RETRY);
        }
    }
    let row = pending_cleanups::row(resource, &key.namespace, &key.name, uid);
    for cluster in &clusters {
        if let Err(error) = pending_cleanups::change(&context.hub, cluster, Some(&row), None).await
        {
            tracing::warn!(member = %cluster, template = %format!("{}/{}", key.namespace, key.name), %error, "cannot record the pending cleanup on the MemberCluster; the template keeps its finalizer");
            return Err(RETRY);
        }
        context.count_write("pending_cleanup");
    }
    Ok(true)
}

/// A template gone with its namespace, whose copies some members still hold: deletes
/// them as the template's finalizer would have (in members that are Ready and listed),
/// and removes each member's row once its copy is gone.
async fn cleanup_recorded(
    context: &Arc<Context>,
    key: &ObjectKey,
    resource: &ApiResource,
    recorded: &[String],
    views: &[ClusterView],
) -> Option<Duration> {
    let planned = delete_copies(context, key, resource, None, &[], recorded, views);
    settle_recorded(context, key, resource, recorded, &planned).await
}

/// Removes the rows of the members in `recorded` whose copy is no longer pending.
async fn settle_recorded(
    context: &Context,
    key: &ObjectKey,
    resource: &ApiResource,
    recorded: &[String],
    planned: &Planned,
) -> Option<Duration> {
    let named = pending_cleanups::Named::of(resource, &key.namespace, &key.name);
    let mut again = None;
    for cluster in recorded {
        let member = planned.members.iter().find(|m| &m.cluster == cluster);
        let settled = !planned.plan.pending_cleanup.contains(cluster)
            && member.is_some_and(|m| m.reachable && m.synced && !m.applying);
        if !settled {
            continue;
        }
        match pending_cleanups::change(&context.hub, cluster, None, Some(&named)).await {
            Ok(()) => {
                context.count_write("pending_cleanup");
                tracing::info!(member = %cluster, template = %format!("{}/{}", key.namespace, key.name), kind = %resource.kind, "the copy left by a namespace deleted during a partition is gone");
            }
            Err(error) => {
                tracing::warn!(member = %cluster, %error, "cannot remove a pending cleanup row");
                again = Some(RETRY);
            }
        }
    }
    again
}

/// Whether a reachable placed cluster's copies have not been listed yet: its status would
/// be a guess (a restarted hub must not rewrite rows it has simply not read yet).
fn unsynced(members: &[Member], targets: &[TargetCluster]) -> bool {
    members
        .iter()
        .any(|m| m.reachable && !m.synced && targets.iter().any(|t| t.name == m.cluster))
}

/// Whether the hub knows for sure that no member holds a copy of `key`, and none is on
/// its way: every member's copies are listed, none of them is `key`'s, and no write for it
/// is queued or in flight. A template no policy selects, without a binding, may then
/// lose its cleanup finalizer (the hub API server's admission policy added it in the
/// moment before its policy went; `finalizer_policy`): nothing is deleted, and its kind
/// may not be watched after the next restart to remove it on deletion.
fn nothing_to_clean_up(
    context: &Context,
    key: &ObjectKey,
    resource: &ApiResource,
    views: &[ClusterView],
) -> bool {
    views.iter().all(|view| {
        let cache = context.caches.member(&view.name);
        let synced = cache.as_ref().is_some_and(|c| c.synced(resource));
        let cached = cache.and_then(|c| c.get(resource, &key.namespace, &key.name));
        let in_flight = context
            .writers
            .state(&view.name, key, None)
            .is_some_and(|state| state.outcome.is_none());
        synced && !in_flight && context.writers.fresh(&view.name, key, cached).is_none()
    })
}

/// A live template: decide, bind, hand off, report.
async fn place_template(
    context: &Arc<Context>,
    key: &ObjectKey,
    resource: &ApiResource,
    template: &DynamicObject,
    binding: Option<Arc<ResourceBinding>>,
    clusters: &ClusterSet,
    now: jiff::Timestamp,
) -> Option<Duration> {
    let views = &clusters.views[..];
    note_generation(context, template);
    let frozen = context.state.hub_health.load().frozen;
    let (policies, cluster_policies) = context.policies();
    let candidates = candidates(&policies, &cluster_policies);
    let existing = binding.as_deref();
    let full = candidates
        .iter()
        .any(|c| crate::hub::federation::placement::capacity::uses_capacity(&c.spec.placement))
        .then(|| {
            crate::hub::federation::context::full_template(
                template,
                context.bodies.get(key).as_deref(),
            )
        });
    let interpretation = context.interpretation(key);
    let running = |cluster: &str| {
        let copy = context
            .caches
            .member(cluster)?
            .get(resource, &key.namespace, &key.name)?;
        Some(crate::hub::federation::propagation::copy_ready(&copy))
    };
    let chosen = desired_binding(
        template,
        full.as_ref(),
        &running,
        resource,
        &interpretation,
        &candidates,
        views,
        &|list| clusters.static_weights(list),
        existing,
        frozen,
        now,
    );
    let unfollowed = note_workload(context, key, template, &candidates, chosen.as_ref());
    note_references(context, key, template, chosen.is_none());
    let mut desired = match chosen {
        Some(desired) => desired,
        None => match following(
            context, key, template, resource, views, existing, frozen, now,
        ) {
            Some(desired) => desired,
            None => {
                context.report(key, None);
                if existing.is_none()
                    && template.finalizers().iter().any(|f| f == FINALIZER_CLEANUP)
                    && nothing_to_clean_up(context, key, resource, views)
                {
                    return remove_template_finalizer(context, key, resource, template).await;
                }
                return None;
            }
        },
    };
    if !unfollowed.is_empty()
        && let Some(scheduled) = desired
            .status
            .conditions
            .iter_mut()
            .find(|c| c.type_ == "Scheduled")
    {
        scheduled
            .message
            .push_str(&format!("; {}", unfollowed.join("; ")));
    }
    let mut again = desired.next_change.map(|at| {
        Duration::from_millis((at.as_millisecond() - now.as_millisecond()).max(0) as u64)
    });
    let name = format!("{}/{}", key.namespace, desired.name);

    // Failover: replicas leaving a cluster that is not Ready are an eviction.
    let old_targets = existing.map(|b| b.spec.clusters.as_slice()).unwrap_or(&[]);
    let mut evicted = evicted_clusters(old_targets, &desired.spec.clusters, views);
    if !evicted.is_empty() {
        let allowed = context
            .evictions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .try_take();
        if !allowed {
            tracing::info!(binding = %name, "eviction rate limit reached; keeping the placement for now");
            desired.spec.clusters = old_targets.to_vec();
            desired.status = scheduler_status(existing.and_then(|b| b.status.as_ref()));
            evicted.clear();
            again = sooner(again, Some(Duration::from_secs(1)));
        }
    }

    // No copy goes out before the finalizer that guarantees its cleanup is in place.
    if !template.finalizers().iter().any(|f| f == FINALIZER_CLEANUP) {
        match add_template_finalizer(context, key, resource, template).await {
            Ok(()) => {}
            Err(retry) => return Some(retry),
        }
    }

    // A rollout: which revision each cluster's copy holds now, recorded in the binding
    // (before any copy acts on it, as a decision is).
    desired.status.rollout = None;
    let rollout = match desired.rollout.clone() {
        Some(strategy) => {
            match crate::hub::federation::rollout_step::step(
                context,
                key,
                resource,
                template,
                &strategy,
                existing,
                &mut desired,
                views,
                now,
            )
            .await
            {
                Ok(step) => {
                    again = sooner(again, step.wake);
                    Some(step)
                }
                Err(retry) => return Some(retry),
            }
        }
        None => None,
    };

    let previous: Vec<TargetCluster> = old_targets.to_vec();
    let mut pending = pending_cleanups(existing);
    // Copies an earlier template of this name left in members cut off while its namespace
    // was deleted: where this one places a copy, it takes the copy over; elsewhere the copy
    // goes as one removed from the placement.
    let recorded = recorded_cleanups(context, key, resource);
    for cluster in &recorded {
        if !desired.spec.clusters.iter().any(|t| &t.name == cluster) && !pending.contains(cluster) {
            pending.push(cluster.clone());
        }
    }
    let replica_clusters = if context.interpretation(key).quirks.database_status {
        crate::hub::federation::replica_credentials::setup(
            context, key, resource, template, &desired, views,
        )
        .await
    } else {
        None
    };
    let override_policies = context.override_policies();
    let overrides = overrides::for_template(
        template,
        resource,
        &overrides::candidates(&override_policies.0, &override_policies.1),
        views,
        WorkloadPaths::of(
            &resource.api_version,
            &resource.kind,
            &context.interpretation(key),
        ),
    );
    let mut planned = plan(
        context,
        key,
        resource,
        Some(template),
        &previous,
        &desired.spec.clusters,
        &pending,
        false,
        views,
        Some(&overrides),
        rollout.as_ref().map(|r| &r.clusters),
        replica_clusters.as_ref(),
    );
    if let Some(setup) = &replica_clusters {
        // A switchover moves on what the copies' statuses say (a status-only change
        // does not always wake the template at once): looked at every second meanwhile.
        // A replica cluster waiting for its source's endpoint or Secrets: soon.
        if matches!(
            setup.switchover,
            crate::hub::federation::replica_clusters::Switchover::RaisingTerm { .. }
                | crate::hub::federation::replica_clusters::Switchover::RecordingTerm { .. }
        ) {
            // Waiting for the renewals that carry the raised term, which go out at once.
            again = sooner(again, Some(Duration::from_millis(200)));
        } else if setup.switchover.target().is_some() {
            again = sooner(again, Some(Duration::from_secs(1)));
        } else if !planned.plan.deferred.is_empty() {
            again = sooner(again, Some(Duration::from_secs(5)));
        }
    }
    let targets = desired.spec.clusters.clone();
    let decision_changed = existing.is_none_or(|b| {
        b.spec != desired.spec
            || scheduler_status(b.status.as_ref()) != desired.status
            || !b.finalizers().iter().any(|f| f == FINALIZER_CLEANUP)
    });

    // A changed decision is recorded before any copy acts on it: the binding is what
    // keeps the previous placement known (the partition freeze, pending cleanups). A new
    // stateful template's first decision too: a partition or a leader change before its
    // copies converge must still find where its data is (a new stateless template's
    // binding waits for its copies, one write instead of two).
    let record_first =
        decision_changed && (existing.is_some() || context.interpretation(key).stateful);
    if record_first {
        let built = status_or_previous(
            &context.interpretation(key),
            template,
            &targets,
            &planned,
            existing,
            &desired,
            now,
        );
        if !write_binding(context, key, &desired, existing, &built, true).await {
            return Some(RETRY);
        }
    }
    if let Some(step) = &rollout {
        // A changed rollout status is a changed decision: recorded just above.
        crate::hub::federation::rollout_step::announce(context, key, resource, template, step)
            .await;
    }
    again = sooner(
        again,
        hand_off(context, key, &mut planned, desired.conflict_resolution),
    );
    if !recorded.is_empty() {
        again = sooner(
            again,
            settle_recorded(context, key, resource, &recorded, &planned).await,
        );
    }
    if unsynced(&planned.members, &targets) {
        // Its status waits for the lists; the copy cache's sync brings the template back.
        return again;
    }
    let built = status::build(
        &context.interpretation(key),
        template.metadata.generation,
        &targets,
        &planned.members,
        &planned.plan,
        existing,
        desired.fence,
        false,
        now,
    );
    let binding_after = !record_first;
    if binding_after {
        again = sooner(
            again,
            write_binding_when_due(context, key, &desired, existing, &built, &planned.plan).await,
        );
    }
    context.report(
        key,
        Some(TemplateReport {
            conditions: built
                .conditions
                .iter()
                .chain(
                    desired
                        .status
                        .conditions
                        .iter()
                        .filter(|c| c.type_ == "Scheduled"),
                )
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect(),
            fenced: built.rows.iter().filter(|r| r.fenced).count() as i64,
        }),
    );
    announce(
        context,
        key,
        resource,
        template,
        existing,
        &desired,
        &evicted,
        &built,
        &planned.plan,
        views,
        now,
    )
    .await;
    again = sooner(
        again,
        status::write_template_status(
            context,
            key,
            resource,
            &context.interpretation(key),
            template,
            &targets,
            &built.observations,
            built.converged,
            false,
            planned.plan.primary_cluster.as_deref(),
        )
        .await,
    );
    again
}

/// Tells the dependency graph what a template references and where it is placed, when
/// its policy propagates dependencies (and that it is no workload otherwise), and queues
/// the dependencies whose placement may have changed.
/// Returns, for a workload whose policy propagates dependencies, the dependencies that
/// cannot follow it because the hub cannot federate their kind (a permission missing on
/// the hub, a kind not served), each with why and the fix: its binding says so.
fn note_workload(
    context: &Context,
    key: &ObjectKey,
    template: &DynamicObject,
    candidates: &[PolicyCandidate],
    desired: Option<&DesiredBinding>,
) -> Vec<String> {
    let propagates = desired.and_then(|d| {
        let reference = d.spec.policy.as_ref()?;
        candidates
            .iter()
            .find(|c| {
                let candidate = policy_reference(c);
                (&candidate.kind, &candidate.namespace, &candidate.name)
                    == (&reference.kind, &reference.namespace, &reference.name)
            })
            .filter(|c| c.spec.propagate_deps)
            .map(|_| d)
    });
    let workload = propagates.map(|desired| {
        let whole = full_template(template, context.bodies.get(key).as_deref());
        (
            follow::workload_references(&context.kinds, key, &whole),
            follow::placed_clusters(&desired.spec.clusters),
        )
    });
    let refusals = context.state.refusals.load();
    let mut unfollowed = vec![];
    for (references, clusters) in workload.iter() {
        for reference in references {
            if follow::key_of(&context.kinds, reference)
                .is_some_and(|k| is_service_account_token(context, &k))
            {
                unfollowed.push(format!(
                    "its dependency {reference} is a service account token, valid only for the ServiceAccount it was issued for in this cluster: it is not copied to members (make one in each member)"
                ));
                continue;
            }
            if let Some(refusal) = refusals.iter().find(|r| {
                r.kind.api_version == reference.api_version && r.kind.kind == reference.kind
            }) {
                unfollowed.push(format!(
                    "its dependency {reference} cannot follow it: {}",
                    refusal.reason
                ));
                continue;
            }
            // Federated on the hub, but a member may refuse the kind to the hub.
            let Some((resource, _)) = context
                .kinds
                .iter()
                .find(|(r, _)| r.api_version == reference.api_version && r.kind == reference.kind)
            else {
                continue;
            };
            for cluster in clusters {
                if let Some(why) = context
                    .caches
                    .member(cluster)
                    .and_then(|copies| copies.unavailable(resource))
                {
                    unfollowed.push(format!(
                        "its dependency {reference} cannot follow it to {cluster}: {why}"
                    ));
                }
            }
        }
    }
    let touched = context
        .follow
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .set(&context.kinds, key, workload);
    for dependency in touched {
        context.queue.add(dependency);
    }
    unfollowed
}

/// Tells the dependency graph what a template no policy places references through its
/// kind's reference fields (a follower passes on to them what reaches it), and that a
/// placed one is no follower; queues the objects whose placement may have changed.
fn note_references(context: &Context, key: &ObjectKey, template: &DynamicObject, unplaced: bool) {
    if !follow::has_reference_fields(&context.kinds, key) {
        return;
    }
    let deps = if unplaced {
        let whole = full_template(template, context.bodies.get(key).as_deref());
        follow::workload_references(&context.kinds, key, &whole)
    } else {
        vec![]
    };
    let touched = context
        .follow
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .set_references(&context.kinds, key, deps);
    for object in touched {
        context.queue.add(object);
    }
}

/// Whether the template `key` is a Secret of type `kubernetes.io/service-account-token`:
/// a credential of a ServiceAccount in the hub, never followed to members.
fn is_service_account_token(context: &Context, key: &ObjectKey) -> bool {
    let Some((resource, _)) = context.kinds.get(key.kind) else {
        return false;
    };
    if !(resource.group.is_empty() && resource.kind == "Secret") {
        return false;
    }
    context
        .bodies
        .get(key)
        .is_some_and(|body| is_token_body(&body))
}

/// Whether a Secret's stored body (its fields but metadata) is a service account token.
fn is_token_body(body: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .is_some_and(|b| b["type"] == "kubernetes.io/service-account-token")
}

/// Whether a binding was made for a dependency following its workloads.
fn is_following(binding: &ResourceBinding) -> bool {
    binding
        .status
        .as_ref()
        .and_then(|s| find_condition(&s.conditions, "Scheduled"))
        .is_some_and(|c| c.reason == follow::FOLLOWS_WORKLOADS)
}

/// The binding of a template no policy selects but placed workloads reference
/// (`propagateDeps`): Duplicated to the workloads' clusters, or to none once no workload
/// needs it (then its copies leave). None: it follows nothing.
#[allow(clippy::too_many_arguments)]
fn following(
    context: &Context,
    key: &ObjectKey,
    template: &DynamicObject,
    resource: &ApiResource,
    views: &[ClusterView],
    existing: Option<&ResourceBinding>,
    frozen: bool,
    now: jiff::Timestamp,
) -> Option<DesiredBinding> {
    let (clusters, dependents, cycle) = {
        let follow = context.follow.lock().unwrap_or_else(|p| p.into_inner());
        let (clusters, dependents) = follow.placement(&context.kinds, key)?;
        (clusters, dependents, follow.cycle_of(&context.kinds, key))
    };
    if dependents.is_empty() && !existing.is_some_and(is_following) {
        return None;
    }
    // A service account token never follows (the workloads' bindings say why).
    if existing.is_none() && is_service_account_token(context, key) {
        return None;
    }
    let object = follow::object_ref(&context.kinds, key)?;
    let current = existing
        .map(|b| b.spec.clusters.clone())
        .unwrap_or_default();
    let clusters = follow::following_clusters(&object, &clusters, &current);
    // Placed by the kernel like any Duplicated template, restricted to those clusters
    // (while it leaves everywhere, to the current ones, then emptied).
    let restrict: Vec<String> = if clusters.is_empty() {
        current.iter().map(|t| t.name.clone()).collect()
    } else {
        clusters.iter().cloned().collect()
    };
    if restrict.is_empty() {
        // It has left every cluster. The kept decision (no cluster) lets the plan delete
        // what copies are still there: one in a cluster that was unreachable when it left
        // (recorded for cleanup), and one the decision could not see: an apply in flight
        // when the last workload left, or one a previous leader sent, lands after it (the
        // chaos runs found such ConfigMap copies left for good).
        // A claim is data: a copy of one never recorded is not deleted on a guess.
        let settled = existing.is_none_or(|b| pending_cleanups(Some(b)).is_empty())
            && (!follow::leaves_when_unreferenced(&object)
                || nothing_to_clean_up(context, key, resource, views));
        return if settled {
            None
        } else {
            existing.and_then(kept_decision)
        };
    }
    // Every taint is tolerated: the workloads' own placement (their policies' tolerations
    // and failover timing) already chose these clusters. A toleration of its own would
    // take a ConfigMap out of a cluster its workload still runs in.
    let spec: PropagationSpec = serde_json::from_value(json!({
        "resourceSelectors": [{"apiVersion": resource.api_version, "kind": resource.kind, "name": key.name}],
        "placement": {
            "clusterAffinity": {"clusterNames": restrict},
            "clusterTolerations": [{"operator": "Exists"}],
        },
    }))
    .ok()?;
    let candidate = PolicyCandidate {
        scope: PolicyScope::Namespaced,
        namespace: Some(&key.namespace),
        name: "dependency",
        spec: &spec,
    };
    let mut desired = desired_binding(
        template,
        None,
        &|_| None,
        resource,
        &context.interpretation(key),
        &[candidate],
        views,
        &|_| None,
        existing,
        frozen,
        now,
    )?;
    desired.spec.policy = None;
    // A claim is data: it stays in every cluster it is in when no workload needs it any
    // more (deleted, no longer naming it, its policy gone or no longer propagating
    // dependencies); deleting the claim on the hub deletes its copies.
    let leaves = dependents.is_empty() && follow::leaves_when_unreferenced(&object);
    let mut message = if leaves {
        desired.spec.clusters.clear();
        "no workload that references it is placed any more: its copies leave".to_string()
    } else if dependents.is_empty() {
        "no workload that references it is placed any more; a claim holds data, so its copies stay where they are: delete it on the hub to delete them".to_string()
    } else {
        format!(
            "follows {} (its policy propagates dependencies)",
            dependents
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    if !cycle.is_empty() {
        let ring = cycle
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        tracing::warn!(template = %object, cycle = %ring, "reference cycle");
        message.push_str(&format!(
            "; it is in a reference cycle ({ring}): each of them goes wherever a workload reaching the cycle goes; break the cycle in the objects' reference fields if that is not meant"
        ));
    }
    for decision in desired.status.decisions.iter_mut() {
        if leaves {
            decision.selected = false;
            decision.replicas = None;
        }
        if !decision.selected {
            decision.reason = "no workload that references it is placed here".into();
        }
    }
    set_condition(
        &mut desired.status.conditions,
        new_condition(
            "Scheduled",
            ConditionStatus::True,
            follow::FOLLOWS_WORKLOADS,
            message,
            template.metadata.generation,
        ),
    );
    Some(desired)
}

/// The status to write beside a changed decision: built now when the members' copies are
/// listed, the binding's previous status otherwise.
fn status_or_previous(
    interpretation: &crate::hub::federation::interpreter::Interpretation,
    template: &DynamicObject,
    targets: &[TargetCluster],
    planned: &Planned,
    existing: Option<&ResourceBinding>,
    desired: &DesiredBinding,
    now: jiff::Timestamp,
) -> BuiltStatus {
    if unsynced(&planned.members, targets) {
        return BuiltStatus {
            observations: vec![],
            rows: previous_rows(existing).to_vec(),
            conditions: propagation_conditions(existing),
            converged: false,
        };
    }
    status::build(
        interpretation,
        template.metadata.generation,
        targets,
        &planned.members,
        &planned.plan,
        existing,
        desired.fence,
        false,
        now,
    )
}

/// Writes the binding when its status changed and is due: a new binding or a changed
/// status once it has converged (or waited [`STATUS_COALESCE`]); entering or leaving the
/// partition freeze at once. Returns how long it still waits.
async fn write_binding_when_due(
    context: &Context,
    key: &ObjectKey,
    desired: &DesiredBinding,
    existing: Option<&ResourceBinding>,
    built: &BuiltStatus,
    plan: &Plan,
) -> Option<Duration> {
    let status_key = binding_status_key(key);
    let changed = existing.is_none_or(|b| {
        previous_rows(Some(b)) != built.rows.as_slice()
            || propagation_conditions(Some(b)) != built.conditions
    });
    if !changed {
        context.status_settled(&status_key, false);
        return None;
    }
    let was_waiting = propagation_conditions(existing)
        .iter()
        .any(|c| c.type_ == "Propagated" && c.reason == WAITING_FOR_PARTITION);
    let waiting_changed = was_waiting == plan.waiting_for.is_empty();
    if !waiting_changed
        && let Some(wait) = context.defer_status(&status_key, built.converged, STATUS_COALESCE)
    {
        return Some(wait);
    }
    // A new template's first binding is its decision (counted as `binding`).
    if write_binding(context, key, desired, existing, built, existing.is_none()).await {
        context.status_settled(&status_key, true);
        None
    } else {
        Some(RETRY)
    }
}

/// The binding as the hub writes it: the decision and the whole status (the scheduler's
/// part and the propagation rows and conditions) in one server-side apply.
fn binding_object(desired: &DesiredBinding, built: &BuiltStatus) -> ResourceBinding {
    let mut binding = ResourceBinding::new(&desired.name, desired.spec.clone());
    binding.metadata.namespace = Some(desired.namespace.clone());
    binding.metadata.owner_references = Some(vec![desired.owner.clone()]);
    // The binding records the clusters that still hold a copy to clean up; it must
    // outlive a template deleted with `--cascade=foreground` (the garbage collector then
    // deletes the binding first). The hub releases it once the cleanup is done.
    binding.metadata.finalizers = Some(vec![FINALIZER_CLEANUP.to_string()]);
    binding.metadata.labels = Some(BTreeMap::from([(
        LABEL_MANAGED_BY.to_string(),
        "bulkhead".to_string(),
    )]));
    let mut status: ResourceBindingStatus = desired.status.clone();
    status.clusters = built.rows.clone();
    status
        .conditions
        .retain(|c| !status::PROPAGATION_CONDITIONS.contains(&c.type_.as_str()));
    status.conditions.extend(built.conditions.iter().cloned());
    binding.status = Some(status);
    binding
}

/// One write of the binding (decision and status). Returns whether it is now as wanted.
async fn write_binding(
    context: &Context,
    key: &ObjectKey,
    desired: &DesiredBinding,
    existing: Option<&ResourceBinding>,
    built: &BuiltStatus,
    decision: bool,
) -> bool {
    let object = binding_object(desired, built);
    if let Some(existing) = existing
        && existing.spec == object.spec
        && existing.status == object.status
        && existing.finalizers().iter().any(|f| f == FINALIZER_CLEANUP)
    {
        return true;
    }
    let api: Api<ResourceBinding> = Api::namespaced(context.hub.clone(), &desired.namespace);
    match api
        .patch(
            &desired.name,
            &PatchParams::apply(BINDING_FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
    {
        Ok(written) => {
            context.count_write(if decision {
                "binding"
            } else {
                "binding_status"
            });
            context.remember_binding(key, written);
            true
        }
        Err(error) => {
            tracing::warn!(binding = %format!("{}/{}", desired.namespace, desired.name), %error, "cannot write the ResourceBinding");
            false
        }
    }
}

/// The JSON patch that adds or removes the cleanup finalizer without touching anyone
/// else's: it tests the list (or the entry) it changes, so a concurrent change of the
/// finalizers fails it, while a change of anything else (status, labels) does not.
pub(super) fn finalizer_patch(current: &[String], present: bool) -> Option<Value> {
    let index = current.iter().position(|f| f == FINALIZER_CLEANUP);
    match (present, index) {
        (true, Some(_)) | (false, None) => None,
        (true, None) if current.is_empty() => Some(json!([
            {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER_CLEANUP]}
        ])),
        (true, None) => Some(json!([
            {"op": "test", "path": "/metadata/finalizers", "value": current},
            {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER_CLEANUP}
        ])),
        (false, Some(index)) => Some(json!([
            {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": FINALIZER_CLEANUP},
            {"op": "remove", "path": format!("/metadata/finalizers/{index}")}
        ])),
    }
}

async fn patch_finalizers<K>(api: &Api<K>, name: &str, patch: Value) -> Result<K, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch: json_patch::Patch = serde_json::from_value(patch).expect("a valid JSON patch");
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
}

async fn add_template_finalizer(
    context: &Context,
    key: &ObjectKey,
    resource: &ApiResource,
    template: &DynamicObject,
) -> Result<(), Duration> {
    let Some(patch) = finalizer_patch(template.finalizers(), true) else {
        return Ok(());
    };
    let api = Api::<DynamicObject>::namespaced_with(context.hub.clone(), &key.namespace, resource);
    match patch_finalizers(&api, &key.name, patch).await {
        Ok(written) => {
            context.count_write("finalizer");
            context.remember_template(key, written);
            Ok(())
        }
        Err(error) => Err(finalizer_error(key, &error)),
    }
}

async fn remove_template_finalizer(
    context: &Context,
    key: &ObjectKey,
    resource: &ApiResource,
    template: &DynamicObject,
) -> Option<Duration> {
    let patch = finalizer_patch(template.finalizers(), false)?;
    let api = Api::<DynamicObject>::namespaced_with(context.hub.clone(), &key.namespace, resource);
    match patch_finalizers(&api, &key.name, patch).await {
        Ok(written) => {
            context.count_write("finalizer");
            context.remember_template(key, written);
            None
        }
        Err(error) if classify(&error) == ApiErrorKind::NotFound => None,
        Err(error) => Some(finalizer_error(key, &error)),
    }
}

fn finalizer_error(key: &ObjectKey, error: &kube::Error) -> Duration {
    match classify(error) {
        // The finalizers changed meanwhile (the test failed) or the object is gone: look
        // again as soon as the store has the change.
        ApiErrorKind::Conflict | ApiErrorKind::Invalid | ApiErrorKind::NotFound => {
            Duration::from_millis(200)
        }
        _ => {
            tracing::warn!(template = %format!("{}/{}", key.namespace, key.name), %error, "cannot update the template's finalizers");
            RETRY
        }
    }
}

/// Removes the cleanup finalizer from a binding on its way out.
async fn release_binding(context: &Context, binding: &ResourceBinding) {
    let Some(patch) = finalizer_patch(binding.finalizers(), false) else {
        return;
    };
    let namespace = binding.namespace().unwrap_or_default();
    let api: Api<ResourceBinding> = Api::namespaced(context.hub.clone(), &namespace);
    match patch_finalizers(&api, &binding.name_any(), patch).await {
        Ok(_) => context.count_write("binding_finalizer"),
        Err(error)
            if matches!(
                classify(&error),
                ApiErrorKind::NotFound | ApiErrorKind::Conflict | ApiErrorKind::Invalid
            ) => {}
        Err(error) => {
            tracing::warn!(binding = %binding.name_any(), %error, "cannot release the binding's finalizer")
        }
    }
}

/// Records when the hub first saw this generation of the template.
fn note_generation(context: &Context, template: &DynamicObject) {
    let uid = template.uid().unwrap_or_default();
    let mut generations = context
        .generations
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let generation = template.metadata.generation;
    if generations
        .get(&uid)
        .is_none_or(|(seen, _, _)| *seen != generation)
    {
        generations.insert(uid, (generation, std::time::Instant::now(), false));
    }
}

/// Events and failover metrics for what this reconcile changed.
#[allow(clippy::too_many_arguments)]
async fn announce(
    context: &Context,
    key: &ObjectKey,
    resource: &ApiResource,
    template: &DynamicObject,
    existing: Option<&ResourceBinding>,
    desired: &DesiredBinding,
    evicted: &[(String, i32)],
    built: &BuiltStatus,
    plan: &Plan,
    views: &[ClusterView],
    now: jiff::Timestamp,
) {
    let template_ref = template.object_ref(resource);
    let name = format!("{}/{}", key.namespace, desired.name);
    if !evicted.is_empty() {
        let placement: Vec<String> = desired
            .spec
            .clusters
            .iter()
            .map(|t| format!("{}={}", t.name, t.replicas))
            .collect();
        for (cluster, moved) in evicted {
            context
                .metrics
                .evictions
                .get_or_create(&ClusterLabel {
                    cluster: cluster.clone(),
                })
                .inc();
            let why = desired
                .status
                .decisions
                .iter()
                .find(|d| &d.cluster == cluster)
                .map(|d| d.reason.clone())
                .unwrap_or_default();
            let note = format!(
                "moved {moved} replica(s) off {cluster} ({why}); placement now {}",
                placement.join(", ")
            );
            tracing::warn!(binding = %name, %note, "evicted");
            context
                .event_both(&template_ref, existing, EventType::Warning, "Evicted", note)
                .await;
            if let Some(added) = views.iter().find(|v| &v.name == cluster).and_then(|v| {
                v.taints
                    .iter()
                    .filter(|t| crate::hub::membership::taints::is_hub_taint(t))
                    .filter_map(|t| t.time_added.as_ref())
                    .map(|t| t.0)
                    .min()
            }) {
                context
                    .failovers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.clone(), added);
            }
        }
    }
    let was_waiting = propagation_conditions(existing)
        .iter()
        .any(|c| c.type_ == "Propagated" && c.reason == WAITING_FOR_PARTITION);
    if !plan.waiting_for.is_empty() && !was_waiting {
        let note = format!(
            "placement change waits for the partition to heal: {} not Ready; the copies in {} are kept as they are (nothing is deleted or shrunk) until then",
            plan.waiting_for.join(", "),
            plan.held.join(", ")
        );
        tracing::warn!(template = %template.name_any(), %note, "waiting for partition");
        context
            .event_both(
                &template_ref,
                existing,
                EventType::Warning,
                WAITING_FOR_PARTITION,
                note,
            )
            .await;
    } else if plan.waiting_for.is_empty() && was_waiting {
        context
            .event_both(
                &template_ref,
                existing,
                EventType::Normal,
                "PartitionHealed",
                "every cluster of the placement is Ready again: the waiting placement change goes ahead (make-before-break)".into(),
            )
            .await;
    }
    for (warning, reason, note) in overrides::override_events(previous_rows(existing), &built.rows)
    {
        let type_ = if warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        context
            .event_both(&template_ref, existing, type_, reason, note)
            .await;
    }
    let Some(binding) = existing else {
        return;
    };
    let previous = previous_rows(existing);
    for row in built.rows.iter().filter(|r| r.fenced) {
        if !previous.iter().any(|p| p.name == row.name && p.fenced) {
            let note = format!(
                "{} is unreachable: its {} placement stays where its data is and is assumed fenced read-only by the member's agent",
                row.name, resource.kind
            );
            context
                .event_both(
                    &template_ref,
                    Some(binding),
                    EventType::Warning,
                    "Fenced",
                    note,
                )
                .await;
        }
    }
    for row in previous.iter().filter(|p| p.fenced) {
        if built.rows.iter().any(|r| r.name == row.name && !r.fenced) {
            let note = format!(
                "{} is reachable again: its {} placement is no longer assumed fenced (the agent lifts the fence once the hub's lease is fresh again)",
                row.name, resource.kind
            );
            context
                .event_both(
                    &template_ref,
                    Some(binding),
                    EventType::Normal,
                    "Unfenced",
                    note,
                )
                .await;
        }
    }
    // Time from taint to the evicted replicas Ready elsewhere.
    let healthy = built
        .conditions
        .iter()
        .any(|c| c.type_ == "Healthy" && c.status == "True");
    let tainted = if healthy {
        context
            .failovers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key)
    } else {
        None
    };
    if let Some(tainted) = tainted {
        let seconds = (now.as_millisecond() - tainted.as_millisecond()) as f64 / 1000.0;
        tracing::info!(binding = %name, seconds, "evicted replicas Ready elsewhere");
        context.metrics.failover_ready.observe(seconds.max(0.0));
        context
            .event(
                &binding.object_ref(&()),
                EventType::Normal,
                "FailoverComplete",
                format!("evicted replicas Ready elsewhere {seconds:.1}s after the cluster's taint"),
            )
            .await;
    }
}

#[cfg(test)]
mod token_tests {
    #[test]
    fn a_service_account_token_is_told_by_its_type() {
        assert!(super::is_token_body(
            r#"{"type": "kubernetes.io/service-account-token", "data": {}}"#
        ));
        assert!(!super::is_token_body(r#"{"type": "Opaque", "data": {}}"#));
        assert!(!super::is_token_body("not json"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_finalizer_patch_touches_only_the_hubs_entry() {
        assert_eq!(
            finalizer_patch(&[], true).unwrap(),
            json!([{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER_CLEANUP]}])
        );
        let others = vec!["example.com/other".to_string()];
        assert_eq!(
            finalizer_patch(&others, true).unwrap(),
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": ["example.com/other"]},
                {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER_CLEANUP}
            ])
        );
        let both = vec![
            "example.com/other".to_string(),
            FINALIZER_CLEANUP.to_string(),
        ];
        assert_eq!(
            finalizer_patch(&both, false).unwrap(),
            json!([
                {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER_CLEANUP},
                {"op": "remove", "path": "/metadata/finalizers/1"}
            ])
        );
        assert!(finalizer_patch(&both, true).is_none());
        assert!(finalizer_patch(&others, false).is_none());
        // Every patch parses as RFC 6902.
        for patch in [
            finalizer_patch(&[], true),
            finalizer_patch(&others, true),
            finalizer_patch(&both, false),
        ] {
            serde_json::from_value::<json_patch::Patch>(patch.unwrap()).unwrap();
        }
    }

    #[test]
    fn sooner_takes_the_earliest_wait() {
        let s = Duration::from_secs;
        assert_eq!(sooner(Some(s(3)), Some(s(1))), Some(s(1)));
        assert_eq!(sooner(None, Some(s(2))), Some(s(2)));
        assert_eq!(sooner(Some(s(2)), None), Some(s(2)));
        assert_eq!(sooner(None, None), None);
    }
}
