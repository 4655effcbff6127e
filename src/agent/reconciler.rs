//! The MyDatabase reconciler: read -> build -> apply -> report.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
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

use super::builders::{self, ReadOnlyReason};
use super::status::{Observed, compute_status, status_changed};
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
    failures: Mutex<HashMap<String, u32>>,
    phases: Mutex<HashMap<String, DatabasePhase>>,
}

impl Context {
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        agent_metrics: AgentMetrics,
        recorder: Recorder,
        fenced: watch::Receiver<bool>,
        reconcile_timeout: Duration,
    ) -> Self {
        Context {
            client,
            metrics,
            agent_metrics,
            recorder,
            fenced,
            reconcile_timeout,
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
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(error) = self
            .recorder
            .publish(&event, &database.object_ref(&()))
            .await
        {
            tracing::debug!(%error, "cannot publish event");
        }
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

    // Read.
    let fenced = *context.fenced.borrow();
    let read_only = builders::read_only_reason(database, fenced);
    let statefulsets: Api<StatefulSet> = Api::namespaced(context.client.clone(), &namespace);
    let existing = statefulsets
        .get_opt(&name)
        .await
        .map_err(api_error("reading the StatefulSet"))?;
    let storage_refused = existing
        .as_ref()
        .and_then(|sts| builders::storage_change(database, sts));

    // Build and apply. The ConfigMap goes first: the pods mount it.
    let client = &context.client;
    server_side_apply(
        client,
        &namespace,
        &builders::config_map(database, read_only),
    )
    .await?;
    server_side_apply(client, &namespace, &builders::headless_service(database)).await?;
    server_side_apply(
        client,
        &namespace,
        &builders::read_write_service(database, read_only),
    )
    .await?;
    server_side_apply(client, &namespace, &builders::read_only_service(database)).await?;
    let mut desired = builders::statefulset(database);
    if let (Some(_), Some(existing)) = (&storage_refused, &existing) {
        // Claim templates are immutable: keep the existing ones and apply the rest, so
        // replicas and version changes still go through.
        if let (Some(spec), Some(existing_spec)) = (desired.spec.as_mut(), existing.spec.as_ref()) {
            spec.volume_claim_templates = existing_spec.volume_claim_templates.clone();
        }
    }
    let statefulset = server_side_apply(client, &namespace, &desired).await?;

    // Report.
    let status = compute_status(&Observed {
        database,
        statefulset: Some(&statefulset),
        read_only,
        storage_refused: storage_refused.as_deref(),
        deleting: false,
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
    let patch = serde_json::json!({"status": status});
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

/// Removes what ownerReferences cannot: the volumes the StatefulSet created from its
/// claim templates (they are not owned by the MyDatabase).
async fn cleanup(database: &MyDatabase, context: &Context) -> Result<Action, ReconcileError> {
    let namespace = database.namespace().unwrap_or_default();
    let object = key(database);
    let deleting = compute_status(&Observed {
        database,
        statefulset: None,
        read_only: None,
        storage_refused: None,
        deleting: true,
    });
    if database.status.as_ref().and_then(|s| s.phase) != Some(DatabasePhase::Deleting) {
        let api: Api<MyDatabase> = Api::namespaced(context.client.clone(), &namespace);
        let patch = serde_json::json!({"status": {"phase": deleting.phase}});
        // Best effort: the object may already be on its way out.
        let _ = api
            .patch_status(
                &database.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await;
        context
            .publish(
                database,
                EventType::Normal,
                "Deleting",
                "deleting the database's volumes; children go with their owner".into(),
            )
            .await;
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(context.client.clone(), &namespace);
    let selector = format!("{}={}", builders::LABEL_DATABASE, database.name_any());
    claims
        .delete_collection(
            &DeleteParams::background(),
            &ListParams::default().labels(&selector),
        )
        .await
        .map_err(|source| ReconcileError::Api {
            action: "deleting the volume claims".into(),
            object: object.clone(),
            source,
        })?;
    context.record_phase(&object, None);
    Ok(Action::await_change())
}

/// The children kinds the controller watches to map changes back to their MyDatabase.
pub fn owned_kinds(
    client: &Client,
    namespace: Option<&str>,
) -> (Api<StatefulSet>, Api<Service>, Api<ConfigMap>) {
    match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client.clone()),
        ),
    }
}
