//! Which policy places a template (DESIGN.md section 2; docs/placement.md, "Policy
//! selection"). Pure code.
//!
//! A template is selected by a policy when any of the policy's resource selectors
//! matches it: apiVersion and kind, the namespace (a PropagationPolicy's own; for a
//! ClusterPropagationPolicy the selector's, or any), then a `name` (exact, or a glob
//! pattern with `*` and `?`), a `labelSelector`, or neither (every object of the kind).
//!
//! When several policies select it, the winner is, in order:
//! 1. the highest `priority`;
//! 2. the strongest selector: an exact name > a name pattern > a label selector >
//!    kind-wide (no name and no labels, or a name made of `*` only, such as `"*"`); between
//!    two patterns, the more specific one: more characters other than `*`
//!    (`web-api-*` beats `web-*`, `web-?` beats `web-*`);
//! 3. a PropagationPolicy over a ClusterPropagationPolicy;
//! 4. namespace/name order.
//!
//! [`choose`] also says which selector matched and why the winner beat the next policy,
//! for the binding (`spec.policy.selectedBy`, `spec.policy.precedence`) and `bulkhead plan`.

use std::cmp::{Ordering, Reverse};
use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

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

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

impl<'a> TemplateRef<'a> {
    /// A hub template of `resource`, borrowed as it is (nothing copied).
    pub fn of(
        resource: &'a kube::api::ApiResource,
        template: &'a kube::api::DynamicObject,
    ) -> Self {
        TemplateRef {
            api_version: &resource.api_version,
            kind: &resource.kind,
            namespace: template.metadata.namespace.as_deref().unwrap_or_default(),
            name: template.metadata.name.as_deref().unwrap_or_default(),
            labels: template.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
        }
    }
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

impl PolicyCandidate<'_> {
    /// `PropagationPolicy shop/web` or `ClusterPropagationPolicy all`.
    pub fn describe(&self) -> String {
        match (self.scope, self.namespace) {
            (PolicyScope::Namespaced, Some(ns)) => format!("PropagationPolicy {ns}/{}", self.name),
            (PolicyScope::Namespaced, None) => format!("PropagationPolicy {}", self.name),
            (PolicyScope::Cluster, _) => format!("ClusterPropagationPolicy {}", self.name),
        }
    }
}

/// How specifically a selector picked the template; greater is stronger.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SelectorStrength {
    /// Every object of the kind: no name and no label selector, or a name pattern made of
    /// `*` only (`"*"`).
    KindWide,
    /// By labels.
    Label,
    /// By a name pattern with `*` or `?`; the number is its specificity, the characters
    /// other than `*` (a longer literal part wins).
    Pattern(u32),
    /// By an exact name.
    Name,
}

impl SelectorStrength {
    /// "an exact name", "a name pattern", "a label selector", "a kind-wide selector".
    pub fn words(self) -> &'static str {
        match self {
            SelectorStrength::Name => "an exact name",
            SelectorStrength::Pattern(_) => "a name pattern",
            SelectorStrength::Label => "a label selector",
            SelectorStrength::KindWide => "a kind-wide selector",
        }
    }
}

/// Whether `name` in a selector is a pattern (has `*` or `?`).
pub fn is_pattern(name: &str) -> bool {
    name.contains(['*', '?'])
}

/// Whether the pattern `name` matches every name: `*`, `**`, ... (the empty name is no
/// pattern: it matches nothing).
pub fn matches_every_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b == b'*')
}

/// Glob match: `*` matches any run of characters (also none), `?` exactly one character,
/// every other character itself. Linear in practice (greedy, backtracking only to the
/// last `*`); O(len(pattern) * len(name)) at worst.
///
/// ```
/// use bulkhead::hub::federation::matching::glob_matches;
/// assert!(glob_matches("web-*", "web-a"));
/// assert!(glob_matches("web-?", "web-a") && !glob_matches("web-?", "web-ab"));
/// assert!(glob_matches("*", "") && !glob_matches("web-*", "api"));
/// ```
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    if pattern.is_ascii() && name.is_ascii() {
        glob(pattern.as_bytes(), name.as_bytes(), b'*', b'?')
    } else {
        let pattern: Vec<char> = pattern.chars().collect();
        let name: Vec<char> = name.chars().collect();
        glob(&pattern, &name, '*', '?')
    }
}

fn glob<T: Copy + PartialEq>(pattern: &[T], name: &[T], star: T, one: T) -> bool {
    let (mut p, mut n) = (0, 0);
    // After the last `*` seen: where the pattern resumes, and the name position it was
    // tried at.
    let mut resume: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && pattern[p] == star {
            resume = Some((p + 1, n));
            p += 1;
        } else if p < pattern.len() && (pattern[p] == one || pattern[p] == name[n]) {
            p += 1;
            n += 1;
        } else if let Some((after_star, tried)) = resume {
            // Let the last `*` swallow one more character.
            resume = Some((after_star, tried + 1));
            p = after_star;
            n = tried + 1;
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == star)
}

/// How `selector`'s name (or labels) picks templates, regardless of any template.
fn name_strength(selector: &ResourceSelector) -> SelectorStrength {
    match (&selector.name, &selector.label_selector) {
        (Some(name), _) if matches_every_name(name) => SelectorStrength::KindWide,
        (Some(name), _) if is_pattern(name) => {
            SelectorStrength::Pattern(name.chars().filter(|&c| c != '*').count() as u32)
        }
        (Some(_), _) => SelectorStrength::Name,
        (None, Some(_)) => SelectorStrength::Label,
        (None, None) => SelectorStrength::KindWide,
    }
}

/// Whether `selector` (in a policy of `scope` living in `policy_namespace`) reaches the
/// template's apiVersion, kind and namespace, before its name or labels are looked at.
pub fn selector_in_scope(
    selector: &ResourceSelector,
    template: &TemplateRef,
    scope: PolicyScope,
    policy_namespace: Option<&str>,
) -> bool {
    if selector.api_version != template.api_version || selector.kind != template.kind {
        return false;
    }
    match scope {
        PolicyScope::Namespaced => policy_namespace == Some(template.namespace),
        PolicyScope::Cluster => selector
            .namespace
            .as_deref()
            .is_none_or(|ns| ns.is_empty() || ns == template.namespace),
    }
}

/// How strongly `selector`, in a policy of `scope` living in `policy_namespace`,
/// selects `template`; None when it does not.
pub fn selector_strength(
    selector: &ResourceSelector,
    template: &TemplateRef,
    scope: PolicyScope,
    policy_namespace: Option<&str>,
) -> Option<SelectorStrength> {
    if !selector_in_scope(selector, template, scope, policy_namespace) {
        return None;
    }
    let strength = name_strength(selector);
    let matched = match (&selector.name, &selector.label_selector) {
        (Some(name), _) if is_pattern(name) => glob_matches(name, template.name),
        (Some(name), _) => name == template.name,
        (None, Some(labels)) => label_selector_matches(labels, template.labels),
        (None, None) => true,
    };
    matched.then_some(strength)
}

/// The strongest selector of `policy` that selects `template` (the first of equal ones),
/// as (index in `resourceSelectors`, strength).
pub fn strongest_selector(
    policy: &PolicyCandidate,
    template: &TemplateRef,
) -> Option<(usize, SelectorStrength)> {
    let mut best: Option<(usize, SelectorStrength)> = None;
    for (index, selector) in policy.spec.resource_selectors.iter().enumerate() {
        if let Some(strength) =
            selector_strength(selector, template, policy.scope, policy.namespace)
            && best.is_none_or(|(_, b)| strength > b)
        {
            best = Some((index, strength));
        }
    }
    best
}

/// The strongest selector of `policy` that selects `template`.
pub fn policy_strength(
    policy: &PolicyCandidate,
    template: &TemplateRef,
) -> Option<SelectorStrength> {
    strongest_selector(policy, template).map(|(_, strength)| strength)
}

/// The policy that places a template, and why.
#[derive(Clone, Copy, Debug)]
pub struct Choice<'a> {
    pub policy: PolicyCandidate<'a>,
    pub strength: SelectorStrength,
    /// Index of the selector that matched in `policy.spec.resourceSelectors`.
    pub selector: usize,
    /// The best of the other policies that select the template, with its strength.
    pub runner_up: Option<(PolicyCandidate<'a>, SelectorStrength)>,
    /// How many other policies select the template.
    pub others: usize,
}

impl Choice<'_> {
    /// The selector that matched, e.g. `resourceSelectors[1]: name pattern web-*`.
    pub fn selected_by(&self) -> String {
        let selector = &self.policy.spec.resource_selectors[self.selector];
        format!(
            "resourceSelectors[{}]: {}",
            self.selector,
            describe_selector(selector)
        )
    }

    /// Why the policy won, or None when no other policy selects the template, e.g.
    /// `over ClusterPropagationPolicy all (priority 0, a kind-wide selector): an exact name
    /// beats a kind-wide selector`.
    pub fn precedence(&self) -> Option<String> {
        let (other, other_strength) = self.runner_up.as_ref()?;
        let mut text = String::from("over ");
        if self.others > 1 {
            let _ = write!(text, "{} other policies, the next being ", self.others);
        }
        let _ = write!(
            text,
            "{} (priority {}, {}): {}",
            other.describe(),
            other.spec.priority,
            other_strength.words(),
            why((&self.policy, self.strength), (other, *other_strength))
        );
        Some(text)
    }

    /// The reference recorded on the binding, with the selector and the precedence.
    pub fn reference(&self) -> PolicyReference {
        PolicyReference {
            selected_by: Some(self.selected_by()),
            precedence: self.precedence(),
            ..policy_reference(&self.policy)
        }
    }
}

/// Why `winner` goes before `other` (the first rule of the precedence that tells them
/// apart).
fn why(
    winner: (&PolicyCandidate, SelectorStrength),
    other: (&PolicyCandidate, SelectorStrength),
) -> String {
    let ((w, w_strength), (o, o_strength)) = (winner, other);
    if w.spec.priority != o.spec.priority {
        return format!(
            "higher priority ({} > {})",
            w.spec.priority, o.spec.priority
        );
    }
    if w_strength != o_strength {
        return match (w_strength, o_strength) {
            (SelectorStrength::Pattern(a), SelectorStrength::Pattern(b)) => format!(
                "same priority, a more specific name pattern ({a} characters other than * against {b})"
            ),
            _ => format!(
                "same priority, {} beats {}",
                w_strength.words(),
                o_strength.words()
            ),
        };
    }
    if w.scope != o.scope {
        return "same priority and selector strength, a PropagationPolicy beats a ClusterPropagationPolicy".to_string();
    }
    "same priority, selector strength and kind: the first in namespace/name order wins".to_string()
}

/// The policy that places `template`, the selector that matched and the runner-up; None
/// when no policy selects it (the template is then left alone).
pub fn choose<'a>(
    template: &TemplateRef,
    candidates: &[PolicyCandidate<'a>],
) -> Option<Choice<'a>> {
    let mut best: Option<(PolicyCandidate<'a>, usize, SelectorStrength)> = None;
    let mut runner_up: Option<(PolicyCandidate<'a>, SelectorStrength)> = None;
    let mut selecting = 0;
    for policy in candidates {
        let Some((index, strength)) = strongest_selector(policy, template) else {
            continue;
        };
        selecting += 1;
        match &best {
            Some((current, _, current_strength))
                if compare((policy, strength), (current, *current_strength)) != Ordering::Less =>
            {
                if runner_up.as_ref().is_none_or(|(r, r_strength)| {
                    compare((policy, strength), (r, *r_strength)) == Ordering::Less
                }) {
                    runner_up = Some((*policy, strength));
                }
            }
            _ => {
                if let Some((previous, _, previous_strength)) = best.take() {
                    runner_up = Some((previous, previous_strength));
                }
                best = Some((*policy, index, strength));
            }
        }
    }
    let (policy, selector, strength) = best?;
    Some(Choice {
        policy,
        strength,
        selector,
        runner_up,
        others: selecting - 1,
    })
}

/// The policy that places `template`, with the strength it matched by; None when no
/// policy selects it (the template is then left alone).
pub fn choose_policy<'a>(
    template: &TemplateRef,
    candidates: &[PolicyCandidate<'a>],
) -> Option<(PolicyCandidate<'a>, SelectorStrength)> {
    choose(template, candidates).map(|choice| (choice.policy, choice.strength))
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

/// Compares two candidates by precedence (for callers that rank several); `Less` wins.
pub fn compare(
    a: (&PolicyCandidate, SelectorStrength),
    b: (&PolicyCandidate, SelectorStrength),
) -> Ordering {
    precedence(a.0, a.1).cmp(&precedence(b.0, b.1))
}

/// The reference recorded on the binding (without the selector and precedence; see
/// [`Choice::reference`]).
pub fn policy_reference(policy: &PolicyCandidate) -> PolicyReference {
    PolicyReference {
        kind: match policy.scope {
            PolicyScope::Namespaced => "PropagationPolicy".into(),
            PolicyScope::Cluster => "ClusterPropagationPolicy".into(),
        },
        namespace: policy.namespace.map(str::to_string),
        name: policy.name.to_string(),
        selected_by: None,
        precedence: None,
    }
}

/// A selector in words: `name web`, `name pattern web-*`, `name pattern * (every
/// Deployment)`, `labels app=web`, `every Deployment`; with ` in namespace shop` when it
/// names one.
pub fn describe_selector(selector: &ResourceSelector) -> String {
    let kind = &selector.kind;
    let mut text = match (&selector.name, &selector.label_selector) {
        (Some(name), _) if matches_every_name(name) => {
            format!("name pattern {name} (every {kind})")
        }
        (Some(name), _) if is_pattern(name) => format!("name pattern {name}"),
        (Some(name), _) => format!("name {name}"),
        (None, Some(labels)) => format!("labels {}", describe_labels(labels)),
        (None, None) => format!("every {kind}"),
    };
    if let Some(namespace) = selector.namespace.as_deref().filter(|ns| !ns.is_empty()) {
        let _ = write!(text, " in namespace {namespace}");
    }
    text
}

/// `app=web, tier In (gold, silver)`; `(everything)` for an empty selector.
pub fn describe_labels(selector: &LabelSelector) -> String {
    let mut parts: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    for requirement in selector.match_expressions.iter().flatten() {
        let values = requirement.values.clone().unwrap_or_default();
        parts.push(if values.is_empty() {
            format!("{} {}", requirement.key, requirement.operator)
        } else {
            format!(
                "{} {} ({})",
                requirement.key,
                requirement.operator,
                values.join(", ")
            )
        });
    }
    if parts.is_empty() {
        "(everything)".to_string()
    } else {
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    fn named(name: &str) -> ResourceSelector {
        selector(Some(name), None)
    }

    fn template_named<'a>(name: &'a str, labels: &'a BTreeMap<String, String>) -> TemplateRef<'a> {
        TemplateRef {
            name,
            ..template(labels)
        }
    }

    #[test]
    fn glob_stars_and_question_marks() {
        for (pattern, name, expected) in [
            ("*", "", true),
            ("*", "web", true),
            ("**", "web", true),
            ("web-*", "web-", true),
            ("web-*", "web-a", true),
            ("web-*", "web", false),
            ("web-*", "api-web-a", false),
            ("*-web", "api-web", true),
            ("*-web", "api-web-x", false),
            ("w*b*z", "wxxbyyz", true),
            ("w*b*z", "wxxbyy", false),
            ("a*a*a", "aaa", true),
            ("a*a*a", "aa", false),
            ("web-?", "web-a", true),
            ("web-?", "web-", false),
            ("web-?", "web-ab", false),
            ("?", "", false),
            ("??", "ab", true),
            ("*?", "", false),
            ("*?", "a", true),
            ("web", "web", true),
            ("web", "webs", false),
            ("", "", true),
            ("", "a", false),
            ("é*", "éa", true),
            ("?", "é", true),
        ] {
            assert_eq!(
                glob_matches(pattern, name),
                expected,
                "{pattern:?} against {name:?}"
            );
        }
    }

    #[test]
    fn patterns_select_by_name_and_star_alone_is_kind_wide() {
        let labels = labels();
        let ns = PolicyScope::Namespaced;
        let web_a = template_named("web-a", &labels);
        let api = template_named("api", &labels);
        assert_eq!(
            selector_strength(&named("web-*"), &web_a, ns, Some("shop")),
            Some(SelectorStrength::Pattern(4))
        );
        assert_eq!(
            selector_strength(&named("web-*"), &api, ns, Some("shop")),
            None
        );
        for every in ["*", "**"] {
            assert_eq!(
                selector_strength(&named(every), &api, ns, Some("shop")),
                Some(SelectorStrength::KindWide),
                "{every}"
            );
        }
        assert_eq!(
            selector_strength(&named("web-?"), &web_a, ns, Some("shop")),
            Some(SelectorStrength::Pattern(5))
        );
        // A pattern is still bound to the kind and the namespace.
        assert_eq!(
            selector_strength(&named("*"), &api, ns, Some("other")),
            None
        );
        let mut scoped = named("*");
        scoped.namespace = Some("other".into());
        assert_eq!(
            selector_strength(&scoped, &api, PolicyScope::Cluster, None),
            None
        );
    }

    #[test]
    fn exact_name_beats_pattern_beats_labels_beats_kind_wide() {
        let labels = labels();
        let exact = spec(0, vec![named("web-a")]);
        let pattern = spec(0, vec![named("web-*")]);
        let by_label = spec(0, vec![selector(None, Some(("app", "web")))]);
        let star = spec(0, vec![named("*")]);
        let kind = spec(0, vec![selector(None, None)]);
        let t = template_named("web-a", &labels);
        // Names chosen so name order alone would pick the weaker one.
        let mut all = vec![
            namespaced("a-kind", &kind),
            namespaced("b-star", &star),
            namespaced("c-label", &by_label),
            namespaced("d-pattern", &pattern),
            namespaced("e-exact", &exact),
        ];
        for expected in ["e-exact", "d-pattern", "c-label", "a-kind"] {
            let choice = choose(&t, &all).unwrap();
            assert_eq!(choice.policy.name, expected);
            all.retain(|p| p.name != expected);
        }
        // `*` is kind-wide: it ties with a selector without name, and name order decides.
        assert_eq!(choose(&t, &all).unwrap().policy.name, "b-star");
    }

    #[test]
    fn the_more_specific_pattern_wins() {
        let labels = labels();
        let short = spec(0, vec![named("web-*")]);
        let long = spec(0, vec![named("web-api-*")]);
        let one = spec(0, vec![named("web-api-?")]);
        let t = template_named("web-api-1", &labels);
        let candidates = [
            namespaced("a", &short),
            namespaced("b", &long),
            namespaced("c", &one),
        ];
        let choice = choose(&t, &candidates).unwrap();
        assert_eq!(choice.policy.name, "c");
        assert!(
            choice
                .precedence()
                .unwrap()
                .contains("a more specific name pattern (9 characters other than * against 8)"),
            "{:?}",
            choice.precedence()
        );
    }

    #[test]
    fn priority_still_beats_a_stronger_selector() {
        let labels = labels();
        let star = spec(5, vec![named("*")]);
        let exact = spec(0, vec![named("web")]);
        let candidates = [namespaced("exact", &exact), cluster("star", &star)];
        let choice = choose(&template(&labels), &candidates).unwrap();
        assert_eq!(choice.policy.name, "star");
        assert_eq!(
            choice.precedence().unwrap(),
            "over PropagationPolicy shop/exact (priority 0, an exact name): higher priority (5 > 0)"
        );
    }

    #[test]
    fn the_choice_says_which_selector_matched_and_why_it_won() {
        let labels = labels();
        let mixed = spec(
            0,
            vec![
                selector(None, Some(("app", "db"))),
                named("w*"),
                named("web"),
            ],
        );
        let every = spec(0, vec![named("*")]);
        let other = spec(0, vec![selector(None, None)]);
        let candidates = [
            cluster("every", &every),
            namespaced("mixed", &mixed),
            cluster("other", &other),
        ];
        let choice = choose(&template(&labels), &candidates).unwrap();
        assert_eq!(choice.policy.name, "mixed");
        assert_eq!(choice.selected_by(), "resourceSelectors[2]: name web");
        assert_eq!(choice.others, 2);
        assert_eq!(
            choice.precedence().unwrap(),
            "over 2 other policies, the next being ClusterPropagationPolicy every (priority 0, a kind-wide selector): same priority, an exact name beats a kind-wide selector"
        );
        let reference = choice.reference();
        assert_eq!(reference.name, "mixed");
        assert_eq!(
            reference.selected_by.as_deref(),
            Some("resourceSelectors[2]: name web")
        );
        let alone = choose(&template(&labels), &candidates[1..2]).unwrap();
        assert_eq!(alone.precedence(), None);
        assert_eq!(alone.reference().precedence, None);
    }

    #[test]
    fn selectors_in_words() {
        let mut every = named("*");
        every.namespace = Some("default".into());
        assert_eq!(
            describe_selector(&every),
            "name pattern * (every Deployment) in namespace default"
        );
        assert_eq!(describe_selector(&named("web-*")), "name pattern web-*");
        assert_eq!(describe_selector(&named("web")), "name web");
        assert_eq!(describe_selector(&selector(None, None)), "every Deployment");
        assert_eq!(
            describe_selector(&selector(None, Some(("app", "web")))),
            "labels app=web"
        );
    }

    /// The textbook definition, by recursion on the first pattern character.
    fn glob_reference(pattern: &[char], name: &[char]) -> bool {
        match pattern.split_first() {
            None => name.is_empty(),
            Some(('*', rest)) => (0..=name.len()).any(|skip| glob_reference(rest, &name[skip..])),
            Some(('?', rest)) => !name.is_empty() && glob_reference(rest, &name[1..]),
            Some((c, rest)) => name.first() == Some(c) && glob_reference(rest, &name[1..]),
        }
    }

    proptest! {
        #[test]
        fn glob_equals_the_reference(pattern in "[ab*?]{0,10}", name in "[abc]{0,12}") {
            let p: Vec<char> = pattern.chars().collect();
            let n: Vec<char> = name.chars().collect();
            prop_assert_eq!(glob_matches(&pattern, &name), glob_reference(&p, &n), "{:?} against {:?}", pattern, name);
        }

        #[test]
        fn a_name_matches_itself_and_its_wildcarded_forms(
            name in "[a-z0-9][a-z0-9.-]{0,20}",
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
            holes in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
        ) {
            prop_assert!(glob_matches(&name, &name));
            prop_assert!(glob_matches("*", &name));
            let mut chars: Vec<char> = name.chars().collect();
            // Any character replaced by `?` still matches.
            for hole in &holes {
                let at = hole.index(chars.len());
                chars[at] = '?';
            }
            let question: String = chars.iter().collect();
            prop_assert!(glob_matches(&question, &name), "{} against {}", question, name);
            // Any run replaced by `*` still matches.
            let mut starred: Vec<char> = name.chars().collect();
            for cut in &cuts {
                let at = cut.index(starred.len() + 1);
                let end = (at + 2).min(starred.len());
                starred.splice(at..end, ['*']);
            }
            let starred: String = starred.iter().collect();
            prop_assert!(glob_matches(&starred, &name), "{} against {}", starred, name);
        }

        #[test]
        fn a_literal_pattern_matches_only_itself(pattern in "[a-z-]{0,8}", name in "[a-z-]{0,8}") {
            prop_assert_eq!(glob_matches(&pattern, &name), pattern == name);
        }
    }
}
