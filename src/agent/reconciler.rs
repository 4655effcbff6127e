//! The MyDatabase reconciler: read -> build -> apply -> report.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::{Api, Client, Resource, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::builders::{self, PodSettings, ReadOnlyReason};
use super::instances::Views;
use super::status::{Observed, compute_status, status_changed};
use super::volumes;
use crate::api::mydatabase::DatabasePhase;
use crate::api::{MyDatabase, MyDatabaseStatus};
use crate::error::{ApiErrorKind, classify};
use crate::metrics::Metrics;

/// The agent's finalizer on every MyDatabase.
pub const FINALIZER: &str = "example.com/cleanup";
/// The agent's server-side apply field manager.
pub const FIELD_MANAGER: &str = "bulkhead-agent";
const CONTROLLER: &str = "mydatabase";

/// Errors of one reconcile.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("{action} for MyDatabase {object}: {source}")]
    Api {
        action: String,
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("reconciling MyDatabase {object} took longer than {limit:?}")]
    Timeout { object: String, limit: Duration },
    #[error("finalizer of MyDatabase {object}: {message}")]
    Finalizer {
        object: String,
        message: String,
        kind: Option<ApiErrorKind>,
    },
}

impl ReconcileError {
    /// How the error should be handled.
    pub fn kind(&self) -> ApiErrorKind {
        match self {
            ReconcileError::Api { source, .. } => classify(source),
            ReconcileError::Timeout { .. } => ApiErrorKind::Transient,
            ReconcileError::Finalizer { kind, .. } => kind.unwrap_or(ApiErrorKind::Transient),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

/// Metrics of the agent.
#[derive(Clone)]
pub struct AgentMetrics {
    /// 1 while the agent is fenced.
    pub fenced: Gauge,
    databases_by_phase: Family<PhaseLabels, Gauge>,
}

impl AgentMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        let fenced = Gauge::default();
        metrics.register(
            "agent_fenced",
            "1 while the hub's lease is stale and databases are fenced read-only",
            fenced.clone(),
        );
        let databases_by_phase = Family::<PhaseLabels, Gauge>::default();
        metrics.register(
            "agent_mydatabases",
            "MyDatabases by phase",
            databases_by_phase.clone(),
        );
        AgentMetrics {
            fenced,
            databases_by_phase,
        }
    }
}

/// Shared state of the reconciler.
pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub agent_metrics: AgentMetrics,
    pub recorder: Recorder,
    /// True while fenced (see `fence.rs`).
    pub fenced: watch::Receiver<bool>,
    pub reconcile_timeout: Duration,
    /// What the instance loop saw of each database's instances.
    pub views: Views,
    /// What every database pod gets from the agent's settings.
    pub pod_settings: PodSettings,
    /// The primary terms the hub's Lease carries (see `fence.rs`).
    pub terms: crate::agent::instances::Terms,
    failures: Mutex<HashMap<String, u32>>,
    phases: Mutex<HashMap<String, DatabasePhase>>,
}

impl Context {
    /// Shares the primary terms the Lease watcher keeps.
    pub fn with_terms(mut self, terms: crate::agent::instances::Terms) -> Self {
        self.terms = terms;
        self
    }

    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        agent_metrics: AgentMetrics,
        recorder: Recorder,
        fenced: watch::Receiver<bool>,
        reconcile_timeout: Duration,
        views: Views,
        pod_settings: PodSettings,
    ) -> Self {
        Context {
            client,
            metrics,
            agent_metrics,
            recorder,
            fenced,
            reconcile_timeout,
            views,
            pod_settings,
            terms: Default::default(),
            failures: Mutex::new(HashMap::new()),
            phases: Mutex::new(HashMap::new()),
        }
    }

    fn record_phase(&self, key: &str, phase: Option<DatabasePhase>) {
        let mut phases = self.phases.lock().unwrap_or_else(|p| p.into_inner());
        match phase {
            Some(phase) => phases.insert(key.to_string(), phase),
            None => phases.remove(key),
        };
        for phase in [
            DatabasePhase::Pending,
            DatabasePhase::Provisioning,
            DatabasePhase::Ready,
            DatabasePhase::Degraded,
            DatabasePhase::ReadOnly,
            DatabasePhase::Deleting,
        ] {
            let count = phases.values().filter(|p| **p == phase).count();
            self.agent_metrics
                .databases_by_phase
                .get_or_create(&PhaseLabels {
                    phase: format!("{phase:?}"),
                })
                .set(count as i64);
        }
    }

    async fn publish(&self, database: &MyDatabase, type_: EventType, reason: &str, note: String) {
        publish(&self.recorder, database, type_, reason, note, "Reconcile").await;
    }
}

/// Publishes an Event on `database` (best effort: a failure is logged).
pub async fn publish(
    recorder: &Recorder,
    database: &MyDatabase,
    type_: EventType,
    reason: &str,
    note: String,
    action: &str,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, &database.object_ref(&())).await {
        tracing::debug!(%error, "cannot publish event");
    }
}

fn key(database: &MyDatabase) -> String {
    format!(
        "{}/{}",
        database.namespace().unwrap_or_default(),
        database.name_any()
    )
}

/// Entry point for the controller: bounded by a timeout, wrapped in the finalizer.
pub async fn reconcile(
    database: Arc<MyDatabase>,
    context: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let object = key(&database);
    let namespace = database.namespace().unwrap_or_default();
    let api: Api<MyDatabase> = Api::namespaced(context.client.clone(), &namespace);
    let work = finalizer(&api, FINALIZER, database, |event| async {
        match event {
            FinalizerEvent::Apply(database) => apply(&database, &context).await,
            FinalizerEvent::Cleanup(database) => cleanup(&database, &context).await,
        }
    });
    let result = match tokio::time::timeout(context.reconcile_timeout, work).await {
        Err(_) => Err(ReconcileError::Timeout {
            object: object.clone(),
            limit: context.reconcile_timeout,
        }),
        Ok(Ok(action)) => Ok(action),
        Ok(Err(error)) => Err(flatten_finalizer_error(&object, error)),
    };
    context
        .metrics
        .observe_reconcile(CONTROLLER, started.elapsed().as_secs_f64(), result.is_ok());
    if result.is_ok() {
        context
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&object);
    }
    result
}

fn flatten_finalizer_error(
    object: &str,
    error: kube::runtime::finalizer::Error<ReconcileError>,
) -> ReconcileError {
    use kube::runtime::finalizer::Error as F;
    match error {
        F::ApplyFailed(inner) | F::CleanupFailed(inner) => inner,
        F::AddFinalizer(source) | F::RemoveFinalizer(source) => ReconcileError::Finalizer {
            object: object.to_string(),
            message: source.to_string(),
            kind: Some(classify(&source)),
        },
        other => ReconcileError::Finalizer {
            object: object.to_string(),
            message: other.to_string(),
            kind: None,
        },
    }
}

/// What the controller does after a failed reconcile, by kind of error.
pub fn error_policy(
    database: Arc<MyDatabase>,
    error: &ReconcileError,
    context: Arc<Context>,
) -> Action {
    let object = key(&database);
    let failures = {
        let mut failures = context.failures.lock().unwrap_or_else(|p| p.into_inner());
        let count = failures.entry(object.clone()).or_insert(0);
        *count += 1;
        *count
    };
    let kind = error.kind();
    tracing::warn!(%object, ?kind, failures, %error, "reconcile failed");
    let report = |type_: EventType, reason: &'static str| {
        let context = context.clone();
        let database = database.clone();
        let note = error.to_string();
        tokio::spawn(async move { context.publish(&database, type_, reason, note).await });
    };
    match kind {
        ApiErrorKind::Conflict => Action::requeue(Duration::from_millis(200)),
        ApiErrorKind::Invalid => {
            report(EventType::Warning, "InvalidObject");
            Action::await_change()
        }
        ApiErrorKind::Forbidden => {
            report(EventType::Warning, "Forbidden");
            Action::requeue(Duration::from_secs(60))
        }
        ApiErrorKind::NotFound => Action::requeue(Duration::from_secs(1)),
        ApiErrorKind::Transient => {
            let backoff = Duration::from_millis(500) * 2u32.saturating_pow(failures.min(7));
            Action::requeue(backoff.min(Duration::from_secs(60)))
        }
    }
}

async fn server_side_apply<K>(
    client: &Client,
    namespace: &str,
    object: &K,
) -> Result<K, ReconcileError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
    K: Resource<Scope = kube::core::NamespaceResourceScope>,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map_err(|source| ReconcileError::Api {
        action: format!("applying {} {name}", K::kind(&())),
        object: format!(
            "{namespace}/{}",
            object
                .meta()
                .owner_references
                .as_ref()
                .and_then(|o| o.first())
                .map(|o| o.name.clone())
                .unwrap_or_default()
        ),
        source,
    })
}

async fn apply(database: &MyDatabase, context: &Context) -> Result<Action, ReconcileError> {
    let namespace = database.namespace().unwrap_or_default();
    let name = database.name_any();
    let object = key(database);
    let api_error = |action: &str| {
        let object = object.clone();
        let action = action.to_string();
        move |source| ReconcileError::Api {
            action,
            object,
            source,
        }
    };

    let fenced = *context.fenced.borrow();
    let read_only = builders::read_only_reason(database, fenced, &context.terms.load());
    let client = &context.client;
    let read_write_services = builders::read_write_services(database, read_only);

    // Read-only (fenced or spec.readOnly): the read-write Services lose their endpoints
    // before anything else is read or applied; the instance loop then demotes the primary
    // (the server itself refuses writes and its sessions end). A fence is a race against
    // the hub failing over; an unrelated failure further down (a quota, a slow
    // StatefulSet read) must not keep writers connected. The fence watcher triggers a
    // reconcile of every database (`reconcile_all_on` in `mod.rs`), and these are the
    // first requests of each.
    if read_only.is_some() {
        for service in &read_write_services {
            server_side_apply(client, &namespace, service).await?;
        }
    }

    // Read.
    let statefulsets: Api<StatefulSet> = Api::namespaced(context.client.clone(), &namespace);
    let existing = statefulsets
        .get_opt(&name)
        .await
        .map_err(api_error("reading the StatefulSet"))?;
    let storage_refused = existing
        .as_ref()
        .and_then(|sts| builders::storage_change(database, sts));

    // The Secrets the pods mount: made once, never overwritten (the data directories
    // hold these passwords).
    for secret in [
        builders::instance_secret(database),
        builders::app_secret(database),
    ] {
        create_once(client, &namespace, &secret, &object).await?;
    }
    server_side_apply(client, &namespace, &builders::headless_service(database)).await?;
    if read_only.is_none() {
        for service in &read_write_services {
            server_side_apply(client, &namespace, service).await?;
        }
    }
    server_side_apply(client, &namespace, &builders::read_only_service(database)).await?;
    server_side_apply(
        client,
        &namespace,
        &builders::any_instance_service(database),
    )
    .await?;
    if volumes::needs_reuse_check(database, existing.as_ref()) {
        // Before the StatefulSet, and a failure stops the reconcile: it is retried, since
        // the StatefulSet is not ours yet (see `needs_reuse_check`). Going on without it
        // would leave claims in use labelled released, the label operators select to
        // delete claims by hand (docs/mydatabase.md).
        take_back_released_claims(database, context).await?;
    }
    let mut desired = builders::statefulset(database, &context.pod_settings);
    if let (Some(_), Some(existing)) = (&storage_refused, &existing) {
        // Claim templates are immutable: keep the existing ones and apply the rest, so
        // replicas and version changes still go through.
        if let (Some(spec), Some(existing_spec)) = (desired.spec.as_mut(), existing.spec.as_ref()) {
            spec.volume_claim_templates = existing_spec.volume_claim_templates.clone();
        }
    }
    let statefulset = server_side_apply(client, &namespace, &desired).await?;

    // Report.
    let view = context.views.get(&object);
    let status = compute_status(&Observed {
        database,
        statefulset: Some(&statefulset),
        read_only,
        storage_refused: storage_refused.as_deref(),
        deleting: false,
        instances: view.as_ref(),
    });
    report(database, &status, context).await?;
    context.record_phase(&object, status.phase);
    Ok(
        if status.phase == Some(DatabasePhase::Ready)
            || status.phase == Some(DatabasePhase::ReadOnly)
        {
            Action::requeue(Duration::from_secs(300))
        } else {
            // Owned StatefulSet changes wake us earlier; this is a safety net.
            Action::requeue(Duration::from_secs(30))
        },
    )
}

/// Writes the status when it changed and publishes an Event per transition.
async fn report(
    database: &MyDatabase,
    status: &MyDatabaseStatus,
    context: &Context,
) -> Result<(), ReconcileError> {
    let previous = database.status.as_ref();
    if !status_changed(previous, status) {
        return Ok(());
    }
    let namespace = database.namespace().unwrap_or_default();
    let api: Api<MyDatabase> = Api::namespaced(context.client.clone(), &namespace);
    let mut patch = serde_json::json!({"status": status});
    // The primary and its term are the instance loop's, written with a precondition; a
    // status computed from an older read must never write them back.
    if let Some(fields) = patch["status"].as_object_mut() {
        fields.remove("primary");
        fields.remove("term");
    }
    api.patch_status(
        &database.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|source| ReconcileError::Api {
        action: "writing status".into(),
        object: key(database),
        source,
    })?;

    let old_phase = previous.and_then(|s| s.phase);
    if old_phase != status.phase {
        context
            .publish(
                database,
                if status.phase == Some(DatabasePhase::Degraded) {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                "PhaseChanged",
                format!(
                    "phase {} -> {}",
                    phase_name(old_phase),
                    phase_name(status.phase)
                ),
            )
            .await;
    }
    for condition in &status.conditions {
        let before =
            previous.and_then(|s| s.conditions.iter().find(|c| c.type_ == condition.type_));
        let transitioned =
            before.is_none_or(|b| b.status != condition.status || b.reason != condition.reason);
        if transitioned {
            let warning = (condition.type_ == "Degraded" && condition.status == "True")
                || (condition.type_ == "ReadOnly"
                    && condition.reason == ReadOnlyReason::HubUnreachable.as_str());
            context
                .publish(
                    database,
                    if warning {
                        EventType::Warning
                    } else {
                        EventType::Normal
                    },
                    &condition.reason,
                    format!(
                        "{}={}: {}",
                        condition.type_, condition.status, condition.message
                    ),
                )
                .await;
        }
    }
    Ok(())
}

fn phase_name(phase: Option<DatabasePhase>) -> String {
    phase
        .map(|p| format!("{p:?}"))
        .unwrap_or_else(|| "none".into())
}

/// Takes back the claims an earlier MyDatabase of this name left behind: the StatefulSet
/// (same name, same claim template) binds the same claim names by itself; this removes
/// the released marks and says so in an Event.
async fn take_back_released_claims(
    database: &MyDatabase,
    context: &Context,
) -> Result<(), ReconcileError> {
    let namespace = database.namespace().unwrap_or_default();
    let name = database.name_any();
    let api_error = |action: String| {
        let object = key(database);
        move |source| ReconcileError::Api {
            action,
            object,
            source,
        }
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(context.client.clone(), &namespace);
    let released = claims
        .list(&ListParams::default().labels(&volumes::released_claims_selector(&name)))
        .await
        .map_err(api_error("listing released volume claims".into()))?;
    let mut reused = vec![];
    for claim in &released.items {
        let claim_name = claim.name_any();
        claims
            .patch(
                &claim_name,
                &PatchParams::default(),
                &Patch::Merge(&volumes::reuse_patch()),
            )
            .await
            .map_err(api_error(format!(
                "taking back the released volume claim {claim_name}"
            )))?;
        reused.push(claim_name);
    }
    if !reused.is_empty() {
        context
            .publish(
                database,
                EventType::Normal,
                "VolumesReused",
                format!(
                    "reusing {} volume claim(s) kept from an earlier MyDatabase {name}: {}",
                    reused.len(),
                    reused.join(", ")
                ),
            )
            .await;
    }
    Ok(())
}

/// Decides what ownerReferences cannot: the fate of the volumes the StatefulSet created
/// from its claim templates (nothing owns them). They are deleted only when
/// `reclaimPolicy: Delete` and the deletion is the user's (`volumes::reclaim_decision`);
/// otherwise they stay, marked released, for a database of the same name to reuse.
async fn cleanup(database: &MyDatabase, context: &Context) -> Result<Action, ReconcileError> {
    let namespace = database.namespace().unwrap_or_default();
    let name = database.name_any();
    let object = key(database);
    let decision = volumes::reclaim_decision(database);
    let deleting = compute_status(&Observed {
        database,
        statefulset: None,
        read_only: None,
        storage_refused: None,
        deleting: true,
        instances: None,
    });
    if database.status.as_ref().and_then(|s| s.phase) != Some(DatabasePhase::Deleting) {
        let api: Api<MyDatabase> = Api::namespaced(context.client.clone(), &namespace);
        let patch = serde_json::json!({"status": {"phase": deleting.phase}});
        // Best effort: the object may already be on its way out.
        let _ = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        let fate = match decision {
            volumes::VolumeDecision::Delete => "its volumes are deleted (reclaimPolicy Delete)",
            volumes::VolumeDecision::Retain(_) => "its volumes are kept",
        };
        context
            .publish(
                database,
                EventType::Normal,
                "Deleting",
                format!("deleting the database; children go with their owner and {fate}"),
            )
            .await;
    }
    let api_error = |action: String| {
        let object = object.clone();
        move |source| ReconcileError::Api {
            action,
            object,
            source,
        }
    };
    // Never deletecollection on a label alone: list, then act on each claim by name, so
    // the decision is about the claims seen here and nothing else.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(context.client.clone(), &namespace);
    let listed = claims
        .list(&ListParams::default().labels(&volumes::claims_selector(&name)))
        .await
        .map_err(api_error("listing the volume claims".into()))?;
    match decision {
        volumes::VolumeDecision::Delete => {
            let mut deleted = vec![];
            for claim in &listed.items {
                let claim_name = claim.name_any();
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: claim.metadata.uid.clone(),
                        resource_version: None,
                    }),
                    ..DeleteParams::background()
                };
                match claims.delete(&claim_name, &params).await {
                    Ok(_) => deleted.push(claim_name),
                    Err(error) if classify(&error) == ApiErrorKind::NotFound => {}
                    // The UID precondition failed: a different claim of that name exists
                    // now, which this deletion never saw. Not ours to delete.
                    Err(error) if classify(&error) == ApiErrorKind::Conflict => {
                        tracing::info!(%object, claim = %claim_name, %error, "volume claim replaced since it was listed; left alone");
                    }
                    Err(error) => {
                        return Err(
                            api_error(format!("deleting the volume claim {claim_name}"))(error),
                        );
                    }
                }
            }
            if !deleted.is_empty() {
                context
                    .publish(
                        database,
                        EventType::Normal,
                        "VolumesDeleted",
                        format!(
                            "deleted {} volume claim(s) (reclaimPolicy Delete): {}",
                            deleted.len(),
                            deleted.join(", ")
                        ),
                    )
                    .await;
            }
        }
        volumes::VolumeDecision::Retain(reason) => {
            let now = jiff::Timestamp::now();
            let mut kept = vec![];
            for claim in &listed.items {
                let claim_name = claim.name_any();
                if !volumes::is_released(claim) {
                    claims
                        .patch(
                            &claim_name,
                            &PatchParams::default(),
                            &Patch::Merge(&volumes::release_patch(claim, &name, now)),
                        )
                        .await
                        .map_err(api_error(format!(
                            "marking the volume claim {claim_name} released"
                        )))?;
                }
                kept.push(claim_name);
            }
            // The data directories hold the passwords of these Secrets: kept with the
            // claims (no longer owned, so the garbage collector leaves them), a database
            // created again on the claims takes them back (`create_once`) and its
            // application's credentials still log in.
            let secrets: Api<Secret> = Api::namespaced(context.client.clone(), &namespace);
            for secret in [
                builders::instance_secret_name(&name),
                builders::app_secret_name(&name),
            ] {
                match secrets
                    .patch(
                        &secret,
                        &PatchParams::default(),
                        &Patch::Merge(&serde_json::json!({"metadata": {
                            "ownerReferences": null,
                            "labels": {volumes::LABEL_RELEASED: "true"},
                        }})),
                    )
                    .await
                {
                    Ok(_) => {}
                    Err(error) if classify(&error) == ApiErrorKind::NotFound => {}
                    Err(error) => {
                        return Err(api_error(format!("keeping the Secret {secret}"))(error));
                    }
                }
            }
            if !kept.is_empty() {
                context
                    .publish(
                        database,
                        EventType::Normal,
                        "VolumesRetained",
                        format!(
                            "kept {} volume claim(s) because {}: {}; a MyDatabase {name} created again in this namespace reuses them, or list them with `kubectl get pvc -n {namespace} -l {}` to delete them by hand",
                            kept.len(),
                            reason.explanation(),
                            kept.join(", "),
                            volumes::released_claims_selector(&name),
                        ),
                    )
                    .await;
            }
        }
    }
    context.record_phase(&object, None);
    Ok(Action::await_change())
}

/// The children kinds the controller watches to map changes back to their MyDatabase.
pub fn owned_kinds(client: &Client, namespace: Option<&str>) -> (Api<StatefulSet>, Api<Service>) {
    match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    }
}

/// Creates `secret` unless one of its name exists (whatever it holds: it is never
/// overwritten). One a deletion of an earlier database of this name released (its claims
/// kept, so its data holds these passwords) is taken back: owned by this one again.
async fn create_once(
    client: &Client,
    namespace: &str,
    secret: &Secret,
    object: &str,
) -> Result<(), ReconcileError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let name = secret.name_any();
    let error = |action: &str, source| ReconcileError::Api {
        action: format!("{action} the Secret {name}"),
        object: object.to_string(),
        source,
    };
    if let Some(existing) = api.get_opt(&name).await.map_err(|e| error("reading", e))? {
        // Only one a deletion released (labelled so): a Secret a person made under that
        // name stays theirs (never owned, so never garbage-collected with the database).
        let released = existing
            .labels()
            .get(volumes::LABEL_RELEASED)
            .is_some_and(|v| v == "true");
        if released && let Some(owner) = secret.metadata.owner_references.clone() {
            tracing::info!(%object, secret = %name, "taking back the Secret kept from an earlier database of this name");
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({"metadata": {
                    "ownerReferences": owner,
                    "labels": {volumes::LABEL_RELEASED: null},
                }})),
            )
            .await
            .map_err(|e| error("taking back", e))?;
        }
        return Ok(());
    }
    match api.create(&kube::api::PostParams::default(), secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(error("creating", e)),
    }
}

/// Controller tests against a mocked API server: the exact request sequences of a
/// reconcile, as kube-rs' controller-rs tests them.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MyDatabaseSpec;
    use crate::api::mydatabase::ReclaimPolicy;
    use http::{Request, Response, StatusCode};
    use kube::client::Body;
    use kube::runtime::events::Reporter;

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    fn context(fenced: bool) -> (Arc<Context>, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let metrics = Arc::new(Metrics::new("test"));
        let agent_metrics = AgentMetrics::register(&metrics);
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "test".into(),
                instance: None,
            },
        );
        let (_tx, rx) = watch::channel(fenced);
        let context = Context::new(
            client,
            metrics,
            agent_metrics,
            recorder,
            rx,
            Duration::from_secs(5),
            Views::default(),
            PodSettings::default(),
        );
        (Arc::new(context), handle)
    }

    fn orders(finalizer: bool, deleting: bool) -> MyDatabase {
        let mut db = MyDatabase::new(
            "orders",
            MyDatabaseSpec {
                replicas: 3,
                ..Default::default()
            },
        );
        db.metadata.namespace = Some("shop".into());
        db.metadata.uid = Some("uid-1".into());
        db.metadata.generation = Some(1);
        db.metadata.resource_version = Some("7".into());
        if finalizer {
            db.metadata.finalizers = Some(vec![FINALIZER.into()]);
        }
        if deleting {
            db.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
            );
        }
        db
    }

    fn json(status: StatusCode, body: serde_json::Value) -> Response<Body> {
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap()
    }

    fn not_found() -> Response<Body> {
        json(
            StatusCode::NOT_FOUND,
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
        )
    }

    /// One request the mocked API server answered (Events aside).
    #[derive(Debug)]
    struct Recorded {
        /// "METHOD path?query".
        call: String,
        content_type: String,
        body: serde_json::Value,
    }

    /// What the mocked API server saw.
    struct Served {
        /// "METHOD path?query" of everything but Events, in order.
        calls: Vec<String>,
        events: Vec<serde_json::Value>,
        requests: Vec<Recorded>,
    }

    /// Serves requests until the reconcile ends, answering each with `answer` and
    /// recording "METHOD path" for everything but Events.
    fn serve(
        mut handle: Handle,
        answer: impl Fn(&str, &str, &serde_json::Value) -> Response<Body> + Send + 'static,
    ) -> tokio::task::JoinHandle<Served> {
        tokio::spawn(async move {
            let mut calls = vec![];
            let mut events = vec![];
            let mut requests = vec![];
            while let Some((request, send)) = handle.next_request().await {
                let method = request.method().to_string();
                let path = request.uri().path().to_string();
                let query = request.uri().query().unwrap_or_default().to_string();
                let content_type = request
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let bytes = request.into_body().collect_bytes().await.unwrap();
                let body: serde_json::Value =
                    serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
                if path.contains("/events") {
                    events.push(body.clone());
                    send.send_response(json(StatusCode::CREATED, body));
                    continue;
                }
                let call = if query.is_empty() {
                    format!("{method} {path}")
                } else {
                    format!("{method} {path}?{query}")
                };
                send.send_response(answer(&method, &path, &body));
                requests.push(Recorded {
                    call: call.clone(),
                    content_type,
                    body,
                });
                calls.push(call);
            }
            Served {
                calls,
                events,
                requests,
            }
        })
    }

    fn claim_list(items: serde_json::Value) -> Response<Body> {
        json(
            StatusCode::OK,
            serde_json::json!({"kind": "PersistentVolumeClaimList", "apiVersion": "v1", "metadata": {}, "items": items}),
        )
    }

    /// Two claims the StatefulSet made for `orders`, as the API lists them.
    fn two_claims(released: bool) -> serde_json::Value {
        let claim = |ordinal: u32| {
            let mut labels = serde_json::json!({"example.com/database": "orders"});
            if released {
                labels[volumes::LABEL_RELEASED] = "true".into();
            }
            serde_json::json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": format!("data-orders-{ordinal}"), "namespace": "shop", "uid": format!("claim-uid-{ordinal}"), "resourceVersion": "9", "labels": labels},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
            })
        };
        serde_json::json!([claim(0), claim(1)])
    }

    fn status(code: u16, reason: &str) -> Response<Body> {
        json(
            StatusCode::from_u16(code).unwrap(),
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": reason}),
        )
    }

    fn echo(method: &str, path: &str, body: &serde_json::Value) -> Response<Body> {
        if path.ends_with("/statefulsets/orders") && body.is_null() {
            return not_found();
        }
        if method == "GET" && path.contains("/secrets/") {
            return not_found();
        }
        if method == "GET" && path.ends_with("/persistentvolumeclaims") {
            return claim_list(serde_json::json!([]));
        }
        if method == "DELETE" && path.contains("/persistentvolumeclaims/") {
            return json(
                StatusCode::OK,
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}),
            );
        }
        if method == "PATCH" && path.contains("/secrets/") {
            let name = path.rsplit('/').next().unwrap_or_default();
            return json(
                StatusCode::OK,
                serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "shop"}}),
            );
        }
        if method == "PATCH" && path.contains("/persistentvolumeclaims/") {
            // The claim after the patch; a merge patch body is not one (null values).
            let name = path.rsplit('/').next().unwrap_or_default();
            return json(
                StatusCode::OK,
                serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "shop"}}),
            );
        }
        let mut body = body.clone();
        if path.contains("/mydatabases/") {
            body = serde_json::to_value(orders(true, false)).unwrap();
        }
        json(StatusCode::OK, body)
    }

    /// Serves a deletion whose claim list holds [`two_claims`].
    fn serve_with_claims(handle: Handle, released: bool) -> tokio::task::JoinHandle<Served> {
        serve(handle, move |method, path, body| {
            if method == "GET" && path.ends_with("/persistentvolumeclaims") {
                return claim_list(two_claims(released));
            }
            echo(method, path, body)
        })
    }

    fn deleted(database: MyDatabase) -> MyDatabase {
        let mut database = database;
        database.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        database
    }

    fn hub_copy(policy: ReclaimPolicy, template_deleted: bool) -> MyDatabase {
        let mut db = orders(true, false);
        db.spec.storage.reclaim_policy = policy;
        db.labels_mut().insert(
            crate::api::LABEL_MANAGED_BY.into(),
            crate::hub::federation::copies::MANAGED_BY.into(),
        );
        if template_deleted {
            db.annotations_mut().insert(
                crate::api::ANNOTATION_TEMPLATE_DELETED.into(),
                "true".into(),
            );
        }
        deleted(db)
    }

    const CLAIMS: &str = "/api/v1/namespaces/shop/persistentvolumeclaims";
    const SECRETS: &str = "/api/v1/namespaces/shop/secrets";
    const LIST_CLAIMS: &str = "GET /api/v1/namespaces/shop/persistentvolumeclaims?&labelSelector=example.com%2Fdatabase%3Dorders";
    const STATUS: &str = "PATCH /apis/example.com/v1/namespaces/shop/mydatabases/orders/status";
    const FINALIZER_REMOVAL: &str = "PATCH /apis/example.com/v1/namespaces/shop/mydatabases/orders";

    #[tokio::test]
    async fn first_reconcile_adds_the_finalizer_and_stops() {
        let (context, handle) = context(false);
        let server = serve(handle, echo);
        let action = reconcile(Arc::new(orders(false, false)), context.clone())
            .await
            .unwrap();
        assert_eq!(action, Action::await_change());
        drop(context);
        let Served { calls, .. } = server.await.unwrap();
        assert_eq!(
            calls,
            ["PATCH /apis/example.com/v1/namespaces/shop/mydatabases/orders"],
            "{calls:#?}"
        );
    }

    #[tokio::test]
    async fn create_applies_every_child_then_writes_status_once() {
        let (context, handle) = context(false);
        let server = serve(handle, echo);
        let action = reconcile(Arc::new(orders(true, false)), context.clone())
            .await
            .unwrap();
        assert_eq!(
            action,
            Action::requeue(Duration::from_secs(30)),
            "Provisioning: safety-net requeue"
        );
        drop(context);
        let Served { calls, events, .. } = server.await.unwrap();
        let apply = "?&force=true&fieldManager=bulkhead-agent";
        let secrets = "/api/v1/namespaces/shop/secrets";
        assert_eq!(
            calls,
            [
                "GET /apis/apps/v1/namespaces/shop/statefulsets/orders".to_string(),
                format!("GET {secrets}/orders-instance"),
                format!("POST {secrets}"),
                format!("GET {secrets}/orders-app"),
                format!("POST {secrets}"),
                format!("PATCH /api/v1/namespaces/shop/services/orders-headless{apply}"),
                format!("PATCH /api/v1/namespaces/shop/services/orders-rw{apply}"),
                format!("PATCH /api/v1/namespaces/shop/services/orders{apply}"),
                format!("PATCH /api/v1/namespaces/shop/services/orders-ro{apply}"),
                format!("PATCH /api/v1/namespaces/shop/services/orders-r{apply}"),
                format!(
                    "GET {CLAIMS}?&labelSelector=example.com%2Fdatabase%3Dorders%2Cexample.com%2Freleased%3Dtrue"
                ),
                format!("PATCH /apis/apps/v1/namespaces/shop/statefulsets/orders{apply}"),
                STATUS.to_string(),
            ],
            "a new StatefulSet: released claims are looked for once, before it; {calls:#?}"
        );
        let reasons: Vec<&str> = events.iter().filter_map(|e| e["reason"].as_str()).collect();
        assert!(reasons.contains(&"PhaseChanged"), "{reasons:?}");
    }

    #[tokio::test]
    async fn fenced_create_renders_read_only_children() {
        let (context, handle) = context(true);
        let bodies = Arc::new(Mutex::new(HashMap::new()));
        let seen = bodies.clone();
        let server = serve(handle, move |method, path, body| {
            if method == "PATCH" && path.contains("/services/") {
                seen.lock().unwrap().insert(path.to_string(), body.clone());
            }
            echo(method, path, body)
        });
        reconcile(Arc::new(orders(true, false)), context.clone())
            .await
            .unwrap();
        drop(context);
        server.await.unwrap();
        let bodies = bodies.lock().unwrap();
        for name in ["orders", "orders-rw"] {
            assert_eq!(
                bodies[&format!("/api/v1/namespaces/shop/services/{name}")]["spec"]["selector"]
                    [builders::LABEL_ACCEPTS_WRITES],
                "true",
                "{name}"
            );
        }
        assert!(
            bodies["/api/v1/namespaces/shop/services/orders-ro"]["spec"]["selector"]
                .get(builders::LABEL_ACCEPTS_WRITES)
                .is_none(),
            "reads keep being served"
        );
    }

    /// Read-only for either reason: the read-write Services (a selector without
    /// endpoints) are the very first requests, before the StatefulSet is even read; the
    /// instance loop then demotes the primary. Writable, they follow the other children.
    #[tokio::test]
    async fn read_only_takes_the_writers_away_before_anything_else() {
        let apply = "?&force=true&fieldManager=bulkhead-agent";
        let rw = [
            format!("PATCH /api/v1/namespaces/shop/services/orders-rw{apply}"),
            format!("PATCH /api/v1/namespaces/shop/services/orders{apply}"),
        ];
        let read = "GET /apis/apps/v1/namespaces/shop/statefulsets/orders".to_string();
        for (fenced, requested) in [(true, false), (false, true), (true, true), (false, false)] {
            let (context, handle) = context(fenced);
            let server = serve(handle, echo);
            let mut db = orders(true, false);
            db.spec.read_only = requested;
            reconcile(Arc::new(db), context.clone()).await.unwrap();
            drop(context);
            let Served {
                calls, requests, ..
            } = server.await.unwrap();
            let position = |call: &str| calls.iter().position(|c| c == call).unwrap();
            if fenced || requested {
                assert_eq!(
                    calls[0..2],
                    rw,
                    "fenced={fenced} readOnly={requested}: {calls:#?}"
                );
                for request in &requests[0..2] {
                    assert_eq!(
                        request.body["spec"]["selector"][builders::LABEL_ACCEPTS_WRITES],
                        "true"
                    );
                }
                for service in &rw {
                    assert_eq!(
                        calls.iter().filter(|c| *c == service).count(),
                        1,
                        "applied once: {calls:#?}"
                    );
                }
                assert_eq!(calls[2], read);
            } else {
                assert_eq!(calls[0], read, "{calls:#?}");
                assert!(
                    position(&format!(
                        "PATCH /api/v1/namespaces/shop/services/orders-headless{apply}"
                    )) < position(&rw[0])
                );
            }
        }
    }

    /// A member's quota or webhook refusing a Secret fails the reconcile, but the fence is
    /// already in place: the read-write Services' PATCHes went out first.
    #[tokio::test]
    async fn a_refused_secret_does_not_delay_the_fence() {
        for (code, reason, kind) in [
            (403, "Forbidden", ApiErrorKind::Forbidden),
            (422, "Invalid", ApiErrorKind::Invalid),
        ] {
            let (context, handle) = context(true);
            let server = serve(handle, move |method, path, body| {
                if method == "POST" && path.ends_with("/secrets") {
                    return status(code, reason);
                }
                echo(method, path, body)
            });
            let error = reconcile(Arc::new(orders(true, false)), context.clone())
                .await
                .unwrap_err();
            assert_eq!(error.kind(), kind, "{error}");
            drop(context);
            let Served {
                calls, requests, ..
            } = server.await.unwrap();
            let apply = "?&force=true&fieldManager=bulkhead-agent";
            assert_eq!(
                calls,
                [
                    format!("PATCH /api/v1/namespaces/shop/services/orders-rw{apply}"),
                    format!("PATCH /api/v1/namespaces/shop/services/orders{apply}"),
                    "GET /apis/apps/v1/namespaces/shop/statefulsets/orders".to_string(),
                    "GET /api/v1/namespaces/shop/secrets/orders-instance".to_string(),
                    "POST /api/v1/namespaces/shop/secrets".to_string(),
                ],
                "{code}: the fence went out before the refused Secret; {calls:#?}"
            );
            assert_eq!(
                requests[0].body["spec"]["selector"],
                serde_json::json!({"example.com/database": "orders", builders::LABEL_ROLE: "primary", builders::LABEL_ACCEPTS_WRITES: "true"})
            );
        }
    }

    #[tokio::test]
    async fn an_update_applies_the_new_replica_count_and_reports_scaling() {
        let (context, handle) = context(false);
        let mut db = orders(true, false);
        db.spec.replicas = 5;
        db.metadata.generation = Some(2);
        let applied = Arc::new(Mutex::new(None));
        let seen = applied.clone();
        let server = serve(handle, move |method, path, body| {
            if path.ends_with("/statefulsets/orders") && method == "GET" {
                let mut existing = serde_json::to_value(builders::statefulset(
                    &orders(true, false),
                    &PodSettings::default(),
                ))
                .unwrap();
                existing["metadata"]["generation"] = 1.into();
                existing["status"] = serde_json::json!({"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3, "observedGeneration": 1});
                return json(StatusCode::OK, existing);
            }
            if path.ends_with("/statefulsets/orders") && method == "PATCH" {
                *seen.lock().unwrap() = Some(body.clone());
                let mut answer = body.clone();
                answer["metadata"]["generation"] = 2.into();
                answer["status"] = serde_json::json!({"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3, "observedGeneration": 2});
                return json(StatusCode::OK, answer);
            }
            echo(method, path, body)
        });
        reconcile(Arc::new(db), context.clone()).await.unwrap();
        drop(context);
        let Served { calls, events, .. } = server.await.unwrap();
        assert_eq!(
            applied.lock().unwrap().as_ref().unwrap()["spec"]["replicas"],
            5
        );
        assert!(
            calls
                .iter()
                .any(|c| c.ends_with("/mydatabases/orders/status")),
            "{calls:#?}"
        );
        let reasons: Vec<&str> = events.iter().filter_map(|e| e["reason"].as_str()).collect();
        assert!(
            reasons.contains(&"ScalingUp"),
            "a Progressing transition is announced: {reasons:?}"
        );
    }

    #[tokio::test]
    async fn unchanged_status_is_not_written_again() {
        let (context, handle) = context(false);
        let mut db = orders(true, false);
        let sts_status = serde_json::json!({"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3, "observedGeneration": 1, "currentRevision": "a", "updateRevision": "a"});
        let mut sts =
            serde_json::to_value(builders::statefulset(&db, &PodSettings::default())).unwrap();
        sts["metadata"]["generation"] = 1.into();
        sts["status"] = sts_status;
        let typed: StatefulSet = serde_json::from_value(sts.clone()).unwrap();
        db.status = Some(compute_status(&Observed {
            database: &db,
            statefulset: Some(&typed),
            read_only: None,
            storage_refused: None,
            deleting: false,
            instances: None,
        }));
        let server = serve(handle, move |method, path, body| {
            if path.ends_with("/statefulsets/orders") {
                return json(StatusCode::OK, sts.clone());
            }
            echo(method, path, body)
        });
        let action = reconcile(Arc::new(db), context.clone()).await.unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(300)));
        drop(context);
        let Served { calls, events, .. } = server.await.unwrap();
        assert!(
            !calls.iter().any(|c| c.contains("/status")),
            "no status write: {calls:#?}"
        );
        assert!(events.is_empty(), "no transition, no event: {events:?}");
        assert!(
            !calls.iter().any(|c| c.contains("/persistentvolumeclaims")),
            "the StatefulSet is ours: no claim request in the steady state: {calls:#?}"
        );
    }

    fn patched_claims(requests: &[Recorded]) -> Vec<&Recorded> {
        requests
            .iter()
            .filter(|r| r.call.starts_with(&format!("PATCH {CLAIMS}/")))
            .collect()
    }

    #[tokio::test]
    async fn deletion_with_retain_keeps_the_claims_and_marks_them_released() {
        let (context, handle) = context(false);
        let server = serve_with_claims(handle, false);
        let action = reconcile(Arc::new(orders(true, true)), context.clone())
            .await
            .unwrap();
        assert_eq!(action, Action::await_change());
        drop(context);
        let Served {
            calls,
            events,
            requests,
        } = server.await.unwrap();
        assert_eq!(
            calls,
            [
                STATUS.to_string(),
                LIST_CLAIMS.to_string(),
                format!("PATCH {CLAIMS}/data-orders-0"),
                format!("PATCH {CLAIMS}/data-orders-1"),
                format!("PATCH {SECRETS}/orders-instance"),
                format!("PATCH {SECRETS}/orders-app"),
                FINALIZER_REMOVAL.to_string(),
            ],
            "no DELETE of a claim: {calls:#?}"
        );
        // The Secrets go with the claims: no longer owned (the garbage collector leaves
        // them), labelled released (only such a Secret is taken back by a new database).
        for secret in requests
            .iter()
            .filter(|r| r.call.starts_with(&format!("PATCH {SECRETS}/")))
        {
            assert_eq!(
                secret.body,
                serde_json::json!({"metadata": {"ownerReferences": null, "labels": {"example.com/released": "true"}}})
            );
        }
        for patch in patched_claims(&requests) {
            assert_eq!(patch.content_type, "application/merge-patch+json");
            let metadata = &patch.body["metadata"];
            assert_eq!(
                metadata["labels"],
                serde_json::json!({"example.com/released": "true"})
            );
            let at = metadata["annotations"][volumes::ANNOTATION_RELEASED_AT]
                .as_str()
                .unwrap();
            assert!(at.parse::<jiff::Timestamp>().is_ok(), "RFC 3339: {at}");
        }
        assert!(events.iter().any(|e| e["reason"] == "Deleting"));
        let retained = events
            .iter()
            .find(|e| e["reason"] == "VolumesRetained")
            .expect("a VolumesRetained event");
        let note = retained["note"].as_str().unwrap();
        assert!(
            note.contains("kept 2 volume claim(s)")
                && note.contains("reclaimPolicy is Retain")
                && note.contains("data-orders-0, data-orders-1"),
            "{note}"
        );
    }

    #[tokio::test]
    async fn a_retried_deletion_keeps_the_first_release_time() {
        let (context, handle) = context(false);
        let server = serve_with_claims(handle, true);
        reconcile(Arc::new(orders(true, true)), context.clone())
            .await
            .unwrap();
        drop(context);
        let Served { calls, events, .. } = server.await.unwrap();
        assert_eq!(
            calls,
            [
                STATUS.to_string(),
                LIST_CLAIMS.to_string(),
                // The Secrets kept with the claims (their passwords are in the data).
                format!("PATCH {SECRETS}/orders-instance"),
                format!("PATCH {SECRETS}/orders-app"),
                FINALIZER_REMOVAL.to_string(),
            ],
            "{calls:#?}"
        );
        assert!(events.iter().any(|e| e["reason"] == "VolumesRetained"));
    }

    #[tokio::test]
    async fn a_hub_copy_moved_away_keeps_its_claims_even_with_reclaim_policy_delete() {
        let (context, handle) = context(false);
        let server = serve_with_claims(handle, false);
        reconcile(
            Arc::new(hub_copy(ReclaimPolicy::Delete, false)),
            context.clone(),
        )
        .await
        .unwrap();
        drop(context);
        let Served {
            calls,
            events,
            requests,
        } = server.await.unwrap();
        assert_eq!(
            calls,
            [
                STATUS.to_string(),
                LIST_CLAIMS.to_string(),
                format!("PATCH {CLAIMS}/data-orders-0"),
                format!("PATCH {CLAIMS}/data-orders-1"),
                format!("PATCH {SECRETS}/orders-instance"),
                format!("PATCH {SECRETS}/orders-app"),
                FINALIZER_REMOVAL.to_string(),
            ],
            "{calls:#?}"
        );
        assert!(!calls.iter().any(|c| c.starts_with("DELETE")));
        assert_eq!(patched_claims(&requests).len(), 2);
        let note = events
            .iter()
            .find(|e| e["reason"] == "VolumesRetained")
            .and_then(|e| e["note"].as_str())
            .unwrap();
        assert!(
            note.contains("managed by the federation hub")
                && note.contains("template was not deleted"),
            "{note}"
        );
    }

    #[tokio::test]
    async fn a_hub_copy_whose_template_was_deleted_deletes_each_claim_by_uid() {
        let (context, handle) = context(false);
        let server = serve_with_claims(handle, false);
        reconcile(
            Arc::new(hub_copy(ReclaimPolicy::Delete, true)),
            context.clone(),
        )
        .await
        .unwrap();
        drop(context);
        let Served {
            calls,
            events,
            requests,
        } = server.await.unwrap();
        assert_eq!(
            calls,
            [
                STATUS.to_string(),
                LIST_CLAIMS.to_string(),
                format!("DELETE {CLAIMS}/data-orders-0"),
                format!("DELETE {CLAIMS}/data-orders-1"),
                FINALIZER_REMOVAL.to_string(),
            ],
            "each claim by name, never a collection: {calls:#?}"
        );
        for (ordinal, delete) in requests
            .iter()
            .filter(|r| r.call.starts_with("DELETE"))
            .enumerate()
        {
            assert_eq!(
                delete.body["preconditions"],
                serde_json::json!({"uid": format!("claim-uid-{ordinal}")})
            );
            assert_eq!(delete.body["propagationPolicy"], "Background");
        }
        assert!(events.iter().any(|e| e["reason"] == "VolumesDeleted"));
        assert!(!events.iter().any(|e| e["reason"] == "VolumesRetained"));
    }

    #[tokio::test]
    async fn an_unmanaged_database_with_reclaim_policy_delete_deletes_its_claims() {
        let (context, handle) = context(false);
        let server = serve_with_claims(handle, false);
        let mut db = orders(true, true);
        db.spec.storage.reclaim_policy = ReclaimPolicy::Delete;
        reconcile(Arc::new(db), context.clone()).await.unwrap();
        drop(context);
        let Served { calls, .. } = server.await.unwrap();
        assert_eq!(
            calls,
            [
                STATUS.to_string(),
                LIST_CLAIMS.to_string(),
                format!("DELETE {CLAIMS}/data-orders-0"),
                format!("DELETE {CLAIMS}/data-orders-1"),
                FINALIZER_REMOVAL.to_string(),
            ],
            "{calls:#?}"
        );
    }

    /// A claim already gone (404) or replaced by another of that name since the list (the
    /// UID precondition fails with 409) is not an error, and is not deleted.
    #[tokio::test]
    async fn a_claim_gone_or_replaced_since_the_list_is_left_alone() {
        let (context, handle) = context(false);
        let server = serve(handle, |method, path, body| {
            if method == "GET" && path.ends_with("/persistentvolumeclaims") {
                return claim_list(two_claims(false));
            }
            if method == "DELETE" && path.ends_with("/data-orders-0") {
                return not_found();
            }
            if method == "DELETE" && path.ends_with("/data-orders-1") {
                return status(409, "Conflict");
            }
            echo(method, path, body)
        });
        let mut db = orders(true, true);
        db.spec.storage.reclaim_policy = ReclaimPolicy::Delete;
        let action = reconcile(Arc::new(db), context.clone()).await.unwrap();
        assert_eq!(action, Action::await_change());
        drop(context);
        let Served { calls, events, .. } = server.await.unwrap();
        assert_eq!(calls.last().unwrap(), FINALIZER_REMOVAL, "{calls:#?}");
        assert!(
            !events.iter().any(|e| e["reason"] == "VolumesDeleted"),
            "nothing was deleted by this reconcile: {events:#?}"
        );
    }

    #[tokio::test]
    async fn a_database_created_again_takes_back_its_released_claims() {
        let (context, handle) = context(false);
        let server = serve(handle, |method, path, body| {
            if method == "GET" && path.ends_with("/persistentvolumeclaims") {
                return claim_list(two_claims(true));
            }
            echo(method, path, body)
        });
        reconcile(Arc::new(orders(true, false)), context.clone())
            .await
            .unwrap();
        drop(context);
        let Served {
            calls,
            events,
            requests,
        } = server.await.unwrap();
        let apply = "?&force=true&fieldManager=bulkhead-agent";
        let sts = format!("PATCH /apis/apps/v1/namespaces/shop/statefulsets/orders{apply}");
        let first_reuse = calls
            .iter()
            .position(|c| c == &format!("PATCH {CLAIMS}/data-orders-0"))
            .expect("claim 0 taken back");
        assert_eq!(
            calls[first_reuse + 1],
            format!("PATCH {CLAIMS}/data-orders-1")
        );
        assert!(
            first_reuse < calls.iter().position(|c| *c == sts).unwrap(),
            "before the StatefulSet: {calls:#?}"
        );
        for patch in patched_claims(&requests) {
            assert_eq!(patch.content_type, "application/merge-patch+json");
            assert_eq!(patch.body, volumes::reuse_patch());
        }
        let note = events
            .iter()
            .find(|e| e["reason"] == "VolumesReused")
            .and_then(|e| e["note"].as_str())
            .expect("a VolumesReused event");
        assert!(note.contains("data-orders-0, data-orders-1"), "{note}");
    }

    #[tokio::test]
    async fn a_conflict_is_retried_at_once_and_invalid_waits_for_a_change() {
        let (context, handle) = context(false);
        let server = serve(handle, |_, _, _| {
            json(
                StatusCode::CONFLICT,
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "the object has been modified"}),
            )
        });
        let database = Arc::new(orders(false, false));
        let error = reconcile(database.clone(), context.clone())
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ApiErrorKind::Conflict);
        assert_eq!(
            error_policy(database.clone(), &error, context.clone()),
            Action::requeue(Duration::from_millis(200))
        );

        let invalid = ReconcileError::Api {
            action: "applying StatefulSet orders".into(),
            object: "shop/orders".into(),
            source: kube::Error::Api(Box::new(kube::core::Status {
                code: 422,
                ..Default::default()
            })),
        };
        assert_eq!(
            error_policy(database.clone(), &invalid, context.clone()),
            Action::await_change()
        );
        let transient = ReconcileError::Timeout {
            object: "shop/orders".into(),
            limit: Duration::from_secs(5),
        };
        let first = error_policy(database.clone(), &transient, context.clone());
        let second = error_policy(database.clone(), &transient, context.clone());
        assert_ne!(first, second, "transient errors back off further each time");
        drop(context);
        tokio::time::sleep(Duration::from_millis(50)).await;
        server.abort();
    }
}
