//! Sharing replicas out: the Webster / Sainte-Laguë highest-averages method for
//! `Divided/Weighted`, and the fill for `Divided/Aggregated`.
//!
//! # The method
//!
//! A divisor method hands out seats one at a time; the next seat goes to the cluster with
//! the highest priority `weight / d(seats)`, where `seats` is what the cluster already
//! holds. Webster / Sainte-Laguë uses `d(k) = 2k + 1` (1, 3, 5, ...): it rounds each
//! cluster's exact quota to the nearest integer instead of always down (D'Hondt, which
//! favours big clusters) or always up (Adams, which favours small ones), so it is the
//! least biased of the classic methods.
//!
//! Plain Webster can leave a small positive weight without a seat even when there are as
//! many seats as clusters (weights 10 and 1 with 2 seats: the second seat goes to the big
//! cluster, `10/3 > 1/1`). Bulkhead promises that no cluster with a positive weight is
//! starved when the replicas allow, so the **first seat of every positive-weight cluster
//! comes before any second seat** (its divisor is treated as 0, as in Adams and
//! Huntington-Hill); the remaining seats follow Webster's sequence 3, 5, 7, ... unchanged.
//! This is still a divisor method, so it keeps the divisor methods' guarantees:
//!
//! - the shares sum to the total (when any weight is positive);
//! - **house monotone**: one more replica never takes a replica away from anybody, since
//!   the allocation for `total` is a prefix of one fixed order of seats;
//! - **weight monotone**: raising one cluster's weight (others fixed) never lowers its share;
//! - equal weights get shares that differ by at most one;
//! - when `total` >= the number of positive weights, every positive weight gets a seat;
//!   with fewer seats than positive weights, the seats go to the largest weights.
//!
//! Ties (equal priority) go to the cluster with fewer seats, then to the smaller
//! [`stable_hash`] of the template UID and the cluster name (so different templates break
//! ties differently and load spreads out), then to the smaller name.
//!
//! The allocation is computed without handing out seats one by one: a divisor estimate
//! gives every cluster the seats whose priority is strictly above it (a prefix of the
//! seat order, computed exactly in integers), and a heap then adds or removes the few
//! seats at the boundary. The result is identical to the seat-by-seat definition (the
//! tests compare the two), and the cost is O(n log n) whatever the total.

use std::cell::Cell;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// The FNV-1a 64 state after `uid` and a `/` separator; continue it with a cluster name
/// through [`stable_hash_with_prefix`] to hash many clusters of one template cheaply.
pub(crate) fn stable_hash_prefix(uid: &str) -> u64 {
    fnv1a(fnv1a(FNV_OFFSET, uid.as_bytes()), b"/")
}

pub(crate) fn stable_hash_with_prefix(prefix: u64, cluster: &str) -> u64 {
    fnv1a(prefix, cluster.as_bytes())
}

/// The tie-break hash of a template UID and a cluster name: FNV-1a 64 over
/// `"<uid>/<cluster>"`. Written out by hand because std's hasher is randomly seeded per
/// process, and a placement must come out the same in every hub replica and in
/// `bulkhead plan`.
pub fn stable_hash(uid: &str, cluster: &str) -> u64 {
    stable_hash_with_prefix(stable_hash_prefix(uid), cluster)
}

/// One cluster taking part in a division.
#[derive(Clone, Debug)]
pub(crate) struct Party<'a> {
    pub name: &'a str,
    pub weight: u64,
    /// [`stable_hash_prefix`] of the template UID.
    prefix: u64,
    /// [`stable_hash`] of the UID and `name`, computed the first time a tie needs it:
    /// with distinct weights ties are rare, and hashing every name would cost more than
    /// the division.
    hash: Cell<Option<u64>>,
    /// Its first seat comes before every other party's first seat (a positive weight
    /// still needed).
    first: bool,
}

impl<'a> Party<'a> {
    pub(crate) fn new(name: &'a str, weight: u64, prefix: u64) -> Self {
        Party {
            name,
            weight,
            prefix,
            hash: Cell::new(None),
            first: false,
        }
    }

    /// The same party, its first seat handed out before every other party's.
    pub(crate) fn seated_first(mut self) -> Self {
        self.first = self.weight > 0;
        self
    }

    fn hash(&self) -> u64 {
        match self.hash.get() {
            Some(hash) => hash,
            None => {
                let hash = stable_hash_with_prefix(self.prefix, self.name);
                self.hash.set(Some(hash));
                hash
            }
        }
    }
}

/// Shares `total` replicas out over `weights` (cluster name, weight) by the Webster /
/// Sainte-Laguë method with one guaranteed seat per positive weight when `total` allows;
/// see the module documentation for the rules and guarantees. Returns one share per
/// entry of `weights`, in the same order. Weight-0 clusters get 0; if no weight is
/// positive, every share is 0 (and the sum is not `total`). `uid` seeds the tie-break.
///
/// ```
/// use bulkhead::hub::federation::placement::divide_by_weight;
/// let shares = divide_by_weight(6, &[("east", 2), ("west", 1)], "uid-1");
/// assert_eq!(shares, vec![4, 2]);
/// ```
pub fn divide_by_weight(total: u32, weights: &[(&str, u64)], uid: &str) -> Vec<u32> {
    let prefix = stable_hash_prefix(uid);
    let parties: Vec<Party<'_>> = weights
        .iter()
        .map(|&(name, weight)| Party::new(name, weight, prefix))
        .collect();
    divide(total, &parties)
}

/// One seat of one party: its `k`-th seat (0-based). Ordered so that `Greater` means
/// "handed out earlier". Small (a reference and two integers) because the heaps move it.
#[derive(Clone, Copy, Debug)]
struct Seat<'s, 'a> {
    party: &'s Party<'a>,
    index: usize,
    k: u64,
}

impl<'s, 'a> Seat<'s, 'a> {
    fn of(parties: &'s [Party<'a>], index: usize, k: u64) -> Self {
        Seat {
            party: &parties[index],
            index,
            k,
        }
    }
}

impl PartialEq for Seat<'_, '_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Seat<'_, '_> {}

impl PartialOrd for Seat<'_, '_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Seat<'_, '_> {
    fn cmp(&self, other: &Self) -> Ordering {
        let (mine, theirs) = (self.party, other.party);
        // First seats (k = 0) have divisor 0: before every later seat, and among
        // themselves ordered by weight.
        let priority = match (self.k == 0, other.k == 0) {
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (true, true) => mine
                .first
                .cmp(&theirs.first)
                .then_with(|| mine.weight.cmp(&theirs.weight)),
            // weight_a / (2ka + 1) vs weight_b / (2kb + 1), exactly.
            (false, false) => {
                let left = u128::from(mine.weight) * u128::from(2 * other.k + 1);
                let right = u128::from(theirs.weight) * u128::from(2 * self.k + 1);
                left.cmp(&right)
            }
        };
        priority
            .then_with(|| other.k.cmp(&self.k))
            .then_with(|| theirs.hash().cmp(&mine.hash()))
            .then_with(|| theirs.name.cmp(mine.name))
            .then_with(|| other.index.cmp(&self.index))
    }
}

/// The division itself, over parties with precomputed hashes (no minimum beyond the
/// guaranteed first seat).
pub(crate) fn divide(total: u32, parties: &[Party<'_>]) -> Vec<u32> {
    divide_with_minimum(total, parties, 0)
}

/// The division with `minPerCluster`: every positive weight gets `minimum` seats before
/// anyone gets a later seat, and the later seats follow Webster's sequence from there
/// (the divisor method with lower bounds: a cluster ends with the larger of `minimum` and
/// its Webster share at the common divisor). When `total` is too small for every floor,
/// the floors are handed out whole, one cluster after the other, in first-seat order
/// (largest weight first, ties as for every seat), and the last cluster reached gets what
/// is left. All of it is one fixed order of seats, so the shares for `total` are a prefix
/// of it: monotone in the total, whatever `minimum` is. `minimum` 0 and 1 are the same
/// division (the first seat is always guaranteed).
pub(crate) fn divide_with_minimum(total: u32, parties: &[Party<'_>], minimum: u32) -> Vec<u32> {
    let mut seats = vec![0u32; parties.len()];
    let positive: Vec<usize> = (0..parties.len())
        .filter(|&i| parties[i].weight > 0)
        .collect();
    if total == 0 || positive.is_empty() {
        return seats;
    }
    let floor = minimum.max(1);
    let total_u64 = u64::from(total);
    let floors = u64::from(floor) * positive.len() as u64;

    // Too few replicas for every floor: whole floors in first-seat order, largest weights
    // first, and the rest to the next cluster.
    if total_u64 <= floors {
        let mut first: Vec<Seat<'_, '_>> =
            positive.iter().map(|&i| Seat::of(parties, i, 0)).collect();
        let full = (total / floor) as usize;
        let rest = total % floor;
        // `full < first.len()` here unless every floor fits exactly.
        if full < first.len() {
            first.select_nth_unstable_by(full, |a, b| b.cmp(a));
            if rest > 0 {
                seats[first[full].index] = rest;
            }
        }
        for seat in &first[..full.min(first.len())] {
            seats[seat.index] = floor;
        }
        return seats;
    }

    // Every positive weight has its floor; `remaining` later seats follow.
    let remaining = total_u64 - floors;
    let weight_sum: u128 = positive
        .iter()
        .map(|&i| u128::from(parties[i].weight))
        .sum();
    // Divisor estimate: the seats whose priority w/(2k+1) is strictly above
    // λ = W/(2·total). Strictly above an exact threshold is a prefix of the seat order.
    let mut handed: u64 = 0;
    for &i in &positive {
        let scaled = 2 * u128::from(total) * u128::from(parties[i].weight);
        // Largest d with d·W < scaled; seats k >= 0 with 2k+1 <= d are above λ. In u64
        // when the numbers fit (nearly always): a u128 division is a slow library call.
        let largest_divisor = match (u64::try_from(scaled), u64::try_from(weight_sum)) {
            (Ok(scaled), Ok(weight_sum)) => u128::from((scaled - 1) / weight_sum),
            _ => (scaled - 1) / weight_sum,
        };
        // At most about total (quota 2·total·w/W halved), so it fits in u32. Not capped
        // at `remaining`: a capped set would no longer be a prefix of the seat order.
        let above = largest_divisor.div_ceil(2) as u32;
        seats[i] = above.max(floor);
        handed += u64::from(seats[i] - floor);
    }

    match handed.cmp(&remaining) {
        Ordering::Less => {
            // Add the best next seats.
            let mut next: BinaryHeap<Seat<'_, '_>> = positive
                .iter()
                .map(|&i| Seat::of(parties, i, u64::from(seats[i])))
                .collect();
            for _ in handed..remaining {
                let best = next
                    .pop()
                    .expect("a positive weight always has a next seat");
                seats[best.index] += 1;
                next.push(Seat::of(parties, best.index, u64::from(seats[best.index])));
            }
        }
        Ordering::Greater => {
            // Take back the worst later seats handed out (never a floor seat).
            let mut last: BinaryHeap<Reverse<Seat<'_, '_>>> = positive
                .iter()
                .filter(|&&i| seats[i] > floor)
                .map(|&i| Reverse(Seat::of(parties, i, u64::from(seats[i]) - 1)))
                .collect();
            for _ in remaining..handed {
                let Reverse(worst) = last.pop().expect("more later seats than needed");
                seats[worst.index] -= 1;
                if seats[worst.index] > floor {
                    last.push(Reverse(Seat::of(
                        parties,
                        worst.index,
                        u64::from(seats[worst.index]) - 1,
                    )));
                }
            }
        }
        Ordering::Equal => {}
    }
    seats
}

/// One candidate for `Divided/Aggregated`, in preference order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bin {
    /// Replicas the cluster can take; `None` = no estimate, taken as unlimited.
    pub capacity: Option<u64>,
    /// The cluster must get at least one replica (to meet a spread constraint).
    pub required: bool,
}

/// [`fill_aggregated_with_minimum`] without a minimum.
#[cfg(test)]
pub(crate) fn fill_aggregated(total: u32, bins: &[Bin]) -> Result<Vec<u32>, u64> {
    fill_aggregated_with_minimum(total, bins, 0)
}

/// Fills `bins` (already in preference order) with `total` replicas, as few bins as
/// possible: every required bin gets one replica first, then every bin is topped up to
/// `minimum` (or its capacity, if smaller) in order, then bins are filled up to their
/// capacity in order. Each step hands out a prefix of one fixed order of replicas, so
/// the shares grow with `total`. Returns the shares, or the number of replicas that did
/// not fit.
pub(crate) fn fill_aggregated_with_minimum(
    total: u32,
    bins: &[Bin],
    minimum: u32,
) -> Result<Vec<u32>, u64> {
    let mut shares = vec![0u32; bins.len()];
    let mut left = u64::from(total);
    for (share, bin) in shares.iter_mut().zip(bins) {
        if bin.required && left > 0 {
            *share = 1;
            left -= 1;
        }
    }
    let mut fill = |limit: &dyn Fn(&Bin) -> u64, shares: &mut [u32]| {
        for (share, bin) in shares.iter_mut().zip(bins) {
            if left == 0 {
                break;
            }
            let room = limit(bin).saturating_sub(u64::from(*share));
            let given = room.min(left);
            *share += given as u32;
            left -= given;
        }
    };
    let capacity = |bin: &Bin| bin.capacity.unwrap_or(u64::MAX);
    if minimum > 0 {
        fill(&|bin| capacity(bin).min(u64::from(minimum)), &mut shares);
    }
    fill(&capacity, &mut shares);
    if left == 0 { Ok(shares) } else { Err(left) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parties<'a>(weights: &[(&'a str, u64)], uid: &str) -> Vec<Party<'a>> {
        let prefix = stable_hash_prefix(uid);
        weights
            .iter()
            .map(|&(name, weight)| Party::new(name, weight, prefix))
            .collect()
    }

    /// The textbook definition: hand out seats one at a time to the best next seat.
    fn divide_seat_by_seat(total: u32, weights: &[(&str, u64)], uid: &str) -> Vec<u32> {
        let parties = parties(weights, uid);
        let mut seats = vec![0u32; parties.len()];
        if parties.iter().all(|p| p.weight == 0) {
            return seats;
        }
        for _ in 0..total {
            let best = (0..parties.len())
                .filter(|&i| parties[i].weight > 0)
                .map(|i| Seat::of(&parties, i, u64::from(seats[i])))
                .max()
                .unwrap();
            seats[best.index] += 1;
        }
        seats
    }

    /// The definition with a minimum: floors one cluster after the other in first-seat
    /// order, then Webster's seats by priority.
    fn divide_seat_by_seat_with_minimum(
        total: u32,
        weights: &[(&str, u64)],
        uid: &str,
        minimum: u32,
    ) -> Vec<u32> {
        let parties = parties(weights, uid);
        let floor = minimum.max(1);
        let mut seats = vec![0u32; parties.len()];
        if parties.iter().all(|p| p.weight == 0) {
            return seats;
        }
        for _ in 0..total {
            let filling = (0..parties.len())
                .filter(|&i| parties[i].weight > 0 && seats[i] < floor)
                .map(|i| Seat::of(&parties, i, 0))
                .max();
            let best = filling.unwrap_or_else(|| {
                (0..parties.len())
                    .filter(|&i| parties[i].weight > 0)
                    .map(|i| Seat::of(&parties, i, u64::from(seats[i])))
                    .max()
                    .unwrap()
            });
            seats[best.index] += 1;
        }
        seats
    }

    fn divide_by_weight_with_minimum(
        total: u32,
        weights: &[(&str, u64)],
        uid: &str,
        minimum: u32,
    ) -> Vec<u32> {
        divide_with_minimum(total, &parties(weights, uid), minimum)
    }

    #[test]
    fn a_minimum_comes_first_then_webster_continues() {
        let weights = [("big", 3), ("small", 1)];
        // 8 replicas, minimum 2: 2 + 2 first, then the later seats by 3/5, 1/5, 3/7, ...
        assert_eq!(
            divide_by_weight_with_minimum(8, &weights, "u", 2),
            vec![6, 2]
        );
        // Webster alone would give small 2 of 8 too, but only 1 of 5; with minimum 2 it
        // keeps 2.
        assert_eq!(divide_by_weight(5, &weights, "u"), vec![4, 1]);
        assert_eq!(
            divide_by_weight_with_minimum(5, &weights, "u", 2),
            vec![3, 2]
        );
    }

    #[test]
    fn too_few_replicas_for_every_minimum_fill_whole_minimums_by_weight() {
        let weights = [("a", 1), ("b", 5), ("c", 3)];
        assert_eq!(
            divide_by_weight_with_minimum(5, &weights, "u", 2),
            vec![1, 2, 2]
        );
        assert_eq!(
            divide_by_weight_with_minimum(3, &weights, "u", 2),
            vec![0, 2, 1]
        );
        assert_eq!(
            divide_by_weight_with_minimum(1, &weights, "u", 3),
            vec![0, 1, 0]
        );
        assert_eq!(
            divide_by_weight_with_minimum(6, &weights, "u", 2),
            vec![2, 2, 2]
        );
    }

    #[test]
    fn minimum_zero_and_one_are_the_plain_division() {
        let names = names(5);
        let weights: Vec<(&str, u64)> = names
            .iter()
            .map(String::as_str)
            .zip([7, 1, 0, 3, 3])
            .collect();
        for total in 0..40 {
            let plain = divide_by_weight(total, &weights, "grid");
            assert_eq!(
                divide_by_weight_with_minimum(total, &weights, "grid", 0),
                plain
            );
            assert_eq!(
                divide_by_weight_with_minimum(total, &weights, "grid", 1),
                plain
            );
        }
    }

    fn names(count: usize) -> Vec<String> {
        (0..count).map(|i| format!("member-{i:03}")).collect()
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(fnv1a(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(FNV_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(
            stable_hash("uid", "east"),
            fnv1a(FNV_OFFSET, b"uid/east"),
            "the prefix shortcut hashes the same bytes"
        );
    }

    #[test]
    fn design_example_two_to_one() {
        assert_eq!(
            divide_by_weight(6, &[("east", 2), ("west", 1)], "u"),
            vec![4, 2]
        );
    }

    #[test]
    fn webster_rounds_to_nearest_not_down() {
        // Quotas 7 * 0.6 = 4.2 and 7 * 0.4 = 2.8: Webster gives 4/3 (D'Hondt would give 5/2).
        assert_eq!(divide_by_weight(7, &[("a", 3), ("b", 2)], "u"), vec![4, 3]);
        // Quotas 5.7, 3.3, 1.0 with 10 seats.
        assert_eq!(
            divide_by_weight(10, &[("a", 57), ("b", 33), ("c", 10)], "u"),
            vec![6, 3, 1]
        );
    }

    #[test]
    fn no_starvation_first_seat_for_every_positive_weight() {
        // Plain Webster would give both seats to `big` (10/3 > 1/1); Bulkhead gives `small`
        // its first seat before anyone's second.
        assert_eq!(
            divide_by_weight(2, &[("big", 10), ("small", 1)], "u"),
            vec![1, 1]
        );
        // With more seats the rest follow Webster: 1 + 1 guaranteed, then 8 more seats
        // at divisors 3, 5, 7, ... all go to `big` before `small`'s 1/3.
        assert_eq!(
            divide_by_weight(10, &[("big", 100), ("small", 1)], "u"),
            vec![9, 1]
        );
    }

    #[test]
    fn fewer_replicas_than_positive_weights_go_to_the_largest_weights() {
        assert_eq!(
            divide_by_weight(2, &[("a", 1), ("b", 5), ("c", 3)], "u"),
            vec![0, 1, 1]
        );
    }

    #[test]
    fn zero_weights_get_nothing() {
        assert_eq!(
            divide_by_weight(5, &[("a", 0), ("b", 1), ("c", 0)], "u"),
            vec![0, 5, 0]
        );
        assert_eq!(divide_by_weight(5, &[("a", 0), ("b", 0)], "u"), vec![0, 0]);
        assert_eq!(divide_by_weight(5, &[], "u"), Vec::<u32>::new());
        assert_eq!(divide_by_weight(0, &[("a", 3)], "u"), vec![0]);
    }

    #[test]
    fn ties_go_to_fewer_seats_then_the_stable_hash() {
        let weights = [("east", 1), ("west", 1), ("north", 1)];
        let shares = divide_by_weight(4, &weights, "template-uid");
        assert_eq!(shares.iter().sum::<u32>(), 4);
        // Fewer seats first: nobody gets a third seat before everyone has a second one.
        assert!(shares.iter().all(|&s| (1..=2).contains(&s)));
        // The extra seat goes to the smallest stable hash.
        let winner = weights
            .iter()
            .min_by_key(|(name, _)| stable_hash("template-uid", name))
            .unwrap()
            .0;
        let index = weights.iter().position(|(n, _)| *n == winner).unwrap();
        assert_eq!(shares[index], 2);
    }

    #[test]
    fn different_templates_break_ties_differently() {
        let weights = [("east", 1), ("west", 1)];
        let winners: std::collections::BTreeSet<usize> = (0..32)
            .map(|i| {
                let shares = divide_by_weight(1, &weights, &format!("uid-{i}"));
                shares.iter().position(|&s| s == 1).unwrap()
            })
            .collect();
        assert_eq!(winners.len(), 2, "both clusters win some ties");
    }

    #[test]
    fn input_order_does_not_matter() {
        let forward = divide_by_weight(7, &[("a", 1), ("b", 1), ("c", 1)], "u");
        let backward = divide_by_weight(7, &[("c", 1), ("b", 1), ("a", 1)], "u");
        assert_eq!(forward, backward.into_iter().rev().collect::<Vec<_>>());
    }

    #[test]
    fn large_totals_and_weights_do_not_overflow() {
        let shares = divide_by_weight(u32::MAX, &[("a", u64::MAX), ("b", u64::MAX), ("c", 1)], "u");
        assert_eq!(
            shares.iter().map(|&s| u64::from(s)).sum::<u64>(),
            u64::from(u32::MAX)
        );
        assert_eq!(shares[2], 1);
        assert!(shares[0].abs_diff(shares[1]) <= 1);
    }

    #[test]
    fn the_fast_path_equals_seat_by_seat_on_a_grid() {
        let names = names(6);
        for weights in [
            vec![1, 1, 1, 1, 1, 1],
            vec![1, 2, 3, 4, 5, 6],
            vec![100, 1, 1, 0, 7, 7],
            vec![0, 0, 0, 0, 0, 9],
            vec![13, 17, 19, 23, 29, 31],
        ] {
            let weights: Vec<(&str, u64)> = names
                .iter()
                .map(String::as_str)
                .zip(weights.iter().copied())
                .collect();
            for total in 0..60 {
                assert_eq!(
                    divide_by_weight(total, &weights, "grid"),
                    divide_seat_by_seat(total, &weights, "grid"),
                    "total {total}, weights {weights:?}"
                );
            }
        }
    }

    #[test]
    fn aggregated_fills_in_order_up_to_capacity() {
        let bins = [
            Bin {
                capacity: Some(4),
                required: false,
            },
            Bin {
                capacity: None,
                required: false,
            },
            Bin {
                capacity: Some(10),
                required: false,
            },
        ];
        assert_eq!(fill_aggregated(3, &bins), Ok(vec![3, 0, 0]));
        assert_eq!(fill_aggregated(9, &bins), Ok(vec![4, 5, 0]));
        let bounded = [
            Bin {
                capacity: Some(2),
                required: false,
            },
            Bin {
                capacity: Some(1),
                required: true,
            },
        ];
        assert_eq!(fill_aggregated(2, &bounded), Ok(vec![1, 1]));
        assert_eq!(fill_aggregated(3, &bounded), Ok(vec![2, 1]));
        assert_eq!(fill_aggregated(5, &bounded), Err(2));
    }

    fn weights_strategy() -> impl Strategy<Value = Vec<u64>> {
        prop::collection::vec(
            prop_oneof![Just(0u64), 1u64..5, 1u64..1_000, Just(u64::from(u32::MAX))],
            0..12,
        )
    }

    fn named<'a>(names: &'a [String], weights: &[u64]) -> Vec<(&'a str, u64)> {
        names
            .iter()
            .map(String::as_str)
            .zip(weights.iter().copied())
            .collect()
    }

    proptest! {
        #[test]
        fn shares_sum_to_the_total(weights in weights_strategy(), total in 0u32..500, uid in "[a-f0-9-]{0,36}") {
            let names = names(weights.len());
            let shares = divide_by_weight(total, &named(&names, &weights), &uid);
            prop_assert_eq!(shares.len(), weights.len());
            if weights.iter().any(|&w| w > 0) {
                prop_assert_eq!(shares.iter().map(|&s| u64::from(s)).sum::<u64>(), u64::from(total));
            } else {
                prop_assert!(shares.iter().all(|&s| s == 0));
            }
            for (share, weight) in shares.iter().zip(&weights) {
                if *weight == 0 {
                    prop_assert_eq!(*share, 0);
                }
            }
        }

        #[test]
        fn monotone_in_the_total(weights in weights_strategy(), total in 0u32..300, uid in "[a-z0-9]{1,8}") {
            let names = names(weights.len());
            let weights = named(&names, &weights);
            let before = divide_by_weight(total, &weights, &uid);
            let after = divide_by_weight(total + 1, &weights, &uid);
            for (b, a) in before.iter().zip(&after) {
                prop_assert!(a >= b, "total {} -> {}: {:?} -> {:?}", total, total + 1, before, after);
            }
        }

        #[test]
        fn deterministic(weights in weights_strategy(), total in 0u32..1_000, uid in "[a-z0-9-]{0,36}") {
            let names = names(weights.len());
            let weights = named(&names, &weights);
            prop_assert_eq!(divide_by_weight(total, &weights, &uid), divide_by_weight(total, &weights, &uid));
        }

        #[test]
        fn equal_weights_differ_by_at_most_one(count in 1usize..20, weight in 1u64..1_000, total in 0u32..1_000, uid in "[a-z0-9]{1,8}") {
            let names = names(count);
            let weights: Vec<u64> = vec![weight; count];
            let shares = divide_by_weight(total, &named(&names, &weights), &uid);
            let most = shares.iter().max().unwrap();
            let least = shares.iter().min().unwrap();
            prop_assert!(most - least <= 1, "{:?}", shares);
        }

        #[test]
        fn no_positive_weight_starved_when_replicas_allow(weights in weights_strategy(), extra in 0u32..100) {
            let names = names(weights.len());
            let positive = weights.iter().filter(|&&w| w > 0).count() as u32;
            let shares = divide_by_weight(positive + extra, &named(&names, &weights), "uid");
            for (share, weight) in shares.iter().zip(&weights) {
                if *weight > 0 {
                    prop_assert!(*share >= 1, "{:?} -> {:?}", weights, shares);
                }
            }
        }

        #[test]
        fn with_a_minimum_equals_the_seat_by_seat_definition(weights in weights_strategy(), total in 0u32..200, minimum in 0u32..8, uid in "[a-z0-9]{1,8}") {
            let names = names(weights.len());
            let weights = named(&names, &weights);
            prop_assert_eq!(
                divide_by_weight_with_minimum(total, &weights, &uid, minimum),
                divide_seat_by_seat_with_minimum(total, &weights, &uid, minimum)
            );
        }

        #[test]
        fn every_positive_weight_gets_the_minimum_when_the_total_allows(weights in weights_strategy(), minimum in 0u32..8, extra in 0u32..100, uid in "[a-z0-9]{1,8}") {
            let names = names(weights.len());
            let positive = weights.iter().filter(|&&w| w > 0).count() as u32;
            let total = positive * minimum + extra;
            let shares = divide_by_weight_with_minimum(total, &named(&names, &weights), &uid, minimum);
            if positive > 0 {
                prop_assert_eq!(shares.iter().map(|&s| u64::from(s)).sum::<u64>(), u64::from(total));
            }
            for (share, weight) in shares.iter().zip(&weights) {
                if *weight > 0 {
                    prop_assert!(*share >= minimum, "{:?} -> {:?}", weights, shares);
                } else {
                    prop_assert_eq!(*share, 0);
                }
            }
        }

        #[test]
        fn with_a_minimum_sums_to_the_total_and_is_monotone(weights in weights_strategy(), total in 0u32..300, minimum in 0u32..10, uid in "[a-z0-9]{1,8}") {
            let names = names(weights.len());
            let weights = named(&names, &weights);
            let before = divide_by_weight_with_minimum(total, &weights, &uid, minimum);
            let after = divide_by_weight_with_minimum(total + 1, &weights, &uid, minimum);
            if weights.iter().any(|&(_, w)| w > 0) {
                prop_assert_eq!(before.iter().map(|&s| u64::from(s)).sum::<u64>(), u64::from(total));
            }
            for (b, a) in before.iter().zip(&after) {
                prop_assert!(a >= b, "total {} -> {}: {:?} -> {:?}", total, total + 1, before, after);
            }
            // Below the minimum only where the total ran out: at most one cluster holds a
            // partial minimum, and only when not every positive weight got its minimum.
            let partial = before.iter().filter(|&&s| s > 0 && s < minimum).count();
            prop_assert!(partial <= 1, "{:?}", before);
        }

        #[test]
        fn raising_a_weight_never_lowers_that_share(
            weights in weights_strategy().prop_filter("non-empty", |w| !w.is_empty()),
            index in any::<prop::sample::Index>(),
            raise in 1u64..50,
            total in 0u32..300,
            minimum in 0u32..8,
        ) {
            let names = names(weights.len());
            let who = index.index(weights.len());
            let mut raised = weights.clone();
            raised[who] = raised[who].saturating_add(raise);
            let before = divide_by_weight_with_minimum(total, &named(&names, &weights), "uid", minimum);
            let after = divide_by_weight_with_minimum(total, &named(&names, &raised), "uid", minimum);
            prop_assert!(after[who] >= before[who], "{:?} -> {:?}: {:?} -> {:?}", weights, raised, before, after);
        }

        #[test]
        fn aggregated_with_a_minimum_is_monotone_and_meets_the_minimum(
            capacities in prop::collection::vec(prop::option::of(0u64..20), 0..8),
            required in prop::collection::vec(any::<bool>(), 8),
            total in 0u32..120,
            minimum in 0u32..6,
        ) {
            let bins: Vec<Bin> = capacities
                .iter()
                .zip(&required)
                .map(|(&capacity, &required)| Bin { capacity, required })
                .collect();
            let before = fill_aggregated_with_minimum(total, &bins, minimum);
            let after = fill_aggregated_with_minimum(total + 1, &bins, minimum);
            if let (Ok(before), Ok(after)) = (&before, &after) {
                prop_assert_eq!(before.iter().map(|&s| u64::from(s)).sum::<u64>(), u64::from(total));
                for (b, a) in before.iter().zip(after) {
                    prop_assert!(a >= b, "{:?} -> {:?}", before, after);
                }
                // A required bin gets its one replica whatever its room (the spread
                // constraint asks for it), so it may take more than its floor.
                let floor_of = |b: &Bin| {
                    let floor = b.capacity.unwrap_or(u64::MAX).min(u64::from(minimum));
                    if b.required { floor.max(1) } else { floor }
                };
                let floors: u64 = bins.iter().map(floor_of).sum();
                if u64::from(total) >= floors {
                    for (share, bin) in before.iter().zip(&bins) {
                        let floor = floor_of(bin);
                        prop_assert!(u64::from(*share) >= floor, "{:?} {:?}", bins, before);
                    }
                }
            }
            if minimum == 0 {
                prop_assert_eq!(before, fill_aggregated(total, &bins));
            }
        }

        #[test]
        fn equals_the_seat_by_seat_definition(weights in weights_strategy(), total in 0u32..200, uid in "[a-z0-9]{1,8}") {
            let names = names(weights.len());
            let weights = named(&names, &weights);
            prop_assert_eq!(divide_by_weight(total, &weights, &uid), divide_seat_by_seat(total, &weights, &uid));
        }
    }
}
