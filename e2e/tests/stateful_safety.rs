//! Stateful data is never lost (issue 13; DESIGN.md sections 3 to 6): scale-downs,
//! scale-ups and taints around partitions, for MyDatabase and plain StatefulSet
//! templates, on the lab's real control planes with the hub and an agent in every
//! member. Every test reads the members through their in-zone kubeconfig (which works
//! while the hub is cut off) and compares UIDs of copies, StatefulSets, pods and volume
//! claims before, during and after, then prints its timings.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bulkhead::api::{MemberCluster, ResourceBinding, find_condition, is_condition_true};
use bulkhead_e2e::federation::{
    Federation, binding_replicas, databases, deployments, describe_binding, policies, ready_at,
    statefulsets,
};
use bulkhead_e2e::hub_support::{bulkhead, path};
use bulkhead_e2e::support::Partition;
use bulkhead_e2e::{Check, wait_for};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ApiResource, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

/// The label the agent puts on claims it kept after their database left the cluster.
const LABEL_RELEASED: &str = "example.com/released";
/// How long the negative checks watch for a change that must not happen (the members
/// are probed every second, the hub renews leases every second).
const STEADY: Duration = Duration::from_secs(10);

/// The template under test: a MyDatabase or a plain StatefulSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Database,
    StatefulSet,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Database => "orders",
            Kind::StatefulSet => "ledger",
        }
    }

    fn binding(self) -> String {
        match self {
            Kind::Database => format!("{}-mydatabase", self.name()),
            Kind::StatefulSet => format!("{}-statefulset", self.name()),
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Kind::Database => "MyDatabase",
            Kind::StatefulSet => "StatefulSet",
        }
    }

    fn resource(self) -> ApiResource {
        match self {
            Kind::Database => databases(),
            Kind::StatefulSet => statefulsets(),
        }
    }

    fn selector(self) -> Value {
        match self {
            Kind::Database => {
                json!([{"apiVersion": "example.com/v1", "kind": "MyDatabase", "name": self.name()}])
            }
            Kind::StatefulSet => {
                json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": self.name()}])
            }
        }
    }

    /// The hub template with `replicas`.
    fn template(self, replicas: i64) -> Value {
        let name = self.name();
        match self {
            Kind::Database => json!({
                "apiVersion": "example.com/v1", "kind": "MyDatabase",
                "metadata": {"name": name},
                "spec": {"replicas": replicas, "version": "16", "storage": {"size": "1Gi"}}
            }),
            Kind::StatefulSet => {
                bulkhead_e2e::federation::statefulset_template(name, replicas, "postgres:16")
            }
        }
    }
}

/// Divided, weighted `east`:`west` over east and west only.
fn east_and_west(east: i64, west: i64) -> Value {
    json!({
        "clusterAffinity": {"clusterNames": ["east", "west"]},
        "replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted",
            "weightPreference": {"staticWeightList": [
                {"targetCluster": {"clusterNames": ["east"]}, "weight": east},
                {"targetCluster": {"clusterNames": ["west"]}, "weight": west}]}}
    })
}

/// The federation with the template at 2 replicas, 1 + 1 over east and west, Ready (and
/// for a MyDatabase, phase Ready in both members). `weights` (east, west): 1:1 unless a
/// test wants to know which cluster a scale to 1 drops (with 1:1 the Webster tie-break
/// hashes the template UID, so it differs from run to run; 2:1 and 1:2 still divide 2
/// replicas 1 + 1).
async fn federation(prefix: &str, kind: Kind, weights: (i64, i64)) -> Result<Federation> {
    federation_probed(prefix, kind, weights, &["1", "1"]).await
}

/// Probes every 2 s with a 2 s timeout: the hub marks a cut-off member not Ready about
/// 6 to 8 s after the cut (three failed probes), while its agent fences at the 3 s lease.
/// The scale-down tests act in between, as a user would, right after the agent fenced.
const SLOW_PROBES: [&str; 2] = ["2", "2"];

/// [`federation`] with the members' probe `[interval, timeout]` in seconds.
async fn federation_probed(
    prefix: &str,
    kind: Kind,
    weights: (i64, i64),
    probe: &[&str; 2],
) -> Result<Federation> {
    let federation = Federation::start_with_probes(prefix, &[], probe).await?;
    federation
        .apply(
            &policies(),
            federation.policy(
                kind.name(),
                kind.selector(),
                east_and_west(weights.0, weights.1),
                json!({}),
            ),
        )
        .await?;
    federation.apply(&kind.resource(), kind.template(2)).await?;
    federation
        .wait_copies(
            &kind.resource(),
            kind.name(),
            "east 1, west 1 Ready",
            Duration::from_secs(120),
            |c| ready_at(c, &[("east", 1), ("west", 1)]),
        )
        .await?;
    if kind == Kind::Database {
        for cluster in ["east", "west"] {
            wait_phase(&federation, cluster, "Ready", Duration::from_secs(30)).await?;
        }
    }
    for cluster in ["east", "west"] {
        wait_claims_bound(&federation, cluster, 1).await?;
    }
    Ok(federation)
}

/// Scales the hub template.
async fn scale(federation: &Federation, kind: Kind, replicas: i64) -> Result<()> {
    federation
        .apply(&kind.resource(), kind.template(replicas))
        .await?;
    Ok(())
}

/// One object as the tests compare it: UID, `spec.replicas`, being deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Held {
    uid: String,
    replicas: Option<i64>,
    deleting: bool,
}

/// One volume claim.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Claim {
    uid: String,
    released: bool,
    deleting: bool,
    phase: Option<String>,
}

/// What a member holds of the test's workload, read inside its zone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct MemberState {
    /// The member's MyDatabase copy (MyDatabase templates only).
    database: Option<Held>,
    /// The StatefulSet: the agent's (MyDatabase) or the hub's copy (StatefulSet).
    statefulset: Option<Held>,
    /// name -> (uid, being deleted)
    pods: BTreeMap<String, (String, bool)>,
    /// name -> claim
    claims: BTreeMap<String, Claim>,
}

fn held(object: &kube::api::DynamicObject) -> Held {
    Held {
        uid: object.uid().unwrap_or_default(),
        replicas: object.data["spec"]["replicas"].as_i64(),
        deleting: object.metadata.deletion_timestamp.is_some(),
    }
}

/// Everything the test namespace of `cluster` holds of `kind`'s workload. The namespace
/// belongs to this test alone, so every pod and claim in it is the workload's.
async fn member_state(federation: &Federation, cluster: &str, kind: Kind) -> Result<MemberState> {
    let client = &federation.members[cluster];
    let namespace = &federation.namespace;
    // The workload's pods only, selected by the API server: other templates may run
    // hundreds of pods in the namespace.
    let selector = match kind {
        Kind::Database => format!("example.com/database={}", kind.name()),
        Kind::StatefulSet => format!("app={}", kind.name()),
    };
    // The four reads at once: a probe of a loaded member is as slow as its slowest read.
    let databases_api = federation.api(cluster, &databases());
    let statefulsets_api = federation.api(cluster, &statefulsets());
    let pods_api = Api::<Pod>::namespaced(client.clone(), namespace);
    let claims_api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    let (pod_params, claim_params) = (
        ListParams::default().labels(&selector),
        ListParams::default(),
    );
    let (database, statefulset, pods, claims) = tokio::try_join!(
        async {
            match kind {
                Kind::Database => databases_api.get_opt(kind.name()).await,
                Kind::StatefulSet => Ok(None),
            }
        },
        statefulsets_api.get_opt(kind.name()),
        pods_api.list(&pod_params),
        claims_api.list(&claim_params),
    )?;
    let pods = pods
        .items
        .into_iter()
        .map(|p| {
            let deleting = p.metadata.deletion_timestamp.is_some();
            (p.name_any(), (p.uid().unwrap_or_default(), deleting))
        })
        .collect();
    let claims = claims
        .items
        .into_iter()
        .map(|c| {
            let claim = Claim {
                uid: c.uid().unwrap_or_default(),
                released: c.labels().get(LABEL_RELEASED).map(String::as_str) == Some("true"),
                deleting: c.metadata.deletion_timestamp.is_some(),
                phase: c.status.as_ref().and_then(|s| s.phase.clone()),
            };
            (c.name_any(), claim)
        })
        .collect();
    Ok(MemberState {
        database: database.as_ref().map(held),
        statefulset: statefulset.as_ref().map(held),
        pods,
        claims,
    })
}

async fn states(
    federation: &Federation,
    clusters: &[&str],
    kind: Kind,
) -> Result<BTreeMap<String, MemberState>> {
    // Every cluster at once, as above.
    let read = futures::future::try_join_all(
        clusters
            .iter()
            .map(|cluster| member_state(federation, cluster, kind)),
    )
    .await?;
    Ok(clusters.iter().map(|c| c.to_string()).zip(read).collect())
}

/// Waits until `cluster` holds `count` Bound claims (kwok binds them a moment after the
/// pods start), so the recorded claims are the final ones.
async fn wait_claims_bound(federation: &Federation, cluster: &str, count: usize) -> Result<()> {
    let client = federation.members[cluster].clone();
    let namespace = federation.namespace.clone();
    wait_for(
        &format!("{count} Bound claims in {cluster}"),
        Duration::from_secs(30),
        || {
            let api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &namespace);
            async move {
                match api.list(&ListParams::default()).await {
                    Ok(list) => {
                        let bound = list
                            .items
                            .iter()
                            .filter(|c| {
                                c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                            })
                            .count();
                        if bound == count && list.items.len() == count {
                            Check::Done(())
                        } else {
                            Check::Waiting(format!("{bound} Bound of {}", list.items.len()))
                        }
                    }
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await
}

/// The negative check: for `window`, every probe of `clusters` must find exactly
/// `before` (same UIDs, same replicas, nothing being deleted, no claim released). Returns
/// the number of probes that read every cluster.
async fn hold_steady(
    federation: &Federation,
    clusters: &[&str],
    kind: Kind,
    before: &BTreeMap<String, MemberState>,
    window: Duration,
) -> Result<usize> {
    let started = Instant::now();
    let mut probes = 0;
    while started.elapsed() < window {
        match states(federation, clusters, kind).await {
            Ok(now) => {
                probes += 1;
                for (cluster, was) in before {
                    let is = &now[cluster];
                    if is != was {
                        let binding = federation.binding(&kind.binding()).await?;
                        bail!(
                            "{cluster} changed {:.1}s into the steady window:\nbefore {was:?}\nnow    {is:?}\nbinding: {}",
                            started.elapsed().as_secs_f64(),
                            binding.as_ref().map(describe_binding).unwrap_or_default()
                        );
                    }
                }
            }
            Err(error) => eprintln!("steady check: a read failed ({error}); probing again"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::ensure!(probes >= 5, "only {probes} successful probes in {window:?}");
    Ok(probes)
}

/// The phase of the member's copy of `orders`, read inside the member's zone.
async fn wait_phase(
    federation: &Federation,
    cluster: &str,
    wanted: &str,
    timeout: Duration,
) -> Result<Duration> {
    let started = Instant::now();
    let api = federation.api(cluster, &databases());
    wait_for(
        &format!("orders in {cluster} phase {wanted}"),
        timeout,
        || {
            let api = api.clone();
            async move {
                match api.get_opt("orders").await {
                    Ok(Some(db)) if db.data["status"]["phase"] == wanted => Check::Done(()),
                    Ok(Some(db)) => Check::Waiting(format!("phase {}", db.data["status"]["phase"])),
                    Ok(None) => Check::Waiting("no copy".into()),
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await?;
    Ok(started.elapsed())
}

/// Waits until the hub's MemberCluster `cluster` has Ready = `ready`; returns the time
/// since `since`.
async fn wait_member_ready(
    federation: &Federation,
    cluster: &str,
    ready: bool,
    since: Instant,
) -> Result<Duration> {
    let api: Api<MemberCluster> = Api::all(federation.hub.clone());
    wait_for(
        &format!("MemberCluster {cluster} Ready={ready}"),
        Duration::from_secs(30),
        || {
            let api = api.clone();
            async move {
                match api.get(cluster).await {
                    Ok(mc) => {
                        let is = mc
                            .status
                            .as_ref()
                            .is_some_and(|s| is_condition_true(&s.conditions, "Ready"));
                        if is == ready {
                            Check::Done(())
                        } else {
                            Check::Waiting(format!("Ready={is}"))
                        }
                    }
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await?;
    Ok(since.elapsed())
}

/// Cuts `cluster` off and waits until the hub says it is not Ready and, for a MyDatabase,
/// until its agent has fenced it (phase ReadOnly). Returns (detection, fence) times.
async fn cut_off<'a>(
    federation: &'a Federation,
    cluster: &str,
    kind: Kind,
) -> Result<(Partition<'a>, Duration, Option<Duration>)> {
    let cut = Instant::now();
    let partition = Partition::start(&federation.lab, cluster)?;
    let detected = wait_member_ready(federation, cluster, false, cut).await?;
    let fenced = match kind {
        Kind::Database => {
            wait_phase(federation, cluster, "ReadOnly", Duration::from_secs(20)).await?;
            Some(cut.elapsed())
        }
        Kind::StatefulSet => None,
    };
    Ok((partition, detected, fenced))
}

/// Cuts `cluster` off and returns at the moment a user would act: once its agent has
/// fenced the database (phase ReadOnly), or, for a plain StatefulSet (no agent fences
/// it), once the lease duration has passed since the cut. Not once the hub has marked the
/// cluster: the hub must not be slower to suspect a cluster than its agent is to fence.
/// Returns the partition, when the cut began, and whether the hub still counted the
/// cluster Ready at that moment (the window in which it used to delete).
async fn cut_off_until_fenced<'a>(
    federation: &'a Federation,
    cluster: &str,
    kind: Kind,
) -> Result<(Partition<'a>, Instant, bool)> {
    let cut = Instant::now();
    let partition = Partition::start(&federation.lab, cluster)?;
    match kind {
        Kind::Database => {
            // Polled every 100 ms: the test acts as soon as the member says ReadOnly.
            let api = federation.api(cluster, &databases());
            loop {
                let db = api.get("orders").await?;
                if db.data["status"]["phase"] == "ReadOnly" {
                    break;
                }
                anyhow::ensure!(
                    cut.elapsed() < Duration::from_secs(20),
                    "{cluster} not fenced 20 s after the cut"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Kind::StatefulSet => {
            tokio::time::sleep(Duration::from_secs(
                bulkhead_e2e::federation::LEASE_DURATION_SECONDS,
            ))
            .await;
        }
    }
    let members: Api<MemberCluster> = Api::all(federation.hub.clone());
    let still_ready = members
        .get(cluster)
        .await?
        .status
        .as_ref()
        .is_some_and(|s| is_condition_true(&s.conditions, "Ready"));
    Ok((partition, cut, still_ready))
}

/// A binding condition as (status, reason, message).
fn condition(binding: &ResourceBinding, type_: &str) -> Option<(String, String, String)> {
    let status = binding.status.as_ref()?;
    find_condition(&status.conditions, type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn has_reason(binding: &ResourceBinding, type_: &str, status: &str, reason: &str) -> bool {
    condition(binding, type_).is_some_and(|(s, r, _)| s == status && r == reason)
}

fn total(binding: &ResourceBinding) -> i64 {
    binding_replicas(binding).iter().map(|(_, r)| r).sum()
}

fn pairs(list: &[(&str, i64)]) -> Vec<(String, i64)> {
    list.iter().map(|(c, r)| (c.to_string(), *r)).collect()
}

/// The Events with `reason` about the hub template of `kind`, and every (kind/name:
/// reason) seen. kube's Recorder writes events.k8s.io/v1 Events in the template's
/// namespace.
async fn events(
    federation: &Federation,
    kind: Kind,
    reason: &str,
) -> Result<(Vec<Event>, Vec<String>)> {
    let list = Api::<Event>::namespaced(federation.hub.clone(), &federation.namespace)
        .list(&ListParams::default())
        .await?;
    let about = |e: &Event| {
        e.regarding.as_ref().is_some_and(|r| {
            r.kind.as_deref() == Some(kind.kind()) && r.name.as_deref() == Some(kind.name())
        })
    };
    let seen = list
        .items
        .iter()
        .map(|e| {
            let regarding = e.regarding.clone().unwrap_or_default();
            format!(
                "{}/{}: {}",
                regarding.kind.unwrap_or_default(),
                regarding.name.unwrap_or_default(),
                e.reason.clone().unwrap_or_default()
            )
        })
        .collect();
    let found = list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason) && about(e))
        .collect();
    Ok((found, seen))
}

/// Waits for an Event with `reason` about the hub template of `kind`.
async fn wait_event(federation: &Federation, kind: Kind, reason: &str) -> Result<Event> {
    wait_for(
        &format!("Event {reason} on {} {}", kind.kind(), kind.name()),
        Duration::from_secs(20),
        || async move {
            match events(federation, kind, reason).await {
                Ok((found, _)) if !found.is_empty() => Check::Done(found[0].clone()),
                Ok((_, seen)) => Check::Waiting(format!("seen: {seen:?}")),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await
}

/// `bulkhead get bindings -n <namespace>` against the hub.
fn get_bindings(federation: &Federation) -> Result<String> {
    let output = bulkhead(&[
        "get",
        "bindings",
        "-n",
        &federation.namespace,
        "--kubeconfig",
        &path(&federation.lab.kubeconfig("hub")),
    ])?;
    anyhow::ensure!(output.status.success(), "bulkhead get bindings failed");
    Ok(String::from_utf8(output.stdout)?)
}

/// The other of east and west.
fn other(cluster: &str) -> &'static str {
    if cluster == "east" { "west" } else { "east" }
}

/// The single cluster a binding places on.
fn only_target(binding: &ResourceBinding) -> Result<String> {
    match binding_replicas(binding).as_slice() {
        [(cluster, 1)] => Ok(cluster.clone()),
        other => bail!("expected one cluster with 1 replica, got {other:?}"),
    }
}

/// Waits until `cluster` no longer holds `kind`'s copy nor its StatefulSet (and, for a
/// StatefulSet, its pods): the removal finished there.
async fn wait_removed(federation: &Federation, cluster: &str, kind: Kind) -> Result<MemberState> {
    wait_for(
        &format!("{} {} removed from {cluster}", kind.kind(), kind.name()),
        Duration::from_secs(90),
        || async move {
            match member_state(federation, cluster, kind).await {
                Ok(state)
                    if state.database.is_none()
                        && state.statefulset.is_none()
                        && state.pods.is_empty() =>
                {
                    Check::Done(state)
                }
                Ok(state) => Check::Waiting(format!("{state:?}")),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await
}

/// Asserts that `cluster` still holds every claim of `before` with the same UID, not
/// being deleted, and (MyDatabase only: the agent marks them) labelled released.
async fn assert_claims_kept(
    federation: &Federation,
    cluster: &str,
    kind: Kind,
    before: &MemberState,
) -> Result<MemberState> {
    anyhow::ensure!(!before.claims.is_empty(), "{cluster} had no claims to keep");
    let marked = kind == Kind::Database;
    let state = wait_for(
        &format!(
            "{cluster}'s claims kept{}",
            if marked { " and released" } else { "" }
        ),
        Duration::from_secs(30),
        || async move {
            match member_state(federation, cluster, kind).await {
                Ok(state)
                    if before.claims.iter().all(|(name, was)| {
                        state.claims.get(name).is_some_and(|is| {
                            is.uid == was.uid && !is.deleting && (!marked || is.released)
                        })
                    }) =>
                {
                    Check::Done(state)
                }
                Ok(state) => Check::Waiting(format!("claims {:?}", state.claims)),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    Ok(state)
}

#[tokio::test]
async fn scale_down_during_a_partition_keeps_every_database() -> Result<()> {
    let kind = Kind::Database;
    // East weighs more: the scale to 1 keeps the cut-off east and drops the reachable,
    // writable west, the copy the hub used to delete (issue 13, first scenario).
    let federation = federation_probed("safe-down-cut", kind, (2, 1), &SLOW_PROBES).await?;
    partition_scale_down_keeps_everything(&federation, kind, "west", async || Ok(String::new()))
        .await
}

#[tokio::test]
async fn a_plain_statefulset_template_is_frozen_too() -> Result<()> {
    let kind = Kind::StatefulSet;
    // West weighs more: the scale to 1 drops the cut-off east (the other case of test 1).
    let federation = federation_probed("safe-sts-cut", kind, (1, 2), &SLOW_PROBES).await?;
    // Every StatefulSet copy retains its claims whatever happens to it.
    for cluster in ["east", "west"] {
        let copy = federation
            .api(cluster, &statefulsets())
            .get(kind.name())
            .await?;
        assert_eq!(
            copy.data["spec"]["persistentVolumeClaimRetentionPolicy"],
            json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
            "{cluster}"
        );
    }
    partition_scale_down_keeps_everything(&federation, kind, "east", async || Ok(String::new()))
        .await
}

/// The issue-27 scenario over three clusters, acted on the moment east's agent fenced
/// (the hub still counted east Ready): a MyDatabase and a plain StatefulSet at 1 + 1 + 1
/// (weights 2:1:1, so a scale to 1 keeps east) are both scaled to 1. The hub used to
/// delete west's and north's copies of both and keep only east's fenced one. Now nothing
/// is deleted or shrunk anywhere while east is cut off; after the heal the change
/// completes make-before-break, east's copies are the original ones and the removed
/// copies' claims stay.
#[tokio::test]
async fn three_copies_scaled_to_one_right_after_the_fence_are_all_kept() -> Result<()> {
    let federation = Federation::start_with_probes("safe-three", &[], &SLOW_PROBES).await?;
    let all = ["east", "north", "west"];
    let placement = json!({
        "clusterAffinity": {"clusterNames": all},
        "replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted",
            "weightPreference": {"staticWeightList": [
                {"targetCluster": {"clusterNames": ["east"]}, "weight": 2},
                {"targetCluster": {"clusterNames": ["west", "north"]}, "weight": 1}]}}
    });
    let kinds = [Kind::Database, Kind::StatefulSet];
    for kind in kinds {
        federation
            .apply(
                &policies(),
                federation.policy(kind.name(), kind.selector(), placement.clone(), json!({})),
            )
            .await?;
        federation.apply(&kind.resource(), kind.template(3)).await?;
    }
    for kind in kinds {
        federation
            .wait_copies(
                &kind.resource(),
                kind.name(),
                "1 + 1 + 1 Ready",
                Duration::from_secs(120),
                |c| ready_at(c, &[("east", 1), ("north", 1), ("west", 1)]),
            )
            .await?;
    }
    for cluster in all {
        wait_phase(&federation, cluster, "Ready", Duration::from_secs(30)).await?;
        wait_claims_bound(&federation, cluster, 2).await?;
    }
    let mut before = BTreeMap::new();
    for kind in kinds {
        before.insert(kind, states(&federation, &all, kind).await?);
    }

    let (partition, cut, still_ready) =
        cut_off_until_fenced(&federation, "east", Kind::Database).await?;
    let acted = cut.elapsed();
    for kind in kinds {
        scale(&federation, kind, 1).await?;
    }
    for kind in kinds {
        let binding = wait_scaled_to_one_waiting(&federation, kind).await?;
        assert_eq!(binding_replicas(&binding), pairs(&[("east", 1)]));
    }
    let detected = wait_member_ready(&federation, "east", false, cut).await?;
    for kind in kinds {
        hold_steady(&federation, &all, kind, &before[&kind], STEADY).await?;
    }

    partition.heal()?;
    let healed = Instant::now();
    for kind in kinds {
        wait_scaled_to_one_done(&federation, kind).await?;
        for removed in ["north", "west"] {
            wait_removed(&federation, removed, kind).await?;
            // Both templates' claims are in the namespace; only the database's are
            // labelled released, so the check is the plain one (same UIDs, not deleted).
            assert_claims_kept(
                &federation,
                removed,
                Kind::StatefulSet,
                &before[&kind][removed],
            )
            .await?;
        }
        let east = member_state(&federation, "east", kind).await?;
        assert_eq!(
            east.statefulset.as_ref().map(|s| &s.uid),
            before[&kind]["east"].statefulset.as_ref().map(|s| &s.uid),
            "east's {} StatefulSet is the original one",
            kind.kind()
        );
    }
    println!(
        "three clusters, MyDatabase and StatefulSet scaled 3 -> 1 {:.1}s after the cut, right after east fenced \
         (the hub {} counted east Ready; it marked it not Ready {:.1}s after the cut): \
         nothing deleted or shrunk while cut off; after the heal west and north removed with their claims kept in {:.1}s",
        acted.as_secs_f64(),
        if still_ready { "still" } else { "no longer" },
        detected.as_secs_f64(),
        healed.elapsed().as_secs_f64(),
    );
    Ok(())
}

/// Deployment templates in the burst of [`the_partition_rules_hold_during_a_burst`].
const BURST: usize = 120;
/// Their replicas: 1 + 1 + 1 over the three members.
const BURST_REPLICAS: i64 = 3;
/// One create every 80 ms: 120 over about 10 s.
const BURST_PACE: Duration = Duration::from_millis(80);

fn burst_name(i: usize) -> String {
    format!("burst-{i:03}")
}

/// Test 1 again while the hub is busy (issue 14): a burst of 120 Deployment templates
/// (3 replicas, 1:1:1 over the three members, stateless failover after 5 s) is created
/// by 4 clients over about 10 s while east is cut off and the database scaled down. The database rules
/// hold as in test 1, and the stateless ones with them: every template's 3 replicas
/// Ready in west and north while east is cut off (the templates created before the cut
/// fail over, the later ones never go to east), and back to 1 + 1 + 1 after the heal.
#[tokio::test]
async fn the_partition_rules_hold_during_a_burst() -> Result<()> {
    let kind = Kind::Database;
    let federation = federation("safe-burst", kind, (2, 1)).await?;
    federation
        .apply(
            &policies(),
            federation.policy(
                "burst",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "burst-*"}]),
                json!({"replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted"}}),
                json!({"failover": {"stateless": {"tolerationSeconds": 5}}}),
            ),
        )
        .await?;
    let api = federation.api("hub", &deployments());
    let started = Instant::now();
    let creating = tokio::spawn(async move {
        futures::stream::iter(0..BURST)
            .map(|i| {
                let api = api.clone();
                async move {
                    // Paced over about 10 s, so the burst spans the cut, its detection,
                    // the scale-down and the first steady window.
                    tokio::time::sleep_until(
                        tokio::time::Instant::from_std(started) + BURST_PACE * i as u32,
                    )
                    .await;
                    let name = burst_name(i);
                    let template: kube::api::DynamicObject = serde_json::from_value(json!({
                        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
                        "spec": {"replicas": BURST_REPLICAS, "selector": {"matchLabels": {"app": name}},
                                 "template": {"metadata": {"labels": {"app": name}},
                                              "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}
                    }))?;
                    api.create(&Default::default(), &template).await?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(4)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<Vec<()>>>()
            .map(|_| started.elapsed())
    });
    let burst = &federation;
    partition_scale_down_keeps_everything(&federation, kind, "west", async move || {
        let created = creating.await??;
        let survivors = wait_burst(burst, &[("west", None), ("north", None)], "3 Ready in west and north").await?;
        Ok(format!(
            "; meanwhile {BURST} Deployment templates created in {:.1}s, all {BURST_REPLICAS} replicas of each Ready in west and north {:.1}s after the last create",
            created.as_secs_f64(),
            survivors.as_secs_f64()
        ))
    })
    .await?;
    let healed = Instant::now();
    wait_burst(
        &federation,
        &[("east", Some(1)), ("west", Some(1)), ("north", Some(1))],
        "1 + 1 + 1 Ready after the heal",
    )
    .await?;
    println!(
        "the burst's {BURST} templates back to 1 + 1 + 1 Ready {:.1}s after the heal checks ended",
        healed.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Waits until every burst template has its replicas Ready in `clusters` (read inside
/// their zones): `Some(n)` n in that cluster, `None` any number as long as they add up
/// to [`BURST_REPLICAS`]. Returns how long it waited.
async fn wait_burst(
    federation: &Federation,
    clusters: &[(&str, Option<i64>)],
    what: &str,
) -> Result<Duration> {
    let started = Instant::now();
    wait_for(
        &format!("the burst's templates: {what}"),
        Duration::from_secs(180),
        || async move {
            let mut ready: BTreeMap<String, i64> = BTreeMap::new();
            let mut wrong = vec![];
            for (cluster, wanted) in clusters {
                let copies = match federation.api(cluster, &deployments()).list(&ListParams::default()).await {
                    Ok(list) => list.items,
                    Err(e) => return Check::Waiting(format!("{cluster}: {e}")),
                };
                for copy in copies.iter().filter(|c| c.name_any().starts_with("burst-")) {
                    let n = copy.data["status"]["readyReplicas"].as_i64().unwrap_or(0);
                    *ready.entry(copy.name_any()).or_default() += n;
                    if wanted.is_some_and(|w| copy.data["spec"]["replicas"].as_i64() != Some(w) || n != w) {
                        wrong.push(format!("{cluster}/{}", copy.name_any()));
                    }
                }
            }
            let short: Vec<String> = (0..BURST)
                .map(burst_name)
                .filter(|name| ready.get(name).copied().unwrap_or(0) != BURST_REPLICAS)
                .collect();
            if short.is_empty() && wrong.is_empty() {
                Check::Done(())
            } else {
                Check::Waiting(format!(
                    "{} templates not at {BURST_REPLICAS} Ready (e.g. {:?}); {} copies off their share (e.g. {:?})",
                    short.len(),
                    short.iter().take(3).collect::<Vec<_>>(),
                    wrong.len(),
                    wrong.iter().take(3).collect::<Vec<_>>()
                ))
            }
        },
    )
    .await?;
    Ok(started.elapsed())
}

/// Test 1 and 4: 1 + 1, east cut off, scaled to 1; nothing deleted or shrunk while east
/// is cut off, the binding and an Event say it waits, `get bindings` shows it; after the
/// heal one copy stays with its original UIDs and the removed one's claims are kept.
/// `dropped` is the cluster the new placement leaves out.
async fn partition_scale_down_keeps_everything(
    federation: &Federation,
    kind: Kind,
    dropped: &str,
    while_cut: impl AsyncFnOnce() -> Result<String>,
) -> Result<()> {
    let both = ["east", "west"];
    let before = states(federation, &both, kind).await?;
    eprintln!("before: {before:#?}");

    let (partition, cut, still_ready) = cut_off_until_fenced(federation, "east", kind).await?;
    let fenced = (kind == Kind::Database).then(|| cut.elapsed());

    let scaled = Instant::now();
    scale(federation, kind, 1).await?;
    let binding = wait_scaled_to_one_waiting(federation, kind).await?;
    let waiting = scaled.elapsed();
    eprintln!("waiting: {}", describe_binding(&binding));
    assert_eq!(
        binding_replicas(&binding),
        pairs(&[(other(dropped), 1)]),
        "the new placement leaves out {dropped}"
    );
    let (_, _, message) = condition(&binding, "Propagated").context("Propagated")?;
    assert!(message.contains("east"), "names the cluster: {message}");
    let event = wait_event(federation, kind, "WaitingForPartition").await?;
    eprintln!("event: {:?}", event.note);
    let detected = wait_member_ready(federation, "east", false, cut).await?;

    // Several probe intervals and lease renewals: nothing deleted or shrunk anywhere.
    let probes = hold_steady(federation, &both, kind, &before, STEADY).await?;
    let table = get_bindings(federation)?;
    assert!(table.contains("WaitingForPartition"), "{table}");
    assert_still_waiting(federation, kind, "after the steady window").await?;

    // What else a test checks while east is cut off (a burst's failover).
    let meanwhile = while_cut().await?;
    assert_still_waiting(federation, kind, "before the heal").await?;
    hold_steady(federation, &both, kind, &before, STEADY).await?;

    // Heal: the change completes, make-before-break.
    partition.heal()?;
    let healed = Instant::now();
    let binding = wait_scaled_to_one_done(federation, kind).await?;
    let kept = only_target(&binding)?;
    let removed = other(&kept);
    assert_eq!(removed, dropped, "{}", describe_binding(&binding));
    let gone = wait_removed(federation, removed, kind).await?;
    let completed = healed.elapsed();
    eprintln!("after the heal: kept {kept}, removed {removed}: {gone:?}");

    // The kept copy is the original one, in place, and its data with it.
    let kept_now = member_state(federation, &kept, kind).await?;
    let kept_before = &before[&kept];
    if kind == Kind::Database {
        assert_eq!(
            kept_now.database.as_ref().map(|d| &d.uid),
            kept_before.database.as_ref().map(|d| &d.uid),
            "the {kept} database is the original one"
        );
    }
    assert_eq!(
        kept_now.statefulset.as_ref().map(|s| &s.uid),
        kept_before.statefulset.as_ref().map(|s| &s.uid),
        "the {kept} StatefulSet is the original one"
    );
    assert_eq!(
        kept_now.pods, kept_before.pods,
        "no pod restarted in {kept}"
    );
    assert_eq!(
        kept_now.claims, kept_before.claims,
        "{kept}'s claims untouched"
    );
    // The removed copy's claims stay (released, for a MyDatabase).
    let removed_now = assert_claims_kept(federation, removed, kind, &before[removed]).await?;
    // And stay: the claims are not deleted a moment later.
    let mut removed_before = BTreeMap::new();
    removed_before.insert(removed.to_string(), removed_now);
    hold_steady(
        federation,
        &[removed],
        kind,
        &removed_before,
        Duration::from_secs(3),
    )
    .await?;
    wait_event(federation, kind, "PartitionHealed").await?;
    if kind == Kind::Database {
        wait_phase(federation, &kept, "Ready", Duration::from_secs(30)).await?;
    }

    println!(
        "{} scale-down 2 -> 1 during a partition: east not Ready {:.1}s after the cut{}; \
         scaled while the hub {} counted east Ready; WaitingForPartition {:.1}s after the scale; {probes} probes over {:.0}s saw nothing deleted or shrunk; \
         after the heal the change completed in {:.1}s: kept {kept} (same UIDs), removed {removed} with its {} claim(s) kept{meanwhile}",
        kind.kind(),
        detected.as_secs_f64(),
        fenced
            .map(|f| format!(", fenced read-only {:.1}s after the cut", f.as_secs_f64()))
            .unwrap_or_default(),
        if still_ready { "still" } else { "no longer" },
        waiting.as_secs_f64(),
        STEADY.as_secs_f64(),
        completed.as_secs_f64(),
        before[removed].claims.len(),
    );
    Ok(())
}

/// The binding of `kind`'s template holds 1 replica and says the change waits for the
/// partition (`Propagated=False, reason=WaitingForPartition`).
async fn wait_scaled_to_one_waiting(
    federation: &Federation,
    kind: Kind,
) -> Result<ResourceBinding> {
    federation
        .wait_binding(
            &kind.binding(),
            "Propagated=False(WaitingForPartition)",
            Duration::from_secs(30),
            |b| {
                (has_reason(b, "Propagated", "False", "WaitingForPartition") && total(b) == 1)
                    .then(|| b.clone())
            },
        )
        .await
}

/// The binding of `kind`'s template holds 1 replica and says it is propagated.
async fn wait_scaled_to_one_done(federation: &Federation, kind: Kind) -> Result<ResourceBinding> {
    federation
        .wait_binding(
            &kind.binding(),
            "Propagated=True with 1 replica",
            Duration::from_secs(60),
            |b| (binding_condition_true(b, "Propagated") && total(b) == 1).then(|| b.clone()),
        )
        .await
}

/// The binding still says the change waits for the partition (`when`: for the message).
async fn assert_still_waiting(federation: &Federation, kind: Kind, when: &str) -> Result<()> {
    let still = federation
        .binding(&kind.binding())
        .await?
        .context("binding")?;
    assert!(
        has_reason(&still, "Propagated", "False", "WaitingForPartition"),
        "still waiting {when}: {}",
        describe_binding(&still)
    );
    Ok(())
}

/// Waits until the binding is Scheduled with exactly `split`, and returns `cluster`'s
/// decision row (printing its reason).
async fn wait_split(
    federation: &Federation,
    kind: Kind,
    split: &[(&str, i64)],
    cluster: &str,
) -> Result<bulkhead::api::resource_binding::ClusterDecision> {
    let wanted = pairs(split);
    let binding = federation
        .wait_binding(
            &kind.binding(),
            &format!("{wanted:?}"),
            Duration::from_secs(30),
            |b| {
                (binding_replicas(b) == wanted && binding_condition_true(b, "Scheduled"))
                    .then(|| b.clone())
            },
        )
        .await?;
    let row = binding
        .status
        .as_ref()
        .and_then(|s| s.decisions.iter().find(|d| d.cluster == cluster))
        .cloned()
        .with_context(|| format!("{cluster}'s decision"))?;
    eprintln!("{cluster}'s decision: {}", row.reason);
    Ok(row)
}

fn binding_condition_true(binding: &ResourceBinding, type_: &str) -> bool {
    binding
        .status
        .as_ref()
        .is_some_and(|s| is_condition_true(&s.conditions, type_))
}

/// The claim names a StatefulSet's pods use: `<template>-<statefulset>-<ordinal>`.
fn claim_names_of(statefulset: &kube::api::DynamicObject) -> BTreeSet<String> {
    let name = statefulset.name_any();
    let name = name.as_str();
    let replicas = statefulset.data["spec"]["replicas"].as_i64().unwrap_or(0);
    statefulset.data["spec"]["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["metadata"]["name"].as_str())
        .flat_map(|template| (0..replicas).map(move |i| format!("{template}-{name}-{i}")))
        .collect()
}

/// The claims the database's pods mount.
async fn mounted_claims(federation: &Federation, cluster: &str) -> Result<BTreeSet<String>> {
    let pods = Api::<Pod>::namespaced(federation.members[cluster].clone(), &federation.namespace)
        .list(&ListParams::default())
        .await?;
    Ok(pods
        .items
        .iter()
        .flat_map(|p| p.spec.iter().flat_map(|s| s.volumes.iter().flatten()))
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
        .collect())
}

#[tokio::test]
async fn scale_down_while_healthy_keeps_the_volumes() -> Result<()> {
    let kind = Kind::Database;
    let federation = federation("safe-down", kind, (1, 1)).await?;
    let both = ["east", "west"];
    let before = states(&federation, &both, kind).await?;

    let started = Instant::now();
    scale(&federation, kind, 1).await?;
    let binding = federation
        .wait_binding(&kind.binding(), "1 replica", Duration::from_secs(30), |b| {
            (total(b) == 1).then(|| b.clone())
        })
        .await?;
    let kept = only_target(&binding)?;
    let removed = other(&kept);
    // Make-before-break: the kept copy is Ready at 1 throughout; the removed one goes.
    let gone = wait_removed(&federation, removed, kind).await?;
    let removal = started.elapsed();
    eprintln!("kept {kept}, removed {removed}: {gone:?}");
    let kept_now = member_state(&federation, &kept, kind).await?;
    assert_eq!(kept_now, before[&kept], "{kept} untouched");
    let released = assert_claims_kept(&federation, removed, kind, &before[removed]).await?;
    eprintln!("released claims in {removed}: {:?}", released.claims);
    let (waiting, _) = events(&federation, kind, "WaitingForPartition").await?;
    assert!(waiting.is_empty(), "no partition, no waiting: {waiting:?}");

    // Back to 2: the copy returns to the same cluster and takes its claims back.
    let back = Instant::now();
    scale(&federation, kind, 2).await?;
    federation
        .wait_copies(
            &databases(),
            "orders",
            "east 1, west 1 Ready again",
            Duration::from_secs(120),
            |c| ready_at(c, &[("east", 1), ("west", 1)]),
        )
        .await?;
    let returned = back.elapsed();
    let old = &before[removed];
    let reused = wait_for(
        &format!("{removed}'s claims reused (same UIDs, released label gone)"),
        Duration::from_secs(30),
        || async {
            match member_state(&federation, removed, kind).await {
                Ok(state)
                    if old.claims.iter().all(|(name, was)| {
                        state
                            .claims
                            .get(name)
                            .is_some_and(|is| is.uid == was.uid && !is.released && !is.deleting)
                    }) =>
                {
                    Check::Done(state)
                }
                Ok(state) => Check::Waiting(format!("claims {:?}", state.claims)),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    assert_ne!(
        reused.database.as_ref().map(|d| &d.uid),
        old.database.as_ref().map(|d| &d.uid),
        "a new copy came back to {removed}"
    );
    assert_ne!(
        reused.statefulset.as_ref().map(|s| &s.uid),
        old.statefulset.as_ref().map(|s| &s.uid),
        "with a new StatefulSet"
    );
    assert_eq!(
        reused.claims.keys().collect::<Vec<_>>(),
        old.claims.keys().collect::<Vec<_>>(),
        "no new claim in {removed}"
    );
    let statefulset = federation
        .api(removed, &statefulsets())
        .get("orders")
        .await?;
    let wanted: BTreeSet<String> = old.claims.keys().cloned().collect();
    assert_eq!(
        claim_names_of(&statefulset),
        wanted,
        "the new StatefulSet's claims are the old ones"
    );
    assert_eq!(
        mounted_claims(&federation, removed).await?,
        wanted,
        "its pods mount them"
    );
    println!(
        "healthy scale-down 2 -> 1: {removed}'s copy removed {:.1}s after the scale with {} claim(s) kept and released; \
         back to 2: Ready in {removed} again {:.1}s after the scale, the same claims ({}) reused",
        removal.as_secs_f64(),
        old.claims.len(),
        returned.as_secs_f64(),
        wanted.iter().cloned().collect::<Vec<_>>().join(", "),
    );
    Ok(())
}

#[tokio::test]
async fn scale_up_during_a_partition_goes_to_the_reachable_cluster() -> Result<()> {
    let kind = Kind::Database;
    let federation = federation("safe-up-cut", kind, (1, 1)).await?;
    let both = ["east", "west"];
    let before = states(&federation, &both, kind).await?;
    let (partition, detected, _) = cut_off(&federation, "east", kind).await?;

    let scaled = Instant::now();
    scale(&federation, kind, 4).await?;
    let east_row = wait_split(&federation, kind, &[("east", 1), ("west", 3)], "east").await?;
    let decided = scaled.elapsed();
    assert!(
        east_row.reason.contains("keeps at most"),
        "{}",
        east_row.reason
    );
    federation
        .wait_copies_in(
            &["west"],
            &databases(),
            "orders",
            "west 3 Ready",
            Duration::from_secs(90),
            |c| ready_at(c, &[("west", 3)]),
        )
        .await?;
    let grown = scaled.elapsed();
    // All of it while east is cut off; east's copy never grew.
    let members: Api<MemberCluster> = Api::all(federation.hub.clone());
    let east = members.get("east").await?;
    assert!(
        !east
            .status
            .as_ref()
            .is_some_and(|s| is_condition_true(&s.conditions, "Ready")),
        "east still cut off when west reached 3"
    );
    let east_now = member_state(&federation, "east", kind).await?;
    assert_eq!(east_now, before["east"], "east untouched while cut off");
    let west_now = member_state(&federation, "west", kind).await?;
    assert_eq!(
        west_now.database.as_ref().map(|d| &d.uid),
        before["west"].database.as_ref().map(|d| &d.uid),
        "west grew in place"
    );

    // Heal: the placement converges back to the policy's split, make-before-break. East
    // never gets more than its weighted share, the total never drops below 4 Ready.
    partition.heal()?;
    let healed = Instant::now();
    let mut east_most = 0;
    let mut lowest = i64::MAX;
    loop {
        let copies = federation.copies(&databases(), "orders").await?;
        for copy in &copies {
            if copy.cluster == "east" {
                east_most = east_most.max(copy.replicas.unwrap_or(0));
            }
        }
        lowest = lowest.min(copies.iter().map(|c| c.ready).sum());
        if ready_at(&copies, &[("east", 2), ("west", 2)]) {
            break;
        }
        if healed.elapsed() > Duration::from_secs(120) {
            let binding = federation.binding(&kind.binding()).await?;
            bail!(
                "not 2/2 after the heal: {copies:?}; binding {}",
                binding.as_ref().map(describe_binding).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let converged = healed.elapsed();
    assert!(
        east_most <= 2,
        "east got {east_most} replicas after the heal"
    );
    assert!(lowest >= 4, "{lowest} Ready replicas at the lowest");
    let after = states(&federation, &both, kind).await?;
    for cluster in both {
        assert_eq!(
            after[cluster].database.as_ref().map(|d| &d.uid),
            before[cluster].database.as_ref().map(|d| &d.uid),
            "{cluster}'s database is the original one"
        );
        for (name, claim) in &before[cluster].claims {
            assert_eq!(
                after[cluster].claims.get(name).map(|c| &c.uid),
                Some(&claim.uid),
                "{cluster} claim {name}"
            );
        }
    }
    println!(
        "scale-up 2 -> 4 during a partition: east not Ready {:.1}s after the cut; decided east 1 + west 3 {:.1}s after the scale, \
         west 3/3 Ready {:.1}s after the scale with east still cut off and untouched; after the heal 2 + 2 Ready in {:.1}s, \
         east never above {east_most}, at least {lowest} Ready throughout",
        detected.as_secs_f64(),
        decided.as_secs_f64(),
        grown.as_secs_f64(),
        converged.as_secs_f64(),
    );
    Ok(())
}

#[tokio::test]
async fn no_candidate_fits_nothing_is_removed() -> Result<()> {
    let kind = Kind::Database;
    let federation = federation("safe-nofit", kind, (1, 1)).await?;
    let both = ["east", "west"];
    let before = states(&federation, &both, kind).await?;
    let (east_partition, east_detected, _) = cut_off(&federation, "east", kind).await?;
    let (west_partition, west_detected, _) = cut_off(&federation, "west", kind).await?;
    // North is reachable: the hub is not the one cut off, so it is not frozen.
    assert_eq!(
        federation.hub_counter("bulkhead_hub_frozen", "").await?,
        0.0
    );

    let scaled = Instant::now();
    scale(&federation, kind, 4).await?;
    let binding = federation
        .wait_binding(
            &kind.binding(),
            "Scheduled=False, cannot be placed",
            Duration::from_secs(30),
            |b| {
                condition(b, "Scheduled")
                    .is_some_and(|(s, _, m)| s == "False" && m.contains("cannot be placed"))
                    .then(|| b.clone())
            },
        )
        .await?;
    let unschedulable = scaled.elapsed();
    eprintln!("unschedulable: {}", describe_binding(&binding));
    assert_eq!(
        binding_replicas(&binding),
        pairs(&[("east", 1), ("west", 1)]),
        "the placement stays"
    );
    let probes = hold_steady(&federation, &both, kind, &before, STEADY).await?;
    assert!(
        federation
            .api("north", &databases())
            .get_opt("orders")
            .await?
            .is_none(),
        "north is not in the affinity"
    );
    let still = federation
        .binding(&kind.binding())
        .await?
        .context("binding")?;
    assert_eq!(binding_replicas(&still), pairs(&[("east", 1), ("west", 1)]));

    east_partition.heal()?;
    west_partition.heal()?;
    let healed = Instant::now();
    federation
        .wait_binding(
            &kind.binding(),
            "Scheduled, east 2 + west 2",
            Duration::from_secs(60),
            |b| {
                (binding_condition_true(b, "Scheduled")
                    && binding_replicas(b) == pairs(&[("east", 2), ("west", 2)]))
                .then_some(())
            },
        )
        .await?;
    federation
        .wait_copies(
            &databases(),
            "orders",
            "east 2, west 2 Ready",
            Duration::from_secs(120),
            |c| ready_at(c, &[("east", 2), ("west", 2)]),
        )
        .await?;
    let converged = healed.elapsed();
    let after = states(&federation, &both, kind).await?;
    for cluster in both {
        assert_eq!(
            after[cluster].database.as_ref().map(|d| &d.uid),
            before[cluster].database.as_ref().map(|d| &d.uid),
            "{cluster}'s database grew in place"
        );
        for (name, claim) in &before[cluster].claims {
            assert_eq!(
                after[cluster].claims.get(name).map(|c| &c.uid),
                Some(&claim.uid),
                "{cluster} claim {name}"
            );
        }
    }
    println!(
        "no candidate fits: east and west not Ready {:.1}s / {:.1}s after their cuts; Scheduled=False {:.1}s after the scale to 4, \
         {probes} probes over {:.0}s saw nothing removed or changed; after the heal 2 + 2 Ready in {:.1}s",
        east_detected.as_secs_f64(),
        west_detected.as_secs_f64(),
        unschedulable.as_secs_f64(),
        STEADY.as_secs_f64(),
        converged.as_secs_f64(),
    );
    Ok(())
}

/// Sets the user taint `maintenance:NoSchedule` on a MemberCluster (or removes it),
/// keeping every other taint (the hub's own included).
async fn set_maintenance(federation: &Federation, cluster: &str, on: bool) -> Result<()> {
    // The hub writes the MemberCluster too (its status, its own taints): a conflict is
    // read again and retried, as any client of a shared object does.
    for _ in 0..5 {
        match try_set_maintenance(federation, cluster, on).await {
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            done => return Ok(done?),
        }
    }
    try_set_maintenance(federation, cluster, on).await?;
    Ok(())
}

async fn try_set_maintenance(
    federation: &Federation,
    cluster: &str,
    on: bool,
) -> Result<(), kube::Error> {
    let api: Api<MemberCluster> = Api::all(federation.hub.clone());
    let current = api.get(cluster).await?;
    let mut taints: Vec<Value> = current
        .spec
        .taints
        .iter()
        .filter(|t| t.key != "maintenance")
        .map(|t| serde_json::to_value(t).unwrap_or_default())
        .collect();
    if on {
        taints.push(json!({"key": "maintenance", "effect": "NoSchedule"}));
    }
    api.patch(
        cluster,
        &PatchParams::default(),
        &Patch::Merge(&json!({
            "metadata": {"resourceVersion": current.resource_version()},
            "spec": {"taints": taints},
        })),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn no_schedule_keeps_a_database_in_place() -> Result<()> {
    let kind = Kind::Database;
    let federation = federation("safe-noschedule", kind, (1, 1)).await?;
    let both = ["east", "west"];
    let before = states(&federation, &both, kind).await?;
    set_maintenance(&federation, "west", true).await?;

    let scaled = Instant::now();
    scale(&federation, kind, 4).await?;
    let west_row = wait_split(&federation, kind, &[("east", 3), ("west", 1)], "west").await?;
    let decided = scaled.elapsed();
    assert!(west_row.selected, "west stays selected");
    assert!(
        west_row.reason.contains("NoSchedule"),
        "{}",
        west_row.reason
    );
    federation
        .wait_copies(
            &databases(),
            "orders",
            "east 3, west 1 Ready",
            Duration::from_secs(120),
            |c| ready_at(c, &[("east", 3), ("west", 1)]),
        )
        .await?;
    let grown = scaled.elapsed();
    let west_now = member_state(&federation, "west", kind).await?;
    assert_eq!(west_now, before["west"], "west untouched");
    let east_now = member_state(&federation, "east", kind).await?;
    assert_eq!(
        east_now.database.as_ref().map(|d| &d.uid),
        before["east"].database.as_ref().map(|d| &d.uid),
        "east grew in place"
    );

    // The taint goes: west may take its share again.
    set_maintenance(&federation, "west", false).await?;
    federation
        .wait_binding(
            &kind.binding(),
            "east 2, west 2 without the taint",
            Duration::from_secs(30),
            |b| (binding_replicas(b) == pairs(&[("east", 2), ("west", 2)])).then_some(()),
        )
        .await?;
    println!(
        "NoSchedule on west: scale 2 -> 4 decided east 3 + west 1 {:.1}s after the scale, Ready {:.1}s after it; \
         west's copy untouched (same UIDs, 1 replica); without the taint the split is 2 + 2 again",
        decided.as_secs_f64(),
        grown.as_secs_f64(),
    );
    Ok(())
}
