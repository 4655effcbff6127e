//! `make chaos`: a nemesis throws a seeded, reproducible schedule of faults at a
//! federation on the lab while users create, edit, scale and delete templates, then a
//! checker reads the members' audit logs and fails the run on any request of the hub that
//! the safety rules did not allow, and on any template that has not converged after the
//! last fault healed. See `docs/chaos.md`.
//!
//! - [`schedule`]: the plan, drawn from the seed (pure);
//! - [`nemesis`]: runs it against the lab (faults concurrently, operations in order);
//! - [`timeline`]: what happened when, printed and written to a file;
//! - [`audit`] and [`rules`]: the safety check of the hub's requests (pure);
//! - [`converge`]: the convergence check;
//! - [`run`]: all of it, with the report.

pub mod audit;
pub mod converge;
pub mod database;
pub mod nemesis;
pub mod random;
pub mod rules;
pub mod schedule;
pub mod templates;
pub mod timeline;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::federation::Federation;
use crate::lab::{HUB_USER_IN_MEMBERS, Lab};
use nemesis::{HubReplicas, Nemesis};
use rules::{FaultWindows, RuleSettings, TemplateRef, Verdict};
use schedule::{MEMBERS, Schedule, TemplateKind};
use timeline::{Event, Timeline};

/// The hub's fencing lease renew interval in the chaos federation (the suites' 1 s, see
/// [`crate::federation::LEASE_RENEW`]).
pub const LEASE_RENEW_INTERVAL: Duration = Duration::from_secs(1);

/// What a run is told by its environment.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// `CHAOS_SECONDS` (default 180): how long faults and operations go on.
    pub seconds: u64,
    /// `CHAOS_SEED` (default: random, printed).
    pub seed: u64,
    /// `CHAOS_GRACE_SECONDS` (default: the lease renew interval + 1 s): how long a member
    /// may be under a fault before the hub must treat it as suspect.
    pub grace: Duration,
    /// `CHAOS_CONVERGE_SECONDS` (default 60): how long after the last fault healed (and the
    /// last operation was sent) every template must have converged.
    pub converge: Duration,
    /// `CHAOS_OUT_DIR` (default `/tmp/bulkhead-chaos/<seed>`): the timeline, the schedule,
    /// the report, copies of the audit logs and the hub and agent logs.
    pub out_dir: PathBuf,
}

impl Settings {
    /// The settings from the environment (see each field).
    pub fn from_env() -> Result<Self> {
        fn variable(name: &str) -> Option<String> {
            std::env::var(name).ok().filter(|v| !v.trim().is_empty())
        }
        fn number<T: std::str::FromStr>(name: &str) -> Result<Option<T>> {
            variable(name)
                .map(|v| {
                    v.trim()
                        .parse::<T>()
                        .map_err(|_| anyhow::anyhow!("{name}={v:?} is not a number"))
                })
                .transpose()
        }
        let seed = number::<u64>("CHAOS_SEED")?.unwrap_or_else(random_seed);
        let grace = match number::<f64>("CHAOS_GRACE_SECONDS")? {
            Some(seconds) if seconds >= 0.0 => Duration::from_secs_f64(seconds),
            Some(_) => bail!("CHAOS_GRACE_SECONDS must not be negative"),
            None => LEASE_RENEW_INTERVAL + Duration::from_secs(1),
        };
        Ok(Settings {
            seconds: number("CHAOS_SECONDS")?.unwrap_or(180),
            seed,
            grace,
            converge: Duration::from_secs(number("CHAOS_CONVERGE_SECONDS")?.unwrap_or(60)),
            out_dir: variable("CHAOS_OUT_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(format!("/tmp/bulkhead-chaos/{seed}"))),
        })
    }
}

/// A seed nobody chose: the clock's nanoseconds mixed with the process id.
fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    random::SeededRandom::new(nanos ^ (u64::from(std::process::id()) << 32)).next_u64()
        % 1_000_000_000
}

/// How a run ended.
#[derive(Debug)]
pub struct Outcome {
    pub verdict: Verdict,
    /// Problems left when the convergence window closed (empty: converged).
    pub not_converged: Vec<String>,
    /// The database's violations: acknowledged writes lost, writes taken beside another
    /// primary, not writable after the last heal (empty: none).
    pub database: Vec<String>,
    /// The report, as printed.
    pub report: String,
}

impl Outcome {
    /// Whether the run passed: no violation and everything converged.
    pub fn passed(&self) -> bool {
        self.verdict.violations.is_empty()
            && self.not_converged.is_empty()
            && self.database.is_empty()
    }
}

/// The hub flags of the run: leader election (the defaults' timing: 6 s lease, 4 s renew
/// deadline, 1 s retry period), and a resync every 15 s, so that drift made in a member is
/// repaired well within the convergence window (the default, 10 minutes, is far longer).
fn election_arguments() -> Vec<&'static str> {
    vec![
        "--leader-elect",
        "--leader-elect-namespace",
        bulkhead::api::SYSTEM_NAMESPACE,
        "--leader-elect-lease-name",
        "chaos-hub-leader",
        "--resync-interval",
        "15s",
    ]
}

/// Runs the whole thing; see the module documentation. An `Err` is a harness or lab
/// failure (the lab did not start, the initial templates never converged), not a verdict.
pub async fn run(settings: &Settings) -> Result<Outcome> {
    let schedule = Schedule::generate(settings.seed, Duration::from_secs(settings.seconds));
    std::fs::create_dir_all(&settings.out_dir)
        .with_context(|| format!("creating {}", settings.out_dir.display()))?;
    std::fs::write(settings.out_dir.join("schedule.txt"), schedule.to_string())?;
    let timeline = Timeline::new(Some(&settings.out_dir.join("timeline.log")))?;
    println!(
        "chaos: seed {} (CHAOS_SEED={} reproduces the schedule), {} s, {} faults, {} operations; output in {}",
        settings.seed,
        settings.seed,
        settings.seconds,
        schedule.faults.len(),
        schedule.operations.len(),
        settings.out_dir.display()
    );

    let shards = templates::shard_federate_argument();
    let join_extra = [
        "--federate",
        "persistentvolumeclaims",
        "--federate",
        "serviceaccounts",
        "--federate",
        shards.as_str(),
    ];
    timeline
        .note("starting the federation: members joined, one agent per member, two hub replicas");
    let mut federation = Federation::start_joined(
        "chaos",
        &election_arguments(),
        &["1", "1"],
        None,
        &join_extra,
    )
    .await?;
    let first = federation
        .hub_identity()
        .context("the federation's hub has no identity")?
        .to_string();
    let second = format!("{first}-b");
    let first_log = federation.hub_log();
    let replicas = vec![
        (first.clone(), federation.hub_arguments(&first)),
        (second.clone(), federation.hub_arguments(&second)),
    ];
    let running_hub = federation.take_hub();
    let hubs = HubReplicas::start(&federation.lab, replicas, running_hub)?;
    timeline.record(Event::HubStarted { identity: second });

    // A person's edits of member copies go through in-zone clients of their own user,
    // which the members audit (the checker tells them from the hub's writes).
    let mut editors = std::collections::BTreeMap::new();
    for name in federation.members.keys() {
        editors.insert(name.clone(), federation.lab.editor_client(name).await?);
    }
    let nemesis = Nemesis::new(
        &federation.lab,
        federation.hub.clone(),
        &editors,
        &federation.namespace,
        &timeline,
        hubs,
        settings.out_dir.clone(),
    );
    let outcome = drive(settings, &schedule, &nemesis, &federation, &timeline).await;
    let mut hubs = nemesis.hubs.into_inner();
    let mut logs = hubs.logs();
    logs.push(first_log);
    hubs.stop_all();
    keep_logs(
        &federation.lab,
        &federation.namespace,
        &logs,
        &settings.out_dir,
    );
    drop(federation);
    let outcome = outcome?;
    std::fs::write(settings.out_dir.join("report.txt"), &outcome.report)?;
    Ok(outcome)
}

/// Everything between the federation's start and its end.
async fn drive(
    settings: &Settings,
    schedule: &Schedule,
    nemesis: &Nemesis<'_>,
    federation: &Federation,
    timeline: &Timeline,
) -> Result<Outcome> {
    for kind in [
        TemplateKind::Database,
        TemplateKind::StatefulSet,
        TemplateKind::Deployment,
    ] {
        nemesis.apply_policy(kind).await?;
    }
    timeline.note("creating the initial templates");
    for operation in &schedule.initial {
        nemesis.operate(operation).await;
    }
    let initial = wait_converged(federation, Instant::now() + Duration::from_secs(240)).await?;
    if !initial.is_empty() {
        bail!(
            "the initial templates did not converge within 240 s without any fault (a lab or hub problem, not a verdict):\n  {}",
            initial.join("\n  ")
        );
    }
    timeline.note("initial templates converged; starting the database and its client");
    let database = database::DatabaseRun::start(
        &federation.lab,
        crate::federation::LEASE_DURATION_SECONDS,
        timeline,
    )
    .await?;
    timeline.note("the nemesis starts");

    let start = timeline.start_clock();
    let database_until = Instant::now() + Duration::from_secs(settings.seconds);
    let running = AtomicBool::new(true);
    let work = async {
        let faults = futures::future::join_all(
            schedule
                .faults
                .iter()
                .enumerate()
                .map(|(index, planned)| nemesis.run_fault(index + 1, *planned, start)),
        );
        let results = tokio::join!(faults, nemesis.run_operations(&schedule.operations, start)).0;
        running.store(false, Ordering::SeqCst);
        results
    };
    let (fault_results, (), database_faults) = tokio::join!(
        work,
        nemesis.watch_leader(&running),
        database.nemesis(settings.seed, database_until, timeline)
    );
    let operations_done = jiff::Timestamp::now();
    federation.lab.heal_all()?;
    nemesis.heal_everything()?;
    for done in nemesis.hubs.lock().await.ensure_running()? {
        timeline.note(format!("after the run: {done}"));
    }
    let broken: Vec<String> = fault_results
        .iter()
        .filter_map(|r| r.as_ref().err().map(|e| format!("{e:#}")))
        .collect();
    if !broken.is_empty() {
        bail!(
            "faults could not be thrown or undone: {}",
            broken.join("; ")
        );
    }

    // Convergence, counted from the last heal (or the last operation, if later).
    let entries = timeline.entries();
    let last_heal = entries
        .iter()
        .filter(|e| matches!(e.event, Event::FaultEnded { .. }))
        .map(|e| e.at)
        .max()
        .unwrap_or(operations_done);
    let from = last_heal.max(operations_done);
    timeline.note(format!(
        "last fault healed at {last_heal:.3}; every template must converge within {} s of {from:.3}",
        settings.converge.as_secs()
    ));
    let window_left = settings
        .converge
        .saturating_sub(jiff::Timestamp::now().duration_since(from).unsigned_abs());
    let not_converged = wait_converged(federation, Instant::now() + window_left).await?;
    if !not_converged.is_empty() {
        let hub = federation.lab.client("hub").await?;
        let state = converge::describe_state(
            &federation.lab,
            &hub,
            &federation.members,
            &federation.namespace,
        )
        .await;
        std::fs::write(settings.out_dir.join("final-state.txt"), state)?;
    }
    let database_verdict = database
        .finish(settings.converge, database_faults, timeline)
        .await;
    timeline.note(if not_converged.is_empty() {
        format!(
            "converged {:.1} s after {from:.3}",
            jiff::Timestamp::now().duration_since(from).as_secs_f64()
        )
    } else {
        format!(
            "NOT converged {} s after {from:.3}",
            settings.converge.as_secs()
        )
    });

    // The audit check.
    let entries = timeline.entries();
    let mut user_deletions: BTreeMap<TemplateRef, jiff::Timestamp> = BTreeMap::new();
    for entry in &entries {
        if let Event::TemplateDeleted { kind, name } = &entry.event {
            user_deletions
                .entry(TemplateRef {
                    kind: *kind,
                    name: name.clone(),
                })
                .or_insert(entry.at);
        }
    }
    let mut records = vec![];
    let mut unreadable = 0;
    for member in MEMBERS {
        let dir = federation.lab.log_dir(member);
        let copies = settings.out_dir.join("audit").join(member);
        std::fs::create_dir_all(&copies)?;
        for file in audit::audit_files(&dir)? {
            if let Some(name) = file.file_name() {
                std::fs::copy(&file, copies.join(name))?;
            }
        }
        let (member_records, member_unreadable) = audit::read_cluster(member, &copies)?;
        records.extend(member_records);
        unreadable += member_unreadable;
    }
    // The hub's fencing-lease renewals each member answered: an API server restart is
    // over, for the rule, at the first one after it went down.
    let mut renewals: BTreeMap<String, Vec<jiff::Timestamp>> = BTreeMap::new();
    for record in &records {
        let event = &record.event;
        if event.acting_user() == HUB_USER_IN_MEMBERS
            && event.succeeded()
            && event
                .object_ref
                .as_ref()
                .is_some_and(|o| o.resource == "leases")
        {
            renewals
                .entry(record.cluster.clone())
                .or_default()
                .push(event.request_received_timestamp);
        }
    }
    for times in renewals.values_mut() {
        times.sort();
    }
    let faults = FaultWindows::from_timeline_and_renewals(&entries, &renewals);
    let rule_settings = RuleSettings {
        hub_user: HUB_USER_IN_MEMBERS.to_string(),
        editor_user: crate::lab::MEMBER_EDITOR_USER.to_string(),
        namespace: federation.namespace.clone(),
        grace: settings.grace,
    };
    let verdict = rules::check(&records, &faults, &user_deletions, &rule_settings);
    let report = report(
        settings,
        schedule,
        &entries,
        &faults,
        &verdict,
        &not_converged,
        &database_verdict.problems(),
        records.len(),
        unreadable,
    );
    let mut report = report;
    for problem in database_verdict.problems() {
        let _ = writeln!(report, "VIOLATION {problem}");
    }
    let _ = writeln!(report, "{}", database_verdict.summary());
    println!("{report}");
    Ok(Outcome {
        verdict,
        not_converged,
        database: database_verdict.problems(),
        report,
    })
}

/// Polls the convergence check every 2 s until it holds or `deadline` passes; returns the
/// problems left (empty: converged).
async fn wait_converged(federation: &Federation, deadline: Instant) -> Result<Vec<String>> {
    let hub = federation.lab.client("hub").await?;
    loop {
        let problems =
            match converge::read_snapshot(&hub, &federation.members, &federation.namespace).await {
                Ok(snapshot) => converge::problems(&snapshot),
                Err(error) => vec![format!("could not read the clusters: {error:#}")],
            };
        if problems.is_empty() || Instant::now() >= deadline {
            return Ok(problems);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The report: the summary, and on failure the seed, the fault timeline, the faulted
/// clusters' windows and every offending audit entry.
#[allow(clippy::too_many_arguments)]
fn report(
    settings: &Settings,
    schedule: &Schedule,
    entries: &[timeline::Entry],
    faults: &FaultWindows,
    verdict: &Verdict,
    not_converged: &[String],
    database: &[String],
    audit_lines: usize,
    unreadable: usize,
) -> String {
    let mut out = String::new();
    let passed = verdict.violations.is_empty() && not_converged.is_empty() && database.is_empty();
    let _ = writeln!(
        out,
        "\n=== chaos: {} (seed {}, {} s, {} faults, {} operations)",
        if passed { "PASSED" } else { "FAILED" },
        settings.seed,
        settings.seconds,
        schedule.faults.len(),
        schedule.operations.len()
    );
    let failed_operations = entries
        .iter()
        .filter(|e| matches!(&e.event, Event::Operation { outcome, .. } if outcome.starts_with("FAILED")))
        .count();
    let _ = writeln!(
        out,
        "operations: {} sent, {failed_operations} failed (a member down refuses them; not a verdict)",
        schedule.operations.len()
    );
    let _ = writeln!(
        out,
        "safety: {audit_lines} audit lines of the members ({unreadable} unreadable); the hub sent {} DELETEs of stateful copies and claims, {} replica decreases, {} other writes to them; {} violations (grace {:.1} s)",
        verdict.deletes,
        verdict.shrinks,
        verdict.writes,
        verdict.violations.len(),
        settings.grace.as_secs_f64()
    );
    if not_converged.is_empty() {
        let _ = writeln!(out, "convergence: every template converged");
    } else {
        let _ = writeln!(
            out,
            "convergence: NOT converged {} s after the last fault healed:",
            settings.converge.as_secs()
        );
        for problem in not_converged {
            let _ = writeln!(out, "  {problem}");
        }
        let _ = writeln!(
            out,
            "  (the clusters as they were then: {})",
            settings.out_dir.join("final-state.txt").display()
        );
    }
    if passed {
        return out;
    }
    let _ = writeln!(
        out,
        "\nreproduce the schedule: CHAOS_SEED={} CHAOS_SECONDS={} make chaos",
        settings.seed, settings.seconds
    );
    let _ = writeln!(out, "\nfault timeline:");
    for entry in entries.iter().filter(|e| e.event.is_fault()) {
        let _ = writeln!(out, "  {entry}");
    }
    let _ = writeln!(out, "\nmembers under a fault:");
    for (member, windows) in faults.iter() {
        for window in windows {
            let _ = writeln!(out, "  {member}: {window}");
        }
    }
    for (number, violation) in verdict.violations.iter().enumerate() {
        let _ = writeln!(out, "\nviolation {}: {violation}", number + 1);
        let line: String = violation.line.chars().take(4000).collect();
        let cut = if line.len() < violation.line.len() {
            " ... (cut; the whole line is in the audit copy)"
        } else {
            ""
        };
        let _ = writeln!(out, "  audit entry: {line}{cut}");
    }
    out
}

/// Copies the hub replicas' and agents' logs into the output directory, so they outlive
/// the lab (best effort).
fn keep_logs(lab: &Lab, namespace: &str, hub_logs: &[PathBuf], out_dir: &Path) {
    let logs = out_dir.join("logs");
    let _ = std::fs::create_dir_all(&logs);
    let agents = MEMBERS.iter().map(|member| {
        (
            lab.log_dir(member).join(format!("agent-{namespace}.log")),
            format!("agent-{member}.log"),
        )
    });
    let hubs = hub_logs.iter().map(|path| {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        (path.clone(), name)
    });
    for (from, name) in hubs.chain(agents) {
        if from.is_file() {
            let _ = std::fs::copy(&from, logs.join(name));
        }
    }
    // The members' own components: the last lines only (they log a lot).
    for member in MEMBERS {
        for component in [
            "kwok",
            "kube-scheduler",
            "kube-controller-manager",
            "kube-apiserver",
        ] {
            let from = lab.log_dir(member).join(format!("{component}.log"));
            if let Ok(text) = std::fs::read_to_string(&from) {
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(400)..].join("\n");
                let _ = std::fs::write(logs.join(format!("{member}-{component}.log")), tail);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_come_from_the_environment_with_defaults() {
        // One test touches these variables, so tests running in parallel do not race.
        for name in [
            "CHAOS_SECONDS",
            "CHAOS_SEED",
            "CHAOS_GRACE_SECONDS",
            "CHAOS_CONVERGE_SECONDS",
            "CHAOS_OUT_DIR",
        ] {
            // SAFETY: no other test reads or writes these variables.
            unsafe { std::env::remove_var(name) };
        }
        let defaults = Settings::from_env().unwrap();
        assert_eq!(defaults.seconds, 180);
        assert_eq!(defaults.grace, Duration::from_secs(2));
        assert_eq!(defaults.converge, Duration::from_secs(60));
        assert_eq!(
            defaults.out_dir,
            PathBuf::from(format!("/tmp/bulkhead-chaos/{}", defaults.seed))
        );
        // SAFETY: as above.
        unsafe {
            std::env::set_var("CHAOS_SEED", "42");
            std::env::set_var("CHAOS_SECONDS", "120");
            std::env::set_var("CHAOS_GRACE_SECONDS", "3.5");
        }
        let set = Settings::from_env().unwrap();
        assert_eq!((set.seed, set.seconds), (42, 120));
        assert_eq!(set.grace, Duration::from_millis(3500));
        // SAFETY: as above.
        unsafe { std::env::set_var("CHAOS_SEED", "") };
        assert_ne!(Settings::from_env().unwrap().seed, 42, "empty means random");
        // SAFETY: as above.
        unsafe { std::env::set_var("CHAOS_SECONDS", "soon") };
        assert!(
            Settings::from_env()
                .unwrap_err()
                .to_string()
                .contains("CHAOS_SECONDS")
        );
        for name in ["CHAOS_SEED", "CHAOS_SECONDS", "CHAOS_GRACE_SECONDS"] {
            // SAFETY: as above.
            unsafe { std::env::remove_var(name) };
        }
    }
}
