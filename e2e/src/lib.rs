//! The local federation lab (real Kubernetes control planes as processes) and the
//! support code Bulkhead's end-to-end tests use. See `docs/lab.md`.

pub mod agent_support;
pub mod bench;
pub mod chaos;
pub mod federation;
pub mod hub_support;
pub mod lab;
pub mod postgres_support;
pub mod prometheus_support;
pub mod support;
pub mod wait;

pub use lab::{CLUSTERS, ClusterInfo, Lab, UpOutcome};
pub use wait::{Check, wait_for};
