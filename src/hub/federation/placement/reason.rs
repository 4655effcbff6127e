//! The human reason on each cluster's decision row. Rendering runs once per cluster per
//! placement, so it appends to one right-sized String instead of going through `format!`.

use k8s_openapi::api::core::v1::Taint;

use super::candidates::{Admission, Exclusion, Kept, Mismatch};
use super::spread::{field_name, group_key};
use super::{Mode, Shortfall, Slot, State, StaticSource, WeightSource};

/// What every row's reason may refer to.
pub(crate) struct Context<'a> {
    pub mode: Mode,
    pub total: u32,
    /// Candidates with a positive weight (the clusters Webster divided over).
    pub positive_weights: usize,
    /// Clusters selected.
    pub selected: usize,
    /// Why the placement is unschedulable, if it is.
    pub error: Option<&'a str>,
    /// `minPerCluster` (0 = none).
    pub minimum: u32,
    /// The floors did not all fit in the total.
    pub shortfall: Option<Shortfall>,
}

/// What `minPerCluster` did when the replicas were too few, and how to fix it.
pub(crate) fn shortfall_notice(shortfall: Shortfall, mode: Mode) -> String {
    let Shortfall {
        minimum,
        clusters,
        replicas,
    } = shortfall;
    let needed = u64::from(minimum) * clusters as u64;
    let full = replicas / minimum;
    let rest = replicas % minimum;
    let order = if mode == Mode::Aggregated {
        "in aggregated preference order"
    } else {
        "largest weight first"
    };
    let mut out = format!(
        "replicaScheduling.minPerCluster {minimum} needs {needed} replicas for the {clusters} selected clusters, but spec.replicas is {replicas}: {full} {} got {minimum}{} ({order})",
        if full == 1 { "cluster" } else { "clusters" },
        if full == 1 { "" } else { " each" },
    );
    if rest > 0 {
        out.push_str(&format!(
            " and 1 got the remaining {}",
            plural_replicas(rest)
        ));
    }
    out.push_str(&format!("; to meet it, raise spec.replicas to {needed}"));
    let lower = replicas / clusters as u32;
    if lower >= 1 {
        out.push_str(&format!(", lower minPerCluster to {lower}"));
    } else {
        out.push_str(", remove minPerCluster");
    }
    if full >= 1 {
        out.push_str(&format!(
            ", or limit the clusters to {full} (spreadConstraints: spreadByField cluster, maxGroups {full})"
        ));
    }
    out
}

fn plural_replicas(count: u32) -> String {
    let mut out = String::new();
    push_replicas(&mut out, count);
    out
}

/// The reason for one cluster.
pub(crate) fn render(slot: &Slot<'_>, context: &Context<'_>) -> String {
    let mut out = String::with_capacity(64);
    match slot.state {
        State::Excluded(exclusion) => excluded(&mut out, slot, exclusion),
        State::NoSpreadGroup(field) => {
            out.push_str("spread: no ");
            out.push_str(field_name(field));
            out.push_str(" set, cannot count it for spreadByField ");
            out.push_str(field_name(field));
        }
        State::SpreadNotChosen { field, max_groups } => {
            out.push_str("spread: ");
            out.push_str(field_name(field));
            out.push(' ');
            out.push_str(group_key(slot, field).unwrap_or_default());
            out.push_str(" not chosen (maxGroups ");
            push_int(&mut out, i64::from(max_groups));
            out.push(')');
        }
        State::Candidate(admission) => {
            candidate(&mut out, slot, context);
            if let Admission::Kept(kept) = admission {
                match kept {
                    Kept::NotReady { seconds_left } => {
                        out.push_str(
                            "; not Ready, its replicas stay while its taints are tolerated",
                        );
                        if let Some(left) = seconds_left {
                            out.push_str(" (");
                            push_int(&mut out, left);
                            out.push_str("s left)");
                        }
                    }
                    Kept::NoSchedule(taint) => {
                        out.push_str("; taint ");
                        push_taint(&mut out, taint);
                        out.push_str(" not tolerated: its replicas stay, no new ones");
                    }
                    Kept::StatefulNoExecute(taint) => {
                        out.push_str("; taint ");
                        push_taint(&mut out, taint);
                        out.push_str(
                            " not tolerated, but stateful replicas are never evicted: they stay, no new ones",
                        );
                    }
                }
                if let Some(cap) = slot.cap {
                    out.push_str(" (keeps at most the ");
                    push_int(&mut out, i64::from(cap));
                    out.push_str(" it holds)");
                }
            }
        }
    }
    out
}

fn excluded(out: &mut String, slot: &Slot<'_>, exclusion: Exclusion<'_>) {
    let cluster = slot.cluster;
    match exclusion {
        Exclusion::NotInClusterNames => out.push_str("not in clusterAffinity.clusterNames"),
        Exclusion::Excluded => out.push_str("excluded by clusterAffinity.exclude"),
        Exclusion::Labels(mismatch) => {
            out.push_str("labels do not match clusterAffinity.labelSelector: ");
            match mismatch {
                Mismatch::Label { key, value } => {
                    out.push_str(key);
                    out.push('=');
                    out.push_str(value);
                }
                Mismatch::Expression(requirement) => {
                    out.push_str(&requirement.key);
                    out.push(' ');
                    out.push_str(&requirement.operator);
                    if let Some(values) = requirement.values.as_ref().filter(|v| !v.is_empty()) {
                        out.push_str(" (");
                        out.push_str(&values.join(", "));
                        out.push(')');
                    }
                }
            }
        }
        Exclusion::Zone => {
            out.push_str("zone ");
            out.push_str(&cluster.zone);
            out.push_str(" not in clusterAffinity.zones");
        }
        Exclusion::Region => match &cluster.region {
            Some(region) => {
                out.push_str("region ");
                out.push_str(region);
                out.push_str(" not in clusterAffinity.regions");
            }
            None => out.push_str("no region set, and clusterAffinity.regions requires one"),
        },
        Exclusion::NotReady => out.push_str("not Ready"),
        Exclusion::NotReadyNoNewReplicas => out.push_str(
            "not Ready: its taints are tolerated, but only replicas already there may stay",
        ),
        Exclusion::TaintNotTolerated(taint) => {
            out.push_str("taint ");
            push_taint(out, taint);
            out.push_str(" not tolerated");
        }
        Exclusion::TolerationExpired { taint, seconds_ago } => {
            out.push_str("toleration for ");
            push_taint(out, taint);
            out.push_str(" expired ");
            push_int(out, seconds_ago);
            out.push_str("s ago");
        }
    }
}

fn candidate(out: &mut String, slot: &Slot<'_>, context: &Context<'_>) {
    if let Some(error) = context.error {
        out.push_str("candidate, but not scheduled: ");
        out.push_str(error);
        return;
    }
    let total = context.total;
    let weighted = matches!(context.mode, Mode::Weighted { .. });
    if total == 0 && !(weighted && slot.weight == 0) {
        out.push_str("selected: 0 replicas (the template has 0 replicas)");
        return;
    }
    match context.mode {
        Mode::Duplicated => {
            out.push_str("selected: duplicated, ");
            push_replicas(out, slot.replicas);
        }
        Mode::Weighted { .. } if slot.weight == 0 => {
            out.push_str("weight 0: ");
            out.push_str(match slot.weight_source {
                WeightSource::Available => "no available replicas",
                WeightSource::NoEntry => "no staticWeightList entry matches",
                WeightSource::AvailableUnknown(StaticSource::NoEntry) => {
                    "available replicas unknown and no staticWeightList entry matches"
                }
                WeightSource::AvailableUnknown(_) => {
                    "available replicas unknown and the staticWeightList entry says 0"
                }
                _ => "the staticWeightList entry says 0",
            });
        }
        Mode::Weighted { .. } if slot.replicas == 0 && context.shortfall.is_some() => {
            push_weight(out, slot);
            push_shortfall_none(out, context);
        }
        Mode::Weighted { .. } if slot.replicas == 0 => {
            push_weight(out, slot);
            out.push_str(" but ");
            push_replicas(out, total);
            out.push_str(" divided over ");
            push_int(out, context.positive_weights as i64);
            out.push_str(" clusters by Webster; no seat");
        }
        Mode::Weighted { .. } => {
            out.push_str("selected: ");
            push_weight(out, slot);
            out.push_str(", ");
            push_share(out, slot.replicas, total);
            push_below_minimum(out, slot, context);
        }
        Mode::Aggregated if slot.replicas == 0 && context.shortfall.is_some() => {
            out.push_str("candidate");
            push_shortfall_none(out, context);
        }
        Mode::Aggregated if slot.replicas == 0 => {
            out.push_str("not needed: aggregated placement fits ");
            push_replicas(out, total);
            out.push_str(" in ");
            push_int(out, context.selected as i64);
            out.push_str(if context.selected == 1 {
                " cluster"
            } else {
                " clusters"
            });
        }
        Mode::Aggregated => {
            out.push_str("selected: aggregated, ");
            push_share(out, slot.replicas, total);
            if slot.holds_replicas {
                out.push_str(" (already holds replicas)");
            }
            push_below_minimum(out, slot, context);
        }
    }
}

/// A cluster the floors did not reach: ` but minPerCluster 2 with 5 replicas reaches
/// only 3 of 4 clusters; no replicas`.
fn push_shortfall_none(out: &mut String, context: &Context<'_>) {
    let Some(shortfall) = context.shortfall else {
        return;
    };
    out.push_str(" but minPerCluster ");
    push_int(out, i64::from(shortfall.minimum));
    out.push_str(" with ");
    push_replicas(out, shortfall.replicas);
    out.push_str(" reaches only ");
    push_int(out, context.selected as i64);
    out.push_str(" of ");
    push_int(out, shortfall.clusters as i64);
    out.push_str(" clusters; no replicas");
}

/// A selected cluster with fewer than minPerCluster replicas: why.
fn push_below_minimum(out: &mut String, slot: &Slot<'_>, context: &Context<'_>) {
    if slot.replicas >= context.minimum || context.shortfall.is_none() || slot.cap.is_some() {
        return;
    }
    out.push_str(" (below minPerCluster ");
    push_int(out, i64::from(context.minimum));
    out.push_str(": not enough replicas for every cluster)");
}

fn push_weight(out: &mut String, slot: &Slot<'_>) {
    out.push_str("weight ");
    push_unsigned(out, slot.weight);
    match slot.weight_source {
        WeightSource::Available => out.push_str(" (available replicas)"),
        WeightSource::AvailableUnknown(_) => {
            out.push_str(" (available replicas unknown, static weight used)")
        }
        _ => {}
    }
}

fn push_taint(out: &mut String, taint: &Taint) {
    out.push_str(&taint.key);
    if let Some(value) = taint.value.as_deref().filter(|v| !v.is_empty()) {
        out.push('=');
        out.push_str(value);
    }
    out.push(':');
    out.push_str(&taint.effect);
}

fn push_share(out: &mut String, replicas: u32, total: u32) {
    push_int(out, i64::from(replicas));
    out.push_str(" of ");
    push_replicas(out, total);
}

fn push_replicas(out: &mut String, count: u32) {
    push_int(out, i64::from(count));
    out.push_str(if count == 1 { " replica" } else { " replicas" });
}

/// Appends a decimal integer without the formatting machinery.
fn push_int(out: &mut String, value: i64) {
    if value < 0 {
        out.push('-');
    }
    push_unsigned(out, value.unsigned_abs());
}

fn push_unsigned(out: &mut String, value: u64) {
    let mut digits = [0u8; 20];
    let mut position = digits.len();
    let mut rest = value;
    loop {
        position -= 1;
        digits[position] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&digits[position..]).expect("ASCII digits"));
}

#[cfg(test)]
mod tests {
    use super::{push_int, push_unsigned};

    #[test]
    fn integers_print_like_display() {
        for value in [0, 7, 10, 42, 1_000_000, -5, i64::MAX, i64::MIN] {
            let mut out = String::new();
            push_int(&mut out, value);
            assert_eq!(out, value.to_string());
        }
        let mut out = String::new();
        push_unsigned(&mut out, u64::MAX);
        assert_eq!(out, u64::MAX.to_string());
    }
}
