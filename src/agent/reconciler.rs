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

/// Controller tests against a mocked API server: the exact request sequences of a
/// reconcile, as kube-rs' controller-rs tests them.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MyDatabaseSpec;
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

    /// Serves requests until the reconcile ends, answering each with `answer` and
    /// recording "METHOD path" for everything but Events.
    fn serve(
        mut handle: Handle,
        answer: impl Fn(&str, &str, &serde_json::Value) -> Response<Body> + Send + 'static,
    ) -> tokio::task::JoinHandle<(Vec<String>, Vec<serde_json::Value>)> {
        tokio::spawn(async move {
            let mut calls = vec![];
            let mut events = vec![];
            while let Some((request, send)) = handle.next_request().await {
                let method = request.method().to_string();
                let path = request.uri().path().to_string();
                let query = request.uri().query().unwrap_or_default().to_string();
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
                calls.push(call);
            }
            (calls, events)
        })
    }

    fn echo(method: &str, path: &str, body: &serde_json::Value) -> Response<Body> {
        if path.ends_with("/statefulsets/orders") && body.is_null() {
            return not_found();
        }
        if method == "DELETE" && path.ends_with("/persistentvolumeclaims") {
            return json(
                StatusCode::OK,
                serde_json::json!({"kind": "PersistentVolumeClaimList", "apiVersion": "v1", "metadata": {}, "items": []}),
            );
        }
        let mut body = body.clone();
        if path.contains("/mydatabases/") {
            body = serde_json::to_value(orders(true, false)).unwrap();
        }
        json(StatusCode::OK, body)
    }

    #[tokio::test]
    async fn first_reconcile_adds_the_finalizer_and_stops() {
        let (context, handle) = context(false);
        let server = serve(handle, echo);
        let action = reconcile(Arc::new(orders(false, false)), context.clone())
            .await
            .unwrap();
        assert_eq!(action, Action::await_change());
        drop(context);
        let (calls, _) = server.await.unwrap();
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
        let (calls, events) = server.await.unwrap();
        let apply = "?&force=true&fieldManager=bulkhead-agent";
        assert_eq!(
            calls,
            [
                "GET /apis/apps/v1/namespaces/shop/statefulsets/orders".to_string(),
                format!("PATCH /api/v1/namespaces/shop/configmaps/orders-config{apply}"),
                format!("PATCH /api/v1/namespaces/shop/services/orders-headless{apply}"),
                format!("PATCH /api/v1/namespaces/shop/services/orders{apply}"),
                format!("PATCH /api/v1/namespaces/shop/services/orders-ro{apply}"),
                format!("PATCH /apis/apps/v1/namespaces/shop/statefulsets/orders{apply}"),
                "PATCH /apis/example.com/v1/namespaces/shop/mydatabases/orders/status".to_string(),
            ],
            "{calls:#?}"
        );
        let reasons: Vec<&str> = events.iter().filter_map(|e| e["reason"].as_str()).collect();
        assert!(reasons.contains(&"PhaseChanged"), "{reasons:?}");
    }

    #[tokio::test]
    async fn fenced_create_renders_read_only_children() {
        let (context, handle) = context(true);
        let bodies = Arc::new(Mutex::new(vec![]));
        let seen = bodies.clone();
        let server = serve(handle, move |method, path, body| {
            if method == "PATCH"
                && (path.ends_with("configmaps/orders-config") || path.ends_with("services/orders"))
            {
                seen.lock().unwrap().push(body.clone());
            }
            echo(method, path, body)
        });
        reconcile(Arc::new(orders(true, false)), context.clone())
            .await
            .unwrap();
        drop(context);
        server.await.unwrap();
        let bodies = bodies.lock().unwrap();
        let config = bodies[0]["data"]["postgresql.conf"].as_str().unwrap();
        assert!(
            config.contains("default_transaction_read_only = on"),
            "{config}"
        );
        assert_eq!(
            bodies[1]["spec"]["selector"][builders::LABEL_ACCEPTS_WRITES],
            "true"
        );
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
                let mut existing =
                    serde_json::to_value(builders::statefulset(&orders(true, false))).unwrap();
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
        let (calls, events) = server.await.unwrap();
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
        let mut sts = serde_json::to_value(builders::statefulset(&db)).unwrap();
        sts["metadata"]["generation"] = 1.into();
        sts["status"] = sts_status;
        let typed: StatefulSet = serde_json::from_value(sts.clone()).unwrap();
        db.status = Some(compute_status(&Observed {
            database: &db,
            statefulset: Some(&typed),
            read_only: None,
            storage_refused: None,
            deleting: false,
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
        let (calls, events) = server.await.unwrap();
        assert!(
            !calls.iter().any(|c| c.contains("/status")),
            "no status write: {calls:#?}"
        );
        assert!(events.is_empty(), "no transition, no event: {events:?}");
    }

    #[tokio::test]
    async fn deletion_removes_volumes_then_the_finalizer() {
        let (context, handle) = context(false);
        let server = serve(handle, echo);
        let action = reconcile(Arc::new(orders(true, true)), context.clone())
            .await
            .unwrap();
        assert_eq!(action, Action::await_change());
        drop(context);
        let (calls, events) = server.await.unwrap();
        assert_eq!(
            calls,
            [
                "PATCH /apis/example.com/v1/namespaces/shop/mydatabases/orders/status",
                "DELETE /api/v1/namespaces/shop/persistentvolumeclaims?&labelSelector=example.com%2Fdatabase%3Dorders",
                "PATCH /apis/example.com/v1/namespaces/shop/mydatabases/orders",
            ],
            "{calls:#?}"
        );
        assert!(events.iter().any(|e| e["reason"] == "Deleting"));
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
