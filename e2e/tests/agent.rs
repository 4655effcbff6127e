//! The member agent against a real lab member: the MyDatabase lifecycle, read-only mode
//! and fencing by the hub's lease. Each test runs its own agent process limited to the
//! test's namespace, with the lease in that namespace, so tests never disturb each other.
//! The databases run real PostgreSQL on the member's database node (the lab runner);
//! `tests/postgres.rs` talks to them with a client.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bulkhead::api::MyDatabase;
use bulkhead::api::mydatabase::DatabasePhase;
use bulkhead_e2e::agent_support::{
    AgentProcess, LeaseRenewer, pods, ready_endpoints, renew_lease, wait_endpoints,
};
use bulkhead_e2e::lab;
use bulkhead_e2e::support::{self, TestNamespace};
use bulkhead_e2e::{Check, wait_for};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

const CLUSTER: &str = "north";

fn database(name: &str, replicas: i32, version: &str) -> Result<MyDatabase> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "example.com/v1", "kind": "MyDatabase",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "version": version, "storage": {"size": "1Gi"}}
    }))?)
}

/// The test's agent, its database pods on the database node (real PostgreSQL).
fn start_agent(lab: &lab::Lab, ns: &str, extra: &[&str]) -> Result<AgentProcess> {
    let mut args = lab::runner::agent_args();
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    AgentProcess::start(lab, CLUSTER, ns, &args)
}

/// Whether the read-write Services select nothing at once (the agent's first step when
/// read-only: before the primary is demoted).
async fn writers_routed_away(client: &Client, ns: &str, name: &str) -> Result<bool> {
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    for service in [name.to_string(), format!("{name}-rw")] {
        let selector = services
            .get(&service)
            .await?
            .spec
            .and_then(|s| s.selector)
            .unwrap_or_default();
        if !selector.contains_key("example.com/accepts-writes") {
            return Ok(false);
        }
    }
    Ok(true)
}

async fn setup(prefix: &str) -> Result<(lab::Lab, TestNamespace, Client)> {
    let lab = support::lab().await?;
    lab.install_crds(CLUSTER, &lab::crd_dir()).await?;
    let namespace = TestNamespace::create(&lab, prefix, &[CLUSTER]).await?;
    let client = lab.inside_client(CLUSTER).await?;
    Ok((lab, namespace, client))
}

/// Waits until the database reports `phase` with `ready` ready replicas.
async fn wait_phase(
    client: &Client,
    ns: &str,
    name: &str,
    phase: DatabasePhase,
    ready: i32,
    agent: &AgentProcess,
) -> Result<MyDatabase> {
    let api: Api<MyDatabase> = Api::namespaced(client.clone(), ns);
    wait_for(
        &format!("MyDatabase {name} phase {phase:?} with {ready} ready"),
        Duration::from_secs(90),
        || {
            let api = api.clone();
            async move {
                match api.get(name).await {
                    Ok(db) => {
                        let status = db.status.clone().unwrap_or_default();
                        if status.phase == Some(phase)
                            && status.ready_replicas == ready
                            && status.observed_generation == db.metadata.generation
                        {
                            Check::Done(db)
                        } else {
                            Check::Waiting(format!(
                                "phase {:?}, ready {}, observedGeneration {:?}",
                                status.phase, status.ready_replicas, status.observed_generation
                            ))
                        }
                    }
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", agent.log_tail()))
}

#[tokio::test]
async fn lifecycle_create_scale_upgrade_heal_and_delete() -> Result<()> {
    let (lab, namespace, client) = setup("agent-life").await?;
    let ns = namespace.name.as_str();
    let agent = start_agent(&lab, ns, &["--no-fencing"])?;
    let api: Api<MyDatabase> = Api::namespaced(client.clone(), ns);

    let started = Instant::now();
    api.create(&PostParams::default(), &database("orders", 3, "14")?)
        .await?;
    wait_phase(&client, ns, "orders", DatabasePhase::Ready, 3, &agent).await?;
    eprintln!(
        "created -> Ready with 3 replicas in {:?}",
        started.elapsed()
    );
    let db = api.get("orders").await?;
    assert!(
        db.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"example.com/cleanup".to_string())
    );
    let sts = Api::<StatefulSet>::namespaced(client.clone(), ns)
        .get("orders")
        .await?;
    let spec = sts.spec.unwrap();
    assert_eq!(spec.pod_management_policy.as_deref(), Some("OrderedReady"));
    assert_eq!(spec.revision_history_limit, Some(5));
    for service in [
        "orders",
        "orders-rw",
        "orders-ro",
        "orders-r",
        "orders-headless",
    ] {
        Api::<Service>::namespaced(client.clone(), ns)
            .get(service)
            .await
            .with_context(|| format!("Service {service}"))?;
    }
    assert!(!writers_routed_away(&client, ns, "orders").await?);
    wait_endpoints(&client, ns, "orders-rw", 1).await?;
    wait_endpoints(&client, ns, "orders-ro", 2).await?;

    // The scale subresource, as `kubectl scale db/orders --replicas=5` uses it.
    for replicas in [5, 2] {
        let started = Instant::now();
        let scale = serde_json::json!({"spec": {"replicas": replicas}});
        api.patch_scale("orders", &PatchParams::default(), &Patch::Merge(&scale))
            .await?;
        wait_phase(
            &client,
            ns,
            "orders",
            DatabasePhase::Ready,
            replicas,
            &agent,
        )
        .await?;
        let sts = Api::<StatefulSet>::namespaced(client.clone(), ns)
            .get("orders")
            .await?;
        assert_eq!(sts.spec.unwrap().replicas, Some(replicas));
        eprintln!("scaled to {replicas} in {:?}", started.elapsed());
    }

    // Version 14 -> 15 rolls every pod to the new image.
    let before = pods(&client, ns, "orders").await?;
    let started = Instant::now();
    api.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"spec": {"version": "15"}})),
    )
    .await?;
    wait_for(
        "every pod on postgres:15",
        Duration::from_secs(90),
        || async {
            match pods(&client, ns, "orders").await {
                Ok(p) if p.len() == 2 && p.values().all(|(_, image)| image == "postgres:15") => {
                    Check::Done(())
                }
                Ok(p) => Check::Waiting(format!("{p:?}")),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    wait_phase(&client, ns, "orders", DatabasePhase::Ready, 2, &agent).await?;
    let after = pods(&client, ns, "orders").await?;
    for (pod, (uid, _)) in &before {
        assert_ne!(
            after.get(pod).map(|(u, _)| u),
            Some(uid),
            "{pod} was replaced by the rolling update"
        );
    }
    eprintln!("rolled to version 15 in {:?}", started.elapsed());

    // A deleted child comes back.
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let old_uid = services.get("orders").await?.metadata.uid;
    services.delete("orders", &DeleteParams::default()).await?;
    let started = Instant::now();
    wait_for(
        "Service orders recreated",
        Duration::from_secs(30),
        || async {
            match services.get_opt("orders").await {
                Ok(Some(s))
                    if s.metadata.uid != old_uid && s.metadata.deletion_timestamp.is_none() =>
                {
                    Check::Done(())
                }
                Ok(other) => Check::Waiting(format!("{:?}", other.map(|s| s.metadata.uid))),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    eprintln!("deleted Service recreated in {:?}", started.elapsed());

    // A drifted replica count is restored.
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    statefulsets
        .patch(
            "orders",
            &PatchParams::apply("someone-else").force(),
            &Patch::Apply(&serde_json::json!({
                "apiVersion": "apps/v1", "kind": "StatefulSet", "spec": {"replicas": 4}
            })),
        )
        .await?;
    wait_for(
        "StatefulSet replicas restored to 2",
        Duration::from_secs(30),
        || async {
            match statefulsets.get("orders").await {
                Ok(s) if s.spec.as_ref().and_then(|s| s.replicas) == Some(2) => Check::Done(()),
                Ok(s) => Check::Waiting(format!("replicas {:?}", s.spec.and_then(|s| s.replicas))),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;

    // Deleting the database removes its children; its volumes stay (reclaimPolicy
    // Retain, the default), marked released.
    api.delete("orders", &DeleteParams::default()).await?;
    wait_for(
        "MyDatabase and children gone, the 5 claims kept and released",
        Duration::from_secs(60),
        || async {
            match leftovers(&client, ns, "orders").await {
                Ok(left) if left.children_gone() && left.claims == 5 && left.released == 5 => {
                    Check::Done(())
                }
                Ok(left) => Check::Waiting(format!("{left:?}")),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", agent.log_tail()))?;

    // With reclaimPolicy Delete, a user deleting the database deletes its volumes too.
    let mut ledger = database("ledger", 1, "14")?;
    ledger.spec.storage.reclaim_policy = bulkhead::api::mydatabase::ReclaimPolicy::Delete;
    api.create(&PostParams::default(), &ledger).await?;
    wait_phase(&client, ns, "ledger", DatabasePhase::Ready, 1, &agent).await?;
    api.delete("ledger", &DeleteParams::default()).await?;
    wait_for(
        "MyDatabase, children and volumes gone (reclaimPolicy Delete)",
        Duration::from_secs(60),
        || async {
            match leftovers(&client, ns, "ledger").await {
                Ok(left) if left.children_gone() && left.claims == 0 => Check::Done(()),
                Ok(left) => Check::Waiting(format!("{left:?}")),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", agent.log_tail()))?;
    Ok(())
}

/// What is left of a deleted database in the namespace.
#[derive(Debug)]
struct Leftovers {
    database: bool,
    statefulset: bool,
    services: usize,
    claims: usize,
    released: usize,
}

impl Leftovers {
    fn children_gone(&self) -> bool {
        !self.database && !self.statefulset && self.services == 0
    }
}

async fn leftovers(client: &Client, ns: &str, name: &str) -> Result<Leftovers> {
    let selector = format!("example.com/database={name}");
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&selector))
        .await?;
    Ok(Leftovers {
        database: Api::<MyDatabase>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await?
            .is_some(),
        statefulset: Api::<StatefulSet>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await?
            .is_some(),
        services: Api::<Service>::namespaced(client.clone(), ns)
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .len(),
        released: claims
            .items
            .iter()
            .filter(|c| c.labels().get("example.com/released").map(String::as_str) == Some("true"))
            .count(),
        claims: claims.items.len(),
    })
}

#[tokio::test]
async fn read_only_mode_demotes_the_primary_without_restarting_pods() -> Result<()> {
    let (lab, namespace, client) = setup("agent-ro").await?;
    let ns = namespace.name.as_str();
    let agent = start_agent(&lab, ns, &["--no-fencing"])?;
    let api: Api<MyDatabase> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &database("ledger", 3, "16")?)
        .await?;
    wait_phase(&client, ns, "ledger", DatabasePhase::Ready, 3, &agent).await?;
    wait_endpoints(&client, ns, "ledger", 1).await?;
    wait_endpoints(&client, ns, "ledger-ro", 2).await?;
    let before = pods(&client, ns, "ledger").await?;

    api.patch(
        "ledger",
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"spec": {"readOnly": true}})),
    )
    .await?;
    let db = wait_phase(&client, ns, "ledger", DatabasePhase::ReadOnly, 3, &agent).await?;
    let condition = bulkhead::api::find_condition(&db.status.unwrap().conditions, "ReadOnly")
        .cloned()
        .unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("True", "Requested")
    );
    wait_endpoints(&client, ns, "ledger", 0).await?;
    wait_endpoints(&client, ns, "ledger-rw", 0).await?;
    // Every instance is a hot standby now (the server refuses writes, tests/postgres.rs),
    // so -ro serves reads from all three.
    wait_endpoints(&client, ns, "ledger-ro", 3).await?;
    assert!(writers_routed_away(&client, ns, "ledger").await?);
    assert_eq!(
        pods(&client, ns, "ledger").await?,
        before,
        "no pod restarted entering read-only"
    );

    api.patch(
        "ledger",
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"spec": {"readOnly": false}})),
    )
    .await?;
    wait_phase(&client, ns, "ledger", DatabasePhase::Ready, 3, &agent).await?;
    wait_endpoints(&client, ns, "ledger", 1).await?;
    wait_endpoints(&client, ns, "ledger-ro", 2).await?;
    assert!(!writers_routed_away(&client, ns, "ledger").await?);
    assert_eq!(
        pods(&client, ns, "ledger").await?,
        before,
        "no pod restarted leaving read-only"
    );
    Ok(())
}

#[tokio::test]
async fn fences_when_the_hub_lease_goes_stale_and_unfences_when_it_returns() -> Result<()> {
    let (lab, namespace, client) = setup("agent-fence").await?;
    let ns = namespace.name.as_str();
    let lease_seconds = 3;
    let agent = start_agent(
        &lab,
        ns,
        &[
            "--lease-namespace",
            ns,
            "--lease-name",
            "hub",
            "--lease-duration-seconds",
            "3",
            "--unfence-after-seconds",
            "1",
        ],
    )?;
    let api: Api<MyDatabase> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &database("payments", 2, "16")?)
        .await?;

    // Never saw the lease: starts fenced.
    let db = wait_phase(&client, ns, "payments", DatabasePhase::ReadOnly, 2, &agent).await?;
    let condition = bulkhead::api::find_condition(&db.status.unwrap().conditions, "ReadOnly")
        .cloned()
        .unwrap();
    assert_eq!(condition.reason, "HubUnreachable");
    assert!(writers_routed_away(&client, ns, "payments").await?);

    // The "hub" renews every 500 ms: unfenced after unfenceAfter.
    let renewer = LeaseRenewer::start(
        client.clone(),
        ns,
        "hub",
        lease_seconds,
        Duration::from_millis(500),
    );
    let started = Instant::now();
    wait_phase(&client, ns, "payments", DatabasePhase::Ready, 2, &agent).await?;
    eprintln!(
        "unfenced {:?} after the hub started renewing",
        started.elapsed()
    );
    wait_endpoints(&client, ns, "payments", 1).await?;
    let before = pods(&client, ns, "payments").await?;

    // The hub goes away: fenced within the lease duration + 1 s of its last renewal.
    renewer.stop();
    renew_lease(&client, ns, "hub", lease_seconds).await?;
    let last_renewal = Instant::now();
    wait_for(
        "writers routed away after the lease expired",
        Duration::from_secs(30),
        || async {
            match writers_routed_away(&client, ns, "payments").await {
                Ok(true) => Check::Done(()),
                Ok(false) => Check::Waiting("read-write".into()),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    let fenced_after = last_renewal.elapsed();
    eprintln!("fenced {fenced_after:?} after the last renewal (lease duration {lease_seconds} s)");
    assert!(
        fenced_after <= Duration::from_secs(lease_seconds as u64 + 1),
        "fenced {fenced_after:?} after the last renewal; the contract is lease duration + 1 s"
    );
    assert!(
        fenced_after >= Duration::from_secs(lease_seconds as u64 - 1),
        "not before the lease could expire"
    );
    wait_phase(&client, ns, "payments", DatabasePhase::ReadOnly, 2, &agent).await?;
    wait_endpoints(&client, ns, "payments", 0).await?;
    // The primary is demoted: both instances serve reads as hot standbys.
    wait_endpoints(&client, ns, "payments-ro", 2).await?;
    assert_eq!(
        ready_endpoints(&client, ns, "payments-r").await?,
        2,
        "the zone keeps serving reads"
    );
    assert_eq!(
        pods(&client, ns, "payments").await?,
        before,
        "fencing restarts no pod"
    );

    // The hub returns: unfenced, pods untouched throughout.
    let _renewer = LeaseRenewer::start(
        client.clone(),
        ns,
        "hub",
        lease_seconds,
        Duration::from_millis(500),
    );
    let started = Instant::now();
    wait_phase(&client, ns, "payments", DatabasePhase::Ready, 2, &agent).await?;
    eprintln!("unfenced {:?} after renewals resumed", started.elapsed());
    wait_endpoints(&client, ns, "payments", 1).await?;
    assert!(!writers_routed_away(&client, ns, "payments").await?);
    assert_eq!(
        pods(&client, ns, "payments").await?,
        before,
        "unfencing restarts no pod"
    );

    // The fence changes were announced.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    let reasons: Vec<String> = events
        .items
        .iter()
        .filter_map(|e| e.reason.clone())
        .collect();
    assert!(reasons.iter().any(|r| r == "HubUnreachable"), "{reasons:?}");
    assert!(reasons.iter().any(|r| r == "Fenced"), "{reasons:?}");
    Ok(())
}

#[tokio::test]
async fn invalid_changes_are_refused_and_nothing_is_lost() -> Result<()> {
    let (lab, namespace, client) = setup("agent-invalid").await?;
    let ns = namespace.name.as_str();
    let agent = start_agent(&lab, ns, &["--no-fencing"])?;
    let api: Api<MyDatabase> = Api::namespaced(client.clone(), ns);

    support::expect_invalid(
        api.create(&PostParams::default(), &database("zero", 0, "16")?)
            .await,
        "spec.replicas",
    );
    api.create(&PostParams::default(), &database("keep", 2, "16")?)
        .await?;
    wait_phase(&client, ns, "keep", DatabasePhase::Ready, 2, &agent).await?;
    let before = pods(&client, ns, "keep").await?;
    let storage = serde_json::json!({"spec": {"storage": {"size": "5Gi"}}});
    support::expect_invalid(
        api.patch("keep", &PatchParams::default(), &Patch::Merge(&storage))
            .await,
        "spec.storage is immutable",
    );
    let replicas = serde_json::json!({"spec": {"replicas": 11}});
    assert!(
        api.patch("keep", &PatchParams::default(), &Patch::Merge(&replicas))
            .await
            .is_err()
    );
    let db = wait_phase(&client, ns, "keep", DatabasePhase::Ready, 2, &agent).await?;
    assert_eq!(db.spec.storage.size, "1Gi");
    assert_eq!(
        pods(&client, ns, "keep").await?,
        before,
        "nothing restarted or lost"
    );
    Ok(())
}
