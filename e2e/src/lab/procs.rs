//! Starting and stopping the lab's processes. Every process is started in its own process
//! group (so a Ctrl-C in the shell that ran `e2e/lab up` does not reach it), logs to a
//! file in the lab directory, and is recorded by pid in the lab's state file.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// One started process.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcessRecord {
    pub cluster: String,
    pub component: String,
    pub pid: u32,
}

/// Starts `binary` with `args`, output appended to `log`.
pub fn spawn(binary: &Path, args: &[String], log: &Path) -> Result<u32> {
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening log {}", log.display()))?;
    let err = out.try_clone()?;
    let child = Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    Ok(child.id())
}

/// The command line of a live, non-zombie process, or None.
fn command_line(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the parenthesised command name.
    let state = stat.rsplit_once(") ")?.1.chars().next()?;
    if state == 'Z' || state == 'X' {
        return None;
    }
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&raw).replace('\0', " "))
}

/// True when `pid` is alive and its command line names a path inside `marker` (the lab
/// directory), so a recycled pid is never mistaken for a lab process. The trailing `/`
/// keeps `/tmp/bulkhead-lab` from matching a second lab in `/tmp/bulkhead-lab-e2e`.
pub fn is_lab_process(pid: u32, marker: &Path) -> bool {
    let inside = format!("{}/", marker.to_string_lossy().trim_end_matches('/'));
    command_line(pid).is_some_and(|cmd| cmd.contains(&inside))
}

/// Every live process whose command line mentions `marker`: what a crashed lab left.
pub fn find_lab_processes(marker: &Path) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me && is_lab_process(*pid, marker))
        .collect()
}

/// Sends SIGTERM, waits up to `grace`, then SIGKILL; returns once the process is gone.
pub fn stop(pid: u32, marker: &Path, grace: Duration) {
    if !is_lab_process(pid, marker) {
        return;
    }
    let target = Pid::from_raw(pid as i32);
    let _ = kill(target, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !is_lab_process(pid, marker) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = kill(target, Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && is_lab_process(pid, marker) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stop order: the API server's clients first, then the API server, then its etcd (an
/// apiserver whose etcd is gone ignores SIGTERM for over a minute).
pub fn stop_rank(component: &str) -> u8 {
    match component {
        "kwok" | "kube-scheduler" | "kube-controller-manager" => 0,
        "kube-apiserver" => 1,
        "etcd" => 2,
        _ => 0,
    }
}

/// The log file of a component.
pub fn log_path(root: &Path, cluster: &str, component: &str) -> PathBuf {
    root.join(cluster)
        .join("logs")
        .join(format!("{component}.log"))
}
