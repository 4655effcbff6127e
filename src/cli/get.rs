//! `bulkhead get clusters`: the members as the hub sees them.

use anyhow::{Context, Result};
use kube::Api;
use kube::api::ListParams;

use crate::api::{MemberCluster, find_condition};
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
    let mut rows = vec![[
        "NAME".to_string(),
        "ZONE".to_string(),
        "READY".to_string(),
        "REASON".to_string(),
        "VERSION".to_string(),
        "AGE".to_string(),
        "FENCED".to_string(),
    ]];
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
        rows.push([
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
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            format!("{}\n", cells.join("   ").trim_end())
        })
        .collect()
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
                "NAME", "ZONE", "READY", "REASON", "VERSION", "AGE", "FENCED"
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
                "-"
            ]
        );
    }
}
