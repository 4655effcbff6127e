//! `place` end to end: every filter, toleration, spread case, scheduling type and reason.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, Time,
};

use super::*;
use crate::api::member_cluster::{TAINT_NOT_READY, TAINT_UNREACHABLE};
use crate::api::propagation_policy::{
    ClusterAffinity, ClusterTarget, DynamicWeight, ReplicaScheduling, SpreadConstraint,
    WeightPreference,
};

const UID: &str = "6f1c9a52-0d8e-4d43-9d5e-3f6f9b1a2c7e";

fn now() -> jiff::Timestamp {
    "2026-11-30T07:00:00Z".parse().unwrap()
}

fn cluster(name: &str, zone: &str) -> ClusterView {
    ClusterView {
        name: name.into(),
        labels: BTreeMap::new(),
        zone: zone.into(),
        region: None,
        taints: vec![],
        ready: true,
        available_replicas: None,
        capacity: None,
    }
}

fn in_region(mut view: ClusterView, region: &str) -> ClusterView {
    view.region = Some(region.into());
    view
}

fn labelled(mut view: ClusterView, pairs: &[(&str, &str)]) -> ClusterView {
    view.labels = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    view
}

fn tainted(
    mut view: ClusterView,
    key: &str,
    effect: &str,
    added_seconds_ago: Option<i64>,
) -> ClusterView {
    view.taints.push(Taint {
        key: key.into(),
        value: None,
        effect: effect.into(),
        time_added: added_seconds_ago.map(|ago| Time(now() - jiff::SignedDuration::from_secs(ago))),
    });
    view
}

fn not_ready(mut view: ClusterView, seconds_ago: i64) -> ClusterView {
    view.ready = false;
    tainted(view, TAINT_UNREACHABLE, "NoExecute", Some(seconds_ago))
}

fn with_available(mut view: ClusterView, available: i64) -> ClusterView {
    view.available_replicas = Some(available);
    view
}

fn three() -> Vec<ClusterView> {
    vec![
        cluster("east", "zone-a"),
        cluster("north", "zone-c"),
        cluster("west", "zone-b"),
    ]
}

fn divided(preference: Option<DivisionPreference>, weights: Option<WeightPreference>) -> Placement {
    Placement {
        replica_scheduling: Some(ReplicaScheduling {
            type_: ReplicaSchedulingType::Divided,
            division_preference: preference,
            weight_preference: weights,
            min_per_cluster: 0,
        }),
        ..Placement::default()
    }
}

fn weighted(weights: &[(&str, i64)]) -> Placement {
    divided(
        None,
        Some(WeightPreference {
            static_weight_list: weights
                .iter()
                .map(|(name, weight)| StaticClusterWeight {
                    target_cluster: ClusterTarget {
                        cluster_names: vec![name.to_string()],
                        ..ClusterTarget::default()
                    },
                    weight: *weight,
                })
                .collect(),
            dynamic_weight: None,
        }),
    )
}

fn run(placement: &Placement, replicas: i32, clusters: &[ClusterView]) -> PlacementResult {
    run_with(placement, replicas, clusters, &[])
}

fn run_with(
    placement: &Placement,
    replicas: i32,
    clusters: &[ClusterView],
    current: &[TargetCluster],
) -> PlacementResult {
    run_kind(placement, replicas, clusters, current, false)
}

/// A divisible kind, stateless or stateful.
fn run_kind(
    placement: &Placement,
    replicas: i32,
    clusters: &[ClusterView],
    current: &[TargetCluster],
    stateful: bool,
) -> PlacementResult {
    place(&PlacementRequest {
        placement,
        replicas,
        divisible: true,
        stateful,
        uid: UID,
        clusters,
        current,
        now: now(),
        static_weights: None,
        first_seat: None,
    })
}

fn targets(result: &PlacementResult) -> Vec<(&str, i32)> {
    result
        .targets
        .iter()
        .map(|t| (t.name.as_str(), t.replicas))
        .collect()
}

fn reason<'a>(result: &'a PlacementResult, cluster: &str) -> &'a str {
    &result
        .decisions
        .iter()
        .find(|d| d.cluster == cluster)
        .unwrap_or_else(|| panic!("no decision for {cluster}"))
        .reason
}

fn current(pairs: &[(&str, i32)]) -> Vec<TargetCluster> {
    pairs
        .iter()
        .map(|(name, replicas)| TargetCluster {
            name: name.to_string(),
            replicas: *replicas,
        })
        .collect()
}

fn affinity(affinity: ClusterAffinity) -> Placement {
    Placement {
        cluster_affinity: Some(affinity),
        ..Placement::default()
    }
}

fn tolerate(mut placement: Placement, key: Option<&str>, seconds: Option<i64>) -> Placement {
    placement.cluster_tolerations.push(Toleration {
        key: key.map(Into::into),
        operator: Some("Exists".into()),
        toleration_seconds: seconds,
        ..Toleration::default()
    });
    placement
}

fn spread(
    mut placement: Placement,
    field: SpreadByField,
    min_groups: i32,
    max_groups: i32,
) -> Placement {
    placement.spread_constraints.push(SpreadConstraint {
        spread_by_field: field,
        min_groups,
        max_groups,
    });
    placement
}

// ---- Duplicated ----

#[test]
fn duplicated_is_the_default_and_gives_every_cluster_all_replicas() {
    let result = run(&Placement::default(), 3, &three());
    assert_eq!(result.scheduled, Ok(()));
    assert_eq!(targets(&result), [("east", 3), ("north", 3), ("west", 3)]);
    assert_eq!(reason(&result, "east"), "selected: duplicated, 3 replicas");
    assert!(
        result
            .decisions
            .iter()
            .all(|d| d.selected && d.replicas == Some(3))
    );
}

#[test]
fn kinds_without_replicas_are_duplicated_even_under_a_divided_policy() {
    let placement = weighted(&[("east", 2), ("west", 1)]);
    let result = place(&PlacementRequest {
        placement: &placement,
        replicas: 1,
        divisible: false,
        stateful: false,
        uid: UID,
        clusters: &three(),
        current: &[],
        now: now(),
        static_weights: None,
        first_seat: None,
    });
    assert_eq!(targets(&result), [("east", 1), ("north", 1), ("west", 1)]);
    assert_eq!(reason(&result, "north"), "selected: duplicated, 1 replica");
}

#[test]
fn outputs_are_sorted_by_name_whatever_the_input_order() {
    let mut clusters = three();
    clusters.reverse();
    let result = run(&Placement::default(), 1, &clusters);
    let names: Vec<&str> = result
        .decisions
        .iter()
        .map(|d| d.cluster.as_str())
        .collect();
    assert_eq!(names, ["east", "north", "west"]);
    assert_eq!(targets(&result), [("east", 1), ("north", 1), ("west", 1)]);
}

// ---- clusterAffinity ----

#[test]
fn cluster_names_narrow_the_candidates() {
    let result = run(
        &affinity(ClusterAffinity {
            cluster_names: vec!["east".into(), "west".into()],
            ..ClusterAffinity::default()
        }),
        2,
        &three(),
    );
    assert_eq!(targets(&result), [("east", 2), ("west", 2)]);
    assert_eq!(
        reason(&result, "north"),
        "not in clusterAffinity.clusterNames"
    );
    let north = result
        .decisions
        .iter()
        .find(|d| d.cluster == "north")
        .unwrap();
    assert!(!north.selected && north.replicas.is_none());
}

#[test]
fn exclude_removes_clusters() {
    let result = run(
        &affinity(ClusterAffinity {
            exclude: vec!["west".into()],
            ..ClusterAffinity::default()
        }),
        1,
        &three(),
    );
    assert_eq!(targets(&result), [("east", 1), ("north", 1)]);
    assert_eq!(
        reason(&result, "west"),
        "excluded by clusterAffinity.exclude"
    );
}

#[test]
fn exclude_beats_cluster_names() {
    let result = run(
        &affinity(ClusterAffinity {
            cluster_names: vec!["east".into(), "west".into()],
            exclude: vec!["east".into()],
            ..ClusterAffinity::default()
        }),
        1,
        &three(),
    );
    assert_eq!(targets(&result), [("west", 1)]);
    assert_eq!(
        reason(&result, "east"),
        "excluded by clusterAffinity.exclude"
    );
}

#[test]
fn label_selector_match_labels_and_expressions() {
    let clusters = vec![
        labelled(
            cluster("east", "zone-a"),
            &[("env", "prod"), ("tier", "gold")],
        ),
        labelled(cluster("north", "zone-c"), &[("env", "dev")]),
        labelled(
            cluster("west", "zone-b"),
            &[("env", "prod"), ("tier", "bronze")],
        ),
    ];
    let placement = affinity(ClusterAffinity {
        label_selector: Some(LabelSelector {
            match_labels: Some([("env".to_string(), "prod".to_string())].into()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "In".into(),
                values: Some(vec!["gold".into(), "silver".into()]),
            }]),
        }),
        ..ClusterAffinity::default()
    });
    let result = run(&placement, 1, &clusters);
    assert_eq!(targets(&result), [("east", 1)]);
    assert_eq!(
        reason(&result, "north"),
        "labels do not match clusterAffinity.labelSelector: env=prod"
    );
    assert_eq!(
        reason(&result, "west"),
        "labels do not match clusterAffinity.labelSelector: tier In (gold, silver)"
    );
}

#[test]
fn label_selector_exists_and_does_not_exist() {
    let clusters = vec![
        labelled(cluster("east", "zone-a"), &[("gpu", "a100")]),
        labelled(cluster("west", "zone-b"), &[("spot", "true")]),
    ];
    let requirement = |key: &str, operator: &str| LabelSelectorRequirement {
        key: key.into(),
        operator: operator.into(),
        values: None,
    };
    let placement = affinity(ClusterAffinity {
        label_selector: Some(LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![
                requirement("gpu", "Exists"),
                requirement("spot", "DoesNotExist"),
            ]),
        }),
        ..ClusterAffinity::default()
    });
    let result = run(&placement, 1, &clusters);
    assert_eq!(targets(&result), [("east", 1)]);
    assert_eq!(
        reason(&result, "west"),
        "labels do not match clusterAffinity.labelSelector: gpu Exists"
    );
    let not_in = affinity(ClusterAffinity {
        label_selector: Some(LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "gpu".into(),
                operator: "NotIn".into(),
                values: Some(vec!["a100".into()]),
            }]),
        }),
        ..ClusterAffinity::default()
    });
    let result = run(&not_in, 1, &clusters);
    assert_eq!(
        targets(&result),
        [("west", 1)],
        "NotIn matches a cluster without the label"
    );
    assert_eq!(
        reason(&result, "east"),
        "labels do not match clusterAffinity.labelSelector: gpu NotIn (a100)"
    );
}

#[test]
fn zones_narrow_the_candidates() {
    let result = run(
        &affinity(ClusterAffinity {
            zones: vec!["zone-a".into(), "zone-b".into()],
            ..ClusterAffinity::default()
        }),
        1,
        &three(),
    );
    assert_eq!(targets(&result), [("east", 1), ("west", 1)]);
    assert_eq!(
        reason(&result, "north"),
        "zone zone-c not in clusterAffinity.zones"
    );
}

#[test]
fn regions_narrow_the_candidates_and_need_a_region() {
    let clusters = vec![
        in_region(cluster("east", "zone-a"), "us-east"),
        cluster("north", "zone-c"),
        in_region(cluster("west", "zone-b"), "us-west"),
    ];
    let result = run(
        &affinity(ClusterAffinity {
            regions: vec!["us-east".into()],
            ..ClusterAffinity::default()
        }),
        1,
        &clusters,
    );
    assert_eq!(targets(&result), [("east", 1)]);
    assert_eq!(
        reason(&result, "west"),
        "region us-west not in clusterAffinity.regions"
    );
    assert_eq!(
        reason(&result, "north"),
        "no region set, and clusterAffinity.regions requires one"
    );
}

#[test]
fn no_candidates_is_unschedulable_with_every_reason_kept() {
    let result = run(
        &affinity(ClusterAffinity {
            cluster_names: vec!["south".into()],
            ..ClusterAffinity::default()
        }),
        1,
        &three(),
    );
    assert_eq!(
        result.scheduled,
        Err("no candidate cluster: all 3 member clusters are filtered out".into())
    );
    assert!(result.targets.is_empty());
    assert_eq!(result.decisions.len(), 3);
    assert!(
        result
            .decisions
            .iter()
            .all(|d| d.reason == "not in clusterAffinity.clusterNames")
    );
}

#[test]
fn no_clusters_at_all() {
    let result = run(&Placement::default(), 1, &[]);
    assert_eq!(result.scheduled, Err("no member clusters are known".into()));
    assert!(result.decisions.is_empty() && result.targets.is_empty());
}

// ---- readiness, taints and tolerations ----

#[test]
fn a_not_ready_cluster_without_taints_is_excluded() {
    let mut clusters = three();
    clusters[1].ready = false;
    let result = run(&Placement::default(), 1, &clusters);
    assert_eq!(targets(&result), [("east", 1), ("west", 1)]);
    assert_eq!(reason(&result, "north"), "not Ready");
}

#[test]
fn the_hub_taint_is_not_tolerated_by_default() {
    let mut clusters = three();
    clusters[1] = not_ready(clusters[1].clone(), 5);
    let result = run(&Placement::default(), 1, &clusters);
    assert_eq!(targets(&result), [("east", 1), ("west", 1)]);
    assert_eq!(
        reason(&result, "north"),
        "taint federation.example.com/unreachable:NoExecute not tolerated"
    );
}

#[test]
fn no_schedule_and_no_execute_exclude_prefer_no_schedule_does_not() {
    let clusters = vec![
        tainted(cluster("east", "zone-a"), "dedicated", "NoSchedule", None),
        tainted(
            cluster("north", "zone-c"),
            "maintenance",
            "NoExecute",
            Some(1),
        ),
        tainted(
            cluster("west", "zone-b"),
            "expensive",
            "PreferNoSchedule",
            None,
        ),
    ];
    let result = run(&Placement::default(), 1, &clusters);
    assert_eq!(targets(&result), [("west", 1)]);
    assert_eq!(
        reason(&result, "east"),
        "taint dedicated:NoSchedule not tolerated"
    );
    assert_eq!(
        reason(&result, "north"),
        "taint maintenance:NoExecute not tolerated"
    );

    let tolerant = tolerate(Placement::default(), Some("dedicated"), None);
    let result = run(&tolerant, 1, &clusters);
    assert_eq!(targets(&result), [("east", 1), ("west", 1)]);
}

#[test]
fn tainted_values_show_in_the_reason() {
    let mut view = cluster("east", "zone-a");
    view.taints.push(Taint {
        key: "dedicated".into(),
        value: Some("db".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    });
    let result = run(&Placement::default(), 1, &[view]);
    assert_eq!(
        reason(&result, "east"),
        "taint dedicated=db:NoSchedule not tolerated"
    );
}

#[test]
fn an_empty_key_exists_toleration_tolerates_everything() {
    let clusters = vec![
        tainted(cluster("east", "zone-a"), "dedicated", "NoSchedule", None),
        tainted(cluster("west", "zone-b"), "maintenance", "NoExecute", None),
    ];
    let result = run(&tolerate(Placement::default(), None, None), 1, &clusters);
    assert_eq!(targets(&result), [("east", 1), ("west", 1)]);
}

#[test]
fn toleration_seconds_keep_a_tainted_cluster_until_they_run_out() {
    let clusters = vec![
        tainted(
            cluster("east", "zone-a"),
            "maintenance",
            "NoExecute",
            Some(30),
        ),
        tainted(
            cluster("west", "zone-b"),
            "maintenance",
            "NoExecute",
            Some(90),
        ),
    ];
    let placement = tolerate(Placement::default(), Some("maintenance"), Some(60));
    let result = run(&placement, 1, &clusters);
    assert_eq!(targets(&result), [("east", 1)]);
    assert_eq!(
        reason(&result, "west"),
        "toleration for maintenance:NoExecute expired 30s ago"
    );
}

#[test]
fn a_taint_without_time_added_counts_as_just_added() {
    let clusters = vec![tainted(
        cluster("east", "zone-a"),
        "maintenance",
        "NoExecute",
        None,
    )];
    let result = run(
        &tolerate(Placement::default(), Some("maintenance"), Some(60)),
        1,
        &clusters,
    );
    assert_eq!(targets(&result), [("east", 1)]);
    let result = run(
        &tolerate(Placement::default(), Some("maintenance"), Some(0)),
        1,
        &clusters,
    );
    assert_eq!(
        reason(&result, "east"),
        "toleration for maintenance:NoExecute expired 0s ago"
    );
}

#[test]
fn a_not_ready_cluster_keeps_its_replicas_while_the_hub_taint_is_tolerated() {
    let mut clusters = three();
    clusters[1] = not_ready(clusters[1].clone(), 20);
    let placement = tolerate(
        weighted(&[("east", 1), ("north", 1), ("west", 1)]),
        Some(TAINT_UNREACHABLE),
        Some(60),
    );
    let holding = current(&[("east", 1), ("north", 1), ("west", 1)]);
    let result = run_with(&placement, 3, &clusters, &holding);
    assert_eq!(targets(&result), [("east", 1), ("north", 1), ("west", 1)]);
    assert_eq!(
        reason(&result, "north"),
        "selected: weight 1, 1 of 3 replicas; not Ready, its replicas stay while its taints are tolerated (40s left) (keeps at most the 1 it holds)"
    );

    // Nothing new goes to it.
    let result = run_with(
        &placement,
        3,
        &clusters,
        &current(&[("east", 2), ("west", 1)]),
    );
    assert_eq!(targets(&result), [("east", 2), ("west", 1)]);
    assert_eq!(
        reason(&result, "north"),
        "not Ready: its taints are tolerated, but only replicas already there may stay"
    );

    // Once the toleration runs out, the replicas move.
    let mut late = clusters.clone();
    late[1] = not_ready(cluster("north", "zone-c"), 75);
    let result = run_with(&placement, 3, &late, &holding);
    assert_eq!(targets(&result).iter().map(|t| t.1).sum::<i32>(), 3);
    assert!(!targets(&result).iter().any(|t| t.0 == "north"));
    assert_eq!(
        reason(&result, "north"),
        "toleration for federation.example.com/unreachable:NoExecute expired 15s ago"
    );
}

#[test]
fn a_not_ready_cluster_with_an_untolerated_taint_names_the_taint() {
    let mut view = cluster("east", "zone-a");
    view.ready = false;
    let view = tainted(view, TAINT_NOT_READY, "NoExecute", Some(3));
    let result = run(
        &tolerate(Placement::default(), Some(TAINT_UNREACHABLE), None),
        1,
        &[view],
    );
    assert_eq!(
        reason(&result, "east"),
        "taint federation.example.com/not-ready:NoExecute not tolerated"
    );
}

// ---- Divided / Weighted ----

#[test]
fn weighted_two_to_one() {
    let clusters = vec![cluster("east", "zone-a"), cluster("west", "zone-b")];
    let result = run(&weighted(&[("east", 2), ("west", 1)]), 6, &clusters);
    assert_eq!(result.scheduled, Ok(()));
    assert_eq!(targets(&result), [("east", 4), ("west", 2)]);
    assert_eq!(
        reason(&result, "east"),
        "selected: weight 2, 4 of 6 replicas"
    );
    assert_eq!(
        reason(&result, "west"),
        "selected: weight 1, 2 of 6 replicas"
    );
    assert_eq!(result.decisions[0].replicas, Some(4));
}

#[test]
fn weighted_without_a_list_weighs_every_candidate_one() {
    let result = run(&divided(None, None), 7, &three());
    let shares: Vec<i32> = targets(&result).iter().map(|t| t.1).collect();
    assert_eq!(shares.iter().sum::<i32>(), 7);
    assert!(shares.iter().all(|&s| s == 2 || s == 3));
    assert!(reason(&result, "east").starts_with("selected: weight 1, "));
}

#[test]
fn clusters_no_entry_matches_weigh_zero() {
    let result = run(&weighted(&[("east", 2), ("west", 1)]), 6, &three());
    assert_eq!(targets(&result), [("east", 4), ("west", 2)]);
    assert_eq!(
        reason(&result, "north"),
        "weight 0: no staticWeightList entry matches"
    );
    let zero = run(
        &weighted(&[("east", 2), ("north", 0), ("west", 1)]),
        6,
        &three(),
    );
    assert_eq!(
        reason(&zero, "north"),
        "weight 0: the staticWeightList entry says 0"
    );
}

#[test]
fn the_first_matching_entry_wins_and_entries_match_labels_and_zones() {
    let clusters = vec![
        labelled(cluster("east", "zone-a"), &[("tier", "gold")]),
        labelled(cluster("north", "zone-c"), &[("tier", "gold")]),
        cluster("west", "zone-b"),
    ];
    let entry = |target: ClusterTarget, weight| StaticClusterWeight {
        target_cluster: target,
        weight,
    };
    let placement = divided(
        Some(DivisionPreference::Weighted),
        Some(WeightPreference {
            static_weight_list: vec![
                entry(
                    ClusterTarget {
                        zones: vec!["zone-c".into()],
                        ..ClusterTarget::default()
                    },
                    1,
                ),
                entry(
                    ClusterTarget {
                        label_selector: Some(LabelSelector {
                            match_labels: Some([("tier".to_string(), "gold".to_string())].into()),
                            match_expressions: None,
                        }),
                        ..ClusterTarget::default()
                    },
                    3,
                ),
                entry(ClusterTarget::default(), 2),
            ],
            dynamic_weight: None,
        }),
    );
    let result = run(&placement, 12, &clusters);
    // Weights: east 3 (labels), north 1 (zone entry first), west 2 (catch-all).
    assert_eq!(targets(&result), [("east", 6), ("north", 2), ("west", 4)]);
}

#[test]
fn a_target_needs_every_non_empty_field_to_match() {
    let clusters = vec![cluster("east", "zone-a"), cluster("west", "zone-b")];
    let placement = divided(
        None,
        Some(WeightPreference {
            static_weight_list: vec![StaticClusterWeight {
                target_cluster: ClusterTarget {
                    cluster_names: vec!["east".into(), "west".into()],
                    zones: vec!["zone-b".into()],
                    ..ClusterTarget::default()
                },
                weight: 1,
            }],
            dynamic_weight: None,
        }),
    );
    let result = run(&placement, 2, &clusters);
    assert_eq!(targets(&result), [("west", 2)]);
}

#[test]
fn zero_replica_members_are_not_selected_and_say_why() {
    let result = run(&divided(None, None), 2, &three());
    assert_eq!(result.targets.len(), 2);
    let unseated: Vec<&ClusterDecision> = result.decisions.iter().filter(|d| !d.selected).collect();
    assert_eq!(unseated.len(), 1);
    assert_eq!(
        unseated[0].reason,
        "weight 1 but 2 replicas divided over 3 clusters by Webster; no seat"
    );
    assert_eq!(unseated[0].replicas, None);
}

#[test]
fn weighted_ties_follow_the_stable_hash_of_uid_and_name() {
    let result = run(&divided(None, None), 2, &three());
    let mut expected: Vec<&str> = vec!["east", "north", "west"];
    expected.sort_by_key(|name| stable_hash(UID, name));
    let mut chosen: Vec<&str> = result.targets.iter().map(|t| t.name.as_str()).collect();
    chosen.sort_by_key(|name| stable_hash(UID, name));
    assert_eq!(chosen, expected[..2]);
}

#[test]
fn all_weights_zero_is_unschedulable() {
    let result = run(&weighted(&[("south", 1)]), 3, &three());
    assert_eq!(
        result.scheduled,
        Err("no candidate cluster has a positive weight".into())
    );
    assert!(result.targets.is_empty());
    assert_eq!(
        reason(&result, "east"),
        "candidate, but not scheduled: no candidate cluster has a positive weight"
    );
}

#[test]
fn scaled_to_zero_keeps_every_candidate_with_zero_replicas() {
    let result = run(
        &weighted(&[("east", 2), ("north", 1), ("west", 1)]),
        0,
        &three(),
    );
    assert_eq!(result.scheduled, Ok(()));
    assert_eq!(targets(&result), [("east", 0), ("north", 0), ("west", 0)]);
    assert_eq!(
        reason(&result, "west"),
        "selected: 0 replicas (the template has 0 replicas)"
    );
}

#[test]
fn failover_redivides_over_the_survivors() {
    let placement = weighted(&[("east", 2), ("north", 1), ("west", 1)]);
    let before = run(&placement, 8, &three());
    assert_eq!(targets(&before), [("east", 4), ("north", 2), ("west", 2)]);
    let mut clusters = three();
    clusters[0] = not_ready(clusters[0].clone(), 1);
    let after = run_with(&placement, 8, &clusters, &before.targets);
    assert_eq!(targets(&after), [("north", 4), ("west", 4)]);
}

// ---- dynamic weights ----

fn dynamic(static_list: Vec<StaticClusterWeight>) -> Placement {
    divided(
        None,
        Some(WeightPreference {
            static_weight_list: static_list,
            dynamic_weight: Some(DynamicWeight::AvailableReplicas),
        }),
    )
}

#[test]
fn dynamic_weights_use_available_replicas() {
    let clusters = vec![
        with_available(cluster("east", "zone-a"), 30),
        with_available(cluster("north", "zone-c"), 0),
        with_available(cluster("west", "zone-b"), 10),
    ];
    let result = run(&dynamic(vec![]), 8, &clusters);
    assert_eq!(targets(&result), [("east", 6), ("west", 2)]);
    assert_eq!(
        reason(&result, "east"),
        "selected: weight 30 (available replicas), 6 of 8 replicas"
    );
    assert_eq!(reason(&result, "north"), "weight 0: no available replicas");
}

#[test]
fn unknown_available_replicas_fall_back_to_the_static_weight_and_say_so() {
    let clusters = vec![
        with_available(cluster("east", "zone-a"), 3),
        cluster("west", "zone-b"),
    ];
    let result = run(&dynamic(vec![]), 4, &clusters);
    assert_eq!(targets(&result), [("east", 3), ("west", 1)]);
    assert_eq!(
        reason(&result, "west"),
        "selected: weight 1 (available replicas unknown, static weight used), 1 of 4 replicas"
    );
    let list = vec![StaticClusterWeight {
        target_cluster: ClusterTarget {
            cluster_names: vec!["east".into()],
            ..ClusterTarget::default()
        },
        weight: 5,
    }];
    let result = run(&dynamic(list), 4, &clusters);
    assert_eq!(
        reason(&result, "west"),
        "weight 0: available replicas unknown and no staticWeightList entry matches"
    );
}

// ---- Divided / Aggregated ----

fn aggregated() -> Placement {
    divided(Some(DivisionPreference::Aggregated), None)
}

#[test]
fn aggregated_fills_the_roomiest_cluster_first() {
    let clusters = vec![
        with_available(cluster("east", "zone-a"), 4),
        with_available(cluster("north", "zone-c"), 10),
        with_available(cluster("west", "zone-b"), 2),
    ];
    let result = run(&aggregated(), 6, &clusters);
    assert_eq!(targets(&result), [("north", 6)]);
    assert_eq!(
        reason(&result, "north"),
        "selected: aggregated, 6 of 6 replicas"
    );
    assert_eq!(
        reason(&result, "east"),
        "not needed: aggregated placement fits 6 replicas in 1 cluster"
    );
    let result = run(&aggregated(), 13, &clusters);
    assert_eq!(targets(&result), [("east", 3), ("north", 10)]);
}

#[test]
fn aggregated_prefers_clusters_that_hold_replicas() {
    let clusters = vec![
        with_available(cluster("east", "zone-a"), 1),
        with_available(cluster("north", "zone-c"), 10),
        cluster("west", "zone-b"),
    ];
    // east holds 3 and has room for 1 more: 3 + 1 = 4 fit there.
    let result = run_with(&aggregated(), 4, &clusters, &current(&[("east", 3)]));
    assert_eq!(targets(&result), [("east", 4)]);
    assert_eq!(
        reason(&result, "east"),
        "selected: aggregated, 4 of 4 replicas (already holds replicas)"
    );
    // Unknown room counts as unlimited, ahead of known room; then the name.
    let result = run(&aggregated(), 50, &clusters);
    assert_eq!(targets(&result), [("west", 50)]);
}

#[test]
fn aggregated_without_enough_room_is_unschedulable() {
    let clusters = vec![
        with_available(cluster("east", "zone-a"), 2),
        with_available(cluster("west", "zone-b"), 3),
    ];
    let result = run(&aggregated(), 7, &clusters);
    assert_eq!(
        result.scheduled,
        Err("not enough room: 7 replicas to place, the candidates can take 5".into())
    );
    assert!(result.targets.is_empty());
}

#[test]
fn aggregated_meets_min_groups_with_one_replica_per_needed_group() {
    let clusters = vec![
        with_available(cluster("east", "zone-a"), 10),
        with_available(cluster("east-2", "zone-a"), 9),
        with_available(cluster("west", "zone-b"), 5),
    ];
    let placement = spread(aggregated(), SpreadByField::Zone, 2, 0);
    let result = run(&placement, 6, &clusters);
    assert_eq!(targets(&result), [("east", 5), ("west", 1)]);
}

// ---- spread constraints ----

#[test]
fn min_groups_unmet_is_unschedulable_with_the_reason() {
    let clusters = vec![cluster("east", "zone-a"), cluster("east-2", "zone-a")];
    let placement = spread(Placement::default(), SpreadByField::Zone, 2, 0);
    let result = run(&placement, 1, &clusters);
    assert_eq!(
        result.scheduled,
        Err("spread constraint zone: need at least 2 zones, 1 available (zone-a)".into())
    );
    assert!(result.targets.is_empty());
    assert_eq!(
        reason(&result, "east"),
        "candidate, but not scheduled: spread constraint zone: need at least 2 zones, 1 available (zone-a)"
    );
}

#[test]
fn max_groups_keeps_the_heaviest_groups() {
    let clusters = vec![
        cluster("a1", "zone-a"),
        cluster("b1", "zone-b"),
        cluster("b2", "zone-b"),
        cluster("c1", "zone-c"),
    ];
    // Duplicated: weight 1 each, so zone-b (2 clusters) first, then zone-a by name.
    let placement = spread(Placement::default(), SpreadByField::Zone, 1, 2);
    let result = run(&placement, 1, &clusters);
    assert_eq!(targets(&result), [("a1", 1), ("b1", 1), ("b2", 1)]);
    assert_eq!(
        reason(&result, "c1"),
        "spread: zone zone-c not chosen (maxGroups 2)"
    );

    // Weighted: the heavier zone wins over the one with more clusters.
    let weights = weighted(&[("a1", 1), ("b1", 1), ("b2", 1), ("c1", 5)]);
    let result = run(&spread(weights, SpreadByField::Zone, 1, 1), 4, &clusters);
    assert_eq!(targets(&result), [("c1", 4)]);
    assert_eq!(
        reason(&result, "b1"),
        "spread: zone zone-b not chosen (maxGroups 1)"
    );
}

#[test]
fn max_groups_zero_is_unlimited() {
    let placement = spread(Placement::default(), SpreadByField::Zone, 3, 0);
    let result = run(&placement, 1, &three());
    assert_eq!(result.targets.len(), 3);
}

#[test]
fn spread_by_region_needs_a_region() {
    let clusters = vec![
        in_region(cluster("east", "zone-a"), "us-east"),
        in_region(cluster("west", "zone-b"), "us-west"),
        cluster("north", "zone-c"),
    ];
    let placement = spread(Placement::default(), SpreadByField::Region, 2, 0);
    let result = run(&placement, 1, &clusters);
    assert_eq!(targets(&result), [("east", 1), ("west", 1)]);
    assert_eq!(
        reason(&result, "north"),
        "spread: no region set, cannot count it for spreadByField region"
    );
    let three_regions = spread(Placement::default(), SpreadByField::Region, 3, 0);
    assert_eq!(
        run(&three_regions, 1, &clusters).scheduled,
        Err(
            "spread constraint region: need at least 3 regions, 2 available (us-east, us-west)"
                .into()
        )
    );
}

#[test]
fn spread_by_cluster_limits_the_cluster_count() {
    let placement = spread(
        weighted(&[("east", 3), ("north", 1), ("west", 2)]),
        SpreadByField::Cluster,
        1,
        2,
    );
    let result = run(&placement, 5, &three());
    assert_eq!(targets(&result), [("east", 3), ("west", 2)]);
    assert_eq!(
        reason(&result, "north"),
        "spread: cluster north not chosen (maxGroups 2)"
    );
}

#[test]
fn coarse_constraints_apply_first() {
    let clusters = vec![
        in_region(cluster("e1", "zone-a"), "east"),
        in_region(cluster("e2", "zone-b"), "east"),
        in_region(cluster("w1", "zone-c"), "west"),
    ];
    // Region first picks east (more clusters), then zone minGroups 2 holds within it.
    let placement = spread(
        spread(Placement::default(), SpreadByField::Zone, 2, 0),
        SpreadByField::Region,
        1,
        1,
    );
    let result = run(&placement, 1, &clusters);
    assert_eq!(targets(&result), [("e1", 1), ("e2", 1)]);
    assert_eq!(
        reason(&result, "w1"),
        "spread: region west not chosen (maxGroups 1)"
    );
}

#[test]
fn too_few_replicas_to_reach_min_groups_is_unschedulable() {
    let placement = spread(divided(None, None), SpreadByField::Zone, 2, 0);
    let result = run(&placement, 1, &three());
    let message = result.scheduled.unwrap_err();
    assert!(
        message.starts_with(
            "spread constraint zone: need at least 2 zones, but 1 replica reach only 1 ("
        ),
        "{message}"
    );
}

// ---- determinism ----

#[test]
fn the_same_request_gives_the_same_result() {
    let clusters: Vec<ClusterView> = (0..20)
        .map(|i| {
            with_available(
                cluster(&format!("member-{i:02}"), &format!("zone-{}", i % 4)),
                i * 7 % 13,
            )
        })
        .collect();
    let placement = spread(dynamic(vec![]), SpreadByField::Zone, 2, 3);
    let first = run(&placement, 17, &clusters);
    for _ in 0..5 {
        assert_eq!(run(&placement, 17, &clusters), first);
    }
    assert_eq!(first.decisions.len(), 20);
    assert_eq!(first.targets.iter().map(|t| t.replicas).sum::<i32>(), 17);
}

// ---- the example in docs/placement.md ----

#[test]
fn the_documented_example_table() {
    let clusters = vec![
        cluster("east", "zone-a"),
        not_ready(cluster("north", "zone-c"), 10),
        cluster("south", "zone-d"),
        cluster("west", "zone-b"),
    ];
    let mut placement = weighted(&[("east", 2), ("west", 1), ("north", 1)]);
    placement.cluster_affinity = Some(ClusterAffinity {
        zones: vec!["zone-a".into(), "zone-b".into(), "zone-c".into()],
        ..ClusterAffinity::default()
    });
    let result = run(&placement, 6, &clusters);
    let rows: Vec<(&str, bool, Option<i32>, &str)> = result
        .decisions
        .iter()
        .map(|d| {
            (
                d.cluster.as_str(),
                d.selected,
                d.replicas,
                d.reason.as_str(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("east", true, Some(4), "selected: weight 2, 4 of 6 replicas"),
            (
                "north",
                false,
                None,
                "taint federation.example.com/unreachable:NoExecute not tolerated"
            ),
            (
                "south",
                false,
                None,
                "zone zone-d not in clusterAffinity.zones"
            ),
            ("west", true, Some(2), "selected: weight 1, 2 of 6 replicas"),
        ]
    );
}

// ---- decide: the lazy form ----

#[test]
fn decide_then_render_equals_place() {
    let placement = weighted(&[("east", 2), ("west", 1)]);
    let clusters = three();
    let request = PlacementRequest {
        placement: &placement,
        replicas: 6,
        divisible: true,
        stateful: false,
        uid: UID,
        clusters: &clusters,
        current: &[],
        now: now(),
        static_weights: None,
        first_seat: None,
    };
    let decision = decide(&request);
    let result = place(&request);
    assert_eq!(decision.scheduled(), Ok(()));
    assert_eq!(decision.targets(), result.targets);
    assert_eq!(decision.decisions(), result.decisions);
    assert_eq!(decision.into_result(), result);
}

#[test]
fn has_targets_tells_whether_a_write_is_needed() {
    let placement = weighted(&[("east", 2), ("west", 1)]);
    let clusters = three();
    let request = PlacementRequest {
        placement: &placement,
        replicas: 6,
        divisible: true,
        stateful: false,
        uid: UID,
        clusters: &clusters,
        current: &[],
        now: now(),
        static_weights: None,
        first_seat: None,
    };
    let decision = decide(&request);
    assert!(decision.has_targets(&current(&[("east", 4), ("west", 2)])));
    assert!(decision.has_targets(&current(&[("west", 2), ("east", 4)])));
    assert!(!decision.has_targets(&current(&[("east", 3), ("west", 3)])));
    assert!(!decision.has_targets(&current(&[("east", 4)])));
    assert!(!decision.has_targets(&current(&[("east", 4), ("north", 0), ("west", 2)])));
    assert!(!decision.has_targets(&[]));
}

#[test]
fn scaled_to_zero_leaves_weight_zero_clusters_out() {
    let result = run(&weighted(&[("east", 2), ("west", 1)]), 0, &three());
    assert_eq!(targets(&result), [("east", 0), ("west", 0)]);
    assert_eq!(
        reason(&result, "north"),
        "weight 0: no staticWeightList entry matches"
    );
}

fn run_stateful(
    placement: &Placement,
    replicas: i32,
    clusters: &[ClusterView],
    current: &[TargetCluster],
) -> PlacementResult {
    run_kind(placement, replicas, clusters, current, true)
}

#[test]
fn a_not_ready_cluster_never_gains_replicas_and_the_increase_goes_to_ready_ones() {
    // The third scenario: 1 + 1, east cut off, scaled to 4.
    let clusters = vec![
        not_ready(cluster("east", "zone-a"), 20),
        cluster("west", "zone-b"),
    ];
    let placement = tolerate(
        weighted(&[("east", 1), ("west", 1)]),
        Some(TAINT_UNREACHABLE),
        None,
    );
    let holding = current(&[("east", 1), ("west", 1)]);
    let result = run_stateful(&placement, 4, &clusters, &holding);
    assert_eq!(targets(&result), [("east", 1), ("west", 3)]);
    assert!(result.scheduled.is_ok());
    assert!(
        reason(&result, "east").contains("keeps at most the 1 it holds"),
        "{}",
        reason(&result, "east")
    );
    // Scaling down may shrink it in the decision (propagation holds the copy).
    let result = run_stateful(&placement, 1, &clusters, &holding);
    assert_eq!(targets(&result).iter().map(|t| t.1).sum::<i32>(), 1);
}

#[test]
fn when_no_ready_candidate_can_take_an_increase_it_waits_and_says_why() {
    let clusters = vec![
        not_ready(cluster("east", "zone-a"), 20),
        not_ready(cluster("west", "zone-b"), 20),
    ];
    let placement = tolerate(
        weighted(&[("east", 1), ("west", 1)]),
        Some(TAINT_UNREACHABLE),
        None,
    );
    let holding = current(&[("east", 1), ("west", 1)]);
    let result = run_stateful(&placement, 4, &clusters, &holding);
    let error = result.scheduled.unwrap_err();
    assert!(
        error.contains("2 more replicas cannot be placed"),
        "{error}"
    );
    assert!(error.contains("east, west"), "{error}");
    assert!(
        result.targets.is_empty(),
        "the scheduler keeps the current targets"
    );
}

#[test]
fn caps_hold_for_duplicated_and_aggregated_too() {
    let clusters = vec![
        not_ready(cluster("east", "zone-a"), 20),
        cluster("west", "zone-b"),
    ];
    let holding = current(&[("east", 2), ("west", 2)]);
    let duplicated = tolerate(Placement::default(), Some(TAINT_UNREACHABLE), None);
    let result = run_stateful(&duplicated, 5, &clusters, &holding);
    assert_eq!(targets(&result), [("east", 2), ("west", 5)]);

    let aggregated = tolerate(
        divided(Some(DivisionPreference::Aggregated), None),
        Some(TAINT_UNREACHABLE),
        None,
    );
    let holding = current(&[("east", 3)]);
    let result = run_stateful(&aggregated, 5, &clusters, &holding);
    assert_eq!(targets(&result), [("east", 3), ("west", 2)]);
}

#[test]
fn no_schedule_keeps_existing_placements_and_blocks_new_ones() {
    let clusters = vec![
        tainted(cluster("east", "zone-a"), "maintenance", "NoSchedule", None),
        cluster("west", "zone-b"),
    ];
    let placement = weighted(&[("east", 1), ("west", 1)]);
    // Not placed yet: excluded.
    let result = run(&placement, 2, &clusters);
    assert_eq!(targets(&result), [("west", 2)]);
    // Already there: it stays, with no more than it holds, stateless or stateful.
    for stateful in [false, true] {
        let holding = current(&[("east", 1), ("west", 1)]);
        let result = run_kind(&placement, 4, &clusters, &holding, stateful);
        assert_eq!(
            targets(&result),
            [("east", 1), ("west", 3)],
            "stateful {stateful}"
        );
        assert!(
            reason(&result, "east")
                .contains("maintenance:NoSchedule not tolerated: its replicas stay, no new ones"),
            "{}",
            reason(&result, "east")
        );
    }
}

#[test]
fn no_execute_evicts_stateless_placements_and_never_stateful_ones() {
    let clusters = vec![
        tainted(cluster("east", "zone-a"), "maintenance", "NoExecute", None),
        cluster("west", "zone-b"),
    ];
    let placement = weighted(&[("east", 1), ("west", 1)]);
    let holding = current(&[("east", 1), ("west", 1)]);
    let stateless = run_with(&placement, 2, &clusters, &holding);
    assert_eq!(targets(&stateless), [("west", 2)], "evicted");
    let stateful = run_stateful(&placement, 2, &clusters, &holding);
    assert_eq!(targets(&stateful), [("east", 1), ("west", 1)], "kept");
    assert!(
        reason(&stateful, "east").contains("stateful replicas are never evicted"),
        "{}",
        reason(&stateful, "east")
    );
    // Not placed yet: a stateful template does not go there either.
    let fresh = run_stateful(&placement, 2, &clusters, &[]);
    assert_eq!(targets(&fresh), [("west", 2)]);
}

// ---- minPerCluster ----

fn with_minimum(mut placement: Placement, minimum: i32) -> Placement {
    placement
        .replica_scheduling
        .as_mut()
        .expect("a Divided placement")
        .min_per_cluster = minimum;
    placement
}

#[test]
fn min_per_cluster_gives_every_selected_cluster_the_minimum_first() {
    // Without a minimum, 3:1:1 of 5 is 3/1/1; with minPerCluster 2 and 7 replicas every
    // cluster has 2 and the last replica goes by weight.
    let placement = weighted(&[("east", 3), ("north", 1), ("west", 1)]);
    let result = run(&with_minimum(placement, 2), 7, &three());
    assert_eq!(result.scheduled, Ok(()));
    assert_eq!(result.notice, None);
    assert_eq!(targets(&result), [("east", 3), ("north", 2), ("west", 2)]);
    assert_eq!(
        reason(&result, "north"),
        "selected: weight 1, 2 of 7 replicas"
    );
}

#[test]
fn min_per_cluster_with_too_few_replicas_says_so_and_fills_by_weight() {
    let placement = with_minimum(weighted(&[("east", 3), ("north", 1), ("west", 2)]), 2);
    let result = run(&placement, 5, &three());
    assert_eq!(result.scheduled, Ok(()));
    // east (3) and west (2) get the minimum, north the one replica left.
    assert_eq!(targets(&result), [("east", 2), ("north", 1), ("west", 2)]);
    assert_eq!(
        result.notice.as_deref(),
        Some(
            "replicaScheduling.minPerCluster 2 needs 6 replicas for the 3 selected clusters, but spec.replicas is 5: 2 clusters got 2 each (largest weight first) and 1 got the remaining 1 replica; to meet it, raise spec.replicas to 6, lower minPerCluster to 1, or limit the clusters to 2 (spreadConstraints: spreadByField cluster, maxGroups 2)"
        )
    );
    assert_eq!(
        reason(&result, "north"),
        "selected: weight 1, 1 of 5 replicas (below minPerCluster 2: not enough replicas for every cluster)"
    );
    assert_eq!(
        reason(&result, "east"),
        "selected: weight 3, 2 of 5 replicas"
    );

    let result = run(&placement, 3, &three());
    assert_eq!(targets(&result), [("east", 2), ("west", 1)]);
    assert_eq!(
        reason(&result, "north"),
        "weight 1 but minPerCluster 2 with 3 replicas reaches only 2 of 3 clusters; no replicas"
    );
}

#[test]
fn min_per_cluster_ignores_weight_zero_clusters_and_respects_kept_clusters() {
    // north has no entry: weight 0, not selected, no minimum for it.
    let placement = with_minimum(weighted(&[("east", 1), ("west", 1)]), 3);
    let result = run(&placement, 6, &three());
    assert_eq!(targets(&result), [("east", 3), ("west", 3)]);
    assert_eq!(result.notice, None);

    // A not-Ready cluster holding 1 keeps at most that 1, minimum or not.
    let clusters = vec![
        not_ready(cluster("east", "zone-a"), 20),
        cluster("west", "zone-b"),
    ];
    let placement = tolerate(
        with_minimum(weighted(&[("east", 1), ("west", 1)]), 3),
        Some(TAINT_UNREACHABLE),
        None,
    );
    let holding = current(&[("east", 1), ("west", 3)]);
    let result = run_stateful(&placement, 6, &clusters, &holding);
    assert_eq!(targets(&result), [("east", 1), ("west", 5)]);
}

#[test]
fn min_per_cluster_under_aggregated_tops_every_candidate_up_first() {
    let clusters = vec![
        with_available(cluster("east", "zone-a"), 4),
        with_available(cluster("north", "zone-c"), 10),
        with_available(cluster("west", "zone-b"), 2),
    ];
    let placement = with_minimum(aggregated(), 2);
    let result = run(&placement, 9, &clusters);
    // 2 each, then the rest fills north (the most room) first.
    assert_eq!(targets(&result), [("east", 2), ("north", 5), ("west", 2)]);
    assert_eq!(result.notice, None);
    let result = run(&placement, 3, &clusters);
    assert_eq!(targets(&result), [("east", 1), ("north", 2)]);
    assert!(
        result
            .notice
            .as_deref()
            .is_some_and(|n| n.contains("in aggregated preference order")),
        "{:?}",
        result.notice
    );
    assert_eq!(
        reason(&result, "west"),
        "candidate but minPerCluster 2 with 3 replicas reaches only 2 of 3 clusters; no replicas"
    );
}

#[test]
fn min_per_cluster_means_nothing_for_duplicated() {
    let placement = Placement {
        replica_scheduling: Some(ReplicaScheduling {
            type_: ReplicaSchedulingType::Duplicated,
            division_preference: None,
            weight_preference: None,
            min_per_cluster: 5,
        }),
        ..Placement::default()
    };
    let result = run(&placement, 2, &three());
    assert_eq!(targets(&result), [("east", 2), ("north", 2), ("west", 2)]);
    assert_eq!(result.notice, None);
}

mod min_per_cluster_properties {
    use super::*;
    use proptest::prelude::*;

    fn clusters(weights: &[i64]) -> (Vec<ClusterView>, Placement) {
        let clusters: Vec<ClusterView> = (0..weights.len())
            .map(|i| cluster(&format!("member-{i:02}"), &format!("zone-{}", i % 3)))
            .collect();
        let pairs: Vec<(String, i64)> = clusters
            .iter()
            .zip(weights)
            .map(|(c, &w)| (c.name.clone(), w))
            .collect();
        let refs: Vec<(&str, i64)> = pairs.iter().map(|(n, w)| (n.as_str(), *w)).collect();
        (clusters, weighted(&refs))
    }

    fn shares(result: &PlacementResult, clusters: &[ClusterView]) -> Vec<i32> {
        clusters
            .iter()
            .map(|c| {
                result
                    .targets
                    .iter()
                    .find(|t| t.name == c.name)
                    .map_or(0, |t| t.replicas)
            })
            .collect()
    }

    proptest! {
        #[test]
        fn each_selected_cluster_gets_the_minimum_when_the_total_allows(
            weights in prop::collection::vec(0i64..6, 1..10),
            minimum in 0i32..5,
            replicas in 0i32..80,
        ) {
            let (clusters, placement) = clusters(&weights);
            let placement = with_minimum(placement, minimum);
            let result = run(&placement, replicas, &clusters);
            let positive = weights.iter().filter(|&&w| w > 0).count() as i32;
            if positive == 0 {
                prop_assert!(result.scheduled.is_err() || replicas == 0);
                return Ok(());
            }
            let shares = shares(&result, &clusters);
            prop_assert_eq!(shares.iter().sum::<i32>(), replicas);
            let enough = replicas >= minimum * positive;
            prop_assert_eq!(result.notice.is_none(), enough || replicas == 0 || minimum == 0);
            for (share, weight) in shares.iter().zip(&weights) {
                if *weight == 0 {
                    prop_assert_eq!(*share, 0);
                } else if enough {
                    prop_assert!(*share >= minimum, "{:?} {:?}", weights, shares);
                }
            }
        }

        #[test]
        fn monotone_in_replicas(
            weights in prop::collection::vec(0i64..6, 1..10),
            minimum in 0i32..5,
            replicas in 0i32..80,
        ) {
            let (clusters, placement) = clusters(&weights);
            let placement = with_minimum(placement, minimum);
            let before = shares(&run(&placement, replicas, &clusters), &clusters);
            let after = shares(&run(&placement, replicas + 1, &clusters), &clusters);
            for (b, a) in before.iter().zip(&after) {
                prop_assert!(a >= b, "{:?}: {:?} -> {:?}", weights, before, after);
            }
        }

        #[test]
        fn not_ready_clusters_never_gain_with_a_minimum(
            weights in prop::collection::vec(1i64..6, 2..8),
            held in prop::collection::vec(0i32..4, 8),
            minimum in 0i32..5,
            replicas in 0i32..60,
        ) {
            let (mut clusters, placement) = clusters(&weights);
            clusters[0] = not_ready(clusters[0].clone(), 5);
            let placement = tolerate(with_minimum(placement, minimum), Some(TAINT_UNREACHABLE), None);
            let holding: Vec<TargetCluster> = clusters
                .iter()
                .zip(&held)
                .filter(|(_, h)| **h > 0)
                .map(|(c, h)| TargetCluster { name: c.name.clone(), replicas: *h })
                .collect();
            let result = run_stateful(&placement, replicas, &clusters, &holding);
            if result.scheduled.is_ok() {
                let shares = shares(&result, &clusters);
                prop_assert!(shares[0] <= held[0], "{:?} held {:?}", shares, held);
                prop_assert_eq!(shares.iter().sum::<i32>(), replicas);
            }
        }
    }
}

// ---- the example in docs/capacity.md ----

#[test]
fn the_capacity_doc_example() {
    use super::capacity::{FreeResources, with_estimates};
    let free = |cpu_millis: i64, memory_gib: i64, pods: i64| {
        Some(FreeResources {
            cpu_millis: Some(cpu_millis),
            memory_bytes: Some(memory_gib << 30),
            pods: Some(pods),
        })
    };
    let mut clusters = vec![
        cluster("east", "zone-a"),
        cluster("north", "zone-c"),
        cluster("west", "zone-b"),
    ];
    clusters[0].capacity = free(6000, 30, 200);
    clusters[1].capacity = free(500, 6, 100);
    clusters[2].capacity = free(3000, 14, 100);
    let web = |requests: serde_json::Value| {
        serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"template": {"spec": {
            "containers": [{"name": "web", "resources": {"requests": requests}}]}}}})
    };
    let requesting = web(serde_json::json!({"cpu": "500m", "memory": "1Gi"}));
    let dynamic = dynamic(vec![]);
    let estimated = with_estimates(&clusters, &dynamic, &requesting, &|_| 0);
    let result = run(&dynamic, 9, &estimated);
    assert_eq!(targets(&result), [("east", 5), ("north", 1), ("west", 3)]);
    assert_eq!(
        reason(&result, "east"),
        "selected: weight 12 (available replicas), 5 of 9 replicas"
    );

    let estimated = with_estimates(&clusters, &aggregated(), &requesting, &|_| 0);
    assert_eq!(
        targets(&run(&aggregated(), 15, &estimated)),
        [("east", 12), ("west", 3)]
    );
    assert_eq!(
        run(&aggregated(), 20, &estimated).scheduled,
        Err("not enough room: 20 replicas to place, the candidates can take 19".into())
    );

    let nothing = web(serde_json::json!({}));
    let estimated = with_estimates(&clusters, &dynamic, &nothing, &|_| 0);
    assert_eq!(
        targets(&run(&dynamic, 9, &estimated)),
        [("east", 5), ("north", 2), ("west", 2)]
    );
}

#[test]
fn dynamic_weights_count_the_replicas_a_cluster_holds_as_room() {
    // east runs 4 of the template and has room for 2 more: its room is 6, like west's.
    let clusters = vec![
        with_available(cluster("east", "zone-a"), 2),
        with_available(cluster("west", "zone-b"), 6),
    ];
    let result = run_with(&dynamic(vec![]), 8, &clusters, &current(&[("east", 4)]));
    assert_eq!(targets(&result), [("east", 4), ("west", 4)]);
}

/// The hub resolves a staticWeightList once per member registry snapshot
/// (`StaticWeights`); deciding with it must give what matching the list does.
mod resolved_static_weights {
    use super::*;
    use proptest::prelude::*;

    const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];
    const TIERS: [&str; 3] = ["gold", "silver", "bronze"];

    fn entry(kind: u8, value: usize, weight: i64) -> StaticClusterWeight {
        let mut target = ClusterTarget::default();
        match kind % 4 {
            0 => target.cluster_names = vec![format!("member-{value}")],
            1 => target.zones = vec![ZONES[value % 3].to_string()],
            2 => {
                target.label_selector = Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([(
                        "tier".to_string(),
                        TIERS[value % 3].to_string(),
                    )])),
                    match_expressions: None,
                })
            }
            _ => {
                target.label_selector = Some(LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: "tier".into(),
                        operator: ["In", "NotIn", "Exists", "DoesNotExist"][value % 4].into(),
                        values: Some(vec![TIERS[value % 3].to_string()]),
                    }]),
                })
            }
        }
        StaticClusterWeight {
            target_cluster: target,
            weight,
        }
    }

    fn view(index: usize, tier: Option<usize>, ready: bool, available: Option<i64>) -> ClusterView {
        let mut view = cluster(&format!("member-{index}"), ZONES[index % 3]);
        if let Some(tier) = tier {
            view = labelled(view, &[("tier", TIERS[tier % 3])]);
        }
        if !ready {
            view = not_ready(view, 30);
        }
        view.available_replicas = available;
        view
    }

    fn request<'a>(
        placement: &'a Placement,
        clusters: &'a [ClusterView],
        current: &'a [TargetCluster],
        replicas: i32,
        static_weights: Option<&'a StaticWeights>,
    ) -> PlacementRequest<'a> {
        PlacementRequest {
            placement,
            replicas,
            divisible: true,
            stateful: false,
            uid: UID,
            clusters,
            current,
            now: now(),
            static_weights,
            first_seat: None,
        }
    }

    proptest! {
        #[test]
        fn decide_with_resolved_weights_agrees_with_matching_the_list(
            members in prop::collection::vec(
                (prop::option::of(0usize..3), any::<bool>(), prop::option::of(0i64..20)),
                1..12,
            ),
            entries in prop::collection::vec((any::<u8>(), 0usize..12, 0i64..10), 1..8),
            dynamic in any::<bool>(),
            replicas in 0i32..40,
            held in 0i32..5,
        ) {
            let clusters: Vec<ClusterView> = members
                .iter()
                .enumerate()
                .map(|(i, &(tier, ready, available))| view(i, tier, ready, available))
                .collect();
            let list: Vec<StaticClusterWeight> =
                entries.iter().map(|&(kind, value, weight)| entry(kind, value, weight)).collect();
            let placement = divided(
                None,
                Some(WeightPreference {
                    static_weight_list: list.clone(),
                    dynamic_weight: dynamic.then_some(DynamicWeight::AvailableReplicas),
                }),
            );
            let current = vec![TargetCluster { name: "member-0".into(), replicas: held }];
            let resolved = StaticWeights::resolve(&list, &clusters);
            prop_assert_eq!(resolved.len(), clusters.len());
            let matched = place(&request(&placement, &clusters, &current, replicas, None));
            let given =
                place(&request(&placement, &clusters, &current, replicas, Some(&resolved)));
            prop_assert_eq!(given, matched);
        }
    }

    #[test]
    fn weights_resolved_for_another_number_of_clusters_are_not_used() {
        let placement = weighted(&[("east", 1), ("west", 2)]);
        let list = placement.static_weight_list();
        let two = vec![cluster("east", "zone-a"), cluster("west", "zone-b")];
        let stale = StaticWeights::resolve(list, &two[..1]);
        let result = place(&request(&placement, &two, &[], 3, Some(&stale)));
        assert_eq!(targets(&result), [("east", 1), ("west", 2)]);
    }
}

/// Replica clusters: the primary cluster's first replica comes before every other
/// cluster's first one, so a total smaller than the clusters drops replica clusters,
/// never the primary cluster; later replicas follow the weights as before.
#[test]
fn the_first_seat_cluster_keeps_a_replica_when_the_total_drops_below_the_clusters() {
    let placement = weighted(&[("east", 3), ("north", 2), ("west", 1)]);
    let clusters = three();
    let with = |replicas: i32, first_seat: Option<&'static str>| {
        let placement = placement.clone();
        let clusters = clusters.clone();
        let request = PlacementRequest {
            placement: &placement,
            replicas,
            divisible: true,
            stateful: true,
            uid: UID,
            clusters: &clusters,
            current: &[],
            now: now(),
            static_weights: None,
            first_seat,
        };
        decide(&request)
            .targets()
            .into_iter()
            .map(|t| (t.name, t.replicas))
            .collect::<Vec<_>>()
    };
    let by_name = |pairs: &[(&str, i32)]| {
        pairs
            .iter()
            .map(|(n, r)| (n.to_string(), *r))
            .collect::<Vec<_>>()
    };
    // Without it, the lightest cluster goes first.
    assert_eq!(with(2, None), by_name(&[("east", 1), ("north", 1)]));
    assert_eq!(with(2, Some("west")), by_name(&[("east", 1), ("west", 1)]));
    assert_eq!(with(1, Some("west")), by_name(&[("west", 1)]));
    // Enough for every cluster: the weights decide as before.
    assert_eq!(with(6, Some("west")), with(6, None));
}
