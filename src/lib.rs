//! Bulkhead: a multi-cluster Kubernetes federation controller that never makes a network
//! partition worse. See `docs/architecture.md` for how the pieces fit together.

pub mod access;
pub mod agent;
pub mod api;
pub mod cli;
pub mod client;
pub mod error;
pub mod hub;
pub mod instance;
pub mod leader;
pub mod metrics;
pub mod process;
pub mod server;
pub mod telemetry;
pub mod webhook;

pub use error::{Error, Result};
