//! The cleanup finalizer, added by the hub API server itself when a template is created.
//!
//! Every template a policy selects must carry `federation.example.com/cleanup` before
//! any copy of it goes out (DESIGN.md section 4). The hub adds it with a patch when it
//! first reconciles the template: a hub write and a round trip before the copies. A
//! `MutatingAdmissionPolicy` (admissionregistration.k8s.io/v1, CEL run inside the API
//! server, no webhook) adds it in the create request instead, for templates that a
//! policy selects at that moment: no write, no round trip.
//!
//! The admission policy is an optimisation, never the guarantee. Its failure policy is
//! `Ignore`, and a template that arrives without the finalizer (created before its policy,
//! with `generateName`, by a version of the API server without the kind, while the
//! policy's CEL could not be evaluated) gets it from the hub exactly as before. It never
//! blocks a create.
//!
//! What it matches is the policies' selectors written as one CEL condition ([`selected`]):
//! group and kind, the namespace a policy reaches, the name (exact or glob pattern) or
//! the label selector, never in `bulkhead-system` or a `kube-*` namespace. A template any
//! selector matches is one the hub places, and the hub removes the finalizer once the
//! template is deleted and its copies are gone. The one exception, a template created in
//! the moment its policy goes, loses the finalizer again as soon as the hub sees nothing
//! to clean up (`reconcile::nothing_to_clean_up`). The hub keeps the admission policy in
//! step with the policies (a quarter second after a change), deletes it when no policy
//! selects a federated kind, and reads it once when it starts instead of rewriting it
//! (a spec-hash annotation). `--finalizer-admission-policy=false` turns it off (and the
//! hub deletes it).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ApplyConfiguration, MatchCondition, MatchResources, MutatingAdmissionPolicy,
    MutatingAdmissionPolicyBinding, MutatingAdmissionPolicyBindingSpec,
    MutatingAdmissionPolicySpec, Mutation, NamedRuleWithOperations,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{ApiResource, DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::api::FINALIZER_CLEANUP;
use crate::api::SYSTEM_NAMESPACE;
use crate::api::propagation_policy::ResourceSelector;
use crate::error::{ApiErrorKind, classify};
use crate::hub::federation::matching::{
    PolicyCandidate, PolicyScope, is_pattern, matches_every_name,
};

/// Name of the MutatingAdmissionPolicy and of its binding.
pub const NAME: &str = "bulkhead-template-cleanup";
/// Field manager of the hub's writes of both.
pub const FIELD_MANAGER: &str = "bulkhead-hub-admission";
/// Selectors in one condition, at most. Past that the hub adds every finalizer itself:
/// the API server estimates the cost of a CEL expression, and one condition per
/// thousand selectors would risk being refused or slowing every create.
pub const MAX_SELECTORS: usize = 200;
/// How long after a policy change the admission policy is written (a burst of policy
/// changes is one write).
const COALESCE: Duration = Duration::from_millis(250);
/// How long after a failed write it is tried again.
const RETRY: Duration = Duration::from_secs(5);
/// Annotation with a hash of the spec the hub wrote: a hub that starts finds the
/// admission policy as wanted by one read, and writes nothing.
pub const ANNOTATION_SPEC_HASH: &str = "federation.example.com/spec-hash";

/// A CEL string literal (JSON's escapes are CEL's).
fn literal(text: &str) -> String {
    serde_json::to_string(text).expect("a string serialises")
}

/// A CEL list literal of strings.
fn list(items: &[String]) -> String {
    let items: Vec<String> = items.iter().map(|i| literal(i)).collect();
    format!("[{}]", items.join(", "))
}

/// The RE2 regular expression of a name pattern (`*` any run of characters, `?` one),
/// anchored at both ends, every other character literal.
pub fn glob_regex(pattern: &str) -> String {
    let mut regex = String::from("^");
    for c in pattern.chars() {
        match c {
            '*' => regex.push_str(".*"),
            '?' => regex.push('.'),
            c if "\\.+()|[]{}^$".contains(c) => {
                regex.push('\\');
                regex.push(c);
            }
            c => regex.push(c),
        }
    }
    regex.push('$');
    regex
}

const LABELS: &str = "object.metadata.labels";

/// The label selector as CEL over the created object's labels (the same rules as
/// `label_selector_matches`: matchLabels and In/NotIn/Exists/DoesNotExist; an unknown
/// operator matches nothing).
fn labels_condition(selector: &LabelSelector) -> String {
    let has = |key: &str| format!("(has({LABELS}) && {} in {LABELS})", literal(key));
    let lacks = |key: &str| format!("(!has({LABELS}) || !({} in {LABELS}))", literal(key));
    let mut terms = vec![];
    for (key, value) in selector.match_labels.iter().flatten() {
        terms.push(format!(
            "({} && {LABELS}[{}] == {})",
            has(key),
            literal(key),
            literal(value)
        ));
    }
    for requirement in selector.match_expressions.iter().flatten() {
        let key = &requirement.key;
        let values = list(requirement.values.as_deref().unwrap_or_default());
        terms.push(match requirement.operator.as_str() {
            "In" => format!("({} && {LABELS}[{}] in {values})", has(key), literal(key)),
            "NotIn" => format!(
                "({} || !({LABELS}[{}] in {values}))",
                lacks(key),
                literal(key)
            ),
            "Exists" => has(key),
            "DoesNotExist" => lacks(key),
            _ => "false".to_string(),
        });
    }
    if terms.is_empty() {
        "true".to_string()
    } else {
        terms.join(" && ")
    }
}

/// `selector` of a policy of `scope` (in `policy_namespace`) as CEL over the admission
/// request, the same rule as `matching::selector_strength` (a name beats labels).
/// None when the selector's kind is not federated (not in `kinds`).
fn selector_condition(
    selector: &ResourceSelector,
    scope: PolicyScope,
    policy_namespace: Option<&str>,
    kinds: &[ApiResource],
) -> Option<String> {
    let resource = kinds
        .iter()
        .find(|k| k.api_version == selector.api_version && k.kind == selector.kind)?;
    let mut terms = vec![
        format!("request.kind.group == {}", literal(&resource.group)),
        format!("request.kind.kind == {}", literal(&resource.kind)),
    ];
    let namespace = match scope {
        PolicyScope::Namespaced => Some(policy_namespace.unwrap_or_default()),
        PolicyScope::Cluster => selector.namespace.as_deref().filter(|ns| !ns.is_empty()),
    };
    if let Some(namespace) = namespace {
        terms.push(format!("request.namespace == {}", literal(namespace)));
    }
    match (&selector.name, &selector.label_selector) {
        (Some(name), _) if matches_every_name(name) => {}
        (Some(name), _) if is_pattern(name) => terms.push(format!(
            "has(object.metadata.name) && object.metadata.name.matches({})",
            literal(&glob_regex(name))
        )),
        (Some(name), _) => terms.push(format!(
            "has(object.metadata.name) && object.metadata.name == {}",
            literal(name)
        )),
        (None, Some(labels)) => terms.push(format!("({})", labels_condition(labels))),
        (None, None) => {}
    }
    Some(format!("({})", terms.join(" && ")))
}

/// The condition "some policy selects the created object", or None when no selector
/// reaches a federated kind (or there are more than [`MAX_SELECTORS`]).
pub fn selected(candidates: &[PolicyCandidate], kinds: &[ApiResource]) -> Option<String> {
    let mut any = vec![];
    for policy in candidates {
        for selector in &policy.spec.resource_selectors {
            if let Some(condition) =
                selector_condition(selector, policy.scope, policy.namespace, kinds)
            {
                any.push(condition);
            }
        }
    }
    if any.is_empty() || any.len() > MAX_SELECTORS {
        return None;
    }
    any.sort();
    any.dedup();
    Some(any.join(" || "))
}

/// The admission policy that adds the finalizer on create to what `candidates` select,
/// or None when nothing is to be matched.
pub fn desired_policy(
    candidates: &[PolicyCandidate],
    kinds: &[ApiResource],
) -> Option<MutatingAdmissionPolicy> {
    let selected = selected(candidates, kinds)?;
    let mut groups: Vec<(String, String)> = kinds
        .iter()
        .filter(|k| {
            candidates.iter().any(|p| {
                p.spec
                    .resource_selectors
                    .iter()
                    .any(|s| s.api_version == k.api_version && s.kind == k.kind)
            })
        })
        .map(|k| (k.group.clone(), k.plural.clone()))
        .collect();
    groups.sort();
    groups.dedup();
    let rules = groups
        .into_iter()
        .map(|(group, plural)| NamedRuleWithOperations {
            api_groups: Some(vec![group]),
            api_versions: Some(vec!["*".to_string()]),
            resources: Some(vec![plural]),
            operations: Some(vec!["CREATE".to_string()]),
            scope: Some("Namespaced".to_string()),
            ..Default::default()
        })
        .collect();
    let mut excluded = format!(
        "request.namespace != {} && !request.namespace.startsWith(\"kube-\")",
        literal(SYSTEM_NAMESPACE)
    );
    let filter = crate::hub::federation::scheduler::namespace_filter();
    let is = |entry: &str| match entry.strip_suffix('*') {
        Some(prefix) => format!("request.namespace.startsWith({})", literal(prefix)),
        None => format!("request.namespace == {}", literal(entry)),
    };
    for entry in filter.exclude.iter().chain(filter.own.iter()) {
        excluded.push_str(&format!(" && !({})", is(entry)));
    }
    if !filter.include.is_empty() {
        let any: Vec<String> = filter.include.iter().map(|e| is(e)).collect();
        excluded.push_str(&format!(" && ({})", any.join(" || ")));
    }
    let mut policy = MutatingAdmissionPolicy {
        metadata: metadata(),
        spec: Some(MutatingAdmissionPolicySpec {
            // Never in the way of a create: the hub adds what this did not.
            failure_policy: Some("Ignore".to_string()),
            reinvocation_policy: Some("Never".to_string()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(rules),
                match_policy: Some("Equivalent".to_string()),
                ..Default::default()
            }),
            match_conditions: Some(vec![
                MatchCondition {
                    name: "federated-namespace".to_string(),
                    expression: excluded,
                },
                MatchCondition {
                    name: "selected-by-a-policy".to_string(),
                    expression: selected,
                },
            ]),
            mutations: Some(vec![Mutation {
                patch_type: "ApplyConfiguration".to_string(),
                apply_configuration: Some(ApplyConfiguration {
                    expression: Some(format!(
                        "Object{{metadata: Object.metadata{{finalizers: [{}]}}}}",
                        literal(FINALIZER_CLEANUP)
                    )),
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    };
    let hash = crate::hub::federation::placement::stable_hash(
        &serde_json::to_string(&policy.spec).unwrap_or_default(),
        NAME,
    );
    policy
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(ANNOTATION_SPEC_HASH.to_string(), format!("{hash:016x}"));
    Some(policy)
}

/// The binding that puts the admission policy in force everywhere it matches.
pub fn desired_binding() -> MutatingAdmissionPolicyBinding {
    MutatingAdmissionPolicyBinding {
        metadata: metadata(),
        spec: Some(MutatingAdmissionPolicyBindingSpec {
            policy_name: Some(NAME.to_string()),
            ..Default::default()
        }),
    }
}

fn metadata() -> ObjectMeta {
    ObjectMeta {
        name: Some(NAME.to_string()),
        labels: Some(
            [(
                crate::api::LABEL_MANAGED_BY.to_string(),
                "bulkhead".to_string(),
            )]
            .into(),
        ),
        ..Default::default()
    }
}

/// The task's handle: policy changes touch it.
#[derive(Default)]
pub struct Changes {
    notify: Notify,
}

impl Changes {
    /// The policies changed: the admission policy may have to follow.
    pub fn touch(&self) {
        self.notify.notify_one();
    }
}

/// What the hub last wrote, or found in place.
#[derive(Clone, Debug, PartialEq)]
enum Written {
    Nothing,
    Policy(Box<MutatingAdmissionPolicy>),
    Deleted,
}

/// Keeps the admission policy in step with the policies until shutdown: computed by
/// `desired` (from the policies the controller's stores hold) a moment after each
/// change, written only when it differs from what was last written. With `enabled`
/// false it is deleted once and left alone. What the hub finds in place when it starts
/// (one read of each object) counts as written, by the hash of its spec: a restarted hub
/// writes nothing. `count_write` hears of every write.
pub async fn run(
    hub: Client,
    changes: Arc<Changes>,
    enabled: bool,
    desired: impl Fn() -> Option<Option<MutatingAdmissionPolicy>> + Send,
    count_write: impl Fn() + Send + Sync,
    shutdown: CancellationToken,
) {
    let mut written = Written::Nothing;
    let mut retry: Option<Duration> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = changes.notify.notified() => {}
            _ = tokio::time::sleep(retry.unwrap_or(RETRY)), if retry.is_some() => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(COALESCE) => {}
        }
        // None: the stores have not listed yet.
        let Some(wanted) = (if enabled { desired() } else { Some(None) }) else {
            retry = Some(COALESCE);
            continue;
        };
        retry = None;
        if written == Written::Nothing {
            match in_place(&hub).await {
                Ok(found) => written = found,
                Err(error) => {
                    tracing::warn!(policy = NAME, %error, "cannot read the MutatingAdmissionPolicy that adds the cleanup finalizer on create; the hub adds the finalizer itself meanwhile");
                    retry = Some(RETRY);
                    continue;
                }
            }
        }
        let outcome = match wanted {
            Some(policy) if !same_spec(&written, &policy) => apply(&hub, &policy, &count_write)
                .await
                .map(|()| Written::Policy(Box::new(policy))),
            None if written != Written::Deleted => {
                delete(&hub, &count_write).await.map(|()| Written::Deleted)
            }
            _ => continue,
        };
        match outcome {
            Ok(now) => written = now,
            Err(error) if classify(&error) == ApiErrorKind::NotFound => {
                // An apply creates what is missing: a 404 is the API itself missing.
                tracing::info!(
                    "the hub API server does not serve admissionregistration.k8s.io/v1 MutatingAdmissionPolicy; the hub adds the cleanup finalizer itself"
                );
                return;
            }
            Err(error) => {
                tracing::warn!(policy = NAME, %error, "cannot write the MutatingAdmissionPolicy that adds the cleanup finalizer on create; the hub adds the finalizer itself meanwhile");
                retry = Some(RETRY);
            }
        }
    }
}

fn spec_hash(policy: &MutatingAdmissionPolicy) -> Option<&String> {
    policy
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_SPEC_HASH)
}

/// Whether what was written (or found) is `policy`, by the hash of its spec.
fn same_spec(written: &Written, policy: &MutatingAdmissionPolicy) -> bool {
    matches!(written, Written::Policy(w) if spec_hash(w).is_some() && spec_hash(w) == spec_hash(policy))
}

/// What the hub API server holds: the policy with the binding the hub writes, neither
/// (Deleted; also when it does not serve the API), or anything else (Nothing: to be
/// written).
async fn in_place(hub: &Client) -> Result<Written, kube::Error> {
    let policy = Api::<MutatingAdmissionPolicy>::all(hub.clone())
        .get_opt(NAME)
        .await?;
    let binding = Api::<MutatingAdmissionPolicyBinding>::all(hub.clone())
        .get_opt(NAME)
        .await?;
    let bound = binding.is_some_and(|b| {
        b.spec.and_then(|s| s.policy_name) == desired_binding().spec.and_then(|s| s.policy_name)
    });
    Ok(match policy {
        None if !bound => Written::Deleted,
        Some(policy) if bound => Written::Policy(Box::new(policy)),
        _ => Written::Nothing,
    })
}

async fn apply(
    hub: &Client,
    policy: &MutatingAdmissionPolicy,
    count_write: &impl Fn(),
) -> Result<(), kube::Error> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    Api::<MutatingAdmissionPolicy>::all(hub.clone())
        .patch(NAME, &params, &Patch::Apply(policy))
        .await?;
    count_write();
    Api::<MutatingAdmissionPolicyBinding>::all(hub.clone())
        .patch(NAME, &params, &Patch::Apply(&desired_binding()))
        .await?;
    count_write();
    tracing::info!(
        policy = NAME,
        "the API server adds the cleanup finalizer to templates the policies select when they are created"
    );
    Ok(())
}

/// Deletes the binding and the policy; what is not there is deleted already.
async fn delete(hub: &Client, count_write: &impl Fn()) -> Result<(), kube::Error> {
    let gone = |result: Result<_, kube::Error>| -> Result<(), kube::Error> {
        count_write();
        match result {
            Ok(_) => Ok(()),
            Err(error) if classify(&error) == ApiErrorKind::NotFound => Ok(()),
            Err(error) => Err(error),
        }
    };
    gone(
        Api::<MutatingAdmissionPolicyBinding>::all(hub.clone())
            .delete(NAME, &DeleteParams::default())
            .await
            .map(|_| ()),
    )?;
    gone(
        Api::<MutatingAdmissionPolicy>::all(hub.clone())
            .delete(NAME, &DeleteParams::default())
            .await
            .map(|_| ()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::propagation_policy::PropagationSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn deployments() -> Vec<ApiResource> {
        vec![
            crate::hub::federation::scheduler::resource("apps", "v1", "Deployment", "deployments"),
            crate::hub::federation::scheduler::resource("", "v1", "ConfigMap", "configmaps"),
        ]
    }

    fn selector(kind: &str, name: Option<&str>, labels: Option<LabelSelector>) -> ResourceSelector {
        ResourceSelector {
            api_version: if kind == "Deployment" {
                "apps/v1"
            } else {
                "v1"
            }
            .into(),
            kind: kind.into(),
            name: name.map(Into::into),
            namespace: None,
            label_selector: labels,
        }
    }

    fn in_shop(spec: &PropagationSpec) -> PolicyCandidate<'_> {
        PolicyCandidate {
            scope: PolicyScope::Namespaced,
            namespace: Some("shop"),
            name: "p",
            spec,
        }
    }

    fn spec(selectors: Vec<ResourceSelector>) -> PropagationSpec {
        PropagationSpec {
            resource_selectors: selectors,
            ..Default::default()
        }
    }

    #[test]
    fn name_patterns_become_anchored_regular_expressions() {
        assert_eq!(glob_regex("web-*"), "^web-.*$");
        assert_eq!(glob_regex("db-?"), "^db-.$");
        assert_eq!(glob_regex("a.b*"), "^a\\.b.*$");
        assert_eq!(glob_regex("exact"), "^exact$");
    }

    #[test]
    fn each_selector_says_group_kind_namespace_and_name_or_labels() {
        let named = spec(vec![selector("Deployment", Some("web"), None)]);
        let pattern = spec(vec![selector("Deployment", Some("api-*"), None)]);
        let kind_wide = spec(vec![selector("ConfigMap", None, None)]);
        let policy = in_shop;
        let condition = selected(&[policy(&named)], &deployments()).unwrap();
        assert_eq!(
            condition,
            "(request.kind.group == \"apps\" && request.kind.kind == \"Deployment\" && request.namespace == \"shop\" && has(object.metadata.name) && object.metadata.name == \"web\")"
        );
        let condition = selected(&[policy(&pattern)], &deployments()).unwrap();
        assert!(
            condition.ends_with("object.metadata.name.matches(\"^api-.*$\"))"),
            "{condition}"
        );
        let condition = selected(&[policy(&kind_wide)], &deployments()).unwrap();
        assert_eq!(
            condition,
            "(request.kind.group == \"\" && request.kind.kind == \"ConfigMap\" && request.namespace == \"shop\")"
        );
    }

    #[test]
    fn a_cluster_policy_reaches_every_namespace_or_the_one_its_selector_names() {
        let mut in_one = selector("Deployment", None, None);
        in_one.namespace = Some("shop".into());
        let everywhere = spec(vec![selector("Deployment", None, None)]);
        let one = spec(vec![in_one]);
        let cluster = |spec| PolicyCandidate {
            scope: PolicyScope::Cluster,
            namespace: None,
            name: "c",
            spec,
        };
        let condition = selected(&[cluster(&everywhere)], &deployments()).unwrap();
        assert!(!condition.contains("request.namespace"), "{condition}");
        let condition = selected(&[cluster(&one)], &deployments()).unwrap();
        assert!(
            condition.contains("request.namespace == \"shop\""),
            "{condition}"
        );
    }

    #[test]
    fn label_selectors_follow_the_matching_rules() {
        let labels = LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "In".into(),
                    values: Some(vec!["a".into(), "b".into()]),
                },
                LabelSelectorRequirement {
                    key: "canary".into(),
                    operator: "DoesNotExist".into(),
                    values: None,
                },
                LabelSelectorRequirement {
                    key: "x".into(),
                    operator: "Sometimes".into(),
                    values: None,
                },
            ]),
        };
        let condition = labels_condition(&labels);
        assert_eq!(
            condition,
            "((has(object.metadata.labels) && \"app\" in object.metadata.labels) && object.metadata.labels[\"app\"] == \"web\") && \
             ((has(object.metadata.labels) && \"tier\" in object.metadata.labels) && object.metadata.labels[\"tier\"] in [\"a\", \"b\"]) && \
             (!has(object.metadata.labels) || !(\"canary\" in object.metadata.labels)) && false"
        );
        assert_eq!(labels_condition(&LabelSelector::default()), "true");
        // A name wins over labels, as in matching.
        let both = spec(vec![selector("Deployment", Some("web"), Some(labels))]);
        let policy = in_shop(&both);
        let condition = selected(&[policy], &deployments()).unwrap();
        assert!(!condition.contains("labels"), "{condition}");
    }

    #[test]
    fn no_federated_kind_or_too_many_selectors_means_no_admission_policy() {
        let unknown = spec(vec![ResourceSelector {
            api_version: "example.com/v1".into(),
            kind: "Gizmo".into(),
            ..Default::default()
        }]);
        let policy = in_shop(&unknown);
        assert!(desired_policy(&[policy], &deployments()).is_none());
        assert!(desired_policy(&[], &deployments()).is_none());
        let many = spec(
            (0..=MAX_SELECTORS)
                .map(|i| selector("Deployment", Some(&format!("web-{i}")), None))
                .collect(),
        );
        let policy = in_shop(&many);
        assert!(desired_policy(&[policy], &deployments()).is_none());
    }

    #[test]
    fn the_admission_policy_adds_the_finalizer_on_create_and_never_blocks() {
        let named = spec(vec![selector("Deployment", Some("web"), None)]);
        let policy = in_shop(&named);
        let admission = desired_policy(&[policy], &deployments()).unwrap();
        let spec = admission.spec.unwrap();
        assert_eq!(spec.failure_policy.as_deref(), Some("Ignore"));
        let rules = spec.match_constraints.unwrap().resource_rules.unwrap();
        assert_eq!(rules.len(), 1, "only the kinds a selector names");
        assert_eq!(rules[0].resources, Some(vec!["deployments".to_string()]));
        assert_eq!(rules[0].operations, Some(vec!["CREATE".to_string()]));
        let conditions = spec.match_conditions.unwrap();
        assert!(conditions[0].expression.contains("\"bulkhead-system\""));
        let mutation = &spec.mutations.unwrap()[0];
        assert_eq!(mutation.patch_type, "ApplyConfiguration");
        assert_eq!(
            mutation
                .apply_configuration
                .as_ref()
                .unwrap()
                .expression
                .as_deref(),
            Some(
                "Object{metadata: Object.metadata{finalizers: [\"federation.example.com/cleanup\"]}}"
            )
        );
        assert_eq!(
            desired_binding().spec.unwrap().policy_name.as_deref(),
            Some(NAME)
        );
    }

    #[test]
    fn the_spec_hash_tells_a_starting_hub_whether_to_write() {
        let web = spec(vec![selector("Deployment", Some("web"), None)]);
        let api = spec(vec![selector("Deployment", Some("api"), None)]);
        let first = desired_policy(&[in_shop(&web)], &deployments()).unwrap();
        let again = desired_policy(&[in_shop(&web)], &deployments()).unwrap();
        let other = desired_policy(&[in_shop(&api)], &deployments()).unwrap();
        assert!(spec_hash(&first).is_some());
        assert_eq!(spec_hash(&first), spec_hash(&again));
        assert_ne!(spec_hash(&first), spec_hash(&other));
        let found = Written::Policy(Box::new(first.clone()));
        assert!(same_spec(&found, &again), "found as wanted: no write");
        assert!(!same_spec(&found, &other), "selectors changed: written");
        let mut unmarked = first;
        unmarked.metadata.annotations = None;
        assert!(
            !same_spec(&Written::Policy(Box::new(unmarked)), &again),
            "one not written by this hub is written again"
        );
        assert!(!same_spec(&Written::Nothing, &again));
        assert!(!same_spec(&Written::Deleted, &again));
    }
}
