//! The lab's database node: a node in each member that kwok does not manage, whose pods
//! run for real, as host processes (`e2e/lab runner`, started by `up`).
//!
//! It does what a kubelet does for the database pods, in the small: keeps the node Ready
//! (its Lease and its Ready condition), runs each pod's init containers to completion
//! and then its containers (restarting them when they exit), probes readiness, reports
//! phase, pod IP, container states and conditions, and on deletion stops the processes
//! (SIGTERM, then SIGKILL after the grace period) before it removes the pod. Images are
//! not pulled: a container's program is the host's (the `bulkhead` image's `bulkhead` is
//! the workspace's build, the `postgres` image's programs are the distribution's
//! PostgreSQL server package, which `e2e/setup.sh` installs).
//!
//! What a pod's network namespace would give, on one host:
//! - each pod gets two addresses on the loopback interface: its *inside* address
//!   `10.<200+octet>.<n>.<k>` (the pod IP, what its zone's clients, its agent and its
//!   sibling standbys use) and an *outside* address `10.<200+octet>.<100+n>.<k>` (how
//!   clients outside the zone reach it); a lab partition of the member drops the outside
//!   range, as it drops the member's API server's external address;
//! - `0.0.0.0` in a container's arguments becomes the inside address, and
//!   `$BULKHEAD_LISTEN_ADDRESSES` names both (the instance manager's PostgreSQL listens
//!   there, where in a pod it would listen on `*`);
//! - volumes are host directories: a claim's under `<lab>/<member>/claims/<namespace>/`,
//!   kept after the pod (the data outlives it, as a volume's does) until the claim is
//!   deleted (the lab's StorageClass deletes its volumes), an `emptyDir` and the
//!   Secret files under `<lab>/<member>/pods/<uid>/`, removed with the pod. Paths in a
//!   container's command, arguments and environment that start with a mount path are
//!   rewritten to the host directory.
//!
//! The processes run as root (not as the pod's `runAsUser`); `bulkhead instance` then
//! runs PostgreSQL as the host's `postgres` user.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, Node, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{ClusterInfo, network};

/// Label (and taint key) of the database node: pods that tolerate the taint and select
/// the label run for real.
pub const RUNNER_LABEL: &str = "bulkhead.example.com/lab-runner";

/// The annotation on each pod the runner runs that holds its outside address (what a
/// network publishing per-pod external addresses would set); agents name it with
/// `--external-address-annotation`.
pub const OUTSIDE_ADDRESS_ANNOTATION: &str = "bulkhead.example.com/lab-outside-address";

/// The agent's arguments that put database pods on the database node, where they run
/// real PostgreSQL (without them they land on kwok's nodes and never run).
pub fn agent_args() -> Vec<String> {
    vec![
        format!("--database-node-selector={RUNNER_LABEL}=true"),
        format!("--database-toleration={RUNNER_LABEL}"),
        format!("--external-address-annotation={OUTSIDE_ADDRESS_ANNOTATION}"),
    ]
}

/// The database node of a member.
pub fn node_name(member: &str) -> String {
    format!("{member}-db")
}

/// The second octet of this lab's pod addresses: `10.<200 + address octet>.x.y`.
fn pod_octet() -> u8 {
    200u8.saturating_add(network().address_octet)
}

/// A pod's inside address (its pod IP): `10.<200+octet>.<n>.<slot>`.
pub fn inside_address(info: &ClusterInfo, slot: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, pod_octet(), info.index as u8, slot)
}

/// A pod's outside address (partitions cut it): `10.<200+octet>.<100+n>.<slot>`.
pub fn outside_address(info: &ClusterInfo, slot: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, pod_octet(), 100 + info.index as u8, slot)
}

/// The range of a member's outside pod addresses.
pub fn outside_range(info: &ClusterInfo) -> String {
    format!("10.{}.{}.0/24", pod_octet(), 100 + info.index)
}

/// The outside address of a pod IP (inside address) of this lab, if it is one.
pub fn outside_of(pod_ip: Ipv4Addr) -> Option<Ipv4Addr> {
    let [a, b, c, d] = pod_ip.octets();
    (a == 10 && b == pod_octet() && (1..100).contains(&c)).then(|| Ipv4Addr::new(a, b, c + 100, d))
}

/// The two /24s of a member's pods, as `ip addr` adds them to the loopback interface
/// (the whole prefix is then local: any address in it can be bound). Loopback addresses
/// (127/8) would be simpler, but an EndpointSlice may not list them, so a Service would
/// never have endpoints.
fn address_ranges(info: &ClusterInfo) -> [String; 2] {
    [
        format!("10.{}.{}.1/24", pod_octet(), info.index),
        format!("10.{}.{}.1/24", pod_octet(), 100 + info.index),
    ]
}

fn ip(args: &[&str]) -> Result<std::process::Output> {
    std::process::Command::new("ip").args(args).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            anyhow::anyhow!(
                "`ip` (iproute2) is not installed; the lab's database pods need it: run e2e/setup.sh (as root)"
            )
        } else {
            anyhow::anyhow!("running ip: {e}")
        }
    })
}

/// Adds a member's pod ranges to the loopback interface (needs root).
pub fn add_addresses(info: &ClusterInfo) -> Result<()> {
    for range in address_ranges(info) {
        let output = ip(&["addr", "add", &range, "dev", "lo"])?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() && !stderr.contains("File exists") {
            bail!("ip addr add {range} dev lo: {}", stderr.trim());
        }
    }
    Ok(())
}

/// Removes every member's pod ranges (`down`); succeeds without `ip`.
pub fn remove_addresses() -> Result<()> {
    for info in super::members() {
        for range in address_ranges(info) {
            match ip(&["addr", "del", &range, "dev", "lo"]) {
                Ok(_) => {}
                Err(e) if e.to_string().contains("not installed") => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// First slot handed out (`.1` to `.9` stay free).
const FIRST_SLOT: u8 = 10;

/// A running container process.
struct Running {
    child: tokio::process::Child,
    started: jiff::Timestamp,
}

/// What the runner keeps of one pod.
struct PodRun {
    name: String,
    namespace: String,
    uid: String,
    slot: u8,
    dir: PathBuf,
    /// Container name -> its process.
    running: HashMap<String, Running>,
    restarts: HashMap<String, i32>,
    /// When a container that exited may start again.
    restart_at: HashMap<String, Instant>,
    init_done: bool,
    /// When a failed start (volumes, init containers) is tried again.
    retry_init_at: Option<Instant>,
    /// The last error starting the pod, reported in its status.
    failure: Option<String>,
    ready: bool,
    last_probe: Option<Instant>,
    reported: Option<serde_json::Value>,
}

/// The runner of one member's database node.
pub struct Runner {
    client: Client,
    info: &'static ClusterInfo,
    root: PathBuf,
    bulkhead: PathBuf,
    pods: HashMap<String, PodRun>,
    stopping: HashMap<String, tokio::task::JoinHandle<()>>,
    last_heartbeat: Option<Instant>,
}

impl Runner {
    pub fn new(
        client: Client,
        info: &'static ClusterInfo,
        lab_root: &Path,
        bulkhead: PathBuf,
    ) -> Self {
        Runner {
            client,
            info,
            root: lab_root.join(info.name),
            bulkhead,
            pods: HashMap::new(),
            stopping: HashMap::new(),
            last_heartbeat: None,
        }
    }

    /// Runs until the process is stopped.
    pub async fn run(mut self) -> Result<()> {
        add_addresses(self.info)?;
        self.register_node().await?;
        eprintln!(
            "runner: node {} of {} ready; pods run from {}",
            node_name(self.info.name),
            self.info.name,
            self.root.display()
        );
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        loop {
            ticker.tick().await;
            if let Err(error) = self.round().await {
                eprintln!("runner: {error:#}");
            }
        }
    }

    fn node(&self) -> serde_json::Value {
        let name = node_name(self.info.name);
        // Small, as a dedicated database node of the lab: the hub's capacity estimate
        // counts every Ready node (a 10-core replica still fits once in a member's 18).
        let resources = serde_json::json!({"cpu": "2", "memory": "8Gi", "pods": "20", "ephemeral-storage": "100Gi"});
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "lab-runner",
                    RUNNER_LABEL: "true",
                    "topology.kubernetes.io/zone": self.info.zone,
                    "topology.kubernetes.io/region": self.info.region,
                },
            },
            "spec": {
                "taints": [{"key": RUNNER_LABEL, "value": "true", "effect": "NoSchedule"}],
            },
            "status": {
                "allocatable": resources,
                "capacity": resources,
                "nodeInfo": {
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "kubeletVersion": "lab-runner",
                    "kubeProxyVersion": "lab-runner",
                    "bootID": "", "containerRuntimeVersion": "host-processes", "kernelVersion": "",
                    "machineID": "", "osImage": "", "systemUUID": "",
                },
            },
        })
    }

    async fn register_node(&mut self) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node: Node = serde_json::from_value(self.node())?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error).context("creating the database node"),
        }
        self.heartbeat().await
    }

    /// The node's Ready condition and its Lease, as a kubelet renews them.
    async fn heartbeat(&mut self) -> Result<()> {
        let name = node_name(self.info.name);
        let now = jiff::Timestamp::now();
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut status = self.node()["status"].clone();
        status["conditions"] = serde_json::json!([{
            "type": "Ready", "status": "True", "reason": "RunnerReady",
            "message": "the lab runner runs this node's pods as host processes",
            "lastHeartbeatTime": now.to_string(), "lastTransitionTime": now.to_string(),
        }]);
        status["addresses"] = serde_json::json!([
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": name},
        ]);
        nodes
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({"status": status})),
            )
            .await
            .context("reporting the node Ready")?;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "kube-node-lease");
        let lease = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                     "renewTime": MicroTime(now)},
        });
        leases
            .patch(
                &name,
                &PatchParams::apply("lab-runner").force(),
                &Patch::Apply(&lease),
            )
            .await
            .context("renewing the node Lease")?;
        self.last_heartbeat = Some(Instant::now());
        Ok(())
    }

    async fn round(&mut self) -> Result<()> {
        if self
            .last_heartbeat
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(10))
        {
            self.heartbeat().await?;
            self.remove_deleted_claims().await?;
        }
        let pods: Api<Pod> = Api::all(self.client.clone());
        let list = pods
            .list(
                &ListParams::default()
                    .fields(&format!("spec.nodeName={}", node_name(self.info.name))),
            )
            .await
            .context("listing the node's pods")?;
        self.stopping.retain(|_, task| !task.is_finished());
        let present: Vec<String> = list.items.iter().filter_map(|p| p.uid()).collect();
        // Pods gone from the API (deleted by force): stop what runs.
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !present.contains(uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(run) = self.pods.remove(&uid) {
                self.stop(run, None, 0);
            }
        }
        for pod in &list.items {
            let Some(uid) = pod.uid() else { continue };
            if pod.metadata.deletion_timestamp.is_some() {
                if let Some(run) = self.pods.remove(&uid) {
                    let grace = pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.termination_grace_period_seconds)
                        .unwrap_or(30);
                    self.stop(run, Some(pods.clone()), grace);
                } else if !self.stopping.contains_key(&uid) {
                    // Nothing runs (the runner restarted, or it never started): remove it.
                    delete_pod(&pods, pod).await;
                }
                continue;
            }
            if !self.pods.contains_key(&uid) {
                let slot = self.slot_for(pod);
                let dir = self.root.join("pods").join(&uid[..8.min(uid.len())]);
                self.pods.insert(
                    uid.clone(),
                    PodRun {
                        name: pod.name_any(),
                        namespace: pod.namespace().unwrap_or_default(),
                        uid: uid.clone(),
                        slot,
                        dir,
                        running: HashMap::new(),
                        restarts: HashMap::new(),
                        restart_at: HashMap::new(),
                        init_done: false,
                        retry_init_at: None,
                        failure: None,
                        ready: false,
                        last_probe: None,
                        reported: None,
                    },
                );
            }
            self.tend(pod, &uid).await;
        }
        Ok(())
    }

    /// A claim's directory goes when the claim does (the lab's StorageClass deletes its
    /// volumes, `reclaimPolicy: Delete`), unless a pod of this node still runs on it.
    async fn remove_deleted_claims(&self) -> Result<()> {
        let claims_root = self.root.join("claims");
        let Ok(namespaces) = std::fs::read_dir(&claims_root) else {
            return Ok(());
        };
        let claims: Api<PersistentVolumeClaim> = Api::all(self.client.clone());
        let existing: Vec<(String, String)> = claims
            .list(&ListParams::default())
            .await
            .context("listing claims")?
            .items
            .iter()
            .map(|c| (c.namespace().unwrap_or_default(), c.name_any()))
            .collect();
        let in_use: Vec<(String, String)> = self
            .pods
            .values()
            .map(|p| (p.namespace.clone(), p.name.clone()))
            .collect();
        for namespace in namespaces.flatten() {
            let namespace_name = namespace.file_name().to_string_lossy().into_owned();
            for claim in std::fs::read_dir(namespace.path())?.flatten() {
                let claim_name = claim.file_name().to_string_lossy().into_owned();
                let exists = existing.contains(&(namespace_name.clone(), claim_name.clone()));
                // `data-<pod>` is the StatefulSet's naming: its pod must be gone too.
                let used = in_use.iter().any(|(ns, pod)| {
                    *ns == namespace_name && claim_name.ends_with(&format!("-{pod}"))
                });
                if !exists && !used {
                    let _ = std::fs::remove_dir_all(claim.path());
                }
            }
            let _ = std::fs::remove_dir(namespace.path());
        }
        Ok(())
    }

    /// The pod's address slot: the one its status names (a restarted runner), or the
    /// first free one.
    fn slot_for(&self, pod: &Pod) -> u8 {
        let reported = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
            .filter(|ip| ip.octets()[..3] == inside_address(self.info, 0).octets()[..3])
            .map(|ip| ip.octets()[3]);
        if let Some(slot) = reported {
            return slot;
        }
        let used: Vec<u8> = self.pods.values().map(|p| p.slot).collect();
        (FIRST_SLOT..=250)
            .find(|s| !used.contains(s))
            .unwrap_or(250)
    }

    /// Starts, restarts, probes and reports one pod.
    async fn tend(&mut self, pod: &Pod, uid: &str) {
        let client = self.client.clone();
        let info = self.info;
        let root = self.root.clone();
        let bulkhead = self.bulkhead.clone();
        let Some(run) = self.pods.get_mut(uid) else {
            return;
        };
        let spec = pod.spec.clone().unwrap_or_default();
        let init_due = run.retry_init_at.is_none_or(|at| Instant::now() >= at);
        if !run.init_done && init_due {
            match prepare(&client, info, &root, &bulkhead, pod, run).await {
                Ok(()) => {
                    run.init_done = true;
                    run.failure = None;
                }
                Err(error) => {
                    // Tried again in 5 s (a Secret not there yet, a refused request).
                    eprintln!("runner: pod {}/{}: {error:#}", run.namespace, run.name);
                    run.failure = Some(format!("{error:#}"));
                    run.retry_init_at = Some(Instant::now() + Duration::from_secs(5));
                }
            }
        }
        if run.init_done {
            for container in &spec.containers {
                let exited = match run.running.get_mut(&container.name) {
                    Some(running) => match running.child.try_wait() {
                        Ok(Some(status)) => {
                            eprintln!(
                                "runner: pod {}/{} container {} exited: {status}",
                                run.namespace, run.name, container.name
                            );
                            true
                        }
                        _ => false,
                    },
                    None => true,
                };
                if !exited {
                    continue;
                }
                if run.running.remove(&container.name).is_some() {
                    *run.restarts.entry(container.name.clone()).or_default() += 1;
                    run.restart_at.insert(
                        container.name.clone(),
                        Instant::now() + Duration::from_secs(2),
                    );
                    run.ready = false;
                }
                if run
                    .restart_at
                    .get(&container.name)
                    .is_some_and(|at| Instant::now() < *at)
                {
                    continue;
                }
                match start_container(&client, info, &root, &bulkhead, pod, run, container).await {
                    Ok(child) => {
                        run.running.insert(
                            container.name.clone(),
                            Running {
                                child,
                                started: jiff::Timestamp::now(),
                            },
                        );
                    }
                    Err(error) => {
                        run.failure = Some(format!("{error:#}"));
                        run.restart_at.insert(
                            container.name.clone(),
                            Instant::now() + Duration::from_secs(5),
                        );
                    }
                }
            }
            probe(info, &spec.containers, run).await;
        }
        let outside = outside_address(info, run.slot).to_string();
        if pod.annotations().get(OUTSIDE_ADDRESS_ANNOTATION) != Some(&outside) {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &run.namespace);
            let patch = serde_json::json!({"metadata": {"annotations": {OUTSIDE_ADDRESS_ANNOTATION: outside}}});
            if let Err(error) = pods
                .patch(&run.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                eprintln!(
                    "runner: annotating pod {}/{}: {error}",
                    run.namespace, run.name
                );
            }
        }
        let status = pod_status(info, pod, run);
        if run.reported.as_ref() != Some(&status) {
            let pods: Api<Pod> = Api::namespaced(client, &run.namespace);
            match pods
                .patch_status(
                    &run.name,
                    &PatchParams::default(),
                    &Patch::Merge(&serde_json::json!({"status": status})),
                )
                .await
            {
                Ok(_) => run.reported = Some(status),
                Err(error) => eprintln!(
                    "runner: reporting pod {}/{}: {error}",
                    run.namespace, run.name
                ),
            }
        }
    }

    /// Stops a pod's processes in the background (SIGTERM, SIGKILL after `grace`), then
    /// removes its directory and, when `pods` is given, the pod.
    fn stop(&mut self, run: PodRun, pods: Option<Api<Pod>>, grace: i64) {
        let uid = run.uid.clone();
        let task = tokio::spawn(async move {
            let PodRun {
                mut running,
                dir,
                name,
                namespace,
                uid,
                ..
            } = run;
            for running in running.values() {
                if let Some(pid) = running.child.id() {
                    let _ = kill(Pid::from_raw(-(pid as i32)), Signal::SIGTERM);
                }
            }
            let deadline = Instant::now() + Duration::from_secs(grace.max(0) as u64);
            for running in running.values_mut() {
                let left = deadline.saturating_duration_since(Instant::now());
                if tokio::time::timeout(left, running.child.wait())
                    .await
                    .is_err()
                    && let Some(pid) = running.child.id()
                {
                    let _ = kill(Pid::from_raw(-(pid as i32)), Signal::SIGKILL);
                    let _ = running.child.wait().await;
                }
            }
            let _ = std::fs::remove_dir_all(&dir);
            if let Some(pods) = pods {
                let params = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                let pods: Api<Pod> = Api::namespaced(pods.into_client(), &namespace);
                if let Err(error) = pods.delete(&name, &params).await {
                    eprintln!("runner: removing pod {namespace}/{name}: {error}");
                }
            }
        });
        self.stopping.insert(uid, task);
    }
}

async fn delete_pod(pods: &Api<Pod>, pod: &Pod) {
    let namespaced: Api<Pod> = Api::namespaced(
        pods.clone().into_client(),
        &pod.namespace().unwrap_or_default(),
    );
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    let _ = namespaced.delete(&pod.name_any(), &params).await;
}

/// Mount path -> host directory of a container.
type Mounts = Vec<(String, PathBuf)>;

fn claims_dir(root: &Path, namespace: &str, claim: &str) -> PathBuf {
    root.join("claims").join(namespace).join(claim)
}

/// The host directory of each volume: a claim's (kept), an emptyDir or Secret (the
/// pod's). Secrets are written now.
async fn volumes(
    client: &Client,
    root: &Path,
    pod: &Pod,
    run: &PodRun,
) -> Result<BTreeMap<String, PathBuf>> {
    let mut dirs = BTreeMap::new();
    let spec = pod.spec.clone().unwrap_or_default();
    for volume in spec.volumes.unwrap_or_default() {
        let dir = if let Some(claim) = &volume.persistent_volume_claim {
            claims_dir(root, &run.namespace, &claim.claim_name)
        } else if volume.empty_dir.is_some() {
            run.dir.join("volumes").join(&volume.name)
        } else if let Some(secret) = &volume.secret {
            let name = secret.secret_name.clone().unwrap_or_default();
            let dir = run.dir.join("volumes").join(&volume.name);
            let secrets: Api<Secret> = Api::namespaced(client.clone(), &run.namespace);
            let found = secrets.get_opt(&name).await?.with_context(|| {
                format!(
                    "the Secret {name} the volume {} mounts does not exist yet",
                    volume.name
                )
            })?;
            std::fs::create_dir_all(&dir)?;
            for (key, value) in found.data.unwrap_or_default() {
                std::fs::write(dir.join(&key), &value.0)?;
            }
            dir
        } else {
            bail!(
                "volume {}: the lab runner mounts persistentVolumeClaim, emptyDir and secret volumes only",
                volume.name
            );
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        dirs.insert(volume.name.clone(), dir);
    }
    Ok(dirs)
}

fn container_mounts(container: &Container, volumes: &BTreeMap<String, PathBuf>) -> Result<Mounts> {
    let mut mounts: Mounts = vec![];
    for mount in container.volume_mounts.clone().unwrap_or_default() {
        let dir = volumes.get(&mount.name).with_context(|| {
            format!(
                "container {} mounts an unknown volume {}",
                container.name, mount.name
            )
        })?;
        mounts.push((
            mount.mount_path.trim_end_matches('/').to_string(),
            dir.clone(),
        ));
    }
    // Longest first: a mount inside another wins.
    mounts.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
    Ok(mounts)
}

/// A path as the host sees it.
fn host_path(value: &str, mounts: &Mounts) -> String {
    for (path, dir) in mounts {
        if value == path {
            return dir.display().to_string();
        }
        if let Some(rest) = value.strip_prefix(&format!("{path}/")) {
            return dir.join(rest).display().to_string();
        }
    }
    value.to_string()
}

/// An argument as the host runs it: mount paths rewritten (also after `--flag=`), and
/// `0.0.0.0` as the pod's address.
fn host_argument(arg: &str, mounts: &Mounts, inside: Ipv4Addr) -> String {
    let rewritten = match arg.split_once('=') {
        Some((flag, value)) if flag.starts_with('-') => {
            format!("{flag}={}", host_path(value, mounts))
        }
        _ => host_path(arg, mounts),
    };
    rewritten.replace("0.0.0.0", &inside.to_string())
}

/// The program a container's command names: a mounted path, `bulkhead` (the Bulkhead
/// image), or the host's.
fn host_program(program: &str, mounts: &Mounts, bulkhead: &Path) -> PathBuf {
    let rewritten = host_path(program, mounts);
    if rewritten != program {
        return PathBuf::from(rewritten);
    }
    if program == "bulkhead" || program.ends_with("/bulkhead") {
        return bulkhead.to_path_buf();
    }
    PathBuf::from(program)
}

async fn environment(
    client: &Client,
    info: &ClusterInfo,
    pod: &Pod,
    run: &PodRun,
    container: &Container,
    mounts: &Mounts,
) -> Result<Vec<(String, String)>> {
    let inside = inside_address(info, run.slot);
    let outside = outside_address(info, run.slot);
    let mut env = vec![
        ("HOSTNAME".to_string(), run.name.clone()),
        (
            "BULKHEAD_LISTEN_ADDRESSES".to_string(),
            format!("{inside},{outside}"),
        ),
    ];
    for var in container.env.clone().unwrap_or_default() {
        let value = if let Some(value) = var.value {
            host_path(&value, mounts)
        } else if let Some(from) = var.value_from {
            if let Some(field) = from.field_ref {
                match field.field_path.as_str() {
                    "metadata.name" => run.name.clone(),
                    "metadata.namespace" => run.namespace.clone(),
                    "metadata.uid" => run.uid.clone(),
                    "status.podIP" => inside.to_string(),
                    "spec.nodeName" => node_name(info.name),
                    other => bail!(
                        "env {}: the lab runner does not serve fieldRef {other}",
                        var.name
                    ),
                }
            } else if let Some(key) = from.secret_key_ref {
                let secrets: Api<Secret> = Api::namespaced(client.clone(), &run.namespace);
                let secret = secrets
                    .get_opt(&key.name)
                    .await?
                    .with_context(|| format!("env {}: no Secret {}", var.name, key.name))?;
                let bytes = secret
                    .data
                    .unwrap_or_default()
                    .remove(&key.key)
                    .with_context(|| {
                        format!(
                            "env {}: no key {} in Secret {}",
                            var.name, key.key, key.name
                        )
                    })?;
                String::from_utf8_lossy(&bytes.0).into_owned()
            } else {
                bail!(
                    "env {}: the lab runner serves value, fieldRef and secretKeyRef",
                    var.name
                )
            }
        } else {
            String::new()
        };
        env.push((var.name, value));
    }
    let _ = pod;
    Ok(env)
}

fn command(
    bulkhead: &Path,
    info: &ClusterInfo,
    run: &PodRun,
    container: &Container,
    mounts: &Mounts,
) -> Result<(PathBuf, Vec<String>)> {
    let mut words: Vec<String> = container.command.clone().unwrap_or_default();
    words.extend(container.args.clone().unwrap_or_default());
    if words.is_empty() {
        bail!(
            "container {} has no command: the lab runner runs no image entrypoints",
            container.name
        );
    }
    let inside = inside_address(info, run.slot);
    let program = host_program(&words[0], mounts, bulkhead);
    let args = words[1..]
        .iter()
        .map(|a| host_argument(a, mounts, inside))
        .collect();
    Ok((program, args))
}

async fn spawn(
    client: &Client,
    info: &ClusterInfo,
    bulkhead: &Path,
    pod: &Pod,
    run: &PodRun,
    container: &Container,
    volumes: &BTreeMap<String, PathBuf>,
) -> Result<tokio::process::Child> {
    let mounts = container_mounts(container, volumes)?;
    let (program, args) = command(bulkhead, info, run, container, &mounts)?;
    let env = environment(client, info, pod, run, container, &mounts).await?;
    std::fs::create_dir_all(&run.dir)?;
    let log_path = run.dir.join(format!("{}.log", container.name));
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(&log_path)?;
    let mut cmd = std::process::Command::new(&program);
    cmd.args(&args)
        .envs(env)
        .current_dir(&run.dir)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    let child = tokio::process::Command::from(cmd)
        .spawn()
        .with_context(|| {
            format!(
                "starting {} for container {}",
                program.display(),
                container.name
            )
        })?;
    Ok(child)
}

/// Volumes, then each init container to completion.
async fn prepare(
    client: &Client,
    info: &ClusterInfo,
    root: &Path,
    bulkhead: &Path,
    pod: &Pod,
    run: &mut PodRun,
) -> Result<()> {
    let volumes = volumes(client, root, pod, run).await?;
    let spec = pod.spec.clone().unwrap_or_default();
    for container in spec.init_containers.unwrap_or_default() {
        let mut child = spawn(client, info, bulkhead, pod, run, &container, &volumes).await?;
        let status = tokio::time::timeout(Duration::from_secs(120), child.wait())
            .await
            .with_context(|| {
                format!("init container {} still runs after 120 s", container.name)
            })??;
        if !status.success() {
            bail!(
                "init container {} failed ({status}); see {}",
                container.name,
                run.dir.join(format!("{}.log", container.name)).display()
            );
        }
    }
    Ok(())
}

async fn start_container(
    client: &Client,
    info: &ClusterInfo,
    root: &Path,
    bulkhead: &Path,
    pod: &Pod,
    run: &mut PodRun,
    container: &Container,
) -> Result<tokio::process::Child> {
    let volumes = volumes(client, root, pod, run).await?;
    let child = spawn(client, info, bulkhead, pod, run, container, &volumes).await?;
    run.failure = None;
    Ok(child)
}

/// One HTTP GET to `address:port path`; whether it answered 2xx or 3xx within a second.
async fn http_ok(address: Ipv4Addr, port: u16, path: &str) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect((address, port)).await.ok()?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        let code: u16 = std::str::from_utf8(&head[9..12]).ok()?.parse().ok()?;
        Some((200..400).contains(&code))
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Readiness: every container running and its readiness probe (an HTTP GET) answering.
async fn probe(info: &ClusterInfo, containers: &[Container], run: &mut PodRun) {
    if run
        .last_probe
        .is_some_and(|at| at.elapsed() < Duration::from_secs(1))
    {
        return;
    }
    run.last_probe = Some(Instant::now());
    let inside = inside_address(info, run.slot);
    let mut ready = true;
    for container in containers {
        if !run.running.contains_key(&container.name) {
            ready = false;
            continue;
        }
        let Some(http) = container
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
        else {
            continue;
        };
        let port = match &http.port {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port) => *port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name) => container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .map(|p| p.container_port)
                .unwrap_or(0),
        };
        if !http_ok(inside, port as u16, http.path.as_deref().unwrap_or("/")).await {
            ready = false;
        }
    }
    run.ready = ready;
}

fn pod_status(info: &ClusterInfo, pod: &Pod, run: &PodRun) -> serde_json::Value {
    let inside = inside_address(info, run.slot).to_string();
    let spec = pod.spec.clone().unwrap_or_default();
    let started_at = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.clone())
        .unwrap_or(Time(jiff::Timestamp::now()));
    let condition = |type_: &str, ok: bool| {
        serde_json::json!({"type": type_, "status": if ok { "True" } else { "False" },
            "lastTransitionTime": started_at})
    };
    let containers: Vec<serde_json::Value> = spec
        .containers
        .iter()
        .map(|c| {
            let state = match run.running.get(&c.name) {
                Some(r) => serde_json::json!({"running": {"startedAt": r.started.to_string()}}),
                None => serde_json::json!({"waiting": {
                    "reason": if run.failure.is_some() { "CreateContainerError" } else { "ContainerCreating" },
                    "message": run.failure.clone().unwrap_or_default(),
                }}),
            };
            serde_json::json!({
                "name": c.name,
                "image": c.image.clone().unwrap_or_default(),
                "imageID": "",
                "ready": run.ready && run.running.contains_key(&c.name),
                "started": run.running.contains_key(&c.name),
                "restartCount": run.restarts.get(&c.name).copied().unwrap_or(0),
                "state": state,
            })
        })
        .collect();
    let inits: Vec<serde_json::Value> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            serde_json::json!({
                "name": c.name,
                "image": c.image.clone().unwrap_or_default(),
                "imageID": "",
                "ready": run.init_done,
                "restartCount": 0,
                "state": if run.init_done {
                    serde_json::json!({"terminated": {"exitCode": 0, "reason": "Completed"}})
                } else {
                    serde_json::json!({"waiting": {"reason": "PodInitializing"}})
                },
            })
        })
        .collect();
    serde_json::json!({
        "phase": if run.init_done { "Running" } else { "Pending" },
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": inside,
        "podIPs": [{"ip": inside}],
        "startTime": started_at,
        "conditions": [
            condition("PodScheduled", true),
            condition("Initialized", run.init_done),
            condition("ContainersReady", run.ready),
            condition("Ready", run.ready),
        ],
        "containerStatuses": containers,
        "initContainerStatuses": inits,
    })
}
