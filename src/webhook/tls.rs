//! Serving certificates for the webhook: self-issued (a CA and a serving certificate,
//! the CA published as `caBundle`) or loaded from files that are re-read when they
//! change. The TLS server asks [`CertificateStore`] for the certificate on every
//! handshake, so a rotation never needs a restart and never drops a request.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use time::OffsetDateTime;

/// Errors loading or issuing certificates.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("issuing a certificate: {0}")]
    Issue(#[from] rcgen::Error),
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{what} is not valid PEM: {message}")]
    Pem { what: String, message: String },
    #[error("the private key is not usable: {0}")]
    Key(#[from] rustls::Error),
}

/// PEM text of a CA and the serving certificate and key it signed.
#[derive(Clone, Debug)]
pub struct IssuedCertificate {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// A self-signed CA that signs serving certificates; kept in memory.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

/// A certificate's validity period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl CertificateAuthority {
    /// Creates a new CA.
    pub fn new(common_name: &str) -> Result<Self, TlsError> {
        Self::create(common_name, None)
    }

    /// Creates a new CA valid for `validity`; the certificates it signs get their own
    /// validity with [`Self::issue_server_valid`].
    pub fn with_validity(common_name: &str, validity: Validity) -> Result<Self, TlsError> {
        Self::create(common_name, Some(validity))
    }

    fn create(common_name: &str, validity: Option<Validity>) -> Result<Self, TlsError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        if let Some(validity) = validity {
            params.not_before = validity.not_before;
            params.not_after = validity.not_after;
        }
        let key = KeyPair::generate()?;
        let pem = params.self_signed(&key)?.pem();
        Ok(CertificateAuthority {
            issuer: Issuer::new(params, key),
            pem,
        })
    }

    /// A CA kept elsewhere (a Secret): its certificate and private key as PEM.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, TlsError> {
        let key = KeyPair::from_pem(key_pem)?;
        Ok(CertificateAuthority {
            issuer: Issuer::from_ca_cert_pem(cert_pem, key)?,
            pem: cert_pem.to_string(),
        })
    }

    /// The CA's private key as PEM (to keep it in a Secret).
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// The CA certificate, for `caBundle`.
    pub fn pem(&self) -> String {
        self.pem.clone()
    }

    /// Issues a serving certificate for `sans`, valid for `validity`.
    pub fn issue_server_valid(
        &self,
        sans: &[String],
        validity: Validity,
    ) -> Result<IssuedCertificate, TlsError> {
        self.sign(
            "bulkhead-webhook",
            None,
            sans,
            ExtendedKeyUsagePurpose::ServerAuth,
            Some(validity),
        )
    }

    /// Issues a serving certificate for `sans` (IP addresses become IP SANs).
    pub fn issue(&self, sans: &[String]) -> Result<IssuedCertificate, TlsError> {
        self.issue_server("bulkhead-webhook", sans)
    }

    /// Issues a serving certificate named `common_name` for `sans`.
    pub fn issue_server(
        &self,
        common_name: &str,
        sans: &[String],
    ) -> Result<IssuedCertificate, TlsError> {
        self.sign(
            common_name,
            None,
            sans,
            ExtendedKeyUsagePurpose::ServerAuth,
            None,
        )
    }

    /// Issues a client certificate (`CN=common_name`, `O=organization`), as Kubernetes
    /// reads user and group from them.
    pub fn issue_client(
        &self,
        common_name: &str,
        organization: Option<&str>,
    ) -> Result<IssuedCertificate, TlsError> {
        self.sign(
            common_name,
            organization,
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
            None,
        )
    }

    fn sign(
        &self,
        common_name: &str,
        organization: Option<&str>,
        sans: &[String],
        usage: ExtendedKeyUsagePurpose,
        validity: Option<Validity>,
    ) -> Result<IssuedCertificate, TlsError> {
        let mut params = CertificateParams::new(sans.to_vec())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        if let Some(organization) = organization {
            params
                .distinguished_name
                .push(DnType::OrganizationName, organization);
        }
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if let Some(validity) = validity {
            params.not_before = validity.not_before;
            params.not_after = validity.not_after;
        }
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCertificate {
            ca_pem: self.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Builds a rustls key from PEM text.
pub fn certified_key(cert_pem: &str, key_pem: &str) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            what: "the certificate".into(),
            message: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Pem {
            what: "the certificate".into(),
            message: "no CERTIFICATE block".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| TlsError::Pem {
        what: "the private key".into(),
        message: e.to_string(),
    })?;
    let signing_key = rustls::crypto::ring::sign::any_supported_type(&key)?;
    Ok(CertifiedKey::new(chain, signing_key))
}

/// The certificate currently served; swapped atomically on rotation.
#[derive(Debug)]
pub struct CertificateStore {
    current: ArcSwap<CertifiedKey>,
}

impl CertificateStore {
    pub fn new(key: CertifiedKey) -> Arc<Self> {
        Arc::new(CertificateStore {
            current: ArcSwap::from_pointee(key),
        })
    }

    /// Serves `key` from the next handshake on.
    pub fn replace(&self, key: CertifiedKey) {
        self.current.store(Arc::new(key));
    }

    /// The certificate served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }
}

impl ResolvesServerCert for CertificateStore {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// A rustls server configuration that asks `store` on every handshake.
pub fn server_config(store: Arc<CertificateStore>) -> rustls::ServerConfig {
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(store);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Loads a certificate and key from files.
pub fn load_files(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    certified_key(&read(cert)?, &read(key)?)
}

/// Re-reads `cert` and `key` whenever either file changes (checked every `every`) and
/// swaps them into `store`; a pair that does not load is logged and the old one stays.
pub async fn watch_files(
    store: Arc<CertificateStore>,
    cert: PathBuf,
    key: PathBuf,
    every: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut seen = (modified(&cert), modified(&key));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let now = (modified(&cert), modified(&key));
        if now == seen {
            continue;
        }
        match load_files(&cert, &key) {
            Ok(loaded) => {
                store.replace(loaded);
                seen = now;
                tracing::info!(cert = %cert.display(), "serving certificate reloaded");
            }
            Err(error) => {
                tracing::warn!(%error, "new certificate files do not load; keeping the current ones")
            }
        }
    }
}

/// Re-reads the CA bundle file `path` whenever it changes (checked every `every`) into
/// `bundle`, notifying `changed`; a file that is not a certificate is logged and skipped.
pub async fn watch_bundle_file(
    path: PathBuf,
    bundle: Arc<ArcSwap<String>>,
    changed: Arc<tokio::sync::Notify>,
    every: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut seen = modified(&path);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let now = modified(&path);
        if now == seen {
            continue;
        }
        match read(&path) {
            Ok(pem) if pem.contains("-----BEGIN CERTIFICATE-----") => {
                seen = now;
                if **bundle.load() != pem {
                    bundle.store(Arc::new(pem));
                    changed.notify_one();
                    tracing::info!(file = %path.display(), "CA bundle reloaded");
                }
            }
            Ok(_) => {
                tracing::warn!(file = %path.display(), "the CA bundle file holds no certificate; keeping the current bundle")
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read the CA bundle file; keeping the current bundle")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }

    #[test]
    fn issues_a_usable_v3_certificate_for_ip_and_dns_names() {
        provider();
        let ca = CertificateAuthority::new("test-ca").unwrap();
        let issued = ca
            .issue(&[
                "127.0.0.1".into(),
                "bulkhead-webhook.bulkhead-system.svc".into(),
            ])
            .unwrap();
        assert!(issued.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        let key = certified_key(&issued.cert_pem, &issued.key_pem).unwrap();
        assert_eq!(key.cert.len(), 1);
        // rcgen writes X.509 v3: the version field [0] EXPLICIT INTEGER 2 follows the
        // outer SEQUENCE headers.
        let der = key.cert[0].as_ref();
        assert!(
            der.windows(5)
                .take(16)
                .any(|w| w == [0xa0, 0x03, 0x02, 0x01, 0x02]),
            "X.509 v3"
        );
    }

    #[test]
    fn rejects_garbage_pem_with_a_clear_error() {
        provider();
        let error = certified_key("not a certificate", "nor a key")
            .unwrap_err()
            .to_string();
        assert!(error.contains("the certificate"), "{error}");
    }

    #[test]
    fn replacing_the_certificate_changes_what_is_served() {
        provider();
        let ca = CertificateAuthority::new("test-ca").unwrap();
        let first = ca.issue(&["127.0.0.1".into()]).unwrap();
        let second = ca.issue(&["127.0.0.1".into()]).unwrap();
        let store = CertificateStore::new(certified_key(&first.cert_pem, &first.key_pem).unwrap());
        let before = store.current().cert[0].clone();
        store.replace(certified_key(&second.cert_pem, &second.key_pem).unwrap());
        assert_ne!(store.current().cert[0], before);
    }
}
