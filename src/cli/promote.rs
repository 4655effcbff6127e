//! `bulkhead promote db/<name> --cluster <cluster> --accept-data-loss`: promotes a replica
//! cluster of a MyDatabase while its primary cluster is lost (docs/mydatabase.md,
//! "Disaster promotion"). The hub records the new primary cluster under a raised primary
//! term, and the old primary cluster, when it comes back, never takes a write again: its
//! agent finds the term in the hub's Lease before it unfences, and it rejoins as a replica
//! cluster of the new one. While a switchover that told its target to promote cannot
//! finish because that target is lost, the same command takes the primary back to the
//! old primary cluster (or another replica cluster): the target is then the lost one.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::api::{ANNOTATION_PROMOTE, MemberCluster};
use crate::cli::switchover::{hub_database, member_not_ready};
use crate::hub::federation::replica_clusters::lost_cluster;
use crate::process::ClientOptions;

/// `bulkhead promote` options.
#[derive(clap::Args, Debug)]
pub struct PromoteOptions {
    #[command(flatten)]
    pub client: ClientOptions,
    /// The database: `db/<name>` (or `mydatabase/<name>`).
    pub database: String,
    /// The replica cluster to promote.
    #[arg(long)]
    pub cluster: String,
    /// Required: what the lost primary cluster acknowledged but had not sent to the
    /// promoted cluster is lost.
    #[arg(long)]
    pub accept_data_loss: bool,
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// How long to wait for the hub to record the promotion; 0 asks and returns.
    #[arg(long, default_value_t = 120)]
    pub timeout_seconds: u64,
}

pub async fn run(options: &PromoteOptions) -> Result<()> {
    let namespace = options.namespace.as_str();
    let to = options.cluster.as_str();
    let (name, client, databases, database) =
        hub_database(&options.client, &options.database, namespace).await?;
    let name = name.as_str();
    let status = database.status.clone().unwrap_or_default();
    let Some(primary) = status.primary_cluster.clone() else {
        bail!(
            "{namespace}/{name} has no primary cluster: its copies are independent databases (a promotion is for replica clusters, spec.topology.acrossClusters: ReplicaClusters)"
        );
    };
    // A switchover that told its target to promote: that target may run the primary.
    let template = serde_json::to_value(&database).context("reading the MyDatabase")?;
    let lost = lost_cluster(&template, &primary).to_string();
    let switching = lost != primary;
    if lost == to {
        if switching {
            bail!(
                "the switchover from {primary} told {to} to promote: it holds the primary of {namespace}/{name} once it answers; to give the switchover up while {to} is lost, promote {primary} (or another replica cluster) with --accept-data-loss"
            );
        }
        println!("{namespace}/{name}: {to} already holds the primary");
        return Ok(());
    }
    if !options.accept_data_loss {
        if switching {
            bail!(
                "the switchover from {primary} told {lost} to promote, so {lost} may have taken writes: promoting {to} loses every write {lost} acknowledged but had not sent to {to}: add --accept-data-loss to go on. While {lost} answers the switchover finishes by itself",
            );
        }
        bail!(
            "promoting {to} while {primary} holds the primary of {namespace}/{name} loses every write {primary} acknowledged but had not sent to {to}: add --accept-data-loss to go on. While {primary} answers, `bulkhead switchover {} --to {to}` moves the primary and loses nothing",
            options.database
        );
    }
    let members = Api::<MemberCluster>::all(client.clone())
        .list(&Default::default())
        .await
        .context("listing MemberClusters")?;
    if member_not_ready(&members.items, &lost).is_none() {
        if switching {
            bail!(
                "{lost} is Ready and told to promote by the switchover from {primary}: the switchover finishes by itself (a promotion is for a cluster lost for good)"
            );
        }
        bail!(
            "{primary} is Ready and holds the primary of {namespace}/{name}: move it with `bulkhead switchover {} --to {to}`, which loses nothing (a promotion is for a primary cluster lost for good)",
            options.database
        );
    }
    if let Some(why) = member_not_ready(&members.items, to) {
        bail!("{to} is not Ready ({why}): promote a cluster that answers");
    }
    let before = status.promotion.clone();
    // A primaryCluster the user set names the new one too, or the hub would move the
    // primary back once the old cluster returns.
    let named = database
        .spec
        .topology
        .as_ref()
        .and_then(|t| t.primary_cluster.clone());
    let mut patch = serde_json::json!({"metadata": {"annotations": {ANNOTATION_PROMOTE: to}}});
    if named.is_some() {
        patch["spec"] = serde_json::json!({"topology": {"primaryCluster": to}});
    }
    databases
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("asking the hub for the promotion")?;
    println!(
        "{namespace}/{name}: promoting {to} while {lost} is lost (what {lost} had not sent is lost)"
    );
    if options.timeout_seconds == 0 {
        return Ok(());
    }
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(options.timeout_seconds) {
        let status = databases.get(name).await?.status.unwrap_or_default();
        match status
            .promotion
            .filter(|p| Some(p) != before.as_ref() && p.to == to)
        {
            Some(promotion) if !promotion.refused.is_empty() => {
                if let Some(named) = &named {
                    databases
                        .patch(
                            name,
                            &PatchParams::default(),
                            &Patch::Merge(serde_json::json!({"spec": {"topology": {"primaryCluster": named}}})),
                        )
                        .await
                        .context("restoring spec.topology.primaryCluster")?;
                }
                bail!(
                    "{namespace}/{name}: the hub refused to promote {to}: {}",
                    promotion.refused
                );
            }
            Some(promotion) if status.primary_cluster.as_deref() == Some(to) => {
                println!(
                    "{namespace}/{name}: {to} holds the primary under primary term {} ({:.1} s); {lost} rejoins as a replica cluster when it returns and never takes a write",
                    promotion.term,
                    started.elapsed().as_secs_f64()
                );
                return Ok(());
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!(
        "{namespace}/{name}: the hub has not recorded the promotion of {to} after {} s (is the hub running? `bulkhead get bindings -n {namespace}`)",
        options.timeout_seconds
    )
}
