//! The member side: the MyDatabase operator and the fence watcher.

use std::time::Duration;

use kube::Api;

use crate::Result;
use crate::api::MyDatabase;
use crate::process::{ClientOptions, Process, ServeOptions, observe_kind};

/// The CRDs the agent needs in its member cluster.
pub const AGENT_CRDS: &[&str] = &["mydatabases.example.com"];

/// `bulkhead agent` options.
#[derive(clap::Args, Clone, Debug)]
pub struct AgentOptions {
    #[command(flatten)]
    pub client: ClientOptions,
    #[command(flatten)]
    pub serve: ServeOptions,
}

/// Runs the agent until SIGTERM.
pub async fn run(options: AgentOptions) -> Result<()> {
    let process = Process::start("agent", &options.client, &options.serve).await?;
    let wait = Duration::from_secs(options.serve.crd_wait_seconds);
    if process.wait_for_crds(AGENT_CRDS, wait).await? {
        process.readiness.set_ready();
        tracing::info!("agent ready");
        let databases: Api<MyDatabase> = Api::all(process.client.clone());
        observe_kind(&process, databases, "mydatabase").await;
    }
    process.finish().await;
    Ok(())
}
