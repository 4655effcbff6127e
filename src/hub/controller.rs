//! The hub's federation loop: for every template a policy selects, schedule it
//! (`scheduler`), write the binding's decision, propagate the copies to the members
//! (`propagation`), bring their status back (`aggregate`) and clean up after deleted
//! templates. Failover is the same loop: a failed member's NoExecute taint, judged
//! against failover's tolerations, changes the decision; evictions are rate limited and
//! frozen while the hub itself is cut off.
//!
//! Level-triggered: a pass runs on every change of a hub object or a member copy, and
//! every few seconds (every second while a member is unhealthy, so tolerations expire on
//! time). A pass writes only what differs from what the hub last saw or wrote.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::api::propagation_policy::ConflictResolution;
use crate::api::resource_binding::{ClusterPlacementStatus, PlacementHealth, TargetCluster};
use crate::api::{
    ANNOTATION_TEMPLATE_DELETED, ClusterPropagationPolicy, FINALIZER_CLEANUP, LABEL_MANAGED_BY,
    MemberCluster, MyDatabaseStatus, PropagationPolicy, ResourceBinding,
};
use crate::error::{ApiErrorKind, classify};
use crate::hub::HubState;
use crate::hub::aggregate::{
    CopyObservation, WAITING_FOR_PARTITION, binding_conditions, binding_rows, mydatabase_status,
    stamp_last_seen, workload_status,
};
use crate::hub::copies::{MANAGED_BY, Ownership, binding_label, ownership};
use crate::hub::copy_cache::CopyCaches;
use crate::hub::kinds::{hub_cluster_view, is_divisible, is_refused_duplicate, is_stateful};
use crate::hub::matching::{PolicyCandidate, PolicyScope};
use crate::hub::placement::ClusterView;
use crate::hub::propagation::{self, MemberCopy, Plan, PlanInput};
use crate::hub::scheduler::{
    DesiredBinding, FIELD_MANAGER as SCHEDULER_FIELD_MANAGER, TEMPLATE_KINDS, binding_name,
    desired_binding, evicted_clusters, is_excluded_namespace, resource, scheduler_status,
};
use crate::metrics::Metrics;

/// Field manager of the hub's member copies and of the binding's propagation status.
pub const FIELD_MANAGER: &str = "bulkhead-hub";

/// Conditions the propagator owns on a binding.
const PROPAGATION_CONDITIONS: [&str; 3] = ["Propagated", "Healthy", "Degraded"];

/// How long a status that is still converging (copies applied, not Ready yet) may wait
/// before it is written anyway: a burst of new templates then costs one status write per
/// binding and template once they are Ready, not one per step on the way.
const STATUS_COALESCE: Duration = Duration::from_secs(5);

/// Templates reconciled at once in a pass.
const CONCURRENCY: usize = 64;

/// Controller settings.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Bindings that may evict replicas from a failed cluster, per second.
    pub eviction_rate: f64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    cluster: String,
    verb: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    condition: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    what: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabel {
    cluster: String,
}

#[derive(Clone)]
struct ControllerMetrics {
    pass_duration: Histogram,
    hub_writes: Family<WriteLabels, Counter>,
    member_calls: Family<CallLabels, Counter>,
    propagation_latency: Histogram,
    bindings: Family<ConditionLabels, Gauge>,
    evictions: Family<ClusterLabel, Counter>,
    fenced: Gauge,
    failover_ready: Histogram,
    synced: Gauge,
    passes: Counter,
}

impl ControllerMetrics {
    fn register(metrics: &Metrics) -> Self {
        let m = ControllerMetrics {
            pass_duration: Histogram::new(exponential_buckets(0.0001, 2.0, 18)),
            hub_writes: Family::default(),
            member_calls: Family::default(),
            propagation_latency: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            bindings: Family::default(),
            evictions: Family::default(),
            fenced: Gauge::default(),
            failover_ready: Histogram::new(exponential_buckets(1.0, 1.5, 16)),
            synced: Gauge::default(),
            passes: Counter::default(),
        };
        metrics.register(
            "hub_synced",
            "1 once the hub has read every hub object and every Ready member's copies and decided over every template (a restarted hub is quiescent from here)",
            m.synced.clone(),
        );
        metrics.register(
            "scheduler_passes",
            "Passes over every template",
            m.passes.clone(),
        );
        metrics.register(
            "scheduler_pass_duration_seconds",
            "Time for one pass over every template: scheduling, propagation, status",
            m.pass_duration.clone(),
        );
        metrics.register(
            "hub_writes",
            "Writes to the hub API server, by what was written (binding, binding_status, template_status, finalizer)",
            m.hub_writes.clone(),
        );
        metrics.register(
            "member_api_calls",
            "Requests to member API servers by the propagator, by cluster, verb and result",
            m.member_calls.clone(),
        );
        metrics.register(
            "propagation_latency_seconds",
            "Time from the hub seeing a new template generation to a member copy applied",
            m.propagation_latency.clone(),
        );
        metrics.register(
            "bindings",
            "ResourceBindings by condition and status, as of the last pass",
            m.bindings.clone(),
        );
        metrics.register(
            "evictions",
            "Bindings whose replicas failover moved off a failed cluster",
            m.evictions.clone(),
        );
        metrics.register(
            "fenced_placements",
            "Stateful placements in unreachable clusters, marked fenced",
            m.fenced.clone(),
        );
        metrics.register(
            "failover_ready_seconds",
            "Time from a cluster's taint to the evicted replicas Ready elsewhere",
            m.failover_ready.clone(),
        );
        m
    }
}

/// A token bucket: evictions allowed per second, with a burst of one second's worth.
struct RateLimit {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    fn new(rate: f64) -> Self {
        RateLimit {
            rate,
            tokens: rate.max(1.0),
            last: Instant::now(),
        }
    }

    fn try_take(&mut self) -> bool {
        let now = Instant::now();
        let burst = self.rate.max(1.0);
        self.tokens =
            (self.tokens + now.duration_since(self.last).as_secs_f64() * self.rate).min(burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// What a member said to one apply or delete.
#[derive(Clone, Debug)]
enum Outcome {
    Done,
    Conflict(String),
    Failed(String),
}

/// (generation, when the hub first saw it, whether its applies have been measured).
type GenerationSeen = (Option<i64>, Instant, bool);

struct Context {
    hub: Client,
    state: HubState,
    caches: CopyCaches,
    recorder: Recorder,
    metrics: ControllerMetrics,
    evictions: Mutex<RateLimit>,
    /// Template UID -> (generation, when the hub first saw it, whether its applies have
    /// been measured).
    generations: Mutex<HashMap<String, GenerationSeen>>,
    /// Binding -> when the taint that caused its eviction was added.
    failovers: Mutex<HashMap<String, jiff::Timestamp>>,
    /// Object -> (hash of the last payload written, resourceVersion the hub saw before).
    written: Mutex<HashMap<String, (u64, Option<String>)>>,
    /// Status key -> since when a converging status has been waiting to be written.
    converging: Mutex<HashMap<String, Instant>>,
}

impl Context {
    /// True when `payload` was just written for `key` and the hub's cache has not caught
    /// up yet (same resourceVersion as before that write): writing again would be a no-op.
    fn just_written(&self, key: &str, payload: &Value, version: Option<&String>) -> bool {
        let memo = self.written.lock().unwrap_or_else(|p| p.into_inner());
        memo.get(key)
            .is_some_and(|(hash, seen)| *hash == hash_of(payload) && seen.as_ref() == version)
    }

    fn remember(&self, key: String, payload: &Value, version: Option<String>) {
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, (hash_of(payload), version));
    }

    /// Whether a status change for `key` should wait: it is still converging and has not
    /// waited [`STATUS_COALESCE`] yet.
    fn defer_status(&self, key: &str, converged: bool) -> bool {
        let mut waiting = self.converging.lock().unwrap_or_else(|p| p.into_inner());
        if converged {
            waiting.remove(key);
            return false;
        }
        let since = *waiting.entry(key.to_string()).or_insert_with(Instant::now);
        if since.elapsed() >= STATUS_COALESCE {
            waiting.remove(key);
            false
        } else {
            true
        }
    }

    fn count_write(&self, what: &str) {
        self.metrics
            .hub_writes
            .get_or_create(&WriteLabels { what: what.into() })
            .inc();
    }

    fn count_call(&self, cluster: &str, verb: &str, ok: bool) {
        self.metrics
            .member_calls
            .get_or_create(&CallLabels {
                cluster: cluster.into(),
                verb: verb.into(),
                result: if ok { "ok" } else { "error" }.into(),
            })
            .inc();
    }

    /// The same Event on the template and, when there is one, its binding.
    async fn event_both(
        &self,
        template: &k8s_openapi::api::core::v1::ObjectReference,
        binding: Option<&ResourceBinding>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.event(template, type_, reason, note.clone()).await;
        if let Some(binding) = binding {
            self.event(&binding.object_ref(&()), type_, reason, note)
                .await;
        }
    }

    async fn event(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Failover".into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, reference).await {
            tracing::debug!(%error, "cannot publish an Event");
        }
    }
}

fn hash_of(value: &Value) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    hasher.finish()
}

struct Stores {
    policies: Store<PropagationPolicy>,
    cluster_policies: Store<ClusterPropagationPolicy>,
    members: Store<MemberCluster>,
    bindings: Store<ResourceBinding>,
    templates: Vec<(ApiResource, Store<DynamicObject>)>,
}

fn is_ready<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    futures::FutureExt::now_or_never(store.wait_until_ready()).is_some_and(|ready| ready.is_ok())
}

impl Stores {
    /// Every initial list is in. Deciding before that would rewrite bindings the hub has
    /// simply not read yet (a restarted hub must be quiescent: zero writes).
    fn ready(&self) -> bool {
        is_ready(&self.policies)
            && is_ready(&self.cluster_policies)
            && is_ready(&self.members)
            && is_ready(&self.bindings)
            && self.templates.iter().all(|(_, store)| is_ready(store))
    }
}

/// The template kinds as API resources.
pub fn template_resources() -> Vec<ApiResource> {
    TEMPLATE_KINDS
        .iter()
        .map(|(group, version, kind, plural)| resource(group, version, kind, plural))
        .collect()
}

/// Runs the federation loop until shutdown.
pub async fn run(
    hub: Client,
    state: HubState,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    options: ControllerOptions,
    shutdown: CancellationToken,
) {
    let caches = CopyCaches::default();
    let kinds = template_resources();
    let cache_task = tokio::spawn(crate::hub::copy_cache::run(
        caches.clone(),
        state.registry.clone(),
        state.board.clone(),
        kinds.clone(),
        shutdown.clone(),
    ));

    let mut streams = vec![];
    macro_rules! reflect {
        ($api:expr) => {{
            let (store, writer) = reflector::store();
            streams.push(
                reflector(
                    writer,
                    watcher($api, watcher::Config::default())
                        .modify(|o| o.managed_fields_mut().clear()),
                )
                .default_backoff()
                .map(|_| ())
                .boxed(),
            );
            store
        }};
    }
    let policies = reflect!(Api::<PropagationPolicy>::all(hub.clone()));
    let cluster_policies = reflect!(Api::<ClusterPropagationPolicy>::all(hub.clone()));
    let members = reflect!(Api::<MemberCluster>::all(hub.clone()));
    let bindings = reflect!(Api::<ResourceBinding>::all(hub.clone()));
    let mut templates = vec![];
    for ar in kinds {
        let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
        let store = writer.as_reader();
        let api = Api::<DynamicObject>::all_with(hub.clone(), &ar);
        // Stores keep what the hub reads: no managedFields, no kubectl's last-applied copy
        // of the whole object (member copies drop both anyway).
        // A LIST returns built-in objects without apiVersion/kind (only watch events carry
        // them), so a restarted hub's store would hold them bare: set them here, once.
        let types = kube::api::TypeMeta {
            api_version: ar.api_version.clone(),
            kind: ar.kind.clone(),
        };
        let slim = watcher(api, watcher::Config::default()).modify(move |o: &mut DynamicObject| {
            o.types = Some(types.clone());
            o.managed_fields_mut().clear();
            o.annotations_mut()
                .remove("kubectl.kubernetes.io/last-applied-configuration");
        });
        streams.push(
            reflector(writer, slim)
                .default_backoff()
                .map(|_| ())
                .boxed(),
        );
        templates.push((ar, store));
    }
    let stores = Stores {
        policies,
        cluster_policies,
        members,
        bindings,
        templates,
    };
    let context = Arc::new(Context {
        hub,
        state: state.clone(),
        caches: caches.clone(),
        recorder,
        metrics: ControllerMetrics::register(&metrics),
        evictions: Mutex::new(RateLimit::new(options.eviction_rate)),
        generations: Mutex::default(),
        failovers: Mutex::default(),
        written: Mutex::default(),
        converging: Mutex::default(),
    });

    // The reflectors run on their own task: a store must follow its watch while a pass
    // is busy, or the pass after it decides on stale bindings and writes them again.
    let hub_changed = Arc::new(tokio::sync::Notify::new());
    let driver = {
        let hub_changed = hub_changed.clone();
        let mut changes = stream::select_all(streams);
        tokio::spawn(async move {
            while changes.next().await.is_some() {
                hub_changed.notify_one();
            }
        })
    };
    let mut health_changes = state.board.subscribe();
    let mut hub_health = state.hub_health.load_full();
    let mut interval = Duration::from_secs(5);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = hub_changed.notified() => {}
            _ = caches.changed.notified() => {}
            _ = health_changes.changed() => {}
            _ = tokio::time::sleep(interval) => {}
        }
        // Let a burst of events settle into one pass.
        tokio::time::sleep(Duration::from_millis(10)).await;
        if !stores.ready() {
            continue;
        }
        let now_health = state.hub_health.load_full();
        if now_health.frozen != hub_health.frozen {
            tracing::warn!(
                frozen = now_health.frozen,
                "hub frozen state changed: failover {}",
                if now_health.frozen {
                    "suspended"
                } else {
                    "resumed"
                }
            );
        }
        hub_health = now_health;
        let started = Instant::now();
        let unhealthy = pass(&context, &stores, hub_health.frozen).await;
        context
            .metrics
            .pass_duration
            .observe(started.elapsed().as_secs_f64());
        // Tolerations expire without any event: look every second while a member is down.
        interval = Duration::from_secs(if unhealthy { 1 } else { 5 });
    }
    driver.abort();
    let abort = cache_task.abort_handle();
    if tokio::time::timeout(2 * crate::hub::tasks::SHUTDOWN_GRACE, cache_task)
        .await
        .is_err()
    {
        abort.abort();
    }
}

/// What one template's reconcile reports for the pass's gauges.
#[derive(Default)]
struct TemplateReport {
    conditions: Vec<(String, String)>,
    fenced: i64,
}

/// One pass over every template. Returns whether a member is not Ready.
async fn pass(context: &Arc<Context>, stores: &Stores, frozen: bool) -> bool {
    let policies = stores.policies.state();
    let cluster_policies = stores.cluster_policies.state();
    let mut candidates: Vec<PolicyCandidate> = policies
        .iter()
        .map(|p| PolicyCandidate {
            scope: PolicyScope::Namespaced,
            namespace: p.metadata.namespace.as_deref(),
            name: p.metadata.name.as_deref().unwrap_or_default(),
            spec: &p.spec,
        })
        .collect();
    candidates.extend(cluster_policies.iter().map(|p| PolicyCandidate {
        scope: PolicyScope::Cluster,
        namespace: None,
        name: p.metadata.name.as_deref().unwrap_or_default(),
        spec: &p.spec.policy,
    }));
    let health = context.state.hub_health.load_full();
    let mut views: Vec<ClusterView> = stores
        .members
        .state()
        .iter()
        .filter(|m| !is_refused_duplicate(m))
        .map(|m| hub_cluster_view(m, &health))
        .collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    let now = jiff::Timestamp::now();

    let mut work = vec![];
    for (resource, store) in &stores.templates {
        for template in store.state() {
            let namespace = template.namespace().unwrap_or_default();
            if is_excluded_namespace(&namespace) {
                continue;
            }
            let existing = stores.bindings.get(
                &ObjectRef::new(&binding_name(&template.name_any(), &resource.kind))
                    .within(&namespace),
            );
            work.push(reconcile_template(
                context,
                resource,
                template,
                &candidates,
                &views,
                existing,
                frozen,
                now,
            ));
        }
    }
    let reports: Vec<TemplateReport> = stream::iter(work)
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let mut counts: BTreeMap<(String, String), i64> = BTreeMap::new();
    let mut fenced = 0;
    for report in reports {
        fenced += report.fenced;
        for key in report.conditions {
            *counts.entry(key).or_default() += 1;
        }
    }
    context.metrics.bindings.clear();
    for ((condition, status), count) in counts {
        context
            .metrics
            .bindings
            .get_or_create(&ConditionLabels { condition, status })
            .set(count);
    }
    context.metrics.fenced.set(fenced);
    release_bindings(context, stores).await;
    prune(context, stores);
    // Every initial list is in (the pass ran) and every Ready member's copies are
    // listed: from here on a restarted hub has decided over every template.
    let synced = views.iter().filter(|v| v.ready).all(|v| {
        context
            .caches
            .member(&v.name)
            .is_some_and(|c| stores.templates.iter().all(|(ar, _)| c.synced(ar)))
    });
    context.metrics.synced.set(i64::from(synced));
    context.metrics.passes.inc();
    views.iter().any(|v| !v.ready)
}

/// Removes the cleanup finalizer from bindings on their way out once nothing needs their
/// record: the template is gone, or its cleanup is done, or it is not being deleted (the
/// binding alone was deleted; the next pass writes a new one).
async fn release_bindings(context: &Context, stores: &Stores) {
    for binding in stores.bindings.state() {
        if binding.metadata.deletion_timestamp.is_none()
            || !binding.finalizers().iter().any(|f| f == FINALIZER_CLEANUP)
        {
            continue;
        }
        let resource = &binding.spec.resource;
        let namespace = binding.namespace().unwrap_or_default();
        let template = stores
            .templates
            .iter()
            .find(|(ar, _)| ar.api_version == resource.api_version && ar.kind == resource.kind)
            .and_then(|(ar, store)| {
                store.get(&ObjectRef::new_with(&resource.name, ar.clone()).within(&namespace))
            })
            .filter(|t| resource.uid.is_none() || t.metadata.uid == resource.uid);
        let needed = template.is_some_and(|t| {
            t.metadata.deletion_timestamp.is_some()
                && t.finalizers().iter().any(|f| f == FINALIZER_CLEANUP)
        });
        if needed {
            continue;
        }
        let finalizers: Vec<&String> = binding
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER_CLEANUP)
            .collect();
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": binding.resource_version()}});
        let api: Api<ResourceBinding> = Api::namespaced(context.hub.clone(), &namespace);
        match api
            .patch(
                &binding.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => context.count_write("binding_finalizer"),
            Err(error)
                if matches!(
                    classify(&error),
                    ApiErrorKind::NotFound | ApiErrorKind::Conflict
                ) => {}
            Err(error) => {
                tracing::warn!(binding = %binding.name_any(), %error, "cannot release the binding's finalizer")
            }
        }
    }
}

/// Key of a binding in [`Context::failovers`].
fn binding_key(namespace: &str, binding: &str) -> String {
    format!("{namespace}/{binding}")
}

/// Key of a binding's status in [`Context::written`] and [`Context::converging`].
fn binding_status_key(namespace: &str, binding: &str) -> String {
    format!("binding-status/{namespace}/{binding}")
}

/// Key of a template's status in [`Context::written`] and [`Context::converging`].
fn template_status_key(kind: &str, namespace: &str, name: &str) -> String {
    format!("template-status/{kind}/{namespace}/{name}")
}

/// The UIDs and map keys of every template the stores hold.
fn live_keys(
    templates: &[(ApiResource, Store<DynamicObject>)],
) -> (HashSet<String>, HashSet<String>) {
    let mut uids = HashSet::new();
    let mut keys = HashSet::new();
    for (resource, store) in templates {
        for template in store.state() {
            let namespace = template.namespace().unwrap_or_default();
            let name = template.name_any();
            if let Some(uid) = template.uid() {
                uids.insert(uid);
            }
            let binding = binding_name(&name, &resource.kind);
            keys.insert(binding_status_key(&namespace, &binding));
            keys.insert(binding_key(&namespace, &binding));
            keys.insert(template_status_key(&resource.kind, &namespace, &name));
        }
    }
    (uids, keys)
}

/// Forgets what the hub remembered about templates and bindings that are gone.
fn prune(context: &Context, stores: &Stores) {
    let (uids, keys) = live_keys(&stores.templates);
    context
        .generations
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|uid, _| uids.contains(uid));
    context
        .failovers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|key, _| keys.contains(key));
    context
        .written
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|key, _| keys.contains(key));
    context
        .converging
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|key, _| keys.contains(key));
}

#[allow(clippy::too_many_arguments)]
async fn reconcile_template(
    context: &Arc<Context>,
    resource: &ApiResource,
    template: Arc<DynamicObject>,
    candidates: &[PolicyCandidate<'_>],
    views: &[ClusterView],
    existing: Option<Arc<ResourceBinding>>,
    frozen: bool,
    now: jiff::Timestamp,
) -> TemplateReport {
    let namespace = template.namespace().unwrap_or_default();
    let name = template.name_any();
    let key = binding_key(&namespace, &binding_name(&name, &resource.kind));
    let has_finalizer = template.finalizers().iter().any(|f| f == FINALIZER_CLEANUP);

    if template.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return TemplateReport::default();
        }
        let targets = existing
            .as_ref()
            .map(|b| b.spec.clusters.clone())
            .unwrap_or_default();
        let job = Propagation {
            resource,
            template: &template,
            binding: existing.as_deref(),
            targets: &targets,
            deleting: true,
            resolution: ConflictResolution::Abort,
            fence: false,
            views,
            now,
        };
        let (plan, report) = propagate(context, &job).await;
        if plan.cleanup_done {
            set_finalizer(context, resource, &template, false).await;
        }
        return report;
    }

    note_generation(context, &template);
    let Some(mut desired) = desired_binding(
        &template,
        resource,
        candidates,
        views,
        existing.as_deref(),
        frozen,
        now,
    ) else {
        return TemplateReport::default();
    };

    // Failover: replicas leaving a cluster that is not Ready are an eviction.
    let old_targets = existing
        .as_ref()
        .map(|b| b.spec.clusters.as_slice())
        .unwrap_or(&[]);
    let evicted = evicted_clusters(old_targets, &desired.spec.clusters, views);
    if !evicted.is_empty() {
        let allowed = context
            .evictions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .try_take();
        if !allowed {
            tracing::info!(binding = %key, "eviction rate limit reached; keeping the placement for now");
            desired.spec.clusters = old_targets.to_vec();
            return propagate_existing(
                context,
                resource,
                &template,
                existing.as_deref(),
                views,
                now,
                &desired,
            )
            .await;
        }
    }

    match write_binding(&context.hub, &desired, existing.as_deref()).await {
        Ok(true) => context.count_write("binding"),
        Ok(false) => {}
        Err(error) => {
            tracing::warn!(binding = %key, %error, "cannot write the ResourceBinding");
            return TemplateReport::default();
        }
    }
    if !evicted.is_empty() {
        let placement: Vec<String> = desired
            .spec
            .clusters
            .iter()
            .map(|t| format!("{}={}", t.name, t.replicas))
            .collect();
        for (cluster, moved) in &evicted {
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
            tracing::warn!(binding = %key, %note, "evicted");
            context
                .event_both(
                    &template.object_ref(resource),
                    existing.as_deref(),
                    EventType::Warning,
                    "Evicted",
                    note,
                )
                .await;
            if let Some(added) = views.iter().find(|v| &v.name == cluster).and_then(|v| {
                v.taints
                    .iter()
                    .filter(|t| crate::hub::taints::is_hub_taint(t))
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
    // No copy goes out before the finalizer that guarantees its cleanup is in place.
    if !has_finalizer && !set_finalizer(context, resource, &template, true).await {
        return TemplateReport::default();
    }
    propagate_existing(
        context,
        resource,
        &template,
        existing.as_deref(),
        views,
        now,
        &desired,
    )
    .await
}

async fn propagate_existing(
    context: &Arc<Context>,
    resource: &ApiResource,
    template: &DynamicObject,
    existing: Option<&ResourceBinding>,
    views: &[ClusterView],
    now: jiff::Timestamp,
    desired: &DesiredBinding,
) -> TemplateReport {
    let job = Propagation {
        resource,
        template,
        binding: existing,
        targets: &desired.spec.clusters,
        deleting: false,
        resolution: desired.conflict_resolution,
        fence: desired.fence,
        views,
        now,
    };
    propagate(context, &job).await.1
}

/// Writes the decision when it differs from `existing`: spec and the scheduler's part of
/// the status in one server-side apply (field manager `bulkhead-hub-scheduler`). Returns whether
/// it wrote.
pub async fn write_binding(
    hub: &Client,
    desired: &DesiredBinding,
    existing: Option<&ResourceBinding>,
) -> Result<bool, kube::Error> {
    let unchanged = existing.is_some_and(|b| {
        b.spec == desired.spec
            && scheduler_status(b.status.as_ref()) == desired.status
            && b.finalizers().iter().any(|f| f == FINALIZER_CLEANUP)
    });
    if unchanged {
        return Ok(false);
    }
    let api: Api<ResourceBinding> = Api::namespaced(hub.clone(), &desired.namespace);
    let mut binding = ResourceBinding::new(&desired.name, desired.spec.clone());
    binding.metadata.namespace = Some(desired.namespace.clone());
    binding.metadata.owner_references = Some(vec![desired.owner.clone()]);
    // The binding records the clusters that still hold a copy to clean up; it must
    // outlive a template deleted with `--cascade=foreground` (the garbage collector then
    // deletes the binding first). The hub releases it once the cleanup is done.
    binding.metadata.finalizers = Some(vec![FINALIZER_CLEANUP.to_string()]);
    binding.metadata.labels = Some(BTreeMap::from([(
        crate::api::LABEL_MANAGED_BY.to_string(),
        "bulkhead".to_string(),
    )]));
    binding.status = Some(desired.status.clone());
    api.patch(
        &desired.name,
        &PatchParams::apply(SCHEDULER_FIELD_MANAGER).force(),
        &Patch::Apply(&binding),
    )
    .await?;
    Ok(true)
}

/// Adds or removes the cleanup finalizer, guarded by the resourceVersion. Returns whether
/// the template now has it as wanted.
async fn set_finalizer(
    context: &Context,
    resource: &ApiResource,
    template: &DynamicObject,
    present: bool,
) -> bool {
    let mut finalizers: Vec<String> = template
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER_CLEANUP)
        .cloned()
        .collect();
    if present {
        finalizers.push(FINALIZER_CLEANUP.into());
    }
    let api = Api::<DynamicObject>::namespaced_with(
        context.hub.clone(),
        &template.namespace().unwrap_or_default(),
        resource,
    );
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": template.resource_version()}});
    match api
        .patch(
            &template.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            context.count_write("finalizer");
            true
        }
        Err(error) if classify(&error) == ApiErrorKind::Conflict => false,
        Err(error) if classify(&error) == ApiErrorKind::NotFound => false,
        Err(error) => {
            tracing::warn!(
                template = %format!("{}/{}", template.namespace().unwrap_or_default(), template.name_any()),
                %error,
                "cannot update the template's finalizers"
            );
            false
        }
    }
}

struct Propagation<'a> {
    resource: &'a ApiResource,
    template: &'a DynamicObject,
    binding: Option<&'a ResourceBinding>,
    targets: &'a [TargetCluster],
    deleting: bool,
    resolution: ConflictResolution,
    fence: bool,
    views: &'a [ClusterView],
    now: jiff::Timestamp,
}

/// Plans and executes one template's propagation, then writes the status it leads to.
async fn propagate(context: &Arc<Context>, job: &Propagation<'_>) -> (Plan, TemplateReport) {
    let namespace = job.template.namespace().unwrap_or_default();
    let name = job.template.name_any();
    let label = binding_label(&namespace, &name);
    let template_value = serde_json::to_value(job.template).unwrap_or_default();

    // What the hub knows of each member.
    let known: Vec<(String, bool, bool, Option<Arc<DynamicObject>>)> = job
        .views
        .iter()
        .map(|view| {
            let cache = context.caches.member(&view.name);
            let synced = cache.as_ref().is_some_and(|c| c.synced(job.resource));
            let copy = cache.and_then(|c| c.get(job.resource, &namespace, &name));
            (view.name.clone(), view.ready, synced, copy)
        })
        .collect();
    let members: Vec<MemberCopy<'_>> = known
        .iter()
        .map(|(cluster, reachable, synced, copy)| MemberCopy {
            cluster,
            reachable: *reachable,
            synced: *synced,
            copy: copy.as_deref(),
        })
        .collect();
    let previous_rows: &[ClusterPlacementStatus] = job
        .binding
        .and_then(|b| b.status.as_ref())
        .map(|s| s.clusters.as_slice())
        .unwrap_or(&[]);
    let pending: Vec<String> = previous_rows
        .iter()
        .filter(|r| r.pending_cleanup)
        .map(|r| r.name.clone())
        .collect();
    let previous: &[TargetCluster] = job.binding.map_or(&[], |b| b.spec.clusters.as_slice());
    let plan = propagation::plan(&PlanInput {
        template: &template_value,
        binding: &label,
        divisible: is_divisible(&job.resource.api_version, &job.resource.kind),
        stateful: is_stateful(&job.resource.api_version, &job.resource.kind),
        previous,
        targets: job.targets,
        deleting: job.deleting,
        members: &members,
        pending: &pending,
    });

    // Execute: every apply and delete at once (each member client bounds its requests).
    let (namespace, name) = (namespace.as_str(), name.as_str());
    let applies = plan.applies.iter().map(|apply| async move {
        let outcome = apply_copy(
            context,
            job.resource,
            namespace,
            name,
            apply,
            job.resolution,
        )
        .await;
        (apply.cluster.clone(), outcome)
    });
    let deletes = plan.deletes.iter().map(|delete| async move {
        let outcome = delete_copy(context, job.resource, namespace, name, delete).await;
        (delete.cluster.clone(), outcome)
    });
    let mut outcomes: HashMap<String, Outcome> = futures::future::join_all(applies)
        .await
        .into_iter()
        .collect();
    outcomes.extend(futures::future::join_all(deletes).await);
    let applied = plan
        .applies
        .iter()
        .filter(|a| matches!(outcomes.get(&a.cluster), Some(Outcome::Done)))
        .count();
    if applied > 0 {
        observe_latency(context, job.template, applied);
    }

    // Status: skipped until every reachable placed cluster has been listed, so a
    // restarted hub does not rewrite rows it simply has not read yet.
    let unsynced = members
        .iter()
        .any(|m| m.reachable && !m.synced && job.targets.iter().any(|t| t.name == m.cluster));
    if unsynced {
        return (plan, TemplateReport::default());
    }
    let report = write_status(context, job, &plan, &members, &outcomes, previous_rows).await;
    (plan, report)
}

/// Observes the propagation latency of the template's current generation, once per
/// member copy applied for it (later re-applies, e.g. drift repair, do not count).
fn observe_latency(context: &Context, template: &DynamicObject, applied: usize) {
    let uid = template.uid().unwrap_or_default();
    let mut generations = context
        .generations
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some((_, seen, measured)) = generations.get_mut(&uid)
        && !*measured
    {
        let seconds = seen.elapsed().as_secs_f64();
        for _ in 0..applied {
            context.metrics.propagation_latency.observe(seconds);
        }
        *measured = true;
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
        generations.insert(uid, (generation, Instant::now(), false));
    }
}

async fn write_status(
    context: &Arc<Context>,
    job: &Propagation<'_>,
    plan: &Plan,
    members: &[MemberCopy<'_>],
    outcomes: &HashMap<String, Outcome>,
    previous_rows: &[ClusterPlacementStatus],
) -> TemplateReport {
    let generation = job.template.metadata.generation;
    let mut observations: Vec<CopyObservation> = job
        .targets
        .iter()
        .map(|target| {
            let member = members.iter().find(|m| m.cluster == target.name);
            let reachable = member.is_some_and(|m| m.reachable);
            let copy = member.and_then(|m| m.copy);
            let previous = previous_rows.iter().find(|r| r.name == target.name);
            let applied = if reachable {
                match outcomes.get(&target.name) {
                    Some(Outcome::Done) => true,
                    Some(_) => false,
                    None => {
                        copy.is_some() && !plan.applies.iter().any(|a| a.cluster == target.name)
                    }
                }
            } else {
                previous.is_some_and(|p| p.applied)
            };
            let message = match outcomes.get(&target.name) {
                Some(Outcome::Conflict(message)) | Some(Outcome::Failed(message)) => Some(message.clone()),
                _ if job.fence && !reachable => Some(
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
                fenced: job.fence && !reachable,
                message,
                present: copy.is_some(),
                reports_readiness: is_divisible(&job.resource.api_version, &job.resource.kind),
            }
        })
        .collect();
    // Converged: every reachable placement is Ready, or says why it is not (a conflict,
    // an error, make-before-break). Only a status on its way there may wait.
    let converged = job.deleting
        || observations.iter().all(|o| {
            !o.reachable
                || o.message.is_some()
                || crate::hub::aggregate::placement_health(o) == PlacementHealth::Healthy
        });
    let mut rows = binding_rows(&observations, &plan.pending_cleanup);
    for row in rows.iter_mut().filter(|r| r.pending_cleanup) {
        if let Some(note) = plan.notes.get(&row.name) {
            row.message = Some(note.clone());
        }
    }
    let now = Time(job.now);
    let reachable = |cluster: &str| members.iter().any(|m| m.cluster == cluster && m.reachable);
    stamp_last_seen(&mut rows, previous_rows, reachable, &now);
    for observation in observations.iter_mut() {
        observation.last_seen = rows
            .iter()
            .find(|r| r.name == observation.cluster)
            .and_then(|r| r.last_seen.clone());
    }
    let previous_conditions: Vec<Condition> = job
        .binding
        .and_then(|b| b.status.as_ref())
        .map(|s| {
            s.conditions
                .iter()
                .filter(|c| PROPAGATION_CONDITIONS.contains(&c.type_.as_str()))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let mut conditions = previous_conditions.clone();
    binding_conditions(
        &mut conditions,
        &observations,
        &rows,
        &plan.waiting_for,
        generation,
    );

    let mut report = TemplateReport {
        conditions: conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone()))
            .collect(),
        fenced: rows.iter().filter(|r| r.fenced).count() as i64,
    };
    let namespace = job.template.namespace().unwrap_or_default();
    let was_waiting = previous_conditions
        .iter()
        .any(|c| c.type_ == "Propagated" && c.reason == WAITING_FOR_PARTITION);
    if !plan.waiting_for.is_empty() && !was_waiting {
        let note = format!(
            "placement change waits for the partition to heal: {} not Ready; the copies in {} are kept as they are (nothing is deleted or shrunk) until then",
            plan.waiting_for.join(", "),
            plan.held.join(", ")
        );
        tracing::warn!(template = %job.template.name_any(), %note, "waiting for partition");
        context
            .event_both(
                &job.template.object_ref(job.resource),
                job.binding,
                EventType::Warning,
                WAITING_FOR_PARTITION,
                note,
            )
            .await;
    } else if plan.waiting_for.is_empty() && was_waiting {
        context
            .event_both(
                &job.template.object_ref(job.resource),
                job.binding,
                EventType::Normal,
                "PartitionHealed",
                "every cluster of the placement is Ready again: the waiting placement change goes ahead (make-before-break)".into(),
            )
            .await;
    }
    if let Some(binding) = job.binding {
        let key = binding_status_key(&namespace, &binding.name_any());
        // Newly fenced placements get an Event.
        for row in rows.iter().filter(|r| r.fenced) {
            if !previous_rows.iter().any(|p| p.name == row.name && p.fenced) {
                let note = format!(
                    "{} is unreachable: its {} placement stays where its data is and is assumed fenced read-only by the member's agent",
                    row.name, job.resource.kind
                );
                context
                    .event_both(
                        &job.template.object_ref(job.resource),
                        Some(binding),
                        EventType::Warning,
                        "Fenced",
                        note,
                    )
                    .await;
            }
        }
        for row in previous_rows.iter().filter(|p| p.fenced) {
            if rows.iter().any(|r| r.name == row.name && !r.fenced) {
                let note = format!(
                    "{} is reachable again: its {} placement is no longer assumed fenced (the agent lifts the fence once the hub's lease is fresh again)",
                    row.name, job.resource.kind
                );
                context
                    .event_both(
                        &job.template.object_ref(job.resource),
                        Some(binding),
                        EventType::Normal,
                        "Unfenced",
                        note,
                    )
                    .await;
            }
        }
        // Entering or leaving the partition freeze is news a user waits for: never
        // coalesced.
        let waiting_changed = was_waiting == plan.waiting_for.is_empty();
        if (rows != previous_rows || conditions != previous_conditions)
            && (waiting_changed || !context.defer_status(&key, converged))
        {
            let payload = json!({
                "apiVersion": "federation.example.com/v1alpha1",
                "kind": "ResourceBinding",
                "metadata": {"name": binding.name_any(), "namespace": namespace},
                "status": {"clusters": rows, "conditions": conditions},
            });
            if !context.just_written(&key, &payload, binding.metadata.resource_version.as_ref()) {
                let api: Api<ResourceBinding> = Api::namespaced(context.hub.clone(), &namespace);
                match api
                    .patch(
                        &binding.name_any(),
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(&payload),
                    )
                    .await
                {
                    Ok(_) => {
                        context.count_write("binding_status");
                        context.remember(key, &payload, binding.metadata.resource_version.clone());
                    }
                    Err(error) => {
                        tracing::warn!(binding = %binding.name_any(), %error, "cannot write the binding's status")
                    }
                }
            }
        }
        // Time from taint to the evicted replicas Ready elsewhere.
        let healthy = conditions
            .iter()
            .any(|c| c.type_ == "Healthy" && c.status == "True");
        let binding_key = binding_key(&namespace, &binding.name_any());
        let tainted = if healthy {
            context
                .failovers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&binding_key)
        } else {
            None
        };
        if let Some(tainted) = tainted {
            let seconds = (job.now.as_millisecond() - tainted.as_millisecond()) as f64 / 1000.0;
            tracing::info!(binding = %binding_key, seconds, "evicted replicas Ready elsewhere");
            context.metrics.failover_ready.observe(seconds.max(0.0));
            context
                .event(
                    &binding.object_ref(&()),
                    EventType::Normal,
                    "FailoverComplete",
                    format!(
                        "evicted replicas Ready elsewhere {seconds:.1}s after the cluster's taint"
                    ),
                )
                .await;
        }
    }
    write_template_status(context, job, &observations, converged).await;
    if job.deleting {
        report.conditions.clear();
    }
    report
}

async fn write_template_status(
    context: &Context,
    job: &Propagation<'_>,
    observations: &[CopyObservation],
    converged: bool,
) {
    let generation = job.template.metadata.generation;
    let desired: i32 = job.targets.iter().map(|t| t.replicas).sum();
    let previous = &job.template.data["status"];
    let status = match (job.resource.group.as_str(), job.resource.kind.as_str()) {
        ("example.com", "MyDatabase") => {
            let previous: Option<MyDatabaseStatus> = serde_json::from_value(previous.clone()).ok();
            let status = mydatabase_status(
                previous.as_ref(),
                observations,
                desired,
                generation,
                job.deleting,
            );
            serde_json::to_value(status).unwrap_or_default()
        }
        ("apps", "Deployment") | ("apps", "StatefulSet") if !job.deleting => {
            workload_status(previous, observations, desired, generation)
        }
        _ => return,
    };
    if crate::hub::copies::already_matches(&status, previous) {
        return;
    }
    let namespace = job.template.namespace().unwrap_or_default();
    let key = template_status_key(&job.resource.kind, &namespace, &job.template.name_any());
    let payload = json!({"status": status});
    if context.defer_status(&key, converged) {
        return;
    }
    if context.just_written(
        &key,
        &payload,
        job.template.metadata.resource_version.as_ref(),
    ) {
        return;
    }
    let api = Api::<DynamicObject>::namespaced_with(context.hub.clone(), &namespace, job.resource);
    match api
        .patch_status(
            &job.template.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&payload),
        )
        .await
    {
        Ok(_) => {
            context.count_write("template_status");
            context.remember(
                key,
                &payload,
                job.template.metadata.resource_version.clone(),
            );
        }
        Err(error) if classify(&error) == ApiErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(template = %job.template.name_any(), %error, "cannot write the template's status")
        }
    }
}

fn member_api(
    context: &Context,
    cluster: &str,
    namespace: &str,
    resource: &ApiResource,
) -> Option<Api<DynamicObject>> {
    let handle = context.state.registry.get(cluster)?;
    let client = handle.client()?.clone();
    Some(Api::namespaced_with(client, namespace, resource))
}

/// Applies one copy: checks for an unmanaged object first when the hub has not seen a
/// copy there, creates the namespace on demand.
async fn apply_copy(
    context: &Context,
    resource: &ApiResource,
    namespace: &str,
    name: &str,
    apply: &propagation::Apply,
    resolution: ConflictResolution,
) -> Outcome {
    let cluster = apply.cluster.as_str();
    let Some(api) = member_api(context, cluster, namespace, resource) else {
        return Outcome::Failed(format!("no credentials for {cluster}"));
    };
    if apply.check_conflict {
        let found = api.get_opt(name).await;
        context.count_call(cluster, "get", found.is_ok());
        match found {
            Ok(Some(object)) => {
                let value = serde_json::to_value(&object).unwrap_or_default();
                match ownership(Some(&value), resolution, cluster) {
                    Ownership::Conflict(message) => return Outcome::Conflict(message),
                    Ownership::TakeOver => {
                        tracing::info!(cluster, namespace, name, kind = %resource.kind, "taking over an unmanaged object (conflictResolution: Overwrite)");
                    }
                    Ownership::Apply => {}
                }
            }
            Ok(None) => {}
            Err(error) => {
                return Outcome::Failed(format!("cannot read the copy in {cluster}: {error}"));
            }
        }
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut result = api.patch(name, &params, &Patch::Apply(&apply.object)).await;
    if let Err(error) = &result
        && classify(error) == ApiErrorKind::NotFound
        && ensure_namespace(context, cluster, namespace).await
    {
        result = api.patch(name, &params, &Patch::Apply(&apply.object)).await;
    }
    context.count_call(cluster, "apply", result.is_ok());
    match result {
        Ok(_) => Outcome::Done,
        Err(error) => {
            tracing::warn!(cluster, namespace, name, kind = %resource.kind, error = %short(&error), "cannot apply the copy");
            Outcome::Failed(format!("apply failed in {cluster}: {}", short(&error)))
        }
    }
}

/// Creates the namespace in the member (create, not apply: the hub may create
/// namespaces but never changes one it did not make).
async fn ensure_namespace(context: &Context, cluster: &str, namespace: &str) -> bool {
    let Some(client) = context
        .state
        .registry
        .get(cluster)
        .and_then(|h| h.client().cloned())
    else {
        return false;
    };
    let api: Api<Namespace> = Api::all(client);
    let object = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                LABEL_MANAGED_BY.to_string(),
                MANAGED_BY.to_string(),
            )])),
            ..Default::default()
        },
        ..Default::default()
    };
    let result = api.create(&kube::api::PostParams::default(), &object).await;
    let ok = match &result {
        Ok(_) => true,
        Err(error) => classify(error) == ApiErrorKind::Conflict,
    };
    context.count_call(cluster, "create_namespace", ok);
    if let Err(error) = &result
        && !ok
    {
        tracing::warn!(cluster, namespace, error = %short(error), "cannot create the namespace");
    }
    ok
}

/// An API error's message without the whole Status dump.
fn short(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

async fn delete_copy(
    context: &Context,
    resource: &ApiResource,
    namespace: &str,
    name: &str,
    delete: &propagation::Delete,
) -> Outcome {
    let cluster = delete.cluster.as_str();
    let Some(api) = member_api(context, cluster, namespace, resource) else {
        return Outcome::Failed(format!("no credentials for {cluster}"));
    };
    if delete.template_deleted && is_stateful(&resource.api_version, &resource.kind) {
        // The user deleted the template: say so on the copy, so its agent may apply
        // `reclaimPolicy: Delete`. A copy deleted without this mark keeps its volumes.
        let mark = json!({"metadata": {"annotations": {ANNOTATION_TEMPLATE_DELETED: "true"}}});
        let marked = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&mark))
            .await;
        context.count_call(cluster, "mark_deleted", marked.is_ok());
        match marked {
            Ok(_) => {}
            Err(error) if classify(&error) == ApiErrorKind::NotFound => return Outcome::Done,
            Err(error) => {
                return Outcome::Failed(format!(
                    "cannot mark the copy in {cluster} as deleted by the user: {}",
                    short(&error)
                ));
            }
        }
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: delete.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    let result = api.delete(name, &params).await;
    context.count_call(cluster, "delete", result.is_ok());
    match result {
        Ok(_) => {
            tracing::info!(cluster, namespace, name, kind = %resource.kind, "deleted the copy");
            Outcome::Done
        }
        Err(error)
            if matches!(
                classify(&error),
                ApiErrorKind::NotFound | ApiErrorKind::Conflict
            ) =>
        {
            Outcome::Done
        }
        Err(error) => Outcome::Failed(format!("delete failed in {cluster}: {}", short(&error))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maps_keep_live_templates_and_forget_deleted_ones() {
        let deployments =
            crate::hub::scheduler::resource("apps", "v1", "Deployment", "deployments");
        let mut writer = reflector::store::Writer::<DynamicObject>::new(deployments.clone());
        let web: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-web"}
        }))
        .unwrap();
        writer.apply_watcher_event(&watcher::Event::Apply(web));
        let templates = vec![(deployments, writer.as_reader())];
        let (uids, keys) = live_keys(&templates);
        assert!(uids.contains("u-web") && !uids.contains("u-gone"));
        let binding = binding_name("web", "Deployment");
        for key in [
            binding_key("shop", &binding),
            binding_status_key("shop", &binding),
            template_status_key("Deployment", "shop", "web"),
        ] {
            assert!(keys.contains(&key), "{key}");
        }
        assert!(!keys.contains(&binding_status_key("shop", "gone-deployment")));
        assert!(!keys.contains(&template_status_key("Deployment", "other", "web")));
    }
}
