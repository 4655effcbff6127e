//! The zone controller: turns the probers' verdicts into per-zone disruption states
//! (written to each MemberCluster's `status.zoneState`, exported as a metric, announced
//! by Events) and into the hub's frozen state. The rules are pure, in [`crate::hub::membership::zones`].
//! Every replica computes the states (the frozen state guards failover the moment a
//! standby takes over); only the leader writes them and publishes Events.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource};
use tokio_util::sync::CancellationToken;

use crate::api::MemberCluster;
use crate::api::member_cluster::ZoneState;
use crate::hub::membership::health::Health;
use crate::hub::membership::members::{MemberSnapshot, Registry};
use crate::hub::membership::metrics::{HubMetrics, ZoneLabels};
use crate::hub::membership::prober::HealthBoard;
use crate::hub::membership::zones::{
    HubHealth, MemberZoneView, all_zones_down, next_hub_health, zone_state_value, zone_states,
};

/// The field manager of `status.zoneState` (the prober owns the rest of the status).
pub const ZONE_FIELD_MANAGER: &str = "bulkhead-hub-zones";
/// How often the controller re-checks even without a change (retries failed writes).
const RESYNC: Duration = Duration::from_secs(2);

/// What the zone controller needs.
#[derive(Clone)]
pub struct DisruptionContext {
    pub hub: Client,
    pub registry: Registry,
    pub board: HealthBoard,
    pub metrics: HubMetrics,
    pub recorder: Recorder,
    /// Published for every hub controller that must not evict while the hub is cut off.
    pub hub_health: Arc<ArcSwap<HubHealth>>,
    /// Only the leader writes.
    pub leadership: crate::leader::Leadership,
}

fn state_name(state: ZoneState) -> &'static str {
    match state {
        ZoneState::Normal => "Normal",
        ZoneState::PartialDisruption => "PartialDisruption",
        ZoneState::FullDisruption => "FullDisruption",
    }
}

async fn publish(
    context: &DisruptionContext,
    snapshot: &MemberSnapshot,
    names: &[&String],
    event: &Event,
) {
    for name in names {
        if let Some(handle) = snapshot.get(*name)
            && let Err(error) = context
                .recorder
                .publish(event, &handle.object.object_ref(&()))
                .await
        {
            tracing::warn!(member = %name, %error, "cannot publish an Event");
        }
    }
}

/// Runs until `shutdown`.
pub async fn run(context: DisruptionContext, shutdown: CancellationToken) {
    let mut board_changes = context.board.subscribe();
    let mut previous: Option<BTreeMap<String, ZoneState>> = None;
    let mut written: HashMap<String, (ZoneState, Option<jiff::Timestamp>)> = HashMap::new();
    let api = Api::<MemberCluster>::all(context.hub.clone());
    let mut leadership = context.leadership.clone();
    loop {
        let leading = leadership.is_leader();
        let snapshot = context.registry.snapshot();
        let entries = context.board.entries();
        let members: Vec<(&String, MemberZoneView)> = entries
            .iter()
            // A member not judged yet (Unknown) says nothing about its zone; counting it
            // as down would freeze a hub whose members just joined.
            .filter(|(name, entry)| snapshot.contains_key(*name) && entry.health != Health::Unknown)
            .map(|(name, entry)| {
                (
                    name,
                    MemberZoneView {
                        zone: entry.zone.clone(),
                        healthy: entry.health.is_healthy(),
                    },
                )
            })
            .collect();
        let states = zone_states(members.iter().map(|(_, view)| view));

        for (zone, state) in &states {
            context
                .metrics
                .zone_state
                .get_or_create(&ZoneLabels { zone: zone.clone() })
                .set(zone_state_value(*state));
            let before = previous.as_ref().and_then(|p| p.get(zone)).copied();
            if before.is_some_and(|b| b != *state)
                || (before.is_none() && *state != ZoneState::Normal)
            {
                let names: Vec<&String> = members
                    .iter()
                    .filter(|(_, v)| &v.zone == zone)
                    .map(|(n, _)| *n)
                    .collect();
                if *state == ZoneState::Normal {
                    tracing::info!(%zone, state = state_name(*state), "zone disruption state changed");
                } else {
                    tracing::warn!(%zone, state = state_name(*state), "zone disruption state changed");
                }
                let event = Event {
                    type_: if *state == ZoneState::Normal {
                        EventType::Normal
                    } else {
                        EventType::Warning
                    },
                    reason: format!("Zone{}", state_name(*state)),
                    note: Some(format!("zone {zone} is now {}", state_name(*state))),
                    action: "ZoneState".to_string(),
                    secondary: None,
                };
                if leading {
                    publish(&context, &snapshot, &names, &event).await;
                }
            }
        }
        if let Some(previous) = &previous {
            for zone in previous.keys().filter(|z| !states.contains_key(*z)) {
                context
                    .metrics
                    .zone_state
                    .remove(&ZoneLabels { zone: zone.clone() });
            }
        }

        let current = context.hub_health.load_full();
        let next = next_hub_health(&current, all_zones_down(&states), jiff::Timestamp::now());
        if next != *current {
            context.metrics.frozen.set(i64::from(next.frozen));
            let (type_, reason, note) = if next.frozen {
                tracing::error!(
                    "every zone is in FullDisruption: the hub assumes it is the one cut off and freezes failover and eviction"
                );
                (
                    EventType::Warning,
                    "HubFrozen",
                    "every zone is in FullDisruption; the hub freezes failover and eviction until a member is reachable again",
                )
            } else {
                tracing::warn!(
                    "a member is reachable again: the hub leaves the frozen state; every grace period restarts now"
                );
                (
                    EventType::Normal,
                    "HubUnfrozen",
                    "a member is reachable again; failover grace periods restart now",
                )
            };
            context.hub_health.store(Arc::new(next));
            let event = Event {
                type_,
                reason: reason.to_string(),
                note: Some(note.to_string()),
                action: "Freeze".to_string(),
                secondary: None,
            };
            let names: Vec<&String> = members.iter().map(|(n, _)| *n).collect();
            if leading {
                publish(&context, &snapshot, &names, &event).await;
            }
        }
        // The grace start goes with the zone state (one field manager, one apply that
        // always carries both), so a restarted hub counts grace periods from it too.
        let unfrozen_at = context.hub_health.load().unfrozen_at;
        if !leading {
            // A standby compares with what the leader recorded when it takes over.
            written.clear();
        }
        for (name, view) in members.iter().filter(|_| leading) {
            let desired = states[&view.zone];
            let status = snapshot.get(*name).and_then(|h| h.object.status.as_ref());
            let stored_grace = status
                .and_then(|s| s.failover_grace_start.as_ref())
                .map(|t| t.0);
            let grace = match (unfrozen_at, stored_grace) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            let recorded = written
                .get(*name)
                .copied()
                .or_else(|| status.and_then(|s| s.zone_state).map(|z| (z, stored_grace)));
            if recorded == Some((desired, grace)) {
                continue;
            }
            let mut status = serde_json::json!({"zoneState": desired});
            if let Some(grace) = grace {
                status["failoverGraceStart"] =
                    serde_json::to_value(Time(grace)).unwrap_or_default();
            }
            let body = serde_json::json!({
                "apiVersion": "federation.example.com/v1alpha1",
                "kind": "MemberCluster",
                "metadata": {"name": name},
                "status": status,
            });
            match api
                .patch_status(
                    name,
                    &PatchParams::apply(ZONE_FIELD_MANAGER).force(),
                    &Patch::Apply(&body),
                )
                .await
            {
                Ok(_) => {
                    written.insert((*name).clone(), (desired, grace));
                }
                Err(error) => tracing::warn!(member = %name, %error, "cannot write zoneState"),
            }
        }
        written.retain(|name, _| snapshot.contains_key(name));

        previous = Some(states);

        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = board_changes.changed() => if changed.is_err() { return },
            _ = leadership.changed() => {}
            _ = tokio::time::sleep(RESYNC) => {}
        }
    }
}
