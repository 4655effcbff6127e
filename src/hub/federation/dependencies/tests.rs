use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

fn object(kind: &str, name: &str) -> ObjectRef {
    let api_version = match kind {
        "Deployment" | "StatefulSet" => "apps/v1",
        "Widget" | "Gadget" => "example.com/v1",
        _ => "v1",
    };
    ObjectRef::new(api_version, kind, "shop", name)
}

fn clusters(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

fn names(refs: &[DependencyRef]) -> Vec<String> {
    refs.iter()
        .map(|r| format!("{}/{}", r.kind, r.name))
        .collect()
}

/// A pod spec using every kind of reference once.
fn pod_spec() -> Value {
    json!({
        "serviceAccountName": "web-runner",
        "imagePullSecrets": [{"name": "registry"}],
        "volumes": [
            {"name": "a", "configMap": {"name": "settings"}},
            {"name": "b", "secret": {"secretName": "tls", "optional": true}},
            {"name": "c", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "d", "projected": {"sources": [
                {"configMap": {"name": "projected-config"}},
                {"secret": {"name": "projected-secret"}},
                {"serviceAccountToken": {"path": "token"}},
            ]}},
            {"name": "e", "csi": {"driver": "x", "nodePublishSecretRef": {"name": "csi-secret"}}},
            {"name": "f", "emptyDir": {}},
            {"name": "g", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
        ],
        "initContainers": [{"name": "init", "envFrom": [{"configMapRef": {"name": "init-env"}}]}],
        "containers": [{
            "name": "web",
            "env": [
                {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "a"}}},
                {"name": "B", "valueFrom": {"secretKeyRef": {"name": "password", "key": "b", "optional": true}}},
                {"name": "C", "value": "plain"},
                {"name": "D", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ],
            "envFrom": [{"secretRef": {"name": "env-secret"}}],
        }],
        "ephemeralContainers": [{"name": "debug", "env": [
            {"name": "E", "valueFrom": {"secretKeyRef": {"name": "debug-secret", "key": "e"}}},
        ]}],
    })
}

const ALL: [&str; 12] = [
    "ConfigMap/init-env",
    "ConfigMap/projected-config",
    "ConfigMap/settings",
    "PersistentVolumeClaim/data",
    "Secret/csi-secret",
    "Secret/debug-secret",
    "Secret/env-secret",
    "Secret/password",
    "Secret/projected-secret",
    "Secret/registry",
    "Secret/tls",
    "ServiceAccount/web-runner",
];

fn expected_all() -> Vec<String> {
    ALL.iter().map(|s| s.to_string()).collect()
}

fn workload(api_version: &str, kind: &str, spec: Value) -> Value {
    json!({
        "apiVersion": api_version, "kind": kind,
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": spec,
    })
}

#[test]
fn every_reference_of_a_pod_template_is_found_once_and_sorted() {
    let deployment = workload(
        "apps/v1",
        "Deployment",
        json!({"template": {"spec": pod_spec()}}),
    );
    let refs = references("apps/v1", "Deployment", &deployment, None);
    assert_eq!(names(&refs), expected_all());
    assert!(
        refs.iter()
            .all(|r| r.namespace == "shop" && r.api_version == "v1")
    );
    let mut sorted = refs.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(refs, sorted);
}

#[test]
fn the_template_is_found_where_each_kind_keeps_it() {
    let template = json!({"template": {"spec": pod_spec()}});
    for (api_version, kind) in [
        ("apps/v1", "StatefulSet"),
        ("apps/v1", "DaemonSet"),
        ("apps/v1", "ReplicaSet"),
        ("batch/v1", "Job"),
        ("v1", "ReplicationController"),
    ] {
        let object = workload(api_version, kind, template.clone());
        assert_eq!(
            names(&references(api_version, kind, &object, None)),
            expected_all(),
            "{kind}"
        );
    }
    let cron = workload(
        "batch/v1",
        "CronJob",
        json!({"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {"spec": pod_spec()}}}}),
    );
    assert_eq!(
        names(&references("batch/v1", "CronJob", &cron, None)),
        expected_all()
    );
    let pod = workload("v1", "Pod", pod_spec());
    assert_eq!(names(&references("v1", "Pod", &pod, None)), expected_all());
    // A custom kind: only where its interpreter says.
    let custom = workload(
        "example.com/v1",
        "Runner",
        json!({"runner": {"podTemplate": {"spec": pod_spec()}}}),
    );
    assert!(references("example.com/v1", "Runner", &custom, None).is_empty());
    assert_eq!(
        names(&references(
            "example.com/v1",
            "Runner",
            &custom,
            Some(".spec.runner.podTemplate")
        )),
        expected_all()
    );
    // A path that does not parse, or leads nowhere, finds nothing.
    assert!(references("example.com/v1", "Runner", &custom, Some("spec.runner")).is_empty());
    assert!(references("example.com/v1", "Runner", &custom, Some(".spec.other")).is_empty());
    // A built-in kind ignores the path: its template location is known.
    let deployment = workload("apps/v1", "Deployment", template);
    assert_eq!(
        names(&references(
            "apps/v1",
            "Deployment",
            &deployment,
            Some(".spec.nothing")
        )),
        expected_all()
    );
}

#[test]
fn what_is_not_a_dependency() {
    let statefulset = workload(
        "apps/v1",
        "StatefulSet",
        json!({
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {}}],
            "template": {"spec": {
                "serviceAccountName": "default",
                "containers": [{"name": "db", "volumeMounts": [{"name": "data", "mountPath": "/d"}],
                    "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": ""}}}]}],
            }},
        }),
    );
    assert!(references("apps/v1", "StatefulSet", &statefulset, None).is_empty());
    // The deprecated spelling of the ServiceAccount counts when the new one is unset.
    let old = workload(
        "apps/v1",
        "Deployment",
        json!({"template": {"spec": {"serviceAccount": "legacy", "containers": []}}}),
    );
    assert_eq!(
        names(&references("apps/v1", "Deployment", &old, None)),
        ["ServiceAccount/legacy"]
    );
    // A Service has no pod template.
    let service = workload("v1", "Service", json!({"selector": {"app": "web"}}));
    assert!(references("v1", "Service", &service, None).is_empty());
}

#[test]
fn reference_rules_name_custom_references() {
    let widget = json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "namespace": "shop"},
        "spec": {
            "configRef": {"name": "widget-config"},
            "secrets": [{"name": "one"}, {"name": "two"}, {"name": "two"}, {"name": ""}],
            "elsewhere": {"name": "theirs", "namespace": "other"},
            "here": {"name": "ours", "namespace": "shop"},
            "gadget": "g1",
            "count": 3,
        },
    });
    let rules = [
        ReferenceRule::new(".spec.configRef.name", "v1", "ConfigMap").unwrap(),
        ReferenceRule::new(".spec.secrets[].name", "v1", "Secret").unwrap(),
        ReferenceRule::new(".spec.elsewhere", "v1", "Secret").unwrap(),
        ReferenceRule::new(".spec.here", "v1", "Secret").unwrap(),
        ReferenceRule::new(".spec.gadget", "example.com/v1", "Gadget").unwrap(),
        ReferenceRule::new(".spec.count", "v1", "ConfigMap").unwrap(),
        ReferenceRule::new(".spec.missing[].name", "v1", "ConfigMap").unwrap(),
    ];
    let refs = references_in("example.com/v1", "Widget", &widget, None, &rules);
    assert_eq!(
        names(&refs),
        [
            "Gadget/g1",
            "ConfigMap/widget-config",
            "Secret/one",
            "Secret/ours",
            "Secret/two"
        ]
    );
    // The object form and the name form find the same ConfigMap.
    let object_form = [ReferenceRule::new(".spec.configRef", "v1", "ConfigMap").unwrap()];
    assert_eq!(
        names(&references_in(
            "example.com/v1",
            "Widget",
            &widget,
            None,
            &object_form
        )),
        ["ConfigMap/widget-config"]
    );
    // Refused rules say what to write.
    for (path, api_version, kind, what) in [
        ("spec.x", "v1", "ConfigMap", "reference rule path"),
        (".", "v1", "ConfigMap", "reference rule path"),
        (".spec..name", "v1", "ConfigMap", "reference rule path"),
        (".spec.items[0]", "v1", "ConfigMap", "reference rule path"),
        (".spec.x", "", "ConfigMap", "reference rule apiVersion"),
        (".spec.x", "a/b/c", "ConfigMap", "reference rule apiVersion"),
        (".spec.x", "v1", "configmap", "reference rule kind"),
    ] {
        let error = ReferenceRule::new(path, api_version, kind).unwrap_err();
        assert_eq!(error.what, what, "{path} {api_version} {kind}");
    }
}

#[test]
fn pod_template_and_rules_together() {
    let custom = workload(
        "example.com/v1",
        "Runner",
        json!({"template": {"spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "env"}}]}]}},
               "configRef": {"name": "env"}, "tokenSecret": "token"}),
    );
    let template = FieldPath::parse(".spec.template").unwrap();
    let rules = [
        ReferenceRule::new(".spec.configRef.name", "v1", "ConfigMap").unwrap(),
        ReferenceRule::new(".spec.tokenSecret", "v1", "Secret").unwrap(),
    ];
    assert_eq!(
        names(&references_in(
            "example.com/v1",
            "Runner",
            &custom,
            Some(&template),
            &rules
        )),
        ["ConfigMap/env", "Secret/token"]
    );
}

#[test]
fn dependency_kinds() {
    assert!(is_pod_dependency_kind("v1", "ConfigMap"));
    assert!(is_pod_dependency_kind("v1", "PersistentVolumeClaim"));
    assert!(!is_pod_dependency_kind("apps/v1", "Deployment"));
    assert!(!is_pod_dependency_kind("example.com/v1", "Secret"));
    assert!(object("PersistentVolumeClaim", "data").is_persistent_volume_claim());
    assert_eq!(
        object("ConfigMap", "settings").to_string(),
        "ConfigMap shop/settings"
    );
}

// The graph.

#[test]
fn dependencies_follow_their_workload_and_leave_with_it() {
    let mut graph = DependencyGraph::new();
    let web = object("Deployment", "web");
    let settings = object("ConfigMap", "settings");
    let password = object("Secret", "password");
    graph.set_workload(
        web.clone(),
        vec![settings.clone(), password.clone()],
        clusters(&["east", "west"]),
    );
    assert_eq!(graph.clusters_for(&settings), clusters(&["east", "west"]));
    assert_eq!(graph.clusters_for(&password), clusters(&["east", "west"]));
    assert_eq!(graph.dependents(&settings), std::slice::from_ref(&web));
    assert_eq!(
        graph.dependencies_of(&web),
        [settings.clone(), password.clone()]
    );
    // The workload leaves west.
    graph.set_workload(
        web.clone(),
        vec![settings.clone(), password.clone()],
        clusters(&["east"]),
    );
    assert_eq!(graph.clusters_for(&settings), clusters(&["east"]));
    // It stops using the Secret.
    graph.set_workload(web.clone(), vec![settings.clone()], clusters(&["east"]));
    assert!(graph.clusters_for(&password).is_empty());
    assert!(graph.dependents(&password).is_empty());
    // It is deleted.
    graph.remove_workload(&web);
    assert!(graph.clusters_for(&settings).is_empty());
    assert!(graph.is_empty());
}

#[test]
fn a_shared_dependency_goes_where_any_workload_goes() {
    let mut graph = DependencyGraph::new();
    let shared = object("ConfigMap", "shared");
    let web = object("Deployment", "web");
    let api = object("Deployment", "api");
    graph.set_workload(
        web.clone(),
        vec![shared.clone()],
        clusters(&["east", "west"]),
    );
    graph.set_workload(
        api.clone(),
        vec![shared.clone()],
        clusters(&["west", "north"]),
    );
    assert_eq!(
        graph.clusters_for(&shared),
        clusters(&["east", "north", "west"])
    );
    assert_eq!(graph.dependents(&shared), [api.clone(), web.clone()]);
    // web leaves west: api still needs it there.
    graph.set_workload(web.clone(), vec![shared.clone()], clusters(&["east"]));
    assert_eq!(
        graph.clusters_for(&shared),
        clusters(&["east", "north", "west"])
    );
    graph.remove_workload(&api);
    assert_eq!(graph.clusters_for(&shared), clusters(&["east"]));
    assert_eq!(graph.dependents(&shared), [web]);
}

#[test]
fn only_dependencies_in_the_workloads_namespace() {
    let mut graph = DependencyGraph::new();
    let web = object("Deployment", "web");
    let theirs = ObjectRef::new("v1", "ConfigMap", "other", "settings");
    graph.set_workload(web.clone(), vec![theirs.clone()], clusters(&["east"]));
    assert!(graph.clusters_for(&theirs).is_empty());
    assert!(graph.dependencies_of(&web).is_empty());
}

#[test]
fn custom_references_chain_through_followers() {
    let mut graph = DependencyGraph::new();
    let web = object("Deployment", "web");
    let widget = object("Widget", "w");
    let config = object("ConfigMap", "widget-config");
    graph.set_workload(web.clone(), vec![widget.clone()], clusters(&["east"]));
    // The Widget's references are registered after (or before: order does not matter).
    graph.set_references(widget.clone(), vec![config.clone()]);
    assert_eq!(graph.clusters_for(&config), clusters(&["east"]));
    assert_eq!(graph.dependents(&config), std::slice::from_ref(&web));
    let api = object("Deployment", "api");
    graph.set_workload(api.clone(), vec![widget.clone()], clusters(&["west"]));
    assert_eq!(graph.clusters_for(&config), clusters(&["east", "west"]));
    // The Widget names another ConfigMap: the old one leaves, the new one follows.
    let other = object("ConfigMap", "other-config");
    graph.set_references(widget.clone(), vec![other.clone()]);
    assert!(graph.clusters_for(&config).is_empty());
    assert_eq!(graph.clusters_for(&other), clusters(&["east", "west"]));
    // The same Widget under another version of its API is the same object.
    let beta = ObjectRef::new("example.com/v1beta1", "Widget", "shop", "w");
    assert_eq!(graph.clusters_for(&beta), clusters(&["east", "west"]));
    graph.remove_workload(&web);
    graph.remove_workload(&api);
    assert!(graph.clusters_for(&other).is_empty());
    // The Widget's registration stays until it is removed.
    assert_eq!(graph.dependencies_of(&widget), [other]);
    graph.remove_workload(&widget);
    assert!(graph.is_empty());
}

#[test]
fn a_workload_on_the_way_passes_on_its_own_placement() {
    let mut graph = DependencyGraph::new();
    let web = object("Deployment", "web");
    let widget = object("Widget", "w");
    let config = object("ConfigMap", "widget-config");
    graph.set_workload(web.clone(), vec![widget.clone()], clusters(&["east"]));
    // The Widget has a policy of its own, placing it in west: its ConfigMap goes there.
    graph.set_workload(widget.clone(), vec![config.clone()], clusters(&["west"]));
    assert_eq!(graph.clusters_for(&config), clusters(&["west"]));
    assert_eq!(graph.dependents(&config), std::slice::from_ref(&widget));
    // The Widget itself is still needed by web in east (its own policy decides, see
    // placement_for).
    assert_eq!(graph.clusters_for(&widget), clusters(&["east"]));
    assert_eq!(graph.placement_for(&widget, true), DependencyPlacement::Own);
    // Its policy goes away: it follows web again, and so does its ConfigMap.
    graph.set_references(widget.clone(), vec![config.clone()]);
    assert_eq!(graph.clusters_for(&config), clusters(&["east"]));
    assert_eq!(graph.dependents(&config), [web]);
}

#[test]
fn cycles_are_reported_and_their_members_follow() {
    let mut graph = DependencyGraph::new();
    let web = object("Deployment", "web");
    let a = object("Widget", "a");
    let b = object("Gadget", "b");
    let config = object("ConfigMap", "c");
    graph.set_references(a.clone(), vec![b.clone()]);
    graph.set_references(b.clone(), vec![a.clone(), config.clone()]);
    graph.set_workload(web.clone(), vec![a.clone()], clusters(&["east"]));
    assert_eq!(graph.cycles(), [vec![b.clone(), a.clone()]]);
    for member in [&a, &b, &config] {
        assert_eq!(graph.clusters_for(member), clusters(&["east"]), "{member}");
        assert_eq!(graph.dependents(member), std::slice::from_ref(&web));
    }
    // The workload leaves: the cycle does not keep itself placed.
    graph.remove_workload(&web);
    for member in [&a, &b, &config] {
        assert!(graph.clusters_for(member).is_empty(), "{member}");
    }
    // A self-reference is a cycle too.
    graph.set_references(config.clone(), vec![config.clone()]);
    assert_eq!(graph.cycles().len(), 2);
}

#[test]
fn placement_rules() {
    let mut graph = DependencyGraph::new();
    let web = object("Deployment", "web");
    let settings = object("ConfigMap", "settings");
    let unused = object("ConfigMap", "unused");
    graph.set_workload(web.clone(), vec![settings.clone()], clusters(&["east"]));
    // Not synced: the hub does not know yet.
    assert_eq!(
        graph.placement_for(&settings, false),
        DependencyPlacement::Unknown
    );
    assert_eq!(
        graph.placement_for(&unused, false),
        DependencyPlacement::Unknown
    );
    // A policy of its own wins, synced or not.
    assert_eq!(
        graph.placement_for(&settings, true),
        DependencyPlacement::Own
    );
    graph.set_synced(true);
    assert!(graph.is_synced());
    assert_eq!(
        graph.placement_for(&settings, false),
        DependencyPlacement::Follows {
            clusters: clusters(&["east"]),
            dependents: vec![web.clone()],
        }
    );
    assert_eq!(
        graph.placement_for(&settings, true),
        DependencyPlacement::Own
    );
    assert_eq!(
        graph.placement_for(&unused, false),
        DependencyPlacement::None
    );
    // A workload placed nowhere: its dependency follows it nowhere.
    graph.set_workload(web.clone(), vec![settings.clone()], BTreeSet::new());
    assert_eq!(
        graph.placement_for(&settings, false),
        DependencyPlacement::Follows {
            clusters: BTreeSet::new(),
            dependents: vec![web],
        }
    );
}

// Departures.

fn presence<'a>(
    present: &'a BTreeSet<String>,
    ready: &'a BTreeSet<String>,
    stateful_users: &'a BTreeSet<String>,
) -> Presence<'a> {
    Presence {
        present,
        ready,
        stateful_users,
    }
}

fn follows(names: &[&str]) -> DependencyPlacement {
    DependencyPlacement::Follows {
        clusters: clusters(names),
        dependents: vec![object("Deployment", "web")],
    }
}

#[test]
fn a_dependency_leaves_the_clusters_no_workload_needs() {
    let settings = object("ConfigMap", "settings");
    let present = clusters(&["east", "west"]);
    let ready = clusters(&["east"]);
    let none = BTreeSet::new();
    // Readiness does not hold a ConfigMap: it leaves west.
    let result = departures(
        &settings,
        &follows(&["east"]),
        &presence(&present, &ready, &none),
    );
    assert_eq!(result.leave, clusters(&["west"]));
    assert!(result.held.is_empty());
    let result = departures(
        &settings,
        &DependencyPlacement::None,
        &presence(&present, &ready, &none),
    );
    assert_eq!(result.leave, present);
    // Own: its binding decides.
    let result = departures(
        &settings,
        &DependencyPlacement::Own,
        &presence(&present, &ready, &none),
    );
    assert_eq!(result, Departures::default());
}

#[test]
fn nothing_leaves_while_the_graph_is_unknown() {
    let settings = object("ConfigMap", "settings");
    let present = clusters(&["east", "west"]);
    let none = BTreeSet::new();
    let result = departures(
        &settings,
        &DependencyPlacement::Unknown,
        &presence(&present, &present, &none),
    );
    assert!(result.leave.is_empty());
    assert_eq!(
        result.held,
        BTreeMap::from([
            ("east".to_string(), Hold::NotSynced),
            ("west".to_string(), Hold::NotSynced)
        ])
    );
    assert_eq!(result.held["east"].reason(), "DependenciesNotSynced");
}

#[test]
fn a_claim_stays_while_its_stateful_workload_is_there_or_a_cluster_is_not_ready() {
    let data = object("PersistentVolumeClaim", "data");
    let present = clusters(&["east", "west"]);
    let all_ready = clusters(&["east", "west", "north"]);
    let none = BTreeSet::new();
    // The StatefulSet moved from west to north; its copy in west is still there.
    let users = clusters(&["west"]);
    let placement = follows(&["east", "north"]);
    let result = departures(&data, &placement, &presence(&present, &all_ready, &users));
    assert!(result.leave.is_empty());
    assert_eq!(result.held["west"], Hold::StatefulWorkloadPresent);
    // Gone from west, but north (the new placement) is not Ready.
    let no_north = clusters(&["east", "west"]);
    let result = departures(&data, &placement, &presence(&present, &no_north, &none));
    assert!(result.leave.is_empty());
    assert_eq!(result.held["west"], Hold::ClusterNotReady("north".into()));
    // West itself not Ready: it names west.
    let no_west = clusters(&["east", "north"]);
    let result = departures(&data, &placement, &presence(&present, &no_west, &none));
    assert_eq!(result.held["west"], Hold::ClusterNotReady("west".into()));
    // Everything Ready and the workload gone from west: the claim leaves west.
    let result = departures(&data, &placement, &presence(&present, &all_ready, &none));
    assert_eq!(result.leave, clusters(&["west"]));
    assert!(result.held.is_empty());
    // Where it is still wanted nothing is ever held or deleted.
    assert!(!result.leave.contains("east"));
}

// Properties.

/// One registration in a generated history.
#[derive(Clone, Debug)]
enum Step {
    Workload(usize, Vec<usize>, BTreeSet<String>),
    References(usize, Vec<usize>),
    Remove(usize),
}

const OBJECTS: usize = 10;
const CLUSTERS: [&str; 4] = ["east", "west", "north", "south"];

fn generated(index: usize) -> ObjectRef {
    match index {
        0..=3 => ObjectRef::new("apps/v1", "Deployment", "shop", &format!("d{index}")),
        4 | 5 => ObjectRef::new("example.com/v1", "Widget", "shop", &format!("w{index}")),
        _ => ObjectRef::new("v1", "ConfigMap", "shop", &format!("c{index}")),
    }
}

fn step() -> impl Strategy<Value = Step> {
    let deps = proptest::collection::vec(0..OBJECTS, 0..4);
    let placed = proptest::collection::btree_set(
        proptest::sample::select(CLUSTERS.to_vec()).prop_map(String::from),
        0..4,
    );
    prop_oneof![
        4 => (0..OBJECTS, deps.clone(), placed).prop_map(|(o, d, c)| Step::Workload(o, d, c)),
        2 => (0..OBJECTS, deps).prop_map(|(o, d)| Step::References(o, d)),
        1 => (0..OBJECTS).prop_map(Step::Remove),
    ]
}

/// The registrations a history leaves, computed without the graph.
#[derive(Default)]
struct Model {
    /// object -> (its own placement if a workload, what it references)
    registered: BTreeMap<usize, (Option<BTreeSet<String>>, BTreeSet<usize>)>,
}

impl Model {
    fn apply(&mut self, step: &Step) {
        match step {
            Step::Workload(o, d, c) => {
                self.registered
                    .insert(*o, (Some(c.clone()), d.iter().copied().collect()));
            }
            Step::References(o, d) => {
                self.registered
                    .insert(*o, (None, d.iter().copied().collect()));
            }
            Step::Remove(o) => {
                self.registered.remove(o);
            }
        }
    }

    fn refs(&self, o: usize) -> BTreeSet<usize> {
        self.registered
            .get(&o)
            .map(|r| r.1.clone())
            .unwrap_or_default()
    }

    fn own(&self, o: usize) -> Option<&BTreeSet<String>> {
        self.registered.get(&o).and_then(|r| r.0.as_ref())
    }

    /// For every object, the workloads whose placement reaches it, by fixpoint: what an
    /// object passes on is its own workload identity if it is one, else what reaches it.
    fn sources(&self) -> Vec<BTreeSet<usize>> {
        let mut reaching = vec![BTreeSet::new(); OBJECTS];
        loop {
            let mut next = vec![BTreeSet::new(); OBJECTS];
            for (from, reached) in reaching.iter().enumerate() {
                let passed: BTreeSet<usize> = match self.own(from) {
                    Some(_) => BTreeSet::from([from]),
                    None => reached.clone(),
                };
                for to in self.refs(from) {
                    next[to].extend(passed.iter().copied());
                }
            }
            if next == reaching {
                return reaching;
            }
            reaching = next;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn clusters_are_the_union_over_dependents(history in proptest::collection::vec(step(), 1..30)) {
        let mut graph = DependencyGraph::new();
        let mut model = Model::default();
        for step in &history {
            match step {
                Step::Workload(o, d, c) => graph.set_workload(
                    generated(*o), d.iter().map(|&i| generated(i)).collect(), c.clone()),
                Step::References(o, d) => graph.set_references(
                    generated(*o), d.iter().map(|&i| generated(i)).collect()),
                Step::Remove(o) => graph.remove_workload(&generated(*o)),
            }
            model.apply(step);
        }
        let sources = model.sources();
        for (object, reaching) in sources.iter().enumerate() {
            let expected: BTreeSet<String> = reaching
                .iter()
                .flat_map(|&w| model.own(w).cloned().unwrap_or_default())
                .collect();
            prop_assert_eq!(graph.clusters_for(&generated(object)), expected, "object {}", object);
            let mut dependents: Vec<ObjectRef> = reaching.iter().map(|&w| generated(w)).collect();
            dependents.sort();
            prop_assert_eq!(graph.dependents(&generated(object)), dependents);
            let mut refs: Vec<ObjectRef> = model.refs(object).into_iter().map(generated).collect();
            refs.sort();
            prop_assert_eq!(graph.dependencies_of(&generated(object)), refs);
        }
        // Every cycle reported is one, and every object on a cycle is reported.
        let cycles = graph.cycles();
        let on_cycle = |o: usize| {
            let mut seen = BTreeSet::new();
            let mut stack: Vec<usize> = model.refs(o).into_iter().collect();
            while let Some(n) = stack.pop() {
                if n == o { return true; }
                if seen.insert(n) { stack.extend(model.refs(n)); }
            }
            false
        };
        let reported: BTreeSet<ObjectRef> = cycles.iter().flatten().cloned().collect();
        let expected: BTreeSet<ObjectRef> = (0..OBJECTS).filter(|&o| on_cycle(o)).map(generated).collect();
        prop_assert_eq!(reported, expected);
        // Removing every registration empties the graph.
        for object in 0..OBJECTS {
            graph.remove_workload(&generated(object));
        }
        prop_assert!(graph.is_empty());
        prop_assert!(graph.cycles().is_empty());
    }
}

#[test]
fn policies_propagate_dependencies_only_when_asked() {
    use crate::api::{ClusterPropagationPolicy, PropagationPolicy};
    let policy = |extra: Value| {
        let mut spec =
            json!({"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}]});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        spec
    };
    let namespaced: PropagationPolicy = serde_json::from_value(json!({
        "apiVersion": "federation.example.com/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": "web", "namespace": "shop"}, "spec": policy(json!({})),
    }))
    .unwrap();
    assert!(!namespaced.spec.propagate_deps);
    let cluster: ClusterPropagationPolicy = serde_json::from_value(json!({
        "apiVersion": "federation.example.com/v1alpha1", "kind": "ClusterPropagationPolicy",
        "metadata": {"name": "web"}, "spec": policy(json!({"propagateDeps": true})),
    }))
    .unwrap();
    assert!(cluster.spec.propagate_deps);
    assert_eq!(
        serde_json::to_value(&cluster.spec).unwrap()["propagateDeps"],
        json!(true)
    );
}
