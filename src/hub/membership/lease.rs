//! The fencing Lease: the hub renews Lease `bulkhead-hub` in `bulkhead-system` of every
//! member it can reach, every `--lease-renew-interval`, one task per member. A member's
//! agent fences itself when it stops seeing `renewTime` change (DESIGN.md section 6).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::api::{LABEL_MANAGED_BY, SYSTEM_NAMESPACE};
use crate::hub::membership::members::Registry;
use crate::hub::membership::metrics::{ClusterLabels, HubMetrics};

/// Name of the Lease in each member.
pub const LEASE_NAME: &str = "bulkhead-hub";
/// The field manager of lease renewals.
pub const LEASE_FIELD_MANAGER: &str = "bulkhead-hub";

/// How the hub renews the fencing Lease.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// Renewals are sent only while this hub leads (checked before each one).
    pub leadership: crate::leader::Leadership,
    /// Each renewal's outcome is recorded here.
    pub evidence: crate::hub::membership::evidence::Evidence,
    /// Written as `holderIdentity`.
    pub identity: String,
    /// Time between renewals; also the deadline of one renewal.
    pub renew_interval: Duration,
    /// Written as `leaseDurationSeconds`: how long the agent waits before fencing.
    pub duration: Duration,
    /// The primary terms the Lease carries (see `terms`); nothing is renewed until the
    /// templates were listed.
    pub terms: crate::hub::membership::terms::Terms,
}

/// The Lease the hub applies: `renewTime` now, `acquireTime` when this hub started
/// renewing this member, and the primary `terms` a switchover or a disaster promotion raised.
pub fn desired_lease(
    settings: &LeaseSettings,
    acquired: jiff::Timestamp,
    now: jiff::Timestamp,
    terms: &BTreeMap<String, u64>,
) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(LEASE_NAME.to_string()),
            namespace: Some(SYSTEM_NAMESPACE.to_string()),
            labels: Some(BTreeMap::from([(
                LABEL_MANAGED_BY.to_string(),
                "bulkhead".to_string(),
            )])),
            annotations: crate::hub::membership::terms::annotation(terms).map(|terms| {
                BTreeMap::from([(crate::api::ANNOTATION_PRIMARY_TERMS.to_string(), terms)])
            }),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(settings.identity.clone()),
            lease_duration_seconds: Some(settings.duration.as_secs().max(1) as i32),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    }
}

/// Renews the Lease once (server-side apply creates it when missing).
pub async fn renew(client: &Client, lease: &Lease) -> Result<(), kube::Error> {
    Api::<Lease>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .patch(
            LEASE_NAME,
            &PatchParams::apply(LEASE_FIELD_MANAGER).force(),
            &Patch::Apply(lease),
        )
        .await
        .map(|_| ())
}

/// Renews one member's Lease until it leaves the registry or `cancel` fires. Each
/// attempt is bounded by the renew interval, so a partitioned member costs one timed-out
/// request per interval and nothing else.
pub async fn renew_member(
    registry: Registry,
    settings: LeaseSettings,
    metrics: HubMetrics,
    name: String,
    cancel: CancellationToken,
) {
    let acquired = jiff::Timestamp::now();
    let labels = ClusterLabels {
        cluster: name.clone(),
    };
    let mut failing = false;
    loop {
        let started = Instant::now();
        let Some(handle) = registry.get(&name) else {
            break;
        };
        let terms = settings.terms.load_full();
        if terms.is_none() {
            tracing::debug!(member = %name, "not renewing the fencing lease before the primary terms are listed");
        }
        if let Some(client) = handle
            .control_client()
            .filter(|_| settings.leadership.is_leader())
            && let Some(carried) = terms.as_ref()
        {
            let lease = desired_lease(&settings, acquired, jiff::Timestamp::now(), carried);
            let result = tokio::select! {
                _ = cancel.cancelled() => break,
                result = tokio::time::timeout(settings.renew_interval, renew(client, &lease)) => result,
            };
            settings
                .evidence
                .renewed_carrying(&name, matches!(result, Ok(Ok(()))), &terms);
            match result {
                Ok(Ok(())) => {
                    metrics.lease_renewals.get_or_create(&labels).inc();
                    if failing {
                        tracing::info!(member = %name, "fencing lease renewed again");
                        failing = false;
                    }
                }
                Ok(Err(error)) => {
                    metrics.lease_failures.get_or_create(&labels).inc();
                    if !failing {
                        tracing::warn!(member = %name, %error, "cannot renew the fencing lease");
                        failing = true;
                    }
                }
                Err(_) => {
                    metrics.lease_failures.get_or_create(&labels).inc();
                    if !failing {
                        tracing::warn!(member = %name, timeout = ?settings.renew_interval, "fencing lease renewal timed out");
                        failing = true;
                    }
                }
            }
        }
        let next = tokio::time::Instant::from_std(started + settings.renew_interval);
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep_until(next) => {}
            // A raised term goes out at once: a switchover waits for every member to
            // hold it before it promotes.
            _ = settings.terms.changed_from(&terms) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use kube::client::Body;

    /// A renewal is one server-side apply of the Lease (which also creates it).
    #[tokio::test]
    async fn renewal_is_one_server_side_apply() {
        let (service, mut handle) =
            tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let client = Client::new(service, "default");
        let server = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.expect("one request");
            assert_eq!(request.method(), http::Method::PATCH);
            assert_eq!(
                request.uri().path(),
                "/apis/coordination.k8s.io/v1/namespaces/bulkhead-system/leases/bulkhead-hub"
            );
            let query = request.uri().query().unwrap_or_default().to_string();
            assert!(query.contains("fieldManager=bulkhead-hub"), "{query}");
            assert!(query.contains("force=true"), "{query}");
            assert_eq!(
                request.headers()[http::header::CONTENT_TYPE],
                "application/apply-patch+yaml"
            );
            let body = request.into_body().collect_bytes().await.unwrap();
            let lease: Lease = serde_json::from_slice(&body).unwrap();
            assert_eq!(
                lease.spec.as_ref().unwrap().holder_identity.as_deref(),
                Some("hub-1")
            );
            respond.send_response(
                http::Response::builder()
                    .body(Body::from(serde_json::to_vec(&lease).unwrap()))
                    .unwrap(),
            );
        });
        let settings = LeaseSettings {
            leadership: crate::leader::Leadership::always(),
            evidence: Default::default(),
            identity: "hub-1".into(),
            renew_interval: Duration::from_secs(2),
            duration: Duration::from_secs(10),
            terms: Default::default(),
        };
        let now = jiff::Timestamp::now();
        renew(
            &client,
            &desired_lease(&settings, now, now, &BTreeMap::new()),
        )
        .await
        .unwrap();
        server.await.unwrap();
    }

    /// A raised term does not wait for the next renewal.
    #[tokio::test(start_paused = true)]
    async fn changed_terms_end_the_wait_for_the_next_renewal() {
        let terms: crate::hub::membership::terms::Terms = Default::default();
        terms.store(std::sync::Arc::new(Some(BTreeMap::new())));
        let carried = terms.load_full();
        let waiting = tokio::spawn({
            let terms = terms.clone();
            async move { terms.changed_from(&carried).await }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!waiting.is_finished(), "the same terms: the wait goes on");
        terms.store(std::sync::Arc::new(Some(BTreeMap::from([(
            "shop/orders".to_string(),
            2,
        )]))));
        tokio::time::timeout(Duration::from_millis(1), waiting)
            .await
            .expect("a raised term: renewed at once")
            .unwrap();
    }

    #[test]
    fn the_lease_carries_identity_duration_and_times() {
        let settings = LeaseSettings {
            leadership: crate::leader::Leadership::always(),
            evidence: Default::default(),
            identity: "hub-1".into(),
            renew_interval: Duration::from_secs(2),
            duration: Duration::from_secs(10),
            terms: Default::default(),
        };
        let acquired = jiff::Timestamp::from_second(100).unwrap();
        let now = jiff::Timestamp::from_second(130).unwrap();
        let lease = desired_lease(&settings, acquired, now, &BTreeMap::new());
        let json = serde_json::to_value(&lease).unwrap();
        assert!(
            json["metadata"]["annotations"].is_null(),
            "no terms, no annotation"
        );
        assert_eq!(json["apiVersion"], "coordination.k8s.io/v1");
        assert_eq!(json["kind"], "Lease");
        assert_eq!(json["metadata"]["namespace"], SYSTEM_NAMESPACE);
        assert_eq!(json["spec"]["holderIdentity"], "hub-1");
        assert_eq!(json["spec"]["leaseDurationSeconds"], 10);
        assert_eq!(json["spec"]["renewTime"], "1970-01-01T00:02:10.000000Z");
        assert_eq!(json["spec"]["acquireTime"], "1970-01-01T00:01:40.000000Z");
        // A raised primary term travels with every renewal, as the agent reads it.
        let terms = BTreeMap::from([("shop/orders".to_string(), 2)]);
        let lease = desired_lease(&settings, acquired, now, &terms);
        assert_eq!(
            crate::agent::fence::primary_terms(&lease),
            terms,
            "{:?}",
            lease.metadata.annotations
        );
    }
}
