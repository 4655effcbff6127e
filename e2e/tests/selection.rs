//! Policy selection on the lab (issue 17): name patterns in resource selectors, the
//! precedence between an exact name, a pattern and a kind-wide selector as the binding
//! records it, the policies' `Selected` condition, and `bulkhead plan` telling a tie that
//! the template's UID decides.

use std::time::Duration;

use anyhow::{Context, Result};
use bulkhead::api::{ClusterPropagationPolicy, PropagationPolicy, ResourceBinding, find_condition};
use bulkhead_e2e::federation::{Federation, binding_replicas, deployments, policies};
use bulkhead_e2e::hub_support::{bulkhead, path};
use bulkhead_e2e::support::{TestNamespace, cleanup_blocking};
use bulkhead_e2e::{Check, wait_for};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn deployment(name: &str, replicas: i64) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    })
}

/// Deletes a ClusterPropagationPolicy when dropped (cluster-scoped: the test namespace's
/// deletion does not take it).
struct ClusterPolicy {
    name: String,
    kubeconfig: std::path::PathBuf,
}

impl Drop for ClusterPolicy {
    fn drop(&mut self) {
        let name = self.name.clone();
        cleanup_blocking(vec![self.kubeconfig.clone()], move |client| {
            let name = name.clone();
            async move {
                let _ = Api::<ClusterPropagationPolicy>::all(client)
                    .delete(&name, &DeleteParams::default())
                    .await;
            }
        });
    }
}

/// The `Selected` condition of a policy as (status, reason, message, selected, placed).
type Selected = (String, String, String, i64, i64);

fn selected_of(
    status: Option<&bulkhead::api::propagation_policy::PropagationPolicyStatus>,
    generation: Option<i64>,
) -> Option<Selected> {
    let status = status?;
    let condition = find_condition(&status.conditions, "Selected")?;
    (condition.observed_generation == generation).then(|| {
        (
            condition.status.clone(),
            condition.reason.clone(),
            condition.message.clone(),
            status.selected_templates,
            status.placed_templates,
        )
    })
}

async fn wait_policy(
    federation: &Federation,
    name: &str,
    what: &str,
    check: impl Fn(&Selected) -> bool,
) -> Result<Selected> {
    let api = Api::<PropagationPolicy>::namespaced(federation.hub.clone(), &federation.namespace);
    let check = &check;
    wait_for(
        &format!("PropagationPolicy {name}: {what}"),
        Duration::from_secs(30),
        || {
            let api = api.clone();
            async move {
                match api.get_opt(name).await {
                    Ok(Some(p)) => match selected_of(p.status.as_ref(), p.metadata.generation) {
                        Some(s) if check(&s) => Check::Done(s),
                        other => Check::Waiting(format!("{other:?}")),
                    },
                    other => Check::Waiting(format!("{other:?}")),
                }
            }
        },
    )
    .await
}

async fn wait_cluster_policy(
    federation: &Federation,
    name: &str,
    what: &str,
    check: impl Fn(&Selected) -> bool,
) -> Result<Selected> {
    let api = Api::<ClusterPropagationPolicy>::all(federation.hub.clone());
    let check = &check;
    wait_for(
        &format!("ClusterPropagationPolicy {name}: {what}"),
        Duration::from_secs(30),
        || {
            let api = api.clone();
            async move {
                match api.get_opt(name).await {
                    Ok(Some(p)) => match selected_of(p.status.as_ref(), p.metadata.generation) {
                        Some(s) if check(&s) => Check::Done(s),
                        other => Check::Waiting(format!("{other:?}")),
                    },
                    other => Check::Waiting(format!("{other:?}")),
                }
            }
        },
    )
    .await
}

async fn wait_policy_of(
    federation: &Federation,
    binding: &str,
    policy: &str,
) -> Result<ResourceBinding> {
    federation
        .wait_binding(
            binding,
            &format!("placed by {policy}"),
            Duration::from_secs(30),
            |b| {
                (b.spec.policy.as_ref().map(|p| p.name.as_str()) == Some(policy)).then(|| b.clone())
            },
        )
        .await
}

#[tokio::test]
async fn policies_select_by_name_pattern_with_precedence_and_say_what_they_select() -> Result<()> {
    let federation = Federation::start("selection", &[]).await?;
    let ns = federation.namespace.clone();
    let other = TestNamespace::create(&federation.lab, "selection-other", &["hub"]).await?;
    let hub = federation.hub.clone();

    // 1. `name: "*"` with `namespace`: every Deployment there, none elsewhere.
    let star = ClusterPolicy {
        name: format!("{ns}-every-deployment"),
        kubeconfig: federation.lab.inside_kubeconfig("hub"),
    };
    let star_policy = json!({
        "apiVersion": "federation.example.com/v1alpha1", "kind": "ClusterPropagationPolicy",
        "metadata": {"name": star.name},
        "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "*", "namespace": ns}],
                 "placement": {"clusterAffinity": {"clusterNames": ["north"]}}}
    });
    Api::<ClusterPropagationPolicy>::all(hub.clone())
        .patch(
            &star.name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&star_policy),
        )
        .await?;
    for name in ["web-a", "web-b", "api"] {
        federation
            .apply(&deployments(), deployment(name, 1))
            .await?;
    }
    let stray: DynamicObject = serde_json::from_value(deployment("stray", 1))?;
    Api::<DynamicObject>::namespaced_with(hub.clone(), &other.name, &deployments())
        .create(&PostParams::default(), &stray)
        .await?;
    for name in ["web-a", "web-b", "api"] {
        let binding =
            wait_policy_of(&federation, &format!("{name}-deployment"), &star.name).await?;
        let policy = binding.spec.policy.clone().context("policy")?;
        assert_eq!(policy.kind, "ClusterPropagationPolicy");
        assert_eq!(
            policy.selected_by.as_deref(),
            Some(
                format!(
                    "resourceSelectors[0]: name pattern * (every Deployment) in namespace {ns}"
                )
                .as_str()
            )
        );
        assert_eq!(policy.precedence, None, "no other policy selects it");
        federation
            .wait_copies(
                &deployments(),
                name,
                "in north",
                Duration::from_secs(30),
                |c| c.len() == 1 && c[0].cluster == "north",
            )
            .await?;
    }
    let selected =
        wait_cluster_policy(&federation, &star.name, "selects the 3", |s| s.3 == 3).await?;
    assert_eq!(
        (selected.0.as_str(), selected.1.as_str(), selected.4),
        ("True", "TemplatesSelected", 3),
        "{selected:?}"
    );
    federation.wait_settled(Duration::from_secs(60)).await?;
    assert!(
        Api::<ResourceBinding>::namespaced(hub.clone(), &other.name)
            .get_opt("stray-deployment")
            .await?
            .is_none(),
        "a Deployment in another namespace is not selected"
    );

    // 2. A pattern beats `*`; an exact name beats the pattern (same priority); `api`
    // stays with `*`.
    federation
        .apply(
            &policies(),
            federation.policy(
                "web-pattern",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web-*"}]),
                json!({"clusterAffinity": {"clusterNames": ["east"]}}),
                json!({}),
            ),
        )
        .await?;
    federation
        .apply(
            &policies(),
            federation.policy(
                "web-a-exact",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web-a"}]),
                json!({"clusterAffinity": {"clusterNames": ["west"]}}),
                json!({}),
            ),
        )
        .await?;
    let web_a = wait_policy_of(&federation, "web-a-deployment", "web-a-exact").await?;
    let reference = web_a.spec.policy.clone().context("policy")?;
    assert_eq!(
        reference.selected_by.as_deref(),
        Some("resourceSelectors[0]: name web-a")
    );
    let precedence = reference.precedence.clone().unwrap_or_default();
    assert!(
        precedence.contains(&format!(
            "PropagationPolicy {ns}/web-pattern (priority 0, a name pattern)"
        )) && precedence.contains("an exact name beats a name pattern")
            && precedence.starts_with("over 2 other policies"),
        "{precedence}"
    );
    let web_b = wait_policy_of(&federation, "web-b-deployment", "web-pattern").await?;
    let reference = web_b.spec.policy.clone().context("policy")?;
    assert_eq!(
        reference.selected_by.as_deref(),
        Some("resourceSelectors[0]: name pattern web-*")
    );
    assert!(
        reference
            .precedence
            .as_deref()
            .is_some_and(|p| p.contains("a name pattern beats a kind-wide selector")),
        "{reference:?}"
    );
    federation
        .wait_copies(
            &deployments(),
            "web-a",
            "moved to west",
            Duration::from_secs(60),
            |c| c.len() == 1 && c[0].cluster == "west",
        )
        .await?;
    federation
        .wait_copies(
            &deployments(),
            "web-b",
            "moved to east",
            Duration::from_secs(60),
            |c| c.len() == 1 && c[0].cluster == "east",
        )
        .await?;
    let api = federation
        .binding("api-deployment")
        .await?
        .context("api binding")?;
    assert_eq!(
        api.spec.policy.as_ref().map(|p| p.name.as_str()),
        Some(star.name.as_str())
    );
    assert_eq!(binding_replicas(&api), [("north".to_string(), 1)]);

    // What each policy says it selects.
    let pattern = wait_policy(
        &federation,
        "web-pattern",
        "selects web-a and web-b, places web-b",
        |s| (s.3, s.4) == (2, 1),
    )
    .await?;
    assert_eq!(
        (pattern.0.as_str(), pattern.1.as_str()),
        ("True", "PartlyOutranked"),
        "{pattern:?}"
    );
    assert!(
        pattern.2.contains(&format!(
            "1 to PropagationPolicy {ns}/web-a-exact (an exact name)"
        )),
        "{pattern:?}"
    );
    let exact = wait_policy(&federation, "web-a-exact", "places web-a", |s| {
        (s.3, s.4) == (1, 1)
    })
    .await?;
    assert_eq!(exact.1, "TemplatesSelected");
    let star_now = wait_cluster_policy(&federation, &star.name, "places only api", |s| {
        (s.3, s.4) == (3, 1)
    })
    .await?;
    assert_eq!(star_now.1, "PartlyOutranked", "{star_now:?}");

    // 3. A policy that selects nothing says why, and flips once it does.
    federation
        .apply(
            &policies(),
            federation.policy(
                "databases",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "db-*"}]),
                json!({}),
                json!({}),
            ),
        )
        .await?;
    federation
        .apply(
            &policies(),
            federation.policy(
                "typo",
                json!([{"apiVersion": "apps/v1", "kind": "Deploymnet"}]),
                json!({}),
                json!({}),
            ),
        )
        .await?;
    let nothing = wait_policy(&federation, "databases", "NothingSelected", |s| {
        s.1 == "NothingSelected"
    })
    .await?;
    assert_eq!((nothing.0.as_str(), nothing.3), ("False", 0));
    assert!(
        nothing.2.contains(&format!(
            "3 Deployment templates in namespace {ns}, but none matches the name pattern db-*"
        )),
        "{nothing:?}"
    );
    let typo = wait_policy(&federation, "typo", "NothingSelected", |s| {
        s.1 == "NothingSelected"
    })
    .await?;
    assert!(
        typo.2
            .contains("apps/v1 Deploymnet is not a kind the hub federates"),
        "{typo:?}"
    );
    eprintln!("typo: {}", typo.2);
    federation
        .apply(&deployments(), deployment("db-1", 1))
        .await?;
    let now_selected =
        wait_policy(&federation, "databases", "selects db-1", |s| s.0 == "True").await?;
    assert_eq!(
        (now_selected.1.as_str(), now_selected.2.as_str()),
        ("TemplatesSelected", "selects 1 template and places it")
    );
    wait_policy_of(&federation, "db-1-deployment", "databases").await?;

    // The status is written per policy, not per template event, and not again once right.
    federation.wait_settled(Duration::from_secs(60)).await?;
    let writes = |text: &str| {
        bulkhead_e2e::hub_support::counter_sum(
            text,
            "bulkhead_hub_writes_total",
            "what=\"policy_status\"",
        )
    };
    let settled = writes(&federation.hub_metrics().await?);
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        writes(&federation.hub_metrics().await?),
        settled,
        "nothing changed, nothing rewritten"
    );
    eprintln!("policy status writes in all: {settled}");
    assert!(
        settled <= 20.0,
        "{settled} policy status writes for 5 policies"
    );
    drop(star);
    Ok(())
}

#[tokio::test]
async fn plan_shows_every_outcome_of_a_tie_until_the_template_exists() -> Result<()> {
    let federation = Federation::start("plan-tie", &[]).await?;
    let ns = federation.namespace.clone();
    let policy = federation.policy(
        "tie",
        json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "tie"}]),
        json!({"replicaScheduling": {"type": "Divided", "weightPreference": {"staticWeightList": [
            {"targetCluster": {"clusterNames": ["east"]}, "weight": 2},
            {"targetCluster": {"clusterNames": ["north", "west"]}, "weight": 1}]}}}),
        json!({}),
    );
    let mut template = deployment("tie", 6);
    template["metadata"]["namespace"] = json!(ns);
    let file = std::env::temp_dir().join(format!("{ns}-plan.yaml"));
    std::fs::write(
        &file,
        format!(
            "{}---\n{}",
            serde_yaml::to_string(&policy)?,
            serde_yaml::to_string(&template)?
        ),
    )?;
    let plan = || -> Result<String> {
        let output = bulkhead(&[
            "plan",
            "-f",
            &path(&file),
            "--clusters-from-hub",
            "--kubeconfig",
            &path(&federation.lab.kubeconfig("hub")),
        ])?;
        anyhow::ensure!(
            output.status.success(),
            "bulkhead plan failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(String::from_utf8(output.stdout)?)
    };

    // Not on the hub yet: both outcomes, no guess.
    let text = plan()?;
    eprintln!("{text}");
    assert!(text.contains("uid: none yet (not on the hub yet"), "{text}");
    assert!(
        text.contains("north 2, west 1 or north 1, west 2 (decided by the UID)"),
        "{text}"
    );

    // Created: plan uses the live template's UID and agrees with the hub.
    federation.apply(&policies(), policy.clone()).await?;
    let live = federation
        .apply(&deployments(), deployment("tie", 6))
        .await?;
    let uid = live.metadata.uid.clone().context("uid")?;
    let binding = federation
        .wait_binding("tie-deployment", "placed", Duration::from_secs(30), |b| {
            (binding_replicas(b).iter().map(|(_, r)| r).sum::<i64>() == 6).then(|| b.clone())
        })
        .await?;
    let text = plan()?;
    eprintln!("{text}");
    assert!(
        text.contains(&format!("uid: {uid} (the live template on the hub)")),
        "{text}"
    );
    assert!(text.contains("this template's UID gives it to"), "{text}");
    for (cluster, replicas) in binding_replicas(&binding) {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(&cluster))
            .with_context(|| format!("no {cluster} row:\n{text}"))?;
        let columns: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            columns.get(3),
            Some(&replicas.to_string().as_str()),
            "plan and hub agree: {line}"
        );
    }
    let _ = std::fs::remove_file(&file);
    Ok(())
}
