//! Replica clusters across the federation (`spec.topology.acrossClusters: ReplicaClusters`
//! on a hub MyDatabase, docs/mydatabase.md), pure: which member cluster holds the
//! primary, where the others stream from, and how far behind they are.
//!
//! The primary cluster is chosen once and then recorded twice: in an annotation on every
//! copy the hub applies (written with the copies themselves, so no copy acts on a choice
//! that is not recorded) and in the template's `status.primaryCluster`. A recorded choice
//! wins over `spec.topology.primaryCluster` and over the placement: moving the primary
//! with a changed field would leave two clusters that each believe they hold it.

use kube::api::DynamicObject;
use serde_json::Value;

use crate::api::instance::parse_lsn;
use crate::api::mydatabase::ReplicaSource;
use crate::api::resource_binding::TargetCluster;
use crate::api::{
    ANNOTATION_PRIMARY_CLUSTER, ANNOTATION_SWITCHOVER_PROMOTED, ANNOTATION_SWITCHOVER_STARTED,
    ANNOTATION_SWITCHOVER_TO,
};

/// How long a switchover may take to demote the old primary cluster and have the new one
/// catch up with its last WAL position, and then how long the members may take to hold
/// the raised primary term, before the hub gives it up and the old primary cluster takes
/// writes again (the hub's `--switchover-deadline`, this by default). Until then nothing
/// was promoted, so giving up is safe; once the hub has told the new primary cluster to
/// promote, the switchover only goes forward.
pub const DEFAULT_SWITCHOVER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// A hub MyDatabase (as JSON) asks for replica clusters, or has a recorded primary
/// cluster (which keeps its copies replica clusters).
pub fn enabled(template: &Value) -> bool {
    let topology = &template["spec"]["topology"];
    topology["acrossClusters"] == "ReplicaClusters"
        || topology["primaryCluster"].is_string()
        || template["status"]["primaryCluster"].is_string()
}

/// The primary cluster recorded on a copy.
pub fn recorded_on(copy: &DynamicObject) -> Option<&str> {
    copy.metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_PRIMARY_CLUSTER)
        .map(String::as_str)
        .filter(|c| !c.is_empty())
}

/// The cluster that holds the primary of a template with replica clusters: the one
/// recorded in its status, else on its copies, else `spec.topology.primaryCluster`, else
/// the first placed cluster in `order` (the policy's `clusterAffinity.clusterNames`), the
/// others by name. `Err` says why none can be chosen; `Ok(None)`: nothing is placed yet.
pub fn primary_cluster<'a>(
    template: &Value,
    targets: &[TargetCluster],
    copies: impl IntoIterator<Item = &'a DynamicObject>,
    order: &[String],
) -> Result<Option<String>, String> {
    if let Some(recorded) = template["status"]["primaryCluster"].as_str() {
        return Ok(Some(recorded.to_string()));
    }
    let mut on_copies: Vec<&str> = copies.into_iter().filter_map(recorded_on).collect();
    on_copies.sort_unstable();
    on_copies.dedup();
    match on_copies[..] {
        [] => {}
        [one] => return Ok(Some(one.to_string())),
        _ => {
            return Err(format!(
                "the copies record different primary clusters ({}); set status.primaryCluster on the hub template to the one that holds the primary",
                on_copies.join(", ")
            ));
        }
    }
    let placed = placed(targets);
    if let Some(named) = template["spec"]["topology"]["primaryCluster"].as_str() {
        if placed.contains(&named) {
            return Ok(Some(named.to_string()));
        }
        return Err(format!(
            "spec.topology.primaryCluster names {named}, which the placement does not include ({}); name one of those clusters, or place the database in {named}",
            if placed.is_empty() {
                "no cluster yet".to_string()
            } else {
                placed.join(", ")
            }
        ));
    }
    Ok(first_in_order(placed, order))
}

/// Where the other clusters reach a copy's primary, as its agent published it
/// (`status.endpoint`); None until it has, or when what it wrote is not an address.
pub fn endpoint(copy: &DynamicObject) -> Option<ReplicaSource> {
    let source: ReplicaSource =
        serde_json::from_value(copy.data["status"]["endpoint"].clone()).ok()?;
    let valid = !source.host.is_empty()
        && source.host.len() <= 253
        && source
            .host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '-'))
        && (1..=65535).contains(&source.port);
    valid.then_some(source)
}

/// The WAL position a member copy's recorded primary last reported (a primary's write
/// position; in a replica cluster, what its designated primary has received).
fn primary_position(status: &Value) -> Option<u64> {
    let primary = status["primary"].as_str()?;
    status["instances"]
        .as_array()?
        .iter()
        .find(|i| i["name"] == primary)
        .and_then(|i| i["lsn"].as_str())
        .and_then(parse_lsn)
}

/// How many bytes of WAL a replica cluster is behind the primary cluster, from the
/// positions both last reported (0 when the replica reports the later one: the two are
/// read at different moments).
pub fn lag_bytes(primary: &Value, replica: &Value) -> Option<u64> {
    Some(primary_position(primary)?.saturating_sub(primary_position(replica)?))
}

/// Where a switchover of the primary cluster stands, as the copies show it. Asked for by
/// setting `spec.topology.primaryCluster` to another placed cluster (`bulkhead
/// switchover` does); each stage is recorded on the copies themselves, so a restarted
/// hub picks it up where it was.
#[derive(Clone, Debug, PartialEq)]
pub enum Switchover {
    /// The primary stays where it is recorded.
    None,
    /// Asked for, not started: why (a cluster not Ready, the target not streaming). The
    /// primary stays; the switchover starts once the reason is gone.
    Waiting { to: String, why: String },
    /// The old primary cluster's copy is read-only (`spec.readOnly`) and marked
    /// `switchover-to`; waiting until every instance there runs as a standby.
    Demoting { to: String },
    /// The old primary refuses writes; the new primary cluster still streams from it until
    /// its designated primary has received the old one's last WAL position.
    CatchingUp { to: String, last: u64 },
    /// The new primary cluster has every write: the hub raises the federation's primary
    /// term to `term` for this switchover (`status.switchover`) before anything promotes.
    RaisingTerm { to: String, term: u64 },
    /// The raised term is recorded; waiting until the fencing Lease of every member the
    /// hub reaches carries it (`lacking`: those whose last renewal did not). From then on
    /// a copy written under an older term (the old primary cluster's) is deposed there.
    RecordingTerm {
        to: String,
        term: u64,
        lacking: Vec<String>,
    },
    /// The new primary cluster has everything: its copy loses `replicaOf`, its agent
    /// promotes its designated primary.
    Promoting { to: String },
    /// The new primary cluster runs a primary: the hub records it as the primary cluster,
    /// and the old one follows it.
    Done { to: String },
    /// Not promoted by the deadline (`after` seconds, [`DEFAULT_SWITCHOVER_DEADLINE`]
    /// unless the hub was given another): given up, where it stood in `why`. The hub
    /// records it in the template's `status.abortedSwitchover`, then the old primary
    /// cluster's copy loses `readOnly` and takes writes again.
    Aborting { to: String, why: String, after: u64 },
}

impl Switchover {
    /// The cluster the primary moves to, once the switchover started.
    pub fn started_to(&self) -> Option<&str> {
        match self {
            Switchover::Demoting { to }
            | Switchover::CatchingUp { to, .. }
            | Switchover::RaisingTerm { to, .. }
            | Switchover::RecordingTerm { to, .. }
            | Switchover::Promoting { to }
            | Switchover::Done { to } => Some(to),
            Switchover::None | Switchover::Waiting { .. } | Switchover::Aborting { .. } => None,
        }
    }

    /// The cluster a switchover is asked to, started or not.
    pub fn target(&self) -> Option<&str> {
        match self {
            Switchover::Waiting { to, .. } | Switchover::Aborting { to, .. } => Some(to),
            other => other.started_to(),
        }
    }

    /// The new primary cluster's copy no longer streams from the old one.
    pub fn promotes(&self) -> bool {
        matches!(self, Switchover::Promoting { .. } | Switchover::Done { .. })
    }

    /// In words, for the binding's rows.
    pub fn describe(&self, from: &str) -> Option<String> {
        Some(match self {
            Switchover::None => return None,
            Switchover::Waiting { to, why } => {
                format!("switchover from {from} to {to} not started: {why}")
            }
            Switchover::Demoting { to } => format!(
                "switchover from {from} to {to}: {from} made read-only, waiting until every instance there runs as a standby"
            ),
            Switchover::CatchingUp { to, last } => format!(
                "switchover from {from} to {to}: {from} refuses writes; waiting until {to} has received its last WAL position {}",
                crate::api::instance::format_lsn(*last)
            ),
            Switchover::RaisingTerm { to, term } => format!(
                "switchover from {from} to {to}: {to} has all of {from}'s WAL; raising the primary term to {term}"
            ),
            Switchover::RecordingTerm { to, term, lacking } if lacking.is_empty() => format!(
                "switchover from {from} to {to}: every member holds primary term {term}; recording that {to} is told to promote before it is"
            ),
            Switchover::RecordingTerm { to, term, lacking } => format!(
                "switchover from {from} to {to}: {to} has all of {from}'s WAL; waiting until every member holds primary term {term} (not yet: {})",
                lacking.join(", ")
            ),
            Switchover::Promoting { to } => {
                format!(
                    "switchover from {from} to {to}: {to} has all of {from}'s WAL and every member holds the raised term; promoting it"
                )
            }
            Switchover::Done { to } => {
                format!("switchover from {from} to {to}: {to} runs the primary; recording it")
            }
            Switchover::Aborting { to, why, after } => format!(
                "switchover from {from} to {to} aborted after {after} s, nothing promoted ({why}); {from} takes writes again"
            ),
        })
    }
}

fn annotation<'a>(copy: &'a DynamicObject, key: &str) -> Option<&'a str> {
    copy.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

fn instances(copy: &DynamicObject) -> &[Value] {
    copy.data["status"]["instances"]
        .as_array()
        .map_or(&[], Vec::as_slice)
}

/// Some instance of the copy runs as primary.
fn runs_a_primary(copy: &DynamicObject) -> bool {
    instances(copy).iter().any(|i| i["role"] == "Primary")
}

/// The copy's agent has seen its current spec and every instance runs as a standby: the
/// cluster takes no write.
fn demoted(copy: &DynamicObject) -> bool {
    let status = &copy.data["status"];
    let current = match (
        copy.metadata.generation,
        status["observedGeneration"].as_i64(),
    ) {
        (Some(generation), Some(observed)) => observed >= generation,
        _ => false,
    };
    current && !instances(copy).is_empty() && instances(copy).iter().all(|i| i["role"] == "Standby")
}

/// The highest WAL position the copy's instances report.
fn last_position(copy: &DynamicObject) -> Option<u64> {
    instances(copy)
        .iter()
        .filter_map(|i| i["lsn"].as_str().and_then(parse_lsn))
        .max()
}

/// A member copy's status says its agent runs it as a replica cluster (condition
/// `ReadOnly`, reason `ReplicaCluster`).
pub fn runs_as_replica_cluster(status: &Value) -> bool {
    status["conditions"].as_array().is_some_and(|conditions| {
        conditions.iter().any(|c| {
            c["type"] == "ReadOnly"
                && c["status"] == "True"
                && c["reason"] == crate::api::mydatabase::REASON_REPLICA_CLUSTER
        })
    })
}

/// Where the switchover of a database whose recorded primary cluster is `primary`
/// stands at `now`. `copy` finds a cluster's copy as last seen; `not_ready` says why a
/// cluster is not Ready (None: it is); `lacking` names the members the hub reaches whose
/// fencing Lease does not carry a primary term yet; `order` is the policy's cluster order;
/// nothing promoted within `deadline` gives the switchover up.
#[allow(clippy::too_many_arguments)]
pub fn switchover<'a>(
    template: &Value,
    primary: &str,
    targets: &[TargetCluster],
    order: &[String],
    copy: &dyn Fn(&str) -> Option<&'a DynamicObject>,
    not_ready: &dyn Fn(&str) -> Option<String>,
    lacking: &dyn Fn(u64) -> Vec<String>,
    now: jiff::Timestamp,
    deadline: std::time::Duration,
) -> Switchover {
    // The mark on the primary cluster's own copy. Once the new primary cluster is
    // recorded its copy still carries the mark until the hub applies it again: a mark
    // naming the primary cluster itself is a switchover that is over.
    // Or the term the hub raised for it, which outlives a hub that did not see the mark
    // yet (one that just started, its copies not listed): the old primary cluster's copy
    // is never written without its mark once the new primary cluster may be promoted.
    // A mark a disaster promotion ended (see [`promoted_over`]) starts nothing.
    let started = copy(primary)
        .filter(|c| !promoted_over(template, primary, c))
        .and_then(|c| annotation(c, ANNOTATION_SWITCHOVER_TO))
        .filter(|to| *to != primary)
        .or_else(|| in_flight(template, primary).map(|record| record.to));
    let wanted = wanted_cluster(template, primary, targets, order);
    let Some(to) = started.map(str::to_string).or(wanted) else {
        return Switchover::None;
    };
    if started.is_none() {
        return match not_started(template, primary, &to, targets, copy, not_ready) {
            Some(why) => Switchover::Waiting { to, why },
            None => Switchover::Demoting { to },
        };
    }
    let told = in_flight(template, primary).is_some_and(|record| record.promoting);
    let stage = started_stage(template, primary, to.clone(), copy, lacking);
    // Recorded as told to promote (before the hub told it): the new primary cluster may
    // run a primary already, whatever its copy as last seen (or not seen at all, by a hub
    // that just started and cannot reach it) shows. Never given up from here.
    if told && !matches!(stage, Switchover::Done { .. }) {
        return Switchover::Promoting { to };
    }
    // Given up and recorded, nothing promoted: the old primary cluster's copy is being
    // written unmarked. A copy still seen marked (the hub's view lags its own write) must
    // not carry the switchover on (a new term, a promotion) while it takes writes again.
    if let Switchover::Demoting { to }
    | Switchover::CatchingUp { to, .. }
    | Switchover::RaisingTerm { to, .. }
    | Switchover::RecordingTerm { to, .. } = &stage
        && aborted_recorded(template, primary, to)
    {
        return Switchover::Aborting {
            to: to.clone(),
            why: template["status"]["abortedSwitchover"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            after: deadline.as_secs(),
        };
    }
    // Nothing promoted yet: past the deadline the switchover is given up. Demoting and
    // catching up count from the start; once the new primary cluster has every write the
    // switchover goes on, and only waiting for the members to hold the raised term counts
    // from the raise.
    let since = match &stage {
        Switchover::Demoting { .. } | Switchover::CatchingUp { .. } => {
            copy(primary).and_then(|c| annotation(c, ANNOTATION_SWITCHOVER_STARTED))
        }
        Switchover::RecordingTerm { .. } => template["status"]["switchover"]["time"].as_str(),
        _ => return stage,
    };
    let since = since.and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let after = deadline.as_secs();
    let deadline = jiff::SignedDuration::try_from(deadline).unwrap_or_default();
    let Some(to) = stage.started_to() else {
        return stage;
    };
    match since {
        Some(since) if now.duration_since(since) >= deadline => Switchover::Aborting {
            to: to.to_string(),
            why: stage
                .describe(primary)
                .unwrap_or_default()
                .trim_start_matches(&format!("switchover from {primary} to {to}: "))
                .to_string(),
            after,
        },
        _ => stage,
    }
}

/// The cluster the primary is asked to move to: `spec.topology.primaryCluster` when it
/// names another cluster; unset, when the placement no longer includes the primary
/// cluster, the first placed cluster in `order` (make-before-break: the primary moves
/// before its cluster's copy is removed). None: it stays.
fn wanted_cluster(
    template: &Value,
    primary: &str,
    targets: &[TargetCluster],
    order: &[String],
) -> Option<String> {
    match template["spec"]["topology"]["primaryCluster"].as_str() {
        Some(named) => Some(named)
            .filter(|named| *named != primary)
            .map(str::to_string),
        None => {
            let placed = placed(targets);
            if placed.contains(&primary) {
                return None;
            }
            first_in_order(placed, order)
        }
    }
}

/// The clusters the placement gives replicas to.
fn placed(targets: &[TargetCluster]) -> Vec<&str> {
    targets
        .iter()
        .filter(|t| t.replicas > 0)
        .map(|t| t.name.as_str())
        .collect()
}

/// The first of `clusters` in `order` (the policy's `clusterAffinity.clusterNames`), the
/// others by name.
fn first_in_order(mut clusters: Vec<&str>, order: &[String]) -> Option<String> {
    clusters.sort_by_key(|cluster| {
        (
            order
                .iter()
                .position(|o| o == cluster)
                .unwrap_or(usize::MAX),
            *cluster,
        )
    });
    clusters.first().map(|c| c.to_string())
}

/// The template's status records the switchover from `from` to `to` as aborted already.
pub(super) fn aborted_recorded(template: &Value, from: &str, to: &str) -> bool {
    let aborted = &template["status"]["abortedSwitchover"];
    aborted["from"] == from && aborted["to"] == to
}

/// Why a switchover to `to` that has not started may not start now; None: it may.
fn not_started<'a>(
    template: &Value,
    primary: &str,
    to: &str,
    targets: &[TargetCluster],
    copy: &dyn Fn(&str) -> Option<&'a DynamicObject>,
    not_ready: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    // Nothing is changed until every condition holds.
    if aborted_recorded(template, primary, to) {
        let aborted = &template["status"]["abortedSwitchover"];
        return Some(format!(
            "the switchover to {to} was aborted at {} ({}); ask again with `bulkhead switchover`, or set spec.topology.primaryCluster to {primary}",
            aborted["time"].as_str().unwrap_or_default(),
            aborted["message"].as_str().unwrap_or_default(),
        ));
    }
    let mut placed = placed(targets);
    if !placed.contains(&to) {
        return Some(format!(
            "{to} is not in the placement ({}); place the database there first",
            placed.join(", ")
        ));
    }
    if !placed.contains(&primary) {
        // Dropped from the placement, it still holds the primary: it must be Ready too.
        placed.push(primary);
    }
    if let Some(why) = placed.iter().find_map(|c| {
        not_ready(c)
            .map(|why| format!("{c} is not Ready ({why}); every cluster of the placement must be"))
    }) {
        return Some(why);
    }
    if !copy(to).is_some_and(streams_as_replica_cluster) {
        return Some(format!(
            "{to}'s copy does not run as a streaming replica cluster yet"
        ));
    }
    if !copy(primary).is_some_and(runs_a_primary) {
        return Some(format!("{primary} runs no primary to switch over from"));
    }
    None
}

/// The copy runs as a replica cluster and reports a WAL position.
fn streams_as_replica_cluster(copy: &DynamicObject) -> bool {
    runs_as_replica_cluster(&copy.data["status"]) && last_position(copy).is_some()
}

/// The cluster a disaster promotion takes the primary from, the one that may run it: the
/// recorded primary cluster, or, once a switchover from it recorded that its target is
/// told to promote, that target (it may run a primary already; the old primary cluster
/// is demoted and holds every write it took).
pub fn lost_cluster<'a>(template: &'a Value, primary: &'a str) -> &'a str {
    in_flight(template, primary)
        .filter(|record| record.promoting)
        .map_or(primary, |record| record.to)
}

/// A disaster promotion recorded under the current term made `primary` the primary
/// cluster after `copy`, its copy, was last written: a switchover mark on it belongs to
/// the switchover that promotion ended.
fn promoted_over(template: &Value, primary: &str, copy: &DynamicObject) -> bool {
    let promotion = &template["status"]["promotion"];
    let term = recorded_term(template);
    promotion["to"] == primary && promotion["term"].as_u64() == Some(term) && copy_term(copy) < term
}

/// Why a disaster promotion of `to` may not be recorded for a database whose recorded
/// primary cluster is `primary`; None: it may. Only while the cluster that may run the
/// primary ([`lost_cluster`]) does not answer (one that does moves its primary with a
/// switchover, which loses nothing), to a placed, Ready cluster that holds the data: a
/// replica cluster with a reported position, or the old primary cluster of a switchover
/// whose target was told to promote and is lost.
pub fn promotion_refused<'a>(
    template: &Value,
    primary: &str,
    to: &str,
    targets: &[TargetCluster],
    copy: &dyn Fn(&str) -> Option<&'a DynamicObject>,
    not_ready: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    let lost = lost_cluster(template, primary);
    let switching = lost != primary;
    if to == lost {
        return Some(if switching {
            format!(
                "the switchover from {primary} told {to} to promote: it holds the primary once it answers"
            )
        } else {
            format!("{to} already holds the primary")
        });
    }
    let placed = placed(targets);
    if !placed.contains(&to) {
        return Some(format!(
            "{to} is not in the placement ({}); promote a placed cluster",
            placed.join(", ")
        ));
    }
    if let Some(why) = not_ready(to) {
        return Some(format!("{to} is not Ready ({why})"));
    }
    if not_ready(lost).is_none() {
        return Some(if switching {
            format!(
                "{lost} is Ready and told to promote by the switchover from {primary}: the switchover finishes by itself (a promotion is for a cluster lost for good)"
            )
        } else {
            format!(
                "{primary} is Ready and holds the primary: move it with `bulkhead switchover`, which loses nothing (a promotion is for a primary cluster lost for good)"
            )
        });
    }
    let demoted_old_primary = switching && to == primary;
    if !demoted_old_primary && !copy(to).is_some_and(streams_as_replica_cluster) {
        return Some(format!(
            "{to}'s copy does not run as a replica cluster with a reported WAL position: it holds no data to promote"
        ));
    }
    None
}

/// The primary term a member copy was written under (absent: 1).
pub fn copy_term(copy: &DynamicObject) -> u64 {
    annotation(copy, crate::api::ANNOTATION_PRIMARY_TERM)
        .and_then(|t| t.parse().ok())
        .unwrap_or(1)
}

/// The term the primary cluster's copy (`seen`, as last seen) keeps while a switchover
/// moves the primary away, the federation's term being `term`: the one it was written
/// under, and before the raise as far as the hub knows. A copy written before a disaster
/// promotion that made its cluster the primary counts as written under the promotion's
/// term: a switchover asked right after it marks the copy under that term, so the mark
/// is not taken for one the promotion ended ([`promoted_over`]).
pub fn demoted_term(
    template: &Value,
    primary: &str,
    seen: Option<&DynamicObject>,
    term: u64,
) -> u64 {
    let seen = seen
        .filter(|c| !promoted_over(template, primary, c))
        .map(copy_term);
    let before_raise = in_flight(template, primary).map(|_| term.saturating_sub(1).max(1));
    [seen, before_raise]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(term)
}

/// `status.switchover` for a switchover from `primary` whose raised term is the recorded
/// one, not given up: the switchover is under way, whatever the copies show.
pub fn in_flight<'a>(template: &'a Value, primary: &str) -> Option<InFlight<'a>> {
    let record = &template["status"]["switchover"];
    let to = record["to"].as_str().filter(|to| *to != primary)?;
    let live = record["from"] == primary
        && record["term"].as_u64() == Some(recorded_term(template))
        && template["status"]["primaryCluster"] == primary
        && !aborted_recorded(template, primary, to);
    live.then(|| InFlight {
        to,
        started: record["started"].as_str().unwrap_or_default(),
        promoting: record["promoting"].as_str().is_some_and(|p| !p.is_empty()),
    })
}

/// A switchover the template's status records as under way (see [`in_flight`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlight<'a> {
    pub to: &'a str,
    /// When it started, as the old primary cluster's copy was marked.
    pub started: &'a str,
    /// The hub recorded that it tells `to` to promote: the switchover only goes forward.
    pub promoting: bool,
}

/// The primary term the template's status records (absent: 1).
pub fn recorded_term(template: &Value) -> u64 {
    template["status"]["primaryTerm"]
        .as_u64()
        .unwrap_or(1)
        .max(1)
}

/// The term `status.switchover` records as raised for this very switchover (from
/// `primary` to `to`, started at `started`, the old primary cluster's copy's mark), if it
/// is the recorded term. A switchover asked again after an abort raises a term of its own.
fn term_raised_for(
    template: &Value,
    primary: &str,
    to: &str,
    started: Option<&str>,
) -> Option<u64> {
    let record = &template["status"]["switchover"];
    let term = record["term"].as_u64()?;
    (record["from"] == primary
        && record["to"] == to
        && record["started"].as_str().unwrap_or_default() == started.unwrap_or_default()
        && term == recorded_term(template))
    .then_some(term)
}

/// The stage of a started switchover from `primary` to `to`, from the copies.
fn started_stage<'a>(
    template: &Value,
    primary: &str,
    to: String,
    copy: &dyn Fn(&str) -> Option<&'a DynamicObject>,
    lacking: &dyn Fn(u64) -> Vec<String>,
) -> Switchover {
    let Some(target) = copy(&to) else {
        return Switchover::Demoting { to };
    };
    let marked = annotation(target, ANNOTATION_SWITCHOVER_TO) == Some(to.as_str());
    if marked && runs_a_primary(target) {
        return Switchover::Done { to };
    }
    if marked && annotation(target, ANNOTATION_SWITCHOVER_PROMOTED) == Some(primary) {
        // Told to promote: whatever its status shows for a moment (an instance
        // restarting), it is never told to stream from the old primary again.
        return Switchover::Promoting { to };
    }
    let Some(old) = copy(primary).filter(|c| demoted(c)) else {
        return Switchover::Demoting { to };
    };
    let Some(last) = last_position(old) else {
        return Switchover::Demoting { to };
    };
    let received = target.data["status"]["primary"]
        .as_str()
        .and_then(|designated| {
            instances(target)
                .iter()
                .find(|i| i["name"] == designated)
                .and_then(|i| i["lsn"].as_str())
                .and_then(parse_lsn)
        });
    if received.is_none_or(|received| received < last) {
        return Switchover::CatchingUp { to, last };
    }
    // Every write is there: the term goes up, and every member the hub reaches must hold
    // it before anything is promoted.
    let started = annotation(old, ANNOTATION_SWITCHOVER_STARTED);
    let Some(term) = term_raised_for(template, primary, &to, started) else {
        return Switchover::RaisingTerm {
            to,
            term: recorded_term(template) + 1,
        };
    };
    let lacking = lacking(term);
    if lacking.is_empty() {
        Switchover::Promoting { to }
    } else {
        Switchover::RecordingTerm { to, term, lacking }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn target(name: &str, replicas: i32) -> TargetCluster {
        TargetCluster {
            name: name.into(),
            replicas,
        }
    }

    fn copy(annotation: Option<&str>, status: Value) -> DynamicObject {
        let mut object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "MyDatabase",
            "metadata": {"name": "orders"}, "status": status
        }))
        .unwrap();
        if let Some(cluster) = annotation {
            object
                .annotations_mut()
                .insert(ANNOTATION_PRIMARY_CLUSTER.into(), cluster.into());
        }
        object
    }

    use kube::ResourceExt;

    #[test]
    fn replica_clusters_are_asked_for_or_kept_once_recorded() {
        assert!(!enabled(&json!({"spec": {"replicas": 2}})));
        assert!(!enabled(
            &json!({"spec": {"topology": {"acrossClusters": "Independent"}}})
        ));
        assert!(enabled(
            &json!({"spec": {"topology": {"acrossClusters": "ReplicaClusters"}}})
        ));
        assert!(enabled(
            &json!({"spec": {"topology": {"primaryCluster": "west"}}})
        ));
        assert!(
            enabled(&json!({"spec": {}, "status": {"primaryCluster": "east"}})),
            "a recorded primary cluster keeps the copies replica clusters"
        );
    }

    #[test]
    fn the_first_placed_cluster_in_the_policys_order_holds_the_primary() {
        let template = json!({"spec": {"topology": {"acrossClusters": "ReplicaClusters"}}});
        let targets = [target("east", 1), target("north", 1), target("west", 1)];
        let order = ["west".to_string(), "east".to_string()];
        assert_eq!(
            primary_cluster(&template, &targets, [], &order),
            Ok(Some("west".into()))
        );
        assert_eq!(
            primary_cluster(&template, &targets, [], &[]),
            Ok(Some("east".into())),
            "by name when the policy names none"
        );
        let emptied = [target("east", 0), target("west", 1)];
        assert_eq!(
            primary_cluster(&template, &emptied, [], &[]),
            Ok(Some("west".into())),
            "a cluster given no replicas holds nothing"
        );
        assert_eq!(primary_cluster(&template, &[], [], &[]), Ok(None));
    }

    #[test]
    fn a_recorded_primary_cluster_wins_over_the_field_and_the_placement() {
        let targets = [target("east", 1), target("west", 1)];
        let template = json!({"spec": {"topology": {"primaryCluster": "west"}}});
        assert_eq!(
            primary_cluster(&template, &targets, [], &[]),
            Ok(Some("west".into()))
        );
        let on_copies = [copy(Some("east"), json!({})), copy(Some("east"), json!({}))];
        assert_eq!(
            primary_cluster(&template, &targets, &on_copies, &[]),
            Ok(Some("east".into())),
            "the copies' record wins over a changed field"
        );
        let recorded = json!({"spec": {"topology": {"primaryCluster": "west"}},
                              "status": {"primaryCluster": "north"}});
        assert_eq!(
            primary_cluster(&recorded, &targets, &on_copies, &[]),
            Ok(Some("north".into())),
            "the status's record wins, even out of the placement"
        );
        let split = [copy(Some("east"), json!({})), copy(Some("west"), json!({}))];
        let error = primary_cluster(&template, &targets, &split, &[]).unwrap_err();
        assert!(error.contains("east, west") && error.contains("status.primaryCluster"));
    }

    #[test]
    fn a_primary_cluster_outside_the_placement_is_refused_with_the_fix() {
        let template = json!({"spec": {"topology": {"primaryCluster": "south"}}});
        let error = primary_cluster(&template, &[target("east", 1)], [], &[]).unwrap_err();
        assert!(
            error.contains("spec.topology.primaryCluster names south")
                && error.contains("(east)")
                && error.contains("place the database in south"),
            "{error}"
        );
    }

    #[test]
    fn the_endpoint_is_read_only_when_it_is_an_address() {
        let good = copy(
            None,
            json!({"endpoint": {"host": "10.0.0.4", "port": 5432}}),
        );
        assert_eq!(
            endpoint(&good),
            Some(ReplicaSource {
                host: "10.0.0.4".into(),
                port: 5432
            })
        );
        for bad in [
            json!({}),
            json!({"endpoint": {"host": "", "port": 5432}}),
            json!({"endpoint": {"host": "a b", "port": 5432}}),
            json!({"endpoint": {"host": "10.0.0.4", "port": 0}}),
            json!({"endpoint": {"host": "10.0.0.4", "port": "x"}}),
        ] {
            assert_eq!(endpoint(&copy(None, bad.clone())), None, "{bad}");
        }
    }

    fn database_copy(
        generation: i64,
        annotations: &[(&str, &str)],
        status: Value,
    ) -> DynamicObject {
        let mut object = copy(None, status);
        object.metadata.generation = Some(generation);
        for (key, value) in annotations {
            object
                .annotations_mut()
                .insert(key.to_string(), value.to_string());
        }
        object
    }

    fn replica_status(lsn: &str) -> Value {
        json!({"observedGeneration": 1, "primary": "orders-0",
               "conditions": [{"type": "ReadOnly", "status": "True", "reason": "ReplicaCluster"}],
               "instances": [{"name": "orders-0", "role": "Standby", "lsn": lsn}]})
    }

    /// A placement that drops the primary cluster moves the primary first, to the first
    /// placed cluster in the policy's order, once every cluster (the dropped one too) is
    /// Ready; a `primaryCluster` the user set is never overridden.
    #[test]
    fn a_placement_that_drops_the_primary_cluster_moves_the_primary_first() {
        let primary_status = json!({"observedGeneration": 1, "primary": "orders-0",
            "instances": [{"name": "orders-0", "role": "Primary", "lsn": "0/5000000"}]});
        let east = database_copy(1, &[], primary_status);
        let west = database_copy(1, &[], replica_status("0/5000000"));
        let north = database_copy(1, &[], replica_status("0/5000000"));
        let copy = |cluster: &str| match cluster {
            "east" => Some(&east),
            "west" => Some(&west),
            "north" => Some(&north),
            _ => None,
        };
        let unset = json!({"spec": {"topology": {"acrossClusters": "ReplicaClusters"}},
                           "status": {"primaryCluster": "east"}});
        let order = ["north".to_string(), "west".to_string()];
        let kept = [target("east", 1), target("west", 1), target("north", 1)];
        let dropped = [target("west", 1), target("north", 1), target("east", 0)];
        let ready = |_: &str| None;
        let stage = |template: &Value,
                     targets: &[TargetCluster],
                     not_ready: &dyn Fn(&str) -> Option<String>| {
            switchover(
                template,
                "east",
                targets,
                &order,
                &copy,
                not_ready,
                &|_| vec![],
                now(),
                DEFAULT_SWITCHOVER_DEADLINE,
            )
        };
        assert_eq!(stage(&unset, &kept, &ready), Switchover::None);
        assert_eq!(
            stage(&unset, &dropped, &ready),
            Switchover::Demoting { to: "north".into() },
            "the first in the policy's order, not by name"
        );
        let east_cut = |c: &str| (c == "east").then(|| "unreachable".to_string());
        assert!(matches!(stage(&unset, &dropped, &east_cut),
            Switchover::Waiting { to, why } if to == "north" && why.contains("east is not Ready")));
        let named = json!({"spec": {"topology": {"primaryCluster": "east"}},
                           "status": {"primaryCluster": "east"}});
        assert_eq!(stage(&named, &dropped, &ready), Switchover::None);
    }

    /// A disaster promotion only of a placed, Ready replica cluster with data, and only
    /// while the primary cluster does not answer.
    #[test]
    fn a_promotion_needs_a_lost_primary_cluster_and_a_replica_with_data() {
        let primary_status = json!({"observedGeneration": 1, "primary": "orders-0",
            "instances": [{"name": "orders-0", "role": "Primary", "lsn": "0/5000000"}]});
        let west = database_copy(1, &[], primary_status);
        let east = database_copy(1, &[], replica_status("0/4000000"));
        let empty = database_copy(1, &[], json!({"observedGeneration": 1}));
        let targets = [target("west", 1), target("east", 1)];
        let west_lost = |c: &str| (c == "west").then(|| "unreachable".to_string());
        let refused =
            |to: &str, east: &DynamicObject, not_ready: &dyn Fn(&str) -> Option<String>| {
                let copy = |cluster: &str| match cluster {
                    "west" => Some(&west),
                    "east" => Some(east),
                    _ => None,
                };
                promotion_refused(&json!({}), "west", to, &targets, &copy, not_ready)
            };
        assert_eq!(refused("east", &east, &west_lost), None);
        let why = refused("east", &east, &|_| None).unwrap();
        assert!(
            why.contains("west is Ready") && why.contains("bulkhead switchover"),
            "{why}"
        );
        let why = refused("north", &east, &west_lost).unwrap();
        assert!(why.contains("north is not in the placement"), "{why}");
        let why = refused("west", &east, &west_lost).unwrap();
        assert!(why.contains("already holds the primary"), "{why}");
        let both_lost = |_: &str| Some("unreachable".to_string());
        let why = refused("east", &east, &both_lost).unwrap();
        assert!(why.contains("east is not Ready"), "{why}");
        let why = refused("east", &empty, &west_lost).unwrap();
        assert!(why.contains("holds no data"), "{why}");
    }

    /// The stages as the copies show them, from the ask to the record; nothing starts
    /// while a cluster is not Ready or the target does not stream.
    #[test]
    fn a_switchover_demotes_first_promotes_only_what_has_every_write_then_records() {
        let targets = [target("east", 1), target("west", 1)];
        let asked = json!({"spec": {"topology": {"primaryCluster": "west"}},
                           "status": {"primaryCluster": "east"}});
        let primary_status = json!({"observedGeneration": 1, "primary": "orders-0",
            "instances": [{"name": "orders-0", "role": "Primary", "lsn": "0/5000000"}]});
        let east = database_copy(1, &[], primary_status.clone());
        let west = database_copy(1, &[], replica_status("0/5000000"));
        let ready = |_: &str| None;
        let stage = |template: &Value,
                     east: &DynamicObject,
                     west: &DynamicObject,
                     not_ready: &dyn Fn(&str) -> Option<String>| {
            let copy = east_and_west(east, west);
            switchover(
                template,
                "east",
                &targets,
                &[],
                &copy,
                not_ready,
                &|_| vec![],
                now(),
                DEFAULT_SWITCHOVER_DEADLINE,
            )
        };
        let steady = json!({"spec": {"topology": {"primaryCluster": "east"}},
                            "status": {"primaryCluster": "east"}});
        assert_eq!(stage(&steady, &east, &west, &ready), Switchover::None);

        // Not started while a cluster is not Ready, nor while west does not stream.
        let cut = |c: &str| (c == "west").then(|| "unreachable".to_string());
        assert!(matches!(stage(&asked, &east, &west, &cut),
            Switchover::Waiting { why, .. } if why.contains("west is not Ready (unreachable)")));
        let not_streaming = database_copy(1, &[], json!({"observedGeneration": 1}));
        assert!(matches!(stage(&asked, &east, &not_streaming, &ready),
            Switchover::Waiting { why, .. } if why.contains("streaming replica cluster")));
        let elsewhere = json!({"spec": {"topology": {"primaryCluster": "north"}},
                               "status": {"primaryCluster": "east"}});
        assert!(matches!(stage(&elsewhere, &east, &west, &ready),
            Switchover::Waiting { why, .. } if why.contains("north is not in the placement")));

        // Started: east marked; until every instance there is a standby of the copy's
        // current generation, it is demoting, whatever else happens.
        assert_eq!(
            stage(&asked, &east, &west, &ready),
            Switchover::Demoting { to: "west".into() }
        );
        let marked = [(ANNOTATION_SWITCHOVER_TO, "west")];
        let east_marked = database_copy(2, &marked, primary_status.clone());
        assert_eq!(
            stage(&asked, &east_marked, &west, &cut),
            Switchover::Demoting { to: "west".into() }
        );
        let mut stale = primary_status.clone();
        stale["instances"][0]["role"] = json!("Standby");
        let east_stale = database_copy(2, &marked, stale.clone());
        assert_eq!(
            stage(&asked, &east_stale, &west, &ready),
            Switchover::Demoting { to: "west".into() },
            "a status of the generation before readOnly says nothing"
        );
        let mut demoted = stale.clone();
        demoted["observedGeneration"] = json!(2);
        demoted["instances"][0]["lsn"] = json!("0/5000100");
        let east_demoted = database_copy(2, &marked, demoted);
        // Once started, the ask no longer matters: a switchover is finished.
        let withdrawn = steady.clone();
        assert_eq!(
            stage(&withdrawn, &east_demoted, &west, &ready),
            Switchover::CatchingUp {
                to: "west".into(),
                last: 0x5000100
            }
        );
        let west_marked = database_copy(2, &marked, replica_status("0/5000100"));
        // Every write is there: the primary term goes up before anything promotes.
        assert_eq!(
            stage(&asked, &east_demoted, &west_marked, &ready),
            Switchover::RaisingTerm {
                to: "west".into(),
                term: 2
            }
        );
        let raised = json!({"spec": {"topology": {"primaryCluster": "west"}},
            "status": {"primaryCluster": "east", "primaryTerm": 2,
                       "switchover": {"from": "east", "to": "west", "started": "",
                                      "time": "2026-12-06T12:00:00Z", "term": 2}}});
        let copy = east_and_west(&east_demoted, &west_marked);
        let north_lacks = |term: u64| {
            assert_eq!(term, 2);
            vec!["north".to_string()]
        };
        assert_eq!(
            switchover(
                &raised,
                "east",
                &targets,
                &[],
                &copy,
                &ready,
                &north_lacks,
                now(),
                DEFAULT_SWITCHOVER_DEADLINE
            ),
            Switchover::RecordingTerm {
                to: "west".into(),
                term: 2,
                lacking: vec!["north".into()]
            },
            "a member the hub reaches whose Lease does not carry the term yet holds it back"
        );
        assert_eq!(
            stage(&raised, &east_demoted, &west_marked, &ready),
            Switchover::Promoting { to: "west".into() }
        );
        // A hub that just started, the copies not listed yet: the raised term says the
        // switchover is under way, so east's copy is written demoted and marked, never
        // taking writes again while west may be promoted.
        let unseen = |_: &str| -> Option<&DynamicObject> { None };
        assert_eq!(
            switchover(
                &raised,
                "east",
                &targets,
                &[],
                &unseen,
                &ready,
                &|_| vec![],
                now(),
                DEFAULT_SWITCHOVER_DEADLINE
            ),
            Switchover::Demoting { to: "west".into() }
        );
        assert_eq!(
            in_flight(&raised, "east"),
            Some(InFlight {
                to: "west",
                started: "",
                promoting: false,
            })
        );
        assert_eq!(in_flight(&raised, "west"), None, "not from west");
        let mut gave_up = raised.clone();
        gave_up["status"]["abortedSwitchover"] = json!({"from": "east", "to": "west"});
        assert_eq!(in_flight(&gave_up, "east"), None, "given up");
        let mut promoted_since = raised.clone();
        promoted_since["status"]["primaryTerm"] = json!(3);
        assert_eq!(
            in_flight(&promoted_since, "east"),
            None,
            "a later term is another story"
        );
        // A term raised for another switchover (one aborted, then asked again) is not
        // this one's: it raises its own.
        let mut earlier = raised.clone();
        earlier["status"]["switchover"]["started"] = json!("2026-12-06T11:00:00Z");
        assert_eq!(
            stage(&earlier, &east_demoted, &west_marked, &ready),
            Switchover::RaisingTerm {
                to: "west".into(),
                term: 3
            }
        );
        let mut promoted = replica_status("0/5000200");
        promoted["instances"][0]["role"] = json!("Primary");
        let west_promoted = database_copy(3, &marked, promoted.clone());
        assert_eq!(
            stage(&asked, &east_demoted, &west_promoted, &ready),
            Switchover::Done { to: "west".into() }
        );
        let unmarked_primary = database_copy(3, &[], promoted);
        assert_ne!(
            stage(&asked, &east_demoted, &unmarked_primary, &ready),
            Switchover::Done { to: "west".into() },
            "a primary the switchover did not make is not its end"
        );
        // Recorded: west is the primary cluster, its copy still marked, and for a
        // moment it reports no primary (an instance restarting). That is no switchover
        // to west, which would make west's copy read-only.
        let recorded = json!({"spec": {"topology": {"primaryCluster": "west"}},
                              "status": {"primaryCluster": "west"}});
        let mut restarting = replica_status("0/5000200");
        restarting["instances"][0]["role"] = Value::Null;
        let west_after = database_copy(3, &marked, restarting);
        let copy = east_and_west(&east_demoted, &west_after);
        assert_eq!(
            switchover(
                &recorded,
                "west",
                &targets,
                &[],
                &copy,
                &ready,
                &|_| vec![],
                now(),
                DEFAULT_SWITCHOVER_DEADLINE
            ),
            Switchover::None
        );
        assert!(
            Switchover::CatchingUp {
                to: "west".into(),
                last: 0x5000100
            }
            .describe("east")
            .unwrap()
            .contains("0/5000100")
        );
    }

    /// A copy lookup that knows east's and west's copies only.
    fn east_and_west<'a>(
        east: &'a DynamicObject,
        west: &'a DynamicObject,
    ) -> impl Fn(&str) -> Option<&'a DynamicObject> {
        move |cluster| match cluster {
            "east" => Some(east),
            "west" => Some(west),
            _ => None,
        }
    }

    fn now() -> jiff::Timestamp {
        "2026-12-06T12:00:00Z".parse().unwrap()
    }

    /// Whether the new primary cluster may have been told to promote is recorded on the
    /// template before it is told (`status.switchover.promoting`): a hub that restarts
    /// past the deadline without the new primary cluster's copy (cut off from it, not
    /// listed) goes forward if it was recorded, and gives up only if it was not (then
    /// nothing there was told to promote).
    #[test]
    fn a_recorded_promotion_goes_forward_even_with_the_target_unseen_past_the_deadline() {
        let targets = [target("east", 1), target("west", 1)];
        let record = |promoting: &str| {
            json!({"spec": {"topology": {"primaryCluster": "west"}},
                "status": {"primaryCluster": "east", "primaryTerm": 2,
                    "switchover": {"from": "east", "to": "west", "started": "2026-12-06T11:58:00Z",
                                   "time": "2026-12-06T11:58:30Z", "term": 2, "promoting": promoting}}})
        };
        let east = database_copy(
            2,
            &[
                (ANNOTATION_SWITCHOVER_TO, "west"),
                (ANNOTATION_SWITCHOVER_STARTED, "2026-12-06T11:58:00Z"),
            ],
            json!({"observedGeneration": 2, "primary": "orders-0",
                   "instances": [{"name": "orders-0", "role": "Standby", "lsn": "0/5000100"}]}),
        );
        let only_east = |cluster: &str| (cluster == "east").then_some(&east);
        let stage = |template: &Value| {
            switchover(
                template,
                "east",
                &targets,
                &[],
                &only_east,
                &|_| None,
                &|_| vec!["north".to_string()],
                now(),
                DEFAULT_SWITCHOVER_DEADLINE,
            )
        };
        assert_eq!(
            stage(&record("2026-12-06T11:58:31Z")),
            Switchover::Promoting { to: "west".into() },
            "told (recorded): never given up, even unseen"
        );
        assert!(in_flight(&record("2026-12-06T11:58:31Z"), "east").is_some_and(|r| r.promoting));
        assert!(
            matches!(stage(&record("")), Switchover::Aborting { .. }),
            "never told: giving up is safe"
        );
    }

    /// A switchover from west recorded east as told to promote, and east is lost: east
    /// may run a primary, so a disaster promotion takes the primary from east, back to
    /// west (demoted, with every write it took) or to a replica cluster that streams;
    /// never while east answers, never to east itself. Once recorded, the switchover's
    /// marks on the copies (west's written under the term before the raise) start
    /// nothing: west holds the primary, no stage names east.
    #[test]
    fn a_promotion_takes_the_primary_back_from_a_lost_switchover_target() {
        let targets = [target("west", 1), target("east", 1), target("north", 1)];
        let told = json!({"spec": {"topology": {"primaryCluster": "east"}},
            "status": {"primaryCluster": "west", "primaryTerm": 2,
                "switchover": {"from": "west", "to": "east", "started": "2026-12-06T11:58:00Z",
                               "time": "2026-12-06T11:58:30Z", "term": 2,
                               "promoting": "2026-12-06T11:58:31Z"}}});
        let marks = [
            (ANNOTATION_SWITCHOVER_TO, "east"),
            (ANNOTATION_SWITCHOVER_STARTED, "2026-12-06T11:58:00Z"),
        ];
        let west = database_copy(
            2,
            &marks,
            json!({"observedGeneration": 2, "primary": "orders-0",
                   "instances": [{"name": "orders-0", "role": "Standby", "lsn": "0/5000100"}]}),
        );
        let east = database_copy(
            3,
            &[
                (ANNOTATION_SWITCHOVER_TO, "east"),
                (ANNOTATION_SWITCHOVER_PROMOTED, "west"),
                (crate::api::ANNOTATION_PRIMARY_TERM, "2"),
            ],
            json!({"observedGeneration": 3, "primary": "orders-0",
                   "instances": [{"name": "orders-0", "role": "Primary", "lsn": "0/5000200"}]}),
        );
        let north = database_copy(1, &[], replica_status("0/5000000"));
        let copy = |cluster: &str| match cluster {
            "west" => Some(&west),
            "east" => Some(&east),
            "north" => Some(&north),
            _ => None,
        };
        let east_lost = |c: &str| (c == "east").then(|| "unreachable".to_string());
        assert_eq!(lost_cluster(&told, "west"), "east");
        let refused = |to: &str, not_ready: &dyn Fn(&str) -> Option<String>| {
            promotion_refused(&told, "west", to, &targets, &copy, not_ready)
        };
        assert_eq!(refused("west", &east_lost), None, "back to the old primary");
        assert_eq!(
            refused("north", &east_lost),
            None,
            "or to a replica cluster"
        );
        let why = refused("east", &east_lost).unwrap();
        assert!(why.contains("told east to promote"), "{why}");
        let why = refused("west", &|_| None).unwrap();
        assert!(
            why.contains("east is Ready") && why.contains("finishes by itself"),
            "{why}"
        );
        // Not told yet: west holds the primary and answers; the switchover gives up by
        // itself past its deadline.
        let mut asked = told.clone();
        asked["status"]["switchover"]["promoting"] = json!("");
        assert_eq!(lost_cluster(&asked, "west"), "west");
        let why = promotion_refused(&asked, "west", "west", &targets, &copy, &east_lost).unwrap();
        assert!(why.contains("already holds the primary"), "{why}");

        // Recorded as the hub writes it: term 3, no switchover under way.
        let mut promoted = told.clone();
        promoted["spec"]["topology"]["primaryCluster"] = json!("west");
        promoted["status"]["primaryTerm"] = json!(3);
        promoted["status"]["switchover"] = Value::Null;
        promoted["status"]["promotion"] =
            json!({"from": "east", "to": "west", "time": "2026-12-06T12:00:00Z", "term": 3});
        let stage = |template: &Value| {
            switchover(
                template,
                "west",
                &targets,
                &[],
                &copy,
                &east_lost,
                &|_| vec![],
                now(),
                DEFAULT_SWITCHOVER_DEADLINE,
            )
        };
        assert_eq!(
            stage(&promoted),
            Switchover::None,
            "the old marks start nothing"
        );
        assert_eq!(lost_cluster(&promoted, "west"), "west");
        // Without the promotion's record the same marks are a switchover to east.
        let mut unrecorded = promoted.clone();
        unrecorded["status"]["promotion"] = Value::Null;
        assert_eq!(stage(&unrecorded), Switchover::Done { to: "east".into() });
        // A switchover asked later from west (its copy written under term 3) is one.
        let mut later = west.clone();
        later
            .annotations_mut()
            .insert(crate::api::ANNOTATION_PRIMARY_TERM.into(), "3".into());
        assert!(!promoted_over(&promoted, "west", &later));
        assert!(promoted_over(&promoted, "west", &west));
        // A switchover asked before west's copy was written anew marks it under term 3,
        // so that its mark starts it.
        assert_eq!(demoted_term(&promoted, "west", Some(&west), 3), 3);
        assert_eq!(demoted_term(&unrecorded, "west", Some(&west), 3), 1);
    }

    /// A switchover that has not promoted by the deadline is given up, and not tried
    /// again until asked anew; one told to promote only goes forward.
    #[test]
    fn a_switchover_stuck_before_the_promotion_is_aborted_once_and_not_retried() {
        let targets = [target("east", 1), target("west", 1)];
        let asked = json!({"spec": {"topology": {"primaryCluster": "west"}},
                           "status": {"primaryCluster": "east"}});
        let demoted = json!({"observedGeneration": 2, "primary": "orders-0",
            "instances": [{"name": "orders-0", "role": "Standby", "lsn": "0/5000100"}]});
        let started_as = |at: &str, status: &Value| {
            database_copy(
                2,
                &[
                    (ANNOTATION_SWITCHOVER_TO, "west"),
                    (ANNOTATION_SWITCHOVER_STARTED, at),
                ],
                status.clone(),
            )
        };
        let started = |at: &str| started_as(at, &demoted);
        let behind = database_copy(
            2,
            &[(ANNOTATION_SWITCHOVER_TO, "west")],
            replica_status("0/5000000"),
        );
        let lacking_now = std::cell::RefCell::new(Vec::<String>::new());
        let lacking = |_: u64| lacking_now.borrow().clone();
        let stage = |template: &Value, east: &DynamicObject, west: &DynamicObject| {
            let copy = east_and_west(east, west);
            switchover(
                template,
                "east",
                &targets,
                &[],
                &copy,
                &|_| None,
                &lacking,
                now(),
                DEFAULT_SWITCHOVER_DEADLINE,
            )
        };
        let recent = started("2026-12-06T11:59:30Z");
        assert!(matches!(
            stage(&asked, &recent, &behind),
            Switchover::CatchingUp { .. }
        ));
        let old = started("2026-12-06T11:58:59Z");
        let Switchover::Aborting { to, why, .. } = stage(&asked, &old, &behind) else {
            panic!("a switchover catching up past the deadline is given up");
        };
        assert_eq!(to, "west");
        assert!(why.starts_with("east refuses writes; waiting until west has received its last WAL position 0/5000100"), "{why}");
        let described = Switchover::Aborting { to, why, after: 60 }
            .describe("east")
            .unwrap();
        assert!(
            described.contains("aborted after 60 s, nothing promoted")
                && described.ends_with("east takes writes again"),
            "{described}"
        );
        // Still demoting past the deadline: given up too.
        let mut still_primary = demoted.clone();
        still_primary["instances"][0]["role"] = json!("Primary");
        assert!(matches!(
            stage(
                &asked,
                &started_as("2026-12-06T11:50:00Z", &still_primary),
                &behind
            ),
            Switchover::Aborting { .. }
        ));

        // Caught up past the deadline: promoting is safe, and it goes on (the term is
        // raised first).
        let caught_up = database_copy(
            2,
            &[(ANNOTATION_SWITCHOVER_TO, "west")],
            replica_status("0/5000100"),
        );
        assert_eq!(
            stage(&asked, &old, &caught_up),
            Switchover::RaisingTerm {
                to: "west".into(),
                term: 2
            }
        );
        // Waiting for the members to hold the raised term counts from the raise.
        let raised_at = |at: &str| {
            json!({"spec": {"topology": {"primaryCluster": "west"}},
                "status": {"primaryCluster": "east", "primaryTerm": 2,
                    "switchover": {"from": "east", "to": "west", "started": "2026-12-06T11:58:59Z",
                                   "time": at, "term": 2}}})
        };
        lacking_now.replace(vec!["north".to_string()]);
        assert!(matches!(
            stage(&raised_at("2026-12-06T11:59:50Z"), &old, &caught_up),
            Switchover::RecordingTerm { .. }
        ));
        let Switchover::Aborting { why, .. } =
            stage(&raised_at("2026-12-06T11:58:30Z"), &old, &caught_up)
        else {
            panic!("a raised term no member takes within the deadline gives the switchover up");
        };
        assert!(why.contains("not yet: north"), "{why}");
        lacking_now.replace(vec![]);
        assert_eq!(
            stage(&raised_at("2026-12-06T11:58:30Z"), &old, &caught_up),
            Switchover::Promoting { to: "west".into() }
        );
        // Told to promote, its status showing no position for a moment: still promoting,
        // never streaming from east again, never aborted.
        let promoting = database_copy(
            3,
            &[
                (ANNOTATION_SWITCHOVER_TO, "west"),
                (ANNOTATION_SWITCHOVER_PROMOTED, "east"),
            ],
            json!({"observedGeneration": 2}),
        );
        assert_eq!(
            stage(&asked, &old, &promoting),
            Switchover::Promoting { to: "west".into() }
        );

        // Given up and recorded while still seen marked (the hub's view lags its write of
        // the unmarked copy): no term is raised, nothing promoted, even with every write
        // there.
        let gave_up = json!({"spec": {"topology": {"primaryCluster": "west"}},
            "status": {"primaryCluster": "east", "abortedSwitchover": {"from": "east", "to": "west",
                       "time": "2026-12-06T11:59:59Z", "message": "stuck"}}});
        assert_eq!(
            stage(&gave_up, &recent, &caught_up),
            Switchover::Aborting {
                to: "west".into(),
                why: "stuck".into(),
                after: 60,
            }
        );
        // Given up and recorded: not started again while the ask is the same.
        let recorded = json!({"spec": {"topology": {"primaryCluster": "west"}},
            "status": {"primaryCluster": "east", "abortedSwitchover": {"from": "east", "to": "west",
                "time": "2026-12-06T12:00:00Z", "message": "west did not catch up"}}});
        let east_primary = database_copy(
            3,
            &[],
            json!({"observedGeneration": 3, "primary": "orders-0",
                   "instances": [{"name": "orders-0", "role": "Primary", "lsn": "0/5000200"}]}),
        );
        let streaming = database_copy(2, &[], replica_status("0/5000200"));
        assert!(matches!(stage(&recorded, &east_primary, &streaming),
            Switchover::Waiting { why, .. } if why.contains("was aborted at 2026-12-06T12:00:00Z (west did not catch up)")
                && why.contains("bulkhead switchover")));
        assert_eq!(
            stage(&asked, &east_primary, &streaming),
            Switchover::Demoting { to: "west".into() },
            "asked anew (the record cleared), it starts"
        );
    }

    #[test]
    fn lag_is_the_primary_clusters_position_minus_the_replicas() {
        let primary = json!({"primary": "orders-0", "instances": [
            {"name": "orders-1", "lsn": "0/2000000"},
            {"name": "orders-0", "lsn": "1/0"}]});
        let replica = json!({"primary": "orders-1", "instances": [
            {"name": "orders-1", "lsn": "0/FFFFF000"}]});
        assert_eq!(lag_bytes(&primary, &replica), Some(0x1000));
        assert_eq!(lag_bytes(&replica, &primary), Some(0), "never negative");
        assert_eq!(lag_bytes(&primary, &json!({"primary": "orders-1"})), None);
        assert_eq!(
            lag_bytes(&json!({"instances": []}), &replica),
            None,
            "no recorded primary, no position"
        );
    }
}
