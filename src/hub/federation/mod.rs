//! Federation (DESIGN.md sections 3-5): for every template a policy selects, decide its
//! placement, bind it, propagate the copies through the member writers, bring their
//! status back, clean up after deleted templates, and fail over.
//!
//! Event-driven and per object. Watches of the hub (templates, bindings, policies,
//! members) and of every member's copies turn into template keys on one deduplicated
//! work queue ([`queue`]); a fixed number of workers reconcile one template each
//! ([`reconcile`]), writing only what differs. What triggers a template:
//!
//! | change | templates queued |
//! |---|---|
//! | the template (anything but its status) | that one |
//! | its binding | that template |
//! | one of its copies in a member | that template |
//! | a member's copies relisted | every template |
//! | a policy (propagation or override) | every template |
//! | a member's view (labels, taints, readiness, capacity) or the hub's frozen state | every template |
//! | a member write finished | that template |
//! | time (a toleration expiring, a status waiting to be written) | that one, when due |
//!
//! The hub's own status writes do not trigger work (a template event that changed only
//! its status is dropped). Copies are written by one writer per member ([`writer`]): a
//! template never waits for a member, and members never wait for each other.

pub mod aggregate;
pub mod analysis;
pub mod context;
pub mod copies;
pub mod copy_cache;
pub mod dependencies;
pub mod discovery;
pub mod field_path;
pub mod finalizer_policy;
pub mod follow;
pub mod interpreter;
pub mod kinds;
pub mod matching;
pub mod overrides;
pub mod packing;
pub mod pending_cleanups;
pub mod placement;
pub mod policy_status;
pub mod propagation;
pub mod queue;
pub mod reconcile;
pub mod replica_clusters;
pub mod replica_credentials;
pub mod revisions;
pub mod rollout;
pub mod rollout_step;
pub mod scheduler;
#[cfg(test)]
mod simulation;
pub mod status;
pub mod text_store;
pub mod writer;

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, stream};
use kube::api::DynamicObject;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{self, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::api::{
    ClusterOverridePolicy, ClusterPropagationPolicy, MemberCluster, OverridePolicy,
    PropagationPolicy, ResourceBinding,
};
use crate::hub::HubState;
use crate::hub::federation::copy_cache::{CopyCaches, CopyEvent, Kinds, Look};
use crate::hub::federation::discovery::{Gvk, KindNeeds};
use crate::metrics::Metrics;
pub use context::ControllerMetrics;
use context::{
    CallLabels, CallVerbLabels, ClusterLabel, Context, RateLimit, Stores, is_echo, slim_template,
};
use queue::WorkQueue;
use scheduler::binding_name;
use text_store::TextStore;
use writer::{Completed, ObjectKey, Writers};

pub use writer::FIELD_MANAGER;

/// Templates reconciled at once.
pub const CONCURRENCY: usize = 32;

/// How long a template waits for a look after a member write finished, or after its
/// copies' rollout moved with no copy becoming Ready (or stopping being Ready): the
/// status that look builds is written at most every [`status::STATUS_COALESCE`] while on
/// its way, and what make-before-break and a converged status wait for (a Ready copy)
/// is looked at at once. A burst's template is so looked at a few times, not once per
/// copy per status update.
pub const PROGRESS_DELAY: Duration = Duration::from_secs(5);
/// Objects per page of the initial lists (and relists) of templates, bindings and member
/// copies. A page arrives and is parsed whole, managed fields and all, before the stores
/// keep each object's slim text: the page, not the number of objects, sets the peak of a
/// cold start (at 500 a page, three members' copy lists and the binding list held 25 MB
/// at once; docs/benchmarks.md, session 12).
pub const LIST_PAGE: u32 = 100;

/// Controller settings.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Bindings that may evict replicas from a failed cluster, per second.
    pub eviction_rate: f64,
    /// How often every member's copies are listed again and every copy applied again
    /// (drift repair that survives restarts; `--resync-interval`).
    pub resync_interval: Duration,
    /// Keep the MutatingAdmissionPolicy that adds the cleanup finalizer on create
    /// ([`finalizer_policy`]); off, the hub deletes it and adds every finalizer itself.
    pub finalizer_admission_policy: bool,
    /// How long a planned switchover of replica clusters may take before anything is
    /// promoted; past it, the hub gives it up (`--switchover-deadline`).
    pub switchover_deadline: Duration,
}

/// Something that happened on the hub, as the queue sees it.
#[derive(Default)]
enum Trigger {
    /// One template (or its binding, or its copies) changed.
    Template(ObjectKey),
    /// Anything may have changed for every template.
    All,
    #[default]
    Nothing,
}

/// Fingerprint of a template without its status and what the API server changes on
/// every write: equal fingerprints mean only the status (or nothing) changed.
fn template_fingerprint(object: &DynamicObject, body: Option<&str>) -> u64 {
    fingerprint(object, body)
}

/// Fingerprint of any hub object without its status and what the API server changes on
/// every write, with `extra` (a template's body kept apart).
pub(super) fn fingerprint<K: serde::Serialize>(object: &K, extra: Option<&str>) -> u64 {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
    }
    if let Some(metadata) = value["metadata"].as_object_mut() {
        metadata.remove("resourceVersion");
        metadata.remove("managedFields");
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    extra.hash(&mut hasher);
    hasher.finish()
}

fn template_key(kind: usize, object: &DynamicObject) -> ObjectKey {
    ObjectKey {
        kind,
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
    }
}

/// The template a binding belongs to, if its kind is federated.
fn binding_template(
    kinds: &Kinds,
    namespace: Option<&str>,
    resource: &crate::api::resource_binding::ObjectReference,
) -> Option<ObjectKey> {
    let kind = kinds
        .iter()
        .position(|(ar, _)| ar.api_version == resource.api_version && ar.kind == resource.kind)?;
    Some(ObjectKey {
        kind,
        namespace: namespace.unwrap_or_default().to_string(),
        name: resource.name.clone(),
    })
}

/// A reflector of the hub whose events become triggers (a failed watch call is the
/// default trigger: nothing).
pub(super) fn reflect<K, T, F>(
    api: Api<K>,
    mut to_trigger: F,
) -> (reflector::Store<K>, futures::stream::BoxStream<'static, T>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    T: Default + Send + 'static,
    F: FnMut(watcher::Event<K>) -> T + Send + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(api, watcher::Config::default()).modify(|o| o.meta_mut().managed_fields = None),
    )
    .default_backoff()
    .map(move |event| match event {
        Ok(event) => to_trigger(event),
        Err(_) => T::default(),
    })
    .boxed();
    (store, stream)
}

/// Triggers every template when a watch (re)lists or when an object changes.
fn everything<K>(event: watcher::Event<K>) -> Trigger {
    match event {
        watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone => {
            Trigger::All
        }
        watcher::Event::Init | watcher::Event::InitApply(_) => Trigger::Nothing,
    }
}

/// Runs the federation controller until shutdown, over the kinds the policies select
/// and the bindings name ([`discovery`]), and again whenever that set changes.
pub async fn run(
    hub: Client,
    state: HubState,
    recorder: Recorder,
    metrics: ControllerMetrics,
    options: ControllerOptions,
    shutdown: CancellationToken,
) {
    let refusals = state.refusals.clone();
    discovery::supervise(
        hub.clone(),
        refusals,
        shutdown,
        move |kinds, needs, term| {
            run_kinds(
                hub.clone(),
                state.clone(),
                recorder.clone(),
                metrics.clone(),
                options.clone(),
                kinds,
                needs,
                term,
            )
        },
    )
    .await;
}

/// The controller's metrics, registered once per process.
pub fn register_metrics(metrics: &Metrics) -> ControllerMetrics {
    ControllerMetrics::register(metrics)
}

/// Runs the federation controller over `kinds` until shutdown.
#[allow(clippy::too_many_arguments)]
async fn run_kinds(
    hub: Client,
    state: HubState,
    recorder: Recorder,
    controller_metrics: ControllerMetrics,
    options: ControllerOptions,
    kinds: Kinds,
    needs: KindNeeds,
    shutdown: CancellationToken,
) {
    let (copy_events, mut copy_events_rx) = mpsc::unbounded_channel();
    let caches = CopyCaches::with_events(copy_events);
    let cache_task = tokio::spawn(crate::hub::federation::copy_cache::run(
        caches.clone(),
        state.registry.clone(),
        state.board.clone(),
        state.evidence.clone(),
        kinds.clone(),
        options.resync_interval,
        shutdown.clone(),
    ));
    let (completed, mut completed_rx) = mpsc::unbounded_channel::<Completed>();
    let calls = controller_metrics.member_calls.clone();
    let call_duration = controller_metrics.member_call_duration.clone();
    let writers = Writers::new(
        state.registry.clone(),
        state.evidence.clone(),
        state.leadership.clone(),
        kinds.clone(),
        completed,
        Arc::new(move |cluster: &str, verb: &str, ok: bool, took: Duration| {
            call_duration
                .get_or_create(&CallVerbLabels {
                    cluster: cluster.into(),
                    verb: verb.into(),
                })
                .observe(took.as_secs_f64());
            calls
                .get_or_create(&CallLabels {
                    cluster: cluster.into(),
                    verb: verb.into(),
                    result: if ok { "ok" } else { "error" }.into(),
                })
                .inc();
        }),
        shutdown.clone(),
    );

    let mut streams: Vec<futures::stream::BoxStream<'static, Trigger>> = vec![];
    // A policy change may change what the finalizer's admission policy matches.
    let finalizer_changes = Arc::new(finalizer_policy::Changes::default());
    fn touching<K: kube::Resource + serde::Serialize>(
        changes: Arc<finalizer_policy::Changes>,
    ) -> impl FnMut(watcher::Event<K>) -> Trigger {
        let mut inner = policy_status::spec_changes(everything);
        move |event| {
            let trigger = inner(event);
            if !matches!(trigger, Trigger::Nothing) {
                changes.touch();
            }
            trigger
        }
    }
    let (policies, s) = reflect(
        Api::<PropagationPolicy>::all(hub.clone()),
        touching(finalizer_changes.clone()),
    );
    streams.push(s);
    let (cluster_policies, s) = reflect(
        Api::<ClusterPropagationPolicy>::all(hub.clone()),
        touching(finalizer_changes.clone()),
    );
    streams.push(s);
    let (override_policies, s) = reflect(Api::<OverridePolicy>::all(hub.clone()), everything);
    streams.push(s);
    let (cluster_override_policies, s) =
        reflect(Api::<ClusterOverridePolicy>::all(hub.clone()), everything);
    streams.push(s);
    // Nothing from the MemberCluster watch itself: what placement reads of a member is
    // its view, and `watch_views` queues every template when a view changes. A trigger
    // here queued every template at every MemberCluster status write, which the prober
    // makes for `lastProbeTime` alone every 30 s per member (1,500 reconciles every 30 s
    // with 500 templates on 3 members, and a hub that never looked settled).
    // Except that a pending cleanup row naming a kind not federated asks for the kind.
    let row_kinds = kinds.clone();
    let row_needs = needs.clone();
    let (members, s) = reflect(Api::<MemberCluster>::all(hub.clone()), move |event| {
        if let watcher::Event::Apply(member) | watcher::Event::InitApply(member) = event {
            for row in member.status.iter().flat_map(|s| &s.pending_cleanups) {
                if !row_kinds
                    .iter()
                    .any(|(ar, _)| ar.api_version == row.api_version && ar.kind == row.kind)
                {
                    let _ = row_needs.send(Gvk::new(&row.api_version, &row.kind));
                }
            }
        }
        Trigger::Nothing
    });
    streams.push(s);
    let binding_kinds = kinds.clone();
    let written_bindings = context::Written::default();
    let written_templates = context::Written::default();
    let binding_echoes = written_bindings.clone();
    let bindings = TextStore::<ResourceBinding>::new("binding");
    let binding_store = bindings.clone();
    let binding_watch = watcher(
        Api::<ResourceBinding>::all(hub.clone()),
        watcher::Config::default().page_size(LIST_PAGE),
    )
    .modify(|b: &mut ResourceBinding| b.metadata.managed_fields = None)
    .default_backoff()
    // The store first, as a reflector does: whoever the event wakes reads the binding
    // as it now is.
    .inspect(move |event| {
        if let Ok(event) = event {
            binding_store.apply(event);
        }
    });
    let s = binding_watch.map(move |event| {
        let Ok(event) = event else {
            return Trigger::Nothing;
        };
        // A deleted binding is always news (its last write may have been the hub's).
        let deleted = matches!(event, watcher::Event::Delete(_));
        match event {
            watcher::Event::Apply(b) | watcher::Event::Delete(b) | watcher::Event::InitApply(b) => {
                match binding_template(
                    &binding_kinds,
                    b.metadata.namespace.as_deref(),
                    &b.spec.resource,
                ) {
                    Some(key) if !deleted && is_echo(&binding_echoes, &key, &b) => Trigger::Nothing,
                    Some(key) => Trigger::Template(key),
                    None => {
                        // A binding of a kind not federated (its policy went): the kind
                        // is federated again, so its template can still be cleaned up.
                        let resource = &b.spec.resource;
                        let _ = needs.send(Gvk::new(&resource.api_version, &resource.kind));
                        Trigger::Nothing
                    }
                }
            }
            watcher::Event::InitDone => Trigger::All,
            _ => Trigger::Nothing,
        }
    });
    streams.push(s.boxed());
    let mut templates = vec![];
    let bodies = context::Bodies::default();
    for (kind, entry) in kinds.iter().enumerate() {
        let ar = &entry.0;
        let store = TextStore::<DynamicObject>::new("template");
        templates.push(store.clone());
        let api = Api::<DynamicObject>::all_with(hub.clone(), ar);
        let slim_resource = entry.clone();
        let slim_bodies = bodies.clone();
        let slim = watcher(api, watcher::Config::default().page_size(LIST_PAGE)).modify(
            move |o: &mut DynamicObject| slim_template(o, &slim_resource, kind, &slim_bodies),
        );
        let trigger_bodies = bodies.clone();
        let template_echoes = written_templates.clone();
        let mut seen: HashMap<ObjectKey, u64> = HashMap::new();
        streams.push(
            slim.default_backoff()
                .inspect(move |event| {
                    if let Ok(event) = event {
                        store.apply(event);
                    }
                })
                .map(move |event| match event {
                    Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => {
                        let key = template_key(kind, &o);
                        let body = trigger_bodies.get(&key);
                        let fingerprint = template_fingerprint(&o, body.as_deref());
                        // Asked first, always: it also forgets the hub's write response
                        // once the watch caught up (a status-only change included).
                        let echo = is_echo(&template_echoes, &key, &o);
                        if seen.insert(key.clone(), fingerprint) == Some(fingerprint) || echo {
                            // Only its status changed, or it is the hub's own write (its
                            // finalizer) coming back.
                            Trigger::Nothing
                        } else {
                            Trigger::Template(key)
                        }
                    }
                    Ok(watcher::Event::Delete(o)) => {
                        let key = template_key(kind, &o);
                        seen.remove(&key);
                        trigger_bodies.remove(&key);
                        Trigger::Template(key)
                    }
                    Ok(watcher::Event::InitDone) => Trigger::All,
                    _ => Trigger::Nothing,
                })
                .boxed(),
        );
    }
    let context = Arc::new(Context {
        hub,
        state: state.clone(),
        caches,
        writers,
        recorder,
        metrics: controller_metrics,
        kinds,
        stores: Stores {
            policies,
            cluster_policies,
            override_policies,
            cluster_override_policies,
            members,
            bindings,
            templates,
        },
        bodies,
        queue: WorkQueue::rescheduled_by_work(),
        evictions: Mutex::new(RateLimit::new(options.eviction_rate)),
        generations: Mutex::default(),
        failovers: Mutex::default(),
        converging: Mutex::default(),
        written_bindings,
        written_templates,
        views: Mutex::default(),
        reports: Mutex::default(),
        follow: Mutex::default(),
        resync: Mutex::default(),
        revisions: Default::default(),
        replica_credentials: Mutex::default(),
        switchover_starts: Mutex::default(),
        switchover_deadline: options.switchover_deadline,
    });

    // Aborted when this function returns or is dropped (a leadership term that ends).
    let mut cache_guard = AbortOnDrop::default();
    let cache_task = cache_guard.keep(cache_task);
    let mut tasks = AbortOnDrop::default();
    // Hub watches -> queue (and a nudge for the policies' status). The stores follow
    // their watches on this task whatever the workers are doing.
    let selection = Arc::new(policy_status::Selection::default());
    let touch = selection.clone();
    let triggers = stream::select_all(streams).inspect(move |t| {
        if !matches!(t, Trigger::Nothing) {
            touch.touch();
        }
    });
    tasks.push(tokio::spawn(drive(
        context.clone(),
        triggers,
        shutdown.clone(),
    )));
    // Policies' `Selected` status, per policy, coalesced.
    let policy_status_task = tasks.keep(tokio::spawn(policy_status::run(
        context.clone(),
        selection.clone(),
        shutdown.clone(),
    )));
    // The finalizer's admission policy follows the policies.
    {
        let context = context.clone();
        let counting = context.clone();
        let resources: Vec<kube::api::ApiResource> =
            context.kinds.iter().map(|(ar, _)| ar.clone()).collect();
        finalizer_changes.touch();
        tasks.push(tokio::spawn(finalizer_policy::run(
            context.hub.clone(),
            finalizer_changes,
            options.finalizer_admission_policy,
            move || {
                if !context.stores.ready() {
                    return None;
                }
                let (policies, cluster_policies) = context.policies();
                let candidates = context::candidates(&policies, &cluster_policies);
                Some(finalizer_policy::desired_policy(&candidates, &resources))
            },
            move || counting.count_write("admission_policy"),
            shutdown.clone(),
        )));
    }
    // Member copies -> queue.
    {
        let context = context.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(event) = copy_events_rx.recv().await {
                match event {
                    CopyEvent::Changed {
                        cluster,
                        kind,
                        namespace,
                        name,
                        look,
                    } => {
                        let key = ObjectKey {
                            kind,
                            namespace,
                            name,
                        };
                        let later = match look {
                            Look::Now => false,
                            Look::Gone { uid } => {
                                context.writers.seen_gone(&cluster, &key, uid.as_deref());
                                false
                            }
                            Look::Later => true,
                            Look::LaterIfWritten { uid, generation } => {
                                context
                                    .writers
                                    .wrote(&cluster, &key, uid.as_deref(), generation)
                            }
                        };
                        if later {
                            // A rollout on its way: its status is written at most every
                            // STATUS_COALESCE anyway, so a look every PROGRESS_DELAY
                            // does (and the look a Ready copy brings comes at once).
                            context.queue.add_after(key, PROGRESS_DELAY);
                        } else {
                            context.queue.add(key);
                        }
                    }
                    CopyEvent::Relisted { .. } => queue_all(&context),
                }
            }
        }));
    }
    // Finished member writes -> latency, queue.
    {
        let context = context.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(done) = completed_rx.recv().await {
                if done.outcome == writer::Outcome::Done {
                    if done.verb == "apply" {
                        observe_latency(&context, &done.key);
                    }
                    // What the write did comes back through the member's watch (at
                    // once when it matters: a copy Ready, deleted, or not as written);
                    // this look is for a write that changed nothing there.
                    context.queue.add_after(done.key, PROGRESS_DELAY);
                } else {
                    context.queue.add(done.key);
                }
            }
        }));
    }
    // Member health and the hub's frozen state -> queue, when a view changed.
    tasks.push(tokio::spawn(watch_views(context.clone(), shutdown.clone())));
    // Drift repair: every template's copies applied again, spread over the interval.
    tasks.push(tokio::spawn(resync(
        context.clone(),
        options.resync_interval,
        shutdown.clone(),
    )));
    // Gauges.
    tasks.push(tokio::spawn(report_progress(
        context.clone(),
        selection,
        shutdown.clone(),
    )));

    // Nothing is decided before every initial list is in.
    while !context.stores.ready() {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    if !shutdown.is_cancelled() {
        build_dependency_graph(&context);
        queue_all(&context);
        let workers: Vec<_> = (0..CONCURRENCY)
            .map(|_| tasks.keep(tokio::spawn(work(context.clone(), shutdown.clone()))))
            .collect();
        for worker in workers {
            let _ = worker.await;
        }
    }
    // It writes what it still owes before it stops.
    let _ = policy_status_task.await;
    drop(tasks);
    // The copy caches stop their member watches on shutdown: give them a moment (the
    // guard aborts them after it).
    let _ = tokio::time::timeout(
        2 * crate::hub::membership::tasks::SHUTDOWN_GRACE,
        cache_task,
    )
    .await;
    drop(cache_guard);
}

/// The dependency graph from everything listed: every template of a `propagateDeps`
/// policy, with what it references and where its binding places it, and every template
/// no policy places whose kind names reference fields, with what those reference. Until
/// this is done no dependency follows (or leaves) anything.
fn build_dependency_graph(context: &Context) {
    let (policies, cluster_policies) = context.policies();
    let candidates = context::candidates(&policies, &cluster_policies);
    let propagates = candidates.iter().any(|c| c.spec.propagate_deps);
    let mut workloads = vec![];
    let mut followers = vec![];
    for (kind, (resource, interpretation)) in context.kinds.iter().enumerate() {
        let has_references = !interpretation.references.is_empty();
        if !propagates && !has_references {
            continue;
        }
        // One template parsed at a time (10,000 parsed at once would be the hub's
        // largest peak).
        context.stores.templates[kind].each(|template: DynamicObject| {
            // A template being deleted needs nothing any more (its reconcile tells the
            // graph so): counted here, it would bring back to its clusters a dependency
            // that already left them.
            if template.metadata.deletion_timestamp.is_some() {
                return;
            }
            let key = template_key(kind, &template);
            let reference = matching::TemplateRef::of(resource, &template);
            let chosen = matching::choose_policy(&reference, &candidates);
            let workload = chosen.as_ref().is_some_and(|(p, _)| p.spec.propagate_deps);
            if chosen.is_some() && !workload {
                return;
            }
            let Some(object) = follow::object_ref(&context.kinds, &key) else {
                return;
            };
            let whole = context::full_template(&template, context.bodies.get(&key).as_deref());
            let deps = follow::workload_references(&context.kinds, &key, &whole);
            if !workload {
                // No policy places it: a follower, when its kind names reference fields.
                if has_references {
                    followers.push((key, object, deps));
                }
                return;
            }
            let clusters = context
                .binding(&key, &scheduler::binding_name(&key.name, &resource.kind))
                .map(|b| follow::placed_clusters(&b.spec.clusters))
                .unwrap_or_default();
            workloads.push((key, object, deps, clusters));
        });
    }
    tracing::info!(
        workloads = workloads.len(),
        followers = followers.len(),
        "dependency graph built"
    );
    context
        .follow
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .build(workloads, followers);
}

/// Tasks aborted when dropped: a federation controller dropped at the end of a
/// leadership term leaves no task behind.
#[derive(Default)]
struct AbortOnDrop(Vec<tokio::task::AbortHandle>);

impl AbortOnDrop {
    fn push<T>(&mut self, task: tokio::task::JoinHandle<T>) {
        self.0.push(task.abort_handle());
    }

    /// Keeps `task` to abort on drop, and hands it back to be awaited.
    fn keep<T>(&mut self, task: tokio::task::JoinHandle<T>) -> tokio::task::JoinHandle<T> {
        self.0.push(task.abort_handle());
        task
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Queues every template the hub holds, and every binding's template (a binding whose
/// template is gone may still have copies to clean up).
fn queue_all(context: &Context) {
    for (kind, store) in context.stores.templates.iter().enumerate() {
        for (namespace, name) in store.keys() {
            context.queue.add(ObjectKey {
                kind,
                namespace,
                name,
            });
        }
    }
    // Only what names the template is read of each binding.
    #[derive(serde::Deserialize)]
    struct Names {
        metadata: kube::api::ObjectMeta,
        spec: Spec,
    }
    #[derive(serde::Deserialize)]
    struct Spec {
        resource: crate::api::resource_binding::ObjectReference,
    }
    context.stores.bindings.each(|names: Names| {
        if let Some(key) = binding_template(
            &context.kinds,
            names.metadata.namespace.as_deref(),
            &names.spec.resource,
        ) {
            context.queue.add(key);
        }
    });
    // And every template named by a member's pending cleanup rows (gone with its
    // namespace while the member was cut off).
    for row in pending_cleanups::all_rows(&context.stores.members.state()) {
        if let Some(kind) = context
            .kinds
            .iter()
            .position(|(ar, _)| ar.api_version == row.api_version && ar.kind == row.kind)
        {
            context.queue.add(ObjectKey {
                kind,
                namespace: row.namespace,
                name: row.name,
            });
        }
    }
}

async fn drive(
    context: Arc<Context>,
    mut triggers: impl Stream<Item = Trigger> + Unpin,
    shutdown: CancellationToken,
) {
    loop {
        let trigger = tokio::select! {
            _ = shutdown.cancelled() => return,
            trigger = triggers.next() => match trigger {
                Some(trigger) => trigger,
                None => return,
            },
        };
        match trigger {
            Trigger::Template(key) => context.queue.add(key),
            Trigger::All if context.stores.ready() => queue_all(&context),
            Trigger::All | Trigger::Nothing => {}
        }
    }
}

/// Queues every template when what placement knows of the members changes (readiness,
/// taints, labels, capacity) or the hub's frozen state does.
async fn watch_views(context: Arc<Context>, shutdown: CancellationToken) {
    let mut board = context.state.board.subscribe();
    // Capacity changes whenever pods come and go in a member: they re-place templates
    // only while some policy divides by it (placement::capacity::uses_capacity).
    let observed = || {
        let (policies, cluster_policies) = context.policies();
        let mut views = context.views().views.clone();
        if !policies
            .iter()
            .any(|p| placement::capacity::uses_capacity(&p.spec.placement))
            && !cluster_policies
                .iter()
                .any(|p| placement::capacity::uses_capacity(&p.spec.placement))
        {
            views.iter_mut().for_each(|v| v.capacity = None);
        }
        (views, context.state.hub_health.load().frozen)
    };
    let mut last = observed();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = board.changed() => if changed.is_err() { return },
            // The frozen state and member objects change without the board.
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        let now = observed();
        if now != last {
            if now.1 != last.1 {
                tracing::warn!(
                    frozen = now.1,
                    "hub frozen state changed: failover {}",
                    if now.1 { "suspended" } else { "resumed" }
                );
            }
            last = now;
            if context.stores.ready() {
                queue_all(&context);
            }
        }
    }
}

/// Every `interval`, marks every template for a resync (its reconcile applies every copy
/// again, whatever the hub believes the copy holds) and queues them spread over the
/// interval, so the members see a steady trickle of applies, not a burst. Also reports
/// copies that carry the hub's labels while no template or binding names them.
async fn resync(context: Arc<Context>, interval: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        if !context.stores.ready() {
            continue;
        }
        let mut keys = vec![];
        for (kind, store) in context.stores.templates.iter().enumerate() {
            for (namespace, name) in store.keys() {
                keys.push(ObjectKey {
                    kind,
                    namespace,
                    name,
                });
            }
        }
        let step = interval / (keys.len().max(1) as u32 + 1);
        {
            let mut marked = context.resync.lock().unwrap_or_else(|p| p.into_inner());
            marked.clear();
            marked.extend(keys.iter().map(|key| (key.clone(), vec![])));
        }
        for (i, key) in keys.into_iter().enumerate() {
            context.queue.add_after(key, step * i as u32);
        }
        report_orphans(&context);
    }
}

/// Copies in the members that carry the hub's labels while no template (and no binding)
/// of their name exists on the hub: left by a hub that lost track of them (a leader change
/// before a new template's decision was recorded, an older hub). Reported (a warning and
/// `bulkhead_hub_orphan_copies`), never deleted by this pass: a copy the hub cannot tie to
/// a template is deleted by no rule.
fn report_orphans(context: &Context) {
    for view in context.views().views.iter() {
        let Some(copies) = context.caches.member(&view.name) else {
            continue;
        };
        let mut orphans = vec![];
        for (kind, (resource, _)) in context.kinds.iter().enumerate() {
            if !copies.synced(resource) {
                continue;
            }
            for (namespace, name) in copies.keys(resource) {
                // The member's own Bulkhead objects (the hub's account `join` made, the
                // fencing Lease) carry the label too; they are no copies.
                if scheduler::is_excluded_namespace(&namespace) {
                    continue;
                }
                let key = ObjectKey {
                    kind,
                    namespace,
                    name,
                };
                let template = context.template(&key).is_some();
                let binding = context
                    .binding(&key, &binding_name(&key.name, &resource.kind))
                    .is_some();
                if !template && !binding {
                    orphans.push(format!("{} {}/{}", resource.kind, key.namespace, key.name));
                }
            }
        }
        context
            .metrics
            .orphan_copies
            .get_or_create(&ClusterLabel {
                cluster: view.name.clone(),
            })
            .set(orphans.len() as i64);
        if !orphans.is_empty() {
            tracing::warn!(
                member = %view.name,
                count = orphans.len(),
                first = %orphans.iter().take(10).cloned().collect::<Vec<_>>().join(", "),
                "copies carry the hub's labels but no template or binding names them; delete them in the member if they are not wanted"
            );
        }
    }
}

/// One worker: reconciles templates off the queue until shutdown.
async fn work(context: Arc<Context>, shutdown: CancellationToken) {
    while let Some(key) = context.queue.next(&shutdown).await {
        let started = Instant::now();
        let again = reconcile::reconcile(&context, &key).await;
        context
            .metrics
            .reconcile_duration
            .observe(started.elapsed().as_secs_f64());
        context.metrics.reconciles.inc();
        context.queue.done(&key);
        if let Some(again) = again {
            context
                .queue
                .add_after(key, again.max(Duration::from_millis(10)));
        }
    }
}

/// Observes the propagation latency of a template's current generation, once per member
/// copy applied for it (later re-applies, e.g. drift repair, do not count).
fn observe_latency(context: &Context, key: &ObjectKey) {
    let Some(uid) = context.template(key).and_then(|t| t.uid()) else {
        return;
    };
    let generations = context
        .generations
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some((_, seen, _)) = generations.get(&uid) {
        context
            .metrics
            .propagation_latency
            .observe(seen.elapsed().as_secs_f64());
    }
}

/// Keeps the progress gauges: queue depth, pending member writes, and `hub_synced` (every
/// initial list in, every Ready member's copies listed, every template reconciled once).
async fn report_progress(
    context: Arc<Context>,
    selection: Arc<policy_status::Selection>,
    shutdown: CancellationToken,
) {
    let mut drained_once = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        let depth = context.queue.len()
            + context.queue.active()
            + context.queue.delayed()
            + selection.pending();
        context.metrics.queue_depth.set(depth as i64);
        context
            .metrics
            .pending_writes
            .set(context.writers.pending() as i64);
        let ready = context.stores.ready();
        drained_once |= ready && context.queue.len() + context.queue.active() == 0;
        let synced = drained_once
            && context.views().views.iter().filter(|v| v.ready).all(|v| {
                context
                    .caches
                    .member(&v.name)
                    .is_some_and(|c| context.kinds.iter().all(|(ar, _)| c.synced(ar)))
            });
        context.metrics.synced.set(i64::from(synced));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(status: serde_json::Value, version: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": version, "generation": 1},
            "spec": {"replicas": 3},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_status_only_change_keeps_the_fingerprint() {
        let before = template(json!({}), "1");
        let after = template(json!({"readyReplicas": 3}), "2");
        let body = Some(r#"{"spec":{"replicas":3}}"#);
        let print = template_fingerprint;
        assert_eq!(print(&before, body), print(&after, body));
        let mut scaled = after.clone();
        scaled.data["spec"]["replicas"] = json!(6);
        assert_ne!(print(&after, body), print(&scaled, body));
        let mut labelled = after.clone();
        labelled.labels_mut().insert("tier".into(), "web".into());
        assert_ne!(print(&before, body), print(&labelled, body));
        // A ConfigMap has no generation: its body is what changes.
        assert_ne!(
            print(&after, body),
            print(&after, Some(r#"{"data":{"a":"b"}}"#))
        );
    }

    #[test]
    fn a_binding_leads_to_its_template() {
        let kinds = discovery::kinds(
            &[
                kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
                kube::api::ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
            ],
            &interpreter::Interpreters::built_in(),
        );
        let binding: ResourceBinding = serde_json::from_value(json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "web-deployment", "namespace": "shop"},
            "spec": {"resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}, "replicas": 3, "clusters": []},
        }))
        .unwrap();
        let of = |b: &ResourceBinding| {
            binding_template(&kinds, b.metadata.namespace.as_deref(), &b.spec.resource)
        };
        let key = of(&binding).unwrap();
        assert_eq!(kinds[key.kind].0.kind, "Deployment");
        let mut other = binding.clone();
        other.spec.resource.kind = "StatefulSet".into();
        assert!(of(&other).is_none(), "not federated");
        assert_eq!((key.namespace.as_str(), key.name.as_str()), ("shop", "web"));
    }
}
