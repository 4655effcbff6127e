//! [`TextStore`]: what one watch delivered, kept as a reflector's store keeps it, but each
//! object as its compact JSON text, parsed again when it is read.
//!
//! The hub holds one object per template of every federated kind, one binding per
//! template and one copy summary per template and member. As parsed objects, each small
//! JSON map (labels, `spec`, `status`, every condition) is a B-tree leaf of 540-630 bytes
//! however few entries it holds, and kube's reflector store adds an index entry per
//! object that repeats the kind's `ApiResource` (five strings). Measured with heaptrack
//! on a fresh hub over 1,000 Deployment templates (docs/benchmarks.md, session 11): 3.8 KB
//! per template object, 2.6 KB per binding, 1.9 KB of index per template. As text a
//! template is under 1 KB. Reading one back costs a few microseconds; a reconcile reads
//! its template and its binding once.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// (namespace, name); the namespace is empty for a cluster-scoped object.
type Key = (String, String);

#[derive(Default)]
struct State {
    objects: HashMap<Key, Arc<str>>,
    /// A relist in progress: what it listed so far (it replaces `objects` when complete).
    relisting: Option<HashMap<Key, Arc<str>>>,
    /// A list has completed at least once.
    ready: bool,
}

/// The objects one watch delivered: an applied object replaces the one before, a deleted
/// one goes, a relist replaces everything once it is complete. Cheap to clone (clones
/// share the content).
pub struct TextStore<K> {
    state: Arc<RwLock<State>>,
    /// What the objects are, for the log ("template", "binding", "copy").
    what: &'static str,
    _kind: PhantomData<fn() -> K>,
}

impl<K> Clone for TextStore<K> {
    fn clone(&self) -> Self {
        TextStore {
            state: self.state.clone(),
            what: self.what,
            _kind: PhantomData,
        }
    }
}

impl<K> TextStore<K>
where
    K: Resource + Serialize + DeserializeOwned,
{
    pub fn new(what: &'static str) -> Self {
        TextStore {
            state: Arc::default(),
            what,
            _kind: PhantomData,
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies one watch event, as a reflector's store does.
    pub fn apply(&self, event: &watcher::Event<K>) {
        let key = |object: &K| (object.namespace().unwrap_or_default(), object.name_any());
        let text = |object: &K| -> Option<Arc<str>> {
            match serde_json::to_string(object) {
                Ok(text) => Some(Arc::from(text)),
                Err(error) => {
                    // Not expected (it was just read from JSON). Without it the object is
                    // not known to the hub: a template or binding is looked at again at
                    // its next event, and a copy that is not known is applied again,
                    // never deleted.
                    tracing::error!(what = self.what, name = %object.name_any(), %error, "cannot keep an object as text");
                    None
                }
            }
        };
        let mut state = self.write();
        match event {
            watcher::Event::Apply(object) => match text(object) {
                Some(text) => {
                    state.objects.insert(key(object), text);
                }
                None => {
                    state.objects.remove(&key(object));
                }
            },
            watcher::Event::Delete(object) => {
                state.objects.remove(&key(object));
            }
            watcher::Event::Init => state.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(object) => {
                if let Some(text) = text(object) {
                    state
                        .relisting
                        .get_or_insert_with(HashMap::new)
                        .insert(key(object), text);
                }
            }
            watcher::Event::InitDone => {
                let mut listed = state.relisting.take().unwrap_or_default();
                listed.shrink_to_fit();
                state.objects = listed;
                state.ready = true;
            }
        }
    }

    fn parse(&self, (namespace, name): &Key, text: &str) -> Option<Arc<K>> {
        match serde_json::from_str(text) {
            Ok(object) => Some(Arc::new(object)),
            Err(error) => {
                tracing::error!(what = self.what, name = %format!("{namespace}/{name}"), %error, "cannot read an object back from its text");
                None
            }
        }
    }

    /// The object `namespace/name` (namespace empty for a cluster-scoped one), as last
    /// seen.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let key = (namespace.to_string(), name.to_string());
        let text = self.read().objects.get(&key)?.clone();
        self.parse(&key, &text)
    }

    /// Every object, as last seen (each parsed: for passes over all of them).
    pub fn state(&self) -> Vec<Arc<K>> {
        let texts: Vec<(Key, Arc<str>)> = self
            .read()
            .objects
            .iter()
            .map(|(key, text)| (key.clone(), text.clone()))
            .collect();
        texts
            .iter()
            .filter_map(|(key, text)| self.parse(key, text))
            .collect()
    }

    /// Every object read as `P`, a part of it (serde skips the rest without building
    /// it): for passes over all of them that need a few fields, such as the labels.
    pub fn read_all<P: DeserializeOwned>(&self) -> Vec<P> {
        let texts: Vec<Arc<str>> = self.read().objects.values().cloned().collect();
        texts
            .iter()
            .filter_map(|text| match serde_json::from_str(text) {
                Ok(part) => Some(part),
                Err(error) => {
                    tracing::error!(what = self.what, %error, "cannot read an object back from its text");
                    None
                }
            })
            .collect()
    }

    /// The (namespace, name) of every object, without reading them.
    pub fn keys(&self) -> Vec<(String, String)> {
        self.read().objects.keys().cloned().collect()
    }

    /// A list has completed at least once.
    pub fn ready(&self) -> bool {
        self.read().ready
    }

    /// Objects held.
    pub fn len(&self) -> usize {
        self.read().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::DynamicObject;
    use serde_json::json;

    fn object(name: &str, ready: i64) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "shop", "uid": "u", "resourceVersion": "7",
                         "labels": {"app": "web"}},
            "spec": {"replicas": 3},
            "status": {"replicas": 3, "readyReplicas": ready,
                       "conditions": [{"type": "Available", "status": "True"}]}
        }))
        .unwrap()
    }

    #[test]
    fn a_text_store_reads_back_what_it_was_given() {
        let store = TextStore::<DynamicObject>::new("template");
        let web = object("web", 2);
        store.apply(&watcher::Event::Apply(web.clone()));
        let back = store.get("shop", "web").expect("kept");
        assert_eq!(*back, web);
        assert!(store.get("shop", "api").is_none());
        assert!(store.get("other", "web").is_none());
        assert_eq!(store.keys(), vec![("shop".to_string(), "web".to_string())]);
        // A later version replaces it; a deletion removes it.
        let newer = object("web", 3);
        store.apply(&watcher::Event::Apply(newer.clone()));
        assert_eq!(*store.get("shop", "web").unwrap(), newer);
        assert_eq!(store.len(), 1);
        store.apply(&watcher::Event::Delete(newer));
        assert!(store.get("shop", "web").is_none());
        assert!(store.is_empty());
    }

    #[test]
    fn a_text_store_is_ready_after_its_first_list_and_a_relist_replaces_it_when_complete() {
        let store = TextStore::<DynamicObject>::new("copy");
        assert!(!store.ready(), "nothing listed yet");
        store.apply(&watcher::Event::Init);
        store.apply(&watcher::Event::InitApply(object("web", 1)));
        assert!(!store.ready(), "the list is not complete");
        assert!(
            store.get("shop", "web").is_none(),
            "a list shows when complete"
        );
        store.apply(&watcher::Event::InitDone);
        assert!(store.ready());
        assert!(store.get("shop", "web").is_some());
        // A relist (after a partition, say): the old content stays until it completes,
        // then what it did not list is gone.
        store.apply(&watcher::Event::Init);
        store.apply(&watcher::Event::InitApply(object("api", 1)));
        assert!(store.get("shop", "web").is_some(), "kept while relisting");
        assert!(store.get("shop", "api").is_none());
        assert!(store.ready(), "still ready while relisting");
        store.apply(&watcher::Event::InitDone);
        assert!(store.get("shop", "web").is_none());
        let all = store.state();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].name_any(), "api");
    }

    #[test]
    fn a_text_store_reads_a_part_of_every_object() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Labels {
            metadata: kube::api::ObjectMeta,
        }
        let store = TextStore::<DynamicObject>::new("template");
        store.apply(&watcher::Event::Apply(object("web", 1)));
        let parts: Vec<Labels> = store.read_all();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].metadata.name.as_deref(), Some("web"));
        assert_eq!(parts[0].metadata.labels.as_ref().unwrap()["app"], "web");
    }

    #[test]
    fn a_cluster_scoped_object_is_kept_under_an_empty_namespace() {
        let store = TextStore::<DynamicObject>::new("template");
        let mut role = object("reader", 1);
        role.metadata.namespace = None;
        store.apply(&watcher::Event::Apply(role.clone()));
        assert_eq!(*store.get("", "reader").unwrap(), role);
    }
}
