//! `demo-app`: the demo's application metrics for `make demo`'s rollout scene. Serves
//! `/metrics` on 127.0.0.1:`--port` for the Deployment `--name` in `--namespace` of every
//! lab member, as `e2e/tests/rollouts.rs` does (requests and latency by cluster and by the
//! revision each copy holds; the error share and latency its pod template's
//! `DEMO_ERROR_RATE` and `DEMO_LATENCY_SECONDS` say). Runs until killed.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use bulkhead_e2e::CLUSTERS;
use bulkhead_e2e::lab::Lab;
use bulkhead_e2e::prometheus_support::DemoApp;
use clap::Parser;

#[derive(Parser)]
struct Options {
    #[arg(long)]
    namespace: String,
    #[arg(long)]
    name: String,
    #[arg(long)]
    port: u16,
    /// The lab's directory (default: $BULKHEAD_LAB_DIR, else the lab's default). Give it
    /// with a trailing `/` for `e2e/lab down` to find and stop this process with the lab
    /// (it looks for `<lab dir>/` on command lines).
    #[arg(long)]
    lab_dir: Option<std::path::PathBuf>,
}

fn main() -> Result<()> {
    let options = Options::parse();
    if let Some(dir) = &options.lab_dir {
        // SAFETY: no other thread runs yet (the runtime starts below).
        unsafe { std::env::set_var("BULKHEAD_LAB_DIR", dir) };
    }
    tokio::runtime::Runtime::new()?.block_on(serve(options))
}

async fn serve(options: Options) -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let lab = Lab::from_env();
    let mut members = BTreeMap::new();
    for cluster in CLUSTERS.iter().filter(|c| c.name != "hub") {
        members.insert(
            cluster.name.to_string(),
            lab.inside_client(cluster.name)
                .await
                .with_context(|| format!("a client for {}", cluster.name))?,
        );
    }
    let app = DemoApp::start_on(members, &options.namespace, &options.name, options.port).await?;
    eprintln!("demo-app: serving http://{}/metrics", app.target());
    std::future::pending::<()>().await;
    Ok(())
}
