//! `e2e/lab`: the federation lab for people. See `docs/lab.md`.

use anyhow::Result;
use bulkhead_e2e::lab::{self, Lab, UpOutcome};
use clap::{Parser, Subcommand};

/// A hub and three member clusters (east, west, north) from real Kubernetes control planes.
#[derive(Parser)]
#[command(name = "e2e/lab")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the lab (or report that it runs); cleans up a crashed lab first.
    Up,
    /// Stop every lab process, remove partitions and the lab directory.
    Down,
    /// Show each cluster's processes, API server health and partition state.
    Status,
    /// Print shell exports (KUBECONFIG for the hub, PATH with the lab's kubectl and helm).
    Env,
    /// Print the path of a cluster's admin kubeconfig.
    Kubeconfig {
        /// hub, east, west or north.
        cluster: String,
        /// Through 127.0.0.1, which still works while the member is partitioned.
        #[arg(long)]
        inside: bool,
    },
    /// Cut the hub off a member (its external address times out).
    Partition { member: String },
    /// Undo `partition` for a member.
    Heal { member: String },
    /// Cut the hub off every member.
    IsolateHub,
    /// Heal every partition.
    HealAll,
    /// Install Bulkhead's CRDs (config/crd/) on every cluster and wait until Established.
    InstallCrds,
    /// Print a libpq URI (user, password, database, address) for a database Service of a
    /// member (`<name>-rw`, `-ro`, `-r`): its first ready endpoint, as a client outside
    /// the member's zone reaches it (partitions cut it), or inside with --inside.
    DbUrl {
        cluster: String,
        namespace: String,
        service: String,
        #[arg(long)]
        inside: bool,
    },
    /// Run a member's database node (started by `up`; runs its pods as host processes).
    #[command(hide = true)]
    Runner {
        #[arg(long)]
        lab_dir: std::path::PathBuf,
        #[arg(long)]
        cluster: String,
        /// The `bulkhead` binary (what the Bulkhead image holds).
        #[arg(long)]
        bulkhead: std::path::PathBuf,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let lab = Lab::from_env();
    match Cli::parse().command {
        Command::Up => match lab.up().await? {
            UpOutcome::Started { seconds } => {
                println!("lab: all clusters ready in {seconds} s");
                print!("{}", lab.status().await?);
                println!("use it: eval \"$(e2e/lab env)\"; stop it: make lab-down");
            }
            UpOutcome::AlreadyRunning => {
                println!(
                    "lab: already running in {}; nothing to do",
                    lab.root.display()
                );
            }
        },
        Command::Down => {
            lab.down()?;
            println!("lab: stopped and removed {}", lab.root.display());
        }
        Command::Status => print!("{}", lab.status().await?),
        Command::Env => print!("{}", lab::shell_env(&lab)),
        Command::Kubeconfig { cluster, inside } => {
            lab::cluster(&cluster)?;
            let path = if inside {
                lab.inside_kubeconfig(&cluster)
            } else {
                lab.kubeconfig(&cluster)
            };
            println!("{}", path.display());
        }
        Command::Partition { member } => {
            lab.partition(&member)?;
            println!("lab: {member} is cut off from outside its zone");
        }
        Command::Heal { member } => {
            lab.heal(&member)?;
            println!("lab: {member} is reachable again");
        }
        Command::IsolateHub => {
            lab.isolate_hub()?;
            println!("lab: the hub is cut off from every member");
        }
        Command::InstallCrds => {
            for info in lab::CLUSTERS.iter() {
                let names = lab.install_crds(info.name, &lab::crd_dir()).await?;
                println!(
                    "lab: {:<6} {} CRDs Established: {}",
                    info.name,
                    names.len(),
                    names.join(", ")
                );
            }
        }
        Command::HealAll => {
            lab.heal_all()?;
            println!("lab: every partition healed");
        }
        Command::DbUrl {
            cluster,
            namespace,
            service,
            inside,
        } => {
            let info = lab::member(&cluster)?;
            let client = lab.inside_client(info.name).await?;
            let services: kube::Api<k8s_openapi::api::core::v1::Service> =
                kube::Api::namespaced(client.clone(), &namespace);
            let found = services
                .get(&service)
                .await
                .map_err(|e| anyhow::anyhow!("Service {namespace}/{service} in {cluster}: {e}"))?;
            let database = found
                .metadata
                .labels
                .unwrap_or_default()
                .remove("example.com/database")
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "Service {namespace}/{service} is not a MyDatabase's (no example.com/database label)"
                    )
                })?;
            let credentials =
                bulkhead_e2e::postgres_support::app_credentials(&client, &namespace, &database)
                    .await?;
            let endpoints =
                bulkhead_e2e::postgres_support::endpoints(&client, &namespace, &service).await?;
            let Some(address) = endpoints.first() else {
                let hint = if service == format!("{database}-ro") {
                    format!(
                        "it selects the standbys, and a single-instance database has none; {database}-r selects any instance"
                    )
                } else if service == format!("{database}-r") {
                    "no instance is ready".to_string()
                } else {
                    format!(
                        "a fenced database's read-write Services have none; {database}-r serves reads"
                    )
                };
                anyhow::bail!("Service {namespace}/{service} has no ready endpoint ({hint})");
            };
            let address = if inside {
                *address
            } else {
                bulkhead_e2e::postgres_support::outside(*address)?
            };
            println!(
                "postgresql://{}:{}@{address}:5432/{}",
                credentials.user, credentials.password, credentials.dbname
            );
        }
        Command::Runner {
            lab_dir,
            cluster,
            bulkhead,
        } => {
            let mut lab = lab;
            lab.root = lab_dir;
            let info = lab::member(&cluster)?;
            let client = lab.inside_client(info.name).await?;
            lab::runner::Runner::new(client, info, &lab.root, bulkhead)
                .run()
                .await?;
        }
    }
    Ok(())
}
