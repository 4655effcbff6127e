//! One PostgreSQL server, driven by its own programs: `initdb`, `pg_basebackup`, the
//! `postgres` process itself, and SQL over the local socket (`pg_promote`, positions).
//!
//! Bulkhead's settings live in `bulkhead.conf` in the data directory, which
//! `postgresql.conf` includes; the instance rewrites it for its role (a standby's
//! `primary_conninfo`), so a base backup that copied the primary's is corrected at once.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::process::{Child, Command};

use crate::api::instance::{Role, Upstream};

/// The role PostgreSQL replication connections log in as.
pub const REPLICATION_USER: &str = "streaming_replica";

/// The superuser `initdb` creates.
pub const SUPERUSER: &str = "postgres";

/// File in the data directory holding the highest term the instance has seen.
const TERM_FILE: &str = "bulkhead-term";

/// File in the data directory present while it runs (or last ran) as a primary.
const WAS_PRIMARY_FILE: &str = "bulkhead-was-primary";

/// Where a server's files are, and who runs it.
#[derive(Clone, Debug)]
pub struct Server {
    /// PostgreSQL's programs (`initdb`, `postgres`, `pg_basebackup`).
    pub bin_dir: PathBuf,
    /// PGDATA.
    pub data_dir: PathBuf,
    /// The server's Unix socket directory (private: the instance connects there as the
    /// superuser without a password).
    pub socket_dir: PathBuf,
    /// `listen_addresses`.
    pub listen: String,
    pub port: u16,
    /// The user and group the server runs as when the instance runs as root (PostgreSQL
    /// refuses to run as root): the lab runs database pods as host processes.
    pub owner: Option<(u32, u32)>,
    /// The superuser's password (network logins), and the replication user's.
    pub superuser_password: String,
    pub replication_password: String,
    /// `wal_keep_size`: WAL kept past checkpoints, so an old primary can still be rewound
    /// to a new one's history (`pg_rewind` reads it back to their last common checkpoint).
    pub wal_keep_size: String,
    /// The application's user and database, created by a primary when missing.
    pub app: Option<AppUser>,
}

/// The application's credentials (the database's `<name>-app` Secret).
#[derive(Clone, Debug)]
pub struct AppUser {
    pub user: String,
    pub password: String,
    pub database: String,
}

/// What the instance runs: the agent's word as the server's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub role: Role,
    pub upstream: Option<Upstream>,
    /// The instance's name (its slot and application name come from it).
    pub name: String,
    /// For a primary, or a replica cluster's designated primary (its standbys cascade
    /// from it): the standbys it keeps slots for.
    pub standbys: Vec<String>,
    /// For a primary: standbys that must have a commit before it is acknowledged.
    pub synchronous: u32,
}

impl From<&crate::api::instance::Desired> for Wanted {
    fn from(desired: &crate::api::instance::Desired) -> Self {
        Wanted {
            role: desired.role,
            upstream: desired.upstream.clone(),
            name: desired.name.clone(),
            standbys: desired.standbys.clone(),
            synchronous: desired.synchronous,
        }
    }
}

impl Wanted {
    /// The replication slot (and application name) of this instance, when it has a name.
    pub fn slot(&self) -> Option<String> {
        (!self.name.is_empty()).then(|| slot(&self.name))
    }
}

/// The application name a replica cluster's designated primary streams under from its
/// source (in `pg_stat_replication` there).
pub const EXTERNAL_APPLICATION_NAME: &str = "bulkhead_replica_cluster";

/// Prefix of the replication slots Bulkhead manages (others are left alone).
pub const SLOT_PREFIX: &str = "bulkhead_";

/// The replication slot of instance `name`.
pub fn slot(name: &str) -> String {
    format!("{SLOT_PREFIX}{}", crate::api::instance::slot_name(name))
}

/// What the server says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub role: Role,
    pub lsn: Option<String>,
    pub timeline: Option<u32>,
}

impl Server {
    fn program(&self, name: &str) -> Command {
        let mut command = Command::new(self.bin_dir.join(name));
        if let Some((uid, gid)) = self.owner {
            command.uid(uid).gid(gid);
        }
        command.env_remove("PGDATA").kill_on_drop(true);
        command
    }

    /// Whether the data directory holds a database cluster.
    pub fn initialized(&self) -> bool {
        self.data_dir.join("PG_VERSION").is_file()
    }

    /// Creates the data directory's parent structure and the socket directory, owned by
    /// the server's user, private.
    pub fn prepare_dirs(&self) -> Result<()> {
        for dir in [&self.data_dir, &self.socket_dir] {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("making {} private", dir.display()))?;
            if let Some((uid, gid)) = self.owner {
                std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                    .with_context(|| format!("giving {} to uid {uid}", dir.display()))?;
            }
        }
        Ok(())
    }

    /// A file only the server's user can read (a password for `initdb`).
    fn private_file(&self, name: &str, text: &str) -> Result<PathBuf> {
        let path = self.socket_dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
        }
        Ok(path)
    }

    /// `initdb`: a new database cluster, the first primary's.
    pub async fn initdb(&self) -> Result<()> {
        self.prepare_dirs()?;
        let password = self.private_file(".superuser-password", &self.superuser_password)?;
        let output = self
            .program("initdb")
            .arg("--pgdata")
            .arg(&self.data_dir)
            .args(["--username", SUPERUSER, "--auth-local=trust"])
            .args([
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--no-instructions",
            ])
            .arg("--pwfile")
            .arg(&password)
            .output()
            .await
            .context("running initdb")?;
        let _ = std::fs::remove_file(&password);
        if !output.status.success() {
            bail!(
                "initdb failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        self.write_base_config()
    }

    /// A libpq passfile with the replication user's password, private to the server's
    /// user.
    fn passfile(&self) -> Result<PathBuf> {
        let escape = |password: &str| password.replace('\\', "\\\\").replace(':', "\\:");
        self.private_file(
            ".pgpass",
            &format!(
                "*:*:*:{REPLICATION_USER}:{}\n*:*:*:{SUPERUSER}:{}\n",
                escape(&self.replication_password),
                escape(&self.superuser_password)
            ),
        )
    }

    /// `pg_rewind` from `upstream`: an old primary's data made a copy of the new primary's
    /// history (what it wrote after they diverged is undone), so it can stream from it.
    /// The server must be stopped; an unclean stop is recovered first by `pg_rewind`
    /// itself.
    pub async fn rewind(&self, upstream: &Upstream) -> Result<()> {
        let source = format!(
            "host={} port={} user={SUPERUSER} dbname=postgres connect_timeout=10",
            upstream.host, upstream.port
        );
        let output = self
            .program("pg_rewind")
            .arg("--target-pgdata")
            .arg(&self.data_dir)
            .arg("--source-server")
            .arg(&source)
            .env("PGPASSFILE", self.passfile()?)
            .output()
            .await
            .context("running pg_rewind")?;
        let said = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            bail!(
                "pg_rewind from {}:{} failed: {}",
                upstream.host,
                upstream.port,
                said.trim()
            );
        }
        if said.contains(SAME_TIMELINE) {
            // Only a data directory that ran as a primary is rewound: on the timeline its
            // source runs, it was promoted beside it from one timeline (a disaster
            // promotion over a switchover's promoted target gives both the same number),
            // or the source was not checkpointed since its promotion. Either way
            // pg_rewind cannot compare the histories, and what this one wrote past the
            // fork would be streamed over: it is copied instead.
            bail!(
                "pg_rewind from {}:{} found this data on the source's timeline ({SAME_TIMELINE}) after it ran as a primary: the histories may have diverged on one timeline number",
                upstream.host,
                upstream.port
            );
        }
        // It copied the source's configuration files: Bulkhead's are written again.
        self.write_base_config()?;
        self.set_was_primary(false)
    }

    /// Moves the data directory aside (kept, never deleted: what it held after the
    /// histories diverged may matter to someone) and returns where it went.
    pub fn set_aside(&self) -> Result<PathBuf> {
        let stamp = jiff::Timestamp::now()
            .strftime("%Y%m%dT%H%M%SZ")
            .to_string();
        let name = format!(
            "{}.diverged-{stamp}",
            self.data_dir
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("pgdata")
        );
        let aside = self.data_dir.with_file_name(name);
        std::fs::rename(&self.data_dir, &aside).with_context(|| {
            format!(
                "moving {} aside to {}",
                self.data_dir.display(),
                aside.display()
            )
        })?;
        Ok(aside)
    }

    /// Whether this data directory last ran as a primary (then, before it follows another
    /// primary, its history may have to be rewound).
    pub fn was_primary(&self) -> bool {
        self.data_dir.join(WAS_PRIMARY_FILE).exists()
    }

    /// Records whether the data directory runs as a primary.
    pub fn set_was_primary(&self, primary: bool) -> Result<()> {
        let path = self.data_dir.join(WAS_PRIMARY_FILE);
        if primary {
            if !path.exists() {
                self.write_owned(&path, "")?;
            }
        } else if path.exists() {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
        Ok(())
    }

    /// `pg_basebackup` from `upstream`: a standby's data directory.
    pub async fn base_backup(&self, upstream: &Upstream) -> Result<()> {
        self.prepare_dirs()?;
        let output = self
            .program("pg_basebackup")
            .arg("--pgdata")
            .arg(&self.data_dir)
            .args(["--host", &upstream.host])
            .args(["--port", &upstream.port.to_string()])
            .args(["--username", REPLICATION_USER])
            .args(["--wal-method=stream", "--checkpoint=fast", "--no-password"])
            .env("PGPASSFILE", self.passfile()?)
            .env("PGCONNECT_TIMEOUT", "10")
            .output()
            .await
            .context("running pg_basebackup")?;
        if !output.status.success() {
            // A half-copied directory would look initialised next time.
            let _ = std::fs::remove_file(self.data_dir.join("PG_VERSION"));
            bail!(
                "pg_basebackup from {}:{} failed: {}",
                upstream.host,
                upstream.port,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        // The copy carries the primary's marker: this one has never been a primary.
        self.set_was_primary(false)?;
        self.write_base_config()
    }

    /// `pg_hba.conf`, and the include of `bulkhead.conf` in `postgresql.conf`.
    fn write_base_config(&self) -> Result<()> {
        let hba = "# Written by bulkhead instance.\n\
                   local all all trust\n\
                   host replication streaming_replica all scram-sha-256\n\
                   host all all all scram-sha-256\n";
        self.write_owned(&self.data_dir.join("pg_hba.conf"), hba)?;
        let conf_path = self.data_dir.join("postgresql.conf");
        let conf = std::fs::read_to_string(&conf_path)
            .with_context(|| format!("reading {}", conf_path.display()))?;
        if !conf.contains("include_if_exists = 'bulkhead.conf'") {
            self.write_owned(
                &conf_path,
                &format!("{conf}\n# Bulkhead's settings (rewritten by the instance manager).\ninclude_if_exists = 'bulkhead.conf'\n"),
            )?;
        }
        Ok(())
    }

    fn write_owned(&self, path: &Path, text: &str) -> Result<()> {
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
        }
        Ok(())
    }

    /// Writes `bulkhead.conf` for `wanted` (a running server reads it on a reload).
    pub fn write_settings(&self, wanted: &Wanted) -> Result<()> {
        let role = wanted.role;
        let upstream = wanted.upstream.as_ref();
        let mut conf = format!(
            "listen_addresses = '{}'\n\
             port = {}\n\
             unix_socket_directories = '{}'\n\
             wal_level = replica\n\
             hot_standby = on\n\
             max_wal_senders = 10\n\
             max_replication_slots = 10\n\
             wal_log_hints = on\n\
             wal_keep_size = '{}'\n\
             # A standby whose upstream refused it (a new primary still creating its\n\
             # slot) tries again after a second, not the default five.\n\
             wal_retrieve_retry_interval = '1s'\n",
            self.listen,
            self.port,
            self.socket_dir.display(),
            self.wal_keep_size
        );
        if let (Role::Standby, Some(upstream)) = (role, upstream) {
            // The password is in a private passfile, never in the configuration.
            let passfile = self.passfile()?;
            // Another cluster's primary has slots and synchronous standby names of its
            // own instances: a replica cluster streams without a slot there, under a
            // name none of them has.
            let name = match (upstream.external, wanted.slot()) {
                (true, _) => EXTERNAL_APPLICATION_NAME.to_string(),
                (false, Some(slot)) => slot,
                (false, None) => "bulkhead".into(),
            };
            conf.push_str(&format!(
                "primary_conninfo = 'host={} port={} user={REPLICATION_USER} passfile={} application_name={name} connect_timeout=5'\n",
                upstream.host,
                upstream.port,
                passfile.display()
            ));
            if let Some(slot) = wanted.slot().filter(|_| !upstream.external) {
                conf.push_str(&format!("primary_slot_name = '{slot}'\n"));
            }
        }
        if role == Role::Primary && wanted.synchronous > 0 && !wanted.standbys.is_empty() {
            let names: Vec<String> = wanted.standbys.iter().map(|s| slot(s)).collect();
            conf.push_str(&format!(
                "synchronous_standby_names = 'ANY {} ({})'\n",
                (wanted.synchronous as usize).min(names.len()),
                names.join(", ")
            ));
        }
        self.write_owned(&self.data_dir.join("bulkhead.conf"), &conf)?;
        Ok(())
    }

    /// [`Server::write_settings`], and for a standby `standby.signal` (PostgreSQL starts
    /// in recovery while it exists), for a primary without it. Only for a stopped
    /// server: a running standby's startup process removes the file itself when it is
    /// promoted, and fails if it is gone.
    pub fn configure(&self, wanted: &Wanted) -> Result<()> {
        self.write_settings(wanted)?;
        let signal = self.data_dir.join("standby.signal");
        match wanted.role {
            Role::Standby => self.write_owned(&signal, "")?,
            Role::Primary => {
                let _ = std::fs::remove_file(&signal);
            }
        }
        Ok(())
    }

    /// Starts `postgres`; its output goes to `log`.
    pub fn start(&self, log: &Path) -> Result<Child> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone()?;
        self.program("postgres")
            .arg("-D")
            .arg(&self.data_dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .context("starting postgres")
    }

    /// Stops a running `postgres` with a fast shutdown (every session ended, nothing
    /// lost), waiting up to `timeout`, then kills it.
    pub async fn stop(child: &mut Child, timeout: Duration) -> Result<()> {
        Self::stop_ending(child, &[], Duration::ZERO, timeout).await
    }

    /// A fast shutdown that ends the WAL senders `senders` (PIDs) if the server has not
    /// exited within `grace`. A fast shutdown sends the shutdown checkpoint to every
    /// connected standby and waits for them to confirm it: a replica cluster that is
    /// reachable gets every last record from the server it streams from (a switchover
    /// waits for exactly that position), while one that is cut off would hold the
    /// shutdown (and a demotion) until `wal_sender_timeout`.
    pub async fn stop_ending(
        child: &mut Child,
        senders: &[i32],
        grace: Duration,
        timeout: Duration,
    ) -> Result<()> {
        if let Some(pid) = child.id() {
            // SIGINT: PostgreSQL's fast shutdown.
            unsafe {
                libc::kill(pid as i32, libc::SIGINT);
            }
        }
        let started = std::time::Instant::now();
        if !senders.is_empty() {
            if let Ok(status) = tokio::time::timeout(grace, child.wait()).await {
                status?;
                return Ok(());
            }
            for pid in senders {
                // SIGTERM ends a WAL sender; the postmaster then finishes the shutdown.
                unsafe {
                    libc::kill(*pid, libc::SIGTERM);
                }
            }
            tracing::warn!(
                ?senders,
                grace_seconds = grace.as_secs_f64(),
                "the shutdown waited for replica clusters' WAL senders past the grace; ended them"
            );
        }
        match tokio::time::timeout(timeout.saturating_sub(started.elapsed()), child.wait()).await {
            Ok(status) => {
                status?;
            }
            Err(_) => {
                child.kill().await?;
            }
        }
        Ok(())
    }

    /// A connection as the superuser over the private socket.
    pub async fn connect(&self) -> Result<tokio_postgres::Client> {
        let mut config = tokio_postgres::Config::new();
        config
            .host_path(&self.socket_dir)
            .port(self.port)
            .user(SUPERUSER)
            .dbname("postgres")
            // The manager's own bookkeeping (slots, roles) never waits for synchronous
            // standbys: a new primary creates the replication role and the slot a standby
            // needs before it can stream, which a commit waiting for that standby would
            // never see. No statement may hold the supervisor (and its self-demotion)
            // for long either.
            .options("-c synchronous_commit=local -c statement_timeout=10000")
            .connect_timeout(Duration::from_secs(3));
        open(&config)
            .await
            .context("connecting to PostgreSQL over its socket")
    }

    /// The database system identifier of the server `client` is connected to: two data
    /// directories with different ones are two databases, and a standby of the one never
    /// streams from the other.
    pub async fn system_identifier(client: &tokio_postgres::Client) -> Result<String> {
        Ok(client
            .query_one(
                "SELECT system_identifier::text FROM pg_control_system()",
                &[],
            )
            .await
            .context("reading the database system identifier")?
            .get(0))
    }

    /// A superuser session on `upstream` over TCP (the password is the Secret's: a replica
    /// cluster's Secrets are its source's), to read its system identifier.
    pub async fn connect_upstream(&self, upstream: &Upstream) -> Result<tokio_postgres::Client> {
        let mut config = tokio_postgres::Config::new();
        config
            .host(&upstream.host)
            .port(upstream.port)
            .user(SUPERUSER)
            .password(&self.superuser_password)
            .dbname("postgres")
            .options("-c statement_timeout=10000")
            .connect_timeout(Duration::from_secs(5));
        open(&config)
            .await
            .with_context(|| format!("connecting to {}:{}", upstream.host, upstream.port))
    }

    /// Whether this standby's WAL receiver streams now.
    pub async fn streaming(client: &tokio_postgres::Client) -> Result<bool> {
        Ok(client
            .query_one(
                "SELECT count(*) > 0 FROM pg_stat_wal_receiver WHERE status = 'streaming'",
                &[],
            )
            .await?
            .get(0))
    }

    /// The server's role and position.
    pub async fn observe(client: &tokio_postgres::Client) -> Result<Observed> {
        let row = client
            .query_one(
                "SELECT pg_is_in_recovery(),
                        CASE WHEN pg_is_in_recovery()
                             THEN coalesce(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::text
                             ELSE pg_current_wal_lsn()::text END,
                        (SELECT timeline_id FROM pg_control_checkpoint())::int",
                &[],
            )
            .await?;
        let recovering: bool = row.get(0);
        let lsn: Option<String> = row.get(1);
        let timeline: Option<i32> = row.get(2);
        Ok(Observed {
            role: if recovering {
                Role::Standby
            } else {
                Role::Primary
            },
            lsn,
            timeline: timeline.map(|t| t as u32),
        })
    }

    /// The PIDs of the WAL senders of replica clusters in other clusters (application
    /// name [`EXTERNAL_APPLICATION_NAME`]), for [`Server::stop_ending`].
    pub async fn external_senders(client: &tokio_postgres::Client) -> Result<Vec<i32>> {
        Ok(client
            .query(
                "SELECT pid FROM pg_stat_replication WHERE application_name = $1",
                &[&EXTERNAL_APPLICATION_NAME],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect())
    }

    /// `pg_promote()`: the standby becomes a primary without a restart.
    pub async fn promote(client: &tokio_postgres::Client) -> Result<()> {
        let row = client.query_one("SELECT pg_promote(true, 60)", &[]).await?;
        let promoted: bool = row.get(0);
        if !promoted {
            bail!("pg_promote did not finish within 60 s");
        }
        Ok(())
    }

    /// The first primary's roles: the replication user (its password set again each time,
    /// so a changed Secret takes effect).
    pub async fn ensure_roles(&self, client: &tokio_postgres::Client) -> Result<()> {
        let exists = client
            .query_opt(
                "SELECT 1 FROM pg_roles WHERE rolname = $1",
                &[&REPLICATION_USER],
            )
            .await?
            .is_some();
        let password = sql_literal(&self.replication_password);
        let statement = if exists {
            format!("ALTER ROLE {REPLICATION_USER} WITH REPLICATION LOGIN PASSWORD {password}")
        } else {
            format!("CREATE ROLE {REPLICATION_USER} WITH REPLICATION LOGIN PASSWORD {password}")
        };
        client.batch_execute(&statement).await?;
        if let Some(app) = &self.app {
            let user = sql_identifier(&app.user);
            let password = sql_literal(&app.password);
            let exists = client
                .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&app.user])
                .await?
                .is_some();
            let verb = if exists { "ALTER" } else { "CREATE" };
            client
                .batch_execute(&format!(
                    "{verb} ROLE {user} WITH LOGIN PASSWORD {password}"
                ))
                .await?;
            let database_exists = client
                .query_opt(
                    "SELECT 1 FROM pg_database WHERE datname = $1",
                    &[&app.database],
                )
                .await?
                .is_some();
            if !database_exists {
                client
                    .batch_execute(&format!(
                        "CREATE DATABASE {} OWNER {user}",
                        sql_identifier(&app.database)
                    ))
                    .await?;
            }
        }
        Ok(())
    }

    /// A physical replication slot for each of `standbys` (the WAL a standby has not
    /// received is kept for it); Bulkhead's slots of instances no longer listed are
    /// dropped when no standby uses them.
    pub async fn ensure_slots(
        &self,
        client: &tokio_postgres::Client,
        standbys: &[String],
    ) -> Result<()> {
        let wanted: Vec<String> = standbys.iter().map(|s| slot(s)).collect();
        let rows = client
            .query(
                "SELECT slot_name::text, active FROM pg_replication_slots WHERE slot_type = 'physical' AND slot_name LIKE $1",
                &[&format!("{SLOT_PREFIX}%")],
            )
            .await?;
        let existing: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        for name in &wanted {
            if !existing.iter().any(|(n, _)| n == name) {
                client
                    .execute(
                        "SELECT pg_create_physical_replication_slot($1, true)",
                        &[name],
                    )
                    .await
                    .with_context(|| format!("creating replication slot {name}"))?;
            }
        }
        for (name, active) in &existing {
            if !active && !wanted.contains(name) {
                client
                    .execute("SELECT pg_drop_replication_slot($1)", &[name])
                    .await
                    .with_context(|| format!("dropping replication slot {name}"))?;
            }
        }
        Ok(())
    }

    /// The highest term this data directory has seen (0 when it has no term file). An
    /// unreadable one is an error, never a term: read as 0 it would let any word promote
    /// this instance.
    pub fn term(&self) -> Result<u64> {
        let path = self.data_dir.join(TERM_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => text.trim().parse().with_context(|| {
                format!(
                    "the term file {} holds {text:?}, not a term",
                    path.display()
                )
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(error) => {
                Err(error).with_context(|| format!("reading the term file {}", path.display()))
            }
        }
    }

    /// Records `term` in the data directory (before acting on it): written to a staged
    /// file, flushed to disk, renamed over the old one, and the directory flushed, so a
    /// crash leaves the old term or the new one, never less.
    pub fn record_term(&self, term: u64) -> Result<()> {
        // fsync through a read-only descriptor flushes the file (or directory) on Linux.
        let flush = |file: &Path| -> Result<()> {
            std::fs::File::open(file)
                .and_then(|f| f.sync_all())
                .with_context(|| format!("flushing {}", file.display()))
        };
        let path = self.data_dir.join(TERM_FILE);
        let staged = self.data_dir.join(format!("{TERM_FILE}.new"));
        self.write_owned(&staged, &format!("{term}\n"))?;
        flush(&staged)?;
        std::fs::rename(&staged, &path).with_context(|| format!("writing {}", path.display()))?;
        flush(&self.data_dir)
    }
}

/// A SQL string literal.
fn sql_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// A quoted SQL identifier.
fn sql_identifier(value: &str) -> String {
    format!("\"{}\"", value.replace('"', "\"\""))
}

/// What `pg_rewind` says when the target's timeline is the source's (then it rewinds
/// nothing, whatever each wrote on that timeline).
const SAME_TIMELINE: &str = "source and target cluster are on the same timeline";

/// The newest PostgreSQL's programs on a Debian machine (`/usr/lib/postgresql/<n>/bin`).
pub fn find_bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// A session of `config`, its connection driven in the background.
async fn open(config: &tokio_postgres::Config) -> Result<tokio_postgres::Client> {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_in(dir: &Path) -> Server {
        Server {
            bin_dir: dir.into(),
            data_dir: dir.into(),
            socket_dir: dir.into(),
            listen: "127.0.0.1".into(),
            port: 5432,
            owner: None,
            superuser_password: String::new(),
            replication_password: String::new(),
            wal_keep_size: "64MB".into(),
            app: None,
        }
    }

    #[test]
    fn a_term_file_is_replaced_whole_and_an_unreadable_one_is_no_term() {
        let dir = std::env::temp_dir().join(format!("bulkhead-term-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let server = server_in(&dir);
        assert_eq!(server.term().unwrap(), 0, "no file: no term seen yet");
        server.record_term(7).unwrap();
        assert_eq!(server.term().unwrap(), 7);
        assert!(!dir.join(format!("{TERM_FILE}.new")).exists());
        // A torn or damaged file is an error, not term 0 (which any word would beat).
        std::fs::write(dir.join(TERM_FILE), "7\u{0}garbage").unwrap();
        let error = format!("{:#}", server.term().unwrap_err());
        assert!(error.contains("not a term"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn literals_are_quoted() {
        assert_eq!(sql_literal("it's"), "'it''s'");
    }
}
