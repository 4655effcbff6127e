//! The member registry: watches MemberClusters and the Secrets in `bulkhead-system`,
//! builds one `kube::Client` per member from its kubeconfig Secret, and publishes the set
//! as an [`ArcSwap`] snapshot that every hub controller loads without locks.
//!
//! A client is rebuilt only when its Secret changes (uid or resourceVersion), so rotated
//! credentials take effect without a restart and unchanged members keep their
//! connections. A member whose Secret is missing or unusable is still in the snapshot,
//! with the reason instead of a client, so health can report `CredentialsInvalid`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Config, ResourceExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::member_cluster::ProbeSpec;
use crate::api::{MemberCluster, SYSTEM_NAMESPACE};

/// The key of the member kubeconfig in its Secret.
pub const KUBECONFIG_KEY: &str = "kubeconfig";

/// How long a member client may take to open a TCP+TLS connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long any one request to a member may wait for its response headers. Watches are
/// unaffected once their headers arrived; their body has no deadline.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests in flight per member; more wait their turn, so one slow member cannot pile
/// up unbounded work in the hub.
pub const MAX_REQUESTS_IN_FLIGHT: usize = 32;

/// A usable connection to a member.
#[derive(Clone)]
pub struct MemberConnection {
    /// Bulk traffic: copy applies and deletes, copy watches, capacity lists.
    pub client: Client,
    /// Control traffic: health probes and fencing-lease renewals. Its own connections
    /// and its own concurrency limit, so a burst of applies can never delay a probe (a
    /// healthy member would look unhealthy) or a lease renewal (databases would fence).
    pub control: Client,
    /// The API server URL from the kubeconfig.
    pub server: String,
    /// `uid/resourceVersion` of the Secret the client was built from.
    pub secret_version: String,
    /// The kubeconfig the clients were built from (the token renewal rewrites it).
    pub kubeconfig: Arc<str>,
}

/// One member as the hub knows it.
#[derive(Clone)]
pub struct MemberHandle {
    pub name: String,
    pub zone: String,
    pub region: Option<String>,
    pub probe: ProbeSpec,
    /// The MemberCluster as last seen by the watch.
    pub object: Arc<MemberCluster>,
    /// The connection, or why the hub cannot build one (missing or bad Secret).
    pub connection: Result<MemberConnection, String>,
}

impl MemberHandle {
    /// The member's client for bulk traffic, when its credentials could be loaded.
    pub fn client(&self) -> Option<&Client> {
        self.connection.as_ref().ok().map(|c| &c.client)
    }

    /// The member's client for probes and lease renewals (see [`MemberConnection`]).
    pub fn control_client(&self) -> Option<&Client> {
        self.connection.as_ref().ok().map(|c| &c.control)
    }
}

/// The set of members, by name: what readers load from [`Registry::snapshot`].
pub type MemberSnapshot = Arc<HashMap<String, MemberHandle>>;

/// The registry's published state. Cheap to clone; readers never lock.
#[derive(Clone)]
pub struct Registry {
    members: Arc<ArcSwap<HashMap<String, MemberHandle>>>,
    changed: watch::Sender<u64>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            members: Arc::new(ArcSwap::from_pointee(HashMap::new())),
            changed: watch::Sender::new(0),
        }
    }
}

impl Registry {
    /// The current set of members.
    pub fn snapshot(&self) -> MemberSnapshot {
        self.members.load_full()
    }

    /// One member, if registered.
    pub fn get(&self, name: &str) -> Option<MemberHandle> {
        self.members.load().get(name).cloned()
    }

    /// A receiver that wakes whenever a new snapshot is published.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Publishes a new snapshot (tests and the registry controller).
    pub fn publish(&self, members: HashMap<String, MemberHandle>) {
        self.members.store(Arc::new(members));
        self.changed.send_modify(|generation| *generation += 1);
    }
}

/// Builds a member client from kubeconfig text, with short timeouts and bounded
/// concurrency so a partitioned member fails fast and alone.
pub async fn client_from_kubeconfig(text: &str) -> Result<(Client, String), String> {
    let config = member_config(text).await?;
    let server = config.cluster_url.to_string();
    Ok((
        bounded_client(
            config,
            MAX_REQUESTS_IN_FLIGHT,
            crate::client::BULK_IDLE,
            None,
        )?,
        server,
    ))
}

/// How long a request sent to a member may go unacknowledged by the member's kernel before
/// the connection is aborted and the request discarded (`TCP_USER_TIMEOUT`). The stateful
/// rules judge a delete or shrink against evidence at most a renew interval old: a
/// request that reached the member many seconds later (TCP retransmitting it after a
/// partition healed) would act on evidence long stale. An API server's kernel acknowledges
/// within a round trip, so a second without one means the path is broken.
pub const UNACKNOWLEDGED: Duration = Duration::from_secs(1);

/// How long an unused connection of a member's control client stays open: longer than
/// the longest probe interval, so probes do not open a connection each time.
const CONTROL_IDLE: Duration = Duration::from_secs(90);

/// Requests in flight on a member's control client (probes, lease renewals): they are
/// few and must never wait for each other for long.
pub const MAX_CONTROL_REQUESTS_IN_FLIGHT: usize = 4;

/// Builds both clients of a member (bulk and control) from kubeconfig text: the same
/// credentials, separate connection pools and concurrency limits.
pub async fn clients_from_kubeconfig(
    text: &str,
    allow_insecure: bool,
    leadership: Option<&crate::leader::Leadership>,
) -> Result<(Client, Client, String), String> {
    let kubeconfig =
        Kubeconfig::from_yaml(text).map_err(|e| format!("the kubeconfig does not parse: {e}"))?;
    crate::hub::membership::credentials::check_inline(&kubeconfig, allow_insecure)?;
    let config = member_config(text).await?;
    let server = config.cluster_url.to_string();
    let bulk = bounded_client(
        config.clone(),
        MAX_REQUESTS_IN_FLIGHT,
        crate::client::BULK_IDLE,
        leadership,
    )?;
    // Renewals every second and probes keep its few connections in use.
    let control = bounded_client(
        config,
        MAX_CONTROL_REQUESTS_IN_FLIGHT,
        CONTROL_IDLE,
        leadership,
    )?;
    Ok((bulk, control, server))
}

async fn member_config(text: &str) -> Result<Config, String> {
    let kubeconfig =
        Kubeconfig::from_yaml(text).map_err(|e| format!("the kubeconfig does not parse: {e}"))?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("the kubeconfig is not usable: {e}"))?;
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    // The request timeout layer bounds waiting for headers; a read timeout would also
    // cut quiet watches, which later controllers need.
    config.read_timeout = None;
    config.write_timeout = Some(REQUEST_TIMEOUT);
    // A probe must see a 503 as it is, not after retries; callers have their own loops.
    config.default_retry = false;
    Ok(config)
}

/// A client whose every request waits at most [`REQUEST_TIMEOUT`] for its headers,
/// counted from when it is sent (the timeout is inside the concurrency limit, so time
/// spent waiting for a slot is not taken from the request's own deadline). With
/// `leadership`, writes are sent only while this hub leads, checked when each gets its
/// turn, and end with the leadership term.
fn bounded_client(
    config: Config,
    in_flight: usize,
    idle: Duration,
    leadership: Option<&crate::leader::Leadership>,
) -> Result<Client, String> {
    crate::client::build_gated(
        config,
        crate::client::Limits {
            idle,
            in_flight: Some(in_flight),
            request_timeout: Some(REQUEST_TIMEOUT),
            unacknowledged: Some(UNACKNOWLEDGED),
        },
        leadership.cloned(),
    )
    .map_err(|e| format!("cannot build a client: {e}"))
}

fn secret_version(secret: &Secret) -> String {
    format!(
        "{}/{}",
        secret.metadata.uid.as_deref().unwrap_or_default(),
        secret
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default()
    )
}

/// Where a member's kubeconfig should come from, or why it cannot.
fn kubeconfig_text(
    member: &MemberCluster,
    secrets: &Store<Secret>,
) -> Result<(String, String), String> {
    let reference = &member.spec.secret_ref;
    if reference.namespace != SYSTEM_NAMESPACE {
        return Err(format!(
            "secretRef {}/{} is outside {SYSTEM_NAMESPACE}, the only namespace the hub reads member credentials from",
            reference.namespace, reference.name
        ));
    }
    let key = reflector::ObjectRef::<Secret>::new(&reference.name).within(SYSTEM_NAMESPACE);
    let secret = secrets
        .get(&key)
        .ok_or_else(|| format!("Secret {SYSTEM_NAMESPACE}/{} not found", reference.name))?;
    let data = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KUBECONFIG_KEY))
        .ok_or_else(|| {
            format!(
                "Secret {SYSTEM_NAMESPACE}/{} has no key {KUBECONFIG_KEY:?}",
                reference.name
            )
        })?;
    let text = String::from_utf8(data.0.clone()).map_err(|_| {
        format!(
            "Secret {SYSTEM_NAMESPACE}/{} key {KUBECONFIG_KEY:?} is not UTF-8",
            reference.name
        )
    })?;
    let consent = if member.spec.insecure_skip_tls_verify {
        "/insecure-allowed"
    } else {
        ""
    };
    Ok((text, format!("{}{consent}", secret_version(&secret))))
}

/// Builds the next snapshot from the watched objects, reusing every connection whose
/// Secret did not change.
async fn rebuild(
    members: &Store<MemberCluster>,
    secrets: &Store<Secret>,
    previous: &HashMap<String, MemberHandle>,
    leadership: &crate::leader::Leadership,
) -> HashMap<String, MemberHandle> {
    let mut next = HashMap::new();
    for member in members.state() {
        let name = member.name_any();
        let connection = match kubeconfig_text(&member, secrets) {
            Err(reason) => Err(reason),
            // The MemberCluster's consent to skip TLS verification is part of what the
            // client was built from.
            Ok((text, version)) => match previous.get(&name).map(|h| &h.connection) {
                Some(Ok(existing)) if existing.secret_version == version => Ok(existing.clone()),
                _ => match clients_from_kubeconfig(
                    &text,
                    member.spec.insecure_skip_tls_verify,
                    Some(leadership),
                )
                .await
                {
                    Ok((client, control, server)) => {
                        tracing::info!(member = %name, %server, secret = %version, "built the member's clients");
                        Ok(MemberConnection {
                            client,
                            control,
                            server,
                            secret_version: version,
                            kubeconfig: Arc::from(text.as_str()),
                        })
                    }
                    Err(reason) => Err(format!(
                        "Secret {SYSTEM_NAMESPACE}/{}: {reason}",
                        member.spec.secret_ref.name
                    )),
                },
            },
        };
        if let Err(reason) = &connection
            && previous
                .get(&name)
                .is_none_or(|h| h.connection.as_ref().err() != Some(reason))
        {
            tracing::warn!(member = %name, %reason, "member credentials are not usable");
        }
        next.insert(
            name.clone(),
            MemberHandle {
                name,
                zone: member.spec.zone.clone(),
                region: member.spec.region.clone(),
                probe: member.spec.probe.clone(),
                object: member.clone(),
                connection,
            },
        );
    }
    next
}

/// Runs the registry controller until `shutdown`: watches MemberClusters and the Secrets
/// in `bulkhead-system` and republishes the snapshot on every change. The member clients
/// it builds send writes only while `leadership` leads.
pub async fn run(
    hub: Client,
    registry: Registry,
    leadership: crate::leader::Leadership,
    shutdown: CancellationToken,
) {
    let (member_store, member_writer) = reflector::store::<MemberCluster>();
    let (secret_store, secret_writer) = reflector::store::<Secret>();
    let member_events = reflector::reflector(
        member_writer,
        watcher(
            Api::<MemberCluster>::all(hub.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .map_ok(|_| ())
    .boxed();
    let secret_events = reflector::reflector(
        secret_writer,
        watcher(
            Api::<Secret>::namespaced(hub, SYSTEM_NAMESPACE),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .map_ok(|_| ())
    .boxed();
    let mut events = futures::stream::select(member_events, secret_events);
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            event = events.next() => event,
        };
        match event {
            None => return,
            Some(Err(error)) => {
                tracing::warn!(%error, "member registry watch failed; retrying");
                continue;
            }
            Some(Ok(())) => {}
        }
        // Both lists must be complete, or a member would briefly look credential-less.
        if member_store.wait_until_ready().now_or_never().is_none()
            || secret_store.wait_until_ready().now_or_never().is_none()
        {
            continue;
        }
        let previous = registry.snapshot();
        let next = rebuild(&member_store, &secret_store, &previous, &leadership).await;
        registry.publish(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`rebuild`] for a hub without an election (its clients always write).
    async fn rebuild_always(
        members: &Store<MemberCluster>,
        secrets: &Store<Secret>,
        previous: &HashMap<String, MemberHandle>,
    ) -> HashMap<String, MemberHandle> {
        rebuild(
            members,
            secrets,
            previous,
            &crate::leader::Leadership::always(),
        )
        .await
    }

    #[tokio::test]
    async fn a_kubeconfig_that_does_not_parse_is_reported_not_fatal() {
        let error = client_from_kubeconfig("not: [a kubeconfig")
            .await
            .err()
            .unwrap();
        assert!(error.contains("does not parse"), "{error}");
        let error = client_from_kubeconfig("apiVersion: v1\nkind: Config\n")
            .await
            .err()
            .unwrap();
        assert!(error.contains("not usable"), "{error}");
    }

    #[tokio::test]
    async fn builds_a_client_for_a_token_kubeconfig() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let text = "apiVersion: v1\nkind: Config\nclusters:\n- name: m\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: abc\ncontexts:\n- name: c\n  context:\n    cluster: m\n    user: u\ncurrent-context: c\n";
        let (_, server) = client_from_kubeconfig(text).await.unwrap();
        assert_eq!(server, "https://127.0.0.1:1/");
    }

    const TOKEN_KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: m\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: abc\ncontexts:\n- name: c\n  context:\n    cluster: m\n    user: u\ncurrent-context: c\n";

    /// A member whose spec accepts the test kubeconfig's unverified server.
    fn member(name: &str, secret_namespace: &str) -> MemberCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "federation.example.com/v1alpha1",
            "kind": "MemberCluster",
            "metadata": {"name": name},
            "spec": {"secretRef": {"namespace": secret_namespace, "name": format!("member-{name}")}, "zone": "zone-a",
                     "insecureSkipTLSVerify": true}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn only_inline_credentials_and_consented_insecure_servers_get_a_client() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut strict = member("strict", SYSTEM_NAMESPACE);
        strict.spec.insecure_skip_tls_verify = false;
        let exec = TOKEN_KUBECONFIG.replace(
            "token: abc",
            "exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh}",
        );
        let (members, secrets) = stores(
            vec![strict, member("exec", SYSTEM_NAMESPACE)],
            vec![
                secret("member-strict", "1", Some(TOKEN_KUBECONFIG)),
                secret("member-exec", "1", Some(&exec)),
            ],
        );
        let snapshot = rebuild_always(&members, &secrets, &HashMap::new()).await;
        let reason = |name: &str| snapshot[name].connection.as_ref().err().unwrap().clone();
        assert!(
            reason("strict").contains("insecure-skip-tls-verify is true"),
            "{}",
            reason("strict")
        );
        assert!(
            reason("exec").contains("users[u].user.exec is not allowed"),
            "{}",
            reason("exec")
        );
    }

    fn secret(name: &str, version: &str, kubeconfig: Option<&str>) -> Secret {
        let mut secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE, "uid": "u1", "resourceVersion": version}
        }))
        .unwrap();
        if let Some(text) = kubeconfig {
            secret.data = Some(std::collections::BTreeMap::from([(
                KUBECONFIG_KEY.to_string(),
                k8s_openapi::ByteString(text.as_bytes().to_vec()),
            )]));
        }
        secret
    }

    fn stores(
        members: Vec<MemberCluster>,
        secrets: Vec<Secret>,
    ) -> (Store<MemberCluster>, Store<Secret>) {
        let (member_store, mut member_writer) = reflector::store();
        for m in members {
            member_writer.apply_watcher_event(&watcher::Event::Apply(m));
        }
        let (secret_store, mut secret_writer) = reflector::store();
        for s in secrets {
            secret_writer.apply_watcher_event(&watcher::Event::Apply(s));
        }
        (member_store, secret_store)
    }

    #[tokio::test]
    async fn bad_or_missing_secrets_leave_the_member_without_a_client_and_others_unaffected() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (members, secrets) = stores(
            vec![
                member("good", SYSTEM_NAMESPACE),
                member("missing", SYSTEM_NAMESPACE),
                member("nokey", SYSTEM_NAMESPACE),
                member("garbage", SYSTEM_NAMESPACE),
                member("elsewhere", "default"),
            ],
            vec![
                secret("member-good", "1", Some(TOKEN_KUBECONFIG)),
                secret("member-nokey", "1", None),
                secret("member-garbage", "1", Some("clusters: [unclosed")),
            ],
        );
        let snapshot = rebuild_always(&members, &secrets, &HashMap::new()).await;
        assert_eq!(snapshot.len(), 5);
        assert!(snapshot["good"].client().is_some());
        let reason = |name: &str| snapshot[name].connection.as_ref().err().unwrap().clone();
        assert!(
            reason("missing").contains("not found"),
            "{}",
            reason("missing")
        );
        assert!(
            reason("nokey").contains("has no key"),
            "{}",
            reason("nokey")
        );
        assert!(
            reason("garbage").contains("does not parse"),
            "{}",
            reason("garbage")
        );
        assert!(
            reason("elsewhere").contains("outside"),
            "{}",
            reason("elsewhere")
        );
    }

    #[tokio::test]
    async fn a_client_is_rebuilt_only_when_its_secret_changes() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (members, secrets) = stores(
            vec![member("east", SYSTEM_NAMESPACE)],
            vec![secret("member-east", "1", Some(TOKEN_KUBECONFIG))],
        );
        let first = rebuild_always(&members, &secrets, &HashMap::new()).await;
        let again = rebuild_always(&members, &secrets, &first).await;
        let version = |s: &HashMap<String, MemberHandle>| {
            s["east"]
                .connection
                .as_ref()
                .unwrap()
                .secret_version
                .clone()
        };
        assert_eq!(version(&first), "u1/1/insecure-allowed");
        assert_eq!(version(&again), "u1/1/insecure-allowed");
        let (members, secrets) = stores(
            vec![member("east", SYSTEM_NAMESPACE)],
            vec![secret("member-east", "2", Some(TOKEN_KUBECONFIG))],
        );
        let rotated = rebuild_always(&members, &secrets, &again).await;
        assert_eq!(version(&rotated), "u1/2/insecure-allowed");
    }

    #[test]
    fn publishing_wakes_subscribers() {
        let registry = Registry::default();
        let changes = registry.subscribe();
        registry.publish(HashMap::new());
        assert!(changes.has_changed().unwrap());
        assert!(registry.snapshot().is_empty());
    }
}
