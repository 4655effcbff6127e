use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // One crypto provider for every TLS connection (kube clients, webhooks), chosen first.
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    bulkhead::cli::run(bulkhead::cli::Cli::parse()).await
}
