//! Member writers: one per member cluster, applying and deleting the hub's copies there.
//!
//! A reconcile decides what each member should hold and hands it over ([`Writers::want`]);
//! it never waits for a member. Each writer is a keyed queue (the latest wanted state of a
//! copy wins; a copy is written by one worker at a time) with bounded concurrency, so a
//! slow or cut-off member delays only its own copies. Failures are retried with
//! exponential backoff while the copy is still wanted. What each write returned is kept
//! ([`Writers::fresh`]): while the member's watch lags, the hub decides on the response,
//! not on the stale cache, and never writes the same thing twice.
//!
//! There is no read before an apply. An object of the same name that is not the hub's
//! (conflictResolution) is found by one metadata-only list per member, namespace and kind,
//! kept for a few seconds, so a burst into one namespace costs one list. A missing
//! namespace is created once, when an apply says it is missing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    Preconditions,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::api::propagation_policy::ConflictResolution;
use crate::api::{ANNOTATION_TEMPLATE_DELETED, LABEL_MANAGED_BY};
use crate::error::{ApiErrorKind, classify};
use crate::hub::Registry;
use crate::hub::federation::copies::{MANAGED_BY, Ownership, ownership};
use crate::hub::federation::copy_cache::Kinds;
use crate::hub::federation::queue::WorkQueue;
use crate::hub::membership::evidence::Evidence;

/// Field manager of the hub's member copies.
pub const FIELD_MANAGER: &str = "bulkhead-hub";

/// Copies a member writer writes at once (the member's bulk client allows as many
/// requests in flight). Fewer was measured: 8 made a burst's copies queue in the hub
/// (per-copy p99 3.8 s -> 8.6 s on the lab) and did not lower the hub's memory.
pub const WORKERS_PER_MEMBER: usize = crate::hub::membership::members::MAX_REQUESTS_IN_FLIGHT;

/// How long a write's response stands for a copy the member's watch does not show: the
/// watch lags a write by milliseconds, so past this the watch is believed (the copy was
/// deleted since).
const RESPONSE_OUTLIVES_WATCH: Duration = Duration::from_secs(10);

/// How long a list of a namespace's objects of one kind answers conflict checks.
const LIST_VALID: Duration = Duration::from_secs(5);

/// Backoff of a failed write: doubling from this...
const BACKOFF_START: Duration = Duration::from_millis(500);
/// ...up to this.
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// A template, and in a member the copy of it: kind (index into the hub's kinds),
/// namespace and name are the same on both sides.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub kind: usize,
    pub namespace: String,
    pub name: String,
}

/// What a member should do with a copy.
#[derive(Clone, Debug, PartialEq)]
pub enum CopyOp {
    /// Server-side apply of `object`.
    Apply {
        object: Value,
        /// The hub knows of no managed copy there: an object of the same name that is
        /// not the hub's is a conflict (unless `resolution` is Overwrite).
        check_conflict: bool,
        resolution: ConflictResolution,
        /// A stateful copy shrinks: every one of these clusters must be trusted right
        /// before the request is sent ([`confirm_trusted`]).
        guard: Vec<String>,
    },
    /// Delete the copy with this UID.
    Delete {
        uid: Option<String>,
        /// The user deleted the template: a stateful copy is marked first so its agent
        /// may apply `reclaimPolicy: Delete`.
        template_deleted: bool,
        /// A stateful copy leaves a placement: as for a shrink.
        guard: Vec<String>,
    },
}

impl CopyOp {
    fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        match self {
            CopyOp::Apply {
                object,
                check_conflict,
                resolution,
                guard,
            } => {
                "apply".hash(&mut hasher);
                guard.hash(&mut hasher);
                // Streamed into the hasher: every reconcile fingerprints each member's op
                // (twice), and a String of the whole copy per call was a measurable part
                // of a burst's allocations.
                let _ = serde_json::to_writer(HashWriter(&mut hasher), object);
                check_conflict.hash(&mut hasher);
                format!("{resolution:?}").hash(&mut hasher);
            }
            CopyOp::Delete {
                uid,
                template_deleted,
                guard,
            } => {
                "delete".hash(&mut hasher);
                guard.hash(&mut hasher);
                uid.hash(&mut hasher);
                template_deleted.hash(&mut hasher);
            }
        }
        hasher.finish()
    }

    /// The clusters that must be trusted right before the request (a stateful delete or
    /// shrink); empty for every other op.
    pub fn guard(&self) -> &[String] {
        match self {
            CopyOp::Apply { guard, .. } | CopyOp::Delete { guard, .. } => guard,
        }
    }

    fn verb(&self) -> &'static str {
        match self {
            CopyOp::Apply { .. } => "apply",
            CopyOp::Delete { .. } => "delete",
        }
    }
}

/// Feeds what is written into a hasher.
struct HashWriter<'a, H>(&'a mut H);

impl<H: std::hash::Hasher> std::io::Write for HashWriter<'_, H> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.write(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a member said to a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// An object of the same name is not the hub's; left untouched.
    Conflict(String),
    Failed(String),
}

/// What the member returned to the last write, newer than the watch may be.
#[derive(Clone, Debug)]
enum Fresh {
    Object(Arc<DynamicObject>),
    /// Deleted (gone at once, no finalizer held it), with the UID it had.
    Gone(Option<String>),
}

/// The state of one copy in a writer. A writer keeps one per copy it ever wrote, so a
/// settled copy's record is small (about 100 bytes, plus its key): what only a write on
/// its way needs is in [`Busy`], dropped once the write is done and the watch has caught
/// up with it.
#[derive(Clone, Debug)]
struct Record {
    fingerprint: u64,
    /// None while queued or being written.
    outcome: Option<Outcome>,
    finished: Option<Instant>,
    /// A hash of the copy's UID ([`uid_hash`]) and its generation after the hub's last
    /// apply: a later generation means someone changed the copy's spec in the member
    /// since.
    applied: Option<(u64, i64)>,
    /// Apply (not delete).
    is_apply: bool,
    /// Still wanted (false after [`Writers::forget`]): retries stop.
    wanted: bool,
    busy: Option<Box<Busy>>,
}

/// What a record holds only while its copy is being written or the watch lags.
#[derive(Clone, Debug, Default)]
struct Busy {
    /// The op to write; dropped once it is done (only its fingerprint is kept), so a
    /// settled hub does not hold a second copy of every body.
    op: Option<CopyOp>,
    /// What the member returned to the last write, until the watch has caught up.
    fresh: Option<Fresh>,
    attempts: u32,
}

impl Record {
    fn op(&self) -> Option<&CopyOp> {
        self.busy.as_ref()?.op.as_ref()
    }

    fn fresh(&self) -> Option<&Fresh> {
        self.busy.as_ref()?.fresh.as_ref()
    }

    fn attempts(&self) -> u32 {
        self.busy.as_ref().map_or(0, |b| b.attempts)
    }

    fn busy(&mut self) -> &mut Busy {
        self.busy.get_or_insert_with(Box::default)
    }

    /// Drops the busy part once nothing is left in it.
    fn tidy(&mut self) {
        if self
            .busy
            .as_ref()
            .is_some_and(|b| b.op.is_none() && b.fresh.is_none() && b.attempts == 0)
        {
            self.busy = None;
        }
    }

    fn set_fresh(&mut self, fresh: Option<Fresh>) {
        if fresh.is_some() || self.busy.is_some() {
            self.busy().fresh = fresh;
            self.tidy();
        }
    }

    /// Whether the hub's last apply left the copy with this UID and a generation for which
    /// `matches` holds.
    fn applied_to(&self, uid: Option<&str>, matches: impl Fn(i64) -> bool) -> bool {
        self.applied.is_some_and(|(written, generation)| {
            uid.is_some_and(|uid| uid_hash(uid) == written) && matches(generation)
        })
    }
}

/// A UID kept as a hash: a record compares UIDs, it never shows one (36 bytes and an
/// allocation a copy otherwise).
fn uid_hash(uid: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    uid.hash(&mut hasher);
    hasher.finish()
}

/// A finished write, reported to the federation controller.
#[derive(Clone, Debug)]
pub struct Completed {
    pub cluster: String,
    pub key: ObjectKey,
    pub verb: &'static str,
    pub outcome: Outcome,
}

/// What the federation controller learns from the writers about one copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyState {
    /// The op is the last one handed over (same fingerprint).
    pub current: bool,
    /// None while it waits or is being written.
    pub outcome: Option<Outcome>,
    /// Seconds since it finished.
    pub finished_ago: Option<Duration>,
    /// An apply is queued or being written (whatever is wanted now): a copy may appear.
    pub applying: bool,
}

/// When a namespace's objects of one kind were listed, and the names there that are not
/// the hub's copies, with their metadata as JSON.
type Listed = (Instant, HashMap<String, Value>);

/// A (kind, namespace) of a member: what one conflict list covers.
type Slot = (usize, String);

struct MemberWriter {
    cluster: String,
    queue: WorkQueue<ObjectKey>,
    records: Mutex<HashMap<ObjectKey, Record>>,
    /// (kind, namespace) -> when listed, and the names there that are not the hub's
    /// copies with their metadata as JSON.
    listed: Mutex<HashMap<Slot, Listed>>,
    /// (kind, namespace) -> the turn to list it: a burst's workers wait for the one list
    /// in flight and read its answer instead of each listing the namespace.
    listing: Mutex<HashMap<Slot, Arc<tokio::sync::Mutex<()>>>>,
    /// (kind, namespace) -> when its last list failed, and why: workers that waited for
    /// that list fail with it instead of each listing an unreachable member in turn.
    list_failed: Mutex<HashMap<Slot, (Instant, String)>>,
    namespaces: Mutex<HashSet<String>>,
}

impl MemberWriter {
    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, Record>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn all_writers(inner: &Inner) -> Vec<Arc<MemberWriter>> {
    inner
        .writers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .cloned()
        .collect()
}

/// Counts member API calls and times them (cluster, verb, ok, from sending to the answer).
pub type CallCounter = Arc<dyn Fn(&str, &str, bool, Duration) + Send + Sync>;

/// Every member's writer. Cheap to clone.
#[derive(Clone)]
pub struct Writers {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    /// What stateful deletes and shrinks check of every cluster involved.
    evidence: Evidence,
    /// Every write checks it first: a deposed leader's writers write nothing more.
    leadership: crate::leader::Leadership,
    kinds: Kinds,
    writers: Mutex<BTreeMap<String, Arc<MemberWriter>>>,
    completed: mpsc::UnboundedSender<Completed>,
    count_call: CallCounter,
    shutdown: CancellationToken,
}

impl Writers {
    /// Writers for the members of `registry`; finished writes are sent to `completed`.
    pub fn new(
        registry: Registry,
        evidence: Evidence,
        leadership: crate::leader::Leadership,
        kinds: Kinds,
        completed: mpsc::UnboundedSender<Completed>,
        count_call: CallCounter,
        shutdown: CancellationToken,
    ) -> Self {
        Writers {
            inner: Arc::new(Inner {
                registry,
                evidence,
                leadership,
                kinds,
                writers: Mutex::default(),
                completed,
                count_call,
                shutdown,
            }),
        }
    }

    fn writer(&self, cluster: &str) -> Arc<MemberWriter> {
        let mut writers = self.inner.writers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(writer) = writers.get(cluster) {
            return writer.clone();
        }
        let writer = Arc::new(MemberWriter {
            cluster: cluster.to_string(),
            queue: WorkQueue::default(),
            records: Mutex::default(),
            listed: Mutex::default(),
            listing: Mutex::default(),
            list_failed: Mutex::default(),
            namespaces: Mutex::default(),
        });
        for _ in 0..WORKERS_PER_MEMBER {
            tokio::spawn(work(self.inner.clone(), writer.clone()));
        }
        writers.insert(cluster.to_string(), writer.clone());
        writer
    }

    fn existing(&self, cluster: &str) -> Option<Arc<MemberWriter>> {
        self.inner
            .writers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(cluster)
            .cloned()
    }

    /// Hands `op` for `key` to `cluster`'s writer, unless the same op is already queued,
    /// being written, or being retried after a failure (the writer owns its retries), or
    /// it finished less than `again_after` ago (a member that rewrites a field the hub
    /// sets must not turn into a write loop). Returns whether it was queued.
    pub fn want(&self, cluster: &str, key: &ObjectKey, op: CopyOp, again_after: Duration) -> bool {
        let writer = self.writer(cluster);
        let fingerprint = op.fingerprint();
        {
            let mut records = writer.records();
            if let Some(record) = records.get_mut(key)
                && record.fingerprint == fingerprint
            {
                let was_wanted = std::mem::replace(&mut record.wanted, true);
                let recent = record.finished.is_some_and(|at| at.elapsed() < again_after);
                match &record.outcome {
                    None => return false,
                    Some(Outcome::Done) if recent => return false,
                    Some(Outcome::Done) => {}
                    // Its retry is scheduled (unless it was forgotten meanwhile).
                    Some(_) if was_wanted => return false,
                    Some(_) => {}
                }
            }
            let fresh = records.get(key).and_then(|r| r.fresh().cloned());
            let applied = records.get(key).and_then(|r| r.applied);
            let is_apply = matches!(op, CopyOp::Apply { .. });
            records.insert(
                key.clone(),
                Record {
                    fingerprint,
                    outcome: None,
                    finished: None,
                    applied,
                    is_apply,
                    wanted: true,
                    busy: Some(Box::new(Busy {
                        op: Some(op),
                        fresh,
                        attempts: 0,
                    })),
                },
            );
        }
        writer.queue.cancel_delayed(key);
        writer.queue.add(key.clone());
        true
    }

    /// The copy is no longer wanted in `cluster` (the plan has nothing to do there): a
    /// queued write or a pending retry does not run. What the last write returned is
    /// kept.
    pub fn forget(&self, cluster: &str, key: &ObjectKey) {
        if let Some(writer) = self.existing(cluster) {
            let mut records = writer.records();
            if let Some(record) = records.get_mut(key) {
                record.wanted = false;
                if record.outcome.is_some() {
                    writer.queue.cancel_delayed(key);
                }
            }
        }
    }

    /// Forgets everything about `key` in every member (the template is gone).
    pub fn forget_everywhere(&self, key: &ObjectKey) {
        for writer in all_writers(&self.inner) {
            let mut records = writer.records();
            if records.get(key).is_some_and(|r| r.outcome.is_some()) {
                records.remove(key);
                writer.queue.cancel_delayed(key);
            }
        }
    }

    /// The state of the last op handed over for `key` in `cluster`, judged against `op`
    /// (None: nothing to do there now).
    pub fn state(&self, cluster: &str, key: &ObjectKey, op: Option<&CopyOp>) -> Option<CopyState> {
        let writer = self.existing(cluster)?;
        let records = writer.records();
        let record = records.get(key)?;
        Some(CopyState {
            current: op.is_some_and(|op| op.fingerprint() == record.fingerprint),
            outcome: record.outcome.clone(),
            finished_ago: record.finished.map(|at| at.elapsed()),
            applying: record.outcome.is_none() && record.is_apply,
        })
    }

    /// The freshest copy the hub knows in `cluster`: what the member returned to the
    /// hub's last write when the watch (`cached`) has not caught up with it yet.
    pub fn fresh(
        &self,
        cluster: &str,
        key: &ObjectKey,
        cached: Option<Arc<DynamicObject>>,
    ) -> Option<Arc<DynamicObject>> {
        let Some(writer) = self.existing(cluster) else {
            return cached;
        };
        let mut records = writer.records();
        let Some(record) = records.get_mut(key) else {
            return cached;
        };
        match (record.fresh(), &cached) {
            (None, _) => cached,
            (Some(Fresh::Object(written)), Some(seen)) => {
                if newer_or_same(seen, written) {
                    record.set_fresh(None);
                    cached
                } else {
                    Some(written.clone())
                }
            }
            (Some(Fresh::Object(written)), None) => {
                // The watch has not shown the written copy yet. That is a lag for a
                // moment, never for long: a copy deleted in the member right after the
                // write (its Delete event may have come before this response was kept,
                // or been lost with a watch that died) must not live on in the response.
                if record
                    .finished
                    .is_some_and(|at| at.elapsed() > RESPONSE_OUTLIVES_WATCH)
                {
                    record.set_fresh(None);
                    None
                } else {
                    Some(written.clone())
                }
            }
            (Some(Fresh::Gone(uid)), Some(seen)) => {
                if seen.metadata.uid.is_some() && seen.metadata.uid != *uid {
                    // A new object since: the watch knows better.
                    record.set_fresh(None);
                    cached
                } else {
                    None
                }
            }
            (Some(Fresh::Gone(_)), None) => {
                record.set_fresh(None);
                None
            }
        }
    }

    /// The member's watch showed the copy of `key` with `uid` deleted: a response to an
    /// earlier write that returned that object no longer stands for it.
    pub fn seen_gone(&self, cluster: &str, key: &ObjectKey, uid: Option<&str>) {
        let Some(writer) = self.existing(cluster) else {
            return;
        };
        let mut records = writer.records();
        if let Some(record) = records.get_mut(key)
            && let Some(Fresh::Object(written)) = record.fresh()
            && (uid.is_none() || written.metadata.uid.as_deref() == uid)
        {
            record.set_fresh(None);
        }
    }

    /// Whether someone changed the spec of the hub's copy in `cluster` since the hub last
    /// applied it (its generation moved on). Known only for copies this hub applied.
    pub fn drifted(&self, cluster: &str, key: &ObjectKey, copy: &DynamicObject) -> bool {
        let Some(writer) = self.existing(cluster) else {
            return false;
        };
        let records = writer.records();
        records.get(key).is_some_and(|r| {
            r.applied_to(copy.metadata.uid.as_deref(), |generation| {
                copy.metadata.generation.is_some_and(|now| now > generation)
            })
        })
    }

    /// Whether the copy of `key` in `cluster` with this UID and generation is what the
    /// hub's last apply there returned, with nothing more to write.
    pub fn wrote(
        &self,
        cluster: &str,
        key: &ObjectKey,
        uid: Option<&str>,
        generation: Option<i64>,
    ) -> bool {
        let Some(writer) = self.existing(cluster) else {
            return false;
        };
        let records = writer.records();
        records.get(key).is_some_and(|r| {
            r.op().is_none()
                && r.outcome == Some(Outcome::Done)
                && r.applied_to(uid, |at| Some(at) == generation)
        })
    }

    /// Copies waiting, being written or scheduled for a retry, over every member.
    pub fn pending(&self) -> usize {
        all_writers(&self.inner)
            .iter()
            .map(|w| {
                w.records()
                    .values()
                    .filter(|r| r.outcome.is_none() && r.wanted)
                    .count()
            })
            .sum()
    }
}

/// Whether the watched object is at least as new as the written one (resourceVersions
/// are compared as numbers, which every Kubernetes API server uses; anything else is
/// taken as newer, so the watch wins).
fn newer_or_same(seen: &DynamicObject, written: &DynamicObject) -> bool {
    if seen.metadata.uid != written.metadata.uid {
        return true;
    }
    let version = |o: &DynamicObject| {
        o.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    match (version(seen), version(written)) {
        (Some(seen), Some(written)) => seen >= written,
        _ => true,
    }
}

fn backoff(attempts: u32) -> Duration {
    let factor = 2u32.saturating_pow(attempts.saturating_sub(1).min(16));
    BACKOFF_START.saturating_mul(factor).min(BACKOFF_MAX)
}

/// One worker of a member writer.
async fn work(inner: Arc<Inner>, writer: Arc<MemberWriter>) {
    while let Some(key) = writer.queue.next(&inner.shutdown).await {
        let op = {
            let mut records = writer.records();
            if records
                .get(&key)
                .is_some_and(|r| r.outcome.is_none() && !r.wanted)
            {
                // Forgotten before it ran: nothing to write, nothing to remember.
                records.remove(&key);
            }
            records
                .get(&key)
                .filter(|r| r.outcome.is_none())
                .and_then(|r| Some((r.op()?.clone(), r.fingerprint)))
        };
        if let Some((op, fingerprint)) = op {
            // A controller that ends (a lost leadership term, a new set of kinds) takes its
            // writes with it: what is on its way is abandoned, not finished later by a
            // writer that no longer checks anything.
            let executed = tokio::select! {
                _ = inner.shutdown.cancelled() => None,
                executed = execute(&inner, &writer, &key, &op) => Some(executed),
            };
            let Some((outcome, fresh, retry)) = executed else {
                writer.queue.done(&key);
                return;
            };
            let report = {
                let mut records = writer.records();
                match records.get_mut(&key) {
                    // A newer op replaced this one while it was written: it is queued.
                    Some(record) if record.fingerprint != fingerprint => None,
                    Some(record) => {
                        record.outcome = Some(outcome.clone());
                        record.finished = Some(Instant::now());
                        if let Some(Fresh::Object(written)) = &fresh
                            && matches!(op, CopyOp::Apply { .. })
                            && let Some(generation) = written.metadata.generation
                        {
                            record.applied = written
                                .metadata
                                .uid
                                .as_deref()
                                .map(|uid| (uid_hash(uid), generation));
                        }
                        if fresh.is_some() {
                            record.set_fresh(fresh);
                        }
                        if outcome == Outcome::Done {
                            if let Some(busy) = record.busy.as_mut() {
                                busy.attempts = 0;
                                busy.op = None;
                            }
                            record.tidy();
                        } else {
                            record.busy().attempts += 1;
                            if retry && record.wanted {
                                writer
                                    .queue
                                    .add_after(key.clone(), backoff(record.attempts()));
                                // Queued again: the retry runs when the delay is over.
                                record.outcome = Some(outcome.clone());
                            }
                        }
                        Some(outcome)
                    }
                    None => None,
                }
            };
            if let Some(outcome) = report {
                let _ = inner.completed.send(Completed {
                    cluster: writer.cluster.clone(),
                    key: key.clone(),
                    verb: op.verb(),
                    outcome,
                });
            }
        } else if let Some(record) = writer.records().get_mut(&key)
            && record.wanted
            && record.outcome.as_ref().is_some_and(|o| *o != Outcome::Done)
        {
            // A retry that came due: write again.
            record.outcome = None;
            writer.queue.add(key.clone());
        }
        writer.queue.done(&key);
    }
}

fn member_api(
    inner: &Inner,
    cluster: &str,
    key: &ObjectKey,
) -> Option<(Api<DynamicObject>, ApiResource)> {
    let resource = inner.kinds.get(key.kind)?.0.clone();
    let client = inner.registry.get(cluster)?.client()?.clone();
    Some((
        Api::namespaced_with(client, &key.namespace, &resource),
        resource,
    ))
}

/// Writes one op. Returns the outcome, what the member returned, and whether a failure
/// is worth retrying.
async fn execute(
    inner: &Inner,
    writer: &MemberWriter,
    key: &ObjectKey,
    op: &CopyOp,
) -> (Outcome, Option<Fresh>, bool) {
    let cluster = writer.cluster.as_str();
    if !inner.leadership.is_leader() {
        return (
            Outcome::Failed("this hub is not the leader; the leader writes the copies".into()),
            None,
            false,
        );
    }
    let Some((api, resource)) = member_api(inner, cluster, key) else {
        return (
            Outcome::Failed(format!("no credentials for {cluster}")),
            None,
            true,
        );
    };
    match op {
        CopyOp::Apply {
            object,
            check_conflict,
            resolution,
            guard,
        } => {
            if *check_conflict {
                match existing_unmanaged(inner, writer, key, &api).await {
                    Ok(Some(found)) => match ownership(Some(&found), *resolution, cluster) {
                        Ownership::Conflict(message) => {
                            return (Outcome::Conflict(message), None, true);
                        }
                        Ownership::TakeOver => {
                            tracing::info!(cluster, namespace = %key.namespace, name = %key.name, kind = %resource.kind, "taking over an unmanaged object (conflictResolution: Overwrite)");
                        }
                        Ownership::Apply => {}
                    },
                    Ok(None) => {}
                    Err(why) => {
                        return (
                            Outcome::Failed(format!(
                                "cannot list the {} objects in {cluster}: {why}",
                                resource.kind,
                            )),
                            None,
                            true,
                        );
                    }
                }
            }
            if let Err(held) = confirm_trusted(inner, guard).await {
                return held;
            }
            // A stateful copy is written only over the copy as it is now: the plan was
            // made from the hub's cache, which may not have seen a change of the copy's
            // replicas yet (a person's `kubectl scale` in the member, a watch that had
            // not caught up after a partition). An apply that would lower what the copy
            // holds now, and that the plan did not judge (and guard) as a shrink, is not
            // sent: the copy as read goes back to the planner, which judges it again.
            // A write over the copy as read fails (409) when the copy changed in between:
            // its agent's status reports do, every second during a switchover. A write
            // that shrinks nothing reads the copy again and is sent again at once (a
            // shrink goes back to the planner).
            let mut attempts = 0;
            loop {
                let object =
                    match live_precondition(inner, key, &api, object, guard.is_empty()).await {
                        Ok(object) => object,
                        Err(outcome) => return outcome,
                    };
                let mut failed_as = None;
                let outcome =
                    apply(inner, writer, key, &api, &resource, &object, &mut failed_as).await;
                attempts += 1;
                let conditional = matches!(object, std::borrow::Cow::Owned(_));
                if !(conditional
                    && guard.is_empty()
                    && failed_as == Some(ApiErrorKind::Conflict)
                    && attempts < CONFLICT_ATTEMPTS)
                {
                    return outcome;
                }
                tracing::debug!(cluster, namespace = %key.namespace, name = %key.name, attempts, "the copy changed while the hub wrote it; reading it again");
            }
        }
        CopyOp::Delete {
            uid,
            template_deleted,
            guard,
        } => {
            if let Err(held) = confirm_trusted(inner, guard).await {
                return held;
            }
            delete(inner, cluster, key, &api, &resource, uid, *template_deleted).await
        }
    }
}

/// For a stateful divisible kind: reads the copy right before the apply. When the apply
/// would lower its replicas and was not planned (and guarded) as a shrink (`unguarded`),
/// nothing is sent and the copy as read is returned as fresh (the planner judges it
/// again, under the partition rules); otherwise the apply carries the copy's
/// resourceVersion, so a change between the read and the write fails it (409) instead
/// of being overwritten. Other kinds, and copies that do not exist, are applied as they
/// are.
async fn live_precondition<'a>(
    inner: &Inner,
    key: &ObjectKey,
    api: &Api<DynamicObject>,
    object: &'a Value,
    unguarded: bool,
) -> Result<std::borrow::Cow<'a, Value>, (Outcome, Option<Fresh>, bool)> {
    use std::borrow::Cow;
    let Some((_, interpretation)) = inner.kinds.get(key.kind) else {
        return Ok(Cow::Borrowed(object));
    };
    if !(interpretation.stateful && interpretation.divisible()) {
        return Ok(Cow::Borrowed(object));
    }
    let live = match api.get_opt(&key.name).await {
        Ok(Some(live)) => live,
        Ok(None) => return Ok(Cow::Borrowed(object)),
        Err(error) => {
            return Err((
                Outcome::Failed(format!(
                    "cannot read the copy before writing it: {}",
                    short(&error)
                )),
                None,
                true,
            ));
        }
    };
    let wanted = interpretation.replicas_of(object);
    let now = interpretation.replicas_of(&live.data);
    if unguarded
        && let (Some(wanted), Some(now)) = (wanted, now)
        && now > wanted
    {
        tracing::info!(namespace = %key.namespace, name = %key.name, now, wanted, "the copy holds more replicas than the plan saw; planning again");
        let mut fresh = live;
        crate::hub::federation::copy_cache::slim_copy(&mut fresh, interpretation);
        return Err((
            Outcome::Failed(format!(
                "the copy holds {now} replicas now, more than the plan saw: planning again from the copy as it is"
            )),
            Some(Fresh::Object(Arc::new(fresh))),
            true,
        ));
    }
    let mut object = object.clone();
    if let Some(version) = live.metadata.resource_version {
        object["metadata"]["resourceVersion"] = Value::String(version);
    }
    Ok(Cow::Owned(object))
}

/// How often [`confirm_trusted`] looks again while a renewal may be on its way.
const TRUST_RECHECK: Duration = Duration::from_millis(100);

/// The chokepoint of every stateful delete and shrink (DESIGN.md section 5, "The hub
/// suspects before any agent fences"): right before the request, each cluster of
/// `clusters` (the template's current and new placement) is probed again, and must have
/// fresh positive evidence: that probe, a fencing-lease renewal within the renew interval
/// and copies listed since it was last suspect. A renewal may be on its way, so the
/// check is repeated for up to one renew interval before it gives up. Empty: nothing to
/// check. On failure the op is held back (retried with backoff while still wanted).
async fn confirm_trusted(
    inner: &Inner,
    clusters: &[String],
) -> Result<(), (Outcome, Option<Fresh>, bool)> {
    if clusters.is_empty() {
        return Ok(());
    }
    let renew_interval = inner.evidence.renew_interval();
    let probe_timeout = renew_interval.min(PROBE_TIMEOUT);
    let probes = clusters.iter().map(|cluster| async move {
        let ok = match inner
            .registry
            .get(cluster)
            .and_then(|m| m.control_client().cloned())
        {
            Some(client) => matches!(
                crate::hub::membership::prober::probe_readyz(&client, probe_timeout).await,
                crate::hub::membership::health::ProbeOutcome::Healthy
            ),
            None => false,
        };
        inner.evidence.probed(cluster, ok);
    });
    futures::future::join_all(probes).await;
    let deadline = Instant::now() + renew_interval;
    loop {
        let doubt = clusters.iter().find_map(|cluster| {
            if inner.registry.get(cluster).is_none() {
                return Some(format!("{cluster} is not a member any more"));
            }
            inner
                .evidence
                .doubt_strict(cluster, probe_timeout + TRUST_RECHECK)
        });
        let Some(doubt) = doubt else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            tracing::info!(clusters = ?clusters, %doubt, "a stateful delete or shrink is held back");
            return Err((
                Outcome::Failed(format!(
                    "held back: {doubt}; a stateful copy is deleted or shrunk only while every cluster of its placement is trusted"
                )),
                None,
                true,
            ));
        }
        tokio::time::sleep(TRUST_RECHECK).await;
    }
}

/// The longest the chokepoint's own probe of a member may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The object of `key`'s name in the member when it is not one of the hub's copies, from
/// a recent metadata-only list of its namespace. One list per (kind, namespace) at a
/// time: workers that need it while it is in flight wait for it and read its answer.
async fn existing_unmanaged(
    inner: &Inner,
    writer: &MemberWriter,
    key: &ObjectKey,
    api: &Api<DynamicObject>,
) -> Result<Option<Value>, String> {
    let slot = (key.kind, key.namespace.clone());
    let cached = || {
        let listed = writer.listed.lock().unwrap_or_else(|p| p.into_inner());
        listed
            .get(&slot)
            .filter(|(at, _)| at.elapsed() < LIST_VALID)
            .map(|(_, names)| names.get(&key.name).cloned())
    };
    if let Some(found) = cached() {
        return Ok(found);
    }
    let turn = writer
        .listing
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(slot.clone())
        .or_default()
        .clone();
    let waited_from = Instant::now();
    let _turn = turn.lock().await;
    if let Some(found) = cached() {
        return Ok(found);
    }
    let failed_meanwhile = writer
        .list_failed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&slot)
        .filter(|(at, _)| *at >= waited_from)
        .map(|(_, why)| why.clone());
    if let Some(why) = failed_meanwhile {
        return Err(why);
    }
    let kind = inner
        .kinds
        .get(key.kind)
        .map(|(r, _)| r.kind.clone())
        .unwrap_or_default();
    let names = match list_unmanaged(inner, writer, api, &kind, &key.namespace).await {
        Ok(names) => names,
        Err(error) => {
            let why = short(&error);
            writer
                .list_failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(slot, (Instant::now(), why.clone()));
            return Err(why);
        }
    };
    let found = names.get(&key.name).cloned();
    writer
        .listed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(slot, (Instant::now(), names));
    Ok(found)
}

/// Objects a list of a namespace's conflicts asks for per page.
const CONFLICT_LIST_PAGE: u32 = 500;

/// The label selector of the objects that are not the hub's copies: without the label or
/// with another value (`!=` matches both). The API server filters, so a namespace that
/// holds only the hub's copies answers with an empty list, however many copies it holds.
fn unmanaged_selector() -> String {
    format!("{LABEL_MANAGED_BY}!={MANAGED_BY}")
}

/// Names and metadata (as JSON) of the namespace's objects that are not the hub's copies,
/// read page by page.
async fn list_unmanaged(
    inner: &Inner,
    writer: &MemberWriter,
    api: &Api<DynamicObject>,
    kind: &str,
    namespace: &str,
) -> Result<HashMap<String, Value>, kube::Error> {
    let mut names = HashMap::new();
    let mut params = ListParams::default()
        .labels(&unmanaged_selector())
        .limit(CONFLICT_LIST_PAGE);
    loop {
        let sent = Instant::now();
        let page = api.list_metadata(&params).await;
        (inner.count_call)(&writer.cluster, "list", page.is_ok(), sent.elapsed());
        let page = page?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        for o in page.items {
            // The server filtered already; this keeps the rule in one place if it did not.
            if o.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_MANAGED_BY))
                .map(String::as_str)
                == Some(MANAGED_BY)
            {
                continue;
            }
            let name = o.metadata.name.clone().unwrap_or_default();
            let value = json!({
                "kind": kind,
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": o.metadata.labels,
                },
            });
            names.insert(name, value);
        }
        match next {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(names),
        }
    }
}

/// How often a write over the copy as read is tried when the copy keeps changing in
/// between (then the next reconcile tries again).
const CONFLICT_ATTEMPTS: u32 = 3;

/// Applies `object`; `failed_as` is set to the kind of the member's answer when it failed.
async fn apply(
    inner: &Inner,
    writer: &MemberWriter,
    key: &ObjectKey,
    api: &Api<DynamicObject>,
    resource: &ApiResource,
    object: &Value,
    failed_as: &mut Option<ApiErrorKind>,
) -> (Outcome, Option<Fresh>, bool) {
    let cluster = writer.cluster.as_str();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut sent = Instant::now();
    let mut result = api.patch(&key.name, &params, &Patch::Apply(object)).await;
    let namespace_known = writer
        .namespaces
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&key.namespace);
    if let Err(error) = &result
        && classify(error) == ApiErrorKind::NotFound
    {
        (inner.count_call)(cluster, "apply", false, sent.elapsed());
        if !namespace_known && ensure_namespace(inner, cluster, &key.namespace).await {
            sent = Instant::now();
            result = api.patch(&key.name, &params, &Patch::Apply(object)).await;
        }
    }
    (inner.count_call)(cluster, "apply", result.is_ok(), sent.elapsed());
    match result {
        Ok(mut written) => {
            writer
                .namespaces
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.namespace.clone());
            if let Some((_, interpretation)) = inner.kinds.get(key.kind) {
                crate::hub::federation::copy_cache::slim_copy(&mut written, interpretation);
            }
            (Outcome::Done, Some(Fresh::Object(Arc::new(written))), false)
        }
        Err(error) => {
            let kind = classify(&error);
            *failed_as = Some(kind);
            tracing::warn!(cluster, namespace = %key.namespace, name = %key.name, kind = %resource.kind, error = %short(&error), "cannot apply the copy");
            if kind == ApiErrorKind::NotFound {
                // The namespace may have gone since: look again next time.
                writer
                    .namespaces
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&key.namespace);
            }
            (
                Outcome::Failed(format!(
                    "apply failed in {cluster}: {}{}",
                    short(&error),
                    apply_hint(cluster, resource, kind)
                )),
                None,
                true,
            )
        }
    }
}

/// What a user can do about a failed apply of a kind the member may not serve, or may
/// not let the hub write.
fn apply_hint(cluster: &str, resource: &ApiResource, kind: ApiErrorKind) -> String {
    let resource_name = if resource.group.is_empty() {
        resource.plural.clone()
    } else {
        format!("{}.{}", resource.plural, resource.group)
    };
    match kind {
        ApiErrorKind::NotFound => format!(
            " (the namespace is created on demand; if it exists, {cluster} may not serve {} {}: install its CRD there)",
            resource.api_version, resource.kind
        ),
        ApiErrorKind::Forbidden => format!(
            " (the hub's role in {cluster} does not cover {resource_name}: run `bulkhead join {cluster} ... --federate {resource_name}` again)"
        ),
        _ => String::new(),
    }
}

/// Creates the namespace in the member (create, not apply: the hub may create
/// namespaces but never changes one it did not make).
/// Creates a namespace for the hub's objects in a member; one that exists is fine.
pub(crate) async fn create_namespace(
    client: kube::Client,
    namespace: &str,
) -> Result<(), kube::Error> {
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
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(error) if classify(&error) == ApiErrorKind::Conflict => Ok(()),
        Err(error) => Err(error),
    }
}

async fn ensure_namespace(inner: &Inner, cluster: &str, namespace: &str) -> bool {
    let Some(client) = inner
        .registry
        .get(cluster)
        .and_then(|h| h.client().cloned())
    else {
        return false;
    };
    let sent = Instant::now();
    let result = create_namespace(client, namespace).await;
    let ok = result.is_ok();
    (inner.count_call)(cluster, "create_namespace", ok, sent.elapsed());
    if let Err(error) = &result {
        tracing::warn!(cluster, namespace, error = %short(error), "cannot create the namespace");
    }
    ok
}

async fn delete(
    inner: &Inner,
    cluster: &str,
    key: &ObjectKey,
    api: &Api<DynamicObject>,
    resource: &ApiResource,
    uid: &Option<String>,
    template_deleted: bool,
) -> (Outcome, Option<Fresh>, bool) {
    let stateful = inner.kinds.get(key.kind).is_some_and(|(_, i)| i.stateful);
    if template_deleted && stateful {
        // The user deleted the template: say so on the copy, so its agent may apply
        // `reclaimPolicy: Delete`. A copy deleted without this mark keeps its volumes.
        // The UID makes the mark a precondition: a new object of the same name (the copy
        // was replaced since) is never marked; the API server refuses the change of UID.
        let mark = match uid {
            Some(uid) => {
                json!({"metadata": {"uid": uid, "annotations": {ANNOTATION_TEMPLATE_DELETED: "true"}}})
            }
            None => json!({"metadata": {"annotations": {ANNOTATION_TEMPLATE_DELETED: "true"}}}),
        };
        let sent = Instant::now();
        let marked = api
            .patch(&key.name, &PatchParams::default(), &Patch::Merge(&mark))
            .await;
        (inner.count_call)(cluster, "mark_deleted", marked.is_ok(), sent.elapsed());
        match marked {
            Ok(_) => {}
            Err(error) if classify(&error) == ApiErrorKind::NotFound => {
                return (Outcome::Done, Some(Fresh::Gone(uid.clone())), false);
            }
            // Another object holds the name now: the copy with our UID is gone.
            Err(error)
                if uid.is_some()
                    && matches!(
                        classify(&error),
                        ApiErrorKind::Invalid | ApiErrorKind::Conflict
                    ) =>
            {
                return (Outcome::Done, Some(Fresh::Gone(uid.clone())), false);
            }
            Err(error) => {
                return (
                    Outcome::Failed(format!(
                        "cannot mark the copy in {cluster} as deleted by the user: {}",
                        short(&error)
                    )),
                    None,
                    true,
                );
            }
        }
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    let sent = Instant::now();
    let result = api.delete(&key.name, &params).await;
    (inner.count_call)(cluster, "delete", result.is_ok(), sent.elapsed());
    match result {
        Ok(either) => {
            tracing::info!(cluster, namespace = %key.namespace, name = %key.name, kind = %resource.kind, "deleted the copy");
            let fresh = match either {
                either::Either::Left(mut object) => {
                    if let Some((_, interpretation)) = inner.kinds.get(key.kind) {
                        crate::hub::federation::copy_cache::slim_copy(&mut object, interpretation);
                    }
                    Fresh::Object(Arc::new(object))
                }
                either::Either::Right(_) => Fresh::Gone(uid.clone()),
            };
            (Outcome::Done, Some(fresh), false)
        }
        Err(error)
            if matches!(
                classify(&error),
                ApiErrorKind::NotFound | ApiErrorKind::Conflict
            ) =>
        {
            (Outcome::Done, Some(Fresh::Gone(uid.clone())), false)
        }
        Err(error) => (
            Outcome::Failed(format!("delete failed in {cluster}: {}", short(&error))),
            None,
            true,
        ),
    }
}

/// An API error's message without the whole Status dump.
pub fn short(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MemberCluster;
    use crate::hub::membership::members::{MemberConnection, MemberHandle};
    use kube::client::Body;

    type Handle = tower_test::mock::Handle<http::Request<Body>, http::Response<Body>>;

    /// Writers for one member, "east", whose API server is a mock.
    fn writers_with_mock() -> (Writers, Handle, mpsc::UnboundedReceiver<Completed>) {
        writers_with_evidence(Evidence::default())
    }

    /// [`writers_with_mock`], judging stateful deletes and shrinks by `evidence`.
    fn writers_with_evidence(
        evidence: Evidence,
    ) -> (Writers, Handle, mpsc::UnboundedReceiver<Completed>) {
        writers_of(
            evidence,
            ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            "v1",
            "ConfigMap",
        )
    }

    /// The mock writers of one kind.
    fn writers_of(
        evidence: Evidence,
        resource: ApiResource,
        api_version: &str,
        kind: &str,
    ) -> (Writers, Handle, mpsc::UnboundedReceiver<Completed>) {
        let (service, handle) =
            tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let client = kube::Client::new(service, "default");
        let object: MemberCluster = serde_json::from_value(json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "MemberCluster",
            "metadata": {"name": "east"},
            "spec": {"secretRef": {"namespace": "bulkhead-system", "name": "member-east"}, "zone": "zone-a"}
        }))
        .unwrap();
        let registry = Registry::default();
        registry.publish(HashMap::from([(
            "east".to_string(),
            MemberHandle {
                name: "east".into(),
                zone: "zone-a".into(),
                region: None,
                probe: object.spec.probe.clone(),
                object: Arc::new(object),
                connection: Ok(MemberConnection {
                    client: client.clone(),
                    control: client,
                    server: "https://east".into(),
                    secret_version: "1".into(),
                    kubeconfig: Arc::from(""),
                }),
            },
        )]));
        let (completed, receiver) = mpsc::unbounded_channel();
        let kinds: Kinds = Arc::from(vec![(
            resource,
            crate::hub::federation::interpreter::Interpreters::built_in().get(api_version, kind),
        )]);
        let writers = Writers::new(
            registry,
            evidence,
            crate::leader::Leadership::always(),
            kinds,
            completed,
            Arc::new(|_: &str, _: &str, _: bool, _: Duration| {}),
            CancellationToken::new(),
        );
        (writers, handle, receiver)
    }

    fn respond(
        respond: tower_test::mock::SendResponse<http::Response<Body>>,
        status: u16,
        body: Value,
    ) {
        respond.send_response(
            http::Response::builder()
                .status(status)
                .body(Body::from(body.to_string().into_bytes()))
                .unwrap(),
        );
    }

    async fn json_body(request: http::Request<Body>) -> Value {
        let bytes = http_body_util::BodyExt::collect(request.into_body())
            .await
            .unwrap()
            .to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    fn not_found() -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "namespaces \"shop\" not found"})
    }

    fn config_map(version: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "settings", "namespace": "shop", "uid": "u1", "resourceVersion": version,
                            "labels": {LABEL_MANAGED_BY: MANAGED_BY}}})
    }

    fn key() -> ObjectKey {
        ObjectKey {
            kind: 0,
            namespace: "shop".into(),
            name: "settings".into(),
        }
    }

    fn apply(check_conflict: bool) -> CopyOp {
        CopyOp::Apply {
            object: config_map("0"),
            check_conflict,
            resolution: ConflictResolution::Abort,
            guard: vec![],
        }
    }

    fn statefulset(replicas: i32, version: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
               "metadata": {"name": "settings", "namespace": "shop", "uid": "u1", "resourceVersion": version,
                            "labels": {LABEL_MANAGED_BY: MANAGED_BY}},
               "spec": {"replicas": replicas}})
    }

    #[tokio::test]
    async fn a_stateful_apply_is_judged_against_the_copy_as_it_is_right_before_the_write() {
        let (writers, mut server, mut completed) = writers_of(
            Evidence::default(),
            ApiResource::erase::<k8s_openapi::api::apps::v1::StatefulSet>(&()),
            "apps/v1",
            "StatefulSet",
        );
        let op = |replicas: i32| CopyOp::Apply {
            object: statefulset(replicas, "0"),
            check_conflict: false,
            resolution: ConflictResolution::Abort,
            guard: vec![],
        };
        // The plan saw 1 and applies 1; someone scaled the copy to 2 since: not sent.
        assert!(writers.want("east", &key(), op(1), REWRITE));
        let (request, reply) = server.next_request().await.unwrap();
        assert_eq!(
            (request.method(), request.uri().path()),
            (
                &http::Method::GET,
                "/apis/apps/v1/namespaces/shop/statefulsets/settings"
            )
        );
        respond(reply, 200, statefulset(2, "7"));
        let done = completed.recv().await.unwrap();
        assert!(
            matches!(&done.outcome, Outcome::Failed(m) if m.contains("holds 2 replicas now")),
            "{:?}",
            done.outcome
        );
        assert!(nothing_sent(&mut server).await, "no PATCH");
        // The copy as read is what the planner sees next.
        let fresh = writers.fresh("east", &key(), None).unwrap();
        assert_eq!(fresh.metadata.resource_version.as_deref(), Some("7"));
        // An apply that lowers nothing goes out, over the version it was judged against.
        assert!(writers.want("east", &key(), op(3), REWRITE));
        let (request, reply) = server.next_request().await.unwrap();
        assert_eq!(request.method(), http::Method::GET);
        respond(reply, 200, statefulset(2, "8"));
        let (request, reply) = server.next_request().await.unwrap();
        assert_eq!(request.method(), http::Method::PATCH);
        let body = json_body(request).await;
        assert_eq!(body["metadata"]["resourceVersion"], "8");
        assert_eq!(body["spec"]["replicas"], 3);
        respond(reply, 200, statefulset(3, "9"));
        assert_eq!(completed.recv().await.unwrap().outcome, Outcome::Done);
    }

    /// The copy changes between the read and the write (its agent's status report): the
    /// write fails 409 and is sent again at once over the copy read again; a copy that
    /// keeps changing gives up after CONFLICT_ATTEMPTS and the next reconcile tries.
    #[tokio::test]
    async fn a_stateful_apply_over_a_copy_that_changed_meanwhile_reads_it_again() {
        let (writers, mut server, mut completed) = writers_of(
            Evidence::default(),
            ApiResource::erase::<k8s_openapi::api::apps::v1::StatefulSet>(&()),
            "apps/v1",
            "StatefulSet",
        );
        let conflict = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "Conflict", "code": 409,
            "message": "Operation cannot be fulfilled on statefulsets.apps \"settings\": the object has been modified"});
        let op = CopyOp::Apply {
            object: statefulset(3, "0"),
            check_conflict: false,
            resolution: ConflictResolution::Abort,
            guard: vec![],
        };
        assert!(writers.want("east", &key(), op, REWRITE));
        for (version, status) in [("7", 409), ("8", 200)] {
            let (request, reply) = server.next_request().await.unwrap();
            assert_eq!(request.method(), http::Method::GET);
            respond(reply, 200, statefulset(2, version));
            let (request, reply) = server.next_request().await.unwrap();
            assert_eq!(request.method(), http::Method::PATCH);
            let body = json_body(request).await;
            assert_eq!(body["metadata"]["resourceVersion"], version);
            match status {
                409 => respond(reply, 409, conflict.clone()),
                _ => respond(reply, 200, statefulset(3, "9")),
            }
        }
        assert_eq!(completed.recv().await.unwrap().outcome, Outcome::Done);

        // Changing every time: given up after CONFLICT_ATTEMPTS writes.
        let op = CopyOp::Apply {
            object: statefulset(4, "0"),
            check_conflict: false,
            resolution: ConflictResolution::Abort,
            guard: vec![],
        };
        assert!(writers.want("east", &key(), op, REWRITE));
        for attempt in 0..CONFLICT_ATTEMPTS {
            let (_, reply) = server.next_request().await.unwrap();
            respond(reply, 200, statefulset(2, &format!("{}", 20 + attempt)));
            let (_, reply) = server.next_request().await.unwrap();
            respond(reply, 409, conflict.clone());
        }
        let done = completed.recv().await.unwrap();
        assert!(
            matches!(&done.outcome, Outcome::Failed(m) if m.contains("(409)")),
            "{:?}",
            done.outcome
        );
    }

    #[tokio::test]
    async fn a_first_apply_lists_once_creates_the_missing_namespace_and_applies_again() {
        let (writers, mut server, mut completed) = writers_with_mock();
        assert!(writers.want("east", &key(), apply(true), REWRITE));
        // The conflict check: one metadata list of the namespace's ConfigMaps, no GET.
        let (request, reply) = server.next_request().await.unwrap();
        assert_eq!(request.method(), http::Method::GET);
        assert_eq!(request.uri().path(), "/api/v1/namespaces/shop/configmaps");
        respond(
            reply,
            200,
            json!({"apiVersion": "v1", "kind": "PartialObjectMetadataList", "metadata": {}, "items": []}),
        );
        let (request, reply) = server.next_request().await.unwrap();
        assert_eq!(request.method(), http::Method::PATCH);
        respond(reply, 404, not_found());
        let (request, reply) = server.next_request().await.unwrap();
        assert_eq!(
            (request.method(), request.uri().path()),
            (&http::Method::POST, "/api/v1/namespaces")
        );
        respond(
            reply,
            201,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
        );
        let (request, reply) = server.next_request().await.unwrap();
        assert_eq!(request.method(), http::Method::PATCH);
        assert_eq!(
            request.uri().path(),
            "/api/v1/namespaces/shop/configmaps/settings"
        );
        assert!(
            !writers.wrote("east", &key(), Some("u1"), Some(1)),
            "not yet"
        );
        let mut written = config_map("12");
        written["metadata"]["generation"] = json!(1);
        respond(reply, 200, written);
        let done = completed.recv().await.unwrap();
        assert_eq!(
            (done.cluster.as_str(), done.outcome),
            ("east", Outcome::Done)
        );
        // What the member returned answers for the copy until the watch catches up, and
        // its echo is known as the hub's own write.
        let fresh = writers.fresh("east", &key(), None).unwrap();
        assert_eq!(fresh.metadata.resource_version.as_deref(), Some("12"));
        assert!(writers.wrote("east", &key(), Some("u1"), Some(1)));
        assert!(
            !writers.wrote("east", &key(), Some("u1"), Some(2)),
            "changed since"
        );
        assert!(
            !writers.wrote("east", &key(), Some("u2"), Some(1)),
            "another copy"
        );
        assert!(!writers.wrote("west", &key(), Some("u1"), Some(1)));
        // The same op again is not written again (it is done, and recent).
        assert!(!writers.want("east", &key(), apply(true), REWRITE));
        assert_eq!(writers.pending(), 0);
    }

    /// The next request, which must be the conflict list of shop's ConfigMaps: returns
    /// its query and the reply handle.
    async fn next_list(
        server: &mut Handle,
    ) -> (String, tower_test::mock::SendResponse<http::Response<Body>>) {
        let (request, reply) = server.next_request().await.unwrap();
        assert_eq!(request.method(), http::Method::GET);
        assert_eq!(request.uri().path(), "/api/v1/namespaces/shop/configmaps");
        (request.uri().query().unwrap_or_default().to_string(), reply)
    }

    fn other() -> ObjectKey {
        ObjectKey {
            name: "other".into(),
            ..key()
        }
    }

    async fn nothing_sent(server: &mut Handle) -> bool {
        tokio::time::timeout(Duration::from_millis(100), server.next_request())
            .await
            .is_err()
    }

    #[tokio::test]
    async fn a_burst_into_one_namespace_waits_for_one_paged_list_of_what_is_not_the_hubs() {
        let (writers, mut server, mut completed) = writers_with_mock();
        writers.want("east", &key(), apply(true), REWRITE);
        writers.want("east", &other(), apply(true), REWRITE);
        // The API server filters: only objects without the managed-by label or with
        // another value, 500 a page.
        let (query, reply) = next_list(&mut server).await;
        assert!(
            query.contains("labelSelector=federation.example.com%2Fmanaged-by%21%3Dbulkhead"),
            "{query}"
        );
        assert!(query.contains("limit=500"), "{query}");
        // The second copy's worker waits for this list instead of sending its own.
        assert!(nothing_sent(&mut server).await);
        respond(
            reply,
            200,
            json!({"apiVersion": "v1", "kind": "PartialObjectMetadataList", "metadata": {"continue": "page-2"}, "items": []}),
        );
        let (query, reply) = next_list(&mut server).await;
        assert!(query.contains("continue=page-2"), "{query}");
        respond(
            reply,
            200,
            json!({"apiVersion": "v1", "kind": "PartialObjectMetadataList", "metadata": {},
                   "items": [{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                              "metadata": {"name": "other", "namespace": "shop", "labels": {LABEL_MANAGED_BY: "someone-else"}}}]}),
        );
        // One copy is applied; the other is a conflict found on the second page, with no
        // list of its own.
        let (request, reply) = server.next_request().await.unwrap();
        assert_eq!(request.method(), http::Method::PATCH);
        assert_eq!(
            request.uri().path(),
            "/api/v1/namespaces/shop/configmaps/settings"
        );
        respond(reply, 200, config_map("7"));
        let mut outcomes = [
            completed.recv().await.unwrap(),
            completed.recv().await.unwrap(),
        ];
        outcomes.sort_by(|a, b| a.key.name.cmp(&b.key.name));
        assert!(
            matches!(&outcomes[0].outcome, Outcome::Conflict(m) if m.contains("not managed by Bulkhead")),
            "{:?}",
            outcomes[0]
        );
        assert_eq!(outcomes[1].outcome, Outcome::Done);
        assert!(nothing_sent(&mut server).await);
    }

    #[tokio::test]
    async fn workers_that_waited_for_a_failed_list_fail_with_it_without_listing_again() {
        let (writers, mut server, mut completed) = writers_with_mock();
        writers.want("east", &key(), apply(true), REWRITE);
        writers.want("east", &other(), apply(true), REWRITE);
        let (_, reply) = next_list(&mut server).await;
        respond(
            reply,
            503,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "unavailable", "code": 503}),
        );
        for _ in 0..2 {
            let done = completed.recv().await.unwrap();
            assert!(
                matches!(&done.outcome, Outcome::Failed(m) if m.contains("cannot list the ConfigMap objects in east")),
                "{:?}",
                done.outcome
            );
        }
        // Both retry later (backoff), not at once.
        assert!(nothing_sent(&mut server).await);
    }

    #[tokio::test]
    async fn an_object_that_is_not_the_hubs_is_a_conflict_and_left_untouched() {
        let (writers, mut server, mut completed) = writers_with_mock();
        writers.want("east", &key(), apply(true), REWRITE);
        let (_, reply) = server.next_request().await.unwrap();
        respond(
            reply,
            200,
            json!({"apiVersion": "v1", "kind": "PartialObjectMetadataList", "metadata": {},
                   "items": [{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                              "metadata": {"name": "settings", "namespace": "shop", "labels": {"team": "a"}}}]}),
        );
        let done = completed.recv().await.unwrap();
        assert!(
            matches!(&done.outcome, Outcome::Conflict(message) if message.contains("not managed by Bulkhead")),
            "{:?}",
            done.outcome
        );
        // No apply was sent.
        assert!(
            tokio::time::timeout(Duration::from_millis(100), server.next_request())
                .await
                .is_err()
        );
    }

    /// The next request is the chokepoint's probe of `/readyz`: answer it healthy.
    async fn answer_probe(server: &mut Handle) {
        let (request, reply) = server.next_request().await.unwrap();
        assert_eq!(request.uri().path(), "/readyz", "the writer probes first");
        reply.send_response(
            http::Response::builder()
                .body(Body::from(b"ok".to_vec()))
                .unwrap(),
        );
    }

    /// The next finished write was held back, saying `why`.
    async fn held_back(completed: &mut mpsc::UnboundedReceiver<Completed>, why: &str) {
        let done = completed.recv().await.unwrap();
        assert!(
            matches!(&done.outcome, Outcome::Failed(message) if message.contains(why)),
            "{:?}",
            done.outcome
        );
    }

    /// The chokepoint: a stateful delete probes every cluster of the placement right
    /// before the request and is held back while one of them lacks fresh positive
    /// evidence (here: the fencing-lease renewal failed), whatever the plan decided.
    #[tokio::test]
    async fn a_stateful_delete_is_held_back_until_every_cluster_is_trusted_again() {
        // Freshness far above the renewals' 50 ms: a loaded test machine that stalls the
        // renewer for a few hundred ms must not make the last step's evidence stale.
        let evidence = Evidence::new(Duration::from_secs(3));
        let (writers, mut server, mut completed) = writers_with_evidence(evidence.clone());
        let listed = Instant::now();
        evidence.listed("east", listed);
        evidence.renewed("east", false);
        let delete = CopyOp::Delete {
            uid: Some("u1".into()),
            template_deleted: false,
            guard: vec!["east".into()],
        };
        writers.want("east", &key(), delete.clone(), REWRITE);
        answer_probe(&mut server).await;
        // Rechecked for one renew interval: by its end the probe taken before it may be
        // the staler evidence, and the message says so instead.
        let done = completed.recv().await.unwrap();
        assert!(
            matches!(&done.outcome, Outcome::Failed(m)
                if m.contains("held back: the fencing-lease renewal in east failed")
                    || m.contains("held back: east's last successful health probe is older than")),
            "{:?}",
            done.outcome
        );
        assert!(nothing_sent(&mut server).await, "no DELETE was sent");

        // Renewed again (and from now on, as the hub's renewer does), but the copies
        // were listed before the suspicion: still held.
        let renewer = evidence.clone();
        let renewals = tokio::spawn(async move {
            loop {
                renewer.renewed("east", true);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        writers.forget("east", &key());
        writers.want("east", &key(), delete.clone(), Duration::ZERO);
        answer_probe(&mut server).await;
        held_back(&mut completed, "not been listed again").await;

        // Listed again since: the probe, then the DELETE with the UID precondition.
        evidence.listed("east", Instant::now());
        writers.forget("east", &key());
        writers.want("east", &key(), delete, Duration::ZERO);
        answer_probe(&mut server).await;
        let (request, reply) = server.next_request().await.unwrap();
        assert_eq!(request.method(), http::Method::DELETE);
        respond(
            reply,
            200,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
        );
        let done = completed.recv().await.unwrap();
        assert_eq!(done.outcome, Outcome::Done);
        renewals.abort();
    }

    /// A copy deleted in the member right after the hub applied it: the watch's Delete
    /// makes the writer forget the response, so the copy is not counted as there.
    #[tokio::test]
    async fn a_write_response_does_not_outlive_the_copys_deletion() {
        let (writers, mut server, mut completed) = writers_with_mock();
        writers.want("east", &key(), apply(false), REWRITE);
        let (_, reply) = server.next_request().await.unwrap();
        respond(reply, 200, config_map("5"));
        assert_eq!(completed.recv().await.unwrap().outcome, Outcome::Done);
        assert!(
            writers.fresh("east", &key(), None).is_some(),
            "the watch lags"
        );
        writers.seen_gone("east", &key(), Some("another-uid"));
        assert!(
            writers.fresh("east", &key(), None).is_some(),
            "another object's deletion says nothing of this one"
        );
        writers.seen_gone("east", &key(), Some("u1"));
        assert!(writers.fresh("east", &key(), None).is_none());
    }

    #[tokio::test]
    async fn the_latest_wanted_state_wins_and_a_forgotten_write_never_runs() {
        let (writers, mut server, mut completed) = writers_with_mock();
        writers.want("east", &key(), apply(false), REWRITE);
        // A newer op while the first is in flight: the first's outcome is dropped and the
        // newer one is written after it.
        let (_, first) = server.next_request().await.unwrap();
        let newer = CopyOp::Apply {
            object: json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"a": "b"}}),
            check_conflict: false,
            resolution: ConflictResolution::Abort,
            guard: vec![],
        };
        assert!(writers.want("east", &key(), newer.clone(), REWRITE));
        respond(first, 200, config_map("5"));
        let (request, second) = server.next_request().await.unwrap();
        let body = http_body_util::BodyExt::collect(request.into_body())
            .await
            .unwrap()
            .to_bytes();
        assert!(String::from_utf8_lossy(&body).contains("\"a\":\"b\""));
        respond(second, 200, config_map("6"));
        let done = completed.recv().await.unwrap();
        assert_eq!(done.outcome, Outcome::Done);
        assert!(
            writers
                .state("east", &key(), Some(&newer))
                .is_some_and(|s| s.current)
        );

        // Forgotten before a worker takes it: never sent.
        let other = ObjectKey {
            name: "other".into(),
            ..key()
        };
        writers.want("east", &other, apply(false), REWRITE);
        writers.forget("east", &other);
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Whether the worker took it before the forget or not, nothing stays pending.
        if let Ok(Some((_, reply))) =
            tokio::time::timeout(Duration::from_millis(50), server.next_request()).await
        {
            respond(reply, 200, config_map("7"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(writers.pending(), 0);
    }

    const REWRITE: Duration = Duration::from_secs(10);

    fn object(uid: &str, version: &str) -> DynamicObject {
        let mut o = DynamicObject::new(
            "web",
            &ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
        );
        o.metadata.uid = Some(uid.into());
        o.metadata.resource_version = Some(version.into());
        o
    }

    #[test]
    fn the_watch_wins_once_it_has_caught_up() {
        assert!(!newer_or_same(&object("a", "9"), &object("a", "10")));
        assert!(newer_or_same(&object("a", "10"), &object("a", "10")));
        assert!(newer_or_same(&object("a", "11"), &object("a", "10")));
        // Another object (deleted and created again): the watch knows better.
        assert!(newer_or_same(&object("b", "1"), &object("a", "10")));
        // Versions that are not numbers: never trust the older response.
        assert!(newer_or_same(&object("a", "x"), &object("a", "10")));
    }

    #[test]
    fn backoff_doubles_up_to_a_minute() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(4), Duration::from_secs(4));
        assert_eq!(backoff(30), BACKOFF_MAX);
    }

    #[test]
    fn the_same_op_has_the_same_fingerprint() {
        let apply = |replicas: i64| CopyOp::Apply {
            object: json!({"spec": {"replicas": replicas}}),
            check_conflict: false,
            resolution: ConflictResolution::Abort,
            guard: vec![],
        };
        assert_eq!(apply(3).fingerprint(), apply(3).fingerprint());
        assert_ne!(apply(3).fingerprint(), apply(4).fingerprint());
        let delete = CopyOp::Delete {
            uid: Some("u".into()),
            template_deleted: false,
            guard: vec![],
        };
        assert_ne!(apply(3).fingerprint(), delete.fingerprint());
    }
}
