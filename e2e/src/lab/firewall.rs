//! Zone partitions with iptables: a DROP rule on a member's external address and API
//! port makes the hub's new connections time out and open ones stall, as a real
//! partition does, while the member's own components (on 127.0.0.1) keep working.
//! Rules are narrow and tagged with a comment `bulkhead-lab:<member>` (`bulkhead-lab<octet>:` for a second lab).

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The tag prefix of this lab's rules: `bulkhead-lab<octet>:` (`bulkhead-lab:` for the
/// default lab), so two labs never remove each other's partitions.
fn tag_prefix() -> String {
    match super::network().address_octet {
        1 => "bulkhead-lab:".to_string(),
        octet => format!("bulkhead-lab{octet}:"),
    }
}

fn iptables(args: &[&str]) -> Result<String> {
    let output = Command::new("iptables").args(args).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            anyhow::anyhow!(
                "iptables is not installed; partitions need it: run `apt-get install -y iptables` (as root)"
            )
        } else {
            anyhow::anyhow!("running iptables: {e}")
        }
    })?;
    if !output.status.success() {
        bail!(
            "iptables {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The lab's rules, as `iptables -S INPUT` prints them (quotes removed; our tags have no
/// spaces), optionally only one cluster's.
fn lab_rules(cluster: Option<&str>) -> Result<Vec<String>> {
    let tag = match cluster {
        Some(name) => format!("--comment {}{name} ", tag_prefix()),
        None => format!("--comment {}", tag_prefix()),
    };
    Ok(iptables(&["-S", "INPUT"])?
        .lines()
        .map(|line| line.replace('"', ""))
        .filter(|line| line.starts_with("-A INPUT") && format!("{line} ").contains(&tag))
        .collect())
}

/// Whether `cluster` is currently cut off.
pub fn is_partitioned(cluster: &str) -> Result<bool> {
    Ok(!lab_rules(Some(cluster))?.is_empty())
}

/// Cuts `cluster`'s external address and port off, and the outside addresses of its
/// database pods (`pods`, a range: every port); rules already in place are kept.
pub fn partition(cluster: &str, address: Ipv4Addr, port: u16, pods: &str) -> Result<()> {
    cut_pods(cluster, pods)?;
    cut_port(cluster, address, port)
}

/// Cuts only the outside addresses of `cluster`'s database pods (`pods`, a range): other
/// clusters' replication and clients lose them while its API server stays reachable.
/// Undone by [`heal`] with the rest of the cluster's rules.
pub fn cut_pods(cluster: &str, pods: &str) -> Result<()> {
    drop_tagged(
        cluster,
        &["-d", pods, "-p", "tcp"],
        &format!("partitioning {cluster}'s database pods"),
    )
}

/// Drops TCP to `address`:`port` only (one pod's instance API, say), by a rule tagged
/// with `cluster`: undone by [`heal`] with the rest of the cluster's rules.
pub fn cut_port(cluster: &str, address: Ipv4Addr, port: u16) -> Result<()> {
    let destination = format!("{address}/32");
    drop_tagged(
        cluster,
        &[
            "-d",
            &destination,
            "-p",
            "tcp",
            "--dport",
            &port.to_string(),
        ],
        &format!("cutting {address}:{port} in {cluster}"),
    )
}

/// Removes the rule [`cut_port`] added for `address`:`port` (and nothing else of the
/// cluster's); gone already (a heal of the cluster took it) is fine.
pub fn uncut_port(cluster: &str, address: Ipv4Addr, port: u16) -> Result<()> {
    let tag = format!("{}{cluster}", tag_prefix());
    let destination = format!("{address}/32");
    let port = port.to_string();
    let rule = [
        "-d",
        destination.as_str(),
        "-p",
        "tcp",
        "--dport",
        port.as_str(),
        "-m",
        "comment",
        "--comment",
        tag.as_str(),
        "-j",
        "DROP",
    ];
    let with = |command: &'static str| {
        let mut args = vec![command, "INPUT"];
        args.extend_from_slice(&rule);
        args
    };
    while iptables(&with("-C")).is_ok() {
        iptables(&with("-D"))?;
    }
    Ok(())
}

/// Drops the packets `matches` selects, by a rule tagged with `cluster` (so [`heal`]
/// finds it), inserted once.
fn drop_tagged(cluster: &str, matches: &[&str], what: &str) -> Result<()> {
    let tag = format!("{}{cluster}", tag_prefix());
    let mut rule = matches.to_vec();
    rule.extend(["-m", "comment", "--comment", &tag, "-j", "DROP"]);
    insert_once(&rule, what)
}

/// Inserts `rule` at the head of INPUT unless the same rule is there already.
fn insert_once(rule: &[&str], what: &str) -> Result<()> {
    let with = |command: &'static str| {
        let mut args = vec![command, "INPUT"];
        args.extend_from_slice(rule);
        args
    };
    if iptables(&with("-C")).is_ok() {
        return Ok(());
    }
    iptables(&with("-I")).with_context(|| what.to_string())?;
    Ok(())
}

fn delete(rules: Vec<String>) -> Result<()> {
    for rule in rules {
        let args: Vec<&str> = rule.split_whitespace().collect();
        let mut delete = vec!["-D"];
        delete.extend(&args[1..]);
        iptables(&delete)?;
    }
    Ok(())
}

/// Removes `cluster`'s partition rules.
pub fn heal(cluster: &str) -> Result<()> {
    delete(lab_rules(Some(cluster))?)
}

/// Removes every lab rule (used by `down` and before `up`). Succeeds without iptables,
/// since then there can be no rules.
pub fn clear_all() -> Result<()> {
    match lab_rules(None) {
        Ok(rules) => delete(rules),
        Err(e) if e.to_string().contains("not installed") => Ok(()),
        Err(e) => Err(e),
    }
}
