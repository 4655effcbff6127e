//! MyDatabase conversion between `example.com/v1` (storage) and `example.com/v1alpha1`.
//! Lossless: fields v1alpha1 lacks (`image`, `resources`, `readOnly`,
//! `storage.reclaimPolicy`) travel in the annotation `example.com/v1-spec`.

use serde_json::{Map, Value, json};

use crate::api::mydatabase_v1alpha1::V1_SPEC_ANNOTATION;

const V1: &str = "example.com/v1";
const V1ALPHA1: &str = "example.com/v1alpha1";

/// Names the object in messages: `MyDatabase shop/orders`.
fn describe(object: &Value) -> String {
    super::validate::describe(
        "MyDatabase",
        object["metadata"]["namespace"].as_str(),
        object["metadata"]["name"].as_str().unwrap_or("<unnamed>"),
    )
}

/// The object's annotations, created when missing. Err when `metadata` is not an object
/// (indexing into it would panic).
fn annotations(object: &mut Value) -> Result<&mut Map<String, Value>, String> {
    let described = describe(object);
    let Some(metadata) = object.as_object_mut().and_then(|o| {
        o.entry("metadata")
            .or_insert_with(|| json!({}))
            .as_object_mut()
    }) else {
        return Err(format!(
            "{described}: metadata is not an object; send the object as the API server stores it"
        ));
    };
    let annotations = metadata.entry("annotations").or_insert_with(|| json!({}));
    if !annotations.is_object() {
        *annotations = json!({});
    }
    Ok(annotations
        .as_object_mut()
        .expect("an object, made one just above"))
}

fn to_v1alpha1(mut object: Value) -> Result<Value, String> {
    let spec = object["spec"].clone();
    let mut alpha = json!({
        "instances": spec["replicas"],
        "postgresVersion": spec["version"],
        "storageSize": spec["storage"]["size"],
    });
    if let Some(class) = spec["storage"]["storageClassName"].as_str() {
        alpha["storageClass"] = json!(class);
    }
    let alpha = alpha
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Map<_, _>>()
        })
        .unwrap_or_default();
    let saved = serde_json::to_string(&spec).map_err(|e| e.to_string())?;
    annotations(&mut object)?.insert(V1_SPEC_ANNOTATION.into(), Value::String(saved));
    object["spec"] = Value::Object(alpha);
    object["apiVersion"] = json!(V1ALPHA1);
    Ok(object)
}

fn to_v1(mut object: Value) -> Result<Value, String> {
    let alpha = object["spec"].clone();
    let described = describe(&object);
    let saved = annotations(&mut object)?.remove(V1_SPEC_ANNOTATION);
    if object["metadata"]["annotations"]
        .as_object()
        .is_some_and(Map::is_empty)
    {
        object["metadata"]
            .as_object_mut()
            .map(|m| m.remove("annotations"));
    }
    let mut spec = match saved {
        Some(Value::String(text)) => serde_json::from_str::<Value>(&text)
            .map_err(|e| format!("{described}: metadata.annotations[\"{V1_SPEC_ANNOTATION}\"] is not a v1 spec ({e}); remove the annotation (it only carries v1 fields for v1alpha1 readers)"))?,
        _ => json!({}),
    };
    if !spec.is_object() {
        spec = json!({});
    }
    // The v1alpha1 fields win over the saved copy: they may have been edited.
    for (from, to) in [("instances", "replicas"), ("postgresVersion", "version")] {
        if !alpha[from].is_null() {
            spec[to] = alpha[from].clone();
        }
    }
    if !spec["storage"].is_object() {
        spec["storage"] = json!({});
    }
    if !alpha["storageSize"].is_null() {
        spec["storage"]["size"] = alpha["storageSize"].clone();
    }
    match alpha["storageClass"].as_str() {
        Some(class) => spec["storage"]["storageClassName"] = json!(class),
        None => {
            spec["storage"]
                .as_object_mut()
                .map(|s| s.remove("storageClassName"));
        }
    }
    object["spec"] = spec;
    object["apiVersion"] = json!(V1);
    Ok(object)
}

/// Converts one MyDatabase object to `desired` (an apiVersion).
pub fn convert(object: Value, desired: &str) -> Result<Value, String> {
    if !object.is_object() {
        return Err(format!(
            "every object of a ConversionReview must be a JSON object, got {object}"
        ));
    }
    let current = object["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    match (current.as_str(), desired) {
        (a, b) if a == b => Ok(object),
        (V1, V1ALPHA1) => to_v1alpha1(object),
        (V1ALPHA1, V1) => to_v1(object),
        (a, b) => Err(format!(
            "{}: cannot convert apiVersion {a:?} to {b:?}; the served versions are {V1} and {V1ALPHA1}",
            describe(&object)
        )),
    }
}

/// Answers a ConversionReview body.
pub fn review(body: &[u8]) -> Result<Vec<u8>, String> {
    use kube::core::conversion::{ConversionRequest, ConversionResponse};
    let (types, mut request): (_, ConversionRequest) =
        super::read_review(body, "ConversionReview")?;
    // The CRD asks for v1 only; the answer echoes the request's type.
    if (types.api_version.as_str(), types.kind.as_str())
        != ("apiextensions.k8s.io/v1", "ConversionReview")
    {
        return Err(format!(
            "the body is a {:?} {:?}, not an apiextensions.k8s.io/v1 ConversionReview",
            types.api_version, types.kind
        ));
    }
    request.types = Some(types);
    let desired = request.desired_api_version.clone();
    // The objects move out of the request (the response needs only its uid).
    let converted: Result<Vec<Value>, String> = std::mem::take(&mut request.objects)
        .into_iter()
        .map(|o| convert(o, &desired))
        .collect();
    let response = ConversionResponse::for_request(request);
    let response = match converted {
        Ok(objects) => response.success(objects),
        Err(message) => response.failure(kube::core::Status::failure(&message, "ConversionFailed")),
    };
    serde_json::to_vec(&response.into_review()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v1(
        replicas: i64,
        version: &str,
        image: Option<&str>,
        class: Option<&str>,
        read_only: bool,
        annotations: bool,
    ) -> Value {
        let mut spec = json!({"replicas": replicas, "version": version, "storage": {"size": "3Gi"}, "readOnly": read_only});
        if let Some(image) = image {
            spec["image"] = json!(image);
        }
        if let Some(class) = class {
            spec["storage"]["storageClassName"] = json!(class);
        }
        let mut object = json!({"apiVersion": V1, "kind": "MyDatabase", "metadata": {"name": "orders", "namespace": "shop"}, "spec": spec, "status": {"phase": "Ready", "replicas": replicas}});
        if annotations {
            object["metadata"]["annotations"] = json!({"team": "payments"});
        }
        object
    }

    #[test]
    fn maps_the_documented_fields() {
        let alpha = convert(
            v1(
                3,
                "16",
                Some("registry.local/postgres"),
                Some("fast"),
                true,
                false,
            ),
            V1ALPHA1,
        )
        .unwrap();
        assert_eq!(alpha["apiVersion"], V1ALPHA1);
        assert_eq!(
            alpha["spec"],
            json!({"instances": 3, "postgresVersion": "16", "storageSize": "3Gi", "storageClass": "fast"})
        );
        assert!(
            alpha["metadata"]["annotations"][V1_SPEC_ANNOTATION]
                .as_str()
                .unwrap()
                .contains("registry.local/postgres")
        );
        assert_eq!(alpha["status"]["phase"], "Ready", "status is carried over");
    }

    #[test]
    fn edits_made_in_v1alpha1_win_over_the_saved_spec() {
        let mut alpha = convert(v1(3, "16", Some("img"), None, false, false), V1ALPHA1).unwrap();
        alpha["spec"]["instances"] = json!(5);
        let back = convert(alpha, V1).unwrap();
        assert_eq!(back["spec"]["replicas"], 5);
        assert_eq!(back["spec"]["image"], "img", "v1-only fields survive");
    }

    #[test]
    fn reclaim_policy_delete_survives_a_round_trip_through_v1alpha1() {
        let mut original = v1(2, "16", None, Some("fast"), false, true);
        original["spec"]["storage"]["reclaimPolicy"] = json!("Delete");
        let alpha = convert(original.clone(), V1ALPHA1).unwrap();
        assert!(
            alpha["spec"].get("reclaimPolicy").is_none() && alpha["spec"]["storage"].is_null(),
            "v1alpha1 has no such field: {}",
            alpha["spec"]
        );
        let saved: Value = serde_json::from_str(
            alpha["metadata"]["annotations"][V1_SPEC_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(saved["storage"]["reclaimPolicy"], "Delete");
        // A v1alpha1 client edits what it knows; the policy stays.
        let mut edited = alpha;
        edited["spec"]["instances"] = json!(4);
        edited["spec"]["storageClass"] = json!("slow");
        let back = convert(edited, V1).unwrap();
        assert_eq!(
            back["spec"]["storage"],
            json!({"size": "3Gi", "storageClassName": "slow", "reclaimPolicy": "Delete"})
        );
        assert_eq!(back["spec"]["replicas"], 4);
        assert!(
            back["metadata"]["annotations"]
                .get(V1_SPEC_ANNOTATION)
                .is_none(),
            "the annotation is only for v1alpha1 readers"
        );
        let mut unedited = original.clone();
        unedited = convert(convert(unedited, V1ALPHA1).unwrap(), V1).unwrap();
        assert_eq!(unedited, original);
    }

    #[test]
    fn a_v1alpha1_object_without_annotation_converts() {
        let alpha = json!({"apiVersion": V1ALPHA1, "kind": "MyDatabase", "metadata": {"name": "a"}, "spec": {"instances": 2, "postgresVersion": "15", "storageSize": "1Gi"}});
        let v1 = convert(alpha.clone(), V1).unwrap();
        assert_eq!(
            v1["spec"],
            json!({"replicas": 2, "version": "15", "storage": {"size": "1Gi"}})
        );
        let again = convert(v1, V1ALPHA1).unwrap();
        assert_eq!(again["spec"], alpha["spec"]);
    }

    #[test]
    fn unknown_versions_fail_clearly() {
        let error = convert(
            json!({"apiVersion": "example.com/v2", "metadata": {"name": "a", "namespace": "shop"}}),
            V1,
        )
        .unwrap_err();
        assert!(
            error.starts_with("MyDatabase shop/a:") && error.contains("example.com/v2"),
            "{error}"
        );
    }

    /// Found by the fuzz test in CI: serde reads a struct from a JSON array, so a request
    /// `["", "", [null, null]]` was answered with a made-up uid and null objects.
    #[test]
    fn a_request_that_is_not_an_object_is_refused() {
        for request in [
            json!(["", "", [null, null]]),
            json!({"desiredAPIVersion": V1, "objects": []}),
            json!({"uid": 5, "desiredAPIVersion": V1, "objects": []}),
        ] {
            let body = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "request": request});
            let error = review(&serde_json::to_vec(&body).unwrap()).unwrap_err();
            assert!(error.contains("ConversionReview"), "{error}");
        }
        let body = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "request": ["", "", [null, null]]});
        let error = review(&serde_json::to_vec(&body).unwrap()).unwrap_err();
        assert!(error.contains("request as a JSON object"), "{error}");
        let body = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
                          "request": {"uid": "u", "desiredAPIVersion": "", "objects": [null]}});
        let answer: Value =
            serde_json::from_slice(&review(&serde_json::to_vec(&body).unwrap()).unwrap()).unwrap();
        assert_eq!(
            answer["response"]["result"]["status"], "Failure",
            "{answer}"
        );
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                          "request": ["u", {}, {}]});
        let error =
            super::super::admission::decode(&serde_json::to_vec(&body).unwrap()).unwrap_err();
        assert!(error.contains("request"), "{error}");
    }

    /// Found by the fuzz test: indexing into a non-object `metadata` panicked.
    #[test]
    fn objects_with_broken_metadata_fail_with_a_message() {
        for metadata in [json!(5), json!([]), json!("x")] {
            let mut object = v1(2, "16", None, None, false, false);
            object["metadata"] = metadata.clone();
            let error = convert(object, V1ALPHA1).unwrap_err();
            assert!(error.contains("metadata is not an object"), "{error}");
            let alpha = json!({"apiVersion": V1ALPHA1, "kind": "MyDatabase", "metadata": metadata, "spec": {"instances": 1}});
            assert!(convert(alpha, V1).is_err());
        }
        let mut object = v1(2, "16", None, None, false, false);
        object["metadata"]["annotations"] = json!("not a map");
        let alpha = convert(object, V1ALPHA1).unwrap();
        assert!(alpha["metadata"]["annotations"][V1_SPEC_ANNOTATION].is_string());
        let broken = json!({"apiVersion": V1ALPHA1, "kind": "MyDatabase",
            "metadata": {"name": "a", "namespace": "shop", "annotations": {V1_SPEC_ANNOTATION: "{"}}, "spec": {}});
        let error = convert(broken, V1).unwrap_err();
        assert!(
            error.starts_with("MyDatabase shop/a: metadata.annotations[")
                && error.contains("remove the annotation"),
            "{error}"
        );
    }

    #[test]
    fn answers_a_conversion_review() {
        let body = serde_json::to_vec(&json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "u1", "desiredAPIVersion": V1ALPHA1, "objects": [v1(2, "16", None, None, false, false)]}
        }))
        .unwrap();
        let answer: Value = serde_json::from_slice(&review(&body).unwrap()).unwrap();
        assert_eq!(answer["response"]["uid"], "u1");
        assert_eq!(answer["response"]["result"]["status"], "Success");
        assert_eq!(
            answer["response"]["convertedObjects"][0]["spec"]["instances"],
            2
        );
        assert!(review(b"{nonsense").is_err());
    }

    proptest! {
        #[test]
        fn v1_round_trips_through_v1alpha1_losslessly(
            replicas in 1i64..=10,
            major in 10u8..=17,
            image in proptest::option::of("[a-z]{1,8}(/[a-z]{1,8})?"),
            class in proptest::option::of("[a-z]{1,8}"),
            read_only in any::<bool>(),
            annotations in any::<bool>(),
            reclaim_policy in proptest::option::of(prop_oneof![Just("Retain"), Just("Delete")]),
        ) {
            let mut original = v1(replicas, &major.to_string(), image.as_deref(), class.as_deref(), read_only, annotations);
            if let Some(policy) = reclaim_policy {
                original["spec"]["storage"]["reclaimPolicy"] = json!(policy);
            }
            let alpha = convert(original.clone(), V1ALPHA1).unwrap();
            let back = convert(alpha, V1).unwrap();
            prop_assert_eq!(back, original);
        }
    }
}
