//! Fresh positive evidence of each member (DESIGN.md section 5, "The hub suspects before
//! any agent fences").
//!
//! A member's `Ready` condition lags a cut by the probe thresholds (seconds), while its
//! agent fences at the lease duration: right after a cut the hub would still count the
//! member Ready, and a scale-down in that window could delete the reachable, writable
//! copies of a database and keep only the one that is about to be fenced. So a stateful
//! copy or claim is deleted or shrunk only while every cluster involved shows, at that
//! moment:
//! - a successful health probe, its last one, recent (the writer probes again right
//!   before the request);
//! - a successful fencing-lease renewal, its last one, within the renew interval;
//! - copy watches whose lists completed after the cluster was last suspect.
//!
//! One failed probe or renewal makes a cluster **suspect** at once, for stateful purposes
//! only: stateless failover still waits for the prober's thresholds. The rule itself is
//! the pure [`doubt`]; [`Evidence`] is the shared record the prober, the lease renewer and
//! the copy watches feed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// One observation: when, and whether it succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signal {
    pub at: Instant,
    pub ok: bool,
}

/// What the hub has observed of one member.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// The last health probe.
    pub probe: Option<Signal>,
    /// The last fencing-lease renewal (None: this replica has not renewed there yet, e.g.
    /// a standby).
    pub renewal: Option<Signal>,
    /// When the last successful renewal was answered (its write is no later).
    pub renewed_ok: Option<Instant>,
    /// The last failed probe or renewal.
    pub suspect_since: Option<Instant>,
    /// When the copy watches whose initial lists all completed were started.
    pub listed: Option<Instant>,
}

impl Record {
    /// Whether the copy watches should list again: the cluster was suspect after they
    /// were started, and it answers again (its last probe and renewal succeeded).
    pub fn relist_due(&self, watches_started: Instant) -> bool {
        self.suspect_since.is_some_and(|s| s >= watches_started)
            && self.probe.is_some_and(|p| p.ok)
            && self.renewal.is_none_or(|r| r.ok)
    }
}

/// How old a successful probe and renewal may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    pub probe: Duration,
    pub renewal: Duration,
}

/// A window as a user reads it. The messages carry no ages: they go into binding status,
/// and a message that changed at every reconcile would be a write at every reconcile.
fn seconds(window: Duration) -> String {
    format!("{:.1}s", window.as_secs_f64())
}

/// Why the hub does not have fresh positive evidence of `cluster` at `now` (None: it
/// has). The message is for the binding and the writer's log: it says what is missing.
pub fn doubt(
    cluster: &str,
    record: Option<&Record>,
    now: Instant,
    windows: Windows,
) -> Option<String> {
    let Some(record) = record else {
        return Some(format!("the hub has not probed {cluster} yet"));
    };
    let stale =
        |signal: &Signal, window: Duration| now.saturating_duration_since(signal.at) > window;
    match record.probe {
        None => return Some(format!("the hub has not probed {cluster} yet")),
        Some(Signal { ok: false, .. }) => {
            return Some(format!("{cluster}'s last health probe failed"));
        }
        Some(probe) if stale(&probe, windows.probe) => {
            return Some(format!(
                "{cluster}'s last successful health probe is older than {}",
                seconds(windows.probe)
            ));
        }
        Some(_) => {}
    }
    match record.renewal {
        None => {
            return Some(format!(
                "the hub has not renewed its fencing lease in {cluster} yet"
            ));
        }
        Some(Signal { ok: false, .. }) => {
            return Some(format!(
                "the fencing-lease renewal in {cluster} failed: its agent may be about to fence"
            ));
        }
        Some(renewal) if stale(&renewal, windows.renewal) => {
            return Some(format!(
                "the last confirmed fencing-lease renewal in {cluster} is older than {}",
                seconds(windows.renewal)
            ));
        }
        Some(_) => {}
    }
    match (record.listed, record.suspect_since) {
        (None, _) => Some(format!("{cluster}'s copies have not been listed yet")),
        (Some(listed), Some(suspect)) if listed <= suspect => Some(format!(
            "{cluster} was suspect and its copies have not been listed again since"
        )),
        _ => None,
    }
}

/// Every member's record, shared. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Evidence {
    records: Arc<Mutex<HashMap<String, Record>>>,
    /// The primary terms each member's last successful renewal carried.
    carried: Arc<Mutex<HashMap<String, Carried>>>,
    changed: watch::Sender<u64>,
    renew_interval: Duration,
    /// The fencing lease's duration (see [`Evidence::may_still_write`]).
    lease_duration: Duration,
    /// When this hub process began to keep evidence: a previous one may have renewed a
    /// member's Lease right before.
    since: Instant,
}

/// How long after its deadline an agent may take to have every primary demoted (the
/// agent's own bound), plus a margin for the watch that brings it the renewals.
pub const FENCE_ALLOWANCE: Duration = Duration::from_secs(3);

/// The primary terms a renewal carried (`namespace/name` -> term, see `terms`).
pub type Carried = Arc<Option<std::collections::BTreeMap<String, u64>>>;

impl Default for Evidence {
    fn default() -> Self {
        Evidence::new(Duration::from_secs(2))
    }
}

impl Evidence {
    /// Evidence judged against the fencing lease's `renew_interval`.
    pub fn new(renew_interval: Duration) -> Self {
        Evidence {
            records: Arc::default(),
            carried: Arc::default(),
            changed: watch::Sender::new(0),
            renew_interval,
            lease_duration: Duration::from_secs(10),
            since: Instant::now(),
        }
    }

    /// The fencing lease's renew interval.
    pub fn renew_interval(&self) -> Duration {
        self.renew_interval
    }

    fn update(&self, cluster: &str, change: impl FnOnce(&mut Record) -> bool) {
        let notify = {
            let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
            change(records.entry(cluster.to_string()).or_default())
        };
        if notify {
            self.changed.send_modify(|g| *g += 1);
        }
    }

    /// Records a health probe's outcome.
    pub fn probed(&self, cluster: &str, ok: bool) {
        self.observe(cluster, ok, |r| &mut r.probe);
    }

    /// Records a fencing-lease renewal's outcome.
    pub fn renewed(&self, cluster: &str, ok: bool) {
        self.observe(cluster, ok, |r| &mut r.renewal);
        if ok {
            let at = Instant::now();
            self.update(cluster, |record| {
                record.renewed_ok = Some(at);
                false
            });
        }
    }

    /// How long `cluster`'s agent may still let its primaries take writes: a full lease
    /// from the last renewal this hub saw succeed there (from when this hub started, when
    /// it has seen none: another one may have renewed just before), plus
    /// [`FENCE_ALLOWANCE`]. None: it has certainly fenced itself by now.
    pub fn may_still_write(&self, cluster: &str) -> Option<Duration> {
        let from = self
            .record(cluster)
            .and_then(|r| r.renewed_ok)
            .unwrap_or(self.since);
        (from + self.lease_duration + FENCE_ALLOWANCE)
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
    }

    /// The same evidence judged against a fencing lease of `lease_duration`.
    pub fn with_lease_duration(mut self, lease_duration: Duration) -> Self {
        self.lease_duration = lease_duration;
        self
    }

    /// Records a fencing-lease renewal's outcome and, when it succeeded, the primary
    /// terms it carried (the member's agent holds them from then on).
    pub fn renewed_carrying(&self, cluster: &str, ok: bool, terms: &Carried) {
        if ok {
            let changed = {
                let mut carried = self.carried.lock().unwrap_or_else(|p| p.into_inner());
                let before = carried.insert(cluster.to_string(), terms.clone());
                before.is_none_or(|before| before != *terms)
            };
            if changed {
                self.changed.send_modify(|g| *g += 1);
            }
        }
        self.renewed(cluster, ok);
    }

    /// Which of `members` may not hold primary term `term` (or a higher one) for
    /// `database` (`namespace/name`): those the hub has not renewed the Lease of yet (a hub
    /// that just started), and those whose last successful renewal did not carry it. A
    /// member whose last renewal failed is left out: its agent fences at the lease
    /// duration, and reads the terms from the first renewal that reaches it again before
    /// it unfences.
    pub fn lacking_term<'a>(
        &self,
        members: impl IntoIterator<Item = &'a str>,
        database: &str,
        term: u64,
    ) -> Vec<String> {
        let records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        let carried = self.carried.lock().unwrap_or_else(|p| p.into_inner());
        let mut lacking: Vec<String> = members
            .into_iter()
            .filter(|cluster| {
                let unreachable = records
                    .get(*cluster)
                    .and_then(|r| r.renewal)
                    .is_some_and(|r| !r.ok);
                let held = carried
                    .get(*cluster)
                    .and_then(|terms| terms.as_ref().as_ref()?.get(database).copied());
                !unreachable && held.is_none_or(|held| held < term)
            })
            .map(str::to_string)
            .collect();
        lacking.sort();
        lacking
    }

    fn observe(&self, cluster: &str, ok: bool, signal: fn(&mut Record) -> &mut Option<Signal>) {
        let at = Instant::now();
        self.update(cluster, |record| {
            let was_ok = signal(record).is_none_or(|s| s.ok);
            *signal(record) = Some(Signal { at, ok });
            if !ok {
                record.suspect_since = Some(at);
            }
            // Subscribers care about turns: newly suspect, or answering again.
            was_ok != ok
        });
    }

    /// Records that copy watches started at `started` have listed every kind.
    pub fn listed(&self, cluster: &str, started: Instant) {
        self.update(cluster, |record| {
            let newer = record.listed.is_none_or(|l| l < started);
            if newer {
                record.listed = Some(started);
            }
            newer
        });
    }

    /// Forgets a member that left.
    pub fn remove(&self, cluster: &str) {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(cluster);
        self.carried
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(cluster);
    }

    /// One member's record.
    pub fn record(&self, cluster: &str) -> Option<Record> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(cluster)
            .copied()
    }

    /// Why `cluster` lacks fresh positive evidence now, judged as a reconcile plans
    /// (None: it has it). A successful probe may be as old as the member's probe interval
    /// plus its timeout, a renewal twice the renew interval (one may be on its way); the
    /// writer checks again, strictly, right before the request ([`Evidence::doubt_strict`]).
    pub fn doubt(&self, cluster: &str, probe_every: Duration) -> Option<String> {
        let windows = Windows {
            probe: probe_every + Duration::from_secs(1),
            renewal: 2 * self.renew_interval,
        };
        doubt(
            cluster,
            self.record(cluster).as_ref(),
            Instant::now(),
            windows,
        )
    }

    /// [`Evidence::doubt`] as the writer asks it right before a stateful delete or
    /// shrink, after probing the member itself: the probe within `probe_within`, the
    /// renewal within the renew interval.
    pub fn doubt_strict(&self, cluster: &str, probe_within: Duration) -> Option<String> {
        let windows = Windows {
            probe: probe_within,
            renewal: self.renew_interval,
        };
        doubt(
            cluster,
            self.record(cluster).as_ref(),
            Instant::now(),
            windows,
        )
    }

    /// Wakes on every turn of a member (newly suspect, answering again, listed again).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOWS: Windows = Windows {
        probe: Duration::from_secs(2),
        renewal: Duration::from_secs(2),
    };

    fn ok(at: Instant) -> Option<Signal> {
        Some(Signal { at, ok: true })
    }

    fn fresh(now: Instant) -> Record {
        let start = now - Duration::from_secs(30);
        Record {
            probe: ok(now - Duration::from_millis(500)),
            renewal: ok(now - Duration::from_millis(500)),
            renewed_ok: Some(now - Duration::from_millis(500)),
            suspect_since: None,
            listed: Some(start),
        }
    }

    #[test]
    fn a_member_with_recent_probes_renewals_and_lists_is_trusted() {
        let now = Instant::now() + Duration::from_secs(60);
        assert_eq!(doubt("east", Some(&fresh(now)), now, WINDOWS), None);
    }

    #[test]
    fn one_failed_probe_or_renewal_makes_a_member_suspect_at_once() {
        let now = Instant::now() + Duration::from_secs(60);
        let failed = Some(Signal {
            at: now - Duration::from_millis(100),
            ok: false,
        });
        let probe = Record {
            probe: failed,
            ..fresh(now)
        };
        assert!(
            doubt("east", Some(&probe), now, WINDOWS)
                .is_some_and(|d| d.contains("health probe failed"))
        );
        let renewal = Record {
            renewal: failed,
            ..fresh(now)
        };
        assert!(
            doubt("east", Some(&renewal), now, WINDOWS)
                .is_some_and(|d| d.contains("fencing-lease renewal in east failed"))
        );
    }

    /// A cut with DROP: nothing fails until the request times out, but the evidence
    /// ages: the member is suspect once its last renewal is older than the window.
    #[test]
    fn evidence_older_than_its_window_is_no_evidence() {
        let now = Instant::now() + Duration::from_secs(60);
        let old = now - Duration::from_secs(3);
        let renewal = Record {
            renewal: ok(old),
            ..fresh(now)
        };
        assert!(
            doubt("east", Some(&renewal), now, WINDOWS)
                .is_some_and(|d| d.contains("last confirmed fencing-lease renewal"))
        );
        let probe = Record {
            probe: ok(old),
            ..fresh(now)
        };
        assert!(
            doubt("east", Some(&probe), now, WINDOWS)
                .is_some_and(|d| d.contains("last successful health probe"))
        );
    }

    #[test]
    fn after_a_suspicion_the_copies_must_be_listed_again() {
        let now = Instant::now() + Duration::from_secs(60);
        let suspect = now - Duration::from_secs(5);
        let mut record = Record {
            suspect_since: Some(suspect),
            ..fresh(now)
        };
        assert!(
            doubt("east", Some(&record), now, WINDOWS)
                .is_some_and(|d| d.contains("not been listed again"))
        );
        assert!(record.relist_due(now - Duration::from_secs(30)));
        record.listed = Some(suspect + Duration::from_millis(1));
        assert_eq!(doubt("east", Some(&record), now, WINDOWS), None);
        assert!(!record.relist_due(suspect + Duration::from_millis(1)));
    }

    #[test]
    fn nothing_known_is_no_evidence() {
        let now = Instant::now();
        assert!(doubt("east", None, now, WINDOWS).is_some());
        let no_renewal = Record {
            renewal: None,
            ..fresh(now + Duration::from_secs(60))
        };
        assert!(
            doubt(
                "east",
                Some(&no_renewal),
                now + Duration::from_secs(60),
                WINDOWS
            )
            .is_some()
        );
    }

    #[test]
    fn a_member_may_write_until_a_full_lease_after_the_last_renewal_that_succeeded() {
        let evidence = Evidence::new(Duration::from_millis(100))
            .with_lease_duration(Duration::from_millis(200));
        // Never renewed by this hub: counted from its start (another may have renewed).
        assert!(evidence.may_still_write("east").is_some());
        evidence.renewed("east", true);
        // One failed renewal changes nothing: the agent saw the last good one.
        evidence.renewed("east", false);
        let left = evidence.may_still_write("east").expect("not yet");
        assert!(
            left > Duration::from_millis(200)
                && left <= FENCE_ALLOWANCE + Duration::from_millis(200)
        );
        let past = Evidence {
            since: Instant::now() - Duration::from_secs(60),
            ..Evidence::new(Duration::from_millis(100))
                .with_lease_duration(Duration::from_millis(200))
        };
        assert_eq!(
            past.may_still_write("west"),
            None,
            "a lease and the allowance are over"
        );
    }

    #[test]
    fn a_term_is_held_by_every_member_whose_last_renewal_carried_it() {
        use std::collections::BTreeMap;
        let evidence = Evidence::default();
        let carrying = |term: u64| -> Carried {
            Arc::new(Some(BTreeMap::from([("shop/orders".to_string(), term)])))
        };
        let none: Carried = Arc::new(Some(BTreeMap::new()));
        let members = ["east", "west", "north", "south"];
        evidence.renewed_carrying("east", true, &carrying(2));
        evidence.renewed_carrying("west", true, &none);
        evidence.renewed_carrying("north", true, &carrying(3));
        evidence.probed("south", true);
        // South was never renewed (a hub that just started): it may not hold it.
        assert_eq!(
            evidence.lacking_term(members, "shop/orders", 2),
            ["south", "west"]
        );
        evidence.renewed_carrying("south", true, &carrying(2));
        assert_eq!(evidence.lacking_term(members, "shop/orders", 2), ["west"]);
        assert_eq!(
            evidence.lacking_term(members, "shop/orders", 3),
            ["east", "south", "west"]
        );
        assert_eq!(
            evidence.lacking_term(members, "shop/other", 2),
            ["east", "north", "south", "west"]
        );
        // A member the hub cannot reach is left out: it fences, and reads the terms from
        // the first renewal that reaches it; that renewal is what counts then.
        evidence.renewed_carrying("west", false, &carrying(2));
        assert!(evidence.lacking_term(members, "shop/orders", 2).is_empty());
        evidence.renewed_carrying("west", true, &carrying(2));
        assert!(evidence.lacking_term(members, "shop/orders", 2).is_empty());
        evidence.remove("east");
        assert_eq!(
            evidence.lacking_term(["east", "west"], "shop/orders", 2),
            ["east"],
            "a member forgotten is renewed anew before it counts"
        );
    }

    #[tokio::test]
    async fn the_shared_record_wakes_subscribers_on_turns_only() {
        let evidence = Evidence::new(Duration::from_secs(1));
        let mut changes = evidence.subscribe();
        changes.mark_unchanged();
        evidence.probed("east", true);
        evidence.probed("east", true);
        assert!(!changes.has_changed().unwrap(), "ok after ok is no turn");
        evidence.renewed("east", false);
        assert!(changes.has_changed().unwrap(), "newly suspect");
        changes.mark_unchanged();
        let record = evidence.record("east").unwrap();
        assert!(record.suspect_since.is_some());
        let started = Instant::now();
        evidence.listed("east", started);
        evidence.renewed("east", true);
        assert!(changes.has_changed().unwrap());
        // Probed, renewed, and listed by watches started after the suspicion: trusted.
        assert_eq!(evidence.doubt("east", Duration::from_secs(1)), None);
    }
}
