//! What a workload references: the ConfigMaps, Secrets, ServiceAccounts and
//! PersistentVolumeClaims of its pod template, and the fields an interpreter names for a
//! custom kind ([`ReferenceRule`]).

use std::collections::BTreeSet;

use serde_json::Value;

pub use crate::hub::federation::field_path::FieldPath;

use super::{DependencyRef, group_of};

/// A path or reference rule an interpreter wrote that cannot be used, with the fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} {text:?}: {problem}")]
pub struct PathError {
    /// What was being parsed: "path", "reference rule apiVersion", ...
    pub what: &'static str,
    /// The text as written.
    pub text: String,
    /// What is wrong and how to write it instead.
    pub problem: String,
}

/// An extra reference field of a custom kind, as an interpreter names it: the objects of
/// `kind` (`api_version`) whose names are found at `path` in the workload.
///
/// What the path may lead to, for each value found:
/// - a string: the name of the referenced object, in the workload's namespace;
/// - an object with a string `name` (and optionally `namespace`): a reference object such
///   as `{name: settings}`; one whose `namespace` is not the workload's is skipped (only
///   objects of the workload's namespace are dependencies);
/// - anything else (a number, an empty string, a missing field): no reference.
///
/// So `.spec.configRef.name` and `.spec.configRef` find the same ConfigMap, and
/// `.spec.secrets[].name` finds one Secret per list element. The referenced kind may
/// itself be a custom kind with reference rules: the hub registers its references too, and
/// the dependency graph follows the chain (see [`super::DependencyGraph`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReferenceRule {
    /// Where the references are.
    pub path: FieldPath,
    /// API version of the referenced objects, for example `v1` or `example.com/v1`.
    pub api_version: String,
    /// Kind of the referenced objects, for example `ConfigMap` or `Widget`.
    pub kind: String,
}

impl ReferenceRule {
    /// A rule from an interpreter's three fields, refused with the fix when one is unusable.
    pub fn new(path: &str, api_version: &str, kind: &str) -> Result<ReferenceRule, PathError> {
        let path = FieldPath::parse(path).map_err(|problem| PathError {
            what: "reference rule path",
            text: path.to_string(),
            problem: format!(
                "{problem}; a reference path names the field holding the name, for example .spec.configRef.name"
            ),
        })?;
        let api_version = api_version.trim();
        if api_version.is_empty() || api_version.split('/').count() > 2 {
            return Err(PathError {
                what: "reference rule apiVersion",
                text: api_version.to_string(),
                problem: "write the referenced kind's apiVersion, for example v1 or example.com/v1"
                    .into(),
            });
        }
        let kind = kind.trim();
        if kind.is_empty() || !kind.starts_with(|c: char| c.is_ascii_uppercase()) {
            return Err(PathError {
                what: "reference rule kind",
                text: kind.to_string(),
                problem: "write the referenced kind as the API names it, for example ConfigMap"
                    .into(),
            });
        }
        Ok(ReferenceRule {
            path,
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        })
    }

    fn collect(&self, object: &Value, namespace: &str, out: &mut BTreeSet<DependencyRef>) {
        for value in self.path.values(object) {
            let name = match value {
                Value::String(name) => Some(name.as_str()),
                Value::Object(reference) => {
                    let elsewhere = reference
                        .get("namespace")
                        .and_then(Value::as_str)
                        .is_some_and(|ns| !ns.is_empty() && ns != namespace);
                    reference
                        .get("name")
                        .and_then(Value::as_str)
                        .filter(|_| !elsewhere)
                }
                _ => None,
            };
            if let Some(name) = name.filter(|n| !n.is_empty()) {
                out.insert(DependencyRef::new(
                    &self.api_version,
                    &self.kind,
                    namespace,
                    name,
                ));
            }
        }
    }
}

/// The ServiceAccount every namespace has (the member's controllers create it): never a
/// dependency, so a workload that names it explicitly does not drag the hub's copy along.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// The pod template of a workload: `.spec.template` of a Deployment, StatefulSet,
/// DaemonSet, ReplicaSet, ReplicationController or Job; `.spec.jobTemplate.spec.template`
/// of a CronJob; a Pod itself; for any other kind the value at `custom` (the path its
/// interpreter names), or none.
pub fn pod_template<'a>(
    api_version: &str,
    kind: &str,
    object: &'a Value,
    custom: Option<&FieldPath>,
) -> Option<&'a Value> {
    let template = match (group_of(api_version), kind) {
        ("apps", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet")
        | ("batch", "Job")
        | ("", "ReplicationController") => object.pointer("/spec/template"),
        ("batch", "CronJob") => object.pointer("/spec/jobTemplate/spec/template"),
        ("", "Pod") => Some(object),
        _ => custom.and_then(|path| path.values(object).into_iter().next()),
    };
    template.filter(|t| t.is_object())
}

/// The ConfigMaps, Secrets, ServiceAccounts and PersistentVolumeClaims a workload's pod
/// template references, in the workload's namespace, sorted and without repeats.
/// `pod_template_path` locates the template of a kind that is not built in (see
/// [`pod_template`]); a path that does not parse finds nothing (interpreters are
/// validated with [`FieldPath::parse`] when they are admitted).
pub fn references(
    kind_api_version: &str,
    kind: &str,
    object: &Value,
    pod_template_path: Option<&str>,
) -> Vec<DependencyRef> {
    let pod_template = pod_template_path.and_then(|p| FieldPath::parse(p).ok());
    references_in(kind_api_version, kind, object, pod_template.as_ref(), &[])
}

/// [`references`] of a kind whose interpreter names its pod template and extra reference
/// fields (`rules`), sorted and without repeats.
pub fn references_in(
    api_version: &str,
    kind: &str,
    object: &Value,
    pod_template_path: Option<&FieldPath>,
    rules: &[ReferenceRule],
) -> Vec<DependencyRef> {
    let namespace = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut out = BTreeSet::new();
    if let Some(template) = pod_template(api_version, kind, object, pod_template_path)
        && let Some(spec) = template.get("spec")
    {
        pod_spec_references(spec, namespace, &mut out);
    }
    for rule in rules {
        rule.collect(object, namespace, &mut out);
    }
    out.into_iter().collect()
}

/// The volume sources that name a Secret, and the field under them holding its name.
/// (The in-tree drivers' `secretRef`s are LocalObjectReferences: the pod's namespace.)
const SECRET_VOLUME_FIELDS: &[(&str, &str)] = &[
    ("secret", "/secretName"),
    ("csi", "/nodePublishSecretRef/name"),
    ("azureFile", "/secretName"),
    ("cephfs", "/secretRef/name"),
    ("cinder", "/secretRef/name"),
    ("flexVolume", "/secretRef/name"),
    ("iscsi", "/secretRef/name"),
    ("rbd", "/secretRef/name"),
    ("scaleIO", "/secretRef/name"),
    ("storageos", "/secretRef/name"),
];

fn pod_spec_references(spec: &Value, namespace: &str, out: &mut BTreeSet<DependencyRef>) {
    let mut add = |kind: &str, name: Option<&Value>| {
        if let Some(name) = name.and_then(Value::as_str).filter(|n| !n.is_empty()) {
            out.insert(DependencyRef::new("v1", kind, namespace, name));
        }
    };
    for volume in list(spec, "volumes") {
        add("ConfigMap", volume.pointer("/configMap/name"));
        add(
            "PersistentVolumeClaim",
            volume.pointer("/persistentVolumeClaim/claimName"),
        );
        for (source, name) in SECRET_VOLUME_FIELDS {
            if let Some(source) = volume.get(*source) {
                add("Secret", source.pointer(name));
            }
        }
        if let Some(projected) = volume.get("projected") {
            for source in list(projected, "sources") {
                add("ConfigMap", source.pointer("/configMap/name"));
                add("Secret", source.pointer("/secret/name"));
            }
        }
        // `ephemeral` volumes are claims the member's controllers create from the pod: not
        // dependencies, like a StatefulSet's volumeClaimTemplates (which are not in the pod
        // template at all).
    }
    for containers in ["containers", "initContainers", "ephemeralContainers"] {
        for container in list(spec, containers) {
            for env in list(container, "env") {
                add("ConfigMap", env.pointer("/valueFrom/configMapKeyRef/name"));
                add("Secret", env.pointer("/valueFrom/secretKeyRef/name"));
            }
            for source in list(container, "envFrom") {
                add("ConfigMap", source.pointer("/configMapRef/name"));
                add("Secret", source.pointer("/secretRef/name"));
            }
        }
    }
    for secret in list(spec, "imagePullSecrets") {
        add("Secret", secret.get("name"));
    }
    // `serviceAccount` is the deprecated spelling, used when the new one is not set.
    let account = spec
        .get("serviceAccountName")
        .filter(|a| a.as_str().is_some_and(|a| !a.is_empty()))
        .or_else(|| spec.get("serviceAccount"));
    if account.and_then(Value::as_str) != Some(DEFAULT_SERVICE_ACCOUNT) {
        add("ServiceAccount", account);
    }
}

fn list<'a>(value: &'a Value, field: &str) -> impl Iterator<Item = &'a Value> {
    value
        .get(field)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}
