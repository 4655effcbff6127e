//! Convergence after the last fault healed: every template's copies are where its binding
//! says, with the binding's replicas, Ready, and with the template's values in the fields
//! the nemesis edits; no copy is left where the binding does not name its cluster (a claim
//! may stay: claims are kept), and nothing is left of templates the user deleted.
//!
//! [`problems`] judges a [`Snapshot`] (pure); [`read_snapshot`] takes one from the lab.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result};
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};
use serde_json::Value;

use super::rules::TemplateRef;
use super::schedule::TemplateKind;
use super::templates::{api_version, edited_field};
use bulkhead::api::{FINALIZER_CLEANUP, LABEL_MANAGED_BY, ResourceBinding};

/// What the hub and the members hold, read at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Every template on the hub, as JSON.
    pub templates: BTreeMap<TemplateRef, Value>,
    /// The clusters and replicas each binding's spec names, by the template it binds.
    pub bindings: BTreeMap<TemplateRef, BTreeMap<String, i64>>,
    /// Every copy the hub manages in the members (by the managed-by label), by template
    /// and cluster.
    pub copies: BTreeMap<TemplateRef, BTreeMap<String, Value>>,
}

/// Everything that keeps the snapshot from being converged, one line each; empty when
/// converged.
pub fn problems(snapshot: &Snapshot) -> Vec<String> {
    let no_copies = BTreeMap::new();
    let mut problems = vec![];
    for (template, object) in &snapshot.templates {
        let copies = snapshot.copies.get(template).unwrap_or(&no_copies);
        for problem in template_problems(
            template.kind,
            object,
            snapshot.bindings.get(template),
            copies,
        ) {
            problems.push(format!("{template}: {problem}"));
        }
    }
    for (template, copies) in &snapshot.copies {
        if snapshot.templates.contains_key(template) {
            continue;
        }
        for (cluster, copy) in copies {
            if !is_deleting(copy) {
                problems.push(format!(
                    "{template}: a copy in {cluster}, but no such template on the hub (deleted by the user)"
                ));
            }
        }
    }
    problems
}

fn is_deleting(object: &Value) -> bool {
    object.pointer("/metadata/deletionTimestamp").is_some()
}

fn integer(object: &Value, pointer: &str) -> i64 {
    object.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

/// Whether a copy runs as it should: its replicas Ready, as its controller reports for
/// its current generation (a MyDatabase also in phase Ready, a claim Bound); `None` when
/// it does, else what is missing.
fn readiness_problem(kind: TemplateKind, copy: &Value) -> Option<String> {
    let replicas = integer(copy, "/spec/replicas");
    let generation = integer(copy, "/metadata/generation");
    let observed = integer(copy, "/status/observedGeneration");
    let ready = integer(copy, "/status/readyReplicas");
    let stale = observed < generation;
    match kind {
        TemplateKind::Deployment | TemplateKind::StatefulSet => {
            (stale || ready != replicas).then(|| {
                format!("{ready}/{replicas} ready, generation {generation} observed {observed}")
            })
        }
        TemplateKind::Database => {
            let phase = copy
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("none");
            (stale || ready != replicas || phase != "Ready").then(|| {
                format!(
                    "{ready}/{replicas} ready, phase {phase}, generation {generation} observed {observed}"
                )
            })
        }
        TemplateKind::Claim => {
            let phase = copy
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("none");
            (phase != "Bound").then(|| format!("phase {phase}"))
        }
        TemplateKind::ConfigMap | TemplateKind::Shard => None,
    }
}

/// The problems of one template; `wanted` is its binding's clusters and replicas (None:
/// no binding).
pub fn template_problems(
    kind: TemplateKind,
    template: &Value,
    wanted: Option<&BTreeMap<String, i64>>,
    copies: &BTreeMap<String, Value>,
) -> Vec<String> {
    let mut problems = vec![];
    let live: BTreeMap<&String, &Value> = copies.iter().filter(|(_, c)| !is_deleting(c)).collect();
    if is_deleting(template) {
        // Only Bulkhead's finalizer is the hub's business: on the lab's hub no controller
        // removes `kubernetes.io/pvc-protection`, so a deleted claim template stays
        // Terminating there after Bulkhead is done.
        let cleanup_pending = template
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| f.iter().any(|f| f == FINALIZER_CLEANUP));
        if cleanup_pending {
            problems.push(format!(
                "deleted by the user, but Bulkhead's finalizer {FINALIZER_CLEANUP} is still on it"
            ));
        }
        for cluster in live.keys() {
            problems.push(format!(
                "deleted by the user, but its copy in {cluster} is still there"
            ));
        }
        return problems;
    }
    let nowhere = BTreeMap::new();
    let wanted = match wanted {
        Some(wanted) => wanted,
        // A ConfigMap or claim no placed workload names has no binding: it goes nowhere.
        None if matches!(kind, TemplateKind::ConfigMap | TemplateKind::Claim) => &nowhere,
        None => {
            problems.push("no binding".to_string());
            return problems;
        }
    };
    for (cluster, replicas) in wanted {
        let Some(copy) = live.get(cluster) else {
            problems.push(format!("no copy in {cluster}, which the binding names"));
            continue;
        };
        if kind.is_divided() {
            let has = copy.pointer("/spec/replicas").and_then(Value::as_i64);
            if has != Some(*replicas) {
                problems.push(format!(
                    "{cluster}: spec.replicas {}, the binding says {replicas}",
                    has.map(|r| r.to_string()).unwrap_or_else(|| "unset".into())
                ));
                continue;
            }
        }
        if let Some(field) = edited_field(kind) {
            let ours = template.pointer(field);
            let theirs = copy.pointer(field);
            if ours != theirs {
                problems.push(format!(
                    "{cluster}: {field} is {}, the template's is {} (an edit in the member was not repaired)",
                    theirs.map(Value::to_string).unwrap_or_else(|| "unset".into()),
                    ours.map(Value::to_string).unwrap_or_else(|| "unset".into()),
                ));
            }
        }
        if let Some(problem) = readiness_problem(kind, copy) {
            problems.push(format!("{cluster}: not Ready: {problem}"));
        }
    }
    if kind != TemplateKind::Claim {
        let unwanted: BTreeSet<&String> = live
            .keys()
            .filter(|cluster| !wanted.contains_key(**cluster))
            .copied()
            .collect();
        for cluster in unwanted {
            problems.push(format!(
                "a copy in {cluster}, which the binding does not name"
            ));
        }
    }
    problems
}

/// The API resource of a kind.
pub fn api_resource(kind: TemplateKind) -> ApiResource {
    ApiResource {
        group: kind.group().to_string(),
        version: "v1".to_string(),
        api_version: api_version(kind),
        kind: kind.kind().to_string(),
        plural: kind.plural().to_string(),
    }
}

/// Lists `kind` in `namespace`; a kind the server does not know (the Shard CRD before it
/// was installed) lists as empty.
async fn list(
    client: &Client,
    namespace: &str,
    kind: TemplateKind,
    params: &ListParams,
) -> Result<Vec<DynamicObject>> {
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &api_resource(kind));
    match api.list(params).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(vec![]),
        Err(e) => Err(e).with_context(|| format!("listing {}", kind.plural())),
    }
}

/// Reads the snapshot: the templates and bindings of `namespace` on the hub, and the
/// managed copies in each member (through their in-zone clients).
pub async fn read_snapshot(
    hub: &Client,
    members: &BTreeMap<String, Client>,
    namespace: &str,
) -> Result<Snapshot> {
    let mut snapshot = Snapshot::default();
    let everything = ListParams::default();
    let managed = ListParams::default().labels(&format!("{LABEL_MANAGED_BY}=bulkhead"));
    for kind in TemplateKind::ALL {
        for object in list(hub, namespace, kind, &everything).await? {
            let template = TemplateRef {
                kind,
                name: object.name_any(),
            };
            snapshot
                .templates
                .insert(template, serde_json::to_value(&object)?);
        }
        for (cluster, client) in members {
            for object in list(client, namespace, kind, &managed)
                .await
                .with_context(|| format!("in {cluster}"))?
            {
                let template = TemplateRef {
                    kind,
                    name: object.name_any(),
                };
                snapshot
                    .copies
                    .entry(template)
                    .or_default()
                    .insert(cluster.clone(), serde_json::to_value(&object)?);
            }
        }
    }
    let bindings = Api::<ResourceBinding>::namespaced(hub.clone(), namespace)
        .list(&everything)
        .await
        .context("listing bindings")?;
    for binding in bindings.items {
        let resource = &binding.spec.resource;
        let Some(kind) = TemplateKind::ALL
            .into_iter()
            .find(|k| k.kind() == resource.kind && api_version(*k) == resource.api_version)
        else {
            continue;
        };
        let clusters = binding
            .spec
            .clusters
            .iter()
            .map(|c| (c.name.clone(), i64::from(c.replicas)))
            .collect();
        snapshot.bindings.insert(
            TemplateRef {
                kind,
                name: resource.name.clone(),
            },
            clusters,
        );
    }
    Ok(snapshot)
}

/// A text picture of the state, for diagnosing what did not converge: the lab's processes,
/// every binding in one line (spec, conditions, per-cluster rows), and per member every
/// pod (phase, Ready, why it is not scheduled) and claim (phase) of `namespace`.
pub async fn describe_state(
    lab: &crate::lab::Lab,
    hub: &Client,
    members: &BTreeMap<String, Client>,
    namespace: &str,
) -> String {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
    let mut out = lab
        .status()
        .await
        .unwrap_or_else(|e| format!("lab status: {e:#}\n"));
    match Api::<ResourceBinding>::namespaced(hub.clone(), namespace)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => {
            for binding in list.items {
                out.push_str(&format!(
                    "binding {}: {}\n",
                    binding.name_any(),
                    crate::federation::describe_binding(&binding)
                ));
            }
        }
        Err(e) => out.push_str(&format!("bindings: {e}\n")),
    }
    for (cluster, client) in members {
        match Api::<Pod>::namespaced(client.clone(), namespace)
            .list(&ListParams::default())
            .await
        {
            Ok(list) => {
                for pod in list.items {
                    let status = pod.status.clone().unwrap_or_default();
                    let conditions: Vec<String> = status
                        .conditions
                        .unwrap_or_default()
                        .iter()
                        .map(|c| {
                            format!(
                                "{}={}{}",
                                c.type_,
                                c.status,
                                c.message
                                    .as_ref()
                                    .map(|m| format!(" ({m})"))
                                    .unwrap_or_default()
                            )
                        })
                        .collect();
                    out.push_str(&format!(
                        "{cluster} pod {}: {} node {} deleting {} [{}]\n",
                        pod.name_any(),
                        status.phase.unwrap_or_default(),
                        pod.spec
                            .and_then(|s| s.node_name)
                            .unwrap_or_else(|| "none".into()),
                        pod.metadata.deletion_timestamp.is_some(),
                        conditions.join(", ")
                    ));
                }
            }
            Err(e) => out.push_str(&format!("{cluster} pods: {e}\n")),
        }
        match Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
            .list(&ListParams::default())
            .await
        {
            Ok(list) => {
                for claim in list.items {
                    out.push_str(&format!(
                        "{cluster} claim {}: {} deleting {} labels {:?}\n",
                        claim.name_any(),
                        claim.status.and_then(|s| s.phase).unwrap_or_default(),
                        claim.metadata.deletion_timestamp.is_some(),
                        claim.metadata.labels.unwrap_or_default()
                    ));
                }
            }
            Err(e) => out.push_str(&format!("{cluster} claims: {e}\n")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::templates::template;
    use serde_json::json;

    /// A member copy of `template` with `replicas`, all of them Ready.
    fn ready_copy(template: &Value, replicas: i64) -> Value {
        let mut copy = template.clone();
        if copy.pointer("/spec/replicas").is_some() {
            copy["spec"]["replicas"] = json!(replicas);
        }
        copy["metadata"]["generation"] = json!(2);
        copy["status"] = json!({"observedGeneration": 2, "readyReplicas": replicas,
                                "updatedReplicas": replicas, "phase": "Ready"});
        copy
    }

    fn wanted(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
        pairs.iter().map(|(c, r)| (c.to_string(), *r)).collect()
    }

    #[test]
    fn copies_as_the_binding_says_ready_and_unedited_are_converged() {
        for kind in [
            TemplateKind::Database,
            TemplateKind::StatefulSet,
            TemplateKind::Deployment,
        ] {
            let hub = template(kind, "a-1", 3, 1);
            let copies = BTreeMap::from([
                ("east".to_string(), ready_copy(&hub, 2)),
                ("west".to_string(), ready_copy(&hub, 1)),
            ]);
            let problems = template_problems(
                kind,
                &hub,
                Some(&wanted(&[("east", 2), ("west", 1)])),
                &copies,
            );
            assert_eq!(problems, Vec::<String>::new(), "{kind:?}");
        }
    }

    #[test]
    fn a_missing_wrong_unready_edited_or_extra_copy_is_reported() {
        let kind = TemplateKind::Deployment;
        let hub = template(kind, "web-1", 4, 1);
        let mut unready = ready_copy(&hub, 1);
        unready["status"]["readyReplicas"] = json!(0);
        let mut edited = ready_copy(&hub, 1);
        edited["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:edited-3");
        let copies = BTreeMap::from([
            ("east".to_string(), ready_copy(&hub, 5)),
            ("west".to_string(), unready),
            ("north".to_string(), edited),
        ]);
        let problems = template_problems(
            kind,
            &hub,
            Some(&wanted(&[("east", 2), ("west", 1), ("north", 1)])),
            &copies,
        );
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(problems[0].contains("east: spec.replicas 5, the binding says 2"));
        assert!(
            problems[1]
                .contains("north: /spec/template/spec/containers/0/image is \"nginx:edited-3\"")
        );
        assert!(problems[2].contains("west: not Ready: 0/1 ready"));
        let problems =
            template_problems(kind, &hub, Some(&wanted(&[("east", 4)])), &BTreeMap::new());
        assert_eq!(problems, ["no copy in east, which the binding names"]);
        let copies = BTreeMap::from([("north".to_string(), ready_copy(&hub, 4))]);
        let problems = template_problems(kind, &hub, Some(&wanted(&[])), &copies);
        assert_eq!(
            problems,
            ["a copy in north, which the binding does not name"]
        );
        assert_eq!(
            template_problems(kind, &hub, None, &BTreeMap::new()),
            ["no binding"]
        );
    }

    #[test]
    fn claims_stay_where_no_workload_is_and_a_fenced_database_is_not_ready() {
        let claim = template(TemplateKind::Claim, "web-1-data", 0, 0);
        let mut bound = claim.clone();
        bound["status"] = json!({"phase": "Bound"});
        let copies = BTreeMap::from([
            ("east".to_string(), bound.clone()),
            ("west".to_string(), bound),
        ]);
        let kept = template_problems(TemplateKind::Claim, &claim, None, &copies);
        assert!(kept.is_empty(), "{kept:?}");
        let database = template(TemplateKind::Database, "db-1", 1, 0);
        let mut fenced = ready_copy(&database, 1);
        fenced["status"]["phase"] = json!("ReadOnly");
        let copies = BTreeMap::from([("east".to_string(), fenced)]);
        let problems = template_problems(
            TemplateKind::Database,
            &database,
            Some(&wanted(&[("east", 1)])),
            &copies,
        );
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("phase ReadOnly"), "{problems:?}");
    }

    #[test]
    fn leftovers_of_deleted_templates_and_pending_finalizers_are_reported() {
        let hub = template(TemplateKind::StatefulSet, "sts-1", 1, 0);
        let gone = TemplateRef {
            kind: TemplateKind::StatefulSet,
            name: "sts-9".into(),
        };
        let mut deleting_template = hub.clone();
        deleting_template["metadata"]["deletionTimestamp"] = json!("2026-11-30T10:00:00Z");
        deleting_template["metadata"]["finalizers"] = json!([FINALIZER_CLEANUP]);
        let deleting = TemplateRef {
            kind: TemplateKind::StatefulSet,
            name: "sts-1".into(),
        };
        // A claim template Bulkhead is done with: only the API server's own finalizer
        // is left, and its copies are going.
        let claim = TemplateRef {
            kind: TemplateKind::Claim,
            name: "web-1-data".into(),
        };
        let mut claim_template = template(TemplateKind::Claim, "web-1-data", 0, 0);
        claim_template["metadata"]["deletionTimestamp"] = json!("2026-11-30T10:00:00Z");
        claim_template["metadata"]["finalizers"] = json!(["kubernetes.io/pvc-protection"]);
        let mut going = ready_copy(&hub, 1);
        going["metadata"]["deletionTimestamp"] = json!("2026-11-30T10:00:00Z");
        let snapshot = Snapshot {
            templates: BTreeMap::from([
                (deleting.clone(), deleting_template),
                (claim.clone(), claim_template.clone()),
            ]),
            bindings: BTreeMap::from([
                (deleting.clone(), wanted(&[("east", 1)])),
                (claim.clone(), wanted(&[("east", 1)])),
            ]),
            copies: BTreeMap::from([
                (
                    deleting,
                    BTreeMap::from([("east".to_string(), ready_copy(&hub, 1))]),
                ),
                (
                    claim,
                    BTreeMap::from([("east".to_string(), {
                        let mut copy = claim_template;
                        copy["metadata"]["deletionTimestamp"] = json!("2026-11-30T10:00:01Z");
                        copy
                    })]),
                ),
                (
                    gone,
                    BTreeMap::from([
                        ("west".to_string(), ready_copy(&hub, 1)),
                        ("north".to_string(), going),
                    ]),
                ),
            ]),
        };
        let problems = problems(&snapshot);
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(
            problems[0]
                .starts_with("StatefulSet sts-1: deleted by the user, but Bulkhead's finalizer")
        );
        assert!(problems[1].starts_with(
            "StatefulSet sts-1: deleted by the user, but its copy in east is still there"
        ));
        assert!(problems[2].starts_with("StatefulSet sts-9: a copy in west, but no such template"));
    }
}
