//! Real PostgreSQL in the lab: a MyDatabase's credentials and addresses, a real client
//! (tokio-postgres), and freezing an instance as a hung node would.

use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bulkhead::api::MyDatabase;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::lab::{ClusterInfo, Lab, runner};
use crate::{Check, wait_for};

/// The application's credentials from the database's `<name>-app` Secret.
#[derive(Clone, Debug)]
pub struct AppCredentials {
    pub user: String,
    pub password: String,
    pub dbname: String,
}

pub async fn app_credentials(client: &Client, ns: &str, name: &str) -> Result<AppCredentials> {
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get(&format!("{name}-app"))
        .await
        .with_context(|| format!("reading the Secret {name}-app"))?;
    let data = secret.data.unwrap_or_default();
    let field = |key: &str| -> Result<String> {
        Ok(String::from_utf8(
            data.get(key)
                .with_context(|| format!("{name}-app has no {key}"))?
                .0
                .clone(),
        )?)
    };
    Ok(AppCredentials {
        user: field("username")?,
        password: field("password")?,
        dbname: field("dbname")?,
    })
}

/// A connection as the application's user, to PostgreSQL at `address`.
pub async fn connect(
    address: Ipv4Addr,
    credentials: &AppCredentials,
) -> Result<tokio_postgres::Client> {
    let mut config = tokio_postgres::Config::new();
    config
        .host(address.to_string())
        .port(5432)
        .user(&credentials.user)
        .password(&credentials.password)
        .dbname(&credentials.dbname)
        .connect_timeout(Duration::from_secs(3));
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to {address}:5432"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The ready endpoints (pod IPs: inside addresses) of a Service.
pub async fn endpoints(client: &Client, ns: &str, service: &str) -> Result<Vec<Ipv4Addr>> {
    Ok(
        crate::agent_support::ready_endpoint_addresses(client, ns, service)
            .await?
            .iter()
            .filter_map(|a| a.parse().ok())
            .collect(),
    )
}

/// Waits until the database's primary is available and its standbys stream, and returns
/// the `-rw` Service's endpoint.
pub async fn wait_streaming(client: &Client, ns: &str, name: &str) -> Result<Ipv4Addr> {
    let api: Api<MyDatabase> = Api::namespaced(client.clone(), ns);
    wait_for(
        &format!("MyDatabase {name}: primary available, standbys streaming, -rw has it"),
        Duration::from_secs(120),
        || {
            let api = api.clone();
            async move {
                let db = match api.get(name).await {
                    Ok(db) => db,
                    Err(e) => return Check::Waiting(e.to_string()),
                };
                let status = db.status.unwrap_or_default();
                let condition = |type_: &str| {
                    bulkhead::api::find_condition(&status.conditions, type_)
                        .map(|c| (c.status == "True", c.message.clone()))
                        .unwrap_or((false, "not reported".into()))
                };
                let (primary, primary_message) = condition("PrimaryAvailable");
                let (streaming, streaming_message) = condition("ReplicationHealthy");
                let rw = endpoints(client, ns, &format!("{name}-rw")).await.unwrap_or_default();
                let ready = status.instances.len() == db.spec.replicas as usize
                    && status.instances.iter().all(|i| i.ready);
                if primary && streaming && ready && rw.len() == 1 {
                    Check::Done(rw[0])
                } else {
                    Check::Waiting(format!(
                        "PrimaryAvailable {primary} ({primary_message}); ReplicationHealthy {streaming} ({streaming_message}); {} of {} instances ready; -rw endpoints {rw:?}",
                        status.instances.iter().filter(|i| i.ready).count(),
                        db.spec.replicas
                    ))
                }
            }
        },
    )
    .await
}

/// The SQLSTATE of a failed statement, if the server sent one.
pub fn sqlstate(error: &tokio_postgres::Error) -> Option<String> {
    error.code().map(|c| c.code().to_string())
}

/// The processes of one instance (its `bulkhead instance`, its postmaster and the
/// postmaster's children), found by the pod's data directory on the lab host.
fn instance_processes(lab: &Lab, info: &ClusterInfo, ns: &str, pod: &str) -> Result<Vec<i32>> {
    let pgdata = lab
        .root
        .join(info.name)
        .join("claims")
        .join(ns)
        .join(format!("data-{pod}"))
        .join("pgdata");
    let marker = pgdata.display().to_string();
    let mut found = vec![];
    for entry in std::fs::read_dir("/proc")? {
        let Ok(pid) = entry?.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let command = String::from_utf8_lossy(&raw).replace('\0', " ");
        if command.contains(&marker) {
            found.push(pid);
        }
    }
    let postmasters = found.clone();
    for entry in std::fs::read_dir("/proc")? {
        let Ok(pid) = entry?.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let parent: Option<i32> = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok());
        if parent.is_some_and(|p| postmasters.contains(&p)) && !found.contains(&pid) {
            found.push(pid);
        }
    }
    if found.is_empty() {
        bail!("no process of {ns}/{pod} runs (data directory {marker})");
    }
    Ok(found)
}

/// Kills (SIGKILL) an instance's postmaster (its children die with it; the instance
/// manager restarts the server, as a kubelet restarts a container).
pub fn kill_postmaster(lab: &Lab, info: &ClusterInfo, ns: &str, pod: &str) -> Result<i32> {
    for pid in instance_processes(lab, info, ns, pod)? {
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let program = raw.split(|b| *b == 0).next().unwrap_or_default();
        if String::from_utf8_lossy(program).ends_with("/postgres") {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .with_context(|| format!("killing {ns}/{pod}'s postmaster {pid}"))?;
            return Ok(pid);
        }
    }
    bail!("{ns}/{pod} runs no postmaster")
}

/// Stops (SIGSTOP) every process of an instance: a hung node, as its agent sees it.
pub fn freeze(lab: &Lab, info: &ClusterInfo, ns: &str, pod: &str) -> Result<Vec<i32>> {
    let pids = instance_processes(lab, info, ns, pod)?;
    for pid in &pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGSTOP,
        );
    }
    Ok(pids)
}

/// Resumes processes stopped by [`freeze`].
pub fn thaw(pids: &[i32]) {
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGCONT,
        );
    }
}

/// The address a client outside the member's zone uses for a pod IP.
pub fn outside(pod_ip: Ipv4Addr) -> Result<Ipv4Addr> {
    runner::outside_of(pod_ip)
        .with_context(|| format!("{pod_ip} is not a lab database pod's address"))
}

/// Inserts into table `orders` through Service `service` until `stop`, one id after
/// another from `first`, following the Service's endpoint as it moves (`acked` counts the
/// acknowledged ones as they come); returns the ids acknowledged and the longest time
/// without one.
#[allow(clippy::too_many_arguments)]
pub async fn write_through(
    client: Client,
    ns: String,
    service: String,
    credentials: AppCredentials,
    first: i32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    acked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> (Vec<i32>, Duration) {
    let mut acknowledged = vec![];
    let mut longest = Duration::ZERO;
    let mut last = std::time::Instant::now();
    let mut id = first;
    let mut writer: Option<tokio_postgres::Client> = None;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        if writer.is_none()
            && let Ok([address]) = endpoints(&client, &ns, &service).await.as_deref()
        {
            writer = connect(*address, &credentials).await.ok();
        }
        let Some(w) = writer.as_ref() else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        match tokio::time::timeout(
            Duration::from_secs(5),
            w.execute("INSERT INTO orders VALUES ($1)", &[&id]),
        )
        .await
        {
            Ok(Ok(_)) => {
                acknowledged.push(id);
                acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                longest = longest.max(last.elapsed());
                last = std::time::Instant::now();
            }
            // Refused or cut: the id is not used again (it may have been committed).
            _ => writer = None,
        }
        id += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (acknowledged, longest)
}

/// The ids in table `orders` of the server at `address`, and those of `acknowledged` it
/// does not have (acknowledged writes lost).
pub async fn rows_and_lost(
    address: Ipv4Addr,
    credentials: &AppCredentials,
    acknowledged: &[i32],
) -> Result<(std::collections::BTreeSet<i32>, Vec<i32>)> {
    let rows: std::collections::BTreeSet<i32> = connect(address, credentials)
        .await?
        .query("SELECT id FROM orders", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let lost = acknowledged
        .iter()
        .filter(|id| !rows.contains(id))
        .copied()
        .collect();
    Ok((rows, lost))
}

/// Every write a client was told succeeded: when, and which server took it.
#[derive(Clone, Copy, Debug)]
pub struct Ack {
    pub at: Duration,
    pub server: Ipv4Addr,
    pub id: i32,
}

/// A client per server at `servers`, each holding its session (opened again when the
/// server ends it), inserting a new id every 100 ms and recording every acknowledgement.
pub struct AckLog {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Ack>>>,
}

impl AckLog {
    pub fn start(
        servers: &[Ipv4Addr],
        credentials: &AppCredentials,
        origin: std::time::Instant,
    ) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tasks = servers
            .iter()
            .enumerate()
            .map(|(n, server)| {
                let (stop, credentials, server) = (stop.clone(), credentials.clone(), *server);
                tokio::spawn(async move {
                    let mut acks = vec![];
                    let mut session: Option<tokio_postgres::Client> = None;
                    let mut id = 500_000 + 100_000 * n as i32;
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if session.as_ref().is_none_or(|s| s.is_closed()) {
                            session = match tokio::time::timeout(
                                Duration::from_secs(1),
                                connect(server, &credentials),
                            )
                            .await
                            {
                                Ok(Ok(s)) => Some(s),
                                _ => None,
                            };
                        }
                        let Some(client) = session.as_ref() else {
                            continue;
                        };
                        id += 1;
                        let written = tokio::time::timeout(
                            Duration::from_secs(2),
                            client.batch_execute(&format!(
                                "SET default_transaction_read_only = off; INSERT INTO orders VALUES ({id})"
                            )),
                        )
                        .await;
                        if let Ok(Ok(())) = written {
                            acks.push(Ack {
                                at: origin.elapsed(),
                                server,
                                id,
                            });
                        }
                    }
                    acks
                })
            })
            .collect();
        AckLog { stop, tasks }
    }

    /// Stops every client: every acknowledgement, in time order.
    pub async fn stop(self) -> Result<Vec<Ack>> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut acks = vec![];
        for task in self.tasks {
            acks.extend(task.await?);
        }
        acks.sort_by_key(|a| a.at);
        Ok(acks)
    }
}

/// The acknowledgements taken by a server while another one was taking them too: an ack
/// of server S at t counts when another server acknowledged a write after an earlier
/// ack of S that lies within `window` before t (S took writes before and after the other,
/// that close together). A planned or forced hand-over back to S takes far longer than
/// `window` (a demotion, a lease, a promotion), so only two writers at once are counted.
pub fn taken_beside(acks: &[Ack], window: Duration) -> Vec<Ack> {
    use std::collections::{BTreeMap, VecDeque};
    // Per server: its acks within the window, and the time of its latest ack.
    let mut recent: BTreeMap<Ipv4Addr, VecDeque<Duration>> = BTreeMap::new();
    let mut latest: BTreeMap<Ipv4Addr, Duration> = BTreeMap::new();
    let mut beside = vec![];
    for ack in acks {
        let own = recent.entry(ack.server).or_default();
        while own
            .front()
            .is_some_and(|at| ack.at.saturating_sub(*at) > window)
        {
            own.pop_front();
        }
        let other = latest
            .iter()
            .filter(|(server, _)| **server != ack.server)
            .map(|(_, at)| *at)
            .max();
        if let (Some(other), Some(first_own)) = (other, own.front())
            && *first_own < other
        {
            beside.push(*ack);
        }
        own.push_back(ack.at);
        latest.insert(ack.server, ack.at);
    }
    beside
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(ms: u64, server: u8) -> Ack {
        Ack {
            at: Duration::from_millis(ms),
            server: Ipv4Addr::new(10, 0, 0, server),
            id: ms as i32,
        }
    }

    #[test]
    fn only_writes_taken_while_another_server_takes_them_too_are_beside() {
        let window = Duration::from_secs(1);
        // A hand-over (1 to 2), and much later back to 1: no two writers.
        let handed = [
            ack(0, 1),
            ack(100, 1),
            ack(4000, 2),
            ack(4100, 2),
            ack(20000, 1),
        ];
        assert!(taken_beside(&handed, window).is_empty());
        // 1 goes on writing after 2 took its first: 1's later acks are beside.
        let both = [
            ack(0, 1),
            ack(100, 2),
            ack(200, 1),
            ack(300, 2),
            ack(400, 1),
        ];
        let beside: Vec<u64> = taken_beside(&both, window)
            .iter()
            .map(|a| a.at.as_millis() as u64)
            .collect();
        assert_eq!(beside, [200, 300, 400]);
    }
}
