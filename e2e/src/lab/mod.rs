//! The local federation lab: a hub and three member clusters built from real Kubernetes
//! control planes running as processes on this machine (see `docs/lab.md`).
//!
//! - hub: etcd + kube-apiserver + kube-controller-manager with only the namespace and
//!   garbage-collector controllers, so templates stored there are never executed;
//! - members `east`, `west`, `north` (zones `zone-a`, `zone-b`, `zone-c`): etcd +
//!   kube-apiserver + kube-controller-manager + kube-scheduler + kwok with fake nodes, and
//!   kwok's volume stages so PVCs bind;
//! - each member's API server listens on all addresses; the hub (and a person's shell)
//!   reaches it through its *external* address `127.0.1.<n>`, its own components through
//!   127.0.0.1. `partition` drops the external address, which is what a zone partition is.

pub mod firewall;
pub mod pki;
pub mod procs;
pub mod runner;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine;
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde::{Deserialize, Serialize};

use crate::wait::{Check, wait_for};
use procs::ProcessRecord;

/// Kubernetes version the lab runs (must match e2e/k8s/build.sh).
pub const K8S_VERSION: &str = "v1.36.3";

/// The hub API server audits requests made with service account tokens (tests run the
/// hub with the Helm chart's account and count its refused requests), once each, with
/// metadata only. Everything else (the admin, the controller manager) is not audited.
pub const HUB_AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: Metadata
    userGroups: [system:serviceaccounts]
  - level: None
";

/// The identity the hub has in every member: the service account `bulkhead join` creates
/// there (`bulkhead-system/bulkhead-hub`), as the member's API server names its requests.
pub const HUB_USER_IN_MEMBERS: &str = "system:serviceaccount:bulkhead-system:bulkhead-hub";

/// The member API servers audit the hub's writes only (its reads, the probes and everyone
/// else's requests are not recorded). Writes to the kinds that hold data (StatefulSets,
/// MyDatabases, PersistentVolumeClaims and the chaos run's Shards) are recorded with their
/// request and response bodies, so every DELETE and every apply with its `spec.replicas`
/// is in the log (`make chaos` checks them, docs/chaos.md); the hub's other writes (the
/// fencing Lease renewals, the copies of other kinds) with metadata only. The user must
/// stay [`HUB_USER_IN_MEMBERS`] (a unit test compares them).
pub const MEMBER_AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: RequestResponse
    users: [\"system:serviceaccount:bulkhead-system:bulkhead-hub\"]
    verbs: [create, update, patch, delete, deletecollection]
    resources:
      - group: apps
        resources: [statefulsets]
      - group: example.com
        resources: [mydatabases]
      - group: \"\"
        resources: [persistentvolumeclaims]
      - group: chaos.example.org
        resources: [shards]
  - level: Metadata
    users: [\"system:serviceaccount:bulkhead-system:bulkhead-hub\"]
    verbs: [create, update, patch, delete, deletecollection]
  - level: RequestResponse
    users: [\"bulkhead-lab-admin\", \"lab-member-editor\"]
    verbs: [create, update, patch, delete, deletecollection]
    resources:
      - group: apps
        resources: [statefulsets, statefulsets/scale]
      - group: example.com
        resources: [mydatabases, mydatabases/scale]
      - group: chaos.example.org
        resources: [shards, shards/scale]
  - level: None
";

/// The user a person editing a member's objects with `kubectl` is, in the lab
/// ([`Lab::editor_client`]: the admin impersonating it): the members audit the admin's
/// writes to the kinds that hold data (an audit policy matches the user who authenticated,
/// not the one impersonated), and the event names the impersonated user, so a checker can
/// tell a person's `kubectl scale` from the hub's writes and the agents'.
pub const MEMBER_EDITOR_USER: &str = "lab-member-editor";

/// Where a lab lives on the network: its port range and its external addresses. Two labs
/// can run side by side (the demo's and the tests'), each with its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LabNetwork {
    /// Ports of cluster n start at `port_base + 10 n`.
    pub port_base: u16,
    /// Members are reachable from outside on `127.0.<address_octet>.<n>`.
    pub address_octet: u8,
}

/// `$BULKHEAD_LAB_MEMBER_API_QPS`: the members' kube-controller-manager and
/// kube-scheduler request rate (`--kube-api-qps`, burst twice that). Unset: the upstream
/// defaults (20 and 50, bursts 30 and 100), which are what make 3,000 pods take minutes to
/// become Ready in the burst benchmark.
fn member_api_qps() -> Option<u32> {
    std::env::var("BULKHEAD_LAB_MEMBER_API_QPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|qps| *qps > 0)
}

/// The network of this process's lab: `$BULKHEAD_LAB_PORT_BASE` (default 16400) and
/// `$BULKHEAD_LAB_ADDRESS_OCTET` (default 1).
pub fn network() -> LabNetwork {
    static NETWORK: std::sync::OnceLock<LabNetwork> = std::sync::OnceLock::new();
    *NETWORK.get_or_init(|| LabNetwork {
        port_base: std::env::var("BULKHEAD_LAB_PORT_BASE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(16400),
        address_octet: std::env::var("BULKHEAD_LAB_ADDRESS_OCTET")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1),
    })
}
const NODES_PER_MEMBER: usize = 2;

/// Hub or member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Hub,
    Member,
}

/// One cluster of the lab and its fixed addresses.
#[derive(Clone, Copy, Debug)]
pub struct ClusterInfo {
    pub name: &'static str,
    pub index: u16,
    pub role: Role,
    pub zone: &'static str,
    pub region: &'static str,
}

impl ClusterInfo {
    pub fn apiserver_port(&self) -> u16 {
        network().port_base + self.index * 10
    }
    pub fn etcd_client_port(&self) -> u16 {
        self.apiserver_port() + 1
    }
    pub fn etcd_peer_port(&self) -> u16 {
        self.apiserver_port() + 2
    }
    pub fn controller_manager_port(&self) -> u16 {
        self.apiserver_port() + 3
    }
    pub fn scheduler_port(&self) -> u16 {
        self.apiserver_port() + 4
    }
    pub fn kwok_port(&self) -> u16 {
        self.apiserver_port() + 5
    }
    /// The address the hub (and a person's shell) uses; partitions cut it.
    pub fn external_address(&self) -> Ipv4Addr {
        match self.role {
            Role::Hub => Ipv4Addr::LOCALHOST,
            Role::Member => Ipv4Addr::new(127, 0, network().address_octet, self.index as u8),
        }
    }
    pub fn external_url(&self) -> String {
        format!(
            "https://{}:{}",
            self.external_address(),
            self.apiserver_port()
        )
    }
    pub fn inside_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.apiserver_port())
    }
}

/// The hub and the three members.
pub const CLUSTERS: [ClusterInfo; 4] = [
    ClusterInfo {
        name: "hub",
        index: 0,
        role: Role::Hub,
        zone: "",
        region: "",
    },
    ClusterInfo {
        name: "east",
        index: 1,
        role: Role::Member,
        zone: "zone-a",
        region: "region-1",
    },
    ClusterInfo {
        name: "west",
        index: 2,
        role: Role::Member,
        zone: "zone-b",
        region: "region-1",
    },
    ClusterInfo {
        name: "north",
        index: 3,
        role: Role::Member,
        zone: "zone-c",
        region: "region-2",
    },
];

/// The `lab` binary built in this workspace (its `runner` subcommand is each member's
/// database node), or the one `BULKHEAD_LAB_RUNNER` names.
pub fn lab_binary() -> Result<PathBuf> {
    crate::agent_support::workspace_binary("lab", "BULKHEAD_LAB_RUNNER", "bulkhead-e2e")
}

/// A cluster by name.
pub fn cluster(name: &str) -> Result<&'static ClusterInfo> {
    CLUSTERS.iter().find(|c| c.name == name).with_context(|| {
        let names: Vec<_> = CLUSTERS.iter().map(|c| c.name).collect();
        format!(
            "no lab cluster named {name:?}; the lab has {}",
            names.join(", ")
        )
    })
}

/// A member cluster by name.
pub fn member(name: &str) -> Result<&'static ClusterInfo> {
    let info = cluster(name)?;
    if info.role != Role::Member {
        bail!("{name} is the hub, not a member; members are east, west and north");
    }
    Ok(info)
}

/// The member clusters.
pub fn members() -> impl Iterator<Item = &'static ClusterInfo> {
    CLUSTERS.iter().filter(|c| c.role == Role::Member)
}

/// What `state.json` in the lab directory records.
#[derive(Debug, Default, Serialize, Deserialize)]
struct LabState {
    processes: Vec<ProcessRecord>,
    /// Set once every cluster is ready.
    complete: bool,
}

/// What `up` did.
#[derive(Debug, PartialEq, Eq)]
pub enum UpOutcome {
    Started { seconds: u64 },
    AlreadyRunning,
}

/// The lab on this machine: where its binaries and state live.
#[derive(Clone, Debug)]
pub struct Lab {
    /// Lab state: certificates, kubeconfigs, etcd data, logs, state.json.
    pub root: PathBuf,
    /// The upstream binaries built by e2e/k8s/build.sh.
    pub bin: PathBuf,
}

impl Lab {
    /// The lab at `$BULKHEAD_LAB_DIR` (default `/tmp/bulkhead-lab`) with binaries from
    /// `$BULKHEAD_LAB_BIN` (default `$BULKHEAD_CACHE/k8s-<version>/bin`, cache default
    /// `~/.cache/bulkhead`).
    pub fn from_env() -> Self {
        let root = std::env::var_os("BULKHEAD_LAB_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp/bulkhead-lab"));
        let bin = std::env::var_os("BULKHEAD_LAB_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let cache = std::env::var_os("BULKHEAD_CACHE")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| {
                        PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                            .join(".cache/bulkhead")
                    });
                cache.join(format!("k8s-{K8S_VERSION}")).join("bin")
            });
        Lab { root, bin }
    }

    fn cluster_dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Admin kubeconfig through the cluster's external address (cut by a partition).
    pub fn kubeconfig(&self, name: &str) -> PathBuf {
        self.cluster_dir(name).join("admin.kubeconfig")
    }

    /// Admin kubeconfig through 127.0.0.1, which works from inside the zone while it is cut off.
    pub fn inside_kubeconfig(&self, name: &str) -> PathBuf {
        self.cluster_dir(name).join("admin-inside.kubeconfig")
    }

    /// The hub's kube-controller-manager's own kubeconfig (user
    /// `system:kube-controller-manager`, inside address).
    fn controller_manager_kubeconfig(&self, name: &str) -> PathBuf {
        self.cluster_dir(name).join("controller-manager.kubeconfig")
    }

    /// The directory holding the logs of a cluster's processes.
    pub fn log_dir(&self, name: &str) -> PathBuf {
        self.cluster_dir(name).join("logs")
    }

    fn state_path(&self) -> PathBuf {
        self.root.join("state.json")
    }

    fn read_state(&self) -> Option<LabState> {
        let text = std::fs::read_to_string(self.state_path()).ok()?;
        serde_json::from_str(&text).ok()
    }

    fn write_state(&self, state: &LabState) -> Result<()> {
        let path = self.state_path();
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(state)?)?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    /// Serialises lab operations between processes (a test and a person's shell).
    fn lock(&self) -> Result<std::fs::File> {
        // Beside the lab directory, which `down` deletes.
        let path = self.root.with_extension("lock");
        let file = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        file.lock()
            .with_context(|| format!("locking {}", path.display()))?;
        Ok(file)
    }

    fn binary(&self, name: &str) -> Result<PathBuf> {
        let path = self.bin.join(name);
        if !path.is_file() {
            bail!(
                "{} is missing; build the lab binaries with `e2e/k8s/build.sh` (about 8 minutes the first time)",
                path.display()
            );
        }
        Ok(path)
    }

    /// A client with the admin credentials through the external address.
    pub async fn client(&self, name: &str) -> Result<Client> {
        client_from(&self.kubeconfig(name)).await
    }

    /// A client with the admin credentials through 127.0.0.1 (inside the zone).
    pub async fn inside_client(&self, name: &str) -> Result<Client> {
        client_from(&self.inside_kubeconfig(name)).await
    }

    /// A client through 127.0.0.1 (inside the zone) acting as [`MEMBER_EDITOR_USER`]: the
    /// admin credentials impersonating that user in `system:masters`.
    pub async fn editor_client(&self, name: &str) -> Result<Client> {
        let path = self.inside_kubeconfig(name);
        let kubeconfig =
            Kubeconfig::read_from(&path).with_context(|| format!("reading {}", path.display()))?;
        let mut config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        config.auth_info.impersonate = Some(MEMBER_EDITOR_USER.to_string());
        config.auth_info.impersonate_groups = Some(vec!["system:masters".to_string()]);
        client_with_timeouts(config)
    }

    /// True when a complete lab is running: every recorded process alive and every API
    /// server ready.
    pub async fn is_running(&self) -> bool {
        let Some(state) = self.read_state() else {
            return false;
        };
        if !state.complete
            || !state
                .processes
                .iter()
                .all(|p| procs::is_lab_process(p.pid, &self.root))
        {
            return false;
        }
        for info in &CLUSTERS {
            match self.inside_client(info.name).await {
                Ok(client) if readyz(&client).await.is_ok() => {}
                _ => return false,
            }
        }
        true
    }

    /// Brings the lab up, or reports that it already runs. A crashed or half-started lab
    /// is cleaned up first.
    pub async fn up(&self) -> Result<UpOutcome> {
        let _lock = self.lock()?;
        if self.is_running().await {
            return Ok(UpOutcome::AlreadyRunning);
        }
        // A partition left by a lab that was killed (and its directory removed) would cut
        // the new lab's member off from its first request: clear this lab's rules always.
        firewall::clear_all()?;
        if self.root.exists() || !procs::find_lab_processes(&self.root).is_empty() {
            eprintln!(
                "lab: cleaning up a stopped, crashed or half-started lab in {}",
                self.root.display()
            );
            self.down_locked()?;
        }
        for component in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
            "kubectl",
        ] {
            self.binary(component)?;
        }
        let started = Instant::now();
        std::fs::create_dir_all(&self.root)?;
        let mut state = LabState::default();
        self.write_state(&state)?;

        for info in &CLUSTERS {
            self.prepare_cluster(info)?;
        }
        for info in &CLUSTERS {
            self.start(&mut state, info, "etcd", self.etcd_args(info))?;
        }
        for info in &CLUSTERS {
            wait_for_etcd(info).await?;
            self.start(
                &mut state,
                info,
                "kube-apiserver",
                self.apiserver_args(info),
            )?;
            self.wait_apiserver(info).await.with_context(|| {
                format!(
                    "see {}",
                    procs::log_path(&self.root, info.name, "kube-apiserver").display()
                )
            })?;
            eprintln!(
                "lab: {} API server ready at {} ({} s)",
                info.name,
                info.external_url(),
                started.elapsed().as_secs()
            );
        }
        for info in &CLUSTERS {
            self.start(
                &mut state,
                info,
                "kube-controller-manager",
                self.controller_manager_args(info),
            )?;
            if info.role == Role::Member {
                self.start(
                    &mut state,
                    info,
                    "kube-scheduler",
                    self.scheduler_args(info),
                )?;
                self.start(&mut state, info, "kwok", self.kwok_args(info))?;
            }
        }
        for info in members() {
            self.prepare_member(info).await?;
        }
        let runner = lab_binary()?;
        for info in members() {
            let args = vec![
                "runner".to_string(),
                // A trailing `/`: `is_lab_process` knows the lab's processes by it.
                format!("--lab-dir={}/", self.root.display()),
                format!("--cluster={}", info.name),
                format!(
                    "--bulkhead={}",
                    crate::agent_support::bulkhead_binary()?.display()
                ),
            ];
            self.start_program(&mut state, info, "runner", &runner, args)?;
        }
        for info in members() {
            self.wait_kwok_started(&mut state, info).await?;
            self.wait_member_ready(info).await?;
        }
        state.complete = true;
        self.write_state(&state)?;
        Ok(UpOutcome::Started {
            seconds: started.elapsed().as_secs(),
        })
    }

    /// Stops every lab process (by pid, in a safe order), removes the partition rules and
    /// deletes the lab directory.
    pub fn down(&self) -> Result<()> {
        let _lock = self.lock()?;
        self.down_locked()
    }

    fn down_locked(&self) -> Result<()> {
        firewall::clear_all()?;
        runner::remove_addresses()?;
        let mut records = self.read_state().map(|s| s.processes).unwrap_or_default();
        records.sort_by_key(|r| procs::stop_rank(&r.component));
        for record in &records {
            procs::stop(record.pid, &self.root, Duration::from_secs(5));
        }
        // Whatever a crashed `up` started but did not record.
        for pid in procs::find_lab_processes(&self.root) {
            procs::stop(pid, &self.root, Duration::from_secs(5));
        }
        if self.root.exists() {
            std::fs::remove_dir_all(&self.root)
                .with_context(|| format!("removing {}", self.root.display()))?;
        }
        Ok(())
    }

    /// One line per cluster: processes, API server health and partition state.
    pub async fn status(&self) -> Result<String> {
        let Some(state) = self.read_state() else {
            return Ok(format!(
                "lab: not running (no state in {})\n",
                self.root.display()
            ));
        };
        let mut out = String::new();
        out.push_str(&format!(
            "{:<7} {:<24} {:<9} {:<12} {:<8} PROCESSES\n",
            "CLUSTER", "EXTERNAL", "ZONE", "APISERVER", "CUT-OFF"
        ));
        for info in &CLUSTERS {
            let processes: Vec<String> = state
                .processes
                .iter()
                .filter(|p| p.cluster == info.name)
                .map(|p| {
                    let alive = if procs::is_lab_process(p.pid, &self.root) {
                        "up"
                    } else {
                        "DOWN"
                    };
                    format!("{}={alive}", p.component)
                })
                .collect();
            let health = match self.inside_client(info.name).await {
                Ok(client) => match readyz(&client).await {
                    Ok(()) => "ready".to_string(),
                    Err(_) => "not-ready".to_string(),
                },
                Err(_) => "unknown".to_string(),
            };
            let cut = match info.role {
                Role::Hub => "-".to_string(),
                Role::Member => firewall::is_partitioned(info.name)
                    .map(|p| if p { "yes" } else { "no" }.to_string())
                    .unwrap_or_else(|_| "?".into()),
            };
            let zone = if info.zone.is_empty() { "-" } else { info.zone };
            out.push_str(&format!(
                "{:<7} {:<24} {:<9} {:<12} {:<8} {}\n",
                info.name,
                format!("{}:{}", info.external_address(), info.apiserver_port()),
                zone,
                health,
                cut,
                processes.join(" ")
            ));
        }
        if !state.complete {
            out.push_str(
                "lab: start did not complete; `e2e/lab up` cleans it up and starts again\n",
            );
        }
        Ok(out)
    }

    /// Cuts the hub (and everyone outside the zone) off `member`.
    pub fn partition(&self, member_name: &str) -> Result<()> {
        let info = member(member_name)?;
        firewall::partition(
            info.name,
            info.external_address(),
            info.apiserver_port(),
            &runner::outside_range(info),
        )
    }

    /// Cuts only the outside addresses of `member_name`'s database pods: other clusters
    /// lose its replication and its servers, the hub still reaches its API server (a
    /// replication path lost while the zone looks healthy). Undone by [`Lab::heal`].
    pub fn cut_database_pods(&self, member_name: &str) -> Result<()> {
        let info = member(member_name)?;
        firewall::cut_pods(info.name, &runner::outside_range(info))
    }

    /// Undoes [`Lab::partition`] and [`Lab::cut_database_pods`].
    pub fn heal(&self, member_name: &str) -> Result<()> {
        member(member_name)?;
        firewall::heal(member_name)
    }

    /// Cuts the hub off every member at once.
    pub fn isolate_hub(&self) -> Result<()> {
        members().try_for_each(|info| self.partition(info.name))
    }

    /// Waits until a cluster's API server answers /readyz (from inside its zone).
    async fn wait_apiserver(&self, info: &ClusterInfo) -> Result<()> {
        let client = self.inside_client(info.name).await?;
        wait_for(
            &format!("{} kube-apiserver /readyz", info.name),
            Duration::from_secs(90),
            || {
                let client = client.clone();
                async move {
                    match readyz(&client).await {
                        Ok(()) => Check::Done(()),
                        Err(e) => Check::Waiting(e),
                    }
                }
            },
        )
        .await
    }

    /// Kills one component of a cluster the way a crash would (SIGKILL), e.g. a member's
    /// kube-apiserver; [`Lab::restart_component`] brings it back.
    pub fn kill_component(&self, cluster_name: &str, component: &str) -> Result<()> {
        let _lock = self.lock()?;
        let mut state = self.read_state().context("the lab is not running")?;
        let index = state
            .processes
            .iter()
            .position(|p| p.cluster == cluster_name && p.component == component)
            .with_context(|| format!("{cluster_name} has no running {component}"))?;
        let record = state.processes.remove(index);
        procs::stop(record.pid, &self.root, Duration::ZERO);
        self.write_state(&state)
    }

    /// Starts a component [`Lab::kill_component`] stopped, with its usual arguments, and
    /// waits for an API server to be ready again.
    pub async fn restart_component(&self, cluster_name: &str, component: &str) -> Result<()> {
        let info = cluster(cluster_name)?;
        {
            let _lock = self.lock()?;
            let mut state = self.read_state().context("the lab is not running")?;
            let args = match component {
                "kube-apiserver" => self.apiserver_args(info),
                "kube-controller-manager" => self.controller_manager_args(info),
                "kube-scheduler" => self.scheduler_args(info),
                "kwok" => self.kwok_args(info),
                other => bail!("cannot restart {other}; use e2e/lab down and up"),
            };
            self.start(&mut state, info, component, args)?;
        }
        if component == "kube-apiserver" {
            self.wait_apiserver(info).await?;
        }
        Ok(())
    }

    /// Whether `cluster`'s `component` (e.g. `kwok`) is recorded and alive.
    pub fn component_running(&self, cluster_name: &str, component: &str) -> bool {
        self.read_state().is_some_and(|state| {
            state.processes.iter().any(|p| {
                p.cluster == cluster_name
                    && p.component == component
                    && procs::is_lab_process(p.pid, &self.root)
            })
        })
    }

    /// Heals every partition.
    pub fn heal_all(&self) -> Result<()> {
        firewall::clear_all()
    }

    fn start(
        &self,
        state: &mut LabState,
        info: &ClusterInfo,
        component: &str,
        args: Vec<String>,
    ) -> Result<()> {
        let binary = self.binary(component)?;
        self.start_program(state, info, component, &binary, args)
    }

    fn start_program(
        &self,
        state: &mut LabState,
        info: &ClusterInfo,
        component: &str,
        binary: &Path,
        args: Vec<String>,
    ) -> Result<()> {
        let log = procs::log_path(&self.root, info.name, component);
        let pid = procs::spawn(binary, &args, &log)?;
        state.processes.push(ProcessRecord {
            cluster: info.name.to_string(),
            component: component.to_string(),
            pid,
        });
        self.write_state(state)
    }

    fn pki(&self, name: &str) -> pki::PkiPaths {
        pki::PkiPaths::new(self.cluster_dir(name).join("pki"))
    }

    fn prepare_cluster(&self, info: &ClusterInfo) -> Result<()> {
        let dir = self.cluster_dir(info.name);
        std::fs::create_dir_all(dir.join("logs"))?;
        let audit_policy = match info.role {
            Role::Hub => HUB_AUDIT_POLICY,
            Role::Member => MEMBER_AUDIT_POLICY,
        };
        std::fs::write(dir.join("audit-policy.yaml"), audit_policy)?;
        let mut sans = vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "10.0.0.1".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
        ];
        if info.external_address() != Ipv4Addr::LOCALHOST {
            sans.push(info.external_address().to_string());
        }
        let pki = self.pki(info.name);
        pki::generate(info.name, &sans, &pki)?;
        let admin = (pki.admin_cert(), pki.admin_key());
        write_kubeconfig(
            &self.kubeconfig(info.name),
            info.name,
            &info.external_url(),
            &pki,
            &admin,
        )?;
        write_kubeconfig(
            &self.inside_kubeconfig(info.name),
            info.name,
            &info.inside_url(),
            &pki,
            &admin,
        )?;
        write_kubeconfig(
            &self.controller_manager_kubeconfig(info.name),
            info.name,
            &info.inside_url(),
            &pki,
            &(pki.controller_manager_cert(), pki.controller_manager_key()),
        )?;
        Ok(())
    }

    fn etcd_args(&self, info: &ClusterInfo) -> Vec<String> {
        let client = format!("http://127.0.0.1:{}", info.etcd_client_port());
        let peer = format!("http://127.0.0.1:{}", info.etcd_peer_port());
        vec![
            format!("--name={}", info.name),
            format!(
                "--data-dir={}",
                self.cluster_dir(info.name).join("etcd").display()
            ),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster={}={peer}", info.name),
            "--unsafe-no-fsync=true".into(),
            "--quota-backend-bytes=4294967296".into(),
            "--auto-compaction-retention=1".into(),
            "--log-level=warn".into(),
        ]
    }

    fn apiserver_args(&self, info: &ClusterInfo) -> Vec<String> {
        let pki = self.pki(info.name);
        // Members listen on every address so the hub can use the external one while
        // their own components use 127.0.0.1; the hub only needs loopback.
        let bind = match info.role {
            Role::Hub => "127.0.0.1",
            Role::Member => "0.0.0.0",
        };
        let mut args = vec![
            format!(
                "--etcd-servers=http://127.0.0.1:{}",
                info.etcd_client_port()
            ),
            format!("--secure-port={}", info.apiserver_port()),
            format!("--bind-address={bind}"),
            "--advertise-address=127.0.0.1".into(),
            format!(
                "--cert-dir={}",
                self.cluster_dir(info.name)
                    .join("apiserver-certs")
                    .display()
            ),
            format!("--tls-cert-file={}", pki.apiserver_cert().display()),
            format!("--tls-private-key-file={}", pki.apiserver_key().display()),
            format!("--client-ca-file={}", pki.client_ca().display()),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--allow-privileged=true".into(),
            "--authorization-mode=RBAC".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            format!(
                "--service-account-issuer=https://127.0.0.1:{}/",
                info.apiserver_port()
            ),
            format!(
                "--service-account-key-file={}",
                pki.service_account_public_key().display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                pki.service_account_key().display()
            ),
            "--endpoint-reconciler-type=none".into(),
            "--profiling=false".into(),
        ];
        // Bounded: one rotated file of at most the size (MB) besides the current one.
        let max_size_megabytes = match info.role {
            Role::Hub => 100,
            Role::Member => 50,
        };
        args.extend([
            format!(
                "--audit-policy-file={}",
                self.cluster_dir(info.name)
                    .join("audit-policy.yaml")
                    .display()
            ),
            format!("--audit-log-path={}", self.audit_log(info.name).display()),
            format!("--audit-log-maxsize={max_size_megabytes}"),
            "--audit-log-maxbackup=1".into(),
        ]);
        args
    }

    /// A cluster API server's current audit log (rotated ones sit beside it as
    /// `audit-<time>.log`).
    fn audit_log(&self, name: &str) -> PathBuf {
        self.log_dir(name).join("audit.log")
    }

    /// The hub API server's audit log: one JSON line per request made with a service
    /// account token (the Helm chart's account, see [`HUB_AUDIT_POLICY`]).
    pub fn hub_audit_log(&self) -> PathBuf {
        self.audit_log("hub")
    }

    /// A member API server's audit log: one JSON line per write of the hub
    /// ([`HUB_USER_IN_MEMBERS`]), with the bodies for the kinds that hold data (see
    /// [`MEMBER_AUDIT_POLICY`]). When it grew past its size, the older lines are in one
    /// rotated file beside it, `audit-<time>.log`.
    pub fn member_audit_log(&self, name: &str) -> PathBuf {
        self.audit_log(name)
    }

    fn controller_manager_args(&self, info: &ClusterInfo) -> Vec<String> {
        let pki = self.pki(info.name);
        // The hub's runs as kubeadm runs it: its own user, and each controller with its
        // ServiceAccount's credentials (the namespace controller is then
        // system:serviceaccount:kube-system:namespace-controller), so the chart's
        // admission policies meet the identities a real cluster has. The members' keep
        // the admin's credentials.
        let kubeconfig = if info.role == Role::Hub {
            self.controller_manager_kubeconfig(info.name)
        } else {
            self.inside_kubeconfig(info.name)
        };
        let mut args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", info.controller_manager_port()),
            format!("--root-ca-file={}", pki.serving_ca().display()),
            format!(
                "--service-account-private-key-file={}",
                pki.service_account_key().display()
            ),
            "--profiling=false".into(),
        ];
        if info.role == Role::Hub {
            // Templates on the hub are stored, never executed.
            args.push("--controllers=namespace,garbagecollector".into());
            args.push("--use-service-account-credentials=true".into());
        } else if let Some(qps) = member_api_qps() {
            args.push(format!("--kube-api-qps={qps}"));
            args.push(format!("--kube-api-burst={}", 2 * qps));
        }
        args
    }

    fn scheduler_args(&self, info: &ClusterInfo) -> Vec<String> {
        let mut args = vec![
            format!(
                "--kubeconfig={}",
                self.inside_kubeconfig(info.name).display()
            ),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", info.scheduler_port()),
            "--profiling=false".into(),
        ];
        // Its upstream default is 50 requests/s: with faster controller-managers, binding
        // the pods becomes what a member waits for.
        if info.role != Role::Hub
            && let Some(qps) = member_api_qps()
        {
            args.push(format!("--kube-api-qps={qps}"));
            args.push(format!("--kube-api-burst={}", 2 * qps));
        }
        args
    }

    fn kwok_args(&self, info: &ClusterInfo) -> Vec<String> {
        vec![
            format!(
                "--kubeconfig={}",
                self.inside_kubeconfig(info.name).display()
            ),
            format!(
                "--config={}",
                self.bin.join("../kwok-stages.yaml").display()
            ),
            // The fake nodes only: each member's database node is the lab runner's.
            "--manage-all-nodes=false".into(),
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".into(),
            format!("--cidr=10.{}.0.0/16", 100 + info.index),
            format!("--node-ip=10.{}.255.1", 100 + info.index),
            // Without it the heartbeat stage renews no node Lease and every node goes
            // Unknown after about 50 s.
            "--node-lease-duration-seconds=40".into(),
            format!("--server-address=127.0.0.1:{}", info.kwok_port()),
        ]
    }

    /// Default StorageClass backed by kwok's volume stages, and fake nodes with realistic
    /// allocatable resources.
    async fn prepare_member(&self, info: &ClusterInfo) -> Result<()> {
        let client = self.inside_client(info.name).await?;
        let storage_class_path = self.bin.join("../kwok-storage-class.yaml");
        let storage_class: StorageClass = serde_yaml::from_str(
            &std::fs::read_to_string(&storage_class_path).with_context(|| {
                format!(
                    "reading {}; re-run e2e/k8s/build.sh",
                    storage_class_path.display()
                )
            })?,
        )?;
        create_if_missing(&Api::<StorageClass>::all(client.clone()), &storage_class).await?;
        let nodes: Api<Node> = Api::all(client);
        for n in 1..=NODES_PER_MEMBER {
            create_if_missing(&nodes, &fake_node(info, n)?).await?;
        }
        Ok(())
    }

    /// kwok v0.8.0 sometimes dies at startup with "fatal error: concurrent map writes" in
    /// its CEL environment (an upstream race, seen on this 2-core machine): a kwok that
    /// exits within its first seconds is started again, up to twice, before `up` gives up.
    async fn wait_kwok_started(&self, state: &mut LabState, info: &ClusterInfo) -> Result<()> {
        for attempt in 1..=3 {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let Some(index) = state
                .processes
                .iter()
                .position(|p| p.cluster == info.name && p.component == "kwok")
            else {
                return Ok(());
            };
            if procs::is_lab_process(state.processes[index].pid, &self.root) {
                return Ok(());
            }
            if attempt == 3 {
                bail!(
                    "kwok of {} exited at startup three times; see {}",
                    info.name,
                    procs::log_path(&self.root, info.name, "kwok").display()
                );
            }
            eprintln!(
                "lab: kwok of {} exited at startup (see its log); starting it again",
                info.name
            );
            state.processes.remove(index);
            self.start(state, info, "kwok", self.kwok_args(info))?;
        }
        Ok(())
    }

    async fn wait_member_ready(&self, info: &ClusterInfo) -> Result<()> {
        let client = self.inside_client(info.name).await?;
        let nodes: Api<Node> = Api::all(client.clone());
        wait_for(
            &format!("{} kwok nodes Ready", info.name),
            Duration::from_secs(60),
            || {
                let nodes = nodes.clone();
                async move {
                    match nodes.list(&Default::default()).await {
                        Ok(list) => {
                            let ready = list.items.iter().filter(|n| node_is_ready(n)).count();
                            if ready >= NODES_PER_MEMBER {
                                Check::Done(())
                            } else {
                                Check::Waiting(format!("{ready}/{NODES_PER_MEMBER} nodes Ready"))
                            }
                        }
                        Err(e) => Check::Waiting(e.to_string()),
                    }
                }
            },
        )
        .await
        .with_context(|| {
            format!(
                "see {}",
                procs::log_path(&self.root, info.name, "kwok").display()
            )
        })?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client, "default");
        wait_for(
            &format!("{} default service account", info.name),
            Duration::from_secs(60),
            || {
                let accounts = accounts.clone();
                async move {
                    match accounts.get_opt("default").await {
                        Ok(Some(_)) => Check::Done(()),
                        Ok(None) => Check::Waiting("not created yet".into()),
                        Err(e) => Check::Waiting(e.to_string()),
                    }
                }
            },
        )
        .await
        .with_context(|| {
            format!(
                "see {}",
                procs::log_path(&self.root, info.name, "kube-controller-manager").display()
            )
        })?;
        eprintln!(
            "lab: {} ready ({} nodes, zone {})",
            info.name, NODES_PER_MEMBER, info.zone
        );
        Ok(())
    }
}

fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

fn fake_node(info: &ClusterInfo, n: usize) -> Result<Node> {
    let name = format!("{}-node-{n}", info.name);
    let resources = serde_json::json!({"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"});
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "topology.kubernetes.io/zone": info.zone,
                "topology.kubernetes.io/region": info.region,
            },
        },
        "status": {
            "allocatable": resources,
            "capacity": resources,
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "kubeProxyVersion": "fake",
            },
        },
    }))?)
}

async fn create_if_missing<K>(api: &Api<K>, object: &K) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| {
            format!(
                "creating {}",
                object.meta().name.clone().unwrap_or_default()
            )
        }),
    }
}

/// `GET /readyz` through `client`.
pub async fn readyz(client: &Client) -> Result<(), String> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match client.request_text(request).await {
        Ok(body) if body.trim() == "ok" => Ok(()),
        Ok(body) => Err(body),
        Err(e) => Err(e.to_string()),
    }
}

async fn wait_for_etcd(info: &ClusterInfo) -> Result<()> {
    let port = info.etcd_client_port();
    wait_for(
        &format!("{} etcd /health", info.name),
        Duration::from_secs(30),
        || async move {
            match etcd_health(port).await {
                Ok(body) if body.contains("\"health\":\"true\"") => Check::Done(()),
                Ok(body) => Check::Waiting(body),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await
}

async fn etcd_health(port: u16) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(2), stream.read_to_string(&mut response))
        .await
        .map_err(|_| std::io::Error::other("timed out"))??;
    Ok(response)
}

fn write_kubeconfig(
    path: &Path,
    cluster: &str,
    server: &str,
    pki: &pki::PkiPaths,
    (cert, key): &(PathBuf, PathBuf),
) -> Result<()> {
    let b64 = |p: PathBuf| -> Result<String> {
        Ok(base64::engine::general_purpose::STANDARD
            .encode(std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?))
    };
    let context = format!("lab-{cluster}");
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": server, "certificate-authority-data": b64(pki.serving_ca())?}}],
        "users": [{"name": format!("{context}-admin"), "user": {
            "client-certificate-data": b64(cert.clone())?,
            "client-key-data": b64(key.clone())?,
        }}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": format!("{context}-admin")}}],
        "current-context": context,
        "preferences": {},
    });
    std::fs::write(path, serde_yaml::to_string(&kubeconfig)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// A client from a kubeconfig file, with short timeouts so a partition shows up as a
/// timeout within seconds rather than minutes.
pub async fn client_from(path: &Path) -> Result<Client> {
    let kubeconfig =
        Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    client_with_timeouts(config)
}

/// A client with short timeouts, so a partition shows up as a timeout within seconds
/// rather than minutes.
fn client_with_timeouts(mut config: Config) -> Result<Client> {
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(15));
    config.write_timeout = Some(Duration::from_secs(15));
    Ok(Client::try_from(config)?)
}

/// Shell exports for using the lab: KUBECONFIG for the hub and PATH with the lab's tools.
pub fn shell_env(lab: &Lab) -> String {
    let mut out = BTreeMap::new();
    out.insert("KUBECONFIG", lab.kubeconfig("hub").display().to_string());
    out.insert("PATH", format!("{}:$PATH", lab.bin.display()));
    out.iter()
        .map(|(k, v)| format!("export {k}=\"{v}\"\n"))
        .collect()
}

/// The repository's `config/crd/` directory.
pub fn crd_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/crd")
}

/// Reads every CRD committed in `dir`.
pub fn read_crds(dir: &Path) -> Result<Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>>{
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            serde_yaml::from_str(&std::fs::read_to_string(p)?)
                .with_context(|| format!("parsing {}", p.display()))
        })
        .collect()
}

impl Lab {
    /// Applies the CRDs in `dir` to `cluster` (server-side apply) and waits until each is
    /// Established; returns their names.
    pub async fn install_crds(&self, cluster: &str, dir: &Path) -> Result<Vec<String>> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        use kube::api::{Patch, PatchParams};
        use kube::runtime::wait::{await_condition, conditions};
        let client = self.inside_client(cluster).await?;
        let api: Api<CustomResourceDefinition> = Api::all(client);
        let mut names = vec![];
        for crd in read_crds(dir)? {
            let name = crd.metadata.name.clone().context("CRD without a name")?;
            api.patch(
                &name,
                &PatchParams::apply("bulkhead-lab").force(),
                &Patch::Apply(&crd),
            )
            .await
            .with_context(|| format!("applying CRD {name} to {cluster}"))?;
            names.push(name);
        }
        for name in &names {
            tokio::time::timeout(
                Duration::from_secs(30),
                await_condition(api.clone(), name, conditions::is_crd_established()),
            )
            .await
            .with_context(|| format!("CRD {name} not Established in {cluster} after 30 s"))??;
        }
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_member_audit_policy_records_the_hubs_writes_with_bodies_for_the_kinds_holding_data() {
        let hub_user = format!(
            "system:serviceaccount:{}:{}",
            bulkhead::api::SYSTEM_NAMESPACE,
            bulkhead::cli::join::HUB_ACCOUNT
        );
        assert_eq!(HUB_USER_IN_MEMBERS, hub_user);
        let policy: serde_json::Value = serde_yaml::from_str(MEMBER_AUDIT_POLICY).unwrap();
        assert_eq!(policy["kind"], "Policy");
        let rules = policy["rules"].as_array().unwrap();
        let bodies = &rules[0];
        assert_eq!(bodies["level"], "RequestResponse");
        assert_eq!(bodies["users"], serde_json::json!([hub_user]));
        let verbs: Vec<&str> = bodies["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        for verb in ["create", "patch", "delete"] {
            assert!(verbs.contains(&verb), "{verb} missing from {verbs:?}");
        }
        for read in ["get", "list", "watch"] {
            assert!(!verbs.contains(&read), "reads stay out of the log");
        }
        let resources: Vec<(String, String)> = bodies["resources"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| {
                let group = r["group"].as_str().unwrap().to_string();
                r["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(move |name| (group.clone(), name.as_str().unwrap().to_string()))
            })
            .collect();
        for wanted in [
            ("apps", "statefulsets"),
            ("example.com", "mydatabases"),
            ("", "persistentvolumeclaims"),
        ] {
            assert!(
                resources.contains(&(wanted.0.to_string(), wanted.1.to_string())),
                "{wanted:?} not recorded with bodies"
            );
        }
        assert_eq!(rules.last().unwrap()["level"], "None", "nothing else");
    }
}
