//! Progressive rollouts, pure: given a policy's rollout strategy, the template's revision,
//! the rollout the binding records and what the hub sees of each cluster's copy, where
//! the rollout goes next and which revision each cluster's copy is to hold.
//!
//! Rules (DESIGN.md section 4, "Rollouts"):
//! - a template's first revision goes everywhere at once (there is nothing to roll out
//!   from); a later one goes to wave 0 first, and to wave `w + 1` only after every copy of
//!   waves `0..=w` is Ready at the new revision, has stayed so for `minHealthySeconds`,
//!   its analysis passed and the wave's pause is over;
//! - the clusters of waves not reached yet keep the last good (stable) revision, checked
//!   at every step: [`assignment`] is the only place that says which revision a cluster
//!   gets, and it never gives a later wave the new revision before its turn;
//! - a failed analysis rolls the updated waves back to the stable revision, the current
//!   wave first, each wave only after the one above it is back and Ready
//!   (`onFailure: Rollback`), or pauses (`onFailure: Pause`); the failed revision is not
//!   rolled out again until the template changes;
//! - **the stateful rules win**: while a cluster of the placement is not Ready, nothing
//!   moves, forward or back (`waitingFor` names them), and the copies keep the revision
//!   the recorded rollout gives them;
//! - commands (`bulkhead rollout promote|pause|resume|abort`) come with an id and are
//!   carried out once each.
//!
//! Everything the rollout needs to resume after a restart or a leader change is in the
//! status this returns: the hub writes it to the binding before it writes any copy.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::rollout::{
    AnalysisMeasurement, RolloutFailureAction, RolloutPhase, RolloutStatus, RolloutStrategy,
};

/// One cluster of the template's placement.
#[derive(Clone, Debug)]
pub struct RolloutCluster<'a> {
    pub name: &'a str,
    /// Its wave ([`wave_of`]).
    pub wave: usize,
    /// The cluster counts as Ready (for a stateful kind: trusted, as for the partition
    /// freeze).
    pub ready: bool,
    /// Its MemberCluster is Ready. A cluster that is but does not count as Ready (its
    /// copies not listed yet after a hub restart or a leader change, or in doubt) holds
    /// the rollout as well, without restarting the health wait.
    pub member_ready: bool,
    /// The revision its copy holds (its annotation); None: no copy, or not known.
    pub running: Option<i64>,
    /// Its copy has rolled out its current spec: Ready at its target by the kind's health
    /// rule, every replica updated, none of an older spec left.
    pub healthy: bool,
}

/// A `bulkhead rollout` command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// The current wave counts as passed (its health wait, analysis or pause is skipped).
    Promote,
    Pause,
    Resume,
    /// Roll every updated wave back; the rollout ends `Aborted`.
    Abort,
}

impl Command {
    /// Reads the verb of a command annotation.
    pub fn parse(verb: &str) -> Option<Self> {
        match verb {
            "promote" => Some(Self::Promote),
            "pause" => Some(Self::Pause),
            "resume" => Some(Self::Resume),
            "abort" => Some(Self::Abort),
            _ => None,
        }
    }
}

/// One rollout question.
#[derive(Clone, Debug)]
pub struct RolloutInput<'a> {
    pub strategy: &'a RolloutStrategy,
    /// The template's revision now.
    pub revision: i64,
    /// What the binding records (None: no rollout recorded: the template is new, or the
    /// policy just gained its strategy).
    pub recorded: Option<&'a RolloutStatus>,
    /// The placement's clusters.
    pub clusters: &'a [RolloutCluster<'a>],
    /// The waves' names, the implicit last one included ([`wave_names`]).
    pub wave_names: &'a [String],
    pub now: Timestamp,
    /// A command not carried out yet, with its id.
    pub command: Option<(Command, &'a str)>,
    /// A measurement of the current wave's analysis, taken because [`measurement_due`]
    /// said so.
    pub measurement: Option<AnalysisMeasurement>,
}

/// An Event the hub records on the template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutEvent {
    pub reason: &'static str,
    pub message: String,
    pub warning: bool,
}

/// The answer.
#[derive(Clone, Debug, PartialEq)]
pub struct RolloutDecision {
    pub status: RolloutStatus,
    /// The revision each cluster's copy is to hold.
    pub assign: BTreeMap<String, i64>,
    pub events: Vec<RolloutEvent>,
    /// When to look again (a health wait, a measurement, a pause), if nothing else
    /// wakes the template before.
    pub wake_at: Option<Timestamp>,
}

/// The wave a cluster belongs to: the first wave that names it, by name, zone or labels;
/// a cluster no wave names is in the implicit wave after the last.
pub fn wave_of(
    strategy: &RolloutStrategy,
    cluster: &str,
    zone: Option<&str>,
    labels: &BTreeMap<String, String>,
) -> usize {
    strategy
        .waves
        .iter()
        .position(|wave| {
            wave.clusters.iter().any(|c| c == cluster)
                || zone.is_some_and(|z| wave.zones.iter().any(|w| w == z))
                || wave.label_selector.as_ref().is_some_and(|selector| {
                    crate::hub::federation::placement::label_selector_matches(selector, labels)
                })
        })
        .unwrap_or(strategy.waves.len())
}

/// The waves' names: each wave's own or `wave-<n>` (from 1), and `rest` for the implicit
/// last wave when a cluster of the placement is in it.
pub fn wave_names(strategy: &RolloutStrategy, clusters: &[RolloutCluster<'_>]) -> Vec<String> {
    let mut names: Vec<String> = strategy
        .waves
        .iter()
        .enumerate()
        .map(|(i, wave)| {
            wave.name
                .clone()
                .unwrap_or_else(|| format!("wave-{}", i + 1))
        })
        .collect();
    if clusters.iter().any(|c| c.wave >= strategy.waves.len()) {
        names.push("rest".into());
    }
    names
}

/// Whether the current wave's analysis needs a measurement now.
pub fn measurement_due(strategy: &RolloutStrategy, status: &RolloutStatus, now: Timestamp) -> bool {
    let Some(analysis) = &strategy.analysis else {
        return false;
    };
    if status.phase != RolloutPhase::Progressing || !status.waiting_for.is_empty() {
        return false;
    }
    let Some(healthy) = status.healthy_since.as_ref() else {
        return false;
    };
    if now < healthy.0 + SignedDuration::from_secs(strategy.min_healthy_seconds) {
        return false;
    }
    let failures = status.analysis.iter().filter(|m| !m.passed).count();
    if status.analysis.len() >= analysis.count.max(1) as usize
        || failures > analysis.failure_limit.max(0) as usize
    {
        return false;
    }
    status
        .analysis
        .last()
        .and_then(|m| m.at.as_ref())
        .is_none_or(|at| now >= at.0 + SignedDuration::from_secs(analysis.interval_seconds))
}

/// The revision each cluster is to hold under `status`: the only place that says it.
///
/// A wave with `maxUnavailable` takes the new revision a few clusters at a time (by
/// name): a cluster keeps it once the recorded rollout gave it (`status.clusters`) or its
/// copy runs it, and one more cluster gets it only while the rollout progresses, no
/// cluster of the placement is not Ready, and fewer than `maxUnavailable` of the wave's
/// clusters that have it have not rolled it out yet.
pub fn assignment(
    status: &RolloutStatus,
    strategy: &RolloutStrategy,
    clusters: &[RolloutCluster<'_>],
) -> BTreeMap<String, i64> {
    let wave = status.wave.max(0) as usize;
    let batched = batch(status, strategy, clusters);
    clusters
        .iter()
        .map(|c| {
            let revision = match status.phase {
                RolloutPhase::Completed | RolloutPhase::RolledBack | RolloutPhase::Aborted => {
                    status.stable_revision
                }
                RolloutPhase::Progressing | RolloutPhase::Paused if c.wave < wave => {
                    status.revision
                }
                RolloutPhase::Progressing | RolloutPhase::Paused if c.wave == wave => {
                    match &batched {
                        Some(granted) if !granted.contains(c.name) => status.stable_revision,
                        _ => status.revision,
                    }
                }
                RolloutPhase::Progressing | RolloutPhase::Paused => status.stable_revision,
                RolloutPhase::RollingBack if c.wave >= wave => status.stable_revision,
                RolloutPhase::RollingBack => status.revision,
            };
            (c.name.to_string(), revision)
        })
        .collect()
}

/// The clusters of the current wave that hold (or get now) the new revision when the wave
/// has `maxUnavailable`; None: the whole wave has it.
fn batch<'a>(
    status: &RolloutStatus,
    strategy: &RolloutStrategy,
    clusters: &[RolloutCluster<'a>],
) -> Option<std::collections::BTreeSet<&'a str>> {
    let wave = status.wave.max(0) as usize;
    let in_wave: Vec<&RolloutCluster<'a>> = clusters.iter().filter(|c| c.wave == wave).collect();
    // A value the webhook refuses (it is checked there) updates one cluster at a time.
    let limit = strategy
        .waves
        .get(wave)?
        .max_unavailable(in_wave.len())
        .unwrap_or(Some(1))?;
    let holds = |c: &RolloutCluster<'_>| {
        c.running == Some(status.revision)
            || status
                .clusters
                .iter()
                .any(|r| r.name == c.name && r.revision == status.revision)
    };
    let mut granted: std::collections::BTreeSet<&'a str> = in_wave
        .iter()
        .filter(|c| holds(c))
        .map(|c| c.name)
        .collect();
    let updating = in_wave
        .iter()
        .filter(|c| granted.contains(c.name))
        .filter(|c| !(c.running == Some(status.revision) && c.healthy))
        .count();
    let may_grow = status.phase == RolloutPhase::Progressing && status.waiting_for.is_empty();
    let room = if may_grow {
        limit.saturating_sub(updating)
    } else {
        0
    };
    let mut waiting: Vec<&str> = in_wave
        .iter()
        .map(|c| c.name)
        .filter(|name| !granted.contains(name))
        .collect();
    waiting.sort_unstable();
    granted.extend(waiting.into_iter().take(room));
    Some(granted)
}

/// The binding conditions a rollout owns.
pub const ROLLOUT_CONDITIONS: [&str; 2] = ["Progressing", "RolledBack"];

/// The binding's `Progressing` and `RolledBack` conditions for a rollout status, each
/// with the rollout's message: Progressing is True while waves are updated or rolled back,
/// Unknown while the rollout waits (a pause, a partition), False once it is over;
/// RolledBack is True once every wave is back on the stable revision after a failure or
/// an abort, until the template changes.
pub fn conditions(status: &RolloutStatus, generation: Option<i64>) -> [Condition; 2] {
    use crate::api::{ConditionStatus, new_condition};
    let (progressing, reason) = match status.phase {
        RolloutPhase::Progressing if !status.waiting_for.is_empty() => {
            (ConditionStatus::Unknown, "WaitingForPartition")
        }
        RolloutPhase::Progressing => (ConditionStatus::True, "RolloutProgressing"),
        RolloutPhase::Paused => (ConditionStatus::Unknown, "RolloutPaused"),
        RolloutPhase::RollingBack if !status.waiting_for.is_empty() => {
            (ConditionStatus::Unknown, "WaitingForPartition")
        }
        RolloutPhase::RollingBack => (ConditionStatus::True, "RollingBack"),
        RolloutPhase::Completed => (ConditionStatus::False, "RolloutCompleted"),
        RolloutPhase::RolledBack => (ConditionStatus::False, "RolledBack"),
        RolloutPhase::Aborted => (ConditionStatus::False, "Aborted"),
    };
    let rolled_back = matches!(
        status.phase,
        RolloutPhase::RolledBack | RolloutPhase::Aborted
    );
    let back_reason = if rolled_back {
        status.rollback_reason.as_deref().unwrap_or(ANALYSIS_FAILED)
    } else if status.phase == RolloutPhase::RollingBack {
        "RollingBack"
    } else {
        "NotRolledBack"
    };
    let message = if status.message.is_empty() {
        format!("revision {} ({:?})", status.revision, status.phase)
    } else {
        status.message.clone()
    };
    [
        new_condition(
            "Progressing",
            progressing,
            reason,
            message.clone(),
            generation,
        ),
        new_condition(
            "RolledBack",
            ConditionStatus::from_bool(rolled_back),
            back_reason,
            message,
            generation,
        ),
    ]
}

/// Decides; see the module documentation.
pub fn decide(input: &RolloutInput<'_>) -> RolloutDecision {
    let mut step = Step {
        input,
        status: input.recorded.cloned().unwrap_or_else(|| RolloutStatus {
            revision: input.revision,
            stable_revision: input.revision,
            message: "first revision: every cluster gets it at once".into(),
            ..RolloutStatus::default()
        }),
        events: vec![],
        wake_at: None,
    };
    step.status.waves = input.wave_names.len() as i32;
    step.status.waiting_for = input
        .clusters
        .iter()
        .filter(|c| !c.ready)
        .map(|c| c.name.to_string())
        .collect();
    step.new_revision();
    step.command();
    step.advance();
    let status = step.status;
    let wave = usize::try_from(status.wave).unwrap_or(0);
    let mut status = status;
    status.wave_name = input.wave_names.get(wave).cloned();
    let assign = assignment(&status, input.strategy, input.clusters);
    status.clusters = input
        .clusters
        .iter()
        .map(|c| crate::api::rollout::RolloutClusterStatus {
            name: c.name.to_string(),
            wave: c.wave as i32,
            revision: assign[c.name],
            running: c.running,
        })
        .collect();
    status.clusters.sort_by(|a, b| a.name.cmp(&b.name));
    RolloutDecision {
        assign,
        status,
        events: step.events,
        wake_at: step.wake_at,
    }
}

struct Step<'a, 'b> {
    input: &'b RolloutInput<'a>,
    status: RolloutStatus,
    events: Vec<RolloutEvent>,
    wake_at: Option<Timestamp>,
}

impl Step<'_, '_> {
    fn now(&self) -> Time {
        Time(self.input.now)
    }

    fn event(&mut self, reason: &'static str, message: String, warning: bool) {
        self.events.push(RolloutEvent {
            reason,
            message,
            warning,
        });
    }

    fn wake(&mut self, at: Timestamp) {
        self.wake_at = Some(self.wake_at.map_or(at, |w| w.min(at)));
    }

    fn waves(&self) -> usize {
        self.input.wave_names.len()
    }

    fn wave_name(&self, wave: i32) -> String {
        self.input
            .wave_names
            .get(wave.max(0) as usize)
            .cloned()
            .unwrap_or_else(|| format!("wave-{}", wave + 1))
    }

    /// The template changed: a rollout of its revision begins at wave 0 (a change back to
    /// the stable revision is no rollout: every cluster holds or gets it).
    fn new_revision(&mut self) {
        let revision = self.input.revision;
        if revision == self.status.revision {
            return;
        }
        if !self.status.waiting_for.is_empty() {
            // Starting it would move copies forward (wave 0) and back (the waves a
            // rollout in progress had reached): it waits for the partition.
            self.status.message = format!(
                "revision {revision} waits for the partition: {} not Ready",
                self.status.waiting_for.join(", ")
            );
            return;
        }
        let stable = self.status.stable_revision;
        let command = self.status.observed_command.take();
        self.status = RolloutStatus {
            revision,
            stable_revision: stable,
            observed_command: command,
            ..RolloutStatus::default()
        };
        if revision == stable {
            self.status.message = format!("back to the stable revision {stable}");
            return;
        }
        self.status.phase = RolloutPhase::Progressing;
        self.status.wave_started_at = Some(self.now());
        self.event(
            "RolloutStarted",
            format!(
                "rolling out revision {revision} (stable: {stable}) in {} waves",
                self.waves()
            ),
            false,
        );
    }

    fn command(&mut self) {
        let Some((command, id)) = self.input.command else {
            return;
        };
        if self.status.observed_command.as_deref() == Some(id) {
            return;
        }
        let phase = self.status.phase;
        let partition = !self.status.waiting_for.is_empty();
        let active = matches!(phase, RolloutPhase::Progressing | RolloutPhase::Paused);
        if partition
            && matches!(command, Command::Promote | Command::Abort)
            && (active || phase == RolloutPhase::RollingBack)
        {
            // It moves copies: carried out once every cluster is Ready again (the
            // command stays pending meanwhile).
            return;
        }
        self.status.observed_command = Some(id.to_string());
        match command {
            Command::Pause if phase == RolloutPhase::Progressing => {
                self.status.phase = RolloutPhase::Paused;
                self.status.pause_reason = Some(MANUAL.into());
                self.status.message = "paused by `bulkhead rollout pause`".into();
            }
            Command::Resume
                if phase == RolloutPhase::Paused
                    && matches!(
                        self.status.pause_reason.as_deref(),
                        Some(MANUAL) | Some(ANALYSIS_FAILED)
                    ) =>
            {
                // A wave paused after its analysis failed is judged again from scratch.
                if self.status.pause_reason.as_deref() == Some(ANALYSIS_FAILED) {
                    self.status.analysis.clear();
                    self.status.healthy_since = None;
                }
                self.status.phase = RolloutPhase::Progressing;
                self.status.pause_reason = None;
            }
            Command::Promote if active => {
                let wave = self.status.wave;
                self.event(
                    "RolloutPromoted",
                    format!(
                        "{} promoted by `bulkhead rollout promote`",
                        self.wave_name(wave)
                    ),
                    false,
                );
                self.next_wave();
            }
            Command::Abort if active || phase == RolloutPhase::RollingBack => {
                self.start_rollback(ABORTED, "aborted by `bulkhead rollout abort`".into());
            }
            _ => {
                self.status.message = format!(
                    "`bulkhead rollout {}` does nothing while the rollout is {phase:?}",
                    format!("{command:?}").to_lowercase(),
                );
            }
        }
    }

    fn advance(&mut self) {
        let active = matches!(
            self.status.phase,
            RolloutPhase::Progressing | RolloutPhase::Paused | RolloutPhase::RollingBack
        );
        if !active {
            return;
        }
        // The stateful rules win: nothing moves while a cluster is not Ready.
        if !self.status.waiting_for.is_empty() {
            if self.input.clusters.iter().any(|c| !c.member_ready) {
                self.status.healthy_since = None;
            }
            if self.input.revision == self.status.revision {
                self.status.message = format!(
                    "waiting for the partition: {} not Ready; nothing rolls forward or back until it is",
                    self.status.waiting_for.join(", ")
                );
            }
            return;
        }
        match self.status.phase {
            RolloutPhase::Progressing => self.progress(),
            RolloutPhase::Paused => self.paused(),
            RolloutPhase::RollingBack => self.roll_back(),
            _ => {}
        }
    }

    fn progress(&mut self) {
        let wave = self.status.wave.max(0) as usize;
        let revision = self.status.revision;
        let updated: Vec<&RolloutCluster<'_>> = self
            .input
            .clusters
            .iter()
            .filter(|c| c.wave <= wave)
            .collect();
        let on = updated
            .iter()
            .filter(|c| c.running == Some(revision) && c.healthy)
            .count();
        let name = self.wave_name(self.status.wave);
        if on < updated.len() {
            self.status.healthy_since = None;
            self.status.message = format!(
                "{name}: {on} of {} copies Ready at revision {revision}",
                updated.len()
            );
            return;
        }
        if !self.input.clusters.iter().any(|c| c.wave == wave) {
            // No cluster in this wave: nothing to judge.
            self.next_wave();
            return;
        }
        let since = self
            .status
            .healthy_since
            // Whole seconds, as the binding records it: the same moment on every read.
            .get_or_insert(Time(
                Timestamp::from_second(self.input.now.as_second()).unwrap_or(self.input.now),
            ))
            .0;
        let healthy_until =
            since + SignedDuration::from_secs(self.input.strategy.min_healthy_seconds);
        if self.input.now < healthy_until {
            // No running count in the message: the binding is written when it changes.
            self.status.message = format!(
                "{name}: every copy Ready at revision {revision}; the next step at {healthy_until} ({}s of health)",
                self.input.strategy.min_healthy_seconds
            );
            self.wake(healthy_until);
            return;
        }
        let Some(analysis) = &self.input.strategy.analysis else {
            self.passed();
            return;
        };
        if let Some(measurement) = self.input.measurement.clone() {
            self.status.analysis.push(measurement);
        }
        let taken = self.status.analysis.len();
        let failures = self.status.analysis.iter().filter(|m| !m.passed).count();
        let limit = analysis.failure_limit.max(0) as usize;
        if failures > limit {
            let why = self
                .status
                .analysis
                .iter()
                .rev()
                .find(|m| !m.passed)
                .map(describe_failure)
                .unwrap_or_default();
            let message = format!(
                "{name}: analysis failed ({failures} of {taken} measurements failed, limit {limit}): {why}"
            );
            self.status.failed_revision = Some(revision);
            match self.input.strategy.on_failure {
                RolloutFailureAction::Rollback => {
                    self.event("RolloutFailed", format!("{message}; rolling back"), true);
                    self.start_rollback(ANALYSIS_FAILED, message);
                }
                RolloutFailureAction::Pause => {
                    self.event("RolloutFailed", format!("{message}; paused"), true);
                    self.status.phase = RolloutPhase::Paused;
                    self.status.pause_reason = Some(ANALYSIS_FAILED.into());
                    self.status.message = format!(
                        "{message}; paused (onFailure: Pause): `bulkhead rollout promote`, `resume` (judge again) or `abort`"
                    );
                }
            }
            return;
        }
        if taken >= analysis.count.max(1) as usize {
            self.passed();
            return;
        }
        self.status.message = format!(
            "{name}: analysis {taken} of {} measurements, {failures} failed",
            analysis.count
        );
        let next = self
            .status
            .analysis
            .last()
            .and_then(|m| m.at.as_ref())
            .map_or(self.input.now, |at| {
                at.0 + SignedDuration::from_secs(analysis.interval_seconds)
            });
        self.wake(next);
    }

    /// The current wave passed: its pause, or the next wave.
    fn passed(&mut self) {
        let wave = self.status.wave.max(0) as usize;
        let name = self.wave_name(self.status.wave);
        let last = wave + 1 >= self.waves();
        let pause = self
            .input
            .strategy
            .waves
            .get(wave)
            .and_then(|w| w.pause.as_ref())
            .filter(|_| !last);
        match pause {
            Some(pause) if pause.manual => {
                self.status.phase = RolloutPhase::Paused;
                self.status.pause_reason = Some(MANUAL.into());
                self.status.message =
                    format!("{name} passed; paused until `bulkhead rollout promote`");
            }
            Some(pause) if pause.seconds.is_some_and(|s| s > 0) => {
                let until = self.input.now + SignedDuration::from_secs(pause.seconds.unwrap_or(0));
                self.status.phase = RolloutPhase::Paused;
                self.status.pause_reason = Some(PAUSE.into());
                self.status.paused_until = Some(Time(until));
                self.status.message = format!("{name} passed; paused until {until}");
                self.wake(until);
            }
            _ => self.next_wave(),
        }
    }

    fn paused(&mut self) {
        if self.status.pause_reason.as_deref() != Some(PAUSE) {
            return;
        }
        match self.status.paused_until.as_ref().map(|t| t.0) {
            Some(until) if self.input.now < until => self.wake(until),
            _ => self.next_wave(),
        }
    }

    fn next_wave(&mut self) {
        let next = self.status.wave + 1;
        self.status.phase = RolloutPhase::Progressing;
        self.status.pause_reason = None;
        self.status.paused_until = None;
        self.status.healthy_since = None;
        self.status.analysis.clear();
        if next as usize >= self.waves() {
            let revision = self.status.revision;
            self.status.wave = self.waves() as i32;
            self.status.phase = RolloutPhase::Completed;
            self.status.stable_revision = revision;
            self.status.wave_started_at = None;
            self.status.message = format!("revision {revision} runs in every wave");
            self.event(
                "RolloutCompleted",
                format!("revision {revision} reached every wave"),
                false,
            );
            return;
        }
        self.status.wave = next;
        self.status.wave_started_at = Some(self.now());
        // The next wave's copies are assigned now; judge it at once.
        self.progress();
    }

    fn start_rollback(&mut self, reason: &str, message: String) {
        self.status.phase = RolloutPhase::RollingBack;
        self.status.pause_reason = None;
        self.status.paused_until = None;
        self.status.healthy_since = None;
        self.status.rollback_reason = Some(reason.into());
        self.status.rollback_started_at = Some(self.now());
        self.status.wave_started_at = Some(self.now());
        if reason == ABORTED {
            self.status.failed_revision = Some(self.status.revision);
        }
        self.status.message = format!(
            "{message}; rolling back to revision {}",
            self.status.stable_revision
        );
        self.roll_back();
    }

    fn roll_back(&mut self) {
        let wave = self.status.wave.max(0) as usize;
        let stable = self.status.stable_revision;
        let back: Vec<&RolloutCluster<'_>> = self
            .input
            .clusters
            .iter()
            .filter(|c| c.wave >= wave)
            .collect();
        let on = back
            .iter()
            .filter(|c| c.running == Some(stable) && c.healthy)
            .count();
        if on < back.len() {
            self.status.message = format!(
                "rolling back {}: {on} of {} copies Ready at revision {stable}",
                self.wave_name(self.status.wave),
                back.len()
            );
            return;
        }
        if wave > 0 {
            self.status.wave -= 1;
            self.status.wave_started_at = Some(self.now());
            self.roll_back();
            return;
        }
        let aborted = self.status.rollback_reason.as_deref() == Some(ABORTED);
        let revision = self.status.revision;
        self.status.phase = if aborted {
            RolloutPhase::Aborted
        } else {
            RolloutPhase::RolledBack
        };
        self.status.wave_started_at = None;
        let took = self
            .status
            .rollback_started_at
            .as_ref()
            .map(|t| self.input.now.duration_since(t.0).as_secs_f64())
            .unwrap_or(0.0);
        self.status.message = format!(
            "every wave is back on revision {stable} ({took:.1}s); revision {revision} is not rolled out again until the template changes"
        );
        self.event(
            "RolledBack",
            format!(
                "every wave is back on revision {stable} after revision {revision} {}",
                if aborted { "was aborted" } else { "failed" }
            ),
            true,
        );
    }
}

/// Pause reasons.
const PAUSE: &str = "Pause";
const MANUAL: &str = "Manual";
const ANALYSIS_FAILED: &str = "AnalysisFailed";
/// Rollback reason of `bulkhead rollout abort`.
const ABORTED: &str = "Aborted";

fn describe_failure(measurement: &AnalysisMeasurement) -> String {
    measurement
        .metrics
        .iter()
        .filter(|m| !m.passed)
        .map(|m| match &m.message {
            Some(message) => format!("{} {message}", m.name),
            None => format!("{} {:?}", m.name, m.values),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::rollout::{
        AnalysisMetric, MetricResult, RolloutAnalysis, RolloutWave, WavePause,
    };

    fn strategy(waves: &[&[&str]]) -> RolloutStrategy {
        RolloutStrategy {
            waves: waves
                .iter()
                .map(|clusters| RolloutWave {
                    clusters: clusters.iter().map(|c| c.to_string()).collect(),
                    ..RolloutWave::default()
                })
                .collect(),
            min_healthy_seconds: 10,
            revision_history_limit: 10,
            ..RolloutStrategy::default()
        }
    }

    fn with_analysis(
        mut strategy: RolloutStrategy,
        count: i32,
        failure_limit: i32,
    ) -> RolloutStrategy {
        strategy.analysis = Some(RolloutAnalysis {
            prometheus: "http://prometheus:9090".into(),
            metrics: vec![AnalysisMetric {
                name: "error-rate".into(),
                query: "rate(errors{cluster=~\"{{clusters}}\"}[1m])".into(),
                success_condition: "result < 0.05".into(),
            }],
            interval_seconds: 10,
            count,
            failure_limit,
        });
        strategy
    }

    fn measured(at: Timestamp, value: f64) -> AnalysisMeasurement {
        let passed = value < 0.05;
        AnalysisMeasurement {
            at: Some(Time(at)),
            passed,
            metrics: vec![MetricResult {
                name: "error-rate".into(),
                values: vec![value],
                passed,
                message: None,
            }],
        }
    }

    /// A lab of three clusters whose copies take what they are assigned at once and are
    /// Ready, unless cut off.
    struct World {
        strategy: RolloutStrategy,
        names: Vec<&'static str>,
        running: BTreeMap<String, i64>,
        cut: Vec<&'static str>,
        /// Clusters whose copies the hub has not listed (a restarted hub).
        unlisted: Vec<&'static str>,
        status: Option<RolloutStatus>,
        now: Timestamp,
        /// Every revision each cluster was ever assigned.
        seen: BTreeMap<String, Vec<i64>>,
    }

    impl World {
        fn new(strategy: RolloutStrategy) -> Self {
            Self {
                strategy,
                names: vec!["east", "west", "north"],
                running: BTreeMap::new(),
                cut: vec![],
                unlisted: vec![],
                status: None,
                now: Timestamp::from_second(1_800_000_000).unwrap(),
                seen: BTreeMap::new(),
            }
        }

        fn clusters(&self) -> Vec<RolloutCluster<'static>> {
            self.names
                .iter()
                .map(|name| RolloutCluster {
                    name,
                    wave: wave_of(&self.strategy, name, None, &BTreeMap::new()),
                    ready: !self.cut.contains(name) && !self.unlisted.contains(name),
                    member_ready: !self.cut.contains(name),
                    running: self.running.get(*name).copied(),
                    healthy: self.running.contains_key(*name),
                })
                .collect()
        }

        /// One reconcile: decide, then every reachable copy takes its assignment.
        fn step(
            &mut self,
            revision: i64,
            command: Option<(Command, &str)>,
            measurement: Option<f64>,
        ) -> RolloutDecision {
            let clusters = self.clusters();
            let names = wave_names(&self.strategy, &clusters);
            let measurement = measurement.map(|v| measured(self.now, v));
            let decision = decide(&RolloutInput {
                strategy: &self.strategy,
                revision,
                recorded: self.status.as_ref(),
                clusters: &clusters,
                wave_names: &names,
                now: self.now,
                command,
                measurement,
            });
            for (cluster, revision) in &decision.assign {
                if !self.cut.contains(&cluster.as_str()) {
                    self.running.insert(cluster.clone(), *revision);
                    self.seen
                        .entry(cluster.clone())
                        .or_default()
                        .push(*revision);
                }
            }
            self.status = Some(decision.status.clone());
            decision
        }

        fn wait(&mut self, seconds: i64) {
            self.now += SignedDuration::from_secs(seconds);
        }

        fn phase(&self) -> RolloutPhase {
            self.status.as_ref().unwrap().phase
        }

        fn wave(&self) -> i32 {
            self.status.as_ref().unwrap().wave
        }
    }

    #[test]
    fn a_first_revision_goes_everywhere_and_a_good_one_wave_by_wave() {
        let mut world = World::new(strategy(&[&["east"], &["west"]]));
        let first = world.step(1, None, None);
        assert_eq!(first.status.phase, RolloutPhase::Completed);
        assert!(first.assign.values().all(|r| *r == 1));
        assert_eq!(first.status.waves, 3, "east, west and the rest (north)");

        let started = world.step(2, None, None);
        assert_eq!(started.events[0].reason, "RolloutStarted");
        assert_eq!(started.assign["east"], 2);
        assert_eq!((started.assign["west"], started.assign["north"]), (1, 1));
        // East runs 2 and is Ready: healthy from now, 10 s to go.
        let waiting = world.step(2, None, None);
        assert_eq!(
            waiting.wake_at,
            Some(world.now + SignedDuration::from_secs(10))
        );
        assert_eq!(world.wave(), 0);
        world.wait(10);
        let second = world.step(2, None, None);
        assert_eq!(world.wave(), 1);
        assert_eq!((second.assign["west"], second.assign["north"]), (2, 1));
        world.step(2, None, None);
        world.wait(10);
        world.step(2, None, None);
        assert_eq!(world.wave(), 2);
        assert_eq!(
            world.status.as_ref().unwrap().wave_name.as_deref(),
            Some("rest")
        );
        world.step(2, None, None);
        world.wait(10);
        let done = world.step(2, None, None);
        assert_eq!(done.status.phase, RolloutPhase::Completed);
        assert_eq!(done.status.stable_revision, 2);
        assert!(done.events.iter().any(|e| e.reason == "RolloutCompleted"));
        assert!(done.assign.values().all(|r| *r == 2));
    }

    #[test]
    fn a_failed_analysis_rolls_the_updated_waves_back_last_first() {
        let mut world = World::new(with_analysis(strategy(&[&["east"], &["west"]]), 2, 0));
        world.step(1, None, None);
        world.step(2, None, None);
        world.step(2, None, None);
        world.wait(10);
        // Wave 0's analysis: due now, passes twice.
        assert!(!measurement_due(
            &world.strategy,
            world.status.as_ref().unwrap(),
            world.now - SignedDuration::from_secs(1)
        ));
        assert!(measurement_due(
            &world.strategy,
            world.status.as_ref().unwrap(),
            world.now
        ));
        world.step(2, None, Some(0.01));
        assert_eq!(world.wave(), 0);
        assert!(!measurement_due(
            &world.strategy,
            world.status.as_ref().unwrap(),
            world.now
        ));
        world.wait(10);
        world.step(2, None, Some(0.0));
        assert_eq!(world.wave(), 1, "wave 0 passed");
        assert_eq!(world.running["west"], 2);
        world.step(2, None, None);
        world.wait(10);
        // Wave 1's first measurement fails: limit 0, the wave fails.
        let failed = world.step(2, None, Some(0.5));
        assert_eq!(failed.status.phase, RolloutPhase::RollingBack);
        assert_eq!(failed.status.failed_revision, Some(2));
        let event = failed
            .events
            .iter()
            .find(|e| e.reason == "RolloutFailed")
            .unwrap();
        assert!(
            event.warning && event.message.contains("error-rate [0.5]"),
            "{}",
            event.message
        );
        // West goes back first; east stays on 2 until west is back and Ready.
        assert_eq!((failed.assign["west"], failed.assign["east"]), (1, 2));
        let next = world.step(2, None, None);
        assert_eq!(next.status.wave, 0);
        assert_eq!(next.assign["east"], 1);
        let done = world.step(2, None, None);
        assert_eq!(done.status.phase, RolloutPhase::RolledBack);
        assert!(done.events.iter().any(|e| e.reason == "RolledBack"));
        assert_eq!(
            world.seen["north"],
            vec![1; world.seen["north"].len()],
            "north never ran 2"
        );
        // Nothing more happens until the template changes.
        let still = world.step(2, None, None);
        assert_eq!(still.status.phase, RolloutPhase::RolledBack);
        assert!(still.assign.values().all(|r| *r == 1));
        let again = world.step(3, None, None);
        assert_eq!(again.status.phase, RolloutPhase::Progressing);
        assert_eq!(again.status.failed_revision, None);
        assert_eq!(again.assign["east"], 3);
    }

    #[test]
    fn a_partition_stops_the_rollout_where_it_is_and_the_heal_resumes_it() {
        let mut world = World::new(with_analysis(strategy(&[&["east"], &["west"]]), 1, 0));
        world.step(1, None, None);
        world.step(2, None, None);
        world.cut = vec!["north"];
        world.wait(30);
        let held = world.step(2, None, None);
        assert_eq!(held.status.waiting_for, ["north"]);
        assert_eq!(held.status.wave, 0);
        assert!(
            held.status.message.contains("north not Ready"),
            "{}",
            held.status.message
        );
        assert!(!measurement_due(&world.strategy, &held.status, world.now));
        let promoted = world.step(2, Some((Command::Promote, "c1")), None);
        assert_eq!(promoted.status.wave, 0, "no promotion through a partition");
        assert_eq!(
            promoted.status.observed_command, None,
            "it waits for the heal"
        );
        // A new revision waits too: starting it would move wave 0 forward.
        let newer = world.step(3, None, None);
        assert_eq!((newer.status.revision, newer.assign["east"]), (2, 2));
        assert!(
            newer.status.message.contains("revision 3 waits"),
            "{}",
            newer.status.message
        );
        // Failing in a partition does not roll back either: no measurement is taken.
        world.cut.clear();
        world.step(2, None, None);
        world.wait(10);
        assert!(measurement_due(
            &world.strategy,
            world.status.as_ref().unwrap(),
            world.now
        ));
        world.step(2, None, Some(0.5));
        assert_eq!(world.phase(), RolloutPhase::RollingBack);
        world.cut = vec!["east"];
        let held = world.step(2, None, None);
        assert_eq!(held.status.phase, RolloutPhase::RollingBack);
        assert_eq!(held.status.waiting_for, ["east"]);
        world.cut.clear();
        world.step(2, None, None);
        assert_eq!(world.phase(), RolloutPhase::RolledBack);
    }

    #[test]
    fn conditions_say_progressing_and_rolled_back() {
        let mut world = World::new(with_analysis(strategy(&[&["east"], &["west"]]), 1, 0));
        let kinds =
            |d: &RolloutDecision| conditions(&d.status, Some(3)).map(|c| (c.status, c.reason));
        let first = world.step(1, None, None);
        assert_eq!(
            kinds(&first)[0],
            ("False".into(), "RolloutCompleted".into())
        );
        assert_eq!(kinds(&first)[1], ("False".into(), "NotRolledBack".into()));
        let started = world.step(2, None, None);
        assert_eq!(
            kinds(&started)[0],
            ("True".into(), "RolloutProgressing".into())
        );
        world.cut = vec!["west"];
        let held = world.step(2, None, None);
        assert_eq!(
            kinds(&held)[0],
            ("Unknown".into(), "WaitingForPartition".into())
        );
        world.cut.clear();
        world.step(2, None, None);
        world.wait(10);
        world.step(2, None, Some(0.5));
        let back = world.step(2, None, None);
        assert_eq!(back.status.phase, RolloutPhase::RolledBack);
        let [progressing, rolled_back] = conditions(&back.status, Some(3));
        assert_eq!(
            (progressing.status.as_str(), progressing.reason.as_str()),
            ("False", "RolledBack")
        );
        assert_eq!(
            (rolled_back.status.as_str(), rolled_back.reason.as_str()),
            ("True", "AnalysisFailed")
        );
        assert!(
            rolled_back.message.contains("back on revision 1"),
            "{}",
            rolled_back.message
        );
        assert_eq!(rolled_back.observed_generation, Some(3));
    }

    #[test]
    fn max_unavailable_updates_a_wave_a_few_clusters_at_a_time() {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        let mut batched = strategy(&[&["north", "east", "west"]]);
        batched.waves[0].max_unavailable = Some(IntOrString::Int(1));
        let mut world = World::new(batched);
        world.step(1, None, None);
        // West is slow: cut off, it never rolls out what it is given.
        let started = world.step(2, None, None);
        assert_eq!(
            (
                started.assign["east"],
                started.assign["north"],
                started.assign["west"]
            ),
            (2, 1, 1),
            "one cluster of the wave, the first by name"
        );
        let next = world.step(2, None, None);
        assert_eq!(
            (
                next.assign["east"],
                next.assign["north"],
                next.assign["west"]
            ),
            (2, 2, 1),
            "east rolled out: north is next"
        );
        assert_eq!(
            world.status.as_ref().unwrap().phase,
            RolloutPhase::Progressing
        );
        // North's copy did not roll out yet (its cluster is cut off before it took 2):
        // west waits for it, and nothing moves in the partition.
        world.running.remove("north");
        world.cut = vec!["north"];
        let held = world.step(2, None, None);
        assert_eq!(
            (
                held.assign["east"],
                held.assign["north"],
                held.assign["west"]
            ),
            (2, 2, 1),
            "north keeps what the recorded rollout gave it; west gets nothing"
        );
        world.cut.clear();
        world.step(2, None, None);
        let last = world.step(2, None, None);
        assert_eq!(last.assign["west"], 2, "north rolled out: west is next");
        world.step(2, None, None);
        world.wait(10);
        let done = world.step(2, None, None);
        assert_eq!(done.status.phase, RolloutPhase::Completed);
        assert_eq!(
            world.seen["west"],
            [1, 1, 1, 1, 1, 2, 2, 2],
            "west got revision 2 only after east and north had it"
        );
    }

    /// The lab: a hub restarted in the middle of a wave's health wait found the copies not
    /// listed yet and began the wait again. A cluster whose MemberCluster is Ready but
    /// whose copies are not listed holds the rollout without restarting the wait; a cut
    /// (the MemberCluster not Ready) restarts it.
    #[test]
    fn unlisted_copies_hold_the_rollout_and_keep_its_health_wait() {
        let mut world = World::new(strategy(&[&["east"], &["west"]]));
        world.step(1, None, None);
        world.step(2, None, None);
        let waiting = world.step(2, None, None);
        let since = waiting.status.healthy_since.clone();
        assert!(since.is_some(), "east rolled out: the health wait began");
        world.unlisted = vec!["east", "west", "north"];
        world.wait(3);
        let held = world.step(2, None, None);
        assert_eq!(held.status.waiting_for.len(), 3);
        assert_eq!(held.status.healthy_since, since, "the wait goes on");
        assert_eq!((held.assign["east"], held.assign["west"]), (2, 1));
        world.unlisted.clear();
        world.wait(10);
        let next = world.step(2, None, None);
        assert_eq!(
            next.status.wave, 1,
            "the wait counted from its start: {next:?}"
        );
        world.cut = vec!["north"];
        let cut = world.step(2, None, None);
        assert_eq!(cut.status.healthy_since, None, "a cut restarts the wait");
    }

    #[test]
    fn pauses_commands_and_a_new_revision_in_the_middle() {
        let mut paused = strategy(&[&["east"], &["west"]]);
        paused.waves[0].pause = Some(WavePause {
            seconds: Some(60),
            manual: false,
        });
        paused.waves[1].pause = Some(WavePause {
            seconds: None,
            manual: true,
        });
        let mut world = World::new(paused);
        world.step(1, None, None);
        world.step(2, None, None);
        world.step(2, None, None);
        world.wait(10);
        let pause = world.step(2, None, None);
        assert_eq!(pause.status.phase, RolloutPhase::Paused);
        assert_eq!(
            pause.wake_at,
            Some(world.now + SignedDuration::from_secs(60))
        );
        world.wait(60);
        world.step(2, None, None);
        assert_eq!(world.wave(), 1);
        world.step(2, None, None);
        world.wait(10);
        world.step(2, None, None);
        assert_eq!(
            world.status.as_ref().unwrap().pause_reason.as_deref(),
            Some("Manual")
        );
        world.wait(3600);
        world.step(2, None, None);
        assert_eq!(world.wave(), 1, "a manual pause waits");
        world.step(2, Some((Command::Promote, "p1")), None);
        assert_eq!(world.wave(), 2);
        // The same command id again is not carried out again.
        world.step(2, Some((Command::Promote, "p1")), None);
        assert_eq!(world.wave(), 2);
        assert_eq!(world.running["north"], 2);
        // A new revision before the last wave passed: wave 0 again, later waves back on
        // the stable revision (1: revision 2 never completed).
        let restarted = world.step(3, None, None);
        assert_eq!(restarted.status.wave, 0);
        assert_eq!(restarted.status.stable_revision, 1);
        assert_eq!(
            (
                restarted.assign["east"],
                restarted.assign["west"],
                restarted.assign["north"]
            ),
            (3, 1, 1)
        );
        // Pause, resume, abort.
        world.step(3, Some((Command::Pause, "p2")), None);
        assert_eq!(world.phase(), RolloutPhase::Paused);
        world.wait(100);
        world.step(3, None, None);
        assert_eq!(world.wave(), 0);
        world.step(3, Some((Command::Resume, "p3")), None);
        assert_eq!(world.phase(), RolloutPhase::Progressing);
        let aborted = world.step(3, Some((Command::Abort, "p4")), None);
        assert_eq!(aborted.assign["east"], 1);
        world.step(3, None, None);
        assert_eq!(world.phase(), RolloutPhase::Aborted);
    }

    #[test]
    fn onfailure_pause_stops_and_resume_judges_again() {
        let mut s = with_analysis(strategy(&[&["east"]]), 1, 0);
        s.on_failure = RolloutFailureAction::Pause;
        let mut world = World::new(s);
        world.step(1, None, None);
        world.step(2, None, None);
        world.step(2, None, None);
        world.wait(10);
        let failed = world.step(2, None, Some(0.9));
        assert_eq!(failed.status.phase, RolloutPhase::Paused);
        assert_eq!(failed.assign["east"], 2, "paused where it is");
        world.step(2, Some((Command::Resume, "r")), None);
        world.step(2, None, None);
        world.wait(10);
        world.step(2, None, Some(0.0));
        assert_eq!(world.wave(), 1);
    }

    proptest::proptest! {
        /// Whatever happens (cuts, heals, good and bad measurements, commands, new
        /// revisions), a cluster gets a revision other than the stable one only once its
        /// wave was reached by a rollout of that revision, and a completed rollout holds
        /// one revision everywhere.
        #[test]
        fn later_waves_never_run_a_revision_before_their_turn(
            batched in proptest::bool::ANY,
            events in proptest::collection::vec((0u8..8, 0u8..3, proptest::bool::ANY), 1..80)
        ) {
            // Either one cluster per wave, or east and west in one wave one at a time.
            let mut strategy = if batched {
                strategy(&[&["east", "west"]])
            } else {
                strategy(&[&["east"], &["west"]])
            };
            if batched {
                strategy.waves[0].max_unavailable =
                    Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1));
            }
            let mut world = World::new(with_analysis(strategy, 2, 0));
            world.step(1, None, None);
            let mut revision = 1;
            let mut reached: BTreeMap<i64, usize> = BTreeMap::new();
            for (i, (what, which, good)) in events.into_iter().enumerate() {
                let id = format!("c{i}");
                let name = world.names[which as usize];
                let mut command = None;
                let mut measurement = None;
                match what {
                    0 => revision += 1,
                    1 => world.cut = vec![name],
                    2 => world.cut.clear(),
                    3 => command = Some((Command::Promote, id.as_str())),
                    4 => command = Some((Command::Abort, id.as_str())),
                    _ => world.wait(10),
                }
                let due = world.status.as_ref().is_some_and(|s| measurement_due(&world.strategy, s, world.now));
                if due {
                    measurement = Some(if good { 0.0 } else { 1.0 });
                }
                let before = world.status.clone().unwrap();
                let running_before = world.running.clone();
                let decision = world.step(revision, command, measurement);
                let status = &decision.status;
                if matches!(status.phase, RolloutPhase::Progressing | RolloutPhase::Paused) {
                    let wave = reached.entry(status.revision).or_default();
                    *wave = (*wave).max(status.wave as usize);
                }
                for c in world.clusters() {
                    let assigned = decision.assign[c.name];
                    if assigned != status.stable_revision {
                        let reached = reached.get(&assigned).copied().unwrap_or(0);
                        proptest::prop_assert!(c.wave <= reached, "{} got {} in wave {} (reached {})", c.name, assigned, c.wave, reached);
                    }
                }
                if batched && status.phase == RolloutPhase::Progressing && status.wave == 0 {
                    // One cluster of the batched wave at a time while it is the current
                    // one (a promotion hands the rest of it the revision with the next
                    // wave): a cluster is newly given the revision only when no other
                    // holds it without having rolled it out.
                    let given: Vec<&String> = decision
                        .assign
                        .iter()
                        .filter(|(c, r)| {
                            **r == status.revision
                                && running_before.get(*c) != Some(r)
                                && !before.clusters.iter().any(|row| &row.name == *c && row.revision == **r)
                        })
                        .map(|(c, _)| c)
                        .collect();
                    proptest::prop_assert!(given.len() <= 1, "given at once: {:?}", given);
                }
                if status.phase == RolloutPhase::Completed {
                    proptest::prop_assert_eq!(status.revision, status.stable_revision);
                }
                if !world.cut.is_empty() {
                    // In a partition every cluster keeps what the recorded rollout gave it.
                    for row in &before.clusters {
                        proptest::prop_assert_eq!(decision.assign[&row.name], row.revision, "{} moved in a partition", row.name);
                    }
                }
            }
        }
    }
}
