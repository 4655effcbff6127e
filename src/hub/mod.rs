//! The federation side: membership and health, fencing leases, policy matching,
//! scheduling, propagation, status aggregation and failover. Placement is pure code in
//! `placement/` (added with the placement issue).

pub mod placement;

use std::time::Duration;

use kube::Api;

use crate::Result;
use crate::api::MemberCluster;
use crate::process::{ClientOptions, Process, ServeOptions, observe_kind};

/// The CRDs the hub needs on the hub API server.
pub const HUB_CRDS: &[&str] = &[
    "memberclusters.federation.example.com",
    "propagationpolicies.federation.example.com",
    "clusterpropagationpolicies.federation.example.com",
    "resourcebindings.federation.example.com",
    "mydatabases.example.com",
];

/// `bulkhead hub` options.
#[derive(clap::Args, Clone, Debug)]
pub struct HubOptions {
    #[command(flatten)]
    pub client: ClientOptions,
    #[command(flatten)]
    pub serve: ServeOptions,
}

/// Runs the hub until SIGTERM.
pub async fn run(options: HubOptions) -> Result<()> {
    let process = Process::start("hub", &options.client, &options.serve).await?;
    let wait = Duration::from_secs(options.serve.crd_wait_seconds);
    if process.wait_for_crds(HUB_CRDS, wait).await? {
        process.readiness.set_ready();
        tracing::info!("hub ready");
        let members: Api<MemberCluster> = Api::all(process.client.clone());
        observe_kind(&process, members, "membercluster").await;
    }
    process.finish().await;
    Ok(())
}
