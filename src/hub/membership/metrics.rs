//! The hub's membership metrics, registered in the process registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::metrics::Metrics;

/// Labels naming a member cluster.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub cluster: String,
}

/// Labels naming a zone.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ZoneLabels {
    pub zone: String,
}

/// Labels of a probe result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub cluster: String,
    /// healthy, unreachable, not_ready, credentials_invalid
    pub result: String,
}

/// Membership, health, zone and lease metrics.
#[derive(Clone)]
pub struct HubMetrics {
    pub probe_duration: Family<ProbeLabels, Histogram>,
    pub member_ready: Family<ClusterLabels, Gauge>,
    pub status_writes: Family<ClusterLabels, Counter>,
    pub zone_state: Family<ZoneLabels, Gauge>,
    pub frozen: Gauge,
    pub lease_renewals: Family<ClusterLabels, Counter>,
    pub lease_failures: Family<ClusterLabels, Counter>,
    /// Seconds until the hub's token for the member expires.
    pub token_expiry: Family<ClusterLabels, Gauge>,
    pub token_renewals: Counter,
}

impl HubMetrics {
    /// Creates the metrics and registers them in `metrics`.
    pub fn register(metrics: &Metrics) -> Self {
        let hub = HubMetrics {
            probe_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 14))
            }),
            member_ready: Family::default(),
            status_writes: Family::default(),
            zone_state: Family::default(),
            frozen: Gauge::default(),
            lease_renewals: Family::default(),
            lease_failures: Family::default(),
            token_expiry: Family::default(),
            token_renewals: Counter::default(),
        };
        metrics.register(
            "member_token_expiry_seconds",
            "Seconds until the hub's token for the member expires (renewed once a third of its lifetime is left)",
            hub.token_expiry.clone(),
        );
        metrics.register(
            "member_token_renewals",
            "Member tokens the hub renewed",
            hub.token_renewals.clone(),
        );
        metrics.register(
            "member_probe_duration_seconds",
            "Duration of /readyz probes of member API servers, by result",
            hub.probe_duration.clone(),
        );
        metrics.register(
            "member_ready",
            "1 while the member is Ready, 0 otherwise",
            hub.member_ready.clone(),
        );
        metrics.register(
            "member_status_writes",
            "MemberCluster status writes by the health prober (written only on change)",
            hub.status_writes.clone(),
        );
        metrics.register(
            "zone_state",
            "Disruption state per zone: 0 Normal, 1 PartialDisruption, 2 FullDisruption",
            hub.zone_state.clone(),
        );
        metrics.register(
            "hub_frozen",
            "1 while every zone is in FullDisruption and the hub freezes failover and eviction",
            hub.frozen.clone(),
        );
        metrics.register(
            "lease_renewals",
            "Fencing Lease renewals that succeeded, per member",
            hub.lease_renewals.clone(),
        );
        metrics.register(
            "lease_renewal_failures",
            "Fencing Lease renewals that failed or timed out, per member",
            hub.lease_failures.clone(),
        );
        hub
    }

    /// Drops the per-member series of a member that left.
    pub fn forget_member(&self, cluster: &str) {
        let labels = ClusterLabels {
            cluster: cluster.to_string(),
        };
        self.member_ready.remove(&labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_convention() {
        let metrics = Metrics::new("hub");
        let hub = HubMetrics::register(&metrics);
        let cluster = ClusterLabels {
            cluster: "east".into(),
        };
        hub.member_ready.get_or_create(&cluster).set(1);
        hub.lease_renewals.get_or_create(&cluster).inc();
        hub.lease_failures.get_or_create(&cluster).inc();
        hub.frozen.set(1);
        hub.zone_state
            .get_or_create(&ZoneLabels {
                zone: "zone-a".into(),
            })
            .set(2);
        hub.probe_duration
            .get_or_create(&ProbeLabels {
                cluster: "east".into(),
                result: "healthy".into(),
            })
            .observe(0.01);
        let text = metrics.encode();
        for line in [
            "bulkhead_member_ready{cluster=\"east\"} 1",
            "bulkhead_lease_renewals_total{cluster=\"east\"} 1",
            "bulkhead_lease_renewal_failures_total{cluster=\"east\"} 1",
            "bulkhead_hub_frozen 1",
            "bulkhead_zone_state{zone=\"zone-a\"} 2",
            "bulkhead_member_probe_duration_seconds_count{cluster=\"east\",result=\"healthy\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }
}
