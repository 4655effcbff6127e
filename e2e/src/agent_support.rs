//! Running `bulkhead agent` as a process in a lab member, and playing the hub's part of
//! the fencing protocol from a test.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;

use crate::{Check, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use tokio::task::JoinHandle;

use crate::lab::Lab;

/// A binary built in this workspace (debug), or the one the environment variable
/// `override_var` names.
pub fn workspace_binary(name: &str, override_var: &str, package: &str) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(override_var) {
        return Ok(PathBuf::from(path));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let path = target.join("debug").join(name);
    if !path.is_file() {
        bail!(
            "{} is missing; run `cargo build -p {package}` first (make e2e does)",
            path.display()
        );
    }
    Ok(path)
}

/// The `bulkhead` binary built in this workspace (debug), or the one `BULKHEAD_BIN`
/// names (`make bench-lab` runs the release build).
pub fn bulkhead_binary() -> Result<PathBuf> {
    workspace_binary("bulkhead", "BULKHEAD_BIN", "bulkhead")
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// A `bulkhead agent` process, killed when dropped.
pub struct AgentProcess {
    child: Child,
    pub probe_port: u16,
    pub log: PathBuf,
}

impl AgentProcess {
    /// Starts the agent in `cluster` (through 127.0.0.1, inside the zone) for `namespace`
    /// only, with extra arguments such as the lease settings.
    pub fn start(lab: &Lab, cluster: &str, namespace: &str, extra: &[&str]) -> Result<Self> {
        let probe_port = free_port();
        let log = lab.log_dir(cluster).join(format!("agent-{namespace}.log"));
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(bulkhead_binary()?)
            .arg("agent")
            .arg("--kubeconfig")
            .arg(lab.inside_kubeconfig(cluster))
            .args([
                "--namespace",
                namespace,
                "--probe-address",
                &format!("127.0.0.1:{probe_port}"),
            ])
            .args(extra)
            .env("RUST_LOG", "info,bulkhead=debug")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()?;
        Ok(AgentProcess {
            child,
            probe_port,
            log,
        })
    }

    /// The agent's log so far (for failure messages).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Renews a Lease the way the hub does, until stopped.
pub struct LeaseRenewer {
    task: JoinHandle<()>,
}

/// Writes the Lease once with renewTime = now.
pub async fn renew_lease(
    client: &Client,
    namespace: &str,
    name: &str,
    duration_seconds: i32,
) -> Result<()> {
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "holderIdentity": "e2e-hub",
            "leaseDurationSeconds": duration_seconds,
            "renewTime": MicroTime(jiff::Timestamp::now()),
        }
    }))?;
    Api::<Lease>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::apply("e2e-hub").force(),
            &Patch::Apply(&lease),
        )
        .await?;
    Ok(())
}

impl LeaseRenewer {
    /// Renews `namespace/name` every `interval`.
    pub fn start(
        client: Client,
        namespace: &str,
        name: &str,
        duration_seconds: i32,
        interval: Duration,
    ) -> Self {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        let task = tokio::spawn(async move {
            loop {
                if let Err(error) = renew_lease(&client, &namespace, &name, duration_seconds).await
                {
                    eprintln!("lease renewal failed: {error}");
                }
                tokio::time::sleep(interval).await;
            }
        });
        LeaseRenewer { task }
    }

    /// Stops renewing.
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for LeaseRenewer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The database's pods that are not being deleted: name -> (uid, image).
pub async fn pods(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<BTreeMap<String, (String, String)>> {
    let list = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("example.com/database={name}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let image = p
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_default();
            (
                p.metadata.name.unwrap_or_default(),
                (p.metadata.uid.unwrap_or_default(), image),
            )
        })
        .collect())
}

/// The addresses of a Service's ready endpoints, from its EndpointSlices.
pub async fn ready_endpoint_addresses(
    client: &Client,
    ns: &str,
    service: &str,
) -> Result<Vec<String>> {
    let list = Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await?;
    Ok(list
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .filter_map(|e| e.addresses.first().cloned())
        .collect())
}

/// Ready endpoints of a Service, from its EndpointSlices.
pub async fn ready_endpoints(client: &Client, ns: &str, service: &str) -> Result<usize> {
    Ok(ready_endpoint_addresses(client, ns, service).await?.len())
}

/// What a namespace's pods and the cluster's nodes say about readiness, for a failure
/// message: each pod's phase and Ready condition, each node's Ready condition.
pub async fn readiness_report(client: &Client, ns: &str) -> Result<String> {
    /// The Ready condition among (type, status, reason) triples.
    fn ready<'a>(
        mut conditions: impl Iterator<Item = (&'a str, &'a str, Option<&'a str>)>,
    ) -> String {
        conditions
            .find(|(kind, _, _)| *kind == "Ready")
            .map(|(_, status, reason)| format!("Ready={status} {}", reason.unwrap_or_default()))
            .unwrap_or_else(|| "no Ready condition".to_string())
    }
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let mut lines = Vec::new();
    for pod in &pods.items {
        let status = pod.status.as_ref();
        let conditions = status
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        lines.push(format!(
            "pod {} {} {}",
            pod.metadata.name.as_deref().unwrap_or_default(),
            status.and_then(|s| s.phase.as_deref()).unwrap_or_default(),
            ready(conditions.iter().map(|c| (
                c.type_.as_str(),
                c.status.as_str(),
                c.reason.as_deref()
            )))
        ));
    }
    for node in &nodes.items {
        let conditions = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        lines.push(format!(
            "node {} {}",
            node.metadata.name.as_deref().unwrap_or_default(),
            ready(conditions.iter().map(|c| (
                c.type_.as_str(),
                c.status.as_str(),
                c.reason.as_deref()
            )))
        ));
    }
    Ok(lines.join("; "))
}

/// Waits until a Service has exactly `count` ready endpoints.
pub async fn wait_endpoints(client: &Client, ns: &str, service: &str, count: usize) -> Result<()> {
    wait_for(
        &format!("Service {service} with {count} ready endpoints"),
        Duration::from_secs(30),
        || async move {
            match ready_endpoints(client, ns, service).await {
                Ok(n) if n == count => Check::Done(()),
                Ok(n) => Check::Waiting(format!("{n} ready endpoints")),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await
}
