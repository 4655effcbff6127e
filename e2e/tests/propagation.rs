//! Propagation against the lab with the hub and an agent in every member: weighted
//! MyDatabase placement down to Ready StatefulSets and back up as template status,
//! re-weighting, Duplicated Deployments, ConfigMaps, conflicts with unmanaged objects,
//! cleanup (also during a partition, and a foreground deletion during one), a hub restart
//! that changes nothing, `bulkhead plan`
//! agreeing with the hub, propagation latency, and the cleanup finalizer added by the hub
//! API server on create.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bulkhead::api::ResourceBinding;
use bulkhead_e2e::federation::{
    Federation, binding_condition, binding_replicas, config_maps, databases, deployments,
    describe_binding, placement, policies, ready_at,
};
use bulkhead_e2e::hub_support::{bulkhead, path};
use bulkhead_e2e::support::Partition;
use bulkhead_e2e::{Check, wait_for};
use kube::ResourceExt;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

fn database(name: &str, replicas: i64) -> Value {
    json!({
        "apiVersion": "example.com/v1", "kind": "MyDatabase",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "version": "16", "storage": {"size": "1Gi"}}
    })
}

fn deployment(name: &str, replicas: i64, image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "app", "image": image}]}}}
    })
}

fn weighted(east: i64, west: i64) -> Value {
    json!({"replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted",
        "weightPreference": {"staticWeightList": [
            {"targetCluster": {"clusterNames": ["east"]}, "weight": east},
            {"targetCluster": {"clusterNames": ["west"]}, "weight": west}]}}})
}

/// The finalizer on templates and bindings that keeps them until member copies are gone.
const CLEANUP_FINALIZER: &str = "federation.example.com/cleanup";

async fn hub_writes(federation: &Federation) -> Result<f64> {
    federation
        .hub_counter("bulkhead_hub_writes_total", "")
        .await
}

#[tokio::test]
async fn a_weighted_database_runs_in_its_members_and_reports_back() -> Result<()> {
    let mut federation = Federation::start("prop-db", &[]).await?;
    let selector =
        json!([{"apiVersion": "example.com/v1", "kind": "MyDatabase", "name": "orders"}]);
    federation
        .apply(
            &policies(),
            federation.policy("orders", selector.clone(), weighted(2, 1), json!({})),
        )
        .await?;
    federation
        .apply(&databases(), database("orders", 6))
        .await?;

    // 4/2 StatefulSets Ready in the members, through each member's agent.
    let copies = federation
        .wait_copies(
            &databases(),
            "orders",
            "east 4, west 2, all Ready",
            Duration::from_secs(120),
            |c| ready_at(c, &[("east", 4), ("west", 2)]),
        )
        .await?;
    eprintln!("copies: {copies:?}");
    for (cluster, replicas) in [("east", 4), ("west", 2)] {
        let sts = federation
            .api(cluster, &bulkhead_e2e::federation::statefulsets())
            .get("orders")
            .await
            .with_context(|| format!("StatefulSet orders in {cluster}"))?;
        assert_eq!(sts.data["spec"]["replicas"], replicas, "{cluster}");
    }
    assert!(
        federation
            .api("north", &databases())
            .get_opt("orders")
            .await?
            .is_none(),
        "north is not placed"
    );

    // The template's status sums the placements: 6/6, Ready, one row per cluster.
    let template = wait_for(
        "the template to report 6/6 Ready",
        Duration::from_secs(60),
        || async {
            match federation.api("hub", &databases()).get("orders").await {
                Ok(db)
                    if db.data["status"]["readyReplicas"] == 6
                        && db.data["status"]["phase"] == "Ready" =>
                {
                    Check::Done(db)
                }
                Ok(db) => Check::Waiting(db.data["status"].to_string()),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    let rows = template.data["status"]["clusters"]
        .as_array()
        .context("status.clusters")?;
    let summary: Vec<(String, i64, i64)> = rows
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap_or_default().to_string(),
                r["replicas"].as_i64().unwrap_or(0),
                r["readyReplicas"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [("east".to_string(), 4, 4), ("west".to_string(), 2, 2)]
    );
    assert!(
        template
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == "federation.example.com/cleanup")),
        "the template carries the cleanup finalizer"
    );
    let binding = federation
        .wait_binding(
            "orders-mydatabase",
            "Propagated and Healthy",
            Duration::from_secs(30),
            |b| {
                (binding_condition(b, "Propagated") && binding_condition(b, "Healthy"))
                    .then(|| b.clone())
            },
        )
        .await?;
    let rows = &binding.status.as_ref().context("status")?.clusters;
    assert!(
        rows.iter().all(|r| r.applied && r.last_seen.is_some()),
        "{rows:?}"
    );

    // The offline plan says what the hub did.
    let files = std::env::temp_dir().join(format!("{}-plan.yaml", federation.namespace));
    let policy_text = serde_yaml::to_string(&federation.policy(
        "orders",
        selector.clone(),
        weighted(2, 1),
        json!({}),
    ))?;
    let mut template_doc = database("orders", 6);
    template_doc["metadata"]["namespace"] = json!(federation.namespace);
    std::fs::write(
        &files,
        format!(
            "{policy_text}---\n{}",
            serde_yaml::to_string(&template_doc)?
        ),
    )?;
    let output = bulkhead(&[
        "plan",
        "-f",
        &path(&files),
        "--clusters-from-hub",
        "--kubeconfig",
        &path(&federation.lab.kubeconfig("hub")),
    ])?;
    anyhow::ensure!(output.status.success(), "bulkhead plan failed");
    let text = String::from_utf8(output.stdout)?;
    for (cluster, replicas) in binding_replicas(&binding) {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(&cluster))
            .with_context(|| format!("no {cluster} row in the plan:\n{text}"))?;
        let columns: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(columns.get(2), Some(&"yes"), "{line}");
        assert_eq!(
            columns.get(3),
            Some(&replicas.to_string().as_str()),
            "plan and hub agree: {line}"
        );
    }

    // Re-weighting moves replicas: 3/3, and east's StatefulSet is never recreated.
    let uids_before = federation.member_uids(&databases()).await?;
    federation
        .apply(
            &policies(),
            federation.policy("orders", selector.clone(), weighted(1, 1), json!({})),
        )
        .await?;
    federation
        .wait_copies(
            &databases(),
            "orders",
            "east 3, west 3, all Ready",
            Duration::from_secs(120),
            |c| ready_at(c, &[("east", 3), ("west", 3)]),
        )
        .await?;
    assert_eq!(
        federation.member_uids(&databases()).await?,
        uids_before,
        "moved in place, not recreated"
    );

    // A hub restart changes nothing in the members, and the new hub writes nothing. A
    // built-in kind joins the custom one: a LIST returns built-in objects without
    // apiVersion/kind, which a restarted hub must cope with.
    federation
        .apply(
            &policies(),
            federation.policy(
                "orders-settings",
                json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "orders-settings"}]),
                json!({}),
                json!({}),
            ),
        )
        .await?;
    federation
        .apply(
            &config_maps(),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "orders-settings"}, "data": {"pool": "20"}}),
        )
        .await?;
    federation
        .wait_copies(
            &config_maps(),
            "orders-settings",
            "in every member",
            Duration::from_secs(30),
            |c| c.len() == 3,
        )
        .await?;
    federation
        .wait_binding(
            "orders-settings-configmap",
            "Propagated and Healthy",
            Duration::from_secs(30),
            |b| {
                (binding_condition(b, "Propagated") && binding_condition(b, "Healthy"))
                    .then_some(())
            },
        )
        .await?;
    let config_maps_before = federation.member_uids(&config_maps()).await?;
    let statefulsets_before = federation
        .member_uids(&bulkhead_e2e::federation::statefulsets())
        .await?;
    // The old hub has written everything it had to, the policies' status included (a new
    // hub would otherwise rightly write what the old one had not yet).
    federation.wait_settled(Duration::from_secs(60)).await?;
    federation.kill_hub();
    federation.start_hub()?;
    let restarted = Instant::now();
    // Not a fixed sleep: wait until the new hub has read everything, reconciled every
    // template and has nothing left to do, so any write it was going to make is made.
    federation.wait_settled(Duration::from_secs(120)).await?;
    eprintln!(
        "the restarted hub was synced and settled {:?} after its start",
        restarted.elapsed()
    );
    let writes = hub_writes(&federation).await?;
    assert_eq!(
        writes, 0.0,
        "a restarted hub with nothing to change writes nothing"
    );
    assert_eq!(federation.member_uids(&databases()).await?, uids_before);
    assert_eq!(
        federation
            .member_uids(&bulkhead_e2e::federation::statefulsets())
            .await?,
        statefulsets_before
    );
    assert_eq!(
        federation.member_uids(&config_maps()).await?,
        config_maps_before
    );

    // Deleting the template deletes every copy, then the template goes.
    federation
        .api("hub", &databases())
        .delete("orders", &DeleteParams::default())
        .await?;
    federation
        .wait_copies(
            &databases(),
            "orders",
            "gone everywhere",
            Duration::from_secs(60),
            |c| c.is_empty(),
        )
        .await?;
    wait_for("the template to go", Duration::from_secs(30), || async {
        match federation.api("hub", &databases()).get_opt("orders").await {
            Ok(None) => Check::Done(()),
            Ok(Some(db)) => Check::Waiting(format!("finalizers {:?}", db.metadata.finalizers)),
            Err(e) => Check::Waiting(e.to_string()),
        }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn duplicated_kinds_conflicts_and_cleanup_during_a_partition() -> Result<()> {
    let federation = Federation::start("prop-dup", &[]).await?;
    let ns = federation.namespace.clone();

    // A Deployment Duplicated to all three members.
    federation
        .apply(
            &policies(),
            federation.policy(
                "web",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}]),
                json!({"replicaScheduling": {"type": "Duplicated"}}),
                json!({}),
            ),
        )
        .await?;
    federation
        .apply(&deployments(), deployment("web", 2, "nginx:1"))
        .await?;
    federation
        .wait_copies(
            &deployments(),
            "web",
            "2 Ready replicas in each member",
            Duration::from_secs(90),
            |c| ready_at(c, &[("east", 2), ("west", 2), ("north", 2)]),
        )
        .await?;
    wait_for(
        "the template's status to sum 6 ready",
        Duration::from_secs(30),
        || async {
            match federation.api("hub", &deployments()).get("web").await {
                Ok(d) if d.data["status"]["readyReplicas"] == 6 => Check::Done(()),
                Ok(d) => Check::Waiting(d.data["status"].to_string()),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;

    // A ConfigMap follows its policy: east and west only, and updates follow it.
    federation
        .apply(
            &policies(),
            federation.policy(
                "settings",
                json!([{"apiVersion": "v1", "kind": "ConfigMap", "labelSelector": {"matchLabels": {"app": "settings"}}}]),
                json!({"clusterAffinity": {"clusterNames": ["east", "west"]}}),
                json!({}),
            ),
        )
        .await?;
    let settings = |value: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "labels": {"app": "settings"}}, "data": {"mode": value}});
    federation.apply(&config_maps(), settings("a")).await?;
    let has = |cluster: &'static str, value: &'static str| {
        let api = federation.api(cluster, &config_maps());
        async move {
            api.get_opt("settings")
                .await
                .ok()
                .flatten()
                .is_some_and(|c| c.data["data"]["mode"] == value)
        }
    };
    wait_for(
        "settings in east and west",
        Duration::from_secs(30),
        || async {
            if has("east", "a").await && has("west", "a").await {
                Check::Done(())
            } else {
                Check::Waiting("not yet".into())
            }
        },
    )
    .await?;
    assert!(
        federation
            .api("north", &config_maps())
            .get_opt("settings")
            .await?
            .is_none()
    );
    federation.apply(&config_maps(), settings("b")).await?;
    wait_for(
        "the update in east and west",
        Duration::from_secs(30),
        || async {
            if has("east", "b").await && has("west", "b").await {
                Check::Done(())
            } else {
                Check::Waiting("not yet".into())
            }
        },
    )
    .await?;

    // An unmanaged object of the same name: a conflict, reported and left untouched.
    let north_api = federation.api("north", &config_maps());
    let theirs: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "taken", "namespace": ns}, "data": {"owner": "someone else"}
    }))?;
    north_api.create(&PostParams::default(), &theirs).await?;
    // Another one labelled as managed by someone else: the hub lists a namespace's
    // conflicts with `managed-by!=bulkhead`, which must match it too.
    let labelled: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "taken-labelled", "namespace": ns,
                     "labels": {bulkhead::api::LABEL_MANAGED_BY: "someone-else"}},
        "data": {"owner": "someone else"}
    }))?;
    north_api.create(&PostParams::default(), &labelled).await?;
    federation
        .apply(
            &policies(),
            federation.policy(
                "taken",
                json!([
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "taken"},
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "taken-labelled"}
                ]),
                json!({}),
                json!({"conflictResolution": "Abort"}),
            ),
        )
        .await?;
    federation
        .apply(&config_maps(), json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "taken"}, "data": {"owner": "hub"}}))
        .await?;
    // A row that reports the conflict and applied nothing.
    let conflict = |r: &bulkhead::api::resource_binding::ClusterPlacementStatus| {
        !r.applied
            && r.message
                .as_deref()
                .is_some_and(|m| m.contains("not managed by Bulkhead"))
    };
    let binding: ResourceBinding = federation
        .wait_row(
            "taken-configmap",
            "north",
            "a conflict",
            Duration::from_secs(30),
            conflict,
        )
        .await?;
    let propagated = bulkhead::api::find_condition(
        &binding.status.as_ref().context("status")?.conditions,
        "Propagated",
    )
    .context("Propagated")?
    .clone();
    assert_eq!(
        (propagated.status.as_str(), propagated.reason.as_str()),
        ("False", "Conflict")
    );
    federation
        .apply(&config_maps(), json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "taken-labelled"}, "data": {"owner": "hub"}}))
        .await?;
    federation
        .wait_row(
            "taken-labelled-configmap",
            "north",
            "a conflict with an object another manager labelled",
            Duration::from_secs(30),
            conflict,
        )
        .await?;
    let untouched_labelled = north_api.get("taken-labelled").await?;
    assert_eq!(untouched_labelled.data["data"]["owner"], "someone else");
    assert_eq!(
        untouched_labelled
            .labels()
            .get(bulkhead::api::LABEL_MANAGED_BY)
            .map(String::as_str),
        Some("someone-else")
    );
    let untouched = north_api.get("taken").await?;
    assert_eq!(untouched.data["data"]["owner"], "someone else");
    assert!(
        untouched
            .labels()
            .get(bulkhead::api::LABEL_MANAGED_BY)
            .is_none()
    );
    assert_eq!(
        federation
            .api("east", &config_maps())
            .get("taken")
            .await?
            .data["data"]["owner"],
        "hub",
        "the other members got it"
    );

    // Deleting the Deployment while east is cut off: gone from west and north at once,
    // kept in east until the partition heals, then gone there too.
    let partition = Partition::start(&federation.lab, "east")?;
    federation
        .wait_member_ready("east", false, Duration::from_secs(60))
        .await?;
    federation
        .api("hub", &deployments())
        .delete("web", &DeleteParams::default())
        .await?;
    let copies = federation
        .wait_copies(
            &deployments(),
            "web",
            "only east's copy left",
            Duration::from_secs(30),
            |c| c.len() == 1 && c[0].cluster == "east",
        )
        .await?;
    eprintln!("during the partition: {:?}", placement(&copies));
    federation
        .wait_row(
            "web-deployment",
            "east",
            "pending cleanup",
            Duration::from_secs(15),
            |r| r.pending_cleanup,
        )
        .await?;
    assert!(
        federation
            .api("hub", &deployments())
            .get_opt("web")
            .await?
            .is_some(),
        "the template waits for east"
    );
    partition.heal()?;
    federation
        .wait_copies(
            &deployments(),
            "web",
            "gone everywhere after the heal",
            Duration::from_secs(60),
            |c| c.is_empty(),
        )
        .await?;
    wait_for("the template to go", Duration::from_secs(30), || async {
        match federation.api("hub", &deployments()).get_opt("web").await {
            Ok(None) => Check::Done(()),
            Ok(Some(_)) => Check::Waiting("still there".into()),
            Err(e) => Check::Waiting(e.to_string()),
        }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn foreground_deletion_during_a_partition_keeps_the_pending_cleanup() -> Result<()> {
    let federation = Federation::start("prop-fg", &[]).await?;
    federation
        .apply(
            &policies(),
            federation.policy(
                "fg",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "fg"}]),
                json!({"clusterAffinity": {"clusterNames": ["east", "west", "north"]},
                       "replicaScheduling": {"type": "Duplicated"}}),
                json!({}),
            ),
        )
        .await?;
    federation
        .apply(&deployments(), deployment("fg", 1, "nginx:1"))
        .await?;
    let copies = federation
        .wait_copies(
            &deployments(),
            "fg",
            "1 Ready replica in each member",
            Duration::from_secs(90),
            |c| ready_at(c, &[("east", 1), ("west", 1), ("north", 1)]),
        )
        .await?;
    let east_uid = copies
        .iter()
        .find(|c| c.cluster == "east")
        .map(|c| c.uid.clone())
        .context("east's copy")?;
    federation
        .wait_binding(
            "fg-deployment",
            "Propagated, with the cleanup finalizer",
            Duration::from_secs(30),
            |b| {
                (binding_condition(b, "Propagated")
                    && b.finalizers().iter().any(|f| f == CLEANUP_FINALIZER))
                .then_some(())
            },
        )
        .await?;

    // The scenario needs the garbage collector to delete the binding before the
    // template; a lab just started may not track the kind yet.
    federation
        .wait_garbage_collector_tracks_bindings(Duration::from_secs(90))
        .await?;

    // Cut east off, and wait until the hub knows it.
    let partition = Partition::start(&federation.lab, "east")?;
    federation
        .wait_member_ready("east", false, Duration::from_secs(60))
        .await?;

    // `kubectl delete --cascade=foreground`: the garbage collector deletes the template's
    // dependents (the binding) before the template; the binding's own finalizer keeps the
    // record of east's pending cleanup.
    federation
        .api("hub", &deployments())
        .delete("fg", &DeleteParams::foreground())
        .await?;
    federation
        .wait_copies_in(
            &["west", "north"],
            &deployments(),
            "fg",
            "gone from west and north",
            Duration::from_secs(60),
            |c| c.is_empty(),
        )
        .await?;
    // The garbage collector deletes the binding (it has a deletionTimestamp, and stays
    // for its finalizer) once it has seen the template's foreground deletion.
    let binding = wait_for(
        "binding fg-deployment being deleted, east's cleanup pending",
        Duration::from_secs(60),
        || async {
            let template = match federation.api("hub", &deployments()).get_opt("fg").await {
                Ok(template) => template.map(|t| {
                    format!(
                        "template deletionTimestamp {:?} finalizers {:?}",
                        t.metadata.deletion_timestamp,
                        t.finalizers()
                    )
                }),
                Err(e) => return Check::Waiting(e.to_string()),
            };
            match federation.binding("fg-deployment").await {
                Ok(Some(b)) => {
                    let east_pending = b.status.as_ref().is_some_and(|s| {
                        s.clusters
                            .iter()
                            .any(|r| r.name == "east" && r.pending_cleanup)
                    });
                    if b.metadata.deletion_timestamp.is_some() && east_pending {
                        Check::Done(b)
                    } else {
                        Check::Waiting(format!(
                            "{template:?}; binding deletionTimestamp {:?} finalizers {:?} {}",
                            b.metadata.deletion_timestamp,
                            b.finalizers(),
                            describe_binding(&b)
                        ))
                    }
                }
                Ok(None) => Check::Waiting(format!("{template:?}; no binding")),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    let mut shown = binding.clone();
    shown.metadata.managed_fields = None;
    eprintln!(
        "binding during the partition:\n{}",
        serde_yaml::to_string(&shown)?
    );
    assert!(
        binding.finalizers().iter().any(|f| f == CLEANUP_FINALIZER),
        "the binding keeps its cleanup finalizer: {:?}",
        binding.finalizers()
    );
    let template = federation
        .api("hub", &deployments())
        .get_opt("fg")
        .await?
        .context("the template must wait for east's cleanup")?;
    assert!(template.metadata.deletion_timestamp.is_some());
    assert!(
        template.finalizers().iter().any(|f| f == CLEANUP_FINALIZER),
        "the template's cleanup finalizer holds it: {:?}",
        template.finalizers()
    );
    let east_copies = federation
        .copies_in(&["east"], &deployments(), "fg")
        .await?;
    assert_eq!(
        east_copies
            .iter()
            .map(|c| c.uid.as_str())
            .collect::<Vec<_>>(),
        [east_uid.as_str()],
        "east's copy is still there (read inside its zone)"
    );

    // Heal: east's copy goes, then the template and the binding.
    partition.heal()?;
    federation
        .wait_copies_in(
            &["east"],
            &deployments(),
            "fg",
            "gone from east after the heal",
            Duration::from_secs(60),
            |c| c.is_empty(),
        )
        .await?;
    wait_for(
        "the template and its binding to go",
        Duration::from_secs(60),
        || async {
            let template = federation.api("hub", &deployments()).get_opt("fg").await;
            let binding = federation.binding("fg-deployment").await;
            match (template, binding) {
                (Ok(None), Ok(None)) => Check::Done(()),
                (Ok(template), Ok(binding)) => Check::Waiting(format!(
                    "template finalizers {:?}, binding finalizers {:?}",
                    template.map(|t| t.finalizers().to_vec()),
                    binding.map(|b| b.finalizers().to_vec())
                )),
                (Err(e), _) => Check::Waiting(e.to_string()),
                (_, Err(e)) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn propagation_latency_of_a_burst_of_template_updates() -> Result<()> {
    let federation = Federation::start("prop-latency", &[]).await?;
    federation
        .apply(
            &policies(),
            federation.policy(
                "burst",
                json!([{"apiVersion": "v1", "kind": "ConfigMap", "labelSelector": {"matchLabels": {"burst": "yes"}}}]),
                json!({}),
                json!({}),
            ),
        )
        .await?;
    const TEMPLATES: usize = 5;
    const ROUNDS: usize = 10;
    let object = |i: usize, round: usize| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("burst-{i}"), "labels": {"burst": "yes"}}, "data": {"round": round.to_string()}});
    for i in 0..TEMPLATES {
        federation.apply(&config_maps(), object(i, 0)).await?;
    }
    for i in 0..TEMPLATES {
        let name = format!("burst-{i}");
        federation
            .wait_copies(
                &config_maps(),
                &name,
                "in every member",
                Duration::from_secs(30),
                |c| c.len() == 3,
            )
            .await?;
    }

    // 50 changes at about 50/s; every member copy watched for each change.
    let mut watchers = vec![];
    let mut listed = vec![];
    for (cluster, client) in &federation.members {
        let api = kube::Api::<kube::api::DynamicObject>::namespaced_with(
            client.clone(),
            &federation.namespace,
            &config_maps(),
        );
        let cluster = cluster.clone();
        let (initial_list_done, initial_list) = tokio::sync::oneshot::channel::<()>();
        listed.push((cluster.clone(), initial_list));
        watchers.push(tokio::spawn(async move {
            use futures::StreamExt;
            use kube::runtime::watcher;
            let mut initial_list_done = Some(initial_list_done);
            let mut seen = std::collections::HashMap::new();
            let stream = watcher(api, watcher::Config::default().labels("burst=yes"));
            futures::pin_mut!(stream);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            // Until the last round of every template arrived (a busy hub may fold two quick
            // changes of one template into one apply: the member then never sees the first).
            let last_round = |seen: &std::collections::HashMap<(String, usize), Instant>| {
                (0..TEMPLATES).all(|i| seen.contains_key(&(format!("burst-{i}"), ROUNDS)))
            };
            while !last_round(&seen) {
                let Ok(Some(Ok(event))) = tokio::time::timeout_at(deadline, stream.next()).await
                else {
                    break;
                };
                let object = match event {
                    watcher::Event::Apply(object) | watcher::Event::InitApply(object) => object,
                    watcher::Event::InitDone => {
                        if let Some(done) = initial_list_done.take() {
                            let _ = done.send(());
                        }
                        continue;
                    }
                    watcher::Event::Init | watcher::Event::Delete(_) => continue,
                };
                let name = kube::ResourceExt::name_any(&object);
                let round: usize = object.data["data"]["round"]
                    .as_str()
                    .and_then(|r| r.parse().ok())
                    .unwrap_or(0);
                if round > 0 {
                    seen.entry((name, round)).or_insert_with(Instant::now);
                }
            }
            (cluster, seen)
        }));
    }
    // Every watcher has its initial list before the first change is made, so none of
    // the changes can be missed or timed from a late start.
    for (cluster, initial_list) in listed {
        tokio::time::timeout(Duration::from_secs(30), initial_list)
            .await
            .with_context(|| format!("the watch of {cluster}'s ConfigMaps never listed"))?
            .with_context(|| format!("the watch of {cluster}'s ConfigMaps ended"))?;
    }
    let mut changed_at = std::collections::HashMap::new();
    let started = Instant::now();
    for round in 1..=ROUNDS {
        for i in 0..TEMPLATES {
            let at = Instant::now();
            federation.apply(&config_maps(), object(i, round)).await?;
            changed_at.insert((format!("burst-{i}"), round), at);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let rate = (TEMPLATES * ROUNDS) as f64 / started.elapsed().as_secs_f64();
    let mut latencies = vec![];
    let mut folded = 0;
    for watcher in watchers {
        let (cluster, seen) = watcher.await?;
        for i in 0..TEMPLATES {
            assert!(
                seen.contains_key(&(format!("burst-{i}"), ROUNDS)),
                "{cluster} got the last change of burst-{i}"
            );
        }
        folded += TEMPLATES * ROUNDS - seen.len();
        for (key, at) in seen {
            latencies.push(at.duration_since(changed_at[&key]).as_secs_f64() * 1000.0);
        }
    }
    latencies.sort_by(f64::total_cmp);
    let quantile =
        |q: f64| latencies[((latencies.len() as f64 * q).ceil() as usize).saturating_sub(1)];
    println!(
        "propagation latency, {} member updates from {} template changes at {rate:.0}/s over 3 members ({folded} folded into a later change): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (budget: p99 <= 250 ms with 5 members at 50/s)",
        latencies.len(),
        TEMPLATES * ROUNDS,
        quantile(0.5),
        quantile(0.99),
        latencies.last().copied().unwrap_or_default()
    );
    Ok(())
}

fn has_cleanup_finalizer(object: &kube::api::DynamicObject) -> bool {
    object.finalizers().iter().any(|f| f == CLEANUP_FINALIZER)
}

/// A template a policy selects arrives with its cleanup finalizer, added in the create
/// request by the MutatingAdmissionPolicy the hub keeps in the hub API server; a template
/// no policy selects gets none; the hub writes no finalizer of its own, and deleting the
/// template still deletes its copies and then lets it go. A template that has the
/// finalizer but no policy, binding or copy loses it. Without a policy for the
/// namespace, the admission policy no longer matches it.
#[tokio::test]
async fn a_selected_template_gets_its_finalizer_from_the_api_server_on_create() -> Result<()> {
    use bulkhead::hub::federation::finalizer_policy::NAME;
    use k8s_openapi::api::admissionregistration::v1::MutatingAdmissionPolicy;

    let mut federation = Federation::start("prop-fin", &[]).await?;
    let selector = json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web-*"}]);
    federation
        .apply(
            &policies(),
            federation.policy("web", selector, weighted(1, 1), json!({})),
        )
        .await?;
    let admission: kube::Api<MutatingAdmissionPolicy> = kube::Api::all(federation.hub.clone());
    let namespace = federation.namespace.clone();
    let selects_ours = |policy: &MutatingAdmissionPolicy| {
        let text = serde_json::to_string(&policy.spec).unwrap_or_default();
        text.contains(&format!("\\\"{namespace}\\\"")) && text.contains("^web-.*$")
    };
    wait_for(
        "the admission policy to select web-* in the test namespace",
        Duration::from_secs(30),
        || async {
            match admission.get_opt(NAME).await {
                Ok(Some(policy)) if selects_ours(&policy) => Check::Done(()),
                Ok(other) => Check::Waiting(format!("{:?}", other.map(|p| p.spec))),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;

    // The API server acts on a policy once its own watch has it: a dry-run create runs
    // admission and shows when.
    let api = federation.api("hub", &deployments());
    let object = |name: &str| -> Result<kube::api::DynamicObject> {
        Ok(serde_json::from_value(deployment(name, 2, "nginx"))?)
    };
    let probe = object("web-probe")?;
    wait_for(
        "a dry-run create of web-probe to come back with the finalizer",
        Duration::from_secs(30),
        || async {
            let dry_run = PostParams {
                dry_run: true,
                ..Default::default()
            };
            match api.create(&dry_run, &probe).await {
                Ok(created) if has_cleanup_finalizer(&created) => Check::Done(()),
                Ok(created) => Check::Waiting(format!("finalizers {:?}", created.finalizers())),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;

    // A hub that starts finds it as wanted and writes nothing.
    let written = admission.get(NAME).await?.metadata.resource_version;
    federation.kill_hub();
    federation.start_hub()?;
    federation.wait_settled(Duration::from_secs(60)).await?;
    assert_eq!(
        admission.get(NAME).await?.metadata.resource_version,
        written,
        "a restarted hub leaves the admission policy alone"
    );
    assert_eq!(
        federation
            .hub_counter("bulkhead_hub_writes_total", "what=\"admission_policy\"")
            .await?,
        0.0,
        "a restarted hub writes no admission policy"
    );

    let created = api
        .create(&PostParams::default(), &object("web-1")?)
        .await?;
    assert!(
        has_cleanup_finalizer(&created),
        "web-1 comes back from its create with the finalizer: {:?}",
        created.finalizers()
    );
    let other = api
        .create(&PostParams::default(), &object("other")?)
        .await?;
    assert!(
        other.finalizers().is_empty(),
        "a template no policy selects gets no finalizer: {:?}",
        other.finalizers()
    );
    federation
        .wait_copies(
            &deployments(),
            "web-1",
            "a copy of 1 in east and in west",
            Duration::from_secs(60),
            |c| placement(c) == [("east".to_string(), 1), ("west".to_string(), 1)],
        )
        .await?;
    assert_eq!(
        federation
            .hub_counter("bulkhead_hub_writes_total", "what=\"finalizer\"")
            .await?,
        0.0,
        "the hub wrote no finalizer"
    );
    assert!(
        federation.copies(&deployments(), "other").await?.is_empty(),
        "the unselected template is not propagated"
    );

    // A template with the finalizer that no policy selects (the admission policy added it
    // in the moment before its policy went): no binding, no copy anywhere, so the hub
    // removes the finalizer at once, while it still watches the kind.
    let mut stray = object("stray")?;
    stray.metadata.finalizers = Some(vec![CLEANUP_FINALIZER.to_string()]);
    api.create(&PostParams::default(), &stray).await?;
    wait_for(
        "the hub to remove the finalizer of stray, which no policy selects",
        Duration::from_secs(30),
        || async {
            match api.get("stray").await {
                Ok(t) if t.finalizers().is_empty() => Check::Done(()),
                Ok(t) => Check::Waiting(format!("finalizers {:?}", t.finalizers())),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;

    // Deleting: the copies go, then the hub removes the finalizer the API server added.
    api.delete("web-1", &DeleteParams::default()).await?;
    wait_for(
        "web-1 gone from the hub and from every member",
        Duration::from_secs(60),
        || async {
            let template = api.get_opt("web-1").await;
            let copies = federation.copies(&deployments(), "web-1").await;
            match (template, copies) {
                (Ok(None), Ok(copies)) if copies.is_empty() => Check::Done(()),
                (template, copies) => Check::Waiting(format!(
                    "template {:?}, copies {:?}",
                    template.map(|t| t.map(|t| t.finalizers().to_vec())),
                    copies.map(|c| placement(&c))
                )),
            }
        },
    )
    .await?;

    // Without the policy, nothing in the namespace is matched any more.
    federation
        .api("hub", &policies())
        .delete("web", &DeleteParams::default())
        .await?;
    wait_for(
        "the admission policy to stop selecting the test namespace",
        Duration::from_secs(30),
        || async {
            match admission.get_opt(NAME).await {
                Ok(Some(policy)) if selects_ours(&policy) => {
                    Check::Waiting("still selects web-*".into())
                }
                Ok(_) => Check::Done(()),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    Ok(())
}

/// Issue 27, path 7: drift made in a member is repaired by the periodic resync
/// (`--resync-interval`, 10 s here), also after a hub restart that lost what it had
/// applied: a `kubectl scale`-like patch of a Deployment copy, an edit of a ConfigMap
/// copy's data, and a copy whose managed-by label was removed (out of the hub's watch).
/// Every repaired copy is the same object.
#[tokio::test]
async fn drift_in_a_member_is_repaired_after_a_hub_restart() -> Result<()> {
    let mut federation = Federation::start("prop-drift", &["--resync-interval", "10s"]).await?;
    let both = json!({"clusterAffinity": {"clusterNames": ["east", "west"]}});
    let mut web_placement = weighted(1, 1);
    web_placement["clusterAffinity"] = both["clusterAffinity"].clone();
    federation
        .apply(
            &policies(),
            federation.policy(
                "web",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}]),
                web_placement,
                json!({}),
            ),
        )
        .await?;
    federation
        .apply(
            &policies(),
            federation.policy(
                "settings",
                json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "settings"}]),
                both,
                json!({}),
            ),
        )
        .await?;
    federation
        .apply(&deployments(), deployment("web", 2, "nginx:1"))
        .await?;
    federation
        .apply(
            &config_maps(),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"mode": "a"}}),
        )
        .await?;
    federation
        .wait_copies(
            &deployments(),
            "web",
            "east 1, west 1",
            Duration::from_secs(90),
            |c| ready_at(c, &[("east", 1), ("west", 1)]),
        )
        .await?;
    wait_for(
        "settings in east and west",
        Duration::from_secs(30),
        || async {
            let east = federation
                .api("east", &config_maps())
                .get_opt("settings")
                .await;
            let west = federation
                .api("west", &config_maps())
                .get_opt("settings")
                .await;
            match (east, west) {
                (Ok(Some(_)), Ok(Some(_))) => Check::Done(()),
                other => Check::Waiting(format!("{other:?}")),
            }
        },
    )
    .await?;
    let before = copy_uids(&federation).await?;

    // A hub that restarts remembers nothing of what it applied.
    federation.kill_hub();
    federation.start_hub()?;
    federation
        .wait_members_ready(Duration::from_secs(60))
        .await?;
    let merge = kube::api::PatchParams::default();
    federation
        .api("east", &deployments())
        .patch(
            "web",
            &merge,
            &kube::api::Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await?;
    federation
        .api("east", &config_maps())
        .patch(
            "settings",
            &merge,
            &kube::api::Patch::Merge(json!({"data": {"mode": "edited in east"}})),
        )
        .await?;
    federation
        .api("west", &config_maps())
        .patch(
            "settings",
            &merge,
            &kube::api::Patch::Merge(
                json!({"metadata": {"labels": {"federation.example.com/managed-by": null}}}),
            ),
        )
        .await?;
    let edited = Instant::now();
    wait_for(
        "the drift repaired by the resync",
        Duration::from_secs(60),
        || async {
            let web = federation.api("east", &deployments()).get("web").await;
            let east = federation.api("east", &config_maps()).get("settings").await;
            let west = federation.api("west", &config_maps()).get("settings").await;
            match (web, east, west) {
                (Ok(web), Ok(east), Ok(west))
                    if web.data["spec"]["replicas"] == 1
                        && east.data["data"]["mode"] == "a"
                        && west
                            .labels()
                            .get("federation.example.com/managed-by")
                            .map(String::as_str)
                            == Some("bulkhead") =>
                {
                    Check::Done(())
                }
                (web, east, west) => Check::Waiting(format!(
                    "east web replicas {:?}, east mode {:?}, west labels {:?}",
                    web.map(|w| w.data["spec"]["replicas"].clone()).ok(),
                    east.map(|e| e.data["data"]["mode"].clone()).ok(),
                    west.map(|w| w.labels().clone()).ok()
                )),
            }
        },
    )
    .await?;
    let repaired = edited.elapsed();
    let after = copy_uids(&federation).await?;
    assert_eq!(after, before, "the same objects, repaired in place");
    println!(
        "drift after a hub restart (scaled Deployment copy, edited ConfigMap data, removed managed-by label) repaired {:.1}s after the edits (resync every 10 s)",
        repaired.as_secs_f64()
    );
    Ok(())
}

/// The UIDs of the drift test's copies: east's Deployment, east's and west's ConfigMap.
async fn copy_uids(federation: &Federation) -> Result<[Option<String>; 3]> {
    Ok([
        federation
            .api("east", &deployments())
            .get("web")
            .await?
            .uid(),
        federation
            .api("east", &config_maps())
            .get("settings")
            .await?
            .uid(),
        federation
            .api("west", &config_maps())
            .get("settings")
            .await?
            .uid(),
    ])
}
