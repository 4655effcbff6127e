//! Lab benchmarks for the propagation budgets of DESIGN.md section 9 and issue 14. They
//! print numbers (as Markdown table rows) and assert only correctness (every copy arrives
//! with its replicas, a cold start writes nothing), never time. `make bench-lab` runs
//! them against a release hub; they are `#[ignore]`d in `make test`. What each row
//! measures and how: docs/benchmarks.md.
//!
//! - `bench_burst`: BULKHEAD_BENCH_TEMPLATES (default 500) Deployment templates of 6
//!   replicas created by 4 concurrent clients, one policy with static weights east 3 :
//!   west 2 : north 1 (copies of 3/2/1 replicas), then `spec.replicas` 6 -> 12 on 100 of
//!   them.
//! - `bench_memory_and_cold_start`: BULKHEAD_BENCH_COLD_TEMPLATES (default 5,000)
//!   templates, a hub killed and restarted over them (quiescent time, zero writes), then
//!   up to BULKHEAD_BENCH_MEMORY_TEMPLATES (default 10,000) for the hub's RSS.
//!   BULKHEAD_BENCH_MEMORY_REPLICAS (default 6, a multiple of 6) sizes their pods.
//!
//! BULKHEAD_BENCH_QUIET_SECONDS (default 35) is how long the hub's write counters must
//! stay still before it counts as settled; BULKHEAD_BENCH_BASELINE_SECONDS (default 10)
//! the quiet stretch before the burst that probe and lease latencies are compared with.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::Result;
use bulkhead_e2e::bench::{
    self, BenchNodes, CopyWatch, HubApiWrites, LeaseWatch, Metrics, Spread, describe_counts, show,
    signed_seconds,
};
use bulkhead_e2e::federation::{Federation, deployments, policies};
use kube::Client;
use serde_json::{Value, json};

/// The policy's static weights.
const WEIGHTS: [(&str, i64); 3] = [("east", 3), ("west", 2), ("north", 1)];
/// Replicas of each template in the burst.
const REPLICAS: i64 = 6;
/// Templates whose replicas change after the burst, and to what.
const CHANGED: usize = 100;
const CHANGED_REPLICAS: i64 = 12;
/// Concurrent create (and patch) clients.
const CLIENTS: usize = 4;
/// The probe settings the federation uses: the defaults (5 s interval, 3 s timeout), so
/// a busy 2-core machine is not taken for a failed member.
const PROBES: [&str; 2] = ["5", "3"];
const PROBE_HISTOGRAM: &str = "bulkhead_member_probe_duration_seconds";
const MEMBER_CALL_HISTOGRAM: &str = "bulkhead_member_api_call_duration_seconds";
const PROPAGATION_HISTOGRAM: &str = "bulkhead_propagation_latency_seconds";

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn quiet() -> Duration {
    Duration::from_secs(env_number("BULKHEAD_BENCH_QUIET_SECONDS", 35) as u64)
}

/// The replicas each member gets of a template of `replicas` (a multiple of 6, so the
/// weighted division is exact).
fn shares(replicas: i64) -> Vec<(&'static str, i64)> {
    let total: i64 = WEIGHTS.iter().map(|(_, w)| w).sum();
    assert_eq!(
        replicas % total,
        0,
        "replicas must be a multiple of {total}"
    );
    WEIGHTS
        .iter()
        .map(|(c, w)| (*c, replicas / total * w))
        .collect()
}

fn name(i: usize) -> String {
    format!("bench-{i:05}")
}

fn template(i: usize, replicas: i64) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name(i)},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "bench"}},
                 "template": {"metadata": {"labels": {"app": "bench"}},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    })
}

/// Every (member, template) copy of `range` with the replicas it should have.
fn wanted_copies(range: std::ops::Range<usize>, replicas: i64) -> HashMap<(String, String), i64> {
    let shares = shares(replicas);
    range
        .flat_map(|i| {
            shares
                .iter()
                .map(move |(c, r)| ((c.to_string(), name(i)), *r))
        })
        .collect()
}

/// Pods each member must hold for `templates` of `replicas`, `changed` of them at
/// `changed_replicas`, with some room for other namespaces.
fn pods_needed(
    templates: usize,
    replicas: i64,
    changed: usize,
    changed_replicas: i64,
) -> BTreeMap<String, usize> {
    let before: BTreeMap<_, _> = shares(replicas).into_iter().collect();
    let after: BTreeMap<_, _> = shares(changed_replicas).into_iter().collect();
    WEIGHTS
        .iter()
        .map(|(c, _)| {
            let pods = (templates - changed) as i64 * before[c] + changed as i64 * after[c];
            (c.to_string(), pods as usize + pods as usize / 10 + 50)
        })
        .collect()
}

/// A federation whose members have room for the benchmark's pods, and the one policy.
/// Fields drop in order: the federation (processes, namespaces) before the nodes.
struct Setup {
    federation: Federation,
    _nodes: BenchNodes,
    /// Separate clients (connections) to the hub for the concurrent creates and patches.
    clients: Vec<Client>,
}

impl Setup {
    async fn start(pods: BTreeMap<String, usize>) -> Result<Self> {
        let lab = bulkhead_e2e::support::lab().await?;
        let mut nodes = BenchNodes::add(&lab, &pods).await?;
        let federation = Federation::start_with_probes("scale", &[], &PROBES).await?;
        nodes.namespace = Some(federation.namespace.clone());
        let weights: Vec<Value> = WEIGHTS
            .iter()
            .map(|(c, w)| json!({"targetCluster": {"clusterNames": [c]}, "weight": w}))
            .collect();
        federation
            .apply(
                &policies(),
                federation.policy(
                    "weighted",
                    json!([{"apiVersion": "apps/v1", "kind": "Deployment"}]),
                    json!({
                        "clusterAffinity": {"clusterNames": WEIGHTS.iter().map(|(c, _)| c).collect::<Vec<_>>()},
                        "replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted",
                                              "weightPreference": {"staticWeightList": weights}},
                    }),
                    json!({}),
                ),
            )
            .await?;
        // Deletions of an earlier run's namespace would count as this run's writes.
        bench::wait_no_terminating_namespaces(&federation.hub, Duration::from_secs(300)).await?;
        let mut clients = vec![];
        for _ in 0..CLIENTS {
            clients.push(federation.lab.client("hub").await?);
        }
        Ok(Setup {
            federation,
            _nodes: nodes,
            clients,
        })
    }

    fn pid(&self) -> Option<u32> {
        self.federation.hub_pid()
    }

    async fn hub(&self) -> Result<Metrics> {
        bench::hub_metrics(&self.federation).await
    }

    async fn api_writes(&self) -> Result<BTreeMap<bench::RequestKey, f64>> {
        Ok(bench::write_requests(
            &bench::apiserver_metrics(&self.federation.hub).await?,
        ))
    }

    async fn create(
        &self,
        range: std::ops::Range<usize>,
        replicas: i64,
    ) -> Result<HashMap<String, Instant>> {
        bench::create_all(
            &self.clients,
            &self.federation.namespace,
            &deployments(),
            range.map(|i| template(i, replicas)).collect(),
        )
        .await
    }
}

fn row(figure: &str, measured: String, budget: &str) {
    println!("| {figure} | {measured} | {budget} |");
}

fn header(title: &str) {
    println!();
    println!("{title}");
    println!();
    println!("| figure | measured | budget |");
    println!("|---|---|---|");
}

/// Time for `n` copies or templates to appear, generously.
fn timeout_for(n: usize) -> Duration {
    Duration::from_secs(300 + n as u64 / 5)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "lab benchmark: make bench-lab"]
async fn bench_burst() -> Result<()> {
    let templates = env_number("BULKHEAD_BENCH_TEMPLATES", 500);
    let changed = templates.min(CHANGED);
    let setup = Setup::start(pods_needed(templates, REPLICAS, changed, CHANGED_REPLICAS)).await?;
    let federation = &setup.federation;
    let mut copies = CopyWatch::start(federation, &deployments());
    let mut leases = LeaseWatch::start(federation);
    let baseline_from = Instant::now();
    tokio::time::sleep(Duration::from_secs(
        env_number("BULKHEAD_BENCH_BASELINE_SECONDS", 10) as u64,
    ))
    .await;

    // 1. The burst.
    let hub_before = setup.hub().await?;
    let api_before = setup.api_writes().await?;
    let cpu_before = setup.pid().and_then(bench::cpu_seconds);
    let first_create = Instant::now();
    let created = setup.create(0..templates, REPLICAS).await?;
    let creates_took = first_create.elapsed();
    let last_create = created.values().max().copied().unwrap_or(first_create);
    let wanted = wanted_copies(0..templates, REPLICAS);
    let all_present = copies.wait_all(&wanted, timeout_for(wanted.len())).await?;
    let settled = bench::wait_settled(federation, quiet(), timeout_for(wanted.len())).await?;
    let hub_settled = setup.hub().await?;
    let api_settled = setup.api_writes().await?;
    let rss = setup.pid().and_then(bench::rss_mib);
    let mut early = 0;
    let per_copy = Spread::of(
        wanted
            .keys()
            .filter_map(|(cluster, template)| {
                let seen = copies.first_seen(cluster, template)?;
                let returned = created[template];
                if seen < returned {
                    early += 1;
                }
                Some(seen.saturating_duration_since(returned))
            })
            .collect(),
    );
    let member_apply = |metrics: &Metrics| {
        metrics.histogram(MEMBER_CALL_HISTOGRAM, |l| {
            l.get("verb").map(String::as_str) == Some("apply")
        })
    };
    let applies_burst = member_apply(&hub_settled).minus(&member_apply(&hub_before));
    let propagation_burst = hub_settled
        .histogram(PROPAGATION_HISTOGRAM, |_| true)
        .minus(&hub_before.histogram(PROPAGATION_HISTOGRAM, |_| true));
    let api = HubApiWrites::between(
        &api_settled,
        &api_before,
        ("apps", "deployments"),
        &[("deployments POST", templates as f64)],
    );
    let hub_writes = bench::delta(&settled.writes, &bench::hub_writes(&hub_before));
    let hub_writes_total = bench::total(&hub_writes);
    let cpu = settled
        .cpu_seconds
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    // Probes and lease renewals: the quiet stretch before the burst, then the burst
    // (first create -> settled).
    let probes_before = hub_before.histogram(PROBE_HISTOGRAM, |_| true);
    let probes_burst = hub_settled
        .histogram(PROBE_HISTOGRAM, |_| true)
        .minus(&probes_before);
    let probe_results = bench::delta(
        &hub_settled.by_label(&format!("{PROBE_HISTOGRAM}_count"), "result"),
        &hub_before.by_label(&format!("{PROBE_HISTOGRAM}_count"), "result"),
    );
    let lease_before = leases.stats(baseline_from + Duration::from_secs(2), first_create);
    let lease_burst = leases.stats(first_create, settled.at);
    let lease_failures = bench::delta(
        &hub_settled.by_label("bulkhead_lease_renewal_failures_total", "cluster"),
        &hub_before.by_label("bulkhead_lease_renewal_failures_total", "cluster"),
    );

    // 2. 100 templates change replicas.
    let api_update_before = setup.api_writes().await?;
    let hub_update_before = setup.hub().await?;
    let update_started = Instant::now();
    let patched = bench::patch_all(
        &setup.clients,
        &federation.namespace,
        &deployments(),
        (0..changed).map(name).collect(),
        json!({"spec": {"replicas": CHANGED_REPLICAS}}),
    )
    .await?;
    let last_patch = patched.values().max().copied().unwrap_or(update_started);
    let patches_took = last_patch.duration_since(update_started);
    let wanted_update = wanted_copies(0..changed, CHANGED_REPLICAS);
    let all_updated = copies
        .wait_all(&wanted_update, timeout_for(wanted_update.len()))
        .await?;
    let per_update = Spread::of(
        wanted_update
            .iter()
            .filter_map(|((cluster, template), replicas)| {
                Some(
                    copies
                        .first_with(cluster, template, *replicas)?
                        .saturating_duration_since(patched[template]),
                )
            })
            .collect(),
    );
    let update_settled =
        bench::wait_settled(federation, quiet(), timeout_for(wanted_update.len())).await?;
    let api_update = HubApiWrites::between(
        &setup.api_writes().await?,
        &api_update_before,
        ("apps", "deployments"),
        &[("deployments PATCH", changed as f64)],
    );
    let hub_update_writes = bench::delta(
        &update_settled.writes,
        &bench::hub_writes(&hub_update_before),
    );

    // Correctness only: every copy arrived with its replicas (wait_all), and the hub's
    // own count of writes is not far from what its API server saw.
    let copies_n = wanted.len();
    let per_template = |n: f64| n / templates as f64;
    header(&format!(
        "bench_burst: {templates} Deployment templates x {REPLICAS} replicas by {CLIENTS} clients, static weights east 3 : west 2 : north 1 ({copies_n} copies of 3/2/1); hub {}",
        bulkhead_e2e::agent_support::bulkhead_binary()?.display()
    ));
    row(
        &format!("creates of the {templates} templates (reference)"),
        format!("{:.1} s", creates_took.as_secs_f64()),
        "-",
    );
    row(
        "per-copy latency, create returned -> copy in the member: p50 / p99",
        match per_copy {
            Some(s) => format!(
                "{:.2} s / {:.2} s (max {:.2} s, n {}{})",
                s.p50.as_secs_f64(),
                s.p99.as_secs_f64(),
                s.max.as_secs_f64(),
                s.n,
                if early > 0 {
                    format!(", {early} seen before their create returned, counted as 0")
                } else {
                    String::new()
                }
            ),
            None => "-".into(),
        },
        "p99 <= 2 s",
    );
    row(
        "the hub's own view: template seen -> copy applied (bulkhead_propagation_latency_seconds); member applies, sent -> answered (bulkhead_member_api_call_duration_seconds)",
        format!(
            "{}; {}",
            propagation_burst.describe(),
            applies_burst.describe()
        ),
        "-",
    );
    row(
        &format!("first create -> all {copies_n} copies present"),
        format!(
            "{:.1} s ({:.1} s after the last create returned)",
            all_present.duration_since(first_create).as_secs_f64(),
            signed_seconds(all_present, last_create)
        ),
        "<= 2 s after the last create",
    );
    row(
        "hub writes per template once settled (hub API server's apiserver_request_total)",
        format!(
            "{:.2} ({})",
            per_template(api.total()),
            describe_per_template(&api.per_template, templates)
        ),
        "<= 3",
    );
    row(
        "the same by the hub's bulkhead_hub_writes_total",
        format!(
            "{:.2} ({})",
            per_template(hub_writes_total),
            describe_per_template(&hub_writes, templates)
        ),
        "<= 3",
    );
    row(
        &format!(
            "`spec.replicas` {REPLICAS} -> {CHANGED_REPLICAS} on {changed} templates, patch -> every member copy updated"
        ),
        format!(
            "{:.2} s from the first patch, {:.2} s after the last patch returned (the patches took {:.2} s; per copy, patch returned -> updated: {})",
            all_updated.duration_since(update_started).as_secs_f64(),
            signed_seconds(all_updated, last_patch),
            patches_took.as_secs_f64(),
            Spread::describe(&per_update)
        ),
        "<= 1 s",
    );
    row(
        "hub CPU, first create -> settled",
        format!(
            "{} s (settled {:.1} s after the first create)",
            show(cpu, 2),
            settled.at.duration_since(first_create).as_secs_f64()
        ),
        "<= 4 s",
    );
    row(
        &format!("hub RSS after settling, {templates} templates"),
        format!("{} MiB", show(rss, 1)),
        "<= 40 MiB",
    );
    row(
        "member probe duration (bulkhead_member_probe_duration_seconds, bucket bounds)",
        format!(
            "before the burst {}; during it {}",
            probes_before.describe(),
            probes_burst.describe()
        ),
        "-",
    );
    row(
        "fencing-Lease renewals as the members see them",
        format!(
            "before the burst: {}; during it: {}",
            lease_before.describe(),
            lease_burst.describe()
        ),
        "-",
    );
    println!();
    println!("details:");
    println!("  settled: {}", settled.how);
    println!(
        "  hub API server, burst: {:.0} hub writes ({:.0} failed: {:?}); the benchmark's own {templates} creates subtracted; other writes (not counted): {}",
        api.total(),
        bench::total(&api.failed),
        api.failed,
        describe_counts(&api.other)
    );
    println!(
        "  bulkhead_hub_writes_total, burst: {hub_writes_total:.0} ({})",
        describe_counts(&hub_writes)
    );
    println!(
        "  member API calls by the hub, burst: {}",
        describe_counts(&bench::delta(
            &hub_settled.by_label("bulkhead_member_api_calls_total", "verb"),
            &hub_before.by_label("bulkhead_member_api_calls_total", "verb"),
        ))
    );
    println!(
        "  probes during the burst by result: {}; lease renewal failures during it: {}",
        describe_counts(&probe_results),
        describe_counts(&lease_failures)
    );
    println!(
        "  replica change: {:.0} hub writes at the hub API server = {:.2} per changed template ({}; the benchmark's own {changed} patches subtracted); bulkhead_hub_writes_total {:.0} ({})",
        api_update.total(),
        api_update.total() / changed.max(1) as f64,
        api_update.describe(),
        bench::total(&hub_update_writes),
        describe_counts(&hub_update_writes)
    );
    Ok(())
}

/// "binding 1.00, template_status 1.02" (per template).
fn describe_per_template(counts: &BTreeMap<String, f64>, templates: usize) -> String {
    let per: BTreeMap<String, f64> = counts
        .iter()
        .map(|(k, v)| (k.clone(), v / templates.max(1) as f64))
        .collect();
    let mut entries: Vec<_> = per.iter().collect();
    entries.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
    if entries.is_empty() {
        return "none".into();
    }
    entries
        .iter()
        .map(|(k, v)| format!("{k} {v:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "lab benchmark: make bench-lab"]
async fn bench_memory_and_cold_start() -> Result<()> {
    let cold = env_number("BULKHEAD_BENCH_COLD_TEMPLATES", 5_000);
    let memory = env_number("BULKHEAD_BENCH_MEMORY_TEMPLATES", 10_000);
    let replicas = env_number("BULKHEAD_BENCH_MEMORY_REPLICAS", 6) as i64;
    anyhow::ensure!(
        replicas > 0 && replicas % 6 == 0,
        "BULKHEAD_BENCH_MEMORY_REPLICAS must be a positive multiple of 6"
    );
    let most = cold.max(memory);
    let mut setup = Setup::start(pods_needed(most, replicas, 0, replicas)).await?;
    let mut copies = CopyWatch::start(&setup.federation, &deployments());

    // 1. `cold` templates, propagated and settled.
    let api_first = setup.api_writes().await?;
    let hub_first = setup.hub().await?;
    let first_create = Instant::now();
    setup.create(0..cold, replicas).await?;
    let creates_took = first_create.elapsed();
    let wanted = wanted_copies(0..cold, replicas);
    let present = copies.wait_all(&wanted, timeout_for(wanted.len())).await?;
    let settled =
        bench::wait_settled(&setup.federation, quiet(), timeout_for(wanted.len())).await?;
    let rss_cold = setup.pid().and_then(bench::rss_mib);
    // Only what this hub wrote for these templates (a hub that starts may first clean up
    // after an earlier run's bindings).
    let writes_first = bench::delta(&settled.writes, &bench::hub_writes(&hub_first));
    let writes_cold = bench::total(&writes_first);
    let api_first = HubApiWrites::between(
        &setup.api_writes().await?,
        &api_first,
        ("apps", "deployments"),
        &[("deployments POST", cold as f64)],
    );

    // 2. Cold start: a new hub over everything.
    setup.federation.kill_hub();
    let api_before = setup.api_writes().await?;
    let restarted = Instant::now();
    setup.federation.start_hub()?;
    let (quiescent, how) =
        bench::wait_quiescent(&setup.federation, restarted, timeout_for(wanted.len())).await?;
    let cpu_quiescent = setup.pid().and_then(bench::cpu_seconds);
    let rss_quiescent = setup.pid().and_then(bench::rss_mib);
    // Template status may wait up to 30 s: watch for writes for the quiet stretch.
    tokio::time::sleep(quiet()).await;
    let hub = setup.hub().await?;
    let cold_writes = bench::hub_writes(&hub);
    let cold_writes_total = bench::total(&cold_writes);
    let api_cold = HubApiWrites::between(
        &setup.api_writes().await?,
        &api_before,
        ("apps", "deployments"),
        &[],
    );
    let member_calls = hub.by_label("bulkhead_member_api_calls_total", "verb");
    let rss_after_cold = setup.pid().and_then(bench::rss_mib);

    // 3. Up to `memory` templates.
    let (rss_memory, memory_settled_after) = if memory > cold {
        let started = Instant::now();
        setup.create(cold..memory, replicas).await?;
        let wanted = wanted_copies(cold..memory, replicas);
        copies.wait_all(&wanted, timeout_for(wanted.len())).await?;
        let settled =
            bench::wait_settled(&setup.federation, quiet(), timeout_for(wanted.len())).await?;
        (
            setup.pid().and_then(bench::rss_mib),
            Some(settled.at.duration_since(started)),
        )
    } else {
        (rss_cold, None)
    };

    header(&format!(
        "bench_memory_and_cold_start: {cold} then {most} Deployment templates x {replicas} replicas, weights 3:2:1; hub {}",
        bulkhead_e2e::agent_support::bulkhead_binary()?.display()
    ));
    row(
        &format!("{cold} templates: creates; all copies present; settled (first create ->)"),
        format!(
            "{:.1} s; {:.1} s; {:.1} s ({:.2} hub writes per template at the hub API server, {:.2} by its own counter)",
            creates_took.as_secs_f64(),
            present.duration_since(first_create).as_secs_f64(),
            settled.at.duration_since(first_create).as_secs_f64(),
            api_first.total() / cold.max(1) as f64,
            writes_cold / cold.max(1) as f64
        ),
        "-",
    );
    row(
        &format!("hub RSS, {cold} templates settled"),
        format!("{} MiB", show(rss_cold, 1)),
        "-",
    );
    row(
        &format!("hub cold start with {cold} propagated templates: quiescent"),
        format!(
            "{quiescent:.1} s after the start ({how}); CPU {} s; RSS {} MiB then, {} MiB {} s later",
            show(cpu_quiescent, 2),
            show(rss_quiescent, 1),
            show(rss_after_cold, 1),
            quiet().as_secs()
        ),
        "<= 30 s",
    );
    row(
        "cold start: writes from the start until the quiet stretch after quiescent ended",
        format!(
            "hub API server {:.0} ({}); bulkhead_hub_writes_total {cold_writes_total:.0} ({})",
            api_cold.total(),
            api_cold.describe(),
            describe_counts(&cold_writes)
        ),
        "0",
    );
    row(
        &format!("hub RSS with {most} templates on 3 members"),
        format!(
            "{} MiB{}",
            show(rss_memory, 1),
            memory_settled_after.map_or(String::new(), |d| format!(
                " (the last {} settled {:.1} s after their first create)",
                memory - cold,
                d.as_secs_f64()
            ))
        ),
        "<= 100 MiB",
    );
    println!();
    println!("details:");
    println!("  settled: {}", settled.how);
    println!(
        "  the first {cold} templates: hub API server {} (other, not counted: {}); bulkhead_hub_writes_total {} (before them, since the hub started: {})",
        api_first.describe(),
        describe_counts(&api_first.other),
        describe_counts(&writes_first),
        describe_counts(&bench::hub_writes(&hub_first))
    );
    println!(
        "  member API calls by the restarted hub (until the end of the quiet stretch): {}; other hub API server writes (not counted): {}",
        describe_counts(&member_calls),
        describe_counts(&api_cold.other)
    );
    assert_eq!(
        cold_writes_total, 0.0,
        "a cold start over settled templates writes nothing (hub counter): {cold_writes:?}"
    );
    assert_eq!(
        api_cold.total(),
        0.0,
        "a cold start over settled templates writes nothing (hub API server): {:?}",
        api_cold.per_template
    );
    Ok(())
}
