//! `bulkhead get clusters`: the members as the hub sees them. `bulkhead get bindings`:
//! each ResourceBinding's decision and what happened in every cluster, including the
//! override policies applied to each cluster's copy.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use crate::api::{MemberCluster, MyDatabase, ResourceBinding, find_condition};
use crate::process::{ClientOptions, connect};

/// `bulkhead get` options.
#[derive(clap::Args, Debug)]
pub struct GetOptions {
    #[command(subcommand)]
    pub what: GetWhat,
}

/// What to show.
#[derive(clap::Subcommand, Debug)]
pub enum GetWhat {
    /// Member clusters: name, zone, readiness and why, version, age, fenced.
    #[command(visible_alias = "cluster", visible_alias = "mc")]
    Clusters(ClientOptions),
    /// ResourceBindings: per template, the decision and each cluster's state.
    #[command(visible_alias = "binding", visible_alias = "rb")]
    Bindings(BindingsOptions),
}

/// `bulkhead get bindings` options.
#[derive(clap::Args, Debug)]
pub struct BindingsOptions {
    #[command(flatten)]
    pub client: ClientOptions,
    /// Only bindings in this namespace (default: every namespace).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
}

/// Lines of a table with aligned columns.
fn aligned(rows: &[Vec<String>], indent: &str) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(String::len)
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            format!("{indent}{}\n", cells.join("   ").trim_end())
        })
        .collect()
}

/// The `get bindings` text: per binding a title with its conditions, then one row per
/// cluster with the decision (selected, replicas, reason) and the placement's state.
/// `primaries`: the primary cluster of each MyDatabase with replica clusters, by
/// (namespace, name), as its template's status records it.
pub fn bindings_table(
    bindings: &[ResourceBinding],
    primaries: &BTreeMap<(String, String), String>,
) -> String {
    let mut sorted: Vec<&ResourceBinding> = bindings.iter().collect();
    sorted.sort_by_key(|b| (b.metadata.namespace.clone(), b.metadata.name.clone()));
    let mut out = String::new();
    for binding in sorted {
        let status = binding.status.clone().unwrap_or_default();
        let conditions: Vec<String> = ["Scheduled", "Propagated", "Healthy", "Degraded"]
            .iter()
            .map(|t| match find_condition(&status.conditions, t) {
                // A False condition says why, e.g. Propagated=False(WaitingForPartition).
                Some(c) if c.status == "False" && !c.reason.is_empty() && *t != "Degraded" => {
                    format!("{t}=False({})", c.reason)
                }
                Some(c) if *t == "Degraded" && c.status == "True" => {
                    format!("{t}=True({})", c.reason)
                }
                Some(c) => format!("{t}={}", c.status),
                None => format!("{t}=-"),
            })
            .collect();
        let resource = &binding.spec.resource;
        out.push_str(&format!(
            "{}/{}: {} {} ({} replicas, policy {}, interpreter {})  {}\n",
            binding.metadata.namespace.clone().unwrap_or_default(),
            binding.metadata.name.clone().unwrap_or_default(),
            resource.kind,
            resource.name,
            binding.spec.replicas,
            binding
                .spec
                .policy
                .as_ref()
                .map(|p| p.name.as_str())
                .unwrap_or("-"),
            status.interpreter.as_deref().unwrap_or("-"),
            conditions.join(" ")
        ));
        if let Some(waiting) = find_condition(&status.conditions, "Propagated")
            .filter(|c| c.reason == crate::hub::federation::aggregate::WAITING_FOR_PARTITION)
        {
            out.push_str(&format!("  {}: {}\n", waiting.reason, waiting.message));
        }
        if resource.kind == "MyDatabase"
            && let Some(primary) = primaries.get(&(
                binding.metadata.namespace.clone().unwrap_or_default(),
                resource.name.clone(),
            ))
        {
            let replicas: Vec<&str> = binding
                .spec
                .clusters
                .iter()
                .map(|c| c.name.as_str())
                .filter(|c| c != primary)
                .collect();
            out.push_str(&format!(
                "  PrimaryCluster: {primary}; replica clusters: {}\n",
                if replicas.is_empty() {
                    "none".to_string()
                } else {
                    replicas.join(", ")
                }
            ));
        }
        let mut rows = vec![
            [
                "CLUSTER",
                "SELECTED",
                "REPLICAS",
                "APPLIED",
                "HEALTH",
                "READY",
                "FENCED",
                "CLEANUP",
                "OVERRIDES",
                "REASON",
            ]
            .map(String::from)
            .to_vec(),
        ];
        let mut names: Vec<&str> = status
            .decisions
            .iter()
            .map(|d| d.cluster.as_str())
            .collect();
        for row in &status.clusters {
            if !names.contains(&row.name.as_str()) {
                names.push(&row.name);
            }
        }
        names.sort();
        for name in names {
            let decision = status.decisions.iter().find(|d| d.cluster == name);
            let placed = binding.spec.clusters.iter().find(|c| c.name == name);
            let row = status.clusters.iter().find(|r| r.name == name);
            let flag = |value: bool| if value { "yes" } else { "-" }.to_string();
            let reason = match (row.and_then(|r| r.message.clone()), decision) {
                (Some(message), _) => message,
                (None, Some(decision)) => decision.reason.clone(),
                (None, None) => String::new(),
            };
            rows.push(vec![
                name.to_string(),
                flag(decision.is_some_and(|d| d.selected)),
                placed
                    .map(|p| p.replicas.to_string())
                    .unwrap_or_else(|| "-".into()),
                row.map(|r| flag(r.applied)).unwrap_or_else(|| "-".into()),
                row.map(|r| format!("{:?}", r.health))
                    .unwrap_or_else(|| "-".into()),
                row.map(|r| r.ready_replicas.to_string())
                    .unwrap_or_else(|| "-".into()),
                row.map(|r| flag(r.fenced)).unwrap_or_else(|| "-".into()),
                row.map(|r| if r.pending_cleanup { "pending" } else { "-" }.to_string())
                    .unwrap_or_else(|| "-".into()),
                row.map(overrides_cell).unwrap_or_else(|| "-".into()),
                reason,
            ]);
        }
        out.push_str(&aligned(&rows, "  "));
    }
    if out.is_empty() {
        out.push_str("no ResourceBindings\n");
    }
    out
}

/// The OVERRIDES cell of a cluster: the override policies applied to its copy, in the
/// order they applied (`ClusterOverridePolicy/mirror,OverridePolicy/web-east`), `FAILED`
/// when one failed (the reason says which and where), `-` when none applies.
fn overrides_cell(row: &crate::api::resource_binding::ClusterPlacementStatus) -> String {
    if row.override_failed {
        "FAILED".into()
    } else if row.overrides.is_empty() {
        "-".into()
    } else {
        row.overrides.join(",")
    }
}

/// Age as kubectl prints it: 45s, 12m, 5h, 3d.
pub fn human_age(seconds: i64) -> String {
    let seconds = seconds.max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// The `get clusters` table.
pub fn clusters_table(clusters: &[MemberCluster], now: jiff::Timestamp) -> String {
    let mut rows = vec![
        [
            "NAME", "ZONE", "READY", "REASON", "VERSION", "AGE", "FENCED", "TLS",
        ]
        .map(String::from)
        .to_vec(),
    ];
    let mut sorted: Vec<&MemberCluster> = clusters.iter().collect();
    sorted.sort_by_key(|c| c.metadata.name.clone());
    for cluster in sorted {
        let conditions = cluster
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        let ready = find_condition(conditions, "Ready");
        let fenced = find_condition(conditions, "Fenced");
        let age = cluster
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| human_age(now.duration_since(t.0).as_secs()))
            .unwrap_or_else(|| "-".into());
        rows.push(vec![
            cluster.metadata.name.clone().unwrap_or_default(),
            cluster.spec.zone.clone(),
            ready
                .map(|c| c.status.clone())
                .unwrap_or_else(|| "Unknown".into()),
            ready
                .map(|c| c.reason.clone())
                .unwrap_or_else(|| "-".into()),
            cluster
                .status
                .as_ref()
                .and_then(|s| s.kubernetes_version.clone())
                .unwrap_or_else(|| "-".into()),
            age,
            fenced
                .map(|c| c.status.clone())
                .unwrap_or_else(|| "-".into()),
            if cluster.spec.insecure_skip_tls_verify {
                "INSECURE".into()
            } else {
                "verified".into()
            },
        ]);
    }
    aligned(&rows, "")
}

/// Runs `bulkhead get`.
pub async fn run(options: &GetOptions) -> Result<()> {
    match &options.what {
        GetWhat::Clusters(client) => {
            let client = connect(client).await.context("connecting to the hub")?;
            let clusters = Api::<MemberCluster>::all(client)
                .list(&ListParams::default())
                .await
                .context("listing MemberClusters on the hub")?;
            print!(
                "{}",
                clusters_table(&clusters.items, jiff::Timestamp::now())
            );
        }
        GetWhat::Bindings(options) => {
            let client = connect(&options.client)
                .await
                .context("connecting to the hub")?;
            let api: Api<ResourceBinding> = match &options.namespace {
                Some(namespace) => Api::namespaced(client.clone(), namespace),
                None => Api::all(client.clone()),
            };
            let bindings = api
                .list(&ListParams::default())
                .await
                .context("listing ResourceBindings on the hub")?;
            // The primary cluster of each database with replica clusters (none when the
            // hub does not serve MyDatabase).
            let databases: Api<MyDatabase> = match &options.namespace {
                Some(namespace) => Api::namespaced(client, namespace),
                None => Api::all(client),
            };
            let primaries = databases
                .list(&ListParams::default())
                .await
                .map(|list| {
                    list.items
                        .into_iter()
                        .filter_map(|db| {
                            let primary = db.status.as_ref()?.primary_cluster.clone()?;
                            Some(((db.namespace().unwrap_or_default(), db.name_any()), primary))
                        })
                        .collect()
                })
                .unwrap_or_default();
            print!("{}", bindings_table(&bindings.items, &primaries));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(150), "2m");
        assert_eq!(human_age(3 * 3600), "3h");
        assert_eq!(human_age(5 * 86400), "5d");
        assert_eq!(human_age(-3), "0s");
    }

    #[test]
    fn the_table_has_the_columns_and_one_row_per_cluster() {
        let cluster: MemberCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "federation.example.com/v1alpha1",
            "kind": "MemberCluster",
            "metadata": {"name": "east", "creationTimestamp": "2026-11-30T06:00:00Z"},
            "spec": {"secretRef": {"namespace": "bulkhead-system", "name": "member-east"}, "zone": "zone-a"},
            "status": {
                "kubernetesVersion": "v1.36.3",
                "conditions": [{"type": "Ready", "status": "False", "reason": "Unreachable",
                                 "message": "", "lastTransitionTime": "2026-11-30T06:01:00Z"}]
            }
        }))
        .unwrap();
        let now: jiff::Timestamp = "2026-11-30T06:10:00Z".parse().unwrap();
        let table = clusters_table(&[cluster], now);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            [
                "NAME", "ZONE", "READY", "REASON", "VERSION", "AGE", "FENCED", "TLS"
            ]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "east",
                "zone-a",
                "False",
                "Unreachable",
                "v1.36.3",
                "10m",
                "-",
                "verified",
            ]
        );
    }

    #[test]
    fn a_database_with_replica_clusters_names_its_primary_cluster() {
        let binding: ResourceBinding = serde_json::from_value(serde_json::json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "orders-mydatabase", "namespace": "shop"},
            "spec": {"resource": {"apiVersion": "example.com/v1", "kind": "MyDatabase", "name": "orders"},
                     "replicas": 3,
                     "clusters": [{"name": "east", "replicas": 1}, {"name": "west", "replicas": 1},
                                  {"name": "north", "replicas": 1}]}
        }))
        .unwrap();
        let primaries = BTreeMap::from([(
            ("shop".to_string(), "orders".to_string()),
            "west".to_string(),
        )]);
        let text = bindings_table(std::slice::from_ref(&binding), &primaries);
        assert!(
            text.lines()
                .any(|l| l == "  PrimaryCluster: west; replica clusters: east, north"),
            "{text}"
        );
        let independent = bindings_table(&[binding], &BTreeMap::new());
        assert!(!independent.contains("PrimaryCluster"), "{independent}");
    }

    #[test]
    fn the_bindings_table_shows_decisions_and_placement_state() {
        let binding: ResourceBinding = serde_json::from_value(serde_json::json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "web-deployment", "namespace": "shop"},
            "spec": {"resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                     "policy": {"kind": "PropagationPolicy", "name": "weighted"}, "replicas": 6,
                     "clusters": [{"name": "west", "replicas": 3}, {"name": "north", "replicas": 3}]},
            "status": {
                "conditions": [{"type": "Scheduled", "status": "True", "reason": "Scheduled", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "decisions": [
                    {"cluster": "east", "selected": false, "reason": "taint federation.example.com/unreachable: toleration expired"},
                    {"cluster": "north", "selected": true, "replicas": 3, "reason": "weight 1"},
                    {"cluster": "west", "selected": true, "replicas": 3, "reason": "weight 1"}],
                "clusters": [
                    {"name": "east", "pendingCleanup": true, "message": "removed from the placement; deleted once reachable"},
                    {"name": "north", "applied": false, "health": "Unhealthy", "readyReplicas": 3, "overrideFailed": true,
                     "message": "override failed: OverridePolicy/shop/bad spec.overrideRules[0].overriders.plaintext[0] at /spec/x: replace failed"},
                    {"name": "west", "applied": true, "health": "Healthy", "readyReplicas": 3,
                     "overrides": ["ClusterOverridePolicy/mirror", "OverridePolicy/web-west"]}]
            }
        }))
        .unwrap();
        let text = bindings_table(&[binding], &BTreeMap::new());
        assert!(
            text.starts_with(
                "shop/web-deployment: Deployment web (6 replicas, policy weighted, interpreter -)  Scheduled=True"
            ),
            "{text}"
        );
        let east = text
            .lines()
            .find(|l| l.trim_start().starts_with("east"))
            .unwrap();
        assert!(
            east.contains("pending") && east.contains("deleted once reachable"),
            "{east}"
        );
        let west = text
            .lines()
            .find(|l| l.trim_start().starts_with("west"))
            .unwrap();
        let cells: Vec<&str> = west.split_whitespace().collect();
        assert_eq!(
            &cells[..9],
            [
                "west",
                "yes",
                "3",
                "yes",
                "Healthy",
                "3",
                "-",
                "-",
                "ClusterOverridePolicy/mirror,OverridePolicy/web-west"
            ],
            "{west}"
        );
        let north = text
            .lines()
            .find(|l| l.trim_start().starts_with("north"))
            .unwrap();
        let cells: Vec<&str> = north.split_whitespace().collect();
        assert_eq!(cells[8], "FAILED", "{north}");
        assert!(
            north.contains("override failed: OverridePolicy/shop/bad"),
            "{north}"
        );
        assert_eq!(
            bindings_table(&[], &BTreeMap::new()),
            "no ResourceBindings\n"
        );
    }
}
