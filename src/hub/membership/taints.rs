//! Taint bookkeeping: the hub adds and removes only its own taints in
//! `MemberCluster.spec.taints` and keeps every user taint as it is.

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::member_cluster::{TAINT_NOT_READY, TAINT_UNREACHABLE};

/// The taint keys the hub owns.
pub const HUB_TAINT_KEYS: [&str; 2] = [TAINT_UNREACHABLE, TAINT_NOT_READY];

/// True for a taint the hub manages.
pub fn is_hub_taint(taint: &Taint) -> bool {
    HUB_TAINT_KEYS.contains(&taint.key.as_str())
}

/// The taint list with exactly the hub taint `wanted` (or none): user taints are kept in
/// place, a hub taint that should stay keeps its `timeAdded` (tolerations count from it),
/// a new one is added with `now`. Returns `None` when nothing changes, so callers write
/// only on change.
pub fn reconcile_taints(current: &[Taint], wanted: Option<&str>, now: Time) -> Option<Vec<Taint>> {
    let mut next: Vec<Taint> = current
        .iter()
        .filter(|t| !is_hub_taint(t) || (Some(t.key.as_str()) == wanted && t.effect == "NoExecute"))
        .cloned()
        .collect();
    if let Some(key) = wanted {
        match next.iter_mut().find(|t| t.key == key) {
            Some(existing) if existing.time_added.is_none() => existing.time_added = Some(now),
            Some(_) => {}
            None => next.push(Taint {
                key: key.to_string(),
                effect: "NoExecute".to_string(),
                time_added: Some(now),
                value: None,
            }),
        }
    }
    (next != current).then_some(next)
}

/// When the hub taint `key` was added, if present.
pub fn taint_added_at<'a>(taints: &'a [Taint], key: &str) -> Option<&'a Time> {
    taints
        .iter()
        .find(|t| t.key == key)
        .and_then(|t| t.time_added.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Time {
        Time(jiff::Timestamp::from_second(seconds).unwrap())
    }

    fn user_taint() -> Taint {
        Taint {
            key: "example.com/maintenance".into(),
            effect: "NoSchedule".into(),
            value: Some("true".into()),
            time_added: None,
        }
    }

    #[test]
    fn adds_the_hub_taint_with_its_time_and_keeps_user_taints() {
        let next = reconcile_taints(&[user_taint()], Some(TAINT_UNREACHABLE), at(100)).unwrap();
        assert_eq!(next.len(), 2);
        assert_eq!(next[0], user_taint());
        assert_eq!(next[1].key, TAINT_UNREACHABLE);
        assert_eq!(next[1].effect, "NoExecute");
        assert_eq!(next[1].time_added, Some(at(100)));
    }

    #[test]
    fn keeps_the_time_added_while_the_taint_stays() {
        let tainted = reconcile_taints(&[], Some(TAINT_UNREACHABLE), at(100)).unwrap();
        assert_eq!(
            reconcile_taints(&tainted, Some(TAINT_UNREACHABLE), at(200)),
            None
        );
        assert_eq!(taint_added_at(&tainted, TAINT_UNREACHABLE), Some(&at(100)));
    }

    #[test]
    fn removes_hub_taints_when_healthy_and_keeps_user_taints() {
        let tainted = reconcile_taints(&[user_taint()], Some(TAINT_NOT_READY), at(100)).unwrap();
        let healed = reconcile_taints(&tainted, None, at(200)).unwrap();
        assert_eq!(healed, vec![user_taint()]);
        assert_eq!(reconcile_taints(&healed, None, at(300)), None);
    }

    #[test]
    fn switching_reason_swaps_the_taint() {
        let tainted = reconcile_taints(&[], Some(TAINT_UNREACHABLE), at(100)).unwrap();
        let next = reconcile_taints(&tainted, Some(TAINT_NOT_READY), at(200)).unwrap();
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].key, TAINT_NOT_READY);
        assert_eq!(next[0].time_added, Some(at(200)));
    }

    #[test]
    fn a_hub_taint_a_user_wrote_with_another_effect_is_replaced() {
        let odd = Taint {
            key: TAINT_UNREACHABLE.into(),
            effect: "NoSchedule".into(),
            value: None,
            time_added: None,
        };
        let next = reconcile_taints(&[odd], Some(TAINT_UNREACHABLE), at(100)).unwrap();
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].effect, "NoExecute");
        assert_eq!(next[0].time_added, Some(at(100)));
    }
}
