//! What the nemesis did and when: every fault and operation with its wall-clock time (UTC,
//! millisecond precision), printed as it happens and appended to a file. The checker reads
//! the faults back from it.

use std::fmt;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::schedule::TemplateKind;

/// One thing that happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The member's external address drops packets from now on (the first fault to cut it).
    NetworkCut { member: String },
    /// The member's external address answers again (the last fault cutting it ended).
    NetworkHealed { member: String },
    /// The member's kube-apiserver was killed.
    ApiserverDown { member: String },
    /// The member's kube-apiserver answers /readyz again after a restart.
    ApiserverUp { member: String },
    /// A planned fault began (`number` is its index in the schedule).
    FaultStarted { number: usize, fault: String },
    /// A planned fault is over.
    FaultEnded { number: usize, fault: String },
    /// A hub replica was killed (SIGKILL).
    HubKilled { identity: String },
    /// A hub replica was started.
    HubStarted { identity: String },
    /// A hub replica was frozen (SIGSTOP).
    HubPaused { identity: String },
    /// A frozen hub replica was resumed (SIGCONT).
    HubResumed { identity: String },
    /// The user is deleting a template on the hub: recorded right before the request.
    TemplateDeleted { kind: TemplateKind, name: String },
    /// A user operation and how it went.
    Operation {
        description: String,
        outcome: String,
    },
    /// Anything else worth a line (phases of the run, leader changes).
    Note(String),
}

impl Event {
    /// Whether the event is part of the fault timeline (printed again on failure).
    pub fn is_fault(&self) -> bool {
        !matches!(self, Event::Operation { .. } | Event::Note(_))
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::NetworkCut { member } => write!(f, "network: {member} cut off (iptables DROP)"),
            Event::NetworkHealed { member } => write!(f, "network: {member} reachable again"),
            Event::ApiserverDown { member } => write!(f, "{member}: kube-apiserver killed"),
            Event::ApiserverUp { member } => write!(f, "{member}: kube-apiserver ready again"),
            Event::FaultStarted { number, fault } => write!(f, "fault #{number} begins: {fault}"),
            Event::FaultEnded { number, fault } => write!(f, "fault #{number} ends: {fault}"),
            Event::HubKilled { identity } => write!(f, "hub {identity}: killed (SIGKILL)"),
            Event::HubStarted { identity } => write!(f, "hub {identity}: started"),
            Event::HubPaused { identity } => write!(f, "hub {identity}: frozen (SIGSTOP)"),
            Event::HubResumed { identity } => write!(f, "hub {identity}: resumed (SIGCONT)"),
            Event::TemplateDeleted { kind, name } => {
                write!(f, "hub: deleting {} {name} (user)", kind.kind())
            }
            Event::Operation {
                description,
                outcome,
            } => write!(f, "{description}: {outcome}"),
            Event::Note(text) => write!(f, "{text}"),
        }
    }
}

/// An event with its time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub at: jiff::Timestamp,
    /// Time since the run's clock started (None before it started).
    pub since_start: Option<Duration>,
    pub event: Event,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let offset = match self.since_start {
            Some(since) => format!("+{:.3}s", since.as_secs_f64()),
            None => "setup".to_string(),
        };
        write!(f, "{:.3}  {offset:>10}  {}", self.at, self.event)
    }
}

/// The run's timeline; see the module documentation.
pub struct Timeline {
    clock: Mutex<Option<Instant>>,
    entries: Mutex<Vec<Entry>>,
    file: Mutex<Option<std::fs::File>>,
}

impl Timeline {
    /// A timeline that also appends to `path` (created or truncated).
    pub fn new(path: Option<&Path>) -> Result<Self> {
        let file = path
            .map(|p| std::fs::File::create(p).with_context(|| format!("creating {}", p.display())))
            .transpose()?;
        Ok(Timeline {
            clock: Mutex::new(None),
            entries: Mutex::new(vec![]),
            file: Mutex::new(file),
        })
    }

    /// Starts the run's clock: offsets count from now.
    pub fn start_clock(&self) -> Instant {
        let now = Instant::now();
        *self.clock.lock().unwrap() = Some(now);
        now
    }

    /// Records `event` now, prints it and appends it to the file; returns its time.
    pub fn record(&self, event: Event) -> jiff::Timestamp {
        let entry = Entry {
            at: jiff::Timestamp::now(),
            since_start: self.clock.lock().unwrap().map(|start| start.elapsed()),
            event,
        };
        let line = entry.to_string();
        println!("{line}");
        if let Some(file) = self.file.lock().unwrap().as_mut() {
            let _ = writeln!(file, "{line}");
        }
        let at = entry.at;
        self.entries.lock().unwrap().push(entry);
        at
    }

    /// A note (a phase of the run, a leader change).
    pub fn note(&self, text: impl Into<String>) -> jiff::Timestamp {
        self.record(Event::Note(text.into()))
    }

    /// Everything recorded so far, in order.
    pub fn entries(&self) -> Vec<Entry> {
        self.entries.lock().unwrap().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_shows_utc_milliseconds_and_the_offset() {
        let entry = Entry {
            at: "2026-11-30T10:00:01.123456Z".parse().unwrap(),
            since_start: Some(Duration::from_millis(12_345)),
            event: Event::NetworkCut {
                member: "east".into(),
            },
        };
        assert_eq!(
            entry.to_string(),
            "2026-11-30T10:00:01.123Z    +12.345s  network: east cut off (iptables DROP)"
        );
        let setup = Entry {
            since_start: None,
            ..entry
        };
        assert!(setup.to_string().contains("     setup  network"));
    }

    #[test]
    fn recorded_events_are_kept_in_order() {
        let timeline = Timeline::new(None).unwrap();
        timeline.note("before the clock");
        timeline.start_clock();
        timeline.record(Event::HubKilled {
            identity: "a".into(),
        });
        let entries = timeline.entries();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].since_start, None);
        assert!(entries[1].since_start.is_some());
        assert!(entries[0].at <= entries[1].at);
        assert!(entries[1].event.is_fault() && !entries[0].event.is_fault());
    }
}
