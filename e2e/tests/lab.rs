//! The lab itself: real API servers serve, Bulkhead's CRDs install and validate on them,
//! members run workloads (StatefulSets with volumes, Deployments, Services), the hub never
//! executes templates, and partitions look like real ones.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bulkhead_e2e::lab::{self, CLUSTERS, readyz};
use bulkhead_e2e::support::{self, Partition, TestNamespace};
use bulkhead_e2e::{Check, wait_for};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client};
use serde::Deserialize;

fn documents(path: &std::path::Path) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path)?;
    Ok(serde_yaml::Deserializer::from_str(&text)
        .map(serde_json::Value::deserialize)
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|d| !d.is_null())
        .collect())
}

/// Creates `document` with dryRun=All in `namespace` (for namespaced kinds).
async fn dry_run_create(
    client: &Client,
    document: &serde_json::Value,
    namespace: &str,
) -> Result<(), kube::Error> {
    let api_version = document["apiVersion"].as_str().unwrap();
    let kind = document["kind"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, capabilities) = kube::discovery::pinned_kind(client, &gvk).await?;
    let mut object: DynamicObject = serde_json::from_value(document.clone()).unwrap();
    let api: Api<DynamicObject> = if capabilities.scope == kube::discovery::Scope::Namespaced {
        object.metadata.namespace = Some(namespace.to_string());
        Api::namespaced_with(client.clone(), namespace, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    };
    api.create(
        &PostParams {
            dry_run: true,
            ..Default::default()
        },
        &object,
    )
    .await
    .map(|_| ())
}

fn samples_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/samples")
}

#[tokio::test]
async fn every_apiserver_serves_and_the_crds_validate_for_real() -> Result<()> {
    let lab = support::lab().await?;
    for info in &CLUSTERS {
        let client = lab.client(info.name).await?;
        readyz(&client)
            .await
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("{} /readyz", info.name))?;
        let version = client.apiserver_version().await?;
        assert_eq!(
            version.git_version,
            lab::K8S_VERSION,
            "{} version",
            info.name
        );

        let installed = lab.install_crds(info.name, &lab::crd_dir()).await?;
        assert_eq!(
            installed.len(),
            bulkhead::api::all_crds().len(),
            "{}: {installed:?}",
            info.name
        );

        let namespace = TestNamespace::create(&lab, "crds", &[info.name]).await?;
        for entry in std::fs::read_dir(samples_dir())? {
            let path = entry?.path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            for document in documents(&path)? {
                if document["kind"] == "Secret" {
                    continue;
                }
                dry_run_create(&client, &document, &namespace.name)
                    .await
                    .with_context(|| {
                        format!(
                            "{}: {} rejected sample {}",
                            info.name,
                            document["kind"],
                            path.display()
                        )
                    })?;
            }
        }
        for entry in std::fs::read_dir(samples_dir().join("invalid"))? {
            let path = entry?.path();
            for document in documents(&path)? {
                match dry_run_create(&client, &document, &namespace.name).await {
                    Err(kube::Error::Api(status)) if status.code == 422 => {
                        eprintln!(
                            "{}: {} rejected as expected: {}",
                            info.name,
                            path.display(),
                            status.message
                        );
                    }
                    other => panic!(
                        "{}: {} should be rejected with 422 Invalid, got {other:?}",
                        info.name,
                        path.display()
                    ),
                }
            }
        }
    }
    Ok(())
}

#[tokio::test]
async fn crd_cel_rules_run_in_the_apiserver() -> Result<()> {
    let lab = support::lab().await?;
    let client = lab.client("east").await?;
    lab.install_crds("east", &lab::crd_dir()).await?;
    let namespace = TestNamespace::create(&lab, "cel", &["east"]).await?;
    let databases: Api<bulkhead::api::MyDatabase> = Api::namespaced(client, &namespace.name);
    let mut database: bulkhead::api::MyDatabase = serde_json::from_value(serde_json::json!({
        "apiVersion": "example.com/v1", "kind": "MyDatabase",
        "metadata": {"name": "immutable"}, "spec": {"replicas": 1, "storage": {"size": "1Gi"}}
    }))?;
    let created = databases.create(&PostParams::default(), &database).await?;
    assert_eq!(
        created.spec.version, "14",
        "schema default applied by the apiserver"
    );
    database.metadata.resource_version = created.metadata.resource_version.clone();
    database.spec.storage.size = "2Gi".into();
    support::expect_invalid(
        databases
            .replace("immutable", &PostParams::default(), &database)
            .await,
        "spec.storage is immutable",
    );
    Ok(())
}

#[tokio::test]
async fn members_run_statefulsets_with_volumes_deployments_and_services() -> Result<()> {
    let lab = support::lab().await?;
    let client = lab.client("west").await?;
    let namespace = TestNamespace::create(&lab, "workloads", &["west"]).await?;
    let ns = namespace.name.as_str();
    let started = Instant::now();

    let service: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "db"},
        "spec": {"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"port": 5432}]}
    }))?;
    Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &service)
        .await?;
    let statefulset: StatefulSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "db"},
        "spec": {
            "replicas": 3, "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "postgres", "image": "postgres:16", "ports": [{"containerPort": 5432}]}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]
        }
    }))?;
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    statefulsets
        .create(&PostParams::default(), &statefulset)
        .await?;
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}
        }
    }))?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    deployments
        .create(&PostParams::default(), &deployment)
        .await?;

    wait_for(
        "StatefulSet db readyReplicas=3",
        Duration::from_secs(90),
        || {
            let statefulsets = statefulsets.clone();
            async move {
                match statefulsets.get("db").await {
                    Ok(s) => match s.status.and_then(|s| s.ready_replicas) {
                        Some(3) => Check::Done(()),
                        other => Check::Waiting(format!("readyReplicas {other:?}")),
                    },
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await?;
    eprintln!("StatefulSet ready after {:?}", started.elapsed());
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    assert_eq!(claims.items.len(), 3);
    for claim in &claims.items {
        assert_eq!(
            claim.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Bound"),
            "{:?}",
            claim.metadata.name
        );
    }

    wait_for("Deployment web pods Ready", Duration::from_secs(60), || {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        async move {
            match pods.list(&ListParams::default().labels("app=web")).await {
                Ok(list) => {
                    let ready = list.items.iter().filter(|p| pod_ready(p)).count();
                    if ready == 2 {
                        Check::Done(())
                    } else {
                        Check::Waiting(format!("{ready}/2 pods Ready"))
                    }
                }
                Err(e) => Check::Waiting(e.to_string()),
            }
        }
    })
    .await?;

    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    wait_for(
        "EndpointSlice of Service db lists 3 ready endpoints",
        Duration::from_secs(60),
        || {
            let slices = slices.clone();
            async move {
                match slices
                    .list(&ListParams::default().labels("kubernetes.io/service-name=db"))
                    .await
                {
                    Ok(list) => {
                        let ready = list
                            .items
                            .iter()
                            .flat_map(|s| s.endpoints.iter().flatten())
                            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                            .count();
                        if ready == 3 {
                            Check::Done(())
                        } else {
                            Check::Waiting(format!("{ready} ready endpoints"))
                        }
                    }
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await?;
    Ok(())
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn the_hub_stores_templates_without_executing_them() -> Result<()> {
    let lab = support::lab().await?;
    let client = lab.client("hub").await?;
    let namespace = TestNamespace::create(&lab, "hub", &["hub"]).await?;
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "template"},
        "spec": {
            "replicas": 2, "selector": {"matchLabels": {"app": "t"}},
            "template": {"metadata": {"labels": {"app": "t"}}, "spec": {"containers": [{"name": "t", "image": "nginx"}]}}
        }
    }))?;
    Api::<Deployment>::namespaced(client.clone(), &namespace.name)
        .create(&PostParams::default(), &deployment)
        .await?;
    // Give a (wrongly enabled) deployment controller ample time to act.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let replicasets = Api::<ReplicaSet>::namespaced(client.clone(), &namespace.name)
        .list(&ListParams::default())
        .await?;
    let pods = Api::<Pod>::namespaced(client, &namespace.name)
        .list(&ListParams::default())
        .await?;
    assert!(
        replicasets.items.is_empty(),
        "the hub must not run the deployment controller"
    );
    assert!(pods.items.is_empty(), "the hub must not create pods");
    Ok(())
}

#[tokio::test]
async fn a_partition_times_out_from_outside_while_the_zone_keeps_working() -> Result<()> {
    let lab = support::lab().await?;
    let outside = lab.client("east").await?;
    let inside = lab.inside_client("east").await?;
    let outside_timeout = Duration::from_secs(3);
    let probe = |client: Client| async move {
        let request = http::Request::get("/readyz").body(Vec::new()).unwrap();
        let started = Instant::now();
        let result = tokio::time::timeout(outside_timeout, client.request_text(request)).await;
        (started.elapsed(), result)
    };

    let (_, before) = probe(outside.clone()).await;
    assert!(
        matches!(before, Ok(Ok(_))),
        "east reachable before the partition: {before:?}"
    );

    let partition = Partition::start(&lab, "east")?;
    // A fresh client: a new connection must time out, not be refused.
    let fresh_outside = lab.client("east").await?;
    let (elapsed, during) = probe(fresh_outside).await;
    eprintln!("outside request during the partition ended after {elapsed:?}: {during:?}");
    assert!(
        during.is_err(),
        "a partitioned member must time out, got {during:?}"
    );
    assert!(
        elapsed >= outside_timeout,
        "it must hang until the timeout, not fail fast (refused)"
    );
    // The already-open connection stalls too.
    let (_, open_connection) = probe(outside.clone()).await;
    assert!(
        open_connection.is_err(),
        "open connections stall: {open_connection:?}"
    );
    // Inside the zone everything works.
    let (inside_elapsed, inside_result) = probe(inside.clone()).await;
    assert!(
        matches!(inside_result, Ok(Ok(_))),
        "inside the zone: {inside_result:?}"
    );
    eprintln!("inside request during the partition answered in {inside_elapsed:?}");
    let pods: Api<Pod> = Api::all(inside);
    pods.list(&ListParams::default().limit(1))
        .await
        .context("listing pods inside the zone")?;

    partition.heal()?;
    let (_, after) = probe(lab.client("east").await?).await;
    assert!(
        matches!(after, Ok(Ok(_))),
        "east reachable after heal: {after:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_crashed_lab_is_cleaned_up_and_restarted_by_the_next_up() -> Result<()> {
    let lab = support::lab().await?;
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lab.root.join("state.json"))?)?;
    let kwok = state["processes"]
        .as_array()
        .context("processes in state.json")?
        .iter()
        .find(|p| p["cluster"] == "north" && p["component"] == "kwok")
        .and_then(|p| p["pid"].as_i64())
        .context("north's kwok in state.json")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(kwok as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    wait_for("north's kwok gone", Duration::from_secs(10), || {
        let lab = lab.clone();
        async move {
            if lab.is_running().await {
                Check::Waiting("still counted as running".into())
            } else {
                Check::Done(())
            }
        }
    })
    .await?;
    // The crashed run also left a partition behind: the next `up` must not keep it (a
    // stale rule cut the new lab's east off before its first join).
    lab.partition("east")?;
    let started = Instant::now();
    let outcome = lab.up().await?;
    assert!(
        matches!(outcome, lab::UpOutcome::Started { .. }),
        "up restarts a crashed lab, got {outcome:?}"
    );
    assert!(lab.is_running().await, "every process and API server back");
    assert!(
        !lab::firewall::is_partitioned("east")?,
        "the crashed lab's partition of east must be cleared by the next up"
    );
    eprintln!(
        "crashed lab cleaned up and restarted in {:?}",
        started.elapsed()
    );
    Ok(())
}
