//! Lab benchmarks for the propagation budgets in DESIGN.md section 9. They print numbers
//! and assert only correctness (every copy arrives), never time: `make bench-lab` runs
//! them (they are `#[ignore]`d in `make test`). BULKHEAD_BENCH_TEMPLATES (default 500)
//! and BULKHEAD_BENCH_REPLICAS (default 3) size the burst.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::Result;
use bulkhead_e2e::federation::{Federation, deployments, policies};
use futures::StreamExt;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::sync::mpsc;

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Member copies seen by watches in every member: (cluster, name, spec.replicas) -> when.
fn watch_copies(
    federation: &Federation,
) -> mpsc::UnboundedReceiver<(String, String, i64, Instant)> {
    let (sender, receiver) = mpsc::unbounded_channel();
    for (cluster, client) in &federation.members {
        let api = Api::<DynamicObject>::namespaced_with(
            client.clone(),
            &federation.namespace,
            &deployments(),
        );
        let (cluster, sender) = (cluster.clone(), sender.clone());
        tokio::spawn(async move {
            let stream = watcher(
                api,
                watcher::Config::default().labels("federation.example.com/managed-by=bulkhead"),
            )
            .applied_objects();
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                if let Ok(object) = event {
                    let replicas = object.data["spec"]["replicas"].as_i64().unwrap_or(-1);
                    let name = kube::ResourceExt::name_any(&object);
                    if sender
                        .send((cluster.clone(), name, replicas, Instant::now()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        });
    }
    receiver
}

/// Waits until every (cluster, name) in `wanted` has been seen with its replica count;
/// returns when the last one arrived.
async fn wait_seen(
    receiver: &mut mpsc::UnboundedReceiver<(String, String, i64, Instant)>,
    wanted: &HashMap<(String, String), i64>,
    timeout: Duration,
) -> Result<Instant> {
    let mut missing: HashSet<&(String, String)> = wanted.keys().collect();
    let mut last = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    while !missing.is_empty() {
        let Ok(Some((cluster, name, replicas, at))) =
            tokio::time::timeout_at(deadline, receiver.recv()).await
        else {
            anyhow::bail!(
                "{} member copies still missing after {timeout:?}",
                missing.len()
            );
        };
        let key = (cluster, name);
        if wanted.get(&key) == Some(&replicas) && missing.remove(&key) {
            last = at;
        }
    }
    Ok(last)
}

async fn writes_by_kind(federation: &Federation) -> Result<BTreeMap<String, f64>> {
    let text = federation.hub_metrics().await?;
    let mut writes = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("bulkhead_hub_writes_total{"))
    {
        let what = line
            .split("what=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("?");
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        writes.insert(what.to_string(), value);
    }
    Ok(writes)
}

/// Waits until the hub's write counters have not moved for `quiet`.
async fn settle(
    federation: &Federation,
    quiet: Duration,
    timeout: Duration,
) -> Result<BTreeMap<String, f64>> {
    let started = Instant::now();
    let mut last = writes_by_kind(federation).await?;
    let mut stable_since = Instant::now();
    while stable_since.elapsed() < quiet {
        anyhow::ensure!(
            started.elapsed() < timeout,
            "hub writes still moving after {timeout:?}: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = writes_by_kind(federation).await?;
        if now != last {
            last = now;
            stable_since = Instant::now();
        }
    }
    Ok(last)
}

fn hub_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

#[tokio::test]
#[ignore = "lab benchmark: make bench-lab"]
async fn bench_burst_update_and_cold_start() -> Result<()> {
    let templates = env_number("BULKHEAD_BENCH_TEMPLATES", 500);
    let replicas = env_number("BULKHEAD_BENCH_REPLICAS", 3) as i64;
    // Default probes (5 s, timeout 3 s): on 2 cores under a burst, 1 s probes time out.
    let mut federation = Federation::start_with_probes("scale", &[], &["5", "3"]).await?;
    federation
        .apply(
            &policies(),
            federation.policy(
                "all",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment"}]),
                json!({"replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted"}}),
                json!({}),
            ),
        )
        .await?;
    let mut seen = watch_copies(&federation);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let template = |i: usize, replicas: i64| {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": format!("burst-{i:04}")},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "burst"}},
                     "template": {"metadata": {"labels": {"app": "burst"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
        })
    };

    // 1. Burst: create every template, 16 at a time.
    let hub = federation.api("hub", &deployments());
    let started = Instant::now();
    stream_creates(
        &hub,
        (0..templates).map(|i| template(i, replicas)).collect(),
    )
    .await?;
    let created = started.elapsed();
    // Each member gets a copy of every template; the shares are whatever Webster gives
    // (checked by the bindings), so only presence is awaited here.
    let mut missing: HashSet<(String, String)> = federation
        .members
        .keys()
        .flat_map(|cluster| (0..templates).map(move |i| (cluster.clone(), format!("burst-{i:04}"))))
        .collect();
    let copies = missing.len();
    let mut last = started;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while !missing.is_empty() {
        let Ok(Some((cluster, name, _, at))) = tokio::time::timeout_at(deadline, seen.recv()).await
        else {
            anyhow::bail!(
                "{} of {copies} member copies missing after 300 s",
                missing.len()
            );
        };
        if missing.remove(&(cluster, name)) {
            last = at;
        }
    }
    let all_applied = last.duration_since(started);
    println!("burst: {templates} Deployments x {replicas} replicas, weighted over 3 members");
    println!(
        "  creates took {:.1} s; all {} member copies applied {:.1} s after the first create (budget 6 s for 500)",
        created.as_secs_f64(),
        templates * 3,
        all_applied.as_secs_f64()
    );
    // Quiet for longer than a converging status may wait (5 s), so nothing is pending.
    let settled_writes = settle(
        &federation,
        Duration::from_secs(12),
        Duration::from_secs(300),
    )
    .await?;
    let total_writes: f64 = settled_writes.values().sum();
    let rss = federation.hub_pid().and_then(hub_rss_mib);
    println!(
        "  hub writes once settled: {total_writes:.0} = {:.2} per template ({settled_writes:?}; budget <= 3 per template)",
        total_writes / templates as f64
    );
    println!(
        "  hub RSS: {} MiB with {templates} templates (budget <= 100 MiB with 10,000)",
        rss.map_or("?".into(), |r| format!("{r:.0}"))
    );

    // 2. 100 templates change replicas: every member copy updated.
    let changed = templates.min(100);
    let new_total = replicas * 2;
    let update_started = Instant::now();
    let patches = (0..changed).map(|i| {
        let hub = hub.clone();
        async move {
            hub.patch(
                &format!("burst-{i:04}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": new_total}})),
            )
            .await
        }
    });
    let results: Vec<_> = futures::stream::iter(patches)
        .buffer_unordered(16)
        .collect()
        .await;
    for result in results {
        result?;
    }
    // Which counts each cluster gets is the binding's business; wait for a change from
    // the first burst's copies to land in every member for every changed template.
    let mut expected = HashMap::new();
    for i in 0..changed {
        let name = format!("burst-{i:04}-deployment");
        let binding = federation
            .wait_binding(&name, "the new replicas", Duration::from_secs(60), |b| {
                (b.spec.replicas == new_total as i32).then(|| b.clone())
            })
            .await?;
        for (cluster, replicas) in bulkhead_e2e::federation::binding_replicas(&binding) {
            expected.insert((cluster, format!("burst-{i:04}")), replicas);
        }
    }
    let update_last = wait_seen(&mut seen, &expected, Duration::from_secs(120)).await?;
    let updated = update_last.duration_since(update_started);
    println!(
        "update: {changed} templates change replicas: every member copy updated {:.2} s after the first change (budget 1 s)",
        updated.as_secs_f64()
    );
    settle(
        &federation,
        Duration::from_secs(12),
        Duration::from_secs(300),
    )
    .await?;

    // 3. Cold start: a new hub over everything, quiescent and without writes.
    federation.kill_hub();
    let restarted = Instant::now();
    federation.start_hub()?;
    let mut first_pass = None;
    while restarted.elapsed() < Duration::from_secs(60) {
        let passes = federation
            .hub_counter("bulkhead_scheduler_pass_duration_seconds_count", "")
            .await
            .unwrap_or(0.0);
        if passes >= 1.0 {
            first_pass = Some(restarted.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let cold_writes: f64 = writes_by_kind(&federation).await?.values().sum();
    let rss_cold = federation.hub_pid().and_then(hub_rss_mib);

    println!(
        "cold start: first full pass {:.1} s after start; {cold_writes:.0} writes in the 10 s after it (budget: quiescent <= 30 s, zero writes); RSS {} MiB",
        first_pass.map_or(f64::NAN, |d| d.as_secs_f64()),
        rss_cold.map_or("?".into(), |r| format!("{r:.0}"))
    );
    assert_eq!(
        cold_writes, 0.0,
        "a cold start over settled state writes nothing"
    );
    Ok(())
}

async fn stream_creates(api: &Api<DynamicObject>, objects: Vec<serde_json::Value>) -> Result<()> {
    let creates = objects.into_iter().map(|object| {
        let api = api.clone();
        async move {
            let object: DynamicObject = serde_json::from_value(object)?;
            api.create(&PostParams::default(), &object).await?;
            anyhow::Ok(())
        }
    });
    let results: Vec<Result<()>> = futures::stream::iter(creates)
        .buffer_unordered(16)
        .collect()
        .await;
    results.into_iter().collect()
}
