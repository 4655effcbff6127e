//! How the hub reads each kind of template (issue #17, docs/interpreters.md): one
//! [`Interpretation`] per kind says whether its replicas are divided and at which path,
//! whether it is stateful, where its pod template is, which status fields are summed on
//! the hub, when a copy is healthy, and which fields the member owns. The built-in kinds
//! are declared in the same form as a user's `ResourceInterpreter` ([`built_in_specs`]);
//! a kind nobody describes is Duplicated, stateless and healthy once applied.
//!
//! The rest of federation sees kinds only through this module. The hub's caches keep
//! copies and templates *normalized*: the replica count at `spec.replicas` and the summed
//! status fields under their Deployment names (`status.readyReplicas`, ...), whatever the
//! kind calls them ([`Interpretation::normalized_status`]); the template status is written
//! back at the kind's own paths ([`Interpretation::template_status`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value};

pub use crate::hub::federation::field_path::{FieldPath, Segment};

use crate::hub::federation::dependencies::ReferenceRule;

use crate::api::resource_interpreter::{
    HealthCondition, HealthRule, HealthType, InterpreterStatusFields, InterpreterTarget,
    ResourceInterpreter, ResourceInterpreterSpec,
};

/// Extra behaviour of a built-in kind that a path cannot say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quirks {
    /// Service: `clusterIP: None` is the headless choice, not an address, and is sent.
    pub keeps_headless: bool,
    /// StatefulSet: every copy retains its volume claims when deleted or scaled down.
    pub retains_claims: bool,
    /// MyDatabase: the copy's whole status is kept, and the template's status has a row
    /// per cluster (`status.clusters`), sums and a phase.
    pub database_status: bool,
    /// Deployment, StatefulSet: a count of 0 is left out of the status, so a missing
    /// `updatedReplicas` is 0 (none of the current spec yet), not "does not say".
    pub omits_zero_counts: bool,
}

/// Who said how a kind is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    BuiltIn,
    /// A `ResourceInterpreter` of this name.
    Resource(String),
    /// Nobody: Duplicated, stateless, healthy once applied.
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::BuiltIn => f.write_str("built-in"),
            Source::Resource(name) => write!(f, "ResourceInterpreter/{name}"),
            Source::Default => f.write_str("default (Duplicated)"),
        }
    }
}

/// A status field the hub sums, by its normalized (Deployment) name.
const SUMMED: [&str; 4] = [
    "replicas",
    "readyReplicas",
    "availableReplicas",
    "updatedReplicas",
];

/// How the hub reads one kind.
#[derive(Clone, Debug, PartialEq)]
pub struct Interpretation {
    pub group: String,
    pub kind: String,
    pub source: Source,
    /// Set: divisible, the copy's share goes here.
    pub replicas: Option<FieldPath>,
    pub stateful: bool,
    pub pod_template: Option<FieldPath>,
    /// By normalized name: `replicas`, `readyReplicas`, `availableReplicas`,
    /// `updatedReplicas`, `observedGeneration`.
    status: Vec<(&'static str, FieldPath)>,
    pub health: HealthRule,
    pub member_owned: Vec<FieldPath>,
    /// Reference fields (`spec.dependencies`): what follows the kind with `propagateDeps`.
    pub references: Vec<ReferenceRule>,
    pub quirks: Quirks,
}

/// Why an interpreter is refused: the field and the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterpreterError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for InterpreterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn refuse(field: impl Into<String>, message: impl Into<String>) -> InterpreterError {
    InterpreterError {
        field: field.into(),
        message: message.into(),
    }
}

/// The group of an apiVersion (`""` for the core group).
pub fn group_of(api_version: &str) -> &str {
    api_version
        .split_once('/')
        .map(|(group, _)| group)
        .unwrap_or("")
}

fn path(field: &str, text: &str, roots: &[&str]) -> Result<FieldPath, InterpreterError> {
    let parsed = FieldPath::parse(text).map_err(|m| refuse(field, m))?;
    if !roots.contains(&parsed.root()) {
        return Err(refuse(
            field,
            format!(
                "`{text}` must be under {}",
                roots
                    .iter()
                    .map(|r| format!("`.{r}`"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        ));
    }
    Ok(parsed)
}

impl Interpretation {
    /// Reads a spec, refusing what cannot work with the field and the fix.
    pub fn from_spec(
        spec: &ResourceInterpreterSpec,
        source: Source,
    ) -> Result<Interpretation, InterpreterError> {
        let target = &spec.target;
        let group = group_of(&target.api_version);
        if target.kind.is_empty() || !target.kind.starts_with(|c: char| c.is_ascii_uppercase()) {
            return Err(refuse(
                "spec.target.kind",
                format!(
                    "`{}` is not a kind: give the kind as the API serves it, e.g. `Widget`",
                    target.kind
                ),
            ));
        }
        if target.api_version.is_empty() || target.api_version.split('/').count() > 2 {
            return Err(refuse(
                "spec.target.apiVersion",
                format!(
                    "`{}` is not `group/version`, e.g. `example.org/v1`",
                    target.api_version
                ),
            ));
        }
        let replicas = spec
            .replicas
            .as_deref()
            .map(|p| path("spec.replicas", p, &["spec"]))
            .transpose()?;
        if let Some(replicas) = &replicas
            && replicas.has_each()
        {
            return Err(refuse(
                "spec.replicas",
                format!("`{replicas}` must name one field, without `[]`"),
            ));
        }
        let pod_template = spec
            .pod_template
            .as_deref()
            .map(|p| path("spec.podTemplate", p, &["spec"]))
            .transpose()?;
        let fields = &spec.status;
        let mut status = vec![];
        for (name, field, value) in [
            ("replicas", "spec.status.replicas", &fields.replicas),
            ("readyReplicas", "spec.status.ready", &fields.ready),
            (
                "availableReplicas",
                "spec.status.available",
                &fields.available,
            ),
            ("updatedReplicas", "spec.status.updated", &fields.updated),
            (
                "observedGeneration",
                "spec.status.observedGeneration",
                &fields.observed_generation,
            ),
        ] {
            if let Some(text) = value {
                let parsed = path(field, text, &["status"])?;
                if parsed.has_each() || parsed.segments().len() < 2 {
                    return Err(refuse(
                        field,
                        format!("`{text}` must name one field under `.status`, without `[]`"),
                    ));
                }
                status.push((name, parsed));
            }
        }
        match spec.health.type_ {
            HealthType::ReadyReplicas if fields.ready.is_none() => {
                return Err(refuse(
                    "spec.health.type",
                    "`ReadyReplicas` needs `spec.status.ready` (the path of the ready count in the copy's status)",
                ));
            }
            HealthType::ReadyReplicas if replicas.is_none() => {
                return Err(refuse(
                    "spec.health.type",
                    "`ReadyReplicas` compares the ready count with the cluster's replicas: set `spec.replicas` too, or use `Condition` or `Present`",
                ));
            }
            HealthType::Condition => match &spec.health.condition {
                Some(condition) if !condition.type_.is_empty() => {
                    if !matches!(condition.status.as_str(), "True" | "False") {
                        return Err(refuse(
                            "spec.health.condition.status",
                            format!("`{}` must be `True` or `False`", condition.status),
                        ));
                    }
                }
                _ => {
                    return Err(refuse(
                        "spec.health.condition.type",
                        "`Condition` health needs the condition type, e.g. `{type: Available, status: \"True\"}`",
                    ));
                }
            },
            _ => {}
        }
        let mut member_owned = vec![];
        for (index, text) in spec.member_owned_fields.iter().enumerate() {
            let field = format!("spec.memberOwnedFields[{index}]");
            let parsed = FieldPath::parse(text).map_err(|m| refuse(&field, m))?;
            let root = parsed.root();
            let metadata_key = root == "metadata"
                && parsed.segments().len() >= 3
                && matches!(
                    &parsed.segments()[1],
                    Segment::Field(f) if f == "labels" || f == "annotations"
                );
            let hub_key = parsed.segments().iter().any(
                |s| matches!(s, Segment::Field(f) if f.starts_with("federation.example.com/")),
            );
            let whole = parsed.segments().len() < 2 && matches!(root, "spec" | "data");
            if matches!(root, "apiVersion" | "kind" | "status")
                || (root == "metadata" && !metadata_key)
                || hub_key
                || whole
            {
                return Err(refuse(
                    field,
                    format!(
                        "`{text}` cannot be the member's: name a field inside the object (not its identity, status, or the hub's own labels), or one label or annotation as `.metadata.labels['key']`"
                    ),
                ));
            }
            if replicas.as_ref() == Some(&parsed) {
                return Err(refuse(
                    field,
                    format!(
                        "`{text}` is the replica field, which the hub sets per cluster: remove it here"
                    ),
                ));
            }
            member_owned.push(parsed);
        }
        let mut references = vec![];
        for (index, dependency) in spec.dependencies.iter().enumerate() {
            let field = |name: &str| format!("spec.dependencies[{index}].{name}");
            let rule =
                ReferenceRule::new(&dependency.path, &dependency.api_version, &dependency.kind)
                    .map_err(|error| {
                        let name = match error.what {
                            "reference rule apiVersion" => "apiVersion",
                            "reference rule kind" => "kind",
                            _ => "path",
                        };
                        refuse(field(name), error.to_string())
                    })?;
            if rule.path.root() != "spec" {
                return Err(refuse(
                    field("path"),
                    format!(
                        "`{}` must be under `.spec` (the template's own fields, e.g. `.spec.configRef.name`)",
                        dependency.path
                    ),
                ));
            }
            references.push(rule);
        }
        Ok(Interpretation {
            group: group.to_string(),
            kind: target.kind.clone(),
            source,
            replicas,
            stateful: spec.stateful,
            pod_template,
            status,
            health: spec.health.clone(),
            member_owned,
            references,
            quirks: Quirks::default(),
        })
    }

    /// The interpretation of a kind nobody describes.
    pub fn default_for(group: &str, kind: &str) -> Interpretation {
        Interpretation {
            group: group.to_string(),
            kind: kind.to_string(),
            source: Source::Default,
            replicas: None,
            stateful: false,
            pod_template: None,
            status: vec![],
            health: HealthRule::default(),
            member_owned: vec![],
            references: vec![],
            quirks: Quirks::default(),
        }
    }

    /// Replicas are divided among clusters.
    pub fn divisible(&self) -> bool {
        self.replicas.is_some()
    }

    /// A copy reports ready replicas (its health is their count).
    pub fn reports_readiness(&self) -> bool {
        self.health.type_ == HealthType::ReadyReplicas
    }

    /// The template's replica count (1 when the field is missing, as for a Deployment).
    pub fn replicas_of(&self, object: &Value) -> Option<i32> {
        let path = self.replicas.as_ref()?;
        Some(path.get(object).and_then(Value::as_i64).unwrap_or(1) as i32)
    }

    /// A copy's summed status fields under their normalized names, plus its conditions
    /// when health reads one.
    pub fn normalized_status(&self, object: &Value) -> Map<String, Value> {
        let mut out = Map::new();
        for (name, path) in &self.status {
            if let Some(value) = path.get(object) {
                out.insert((*name).to_string(), value.clone());
            }
        }
        if self.health.type_ == HealthType::Condition
            && let Some(conditions) = object["status"].get("conditions")
        {
            out.insert("conditions".into(), conditions.clone());
        }
        out
    }

    /// Whether the kind has status fields to sum on the hub template.
    pub fn sums_status(&self) -> bool {
        self.status.iter().any(|(name, _)| SUMMED.contains(name))
    }

    /// The template status at the kind's own paths, from normalized sums (and, for
    /// normalized `conditions`, the hub's conditions at `.status.conditions`).
    pub fn template_status(&self, normalized: &Value) -> Value {
        let mut object = Value::Object(Map::new());
        for (name, path) in &self.status {
            if let Some(value) = normalized.get(*name) {
                path.set(&mut object, value.clone());
            }
        }
        if let Some(conditions) = normalized.get("conditions") {
            object["status"]["conditions"] = conditions.clone();
        }
        object["status"].take()
    }

    /// Whether a copy is healthy by the condition rule (`None`: the rule is not a
    /// condition).
    pub fn condition_healthy(&self, status: Option<&Value>) -> Option<bool> {
        let HealthRule {
            type_: HealthType::Condition,
            condition:
                Some(HealthCondition {
                    type_,
                    status: wanted,
                    absent_is_healthy,
                }),
        } = &self.health
        else {
            return None;
        };
        let found = status
            .and_then(|s| s["conditions"].as_array())
            .and_then(|conditions| conditions.iter().find(|c| c["type"] == type_.as_str()));
        Some(match found {
            Some(condition) => condition["status"] == wanted.as_str(),
            None => *absent_is_healthy,
        })
    }

    /// Removes the member-owned fields from a copy about to be sent.
    pub fn strip_member_owned(&self, copy: &mut Value) {
        for path in &self.member_owned {
            path.remove(copy);
        }
    }
}

fn target(api_version: &str, kind: &str) -> InterpreterTarget {
    InterpreterTarget {
        api_version: api_version.into(),
        kind: kind.into(),
    }
}

fn workload_status() -> InterpreterStatusFields {
    InterpreterStatusFields {
        replicas: Some(".status.replicas".into()),
        ready: Some(".status.readyReplicas".into()),
        available: Some(".status.availableReplicas".into()),
        updated: Some(".status.updatedReplicas".into()),
        observed_generation: Some(".status.observedGeneration".into()),
    }
}

fn ready_replicas() -> HealthRule {
    HealthRule {
        type_: HealthType::ReadyReplicas,
        condition: None,
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The built-in kinds, declared as a user would declare a `ResourceInterpreter`, with
/// the quirks a path cannot say.
pub fn built_in_specs() -> Vec<(ResourceInterpreterSpec, Quirks)> {
    let pod = Some(".spec.template".to_string());
    vec![
        (
            ResourceInterpreterSpec {
                target: target("apps/v1", "Deployment"),
                replicas: Some(".spec.replicas".into()),
                pod_template: pod.clone(),
                status: workload_status(),
                health: ready_replicas(),
                ..Default::default()
            },
            Quirks {
                omits_zero_counts: true,
                ..Default::default()
            },
        ),
        (
            ResourceInterpreterSpec {
                target: target("apps/v1", "StatefulSet"),
                replicas: Some(".spec.replicas".into()),
                stateful: true,
                pod_template: pod.clone(),
                status: workload_status(),
                health: ready_replicas(),
                ..Default::default()
            },
            Quirks {
                retains_claims: true,
                omits_zero_counts: true,
                ..Default::default()
            },
        ),
        (
            ResourceInterpreterSpec {
                target: target("example.com/v1", "MyDatabase"),
                replicas: Some(".spec.replicas".into()),
                stateful: true,
                status: workload_status(),
                health: ready_replicas(),
                ..Default::default()
            },
            Quirks {
                database_status: true,
                ..Default::default()
            },
        ),
        (
            ResourceInterpreterSpec {
                target: target("apps/v1", "DaemonSet"),
                pod_template: pod.clone(),
                ..Default::default()
            },
            Quirks::default(),
        ),
        (
            // A Job runs in every cluster it is placed in (Duplicated; `maxGroups: 1`
            // runs it once). The member's API server generates its selector and labels.
            ResourceInterpreterSpec {
                target: target("batch/v1", "Job"),
                pod_template: pod.clone(),
                health: HealthRule {
                    type_: HealthType::Condition,
                    condition: Some(HealthCondition {
                        type_: "Failed".into(),
                        status: "False".into(),
                        absent_is_healthy: true,
                    }),
                },
                member_owned_fields: strings(&[
                    ".spec.selector",
                    ".spec.template.metadata.labels['controller-uid']",
                    ".spec.template.metadata.labels['batch.kubernetes.io/controller-uid']",
                ]),
                ..Default::default()
            },
            Quirks::default(),
        ),
        (
            ResourceInterpreterSpec {
                target: target("batch/v1", "CronJob"),
                pod_template: Some(".spec.jobTemplate.spec.template".into()),
                ..Default::default()
            },
            Quirks::default(),
        ),
        (
            // Addresses are the member's (each allocates from its own range).
            ResourceInterpreterSpec {
                target: target("v1", "Service"),
                member_owned_fields: strings(&[
                    ".spec.clusterIP",
                    ".spec.clusterIPs",
                    ".spec.healthCheckNodePort",
                    ".spec.ports[].nodePort",
                ]),
                ..Default::default()
            },
            Quirks {
                keeps_headless: true,
                ..Default::default()
            },
        ),
        (
            // A claim holds data; the volume it is bound to is the member's.
            ResourceInterpreterSpec {
                target: target("v1", "PersistentVolumeClaim"),
                stateful: true,
                member_owned_fields: strings(&[
                    ".spec.volumeName",
                    ".metadata.annotations['pv.kubernetes.io/bind-completed']",
                    ".metadata.annotations['pv.kubernetes.io/bound-by-controller']",
                    ".metadata.annotations['volume.kubernetes.io/selected-node']",
                ]),
                ..Default::default()
            },
            Quirks::default(),
        ),
        (
            ResourceInterpreterSpec {
                target: target("v1", "ConfigMap"),
                ..Default::default()
            },
            Quirks::default(),
        ),
        (
            ResourceInterpreterSpec {
                target: target("v1", "Secret"),
                ..Default::default()
            },
            Quirks::default(),
        ),
        (
            // The member's token controller fills in its own tokens.
            ResourceInterpreterSpec {
                target: target("v1", "ServiceAccount"),
                member_owned_fields: strings(&[".secrets"]),
                ..Default::default()
            },
            Quirks::default(),
        ),
    ]
}

/// Every kind's interpretation: the built-ins, then the accepted `ResourceInterpreter`s.
#[derive(Clone, Debug, Default)]
pub struct Interpreters {
    by_kind: HashMap<(String, String), Arc<Interpretation>>,
}

/// What the hub says about one `ResourceInterpreter`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub name: String,
    pub accepted: Result<(), String>,
}

impl Interpreters {
    /// The built-ins alone.
    pub fn built_in() -> Interpreters {
        let mut by_kind = HashMap::new();
        for (spec, quirks) in built_in_specs() {
            let mut interpretation =
                Interpretation::from_spec(&spec, Source::BuiltIn).expect("built-ins are valid");
            interpretation.quirks = quirks;
            by_kind.insert(
                (interpretation.group.clone(), interpretation.kind.clone()),
                Arc::new(interpretation),
            );
        }
        Interpreters { by_kind }
    }

    /// The built-ins and the user's interpreters, with a verdict for each of the latter:
    /// an invalid one, one for a built-in kind, or a second one for the same kind (the
    /// older wins, then name order) is not used.
    pub fn with_resources(resources: &[Arc<ResourceInterpreter>]) -> (Interpreters, Vec<Verdict>) {
        let mut interpreters = Interpreters::built_in();
        let mut ordered: Vec<&Arc<ResourceInterpreter>> = resources.iter().collect();
        ordered.sort_by(|a, b| {
            let created = |r: &ResourceInterpreter| r.metadata.creation_timestamp.clone();
            created(a)
                .map(|t| t.0)
                .cmp(&created(b).map(|t| t.0))
                .then_with(|| a.metadata.name.cmp(&b.metadata.name))
        });
        let mut verdicts = vec![];
        for resource in ordered {
            let name = resource.metadata.name.clone().unwrap_or_default();
            let accepted = interpreters.add(&name, &resource.spec);
            verdicts.push(Verdict { name, accepted });
        }
        (interpreters, verdicts)
    }

    fn add(&mut self, name: &str, spec: &ResourceInterpreterSpec) -> Result<(), String> {
        let interpretation = Interpretation::from_spec(spec, Source::Resource(name.to_string()))
            .map_err(|e| e.to_string())?;
        let key = (interpretation.group.clone(), interpretation.kind.clone());
        if let Some(existing) = self.by_kind.get(&key) {
            return Err(match &existing.source {
                Source::BuiltIn => format!(
                    "spec.target: {} is built in and cannot be reinterpreted: delete this ResourceInterpreter",
                    spec.target.kind
                ),
                other => format!(
                    "spec.target: {} is already interpreted by {other}: delete one of the two",
                    spec.target.kind
                ),
            });
        }
        if interpretation.group.is_empty() {
            return Err(format!(
                "spec.target.apiVersion: `{}` has no group: core kinds are built in",
                spec.target.api_version
            ));
        }
        self.by_kind.insert(key, Arc::new(interpretation));
        Ok(())
    }

    /// The kinds the interpreters' reference fields (`spec.dependencies`) name, as
    /// `(apiVersion, kind)`: federated, like the pod template's kinds, whenever a policy
    /// propagates dependencies.
    pub fn referenced_kinds(&self) -> Vec<(String, String)> {
        let mut kinds: Vec<(String, String)> = self
            .by_kind
            .values()
            .flat_map(|i| i.references.iter())
            .map(|rule| (rule.api_version.clone(), rule.kind.clone()))
            .collect();
        kinds.sort();
        kinds.dedup();
        kinds
    }

    /// How the hub reads `kind` of `api_version`.
    pub fn get(&self, api_version: &str, kind: &str) -> Arc<Interpretation> {
        let group = group_of(api_version);
        self.by_kind
            .get(&(group.to_string(), kind.to_string()))
            .cloned()
            .unwrap_or_else(|| Arc::new(Interpretation::default_for(group, kind)))
    }
}

/// Whether a user's interpreter can be used: valid, for a kind with a group, and not a
/// built-in kind (the admission webhook's check; the hub checks again, and reports on the
/// object's `Accepted` condition).
pub fn admit(spec: &ResourceInterpreterSpec) -> Result<(), InterpreterError> {
    let interpretation = Interpretation::from_spec(spec, Source::Default)?;
    if interpretation.group.is_empty() {
        return Err(refuse(
            "spec.target.apiVersion",
            format!(
                "`{}` has no group: core kinds are built in; give a custom resource's `group/version`",
                spec.target.api_version
            ),
        ));
    }
    if Interpreters::built_in()
        .get(&spec.target.api_version, &spec.target.kind)
        .source
        == Source::BuiltIn
    {
        return Err(refuse(
            "spec.target",
            format!(
                "{} is built in and cannot be reinterpreted (docs/interpreters.md lists the built-ins)",
                spec.target.kind
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(value: Value) -> ResourceInterpreterSpec {
        serde_json::from_value(value).unwrap()
    }

    fn widget() -> ResourceInterpreterSpec {
        spec(json!({
            "target": {"apiVersion": "example.org/v1", "kind": "Widget"},
            "replicas": ".spec.size",
            "status": {"ready": ".status.summary.ready", "replicas": ".status.summary.total"},
            "health": {"type": "ReadyReplicas"},
            "memberOwnedFields": [".spec.endpoint", ".metadata.annotations['example.org/leader']"]
        }))
    }

    #[test]
    fn a_custom_kind_is_divided_and_summed_at_its_own_paths() {
        let widget = Interpretation::from_spec(&widget(), Source::Resource("w".into())).unwrap();
        assert!(widget.divisible() && widget.reports_readiness() && !widget.stateful);
        assert_eq!(widget.replicas_of(&json!({"spec": {"size": 6}})), Some(6));
        assert_eq!(widget.replicas_of(&json!({"spec": {}})), Some(1));
        let copy = json!({"status": {"summary": {"ready": 2, "total": 3}, "other": 1}});
        let normalized = widget.normalized_status(&copy);
        assert_eq!(
            Value::Object(normalized),
            json!({"readyReplicas": 2, "replicas": 3})
        );
        let status = widget.template_status(&json!({"readyReplicas": 5, "replicas": 6}));
        assert_eq!(status, json!({"summary": {"ready": 5, "total": 6}}));
        let mut copy = json!({"metadata": {"annotations": {"example.org/leader": "a", "keep": "b"}}, "spec": {"endpoint": "x", "size": 2}});
        widget.strip_member_owned(&mut copy);
        assert_eq!(
            copy,
            json!({"metadata": {"annotations": {"keep": "b"}}, "spec": {"size": 2}})
        );
    }

    #[test]
    fn invalid_interpreters_are_refused_with_the_field() {
        let cases = [
            (json!({"replicas": "spec.size"}), "spec.replicas"),
            (json!({"replicas": ".status.size"}), "spec.replicas"),
            (json!({"replicas": ".spec.sizes[].n"}), "spec.replicas"),
            (
                json!({"status": {"ready": ".spec.ready"}}),
                "spec.status.ready",
            ),
            (
                json!({"health": {"type": "ReadyReplicas"}}),
                "spec.health.type",
            ),
            (
                json!({"health": {"type": "Condition"}}),
                "spec.health.condition.type",
            ),
            (
                json!({"health": {"type": "Condition", "condition": {"type": "Ready", "status": "yes"}}}),
                "spec.health.condition.status",
            ),
            (
                json!({"memberOwnedFields": [".metadata.name"]}),
                "spec.memberOwnedFields[0]",
            ),
            (
                json!({"dependencies": [{"path": ".status.config", "apiVersion": "v1", "kind": "ConfigMap"}]}),
                "spec.dependencies[0].path",
            ),
            (
                json!({"dependencies": [{"path": ".spec.config", "apiVersion": "v1", "kind": "ConfigMap"},
                                        {"path": "spec.x", "apiVersion": "v1", "kind": "Secret"}]}),
                "spec.dependencies[1].path",
            ),
            (
                json!({"dependencies": [{"path": ".spec.config", "apiVersion": "", "kind": "ConfigMap"}]}),
                "spec.dependencies[0].apiVersion",
            ),
            (
                json!({"dependencies": [{"path": ".spec.config", "apiVersion": "v1", "kind": "configmap"}]}),
                "spec.dependencies[0].kind",
            ),
            (
                json!({"memberOwnedFields": [".metadata.labels['federation.example.com/binding']"]}),
                "spec.memberOwnedFields[0]",
            ),
            (
                json!({"replicas": ".spec.size", "memberOwnedFields": [".spec.size"]}),
                "spec.memberOwnedFields[0]",
            ),
            (
                json!({"target": {"apiVersion": "example.org/v1", "kind": "widget"}}),
                "spec.target.kind",
            ),
            (
                json!({"target": {"apiVersion": "a/b/c", "kind": "Widget"}}),
                "spec.target.apiVersion",
            ),
        ];
        for (change, field) in cases {
            let mut value = json!({"target": {"apiVersion": "example.org/v1", "kind": "Widget"}});
            for (k, v) in change.as_object().unwrap() {
                value[k] = v.clone();
            }
            let error =
                Interpretation::from_spec(&spec(value.clone()), Source::Default).unwrap_err();
            assert_eq!(error.field, field, "{value}: {error}");
            assert!(!error.message.is_empty());
        }
    }

    fn resource(
        name: &str,
        spec: ResourceInterpreterSpec,
        second: i64,
    ) -> Arc<ResourceInterpreter> {
        let mut r = ResourceInterpreter::new(name, spec);
        r.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::from_second(second).unwrap(),
        ));
        Arc::new(r)
    }

    #[test]
    fn built_ins_cannot_be_replaced_and_the_older_of_two_wins() {
        let deployment = spec(json!({"target": {"apiVersion": "apps/v1", "kind": "Deployment"}}));
        let (interpreters, verdicts) = Interpreters::with_resources(&[
            resource("newer", widget(), 20),
            resource("older", widget(), 10),
            resource("mine", deployment, 5),
            resource(
                "core",
                spec(json!({"target": {"apiVersion": "v1", "kind": "Pod"}})),
                6,
            ),
        ]);
        let verdict = |name: &str| {
            verdicts
                .iter()
                .find(|v| v.name == name)
                .unwrap()
                .accepted
                .clone()
        };
        assert!(verdict("mine").unwrap_err().contains("built in"));
        assert!(verdict("core").unwrap_err().contains("core kinds"));
        assert!(verdict("older").is_ok());
        assert!(
            verdict("newer")
                .unwrap_err()
                .contains("ResourceInterpreter/older")
        );
        let widget = interpreters.get("example.org/v2", "Widget");
        assert_eq!(
            widget.source,
            Source::Resource("older".into()),
            "any version"
        );
        assert_eq!(
            interpreters.get("apps/v1", "Deployment").source,
            Source::BuiltIn
        );
        let unknown = interpreters.get("other.io/v1", "Gadget");
        assert!(!unknown.divisible() && !unknown.stateful && unknown.source == Source::Default);
    }

    #[test]
    fn admission_refuses_built_in_and_core_kinds() {
        assert!(admit(&widget()).is_ok());
        let deployment = spec(json!({"target": {"apiVersion": "apps/v1", "kind": "Deployment"}}));
        assert_eq!(admit(&deployment).unwrap_err().field, "spec.target");
        let pod = spec(json!({"target": {"apiVersion": "v1", "kind": "Pod"}}));
        assert_eq!(admit(&pod).unwrap_err().field, "spec.target.apiVersion");
        let bad = spec(
            json!({"target": {"apiVersion": "example.org/v1", "kind": "Widget"}, "replicas": "size"}),
        );
        assert_eq!(admit(&bad).unwrap_err().field, "spec.replicas");
    }

    #[test]
    fn built_ins_say_what_the_design_says() {
        let all = Interpreters::built_in();
        let d = all.get("apps/v1", "Deployment");
        assert!(d.divisible() && !d.stateful && d.reports_readiness());
        let s = all.get("apps/v1", "StatefulSet");
        assert!(s.divisible() && s.stateful && s.quirks.retains_claims);
        let db = all.get("example.com/v1", "MyDatabase");
        assert!(db.divisible() && db.stateful && db.quirks.database_status);
        assert!(!all.get("other.io/v1", "Deployment").divisible());
        for kind in ["ConfigMap", "Secret", "Service", "ServiceAccount"] {
            let i = all.get("v1", kind);
            assert!(
                !i.divisible() && !i.stateful && i.source == Source::BuiltIn,
                "{kind}"
            );
        }
        assert!(all.get("v1", "PersistentVolumeClaim").stateful);
        let job = all.get("batch/v1", "Job");
        assert!(!job.divisible());
        assert_eq!(
            job.condition_healthy(None),
            Some(true),
            "running: no Failed yet"
        );
        let failed = json!({"conditions": [{"type": "Failed", "status": "True"}]});
        assert_eq!(job.condition_healthy(Some(&failed)), Some(false));
        let mut copy = json!({"spec": {"selector": {"matchLabels": {"controller-uid": "x"}},
            "template": {"metadata": {"labels": {"controller-uid": "x", "app": "a"}}}}});
        job.strip_member_owned(&mut copy);
        assert_eq!(
            copy,
            json!({"spec": {"template": {"metadata": {"labels": {"app": "a"}}}}})
        );
    }
}
