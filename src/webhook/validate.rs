//! Validation rules, as pure functions. Every message names the object, the field and
//! the fix, so a user reading `kubectl apply` output knows what to change.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Toleration;

use super::tenants::TenantRules;
use crate::api::OverrideSpec;
use crate::api::member_cluster::MemberClusterSpec;
use crate::api::propagation_policy::{
    MAX_STATIC_WEIGHTS, MAX_WEIGHT, PropagationSpec, ReplicaSchedulingType,
};
use crate::api::{MyDatabase, MyDatabaseSpec};

/// Names an object in messages: `MyDatabase shop/orders`.
pub fn describe(kind: &str, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) if !ns.is_empty() => format!("{kind} {ns}/{name}"),
        _ => format!("{kind} {name}"),
    }
}

fn is_dns_label(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-')
}

fn is_version(value: &str) -> bool {
    let mut parts = value.split('.');
    let major_ok = parts
        .next()
        .is_some_and(|p| (1..=2).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()));
    let minor_ok = match parts.next() {
        None => true,
        Some(p) => (1..=2).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()),
    };
    major_ok && minor_ok && parts.next().is_none()
}

/// MyDatabase rules: replicas 1..10, version format, immutable storage, and the tenant's
/// limits when it has rules.
pub fn mydatabase(
    object: &str,
    spec: &MyDatabaseSpec,
    old: Option<&MyDatabase>,
    tenant: Option<(&str, &TenantRules)>,
) -> Vec<String> {
    let mut problems = vec![];
    if !(1..=10).contains(&spec.replicas) {
        problems.push(format!(
            "{object}: spec.replicas is {}; it must be between 1 and 10",
            spec.replicas
        ));
    }
    if !is_version(&spec.version) {
        problems.push(format!(
            "{object}: spec.version {:?} is not a PostgreSQL version; use a major version such as \"16\" or \"16.2\"",
            spec.version
        ));
    }
    if let Some(old) = old
        && old.spec.storage != spec.storage
    {
        problems.push(format!(
            "{object}: spec.storage is immutable after creation (was size {} class {:?} reclaimPolicy {:?}); create a new MyDatabase to change size, class or reclaim policy",
            old.spec.storage.size, old.spec.storage.storage_class_name, old.spec.storage.reclaim_policy
        ));
    }
    if let Some((tenant, rules)) = tenant {
        if let Some(max) = rules.max_replicas
            && spec.replicas > max
        {
            problems.push(format!(
                "{object}: spec.replicas {} exceeds tenant {tenant}'s rule maxReplicas {max}; lower spec.replicas or ask for a higher limit",
                spec.replicas
            ));
        }
        if !rules.allowed_versions.is_empty() && !rules.allowed_versions.contains(&spec.version) {
            problems.push(format!(
                "{object}: spec.version {:?} is not in tenant {tenant}'s rule allowedVersions {:?}; use one of those versions or ask for it to be allowed",
                spec.version, rules.allowed_versions
            ));
        }
    }
    problems
}

fn toleration_problems(object: &str, index: usize, toleration: &Toleration) -> Vec<String> {
    let field = format!("spec.placement.clusterTolerations[{index}]");
    let mut problems = vec![];
    let operator = toleration.operator.as_deref().unwrap_or("Equal");
    match operator {
        "Exists" => {
            if toleration.value.as_deref().is_some_and(|v| !v.is_empty()) {
                problems.push(format!(
                    "{object}: {field}.value must be empty when operator is Exists"
                ));
            }
        }
        "Equal" => {
            if toleration.key.as_deref().unwrap_or_default().is_empty() {
                problems.push(format!("{object}: {field}.key is required when operator is Equal (or use operator Exists to tolerate every taint)"));
            }
        }
        other => problems.push(format!(
            "{object}: {field}.operator {other:?} must be Equal or Exists"
        )),
    }
    if let Some(effect) = toleration.effect.as_deref()
        && !["", "NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect)
    {
        problems.push(format!(
            "{object}: {field}.effect {effect:?} must be NoSchedule, PreferNoSchedule or NoExecute"
        ));
    }
    if let Some(seconds) = toleration.toleration_seconds {
        if toleration.effect.as_deref() != Some("NoExecute") {
            problems.push(format!(
                "{object}: {field}.tolerationSeconds applies only to effect NoExecute; set effect NoExecute or remove tolerationSeconds"
            ));
        }
        if seconds < 0 {
            problems.push(format!(
                "{object}: {field}.tolerationSeconds is {seconds}; it must be 0 or more (or unset, to tolerate forever)"
            ));
        }
    }
    problems
}

/// Object names of these API groups are path segments (anything but `/` and `%`, and not
/// `.` or `..`); every other kind the hub federates (built-in workloads, ConfigMaps,
/// Secrets, Services, custom resources) has DNS-1123 subdomain names.
const PATH_SEGMENT_NAME_GROUPS: &[&str] = &["rbac.authorization.k8s.io"];

/// Characters a name pattern uses as wildcards.
fn is_wildcard(c: char) -> bool {
    c == '*' || c == '?'
}

/// `resourceSelectors[i].name`: an exact name or a glob pattern (`*`, `?`) that some
/// object of the kind could have; None when it could match.
fn selector_name_problem(
    object: &str,
    index: usize,
    api_version: &str,
    kind: &str,
    name: &str,
) -> Option<String> {
    let field = format!("spec.resourceSelectors[{index}].name");
    if name.is_empty() {
        return Some(format!(
            "{object}: {field} is empty and matches nothing; remove name to select every {kind}, or give a name or a pattern such as web-*"
        ));
    }
    let pattern = name.contains(is_wildcard);
    let wildcards = "in a pattern, * matches any run of characters and ? one character";
    let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
    if PATH_SEGMENT_NAME_GROUPS.contains(&group) {
        if name.contains(['/', '%']) || name == "." || name == ".." {
            return Some(format!(
                "{object}: {field} {name:?} can never match a {kind} name: names cannot contain '/' or '%' and are not '.' or '..'; remove those characters"
            ));
        }
        return None;
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bad: Vec<char> = name
        .chars()
        .filter(|&c| !allowed(c) && !is_wildcard(c))
        .collect();
    // The literal first and last characters of a name are a letter or a digit.
    let bad_edge = name
        .chars()
        .next()
        .is_some_and(|c| !is_wildcard(c) && allowed(c) && !alphanumeric(c))
        || name
            .chars()
            .last()
            .is_some_and(|c| !is_wildcard(c) && allowed(c) && !alphanumeric(c));
    let literal = name.chars().filter(|&c| c != '*').count();
    if bad.is_empty() && !bad_edge && literal <= 253 {
        return None;
    }
    let mut fixed: String = name
        .chars()
        .map(|c| {
            if allowed(c) || is_wildcard(c) {
                c
            } else if c.is_ascii_uppercase() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    while fixed.starts_with(['-', '.']) {
        fixed.remove(0);
    }
    while fixed.ends_with(['-', '.']) {
        fixed.pop();
    }
    let what = if pattern { "pattern" } else { "name" };
    let rule = format!(
        "{kind} names are at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or a digit ({wildcards})"
    );
    let syntax = if bad.iter().any(|c| "[]{}\\^$|+()".contains(*c)) {
        "; only * and ? are wildcards (no character classes, alternatives or regular expressions)"
    } else {
        ""
    };
    if !bad.is_empty() {
        let listed: String = {
            let mut seen: Vec<char> = Vec::new();
            for c in &bad {
                if !seen.contains(c) {
                    seen.push(*c);
                }
            }
            seen.iter()
                .map(|c| format!("{c:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Some(format!(
            "{object}: {field} {what} {name:?} can never match a {kind}: it has {listed}, and {rule}{syntax}; write {fixed:?}"
        ));
    }
    if bad_edge {
        return Some(format!(
            "{object}: {field} {what} {name:?} can never match a {kind}: {rule}; write {fixed:?}"
        ));
    }
    Some(format!(
        "{object}: {field} {what} is {literal} characters long and can never match a {kind}: {rule}; shorten it"
    ))
}

/// PropagationPolicy / ClusterPropagationPolicy rules. `known_clusters` (strict mode)
/// rejects cluster names that are not registered.
pub fn policy(
    object: &str,
    spec: &PropagationSpec,
    namespaced: bool,
    known_clusters: Option<&[String]>,
) -> Vec<String> {
    let mut problems = selector_problems(
        object,
        &spec.resource_selectors,
        "PropagationPolicy",
        namespaced,
    );
    for (i, toleration) in spec.placement.cluster_tolerations.iter().enumerate() {
        problems.extend(toleration_problems(object, i, toleration));
    }
    for (i, spread) in spec.placement.spread_constraints.iter().enumerate() {
        if spread.min_groups < 1 {
            problems.push(format!(
                "{object}: spec.placement.spreadConstraints[{i}].minGroups is {}; it must be at least 1",
                spread.min_groups
            ));
        }
        if spread.max_groups != 0 && spread.max_groups < spread.min_groups {
            problems.push(format!(
                "{object}: spec.placement.spreadConstraints[{i}].maxGroups {} is below minGroups {}; use 0 for no limit",
                spread.max_groups, spread.min_groups
            ));
        }
    }
    if let Some(scheduling) = &spec.placement.replica_scheduling {
        problems.extend(min_per_cluster_problems(object, scheduling));
        if scheduling.type_ == ReplicaSchedulingType::Duplicated
            && (scheduling.division_preference.is_some() || scheduling.weight_preference.is_some())
        {
            problems.push(format!(
                "{object}: spec.placement.replicaScheduling sets divisionPreference or weightPreference with type Duplicated; they apply only to type Divided: set type Divided or remove them"
            ));
        }
        if let Some(weights) = &scheduling.weight_preference {
            let list = "spec.placement.replicaScheduling.weightPreference.staticWeightList";
            if weights.static_weight_list.len() > MAX_STATIC_WEIGHTS {
                problems.push(format!(
                    "{object}: {list} has {} entries; at most {MAX_STATIC_WEIGHTS} are allowed: merge entries with the same weight (one targetCluster can list many clusterNames, zones or a labelSelector)",
                    weights.static_weight_list.len()
                ));
            }
            for (i, entry) in weights.static_weight_list.iter().enumerate() {
                if !(0..=MAX_WEIGHT).contains(&entry.weight) {
                    problems.push(format!(
                        "{object}: {list}[{i}].weight is {}; weights must be between 0 and {MAX_WEIGHT}: only their ratios matter, so scale them down (2 and 1 divide like 2000 and 1000)",
                        entry.weight
                    ));
                }
            }
            // No sum: "is any weight positive" is the question, and a sum of i64 weights
            // would overflow before the bound above is checked.
            if !weights.static_weight_list.is_empty()
                && !weights.static_weight_list.iter().any(|w| w.weight > 0)
            {
                problems.push(format!(
                    "{object}: {list} has no positive weight; give at least one cluster a weight above 0"
                ));
            }
        }
    }
    if let Some(rollout) = &spec.rollout {
        problems.extend(rollout_problems(object, rollout));
    }
    if let Some(known) = known_clusters {
        let mut named: Vec<(String, &String)> = vec![];
        if let Some(affinity) = &spec.placement.cluster_affinity {
            named.extend(
                affinity
                    .cluster_names
                    .iter()
                    .map(|n| ("spec.placement.clusterAffinity.clusterNames".to_string(), n)),
            );
            named.extend(
                affinity
                    .exclude
                    .iter()
                    .map(|n| ("spec.placement.clusterAffinity.exclude".to_string(), n)),
            );
        }
        if let Some(weights) = spec
            .placement
            .replica_scheduling
            .as_ref()
            .and_then(|s| s.weight_preference.as_ref())
        {
            for (i, entry) in weights.static_weight_list.iter().enumerate() {
                named.extend(entry.target_cluster.cluster_names.iter().map(|n| {
                    (
                        format!("spec.placement.replicaScheduling.weightPreference.staticWeightList[{i}].targetCluster.clusterNames"),
                        n,
                    )
                }));
            }
        }
        for (field, name) in named {
            if !known.contains(name) {
                problems.push(format!(
                    "{object}: {field} names cluster {name:?}, which is not a registered MemberCluster (strict mode); use one of the known clusters ({}) or join it first (bulkhead join)",
                    known.join(", ")
                ));
            }
        }
    }
    problems
}

/// `spec.rollout`: every wave names some clusters, every success condition parses, the
/// Prometheus and alert addresses are http:// URLs.
fn rollout_problems(object: &str, rollout: &crate::api::rollout::RolloutStrategy) -> Vec<String> {
    let mut problems = vec![];
    if rollout.waves.is_empty() {
        problems.push(format!(
            "{object}: spec.rollout.waves is empty; list at least one wave (clusters, zones or labelSelector): the clusters no wave names go last"
        ));
    }
    for (i, wave) in rollout.waves.iter().enumerate() {
        if wave.clusters.is_empty() && wave.zones.is_empty() && wave.label_selector.is_none() {
            problems.push(format!(
                "{object}: spec.rollout.waves[{i}] names no cluster; set clusters, zones or labelSelector"
            ));
        }
        if let Err(error) = wave.max_unavailable(1) {
            problems.push(format!(
                "{object}: spec.rollout.waves[{i}].maxUnavailable {error}; give a number of clusters (1 or more) or a percentage of the wave's clusters such as 50%"
            ));
        }
        if let Some(pause) = &wave.pause
            && pause.manual == pause.seconds.is_some()
        {
            problems.push(format!(
                "{object}: spec.rollout.waves[{i}].pause needs exactly one of seconds and manual: true"
            ));
        }
    }
    let http = |field: &str, url: &str| -> Option<String> {
        let host = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .unwrap_or_default();
        (host.is_empty() || host.starts_with('/')).then(|| {
            format!(
                "{object}: {field} is `{url}`; give an http:// or https:// address such as http://prometheus.monitoring:9090"
            )
        })
    };
    if let Some(analysis) = &rollout.analysis {
        problems.extend(http(
            "spec.rollout.analysis.prometheus",
            &analysis.prometheus,
        ));
        for (i, metric) in analysis.metrics.iter().enumerate() {
            if let Err(error) =
                crate::api::rollout::SuccessCondition::parse(&metric.success_condition)
            {
                problems.push(format!(
                    "{object}: spec.rollout.analysis.metrics[{i}].successCondition {error}"
                ));
            }
        }
        if analysis.failure_limit >= analysis.count {
            problems.push(format!(
                "{object}: spec.rollout.analysis.failureLimit {} is not below count {}: no wave could ever fail; lower failureLimit",
                analysis.failure_limit, analysis.count
            ));
        }
    }
    if let Some(url) = &rollout.alert_webhook {
        problems.extend(http("spec.rollout.alertWebhook", url));
    }
    problems
}

/// `replicaScheduling.minPerCluster`: not negative, and only for type Divided (under
/// Duplicated every cluster already runs spec.replicas, so a minimum means nothing).
fn min_per_cluster_problems(
    object: &str,
    scheduling: &crate::api::propagation_policy::ReplicaScheduling,
) -> Vec<String> {
    let field = "spec.placement.replicaScheduling.minPerCluster";
    let minimum = scheduling.min_per_cluster;
    if minimum < 0 {
        vec![format!(
            "{object}: {field} is {minimum}; it must be 0 (no minimum) or more"
        )]
    } else if minimum > 0 && scheduling.type_ == ReplicaSchedulingType::Duplicated {
        vec![format!(
            "{object}: {field} is {minimum} with type Duplicated, where every chosen cluster already runs spec.replicas; set type Divided to divide the replicas with a minimum per cluster, or remove minPerCluster"
        )]
    } else {
        vec![]
    }
}

/// The operators of an OverridePolicy / ClusterOverridePolicy as sent (before it is read
/// as its type, which would only say that some variant is unknown): every `operator`,
/// `component` and plaintext `op` must be one the kind knows.
pub fn override_operators(object: &str, raw: &serde_json::Value) -> Vec<String> {
    const OPERATORS: [&str; 3] = ["add", "remove", "replace"];
    let mut problems = vec![];
    let rules = raw["spec"]["overrideRules"].as_array();
    for (r, rule) in rules.into_iter().flatten().enumerate() {
        let base = format!("spec.overrideRules[{r}].overriders");
        let overriders = &rule["overriders"];
        for field in [
            "imageOverrider",
            "commandOverrider",
            "argsOverrider",
            "envOverrider",
            "labelsOverrider",
            "annotationsOverrider",
        ] {
            for (i, entry) in overriders[field]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                if let Some(operator) = entry["operator"].as_str()
                    && !OPERATORS.contains(&operator)
                {
                    problems.push(format!(
                        "{object}: {base}.{field}[{i}].operator {operator:?} is not an operator; use add, remove or replace"
                    ));
                }
                if field == "imageOverrider"
                    && let Some(component) = entry["component"].as_str()
                    && !["Registry", "Repository", "Tag"].contains(&component)
                {
                    problems.push(format!(
                        "{object}: {base}.{field}[{i}].component {component:?} is not an image component; use Registry, Repository or Tag"
                    ));
                }
            }
        }
        for (i, entry) in overriders["plaintext"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if let Some(op) = entry["op"].as_str()
                && !["add", "remove", "replace", "test", "move", "copy"].contains(&op)
            {
                problems.push(format!(
                    "{object}: {base}.plaintext[{i}].op {op:?} is not an RFC 6902 operation; use add, remove, replace, test, move or copy"
                ));
            }
        }
    }
    problems
}

/// The `resourceSelectors` of a policy kind (`PropagationPolicy` or `OverridePolicy`, and
/// their cluster-scoped twins): at least one; apiVersion and kind; a name (or name
/// pattern) or labels, not both; a namespace only in the cluster-scoped kind.
fn selector_problems(
    object: &str,
    selectors: &[crate::api::propagation_policy::ResourceSelector],
    kind: &str,
    namespaced: bool,
) -> Vec<String> {
    let mut problems = vec![];
    if selectors.is_empty() {
        problems.push(format!("{object}: spec.resourceSelectors is empty; add at least one selector (apiVersion and kind)"));
    }
    for (i, selector) in selectors.iter().enumerate() {
        if selector.api_version.is_empty() || selector.kind.is_empty() {
            problems.push(format!(
                "{object}: spec.resourceSelectors[{i}] needs apiVersion and kind; set both, for example apiVersion apps/v1 and kind Deployment"
            ));
        }
        if selector.name.is_some() && selector.label_selector.is_some() {
            problems.push(format!(
                "{object}: spec.resourceSelectors[{i}] sets both name and labelSelector; keep one"
            ));
        }
        if let Some(name) = &selector.name {
            problems.extend(selector_name_problem(
                object,
                i,
                &selector.api_version,
                &selector.kind,
                name,
            ));
        }
        if namespaced && selector.namespace.is_some() {
            problems.push(format!(
                "{object}: spec.resourceSelectors[{i}].namespace is only for Cluster{kind}; a namespaced {kind} selects in its own namespace"
            ));
        }
    }
    problems
}

/// A tenant's PropagationPolicy as it is stored: its clusterAffinity within the tenant's
/// `allowedClusters` and `allowedZones`, and `conflictResolution: Overwrite` only where
/// the tenant's rules say `allowOverwrite: true`. The mutating webhook narrows the
/// affinity; this checks the result, so a policy that reached storage past the mutation
/// (its configuration missing, another mutating webhook after it) is refused all the same.
pub fn policy_within_tenant_rules(
    object: &str,
    spec: &crate::api::PropagationSpec,
    tenant: &str,
    rules: &TenantRules,
) -> Vec<String> {
    let affinity = spec.placement.cluster_affinity.clone().unwrap_or_default();
    let mut problems = vec![];
    if spec.conflict_resolution == crate::api::propagation_policy::ConflictResolution::Overwrite
        && !rules.allow_overwrite
    {
        problems.push(format!(
            "{object}: spec.conflictResolution Overwrite would take over objects of the same name that already exist in members, which tenant {tenant} may not own; use Abort (the default), or have the platform team set allowOverwrite: true in the tenant's rules"
        ));
    }
    for (field, asked, allowed, rule) in [
        (
            "clusterNames",
            &affinity.cluster_names,
            &rules.allowed_clusters,
            "allowedClusters",
        ),
        (
            "zones",
            &affinity.zones,
            &rules.allowed_zones,
            "allowedZones",
        ),
    ] {
        if allowed.is_empty() {
            continue;
        }
        let outside: Vec<&String> = asked.iter().filter(|a| !allowed.contains(a)).collect();
        if asked.is_empty() || !outside.is_empty() {
            problems.push(format!(
                "{object}: spec.placement.clusterAffinity.{field} {} tenant {tenant}'s rule {rule} {allowed:?}; name only allowed ones (the mutating webhook narrows a policy to them: is its configuration installed?)",
                if asked.is_empty() {
                    "is empty, which would reach past".to_string()
                } else {
                    format!("{outside:?} are outside")
                }
            ));
        }
    }
    problems
}

/// Whether JSON pointer `pointer` is `field`, inside it, or one of its parents (a patch
/// there changes `field`).
fn touches(pointer: &str, field: &str) -> bool {
    let within = |outer: &str, inner: &str| {
        inner == outer
            || (inner.starts_with(outer) && inner.as_bytes().get(outer.len()) == Some(&b'/'))
    };
    pointer.is_empty() || within(pointer, field) || within(field, pointer)
}

/// What a tenant's OverridePolicy may not change in the tenant's MyDatabase copies: the
/// fields its rules limit (`allowedVersions`: `spec.version` and `spec.image`;
/// `maxReplicas`: `spec.replicas`). The template's own admission checked them, and an
/// override would take the copies past the rules where nobody checks again.
pub fn override_within_tenant_rules(
    object: &str,
    spec: &OverrideSpec,
    tenant: &str,
    rules: &TenantRules,
) -> Vec<String> {
    let mut limited: Vec<(&str, &str)> = vec![];
    if !rules.allowed_versions.is_empty() {
        limited.push(("/spec/version", "allowedVersions"));
        limited.push(("/spec/image", "allowedVersions"));
    }
    if rules.max_replicas.is_some() {
        limited.push(("/spec/replicas", "maxReplicas"));
    }
    let databases = spec
        .resource_selectors
        .iter()
        .any(|s| s.kind == "MyDatabase");
    if limited.is_empty() || !databases {
        return vec![];
    }
    let mut problems = vec![];
    for (r, rule) in spec.override_rules.iter().enumerate() {
        let base = format!("spec.overrideRules[{r}].overriders");
        for (p, patch) in rule.overriders.plaintext.iter().enumerate() {
            // `move` takes its value away from `from`; every op writes at `path`.
            let mut pointers = vec![("path", patch.path.as_str())];
            if patch.op == crate::api::override_policy::PatchOp::Move
                && let Some(from) = patch.from.as_deref()
            {
                pointers.push(("from", from));
            }
            for (field, pointer) in pointers {
                if let Some((limited_field, rule_name)) =
                    limited.iter().find(|(f, _)| touches(pointer, f))
                {
                    problems.push(format!(
                        "{object}: {base}.plaintext[{p}].{field} {pointer:?} would change {limited_field} of MyDatabase copies, which tenant {tenant}'s {rule_name} limits: change the MyDatabase itself (its admission checks the rule) or ask the platform team for a ClusterOverridePolicy"
                    ));
                }
            }
        }
        if !rule.overriders.image_overrider.is_empty() && !rules.allowed_versions.is_empty() {
            problems.push(format!(
                "{object}: {base}.imageOverrider would change the image of MyDatabase copies, which tenant {tenant}'s allowedVersions limits: select other kinds, or ask the platform team for a ClusterOverridePolicy"
            ));
        }
    }
    problems
}

/// OverridePolicy / ClusterOverridePolicy rules (docs/overrides.md): selectors as for a
/// propagation policy, at least one rule with at least one overrider, and every
/// overrider well-formed (the rules the hub applies again when it overrides a copy:
/// `hub/federation/overrides.rs`): JSON pointers, values where required, valid image
/// components, no change to a field the hub owns. `known_clusters` (strict mode) rejects
/// target cluster names that are not registered.
pub fn override_policy(
    object: &str,
    spec: &OverrideSpec,
    namespaced: bool,
    known_clusters: Option<&[String]>,
) -> Vec<String> {
    use crate::hub::federation::overrides::spec_problems;
    let kind = if namespaced {
        "OverridePolicy"
    } else {
        "ClusterOverridePolicy"
    };
    let mut problems = selector_problems(
        object,
        &spec.resource_selectors,
        "OverridePolicy",
        namespaced,
    );
    if spec.override_rules.is_empty() {
        problems.push(format!(
            "{object}: spec.overrideRules is empty; add at least one rule (targetCluster and overriders), or delete the {kind}"
        ));
    }
    // A selected kind the hub divides: its spec.replicas is each cluster's share.
    let divided = spec.resource_selectors.iter().any(|s| {
        crate::hub::federation::interpreter::Interpreters::built_in()
            .get(&s.api_version, &s.kind)
            .divisible()
    });
    for (field, problem) in spec_problems(spec, divided.then_some("/spec/replicas")) {
        problems.push(format!("{object}: {field}: {problem}"));
    }
    if let Some(known) = known_clusters {
        for (r, rule) in spec.override_rules.iter().enumerate() {
            let Some(target) = &rule.target_cluster else {
                continue;
            };
            for (list, names) in [
                ("clusterNames", &target.cluster_names),
                ("exclude", &target.exclude),
            ] {
                for name in names.iter().filter(|n| !known.contains(n)) {
                    problems.push(format!(
                        "{object}: spec.overrideRules[{r}].targetCluster.{list} names cluster {name:?}, which is not a registered MemberCluster (strict mode); use one of the known clusters ({}) or join it first (bulkhead join)",
                        known.join(", ")
                    ));
                }
            }
        }
    }
    problems
}

/// MemberCluster rules: a Secret reference and DNS-label zone/region.
pub fn member_cluster(object: &str, spec: &MemberClusterSpec) -> Vec<String> {
    let mut problems = vec![];
    if spec.secret_ref.name.is_empty() || spec.secret_ref.namespace.is_empty() {
        problems.push(format!(
            "{object}: spec.secretRef needs namespace and name of the Secret holding the member's kubeconfig (bulkhead join creates it)"
        ));
    }
    if !is_dns_label(&spec.zone) {
        problems.push(format!(
            "{object}: spec.zone {:?} must be a DNS label (lower-case letters, digits and '-'), for example zone-a",
            spec.zone
        ));
    }
    if let Some(region) = &spec.region
        && !is_dns_label(region)
    {
        problems.push(format!(
            "{object}: spec.region {region:?} must be a DNS label, for example east-1"
        ));
    }
    problems
}

/// In members: a StatefulSet must name its governing Service.
pub fn statefulset(object: &str, statefulset: &StatefulSet) -> Vec<String> {
    let service = statefulset
        .spec
        .as_ref()
        .and_then(|s| s.service_name.as_deref())
        .unwrap_or_default();
    if service.is_empty() {
        vec![format!(
            "{object}: spec.serviceName is empty; set it to the headless Service that gives the pods stable names"
        )]
    } else {
        vec![]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::propagation_policy::{
        ReplicaScheduling, ResourceSelector, StaticClusterWeight, WeightPreference,
    };

    fn spec(replicas: i32, version: &str) -> MyDatabaseSpec {
        MyDatabaseSpec {
            replicas,
            version: version.into(),
            ..Default::default()
        }
    }

    #[test]
    fn mydatabase_ranges_and_versions() {
        let object = "MyDatabase shop/orders";
        assert!(mydatabase(object, &spec(3, "16"), None, None).is_empty());
        assert!(mydatabase(object, &spec(3, "16.2"), None, None).is_empty());
        let zero = mydatabase(object, &spec(0, "16"), None, None);
        assert_eq!(
            zero,
            ["MyDatabase shop/orders: spec.replicas is 0; it must be between 1 and 10"]
        );
        assert_eq!(mydatabase(object, &spec(11, "16"), None, None).len(), 1);
        for bad in ["latest", "16.x", "", "123", "1.2.3"] {
            let problems = mydatabase(object, &spec(1, bad), None, None);
            assert!(problems[0].contains("spec.version"), "{bad}: {problems:?}");
        }
    }

    #[test]
    fn mydatabase_storage_is_immutable() {
        let old = MyDatabase::new("orders", spec(3, "16"));
        let mut changed = spec(3, "16");
        changed.storage.size = "2Gi".into();
        let problems = mydatabase("MyDatabase shop/orders", &changed, Some(&old), None);
        assert!(
            problems[0].contains("spec.storage is immutable")
                && problems[0].contains("create a new MyDatabase")
        );
        assert!(
            mydatabase("x", &spec(5, "16"), Some(&old), None).is_empty(),
            "other fields may change"
        );
    }

    /// An object stored before `reclaimPolicy` existed reads as Retain, the default, so an
    /// update that sends it (or leaves it out) is no change; switching it is one.
    #[test]
    fn a_stored_object_without_reclaim_policy_still_updates() {
        use crate::api::mydatabase::ReclaimPolicy;
        let old: MyDatabase = serde_json::from_value(serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "MyDatabase",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"replicas": 3, "version": "16", "storage": {"size": "1Gi"}}
        }))
        .unwrap();
        assert_eq!(old.spec.storage.reclaim_policy, ReclaimPolicy::Retain);
        let mut explicit = old.spec.clone();
        explicit.replicas = 4;
        explicit.storage.reclaim_policy = ReclaimPolicy::Retain;
        assert!(mydatabase("x", &explicit, Some(&old), None).is_empty());
        let mut switched = explicit.clone();
        switched.storage.reclaim_policy = ReclaimPolicy::Delete;
        let problems = mydatabase("MyDatabase shop/orders", &switched, Some(&old), None);
        assert!(
            problems.len() == 1 && problems[0].contains("reclaimPolicy Retain"),
            "{problems:?}"
        );
    }

    #[test]
    fn tenant_limits_name_the_tenant_and_the_rule() {
        let rules = TenantRules {
            max_replicas: Some(3),
            allowed_versions: vec!["15".into(), "16".into()],
            ..Default::default()
        };
        let problems = mydatabase(
            "MyDatabase a/b",
            &spec(5, "14"),
            None,
            Some(("team-a", &rules)),
        );
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("tenant team-a") && problems[0].contains("maxReplicas 3"));
        assert!(problems[1].contains("tenant team-a") && problems[1].contains("allowedVersions"));
    }

    #[test]
    fn a_tenant_policy_overwrites_only_where_its_rules_allow() {
        use crate::api::propagation_policy::ConflictResolution;
        let object = "PropagationPolicy shop/p";
        let mut spec = policy_spec();
        spec.conflict_resolution = ConflictResolution::Overwrite;
        let problems = policy_within_tenant_rules(object, &spec, "team-a", &TenantRules::default());
        assert!(
            problems.len() == 1
                && problems[0].contains("conflictResolution Overwrite")
                && problems[0].contains("allowOverwrite: true")
                && problems[0].contains("tenant team-a"),
            "{problems:?}"
        );
        let allowing = TenantRules {
            allow_overwrite: true,
            ..Default::default()
        };
        assert!(policy_within_tenant_rules(object, &spec, "team-a", &allowing).is_empty());
        spec.conflict_resolution = ConflictResolution::Abort;
        assert!(
            policy_within_tenant_rules(object, &spec, "team-a", &TenantRules::default()).is_empty()
        );
    }

    fn policy_spec() -> PropagationSpec {
        PropagationSpec {
            resource_selectors: vec![ResourceSelector {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_rollout_names_its_waves_and_parses_its_conditions() {
        use crate::api::rollout::{
            AnalysisMetric, RolloutAnalysis, RolloutStrategy, RolloutWave, WavePause,
        };
        let object = "PropagationPolicy shop/p";
        let mut spec = policy_spec();
        spec.rollout = Some(RolloutStrategy {
            waves: vec![RolloutWave {
                clusters: vec!["east".into()],
                ..Default::default()
            }],
            analysis: Some(RolloutAnalysis {
                prometheus: "http://prometheus:9090".into(),
                metrics: vec![AnalysisMetric {
                    name: "errors".into(),
                    query: "up".into(),
                    success_condition: "result < 0.05".into(),
                }],
                interval_seconds: 10,
                count: 3,
                failure_limit: 0,
            }),
            ..Default::default()
        });
        assert!(policy(object, &spec, true, None).is_empty());
        let mut https = spec.clone();
        let rollout = https.rollout.as_mut().unwrap();
        rollout.analysis.as_mut().unwrap().prometheus = "https://prometheus:9091".into();
        rollout.alert_webhook = Some("https://alerts.example/hook".into());
        assert!(policy(object, &https, true, None).is_empty());
        let rollout = spec.rollout.as_mut().unwrap();
        rollout.waves.push(RolloutWave {
            pause: Some(WavePause {
                seconds: Some(5),
                manual: true,
            }),
            max_unavailable: Some(
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("all".into()),
            ),
            ..Default::default()
        });
        let analysis = rollout.analysis.as_mut().unwrap();
        analysis.prometheus = "prometheus:9090".into();
        analysis.metrics[0].success_condition = "errors < 1".into();
        analysis.failure_limit = 3;
        let problems = policy(object, &spec, true, None).join("\n");
        for expected in [
            "spec.rollout.waves[1] names no cluster",
            "spec.rollout.waves[1].pause needs exactly one",
            "spec.rollout.waves[1].maxUnavailable `all` is neither a number nor a percentage",
            "spec.rollout.analysis.prometheus is `prometheus:9090`; give an http:// or https:// address",
            "spec.rollout.analysis.metrics[0].successCondition `errors < 1`",
            "failureLimit 3 is not below count 3",
        ] {
            assert!(problems.contains(expected), "{expected} in {problems}");
        }
    }

    #[test]
    fn policy_needs_selectors_and_sane_weights() {
        let object = "PropagationPolicy shop/p";
        assert!(policy(object, &policy_spec(), true, None).is_empty());
        let mut empty = policy_spec();
        empty.resource_selectors.clear();
        assert!(policy(object, &empty, true, None)[0].contains("spec.resourceSelectors is empty"));

        let mut weighted = policy_spec();
        weighted.placement.replica_scheduling = Some(ReplicaScheduling {
            type_: ReplicaSchedulingType::Divided,
            division_preference: None,
            weight_preference: Some(WeightPreference {
                static_weight_list: vec![
                    StaticClusterWeight {
                        weight: -1,
                        ..Default::default()
                    },
                    StaticClusterWeight {
                        weight: 0,
                        ..Default::default()
                    },
                ],
                dynamic_weight: None,
            }),
            min_per_cluster: 0,
        });
        let problems = policy(object, &weighted, true, None);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("staticWeightList[0].weight is -1")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("no positive weight")),
            "{problems:?}"
        );

        let mut duplicated = weighted.clone();
        duplicated
            .placement
            .replica_scheduling
            .as_mut()
            .unwrap()
            .type_ = ReplicaSchedulingType::Duplicated;
        assert!(
            policy(object, &duplicated, true, None)
                .iter()
                .any(|p| p.contains("apply only to type Divided"))
        );
    }

    fn weighted(weights: &[i64]) -> PropagationSpec {
        let mut spec = policy_spec();
        spec.placement.replica_scheduling = Some(ReplicaScheduling {
            type_: ReplicaSchedulingType::Divided,
            division_preference: None,
            weight_preference: Some(WeightPreference {
                static_weight_list: weights
                    .iter()
                    .map(|&weight| StaticClusterWeight {
                        weight,
                        ..Default::default()
                    })
                    .collect(),
                dynamic_weight: None,
            }),
            min_per_cluster: 0,
        });
        spec
    }

    /// Issue 16: the sum of i64 weights panicked in debug builds and wrapped in release
    /// (two huge weights "summed" to a negative number). Now huge weights are refused,
    /// naming the field and the fix, and nothing sums them.
    #[test]
    fn huge_weights_are_refused_without_overflow() {
        let object = "PropagationPolicy shop/p";
        for weights in [
            vec![i64::MAX, i64::MAX],
            vec![i64::MAX, 1],
            vec![i64::MIN, i64::MAX],
        ] {
            let problems = policy(object, &weighted(&weights), true, None);
            assert!(
                problems.iter().any(|p| p.starts_with(object)
                    && p.contains("staticWeightList[0].weight is")
                    && p.contains("between 0 and 10000")
                    && p.contains("scale them down")),
                "{weights:?}: {problems:?}"
            );
        }
        assert!(policy(object, &weighted(&[MAX_WEIGHT, 1]), true, None).is_empty());
        let too_big = policy(object, &weighted(&[MAX_WEIGHT + 1]), true, None);
        assert_eq!(too_big.len(), 1, "{too_big:?}");
    }

    #[test]
    fn a_weight_list_has_at_most_100_entries() {
        let object = "PropagationPolicy shop/p";
        assert!(policy(object, &weighted(&[1; MAX_STATIC_WEIGHTS]), true, None).is_empty());
        let problems = policy(object, &weighted(&[1; MAX_STATIC_WEIGHTS + 1]), true, None);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("staticWeightList has 101 entries")
                && problems[0].contains("at most 100")
                && problems[0].contains("merge entries"),
            "{problems:?}"
        );
    }

    #[test]
    fn tolerations_must_be_well_formed() {
        let mut spec = policy_spec();
        spec.placement.cluster_tolerations = vec![
            Toleration {
                operator: Some("Sometimes".into()),
                ..Default::default()
            },
            Toleration {
                key: Some("k".into()),
                effect: Some("NoSchedule".into()),
                toleration_seconds: Some(10),
                ..Default::default()
            },
            Toleration {
                operator: Some("Exists".into()),
                value: Some("v".into()),
                ..Default::default()
            },
        ];
        let problems = policy("p", &spec, true, None);
        assert!(
            problems.iter().any(|p| p.contains("[0].operator")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("[1].tolerationSeconds applies only to effect NoExecute")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("[2].value must be empty")),
            "{problems:?}"
        );
    }

    #[test]
    fn strict_mode_rejects_unknown_clusters() {
        let mut spec = policy_spec();
        spec.placement.cluster_affinity = Some(crate::api::propagation_policy::ClusterAffinity {
            cluster_names: vec!["east".into(), "mars".into()],
            ..Default::default()
        });
        let known = vec!["east".to_string(), "west".to_string()];
        let problems = policy("p", &spec, true, Some(&known));
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("\"mars\"") && problems[0].contains("east, west"));
        assert!(
            policy("p", &spec, true, None).is_empty(),
            "not strict: allowed"
        );
    }

    #[test]
    fn namespaced_policies_cannot_reach_other_namespaces() {
        let mut spec = policy_spec();
        spec.resource_selectors[0].namespace = Some("other".into());
        assert!(policy("p", &spec, true, None)[0].contains("only for ClusterPropagationPolicy"));
        assert!(policy("p", &spec, false, None).is_empty());
    }

    #[test]
    fn override_policies_need_selectors_rules_and_known_clusters() {
        use crate::api::override_policy::{OverrideRule, Overriders, PlaintextOverrider};
        let object = "OverridePolicy shop/p";
        let mut spec = OverrideSpec {
            resource_selectors: policy_spec().resource_selectors,
            override_rules: vec![],
        };
        let problems = override_policy(object, &spec, true, None);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("spec.overrideRules is empty"));
        spec.override_rules.push(OverrideRule {
            target_cluster: Some(crate::api::propagation_policy::ClusterAffinity {
                cluster_names: vec!["mars".into()],
                ..Default::default()
            }),
            overriders: Overriders {
                plaintext: vec![PlaintextOverrider {
                    op: crate::api::override_policy::PatchOp::Add,
                    path: "/spec/paused".into(),
                    value: Some(serde_json::json!(true)),
                    from: None,
                }],
                ..Default::default()
            },
        });
        assert!(override_policy(object, &spec, true, None).is_empty());
        let known = vec!["east".to_string()];
        let strict = override_policy(object, &spec, true, Some(&known));
        assert!(
            strict.len() == 1
                && strict[0].contains("targetCluster.clusterNames names cluster \"mars\""),
            "{strict:?}"
        );
        spec.resource_selectors[0].namespace = Some("other".into());
        assert!(
            override_policy(object, &spec, true, None)[0]
                .contains("only for ClusterOverridePolicy")
        );
        assert!(override_policy(object, &spec, false, None).is_empty());
        spec.resource_selectors.clear();
        assert!(
            override_policy(object, &spec, false, None)[0]
                .contains("spec.resourceSelectors is empty")
        );
    }

    #[test]
    fn member_cluster_rules() {
        let mut spec: MemberClusterSpec = serde_json::from_value(serde_json::json!({
            "secretRef": {"namespace": "bulkhead-system", "name": "member-east"}, "zone": "zone-a", "region": "east-1"
        }))
        .unwrap();
        assert!(member_cluster("MemberCluster east", &spec).is_empty());
        spec.zone = "Zone_A".into();
        spec.secret_ref.name.clear();
        let problems = member_cluster("MemberCluster east", &spec);
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn statefulsets_need_a_service_name() {
        let sts = StatefulSet::default();
        assert!(statefulset("StatefulSet a/b", &sts)[0].contains("spec.serviceName is empty"));
    }

    #[test]
    fn min_per_cluster_is_not_negative_and_only_for_divided() {
        let with_minimum = |type_: &str, minimum: i64| -> PropagationSpec {
            serde_json::from_value(serde_json::json!({
                "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}],
                "placement": {"replicaScheduling": {"type": type_, "minPerCluster": minimum}}
            }))
            .unwrap()
        };
        assert!(policy("p", &with_minimum("Divided", 2), true, None).is_empty());
        assert!(policy("p", &with_minimum("Duplicated", 0), true, None).is_empty());
        let negative = policy("p", &with_minimum("Divided", -1), true, None);
        assert_eq!(negative.len(), 1, "{negative:?}");
        assert!(
            negative[0].contains("spec.placement.replicaScheduling.minPerCluster is -1"),
            "{negative:?}"
        );
        let duplicated = policy("p", &with_minimum("Duplicated", 2), true, None);
        assert_eq!(duplicated.len(), 1, "{duplicated:?}");
        assert!(
            duplicated[0].contains("minPerCluster is 2 with type Duplicated")
                && duplicated[0].contains("set type Divided"),
            "{duplicated:?}"
        );
    }

    fn named(api_version: &str, kind: &str, name: &str) -> PropagationSpec {
        let mut spec = policy_spec();
        spec.resource_selectors[0].api_version = api_version.into();
        spec.resource_selectors[0].kind = kind.into();
        spec.resource_selectors[0].name = Some(name.into());
        spec
    }

    #[test]
    fn selector_names_and_patterns_must_be_able_to_match() {
        let object = "ClusterPropagationPolicy all";
        for good in [
            "web",
            "web-*",
            "*",
            "**",
            "web-?",
            "*.example.com",
            "a",
            "?",
            "db-*-primary",
        ] {
            assert!(
                policy(object, &named("apps/v1", "Deployment", good), false, None).is_empty(),
                "{good}"
            );
        }
        let problems = policy(
            object,
            &named("apps/v1", "Deployment", "Web_*"),
            false,
            None,
        );
        assert_eq!(
            problems,
            [
                "ClusterPropagationPolicy all: spec.resourceSelectors[0].name pattern \"Web_*\" can never match a Deployment: it has 'W', '_', and Deployment names are at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or a digit (in a pattern, * matches any run of characters and ? one character); write \"web-*\""
            ]
        );
        let problems = policy(
            object,
            &named("apps/v1", "Deployment", "web-[ab]"),
            false,
            None,
        );
        assert!(
            problems[0].contains("only * and ? are wildcards")
                && problems[0].contains("write \"web--ab\""),
            "{problems:?}"
        );
        let problems = policy(
            object,
            &named("apps/v1", "Deployment", "-web*"),
            false,
            None,
        );
        assert!(
            problems[0].contains("starting and ending with a letter or a digit")
                && problems[0].contains("write \"web*\""),
            "{problems:?}"
        );
        let problems = policy(object, &named("apps/v1", "Deployment", ""), false, None);
        assert!(
            problems[0].contains(
                "name is empty and matches nothing; remove name to select every Deployment"
            ),
            "{problems:?}"
        );
        let long = "a".repeat(254);
        assert!(
            policy(object, &named("apps/v1", "Deployment", &long), false, None)[0]
                .contains("254 characters long")
        );
        assert!(
            policy(
                object,
                &named("apps/v1", "Deployment", &format!("{}*", "a".repeat(253))),
                false,
                None
            )
            .is_empty()
        );
        // RBAC names are path segments: a colon or capitals are fine, a slash never.
        assert!(
            policy(
                object,
                &named("rbac.authorization.k8s.io/v1", "Role", "system:Reader-*"),
                false,
                None
            )
            .is_empty()
        );
        assert!(
            policy(
                object,
                &named("rbac.authorization.k8s.io/v1", "Role", "a/b*"),
                false,
                None
            )[0]
            .contains("cannot contain '/'")
        );
    }
}
