//! Membership end to end: `bulkhead join` registers the lab's members, `bulkhead hub`
//! probes them, taints and untaints them across a partition, judges zones, freezes when
//! it is the one cut off, renews the fencing Lease only where it can, survives a
//! credential rotation, and `bulkhead unjoin --cleanup` leaves nothing behind.
//!
//! Run with `cargo build -p bulkhead --bin bulkhead && cargo test -p bulkhead-e2e --test
//! membership -- --test-threads=1`.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bulkhead::api::MemberCluster;
use bulkhead::api::member_cluster::{TAINT_UNREACHABLE, ZoneState};
use bulkhead_e2e::agent_support::{bulkhead_binary, free_port};
use bulkhead_e2e::hub_support::{bulkhead, path};
use bulkhead_e2e::lab::Lab;
use bulkhead_e2e::support::{self, Partition, TestNamespace};
use bulkhead_e2e::{Check, wait_for};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const MEMBERS: [(&str, &str, &str); 3] = [
    ("east", "zone-a", "region-1"),
    ("west", "zone-b", "region-1"),
    ("north", "zone-c", "region-2"),
];
const PROBE_INTERVAL: u64 = 1;
const PROBE_TIMEOUT: u64 = 1;
const FAILURE_THRESHOLD: u64 = 3;
const SUCCESS_THRESHOLD: u64 = 2;

/// The shared lab with the project's CRDs on the hub, as a user installs them before
/// `bulkhead join` (so this file runs alone, not only after another test file).
async fn lab_with_hub_crds() -> Result<Lab> {
    let lab = support::lab().await?;
    lab.install_crds("hub", &bulkhead_e2e::lab::crd_dir())
        .await
        .context("installing the CRDs on the hub")?;
    Ok(lab)
}

fn join(lab: &Lab, name: &str, kubeconfig: &Path, zone: &str, region: &str) -> Result<Output> {
    let hub = path(&lab.kubeconfig("hub"));
    let (interval, timeout) = (PROBE_INTERVAL.to_string(), PROBE_TIMEOUT.to_string());
    let (failures, successes) = (FAILURE_THRESHOLD.to_string(), SUCCESS_THRESHOLD.to_string());
    bulkhead(&[
        "join",
        name,
        "--kubeconfig",
        &path(kubeconfig),
        "--zone",
        zone,
        "--region",
        region,
        "--hub-kubeconfig",
        &hub,
        "--probe-interval-seconds",
        &interval,
        "--probe-timeout-seconds",
        &timeout,
        "--failure-threshold",
        &failures,
        "--success-threshold",
        &successes,
    ])
}

async fn metrics(port: u16) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await?;
    Ok(raw)
}

/// True when `line` is one of the samples (not a HELP text that happens to contain it).
fn metric_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l.trim_end() == line)
}

/// The `bulkhead hub` process, killed when dropped.
struct Hub {
    child: Child,
    port: u16,
}

impl Hub {
    fn start(lab: &Lab) -> Result<Self> {
        let port = free_port();
        let child = Command::new(bulkhead_binary()?)
            .args(["hub", "--kubeconfig"])
            .arg(lab.kubeconfig("hub"))
            .args([
                "--probe-address",
                &format!("127.0.0.1:{port}"),
                "--identity",
                "e2e-membership-hub",
                "--lease-renew-interval",
                "1s",
                "--lease-duration",
                "10s",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        Ok(Hub { child, port })
    }

    fn stop(mut self) -> Result<()> {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM)?;
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                assert!(status.success(), "hub exit: {status:?}");
                eprintln!("hub stopped {:?} after SIGTERM", started.elapsed());
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(10) {
                bail!("the hub did not stop within 10 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Unjoins the members when the test ends, even when it fails (through the inside
/// kubeconfig, so a leftover partition cannot stop the clean-up).
struct Members {
    lab: Lab,
    names: Vec<&'static str>,
}

impl Drop for Members {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = bulkhead(&[
                "unjoin",
                name,
                "--cleanup",
                "--kubeconfig",
                &path(&self.lab.inside_kubeconfig(name)),
                "--hub-kubeconfig",
                &path(&self.lab.kubeconfig("hub")),
            ]);
        }
    }
}

/// Every member cut off from the hub while alive.
struct HubIsolation<'a>(&'a Lab);

impl Drop for HubIsolation<'_> {
    fn drop(&mut self) {
        for (name, _, _) in MEMBERS {
            let _ = self.0.heal(name);
        }
    }
}

fn ready(cluster: &MemberCluster) -> (String, String) {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| (c.status.clone(), c.reason.clone()))
        .unwrap_or_else(|| ("<none>".into(), "<none>".into()))
}

fn has_taint(cluster: &MemberCluster, key: &str) -> bool {
    cluster.spec.taints.iter().any(|t| t.key == key)
}

async fn wait_ready(hub: &Client, name: &str, timeout: Duration) -> Result<Duration> {
    let api = Api::<MemberCluster>::all(hub.clone());
    let started = Instant::now();
    wait_for(&format!("{name} Ready=True"), timeout, || {
        let api = api.clone();
        async move {
            match api.get(name).await {
                Ok(mc) if ready(&mc).0 == "True" && !has_taint(&mc, TAINT_UNREACHABLE) => {
                    Check::Done(())
                }
                Ok(mc) => Check::Waiting(format!("{:?}, taints {:?}", ready(&mc), mc.spec.taints)),
                Err(e) => Check::Waiting(e.to_string()),
            }
        }
    })
    .await?;
    Ok(started.elapsed())
}

async fn renew_time(member: &Client) -> Option<String> {
    let lease = Api::<Lease>::namespaced(member.clone(), "bulkhead-system")
        .get("bulkhead-hub")
        .await
        .ok()?;
    let spec = lease.spec?;
    spec.renew_time.map(|t| t.0.to_string())
}

async fn nothing_on_the_hub(hub: &Client, name: &str) -> Result<()> {
    let mc = Api::<MemberCluster>::all(hub.clone()).get_opt(name).await?;
    assert!(mc.is_none(), "MemberCluster {name} must not exist");
    let secret = Api::<Secret>::namespaced(hub.clone(), "bulkhead-system")
        .get_opt(&format!("member-{name}"))
        .await?;
    assert!(secret.is_none(), "Secret member-{name} must not exist");
    Ok(())
}

#[tokio::test]
async fn join_refuses_what_it_cannot_use_and_creates_nothing_on_the_hub() -> Result<()> {
    let lab = lab_with_hub_crds().await?;
    let hub = lab.client("hub").await?;
    let dir = std::env::temp_dir().join(format!("bulkhead-e2e-membership-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let admin: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(lab.kubeconfig("east"))?)?;

    // A kubeconfig pointing nowhere: a clear error, nothing on the hub.
    let mut nowhere = admin.clone();
    nowhere["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1".into();
    let nowhere_path = dir.join("nowhere.kubeconfig");
    std::fs::write(&nowhere_path, serde_yaml::to_string(&nowhere)?)?;
    let output = join(&lab, "e2e-nowhere", &nowhere_path, "zone-x", "region-x")?;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot reach member e2e-nowhere"),
        "{stderr}"
    );
    nothing_on_the_hub(&hub, "e2e-nowhere").await?;

    // Credentials that cannot do anything: refused before anything is written.
    let mut bad_token = admin.clone();
    let user = &mut bad_token["users"][0]["user"];
    *user = serde_yaml::from_str("{token: not-a-valid-token}")?;
    let bad_path = dir.join("bad-token.kubeconfig");
    std::fs::write(&bad_path, serde_yaml::to_string(&bad_token)?)?;
    let output = join(&lab, "e2e-badcreds", &bad_path, "zone-a", "region-1")?;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("rejects the credentials")
            || stderr.contains("cannot check the credentials"),
        "{stderr}"
    );
    nothing_on_the_hub(&hub, "e2e-badcreds").await?;

    // Valid credentials without the rights joining needs: refused, naming what is denied.
    let namespace = TestNamespace::create(&lab, "membership", &["east"]).await?;
    let east = lab.inside_client("east").await?;
    let accounts = Api::<ServiceAccount>::namespaced(east.clone(), &namespace.name);
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "limited"}}))?;
    accounts.create(&PostParams::default(), &account).await?;
    let token = accounts
        .create_token_request("limited", &PostParams::default(), &TokenRequest::default())
        .await?
        .status
        .and_then(|s| s.token)
        .context("no token")?;
    let mut limited = admin.clone();
    limited["users"][0]["user"] = serde_yaml::from_str(&format!("{{token: {token}}}"))?;
    let limited_path = dir.join("limited.kubeconfig");
    std::fs::write(&limited_path, serde_yaml::to_string(&limited)?)?;
    let output = join(&lab, "e2e-limited", &limited_path, "zone-a", "region-1")?;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("may not do what joining needs") && stderr.contains("create namespaces"),
        "{stderr}"
    );
    nothing_on_the_hub(&hub, "e2e-limited").await?;
    drop(namespace);

    // A partitioned member: refused, with a timeout rather than a hang.
    {
        let _partition = Partition::start(&lab, "north")?;
        let started = Instant::now();
        let output = join(
            &lab,
            "e2e-cut",
            &lab.kubeconfig("north"),
            "zone-c",
            "region-2",
        )?;
        eprintln!(
            "join of a partitioned member failed after {:?}",
            started.elapsed()
        );
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("cannot reach member e2e-cut"), "{stderr}");
        nothing_on_the_hub(&hub, "e2e-cut").await?;
    }

    // A name taken by a different cluster (another kube-system uid).
    let squatter: MemberCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "federation.example.com/v1alpha1",
        "kind": "MemberCluster",
        "metadata": {"name": "e2e-taken", "labels": {"federation.example.com/cluster-id": "someone-else"}},
        "spec": {"secretRef": {"namespace": "bulkhead-system", "name": "member-e2e-taken"}, "zone": "zone-z"}
    }))?;
    let members = Api::<MemberCluster>::all(hub.clone());
    members.create(&PostParams::default(), &squatter).await?;
    let output = join(
        &lab,
        "e2e-taken",
        &lab.kubeconfig("east"),
        "zone-a",
        "region-1",
    );
    let _ = members.delete("e2e-taken", &DeleteParams::default()).await;
    let output = output?;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("taken on the hub by a different cluster"),
        "{stderr}"
    );
    assert!(
        Api::<Secret>::namespaced(hub.clone(), "bulkhead-system")
            .get_opt("member-e2e-taken")
            .await
            .unwrap_or(None)
            .is_none()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// With the hub's own credentials for `member` (the kubeconfig `join` stored on the hub),
/// real writes in `kube-system`, `bulkhead-system` and the namespace `join
/// --protect-namespace` named are refused by the member's API server
/// (ValidatingAdmissionPolicy `bulkhead-hub-guard`), while a write elsewhere and the
/// fencing Lease are allowed.
async fn hub_account_is_kept_out_of_system_namespaces(
    lab: &Lab,
    hub: &Client,
    member: &str,
) -> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let secret = Api::<Secret>::namespaced(hub.clone(), "bulkhead-system")
        .get(&format!("member-{member}"))
        .await?;
    let text = String::from_utf8(secret.data.unwrap_or_default()["kubeconfig"].0.clone())?;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&text)?,
        &Default::default(),
    )
    .await?;
    let as_hub = Client::try_from(config)?;
    let admin = lab.client(member).await?;
    let protected = "e2e-protected";
    let namespaces = Api::<Namespace>::all(admin.clone());
    if namespaces.get_opt(protected).await?.is_none() {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({"metadata": {"name": protected}}))?,
            )
            .await?;
    }
    let config_map: ConfigMap = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "written-by-the-hub"}, "data": {"a": "b"}}),
    )?;
    // The policy is read by the API server a moment after it is applied.
    for namespace in ["kube-system", "bulkhead-system", protected] {
        let api = Api::<ConfigMap>::namespaced(as_hub.clone(), namespace);
        let refusal = wait_for(
            &format!("{member}: the hub's write in {namespace} refused"),
            Duration::from_secs(20),
            || {
                let api = api.clone();
                let config_map = config_map.clone();
                async move {
                    match api.create(&PostParams::default(), &config_map).await {
                        Err(kube::Error::Api(status))
                            if status.message.contains("bulkhead-hub-guard") =>
                        {
                            Check::Done(status.message)
                        }
                        Err(error) => Check::Waiting(error.to_string()),
                        Ok(_) => {
                            let _ = api
                                .delete("written-by-the-hub", &DeleteParams::default())
                                .await;
                            Check::Waiting("created (the policy not in force yet)".into())
                        }
                    }
                }
            },
        )
        .await?;
        assert!(
            refusal.contains(&format!(
                "may not CREATE configmaps written-by-the-hub in namespace {namespace}"
            )),
            "{refusal}"
        );
        eprintln!("{member}: {refusal}");
    }
    // Elsewhere the hub writes as before (a dry run), and its fencing Lease is untouched
    // by the policy (the hub renews it all the time).
    Api::<ConfigMap>::namespaced(as_hub.clone(), "default")
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &config_map,
        )
        .await
        .context("the hub may write outside the protected namespaces")?;
    namespaces
        .delete(protected, &DeleteParams::default())
        .await?;
    Ok(())
}

/// A write the hub sends into a partition is discarded, never delivered once the partition
/// heals: the member clients abort a connection whose data goes unacknowledged for
/// `UNACKNOWLEDGED` (TCP would otherwise retransmit it for minutes, and the 60-minute chaos
/// run saw a DELETE land 7 s and an apply 9 s after they were sent).
#[tokio::test]
async fn a_write_sent_into_a_partition_never_lands_after_the_heal() -> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let lab = lab_with_hub_crds().await?;
    let namespace = TestNamespace::create(&lab, "late-write", &["east"]).await?;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(lab.kubeconfig("east"))?,
        &Default::default(),
    )
    .await?;
    // As the hub builds a member's clients.
    let client = bulkhead::client::build(
        config,
        bulkhead::client::Limits {
            idle: Duration::from_secs(30),
            in_flight: Some(4),
            request_timeout: Some(Duration::from_secs(5)),
            unacknowledged: Some(bulkhead::hub::membership::members::UNACKNOWLEDGED),
        },
    )?;
    let api = Api::<ConfigMap>::namespaced(client.clone(), &namespace.name);
    // A connection in the pool first, as the hub's would be.
    api.list(&Default::default()).await?;
    let partition = Partition::start(&lab, "east")?;
    let config_map: ConfigMap = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "sent-into-the-partition"}}),
    )?;
    let sent = Instant::now();
    let outcome = api.create(&PostParams::default(), &config_map).await;
    eprintln!(
        "the create sent into the partition ended after {:?}: {:?}",
        sent.elapsed(),
        outcome.as_ref().map(|_| "created")
    );
    assert!(
        outcome.is_err(),
        "a create through a partition cannot succeed"
    );
    // Long enough for TCP's retransmissions to be pending, then heal and give them time.
    tokio::time::sleep(Duration::from_secs(8)).await;
    partition.heal()?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let admin = Api::<ConfigMap>::namespaced(lab.client("east").await?, &namespace.name);
    assert!(
        admin.get_opt("sent-into-the-partition").await?.is_none(),
        "the create sent into the partition landed after the heal"
    );
    // The same client works again.
    api.list(&Default::default()).await?;
    Ok(())
}

#[tokio::test]
async fn members_join_are_probed_tainted_zoned_leased_and_unjoin_cleanly() -> Result<()> {
    let lab = lab_with_hub_crds().await?;
    let hub = lab.client("hub").await?;
    let members_api = Api::<MemberCluster>::all(hub.clone());
    let _members = Members {
        lab: lab.clone(),
        names: MEMBERS.iter().map(|(n, _, _)| *n).collect(),
    };

    for (name, zone, region) in MEMBERS {
        let output = join(&lab, name, &lab.kubeconfig(name), zone, region)?;
        assert!(output.status.success(), "join {name}");
        let secret = Api::<Secret>::namespaced(hub.clone(), "bulkhead-system")
            .get(&format!("member-{name}"))
            .await?;
        let text = String::from_utf8(secret.data.unwrap()["kubeconfig"].0.clone())?;
        assert!(text.contains("token:"), "the hub's kubeconfig uses a token");
        assert!(
            !text.contains("client-key-data"),
            "the admin credentials never reach the hub"
        );
    }
    // Joining again is an idempotent update; this time west protects a namespace.
    let (name, zone, region) = MEMBERS[1];
    let output = bulkhead(&[
        "join",
        name,
        "--kubeconfig",
        &path(&lab.kubeconfig(name)),
        "--zone",
        zone,
        "--region",
        region,
        "--hub-kubeconfig",
        &path(&lab.kubeconfig("hub")),
        "--protect-namespace",
        "e2e-protected",
    ])?;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    hub_account_is_kept_out_of_system_namespaces(&lab, &hub, name).await?;

    let hub_process = Hub::start(&lab)?;
    let port = hub_process.port;
    for (name, _, _) in MEMBERS {
        let took = wait_ready(&hub, name, Duration::from_secs(60)).await?;
        eprintln!("{name} Ready after {took:?}");
    }
    let table = bulkhead(&[
        "get",
        "clusters",
        "--kubeconfig",
        &path(&lab.kubeconfig("hub")),
    ])?;
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(table.starts_with("NAME"), "{table}");
    for (name, zone, _) in MEMBERS {
        let row = table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .with_context(|| format!("no row for {name} in\n{table}"))?;
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(&cells[1..5], [zone, "True", "Healthy", "v1.36.3"], "{row}");
    }

    // Status is written on change, not per probe: a steady member costs at most one
    // lastProbeTime refresh (every 30 s) in a 5 s window of five probes.
    let writes = |text: &str, cluster: &str| -> u64 {
        let prefix = format!("bulkhead_member_status_writes_total{{cluster=\"{cluster}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let before = metrics(port).await?;
    // Deliberate: the measure is what the hub writes in a 5 s window of steady probing.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = metrics(port).await?;
    for (name, _, _) in MEMBERS {
        let (b, a) = (writes(&before, name), writes(&after, name));
        eprintln!("{name}: {} status writes in 5 s of steady probing", a - b);
        assert!(
            a - b <= 1,
            "{name}: {b} -> {a} status writes while nothing changed"
        );
    }

    // The lease advances in every member.
    let mut inside = vec![];
    for (name, _, _) in MEMBERS {
        inside.push((name, lab.inside_client(name).await?));
    }
    let before: Vec<Option<String>> = futures_join(&inside).await;
    for (i, (name, client)) in inside.iter().enumerate() {
        let before = &before[i];
        wait_for(
            &format!("{name}: the lease renewed (renewTime advances)"),
            Duration::from_secs(30),
            || async move {
                match renew_time(client).await {
                    Some(now) if Some(&now) != before.as_ref() => Check::Done(()),
                    now => Check::Waiting(format!("renewTime {now:?}, before {before:?}")),
                }
            },
        )
        .await?;
    }

    // Partition east: Unreachable with the taint within interval x threshold + timeout.
    let budget = Duration::from_secs(PROBE_INTERVAL * FAILURE_THRESHOLD + PROBE_TIMEOUT);
    let partition = Partition::start(&lab, "east")?;
    let cut = Instant::now();
    wait_for(
        "east Unreachable and tainted",
        Duration::from_secs(60),
        || {
            let api = members_api.clone();
            async move {
                match api.get("east").await {
                    Ok(mc)
                        if ready(&mc) == ("False".into(), "Unreachable".into())
                            && has_taint(&mc, TAINT_UNREACHABLE) =>
                    {
                        Check::Done(())
                    }
                    Ok(mc) => Check::Waiting(format!("{:?}", ready(&mc))),
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await?;
    let detected = cut.elapsed();
    eprintln!(
        "MEASURED: partition -> east Unreachable + tainted in {detected:?} (interval x failureThreshold + timeout = {budget:?}, plus up to one interval of phase and the 250 ms poll)"
    );
    let east = members_api.get("east").await?;
    let taint = east
        .spec
        .taints
        .iter()
        .find(|t| t.key == TAINT_UNREACHABLE)
        .unwrap();
    assert_eq!(taint.effect, "NoExecute");
    assert!(taint.time_added.is_some());
    wait_for("zone-a FullDisruption", Duration::from_secs(20), || {
        let api = members_api.clone();
        async move {
            match api.get("east").await {
                Ok(mc)
                    if mc.status.as_ref().and_then(|s| s.zone_state)
                        == Some(ZoneState::FullDisruption) =>
                {
                    Check::Done(())
                }
                Ok(mc) => Check::Waiting(format!("{:?}", mc.status.and_then(|s| s.zone_state))),
                Err(e) => Check::Waiting(e.to_string()),
            }
        }
    })
    .await?;
    for other in ["west", "north"] {
        let mc = members_api.get(other).await?;
        assert_eq!(ready(&mc).0, "True", "{other} is unaffected");
        assert!(!has_taint(&mc, TAINT_UNREACHABLE));
        assert_eq!(mc.status.unwrap().zone_state, Some(ZoneState::Normal));
    }
    // The lease stands still in east (seen from inside the zone) and moves in west.
    let east_inside = lab.inside_client("east").await?;
    let west_inside = lab.inside_client("west").await?;
    let east_before = renew_time(&east_inside).await;
    let west_before = renew_time(&west_inside).await;
    // A deliberate sleep of three renew intervals: what is checked is that east's lease
    // is not renewed in that time, so there is no condition to wait for.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        east_before,
        renew_time(&east_inside).await,
        "no renewal through a partition"
    );
    let west_before = &west_before;
    let west_inside = &west_inside;
    wait_for(
        "west keeps being renewed",
        Duration::from_secs(30),
        || async move {
            match renew_time(west_inside).await {
                Some(now) if Some(&now) != west_before.as_ref() => Check::Done(()),
                now => Check::Waiting(format!("renewTime {now:?}, before {west_before:?}")),
            }
        },
    )
    .await?;
    let text = metrics(port).await?;
    assert!(
        metric_line(&text, "bulkhead_zone_state{zone=\"zone-a\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("bulkhead_lease_renewal_failures_total{cluster=\"east\"}"),
        "{text}"
    );

    // Heal: Ready after successThreshold probes, taint removed.
    partition.heal()?;
    let healed = wait_ready(&hub, "east", Duration::from_secs(60)).await?;
    eprintln!(
        "MEASURED: heal -> east Ready and untainted in {healed:?} (successThreshold {SUCCESS_THRESHOLD} x interval {PROBE_INTERVAL}s)"
    );

    // Isolate the hub: every zone in FullDisruption, the hub freezes; heal: it thaws.
    {
        let text = metrics(port).await?;
        assert!(metric_line(&text, "bulkhead_hub_frozen 0"), "{text}");
        let _isolation = HubIsolation(&lab);
        lab.isolate_hub()?;
        let cut = Instant::now();
        wait_for("the hub frozen", Duration::from_secs(60), || async move {
            match metrics(port).await {
                Ok(text) if metric_line(&text, "bulkhead_hub_frozen 1") => Check::Done(()),
                Ok(text) => Check::Waiting(
                    text.lines()
                        .filter(|l| {
                            l.starts_with("bulkhead_hub_frozen")
                                || l.starts_with("bulkhead_zone_state")
                        })
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
                Err(e) => Check::Waiting(e.to_string()),
            }
        })
        .await?;
        eprintln!("MEASURED: isolate-hub -> frozen in {:?}", cut.elapsed());
    }
    wait_for("the hub thawed", Duration::from_secs(60), || async move {
        match metrics(port).await {
            Ok(text) if metric_line(&text, "bulkhead_hub_frozen 0") => Check::Done(()),
            Ok(_) => Check::Waiting("still frozen".into()),
            Err(e) => Check::Waiting(e.to_string()),
        }
    })
    .await?;
    for (name, _, _) in MEMBERS {
        wait_ready(&hub, name, Duration::from_secs(60)).await?;
    }

    // Credentials: a Secret with a token the member rejects -> CredentialsInvalid,
    // without a restart; re-joining rotates the token -> Ready again.
    let secrets = Api::<Secret>::namespaced(hub.clone(), "bulkhead-system");
    let secret = secrets.get("member-west").await?;
    let text = String::from_utf8(secret.data.unwrap()["kubeconfig"].0.clone())?;
    let mut kubeconfig: serde_yaml::Value = serde_yaml::from_str(&text)?;
    kubeconfig["users"][0]["user"]["token"] = "rotated-away".into();
    let broken = serde_yaml::to_string(&kubeconfig)?;
    secrets
        .patch(
            "member-west",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"stringData": {"kubeconfig": broken}})),
        )
        .await?;
    wait_for("west CredentialsInvalid", Duration::from_secs(60), || {
        let api = members_api.clone();
        async move {
            match api.get("west").await {
                Ok(mc) if ready(&mc) == ("False".into(), "CredentialsInvalid".into()) => {
                    Check::Done(())
                }
                Ok(mc) => Check::Waiting(format!("{:?}", ready(&mc))),
                Err(e) => Check::Waiting(e.to_string()),
            }
        }
    })
    .await?;
    for other in ["east", "north"] {
        assert_eq!(
            ready(&members_api.get(other).await?).0,
            "True",
            "{other} unaffected"
        );
    }
    let (name, zone, region) = MEMBERS[1];
    assert!(
        join(&lab, name, &lab.kubeconfig(name), zone, region)?
            .status
            .success()
    );
    let took = wait_ready(&hub, "west", Duration::from_secs(60)).await?;
    eprintln!("MEASURED: re-join with a fresh token -> west Ready in {took:?}");

    // A missing Secret: CredentialsInvalid at once, the others unaffected; re-join fixes it.
    secrets
        .delete("member-north", &DeleteParams::default())
        .await?;
    wait_for(
        "north CredentialsInvalid (Secret missing)",
        Duration::from_secs(30),
        || {
            let api = members_api.clone();
            async move {
                match api.get("north").await {
                    Ok(mc) if ready(&mc) == ("False".into(), "CredentialsInvalid".into()) => {
                        Check::Done(())
                    }
                    Ok(mc) => Check::Waiting(format!("{:?}", ready(&mc))),
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await?;
    for other in ["east", "west"] {
        assert_eq!(
            ready(&members_api.get(other).await?).0,
            "True",
            "{other} unaffected"
        );
    }
    let (name, zone, region) = MEMBERS[2];
    assert!(
        join(&lab, name, &lab.kubeconfig(name), zone, region)?
            .status
            .success()
    );
    wait_ready(&hub, "north", Duration::from_secs(60)).await?;

    hub_process.stop()?;

    // Unjoin with clean-up leaves no Bulkhead objects in the members.
    for (name, _, _) in MEMBERS {
        let output = bulkhead_e2e::hub_support::unjoin(&lab, name)?;
        assert!(output.status.success(), "unjoin {name}");
        nothing_on_the_hub(&hub, name).await?;
        let member = lab.inside_client(name).await?;
        assert!(
            Api::<Namespace>::all(member.clone())
                .get_opt("bulkhead-system")
                .await?
                .is_none()
        );
        assert!(
            Api::<ClusterRole>::all(member.clone())
                .get_opt("bulkhead-hub")
                .await?
                .is_none()
        );
        assert!(
            Api::<ClusterRoleBinding>::all(member.clone())
                .get_opt("bulkhead-hub")
                .await?
                .is_none()
        );
    }
    Ok(())
}

async fn futures_join(clients: &[(&str, Client)]) -> Vec<Option<String>> {
    let mut out = vec![];
    for (_, client) in clients {
        out.push(renew_time(client).await);
    }
    out
}

#[tokio::test]
async fn join_can_install_the_agent_and_unjoin_removes_it() -> Result<()> {
    use k8s_openapi::api::apps::v1::Deployment;
    let lab = lab_with_hub_crds().await?;
    let member = lab.inside_client("north").await?;
    let hub = lab.client("hub").await?;
    let output = bulkhead(&[
        "join",
        "north",
        "--kubeconfig",
        &path(&lab.kubeconfig("north")),
        "--zone",
        "zone-c",
        "--hub-kubeconfig",
        &path(&lab.kubeconfig("hub")),
        "--install-agent",
        "--agent-image",
        "registry.local/bulkhead:e2e",
    ])?;
    assert!(output.status.success(), "join --install-agent failed");
    let deployments: Api<Deployment> = Api::namespaced(member.clone(), "bulkhead-system");
    let deployment = deployments.get("bulkhead-agent").await?;
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod.containers[0].image.as_deref(),
        Some("registry.local/bulkhead:e2e")
    );
    assert_eq!(pod.service_account_name.as_deref(), Some("bulkhead-agent"));
    Api::<ServiceAccount>::namespaced(member.clone(), "bulkhead-system")
        .get("bulkhead-agent")
        .await?;
    Api::<ClusterRole>::all(member.clone())
        .get("bulkhead-agent")
        .await?;
    Api::<ClusterRoleBinding>::all(member.clone())
        .get("bulkhead-agent")
        .await?;
    // What the member itself says the two accounts may do (docs/clusters.md, "Permissions
    // in a member"): what the code needs is allowed, anything wider is not.
    let hub_account = "system:serviceaccount:bulkhead-system:bulkhead-hub";
    let agent_account = "system:serviceaccount:bulkhead-system:bulkhead-agent";
    for (user, verb, group, resource, namespace, name, allowed) in [
        (
            hub_account,
            "patch",
            "apps",
            "deployments",
            "shop",
            "",
            true,
        ),
        (
            hub_account,
            "create",
            "apps",
            "deployments",
            "shop",
            "",
            true,
        ),
        (hub_account, "delete", "", "secrets", "shop", "", true),
        (hub_account, "create", "", "namespaces", "", "", true),
        (
            hub_account,
            "get",
            "",
            "namespaces",
            "",
            "kube-system",
            true,
        ),
        (hub_account, "list", "", "nodes", "", "", true),
        (
            hub_account,
            "patch",
            "coordination.k8s.io",
            "leases",
            "bulkhead-system",
            "bulkhead-hub",
            true,
        ),
        (
            hub_account,
            "update",
            "apps",
            "deployments",
            "shop",
            "",
            false,
        ),
        (hub_account, "get", "", "namespaces", "", "default", false),
        (hub_account, "delete", "", "namespaces", "", "shop", false),
        (hub_account, "get", "", "nodes", "", "", false),
        (
            hub_account,
            "patch",
            "coordination.k8s.io",
            "leases",
            "kube-node-lease",
            "",
            false,
        ),
        (
            hub_account,
            "get",
            "rbac.authorization.k8s.io",
            "clusterroles",
            "",
            "",
            false,
        ),
        (
            agent_account,
            "patch",
            "apps",
            "statefulsets",
            "shop",
            "",
            true,
        ),
        (
            agent_account,
            "delete",
            "",
            "persistentvolumeclaims",
            "shop",
            "",
            true,
        ),
        (
            agent_account,
            "patch",
            "example.com",
            "mydatabases",
            "shop",
            "",
            true,
        ),
        (
            agent_account,
            "delete",
            "apps",
            "statefulsets",
            "shop",
            "",
            false,
        ),
        (agent_account, "update", "", "services", "shop", "", false),
        (
            agent_account,
            "deletecollection",
            "",
            "persistentvolumeclaims",
            "shop",
            "",
            false,
        ),
        (
            agent_account,
            "delete",
            "example.com",
            "mydatabases",
            "shop",
            "",
            false,
        ),
        // Secrets: the databases' own, read and made once; never listed or deleted, their
        // data never changed.
        (agent_account, "get", "", "secrets", "shop", "", true),
        (agent_account, "create", "", "secrets", "shop", "", true),
        (agent_account, "list", "", "secrets", "shop", "", false),
        // patch: only the owner reference, to keep them with kept claims.
        (agent_account, "patch", "", "secrets", "shop", "", true),
        (agent_account, "delete", "", "secrets", "shop", "", false),
        // Pods: watched, their role label patched, deleted one by one by a database
        // upgrade; never updated or created.
        (agent_account, "patch", "", "pods", "shop", "", true),
        (agent_account, "delete", "", "pods", "shop", "", true),
        (agent_account, "update", "", "pods", "shop", "", false),
        (agent_account, "create", "", "pods", "shop", "", false),
    ] {
        let review = k8s_openapi::api::authorization::v1::SubjectAccessReview {
            spec: k8s_openapi::api::authorization::v1::SubjectAccessReviewSpec {
                user: Some(user.into()),
                groups: Some(vec![
                    "system:serviceaccounts".into(),
                    "system:authenticated".into(),
                ]),
                resource_attributes: Some(
                    k8s_openapi::api::authorization::v1::ResourceAttributes {
                        verb: Some(verb.into()),
                        group: Some(group.into()),
                        resource: Some(resource.into()),
                        namespace: (!namespace.is_empty()).then(|| namespace.into()),
                        name: (!name.is_empty()).then(|| name.into()),
                        ..Default::default()
                    },
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer =
            Api::<k8s_openapi::api::authorization::v1::SubjectAccessReview>::all(member.clone())
                .create(&PostParams::default(), &review)
                .await?;
        let granted = answer.status.is_some_and(|s| s.allowed);
        assert_eq!(
            granted, allowed,
            "{user} {verb} {group}/{resource} in {namespace:?} named {name:?}"
        );
    }
    // And the whole list, as the hub's own token sees it: every rule the member reports
    // for it is one the code grants (docs/clusters.md renders the same rules), and every
    // granted rule is there. Any widening fails here.
    let effective = hub_effective_rules(&hub, "north", "bulkhead-system").await?;
    let mut granted = expand(
        &bulkhead::cli::join::hub_cluster_role()
            .rules
            .unwrap_or_default(),
    );
    granted.extend(expand(
        &bulkhead::cli::join::hub_lease_role()
            .rules
            .unwrap_or_default(),
    ));
    granted.extend(basic_user());
    assert_same_permissions("the hub", &effective, &granted);
    let effective = agent_effective_rules(&lab, &member, "north", "shop").await?;
    let mut granted = expand(
        &bulkhead::cli::agent_install::cluster_role()
            .rules
            .unwrap_or_default(),
    );
    granted.extend(basic_user());
    assert_same_permissions("the agent", &effective, &granted);
    // kwok runs no containers but plays the kubelet: the Deployment becomes available.
    wait_for(
        "agent Deployment available",
        Duration::from_secs(60),
        || {
            let deployments = deployments.clone();
            async move {
                match deployments.get("bulkhead-agent").await {
                    Ok(d) if d.status.as_ref().and_then(|s| s.available_replicas) == Some(1) => {
                        Check::Done(())
                    }
                    Ok(d) => {
                        Check::Waiting(format!("{:?}", d.status.and_then(|s| s.available_replicas)))
                    }
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await?;

    let output = bulkhead(&[
        "unjoin",
        "north",
        "--cleanup",
        "--kubeconfig",
        &path(&lab.kubeconfig("north")),
        "--hub-kubeconfig",
        &path(&lab.kubeconfig("hub")),
    ])?;
    assert!(output.status.success(), "unjoin --cleanup failed");
    assert!(
        Api::<ClusterRole>::all(member.clone())
            .get_opt("bulkhead-agent")
            .await?
            .is_none()
    );
    assert!(
        Api::<ClusterRoleBinding>::all(member.clone())
            .get_opt("bulkhead-agent")
            .await?
            .is_none()
    );
    assert!(
        Api::<Namespace>::all(member.clone())
            .get_opt("bulkhead-system")
            .await?
            .is_none()
    );
    assert!(
        Api::<MemberCluster>::all(hub)
            .get_opt("north")
            .await?
            .is_none()
    );
    Ok(())
}

/// Deletes a hand-made MemberCluster and its Secret from the hub when the test ends,
/// even when it fails.
struct HandMadeMember {
    lab: Lab,
    name: &'static str,
}

impl Drop for HandMadeMember {
    fn drop(&mut self) {
        let name = self.name;
        support::cleanup_blocking(vec![self.lab.kubeconfig("hub")], move |hub| async move {
            let _ = Api::<MemberCluster>::all(hub.clone())
                .delete(name, &DeleteParams::default())
                .await;
            let _ = Api::<Secret>::namespaced(hub, "bulkhead-system")
                .delete(&format!("member-{name}"), &DeleteParams::default())
                .await;
        });
    }
}

#[tokio::test]
async fn the_hub_refuses_a_second_member_cluster_for_the_same_cluster() -> Result<()> {
    use bulkhead_e2e::federation::{Federation, config_maps, policies};
    use serde_json::json;

    let federation = Federation::start("membership-dup", &[]).await?;
    let hub = federation.hub.clone();
    let members_api = Api::<MemberCluster>::all(hub.clone());
    let secrets = Api::<Secret>::namespaced(hub.clone(), "bulkhead-system");
    let probe_interval = Duration::from_secs(
        members_api
            .get("east")
            .await?
            .spec
            .probe
            .interval_seconds
            .try_into()?,
    );

    // Two ConfigMaps in east: one placed there only, one on every cluster.
    for (name, placement) in [
        (
            "pinned",
            json!({"clusterAffinity": {"clusterNames": ["east"]}}),
        ),
        ("everywhere", json!({})),
    ] {
        federation
            .apply(
                &policies(),
                federation.policy(
                    name,
                    json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": name}]),
                    placement,
                    json!({}),
                ),
            )
            .await?;
        federation
            .apply(
                &config_maps(),
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"owner": "hub"}}),
            )
            .await?;
    }
    let mut east_uids = vec![];
    for (name, count) in [("pinned", 1), ("everywhere", 3)] {
        let copies = federation
            .wait_copies(
                &config_maps(),
                name,
                &format!("in {count} member(s)"),
                Duration::from_secs(60),
                |c| c.len() == count && c.iter().all(|c| c.managed),
            )
            .await?;
        let east = copies
            .iter()
            .find(|c| c.cluster == "east")
            .with_context(|| format!("{name} in east: {copies:?}"))?;
        east_uids.push((name, east.uid.clone()));
    }

    // By hand, as `kubectl apply` would (`bulkhead join` refuses this itself): a second
    // MemberCluster for east's cluster, with a copy of east's kubeconfig Secret. No
    // cluster-id label either: the hub must find out from the cluster itself.
    let _hand_made = HandMadeMember {
        lab: federation.lab.clone(),
        name: "east-again",
    };
    let east_secret = secrets.get("member-east").await?;
    let copy: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "member-east-again", "namespace": "bulkhead-system"},
        "data": east_secret.data,
    }))?;
    secrets.create(&PostParams::default(), &copy).await?;
    let east = members_api.get("east").await?;
    let again: MemberCluster = serde_json::from_value(json!({
        "apiVersion": "federation.example.com/v1alpha1", "kind": "MemberCluster",
        "metadata": {"name": "east-again"},
        "spec": {
            "secretRef": {"namespace": "bulkhead-system", "name": "member-east-again"},
            "zone": east.spec.zone,
            "region": east.spec.region,
            "probe": east.spec.probe,
        }
    }))?;
    members_api
        .patch(
            "east-again",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&again),
        )
        .await?;

    let refused = federation
        .wait_member_ready("east-again", false, Duration::from_secs(60))
        .await?;
    let condition = refused
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .cloned()
        .context("Ready condition")?;
    eprintln!(
        "east-again: Ready={} {}: {}",
        condition.status, condition.reason, condition.message
    );
    assert_eq!(condition.reason, "DuplicateCluster", "{condition:?}");
    assert!(
        condition
            .message
            .split(|c: char| !(c.is_alphanumeric() || c == '-'))
            .any(|word| word == "east"),
        "the message names east: {}",
        condition.message
    );

    // The hub goes on deciding with east-again refused: east stays Ready and keeps its
    // copies (same UIDs) through at least two probe intervals, with every template
    // reconciled again (a relist of the members' copies queues every template) and the
    // hub settled.
    let watched = Instant::now();
    let reconciles_before = federation
        .hub_metric("bulkhead_federation_reconciles_total")
        .await?
        .context("no reconciles metric")?;
    let check_east = || async {
        let east = members_api.get("east").await?;
        anyhow::ensure!(ready(&east).0 == "True", "east: {:?}", ready(&east));
        let again = members_api.get("east-again").await?;
        anyhow::ensure!(
            ready(&again) == ("False".into(), "DuplicateCluster".into()),
            "east-again: {:?}",
            ready(&again)
        );
        for (name, uid) in &east_uids {
            let copies = federation
                .copies_in(&["east"], &config_maps(), name)
                .await?;
            anyhow::ensure!(
                copies.len() == 1 && &copies[0].uid == uid,
                "{name} in east: {copies:?}, was {uid}"
            );
        }
        Ok::<_, anyhow::Error>(())
    };
    loop {
        check_east().await?;
        let reconciles = federation
            .hub_metric("bulkhead_federation_reconciles_total")
            .await?
            .unwrap_or_default();
        if watched.elapsed() >= 2 * probe_interval && reconciles > reconciles_before {
            federation.wait_settled(Duration::from_secs(60)).await?;
            check_east().await?;
            eprintln!(
                "east kept its copies for {:?} ({} reconciles) with east-again refused",
                watched.elapsed(),
                reconciles - reconciles_before
            );
            break;
        }
        anyhow::ensure!(
            watched.elapsed() < Duration::from_secs(120),
            "no template reconciled in 120 s ({reconciles_before} -> {reconciles})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for name in ["pinned", "everywhere"] {
        let binding = federation
            .binding(&format!("{name}-configmap"))
            .await?
            .with_context(|| format!("binding {name}-configmap"))?;
        eprintln!(
            "binding {name}-configmap with east-again refused:\n{}",
            serde_yaml::to_string(&binding)?
        );
        // A refused duplicate is not a cluster of its own: the hub reads nothing through
        // it, so no binding records a copy (or a cleanup) there.
        let status = binding.status.clone().unwrap_or_default();
        assert!(
            status.clusters.iter().all(|r| r.name != "east-again")
                && status.decisions.iter().all(|d| d.cluster != "east-again"),
            "binding {name}-configmap mentions the refused duplicate"
        );
    }

    // Removing the duplicate (not an unjoin with cleanup) deletes nothing in east either.
    members_api
        .delete("east-again", &DeleteParams::default())
        .await?;
    secrets
        .delete("member-east-again", &DeleteParams::default())
        .await?;
    wait_for("east-again to go", Duration::from_secs(30), || async {
        match members_api.get_opt("east-again").await {
            Ok(None) => Check::Done(()),
            Ok(Some(_)) => Check::Waiting("still there".into()),
            Err(e) => Check::Waiting(e.to_string()),
        }
    })
    .await?;
    federation.wait_settled(Duration::from_secs(120)).await?;
    for (name, uid) in &east_uids {
        let copies = federation
            .copies_in(&["east"], &config_maps(), name)
            .await?;
        assert!(
            copies.len() == 1 && &copies[0].uid == uid,
            "{name} in east after east-again was deleted: {copies:?}, was {uid}"
        );
    }
    assert_eq!(ready(&members_api.get("east").await?).0, "True");

    // Nothing is left waiting for the duplicate: no binding row for it, and deleting the
    // templates removes east's copies and then the templates (no cleanup stays pending
    // for a cluster that is gone).
    for (name, _) in &east_uids {
        federation
            .wait_binding(
                &format!("{name}-configmap"),
                "no row for east-again",
                Duration::from_secs(60),
                |b| {
                    let rows = &b.status.as_ref()?.clusters;
                    rows.iter().all(|r| r.name != "east-again").then_some(())
                },
            )
            .await?;
        federation
            .api("hub", &config_maps())
            .delete(name, &DeleteParams::default())
            .await?;
    }
    for (name, _) in &east_uids {
        federation
            .wait_copies(
                &config_maps(),
                name,
                "gone everywhere",
                Duration::from_secs(60),
                |c| c.is_empty(),
            )
            .await?;
        wait_for(
            &format!("the template {name} to go"),
            Duration::from_secs(60),
            || async {
                match federation.api("hub", &config_maps()).get_opt(name).await {
                    Ok(None) => Check::Done(()),
                    Ok(Some(t)) => {
                        Check::Waiting(format!("finalizers {:?}", t.metadata.finalizers))
                    }
                    Err(e) => Check::Waiting(e.to_string()),
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// The token the hub holds for `member`, read from its Secret on the hub.
async fn stored_token(hub: &Client, member: &str) -> Result<String> {
    let secret = Api::<Secret>::namespaced(hub.clone(), "bulkhead-system")
        .get(&format!("member-{member}"))
        .await?;
    let text = secret
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig"))
        .map(|b| String::from_utf8_lossy(&b.0).to_string())
        .context("no kubeconfig in the Secret")?;
    bulkhead::hub::membership::tokens::kubeconfig_token(&text).context("no token in the kubeconfig")
}

#[tokio::test]
async fn the_hub_renews_its_member_token_before_it_expires() -> Result<()> {
    use bulkhead_e2e::federation::Federation;

    // Renew after 1% of a token's lifetime: a 600 s token (the shortest a member
    // grants) is renewed after 6 s; the others (one year) are left alone.
    let federation = Federation::start(
        "membership-token",
        &[
            "--token-check-interval",
            "1s",
            "--token-renew-fraction",
            "0.01",
        ],
    )
    .await?;
    let hub = federation.hub.clone();
    let west_before = stored_token(&hub, "west").await?;
    let output = bulkhead_e2e::hub_support::join(
        &federation.lab,
        "east",
        "zone-a",
        "region-1",
        &[
            "--probe-interval-seconds",
            "1",
            "--probe-timeout-seconds",
            "1",
            "--token-expiration-seconds",
            "600",
        ],
    )?;
    anyhow::ensure!(
        output.status.success(),
        "re-join east with a 600 s token failed"
    );
    let short = stored_token(&hub, "east").await?;
    let lifetime = bulkhead::hub::membership::tokens::token_lifetime(&short).context("a JWT")?;
    assert!(lifetime.seconds() <= 3600, "{lifetime:?}");

    let started = Instant::now();
    let members = Api::<MemberCluster>::all(hub.clone());
    let renewed = wait_for(
        "east's token renewed by the hub",
        Duration::from_secs(90),
        || async {
            let token = match stored_token(&hub, "east").await {
                Ok(token) => token,
                Err(e) => return Check::Waiting(e.to_string()),
            };
            let condition = members.get("east").await.ok().and_then(|m| {
                m.status
                    .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "TokenRenewal"))
            });
            match condition {
                Some(c)
                    if token != short && c.status == "True" && c.message.contains("renewed") =>
                {
                    Check::Done((token, c.message))
                }
                other => Check::Waiting(format!(
                    "token changed: {}, condition {:?}",
                    token != short,
                    other.map(|c| (c.status, c.reason, c.message))
                )),
            }
        },
    )
    .await?;
    eprintln!(
        "east's token renewed {:?} after the short one was stored: {}",
        started.elapsed(),
        renewed.1
    );
    let new_lifetime =
        bulkhead::hub::membership::tokens::token_lifetime(&renewed.0).context("a JWT")?;
    eprintln!("short token {lifetime:?}, renewed {new_lifetime:?}");
    assert!(
        new_lifetime.expires_at > lifetime.expires_at,
        "a later expiry"
    );
    assert!(
        new_lifetime.seconds() <= lifetime.seconds() + 60,
        "the same lifetime was asked for: {lifetime:?} -> {new_lifetime:?}"
    );
    // The member stays Ready on the renewed token (the registry rebuilt its clients).
    federation
        .wait_members_ready(Duration::from_secs(30))
        .await?;
    assert!(
        federation
            .hub_counter("bulkhead_member_token_renewals_total", "")
            .await?
            >= 1.0
    );
    assert_eq!(
        stored_token(&hub, "west").await?,
        west_before,
        "a token far from its renewal time is left alone"
    );
    Ok(())
}

/// (group, resource, name, verb), one per permission a rule grants.
type Permission = (String, String, String, String);

fn expand(
    rules: &[k8s_openapi::api::rbac::v1::PolicyRule],
) -> std::collections::BTreeSet<Permission> {
    let mut out = std::collections::BTreeSet::new();
    for rule in rules {
        let names = rule.resource_names.clone().unwrap_or_default();
        let names = if names.is_empty() {
            vec![String::new()]
        } else {
            names
        };
        for group in rule.api_groups.as_deref().unwrap_or_default() {
            for resource in rule.resources.as_deref().unwrap_or_default() {
                for name in &names {
                    for verb in &rule.verbs {
                        out.insert((group.clone(), resource.clone(), name.clone(), verb.clone()));
                    }
                }
            }
        }
    }
    out
}

/// What the member says the hub's own token may do in `namespace` (cluster-wide rules
/// included): a SelfSubjectRulesReview made with the kubeconfig the hub holds.
async fn hub_effective_rules(
    hub: &Client,
    member: &str,
    namespace: &str,
) -> Result<std::collections::BTreeSet<Permission>> {
    let secret = Api::<Secret>::namespaced(hub.clone(), "bulkhead-system")
        .get(&format!("member-{member}"))
        .await?;
    let text = secret
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig"))
        .map(|b| String::from_utf8_lossy(&b.0).to_string())
        .context("no kubeconfig in the Secret")?;
    effective_rules(kube::config::Kubeconfig::from_yaml(&text)?, namespace).await
}

/// What the member says the agent's service account may do in `namespace`, with a
/// token minted for it (the agent's own credentials, as its pod would have them).
async fn agent_effective_rules(
    lab: &Lab,
    member_admin: &Client,
    member: &str,
    namespace: &str,
) -> Result<std::collections::BTreeSet<Permission>> {
    let request = TokenRequest {
        spec: Some(k8s_openapi::api::authentication::v1::TokenRequestSpec {
            expiration_seconds: Some(600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(member_admin.clone(), "bulkhead-system")
        .create_token_request("bulkhead-agent", &PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .context("no token")?;
    let mut kubeconfig = kube::config::Kubeconfig::read_from(lab.inside_kubeconfig(member))?;
    for user in &mut kubeconfig.auth_infos {
        user.auth_info = Some(kube::config::AuthInfo {
            token: Some(token.clone().into()),
            ..Default::default()
        });
    }
    effective_rules(kubeconfig, namespace).await
}

async fn effective_rules(
    kubeconfig: kube::config::Kubeconfig,
    namespace: &str,
) -> Result<std::collections::BTreeSet<Permission>> {
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    let client = Client::try_from(config)?;
    use k8s_openapi::api::authorization::v1::{SelfSubjectRulesReview, SelfSubjectRulesReviewSpec};
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec {
            namespace: Some(namespace.into()),
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectRulesReview>::all(client)
        .create(&PostParams::default(), &review)
        .await?;
    let status = answer
        .status
        .context("no status in the SelfSubjectRulesReview")?;
    let rules: Vec<k8s_openapi::api::rbac::v1::PolicyRule> = status
        .resource_rules
        .into_iter()
        .map(|r| k8s_openapi::api::rbac::v1::PolicyRule {
            api_groups: r.api_groups,
            resources: r.resources,
            resource_names: r.resource_names,
            verbs: r.verbs,
            non_resource_urls: None,
        })
        .collect();
    Ok(expand(&rules))
}

/// Kubernetes' own system:basic-user grants to every authenticated user.
fn basic_user() -> std::collections::BTreeSet<Permission> {
    [
        ("authorization.k8s.io", "selfsubjectaccessreviews"),
        ("authorization.k8s.io", "selfsubjectrulesreviews"),
        ("authentication.k8s.io", "selfsubjectreviews"),
    ]
    .into_iter()
    .map(|(group, resource)| {
        (
            group.into(),
            resource.into(),
            String::new(),
            "create".into(),
        )
    })
    .collect()
}

fn assert_same_permissions(
    who: &str,
    effective: &std::collections::BTreeSet<Permission>,
    granted: &std::collections::BTreeSet<Permission>,
) {
    let unexpected: Vec<_> = effective.difference(granted).collect();
    let missing: Vec<_> = granted.difference(effective).collect();
    assert!(
        unexpected.is_empty() && missing.is_empty(),
        "{who}'s effective permissions differ from the code's roles (docs/clusters.md): unexpected {unexpected:?}, missing {missing:?}"
    );
}
