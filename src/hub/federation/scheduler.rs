//! The scheduler, pure: for a template on the hub, pick the policy (`matching`), place it
//! (`placement`, with failover's tolerations from `kinds`) and say what its
//! ResourceBinding must record: the decision in the spec, a reason per cluster and
//! `Scheduled` in the status. `controller` runs it and writes the binding in one
//! server-side apply, only when the decision changed.
//!
//! Templates of any kind are scheduled (the kinds are found by `discovery`, read by
//! `interpreter`); namespaces `bulkhead-system` and `kube-*` are never templates (they hold the members' credentials
//! and the system), whatever a policy selects.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{ApiResource, DynamicObject};

use crate::api::propagation_policy::{ConflictResolution, Placement, StaticClusterWeight};
use crate::api::resource_binding::{
    ObjectReference, ResourceBindingSpec, ResourceBindingStatus, TargetCluster,
};
use crate::api::{
    ConditionStatus, ResourceBinding, SYSTEM_NAMESPACE, new_condition, set_condition,
};
use crate::hub::federation::interpreter::Interpretation;
use crate::hub::federation::kinds::{marks_fenced, placement_tolerations};
use crate::hub::federation::matching::{PolicyCandidate, TemplateRef, choose};
use crate::hub::federation::placement::{
    ClusterView, PlacementRequest, StaticWeights, capacity, decide,
};

/// Field manager of the hub's scheduler.
pub const FIELD_MANAGER: &str = "bulkhead-hub-scheduler";

/// Which namespaces the operator lets propagate (`bulkhead hub --exclude-namespace`,
/// `--include-namespace`, and the namespace the hub runs in), set once at start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceFilter {
    /// Never propagated: names, or prefixes ending in `*`.
    pub exclude: Vec<String>,
    /// When not empty, only these are propagated (names or prefixes); `exclude` wins.
    pub include: Vec<String>,
    /// The hub's own namespace (`POD_NAMESPACE`, the chart's release namespace).
    pub own: Option<String>,
}

static NAMESPACE_FILTER: std::sync::OnceLock<NamespaceFilter> = std::sync::OnceLock::new();

fn check_entries(option: &str, entries: &[String]) -> Result<(), String> {
    for entry in entries {
        let name = entry.strip_suffix('*').unwrap_or(entry);
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !valid {
            return Err(format!(
                "{option} {entry:?}: give a namespace name, or a prefix ending in * (for example cert-manager or team-*)"
            ));
        }
    }
    Ok(())
}

/// Checks and sets the operator's namespace filter (once, at start). The error names the
/// option, the entry and the fix.
pub fn set_namespace_filter(filter: NamespaceFilter) -> Result<(), String> {
    check_entries("--exclude-namespace", &filter.exclude)?;
    check_entries("--include-namespace", &filter.include)?;
    let _ = NAMESPACE_FILTER.set(filter);
    Ok(())
}

/// The operator's namespace filter.
pub fn namespace_filter() -> &'static NamespaceFilter {
    static NONE: std::sync::OnceLock<NamespaceFilter> = std::sync::OnceLock::new();
    NAMESPACE_FILTER
        .get()
        .unwrap_or_else(|| NONE.get_or_init(NamespaceFilter::default))
}

/// Namespaces whose objects are never templates: Bulkhead's own (`bulkhead-system` and
/// the namespace the hub runs in), `kube-*`, the operator's `--exclude-namespace` list,
/// and, when the operator gave `--include-namespace`, every namespace it does not name. A
/// template there is left alone, and so are copies it has in members already (nothing is
/// deleted because a namespace was excluded later).
pub fn is_excluded_namespace(namespace: &str) -> bool {
    excluded_by(namespace, namespace_filter())
}

fn matches_entry(namespace: &str, entry: &str) -> bool {
    match entry.strip_suffix('*') {
        Some(prefix) => namespace.starts_with(prefix),
        None => namespace == entry,
    }
}

/// [`is_excluded_namespace`] with the filter given.
fn excluded_by(namespace: &str, filter: &NamespaceFilter) -> bool {
    namespace == SYSTEM_NAMESPACE
        || namespace.starts_with("kube-")
        || filter.own.as_deref() == Some(namespace)
        || filter.exclude.iter().any(|e| matches_entry(namespace, e))
        || (!filter.include.is_empty()
            && !filter.include.iter().any(|e| matches_entry(namespace, e)))
}

/// The binding's name for a template: `<name>-<kind>`.
pub fn binding_name(name: &str, kind: &str) -> String {
    format!("{name}-{}", kind.to_lowercase())
}

pub fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
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
    /// The scheduler's part of the status: observedGeneration, decisions, `Scheduled`.
    pub status: ResourceBindingStatus,
    /// From the chosen policy.
    pub conflict_resolution: ConflictResolution,
    /// The chosen policy's rollout strategy.
    pub rollout: Option<crate::api::rollout::RolloutStrategy>,
    /// The kind is stateful and the policy says `failover.stateful: Fence`.
    pub fence: bool,
    /// When a toleration of a NoExecute taint on one of the clusters expires and the
    /// decision may change without any event: the template is reconciled again then.
    pub next_change: Option<jiff::Timestamp>,
}

/// The earliest future moment a NoExecute taint on `clusters` stops being tolerated by
/// `tolerations` (a toleration with `tolerationSeconds`, counted from the taint's
/// `timeAdded`).
pub fn next_toleration_expiry(
    tolerations: &[k8s_openapi::api::core::v1::Toleration],
    clusters: &[ClusterView],
    now: jiff::Timestamp,
) -> Option<jiff::Timestamp> {
    clusters
        .iter()
        .flat_map(|view| view.taints.iter())
        .filter(|taint| taint.effect == "NoExecute")
        .filter_map(|taint| {
            let added = taint.time_added.as_ref()?.0;
            tolerations
                .iter()
                .filter(|t| crate::hub::federation::placement::toleration_matches(t, taint))
                .filter_map(|t| t.toleration_seconds)
                .map(|seconds| added + jiff::SignedDuration::from_secs(seconds.max(0)))
                .filter(|at| *at > now)
                .min()
        })
        .min()
}

/// The scheduler's part of a binding's status (what [`DesiredBinding::status`] holds).
pub fn scheduler_status(status: Option<&ResourceBindingStatus>) -> ResourceBindingStatus {
    let Some(status) = status else {
        return ResourceBindingStatus::default();
    };
    ResourceBindingStatus {
        observed_generation: status.observed_generation,
        conditions: status
            .conditions
            .iter()
            .filter(|c| {
                c.type_ == "Scheduled"
                    || crate::hub::federation::rollout::ROLLOUT_CONDITIONS
                        .contains(&c.type_.as_str())
            })
            .cloned()
            .collect(),
        decisions: status.decisions.clone(),
        interpreter: status.interpreter.clone(),
        clusters: vec![],
        rollout: status.rollout.clone(),
    }
}

/// Decides the binding of one template (pure): None when no policy selects it. While the
/// hub is `frozen`, failover moves nothing (see `kinds::placement_tolerations`).
#[allow(clippy::too_many_arguments)]
pub fn desired_binding(
    template: &DynamicObject,
    // The whole template (its body), when a policy divides by capacity: the per-replica
    // requests are in the pod template, which the hub's store does not keep.
    full: Option<&serde_json::Value>,
    // The ready replicas of the template's copy in a cluster, as last seen (None:
    // unknown): held replicas that do not run are no room (capacity placements only).
    running: &dyn Fn(&str) -> Option<i32>,
    resource: &ApiResource,
    interpretation: &Interpretation,
    candidates: &[PolicyCandidate],
    clusters: &[ClusterView],
    // A staticWeightList resolved against `clusters`, when the caller keeps them (the hub
    // does, per member registry snapshot); None: placement resolves it for this template.
    static_weights: &dyn Fn(&[StaticClusterWeight]) -> Option<Arc<StaticWeights>>,
    existing: Option<&ResourceBinding>,
    frozen: bool,
    now: jiff::Timestamp,
) -> Option<DesiredBinding> {
    let namespace = template.namespace().unwrap_or_default();
    let name = template.name_any();
    let reference = TemplateRef::of(resource, template);
    let choice = choose(&reference, candidates)?;
    let policy = choice.policy;
    let divisible = interpretation.divisible();
    let stateful = interpretation.stateful;
    let placement = Placement {
        cluster_tolerations: placement_tolerations(policy.spec, stateful, frozen),
        ..policy.spec.placement.clone()
    };
    let next_change = next_toleration_expiry(&placement.cluster_tolerations, clusters, now);
    let replicas = interpretation.replicas_of(&template.data).unwrap_or(1);
    let uid = template.metadata.uid.clone().unwrap_or_default();
    let current = existing
        .map(|b| b.spec.clusters.clone())
        .unwrap_or_default();
    // Dynamic weights and Aggregated: each member's room for this template's requests.
    let not_running = |cluster: &str| {
        let held = current
            .iter()
            .find(|t| t.name == cluster)
            .map_or(0, |t| t.replicas);
        let running = running(cluster).unwrap_or(held).clamp(0, held);
        i64::from(held - running)
    };
    let estimated = capacity::with_estimates(
        clusters,
        &placement,
        full.unwrap_or(&template.data),
        &not_running,
    );
    // The policy's own list (the one in the store, not `placement`'s copy): the caller
    // keeps its resolved weights by the list's address while the policy is unchanged.
    let resolved = static_weights(policy.spec.placement.static_weight_list());
    let decision = decide(&PlacementRequest {
        placement: &placement,
        replicas,
        divisible,
        stateful,
        uid: &uid,
        clusters: &estimated,
        current: &current,
        now,
        static_weights: resolved.as_deref(),
        // Replica clusters: the primary cluster keeps a replica while the total allows, so
        // a scale-down removes replica clusters first.
        first_seat: template.data["status"]["primaryCluster"].as_str(),
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
        policy: Some(choice.reference()),
        replicas,
        clusters: clusters_out,
    };
    let mut status = scheduler_status(existing.and_then(|b| b.status.as_ref()));
    status.decisions = result.decisions.clone();
    status.interpreter = Some(interpretation.source.to_string());
    let (scheduled, reason, message) = match &result.scheduled {
        Ok(()) => {
            let chosen: Vec<String> = result
                .targets
                .iter()
                .map(|t| format!("{}={}", t.name, t.replicas))
                .collect();
            match &result.notice {
                // Placed, but below the policy's minPerCluster: the numbers and the fix.
                Some(notice) => (
                    true,
                    "MinPerClusterNotMet",
                    format!("placed on {}; {notice}", chosen.join(", ")),
                ),
                None => (
                    true,
                    "Scheduled",
                    format!("placed on {}", chosen.join(", ")),
                ),
            }
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
        conflict_resolution: policy.spec.conflict_resolution,
        rollout: policy.spec.rollout.clone(),
        fence: stateful && marks_fenced(policy.spec),
        next_change,
    })
}

/// Clusters that lose replicas while they are not Ready, with how many they lose: the
/// decision is a failover eviction (events, metrics, rate limit).
pub fn evicted_clusters(
    old: &[TargetCluster],
    new: &[TargetCluster],
    clusters: &[ClusterView],
) -> Vec<(String, i32)> {
    old.iter()
        .filter(|o| clusters.iter().any(|c| c.name == o.name && !c.ready))
        .filter_map(|o| {
            let now = new
                .iter()
                .find(|n| n.name == o.name)
                .map_or(0, |n| n.replicas);
            (now < o.replicas).then(|| (o.name.clone(), o.replicas - now))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PropagationSpec;
    use crate::hub::federation::matching::PolicyScope;

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
    fn the_weights_are_asked_for_by_the_policys_own_list() {
        // The hub keeps resolved weights by the address of the list it is asked for: that
        // must be the policy's (stable while the policy is), not a copy made per template.
        let spec = policy();
        let candidates = candidates_in("shop", &spec);
        let clusters = clusters();
        let list = spec.placement.static_weight_list();
        let asked = std::cell::RefCell::new(vec![]);
        let resolve = |asked_for: &[StaticClusterWeight]| {
            asked.borrow_mut().push(asked_for.as_ptr());
            Some(Arc::new(StaticWeights::resolve(asked_for, &clusters)))
        };
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let decide = || {
            desired_binding(
                &template(6),
                None,
                &|_| None,
                &deployments(),
                &crate::hub::federation::interpreter::Interpreters::built_in()
                    .get("apps/v1", "Deployment"),
                &candidates,
                &clusters,
                &resolve,
                None,
                false,
                now,
            )
            .unwrap()
        };
        let first = decide();
        let second = decide();
        assert_eq!(*asked.borrow(), vec![list.as_ptr(), list.as_ptr()]);
        assert_eq!(first.spec, second.spec);
        let replicas: Vec<(String, i32)> = first
            .spec
            .clusters
            .iter()
            .map(|t| (t.name.clone(), t.replicas))
            .collect();
        assert_eq!(replicas, [("east".to_string(), 4), ("west".to_string(), 2)]);
    }

    #[test]
    fn a_selected_template_gets_a_binding_with_the_decision_and_reasons() {
        let spec = policy();
        let candidates = candidates_in("shop", &spec);
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let desired = desired_binding(
            &template(6),
            None,
            &|_| None,
            &deployments(),
            &crate::hub::federation::interpreter::Interpreters::built_in()
                .get("apps/v1", "Deployment"),
            &candidates,
            &clusters(),
            &|_| None,
            None,
            false,
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
                None,
                &|_| None,
                &deployments(),
                &crate::hub::federation::interpreter::Interpreters::built_in()
                    .get("apps/v1", "Deployment"),
                &candidates,
                &clusters(),
                &|_| None,
                None,
                false,
                now
            )
            .is_none()
        );

        let candidates = candidates_in("shop", &spec);
        let first = desired_binding(
            &template(6),
            None,
            &|_| None,
            &deployments(),
            &crate::hub::federation::interpreter::Interpreters::built_in()
                .get("apps/v1", "Deployment"),
            &candidates,
            &clusters(),
            &|_| None,
            None,
            false,
            now,
        )
        .unwrap();
        let mut existing = ResourceBinding::new(&first.name, first.spec.clone());
        existing.status = Some(first.status.clone());
        let again = desired_binding(
            &template(6),
            None,
            &|_| None,
            &deployments(),
            &crate::hub::federation::interpreter::Interpreters::built_in()
                .get("apps/v1", "Deployment"),
            &candidates,
            &clusters(),
            &|_| None,
            Some(&existing),
            false,
            now,
        )
        .unwrap();
        assert_eq!(again.spec, existing.spec, "no spec write");
        assert_eq!(again.status, scheduler_status(existing.status.as_ref()));
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
            None,
            &|_| None,
            &deployments(),
            &crate::hub::federation::interpreter::Interpreters::built_in()
                .get("apps/v1", "Deployment"),
            &candidates,
            &clusters(),
            &|_| None,
            Some(&existing),
            false,
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
        // Checked before anything is set (the filter itself is process-wide).
        let bad = |exclude: &[&str], include: &[&str]| {
            set_namespace_filter(NamespaceFilter {
                exclude: exclude.iter().map(|s| s.to_string()).collect(),
                include: include.iter().map(|s| s.to_string()).collect(),
                own: None,
            })
            .unwrap_err()
        };
        assert!(bad(&["Default"], &[]).contains("--exclude-namespace \"Default\""));
        assert!(bad(&["*"], &[]).contains("prefix ending in *"));
        assert!(bad(&[], &["Team_a"]).contains("--include-namespace"));
        let operator = NamespaceFilter {
            exclude: vec!["cert-manager".to_string(), "team-*".to_string()],
            include: vec![],
            own: Some("platform".into()),
        };
        assert!(excluded_by("cert-manager", &operator) && excluded_by("team-a", &operator));
        assert!(excluded_by("kube-public", &operator) && excluded_by("platform", &operator));
        assert!(!excluded_by("cert-manager-2", &operator) && !excluded_by("shop", &operator));
        // An allow list: only what it names, and the deny list still wins.
        let allow = NamespaceFilter {
            exclude: vec!["shop-secret".to_string()],
            include: vec!["shop-*".to_string(), "orders".to_string()],
            own: None,
        };
        assert!(!excluded_by("shop-eu", &allow) && !excluded_by("orders", &allow));
        assert!(excluded_by("default", &allow) && excluded_by("shop-secret", &allow));
        assert!(excluded_by("bulkhead-system", &allow) && excluded_by("kube-shop-x", &allow));
    }

    #[test]
    fn replicas_leaving_a_failed_cluster_are_an_eviction() {
        let target = |name: &str, replicas| TargetCluster {
            name: name.into(),
            replicas,
        };
        let mut views = clusters();
        views[0].ready = false; // east
        let old = [target("east", 2), target("west", 2), target("north", 2)];
        let new = [target("west", 3), target("north", 3)];
        assert_eq!(
            evicted_clusters(&old, &new, &views),
            [("east".to_string(), 2)]
        );
        let reweighted = [target("east", 2), target("west", 1), target("north", 3)];
        assert!(
            evicted_clusters(&old, &reweighted, &views).is_empty(),
            "a Ready cluster losing replicas is a plain placement change"
        );
    }
}
