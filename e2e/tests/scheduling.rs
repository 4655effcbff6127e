//! The hub's scheduling against the lab: a template selected by a policy gets a
//! ResourceBinding with the weighted decision and a reason per cluster; a weight change
//! re-decides; a template no policy selects gets nothing.

use std::time::Duration;

use anyhow::{Context, Result};
use bulkhead::api::is_condition_true;
use bulkhead_e2e::federation::{Federation, binding_replicas, deployments, policies};
use serde_json::json;

#[tokio::test]
async fn templates_get_bindings_with_weighted_decisions_and_reasons() -> Result<()> {
    let federation = Federation::start("scheduling", &[]).await?;
    for name in ["web", "lonely"] {
        federation
            .apply(
                &deployments(),
                json!({
                    "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
                    "spec": {"replicas": 6, "selector": {"matchLabels": {"app": name}},
                             "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
                }),
            )
            .await?;
    }
    let policy = |east: i64| {
        federation.policy(
            "weighted",
            json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}]),
            json!({"replicaScheduling": {"type": "Divided", "weightPreference": {"staticWeightList": [
                {"targetCluster": {"clusterNames": ["east"]}, "weight": east},
                {"targetCluster": {"clusterNames": ["west"]}, "weight": 1}]}}}),
            json!({}),
        )
    };
    let placed = |wanted: [(&'static str, i64); 2]| {
        move |b: &bulkhead::api::ResourceBinding| {
            let wanted: Vec<(String, i64)> =
                wanted.iter().map(|(n, r)| (n.to_string(), *r)).collect();
            (binding_replicas(b) == wanted).then(|| b.clone())
        }
    };

    federation.apply(&policies(), policy(2)).await?;
    let binding = federation
        .wait_binding(
            "web-deployment",
            "east 4, west 2",
            Duration::from_secs(30),
            placed([("east", 4), ("west", 2)]),
        )
        .await?;
    let status = binding.status.clone().context("binding status")?;
    assert!(
        is_condition_true(&status.conditions, "Scheduled"),
        "{status:?}"
    );
    assert_eq!(
        status.decisions.len(),
        3,
        "one decision row per member: {:?}",
        status.decisions
    );
    let north = status
        .decisions
        .iter()
        .find(|d| d.cluster == "north")
        .context("north row")?;
    assert!(!north.selected, "{north:?}");
    eprintln!("north: {}", north.reason);
    assert_eq!(
        binding.spec.policy.as_ref().map(|p| p.name.as_str()),
        Some("weighted")
    );

    federation.apply(&policies(), policy(1)).await?;
    federation
        .wait_binding(
            "web-deployment",
            "east 3, west 3",
            Duration::from_secs(30),
            placed([("east", 3), ("west", 3)]),
        )
        .await?;

    assert!(
        federation.binding("lonely-deployment").await?.is_none(),
        "a template no policy selects is left alone"
    );
    Ok(())
}
