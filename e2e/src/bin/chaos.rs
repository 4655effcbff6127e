//! `make chaos`: a seeded schedule of faults and user operations against a federation on
//! the lab, then the safety and convergence checks (see `docs/chaos.md`). Exits 0 when
//! the run passed, 1 when it found a violation or a template that did not converge, 2 when
//! the harness or the lab failed before a verdict.
//!
//! `chaos --schedule-only` prints the schedule the settings give and exits, without a lab.

use std::time::Duration;

use bulkhead_e2e::chaos::schedule::Schedule;
use bulkhead_e2e::chaos::{Settings, run};

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("chaos: {error:#}");
            std::process::exit(2);
        }
    };
    if std::env::args().any(|a| a == "--schedule-only") {
        print!(
            "{}",
            Schedule::generate(settings.seed, Duration::from_secs(settings.seconds))
        );
        return;
    }
    match run(&settings).await {
        Ok(outcome) if outcome.passed() => {}
        Ok(_) => std::process::exit(1),
        Err(error) => {
            eprintln!(
                "chaos: no verdict (seed {}): {error:#}\noutput so far in {}",
                settings.seed,
                settings.out_dir.display()
            );
            std::process::exit(2);
        }
    }
}
