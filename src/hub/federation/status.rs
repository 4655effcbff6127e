//! Status (DESIGN.md section 4): what the copies say, summed into the binding's rows and
//! conditions and the template's status. Building it is pure; writing it waits until it
//! has converged (every reachable placement Ready, or saying why not) or has waited
//! [`STATUS_COALESCE`], so a burst or a rollout costs one status write per object, not
//! one per step on the way.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::api::resource_binding::{ClusterPlacementStatus, PlacementHealth, TargetCluster};
use crate::api::{MyDatabaseStatus, ResourceBinding};
use crate::error::{ApiErrorKind, classify};
use crate::hub::federation::aggregate::{
    CopyObservation, binding_conditions, binding_rows, mydatabase_status, placement_health,
    stamp_last_seen, workload_status,
};
use crate::hub::federation::context::{Context, template_status_key};
use crate::hub::federation::interpreter::Interpretation;
use crate::hub::federation::propagation::Plan;
use crate::hub::federation::writer::{CopyOp, ObjectKey, Outcome};

/// How long a status still on its way (copies applied, not Ready yet) may wait before it
/// is written anyway.
pub const STATUS_COALESCE: Duration = Duration::from_secs(30);

/// Conditions the propagator owns on a binding.
pub const PROPAGATION_CONDITIONS: [&str; 3] = ["Propagated", "Healthy", "Degraded"];

/// What the hub knows of one member for a template.
pub(super) struct Member {
    pub cluster: String,
    pub reachable: bool,
    pub synced: bool,
    /// The member refuses to list the kind to the hub (see `propagation::MemberCopy`).
    pub refused: bool,
    /// The freshest copy the hub knows there.
    pub copy: Option<Arc<DynamicObject>>,
    /// What the plan hands to the member's writer now (None: nothing to do).
    pub op: Option<CopyOp>,
    /// The writer's outcome for that op (None: waiting, being written, or no op).
    pub outcome: Option<Outcome>,
    /// An apply is on its way to this member.
    pub applying: bool,
}

/// The binding's part of the status, built.
pub(super) struct BuiltStatus {
    pub observations: Vec<CopyObservation>,
    pub rows: Vec<ClusterPlacementStatus>,
    /// The propagator's conditions (Propagated, Healthy, Degraded).
    pub conditions: Vec<Condition>,
    pub converged: bool,
}

/// The propagator's conditions of a binding's status.
pub(super) fn propagation_conditions(binding: Option<&ResourceBinding>) -> Vec<Condition> {
    binding
        .and_then(|b| b.status.as_ref())
        .map(|s| {
            s.conditions
                .iter()
                .filter(|c| PROPAGATION_CONDITIONS.contains(&c.type_.as_str()))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// The rows a binding's status records.
pub(super) fn previous_rows(binding: Option<&ResourceBinding>) -> &[ClusterPlacementStatus] {
    binding
        .and_then(|b| b.status.as_ref())
        .map(|s| s.clusters.as_slice())
        .unwrap_or(&[])
}

/// Builds the binding's rows and conditions from what the members say.
#[allow(clippy::too_many_arguments)]
pub(super) fn build(
    interpretation: &Interpretation,
    generation: Option<i64>,
    targets: &[TargetCluster],
    members: &[Member],
    plan: &Plan,
    binding: Option<&ResourceBinding>,
    fence: bool,
    deleting: bool,
    now: jiff::Timestamp,
) -> BuiltStatus {
    let previous_rows = previous_rows(binding);
    let mut observations: Vec<CopyObservation> = targets
        .iter()
        .map(|target| {
            let member = members.iter().find(|m| m.cluster == target.name);
            let reachable = member.is_some_and(|m| m.reachable);
            let copy = member.and_then(|m| m.copy.as_deref());
            let outcome = member.and_then(|m| m.outcome.as_ref());
            let previous = previous_rows.iter().find(|r| r.name == target.name);
            // Overrides: what the plan built for the cluster; what the row said when
            // the plan could not build it (unreachable, not listed yet).
            let override_failed = plan.override_failures.contains_key(&target.name)
                || (!plan.overrides.contains_key(&target.name)
                    && previous.is_some_and(|p| p.override_failed));
            let overrides = match plan.overrides.get(&target.name) {
                Some(applied) => applied.clone(),
                None if override_failed => vec![],
                None => previous.map(|p| p.overrides.clone()).unwrap_or_default(),
            };
            let applied = if plan.override_failures.contains_key(&target.name) {
                false
            } else if reachable {
                match outcome {
                    Some(Outcome::Done) => true,
                    Some(_) => false,
                    None => copy.is_some() && member.is_some_and(|m| m.op.is_none()),
                }
            } else {
                previous.is_some_and(|p| p.applied)
            };
            let message = match outcome {
                Some(Outcome::Conflict(message)) | Some(Outcome::Failed(message)) => {
                    Some(message.clone())
                }
                _ if fence && !reachable => Some(
                    "cluster unreachable: the placement stays where its data is and is assumed fenced read-only by the member's agent".into(),
                ),
                _ => plan.notes.get(&target.name).cloned(),
            };
            CopyObservation {
                cluster: target.name.clone(),
                assigned_replicas: target.replicas,
                reachable,
                applied,
                last_seen: previous.and_then(|p| p.last_seen.clone()),
                status: copy
                    .map(|c| c.data["status"].clone())
                    .filter(|s| !s.is_null()),
                fenced: fence && !reachable,
                message,
                present: copy.is_some(),
                reports_readiness: interpretation.reports_readiness(),
                condition_healthy: copy
                    .and_then(|c| interpretation.condition_healthy(c.data.get("status"))),
                overrides,
                override_failed,
            }
        })
        .collect();
    // Converged: every reachable placement is Ready, or says why it is not (a conflict,
    // an error, make-before-break). Only a status on its way there may wait.
    let converged = deleting
        || observations.iter().all(|o| {
            !o.reachable || o.message.is_some() || placement_health(o) == PlacementHealth::Healthy
        });
    let mut rows = binding_rows(&observations, &plan.pending_cleanup);
    for row in rows.iter_mut().filter(|r| r.pending_cleanup) {
        if let Some(note) = plan.notes.get(&row.name) {
            row.message = Some(note.clone());
        }
    }
    let now = Time(now);
    let reachable = |cluster: &str| members.iter().any(|m| m.cluster == cluster && m.reachable);
    stamp_last_seen(&mut rows, previous_rows, reachable, &now);
    for observation in observations.iter_mut() {
        observation.last_seen = rows
            .iter()
            .find(|r| r.name == observation.cluster)
            .and_then(|r| r.last_seen.clone());
    }
    let mut conditions = propagation_conditions(binding);
    binding_conditions(
        &mut conditions,
        &observations,
        &rows,
        &plan.waiting_for,
        generation,
    );
    BuiltStatus {
        observations,
        rows,
        conditions,
        converged,
    }
}

/// Writes the template's own status (Deployment, StatefulSet, MyDatabase, and any kind
/// whose interpretation names status fields to sum) when it changed and has converged or
/// waited long enough. Returns how long it still waits.
#[allow(clippy::too_many_arguments)]
pub(super) async fn write_template_status(
    context: &Context,
    key: &ObjectKey,
    resource: &ApiResource,
    interpretation: &Interpretation,
    template: &DynamicObject,
    targets: &[TargetCluster],
    observations: &[CopyObservation],
    converged: bool,
    deleting: bool,
    primary_cluster: Option<&str>,
) -> Option<Duration> {
    let generation = template.metadata.generation;
    let desired: i32 = targets.iter().map(|t| t.replicas).sum();
    let previous = &template.data["status"];
    let built_in_workload =
        interpretation.source == crate::hub::federation::interpreter::Source::BuiltIn;
    let status = match () {
        _ if interpretation.quirks.database_status => {
            let previous: Option<MyDatabaseStatus> = serde_json::from_value(previous.clone()).ok();
            // The primary cluster as this reconcile found it (a switchover records the new
            // one before the template here is read again), else the record.
            let recorded = previous.as_ref().and_then(|p| p.primary_cluster.clone());
            let status = mydatabase_status(
                previous.as_ref(),
                observations,
                desired,
                generation,
                deleting,
                primary_cluster.or(recorded.as_deref()),
            );
            serde_json::to_value(status).unwrap_or_default()
        }
        _ if deleting || !interpretation.divisible() || !interpretation.sums_status() => {
            return None;
        }
        _ if built_in_workload => workload_status(previous, observations, desired, generation),
        // Another kind: the sums at its own paths (no conditions: its schema may not
        // have them, and a pruned field would be written again and again).
        _ => {
            let mut sums = workload_status(&Value::Null, observations, desired, generation);
            if let Some(map) = sums.as_object_mut() {
                map.remove("conditions");
            }
            interpretation.template_status(&sums)
        }
    };
    let status_key = template_status_key(key);
    if crate::hub::federation::copies::already_matches(&status, previous) {
        context.status_settled(&status_key, false);
        return None;
    }
    if let Some(wait) = context.defer_status(&status_key, converged, STATUS_COALESCE) {
        return Some(wait);
    }
    let api = Api::<DynamicObject>::namespaced_with(context.hub.clone(), &key.namespace, resource);
    match api
        .patch_status(
            &template.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await
    {
        Ok(written) => {
            context.count_write("template_status");
            context.status_settled(&status_key, true);
            context.remember_template(key, written);
            None
        }
        Err(error) if classify(&error) == ApiErrorKind::NotFound => None,
        Err(error) => {
            tracing::warn!(template = %template.name_any(), %error, "cannot write the template's status");
            Some(Duration::from_secs(2))
        }
    }
}
