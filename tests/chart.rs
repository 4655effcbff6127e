//! The Helm chart's files that need no cluster and no `helm` binary: its CRDs are the
//! generated ones, and its values schema accepts the shipped values files and refuses
//! wrong types and unknown keys. (Rendering, linting and installing are e2e tests:
//! e2e/tests/install.rs.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn yaml_files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().to_string())
        .filter(|name| name.ends_with(".yaml"))
        .collect()
}

#[test]
fn the_chart_ships_exactly_the_generated_crds() {
    let generated = root().join("config/crd");
    let chart = root().join("charts/bulkhead/files/crds");
    assert_eq!(
        yaml_files(&generated),
        yaml_files(&chart),
        "charts/bulkhead/files/crds must hold the same files as config/crd; run `make crds`"
    );
    for name in yaml_files(&generated) {
        let want = std::fs::read_to_string(generated.join(&name)).unwrap();
        let have = std::fs::read_to_string(chart.join(&name)).unwrap();
        assert!(
            want == have,
            "charts/bulkhead/files/crds/{name} drifted from config/crd/{name}; run `make crds`"
        );
    }
}

fn schema_validator() -> jsonschema::Validator {
    let text = std::fs::read_to_string(root().join("charts/bulkhead/values.schema.json")).unwrap();
    let schema: serde_json::Value =
        serde_json::from_str(&text).expect("values.schema.json is JSON");
    jsonschema::validator_for(&schema).expect("values.schema.json compiles")
}

fn values(path: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn errors(validator: &jsonschema::Validator, document: &serde_json::Value) -> Vec<String> {
    validator
        .iter_errors(document)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

#[test]
fn the_values_files_match_the_schema() {
    let validator = schema_validator();
    for path in [
        "charts/bulkhead/values.yaml",
        "charts/bulkhead/ci/full-values.yaml",
    ] {
        let errors = errors(&validator, &values(path));
        assert!(errors.is_empty(), "{path}: {errors:?}");
    }
}

#[test]
fn the_schema_refuses_wrong_types_and_unknown_keys() {
    let validator = schema_validator();
    let defaults = values("charts/bulkhead/values.yaml");
    let cases: [(&str, serde_json::Value); 6] = [
        ("/replicaCount", serde_json::json!("two")),
        ("/leaderElection/enabled", serde_json::json!("yes")),
        (
            "/webhook/certificates/mode",
            serde_json::json!("selfSigned"),
        ),
        ("/image/digest", serde_json::json!("latest")),
        ("/hub/leaseDuration", serde_json::json!("10 seconds")),
        ("/crds/keep", serde_json::json!(1)),
    ];
    for (pointer, wrong) in cases {
        let mut document = defaults.clone();
        *document.pointer_mut(pointer).unwrap() = wrong.clone();
        assert!(
            !errors(&validator, &document).is_empty(),
            "{pointer} = {wrong} was accepted"
        );
    }
    for key in ["replicas", "leaderElect"] {
        let mut document = defaults.clone();
        document[key] = serde_json::json!(1);
        let errors = errors(&validator, &document);
        assert!(
            errors.iter().any(|e| e.contains(key)),
            "unknown top-level key {key} was accepted: {errors:?}"
        );
    }
}
