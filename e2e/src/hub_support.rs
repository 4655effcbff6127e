//! Running `bulkhead` commands and the hub against the lab from tests.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use anyhow::Result;

use crate::agent_support::{bulkhead_binary, free_port};
use crate::lab::Lab;

/// Runs `bulkhead <args>`, echoing the command and its output (for failure reports).
pub fn bulkhead(args: &[&str]) -> Result<Output> {
    let output = Command::new(bulkhead_binary()?).args(args).output()?;
    eprintln!(
        "$ bulkhead {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(output)
}

/// A path as a string argument.
pub fn path(p: &Path) -> String {
    p.display().to_string()
}

/// `bulkhead join <name>` for a lab member, through its external address.
pub fn join(lab: &Lab, name: &str, zone: &str, region: &str, extra: &[&str]) -> Result<Output> {
    let kubeconfig = path(&lab.kubeconfig(name));
    let hub = path(&lab.kubeconfig("hub"));
    let mut args = vec![
        "join",
        name,
        "--kubeconfig",
        &kubeconfig,
        "--zone",
        zone,
        "--region",
        region,
        "--hub-kubeconfig",
        &hub,
    ];
    args.extend(extra);
    bulkhead(&args)
}

/// `bulkhead unjoin <name> --cleanup` for a lab member.
pub fn unjoin(lab: &Lab, name: &str) -> Result<Output> {
    bulkhead(&[
        "unjoin",
        name,
        "--cleanup",
        "--kubeconfig",
        &path(&lab.kubeconfig(name)),
        "--hub-kubeconfig",
        &path(&lab.kubeconfig("hub")),
    ])
}

/// A `bulkhead hub` process against the lab's hub, killed when dropped.
pub struct HubProcess {
    child: Child,
    pub probe_port: u16,
}

impl HubProcess {
    /// Starts the hub with extra arguments; its log goes to `<lab>/hub/logs/<log>`.
    pub fn start(lab: &Lab, log: &str, extra: &[&str]) -> Result<Self> {
        Self::start_as(lab, &lab.kubeconfig("hub"), log, extra)
    }

    /// [`HubProcess::start`] with the hub's credentials from `kubeconfig` instead of the
    /// lab's admin (e.g. a token of the Helm chart's service account).
    pub fn start_as(lab: &Lab, kubeconfig: &Path, log: &str, extra: &[&str]) -> Result<Self> {
        let probe_port = free_port();
        let out = std::fs::File::create(lab.log_dir("hub").join(log))?;
        let child = Command::new(bulkhead_binary()?)
            .arg("hub")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--probe-address", &format!("127.0.0.1:{probe_port}")])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()?;
        Ok(HubProcess { child, probe_port })
    }
}

impl HubProcess {
    /// The process id (for /proc readings such as RSS).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process's `/metrics` text.
    pub async fn metrics(&self) -> Result<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.probe_port)).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await?;
        Ok(text)
    }

    /// Sends SIGTERM and waits (up to `timeout`) for the process to exit; returns whether
    /// it exited successfully.
    pub async fn terminate(&mut self, timeout: std::time::Duration) -> Result<bool> {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM)?;
        let started = std::time::Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status.success());
            }
            anyhow::ensure!(
                started.elapsed() < timeout,
                "the hub did not exit within {timeout:?} of SIGTERM"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// Sum of the samples of `name` in Prometheus text whose line contains `filter`.
pub fn counter_sum(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, value| sum + value)
}

impl Drop for HubProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
