//! The dependency graph at the hub's largest size: 10,000 workloads with 3 dependencies
//! each (docs/dependencies.md, "Cost"). One operation is what the hub does when one
//! workload's placement changes: `set_workload` with its new clusters, then
//! `clusters_for` of each of its 3 dependencies. Criterion's throughput (elem/s) is
//! operations per second of wall time; before criterion runs, the same loop is timed by
//! the thread's CPU time (what a "per core" figure means on a shared machine) and
//! printed as `ops/s`.
//!
//! `cargo bench --bench dependencies -- --warm-up-time 1 --measurement-time 3`

use std::collections::BTreeSet;
use std::hint::black_box;
use std::time::{Duration, Instant};

use bulkhead::hub::federation::dependencies::{DependencyGraph, ObjectRef};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

const WORKLOADS: usize = 10_000;
const CLUSTERS: [&str; 3] = ["east", "west", "north"];

/// The workload's 3 dependencies: a ConfigMap and a Secret of its own, and a ConfigMap
/// shared with others (`shared_by` workloads share each one).
fn deps(workload: usize, shared_by: usize) -> Vec<ObjectRef> {
    vec![
        ObjectRef::new("v1", "ConfigMap", "shop", &format!("config-{workload}")),
        ObjectRef::new("v1", "Secret", "shop", &format!("secret-{workload}")),
        ObjectRef::new(
            "v1",
            "ConfigMap",
            "shop",
            &format!("shared-{}", workload / shared_by),
        ),
    ]
}

fn workload(index: usize) -> ObjectRef {
    ObjectRef::new("apps/v1", "Deployment", "shop", &format!("web-{index}"))
}

/// Two of the three clusters, turning with `step`.
fn placement(step: usize) -> BTreeSet<String> {
    (0..2)
        .map(|k| CLUSTERS[(step + k) % CLUSTERS.len()].to_string())
        .collect()
}

fn build(shared_by: usize) -> DependencyGraph {
    let mut graph = DependencyGraph::new();
    for i in 0..WORKLOADS {
        graph.set_workload(workload(i), deps(i, shared_by), placement(i));
    }
    graph.set_synced(true);
    graph
}

/// User + system CPU time of this thread.
fn thread_cpu_time() -> Duration {
    // SAFETY: an all-zero rusage is valid, and getrusage only writes into it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid rusage for getrusage to fill.
    let status = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    assert_eq!(status, 0, "getrusage(RUSAGE_THREAD)");
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}

/// One operation: a workload's placement changes, its dependencies' clusters are read.
fn change_one(graph: &mut DependencyGraph, names: &[(ObjectRef, Vec<ObjectRef>)], step: usize) {
    let (workload, deps) = &names[step % WORKLOADS];
    graph.set_workload(workload.clone(), deps.clone(), placement(step));
    for dep in deps {
        black_box(graph.clusters_for(dep));
    }
}

fn names(shared_by: usize) -> Vec<(ObjectRef, Vec<ObjectRef>)> {
    (0..WORKLOADS)
        .map(|i| (workload(i), deps(i, shared_by)))
        .collect()
}

const CASES: [(&str, usize); 2] = [("shared-by-100", 100), ("shared-by-all", WORKLOADS)];

/// The operation timed by CPU time, printed as ops/s.
fn print_ops_per_second() {
    const OPS: usize = 200_000;
    for (name, shared_by) in CASES {
        let cpu = thread_cpu_time();
        let wall = Instant::now();
        let mut graph = build(shared_by);
        let build_cpu = thread_cpu_time() - cpu;
        let build_wall = wall.elapsed();
        let names = names(shared_by);
        let cpu = thread_cpu_time();
        let wall = Instant::now();
        for step in 1..=OPS {
            change_one(&mut graph, &names, step);
        }
        let change_cpu = thread_cpu_time() - cpu;
        let change_wall = wall.elapsed();
        let per_second = |n: usize, t: Duration| n as f64 / t.as_secs_f64().max(1e-9);
        println!(
            "{name}: set_workload+clusters_for {:.0} ops/s CPU time ({:.0} ops/s wall), \
             {OPS} ops; build of {WORKLOADS} workloads {:.0} workloads/s CPU time \
             ({:.0} ms CPU, {:.0} ms wall)",
            per_second(OPS, change_cpu),
            per_second(OPS, change_wall),
            per_second(WORKLOADS, build_cpu),
            build_cpu.as_secs_f64() * 1e3,
            build_wall.as_secs_f64() * 1e3,
        );
    }
}

fn bench_graph(c: &mut Criterion) {
    print_ops_per_second();
    let mut group = c.benchmark_group("dependency-graph");
    // Each shared ConfigMap used by 100 workloads, or one used by all 10,000 (a CA
    // bundle every Deployment mounts): a change must not cost more when many share.
    for (name, shared_by) in CASES {
        let mut graph = build(shared_by);
        let names = names(shared_by);
        let mut step = 0usize;
        group.throughput(Throughput::Elements(1));
        group.bench_function(
            format!("10000-workloads-3-deps/{name}/set_workload+clusters_for"),
            |b| {
                b.iter(|| {
                    step += 1;
                    let (workload, deps) = &names[step % WORKLOADS];
                    graph.set_workload(workload.clone(), deps.clone(), placement(step));
                    for dep in deps {
                        black_box(graph.clusters_for(dep));
                    }
                })
            },
        );
        // The hub's start: every workload registered once.
        group.throughput(Throughput::Elements(WORKLOADS as u64));
        group.sample_size(10);
        group.bench_function(format!("10000-workloads-3-deps/{name}/build"), |b| {
            b.iter_batched(|| (), |()| build(shared_by), BatchSize::PerIteration)
        });
        group.sample_size(100);
    }
    group.finish();
}

criterion_group!(benches, bench_graph);
criterion_main!(benches);
