use super::*;
use crate::api::override_policy::{OverrideRule, Overriders};
use crate::api::propagation_policy::ResourceSelector;
use crate::api::{ANNOTATION_APPLIED_HASH, LABEL_BINDING, LABEL_MANAGED_BY};
use crate::hub::federation::copies::member_copy;
use k8s_openapi::api::core::v1::EnvVar;
use proptest::prelude::*;

fn template() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}},
        "spec": {"replicas": 6, "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
            "initContainers": [{"name": "init", "image": "busybox"}],
            "containers": [
                {"name": "app", "image": "nginx:1.27", "args": ["--port", "80"], "env": [{"name": "MODE", "value": "prod"}]},
                {"name": "sidecar", "image": "registry.k8s.io/pause:3.10"}
            ]}}}
    })
}

fn copy() -> Value {
    member_copy(
        &template(),
        "bshop",
        Some(2),
        &crate::hub::federation::interpreter::Interpreters::built_in().get("apps/v1", "Deployment"),
    )
}

fn cluster(name: &str, zone: &str) -> ClusterView {
    ClusterView {
        name: name.into(),
        zone: zone.into(),
        region: Some("region-1".into()),
        labels: BTreeMap::from([("tier".to_string(), name.to_string())]),
        ..Default::default()
    }
}

fn deployments() -> Vec<ResourceSelector> {
    vec![ResourceSelector {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        ..Default::default()
    }]
}

fn rule(target: Option<ClusterAffinity>, overriders: Overriders) -> OverrideRule {
    OverrideRule {
        target_cluster: target,
        overriders,
    }
}

fn spec(rules: Vec<OverrideRule>) -> OverrideSpec {
    OverrideSpec {
        resource_selectors: deployments(),
        override_rules: rules,
    }
}

fn zone(zone: &str) -> Option<ClusterAffinity> {
    Some(ClusterAffinity {
        zones: vec![zone.into()],
        ..Default::default()
    })
}

fn image(component: ImageComponent, operator: Operator, value: &str) -> ImageOverrider {
    ImageOverrider {
        component,
        operator,
        value: value.into(),
        container_names: vec![],
    }
}

fn plaintext(op: PatchOp, path: &str, value: Option<Value>) -> PlaintextOverrider {
    PlaintextOverrider {
        op,
        path: path.into(),
        value,
        from: None,
    }
}

fn namespaced<'a>(name: &'a str, spec: &'a OverrideSpec) -> OverridePolicyRef<'a> {
    OverridePolicyRef {
        scope: PolicyScope::Namespaced,
        namespace: Some("shop"),
        name,
        spec,
    }
}

fn clustered<'a>(name: &'a str, spec: &'a OverrideSpec) -> OverridePolicyRef<'a> {
    OverridePolicyRef {
        scope: PolicyScope::Cluster,
        namespace: None,
        name,
        spec,
    }
}

fn paths() -> WorkloadPaths {
    WorkloadPaths::builtin("apps/v1", "Deployment")
}

fn containers(copy: &Value) -> &Value {
    &copy["spec"]["template"]["spec"]["containers"]
}

#[test]
fn image_references_parse_and_print_back() {
    for image in [
        "nginx",
        "nginx:1.27",
        "library/nginx:1.27",
        "docker.io/library/nginx",
        "localhost:5000/team/web:dev",
        "registry.k8s.io/pause:3.10",
        "ghcr.io/o/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "ghcr.io/o/app:v1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ] {
        assert_eq!(ImageReference::parse(image).to_string(), image);
    }
    let r = ImageReference::parse("localhost:5000/team/web:dev");
    assert_eq!(r.registry.as_deref(), Some("localhost:5000"));
    assert_eq!(r.repository, "team/web");
    assert_eq!(r.tag.as_deref(), Some("dev"));
    let hub = ImageReference::parse("library/nginx");
    assert_eq!(
        hub.registry, None,
        "a first component without . or : is a path"
    );
    assert_eq!(hub.repository, "library/nginx");
}

#[test]
fn image_components_change_as_documented() {
    use ImageComponent::*;
    use Operator::*;
    let cases = [
        (
            Registry,
            Replace,
            "mirror.east.example",
            "nginx:1.27",
            "mirror.east.example/nginx:1.27",
        ),
        (
            Registry,
            Replace,
            "mirror.example",
            "registry.k8s.io/pause:3.10",
            "mirror.example/pause:3.10",
        ),
        (
            Registry,
            Add,
            "mirror.example",
            "nginx",
            "mirror.example/nginx",
        ),
        (
            Registry,
            Add,
            "mirror.example",
            "quay.io/a/b",
            "quay.io/a/b",
        ),
        (Registry, Remove, "", "quay.io/a/b:1", "a/b:1"),
        (
            Registry,
            Replace,
            "harbor.example.com/dockerhub",
            "nginx",
            "harbor.example.com/dockerhub/nginx",
        ),
        (
            Repository,
            Replace,
            "team/nginx-fips",
            "quay.io/nginx:1",
            "quay.io/team/nginx-fips:1",
        ),
        (Tag, Replace, "1.28", "nginx:1.27", "nginx:1.28"),
        (Tag, Add, "1.28", "nginx:1.27", "nginx:1.27"),
        (Tag, Add, "1.28", "nginx", "nginx:1.28"),
        (Tag, Remove, "", "nginx:1.27", "nginx"),
        (
            Tag,
            Replace,
            "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "nginx:1.27",
            "nginx@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ),
    ];
    for (component, operator, value, before, after) in cases {
        let o = image(component, operator, value);
        assert_eq!(image_problem(&o), None, "{o:?}");
        assert_eq!(override_image(before, &o), after, "{o:?} on {before}");
    }
}

#[test]
fn invalid_image_overriders_are_refused_with_the_fix() {
    use ImageComponent::*;
    use Operator::*;
    for (o, fragment) in [
        (
            image(Registry, Replace, "mirror"),
            "use a host name with a dot or a port",
        ),
        (
            image(Registry, Replace, "Mirror..example"),
            "is not a registry",
        ),
        (
            image(Repository, Replace, "Team/Web"),
            "is not a repository",
        ),
        (image(Repository, Add, "x"), "use replace"),
        (image(Tag, Replace, "-bad"), "neither a tag"),
        (image(Tag, Replace, ""), "value is required"),
        (image(Tag, Remove, "1.0"), "must be empty"),
    ] {
        let problem = image_problem(&o).unwrap_or_default();
        assert!(problem.contains(fragment), "{o:?}: {problem}");
    }
}

#[test]
fn one_zone_gets_the_mirror_and_the_others_nothing() {
    let spec = spec(vec![rule(
        zone("zone-a"),
        Overriders {
            image_overrider: vec![ImageOverrider {
                container_names: vec!["app".into()],
                ..image(
                    ImageComponent::Registry,
                    Operator::Replace,
                    "mirror.east.example",
                )
            }],
            ..Default::default()
        },
    )]);
    let policies = [namespaced("web-east", &spec)];
    let mut east = copy();
    let applied = apply(&mut east, &cluster("east", "zone-a"), &policies, &paths()).unwrap();
    assert_eq!(
        containers(&east)[0]["image"],
        "mirror.east.example/nginx:1.27"
    );
    assert_eq!(
        containers(&east)[1]["image"],
        "registry.k8s.io/pause:3.10",
        "not named"
    );
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].policy, "OverridePolicy/web-east");
    assert_eq!(applied[0].overrider, "imageOverrider[0]");
    assert_eq!(
        applied[0].changes,
        ["/spec/template/spec/containers/0/image: nginx:1.27 -> mirror.east.example/nginx:1.27"]
    );
    let mut west = copy();
    let applied = apply(&mut west, &cluster("west", "zone-b"), &policies, &paths()).unwrap();
    assert!(applied.is_empty());
    assert_eq!(west, copy());
}

#[test]
fn every_image_including_init_containers_without_names() {
    let spec = spec(vec![rule(
        None,
        Overriders {
            image_overrider: vec![image(
                ImageComponent::Registry,
                Operator::Add,
                "mirror.example",
            )],
            ..Default::default()
        },
    )]);
    let mut body = copy();
    apply(
        &mut body,
        &cluster("east", "zone-a"),
        &[clustered("m", &spec)],
        &paths(),
    )
    .unwrap();
    let pod = &body["spec"]["template"]["spec"];
    assert_eq!(pod["initContainers"][0]["image"], "mirror.example/busybox");
    assert_eq!(pod["containers"][0]["image"], "mirror.example/nginx:1.27");
    assert_eq!(
        pod["containers"][1]["image"], "registry.k8s.io/pause:3.10",
        "has one"
    );
}

#[test]
fn a_pod_and_a_custom_pod_spec_path() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "shop"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
    let spec = spec(vec![rule(
        None,
        Overriders {
            image_overrider: vec![image(ImageComponent::Tag, Operator::Add, "1.27")],
            ..Default::default()
        },
    )]);
    let mut body = pod.clone();
    apply(
        &mut body,
        &cluster("east", "zone-a"),
        &[clustered("m", &spec)],
        &WorkloadPaths::builtin("v1", "Pod"),
    )
    .unwrap();
    assert_eq!(body["spec"]["containers"][0]["image"], "nginx:1.27");

    // A custom kind whose interpreter names its pod template.
    let custom = json!({"apiVersion": "example.com/v1", "kind": "Worker", "metadata": {"name": "w", "namespace": "shop"},
        "spec": {"runner": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}});
    let mut unknown = custom.clone();
    apply(
        &mut unknown,
        &cluster("east", "zone-a"),
        &[clustered("m", &spec)],
        &WorkloadPaths::builtin("example.com/v1", "Worker"),
    )
    .unwrap();
    assert_eq!(
        unknown, custom,
        "no pod spec known: unchanged, not an error"
    );
    let mut known = custom.clone();
    let paths = WorkloadPaths {
        pod_specs: vec!["/spec/runner/template/spec".into()],
        replicas: None,
    };
    apply(
        &mut known,
        &cluster("east", "zone-a"),
        &[clustered("m", &spec)],
        &paths,
    )
    .unwrap();
    assert_eq!(
        known["spec"]["runner"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1.27"
    );
}

#[test]
fn args_command_env_labels_and_annotations() {
    let spec = spec(vec![rule(
        None,
        Overriders {
            command_overrider: vec![ListOverrider {
                container_name: "app".into(),
                operator: Operator::Add,
                value: vec!["nginx".into()],
            }],
            args_overrider: vec![
                ListOverrider {
                    container_name: "app".into(),
                    operator: Operator::Remove,
                    value: vec!["80".into(), "--port".into()],
                },
                ListOverrider {
                    container_name: "app".into(),
                    operator: Operator::Add,
                    value: vec!["--region=east".into()],
                },
                ListOverrider {
                    container_name: "missing".into(),
                    operator: Operator::Add,
                    value: vec!["x".into()],
                },
            ],
            env_overrider: vec![
                EnvOverrider {
                    container_name: "app".into(),
                    operator: Operator::Add,
                    value: vec![
                        EnvVar {
                            name: "MODE".into(),
                            value: Some("debug".into()),
                            ..Default::default()
                        },
                        EnvVar {
                            name: "ZONE".into(),
                            value: Some("a".into()),
                            ..Default::default()
                        },
                    ],
                },
                EnvOverrider {
                    container_name: "app".into(),
                    operator: Operator::Replace,
                    value: vec![EnvVar {
                        name: "ABSENT".into(),
                        value: Some("x".into()),
                        ..Default::default()
                    }],
                },
                EnvOverrider {
                    container_name: "sidecar".into(),
                    operator: Operator::Remove,
                    value: vec![EnvVar {
                        name: "NONE".into(),
                        ..Default::default()
                    }],
                },
            ],
            labels_overrider: vec![
                MapOverrider {
                    operator: Operator::Add,
                    value: BTreeMap::from([("region".into(), "east".into())]),
                },
                MapOverrider {
                    operator: Operator::Replace,
                    value: BTreeMap::from([
                        ("app".into(), "web-east".into()),
                        ("absent".into(), "x".into()),
                    ]),
                },
            ],
            annotations_overrider: vec![MapOverrider {
                operator: Operator::Add,
                value: BTreeMap::from([("team".into(), "east".into())]),
            }],
            ..Default::default()
        },
    )]);
    let mut body = copy();
    let applied = apply(
        &mut body,
        &cluster("east", "zone-a"),
        &[namespaced("p", &spec)],
        &paths(),
    )
    .unwrap();
    let app = &containers(&body)[0];
    assert_eq!(app["command"], json!(["nginx"]));
    assert_eq!(app["args"], json!(["--region=east"]));
    assert_eq!(
        app["env"],
        json!([{"name": "MODE", "value": "debug"}, {"name": "ZONE", "value": "a"}])
    );
    assert!(containers(&body)[1].get("env").is_none());
    assert_eq!(body["metadata"]["labels"]["region"], "east");
    assert_eq!(body["metadata"]["labels"]["app"], "web-east");
    assert!(
        body["metadata"]["labels"].get("absent").is_none(),
        "replace sets only keys there"
    );
    assert_eq!(body["metadata"]["annotations"]["team"], "east");
    // The fixed order: image, command, args, env, labels, annotations, plaintext.
    let order: Vec<&str> = applied.iter().map(|a| a.overrider.as_str()).collect();
    assert_eq!(
        order,
        [
            "commandOverrider[0]",
            "argsOverrider[0]",
            "argsOverrider[1]",
            "argsOverrider[2]",
            "envOverrider[0]",
            "envOverrider[1]",
            "envOverrider[2]",
            "labelsOverrider[0]",
            "labelsOverrider[1]",
            "annotationsOverrider[0]"
        ]
    );
    assert!(applied[3].changes.is_empty(), "no container named missing");
}

#[test]
fn policies_apply_cluster_ones_first_then_namespaced_by_name_and_the_last_wins() {
    let label = |value: &str| {
        spec(vec![rule(
            None,
            Overriders {
                labels_overrider: vec![MapOverrider {
                    operator: Operator::Add,
                    value: BTreeMap::from([("who".into(), value.into())]),
                }],
                ..Default::default()
            },
        )])
    };
    let (a, b, c, d) = (
        label("cluster-a"),
        label("cluster-b"),
        label("ns-a"),
        label("ns-b"),
    );
    let candidates = [
        namespaced("b-ns", &d),
        clustered("z-cluster", &b),
        namespaced("a-ns", &c),
        clustered("a-cluster", &a),
    ];
    let labels = BTreeMap::new();
    let template = TemplateRef {
        api_version: "apps/v1",
        kind: "Deployment",
        namespace: "shop",
        name: "web",
        labels: &labels,
    };
    let ordered = selecting(&template, &candidates);
    let names: Vec<String> = ordered.iter().map(|p| p.reference()).collect();
    assert_eq!(
        names,
        [
            "ClusterOverridePolicy/a-cluster",
            "ClusterOverridePolicy/z-cluster",
            "OverridePolicy/a-ns",
            "OverridePolicy/b-ns"
        ]
    );
    let mut body = copy();
    let applied = apply(&mut body, &cluster("east", "zone-a"), &ordered, &paths()).unwrap();
    assert_eq!(body["metadata"]["labels"]["who"], "ns-b");
    assert_eq!(applied_policies(&applied), names);

    // Another namespace's OverridePolicy does not select the template.
    let other = OverridePolicyRef {
        namespace: Some("other"),
        ..namespaced("x", &c)
    };
    assert!(selecting(&template, &[other]).is_empty());
}

#[test]
fn targets_match_names_labels_zones_regions_and_exclude() {
    let east = cluster("east", "zone-a");
    assert!(targets(None, &east));
    assert!(targets(zone("zone-a").as_ref(), &east));
    assert!(!targets(zone("zone-b").as_ref(), &east));
    let by = |affinity: ClusterAffinity| targets(Some(&affinity), &east);
    assert!(by(ClusterAffinity {
        cluster_names: vec!["east".into()],
        ..Default::default()
    }));
    assert!(!by(ClusterAffinity {
        cluster_names: vec!["west".into()],
        ..Default::default()
    }));
    assert!(!by(ClusterAffinity {
        exclude: vec!["east".into()],
        ..Default::default()
    }));
    assert!(by(ClusterAffinity {
        regions: vec!["region-1".into()],
        ..Default::default()
    }));
    assert!(!by(ClusterAffinity {
        regions: vec!["region-2".into()],
        ..Default::default()
    }));
    assert!(by(ClusterAffinity {
        label_selector: Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some(BTreeMap::from([("tier".into(), "east".into())])),
                match_expressions: None,
            }
        ),
        zones: vec!["zone-a".into()],
        ..Default::default()
    }));
}

#[test]
fn plaintext_patches_apply_and_failures_name_policy_rule_overrider_and_path() {
    let good = spec(vec![rule(
        None,
        Overriders {
            plaintext: vec![
                plaintext(
                    PatchOp::Test,
                    "/spec/template/spec/containers/0/name",
                    Some(json!("app")),
                ),
                plaintext(
                    PatchOp::Add,
                    "/spec/template/spec/nodeSelector",
                    Some(json!({"disk": "ssd"})),
                ),
                plaintext(
                    PatchOp::Replace,
                    "/spec/template/spec/containers/1/image",
                    Some(json!("pause:4")),
                ),
            ],
            ..Default::default()
        },
    )]);
    let mut body = copy();
    let applied = apply(
        &mut body,
        &cluster("east", "zone-a"),
        &[namespaced("p", &good)],
        &paths(),
    )
    .unwrap();
    assert_eq!(
        body["spec"]["template"]["spec"]["nodeSelector"]["disk"],
        "ssd"
    );
    assert_eq!(containers(&body)[1]["image"], "pause:4");
    assert_eq!(applied.len(), 3);

    for (patch, fragment) in [
        (
            plaintext(PatchOp::Replace, "/spec/nothing/here", Some(json!(1))),
            "the path does not exist",
        ),
        (
            plaintext(
                PatchOp::Test,
                "/spec/template/spec/containers/0/image",
                Some(json!("nginx:9")),
            ),
            "test failed: the copy holds \"nginx:2\" there, not \"nginx:9\"",
        ), // the rule before changed the tag
        (
            plaintext(PatchOp::Remove, "/spec/paused", None),
            "the path does not exist",
        ),
    ] {
        // An image override before it in the same policy: all or nothing.
        let bad = spec(vec![
            rule(
                None,
                Overriders {
                    image_overrider: vec![image(ImageComponent::Tag, Operator::Replace, "2")],
                    ..Default::default()
                },
            ),
            rule(
                None,
                Overriders {
                    plaintext: vec![patch.clone()],
                    ..Default::default()
                },
            ),
        ]);
        let mut body = copy();
        let error = apply(
            &mut body,
            &cluster("east", "zone-a"),
            &[namespaced("web-east", &bad)],
            &paths(),
        )
        .unwrap_err();
        assert_eq!(body, copy(), "untouched");
        assert_eq!(error.policy, "OverridePolicy/shop/web-east");
        assert_eq!(error.rule, 1);
        assert_eq!(error.overrider, "plaintext[0]");
        assert_eq!(error.path, patch.path);
        let text = error.to_string();
        assert!(
            text.starts_with(&format!("OverridePolicy/shop/web-east spec.overrideRules[1].overriders.plaintext[0] at {}: ", patch.path))
                && text.contains(fragment),
            "{text}"
        );
    }
}

#[test]
fn hub_owned_fields_are_refused() {
    let replicas = Some("/spec/replicas");
    for (path, fragment) in [
        ("/spec/replicas", "each cluster's share"),
        (
            "/metadata/labels/federation.example.com~1binding",
            "Bulkhead's own",
        ),
        (
            "/metadata/annotations/federation.example.com~1applied-hash",
            "Bulkhead's own",
        ),
        ("/metadata/labels", "whole labels map"),
        ("/metadata/name", "identifies the copy"),
        ("/kind", "identifies the copy"),
        ("", "whole copy"),
    ] {
        let why = hub_owned_path(path, replicas).unwrap_or_default();
        assert!(why.contains(fragment), "{path}: {why}");
        let problem =
            plaintext_problem(&plaintext(PatchOp::Replace, path, Some(json!(1))), replicas)
                .unwrap_or_default();
        assert!(
            problem.contains("a field the hub owns"),
            "{path}: {problem}"
        );
        assert!(
            plaintext_problem(&plaintext(PatchOp::Test, path, Some(json!(1))), replicas).is_none(),
            "a test reads only: {path}"
        );
    }
    assert!(
        hub_owned_path("/spec/replicas", None).is_none(),
        "not a divided kind"
    );
    assert!(hub_owned_path("/metadata/labels/app", replicas).is_none());
    assert!(hub_owned_path("/spec/template/spec", replicas).is_none());

    // A patch that reaches an owned field some other way fails too, and names it.
    let sneaky = spec(vec![rule(
        None,
        Overriders {
            plaintext: vec![plaintext(
                PatchOp::Replace,
                "/spec",
                Some(json!({"replicas": 9})),
            )],
            ..Default::default()
        },
    )]);
    let mut body = copy();
    let error = apply(
        &mut body,
        &cluster("east", "zone-a"),
        &[clustered("c", &sneaky)],
        &paths(),
    )
    .unwrap_err();
    assert_eq!(error.path, "/spec/replicas");
    assert!(error.message.contains("the cluster's share"), "{error}");
    assert_eq!(body, copy());
    // A label overrider on Bulkhead's own label.
    let owned = spec(vec![rule(
        None,
        Overriders {
            labels_overrider: vec![MapOverrider {
                operator: Operator::Remove,
                value: BTreeMap::from([(LABEL_MANAGED_BY.to_string(), String::new())]),
            }],
            ..Default::default()
        },
    )]);
    let error = apply(
        &mut body,
        &cluster("east", "zone-a"),
        &[clustered("c", &owned)],
        &paths(),
    )
    .unwrap_err();
    assert!(error.message.contains("Bulkhead's own labels"), "{error}");
}

#[test]
fn a_statefulset_copy_keeps_its_claims_whatever_the_overrides_say() {
    let template = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": "shop"},
        "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                 "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "db", "image": "postgres"}]}}}
    });
    let interpretation =
        crate::hub::federation::interpreter::Interpreters::built_in().get("apps/v1", "StatefulSet");
    let original = member_copy(&template, "shop.db", Some(1), &interpretation);
    assert_eq!(
        original["spec"]["persistentVolumeClaimRetentionPolicy"],
        json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
    );
    // Refused when the policy is written (the webhook's check)...
    let direct = "/spec/persistentVolumeClaimRetentionPolicy/whenDeleted";
    assert!(
        hub_owned_path(direct, Some("/spec/replicas"))
            .is_some_and(|why| why.contains("never deletes its data")),
    );
    // ...and when it is applied, however the patch reaches it (the lab's override:
    // a JSON patch of the whole field, and one of the whole spec).
    for (path, value) in [
        (
            "/spec/persistentVolumeClaimRetentionPolicy",
            json!({"whenDeleted": "Delete", "whenScaled": "Delete"}),
        ),
        (direct, json!("Delete")),
        (
            "/spec",
            json!({"replicas": 1, "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete"}}),
        ),
    ] {
        let policy = spec(vec![rule(
            zone("zone-a"),
            Overriders {
                plaintext: vec![plaintext(PatchOp::Replace, path, Some(value))],
                ..Default::default()
            },
        )]);
        let mut body = original.clone();
        let error = apply(
            &mut body,
            &cluster("east", "zone-a"),
            &[namespaced("keep-nothing", &policy)],
            &paths(),
        )
        .unwrap_err();
        assert!(
            error
                .path
                .starts_with("/spec/persistentVolumeClaimRetentionPolicy"),
            "{error}"
        );
        // The path is refused as it is written, or the change when it is applied.
        assert!(error.message.contains("Retain"), "{error}");
        assert_eq!(body, original, "nothing of the override is applied");
    }
}

#[test]
fn the_applied_hash_covers_the_overridden_body() {
    let mirror = |registry: &str| {
        spec(vec![rule(
            zone("zone-a"),
            Overriders {
                image_overrider: vec![image(ImageComponent::Registry, Operator::Replace, registry)],
                ..Default::default()
            },
        )])
    };
    let views = [cluster("east", "zone-a"), cluster("west", "zone-b")];
    let hash = |copy: &Value| copy["metadata"]["annotations"][ANNOTATION_APPLIED_HASH].clone();
    let (one, two) = (mirror("one.example"), mirror("two.example"));
    let with = |spec| TemplateOverrides {
        policies: vec![namespaced("p", spec)],
        clusters: &views,
        paths: paths(),
    };
    let (east_one, listed) = with(&one).copy_for("east", copy()).unwrap();
    assert_eq!(listed, ["OverridePolicy/p"]);
    let (east_two, _) = with(&two).copy_for("east", copy()).unwrap();
    let (west_one, none) = with(&one).copy_for("west", copy()).unwrap();
    assert!(none.is_empty());
    assert_ne!(
        hash(&east_one),
        hash(&copy()),
        "an override changes the hash"
    );
    assert_ne!(
        hash(&east_one),
        hash(&east_two),
        "so does a change of the override"
    );
    assert_eq!(
        west_one,
        copy(),
        "an untargeted cluster's copy is the plain copy"
    );
    assert_eq!(
        with(&one).copy_for("east", copy()).unwrap().0,
        east_one,
        "stable"
    );
    // Restamping an unchanged copy keeps its hash.
    let mut again = copy();
    crate::hub::federation::copies::restamp(&mut again);
    assert_eq!(again, copy());
    // The hash is that of the body: rebuilt from scratch, it is the same.
    let mut rebuilt = east_one.clone();
    rebuilt["metadata"]["annotations"][ANNOTATION_APPLIED_HASH] = json!("x");
    crate::hub::federation::copies::restamp(&mut rebuilt);
    assert_eq!(rebuilt, east_one);
}

#[test]
fn spec_problems_name_the_field() {
    let bad = spec(vec![
        rule(None, Overriders::default()),
        rule(
            None,
            Overriders {
                plaintext: vec![
                    plaintext(PatchOp::Add, "spec/x", Some(json!(1))),
                    plaintext(PatchOp::Replace, "/spec/x", None),
                    plaintext(PatchOp::Replace, "/spec/replicas", Some(json!(1))),
                    PlaintextOverrider {
                        from: None,
                        ..plaintext(PatchOp::Move, "/a", None)
                    },
                ],
                args_overrider: vec![ListOverrider {
                    container_name: String::new(),
                    operator: Operator::Add,
                    value: vec!["x".into()],
                }],
                env_overrider: vec![EnvOverrider {
                    container_name: "app".into(),
                    operator: Operator::Add,
                    value: vec![],
                }],
                labels_overrider: vec![MapOverrider {
                    operator: Operator::Add,
                    value: BTreeMap::from([("ok".into(), "not ok!".into())]),
                }],
                ..Default::default()
            },
        ),
    ]);
    let problems = spec_problems(&bad, Some("/spec/replicas"));
    let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.overrideRules[0].overriders",
            "spec.overrideRules[1].overriders.argsOverrider[0]",
            "spec.overrideRules[1].overriders.envOverrider[0]",
            "spec.overrideRules[1].overriders.labelsOverrider[0]",
            "spec.overrideRules[1].overriders.plaintext[0]",
            "spec.overrideRules[1].overriders.plaintext[1]",
            "spec.overrideRules[1].overriders.plaintext[2]",
            "spec.overrideRules[1].overriders.plaintext[3]",
        ],
        "{problems:#?}"
    );
    assert!(problems[4].1.contains("is not a JSON pointer"));
    assert!(problems[5].1.contains("value is required for op replace"));
    assert!(problems[6].1.contains("each cluster's share"));
    assert!(problems[7].1.contains("from is required"));
}

#[test]
fn override_events_say_when_it_fails_and_when_it_recovers() {
    use crate::api::resource_binding::ClusterPlacementStatus;
    let row = |failed: bool, message: &str| ClusterPlacementStatus {
        name: "east".into(),
        override_failed: failed,
        message: (!message.is_empty()).then(|| message.to_string()),
        overrides: if failed {
            vec![]
        } else {
            vec!["OverridePolicy/p".into()]
        },
        ..Default::default()
    };
    let events = override_events(&[row(false, "")], &[row(true, "override failed: x")]);
    assert_eq!(
        events,
        [(
            true,
            "OverrideFailed",
            "east: override failed: x".to_string()
        )]
    );
    assert!(
        override_events(
            &[row(true, "override failed: x")],
            &[row(true, "override failed: x")]
        )
        .is_empty()
    );
    assert_eq!(
        override_events(
            &[row(true, "override failed: x")],
            &[row(true, "override failed: y")]
        )
        .len(),
        1
    );
    let recovered = override_events(&[row(true, "override failed: x")], &[row(false, "")]);
    assert_eq!(recovered[0].1, "OverrideApplied");
    assert!(recovered[0].2.contains("OverridePolicy/p"), "{recovered:?}");
}

// ---- Properties ---------------------------------------------------------------------

fn arb_operator() -> impl Strategy<Value = Operator> {
    prop_oneof![
        Just(Operator::Add),
        Just(Operator::Remove),
        Just(Operator::Replace)
    ]
}

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("app".to_string()),
        Just("tier".to_string()),
        Just(LABEL_MANAGED_BY.to_string()),
        Just(LABEL_BINDING.to_string()),
        Just(ANNOTATION_APPLIED_HASH.to_string()),
        "[a-z]{1,5}",
    ]
}

fn arb_path() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("/spec".to_string()),
        Just("/spec/replicas".to_string()),
        Just("/metadata".to_string()),
        Just("/metadata/labels".to_string()),
        Just("/metadata/annotations".to_string()),
        Just("/metadata/labels/federation.example.com~1binding".to_string()),
        Just("/metadata/labels/app".to_string()),
        Just("/metadata/name".to_string()),
        Just("/spec/template/spec/containers/0/image".to_string()),
        Just("/spec/template/spec/containers/-".to_string()),
        Just("/spec/does/not/exist".to_string()),
        "/[a-z]{1,4}(/[a-z0-9]{1,3}){0,2}",
    ]
}

fn arb_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(3)),
        Just(json!("nginx:1.27")),
        Just(json!({"replicas": 7})),
        Just(json!({"app": "x"})),
        Just(json!({})),
        Just(Value::Null),
    ]
}

fn arb_plaintext() -> impl Strategy<Value = PlaintextOverrider> {
    let op = prop_oneof![
        Just(PatchOp::Add),
        Just(PatchOp::Remove),
        Just(PatchOp::Replace),
        Just(PatchOp::Test),
        Just(PatchOp::Move),
        Just(PatchOp::Copy),
    ];
    (
        op,
        arb_path(),
        proptest::option::of(arb_value()),
        proptest::option::of(arb_path()),
    )
        .prop_map(|(op, path, value, from)| PlaintextOverrider {
            op,
            path,
            value,
            from,
        })
}

fn arb_overriders() -> impl Strategy<Value = Overriders> {
    let image = (
        prop_oneof![
            Just(ImageComponent::Registry),
            Just(ImageComponent::Repository),
            Just(ImageComponent::Tag)
        ],
        arb_operator(),
        prop_oneof![
            Just(String::new()),
            Just("mirror.example".to_string()),
            Just("1.28".to_string()),
            Just("team/web".to_string())
        ],
    )
        .prop_map(|(component, operator, value)| ImageOverrider {
            component,
            operator,
            value,
            container_names: vec![],
        });
    let map = || {
        (
            arb_operator(),
            proptest::collection::btree_map(arb_key(), "[a-z]{0,4}", 1..3),
        )
            .prop_map(|(operator, value)| MapOverrider { operator, value })
    };
    (
        proptest::collection::vec(image, 0..2),
        proptest::collection::vec(map(), 0..2),
        proptest::collection::vec(map(), 0..2),
        proptest::collection::vec(arb_plaintext(), 0..3),
    )
        .prop_map(
            |(image_overrider, labels_overrider, annotations_overrider, plaintext)| Overriders {
                image_overrider,
                labels_overrider,
                annotations_overrider,
                plaintext,
                ..Default::default()
            },
        )
}

/// Bulkhead's own keys of a map, with their values.
type OwnedKeys = Vec<(String, Value)>;

fn hub_fields(copy: &Value) -> (Value, OwnedKeys, OwnedKeys) {
    let owned = |field: &str| -> OwnedKeys {
        copy["metadata"][field]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.starts_with(HUB_KEY_PREFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    (
        json!([
            copy["apiVersion"],
            copy["kind"],
            copy["metadata"]["name"],
            copy["metadata"]["namespace"],
            copy["spec"]["replicas"]
        ]),
        owned("labels"),
        owned("annotations"),
    )
}

proptest! {
    /// Whatever the overriders, the hub's own labels, annotations, identity and replica
    /// share come out as they went in (the applied-hash is recomputed only after), and a
    /// failure leaves the copy exactly as it was.
    #[test]
    fn overrides_never_touch_what_the_hub_owns(rules in proptest::collection::vec(arb_overriders(), 1..3)) {
        let spec = spec(rules.into_iter().map(|o| rule(None, o)).collect());
        let policies = [namespaced("p", &spec)];
        let before = copy();
        let mut body = before.clone();
        match apply(&mut body, &cluster("east", "zone-a"), &policies, &paths()) {
            Ok(_) => prop_assert_eq!(hub_fields(&body), hub_fields(&before)),
            Err(error) => {
                prop_assert_eq!(&body, &before);
                prop_assert!(error.policy == "OverridePolicy/shop/p");
            }
        }
    }

    /// An overrider the spec rules accept and a copy it applies to: applying is
    /// deterministic (the same inputs, the same copy).
    #[test]
    fn overrides_are_deterministic(rules in proptest::collection::vec(arb_overriders(), 1..3)) {
        let spec = spec(rules.into_iter().map(|o| rule(None, o)).collect());
        let policies = [clustered("c", &spec)];
        let mut first = copy();
        let mut second = copy();
        let a = apply(&mut first, &cluster("east", "zone-a"), &policies, &paths());
        let b = apply(&mut second, &cluster("east", "zone-a"), &policies, &paths());
        prop_assert_eq!(a, b);
        prop_assert_eq!(first, second);
    }

    /// The webhook's rules and the hub agree: a policy without spec problems fails only
    /// on the template (a path that does not exist, a failed test, a parent of an owned
    /// field), never for a reason the webhook would have refused.
    #[test]
    fn accepted_overriders_fail_only_on_the_template(rules in proptest::collection::vec(arb_overriders(), 1..3)) {
        let spec = spec(rules.into_iter().map(|o| rule(None, o)).collect());
        if !spec_problems(&spec, Some("/spec/replicas")).is_empty() {
            return Ok(());
        }
        let mut body = copy();
        if let Err(error) = apply(&mut body, &cluster("east", "zone-a"), &[clustered("c", &spec)], &paths()) {
            prop_assert!(error.overrider.starts_with("plaintext"), "{}", error);
        }
    }
}
