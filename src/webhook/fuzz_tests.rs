//! Fuzzing the webhook's request handling as property tests: random bodies, and valid
//! AdmissionReviews and ConversionReviews of every kind the webhook handles with fields
//! replaced, removed, retyped or inserted and bytes truncated or garbled, are fed to
//! [`Server::answer`] (the function every request goes through once its body is read).
//! It must never panic, and must answer either 200 with a well-formed review for the same
//! request (same uid, a patch that applies to the object, converted objects for every
//! object sent) or a 4xx.
//!
//! `cargo test` runs a few hundred cases per property (a second or two);
//! `BULKHEAD_FUZZ_CASES=100000 cargo test --lib webhook::fuzz_tests` runs longer.

use std::sync::Arc;

use arc_swap::ArcSwap;
use http_body_util::BodyExt;
use hyper::StatusCode;
use kube::core::DynamicObject;
use kube::core::admission::AdmissionReview;
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Value, json};

use super::tenants::{RuleSet, RuleSource, TenantRegistry, next_rules};
use super::{ReviewPath, Server};
use crate::api::LABEL_TENANT;

/// Cases per property: `BULKHEAD_FUZZ_CASES`, else a number that keeps `cargo test` fast.
fn cases() -> u32 {
    std::env::var("BULKHEAD_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

fn config() -> Config {
    Config {
        cases: cases(),
        // Shrinking a mangled review can take long; the failing input is printed anyway.
        max_shrink_iters: 2000,
        ..Config::default()
    }
}

/// Servers in every state the handlers branch on: synced with a tenant whose rules
/// narrow and default everything (strict mode on), and not yet synced.
fn servers() -> Vec<Server> {
    let synced = TenantRegistry::new();
    synced.store_namespaces(
        [("shop", "team-a"), ("lab", "team-b")]
            .into_iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect(),
    );
    let (rules, _) = next_rules(
        &RuleSet::default(),
        &[RuleSource {
            name: "team-a-rules".into(),
            tenant: Some("team-a".into()),
            policy_yaml: Some(
                "maxReplicas: 3\nallowedVersions: [\"15\", \"16\"]\nallowedClusters: [east, west]\nallowedZones: [zone-a]\ndefaults: {image: registry.local/postgres, storageClassName: fast}\n"
                    .into(),
            ),
        }],
    );
    synced.store_rules(rules);
    let mut strict = super::tests::test_server(synced);
    strict.state.known_clusters = Some(Arc::new(ArcSwap::from_pointee(vec![
        "east".to_string(),
        "west".to_string(),
    ])));
    vec![strict, super::tests::test_server(TenantRegistry::new())]
}

fn admission_review(
    kind: (&str, &str, &str),
    operation: &str,
    namespace: Option<&str>,
    object: Value,
    old: Option<Value>,
) -> Value {
    let (group, version, kind) = kind;
    let mut request = json!({
        "uid": "0b4b7a1e-fuzz",
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": format!("{}s", kind.to_lowercase())},
        "name": object["metadata"]["name"],
        "operation": operation,
        "userInfo": {"username": "tenant-user", "groups": ["system:authenticated"]},
        "object": object,
        "dryRun": false
    });
    if let Some(namespace) = namespace {
        request["namespace"] = json!(namespace);
    }
    if let Some(old) = old {
        request["oldObject"] = old;
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

fn mydatabase(replicas: i64, annotations: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "MyDatabase",
        "metadata": {"name": "orders", "namespace": "shop", "annotations": annotations, "labels": {"app": "orders"}},
        "spec": {"replicas": replicas, "version": "16", "image": "postgres", "readOnly": false,
                 "storage": {"size": "1Gi", "storageClassName": "", "reclaimPolicy": "Retain"},
                 "resources": {"requests": {"cpu": "100m"}}}})
}

fn policy_spec() -> Value {
    json!({
        "priority": 1,
        "resourceSelectors": [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            {"apiVersion": "example.com/v1", "kind": "MyDatabase", "labelSelector": {"matchLabels": {"app": "orders"}}}
        ],
        "placement": {
            "clusterAffinity": {"clusterNames": ["east", "north"], "exclude": ["west"], "zones": ["zone-a"], "regions": ["r1"],
                                "labelSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["prod"]}]}},
            "clusterTolerations": [
                {"key": "federation.example.com/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
                {"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}
            ],
            "spreadConstraints": [{"spreadByField": "zone", "minGroups": 1, "maxGroups": 2}],
            "replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted", "weightPreference": {
                "staticWeightList": [
                    {"targetCluster": {"clusterNames": ["east"]}, "weight": 2},
                    {"targetCluster": {"zones": ["zone-a"], "labelSelector": {"matchLabels": {"tier": "prod"}}}, "weight": 1}
                ],
                "dynamicWeight": "AvailableReplicas"}}
        },
        "failover": {"stateless": {"tolerationSeconds": 60}, "stateful": "Fence"},
        "conflictResolution": "Abort"
    })
}

/// Valid AdmissionReviews of every kind and operation the webhook handles.
fn admission_seeds() -> Vec<Value> {
    let db = ("example.com", "v1", "MyDatabase");
    let pp = ("federation.example.com", "v1alpha1", "PropagationPolicy");
    let cpp = (
        "federation.example.com",
        "v1alpha1",
        "ClusterPropagationPolicy",
    );
    let mc = ("federation.example.com", "v1alpha1", "MemberCluster");
    let sts = ("apps", "v1", "StatefulSet");
    let policy = json!({"apiVersion": "federation.example.com/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": "weighted", "namespace": "shop"}, "spec": policy_spec()});
    let cluster_policy = json!({"apiVersion": "federation.example.com/v1alpha1", "kind": "ClusterPropagationPolicy",
        "metadata": {"name": "everywhere"}, "spec": policy_spec()});
    let member = json!({"apiVersion": "federation.example.com/v1alpha1", "kind": "MemberCluster",
        "metadata": {"name": "east"},
        "spec": {"secretRef": {"namespace": "bulkhead-system", "name": "member-east"}, "zone": "zone-a", "region": "east-1",
                 "taints": [{"key": "k", "effect": "NoSchedule"}],
                 "probe": {"intervalSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3, "successThreshold": 2}}});
    let statefulset = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "orders", "namespace": "shop"},
        "spec": {"serviceName": "orders", "replicas": 3, "selector": {"matchLabels": {"a": "b"}},
                 "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "postgres"}]}}}});
    let configmap = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "other", "namespace": "shop"}, "data": {"a": "b"}});
    vec![
        admission_review(db, "CREATE", Some("shop"), mydatabase(2, json!({})), None),
        admission_review(
            db,
            "CREATE",
            Some("shop"),
            mydatabase(5, json!({LABEL_TENANT: "team-b"})),
            None,
        ),
        admission_review(
            db,
            "UPDATE",
            Some("shop"),
            mydatabase(3, json!({LABEL_TENANT: "team-a"})),
            Some(mydatabase(2, json!({}))),
        ),
        admission_review(db, "DELETE", Some("shop"), mydatabase(2, json!({})), None),
        admission_review(db, "CREATE", Some("lab"), mydatabase(9, json!({})), None),
        admission_review(pp, "CREATE", Some("shop"), policy.clone(), None),
        admission_review(pp, "UPDATE", Some("shop"), policy.clone(), Some(policy)),
        admission_review(cpp, "CREATE", None, cluster_policy, None),
        admission_review(mc, "CREATE", None, member, None),
        admission_review(
            sts,
            "UPDATE",
            Some("shop"),
            statefulset.clone(),
            Some(statefulset),
        ),
        admission_review(
            ("", "v1", "ConfigMap"),
            "CREATE",
            Some("shop"),
            configmap,
            None,
        ),
    ]
}

/// Valid ConversionReviews both ways, with the annotation a v1alpha1 object carries.
fn conversion_seeds() -> Vec<Value> {
    let v1 = mydatabase(3, json!({"team": "payments"}));
    let alpha = json!({"apiVersion": "example.com/v1alpha1", "kind": "MyDatabase",
        "metadata": {"name": "vintage", "namespace": "shop",
                     "annotations": {"example.com/v1-spec": "{\"replicas\":2,\"image\":\"img\",\"readOnly\":true,\"storage\":{\"size\":\"1Gi\",\"reclaimPolicy\":\"Delete\"}}"}},
        "spec": {"instances": 2, "postgresVersion": "15", "storageSize": "2Gi", "storageClass": "fast"},
        "status": {"phase": "Ready"}});
    let review = |desired: &str, objects: Vec<Value>| {
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "c0nv-fuzz", "desiredAPIVersion": desired, "objects": objects}})
    };
    vec![
        review("example.com/v1alpha1", vec![v1.clone(), v1.clone()]),
        review("example.com/v1", vec![alpha.clone(), v1]),
        review("example.com/v1alpha1", vec![alpha]),
    ]
}

/// Values a mutation puts in: every JSON type, numbers at the edges of the types the
/// handlers parse into, and strings that mean something to them.
fn arbitrary_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![
            Just(i64::MAX),
            Just(i64::MIN),
            Just(i64::from(i32::MAX) + 1),
            Just(-1i64),
            Just(0i64),
            Just(10_001i64),
            -20i64..20,
        ]
        .prop_map(|n| json!(n)),
        Just(json!(u64::MAX)),
        Just(json!(1e308)),
        Just(json!(-0.5)),
        prop_oneof![
            Just("".to_string()),
            Just("team-b".to_string()),
            Just("example.com/v1".to_string()),
            Just("example.com/v1alpha1".to_string()),
            Just("MyDatabase".to_string()),
            Just("Divided".to_string()),
            Just("Duplicated".to_string()),
            Just("Aggregated".to_string()),
            Just("NoExecute".to_string()),
            Just("Exists".to_string()),
            Just("CREATE".to_string()),
            Just("UPDATE".to_string()),
            Just("{\"replicas\": \"x\"".to_string()),
            Just("\u{0}\u{feff}é/~1".to_string()),
            "[a-z0-9./~-]{0,12}",
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..4)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

fn edge_number() -> impl Strategy<Value = Value> {
    prop::sample::select(vec![
        json!(i64::MAX),
        json!(i64::MAX - 1),
        json!(i64::MIN),
        json!(u64::MAX),
        json!(i64::from(i32::MAX)),
        json!(i64::from(i32::MAX) + 1),
        json!(i64::from(i32::MIN) - 1),
        json!(-1),
        json!(0),
        json!(10_000),
        json!(10_001),
        json!(1e308),
        json!(0.5),
    ])
}

/// Keys a mutation inserts: the ones the handlers read, and noise.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "apiVersion",
            "kind",
            "metadata",
            "name",
            "namespace",
            "annotations",
            "labels",
            LABEL_TENANT,
            "spec",
            "replicas",
            "version",
            "storage",
            "size",
            "storageClassName",
            "placement",
            "clusterAffinity",
            "clusterNames",
            "zones",
            "replicaScheduling",
            "type",
            "weightPreference",
            "staticWeightList",
            "weight",
            "clusterTolerations",
            "tolerationSeconds",
            "spreadConstraints",
            "minGroups",
            "maxGroups",
            "request",
            "uid",
            "object",
            "oldObject",
            "operation",
            "desiredAPIVersion",
            "objects",
            "example.com/v1-spec",
            "serviceName",
        ])
        .prop_map(str::to_string),
        "[a-zA-Z]{1,8}",
    ]
}

/// One change to the JSON tree; `at` picks the node (an index into all nodes, wrapped).
#[derive(Clone, Debug)]
enum Mutation {
    Replace {
        at: usize,
        value: Value,
    },
    Remove {
        at: usize,
    },
    Insert {
        at: usize,
        key: String,
        value: Value,
    },
    /// Replaces a number (picked among the numbers only) by one at a type's edge: where
    /// sums and conversions overflow.
    Number {
        at: usize,
        value: Value,
    },
    /// Grows an array by copies of its first element (large lists).
    Repeat {
        at: usize,
        times: usize,
    },
    Wrap {
        at: usize,
        in_array: bool,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), arbitrary_value()).prop_map(|(at, value)| Mutation::Replace { at, value }),
        2 => any::<usize>().prop_map(|at| Mutation::Remove { at }),
        2 => (any::<usize>(), key(), arbitrary_value())
            .prop_map(|(at, key, value)| Mutation::Insert { at, key, value }),
        2 => (any::<usize>(), edge_number()).prop_map(|(at, value)| Mutation::Number { at, value }),
        1 => (any::<usize>(), 1usize..150).prop_map(|(at, times)| Mutation::Repeat { at, times }),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(at, in_array)| Mutation::Wrap { at, in_array }),
    ]
}

/// A change to the serialized bytes, after the tree mutations.
#[derive(Clone, Debug)]
enum ByteMutation {
    None,
    Truncate { at: usize },
    Insert { at: usize, bytes: Vec<u8> },
    Overwrite { at: usize, byte: u8 },
}

fn byte_mutation() -> impl Strategy<Value = ByteMutation> {
    prop_oneof![
        6 => Just(ByteMutation::None),
        1 => any::<usize>().prop_map(|at| ByteMutation::Truncate { at }),
        1 => (any::<usize>(), prop_oneof![
                prop::collection::vec(any::<u8>(), 1..8),
                prop::sample::select(vec![b"{".to_vec(), b"}".to_vec(), b"\"".to_vec(), b",".to_vec(), b"[".to_vec(), b"\\u0000".to_vec(), b"\xff".to_vec()]),
            ])
            .prop_map(|(at, bytes)| ByteMutation::Insert { at, bytes }),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| ByteMutation::Overwrite { at, byte }),
    ]
}

/// JSON pointers of every node, in pre-order.
fn pointers(value: &Value, here: String, out: &mut Vec<String>) {
    out.push(here.clone());
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let token = key.replace('~', "~0").replace('/', "~1");
                pointers(child, format!("{here}/{token}"), out);
            }
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                pointers(child, format!("{here}/{index}"), out);
            }
        }
        _ => {}
    }
}

fn node(value: &mut Value, at: usize) -> (String, &mut Value) {
    let mut all = vec![];
    pointers(value, String::new(), &mut all);
    let pointer = all.swap_remove(at % all.len());
    let node = value
        .pointer_mut(&pointer)
        .expect("a pointer just collected");
    (pointer, node)
}

fn apply(mut value: Value, mutations: &[Mutation]) -> Value {
    for mutation in mutations {
        match mutation {
            Mutation::Replace { at, value: new } => *node(&mut value, *at).1 = new.clone(),
            Mutation::Number { at, value: new } => {
                let mut numbers = vec![];
                pointers(&value, String::new(), &mut numbers);
                numbers.retain(|p| value.pointer(p).is_some_and(Value::is_number));
                if !numbers.is_empty() {
                    let pointer = numbers.swap_remove(at % numbers.len());
                    *value.pointer_mut(&pointer).expect("just found") = new.clone();
                }
            }
            Mutation::Remove { at } => {
                let (pointer, _) = node(&mut value, *at);
                let Some((parent, last)) = pointer.rsplit_once('/') else {
                    continue;
                };
                let last = last.replace("~1", "/").replace("~0", "~");
                match value.pointer_mut(parent) {
                    Some(Value::Object(map)) => {
                        map.remove(&last);
                    }
                    Some(Value::Array(items)) => {
                        if let Ok(index) = last.parse::<usize>()
                            && index < items.len()
                        {
                            items.remove(index);
                        }
                    }
                    _ => {}
                }
            }
            Mutation::Insert {
                at,
                key,
                value: new,
            } => match node(&mut value, *at).1 {
                Value::Object(map) => {
                    map.insert(key.clone(), new.clone());
                }
                Value::Array(items) => items.push(new.clone()),
                other => *other = json!({key.clone(): new.clone()}),
            },
            Mutation::Repeat { at, times } => {
                if let Value::Array(items) = node(&mut value, *at).1
                    && let Some(first) = items.first().cloned()
                {
                    items.extend(std::iter::repeat_n(first, *times));
                }
            }
            Mutation::Wrap { at, in_array } => {
                let target = node(&mut value, *at).1;
                let inner = target.take();
                *target = if *in_array {
                    json!([inner])
                } else {
                    json!({"wrapped": inner})
                };
            }
        }
    }
    value
}

fn serialize(value: &Value, bytes: &ByteMutation) -> Vec<u8> {
    let mut body = serde_json::to_vec(value).expect("a Value serializes");
    match bytes {
        ByteMutation::None => {}
        ByteMutation::Truncate { at } => body.truncate(at % (body.len() + 1)),
        ByteMutation::Insert { at, bytes } => {
            let at = at % (body.len() + 1);
            body.splice(at..at, bytes.iter().copied());
        }
        ByteMutation::Overwrite { at, byte } => {
            if !body.is_empty() {
                let at = at % body.len();
                body[at] = *byte;
            }
        }
    }
    body
}

/// Feeds `body` to `path` and checks the answer; Err says what is wrong.
fn check(server: &Server, path: ReviewPath, body: &[u8]) -> Result<(), String> {
    let response = server.answer(path, body);
    let status = response.status();
    let answer = futures::executor::block_on(response.into_body().collect())
        .map_err(|e| format!("unreadable answer: {e}"))?
        .to_bytes();
    let text = || String::from_utf8_lossy(&answer).to_string();
    if status.is_client_error() {
        return if answer.is_empty() {
            Err(format!("{status} without a message"))
        } else {
            Ok(())
        };
    }
    if status != StatusCode::OK {
        return Err(format!("status {status}: {}", text()));
    }
    let sent: Value = serde_json::from_slice(body)
        .map_err(|e| format!("200 for a body that is not JSON ({e}): {}", text()))?;
    match path {
        ReviewPath::Validate | ReviewPath::Mutate => {
            let request = super::admission::decode(body)
                .map_err(|e| format!("200 for a body that does not decode ({e})"))?;
            let review: AdmissionReview<DynamicObject> = serde_json::from_slice(&answer)
                .map_err(|e| format!("the answer is not an AdmissionReview ({e}): {}", text()))?;
            if review.types != request.types {
                return Err(format!(
                    "answered as {:?} to a {:?}",
                    review.types, request.types
                ));
            }
            let response = review
                .response
                .ok_or_else(|| format!("no response: {}", text()))?;
            if response.uid != request.uid {
                return Err(format!(
                    "uid {:?} for request {:?}",
                    response.uid, request.uid
                ));
            }
            if !response.allowed && response.result.message.is_empty() {
                return Err("a denial without a message".into());
            }
            if let Some(patch) = &response.patch {
                if !response.allowed || path != ReviewPath::Mutate {
                    return Err(format!(
                        "a patch from {path:?} (allowed {})",
                        response.allowed
                    ));
                }
                let patch: json_patch::Patch = serde_json::from_slice(patch)
                    .map_err(|e| format!("the patch is not a JSON patch: {e}"))?;
                // The object as sent; the API server always sends metadata, so a body
                // without it is checked against the object as the webhook decoded it.
                let mut object = if sent["request"]["object"]["metadata"].is_object() {
                    sent["request"]["object"].clone()
                } else {
                    serde_json::to_value(&request.object).unwrap_or_default()
                };
                json_patch::patch(&mut object, &patch)
                    .map_err(|e| format!("the patch does not apply to the object: {e}"))?;
            }
        }
        ReviewPath::Convert => {
            let review: Value = serde_json::from_slice(&answer)
                .map_err(|e| format!("the answer is not JSON ({e})"))?;
            let response = &review["response"];
            if review["kind"] != "ConversionReview" || !response.is_object() {
                return Err(format!("not a ConversionReview answer: {}", text()));
            }
            if response["uid"] != sent["request"]["uid"] {
                return Err(format!(
                    "uid {} for request {}",
                    response["uid"], sent["request"]["uid"]
                ));
            }
            match response["result"]["status"].as_str() {
                Some("Success") => {
                    let converted = response["convertedObjects"].as_array().map(Vec::len);
                    let objects = sent["request"]["objects"].as_array().map(Vec::len);
                    if converted != objects {
                        return Err(format!("{converted:?} objects converted of {objects:?}"));
                    }
                }
                Some("Failure")
                    if response["result"]["message"]
                        .as_str()
                        .is_some_and(|m| !m.is_empty()) => {}
                _ => {
                    return Err(format!(
                        "neither success nor an explained failure: {}",
                        text()
                    ));
                }
            }
        }
    }
    Ok(())
}

fn check_everywhere(servers: &[Server], body: &[u8]) -> Result<(), TestCaseError> {
    for server in servers {
        for path in [
            ReviewPath::Validate,
            ReviewPath::Mutate,
            ReviewPath::Convert,
        ] {
            check(server, path, body).map_err(|problem| {
                TestCaseError::fail(format!(
                    "{path:?}: {problem}\nbody: {}",
                    String::from_utf8_lossy(body)
                ))
            })?;
        }
    }
    Ok(())
}

#[test]
fn every_seed_is_a_valid_review_with_a_well_formed_answer() {
    let servers = servers();
    for seed in admission_seeds().iter().chain(conversion_seeds().iter()) {
        let body = serde_json::to_vec(seed).unwrap();
        check_everywhere(&servers, &body).unwrap();
    }
    // The seeds reach the interesting answers: denials, patches and conversions.
    let strict = &servers[0];
    let answers: Vec<String> = admission_seeds()
        .iter()
        .flat_map(|seed| {
            let body = serde_json::to_vec(seed).unwrap();
            [ReviewPath::Validate, ReviewPath::Mutate].map(|path| {
                let answer = strict.answer(path, &body).into_body();
                let bytes = futures::executor::block_on(answer.collect())
                    .unwrap()
                    .to_bytes();
                String::from_utf8_lossy(&bytes).to_string()
            })
        })
        .collect();
    for expected in [
        "\"patch\"",
        "belongs to tenant team-a",
        "strict mode",
        "\"allowed\":true",
    ] {
        assert!(
            answers.iter().any(|a| a.contains(expected)),
            "no seed answer contains {expected}: {answers:#?}"
        );
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn mutated_admission_reviews_get_a_well_formed_answer_or_a_4xx(
        seed in prop::sample::select(admission_seeds()),
        mutations in prop::collection::vec(mutation(), 1..5),
        bytes in byte_mutation(),
    ) {
        let body = serialize(&apply(seed, &mutations), &bytes);
        check_everywhere(&servers(), &body)?;
    }

    #[test]
    fn mutated_conversion_reviews_get_a_well_formed_answer_or_a_4xx(
        seed in prop::sample::select(conversion_seeds()),
        mutations in prop::collection::vec(mutation(), 1..5),
        bytes in byte_mutation(),
    ) {
        let body = serialize(&apply(seed, &mutations), &bytes);
        check_everywhere(&servers(), &body)?;
    }

    #[test]
    fn random_bodies_get_a_well_formed_answer_or_a_4xx(
        body in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..256),
            arbitrary_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        ],
    ) {
        check_everywhere(&servers(), &body)?;
    }
}
