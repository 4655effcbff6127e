//! Measuring helpers for the lab benchmarks (`e2e/tests/scale.rs`, `make bench-lab`,
//! docs/benchmarks.md): Prometheus text parsing (the hub's `/metrics` and the hub API
//! server's `apiserver_request_total`), process CPU and RSS from `/proc`, watches that
//! time every member copy and every fencing-Lease renewal as it arrives, concurrent
//! create clients that record when each request returned, extra kwok nodes so every
//! benchmark pod has room, and "the hub has settled".
//!
//! Nothing here asserts a time: the benchmarks print numbers.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;

use crate::federation::Federation;
use crate::lab::Lab;
use crate::support::cleanup_blocking;

// ---------------------------------------------------------------------------------------
// Prometheus text

/// One sample of a Prometheus text exposition.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Every sample in a Prometheus text (HELP/TYPE lines, HTTP headers and blank lines are
/// skipped).
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub samples: Vec<Sample>,
}

impl Metrics {
    pub fn parse(text: &str) -> Self {
        Metrics {
            samples: text.lines().filter_map(parse_sample).collect(),
        }
    }

    /// The unlabelled sample `name`.
    pub fn value(&self, name: &str) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels.is_empty())
            .map(|s| s.value)
    }

    /// Sum of the samples `name` whose labels satisfy `filter`.
    pub fn sum(&self, name: &str, filter: impl Fn(&BTreeMap<String, String>) -> bool) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name && filter(&s.labels))
            .map(|s| s.value)
            .fold(0.0, |a, b| a + b)
    }

    /// The samples `name` summed by the value of `label`.
    pub fn by_label(&self, name: &str, label: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for s in self.samples.iter().filter(|s| s.name == name) {
            let key = s.labels.get(label).cloned().unwrap_or_default();
            *out.entry(key).or_insert(0.0) += s.value;
        }
        out
    }

    /// The histogram `name` (its `_bucket`, `_count` and `_sum` samples), summed over
    /// the series whose labels (other than `le`) satisfy `filter`.
    pub fn histogram(
        &self,
        name: &str,
        filter: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> Histogram {
        let bucket = format!("{name}_bucket");
        let mut buckets: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        for s in self
            .samples
            .iter()
            .filter(|s| s.name == bucket && filter(&s.labels))
        {
            let Some(le) = s.labels.get("le").and_then(|le| parse_float(le)) else {
                continue;
            };
            // Order by the bound; +Inf sorts last.
            let entry = buckets.entry(ordered(le)).or_insert((le, 0.0));
            entry.1 += s.value;
        }
        Histogram {
            buckets: buckets.into_values().collect(),
            count: self.sum(&format!("{name}_count"), &filter),
            sum: self.sum(&format!("{name}_sum"), &filter),
        }
    }
}

fn ordered(value: f64) -> u64 {
    // Non-negative floats order like their bit patterns.
    if value.is_infinite() {
        u64::MAX
    } else {
        value.max(0.0).to_bits()
    }
}

fn parse_float(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        other => other.parse().ok(),
    }
}

fn is_metric_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

fn parse_sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let (labels, consumed) = parse_labels(&line[open + 1..])?;
            (&line[..open], labels, &line[open + 1 + consumed..])
        }
        None => {
            let (name, rest) = line.split_once(char::is_whitespace)?;
            (name, BTreeMap::new(), rest)
        }
    };
    if !is_metric_name(name) {
        return None;
    }
    let value = parse_float(rest.split_whitespace().next()?)?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Parses `a="x",b="y"}`; returns the labels and the bytes consumed (through the `}`).
fn parse_labels(text: &str) -> Option<(BTreeMap<String, String>, usize)> {
    let mut labels = BTreeMap::new();
    let bytes: Vec<char> = text.chars().collect();
    let mut i = 0;
    let mut consumed = 0;
    loop {
        while i < bytes.len() && (bytes[i] == ',' || bytes[i] == ' ') {
            consumed += bytes[i].len_utf8();
            i += 1;
        }
        if i >= bytes.len() {
            return None;
        }
        if bytes[i] == '}' {
            consumed += 1;
            return Some((labels, consumed));
        }
        let mut key = String::new();
        while i < bytes.len() && bytes[i] != '=' {
            key.push(bytes[i]);
            consumed += bytes[i].len_utf8();
            i += 1;
        }
        // `="`
        if i + 1 >= bytes.len() || bytes[i + 1] != '"' {
            return None;
        }
        consumed += 2;
        i += 2;
        let mut value = String::new();
        while i < bytes.len() && bytes[i] != '"' {
            if bytes[i] == '\\' && i + 1 < bytes.len() {
                consumed += 1;
                i += 1;
                value.push(match bytes[i] {
                    'n' => '\n',
                    other => other,
                });
            } else {
                value.push(bytes[i]);
            }
            consumed += bytes[i].len_utf8();
            i += 1;
        }
        if i >= bytes.len() {
            return None;
        }
        consumed += 1;
        i += 1;
        labels.insert(key.trim().to_string(), value);
    }
}

/// A cumulative histogram: (upper bound, observations <= bound), bounds ascending.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
    pub count: f64,
    pub sum: f64,
}

impl Histogram {
    /// What was observed since `before` (same buckets).
    pub fn minus(&self, before: &Histogram) -> Histogram {
        let earlier: HashMap<u64, f64> = before
            .buckets
            .iter()
            .map(|(le, n)| (ordered(*le), *n))
            .collect();
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, n)| (*le, n - earlier.get(&ordered(*le)).copied().unwrap_or(0.0)))
                .collect(),
            count: self.count - before.count,
            sum: self.sum - before.sum,
        }
    }

    /// The upper bound of the bucket holding the `q` quantile (`+Inf` when it lies above
    /// the largest finite bound), or `None` without observations.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count <= 0.0 {
            return None;
        }
        let rank = q * self.count;
        self.buckets
            .iter()
            .find(|(_, n)| *n >= rank)
            .map(|(le, _)| *le)
            .or(Some(f64::INFINITY))
    }

    /// The largest finite bucket bound.
    pub fn largest_bound(&self) -> f64 {
        self.buckets
            .iter()
            .map(|(le, _)| *le)
            .filter(|le| le.is_finite())
            .fold(0.0, f64::max)
    }

    /// "p50 <= 0.016 s, p99 <= 0.131 s (n 24, mean 0.020 s)".
    pub fn describe(&self) -> String {
        if self.count <= 0.0 {
            return "no observations".into();
        }
        let bound = |q: f64| match self.quantile(q) {
            Some(le) if le.is_finite() => format!("<= {le:.3} s"),
            _ => format!("> {:.3} s", self.largest_bound()),
        };
        format!(
            "p50 {}, p99 {} (n {:.0}, mean {:.3} s)",
            bound(0.50),
            bound(0.99),
            self.count,
            self.sum / self.count
        )
    }
}

/// The hub process's metrics (`/metrics` of its probe server).
pub async fn hub_metrics(federation: &Federation) -> Result<Metrics> {
    Ok(Metrics::parse(&federation.hub_metrics().await?))
}

/// `bulkhead_hub_writes_total` by `what`.
pub fn hub_writes(metrics: &Metrics) -> BTreeMap<String, f64> {
    metrics.by_label("bulkhead_hub_writes_total", "what")
}

/// The difference of two counter maps, keeping the entries that moved.
pub fn delta<K: Ord + Clone>(
    after: &BTreeMap<K, f64>,
    before: &BTreeMap<K, f64>,
) -> BTreeMap<K, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v != 0.0)
        .collect()
}

// ---------------------------------------------------------------------------------------
// The hub API server's request counters

/// One `apiserver_request_total` series, without the labels that do not tell writers
/// apart (component, dry_run, scope, version).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub verb: String,
    pub code: String,
}

impl RequestKey {
    /// `deployments/status PATCH`.
    pub fn what(&self) -> String {
        let resource = if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        };
        format!("{resource} {}", self.verb)
    }
}

/// Verbs `apiserver_request_total` reports for requests that change nothing.
pub const READ_VERBS: [&str; 5] = ["GET", "LIST", "WATCH", "WATCHLIST", "CONNECT"];

/// The hub API server's `/metrics` (the admin client may read it).
pub async fn apiserver_metrics(client: &Client) -> Result<Metrics> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(request)
        .await
        .context("reading the hub API server's /metrics")?;
    Ok(Metrics::parse(&text))
}

/// Every write request (`apiserver_request_total` with a verb not in [`READ_VERBS`]) the
/// API server has completed, by series.
pub fn write_requests(metrics: &Metrics) -> BTreeMap<RequestKey, f64> {
    let mut out = BTreeMap::new();
    for s in metrics
        .samples
        .iter()
        .filter(|s| s.name == "apiserver_request_total")
    {
        let label = |name: &str| s.labels.get(name).cloned().unwrap_or_default();
        let verb = label("verb");
        if READ_VERBS.contains(&verb.as_str()) {
            continue;
        }
        let key = RequestKey {
            group: label("group"),
            resource: label("resource"),
            subresource: label("subresource"),
            verb,
            code: label("code"),
        };
        *out.entry(key).or_insert(0.0) += s.value;
    }
    out
}

/// Write requests at the hub API server between two readings, split into those on the
/// template kind and on ResourceBindings (the hub's per-template writes, after
/// subtracting what the benchmark's own clients sent) and everything else.
#[derive(Clone, Debug, Default)]
pub struct HubApiWrites {
    /// (resource[/subresource] VERB) -> requests, hub only, every response code.
    pub per_template: BTreeMap<String, f64>,
    /// Of those, the ones that failed (code not 2xx), by (what, code).
    pub failed: BTreeMap<(String, String), f64>,
    /// Writes to other resources (Events, MemberCluster status, ...), for information.
    pub other: BTreeMap<String, f64>,
}

impl HubApiWrites {
    /// `template` is the template kind's (group, resource), e.g. ("apps", "deployments");
    /// `own` are the benchmark's own requests to subtract, as ("deployments POST", n).
    pub fn between(
        after: &BTreeMap<RequestKey, f64>,
        before: &BTreeMap<RequestKey, f64>,
        template: (&str, &str),
        own: &[(&str, f64)],
    ) -> Self {
        let mut writes = HubApiWrites::default();
        for (key, n) in delta(after, before) {
            let ours = (key.group == template.0 && key.resource == template.1)
                || (key.group == "federation.example.com" && key.resource == "resourcebindings");
            let what = key.what();
            if ours {
                *writes.per_template.entry(what.clone()).or_insert(0.0) += n;
                if !key.code.starts_with('2') {
                    *writes.failed.entry((what, key.code.clone())).or_insert(0.0) += n;
                }
            } else {
                *writes.other.entry(what).or_insert(0.0) += n;
            }
        }
        for (what, n) in own {
            if let Some(v) = writes.per_template.get_mut(*what) {
                *v -= n;
            }
        }
        writes.per_template.retain(|_, v| *v != 0.0);
        writes
    }

    pub fn total(&self) -> f64 {
        total(&self.per_template)
    }

    /// "resourcebindings APPLY 500, deployments PATCH 500, ..." (largest first).
    pub fn describe(&self) -> String {
        describe_counts(&self.per_template)
    }
}

/// The sum of a counter map (0, not the -0 an empty float `sum()` gives).
pub fn total<K>(counts: &BTreeMap<K, f64>) -> f64 {
    counts.values().fold(0.0, |a, b| a + b)
}

/// "a 3, b 2" with the largest first.
pub fn describe_counts(counts: &BTreeMap<String, f64>) -> String {
    let mut entries: Vec<_> = counts.iter().collect();
    entries.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
    if entries.is_empty() {
        return "none".into();
    }
    entries
        .iter()
        .map(|(k, v)| format!("{k} {v:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

// ---------------------------------------------------------------------------------------
// /proc

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// User plus system CPU seconds a process has used (`/proc/<pid>/stat` utime + stime).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields after it start at 3 (state).
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

/// Resident set size in MiB (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// "12.3" or "?".
pub fn show(value: Option<f64>, decimals: usize) -> String {
    value.map_or("?".into(), |v| format!("{v:.decimals$}"))
}

// ---------------------------------------------------------------------------------------
// Latency spreads

/// Nearest-rank percentiles of a set of durations.
#[derive(Clone, Copy, Debug)]
pub struct Spread {
    pub n: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Spread {
    pub fn of(mut values: Vec<Duration>) -> Option<Spread> {
        if values.is_empty() {
            return None;
        }
        values.sort();
        let rank =
            |q: f64| values[((q * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1];
        Some(Spread {
            n: values.len(),
            p50: rank(0.50),
            p99: rank(0.99),
            max: *values.last().expect("not empty"),
        })
    }

    /// "p50 0.412 s, p99 1.873 s, max 2.001 s (n 1500)".
    pub fn describe(spread: &Option<Spread>) -> String {
        match spread {
            Some(s) => format!(
                "p50 {:.3} s, p99 {:.3} s, max {:.3} s (n {})",
                s.p50.as_secs_f64(),
                s.p99.as_secs_f64(),
                s.max.as_secs_f64(),
                s.n
            ),
            None => "no samples".into(),
        }
    }
}

/// `later - earlier` in seconds, negative when `later` is before `earlier`.
pub fn signed_seconds(later: Instant, earlier: Instant) -> f64 {
    match later.checked_duration_since(earlier) {
        Some(d) => d.as_secs_f64(),
        None => -earlier.duration_since(later).as_secs_f64(),
    }
}

// ---------------------------------------------------------------------------------------
// Member copies, timed by watches in every member

/// A member copy as a watch delivered it.
#[derive(Clone, Debug)]
pub struct Sighting {
    pub cluster: String,
    pub name: String,
    pub replicas: i64,
    pub at: Instant,
}

/// Watches of the managed copies of one kind in the test namespace of every member,
/// remembering when each copy was first seen, and first seen with each replica count.
pub struct CopyWatch {
    receiver: mpsc::UnboundedReceiver<Sighting>,
    first_seen: HashMap<(String, String), Instant>,
    first_with: HashMap<(String, String, i64), Instant>,
}

impl CopyWatch {
    /// Starts one watch per member (through its inside address). The watches list
    /// first, so start them before the templates exist.
    pub fn start(federation: &Federation, resource: &ApiResource) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        for (cluster, client) in &federation.members {
            let api = Api::<DynamicObject>::namespaced_with(
                client.clone(),
                &federation.namespace,
                resource,
            );
            let (cluster, sender) = (cluster.clone(), sender.clone());
            tokio::spawn(async move {
                let config = watcher::Config::default()
                    .labels(&format!("{}=bulkhead", bulkhead::api::LABEL_MANAGED_BY));
                let stream = watcher(api, config).default_backoff().applied_objects();
                futures::pin_mut!(stream);
                while let Some(event) = stream.next().await {
                    let Ok(object) = event else { continue };
                    let sighting = Sighting {
                        cluster: cluster.clone(),
                        name: object.name_any(),
                        replicas: object.data["spec"]["replicas"].as_i64().unwrap_or(-1),
                        at: Instant::now(),
                    };
                    if sender.send(sighting).is_err() {
                        return;
                    }
                }
            });
        }
        CopyWatch {
            receiver,
            first_seen: HashMap::new(),
            first_with: HashMap::new(),
        }
    }

    fn record(&mut self, s: Sighting) {
        self.first_seen
            .entry((s.cluster.clone(), s.name.clone()))
            .or_insert(s.at);
        self.first_with
            .entry((s.cluster, s.name, s.replicas))
            .or_insert(s.at);
    }

    /// Records whatever the watches delivered so far.
    pub fn drain(&mut self) {
        while let Ok(s) = self.receiver.try_recv() {
            self.record(s);
        }
    }

    /// Waits until every (cluster, name) of `wanted` has been seen with its replica
    /// count; returns when the last of them first was.
    pub async fn wait_all(
        &mut self,
        wanted: &HashMap<(String, String), i64>,
        timeout: Duration,
    ) -> Result<Instant> {
        self.drain();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut missing: HashSet<(String, String)> = wanted
            .iter()
            .filter(|((c, n), r)| !self.first_with.contains_key(&(c.clone(), n.clone(), **r)))
            .map(|(k, _)| k.clone())
            .collect();
        while !missing.is_empty() {
            match tokio::time::timeout_at(deadline, self.receiver.recv()).await {
                Ok(Some(s)) => {
                    let key = (s.cluster.clone(), s.name.clone());
                    let replicas = s.replicas;
                    self.record(s);
                    if wanted.get(&key) == Some(&replicas) {
                        missing.remove(&key);
                    }
                }
                Ok(None) => bail!("the member watches ended"),
                Err(_) => {
                    let mut sample: Vec<_> = missing.iter().take(5).collect();
                    sample.sort();
                    bail!(
                        "{} of {} member copies not seen with their replicas after {timeout:?}, e.g. {sample:?}",
                        missing.len(),
                        wanted.len()
                    )
                }
            }
        }
        self.drain();
        Ok(wanted
            .iter()
            .filter_map(|((c, n), r)| self.first_with.get(&(c.clone(), n.clone(), *r)).copied())
            .max()
            .unwrap_or_else(Instant::now))
    }

    pub fn first_seen(&self, cluster: &str, name: &str) -> Option<Instant> {
        self.first_seen
            .get(&(cluster.to_string(), name.to_string()))
            .copied()
    }

    pub fn first_with(&self, cluster: &str, name: &str, replicas: i64) -> Option<Instant> {
        self.first_with
            .get(&(cluster.to_string(), name.to_string(), replicas))
            .copied()
    }
}

// ---------------------------------------------------------------------------------------
// Fencing-Lease renewals, timed by watches in every member

/// A renewal of the hub's fencing Lease as a member's watch delivered it.
#[derive(Clone, Debug)]
pub struct Renewal {
    pub cluster: String,
    pub at: Instant,
    /// Arrival (wall clock) minus the `renewTime` the hub wrote: sending, the member API
    /// server's write and its watch. Hub and lab share one clock.
    pub latency: Option<Duration>,
}

/// Watches `bulkhead-system/bulkhead-hub` in every member.
pub struct LeaseWatch {
    receiver: mpsc::UnboundedReceiver<Renewal>,
    seen: Vec<Renewal>,
}

/// What the Lease watches saw in a window.
#[derive(Clone, Debug)]
pub struct LeaseStats {
    pub renewals: usize,
    pub latency: Option<Spread>,
    /// Longest time between two renewals arriving, per member (the agent fences after
    /// its lease duration without a renewal).
    pub max_gap: BTreeMap<String, Duration>,
}

impl LeaseWatch {
    pub fn start(federation: &Federation) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        for (cluster, client) in &federation.members {
            let api = Api::<Lease>::namespaced(client.clone(), bulkhead::api::SYSTEM_NAMESPACE);
            let (cluster, sender) = (cluster.clone(), sender.clone());
            tokio::spawn(async move {
                let config = watcher::Config::default().fields(&format!(
                    "metadata.name={}",
                    bulkhead::hub::membership::lease::LEASE_NAME
                ));
                let stream = watcher(api, config).default_backoff().applied_objects();
                futures::pin_mut!(stream);
                let mut last = None;
                while let Some(event) = stream.next().await {
                    let Ok(lease) = event else { continue };
                    let Some(renewed) = lease.spec.as_ref().and_then(|s| s.renew_time.clone())
                    else {
                        continue;
                    };
                    if last.as_ref() == Some(&renewed.0) {
                        continue;
                    }
                    last = Some(renewed.0);
                    let latency = jiff::Timestamp::now()
                        .duration_since(renewed.0)
                        .try_into()
                        .ok();
                    let renewal = Renewal {
                        cluster: cluster.clone(),
                        at: Instant::now(),
                        latency,
                    };
                    if sender.send(renewal).is_err() {
                        return;
                    }
                }
            });
        }
        LeaseWatch {
            receiver,
            seen: vec![],
        }
    }

    /// Renewals that arrived in `[from, to)`.
    pub fn stats(&mut self, from: Instant, to: Instant) -> LeaseStats {
        while let Ok(r) = self.receiver.try_recv() {
            self.seen.push(r);
        }
        let mut latencies = vec![];
        let mut max_gap: BTreeMap<String, Duration> = BTreeMap::new();
        let mut renewals = 0;
        let clusters: HashSet<&str> = self.seen.iter().map(|r| r.cluster.as_str()).collect();
        for cluster in clusters {
            let arrivals: Vec<&Renewal> = self
                .seen
                .iter()
                .filter(|r| r.cluster == cluster && r.at < to)
                .collect();
            // The gaps inside the window: from the last renewal before it (or its start),
            // between the renewals in it, and from the last one to its end.
            let mut previous = arrivals
                .iter()
                .rev()
                .find(|r| r.at < from)
                .map_or(from, |r| r.at);
            let mut gap = Duration::ZERO;
            for r in arrivals.iter().filter(|r| r.at >= from) {
                renewals += 1;
                if let Some(l) = r.latency {
                    latencies.push(l);
                }
                gap = gap.max(r.at.duration_since(previous));
                previous = r.at;
            }
            gap = gap.max(to.saturating_duration_since(previous));
            max_gap.insert(cluster.to_string(), gap);
        }
        LeaseStats {
            renewals,
            latency: Spread::of(latencies),
            max_gap,
        }
    }
}

impl LeaseStats {
    pub fn describe(&self) -> String {
        let gaps: Vec<String> = self
            .max_gap
            .iter()
            .map(|(c, g)| format!("{c} {:.2} s", g.as_secs_f64()))
            .collect();
        format!(
            "{} renewals seen in the members; renewTime -> seen in the member {}; longest gap between renewals: {}",
            self.renewals,
            Spread::describe(&self.latency),
            if gaps.is_empty() {
                "-".into()
            } else {
                gaps.join(", ")
            }
        )
    }
}

// ---------------------------------------------------------------------------------------
// Concurrent clients

/// Runs `op` on every item, the items shared round-robin over `clients`, each client
/// sending one request at a time; returns when each item's request returned.
pub async fn on_clients<T, F, Fut>(
    clients: &[Client],
    items: Vec<T>,
    op: F,
) -> Result<Vec<(T, Instant)>>
where
    F: Fn(Client, &T) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    anyhow::ensure!(!clients.is_empty(), "no clients");
    let mut shares: Vec<Vec<T>> = (0..clients.len()).map(|_| vec![]).collect();
    for (i, item) in items.into_iter().enumerate() {
        shares[i % clients.len()].push(item);
    }
    let op = &op;
    let runs = clients
        .iter()
        .zip(shares)
        .map(|(client, share)| async move {
            let mut done = Vec::with_capacity(share.len());
            for item in share {
                op(client.clone(), &item).await?;
                done.push((item, Instant::now()));
            }
            anyhow::Ok(done)
        });
    Ok(futures::future::try_join_all(runs)
        .await?
        .into_iter()
        .flatten()
        .collect())
}

/// Creates `objects` (JSON, each with metadata.name) in `namespace` through `clients`;
/// returns name -> when its create returned.
pub async fn create_all(
    clients: &[Client],
    namespace: &str,
    resource: &ApiResource,
    objects: Vec<serde_json::Value>,
) -> Result<HashMap<String, Instant>> {
    let done = on_clients(clients, objects, |client, object| {
        let api = Api::<DynamicObject>::namespaced_with(client, namespace, resource);
        let object: Result<DynamicObject, _> = serde_json::from_value(object.clone());
        async move {
            api.create(&PostParams::default(), &object?)
                .await
                .context("creating a template")?;
            anyhow::Ok(())
        }
    })
    .await?;
    Ok(done
        .into_iter()
        .map(|(object, at)| {
            (
                object["metadata"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                at,
            )
        })
        .collect())
}

/// Merge-patches every named object with `patch` through `clients`; returns name -> when
/// its patch returned.
pub async fn patch_all(
    clients: &[Client],
    namespace: &str,
    resource: &ApiResource,
    names: Vec<String>,
    patch: serde_json::Value,
) -> Result<HashMap<String, Instant>> {
    let patch = &patch;
    let done = on_clients(clients, names, |client, name| {
        let api = Api::<DynamicObject>::namespaced_with(client, namespace, resource);
        let name = name.clone();
        async move {
            api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .with_context(|| format!("patching {name}"))?;
            anyhow::Ok(())
        }
    })
    .await?;
    Ok(done.into_iter().collect())
}

/// Waits until no namespace of the hub is terminating, so the namespace controller's and
/// garbage collector's deletions of an earlier run do not count as writes of this one.
pub async fn wait_no_terminating_namespaces(client: &Client, timeout: Duration) -> Result<()> {
    let api = Api::<Namespace>::all(client.clone());
    crate::wait_for("no terminating namespace on the hub", timeout, || {
        let api = api.clone();
        async move {
            match api.list(&ListParams::default()).await {
                Ok(list) => {
                    let terminating: Vec<String> = list
                        .items
                        .iter()
                        .filter(|n| n.metadata.deletion_timestamp.is_some())
                        .map(|n| n.name_any())
                        .collect();
                    if terminating.is_empty() {
                        crate::Check::Done(())
                    } else {
                        crate::Check::Waiting(format!("terminating: {terminating:?}"))
                    }
                }
                Err(e) => crate::Check::Waiting(e.to_string()),
            }
        }
    })
    .await
}

// ---------------------------------------------------------------------------------------
// Room for every pod

/// Most pods one benchmark node holds (more pods take more nodes).
pub const PODS_PER_BENCH_NODE: usize = 5_000;
/// The label that marks the benchmark's nodes.
pub const BENCH_NODE_LABEL: &str = "bulkhead-e2e/bench-node";

/// Extra kwok nodes in the members, so that the benchmark's pods all fit (the lab's two
/// nodes per member hold 110 pods each). They carry the member's zone and region labels
/// like the lab's own nodes, and are deleted when this is dropped (after the pods of
/// `namespace`, when set, are gone or after three minutes), so other tests see the
/// lab's usual two nodes.
pub struct BenchNodes {
    /// (inside kubeconfig, node names) per member.
    nodes: Vec<(PathBuf, Vec<String>)>,
    /// The benchmark's namespace in the members, whose pods go before the nodes do.
    pub namespace: Option<String>,
}

impl BenchNodes {
    /// Adds nodes to each member of `pods` so it has room for that many more pods, and
    /// waits until kwok reports them Ready.
    pub async fn add(lab: &Lab, pods: &BTreeMap<String, usize>) -> Result<Self> {
        let mut added = BenchNodes {
            nodes: vec![],
            namespace: None,
        };
        for (member, wanted) in pods {
            let info = crate::lab::member(member)?;
            let client = lab.inside_client(member).await?;
            let api = Api::<Node>::all(client);
            let count = wanted.div_ceil(PODS_PER_BENCH_NODE).max(1);
            let per_node = wanted.div_ceil(count).max(1);
            let mut names = vec![];
            for n in 1..=count {
                let name = format!("{member}-bench-node-{n}");
                let resources = json!({"cpu": "1000", "memory": "4000Gi", "pods": per_node.to_string(), "ephemeral-storage": "1000Gi"});
                let node: Node = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                        "labels": {
                            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64", "type": "kwok", BENCH_NODE_LABEL: "true",
                            "topology.kubernetes.io/zone": info.zone,
                            "topology.kubernetes.io/region": info.region,
                        },
                    },
                    "status": {
                        "allocatable": resources, "capacity": resources,
                        "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                                     "kubeletVersion": "fake", "kubeProxyVersion": "fake"},
                    },
                }))?;
                match api.create(&PostParams::default(), &node).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.code == 409 => {
                        // Left by a run that crashed: give it this run's capacity.
                        api.patch_status(
                            &name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": {"allocatable": resources, "capacity": resources}})),
                        )
                        .await
                        .with_context(|| format!("resizing node {name} in {member}"))?;
                    }
                    Err(e) => {
                        return Err(e).with_context(|| format!("creating node {name} in {member}"));
                    }
                }
                names.push(name);
            }
            let check_names = names.clone();
            crate::wait_for(
                &format!("{member}'s benchmark nodes Ready"),
                Duration::from_secs(60),
                || {
                    let (api, names) = (api.clone(), check_names.clone());
                    async move {
                        let mut waiting = vec![];
                        for name in &names {
                            let ready = api.get_opt(name).await.ok().flatten().is_some_and(|n| {
                                n.status
                                    .and_then(|s| s.conditions)
                                    .unwrap_or_default()
                                    .iter()
                                    .any(|c| c.type_ == "Ready" && c.status == "True")
                            });
                            if !ready {
                                waiting.push(name.clone());
                            }
                        }
                        if waiting.is_empty() {
                            crate::Check::Done(())
                        } else {
                            crate::Check::Waiting(format!("not Ready: {waiting:?}"))
                        }
                    }
                },
            )
            .await?;
            eprintln!(
                "bench: {member}: {count} extra kwok node(s) with room for {per_node} pods each"
            );
            added.nodes.push((lab.inside_kubeconfig(member), names));
        }
        Ok(added)
    }
}

impl Drop for BenchNodes {
    fn drop(&mut self) {
        for (kubeconfig, names) in std::mem::take(&mut self.nodes) {
            let namespace = self.namespace.clone();
            cleanup_blocking(vec![kubeconfig], move |client| {
                let (names, namespace) = (names.clone(), namespace.clone());
                async move {
                    if let Some(namespace) = namespace {
                        let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
                        let deadline = Instant::now() + Duration::from_secs(180);
                        while Instant::now() < deadline {
                            match pods.list_metadata(&ListParams::default().limit(1)).await {
                                Ok(list) if list.items.is_empty() => break,
                                Err(_) => break,
                                Ok(_) => tokio::time::sleep(Duration::from_secs(2)).await,
                            }
                        }
                    }
                    let nodes = Api::<Node>::all(client);
                    for name in names {
                        let _ = nodes.delete(&name, &Default::default()).await;
                    }
                }
            });
        }
    }
}

// ---------------------------------------------------------------------------------------
// Settling

/// The hub's progress gauges (present once the federation rewrite is in).
pub const GAUGES: [(&str, f64); 3] = [
    ("bulkhead_hub_synced", 1.0),
    ("bulkhead_hub_queue_depth", 0.0),
    ("bulkhead_hub_pending_member_writes", 0.0),
];

/// Whether the progress gauges read synced/0/0; `None` when the hub has none of them.
pub fn gauges_settled(metrics: &Metrics) -> Option<bool> {
    let values: Vec<Option<f64>> = GAUGES.iter().map(|(n, _)| metrics.value(n)).collect();
    if values.iter().all(Option::is_none) {
        return None;
    }
    Some(
        GAUGES
            .iter()
            .zip(&values)
            .all(|((_, wanted), value)| *value == Some(*wanted)),
    )
}

/// When the hub settled, and its CPU time then.
#[derive(Clone, Debug)]
pub struct Settled {
    /// The start of the final quiet stretch: the gauges read synced/0/0 (when the hub
    /// has them) and no hub write counter moved from here on.
    pub at: Instant,
    pub cpu_seconds: Option<f64>,
    /// How it was decided, for the printout.
    pub how: String,
    /// `bulkhead_hub_writes_total` by `what` at the end.
    pub writes: BTreeMap<String, f64>,
}

/// Waits until the hub has settled: its progress gauges read synced / 0 / 0 (when it
/// exposes them) and `bulkhead_hub_writes_total` has not moved for `quiet` (template
/// status may wait up to 30 s, and a status write scheduled for later is not in the queue
/// depth). Returns the start of that quiet stretch.
pub async fn wait_settled(
    federation: &Federation,
    quiet: Duration,
    timeout: Duration,
) -> Result<Settled> {
    let started = Instant::now();
    let mut last_writes: Option<BTreeMap<String, f64>> = None;
    let mut since: Option<(Instant, Option<f64>)> = None;
    let mut have_gauges = false;
    loop {
        let now = Instant::now();
        let cpu = federation.hub_pid().and_then(cpu_seconds);
        let last_seen = match hub_metrics(federation).await {
            Ok(metrics) => {
                let gauges = gauges_settled(&metrics);
                have_gauges |= gauges.is_some();
                let writes = hub_writes(&metrics);
                let moved = last_writes.as_ref() != Some(&writes);
                if gauges == Some(false) || moved {
                    since = None;
                }
                if gauges != Some(false) && since.is_none() {
                    since = Some((now, cpu));
                }
                let seen = format!(
                    "gauges {:?}, writes {writes:?}",
                    GAUGES
                        .iter()
                        .map(|(n, _)| metrics.value(n))
                        .collect::<Vec<_>>()
                );
                last_writes = Some(writes);
                seen
            }
            Err(e) => {
                since = None;
                e.to_string()
            }
        };
        if let Some((at, cpu)) = since
            && at.elapsed() >= quiet
        {
            return Ok(Settled {
                at,
                cpu_seconds: cpu,
                how: if have_gauges {
                    format!(
                        "progress gauges synced/0/0 and hub write counters quiet for {} s",
                        quiet.as_secs()
                    )
                } else {
                    format!(
                        "hub write counters quiet for {} s (this hub has no progress gauges)",
                        quiet.as_secs()
                    )
                },
                writes: last_writes.unwrap_or_default(),
            });
        }
        if started.elapsed() > timeout {
            bail!("the hub did not settle within {timeout:?}; last seen: {last_seen}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Seconds from `started` until the hub first reads quiescent: the progress gauges
/// synced/0/0, or on a hub without them `bulkhead_hub_synced 1`, or on an older hub a
/// first completed scheduler pass. Returns the seconds and which criterion applied.
pub async fn wait_quiescent(
    federation: &Federation,
    started: Instant,
    timeout: Duration,
) -> Result<(f64, &'static str)> {
    loop {
        if let Ok(metrics) = hub_metrics(federation).await {
            let at = started.elapsed().as_secs_f64();
            match gauges_settled(&metrics) {
                Some(true) if GAUGES.iter().all(|(n, _)| metrics.value(n).is_some()) => {
                    return Ok((
                        at,
                        "bulkhead_hub_synced 1, queue depth 0, pending member writes 0",
                    ));
                }
                Some(true) => return Ok((at, "bulkhead_hub_synced 1 (no queue gauges)")),
                Some(false) => {}
                None => {
                    if metrics
                        .value("bulkhead_scheduler_pass_duration_seconds_count")
                        .is_some_and(|n| n >= 1.0)
                    {
                        return Ok((at, "first scheduler pass (old hub, no progress gauges)"));
                    }
                }
            }
        }
        if started.elapsed() > timeout {
            bail!("the hub was not quiescent within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_samples_histograms_and_request_counters() {
        let text = "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n\
# HELP bulkhead_hub_synced x\n\
bulkhead_hub_synced 1\n\
bulkhead_hub_writes_total{what=\"binding\"} 5\n\
bulkhead_hub_writes_total{what=\"finalizer\"} 2\n\
p_bucket{cluster=\"east\",le=\"0.1\"} 1\n\
p_bucket{cluster=\"east\",le=\"1.0\"} 9\n\
p_bucket{cluster=\"east\",le=\"+Inf\"} 10\n\
p_bucket{cluster=\"west\",le=\"0.1\"} 10\n\
p_bucket{cluster=\"west\",le=\"1.0\"} 10\n\
p_bucket{cluster=\"west\",le=\"+Inf\"} 10\n\
p_count{cluster=\"east\"} 10\n\
p_count{cluster=\"west\"} 10\n\
p_sum{cluster=\"east\"} 3\n\
p_sum{cluster=\"west\"} 0.5\n\
apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"apps\",resource=\"deployments\",scope=\"resource\",subresource=\"\",verb=\"POST\",version=\"v1\"} 500\n\
apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"apps\",resource=\"deployments\",scope=\"resource\",subresource=\"status\",verb=\"APPLY\",version=\"v1\"} 7\n\
apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"apps\",resource=\"deployments\",scope=\"namespace\",subresource=\"\",verb=\"LIST\",version=\"v1\"} 70\n\
apiserver_request_total{code=\"409\",component=\"apiserver\",dry_run=\"\",group=\"federation.example.com\",resource=\"resourcebindings\",scope=\"resource\",subresource=\"\",verb=\"APPLY\",version=\"v1alpha1\"} 3\n\
apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"events.k8s.io\",resource=\"events\",scope=\"resource\",subresource=\"\",verb=\"POST\",version=\"v1\"} 4\n";
        let m = Metrics::parse(text);
        assert_eq!(m.value("bulkhead_hub_synced"), Some(1.0));
        assert_eq!(gauges_settled(&m), Some(false));
        assert_eq!(hub_writes(&m)["binding"], 5.0);
        let all = m.histogram("p", |_| true);
        assert_eq!(all.count, 20.0);
        assert_eq!(all.quantile(0.5), Some(0.1));
        assert_eq!(all.quantile(0.99), Some(f64::INFINITY));
        let east = m.histogram("p", |l| l["cluster"] == "east");
        assert_eq!(east.quantile(0.5), Some(1.0));
        let before =
            Metrics::parse("p_bucket{cluster=\"east\",le=\"0.1\"} 1\np_count{cluster=\"east\"} 1");
        let since = east.minus(&before.histogram("p", |_| true));
        assert_eq!(since.count, 9.0);
        assert_eq!(since.quantile(0.1), Some(1.0));

        let writes = write_requests(&m);
        assert_eq!(writes.len(), 4, "{writes:?}");
        let split = HubApiWrites::between(
            &writes,
            &BTreeMap::new(),
            ("apps", "deployments"),
            &[("deployments POST", 500.0)],
        );
        assert_eq!(split.total(), 10.0, "{split:?}");
        assert_eq!(split.per_template["deployments/status APPLY"], 7.0);
        assert_eq!(
            split.failed[&("resourcebindings APPLY".to_string(), "409".to_string())],
            3.0
        );
        assert_eq!(split.other["events POST"], 4.0);
    }

    #[test]
    fn spreads_use_the_nearest_rank() {
        let values: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let s = Spread::of(values).unwrap();
        assert_eq!(s.p50, Duration::from_millis(50));
        assert_eq!(s.p99, Duration::from_millis(99));
        assert_eq!(s.max, Duration::from_millis(100));
        assert!(Spread::of(vec![]).is_none());
    }

    #[test]
    fn reads_this_process_from_proc() {
        let pid = std::process::id();
        assert!(cpu_seconds(pid).is_some());
        assert!(rss_mib(pid).unwrap() > 0.0);
    }
}
