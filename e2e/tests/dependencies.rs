//! Dependencies follow their workload (`propagateDeps: true`, docs/dependencies.md): a
//! Deployment's ConfigMap and Secret go where it goes, leave a cluster it leaves, and
//! leave every cluster when it is deleted; on the hub they stay.

use std::time::Duration;

use anyhow::Result;
use kube::api::{ApiResource, Patch, PatchParams};
use serde_json::json;

use bulkhead::api::find_condition;
use bulkhead_e2e::federation::{Federation, config_maps, deployments, policies};
use bulkhead_e2e::{Check, wait_for};

fn secrets() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&())
}

/// Which members hold a managed copy of `name`.
async fn holders(federation: &Federation, resource: &ApiResource, name: &str) -> Vec<String> {
    federation
        .copies(resource, name)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.managed)
        .map(|c| c.cluster)
        .collect()
}

async fn wait_holders(
    federation: &Federation,
    resource: &ApiResource,
    name: &str,
    wanted: &[&str],
) -> Result<()> {
    wait_for(
        &format!("{} {name} in {wanted:?}", resource.kind),
        Duration::from_secs(90),
        || async {
            let now = holders(federation, resource, name).await;
            if now == wanted {
                Check::Done(())
            } else {
                Check::Waiting(format!("{now:?}"))
            }
        },
    )
    .await
}

#[tokio::test]
async fn a_configmap_and_a_secret_follow_their_deployment_and_leave_with_it() -> Result<()> {
    let federation = Federation::start("deps", &[]).await?;
    let ns = federation.namespace.clone();
    federation
        .apply(
            &config_maps(),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "settings", "namespace": ns}, "data": {"mode": "fast"}}),
        )
        .await?;
    federation
        .apply(
            &secrets(),
            json!({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": "creds", "namespace": ns}, "stringData": {"password": "s3cret"}}),
        )
        .await?;
    // Not referenced: stays on the hub only.
    federation
        .apply(
            &config_maps(),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "unrelated", "namespace": ns}, "data": {"a": "b"}}),
        )
        .await?;
    let selector = json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}]);
    let placement = |clusters: &[&str]| json!({"clusterAffinity": {"clusterNames": clusters}});
    federation
        .apply(
            &policies(),
            federation.policy(
                "web",
                selector.clone(),
                placement(&["east", "west"]),
                json!({"propagateDeps": true}),
            ),
        )
        .await?;
    federation
        .apply(
            &deployments(),
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": ns},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "web", "image": "nginx",
                            "envFrom": [{"configMapRef": {"name": "settings"}}]}],
                            "volumes": [{"name": "creds", "secret": {"secretName": "creds"}}]}}}}),
        )
        .await?;

    wait_holders(&federation, &deployments(), "web", &["east", "west"]).await?;
    wait_holders(&federation, &config_maps(), "settings", &["east", "west"]).await?;
    wait_holders(&federation, &secrets(), "creds", &["east", "west"]).await?;
    let copy = federation
        .api("east", &config_maps())
        .get("settings")
        .await?;
    assert_eq!(copy.data["data"]["mode"], "fast");
    let binding = federation
        .wait_binding(
            "settings-configmap",
            "follows web",
            Duration::from_secs(30),
            |b| {
                let scheduled = find_condition(&b.status.as_ref()?.conditions, "Scheduled")?;
                (scheduled.reason == "FollowsWorkloads").then(|| scheduled.message.clone())
            },
        )
        .await?;
    assert!(
        binding.contains("Deployment") && binding.contains("web"),
        "{binding}"
    );
    assert!(
        holders(&federation, &config_maps(), "unrelated")
            .await
            .is_empty(),
        "what no workload references stays on the hub"
    );

    // The Deployment leaves west: so do its ConfigMap and Secret.
    federation
        .apply(
            &policies(),
            federation.policy(
                "web",
                selector,
                placement(&["east"]),
                json!({"propagateDeps": true}),
            ),
        )
        .await?;
    wait_holders(&federation, &deployments(), "web", &["east"]).await?;
    wait_holders(&federation, &config_maps(), "settings", &["east"]).await?;
    wait_holders(&federation, &secrets(), "creds", &["east"]).await?;

    // Deleted: everything leaves the members; the hub keeps its ConfigMap and Secret.
    federation
        .api("hub", &deployments())
        .delete("web", &Default::default())
        .await?;
    wait_holders(&federation, &deployments(), "web", &[]).await?;
    wait_holders(&federation, &config_maps(), "settings", &[]).await?;
    wait_holders(&federation, &secrets(), "creds", &[]).await?;
    let hub_copy = federation
        .api("hub", &config_maps())
        .get("settings")
        .await?;
    assert_eq!(
        hub_copy.data["data"]["mode"], "fast",
        "the hub's object stays"
    );
    // A change to the dependency now writes nothing anywhere (nothing follows).
    federation
        .api("hub", &config_maps())
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"mode": "slow"}})),
        )
        .await?;
    federation.wait_settled(Duration::from_secs(60)).await?;
    assert!(
        holders(&federation, &config_maps(), "settings")
            .await
            .is_empty()
    );
    Ok(())
}
