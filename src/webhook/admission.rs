//! AdmissionReview handling: decode, dispatch by kind to the pure rules, encode.

use std::sync::Arc;

use arc_swap::ArcSwap;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::tenants::{TenantRegistry, TenantRules};
use super::{mutate, validate};
use crate::api::{ClusterPropagationPolicy, MemberCluster, MyDatabase, PropagationPolicy};

/// What the handlers need besides the request.
pub struct AdmissionState {
    pub tenants: Arc<TenantRegistry>,
    /// In strict mode, the registered member cluster names.
    pub known_clusters: Option<Arc<ArcSwap<Vec<String>>>>,
}

/// The outcome, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Patched,
    Denied,
    Malformed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Patched => "patched",
            Outcome::Denied => "denied",
            Outcome::Malformed => "malformed",
        }
    }
}

/// Validate or mutate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Validate,
    Mutate,
}

/// Decodes a review body; a body that is not an AdmissionReview is an error message.
pub fn decode(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, String> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body)
        .map_err(|e| format!("the body is not an AdmissionReview: {e}"))?;
    review
        .try_into()
        .map_err(|_| "the AdmissionReview has no request".to_string())
}

fn typed<T: DeserializeOwned>(object: &Value, what: &str) -> Result<T, String> {
    serde_json::from_value(object.clone())
        .map_err(|e| format!("{what} does not match its schema: {e}"))
}

fn tenant_rules(
    state: &AdmissionState,
    object: &Value,
    namespace: Option<&str>,
) -> Option<(String, Arc<TenantRules>)> {
    let annotations: Option<std::collections::BTreeMap<String, String>> =
        serde_json::from_value(object["metadata"]["annotations"].clone()).ok();
    let tenant = state.tenants.tenant_of(annotations.as_ref(), namespace)?;
    let rules = state.tenants.rules_for(&tenant)?;
    Some((tenant, rules))
}

/// Answers one admission request, returning the response and what it was.
pub fn review(
    hook: Hook,
    request: &AdmissionRequest<DynamicObject>,
    state: &AdmissionState,
) -> (AdmissionResponse, Outcome) {
    let response = AdmissionResponse::from(request);
    if request.operation == Operation::Delete || request.operation == Operation::Connect {
        return (response, Outcome::Allowed);
    }
    let Some(object) = request
        .object
        .as_ref()
        .and_then(|o| serde_json::to_value(o).ok())
    else {
        return (response, Outcome::Allowed);
    };
    let old = request
        .old_object
        .as_ref()
        .and_then(|o| serde_json::to_value(o).ok());
    let kind = request.kind.kind.as_str();
    let namespace = request.namespace.as_deref();
    let name = if request.name.is_empty() {
        object["metadata"]["name"]
            .as_str()
            .or(object["metadata"]["generateName"].as_str())
            .unwrap_or("<unnamed>")
            .to_string()
    } else {
        request.name.clone()
    };
    let described = validate::describe(kind, namespace, &name);
    let tenant = tenant_rules(state, &object, namespace);
    let tenant_ref = tenant.as_ref().map(|(t, r)| (t.as_str(), r.as_ref()));
    tracing::debug!(?hook, object = %described, tenant = ?tenant.as_ref().map(|(t, _)| t), "admission request");

    let result: Result<Vec<Value>, Vec<String>> = match (hook, kind) {
        (Hook::Validate, "MyDatabase") => typed::<MyDatabase>(&object, &described)
            .map_err(|e| vec![e])
            .and_then(|db| {
                let old: Option<MyDatabase> = old.as_ref().and_then(|o| typed(o, &described).ok());
                let problems = validate::mydatabase(&described, &db.spec, old.as_ref(), tenant_ref);
                if problems.is_empty() {
                    Ok(vec![])
                } else {
                    Err(problems)
                }
            }),
        (Hook::Validate, "PropagationPolicy" | "ClusterPropagationPolicy") => {
            let spec = if kind == "PropagationPolicy" {
                typed::<PropagationPolicy>(&object, &described).map(|p| p.spec)
            } else {
                typed::<ClusterPropagationPolicy>(&object, &described).map(|p| p.spec.policy)
            };
            spec.map_err(|e| vec![e]).and_then(|spec| {
                let known = state.known_clusters.as_ref().map(|k| k.load_full());
                let problems = validate::policy(
                    &described,
                    &spec,
                    kind == "PropagationPolicy",
                    known.as_deref().map(Vec::as_slice),
                );
                if problems.is_empty() {
                    Ok(vec![])
                } else {
                    Err(problems)
                }
            })
        }
        (Hook::Validate, "MemberCluster") => typed::<MemberCluster>(&object, &described)
            .map_err(|e| vec![e])
            .and_then(|mc| {
                let problems = validate::member_cluster(&described, &mc.spec);
                if problems.is_empty() {
                    Ok(vec![])
                } else {
                    Err(problems)
                }
            }),
        (Hook::Validate, "StatefulSet") => {
            typed::<k8s_openapi::api::apps::v1::StatefulSet>(&object, &described)
                .map_err(|e| vec![e])
                .and_then(|sts| {
                    let problems = validate::statefulset(&described, &sts);
                    if problems.is_empty() {
                        Ok(vec![])
                    } else {
                        Err(problems)
                    }
                })
        }
        (Hook::Mutate, "MyDatabase") => Ok(mutate::mydatabase(&object, tenant_ref)),
        (Hook::Mutate, "PropagationPolicy") => {
            mutate::policy(&described, &object, tenant_ref).map_err(|e| vec![e])
        }
        _ => Ok(vec![]),
    };
    match result {
        Ok(ops) if ops.is_empty() => (response, Outcome::Allowed),
        Ok(ops) => match serde_json::from_value::<json_patch::Patch>(Value::Array(ops))
            .map(|p| response.clone().with_patch(p))
        {
            Ok(Ok(patched)) => (patched, Outcome::Patched),
            _ => (
                response.deny(format!(
                    "{described}: internal error building the defaulting patch"
                )),
                Outcome::Denied,
            ),
        },
        Err(problems) => (response.deny(problems.join("; ")), Outcome::Denied),
    }
}

/// Encodes a response as an AdmissionReview body.
pub fn encode(response: AdmissionResponse) -> Vec<u8> {
    serde_json::to_vec(&response.into_review()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn state() -> AdmissionState {
        AdmissionState {
            tenants: TenantRegistry::new(),
            known_clusters: None,
        }
    }

    fn request(kind: &str, group: &str, version: &str, object: Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": group, "version": version, "kind": kind},
                "resource": {"group": group, "version": version, "resource": format!("{}s", kind.to_lowercase())},
                "name": object["metadata"]["name"],
                "namespace": "shop",
                "operation": "CREATE",
                "userInfo": {"username": "admin"},
                "object": object,
                "dryRun": false
            }
        }))
        .unwrap()
    }

    fn db(replicas: i32) -> Value {
        serde_json::json!({"apiVersion": "example.com/v1", "kind": "MyDatabase", "metadata": {"name": "orders", "namespace": "shop"}, "spec": {"replicas": replicas, "version": "16"}})
    }

    #[test]
    fn denies_an_invalid_mydatabase_with_the_rule() {
        let request = decode(&request("MyDatabase", "example.com", "v1", db(0))).unwrap();
        let (response, outcome) = review(Hook::Validate, &request, &state());
        assert_eq!(outcome, Outcome::Denied);
        assert!(!response.allowed);
        assert!(
            response
                .result
                .message
                .contains("MyDatabase shop/orders: spec.replicas is 0"),
            "{}",
            response.result.message
        );
        let body: Value = serde_json::from_slice(&encode(response)).unwrap();
        assert_eq!(
            body["response"]["uid"],
            "705ab4f5-6393-11e8-b7cc-42010a800002"
        );
        assert_eq!(body["response"]["allowed"], false);
    }

    #[test]
    fn allows_a_valid_mydatabase() {
        let request = decode(&request("MyDatabase", "example.com", "v1", db(3))).unwrap();
        assert_eq!(
            review(Hook::Validate, &request, &state()).1,
            Outcome::Allowed
        );
    }

    #[test]
    fn mutation_adds_tenant_defaults_as_a_json_patch() {
        let state = state();
        state
            .tenants
            .store_namespaces(HashMap::from([("shop".into(), "team-a".into())]));
        let (rules, _) = super::super::tenants::next_rules(
            &Default::default(),
            &[super::super::tenants::RuleSource {
                name: "r".into(),
                tenant: Some("team-a".into()),
                policy_yaml: Some("defaults: {image: registry.local/postgres}".into()),
            }],
        );
        state.tenants.store_rules(rules);
        let request = decode(&request("MyDatabase", "example.com", "v1", db(3))).unwrap();
        let (response, outcome) = review(Hook::Mutate, &request, &state);
        assert_eq!(outcome, Outcome::Patched);
        let patch: Value = serde_json::from_slice(response.patch.as_ref().unwrap()).unwrap();
        assert!(
            patch.to_string().contains("registry.local/postgres"),
            "{patch}"
        );
    }

    #[test]
    fn a_statefulset_without_service_name_is_denied() {
        let sts = serde_json::json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
            "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": []}}}});
        let request = decode(&request("StatefulSet", "apps", "v1", sts)).unwrap();
        let (response, outcome) = review(Hook::Validate, &request, &state());
        assert_eq!(outcome, Outcome::Denied);
        assert!(response.result.message.contains("spec.serviceName"));
    }

    #[test]
    fn malformed_bodies_are_errors_not_panics() {
        for body in [
            &b""[..],
            b"{}",
            b"[]",
            b"null",
            b"{\"request\": 5}",
            b"\xff\xfe",
            b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}",
        ] {
            assert!(decode(body).is_err(), "{:?}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn fuzzed_bodies_never_panic() {
        // A deterministic pseudo-random walk over mutations of a valid body.
        let valid = request("MyDatabase", "example.com", "v1", db(3));
        let mut seed: u64 = 0x9E3779B97F4A7C15;
        for _ in 0..2000 {
            let mut body = valid.clone();
            for _ in 0..4 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let at = (seed as usize) % body.len();
                match seed % 3 {
                    0 => body[at] = (seed >> 8) as u8,
                    1 => body.truncate(at.max(1)),
                    _ => body.insert(at, b"{}[]\",:0"[(seed % 8) as usize]),
                }
            }
            if let Ok(request) = decode(&body) {
                let _ = review(Hook::Validate, &request, &state());
                let _ = review(Hook::Mutate, &request, &state());
            }
        }
    }
}
