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
//! template is about 1 KB, and packed against the texts of the other templates
//! ([`Packer`]) about 150 bytes. Reading one back costs a few microseconds; a reconcile
//! reads its template and its binding once.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::hub::federation::packing::{Packed, Packer, unpack_with};

use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// (namespace, name); the namespace is empty for a cluster-scoped object.
type Key = (String, String);

#[derive(Default)]
struct State {
    objects: HashMap<Key, Packed>,
    /// A relist in progress: what it listed so far (it replaces `objects` when complete).
    relisting: Option<HashMap<Key, Packed>>,
    /// A list has completed at least once.
    ready: bool,
    packer: Packer,
}

impl State {
    /// Packs `text` into `objects`, or into the relist in progress.
    fn keep(&mut self, key: Key, text: &str, relisting: bool) {
        let packed = self.packer.pack(text.as_bytes());
        if relisting {
            self.relisting
                .get_or_insert_with(HashMap::new)
                .insert(key, packed);
        } else {
            self.objects.insert(key, packed);
        }
        if self.packer.due() {
            let mut maps = vec![&mut self.objects];
            if let Some(relisting) = self.relisting.as_mut() {
                maps.push(relisting);
            }
            let dropped = self.packer.renew(&mut maps);
            if dropped > 0 {
                tracing::error!(
                    dropped,
                    "objects could not be read back to pack them again; they are looked at again at their next event"
                );
            }
        }
    }

    fn text(&self, packed: &[u8]) -> Option<String> {
        self.packer.unpack(packed)
    }
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
        let text = |object: &K| -> Option<String> {
            match serde_json::to_string(object) {
                Ok(text) => Some(text),
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
                Some(text) => state.keep(key(object), &text, false),
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
                    state.keep(key(object), &text, true);
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

    /// Reads `P` (the object or a part of it) back from the text of `key`.
    fn parse<P: DeserializeOwned>(
        &self,
        (namespace, name): &Key,
        text: Option<String>,
    ) -> Option<P> {
        let Some(text) = text else {
            tracing::error!(what = self.what, name = %format!("{namespace}/{name}"), "cannot unpack an object's text");
            return None;
        };
        match serde_json::from_str(&text) {
            Ok(object) => Some(object),
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
        let text = {
            let state = self.read();
            state.text(state.objects.get(&key)?)
        };
        self.parse(&key, text).map(Arc::new)
    }

    /// Every object read as `P`, a part of it (serde skips the rest without building
    /// it): for passes over all of them that need a few fields, such as the labels.
    pub fn read_all<P: DeserializeOwned>(&self) -> Vec<P> {
        let mut all = Vec::new();
        self.each(|part: P| all.push(part));
        all
    }

    /// Calls `f` with every object read as `P` (the object or a part of it), one at a
    /// time: the packed texts are copied under the store's lock, and each is unpacked and
    /// parsed after it when its turn comes, so a pass over 10,000 objects holds one parsed
    /// object at a time.
    pub fn each<P: DeserializeOwned>(&self, mut f: impl FnMut(P)) {
        let (dictionary, packed): (Arc<[u8]>, Vec<(Key, Packed)>) = {
            let state = self.read();
            (
                state.packer.dictionary(),
                state
                    .objects
                    .iter()
                    .map(|(key, packed)| (key.clone(), packed.clone()))
                    .collect(),
            )
        };
        for (key, packed) in packed {
            if let Some(part) = self.parse(&key, unpack_with(&dictionary, &packed)) {
                f(part);
            }
        }
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
        let all: Vec<DynamicObject> = store.read_all();
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
    fn many_objects_read_back_the_same_across_dictionary_renewals_and_a_relist() {
        let store = TextStore::<DynamicObject>::new("copy");
        let named = |i: usize| object(&format!("web-{i:04}"), (i % 4) as i64);
        store.apply(&watcher::Event::Init);
        for i in 0..150 {
            store.apply(&watcher::Event::InitApply(named(i)));
        }
        store.apply(&watcher::Event::InitDone);
        for i in 150..400 {
            store.apply(&watcher::Event::Apply(named(i)));
        }
        // A relist half done: the packer renews its dictionary while two maps are held.
        store.apply(&watcher::Event::Init);
        for i in 0..200 {
            store.apply(&watcher::Event::InitApply(named(i)));
        }
        for i in 0..400 {
            assert_eq!(
                *store.get("shop", &format!("web-{i:04}")).unwrap(),
                named(i)
            );
        }
        store.apply(&watcher::Event::InitDone);
        assert_eq!(store.len(), 200);
        for i in 0..200 {
            assert_eq!(
                *store.get("shop", &format!("web-{i:04}")).unwrap(),
                named(i)
            );
        }
        assert!(store.get("shop", "web-0300").is_none(), "not listed again");
        assert_eq!(store.read_all::<DynamicObject>().len(), 200);
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
