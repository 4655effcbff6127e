//! What the hub's identity may never write in a member, whatever its RBAC says.
//!
//! Kubernetes RBAC cannot take namespaces out of a ClusterRole, so the hub's account in a
//! member may write its propagated kinds (Secrets among them) in `kube-system` too. The
//! hub never does (templates in `kube-*` and `bulkhead-system` are never propagated), but
//! a hub whose credentials leak, or a bug, could. `bulkhead join` therefore installs a
//! ValidatingAdmissionPolicy in the member (CEL in the member's API server, Kubernetes >=
//! 1.30) that refuses the hub's account every create, update and delete in `kube-*`, in
//! `bulkhead-system` (except the fencing Lease and its own token requests) and in the
//! namespaces `join --protect-namespace` names. `unjoin --cleanup` removes it.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::api::SYSTEM_NAMESPACE;
use crate::hub::membership::tokens::HUB_ACCOUNT;

/// Name of the policy and of its binding in the member.
pub const NAME: &str = "bulkhead-hub-guard";

/// The hub account's user name in the member.
pub fn hub_user() -> String {
    format!("system:serviceaccount:{SYSTEM_NAMESPACE}:{HUB_ACCOUNT}")
}

/// Checks `--protect-namespace` entries: a namespace name, or a prefix ending in `*`.
pub fn check_protected(entries: &[String]) -> anyhow::Result<()> {
    for entry in entries {
        let name = entry.strip_suffix('*').unwrap_or(entry);
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !valid {
            anyhow::bail!(
                "--protect-namespace {entry:?}: give a namespace name, or a prefix ending in * (for example cert-manager or monitoring-*); nothing was changed"
            );
        }
    }
    Ok(())
}

fn quoted(text: &str) -> String {
    // Entries are checked ([`check_protected`]): no quote or backslash can occur.
    format!("'{text}'")
}

/// The CEL condition that is true for a request the hub's account may not make.
fn forbidden(protected: &[String]) -> String {
    let mut parts = vec![
        "request.namespace.startsWith('kube-')".to_string(),
        format!(
            "(request.namespace == {} && !(request.resource.group == 'coordination.k8s.io' && request.resource.resource == 'leases') && !(request.resource.resource == 'serviceaccounts' && has(request.subResource) && request.subResource == 'token'))",
            quoted(SYSTEM_NAMESPACE)
        ),
    ];
    for entry in protected {
        parts.push(match entry.strip_suffix('*') {
            Some(prefix) => format!("request.namespace.startsWith({})", quoted(prefix)),
            None => format!("request.namespace == {}", quoted(entry)),
        });
    }
    parts.join(" || ")
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

/// The policy `join` applies in a member.
pub fn policy(protected: &[String]) -> ValidatingAdmissionPolicy {
    let user = hub_user();
    ValidatingAdmissionPolicy {
        metadata: metadata(),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec!["*".into()]),
                    api_versions: Some(vec!["*".into()]),
                    // Every resource and subresource ("*/*" may not be listed with others).
                    resources: Some(vec!["*/*".into()]),
                    operations: Some(vec!["CREATE".into(), "UPDATE".into(), "DELETE".into()]),
                    scope: Some("Namespaced".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            // Only the hub's requests are evaluated at all.
            match_conditions: Some(vec![MatchCondition {
                name: "the-hub".into(),
                expression: format!("request.userInfo.username == {}", quoted(&user)),
            }]),
            validations: Some(vec![Validation {
                expression: format!("!({})", forbidden(protected)),
                message_expression: Some(format!(
                    "'the Bulkhead hub ({user}) may not ' + request.operation + ' ' + request.resource.resource + (has(request.subResource) ? '/' + request.subResource : '') + ' ' + request.name + ' in namespace ' + request.namespace + ' of this member: kube-*, {SYSTEM_NAMESPACE} and the namespaces bulkhead join --protect-namespace named are never written by the hub (the policy {NAME}); propagate into another namespace'"
                )),
                reason: Some("Forbidden".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The binding that puts [`policy`] in force.
pub fn binding() -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata: metadata(),
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: NAME.into(),
            validation_actions: vec!["Deny".into()],
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_names_kube_the_system_namespace_and_the_operators_list() {
        let condition = forbidden(&["cert-manager".into(), "monitoring-*".into()]);
        assert!(condition.contains("request.namespace.startsWith('kube-')"));
        assert!(condition.contains("request.namespace == 'bulkhead-system'"));
        assert!(condition.contains("request.namespace == 'cert-manager'"));
        assert!(condition.contains("request.namespace.startsWith('monitoring-')"));
        // The fencing Lease and token requests stay allowed in bulkhead-system.
        assert!(condition.contains("'leases'") && condition.contains("'token'"));
        let policy = policy(&[]);
        let spec = policy.spec.unwrap();
        assert_eq!(
            spec.match_conditions.unwrap()[0].expression,
            "request.userInfo.username == 'system:serviceaccount:bulkhead-system:bulkhead-hub'"
        );
        assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    }

    #[test]
    fn protected_entries_are_names_or_prefixes() {
        assert!(check_protected(&["cert-manager".into(), "team-*".into()]).is_ok());
        for bad in ["Default", "*", "a'b", "x\\y", ""] {
            let error = check_protected(&[bad.into()]).unwrap_err().to_string();
            assert!(error.contains("--protect-namespace"), "{error}");
        }
    }
}
