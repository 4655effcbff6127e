//! The federation's primary terms (DESIGN.md section 6, replica clusters): the hub lists
//! its MyDatabase templates and keeps the `status.primaryTerm` of each that a switchover
//! or a disaster promotion raised above 1. The fencing Lease carries them to every member (`lease`): a
//! copy written under a lower term is deposed there and never takes a write, even after
//! its cluster comes back from the partition that lost it the primary.
//!
//! The Lease is not renewed before the first complete list: a renewal without the terms
//! would unfence a deposed primary.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::hub::membership::evidence::Carried;

/// `namespace/name` -> primary term, for every template whose term is above 1; None until
/// the templates were listed once. Clones share one value; a renewal task waits on it
/// ([`Terms::changed_from`]) so that a raised term goes out at once.
#[derive(Clone, Debug)]
pub struct Terms(Arc<watch::Sender<Carried>>);

impl Default for Terms {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(Arc::new(None))))
    }
}

impl Terms {
    /// The terms as last published.
    pub fn load_full(&self) -> Carried {
        self.0.borrow().clone()
    }

    /// Publishes `terms`, waking every task waiting for a change.
    pub fn store(&self, terms: Carried) {
        self.0.send_replace(terms);
    }

    /// Returns once the published terms differ from `carried`.
    pub async fn changed_from(&self, carried: &Carried) {
        let mut published = self.0.subscribe();
        // The sender lives as long as `self`: waiting cannot fail.
        let _ = published.wait_for(|now| now != carried).await;
    }
}

/// The primary term a hub template's status records, when above 1. A template being
/// deleted keeps its term in every Lease: its cleanup finalizer holds it until every copy
/// is gone, the copy in a cluster that comes back after a promotion included, and that
/// copy is deposed (never primary) until the hub has deleted it.
fn raised_term(template: &DynamicObject) -> Option<u64> {
    template.data["status"]["primaryTerm"]
        .as_u64()
        .filter(|term| *term > 1)
}

fn key(template: &DynamicObject) -> String {
    format!(
        "{}/{}",
        template.namespace().unwrap_or_default(),
        template.name_any()
    )
}

/// Keeps `terms` up to date until `shutdown`. Without the MyDatabase CRD on the hub there
/// is no term to carry: the terms are published empty.
pub async fn run(hub: Client, terms: Terms, shutdown: CancellationToken) {
    let resource = ApiResource::erase::<crate::api::MyDatabase>(&());
    let api: Api<DynamicObject> = Api::all_with(hub, &resource);
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut listing: BTreeMap<String, u64> = BTreeMap::new();
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            event = events.next() => event,
        };
        match event {
            Some(Ok(Event::Init)) => listing.clear(),
            Some(Ok(Event::InitApply(template))) => {
                if let Some(term) = raised_term(&template) {
                    listing.insert(key(&template), term);
                }
            }
            Some(Ok(Event::InitDone)) => {
                seen = std::mem::take(&mut listing);
                terms.store(Arc::new(Some(seen.clone())));
            }
            Some(Ok(Event::Apply(template))) => {
                let changed = match raised_term(&template) {
                    Some(term) => seen.insert(key(&template), term) != Some(term),
                    None => seen.remove(&key(&template)).is_some(),
                };
                if changed {
                    terms.store(Arc::new(Some(seen.clone())));
                }
            }
            Some(Ok(Event::Delete(template))) => {
                if seen.remove(&key(&template)).is_some() {
                    terms.store(Arc::new(Some(seen.clone())));
                }
            }
            Some(Err(error)) => {
                // Without the CRD (or the right to list it) the hub federates no
                // MyDatabase and knows of no term: fencing every member for it would be
                // worse than carrying none.
                let missing = matches!(
                    &error,
                    watcher::Error::InitialListFailed(kube::Error::Api(status))
                        if status.code == 404 || status.code == 403
                );
                if missing && terms.load_full().is_none() {
                    tracing::warn!(%error, "cannot list MyDatabase templates on the hub: the fencing Lease carries no primary terms");
                    terms.store(Arc::new(Some(BTreeMap::new())));
                } else if !missing {
                    tracing::warn!(%error, "listing the MyDatabase templates' primary terms failed; retrying");
                }
            }
            None => return,
        }
    }
}

/// The Lease annotation's value: the terms as a JSON object; None when there are none.
pub fn annotation(terms: &BTreeMap<String, u64>) -> Option<String> {
    (!terms.is_empty()).then(|| serde_json::to_string(terms).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_being_deleted_keeps_its_raised_term() {
        let template: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "MyDatabase",
            "metadata": {"name": "orders", "namespace": "shop",
                         "deletionTimestamp": "2026-12-07T00:00:00Z",
                         "finalizers": [crate::api::FINALIZER_CLEANUP]},
            "status": {"primaryTerm": 2}}))
        .unwrap();
        assert_eq!(raised_term(&template), Some(2));
        assert_eq!(key(&template), "shop/orders");
        let mut first = template.clone();
        first.data["status"]["primaryTerm"] = serde_json::json!(1);
        assert_eq!(raised_term(&first), None, "1 is every copy's term");
        assert_eq!(
            annotation(&BTreeMap::from([("shop/orders".to_string(), 2)])).as_deref(),
            Some(r#"{"shop/orders":2}"#)
        );
        assert_eq!(annotation(&BTreeMap::new()), None);
    }
}
