use clap::Parser;

// mimalloc instead of glibc's malloc: the hub's allocations are many small JSON trees
// per watch event, and glibc kept what a burst freed in its per-thread arenas (measured:
// 71 MiB held for 46 MiB in use after a 500-template burst, and malloc/free about a
// quarter of the hub's CPU samples); mimalloc returns freed pages after a second and is
// cheaper at this churn. Built without transparent huge pages (`no_thp`): with them each
// of its 2 MiB pages counts whole in RSS however little of it is used (26 MiB of
// AnonHugePages measured in a burst).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // One crypto provider for every TLS connection (kube clients, webhooks), chosen first.
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    bulkhead::cli::run(bulkhead::cli::Cli::parse()).await
}
