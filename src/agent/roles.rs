//! Which instance of a MyDatabase is its primary: the agent's decision, pure.
//!
//! The primary and the term are recorded in the MyDatabase's status **before** any
//! instance hears of them ([`RoleDecision::Record`]): a promotion is always of a recorded
//! primary under a recorded term, so an agent that restarts, or an old primary that comes
//! back, finds the decision where it was made. Every instance is then told its role
//! ([`RoleDecision::Tell`]) each round, which is also how the instances know the agent is
//! there (they demote themselves when it is silent past the lease).
//!
//! Rules:
//! - a new database's first primary is its first instance (ordinal 0), term 1, recorded
//!   once the instances that answer show no term (no data); a database created again on
//!   its kept claims waits for every instance, then takes the newest data;
//! - while the recorded primary answers, it stays primary; the others stream from it;
//! - fenced (the hub's lease is stale, or `spec.readOnly`), every instance is a standby
//!   and nothing is promoted;
//! - when the recorded primary has not answered for `failover_after` **and** it can no
//!   longer acknowledge a write (its own lease, counted from the last command it
//!   accepted, has run out: [`RoleInput::primary_may_write_for`]), the standby with the
//!   latest WAL (timeline, then position) is promoted under the next term (none is when
//!   no standby answers), one that a scale-down keeps before one it removes;
//! - an instance that has seen a term above the recorded one (a database created again
//!   on its kept claims) makes the agent record a term above it before anything else;
//! - when a scale-down removes the recorded primary's pod (a failover made a high ordinal
//!   primary), the primary is switched over first, with nothing lost: it is demoted (its
//!   sessions end, it writes nothing more), the kept standby with the most WAL receives
//!   everything it wrote, and only then is that standby recorded and promoted. The
//!   reconciler keeps the primary's pod until the record names a kept instance;
//! - a version upgrade (a new pod template) replaces the standbys first, one at a time;
//!   when only the primary's pod is left on the old template, it is switched over the
//!   same way to an upgraded standby before its pod is replaced
//!   ([`RoleInput::replacing`]).

use std::time::Duration;

use crate::api::instance::{Desired, InstanceStatus, Role, Upstream, format_lsn, parse_lsn};

/// One instance (pod) of the database, as the agent sees it this round.
#[derive(Clone, Debug)]
pub struct Instance<'a> {
    /// The pod's name.
    pub pod: &'a str,
    /// Where the others reach its PostgreSQL (the pod's DNS name or address).
    pub host: &'a str,
    /// What its instance manager reported; None when it did not answer.
    pub status: Option<&'a InstanceStatus>,
}

/// What the MyDatabase's status records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    pub primary: Option<String>,
    pub term: u64,
}

/// The agent's view of one database this round.
#[derive(Clone, Debug)]
pub struct RoleInput<'a> {
    /// Its instances, by ordinal.
    pub instances: &'a [Instance<'a>],
    pub recorded: &'a Recorded,
    /// No instance may be primary; the reason says why ("the hub's lease is stale").
    pub fenced: Option<&'a str>,
    /// How long the recorded primary has gone without answering (None: it answers).
    pub primary_silent_for: Option<Duration>,
    /// How long the recorded primary may be silent before a standby is promoted.
    pub failover_after: Duration,
    /// How long the recorded primary may still acknowledge a write by its own lease: its
    /// `--agent-lease` counted from the last moment it accepted this agent's command
    /// (from when the agent first saw it, after an agent restart), plus a round of its
    /// own and a margin for its demotion; zero once that has passed. No standby is
    /// promoted before (one writer at a time, whatever `failover_after` says).
    pub primary_may_write_for: Duration,
    /// PostgreSQL's port in every instance.
    pub port: u16,
    /// Standbys that must have a commit before the primary acknowledges it.
    pub synchronous: u32,
    /// Instances whose ordinal is this or more are being removed by a scale-down.
    pub keep: u32,
    /// The instance an upgrade replaces next: when it is the recorded primary, the
    /// primary is switched over to another instance first, as for a scale-down.
    pub replacing: Option<&'a str>,
    /// Whether a switchover may begin or go on (the caller stops one that does not
    /// complete in time, and waits before it tries again).
    pub switchover_allowed: bool,
    /// A replica cluster's source (`spec.topology.replicaOf`): the recorded primary is
    /// the designated primary, a hot standby of the source, and nothing is promoted.
    pub replica_of: Option<&'a Upstream>,
}

/// A pod's ordinal (`orders-2` -> 2).
pub fn ordinal_of(pod: &str) -> Option<u32> {
    pod.rsplit_once('-').and_then(|(_, n)| n.parse().ok())
}

/// What the agent does this round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoleDecision {
    /// Record this primary and term in the MyDatabase's status first; tell nobody yet.
    Record {
        primary: String,
        term: u64,
        why: String,
        /// A planned switchover (not a failover).
        switchover: bool,
    },
    /// Tell each instance (by pod) its role.
    Tell {
        desired: Vec<(String, Desired)>,
        /// What the database is doing, for its status.
        message: String,
        /// The recorded primary is being switched over to this instance.
        switching_to: Option<String>,
    },
}

/// Decides this round; see the module documentation.
pub fn decide(input: &RoleInput<'_>) -> RoleDecision {
    let Some(primary) = input.recorded.primary.as_deref() else {
        return first_primary(input);
    };
    let term = input.recorded.term;
    if let Some(decision) = adopt_higher_term(input, primary) {
        return decision;
    }
    let recorded_primary = input.instances.iter().find(|i| i.pod == primary);
    let answers = recorded_primary.is_some_and(|i| i.status.is_some());
    let kept =
        |pod: &str| ordinal_of(pod).is_some_and(|o| o < input.keep) && input.replacing != Some(pod);
    // Why the recorded primary's pod goes (when it does).
    let leaving = if ordinal_of(primary).is_some_and(|o| o < input.keep) {
        format!("the upgrade replaces {primary}'s pod")
    } else {
        format!(
            "the scale-down to {} instances removes {primary}",
            input.keep
        )
    };
    if !answers
        && input.fenced.is_none()
        && input
            .primary_silent_for
            .is_some_and(|silent| silent >= input.failover_after)
        && input.primary_may_write_for.is_zero()
        && let Some(candidate) = most_wal(input.instances, primary, &kept)
            .or_else(|| most_wal(input.instances, primary, &|_| true))
    {
        let lsn = candidate
            .status
            .and_then(|s| s.lsn.clone())
            .unwrap_or_else(|| "no position".into());
        return RoleDecision::Record {
            primary: candidate.pod.to_string(),
            term: term + 1,
            why: format!(
                "the primary {primary} has not answered for {}s; {} has the most WAL received ({lsn})",
                input.primary_silent_for.unwrap_or_default().as_secs(),
                candidate.pod
            ),
            switchover: false,
        };
    }
    // A scale-down removes the primary's pod, or an upgrade replaces it: switch over to a
    // kept standby first.
    let mut switching: Option<(&Instance<'_>, String)> = None;
    if input.fenced.is_none()
        && input.switchover_allowed
        && !kept(primary)
        && let Some(old) = recorded_primary.and_then(|i| i.status)
        && let Some(candidate) = most_wal(input.instances, primary, &kept)
    {
        let position = |status: &InstanceStatus| status.lsn.as_deref().and_then(parse_lsn);
        let old_end = (old.role == Some(Role::Standby) && old.ready)
            .then(|| position(old))
            .flatten();
        let received = candidate.status.and_then(position);
        let words = |lsn: Option<u64>| lsn.map_or("no position".to_string(), format_lsn);
        if let (Some(end), Some(received)) = (old_end, received)
            && received >= end
        {
            return RoleDecision::Record {
                primary: candidate.pod.to_string(),
                term: term + 1,
                why: format!(
                    "switchover before {leaving}: {} has received everything {primary} wrote ({})",
                    candidate.pod,
                    format_lsn(end)
                ),
                switchover: true,
            };
        }
        let waiting = match old_end {
            None => format!("demoting {primary} first"),
            Some(end) => format!(
                "{primary} is demoted at {}; waiting for {} to receive it (at {})",
                format_lsn(end),
                candidate.pod,
                words(received)
            ),
        };
        switching = Some((
            candidate,
            format!(
                "switching the primary over from {primary} to {} before {leaving}: {waiting}",
                candidate.pod
            ),
        ));
    }
    let upstream = recorded_primary.map(|i| Upstream {
        host: i.host.to_string(),
        port: input.port,
        external: false,
    });
    let standbys: Vec<String> = input
        .instances
        .iter()
        .filter(|i| i.pod != primary)
        .map(|i| i.pod.to_string())
        .collect();
    // A replica cluster's standbys stream from its designated primary through slots
    // there, fenced or not.
    let cascades = input.replica_of.is_some() && switching.is_none();
    let mut desired = vec![];
    for instance in input.instances {
        let leads = instance.pod == primary && input.fenced.is_none() && switching.is_none();
        let (role, upstream, reason) = if instance.pod == primary {
            match (input.fenced, &switching, input.replica_of) {
                (_, Some((candidate, _)), _) => (
                    Role::Standby,
                    None,
                    format!("switching over to {}: {leaving}", candidate.pod),
                ),
                // Nothing here ever writes, so a fence changes nothing: it keeps
                // streaming, and serves what it has when the source is cut off.
                (_, None, Some(source)) => (
                    Role::Standby,
                    Some(source.clone()),
                    format!(
                        "the designated primary of a replica cluster, streaming from {}:{}",
                        source.host, source.port
                    ),
                ),
                (Some(why), None, None) => (Role::Standby, None, format!("fenced: {why}")),
                (None, None, None) => (Role::Primary, None, "the recorded primary".to_string()),
            }
        } else {
            (
                Role::Standby,
                upstream.clone(),
                format!("a standby of {primary}"),
            )
        };
        desired.push((
            instance.pod.to_string(),
            Desired {
                role,
                term,
                upstream,
                reason,
                name: instance.pod.to_string(),
                standbys: if leads || (instance.pod == primary && cascades) {
                    standbys.clone()
                } else {
                    vec![]
                },
                synchronous: if leads && input.replica_of.is_none() {
                    input.synchronous
                } else {
                    0
                },
                // A replica cluster's data is the source's copy, never a new database.
                bootstrap: instance.pod == primary && input.replica_of.is_none(),
            },
        ));
    }
    let switching_to = switching.as_ref().map(|(c, _)| c.pod.to_string());
    let message = match (input.fenced, answers, switching) {
        (_, true, None) if let Some(source) = input.replica_of => format!(
            "a replica cluster: {primary} (term {term}) streams from {}:{}, the others from it",
            source.host, source.port
        ),
        (Some(why), _, _) => format!("fenced ({why}): every instance is a hot standby"),
        (None, true, Some((_, words))) => words,
        (None, true, None) if !kept(primary) => format!(
            "{primary} is the primary (term {term}); {leaving} after a switchover, which waits {}",
            if input.switchover_allowed {
                "for a standby it keeps to be ready to take over"
            } else {
                "for the next switchover attempt (the last one did not complete in time)"
            }
        ),
        (None, true, None) => format!("{primary} is the primary (term {term})"),
        (None, false, _) => match input.primary_silent_for {
            Some(silent)
                if silent >= input.failover_after && !input.primary_may_write_for.is_zero() =>
            {
                format!(
                    "the primary {primary} has not answered for {}s; a standby takes over once {primary} has demoted itself by its own lease (in {}s at the latest)",
                    silent.as_secs(),
                    input.primary_may_write_for.as_secs_f64().ceil()
                )
            }
            Some(silent) if silent >= input.failover_after => format!(
                "the primary {primary} has not answered for {}s and no standby answers to take over",
                silent.as_secs()
            ),
            Some(silent) => format!(
                "the primary {primary} has not answered for {}s; a standby takes over after {}s",
                silent.as_secs(),
                input.failover_after.as_secs()
            ),
            None => format!("waiting for the primary {primary} to answer"),
        },
    };
    RoleDecision::Tell {
        desired,
        message,
        switching_to,
    }
}

/// No primary recorded: a new database, or one created again on the claims it kept. Its
/// first primary is its first instance, under the next term, when the instances that
/// answer have seen no term (they have no data). An instance that has seen one holds data
/// of an earlier life of the database: then every instance must answer first, and the
/// primary is chosen as [`adopt_higher_term`] chooses it. Nothing is recorded before an
/// instance answers (a term recorded for an instance that holds older data would let it
/// take it: it accepts any term it has not seen beaten).
fn first_primary(input: &RoleInput<'_>) -> RoleDecision {
    let waiting = |message: String| RoleDecision::Tell {
        desired: vec![],
        message,
        switching_to: None,
    };
    let Some(first) = input.instances.first() else {
        return waiting("no instance yet".into());
    };
    let seen = input
        .instances
        .iter()
        .filter_map(|i| i.status.map(|s| s.term))
        .max();
    match seen {
        None => waiting(format!(
            "waiting for {} to answer before recording the first primary",
            first.pod
        )),
        Some(0) => RoleDecision::Record {
            primary: first.pod.to_string(),
            term: input.recorded.term + 1,
            why: format!(
                "the first primary of a new database is its first instance, {}",
                first.pod
            ),
            switchover: false,
        },
        Some(_) => adopt_higher_term(input, first.pod).unwrap_or_else(|| {
            waiting("every instance has a term the status already records".into())
        }),
    }
}

/// An instance that has seen a higher term than the recorded one (the database was
/// created again on claims it kept, or its status was restored from an older copy): the
/// instances refuse every command under the recorded term, so a term above every one they
/// have seen is recorded first. The primary stays the instance that runs as one, if any
/// answers so (no second writer); else the one with the latest WAL (timeline, then
/// position) of those that answer; else the recorded one.
fn adopt_higher_term(input: &RoleInput<'_>, primary: &str) -> Option<RoleDecision> {
    let (seen_by, highest) = input
        .instances
        .iter()
        .filter_map(|i| i.status.map(|s| (i.pod, s.term)))
        .max_by_key(|(_, term)| *term)?;
    if highest <= input.recorded.term {
        return None;
    }
    // The newest data may be on any instance (a switchover moved the primary before the
    // delete): the choice waits for an answer from every instance the database has.
    // (Replicas 0 stops every instance: nothing to choose.)
    if input.keep == u32::MAX {
        return None;
    }
    // An answer counts once it says where the instance's WAL ends (one still starting
    // says nothing yet); an instance that has seen no term holds no data.
    let answering = input
        .instances
        .iter()
        .filter(|i| i.status.is_some_and(|s| s.term == 0 || s.lsn.is_some()))
        .count();
    let expected = input.instances.len().max(input.keep as usize);
    if answering < expected {
        return Some(RoleDecision::Tell {
            desired: vec![],
            message: format!(
                "{seen_by} has seen term {highest}, above the recorded term {}: waiting for every instance to answer ({answering} of {expected}) before recording the next term and its primary",
                input.recorded.term
            ),
            switching_to: None,
        });
    }
    // A primary running under the highest term stays (no second writer); one running
    // under an older term took a term it should never have been given and is not kept.
    let running = input.instances.iter().find(|i| {
        i.status
            .is_some_and(|s| s.role == Some(Role::Primary) && s.term == highest)
    });
    let chosen = running
        .or_else(|| latest_wal(input.instances))
        .map_or(primary, |i| i.pod);
    Some(RoleDecision::Record {
        primary: chosen.to_string(),
        term: highest + 1,
        why: format!(
            "{seen_by} has seen term {highest}, above the recorded term {} (a database created again on the claims it kept): term {} is recorded, with {chosen} the primary",
            input.recorded.term,
            highest + 1
        ),
        switchover: false,
    })
}

/// Where an instance's WAL ends, comparable across instances: the timeline first (a
/// promoted standby's history is newer than anything on the timeline it left), then the
/// position.
fn wal_end(status: &InstanceStatus) -> (u32, u64) {
    (
        status.timeline.unwrap_or(0),
        status.lsn.as_deref().and_then(parse_lsn).unwrap_or(0),
    )
}

/// The answering instance whose WAL ends latest; the first by ordinal among equals.
fn latest_wal<'a>(instances: &'a [Instance<'a>]) -> Option<&'a Instance<'a>> {
    latest_where(instances, |_, _| true)
}

/// The answering, ready standby (not `primary`, one `eligible` names) with the latest WAL
/// received (timeline, then position); the first by ordinal among equals.
fn most_wal<'a>(
    instances: &'a [Instance<'a>],
    primary: &str,
    eligible: &dyn Fn(&str) -> bool,
) -> Option<&'a Instance<'a>> {
    latest_where(instances, |instance, status| {
        instance.pod != primary && eligible(instance.pod) && status.ready
    })
}

/// Of the answering instances `chosen` accepts, the one whose WAL ends latest; the first
/// by ordinal among equals.
fn latest_where<'a>(
    instances: &'a [Instance<'a>],
    chosen: impl Fn(&Instance<'a>, &InstanceStatus) -> bool,
) -> Option<&'a Instance<'a>> {
    let mut best: Option<(&Instance<'a>, (u32, u64))> = None;
    for instance in instances {
        let Some(status) = instance.status.filter(|s| chosen(instance, s)) else {
            continue;
        };
        let end = wal_end(status);
        if best.is_none_or(|(_, latest)| end > latest) {
            best = Some((instance, end));
        }
    }
    best.map(|(instance, _)| instance)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(role: Role, lsn: &str) -> InstanceStatus {
        InstanceStatus {
            role: Some(role),
            ready: true,
            term: 1,
            lsn: Some(lsn.into()),
            ..Default::default()
        }
    }

    /// An instance whose host is its pod's name.
    fn instance<'a>(pod: &'a str, status: Option<&'a InstanceStatus>) -> Instance<'a> {
        Instance {
            pod,
            host: pod,
            status,
        }
    }

    fn input<'a>(
        instances: &'a [Instance<'a>],
        recorded: &'a Recorded,
        silent: Option<u64>,
    ) -> RoleInput<'a> {
        RoleInput {
            instances,
            recorded,
            fenced: None,
            primary_silent_for: silent.map(Duration::from_secs),
            failover_after: Duration::from_secs(10),
            primary_may_write_for: Duration::ZERO,
            port: 5432,
            synchronous: 1,
            keep: u32::MAX,
            replacing: None,
            switchover_allowed: true,
            replica_of: None,
        }
    }

    /// The input of a database a scale-down shrinks to `keep` instances.
    fn keeping<'a>(
        instances: &'a [Instance<'a>],
        recorded: &'a Recorded,
        keep: u32,
    ) -> RoleInput<'a> {
        RoleInput {
            keep,
            ..input(instances, recorded, None)
        }
    }

    fn recorded(primary: &str, term: u64) -> Recorded {
        Recorded {
            primary: Some(primary.into()),
            term,
        }
    }

    fn told(decision: &RoleDecision) -> Vec<(String, Role, Option<String>, u64)> {
        match decision {
            RoleDecision::Tell { desired, .. } => desired
                .iter()
                .map(|(pod, d)| {
                    (
                        pod.clone(),
                        d.role,
                        d.upstream.as_ref().map(|u| u.host.clone()),
                        d.term,
                    )
                })
                .collect(),
            other => panic!("expected Tell, got {other:?}"),
        }
    }

    #[test]
    fn a_new_database_records_its_first_instance_as_primary_before_telling_anyone() {
        let none = Recorded::default();
        // Nothing is recorded before an instance says what it holds.
        let silent = [instance("db-0", None), instance("db-1", None)];
        assert!(matches!(
            decide(&input(&silent, &none, None)),
            RoleDecision::Tell { desired, .. } if desired.is_empty()
        ));
        let empty = InstanceStatus {
            term: 0,
            ..Default::default()
        };
        let instances = [instance("db-0", Some(&empty)), instance("db-1", None)];
        let decision = decide(&input(&instances, &none, None));
        assert!(
            matches!(&decision, RoleDecision::Record { primary, term: 1, .. } if primary == "db-0"),
            "{decision:?}"
        );
    }

    #[test]
    fn a_database_created_again_waits_for_every_instance_and_never_promotes_a_stale_one() {
        // Created again on kept claims: db-0's pod starts first; it missed the switchover
        // that made db-1 the primary under term 2 (its data stops at term 1).
        let none = Recorded::default();
        let stale = InstanceStatus {
            term: 1,
            timeline: Some(1),
            ..status(Role::Standby, "0/3000000")
        };
        let newest = InstanceStatus {
            term: 2,
            timeline: Some(2),
            ..status(Role::Standby, "0/3000800")
        };
        let first_only = [instance("db-0", Some(&stale))];
        let decision = decide(&keeping(&first_only, &none, 2));
        assert!(
            matches!(&decision, RoleDecision::Tell { desired, .. } if desired.is_empty()),
            "nothing recorded (term 1 would promote db-0's old data): {decision:?}"
        );
        let both = [
            instance("db-0", Some(&stale)),
            instance("db-1", Some(&newest)),
        ];
        let decision = decide(&keeping(&both, &none, 2));
        assert!(
            matches!(&decision, RoleDecision::Record { primary, term: 3, .. } if primary == "db-1"),
            "{decision:?}"
        );
        // db-0 was promoted under a stale term 1 (an agent before this rule): not kept.
        let promoted_stale = InstanceStatus {
            role: Some(Role::Primary),
            ..stale.clone()
        };
        let both = [
            instance("db-0", Some(&promoted_stale)),
            instance("db-1", Some(&newest)),
        ];
        let recorded_stale = recorded("db-0", 1);
        assert!(matches!(
            decide(&keeping(&both, &recorded_stale, 2)),
            RoleDecision::Record { primary, term: 3, .. } if primary == "db-1"
        ));
    }

    #[test]
    fn the_recorded_primary_leads_and_the_others_stream_from_it() {
        let p = status(Role::Primary, "0/3000000");
        let s = status(Role::Standby, "0/3000000");
        let instances = [
            instance("db-0", Some(&p)),
            instance("db-1", Some(&s)),
            instance("db-2", None),
        ];
        let rec = recorded("db-0", 3);
        let decision = decide(&input(&instances, &rec, None));
        assert_eq!(
            told(&decision),
            [
                ("db-0".into(), Role::Primary, None, 3),
                ("db-1".into(), Role::Standby, Some("db-0".into()), 3),
                ("db-2".into(), Role::Standby, Some("db-0".into()), 3),
            ]
        );
        let RoleDecision::Tell { desired, .. } = &decision else {
            unreachable!()
        };
        assert_eq!(
            desired[0].1.standbys,
            ["db-1", "db-2"],
            "the primary keeps a slot each"
        );
        assert_eq!(desired[0].1.synchronous, 1);
        assert_eq!(desired[1].1.name, "db-1");
        assert!(desired[1].1.standbys.is_empty());
    }

    #[test]
    fn fenced_every_instance_is_a_standby_and_nothing_is_promoted() {
        let s = status(Role::Standby, "0/5000000");
        let instances = [instance("db-0", None), instance("db-1", Some(&s))];
        let rec = recorded("db-0", 1);
        let mut fenced = input(&instances, &rec, Some(60));
        fenced.fenced = Some("the hub's lease is stale");
        let decision = decide(&fenced);
        let roles: Vec<Role> = told(&decision).into_iter().map(|t| t.1).collect();
        assert_eq!(roles, [Role::Standby, Role::Standby]);
        let RoleDecision::Tell {
            message, desired, ..
        } = &decision
        else {
            unreachable!()
        };
        assert!(message.contains("fenced"), "{message}");
        assert!(desired[0].1.reason.contains("lease is stale"));
    }

    fn source() -> Upstream {
        Upstream {
            host: "10.201.101.4".into(),
            port: 5432,
            external: true,
        }
    }

    #[test]
    fn a_replica_cluster_streams_its_designated_primary_from_the_source_and_promotes_nothing() {
        let s = status(Role::Standby, "0/3000000");
        let instances = [
            instance("db-0", Some(&s)),
            instance("db-1", Some(&s)),
            instance("db-2", None),
        ];
        let rec = recorded("db-0", 2);
        let source = source();
        let replica = RoleInput {
            replica_of: Some(&source),
            ..input(&instances, &rec, None)
        };
        let decision = decide(&replica);
        assert_eq!(
            told(&decision),
            [
                ("db-0".into(), Role::Standby, Some("10.201.101.4".into()), 2),
                ("db-1".into(), Role::Standby, Some("db-0".into()), 2),
                ("db-2".into(), Role::Standby, Some("db-0".into()), 2),
            ]
        );
        let RoleDecision::Tell {
            desired, message, ..
        } = &decision
        else {
            unreachable!()
        };
        let designated = &desired[0].1;
        assert!(designated.upstream.as_ref().unwrap().external);
        assert!(!desired[1].1.upstream.as_ref().unwrap().external);
        assert_eq!(
            designated.standbys,
            ["db-1", "db-2"],
            "the cascading standbys' slots"
        );
        assert_eq!(designated.synchronous, 0, "nothing commits here");
        assert!(!designated.bootstrap, "its data is the source's copy");
        assert!(message.contains("replica cluster"), "{message}");

        // Fenced: it streams on (nothing here writes), its standbys keep their slots.
        let fenced = RoleInput {
            fenced: Some("the hub's lease is stale"),
            ..replica.clone()
        };
        let RoleDecision::Tell { desired, .. } = decide(&fenced) else {
            panic!("expected Tell")
        };
        assert_eq!(desired[0].1.upstream, Some(source.clone()));
        assert_eq!(desired[0].1.standbys, ["db-1", "db-2"]);

        // The designated primary silent past failover_after: another standby is recorded
        // as the designated primary under the next term, and told to stream from the
        // source, never to promote.
        let behind = status(Role::Standby, "0/2000000");
        let ahead = status(Role::Standby, "0/3000000");
        let instances = [
            instance("db-0", None),
            instance("db-1", Some(&behind)),
            instance("db-2", Some(&ahead)),
        ];
        let silent = RoleInput {
            replica_of: Some(&source),
            ..input(&instances, &rec, Some(10))
        };
        assert!(matches!(
            decide(&silent),
            RoleDecision::Record { primary, term: 3, .. } if primary == "db-2"
        ));
        let rec = recorded("db-2", 3);
        let after = RoleInput {
            replica_of: Some(&source),
            ..input(&instances, &rec, None)
        };
        let roles = told(&decide(&after));
        assert!(roles.iter().all(|(_, role, _, _)| *role == Role::Standby));
        assert_eq!(roles[2].2.as_deref(), Some("10.201.101.4"));
        assert_eq!(roles[1].2.as_deref(), Some("db-2"));
    }

    #[test]
    fn a_silent_primary_is_replaced_by_the_standby_with_the_most_wal_under_the_next_term() {
        let behind = status(Role::Standby, "0/3000000");
        let ahead = status(Role::Standby, "0/3000A00");
        let instances = [
            instance("db-0", None),
            instance("db-1", Some(&behind)),
            instance("db-2", Some(&ahead)),
        ];
        let rec = recorded("db-0", 4);
        // Not yet: silent for less than failover_after.
        let waiting = decide(&input(&instances, &rec, Some(5)));
        assert_eq!(
            told(&waiting)[0].1,
            Role::Primary,
            "the recorded primary keeps its role"
        );
        let decision = decide(&input(&instances, &rec, Some(10)));
        assert!(
            matches!(&decision, RoleDecision::Record { primary, term: 5, why, switchover: false } if primary == "db-2" && why.contains("0/3000A00")),
            "{decision:?}"
        );
        // Once recorded, the old primary (back or not) is told to follow the new one.
        let rec = recorded("db-2", 5);
        let old = status(Role::Standby, "0/3000000");
        let instances = [
            instance("db-0", Some(&old)),
            instance("db-1", Some(&behind)),
            instance("db-2", Some(&ahead)),
        ];
        assert_eq!(
            told(&decide(&input(&instances, &rec, None))),
            [
                ("db-0".into(), Role::Standby, Some("db-2".into()), 5),
                ("db-1".into(), Role::Standby, Some("db-2".into()), 5),
                ("db-2".into(), Role::Primary, None, 5),
            ]
        );
    }

    #[test]
    fn no_standby_is_promoted_while_the_silent_primary_may_still_acknowledge_a_write() {
        // The primary's instance API is cut off while PostgreSQL keeps serving: silent
        // past failover_after, but its own lease (from the last command it accepted) has
        // not run out, so it may still be a primary taking writes.
        let standby = status(Role::Standby, "0/3000000");
        let instances = [instance("db-0", None), instance("db-1", Some(&standby))];
        let rec = recorded("db-0", 1);
        let mut early = input(&instances, &rec, Some(30));
        early.primary_may_write_for = Duration::from_millis(2500);
        let decision = decide(&early);
        let RoleDecision::Tell {
            desired, message, ..
        } = &decision
        else {
            panic!("a standby was promoted beside a primary that may still write: {decision:?}")
        };
        assert!(
            desired
                .iter()
                .all(|(pod, d)| pod == "db-0" || d.role == Role::Standby)
        );
        assert!(
            message.contains("demoted itself by its own lease (in 3s"),
            "{message}"
        );
        // Once its lease and the demotion allowance are over: promoted.
        early.primary_may_write_for = Duration::ZERO;
        assert!(matches!(
            decide(&early),
            RoleDecision::Record { primary, term: 2, .. } if primary == "db-1"
        ));
    }

    #[test]
    fn a_failover_promotes_the_standby_on_the_newest_timeline_first() {
        // db-1 streamed from an old primary and received more bytes of its timeline; db-2
        // is on the newer timeline: its history is the one that holds the last writes.
        let old_timeline = InstanceStatus {
            timeline: Some(1),
            ..status(Role::Standby, "0/9000000")
        };
        let new_timeline = InstanceStatus {
            timeline: Some(2),
            ..status(Role::Standby, "0/5000000")
        };
        let instances = [
            instance("db-0", None),
            instance("db-1", Some(&old_timeline)),
            instance("db-2", Some(&new_timeline)),
        ];
        let rec = recorded("db-0", 3);
        assert!(matches!(
            decide(&input(&instances, &rec, Some(30))),
            RoleDecision::Record { primary, term: 4, .. } if primary == "db-2"
        ));
    }

    #[test]
    fn a_database_created_again_on_its_kept_claims_records_a_term_above_its_instances() {
        // Deleted and created again: the status starts over (db-0, term 1) while the
        // instances kept term 2 (a switchover made db-1 the primary) in their data.
        let at = |role: Role, lsn: &str, term: u64| InstanceStatus {
            term,
            timeline: Some(2),
            ..status(role, lsn)
        };
        let db0 = at(Role::Standby, "0/5000000", 2);
        let db1 = at(Role::Standby, "0/5000100", 2);
        let rec = recorded("db-0", 1);
        // Only db-0 answers yet (its pod starts first): db-1 may hold newer data, so
        // nothing is chosen before it answers too.
        let first_only = [instance("db-0", Some(&db0))];
        let waiting = decide(&keeping(&first_only, &rec, 2));
        assert!(
            matches!(&waiting, RoleDecision::Tell { desired, message, .. }
                if desired.is_empty() && message.contains("1 of 2")),
            "{waiting:?}"
        );
        // db-1 answers but its server is still starting (no position yet): still waiting.
        let starting = InstanceStatus {
            lsn: None,
            timeline: None,
            ..db1.clone()
        };
        let instances = [
            instance("db-0", Some(&db0)),
            instance("db-1", Some(&starting)),
        ];
        assert!(matches!(
            decide(&keeping(&instances, &rec, 2)),
            RoleDecision::Tell { desired, .. } if desired.is_empty()
        ));
        let instances = [instance("db-0", Some(&db0)), instance("db-1", Some(&db1))];
        let decision = decide(&keeping(&instances, &rec, 2));
        assert!(
            matches!(&decision, RoleDecision::Record { primary, term: 3, why, switchover: false }
                if primary == "db-1" && why.contains("term 2")),
            "{decision:?}"
        );
        // An instance that runs as the primary stays the one (no second writer).
        let running = at(Role::Primary, "0/5000000", 2);
        let instances = [
            instance("db-0", Some(&running)),
            instance("db-1", Some(&db1)),
        ];
        assert!(matches!(
            decide(&keeping(&instances, &rec, 2)),
            RoleDecision::Record { primary, term: 3, .. } if primary == "db-0"
        ));
        // Recorded at or above every instance's term: nothing to adopt.
        let rec = recorded("db-1", 3);
        assert!(matches!(
            decide(&keeping(&instances, &rec, 2)),
            RoleDecision::Tell { .. }
        ));
    }

    #[test]
    fn without_an_answering_standby_nothing_is_promoted() {
        let unready = InstanceStatus {
            ready: false,
            ..status(Role::Standby, "0/9000000")
        };
        let instances = [instance("db-0", None), instance("db-1", Some(&unready))];
        let rec = recorded("db-0", 1);
        let decision = decide(&input(&instances, &rec, Some(30)));
        let RoleDecision::Tell { message, .. } = &decision else {
            panic!("{decision:?}")
        };
        assert!(message.contains("no standby answers"), "{message}");
    }

    #[test]
    fn a_failover_prefers_a_standby_the_scale_down_keeps() {
        let kept = status(Role::Standby, "0/3000000");
        let leaving = status(Role::Standby, "0/3000A00");
        let instances = [
            instance("db-0", None),
            instance("db-1", Some(&kept)),
            instance("db-2", Some(&leaving)),
        ];
        let rec = recorded("db-0", 1);
        let mut shrinking = input(&instances, &rec, Some(10));
        shrinking.keep = 2;
        assert!(
            matches!(&decide(&shrinking), RoleDecision::Record { primary, .. } if primary == "db-1"),
            "db-2 goes with the scale-down"
        );
        // Only a leaving standby answers: it is promoted all the same (a switchover
        // follows once a kept one is ready).
        let instances = [
            instance("db-0", None),
            instance("db-1", None),
            instance("db-2", Some(&leaving)),
        ];
        let mut shrinking = input(&instances, &rec, Some(10));
        shrinking.keep = 2;
        assert!(
            matches!(&decide(&shrinking), RoleDecision::Record { primary, .. } if primary == "db-2")
        );
    }

    #[test]
    fn a_scale_down_that_removes_the_primary_switches_over_without_losing_a_write() {
        let rec = recorded("db-2", 2);
        let caught_up = status(Role::Standby, "0/5000000");
        let behind = status(Role::Standby, "0/4000000");
        let primary = status(Role::Primary, "0/5000000");
        // 1. The primary leads; the scale-down to 1 removes it: it is demoted first, the
        //    standbys keep following it (the one taking over receives its last WAL).
        let instances = [
            instance("db-0", Some(&behind)),
            instance("db-1", Some(&caught_up)),
            instance("db-2", Some(&primary)),
        ];
        let shrinking = keeping(&instances, &rec, 1);
        let decision = decide(&shrinking);
        assert_eq!(
            told(&decision),
            [
                ("db-0".into(), Role::Standby, Some("db-2".into()), 2),
                ("db-1".into(), Role::Standby, Some("db-2".into()), 2),
                ("db-2".into(), Role::Standby, None, 2),
            ]
        );
        let RoleDecision::Tell {
            switching_to,
            message,
            desired,
        } = &decision
        else {
            unreachable!()
        };
        assert_eq!(switching_to.as_deref(), Some("db-0"), "the only kept one");
        assert!(message.contains("demoting db-2 first"), "{message}");
        assert!(desired[2].1.standbys.is_empty() && desired[2].1.synchronous == 0);

        // 2. Demoted at 0/5000100; db-0 has not received it all: nothing is recorded.
        let demoted = status(Role::Standby, "0/5000100");
        let instances = [
            instance("db-0", Some(&behind)),
            instance("db-1", Some(&caught_up)),
            instance("db-2", Some(&demoted)),
        ];
        let shrinking = keeping(&instances, &rec, 1);
        let decision = decide(&shrinking);
        let RoleDecision::Tell { message, .. } = &decision else {
            panic!("{decision:?}")
        };
        assert!(
            message.contains("waiting for db-0 to receive it (at 0/4000000)"),
            "{message}"
        );
        // A demotion still restarting (not ready) is no end position either.
        let restarting = InstanceStatus {
            ready: false,
            ..status(Role::Standby, "0/5000100")
        };
        let all_there = status(Role::Standby, "0/5000100");
        let instances = [
            instance("db-0", Some(&all_there)),
            instance("db-2", Some(&restarting)),
        ];
        let shrinking = keeping(&instances, &rec, 1);
        assert!(matches!(
            decide(&shrinking),
            RoleDecision::Tell {
                switching_to: Some(_),
                ..
            }
        ));

        // 3. db-0 has everything: it is recorded under the next term, then promoted.
        let instances = [
            instance("db-0", Some(&all_there)),
            instance("db-1", Some(&caught_up)),
            instance("db-2", Some(&demoted)),
        ];
        let shrinking = keeping(&instances, &rec, 1);
        let decision = decide(&shrinking);
        assert!(
            matches!(&decision, RoleDecision::Record { primary, term: 3, switchover: true, why } if primary == "db-0" && why.contains("0/5000100")),
            "{decision:?}"
        );

        // Fenced, or given up: no switchover; the primary is told to lead (or be fenced).
        let instances = [
            instance("db-0", Some(&all_there)),
            instance("db-2", Some(&primary)),
        ];
        let mut held = keeping(&instances, &rec, 1);
        held.switchover_allowed = false;
        let decision = decide(&held);
        assert_eq!(told(&decision)[1].1, Role::Primary);
        let RoleDecision::Tell { message, .. } = &decision else {
            unreachable!()
        };
        assert!(message.contains("next switchover attempt"), "{message}");
        held.switchover_allowed = true;
        held.fenced = Some("spec.readOnly");
        assert!(matches!(
            decide(&held),
            RoleDecision::Tell {
                switching_to: None,
                ..
            }
        ));
    }
}
