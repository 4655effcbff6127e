//! `bulkhead instance`: the database container's entrypoint. It creates the data directory
//! (`initdb` for a primary, `pg_basebackup` from the primary for a standby), runs and
//! supervises `postgres`, and carries out the role the agent decides, which the agent sends
//! over the instance's HTTP API (`PUT /desired`, every few seconds). It reports the role,
//! the WAL position and the term it has seen (`GET /status`).
//!
//! The instance decides nothing on its own but this: when the agent has not spoken for
//! longer than `--agent-lease`, a primary demotes itself to a hot standby (the same clock
//! rule as the agent's fence). It starts an existing data directory as a standby until
//! the agent says otherwise, so a restarted old primary never takes a write first.

pub mod client;
pub mod postgres;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, Response, StatusCode};
use tokio::process::Child;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::api::instance::{Desired, InstanceStatus, Role, Upstream};
use crate::hub::parse_duration;
use postgres::Server;
pub use postgres::Wanted;

/// How often the instance compares what runs with what the agent wants.
const TICK: Duration = Duration::from_secs(1);

/// Largest request body the API reads.
const MAX_BODY_BYTES: usize = 64 * 1024;

/// How long a request may take to send its headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// How late a command can reach the instance after its connection was opened: the API
/// reads one request per connection and drops a connection whose request has not come in
/// within [`HEADER_TIMEOUT`] of it opening. A command delayed by a cut (its packets
/// retransmitted after the heal) is never acted on later than this after it was sent; the
/// agent counts a primary's lease from then for a command it got no answer to.
pub const COMMAND_DELIVERY_BOUND: Duration = HEADER_TIMEOUT;

#[derive(clap::Args, Clone, Debug)]
pub struct InstanceOptions {
    /// The data directory.
    #[arg(long, env = "PGDATA")]
    pub pgdata: PathBuf,
    /// PostgreSQL's programs (default: the newest /usr/lib/postgresql/<n>/bin).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// The server's private Unix socket directory.
    #[arg(long, default_value = "/run/bulkhead/postgresql")]
    pub socket_dir: PathBuf,
    /// PostgreSQL's `listen_addresses`.
    #[arg(long, default_value = "*", env = "BULKHEAD_LISTEN_ADDRESSES")]
    pub listen_addresses: String,
    /// PostgreSQL's port.
    #[arg(long, default_value_t = 5432)]
    pub port: u16,
    /// The instance API (status for everyone, role changes for the agent's token).
    #[arg(long, default_value = "0.0.0.0:8000")]
    pub api_address: SocketAddr,
    /// A directory with the files `superuser-password`, `replication-password` and
    /// `token` (the database's Secret, mounted).
    #[arg(long)]
    pub secrets_dir: PathBuf,
    /// A directory with the application's credentials (`username`, `password`, `dbname`:
    /// the database's `<name>-app` Secret, mounted): a primary creates the user and its
    /// database when they are missing.
    #[arg(long)]
    pub app_secret_dir: Option<PathBuf>,
    /// A primary whose agent has not spoken for this long demotes itself.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub agent_lease: Duration,
    /// Run PostgreSQL as this user when the instance runs as root (PostgreSQL refuses to
    /// run as root; the lab runs database pods as host processes). Default when root:
    /// `postgres`.
    #[arg(long)]
    pub run_as: Option<String>,
    /// PostgreSQL's log (default: `postgres.log` next to the data directory).
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// `wal_keep_size`: WAL kept past checkpoints, so an old primary can be rewound to a
    /// new one's history instead of copied again.
    #[arg(long, default_value = "256MB")]
    pub wal_keep_size: String,
}

/// What the API and the supervisor share.
#[derive(Default)]
struct State {
    desired: Option<Desired>,
    heard_at: Option<Instant>,
    status: InstanceStatus,
    /// Since when this standby has not streamed from its upstream (None: it streams, or
    /// is no standby with an upstream).
    not_streaming_since: Option<Instant>,
    /// When its data's identity was last compared with the upstream's.
    identity_checked_at: Option<Instant>,
    /// An old primary's last attempt to follow its upstream failed (it did not answer):
    /// not before this is it tried again.
    follow_retry_at: Option<Instant>,
}

/// How long a demotion's fast shutdown waits for the replica clusters in other clusters
/// to confirm its last WAL (a reachable one does in milliseconds) before it ends their
/// WAL senders: one cut off would hold it until `wal_sender_timeout`.
const EXTERNAL_SENDER_GRACE: Duration = Duration::from_secs(2);

/// How long an old primary that could not follow its upstream waits before it tries
/// again (it runs as a hot standby of what it has meanwhile).
const FOLLOW_RETRY: Duration = Duration::from_secs(15);

/// How long a standby may fail to stream before its data's identity is compared with its
/// upstream's (and how often at most).
const IDENTITY_CHECK_AFTER: Duration = Duration::from_secs(10);

/// The running instance manager.
pub struct Instance {
    server: Server,
    log: PathBuf,
    /// Why the data directory's term file could not be read at start: the instance then
    /// refuses to be a primary (it cannot know which terms it has seen).
    term_unreadable: Option<String>,
    agent_lease: Duration,
    token: String,
    state: Mutex<State>,
    changed: Notify,
    /// The replication user exists with the Secret's password (checked once per process,
    /// on the first primary it runs: each check is a write).
    roles_ensured: std::sync::atomic::AtomicBool,
}

/// PostgreSQL's log is rotated past this size: at most twice this on disk.
const LOG_ROTATE_BYTES: u64 = 64 * 1024 * 1024;

/// Past `limit` bytes, copies `log` to `<log>.1` (replacing the previous one) and empties
/// it in place: the server keeps writing to the file it opened for appending, so nothing
/// needs to reopen it (logrotate's copytruncate). Lines written between the copy and the
/// truncation are lost; the log is for reading, not for recovery.
fn rotate_log(log: &std::path::Path, limit: u64) -> std::io::Result<bool> {
    match std::fs::metadata(log) {
        Ok(meta) if meta.len() > limit => {}
        Ok(_) => return Ok(false),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(error),
    }
    let mut kept = log.as_os_str().to_owned();
    kept.push(".1");
    std::fs::copy(log, &kept)?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(log)?
        .set_len(0)?;
    Ok(true)
}

/// The server is stopped for a rewind or a copy: nothing it reported before holds (not
/// ready, no role, no WAL position), so the agent never takes it for a standby it could
/// promote, or for one whose WAL is known, while its data is being replaced.
fn not_serving(status: &mut InstanceStatus) {
    status.ready = false;
    status.role = None;
    status.lsn = None;
    status.timeline = None;
}

/// Runs the instance manager until SIGTERM (then stops PostgreSQL with a fast shutdown).
pub async fn run(options: InstanceOptions) -> Result<()> {
    let instance = Arc::new(Instance::new(&options)?);
    let listener = tokio::net::TcpListener::bind(options.api_address)
        .await
        .with_context(|| format!("binding {}", options.api_address))?;
    let shutdown = CancellationToken::new();
    crate::process::spawn_signal_handler(shutdown.clone());
    tracing::info!(api = %listener.local_addr()?, data = %options.pgdata.display(), "instance manager started");
    let api = tokio::spawn(serve(instance.clone(), listener, shutdown.clone()));
    instance.supervise(shutdown).await;
    api.abort();
    Ok(())
}

/// `bulkhead copy-binary`: this executable, copied to `destination` (a database pod's init
/// container puts it where the PostgreSQL image's container runs it).
pub fn copy_binary(destination: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let source = std::env::current_exe().context("finding this executable")?;
    if let Some(parent) = destination.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    // Written beside and renamed: a container restart never runs a half-written copy.
    let partial = destination.with_extension("partial");
    std::fs::copy(&source, &partial)
        .with_context(|| format!("copying {} to {}", source.display(), partial.display()))?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&partial, destination).with_context(|| {
        format!(
            "renaming {} to {}",
            partial.display(),
            destination.display()
        )
    })?;
    println!("copied {} to {}", source.display(), destination.display());
    Ok(())
}

fn read_secret(dir: &std::path::Path, name: &str) -> Result<String> {
    let path = dir.join(name);
    Ok(std::fs::read_to_string(&path)
        .with_context(|| {
            format!(
                "reading {} (the database's Secret, key {name})",
                path.display()
            )
        })?
        .trim()
        .to_string())
}

/// The uid and gid of a user by name.
fn user_ids(name: &str) -> Result<(u32, u32)> {
    let c_name = std::ffi::CString::new(name)?;
    // SAFETY: getpwnam returns a pointer into static storage or null; read at once.
    let entry = unsafe { libc::getpwnam(c_name.as_ptr()) };
    if entry.is_null() {
        anyhow::bail!("--run-as {name}: no such user");
    }
    let entry = unsafe { &*entry };
    Ok((entry.pw_uid, entry.pw_gid))
}

impl Instance {
    pub fn new(options: &InstanceOptions) -> Result<Self> {
        let bin_dir = match &options.bin_dir {
            Some(dir) => dir.clone(),
            None => postgres::find_bin_dir().context(
                "no PostgreSQL programs under /usr/lib/postgresql/<n>/bin; install PostgreSQL or pass --bin-dir",
            )?,
        };
        // PostgreSQL refuses to run as root: as root, run it as `postgres` unless told.
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let run_as = options
            .run_as
            .clone()
            .or_else(|| root.then(|| "postgres".to_string()));
        let owner = run_as.as_deref().map(user_ids).transpose()?;
        let app = match &options.app_secret_dir {
            Some(dir) => Some(postgres::AppUser {
                user: read_secret(dir, "username")?,
                password: read_secret(dir, "password")?,
                database: read_secret(dir, "dbname")?,
            }),
            None => None,
        };
        let server = Server {
            bin_dir,
            data_dir: options.pgdata.clone(),
            socket_dir: options.socket_dir.clone(),
            listen: options.listen_addresses.clone(),
            port: options.port,
            owner,
            superuser_password: read_secret(&options.secrets_dir, "superuser-password")?,
            replication_password: read_secret(&options.secrets_dir, "replication-password")?,
            wal_keep_size: options.wal_keep_size.clone(),
            app,
        };
        let log = options.log_file.clone().unwrap_or_else(|| {
            options
                .pgdata
                .parent()
                .unwrap_or(&options.pgdata)
                .join("postgres.log")
        });
        let (term, term_unreadable) = match server.term() {
            Ok(term) => (term, None),
            Err(error) => {
                let why = format!(
                    "{error:#}: this instance does not act as a primary until it is restarted with a readable term file (it follows as a standby meanwhile)"
                );
                tracing::error!(%why, "the term file cannot be read");
                (0, Some(why))
            }
        };
        Ok(Instance {
            server,
            log,
            term_unreadable,
            agent_lease: options.agent_lease,
            token: read_secret(&options.secrets_dir, "token")?,
            state: Mutex::new(State {
                status: InstanceStatus {
                    term,
                    message: "waiting for the agent".into(),
                    ..Default::default()
                },
                ..Default::default()
            }),
            changed: Notify::new(),
            roles_ensured: Default::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The status as last observed.
    pub fn status(&self) -> InstanceStatus {
        self.lock().status.clone()
    }

    /// The agent's word. Refused when its term is lower than one the instance has seen.
    pub fn set_desired(&self, desired: Desired) -> std::result::Result<InstanceStatus, String> {
        if let Some(why) = &self.term_unreadable
            && desired.role == Role::Primary
        {
            return Err(why.clone());
        }
        let mut state = self.lock();
        if desired.term < state.status.term {
            return Err(format!(
                "term {} is older than term {} this instance has seen; nothing changed",
                desired.term, state.status.term
            ));
        }
        if desired.term > state.status.term {
            if self.server.initialized()
                && let Err(error) = self.server.record_term(desired.term)
            {
                return Err(format!("cannot record term {}: {error:#}", desired.term));
            }
            state.status.term = desired.term;
        }
        if state.desired.as_ref() != Some(&desired) {
            tracing::info!(role = %desired.role, term = desired.term, reason = %desired.reason, "the agent's word");
        }
        state.desired = Some(desired);
        state.heard_at = Some(Instant::now());
        let status = state.status.clone();
        drop(state);
        self.changed.notify_one();
        Ok(status)
    }

    /// What to run now: the agent's word, or a standby once the agent has been silent
    /// past the lease (second: true). None before the agent ever spoke.
    fn effective(&self) -> Option<(Wanted, bool)> {
        let state = self.lock();
        let desired = state.desired.as_ref()?;
        let fresh = state
            .heard_at
            .is_some_and(|at| at.elapsed() < self.agent_lease);
        let mut wanted = Wanted::from(desired);
        if !fresh {
            wanted.role = Role::Standby;
            wanted.standbys.clear();
            wanted.synchronous = 0;
        }
        Some((wanted, !fresh))
    }

    fn report(&self, change: impl FnOnce(&mut InstanceStatus)) {
        change(&mut self.lock().status);
    }

    /// Keeps PostgreSQL in the role the agent wants until `shutdown`.
    pub async fn supervise(&self, shutdown: CancellationToken) {
        let mut child: Option<Child> = None;
        let mut running: Option<Wanted> = None;
        loop {
            if let Err(error) = self.step(&mut child, &mut running).await {
                tracing::warn!(error = %format!("{error:#}"), "instance");
                self.report(|s| s.message = format!("{error:#}"));
            }
            if let Err(error) = rotate_log(&self.log, LOG_ROTATE_BYTES) {
                tracing::warn!(error = %format!("{error:#}"), log = %self.log.display(), "cannot rotate PostgreSQL's log");
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.changed.notified() => {}
                _ = tokio::time::sleep(TICK) => {}
            }
        }
        if let Some(mut child) = child {
            let _ = Server::stop(&mut child, Duration::from_secs(30)).await;
        }
    }

    async fn step(&self, child: &mut Option<Child>, running: &mut Option<Wanted>) -> Result<()> {
        let effective = self.effective();
        let lost = effective.as_ref().is_some_and(|(_, lost)| *lost);
        self.report(|s| s.agent_lost = lost);
        if !self.server.initialized() {
            let bootstrap = self.lock().desired.as_ref().is_some_and(|d| d.bootstrap);
            match effective
                .as_ref()
                .map(|(w, lost)| (w.role, w.upstream.as_ref(), *lost))
            {
                Some((role, _, false)) if role == Role::Primary || bootstrap => {
                    self.report(|s| s.message = "initdb: a new database".into());
                    self.server.initdb().await?;
                    if role != Role::Primary {
                        // Created fenced: its users must exist before a standby can copy
                        // it, so it runs once as a primary (listening on its socket only)
                        // before it starts as the standby it was told to be.
                        self.create_roles_offline().await?;
                    }
                }
                Some((Role::Standby, Some(upstream), _)) => {
                    self.report(|s| {
                        not_serving(s);
                        s.message = format!(
                            "copying the primary's data from {}:{} (pg_basebackup)",
                            upstream.host, upstream.port
                        )
                    });
                    self.server.base_backup(upstream).await?;
                }
                _ => {
                    self.report(|s| {
                        s.message =
                            "no data yet: waiting for the agent to name this instance's role".into()
                    });
                    return Ok(());
                }
            }
            let term = self.lock().status.term;
            self.server.record_term(term)?;
        }
        // Until the agent speaks, an existing data directory runs as a standby.
        let wanted = effective.map(|(w, _)| w).unwrap_or(Wanted {
            role: Role::Standby,
            upstream: None,
            name: String::new(),
            standbys: vec![],
            synchronous: 0,
        });
        let exited = match child.as_mut() {
            None => true,
            Some(c) => c.try_wait()?.is_some(),
        };
        if exited {
            if child.is_some() {
                tracing::warn!("postgres exited; starting it again");
            }
            self.server.prepare_dirs()?;
            if wanted.role == Role::Standby
                && let Some(upstream) = &wanted.upstream
                && self.server.was_primary()
                && self.follow_due()
                && !self.try_follow(upstream).await
            {
                return Ok(());
            }
            self.server.configure(&wanted)?;
            *child = Some(self.server.start(&self.log)?);
            let role = wanted.role;
            *running = Some(wanted);
            self.report(|s| {
                s.ready = false;
                s.message = format!("starting postgres as {role}");
            });
            return Ok(());
        }
        let client = match self.server.connect().await {
            Ok(client) => client,
            Err(error) => {
                self.report(|s| {
                    s.ready = false;
                    s.message = format!("postgres does not answer yet: {error:#}");
                });
                return Ok(());
            }
        };
        let observed = Server::observe(&client).await?;
        if observed.role == Role::Primary
            && !self
                .roles_ensured
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            self.server.ensure_roles(&client).await?;
            self.roles_ensured
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        match (wanted.role, observed.role) {
            (Role::Primary, Role::Standby) => {
                tracing::info!("promoting (pg_promote)");
                self.report(|s| s.message = "promoting".into());
                // The settings a primary needs (synchronous standbys) before it takes
                // its first write.
                self.server.write_settings(&wanted)?;
                client.batch_execute("SELECT pg_reload_conf()").await?;
                Server::promote(&client).await?;
                // A checkpoint on the new timeline before anyone follows: pg_rewind reads
                // the timeline from the source's control file, which a promotion updates
                // only at its next checkpoint (until then an old primary would find "the
                // same timeline, no rewind required" and never stream).
                client.batch_execute("CHECKPOINT").await?;
                // The standbys' slots at once: a synchronous commit waits for a standby
                // that can only stream once its slot is here.
                self.server.ensure_slots(&client, &wanted.standbys).await?;
                *running = Some(wanted.clone());
            }
            (Role::Standby, Role::Primary) => {
                let why = if lost {
                    "the agent has been silent past the lease"
                } else {
                    "the agent demotes it"
                };
                tracing::warn!(
                    reason = why,
                    "demoting to a hot standby (fast shutdown, restart in recovery)"
                );
                self.report(|s| {
                    s.ready = false;
                    s.message = format!("demoting: {why}");
                });
                let senders = match tokio::time::timeout(
                    Duration::from_secs(2),
                    Server::external_senders(&client),
                )
                .await
                {
                    Ok(Ok(senders)) => senders,
                    Ok(Err(error)) => {
                        tracing::warn!(error = %format!("{error:#}"), "cannot list the replica clusters' WAL senders; the shutdown may wait for them");
                        vec![]
                    }
                    Err(_) => {
                        tracing::warn!(
                            "listing the replica clusters' WAL senders took over 2 s; the shutdown may wait for them"
                        );
                        vec![]
                    }
                };
                drop(client);
                if let Some(mut stopped) = child.take() {
                    Server::stop_ending(
                        &mut stopped,
                        &senders,
                        EXTERNAL_SENDER_GRACE,
                        Duration::from_secs(30),
                    )
                    .await?;
                }
                if let Some(upstream) = &wanted.upstream
                    && !self.try_follow(upstream).await
                {
                    return Ok(());
                }
                self.server.configure(&wanted)?;
                *child = Some(self.server.start(&self.log)?);
                *running = Some(wanted);
                return Ok(());
            }
            (Role::Standby, Role::Standby)
                if wanted.upstream.is_some() && self.server.was_primary() && self.follow_due() =>
            {
                // A fenced old primary (a standby with nothing to follow) now told to
                // follow another primary: its history may have diverged, so it stops and
                // is rewound first, as a demotion would be.
                drop(client);
                if let Some(mut stopped) = child.take() {
                    Server::stop(&mut stopped, Duration::from_secs(30)).await?;
                }
                if let Some(upstream) = &wanted.upstream
                    && !self.try_follow(upstream).await
                {
                    return Ok(());
                }
                self.server.configure(&wanted)?;
                *child = Some(self.server.start(&self.log)?);
                *running = Some(wanted);
                return Ok(());
            }
            _ if running.as_ref() != Some(&wanted) => {
                // Same role, other settings (a new primary to follow, other synchronous
                // standbys): they reload without a restart.
                self.server.write_settings(&wanted)?;
                client.batch_execute("SELECT pg_reload_conf()").await?;
                *running = Some(wanted.clone());
            }
            _ => {}
        }
        if observed.role == Role::Standby
            && wanted.role == Role::Standby
            && let Some(upstream) = wanted.upstream.clone()
            && self.holds_another_database(&client, &upstream).await
        {
            // Another database's data (a cluster made a replica cluster, a standby of a
            // primary that was copied again): copied anew, the old directory kept beside.
            drop(client);
            if let Some(mut stopped) = child.take() {
                Server::stop(&mut stopped, Duration::from_secs(30)).await?;
            }
            let aside = self.server.set_aside()?;
            tracing::warn!(kept = %aside.display(), host = %upstream.host, "this data is another database's than the upstream's; copying the upstream's (the old data directory is kept)");
            self.report(|s| {
                not_serving(s);
                s.message = format!(
                    "copying {}:{} with pg_basebackup: this data was another database's (kept in {})",
                    upstream.host,
                    upstream.port,
                    aside.display()
                )
            });
            self.server.base_backup(&upstream).await?;
            let term = self.lock().status.term;
            self.server.record_term(term)?;
            *running = None;
            return Ok(());
        }
        if (observed.role == Role::Primary && wanted.role == Role::Primary)
            || (observed.role == Role::Standby && !wanted.standbys.is_empty())
        {
            // A replica cluster's designated primary keeps the slots of the standbys
            // that cascade from it, as a primary does.
            self.server.ensure_slots(&client, &wanted.standbys).await?;
        }
        let observed = Server::observe(&client).await?;
        if observed.role == Role::Primary {
            self.server.set_was_primary(true)?;
        }
        self.report(|s| {
            s.role = Some(observed.role);
            s.ready = true;
            s.lsn = observed.lsn.clone();
            s.timeline = observed.timeline;
            s.message = match (observed.role, lost) {
                (Role::Standby, true) => {
                    "a hot standby: the agent has been silent past the lease".into()
                }
                (role, _) => format!("running as {role}"),
            };
        });
        Ok(())
    }
}

impl Instance {
    /// Whether this standby, not streaming for [`IDENTITY_CHECK_AFTER`], holds another
    /// database than `upstream` (their system identifiers differ). Checked at most that
    /// often; false while either cannot be read.
    async fn holds_another_database(
        &self,
        client: &tokio_postgres::Client,
        upstream: &Upstream,
    ) -> bool {
        let now = Instant::now();
        if Server::streaming(client).await.unwrap_or(true) {
            self.lock().not_streaming_since = None;
            return false;
        }
        {
            let mut state = self.lock();
            let since = *state.not_streaming_since.get_or_insert(now);
            if now.duration_since(since) < IDENTITY_CHECK_AFTER
                || state
                    .identity_checked_at
                    .is_some_and(|at| now.duration_since(at) < IDENTITY_CHECK_AFTER)
            {
                return false;
            }
            state.identity_checked_at = Some(now);
        }
        let own = Server::system_identifier(client).await;
        let theirs = match self.server.connect_upstream(upstream).await {
            Ok(source) => Server::system_identifier(&source).await,
            Err(error) => Err(error),
        };
        match (own, theirs) {
            (Ok(own), Ok(theirs)) => {
                if own != theirs {
                    tracing::info!(own, theirs, host = %upstream.host, "the upstream is another database");
                }
                own != theirs
            }
            (own, theirs) => {
                tracing::debug!(?own, ?theirs, "comparing system identifiers");
                false
            }
        }
    }

    /// Makes a stopped old primary's data follow `upstream`: `pg_rewind` (what it wrote
    /// after the histories diverged is undone; the new primary's history wins).
    /// Starts a new database as a primary reachable on its Unix socket only, creates the
    /// replication and application roles, and stops it.
    async fn create_roles_offline(&self) -> Result<()> {
        let mut server = self.server.clone();
        server.listen = String::new();
        server.prepare_dirs()?;
        server.configure(&Wanted {
            role: Role::Primary,
            upstream: None,
            name: String::new(),
            standbys: vec![],
            synchronous: 0,
        })?;
        let mut child = server.start(&self.log)?;
        let result = async {
            let deadline = Instant::now() + Duration::from_secs(60);
            let client = loop {
                match server.connect().await {
                    Ok(client) => break client,
                    Err(error) if Instant::now() > deadline => return Err(error),
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            };
            server.ensure_roles(&client).await
        }
        .await;
        Server::stop(&mut child, Duration::from_secs(30)).await?;
        result.context("creating the roles of a database created read-only")
    }

    /// Whether an old primary may try to follow its upstream now.
    fn follow_due(&self) -> bool {
        self.lock()
            .follow_retry_at
            .is_none_or(|at| Instant::now() >= at)
    }

    /// [`Instance::follow`]; on a failure the next attempt waits [`FOLLOW_RETRY`]. Whether
    /// the server can start now: its data is there (rewound, copied, or left as it was
    /// because the upstream did not answer); false while a copy is still missing (the
    /// next round copies it).
    async fn try_follow(&self, upstream: &Upstream) -> bool {
        match self.follow(upstream).await {
            Ok(()) => {
                self.lock().follow_retry_at = None;
            }
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "following the upstream failed; running as a hot standby of what it has, trying again in {}s", FOLLOW_RETRY.as_secs());
                self.lock().follow_retry_at = Some(Instant::now() + FOLLOW_RETRY);
            }
        }
        self.server.initialized()
    }

    async fn follow(&self, upstream: &Upstream) -> Result<()> {
        self.report(|s| {
            not_serving(s);
            s.message = format!(
                "rewinding to the history of {}:{} (pg_rewind)",
                upstream.host, upstream.port
            )
        });
        tracing::info!(host = %upstream.host, port = upstream.port, "pg_rewind: following a new primary");
        let Err(error) = self.server.rewind(upstream).await else {
            return Ok(());
        };
        // Only an upstream that answers is copied: one that does not may be starting, cut
        // off or mistyped (`replicaOf`), and the data stays as it is until it answers. A
        // rewind that never connected changed nothing; one that failed later may have
        // left the data half rewound, which only a copy mends.
        if never_connected(&format!("{error:#}"))
            && let Err(unreachable) = self.server.connect_upstream(upstream).await
        {
            self.report(|s| {
                s.message = format!(
                    "cannot follow {}:{}: pg_rewind failed and it does not answer ({unreachable:#}); the data is left as it is, trying again",
                    upstream.host, upstream.port
                )
            });
            bail!(
                "pg_rewind from {}:{} failed ({error:#}) and it does not answer ({unreachable:#}): the data is left as it is",
                upstream.host,
                upstream.port
            );
        }
        // Re-cloned instead: the old directory is kept beside the new one.
        let aside = self.server.set_aside()?;
        tracing::warn!(error = %format!("{error:#}"), kept = %aside.display(), "pg_rewind failed; copying the new primary's data instead (the old data directory is kept)");
        self.report(|s| {
            not_serving(s);
            s.message = format!(
                "pg_rewind failed ({error:#}); copying {}:{} with pg_basebackup, the old data kept in {}",
                upstream.host,
                upstream.port,
                aside.display()
            )
        });
        self.server.base_backup(upstream).await?;
        let term = self.lock().status.term;
        self.server.record_term(term)
    }
}

/// Whether a `pg_rewind` error says it could not connect to its source (libpq's
/// "connection to server at ... failed", or "could not connect"): then it changed nothing.
fn never_connected(error: &str) -> bool {
    (error.contains("connection to server") && error.contains("failed"))
        || error.contains("could not connect")
}

/// The instance API's listener: the agent, a connection a round.
const INSTANCE_LIMITS: crate::server::ConnectionLimits = crate::server::ConnectionLimits {
    max_connections: 64,
    header_read_timeout: HEADER_TIMEOUT,
    keep_alive_interval: Duration::from_secs(10),
    idle_timeout: Duration::from_secs(60),
    max_age: Duration::from_secs(300),
};

/// Serves the instance API until `shutdown`.
async fn serve(
    instance: Arc<Instance>,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) {
    crate::server::serve_limited(
        listener,
        INSTANCE_LIMITS,
        "instance API",
        |stream| async move { Some(stream) },
        move || {
            let instance = instance.clone();
            hyper::service::service_fn(move |request| {
                let instance = instance.clone();
                async move { Ok::<_, std::convert::Infallible>(respond(&instance, request).await) }
            })
        },
        shutdown,
    )
    .await;
}

async fn respond(
    instance: &Instance,
    request: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/healthz") => reply(StatusCode::OK, "ok\n".into()),
        (&Method::GET, "/readyz") => {
            let status = instance.status();
            if status.ready {
                reply(StatusCode::OK, "ok\n".into())
            } else {
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {}\n", status.message),
                )
            }
        }
        (&Method::GET, "/status") => json(StatusCode::OK, &instance.status()),
        (&Method::PUT, "/desired") => {
            let authorized = request
                .headers()
                .get(crate::api::instance::TOKEN_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .is_some_and(|token| constant_time_eq(token.as_bytes(), instance.token.as_bytes()));
            if !authorized {
                return reply(
                    StatusCode::UNAUTHORIZED,
                    "a role change needs the agent's token (Authorization: Bearer ...)\n".into(),
                );
            }
            let body = match Limited::new(request.into_body(), MAX_BODY_BYTES)
                .collect()
                .await
            {
                Ok(body) => body.to_bytes(),
                Err(error) => {
                    return reply(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!("cannot read the body (at most {MAX_BODY_BYTES} bytes): {error}\n"),
                    );
                }
            };
            let desired: Desired = match serde_json::from_slice(&body) {
                Ok(desired) => desired,
                Err(error) => {
                    return reply(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "the body is not a desired state ({{\"role\": \"primary\"|\"standby\", \"term\": N, \"upstream\": {{\"host\", \"port\"}}}}): {error}\n"
                        ),
                    );
                }
            };
            match instance.set_desired(desired) {
                Ok(status) => json(StatusCode::OK, &status),
                Err(message) => reply(StatusCode::CONFLICT, format!("{message}\n")),
            }
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "not found; try GET /status, /healthz, /readyz or PUT /desired\n".into(),
        ),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn reply(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Full<Bytes>> {
    let mut response = reply(status, serde_json::to_string(value).unwrap_or_default());
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_copied_aside_and_emptied_past_its_limit() {
        let dir = std::env::temp_dir().join(format!("bulkhead-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("postgres.log");
        std::fs::write(&log, "0123456789").unwrap();
        assert!(!rotate_log(&log, 10).unwrap(), "at the limit: kept");
        // A writer that appends (as the server does) goes on after the rotation.
        let mut writer = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        std::io::Write::write_all(&mut writer, b"abc").unwrap();
        assert!(rotate_log(&log, 10).unwrap());
        assert_eq!(
            std::fs::read_to_string(dir.join("postgres.log.1")).unwrap(),
            "0123456789abc"
        );
        std::io::Write::write_all(&mut writer, b"next").unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "next");
        assert!(!rotate_log(&dir.join("missing.log"), 10).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
