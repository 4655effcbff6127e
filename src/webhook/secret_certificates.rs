//! Webhook certificates the hub processes keep in a Secret themselves (`--tls-secret`, the
//! chart's default mode). Nothing is rendered by Helm, so `helm template` and GitOps tools
//! work, and every hub replica serves from the same Secret.
//!
//! The Secret holds a CA (`ca.key`), the bundle API servers trust (`ca.crt`: the current CA
//! first, then up to two earlier CAs that have not expired) and the serving certificate
//! (`tls.crt`, `tls.key`). Every replica reads it every [`CHECK_EVERY`]; the one that finds
//! something to renew writes it (with the resourceVersion it read, so two replicas never
//! both win) and the others pick the result up on their next read.
//!
//! Renewal happens when a third of a certificate's lifetime is left. A new CA goes into
//! the bundle first and signs the serving certificate only [`PROPAGATION`] later (the
//! webhook configurations and the CRD conversion carry the new bundle by then), so no
//! admission ever meets a certificate its API server does not trust yet; a serving
//! certificate due in that window is signed by the previous CA, kept with its key
//! (`ca-previous.crt`, `ca-previous.key`) until it expires.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use time::OffsetDateTime;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use x509_parser::extensions::GeneralName;

use super::tls::{CertificateAuthority, CertificateStore, TlsError, Validity, certified_key};

/// The Secret's keys.
pub const CA_BUNDLE: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
/// The CA before the current one and its key, kept while the current one is too new to
/// sign (API servers may not trust it yet).
pub const PREVIOUS_CA_CERT: &str = "ca-previous.crt";
pub const PREVIOUS_CA_KEY: &str = "ca-previous.key";
pub const TLS_CERT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";

/// How long a new CA is in the published bundle before it signs the serving certificate.
pub const PROPAGATION: Duration = Duration::from_secs(60);
/// How often each replica reads the Secret.
pub const CHECK_EVERY: Duration = Duration::from_secs(10);
/// A new certificate's validity starts this much in the past (clocks differ a little;
/// Kubernetes expects them synchronised).
const BACKDATE: Duration = Duration::from_secs(60);
/// Earlier CAs kept in the bundle besides the current one.
const EARLIER_CAS: usize = 2;

/// How long new certificates are valid.
#[derive(Clone, Copy, Debug)]
pub struct Lifetimes {
    pub serving: Duration,
    pub ca: Duration,
}

/// What the Secret holds (PEM text).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Contents {
    pub bundle: String,
    pub ca_key: String,
    /// Empty unless a CA was renewed and the earlier one has not expired.
    pub previous_ca: String,
    pub previous_ca_key: String,
    pub cert: String,
    pub key: String,
}

const MOVES_TO_THE_CURRENT_CA: &str = "the serving certificate moves to the current CA";

/// What to do with the Secret.
#[derive(Debug)]
pub enum Plan {
    Keep,
    Write { contents: Contents, why: String },
}

/// One certificate of a PEM text.
#[derive(Clone, Debug)]
struct Block {
    pem: String,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
}

fn blocks(text: &str) -> Vec<Block> {
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = vec![];
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN CERTIFICATE-----") {
        let Some(end) = rest[start..].find(END) else {
            break;
        };
        let pem = format!("{}\n", &rest[start..start + end + END.len()]);
        rest = &rest[start + end + END.len()..];
        let Ok((_, parsed)) = x509_parser::pem::parse_x509_pem(pem.as_bytes()) else {
            continue;
        };
        let Ok(cert) = parsed.parse_x509() else {
            continue;
        };
        out.push(Block {
            not_before: cert.validity().not_before.to_datetime(),
            not_after: cert.validity().not_after.to_datetime(),
            pem,
        });
    }
    out
}

fn at(now: OffsetDateTime, offset: Duration) -> OffsetDateTime {
    now + time::Duration::try_from(offset).unwrap_or(time::Duration::ZERO)
}

fn before(now: OffsetDateTime, offset: Duration) -> OffsetDateTime {
    now - time::Duration::try_from(offset).unwrap_or(time::Duration::ZERO)
}

/// Renewal is due when less than a third of the certificate's lifetime (from its issue,
/// [`BACKDATE`] after `not_before`) is left.
fn due(block: &Block, now: OffsetDateTime) -> bool {
    let issued = at(block.not_before, BACKDATE);
    block.not_after - now <= (block.not_after - issued) / 3
}

/// Whether `cert_pem` was signed by `ca_pem`.
fn signed_by(cert_pem: &str, ca_pem: &str) -> bool {
    let (Ok((_, cert)), Ok((_, ca))) = (
        x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()),
        x509_parser::pem::parse_x509_pem(ca_pem.as_bytes()),
    ) else {
        return false;
    };
    let (Ok(cert), Ok(ca)) = (cert.parse_x509(), ca.parse_x509()) else {
        return false;
    };
    cert.verify_signature(Some(ca.public_key())).is_ok()
}

/// Whether the certificate names every one of `sans` (DNS names and IP addresses).
fn names_all(cert_pem: &str, sans: &[String]) -> bool {
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()) else {
        return false;
    };
    let Ok(cert) = pem.parse_x509() else {
        return false;
    };
    let Ok(Some(extension)) = cert.subject_alternative_name() else {
        return sans.is_empty();
    };
    let named: Vec<String> = extension
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some(dns.to_string()),
            GeneralName::IPAddress(bytes) => match bytes.len() {
                4 => Some(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*bytes).ok()?).to_string()),
                16 => {
                    Some(std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*bytes).ok()?).to_string())
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    sans.iter().all(|san| {
        let canonical = san
            .parse::<std::net::IpAddr>()
            .map(|ip| ip.to_string())
            .unwrap_or_else(|_| san.clone());
        named.contains(&canonical)
    })
}

/// Decides what the Secret should hold at `now`, from what it holds (`None`: no Secret).
/// Pure, so every rule is unit-tested; see the module documentation for the rules.
pub fn plan(
    current: Option<&Contents>,
    sans: &[String],
    lifetimes: Lifetimes,
    now: OffsetDateTime,
) -> Result<Plan, TlsError> {
    let empty = Contents::default();
    let current = current.unwrap_or(&empty);
    let mut bundle = blocks(&current.bundle);
    let mut why = vec![];

    // The CA: the bundle's first certificate with the key beside it.
    let usable_ca = bundle.first().filter(|ca| {
        CertificateAuthority::from_pem(&ca.pem, &current.ca_key).is_ok() && !due(ca, now)
    });
    // The CA before it: kept from the Secret, or the one being replaced now.
    let mut previous = (!current.previous_ca.is_empty())
        .then(|| (current.previous_ca.clone(), current.previous_ca_key.clone()));
    let (ca, ca_key, ca_since) = match usable_ca {
        Some(ca) => (ca.pem.clone(), current.ca_key.clone(), ca.not_before),
        None => {
            if let Some(old) = bundle.first()
                && CertificateAuthority::from_pem(&old.pem, &current.ca_key).is_ok()
            {
                previous = Some((old.pem.clone(), current.ca_key.clone()));
            }
            why.push(match bundle.first() {
                None => "there is no CA".to_string(),
                Some(ca) if due(ca, now) => {
                    format!("the CA expires at {}", ca.not_after)
                }
                Some(_) => "the CA's key is missing or does not load".to_string(),
            });
            let validity = Validity {
                not_before: before(now, BACKDATE),
                not_after: at(now, lifetimes.ca),
            };
            let name = format!("bulkhead-webhook-ca-{}", now.unix_timestamp());
            let authority = CertificateAuthority::with_validity(&name, validity)?;
            let pem = authority.pem();
            bundle.insert(
                0,
                Block {
                    pem: pem.clone(),
                    not_before: validity.not_before,
                    not_after: validity.not_after,
                },
            );
            (pem, authority.key_pem(), validity.not_before)
        }
    };
    // The bundle: the CA, then the most recent earlier CAs that have not expired.
    let mut earlier: Vec<Block> = bundle
        .iter()
        .skip(1)
        .filter(|b| b.not_after > now && b.pem != ca)
        .cloned()
        .collect();
    earlier.sort_by_key(|b| std::cmp::Reverse(b.not_before));
    earlier.dedup_by(|a, b| a.pem == b.pem);
    earlier.truncate(EARLIER_CAS);
    let new_bundle: String = std::iter::once(ca.clone())
        .chain(earlier.iter().map(|b| b.pem.clone()))
        .collect();
    // Until the current CA is old enough for every API server to trust it, the serving
    // certificate is signed by the previous CA (while that one has a quarter of the
    // serving lifetime left); the previous CA is forgotten once it expired.
    let settled = at(ca_since, BACKDATE + PROPAGATION) <= now;
    let previous = previous.filter(|(pem, key)| {
        blocks(pem).first().is_some_and(|b| b.not_after > now)
            && CertificateAuthority::from_pem(pem, key).is_ok()
    });
    let signer = match &previous {
        Some((pem, key))
            if !settled
                && blocks(pem)
                    .first()
                    .is_some_and(|b| b.not_after > at(now, lifetimes.serving / 4)) =>
        {
            (pem.clone(), key.clone())
        }
        _ => (ca.clone(), ca_key.clone()),
    };

    // The serving certificate.
    let serving = blocks(&current.cert).into_iter().next();
    let loads = certified_key(&current.cert, &current.key).is_ok();
    let trusted_by_bundle = serving.as_ref().is_some_and(|s| {
        std::iter::once(&ca)
            .chain(earlier.iter().map(|b| &b.pem))
            .any(|ca| signed_by(&s.pem, ca))
    });
    let reissue = match &serving {
        None => Some("there is no serving certificate".to_string()),
        Some(_) if !loads => Some("the serving certificate and key do not load".to_string()),
        Some(_) if !trusted_by_bundle => {
            Some("the serving certificate is not signed by a CA of the bundle".to_string())
        }
        Some(s) if due(s, now) => Some(format!(
            "the serving certificate expires at {}",
            s.not_after
        )),
        Some(s) if !names_all(&s.pem, sans) => Some(format!(
            "the serving certificate does not name all of {}",
            sans.join(", ")
        )),
        Some(s) if !signed_by(&s.pem, &ca) => {
            // Signed by an earlier CA: move to the current one once API servers had time
            // to see it in the bundle (sooner if the earlier CA is about to expire).
            let issuer_expires = earlier
                .iter()
                .find(|b| signed_by(&s.pem, &b.pem))
                .map(|b| b.not_after);
            let issuer_ending = issuer_expires.is_some_and(|t| t <= at(now, PROPAGATION));
            (settled || issuer_ending).then(|| MOVES_TO_THE_CURRENT_CA.to_string())
        }
        Some(_) => None,
    };
    let (cert, key) = match reissue {
        Some(reason) => {
            let signer = if reason == MOVES_TO_THE_CURRENT_CA {
                (ca.clone(), ca_key.clone())
            } else {
                signer
            };
            why.push(reason);
            let authority = CertificateAuthority::from_pem(&signer.0, &signer.1)?;
            let ca_not_after = blocks(&signer.0).first().map(|b| b.not_after);
            let not_after = at(now, lifetimes.serving);
            let issued = authority.issue_server_valid(
                sans,
                Validity {
                    not_before: before(now, BACKDATE),
                    not_after: ca_not_after.map_or(not_after, |c| c.min(not_after)),
                },
            )?;
            (issued.cert_pem, issued.key_pem)
        }
        None => (current.cert.clone(), current.key.clone()),
    };
    let (previous_ca, previous_ca_key) = previous.unwrap_or_default();
    let contents = Contents {
        bundle: new_bundle,
        ca_key,
        previous_ca,
        previous_ca_key,
        cert,
        key,
    };
    if &contents == current {
        return Ok(Plan::Keep);
    }
    if why.is_empty() {
        why.push("earlier CAs left the bundle".to_string());
    }
    Ok(Plan::Write {
        contents,
        why: why.join("; "),
    })
}

fn text(secret: &Secret, key: &str) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| String::from_utf8_lossy(&v.0).to_string())
        .unwrap_or_default()
}

fn contents_of(secret: &Secret) -> Contents {
    Contents {
        bundle: text(secret, CA_BUNDLE),
        ca_key: text(secret, CA_KEY),
        previous_ca: text(secret, PREVIOUS_CA_CERT),
        previous_ca_key: text(secret, PREVIOUS_CA_KEY),
        cert: text(secret, TLS_CERT),
        key: text(secret, TLS_KEY),
    }
}

fn data(contents: &Contents) -> std::collections::BTreeMap<String, ByteString> {
    [
        (CA_BUNDLE, &contents.bundle),
        (CA_KEY, &contents.ca_key),
        (PREVIOUS_CA_CERT, &contents.previous_ca),
        (PREVIOUS_CA_KEY, &contents.previous_ca_key),
        (TLS_CERT, &contents.cert),
        (TLS_KEY, &contents.key),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
    .collect()
}

/// Where the certificates are kept and what they name.
#[derive(Clone, Debug)]
pub struct SecretSource {
    pub namespace: String,
    pub name: String,
    pub sans: Vec<String>,
    pub lifetimes: Lifetimes,
}

/// What the keeper publishes: the served certificate goes into the store; the bundle into
/// `bundle` (empty until the Secret was read once), with `changed` notified.
pub struct Published {
    pub store: Arc<CertificateStore>,
    pub bundle: Arc<ArcSwap<String>>,
    pub changed: Arc<Notify>,
}

/// One round: read the Secret, write it when [`plan`] says so, and publish what it holds.
/// Returns what was done, for the log.
pub async fn round(
    client: &kube::Client,
    source: &SecretSource,
    published: &Published,
    loaded: &mut Contents,
) -> Result<Option<String>, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &source.namespace);
    let fix = format!(
        "the webhook needs get, create and update on Secret {}/{} (the chart grants them)",
        source.namespace, source.name
    );
    let existing = api.get_opt(&source.name).await.map_err(|e| {
        format!(
            "reading Secret {}/{}: {e}; {fix}",
            source.namespace, source.name
        )
    })?;
    let current = existing.as_ref().map(contents_of);
    let plan = plan(
        current.as_ref(),
        &source.sans,
        source.lifetimes,
        OffsetDateTime::now_utc(),
    )
    .map_err(|e| format!("issuing the webhook certificates: {e}"))?;
    let (contents, done) = match (plan, existing) {
        (Plan::Keep, _) => (current.unwrap_or_default(), None),
        (Plan::Write { contents, why }, Some(mut secret)) => {
            secret.data = Some(data(&contents));
            secret.string_data = None;
            // The read resourceVersion stays in the metadata: a replica that wrote first
            // makes this one fail with 409, and the next round reads its result.
            api.replace(&source.name, &PostParams::default(), &secret)
                .await
                .map_err(|e| {
                    format!(
                        "updating Secret {}/{}: {e}; {fix}",
                        source.namespace, source.name
                    )
                })?;
            (contents, Some(why))
        }
        (Plan::Write { contents, why }, None) => {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(source.name.clone()),
                    namespace: Some(source.namespace.clone()),
                    labels: Some(
                        [(
                            "app.kubernetes.io/managed-by".to_string(),
                            "bulkhead-webhook".to_string(),
                        )]
                        .into(),
                    ),
                    ..Default::default()
                },
                type_: Some("kubernetes.io/tls".into()),
                data: Some(data(&contents)),
                ..Default::default()
            };
            api.create(&PostParams::default(), &secret)
                .await
                .map_err(|e| {
                    format!(
                        "creating Secret {}/{}: {e}; {fix}",
                        source.namespace, source.name
                    )
                })?;
            (contents, Some(why))
        }
    };
    if contents.cert != loaded.cert || contents.key != loaded.key {
        let key = certified_key(&contents.cert, &contents.key).map_err(|e| {
            format!(
                "the serving certificate of Secret {}/{}: {e}",
                source.namespace, source.name
            )
        })?;
        published.store.replace(key);
        loaded.cert = contents.cert.clone();
        loaded.key = contents.key.clone();
    }
    if contents.bundle != loaded.bundle {
        published.bundle.store(Arc::new(contents.bundle.clone()));
        published.changed.notify_one();
        loaded.bundle = contents.bundle;
    }
    Ok(done)
}

/// Keeps the certificates of `source` until `shutdown`: a round every [`CHECK_EVERY`]
/// (a second after a failed one).
pub async fn keep(
    client: kube::Client,
    source: SecretSource,
    published: Published,
    shutdown: CancellationToken,
) {
    let mut loaded = Contents::default();
    loop {
        let wait = match round(&client, &source, &published, &mut loaded).await {
            Ok(Some(why)) => {
                tracing::info!(secret = %format!("{}/{}", source.namespace, source.name), %why, "webhook certificates renewed");
                Duration::from_secs(1)
            }
            Ok(None) => CHECK_EVERY,
            Err(error) => {
                tracing::warn!(%error, "webhook certificates: trying again");
                Duration::from_secs(2)
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86400);

    fn lifetimes() -> Lifetimes {
        Lifetimes {
            serving: 90 * DAY,
            ca: 3650 * DAY,
        }
    }

    fn sans() -> Vec<String> {
        vec![
            "bulkhead-webhook.bulkhead-system.svc".into(),
            "10.0.0.7".into(),
        ]
    }

    fn written(plan: Plan) -> (Contents, String) {
        match plan {
            Plan::Write { contents, why } => (contents, why),
            Plan::Keep => panic!("expected a write"),
        }
    }

    fn start() -> Contents {
        let now = OffsetDateTime::now_utc();
        written(plan(None, &sans(), lifetimes(), now).unwrap()).0
    }

    #[test]
    fn a_missing_secret_gets_a_ca_and_a_serving_certificate_it_signed() {
        let contents = start();
        assert_eq!(blocks(&contents.bundle).len(), 1);
        assert!(signed_by(&contents.cert, &contents.bundle));
        assert!(names_all(&contents.cert, &sans()));
        assert!(certified_key(&contents.cert, &contents.key).is_ok());
        let serving = &blocks(&contents.cert)[0];
        let lifetime = serving.not_after - serving.not_before;
        assert!(lifetime <= time::Duration::days(90) + time::Duration::minutes(5));
    }

    #[test]
    fn a_valid_secret_is_kept() {
        let contents = start();
        let now = OffsetDateTime::now_utc() + time::Duration::days(30);
        assert!(matches!(
            plan(Some(&contents), &sans(), lifetimes(), now).unwrap(),
            Plan::Keep
        ));
    }

    #[test]
    fn the_serving_certificate_is_renewed_by_the_same_ca_when_a_third_is_left() {
        let contents = start();
        let now = OffsetDateTime::now_utc() + time::Duration::days(61);
        let (renewed, why) = written(plan(Some(&contents), &sans(), lifetimes(), now).unwrap());
        assert!(why.contains("serving certificate expires"), "{why}");
        assert_eq!(renewed.bundle, contents.bundle);
        assert_eq!(renewed.ca_key, contents.ca_key);
        assert_ne!(renewed.cert, contents.cert);
        assert!(signed_by(&renewed.cert, &renewed.bundle));
    }

    #[test]
    fn a_new_ca_enters_the_bundle_first_and_signs_only_after_the_propagation_time() {
        let short = Lifetimes {
            serving: 30 * DAY,
            ca: 90 * DAY,
        };
        let contents = written(plan(None, &sans(), short, OffsetDateTime::now_utc()).unwrap()).0;
        let old_ca = blocks(&contents.bundle)[0].pem.clone();
        // 61 days on, the CA is due; the serving certificate was renewed at day 21 and 41
        // in real life; renew it here by hand at day 55 so only the CA is due.
        let day55 = OffsetDateTime::now_utc() + time::Duration::days(55);
        let mid = written(plan(Some(&contents), &sans(), short, day55).unwrap()).0;
        let day61 = OffsetDateTime::now_utc() + time::Duration::days(61);
        let (rotated, why) = written(plan(Some(&mid), &sans(), short, day61).unwrap());
        assert!(why.contains("the CA expires"), "{why}");
        let bundle = blocks(&rotated.bundle);
        assert_eq!(bundle.len(), 2, "the new CA and the old one");
        assert_eq!(bundle[1].pem, old_ca);
        assert_eq!(rotated.cert, mid.cert, "still signed by the old CA");
        // A moment later: unchanged.
        let soon = day61 + time::Duration::seconds(20);
        assert!(matches!(
            plan(Some(&rotated), &sans(), short, soon).unwrap(),
            Plan::Keep
        ));
        // After the propagation time: the serving certificate moves to the new CA.
        let later = day61 + time::Duration::seconds(61);
        let (moved, why) = written(plan(Some(&rotated), &sans(), short, later).unwrap());
        assert!(why.contains("moves to the current CA"), "{why}");
        assert_eq!(moved.bundle, rotated.bundle);
        assert!(signed_by(&moved.cert, &bundle[0].pem));
        // Once the old CA expired it leaves the bundle.
        let after = OffsetDateTime::now_utc() + time::Duration::days(91);
        let (pruned, _) = written(plan(Some(&moved), &sans(), short, after).unwrap());
        assert_eq!(blocks(&pruned.bundle)[0].pem, bundle[0].pem);
        assert!(!pruned.bundle.contains(&old_ca));
    }

    #[test]
    fn a_serving_certificate_due_while_the_new_ca_is_too_new_is_signed_by_the_previous_one() {
        let short = Lifetimes {
            serving: 30 * DAY,
            ca: 90 * DAY,
        };
        let start = OffsetDateTime::now_utc();
        let contents = written(plan(None, &sans(), short, start).unwrap()).0;
        let day = |d: i64| start + time::Duration::days(d);
        // Day 50: the serving certificate renewed (valid to day 80); day 61: the CA due.
        let mid = written(plan(Some(&contents), &sans(), short, day(50)).unwrap()).0;
        let rotated = written(plan(Some(&mid), &sans(), short, day(61)).unwrap()).0;
        assert_eq!(rotated.previous_ca, blocks(&contents.bundle)[0].pem);
        assert_eq!(rotated.cert, mid.cert);
        // Pretend the serving certificate is due 20 s after the rotation: it is renewed,
        // by the previous CA, since API servers may not trust the new one yet.
        let mut due_now = rotated.clone();
        let soon = day(61) + time::Duration::seconds(20);
        let old = CertificateAuthority::from_pem(&rotated.previous_ca, &rotated.previous_ca_key)
            .unwrap()
            .issue_server_valid(
                &sans(),
                Validity {
                    not_before: soon - time::Duration::minutes(5),
                    not_after: soon + time::Duration::seconds(30),
                },
            )
            .unwrap();
        due_now.cert = old.cert_pem;
        due_now.key = old.key_pem;
        let (renewed, why) = written(plan(Some(&due_now), &sans(), short, soon).unwrap());
        assert!(why.contains("expires"), "{why}");
        assert!(
            signed_by(&renewed.cert, &rotated.previous_ca),
            "signed by the previous CA"
        );
        // Once settled, it moves to the new CA, and the previous one is kept until it
        // expires.
        let later = day(61) + time::Duration::seconds(70);
        let (moved, why) = written(plan(Some(&renewed), &sans(), short, later).unwrap());
        assert!(why.contains("moves to the current CA"), "{why}");
        assert!(signed_by(&moved.cert, &blocks(&moved.bundle)[0].pem));
        assert_eq!(moved.previous_ca, rotated.previous_ca);
        let expired = written(plan(Some(&moved), &sans(), short, day(91)).unwrap()).0;
        assert!(expired.previous_ca.is_empty() && expired.previous_ca_key.is_empty());
    }

    #[test]
    fn the_bundle_keeps_at_most_two_earlier_cas() {
        let short = Lifetimes {
            serving: DAY,
            ca: 9 * DAY,
        };
        let mut contents =
            written(plan(None, &sans(), short, OffsetDateTime::now_utc()).unwrap()).0;
        for day in [7, 14, 21, 28] {
            let now = OffsetDateTime::now_utc() + time::Duration::days(day);
            contents = written(plan(Some(&contents), &sans(), short, now).unwrap()).0;
            assert!(blocks(&contents.bundle).len() <= 1 + EARLIER_CAS);
        }
    }

    #[test]
    fn garbage_new_names_and_a_foreign_certificate_are_replaced() {
        let contents = start();
        let now = OffsetDateTime::now_utc();
        for (broken, expect) in [
            (
                Contents {
                    cert: "nonsense".into(),
                    ..contents.clone()
                },
                "no serving certificate",
            ),
            (
                Contents {
                    ca_key: "nonsense".into(),
                    ..contents.clone()
                },
                "key is missing",
            ),
            (
                Contents {
                    cert: start().cert,
                    key: start().key,
                    ..contents.clone()
                },
                "",
            ),
        ] {
            let (fixed, why) = written(plan(Some(&broken), &sans(), lifetimes(), now).unwrap());
            assert!(why.contains(expect), "{why}");
            // Signed by a CA of the bundle (a lost CA key keeps the serving certificate
            // its old CA signed until the new CA has been published).
            assert!(
                blocks(&fixed.bundle)
                    .iter()
                    .any(|ca| signed_by(&fixed.cert, &ca.pem)),
                "{why}"
            );
            assert!(certified_key(&fixed.cert, &fixed.key).is_ok());
        }
        let more = [sans(), vec!["extra.example.com".to_string()]].concat();
        let (renamed, why) = written(plan(Some(&contents), &more, lifetimes(), now).unwrap());
        assert!(why.contains("does not name all"), "{why}");
        assert!(names_all(&renamed.cert, &more));
        assert_eq!(renamed.bundle, contents.bundle);
    }

    #[test]
    fn a_serving_certificate_never_outlives_its_ca() {
        let short = Lifetimes {
            serving: 30 * DAY,
            ca: 10 * DAY,
        };
        let contents = written(plan(None, &sans(), short, OffsetDateTime::now_utc()).unwrap()).0;
        let ca = &blocks(&contents.bundle)[0];
        let serving = &blocks(&contents.cert)[0];
        assert!(serving.not_after <= ca.not_after);
    }
}
