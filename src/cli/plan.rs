//! `bulkhead plan`: the hub's placement, offline. Reads policies, templates and member
//! clusters from files (or the clusters from the hub), runs the same matching and
//! placement code the hub runs, and prints each template's decision with a reason per
//! cluster, which policy selector matched and why that policy won, and what would change
//! if a zone or cluster failed.
//!
//! A Divided/Weighted division can tie at its last replica (equal weights, one replica
//! left for two clusters); the hub breaks the tie by the template's UID. With a hub
//! connection plan uses the UID of the live template; a template that is not on the hub
//! yet has no UID, and plan shows every outcome the tie can give instead of guessing one.

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
use crate::hub::federation::matching::{PolicyCandidate, PolicyScope, TemplateRef, choose};
use crate::hub::federation::placement::{
    ClusterView, PlacementRequest, PlacementResult, Tie, place, uid_tie,
};
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
    /// The hub. With --kubeconfig, --context or --clusters-from-hub, plan also looks up
    /// each template on the hub and, when it exists, plans with its UID (which breaks
    /// ties between equal weights as the hub does).
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
    /// The templates' live objects on the hub, by [`template_key`]; empty when the hub
    /// was not asked (`hub_asked`).
    pub live: BTreeMap<String, LiveTemplate>,
    pub hub_asked: bool,
}

/// What the hub said about a template of the files.
#[derive(Clone, Debug, PartialEq)]
pub enum LiveTemplate {
    /// It exists, with this UID.
    Exists(String),
    /// Not on the hub (yet).
    Missing,
    /// The lookup failed.
    Failed(String),
}

/// Key of a template in [`PlanInputs::live`].
pub fn template_key(api_version: &str, kind: &str, namespace: &str, name: &str) -> String {
    format!("{api_version}/{kind}/{namespace}/{name}")
}

/// Where the UID a plan used came from.
#[derive(Clone, Debug, PartialEq)]
pub enum UidSource {
    /// `metadata.uid` in the file.
    File(String),
    /// The live template on the hub.
    Live(String),
    /// No UID: the words say why (not on the hub yet, the hub not asked, the lookup
    /// failed). Ties are shown with every outcome.
    Unknown(String),
}

impl UidSource {
    fn known(&self) -> Option<&str> {
        match self {
            UidSource::File(uid) | UidSource::Live(uid) => Some(uid),
            UidSource::Unknown(_) => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            UidSource::File(uid) => format!("{uid} (metadata.uid in the file)"),
            UidSource::Live(uid) => format!("{uid} (the live template on the hub)"),
            UidSource::Unknown(why) => format!("none yet ({why})"),
        }
    }
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
    /// The winning policy, its priority and the selector that matched.
    pub policy: Option<String>,
    /// Why it beat the next policy selecting the template, when there is one.
    pub precedence: Option<String>,
    pub uid: UidSource,
    pub result: Option<PlacementResult>,
    /// Clusters tied for the last replicas, which the UID decides.
    pub tie: Option<TieOutcomes>,
    pub failures: Vec<(String, Vec<TargetCluster>, String)>,
}

/// A tie and what it can come to.
#[derive(Clone, Debug, PartialEq)]
pub struct TieOutcomes {
    pub tie: Tie,
    /// Replicas of the tied clusters (in `tie.clusters` order) in each outcome, at most
    /// [`SHOWN_OUTCOMES`] of them.
    pub outcomes: Vec<Vec<u32>>,
    /// How many outcomes there are in all.
    pub count: u128,
}

/// Outcomes of a tie listed, at most.
pub const SHOWN_OUTCOMES: usize = 6;

fn binomial(n: usize, k: usize) -> u128 {
    if k > n {
        return 0;
    }
    let k = k.min(n - k);
    (0..k).fold(1u128, |acc, i| {
        acc.saturating_mul((n - i) as u128) / (i as u128 + 1)
    })
}

/// The outcomes of `tie`: every choice of `tie.extra` tied clusters getting one more,
/// in a stable order (the earlier names first), at most `limit`.
pub fn tie_outcomes(tie: &Tie, limit: usize) -> TieOutcomes {
    let n = tie.clusters.len();
    let mut outcomes = Vec::new();
    // Combinations of `extra` indices out of n, in lexicographic order.
    let mut chosen: Vec<usize> = (0..tie.extra).collect();
    loop {
        if outcomes.len() == limit {
            break;
        }
        let mut replicas = vec![tie.base; n];
        for &i in &chosen {
            replicas[i] += 1;
        }
        outcomes.push(replicas);
        // Next combination.
        let Some(at) = (0..chosen.len())
            .rev()
            .find(|&i| chosen[i] < n - chosen.len() + i)
        else {
            break;
        };
        chosen[at] += 1;
        for i in at + 1..chosen.len() {
            chosen[i] = chosen[i - 1] + 1;
        }
    }
    TieOutcomes {
        tie: tie.clone(),
        outcomes,
        count: binomial(n, tie.extra),
    }
}

/// `north 2, west 1 or north 1, west 2`.
fn describe_outcomes(outcomes: &TieOutcomes) -> String {
    let mut text = outcomes
        .outcomes
        .iter()
        .map(|replicas| {
            outcomes
                .tie
                .clusters
                .iter()
                .zip(replicas)
                .map(|(cluster, r)| format!("{cluster} {r}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .collect::<Vec<_>>()
        .join(" or ");
    let shown = outcomes.outcomes.len() as u128;
    if outcomes.count > shown {
        let _ = write!(text, " or {} more", outcomes.count - shown);
    }
    text
}

fn and_list(names: &[String]) -> String {
    match names {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
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

    inputs
        .templates
        .iter()
        .map(|template| plan_one(inputs, &candidates, template, views, fail, now))
        .collect()
}

/// Where the UID of `template` comes from.
fn uid_of(inputs: &PlanInputs, template: &Value, key: &str) -> UidSource {
    if let Some(uid) = template["metadata"]["uid"]
        .as_str()
        .filter(|u| !u.is_empty())
    {
        return UidSource::File(uid.to_string());
    }
    if !inputs.hub_asked {
        return UidSource::Unknown(
            "no metadata.uid in the file, and the hub was not asked: pass --kubeconfig to use the live template's UID".to_string(),
        );
    }
    match inputs.live.get(key) {
        Some(LiveTemplate::Exists(uid)) => UidSource::Live(uid.clone()),
        Some(LiveTemplate::Failed(error)) => {
            UidSource::Unknown(format!("the hub lookup failed: {error}"))
        }
        Some(LiveTemplate::Missing) | None => {
            UidSource::Unknown("not on the hub yet: it gets its UID when it is created".to_string())
        }
    }
}

fn plan_one(
    inputs: &PlanInputs,
    candidates: &[PolicyCandidate],
    template: &Value,
    views: &[ClusterView],
    fail: &[String],
    now: jiff::Timestamp,
) -> TemplatePlan {
    let api_version = template["apiVersion"].as_str().unwrap_or_default();
    let kind = template["kind"].as_str().unwrap_or_default();
    let namespace = template["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    let name = template["metadata"]["name"].as_str().unwrap_or_default();
    let labels: BTreeMap<String, String> =
        serde_json::from_value(template["metadata"]["labels"].clone()).unwrap_or_default();
    let (interpreters, _) = Interpreters::with_resources(
        &inputs
            .interpreters
            .iter()
            .cloned()
            .map(std::sync::Arc::new)
            .collect::<Vec<_>>(),
    );
    let interpretation = interpreters.get(api_version, kind);
    let divisible = interpretation.divisible();
    let stateful = interpretation.stateful;
    let replicas = interpretation.replicas_of(template).unwrap_or(1);
    let title = format!(
        "{kind} {namespace}/{name} ({replicas} replicas; interpreter: {})",
        interpretation.source
    );
    let uid = uid_of(
        inputs,
        template,
        &template_key(api_version, kind, namespace, name),
    );
    let reference = TemplateRef {
        api_version,
        kind,
        namespace,
        name,
        labels: &labels,
    };
    let Some(choice) = choose(&reference, candidates) else {
        return TemplatePlan {
            title,
            policy: None,
            precedence: None,
            uid,
            result: None,
            tie: None,
            failures: vec![],
        };
    };
    let policy = choice.policy;
    // Without a UID any stand-in gives one of the tie's outcomes; the tie is then shown.
    let placeholder = format!("{namespace}/{name}");
    let uid_text = uid.known().unwrap_or(&placeholder).to_string();
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
        uid: &uid_text,
        // Offline: every replica counts as running.
        clusters: &crate::hub::federation::placement::capacity::with_estimates(
            views,
            &placement,
            template,
            &|_| 0,
        ),
        current: &[],
        now,
        static_weights: None,
        // As the hub: a recorded primary cluster keeps its replica first.
        first_seat: template["status"]["primaryCluster"].as_str(),
    };
    let result = place(&request);
    let tie = uid_tie(&request).map(|tie| tie_outcomes(&tie, SHOWN_OUTCOMES));
    let policy_text = format!(
        "{} (priority {}), selected by {}",
        policy.describe(),
        policy.spec.priority,
        choice.selected_by()
    );
    let failures = fail
        .iter()
        .map(|target| {
            let hit = |v: &ClusterView| v.name == *target || v.zone == *target;
            if !views.iter().any(hit) {
                return (
                    target.clone(),
                    result.targets.clone(),
                    format!("no cluster or zone is named {target}"),
                );
            }
            if stateful {
                let fenced: Vec<&str> = result
                    .targets
                    .iter()
                    .filter(|t| views.iter().any(|v| v.name == t.name && hit(v)))
                    .map(|t| t.name.as_str())
                    .collect();
                let note = match (policy.spec.failover.stateful, fenced.is_empty()) {
                    (_, true) => "no replica is affected".to_string(),
                    (StatefulFailover::Fence, false) => format!(
                        "stateful: nothing moves; the replicas in {} stay and serve read-only (fenced) until the partition heals",
                        fenced.join(", ")
                    ),
                    (StatefulFailover::Preserve, false) => format!(
                        "stateful: nothing moves; the replicas in {} stay (Preserve: not marked fenced)",
                        fenced.join(", ")
                    ),
                };
                return (target.clone(), result.targets.clone(), note);
            }
            let long_ago = now - jiff::SignedDuration::from_hours(24);
            let surviving: Vec<ClusterView> = views
                .iter()
                .map(|v| if hit(v) { failed(v, long_ago) } else { v.clone() })
                .collect();
            let after_request = PlacementRequest {
                clusters: &surviving,
                current: &result.targets,
                ..request
            };
            let after = place(&after_request);
            let mut note = match &after.scheduled {
                Ok(()) => format!(
                    "stateless: after failover.stateless.tolerationSeconds ({} s) the replicas move to the survivors",
                    policy.spec.failover.stateless.toleration_seconds
                ),
                Err(reason) => format!(
                    "unschedulable ({reason}): nothing is removed anywhere, the binding says Scheduled=False"
                ),
            };
            if uid.known().is_none() && (tie.is_some() || uid_tie(&after_request).is_some()) {
                note.push_str(" (one outcome of a tie the template's UID decides)");
            }
            let targets = if after.scheduled.is_ok() {
                after.targets
            } else {
                result.targets.clone()
            };
            (target.clone(), targets, note)
        })
        .collect();
    TemplatePlan {
        title,
        policy: Some(policy_text),
        precedence: choice.precedence(),
        uid,
        result: Some(result),
        tie,
        failures,
    }
}

fn replicas_of(targets: &[TargetCluster], name: &str) -> i32 {
    targets
        .iter()
        .find(|t| t.name == name)
        .map(|t| t.replicas)
        .unwrap_or(0)
}

/// The tie, in words, under the table.
fn describe_tie(plan: &TemplatePlan, tie: &TieOutcomes, targets: &[TargetCluster]) -> String {
    let seats = tie.tie.extra;
    let last = if seats == 1 {
        "the last replica".to_string()
    } else {
        format!("the last {seats} replicas")
    };
    let clusters = and_list(&tie.tie.clusters);
    match plan.uid.known() {
        Some(_) => {
            let winners: Vec<String> = tie
                .tie
                .clusters
                .iter()
                .filter(|c| replicas_of(targets, c) as u32 > tie.tie.base)
                .cloned()
                .collect();
            format!(
                "{clusters} have equal weight and tie for {last}; this template's UID gives it to {}",
                and_list(&winners)
            )
        }
        None => format!(
            "{clusters} have equal weight and tie for {last}; the hub breaks the tie by the template's UID once it is created: {} (decided by the UID)",
            describe_outcomes(tie)
        ),
    }
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
        if let Some(precedence) = &plan.precedence {
            let _ = writeln!(out, "  precedence: {precedence}");
        }
        // The UID only matters for a tie; a live one is shown to confirm the lookup.
        if plan.tie.is_some() || matches!(plan.uid, UidSource::Live(_)) {
            let _ = writeln!(out, "  uid: {}", plan.uid.describe());
        }
        match &result.scheduled {
            Ok(()) => {}
            Err(reason) => {
                let _ = writeln!(out, "  Scheduled=False: {reason}");
            }
        }
        // Without a UID the tied rows show every value they can take.
        let open_tie = plan.tie.as_ref().filter(|_| plan.uid.known().is_none());
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
            let replicas = replicas_of(&result.targets, &decision.cluster);
            let (selected, replicas, reason) =
                match open_tie.filter(|t| t.tie.clusters.contains(&decision.cluster)) {
                    Some(tie) => {
                        let base = tie.tie.base;
                        (
                            if base > 0 { "yes" } else { "maybe" },
                            format!("{base} or {}", base + 1),
                            format!(
                                "weight tied with {}: {base} or {} replicas, decided by the UID",
                                and_list(
                                    &tie.tie
                                        .clusters
                                        .iter()
                                        .filter(|c| **c != decision.cluster)
                                        .cloned()
                                        .collect::<Vec<_>>()
                                ),
                                base + 1
                            ),
                        )
                    }
                    None => (
                        if decision.selected { "yes" } else { "no" },
                        replicas.to_string(),
                        decision.reason.clone(),
                    ),
                };
            let _ = writeln!(
                out,
                "  {:<12} {:<10} {:<9} {:>8}  {}",
                decision.cluster, zone, selected, replicas, reason
            );
        }
        if let Some(tie) = &plan.tie {
            let _ = writeln!(out, "  tie: {}", describe_tie(plan, tie, &result.targets));
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

/// Looks up every template of `inputs` without a `metadata.uid` on the hub.
async fn look_up_templates(client: &kube::Client, inputs: &mut PlanInputs) {
    use kube::api::{Api, DynamicObject, GroupVersionKind};
    let mut resources: BTreeMap<(String, String), Result<kube::api::ApiResource, String>> =
        BTreeMap::new();
    for template in &inputs.templates {
        if template["metadata"]["uid"].as_str().is_some() {
            continue;
        }
        let api_version = template["apiVersion"].as_str().unwrap_or_default();
        let kind = template["kind"].as_str().unwrap_or_default();
        let namespace = template["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default");
        let name = template["metadata"]["name"].as_str().unwrap_or_default();
        let key = (api_version.to_string(), kind.to_string());
        if !resources.contains_key(&key) {
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            let gvk = GroupVersionKind::gvk(group, version, kind);
            let resolved = kube::discovery::pinned_kind(client, &gvk)
                .await
                .map(|(resource, _)| resource)
                .map_err(|e| format!("{api_version} {kind} is not served by the hub: {e}"));
            resources.insert(key.clone(), resolved);
        }
        let live = match &resources[&key] {
            Err(error) => LiveTemplate::Failed(error.clone()),
            Ok(resource) => {
                match Api::<DynamicObject>::namespaced_with(client.clone(), namespace, resource)
                    .get_opt(name)
                    .await
                {
                    Ok(Some(object)) => match object.metadata.uid {
                        Some(uid) => LiveTemplate::Exists(uid),
                        None => LiveTemplate::Missing,
                    },
                    Ok(None) => LiveTemplate::Missing,
                    Err(e) => LiveTemplate::Failed(e.to_string()),
                }
            }
        };
        inputs
            .live
            .insert(template_key(api_version, kind, namespace, name), live);
    }
    inputs.hub_asked = true;
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
    let connect = from_hub || options.hub.kubeconfig.is_some() || options.hub.context.is_some();
    if connect {
        let client = crate::process::connect(&options.hub).await?;
        if from_hub {
            let api: kube::Api<MemberCluster> = kube::Api::all(client.clone());
            inputs.clusters = api
                .list(&Default::default())
                .await
                .context("listing MemberClusters on the hub")?
                .items;
        }
        look_up_templates(&client, &mut inputs).await;
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
                && web
                    .policy
                    .as_ref()
                    .unwrap()
                    .contains("selected by resourceSelectors[1]: name web"),
            "{text}"
        );
        assert_eq!(web.uid, UidSource::File("u-web".into()));
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

    /// The issue's case: 6 replicas over east 2, north 1, west 1 leave north and west
    /// tied for the last replica. Without a UID plan must not pick one.
    const NO_UID: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec: {replicas: 6}
"#;

    fn tie_inputs(template: &str) -> (PlanInputs, Vec<ClusterView>) {
        let policy = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/samples/propagationpolicy.yaml"
        ))
        .unwrap();
        let inputs =
            parse_documents(&format!("{CLUSTERS}\n---\n{template}\n---\n{policy}"), "t").unwrap();
        let views = inputs
            .clusters
            .iter()
            .map(|c| cluster_view(c, true))
            .collect();
        (inputs, views)
    }

    fn now() -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000).unwrap()
    }

    #[test]
    fn a_template_without_a_uid_shows_every_outcome_of_the_tie() {
        let (inputs, views) = tie_inputs(NO_UID);
        let plans = plan(&inputs, &views, &[], now());
        let text = render(&plans, &views);
        let tie = plans[0].tie.as_ref().expect("a tie");
        assert_eq!(tie.tie.clusters, ["north", "west"]);
        assert_eq!((tie.tie.extra, tie.tie.base, tie.count), (1, 1, 2));
        assert!(
            text.contains("north 2, west 1 or north 1, west 2 (decided by the UID)"),
            "{text}"
        );
        assert!(text.contains("tie for the last replica; the hub breaks the tie by the template's UID once it is created"), "{text}");
        assert!(
            text.contains("uid: none yet (no metadata.uid in the file, and the hub was not asked"),
            "{text}"
        );
        let row = |cluster: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(cluster))
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert!(
            row("east").starts_with("east zone-a yes 3 selected: weight 2"),
            "{text}"
        );
        assert!(
            row("north").starts_with("north zone-c yes 1 or 2 weight tied with west"),
            "{text}"
        );
        assert!(
            row("west")
                .contains("1 or 2 weight tied with north: 1 or 2 replicas, decided by the UID"),
            "{text}"
        );

        // Not on the hub yet: said so.
        let (mut asked, views) = tie_inputs(NO_UID);
        asked.hub_asked = true;
        let text = render(&plan(&asked, &views, &[], now()), &views);
        assert!(
            text.contains("uid: none yet (not on the hub yet: it gets its UID when it is created)"),
            "{text}"
        );
        assert!(
            text.contains("north 2, west 1 or north 1, west 2"),
            "{text}"
        );
    }

    #[test]
    fn the_live_templates_uid_decides_the_tie_as_the_hub_does() {
        // Two UIDs that break the tie differently.
        let weights = [("east", 2), ("north", 1), ("west", 1)];
        let by_uid =
            |uid: &str| crate::hub::federation::placement::divide_by_weight(6, &weights, uid);
        let north_uid = (0..100)
            .map(|i| format!("uid-{i}"))
            .find(|u| by_uid(u)[1] == 2)
            .unwrap();
        let west_uid = (0..100)
            .map(|i| format!("uid-{i}"))
            .find(|u| by_uid(u)[2] == 2)
            .unwrap();
        for (uid, winner) in [(north_uid, "north"), (west_uid, "west")] {
            let (mut inputs, views) = tie_inputs(NO_UID);
            inputs.hub_asked = true;
            inputs.live.insert(
                template_key("apps/v1", "Deployment", "shop", "web"),
                LiveTemplate::Exists(uid.clone()),
            );
            let plans = plan(&inputs, &views, &[], now());
            let text = render(&plans, &views);
            assert_eq!(plans[0].uid, UidSource::Live(uid.clone()));
            let targets = &plans[0].result.as_ref().unwrap().targets;
            assert_eq!(replicas_of(targets, winner), 2, "{text}");
            assert!(
                text.contains(&format!("this template's UID gives it to {winner}")),
                "{text}"
            );
            assert!(
                text.contains(&format!("uid: {uid} (the live template on the hub)")),
                "{text}"
            );
            assert!(!text.contains(" or "), "decided: no alternatives\n{text}");
        }
    }

    #[test]
    fn tie_outcomes_are_every_choice_and_the_rest_is_counted() {
        let tie = Tie {
            clusters: vec!["a".into(), "b".into(), "c".into()],
            extra: 1,
            base: 2,
        };
        let outcomes = tie_outcomes(&tie, SHOWN_OUTCOMES);
        assert_eq!(
            outcomes.outcomes,
            [vec![3, 2, 2], vec![2, 3, 2], vec![2, 2, 3]]
        );
        assert_eq!(
            describe_outcomes(&outcomes),
            "a 3, b 2, c 2 or a 2, b 3, c 2 or a 2, b 2, c 3"
        );
        let two = tie_outcomes(
            &Tie {
                extra: 2,
                ..tie.clone()
            },
            SHOWN_OUTCOMES,
        );
        assert_eq!(two.outcomes, [vec![3, 3, 2], vec![3, 2, 3], vec![2, 3, 3]]);
        let many = Tie {
            clusters: (0..10).map(|i| format!("m{i}")).collect(),
            extra: 5,
            base: 0,
        };
        let outcomes = tie_outcomes(&many, SHOWN_OUTCOMES);
        assert_eq!((outcomes.outcomes.len(), outcomes.count), (6, 252));
        assert!(describe_outcomes(&outcomes).ends_with(" or 246 more"));
    }

    #[test]
    fn plan_names_the_selector_and_why_the_policy_won() {
        let policies = r#"
apiVersion: federation.example.com/v1alpha1
kind: ClusterPropagationPolicy
metadata: {name: every-deployment}
spec:
  resourceSelectors: [{apiVersion: apps/v1, kind: Deployment, name: "*", namespace: shop}]
---
apiVersion: federation.example.com/v1alpha1
kind: PropagationPolicy
metadata: {name: web, namespace: shop}
spec:
  resourceSelectors: [{apiVersion: apps/v1, kind: Deployment, name: "web-*"}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web-a, namespace: shop, uid: u1}
spec: {replicas: 1}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: api, namespace: shop, uid: u2}
spec: {replicas: 1}
"#;
        let inputs = parse_documents(&format!("{CLUSTERS}\n---\n{policies}"), "t").unwrap();
        let views: Vec<ClusterView> = inputs
            .clusters
            .iter()
            .map(|c| cluster_view(c, true))
            .collect();
        let text = render(&plan(&inputs, &views, &[], now()), &views);
        assert!(text.contains("policy: PropagationPolicy shop/web (priority 0), selected by resourceSelectors[0]: name pattern web-*"), "{text}");
        assert!(text.contains("precedence: over ClusterPropagationPolicy every-deployment (priority 0, a kind-wide selector): same priority, a name pattern beats a kind-wide selector"), "{text}");
        assert!(text.contains("policy: ClusterPropagationPolicy every-deployment (priority 0), selected by resourceSelectors[0]: name pattern * (every Deployment) in namespace shop"), "{text}");
    }
}
