//! Overrides against the lab (docs/overrides.md): an OverridePolicy that changes the image
//! registry in one zone only, re-applies only that cluster's copy when it changes and
//! restores the template's image when deleted; a JSON patch that fails on the template
//! applies nothing to its cluster (the copy there stays as it was, the binding and an
//! Event say why) while the others go on; and invalid override policies refused by the
//! hub's validating webhook with the field and the fix.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use bulkhead::api::resource_binding::ClusterPlacementStatus;
use bulkhead_e2e::agent_support::{bulkhead_binary, free_port};
use bulkhead_e2e::federation::{Federation, deployments, policies};
use bulkhead_e2e::hub_support::{bulkhead, path};
use bulkhead_e2e::lab;
use bulkhead_e2e::support::{self, TestNamespace};
use bulkhead_e2e::{Check, wait_for};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

const BINDING: &str = "web-deployment";

fn override_policies() -> ApiResource {
    ApiResource::erase::<bulkhead::api::OverridePolicy>(&())
}

fn cluster_override_policies() -> ApiResource {
    ApiResource::erase::<bulkhead::api::ClusterOverridePolicy>(&())
}

fn web(image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": image}]}}}
    })
}

fn override_policy(namespace: &str, name: &str, target: Value, overriders: Value) -> Value {
    json!({
        "apiVersion": "federation.example.com/v1alpha1", "kind": "OverridePolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}],
                 "overrideRules": [{"targetCluster": target, "overriders": overriders}]}
    })
}

fn mirror(namespace: &str, registry: &str) -> Value {
    override_policy(
        namespace,
        "web-east",
        json!({"zones": ["zone-a"]}),
        json!({"imageOverrider": [{"component": "Registry", "operator": "replace", "value": registry}]}),
    )
}

/// (image, metadata.generation, uid) of the `web` copy in `cluster`.
async fn copy_of(federation: &Federation, cluster: &str) -> Result<(String, i64, String)> {
    let copy = federation
        .api(cluster, &deployments())
        .get("web")
        .await
        .with_context(|| format!("web in {cluster}"))?;
    Ok((
        copy.data["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        copy.metadata.generation.unwrap_or_default(),
        copy.uid().unwrap_or_default(),
    ))
}

/// Waits until the copies' images are `wanted` (cluster, image).
async fn wait_images(federation: &Federation, what: &str, wanted: &[(&str, &str)]) -> Result<()> {
    wait_for(what, Duration::from_secs(90), || async {
        let mut seen = vec![];
        for (cluster, _) in wanted {
            match copy_of(federation, cluster).await {
                Ok((image, _, _)) => seen.push((cluster.to_string(), image)),
                Err(e) => return Check::Waiting(e.to_string()),
            }
        }
        if seen
            .iter()
            .zip(wanted)
            .all(|((_, image), (_, want))| image == want)
        {
            Check::Done(())
        } else {
            Check::Waiting(format!("{seen:?}"))
        }
    })
    .await
}

/// Applies by the hub to `cluster`'s copies so far (member API calls, verb apply).
async fn applies_to(federation: &Federation, cluster: &str) -> Result<f64> {
    let text = federation.hub_metrics().await?;
    Ok(text
        .lines()
        .filter(|l| {
            l.starts_with("bulkhead_member_api_calls_total")
                && l.contains(&format!("cluster=\"{cluster}\""))
                && l.contains("verb=\"apply\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

fn row<'a>(
    binding: &'a bulkhead::api::ResourceBinding,
    cluster: &str,
) -> Option<&'a ClusterPlacementStatus> {
    binding
        .status
        .as_ref()?
        .clusters
        .iter()
        .find(|r| r.name == cluster)
}

#[tokio::test]
async fn an_override_changes_one_zone_and_a_failing_one_applies_nothing_there() -> Result<()> {
    let federation = Federation::start("overrides", &[]).await?;
    let ns = federation.namespace.clone();
    federation
        .apply(
            &policies(),
            federation.policy(
                "web",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}]),
                json!({}),
                json!({}),
            ),
        )
        .await?;
    federation.apply(&deployments(), web("nginx:1.27")).await?;
    let everywhere = |image| [("east", image), ("west", image), ("north", image)];
    wait_images(
        &federation,
        "nginx:1.27 everywhere",
        &everywhere("nginx:1.27"),
    )
    .await?;
    federation.wait_settled(Duration::from_secs(60)).await?;

    // 1. The mirror in zone-a (east) only.
    let before = [
        copy_of(&federation, "west").await?,
        copy_of(&federation, "north").await?,
    ];
    let east_before = copy_of(&federation, "east").await?;
    let (west_applies, north_applies) = (
        applies_to(&federation, "west").await?,
        applies_to(&federation, "north").await?,
    );
    federation
        .apply(&override_policies(), mirror(&ns, "mirror.east.example"))
        .await?;
    wait_images(
        &federation,
        "east from the mirror, the others unchanged",
        &[
            ("east", "mirror.east.example/nginx:1.27"),
            ("west", "nginx:1.27"),
            ("north", "nginx:1.27"),
        ],
    )
    .await?;
    let binding = federation
        .wait_row(
            BINDING,
            "east",
            "lists the override",
            Duration::from_secs(60),
            |r| r.overrides == ["OverridePolicy/web-east"] && r.applied,
        )
        .await?;
    for cluster in ["west", "north"] {
        let row = row(&binding, cluster).context("row")?;
        assert!(row.overrides.is_empty() && !row.override_failed, "{row:?}");
    }
    federation.wait_settled(Duration::from_secs(60)).await?;
    let east_after = copy_of(&federation, "east").await?;
    assert_eq!(east_after.2, east_before.2, "east's copy updated in place");
    assert!(east_after.1 > east_before.1, "east's copy re-applied");
    let after = [
        copy_of(&federation, "west").await?,
        copy_of(&federation, "north").await?,
    ];
    assert_eq!(after, before, "west and north untouched");
    assert_eq!(
        (
            applies_to(&federation, "west").await?,
            applies_to(&federation, "north").await?
        ),
        (west_applies, north_applies),
        "no apply to west or north"
    );

    // `bulkhead get bindings` shows it.
    let output = bulkhead(&[
        "get",
        "bindings",
        "-n",
        &ns,
        "--kubeconfig",
        &path(&federation.lab.kubeconfig("hub")),
    ])?;
    anyhow::ensure!(output.status.success(), "bulkhead get bindings failed");
    let text = String::from_utf8(output.stdout)?;
    assert!(text.contains("OVERRIDES"), "{text}");
    let east_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("east"))
        .with_context(|| format!("no east row:\n{text}"))?;
    assert!(east_line.contains("OverridePolicy/web-east"), "{east_line}");

    // 2. Changing the override re-applies east's copy only.
    federation
        .apply(&override_policies(), mirror(&ns, "mirror2.east.example"))
        .await?;
    wait_images(
        &federation,
        "east from the second mirror",
        &[
            ("east", "mirror2.east.example/nginx:1.27"),
            ("west", "nginx:1.27"),
            ("north", "nginx:1.27"),
        ],
    )
    .await?;
    federation.wait_settled(Duration::from_secs(60)).await?;
    assert_eq!(
        [
            copy_of(&federation, "west").await?,
            copy_of(&federation, "north").await?
        ],
        before,
        "west and north untouched"
    );
    assert_eq!(
        (
            applies_to(&federation, "west").await?,
            applies_to(&federation, "north").await?
        ),
        (west_applies, north_applies),
        "still no apply to west or north"
    );

    // 3. Deleting the override restores the template's image in east.
    federation
        .api("hub", &override_policies())
        .delete("web-east", &DeleteParams::default())
        .await?;
    wait_images(
        &federation,
        "the template's image again",
        &everywhere("nginx:1.27"),
    )
    .await?;
    federation
        .wait_row(
            BINDING,
            "east",
            "lists no override",
            Duration::from_secs(60),
            |r| r.overrides.is_empty() && r.applied,
        )
        .await?;
    federation.wait_settled(Duration::from_secs(60)).await?;
    assert_eq!(
        applies_to(&federation, "west").await?,
        west_applies,
        "west was never written"
    );

    // 4. A JSON patch whose path does not exist, for north only: nothing is applied
    // there (north keeps its copy exactly as it is), the others take a new template.
    let north_before = copy_of(&federation, "north").await?;
    federation
        .apply(
            &override_policies(),
            override_policy(
                &ns,
                "web-north",
                json!({"clusterNames": ["north"]}),
                json!({"plaintext": [{"op": "replace", "path": "/spec/template/spec/nodeSelector/disk", "value": "ssd"}]}),
            ),
        )
        .await?;
    let binding = federation
        .wait_row(
            BINDING,
            "north",
            "override failed",
            Duration::from_secs(60),
            |r| r.override_failed && !r.applied,
        )
        .await?;
    let message = row(&binding, "north")
        .and_then(|r| r.message.clone())
        .unwrap_or_default();
    eprintln!("north: {message}");
    assert!(
        message.contains("OverridePolicy/")
            && message.contains("web-north spec.overrideRules[0].overriders.plaintext[0] at /spec/template/spec/nodeSelector/disk")
            && message.contains("the path does not exist"),
        "{message}"
    );
    let propagated = binding
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Propagated"))
        .context("Propagated")?;
    assert_eq!(
        (propagated.status.as_str(), propagated.reason.as_str()),
        ("False", "OverrideFailed"),
        "{}",
        propagated.message
    );
    let note = federation
        .wait_event(
            "ResourceBinding",
            BINDING,
            "OverrideFailed",
            Duration::from_secs(30),
        )
        .await?;
    assert!(note.starts_with("north: override failed"), "{note}");
    federation.apply(&deployments(), web("nginx:1.28")).await?;
    wait_images(
        &federation,
        "east and west on the new template, north kept",
        &[
            ("east", "nginx:1.28"),
            ("west", "nginx:1.28"),
            ("north", "nginx:1.27"),
        ],
    )
    .await?;
    let binding = federation
        .wait_binding(
            BINDING,
            "east and west applied",
            Duration::from_secs(60),
            |b| {
                ["east", "west"]
                    .iter()
                    .all(|c| row(b, c).is_some_and(|r| r.applied && !r.override_failed))
                    .then(|| b.clone())
            },
        )
        .await?;
    assert!(row(&binding, "north").is_some_and(|r| r.override_failed));
    federation.wait_settled(Duration::from_secs(60)).await?;
    assert_eq!(
        copy_of(&federation, "north").await?,
        north_before,
        "north's copy is exactly as it was"
    );

    // 5. A failing `test`: the same, with the test's message.
    federation
        .apply(
            &override_policies(),
            override_policy(
                &ns,
                "web-north",
                json!({"clusterNames": ["north"]}),
                json!({"plaintext": [
                    {"op": "test", "path": "/spec/template/spec/containers/0/image", "value": "nginx:1.0"},
                    {"op": "add", "path": "/spec/template/spec/nodeSelector", "value": {"disk": "ssd"}}]}),
            ),
        )
        .await?;
    let binding = federation
        .wait_row(
            BINDING,
            "north",
            "test failed",
            Duration::from_secs(60),
            |r| {
                r.override_failed
                    && r.message.as_deref().is_some_and(|m| {
                        m.contains(
                            "test failed: the copy holds \"nginx:1.28\" there, not \"nginx:1.0\"",
                        )
                    })
            },
        )
        .await?;
    eprintln!(
        "north: {:?}",
        row(&binding, "north").and_then(|r| r.message.clone())
    );
    federation.wait_settled(Duration::from_secs(60)).await?;
    assert_eq!(copy_of(&federation, "north").await?, north_before);

    // 6. Deleting the bad policy applies north's copy at once.
    federation
        .api("hub", &override_policies())
        .delete("web-north", &DeleteParams::default())
        .await?;
    wait_images(
        &federation,
        "nginx:1.28 everywhere",
        &everywhere("nginx:1.28"),
    )
    .await?;
    federation
        .wait_row(
            BINDING,
            "north",
            "applied again",
            Duration::from_secs(60),
            |r| r.applied && !r.override_failed,
        )
        .await?;
    assert_eq!(
        copy_of(&federation, "north").await?.2,
        north_before.2,
        "same copy"
    );
    federation
        .wait_event(
            "ResourceBinding",
            BINDING,
            "OverrideApplied",
            Duration::from_secs(30),
        )
        .await?;
    Ok(())
}

/// A `bulkhead webhook` process with the hub-side configurations, scoped by a label to
/// the test's namespace and labelled cluster-scoped objects; stopped and its
/// configurations deleted when dropped.
struct Webhook {
    child: Child,
    name: String,
    log: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let name = self.name.clone();
        support::cleanup_blocking(vec![self.kubeconfig.clone()], move |client| {
            let name = name.clone();
            async move {
                let _ = Api::<ValidatingWebhookConfiguration>::all(client.clone())
                    .delete(&format!("{name}-validating"), &DeleteParams::default())
                    .await;
                let _ = Api::<MutatingWebhookConfiguration>::all(client)
                    .delete(&format!("{name}-mutating"), &DeleteParams::default())
                    .await;
            }
        });
    }
}

const SCOPE_LABEL: &str = "bulkhead-e2e/overrides-webhook";

#[tokio::test]
async fn invalid_override_policies_are_refused_by_the_hubs_webhook_with_the_field() -> Result<()> {
    let lab = support::lab().await?;
    lab.install_crds("hub", &lab::crd_dir()).await?;
    let namespace = TestNamespace::create(&lab, "overrides-webhook", &["hub"]).await?;
    let ns = namespace.name.clone();
    let hub = lab.client("hub").await?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(hub.clone())
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {SCOPE_LABEL: ns}}})),
        )
        .await?;
    let port = free_port();
    let name = format!("e2e-{ns}");
    let log = lab.log_dir("hub").join(format!("webhook-{ns}.log"));
    let child = Command::new(bulkhead_binary()?)
        .arg("webhook")
        .arg("--kubeconfig")
        .arg(lab.kubeconfig("hub"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--url", &format!("https://127.0.0.1:{port}")])
        .args(["--probe-address", &format!("127.0.0.1:{}", free_port())])
        .arg("--configure-hub")
        .args(["--configuration-name", &name])
        .args(["--selector-label", &format!("{SCOPE_LABEL}={ns}")])
        .args(["--tenant-namespace", &ns])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let webhook = Webhook {
        child,
        name: name.clone(),
        log,
        kubeconfig: lab.inside_kubeconfig("hub"),
    };

    let namespaced: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &ns, &override_policies());
    let cluster: Api<DynamicObject> = Api::all_with(hub.clone(), &cluster_override_policies());
    let bad: DynamicObject = serde_json::from_value(override_policy(
        &ns,
        "bad-replicas",
        json!({"zones": ["zone-a"]}),
        json!({"plaintext": [{"op": "replace", "path": "/spec/replicas", "value": 9}]}),
    ))?;
    // The webhook may still be starting: retry a dry run until it answers.
    let denial = wait_for(
        "the webhook to refuse a patch on /spec/replicas",
        Duration::from_secs(30),
        || async {
            match namespaced
                .create(
                    &PostParams {
                        dry_run: true,
                        ..Default::default()
                    },
                    &bad,
                )
                .await
            {
                Err(kube::Error::Api(status))
                    if status.message.contains("a field the hub owns") =>
                {
                    Check::Done(status.message)
                }
                other => Check::Waiting(format!("{other:?}")),
            }
        },
    )
    .await
    .with_context(|| {
        format!(
            "webhook log:\n{}",
            std::fs::read_to_string(&webhook.log).unwrap_or_default()
        )
    })?;
    eprintln!("denial: {denial}");
    assert!(
        denial.contains(&format!(
            "OverridePolicy {ns}/bad-replicas: spec.overrideRules[0].overriders.plaintext[0]: op replace on /spec/replicas"
        )) && denial.contains("change the template's replicas or the propagation policy's weights"),
        "{denial}"
    );

    for (overriders, fragment) in [
        (
            json!({"plaintext": [{"op": "add", "path": "spec/template", "value": 1}]}),
            "spec.overrideRules[0].overriders.plaintext[0]: path \"spec/template\" is not a JSON pointer",
        ),
        (
            json!({"plaintext": [{"op": "replace", "path": "/spec/paused"}]}),
            "spec.overrideRules[0].overriders.plaintext[0]: value is required for op replace",
        ),
        (
            json!({"imageOverrider": [{"component": "Registry", "operator": "replace", "value": "mirror"}]}),
            "spec.overrideRules[0].overriders.imageOverrider[0]: \"mirror\" is not a registry",
        ),
        (
            json!({"labelsOverrider": [{"operator": "add", "value": {"federation.example.com/binding": "x"}}]}),
            "spec.overrideRules[0].overriders.labelsOverrider[0]: federation.example.com/binding is one of Bulkhead's own labels",
        ),
        // The schema's enum refuses an unknown operator before the webhook sees it.
        (
            json!({"imageOverrider": [{"component": "Registry", "operator": "append", "value": "m.example"}]}),
            "spec.overrideRules[0].overriders.imageOverrider[0].operator",
        ),
    ] {
        let policy: DynamicObject =
            serde_json::from_value(override_policy(&ns, "bad", json!({}), overriders))?;
        let message = support::expect_invalid_or_forbidden(
            namespaced.create(&PostParams::default(), &policy).await,
            fragment,
        );
        eprintln!("denial: {message}");
    }

    // A ClusterOverridePolicy (labelled, so the scoped webhook sees it): the same rules.
    let mut cluster_policy = override_policy(
        &ns,
        &format!("{ns}-bad"),
        json!({}),
        json!({"imageOverrider": [{"component": "Tag", "operator": "replace", "value": "-bad"}]}),
    );
    cluster_policy["kind"] = json!("ClusterOverridePolicy");
    cluster_policy["metadata"] = json!({"name": format!("{ns}-bad"), "labels": {SCOPE_LABEL: ns}});
    let message = support::expect_invalid_or_forbidden(
        cluster
            .create(
                &PostParams::default(),
                &serde_json::from_value(cluster_policy)?,
            )
            .await,
        "spec.overrideRules[0].overriders.imageOverrider[0]: \"-bad\" is neither a tag",
    );
    eprintln!("denial: {message}");

    // A valid one is admitted.
    let good: DynamicObject = serde_json::from_value(mirror(&ns, "mirror.east.example"))?;
    namespaced
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &good,
        )
        .await
        .context("a valid OverridePolicy")?;
    drop(webhook);
    Ok(())
}
