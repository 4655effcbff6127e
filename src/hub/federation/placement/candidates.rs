//! Candidate filtering: `clusterAffinity`, readiness, and taints against
//! `clusterTolerations`. Each check that fails says which rule excluded the cluster.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use super::ClusterView;
use crate::api::propagation_policy::{ClusterAffinity, StaticClusterWeight};

/// String equality for the short names, zones and label values placement compares by the
/// thousand: inlined byte comparison instead of a `memcmp` call, which costs more than the
/// comparison itself at these lengths.
#[inline]
pub(crate) fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let length = a.len();
    if length != b.len() {
        return false;
    }
    // Two overlapping word loads cover the whole string: first and last 4 or 8 bytes.
    let word4 = |s: &[u8], at: usize| u32::from_ne_bytes([s[at], s[at + 1], s[at + 2], s[at + 3]]);
    let word8 =
        |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().expect("8 bytes"));
    match length {
        0..=3 => a.iter().zip(b).all(|(x, y)| x == y),
        4..=8 => word4(a, 0) == word4(b, 0) && word4(a, length - 4) == word4(b, length - 4),
        9..=16 => word8(a, 0) == word8(b, 0) && word8(a, length - 8) == word8(b, length - 8),
        _ => a == b,
    }
}

/// Whether `list` holds `value` (see [`same`]).
#[inline]
pub(crate) fn listed(list: &[String], value: &str) -> bool {
    list.iter().any(|item| same(item, value))
}

/// A label's value. Clusters carry a handful of labels, where a scan with [`same`] beats
/// the B-tree's ordered comparisons; big maps use the tree.
#[inline]
fn label_value<'l>(labels: &'l BTreeMap<String, String>, key: &str) -> Option<&'l str> {
    if labels.len() <= 8 {
        labels
            .iter()
            .find(|(k, _)| same(k, key))
            .map(|(_, v)| v.as_str())
    } else {
        labels.get(key).map(String::as_str)
    }
}

/// A set of cluster names from a policy. Lists are usually short, where a scan beats
/// hashing; long ones are hashed once per placement.
pub(crate) struct NameSet<'a> {
    list: &'a [String],
    hashed: Option<HashSet<&'a str>>,
}

impl<'a> NameSet<'a> {
    const SCAN_LIMIT: usize = 16;

    pub(crate) fn new(list: &'a [String]) -> Self {
        let hashed =
            (list.len() > Self::SCAN_LIMIT).then(|| list.iter().map(String::as_str).collect());
        NameSet { list, hashed }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        match &self.hashed {
            Some(set) => set.contains(name),
            None => listed(self.list, name),
        }
    }
}

/// `clusterAffinity`, prepared once per placement.
pub(crate) struct Affinity<'a> {
    names: NameSet<'a>,
    exclude: NameSet<'a>,
    selector: Option<&'a LabelSelector>,
    zones: &'a [String],
    regions: &'a [String],
}

impl<'a> Affinity<'a> {
    pub(crate) fn new(affinity: Option<&'a ClusterAffinity>) -> Self {
        const NONE: &[String] = &[];
        match affinity {
            Some(a) => Affinity {
                names: NameSet::new(&a.cluster_names),
                exclude: NameSet::new(&a.exclude),
                selector: a.label_selector.as_ref(),
                zones: &a.zones,
                regions: &a.regions,
            },
            None => Affinity {
                names: NameSet::new(NONE),
                exclude: NameSet::new(NONE),
                selector: None,
                zones: NONE,
                regions: NONE,
            },
        }
    }
}

/// Why a cluster is not a candidate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Exclusion<'a> {
    NotInClusterNames,
    Excluded,
    Labels(Mismatch<'a>),
    Zone,
    Region,
    NotReady,
    /// Not Ready; its taints are tolerated, but only replicas already there may stay.
    NotReadyNoNewReplicas,
    TaintNotTolerated(&'a Taint),
    TolerationExpired {
        taint: &'a Taint,
        seconds_ago: i64,
    },
}

/// The first part of a label selector a cluster's labels fail.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Mismatch<'a> {
    Label { key: &'a str, value: &'a str },
    Expression(&'a LabelSelectorRequirement),
}

/// How a candidate got in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Admission<'a> {
    Ready,
    /// The cluster holds replicas and keeps them, but gains none (it keeps at most what
    /// it holds): the Kubernetes meaning of NoSchedule, of a NotReady node, and of
    /// NoExecute for stateful kinds, which are never evicted.
    Kept(Kept<'a>),
}

/// Why a cluster that holds replicas keeps them but gains none.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kept<'a> {
    /// Not Ready, and every NoSchedule/NoExecute taint on it is tolerated: it keeps its
    /// replicas for `seconds_left` more (None = indefinitely).
    NotReady { seconds_left: Option<i64> },
    /// A NoSchedule taint is not tolerated: it blocks new replicas, not running ones.
    NoSchedule(&'a Taint),
    /// A NoExecute taint is not tolerated, but the kind is stateful: stateful placements
    /// are never evicted (their data is there).
    StatefulNoExecute(&'a Taint),
}

/// Checks one cluster. `holds_replicas` is asked only when the answer matters (a cluster
/// that is not Ready or has a taint the placement does not tolerate). `stateful` kinds
/// are never evicted by a NoExecute taint: a cluster that holds their replicas keeps them.
pub(crate) fn check<'a>(
    cluster: &'a ClusterView,
    affinity: &Affinity<'a>,
    tolerations: &[Toleration],
    holds_replicas: impl Fn() -> bool,
    stateful: bool,
    now_millis: i64,
) -> Result<Admission<'a>, Exclusion<'a>> {
    if !affinity.names.is_empty() && !affinity.names.contains(&cluster.name) {
        return Err(Exclusion::NotInClusterNames);
    }
    if !affinity.exclude.is_empty() && affinity.exclude.contains(&cluster.name) {
        return Err(Exclusion::Excluded);
    }
    if let Some(selector) = affinity.selector
        && let Some(mismatch) = first_mismatch(selector, &cluster.labels)
    {
        return Err(Exclusion::Labels(mismatch));
    }
    if !affinity.zones.is_empty() && !listed(affinity.zones, &cluster.zone) {
        return Err(Exclusion::Zone);
    }
    if !affinity.regions.is_empty()
        && !cluster
            .region
            .as_ref()
            .is_some_and(|region| listed(affinity.regions, region))
    {
        return Err(Exclusion::Region);
    }

    let mut seconds_left: Option<i64> = None;
    let mut no_execute_taints = false;
    let mut kept: Option<Kept<'a>> = None;
    for taint in &cluster.taints {
        let effect = taint.effect.as_str();
        if effect != "NoSchedule" && effect != "NoExecute" {
            continue;
        }
        no_execute_taints |= effect == "NoExecute";
        let refused = match taint_verdict(taint, tolerations, now_millis) {
            TaintVerdict::Tolerated { seconds_left: None } => continue,
            TaintVerdict::Tolerated {
                seconds_left: Some(left),
            } => {
                seconds_left = Some(seconds_left.map_or(left, |s| s.min(left)));
                continue;
            }
            TaintVerdict::NotTolerated => Exclusion::TaintNotTolerated(taint),
            TaintVerdict::Expired { seconds_ago } => {
                Exclusion::TolerationExpired { taint, seconds_ago }
            }
        };
        // NoSchedule blocks new replicas and keeps running ones; NoExecute evicts, except
        // stateful placements, which stay where their data is.
        let keeps = if effect == "NoSchedule" {
            Some(Kept::NoSchedule(taint))
        } else if stateful {
            Some(Kept::StatefulNoExecute(taint))
        } else {
            None
        };
        match keeps {
            Some(reason) if holds_replicas() => {
                kept.get_or_insert(reason);
            }
            _ => return Err(refused),
        }
    }

    if cluster.ready {
        Ok(kept.map_or(Admission::Ready, Admission::Kept))
    } else if !no_execute_taints && kept.is_none() {
        // Readiness is not carried by a taint we could weigh tolerations against.
        Err(Exclusion::NotReady)
    } else if holds_replicas() {
        // Kubernetes' NotReady node rule, lifted to clusters: nothing new is placed on it,
        // and what runs there stays as long as the NoExecute taint is tolerated.
        Ok(Admission::Kept(Kept::NotReady { seconds_left }))
    } else {
        Err(Exclusion::NotReadyNoNewReplicas)
    }
}

/// What a cluster's taint means for a placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TaintVerdict {
    NotTolerated,
    /// Tolerated with tolerationSeconds that ran out `seconds_ago` seconds ago.
    Expired {
        seconds_ago: i64,
    },
    /// Tolerated, for `seconds_left` more seconds (None = indefinitely).
    Tolerated {
        seconds_left: Option<i64>,
    },
}

/// Judges one taint against the tolerations at `now_millis` (Unix milliseconds). As in
/// Kubernetes' taint manager, when several tolerations match, the shortest
/// tolerationSeconds wins, and only tolerations without tolerationSeconds tolerate
/// indefinitely. A taint without `timeAdded` counts as added just now.
pub(crate) fn taint_verdict(
    taint: &Taint,
    tolerations: &[Toleration],
    now_millis: i64,
) -> TaintVerdict {
    let mut matched = false;
    let mut shortest: Option<i64> = None;
    for toleration in tolerations {
        if toleration_matches(toleration, taint) {
            matched = true;
            if let Some(seconds) = toleration.toleration_seconds {
                shortest = Some(shortest.map_or(seconds, |s| s.min(seconds)));
            }
        }
    }
    if !matched {
        return TaintVerdict::NotTolerated;
    }
    let Some(seconds) = shortest else {
        return TaintVerdict::Tolerated { seconds_left: None };
    };
    let added = taint
        .time_added
        .as_ref()
        .map_or(now_millis, |time| time.0.as_millisecond());
    let deadline = added.saturating_add(seconds.max(0).saturating_mul(1000));
    if now_millis >= deadline {
        TaintVerdict::Expired {
            seconds_ago: (now_millis - deadline) / 1000,
        }
    } else {
        // Rounded up: "1s left" until the very end.
        let left = deadline - now_millis;
        TaintVerdict::Tolerated {
            seconds_left: Some((left + 999) / 1000),
        }
    }
}

/// Whether `toleration` tolerates `taint`, with the core semantics: an effect, when set,
/// must equal the taint's; an empty key (with `Exists`) matches every key; `Equal` (the
/// default operator) compares values, `Exists` ignores them; other operators match
/// nothing.
pub fn toleration_matches(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref()
        && !effect.is_empty()
        && effect != taint.effect
    {
        return false;
    }
    if let Some(key) = toleration.key.as_deref()
        && !key.is_empty()
        && key != taint.key
    {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// Whether `labels` satisfy `selector` (matchLabels and every matchExpression with
/// In/NotIn/Exists/DoesNotExist). An empty selector matches everything; an unknown
/// operator matches nothing.
pub fn label_selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    first_mismatch(selector, labels).is_none()
}

pub(crate) fn first_mismatch<'a>(
    selector: &'a LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Option<Mismatch<'a>> {
    if let Some(match_labels) = &selector.match_labels {
        for (key, value) in match_labels {
            if label_value(labels, key).is_none_or(|v| !same(v, value)) {
                return Some(Mismatch::Label { key, value });
            }
        }
    }
    for requirement in selector.match_expressions.iter().flatten() {
        if !requirement_matches(requirement, labels) {
            return Some(Mismatch::Expression(requirement));
        }
    }
    None
}

fn requirement_matches(
    requirement: &LabelSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
    let value = label_value(labels, &requirement.key);
    let values = requirement.values.as_deref().unwrap_or_default();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| listed(values, v)),
        "NotIn" => value.is_none_or(|v| !listed(values, v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

/// Whether a staticWeightList target matches a cluster: every non-empty field must match;
/// an empty target matches every cluster. The plain statement of the rule that
/// [`WeightTargets`] implements faster; the tests hold one against the other.
#[cfg(test)]
fn target_matches(
    target: &crate::api::propagation_policy::ClusterTarget,
    cluster: &ClusterView,
) -> bool {
    (target.cluster_names.is_empty() || listed(&target.cluster_names, &cluster.name))
        && target
            .label_selector
            .as_ref()
            .is_none_or(|selector| label_selector_matches(selector, &cluster.labels))
        && (target.zones.is_empty() || listed(&target.zones, &cluster.zone))
}

/// A staticWeightList prepared once per placement: every label key its selectors use is
/// looked up once per cluster (not once per entry), and the selectors' maps are flattened
/// into slices. Gives the same answer as checking each entry's target in turn (every
/// non-empty field must match; an empty target matches every cluster).
pub(crate) struct WeightTargets<'a> {
    entries: Vec<CompiledTarget<'a>>,
    keys: Vec<&'a str>,
    match_labels: Vec<(usize, &'a str)>,
    expressions: Vec<(usize, Operator, &'a [String])>,
}

struct CompiledTarget<'a> {
    names: &'a [String],
    zones: &'a [String],
    /// Ranges into `match_labels` and `expressions`; None = no labelSelector.
    selector: Option<(std::ops::Range<usize>, std::ops::Range<usize>)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Unknown,
}

impl<'a> WeightTargets<'a> {
    pub(crate) fn new(list: &'a [StaticClusterWeight]) -> Self {
        let mut targets = WeightTargets {
            entries: Vec::with_capacity(list.len()),
            keys: Vec::new(),
            match_labels: Vec::new(),
            expressions: Vec::new(),
        };
        for entry in list {
            let target = &entry.target_cluster;
            let selector = target.label_selector.as_ref().map(|selector| {
                let labels_start = targets.match_labels.len();
                for (key, value) in selector.match_labels.iter().flatten() {
                    let key = targets.key(key);
                    targets.match_labels.push((key, value));
                }
                let expressions_start = targets.expressions.len();
                for requirement in selector.match_expressions.iter().flatten() {
                    let key = targets.key(&requirement.key);
                    let operator = match requirement.operator.as_str() {
                        "In" => Operator::In,
                        "NotIn" => Operator::NotIn,
                        "Exists" => Operator::Exists,
                        "DoesNotExist" => Operator::DoesNotExist,
                        _ => Operator::Unknown,
                    };
                    let values = requirement.values.as_deref().unwrap_or_default();
                    targets.expressions.push((key, operator, values));
                }
                (
                    labels_start..targets.match_labels.len(),
                    expressions_start..targets.expressions.len(),
                )
            });
            targets.entries.push(CompiledTarget {
                names: &target.cluster_names,
                zones: &target.zones,
                selector,
            });
        }
        targets
    }

    fn key(&mut self, key: &'a str) -> usize {
        match self.keys.iter().position(|k| same(k, key)) {
            Some(index) => index,
            None => {
                self.keys.push(key);
                self.keys.len() - 1
            }
        }
    }

    /// The index of the first entry matching `cluster`. `values` is scratch space, reused
    /// across clusters to avoid an allocation per cluster.
    pub(crate) fn first_match<'c>(
        &self,
        cluster: &'c ClusterView,
        values: &mut Vec<Option<&'c str>>,
    ) -> Option<usize> {
        values.clear();
        values.extend(
            self.keys
                .iter()
                .map(|key| label_value(&cluster.labels, key)),
        );
        self.entries.iter().position(|entry| {
            (entry.names.is_empty() || listed(entry.names, &cluster.name))
                && (entry.zones.is_empty() || listed(entry.zones, &cluster.zone))
                && entry.selector.as_ref().is_none_or(|(labels, expressions)| {
                    self.match_labels[labels.clone()]
                        .iter()
                        .all(|&(key, value)| values[key].is_some_and(|v| same(v, value)))
                        && self.expressions[expressions.clone()].iter().all(
                            |&(key, operator, list)| {
                                let value = values[key];
                                match operator {
                                    Operator::In => value.is_some_and(|v| listed(list, v)),
                                    Operator::NotIn => value.is_none_or(|v| !listed(list, v)),
                                    Operator::Exists => value.is_some(),
                                    Operator::DoesNotExist => value.is_none(),
                                    Operator::Unknown => false,
                                }
                            },
                        )
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::propagation_policy::ClusterTarget;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const NOW: i64 = 1_800_000_000_000;

    fn taint(
        key: &str,
        value: Option<&str>,
        effect: &str,
        added_seconds_ago: Option<i64>,
    ) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            time_added: added_seconds_ago
                .map(|ago| Time(jiff::Timestamp::from_millisecond(NOW - ago * 1000).unwrap())),
        }
    }

    fn toleration(
        key: Option<&str>,
        operator: Option<&str>,
        value: Option<&str>,
        effect: Option<&str>,
        seconds: Option<i64>,
    ) -> Toleration {
        Toleration {
            key: key.map(Into::into),
            operator: operator.map(Into::into),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            toleration_seconds: seconds,
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn requirement(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn equal_toleration_needs_key_value_and_effect() {
        let t = taint("dedicated", Some("db"), "NoSchedule", None);
        assert!(toleration_matches(
            &toleration(
                Some("dedicated"),
                Some("Equal"),
                Some("db"),
                Some("NoSchedule"),
                None
            ),
            &t
        ));
        assert!(
            toleration_matches(
                &toleration(Some("dedicated"), None, Some("db"), None, None),
                &t
            ),
            "Equal is the default operator; an unset effect matches all"
        );
        assert!(!toleration_matches(
            &toleration(Some("dedicated"), Some("Equal"), Some("web"), None, None),
            &t
        ));
        assert!(!toleration_matches(
            &toleration(
                Some("dedicated"),
                Some("Equal"),
                Some("db"),
                Some("NoExecute"),
                None
            ),
            &t
        ));
        assert!(!toleration_matches(
            &toleration(Some("other"), Some("Equal"), Some("db"), None, None),
            &t
        ));
    }

    #[test]
    fn exists_ignores_the_value_and_an_empty_key_matches_everything() {
        let t = taint(
            "federation.example.com/unreachable",
            None,
            "NoExecute",
            None,
        );
        assert!(toleration_matches(
            &toleration(
                Some("federation.example.com/unreachable"),
                Some("Exists"),
                None,
                None,
                None
            ),
            &t
        ));
        assert!(toleration_matches(
            &toleration(None, Some("Exists"), None, None, None),
            &t
        ));
        assert!(toleration_matches(
            &toleration(Some(""), Some("Exists"), None, Some("NoExecute"), None),
            &t
        ));
        assert!(!toleration_matches(
            &toleration(None, Some("Exists"), None, Some("NoSchedule"), None),
            &t
        ));
        assert!(
            !toleration_matches(
                &toleration(Some("x"), Some("Gt"), Some("1"), None, None),
                &t
            ),
            "unknown operators match nothing"
        );
    }

    #[test]
    fn toleration_seconds_count_from_the_time_the_taint_was_added() {
        let exists = |seconds| vec![toleration(None, Some("Exists"), None, None, seconds)];
        let added_30s_ago = taint("k", None, "NoExecute", Some(30));
        assert_eq!(
            taint_verdict(&added_30s_ago, &exists(Some(60)), NOW),
            TaintVerdict::Tolerated {
                seconds_left: Some(30)
            }
        );
        assert_eq!(
            taint_verdict(&added_30s_ago, &exists(Some(30)), NOW),
            TaintVerdict::Expired { seconds_ago: 0 }
        );
        assert_eq!(
            taint_verdict(&added_30s_ago, &exists(Some(10)), NOW),
            TaintVerdict::Expired { seconds_ago: 20 }
        );
        assert_eq!(
            taint_verdict(&added_30s_ago, &exists(None), NOW),
            TaintVerdict::Tolerated { seconds_left: None }
        );
        assert_eq!(
            taint_verdict(&added_30s_ago, &[], NOW),
            TaintVerdict::NotTolerated
        );
    }

    #[test]
    fn a_taint_without_time_added_counts_as_just_added() {
        let fresh = taint("k", None, "NoExecute", None);
        let tolerations = vec![toleration(Some("k"), Some("Exists"), None, None, Some(60))];
        assert_eq!(
            taint_verdict(&fresh, &tolerations, NOW),
            TaintVerdict::Tolerated {
                seconds_left: Some(60)
            }
        );
        let zero = vec![toleration(Some("k"), Some("Exists"), None, None, Some(0))];
        assert_eq!(
            taint_verdict(&fresh, &zero, NOW),
            TaintVerdict::Expired { seconds_ago: 0 }
        );
    }

    #[test]
    fn the_shortest_matching_toleration_wins() {
        let t = taint("k", None, "NoExecute", Some(0));
        let tolerations = vec![
            toleration(Some("k"), Some("Exists"), None, None, None),
            toleration(None, Some("Exists"), None, None, Some(5)),
            toleration(Some("other"), Some("Exists"), None, None, Some(1)),
        ];
        assert_eq!(
            taint_verdict(&t, &tolerations, NOW),
            TaintVerdict::Tolerated {
                seconds_left: Some(5)
            }
        );
    }

    #[test]
    fn match_labels_and_expressions_all_apply() {
        let cluster = labels(&[("env", "prod"), ("tier", "gold")]);
        let selector = |match_labels: &[(&str, &str)],
                        expressions: Vec<LabelSelectorRequirement>| {
            LabelSelector {
                match_labels: (!match_labels.is_empty()).then(|| labels(match_labels)),
                match_expressions: (!expressions.is_empty()).then_some(expressions),
            }
        };
        assert!(label_selector_matches(&LabelSelector::default(), &cluster));
        assert!(label_selector_matches(
            &selector(&[("env", "prod")], vec![]),
            &cluster
        ));
        assert!(!label_selector_matches(
            &selector(&[("env", "dev")], vec![]),
            &cluster
        ));
        assert!(label_selector_matches(
            &selector(&[], vec![requirement("tier", "In", &["gold", "silver"])]),
            &cluster
        ));
        assert!(!label_selector_matches(
            &selector(&[], vec![requirement("tier", "In", &["bronze"])]),
            &cluster
        ));
        assert!(!label_selector_matches(
            &selector(&[], vec![requirement("missing", "In", &["x"])]),
            &cluster
        ));
        assert!(label_selector_matches(
            &selector(&[], vec![requirement("tier", "NotIn", &["bronze"])]),
            &cluster
        ));
        assert!(
            label_selector_matches(
                &selector(&[], vec![requirement("missing", "NotIn", &["x"])]),
                &cluster
            ),
            "NotIn matches an absent key"
        );
        assert!(!label_selector_matches(
            &selector(&[], vec![requirement("tier", "NotIn", &["gold"])]),
            &cluster
        ));
        assert!(label_selector_matches(
            &selector(&[], vec![requirement("env", "Exists", &[])]),
            &cluster
        ));
        assert!(!label_selector_matches(
            &selector(&[], vec![requirement("gpu", "Exists", &[])]),
            &cluster
        ));
        assert!(label_selector_matches(
            &selector(&[], vec![requirement("gpu", "DoesNotExist", &[])]),
            &cluster
        ));
        assert!(!label_selector_matches(
            &selector(&[], vec![requirement("env", "DoesNotExist", &[])]),
            &cluster
        ));
        assert!(!label_selector_matches(
            &selector(&[], vec![requirement("env", "Like", &["prod"])]),
            &cluster
        ));
        // matchLabels AND matchExpressions.
        assert!(!label_selector_matches(
            &selector(&[("env", "prod")], vec![requirement("gpu", "Exists", &[])]),
            &cluster
        ));
    }

    #[test]
    fn compiled_weight_targets_agree_with_target_matches() {
        let selector = |match_labels: &[(&str, &str)],
                        expressions: Vec<LabelSelectorRequirement>| {
            Some(LabelSelector {
                match_labels: (!match_labels.is_empty()).then(|| labels(match_labels)),
                match_expressions: (!expressions.is_empty()).then_some(expressions),
            })
        };
        let target = |names: &[&str], label_selector, zones: &[&str]| StaticClusterWeight {
            target_cluster: ClusterTarget {
                cluster_names: names.iter().map(|n| n.to_string()).collect(),
                label_selector,
                zones: zones.iter().map(|z| z.to_string()).collect(),
            },
            weight: 1,
        };
        let list = vec![
            target(&["east"], None, &["zone-b"]),
            target(
                &[],
                selector(
                    &[("env", "prod")],
                    vec![requirement("tier", "In", &["gold"])],
                ),
                &[],
            ),
            target(
                &[],
                selector(
                    &[],
                    vec![
                        requirement("tier", "NotIn", &["gold"]),
                        requirement("gpu", "Exists", &[]),
                    ],
                ),
                &[],
            ),
            target(
                &[],
                selector(
                    &[],
                    vec![
                        requirement("gpu", "DoesNotExist", &[]),
                        requirement("env", "Like", &[]),
                    ],
                ),
                &[],
            ),
            target(
                &["west", "north"],
                selector(&[("env", "dev")], vec![]),
                &["zone-a", "zone-c"],
            ),
            target(&[], None, &["zone-a"]),
        ];
        let compiled = WeightTargets::new(&list);
        let label_sets = [
            labels(&[]),
            labels(&[("env", "prod"), ("tier", "gold")]),
            labels(&[("env", "prod"), ("tier", "silver"), ("gpu", "a100")]),
            labels(&[("env", "dev")]),
            labels(&[("env", "dev"), ("gpu", "x")]),
        ];
        for name in ["east", "west", "north"] {
            for zone in ["zone-a", "zone-b", "zone-c"] {
                for label_set in &label_sets {
                    let cluster = ClusterView {
                        name: name.into(),
                        zone: zone.into(),
                        labels: label_set.clone(),
                        ..ClusterView::default()
                    };
                    let mut values = Vec::new();
                    let expected = list
                        .iter()
                        .position(|entry| target_matches(&entry.target_cluster, &cluster));
                    assert_eq!(
                        compiled.first_match(&cluster, &mut values),
                        expected,
                        "{name} {zone} {label_set:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn same_agrees_with_string_equality() {
        let words = [
            "",
            "a",
            "ab",
            "abc",
            "abd",
            "abcd",
            "abce",
            "zone-a",
            "zone-b",
            "member-01",
            "member-02",
            "nember-01",
            "member-001",
            "provider-12345678",
            "provider-12345679",
            "xprovider-1234567",
            "federation.example.com/unreachable",
            "federation.example.com/unreachablf",
        ];
        for a in words {
            for b in words {
                assert_eq!(same(a, b), a == b, "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn long_name_lists_are_hashed_and_still_match() {
        let names: Vec<String> = (0..40).map(|i| format!("c{i}")).collect();
        let set = NameSet::new(&names);
        assert!(set.hashed.is_some());
        assert!(set.contains("c39") && !set.contains("c40"));
        let short = NameSet::new(&names[..3]);
        assert!(short.hashed.is_none());
        assert!(short.contains("c2") && !short.contains("c3"));
    }
}
