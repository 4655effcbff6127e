//! `bulkhead hub` and `bulkhead agent` start, connect to a real API server, wait for
//! their CRDs, report ready on /readyz, serve /metrics, and stop cleanly on SIGTERM.

use bulkhead_e2e::support::http_get as get;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bulkhead_e2e::agent_support::{bulkhead_binary, free_port};
use bulkhead_e2e::lab;
use bulkhead_e2e::support;
use bulkhead_e2e::{Check, wait_for};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start_connect_stop(subcommand: &str, cluster: &str) -> Result<()> {
    let lab = support::lab().await?;
    lab.install_crds(cluster, &lab::crd_dir()).await?;
    let port = free_port();
    let child = Command::new(bulkhead_binary()?)
        .args([subcommand, "--kubeconfig"])
        .arg(lab.kubeconfig(cluster))
        .args([
            "--probe-address",
            &format!("127.0.0.1:{port}"),
            "--log-format",
            "json",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut running = Running(child);

    wait_for(
        &format!("bulkhead {subcommand} /readyz"),
        Duration::from_secs(30),
        || async move {
            match get(port, "/readyz").await {
                Ok((200, _)) => Check::Done(()),
                Ok((status, body)) => Check::Waiting(format!("{status} {body}")),
                Err(e) => Check::Waiting(e.to_string()),
            }
        },
    )
    .await?;
    let (status, _) = get(port, "/healthz").await?;
    assert_eq!(status, 200);
    let (status, metrics) = get(port, "/metrics").await?;
    assert_eq!(status, 200);
    assert!(
        metrics.contains(&format!("process=\"{subcommand}\"")),
        "{metrics}"
    );

    kill(Pid::from_raw(running.0.id() as i32), Signal::SIGTERM)?;
    let stopping = Instant::now();
    let exit = loop {
        if let Some(status) = running.0.try_wait()? {
            break status;
        }
        if stopping.elapsed() > Duration::from_secs(10) {
            bail!("bulkhead {subcommand} did not stop within 10 s of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!(
        "bulkhead {subcommand} stopped {:?} after SIGTERM",
        stopping.elapsed()
    );
    assert!(exit.success(), "clean exit, got {exit:?}");
    Ok(())
}

#[tokio::test]
async fn hub_starts_connects_and_stops_on_sigterm() -> Result<()> {
    start_connect_stop("hub", "hub").await
}

#[tokio::test]
async fn agent_starts_connects_and_stops_on_sigterm() -> Result<()> {
    start_connect_stop("agent", "north").await
}
