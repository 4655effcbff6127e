//! The committed samples parse into the typed API, survive a round trip, and are accepted
//! by the generated CRD schemas; the invalid samples are rejected by them. (The lab's e2e
//! tests repeat the schema check against a real kube-apiserver, which also runs the CEL
//! rules that a JSON-schema library cannot.)

use std::path::{Path, PathBuf};

use bulkhead::api::{
    ClusterOverridePolicy, ClusterPropagationPolicy, MemberCluster, MyDatabase, OverridePolicy,
    PropagationPolicy, all_crds,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn samples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples")
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The openAPIV3Schema of the CRD serving `apiVersion`/`kind`, as a JSON schema. OpenAPI's
/// `nullable` becomes a JSON-schema type union; Kubernetes extensions are ignored.
fn json_schema_for(api_version: &str, kind: &str) -> Option<Value> {
    fn to_json_schema(value: &mut Value) {
        match value {
            Value::Object(map) => {
                if map.remove("nullable") == Some(Value::Bool(true))
                    && let Some(Value::String(t)) = map.get("type").cloned()
                {
                    map.insert("type".into(), serde_json::json!([t, "null"]));
                }
                map.values_mut().for_each(to_json_schema);
            }
            Value::Array(items) => items.iter_mut().for_each(to_json_schema),
            _ => {}
        }
    }
    let (group, version) = api_version.split_once('/')?;
    all_crds().into_iter().find_map(|(_, crd)| {
        if crd.spec.group != group || crd.spec.names.kind != kind {
            return None;
        }
        let served = crd.spec.versions.iter().find(|v| v.name == version)?;
        let mut schema = serde_json::to_value(&served.schema.as_ref()?.open_api_v3_schema).ok()?;
        to_json_schema(&mut schema);
        Some(schema)
    })
}

fn schema_errors(document: &Value) -> Option<Vec<String>> {
    let api_version = document["apiVersion"].as_str()?;
    let kind = document["kind"].as_str()?;
    let schema = json_schema_for(api_version, kind)?;
    let validator = jsonschema::validator_for(&schema).expect("generated schema compiles");
    Some(
        validator
            .iter_errors(document)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect(),
    )
}

fn round_trip<T: DeserializeOwned + serde::Serialize>(document: &Value) {
    let typed: T = serde_json::from_value(document.clone())
        .unwrap_or_else(|e| panic!("{} does not parse: {e}", document["kind"]));
    let again: T = serde_json::from_value(serde_json::to_value(&typed).unwrap()).unwrap();
    assert_eq!(
        serde_json::to_value(&typed).unwrap(),
        serde_json::to_value(&again).unwrap()
    );
}

#[test]
fn samples_parse_round_trip_and_match_the_schemas() {
    let mut kinds = vec![];
    for entry in std::fs::read_dir(samples_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        for document in documents(&path) {
            let kind = document["kind"].as_str().unwrap().to_string();
            match kind.as_str() {
                "MyDatabase" => round_trip::<MyDatabase>(&document),
                "MemberCluster" => round_trip::<MemberCluster>(&document),
                "PropagationPolicy" => round_trip::<PropagationPolicy>(&document),
                "ClusterPropagationPolicy" => round_trip::<ClusterPropagationPolicy>(&document),
                "OverridePolicy" => round_trip::<OverridePolicy>(&document),
                "ClusterOverridePolicy" => round_trip::<ClusterOverridePolicy>(&document),
                "Secret" => {}
                other => panic!("{}: unexpected kind {other}", path.display()),
            }
            if let Some(errors) = schema_errors(&document) {
                assert!(
                    errors.is_empty(),
                    "{} ({kind}) is rejected: {errors:#?}",
                    path.display()
                );
            }
            kinds.push(kind);
        }
    }
    for kind in [
        "MyDatabase",
        "MemberCluster",
        "Secret",
        "PropagationPolicy",
        "ClusterPropagationPolicy",
        "OverridePolicy",
        "ClusterOverridePolicy",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "no sample of {kind}");
    }
}

#[test]
fn invalid_samples_are_rejected_by_the_schemas() {
    let mut checked = 0;
    for entry in std::fs::read_dir(samples_dir().join("invalid")).unwrap() {
        let path = entry.unwrap().path();
        for document in documents(&path) {
            let errors = schema_errors(&document).expect("invalid samples are Bulkhead kinds");
            assert!(!errors.is_empty(), "{} should be rejected", path.display());
            checked += 1;
        }
    }
    assert!(
        checked >= 4,
        "expected the invalid samples, found {checked}"
    );
}

#[test]
fn defaults_fill_a_minimal_mydatabase() {
    let database: MyDatabase = serde_yaml::from_str(
        "apiVersion: example.com/v1\nkind: MyDatabase\nmetadata: {name: a}\nspec: {}\n",
    )
    .unwrap();
    assert_eq!(database.spec.replicas, 1);
    assert_eq!(database.spec.version, "14");
    assert_eq!(database.spec.storage.size, "1Gi");
    assert!(!database.spec.read_only);
}
