//! `bulkhead switchover db/<name> --to <cluster>`: moves the primary of a MyDatabase with
//! replica clusters to another cluster of its placement. The hub does the work; this sets
//! what it acts on (`spec.topology.primaryCluster`, the field a GitOps tool sets) after
//! checking what the hub would wait for, then follows it until the hub records the new
//! primary cluster (docs/mydatabase.md, "Switchover").

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};

use crate::api::mydatabase::ClusterRole;
use crate::api::{MemberCluster, MyDatabase, ResourceBinding, find_condition};
use crate::process::{ClientOptions, connect};

/// `bulkhead switchover` options.
#[derive(clap::Args, Debug)]
pub struct SwitchoverOptions {
    #[command(flatten)]
    pub client: ClientOptions,
    /// The database: `db/<name>` (or `mydatabase/<name>`).
    pub database: String,
    /// The member cluster that is to hold the primary (one of the placement's replica
    /// clusters).
    #[arg(long)]
    pub to: String,
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// How long to follow the switchover; 0 sets the field and returns.
    #[arg(long, default_value_t = 300)]
    pub timeout_seconds: u64,
}

/// The database's name from `db/<name>`.
pub fn database_name(text: &str) -> Result<&str> {
    let (kind, name) = text
        .split_once('/')
        .with_context(|| format!("`{text}`: give db/<name>, e.g. db/orders"))?;
    let kind = kind.to_lowercase();
    let known = [
        "db",
        "mydatabase",
        "mydatabases",
        "mydatabase.example.com",
        "mydatabases.example.com",
    ];
    if !known.contains(&kind.as_str()) || name.is_empty() {
        bail!("`{text}`: this acts on a MyDatabase; give db/<name>, e.g. db/orders");
    }
    Ok(name)
}

/// Why the hub would not start the switchover now, from what the CLI can read: None when
/// it would.
pub fn refusal(
    database: &MyDatabase,
    binding: Option<&ResourceBinding>,
    members: &[MemberCluster],
    to: &str,
) -> Option<String> {
    let id = format!(
        "{}/{}",
        database.metadata.namespace.as_deref().unwrap_or_default(),
        database.metadata.name.as_deref().unwrap_or_default()
    );
    let status = database.status.clone().unwrap_or_default();
    let Some(recorded) = status.primary_cluster.as_deref() else {
        return Some(format!(
            "{id} has no primary cluster: its copies are independent databases (set spec.topology.acrossClusters: ReplicaClusters for replica clusters)"
        ));
    };
    if recorded == to {
        return None;
    }
    let placed: Vec<&str> = binding
        .map(|b| {
            b.spec
                .clusters
                .iter()
                .filter(|c| c.replicas > 0)
                .map(|c| c.name.as_str())
                .collect()
        })
        .unwrap_or_default();
    if !placed.contains(&to) {
        return Some(format!(
            "{to} is not in the placement of {id} ({}); place the database there first",
            placed.join(", ")
        ));
    }
    for cluster in &placed {
        if let Some(why) = member_not_ready(members, cluster) {
            return Some(format!(
                "{cluster} is not Ready ({why}); a switchover needs every cluster of the placement Ready"
            ));
        }
    }
    let role = status
        .clusters
        .iter()
        .find(|c| c.name == to)
        .and_then(|c| c.role);
    if role != Some(ClusterRole::Replica) {
        return Some(format!(
            "{to} does not run as a replica cluster of {recorded} yet (its row in status.clusters says role {role:?})"
        ));
    }
    None
}

/// The hub MyDatabase `db/<name>` in `namespace`: its name, the hub's client, the API
/// and the object as read.
pub async fn hub_database(
    client: &ClientOptions,
    database: &str,
    namespace: &str,
) -> Result<(String, kube::Client, Api<MyDatabase>, MyDatabase)> {
    let name = database_name(database)?;
    let client = connect(client).await.context("connecting to the hub")?;
    let databases: Api<MyDatabase> = Api::namespaced(client.clone(), namespace);
    let read = databases
        .get(name)
        .await
        .with_context(|| format!("reading MyDatabase {namespace}/{name} on the hub"))?;
    Ok((name.to_string(), client, databases, read))
}

/// Why a MemberCluster does not say Ready (None: it does).
pub fn member_not_ready(members: &[MemberCluster], cluster: &str) -> Option<String> {
    let Some(member) = members
        .iter()
        .find(|m| m.metadata.name.as_deref() == Some(cluster))
    else {
        return Some(format!(
            "no MemberCluster named {cluster} (`bulkhead get clusters` lists them)"
        ));
    };
    let ready = member
        .status
        .as_ref()
        .and_then(|s| find_condition(&s.conditions, "Ready"));
    match ready {
        Some(c) if c.status == "True" => None,
        Some(c) => Some(format!("{}: {}", c.reason, c.message)),
        None => Some("no Ready condition".into()),
    }
}

pub async fn run(options: &SwitchoverOptions) -> Result<()> {
    let namespace = options.namespace.as_str();
    let to = options.to.as_str();
    let (name, client, databases, database) =
        hub_database(&options.client, &options.database, namespace).await?;
    let name = name.as_str();
    let binding = Api::<ResourceBinding>::namespaced(client.clone(), namespace)
        .get_opt(&crate::hub::federation::scheduler::binding_name(
            name,
            "MyDatabase",
        ))
        .await
        .context("reading the database's ResourceBinding")?;
    let members = Api::<MemberCluster>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing MemberClusters")?;
    let recorded = database
        .status
        .as_ref()
        .and_then(|s| s.primary_cluster.clone());
    if recorded.as_deref() == Some(to) {
        println!("{namespace}/{name}: {to} already holds the primary");
        return Ok(());
    }
    if let Some(why) = refusal(&database, binding.as_ref(), &members.items, to) {
        bail!("switchover of {namespace}/{name} to {to} refused: {why}");
    }
    if let Some(aborted) = database
        .status
        .as_ref()
        .and_then(|s| s.aborted_switchover.as_ref())
    {
        // Asked anew: the hub tries again once the record of the one it gave up is gone.
        println!(
            "{namespace}/{name}: the switchover to {} aborted at {} is asked for anew",
            aborted.to, aborted.time
        );
        databases
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"abortedSwitchover": null}})),
            )
            .await
            .context("clearing status.abortedSwitchover")?;
    }
    databases
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"topology": {"primaryCluster": to}}})),
        )
        .await
        .context("setting spec.topology.primaryCluster")?;
    println!(
        "{namespace}/{name}: moving the primary from {} to {to}",
        recorded.unwrap_or_default()
    );
    if options.timeout_seconds == 0 {
        return Ok(());
    }
    let started = Instant::now();
    let deadline = Duration::from_secs(options.timeout_seconds);
    let bindings: Api<ResourceBinding> = Api::namespaced(client, namespace);
    let mut said = String::new();
    while started.elapsed() < deadline {
        let status = databases.get(name).await?.status.unwrap_or_default();
        if status.primary_cluster.as_deref() == Some(to) {
            println!(
                "{namespace}/{name}: {to} holds the primary ({:.1} s)",
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if let Some(aborted) = status.aborted_switchover.filter(|a| a.to == to) {
            bail!(
                "{namespace}/{name}: {}; run this again to try once more",
                aborted.message
            );
        }
        let row = bindings
            .get_opt(&crate::hub::federation::scheduler::binding_name(
                name,
                "MyDatabase",
            ))
            .await?
            .and_then(|b| b.status)
            .and_then(|s| s.clusters.into_iter().find(|r| r.name == to))
            .and_then(|r| r.message);
        if let Some(message) = row.filter(|m| *m != said) {
            println!("  {message}");
            said = message;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    bail!(
        "{namespace}/{name}: {to} does not hold the primary after {} s; the hub goes on (follow it with `bulkhead get bindings -n {namespace}`)",
        options.timeout_seconds
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_database_is_named_as_kubectl_names_it() {
        assert_eq!(database_name("db/orders").unwrap(), "orders");
        assert_eq!(database_name("MyDatabase/orders").unwrap(), "orders");
        for bad in ["orders", "deployment/web", "db/"] {
            assert!(database_name(bad).is_err(), "{bad}");
        }
    }

    fn member(name: &str, ready: bool) -> MemberCluster {
        serde_json::from_value(json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "MemberCluster",
            "metadata": {"name": name},
            "spec": {"apiEndpoint": "https://127.0.0.1:6443", "zone": "zone-a", "secretRef": {"name": "x", "namespace": "bulkhead-system"}},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"},
                "reason": if ready {"Healthy"} else {"Unreachable"}, "message": "probe failed",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        }))
        .unwrap()
    }

    /// What the hub would wait for is refused up front, with the reason.
    #[test]
    fn a_switchover_is_refused_while_a_cluster_is_not_ready_or_the_target_does_not_stream() {
        let database: MyDatabase = serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "MyDatabase",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"replicas": 2},
            "status": {"primaryCluster": "east", "replicas": 2, "readyReplicas": 2,
                       "clusters": [{"name": "east", "role": "Primary"}, {"name": "west", "role": "Replica"}]}
        }))
        .unwrap();
        let binding: ResourceBinding = serde_json::from_value(json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "orders-mydatabase", "namespace": "shop"},
            "spec": {"resource": {"apiVersion": "example.com/v1", "kind": "MyDatabase", "name": "orders"},
                     "replicas": 2, "clusters": [{"name": "east", "replicas": 1}, {"name": "west", "replicas": 1}]}
        }))
        .unwrap();
        let ready = [member("east", true), member("west", true)];
        assert_eq!(refusal(&database, Some(&binding), &ready, "west"), None);
        assert!(
            member_not_ready(&ready, "south")
                .is_some_and(|why| why.contains("no MemberCluster named south")),
            "an unknown cluster is named as such"
        );
        let cut = [member("east", false), member("west", true)];
        let why = refusal(&database, Some(&binding), &cut, "west").unwrap();
        assert!(
            why.contains("east is not Ready (Unreachable: probe failed)"),
            "{why}"
        );
        let why = refusal(&database, Some(&binding), &ready, "north").unwrap();
        assert!(
            why.contains("north is not in the placement of shop/orders (east, west)"),
            "{why}"
        );
        let mut not_streaming = database.clone();
        not_streaming.status.as_mut().unwrap().clusters[1].role = None;
        let why = refusal(&not_streaming, Some(&binding), &ready, "west").unwrap();
        assert!(
            why.contains("west does not run as a replica cluster of east"),
            "{why}"
        );
        let mut independent = database;
        independent.status.as_mut().unwrap().primary_cluster = None;
        let why = refusal(&independent, Some(&binding), &ready, "west").unwrap();
        assert!(why.contains("acrossClusters: ReplicaClusters"), "{why}");
    }
}
