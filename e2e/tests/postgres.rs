//! MyDatabase as real PostgreSQL: the lab's database node runs each pod's `bulkhead
//! instance` and PostgreSQL as host processes, and these tests talk to them with a real
//! client (tokio-postgres) through the Services' endpoints.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bulkhead::api::MyDatabase;
use bulkhead_e2e::agent_support::{AgentProcess, LeaseRenewer};
use bulkhead_e2e::lab::{self, runner};
use bulkhead_e2e::postgres_support::{
    Ack, AckLog, AppCredentials, app_credentials, connect, endpoints, freeze, outside,
    rows_and_lost, sqlstate, thaw, wait_streaming, write_through,
};
use bulkhead_e2e::support::{self, Partition, TestNamespace};
use bulkhead_e2e::{Check, wait_for};
use kube::api::PostParams;
use kube::{Api, Client};

/// SQLSTATE `read_only_sql_transaction`: the server refused a write.
const READ_ONLY: &str = "25006";

fn database(name: &str, replicas: i32, synchronous: u32) -> Result<MyDatabase> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "example.com/v1", "kind": "MyDatabase",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "version": "15", "storage": {"size": "1Gi"},
                 "topology": {"synchronous": synchronous}}
    }))?)
}

async fn setup(cluster: &str, prefix: &str) -> Result<(lab::Lab, TestNamespace, Client)> {
    let lab = support::lab().await?;
    lab.install_crds(cluster, &lab::crd_dir()).await?;
    let namespace = TestNamespace::create(&lab, prefix, &[cluster]).await?;
    let client = lab.inside_client(cluster).await?;
    Ok((lab, namespace, client))
}

fn agent(lab: &lab::Lab, cluster: &str, ns: &str, extra: &[&str]) -> Result<AgentProcess> {
    let mut args: Vec<String> = runner::agent_args();
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    AgentProcess::start(lab, cluster, ns, &args)
}

/// Creates the MyDatabase and waits until its primary is available and its standbys
/// stream; the primary's address and the application's credentials.
async fn database_up(
    client: &Client,
    ns: &str,
    name: &str,
    (replicas, synchronous): (i32, u32),
    agent: &AgentProcess,
) -> Result<(Ipv4Addr, AppCredentials)> {
    Api::<MyDatabase>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &database(name, replicas, synchronous)?,
        )
        .await?;
    let primary = wait_streaming(client, ns, name)
        .await
        .with_context(|| format!("agent log:\n{}", agent.log_tail()))?;
    Ok((primary, app_credentials(client, ns, name).await?))
}

/// `CREATE TABLE orders` and one acknowledged insert per id.
async fn write_rows(
    writer: &tokio_postgres::Client,
    ids: std::ops::Range<i32>,
    create: bool,
) -> Result<()> {
    if create {
        writer
            .batch_execute("CREATE TABLE orders (id int PRIMARY KEY)")
            .await?;
    }
    for id in ids {
        writer
            .execute("INSERT INTO orders VALUES ($1)", &[&id])
            .await?;
    }
    Ok(())
}

/// A client inserting through `orders-rw` all along (ids from 1000), running 2 s when
/// `start` returns.
struct RwWriter {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    acked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<(Vec<i32>, Duration)>,
}

impl RwWriter {
    async fn start(client: &Client, ns: &str, credentials: &AppCredentials) -> Self {
        let stop = std::sync::Arc::<std::sync::atomic::AtomicBool>::default();
        let acked = std::sync::Arc::<std::sync::atomic::AtomicUsize>::default();
        let task = tokio::spawn(write_through(
            client.clone(),
            ns.to_string(),
            "orders-rw".into(),
            credentials.clone(),
            1000,
            stop.clone(),
            acked.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(2)).await;
        RwWriter { stop, acked, task }
    }

    /// How many writes were acknowledged so far.
    fn acknowledged(&self) -> usize {
        self.acked.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Stops; every acknowledged id, and the longest wait between two acknowledgements.
    async fn finish(self) -> Result<(Vec<i32>, Duration)> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(self.task.await?)
    }
}

/// The rows written before (ids 0..20) and every write acknowledged through `-rw` are on
/// the primary at `leader`, and writes went on after `what` (more than `acked_before`).
async fn nothing_lost(
    leader: Ipv4Addr,
    credentials: &AppCredentials,
    acknowledged: &[i32],
    acked_before: usize,
    what: &str,
) -> Result<()> {
    let (rows, lost) = rows_and_lost(leader, credentials, acknowledged).await?;
    assert!(
        (0..20).all(|id| rows.contains(&id)),
        "the rows written first are there"
    );
    assert!(
        lost.is_empty(),
        "acknowledged writes lost by {what}: {lost:?}"
    );
    assert!(
        acknowledged.len() > acked_before,
        "writes go on through -rw after {what}"
    );
    Ok(())
}

/// Writes to the server at `address` (a new session each time, whatever the session sets:
/// `default_transaction_read_only = off`; ids from 1000) until it refuses a write with
/// SQLSTATE 25006 (within 30 s): when, and how many writes it accepted before.
async fn write_until_refused(
    address: Ipv4Addr,
    credentials: &AppCredentials,
    where_: &str,
) -> Result<(Instant, i64)> {
    let accepted = std::sync::atomic::AtomicI64::new(0);
    let refused_at = wait_for(
        &format!("the server refuses writes in {where_}"),
        Duration::from_secs(30),
        || {
            let accepted = &accepted;
            async move {
                let session = match connect(address, credentials).await {
                    Ok(s) => s,
                    Err(e) => return Check::Waiting(format!("{e:#}")),
                };
                let id = 1000 + accepted.load(std::sync::atomic::Ordering::SeqCst);
                match session
                    .batch_execute(&format!(
                        "SET default_transaction_read_only = off; INSERT INTO orders VALUES ({id})"
                    ))
                    .await
                {
                    Err(e) if sqlstate(&e).as_deref() == Some(READ_ONLY) => {
                        Check::Done(Instant::now())
                    }
                    Err(e) => Check::Waiting(e.to_string()),
                    Ok(()) => {
                        accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        Check::Waiting("the write was accepted".into())
                    }
                }
            }
        },
    )
    .await?;
    Ok((
        refused_at,
        accepted.load(std::sync::atomic::Ordering::SeqCst),
    ))
}

/// The reasons of the Events in `ns`.
async fn event_reasons(client: &Client, ns: &str) -> Result<Vec<String>> {
    Ok(
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter_map(|e| e.reason)
            .collect(),
    )
}

async fn count(client: &tokio_postgres::Client) -> Result<i64> {
    Ok(client
        .query_one("SELECT count(*) FROM orders", &[])
        .await?
        .get(0))
}

/// Waits until a standby at `address` has `rows` rows.
async fn wait_rows(address: Ipv4Addr, credentials: &AppCredentials, rows: i64) -> Result<()> {
    wait_for(
        &format!("{address} has {rows} rows"),
        Duration::from_secs(30),
        || async move {
            match connect(address, credentials).await {
                Ok(client) => match count(&client).await {
                    Ok(n) if n == rows => Check::Done(()),
                    Ok(n) => Check::Waiting(format!("{n} rows")),
                    Err(e) => Check::Waiting(e.to_string()),
                },
                Err(e) => Check::Waiting(format!("{e:#}")),
            }
        },
    )
    .await
}

#[tokio::test]
async fn writes_reach_every_standby_and_a_hung_primary_fails_over_without_losing_one() -> Result<()>
{
    let cluster = "west";
    let (lab, namespace, client) = setup(cluster, "pg-failover").await?;
    let ns = namespace.name.as_str();
    let info = lab::member(cluster)?;
    let agent = agent(&lab, cluster, ns, &["--no-fencing"])?;
    let (primary, credentials) = database_up(&client, ns, "orders", (3, 1), &agent).await?;

    // Writes through -rw land on the primary; every standby (-ro) has them and refuses
    // writes itself.
    let writer = connect(primary, &credentials).await?;
    write_rows(&writer, 0..50, true).await?;
    let mut acknowledged = 50;
    let standbys = wait_for(
        "two standbys behind -ro",
        Duration::from_secs(30),
        || async {
            match endpoints(&client, ns, "orders-ro").await {
                Ok(standbys) if standbys.len() == 2 => Check::Done(standbys),
                Ok(other) => Check::Waiting(format!("{other:?}")),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    assert!(!standbys.contains(&primary));
    for standby in &standbys {
        wait_rows(*standby, &credentials, acknowledged).await?;
        let error = connect(*standby, &credentials)
            .await?
            .execute("INSERT INTO orders VALUES (1000)", &[])
            .await
            .expect_err("a standby refuses writes");
        assert_eq!(sqlstate(&error).as_deref(), Some(READ_ONLY), "{error}");
    }

    // The primary hangs (every process stopped, as on a frozen node): a standby takes
    // over, and with `synchronous: 1` every acknowledged write is there.
    let db: MyDatabase = Api::namespaced(client.clone(), ns).get("orders").await?;
    let old_primary = db
        .status
        .as_ref()
        .and_then(|s| s.primary.clone())
        .context("primary")?;
    let old_term = db.status.as_ref().map(|s| s.term).unwrap_or_default();
    let frozen = freeze(&lab, info, ns, &old_primary)?;
    let frozen_at = Instant::now();
    let new_primary = wait_for(
        "-rw selects another instance, which takes a write",
        Duration::from_secs(30),
        || {
            let (client, credentials) = (client.clone(), credentials.clone());
            async move {
                let rw = endpoints(&client, ns, "orders-rw")
                    .await
                    .unwrap_or_default();
                match rw.as_slice() {
                    [address] if *address != primary => match connect(*address, &credentials).await
                    {
                        Ok(c) => match c.execute("INSERT INTO orders VALUES (50)", &[]).await {
                            Ok(_) => Check::Done(*address),
                            Err(e) => Check::Waiting(e.to_string()),
                        },
                        Err(e) => Check::Waiting(format!("{e:#}")),
                    },
                    other => Check::Waiting(format!("-rw endpoints {other:?}")),
                }
            }
        },
    )
    .await;
    let failover = frozen_at.elapsed();
    thaw(&frozen);
    let new_primary = new_primary.with_context(|| format!("agent log:\n{}", agent.log_tail()))?;
    acknowledged += 1;
    // The agent cannot tell a hung primary from one it merely cannot reach: it promotes
    // only once the primary's own lease (10 s from the last command it accepted) and
    // its demotion allowance are over (docs/benchmarks.md has the time).
    eprintln!("a hung primary: another instance took a write {failover:?} after the freeze");
    let writer = connect(new_primary, &credentials).await?;
    assert_eq!(
        count(&writer).await?,
        acknowledged,
        "no acknowledged write lost (synchronous: 1)"
    );
    let db: MyDatabase = Api::namespaced(client.clone(), ns).get("orders").await?;
    let status = db.status.unwrap_or_default();
    assert_eq!(status.term, old_term + 1, "the promotion raised the term");
    assert_ne!(status.primary.as_deref(), Some(old_primary.as_str()));

    // The old primary comes back under the old term: it rejoins as a standby of the new
    // one, never as a second primary.
    wait_for(
        "the old primary streams as a standby under the new term",
        Duration::from_secs(60),
        || {
            let api: Api<MyDatabase> = Api::namespaced(client.clone(), ns);
            let old_primary = old_primary.clone();
            async move {
                let Ok(db) = api.get("orders").await else {
                    return Check::Waiting("reading".into());
                };
                let status = db.status.unwrap_or_default();
                match status.instances.iter().find(|i| i.name == old_primary) {
                    Some(i)
                        if i.role.as_deref() == Some("Standby")
                            && i.term == old_term + 1
                            && i.ready =>
                    {
                        Check::Done(())
                    }
                    other => Check::Waiting(format!("{other:?}")),
                }
            }
        },
    )
    .await?;
    wait_rows(primary, &credentials, acknowledged).await?;
    let error = connect(primary, &credentials)
        .await?
        .execute("INSERT INTO orders VALUES (1001)", &[])
        .await
        .expect_err("the old primary is a standby now");
    assert_eq!(sqlstate(&error).as_deref(), Some(READ_ONLY), "{error}");
    assert_eq!(endpoints(&client, ns, "orders-rw").await?, [new_primary]);
    Ok(())
}

#[tokio::test]
async fn a_cut_off_zone_refuses_writes_in_the_server_and_keeps_serving_reads() -> Result<()> {
    let cluster = "east";
    let (lab, namespace, client) = setup(cluster, "pg-fence").await?;
    let ns = namespace.name.as_str();
    let lease_seconds = 3;
    let agent = agent(
        &lab,
        cluster,
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
    // The "hub" renews from outside the zone, as the real one does: a partition stops it.
    let _renewer = LeaseRenewer::start(
        lab.client(cluster).await?,
        ns,
        "hub",
        lease_seconds,
        Duration::from_millis(500),
    );
    let (primary, credentials) = database_up(&client, ns, "ledger", (2, 0), &agent).await?;

    // A client outside the zone writes through the primary's outside address; one inside
    // the zone keeps a session open through the cut.
    let outside_client = connect(outside(primary)?, &credentials).await?;
    write_rows(&outside_client, 0..20, true).await?;
    let acknowledged = 20;
    let open_inside = connect(primary, &credentials).await?;
    open_inside
        .execute("INSERT INTO orders VALUES (20)", &[])
        .await?;
    let acknowledged = acknowledged + 1;

    let partition = Partition::start(&lab, cluster)?;
    let cut_at = Instant::now();
    // Outside clients are cut off like the API server.
    let outside_try = tokio::time::timeout(
        Duration::from_secs(3),
        connect(outside(primary)?, &credentials),
    )
    .await;
    assert!(
        !matches!(outside_try, Ok(Ok(_))),
        "a client outside the zone cannot reach the database during the partition"
    );

    // Inside the zone the server itself refuses writes once the agent fences (the hub's
    // lease is stale): the open session is ended by the demotion, and a new one's write
    // gets 25006 whatever the session sets.
    // Until the lease runs out the zone still takes writes (each is acknowledged, and
    // counted).
    let (refused_at, accepted) = write_until_refused(primary, &credentials, "the cut-off zone")
        .await
        .with_context(|| format!("agent log:\n{}", agent.log_tail()))?;
    let acknowledged = acknowledged + accepted;
    eprintln!("{accepted} writes accepted inside the zone before the fence");
    let refused_after = refused_at - cut_at;
    eprintln!(
        "writes refused by the server {refused_after:?} after the cut (lease {lease_seconds} s)"
    );
    assert!(
        refused_after <= Duration::from_secs(lease_seconds as u64 + 2),
        "refused within lease + 2 s, took {refused_after:?}"
    );
    let error = open_inside
        .execute("INSERT INTO orders VALUES (1001)", &[])
        .await
        .expect_err("the session open at the fence cannot write");
    eprintln!("the session open through the cut: {error}");
    // Reads keep working in the zone, from every instance.
    for address in endpoints(&client, ns, "ledger-r").await? {
        let reader = connect(address, &credentials).await?;
        assert_eq!(
            count(&reader).await?,
            acknowledged,
            "{address} serves reads"
        );
    }
    assert!(
        endpoints(&client, ns, "ledger-rw").await?.is_empty(),
        "-rw has no endpoints while fenced"
    );

    // Heal: the hub's lease is fresh again, the primary is promoted, writes resume and
    // every write acknowledged before the cut is there.
    partition.heal()?;
    let healed_at = Instant::now();
    let writable = wait_for(
        "writes accepted again after the heal",
        Duration::from_secs(60),
        || {
            let (client, credentials) = (client.clone(), credentials.clone());
            async move {
                let rw = endpoints(&client, ns, "ledger-rw")
                    .await
                    .unwrap_or_default();
                let Some(address) = rw.first() else {
                    return Check::Waiting("-rw has no endpoint".into());
                };
                match connect(outside(*address).unwrap(), &credentials).await {
                    Ok(c) => match c.execute("INSERT INTO orders VALUES (21)", &[]).await {
                        Ok(_) => Check::Done(c),
                        Err(e) => Check::Waiting(e.to_string()),
                    },
                    Err(e) => Check::Waiting(format!("{e:#}")),
                }
            }
        },
    )
    .await?;
    eprintln!("writable again {:?} after the heal", healed_at.elapsed());
    assert_eq!(
        count(&writable).await?,
        acknowledged + 1,
        "every write acknowledged before the cut is there"
    );
    Ok(())
}

/// Figures for docs/benchmarks.md (printed, never asserted on time): replication lag at
/// rest and under a steady write load, as the primary's `pg_stat_replication` reports it.
/// The superuser's credentials of database `name` (its instance Secret):
/// pg_stat_replication needs a privileged role, the application's user sees its own
/// sessions only.
async fn superuser(client: &Client, ns: &str, name: &str) -> Result<AppCredentials> {
    let secret: k8s_openapi::api::core::v1::Secret = Api::namespaced(client.clone(), ns)
        .get(&format!("{name}-instance"))
        .await?;
    Ok(AppCredentials {
        user: "postgres".into(),
        password: String::from_utf8(
            secret.data.unwrap_or_default()["superuser-password"]
                .0
                .clone(),
        )?,
        dbname: "postgres".into(),
    })
}

/// One sample of pg_stat_replication on a primary: bytes behind and replay lag of each
/// standby (only those named `application` when given).
async fn replication_sample(
    observer: &tokio_postgres::Client,
    application: Option<&str>,
) -> Result<Vec<(i64, f64)>> {
    Ok(observer
        .query(
            "SELECT (pg_current_wal_lsn() - replay_lsn)::bigint,
                    coalesce(extract(epoch FROM replay_lag), 0)::float8
             FROM pg_stat_replication
             WHERE $1::text IS NULL OR application_name = $1::text",
            &[&application],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// p50 and max of replication samples, in words.
fn summary(samples: &[(i64, f64)]) -> String {
    let mut bytes: Vec<i64> = samples.iter().map(|s| s.0).collect();
    let mut seconds: Vec<f64> = samples.iter().map(|s| s.1).collect();
    bytes.sort();
    seconds.sort_by(f64::total_cmp);
    let at = |n: usize, q: f64| ((n as f64 - 1.0) * q).round() as usize;
    format!(
        "{} samples: bytes behind p50 {} max {}; replay lag p50 {:.1} ms max {:.1} ms",
        samples.len(),
        bytes[at(bytes.len(), 0.5)],
        bytes[bytes.len() - 1],
        seconds[at(seconds.len(), 0.5)] * 1000.0,
        seconds[seconds.len() - 1] * 1000.0
    )
}

/// A steady load on `table` (`id bigserial, body text`): 200 single-row commits a second,
/// each about 200 bytes, for 20 s, with `sample` taken every 250 ms meanwhile. The
/// samples, the rows written and how long it took.
async fn under_steady_load<F, Fut>(
    writer: tokio_postgres::Client,
    table: &str,
    sample: F,
) -> Result<(Vec<(i64, f64)>, u64, Duration)>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<(i64, f64)>>>,
{
    let insert = format!("INSERT INTO {table} (body) VALUES (repeat('x', 200))");
    let load = tokio::spawn(async move {
        let started = Instant::now();
        let mut written = 0u64;
        while started.elapsed() < Duration::from_secs(20) {
            let tick = Instant::now();
            for _ in 0..20 {
                writer.execute(insert.as_str(), &[]).await?;
                written += 1;
            }
            tokio::time::sleep(Duration::from_millis(100).saturating_sub(tick.elapsed())).await;
        }
        anyhow::Ok((written, started.elapsed()))
    });
    let mut samples = vec![];
    while !load.is_finished() {
        samples.extend(sample().await?);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (written, took) = load.await??;
    Ok((samples, written, took))
}

#[tokio::test]
async fn replication_lag_at_rest_and_under_a_steady_write_load() -> Result<()> {
    let cluster = "north";
    let (lab, namespace, client) = setup(cluster, "pg-lag").await?;
    let ns = namespace.name.as_str();
    let agent = agent(&lab, cluster, ns, &["--no-fencing"])?;
    let (primary, credentials) = database_up(&client, ns, "metrics", (3, 0), &agent).await?;
    let writer = connect(primary, &credentials).await?;
    writer
        .batch_execute("CREATE TABLE orders (id bigserial PRIMARY KEY, body text)")
        .await?;
    let observer = connect(primary, &superuser(&client, ns, "metrics").await?).await?;
    let sample = |observer| replication_sample(observer, None);
    let mut rest = vec![];
    for _ in 0..20 {
        rest.extend(sample(&observer).await?);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("replication at rest (2 standbys): {}", summary(&rest));

    let (loaded, written, took) = under_steady_load(writer, "orders", || sample(&observer)).await?;
    eprintln!(
        "replication under {:.0} commits/s ({written} in {took:?}, 2 standbys, asynchronous): {}",
        written as f64 / took.as_secs_f64(),
        summary(&loaded)
    );
    assert!(!loaded.is_empty() && loaded.iter().all(|s| s.0 >= 0));
    Ok(())
}

#[tokio::test]
async fn scaling_down_to_one_and_back_loses_no_acknowledged_write() -> Result<()> {
    let cluster = "west";
    let (lab, namespace, client) = setup(cluster, "pg-scale").await?;
    let ns = namespace.name.as_str();
    let agent = agent(&lab, cluster, ns, &["--no-fencing"])?;
    let api: Api<MyDatabase> = Api::namespaced(client.clone(), ns);
    let (primary, credentials) = database_up(&client, ns, "orders", (3, 1), &agent).await?;
    let writer = connect(primary, &credentials).await?;
    write_rows(&writer, 0..30, true).await?;

    // 3 -> 1: the standbys go (the StatefulSet removes the highest ordinals); the primary
    // stops waiting for them (synchronous is capped at the standbys there are).
    let scale = |replicas: i32| {
        let (api, client, agent) = (&api, &client, &agent);
        async move {
            let patch = serde_json::json!({"spec": {"replicas": replicas}});
            api.patch_scale(
                "orders",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await?;
            wait_streaming(client, ns, "orders")
                .await
                .with_context(|| format!("agent log:\n{}", agent.log_tail()))
        }
    };
    let primary = scale(1).await?;
    let writer = connect(primary, &credentials).await?;
    assert_eq!(count(&writer).await?, 30, "every acknowledged write kept");
    for id in 30..40 {
        tokio::time::timeout(
            Duration::from_secs(10),
            writer.execute("INSERT INTO orders VALUES ($1)", &[&id]),
        )
        .await
        .context("a commit on the single instance waits for no standby")??;
    }

    // 1 -> 3: new standbys copy the primary and stream every write.
    let primary = scale(3).await?;
    let writer = connect(primary, &credentials).await?;
    writer
        .execute("INSERT INTO orders VALUES (40)", &[])
        .await?;
    for standby in endpoints(&client, ns, "orders-ro").await? {
        wait_rows(standby, &credentials, 41).await?;
    }
    Ok(())
}

/// A scale-down that removes the primary's pod (a failover made a high ordinal primary)
/// switches the primary over to an instance it keeps first: with asynchronous replication
/// (`synchronous: 0`), a client writing through `-rw` all along loses no acknowledged
/// write, and the StatefulSet shrinks only once the kept instance leads.
#[tokio::test]
async fn a_scale_down_that_removes_the_primary_switches_over_first() -> Result<()> {
    let cluster = "west";
    let (lab, namespace, client) = setup(cluster, "pg-switchover").await?;
    let ns = namespace.name.as_str();
    let info = lab::member(cluster)?;
    let agent = agent(&lab, cluster, ns, &["--no-fencing"])?;
    let api: Api<MyDatabase> = Api::namespaced(client.clone(), ns);
    let (primary, credentials) = database_up(&client, ns, "orders", (3, 0), &agent).await?;
    write_rows(&connect(primary, &credentials).await?, 0..20, true).await?;

    // A failover makes orders-1 or orders-2 the primary; orders-0 comes back a standby.
    let frozen = freeze(&lab, info, ns, "orders-0")?;
    let promoted = wait_for(
        "another instance recorded as primary",
        Duration::from_secs(30),
        || {
            let api = api.clone();
            async move {
                let status = match api.get("orders").await {
                    Ok(db) => db.status.unwrap_or_default(),
                    Err(e) => return Check::Waiting(e.to_string()),
                };
                match status.primary {
                    Some(p) if p != "orders-0" && status.term == 2 => Check::Done(p),
                    other => Check::Waiting(format!("{other:?} under term {}", status.term)),
                }
            }
        },
    )
    .await;
    thaw(&frozen);
    let promoted = promoted.with_context(|| format!("agent log:\n{}", agent.log_tail()))?;
    wait_streaming(&client, ns, "orders")
        .await
        .with_context(|| format!("agent log:\n{}", agent.log_tail()))?;

    // Writes flow through -rw all along; then the scale-down to 1, which removes the
    // primary's pod.
    let writer = RwWriter::start(&client, ns, &credentials).await;
    let scaled_at = Instant::now();
    api.patch_scale(
        "orders",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&serde_json::json!({"spec": {"replicas": 1}})),
    )
    .await?;
    let kept = wait_streaming(&client, ns, "orders")
        .await
        .with_context(|| format!("agent log:\n{}", agent.log_tail()))?;
    let switched = scaled_at.elapsed();
    let acked_before = writer.acknowledged();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (acknowledged, longest_gap) = writer.finish().await?;

    let db = api.get("orders").await?;
    let status = db.status.unwrap_or_default();
    assert_eq!(
        status.primary.as_deref(),
        Some("orders-0"),
        "the kept instance leads"
    );
    assert_eq!(status.term, 3, "the switchover raised the term once");
    let pod = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns)
        .get("orders-0")
        .await?;
    assert_eq!(
        pod.status.and_then(|s| s.pod_ip).as_deref(),
        Some(kept.to_string().as_str()),
        "-rw selects orders-0"
    );
    eprintln!(
        "switchover from {promoted} to orders-0 for the scale-down: settled {switched:?} after the scale; {} writes acknowledged through -rw, longest gap {longest_gap:?}",
        acknowledged.len()
    );
    nothing_lost(
        kept,
        &credentials,
        &acknowledged,
        acked_before,
        "the switchover",
    )
    .await?;
    let reasons = event_reasons(&client, ns).await?;
    assert!(
        reasons.iter().any(|r| r == "Switchover"),
        "a Switchover Event on the MyDatabase: {reasons:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_version_upgrade_replaces_the_standbys_first_and_the_primary_after_a_switchover()
-> Result<()> {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    let cluster = "west";
    let (lab, namespace, client) = setup(cluster, "pg-upgrade").await?;
    let ns = namespace.name.as_str();
    let agent = agent(&lab, cluster, ns, &["--no-fencing"])?;
    let api: Api<MyDatabase> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let (primary, credentials) = database_up(&client, ns, "orders", (3, 0), &agent).await?;
    write_rows(&connect(primary, &credentials).await?, 0..20, true).await?;
    let before = api.get("orders").await?.status.unwrap_or_default();
    assert_eq!(before.primary.as_deref(), Some("orders-0"));

    // When each pod was first seen with a new UID (replaced), polled every 200 ms.
    let replaced: Arc<Mutex<BTreeMap<String, Instant>>> = Arc::default();
    let first_uids: BTreeMap<String, String> = pods
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter_map(|p| Some((p.name_any(), p.uid()?)))
        .collect();
    let poller = {
        let (pods, replaced) = (pods.clone(), replaced.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(list) = pods.list(&Default::default()).await {
                    let mut replaced = replaced.lock().unwrap();
                    for pod in &list.items {
                        let name = pod.name_any();
                        if first_uids.get(&name) != pod.uid().as_ref() {
                            replaced.entry(name).or_insert_with(Instant::now);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    // Writes through -rw all along; then a new version (a new pod template).
    let writer = RwWriter::start(&client, ns, &credentials).await;
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let old_revision = statefulsets
        .get("orders")
        .await?
        .status
        .and_then(|s| s.update_revision);
    let upgraded_at = Instant::now();
    let generation = api
        .patch(
            "orders",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&serde_json::json!({"spec": {"version": "15.2"}})),
        )
        .await?
        .metadata
        .generation;
    // When the status first said every replica runs the new version (what a rollout
    // wave waits on).
    // The pods still on the old template when the status first said every replica runs
    // the new version (what a rollout wave waits on): read after the status, so none may
    // be left.
    let reported: Arc<Mutex<Option<Vec<String>>>> = Arc::default();
    let reporter = {
        let (api, pods, reported) = (api.clone(), pods.clone(), reported.clone());
        let old_revision = old_revision.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(db) = api.get("orders").await {
                    let status = db.status.unwrap_or_default();
                    if status.observed_generation >= generation
                        && status.updated_replicas == Some(3)
                        && let Ok(list) = pods.list(&Default::default()).await
                    {
                        let old: Vec<String> = list
                            .items
                            .iter()
                            .filter(|p| {
                                p.labels().get("controller-revision-hash") == old_revision.as_ref()
                            })
                            .map(|p| p.name_any())
                            .collect();
                        reported.lock().unwrap().get_or_insert(old);
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    wait_for(
        "every pod on the new template",
        Duration::from_secs(240),
        || {
            let (statefulsets, pods) = (statefulsets.clone(), pods.clone());
            let old_revision = old_revision.clone();
            async move {
                let Ok(set) = statefulsets.get("orders").await else {
                    return Check::Waiting("no StatefulSet".into());
                };
                let Some(revision) = set
                    .status
                    .and_then(|s| s.update_revision)
                    .filter(|r| Some(r) != old_revision.as_ref())
                else {
                    return Check::Waiting("the StatefulSet has not taken the new version".into());
                };
                let Ok(list) = pods.list(&Default::default()).await else {
                    return Check::Waiting("no pods".into());
                };
                let old: Vec<String> = list
                    .items
                    .iter()
                    .filter(|p| p.labels().get("controller-revision-hash") != Some(&revision))
                    .map(|p| p.name_any())
                    .collect();
                if old.is_empty() && list.items.len() == 3 {
                    Check::Done(())
                } else {
                    Check::Waiting(format!("on the old template: {old:?}"))
                }
            }
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", agent.log_tail()))?;
    let leader = wait_streaming(&client, ns, "orders")
        .await
        .with_context(|| format!("agent log:\n{}", agent.log_tail()))?;
    let took = upgraded_at.elapsed();
    let acked_before = writer.acknowledged();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (acknowledged, longest_gap) = writer.finish().await?;
    poller.abort();
    reporter.abort();

    let replaced = replaced.lock().unwrap().clone();
    let at = |pod: &str| {
        replaced
            .get(pod)
            .copied()
            .unwrap_or_else(|| panic!("{pod} was never replaced: {replaced:?}"))
    };
    assert!(
        at("orders-2") < at("orders-1") && at("orders-1") < at("orders-0"),
        "the standbys first (highest ordinal first), the primary's pod last: {:?}",
        replaced
            .iter()
            .map(|(pod, when)| (pod, when.duration_since(upgraded_at)))
            .collect::<Vec<_>>()
    );
    let left = reported
        .lock()
        .unwrap()
        .clone()
        .expect("the status never reported 3 updated replicas");
    assert!(
        left.is_empty(),
        "updatedReplicas reached 3 while {left:?} still ran the old template"
    );
    let status = api.get("orders").await?.status.unwrap_or_default();
    assert_ne!(
        status.primary.as_deref(),
        Some("orders-0"),
        "the primary was switched over to an upgraded instance before its pod went"
    );
    assert_eq!(status.term, before.term + 1, "one switchover, no failover");
    eprintln!(
        "upgrade of 3 instances: done {took:?} after the change; the primary switched over to {:?}; {} writes acknowledged through -rw, longest gap {longest_gap:?}",
        status.primary,
        acknowledged.len()
    );
    nothing_lost(
        leader,
        &credentials,
        &acknowledged,
        acked_before,
        "the upgrade",
    )
    .await?;
    let reasons = event_reasons(&client, ns).await?;
    // (Events of the same reason are one Event with a count, by the recorder.)
    for reason in ["Upgrading", "Switchover"] {
        assert!(reasons.iter().any(|r| r == reason), "{reason}: {reasons:?}");
    }
    Ok(())
}

/// The reasons of a MyDatabase's conditions, by type.
async fn condition_reason(api: &Api<MyDatabase>, name: &str, type_: &str) -> Option<String> {
    let database = api.get(name).await.ok()?;
    bulkhead::api::find_condition(&database.status?.conditions, type_).map(|c| c.reason.clone())
}

/// Waits until every instance of `service` in a cluster has `rows` rows; how long it took.
async fn wait_rows_everywhere(
    client: &Client,
    ns: &str,
    service: &str,
    credentials: &AppCredentials,
    rows: i64,
    instances: usize,
) -> Result<Duration> {
    let started = Instant::now();
    let addresses = wait_for(
        &format!("{instances} ready endpoints of {service}"),
        Duration::from_secs(120),
        || async move {
            match endpoints(client, ns, service).await {
                Ok(found) if found.len() == instances => Check::Done(found),
                Ok(found) => Check::Waiting(format!("{found:?}")),
                Err(e) => Check::Waiting(format!("{e:#}")),
            }
        },
    )
    .await?;
    for address in addresses {
        wait_rows(address, credentials, rows).await?;
    }
    Ok(started.elapsed())
}

/// A replica cluster made by hand (`spec.topology.replicaOf`, the Secrets copied from the
/// source): west's designated primary streams east's primary through east's outside
/// address (what a partition of east cuts), west's other instance cascades from it.
/// Every write on east reaches every west instance; west refuses writes in the server,
/// its `-rw` has no endpoints; cut off from east it serves what it has, and after the
/// heal it catches up with what east took meanwhile.
#[tokio::test]
async fn a_replica_cluster_streams_from_another_clusters_primary_through_a_partition() -> Result<()>
{
    use k8s_openapi::api::core::v1::Secret;
    let lab = support::lab().await?;
    for cluster in ["east", "west"] {
        lab.install_crds(cluster, &lab::crd_dir()).await?;
    }
    let namespace = TestNamespace::create(&lab, "pg-replica", &["east", "west"]).await?;
    let ns = namespace.name.as_str();
    let east = lab.inside_client("east").await?;
    let west = lab.inside_client("west").await?;
    let east_agent = agent(&lab, "east", ns, &["--no-fencing"])?;
    let west_agent = agent(&lab, "west", ns, &["--no-fencing"])?;
    let (primary, credentials) = database_up(&east, ns, "orders", (2, 0), &east_agent).await?;
    write_rows(&connect(primary, &credentials).await?, 0..20, true).await?;

    // The source's passwords: west's data will be a copy of east's.
    for name in ["orders-instance", "orders-app"] {
        let source = Api::<Secret>::namespaced(east.clone(), ns)
            .get(name)
            .await?;
        let copy = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                labels: source.metadata.labels.clone(),
                ..Default::default()
            },
            data: source.data.clone(),
            type_: source.type_.clone(),
            ..Default::default()
        };
        Api::<Secret>::namespaced(west.clone(), ns)
            .create(&PostParams::default(), &copy)
            .await?;
    }
    // East publishes where other clusters reach its primary: the outside address.
    let source_host = outside(primary)?.to_string();
    let east_api: Api<MyDatabase> = Api::namespaced(east.clone(), ns);
    wait_for(
        "east's status.endpoint names its primary's outside address",
        Duration::from_secs(30),
        || {
            let (api, expected) = (east_api.clone(), source_host.clone());
            async move {
                let endpoint = api
                    .get("orders")
                    .await
                    .ok()
                    .and_then(|d| d.status?.endpoint);
                match endpoint {
                    Some(e) if e.host == expected && e.port == 5432 => Check::Done(()),
                    other => Check::Waiting(format!("{other:?}")),
                }
            }
        },
    )
    .await?;
    let replica: MyDatabase = serde_json::from_value(serde_json::json!({
        "apiVersion": "example.com/v1", "kind": "MyDatabase",
        "metadata": {"name": "orders"},
        "spec": {"replicas": 2, "version": "15", "storage": {"size": "1Gi"},
                 "topology": {"replicaOf": {"host": source_host, "port": 5432}}}
    }))?;
    let west_api: Api<MyDatabase> = Api::namespaced(west.clone(), ns);
    west_api.create(&PostParams::default(), &replica).await?;
    let copied = wait_rows_everywhere(&west, ns, "orders-r", &credentials, 20, 2)
        .await
        .with_context(|| format!("west's agent log:\n{}", west_agent.log_tail()))?;
    eprintln!("replica cluster copied and streaming {copied:?} after its creation");
    assert!(
        endpoints(&west, ns, "orders-rw").await?.is_empty(),
        "a replica cluster's -rw has no endpoints"
    );
    for type_ in ["ReadOnly", "PrimaryAvailable"] {
        let reason = wait_for(
            &format!("west's {type_} condition"),
            Duration::from_secs(30),
            || {
                let api = west_api.clone();
                async move {
                    match condition_reason(&api, "orders", type_).await {
                        Some(r) if r == "ReplicaCluster" => Check::Done(r),
                        other => Check::Waiting(format!("{other:?}")),
                    }
                }
            },
        )
        .await?;
        assert_eq!(reason, "ReplicaCluster");
    }
    let west_instances = endpoints(&west, ns, "orders-r").await?;
    for address in &west_instances {
        let error = connect(*address, &credentials)
            .await?
            .batch_execute(
                "SET default_transaction_read_only = off; INSERT INTO orders VALUES (999)",
            )
            .await
            .expect_err("a replica cluster's instance refuses writes");
        assert_eq!(sqlstate(&error).as_deref(), Some(READ_ONLY), "{error}");
    }

    // Writes on east reach west.
    let writer = connect(primary, &credentials).await?;
    let written = Instant::now();
    write_rows(&writer, 20..30, false).await?;
    let lag = wait_rows_everywhere(&west, ns, "orders-r", &credentials, 30, 2).await?;
    eprintln!(
        "10 writes on east on every west instance {lag:?} after the first ({:?} after the last)",
        written.elapsed()
    );

    // East cut off (its outside addresses, the source's among them): west serves what
    // it has; east, not fenced here, takes writes inside its zone.
    let partition = Partition::start(&lab, "east")?;
    write_rows(&writer, 30..40, false).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for address in &west_instances {
        assert_eq!(
            count(&connect(*address, &credentials).await?).await?,
            30,
            "{address} serves reads through the partition"
        );
    }
    partition.heal()?;
    let healed = Instant::now();
    wait_rows_everywhere(&west, ns, "orders-r", &credentials, 40, 2).await?;
    eprintln!(
        "west caught up with east's writes during the partition {:?} after the heal",
        healed.elapsed()
    );
    Ok(())
}

/// A hub MyDatabase `name` of 2 replicas with `topology`, and a policy placing it 1 + 1 in
/// `clusters`, listed in that order.
async fn place_database(
    federation: &bulkhead_e2e::federation::Federation,
    name: &str,
    clusters: [&str; 2],
    topology: serde_json::Value,
) -> Result<()> {
    use bulkhead_e2e::federation::databases;
    use serde_json::json;
    place_on(federation, name, &clusters).await?;
    federation
        .apply(
            &databases(),
            json!({"apiVersion": "example.com/v1", "kind": "MyDatabase", "metadata": {"name": name},
                   "spec": {"replicas": 2, "version": "16", "storage": {"size": "1Gi"},
                            "topology": topology}}),
        )
        .await?;
    Ok(())
}

/// Applies the policy that places MyDatabase `name` on `clusters`, in that order.
async fn place_on(
    federation: &bulkhead_e2e::federation::Federation,
    name: &str,
    clusters: &[&str],
) -> Result<()> {
    use serde_json::json;
    federation
        .apply(
            &bulkhead_e2e::federation::policies(),
            federation.policy(
                name,
                json!([{"apiVersion": "example.com/v1", "kind": "MyDatabase", "name": name}]),
                json!({"clusterAffinity": {"clusterNames": clusters},
                       "replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted"}}),
                json!({}),
            ),
        )
        .await?;
    Ok(())
}

/// `orders` placed 1 + 1 in west then east as replica clusters (west holds the primary by
/// the policy's order), `rows` rows written through west's primary and replayed in east,
/// and the hub's status naming west primary and east a replica cluster.
/// West's primary and the application's credentials.
async fn orders_streaming_west_to_east(
    federation: &bulkhead_e2e::federation::Federation,
    rows: i32,
) -> Result<(Ipv4Addr, AppCredentials)> {
    let ns = federation.namespace.as_str();
    place_database(
        federation,
        "orders",
        ["west", "east"],
        serde_json::json!({"acrossClusters": "ReplicaClusters"}),
    )
    .await?;
    let hub_log = || format!("hub log: {}", federation.hub_log().display());
    let [west, east] = ["west", "east"].map(|c| federation.members[c].clone());
    let primary = wait_streaming(&west, ns, "orders")
        .await
        .with_context(hub_log)?;
    let credentials = app_credentials(&west, ns, "orders").await?;
    write_rows(&connect(primary, &credentials).await?, 0..rows, true).await?;
    wait_rows_everywhere(&east, ns, "orders-r", &credentials, rows.into(), 1)
        .await
        .with_context(hub_log)?;
    wait_hub_status(
        &federation.api("hub", &bulkhead_e2e::federation::databases()),
        "the hub's status names west primary and east a replica cluster",
        |s| s["primaryCluster"] == "west" && row(s, "east")["role"] == "Replica",
    )
    .await
    .with_context(hub_log)?;
    Ok((primary, credentials))
}

/// The row of `cluster` in a hub template's status (null when it has none).
fn row<'a>(status: &'a serde_json::Value, cluster: &str) -> &'a serde_json::Value {
    status["clusters"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"] == cluster))
        .unwrap_or(&serde_json::Value::Null)
}

/// Waits until the hub template `orders`'s status satisfies `done`; that status.
async fn wait_hub_status(
    template: &Api<kube::api::DynamicObject>,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> Result<serde_json::Value> {
    let done = &done;
    wait_for(what, Duration::from_secs(60), || async move {
        match template.get("orders").await {
            Ok(t) if done(&t.data["status"]) => Check::Done(t.data["status"].clone()),
            Ok(t) => Check::Waiting(t.data["status"].to_string()),
            Err(e) => Check::Waiting(e.to_string()),
        }
    })
    .await
}

/// Sets `spec.topology.primaryCluster` of the hub's `orders` (what a GitOps tool does
/// to ask for a switchover).
async fn ask_primary_cluster(
    template: &Api<kube::api::DynamicObject>,
    cluster: &str,
) -> Result<()> {
    template
        .patch(
            "orders",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"spec": {"topology": {"primaryCluster": cluster}}}),
            ),
        )
        .await?;
    Ok(())
}

/// Every member's fencing Lease carries primary term `term` (or a higher one) for
/// `database` (`namespace/name`).
async fn assert_terms_carried(
    federation: &bulkhead_e2e::federation::Federation,
    database: &str,
    term: u64,
) -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    for (cluster, client) in &federation.members {
        let lease = Api::<Lease>::namespaced(client.clone(), bulkhead::api::SYSTEM_NAMESPACE)
            .get("bulkhead-hub")
            .await?;
        let carried = bulkhead::agent::fence::primary_terms(&lease);
        assert!(
            carried.get(database).is_some_and(|t| *t >= term),
            "{cluster}'s Lease carries {carried:?}, not term {term} of {database}"
        );
    }
    Ok(())
}

/// `bulkhead switchover db/orders --to <to>` against the hub, waiting `timeout` seconds.
fn switchover_cli(
    federation: &bulkhead_e2e::federation::Federation,
    to: &str,
    timeout: u32,
) -> Result<std::process::Output> {
    let kubeconfig = bulkhead_e2e::hub_support::path(&federation.lab.kubeconfig("hub"));
    bulkhead_e2e::hub_support::bulkhead(&[
        "switchover",
        "db/orders",
        "--to",
        to,
        "-n",
        &federation.namespace,
        "--kubeconfig",
        &kubeconfig,
        "--timeout-seconds",
        &timeout.to_string(),
    ])
}

/// `bulkhead promote db/orders --cluster <to>` on the federation's hub, with
/// `--accept-data-loss` when `accept` (then it must succeed).
fn promote_cli(
    federation: &bulkhead_e2e::federation::Federation,
    to: &str,
    accept: bool,
) -> Result<std::process::Output> {
    let kubeconfig = bulkhead_e2e::hub_support::path(&federation.lab.kubeconfig("hub"));
    let mut args = vec![
        "promote",
        "db/orders",
        "--cluster",
        to,
        "-n",
        &federation.namespace,
        "--kubeconfig",
        &kubeconfig,
    ];
    if accept {
        args.push("--accept-data-loss");
    }
    let output = bulkhead_e2e::hub_support::bulkhead(&args)?;
    anyhow::ensure!(
        !accept || output.status.success(),
        "promoting {to} failed: {}; hub log: {}",
        String::from_utf8_lossy(&output.stderr),
        federation.hub_log().display()
    );
    Ok(output)
}

/// The hub makes replica clusters: a template with `acrossClusters: ReplicaClusters`,
/// placed 1 + 1 by a policy that lists west before east. West holds the primary (the
/// policy's order, not the names'); the hub copies west's Secrets to east and applies
/// east's copy streaming from the endpoint west's agent publishes. Writes acknowledged in
/// west reach east; east's `-rw` has no endpoints and its server refuses writes; the hub's
/// status names the primary cluster and each cluster's role and lag. West cut off (from
/// the hub too): its agent fences and its server refuses writes, east serves reads
/// throughout and nothing in it is promoted; after the heal west takes writes again and
/// east has every acknowledged one.
#[tokio::test]
async fn the_hub_makes_the_other_clusters_replica_clusters_of_the_primary_cluster() -> Result<()> {
    use std::collections::BTreeMap;

    use bulkhead_e2e::federation::{Federation, LEASE_DURATION_SECONDS, databases};
    use k8s_openapi::api::core::v1::Secret;
    use serde_json::json;

    let federation = Federation::start_with_databases("pg-fedrep", &[]).await?;
    let ns = federation.namespace.as_str();
    let created = Instant::now();
    let (primary, credentials) = orders_streaming_west_to_east(&federation, 20).await?;
    let west = federation.members["west"].clone();
    let east = federation.members["east"].clone();
    let hub_log = || format!("hub log: {}", federation.hub_log().display());
    eprintln!(
        "east's replica cluster streaming west's rows {:?} after the template was created",
        created.elapsed()
    );

    // What the hub set up: the primary cluster recorded on both copies, east streaming
    // from west's outside address, west's Secrets in east.
    let source = outside(primary)?.to_string();
    for cluster in ["west", "east"] {
        let copy = federation.api(cluster, &databases()).get("orders").await?;
        assert_eq!(
            copy.metadata
                .annotations
                .unwrap_or_default()
                .get(bulkhead::api::ANNOTATION_PRIMARY_CLUSTER)
                .map(String::as_str),
            Some("west"),
            "{cluster}'s copy records the primary cluster"
        );
        let replica_of = &copy.data["spec"]["topology"]["replicaOf"];
        if cluster == "east" {
            assert_eq!(replica_of, &json!({"host": source, "port": 5432}));
        } else {
            assert!(
                replica_of.is_null(),
                "the primary cluster streams from nowhere"
            );
        }
    }
    for name in ["orders-instance", "orders-app"] {
        let [from, to] = [&west, &east].map(|c| Api::<Secret>::namespaced(c.clone(), ns));
        assert_eq!(
            from.get(name).await?.data,
            to.get(name).await?.data,
            "{name}"
        );
    }
    assert!(
        endpoints(&east, ns, "orders-rw").await?.is_empty(),
        "a replica cluster's -rw has no endpoints"
    );
    let east_instance = endpoints(&east, ns, "orders-r").await?[0];
    let error = connect(east_instance, &credentials)
        .await?
        .batch_execute("SET default_transaction_read_only = off; INSERT INTO orders VALUES (999)")
        .await
        .expect_err("a replica cluster refuses writes");
    assert_eq!(sqlstate(&error).as_deref(), Some(READ_ONLY), "{error}");

    // The hub's status: the primary cluster, each cluster's role and lag.
    let template = federation.api("hub", &databases());
    let status = wait_hub_status(
        &template,
        "the hub's status names west primary and east a replica with its lag",
        |status| {
            status["primaryCluster"] == "west"
                && row(status, "west")["role"] == "Primary"
                && row(status, "east")["role"] == "Replica"
                && row(status, "east")["lagBytes"].is_u64()
        },
    )
    .await?;
    eprintln!(
        "hub status: primary cluster west, east's lag {} bytes as last reported",
        row(&status, "east")["lagBytes"]
    );
    let read_only = status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "ReadOnly"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(read_only["status"], "False", "{read_only}");

    // West cut off from the hub and from east: its agent fences, its server refuses
    // writes; east serves reads and promotes nothing.
    let partition = Partition::start(&federation.lab, "west")?;
    let cut_at = Instant::now();
    let (refused_at, accepted) = write_until_refused(primary, &credentials, "west").await?;
    eprintln!(
        "the cut-off primary cluster refused writes {:?} after the cut (lease {LEASE_DURATION_SECONDS} s; {accepted} accepted before)",
        refused_at - cut_at
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        count(&connect(east_instance, &credentials).await?).await?,
        20,
        "east serves what it had through the partition"
    );
    assert!(
        endpoints(&east, ns, "orders-rw").await?.is_empty(),
        "nothing in east was promoted"
    );
    let east_copy = federation.api("east", &databases()).get("orders").await?;
    assert!(
        east_copy.data["status"]["instances"]
            .as_array()
            .is_some_and(|instances| instances.iter().all(|i| i["role"] != "Primary")),
        "no instance of east runs as a primary: {}",
        east_copy.data["status"]
    );

    // Healed: west takes writes again, and east has every acknowledged one.
    partition.heal()?;
    let healed_at = Instant::now();
    let primary = wait_streaming(&west, ns, "orders").await?;
    write_rows(&connect(primary, &credentials).await?, 20..30, false).await?;
    eprintln!(
        "west writable again {:?} after the heal",
        healed_at.elapsed()
    );
    let rows = 30 + accepted;
    wait_rows_everywhere(&east, ns, "orders-r", &credentials, rows, 1).await?;
    eprintln!(
        "east caught up ({rows} rows) {:?} after the heal",
        healed_at.elapsed()
    );

    // A planned switchover to east (the GitOps field `bulkhead switchover` sets): a probe
    // writes to every instance of both clusters all along. West refuses writes before
    // east takes any, east has every write west acknowledged, and west then follows east.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probes: Vec<_> = [
        ("west", west.clone(), 100_000),
        ("east", east.clone(), 200_000),
    ]
    .into_iter()
    .map(|(cluster, client, first)| {
        let (stop, credentials, ns) = (stop.clone(), credentials.clone(), ns.to_string());
        tokio::spawn(async move {
            // (id, when the write was sent, when it was acknowledged)
            let mut acks: Vec<(i32, Instant, Instant)> = vec![];
            let mut id = first;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for address in endpoints(&client, &ns, "orders-r")
                    .await
                    .unwrap_or_default()
                {
                    id += 1;
                    let sent = Instant::now();
                    let Ok(Ok(session)) = tokio::time::timeout(
                        Duration::from_secs(1),
                        connect(address, &credentials),
                    )
                    .await
                    else {
                        continue;
                    };
                    if let Ok(Ok(_)) = tokio::time::timeout(
                        Duration::from_secs(2),
                        session.execute("INSERT INTO orders VALUES ($1)", &[&id]),
                    )
                    .await
                    {
                        acks.push((id, sent, Instant::now()));
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (cluster, acks)
        })
    })
    .collect();
    // West's copy as its agent reports it, all along: once every member holds the term
    // the switchover raised, west's copy (written under the old one) is deposed until
    // the hub writes it anew as a replica cluster of east.
    let west_reasons = {
        let (stop, copies) = (stop.clone(), federation.api("west", &databases()));
        tokio::spawn(async move {
            let mut reasons: Vec<String> = vec![];
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(copy) = copies.get("orders").await {
                    let reason = copy.data["status"]["conditions"]
                        .as_array()
                        .and_then(|c| c.iter().find(|c| c["type"] == "ReadOnly"))
                        .map(|c| format!("{}/{}", c["status"], c["reason"]))
                        .unwrap_or_default();
                    if reasons.last() != Some(&reason) {
                        reasons.push(reason);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            reasons
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let asked = Instant::now();
    ask_primary_cluster(&template, "east").await?;
    let cli = |to: &str| switchover_cli(&federation, to, 120);
    wait_for(
        "the hub records east as the primary cluster",
        Duration::from_secs(120),
        || {
            let template = template.clone();
            async move {
                match template.get("orders").await {
                    Ok(t) if t.data["status"]["primaryCluster"] == "east" => Check::Done(()),
                    Ok(t) => Check::Waiting(t.data["status"].to_string()),
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await
    .with_context(hub_log)?;
    let recorded = asked.elapsed();
    let new_primary = wait_streaming(&east, ns, "orders").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let west_reasons = west_reasons.await?;
    // The term: raised for this switchover and recorded, carried by every member's Lease.
    let status = template.get("orders").await?.data["status"].clone();
    assert_eq!(status["primaryTerm"], 2, "{status}");
    assert_eq!(
        (
            &status["switchover"]["from"],
            &status["switchover"]["to"],
            &status["switchover"]["term"]
        ),
        (&json!("west"), &json!("east"), &json!(2)),
        "{status}"
    );
    assert_terms_carried(&federation, &format!("{ns}/orders"), 2).await?;
    assert!(
        west_reasons.iter().any(|r| r == "\"True\"/\"Deposed\""),
        "west's copy was deposed once every member held the raised term: {west_reasons:?}"
    );
    eprintln!("west's ReadOnly reasons through the switchover: {west_reasons:?}");
    let mut acks = BTreeMap::new();
    for probe in probes {
        let (cluster, acked) = probe.await?;
        acks.insert(cluster, acked);
    }
    let first_east = acks["east"]
        .iter()
        .map(|(_, _, acked)| *acked)
        .min()
        .context("east took no write after the switchover")?;
    let last_west = acks["west"]
        .iter()
        .map(|(_, _, acked)| *acked)
        .max()
        .context("west took no write before the switchover")?;
    for (id, sent, _) in &acks["west"] {
        assert!(
            *sent < first_east,
            "west accepted write {id}, sent after east had acknowledged one: two primaries"
        );
    }
    eprintln!(
        "switchover west -> east: recorded {recorded:?} after the ask; no writable primary for {:?} (west's last acknowledged write to east's first); {} writes acknowledged by west, {} by east",
        first_east.saturating_duration_since(last_west),
        acks["west"].len(),
        acks["east"].len()
    );
    let acknowledged: Vec<i32> = acks.values().flatten().map(|(id, _, _)| *id).collect();
    let (rows, lost) = rows_and_lost(new_primary, &credentials, &acknowledged).await?;
    assert!(
        lost.is_empty(),
        "acknowledged writes lost by the switchover: {lost:?}"
    );
    let total = rows.len() as i64;
    wait_rows_everywhere(&west, ns, "orders-r", &credentials, total, 1)
        .await
        .with_context(hub_log)?;
    assert!(
        endpoints(&west, ns, "orders-rw").await?.is_empty(),
        "west, now a replica cluster, has no -rw endpoints"
    );
    eprintln!("west follows east: it has all {total} rows");

    // The CLI: a switchover it refuses says why; then back to west.
    wait_hub_status(
        &template,
        "the hub's status shows west as a replica cluster",
        |s| row(s, "west")["role"] == "Replica",
    )
    .await?;
    let refused = cli("north")?;
    assert!(
        !refused.status.success(),
        "a switchover to an unplaced cluster is refused"
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("north is not in the placement"),
        "the refusal says why"
    );
    let back = Instant::now();
    let moved = cli("west")?;
    if !moved.status.success() {
        // What each copy reported, for the failure report: the stage the hub waits in
        // is read from these.
        let mut statuses = String::new();
        for cluster in ["east", "west"] {
            let copy = federation.api(cluster, &databases()).get("orders").await?;
            statuses.push_str(&format!(
                "\n{cluster}: annotations {:?}\n  status {}",
                copy.metadata.annotations.unwrap_or_default(),
                copy.data["status"]
            ));
        }
        panic!(
            "bulkhead switchover --to west failed; {}{statuses}",
            hub_log()
        );
    }
    eprintln!(
        "switched back to west with `bulkhead switchover` in {:?}",
        back.elapsed()
    );
    let primary = wait_streaming(&west, ns, "orders").await?;
    let (_, lost) = rows_and_lost(primary, &credentials, &acknowledged).await?;
    assert!(
        lost.is_empty(),
        "acknowledged writes lost switching back: {lost:?}"
    );
    assert_eq!(
        template.get("orders").await?.data["status"]["primaryTerm"],
        3,
        "each switchover raises a term of its own"
    );
    assert_terms_carried(&federation, &format!("{ns}/orders"), 3).await?;

    // A cluster that holds the Secrets of a database of its own is never overwritten:
    // its copy waits, and the binding says why and what to do.
    let north = federation.members["north"].clone();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(north.clone());
    if namespaces.get_opt(ns).await?.is_none() {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
            )
            .await?;
    }
    let north_secrets = Api::<Secret>::namespaced(north.clone(), ns);
    north_secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "ledger-instance"},
                "stringData": {"superuser-password": "north's own", "replication-password": "north's own",
                               "token": "north's own"}}))?,
        )
        .await?;
    let before = north_secrets.get("ledger-instance").await?.data;
    place_database(
        &federation,
        "ledger",
        ["west", "north"],
        json!({"primaryCluster": "west"}),
    )
    .await?;
    let binding = federation
        .wait_row(
            "ledger-mydatabase",
            "north",
            "says it holds other passwords",
            Duration::from_secs(120),
            |row| {
                row.message
                    .as_deref()
                    .is_some_and(|m| m.contains("already holds the Secret"))
            },
        )
        .await
        .with_context(hub_log)?;
    eprintln!(
        "north's row: {}",
        binding
            .status
            .unwrap_or_default()
            .clusters
            .iter()
            .find(|r| r.name == "north")
            .and_then(|r| r.message.clone())
            .unwrap_or_default()
    );
    assert_eq!(
        north_secrets.get("ledger-instance").await?.data,
        before,
        "north's own Secret is left as it was"
    );
    assert!(
        federation
            .api("north", &databases())
            .get_opt("ledger")
            .await?
            .is_none(),
        "north gets no copy that would stream with the wrong passwords"
    );
    Ok(())
}

/// A switchover among three clusters: `orders` 1 + 1 + 1 over west (primary cluster, first
/// in the policy), east and north. `bulkhead switchover --to east` promotes east; north,
/// a replica cluster of west throughout, then follows east (a new upstream on east's new
/// timeline) and so does west: every write acknowledged before and after the switchover is
/// in every cluster, and only east's `-rw` has endpoints.
#[tokio::test]
async fn a_switchover_among_three_clusters_makes_every_other_cluster_follow_the_new_primary()
-> Result<()> {
    use bulkhead_e2e::federation::{Federation, databases};
    use serde_json::json;

    let federation = Federation::start_with_databases("pg-sw3", &[]).await?;
    let ns = federation.namespace.as_str();
    place_on(&federation, "orders", &["west", "east", "north"]).await?;
    federation
        .apply(
            &databases(),
            json!({"apiVersion": "example.com/v1", "kind": "MyDatabase", "metadata": {"name": "orders"},
                   "spec": {"replicas": 3, "version": "16", "storage": {"size": "1Gi"},
                            "topology": {"acrossClusters": "ReplicaClusters"}}}),
        )
        .await?;
    let hub_log = || format!("hub log: {}", federation.hub_log().display());
    let [west, east, north] = ["west", "east", "north"].map(|c| federation.members[c].clone());
    let primary = wait_streaming(&west, ns, "orders")
        .await
        .with_context(hub_log)?;
    let credentials = app_credentials(&west, ns, "orders").await?;
    write_rows(&connect(primary, &credentials).await?, 0..10, true).await?;
    for cluster in [&east, &north] {
        wait_rows_everywhere(cluster, ns, "orders-r", &credentials, 10, 1)
            .await
            .with_context(hub_log)?;
    }
    let template = federation.api("hub", &databases());
    wait_hub_status(
        &template,
        "east and north run as replica clusters of west",
        |s| {
            s["primaryCluster"] == "west"
                && row(s, "east")["role"] == "Replica"
                && row(s, "north")["role"] == "Replica"
        },
    )
    .await
    .with_context(hub_log)?;

    let asked = Instant::now();
    let switched = switchover_cli(&federation, "east", 120)?;
    assert!(
        switched.status.success(),
        "the switchover goes through: {}; {}",
        String::from_utf8_lossy(&switched.stderr),
        hub_log()
    );
    eprintln!(
        "switchover west -> east among three clusters: {:?}",
        asked.elapsed()
    );
    let status = template.get("orders").await?.data["status"].clone();
    assert_eq!(status["primaryCluster"], "east", "{status}");
    assert_eq!(status["primaryTerm"], 2, "{status}");
    let new_primary = wait_streaming(&east, ns, "orders")
        .await
        .with_context(hub_log)?;
    write_rows(&connect(new_primary, &credentials).await?, 10..20, false).await?;
    let (_, lost) = rows_and_lost(new_primary, &credentials, &(0..20).collect::<Vec<_>>()).await?;
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    for (name, cluster) in [("north", &north), ("west", &west)] {
        let took = wait_rows_everywhere(cluster, ns, "orders-r", &credentials, 20, 1)
            .await
            .with_context(hub_log)?;
        eprintln!("{name} follows east: every row there {took:?} after the check began");
        assert!(
            endpoints(cluster, ns, "orders-rw").await?.is_empty(),
            "{name}, a replica cluster of east, has no -rw endpoints"
        );
    }
    wait_hub_status(
        &template,
        "west and north run as replica clusters of east",
        |s| row(s, "west")["role"] == "Replica" && row(s, "north")["role"] == "Replica",
    )
    .await
    .with_context(hub_log)?;
    Ok(())
}

/// A hub killed in the middle of a switchover, right after it raised the primary term,
/// and away longer than the fencing lease (every agent fences meanwhile): the restarted
/// hub picks the switchover up from the copies and the template's status, raises no second
/// term, promotes east once every member holds the raised one, and nothing acknowledged is
/// lost; west follows east.
#[tokio::test]
async fn a_hub_killed_in_the_middle_of_a_switchover_finishes_it_under_the_same_term() -> Result<()>
{
    use bulkhead_e2e::federation::{Federation, LEASE_DURATION_SECONDS, databases};

    let mut federation = Federation::start_with_databases("pg-swkill", &[]).await?;
    let ns = federation.namespace.clone();
    let (primary, credentials) = orders_streaming_west_to_east(&federation, 10).await?;
    write_rows(&connect(primary, &credentials).await?, 10..20, false).await?;
    let [west, east] = ["west", "east"].map(|c| federation.members[c].clone());
    let template = federation.api("hub", &databases());
    let asked = Instant::now();
    ask_primary_cluster(&template, "east").await?;
    wait_hub_status(
        &template,
        "the hub raises the primary term for the switchover",
        |s| s["switchover"]["term"] == 2,
    )
    .await?;
    federation.kill_hub();
    let east_copy = federation.api("east", &databases()).get("orders").await?;
    let told_to_promote = east_copy
        .metadata
        .annotations
        .unwrap_or_default()
        .contains_key(bulkhead::api::ANNOTATION_SWITCHOVER_PROMOTED);
    eprintln!(
        "hub killed {:?} after the ask, once the term was raised (east told to promote: {told_to_promote})",
        asked.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(LEASE_DURATION_SECONDS + 2)).await;
    federation.start_hub()?;
    let restarted = Instant::now();
    let hub_log = || format!("hub log: {}", federation.hub_log().display());
    let status = wait_hub_status(
        &template,
        "the restarted hub records east as the primary cluster",
        |s| s["primaryCluster"] == "east",
    )
    .await
    .with_context(hub_log)?;
    eprintln!(
        "the restarted hub finished the switchover {:?} after it started",
        restarted.elapsed()
    );
    assert_eq!(status["primaryTerm"], 2, "no second term: {status}");
    assert_eq!(status["switchover"]["term"], 2, "{status}");
    assert_terms_carried(&federation, &format!("{ns}/orders"), 2).await?;
    let new_primary = wait_streaming(&east, &ns, "orders")
        .await
        .with_context(hub_log)?;
    write_rows(&connect(new_primary, &credentials).await?, 20..30, false).await?;
    let (_, lost) = rows_and_lost(new_primary, &credentials, &(0..30).collect::<Vec<_>>()).await?;
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    wait_rows_everywhere(&west, &ns, "orders-r", &credentials, 30, 1)
        .await
        .with_context(hub_log)?;
    assert!(
        endpoints(&west, &ns, "orders-rw").await?.is_empty(),
        "west, now a replica cluster, has no -rw endpoints"
    );
    Ok(())
}

/// The hub records east as the primary cluster under term 2 (one raise, no abort); east
/// takes 10 more rows after the `rows` written through west, has every one of them, and
/// west, following east, has them too.
async fn east_recorded_under_term_2_with_every_write(
    federation: &bulkhead_e2e::federation::Federation,
    credentials: &AppCredentials,
    rows: i32,
) -> Result<()> {
    let ns = federation.namespace.as_str();
    let template = federation.api("hub", &bulkhead_e2e::federation::databases());
    let status = wait_hub_status(
        &template,
        "the hub records east as the primary cluster",
        |s| s["primaryCluster"] == "east",
    )
    .await?;
    assert_eq!(status["primaryTerm"], 2, "one raise: {status}");
    assert!(status["abortedSwitchover"].is_null(), "{status}");
    let new_primary = wait_streaming(&federation.members["east"], ns, "orders").await?;
    write_rows(
        &connect(new_primary, credentials).await?,
        rows..rows + 10,
        false,
    )
    .await?;
    let all: Vec<i32> = (0..rows + 10).collect();
    let (_, lost) = rows_and_lost(new_primary, credentials, &all).await?;
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    wait_rows_everywhere(
        &federation.members["west"],
        ns,
        "orders-r",
        credentials,
        (rows + 10).into(),
        1,
    )
    .await?;
    Ok(())
}

/// West's API server audit log: every hub write of west's copy of `orders`, from the
/// first that demoted it for a switchover to east, left it read-only and marked with that
/// same start, or following east (a replica cluster of it): never writable.
fn west_never_written_writable_since_demoted(
    federation: &bulkhead_e2e::federation::Federation,
    ns: &str,
) -> Result<()> {
    use bulkhead_e2e::chaos::audit::read_cluster;
    use bulkhead_e2e::lab::HUB_USER_IN_MEMBERS;

    let (records, _) = read_cluster("west", &federation.lab.log_dir("west"))?;
    let writes: Vec<_> = records
        .iter()
        .filter(|r| {
            r.event.user.username == HUB_USER_IN_MEMBERS
                && r.event.succeeded()
                && r.event.object_ref.as_ref().is_some_and(|o| {
                    o.resource == "mydatabases"
                        && o.namespace == ns
                        && o.name == "orders"
                        && o.subresource.is_empty()
                })
        })
        .filter_map(|r| Some((r, r.event.response_object.as_ref()?)))
        .skip_while(|(_, object)| {
            object["metadata"]["annotations"][bulkhead::api::ANNOTATION_SWITCHOVER_TO] != "east"
        })
        .collect();
    assert!(
        !writes.is_empty(),
        "west's audit log holds the hub's writes of orders"
    );
    let started =
        &writes[0].1["metadata"]["annotations"][bulkhead::api::ANNOTATION_SWITCHOVER_STARTED];
    for (record, object) in &writes {
        let follows_east = !object["spec"]["topology"]["replicaOf"].is_null();
        let demoted = object["spec"]["readOnly"] == true
            && object["metadata"]["annotations"][bulkhead::api::ANNOTATION_SWITCHOVER_STARTED]
                == *started;
        assert!(
            follows_east || demoted,
            "the hub wrote west's copy neither demoted (started {started}) nor following east: {}",
            record.line
        );
    }
    eprintln!(
        "{} hub writes of west's copy since it was demoted: each read-only with the same start, or following east",
        writes.len()
    );
    Ok(())
}

/// A hub killed while the switchover is still demoting the old primary cluster (before
/// the term is raised), restarted at once while west is cut off from it too, so that it
/// starts without west's copies listed: it decides nothing about west's copy (or east's)
/// from a stage computed without them, so it never writes west's copy writable and
/// unmarked; once west is back it resumes the same switchover (the same start, so the
/// same deadline) and finishes it under term 2. East cannot catch up while west's
/// database pods are cut off, which holds the switchover before the raise across the
/// restart. Checked in west's API server audit log: every hub write of west's copy from
/// the first that demoted it leaves it read-only and marked with the same start, or
/// following east.
#[tokio::test]
async fn a_hub_killed_while_the_old_primary_is_demoted_never_writes_it_writable_again() -> Result<()>
{
    use bulkhead_e2e::federation::{Federation, databases};

    let mut federation = Federation::start_with_databases("pg-swdemote", &[]).await?;
    let ns = federation.namespace.clone();
    let (_, credentials) = orders_streaming_west_to_east(&federation, 10).await?;
    let west_copies = federation.api("west", &databases());
    let template = federation.api("hub", &databases());
    federation.lab.cut_database_pods("west")?;
    ask_primary_cluster(&template, "east").await?;
    let marked = |copy: &kube::api::DynamicObject| {
        copy.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(bulkhead::api::ANNOTATION_SWITCHOVER_TO))
            .is_some_and(|to| to == "east")
    };
    wait_for(
        "west's copy demoted for the switchover",
        Duration::from_secs(60),
        || {
            let west_copies = west_copies.clone();
            async move {
                match west_copies.get("orders").await {
                    Ok(copy) if marked(&copy) => Check::Done(()),
                    Ok(copy) => Check::Waiting(format!("{:?}", copy.metadata.annotations)),
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await?;
    federation.kill_hub();
    let status = template.get("orders").await?.data["status"].clone();
    assert!(
        status["switchover"].is_null() && status["primaryTerm"].as_u64().unwrap_or(1) == 1,
        "killed before the raise: {status}"
    );
    federation.lab.partition("west")?;
    federation.start_hub()?;
    let hub_log = || format!("hub log: {}", federation.hub_log().display());
    // The restarted hub leads and reconciles `orders` without west's copies, then lists
    // them once west is back, while east still cannot catch up.
    tokio::time::sleep(Duration::from_secs(8)).await;
    federation.lab.heal("west")?;
    east_recorded_under_term_2_with_every_write(&federation, &credentials, 10)
        .await
        .with_context(hub_log)?;

    west_never_written_writable_since_demoted(&federation, &ns)?;
    Ok(())
}

/// A hub killed the moment it recorded that east is told to promote
/// (`status.switchover.promoting`, written before it tells east), and restarted while east
/// is cut off from it and from west for longer than the switchover deadline (the hub runs
/// with `--switchover-deadline 15s`). The restarted hub cannot see east's copy, which may
/// run a primary already: it never gives the switchover up (west taking writes again would
/// be a second primary), keeps west's copy read-only and marked, and records east once it
/// is back, nothing acknowledged lost.
#[tokio::test]
async fn a_hub_restarted_without_sight_of_the_cluster_told_to_promote_never_gives_the_switchover_up()
-> Result<()> {
    use bulkhead_e2e::federation::{Federation, databases};

    let mut federation =
        Federation::start_with_databases("pg-swtold", &["--switchover-deadline", "15s"]).await?;
    let ns = federation.namespace.clone();
    let (_, credentials) = orders_streaming_west_to_east(&federation, 10).await?;
    let template = federation.api("hub", &databases());
    ask_primary_cluster(&template, "east").await?;
    let asked = Instant::now();
    let recorded = loop {
        let status = template.get("orders").await?.data["status"].clone();
        if status["switchover"]["promoting"]
            .as_str()
            .is_some_and(|p| !p.is_empty())
        {
            break status;
        }
        anyhow::ensure!(
            asked.elapsed() < Duration::from_secs(60),
            "the hub never recorded that east is told to promote: {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    federation.kill_hub();
    federation.lab.partition("east")?;
    eprintln!(
        "hub killed {:?} after the ask, once it recorded east told to promote ({}); east cut off",
        asked.elapsed(),
        recorded["switchover"]
    );
    federation.start_hub()?;
    let hub_log = || format!("hub log: {}", federation.hub_log().display());
    tokio::time::sleep(Duration::from_secs(25)).await;
    let status = template.get("orders").await?.data["status"].clone();
    assert!(
        status["abortedSwitchover"].is_null() && status["primaryCluster"] == "west",
        "past the deadline without sight of east: not given up, east not recorded yet: {status}; {}",
        hub_log()
    );
    let west_copy = federation.api("west", &databases()).get("orders").await?;
    assert_eq!(
        west_copy.data["spec"]["readOnly"], true,
        "west's copy stays read-only"
    );
    federation.lab.heal("east")?;
    east_recorded_under_term_2_with_every_write(&federation, &credentials, 10)
        .await
        .with_context(hub_log)?;
    west_never_written_writable_since_demoted(&federation, &ns)?;
    Ok(())
}

/// A switchover whose target is lost after it was told to promote, taken back by a
/// disaster promotion. `orders` runs west (primary) + east (replica cluster); the
/// switchover to east is asked and, the moment the hub has written east's copy told to
/// promote, the hub is killed and east cut off (from the hub and the other clusters).
/// East promotes there (a new timeline after west's) and fences once the hub's lease
/// is stale; the restarted hub keeps west read-only, since east may run a primary.
/// `bulkhead promote --cluster west` refuses without `--accept-data-loss`; with it the hub
/// records west as the primary cluster again under primary term 3 and west, which has
/// every write it acknowledged, takes writes. After the heal a probe writes to every east
/// instance all along: east never accepts one, rejoins as a replica cluster of west (its
/// data, on a timeline of the same number as west's new one, copied anew: pg_rewind
/// cannot compare the two) and has every row west took.
#[tokio::test]
async fn a_switchover_whose_promoted_target_is_lost_is_taken_back_by_a_promotion() -> Result<()> {
    use bulkhead_e2e::federation::{Federation, databases};

    let mut federation =
        Federation::start_with_databases("pg-swlost", &["--switchover-deadline", "15s"]).await?;
    let ns = federation.namespace.clone();
    let (_, credentials) = orders_streaming_west_to_east(&federation, 10).await?;
    let [west, east] = ["west", "east"].map(|c| federation.members[c].clone());
    let east_instances = endpoints(&east, &ns, "orders-r").await?;
    let east_pod = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(east.clone(), &ns)
        .get("orders-0")
        .await?;
    let template = federation.api("hub", &databases());
    let east_copies = federation.api("east", &databases());
    ask_primary_cluster(&template, "east").await?;
    let asked = Instant::now();
    loop {
        let copy = east_copies.get("orders").await?;
        let told = copy
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(bulkhead::api::ANNOTATION_SWITCHOVER_PROMOTED))
            .is_some_and(|from| from == "west");
        if told {
            break;
        }
        anyhow::ensure!(
            asked.elapsed() < Duration::from_secs(60),
            "the hub never told east to promote: {:?}",
            copy.metadata.annotations
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    federation.kill_hub();
    federation.lab.partition("east")?;
    let status = template.get("orders").await?.data["status"].clone();
    assert_eq!(
        status["primaryCluster"], "west",
        "killed before the switchover was recorded done: {status}"
    );
    eprintln!(
        "hub killed {:?} after the ask, once east's copy was told to promote; east cut off",
        asked.elapsed()
    );
    // East's own API server (from inside its zone) shows its agent promote it.
    let inside = Api::<kube::api::DynamicObject>::namespaced_with(
        federation.lab.inside_client("east").await?,
        &ns,
        &databases(),
    );
    wait_for(
        "east promotes its designated primary, cut off",
        Duration::from_secs(30),
        || {
            let inside = inside.clone();
            async move {
                match inside.get("orders").await {
                    Ok(copy)
                        if copy.data["status"]["instances"]
                            .as_array()
                            .is_some_and(|i| i.iter().any(|i| i["role"] == "Primary")) =>
                    {
                        Check::Done(())
                    }
                    Ok(copy) => Check::Waiting(copy.data["status"]["instances"].to_string()),
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await?;

    federation.start_hub()?;
    let hub_log = || format!("hub log: {}", federation.hub_log().display());
    federation
        .wait_member_ready("east", false, Duration::from_secs(60))
        .await
        .with_context(hub_log)?;
    let promote = |accept: bool| promote_cli(&federation, "west", accept);
    let refused = promote(false)?;
    let said = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(
        !refused.status.success()
            && said.contains("told east to promote")
            && said.contains("--accept-data-loss"),
        "refused without the flag, saying why: {said}"
    );
    let west_copy = federation.api("west", &databases()).get("orders").await?;
    assert_eq!(
        west_copy.data["spec"]["readOnly"], true,
        "west stays read-only while east may run a primary"
    );
    let promoted_at = Instant::now();
    promote(true)?;
    let status = template.get("orders").await?.data["status"].clone();
    assert_eq!(status["primaryCluster"], "west", "{status}");
    assert_eq!(status["primaryTerm"], 3, "{status}");
    assert_eq!(status["promotion"]["from"], "east", "{status}");
    assert!(status["switchover"].is_null(), "{status}");
    let primary = wait_streaming(&west, &ns, "orders")
        .await
        .with_context(hub_log)?;
    write_rows(&connect(primary, &credentials).await?, 10..20, false).await?;
    eprintln!(
        "west takes writes again {:?} after the promotion was asked",
        promoted_at.elapsed()
    );

    let probe = WriteProbe::start(&east, &ns, &credentials, east_instances);
    federation.lab.heal("east")?;
    let healed = Instant::now();
    rejoined_as_a_replica_cluster_taking_no_write(
        &federation,
        "east",
        &credentials,
        20,
        probe,
        healed,
    )
    .await?;
    // Its data was copied, not rewound: the instance's log says why.
    let uid = east_pod.metadata.uid.clone().unwrap_or_default();
    let pod_dir = federation
        .lab
        .root
        .join("east")
        .join("pods")
        .join(&uid[..8.min(uid.len())]);
    let mut logs = String::new();
    for entry in std::fs::read_dir(&pod_dir).with_context(|| pod_dir.display().to_string())? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "log") {
            logs.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
    assert!(
        logs.contains("the histories may have diverged on one timeline number"),
        "east's instance found its timeline west's and copied west's data (logs in {})",
        pod_dir.display()
    );
    Ok(())
}

/// A switchover whose target cannot receive the old primary's WAL is aborted with nothing
/// promoted. West holds the primary of replica clusters west + east; west's database pods
/// are cut off from the other clusters (its API server still reachable: the hub sees both
/// clusters Ready, east's last reported position stands). `bulkhead switchover --to east`
/// starts it: west demotes, east never receives west's last position; past the deadline
/// (the hub runs with `--switchover-deadline 20s`) the hub records
/// `status.abortedSwitchover`, the CLI exits non-zero with it,
/// west takes writes again and east promoted nothing. The same ask is not retried by
/// itself; after the heal, asked anew, it goes through losing no acknowledged write.
#[tokio::test]
async fn a_switchover_whose_target_cannot_catch_up_is_aborted_and_the_old_primary_takes_writes_again()
-> Result<()> {
    use bulkhead_e2e::federation::{Federation, databases};
    use kube::ResourceExt;

    let federation =
        Federation::start_with_databases("pg-abort", &["--switchover-deadline", "20s"]).await?;
    let ns = federation.namespace.as_str();
    let (_, credentials) = orders_streaming_west_to_east(&federation, 10).await?;
    let west = federation.members["west"].clone();
    let east = federation.members["east"].clone();
    let hub_log = || format!("hub log: {}", federation.hub_log().display());
    let template = federation.api("hub", &databases());
    let cli = |to: &str| switchover_cli(&federation, to, 180);
    federation.lab.cut_database_pods("west")?;
    let asked = Instant::now();
    let aborted = cli("east")?;
    let stderr = String::from_utf8_lossy(&aborted.stderr).to_string();
    assert!(
        !aborted.status.success() && stderr.contains("aborted after 20 s, nothing promoted"),
        "the CLI reports the abort: {stderr}"
    );
    eprintln!(
        "switchover to an east that cannot catch up: aborted, the CLI exited {:?} after the ask",
        asked.elapsed()
    );
    let status = template.get("orders").await?.data["status"].clone();
    assert_eq!(status["primaryCluster"], "west", "{status}");
    assert_eq!(status["abortedSwitchover"]["from"], "west", "{status}");
    assert_eq!(status["abortedSwitchover"]["to"], "east", "{status}");

    // West takes writes again; nothing in east was promoted.
    let primary = wait_streaming(&west, ns, "orders")
        .await
        .with_context(hub_log)?;
    write_rows(&connect(primary, &credentials).await?, 10..20, false).await?;
    eprintln!("west writable again {:?} after the ask", asked.elapsed());
    let no_primary_in_east = |copy: &kube::api::DynamicObject| {
        copy.data["status"]["instances"]
            .as_array()
            .is_some_and(|instances| instances.iter().all(|i| i["role"] != "Primary"))
    };
    let east_copy = federation.api("east", &databases()).get("orders").await?;
    assert!(
        no_primary_in_east(&east_copy),
        "nothing in east was promoted: {}",
        east_copy.data["status"]
    );
    assert!(endpoints(&east, ns, "orders-rw").await?.is_empty());

    // Not started again while the field still names east: the row says why.
    federation
        .wait_row(
            "orders-mydatabase",
            "east",
            "says the switchover was aborted",
            Duration::from_secs(60),
            |row| {
                row.message
                    .as_deref()
                    .is_some_and(|m| m.contains("was aborted at"))
            },
        )
        .await
        .with_context(hub_log)?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let west_copy = federation.api("west", &databases()).get("orders").await?;
    assert!(
        !west_copy
            .annotations()
            .contains_key(bulkhead::api::ANNOTATION_SWITCHOVER_TO),
        "the aborted switchover is not started again: {:?}",
        west_copy.annotations()
    );
    write_rows(&connect(primary, &credentials).await?, 20..25, false).await?;

    // Healed and asked anew: it goes through, with every acknowledged write.
    federation.lab.heal("west")?;
    wait_rows_everywhere(&east, ns, "orders-r", &credentials, 25, 1)
        .await
        .with_context(hub_log)?;
    let again = cli("east")?;
    assert!(
        again.status.success(),
        "asked anew after the heal, the switchover goes through: {}; {}",
        String::from_utf8_lossy(&again.stderr),
        hub_log()
    );
    let status = template.get("orders").await?.data["status"].clone();
    assert!(status["abortedSwitchover"].is_null(), "{status}");
    let primary = wait_streaming(&east, ns, "orders").await?;
    let (_, lost) = rows_and_lost(primary, &credentials, &(0..25).collect::<Vec<_>>()).await?;
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    Ok(())
}

/// A placement change that drops the primary cluster moves the primary first
/// (make-before-break at the database level): `orders` runs west (primary) + east
/// (replica cluster), `spec.topology.primaryCluster` unset; the policy is changed to
/// place it in east only. The hub switches the primary over to east (west demoted first,
/// east promoted only once it has west's last WAL position), records it, and only then
/// removes west's copy. Every write acknowledged by west is in east, and east takes
/// writes.
#[tokio::test]
async fn a_placement_that_drops_the_primary_cluster_switches_over_before_removing_it() -> Result<()>
{
    use bulkhead_e2e::federation::{Federation, databases};

    let federation = Federation::start_with_databases("pg-dropprimary", &[]).await?;
    let ns = federation.namespace.as_str();
    let (primary, credentials) = orders_streaming_west_to_east(&federation, 10).await?;
    let east = federation.members["east"].clone();
    let hub_log = || format!("hub log: {}", federation.hub_log().display());
    let template = federation.api("hub", &databases());
    write_rows(&connect(primary, &credentials).await?, 10..20, false).await?;

    let changed = Instant::now();
    place_on(&federation, "orders", &["east"]).await?;
    let west_copies = federation.api("west", &databases());
    wait_for(
        "the hub moves the primary to east, then removes west's copy",
        Duration::from_secs(240),
        || {
            let (template, west_copies) = (template.clone(), west_copies.clone());
            async move {
                let recorded = match template.get("orders").await {
                    Ok(t) => t.data["status"]["primaryCluster"].clone(),
                    Err(e) => return Check::Waiting(e.to_string()),
                };
                let west_copy = match west_copies.get_opt("orders").await {
                    Ok(copy) => copy,
                    Err(e) => return Check::Waiting(e.to_string()),
                };
                match (recorded == "east", west_copy.is_some()) {
                    (true, false) => Check::Done(()),
                    (false, false) => panic!(
                        "west's copy was removed while it held the primary (recorded {recorded})"
                    ),
                    (_, true) => Check::Waiting(format!(
                        "primary cluster {recorded}, west's copy still there"
                    )),
                }
            }
        },
    )
    .await
    .with_context(hub_log)?;
    eprintln!(
        "placement without the primary cluster: primary moved to east and west's copy removed {:?} after the policy change",
        changed.elapsed()
    );
    let new_primary = wait_streaming(&east, ns, "orders").await?;
    write_rows(&connect(new_primary, &credentials).await?, 20..30, false).await?;
    let (_, lost) = rows_and_lost(new_primary, &credentials, &(0..30).collect::<Vec<_>>()).await?;
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    Ok(())
}

/// Writes to the servers at `addresses` and at those `member`'s `orders-r` lists, round
/// after round until stopped (a new session each, `default_transaction_read_only = off`,
/// ids from 300000): a cluster that must not take a write is probed through its heal.
struct WriteProbe {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(usize, Vec<(Ipv4Addr, i32)>)>,
}

impl WriteProbe {
    fn start(
        member: &Client,
        ns: &str,
        credentials: &AppCredentials,
        addresses: Vec<Ipv4Addr>,
    ) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (stopped, credentials, member, ns) = (
            stop.clone(),
            credentials.clone(),
            member.clone(),
            ns.to_string(),
        );
        let task = tokio::spawn(async move {
            let (mut tried, mut accepted) = (0, vec![]);
            let mut id = 300_000;
            while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
                let mut now = addresses.clone();
                now.extend(
                    endpoints(&member, &ns, "orders-r")
                        .await
                        .unwrap_or_default(),
                );
                now.sort();
                now.dedup();
                for address in now {
                    id += 1;
                    let Ok(Ok(session)) = tokio::time::timeout(
                        Duration::from_secs(1),
                        connect(address, &credentials),
                    )
                    .await
                    else {
                        continue;
                    };
                    tried += 1;
                    if let Ok(Ok(_)) = tokio::time::timeout(
                        Duration::from_secs(2),
                        session.batch_execute(&format!(
                            "SET default_transaction_read_only = off; INSERT INTO orders VALUES ({id})"
                        )),
                    )
                    .await
                    {
                        accepted.push((address, id));
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (tried, accepted)
        });
        WriteProbe { stop, task }
    }

    /// Stops it: how many writes it tried, and those accepted.
    async fn stop(self) -> Result<(usize, Vec<(Ipv4Addr, i32)>)> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(self.task.await?)
    }
}

/// After the heal of `cluster`, the old primary of a disaster promotion: the hub's status
/// shows it a replica cluster, it has `rows` rows, `probe` (writing to it from before the
/// heal) had none of its writes accepted, and its `-rw` has no endpoints.
async fn rejoined_as_a_replica_cluster_taking_no_write(
    federation: &bulkhead_e2e::federation::Federation,
    cluster: &str,
    credentials: &AppCredentials,
    rows: i64,
    probe: WriteProbe,
    healed: Instant,
) -> Result<()> {
    let ns = federation.namespace.as_str();
    let member = &federation.members[cluster];
    let hub_log = || format!("hub log: {}", federation.hub_log().display());
    wait_hub_status(
        &federation.api("hub", &bulkhead_e2e::federation::databases()),
        &format!("the hub's status shows {cluster} as a replica cluster"),
        |s| row(s, cluster)["role"] == "Replica",
    )
    .await
    .with_context(hub_log)?;
    wait_rows_everywhere(member, ns, "orders-r", credentials, rows, 1)
        .await
        .with_context(hub_log)?;
    eprintln!(
        "{cluster} rejoined as a replica cluster with all {rows} rows {:?} after the heal",
        healed.elapsed()
    );
    let (tried, accepted) = probe.stop().await?;
    assert!(
        accepted.is_empty(),
        "{cluster} accepted writes after the promotion: {accepted:?}"
    );
    assert!(tried > 0, "the probe reached {cluster}'s instances");
    eprintln!("{cluster} refused all {tried} probe writes from the heal on");
    assert!(endpoints(member, ns, "orders-rw").await?.is_empty());
    Ok(())
}

/// A disaster promotion: `orders` runs west (primary) + east (replica cluster); west is
/// cut off (from the hub and the other clusters) and its agent fences it. `bulkhead
/// promote` refuses without `--accept-data-loss`; with it the hub records east as the
/// primary cluster under primary term 2 and east takes writes. After the heal a probe
/// writes to every west instance all along: west never accepts one (its agent finds the
/// raised term in the hub's Lease before it unfences), rejoins as a replica cluster of
/// east (rewound past what it had not sent) and converges to east's rows.
#[tokio::test]
async fn a_promotion_that_accepts_data_loss_never_lets_the_old_primary_cluster_write_again()
-> Result<()> {
    use bulkhead_e2e::federation::{Federation, databases};

    let federation = Federation::start_with_databases("pg-promote", &[]).await?;
    let ns = federation.namespace.as_str();
    let (old_primary, credentials) = orders_streaming_west_to_east(&federation, 10).await?;
    let [west, east] = ["west", "east"].map(|c| federation.members[c].clone());
    let hub_log = || format!("hub log: {}", federation.hub_log().display());
    let template = federation.api("hub", &databases());
    let west_instances = endpoints(&west, ns, "orders-r").await?;

    let partition = Partition::start(&federation.lab, "west")?;
    let (_, accepted) = write_until_refused(old_primary, &credentials, "west").await?;
    federation
        .wait_member_ready("west", false, Duration::from_secs(60))
        .await?;
    let promote = |accept: bool| promote_cli(&federation, "east", accept);
    let refused = promote(false)?;
    assert!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("--accept-data-loss"),
        "refused without the flag, saying which: {}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let asked = Instant::now();
    promote(true)?;
    let new_primary = wait_streaming(&east, ns, "orders")
        .await
        .with_context(hub_log)?;
    write_rows(&connect(new_primary, &credentials).await?, 100..110, false).await?;
    eprintln!(
        "east promoted with --accept-data-loss: takes writes {:?} after the ask ({accepted} writes west accepted after the cut, before it fenced, may be lost)",
        asked.elapsed()
    );
    let status = template.get("orders").await?.data["status"].clone();
    assert_eq!(status["primaryCluster"], "east", "{status}");
    assert_eq!(status["primaryTerm"], 2, "{status}");
    assert_eq!(status["promotion"]["from"], "west", "{status}");

    // The heal: a probe writes to west's instances (as they were, and as west's -r lists
    // them) from before the heal until west has converged.
    let mut addresses = west_instances.clone();
    addresses.push(old_primary);
    let probe = WriteProbe::start(&west, ns, &credentials, addresses);
    partition.heal()?;
    let healed = Instant::now();
    let rows = count(&connect(new_primary, &credentials).await?).await?;
    rejoined_as_a_replica_cluster_taking_no_write(
        &federation,
        "west",
        &credentials,
        rows,
        probe,
        healed,
    )
    .await?;
    let west_instance = endpoints(&west, ns, "orders-r").await?[0];
    let (_, lost) =
        rows_and_lost(west_instance, &credentials, &(100..110).collect::<Vec<_>>()).await?;
    assert!(lost.is_empty(), "west lacks east's writes: {lost:?}");
    Ok(())
}

/// A scale-down removes replica clusters, never the primary cluster: `orders` has 3
/// replicas over west (the primary cluster, weight 1), east and north (weight 2 each),
/// one each. Scaled to 2, plain Webster would drop west, the lightest; the primary
/// cluster's first replica comes first, so north or east goes and west keeps the primary
/// with every acknowledged write.
#[tokio::test]
async fn a_scale_down_removes_a_replica_cluster_not_the_primary_cluster() -> Result<()> {
    use bulkhead_e2e::federation::{Federation, databases, policies};
    use serde_json::json;

    let federation = Federation::start_with_databases("pg-scaledown", &[]).await?;
    let ns = federation.namespace.as_str();
    let weight = |cluster: &str, weight: i64| json!({"targetCluster": {"clusterNames": [cluster]}, "weight": weight});
    federation
        .apply(
            &policies(),
            federation.policy(
                "orders",
                json!([{"apiVersion": "example.com/v1", "kind": "MyDatabase", "name": "orders"}]),
                json!({"clusterAffinity": {"clusterNames": ["west", "east", "north"]},
                       "replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted",
                           "weightPreference": {"staticWeightList": [
                               weight("west", 1), weight("east", 2), weight("north", 2)]}}}),
                json!({}),
            ),
        )
        .await?;
    federation
        .apply(
            &databases(),
            json!({"apiVersion": "example.com/v1", "kind": "MyDatabase", "metadata": {"name": "orders"},
                   "spec": {"replicas": 3, "version": "16", "storage": {"size": "1Gi"},
                            "topology": {"acrossClusters": "ReplicaClusters", "primaryCluster": "west"}}}),
        )
        .await?;
    let hub_log = || format!("hub log: {}", federation.hub_log().display());
    let west = federation.members["west"].clone();
    let primary = wait_streaming(&west, ns, "orders")
        .await
        .with_context(hub_log)?;
    let credentials = app_credentials(&west, ns, "orders").await?;
    write_rows(&connect(primary, &credentials).await?, 0..10, true).await?;
    let template = federation.api("hub", &databases());
    wait_hub_status(
        &template,
        "east and north run as replica clusters of west",
        |s| {
            s["primaryCluster"] == "west"
                && row(s, "east")["role"] == "Replica"
                && row(s, "north")["role"] == "Replica"
        },
    )
    .await
    .with_context(hub_log)?;

    template
        .patch(
            "orders",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await?;
    let placed = federation
        .wait_binding(
            "orders-mydatabase",
            "2 replicas over two clusters",
            Duration::from_secs(60),
            |b| {
                let placed = bulkhead_e2e::federation::binding_replicas(b);
                (placed.iter().filter(|(_, r)| *r > 0).count() == 2).then_some(placed)
            },
        )
        .await
        .with_context(hub_log)?;
    assert!(
        placed.iter().any(|(c, r)| c == "west" && *r == 1),
        "the primary cluster keeps its replica: {placed:?}"
    );
    let status = template.get("orders").await?.data["status"].clone();
    assert_eq!(status["primaryCluster"], "west", "{status}");
    let primary = wait_streaming(&west, ns, "orders").await?;
    write_rows(&connect(primary, &credentials).await?, 10..20, false).await?;
    let (_, lost) = rows_and_lost(primary, &credentials, &(0..20).collect::<Vec<_>>()).await?;
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    eprintln!("scaled 3 -> 2 with west (weight 1) the primary cluster: {placed:?}");
    Ok(())
}

/// Replica-cluster lag: `orders` over west (primary) and east (replica cluster); west's
/// `pg_stat_replication` row of east's designated primary (application name
/// `bulkhead_replica_cluster`), sampled at rest and under a steady write load on west.
#[tokio::test]
async fn replica_cluster_lag_at_rest_and_under_a_steady_write_load() -> Result<()> {
    use bulkhead_e2e::federation::Federation;

    let federation = Federation::start_with_databases("pg-fedlag", &[]).await?;
    let ns = federation.namespace.as_str();
    let (primary, credentials) = orders_streaming_west_to_east(&federation, 10).await?;
    let west = federation.members["west"].clone();
    let writer = connect(primary, &credentials).await?;
    writer
        .batch_execute("CREATE TABLE load (id bigserial PRIMARY KEY, body text)")
        .await?;
    let observer = connect(primary, &superuser(&west, ns, "orders").await?).await?;
    let external = bulkhead::instance::postgres::EXTERNAL_APPLICATION_NAME;
    let sample = || replication_sample(&observer, Some(external));
    let mut rest = vec![];
    for _ in 0..40 {
        rest.extend(sample().await?);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(!rest.is_empty(), "east streams from west's primary");
    eprintln!("replica cluster east at rest: {}", summary(&rest));
    let (loaded, written, took) = under_steady_load(writer, "load", sample).await?;
    eprintln!(
        "replica cluster east under {:.0} commits/s on west ({written} in {took:?}): {}",
        written as f64 / took.as_secs_f64(),
        summary(&loaded)
    );
    assert!(!loaded.is_empty() && loaded.iter().all(|s| s.0 >= 0));
    Ok(())
}

#[tokio::test]
async fn a_primary_its_agent_cannot_reach_demotes_itself_before_a_standby_takes_a_write()
-> Result<()> {
    // Three instances, asynchronous replication (synchronous: 0): the case where two
    // writers lose acknowledged writes. The primary's instance API (port 8000) is cut
    // off from the agent while PostgreSQL keeps serving its clients.
    let cluster = "east";
    let (lab, namespace, client) = setup(cluster, "pg-api-cut").await?;
    let ns = namespace.name.as_str();
    let agent = agent(&lab, cluster, ns, &["--no-fencing"])?;
    let (primary, credentials) = database_up(&client, ns, "orders", (3, 0), &agent).await?;
    let servers = wait_for(
        "three servers behind -r",
        Duration::from_secs(30),
        || async {
            match endpoints(&client, ns, "orders-r").await {
                Ok(all) if all.len() == 3 => Check::Done(all),
                Ok(other) => Check::Waiting(format!("{other:?}")),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    write_rows(&connect(primary, &credentials).await?, 0..1, true).await?;
    let origin = Instant::now();
    let log = AckLog::start(&servers, &credentials, origin);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cut_at = origin.elapsed();
    lab::firewall::cut_port(cluster, primary, 8000)?;
    let new_primary = wait_for(
        "another instance takes writes",
        Duration::from_secs(60),
        || async {
            match endpoints(&client, ns, "orders-rw").await {
                Ok(rw) if rw.len() == 1 && rw[0] != primary => Check::Done(rw[0]),
                Ok(rw) => Check::Waiting(format!("-rw {rw:?}")),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", agent.log_tail()))?;
    // Writes go on for a while on the new primary, then the cut heals.
    tokio::time::sleep(Duration::from_secs(5)).await;
    lab::firewall::heal(cluster)?;
    wait_streaming(&client, ns, "orders").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let acks = log.stop().await?;
    let old_last = acks
        .iter()
        .filter(|a| a.server == primary)
        .map(|a| a.at)
        .max();
    let new_first = acks
        .iter()
        .filter(|a| a.server != primary)
        .map(|a| a.at)
        .min();
    let beside: Vec<&Ack> = acks
        .iter()
        .filter(|a| a.server == primary && new_first.is_some_and(|first| a.at >= first))
        .collect();
    let ids: Vec<i32> = acks.iter().map(|a| a.id).collect();
    let (_, lost) = rows_and_lost(new_primary, &credentials, &ids).await?;
    eprintln!(
        "instance API cut at {cut_at:?}: the old primary {primary} acknowledged its last write at {old_last:?}, {new_primary} its first at {new_first:?}; {} acknowledged writes checked, {} lost, {} taken beside another primary",
        acks.len(),
        lost.len(),
        beside.len()
    );
    anyhow::ensure!(
        new_first.is_some(),
        "the new primary took no write: {acks:?}"
    );
    anyhow::ensure!(
        beside.is_empty(),
        "the old primary acknowledged writes after the new one took its first: {beside:?}"
    );
    anyhow::ensure!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    Ok(())
}

#[tokio::test]
async fn a_database_created_again_on_its_kept_claims_after_a_switchover_takes_writes_with_every_row()
-> Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    let cluster = "east";
    let (lab, namespace, client) = setup(cluster, "pg-recreate").await?;
    let ns = namespace.name.as_str();
    let agent = agent(&lab, cluster, ns, &["--no-fencing"])?;
    let api: Api<MyDatabase> = Api::namespaced(client.clone(), ns);
    let (primary, credentials) = database_up(&client, ns, "recr", (2, 0), &agent).await?;
    write_rows(&connect(primary, &credentials).await?, 0..20, true).await?;
    // A version upgrade: the standby first, then a switchover (term 2), then the old
    // primary's pod.
    api.patch(
        "recr",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&serde_json::json!({"spec": {"version": "15.2"}})),
    )
    .await?;
    wait_for(
        "the upgrade done: its switchover recorded (term 2), both instances upgraded",
        Duration::from_secs(180),
        || async {
            match api.get("recr").await {
                Ok(db) => {
                    let status = db.status.unwrap_or_default();
                    if status.term >= 2 && status.updated_replicas == Some(2) {
                        Check::Done(())
                    } else {
                        Check::Waiting(format!(
                            "term {}, primary {:?}, updated {:?}",
                            status.term, status.primary, status.updated_replicas
                        ))
                    }
                }
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", agent.log_tail()))?;
    let upgraded = wait_streaming(&client, ns, "recr")
        .await
        .with_context(|| format!("agent log:\n{}", agent.log_tail()))?;
    write_rows(&connect(upgraded, &credentials).await?, 20..30, false).await?;
    let term = api.get("recr").await?.status.unwrap_or_default().term;

    // Deleted (its claims stay: reclaimPolicy Retain) and created again.
    api.delete("recr", &Default::default()).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for(
        "the database and its pods gone",
        Duration::from_secs(90),
        || async {
            let db = api.get_opt("recr").await.ok().flatten();
            let left = pods.list(&Default::default()).await.map(|l| l.items.len());
            match (db, left) {
                (None, Ok(0)) => Check::Done(()),
                (db, left) => Check::Waiting(format!("database {}, pods {left:?}", db.is_some())),
            }
        },
    )
    .await?;
    let mut again = database("recr", 2, 0)?;
    again.spec.version = "15.2".into();
    api.create(&PostParams::default(), &again).await?;
    let primary = wait_streaming(&client, ns, "recr")
        .await
        .with_context(|| format!("agent log:\n{}", agent.log_tail()))?;
    let credentials = app_credentials(&client, ns, "recr").await?;
    let writer = connect(primary, &credentials).await?;
    writer
        .execute("INSERT INTO orders VALUES (30)", &[])
        .await
        .context("the database created again takes a write")?;
    let (rows, lost) = rows_and_lost(primary, &credentials, &(0..31).collect::<Vec<_>>()).await?;
    let status = api.get("recr").await?.status.unwrap_or_default();
    eprintln!(
        "created again on kept claims: term {} (was {term}), primary {:?}, {} rows",
        status.term,
        status.primary,
        rows.len()
    );
    anyhow::ensure!(lost.is_empty(), "rows lost: {lost:?}");
    anyhow::ensure!(
        status.term > term,
        "the term only grows: {} after {term}",
        status.term
    );
    Ok(())
}
