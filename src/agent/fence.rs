//! The member's half of the fencing protocol: watch the hub's Lease and decide, by this
//! agent's own monotonic clock, whether the hub is still there.
//!
//! Freshness is the time since the agent last saw `renewTime` *change*; two machines'
//! clocks are never compared. Stale for the lease duration -> fenced. Fresh again for
//! `unfence_after` -> unfenced. An agent starts fenced and unfences only once it has seen
//! the hub renew (a value already present at start proves nothing about now).

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The fence decision, as a pure state machine over observations and instants.
#[derive(Debug, Clone)]
pub struct FenceTracker {
    lease_duration: Duration,
    unfence_after: Duration,
    last_renew_time: Option<MicroTime>,
    /// When this agent last saw `renewTime` change.
    last_change: Option<Instant>,
    /// Start of the current unbroken fresh streak while fenced.
    fresh_since: Option<Instant>,
    /// The initial list completed once (so a Lease appearing later is a change).
    synced: bool,
    fenced: bool,
}

impl FenceTracker {
    /// Starts fenced. `lease_duration` is used until the Lease states its own.
    pub fn new(lease_duration: Duration, unfence_after: Duration) -> Self {
        FenceTracker {
            lease_duration,
            unfence_after,
            last_renew_time: None,
            last_change: None,
            fresh_since: None,
            synced: false,
            fenced: true,
        }
    }

    /// Records the Lease as seen at `now`.
    pub fn observe(
        &mut self,
        renew_time: Option<&MicroTime>,
        lease_duration: Option<Duration>,
        now: Instant,
    ) {
        if let Some(duration) = lease_duration.filter(|d| !d.is_zero()) {
            self.lease_duration = duration;
        }
        let Some(renew_time) = renew_time else { return };
        let changed = match &self.last_renew_time {
            Some(previous) => previous != renew_time,
            // A value in the very first list is a baseline: it may be hours old.
            None => self.synced,
        };
        self.last_renew_time = Some(renew_time.clone());
        if changed {
            self.last_change = Some(now);
            if self.fenced && self.fresh_since.is_none() {
                self.fresh_since = Some(now);
            }
        }
    }

    /// The initial list of Leases is complete.
    pub fn mark_synced(&mut self) {
        self.synced = true;
    }

    /// The Lease was deleted: only a new renewal counts from now on.
    pub fn observe_deleted(&mut self) {
        self.last_renew_time = None;
    }

    fn is_fresh(&self, now: Instant) -> bool {
        self.last_change
            .is_some_and(|changed| now.saturating_duration_since(changed) < self.lease_duration)
    }

    /// Updates and returns the decision at `now`: true means fenced.
    pub fn evaluate(&mut self, now: Instant) -> bool {
        if !self.is_fresh(now) {
            self.fenced = true;
            self.fresh_since = None;
        } else if self.fenced
            && self
                .fresh_since
                .is_some_and(|since| now.saturating_duration_since(since) >= self.unfence_after)
        {
            self.fenced = false;
            self.fresh_since = None;
        }
        self.fenced
    }

    /// When the decision can next change without a new observation.
    pub fn next_deadline(&self, now: Instant) -> Option<Instant> {
        if !self.is_fresh(now) {
            return None;
        }
        let stale_at = self.last_change? + self.lease_duration;
        match (self.fenced, self.fresh_since) {
            (true, Some(since)) => Some(stale_at.min(since + self.unfence_after)),
            _ => Some(stale_at),
        }
    }

    /// The duration in force.
    pub fn lease_duration(&self) -> Duration {
        self.lease_duration
    }
}

/// Where the Lease lives and how to judge it.
#[derive(Clone, Debug)]
pub struct FenceSettings {
    pub namespace: String,
    pub name: String,
    pub lease_duration: Duration,
    pub unfence_after: Duration,
}

/// Watches the Lease and publishes the decision on `fenced` until shutdown.
pub async fn watch_lease(
    client: Client,
    settings: FenceSettings,
    fenced: watch::Sender<bool>,
    terms: crate::agent::instances::Terms,
    recorder: Recorder,
    shutdown: CancellationToken,
) {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", settings.name));
    let mut events = watcher::watcher(api, config)
        .backoff(crate::client::WatchBackoff::default())
        .boxed();
    let mut tracker = FenceTracker::new(settings.lease_duration, settings.unfence_after);
    let lease_ref = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("coordination.k8s.io/v1".into()),
        kind: Some("Lease".into()),
        namespace: Some(settings.namespace.clone()),
        name: Some(settings.name.clone()),
        ..Default::default()
    };
    tracing::info!(lease = %format!("{}/{}", settings.namespace, settings.name), "fence watcher started: fenced until the hub is seen renewing its lease");
    loop {
        let now = Instant::now();
        let decision = tracker.evaluate(now);
        if *fenced.borrow() != decision {
            fenced.send_replace(decision);
            let (reason, note) = if decision {
                (
                    "Fenced",
                    format!(
                        "the hub's lease has not been renewed for {:?}: every MyDatabase in this cluster serves read-only",
                        tracker.lease_duration()
                    ),
                )
            } else {
                (
                    "Unfenced",
                    format!(
                        "the hub renewed its lease for {:?}: MyDatabases serve writes again (unless spec.readOnly)",
                        settings.unfence_after
                    ),
                )
            };
            tracing::warn!(fenced = decision, "{note}");
            let event = Event {
                type_: if decision {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: reason.into(),
                note: Some(note),
                action: "Fence".into(),
                secondary: None,
            };
            if let Err(error) = recorder.publish(&event, &lease_ref).await {
                tracing::debug!(%error, "cannot publish the fence event");
            }
        }
        let wake = tracker
            .next_deadline(now)
            .map(|deadline| deadline + Duration::from_millis(5))
            .unwrap_or(now + Duration::from_secs(3600));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep_until(wake.into()) => {}
            event = events.next() => match event {
                Some(Ok(WatchEvent::Apply(lease) | WatchEvent::InitApply(lease))) => {
                    // Read before the renewal counts: an unfence never comes before the
                    // terms that came with it.
                    let carried = primary_terms(&lease);
                    if **terms.load() != carried {
                        tracing::warn!(terms = ?carried, "the hub's lease carries primary terms: copies written under a lower one stay read-only");
                        terms.store(std::sync::Arc::new(carried));
                        // Every MyDatabase is looked at again (a deposed copy's status
                        // and -rw Service), as when the fence turns.
                        fenced.send_modify(|_| {});
                    }
                    let spec = lease.spec.unwrap_or_default();
                    let duration = spec.lease_duration_seconds.map(|s| Duration::from_secs(s.max(0) as u64));
                    tracker.observe(spec.renew_time.as_ref(), duration, Instant::now());
                }
                Some(Ok(WatchEvent::Delete(_))) => tracker.observe_deleted(),
                Some(Ok(WatchEvent::InitDone)) => tracker.mark_synced(),
                Some(Ok(WatchEvent::Init)) => {}
                Some(Err(error)) => tracing::warn!(%error, "watching the hub's lease failed; retrying"),
                None => return,
            },
        }
    }
}

/// The primary terms the hub's Lease carries (annotation
/// `federation.example.com/primary-terms`); none when absent. Entries that do not parse are
/// skipped, and only terms above 1 count (1 is every copy's).
pub fn primary_terms(lease: &Lease) -> crate::agent::builders::PrimaryTerms {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::api::ANNOTATION_PRIMARY_TERMS))
        .and_then(|json| {
            serde_json::from_str::<std::collections::BTreeMap<String, serde_json::Value>>(json)
                .map_err(|error| tracing::warn!(%error, "the hub's lease carries primary terms that do not parse"))
                .ok()
        })
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(key, term)| Some((key, term.as_u64().filter(|t| *t > 1)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_carries_primary_terms_above_1() {
        let mut lease = Lease::default();
        assert!(primary_terms(&lease).is_empty());
        lease.metadata.annotations = Some(
            [(
                crate::api::ANNOTATION_PRIMARY_TERMS.to_string(),
                r#"{"shop/orders": 3, "shop/ledger": 1, "shop/bad": "x"}"#.to_string(),
            )]
            .into(),
        );
        assert_eq!(
            primary_terms(&lease),
            [("shop/orders".to_string(), 3)].into()
        );
    }

    fn renewal(second: i64) -> MicroTime {
        MicroTime(jiff::Timestamp::from_second(1_800_000_000 + second).unwrap())
    }

    const LEASE: Duration = Duration::from_secs(10);
    const UNFENCE: Duration = Duration::from_secs(4);

    fn s(seconds: f64) -> Duration {
        Duration::from_secs_f64(seconds)
    }

    #[test]
    fn starts_fenced_and_a_value_present_at_start_proves_nothing() {
        let t0 = Instant::now();
        let mut tracker = FenceTracker::new(LEASE, UNFENCE);
        assert!(tracker.evaluate(t0));
        tracker.observe(Some(&renewal(0)), Some(LEASE), t0);
        tracker.mark_synced();
        assert!(
            tracker.evaluate(t0 + s(5.0)),
            "an old renewTime is not freshness"
        );
        assert_eq!(tracker.next_deadline(t0), None);
    }

    #[test]
    fn unfences_after_being_fresh_for_unfence_after() {
        let t0 = Instant::now();
        let mut tracker = FenceTracker::new(LEASE, UNFENCE);
        tracker.observe(Some(&renewal(0)), Some(LEASE), t0);
        tracker.mark_synced();
        // The hub renews every 2 s.
        tracker.observe(Some(&renewal(2)), Some(LEASE), t0 + s(2.0));
        assert!(tracker.evaluate(t0 + s(2.0)));
        assert_eq!(tracker.next_deadline(t0 + s(2.0)), Some(t0 + s(6.0)));
        tracker.observe(Some(&renewal(4)), Some(LEASE), t0 + s(4.0));
        assert!(tracker.evaluate(t0 + s(5.9)), "fresh for 3.9 s only");
        assert!(!tracker.evaluate(t0 + s(6.0)), "fresh for 4 s: unfenced");
    }

    #[test]
    fn fences_exactly_at_the_lease_deadline_by_its_own_clock() {
        let t0 = Instant::now();
        let mut tracker = FenceTracker::new(LEASE, UNFENCE);
        tracker.mark_synced();
        for i in 0..=3 {
            tracker.observe(Some(&renewal(i * 2)), None, t0 + s(i as f64 * 2.0));
        }
        assert!(!tracker.evaluate(t0 + s(6.0)));
        // Last change seen at t0+6: stale at t0+16, whatever the renewTime values say.
        assert_eq!(tracker.next_deadline(t0 + s(7.0)), Some(t0 + s(16.0)));
        assert!(!tracker.evaluate(t0 + s(15.99)));
        assert!(tracker.evaluate(t0 + s(16.0)));
    }

    #[test]
    fn the_same_renew_time_seen_again_is_not_a_renewal() {
        let t0 = Instant::now();
        let mut tracker = FenceTracker::new(LEASE, UNFENCE);
        tracker.mark_synced();
        tracker.observe(Some(&renewal(0)), None, t0);
        tracker.observe(Some(&renewal(2)), None, t0 + s(2.0));
        tracker.evaluate(t0 + s(6.0));
        // A relist re-delivers the same object many times.
        for i in 3..20 {
            tracker.observe(Some(&renewal(2)), None, t0 + s(i as f64));
        }
        assert!(
            tracker.evaluate(t0 + s(12.0)),
            "stale 10 s after the last real change"
        );
    }

    #[test]
    fn a_lease_created_after_start_counts_as_a_renewal() {
        let t0 = Instant::now();
        let mut tracker = FenceTracker::new(LEASE, UNFENCE);
        tracker.mark_synced(); // the initial list was empty
        tracker.observe(Some(&renewal(0)), None, t0);
        assert!(
            tracker.evaluate(t0),
            "one renewal is not yet unfence_after of freshness"
        );
        assert!(
            !tracker.evaluate(t0 + s(4.0)),
            "fresh for unfence_after since creation"
        );
    }

    #[test]
    fn a_gap_shorter_than_the_lease_keeps_it_unfenced_and_a_break_restarts_the_streak() {
        let t0 = Instant::now();
        let mut tracker = FenceTracker::new(LEASE, UNFENCE);
        tracker.mark_synced();
        tracker.observe(Some(&renewal(0)), None, t0);
        assert!(!tracker.evaluate(t0 + s(4.0)));
        // 9 s without renewal: still fine.
        tracker.observe(Some(&renewal(13)), None, t0 + s(9.0));
        assert!(!tracker.evaluate(t0 + s(9.0)));
        // 10 s without renewal: fenced; the first renewal after starts a new streak.
        assert!(tracker.evaluate(t0 + s(19.0)));
        tracker.observe(Some(&renewal(30)), None, t0 + s(30.0));
        assert!(tracker.evaluate(t0 + s(31.0)));
        assert_eq!(tracker.next_deadline(t0 + s(31.0)), Some(t0 + s(34.0)));
        assert!(!tracker.evaluate(t0 + s(34.0)));
    }

    #[test]
    fn the_leases_own_duration_is_used() {
        let t0 = Instant::now();
        let mut tracker = FenceTracker::new(LEASE, UNFENCE);
        tracker.mark_synced();
        tracker.observe(Some(&renewal(0)), Some(Duration::from_secs(3)), t0);
        assert!(tracker.evaluate(t0 + s(3.0)), "3 s lease: stale at 3 s");
    }

    #[test]
    fn deletion_then_recreation_counts_as_a_renewal() {
        let t0 = Instant::now();
        let mut tracker = FenceTracker::new(LEASE, UNFENCE);
        tracker.mark_synced();
        tracker.observe(Some(&renewal(0)), None, t0);
        tracker.observe_deleted();
        tracker.observe(Some(&renewal(0)), None, t0 + s(8.0));
        assert!(!tracker.evaluate(t0 + s(17.0)), "last change at 8 s");
    }
}
