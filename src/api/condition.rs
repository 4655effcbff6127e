//! Conditions in the `metav1.Condition` shape, shared by every status in Bulkhead.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition status values, as Kubernetes spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }

    /// `True` when `value` holds, `False` otherwise.
    pub fn from_bool(value: bool) -> Self {
        if value {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

/// Builds a condition stamped with the current time.
pub fn new_condition(
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: status.as_str().to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation,
        last_transition_time: Time(jiff::Timestamp::now()),
    }
}

/// Sets `condition` in `conditions`, replacing any condition of the same type.
///
/// `lastTransitionTime` is kept from the existing condition when its status did not
/// change, so the time says when the status last flipped, not when we last looked.
/// Returns true when anything a reader would notice changed (status, reason, message or
/// observedGeneration), which callers use to decide whether to write and emit an Event.
pub fn set_condition(conditions: &mut Vec<Condition>, mut condition: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(existing) => {
            if existing.status == condition.status {
                condition.last_transition_time = existing.last_transition_time.clone();
            }
            let changed = existing.status != condition.status
                || existing.reason != condition.reason
                || existing.message != condition.message
                || existing.observed_generation != condition.observed_generation;
            *existing = condition;
            changed
        }
        None => {
            conditions.push(condition);
            true
        }
    }
}

/// The condition of the given type, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when the condition of the given type is present with status `True`.
pub fn is_condition_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Time {
        Time(jiff::Timestamp::from_second(seconds).unwrap())
    }

    fn condition(status: ConditionStatus, reason: &str, time: i64) -> Condition {
        let mut c = new_condition("Ready", status, reason, "msg", Some(1));
        c.last_transition_time = at(time);
        c
    }

    #[test]
    fn adds_a_missing_condition() {
        let mut conditions = vec![];
        assert!(set_condition(
            &mut conditions,
            condition(ConditionStatus::True, "Healthy", 10)
        ));
        assert_eq!(conditions.len(), 1);
        assert!(is_condition_true(&conditions, "Ready"));
    }

    #[test]
    fn keeps_transition_time_when_status_is_unchanged() {
        let mut conditions = vec![condition(ConditionStatus::True, "Healthy", 10)];
        let changed = set_condition(
            &mut conditions,
            condition(ConditionStatus::True, "Healthy", 99),
        );
        assert!(
            !changed,
            "same status, reason, message and generation is no change"
        );
        assert_eq!(conditions[0].last_transition_time, at(10));
    }

    #[test]
    fn reason_change_without_status_change_is_reported_but_keeps_time() {
        let mut conditions = vec![condition(ConditionStatus::False, "Unreachable", 10)];
        let changed = set_condition(
            &mut conditions,
            condition(ConditionStatus::False, "NotReady", 20),
        );
        assert!(changed);
        assert_eq!(conditions[0].reason, "NotReady");
        assert_eq!(conditions[0].last_transition_time, at(10));
    }

    #[test]
    fn status_change_moves_transition_time() {
        let mut conditions = vec![condition(ConditionStatus::True, "Healthy", 10)];
        assert!(set_condition(
            &mut conditions,
            condition(ConditionStatus::False, "Unreachable", 20)
        ));
        assert_eq!(conditions[0].last_transition_time, at(20));
        assert!(!is_condition_true(&conditions, "Ready"));
    }

    #[test]
    fn new_generation_is_a_change() {
        let mut conditions = vec![condition(ConditionStatus::True, "Healthy", 10)];
        let mut next = condition(ConditionStatus::True, "Healthy", 20);
        next.observed_generation = Some(2);
        assert!(set_condition(&mut conditions, next));
        assert_eq!(conditions[0].observed_generation, Some(2));
        assert_eq!(conditions[0].last_transition_time, at(10));
    }

    #[test]
    fn replaces_only_the_matching_type() {
        let mut conditions = vec![
            condition(ConditionStatus::True, "Healthy", 10),
            new_condition("Fenced", ConditionStatus::False, "LeaseFresh", "", None),
        ];
        set_condition(
            &mut conditions,
            condition(ConditionStatus::False, "Unreachable", 20),
        );
        assert_eq!(conditions.len(), 2);
        assert_eq!(
            find_condition(&conditions, "Fenced").unwrap().reason,
            "LeaseFresh"
        );
    }
}
