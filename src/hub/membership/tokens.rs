//! Renewal of the hub's member tokens. `bulkhead join` stores a kubeconfig whose token is
//! a bound service-account token of `bulkhead-system/bulkhead-hub` in the member, with an
//! expiry (one year by default). At expiry every member would turn `CredentialsInvalid`:
//! stateless workloads would fail over and every database would fence. So one task per
//! member watches the expiry of the token the hub uses and, once less than a third of its
//! lifetime is left, asks the member for a new one (TokenRequest, the same lifetime) and
//! writes it into the member's Secret on the hub; the registry then rebuilds the clients
//! (docs/clusters.md). A token that cannot be renewed is reported long before it expires:
//! condition `TokenRenewal=False` on the MemberCluster, a Warning Event, and the metric
//! `bulkhead_member_token_expiry_seconds`.

use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource};
use tokio_util::sync::CancellationToken;

use crate::api::{ConditionStatus, MemberCluster, SYSTEM_NAMESPACE, new_condition};
use crate::hub::membership::members::{KUBECONFIG_KEY, Registry};
use crate::hub::membership::metrics::{ClusterLabels, HubMetrics};

/// The service account whose token the hub holds in every member.
pub const HUB_ACCOUNT: &str = "bulkhead-hub";
/// Field manager of the `TokenRenewal` condition.
pub const FIELD_MANAGER: &str = "bulkhead-hub-tokens";
/// The condition this task owns.
pub const CONDITION: &str = "TokenRenewal";
/// How a renewal's message begins.
const RENEWED: &str = "the hub renewed its token";
/// Share of a token's lifetime after which the hub renews it.
pub const DEFAULT_RENEW_FRACTION: f64 = 2.0 / 3.0;

/// When a token was issued and when it expires (Unix seconds), from its JWT claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenLifetime {
    pub issued_at: i64,
    pub expires_at: i64,
}

impl TokenLifetime {
    /// The lifetime the member granted.
    pub fn seconds(&self) -> i64 {
        (self.expires_at - self.issued_at).max(0)
    }

    /// Renew once `fraction` of the lifetime has passed (the default
    /// [`DEFAULT_RENEW_FRACTION`]: two thirds, so a third is left).
    pub fn renew_at(&self, fraction: f64) -> i64 {
        let fraction = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            DEFAULT_RENEW_FRACTION
        };
        self.issued_at + (self.seconds() as f64 * fraction) as i64
    }
}

/// Reads `iat` and `exp` from a JWT without verifying it (the member verifies it; the hub
/// only needs to know when to ask for a new one). None for tokens that are not JWTs or
/// carry no expiry (static tokens never expire by themselves).
pub fn token_lifetime(token: &str) -> Option<TokenLifetime> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let expires_at = claims["exp"].as_i64()?;
    let issued_at = claims["iat"]
        .as_i64()
        .or_else(|| claims["nbf"].as_i64())
        .unwrap_or(expires_at);
    Some(TokenLifetime {
        issued_at,
        expires_at,
    })
}

/// The tokens of every user entry of a kubeconfig (what the hub authenticates with).
pub fn kubeconfig_token(text: &str) -> Option<String> {
    let value: serde_yaml::Value = serde_yaml::from_str(text).ok()?;
    value["users"]
        .as_sequence()?
        .iter()
        .find_map(|user| user["user"]["token"].as_str().map(str::to_string))
}

/// The kubeconfig with every user's token replaced by `token`.
pub fn with_token(text: &str, token: &str) -> Option<String> {
    let mut value: serde_yaml::Value = serde_yaml::from_str(text).ok()?;
    let mut replaced = false;
    for user in value["users"].as_sequence_mut()? {
        if let Some(entry) = user.get_mut("user").and_then(|u| u.as_mapping_mut())
            && entry.contains_key("token")
        {
            entry.insert("token".into(), token.into());
            replaced = true;
        }
    }
    replaced
        .then(|| serde_yaml::to_string(&value).ok())
        .flatten()
}

/// What the renewal task needs.
#[derive(Clone)]
pub struct TokenContext {
    pub hub: Client,
    pub registry: Registry,
    pub metrics: HubMetrics,
    pub recorder: Recorder,
    /// How often the task looks at the token.
    pub check_interval: Duration,
    /// Share of the lifetime after which a token is renewed.
    pub renew_fraction: f64,
    /// Renewals and reports are written only while this hub leads.
    pub leadership: crate::leader::Leadership,
}

/// Watches and renews one member's token until `cancel`.
pub async fn renew_member_token(context: TokenContext, name: String, cancel: CancellationToken) {
    let labels = ClusterLabels {
        cluster: name.clone(),
    };
    let mut reported: Option<(bool, String)> = None;
    loop {
        if let Some(handle) = context.registry.get(&name)
            && let Ok(connection) = &handle.connection
            && let Some(lifetime) = kubeconfig_token(&connection.kubeconfig)
                .as_deref()
                .and_then(token_lifetime)
        {
            let now = jiff::Timestamp::now().as_second();
            context
                .metrics
                .token_expiry
                .get_or_create(&labels)
                .set(lifetime.expires_at - now);
            let renew_at = lifetime.renew_at(context.renew_fraction);
            let outcome = if !context.leadership.is_leader() {
                None
            } else if now >= renew_at {
                match renew(&context, &handle.object, connection, lifetime).await {
                    Ok(expires) => {
                        Some((true, format!("{RENEWED}; the new one expires at {expires}")))
                    }
                    Err(error) => Some((
                        false,
                        format!(
                            "the hub cannot renew its token ({error}); it expires at {}: re-run `bulkhead join {name}` before then, or every workload on this member fails over and its databases fence",
                            jiff::Timestamp::from_second(lifetime.expires_at)
                                .map(|t| t.to_string())
                                .unwrap_or_default()
                        ),
                    )),
                }
            } else {
                Some((
                    true,
                    format!(
                        "the token expires at {}; the hub renews it from {}",
                        jiff::Timestamp::from_second(lifetime.expires_at)
                            .map(|t| t.to_string())
                            .unwrap_or_default(),
                        jiff::Timestamp::from_second(renew_at)
                            .map(|t| t.to_string())
                            .unwrap_or_default()
                    ),
                ))
            };
            if let Some((ok, message)) = outcome {
                // A new verdict, a new failure text, or a renewal (rare: once per two
                // thirds of a lifetime) is news; "still fine, expires at ..." is not.
                let renewed = ok && message.starts_with(RENEWED);
                let changed = renewed
                    || reported
                        .as_ref()
                        .is_none_or(|(was_ok, was)| *was_ok != ok || (was != &message && !ok));
                if changed {
                    report(&context, &handle.object, ok, &message).await;
                    reported = Some((ok, message));
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(context.check_interval) => {}
        }
    }
    context.metrics.token_expiry.remove(&labels);
}

/// Asks the member for a new token of the same lifetime and stores it in the Secret.
/// Returns the new expiry.
async fn renew(
    context: &TokenContext,
    member: &MemberCluster,
    connection: &crate::hub::membership::members::MemberConnection,
    lifetime: TokenLifetime,
) -> Result<String, String> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(lifetime.seconds().max(600)),
            ..Default::default()
        }),
        ..Default::default()
    };
    let answer = Api::<ServiceAccount>::namespaced(connection.control.clone(), SYSTEM_NAMESPACE)
        .create_token_request(HUB_ACCOUNT, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("TokenRequest for {SYSTEM_NAMESPACE}/{HUB_ACCOUNT}: {e}"))?;
    let status = answer.status.ok_or("the TokenRequest came back empty")?;
    let token = status.token.filter(|t| !t.is_empty()).ok_or("no token")?;
    let text = with_token(&connection.kubeconfig, &token)
        .ok_or("the stored kubeconfig has no token to replace")?;
    let secret_ref = &member.spec.secret_ref;
    // Only over the Secret the clients were built from: if someone wrote it since (a new
    // `bulkhead join`), the write fails (409) and the new kubeconfig stays; the registry
    // builds clients from it and the next check renews that one's token if need be.
    let mut patch = serde_json::json!({"data": {KUBECONFIG_KEY: base64::engine::general_purpose::STANDARD.encode(text)}});
    let mut version = connection.secret_version.split('/');
    if let (Some(uid), Some(resource_version)) = (version.next(), version.next())
        && !uid.is_empty()
        && !resource_version.is_empty()
    {
        patch["metadata"] = serde_json::json!({"uid": uid, "resourceVersion": resource_version});
    }
    Api::<Secret>::namespaced(context.hub.clone(), &secret_ref.namespace)
        .patch(
            &secret_ref.name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| {
            format!(
                "writing Secret {}/{}: {e}",
                secret_ref.namespace, secret_ref.name
            )
        })?;
    context.metrics.token_renewals.inc();
    Ok(status
        .expiration_timestamp
        .map(|t| t.0.to_string())
        .unwrap_or_else(|| "an unknown time".into()))
}

async fn report(context: &TokenContext, member: &MemberCluster, ok: bool, message: &str) {
    let name = member.metadata.name.clone().unwrap_or_default();
    if ok {
        tracing::info!(member = %name, %message, "member token");
    } else {
        tracing::warn!(member = %name, %message, "member token");
    }
    let condition = new_condition(
        CONDITION,
        ConditionStatus::from_bool(ok),
        if ok { "Renewable" } else { "RenewalFailed" },
        message.to_string(),
        member.metadata.generation,
    );
    let body = serde_json::json!({
        "apiVersion": "federation.example.com/v1alpha1",
        "kind": "MemberCluster",
        "metadata": {"name": name},
        "status": {"conditions": [condition]},
    });
    if let Err(error) = Api::<MemberCluster>::all(context.hub.clone())
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
    {
        tracing::warn!(member = %name, %error, "cannot write the TokenRenewal condition");
    }
    if !ok || message.starts_with(RENEWED) {
        let event = Event {
            type_: if ok {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason: if ok {
                "TokenRenewed"
            } else {
                "TokenRenewalFailed"
            }
            .into(),
            note: Some(message.to_string()),
            action: "RenewToken".into(),
            secondary: None,
        };
        if let Err(error) = context
            .recorder
            .publish(&event, &member.object_ref(&()))
            .await
        {
            tracing::debug!(%error, "cannot publish an Event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: serde_json::Value) -> String {
        let encode = |v: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        format!(
            "{}.{}.signature",
            encode(&serde_json::json!({"alg": "RS256"})),
            encode(&claims)
        )
    }

    #[test]
    fn the_lifetime_comes_from_the_claims_and_renewal_starts_at_two_thirds() {
        let token = jwt(serde_json::json!({"iat": 1_000, "exp": 31_000, "sub": "x"}));
        let lifetime = token_lifetime(&token).unwrap();
        assert_eq!(lifetime.seconds(), 30_000);
        assert_eq!(lifetime.renew_at(DEFAULT_RENEW_FRACTION), 21_000);
        assert_eq!(lifetime.renew_at(0.5), 16_000);
        assert_eq!(lifetime.renew_at(f64::NAN), 21_000);
        assert_eq!(token_lifetime("not-a-jwt"), None);
        assert_eq!(
            token_lifetime(&jwt(serde_json::json!({"sub": "static"}))),
            None,
            "no expiry, nothing to renew"
        );
    }

    #[test]
    fn the_token_is_replaced_in_the_kubeconfig_and_nothing_else_changes() {
        let text = "apiVersion: v1\nkind: Config\nclusters:\n- name: east\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: Q0EK\nusers:\n- name: hub\n  user:\n    token: old\ncontexts:\n- name: east\n  context:\n    cluster: east\n    user: hub\ncurrent-context: east\n";
        assert_eq!(kubeconfig_token(text).as_deref(), Some("old"));
        let renewed = with_token(text, "new").unwrap();
        assert_eq!(kubeconfig_token(&renewed).as_deref(), Some("new"));
        let parsed = kube::config::Kubeconfig::from_yaml(&renewed).unwrap();
        assert_eq!(parsed.current_context.as_deref(), Some("east"));
        assert_eq!(
            parsed.clusters[0]
                .cluster
                .as_ref()
                .unwrap()
                .certificate_authority_data
                .as_deref(),
            Some("Q0EK")
        );
        let certificate = "users:\n- name: hub\n  user:\n    client-certificate-data: Q0VSVAo=\n";
        assert_eq!(with_token(certificate, "new"), None, "no token to renew");
    }
}
