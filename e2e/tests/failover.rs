//! The partition suite: the lab, the hub and an agent in every member, a Deployment
//! (6 replicas, weights 1:1:1) and a MyDatabase (one replica in east and one in west).
//! Each test cuts something off, checks what DESIGN.md sections 5 and 6 promise, heals,
//! checks that everything converged back with nothing lost, and prints its timings.
//! (A template deleted during a partition is in `propagation.rs`.)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bulkhead::api::mydatabase::DatabasePhase;
use bulkhead::api::{MemberCluster, is_condition_true};
use bulkhead_e2e::agent_support::{pods, readiness_report, ready_endpoints, wait_endpoints};
use bulkhead_e2e::federation::{
    Copy, Federation, LEASE_DURATION_SECONDS, binding_replicas, databases, deployments, ready_at,
    statefulsets,
};
use bulkhead_e2e::support::Partition;
use bulkhead_e2e::{Check, wait_for};
use kube::Api;

/// failover.stateless.tolerationSeconds of the suite's policies.
const TOLERATION_SECONDS: u64 = 5;

/// Sets up the suite's two templates and waits until they run: web 2/2/2, orders 1/1.
async fn federation(prefix: &str) -> Result<Federation> {
    let federation = Federation::start_with_databases(prefix, &[]).await?;
    federation.run_web_and_orders(TOLERATION_SECONDS).await?;
    for cluster in ["east", "west"] {
        wait_database(
            &federation,
            cluster,
            DatabasePhase::Ready,
            Duration::from_secs(30),
        )
        .await?;
    }
    Ok(federation)
}

/// The phase of the member's copy of `orders`, read inside the member's zone.
async fn phase(federation: &Federation, cluster: &str) -> Result<Option<String>> {
    let db = federation.api(cluster, &databases()).get("orders").await?;
    Ok(db.data["status"]["phase"].as_str().map(str::to_string))
}

async fn wait_database(
    federation: &Federation,
    cluster: &str,
    wanted: DatabasePhase,
    timeout: Duration,
) -> Result<Duration> {
    let started = Instant::now();
    let wanted_text = serde_json::to_value(wanted)?
        .as_str()
        .unwrap_or_default()
        .to_string();
    let wanted_text = &wanted_text;
    wait_for(
        &format!("orders in {cluster} {wanted:?}"),
        timeout,
        || async move {
            match phase(federation, cluster).await {
                Ok(Some(phase)) if &phase == wanted_text => Check::Done(()),
                Ok(other) => Check::Waiting(format!("{other:?}")),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    Ok(started.elapsed())
}

/// UIDs of the suite's objects in every member: Deployments, StatefulSets, MyDatabases.
async fn uids(federation: &Federation) -> Result<BTreeMap<String, String>> {
    let mut all = federation.member_uids(&deployments()).await?;
    all.extend(federation.member_uids(&statefulsets()).await?);
    all.extend(federation.member_uids(&databases()).await?);
    Ok(all)
}

/// Pod UIDs of `orders` in a member.
async fn database_pods(federation: &Federation, cluster: &str) -> Result<Vec<String>> {
    Ok(pods(
        &federation.members[cluster],
        &federation.namespace,
        "orders",
    )
    .await?
    .into_values()
    .map(|(uid, _)| uid)
    .collect())
}

/// Waits until the hub says `cluster` is not Ready; returns the time since `since`.
async fn wait_unready(federation: &Federation, cluster: &str, since: Instant) -> Result<Duration> {
    let api: Api<MemberCluster> = Api::all(federation.hub.clone());
    wait_for(
        &format!("{cluster} not Ready on the hub"),
        Duration::from_secs(30),
        || {
            let api = api.clone();
            async move {
                match api.get(cluster).await {
                    Ok(mc)
                        if !mc
                            .status
                            .as_ref()
                            .is_some_and(|s| is_condition_true(&s.conditions, "Ready")) =>
                    {
                        Check::Done(())
                    }
                    Ok(_) => Check::Waiting("Ready".into()),
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await?;
    Ok(since.elapsed())
}

/// Copies of web in west and north only (east's copy is read inside its zone and may
/// still be there while cut off).
fn survivors(copies: &[Copy]) -> Vec<Copy> {
    copies
        .iter()
        .filter(|c| c.cluster != "east")
        .cloned()
        .collect()
}

async fn evictions(federation: &Federation) -> Result<f64> {
    federation.hub_counter("bulkhead_evictions_total", "").await
}

/// Polls web's member copies until 2/2/2 Ready again, and returns the smallest number
/// of Ready replicas seen across all members meanwhile (make-before-break keeps it >= 6).
async fn converge_back(federation: &Federation, timeout: Duration) -> Result<(Duration, i64)> {
    let started = Instant::now();
    let mut lowest = i64::MAX;
    loop {
        let copies = federation.copies(&deployments(), "web").await?;
        lowest = lowest.min(copies.iter().map(|c| c.ready).sum());
        if ready_at(&copies, &[("east", 2), ("west", 2), ("north", 2)]) {
            return Ok((started.elapsed(), lowest));
        }
        anyhow::ensure!(
            started.elapsed() < timeout,
            "not back to 2/2/2 after {timeout:?}: {copies:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_zone_partition_moves_stateless_replicas_and_fences_the_database() -> Result<()> {
    let federation = federation("fail-zone").await?;
    let before = uids(&federation).await?;
    let east_pods = database_pods(&federation, "east").await?;
    let lease = Duration::from_secs(LEASE_DURATION_SECONDS);

    let cut = Instant::now();
    let partition = Partition::start(&federation.lab, "east")?;

    // East's agent fences its database by itself: read-only, pods untouched, ro serving.
    let fenced = wait_database(
        &federation,
        "east",
        DatabasePhase::ReadOnly,
        Duration::from_secs(20),
    )
    .await?;
    let east = &federation.members["east"];
    assert_eq!(
        ready_endpoints(east, &federation.namespace, "orders").await?,
        0,
        "no writer"
    );
    assert_eq!(
        ready_endpoints(east, &federation.namespace, "orders-rw").await?,
        0,
        "no writer"
    );
    // Reads go on. The member's EndpointSlice controller follows pod readiness on its own
    // schedule, so a moment's lag on a loaded machine is waited out (30 s); a pod that
    // stopped being Ready fails here with what the pods and nodes said.
    let ro_now = ready_endpoints(east, &federation.namespace, "orders-ro").await?;
    if ro_now != 1 {
        println!(
            "orders-ro had {ro_now} ready endpoints when east was fenced; {}",
            readiness_report(east, &federation.namespace).await?
        );
    }
    wait_endpoints(east, &federation.namespace, "orders-ro", 1)
        .await
        .context("reads go on")?;
    assert_eq!(
        database_pods(&federation, "east").await?,
        east_pods,
        "no pod restarted"
    );

    // The hub notices, waits out the toleration, and moves web's replicas.
    let detected = wait_unready(&federation, "east", cut).await?;
    let moved = federation
        .wait_copies(
            &deployments(),
            "web",
            "3/3 Ready in west and north",
            Duration::from_secs(60),
            |c| ready_at(&survivors(c), &[("west", 3), ("north", 3)]),
        )
        .await
        .map(|_| cut.elapsed())?;
    let binding = federation
        .binding("web-deployment")
        .await?
        .context("web binding")?;
    assert_eq!(
        binding_replicas(&binding),
        [("north".to_string(), 3), ("west".to_string(), 3)]
    );
    let east_row = binding
        .status
        .as_ref()
        .and_then(|s| s.clusters.iter().find(|r| r.name == "east"))
        .cloned();
    assert!(
        east_row.is_some_and(|r| r.pending_cleanup),
        "east's copy waits for the heal"
    );

    // The database stays where its data is, marked fenced; nothing stateful anywhere else.
    let orders = federation
        .wait_row(
            "orders-mydatabase",
            "east",
            "fenced",
            Duration::from_secs(15),
            |r| r.fenced,
        )
        .await?;
    assert_eq!(
        binding_replicas(&orders),
        [("east".to_string(), 1), ("west".to_string(), 1)]
    );
    let template = federation.api("hub", &databases()).get("orders").await?;
    let rows = template.data["status"]["clusters"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        rows.iter()
            .any(|r| r["name"] == "east" && r["fenced"] == true),
        "{rows:?}"
    );
    let degraded = template.data["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Degraded").cloned())
        .context("Degraded")?;
    assert_eq!(
        (degraded["status"].as_str(), degraded["reason"].as_str()),
        (Some("True"), Some("ClusterUnreachable"))
    );
    assert!(
        federation
            .api("north", &databases())
            .get_opt("orders")
            .await?
            .is_none()
    );
    assert!(
        federation
            .api("north", &statefulsets())
            .get_opt("orders")
            .await?
            .is_none()
    );
    assert_eq!(
        federation
            .api("west", &statefulsets())
            .get("orders")
            .await?
            .data["spec"]["replicas"],
        1
    );

    // What a user reads with `kubectl events`: the eviction on the template and its
    // binding, the failover completing on the binding, the database fenced.
    let events_timeout = Duration::from_secs(30);
    for (kind, name) in [("Deployment", "web"), ("ResourceBinding", "web-deployment")] {
        let note = federation
            .wait_event(kind, name, "Evicted", events_timeout)
            .await?;
        assert!(note.contains("east"), "Evicted on {kind} {name}: {note}");
    }
    federation
        .wait_event(
            "ResourceBinding",
            "web-deployment",
            "FailoverComplete",
            events_timeout,
        )
        .await?;
    for (kind, name) in [
        ("MyDatabase", "orders"),
        ("ResourceBinding", "orders-mydatabase"),
    ] {
        let note = federation
            .wait_event(kind, name, "Fenced", events_timeout)
            .await?;
        assert!(note.contains("east"), "Fenced on {kind} {name}: {note}");
    }

    // Heal: back to 2/2/2, make-before-break, east read-write, every UID kept.
    partition.heal()?;
    let healed = Instant::now();
    let (back, lowest) = converge_back(&federation, Duration::from_secs(60)).await?;
    wait_database(
        &federation,
        "east",
        DatabasePhase::Ready,
        Duration::from_secs(30),
    )
    .await?;
    let unfenced = healed.elapsed();
    for (kind, name) in [
        ("MyDatabase", "orders"),
        ("ResourceBinding", "orders-mydatabase"),
    ] {
        let note = federation
            .wait_event(kind, name, "Unfenced", events_timeout)
            .await?;
        assert!(note.contains("east"), "Unfenced on {kind} {name}: {note}");
    }
    assert!(
        lowest >= 6,
        "make-before-break: {lowest} ready replicas at the lowest"
    );
    assert_eq!(
        uids(&federation).await?,
        before,
        "nothing recreated anywhere"
    );
    assert_eq!(database_pods(&federation, "east").await?, east_pods);
    println!(
        "zone partition: east fenced read-only {:.1}s after the cut (lease {}s + 1s budget); hub detection {:.1}s; \
         web Ready in west+north {:.1}s after the cut (budget detection + {}s toleration + 5s = {:.1}s); \
         healed: back to 2/2/2 in {:.1}s with at least {lowest} ready replicas throughout, east read-write {:.1}s after the heal",
        fenced.as_secs_f64(),
        LEASE_DURATION_SECONDS,
        detected.as_secs_f64(),
        moved.as_secs_f64(),
        TOLERATION_SECONDS,
        detected.as_secs_f64() + TOLERATION_SECONDS as f64 + 5.0,
        back.as_secs_f64(),
        unfenced.as_secs_f64(),
    );
    assert!(
        fenced <= lease + Duration::from_millis(1300),
        "fenced after {fenced:?}"
    );
    assert!(
        moved <= detected + Duration::from_secs(TOLERATION_SECONDS + 5),
        "moved after {moved:?}, detection {detected:?}"
    );
    Ok(())
}

#[tokio::test]
async fn an_isolated_hub_freezes_failover_while_every_member_fences() -> Result<()> {
    let federation = federation("fail-hub").await?;
    let before = uids(&federation).await?;
    let web_before = federation.placement_of("web-deployment").await?;

    let cut = Instant::now();
    federation.lab.isolate_hub()?;
    let mut fenced = vec![];
    for cluster in ["east", "west"] {
        wait_database(
            &federation,
            cluster,
            DatabasePhase::ReadOnly,
            Duration::from_secs(20),
        )
        .await?;
        fenced.push(format!(
            "{cluster} {:.1}s after the cut",
            cut.elapsed().as_secs_f64()
        ));
    }
    wait_for("the hub to freeze", Duration::from_secs(30), || async {
        match federation.hub_counter("bulkhead_hub_frozen", "").await {
            Ok(1.0) => Check::Done(()),
            Ok(v) => Check::Waiting(format!("frozen={v}")),
            Err(e) => Check::Waiting(e.to_string()),
        }
    })
    .await?;
    let frozen_after = cut.elapsed();
    // Well past the toleration: still nothing moved. A deliberate sleep: what is checked
    // is that nothing happens in that time, so there is no condition to wait for.
    tokio::time::sleep(Duration::from_secs(TOLERATION_SECONDS + 5)).await;
    let binding = federation
        .binding("web-deployment")
        .await?
        .context("binding")?;
    assert_eq!(
        binding_replicas(&binding),
        web_before,
        "no eviction while frozen"
    );
    assert_eq!(evictions(&federation).await?, 0.0);
    let copies = federation.copies(&deployments(), "web").await?;
    assert!(
        ready_at(&copies, &[("east", 2), ("west", 2), ("north", 2)]),
        "{copies:?}"
    );

    federation.lab.heal_all()?;
    let healed = Instant::now();
    for cluster in ["east", "west"] {
        wait_database(
            &federation,
            cluster,
            DatabasePhase::Ready,
            Duration::from_secs(30),
        )
        .await?;
    }
    let unfenced = healed.elapsed();
    federation
        .wait_members_ready(Duration::from_secs(30))
        .await?;
    // The thawed hub has settled with every member Ready: nothing moved.
    federation.wait_settled(Duration::from_secs(60)).await?;
    assert_eq!(federation.placement_of("web-deployment").await?, web_before);
    assert_eq!(evictions(&federation).await?, 0.0);
    assert_eq!(uids(&federation).await?, before, "nothing moved or deleted");
    println!(
        "hub isolation: fenced {}; hub frozen {:.1}s after the cut; no eviction in {}s past the toleration; \
         every database read-write {:.1}s after the heal",
        fenced.join(", "),
        frozen_after.as_secs_f64(),
        TOLERATION_SECONDS + 5,
        unfenced.as_secs_f64()
    );
    Ok(())
}

#[tokio::test]
async fn a_flapping_member_causes_no_churn() -> Result<()> {
    let federation = federation("fail-flap").await?;
    let before = uids(&federation).await?;
    let web_before = federation.placement_of("web-deployment").await?;
    let started = Instant::now();
    let mut spec_changes = 0;
    // Deliberate sleeps: the flapping pattern is a timing (cuts shorter than the
    // failure threshold of 3 x 1 s probes, gaps shorter than the toleration), and what is
    // checked is that nothing happens through it.
    for _ in 0..5 {
        let partition = Partition::start(&federation.lab, "east")?;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        partition.heal()?;
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let now = federation.placement_of("web-deployment").await?;
        spec_changes += usize::from(now != web_before);
    }
    // Past the toleration after the last cut: still nothing may move (deliberate).
    tokio::time::sleep(Duration::from_secs(TOLERATION_SECONDS + 2)).await;
    assert_eq!(spec_changes, 0, "the placement never changed");
    assert_eq!(evictions(&federation).await?, 0.0);
    let copies = federation.copies(&deployments(), "web").await?;
    assert!(
        ready_at(&copies, &[("east", 2), ("west", 2), ("north", 2)]),
        "{copies:?}"
    );
    assert_eq!(uids(&federation).await?, before);
    println!(
        "flapping: 5 cuts of 1.2s with 2.5s between them over {:.1}s: 0 placement changes, 0 evictions, no object recreated",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[tokio::test]
async fn a_member_api_server_crash_is_a_partition_and_loses_nothing() -> Result<()> {
    let federation = federation("fail-crash").await?;
    let before = uids(&federation).await?;
    let cut = Instant::now();
    federation.lab.kill_component("east", "kube-apiserver")?;
    let mut restart = Restart { armed: true };
    let detected = wait_unready(&federation, "east", cut).await?;
    let moved = federation
        .wait_copies_in(
            &["west", "north"],
            &deployments(),
            "web",
            "3/3 Ready",
            Duration::from_secs(60),
            |c| ready_at(c, &[("west", 3), ("north", 3)]),
        )
        .await
        .map(|_| cut.elapsed())?;
    federation
        .wait_row(
            "orders-mydatabase",
            "east",
            "fenced",
            Duration::from_secs(15),
            |r| r.fenced,
        )
        .await?;
    restart.armed = false;
    federation
        .lab
        .restart_component("east", "kube-apiserver")
        .await?;
    let restarted = Instant::now();
    let (back, lowest) = converge_back(&federation, Duration::from_secs(90)).await?;
    // Writable again once the agent sees the hub's renewals and its controller writes
    // the status: its watches of the restarted API server retry at most every 2 s.
    wait_database(
        &federation,
        "east",
        DatabasePhase::Ready,
        Duration::from_secs(60),
    )
    .await?;
    assert!(
        lowest >= 6,
        "make-before-break: {lowest} ready at the lowest"
    );
    assert_eq!(
        uids(&federation).await?,
        before,
        "nothing lost or recreated"
    );
    println!(
        "apiserver crash: hub detection {:.1}s, web Ready elsewhere {:.1}s after the crash; \
         after the restart ({:.1}s ago) back to 2/2/2 in {:.1}s, at least {lowest} ready throughout",
        detected.as_secs_f64(),
        moved.as_secs_f64(),
        restarted.elapsed().as_secs_f64(),
        back.as_secs_f64()
    );
    Ok(())
}

/// Restarts east's API server when the test ends (a failure or an early error) while it
/// is down, so the tests after it find a whole lab.
struct Restart {
    armed: bool,
}

impl Drop for Restart {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let lab = bulkhead_e2e::Lab::from_env();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(runtime) = runtime {
                let _ = runtime.block_on(lab.restart_component("east", "kube-apiserver"));
            }
        })
        .join();
    }
}

#[tokio::test]
async fn a_hub_killed_during_failover_finishes_it_after_restart() -> Result<()> {
    let mut federation = federation("fail-hubkill").await?;
    let before = uids(&federation).await?;
    let cut = Instant::now();
    let lab = bulkhead_e2e::Lab::from_env();
    let partition = Partition::start(&lab, "east")?;
    // Kill the hub once it has seen east fail, while the toleration runs; a new hub
    // must pick the failover up from what the cluster records (taint time, binding).
    let detected = wait_unready(&federation, "east", cut).await?;
    federation.kill_hub();
    let during = federation.copies(&deployments(), "web").await?;
    // Deliberate: the hub stays down for a while during the toleration.
    tokio::time::sleep(Duration::from_secs(2)).await;
    federation.start_hub()?;
    let restarted = cut.elapsed();
    let moved = federation
        .wait_copies(
            &deployments(),
            "web",
            "3/3 Ready in west and north",
            Duration::from_secs(60),
            |c| ready_at(&survivors(c), &[("west", 3), ("north", 3)]),
        )
        .await
        .map(|_| cut.elapsed())?;
    let copies = federation.copies(&deployments(), "web").await?;
    let total: i64 = survivors(&copies)
        .iter()
        .map(|c| c.replicas.unwrap_or(0))
        .sum();
    assert_eq!(total, 6, "no duplicate or lost replicas: {copies:?}");
    partition.heal()?;
    let (back, lowest) = converge_back(&federation, Duration::from_secs(60)).await?;
    assert!(lowest >= 6);
    assert_eq!(uids(&federation).await?, before);
    println!(
        "hub killed at detection {:.1}s after the cut (copies then: {:?}), restarted at {:.1}s; \
         the new hub finished the failover {:.1}s after the cut; back to 2/2/2 {:.1}s after the heal",
        detected.as_secs_f64(),
        survivors(&during)
            .iter()
            .map(|c| (c.cluster.clone(), c.replicas))
            .collect::<Vec<_>>(),
        restarted.as_secs_f64(),
        moved.as_secs_f64(),
        back.as_secs_f64()
    );
    Ok(())
}

/// Real PostgreSQL through the hub's everyday operations: a client writes to west's
/// database through its `-rw` Service all along while the hub is killed and restarted,
/// then while the placement moves the database from east and west to west and north.
/// West's copy is never touched (same UIDs, same pod), every acknowledged write is in it,
/// north gets its own new database, and east's copy goes only after north's is Ready,
/// leaving its volume claim retained and labelled released.
#[tokio::test]
async fn a_hub_restart_and_a_placement_change_lose_no_acknowledged_write() -> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use bulkhead_e2e::federation::policies;
    use bulkhead_e2e::postgres_support::{
        app_credentials, connect, rows_and_lost, wait_streaming, write_through,
    };
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;

    let mut federation = federation("fail-pgdrill").await?;
    let ns = federation.namespace.clone();
    let west = federation.members["west"].clone();
    let primary = wait_streaming(&west, &ns, "orders").await?;
    let credentials = app_credentials(&west, &ns, "orders").await?;
    connect(primary, &credentials)
        .await?
        .batch_execute("CREATE TABLE orders (id int PRIMARY KEY)")
        .await?;
    let west_before = federation
        .member_uids(&databases())
        .await?
        .into_iter()
        .filter(|(k, _)| k.starts_with("west"))
        .collect::<BTreeMap<_, _>>();
    let west_pods = database_pods(&federation, "west").await?;

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));
    let writer = tokio::spawn(write_through(
        west.clone(),
        ns.clone(),
        "orders-rw".into(),
        credentials.clone(),
        0,
        stop.clone(),
        acked.clone(),
    ));
    let wait_acks = |more: usize, what: &'static str| {
        let acked = acked.clone();
        let from = acked.load(Ordering::SeqCst);
        wait_for(what, Duration::from_secs(60), move || {
            let n = acked.load(Ordering::SeqCst);
            async move {
                if n >= from + more {
                    Check::Done(())
                } else {
                    Check::Waiting(format!("{} more acknowledged", n - from))
                }
            }
        })
    };
    wait_acks(20, "writes to west before the drills").await?;

    // The hub killed and started again (the agents may fence for a moment: the suite's
    // lease is 3 s).
    federation.kill_hub();
    tokio::time::sleep(Duration::from_secs(2)).await;
    federation.start_hub()?;
    federation
        .wait_members_ready(Duration::from_secs(60))
        .await?;
    federation.wait_settled(Duration::from_secs(120)).await?;
    wait_acks(20, "writes to west after the hub restart").await?;

    // The placement moves from east + west to west + north.
    federation
        .apply(
            &policies(),
            federation.policy(
                "orders",
                serde_json::json!([{"apiVersion": "example.com/v1", "kind": "MyDatabase", "name": "orders"}]),
                serde_json::json!({"clusterAffinity": {"clusterNames": ["west", "north"]},
                       "replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted"}}),
                serde_json::json!({"failover": {"stateless": {"tolerationSeconds": TOLERATION_SECONDS}}}),
            ),
        )
        .await?;
    wait_database(
        &federation,
        "north",
        DatabasePhase::Ready,
        Duration::from_secs(120),
    )
    .await?;
    federation
        .wait_copies(
            &databases(),
            "orders",
            "west 1, north 1 and no copy in east",
            Duration::from_secs(120),
            |c| {
                ready_at(c, &[("west", 1), ("north", 1)])
                    && !c.iter().any(|copy| copy.cluster == "east")
            },
        )
        .await?;
    wait_acks(20, "writes to west after the placement change").await?;
    stop.store(true, Ordering::SeqCst);
    let (acknowledged, longest_gap) = writer.await?;

    // West's database is the one it was, with every acknowledged write.
    let west_after = federation
        .member_uids(&databases())
        .await?
        .into_iter()
        .filter(|(k, _)| k.starts_with("west"))
        .collect::<BTreeMap<_, _>>();
    assert_eq!(west_after, west_before, "west's copy was never re-created");
    assert_eq!(
        database_pods(&federation, "west").await?,
        west_pods,
        "west's pod never restarted"
    );
    let primary = wait_streaming(&west, &ns, "orders").await?;
    let (_, lost) = rows_and_lost(primary, &credentials, &acknowledged).await?;
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    // East's volume stays, released for a later return of the database.
    let claim = Api::<PersistentVolumeClaim>::namespaced(federation.members["east"].clone(), &ns)
        .get("data-orders-0")
        .await?;
    assert_eq!(
        claim
            .metadata
            .labels
            .unwrap_or_default()
            .get("example.com/released")
            .map(String::as_str),
        Some("true"),
        "east's claim is retained and labelled released"
    );
    println!(
        "a hub restart and a placement change: {} writes acknowledged by west through -rw, none lost; longest wait between two {:.1}s ({} ids tried)",
        acknowledged.len(),
        longest_gap.as_secs_f64(),
        acknowledged.last().map_or(0, |id| id + 1)
    );
    Ok(())
}
