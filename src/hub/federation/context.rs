//! What every step of the federation controller shares: the hub's stores, the member
//! writers, metrics, and the little the hub remembers per template between reconciles.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{ApiResource, DynamicObject};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::api::propagation_policy::StaticClusterWeight;
use crate::api::{
    ClusterOverridePolicy, ClusterPropagationPolicy, MemberCluster, OverridePolicy,
    PropagationPolicy, ResourceBinding,
};
use crate::hub::HubState;
use crate::hub::federation::copy_cache::{CopyCaches, Kinds};
use crate::hub::federation::interpreter::Interpretation;
use crate::hub::federation::kinds::{hub_cluster_view, is_refused_duplicate};
use crate::hub::federation::matching::{PolicyCandidate, PolicyScope};
use crate::hub::federation::packing::{Packed, Packer};
use crate::hub::federation::placement::{ClusterView, StaticWeights};
use crate::hub::federation::queue::WorkQueue;
use crate::hub::federation::text_store::TextStore;
use crate::hub::federation::writer::{ObjectKey, Writers};
use crate::hub::membership::zones::HubHealth;
use crate::metrics::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CallLabels {
    pub cluster: String,
    pub verb: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CallVerbLabels {
    pub cluster: String,
    pub verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ConditionLabels {
    pub condition: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct WriteLabels {
    pub what: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ClusterLabel {
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RolloutLabels {
    pub namespace: String,
    pub template: String,
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabel {
    pub result: String,
}

#[derive(Clone)]
pub struct ControllerMetrics {
    pub(super) reconcile_duration: Histogram,
    pub(super) reconciles: Counter,
    pub(super) hub_writes: Family<WriteLabels, Counter>,
    pub(super) member_calls: Family<CallLabels, Counter>,
    pub(super) member_call_duration: Family<CallVerbLabels, Histogram>,
    pub(super) propagation_latency: Histogram,
    pub(super) bindings: Family<ConditionLabels, Gauge>,
    pub(super) evictions: Family<ClusterLabel, Counter>,
    pub(super) fenced: Gauge,
    pub(super) failover_ready: Histogram,
    pub(super) synced: Gauge,
    pub(super) queue_depth: Gauge,
    pub(super) pending_writes: Gauge,
    pub(super) orphan_copies: Family<ClusterLabel, Gauge>,
    pub(super) rollout_phase: Family<RolloutLabels, Gauge>,
    pub(super) rollout_measurements: Family<ResultLabel, Counter>,
    pub(super) rollback_seconds: Histogram,
}

impl ControllerMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        let m = ControllerMetrics {
            reconcile_duration: Histogram::new(exponential_buckets(0.00005, 2.0, 18)),
            reconciles: Counter::default(),
            hub_writes: Family::default(),
            member_calls: Family::default(),
            member_call_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.002, 2.0, 14))
            }),
            propagation_latency: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            bindings: Family::default(),
            evictions: Family::default(),
            fenced: Gauge::default(),
            failover_ready: Histogram::new(exponential_buckets(1.0, 1.5, 16)),
            synced: Gauge::default(),
            queue_depth: Gauge::default(),
            pending_writes: Gauge::default(),
            orphan_copies: Family::default(),
            rollout_phase: Family::default(),
            rollout_measurements: Family::default(),
            rollback_seconds: Histogram::new(exponential_buckets(1.0, 1.5, 16)),
        };
        metrics.register(
            "rollout_phase",
            "1 for the phase each template's rollout is in (templates whose policy has spec.rollout), by namespace, template (<kind>/<name>) and phase",
            m.rollout_phase.clone(),
        );
        metrics.register(
            "rollout_analysis_measurements",
            "Rollout analysis measurements taken, by result (passed, failed)",
            m.rollout_measurements.clone(),
        );
        metrics.register(
            "rollout_rollback_seconds",
            "Time from a rollout's failure (or abort) to every wave back on the stable revision",
            m.rollback_seconds.clone(),
        );
        metrics.register(
            "hub_orphan_copies",
            "Copies in a member that carry the hub's labels while no template or binding on the hub names them, as the last resync found them",
            m.orphan_copies.clone(),
        );
        metrics.register(
            "hub_synced",
            "1 once the hub has read every hub object and every Ready member's copies and reconciled every template once (a restarted hub is quiescent from here)",
            m.synced.clone(),
        );
        metrics.register(
            "hub_queue_depth",
            "Templates waiting to be reconciled, being reconciled, or scheduled to be reconciled later (a status waiting for its copies, a toleration expiring), plus policy status computations and writes due",
            m.queue_depth.clone(),
        );
        metrics.register(
            "hub_pending_member_writes",
            "Member copies waiting to be applied or deleted, or being written",
            m.pending_writes.clone(),
        );
        metrics.register(
            "federation_reconciles",
            "Template reconciles",
            m.reconciles.clone(),
        );
        metrics.register(
            "federation_reconcile_duration_seconds",
            "Time for one template's reconcile: scheduling, the binding, handing copies to the member writers, status",
            m.reconcile_duration.clone(),
        );
        metrics.register(
            "hub_writes",
            "Writes to the hub API server, by what was written (binding, binding_status, template_status, finalizer, binding_finalizer)",
            m.hub_writes.clone(),
        );
        metrics.register(
            "member_api_calls",
            "Requests to member API servers by the member writers, by cluster, verb and result",
            m.member_calls.clone(),
        );
        metrics.register(
            "member_api_call_duration_seconds",
            "Duration of the member writers' requests to member API servers, from sending to the answer, by cluster and verb",
            m.member_call_duration.clone(),
        );
        metrics.register(
            "propagation_latency_seconds",
            "Time from the hub seeing a new template generation to a member copy applied",
            m.propagation_latency.clone(),
        );
        metrics.register(
            "bindings",
            "ResourceBindings by condition and status",
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
pub(super) struct RateLimit {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    pub fn new(rate: f64) -> Self {
        RateLimit {
            rate,
            tokens: rate.max(1.0),
            last: Instant::now(),
        }
    }

    pub fn try_take(&mut self) -> bool {
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

/// The hub's stores, one per kind it reads.
pub(super) struct Stores {
    pub policies: Store<PropagationPolicy>,
    pub cluster_policies: Store<ClusterPropagationPolicy>,
    pub override_policies: Store<OverridePolicy>,
    pub cluster_override_policies: Store<ClusterOverridePolicy>,
    pub members: Store<MemberCluster>,
    /// Bindings and templates are many (one each per template): kept as text.
    pub bindings: TextStore<ResourceBinding>,
    /// By kind index (the order of `Context::kinds`).
    pub templates: Vec<TextStore<DynamicObject>>,
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
    pub fn ready(&self) -> bool {
        is_ready(&self.policies)
            && is_ready(&self.cluster_policies)
            && is_ready(&self.override_policies)
            && is_ready(&self.cluster_override_policies)
            && is_ready(&self.members)
            && self.bindings.ready()
            && self.templates.iter().all(TextStore::ready)
    }
}

/// What one template's reconcile reports for the gauges.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct TemplateReport {
    pub conditions: Vec<(String, String)>,
    pub fenced: i64,
}

/// Every template's last report, and how many report each (condition, status). A
/// report keeps its (condition, status) pairs as indexes into `pairs`: the same few
/// pairs repeat in every template's report, and as strings they were about 450 bytes a
/// template.
#[derive(Default)]
pub(super) struct Reports {
    by_template: HashMap<ObjectKey, StoredReport>,
    /// Every (condition, status) pair seen, by index, with how many reports hold it.
    pairs: Vec<((String, String), i64)>,
    index: HashMap<(String, String), u16>,
}

#[derive(PartialEq)]
struct StoredReport {
    conditions: Box<[u16]>,
    fenced: i64,
}

impl Reports {
    fn intern(&mut self, pair: (String, String)) -> u16 {
        if let Some(index) = self.index.get(&pair) {
            return *index;
        }
        let index = u16::try_from(self.pairs.len()).unwrap_or(u16::MAX);
        if index < u16::MAX {
            self.pairs.push((pair.clone(), 0));
            self.index.insert(pair, index);
        }
        index
    }

    /// Replaces `key`'s report; returns the change of the fenced count, or None when
    /// nothing changed.
    fn replace(&mut self, key: &ObjectKey, report: Option<TemplateReport>) -> Option<i64> {
        let new = report.map(|r| StoredReport {
            conditions: r.conditions.into_iter().map(|p| self.intern(p)).collect(),
            fenced: r.fenced,
        });
        if self.by_template.get(key) == new.as_ref() {
            return None;
        }
        let mut fenced_change = 0;
        let old = match new {
            Some(new) => {
                fenced_change += new.fenced;
                self.count(&new.conditions, 1);
                self.by_template.insert(key.clone(), new)
            }
            None => self.by_template.remove(key),
        };
        if let Some(old) = old {
            fenced_change -= old.fenced;
            self.count(&old.conditions, -1);
        }
        Some(fenced_change)
    }

    fn count(&mut self, conditions: &[u16], by: i64) {
        for index in conditions {
            if let Some((_, count)) = self.pairs.get_mut(usize::from(*index)) {
                *count += by;
            }
        }
    }
}

/// (generation, when the hub first saw it, whether its applies have been measured).
pub(super) type GenerationSeen = (Option<i64>, Instant, bool);

pub(super) struct Context {
    pub hub: Client,
    pub state: HubState,
    pub caches: CopyCaches,
    pub writers: Writers,
    pub recorder: Recorder,
    pub metrics: ControllerMetrics,
    /// The template kinds and how each is read, by kind index.
    pub kinds: Kinds,
    pub stores: Stores,
    pub bodies: Bodies,
    pub queue: WorkQueue<ObjectKey>,
    pub evictions: Mutex<RateLimit>,
    /// Template UID -> (generation, when the hub first saw it, whether its applies have
    /// been measured).
    pub generations: Mutex<HashMap<String, GenerationSeen>>,
    /// Template -> when the taint that caused its eviction was added.
    pub failovers: Mutex<HashMap<ObjectKey, jiff::Timestamp>>,
    /// Status key -> a status on its way: since when it waits, and how often it was
    /// written before it converged.
    pub converging: Mutex<HashMap<String, Converging>>,
    /// What the hub API server returned to the hub's last binding write, until the
    /// binding store has caught up with it.
    pub written_bindings: Written<ResourceBinding>,
    /// The same for templates (finalizer and status writes).
    pub written_templates: Written<DynamicObject>,
    /// The last report of every template, and their sums (the gauges).
    pub reports: Mutex<Reports>,
    /// Dependencies following their workloads (`propagateDeps`).
    pub follow: Mutex<crate::hub::federation::follow::Follow>,
    /// What placement knew of the members when last asked ([`Context::views`]).
    pub views: Mutex<Option<ViewsBuilt>>,
    /// Templates the current resync pass has yet to apply again (every copy, whatever
    /// the hub believes it holds), with the clusters where it already did; taken by the
    /// first reconcile that applies every placed copy (a member being listed or
    /// unreachable keeps the mark for its own copy).
    pub resync: Mutex<HashMap<ObjectKey, Vec<String>>>,
    /// The revisions of templates with a rollout this leadership term listed or wrote.
    pub revisions: crate::hub::federation::revisions::RevisionStore,
    /// Replica clusters whose Secrets the hub found (or made) equal to the primary
    /// cluster's this leadership term: (template, replica cluster) to the primary
    /// cluster they came from.
    pub replica_credentials: Mutex<HashMap<(ObjectKey, String), String>>,
    /// Template -> the switchover (target, start) the hub marked the old primary
    /// cluster's copy with this leadership term: a reconcile whose copy cache does not
    /// show the mark yet keeps that start instead of stamping another.
    pub switchover_starts: Mutex<HashMap<ObjectKey, (String, String)>>,
    /// How long a planned switchover may take before anything is promoted
    /// (`--switchover-deadline`).
    pub switchover_deadline: Duration,
}

/// What placement knows of every member, sorted by name, with each staticWeightList it
/// was asked for resolved against them. Built again only when a MemberCluster or the
/// hub's health changed, so reconciles share it instead of each building 100 views.
#[derive(Debug)]
pub struct ClusterSet {
    pub views: Vec<ClusterView>,
    /// By the address and length of the list asked for; the list is kept to check that
    /// the one at that address now is still the same (a freed list's address may be
    /// reused). Bounded: cleared when it holds [`MAX_RESOLVED_LISTS`].
    resolved: Mutex<HashMap<(usize, usize), Resolved>>,
}

/// A staticWeightList and its weights against a [`ClusterSet`].
type Resolved = (Vec<StaticClusterWeight>, Arc<StaticWeights>);

/// More distinct staticWeightLists than policies hold in practice; the cache of a
/// [`ClusterSet`] starts over beyond it.
const MAX_RESOLVED_LISTS: usize = 1024;

impl ClusterSet {
    pub fn new(views: Vec<ClusterView>) -> Self {
        ClusterSet {
            views,
            resolved: Mutex::default(),
        }
    }

    /// `list` resolved against these clusters (kept for the next template of the same
    /// policy); None without a list.
    pub fn static_weights(&self, list: &[StaticClusterWeight]) -> Option<Arc<StaticWeights>> {
        if list.is_empty() {
            return None;
        }
        let key = (list.as_ptr() as usize, list.len());
        let mut resolved = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((kept, weights)) = resolved.get(&key)
            && kept.as_slice() == list
        {
            return Some(weights.clone());
        }
        if resolved.len() >= MAX_RESOLVED_LISTS {
            resolved.clear();
        }
        let weights = Arc::new(StaticWeights::resolve(list, &self.views));
        resolved.insert(key, (list.to_vec(), weights.clone()));
        Some(weights)
    }
}

/// The last [`ClusterSet`] and what it was built from (each MemberCluster and the health
/// by its `Arc`: the stores replace an object's `Arc` when it changes, and holding it
/// keeps its address from being reused).
#[derive(Debug)]
pub struct ViewsBuilt {
    members: Vec<Arc<MemberCluster>>,
    health: Arc<HubHealth>,
    set: Arc<ClusterSet>,
}

impl ViewsBuilt {
    /// Whether it was built from exactly these objects (the same `Arc`s in the same
    /// order; a store that changed one holds a new `Arc` for it).
    fn is_from(&self, members: &[Arc<MemberCluster>], health: &Arc<HubHealth>) -> bool {
        Arc::ptr_eq(&self.health, health)
            && self.members.len() == members.len()
            && self
                .members
                .iter()
                .zip(members)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

/// Whether `seen` (from a watch) is at least as new as `written` (a write's response).
fn caught_up(seen: &kube::api::ObjectMeta, written: &kube::api::ObjectMeta) -> bool {
    if seen.uid != written.uid {
        return true;
    }
    let version = |m: &kube::api::ObjectMeta| {
        m.resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    match (version(seen), version(written)) {
        (Some(seen), Some(written)) => seen >= written,
        _ => true,
    }
}

/// What the hub API server returned to the hub's last write of an object, by template,
/// until the object's store has caught up with it. Shared with the watch that triggers
/// work, which knows the hub's own writes by it (see [`is_echo`]).
pub type Written<K> = Arc<Mutex<HashMap<ObjectKey, Arc<K>>>>;

/// Whether `seen`, just delivered by a watch, is the hub's own last write of `key`'s
/// object coming back: the reconcile that wrote it already went on from what was
/// written, so it is no cause for work (another writer's change has another
/// resourceVersion). The watch's store has `seen` by now, so once it is at least as new
/// as the write the response is forgotten here: a settled hub keeps no write responses
/// (they were its history, one binding and one template per template written).
pub fn is_echo<K: Resource>(memo: &Written<K>, key: &ObjectKey, seen: &K) -> bool {
    let mut memo = memo.lock().unwrap_or_else(|p| p.into_inner());
    let Some(written) = memo.get(key) else {
        return false;
    };
    let echo = written.meta().resource_version.is_some()
        && written.meta().resource_version == seen.meta().resource_version;
    if caught_up(seen.meta(), written.meta()) {
        memo.remove(key);
    }
    echo
}

/// Keeps a write's response for [`is_echo`] and [`fresher`], unless the watch has
/// delivered it (or something newer) already: a response that comes back after its own
/// watch event would otherwise stay for good, as no later event forgets it. `seen` reads
/// the store under the memo's lock; the watch applies an event to its store before it
/// asks `is_echo` (which takes that lock), so either `seen` shows the write here or
/// `is_echo` finds it in the memo.
fn remember<K: Resource>(
    memo: &Mutex<HashMap<ObjectKey, Arc<K>>>,
    key: &ObjectKey,
    written: K,
    seen: impl FnOnce() -> Option<Arc<K>>,
) {
    let mut memo = memo.lock().unwrap_or_else(|p| p.into_inner());
    if seen().is_some_and(|seen| caught_up(seen.meta(), written.meta())) {
        memo.remove(key);
    } else {
        memo.insert(key.clone(), Arc::new(written));
    }
}

/// The fresher of a store's object and a write's response; forgets the response once
/// the store has caught up.
fn fresher<K: Resource>(
    memo: &Mutex<HashMap<ObjectKey, Arc<K>>>,
    key: &ObjectKey,
    seen: Option<Arc<K>>,
) -> Option<Arc<K>> {
    let mut memo = memo.lock().unwrap_or_else(|p| p.into_inner());
    let Some(written) = memo.get(key) else {
        return seen;
    };
    match &seen {
        Some(seen_object) if caught_up(seen_object.meta(), written.meta()) => {
            memo.remove(key);
            seen
        }
        // Gone from the store (deleted): the response is history.
        None => {
            memo.remove(key);
            None
        }
        Some(_) => Some(written.clone()),
    }
}

/// Every template's body (everything but metadata and status) as compact JSON text, by
/// template: the stores keep only metadata, `spec.replicas` and status, and the body is
/// read when a copy is built. Text is a fraction of the memory of a parsed JSON tree, and
/// packed against the other bodies ([`Packer`]) a fraction of that.
#[derive(Clone, Default)]
pub struct Bodies(Arc<Mutex<PackedBodies>>);

#[derive(Default)]
struct PackedBodies {
    bodies: HashMap<ObjectKey, Packed>,
    packer: Packer,
}

impl Bodies {
    fn lock(&self) -> std::sync::MutexGuard<'_, PackedBodies> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(&self, key: ObjectKey, body: &str) {
        let mut held = self.lock();
        let PackedBodies { bodies, packer } = &mut *held;
        bodies.insert(key, packer.pack(body.as_bytes()));
        if packer.due() {
            let dropped = packer.renew(&mut [bodies]);
            if dropped > 0 {
                tracing::error!(
                    dropped,
                    "template bodies could not be read back to pack them again; they are read again at the templates' next events"
                );
            }
        }
    }

    pub fn get(&self, key: &ObjectKey) -> Option<String> {
        let held = self.lock();
        held.packer.unpack(held.bodies.get(key)?)
    }

    /// Whether the body of `key` is held (without unpacking it).
    pub fn contains(&self, key: &ObjectKey) -> bool {
        self.lock().bodies.contains_key(key)
    }

    pub fn remove(&self, key: &ObjectKey) {
        self.lock().bodies.remove(key);
    }

    /// Templates whose body is held.
    pub fn len(&self) -> usize {
        self.lock().bodies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Reduces a template to what the hub's store keeps, and moves its body into `bodies`:
/// no managed fields, no kubectl last-applied copy of the whole object, and of the data
/// only the replica field (at the kind's own path) and `status`. A LIST returns built-in objects without
/// apiVersion/kind (only watch events carry them): they are set here.
pub(super) fn slim_template(
    object: &mut DynamicObject,
    (resource, interpretation): &(ApiResource, Arc<Interpretation>),
    kind: usize,
    bodies: &Bodies,
) {
    object.types = Some(kube::api::TypeMeta {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
    });
    object.metadata.managed_fields = None;
    object
        .annotations_mut()
        .remove("kubectl.kubernetes.io/last-applied-configuration");
    let mut data = std::mem::take(&mut object.data);
    let mut kept = serde_json::Map::new();
    if let Some(status) = data.as_object_mut().and_then(|map| map.remove("status")) {
        kept.insert("status".into(), status);
    }
    if let Some(path) = &interpretation.replicas
        && let Some(replicas) = path.get(&data)
    {
        let mut kept_value = serde_json::Value::Object(kept);
        path.set(&mut kept_value, replicas.clone());
        kept = match kept_value {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
    }
    let key = ObjectKey {
        kind,
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
    };
    bodies.insert(key, &data.to_string());
    object.data = serde_json::Value::Object(kept);
}

/// The whole template as JSON: the store's slim object with its body put back.
pub(super) fn full_template(object: &DynamicObject, body: Option<&str>) -> serde_json::Value {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        // The replica field kept in the store is in the body too, where it belongs.
        map.retain(|field, _| {
            matches!(
                field.as_str(),
                "apiVersion" | "kind" | "metadata" | "status"
            )
        });
    }
    let body: serde_json::Value = body
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    if let (Some(target), Some(fields)) = (value.as_object_mut(), body.as_object()) {
        for (field, content) in fields {
            target.insert(field.clone(), content.clone());
        }
    }
    value
}

impl Context {
    /// How the kind of `key` is read.
    pub fn interpretation(&self, key: &ObjectKey) -> Arc<Interpretation> {
        self.kinds
            .get(key.kind)
            .map(|(_, interpretation)| interpretation.clone())
            .unwrap_or_else(|| Arc::new(Interpretation::default_for("", "")))
    }

    /// The template of `key`, as fresh as the hub knows it.
    pub fn template(&self, key: &ObjectKey) -> Option<Arc<DynamicObject>> {
        let seen = self
            .stores
            .templates
            .get(key.kind)?
            .get(&key.namespace, &key.name);
        fresher(&self.written_templates, key, seen)
    }

    pub fn remember_template(&self, key: &ObjectKey, mut written: DynamicObject) {
        let Some(kind) = self.kinds.get(key.kind) else {
            return;
        };
        slim_template(&mut written, kind, key.kind, &self.bodies);
        remember(&self.written_templates, key, written, || {
            self.stores
                .templates
                .get(key.kind)?
                .get(&key.namespace, &key.name)
        });
    }

    /// The binding of `key`'s template, as fresh as the hub knows it.
    pub fn binding(&self, key: &ObjectKey, name: &str) -> Option<Arc<ResourceBinding>> {
        let seen = self.stores.bindings.get(&key.namespace, name);
        fresher(&self.written_bindings, key, seen)
    }

    pub fn remember_binding(&self, key: &ObjectKey, mut written: ResourceBinding) {
        written.metadata.managed_fields = None;
        let namespace = written.metadata.namespace.clone().unwrap_or_default();
        let name = written.name_any();
        remember(&self.written_bindings, key, written, || {
            self.stores.bindings.get(&namespace, &name)
        });
    }

    /// Every policy, as candidates for matching.
    pub fn policies(
        &self,
    ) -> (
        Vec<Arc<PropagationPolicy>>,
        Vec<Arc<ClusterPropagationPolicy>>,
    ) {
        (
            self.stores.policies.state(),
            self.stores.cluster_policies.state(),
        )
    }

    /// Every override policy.
    pub fn override_policies(&self) -> (Vec<Arc<OverridePolicy>>, Vec<Arc<ClusterOverridePolicy>>) {
        (
            self.stores.override_policies.state(),
            self.stores.cluster_override_policies.state(),
        )
    }

    /// Why the hub lacks fresh positive evidence of `cluster` for a stateful delete or
    /// shrink (`membership::evidence`); None: it has it.
    pub fn doubt(&self, cluster: &str) -> Option<String> {
        let probe_every = self
            .state
            .registry
            .get(cluster)
            .map(|member| {
                Duration::from_secs(
                    (member.probe.interval_seconds.max(1) + member.probe.timeout_seconds.max(1))
                        as u64,
                )
            })
            .unwrap_or(Duration::ZERO);
        self.state.evidence.doubt(cluster, probe_every)
    }

    /// What placement knows of every member, sorted by name: built again only when a
    /// MemberCluster or the hub's health changed since the last call.
    pub fn views(&self) -> Arc<ClusterSet> {
        let health = self.state.hub_health.load_full();
        let members = self.stores.members.state();
        let mut built = self.views.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(last) = built.as_ref()
            && last.is_from(&members, &health)
        {
            return last.set.clone();
        }
        let mut views: Vec<ClusterView> = members
            .iter()
            .filter(|m| !is_refused_duplicate(m))
            .map(|m| hub_cluster_view(m, &health))
            .collect();
        views.sort_by(|a, b| a.name.cmp(&b.name));
        let set = Arc::new(ClusterSet::new(views));
        *built = Some(ViewsBuilt {
            members,
            health,
            set: set.clone(),
        });
        set
    }

    /// Whether a status change for `key` should wait: it is still converging and has not
    /// waited long enough yet. Returns how much longer it may wait. The first write of a
    /// status on its way waits `coalesce`, the next twice that, every later one four times
    /// that (30 s, 60 s, then every 120 s), until it converges: a long rollout costs a few
    /// writes, not one every `coalesce`.
    pub fn defer_status(&self, key: &str, converged: bool, coalesce: Duration) -> Option<Duration> {
        let mut waiting = self.converging.lock().unwrap_or_else(|p| p.into_inner());
        if converged {
            waiting.remove(key);
            return None;
        }
        waiting
            .entry(key.to_string())
            .or_default()
            .defer(Instant::now(), coalesce)
    }

    /// Nothing of `key`'s status waits now: it was written (`wrote`: the next change
    /// on its way waits longer, kept until it converges) or found as wanted. A write
    /// that failed calls nothing, so it is tried again at once, without waiting anew.
    pub fn status_settled(&self, key: &str, wrote: bool) {
        if let Some(entry) = self
            .converging
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(key)
        {
            entry.written(wrote);
        }
    }

    pub fn count_write(&self, what: &str) {
        self.metrics
            .hub_writes
            .get_or_create(&WriteLabels { what: what.into() })
            .inc();
    }

    /// Replaces `key`'s report in the gauges.
    pub fn report(&self, key: &ObjectKey, report: Option<TemplateReport>) {
        let mut reports = self.reports.lock().unwrap_or_else(|p| p.into_inner());
        let Some(fenced_change) = reports.replace(key, report) else {
            return;
        };
        self.metrics.fenced.inc_by(fenced_change);
        for ((condition, status), count) in reports.pairs.iter() {
            self.metrics
                .bindings
                .get_or_create(&ConditionLabels {
                    condition: condition.clone(),
                    status: status.clone(),
                })
                .set(*count);
        }
    }

    /// Forgets everything the hub remembered about a template that is gone.
    pub fn forget(&self, key: &ObjectKey, uid: Option<&str>) {
        if let Some(uid) = uid {
            self.generations
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(uid);
        }
        self.failovers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        self.replica_credentials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(template, _), _| template != key);
        let prefix = status_prefix(key);
        self.converging
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| !k.starts_with(&prefix));
        self.written_bindings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        self.written_templates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        self.writers.forget_everywhere(key);
        self.bodies.remove(key);
        self.report(key, None);
    }

    /// The same Event on the template and, when there is one, its binding.
    pub async fn event_both(
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

    pub async fn event(
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

/// Candidates for policy matching, borrowed from the policies.
pub(super) fn candidates<'a>(
    policies: &'a [Arc<PropagationPolicy>],
    cluster_policies: &'a [Arc<ClusterPropagationPolicy>],
) -> Vec<PolicyCandidate<'a>> {
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
    candidates
}

/// A status on its way (see [`Context::defer_status`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Converging {
    /// Since when a change waits to be written.
    since: Option<Instant>,
    /// Writes while it had not converged.
    written: u32,
}

impl Converging {
    /// How much longer a change seen at `now` waits (None: write it now).
    fn defer(&mut self, now: Instant, coalesce: Duration) -> Option<Duration> {
        let since = *self.since.get_or_insert(now);
        let wait = coalesce.saturating_mul(1 << self.written.min(2));
        let waited = now.saturating_duration_since(since);
        wait.checked_sub(waited).filter(|left| !left.is_zero())
    }

    /// Nothing waits any more: it was written (which counts), or needs no write.
    fn written(&mut self, counts: bool) {
        self.since = None;
        if counts {
            self.written = self.written.saturating_add(1);
        }
    }
}

/// Prefix of every status key of a template in [`Context::converging`].
fn status_prefix(key: &ObjectKey) -> String {
    format!("{}/{}/{}/", key.kind, key.namespace, key.name)
}

/// Key of a template's binding status in [`Context::converging`].
pub(super) fn binding_status_key(key: &ObjectKey) -> String {
    format!("{}binding", status_prefix(key))
}

/// Key of a template's own status in [`Context::converging`].
pub(super) fn template_status_key(key: &ObjectKey) -> String {
    format!("{}template", status_prefix(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, zone: &str) -> Arc<MemberCluster> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "federation.example.com/v1alpha1",
                "kind": "MemberCluster",
                "metadata": {"name": name},
                "spec": {"secretRef": {"namespace": "bulkhead-system", "name": name}, "zone": zone},
            }))
            .expect("a MemberCluster"),
        )
    }

    fn weight_by_zone(zone: &str, weight: i64) -> StaticClusterWeight {
        StaticClusterWeight {
            target_cluster: crate::api::propagation_policy::ClusterTarget {
                zones: vec![zone.to_string()],
                ..Default::default()
            },
            weight,
        }
    }

    fn object(uid: &str, resource_version: &str) -> DynamicObject {
        let mut o = DynamicObject::new(
            "web",
            &ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
        );
        o.metadata.uid = Some(uid.into());
        o.metadata.resource_version = Some(resource_version.into());
        o
    }

    fn web_key() -> ObjectKey {
        ObjectKey {
            kind: 0,
            namespace: "shop".into(),
            name: "web".into(),
        }
    }

    #[test]
    fn reports_count_each_condition_once_per_template_and_forget_removed_ones() {
        let report = |status: &str, fenced: i64| TemplateReport {
            conditions: vec![
                ("Scheduled".into(), "True".into()),
                ("Applied".into(), status.into()),
            ],
            fenced,
        };
        let count = |reports: &Reports, condition: &str, status: &str| {
            reports
                .pairs
                .iter()
                .find(|((c, s), _)| c == condition && s == status)
                .map_or(0, |(_, n)| *n)
        };
        let other = ObjectKey {
            name: "api".into(),
            ..web_key()
        };
        let mut reports = Reports::default();
        assert_eq!(
            reports.replace(&web_key(), Some(report("False", 1))),
            Some(1)
        );
        assert_eq!(reports.replace(&other, Some(report("True", 0))), Some(0));
        // The same report again changes nothing.
        assert_eq!(reports.replace(&web_key(), Some(report("False", 1))), None);
        assert_eq!(count(&reports, "Scheduled", "True"), 2);
        assert_eq!(count(&reports, "Applied", "False"), 1);
        // A new status moves the count; the fenced change is the difference.
        assert_eq!(
            reports.replace(&web_key(), Some(report("True", 0))),
            Some(-1)
        );
        assert_eq!(count(&reports, "Applied", "False"), 0);
        assert_eq!(count(&reports, "Applied", "True"), 2);
        // A template that is gone takes its conditions with it; forgetting it twice is
        // no change.
        assert_eq!(reports.replace(&other, None), Some(0));
        assert_eq!(reports.replace(&other, None), None);
        assert_eq!(count(&reports, "Scheduled", "True"), 1);
        assert_eq!(reports.pairs.len(), 3, "each pair is kept once");
    }

    #[test]
    fn a_write_response_is_an_echo_once_and_forgotten_when_the_watch_caught_up() {
        let memo: Written<DynamicObject> = Written::default();
        let key = web_key();
        let held = |memo: &Written<DynamicObject>| memo.lock().unwrap().contains_key(&key);
        // Nothing written: nothing is an echo.
        assert!(!is_echo(&memo, &key, &object("u1", "10")));
        memo.lock()
            .unwrap()
            .insert(key.clone(), Arc::new(object("u1", "12")));
        // An older event (another writer's change before ours) is news, and the
        // response stays until the watch reaches it.
        assert!(!is_echo(&memo, &key, &object("u1", "11")));
        assert!(held(&memo));
        // Our own write coming back: an echo, and the response is history now.
        assert!(is_echo(&memo, &key, &object("u1", "12")));
        assert!(!held(&memo));
        // A later change by someone else passed ours: news, and forgotten as well.
        memo.lock()
            .unwrap()
            .insert(key.clone(), Arc::new(object("u1", "20")));
        assert!(!is_echo(&memo, &key, &object("u1", "21")));
        assert!(!held(&memo));
        // A new object of the same name (another UID) makes the response history too.
        memo.lock()
            .unwrap()
            .insert(key.clone(), Arc::new(object("u1", "30")));
        assert!(!is_echo(&memo, &key, &object("u2", "5")));
        assert!(!held(&memo));
    }

    #[test]
    fn a_write_response_that_comes_back_after_its_watch_event_is_not_kept() {
        let memo: Written<DynamicObject> = Written::default();
        let key = web_key();
        let held = |memo: &Written<DynamicObject>| memo.lock().unwrap().contains_key(&key);
        // The watch delivered the write (or a later version) first: nothing to keep,
        // and an older response still held goes too.
        memo.lock()
            .unwrap()
            .insert(key.clone(), Arc::new(object("u1", "8")));
        remember(&memo, &key, object("u1", "12"), || {
            Some(Arc::new(object("u1", "12")))
        });
        assert!(!held(&memo));
        remember(&memo, &key, object("u1", "12"), || {
            Some(Arc::new(object("u1", "13")))
        });
        assert!(!held(&memo));
        // The store is behind, or has nothing yet: kept until the watch reaches it.
        remember(&memo, &key, object("u1", "12"), || {
            Some(Arc::new(object("u1", "11")))
        });
        assert!(held(&memo));
        remember(&memo, &key, object("u1", "14"), || None);
        assert!(held(&memo));
        assert!(is_echo(&memo, &key, &object("u1", "14")));
        assert!(!held(&memo));
    }

    #[test]
    fn views_are_built_again_only_when_a_member_or_the_health_changed() {
        let east = member("east", "zone-a");
        let west = member("west", "zone-b");
        let health = Arc::new(HubHealth::default());
        let built = ViewsBuilt {
            members: vec![east.clone(), west.clone()],
            health: health.clone(),
            set: Arc::new(ClusterSet::new(vec![])),
        };
        assert!(built.is_from(&[east.clone(), west.clone()], &health));
        // The same content in a new object (what a store holds after an update).
        let west_updated = member("west", "zone-b");
        assert!(!built.is_from(&[east.clone(), west_updated], &health));
        assert!(!built.is_from(std::slice::from_ref(&east), &health));
        assert!(!built.is_from(
            &[east.clone(), west.clone(), member("north", "zone-c")],
            &health
        ));
        assert!(!built.is_from(&[east, west], &Arc::new(HubHealth::default())));
    }

    #[test]
    fn a_weight_list_is_resolved_once_per_cluster_set_and_again_when_it_changed() {
        let views = vec![
            ClusterView {
                name: "east".into(),
                zone: "zone-a".into(),
                ..ClusterView::default()
            },
            ClusterView {
                name: "west".into(),
                zone: "zone-b".into(),
                ..ClusterView::default()
            },
        ];
        let set = ClusterSet::new(views.clone());
        assert!(set.static_weights(&[]).is_none());
        let mut list = vec![weight_by_zone("zone-a", 3), weight_by_zone("zone-b", 1)];
        let first = set.static_weights(&list).expect("resolved");
        assert_eq!(*first, StaticWeights::resolve(&list, &views));
        assert!(Arc::ptr_eq(&first, &set.static_weights(&list).unwrap()));
        // An equal list elsewhere (another policy) gets the same weights.
        let copy = list.clone();
        assert_eq!(*set.static_weights(&copy).unwrap(), *first);
        // The same list edited in place (same address and length): resolved again.
        list[1].weight = 5;
        let edited = set.static_weights(&list).unwrap();
        assert_ne!(*edited, *first);
        assert_eq!(*edited, StaticWeights::resolve(&list, &views));
    }

    #[test]
    fn a_status_on_its_way_is_written_less_often_the_longer_it_takes() {
        let coalesce = Duration::from_secs(30);
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut converging = Converging::default();
        // The first change waits 30 s from when it was seen.
        assert_eq!(
            converging.defer(at(0), coalesce),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            converging.defer(at(10), coalesce),
            Some(Duration::from_secs(20))
        );
        assert_eq!(converging.defer(at(30), coalesce), None);
        // The write failed: it is due still, and tried again at once.
        assert_eq!(converging.defer(at(32), coalesce), None);
        converging.written(true);
        // The next waits 60 s from the first change after that write.
        assert_eq!(
            converging.defer(at(35), coalesce),
            Some(Duration::from_secs(60))
        );
        assert_eq!(converging.defer(at(95), coalesce), None);
        converging.written(true);
        // Then 120 s, and no longer.
        for written in [100, 220, 340] {
            assert!(converging.defer(at(written), coalesce).is_some());
            assert_eq!(converging.defer(at(written + 120), coalesce), None);
            converging.written(true);
        }
        // A change that turned out to need no write waits anew, as long as before.
        assert!(converging.defer(at(500), coalesce).is_some());
        converging.written(false);
        assert_eq!(
            converging.defer(at(510), coalesce),
            Some(Duration::from_secs(120))
        );
    }

    fn meta(uid: &str, version: &str) -> kube::api::ObjectMeta {
        kube::api::ObjectMeta {
            uid: Some(uid.into()),
            resource_version: Some(version.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_write_response_counts_until_the_watch_catches_up() {
        assert!(!caught_up(&meta("a", "5"), &meta("a", "6")));
        assert!(caught_up(&meta("a", "6"), &meta("a", "6")));
        assert!(caught_up(&meta("b", "1"), &meta("a", "6")));
    }

    #[test]
    fn a_slim_template_gets_its_body_back_whole() {
        let resource = (
            ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
            crate::hub::federation::interpreter::Interpreters::built_in()
                .get("apps/v1", "Deployment"),
        );
        let original: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u",
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
            "status": {"readyReplicas": 1}
        }))
        .unwrap();
        let bodies = Bodies::default();
        let mut slim = original.clone();
        slim_template(&mut slim, &resource, 0, &bodies);
        assert_eq!(
            slim.data,
            serde_json::json!({"spec": {"replicas": 3}, "status": {"readyReplicas": 1}})
        );
        let key = ObjectKey {
            kind: 0,
            namespace: "shop".into(),
            name: "web".into(),
        };
        let whole = full_template(&slim, bodies.get(&key).as_deref());
        assert_eq!(whole["spec"], original.data["spec"]);
        assert_eq!(whole["status"], original.data["status"]);
        assert_eq!(whole["metadata"]["uid"], "u");
        assert!(
            whole["metadata"]["annotations"]
                .as_object()
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn status_keys_of_a_template_share_its_prefix() {
        let key = ObjectKey {
            kind: 1,
            namespace: "shop".into(),
            name: "web".into(),
        };
        assert!(binding_status_key(&key).starts_with(&status_prefix(&key)));
        assert!(template_status_key(&key).starts_with(&status_prefix(&key)));
        assert_ne!(binding_status_key(&key), template_status_key(&key));
    }
}
