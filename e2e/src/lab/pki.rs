//! Certificates for one lab cluster: a serving CA and a client CA (two CAs, as a real
//! cluster has), the API server's serving certificate, an admin client certificate
//! (`O=system:masters`), the controller manager's (`CN=system:kube-controller-manager`)
//! and the service-account signing key, issued by the same
//! `CertificateAuthority` the webhook uses. rcgen makes X.509 v3
//! certificates, which rustls requires (a v1 certificate fails with
//! `UnsupportedCertVersion`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use bulkhead::webhook::tls::CertificateAuthority;
use rcgen::KeyPair;

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
    /// The hub's kube-controller-manager's own client certificate (CN
    /// `system:kube-controller-manager`, as kubeadm gives it).
    pub fn controller_manager_cert(&self) -> PathBuf {
        self.dir.join("controller-manager.crt")
    }
    pub fn controller_manager_key(&self) -> PathBuf {
        self.dir.join("controller-manager.key")
    }
    pub fn service_account_key(&self) -> PathBuf {
        self.dir.join("sa.key")
    }
    pub fn service_account_public_key(&self) -> PathBuf {
        self.dir.join("sa.pub")
    }
}

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

/// Generates a cluster's PKI into `paths.dir`. `sans` are the serving certificate's
/// subject alternative names (IPs become IP SANs).
pub fn generate(cluster: &str, sans: &[String], paths: &PkiPaths) -> Result<()> {
    std::fs::create_dir_all(&paths.dir)?;
    let serving_ca = CertificateAuthority::new(&format!("bulkhead-lab-{cluster}-serving-ca"))?;
    let client_ca = CertificateAuthority::new(&format!("bulkhead-lab-{cluster}-client-ca"))?;
    let serving = serving_ca.issue_server("kube-apiserver", sans)?;
    let admin = client_ca.issue_client("bulkhead-lab-admin", Some("system:masters"))?;
    let controller_manager = client_ca.issue_client("system:kube-controller-manager", None)?;
    let service_account_key = KeyPair::generate()?;

    write(&paths.serving_ca(), &serving_ca.pem())?;
    write(&paths.client_ca(), &client_ca.pem())?;
    write(&paths.apiserver_cert(), &serving.cert_pem)?;
    write(&paths.apiserver_key(), &serving.key_pem)?;
    write(&paths.admin_cert(), &admin.cert_pem)?;
    write(&paths.admin_key(), &admin.key_pem)?;
    write(
        &paths.controller_manager_cert(),
        &controller_manager.cert_pem,
    )?;
    write(&paths.controller_manager_key(), &controller_manager.key_pem)?;
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
