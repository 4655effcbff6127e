//! `bulkhead plan`: the hub's placement, offline. Reads policies, templates and member
//! clusters from files (or the clusters from the hub), runs the same matching and
//! placement code the hub runs, and prints each template's decision with a reason per
//! cluster, and what would change if a zone or cluster failed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::Deserialize;
use serde_json::Value;

use crate::api::propagation_policy::Placement;
use crate::api::propagation_policy::StatefulFailover;
use crate::api::resource_binding::TargetCluster;
use crate::api::{ClusterPropagationPolicy, MemberCluster, PropagationPolicy};
use crate::hub::federation::interpreter::Interpreters;
use crate::hub::federation::kinds::{
    cluster_view, failed, hub_cluster_view, placement_tolerations,
};
use crate::hub::federation::matching::{
    PolicyCandidate, PolicyScope, SelectorStrength, TemplateRef, choose_policy,
};
use crate::hub::federation::placement::{ClusterView, PlacementRequest, PlacementResult, place};
use crate::process::ClientOptions;

/// `bulkhead plan` options.
#[derive(clap::Args, Debug)]
pub struct PlanOptions {
    /// YAML files (multi-document) with policies, templates and, unless
    /// --clusters-from-hub, MemberClusters.
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<PathBuf>,
    /// Read the MemberClusters (with their health) from the hub instead of the files.
    #[arg(long)]
    pub clusters_from_hub: bool,
    #[command(flatten)]
    pub hub: ClientOptions,
    /// Also show what happens when this zone or cluster fails (repeatable).
    #[arg(long = "fail")]
    pub fail: Vec<String>,
}

/// Everything read from the files.
#[derive(Debug, Default)]
pub struct PlanInputs {
    pub policies: Vec<PropagationPolicy>,
    pub cluster_policies: Vec<ClusterPropagationPolicy>,
    pub clusters: Vec<MemberCluster>,
    pub templates: Vec<Value>,
    /// `ResourceInterpreter`s: how kinds other than the built-in ones are read.
    pub interpreters: Vec<crate::api::ResourceInterpreter>,
}

/// Sorts YAML documents into policies, clusters and templates.
pub fn parse_documents(text: &str, source: &str) -> anyhow::Result<PlanInputs> {
    let mut inputs = PlanInputs::default();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(document)
            .with_context(|| format!("{source}: document {} is not YAML", index + 1))?;
        if value.is_null() {
            continue;
        }
        let kind = value["kind"].as_str().unwrap_or_default().to_string();
        let what = || {
            format!(
                "{source}: {kind} {}",
                value["metadata"]["name"].as_str().unwrap_or("<unnamed>")
            )
        };
        match (
            value["apiVersion"].as_str().unwrap_or_default(),
            kind.as_str(),
        ) {
            ("federation.example.com/v1alpha1", "PropagationPolicy") => inputs
                .policies
                .push(serde_json::from_value(value.clone()).with_context(what)?),
            ("federation.example.com/v1alpha1", "ClusterPropagationPolicy") => inputs
                .cluster_policies
                .push(serde_json::from_value(value.clone()).with_context(what)?),
            ("federation.example.com/v1alpha1", "MemberCluster") => inputs
                .clusters
                .push(serde_json::from_value(value.clone()).with_context(what)?),
            ("federation.example.com/v1alpha1", "ResourceInterpreter") => inputs
                .interpreters
                .push(serde_json::from_value(value.clone()).with_context(what)?),
            ("federation.example.com/v1alpha1", "ResourceBinding") | ("v1", "Secret") => {}
            (api_version, _) if api_version.is_empty() || kind.is_empty() => {
                bail!("{source}: document {} has no apiVersion or kind", index + 1)
            }
            _ => inputs.templates.push(value),
        }
    }
    Ok(inputs)
}

/// The plan for one template.
pub struct TemplatePlan {
    pub title: String,
    pub policy: Option<String>,
    pub result: Option<PlacementResult>,
    pub failures: Vec<(String, Vec<TargetCluster>, String)>,
}

fn describe_strength(strength: SelectorStrength) -> &'static str {
    match strength {
        SelectorStrength::Name => "by name",
        SelectorStrength::Label => "by labels",
        SelectorStrength::KindWide => "every object of the kind",
    }
}

/// Runs matching and placement for every template; `fail` names zones or clusters.
pub fn plan(
    inputs: &PlanInputs,
    views: &[ClusterView],
    fail: &[String],
    now: jiff::Timestamp,
) -> Vec<TemplatePlan> {
    let mut candidates: Vec<PolicyCandidate> = inputs
        .policies
        .iter()
        .map(|p| PolicyCandidate {
            scope: PolicyScope::Namespaced,
            namespace: p.metadata.namespace.as_deref().or(Some("default")),
            name: p.metadata.name.as_deref().unwrap_or_default(),
            spec: &p.spec,
        })
        .collect();
    candidates.extend(inputs.cluster_policies.iter().map(|p| PolicyCandidate {
        scope: PolicyScope::Cluster,
        namespace: None,
        name: p.metadata.name.as_deref().unwrap_or_default(),
        spec: &p.spec.policy,
    }));

    let (interpreters, _) = Interpreters::with_resources(
        &inputs
            .interpreters
            .iter()
            .cloned()
            .map(std::sync::Arc::new)
            .collect::<Vec<_>>(),
    );
    inputs
        .templates
        .iter()
        .map(|template| {
            let api_version = template["apiVersion"].as_str().unwrap_or_default();
            let kind = template["kind"].as_str().unwrap_or_default();
            let namespace = template["metadata"]["namespace"].as_str().unwrap_or("default");
            let name = template["metadata"]["name"].as_str().unwrap_or_default();
            let labels: BTreeMap<String, String> =
                serde_json::from_value(template["metadata"]["labels"].clone()).unwrap_or_default();
            let interpretation = interpreters.get(api_version, kind);
            let divisible = interpretation.divisible();
            let stateful = interpretation.stateful;
            let replicas = interpretation.replicas_of(template).unwrap_or(1);
            let title = format!("{kind} {namespace}/{name} ({replicas} replicas; interpreter: {})", interpretation.source);
            let reference = TemplateRef { api_version, kind, namespace, name, labels: &labels };
            let Some((policy, strength)) = choose_policy(&reference, &candidates) else {
                return TemplatePlan { title, policy: None, result: None, failures: vec![] };
            };
            let uid = template["metadata"]["uid"].as_str().map(str::to_string).unwrap_or_else(|| format!("{namespace}/{name}"));
            // The hub's tolerations: the policy's plus failover's (stateful kinds never move).
            let placement = Placement {
                cluster_tolerations: placement_tolerations(policy.spec, stateful, false),
                ..policy.spec.placement.clone()
            };
            let request = PlacementRequest {
                placement: &placement,
                replicas,
                divisible,
                stateful,
                uid: &uid,
                clusters: &crate::hub::federation::placement::capacity::with_estimates(views, &placement, template),
                current: &[],
                now,
            };
            let result = place(&request);
            let policy_text = format!(
                "{} {}{} (priority {}, {})",
                if policy.scope == PolicyScope::Namespaced { "PropagationPolicy" } else { "ClusterPropagationPolicy" },
                policy.namespace.map(|ns| format!("{ns}/")).unwrap_or_default(),
                policy.name,
                policy.spec.priority,
                describe_strength(strength)
            );
            let failures = fail
                .iter()
                .map(|target| {
                    let hit = |v: &ClusterView| v.name == *target || v.zone == *target;
                    if !views.iter().any(hit) {
                        return (target.clone(), result.targets.clone(), format!("no cluster or zone is named {target}"));
                    }
                    if stateful {
                        let fenced: Vec<&str> = result.targets.iter().filter(|t| views.iter().any(|v| v.name == t.name && hit(v))).map(|t| t.name.as_str()).collect();
                        let note = match (policy.spec.failover.stateful, fenced.is_empty()) {
                            (_, true) => "no replica is affected".to_string(),
                            (StatefulFailover::Fence, false) => format!("stateful: nothing moves; the replicas in {} stay and serve read-only (fenced) until the partition heals", fenced.join(", ")),
                            (StatefulFailover::Preserve, false) => format!("stateful: nothing moves; the replicas in {} stay (Preserve: not marked fenced)", fenced.join(", ")),
                        };
                        return (target.clone(), result.targets.clone(), note);
                    }
                    let long_ago = now - jiff::SignedDuration::from_hours(24);
                    let surviving: Vec<ClusterView> = views.iter().map(|v| if hit(v) { failed(v, long_ago) } else { v.clone() }).collect();
                    let after = place(&PlacementRequest { clusters: &surviving, current: &result.targets, ..request });
                    let note = match &after.scheduled {
                        Ok(()) => format!(
                            "stateless: after failover.stateless.tolerationSeconds ({} s) the replicas move to the survivors",
                            policy.spec.failover.stateless.toleration_seconds
                        ),
                        Err(reason) => format!("unschedulable ({reason}): nothing is removed anywhere, the binding says Scheduled=False"),
                    };
                    let targets = if after.scheduled.is_ok() { after.targets } else { result.targets.clone() };
                    (target.clone(), targets, note)
                })
                .collect();
            TemplatePlan { title, policy: Some(policy_text), result: Some(result), failures }
        })
        .collect()
}

fn replicas_of(targets: &[TargetCluster], name: &str) -> i32 {
    targets
        .iter()
        .find(|t| t.name == name)
        .map(|t| t.replicas)
        .unwrap_or(0)
}

/// Renders the plans as text tables.
pub fn render(plans: &[TemplatePlan], views: &[ClusterView]) -> String {
    let mut out = String::new();
    for plan in plans {
        let _ = writeln!(out, "{}", plan.title);
        let (Some(policy), Some(result)) = (&plan.policy, &plan.result) else {
            let _ = writeln!(out, "  no policy selects it: the hub leaves it alone\n");
            continue;
        };
        let _ = writeln!(out, "  policy: {policy}");
        match &result.scheduled {
            Ok(()) => {}
            Err(reason) => {
                let _ = writeln!(out, "  Scheduled=False: {reason}");
            }
        }
        let _ = writeln!(
            out,
            "  {:<12} {:<10} {:<9} {:>8}  REASON",
            "CLUSTER", "ZONE", "SELECTED", "REPLICAS"
        );
        for decision in &result.decisions {
            let zone = views
                .iter()
                .find(|v| v.name == decision.cluster)
                .map(|v| v.zone.as_str())
                .unwrap_or("");
            let _ = writeln!(
                out,
                "  {:<12} {:<10} {:<9} {:>8}  {}",
                decision.cluster,
                zone,
                if decision.selected { "yes" } else { "no" },
                replicas_of(&result.targets, &decision.cluster),
                decision.reason
            );
        }
        for (target, after, note) in &plan.failures {
            let _ = writeln!(out, "  if {target} fails: {note}");
            for view in views {
                let (before, now) = (
                    replicas_of(&result.targets, &view.name),
                    replicas_of(after, &view.name),
                );
                if before != now {
                    let _ = writeln!(out, "    {:<12} {before} -> {now}", view.name);
                }
            }
        }
        out.push('\n');
    }
    out
}

/// Runs `bulkhead plan`.
pub async fn run(options: &PlanOptions) -> anyhow::Result<()> {
    let mut inputs = PlanInputs::default();
    for file in &options.files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let parsed = parse_documents(&text, &file.display().to_string())?;
        inputs.policies.extend(parsed.policies);
        inputs.cluster_policies.extend(parsed.cluster_policies);
        inputs.clusters.extend(parsed.clusters);
        inputs.templates.extend(parsed.templates);
    }
    let from_hub = options.clusters_from_hub;
    if from_hub {
        let client = crate::process::connect(&options.hub).await?;
        let api: kube::Api<MemberCluster> = kube::Api::all(client);
        inputs.clusters = api
            .list(&Default::default())
            .await
            .context("listing MemberClusters on the hub")?
            .items;
    }
    if inputs.clusters.is_empty() {
        bail!("no MemberClusters: add them to the files or pass --clusters-from-hub");
    }
    if inputs.templates.is_empty() {
        bail!(
            "no templates in the files: add the objects to place (Deployment, MyDatabase, ConfigMap, ...)"
        );
    }
    // From files, a MemberCluster without status has never been probed: assume Ready.
    // A refused duplicate MemberCluster is not a cluster of its own.
    let views: Vec<ClusterView> = inputs
        .clusters
        .iter()
        .filter(|c| !crate::hub::federation::kinds::is_refused_duplicate(c))
        .map(|c| {
            if from_hub {
                hub_cluster_view(c, &Default::default())
            } else {
                cluster_view(c, true)
            }
        })
        .collect();
    print!(
        "{}",
        render(
            &plan(&inputs, &views, &options.fail, jiff::Timestamp::now()),
            &views
        )
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTERS: &str = r#"
apiVersion: federation.example.com/v1alpha1
kind: MemberCluster
metadata: {name: east}
spec: {secretRef: {namespace: bulkhead-system, name: member-east}, zone: zone-a}
---
apiVersion: federation.example.com/v1alpha1
kind: MemberCluster
metadata: {name: west}
spec: {secretRef: {namespace: bulkhead-system, name: member-west}, zone: zone-b}
---
apiVersion: federation.example.com/v1alpha1
kind: MemberCluster
metadata: {name: north}
spec: {secretRef: {namespace: bulkhead-system, name: member-north}, zone: zone-c}
"#;

    const TEMPLATES: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop, uid: u-web}
spec: {replicas: 6}
---
apiVersion: example.com/v1
kind: MyDatabase
metadata: {name: orders, namespace: shop, uid: u-orders}
spec: {replicas: 3}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: unplaced, namespace: shop}
"#;

    fn inputs() -> PlanInputs {
        let policy = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/samples/propagationpolicy.yaml"
        ))
        .unwrap();
        let text = format!("{CLUSTERS}\n---\n{TEMPLATES}\n---\n{policy}");
        parse_documents(&text, "test").unwrap()
    }

    #[test]
    fn sorts_documents() {
        let inputs = inputs();
        assert_eq!(
            (
                inputs.policies.len(),
                inputs.clusters.len(),
                inputs.templates.len()
            ),
            (1, 3, 3)
        );
        assert!(
            parse_documents("kind: Foo\n", "x")
                .unwrap_err()
                .to_string()
                .contains("no apiVersion or kind")
        );
    }

    #[test]
    fn plans_the_sample_policy_with_reasons_and_failures() {
        let inputs = inputs();
        let views: Vec<ClusterView> = inputs
            .clusters
            .iter()
            .map(|c| cluster_view(c, true))
            .collect();
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let plans = plan(&inputs, &views, &["zone-a".to_string()], now);
        let text = render(&plans, &views);
        // The sample weights east 2 : west 1 : north 1.
        let web = &plans[0];
        let targets = &web.result.as_ref().unwrap().targets;
        assert_eq!(targets.iter().map(|t| t.replicas).sum::<i32>(), 6, "{text}");
        assert_eq!(replicas_of(targets, "east"), 3, "{text}");
        assert!(
            web.policy.as_ref().unwrap().contains("shop/weighted")
                && web.policy.as_ref().unwrap().contains("by name")
        );
        // The stateless Deployment leaves zone-a; the database does not move.
        let (_, after, note) = &web.failures[0];
        assert_eq!(replicas_of(after, "east"), 0, "{text}");
        assert_eq!(after.iter().map(|t| t.replicas).sum::<i32>(), 6, "{text}");
        assert!(note.contains("stateless"), "{note}");
        let orders = &plans[1];
        let (_, after, note) = &orders.failures[0];
        assert_eq!(after, &orders.result.as_ref().unwrap().targets);
        assert!(note.contains("fenced"), "{note}");
        assert!(plans[2].policy.is_none());
        assert!(text.contains("no policy selects it"), "{text}");
        assert!(text.contains("if zone-a fails"), "{text}");
    }
}
