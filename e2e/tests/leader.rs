//! Two `bulkhead hub` processes with `--leader-elect` against the lab's hub, sharing one
//! Lease: exactly one writes; when the leader is killed (SIGKILL) during a burst of
//! templates the standby takes over, propagates every template and applies only the
//! copies that were missing (what a cold start does), with no eviction or delete; a
//! leader stopped with SIGTERM releases the Lease and the standby leads at once.
//! docs/high-availability.md describes the protocol.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bulkhead_e2e::federation::{Federation, deployments, metric_sample, policies};
use bulkhead_e2e::hub_support::{HubProcess, counter_sum};
use bulkhead_e2e::support::http_get;
use bulkhead_e2e::{Check, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

/// The election timing of the test: long enough that "took over at once" and "waited
/// for the Lease to expire" cannot be confused.
const LEASE_DURATION: Duration = Duration::from_secs(8);
const RENEW_DEADLINE: &str = "5s";
const RETRY_PERIOD: &str = "1s";
/// Namespace of the leader Lease (exists on the lab's hub: `bulkhead join` stores the
/// member Secrets there); the Lease name is unique per test run.
const LEASE_NAMESPACE: &str = "bulkhead-system";

/// Templates created before the burst, to see who writes.
const WARM: usize = 5;
/// Templates of the burst, created by `CREATORS` clients, one every `PACE` each.
const BURST: usize = 50;
const CREATORS: usize = 4;
const PACE: Duration = Duration::from_millis(400);
/// The leader is killed once this many burst templates exist.
const KILL_AFTER: usize = 20;

/// The hub flags of the tests' election, with Lease `lease`.
fn election_args(lease: &str) -> Vec<String> {
    [
        "--leader-elect",
        "--leader-elect-namespace",
        LEASE_NAMESPACE,
        "--leader-elect-lease-name",
        lease,
        "--leader-elect-lease-duration",
        &format!("{}s", LEASE_DURATION.as_secs()),
        "--leader-elect-renew-deadline",
        RENEW_DEADLINE,
        "--leader-elect-retry-period",
        RETRY_PERIOD,
    ]
    .map(String::from)
    .to_vec()
}

/// Deletes the test's Lease from the lab's hub (best effort).
async fn delete_lease(lease: &str) -> Result<()> {
    let hub = bulkhead_e2e::support::lab().await?.client("hub").await?;
    let _ = Api::<Lease>::namespaced(hub, LEASE_NAMESPACE)
        .delete(lease, &Default::default())
        .await;
    Ok(())
}

fn deployment(name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "app", "image": "nginx"}]}}}
    })
}

/// What one hub process has done, from its metrics.
#[derive(Debug, Default, Clone, PartialEq)]
struct Activity {
    leader: Option<f64>,
    hub_writes: f64,
    applies: f64,
    deletes: f64,
    member_calls: f64,
    evictions: f64,
    fencing_renewals: f64,
    status_writes: f64,
}

impl Activity {
    fn of(text: &str) -> Self {
        Activity {
            leader: metric_sample(text, "bulkhead_hub_leader"),
            hub_writes: counter_sum(text, "bulkhead_hub_writes_total", ""),
            applies: counter_sum(
                text,
                "bulkhead_member_api_calls_total",
                "verb=\"apply\",result=\"ok\"",
            ),
            deletes: counter_sum(text, "bulkhead_member_api_calls_total", "verb=\"delete\"")
                + counter_sum(
                    text,
                    "bulkhead_member_api_calls_total",
                    "verb=\"mark_deleted\"",
                ),
            member_calls: counter_sum(text, "bulkhead_member_api_calls_total", ""),
            evictions: counter_sum(text, "bulkhead_evictions_total", ""),
            fencing_renewals: counter_sum(text, "bulkhead_lease_renewals_total", ""),
            status_writes: counter_sum(text, "bulkhead_member_status_writes_total", ""),
        }
    }
}

async fn activity(hub: &HubProcess) -> Result<Activity> {
    Ok(Activity::of(&hub.metrics().await?))
}

/// Waits until the process says it leads (`leader`) or is a standby.
async fn wait_leader(hub: &HubProcess, what: &str, leader: bool, timeout: Duration) -> Result<()> {
    wait_leader_in(|| hub.metrics(), what, leader, timeout).await
}

/// Waits (lease duration + slack) until `standby` leads; prints how long after `since`.
async fn wait_takeover(standby: &HubProcess, what: &str, since: Instant) -> Result<()> {
    wait_leader(
        standby,
        what,
        true,
        LEASE_DURATION + Duration::from_secs(15),
    )
    .await?;
    eprintln!(
        "{what}: {:?} (lease duration {LEASE_DURATION:?})",
        since.elapsed()
    );
    Ok(())
}

/// [`wait_leader`] for the process whose metrics `metrics` reads.
async fn wait_leader_in<F, Fut>(
    metrics: F,
    what: &str,
    leader: bool,
    timeout: Duration,
) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<String>>,
{
    let wanted = if leader { 1.0 } else { 0.0 };
    let metrics = &metrics;
    wait_for(what, timeout, || async move {
        match metrics().await {
            Ok(text) => match metric_sample(&text, "bulkhead_hub_leader") {
                Some(value) if value == wanted => Check::Done(()),
                value => Check::Waiting(format!("bulkhead_hub_leader {value:?}")),
            },
            Err(e) => Check::Waiting(e.to_string()),
        }
    })
    .await
}

/// Applies a policy that sends every Deployment of the namespace to every member, then
/// `WARM` Deployments named `<prefix>-<i>`, and waits for their copies; returns the
/// number of members.
async fn propagate_warm_up(federation: &Federation, prefix: &str) -> Result<usize> {
    federation
        .apply(
            &policies(),
            federation.policy(
                "every-deployment",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment"}]),
                json!({}),
                json!({}),
            ),
        )
        .await?;
    for i in 0..WARM {
        federation
            .apply(&deployments(), deployment(&format!("{prefix}-{i}")))
            .await?;
    }
    let members = federation.members.len();
    wait_copies(federation, WARM * members, Duration::from_secs(60)).await?;
    Ok(members)
}

/// Waits until the process's member calls and hub writes have not moved for `quiet`.
async fn settle(hub: &HubProcess, quiet: Duration, timeout: Duration) -> Result<Activity> {
    let started = Instant::now();
    let mut last = activity(hub).await?;
    let mut stable_since = Instant::now();
    while stable_since.elapsed() < quiet {
        anyhow::ensure!(
            started.elapsed() < timeout,
            "hub still writing after {timeout:?}: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = activity(hub).await?;
        if (now.member_calls, now.hub_writes) != (last.member_calls, last.hub_writes) {
            stable_since = Instant::now();
        }
        last = now;
    }
    Ok(last)
}

async fn lease_holder(federation: &Federation, name: &str) -> Result<Option<String>> {
    let lease = Api::<Lease>::namespaced(federation.hub.clone(), LEASE_NAMESPACE)
        .get_opt(name)
        .await?;
    Ok(lease
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// Every Deployment copy in the members: "cluster/name" -> (uid, generation).
async fn member_copies(federation: &Federation) -> Result<BTreeMap<String, (String, i64)>> {
    let mut copies = BTreeMap::new();
    for (cluster, client) in &federation.members {
        let api = Api::<DynamicObject>::namespaced_with(
            client.clone(),
            &federation.namespace,
            &deployments(),
        );
        for object in api.list(&ListParams::default()).await?.items {
            copies.insert(
                format!("{cluster}/{}", object.name_any()),
                (
                    object.uid().unwrap_or_default(),
                    object.metadata.generation.unwrap_or_default(),
                ),
            );
        }
    }
    Ok(copies)
}

/// What the hub writes of each template, by name: its binding's spec and status and the
/// template's status (a takeover with nothing to change must leave each as it was).
async fn hub_written(federation: &Federation) -> Result<BTreeMap<String, Value>> {
    let mut written = BTreeMap::new();
    let bindings: Api<bulkhead::api::ResourceBinding> =
        Api::namespaced(federation.hub.clone(), &federation.namespace);
    for binding in bindings.list(&ListParams::default()).await?.items {
        written.insert(
            format!("binding {}", binding.name_any()),
            json!({"spec": binding.spec, "status": binding.status}),
        );
    }
    let templates = Api::<DynamicObject>::namespaced_with(
        federation.hub.clone(),
        &federation.namespace,
        &deployments(),
    );
    for template in templates.list(&ListParams::default()).await?.items {
        written.insert(
            format!("template {}", template.name_any()),
            template.data["status"].clone(),
        );
    }
    Ok(written)
}

/// The entries of `after` that differ from `before`, both sides, for the failure message.
fn changed_entries(before: &BTreeMap<String, Value>, after: &BTreeMap<String, Value>) -> String {
    after
        .iter()
        .filter(|(name, value)| before.get(*name) != Some(value))
        .map(|(name, value)| {
            format!(
                "{name}\n  before: {}\n  after:  {value}",
                before.get(name).map_or("(none)".into(), Value::to_string)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn wait_copies(federation: &Federation, wanted: usize, timeout: Duration) -> Result<()> {
    wait_for(&format!("{wanted} member copies"), timeout, || async {
        match member_copies(federation).await {
            Ok(copies) if copies.len() == wanted => Check::Done(()),
            Ok(copies) => Check::Waiting(format!("{} copies", copies.len())),
            Err(e) => Check::Waiting(e.to_string()),
        }
    })
    .await
}

#[tokio::test]
async fn one_hub_leads_a_killed_leader_is_replaced_and_a_stopped_one_hands_over() -> Result<()> {
    let lease = format!("e2e-hub-leader-{}", std::process::id());
    let election = election_args(&lease);
    let election: Vec<&str> = election.iter().map(String::as_str).collect();
    // The federation's own hub starts first and takes the Lease (the members turn Ready
    // only when a leader writes their status).
    let mut federation = Federation::start("leader", &election).await?;
    let first = federation.hub_identity().context("identity")?.to_string();
    let second = format!("{first}-b");
    let mut standby = federation.start_another_hub(&second)?;
    wait_leader(
        &standby,
        "the second hub to run as a standby",
        false,
        Duration::from_secs(60),
    )
    .await?;
    assert_eq!(
        lease_holder(&federation, &lease).await?.as_deref(),
        Some(first.as_str())
    );
    for (who, port) in [("second", standby.probe_port)] {
        let (status, body) = http_get(port, "/readyz").await?;
        assert_eq!(status, 200, "the {who} hub (a standby) is ready: {body}");
    }

    // Exactly one writes: templates propagated by the leader, nothing by the standby,
    // which probes the members all the same.
    let members = propagate_warm_up(&federation, "warm").await?;
    let leader_activity = Activity::of(&federation.hub_metrics().await?);
    let standby_text = standby.metrics().await?;
    let standby_activity = Activity::of(&standby_text);
    eprintln!("leader {leader_activity:?}\nstandby {standby_activity:?}");
    assert_eq!(leader_activity.leader, Some(1.0));
    assert!(leader_activity.applies >= (WARM * members) as f64);
    assert!(leader_activity.hub_writes > 0.0 && leader_activity.fencing_renewals > 0.0);
    assert_eq!(
        standby_activity,
        Activity {
            leader: Some(0.0),
            ..Default::default()
        },
        "the standby writes nothing: no hub writes, member calls, fencing renewals or status writes"
    );
    assert!(
        standby_text.contains("bulkhead_member_ready{cluster=\"east\"} 1"),
        "the standby probes the members"
    );

    // The burst; the leader is killed part-way.
    let created = Arc::new(AtomicUsize::new(0));
    let mut creators = vec![];
    for creator in 0..CREATORS {
        let hub = federation.hub.clone();
        let namespace = federation.namespace.clone();
        let created = created.clone();
        creators.push(tokio::spawn(async move {
            let api = Api::<DynamicObject>::namespaced_with(hub, &namespace, &deployments());
            for i in (creator..BURST).step_by(CREATORS) {
                let object: DynamicObject =
                    serde_json::from_value(deployment(&format!("burst-{i}")))?;
                api.create(&Default::default(), &object).await?;
                created.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(PACE).await;
            }
            anyhow::Ok(())
        }));
    }
    wait_for(
        "the burst to be under way",
        Duration::from_secs(30),
        || async {
            let n = created.load(Ordering::SeqCst);
            if n >= KILL_AFTER {
                Check::Done(())
            } else {
                Check::Waiting(format!("{n} created"))
            }
        },
    )
    .await?;
    let before_kill = Activity::of(&federation.hub_metrics().await?);
    federation.kill_hub();
    let killed = Instant::now();
    eprintln!(
        "killed the leader after {} burst templates; its last metrics: {before_kill:?}",
        created.load(Ordering::SeqCst)
    );
    // Requests the dead leader had in flight have landed or died by now, and the standby
    // cannot lead before the Lease expires (the leader renewed it at most a retry period
    // before the kill): every copy that exists now was the old leader's.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let at_kill = member_copies(&federation).await?;
    let standby_at_kill = activity(&standby).await?;
    assert!(
        killed.elapsed() < LEASE_DURATION - Duration::from_secs(2),
        "the snapshot is taken well before the Lease expires"
    );
    assert_eq!(
        standby_at_kill.leader,
        Some(0.0),
        "still a standby at the snapshot"
    );
    assert_eq!(standby_at_kill.member_calls, 0.0);
    for creator in creators {
        creator.await??;
    }

    wait_takeover(
        &standby,
        "the standby to lead after the leader was killed",
        killed,
    )
    .await?;
    assert_eq!(
        lease_holder(&federation, &lease).await?.as_deref(),
        Some(second.as_str())
    );

    let wanted = (WARM + BURST) * members;
    wait_copies(&federation, wanted, Duration::from_secs(120)).await?;
    let after = settle(&standby, Duration::from_secs(3), Duration::from_secs(120)).await?;
    let copies = member_copies(&federation).await?;
    let missing = wanted - at_kill.len();
    eprintln!(
        "{} of {wanted} copies existed when the leader died; the new leader applied {} (hub writes {}), deleted {}, evicted {}",
        at_kill.len(),
        after.applies,
        after.hub_writes,
        after.deletes,
        after.evictions
    );
    // The bound. Only the new leader writes after the snapshot, so it applied every
    // missing copy at least once: `applies >= missing`. It starts cold from what it
    // reads, so it applies none of the copies the dead leader had applied (their UIDs and
    // generations are checked below). What can exceed `missing` is the controller's own
    // burst behaviour on a single hub: a pass that runs before the copy cache has seen the
    // previous pass's apply applies the same copy again, a no-op in the member (every
    // copy's generation stays 1). That is allowed up to 5 % of the missing copies; a
    // second writer, or a cold start re-applying what exists, would be far above it.
    let excess = after.applies - missing as f64;
    assert!(
        excess >= 0.0,
        "the new leader applied fewer copies ({}) than were missing ({missing})",
        after.applies
    );
    assert!(
        excess <= (missing as f64 * 0.05).ceil(),
        "the new leader applied {} copies for {missing} missing ones",
        after.applies
    );
    assert_eq!(after.deletes, 0.0, "no copy deleted");
    assert_eq!(after.evictions, 0.0, "no eviction");
    assert_eq!(before_kill.deletes + before_kill.evictions, 0.0);
    for (copy, (uid, _)) in &at_kill {
        assert_eq!(
            copies.get(copy).map(|(u, _)| u),
            Some(uid),
            "{copy} is the copy the old leader applied (not deleted and recreated)"
        );
    }
    let rewritten: BTreeSet<&String> = copies
        .iter()
        .filter(|(_, (_, generation))| *generation != 1)
        .map(|(copy, _)| copy)
        .collect();
    assert!(
        rewritten.is_empty(),
        "copies whose spec was written more than once: {rewritten:?}"
    );

    // The new leader has finished: every binding and template status written (on a slow
    // machine the burst's pods become Ready late, and a status still on its way would be
    // the next leader's to write, which the "nothing to change" check below would count).
    wait_all_converged(&federation, WARM + BURST).await?;

    // SIGTERM hands over at once: the old leader's identity comes back as a standby, the
    // leader is stopped, releases the Lease, and the standby leads well before the Lease
    // could have expired (the stopping leader renewed it until it released it).
    federation.start_hub()?;
    wait_leader_in(
        || federation.hub_metrics(),
        "the restarted hub to run as a standby",
        false,
        Duration::from_secs(60),
    )
    .await?;
    let before_handover = hub_written(&federation).await?;
    let stopping = Instant::now();
    let clean = standby.terminate(Duration::from_secs(15)).await?;
    let stopped = stopping.elapsed();
    assert!(clean, "the leader exits cleanly on SIGTERM");
    let handover = wait_for(
        "the standby to lead after the leader's SIGTERM",
        LEASE_DURATION + Duration::from_secs(15),
        || async {
            match federation.hub_metrics().await {
                Ok(text) if metric_sample(&text, "bulkhead_hub_leader") == Some(1.0) => {
                    Check::Done(stopping.elapsed())
                }
                Ok(_) => Check::Waiting("standby".into()),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    eprintln!(
        "SIGTERM: the leader exited after {stopped:?}; the standby led {handover:?} after the signal"
    );
    let log = std::fs::read_to_string(
        federation
            .lab
            .log_dir("hub")
            .join(format!("{}-{second}.log", federation.namespace)),
    )?;
    assert!(
        log.contains("released the leader Lease"),
        "the stopping leader released the Lease"
    );
    assert!(
        handover < stopped + LEASE_DURATION / 2,
        "the standby took the released Lease instead of waiting for it to expire ({handover:?})"
    );
    assert_eq!(
        lease_holder(&federation, &lease).await?.as_deref(),
        Some(first.as_str())
    );
    // A takeover with nothing to change writes nothing.
    federation.wait_settled(Duration::from_secs(120)).await?;
    let last = Activity::of(&federation.hub_metrics().await?);
    eprintln!("the leader after the handover: {last:?}");
    assert_eq!(
        (last.applies, last.deletes, last.evictions),
        (0.0, 0.0, 0.0)
    );
    if last.hub_writes != 0.0 {
        // What was written, for the next person to look at.
        let text = federation.hub_metrics().await?;
        for line in text
            .lines()
            .filter(|l| l.starts_with("bulkhead_hub_writes_total"))
        {
            eprintln!("{line}");
        }
        let after = hub_written(&federation).await?;
        eprintln!(
            "what the new leader changed:\n{}",
            changed_entries(&before_handover, &after)
        );
    }
    assert_eq!(last.hub_writes, 0.0, "nothing to change, nothing written");
    assert_eq!(member_copies(&federation).await?, copies);

    drop(federation);
    delete_lease(&lease).await
}

/// A leader that is frozen (SIGSTOP: a paused VM, a stalled node) longer than the lease
/// duration is replaced; when it resumes it finds its renew deadline passed and the Lease
/// held by the other replica, stops leading at once and writes nothing more.
#[tokio::test]
async fn a_frozen_leader_is_replaced_and_stops_writing_when_it_resumes() -> Result<()> {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let lease = format!("e2e-hub-leader-frozen-{}", std::process::id());
    let election = election_args(&lease);
    let election: Vec<&str> = election.iter().map(String::as_str).collect();
    let federation = Federation::start("leader-frozen", &election).await?;
    let first = federation.hub_identity().context("identity")?.to_string();
    let second = format!("{first}-b");
    let standby = federation.start_another_hub(&second)?;
    wait_leader(
        &standby,
        "the second hub to run as a standby",
        false,
        Duration::from_secs(60),
    )
    .await?;
    let members = propagate_warm_up(&federation, "before").await?;

    let pid = Pid::from_raw(federation.hub_pid().context("hub pid")? as i32);
    // Freeze a quiet leader, so that no write of its is in flight across the freeze (the
    // fencing renewals never stop: one per member may be, and is allowed below).
    let mut before = Activity::of(&federation.hub_metrics().await?);
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = Activity::of(&federation.hub_metrics().await?);
        if (now.member_calls, now.hub_writes) != (before.member_calls, before.hub_writes) {
            quiet_since = Instant::now();
        }
        before = now;
    }
    kill(pid, Signal::SIGSTOP)?;
    let frozen = Instant::now();
    let resumed = async {
        wait_takeover(
            &standby,
            "the standby to lead while the leader is frozen",
            frozen,
        )
        .await?;
        for i in 0..WARM {
            federation
                .apply(&deployments(), deployment(&format!("during-{i}")))
                .await?;
        }
        wait_copies(&federation, 2 * WARM * members, Duration::from_secs(60)).await
    }
    .await;
    kill(pid, Signal::SIGCONT)?;
    resumed?;
    let thawed = Instant::now();
    wait_leader_in(
        || federation.hub_metrics(),
        "the resumed hub to stand by",
        false,
        Duration::from_secs(10),
    )
    .await?;
    let stepped_down = Activity::of(&federation.hub_metrics().await?);
    eprintln!(
        "the resumed hub stood by {:?} after SIGCONT; before the freeze {before:?}, after {stepped_down:?}",
        thawed.elapsed()
    );
    tokio::time::sleep(LEASE_DURATION).await;
    let later = Activity::of(&federation.hub_metrics().await?);
    assert_eq!(later.leader, Some(0.0), "it does not lead again");
    // Nothing written from the moment it froze: its writers check the renew deadline by
    // the clock at each write, so the first instant after SIGCONT already refuses them.
    let writes = |a: &Activity| {
        (
            a.applies,
            a.deletes,
            a.evictions,
            a.hub_writes,
            a.status_writes,
        )
    };
    assert!(
        stepped_down.fencing_renewals - before.fencing_renewals <= members as f64,
        "at most the renewals in flight at the freeze complete after it"
    );
    assert_eq!(later.fencing_renewals, stepped_down.fencing_renewals);
    assert_eq!(
        writes(&stepped_down),
        writes(&before),
        "a deposed leader writes nothing when it resumes"
    );
    assert_eq!(writes(&later), writes(&before), "nor later");
    assert_eq!(stepped_down.deletes + stepped_down.evictions, 0.0);
    assert_eq!(
        lease_holder(&federation, &lease).await?.as_deref(),
        Some(second.as_str())
    );
    wait_leader(
        &standby,
        "the other replica to keep leading",
        true,
        Duration::from_secs(5),
    )
    .await?;
    drop(standby);
    drop(federation);
    delete_lease(&lease).await
}

/// Waits until each of the `templates` templates of the test namespace has its binding,
/// Propagated=True and Healthy=True: the leader has written every binding status it will
/// write for the current state. (A new stateless template's binding is written once its
/// copies converge: counting only the bindings that exist let a slow machine's last ones
/// through, and the next leader wrote them.)
async fn wait_all_converged(federation: &Federation, templates: usize) -> Result<()> {
    let api: Api<bulkhead::api::ResourceBinding> =
        Api::namespaced(federation.hub.clone(), &federation.namespace);
    wait_for(
        "every binding Propagated and Healthy",
        Duration::from_secs(180),
        || {
            let api = api.clone();
            async move {
                let bindings = match api.list(&ListParams::default()).await {
                    Ok(list) => list.items,
                    Err(e) => return Check::Waiting(e.to_string()),
                };
                let waiting = bindings
                    .iter()
                    .filter(|b| {
                        let conditions = b.status.as_ref().map(|s| s.conditions.as_slice());
                        !["Propagated", "Healthy"].iter().all(|type_| {
                            conditions.is_some_and(|c| bulkhead::api::is_condition_true(c, type_))
                        })
                    })
                    .count();
                if waiting == 0 && bindings.len() == templates {
                    Check::Done(())
                } else {
                    Check::Waiting(format!(
                        "{} of {templates} bindings, {waiting} of them not yet Propagated and Healthy",
                        bindings.len()
                    ))
                }
            }
        },
    )
    .await
}
