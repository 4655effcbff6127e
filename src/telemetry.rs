//! Logging initialisation shared by every subcommand.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Installs the global tracing subscriber. The level comes from `level` (for example
/// `info` or `bulkhead=debug,kube=info`), else `RUST_LOG`, else `info`. Logs go to stderr
/// so that commands printing YAML or tables keep stdout clean.
pub fn init(format: LogFormat, level: Option<&str>) {
    let filter = match level {
        Some(level) => EnvFilter::new(level),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        LogFormat::Text => registry
            .with(fmt::layer().with_writer(std::io::stderr))
            .try_init(),
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .with_current_span(false)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    // A second initialisation (tests) keeps the first subscriber.
    let _ = result;
}
