//! The nemesis's plan: which faults start when and for how long, and which operations
//! users perform on the hub and in the members, all drawn from one seed. The same seed and
//! length give the same schedule on every machine (what the system then does in reaction
//! still depends on timing).
//!
//! The plan follows a model of the templates it creates, so it never scales or deletes a
//! template that does not exist yet; the copies it edits in members may or may not exist
//! at that moment (the hub may not have created them, or another fault may have removed
//! them): such an edit is then a no-op, recorded as such.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use super::random::SeededRandom;

/// The lab's members, in a fixed order (the schedule picks among them by index).
pub const MEMBERS: [&str; 3] = ["east", "west", "north"];

/// At most this many faults at once.
pub const MAX_CONCURRENT_FAULTS: usize = 3;

/// The kinds of template the chaos run federates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TemplateKind {
    /// MyDatabase (stateful, divided; the member's agent runs it).
    Database,
    /// A plain StatefulSet with a volume claim template (stateful, divided).
    StatefulSet,
    /// A Deployment (stateless, divided) whose policy propagates its dependencies: it
    /// names a ConfigMap and a PersistentVolumeClaim of its own, which follow it.
    Deployment,
    /// The ConfigMap `<deployment>-config` that follows its Deployment.
    ConfigMap,
    /// The PersistentVolumeClaim `<deployment>-data` that follows its Deployment.
    Claim,
    /// Shard, a custom kind federated mid-run (stateful by its interpreter, divided).
    Shard,
}

impl TemplateKind {
    /// Every kind.
    pub const ALL: [TemplateKind; 6] = [
        TemplateKind::Database,
        TemplateKind::StatefulSet,
        TemplateKind::Deployment,
        TemplateKind::ConfigMap,
        TemplateKind::Claim,
        TemplateKind::Shard,
    ];

    /// The Kubernetes kind.
    pub fn kind(self) -> &'static str {
        match self {
            TemplateKind::Database => "MyDatabase",
            TemplateKind::StatefulSet => "StatefulSet",
            TemplateKind::Deployment => "Deployment",
            TemplateKind::ConfigMap => "ConfigMap",
            TemplateKind::Claim => "PersistentVolumeClaim",
            TemplateKind::Shard => "Shard",
        }
    }

    /// The API group ("" for the core group).
    pub fn group(self) -> &'static str {
        match self {
            TemplateKind::Database => "example.com",
            TemplateKind::StatefulSet | TemplateKind::Deployment => "apps",
            TemplateKind::ConfigMap | TemplateKind::Claim => "",
            TemplateKind::Shard => "chaos.example.org",
        }
    }

    /// The resource (plural) as the API server and its audit log name it.
    pub fn plural(self) -> &'static str {
        match self {
            TemplateKind::Database => "mydatabases",
            TemplateKind::StatefulSet => "statefulsets",
            TemplateKind::Deployment => "deployments",
            TemplateKind::ConfigMap => "configmaps",
            TemplateKind::Claim => "persistentvolumeclaims",
            TemplateKind::Shard => "shards",
        }
    }

    /// The kind an audit log's `objectRef` (group and resource) names, if it is one of ours.
    pub fn from_resource(group: &str, resource: &str) -> Option<TemplateKind> {
        TemplateKind::ALL
            .into_iter()
            .find(|k| k.group() == group && k.plural() == resource)
    }

    /// Whether the kind holds data: its copies are deleted or shrunk only under the
    /// partition rules (DESIGN.md section 5).
    pub fn is_stateful(self) -> bool {
        matches!(
            self,
            TemplateKind::Database | TemplateKind::StatefulSet | TemplateKind::Shard
        )
    }

    /// Whether the policy divides the template's replicas over the members (the others are
    /// duplicated whole).
    pub fn is_divided(self) -> bool {
        matches!(
            self,
            TemplateKind::Database
                | TemplateKind::StatefulSet
                | TemplateKind::Deployment
                | TemplateKind::Shard
        )
    }

    /// Name prefix of the templates of a kind the nemesis creates on its own (ConfigMaps
    /// and claims are named after their Deployment).
    fn prefix(self) -> &'static str {
        match self {
            TemplateKind::Database => "db",
            TemplateKind::StatefulSet => "sts",
            TemplateKind::Deployment => "web",
            TemplateKind::ConfigMap => "config",
            TemplateKind::Claim => "data",
            TemplateKind::Shard => "shard",
        }
    }

    /// The replicas a new or scaled template of a divided kind gets: `low..=high`.
    fn replica_range(self) -> (u64, u64) {
        match self {
            TemplateKind::Deployment => (1, 6),
            _ => (1, 4),
        }
    }

    /// How many templates of the kind the nemesis keeps at most.
    fn most_live(self) -> usize {
        match self {
            TemplateKind::Shard => 2,
            _ => 3,
        }
    }
}

/// The ConfigMap a Deployment names.
pub fn config_of(deployment: &str) -> String {
    format!("{deployment}-config")
}

/// The PersistentVolumeClaim a Deployment names.
pub fn claim_of(deployment: &str) -> String {
    format!("{deployment}-data")
}

/// One fault the nemesis throws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The member's external address drops every packet (iptables DROP): the hub cannot
    /// reach it, its zone keeps working.
    Partition { member: &'static str },
    /// Every member cut off from the hub at once.
    IsolateHub,
    /// The member's kube-apiserver is killed (SIGKILL) and started again after the fault's
    /// duration.
    RestartApiserver { member: &'static str },
    /// The hub replica that leads is killed (SIGKILL) and started again after the fault's
    /// duration.
    KillLeader,
    /// The hub replica that leads is frozen (SIGSTOP) for the fault's duration, then
    /// resumed (SIGCONT).
    PauseLeader,
}

impl Fault {
    /// Whether the fault acts on a hub process.
    pub fn is_hub_process(self) -> bool {
        matches!(self, Fault::KillLeader | Fault::PauseLeader)
    }

    /// The members the fault makes unreachable or unavailable while it lasts.
    pub fn members(self) -> Vec<&'static str> {
        match self {
            Fault::Partition { member } | Fault::RestartApiserver { member } => vec![member],
            Fault::IsolateHub => MEMBERS.to_vec(),
            Fault::KillLeader | Fault::PauseLeader => vec![],
        }
    }

    /// The fault's duration range in milliseconds.
    fn duration_range(self) -> (u64, u64) {
        match self {
            // From shorter than the hub's detection to long past every timeout.
            Fault::Partition { .. } => (1_500, 25_000),
            Fault::IsolateHub => (1_500, 15_000),
            Fault::RestartApiserver { .. } => (1_000, 10_000),
            Fault::KillLeader => (1_000, 10_000),
            // Around the leader lease duration (6 s): sometimes the standby takes over.
            Fault::PauseLeader => (1_000, 14_000),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Partition { member } => write!(f, "partition {member}"),
            Fault::IsolateHub => write!(f, "isolate the hub"),
            Fault::RestartApiserver { member } => write!(f, "restart {member}'s kube-apiserver"),
            Fault::KillLeader => write!(f, "SIGKILL the leading hub, restart it"),
            Fault::PauseLeader => write!(f, "SIGSTOP the leading hub, SIGCONT it"),
        }
    }
}

/// A fault with its start (from the beginning of the run) and how long it lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedFault {
    pub start: Duration,
    pub duration: Duration,
    pub fault: Fault,
}

impl PlannedFault {
    /// When the fault ends, from the beginning of the run.
    pub fn end(&self) -> Duration {
        self.start + self.duration
    }
}

/// One thing a user does, on the hub (templates) or in a member (copies, as a person with
/// `kubectl` in that cluster would).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Creates a template on the hub; a Deployment comes with its ConfigMap and claim,
    /// created first.
    Create {
        kind: TemplateKind,
        name: String,
        replicas: i64,
    },
    /// Sets a divided template's replicas on the hub.
    Scale {
        kind: TemplateKind,
        name: String,
        replicas: i64,
    },
    /// Changes a template's spec (image, version, data) on the hub to revision `revision`.
    /// A Deployment's every fourth revision stops naming its claim.
    Edit {
        kind: TemplateKind,
        name: String,
        revision: u32,
    },
    /// Deletes a template on the hub.
    Delete { kind: TemplateKind, name: String },
    /// `kubectl scale` of a member's copy.
    ScaleCopy {
        member: &'static str,
        kind: TemplateKind,
        name: String,
        replicas: i64,
    },
    /// Edits a member's copy (image, version, data) to a value the template never has.
    EditCopy {
        member: &'static str,
        kind: TemplateKind,
        name: String,
        mark: u32,
    },
    /// Deletes a member's copy.
    DeleteCopy {
        member: &'static str,
        kind: TemplateKind,
        name: String,
    },
    /// Installs the Shard CRD in the hub and every member, its interpreter (stateful,
    /// replicas at `.spec.replicas`) and a policy selecting it: a new kind federated while
    /// the run goes on.
    FederateShards,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operation::Create {
                kind,
                name,
                replicas,
            } => {
                write!(f, "hub: create {} {name}", kind.kind())?;
                if kind.is_divided() {
                    write!(f, " with {replicas} replicas")?;
                }
                if *kind == TemplateKind::Deployment {
                    write!(f, " (with {} and {})", config_of(name), claim_of(name))?;
                }
                Ok(())
            }
            Operation::Scale {
                kind,
                name,
                replicas,
            } => write!(f, "hub: scale {} {name} to {replicas}", kind.kind()),
            Operation::Edit {
                kind,
                name,
                revision,
            } => write!(f, "hub: edit {} {name} to revision {revision}", kind.kind()),
            Operation::Delete { kind, name } => write!(f, "hub: delete {} {name}", kind.kind()),
            Operation::ScaleCopy {
                member,
                kind,
                name,
                replicas,
            } => write!(
                f,
                "{member}: scale the copy of {} {name} to {replicas}",
                kind.kind()
            ),
            Operation::EditCopy {
                member,
                kind,
                name,
                mark,
            } => write!(
                f,
                "{member}: edit the copy of {} {name} (mark {mark})",
                kind.kind()
            ),
            Operation::DeleteCopy { member, kind, name } => {
                write!(f, "{member}: delete the copy of {} {name}", kind.kind())
            }
            Operation::FederateShards => {
                write!(
                    f,
                    "hub: federate a new kind (Shard CRD, interpreter, policy)"
                )
            }
        }
    }
}

/// An operation at its time from the beginning of the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedOperation {
    pub at: Duration,
    pub operation: Operation,
}

/// Everything the nemesis will do in a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    pub length: Duration,
    /// The templates that exist before the clock starts (the run waits until they
    /// converged).
    pub initial: Vec<Operation>,
    pub faults: Vec<PlannedFault>,
    pub operations: Vec<PlannedOperation>,
}

impl Schedule {
    /// The schedule for `seed`, `length` long.
    pub fn generate(seed: u64, length: Duration) -> Self {
        // Two streams, so that a change in how operations are drawn leaves the faults of
        // a seed alone (and the other way round).
        let mut fault_random = SeededRandom::new(seed);
        let mut operation_random = SeededRandom::new(seed ^ 0x6F70_6572_6174_696F);
        let mut model = Model::default();
        let initial = [
            TemplateKind::Database,
            TemplateKind::Database,
            TemplateKind::StatefulSet,
            TemplateKind::StatefulSet,
            TemplateKind::Deployment,
            TemplateKind::Deployment,
        ]
        .into_iter()
        .map(|kind| model.create(&mut operation_random, kind))
        .collect();
        Schedule {
            seed,
            length,
            initial,
            faults: plan_faults(&mut fault_random, length),
            operations: plan_operations(&mut operation_random, &mut model, length),
        }
    }

    /// When the last fault ends (zero without faults).
    pub fn last_fault_end(&self) -> Duration {
        self.faults
            .iter()
            .map(PlannedFault::end)
            .max()
            .unwrap_or_default()
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "schedule for seed {} over {} s: {} faults, {} operations",
            self.seed,
            self.length.as_secs(),
            self.faults.len(),
            self.operations.len()
        )?;
        for operation in &self.initial {
            writeln!(f, "  before       {operation}")?;
        }
        let mut lines: Vec<(Duration, String)> = self
            .faults
            .iter()
            .map(|planned| {
                (
                    planned.start,
                    format!(
                        "fault: {} for {:.1} s",
                        planned.fault,
                        planned.duration.as_secs_f64()
                    ),
                )
            })
            .chain(
                self.operations
                    .iter()
                    .map(|planned| (planned.at, planned.operation.to_string())),
            )
            .collect();
        lines.sort_by_key(|(at, _)| *at);
        for (at, line) in lines {
            writeln!(f, "  +{:>8.3}s  {line}", at.as_secs_f64())?;
        }
        Ok(())
    }
}

fn milliseconds(random: &mut SeededRandom, (low, high): (u64, u64)) -> Duration {
    Duration::from_millis(random.between(low, high))
}

/// Faults arrive every 1.5 to 8 s from 3 to 8 s into the run, at most
/// [`MAX_CONCURRENT_FAULTS`] at once, and each ends by the end of the run. At most one
/// hub process fault and one API server restart at a time (two restarting API servers
/// starve the two cores), and a member is not partitioned twice at once.
fn plan_faults(random: &mut SeededRandom, length: Duration) -> Vec<PlannedFault> {
    let mut faults: Vec<PlannedFault> = vec![];
    let mut at = milliseconds(random, (3_000, 8_000));
    while at + Duration::from_secs(1) < length {
        let active: Vec<Fault> = faults
            .iter()
            .filter(|f| f.end() > at)
            .map(|f| f.fault)
            .collect();
        if active.len() < MAX_CONCURRENT_FAULTS {
            let free_members: Vec<&'static str> = MEMBERS
                .into_iter()
                .filter(|m| !active.contains(&Fault::Partition { member: m }))
                .collect();
            let hub_busy = active.iter().any(|f| f.is_hub_process());
            let restarting = active
                .iter()
                .any(|f| matches!(f, Fault::RestartApiserver { .. }));
            let isolated = active.contains(&Fault::IsolateHub);
            #[derive(Clone, Copy)]
            enum Choice {
                Partition,
                Isolate,
                Restart,
                Kill,
                Pause,
            }
            let weight = |allowed: bool, weight: u64| if allowed { weight } else { 0 };
            let choices = [
                (Choice::Partition, weight(!free_members.is_empty(), 40)),
                (Choice::Isolate, weight(!isolated, 12)),
                (Choice::Restart, weight(!restarting, 16)),
                (Choice::Kill, weight(!hub_busy, 14)),
                (Choice::Pause, weight(!hub_busy, 14)),
            ];
            if choices.iter().any(|(_, w)| *w > 0) {
                let fault = match random.weighted(&choices) {
                    Choice::Partition => Fault::Partition {
                        member: random.pick(&free_members),
                    },
                    Choice::Isolate => Fault::IsolateHub,
                    Choice::Restart => Fault::RestartApiserver {
                        member: random.pick(&MEMBERS),
                    },
                    Choice::Kill => Fault::KillLeader,
                    Choice::Pause => Fault::PauseLeader,
                };
                let duration = milliseconds(random, fault.duration_range()).min(length - at);
                faults.push(PlannedFault {
                    start: at,
                    duration,
                    fault,
                });
            }
        }
        at += milliseconds(random, (1_500, 8_000));
    }
    faults
}

/// What the plan knows of the hub's templates: which exist, their revisions, and the
/// next number of each kind.
#[derive(Default)]
struct Model {
    live: BTreeSet<(TemplateKind, String)>,
    revisions: BTreeMap<(TemplateKind, String), u32>,
    created: BTreeMap<TemplateKind, u32>,
    shards_federated: bool,
    copy_edits: u32,
}

impl Model {
    fn count(&self, kind: TemplateKind) -> usize {
        self.live.iter().filter(|(k, _)| *k == kind).count()
    }

    fn names(&self, kinds: &[TemplateKind]) -> Vec<(TemplateKind, String)> {
        self.live
            .iter()
            .filter(|(k, _)| kinds.contains(k))
            .cloned()
            .collect()
    }

    fn create(&mut self, random: &mut SeededRandom, kind: TemplateKind) -> Operation {
        let number = self.created.entry(kind).or_default();
        *number += 1;
        let name = format!("{}-{number}", kind.prefix());
        self.live.insert((kind, name.clone()));
        if kind == TemplateKind::Deployment {
            self.live
                .insert((TemplateKind::ConfigMap, config_of(&name)));
            self.live.insert((TemplateKind::Claim, claim_of(&name)));
        }
        let (low, high) = kind.replica_range();
        Operation::Create {
            kind,
            name,
            replicas: random.between(low, high) as i64,
        }
    }

    /// Templates that may be deleted now: a kind keeps at least one template, and a
    /// ConfigMap or claim goes only after its Deployment (a claim a pod still mounts
    /// would stay Terminating).
    fn deletable(&self) -> Vec<(TemplateKind, String)> {
        self.live
            .iter()
            .filter(|(kind, name)| match kind {
                TemplateKind::ConfigMap | TemplateKind::Claim => {
                    let deployment = name.rsplit_once('-').map(|(d, _)| d).unwrap_or(name);
                    !self
                        .live
                        .contains(&(TemplateKind::Deployment, deployment.to_string()))
                }
                kind => self.count(*kind) > 1,
            })
            .cloned()
            .collect()
    }
}

/// One operation every 0.5 to 3 s from the start to the end of the run: two in three on
/// the hub, one in three on a member's copy; the new kind is federated once, between 20 %
/// and 50 % of the run, and its templates are created only after that.
fn plan_operations(
    random: &mut SeededRandom,
    model: &mut Model,
    length: Duration,
) -> Vec<PlannedOperation> {
    let federate_at = length.mul_f64(random.between(20, 50) as f64 / 100.0);
    let mut operations = vec![];
    let mut at = milliseconds(random, (500, 3_000));
    while at < length {
        let operation = if !model.shards_federated && at >= federate_at {
            model.shards_federated = true;
            Operation::FederateShards
        } else {
            next_operation(random, model)
        };
        operations.push(PlannedOperation { at, operation });
        at += milliseconds(random, (500, 3_000));
    }
    operations
}

fn next_operation(random: &mut SeededRandom, model: &mut Model) -> Operation {
    #[derive(Clone, Copy, PartialEq)]
    enum Choice {
        Create,
        Scale,
        Edit,
        Delete,
        ScaleCopy,
        EditCopy,
        DeleteCopy,
    }
    let mut creatable = vec![
        TemplateKind::Database,
        TemplateKind::StatefulSet,
        TemplateKind::Deployment,
    ];
    if model.shards_federated {
        creatable.push(TemplateKind::Shard);
    }
    creatable.retain(|kind| model.count(*kind) < kind.most_live());
    let divided = model.names(&[
        TemplateKind::Database,
        TemplateKind::StatefulSet,
        TemplateKind::Deployment,
        TemplateKind::Shard,
    ]);
    let editable = model.names(&[
        TemplateKind::Database,
        TemplateKind::StatefulSet,
        TemplateKind::Deployment,
        TemplateKind::ConfigMap,
        TemplateKind::Shard,
    ]);
    let deletable = model.deletable();
    let weight = |candidates: bool, weight: u64| if candidates { weight } else { 0 };
    let choice = random.weighted(&[
        (Choice::Create, weight(!creatable.is_empty(), 12)),
        (Choice::Scale, weight(!divided.is_empty(), 20)),
        (Choice::Edit, weight(!editable.is_empty(), 12)),
        (Choice::Delete, weight(!deletable.is_empty(), 10)),
        (Choice::ScaleCopy, weight(!divided.is_empty(), 16)),
        (Choice::EditCopy, weight(!editable.is_empty(), 14)),
        (Choice::DeleteCopy, weight(!editable.is_empty(), 10)),
    ]);
    match choice {
        Choice::Create => {
            let kind = random.pick(&creatable);
            model.create(random, kind)
        }
        Choice::Scale => {
            let (kind, name) = random.pick(&divided);
            let (low, high) = kind.replica_range();
            Operation::Scale {
                kind,
                name,
                replicas: random.between(low, high) as i64,
            }
        }
        Choice::Edit => {
            let (kind, name) = random.pick(&editable);
            let revision = model.revisions.entry((kind, name.clone())).or_default();
            *revision += 1;
            Operation::Edit {
                kind,
                name,
                revision: *revision,
            }
        }
        Choice::Delete => {
            let (kind, name) = random.pick(&deletable);
            model.live.remove(&(kind, name.clone()));
            Operation::Delete { kind, name }
        }
        Choice::ScaleCopy => {
            let (kind, name) = random.pick(&divided);
            Operation::ScaleCopy {
                member: random.pick(&MEMBERS),
                kind,
                name,
                replicas: random.between(1, 5) as i64,
            }
        }
        Choice::EditCopy => {
            let (kind, name) = random.pick(&editable);
            model.copy_edits += 1;
            Operation::EditCopy {
                member: random.pick(&MEMBERS),
                kind,
                name,
                mark: model.copy_edits,
            }
        }
        Choice::DeleteCopy => {
            let (kind, name) = random.pick(&editable);
            Operation::DeleteCopy {
                member: random.pick(&MEMBERS),
                kind,
                name,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names_of(operation: &Operation) -> Option<(TemplateKind, &str)> {
        match operation {
            Operation::Create { kind, name, .. }
            | Operation::Scale { kind, name, .. }
            | Operation::Edit { kind, name, .. }
            | Operation::Delete { kind, name }
            | Operation::ScaleCopy { kind, name, .. }
            | Operation::EditCopy { kind, name, .. }
            | Operation::DeleteCopy { kind, name, .. } => Some((*kind, name)),
            Operation::FederateShards => None,
        }
    }

    #[test]
    fn a_seed_gives_the_same_schedule_and_another_seed_another() {
        let length = Duration::from_secs(180);
        let schedule = Schedule::generate(1234, length);
        assert_eq!(schedule, Schedule::generate(1234, length));
        assert_eq!(
            schedule.to_string(),
            Schedule::generate(1234, length).to_string()
        );
        let other = Schedule::generate(1235, length);
        assert_ne!(schedule.faults, other.faults);
        assert_ne!(schedule.operations, other.operations);
        assert!(schedule.faults.len() >= 20, "{}", schedule.faults.len());
        assert!(schedule.operations.len() >= 60);
    }

    #[test]
    fn every_fault_kind_shows_up_and_faults_overlap() {
        let schedule = Schedule::generate(99, Duration::from_secs(600));
        let has = |wanted: fn(&Fault) -> bool| schedule.faults.iter().any(|f| wanted(&f.fault));
        assert!(has(|f| matches!(f, Fault::Partition { .. })));
        assert!(has(|f| matches!(f, Fault::IsolateHub)));
        assert!(has(|f| matches!(f, Fault::RestartApiserver { .. })));
        assert!(has(|f| matches!(f, Fault::KillLeader)));
        assert!(has(|f| matches!(f, Fault::PauseLeader)));
        let overlapping = schedule.faults.iter().any(|a| {
            schedule
                .faults
                .iter()
                .any(|b| a != b && a.start < b.end() && b.start < a.end())
        });
        assert!(overlapping, "several faults at once");
    }

    #[test]
    fn faults_respect_the_limits_and_end_with_the_run() {
        for seed in 0..50 {
            let length = Duration::from_secs(120);
            let schedule = Schedule::generate(seed, length);
            for fault in &schedule.faults {
                assert!(
                    fault.end() <= length,
                    "seed {seed}: {fault:?} ends after the run"
                );
                let at = fault.start;
                let active: Vec<&PlannedFault> = schedule
                    .faults
                    .iter()
                    .filter(|f| f.start <= at && f.end() > at)
                    .collect();
                assert!(
                    active.len() <= MAX_CONCURRENT_FAULTS,
                    "seed {seed} at {at:?}"
                );
                let count =
                    |wanted: fn(&Fault) -> bool| active.iter().filter(|f| wanted(&f.fault)).count();
                assert!(count(|f| f.is_hub_process()) <= 1, "seed {seed}");
                assert!(
                    count(|f| matches!(f, Fault::RestartApiserver { .. })) <= 1,
                    "seed {seed}"
                );
                assert!(
                    count(|f| matches!(f, Fault::IsolateHub)) <= 1,
                    "seed {seed}"
                );
                for member in MEMBERS {
                    assert!(
                        active
                            .iter()
                            .filter(|f| f.fault == Fault::Partition { member })
                            .count()
                            <= 1,
                        "seed {seed}"
                    );
                }
            }
            assert!(schedule.last_fault_end() <= length);
        }
    }

    #[test]
    fn operations_follow_the_templates_the_schedule_created() {
        for seed in 0..50 {
            let schedule = Schedule::generate(seed, Duration::from_secs(180));
            let mut live: BTreeSet<(TemplateKind, String)> = BTreeSet::new();
            let mut ever: BTreeSet<(TemplateKind, String)> = BTreeSet::new();
            let mut federated = false;
            let mut last_at = Duration::ZERO;
            let initial = schedule.initial.iter().map(|o| (Duration::ZERO, o));
            let timed = schedule.operations.iter().map(|p| (p.at, &p.operation));
            for (at, operation) in initial.chain(timed) {
                assert!(at >= last_at, "seed {seed}: operations in time order");
                last_at = at;
                if let Some((kind, _)) = names_of(operation) {
                    assert!(
                        kind != TemplateKind::Shard || federated,
                        "seed {seed}: {operation} before the kind is federated"
                    );
                }
                match operation {
                    Operation::FederateShards => {
                        assert!(!federated, "seed {seed}: federated twice");
                        federated = true;
                    }
                    Operation::Create { kind, name, .. } => {
                        assert!(ever.insert((*kind, name.clone())), "names are never reused");
                        live.insert((*kind, name.clone()));
                        if *kind == TemplateKind::Deployment {
                            for dependency in [
                                (TemplateKind::ConfigMap, config_of(name)),
                                (TemplateKind::Claim, claim_of(name)),
                            ] {
                                ever.insert(dependency.clone());
                                live.insert(dependency);
                            }
                        }
                    }
                    Operation::Delete { kind, name } => {
                        assert!(
                            live.remove(&(*kind, name.clone())),
                            "seed {seed}: {operation}"
                        );
                        if let Some(deployment) = name
                            .strip_suffix("-config")
                            .or_else(|| name.strip_suffix("-data"))
                        {
                            assert!(
                                !live.contains(&(TemplateKind::Deployment, deployment.into())),
                                "seed {seed}: {operation} while its Deployment exists"
                            );
                        }
                    }
                    Operation::Scale { kind, name, .. } | Operation::Edit { kind, name, .. } => {
                        assert!(
                            live.contains(&(*kind, name.clone())),
                            "seed {seed}: {operation}"
                        );
                    }
                    Operation::ScaleCopy { kind, name, .. }
                    | Operation::EditCopy { kind, name, .. }
                    | Operation::DeleteCopy { kind, name, .. } => {
                        assert!(
                            ever.contains(&(*kind, name.clone())),
                            "seed {seed}: {operation}"
                        );
                        assert_ne!(
                            *kind,
                            TemplateKind::Claim,
                            "claims are never touched in members"
                        );
                    }
                }
            }
            assert!(federated, "seed {seed}: the new kind is federated");
        }
    }

    #[test]
    fn audit_resources_map_back_to_kinds() {
        for kind in TemplateKind::ALL {
            assert_eq!(
                TemplateKind::from_resource(kind.group(), kind.plural()),
                Some(kind)
            );
        }
        assert_eq!(TemplateKind::from_resource("apps", "replicasets"), None);
        assert!(TemplateKind::Shard.is_stateful() && !TemplateKind::Deployment.is_stateful());
    }
}
