//! Which clusters a Divided/Weighted placement has tied for its last replicas, for
//! `bulkhead plan`: the only part of a placement the template's UID decides.
//!
//! The division hands out seats in one fixed order (see `divide.rs`): by priority
//! `weight / (2k + 1)` (first seats before all others), then fewer seats, then the stable
//! hash of the template UID and the cluster name. Two seats compare equal up to the hash
//! only when they are the same seat number `k` of clusters of the same weight. So the
//! UID matters exactly when the last seat handed out, `(w, k)`, has an equal seat that
//! was not handed out: a cluster of weight `w` holding `k` seats. Those clusters and the
//! ones of weight `w` holding `k + 1` are tied; which of them get the extra replica
//! depends on the UID, and every choice of that many among them is possible.

use super::{Decision, Mode, PlacementRequest, decide};

/// Clusters tied for the last replicas of a division.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tie {
    /// The tied clusters, sorted by name.
    pub clusters: Vec<String>,
    /// How many of them get `base + 1` replicas; the others get `base`.
    pub extra: usize,
    /// Replicas of a tied cluster without the extra one.
    pub base: u32,
}

/// The tie the UID breaks in `request`'s placement, or None when the placement does not
/// depend on the UID (not Divided/Weighted, unschedulable, no tie at the last seat, or a
/// kept cluster caps the division: `bulkhead plan` never has one, it plans from scratch).
pub fn uid_tie(request: &PlacementRequest<'_>) -> Option<Tie> {
    tie_of(&decide(request))
}

fn tie_of(decision: &Decision<'_>) -> Option<Tie> {
    if !matches!(decision.mode, Mode::Weighted { .. })
        || decision.scheduled.is_err()
        || decision.total == 0
    {
        return None;
    }
    let parties: Vec<(&str, u64, u32)> = decision
        .slots
        .iter()
        .filter(|s| s.is_candidate() && s.weight > 0)
        .map(|s| (s.cluster.name.as_str(), s.weight, s.replicas))
        .collect();
    if decision
        .slots
        .iter()
        .any(|s| s.is_candidate() && s.cap.is_some())
    {
        return None;
    }
    last_seat_tie(&parties)
}

/// The tie at the last seat of a Webster division (see the module documentation), from
/// the parties (cluster, weight > 0, seats) the division gave out with any UID.
pub fn last_seat_tie(parties: &[(&str, u64, u32)]) -> Option<Tie> {
    // The last seat handed out: the worst of every party's last seat (index seats - 1).
    let worse = |a: (u64, u32), b: (u64, u32)| -> bool {
        // true when seat a = (weight, k) comes after seat b in the order.
        let ((wa, ka), (wb, kb)) = (a, b);
        match (ka == 0, kb == 0) {
            (true, false) => false,
            (false, true) => true,
            (true, true) => wa < wb,
            (false, false) => {
                let left = u128::from(wa) * u128::from(2 * kb + 1);
                let right = u128::from(wb) * u128::from(2 * ka + 1);
                left < right || (left == right && ka > kb)
            }
        }
    };
    let mut last: Option<(u64, u32)> = None;
    for &(_, weight, seats) in parties {
        if seats == 0 {
            continue;
        }
        let seat = (weight, seats - 1);
        if last.is_none_or(|l| worse(seat, l)) {
            last = Some(seat);
        }
    }
    let (weight, k) = last?;
    let mut clusters: Vec<&str> = Vec::new();
    let mut extra = 0;
    let mut waiting = 0;
    for &(name, w, seats) in parties {
        if w != weight {
            continue;
        }
        if seats == k + 1 {
            clusters.push(name);
            extra += 1;
        } else if seats == k {
            clusters.push(name);
            waiting += 1;
        }
    }
    if waiting == 0 {
        return None;
    }
    clusters.sort_unstable();
    Some(Tie {
        clusters: clusters.into_iter().map(str::to_string).collect(),
        extra,
        base: k,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::federation::placement::divide_by_weight;
    use std::collections::BTreeSet;

    fn parties<'a>(names: &[&'a str], weights: &[u64], shares: &[u32]) -> Vec<(&'a str, u64, u32)> {
        names
            .iter()
            .zip(weights)
            .zip(shares)
            .filter(|((_, w), _)| **w > 0)
            .map(|((n, w), s)| (*n, *w, *s))
            .collect()
    }

    /// Every outcome the tie allows: base + 1 for each choice of `extra` tied clusters.
    fn outcomes(names: &[&str], shares: &[u32], tie: Option<&Tie>) -> BTreeSet<Vec<u32>> {
        let Some(tie) = tie else {
            return BTreeSet::from([shares.to_vec()]);
        };
        let tied: Vec<usize> = tie
            .clusters
            .iter()
            .map(|c| names.iter().position(|n| n == c).unwrap())
            .collect();
        let mut all = BTreeSet::new();
        for mask in 0u32..(1 << tied.len()) {
            if mask.count_ones() as usize != tie.extra {
                continue;
            }
            let mut out = shares.to_vec();
            for (bit, &i) in tied.iter().enumerate() {
                out[i] = tie.base + u32::from(mask & (1 << bit) != 0);
            }
            all.insert(out);
        }
        all
    }

    #[test]
    fn the_issue_example_two_equal_weights_one_seat_left() {
        // 3 replicas, north 1 : west 1 (east 0): the third seat is a tie.
        let tie = last_seat_tie(&[("north", 1, 2), ("west", 1, 1)]).unwrap();
        assert_eq!(
            tie,
            Tie {
                clusters: vec!["north".into(), "west".into()],
                extra: 1,
                base: 1
            }
        );
        assert_eq!(last_seat_tie(&[("east", 2, 4), ("west", 1, 2)]), None);
        assert_eq!(last_seat_tie(&[("east", 1, 2), ("west", 1, 2)]), None);
        // Fewer replicas than clusters: the first seats of the lightest tied weight.
        let tie = last_seat_tie(&[("a", 5, 1), ("b", 3, 1), ("c", 3, 0)]).unwrap();
        assert_eq!((tie.clusters.len(), tie.extra, tie.base), (2, 1, 0));
    }

    /// Against the division itself: the outcomes 300 UIDs produce are exactly the ones
    /// the tie predicts.
    #[test]
    fn predicted_outcomes_are_the_ones_uids_produce() {
        let names = ["east", "north", "south", "west"];
        for weights in [
            [1u64, 1, 1, 1],
            [2, 1, 1, 0],
            [3, 3, 1, 1],
            [2, 2, 2, 1],
            [5, 1, 0, 0],
            [6, 3, 2, 1],
        ] {
            let weighted: Vec<(&str, u64)> = names.iter().copied().zip(weights).collect();
            for total in 0..14u32 {
                let shares = divide_by_weight(total, &weighted, "some-uid");
                let tie = last_seat_tie(&parties(&names, &weights, &shares));
                let predicted = outcomes(&names, &shares, tie.as_ref());
                let seen: BTreeSet<Vec<u32>> = (0..300)
                    .map(|i| divide_by_weight(total, &weighted, &format!("uid-{i}")))
                    .collect();
                assert_eq!(
                    seen, predicted,
                    "weights {weights:?}, total {total}, tie {tie:?}"
                );
            }
        }
    }
}
