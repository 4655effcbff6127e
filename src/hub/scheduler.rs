//! The scheduler: for every template on the hub that a policy selects, pick the policy
//! (`matching`), place it (`placement`) and record the decision in a ResourceBinding
//! (spec: the decision; status: a reason per cluster and `Scheduled`). Writes only what
//! changed. Propagating the copies to members is the next step (see docs/placement.md).
//!
//! Templates are watched for a fixed set of kinds (`TEMPLATE_KINDS`); namespaces
//! `bulkhead-system` and `kube-*` are never templates (they hold the members' credentials
//! and the system), whatever a policy selects.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::api::resource_binding::{ObjectReference, ResourceBindingSpec, ResourceBindingStatus};
use crate::api::{
    ClusterPropagationPolicy, ConditionStatus, MemberCluster, PropagationPolicy, ResourceBinding,
    SYSTEM_NAMESPACE, new_condition, set_condition,
};
use crate::hub::kinds::{cluster_view, is_divisible};
use crate::hub::matching::{
    PolicyCandidate, PolicyScope, TemplateRef, choose_policy, policy_reference,
};
use crate::hub::placement::{ClusterView, PlacementRequest, decide};
use crate::metrics::Metrics;

/// Field manager of the hub's scheduler.
pub const FIELD_MANAGER: &str = "bulkhead-hub-scheduler";

/// The kinds the hub watches as templates: (group, version, kind, plural).
pub const TEMPLATE_KINDS: &[(&str, &str, &str, &str)] = &[
    ("apps", "v1", "Deployment", "deployments"),
    ("apps", "v1", "StatefulSet", "statefulsets"),
    ("example.com", "v1", "MyDatabase", "mydatabases"),
    ("", "v1", "ConfigMap", "configmaps"),
    ("", "v1", "Secret", "secrets"),
    ("", "v1", "Service", "services"),
];

/// Namespaces whose objects are never templates.
pub fn is_excluded_namespace(namespace: &str) -> bool {
    namespace == SYSTEM_NAMESPACE || namespace.starts_with("kube-")
}

/// The binding's name for a template: `<name>-<kind>`.
pub fn binding_name(name: &str, kind: &str) -> String {
    format!("{name}-{}", kind.to_lowercase())
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// What the scheduler wants a binding to say.
#[derive(Debug, PartialEq)]
pub struct DesiredBinding {
    pub namespace: String,
    pub name: String,
    pub owner: OwnerReference,
    pub spec: ResourceBindingSpec,
    pub status: ResourceBindingStatus,
}

/// Decides the binding of one template (pure): None when no policy selects it.
pub fn desired_binding(
    template: &DynamicObject,
    resource: &ApiResource,
    candidates: &[PolicyCandidate],
    clusters: &[ClusterView],
    existing: Option<&ResourceBinding>,
    now: jiff::Timestamp,
) -> Option<DesiredBinding> {
    let namespace = template.namespace().unwrap_or_default();
    let name = template.name_any();
    let labels = template.labels().clone();
    let reference = TemplateRef {
        api_version: &resource.api_version,
        kind: &resource.kind,
        namespace: &namespace,
        name: &name,
        labels: &labels,
    };
    let (policy, _) = choose_policy(&reference, candidates)?;
    let divisible = is_divisible(&resource.api_version, &resource.kind);
    let replicas = if divisible {
        template.data["spec"]["replicas"].as_i64().unwrap_or(1) as i32
    } else {
        1
    };
    let uid = template.metadata.uid.clone().unwrap_or_default();
    let current = existing
        .map(|b| b.spec.clusters.clone())
        .unwrap_or_default();
    let decision = decide(&PlacementRequest {
        placement: &policy.spec.placement,
        replicas,
        divisible,
        uid: &uid,
        clusters,
        current: &current,
        now,
    });
    let result = decision.into_result();
    let generation = template.metadata.generation;
    // Unschedulable: keep what runs; nothing is removed anywhere.
    let clusters_out = if result.scheduled.is_ok() {
        result.targets.clone()
    } else {
        current
    };
    let spec = ResourceBindingSpec {
        resource: ObjectReference {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
            namespace: Some(namespace.clone()),
            name: name.clone(),
            uid: template.metadata.uid.clone(),
            generation,
        },
        policy: Some(policy_reference(&policy)),
        replicas,
        clusters: clusters_out,
    };
    let mut status = existing.and_then(|b| b.status.clone()).unwrap_or_default();
    status.decisions = result.decisions.clone();
    let (scheduled, reason, message) = match &result.scheduled {
        Ok(()) => {
            let chosen: Vec<String> = result
                .targets
                .iter()
                .map(|t| format!("{}={}", t.name, t.replicas))
                .collect();
            (
                true,
                "Scheduled",
                format!("placed on {}", chosen.join(", ")),
            )
        }
        Err(reason) => (false, "Unschedulable", reason.clone()),
    };
    set_condition(
        &mut status.conditions,
        new_condition(
            "Scheduled",
            ConditionStatus::from_bool(scheduled),
            reason,
            message,
            generation,
        ),
    );
    status.observed_generation = generation;
    let owner = OwnerReference {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
        name: name.clone(),
        uid,
        controller: Some(false),
        block_owner_deletion: None,
    };
    Some(DesiredBinding {
        namespace,
        name: binding_name(&name, &resource.kind),
        owner,
        spec,
        status,
    })
}

struct Stores {
    policies: Store<PropagationPolicy>,
    cluster_policies: Store<ClusterPropagationPolicy>,
    members: Store<MemberCluster>,
    bindings: Store<ResourceBinding>,
    templates: Vec<(ApiResource, Store<DynamicObject>)>,
}

fn is_ready<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    futures::FutureExt::now_or_never(store.wait_until_ready()).is_some_and(|ready| ready.is_ok())
}

impl Stores {
    /// Every initial list is in. Deciding before that would rewrite bindings the hub has
    /// simply not read yet (a restarted hub must be quiescent: zero writes).
    fn ready(&self) -> bool {
        is_ready(&self.policies)
            && is_ready(&self.cluster_policies)
            && is_ready(&self.members)
            && is_ready(&self.bindings)
            && self.templates.iter().all(|(_, store)| is_ready(store))
    }
}

/// Runs the scheduler until shutdown.
pub async fn run(hub: Client, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    let mut streams = vec![];
    macro_rules! reflect {
        ($api:expr) => {{
            let (store, writer) = reflector::store();
            streams.push(
                reflector(writer, watcher($api, watcher::Config::default()))
                    .default_backoff()
                    .map(|_| ())
                    .boxed(),
            );
            store
        }};
    }
    let policies = reflect!(Api::<PropagationPolicy>::all(hub.clone()));
    let cluster_policies = reflect!(Api::<ClusterPropagationPolicy>::all(hub.clone()));
    let members = reflect!(Api::<MemberCluster>::all(hub.clone()));
    let bindings = reflect!(Api::<ResourceBinding>::all(hub.clone()));
    let mut templates = vec![];
    for (group, version, kind, plural) in TEMPLATE_KINDS {
        let ar = resource(group, version, kind, plural);
        let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
        let store = writer.as_reader();
        let api = Api::<DynamicObject>::all_with(hub.clone(), &ar);
        streams.push(
            reflector(writer, watcher(api, watcher::Config::default()))
                .default_backoff()
                .map(|_| ())
                .boxed(),
        );
        templates.push((ar, store));
    }
    let stores = Stores {
        policies,
        cluster_policies,
        members,
        bindings,
        templates,
    };
    let decisions = prometheus_client::metrics::counter::Counter::<u64>::default();
    metrics.register(
        "scheduler_binding_writes",
        "ResourceBinding writes (spec or status) by the scheduler",
        decisions.clone(),
    );
    let duration = prometheus_client::metrics::histogram::Histogram::new(
        prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 16),
    );
    metrics.register(
        "scheduler_pass_duration_seconds",
        "Time for one scheduling pass over every template",
        duration.clone(),
    );

    let mut changes = stream::select_all(streams);
    // Re-evaluate periodically too: tolerationSeconds expire without any event.
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            event = changes.next() => if event.is_none() { return },
            _ = tick.tick() => {}
        }
        // Let a burst of events settle into one pass.
        tokio::time::sleep(Duration::from_millis(100)).await;
        while let Some(Some(_)) = futures::FutureExt::now_or_never(changes.next()) {}
        if !stores.ready() {
            continue;
        }
        let started = Instant::now();
        let writes = schedule_all(&hub, &stores).await;
        decisions.inc_by(writes);
        duration.observe(started.elapsed().as_secs_f64());
    }
}

async fn schedule_all(hub: &Client, stores: &Stores) -> u64 {
    let policies = stores.policies.state();
    let cluster_policies = stores.cluster_policies.state();
    let mut candidates: Vec<PolicyCandidate> = policies
        .iter()
        .map(|p| PolicyCandidate {
            scope: PolicyScope::Namespaced,
            namespace: p.metadata.namespace.as_deref(),
            name: p.metadata.name.as_deref().unwrap_or_default(),
            spec: &p.spec,
        })
        .collect();
    candidates.extend(cluster_policies.iter().map(|p| PolicyCandidate {
        scope: PolicyScope::Cluster,
        namespace: None,
        name: p.metadata.name.as_deref().unwrap_or_default(),
        spec: &p.spec.policy,
    }));
    if candidates.is_empty() {
        return 0;
    }
    let mut views: Vec<ClusterView> = stores
        .members
        .state()
        .iter()
        .map(|m| cluster_view(m, false))
        .collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    let now = jiff::Timestamp::now();
    let mut writes = 0;
    for (resource, store) in &stores.templates {
        for template in store.state() {
            let namespace = template.namespace().unwrap_or_default();
            if is_excluded_namespace(&namespace) || template.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let existing = stores.bindings.get(
                &ObjectRef::new(&binding_name(&template.name_any(), &resource.kind))
                    .within(&namespace),
            );
            let Some(desired) = desired_binding(
                &template,
                resource,
                &candidates,
                &views,
                existing.as_deref(),
                now,
            ) else {
                continue;
            };
            match write_binding(hub, &desired, existing.as_deref()).await {
                Ok(n) => writes += n,
                Err(error) => {
                    tracing::warn!(binding = %format!("{}/{}", desired.namespace, desired.name), %error, "cannot write the ResourceBinding")
                }
            }
        }
    }
    writes
}

/// Writes what differs: the spec (server-side apply) and the status. Returns the number
/// of writes.
async fn write_binding(
    hub: &Client,
    desired: &DesiredBinding,
    existing: Option<&ResourceBinding>,
) -> Result<u64, kube::Error> {
    let api: Api<ResourceBinding> = Api::namespaced(hub.clone(), &desired.namespace);
    let mut writes = 0;
    if existing.map(|b| &b.spec) != Some(&desired.spec) {
        let mut binding = ResourceBinding::new(&desired.name, desired.spec.clone());
        binding.metadata.namespace = Some(desired.namespace.clone());
        binding.metadata.owner_references = Some(vec![desired.owner.clone()]);
        binding.metadata.labels = Some(BTreeMap::from([(
            crate::api::LABEL_MANAGED_BY.to_string(),
            "bulkhead".to_string(),
        )]));
        api.patch(
            &desired.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&binding),
        )
        .await?;
        writes += 1;
    }
    let old_status = existing.and_then(|b| b.status.as_ref());
    if old_status != Some(&desired.status) {
        let patch = serde_json::json!({"status": desired.status});
        api.patch_status(
            &desired.name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        writes += 1;
    }
    Ok(writes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PropagationSpec;

    fn template(replicas: i64) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-web", "generation": 2, "labels": {"app": "web"}},
            "spec": {"replicas": replicas}
        }))
        .unwrap()
    }

    fn policy() -> PropagationSpec {
        serde_json::from_value(serde_json::json!({
            "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}],
            "placement": {"replicaScheduling": {"type": "Divided", "weightPreference": {"staticWeightList": [
                {"targetCluster": {"clusterNames": ["east"]}, "weight": 2},
                {"targetCluster": {"clusterNames": ["west"]}, "weight": 1}
            ]}}}
        }))
        .unwrap()
    }

    fn clusters() -> Vec<ClusterView> {
        ["east", "west", "north"]
            .iter()
            .map(|name| ClusterView {
                name: name.to_string(),
                zone: format!("zone-{name}"),
                ready: true,
                ..Default::default()
            })
            .collect()
    }

    fn deployments() -> ApiResource {
        resource("apps", "v1", "Deployment", "deployments")
    }

    fn candidates_in<'a>(
        namespace: &'a str,
        spec: &'a PropagationSpec,
    ) -> [PolicyCandidate<'a>; 1] {
        [PolicyCandidate {
            scope: PolicyScope::Namespaced,
            namespace: Some(namespace),
            name: "weighted",
            spec,
        }]
    }

    #[test]
    fn a_selected_template_gets_a_binding_with_the_decision_and_reasons() {
        let spec = policy();
        let candidates = candidates_in("shop", &spec);
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let desired = desired_binding(
            &template(6),
            &deployments(),
            &candidates,
            &clusters(),
            None,
            now,
        )
        .unwrap();
        assert_eq!(
            (desired.namespace.as_str(), desired.name.as_str()),
            ("shop", "web-deployment")
        );
        let replicas: Vec<(String, i32)> = desired
            .spec
            .clusters
            .iter()
            .map(|c| (c.name.clone(), c.replicas))
            .collect();
        assert_eq!(replicas, [("east".to_string(), 4), ("west".to_string(), 2)]);
        assert_eq!(desired.spec.replicas, 6);
        assert_eq!(desired.spec.resource.uid.as_deref(), Some("u-web"));
        assert_eq!(desired.spec.policy.as_ref().unwrap().name, "weighted");
        assert_eq!(
            desired.status.decisions.len(),
            3,
            "one row per known cluster"
        );
        let north = desired
            .status
            .decisions
            .iter()
            .find(|d| d.cluster == "north")
            .unwrap();
        assert!(!north.selected && !north.reason.is_empty());
        let scheduled =
            crate::api::find_condition(&desired.status.conditions, "Scheduled").unwrap();
        assert_eq!(
            (scheduled.status.as_str(), scheduled.observed_generation),
            ("True", Some(2))
        );
        assert_eq!(desired.owner.uid, "u-web");
    }

    #[test]
    fn unselected_templates_get_nothing_and_an_unchanged_decision_is_equal() {
        let spec = policy();
        let candidates = candidates_in("other", &spec);
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        assert!(
            desired_binding(
                &template(6),
                &deployments(),
                &candidates,
                &clusters(),
                None,
                now
            )
            .is_none()
        );

        let candidates = candidates_in("shop", &spec);
        let first = desired_binding(
            &template(6),
            &deployments(),
            &candidates,
            &clusters(),
            None,
            now,
        )
        .unwrap();
        let mut existing = ResourceBinding::new(&first.name, first.spec.clone());
        existing.status = Some(first.status.clone());
        let again = desired_binding(
            &template(6),
            &deployments(),
            &candidates,
            &clusters(),
            Some(&existing),
            now,
        )
        .unwrap();
        assert_eq!(again.spec, existing.spec, "no spec write");
        assert_eq!(
            Some(&again.status),
            existing.status.as_ref(),
            "no status write"
        );
    }

    #[test]
    fn unschedulable_keeps_the_current_clusters() {
        let mut spec = policy();
        spec.placement.cluster_affinity = Some(crate::api::propagation_policy::ClusterAffinity {
            cluster_names: vec!["mars".into()],
            ..Default::default()
        });
        let candidates = candidates_in("shop", &spec);
        let mut existing = ResourceBinding::new("web-deployment", ResourceBindingSpec::default());
        existing.spec.clusters = vec![crate::api::resource_binding::TargetCluster {
            name: "east".into(),
            replicas: 6,
        }];
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let desired = desired_binding(
            &template(6),
            &deployments(),
            &candidates,
            &clusters(),
            Some(&existing),
            now,
        )
        .unwrap();
        assert_eq!(
            desired.spec.clusters, existing.spec.clusters,
            "nothing is taken away"
        );
        let scheduled =
            crate::api::find_condition(&desired.status.conditions, "Scheduled").unwrap();
        assert_eq!(
            (scheduled.status.as_str(), scheduled.reason.as_str()),
            ("False", "Unschedulable")
        );
    }

    #[test]
    fn system_namespaces_are_never_templates() {
        assert!(is_excluded_namespace("bulkhead-system") && is_excluded_namespace("kube-system"));
        assert!(!is_excluded_namespace("shop"));
    }
}
