//! Zone disruption and the hub's frozen state (the node lifecycle controller's rule,
//! lifted to clusters). Pure code: the inputs are member verdicts, the outputs states.

use std::collections::BTreeMap;

use jiff::Timestamp;

use crate::api::member_cluster::ZoneState;

/// Share of unhealthy members at or above which a zone with more than one member is in
/// PartialDisruption.
pub const PARTIAL_DISRUPTION_SHARE: f64 = 0.55;

/// One member as the zone rule sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberZoneView {
    pub zone: String,
    /// The member's verdict is Healthy. Members not judged yet (Unknown) are left out of
    /// the zone rule by the caller.
    pub healthy: bool,
}

/// The state of one zone from its members' verdicts.
pub fn zone_state(total: usize, healthy: usize) -> ZoneState {
    if total == 0 {
        return ZoneState::Normal;
    }
    let unhealthy = total - healthy;
    if healthy == 0 {
        ZoneState::FullDisruption
    } else if total > 1 && unhealthy as f64 / total as f64 >= PARTIAL_DISRUPTION_SHARE {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    }
}

/// The state of every zone that has members.
pub fn zone_states<'a>(
    members: impl IntoIterator<Item = &'a MemberZoneView>,
) -> BTreeMap<String, ZoneState> {
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for member in members {
        let entry = counts.entry(member.zone.clone()).or_default();
        entry.0 += 1;
        if member.healthy {
            entry.1 += 1;
        }
    }
    counts
        .into_iter()
        .map(|(zone, (total, healthy))| (zone, zone_state(total, healthy)))
        .collect()
}

/// True when there are zones and every one of them is in FullDisruption: then the hub
/// assumes it is the one cut off.
pub fn all_zones_down(states: &BTreeMap<String, ZoneState>) -> bool {
    !states.is_empty() && states.values().all(|s| *s == ZoneState::FullDisruption)
}

/// Whether the hub is frozen: while frozen, no failover or eviction may happen. Other
/// hub controllers read it from [`crate::hub::HubState`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HubHealth {
    /// Every zone is in FullDisruption.
    pub frozen: bool,
    /// When the current frozen period began.
    pub since: Option<Timestamp>,
    /// When the hub last left the frozen state. Grace periods (taint tolerations) count
    /// from `max(taint timeAdded, unfrozen_at)`, so each of them restarts after a freeze.
    pub unfrozen_at: Option<Timestamp>,
}

impl HubHealth {
    /// The moment a toleration that began at `tainted_at` starts counting: after the last
    /// freeze ended, if that is later.
    pub fn grace_start(&self, tainted_at: Timestamp) -> Timestamp {
        match self.unfrozen_at {
            Some(unfrozen) if unfrozen > tainted_at => unfrozen,
            _ => tainted_at,
        }
    }
}

/// The next hub health given whether every zone is down now. Returns the value unchanged
/// (equal) when nothing changed.
pub fn next_hub_health(previous: &HubHealth, all_down: bool, now: Timestamp) -> HubHealth {
    match (previous.frozen, all_down) {
        (false, true) => HubHealth {
            frozen: true,
            since: Some(now),
            unfrozen_at: previous.unfrozen_at,
        },
        (true, false) => HubHealth {
            frozen: false,
            since: None,
            unfrozen_at: Some(now),
        },
        _ => previous.clone(),
    }
}

/// Gauge value for a zone state: 0 Normal, 1 PartialDisruption, 2 FullDisruption.
pub fn zone_state_value(state: ZoneState) -> i64 {
    match state {
        ZoneState::Normal => 0,
        ZoneState::PartialDisruption => 1,
        ZoneState::FullDisruption => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(zone: &str, healthy: bool) -> MemberZoneView {
        MemberZoneView {
            zone: zone.into(),
            healthy,
        }
    }

    #[test]
    fn zone_state_follows_the_share_of_unhealthy_members() {
        assert_eq!(zone_state(1, 1), ZoneState::Normal);
        assert_eq!(zone_state(1, 0), ZoneState::FullDisruption);
        assert_eq!(zone_state(2, 1), ZoneState::Normal, "50% is below 55%");
        assert_eq!(zone_state(3, 1), ZoneState::PartialDisruption, "67%");
        assert_eq!(
            zone_state(20, 9),
            ZoneState::PartialDisruption,
            "55% exactly"
        );
        assert_eq!(zone_state(20, 10), ZoneState::Normal, "50%");
        assert_eq!(zone_state(3, 0), ZoneState::FullDisruption);
        assert_eq!(zone_state(0, 0), ZoneState::Normal);
    }

    #[test]
    fn zones_are_judged_separately() {
        let members = [
            view("zone-a", false),
            view("zone-b", true),
            view("zone-c", true),
            view("zone-c", false),
        ];
        let states = zone_states(&members);
        assert_eq!(states["zone-a"], ZoneState::FullDisruption);
        assert_eq!(states["zone-b"], ZoneState::Normal);
        assert_eq!(states["zone-c"], ZoneState::Normal);
        assert!(!all_zones_down(&states));
    }

    #[test]
    fn the_hub_freezes_only_when_every_zone_is_down() {
        let down = zone_states(&[view("zone-a", false), view("zone-b", false)]);
        assert!(all_zones_down(&down));
        let one_up = zone_states(&[view("zone-a", false), view("zone-b", true)]);
        assert!(!all_zones_down(&one_up));
        assert!(
            !all_zones_down(&BTreeMap::new()),
            "no members: nothing to freeze"
        );
    }

    #[test]
    fn freezing_and_thawing_record_their_times() {
        let t = |s| Timestamp::from_second(s).unwrap();
        let calm = HubHealth::default();
        assert_eq!(next_hub_health(&calm, false, t(10)), calm);
        let frozen = next_hub_health(&calm, true, t(20));
        assert!(frozen.frozen);
        assert_eq!(frozen.since, Some(t(20)));
        assert_eq!(
            next_hub_health(&frozen, true, t(30)),
            frozen,
            "stays frozen"
        );
        let thawed = next_hub_health(&frozen, false, t(40));
        assert!(!thawed.frozen);
        assert_eq!(thawed.unfrozen_at, Some(t(40)));
        assert_eq!(thawed.since, None);
        // Grace periods restart at the thaw.
        assert_eq!(thawed.grace_start(t(5)), t(40));
        assert_eq!(thawed.grace_start(t(50)), t(50));
        assert_eq!(calm.grace_start(t(5)), t(5));
    }
}
