//! Federating a kind the hub does not know (issue #17, docs/interpreters.md): a custom
//! resource whose replica field a `ResourceInterpreter` names is divided 3:2:1 over the
//! members and its status summed on the hub; a field the member owns is never sent; an
//! interpreter for a built-in kind is refused on its `Accepted` condition; a kind without
//! an interpreter is Duplicated.
//!
//! A custom kind its interpreter calls stateful gets every stateful-safety rule: scaled
//! down while a member is cut off, nothing is deleted or shrunk until the partition heals.
//!
//! Every test here joins the members with `--federate widgets.example.org --federate
//! vaults.example.org`.

use std::time::Duration;

use anyhow::Result;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use bulkhead::api::find_condition;
use bulkhead_e2e::federation::{Federation, binding_condition, policies};
use bulkhead_e2e::support::Partition;
use bulkhead_e2e::{Check, wait_for};

const FEDERATE: &[&str] = &[
    "--federate",
    "widgets.example.org",
    "--federate",
    "vaults.example.org",
];

fn widgets() -> ApiResource {
    ApiResource {
        group: "example.org".into(),
        version: "v1".into(),
        api_version: "example.org/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

fn interpreters() -> ApiResource {
    ApiResource::erase::<bulkhead::api::ResourceInterpreter>(&())
}

/// The Widget CRD: `spec.size`, `spec.endpoint` (the member's), `status.summary`.
fn widget_crd() -> Value {
    bulkhead_e2e::support::test_crd(
        "example.org",
        "Widget",
        "widgets",
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "size": {"type": "integer"}, "endpoint": {"type": "string"},
                "colour": {"type": "string"}}},
            "status": {"type": "object", "properties": {
                "observedGeneration": {"type": "integer"},
                "summary": {"type": "object", "properties": {
                    "ready": {"type": "integer"}, "total": {"type": "integer"}}}}}
        }}),
        true,
    )
}

async fn install_widget_crd() -> Result<()> {
    bulkhead_e2e::support::install_crd_everywhere(&widget_crd()).await
}

/// Creates or replaces the cluster-scoped `ResourceInterpreter` `name` with `spec`;
/// returns the API it was written with.
async fn apply_interpreter(
    federation: &Federation,
    name: &str,
    spec: Value,
) -> Result<Api<DynamicObject>> {
    let api: Api<DynamicObject> = Api::all_with(federation.hub.clone(), &interpreters());
    api.patch(
        name,
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "ResourceInterpreter",
            "metadata": {"name": name},
            "spec": spec
        })),
    )
    .await?;
    Ok(api)
}

fn weighted_321() -> Value {
    json!({"replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted",
        "weightPreference": {"staticWeightList": [
            {"targetCluster": {"clusterNames": ["east"]}, "weight": 3},
            {"targetCluster": {"clusterNames": ["west"]}, "weight": 2},
            {"targetCluster": {"clusterNames": ["north"]}, "weight": 1}]}}})
}

/// Each member's copy of the widget: (cluster, spec.size), for the members that have one.
async fn sizes(federation: &Federation, name: &str) -> Result<Vec<(String, i64, Value)>> {
    let mut out = vec![];
    for cluster in ["east", "west", "north"] {
        if let Some(copy) = federation.api(cluster, &widgets()).get_opt(name).await? {
            out.push((
                cluster.to_string(),
                copy.data["spec"]["size"].as_i64().unwrap_or(-1),
                copy.data["spec"].clone(),
            ));
        }
    }
    Ok(out)
}

#[tokio::test]
async fn a_custom_kind_is_divided_by_its_interpreter_and_its_status_summed() -> Result<()> {
    install_widget_crd().await?;
    let federation = Federation::start_joined("interp", &[], &["1", "1"], None, FEDERATE).await?;
    let interpreter_name = format!("widgets-{}", federation.namespace);
    let hub_interpreters = apply_interpreter(
        &federation,
        &interpreter_name,
        json!({
            "target": {"apiVersion": "example.org/v1", "kind": "Widget"},
            "replicas": ".spec.size",
            "status": {"ready": ".status.summary.ready", "replicas": ".status.summary.total",
                       "observedGeneration": ".status.observedGeneration"},
            "health": {"type": "ReadyReplicas"},
            "memberOwnedFields": [".spec.endpoint"]
        }),
    )
    .await?;
    wait_for(
        "the interpreter to be Accepted",
        Duration::from_secs(30),
        || async {
            match hub_interpreters.get(&interpreter_name).await {
                Ok(i) if i.data["status"]["conditions"][0]["status"] == "True" => Check::Done(()),
                Ok(i) => Check::Waiting(i.data["status"].to_string()),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;

    let selector = json!([{"apiVersion": "example.org/v1", "kind": "Widget"}]);
    federation
        .apply(
            &policies(),
            federation.policy("widgets", selector, weighted_321(), json!({})),
        )
        .await?;
    federation
        .apply(
            &widgets(),
            json!({"apiVersion": "example.org/v1", "kind": "Widget",
                   "metadata": {"name": "gizmo", "namespace": federation.namespace},
                   "spec": {"size": 6, "endpoint": "hub.example:443", "colour": "blue"}}),
        )
        .await?;

    // 3:2:1 at the interpreter's replica path.
    let copies = wait_for("widget copies 3/2/1", Duration::from_secs(90), || async {
        match sizes(&federation, "gizmo").await {
            Ok(s)
                if s.iter()
                    .map(|(c, n, _)| (c.as_str(), *n))
                    .collect::<Vec<_>>()
                    == [("east", 3), ("west", 2), ("north", 1)] =>
            {
                Check::Done(s)
            }
            Ok(s) => Check::Waiting(format!("{s:?}")),
            Err(e) => Check::Waiting(e.to_string()),
        }
    })
    .await?;
    for (cluster, _, spec) in &copies {
        assert_eq!(spec["colour"], "blue", "{cluster}: the template's fields");
        assert!(
            spec.get("endpoint").is_none(),
            "{cluster}: a member-owned field is never sent: {spec}"
        );
        assert!(
            spec.get("replicas").is_none(),
            "{cluster}: no invented field"
        );
    }

    // The members' controllers (played here) report; the hub sums at the same paths.
    for (cluster, size, _) in &copies {
        let api = federation.api(cluster, &widgets());
        api.patch_status(
            "gizmo",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"summary": {"ready": size, "total": size}}})),
        )
        .await?;
    }
    let template = wait_for(
        "the hub widget to sum 6 ready",
        Duration::from_secs(60),
        || async {
            match federation.api("hub", &widgets()).get("gizmo").await {
                Ok(w) if w.data["status"]["summary"]["ready"] == 6 => Check::Done(w),
                Ok(w) => Check::Waiting(w.data["status"].to_string()),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    assert_eq!(template.data["status"]["summary"]["total"], 6);
    assert_eq!(
        template.data["status"]["observedGeneration"],
        json!(template.metadata.generation),
        "observedGeneration at the interpreter's path"
    );
    let binding = federation
        .wait_binding("gizmo-widget", "Healthy", Duration::from_secs(60), |b| {
            binding_condition(b, "Healthy").then(|| b.clone())
        })
        .await?;
    assert_eq!(binding.spec.replicas, 6);

    // Resized on the hub: each copy follows, still divided at the same path.
    federation
        .api("hub", &widgets())
        .patch(
            "gizmo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 12}})),
        )
        .await?;
    wait_for("widget copies 6/4/2", Duration::from_secs(60), || async {
        match sizes(&federation, "gizmo").await {
            Ok(s)
                if s.iter()
                    .map(|(c, n, _)| (c.as_str(), *n))
                    .collect::<Vec<_>>()
                    == [("east", 6), ("west", 4), ("north", 2)] =>
            {
                Check::Done(())
            }
            Ok(s) => Check::Waiting(format!("{s:?}")),
            Err(e) => Check::Waiting(e.to_string()),
        }
    })
    .await?;

    // Deleting the template removes every copy (the finalizer works for the new kind).
    federation
        .api("hub", &widgets())
        .delete("gizmo", &Default::default())
        .await?;
    wait_for(
        "every widget copy gone",
        Duration::from_secs(60),
        || async {
            match sizes(&federation, "gizmo").await {
                Ok(s) if s.is_empty() => Check::Done(()),
                Ok(s) => Check::Waiting(format!("{s:?}")),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    hub_interpreters
        .delete(&interpreter_name, &Default::default())
        .await?;
    Ok(())
}

#[tokio::test]
async fn without_an_interpreter_a_kind_is_duplicated_and_a_built_in_cannot_be_replaced()
-> Result<()> {
    install_widget_crd().await?;
    let federation =
        Federation::start_joined("interp-dup", &[], &["1", "1"], None, FEDERATE).await?;
    // A user's interpreter for a built-in kind: the hub refuses it and says why.
    let name = format!("deployments-{}", federation.namespace);
    let api: Api<DynamicObject> = Api::all_with(federation.hub.clone(), &interpreters());
    api.patch(
        &name,
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "ResourceInterpreter",
            "metadata": {"name": name},
            "spec": {"target": {"apiVersion": "apps/v1", "kind": "Deployment"}, "stateful": true}
        })),
    )
    .await?;
    let refused = wait_for(
        "the interpreter refused",
        Duration::from_secs(30),
        || async {
            match api.get(&name).await {
                Ok(i) if i.data["status"]["conditions"][0]["status"] == "False" => {
                    Check::Done(i.data["status"]["conditions"][0]["message"].to_string())
                }
                Ok(i) => Check::Waiting(i.data["status"].to_string()),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    assert!(refused.contains("built in"), "{refused}");

    // No interpreter for Widget in this test: every selected cluster gets the whole
    // object, size untouched.
    let selector = json!([{"apiVersion": "example.org/v1", "kind": "Widget", "name": "plain"}]);
    let placement = json!({"clusterAffinity": {"clusterNames": ["east", "west"]}});
    federation
        .apply(
            &policies(),
            federation.policy("plain", selector, placement, json!({})),
        )
        .await?;
    federation
        .apply(
            &widgets(),
            json!({"apiVersion": "example.org/v1", "kind": "Widget",
                   "metadata": {"name": "plain", "namespace": federation.namespace},
                   "spec": {"size": 5, "endpoint": "kept"}}),
        )
        .await?;
    let copies = wait_for(
        "plain copies in east and west",
        Duration::from_secs(90),
        || async {
            match sizes(&federation, "plain").await {
                Ok(s) if s.len() == 2 => Check::Done(s),
                Ok(s) => Check::Waiting(format!("{s:?}")),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    for (cluster, size, spec) in &copies {
        assert_eq!(*size, 5, "{cluster}: Duplicated keeps the template's size");
        assert_eq!(
            spec["endpoint"], "kept",
            "{cluster}: nothing is the member's"
        );
    }
    let binding = federation
        .wait_binding("plain-widget", "Healthy", Duration::from_secs(60), |b| {
            binding_condition(b, "Healthy").then(|| b.clone())
        })
        .await?;
    assert_eq!(binding.spec.clusters.len(), 2);
    federation
        .api("hub", &widgets())
        .delete("plain", &Default::default())
        .await?;
    api.delete(&name, &Default::default()).await?;
    Ok(())
}

fn vaults() -> ApiResource {
    ApiResource {
        group: "example.org".into(),
        version: "v1".into(),
        api_version: "example.org/v1".into(),
        kind: "Vault".into(),
        plural: "vaults".into(),
    }
}

/// The Vault CRD: a custom kind holding data, `spec.size` replicas.
fn vault_crd() -> Value {
    bulkhead_e2e::support::test_crd(
        "example.org",
        "Vault",
        "vaults",
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}),
        false,
    )
}

/// Each member's copy of the vault, as (cluster, spec.size, uid), read inside its zone.
async fn vault_copies(federation: &Federation) -> Result<Vec<(String, i64, String)>> {
    let mut out = vec![];
    for cluster in ["east", "west"] {
        if let Some(copy) = federation.api(cluster, &vaults()).get_opt("safe").await?
            && copy.metadata.deletion_timestamp.is_none()
        {
            out.push((
                cluster.to_string(),
                copy.data["spec"]["size"].as_i64().unwrap_or(-1),
                copy.metadata.uid.clone().unwrap_or_default(),
            ));
        }
    }
    Ok(out)
}

async fn wait_vaults(federation: &Federation, wanted: &[(&str, i64)]) -> Result<Vec<String>> {
    wait_for(
        &format!("vault copies {wanted:?}"),
        Duration::from_secs(90),
        || async {
            match vault_copies(federation).await {
                Ok(c)
                    if c.iter()
                        .map(|(n, s, _)| (n.as_str(), *s))
                        .collect::<Vec<_>>()
                        == wanted =>
                {
                    Check::Done(c.into_iter().map(|(_, _, uid)| uid).collect())
                }
                Ok(c) => Check::Waiting(format!("{c:?}")),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await
}

#[tokio::test]
async fn a_stateful_custom_kind_is_frozen_while_a_member_is_cut_off() -> Result<()> {
    bulkhead_e2e::support::install_crd_everywhere(&vault_crd()).await?;
    let federation =
        Federation::start_joined("interp-safe", &[], &["1", "1"], None, FEDERATE).await?;
    // One name for every run: cluster-scoped, and a second interpreter of the kind (one
    // left by a failed run) would not be used.
    let interpreter_name = "e2e-vaults".to_string();
    let hub_interpreters = apply_interpreter(
        &federation,
        &interpreter_name,
        json!({"target": {"apiVersion": "example.org/v1", "kind": "Vault"},
               "replicas": ".spec.size", "stateful": true}),
    )
    .await?;
    // West weighs more: scaled to 1, the placement drops the cut-off east.
    federation
        .apply(
            &policies(),
            federation.policy(
                "vaults",
                json!([{"apiVersion": "example.org/v1", "kind": "Vault"}]),
                json!({"clusterAffinity": {"clusterNames": ["east", "west"]},
                       "replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted",
                           "weightPreference": {"staticWeightList": [
                               {"targetCluster": {"clusterNames": ["east"]}, "weight": 1},
                               {"targetCluster": {"clusterNames": ["west"]}, "weight": 2}]}}}),
                json!({}),
            ),
        )
        .await?;
    let vault = |size: i64| {
        json!({"apiVersion": "example.org/v1", "kind": "Vault",
               "metadata": {"name": "safe"}, "spec": {"size": size}})
    };
    federation.apply(&vaults(), vault(2)).await?;
    let before = wait_vaults(&federation, &[("east", 1), ("west", 1)]).await?;
    let binding = federation
        .wait_binding("safe-vault", "Scheduled", Duration::from_secs(30), |b| {
            b.status
                .as_ref()
                .and_then(|s| s.interpreter.clone())
                .filter(|_| binding_condition(b, "Scheduled"))
        })
        .await?;
    assert!(binding.contains(&interpreter_name), "{binding}");

    // East is cut off; once the hub sees it not Ready, the vault is scaled to 1.
    let partition = Partition::start(&federation.lab, "east")?;
    federation
        .wait_member_ready("east", false, Duration::from_secs(30))
        .await?;
    federation.apply(&vaults(), vault(1)).await?;
    let message = federation
        .wait_binding(
            "safe-vault",
            "Propagated=False(WaitingForPartition)",
            Duration::from_secs(30),
            |b| {
                let c = find_condition(&b.status.as_ref()?.conditions, "Propagated")?;
                (c.status == "False" && c.reason == "WaitingForPartition")
                    .then(|| c.message.clone())
            },
        )
        .await?;
    assert!(message.contains("east"), "{message}");
    // Several probe intervals: neither copy is deleted or shrunk, in either member.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = vault_copies(&federation).await?;
        assert_eq!(
            now.iter()
                .map(|(n, s, _)| (n.as_str(), *s))
                .collect::<Vec<_>>(),
            [("east", 1), ("west", 1)],
            "nothing deleted or shrunk during the partition"
        );
    }

    // Healed: the change completes; west's copy is the original one.
    partition.heal()?;
    let after = wait_vaults(&federation, &[("west", 1)]).await?;
    assert_eq!(after[0], before[1], "west keeps its original copy");
    hub_interpreters
        .delete(&interpreter_name, &Default::default())
        .await?;
    Ok(())
}
