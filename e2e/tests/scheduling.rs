//! The hub's scheduler against the lab: a template selected by a policy gets a
//! ResourceBinding with the weighted decision and a reason per cluster; a weight change
//! re-decides; a template no policy selects gets nothing.

use std::time::Duration;

use anyhow::{Context, Result};
use bulkhead::api::{MemberCluster, ResourceBinding, is_condition_true};
use bulkhead_e2e::hub_support::{HubProcess, join, unjoin};
use bulkhead_e2e::support::{self, TestNamespace};
use bulkhead_e2e::{Check, wait_for};
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;

const MEMBERS: [(&str, &str, &str); 3] = [
    ("east", "zone-a", "region-1"),
    ("west", "zone-b", "region-1"),
    ("north", "zone-c", "region-2"),
];

/// Unjoins the members when the test ends, however it ends.
struct Joined<'a>(&'a bulkhead_e2e::lab::Lab);

impl Drop for Joined<'_> {
    fn drop(&mut self) {
        for (name, _, _) in MEMBERS {
            let _ = unjoin(self.0, name);
        }
    }
}

fn replicas(binding: &ResourceBinding) -> Vec<(String, i32)> {
    binding
        .spec
        .clusters
        .iter()
        .map(|c| (c.name.clone(), c.replicas))
        .collect()
}

#[tokio::test]
async fn templates_get_bindings_with_weighted_decisions_and_reasons() -> Result<()> {
    let lab = support::lab().await?;
    lab.install_crds("hub", &bulkhead_e2e::lab::crd_dir())
        .await?;
    let hub = lab.client("hub").await?;
    for (name, zone, region) in MEMBERS {
        let output = join(
            &lab,
            name,
            zone,
            region,
            &[
                "--probe-interval-seconds",
                "1",
                "--probe-timeout-seconds",
                "1",
            ],
        )?;
        anyhow::ensure!(output.status.success(), "join {name} failed");
    }
    let _joined = Joined(&lab);
    let _hub = HubProcess::start(
        &lab,
        "scheduling-hub.log",
        &["--identity", "e2e-scheduling"],
    )?;
    let members: Api<MemberCluster> = Api::all(hub.clone());
    wait_for("every member Ready", Duration::from_secs(60), || {
        let members = members.clone();
        async move {
            match members.list(&Default::default()).await {
                Ok(list)
                    if list
                        .items
                        .iter()
                        .filter(|m| {
                            m.status
                                .as_ref()
                                .is_some_and(|s| is_condition_true(&s.conditions, "Ready"))
                        })
                        .count()
                        == 3 =>
                {
                    Check::Done(())
                }
                Ok(list) => Check::Waiting(format!("{} members", list.items.len())),
                Err(e) => Check::Waiting(e.to_string()),
            }
        }
    })
    .await?;

    let namespace = TestNamespace::create(&lab, "scheduling", &["hub"]).await?;
    let ns = namespace.name.as_str();
    let deployments = Api::<DynamicObject>::namespaced_with(
        hub.clone(),
        ns,
        &ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
    );
    for name in ["web", "lonely"] {
        let template: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 6, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
        }))?;
        deployments
            .create(&PostParams::default(), &template)
            .await?;
    }
    let policies = Api::<DynamicObject>::namespaced_with(
        hub.clone(),
        ns,
        &ApiResource::erase::<bulkhead::api::PropagationPolicy>(&()),
    );
    let policy = |east: i64| -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "PropagationPolicy",
            "metadata": {"name": "weighted", "namespace": ns},
            "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}],
                     "placement": {"replicaScheduling": {"type": "Divided", "weightPreference": {"staticWeightList": [
                         {"targetCluster": {"clusterNames": ["east"]}, "weight": east},
                         {"targetCluster": {"clusterNames": ["west"]}, "weight": 1}]}}}}
        })
    };
    policies
        .patch(
            "weighted",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&policy(2)),
        )
        .await?;

    let bindings: Api<ResourceBinding> = Api::namespaced(hub.clone(), ns);
    let expect = |wanted: Vec<(&'static str, i32)>| {
        let bindings = bindings.clone();
        async move {
            let wanted: Vec<(String, i32)> = wanted
                .into_iter()
                .map(|(n, r)| (n.to_string(), r))
                .collect();
            wait_for(
                &format!("binding web-deployment with {wanted:?}"),
                Duration::from_secs(30),
                || {
                    let bindings = bindings.clone();
                    let wanted = wanted.clone();
                    async move {
                        match bindings.get_opt("web-deployment").await {
                            Ok(Some(b)) if replicas(&b) == wanted => Check::Done(b),
                            Ok(Some(b)) => Check::Waiting(format!("{:?}", replicas(&b))),
                            Ok(None) => Check::Waiting("no binding yet".into()),
                            Err(e) => Check::Waiting(e.to_string()),
                        }
                    }
                },
            )
            .await
        }
    };
    let binding = expect(vec![("east", 4), ("west", 2)]).await?;
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

    policies
        .patch(
            "weighted",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&policy(1)),
        )
        .await?;
    expect(vec![("east", 3), ("west", 3)]).await?;

    assert!(
        bindings.get_opt("lonely-deployment").await?.is_none(),
        "a template no policy selects is left alone"
    );
    Ok(())
}
