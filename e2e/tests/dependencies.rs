//! Dependencies follow their workload (`propagateDeps: true`, docs/dependencies.md): a
//! Deployment's ConfigMap and Secret go where it goes, leave a cluster it leaves, and
//! leave every cluster when it is deleted; on the hub they stay. A custom kind's
//! reference fields (`ResourceInterpreter` `spec.dependencies`) are followed through
//! chains, and a cycle is reported.
//!
//! Every test here joins the members with `--federate gizmos.example.org --federate
//! persistentvolumeclaims`.

use std::time::Duration;

use anyhow::Result;
use kube::api::{ApiResource, Patch, PatchParams};
use serde_json::json;

use bulkhead::api::find_condition;
use bulkhead_e2e::federation::{Federation, config_maps, deployments, policies};
use bulkhead_e2e::{Check, wait_for};

const FEDERATE: &[&str] = &[
    "--federate",
    "gizmos.example.org",
    "--federate",
    "persistentvolumeclaims",
];

async fn start(prefix: &str) -> Result<Federation> {
    Federation::start_joined(prefix, &[], &["1", "1"], None, FEDERATE).await
}

fn gizmos() -> ApiResource {
    ApiResource {
        group: "example.org".into(),
        version: "v1".into(),
        api_version: "example.org/v1".into(),
        kind: "Gizmo".into(),
        plural: "gizmos".into(),
    }
}

/// The Gizmo CRD: `spec.configRef.name` names a ConfigMap, `spec.partners` other Gizmos.
fn gizmo_crd() -> serde_json::Value {
    bulkhead_e2e::support::test_crd(
        "example.org",
        "Gizmo",
        "gizmos",
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "configRef": {"type": "object", "properties": {"name": {"type": "string"}}},
                "partners": {"type": "array", "items": {"type": "string"}}}}
        }}),
        false,
    )
}

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
    let federation = start("deps").await?;
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

    // A copy that lands after it left (an apply in flight when the last workload went,
    // or one a previous leader sent) leaves too: without a workload and without a
    // cluster in its binding, the dependency is still cleaned up (the chaos run of seed
    // 972758673 found such copies left for good).
    let late = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": ns, "labels": copy.metadata.labels},
        "data": {"mode": "fast"}});
    federation
        .api("west", &config_maps())
        .patch(
            "settings",
            &PatchParams::apply("bulkhead-hub").force(),
            &Patch::Apply(late),
        )
        .await?;
    wait_holders(&federation, &config_maps(), "settings", &[]).await?;
    Ok(())
}

#[tokio::test]
async fn a_custom_kinds_references_are_followed_through_chains_and_a_cycle_is_reported()
-> Result<()> {
    bulkhead_e2e::support::install_crd_everywhere(&gizmo_crd()).await?;
    let federation = start("depsref").await?;
    let ns = federation.namespace.clone();
    let interpreters: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
        federation.hub.clone(),
        &ApiResource::erase::<bulkhead::api::ResourceInterpreter>(&()),
    );
    let interpreter = format!("gizmos-{ns}");
    let interpreter_spec = |path: &str| {
        json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "ResourceInterpreter",
            "metadata": {"name": interpreter},
            "spec": {
                "target": {"apiVersion": "example.org/v1", "kind": "Gizmo"},
                "dependencies": [
                    {"path": path, "apiVersion": "v1", "kind": "ConfigMap"},
                    {"path": ".spec.partners[]", "apiVersion": "example.org/v1", "kind": "Gizmo"}]
            }
        })
    };
    let accepted = |wanted: &'static str| {
        let interpreters = interpreters.clone();
        let interpreter = interpreter.clone();
        async move {
            wait_for(
                &format!("the interpreter's Accepted to be {wanted}"),
                Duration::from_secs(30),
                || async {
                    match interpreters.get(&interpreter).await {
                        Ok(i) if i.data["status"]["conditions"][0]["status"] == wanted => {
                            Check::Done(i.data["status"]["conditions"][0]["message"].to_string())
                        }
                        Ok(i) => Check::Waiting(i.data["status"].to_string()),
                        Err(e) => Check::Waiting(e.to_string()),
                    }
                },
            )
            .await
        }
    };
    let write_interpreter = |path: &str| {
        let interpreters = interpreters.clone();
        let (name, body) = (interpreter.clone(), interpreter_spec(path));
        async move {
            interpreters
                .patch(
                    &name,
                    &PatchParams::apply("e2e").force(),
                    &Patch::Apply(body),
                )
                .await
        }
    };
    // A reference path outside .spec is refused, with the field and the fix.
    write_interpreter(".status.configRef.name").await?;
    let refused = accepted("False").await?;
    assert!(
        refused.contains("spec.dependencies[0].path") && refused.contains(".spec"),
        "{refused}"
    );
    write_interpreter(".spec.configRef.name").await?;
    accepted("True").await?;

    for name in ["a-config", "b-config", "c-config"] {
        federation
            .apply(
                &config_maps(),
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": name, "namespace": ns}, "data": {"name": name}}),
            )
            .await?;
    }
    let gizmo = |name: &str, config: &str, partners: &[&str]| {
        json!({"apiVersion": "example.org/v1", "kind": "Gizmo",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"configRef": {"name": config}, "partners": partners}})
    };
    // a is placed by its policy; b by nothing: it follows a, and passes a's clusters on
    // to its own ConfigMap. b names a back: a cycle.
    federation
        .apply(&gizmos(), gizmo("b", "b-config", &["a"]))
        .await?;
    let policy_resource = policies();
    let place_a = |clusters: &'static [&'static str]| {
        federation.apply(
            &policy_resource,
            federation.policy(
                "gizmo-a",
                json!([{"apiVersion": "example.org/v1", "kind": "Gizmo", "name": "a"}]),
                json!({"clusterAffinity": {"clusterNames": clusters}}),
                json!({"propagateDeps": true}),
            ),
        )
    };
    place_a(&["east", "west"]).await?;
    federation
        .apply(&gizmos(), gizmo("a", "a-config", &["b"]))
        .await?;
    wait_holders(&federation, &gizmos(), "a", &["east", "west"]).await?;
    wait_holders(&federation, &gizmos(), "b", &["east", "west"]).await?;
    wait_holders(&federation, &config_maps(), "a-config", &["east", "west"]).await?;
    wait_holders(&federation, &config_maps(), "b-config", &["east", "west"]).await?;
    assert!(
        holders(&federation, &config_maps(), "c-config")
            .await
            .is_empty()
    );
    let message = federation
        .wait_binding(
            "b-gizmo",
            "follows a, in a cycle",
            Duration::from_secs(30),
            |b| {
                let scheduled = find_condition(&b.status.as_ref()?.conditions, "Scheduled")?;
                (scheduled.reason == "FollowsWorkloads" && scheduled.message.contains("cycle"))
                    .then(|| scheduled.message.clone())
            },
        )
        .await?;
    assert!(
        message.contains("Gizmo") && message.contains("/a") && message.contains("/b"),
        "{message}"
    );

    // b names another ConfigMap: b-config leaves, c-config follows (through b).
    federation
        .apply(&gizmos(), gizmo("b", "c-config", &["a"]))
        .await?;
    wait_holders(&federation, &config_maps(), "c-config", &["east", "west"]).await?;
    wait_holders(&federation, &config_maps(), "b-config", &[]).await?;

    // a leaves west: everything it reaches leaves west with it.
    place_a(&["east"]).await?;
    wait_holders(&federation, &gizmos(), "b", &["east"]).await?;
    wait_holders(&federation, &config_maps(), "c-config", &["east"]).await?;

    // a no longer names b: b and what it passed on leave; a's own ConfigMap stays.
    federation
        .apply(&gizmos(), gizmo("a", "a-config", &[]))
        .await?;
    wait_holders(&federation, &gizmos(), "b", &[]).await?;
    wait_holders(&federation, &config_maps(), "c-config", &[]).await?;
    wait_holders(&federation, &config_maps(), "a-config", &["east"]).await?;
    let _ = interpreters.delete(&interpreter, &Default::default()).await;
    Ok(())
}

#[tokio::test]
async fn a_dependency_stays_as_long_as_its_workload_tolerates_a_partition() -> Result<()> {
    let federation = start("deps-cut").await?;
    let ns = federation.namespace.clone();
    federation
        .apply(
            &config_maps(),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "tolerant", "namespace": ns}, "data": {"mode": "fast"}}),
        )
        .await?;
    // The workload tolerates an unreachable member for 10 minutes, far longer than the
    // default (60 s) a binding of the ConfigMap's own would have.
    federation
        .apply(
            &policies(),
            federation.policy(
                "patient",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "patient"}]),
                json!({"clusterAffinity": {"clusterNames": ["east", "west"]}}),
                json!({"propagateDeps": true, "failover": {"stateless": {"tolerationSeconds": 600}}}),
            ),
        )
        .await?;
    federation
        .apply(
            &deployments(),
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "patient", "namespace": ns},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "patient"}},
                    "template": {"metadata": {"labels": {"app": "patient"}},
                        "spec": {"containers": [{"name": "c", "image": "nginx",
                            "envFrom": [{"configMapRef": {"name": "tolerant"}}]}]}}}}),
        )
        .await?;
    wait_holders(&federation, &deployments(), "patient", &["east", "west"]).await?;
    wait_holders(&federation, &config_maps(), "tolerant", &["east", "west"]).await?;
    let before = federation
        .api("east", &config_maps())
        .get("tolerant")
        .await?
        .metadata
        .uid;

    let partition = bulkhead_e2e::support::Partition::start(&federation.lab, "east")?;
    federation
        .wait_member_ready("east", false, Duration::from_secs(30))
        .await?;
    // Past the default toleration: both bindings still place east.
    tokio::time::sleep(Duration::from_secs(70)).await;
    for binding in ["patient-deployment", "tolerant-configmap"] {
        let clusters: Vec<String> = federation
            .binding(binding)
            .await?
            .map(|b| b.spec.clusters.into_iter().map(|t| t.name).collect())
            .unwrap_or_default();
        assert_eq!(clusters, ["east", "west"], "{binding} during the partition");
    }
    partition.heal()?;
    federation
        .wait_member_ready("east", true, Duration::from_secs(60))
        .await?;
    // The hub reconciles everything on the heal; give it several probe intervals (its
    // queue is not empty: the workload's 10-minute toleration has a requeue pending).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = federation
        .api("east", &config_maps())
        .get("tolerant")
        .await?
        .metadata
        .uid;
    assert_eq!(after, before, "the ConfigMap in east is the same one");
    assert_eq!(
        holders(&federation, &deployments(), "patient").await,
        ["east", "west"]
    );
    Ok(())
}

fn claims() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::core::v1::PersistentVolumeClaim>(&())
}

/// The UID of each member's copy of claim `name` that is not being deleted.
async fn claim_copies(federation: &Federation, name: &str) -> Vec<(String, String)> {
    let mut copies = vec![];
    for cluster in ["east", "west"] {
        if let Ok(Some(claim)) = federation.api(cluster, &claims()).get_opt(name).await
            && claim.metadata.deletion_timestamp.is_none()
        {
            copies.push((cluster.to_string(), claim.metadata.uid.unwrap_or_default()));
        }
    }
    copies
}

/// Issue 27, path 1: a claim that followed a Deployment to east and west stays there
/// (the same objects, the data with them) when no workload references it any more,
/// whichever way that happens: the Deployment is deleted, it stops naming the claim, its
/// policy stops propagating dependencies, or its policy is deleted. Deleting the claim on
/// the hub deletes its copies.
#[tokio::test]
async fn a_claim_that_followed_a_workload_stays_when_the_workload_goes() -> Result<()> {
    let federation = start("deps-claims").await?;
    let ns = federation.namespace.clone();
    let cases = ["deleted", "unnamed", "nodeps", "nopolicy"];
    let policy = |case: &str, deps: bool| {
        federation.policy(
            &format!("web-{case}"),
            json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": format!("web-{case}")}]),
            json!({"clusterAffinity": {"clusterNames": ["east", "west"]}}),
            json!({"propagateDeps": deps}),
        )
    };
    let deployment = |case: &str, mounts: bool| {
        let volumes = if mounts {
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": format!("data-{case}")}}])
        } else {
            json!([])
        };
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": format!("web-{case}"), "namespace": ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": format!("web-{case}")}},
                "template": {"metadata": {"labels": {"app": format!("web-{case}")}},
                    "spec": {"containers": [{"name": "c", "image": "nginx"}], "volumes": volumes}}}})
    };
    for case in cases {
        federation
            .apply(
                &claims(),
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": format!("data-{case}"), "namespace": ns},
                    "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "kwok-volume",
                             "resources": {"requests": {"storage": "1Gi"}}}}),
            )
            .await?;
        federation.apply(&policies(), policy(case, true)).await?;
        federation
            .apply(&deployments(), deployment(case, true))
            .await?;
    }
    let mut before = std::collections::BTreeMap::new();
    for case in cases {
        wait_holders(
            &federation,
            &claims(),
            &format!("data-{case}"),
            &["east", "west"],
        )
        .await?;
        before.insert(
            case,
            claim_copies(&federation, &format!("data-{case}")).await,
        );
        assert_eq!(before[case].len(), 2, "{case}: {:?}", before[case]);
    }

    // Four ways for the workloads to stop referencing their claims.
    federation
        .api("hub", &deployments())
        .delete("web-deleted", &Default::default())
        .await?;
    federation
        .apply(&deployments(), deployment("unnamed", false))
        .await?;
    federation
        .apply(&policies(), policy("nodeps", false))
        .await?;
    federation
        .api("hub", &policies())
        .delete("web-nopolicy", &Default::default())
        .await?;

    // The claims' bindings say why their copies stay...
    federation
        .wait_binding(
            "data-deleted-persistentvolumeclaim",
            "a claim holds data: its copies stay",
            Duration::from_secs(30),
            |b| {
                let scheduled = find_condition(&b.status.as_ref()?.conditions, "Scheduled")?;
                scheduled
                    .message
                    .contains("a claim holds data")
                    .then_some(())
            },
        )
        .await?;
    // ...and for 20 s (many reconciles, probes and the workloads' copies leaving) every
    // copy stays, the same object.
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        for case in cases {
            let now = claim_copies(&federation, &format!("data-{case}")).await;
            assert_eq!(
                now,
                before[case],
                "{case}: the claim's copies changed {:.1}s after the workload stopped referencing it",
                started.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    wait_holders(&federation, &deployments(), "web-deleted", &[]).await?;

    // Deleting the claim on the hub deletes its copies.
    federation
        .api("hub", &claims())
        .delete("data-deleted", &Default::default())
        .await?;
    wait_for(
        "data-deleted's copies deleted",
        Duration::from_secs(60),
        || async {
            let now = claim_copies(&federation, "data-deleted").await;
            if now.is_empty() {
                Check::Done(())
            } else {
                Check::Waiting(format!("{now:?}"))
            }
        },
    )
    .await?;
    println!(
        "claims kept for 20 s in east and west after their workload was deleted, stopped naming them, stopped propagating dependencies, or lost its policy; deleted once the claim was deleted on the hub"
    );
    Ok(())
}
