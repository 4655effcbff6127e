//! Certificates for one lab cluster: a serving CA and a client CA (two CAs, as a real
//! cluster has), the API server's serving certificate, an admin client certificate
//! (`O=system:masters`) and the service-account signing key. rcgen makes X.509 v3
//! certificates, which rustls requires (a v1 certificate fails with
//! `UnsupportedCertVersion`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// Paths of one cluster's PKI files.
#[derive(Clone, Debug)]
pub struct PkiPaths {
    pub dir: PathBuf,
}

impl PkiPaths {
    pub fn new(dir: PathBuf) -> Self {
        PkiPaths { dir }
    }
    pub fn serving_ca(&self) -> PathBuf {
        self.dir.join("serving-ca.crt")
    }
    pub fn client_ca(&self) -> PathBuf {
        self.dir.join("client-ca.crt")
    }
    pub fn apiserver_cert(&self) -> PathBuf {
        self.dir.join("apiserver.crt")
    }
    pub fn apiserver_key(&self) -> PathBuf {
        self.dir.join("apiserver.key")
    }
    pub fn admin_cert(&self) -> PathBuf {
        self.dir.join("admin.crt")
    }
    pub fn admin_key(&self) -> PathBuf {
        self.dir.join("admin.key")
    }
    pub fn service_account_key(&self) -> PathBuf {
        self.dir.join("sa.key")
    }
    pub fn service_account_public_key(&self) -> PathBuf {
        self.dir.join("sa.pub")
    }
}

fn ca(common_name: &str) -> Result<CertifiedIssuer<'static, KeyPair>> {
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
    Ok(CertifiedIssuer::self_signed(params, KeyPair::generate()?)?)
}

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

/// Generates a cluster's PKI into `paths.dir`. `sans` are the serving certificate's
/// subject alternative names (IPs become IP SANs).
pub fn generate(cluster: &str, sans: &[String], paths: &PkiPaths) -> Result<()> {
    std::fs::create_dir_all(&paths.dir)?;
    let serving_ca = ca(&format!("bulkhead-lab-{cluster}-serving-ca"))?;
    let client_ca = ca(&format!("bulkhead-lab-{cluster}-client-ca"))?;

    let mut serving = CertificateParams::new(sans.to_vec())?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    serving.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let serving_key = KeyPair::generate()?;
    let serving_cert = serving.signed_by(&serving_key, &serving_ca)?;

    let mut admin = CertificateParams::new(Vec::<String>::new())?;
    admin
        .distinguished_name
        .push(DnType::CommonName, "bulkhead-lab-admin");
    admin
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    admin.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let admin_key = KeyPair::generate()?;
    let admin_cert = admin.signed_by(&admin_key, &client_ca)?;

    let service_account_key = KeyPair::generate()?;

    write(&paths.serving_ca(), &serving_ca.pem())?;
    write(&paths.client_ca(), &client_ca.pem())?;
    write(&paths.apiserver_cert(), &serving_cert.pem())?;
    write(&paths.apiserver_key(), &serving_key.serialize_pem())?;
    write(&paths.admin_cert(), &admin_cert.pem())?;
    write(&paths.admin_key(), &admin_key.serialize_pem())?;
    write(
        &paths.service_account_key(),
        &service_account_key.serialize_pem(),
    )?;
    write(
        &paths.service_account_public_key(),
        &service_account_key.public_key_pem(),
    )?;
    Ok(())
}
