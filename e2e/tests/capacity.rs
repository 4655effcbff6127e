//! Capacity-aware placement on the lab (docs/capacity.md): members get kwok nodes of
//! different sizes, the hub's prober records their capacity, and a policy with
//! `dynamicWeight: AvailableReplicas` divides in proportion to each member's room for the
//! template's requests; an `Aggregated` policy fills the roomiest member first. And
//! `minPerCluster`: floors first, and a binding that says when the replicas are too few.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use bulkhead::api::{MemberCluster, ResourceBinding, find_condition};
use bulkhead::hub::federation::placement::capacity::{
    FreeResources, ReplicaRequests, available_replicas, replica_requests,
};
use bulkhead::hub::federation::placement::divide_by_weight;
use bulkhead_e2e::federation::{Federation, binding_replicas, deployments, policies};
use bulkhead_e2e::support::cleanup_blocking;
use bulkhead_e2e::{Check, wait_for};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// Extra cpu each member gets on one big kwok node (the lab's two nodes have 8 each).
const EXTRA_CPU: [(&str, i64); 3] = [("east", 400), ("west", 200), ("north", 0)];

/// Each replica asks for 10 cores: the lab's own 16 cores per member count for 1.
fn template(name: &str, replicas: i64) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
                     {"name": "c", "image": "nginx", "resources": {"requests": {"cpu": "10", "memory": "1Gi"}}}]}}}
    })
}

/// A kwok node with `cpu` cores in `member`, removed on drop.
struct BigNode {
    kubeconfig: std::path::PathBuf,
    name: String,
}

impl BigNode {
    async fn add(federation: &Federation, member: &str, cpu: i64) -> Result<BigNode> {
        let api = Api::<Node>::all(federation.members[member].clone());
        let name = format!("{member}-capacity-node");
        let resources = json!({"cpu": cpu.to_string(), "memory": "1000Gi", "pods": "110", "ephemeral-storage": "100Gi"});
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"kubernetes.io/hostname": name, "type": "kwok", "bulkhead-e2e/capacity-node": "true"}},
            "status": {"allocatable": resources, "capacity": resources,
                       "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                                    "kubeletVersion": "fake", "kubeProxyVersion": "fake"}},
        }))?;
        // A node left by a crashed run is replaced.
        let _ = api.delete(&name, &Default::default()).await;
        wait_for(&format!("old {name} gone"), Duration::from_secs(30), || {
            let (api, name) = (api.clone(), name.clone());
            async move {
                match api.get_opt(&name).await {
                    Ok(None) => Check::Done(()),
                    other => Check::Waiting(format!("{:?}", other.map(|n| n.is_some()))),
                }
            }
        })
        .await?;
        api.create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating node {name} in {member}"))?;
        Ok(BigNode {
            kubeconfig: federation.lab.inside_kubeconfig(member),
            name,
        })
    }
}

impl Drop for BigNode {
    fn drop(&mut self) {
        let name = self.name.clone();
        cleanup_blocking(vec![self.kubeconfig.clone()], move |client| {
            let name = name.clone();
            async move {
                let _ = Api::<Node>::all(client)
                    .delete(&name, &Default::default())
                    .await;
            }
        });
    }
}

/// Each member's free resources as the hub recorded them.
async fn free_resources(federation: &Federation) -> Result<BTreeMap<String, FreeResources>> {
    let members = Api::<MemberCluster>::all(federation.hub.clone())
        .list(&Default::default())
        .await?;
    Ok(members
        .items
        .iter()
        .filter_map(|m| {
            let capacity = m.status.as_ref()?.capacity.as_ref()?;
            Some((
                m.metadata.name.clone()?,
                FreeResources::from_capacity(capacity)?,
            ))
        })
        .collect())
}

/// Waits until the hub's capacity summaries show the big nodes.
async fn wait_capacity_recorded(
    federation: &Federation,
    per_replica: &ReplicaRequests,
) -> Result<BTreeMap<String, i64>> {
    wait_for(
        "the members' capacity recorded on the hub",
        Duration::from_secs(60),
        || async {
            let free = match free_resources(federation).await {
                Ok(free) => free,
                Err(e) => return Check::Waiting(e.to_string()),
            };
            let estimates: BTreeMap<String, i64> = free
                .iter()
                .filter_map(|(name, free)| {
                    Some((name.clone(), available_replicas(free, per_replica)?))
                })
                .collect();
            // The big nodes are in once east's and west's room exceed what 16 cores hold.
            let seen = EXTRA_CPU.iter().all(|(member, cpu)| {
                estimates
                    .get(*member)
                    .is_some_and(|e| *cpu == 0 || *e >= cpu / 10)
            });
            if seen {
                Check::Done(estimates)
            } else {
                Check::Waiting(format!("estimates {estimates:?}"))
            }
        },
    )
    .await
}

fn placed(wanted: Vec<(String, i64)>) -> impl Fn(&ResourceBinding) -> Option<ResourceBinding> {
    move |b| (binding_replicas(b) == wanted).then(|| b.clone())
}

#[tokio::test]
async fn dynamic_weights_follow_allocatable_and_aggregated_fills_the_roomiest_first() -> Result<()>
{
    let federation = Federation::start("capacity", &["--capacity-interval", "2s"]).await?;
    let mut nodes = vec![];
    for (member, cpu) in EXTRA_CPU {
        if cpu > 0 {
            nodes.push(BigNode::add(&federation, member, cpu).await?);
        }
    }
    let per_replica = replica_requests(&template("x", 1));
    let estimates = wait_capacity_recorded(&federation, &per_replica).await?;
    eprintln!("estimated room for a 10-core replica: {estimates:?}");
    assert!(
        estimates["east"] > estimates["west"] && estimates["west"] > estimates["north"],
        "the big nodes make east roomier than west, west than north: {estimates:?}"
    );

    // Dynamic weights: 9 replicas in proportion to the room.
    federation.apply(&deployments(), template("web", 9)).await?;
    federation
        .apply(
            &policies(),
            federation.policy(
                "dynamic",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}]),
                json!({"replicaScheduling": {"type": "Divided",
                       "weightPreference": {"dynamicWeight": "AvailableReplicas"}}}),
                json!({}),
            ),
        )
        .await?;
    let uid = federation
        .api("hub", &deployments())
        .get("web")
        .await?
        .metadata
        .uid
        .context("template uid")?;
    let names: Vec<&str> = estimates.keys().map(String::as_str).collect();
    let weights: Vec<(&str, u64)> = names
        .iter()
        .map(|n| (*n, estimates[*n].max(0) as u64))
        .collect();
    let shares = divide_by_weight(9, &weights, &uid);
    let expected: Vec<(String, i64)> = names
        .iter()
        .zip(&shares)
        .filter(|(_, s)| **s > 0)
        .map(|(n, s)| (n.to_string(), i64::from(*s)))
        .collect();
    eprintln!("expected {expected:?} (weights {weights:?})");
    let binding = federation
        .wait_binding(
            "web-deployment",
            &format!("{expected:?}"),
            Duration::from_secs(60),
            placed(expected.clone()),
        )
        .await?;
    let east = binding
        .status
        .as_ref()
        .and_then(|s| s.decisions.iter().find(|d| d.cluster == "east"))
        .context("east row")?;
    assert!(
        east.reason.contains("(available replicas)"),
        "{}",
        east.reason
    );
    let most = expected.iter().max_by_key(|(_, r)| *r).context("a share")?;
    assert_eq!(
        most.0, "east",
        "the roomiest member gets the most: {expected:?}"
    );

    // Aggregated: more replicas than the roomiest member holds; it is filled first (its
    // room is smaller now that web's replicas run there).
    let total = estimates["east"] + 2;
    federation
        .apply(&deployments(), template("batch", total))
        .await?;
    federation
        .apply(
            &policies(),
            federation.policy(
                "aggregated",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "batch"}]),
                json!({"replicaScheduling": {"type": "Divided", "divisionPreference": "Aggregated"}}),
                json!({}),
            ),
        )
        .await?;
    let binding = federation
        .wait_binding(
            "batch-deployment",
            "east full, the rest in west",
            Duration::from_secs(60),
            |b| {
                let placement = binding_replicas(b);
                let of = |name: &str| placement.iter().find(|(n, _)| n == name).map(|p| p.1);
                let east_first = of("east").is_some_and(|e| of("west").is_some_and(|w| e > w));
                (placement.len() == 2 && east_first).then(|| b.clone())
            },
        )
        .await?;
    let placement = binding_replicas(&binding);
    eprintln!("aggregated {total} replicas: {placement:?}");
    assert_eq!(placement.iter().map(|p| p.1).sum::<i64>(), total);
    assert!(
        placement.iter().any(|(n, _)| n == "west"),
        "the next roomiest takes the rest: {placement:?}"
    );
    drop(nodes);
    Ok(())
}

#[tokio::test]
async fn min_per_cluster_gives_every_cluster_its_floor_and_says_when_replicas_are_too_few()
-> Result<()> {
    let federation = Federation::start("minimum", &[]).await?;
    let deployment = |replicas: i64| {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "api"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "api"}},
                     "template": {"metadata": {"labels": {"app": "api"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
        })
    };
    federation.apply(&deployments(), deployment(7)).await?;
    federation
        .apply(
            &policies(),
            federation.policy(
                "floors",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "api"}]),
                json!({"replicaScheduling": {"type": "Divided", "minPerCluster": 2,
                       "weightPreference": {"staticWeightList": [
                           {"targetCluster": {"clusterNames": ["east"]}, "weight": 3},
                           {"targetCluster": {"clusterNames": ["west"]}, "weight": 1},
                           {"targetCluster": {"clusterNames": ["north"]}, "weight": 1}]}}}),
                json!({}),
            ),
        )
        .await?;
    let pairs = |list: &[(&str, i64)]| -> Vec<(String, i64)> {
        list.iter().map(|(n, r)| (n.to_string(), *r)).collect()
    };
    // Without the floor 3:1:1 of 7 would be 5/1/1.
    federation
        .wait_binding(
            "api-deployment",
            "east 3, north 2, west 2",
            Duration::from_secs(30),
            placed(pairs(&[("east", 3), ("north", 2), ("west", 2)])),
        )
        .await?;

    federation.apply(&deployments(), deployment(5)).await?;
    let binding = federation
        .wait_binding(
            "api-deployment",
            "east 2, north or west 2 and 1",
            Duration::from_secs(30),
            |b| (binding_replicas(b).iter().map(|p| p.1).sum::<i64>() == 5).then(|| b.clone()),
        )
        .await?;
    let status = binding.status.as_ref().context("status")?;
    let scheduled = find_condition(&status.conditions, "Scheduled").context("Scheduled")?;
    eprintln!("{}: {}", scheduled.reason, scheduled.message);
    assert_eq!(scheduled.status, "True");
    assert_eq!(scheduled.reason, "MinPerClusterNotMet");
    assert!(
        scheduled.message.contains(
            "minPerCluster 2 needs 6 replicas for the 3 selected clusters, but spec.replicas is 5"
        ) && scheduled.message.contains("raise spec.replicas to 6"),
        "{}",
        scheduled.message
    );
    let placement = binding_replicas(&binding);
    assert!(
        placement.contains(&("east".to_string(), 2)),
        "the largest weight gets its floor first: {placement:?}"
    );
    Ok(())
}
