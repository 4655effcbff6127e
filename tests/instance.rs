//! `bulkhead instance` against real PostgreSQL servers (the distribution's package): a
//! primary and a streaming standby, the agent's role changes over the instance API, and
//! what a real client sees. Run as root, PostgreSQL runs as the `postgres` user.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bulkhead::api::instance::{Desired, InstanceStatus, Role, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "agent-token-for-tests";
const SUPERUSER_PASSWORD: &str = "super secret: with 'quotes'";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// One `bulkhead instance` process, killed when dropped.
struct InstanceProcess {
    child: Child,
    api: u16,
    port: u16,
    dir: PathBuf,
}

impl Drop for InstanceProcess {
    fn drop(&mut self) {
        // SIGTERM: the instance stops PostgreSQL with a fast shutdown.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
    }
}

fn running_as_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

fn start(root: &Path, name: &str, agent_lease: &str) -> InstanceProcess {
    let dir = root.join(name);
    let secrets = dir.join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::write(secrets.join("superuser-password"), SUPERUSER_PASSWORD).unwrap();
    std::fs::write(
        secrets.join("replication-password"),
        "replication:pass\\word",
    )
    .unwrap();
    std::fs::write(secrets.join("token"), TOKEN).unwrap();
    if running_as_root() {
        // The data's parent must be reachable by the postgres user.
        for path in [root, dir.as_path()] {
            let mut permissions = std::fs::metadata(path).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
            std::fs::set_permissions(path, permissions).unwrap();
        }
    }
    let api = free_port();
    let port = free_port();
    let log = std::fs::File::create(dir.join("instance.log")).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_bulkhead"));
    command
        .arg("instance")
        .arg("--pgdata")
        .arg(dir.join("data"))
        .arg("--socket-dir")
        .arg(dir.join("socket"))
        .args(["--listen-addresses", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .args(["--api-address", &format!("127.0.0.1:{api}")])
        .arg("--secrets-dir")
        .arg(&secrets)
        .args(["--agent-lease", agent_lease])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    if running_as_root() {
        command.args(["--run-as", "postgres"]);
    }
    InstanceProcess {
        child: command.spawn().unwrap(),
        api,
        port,
        dir,
    }
}

/// One HTTP/1.1 request to an instance's API; (status, body).
async fn http(port: u16, method: &str, path: &str, body: Option<String>) -> (u16, String) {
    // (0, why) while the API does not answer yet.
    let mut stream = match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
        Ok(stream) => stream,
        Err(error) => return (0, error.to_string()),
    };
    let body = body.unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let status = raw[9..12].parse().unwrap();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

async fn status(instance: &InstanceProcess) -> Option<InstanceStatus> {
    let (code, body) = http(instance.api, "GET", "/status", None).await;
    (code == 200).then(|| serde_json::from_str(&body).unwrap())
}

async fn tell(instance: &InstanceProcess, desired: &Desired) -> (u16, String) {
    http(
        instance.api,
        "PUT",
        "/desired",
        Some(serde_json::to_string(desired).unwrap()),
    )
    .await
}

fn primary(term: u64) -> Desired {
    Desired {
        role: Role::Primary,
        term,
        upstream: None,
        reason: "the test's primary".into(),
        name: String::new(),
        standbys: vec![],
        synchronous: 0,
        bootstrap: true,
    }
}

fn standby(term: u64, upstream: Option<&InstanceProcess>) -> Desired {
    Desired {
        role: Role::Standby,
        term,
        upstream: upstream.map(|u| Upstream {
            host: "127.0.0.1".into(),
            port: u.port,
            external: false,
        }),
        reason: "the test's standby".into(),
        name: String::new(),
        standbys: vec![],
        synchronous: 0,
        bootstrap: false,
    }
}

/// A client, or None while the server does not take connections (restarting).
async fn try_client(instance: &InstanceProcess) -> Option<tokio_postgres::Client> {
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(instance.port)
        .user("postgres")
        .password(SUPERUSER_PASSWORD)
        .dbname("postgres")
        .connect_timeout(Duration::from_secs(5));
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.ok()?;
    tokio::spawn(connection);
    Some(client)
}

/// Waits until the instance runs ready as `role`, saying the agent's word again every
/// second as the agent does (so the lease stays fresh).
async fn wait_role(instance: &InstanceProcess, role: Role, keep_telling: Option<&Desired>) {
    let started = Instant::now();
    loop {
        if let Some(desired) = keep_telling {
            tell(instance, desired).await;
        }
        let now = status(instance).await;
        if let Some(s) = &now
            && s.ready
            && s.role == Some(role)
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{} not {role} within 60 s: {now:?}; its log:\n{}",
            instance.dir.display(),
            std::fs::read_to_string(instance.dir.join("instance.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn client(instance: &InstanceProcess) -> tokio_postgres::Client {
    try_client(instance)
        .await
        .expect("PostgreSQL takes connections")
}

fn sqlstate(error: &tokio_postgres::Error) -> Option<String> {
    error.code().map(|c| c.code().to_string())
}

async fn count(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0)
}

/// A primary (term 1) holding table `orders` with rows 1 and 2.
async fn primary_with_two_rows(root: &Path, name: &str) -> InstanceProcess {
    let instance = start(root, name, "60s");
    wait_role(&instance, Role::Primary, Some(&primary(1))).await;
    client(&instance)
        .await
        .batch_execute(
            "CREATE TABLE orders (id int primary key); INSERT INTO orders VALUES (1), (2)",
        )
        .await
        .unwrap();
    instance
}

/// A fresh directory for one test's instances (PostgreSQL must be installed).
fn test_root(prefix: &str) -> PathBuf {
    let Some(_) = bulkhead::instance::postgres::find_bin_dir() else {
        panic!("PostgreSQL is not installed (e2e/setup.sh installs Debian's postgresql)");
    };
    let root = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    root
}

/// The data directories an instance set aside (`<pgdata>.diverged-<time>`).
fn set_aside(instance: &InstanceProcess) -> Vec<String> {
    std::fs::read_dir(&instance.dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains(".diverged-"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_and_a_standby_follow_the_agent_and_the_server_refuses_writes_when_demoted() {
    let root = test_root("bulkhead-instance-test");

    // The first primary: no data until the agent names its role, then initdb.
    let a = start(&root, "a", "60s");
    let started = Instant::now();
    while status(&a).await.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the API never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let waiting = status(&a).await.unwrap();
    assert_eq!(waiting.role, None);
    assert!(
        waiting.message.contains("waiting for the agent"),
        "{waiting:?}"
    );
    let (code, body) = http(a.api, "PUT", "/desired", Some("{}".into())).await;
    assert_eq!(code, 400, "{body}");
    wait_role(&a, Role::Primary, Some(&primary(1))).await;
    assert_eq!(status(&a).await.unwrap().term, 1);

    let writer = client(&a).await;
    writer
        .batch_execute(
            "CREATE TABLE orders (id int primary key); INSERT INTO orders VALUES (1), (2)",
        )
        .await
        .unwrap();

    // A standby from a base backup of the primary; it streams what comes next.
    let b = start(&root, "b", "60s");
    let mut b_standby = standby(1, Some(&a));
    b_standby.name = "b".into();
    wait_role(&b, Role::Standby, Some(&b_standby)).await;
    // The primary keeps a slot for b and waits for it on every commit.
    let mut a_primary = primary(1);
    a_primary.name = "a".into();
    a_primary.standbys = vec!["b".into()];
    a_primary.synchronous = 1;
    tell(&a, &a_primary).await;
    let started = Instant::now();
    loop {
        tell(&b, &b_standby).await;
        tell(&a, &a_primary).await;
        let rows = writer
            .query(
                "SELECT r.sync_state::text FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE r.application_name = 'bulkhead_b' AND s.slot_name = 'bulkhead_b'",
                &[],
            )
            .await
            .unwrap();
        if rows
            .first()
            .is_some_and(|r| r.get::<_, String>(0) == "quorum")
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "b never streamed through its slot as a synchronous standby"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let names: String = writer
        .query_one("SHOW synchronous_standby_names", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(names, "ANY 1 (bulkhead_b)");
    writer
        .batch_execute("INSERT INTO orders VALUES (3)")
        .await
        .unwrap();
    let reader = client(&b).await;
    let started = Instant::now();
    while count(&reader).await != 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the standby never replayed the insert"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let error = reader
        .batch_execute("INSERT INTO orders VALUES (99)")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&error).as_deref(), Some("25006"), "{error}");

    // The agent fences the primary: the server restarts as a hot standby; the open session
    // ends, a new one may read but not write, whatever it sets.
    tell(&a, &standby(1, None)).await;
    wait_role(&a, Role::Standby, None).await;
    assert!(
        writer
            .batch_execute("INSERT INTO orders VALUES (4)")
            .await
            .is_err(),
        "a session opened before the fence cannot write after it"
    );
    let fenced = client(&a).await;
    assert_eq!(count(&fenced).await, 3);
    fenced
        .batch_execute("SET default_transaction_read_only = off")
        .await
        .unwrap();
    let error = fenced
        .batch_execute("INSERT INTO orders VALUES (4)")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&error).as_deref(), Some("25006"), "{error}");

    // Unfenced: promoted again without a restart; every acknowledged write is there.
    wait_role(&a, Role::Primary, Some(&primary(1))).await;
    let writer = client(&a).await;
    writer
        .batch_execute("INSERT INTO orders VALUES (4)")
        .await
        .unwrap();
    assert_eq!(count(&writer).await, 4);

    // A stale word (a lower term) changes nothing.
    let (code, body) = tell(&a, &standby(0, None)).await;
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("older than term 1"), "{body}");
    // Without the agent's token, nothing changes either.
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", a.api))
        .await
        .unwrap();
    let body = serde_json::to_string(&standby(5, None)).unwrap();
    stream
        .write_all(
            format!("PUT /desired HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}", body.len())
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    assert!(raw.starts_with("HTTP/1.1 401"), "{raw}");
    assert_eq!(status(&a).await.unwrap().role, Some(Role::Primary));
    drop(b);
    drop(a);

    // An instance whose agent goes silent past the lease demotes itself.
    let c = start(&root, "c", "3s");
    wait_role(&c, Role::Primary, Some(&primary(2))).await;
    let silent_from = Instant::now();
    wait_role(&c, Role::Standby, None).await;
    let demoted_after = silent_from.elapsed();
    let s = status(&c).await.unwrap();
    assert!(s.agent_lost, "{s:?}");
    assert!(
        demoted_after >= Duration::from_secs(2),
        "demoted {demoted_after:?} after the agent's last word, before the 3 s lease"
    );
    let error = client(&c)
        .await
        .batch_execute("CREATE TABLE t (x int)")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&error).as_deref(), Some("25006"), "{error}");
    drop(c);
    let _ = std::fs::remove_dir_all(&root);
}

/// Two primaries after a partition (the agent promoted a standby under a new term while
/// the old primary, cut off from it, kept writing): told to follow the new one, the old
/// primary rewinds its history to the new primary's (`pg_rewind`) and streams from it;
/// what it wrote after the histories diverged is gone, the new primary's writes are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_primary_that_diverged_rewinds_and_follows_the_new_one() {
    let root = test_root("bulkhead-rewind-test");
    let a = start(&root, "a", "60s");
    wait_role(&a, Role::Primary, Some(&primary(1))).await;
    let on_a = client(&a).await;
    on_a.batch_execute(
        "CREATE TABLE orders (id int primary key); INSERT INTO orders VALUES (1), (2), (3)",
    )
    .await
    .unwrap();
    let b = start(&root, "b", "60s");
    wait_role(&b, Role::Standby, Some(&standby(1, Some(&a)))).await;
    let started = Instant::now();
    while count(&client(&b).await).await != 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "b never replayed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // B promoted under term 2; A, still primary, writes on: the histories diverge.
    wait_role(&b, Role::Primary, Some(&primary(2))).await;
    on_a.batch_execute("INSERT INTO orders VALUES (100)")
        .await
        .unwrap();
    let on_b = client(&b).await;
    on_b.batch_execute("INSERT INTO orders VALUES (200)")
        .await
        .unwrap();

    // A is fenced first (a standby with nothing to follow), then told to follow B:
    // rewound, then streaming.
    wait_role(&a, Role::Standby, Some(&standby(1, None))).await;
    wait_role(&a, Role::Standby, Some(&standby(2, Some(&b)))).await;
    on_b.batch_execute("INSERT INTO orders VALUES (300)")
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        // A restarts for its rewind: no connection for a moment.
        let ids: Vec<i32> = match try_client(&a).await {
            Some(on_a) => match on_a.query("SELECT id FROM orders ORDER BY id", &[]).await {
                Ok(rows) => rows.iter().map(|r| r.get(0)).collect(),
                Err(_) => vec![],
            },
            None => vec![],
        };
        if ids == [1, 2, 3, 200, 300] {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "a holds {ids:?}, not b's history [1, 2, 3, 200, 300]; its log:\n{}",
            std::fs::read_to_string(a.dir.join("instance.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(status(&a).await.unwrap().term, 2);
    // Rewound in place (wal_keep_size kept the WAL back to the common checkpoint), not
    // copied again: no data directory was set aside.
    let aside = set_aside(&a);
    assert!(aside.is_empty(), "re-cloned instead of rewound: {aside:?}");
    drop(a);
    drop(b);
    let _ = std::fs::remove_dir_all(&root);
}

/// A replica cluster (`spec.topology.replicaOf`): its designated primary is a hot standby
/// of another cluster's primary, streamed from without a slot there and under a name the
/// source's own standbys never have (the two clusters' pods have the same names); its own
/// standbys cascade from it through slots it keeps. Writes on the source reach the end of
/// the chain; nothing in the replica cluster takes a write; with the source gone it
/// serves what it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cluster_streams_from_the_source_and_its_standbys_cascade() {
    let root = test_root("bulkhead-replica-test");

    // The source cluster's primary, orders-0 there.
    let source = start(&root, "source", "60s");
    let mut source_primary = primary(1);
    source_primary.name = "orders-0".into();
    wait_role(&source, Role::Primary, Some(&source_primary)).await;
    let writer = client(&source).await;
    writer
        .batch_execute("CREATE TABLE orders (id int primary key); INSERT INTO orders VALUES (1)")
        .await
        .unwrap();

    // The replica cluster: its orders-0 streams from the source, its orders-1 from it.
    let designated = start(&root, "designated", "60s");
    let mut designated_word = standby(1, Some(&source));
    designated_word.name = "orders-0".into();
    designated_word.standbys = vec!["orders-1".into()];
    designated_word.upstream.as_mut().unwrap().external = true;
    wait_role(&designated, Role::Standby, Some(&designated_word)).await;
    let cascaded = start(&root, "cascaded", "60s");
    let mut cascaded_word = standby(1, Some(&designated));
    cascaded_word.name = "orders-1".into();
    let keep_telling = || async {
        tell(&source, &source_primary).await;
        tell(&designated, &designated_word).await;
        tell(&cascaded, &cascaded_word).await;
    };
    let started = Instant::now();
    loop {
        keep_telling().await;
        if status(&cascaded)
            .await
            .is_some_and(|s| s.ready && s.role == Some(Role::Standby))
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the cascading standby never ran; its log:\n{}",
            std::fs::read_to_string(cascaded.dir.join("instance.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    writer
        .batch_execute("INSERT INTO orders VALUES (2), (3)")
        .await
        .unwrap();
    let end = client(&cascaded).await;
    let started = Instant::now();
    loop {
        keep_telling().await;
        if end
            .query_one("SELECT count(*) FROM orders", &[])
            .await
            .is_ok_and(|r| r.get::<_, i64>(0) == 3)
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the source's writes never reached the cascading standby"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // On the source: one sender, under the replica cluster's name, through no slot.
    let rows = writer
        .query(
            "SELECT application_name::text, (SELECT count(*) FROM pg_replication_slots WHERE active) FROM pg_stat_replication",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, String>(0), "bulkhead_replica_cluster");
    assert_eq!(rows[0].get::<_, i64>(1), 0, "no slot held on the source");
    // On the designated primary: orders-1's slot, in use.
    let middle = client(&designated).await;
    let active: bool = middle
        .query_one(
            "SELECT active FROM pg_replication_slots WHERE slot_name = 'bulkhead_orders_1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        active,
        "orders-1 streams through its slot on the designated primary"
    );
    for (who, session) in [("designated", &middle), ("cascaded", &end)] {
        let error = session
            .batch_execute("INSERT INTO orders VALUES (99)")
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&error).as_deref(), Some("25006"), "{who}: {error}");
    }

    // The source gone (its cluster cut off or lost): the replica cluster serves reads.
    drop(writer);
    drop(source);
    for _ in 0..3 {
        tell(&designated, &designated_word).await;
        tell(&cascaded, &cascaded_word).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for who in [&designated, &cascaded] {
        assert_eq!(count(&client(who).await).await, 3);
    }
    drop(end);
    drop(middle);
    drop(cascaded);
    drop(designated);
    let _ = std::fs::remove_dir_all(&root);
}

/// A database made a replica cluster of another one after the fact: its primary (an old
/// primary of other data) is rewound or copied anew, and its standby, which never was a
/// primary, finds that its data is another database's than its upstream's now (their
/// system identifiers differ) and is copied anew too, its old data kept beside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_of_another_database_are_copied_again_when_they_join_a_replica_cluster() {
    let root = test_root("bulkhead-reclone-test");

    // The source, and an unrelated database of two instances.
    let source = primary_with_two_rows(&root, "source").await;
    let other = start(&root, "other", "60s");
    wait_role(&other, Role::Primary, Some(&primary(1))).await;
    client(&other)
        .await
        .batch_execute("CREATE TABLE unrelated (x int)")
        .await
        .unwrap();
    let standby_of_other = start(&root, "standby", "60s");
    let standby_word = standby(1, Some(&other));
    wait_role(&standby_of_other, Role::Standby, Some(&standby_word)).await;

    // The unrelated database becomes a replica cluster of the source.
    let mut designated = standby(1, Some(&source));
    designated.upstream.as_mut().unwrap().external = true;
    let started = Instant::now();
    loop {
        tell(&source, &primary(1)).await;
        tell(&other, &designated).await;
        tell(&standby_of_other, &standby_word).await;
        let copied = match try_client(&standby_of_other).await {
            Some(session) => session
                .query_one("SELECT count(*) FROM orders", &[])
                .await
                .is_ok_and(|r| r.get::<_, i64>(0) == 2),
            None => false,
        };
        if copied {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the standby never held the source's data: {:?}; its log:\n{}",
            status(&standby_of_other).await,
            std::fs::read_to_string(standby_of_other.dir.join("instance.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "the standby of the other database copied the source's data {:?} after the change",
        started.elapsed()
    );
    for instance in [&other, &standby_of_other] {
        let kept = set_aside(instance);
        assert_eq!(
            kept.len(),
            1,
            "{}: the old data is kept beside: {kept:?}",
            instance.dir.display()
        );
    }
    drop(standby_of_other);
    drop(other);
    drop(source);
    let _ = std::fs::remove_dir_all(&root);
}

/// A primary told to follow an upstream that does not answer (a mistyped `replicaOf`, a
/// source still starting): `pg_rewind` cannot connect, so its data is left as it is (not
/// set aside, not copied); it runs as a hot standby of what it has, serving reads, and
/// takes writes again with every row once told to lead again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_primary_whose_upstream_does_not_answer_keeps_its_data() {
    let root = test_root("bulkhead-unreachable-test");
    let a = primary_with_two_rows(&root, "a").await;

    let mut nowhere = standby(1, None);
    nowhere.upstream = Some(Upstream {
        host: "127.0.0.1".into(),
        port: free_port(),
        external: true,
    });
    wait_role(&a, Role::Standby, Some(&nowhere)).await;
    for _ in 0..5 {
        tell(&a, &nowhere).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let s = status(&a).await.unwrap();
    assert_eq!(s.role, Some(Role::Standby), "{s:?}");
    assert!(
        set_aside(&a).is_empty(),
        "the data was set aside: {:?}",
        set_aside(&a)
    );
    let reader = client(&a).await;
    assert_eq!(count(&reader).await, 2, "it serves what it has");
    let error = reader
        .batch_execute("INSERT INTO orders VALUES (3)")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&error).as_deref(), Some("25006"), "{error}");

    wait_role(&a, Role::Primary, Some(&primary(1))).await;
    let writer = client(&a).await;
    writer
        .batch_execute("INSERT INTO orders VALUES (3)")
        .await
        .unwrap();
    assert_eq!(count(&writer).await, 3);
    drop(a);
    let _ = std::fs::remove_dir_all(&root);
}

/// Sends `signal` to every process running on `instance`'s data directory (its
/// postmaster and the postmaster's children).
fn signal_postgres(instance: &InstanceProcess, signal: i32) {
    let marker = instance.dir.join("data").display().to_string();
    let postmasters: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&marker))
        })
        .collect();
    assert!(!postmasters.is_empty(), "no postgres runs on {marker}");
    for pid in std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
    {
        let parent = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit(')')
                    .next()?
                    .split_whitespace()
                    .nth(1)?
                    .parse::<i32>()
                    .ok()
            });
        if postmasters.contains(&pid) || parent.is_some_and(|p| postmasters.contains(&p)) {
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }
}

/// A primary demoted while a replica cluster streaming from it is cut off (its server
/// frozen: it holds the connection and answers nothing) ends that WAL sender first, so
/// the demotion does not wait for `wal_sender_timeout` (a fast shutdown waits until every
/// sender has sent everything). Thawed, the replica cluster gets the rest from the
/// demoted server, a hot standby: it reaches the demoted primary's last position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demotion_does_not_wait_for_a_cut_off_replica_cluster() {
    let root = test_root("bulkhead-demote-external");
    let source = primary_with_two_rows(&root, "source").await;
    let replica = start(&root, "replica", "60s");
    let mut replica_word = standby(1, Some(&source));
    replica_word.name = "orders-0".into();
    replica_word.upstream.as_mut().unwrap().external = true;
    wait_role(&replica, Role::Standby, Some(&replica_word)).await;
    let writer = client(&source).await;
    writer
        .batch_execute("INSERT INTO orders VALUES (3)")
        .await
        .unwrap();
    let reader = client(&replica).await;
    let started = Instant::now();
    while count(&reader).await != 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never streamed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(reader);

    signal_postgres(&replica, libc::SIGSTOP);
    let demoted = standby(1, None);
    let asked = Instant::now();
    wait_role(&source, Role::Standby, Some(&demoted)).await;
    let took = asked.elapsed();
    eprintln!("demoted {took:?} after it was asked, its replica cluster frozen");
    let last = status(&source).await.and_then(|s| s.lsn).unwrap();
    signal_postgres(&replica, libc::SIGCONT);
    assert!(
        took < Duration::from_secs(20),
        "the demotion waited for the frozen replica cluster ({took:?}; the manager stops waiting at 30 s); source log:\n{}",
        std::fs::read_to_string(source.dir.join("instance.log")).unwrap_or_default()
    );
    let started = Instant::now();
    loop {
        tell(&replica, &replica_word).await;
        let received = status(&replica)
            .await
            .and_then(|s| s.lsn)
            .and_then(|l| bulkhead::api::instance::parse_lsn(&l));
        if received >= bulkhead::api::instance::parse_lsn(&last) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the replica cluster never reached the demoted primary's {last} (at {received:?})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(writer);
    drop(replica);
    drop(source);
    let _ = std::fs::remove_dir_all(&root);
}
