//! AdmissionReview handling: decode, dispatch by kind to the pure rules, encode.

use std::sync::Arc;

use arc_swap::ArcSwap;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::tenants::TenantRegistry;
use super::{mutate, validate};
use crate::api::{
    ClusterOverridePolicy, ClusterPropagationPolicy, MemberCluster, MyDatabase, OverridePolicy,
    PropagationPolicy,
};

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
    let (types, mut request): (_, AdmissionRequest<DynamicObject>) =
        super::read_review(body, "AdmissionReview")?;
    // The configurations ask for v1 only; the answer echoes the request's type.
    if (types.api_version.as_str(), types.kind.as_str())
        != ("admission.k8s.io/v1", "AdmissionReview")
    {
        return Err(format!(
            "the body is a {:?} {:?}, not an admission.k8s.io/v1 AdmissionReview",
            types.api_version, types.kind
        ));
    }
    request.types = types;
    Ok(request)
}

/// The object as its kind's typed spec, read from the decoded value in place (not a copy
/// of it: a 4 MiB object is decoded once).
fn typed<T: DeserializeOwned>(object: &Value, what: &str) -> Result<T, String> {
    T::deserialize(object).map_err(|e| {
        format!(
            "{what} does not match its schema ({e}); correct that field (kubectl explain lists the fields and their types), or re-apply the CRDs if they are older than this webhook"
        )
    })
}

/// The kinds tenant rules govern (in a namespace): their requests wait for the tenant
/// rules to be synced and may not claim another tenant.
fn tenant_governed(kind: &str) -> bool {
    matches!(kind, "MyDatabase" | "PropagationPolicy" | "OverridePolicy")
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
    // The API server always sends the object on CREATE and UPDATE.
    let Some((metadata, object)) = request
        .object
        .as_ref()
        .and_then(|o| Some((&o.metadata, serde_json::to_value(o).ok()?)))
    else {
        return (response, Outcome::Allowed);
    };
    let old = request
        .old_object
        .as_ref()
        .and_then(|o| serde_json::to_value(o).ok());
    // An object on its way out whose spec stays as it is: its finalizers being removed
    // (the hub's, an agent's), a label or status touched. Refusing it (a tenant rule
    // tightened since it was created, the rules not synced yet) would only keep it, and
    // its namespace, from ever being deleted.
    if let Some(old) = &old
        && !old["metadata"]["deletionTimestamp"].is_null()
        && old.get("spec") == object.get("spec")
    {
        return (response, Outcome::Allowed);
    }
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
    let tenant = if tenant_governed(kind) {
        let stored = request.old_object.as_ref().map(|o| &o.metadata);
        match state
            .tenants
            .snapshot()
            .resolve(&described, namespace, metadata, stored)
        {
            Ok(tenant) => tenant,
            Err(denial) => return (response.deny(denial), Outcome::Denied),
        }
    } else {
        None
    };
    let tenant_ref = tenant.as_ref().map(|t| (t.name.as_str(), t.rules.as_ref()));
    tracing::debug!(?hook, object = %described, tenant = ?tenant.as_ref().map(|t| &t.name), "admission request");

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
                let mut problems = validate::policy(
                    &described,
                    &spec,
                    kind == "PropagationPolicy",
                    known.as_deref().map(Vec::as_slice),
                );
                if kind == "PropagationPolicy"
                    && let Some((tenant, rules)) = tenant_ref
                {
                    problems.extend(validate::policy_within_tenant_rules(
                        &described, &spec, tenant, rules,
                    ));
                }
                if problems.is_empty() {
                    Ok(vec![])
                } else {
                    Err(problems)
                }
            })
        }
        (Hook::Validate, "OverridePolicy" | "ClusterOverridePolicy") => {
            let namespaced = kind == "OverridePolicy";
            let operators = validate::override_operators(&described, &object);
            let spec = if !operators.is_empty() {
                Err(operators)
            } else if namespaced {
                typed::<OverridePolicy>(&object, &described)
                    .map(|p| p.spec)
                    .map_err(|e| vec![e])
            } else {
                typed::<ClusterOverridePolicy>(&object, &described)
                    .map(|p| p.spec.policy)
                    .map_err(|e| vec![e])
            };
            spec.and_then(|spec| {
                let known = state.known_clusters.as_ref().map(|k| k.load_full());
                let mut problems = validate::override_policy(
                    &described,
                    &spec,
                    namespaced,
                    known.as_deref().map(Vec::as_slice),
                );
                if let Some((tenant, rules)) = tenant_ref {
                    problems.extend(validate::override_within_tenant_rules(
                        &described, &spec, tenant, rules,
                    ));
                }
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
        (Hook::Validate, "ResourceInterpreter") => {
            typed::<crate::api::ResourceInterpreter>(&object, &described)
                .map_err(|e| vec![e])
                .and_then(|interpreter| {
                    crate::hub::federation::interpreter::admit(&interpreter.spec)
                        .map(|()| vec![])
                        .map_err(|e| vec![format!("{described}: {e}")])
                })
        }
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
    use crate::api::LABEL_TENANT;
    use std::collections::HashMap;

    /// Synced, with no tenants.
    fn state() -> AdmissionState {
        let tenants = TenantRegistry::new();
        tenants.store_rules(Default::default());
        tenants.store_namespaces(HashMap::new());
        AdmissionState {
            tenants,
            known_clusters: None,
        }
    }

    /// Synced: namespace shop belongs to team-a (maxReplicas 3, allowed clusters east and
    /// west, version 16 only); team-b, which owns no namespace here, may have 9.
    fn tenant_state() -> AdmissionState {
        let state = state();
        state
            .tenants
            .store_namespaces(HashMap::from([("shop".into(), "team-a".into())]));
        let source = |tenant: &str, yaml: &str| super::super::tenants::RuleSource {
            name: format!("{tenant}-rules"),
            tenant: Some(tenant.into()),
            policy_yaml: Some(yaml.into()),
        };
        let (rules, _) = super::super::tenants::next_rules(
            &Default::default(),
            &[
                source(
                    "team-a",
                    "maxReplicas: 3\nallowedClusters: [east, west]\nallowedVersions: [\"16\"]",
                ),
                source("team-b", "maxReplicas: 9"),
            ],
        );
        state.tenants.store_rules(rules);
        state
    }

    fn request(kind: &str, group: &str, version: &str, object: Value) -> Vec<u8> {
        request_with(kind, group, version, "CREATE", object, None)
    }

    fn request_with(
        kind: &str,
        group: &str,
        version: &str,
        operation: &str,
        object: Value,
        old: Option<Value>,
    ) -> Vec<u8> {
        let namespace = object["metadata"]["namespace"].clone();
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": group, "version": version, "kind": kind},
                "resource": {"group": group, "version": version, "resource": format!("{}s", kind.to_lowercase())},
                "name": object["metadata"]["name"],
                "namespace": namespace,
                "operation": operation,
                "userInfo": {"username": "admin"},
                "object": object,
                "oldObject": old,
                "dryRun": false
            }
        }))
        .unwrap()
    }

    fn with_claim(mut object: Value, field: &str, tenant: &str) -> Value {
        object["metadata"][field] = serde_json::json!({LABEL_TENANT: tenant});
        object
    }

    fn policy(name: &str) -> Value {
        serde_json::json!({"apiVersion": "federation.example.com/v1alpha1", "kind": "PropagationPolicy",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"resourceSelectors": [{"apiVersion": "example.com/v1", "kind": "MyDatabase"}]}})
    }

    fn answer(hook: Hook, body: &[u8], state: &AdmissionState) -> (AdmissionResponse, Outcome) {
        review(hook, &decode(body).unwrap(), state)
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

    fn override_policy(kind: &str, overriders: Value) -> Value {
        let mut policy = serde_json::json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": kind,
            "metadata": {"name": "web-east", "namespace": "shop"},
            "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}],
                     "overrideRules": [{"targetCluster": {"zones": ["zone-a"]}, "overriders": overriders}]}
        });
        if kind == "ClusterOverridePolicy" {
            policy["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("namespace");
        }
        policy
    }

    fn override_answer(kind: &str, overriders: Value) -> (AdmissionResponse, Outcome) {
        let body = request(
            kind,
            "federation.example.com",
            "v1alpha1",
            override_policy(kind, overriders),
        );
        answer(Hook::Validate, &body, &state())
    }

    #[test]
    fn a_tenants_policy_is_checked_after_the_narrowing_too() {
        let with_clusters = |clusters: Value| {
            let mut object = policy("orders");
            object["spec"]["placement"] =
                serde_json::json!({"clusterAffinity": {"clusterNames": clusters}});
            request(
                "PropagationPolicy",
                "federation.example.com",
                "v1alpha1",
                object,
            )
        };
        // team-a may use east and west.
        let (_, outcome) = answer(
            Hook::Validate,
            &with_clusters(serde_json::json!(["east"])),
            &tenant_state(),
        );
        assert_eq!(outcome, Outcome::Allowed);
        for (clusters, expected) in [
            (
                serde_json::json!(["east", "north"]),
                "[\"north\"] are outside",
            ),
            (serde_json::json!([]), "is empty, which would reach past"),
        ] {
            let (response, outcome) =
                answer(Hook::Validate, &with_clusters(clusters), &tenant_state());
            assert_eq!(outcome, Outcome::Denied);
            assert!(
                response.result.message.contains(expected)
                    && response.result.message.contains("allowedClusters"),
                "{}",
                response.result.message
            );
        }
    }

    #[test]
    fn a_tenants_override_cannot_take_its_databases_past_its_rules() {
        let database_override = |patches: Value| {
            serde_json::json!({
                "apiVersion": "federation.example.com/v1alpha1", "kind": "OverridePolicy",
                "metadata": {"name": "db-east", "namespace": "shop"},
                "spec": {"resourceSelectors": [{"apiVersion": "example.com/v1", "kind": "MyDatabase"}],
                         "overrideRules": [{"overriders": {"plaintext": patches}}]}
            })
        };
        let verdict = |object: Value| {
            let body = request(
                "OverridePolicy",
                "federation.example.com",
                "v1alpha1",
                object,
            );
            answer(Hook::Validate, &body, &tenant_state())
        };
        // team-a allows version 16 only: no override of a copy's version or image, nor of
        // their parents (a copy's replicas are the hub's anyway).
        for (path, rule) in [
            ("/spec/version", "allowedVersions"),
            ("/spec/image", "allowedVersions"),
            ("/spec", "allowedVersions"),
            ("", "allowedVersions"),
        ] {
            let (response, outcome) = verdict(database_override(
                serde_json::json!([{"op": "replace", "path": path, "value": "17"}]),
            ));
            assert_eq!(outcome, Outcome::Denied, "{path:?}");
            assert!(
                response
                    .result
                    .message
                    .contains(&format!("team-a's {rule} limits")),
                "{path:?}: {}",
                response.result.message
            );
        }
        let (response, _) = verdict(database_override(serde_json::json!([
            {"op": "move", "from": "/spec/version", "path": "/metadata/annotations/v"}
        ])));
        assert!(
            response.result.message.contains("plaintext[0].from"),
            "{}",
            response.result.message
        );
        let mut images = database_override(serde_json::json!([]));
        images["spec"]["overrideRules"][0]["overriders"] = serde_json::json!(
            {"imageOverrider": [{"component": "Tag", "operator": "replace", "value": "17"}]}
        );
        let (response, outcome) = verdict(images);
        assert_eq!(outcome, Outcome::Denied);
        assert!(
            response.result.message.contains("imageOverrider"),
            "{}",
            response.result.message
        );
        // What the rules do not limit stays the tenant's to change.
        let (response, outcome) = verdict(database_override(serde_json::json!([
            {"op": "replace", "path": "/spec/storage/size", "value": "20Gi"},
            {"op": "add", "path": "/spec/versionNote", "value": "x"}
        ])));
        assert_eq!(outcome, Outcome::Allowed, "{}", response.result.message);
        // A Deployment's replicas are not a MyDatabase's.
        let mut deployments = database_override(serde_json::json!([
            {"op": "replace", "path": "/spec/minReadySeconds", "value": 9}
        ]));
        deployments["spec"]["resourceSelectors"] =
            serde_json::json!([{"apiVersion": "apps/v1", "kind": "Deployment"}]);
        let (response, outcome) = verdict(deployments);
        assert_eq!(outcome, Outcome::Allowed, "{}", response.result.message);
    }

    #[test]
    fn override_policies_are_validated_with_the_field_and_the_fix() {
        for kind in ["OverridePolicy", "ClusterOverridePolicy"] {
            let (_, outcome) = override_answer(
                kind,
                serde_json::json!({"imageOverrider": [{"component": "Registry", "operator": "replace", "value": "mirror.east.example"}]}),
            );
            assert_eq!(outcome, Outcome::Allowed, "{kind}");
        }
        let object = "OverridePolicy shop/web-east";
        let base = "spec.overrideRules[0].overriders";
        for (overriders, expected) in [
            (
                serde_json::json!({"plaintext": [{"op": "replace", "path": "spec/template", "value": 1}]}),
                format!(
                    "{object}: {base}.plaintext[0]: path \"spec/template\" is not a JSON pointer"
                ),
            ),
            (
                serde_json::json!({"imageOverrider": [{"component": "Registry", "operator": "append", "value": "m.example"}]}),
                format!(
                    "{object}: {base}.imageOverrider[0].operator \"append\" is not an operator; use add, remove or replace"
                ),
            ),
            (
                serde_json::json!({"plaintext": [{"op": "merge", "path": "/spec"}]}),
                format!("{object}: {base}.plaintext[0].op \"merge\" is not an RFC 6902 operation"),
            ),
            (
                serde_json::json!({"imageOverrider": [{"component": "Tag", "operator": "replace"}]}),
                format!(
                    "{object}: {base}.imageOverrider[0]: value is required for operator replace: give the new tag"
                ),
            ),
            (
                serde_json::json!({"imageOverrider": [{"component": "Registry", "operator": "replace", "value": "mirror"}]}),
                format!(
                    "{object}: {base}.imageOverrider[0]: \"mirror\" is not a registry: use a host name with a dot or a port"
                ),
            ),
            (
                serde_json::json!({"plaintext": [{"op": "replace", "path": "/spec/replicas", "value": 3}]}),
                format!(
                    "{object}: {base}.plaintext[0]: op replace on /spec/replicas, a field the hub owns: /spec/replicas of a divided kind is each cluster's share"
                ),
            ),
            (
                serde_json::json!({"labelsOverrider": [{"operator": "remove", "value": {"federation.example.com/binding": ""}}]}),
                format!(
                    "{object}: {base}.labelsOverrider[0]: federation.example.com/binding is one of Bulkhead's own labels"
                ),
            ),
            (
                serde_json::json!({}),
                format!("{object}: {base}: is empty; give at least one overrider"),
            ),
        ] {
            let (response, outcome) = override_answer("OverridePolicy", overriders.clone());
            assert_eq!(outcome, Outcome::Denied, "{overriders}");
            assert!(
                response.result.message.starts_with(&expected),
                "{overriders}:\n{}\nwanted: {expected}",
                response.result.message
            );
        }
    }

    #[test]
    fn allows_a_valid_mydatabase() {
        let request = decode(&request("MyDatabase", "example.com", "v1", db(3))).unwrap();
        assert_eq!(
            review(Hook::Validate, &request, &state()).1,
            Outcome::Allowed
        );
    }

    /// Issue 16: a user in team-a's namespace claims team-b (more replicas) or a tenant
    /// without rules; both hooks deny it and name the namespace's tenant and the fix.
    #[test]
    fn an_object_claiming_another_tenant_is_denied_by_both_hooks() {
        let state = tenant_state();
        for claim in ["team-b", "nobody"] {
            for field in ["annotations", "labels"] {
                let body = request(
                    "MyDatabase",
                    "example.com",
                    "v1",
                    with_claim(db(5), field, claim),
                );
                for hook in [Hook::Validate, Hook::Mutate] {
                    let (response, outcome) = answer(hook, &body, &state);
                    let message = &response.result.message;
                    assert_eq!(outcome, Outcome::Denied, "{hook:?} {field} {claim}");
                    assert!(
                        message.starts_with("MyDatabase shop/orders: metadata.")
                            && message.contains(&format!("is \"{claim}\""))
                            && message.contains("namespace shop belongs to tenant team-a")
                            && message.contains("remove the"),
                        "{message}"
                    );
                }
            }
        }
        let body = request(
            "PropagationPolicy",
            "federation.example.com",
            "v1alpha1",
            with_claim(policy("p"), "annotations", "team-b"),
        );
        let (response, outcome) = answer(Hook::Mutate, &body, &state);
        assert_eq!(outcome, Outcome::Denied);
        assert!(
            response.result.message.contains("belongs to tenant team-a"),
            "{}",
            response.result.message
        );
    }

    #[test]
    fn the_namespace_tenants_limits_apply_whatever_the_object_says() {
        let state = tenant_state();
        // No claim, or the namespace's own tenant: team-a's maxReplicas 3 applies.
        for object in [db(5), with_claim(db(5), "annotations", "team-a")] {
            let body = request("MyDatabase", "example.com", "v1", object);
            let (response, outcome) = answer(Hook::Validate, &body, &state);
            assert_eq!(outcome, Outcome::Denied);
            assert!(
                response
                    .result
                    .message
                    .contains("exceeds tenant team-a's rule maxReplicas 3"),
                "{}",
                response.result.message
            );
        }
        let body = request(
            "MyDatabase",
            "example.com",
            "v1",
            with_claim(db(2), "annotations", "team-a"),
        );
        assert_eq!(answer(Hook::Validate, &body, &state).1, Outcome::Allowed);
        // The mutating hook labels the object with the namespace's tenant.
        let (response, outcome) = answer(Hook::Mutate, &body, &state);
        assert_eq!(outcome, Outcome::Patched);
        let patch: Value = serde_json::from_slice(response.patch.as_ref().unwrap()).unwrap();
        assert!(patch.to_string().contains("team-a"), "{patch}");
        // A policy's affinity is narrowed to team-a's clusters.
        let body = request(
            "PropagationPolicy",
            "federation.example.com",
            "v1alpha1",
            policy("p"),
        );
        let (response, outcome) = answer(Hook::Mutate, &body, &state);
        assert_eq!(outcome, Outcome::Patched);
        let patch: Value = serde_json::from_slice(response.patch.as_ref().unwrap()).unwrap();
        assert!(patch.to_string().contains("\"east\",\"west\""), "{patch}");
    }

    #[test]
    fn an_update_keeping_a_stored_claim_is_not_denied_but_changing_it_is() {
        let state = tenant_state();
        let stored = with_claim(db(2), "annotations", "team-b");
        let mut finalized = stored.clone();
        finalized["metadata"]["finalizers"] = serde_json::json!(["federation.example.com/cleanup"]);
        let body = request_with(
            "MyDatabase",
            "example.com",
            "v1",
            "UPDATE",
            finalized,
            Some(stored.clone()),
        );
        assert_eq!(answer(Hook::Validate, &body, &state).1, Outcome::Allowed);
        // ... and the namespace's limits still apply to it.
        let mut bigger = stored.clone();
        bigger["spec"]["replicas"] = serde_json::json!(5);
        let body = request_with(
            "MyDatabase",
            "example.com",
            "v1",
            "UPDATE",
            bigger,
            Some(stored.clone()),
        );
        let (response, _) = answer(Hook::Validate, &body, &state);
        assert!(
            response
                .result
                .message
                .contains("tenant team-a's rule maxReplicas 3")
        );
        let body = request_with(
            "MyDatabase",
            "example.com",
            "v1",
            "UPDATE",
            with_claim(db(2), "annotations", "team-c"),
            Some(stored),
        );
        assert_eq!(answer(Hook::Validate, &body, &state).1, Outcome::Denied);
    }

    /// Issue 16: before the rule ConfigMaps and namespace labels are listed, nothing could
    /// be enforced; tenant-governed requests are denied (with a retry hint) instead.
    #[test]
    fn a_snapshot_not_synced_denies_tenant_governed_requests() {
        let unsynced = AdmissionState {
            tenants: TenantRegistry::new(),
            known_clusters: None,
        };
        let governed = [
            request("MyDatabase", "example.com", "v1", db(3)),
            request(
                "PropagationPolicy",
                "federation.example.com",
                "v1alpha1",
                policy("p"),
            ),
        ];
        for body in &governed {
            for hook in [Hook::Validate, Hook::Mutate] {
                let (response, outcome) = answer(hook, body, &unsynced);
                assert_eq!(outcome, Outcome::Denied);
                assert!(
                    response
                        .result
                        .message
                        .contains("still syncing its tenant rules")
                        && response.result.message.contains("retry"),
                    "{}",
                    response.result.message
                );
            }
        }
        // Kinds without tenants are answered as usual, and deletes always pass.
        let sts = serde_json::json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db", "namespace": "shop"},
            "spec": {"serviceName": "db", "selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": []}}}});
        let body = request("StatefulSet", "apps", "v1", sts);
        assert_eq!(answer(Hook::Validate, &body, &unsynced).1, Outcome::Allowed);
        let mut cluster_policy = policy("c");
        cluster_policy["kind"] = "ClusterPropagationPolicy".into();
        cluster_policy["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("namespace");
        let body = request(
            "ClusterPropagationPolicy",
            "federation.example.com",
            "v1alpha1",
            cluster_policy,
        );
        assert_eq!(answer(Hook::Validate, &body, &unsynced).1, Outcome::Allowed);
        let body = request_with("MyDatabase", "example.com", "v1", "DELETE", db(3), None);
        assert_eq!(answer(Hook::Validate, &body, &unsynced).1, Outcome::Allowed);
        // Once both lists are in, the same request is answered on its merits.
        unsynced.tenants.store_rules(Default::default());
        unsynced.tenants.store_namespaces(HashMap::new());
        assert_eq!(
            answer(Hook::Validate, &governed[0], &unsynced).1,
            Outcome::Allowed
        );
    }

    #[test]
    fn an_object_being_deleted_loses_its_finalizers_whatever_the_rules_say_now() {
        // team-a's rules allow 3 replicas; this database was created before they did.
        let state = tenant_state();
        let mut deleting = db(5);
        deleting["metadata"]["deletionTimestamp"] = "2026-12-07T18:00:00Z".into();
        deleting["metadata"]["finalizers"] = serde_json::json!(["federation.example.com/cleanup"]);
        let mut released = deleting.clone();
        released["metadata"]["finalizers"] = serde_json::json!([]);
        let body = request_with(
            "MyDatabase",
            "example.com",
            "v1",
            "UPDATE",
            released,
            Some(deleting.clone()),
        );
        assert_eq!(answer(Hook::Validate, &body, &state).1, Outcome::Allowed);
        // Its spec changed while it is being deleted: judged as any update.
        let mut grown = deleting.clone();
        grown["spec"]["replicas"] = 6.into();
        let body = request_with(
            "MyDatabase",
            "example.com",
            "v1",
            "UPDATE",
            grown,
            Some(deleting),
        );
        assert_eq!(answer(Hook::Validate, &body, &state).1, Outcome::Denied);
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
}
