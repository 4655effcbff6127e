//! The database part of the chaos run: a MyDatabase with real PostgreSQL (3 instances,
//! `synchronous: 1`) in east, run by an agent of its own that the run's hubs fence, a
//! client per server that records every write it was told succeeded, and database faults
//! of their own (the primary's instance API cut off, its postmaster killed, the whole
//! instance frozen) thrown while the main nemesis partitions members and isolates hubs.
//! After the last heal the database must take writes again, hold every acknowledged
//! write, and no two servers may have acknowledged writes at the same time.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bulkhead::api::MyDatabase;
use kube::api::PostParams;
use kube::{Api, Client};

use super::random::SeededRandom;
use super::timeline::Timeline;
use crate::agent_support::AgentProcess;
use crate::lab::{self, ClusterInfo, Lab, runner};
use crate::postgres_support::{
    Ack, AckLog, AppCredentials, app_credentials, connect, endpoints, freeze, kill_postmaster,
    rows_and_lost, taken_beside, thaw, wait_streaming,
};
use crate::support::TestNamespace;

/// The member the database runs in.
pub const MEMBER: &str = "east";
const NAME: &str = "orders";
/// Two servers' acknowledgements this close (and interleaved) are two writers at once.
const BESIDE_WINDOW: Duration = Duration::from_secs(1);

/// The verdict on the database.
#[derive(Debug, Default)]
pub struct DatabaseVerdict {
    pub checked: usize,
    pub lost: Vec<i32>,
    pub beside: Vec<Ack>,
    /// Why the database was not writable with every row after the last heal, if it was not.
    pub not_converged: Option<String>,
    pub faults: usize,
}

impl DatabaseVerdict {
    /// The summary line the run ends with.
    pub fn summary(&self) -> String {
        format!(
            "database: {} acknowledged writes checked, {} lost, {} taken beside another primary ({} database faults){}",
            self.checked,
            self.lost.len(),
            self.beside.len(),
            self.faults,
            self.not_converged
                .as_ref()
                .map(|why| format!("; NOT writable after the last heal: {why}"))
                .unwrap_or_default()
        )
    }

    /// The problems that fail the run.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = vec![];
        if !self.lost.is_empty() {
            problems.push(format!(
                "database: acknowledged writes lost (synchronous: 1): {:?}",
                self.lost
            ));
        }
        if !self.beside.is_empty() {
            problems.push(format!(
                "database: writes taken beside another primary: {:?}",
                self.beside.iter().take(20).collect::<Vec<_>>()
            ));
        }
        if let Some(why) = &self.not_converged {
            problems.push(format!("database: not writable after the last heal: {why}"));
        }
        problems
    }
}

/// The running database, its agent and its client.
pub struct DatabaseRun {
    _agent: AgentProcess,
    lab: Lab,
    namespace: TestNamespace,
    client: Client,
    credentials: AppCredentials,
    info: &'static ClusterInfo,
    log: AckLog,
    frozen: std::sync::Mutex<Vec<i32>>,
}

impl DatabaseRun {
    /// Starts the database and its client (a harness failure when it does not come up).
    pub async fn start(lab: &Lab, lease_seconds: u64, timeline: &Timeline) -> Result<Self> {
        let info = lab::member(MEMBER)?;
        lab.install_crds(MEMBER, &lab::crd_dir()).await?;
        let namespace = TestNamespace::create(lab, "chaos-db", &[MEMBER]).await?;
        let client = lab.inside_client(MEMBER).await?;
        let mut args = runner::agent_args();
        args.extend([
            "--lease-duration-seconds".to_string(),
            lease_seconds.to_string(),
            "--unfence-after-seconds".to_string(),
            "2".to_string(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let agent = AgentProcess::start(lab, MEMBER, &namespace.name, &args)?;
        let database: MyDatabase = serde_json::from_value(serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "MyDatabase",
            "metadata": {"name": NAME},
            "spec": {"replicas": 3, "version": "15", "storage": {"size": "1Gi"},
                     "topology": {"synchronous": 1}}
        }))?;
        Api::<MyDatabase>::namespaced(client.clone(), &namespace.name)
            .create(&PostParams::default(), &database)
            .await?;
        let primary = wait_streaming(&client, &namespace.name, NAME)
            .await
            .with_context(|| format!("the chaos database: agent log:\n{}", agent.log_tail()))?;
        let credentials = app_credentials(&client, &namespace.name, NAME).await?;
        connect(primary, &credentials)
            .await?
            .batch_execute("CREATE TABLE IF NOT EXISTS orders (id integer PRIMARY KEY)")
            .await?;
        let servers = endpoints(&client, &namespace.name, &format!("{NAME}-r")).await?;
        timeline.note(format!(
            "database {}/{NAME}: 3 instances ({servers:?}), synchronous 1, primary {primary}; a client per server writes every 100 ms",
            namespace.name
        ));
        let log = AckLog::start(&servers, &credentials, Instant::now());
        Ok(DatabaseRun {
            _agent: agent,
            lab: lab.clone(),
            namespace,
            client,
            credentials,
            info,
            log,
            frozen: std::sync::Mutex::default(),
        })
    }

    /// The primary's pod and address as `-rw` selects it now.
    async fn primary(&self) -> Option<(String, Ipv4Addr)> {
        let address = *endpoints(&self.client, &self.namespace.name, &format!("{NAME}-rw"))
            .await
            .ok()?
            .first()?;
        let database = Api::<MyDatabase>::namespaced(self.client.clone(), &self.namespace.name)
            .get(NAME)
            .await
            .ok()?;
        let pod = database.status?.primary?;
        Some((pod, address))
    }

    /// Throws database faults until `until`, one every 15 to 30 s (drawn from `seed`),
    /// each at the primary of that moment. Returns how many were thrown.
    pub async fn nemesis(&self, seed: u64, until: Instant, timeline: &Timeline) -> usize {
        let mut random = SeededRandom::new(seed ^ 0xdb);
        let mut thrown = 0;
        loop {
            let pause = Duration::from_secs(15 + random.next_u64() % 16);
            if Instant::now() + pause + Duration::from_secs(20) > until {
                return thrown;
            }
            tokio::time::sleep(pause).await;
            // The run's other faults fence the database often (east cut off, the leading
            // hub killed): the fault waits for a primary that takes writes, up to 30 s.
            let mut primary = None;
            for _ in 0..30 {
                primary = self.primary().await;
                if primary.is_some() || Instant::now() + Duration::from_secs(20) > until {
                    break;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let Some((pod, address)) = primary else {
                timeline.note("database fault skipped: no primary behind -rw for 30 s");
                continue;
            };
            let ns = self.namespace.name.as_str();
            let lasting = Duration::from_secs(10 + random.next_u64() % 11);
            let thrown_now = match random.next_u64() % 3 {
                0 => {
                    timeline.note(format!(
                        "database fault: {pod}'s instance API ({address}:8000) cut off for {} s",
                        lasting.as_secs()
                    ));
                    let cut = lab::firewall::cut_port(MEMBER, address, 8000);
                    tokio::time::sleep(lasting).await;
                    let healed = drop_port_rule(address);
                    cut.and(healed)
                }
                1 => kill_postmaster(&self.lab, self.info, ns, &pod).map(|pid| {
                    timeline.note(format!("database fault: {pod}'s postmaster {pid} killed"));
                }),
                _ => match freeze(&self.lab, self.info, ns, &pod) {
                    Ok(pids) => {
                        timeline.note(format!(
                            "database fault: {pod} frozen (SIGSTOP) for {} s",
                            lasting.as_secs()
                        ));
                        self.frozen
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .extend(&pids);
                        tokio::time::sleep(lasting).await;
                        thaw(&pids);
                        self.frozen
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .clear();
                        timeline.note(format!("database fault over: {pod} thawed"));
                        Ok(())
                    }
                    Err(error) => Err(error),
                },
            };
            match thrown_now {
                Ok(()) => thrown += 1,
                Err(error) => {
                    timeline.note(format!("database fault not thrown: {error:#}"));
                }
            }
        }
    }

    /// After the last heal: the database must take writes again within `converge`, hold
    /// every acknowledged write, and show no two writers.
    pub async fn finish(
        self,
        converge: Duration,
        faults: usize,
        timeline: &Timeline,
    ) -> DatabaseVerdict {
        thaw(&self.frozen.lock().unwrap_or_else(|p| p.into_inner()));
        let ns = self.namespace.name.clone();
        let writable = tokio::time::timeout(converge, async {
            loop {
                if let Ok(primary) = wait_streaming(&self.client, &ns, NAME).await
                    && let Ok(session) = connect(primary, &self.credentials).await
                    && session
                        .batch_execute("INSERT INTO orders VALUES (-1) ON CONFLICT DO NOTHING")
                        .await
                        .is_ok()
                {
                    return primary;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
        .await;
        // A last second of writes, then the client stops.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let acks = self.log.stop().await.unwrap_or_default();
        let mut verdict = DatabaseVerdict {
            checked: acks.len(),
            beside: taken_beside(&acks, BESIDE_WINDOW),
            faults,
            ..Default::default()
        };
        match writable {
            Err(_) => {
                verdict.not_converged = Some(format!(
                    "no write taken within {} s of the last heal",
                    converge.as_secs()
                ));
            }
            Ok(primary) => {
                let ids: Vec<i32> = acks.iter().map(|a| a.id).collect();
                match rows_and_lost(primary, &self.credentials, &ids).await {
                    Ok((_, lost)) => verdict.lost = lost,
                    Err(error) => {
                        verdict.not_converged =
                            Some(format!("the rows could not be read: {error:#}"))
                    }
                }
            }
        }
        timeline.note(verdict.summary());
        verdict
    }
}

/// Removes the rule [`lab::firewall::cut_port`] added for `address`:8000 only (the main
/// nemesis may hold other rules for the member).
fn drop_port_rule(address: Ipv4Addr) -> Result<()> {
    lab::firewall::uncut_port(MEMBER, address, 8000)
}
