//! The safety rule the checker holds the hub's requests to, read from the members' audit
//! logs (DESIGN.md section 5, "The hub suspects before any agent fences"; docs/chaos.md).
//!
//! A stateful copy (StatefulSet, MyDatabase, Shard) is deleted or its `spec.replicas`
//! lowered only when every cluster holding a copy of the same template has fresh positive
//! evidence. The checker cannot see the hub's evidence, only the faults it threw, so it
//! takes the rule as: the request is a **violation** when, at the moment the member's API
//! server received it, some cluster holding a copy of that template (per the audit trail:
//! the hub wrote a copy there and has not deleted it) had been under a fault (cut off, its
//! API server down, or the hub isolated) without a break for at least `grace` (the hub's
//! lease renew interval plus a second: by then one failed probe or renewal must have made
//! the hub suspect it). Deleting the copies of a template the user deleted is allowed
//! (DESIGN.md section 4: reachable copies go at once).
//!
//! A PersistentVolumeClaim copy is data: the hub deletes one only after the user deleted
//! the claim's template on the hub. Any other DELETE of a claim is a violation.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use jiff::Timestamp;

use super::audit::AuditRecord;
use super::schedule::TemplateKind;
use super::timeline::{Entry, Event};

/// Why a member was unavailable to the hub.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultCause {
    /// Its external address dropped packets (a partition or the hub isolated).
    CutOff,
    /// Its kube-apiserver was down.
    ApiserverDown,
}

impl fmt::Display for FaultCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultCause::CutOff => write!(f, "cut off"),
            FaultCause::ApiserverDown => write!(f, "API server down"),
        }
    }
}

/// A stretch of time a member was under one or more faults without a break.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultWindow {
    pub start: Timestamp,
    /// None: not over when the timeline ended.
    pub end: Option<Timestamp>,
    pub causes: BTreeSet<FaultCause>,
}

impl FaultWindow {
    fn contains(&self, at: Timestamp) -> bool {
        self.start <= at && self.end.is_none_or(|end| at < end)
    }
}

impl fmt::Display for FaultWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let causes: Vec<String> = self.causes.iter().map(ToString::to_string).collect();
        match self.end {
            Some(end) => write!(
                f,
                "{:.3} .. {:.3} ({:.1} s, {})",
                self.start,
                end,
                seconds_between(self.start, end),
                causes.join(" + ")
            ),
            None => write!(
                f,
                "{:.3} .. (not healed) ({})",
                self.start,
                causes.join(" + ")
            ),
        }
    }
}

fn seconds_between(earlier: Timestamp, later: Timestamp) -> f64 {
    later.duration_since(earlier).as_secs_f64()
}

/// When each member was under a fault, merged into windows without a break.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultWindows {
    per_member: BTreeMap<String, Vec<FaultWindow>>,
}

impl FaultWindows {
    /// The windows the timeline's network and API server events describe, where an API
    /// server restart ends at the first of the hub's fencing-lease renewals that member
    /// answered after it went down (`renewals`, from its audit log), if that came before
    /// the nemesis saw the server ready (it looks every quarter second; the renewal is
    /// the hub's own evidence that the member answers again).
    pub fn from_timeline_and_renewals(
        entries: &[Entry],
        renewals: &BTreeMap<String, Vec<Timestamp>>,
    ) -> Self {
        let mut down_since: BTreeMap<String, Timestamp> = BTreeMap::new();
        let adjusted: Vec<Entry> = entries
            .iter()
            .map(|entry| {
                let mut entry = entry.clone();
                match &entry.event {
                    Event::ApiserverDown { member } => {
                        down_since.insert(member.clone(), entry.at);
                    }
                    Event::ApiserverUp { member } => {
                        if let Some(since) = down_since.remove(member)
                            && let Some(first) = renewals
                                .get(member)
                                .into_iter()
                                .flatten()
                                .find(|at| **at > since && **at < entry.at)
                        {
                            entry.at = *first;
                        }
                    }
                    _ => {}
                }
                entry
            })
            .collect();
        Self::from_timeline(&adjusted)
    }

    /// The windows the timeline's network and API server events describe.
    pub fn from_timeline(entries: &[Entry]) -> Self {
        let mut windows = FaultWindows::default();
        let mut open: BTreeMap<(String, FaultCause), Timestamp> = BTreeMap::new();
        for entry in entries {
            let (member, cause, starts) = match &entry.event {
                Event::NetworkCut { member } => (member, FaultCause::CutOff, true),
                Event::NetworkHealed { member } => (member, FaultCause::CutOff, false),
                Event::ApiserverDown { member } => (member, FaultCause::ApiserverDown, true),
                Event::ApiserverUp { member } => (member, FaultCause::ApiserverDown, false),
                _ => continue,
            };
            let key = (member.clone(), cause);
            if starts {
                open.entry(key).or_insert(entry.at);
            } else if let Some(start) = open.remove(&key) {
                windows.add(member, cause, start, Some(entry.at));
            }
        }
        for ((member, cause), start) in open {
            windows.add(&member, cause, start, None);
        }
        windows
    }

    /// Adds a fault of `member` from `start` to `end` (None: never over), merging it with
    /// the windows it overlaps or touches.
    pub fn add(
        &mut self,
        member: &str,
        cause: FaultCause,
        start: Timestamp,
        end: Option<Timestamp>,
    ) {
        let windows = self.per_member.entry(member.to_string()).or_default();
        windows.push(FaultWindow {
            start,
            end,
            causes: BTreeSet::from([cause]),
        });
        windows.sort_by_key(|w| w.start);
        let mut merged: Vec<FaultWindow> = vec![];
        for window in windows.drain(..) {
            match merged.last_mut() {
                Some(last) if last.end.is_none_or(|end| window.start <= end) => {
                    last.end = match (last.end, window.end) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        _ => None,
                    };
                    last.causes.extend(window.causes);
                }
                _ => merged.push(window),
            }
        }
        *windows = merged;
    }

    /// The window `member` was in at `at`, if it was under a fault then.
    pub fn window_at(&self, member: &str, at: Timestamp) -> Option<&FaultWindow> {
        self.per_member
            .get(member)?
            .iter()
            .find(|window| window.contains(at))
    }

    /// How long `member` had been under a fault without a break at `at`; None when it
    /// was not under one.
    pub fn fault_age(&self, member: &str, at: Timestamp) -> Option<Duration> {
        let window = self.window_at(member, at)?;
        Some(at.duration_since(window.start).unsigned_abs())
    }

    /// Every member's windows, for the report.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Vec<FaultWindow>)> {
        self.per_member.iter()
    }
}

/// A template of the chaos namespace, by kind and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TemplateRef {
    pub kind: TemplateKind,
    pub name: String,
}

impl fmt::Display for TemplateRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind.kind(), self.name)
    }
}

/// What the checker needs besides the logs.
#[derive(Clone, Debug)]
pub struct RuleSettings {
    /// The hub's user name in the members.
    pub hub_user: String,
    /// The user a person's `kubectl` edits of member copies act as (the nemesis's): their
    /// scales and deletes change what a copy holds without the hub.
    pub editor_user: String,
    /// The namespace the run's templates live in.
    pub namespace: String,
    /// How long a cluster may be under a fault before the hub must have suspected it.
    pub grace: Duration,
}

/// One request the rules did not allow.
#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    /// When the member's API server received it.
    pub at: Timestamp,
    /// The member that received it.
    pub cluster: String,
    pub template: TemplateRef,
    /// What the request did, e.g. `DELETE (200)` or `spec.replicas 2 -> 1 (200)`.
    pub request: String,
    /// Why it was not allowed.
    pub reason: String,
    /// The clusters whose fault made it a violation (empty for a claim deleted without
    /// its template).
    pub faulted: Vec<String>,
    /// The audit line.
    pub line: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.3} {}: {} of {} by the hub: {}",
            self.at, self.cluster, self.request, self.template, self.reason
        )
    }
}

/// The checker's findings over the whole log.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verdict {
    pub violations: Vec<Violation>,
    /// The hub's DELETEs of stateful copies and claims seen.
    pub deletes: usize,
    /// The hub's writes that lowered a stateful copy's replicas.
    pub shrinks: usize,
    /// The hub's other writes to stateful copies and claims.
    pub writes: usize,
}

/// Applies the rule (see the module documentation) to every request of `records`, in the
/// order the members received them. `user_deletions` holds when the user deleted each
/// template on the hub.
pub fn check(
    records: &[AuditRecord],
    faults: &FaultWindows,
    user_deletions: &BTreeMap<TemplateRef, Timestamp>,
    settings: &RuleSettings,
) -> Verdict {
    let mut ordered: Vec<&AuditRecord> = records.iter().collect();
    ordered.sort_by_key(|r| r.event.request_received_timestamp);
    let mut verdict = Verdict::default();
    // Which clusters hold a copy of each template, and the replicas the hub last wrote to
    // each copy.
    let mut holding: BTreeMap<TemplateRef, BTreeSet<String>> = BTreeMap::new();
    let mut last_replicas: BTreeMap<(String, TemplateRef), i64> = BTreeMap::new();
    // The replicas the hub's own last successful write gave each copy.
    let mut hub_applied: BTreeMap<(String, TemplateRef), i64> = BTreeMap::new();
    for record in ordered {
        let event = &record.event;
        let Some(object) = &event.object_ref else {
            continue;
        };
        let by_hub = event.acting_user() == settings.hub_user;
        let by_editor = event.acting_user() == settings.editor_user;
        if !(by_hub || by_editor)
            || event.stage != "ResponseComplete"
            || object.namespace != settings.namespace
            || !(object.subresource.is_empty() || object.subresource == "scale")
        {
            continue;
        }
        let Some(kind) = TemplateKind::from_resource(&object.api_group, &object.resource) else {
            continue;
        };
        if !kind.is_stateful() && kind != TemplateKind::Claim {
            continue;
        }
        let at = event.request_received_timestamp;
        let template = TemplateRef {
            kind,
            name: object.name.clone(),
        };
        let cluster = record.cluster.clone();
        if by_editor {
            // A person scaled or deleted the copy in the member: what the copy holds
            // changed without the hub, so the hub's next write is judged against that.
            if event.succeeded() {
                let copy = (cluster.clone(), template.clone());
                match event.verb.as_str() {
                    "delete" | "deletecollection" => {
                        if let Some(holders) = holding.get_mut(&template) {
                            holders.remove(&cluster);
                        }
                        last_replicas.remove(&copy);
                    }
                    _ => {
                        let replicas = event
                            .returned_replicas()
                            .or_else(|| event.requested_replicas());
                        if let (Some(replicas), Some(last)) =
                            (replicas, last_replicas.get_mut(&copy))
                        {
                            *last = replicas;
                        }
                    }
                }
            }
            continue;
        }
        let violation = |request: String, reason: String, faulted: Vec<String>| Violation {
            at,
            cluster: cluster.clone(),
            template: template.clone(),
            request,
            reason,
            faulted,
            line: record.line.clone(),
        };
        let suspects = |holders: Option<&BTreeSet<String>>| -> Vec<(String, Duration)> {
            holders
                .into_iter()
                .flatten()
                .filter_map(|holder| {
                    let age = faults.fault_age(holder, at)?;
                    (age >= settings.grace).then(|| (holder.clone(), age))
                })
                .collect()
        };
        let describe = |suspects: &[(String, Duration)]| -> String {
            let each: Vec<String> = suspects
                .iter()
                .map(|(holder, age)| {
                    let causes = faults
                        .window_at(holder, at)
                        .map(|w| {
                            w.causes
                                .iter()
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()
                                .join(" + ")
                        })
                        .unwrap_or_default();
                    format!(
                        "{holder} (holding a copy) had been {causes} for {:.1} s",
                        age.as_secs_f64()
                    )
                })
                .collect();
            format!(
                "{}, longer than the grace of {:.1} s",
                each.join(", "),
                settings.grace.as_secs_f64()
            )
        };
        let deleted_by_user = user_deletions
            .get(&template)
            .is_some_and(|deleted| *deleted <= at);
        match event.verb.as_str() {
            "delete" | "deletecollection" => {
                verdict.deletes += 1;
                let request = format!("DELETE ({})", event.code());
                if kind == TemplateKind::Claim {
                    if !deleted_by_user {
                        verdict.violations.push(violation(
                            request,
                            "a claim is deleted only after the user deleted its template on the hub, and the user had not".into(),
                            vec![],
                        ));
                    }
                } else if !deleted_by_user {
                    let suspects = suspects(holding.get(&template));
                    if !suspects.is_empty() {
                        let faulted = suspects.iter().map(|(c, _)| c.clone()).collect();
                        verdict
                            .violations
                            .push(violation(request, describe(&suspects), faulted));
                    }
                }
                if event.succeeded() || event.code() == 404 {
                    if let Some(holders) = holding.get_mut(&template) {
                        holders.remove(&cluster);
                    }
                    last_replicas.remove(&(cluster.clone(), template.clone()));
                }
            }
            "create" | "update" | "patch" => {
                let replicas = event.requested_replicas();
                let copy = (cluster.clone(), template.clone());
                // 201: the request created the copy (the one before was deleted, perhaps by
                // a person, and gone since): nothing held is lowered.
                let created = event.code() == 201;
                // Refused by its resourceVersion precondition (409) while it only
                // re-asserted what the hub had applied itself: the copy was changed (a
                // person's scale) after the version the hub read, which is what the
                // precondition is for. It lowered nothing and meant to lower nothing.
                let refused_reapply = event.code() == 409
                    && event
                        .request_object
                        .as_ref()
                        .and_then(|o| o.pointer("/metadata/resourceVersion"))
                        .is_some()
                    && replicas.is_some()
                    && hub_applied.get(&copy) == replicas.as_ref();
                match (kind.is_stateful(), replicas, last_replicas.get(&copy)) {
                    (true, Some(new), Some(&old)) if new < old && !created && !refused_reapply => {
                        verdict.shrinks += 1;
                        let suspects = suspects(holding.get(&template));
                        if !suspects.is_empty() {
                            let faulted = suspects.iter().map(|(c, _)| c.clone()).collect();
                            verdict.violations.push(violation(
                                format!("spec.replicas {old} -> {new} ({})", event.code()),
                                describe(&suspects),
                                faulted,
                            ));
                        }
                    }
                    _ => verdict.writes += 1,
                }
                if event.succeeded() {
                    holding.entry(template.clone()).or_default().insert(cluster);
                    if let Some(new) = replicas {
                        last_replicas.insert(copy.clone(), new);
                        hub_applied.insert(copy, new);
                    }
                }
            }
            _ => {}
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::audit::parse_line;

    const HUB: &str = "system:serviceaccount:bulkhead-system:bulkhead-hub";
    const NAMESPACE: &str = "chaos";
    const EDITOR: &str = "lab-member-editor";

    fn settings() -> RuleSettings {
        RuleSettings {
            hub_user: HUB.into(),
            editor_user: EDITOR.into(),
            namespace: NAMESPACE.into(),
            grace: Duration::from_secs(2),
        }
    }

    /// A time `seconds` into a test's run.
    fn at(seconds: f64) -> Timestamp {
        let base: Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        base + jiff::SignedDuration::from_secs_f64(seconds)
    }

    /// An audit record of `cluster`: the hub's `verb` on `kind/name` at `seconds`, with
    /// `replicas` in the body when given.
    fn request(
        cluster: &str,
        seconds: f64,
        verb: &str,
        kind: TemplateKind,
        name: &str,
        replicas: Option<i64>,
        code: u16,
    ) -> AuditRecord {
        let body = match replicas {
            Some(r) => serde_json::json!({"spec": {"replicas": r}}),
            None => serde_json::json!({"kind": "DeleteOptions"}),
        };
        let line = serde_json::json!({
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "RequestResponse",
            "auditID": format!("{cluster}-{seconds}"), "stage": "ResponseComplete",
            "verb": verb, "user": {"username": HUB},
            "objectRef": {"resource": kind.plural(), "apiGroup": kind.group(),
                          "namespace": NAMESPACE, "name": name},
            "responseStatus": {"code": code},
            "requestObject": body,
            "requestReceivedTimestamp": at(seconds).to_string(),
        })
        .to_string();
        AuditRecord {
            cluster: cluster.into(),
            event: parse_line(&line).unwrap(),
            line,
        }
    }

    fn apply(cluster: &str, seconds: f64, kind: TemplateKind, name: &str, r: i64) -> AuditRecord {
        request(cluster, seconds, "patch", kind, name, Some(r), 200)
    }

    fn delete(cluster: &str, seconds: f64, kind: TemplateKind, name: &str) -> AuditRecord {
        request(cluster, seconds, "delete", kind, name, None, 200)
    }

    /// East cut off from `from` to `to` seconds.
    fn east_cut(from: f64, to: f64) -> FaultWindows {
        let mut faults = FaultWindows::default();
        faults.add("east", FaultCause::CutOff, at(from), Some(at(to)));
        faults
    }

    fn run(records: &[AuditRecord], faults: &FaultWindows) -> Verdict {
        check(records, faults, &BTreeMap::new(), &settings())
    }

    const STS: TemplateKind = TemplateKind::StatefulSet;

    #[test]
    fn deleting_a_reachable_copy_while_a_holder_is_cut_off_past_the_grace_is_a_violation() {
        let records = [
            apply("east", 1.0, STS, "sts-1", 1),
            apply("west", 1.0, STS, "sts-1", 1),
            delete("west", 15.0, STS, "sts-1"),
        ];
        let verdict = run(&records, &east_cut(10.0, 30.0));
        assert_eq!(verdict.deletes, 1);
        assert_eq!(verdict.violations.len(), 1, "{verdict:?}");
        let violation = &verdict.violations[0];
        assert_eq!(violation.cluster, "west");
        assert_eq!(violation.faulted, ["east"]);
        assert_eq!(violation.request, "DELETE (200)");
        assert!(
            violation
                .reason
                .contains("east (holding a copy) had been cut off for 5.0 s"),
            "{}",
            violation.reason
        );
        assert!(violation.line.contains("\"verb\":\"delete\""));
    }

    #[test]
    fn within_the_grace_after_the_heal_or_without_a_copy_there_a_delete_is_allowed() {
        let holders = [
            apply("east", 1.0, STS, "sts-1", 1),
            apply("west", 1.0, STS, "sts-1", 1),
        ];
        for (delete_at, why) in [
            (11.5, "within the grace"),
            (31.0, "after the heal"),
            (9.0, "before the cut"),
        ] {
            let mut records = holders.to_vec();
            records.push(delete("west", delete_at, STS, "sts-1"));
            let verdict = run(&records, &east_cut(10.0, 30.0));
            assert!(verdict.violations.is_empty(), "{why}: {verdict:?}");
        }
        // North is cut off but holds no copy of this template.
        let mut faults = FaultWindows::default();
        faults.add("north", FaultCause::CutOff, at(0.0), None);
        let mut records = holders.to_vec();
        records.push(delete("west", 20.0, STS, "sts-1"));
        assert!(run(&records, &faults).violations.is_empty());
        // East's copy was deleted before its cut: it holds nothing any more.
        let records = [
            holders[0].clone(),
            holders[1].clone(),
            delete("east", 5.0, STS, "sts-1"),
            delete("west", 15.0, STS, "sts-1"),
        ];
        assert!(run(&records, &east_cut(10.0, 30.0)).violations.is_empty());
    }

    #[test]
    fn the_copies_of_a_template_the_user_deleted_may_go_during_a_partition() {
        let records = [
            apply("east", 1.0, STS, "sts-1", 1),
            apply("west", 1.0, STS, "sts-1", 1),
            delete("west", 15.0, STS, "sts-1"),
        ];
        let template = TemplateRef {
            kind: STS,
            name: "sts-1".into(),
        };
        let deleted_before = BTreeMap::from([(template.clone(), at(14.0))]);
        let verdict = check(
            &records,
            &east_cut(10.0, 30.0),
            &deleted_before,
            &settings(),
        );
        assert!(verdict.violations.is_empty());
        let deleted_after = BTreeMap::from([(template, at(16.0))]);
        let verdict = check(&records, &east_cut(10.0, 30.0), &deleted_after, &settings());
        assert_eq!(verdict.violations.len(), 1, "the user's delete came later");
    }

    #[test]
    fn a_claim_is_deleted_only_after_its_template() {
        let claim = TemplateKind::Claim;
        let records = [
            apply("east", 1.0, claim, "web-1-data", 0),
            delete("east", 20.0, claim, "web-1-data"),
        ];
        let verdict = run(&records, &FaultWindows::default());
        assert_eq!(
            verdict.violations.len(),
            1,
            "no partition needed: {verdict:?}"
        );
        assert!(verdict.violations[0].reason.contains("had not"));
        let template = TemplateRef {
            kind: claim,
            name: "web-1-data".into(),
        };
        let deleted = BTreeMap::from([(template, at(19.0))]);
        let verdict = check(&records, &FaultWindows::default(), &deleted, &settings());
        assert!(verdict.violations.is_empty());
    }

    #[test]
    fn a_shrink_while_a_holder_is_down_is_a_violation_growth_and_repairs_are_not() {
        let db = TemplateKind::Database;
        let mut faults = FaultWindows::default();
        faults.add("north", FaultCause::ApiserverDown, at(10.0), Some(at(20.0)));
        let records = [
            apply("west", 1.0, db, "db-1", 2),
            apply("north", 1.0, db, "db-1", 1),
            // A repair after a member's `kubectl scale` to 5: back to what the hub wrote.
            apply("west", 5.0, db, "db-1", 2),
            apply("west", 12.5, db, "db-1", 3),
            apply("west", 13.0, db, "db-1", 1),
        ];
        let verdict = run(&records, &faults);
        assert_eq!(verdict.shrinks, 1);
        assert_eq!(verdict.violations.len(), 1, "{verdict:?}");
        assert_eq!(verdict.violations[0].request, "spec.replicas 3 -> 1 (200)");
        assert!(
            verdict.violations[0]
                .reason
                .contains("north (holding a copy) had been API server down for 3.0 s")
        );
        // The same shrink once north is back is allowed.
        let mut records = records.to_vec();
        records.pop();
        records.push(apply("west", 25.0, db, "db-1", 1));
        let verdict = run(&records, &faults);
        assert_eq!((verdict.shrinks, verdict.violations.len()), (1, 0));
    }

    /// A person's write in a member, as the lab audits it: through the scale subresource
    /// (the Scale it returned holds `replicas`) or a delete.
    fn person(cluster: &str, seconds: f64, name: &str, replicas: Option<i64>) -> AuditRecord {
        let mut record = match replicas {
            Some(r) => request(cluster, seconds, "patch", STS, name, Some(r), 200),
            None => request(cluster, seconds, "delete", STS, name, None, 200),
        };
        let mut line: serde_json::Value = serde_json::from_str(&record.line).unwrap();
        line["user"] = serde_json::json!({"username": "bulkhead-lab-admin"});
        line["impersonatedUser"] = serde_json::json!({"username": EDITOR});
        if let Some(r) = replicas {
            line["objectRef"]["subresource"] = "scale".into();
            line["responseObject"] = serde_json::json!({"kind": "Scale", "spec": {"replicas": r}});
        }
        record.line = line.to_string();
        record.event = parse_line(&record.line).unwrap();
        record
    }

    /// The hub keeps a frozen copy at what it holds: after a person scaled it from 4 to 3
    /// in the member, the hub writing 3 is no decrease. A person's delete removes the copy
    /// from the clusters holding one.
    #[test]
    fn a_persons_scale_or_delete_in_a_member_is_what_the_hub_is_judged_against() {
        let faults = east_cut(10.0, 40.0);
        let records = [
            apply("east", 1.0, STS, "sts-3", 1),
            apply("north", 1.0, STS, "sts-3", 4),
            person("north", 20.0, "sts-3", Some(3)),
            apply("north", 20.1, STS, "sts-3", 3),
        ];
        let verdict = run(&records, &faults);
        assert_eq!(
            (verdict.shrinks, verdict.violations.len()),
            (0, 0),
            "{verdict:?}"
        );
        // Without the person's scale, the same write is a shrink while east is cut off.
        let verdict = run(
            &[records[0].clone(), records[1].clone(), records[3].clone()],
            &faults,
        );
        assert_eq!(verdict.violations.len(), 1, "{verdict:?}");

        // East's copy deleted by a person: east no longer holds one.
        let records = [
            apply("east", 1.0, STS, "sts-3", 1),
            apply("north", 1.0, STS, "sts-3", 4),
            person("east", 5.0, "sts-3", None),
            apply("north", 20.0, STS, "sts-3", 2),
        ];
        let verdict = run(&records, &faults);
        assert_eq!(
            (verdict.shrinks, verdict.violations.len()),
            (1, 0),
            "{verdict:?}"
        );
    }

    /// The 60-minute run of seed 613575190 (second run): a person scaled east's copy to 4
    /// between the writer's read and its apply; the apply, re-asserting the 1 the hub had
    /// applied, carried the version it read and was refused (409). Nothing was lowered.
    #[test]
    fn a_refused_reapply_of_what_the_hub_applied_is_no_shrink() {
        let mut north = FaultWindows::default();
        north.add("north", FaultCause::CutOff, at(10.0), Some(at(40.0)));
        let conditioned = |code| {
            let mut record = request("east", 20.1, "patch", STS, "sts-3", Some(1), code);
            let object = record.event.request_object.as_mut().unwrap();
            object["metadata"] = serde_json::json!({"resourceVersion": "18680"});
            record
        };
        let records = [
            apply("east", 1.0, STS, "sts-3", 1),
            apply("north", 1.0, STS, "sts-3", 1),
            person("east", 20.0, "sts-3", Some(4)),
            conditioned(409),
        ];
        let verdict = run(&records, &north);
        assert_eq!(
            (verdict.shrinks, verdict.violations.len()),
            (0, 0),
            "{verdict:?}"
        );
        // Had it gone through (200), it would have lowered the person's 4 while north,
        // holding a copy, was cut off.
        let records = [
            records[0].clone(),
            records[1].clone(),
            records[2].clone(),
            conditioned(200),
        ];
        assert_eq!(run(&records, &north).violations.len(), 1);
        // A refused write of a count the hub never applied is judged as sent.
        let mut lower = conditioned(409);
        lower.event.request_object.as_mut().unwrap()["spec"]["replicas"] = serde_json::json!(0);
        let records = [
            records[0].clone(),
            records[1].clone(),
            records[2].clone(),
            lower,
        ];
        assert_eq!(run(&records, &north).violations.len(), 1);
    }

    #[test]
    fn a_copy_created_again_starts_from_its_new_replicas() {
        let records = [
            apply("east", 1.0, STS, "sts-1", 1),
            apply("west", 1.0, STS, "sts-1", 3),
            delete("west", 2.0, STS, "sts-1"),
            request("west", 12.0, "patch", STS, "sts-1", Some(1), 201),
        ];
        let verdict = run(&records, &east_cut(5.0, 30.0));
        assert_eq!(
            (verdict.shrinks, verdict.violations.len()),
            (0, 0),
            "{verdict:?}"
        );
    }

    #[test]
    fn creating_a_copy_again_lowers_nothing_whatever_it_held_before() {
        // The copy went (its deletion finished without the hub or a person deleting it:
        // a finalizer) and the hub created it again with its share.
        let records = [
            apply("east", 1.0, STS, "sts-1", 1),
            apply("west", 1.0, STS, "sts-1", 3),
            request("west", 12.0, "patch", STS, "sts-1", Some(1), 201),
        ];
        let verdict = run(&records, &east_cut(5.0, 30.0));
        assert_eq!(verdict.violations.len(), 0, "{verdict:?}");
    }

    /// A timeline entry `seconds` into the run.
    fn entry(seconds: f64, event: Event) -> Entry {
        Entry {
            at: at(seconds),
            since_start: None,
            event,
        }
    }

    fn east() -> String {
        "east".to_string()
    }

    #[test]
    fn an_api_server_restart_ends_at_the_hubs_first_renewal_it_answered() {
        let entries = [
            entry(6.0, Event::ApiserverDown { member: east() }),
            entry(12.0, Event::ApiserverUp { member: east() }),
        ];
        let renewals = BTreeMap::from([("east".to_string(), vec![at(5.0), at(10.5), at(11.5)])]);
        let faults = FaultWindows::from_timeline_and_renewals(&entries, &renewals);
        assert!(faults.window_at("east", at(10.0)).is_some());
        assert!(faults.window_at("east", at(11.0)).is_none(), "{faults:?}");
        // Without a renewal in between, the nemesis's time stands.
        let faults = FaultWindows::from_timeline_and_renewals(&entries, &BTreeMap::new());
        assert!(faults.window_at("east", at(11.9)).is_some());
    }

    #[test]
    fn other_users_kinds_namespaces_and_stages_are_not_judged() {
        let mut other_user = delete("west", 15.0, STS, "sts-1");
        other_user.event.user.username = "bulkhead-lab-admin".into();
        let deployment = delete("west", 15.0, TemplateKind::Deployment, "web-1");
        let mut other_namespace = delete("west", 15.0, STS, "sts-1");
        other_namespace.event.object_ref.as_mut().unwrap().namespace = "elsewhere".into();
        let records = [
            apply("east", 1.0, STS, "sts-1", 1),
            other_user,
            deployment,
            other_namespace,
        ];
        let verdict = run(&records, &east_cut(10.0, 30.0));
        assert_eq!(
            verdict,
            Verdict {
                writes: 1,
                ..Default::default()
            }
        );
    }

    #[test]
    fn overlapping_faults_of_a_member_make_one_window() {
        let mut faults = FaultWindows::default();
        faults.add("east", FaultCause::CutOff, at(0.0), Some(at(10.0)));
        // The hub isolated while east was cut off, then east's API server restarted.
        faults.add("east", FaultCause::CutOff, at(5.0), Some(at(15.0)));
        faults.add("east", FaultCause::ApiserverDown, at(15.0), Some(at(18.0)));
        faults.add("east", FaultCause::CutOff, at(30.0), Some(at(31.0)));
        assert_eq!(
            faults.fault_age("east", at(17.0)),
            Some(Duration::from_secs(17))
        );
        assert_eq!(faults.fault_age("east", at(18.0)), None, "healed at 18 s");
        assert_eq!(
            faults.fault_age("east", at(30.5)),
            Some(Duration::from_millis(500))
        );
        assert_eq!(faults.fault_age("west", at(5.0)), None);
        let window = faults.window_at("east", at(1.0)).unwrap();
        assert_eq!(
            window.causes,
            BTreeSet::from([FaultCause::CutOff, FaultCause::ApiserverDown])
        );
    }

    #[test]
    fn fault_windows_come_from_the_timeline() {
        let entries = [
            entry(1.0, Event::NetworkCut { member: east() }),
            entry(2.0, Event::Note("unrelated".into())),
            entry(4.0, Event::NetworkHealed { member: east() }),
            entry(6.0, Event::ApiserverDown { member: east() }),
        ];
        let faults = FaultWindows::from_timeline(&entries);
        assert_eq!(
            faults.fault_age("east", at(3.0)),
            Some(Duration::from_secs(2))
        );
        assert_eq!(faults.fault_age("east", at(5.0)), None);
        assert_eq!(
            faults.fault_age("east", at(100.0)),
            Some(Duration::from_secs(94)),
            "never back up: still down at the end"
        );
    }
}
