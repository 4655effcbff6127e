//! The revisions of templates whose policy has a rollout: one ControllerRevision per
//! distinct content, in the template's namespace on the hub, owned by the template (the
//! garbage collector removes them with it), labelled with the binding
//! ([`LABEL_REVISION_OF`]). The content is what the copies are built from, without the
//! replica count (a scale is no new revision) and without status or server metadata.
//!
//! The leader keeps what it listed or wrote in memory; a new leader lists them again
//! before it gives a number, so numbers only grow.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Map, Value};

use crate::api::rollout::LABEL_REVISION_OF;
use crate::hub::federation::interpreter::Interpretation;
use crate::hub::federation::writer::ObjectKey;

/// One stored revision.
#[derive(Clone, Debug)]
pub struct Revision {
    pub number: i64,
    pub hash: String,
    pub content: Arc<Value>,
    pub name: String,
}

/// The leader's memory of the revisions it listed or wrote, per template.
#[derive(Default)]
pub struct RevisionStore {
    templates: Mutex<HashMap<ObjectKey, Vec<Revision>>>,
}

/// A template's revision content: apiVersion, kind, name, namespace, labels, annotations
/// and every top-level field but status, with the replica count taken out.
pub fn revision_content(template: &Value, interpretation: &Interpretation) -> Value {
    let mut content = Map::new();
    for (key, value) in template.as_object().into_iter().flatten() {
        if key != "status" && key != "metadata" {
            content.insert(key.clone(), value.clone());
        }
    }
    let mut metadata = Map::new();
    for field in ["name", "namespace", "labels"] {
        if let Some(value) = template["metadata"].get(field) {
            metadata.insert(field.into(), value.clone());
        }
    }
    if let Some(annotations) = template["metadata"]["annotations"].as_object() {
        let kept: Map<String, Value> = annotations
            .iter()
            .filter(|(key, _)| {
                key.as_str() != "kubectl.kubernetes.io/last-applied-configuration"
                    && key.as_str() != crate::api::rollout::ANNOTATION_ROLLOUT_COMMAND
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !kept.is_empty() {
            metadata.insert("annotations".into(), Value::Object(kept));
        }
    }
    content.insert("metadata".into(), Value::Object(metadata));
    let mut content = Value::Object(content);
    if let Some(path) = &interpretation.replicas {
        path.remove(&mut content);
    }
    content
}

/// The template a cluster's copy of an older revision is built from: its content with
/// the template's current replica count (a scale applies to every revision).
pub fn template_of(content: &Value, template: &Value, interpretation: &Interpretation) -> Value {
    let mut built = content.clone();
    if let Some(path) = &interpretation.replicas
        && let Some(replicas) = path.get(template)
    {
        path.set(&mut built, replicas.clone());
    }
    // Identity comes from the template as it is now (its UID names the owner).
    built["metadata"]["uid"] = template["metadata"]["uid"].clone();
    built
}

/// The hash that tells revisions apart (stable across processes: keys are sorted).
pub fn content_hash(content: &Value) -> String {
    format!(
        "{:016x}",
        crate::hub::federation::placement::stable_hash(&content.to_string(), "revision")
    )
}

impl RevisionStore {
    /// Forgets everything (leadership changed: another leader may have written some).
    pub fn forget(&self) {
        self.templates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// The content of revision `number` of a template, if known.
    pub fn content(&self, key: &ObjectKey, number: i64) -> Option<Arc<Value>> {
        self.templates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)?
            .iter()
            .find(|r| r.number == number)
            .map(|r| r.content.clone())
    }

    /// The numbers of the revisions kept, oldest first.
    pub fn numbers(&self, key: &ObjectKey) -> Vec<i64> {
        let mut numbers: Vec<i64> = self
            .templates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .map(|list| list.iter().map(|r| r.number).collect())
            .unwrap_or_default();
        numbers.sort_unstable();
        numbers
    }

    /// The number of the revision with `content`: an existing one, or a new one written
    /// now (the highest number so far plus one). Then prunes the oldest revisions past
    /// `keep`, never one of `protect`.
    #[allow(clippy::too_many_arguments)]
    pub async fn ensure(
        &self,
        hub: &Client,
        key: &ObjectKey,
        binding: &str,
        owner: &OwnerReference,
        content: Value,
        keep: usize,
        protect: &[i64],
    ) -> Result<i64, kube::Error> {
        let api: Api<ControllerRevision> = Api::namespaced(hub.clone(), &key.namespace);
        let label = crate::hub::federation::copies::binding_label(&key.namespace, binding);
        let hash = content_hash(&content);
        let content = Arc::new(content);
        for attempt in 0..2 {
            let known = self
                .templates
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(key)
                .cloned();
            let list = match known {
                Some(list) if attempt == 0 => list,
                _ => {
                    let listed = api
                        .list(
                            &ListParams::default().labels(&format!("{LABEL_REVISION_OF}={label}")),
                        )
                        .await?;
                    let list: Vec<Revision> = listed.items.into_iter().filter_map(read).collect();
                    self.templates
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(key.clone(), list.clone());
                    list
                }
            };
            if let Some(found) = list.iter().find(|r| r.hash == hash) {
                return Ok(found.number);
            }
            let number = list.iter().map(|r| r.number).max().unwrap_or(0) + 1;
            let mut prefix = binding.to_string();
            prefix.truncate(230);
            let name = format!("{prefix}-{}", &hash[..10]);
            let object = ControllerRevision {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(key.namespace.clone()),
                    labels: Some([(LABEL_REVISION_OF.to_string(), label.clone())].into()),
                    annotations: Some([(REVISION_HASH.to_string(), hash.clone())].into()),
                    owner_references: Some(vec![owner.clone()]),
                    ..Default::default()
                },
                data: Some(RawExtension((*content).clone())),
                revision: number,
            };
            match api.create(&PostParams::default(), &object).await {
                Ok(_) => {
                    let prune = {
                        let mut templates =
                            self.templates.lock().unwrap_or_else(|p| p.into_inner());
                        let list = templates.entry(key.clone()).or_default();
                        list.push(Revision {
                            number,
                            hash: hash.clone(),
                            content: content.clone(),
                            name,
                        });
                        let mut protected = protect.to_vec();
                        protected.push(number);
                        prunable(list, keep, &protected)
                    };
                    for (number, name) in prune {
                        match api.delete(&name, &DeleteParams::default()).await {
                            Ok(_) => self.drop_revision(key, number),
                            Err(error) => {
                                tracing::debug!(revision = %name, %error, "cannot prune an old revision (tried again at the next one)")
                            }
                        }
                    }
                    return Ok(number);
                }
                // Written meanwhile (by this hub before a restart, or another leader).
                Err(kube::Error::Api(status)) if status.code == 409 && attempt == 0 => continue,
                Err(error) => return Err(error),
            }
        }
        Err(kube::Error::Api(Box::new(kube::core::Status {
            code: 409,
            message: "the template's revisions changed while a new one was written".into(),
            ..Default::default()
        })))
    }

    fn drop_revision(&self, key: &ObjectKey, number: i64) {
        if let Some(list) = self
            .templates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(key)
        {
            list.retain(|r| r.number != number);
        }
    }
}

/// Annotation on a ControllerRevision: the hash of its content.
const REVISION_HASH: &str = "federation.example.com/revision-hash";

fn read(revision: ControllerRevision) -> Option<Revision> {
    let content = revision.data?.0;
    let hash = revision
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REVISION_HASH).cloned())
        .unwrap_or_else(|| content_hash(&content));
    Some(Revision {
        number: revision.revision,
        hash,
        content: Arc::new(content),
        name: revision.metadata.name?,
    })
}

/// The revisions to delete so that at most `keep` stay: the oldest first, never one of
/// `protect` (the rollout's revision, its stable one, any a cluster is assigned).
fn prunable(list: &[Revision], keep: usize, protect: &[i64]) -> Vec<(i64, String)> {
    let mut candidates: Vec<&Revision> = list
        .iter()
        .filter(|r| !protect.contains(&r.number))
        .collect();
    candidates.sort_by_key(|r| r.number);
    let excess = list.len().saturating_sub(keep.max(2));
    candidates
        .into_iter()
        .take(excess)
        .map(|r| (r.number, r.name.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(replicas: i64, image: &str) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "9",
                "generation": 4, "labels": {"app": "web"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "team": "a"}},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "web", "image": image}]}}},
            "status": {"readyReplicas": 2}
        })
    }

    fn interpretation() -> Arc<Interpretation> {
        crate::hub::federation::interpreter::Interpreters::built_in().get("apps/v1", "Deployment")
    }

    #[test]
    fn a_scale_is_no_new_revision_and_an_old_revision_takes_the_current_count() {
        let interpretation = interpretation();
        let v1 = revision_content(&deployment(3, "web:1"), &interpretation);
        assert_eq!(
            content_hash(&v1),
            content_hash(&revision_content(&deployment(9, "web:1"), &interpretation))
        );
        assert_ne!(
            content_hash(&v1),
            content_hash(&revision_content(&deployment(3, "web:2"), &interpretation))
        );
        assert!(v1.get("status").is_none() && v1["metadata"].get("resourceVersion").is_none());
        assert_eq!(v1["metadata"]["annotations"], json!({"team": "a"}));
        assert!(v1["spec"].get("replicas").is_none());
        let built = template_of(&v1, &deployment(7, "web:2"), &interpretation);
        assert_eq!(built["spec"]["replicas"], 7);
        assert_eq!(
            built["spec"]["template"]["spec"]["containers"][0]["image"],
            "web:1"
        );
        assert_eq!(built["metadata"]["uid"], "u1");
    }

    #[test]
    fn pruning_keeps_the_newest_and_the_protected() {
        let list: Vec<Revision> = (1..=6)
            .map(|number| Revision {
                number,
                hash: format!("h{number}"),
                content: Arc::new(Value::Null),
                name: format!("web-{number}"),
            })
            .collect();
        assert_eq!(
            prunable(&list, 3, &[1, 6]),
            vec![
                (2, "web-2".to_string()),
                (3, "web-3".to_string()),
                (4, "web-4".to_string())
            ]
        );
        assert!(prunable(&list, 10, &[]).is_empty());
    }
}
