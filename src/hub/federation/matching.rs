//! Which policy places a template (DESIGN.md section 2). Pure code.
//!
//! A template is selected by a policy when any of the policy's resource selectors
//! matches it. When several policies select it, the winner is: the highest `priority`;
//! then the strongest selector (a name beats a label selector beats a kind-wide one); then
//! a PropagationPolicy beats a ClusterPropagationPolicy; then name order.

use std::cmp::{Ordering, Reverse};
use std::collections::BTreeMap;

use crate::api::propagation_policy::{PropagationSpec, ResourceSelector};
use crate::api::resource_binding::PolicyReference;
use crate::hub::federation::placement::label_selector_matches;

/// The template being placed.
#[derive(Clone, Copy, Debug)]
pub struct TemplateRef<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
}

/// Namespaced or cluster-scoped policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyScope {
    /// A PropagationPolicy: selects in its own namespace only.
    Namespaced,
    /// A ClusterPropagationPolicy: selects in every namespace (or the one a selector names).
    Cluster,
}

/// A policy that might select the template.
#[derive(Clone, Copy, Debug)]
pub struct PolicyCandidate<'a> {
    pub scope: PolicyScope,
    /// The PropagationPolicy's namespace (None for cluster policies).
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    pub spec: &'a PropagationSpec,
}

/// How specifically a selector picked the template.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SelectorStrength {
    /// Every object of the kind.
    KindWide,
    /// By labels.
    Label,
    /// By name.
    Name,
}

/// How strongly `selector`, in a policy of `scope` living in `policy_namespace`,
/// selects `template`; None when it does not.
pub fn selector_strength(
    selector: &ResourceSelector,
    template: &TemplateRef,
    scope: PolicyScope,
    policy_namespace: Option<&str>,
) -> Option<SelectorStrength> {
    if selector.api_version != template.api_version || selector.kind != template.kind {
        return None;
    }
    let namespace_ok = match scope {
        PolicyScope::Namespaced => policy_namespace == Some(template.namespace),
        PolicyScope::Cluster => selector
            .namespace
            .as_deref()
            .is_none_or(|ns| ns.is_empty() || ns == template.namespace),
    };
    if !namespace_ok {
        return None;
    }
    if let Some(name) = &selector.name {
        return (name == template.name).then_some(SelectorStrength::Name);
    }
    if let Some(labels) = &selector.label_selector {
        return label_selector_matches(labels, template.labels).then_some(SelectorStrength::Label);
    }
    Some(SelectorStrength::KindWide)
}

/// The strongest selector of `policy` that selects `template`.
pub fn policy_strength(
    policy: &PolicyCandidate,
    template: &TemplateRef,
) -> Option<SelectorStrength> {
    policy
        .spec
        .resource_selectors
        .iter()
        .filter_map(|selector| {
            selector_strength(selector, template, policy.scope, policy.namespace)
        })
        .max()
}

/// The policy that places `template`, with the strength it matched by; None when no
/// policy selects it (the template is then left alone).
pub fn choose_policy<'a>(
    template: &TemplateRef,
    candidates: &[PolicyCandidate<'a>],
) -> Option<(PolicyCandidate<'a>, SelectorStrength)> {
    candidates
        .iter()
        .filter_map(|policy| policy_strength(policy, template).map(|strength| (*policy, strength)))
        .min_by(|(a, a_strength), (b, b_strength)| {
            precedence(a, *a_strength).cmp(&precedence(b, *b_strength))
        })
}

/// Sort key: smaller wins.
fn precedence<'a>(policy: &PolicyCandidate<'a>, strength: SelectorStrength) -> impl Ord + 'a {
    (
        Reverse(policy.spec.priority),
        Reverse(strength),
        policy.scope != PolicyScope::Namespaced,
        policy.namespace.unwrap_or_default(),
        policy.name,
    )
}

/// Compares two candidates by precedence (for callers that rank several).
pub fn compare(
    a: (&PolicyCandidate, SelectorStrength),
    b: (&PolicyCandidate, SelectorStrength),
) -> Ordering {
    precedence(a.0, a.1).cmp(&precedence(b.0, b.1))
}

/// The reference recorded on the binding.
pub fn policy_reference(policy: &PolicyCandidate) -> PolicyReference {
    PolicyReference {
        kind: match policy.scope {
            PolicyScope::Namespaced => "PropagationPolicy".into(),
            PolicyScope::Cluster => "ClusterPropagationPolicy".into(),
        },
        namespace: policy.namespace.map(str::to_string),
        name: policy.name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn selector(name: Option<&str>, labels: Option<(&str, &str)>) -> ResourceSelector {
        ResourceSelector {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: name.map(str::to_string),
            namespace: None,
            label_selector: labels.map(|(k, v)| LabelSelector {
                match_labels: Some(BTreeMap::from([(k.to_string(), v.to_string())])),
                match_expressions: None,
            }),
        }
    }

    fn spec(priority: i32, selectors: Vec<ResourceSelector>) -> PropagationSpec {
        PropagationSpec {
            priority,
            resource_selectors: selectors,
            ..Default::default()
        }
    }

    fn labels() -> BTreeMap<String, String> {
        BTreeMap::from([("app".to_string(), "web".to_string())])
    }

    fn template(labels: &BTreeMap<String, String>) -> TemplateRef<'_> {
        TemplateRef {
            api_version: "apps/v1",
            kind: "Deployment",
            namespace: "shop",
            name: "web",
            labels,
        }
    }

    fn namespaced<'a>(name: &'a str, spec: &'a PropagationSpec) -> PolicyCandidate<'a> {
        PolicyCandidate {
            scope: PolicyScope::Namespaced,
            namespace: Some("shop"),
            name,
            spec,
        }
    }

    fn cluster<'a>(name: &'a str, spec: &'a PropagationSpec) -> PolicyCandidate<'a> {
        PolicyCandidate {
            scope: PolicyScope::Cluster,
            namespace: None,
            name,
            spec,
        }
    }

    #[test]
    fn selectors_match_by_kind_name_and_labels() {
        let labels = labels();
        let t = template(&labels);
        let ns = PolicyScope::Namespaced;
        assert_eq!(
            selector_strength(&selector(Some("web"), None), &t, ns, Some("shop")),
            Some(SelectorStrength::Name)
        );
        assert_eq!(
            selector_strength(&selector(Some("api"), None), &t, ns, Some("shop")),
            None
        );
        assert_eq!(
            selector_strength(&selector(None, Some(("app", "web"))), &t, ns, Some("shop")),
            Some(SelectorStrength::Label)
        );
        assert_eq!(
            selector_strength(&selector(None, Some(("app", "db"))), &t, ns, Some("shop")),
            None
        );
        assert_eq!(
            selector_strength(&selector(None, None), &t, ns, Some("shop")),
            Some(SelectorStrength::KindWide)
        );
        let mut other_kind = selector(None, None);
        other_kind.kind = "StatefulSet".into();
        assert_eq!(selector_strength(&other_kind, &t, ns, Some("shop")), None);
    }

    #[test]
    fn namespaced_policies_only_select_in_their_namespace() {
        let labels = labels();
        let t = template(&labels);
        assert_eq!(
            selector_strength(
                &selector(None, None),
                &t,
                PolicyScope::Namespaced,
                Some("other")
            ),
            None
        );
        let mut scoped = selector(None, None);
        scoped.namespace = Some("other".into());
        assert_eq!(
            selector_strength(&scoped, &t, PolicyScope::Cluster, None),
            None
        );
        scoped.namespace = Some("shop".into());
        assert!(selector_strength(&scoped, &t, PolicyScope::Cluster, None).is_some());
    }

    #[test]
    fn priority_wins_first() {
        let labels = labels();
        let high = spec(10, vec![selector(None, None)]);
        let low = spec(0, vec![selector(Some("web"), None)]);
        let candidates = [namespaced("low", &low), cluster("high", &high)];
        let (winner, strength) = choose_policy(&template(&labels), &candidates).unwrap();
        assert_eq!(winner.name, "high");
        assert_eq!(strength, SelectorStrength::KindWide);
    }

    #[test]
    fn then_name_beats_label_beats_kind_wide() {
        let labels = labels();
        let by_name = spec(0, vec![selector(Some("web"), None)]);
        let by_label = spec(0, vec![selector(None, Some(("app", "web")))]);
        let by_kind = spec(0, vec![selector(None, None)]);
        let all = [
            namespaced("c-kind", &by_kind),
            namespaced("b-label", &by_label),
            namespaced("a-name", &by_name),
        ];
        assert_eq!(
            choose_policy(&template(&labels), &all).unwrap().0.name,
            "a-name"
        );
        let no_name = [
            namespaced("c-kind", &by_kind),
            namespaced("b-label", &by_label),
        ];
        assert_eq!(
            choose_policy(&template(&labels), &no_name).unwrap().0.name,
            "b-label"
        );
    }

    #[test]
    fn then_namespaced_beats_cluster_then_name_order() {
        let labels = labels();
        let same = spec(0, vec![selector(None, None)]);
        let candidates = [cluster("a", &same), namespaced("z", &same)];
        assert_eq!(
            choose_policy(&template(&labels), &candidates)
                .unwrap()
                .0
                .name,
            "z"
        );
        let two = [namespaced("b", &same), namespaced("a", &same)];
        assert_eq!(choose_policy(&template(&labels), &two).unwrap().0.name, "a");
    }

    #[test]
    fn a_policys_strongest_selector_counts_and_unselected_templates_are_left_alone() {
        let labels = labels();
        let mixed = spec(0, vec![selector(None, None), selector(Some("web"), None)]);
        let label_only = spec(0, vec![selector(None, Some(("app", "web")))]);
        let candidates = [namespaced("b", &mixed), namespaced("a", &label_only)];
        assert_eq!(
            choose_policy(&template(&labels), &candidates)
                .unwrap()
                .0
                .name,
            "b"
        );
        let other = spec(100, vec![selector(Some("api"), None)]);
        assert!(choose_policy(&template(&labels), &[namespaced("x", &other)]).is_none());
    }

    #[test]
    fn the_reference_names_kind_namespace_and_name() {
        let same = spec(0, vec![]);
        let reference = policy_reference(&namespaced("p", &same));
        assert_eq!(
            (
                reference.kind.as_str(),
                reference.namespace.as_deref(),
                reference.name.as_str()
            ),
            ("PropagationPolicy", Some("shop"), "p")
        );
        assert_eq!(policy_reference(&cluster("c", &same)).namespace, None);
    }
}
