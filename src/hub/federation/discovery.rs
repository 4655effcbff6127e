//! Which template kinds the hub federates (issue #17, docs/interpreters.md): any
//! namespaced kind the hub API server serves that a policy selects or a binding names.
//! Kinds are found by discovery and checked with access reviews before they are watched;
//! the federation controller runs over that set and is restarted when it changes (a
//! policy selects a new kind, a CRD arrives, a `ResourceInterpreter` changes how a kind is
//! read). A kind no policy selects is not watched at all, so the hub keeps nothing of the
//! ConfigMaps, Secrets and Services it does not federate.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::StreamExt;
use k8s_openapi::api::authorization::v1::ResourceAttributes;
use kube::api::{ApiResource, Patch, PatchParams};
use kube::discovery::Scope;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::api::resource_interpreter::ResourceInterpreter;
use crate::api::{
    ClusterPropagationPolicy, ConditionStatus, PropagationPolicy, new_condition, set_condition,
};
use crate::hub::federation::copy_cache::Kinds;
use crate::hub::federation::interpreter::{Interpreters, Verdict, group_of};

/// A kind as a policy or a binding names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gvk {
    pub api_version: String,
    pub kind: String,
}

impl Gvk {
    pub fn new(api_version: &str, kind: &str) -> Gvk {
        Gvk {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        }
    }

    fn group_kind(&self) -> (String, String) {
        (group_of(&self.api_version).to_string(), self.kind.clone())
    }
}

/// The kinds the policies select, and when a policy propagates dependencies, the kinds
/// dependencies can be (a pod template's, and those the interpreters' reference fields
/// name).
pub fn selected_kinds(
    policies: &[Arc<PropagationPolicy>],
    cluster_policies: &[Arc<ClusterPropagationPolicy>],
    interpreters: &Interpreters,
) -> BTreeSet<Gvk> {
    let selectors = policies
        .iter()
        .flat_map(|p| p.spec.resource_selectors.iter())
        .chain(
            cluster_policies
                .iter()
                .flat_map(|p| p.spec.resource_selectors.iter()),
        );
    let mut kinds: BTreeSet<Gvk> = selectors
        .map(|s| Gvk::new(&s.api_version, &s.kind))
        .collect();
    let propagates = policies.iter().any(|p| p.spec.propagate_deps)
        || cluster_policies
            .iter()
            .any(|p| p.spec.policy.propagate_deps);
    if propagates {
        kinds.extend(
            crate::hub::federation::follow::DEPENDENCY_KINDS
                .iter()
                .map(|(api_version, kind)| Gvk::new(api_version, kind)),
        );
        kinds.extend(
            interpreters
                .referenced_kinds()
                .iter()
                .map(|(api_version, kind)| Gvk::new(api_version, kind)),
        );
    }
    kinds
}

/// Why a kind is not federated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub kind: Gvk,
    pub reason: String,
}

/// One kind per group and kind (the first version named wins: the same object seen
/// through two versions would be two templates).
fn one_version_per_kind(wanted: &BTreeSet<Gvk>) -> Vec<Gvk> {
    let mut seen = BTreeSet::new();
    wanted
        .iter()
        .filter(|gvk| seen.insert(gvk.group_kind()))
        .cloned()
        .collect()
}

/// Verbs the hub needs on a template kind: reading it, its finalizer, its status.
fn needed_access(resource: &ApiResource) -> Vec<ResourceAttributes> {
    let attributes = |verb: &str, subresource: Option<&str>| ResourceAttributes {
        group: Some(resource.group.clone()),
        resource: Some(resource.plural.clone()),
        subresource: subresource.map(str::to_string),
        verb: Some(verb.to_string()),
        ..Default::default()
    };
    vec![
        attributes("list", None),
        attributes("watch", None),
        attributes("patch", None),
    ]
}

/// Finds the kind on the hub API server and checks the hub may federate it.
async fn resolve(client: &Client, gvk: &Gvk) -> Result<ApiResource, String> {
    let (group, version) = match gvk.api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", gvk.api_version.as_str()),
    };
    let wanted = kube::api::GroupVersionKind::gvk(group, version, &gvk.kind);
    let (resource, capabilities) = kube::discovery::pinned_kind(client, &wanted)
        .await
        .map_err(|error| {
            format!(
                "the hub API server does not serve {} {} ({error}): install its CRD on the hub, or fix the selector's apiVersion and kind",
                gvk.api_version, gvk.kind
            )
        })?;
    if capabilities.scope != Scope::Namespaced {
        return Err(format!(
            "{} {} is cluster-scoped: only namespaced kinds are federated",
            gvk.api_version, gvk.kind
        ));
    }
    match crate::access::denied(client, needed_access(&resource)).await {
        Ok(denied) if denied.is_empty() => Ok(resource),
        Ok(denied) => Err(format!(
            "the hub may not {} on the hub: grant it (chart value `federatedResources`, docs/operations.md)",
            denied.join(", ")
        )),
        Err(error) => Err(format!("cannot check the hub's access: {error:#}")),
    }
}

/// Resolves every wanted kind: the ones the hub can federate, and why the others not.
async fn resolve_all(
    client: &Client,
    wanted: &BTreeSet<Gvk>,
    cache: &mut BTreeMap<Gvk, ApiResource>,
) -> (Vec<ApiResource>, Vec<Refusal>) {
    let mut resources = vec![];
    let mut refused = vec![];
    for gvk in one_version_per_kind(wanted) {
        if let Some(resource) = cache.get(&gvk) {
            resources.push(resource.clone());
            continue;
        }
        match resolve(client, &gvk).await {
            Ok(resource) => {
                cache.insert(gvk, resource.clone());
                resources.push(resource);
            }
            Err(reason) => refused.push(Refusal { kind: gvk, reason }),
        }
    }
    (resources, refused)
}

/// The kinds with how each is read.
pub fn kinds(resources: &[ApiResource], interpreters: &Interpreters) -> Kinds {
    resources
        .iter()
        .map(|resource| {
            (
                resource.clone(),
                interpreters.get(&resource.api_version, &resource.kind),
            )
        })
        .collect::<Vec<_>>()
        .into()
}

/// Whether two kind sets read every kind alike.
fn same_kinds(a: &Kinds, b: &Kinds) -> bool {
    a.len() == b.len()
        && a.iter().zip(b.iter()).all(|((ra, ia), (rb, ib))| {
            ra.api_version == rb.api_version && ra.kind == rb.kind && ia == ib
        })
}

/// Writes each `ResourceInterpreter`'s `Accepted` condition when it changed.
async fn report_verdicts(
    client: &Client,
    store: &Store<ResourceInterpreter>,
    verdicts: &[Verdict],
) {
    let api: Api<ResourceInterpreter> = Api::all(client.clone());
    for verdict in verdicts {
        let Some(resource) = store
            .state()
            .into_iter()
            .find(|r| r.name_any() == verdict.name)
        else {
            continue;
        };
        let mut conditions = resource
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let condition = match &verdict.accepted {
            Ok(()) => new_condition(
                "Accepted",
                ConditionStatus::True,
                "Accepted",
                format!("the hub reads {} this way", resource.spec.target.kind),
                resource.metadata.generation,
            ),
            Err(message) => new_condition(
                "Accepted",
                ConditionStatus::False,
                "Invalid",
                message.clone(),
                resource.metadata.generation,
            ),
        };
        if !set_condition(&mut conditions, condition) {
            continue;
        }
        let patch = json!({"status": {"conditions": conditions}});
        if let Err(error) = api
            .patch_status(
                &verdict.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            tracing::warn!(interpreter = %verdict.name, %error, "cannot write the interpreter's status");
        }
    }
}

/// What the running controller tells the supervisor: a binding names a kind it does
/// not watch.
pub type KindNeeds = mpsc::UnboundedSender<Gvk>;

/// How often kinds that could not be federated are looked up again (a CRD installed
/// later, a permission granted later).
const RETRY_REFUSED: Duration = Duration::from_secs(10);

/// Changes are gathered this long before the kind set is recomputed.
const SETTLE: Duration = Duration::from_millis(500);

/// The hub's watches of what decides the kind set.
struct Inputs {
    client: Client,
    policies: Store<PropagationPolicy>,
    cluster_policies: Store<ClusterPropagationPolicy>,
    interpreters: Store<ResourceInterpreter>,
    /// Kinds a binding named that no policy selects (any more).
    named_by_bindings: BTreeSet<Gvk>,
    /// Kinds found so far. They stay federated until the hub restarts: a kind whose
    /// policy went still has templates with the hub's finalizer and bindings to clean.
    resolved: BTreeMap<Gvk, ApiResource>,
}

impl Inputs {
    fn ready(&self) -> bool {
        futures::FutureExt::now_or_never(self.policies.wait_until_ready()).is_some()
            && futures::FutureExt::now_or_never(self.cluster_policies.wait_until_ready()).is_some()
            && futures::FutureExt::now_or_never(self.interpreters.wait_until_ready()).is_some()
    }

    /// The kinds to federate, sorted by group and kind, and why others are not.
    async fn compute(&mut self) -> (Kinds, Vec<Refusal>, Vec<Verdict>) {
        let (interpreters, verdicts) = Interpreters::with_resources(&self.interpreters.state());
        let mut wanted = selected_kinds(
            &self.policies.state(),
            &self.cluster_policies.state(),
            &interpreters,
        );
        wanted.extend(self.named_by_bindings.iter().cloned());
        wanted.extend(self.resolved.keys().cloned());
        let (mut resources, refused) = resolve_all(&self.client, &wanted, &mut self.resolved).await;
        resources.sort_by(|a, b| (&a.group, &a.kind).cmp(&(&b.group, &b.kind)));
        (kinds(&resources, &interpreters), refused, verdicts)
    }
}

/// Runs `controller` over the kinds to federate, and again over the new set whenever it
/// changes, until shutdown.
pub async fn supervise<F, Fut>(
    client: Client,
    refusals: Arc<ArcSwap<Vec<Refusal>>>,
    shutdown: CancellationToken,
    mut controller: F,
) where
    F: FnMut(Kinds, KindNeeds, CancellationToken) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (policies, policy_events) = watch_all(Api::<PropagationPolicy>::all(client.clone()));
    let (cluster_policies, cluster_policy_events) =
        watch_all(Api::<ClusterPropagationPolicy>::all(client.clone()));
    let (interpreter_store, interpreter_events) =
        watch_all(Api::<ResourceInterpreter>::all(client.clone()));
    let mut changes =
        futures::stream::select_all([policy_events, cluster_policy_events, interpreter_events]);
    let mut inputs = Inputs {
        client: client.clone(),
        policies,
        cluster_policies,
        interpreters: interpreter_store,
        named_by_bindings: BTreeSet::new(),
        resolved: BTreeMap::new(),
    };
    let (needs, mut needed) = mpsc::unbounded_channel::<Gvk>();
    let mut reported: Vec<String> = vec![];
    // Nothing is decided before the policies and interpreters are listed.
    while !inputs.ready() {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = changes.next() => {}
        }
    }
    let (mut running, mut refused, mut verdicts) = inputs.compute().await;
    refusals.store(Arc::new(refused.clone()));
    loop {
        report_verdicts(&client, &inputs.interpreters, &verdicts).await;
        let messages: Vec<String> = refused
            .iter()
            .map(|r| format!("{} {}: {}", r.kind.api_version, r.kind.kind, r.reason))
            .collect();
        if messages != reported {
            for message in &messages {
                tracing::warn!(kind = %message, "a selected kind is not federated");
            }
            reported = messages;
        }
        tracing::info!(
            kinds = %running.iter().map(|(r, i)| format!("{}/{} ({})", r.api_version, r.kind, i.source)).collect::<Vec<_>>().join(", "),
            "federating"
        );
        let term = shutdown.child_token();
        let task = controller(running.clone(), needs.clone(), term.clone());
        tokio::pin!(task);
        // Until the controller ends, look for a different kind set.
        let next = loop {
            let retry = if refused.is_empty() {
                Duration::from_secs(3600)
            } else {
                RETRY_REFUSED
            };
            tokio::select! {
                _ = &mut task => break None,
                Some(gvk) = needed.recv() => {
                    if !inputs.named_by_bindings.insert(gvk) {
                        continue;
                    }
                }
                Some(()) = changes.next() => tokio::time::sleep(SETTLE).await,
                _ = tokio::time::sleep(retry) => {}
            }
            let (kinds, now_refused, now_verdicts) = inputs.compute().await;
            if now_verdicts != verdicts {
                report_verdicts(&client, &inputs.interpreters, &now_verdicts).await;
                verdicts = now_verdicts;
            }
            refused = now_refused;
            if **refusals.load() != refused {
                refusals.store(Arc::new(refused.clone()));
            }
            if !same_kinds(&kinds, &running) {
                break Some(kinds);
            }
        };
        let Some(kinds) = next else {
            return;
        };
        tracing::info!(
            "the federated kinds changed: restarting the federation controller over the new set"
        );
        term.cancel();
        task.await;
        if shutdown.is_cancelled() {
            return;
        }
        running = kinds;
    }
}

/// A reflector whose events say only "something changed".
fn watch_all<K>(api: Api<K>) -> (Store<K>, futures::stream::BoxStream<'static, ()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, events) = super::reflect(api, |event| {
        matches!(
            event,
            watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone
        )
    });
    let changes = events
        .filter_map(|changed| async move { changed.then_some(()) })
        .boxed();
    (store, changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(selectors: serde_json::Value) -> Arc<PropagationPolicy> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "federation.example.com/v1alpha1", "kind": "PropagationPolicy",
                "metadata": {"name": "p", "namespace": "shop"},
                "spec": {"resourceSelectors": selectors}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn the_selected_kinds_once_per_group_and_kind() {
        let wanted = selected_kinds(
            &[
                policy(json!([{"apiVersion": "apps/v1", "kind": "Deployment"},
                              {"apiVersion": "example.org/v1", "kind": "Widget", "name": "a"}])),
                policy(
                    json!([{"apiVersion": "example.org/v1beta1", "kind": "Widget"},
                              {"apiVersion": "v1", "kind": "ConfigMap"}]),
                ),
            ],
            &[],
            &Interpreters::built_in(),
        );
        assert_eq!(wanted.len(), 4);
        let once = one_version_per_kind(&wanted);
        assert_eq!(
            once,
            vec![
                Gvk::new("apps/v1", "Deployment"),
                Gvk::new("example.org/v1", "Widget"),
                Gvk::new("v1", "ConfigMap"),
            ]
        );
    }

    #[test]
    fn propagating_dependencies_federates_the_kinds_they_can_be() {
        let interpreter: ResourceInterpreter = serde_json::from_value(json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "ResourceInterpreter",
            "metadata": {"name": "widgets"},
            "spec": {"target": {"apiVersion": "example.org/v1", "kind": "Widget"},
                     "dependencies": [{"path": ".spec.gadgetRef", "apiVersion": "example.org/v1", "kind": "Gadget"}]}
        }))
        .unwrap();
        let (interpreters, _) = Interpreters::with_resources(&[Arc::new(interpreter)]);
        let selects = json!([{"apiVersion": "example.org/v1", "kind": "Widget"}]);
        let plain = selected_kinds(&[policy(selects.clone())], &[], &interpreters);
        assert_eq!(
            plain,
            BTreeSet::from([Gvk::new("example.org/v1", "Widget")])
        );
        let mut propagating = (*policy(selects)).clone();
        propagating.spec.propagate_deps = true;
        let wanted = selected_kinds(&[Arc::new(propagating)], &[], &interpreters);
        for (api_version, kind) in [
            ("example.org/v1", "Widget"),
            ("example.org/v1", "Gadget"),
            ("v1", "ConfigMap"),
            ("v1", "Secret"),
            ("v1", "ServiceAccount"),
            ("v1", "PersistentVolumeClaim"),
        ] {
            assert!(wanted.contains(&Gvk::new(api_version, kind)), "{kind}");
        }
        assert_eq!(wanted.len(), 6);
    }

    #[test]
    fn kind_sets_differ_by_kind_or_by_interpretation() {
        let deployment = ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&());
        let widget = ApiResource {
            group: "example.org".into(),
            version: "v1".into(),
            api_version: "example.org/v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
        };
        let built_in = Interpreters::built_in();
        let a = kinds(&[deployment.clone(), widget.clone()], &built_in);
        assert!(same_kinds(
            &a,
            &kinds(&[deployment.clone(), widget.clone()], &built_in)
        ));
        assert!(!same_kinds(
            &a,
            &kinds(std::slice::from_ref(&deployment), &built_in)
        ));
        let interpreter: ResourceInterpreter = serde_json::from_value(json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "ResourceInterpreter",
            "metadata": {"name": "widgets"},
            "spec": {"target": {"apiVersion": "example.org/v1", "kind": "Widget"}, "replicas": ".spec.size"}
        }))
        .unwrap();
        let (custom, verdicts) = Interpreters::with_resources(&[Arc::new(interpreter)]);
        assert!(verdicts[0].accepted.is_ok());
        let b = kinds(&[deployment, widget], &custom);
        assert!(
            !same_kinds(&a, &b),
            "a new interpretation restarts the controller"
        );
        assert!(b[1].1.divisible());
    }
}
