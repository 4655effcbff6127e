//! Prometheus metrics shared by every long-running process. Names follow
//! `bulkhead_<area>_<what>_<unit>`.

use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

/// Labels naming a controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

/// Labels of the build-info gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    process: String,
}

/// One subsystem metric: name (without the prefix), help text, the metric.
type SubsystemMetric = (String, String, Box<dyn Metric>);

/// The subsystems' metrics, encoded after the process-wide ones on every scrape.
#[derive(Debug, Default)]
struct Subsystems(RwLock<Vec<SubsystemMetric>>);

impl Collector for Subsystems {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let metrics = self
            .0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for (name, help, metric) in metrics.iter().filter(|(_, _, m)| !m.is_empty()) {
            let metric_encoder = encoder.encode_descriptor(
                name,
                help,
                None,
                EncodeMetric::metric_type(metric.as_ref()),
            )?;
            metric.encode(metric_encoder)?;
        }
        Ok(())
    }
}

/// The registry and the metrics every process has. Subsystems register their own with
/// [`Metrics::register`].
pub struct Metrics {
    registry: RwLock<Registry>,
    subsystems: Arc<Subsystems>,
    /// Reconciles run, per controller.
    pub reconciles: Family<ControllerLabels, Counter>,
    /// Reconciles that returned an error, per controller.
    pub reconcile_errors: Family<ControllerLabels, Counter>,
    /// Reconcile duration, per controller.
    pub reconcile_duration: Family<ControllerLabels, Histogram>,
}

impl Metrics {
    /// Creates the registry for `process` (hub, agent, webhook).
    pub fn new(process: &str) -> Self {
        let mut registry = Registry::with_prefix("bulkhead");
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
                process: process.to_string(),
            })
            .set(1);
        registry.register(
            "build_info",
            "Bulkhead version and process, always 1",
            build_info,
        );

        let reconciles = Family::<ControllerLabels, Counter>::default();
        registry.register(
            "controller_reconciles",
            "Reconciles run, per controller",
            reconciles.clone(),
        );
        let reconcile_errors = Family::<ControllerLabels, Counter>::default();
        registry.register(
            "controller_reconcile_errors",
            "Reconciles that failed, per controller",
            reconcile_errors.clone(),
        );
        let reconcile_duration =
            Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 14))
            });
        registry.register(
            "controller_reconcile_duration_seconds",
            "Time spent in one reconcile, per controller",
            reconcile_duration.clone(),
        );

        let subsystems = Arc::new(Subsystems::default());
        registry.register_collector(Box::new(subsystems.clone()));

        Metrics {
            registry: RwLock::new(registry),
            subsystems,
            reconciles,
            reconcile_errors,
            reconcile_duration,
        }
    }

    /// Registers a subsystem's metric under `bulkhead_<name>`. Registering a name again
    /// replaces the earlier metric: a subsystem started again in the same process (the
    /// federation controller when a hub regains leadership) exports its new counters, not
    /// two series of one name (which Prometheus refuses).
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        let mut metrics = self
            .subsystems
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = (
            name.to_string(),
            format!("{help}."),
            Box::new(metric) as Box<dyn Metric>,
        );
        match metrics.iter_mut().find(|(existing, _, _)| existing == name) {
            Some(slot) => *slot = entry,
            None => metrics.push(entry),
        }
    }

    /// Encodes every metric in the OpenMetrics text format Prometheus scrapes.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self
            .registry
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// Records one reconcile of `controller` that took `seconds` and succeeded or not.
    pub fn observe_reconcile(&self, controller: &str, seconds: f64, ok: bool) {
        let labels = ControllerLabels {
            controller: controller.to_string(),
        };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_duration
            .get_or_create(&labels)
            .observe(seconds);
        if !ok {
            self.reconcile_errors.get_or_create(&labels).inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_build_info_and_reconcile_counters() {
        let metrics = Metrics::new("hub");
        metrics.observe_reconcile("membercluster", 0.01, true);
        metrics.observe_reconcile("membercluster", 0.02, false);
        let text = metrics.encode();
        assert!(text.contains("bulkhead_build_info{version=\""), "{text}");
        assert!(text.contains("process=\"hub\"} 1"), "{text}");
        assert!(
            text.contains("bulkhead_controller_reconciles_total{controller=\"membercluster\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "bulkhead_controller_reconcile_errors_total{controller=\"membercluster\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("bulkhead_controller_reconcile_duration_seconds_count{controller=\"membercluster\"} 2"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn subsystems_register_their_own_metrics() {
        let metrics = Metrics::new("agent");
        let fenced = Gauge::<i64>::default();
        metrics.register(
            "agent_fenced",
            "1 while the agent is fenced",
            fenced.clone(),
        );
        fenced.set(1);
        assert!(metrics.encode().contains("bulkhead_agent_fenced 1"));
    }

    #[test]
    fn registering_a_name_again_replaces_the_metric() {
        let metrics = Metrics::new("hub");
        let first = Counter::<u64>::default();
        metrics.register("hub_writes", "Writes", first.clone());
        first.inc();
        let second = Counter::<u64>::default();
        metrics.register("hub_writes", "Writes", second.clone());
        second.inc_by(5);
        let text = metrics.encode();
        assert_eq!(
            text.matches("# TYPE bulkhead_hub_writes counter").count(),
            1,
            "{text}"
        );
        assert!(text.contains("bulkhead_hub_writes_total 5"), "{text}");
        assert!(
            text.contains("# HELP bulkhead_hub_writes Writes."),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
