//! Progressive rollouts against the lab (docs/rollouts.md).
//!
//! With a real Prometheus: a good revision goes east, then west, then north (the clusters
//! no wave names), each wave only after the one before was healthy for
//! `minHealthySeconds` and its analysis passed; a bad revision (its pods answer half their
//! requests with errors) fails wave 1's analysis and east goes back to the last good
//! revision, while west and north never run it.
//!
//! Drills: a rollout paused after its canary survives a hub restart and a leader change
//! (a second hub replica takes over from a killed leader) at the same wave (nothing
//! re-run, nothing moved); a promotion sent while a cluster of the next wave is
//! cut off waits for the heal (nothing moves in the partition); a wave with
//! `maxUnavailable: 1` updates one cluster at a time; `abort` rolls back.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use bulkhead::api::rollout::{ANNOTATION_REVISION, RolloutPhase, RolloutStatus};
use bulkhead_e2e::federation::{Federation, deployments, policies};
use bulkhead_e2e::hub_support::{bulkhead, path};
use bulkhead_e2e::prometheus_support::{DemoApp, Prometheus};
use bulkhead_e2e::support::Partition;
use kube::ResourceExt;
use serde_json::{Value, json};

const BINDING: &str = "web-deployment";

fn web(image: &str, error_rate: f64) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": image, "env": [
                                  {"name": "DEMO_ERROR_RATE", "value": error_rate.to_string()},
                                  {"name": "DEMO_LATENCY_SECONDS", "value": "0.02"}]}]}}}
    })
}

/// [`web`] whose new pods count as available 3 s after they are Ready: a copy takes that
/// long at least to roll a revision out, which makes a wave's order visible.
fn slow_web(image: &str) -> Value {
    let mut web = web(image, 0.0);
    web["spec"]["minReadySeconds"] = json!(3);
    web
}

/// Every revision each member's copy was seen holding, with when it was first seen.
type Seen = Arc<Mutex<BTreeMap<String, Vec<(String, Instant)>>>>;

/// Polls the members' copies every 200 ms until dropped.
fn watch_revisions(federation: &Federation) -> (Seen, tokio::task::JoinHandle<()>) {
    let seen: Seen = Arc::default();
    let apis: Vec<(String, kube::Api<kube::api::DynamicObject>)> = federation
        .members
        .keys()
        .map(|c| (c.clone(), federation.api(c, &deployments())))
        .collect();
    let record = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            for (cluster, api) in &apis {
                if let Ok(Some(copy)) = api.get_opt("web").await
                    && let Some(revision) = copy.annotations().get(ANNOTATION_REVISION)
                {
                    let mut seen = record.lock().unwrap();
                    let list = seen.entry(cluster.clone()).or_default();
                    if list.last().is_none_or(|(r, _)| r != revision) {
                        list.push((revision.clone(), Instant::now()));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    (seen, task)
}

/// After `what` (a hub restart or a leader change) the rollout of revision 2 is still
/// paused at the canary as `paused` recorded it, started once, and west and north never
/// ran revision 2.
async fn still_paused_at_the_canary(
    federation: &Federation,
    paused: &RolloutStatus,
    seen: &Seen,
    what: &str,
) -> Result<()> {
    federation
        .wait_members_ready(Duration::from_secs(60))
        .await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = wait_rollout(federation, &format!("revision 2 after {what}"), |r| {
        r.revision == 2
    })
    .await?;
    assert_eq!(after.phase, RolloutPhase::Paused, "after {what}: {after:?}");
    assert_eq!(after.wave, 0, "after {what}");
    assert_eq!(
        after.wave_started_at, paused.wave_started_at,
        "after {what}"
    );
    assert_eq!(after.healthy_since, paused.healthy_since, "after {what}");
    let started = federation
        .events_for("Deployment", "web")
        .await?
        .into_iter()
        .filter(|(reason, note)| reason == "RolloutStarted" && note.contains("revision 2"))
        .count();
    assert_eq!(
        started, 1,
        "revision 2's rollout started once (after {what})"
    );
    for cluster in ["west", "north"] {
        assert!(
            first_seen(seen, cluster, "2").is_none(),
            "{cluster} ran revision 2 before its wave (after {what})"
        );
    }
    Ok(())
}

/// Waits for revision 1 to be in every cluster, 2 replicas Ready in each.
async fn first_revision_everywhere(federation: &Federation) -> Result<RolloutStatus> {
    let first = wait_rollout(federation, "revision 1 everywhere", |r| {
        r.phase == RolloutPhase::Completed && r.revision == 1
    })
    .await?;
    federation
        .wait_copies(
            &deployments(),
            "web",
            "2 Ready everywhere",
            Duration::from_secs(90),
            |copies| copies.len() == 3 && copies.iter().all(|c| c.ready >= 2),
        )
        .await?;
    Ok(first)
}

/// Every revision each copy was seen holding, once every copy is Ready again (the
/// poller is stopped).
async fn history_once_ready(
    federation: &Federation,
    seen: &Seen,
    poller: tokio::task::JoinHandle<()>,
) -> Result<BTreeMap<String, Vec<(String, Instant)>>> {
    federation
        .wait_copies(
            &deployments(),
            "web",
            "2 Ready everywhere again",
            Duration::from_secs(60),
            |copies| copies.iter().all(|c| c.ready >= 2),
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    poller.abort();
    Ok(seen.lock().unwrap().clone())
}

fn first_seen(seen: &Seen, cluster: &str, revision: &str) -> Option<Instant> {
    seen.lock()
        .unwrap()
        .get(cluster)?
        .iter()
        .find(|(r, _)| r == revision)
        .map(|(_, at)| *at)
}

/// Runs `bulkhead <verb> <sub> deployment/web -n <ns> --kubeconfig <hub> <rest...>`.
fn cli(federation: &Federation, args: &[&str]) -> Result<String> {
    let hub = path(&federation.lab.kubeconfig("hub"));
    let ns = federation.namespace.clone();
    let mut all = vec![
        args[0],
        args[1],
        "deployment/web",
        "-n",
        &ns,
        "--kubeconfig",
        &hub,
    ];
    all.extend(&args[2..]);
    let output = bulkhead(&all)?;
    anyhow::ensure!(
        output.status.success(),
        "bulkhead {all:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).to_string())
}

/// The binding condition `type_`: (status, reason).
async fn condition(federation: &Federation, type_: &str) -> Result<(String, String)> {
    let binding = federation
        .binding(BINDING)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no binding {BINDING}"))?;
    let status = binding.status.unwrap_or_default();
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .ok_or_else(|| anyhow::anyhow!("no {type_} condition: {:?}", status.conditions))?;
    Ok((c.status.clone(), c.reason.clone()))
}

async fn wait_rollout(
    federation: &Federation,
    what: &str,
    check: impl Fn(&RolloutStatus) -> bool,
) -> Result<RolloutStatus> {
    federation
        .wait_binding(BINDING, what, Duration::from_secs(240), |b| {
            let rollout = b.status.as_ref()?.rollout.as_ref()?;
            check(rollout).then(|| rollout.clone())
        })
        .await
}

// Several threads: the demo application answers Prometheus's scrapes while the test
// runs blocking commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_revision_goes_wave_by_wave_and_a_bad_one_is_rolled_back() -> Result<()> {
    let federation = Federation::start("rollouts", &[]).await?;
    let app = DemoApp::start(federation.members.clone(), &federation.namespace, "web").await?;
    let prometheus = Prometheus::start(&[app.target()]).await?;
    let error_rate = "sum(rate(demo_requests_total{cluster=~\"{{clusters}}\",revision=\"{{revision}}\",code=\"500\"}[10s])) / sum(rate(demo_requests_total{cluster=~\"{{clusters}}\",revision=\"{{revision}}\"}[10s]))";
    // One failed measurement allowed: the first may come before the new revision's rate
    // window holds samples (NaN), as seen in `make demo`.
    let (interval, count) = (3, 3);
    federation
        .apply(
            &policies(),
            federation.policy(
                "web",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}]),
                json!({"replicaScheduling": {"type": "Duplicated"}}),
                json!({"rollout": {
                    "waves": [{"name": "canary", "clusters": ["east"]}, {"clusters": ["west"]}],
                    "minHealthySeconds": 8,
                    "analysis": {"prometheus": prometheus.url(), "intervalSeconds": interval, "count": count, "failureLimit": 1,
                                 "metrics": [{"name": "error-rate", "query": error_rate, "successCondition": "result < 0.05"}]}
                }}),
            ),
        )
        .await?;
    federation
        .apply(&deployments(), web("nginx:1", 0.0))
        .await?;
    let first = first_revision_everywhere(&federation).await?;
    assert_eq!(first.stable_revision, 1);
    let (seen, poller) = watch_revisions(&federation);

    // A good revision: east, then west, then north, each after the wave before passed.
    let started = Instant::now();
    federation
        .apply(&deployments(), web("nginx:2", 0.0))
        .await?;
    let done = wait_rollout(&federation, "revision 2 in every wave", |r| {
        r.phase == RolloutPhase::Completed && r.revision == 2
    })
    .await?;
    assert_eq!((done.stable_revision, done.waves), (2, 3));
    let at = |cluster| {
        first_seen(&seen, cluster, "2").unwrap_or_else(|| panic!("{cluster} never ran revision 2"))
    };
    let (east, west, north) = (at("east"), at("west"), at("north"));
    println!(
        "good revision: east after {:.1}s, west after {:.1}s, north after {:.1}s, completed after {:.1}s",
        (east - started).as_secs_f64(),
        (west - started).as_secs_f64(),
        (north - started).as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    // Each later wave waited for the one before: its health wait (8 s, counted in whole
    // seconds) and its analysis (3 measurements 3 s apart) at the least.
    assert!(
        west >= east + Duration::from_secs(5 + interval as u64),
        "west too early"
    );
    assert!(
        north >= west + Duration::from_secs(5 + interval as u64),
        "north too early"
    );

    // A bad revision: half its requests fail. Wave 1 (east) fails its analysis and goes
    // back to revision 2; west and north never run revision 3.
    let bad = Instant::now();
    federation
        .apply(&deployments(), web("nginx:3", 0.5))
        .await?;
    let failed = wait_rollout(&federation, "revision 3 rolled back", |r| {
        r.phase == RolloutPhase::RolledBack && r.revision == 3
    })
    .await?;
    assert_eq!(
        (failed.stable_revision, failed.failed_revision),
        (2, Some(3))
    );
    let east_bad = first_seen(&seen, "east", "3").expect("east ran revision 3 (wave 1)");
    let history = history_once_ready(&federation, &seen, poller).await?;
    let east_back = history["east"]
        .iter()
        .rev()
        .find(|(r, _)| r == "2")
        .map(|(_, at)| *at)
        .expect("east back on 2");
    assert_eq!(
        history["east"].last().unwrap().0,
        "2",
        "east ends on revision 2: {history:?}"
    );
    for cluster in ["west", "north"] {
        assert!(
            history[cluster].iter().all(|(r, _)| r != "3"),
            "{cluster} ran the bad revision: {history:?}"
        );
    }
    // The budget: from the wave's first measurement, back on the stable revision
    // within interval x failureLimit + 10 s (printed, not asserted: docs/benchmarks.md).
    let east_back_wall = jiff::Timestamp::now() - east_back.elapsed();
    let first_measured = failed
        .analysis
        .first()
        .and_then(|m| m.at.as_ref())
        .map(|at| at.0);
    println!(
        "bad revision: in east after {:.1}s, east back on revision 2 after {:.1}s (from the change), {:.1}s after east got it, {} after the first measurement (budget: {}s)",
        (east_bad - bad).as_secs_f64(),
        (east_back - bad).as_secs_f64(),
        (east_back - east_bad).as_secs_f64(),
        first_measured.map_or("?".to_string(), |at| format!(
            "{:.1}s",
            east_back_wall.duration_since(at).as_secs_f64()
        )),
        interval + 10
    );
    let events = federation.events_for("Deployment", "web").await?;
    let reasons: Vec<&str> = events.iter().map(|(r, _)| r.as_str()).collect();
    for reason in [
        "RolloutStarted",
        "RolloutCompleted",
        "RolloutFailed",
        "RolledBack",
    ] {
        assert!(reasons.contains(&reason), "{reason} in {events:?}");
    }
    let note = &events.iter().find(|(r, _)| r == "RolloutFailed").unwrap().1;
    assert!(note.contains("error-rate"), "{note}");

    // The CLI: status, history, and undo (the template back to the stable revision's
    // content, which is revision 2 again: nothing moves).
    let cli = |args: &[&str]| cli(&federation, args);
    let status = cli(&["rollout", "status"])?;
    assert!(
        status.contains("revision 3 (stable 2): RolledBack"),
        "{status}"
    );
    assert!(status.contains("analysis 1: FAILED error-rate"), "{status}");
    let history = cli(&["rollout", "history"])?;
    for line in ["1 ", "2 ", "3 "] {
        assert!(history.lines().any(|l| l.starts_with(line)), "{history}");
    }
    assert!(
        history
            .lines()
            .any(|l| l.starts_with('3') && l.ends_with("current")),
        "{history}"
    );
    cli(&["rollout", "undo"])?;
    let undone = wait_rollout(&federation, "back on revision 2", |r| {
        r.phase == RolloutPhase::Completed && r.revision == 2
    })
    .await?;
    assert!(
        undone
            .clusters
            .iter()
            .all(|c| c.revision == 2 && c.running == Some(2)),
        "{undone:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_survives_a_hub_restart_and_waits_out_a_partition() -> Result<()> {
    let mut federation = Federation::start("rollout-drills", &[]).await?;
    federation
        .apply(
            &policies(),
            federation.policy(
                "web",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}]),
                json!({"replicaScheduling": {"type": "Duplicated"}}),
                json!({"rollout": {
                    "waves": [{"name": "canary", "clusters": ["east"], "pause": {"manual": true}},
                              {"name": "the-rest", "clusters": ["west", "north"], "maxUnavailable": 1}],
                    "minHealthySeconds": 3
                }}),
            ),
        )
        .await?;
    federation
        .apply(&deployments(), slow_web("nginx:1"))
        .await?;
    first_revision_everywhere(&federation).await?;
    let (seen, poller) = watch_revisions(&federation);

    // Revision 2: the canary passes and the rollout waits for a promotion.
    federation
        .apply(&deployments(), slow_web("nginx:2"))
        .await?;
    let paused = wait_rollout(&federation, "the canary passed, paused", |r| {
        r.revision == 2 && r.phase == RolloutPhase::Paused
    })
    .await?;
    assert_eq!(
        (paused.wave, paused.pause_reason.as_deref()),
        (0, Some("Manual"))
    );
    assert_eq!(
        condition(&federation, "Progressing").await?,
        ("Unknown".into(), "RolloutPaused".into())
    );

    // A hub restart in the middle, then a leader change (a second hub replica takes over
    // from a killed leader): each time the rollout is where it was (same wave, same
    // start), nothing is re-run (no second RolloutStarted) and nothing moves.
    federation.kill_hub();
    federation.start_hub()?;
    still_paused_at_the_canary(&federation, &paused, &seen, "the restart").await?;
    let _standby = federation.start_another_hub("rollout-drills-standby")?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    federation.kill_hub();
    still_paused_at_the_canary(&federation, &paused, &seen, "the leader change").await?;

    // West (of the next wave) cut off, then a promotion: nothing moves until the heal.
    let partition = Partition::start(&federation.lab, "west")?;
    wait_rollout(&federation, "waiting for west", |r| {
        r.waiting_for.iter().any(|c| c == "west")
    })
    .await?;
    cli(&federation, &["rollout", "promote"])?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let held = wait_rollout(&federation, "still at the canary", |_| true).await?;
    assert_eq!(
        (held.wave, held.phase),
        (0, RolloutPhase::Paused),
        "{held:?}"
    );
    assert!(
        held.clusters
            .iter()
            .all(|c| c.revision == if c.name == "east" { 2 } else { 1 }),
        "nothing moved in the partition: {held:?}"
    );
    assert!(
        first_seen(&seen, "north", "2").is_none(),
        "north moved in the partition"
    );
    assert_eq!(
        condition(&federation, "Progressing").await?.0,
        "Unknown",
        "the rollout waits"
    );
    let healed = Instant::now();
    partition.heal()?;

    // After the heal the promotion is carried out; the last wave takes revision 2 one
    // cluster at a time (north first, by name), and the rollout completes.
    wait_rollout(&federation, "revision 2 everywhere", |r| {
        r.phase == RolloutPhase::Completed && r.revision == 2
    })
    .await?;
    let (north, west) = (
        first_seen(&seen, "north", "2").expect("north ran 2"),
        first_seen(&seen, "west", "2").expect("west ran 2"),
    );
    assert!(north >= healed, "north waited for the heal");
    assert!(
        west > north + Duration::from_secs(2),
        "west after north rolled out (maxUnavailable: 1): north {:?}, west {:?} after the heal",
        north - healed,
        west.saturating_duration_since(healed)
    );
    println!(
        "after the heal: north ran revision 2 after {:.1}s, west after {:.1}s",
        (north - healed).as_secs_f64(),
        (west - healed).as_secs_f64()
    );
    assert_eq!(
        condition(&federation, "Progressing").await?,
        ("False".into(), "RolloutCompleted".into())
    );

    // Revision 3, aborted at the canary: east goes back to 2, the others never ran 3.
    federation
        .apply(&deployments(), slow_web("nginx:3"))
        .await?;
    wait_rollout(&federation, "revision 3's canary passed", |r| {
        r.revision == 3 && r.phase == RolloutPhase::Paused
    })
    .await?;
    cli(&federation, &["rollout", "abort"])?;
    let aborted = wait_rollout(&federation, "revision 3 aborted", |r| {
        r.revision == 3 && r.phase == RolloutPhase::Aborted
    })
    .await?;
    assert_eq!(
        (aborted.stable_revision, aborted.failed_revision),
        (2, Some(3))
    );
    assert_eq!(
        condition(&federation, "RolledBack").await?,
        ("True".into(), "Aborted".into())
    );
    let history = history_once_ready(&federation, &seen, poller).await?;
    assert_eq!(history["east"].last().unwrap().0, "2", "{history:?}");
    for cluster in ["west", "north"] {
        assert!(
            history[cluster].iter().all(|(r, _)| r != "3"),
            "{cluster} ran the aborted revision: {history:?}"
        );
    }
    Ok(())
}
