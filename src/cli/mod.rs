//! Command-line parsing and the short-lived user commands.

pub mod agent_install;
pub mod crd;
pub mod get;
pub mod join;
pub mod member_guard;
pub mod plan;
pub mod promote;
pub mod rollout;
pub mod switchover;

use clap::{Parser, Subcommand};

use crate::agent::AgentOptions;
use crate::hub::HubOptions;
use crate::telemetry::LogFormat;

/// Bulkhead: multi-cluster Kubernetes federation that never makes a network partition worse.
#[derive(Parser, Debug)]
#[command(name = "bulkhead", version, about, propagate_version = true)]
pub struct Cli {
    /// Log format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "BULKHEAD_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
    /// Log level or filter, for example `info` or `bulkhead=debug` (default: $RUST_LOG, else info).
    #[arg(long, global = true, env = "BULKHEAD_LOG_LEVEL")]
    pub log_level: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the federation hub against the hub API server.
    Hub(HubOptions),
    /// Run the member agent (MyDatabase operator and fence watcher) in a member cluster.
    Agent(AgentOptions),
    /// Serve validating and mutating admission over TLS and install the webhook configurations.
    Webhook(crate::webhook::WebhookOptions),
    /// Run the hub's placement offline on policy, template and cluster files, and show what
    /// a zone or cluster failure would change.
    Plan(plan::PlanOptions),
    /// Print Bulkhead's CustomResourceDefinitions as YAML, or write/check them in a directory.
    Crd(crd::CrdOptions),
    /// Register a member cluster with the hub: RBAC and a service account in the member,
    /// its kubeconfig Secret and MemberCluster on the hub.
    Join(join::JoinOptions),
    /// Remove a member from the hub (and, with --cleanup, what join created in it).
    Unjoin(join::UnjoinOptions),
    /// Show federation state, e.g. `bulkhead get clusters`.
    Get(get::GetOptions),
    /// A template's progressive rollout: status, promote, pause, resume, abort, undo,
    /// history (docs/rollouts.md).
    Rollout(rollout::RolloutOptions),
    /// Move the primary of a MyDatabase with replica clusters to another cluster of its
    /// placement, e.g. `bulkhead switchover db/orders --to west` (docs/mydatabase.md).
    Switchover(switchover::SwitchoverOptions),
    /// Promote a replica cluster of a MyDatabase while its primary cluster is lost, e.g.
    /// `bulkhead promote db/orders --cluster east --accept-data-loss` (docs/mydatabase.md).
    Promote(promote::PromoteOptions),
    /// Run one PostgreSQL instance in a database pod (the container's entrypoint): create
    /// its data, supervise `postgres`, carry out the role the agent decides.
    Instance(crate::instance::InstanceOptions),
    /// Copy this binary to a path (a database pod's init container puts `bulkhead` into a
    /// volume the PostgreSQL container runs it from).
    CopyBinary {
        /// Where to put it (made executable).
        destination: std::path::PathBuf,
    },
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    crate::telemetry::init(cli.log_format, cli.log_level.as_deref());
    match cli.command {
        Command::Hub(options) => crate::hub::run(options).await?,
        Command::Agent(options) => crate::agent::run(options).await?,
        Command::Webhook(options) => crate::webhook::run(options).await?,
        Command::Plan(options) => plan::run(&options).await?,
        Command::Crd(options) => crd::run(&options)?,
        Command::Join(options) => join::join(&options).await?,
        Command::Unjoin(options) => join::unjoin(&options).await?,
        Command::Get(options) => get::run(&options).await?,
        Command::Rollout(options) => rollout::run(&options).await?,
        Command::Switchover(options) => switchover::run(&options).await?,
        Command::Promote(options) => promote::run(&options).await?,
        Command::Instance(options) => crate::instance::run(options).await?,
        Command::CopyBinary { destination } => crate::instance::copy_binary(&destination)?,
    }
    Ok(())
}
