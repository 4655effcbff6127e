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
}

impl Drop for HubProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
