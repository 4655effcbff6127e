//! Which database pod a version upgrade replaces next: the agent's decision, pure.
//!
//! A database's StatefulSet has `updateStrategy: OnDelete`, so its controller never
//! replaces a pod by itself: the agent deletes each pod still on an older pod template
//! (`controller-revision-hash` is not the StatefulSet's `updateRevision`) and the
//! StatefulSet creates it again from the new one. Rules:
//! - one pod at a time, only while every instance is present and Ready, and never while
//!   the database is fenced (nothing moves in a partition) or a switchover is under way;
//! - standbys first, the highest ordinal first;
//! - the primary last: it is switched over to an upgraded standby first
//!   ([`UpgradeStep::SwitchOver`]; `roles::decide` does it, with nothing lost), and its
//!   pod is replaced once it is a standby;
//! - a database of one instance, or one whose instance managers do not answer at all
//!   (nothing to switch over to, and no roles to order by), has its pods replaced
//!   highest ordinal first, as the StatefulSet's own rolling update would.

/// One pod of the database, as the agent sees it this round.
#[derive(Clone, Debug)]
pub struct UpgradePod<'a> {
    pub name: &'a str,
    /// It runs the StatefulSet's current pod template.
    pub updated: bool,
    /// Its Ready condition is True.
    pub ready: bool,
    /// Its instance manager answered this round.
    pub answers: bool,
}

/// The database this round.
#[derive(Clone, Debug)]
pub struct UpgradeInput<'a> {
    /// Its pods that are not being deleted, by ordinal.
    pub pods: &'a [UpgradePod<'a>],
    /// The StatefulSet's replica count.
    pub replicas: usize,
    /// The recorded primary.
    pub primary: Option<&'a str>,
    /// Why the database is read-only (fenced), if it is.
    pub fenced: Option<&'a str>,
    /// A switchover is under way.
    pub switching: bool,
    /// The StatefulSet's status is for its current spec (its `updateRevision` is the
    /// current template's).
    pub observed: bool,
}

/// What the agent does for the upgrade this round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpgradeStep {
    /// Every pod runs the current template.
    Done,
    /// An upgrade is under way and waits; why.
    Wait(String),
    /// Delete this pod (the StatefulSet creates it again from the new template); why.
    Replace { pod: String, why: String },
    /// Only the primary's pod is left: switch it over to an upgraded standby first.
    SwitchOver { pod: String },
}

/// Decides this round; see the module documentation.
pub fn next(input: &UpgradeInput<'_>) -> UpgradeStep {
    if !input.observed {
        return UpgradeStep::Wait("the StatefulSet has not taken its new template yet".into());
    }
    let outdated: Vec<&UpgradePod<'_>> = input.pods.iter().filter(|p| !p.updated).collect();
    if outdated.is_empty() {
        return UpgradeStep::Done;
    }
    let left = format!(
        "{} of {} instances on the old pod template",
        outdated.len(),
        input.replicas
    );
    if let Some(why) = input.fenced {
        return UpgradeStep::Wait(format!("{left}; the upgrade waits: fenced ({why})"));
    }
    if input.switching {
        return UpgradeStep::Wait(format!("{left}; the upgrade waits for the switchover"));
    }
    let not_ready: Vec<&str> = input
        .pods
        .iter()
        .filter(|p| !p.ready)
        .map(|p| p.name)
        .collect();
    // Fewer pods than replicas: one is coming back; more: a scale-down is under way.
    if input.pods.len() != input.replicas || !not_ready.is_empty() {
        return UpgradeStep::Wait(format!(
            "{left}; the next is replaced once every instance is Ready{}",
            if not_ready.is_empty() {
                String::new()
            } else {
                format!(" (not Ready: {})", not_ready.join(", "))
            }
        ));
    }
    let is_primary = |pod: &UpgradePod<'_>| input.primary == Some(pod.name);
    if let Some(standby) = outdated.iter().rev().find(|p| !is_primary(p)) {
        return UpgradeStep::Replace {
            pod: standby.name.to_string(),
            why: format!("{left}: standbys first"),
        };
    }
    let primary = outdated[outdated.len() - 1];
    let nobody_answers = input.pods.iter().all(|p| !p.answers);
    if input.pods.len() == 1 || nobody_answers {
        return UpgradeStep::Replace {
            pod: primary.name.to_string(),
            why: if input.pods.len() == 1 {
                format!("{left}: the only instance (the database is unavailable until it is back)")
            } else {
                format!("{left}: no instance manager answers, so there is no switchover to make")
            },
        };
    }
    UpgradeStep::SwitchOver {
        pod: primary.name.to_string(),
    }
}

/// The primary the role decision is to switch over this round for the upgrade: the one
/// this round's step names, or the one an earlier round began with (`began`) while the
/// upgrade waits and that instance is still the recorded primary. A switchover the
/// upgrade began goes on through the rounds in which the upgrade waits (the demoted
/// primary's pod may not be Ready for a moment): stopping it half-way would promote the
/// old primary again.
pub fn switching_over(
    step: Option<&UpgradeStep>,
    began: Option<String>,
    recorded_primary: Option<&str>,
) -> Option<String> {
    match step {
        Some(UpgradeStep::SwitchOver { pod }) => Some(pod.clone()),
        Some(UpgradeStep::Wait(_)) => began.filter(|p| recorded_primary == Some(p.as_str())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods<'a>(names: &'a [&'a str], updated: &[bool]) -> Vec<UpgradePod<'a>> {
        names
            .iter()
            .zip(updated)
            .map(|(name, updated)| UpgradePod {
                name,
                updated: *updated,
                ready: true,
                answers: true,
            })
            .collect()
    }

    fn input<'a>(pods: &'a [UpgradePod<'a>], primary: &'a str) -> UpgradeInput<'a> {
        UpgradeInput {
            pods,
            replicas: pods.len(),
            primary: Some(primary),
            fenced: None,
            switching: false,
            observed: true,
        }
    }

    const NAMES: [&str; 3] = ["orders-0", "orders-1", "orders-2"];

    fn replaced(step: UpgradeStep) -> String {
        match step {
            UpgradeStep::Replace { pod, .. } => pod,
            other => panic!("expected a replacement, got {other:?}"),
        }
    }

    #[test]
    fn standbys_go_first_highest_ordinal_first_then_the_primary_after_a_switchover() {
        // The primary is orders-1 (a failover moved it): 2, then 0, then a switchover.
        let all_old = pods(&NAMES, &[false, false, false]);
        assert_eq!(replaced(next(&input(&all_old, "orders-1"))), "orders-2");
        let two_left = pods(&NAMES, &[false, false, true]);
        assert_eq!(replaced(next(&input(&two_left, "orders-1"))), "orders-0");
        let primary_left = pods(&NAMES, &[true, false, true]);
        assert_eq!(
            next(&input(&primary_left, "orders-1")),
            UpgradeStep::SwitchOver {
                pod: "orders-1".into()
            }
        );
        // Switched over: orders-1 is a standby now, and is replaced.
        assert_eq!(
            replaced(next(&input(&primary_left, "orders-0"))),
            "orders-1"
        );
        let done = pods(&NAMES, &[true, true, true]);
        assert_eq!(next(&input(&done, "orders-0")), UpgradeStep::Done);
    }

    #[test]
    fn one_at_a_time_and_nothing_while_fenced_switching_or_not_observed() {
        let mut all_old = pods(&NAMES, &[false, false, false]);
        all_old[0].ready = false;
        let step = next(&input(&all_old, "orders-0"));
        assert!(
            matches!(&step, UpgradeStep::Wait(why) if why.contains("not Ready: orders-0")),
            "{step:?}"
        );
        let replaced_one = pods(&NAMES[..2], &[false, false]);
        let mut missing = input(&replaced_one, "orders-0");
        missing.replicas = 3;
        assert!(
            matches!(next(&missing), UpgradeStep::Wait(_)),
            "orders-2 is not back yet"
        );
        let all_old = pods(&NAMES, &[false, false, false]);
        let mut shrinking = input(&all_old, "orders-0");
        shrinking.replicas = 2;
        assert!(
            matches!(next(&shrinking), UpgradeStep::Wait(_)),
            "a scale-down under way goes first"
        );

        let all_old = pods(&NAMES, &[false, false, false]);
        let mut fenced = input(&all_old, "orders-0");
        fenced.fenced = Some("the hub's lease is stale");
        assert!(matches!(next(&fenced), UpgradeStep::Wait(why) if why.contains("fenced")));
        let mut switching = input(&all_old, "orders-0");
        switching.switching = true;
        assert!(matches!(next(&switching), UpgradeStep::Wait(_)));
        let mut stale = input(&all_old, "orders-0");
        stale.observed = false;
        assert!(matches!(next(&stale), UpgradeStep::Wait(_)));
    }

    #[test]
    fn a_single_instance_or_silent_instance_managers_are_replaced_without_a_switchover() {
        let single = pods(&NAMES[..1], &[false]);
        assert_eq!(replaced(next(&input(&single, "orders-0"))), "orders-0");
        let mut silent = pods(&NAMES, &[false, true, true]);
        for pod in &mut silent {
            pod.answers = false;
        }
        assert_eq!(replaced(next(&input(&silent, "orders-0"))), "orders-0");
    }

    #[test]
    fn a_switchover_the_upgrade_began_goes_on_while_it_waits() {
        let wait = UpgradeStep::Wait("orders-0 is not Ready".into());
        let began = || Some("orders-0".to_string());
        assert_eq!(
            switching_over(Some(&wait), began(), Some("orders-0")),
            began(),
            "still the primary: the switchover goes on"
        );
        assert_eq!(
            switching_over(Some(&wait), began(), Some("orders-1")),
            None,
            "switched over: nothing more to ask"
        );
        assert_eq!(
            switching_over(Some(&UpgradeStep::Done), began(), Some("orders-0")),
            None
        );
        assert_eq!(switching_over(None, began(), Some("orders-0")), None);
        let step = UpgradeStep::SwitchOver {
            pod: "orders-2".into(),
        };
        assert_eq!(
            switching_over(Some(&step), None, Some("orders-2")),
            Some("orders-2".into())
        );
    }
}
