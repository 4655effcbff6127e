//! The reconcile's rollout step for a template whose policy has `spec.rollout`: read
//! (the template's revision, written as a ControllerRevision when new; what each
//! cluster's copy holds; an analysis measurement when one is due; a pending command) ->
//! decide (`rollout::decide`, pure) -> the rollout status on the binding the reconcile
//! writes before any copy acts on it, the Events, and the template each cluster's copy
//! is built from.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use crate::api::ResourceBinding;
use crate::api::rollout::{ANNOTATION_REVISION, ANNOTATION_ROLLOUT_COMMAND, RolloutStrategy};
use crate::hub::federation::context::{Context, full_template};
use crate::hub::federation::placement::ClusterView;
use crate::hub::federation::propagation::{ClusterRevision, rolled_out};
use crate::hub::federation::revisions::{revision_content, template_of};
use crate::hub::federation::rollout::{
    Command, ROLLOUT_CONDITIONS, RolloutCluster, RolloutInput, conditions, decide, measurement_due,
    wave_names, wave_of,
};
use crate::hub::federation::scheduler::DesiredBinding;
use crate::hub::federation::writer::ObjectKey;

/// What the step gives the reconcile.
pub struct RolloutStep {
    /// The revision, and its template, of every placed cluster's copy.
    pub clusters: BTreeMap<String, ClusterRevision>,
    /// When to look at the template again (a health wait, a measurement, a pause).
    pub wake: Option<Duration>,
    /// The transitions to announce ([`announce`]) once the binding records them.
    pub events: Vec<crate::hub::federation::rollout::RolloutEvent>,
    alert_webhook: Option<String>,
    revision: i64,
    stable_revision: i64,
    /// A rollback that ended in this step: seconds since it began.
    rollback_took: Option<f64>,
}

/// How soon a failed revision write is tried again.
const RETRY: Duration = Duration::from_secs(5);

/// The rollout step; sets `desired.status.rollout`. Err: try again after this long.
#[allow(clippy::too_many_arguments)]
pub(super) async fn step(
    context: &Arc<Context>,
    key: &ObjectKey,
    resource: &ApiResource,
    template: &DynamicObject,
    strategy: &RolloutStrategy,
    existing: Option<&ResourceBinding>,
    desired: &mut DesiredBinding,
    views: &[ClusterView],
    now: jiff::Timestamp,
) -> Result<RolloutStep, Duration> {
    let interpretation = context.interpretation(key);
    let full = full_template(template, context.bodies.get(key).as_deref());
    let recorded = existing
        .and_then(|b| b.status.as_ref())
        .and_then(|s| s.rollout.as_ref());
    let protect: Vec<i64> = recorded
        .map(|r| vec![r.revision, r.stable_revision])
        .unwrap_or_default();
    let revision = match context
        .revisions
        .ensure(
            &context.hub,
            key,
            &desired.name,
            &desired.owner,
            revision_content(&full, &interpretation),
            strategy.revision_history_limit.max(2) as usize,
            &protect,
        )
        .await
    {
        Ok(revision) => revision,
        Err(error) => {
            tracing::warn!(template = %format!("{}/{}", key.namespace, key.name), %error, "cannot record the template's revision; its copies wait");
            return Err(RETRY);
        }
    };

    let no_labels = BTreeMap::new();
    let copies: Vec<(String, Option<Arc<DynamicObject>>, bool)> = desired
        .spec
        .clusters
        .iter()
        .map(|t| {
            let cache = context.caches.member(&t.name);
            let synced = cache.as_ref().is_some_and(|c| c.synced(resource));
            let cached = cache.and_then(|c| c.get(resource, &key.namespace, &key.name));
            let copy = context.writers.fresh(&t.name, key, cached);
            (t.name.clone(), copy, synced)
        })
        .collect();
    let clusters: Vec<RolloutCluster<'_>> = desired
        .spec
        .clusters
        .iter()
        .zip(&copies)
        .map(|(t, (_, copy, synced))| {
            let view = views.iter().find(|v| v.name == t.name);
            let member_ready = view.is_some_and(|v| v.ready);
            let ready = member_ready
                && *synced
                && (!interpretation.stateful || context.doubt(&t.name).is_none());
            RolloutCluster {
                name: &t.name,
                wave: wave_of(
                    strategy,
                    &t.name,
                    view.map(|v| v.zone.as_str()),
                    view.map_or(&no_labels, |v| &v.labels),
                ),
                ready,
                member_ready,
                running: copy
                    .as_ref()
                    .and_then(|c| c.annotations().get(ANNOTATION_REVISION)?.parse().ok()),
                healthy: copy
                    .as_ref()
                    .is_some_and(|c| rolled_out(&interpretation, c, t.replicas)),
            }
        })
        .collect();
    let names = wave_names(strategy, &clusters);

    let measurement = match (recorded, &strategy.analysis) {
        (Some(status), Some(analysis))
            if status.revision == revision && measurement_due(strategy, status, now) =>
        {
            let wave = status.wave.max(0) as usize;
            let in_wave: Vec<&str> = clusters
                .iter()
                .filter(|c| c.wave == wave)
                .map(|c| c.name)
                .collect();
            Some(crate::hub::federation::analysis::measure(analysis, &in_wave, revision, now).await)
        }
        _ => None,
    };
    let command_text = template
        .annotations()
        .get(ANNOTATION_ROLLOUT_COMMAND)
        .cloned()
        .unwrap_or_default();
    let command = command_text
        .split_once(' ')
        .and_then(|(verb, id)| Some((Command::parse(verb)?, id.trim())));
    let measurement_result = measurement.as_ref().map(|m| m.passed);
    let decision = decide(&RolloutInput {
        strategy,
        revision,
        recorded,
        clusters: &clusters,
        wave_names: &names,
        now,
        command,
        measurement,
    });

    record_metrics(context, key, resource, measurement_result, &decision);
    let rollback_took = decision
        .events
        .iter()
        .any(|e| e.reason == "RolledBack")
        .then_some(decision.status.rollback_started_at.as_ref())
        .flatten()
        .map(|started| now.duration_since(started.0).as_secs_f64().max(0.0));
    let wake = decision.wake_at.map(|at| {
        Duration::from_millis((at.as_millisecond() - now.as_millisecond()).max(0) as u64)
    });
    let clusters = decision
        .assign
        .iter()
        .map(|(cluster, number)| {
            let template = if *number == revision {
                Some(full.clone())
            } else {
                context
                    .revisions
                    .content(key, *number)
                    .map(|content| template_of(&content, &full, &interpretation))
            };
            (
                cluster.clone(),
                ClusterRevision {
                    revision: *number,
                    template,
                },
            )
        })
        .collect();
    let (revision, stable_revision) = (decision.status.revision, decision.status.stable_revision);
    // Progressing and RolledBack, their transition times kept from the binding.
    let mut kept: Vec<_> = existing
        .and_then(|b| b.status.as_ref())
        .map(|s| {
            s.conditions
                .iter()
                .filter(|c| ROLLOUT_CONDITIONS.contains(&c.type_.as_str()))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    for condition in conditions(&decision.status, template.metadata.generation) {
        crate::api::set_condition(&mut kept, condition);
    }
    desired
        .status
        .conditions
        .retain(|c| !ROLLOUT_CONDITIONS.contains(&c.type_.as_str()));
    desired.status.conditions.extend(kept);
    desired.status.rollout = Some(decision.status);
    Ok(RolloutStep {
        clusters,
        wake,
        events: decision.events,
        alert_webhook: strategy.alert_webhook.clone(),
        revision,
        stable_revision,
        rollback_took,
    })
}

/// Logs the step's transitions, records them as Events on the template and posts a
/// failure to the alert webhook: called once the binding holds them, so a transition a
/// failed binding write left undone is not announced twice.
pub(super) async fn announce(
    context: &Context,
    key: &ObjectKey,
    resource: &ApiResource,
    template: &DynamicObject,
    step: &RolloutStep,
) {
    let template_ref = template.object_ref(resource);
    let name = format!("{}/{}", key.namespace, key.name);
    if let Some(seconds) = step.rollback_took {
        context.metrics.rollback_seconds.observe(seconds);
    }
    for event in &step.events {
        if event.warning {
            tracing::warn!(template = %name, reason = event.reason, message = %event.message, "rollout");
        } else {
            tracing::info!(template = %name, reason = event.reason, message = %event.message, "rollout");
        }
        let type_ = if event.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        context
            .event(&template_ref, type_, event.reason, event.message.clone())
            .await;
        if event.reason == "RolloutFailed"
            && let Some(url) = step.alert_webhook.clone()
        {
            let alert = serde_json::json!({
                "reason": event.reason,
                "template": {"apiVersion": resource.api_version, "kind": resource.kind,
                    "namespace": key.namespace, "name": key.name},
                "revision": step.revision,
                "stableRevision": step.stable_revision,
                "message": event.message,
            });
            tokio::spawn(crate::hub::federation::analysis::alert(url, alert));
        }
    }
}

/// `bulkhead_rollout_phase`, `_analysis_measurements_total` (`_rollback_seconds` is
/// observed by [`announce`], once the binding records the rollback's end).
fn record_metrics(
    context: &Context,
    key: &ObjectKey,
    resource: &ApiResource,
    measured: Option<bool>,
    decision: &crate::hub::federation::rollout::RolloutDecision,
) {
    use crate::api::rollout::RolloutPhase;
    use crate::hub::federation::context::{ResultLabel, RolloutLabels};
    let metrics = &context.metrics;
    let labels = |phase: RolloutPhase| RolloutLabels {
        namespace: key.namespace.clone(),
        template: format!("{}/{}", resource.kind, key.name),
        phase: format!("{phase:?}"),
    };
    for phase in [
        RolloutPhase::Completed,
        RolloutPhase::Progressing,
        RolloutPhase::Paused,
        RolloutPhase::RollingBack,
        RolloutPhase::RolledBack,
        RolloutPhase::Aborted,
    ] {
        if phase != decision.status.phase {
            metrics.rollout_phase.remove(&labels(phase));
        }
    }
    metrics
        .rollout_phase
        .get_or_create(&labels(decision.status.phase))
        .set(1);
    if let Some(passed) = measured {
        metrics
            .rollout_measurements
            .get_or_create(&ResultLabel {
                result: if passed { "passed" } else { "failed" }.into(),
            })
            .inc();
    }
}
