//! The hub's view of its copies in every member: one watch per member and template kind,
//! selecting `federation.example.com/managed-by=bulkhead`, kept in [`CopyStore`]s (a
//! reflector's semantics, each copy kept as the JSON text of its slim summary).
//!
//! A store keeps its last content while its member is unreachable (the propagator then
//! knows which copies a cut-off member still holds), and is rebuilt from a fresh list when
//! the member turns healthy again: a watch whose TCP connection silently died in a
//! partition would otherwise keep reporting the state from before it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::api::LABEL_MANAGED_BY;
use crate::hub::federation::copies::MANAGED_BY;
use crate::hub::federation::interpreter::Interpretation;
use crate::hub::federation::text_store::TextStore;
use crate::hub::membership::evidence::Evidence;
use crate::hub::membership::health::{FailureKind, Health};
use crate::hub::membership::prober::HealthBoard;
use crate::hub::{Registry, tasks};

/// One member's copies, by template kind.
pub struct ClusterCopies {
    stores: Vec<(ApiResource, CopyStore)>,
    /// Kinds the member cannot list for the hub (not served there, or not allowed to
    /// the hub's role), by kind index, with the member's answer.
    unavailable: Arc<Mutex<HashMap<usize, String>>>,
}

impl ClusterCopies {
    /// Why the hub cannot read this kind in the member, if it cannot. Such a kind counts
    /// as listed and empty: the hub sees no copy there, so it deletes none, and its
    /// applies fail with the member's answer on the binding.
    pub fn unavailable(&self, resource: &ApiResource) -> Option<String> {
        let index = self
            .stores
            .iter()
            .position(|(ar, _)| ar.kind == resource.kind && ar.group == resource.group)?;
        self.unavailable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&index)
            .cloned()
    }

    fn store(&self, resource: &ApiResource) -> Option<&CopyStore> {
        self.stores
            .iter()
            .find(|(ar, _)| ar.kind == resource.kind && ar.group == resource.group)
            .map(|(_, store)| store)
    }

    /// Every kind's copies have been listed completely (or the member refuses the kind).
    fn all_listed(&self) -> bool {
        self.stores
            .iter()
            .all(|(resource, _)| self.synced(resource))
    }

    /// The copies of this kind have been listed completely at least once.
    pub fn synced(&self, resource: &ApiResource) -> bool {
        self.store(resource).is_some_and(TextStore::ready) || self.unavailable(resource).is_some()
    }

    /// The (namespace, name) of every copy of this kind, as last seen.
    pub fn keys(&self, resource: &ApiResource) -> Vec<(String, String)> {
        self.store(resource).map(|s| s.keys()).unwrap_or_default()
    }

    /// The managed copy of `namespace/name` of this kind, as last seen.
    pub fn get(
        &self,
        resource: &ApiResource,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<DynamicObject>> {
        self.store(resource)?.get(namespace, name)
    }
}

/// One member's copies of one kind, each kept as the JSON text of its slim summary
/// ([`slim_copy`]): about 4.2 KB a copy as a `DynamicObject`, under 1 KB as text
/// (docs/benchmarks.md, "Where the heap goes").
pub type CopyStore = TextStore<DynamicObject>;

/// A change in a member's copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyEvent {
    /// The copy of `namespace/name` of the kind at index `kind` (in the kinds the caches
    /// watch) changed or went away in `cluster`.
    Changed {
        cluster: String,
        kind: usize,
        namespace: String,
        name: String,
        /// How soon its template needs a look.
        look: Look,
    },
    /// A member's copies were (re)listed, or the member is no longer watched: anything of
    /// its copies may have changed.
    Relisted { cluster: String },
}

/// How soon a copy's change needs its template looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Look {
    /// At once: the copy became Ready or stopped being Ready, was deleted, or is not what
    /// the hub last applied (another UID or a later generation: someone changed its spec).
    Now,
    /// Soon: only the status of a copy still on its way to Ready moved. Nothing but the
    /// status's next write (at most every 30 s while on its way) waits for it.
    Later,
    /// Soon if the copy is, by UID and generation, what the hub itself last applied there
    /// (the echo of its own write, as Ready as before); at once otherwise. A change of
    /// only its labels or annotations by someone else keeps the generation, so it is
    /// looked at soon too, and repaired then.
    LaterIfWritten {
        uid: Option<String>,
        generation: Option<i64>,
    },
    /// At once: the copy with this UID was deleted (a write's response that returned it
    /// no longer stands for it).
    Gone { uid: Option<String> },
}

/// Every member's copies. Cheap to clone.
#[derive(Clone, Default)]
pub struct CopyCaches {
    members: Arc<Mutex<HashMap<String, Arc<ClusterCopies>>>>,
    /// Told of every change in any member's copies.
    events: Option<mpsc::UnboundedSender<CopyEvent>>,
}

impl CopyCaches {
    /// Caches that report every change to `events`.
    pub fn with_events(events: mpsc::UnboundedSender<CopyEvent>) -> Self {
        CopyCaches {
            members: Arc::default(),
            events: Some(events),
        }
    }

    fn tell(&self, event: CopyEvent) {
        if let Some(events) = &self.events {
            let _ = events.send(event);
        }
    }

    /// One member's copies, if the hub watches it.
    pub fn member(&self, name: &str) -> Option<Arc<ClusterCopies>> {
        self.members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    fn set(&self, name: &str, copies: Option<Arc<ClusterCopies>>) {
        let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        match copies {
            Some(copies) => members.insert(name.to_string(), copies),
            None => members.remove(name),
        };
    }
}

/// The template kinds, with how each is read (by kind index).
pub type Kinds = Arc<[(ApiResource, Arc<Interpretation>)]>;

/// Watches every member's copies of `kinds` until shutdown; tells `evidence` when a
/// member's copies have been listed, and lists them again when the member was suspect.
pub async fn run(
    caches: CopyCaches,
    registry: Registry,
    board: HealthBoard,
    evidence: Evidence,
    kinds: Kinds,
    relist_every: Duration,
    shutdown: CancellationToken,
) {
    let inner = registry.clone();
    tasks::per_member(registry, shutdown, move |name, cancel| {
        watch_member(
            caches.clone(),
            inner.clone(),
            board.clone(),
            evidence.clone(),
            kinds.clone(),
            relist_every,
            name,
            cancel,
        )
    })
    .await;
}

fn is_healthy(board: &HealthBoard, name: &str) -> bool {
    board
        .entries()
        .get(name)
        .is_some_and(|entry| entry.health == Health::Healthy)
}

/// Whether the member may be watched: its prober has judged it once (so a second
/// MemberCluster for an already registered cluster is known before anything is read
/// through it) and it is not such a refused duplicate. A duplicate's copies are the
/// original's copies; reading them under a second name would make them look like copies
/// of a removed placement.
fn may_watch(board: &HealthBoard, name: &str) -> bool {
    board.entries().get(name).is_some_and(|entry| {
        !matches!(
            entry.health,
            Health::Unhealthy {
                kind: FailureKind::DuplicateCluster,
                ..
            }
        )
    })
}

/// Watches one member; restarts its watches when its credentials change, it turns
/// healthy again after a failure, or it answers again after it was suspect (one failed
/// probe or lease renewal: a watch may have silently died meanwhile, and a stateful
/// delete needs copies listed since the member was last suspect), and every
/// `relist_every` whatever happened (a watch can die silently without any failed probe:
/// a connection dropped by a middlebox; nothing would report it).
#[allow(clippy::too_many_arguments)]
async fn watch_member(
    caches: CopyCaches,
    registry: Registry,
    board: HealthBoard,
    evidence: Evidence,
    kinds: Kinds,
    relist_every: Duration,
    name: String,
    cancel: CancellationToken,
) {
    let mut registry_changes = registry.subscribe();
    let mut board_changes = board.subscribe();
    let mut evidence_changes = evidence.subscribe();
    'connect: loop {
        let Some(handle) = registry.get(&name) else {
            break;
        };
        let version = handle
            .connection
            .as_ref()
            .ok()
            .map(|c| c.secret_version.clone());
        let Some(client) = handle.client().cloned() else {
            // No usable credentials: wait for the Secret to change.
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = registry_changes.changed() => continue,
            }
        };
        if !may_watch(&board, &name) {
            caches.set(&name, None);
            caches.tell(CopyEvent::Relisted {
                cluster: name.clone(),
            });
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = registry_changes.changed() => continue,
                _ = board_changes.changed() => continue,
            }
        }
        let started = Instant::now();
        let (copies, mut events) = start_watches(&client, &kinds, &name);
        let copies = Arc::new(copies);
        caches.set(&name, Some(copies.clone()));
        let mut was_healthy = is_healthy(&board, &name);
        let mut listed = false;
        let mut relist_at = tokio::time::Instant::from_std(started + relist_every);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break 'connect,
                _ = tokio::time::sleep_until(relist_at) => {
                    if is_healthy(&board, &name) {
                        tracing::debug!(member = %name, "periodic relist of the member's copies");
                        continue 'connect;
                    }
                    // Unhealthy: the store keeps what the member last held (the recovery
                    // lists it again anyway).
                    relist_at += relist_every;
                }
                event = events.next() => {
                    match event {
                        Some(Some(event)) => caches.tell(event),
                        Some(None) => {}
                        None => tokio::time::sleep(Duration::from_secs(1)).await,
                    }
                    if !listed && copies.all_listed() {
                        listed = true;
                        evidence.listed(&name, started);
                    }
                }
                changed = evidence_changes.changed() => {
                    if changed.is_err() { break 'connect }
                    if evidence.record(&name).is_some_and(|r| r.relist_due(started)) {
                        tracing::debug!(member = %name, "member answers again after it was suspect; re-listing its copies");
                        continue 'connect;
                    }
                }
                changed = registry_changes.changed() => {
                    if changed.is_err() { break 'connect }
                    let now = registry.get(&name).and_then(|h| h.connection.ok().map(|c| c.secret_version));
                    if now != version { continue 'connect }
                }
                changed = board_changes.changed() => {
                    if changed.is_err() { break 'connect }
                    if !may_watch(&board, &name) {
                        tracing::warn!(member = %name, "member refused as a duplicate; its copies are no longer read");
                        continue 'connect;
                    }
                    let healthy = is_healthy(&board, &name);
                    let recovered = healthy && !was_healthy;
                    was_healthy = healthy;
                    if recovered {
                        tracing::debug!(member = %name, "member healthy again; re-listing its copies");
                        continue 'connect;
                    }
                }
            }
        }
    }
    caches.set(&name, None);
    caches.tell(CopyEvent::Relisted { cluster: name });
}

/// Label selector of the hub's copies.
pub fn managed_selector() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY}")
}

type CopyEvents = stream::SelectAll<futures::stream::BoxStream<'static, Option<CopyEvent>>>;

fn start_watches(client: &Client, kinds: &Kinds, cluster: &str) -> (ClusterCopies, CopyEvents) {
    let mut stores = vec![];
    let mut streams = vec![];
    let unavailable: Arc<Mutex<HashMap<usize, String>>> = Arc::default();
    for (kind, (resource, interpretation)) in kinds.iter().enumerate() {
        let cluster = cluster.to_string();
        let interpretation = interpretation.clone();
        let read_as = interpretation.clone();
        let unavailable = unavailable.clone();
        let what = format!("{} {}", resource.api_version, resource.kind);
        let store = CopyStore::new("copy");
        let mut seen = SeenCopies::default();
        stores.push((resource.clone(), store.clone()));
        let api = Api::<DynamicObject>::all_with(client.clone(), resource);
        let (probe_client, probe_api) = (client.clone(), api.clone());
        let recorded = unavailable.clone();
        let config = watcher::Config::default()
            .labels(&managed_selector())
            .page_size(crate::hub::federation::LIST_PAGE);
        streams.push(
            watcher(api, config)
                .modify(move |o: &mut DynamicObject| slim_copy(o, &interpretation))
                .backoff(crate::client::WatchBackoff::default())
                // The store first, as a reflector does: whoever the event wakes reads
                // the copy as it now is.
                .inspect(move |event| {
                    if let Ok(event) = event {
                        store.apply(event);
                    }
                })
                .then(move |event| {
                    // A refusal not recorded yet is confirmed before it counts.
                    let confirm = refusal(&event)
                        .filter(|_| {
                            !recorded
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .contains_key(&kind)
                        })
                        .map(|code| (probe_client.clone(), probe_api.clone(), code));
                    async move {
                        let settled = match confirm {
                            Some((client, api, code)) => refusal_settled(&client, &api, code).await,
                            None => true,
                        };
                        (event, settled)
                    }
                })
                .map(move |(event, settled)| {
                    if note_availability(&unavailable, &cluster, kind, &what, &event, settled) {
                        // Now counted as listed (and empty): its templates may go on.
                        return Some(CopyEvent::Relisted {
                            cluster: cluster.clone(),
                        });
                    }
                    let seen = match &event {
                        Ok(event) => seen.changes(event, &read_as),
                        Err(_) => Seen::Change,
                    };
                    if seen == Seen::Nothing {
                        return None;
                    }
                    copy_event(&cluster, kind, event, seen)
                })
                .boxed(),
        );
    }
    (
        ClusterCopies {
            stores,
            unavailable,
        },
        stream::select_all(streams),
    )
}

/// Metadata the hub reads on its copies.
const COPY_ANNOTATIONS: [&str; 9] = [
    crate::api::ANNOTATION_APPLIED_HASH,
    crate::api::ANNOTATION_PRIMARY_CLUSTER,
    crate::api::ANNOTATION_PRIMARY_TERM,
    crate::api::ANNOTATION_SWITCHOVER_TO,
    crate::api::ANNOTATION_SWITCHOVER_STARTED,
    crate::api::ANNOTATION_SWITCHOVER_PROMOTED,
    crate::api::LABEL_BINDING,
    crate::api::ANNOTATION_TEMPLATE_DELETED,
    crate::api::rollout::ANNOTATION_REVISION,
];

/// Reduces a member copy to what the hub decides on: identity, version, generation,
/// deletion, its own labels and annotations (the applied-hash says whether the copy holds
/// what the hub would apply), its replicas and its status summary, both normalized (at
/// `spec.replicas`, and under the Deployment names of the summed status fields, whatever
/// the kind calls them; a MyDatabase keeps its whole status). A cache of summaries is a
/// fraction of a cache of copies.
pub fn slim_copy(object: &mut DynamicObject, interpretation: &Interpretation) {
    let metadata = &mut object.metadata;
    metadata.managed_fields = None;
    metadata.owner_references = None;
    metadata.finalizers = None;
    metadata.creation_timestamp = None;
    metadata.generate_name = None;
    if let Some(labels) = metadata.labels.as_mut() {
        labels.retain(|key, _| key == LABEL_MANAGED_BY || key == crate::api::LABEL_BINDING);
    }
    if let Some(annotations) = metadata.annotations.as_mut() {
        annotations.retain(|key, _| COPY_ANNOTATIONS.contains(&key.as_str()));
    }
    let mut data = serde_json::Map::new();
    if let Some(replicas) = interpretation
        .replicas
        .as_ref()
        .and_then(|path| path.get(&object.data))
    {
        data.insert(
            "spec".into(),
            serde_json::json!({"replicas": replicas.clone()}),
        );
    }
    if interpretation.quirks.database_status {
        if let Some(status) = object.data.get_mut("status").map(serde_json::Value::take) {
            data.insert("status".into(), status);
        }
    } else if object.data.get("status").is_some_and(|s| !s.is_null()) {
        let summary = interpretation.normalized_status(&object.data);
        data.insert("status".into(), serde_json::Value::Object(summary));
    }
    object.data = serde_json::Value::Object(data);
}

/// The status code of a watch event that is the member refusing to list the kind (403:
/// the hub's role there does not cover it; 404: the member does not serve it).
fn refusal(event: &Result<watcher::Event<DynamicObject>, watcher::Error>) -> Option<u16> {
    match event {
        Err(
            watcher::Error::InitialListFailed(kube::Error::Api(status))
            | watcher::Error::WatchStartFailed(kube::Error::Api(status)),
        ) if status.code == 403 || status.code == 404 => Some(status.code),
        _ => None,
    }
}

/// The longest the confirmation of a refusal waits for the member's `/readyz`.
const REFUSAL_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Whether a refusal is the member's settled answer. An API server that is starting
/// answers 403 before its RBAC roles are loaded and 404 before its CRDs are served, and a
/// refused kind counts as listed and empty: taken at its word, such an answer made a
/// starting member that held stateful copies look as if it held none (the 60-minute chaos
/// run of seed 613575190 deleted a database's copy elsewhere 0.3 s later). So the refusal
/// counts only when the member then says it is ready (`/readyz` 200) and a list sent after
/// that is refused the same way.
async fn refusal_settled(client: &Client, api: &Api<DynamicObject>, code: u16) -> bool {
    use crate::hub::membership::{health::ProbeOutcome, prober::probe_readyz};
    if !matches!(
        probe_readyz(client, REFUSAL_PROBE_TIMEOUT).await,
        ProbeOutcome::Healthy
    ) {
        return false;
    }
    let again = api
        .list_metadata(
            &kube::api::ListParams::default()
                .labels(&managed_selector())
                .limit(1),
        )
        .await;
    matches!(again, Err(kube::Error::Api(status)) if status.code == code)
}

/// Records a kind the member refuses to list ([`refusal`]) once the refusal is `settled`
/// ([`refusal_settled`]; one that is not is an error the watch retries), and forgets it
/// once a list succeeds. Returns whether the kind just became unavailable.
fn note_availability(
    unavailable: &Mutex<HashMap<usize, String>>,
    cluster: &str,
    kind: usize,
    what: &str,
    event: &Result<watcher::Event<DynamicObject>, watcher::Error>,
    settled: bool,
) -> bool {
    let mut unavailable = unavailable.lock().unwrap_or_else(|p| p.into_inner());
    match (event, refusal(event)) {
        (_, Some(code)) if !settled => {
            tracing::debug!(
                member = cluster,
                kind = what,
                code,
                "a refusal of a member that is not ready, or not refused again: not recorded"
            );
            false
        }
        (_, Some(code)) => {
            let reason = if code == 403 {
                format!(
                    "the hub's role in {cluster} does not cover {what}: run `bulkhead join {cluster} ... --federate <resource>.<group>` again"
                )
            } else {
                format!("{cluster} does not serve {what}: install its CRD there")
            };
            let new = unavailable.insert(kind, reason.clone()).is_none();
            if new {
                tracing::warn!(member = cluster, kind = what, %reason, "the hub cannot read these copies");
            }
            new
        }
        (Ok(watcher::Event::InitDone), _) => {
            unavailable.remove(&kind);
            false
        }
        _ => false,
    }
}

/// The last slim content of every copy one watch delivered (a hash, without the
/// resourceVersion), so that an update that changed nothing the hub keeps (a condition's
/// timestamp, a field of the status it does not read, managed fields) wakes no template:
/// while pods come up in a burst most of a Deployment's status updates are such. Kept per
/// copy: a hash of everything but its status, a hash of its status, and whether it was
/// Ready by its kind's rule. Keyed by a hash of namespace and name (the store has the
/// names): a collision of two copies' keys could only make an update look like a change,
/// which wakes a template, never hide one.
#[derive(Default)]
struct SeenCopies(HashMap<u64, (u64, u64, bool)>);

/// What a watch event changes of what the hub knows of a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// Nothing the hub keeps.
    Nothing,
    /// Only the copy's status moved, and the copy is not Ready by its kind's rule, nor
    /// was it: a rollout on its way. Nothing waits for this but the status's next write.
    Progress,
    /// The copy is new or changed, and is as Ready as it was (a new copy: not Ready).
    /// When it is what the hub itself just applied, this is a rollout on its way too.
    Changed,
    /// Anything else: a copy that became Ready or stopped being Ready, a deleted copy,
    /// a relist.
    Change,
}

impl SeenCopies {
    /// What `event` changes of what the hub knows (the store is updated either way).
    fn changes(
        &mut self,
        event: &watcher::Event<DynamicObject>,
        interpretation: &Interpretation,
    ) -> Seen {
        let key = |object: &DynamicObject| {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            (
                object.metadata.namespace.as_deref(),
                object.metadata.name.as_deref(),
            )
                .hash(&mut hasher);
            hasher.finish()
        };
        let summary = |object: &DynamicObject| {
            let (rest, status) = slim_fingerprints(object);
            (
                rest,
                status,
                crate::hub::federation::propagation::copy_settled(interpretation, object),
            )
        };
        match event {
            watcher::Event::Apply(object) => {
                let now = summary(object);
                match self.0.insert(key(object), now) {
                    Some(before) if before == now => Seen::Nothing,
                    Some((rest, _, false)) if rest == now.0 && !now.2 => Seen::Progress,
                    Some((_, _, ready)) if ready == now.2 => Seen::Changed,
                    None if !now.2 => Seen::Changed,
                    _ => Seen::Change,
                }
            }
            watcher::Event::InitApply(object) => {
                self.0.insert(key(object), summary(object));
                Seen::Change
            }
            watcher::Event::Delete(object) => {
                self.0.remove(&key(object));
                Seen::Change
            }
            // A relist: what is not listed again is gone (and forgotten here).
            watcher::Event::Init => {
                self.0.clear();
                Seen::Change
            }
            watcher::Event::InitDone => Seen::Change,
        }
    }
}

/// Hashes of a slim copy without its resourceVersion: of everything but its status, and
/// of its status.
fn slim_fingerprints(object: &DynamicObject) -> (u64, u64) {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let meta = &object.metadata;
    (
        &meta.uid,
        &meta.generation,
        &meta.deletion_timestamp.as_ref().map(|t| t.0.as_second()),
        &meta.labels,
        &meta.annotations,
    )
        .hash(&mut hasher);
    let (mut rest, mut status) = (String::new(), String::new());
    if let Some(data) = object.data.as_object() {
        for (field, value) in data {
            let into = if field == "status" {
                &mut status
            } else {
                &mut rest
            };
            into.push_str(field);
            into.push_str(&value.to_string());
        }
    }
    rest.hash(&mut hasher);
    let mut status_hasher = std::collections::hash_map::DefaultHasher::new();
    status.hash(&mut status_hasher);
    (hasher.finish(), status_hasher.finish())
}

/// What a watch event of a member's copies means for the hub.
fn copy_event(
    cluster: &str,
    kind: usize,
    event: Result<watcher::Event<DynamicObject>, watcher::Error>,
    seen: Seen,
) -> Option<CopyEvent> {
    let changed = |object: &DynamicObject, look: Look| CopyEvent::Changed {
        cluster: cluster.to_string(),
        kind,
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
        look,
    };
    match event.ok()? {
        watcher::Event::Apply(object) => {
            let look = match seen {
                Seen::Progress => Look::Later,
                Seen::Changed => Look::LaterIfWritten {
                    uid: object.metadata.uid.clone(),
                    generation: object.metadata.generation,
                },
                Seen::Nothing | Seen::Change => Look::Now,
            };
            Some(changed(&object, look))
        }
        watcher::Event::Delete(object) => {
            let uid = object.metadata.uid.clone();
            Some(changed(&object, Look::Gone { uid }))
        }
        watcher::Event::InitDone => Some(CopyEvent::Relisted {
            cluster: cluster.to_string(),
        }),
        watcher::Event::Init | watcher::Event::InitApply(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn copy() -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "u", "resourceVersion": "7", "generation": 2,
                "labels": {"app": "web", LABEL_MANAGED_BY: MANAGED_BY, crate::api::LABEL_BINDING: "b1"},
                "annotations": {"team": "a", crate::api::ANNOTATION_APPLIED_HASH: "h", crate::api::LABEL_BINDING: "shop.web"},
                "managedFields": [{"manager": "bulkhead-hub"}],
                "finalizers": ["x"]
            },
            "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "web", "image": "nginx"}]}}},
            "status": {"replicas": 3, "readyReplicas": 2, "conditions": [{"type": "Available"}]}
        }))
        .unwrap()
    }

    fn slim(name: &str, ready: i64) -> DynamicObject {
        let mut object = copy();
        object.metadata.name = Some(name.to_string());
        object.data["status"]["readyReplicas"] = json!(ready);
        slim_copy(
            &mut object,
            &crate::hub::federation::interpreter::Interpreters::built_in()
                .get("apps/v1", "Deployment"),
        );
        object
    }

    #[test]
    fn a_slim_copy_reads_back_from_the_store_as_it_was_given() {
        let store = CopyStore::new("copy");
        let web = slim("web", 2);
        store.apply(&watcher::Event::Apply(web.clone()));
        let back = store.get("shop", "web").expect("kept");
        assert_eq!(*back, web);
        assert_eq!(back.metadata.deletion_timestamp, None);
        assert!(store.get("shop", "api").is_none());
        assert!(store.get("other", "web").is_none());
        // A later version replaces it; a deletion removes it.
        let newer = slim("web", 3);
        store.apply(&watcher::Event::Apply(newer.clone()));
        assert_eq!(*store.get("shop", "web").unwrap(), newer);
        store.apply(&watcher::Event::Delete(newer));
        assert!(store.get("shop", "web").is_none());
    }

    #[test]
    fn a_slim_copy_keeps_what_decisions_read() {
        let interpreters = crate::hub::federation::interpreter::Interpreters::built_in();
        let mut slim = copy();
        slim_copy(&mut slim, &interpreters.get("apps/v1", "Deployment"));
        assert_eq!(slim.metadata.uid.as_deref(), Some("u"));
        assert_eq!(slim.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(slim.metadata.generation, Some(2));
        assert!(slim.metadata.managed_fields.is_none() && slim.metadata.finalizers.is_none());
        assert_eq!(slim.labels().len(), 2, "only the hub's labels");
        assert_eq!(slim.annotations().len(), 2, "only the hub's annotations");
        assert_eq!(
            slim.data,
            json!({"spec": {"replicas": 3}, "status": {"replicas": 3, "readyReplicas": 2}})
        );
        assert_eq!(crate::hub::federation::propagation::copy_ready(&slim), 2);
        assert_eq!(
            crate::hub::federation::propagation::copy_replicas(&slim),
            Some(3)
        );
        // A MyDatabase keeps its whole status.
        let mut database = copy();
        slim_copy(
            &mut database,
            &interpreters.get("example.com/v1", "MyDatabase"),
        );
        assert_eq!(
            database.data["status"]["conditions"][0]["type"],
            "Available"
        );
        // Another kind's fields, normalized.
        let widget: crate::api::ResourceInterpreterSpec = serde_json::from_value(json!({
            "target": {"apiVersion": "example.org/v1", "kind": "Widget"},
            "replicas": ".spec.size", "status": {"ready": ".status.summary.ready"}
        }))
        .unwrap();
        let widget = Interpretation::from_spec(
            &widget,
            crate::hub::federation::interpreter::Source::Default,
        )
        .unwrap();
        let mut custom = copy();
        custom.data = json!({"spec": {"size": 4}, "status": {"summary": {"ready": 3}, "x": 1}});
        slim_copy(&mut custom, &widget);
        assert_eq!(
            custom.data,
            json!({"spec": {"replicas": 4}, "status": {"readyReplicas": 3}})
        );
    }

    #[test]
    fn an_update_that_leaves_the_slim_copy_as_it_was_wakes_nothing() {
        let interpretation = crate::hub::federation::interpreter::Interpreters::built_in()
            .get("apps/v1", "Deployment");
        let slim = |edit: &dyn Fn(&mut DynamicObject)| {
            let mut object = copy();
            edit(&mut object);
            slim_copy(&mut object, &interpretation);
            object
        };
        let mut seen = SeenCopies::default();
        let mut changes = |event| seen.changes(&event, &interpretation);
        let first = slim(&|_| {});
        assert_eq!(
            changes(watcher::Event::Apply(first)),
            Seen::Changed,
            "new, on its way"
        );
        // A new resourceVersion, a condition and managed fields: nothing the hub keeps.
        let same = slim(&|o| {
            o.metadata.resource_version = Some("8".into());
            o.data["status"]["conditions"] = json!([{"type": "Progressing"}]);
        });
        assert_eq!(changes(watcher::Event::Apply(same)), Seen::Nothing);
        // 1 of 3 Ready (it was 2): a rollout on its way.
        let on_its_way = slim(&|o| o.data["status"]["readyReplicas"] = json!(1));
        assert_eq!(
            changes(watcher::Event::Apply(on_its_way.clone())),
            Seen::Progress
        );
        let ready = slim(&|o| o.data["status"]["readyReplicas"] = json!(3));
        assert_eq!(
            changes(watcher::Event::Apply(ready.clone())),
            Seen::Change,
            "Ready"
        );
        assert_eq!(
            changes(watcher::Event::Apply(on_its_way)),
            Seen::Change,
            "no longer Ready"
        );
        let drifted = slim(&|o| {
            o.data["status"]["readyReplicas"] = json!(2);
            o.metadata.generation = Some(3);
        });
        assert_eq!(
            changes(watcher::Event::Apply(drifted.clone())),
            Seen::Changed,
            "generation"
        );
        let rescaled = slim(&|o| {
            o.data["status"]["readyReplicas"] = json!(2);
            o.metadata.generation = Some(3);
            o.data["spec"]["replicas"] = json!(2);
        });
        assert_eq!(
            changes(watcher::Event::Apply(rescaled)),
            Seen::Change,
            "replicas, and Ready at them"
        );
        assert_eq!(
            changes(watcher::Event::Delete(drifted.clone())),
            Seen::Change
        );
        assert_eq!(
            changes(watcher::Event::Apply(drifted.clone())),
            Seen::Changed,
            "back after a delete"
        );
        // A new copy that is Ready at once (a kind that reports no readiness, say).
        let mut already = drifted.clone();
        already.metadata.name = Some("other".into());
        already.data["status"]["readyReplicas"] = json!(3);
        assert_eq!(changes(watcher::Event::Apply(already)), Seen::Change);
        // A relist forgets: whatever is listed again counts as seen anew.
        assert_eq!(changes(watcher::Event::Init), Seen::Change);
        assert_eq!(
            changes(watcher::Event::InitApply(ready.clone())),
            Seen::Change
        );
        assert_eq!(changes(watcher::Event::Apply(ready)), Seen::Nothing);
        assert!(seen.0.len() == 1);
    }

    #[test]
    fn a_copys_change_says_how_soon_its_template_needs_a_look() {
        let object = copy();
        let look = |event, seen| match copy_event("east", 0, Ok(event), seen) {
            Some(CopyEvent::Changed { look, .. }) => look,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            look(watcher::Event::Apply(object.clone()), Seen::Progress),
            Look::Later
        );
        assert_eq!(
            look(watcher::Event::Apply(object.clone()), Seen::Changed),
            Look::LaterIfWritten {
                uid: Some("u".into()),
                generation: Some(2)
            }
        );
        assert_eq!(
            look(watcher::Event::Apply(object.clone()), Seen::Change),
            Look::Now
        );
        assert_eq!(
            look(watcher::Event::Delete(object), Seen::Change),
            Look::Gone {
                uid: Some("u".into())
            }
        );
    }

    #[test]
    fn a_kind_the_member_refuses_counts_as_listed_until_it_lists() {
        let unavailable = Mutex::new(HashMap::new());
        let refused = |code| -> Result<watcher::Event<DynamicObject>, watcher::Error> {
            Err(watcher::Error::InitialListFailed(kube::Error::Api(
                Box::new(kube::core::Status {
                    code,
                    ..Default::default()
                }),
            )))
        };
        assert!(
            !note_availability(
                &unavailable,
                "east",
                2,
                "example.org/v1 Widget",
                &refused(403),
                false
            ),
            "a refusal that is not settled is an error the watch retries"
        );
        assert!(unavailable.lock().unwrap().is_empty());
        assert!(note_availability(
            &unavailable,
            "east",
            2,
            "example.org/v1 Widget",
            &refused(403),
            true
        ));
        assert!(
            !note_availability(
                &unavailable,
                "east",
                2,
                "example.org/v1 Widget",
                &refused(403),
                true
            ),
            "told once"
        );
        assert!(unavailable.lock().unwrap()[&2].contains("--federate"));
        assert!(note_availability(
            &unavailable,
            "east",
            3,
            "example.org/v1 Gadget",
            &refused(404),
            true
        ));
        assert!(unavailable.lock().unwrap()[&3].contains("install its CRD"));
        assert!(
            !note_availability(&unavailable, "east", 4, "v1 ConfigMap", &refused(500), true),
            "a server error is not a refusal: the watch retries"
        );
        note_availability(
            &unavailable,
            "east",
            2,
            "example.org/v1 Widget",
            &Ok(watcher::Event::InitDone),
            true,
        );
        assert!(
            !unavailable.lock().unwrap().contains_key(&2),
            "listed at last"
        );
    }

    /// Answers the requests of [`refusal_settled`]: `/readyz` with `ready`, then the
    /// list (if it comes) with `list`. Returns the paths asked.
    async fn settle(ready: u16, list: u16) -> (bool, Vec<String>) {
        let (service, mut handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let client = Client::new(service, "default");
        let resource = ApiResource::erase::<k8s_openapi::api::apps::v1::StatefulSet>(&());
        let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
        let answer = tokio::spawn(async move {
            let mut asked = vec![];
            while let Some((request, respond)) = handle.next_request().await {
                let path = request.uri().path().to_string();
                let code = if path == "/readyz" { ready } else { list };
                asked.push(path);
                let body = if code == 200 && asked.len() > 1 {
                    serde_json::json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": []})
                } else {
                    serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "message": "no", "reason": "Forbidden"})
                };
                respond.send_response(
                    http::Response::builder()
                        .status(code)
                        .body(kube::client::Body::from(body.to_string().into_bytes()))
                        .unwrap(),
                );
            }
            asked
        });
        let settled = refusal_settled(&client, &api, 403).await;
        drop(api);
        drop(client);
        (settled, answer.await.unwrap())
    }

    #[tokio::test]
    async fn a_refusal_counts_only_when_a_ready_member_refuses_again() {
        // A starting API server (RBAC not loaded): /readyz is not 200, nothing is listed.
        let (settled, asked) = settle(500, 403).await;
        assert!(!settled);
        assert_eq!(asked, ["/readyz"]);
        // Ready, and refused again: the member's settled answer.
        let (settled, asked) = settle(200, 403).await;
        assert!(settled);
        assert_eq!(asked, ["/readyz", "/apis/apps/v1/statefulsets"]);
        // Ready, and the list works now: the first refusal was the start's.
        let (settled, _) = settle(200, 200).await;
        assert!(!settled);
    }
}
