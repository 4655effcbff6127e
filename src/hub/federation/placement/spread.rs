//! Spread constraints: between minGroups and maxGroups zones, regions or clusters.

use super::candidates::same;
use super::{Slot, State};
use crate::api::propagation_policy::{SpreadByField, SpreadConstraint};

/// Marks a slot that is in no group of a constraint (not a candidate, or dropped).
pub(crate) const NO_GROUP: u32 = u32::MAX;

/// The groups one constraint kept, and which group each slot is in.
#[derive(Debug)]
pub(crate) struct Groups<'a> {
    pub field: SpreadByField,
    pub min_groups: usize,
    /// Per slot, an index into `names`, or [`NO_GROUP`].
    pub group_of: Vec<u32>,
    pub names: Vec<&'a str>,
}

pub(crate) fn field_name(field: SpreadByField) -> &'static str {
    match field {
        SpreadByField::Zone => "zone",
        SpreadByField::Region => "region",
        SpreadByField::Cluster => "cluster",
    }
}

fn plural(field: SpreadByField, count: usize) -> &'static str {
    match (field, count == 1) {
        (SpreadByField::Zone, true) => "zone",
        (SpreadByField::Zone, false) => "zones",
        (SpreadByField::Region, true) => "region",
        (SpreadByField::Region, false) => "regions",
        (SpreadByField::Cluster, true) => "cluster",
        (SpreadByField::Cluster, false) => "clusters",
    }
}

/// The group a cluster falls in, if it has one.
pub(crate) fn group_key<'a>(slot: &Slot<'a>, field: SpreadByField) -> Option<&'a str> {
    let cluster = slot.cluster;
    match field {
        SpreadByField::Zone => Some(cluster.zone.as_str()),
        SpreadByField::Region => cluster.region.as_deref(),
        SpreadByField::Cluster => Some(cluster.name.as_str()),
    }
}

fn coarseness(field: SpreadByField) -> u8 {
    match field {
        SpreadByField::Region => 0,
        SpreadByField::Zone => 1,
        SpreadByField::Cluster => 2,
    }
}

/// Applies the constraints, coarsest first (region, zone, cluster), each to the clusters
/// the previous ones kept. A constraint with more groups than maxGroups keeps the groups
/// with the most total weight, then the most candidates, then the first names; the
/// clusters of the other groups stop being candidates. Fewer groups than minGroups is an
/// error with the reason.
pub(crate) fn choose_groups<'a>(
    constraints: &[SpreadConstraint],
    slots: &mut [Slot<'a>],
) -> Result<Vec<Groups<'a>>, String> {
    let mut ordered: Vec<&SpreadConstraint> = constraints.iter().collect();
    ordered.sort_by_key(|c| coarseness(c.spread_by_field));
    let mut chosen = Vec::with_capacity(ordered.len());
    for constraint in ordered {
        let field = constraint.spread_by_field;
        let mut names: Vec<&'a str> = Vec::new();
        let mut weights: Vec<u128> = Vec::new();
        let mut members: Vec<u32> = Vec::new();
        let mut group_of = vec![NO_GROUP; slots.len()];
        for (index, slot) in slots.iter_mut().enumerate() {
            if !slot.is_candidate() {
                continue;
            }
            let Some(key) = group_key(slot, field) else {
                slot.state = State::NoSpreadGroup(field);
                continue;
            };
            let existing = if field == SpreadByField::Cluster {
                None
            } else {
                names.iter().position(|name| same(name, key))
            };
            let id = existing.unwrap_or_else(|| {
                names.push(key);
                weights.push(0);
                members.push(0);
                names.len() - 1
            });
            group_of[index] = id as u32;
            weights[id] += u128::from(slot.weight);
            members[id] += 1;
        }

        let min_groups = usize::try_from(constraint.min_groups).unwrap_or(0);
        let max_groups = usize::try_from(constraint.max_groups).unwrap_or(0);
        if names.len() < min_groups {
            let mut message = format!(
                "spread constraint {}: need at least {min_groups} {}, {} available",
                field_name(field),
                plural(field, min_groups),
                names.len()
            );
            push_name_list(&mut message, &names);
            return Err(message);
        }
        if max_groups > 0 && names.len() > max_groups {
            let mut ranked: Vec<usize> = (0..names.len()).collect();
            ranked.sort_by(|&a, &b| {
                weights[b]
                    .cmp(&weights[a])
                    .then(members[b].cmp(&members[a]))
                    .then(names[a].cmp(names[b]))
            });
            let mut renumbered = vec![NO_GROUP; names.len()];
            for (new_id, &old_id) in ranked.iter().take(max_groups).enumerate() {
                renumbered[old_id] = new_id as u32;
            }
            for (index, group) in group_of.iter_mut().enumerate() {
                if *group == NO_GROUP {
                    continue;
                }
                *group = renumbered[*group as usize];
                if *group == NO_GROUP {
                    slots[index].state = State::SpreadNotChosen {
                        field,
                        max_groups: constraint.max_groups,
                    };
                }
            }
            names = ranked
                .iter()
                .take(max_groups)
                .map(|&id| names[id])
                .collect();
        }
        chosen.push(Groups {
            field,
            min_groups,
            group_of,
            names,
        });
    }
    Ok(chosen)
}

/// After division: the clusters that got replicas must still span minGroups groups (a
/// division with fewer replicas than clusters can leave a group empty).
pub(crate) fn check_after_division(
    groups: &[Groups<'_>],
    slots: &[Slot<'_>],
    total: u32,
) -> Result<(), String> {
    for constraint in groups.iter().filter(|g| g.min_groups > 1) {
        let mut used = vec![false; constraint.names.len()];
        for (slot, &group) in slots.iter().zip(&constraint.group_of) {
            if group != NO_GROUP && slot.replicas > 0 {
                used[group as usize] = true;
            }
        }
        let mut reached: Vec<&str> = used
            .iter()
            .zip(&constraint.names)
            .filter(|(used, _)| **used)
            .map(|(_, name)| *name)
            .collect();
        if reached.len() < constraint.min_groups {
            reached.sort_unstable();
            let mut message = format!(
                "spread constraint {}: need at least {} {}, but {total} {} reach only {}",
                field_name(constraint.field),
                constraint.min_groups,
                plural(constraint.field, constraint.min_groups),
                if total == 1 { "replica" } else { "replicas" },
                reached.len()
            );
            push_name_list(&mut message, &reached);
            return Err(message);
        }
    }
    Ok(())
}

fn push_name_list(message: &mut String, names: &[&str]) {
    if names.is_empty() {
        return;
    }
    let mut sorted = names.to_vec();
    sorted.sort_unstable();
    message.push_str(" (");
    for (i, name) in sorted.iter().enumerate() {
        if i > 0 {
            message.push_str(", ");
        }
        message.push_str(name);
    }
    message.push(')');
}
