//! Member health: the pure state machine that turns probe results into a health verdict
//! only past the thresholds of `spec.probe`, and the conditions and taint that verdict
//! means. The I/O (probing, writing status) lives in [`crate::hub::membership::prober`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::api::member_cluster::{ProbeSpec, TAINT_NOT_READY, TAINT_UNREACHABLE};
use crate::api::{ConditionStatus, find_condition, new_condition};

/// Condition type: the hub can reach and use the member.
pub const CONDITION_READY: &str = "Ready";
/// Condition type: the member's API server answers the hub at all.
pub const CONDITION_REACHABLE: &str = "Reachable";

/// Why a member is not healthy; each is a `Ready=False` reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// Probes time out or the connection is refused.
    Unreachable,
    /// `/readyz` answers, but not with 200.
    NotReady,
    /// The Secret is missing or unusable, or the API server answers 401/403.
    CredentialsInvalid,
    /// Another MemberCluster, registered earlier, points at the same cluster (the same
    /// kube-system namespace UID): the hub refuses this one, or both names would manage,
    /// and delete, the same objects.
    DuplicateCluster,
}

impl FailureKind {
    /// The CamelCase reason written into the conditions.
    pub fn reason(self) -> &'static str {
        match self {
            FailureKind::Unreachable => "Unreachable",
            FailureKind::NotReady => "NotReady",
            FailureKind::CredentialsInvalid => "CredentialsInvalid",
            FailureKind::DuplicateCluster => "DuplicateCluster",
        }
    }

    /// The hub taint this failure puts on the member. Credentials the hub cannot use make
    /// the member as unusable as an unreachable one, so they get the unreachable taint.
    pub fn taint_key(self) -> &'static str {
        match self {
            FailureKind::Unreachable | FailureKind::CredentialsInvalid => TAINT_UNREACHABLE,
            FailureKind::NotReady | FailureKind::DuplicateCluster => TAINT_NOT_READY,
        }
    }
}

/// The result of one probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// `/readyz` answered 200.
    Healthy,
    /// The probe failed for `kind`; `message` says how, for the condition message.
    Failed { kind: FailureKind, message: String },
}

/// The verdict the thresholds allow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Not enough probes yet to say either way.
    Unknown,
    Healthy,
    Unhealthy {
        kind: FailureKind,
        message: String,
    },
}

impl Health {
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }
}

/// Thresholds taken from `spec.probe`, clamped to at least one probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    pub failure: u32,
    pub success: u32,
}

impl From<&ProbeSpec> for Thresholds {
    fn from(probe: &ProbeSpec) -> Self {
        Thresholds {
            failure: probe.failure_threshold.max(1) as u32,
            success: probe.success_threshold.max(1) as u32,
        }
    }
}

/// Counts consecutive probe results and changes the verdict only past a threshold, so a
/// flap shorter than the threshold changes nothing.
#[derive(Clone, Debug)]
pub struct HealthTracker {
    health: Health,
    consecutive_failures: u32,
    consecutive_successes: u32,
}

impl HealthTracker {
    /// Starts from a known verdict, e.g. the one recorded in the status by a previous hub,
    /// so a hub restart does not flap anything.
    pub fn new(health: Health) -> Self {
        HealthTracker {
            health,
            consecutive_failures: 0,
            consecutive_successes: 0,
        }
    }

    pub fn health(&self) -> &Health {
        &self.health
    }

    /// Feeds one probe result; returns true when the verdict changed (including the failure
    /// kind or message of an unhealthy member).
    pub fn observe(&mut self, outcome: ProbeOutcome, thresholds: Thresholds) -> bool {
        let next = match outcome {
            ProbeOutcome::Healthy => {
                self.consecutive_failures = 0;
                self.consecutive_successes = self.consecutive_successes.saturating_add(1);
                if self.consecutive_successes >= thresholds.success {
                    Some(Health::Healthy)
                } else {
                    None
                }
            }
            ProbeOutcome::Failed { kind, message } => {
                self.consecutive_successes = 0;
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                if self.consecutive_failures >= thresholds.failure {
                    Some(Health::Unhealthy { kind, message })
                } else {
                    None
                }
            }
        };
        match next {
            // A new message for the same unreachability (timeout, refused, reset) is not
            // news: it would only churn status writes and Events while a member stays
            // cut off. Other failures have stable messages worth showing.
            Some(Health::Unhealthy { kind, .. })
                if kind == FailureKind::Unreachable && self.is_unhealthy_with(kind) =>
            {
                false
            }
            Some(next) if next != self.health => {
                self.health = next;
                true
            }
            _ => false,
        }
    }

    fn is_unhealthy_with(&self, kind: FailureKind) -> bool {
        matches!(&self.health, Health::Unhealthy { kind: current, .. } if *current == kind)
    }

    /// Sets the verdict at once, bypassing the thresholds: for facts that are not probe
    /// noise, such as a missing Secret.
    pub fn force(&mut self, health: Health) -> bool {
        self.consecutive_failures = 0;
        self.consecutive_successes = 0;
        if self.health == health {
            return false;
        }
        self.health = health;
        true
    }
}

/// The verdict a previous hub recorded in the conditions, for [`HealthTracker::new`].
pub fn health_from_conditions(conditions: &[Condition]) -> Health {
    match find_condition(conditions, CONDITION_READY) {
        Some(c) if c.status == "True" => Health::Healthy,
        Some(c) if c.status == "False" => {
            let kind = match c.reason.as_str() {
                "NotReady" => FailureKind::NotReady,
                "CredentialsInvalid" => FailureKind::CredentialsInvalid,
                _ => FailureKind::Unreachable,
            };
            Health::Unhealthy {
                kind,
                message: c.message.clone(),
            }
        }
        _ => Health::Unknown,
    }
}

/// The Ready and Reachable conditions for a verdict. Reachable is False only when the
/// API server does not answer at all.
pub fn conditions_for(health: &Health, generation: Option<i64>) -> [Condition; 2] {
    match health {
        Health::Unknown => [
            new_condition(
                CONDITION_READY,
                ConditionStatus::Unknown,
                "Probing",
                "waiting for enough probes to pass the thresholds",
                generation,
            ),
            new_condition(
                CONDITION_REACHABLE,
                ConditionStatus::Unknown,
                "Probing",
                "waiting for enough probes to pass the thresholds",
                generation,
            ),
        ],
        Health::Healthy => [
            new_condition(
                CONDITION_READY,
                ConditionStatus::True,
                "Healthy",
                "/readyz answers 200",
                generation,
            ),
            new_condition(
                CONDITION_REACHABLE,
                ConditionStatus::True,
                "Healthy",
                "the API server answers",
                generation,
            ),
        ],
        Health::Unhealthy { kind, message } => {
            let reachable = *kind != FailureKind::Unreachable;
            [
                new_condition(
                    CONDITION_READY,
                    ConditionStatus::False,
                    kind.reason(),
                    message.clone(),
                    generation,
                ),
                new_condition(
                    CONDITION_REACHABLE,
                    ConditionStatus::from_bool(reachable),
                    if reachable { "Answers" } else { "Unreachable" },
                    if reachable {
                        "the API server answers".to_string()
                    } else {
                        message.clone()
                    },
                    generation,
                ),
            ]
        }
    }
}

/// The hub taint a verdict calls for, if any.
pub fn wanted_taint(health: &Health) -> Option<&'static str> {
    match health {
        Health::Unhealthy { kind, .. } => Some(kind.taint_key()),
        Health::Healthy | Health::Unknown => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THRESHOLDS: Thresholds = Thresholds {
        failure: 3,
        success: 2,
    };

    fn fail() -> ProbeOutcome {
        ProbeOutcome::Failed {
            kind: FailureKind::Unreachable,
            message: "timed out".into(),
        }
    }

    #[test]
    fn a_flap_shorter_than_the_failure_threshold_changes_nothing() {
        let mut tracker = HealthTracker::new(Health::Healthy);
        for _ in 0..5 {
            assert!(!tracker.observe(fail(), THRESHOLDS));
            assert!(!tracker.observe(fail(), THRESHOLDS));
            assert!(!tracker.observe(ProbeOutcome::Healthy, THRESHOLDS));
        }
        assert_eq!(tracker.health(), &Health::Healthy);
    }

    #[test]
    fn failures_past_the_threshold_make_the_member_unhealthy_once() {
        let mut tracker = HealthTracker::new(Health::Healthy);
        assert!(!tracker.observe(fail(), THRESHOLDS));
        assert!(!tracker.observe(fail(), THRESHOLDS));
        assert!(tracker.observe(fail(), THRESHOLDS));
        assert!(!tracker.health().is_healthy());
        assert!(!tracker.observe(fail(), THRESHOLDS), "no change on the 4th");
        let other_message = ProbeOutcome::Failed {
            kind: FailureKind::Unreachable,
            message: "connection refused".into(),
        };
        assert!(
            !tracker.observe(other_message, THRESHOLDS),
            "same kind, new words"
        );
    }

    #[test]
    fn a_short_recovery_does_not_make_an_unhealthy_member_ready() {
        let mut tracker = HealthTracker::new(Health::Unhealthy {
            kind: FailureKind::Unreachable,
            message: "timed out".into(),
        });
        assert!(!tracker.observe(ProbeOutcome::Healthy, THRESHOLDS));
        assert!(!tracker.observe(fail(), THRESHOLDS));
        assert!(!tracker.observe(ProbeOutcome::Healthy, THRESHOLDS));
        assert!(!tracker.health().is_healthy());
        assert!(tracker.observe(ProbeOutcome::Healthy, THRESHOLDS));
        assert_eq!(tracker.health(), &Health::Healthy);
    }

    #[test]
    fn a_new_member_needs_the_thresholds_either_way() {
        let mut tracker = HealthTracker::new(Health::Unknown);
        assert!(!tracker.observe(ProbeOutcome::Healthy, THRESHOLDS));
        assert_eq!(tracker.health(), &Health::Unknown);
        assert!(tracker.observe(ProbeOutcome::Healthy, THRESHOLDS));
        let mut tracker = HealthTracker::new(Health::Unknown);
        tracker.observe(fail(), THRESHOLDS);
        tracker.observe(fail(), THRESHOLDS);
        assert_eq!(tracker.health(), &Health::Unknown);
        assert!(tracker.observe(fail(), THRESHOLDS));
    }

    #[test]
    fn the_reason_follows_the_latest_failure_once_unhealthy() {
        let mut tracker = HealthTracker::new(Health::Healthy);
        for _ in 0..3 {
            tracker.observe(fail(), THRESHOLDS);
        }
        let not_ready = ProbeOutcome::Failed {
            kind: FailureKind::NotReady,
            message: "/readyz answered 500".into(),
        };
        assert!(tracker.observe(not_ready, THRESHOLDS));
        assert_eq!(wanted_taint(tracker.health()), Some(TAINT_NOT_READY));
    }

    #[test]
    fn thresholds_of_one_act_at_once() {
        let one = Thresholds {
            failure: 1,
            success: 1,
        };
        let mut tracker = HealthTracker::new(Health::Healthy);
        assert!(tracker.observe(fail(), one));
        assert!(tracker.observe(ProbeOutcome::Healthy, one));
    }

    #[test]
    fn conditions_and_taints_match_the_verdict() {
        let [ready, reachable] = conditions_for(&Health::Healthy, Some(1));
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Healthy")
        );
        assert_eq!(reachable.status, "True");
        assert_eq!(wanted_taint(&Health::Healthy), None);

        let unreachable = Health::Unhealthy {
            kind: FailureKind::Unreachable,
            message: "timed out".into(),
        };
        let [ready, reachable] = conditions_for(&unreachable, Some(1));
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "Unreachable")
        );
        assert_eq!(reachable.status, "False");
        assert_eq!(wanted_taint(&unreachable), Some(TAINT_UNREACHABLE));

        let credentials = Health::Unhealthy {
            kind: FailureKind::CredentialsInvalid,
            message: "401".into(),
        };
        let [ready, reachable] = conditions_for(&credentials, None);
        assert_eq!(ready.reason, "CredentialsInvalid");
        assert_eq!(reachable.status, "True");
        assert_eq!(wanted_taint(&credentials), Some(TAINT_UNREACHABLE));
    }

    #[test]
    fn a_restarted_hub_starts_from_the_recorded_verdict() {
        let [ready, _] = conditions_for(
            &Health::Unhealthy {
                kind: FailureKind::NotReady,
                message: "500".into(),
            },
            None,
        );
        assert!(matches!(
            health_from_conditions(&[ready]),
            Health::Unhealthy {
                kind: FailureKind::NotReady,
                ..
            }
        ));
        assert_eq!(health_from_conditions(&[]), Health::Unknown);
    }
}
