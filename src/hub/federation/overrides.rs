//! Overrides (docs/overrides.md), pure: the per-cluster changes that OverridePolicies and
//! ClusterOverridePolicies make to a template's member copy.
//!
//! Given the copy the hub would apply (built by [`member_copy`](super::copies::member_copy)),
//! the target cluster's view and the override policies that select the template,
//! [`apply`] returns the overridden copy and the ordered list of what applied, or an
//! error naming the policy, the rule, the overrider and the path.
//!
//! **Order.** Every policy that selects the template applies: ClusterOverridePolicies
//! first, then OverridePolicies (the namespace's own policy comes last, so it has the last
//! word), each kind by name. Within a policy, its rules in order (a rule applies when its
//! `targetCluster` matches the cluster). Within a rule, the overriders in a fixed order
//! whatever the order written: image, command, args, env, labels, annotations, plaintext
//! (so a JSON patch sees every other change); within an overrider list, its entries in
//! order.
//!
//! **All or nothing.** The overrides of one template for one cluster apply as a whole: if
//! any overrider fails (a JSON patch path that does not exist, a failed `test`, an
//! overrider that would change a field the hub owns), the copy is returned untouched with
//! the error, and the reconcile applies nothing to that cluster for that template (its
//! existing copy is left as it is).
//!
//! **What the hub owns.** Overrides never change the copy's identity (apiVersion, kind,
//! name, namespace), Bulkhead's own labels and annotations (`federation.example.com/...`,
//! including the applied-hash, which is computed after the overrides) or the replica
//! field the hub writes per cluster for divided kinds ([`WorkloadPaths::replicas`]).
//! Overriders that name such a field are refused; any other change that reaches one (a
//! JSON patch replacing all of `/metadata/labels`) fails the template for that cluster.
//!
//! Container overriders (image, command, args, env) act on the pod specs named by
//! [`WorkloadPaths::pod_specs`]: containers and initContainers. A kind without a pod spec
//! there (a ConfigMap) and a template without the named container are left unchanged by
//! them; that is not an error (one ClusterOverridePolicy may select many kinds).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::api::override_policy::{
    EnvOverrider, ImageComponent, ImageOverrider, ListOverrider, MapOverrider, Operator,
    OverrideSpec, PatchOp, PlaintextOverrider,
};
use crate::api::propagation_policy::ClusterAffinity;
use crate::api::{ClusterOverridePolicy, OverridePolicy};
use crate::hub::federation::matching::{PolicyScope, TemplateRef, selector_strength};
use crate::hub::federation::placement::{ClusterView, label_selector_matches};

/// The prefix of every label and annotation key the hub owns on a copy.
pub const HUB_KEY_PREFIX: &str = "federation.example.com/";

/// An override policy, as a candidate for a template.
#[derive(Clone, Copy, Debug)]
pub struct OverridePolicyRef<'a> {
    /// Namespaced (OverridePolicy) or Cluster (ClusterOverridePolicy).
    pub scope: PolicyScope,
    /// The OverridePolicy's namespace (None for a ClusterOverridePolicy).
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    pub spec: &'a OverrideSpec,
}

impl OverridePolicyRef<'_> {
    /// `OverridePolicy/<name>` or `ClusterOverridePolicy/<name>`: how the binding lists it
    /// (an OverridePolicy is always in the template's namespace).
    pub fn reference(&self) -> String {
        format!("{}/{}", self.kind(), self.name)
    }

    pub fn kind(&self) -> &'static str {
        match self.scope {
            PolicyScope::Namespaced => "OverridePolicy",
            PolicyScope::Cluster => "ClusterOverridePolicy",
        }
    }

    /// The application order: ClusterOverridePolicies, then OverridePolicies, by name.
    fn order_key(&self) -> (bool, &str) {
        (self.scope == PolicyScope::Namespaced, self.name)
    }
}

/// Every override policy the hub holds, as candidates.
pub fn candidates<'a>(
    namespaced: &'a [Arc<OverridePolicy>],
    cluster: &'a [Arc<ClusterOverridePolicy>],
) -> Vec<OverridePolicyRef<'a>> {
    let mut candidates: Vec<OverridePolicyRef<'a>> = namespaced
        .iter()
        .map(|p| OverridePolicyRef {
            scope: PolicyScope::Namespaced,
            namespace: p.metadata.namespace.as_deref(),
            name: p.metadata.name.as_deref().unwrap_or_default(),
            spec: &p.spec,
        })
        .collect();
    candidates.extend(cluster.iter().map(|p| OverridePolicyRef {
        scope: PolicyScope::Cluster,
        namespace: None,
        name: p.metadata.name.as_deref().unwrap_or_default(),
        spec: &p.spec.policy,
    }));
    candidates
}

/// The override policies that select `template`, in the order they apply. Selection is
/// a propagation policy's (the same selectors, the same namespace rules); unlike
/// propagation, every selecting policy applies, not only one.
pub fn selecting<'a>(
    template: &TemplateRef,
    candidates: &[OverridePolicyRef<'a>],
) -> Vec<OverridePolicyRef<'a>> {
    let mut selected: Vec<OverridePolicyRef<'a>> = candidates
        .iter()
        .filter(|policy| {
            policy.spec.resource_selectors.iter().any(|selector| {
                selector_strength(selector, template, policy.scope, policy.namespace).is_some()
            })
        })
        .copied()
        .collect();
    selected.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    selected
}

fn api_group(api_version: &str) -> &str {
    api_version
        .split_once('/')
        .map(|(group, _)| group)
        .unwrap_or("")
}

/// Where a kind keeps what overrides act on and what the hub owns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadPaths {
    /// JSON pointers to the kind's pod specs (objects with `containers` and
    /// `initContainers`), for the container overriders.
    pub pod_specs: Vec<String>,
    /// JSON pointer of the replica field the hub writes per cluster (divided kinds); None
    /// for a kind whose copies all carry the template's own value.
    pub replicas: Option<String>,
}

impl WorkloadPaths {
    /// The built-in kinds' paths: the pod specs of [`default_pod_specs`], and
    /// `/spec/replicas` when the hub divides the kind.
    pub fn builtin(api_version: &str, kind: &str) -> Self {
        let interpretation =
            crate::hub::federation::interpreter::Interpreters::built_in().get(api_version, kind);
        WorkloadPaths::of(api_version, kind, &interpretation)
    }

    /// The paths as the kind's interpretation names them: its pod template (else the
    /// built-in pod specs) and its replica field.
    pub fn of(
        api_version: &str,
        kind: &str,
        interpretation: &crate::hub::federation::interpreter::Interpretation,
    ) -> Self {
        let pod_specs = match interpretation
            .pod_template
            .as_ref()
            .and_then(|p| p.pointer())
        {
            Some(template) if default_pod_specs(api_version, kind).is_empty() => {
                vec![format!("{template}/spec")]
            }
            _ => default_pod_specs(api_version, kind),
        };
        WorkloadPaths {
            pod_specs,
            replicas: interpretation.replicas.as_ref().and_then(|p| p.pointer()),
        }
    }
}

/// The pod specs of the kinds Kubernetes defines: a Pod's `/spec`; the pod template of
/// Deployment, StatefulSet, DaemonSet, ReplicaSet, Job and ReplicationController
/// (`/spec/template/spec`); a CronJob's job's (`/spec/jobTemplate/spec/template/spec`).
/// Other kinds have none unless an interpreter names one.
pub fn default_pod_specs(api_version: &str, kind: &str) -> Vec<String> {
    let path = match (api_group(api_version), kind) {
        ("", "Pod") => "/spec",
        ("apps", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet")
        | ("batch", "Job")
        | ("", "ReplicationController") => "/spec/template/spec",
        ("batch", "CronJob") => "/spec/jobTemplate/spec/template/spec",
        _ => return vec![],
    };
    vec![path.to_string()]
}

/// Whether a rule's `targetCluster` matches `cluster`: every non-empty field must match,
/// `exclude` removes, and no target at all matches every cluster.
pub fn targets(target: Option<&ClusterAffinity>, cluster: &ClusterView) -> bool {
    let Some(target) = target else {
        return true;
    };
    (target.cluster_names.is_empty() || target.cluster_names.contains(&cluster.name))
        && !target.exclude.contains(&cluster.name)
        && target
            .label_selector
            .as_ref()
            .is_none_or(|selector| label_selector_matches(selector, &cluster.labels))
        && (target.zones.is_empty() || target.zones.contains(&cluster.zone))
        && (target.regions.is_empty()
            || cluster
                .region
                .as_ref()
                .is_some_and(|region| target.regions.contains(region)))
}

/// One overrider that applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// `ClusterOverridePolicy/<name>` or `OverridePolicy/<name>`.
    pub policy: String,
    /// Index in `spec.overrideRules`.
    pub rule: usize,
    /// The overrider, e.g. `imageOverrider[0]`.
    pub overrider: String,
    /// What it changed, in words (`web: nginx:1.27 -> mirror.example/nginx:1.27`);
    /// empty when it found nothing to change.
    pub changes: Vec<String>,
}

/// Why the overrides of a template could not be applied for a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverrideError {
    /// `ClusterOverridePolicy/<name>` or `OverridePolicy/<namespace>/<name>`.
    pub policy: String,
    /// Index in `spec.overrideRules`.
    pub rule: usize,
    /// The overrider, e.g. `plaintext[1]`.
    pub overrider: String,
    /// The JSON pointer in the copy it failed at (empty when none applies).
    pub path: String,
    pub message: String,
}

impl fmt::Display for OverrideError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} spec.overrideRules[{}].overriders.{}",
            self.policy, self.rule, self.overrider
        )?;
        if !self.path.is_empty() {
            write!(f, " at {}", self.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for OverrideError {}

/// Applies, in order, every rule of `policies` that targets `cluster` to `copy`. On
/// success `copy` holds the overridden copy and the result lists what applied, in order;
/// on error `copy` is left exactly as it was. `policies` must be in application order
/// ([`selecting`] returns them so). The applied-hash annotation is not recomputed here
/// (see [`TemplateOverrides::copy_for`]).
pub fn apply(
    copy: &mut Value,
    cluster: &ClusterView,
    policies: &[OverridePolicyRef<'_>],
    paths: &WorkloadPaths,
) -> Result<Vec<Applied>, OverrideError> {
    let targeted = |policy: &&OverridePolicyRef<'_>| {
        policy
            .spec
            .override_rules
            .iter()
            .any(|rule| targets(rule.target_cluster.as_ref(), cluster))
    };
    if !policies.iter().any(|p| targeted(&p)) {
        return Ok(vec![]);
    }
    let mut working = copy.clone();
    let owned = hub_owned(&working, paths);
    let mut applied = vec![];
    for policy in policies {
        let reference = policy.reference();
        let described = match policy.namespace {
            Some(namespace) => format!("{}/{namespace}/{}", policy.kind(), policy.name),
            None => reference.clone(),
        };
        for (index, rule) in policy.spec.override_rules.iter().enumerate() {
            if !targets(rule.target_cluster.as_ref(), cluster) {
                continue;
            }
            let fail = |overrider: String, path: String, message: String| OverrideError {
                policy: described.clone(),
                rule: index,
                overrider,
                path,
                message,
            };
            for (overrider, step) in steps(&rule.overriders) {
                let result = step.run(&mut working, paths);
                let changes =
                    result.map_err(|(path, message)| fail(overrider.clone(), path, message))?;
                if let Some((path, why)) = changed_owned(&owned, &working, paths) {
                    return Err(fail(
                        overrider,
                        path,
                        format!("{why}; overrides may not change it"),
                    ));
                }
                applied.push(Applied {
                    policy: reference.clone(),
                    rule: index,
                    overrider,
                    changes,
                });
            }
        }
    }
    *copy = working;
    Ok(applied)
}

/// The policies of an [`apply`] result, each once, in order.
pub fn applied_policies(applied: &[Applied]) -> Vec<String> {
    let mut policies: Vec<String> = vec![];
    for entry in applied {
        if !policies.contains(&entry.policy) {
            policies.push(entry.policy.clone());
        }
    }
    policies
}

/// One overrider of a rule, ready to run.
enum Step<'a> {
    Image(&'a ImageOverrider),
    List(&'static str, &'a ListOverrider),
    Env(&'a EnvOverrider),
    Map(&'static str, &'a MapOverrider),
    Plaintext(&'a PlaintextOverrider),
}

/// A rule's overriders in the fixed order, named as in the policy.
fn steps(overriders: &crate::api::override_policy::Overriders) -> Vec<(String, Step<'_>)> {
    let mut steps = vec![];
    let named = |field: &str, i: usize| format!("{field}[{i}]");
    for (i, o) in overriders.image_overrider.iter().enumerate() {
        steps.push((named("imageOverrider", i), Step::Image(o)));
    }
    for (i, o) in overriders.command_overrider.iter().enumerate() {
        steps.push((named("commandOverrider", i), Step::List("command", o)));
    }
    for (i, o) in overriders.args_overrider.iter().enumerate() {
        steps.push((named("argsOverrider", i), Step::List("args", o)));
    }
    for (i, o) in overriders.env_overrider.iter().enumerate() {
        steps.push((named("envOverrider", i), Step::Env(o)));
    }
    for (i, o) in overriders.labels_overrider.iter().enumerate() {
        steps.push((named("labelsOverrider", i), Step::Map("labels", o)));
    }
    for (i, o) in overriders.annotations_overrider.iter().enumerate() {
        steps.push((
            named("annotationsOverrider", i),
            Step::Map("annotations", o),
        ));
    }
    for (i, o) in overriders.plaintext.iter().enumerate() {
        steps.push((named("plaintext", i), Step::Plaintext(o)));
    }
    steps
}

/// (path, message) of a failed step.
type StepError = (String, String);

impl Step<'_> {
    fn run(&self, copy: &mut Value, paths: &WorkloadPaths) -> Result<Vec<String>, StepError> {
        match self {
            Step::Image(o) => {
                image_problem(o).map_or(Ok(()), |m| Err((String::new(), m)))?;
                Ok(each_container(copy, paths, |path, container| {
                    let name = container["name"].as_str().unwrap_or_default().to_string();
                    if !o.container_names.is_empty() && !o.container_names.contains(&name) {
                        return None;
                    }
                    let image = container.get("image")?.as_str()?.to_string();
                    let changed = override_image(&image, o);
                    (changed != image).then(|| {
                        container["image"] = Value::String(changed.clone());
                        format!("{path}/image: {image} -> {changed}")
                    })
                }))
            }
            Step::List(field, o) => {
                list_problem(field, o).map_or(Ok(()), |m| Err((String::new(), m)))?;
                Ok(each_container(copy, paths, |path, container| {
                    if container["name"].as_str() != Some(o.container_name.as_str()) {
                        return None;
                    }
                    let before = container.get(*field).cloned();
                    let mut list: Vec<Value> = before
                        .as_ref()
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    match o.operator {
                        Operator::Add => list.extend(o.value.iter().cloned().map(Value::String)),
                        _ => list.retain(|v| {
                            !v.as_str().is_some_and(|s| o.value.iter().any(|x| x == s))
                        }),
                    }
                    let object = container.as_object_mut()?;
                    if list.is_empty() {
                        object.remove(*field);
                    } else {
                        object.insert(field.to_string(), Value::Array(list));
                    }
                    (object.get(*field) != before.as_ref())
                        .then(|| format!("{path}/{field} {} {:?}", o.operator.as_str(), o.value))
                }))
            }
            Step::Env(o) => {
                env_problem(o).map_or(Ok(()), |m| Err((String::new(), m)))?;
                Ok(each_container(copy, paths, |path, container| {
                    if container["name"].as_str() != Some(o.container_name.as_str()) {
                        return None;
                    }
                    let before = container.get("env").cloned();
                    let mut env: Vec<Value> = before
                        .as_ref()
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    for var in &o.value {
                        let position = env
                            .iter()
                            .position(|e| e["name"].as_str() == Some(var.name.as_str()));
                        let value = serde_json::to_value(var).unwrap_or_default();
                        match (o.operator, position) {
                            (Operator::Remove, Some(at)) => {
                                env.remove(at);
                            }
                            (Operator::Add | Operator::Replace, Some(at)) => env[at] = value,
                            (Operator::Add, None) => env.push(value),
                            (_, None) => {}
                        }
                    }
                    let object = container.as_object_mut()?;
                    if env.is_empty() {
                        object.remove("env");
                    } else {
                        object.insert("env".into(), Value::Array(env));
                    }
                    let names: Vec<&str> = o.value.iter().map(|v| v.name.as_str()).collect();
                    (object.get("env") != before.as_ref())
                        .then(|| format!("{path}/env {} {}", o.operator.as_str(), names.join(", ")))
                }))
            }
            Step::Map(field, o) => {
                map_problem(field, o).map_or(Ok(()), |(key, m)| {
                    Err((format!("/metadata/{field}/{}", escape(&key)), m))
                })?;
                let Some(metadata) = copy.get_mut("metadata").and_then(Value::as_object_mut) else {
                    return Err(("/metadata".into(), "the copy has no metadata".into()));
                };
                let map = metadata
                    .entry(field.to_string())
                    .or_insert_with(|| Value::Object(Map::new()));
                let Some(map) = map.as_object_mut() else {
                    return Err((
                        format!("/metadata/{field}"),
                        format!("metadata.{field} is not a map"),
                    ));
                };
                let mut changes = vec![];
                for (key, value) in &o.value {
                    let present = map.contains_key(key);
                    let wanted = Value::String(value.clone());
                    let change = match o.operator {
                        Operator::Add => {
                            map.insert(key.clone(), wanted.clone()).as_ref() != Some(&wanted)
                        }
                        Operator::Replace if present => {
                            map.insert(key.clone(), wanted.clone()).as_ref() != Some(&wanted)
                        }
                        Operator::Replace => false,
                        Operator::Remove => map.remove(key).is_some(),
                    };
                    if change {
                        changes.push(format!(
                            "/metadata/{field}/{} {}",
                            escape(key),
                            o.operator.as_str()
                        ));
                    }
                }
                if map.is_empty() {
                    metadata.remove(*field);
                }
                Ok(changes)
            }
            Step::Plaintext(o) => {
                plaintext_problem(o, paths.replicas.as_deref())
                    .map_or(Ok(()), |m| Err((o.path.clone(), m)))?;
                let operation: json_patch::PatchOperation =
                    serde_json::from_value(patch_operation(o))
                        .map_err(|e| (o.path.clone(), format!("not an RFC 6902 operation: {e}")))?;
                let before = copy.pointer(&o.path).cloned();
                json_patch::patch(copy, std::slice::from_ref(&operation)).map_err(|e| {
                    let why = match e.kind {
                        json_patch::PatchErrorKind::TestFailed => format!(
                            "the copy holds {} there, not {}",
                            before.map_or("nothing".to_string(), |v| short(&v)),
                            o.value.as_ref().map_or("null".to_string(), short)
                        ),
                        json_patch::PatchErrorKind::InvalidPointer => {
                            "the path does not exist in the copy (add can create only the last member of an existing object or array)".to_string()
                        }
                        json_patch::PatchErrorKind::InvalidFromPointer => format!(
                            "the from path {} does not exist in the copy",
                            o.from.as_deref().unwrap_or_default()
                        ),
                        kind => kind.to_string(),
                    };
                    (o.path.clone(), format!("{} failed: {why}", o.op.as_str()))
                })?;
                Ok(if o.op == PatchOp::Test {
                    vec![]
                } else {
                    vec![format!("{} {}", o.op.as_str(), o.path)]
                })
            }
        }
    }
}

/// A value in an error message, cut short.
fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.len() > 80 {
        format!("{}...", &text[..text.floor_char_boundary(77)])
    } else {
        text
    }
}

/// The RFC 6902 operation of a plaintext overrider, as JSON.
fn patch_operation(o: &PlaintextOverrider) -> Value {
    let mut operation = json!({"op": o.op.as_str(), "path": o.path});
    if let Some(value) = &o.value {
        operation["value"] = value.clone();
    }
    if let Some(from) = &o.from {
        operation["from"] = Value::String(from.clone());
    }
    operation
}

/// Calls `change` on every container and init container of every pod spec; collects
/// what it reports changed. `change` gets the container's JSON pointer.
fn each_container(
    copy: &mut Value,
    paths: &WorkloadPaths,
    mut change: impl FnMut(&str, &mut Value) -> Option<String>,
) -> Vec<String> {
    let mut changes = vec![];
    for pod_spec in &paths.pod_specs {
        let Some(spec) = copy.pointer_mut(pod_spec) else {
            continue;
        };
        for list in ["initContainers", "containers"] {
            let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) else {
                continue;
            };
            for (i, container) in containers.iter_mut().enumerate() {
                if let Some(what) = change(&format!("{pod_spec}/{list}/{i}"), container) {
                    changes.push(what);
                }
            }
        }
    }
    changes
}

/// Escapes a key as a JSON pointer token.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The tokens of a JSON pointer, or None when it is not one.
pub fn pointer_tokens(pointer: &str) -> Option<Vec<String>> {
    if pointer.is_empty() {
        return Some(vec![]);
    }
    let rest = pointer.strip_prefix('/')?;
    rest.split('/')
        .map(|token| {
            let mut out = String::new();
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => return None,
                    }
                } else {
                    out.push(c);
                }
            }
            Some(out)
        })
        .collect()
}

/// The fields of a copy the hub owns, with their values: identity, Bulkhead's labels
/// and annotations, and the per-cluster replica field.
fn hub_owned(copy: &Value, paths: &WorkloadPaths) -> Vec<(String, Value)> {
    let mut owned: Vec<(String, Value)> = [
        "/apiVersion",
        "/kind",
        "/metadata/name",
        "/metadata/namespace",
    ]
    .iter()
    .map(|p| {
        (
            p.to_string(),
            copy.pointer(p).cloned().unwrap_or(Value::Null),
        )
    })
    .collect();
    for field in ["labels", "annotations"] {
        let keys: BTreeMap<String, Value> = copy["metadata"][field]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.starts_with(HUB_KEY_PREFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        owned.push((format!("/metadata/{field}"), json!(keys)));
    }
    if let Some(replicas) = &paths.replicas {
        owned.push((
            replicas.clone(),
            copy.pointer(replicas).cloned().unwrap_or(Value::Null),
        ));
    }
    // Present when the hub set it (a StatefulSet copy keeps its claims): an override
    // that removes or changes it would let the member delete the claims, and the data.
    owned.push((
        CLAIM_RETENTION.to_string(),
        copy.pointer(CLAIM_RETENTION)
            .cloned()
            .unwrap_or(Value::Null),
    ));
    owned
}

/// Where a StatefulSet copy says what happens to its claims; the hub sets Retain for
/// both cases and overrides may not change it.
const CLAIM_RETENTION: &str = "/spec/persistentVolumeClaimRetentionPolicy";

/// The first hub-owned field `copy` no longer holds as it did, and what it is.
fn changed_owned(
    owned: &[(String, Value)],
    copy: &Value,
    paths: &WorkloadPaths,
) -> Option<(String, String)> {
    let now = hub_owned(copy, paths);
    owned.iter().zip(&now).find(|(a, b)| a != b).map(|((path, _), _)| {
        let why = if path.starts_with("/metadata/labels") || path.starts_with("/metadata/annotations") {
            format!("it changes {path}/{}*: Bulkhead's own keys, which name the template the copy belongs to and the hash of what the hub applied", escape(HUB_KEY_PREFIX))
        } else if path == CLAIM_RETENTION {
            format!("it changes {path}, which the hub sets to Retain so that the member never deletes the copy's volume claims (the data) when it is scaled down or deleted")
        } else if Some(path) == paths.replicas.as_ref() {
            format!("it changes {path}, the cluster's share of the replicas, which the hub writes for each cluster")
        } else {
            format!("it changes {path}, which identifies the copy")
        };
        (path.clone(), why)
    })
}

// ---- Image references -------------------------------------------------------------

/// An image reference `[registry/]repository[:tag][@digest]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageReference {
    /// The first path component when it looks like a host (has a `.` or a `:`, or is
    /// `localhost`); None for a Docker Hub image such as `nginx`.
    pub registry: Option<String>,
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:...`, without the `@`.
    pub digest: Option<String>,
}

impl ImageReference {
    pub fn parse(image: &str) -> Self {
        let (rest, digest) = match image.split_once('@') {
            Some((rest, digest)) => (rest, Some(digest.to_string())),
            None => (image, None),
        };
        let (name, tag) = match rest.rfind(':') {
            Some(at) if !rest[at..].contains('/') => {
                (&rest[..at], Some(rest[at + 1..].to_string()))
            }
            _ => (rest, None),
        };
        let (registry, repository) = match name.split_once('/') {
            Some((first, path)) if is_registry_host(first) => (Some(first.to_string()), path),
            _ => (None, name),
        };
        ImageReference {
            registry,
            repository: repository.to_string(),
            tag,
            digest,
        }
    }
}

impl fmt::Display for ImageReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(registry) = &self.registry {
            write!(f, "{registry}/")?;
        }
        write!(f, "{}", self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

fn is_registry_host(component: &str) -> bool {
    component.contains('.') || component.contains(':') || component == "localhost"
}

/// `image` with `o` applied (a valid overrider; see [`image_problem`]).
pub fn override_image(image: &str, o: &ImageOverrider) -> String {
    let mut reference = ImageReference::parse(image);
    let value = o.value.clone();
    match (o.component, o.operator) {
        (ImageComponent::Registry, Operator::Add) => {
            if reference.registry.is_none() {
                reference.registry = Some(value);
            }
        }
        (ImageComponent::Registry, Operator::Replace) => reference.registry = Some(value),
        (ImageComponent::Registry, Operator::Remove) => reference.registry = None,
        (ImageComponent::Repository, Operator::Replace) => reference.repository = value,
        (ImageComponent::Repository, _) => {}
        (ImageComponent::Tag, Operator::Add) => {
            if reference.tag.is_none() && reference.digest.is_none() {
                set_tag_or_digest(&mut reference, value);
            }
        }
        (ImageComponent::Tag, Operator::Replace) => set_tag_or_digest(&mut reference, value),
        (ImageComponent::Tag, Operator::Remove) => {
            reference.tag = None;
            reference.digest = None;
        }
    }
    reference.to_string()
}

fn set_tag_or_digest(reference: &mut ImageReference, value: String) {
    if is_digest(&value) {
        reference.tag = None;
        reference.digest = Some(value);
    } else {
        reference.tag = Some(value);
        reference.digest = None;
    }
}

fn is_digest(value: &str) -> bool {
    value.split_once(':').is_some_and(|(algorithm, hex)| {
        !algorithm.is_empty()
            && algorithm
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && hex.len() >= 32
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

fn is_host(host: &str) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    };
    let labels_ok = !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    labels_ok && port_ok && is_registry_host(host)
}

fn is_path_component(component: &str) -> bool {
    // [a-z0-9]+ ((. | _ | __ | -+) [a-z0-9]+)*
    let bytes = component.as_bytes();
    if bytes.is_empty()
        || !bytes[0].is_ascii_alphanumeric()
        || !bytes[bytes.len() - 1].is_ascii_alphanumeric()
    {
        return false;
    }
    bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
        && !component.contains("..")
        && !component.contains("___")
}

fn is_repository(value: &str) -> bool {
    !value.is_empty() && value.len() <= 255 && value.split('/').all(is_path_component)
}

fn is_tag(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 128
        && (bytes[0].is_ascii_alphanumeric() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

// ---- Rules shared with the webhook ------------------------------------------------
// Each returns the problem with the fix, or None. The hub checks them again when it
// applies (a policy stored before the webhook ran, or with the webhook off).

/// An image overrider's problem.
pub fn image_problem(o: &ImageOverrider) -> Option<String> {
    let component = o.component.as_str();
    let operator = o.operator.as_str();
    if o.component == ImageComponent::Repository && o.operator != Operator::Replace {
        return Some(format!(
            "operator {operator} is not supported for component Repository (an image always has one); use replace"
        ));
    }
    if o.operator == Operator::Remove {
        return (!o.value.is_empty()).then(|| {
            format!("value must be empty for operator remove (it removes the {component}); drop the value")
        });
    }
    if o.value.is_empty() {
        return Some(format!(
            "value is required for operator {operator}: give the new {}",
            component.to_lowercase()
        ));
    }
    if let Some(name) = o.container_names.iter().find(|n| n.is_empty()) {
        return Some(format!(
            "containerNames has an empty name {name:?}; name a container or leave the list empty for every container"
        ));
    }
    let value = &o.value;
    match o.component {
        ImageComponent::Registry => {
            let (host, path) = value.split_once('/').unwrap_or((value, ""));
            (!is_host(host) || (!path.is_empty() && !is_repository(path))).then(|| format!(
                "{value:?} is not a registry: use a host name with a dot or a port, optionally followed by a path, for example mirror.example.com, localhost:5000 or harbor.example.com/dockerhub"
            ))
        }
        ImageComponent::Repository => (!is_repository(value)).then(|| format!(
            "{value:?} is not a repository: lower-case letters and digits, with '.', '_' or '-' inside path components separated by '/', for example library/nginx (the registry and the tag are other components)"
        )),
        ImageComponent::Tag => (!is_tag(value) && !is_digest(value)).then(|| format!(
            "{value:?} is neither a tag (letters, digits, '_', '.' and '-', at most 128, not starting with '.' or '-', for example 1.27) nor a digest (sha256: and 64 hex digits)"
        )),
    }
}

/// A command or args overrider's problem (`field` is `command` or `args`).
pub fn list_problem(field: &str, o: &ListOverrider) -> Option<String> {
    if o.container_name.is_empty() {
        return Some("containerName is required: name the container to change".into());
    }
    if o.operator == Operator::Replace {
        return Some(format!(
            "operator replace is not supported for {field}; use add (appends) or remove, or a plaintext patch to replace the whole list"
        ));
    }
    o.value.is_empty().then(|| {
        format!(
            "value is empty; list the {field} to {}",
            o.operator.as_str()
        )
    })
}

/// An env overrider's problem.
pub fn env_problem(o: &EnvOverrider) -> Option<String> {
    if o.container_name.is_empty() {
        return Some("containerName is required: name the container to change".into());
    }
    if o.value.is_empty() {
        return Some(format!(
            "value is empty; list the variables to {}",
            o.operator.as_str()
        ));
    }
    if let Some(i) = o.value.iter().position(|v| v.name.is_empty()) {
        return Some(format!(
            "value[{i}].name is empty; every variable needs a name"
        ));
    }
    None
}

fn is_qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    });
    name_ok && prefix_ok
}

fn is_label_value(value: &str) -> bool {
    value.is_empty()
        || (value.len() <= 63
            && value.as_bytes()[0].is_ascii_alphanumeric()
            && value.as_bytes()[value.len() - 1].is_ascii_alphanumeric()
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')))
}

/// A labels or annotations overrider's problem (`field` is `labels` or `annotations`),
/// with the key it is about.
pub fn map_problem(field: &str, o: &MapOverrider) -> Option<(String, String)> {
    if o.value.is_empty() {
        return Some((
            String::new(),
            format!(
                "value is empty; give the {field} to {}",
                o.operator.as_str()
            ),
        ));
    }
    for (key, value) in &o.value {
        if key.starts_with(HUB_KEY_PREFIX) {
            return Some((
                key.clone(),
                format!(
                    "{key} is one of Bulkhead's own {field} ({HUB_KEY_PREFIX}...), which the hub writes on every copy; overrides may not change it: use another key"
                ),
            ));
        }
        if !is_qualified_name(key) {
            return Some((
                key.clone(),
                format!(
                    "{key:?} is not a valid {field} key: an optional DNS prefix and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
                ),
            ));
        }
        if field == "labels" && o.operator != Operator::Remove && !is_label_value(value) {
            return Some((
                key.clone(),
                format!(
                    "{value:?} is not a valid label value for {key}: at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
                ),
            ));
        }
    }
    None
}

/// Why a JSON pointer is a field the hub owns, when it is one. `replicas` is the
/// per-cluster replica field of the template's kind, if it is divided.
pub fn hub_owned_path(pointer: &str, replicas: Option<&str>) -> Option<String> {
    let tokens = pointer_tokens(pointer)?;
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    if let Some(replicas) = replicas
        && let Some(field) = pointer_tokens(replicas)
        && tokens.len() >= field.len()
        && tokens.iter().zip(&field).all(|(a, b)| *a == b.as_str())
    {
        return Some(format!(
            "{replicas} of a divided kind is each cluster's share of the replicas, written by the hub: change the template's replicas or the propagation policy's weights instead"
        ));
    }
    match tokens.as_slice() {
        [] => Some("the path is the whole copy; patch a field inside it".into()),
        ["apiVersion" | "kind"] | ["metadata"] | ["metadata", "name" | "namespace", ..] => Some(
            "the path identifies the copy (apiVersion, kind, metadata, name, namespace); patch another field".into(),
        ),
        ["metadata", "labels" | "annotations"] => Some(format!(
            "the path is the whole {} map, which holds Bulkhead's own keys: patch single keys (/{}/<key>) or use {}Overrider",
            tokens[1], pointer.trim_start_matches('/'), tokens[1]
        )),
        ["spec", "persistentVolumeClaimRetentionPolicy", ..] => Some(
            "the hub keeps a StatefulSet copy's volume claims (whenDeleted and whenScaled: Retain), so that scaling down or deleting a copy never deletes its data; the field may not be overridden".into(),
        ),
        ["metadata", "labels" | "annotations", key, ..] if key.starts_with(HUB_KEY_PREFIX) => Some(format!(
            "{key} is one of Bulkhead's own {} ({HUB_KEY_PREFIX}...), which the hub writes on every copy; use another key",
            tokens[1]
        )),
        _ => None,
    }
}

/// A plaintext overrider's problem. `replicas`: see [`hub_owned_path`].
pub fn plaintext_problem(o: &PlaintextOverrider, replicas: Option<&str>) -> Option<String> {
    if pointer_tokens(&o.path).is_none() {
        return Some(format!(
            "path {:?} is not a JSON pointer: it must start with '/' (e.g. /spec/template/spec/containers/0/image), with '~1' for '/' and '~0' for '~' inside a key",
            o.path
        ));
    }
    let op = o.op.as_str();
    if matches!(o.op, PatchOp::Add | PatchOp::Replace | PatchOp::Test) && o.value.is_none() {
        return Some(format!("value is required for op {op}"));
    }
    if matches!(o.op, PatchOp::Move | PatchOp::Copy) {
        match o.from.as_deref() {
            None => {
                return Some(format!(
                    "from is required for op {op}: the JSON pointer to {op} from"
                ));
            }
            Some(from) if pointer_tokens(from).is_none() => {
                return Some(format!(
                    "from {from:?} is not a JSON pointer: it must start with '/'"
                ));
            }
            Some(from) if o.op == PatchOp::Move => {
                if let Some(why) = hub_owned_path(from, replicas) {
                    return Some(format!(
                        "op move removes from {from}, a field the hub owns: {why}"
                    ));
                }
            }
            Some(_) => {}
        }
    }
    if o.op != PatchOp::Test
        && let Some(why) = hub_owned_path(&o.path, replicas)
    {
        return Some(format!(
            "op {op} on {}, a field the hub owns: {why}",
            o.path
        ));
    }
    None
}

/// Every problem of an override policy's spec, as (field, problem). `replicas` is the
/// per-cluster replica field of a selected kind, when one is divided (a plaintext patch
/// there is refused).
pub fn spec_problems(spec: &OverrideSpec, replicas: Option<&str>) -> Vec<(String, String)> {
    let mut problems = vec![];
    for (r, rule) in spec.override_rules.iter().enumerate() {
        let base = format!("spec.overrideRules[{r}].overriders");
        let o = &rule.overriders;
        let count = o.image_overrider.len()
            + o.command_overrider.len()
            + o.args_overrider.len()
            + o.env_overrider.len()
            + o.labels_overrider.len()
            + o.annotations_overrider.len()
            + o.plaintext.len();
        if count == 0 {
            problems.push((base.clone(), "is empty; give at least one overrider (imageOverrider, commandOverrider, argsOverrider, envOverrider, labelsOverrider, annotationsOverrider or plaintext)".to_string()));
        }
        for (i, x) in o.image_overrider.iter().enumerate() {
            if let Some(p) = image_problem(x) {
                problems.push((format!("{base}.imageOverrider[{i}]"), p));
            }
        }
        for (field, list) in [
            ("command", &o.command_overrider),
            ("args", &o.args_overrider),
        ] {
            for (i, x) in list.iter().enumerate() {
                if let Some(p) = list_problem(field, x) {
                    problems.push((format!("{base}.{field}Overrider[{i}]"), p));
                }
            }
        }
        for (i, x) in o.env_overrider.iter().enumerate() {
            if let Some(p) = env_problem(x) {
                problems.push((format!("{base}.envOverrider[{i}]"), p));
            }
        }
        for (field, list) in [
            ("labels", &o.labels_overrider),
            ("annotations", &o.annotations_overrider),
        ] {
            for (i, x) in list.iter().enumerate() {
                if let Some((_, p)) = map_problem(field, x) {
                    problems.push((format!("{base}.{field}Overrider[{i}]"), p));
                }
            }
        }
        for (i, x) in o.plaintext.iter().enumerate() {
            if let Some(p) = plaintext_problem(x, replicas) {
                problems.push((format!("{base}.plaintext[{i}]"), p));
            }
        }
    }
    problems
}

// ---- Per template, per cluster ----------------------------------------------------

/// The override policies of one template, ready to apply per cluster (what the reconcile
/// hands to the propagation plan).
#[derive(Clone, Debug, Default)]
pub struct TemplateOverrides<'a> {
    /// In application order.
    pub policies: Vec<OverridePolicyRef<'a>>,
    /// Every member's view.
    pub clusters: &'a [ClusterView],
    pub paths: WorkloadPaths,
}

impl<'a> TemplateOverrides<'a> {
    /// The policies of `candidates` that select `template`.
    pub fn new(
        template: &TemplateRef,
        candidates: &[OverridePolicyRef<'a>],
        clusters: &'a [ClusterView],
        paths: WorkloadPaths,
    ) -> Self {
        TemplateOverrides {
            policies: selecting(template, candidates),
            clusters,
            paths,
        }
    }

    /// `copy` (a member copy with its applied-hash) overridden for `cluster`, with its
    /// applied-hash recomputed over the overridden body, and the policies that applied,
    /// in order. Unchanged when no rule targets the cluster.
    pub fn copy_for(
        &self,
        cluster: &str,
        mut copy: Value,
    ) -> Result<(Value, Vec<String>), OverrideError> {
        if self.policies.is_empty() {
            return Ok((copy, vec![]));
        }
        let fallback;
        let view = match self.clusters.iter().find(|c| c.name == cluster) {
            Some(view) => view,
            None => {
                fallback = ClusterView {
                    name: cluster.to_string(),
                    ..Default::default()
                };
                &fallback
            }
        };
        let applied = apply(&mut copy, view, &self.policies, &self.paths)?;
        if !applied.is_empty() {
            crate::hub::federation::copies::restamp(&mut copy);
        }
        Ok((copy, applied_policies(&applied)))
    }
}

/// The override policies among `candidates` that select the hub template `template` of
/// `resource`, ready to apply per cluster.
pub fn for_template<'a>(
    template: &kube::api::DynamicObject,
    resource: &kube::api::ApiResource,
    candidates: &[OverridePolicyRef<'a>],
    clusters: &'a [ClusterView],
    paths: WorkloadPaths,
) -> TemplateOverrides<'a> {
    TemplateOverrides::new(
        &TemplateRef::of(resource, template),
        candidates,
        clusters,
        paths,
    )
}

/// The Events of a change of the binding's rows: (warning, reason, note) for each
/// cluster whose overrides started failing or failing differently, or recovered.
pub fn override_events(
    previous: &[crate::api::resource_binding::ClusterPlacementStatus],
    rows: &[crate::api::resource_binding::ClusterPlacementStatus],
) -> Vec<(bool, &'static str, String)> {
    let mut events = vec![];
    for row in rows {
        let before = previous.iter().find(|p| p.name == row.name);
        let was_failing = before.is_some_and(|p| p.override_failed);
        if row.override_failed {
            let same =
                was_failing && before.and_then(|p| p.message.as_ref()) == row.message.as_ref();
            if !same {
                events.push((
                    true,
                    "OverrideFailed",
                    format!("{}: {}", row.name, row.message.clone().unwrap_or_default()),
                ));
            }
        } else if was_failing {
            let applied = if row.overrides.is_empty() {
                "no override applies there any more".to_string()
            } else {
                format!("overrides applied: {}", row.overrides.join(", "))
            };
            events.push((
                false,
                "OverrideApplied",
                format!("{}: the overrides apply again ({applied})", row.name),
            ));
        }
    }
    events
}

#[cfg(test)]
mod tests;
