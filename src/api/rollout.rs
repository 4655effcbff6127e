//! Progressive rollouts (DESIGN.md section 4, "Rollouts"): the policy's `spec.rollout`
//! ([`RolloutStrategy`]) and the binding's `status.rollout` ([`RolloutStatus`]), shared by
//! the hub, the webhook and the CLI. The hub's rules are in
//! `hub::federation::rollout`; the success condition's grammar is here, so that the
//! webhook refuses what the hub could not evaluate.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a change of a template goes out: wave by wave, each wave gated by its copies'
/// readiness, `minHealthySeconds` and an optional Prometheus analysis. Without it a
/// change goes to every cluster at once.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStrategy {
    /// Ordered waves. A cluster of the placement goes in the first wave that names it (by
    /// cluster name, zone or label); the clusters no wave names form one more wave after
    /// the last.
    #[schemars(length(min = 1, max = 20))]
    pub waves: Vec<RolloutWave>,

    /// Seconds every copy of a wave must stay Ready at the new revision before the wave's
    /// analysis starts (or, without analysis, before it counts as passed).
    #[serde(default)]
    #[schemars(range(min = 0, max = 86400))]
    pub min_healthy_seconds: i64,

    /// Prometheus queries judged in every wave after `minHealthySeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<RolloutAnalysis>,

    /// What a failed analysis does: Rollback (default) puts every updated wave back on
    /// the last good revision, the last wave first; Pause stops where it is until
    /// `bulkhead rollout promote` or `abort`.
    #[serde(default)]
    pub on_failure: RolloutFailureAction,

    /// An optional URL the hub POSTs a JSON alert to when a rollout fails (besides the
    /// `RolloutFailed` Event on the template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert_webhook: Option<String>,

    /// Revisions of each template the hub keeps (ControllerRevisions in the template's
    /// namespace); the running and the last good one are always kept.
    #[serde(default = "default_history")]
    #[schemars(range(min = 2, max = 100))]
    pub revision_history_limit: i32,
}

fn default_history() -> i32 {
    10
}

/// One wave: the clusters it takes, and what happens after it passed.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RolloutWave {
    /// A name for status and events (default `wave-<n>`, from 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,

    /// Member clusters by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,

    /// Member clusters by zone (`spec.zone` of the MemberCluster).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,

    /// Member clusters by label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,

    /// How many of the wave's clusters are updated at once: a number (at least 1) or a
    /// percentage of the wave's clusters (`50%`, rounded down, at least 1). The next
    /// cluster of the wave (by name) gets the new revision when one updated before has
    /// rolled out. Default: the whole wave at once. Within a cluster the copy's own
    /// rolling update decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,

    /// After the wave passed: wait this long, or until `bulkhead rollout promote`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<WavePause>,
}

impl RolloutWave {
    /// How many of the wave's `clusters` may be updating at once (None: all of them), or
    /// why `maxUnavailable` says nothing usable.
    pub fn max_unavailable(&self, clusters: usize) -> Result<Option<usize>, String> {
        let Some(value) = &self.max_unavailable else {
            return Ok(None);
        };
        match value {
            IntOrString::Int(n) if *n >= 1 => Ok(Some(*n as usize)),
            IntOrString::Int(n) => Err(format!("{n} is below 1: the wave could never start")),
            IntOrString::String(text) => {
                let percent = text
                    .strip_suffix('%')
                    .and_then(|p| p.trim().parse::<u32>().ok())
                    .filter(|p| (1..=100).contains(p))
                    .ok_or_else(|| {
                        format!("`{text}` is neither a number nor a percentage from 1% to 100%")
                    })?;
                Ok(Some((clusters * percent as usize / 100).max(1)))
            }
        }
    }
}

/// A pause after a wave passed.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct WavePause {
    /// Seconds to wait before the next wave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 604800))]
    pub seconds: Option<i64>,

    /// Wait for `bulkhead rollout promote`.
    #[serde(default)]
    pub manual: bool,
}

/// What a failed analysis does.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RolloutFailureAction {
    #[default]
    Rollback,
    Pause,
}

/// Prometheus queries and how they are judged. A measurement evaluates every metric
/// once; it passes when every metric's condition holds. Measurements are taken every
/// `intervalSeconds`, the first as soon as the wave has been healthy for
/// `minHealthySeconds`; the wave fails at its `failureLimit + 1`th failed measurement and
/// passes after `count` measurements with no more failures than that.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RolloutAnalysis {
    /// The Prometheus server's base URL, e.g. `http://prometheus.monitoring:9090`, or
    /// `https://...` verified against the hub's CA certificates (the system's, or the
    /// bundle its `SSL_CERT_FILE` names).
    #[schemars(length(min = 1))]
    pub prometheus: String,

    /// The queries. `{{clusters}}` in a query becomes a regular expression matching the
    /// wave's clusters (`east|west`) and `{{revision}}` the revision being rolled out.
    #[schemars(length(min = 1, max = 10))]
    pub metrics: Vec<AnalysisMetric>,

    /// Seconds between measurements.
    #[serde(default = "default_interval")]
    #[schemars(range(min = 1, max = 3600))]
    pub interval_seconds: i64,

    /// Measurements per wave.
    #[serde(default = "default_count")]
    #[schemars(range(min = 1, max = 100))]
    pub count: i32,

    /// Failed measurements a wave may have; one more fails it.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub failure_limit: i32,
}

fn default_interval() -> i64 {
    30
}

fn default_count() -> i32 {
    3
}

/// One query and its condition.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisMetric {
    /// A name for status (`p99-latency`, `error-rate`).
    #[schemars(length(min = 1))]
    pub name: String,

    /// A PromQL instant query. Every sample it returns must meet the condition; a query
    /// that returns no sample fails the measurement (no data is not good news).
    #[schemars(length(min = 1))]
    pub query: String,

    /// `result <op> <number>` with `<op>` one of `<`, `<=`, `>`, `>=`, `==`, `!=`, e.g.
    /// `result < 0.05`.
    #[schemars(length(min = 1))]
    pub success_condition: String,
}

/// A parsed success condition.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SuccessCondition {
    pub op: Comparison,
    pub threshold: f64,
}

/// The comparisons a success condition may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Comparison {
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
    Equal,
    NotEqual,
}

impl SuccessCondition {
    /// Parses `result <op> <number>`; the error says what was expected.
    pub fn parse(text: &str) -> Result<Self, String> {
        let expected = "expected `result <op> <number>` with <op> one of <, <=, >, >=, ==, != (e.g. `result < 0.05`)";
        let rest = text
            .trim()
            .strip_prefix("result")
            .ok_or_else(|| format!("`{text}`: {expected}"))?
            .trim_start();
        let (op, number) = [
            ("<=", Comparison::LessOrEqual),
            (">=", Comparison::GreaterOrEqual),
            ("==", Comparison::Equal),
            ("!=", Comparison::NotEqual),
            ("<", Comparison::Less),
            (">", Comparison::Greater),
        ]
        .into_iter()
        .find_map(|(token, op)| rest.strip_prefix(token).map(|n| (op, n)))
        .ok_or_else(|| format!("`{text}`: {expected}"))?;
        let threshold: f64 = number
            .trim()
            .parse()
            .map_err(|_| format!("`{text}`: `{}` is not a number; {expected}", number.trim()))?;
        if !threshold.is_finite() {
            return Err(format!("`{text}`: the threshold must be a finite number"));
        }
        Ok(Self { op, threshold })
    }

    /// Whether a sample meets the condition (NaN never does).
    pub fn holds(&self, value: f64) -> bool {
        if value.is_nan() {
            return false;
        }
        match self.op {
            Comparison::Less => value < self.threshold,
            Comparison::LessOrEqual => value <= self.threshold,
            Comparison::Greater => value > self.threshold,
            Comparison::GreaterOrEqual => value >= self.threshold,
            Comparison::Equal => value == self.threshold,
            Comparison::NotEqual => value != self.threshold,
        }
    }
}

/// Where a rollout stands.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RolloutPhase {
    /// Every cluster runs the stable revision, which is the template's.
    #[default]
    Completed,
    /// A wave is being updated, or waits for health or its analysis.
    Progressing,
    /// Waits: for a pause after a passed wave, `bulkhead rollout pause`, or a failed
    /// analysis with `onFailure: Pause` (`pauseReason`).
    Paused,
    /// Updated waves go back to the stable revision, the last one first.
    RollingBack,
    /// Every wave is back on the stable revision after a failure; the template's
    /// revision stays marked failed until the template changes.
    RolledBack,
    /// As RolledBack, after `bulkhead rollout abort`.
    Aborted,
}

/// One measurement of a wave's analysis.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisMeasurement {
    /// When it was taken.
    pub at: Option<Time>,
    /// Every metric passed.
    pub passed: bool,
    /// Each metric's samples and verdict.
    pub metrics: Vec<MetricResult>,
}

/// One metric of a measurement.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MetricResult {
    /// The metric's name in the policy.
    pub name: String,
    /// The samples' values (empty: no data, or the query failed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<f64>,
    /// Every sample met the condition (and there was one).
    pub passed: bool,
    /// Why it failed (no data, the query's error, the condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A template's rollout, on its ResourceBinding.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The template's revision, being rolled out (or rolled out).
    pub revision: i64,
    /// The last revision that reached every wave.
    pub stable_revision: i64,
    pub phase: RolloutPhase,
    /// The wave being updated, judged or rolled back (0-based); the number of waves
    /// when the rollout is over.
    pub wave: i32,
    /// Waves of this rollout, the implicit last one included.
    pub waves: i32,
    /// The current wave's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave_name: Option<String>,
    /// When the current wave began (or its rollback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave_started_at: Option<Time>,
    /// Since when every copy of the updated waves has been Ready at the new revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_since: Option<Time>,
    /// Paused after a passed wave: until when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_until: Option<Time>,
    /// Why the rollout is paused: `Pause` (after a passed wave), `Manual` (`bulkhead
    /// rollout pause`, or a wave's manual pause) or `AnalysisFailed` (`onFailure: Pause`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_reason: Option<String>,
    /// Clusters of the placement that are not Ready: nothing rolls forward or back until
    /// every one is (the stateful rules win).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<String>,
    /// The current wave's analysis measurements.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub analysis: Vec<AnalysisMeasurement>,
    /// A revision that failed its analysis (or was aborted): it is not rolled out again
    /// until the template changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_revision: Option<i64>,
    /// Why the updated waves go (or went) back: `AnalysisFailed` or `Aborted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_reason: Option<String>,
    /// When the last rollback began (the time to roll back is measured from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_started_at: Option<Time>,
    /// The last `bulkhead rollout` command the hub carried out (its id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_command: Option<String>,
    /// What the rollout does now, in words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Each cluster of the placement: its wave, the revision its copy is to hold and the
    /// one it holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub clusters: Vec<RolloutClusterStatus>,
}

/// One cluster of a rollout.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RolloutClusterStatus {
    /// MemberCluster name.
    pub name: String,
    /// Its wave (0-based).
    pub wave: i32,
    /// The revision its copy is to hold.
    pub revision: i64,
    /// The revision its copy holds, as the hub last saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<i64>,
}

/// Annotation on a template that carries a `bulkhead rollout` command: `<verb> <id>`,
/// verb one of promote, pause, resume, abort. The hub carries out each id once and
/// records it in its binding's `status.rollout.observedCommand`; the annotation is not
/// part of the template's revision and is not copied to the members.
pub const ANNOTATION_ROLLOUT_COMMAND: &str = "federation.example.com/rollout-command";
/// Annotation on every member copy of a template with a rollout: the revision it holds.
pub const ANNOTATION_REVISION: &str = "federation.example.com/revision";
/// Label on the hub's ControllerRevisions of a template: the binding label value.
pub const LABEL_REVISION_OF: &str = "federation.example.com/revision-of";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_unavailable_is_a_count_or_a_share_of_the_wave() {
        let wave = |value| RolloutWave {
            max_unavailable: value,
            ..RolloutWave::default()
        };
        assert_eq!(wave(None).max_unavailable(4), Ok(None));
        assert_eq!(
            wave(Some(IntOrString::Int(2))).max_unavailable(4),
            Ok(Some(2))
        );
        let share = |text: &str| wave(Some(IntOrString::String(text.into())));
        assert_eq!(share("50%").max_unavailable(5), Ok(Some(2)));
        assert_eq!(share("10%").max_unavailable(3), Ok(Some(1)), "at least one");
        assert_eq!(share("100%").max_unavailable(3), Ok(Some(3)));
        for bad in ["0%", "150%", "half", "2"] {
            assert!(share(bad).max_unavailable(3).unwrap_err().contains(bad));
        }
        assert!(wave(Some(IntOrString::Int(0))).max_unavailable(3).is_err());
    }

    #[test]
    fn success_conditions_parse_and_judge() {
        let c = SuccessCondition::parse("result < 0.05").unwrap();
        assert!(c.holds(0.01) && !c.holds(0.05) && !c.holds(f64::NAN));
        let c = SuccessCondition::parse("  result>=0.99 ").unwrap();
        assert_eq!(c.op, Comparison::GreaterOrEqual);
        assert!(c.holds(0.99) && !c.holds(0.5));
        assert_eq!(
            SuccessCondition::parse("result != 0").unwrap().op,
            Comparison::NotEqual
        );
        for bad in [
            "x < 1",
            "result ~ 1",
            "result < fast",
            "result < inf",
            "result <",
        ] {
            let error = SuccessCondition::parse(bad).unwrap_err();
            assert!(error.contains(bad.trim()), "{error}");
        }
    }
}
