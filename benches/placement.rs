//! The placement kernel against DESIGN.md's budget: 100 clusters, Divided/Weighted, at
//! least 200,000 decisions/s on one core. One "decision" is the placement of one template
//! over all 100 clusters: `decide` (the kernel) and `place` (the kernel plus the 100
//! rendered decision rows) are measured separately.
//!
//! `cargo bench --bench placement -- --warm-up-time 1 --measurement-time 3`

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;

use bulkhead::api::propagation_policy::{
    ClusterTarget, DynamicWeight, Placement, ReplicaScheduling, ReplicaSchedulingType,
    SpreadByField, SpreadConstraint, StaticClusterWeight, WeightPreference,
};
use bulkhead::api::resource_binding::TargetCluster;
use bulkhead::hub::federation::placement::{
    ClusterView, PlacementRequest, StaticWeights, decide, place,
};
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

const CLUSTERS: usize = 100;
const REPLICAS: i32 = 300;
const UID: &str = "6f1c9a52-0d8e-4d43-9d5e-3f6f9b1a2c7e";

/// A fixed pseudo-random sequence (xorshift), so every run measures the same input.
fn pseudo_random(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

fn clusters() -> Vec<ClusterView> {
    let mut seed = 0x9e37_79b9_7f4a_7c15;
    (0..CLUSTERS)
        .map(|i| ClusterView {
            name: format!("member-{i:03}"),
            labels: BTreeMap::from([
                ("tier".to_string(), format!("tier-{}", i % 5)),
                ("provider".to_string(), format!("provider-{}", i % 3)),
            ]),
            zone: format!("zone-{}", i % 10),
            region: Some(format!("region-{}", i % 4)),
            taints: vec![],
            ready: true,
            available_replicas: Some((pseudo_random(&mut seed) % 200) as i64),
            capacity: None,
        })
        .collect()
}

fn divided(weights: WeightPreference) -> Placement {
    Placement {
        replica_scheduling: Some(ReplicaScheduling {
            type_: ReplicaSchedulingType::Divided,
            division_preference: None,
            weight_preference: Some(weights),
            min_per_cluster: 0,
        }),
        ..Placement::default()
    }
}

/// Static weights by label and zone, as a policy would write them: 5 tiers with weights
/// from a pseudo-random sequence, a few zone overrides first.
fn static_weights() -> Placement {
    let mut seed = 0x2545_f491_4f6c_dd1d;
    let mut list: Vec<StaticClusterWeight> = (0..3)
        .map(|zone| StaticClusterWeight {
            target_cluster: ClusterTarget {
                zones: vec![format!("zone-{}", zone * 3)],
                ..ClusterTarget::default()
            },
            weight: (pseudo_random(&mut seed) % 9 + 1) as i64,
        })
        .collect();
    list.extend((0..5).map(|tier| StaticClusterWeight {
        target_cluster: ClusterTarget {
            label_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "tier".to_string(),
                    format!("tier-{tier}"),
                )])),
                match_expressions: None,
            }),
            ..ClusterTarget::default()
        },
        weight: (pseudo_random(&mut seed) % 9 + 1) as i64,
    }));
    divided(WeightPreference {
        static_weight_list: list,
        dynamic_weight: None,
    })
}

fn dynamic_weights() -> Placement {
    divided(WeightPreference {
        static_weight_list: vec![],
        dynamic_weight: Some(DynamicWeight::AvailableReplicas),
    })
}

/// CPU time of the benchmark thread. DESIGN.md's budget is per core, and on a shared
/// machine wall time also counts the time other processes hold the core.
struct ThreadCpuTime;

fn thread_cpu_now() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for clock_gettime to write into.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(status, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

static WALL_TIME: WallTime = WallTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        thread_cpu_now()
    }
    fn end(&self, start: Duration) -> Duration {
        thread_cpu_now().saturating_sub(start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Durations either way: reuse criterion's formatting.
        WALL_TIME.formatter()
    }
}

fn bench_wall_time(c: &mut Criterion) {
    bench_place(c, "place");
}

fn bench_cpu_time(c: &mut Criterion<ThreadCpuTime>) {
    bench_place(c, "place-cpu-time");
}

fn bench_place<M: Measurement>(c: &mut Criterion<M>, group_name: &str) {
    let clusters = clusters();
    let current: Vec<TargetCluster> = vec![];
    let mut spread_by_zone = static_weights();
    spread_by_zone.spread_constraints = vec![SpreadConstraint {
        spread_by_field: SpreadByField::Zone,
        min_groups: 2,
        max_groups: 6,
    }];
    let cases = [
        ("100-clusters/weighted-static", static_weights()),
        ("100-clusters/weighted-dynamic", dynamic_weights()),
        ("100-clusters/weighted-static-zone-spread", spread_by_zone),
    ];

    let mut group = c.benchmark_group(group_name);
    group.throughput(Throughput::Elements(1));
    for (name, placement) in &cases {
        let request = PlacementRequest {
            placement,
            replicas: REPLICAS,
            divisible: true,
            stateful: false,
            uid: UID,
            clusters: &clusters,
            current: &current,
            now: jiff::Timestamp::UNIX_EPOCH,
            static_weights: None,
            first_seat: None,
        };
        let result = place(&request);
        assert_eq!(result.scheduled, Ok(()), "{name}");
        assert_eq!(result.decisions.len(), CLUSTERS);
        assert_eq!(
            result.targets.iter().map(|t| t.replicas).sum::<i32>(),
            REPLICAS
        );
        // The kernel: the decision, with reasons left unrendered (what the hub does for
        // every re-evaluation; it renders only when the binding must be written).
        group.bench_function(format!("{name}/decide"), |b| {
            b.iter(|| decide(black_box(&request)))
        });
        // Decision plus the 100 rendered rows (targets, decisions, reasons).
        group.bench_function(format!("{name}/place"), |b| {
            b.iter(|| place(black_box(&request)))
        });
        // As the hub decides: the staticWeightList resolved once per policy and member
        // registry snapshot (`StaticWeights::resolve`, measured on its own), not per
        // template.
        let list = placement.static_weight_list();
        if !list.is_empty() {
            let resolved = StaticWeights::resolve(list, &clusters);
            let hub_request = PlacementRequest {
                static_weights: Some(&resolved),
                first_seat: None,
                ..request
            };
            assert_eq!(place(&hub_request), result, "{name}: resolved weights");
            group.bench_function(format!("{name}/decide-resolved"), |b| {
                b.iter(|| decide(black_box(&hub_request)))
            });
            group.bench_function(format!("{name}/resolve"), |b| {
                b.iter(|| StaticWeights::resolve(black_box(list), black_box(&clusters)))
            });
        }
    }
    group.finish();
}

criterion_group!(wall_time, bench_wall_time);
criterion_group! {
    name = cpu_time;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = bench_cpu_time
}
criterion_main!(wall_time, cpu_time);
