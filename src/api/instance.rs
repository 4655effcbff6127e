//! What the agent and a database pod's instance manager (`bulkhead instance`) say to each
//! other over the instance's HTTP port: the role the agent decides, and what the instance
//! reports back. The agent decides every role; the instance carries it out, and on its own
//! only ever demotes itself (when the agent has not spoken for longer than the lease).

use serde::{Deserialize, Serialize};

/// Port of the instance manager's HTTP API in a database pod.
pub const INSTANCE_PORT: u16 = 8000;

/// Header carrying the token the agent shares with the database's pods (a Secret): only
/// the agent may change a role.
pub const TOKEN_HEADER: &str = "authorization";

/// The role of one PostgreSQL instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Accepts writes.
    Primary,
    /// A hot standby: PostgreSQL itself refuses every write (SQLSTATE 25006), reads work.
    Standby,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Primary => "primary",
            Role::Standby => "standby",
        })
    }
}

/// Where a standby streams from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upstream {
    pub host: String,
    pub port: u16,
    /// Another cluster's primary (a replica cluster's source): streamed from without a
    /// replication slot there (a cut-off cluster must not make the source keep WAL
    /// without bound) and under a name the source's synchronous standbys never match.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub external: bool,
}

/// What the agent wants of an instance; sent again every few seconds, which is also how
/// the instance knows the agent is there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Desired {
    pub role: Role,
    /// The database's term: raised by the agent (and recorded in the MyDatabase's status)
    /// before it promotes an instance. An instance refuses a lower term than one it has
    /// seen, so an agent's stale word cannot promote it.
    pub term: u64,
    /// For a standby: the primary to stream from (none: it replays what it has and waits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Upstream>,
    /// Why this role, for the instance's log and status ("fenced: the hub's lease is
    /// stale", "standby of db-0").
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// This instance's name among the database's instances: a standby streams through
    /// the replication slot of that name and names itself so to the primary (which
    /// synchronous replication counts by).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// For a primary: the names of the standbys it keeps a replication slot for (WAL a
    /// standby has not received yet is kept for it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub standbys: Vec<String>,
    /// For a primary: how many standbys must have a commit before it is acknowledged
    /// (`synchronous_standby_names = 'ANY n (...)'`; 0: asynchronous).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub synchronous: u32,
    /// The database's recorded primary: with no data yet, it creates the database
    /// (`initdb`) even while told to run as a standby (a database created fenced starts
    /// read-only, then is promoted when the fence lifts).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bootstrap: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A name as PostgreSQL takes it for a replication slot and an application name: lower
/// case letters, digits and underscores (`db-1` -> `db_1`).
pub fn slot_name(instance: &str) -> String {
    instance
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// What an instance reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// The role PostgreSQL is in now (None while it is not running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// PostgreSQL accepts connections.
    pub ready: bool,
    /// The highest term the instance has seen (kept in its data directory).
    pub term: u64,
    /// The WAL position: a primary's current write position, a standby's last received
    /// (or replayed, when nothing was received) position, as PostgreSQL prints an LSN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lsn: Option<String>,
    /// The timeline the server is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<u32>,
    /// The instance demoted itself: the agent had not spoken for longer than the lease.
    pub agent_lost: bool,
    /// What the instance is doing or waiting for, in words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// An LSN (`16/B374D848`) as a number, for comparing two instances' positions.
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('/')?;
    let high = u64::from_str_radix(high, 16).ok()?;
    let low = u64::from_str_radix(low, 16).ok()?;
    (high <= u32::MAX as u64 && low <= u32::MAX as u64).then_some((high << 32) | low)
}

/// `0/3000A00`: a WAL position in bytes as PostgreSQL writes it.
pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_are_what_postgresql_takes() {
        assert_eq!(slot_name("orders-db-1"), "orders_db_1");
    }

    #[test]
    fn lsns_compare_as_numbers() {
        assert_eq!(parse_lsn("0/0"), Some(0));
        assert_eq!(parse_lsn("16/B374D848"), Some((0x16 << 32) | 0xB374_D848));
        assert!(parse_lsn("1/0") > parse_lsn("0/FFFFFFFF"));
        assert_eq!(parse_lsn("nope"), None);
        assert_eq!(parse_lsn("1/100000000"), None);
    }

    #[test]
    fn the_wire_format_is_camel_case_and_lower_case_roles() {
        let desired = Desired {
            role: Role::Standby,
            term: 3,
            upstream: Some(Upstream {
                host: "db-0.db".into(),
                port: 5432,
                external: false,
            }),
            reason: String::new(),
            name: String::new(),
            standbys: vec![],
            synchronous: 0,
            bootstrap: false,
        };
        let text = serde_json::to_string(&desired).unwrap();
        assert_eq!(
            text,
            r#"{"role":"standby","term":3,"upstream":{"host":"db-0.db","port":5432}}"#
        );
        assert_eq!(serde_json::from_str::<Desired>(&text).unwrap(), desired);
    }
}
