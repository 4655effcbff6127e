//! What end-to-end tests use: the lab (started on first use, reused afterwards), a
//! client per cluster, a unique namespace per test that is deleted afterwards, and
//! partitions that heal when the test ends, even when it fails.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::lab::{Lab, UpOutcome, client_from};

/// Starts the lab unless it is already running, and returns it. Lab operations are
/// serialised by a file lock, so concurrent tests and a person's `e2e/lab up` agree.
pub async fn lab() -> Result<Lab> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let lab = Lab::from_env();
    if !lab.is_running().await {
        match lab.up().await? {
            UpOutcome::Started { seconds } => eprintln!("e2e: started the lab in {seconds} s"),
            UpOutcome::AlreadyRunning => {}
        }
    }
    Ok(lab)
}

/// A test's own namespaced CRD of `group`, version v1: `kind`, `plural`, the object
/// `schema` (its openAPIV3Schema), and the status subresource when `status` is set.
pub fn test_crd(
    group: &str,
    kind: &str,
    plural: &str,
    schema: serde_json::Value,
    status: bool,
) -> serde_json::Value {
    let mut version = serde_json::json!({
        "name": "v1", "served": true, "storage": true,
        "schema": {"openAPIV3Schema": schema}
    });
    if status {
        version["subresources"] = serde_json::json!({"status": {}});
    }
    serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind},
            "versions": [version]
        }
    })
}

/// Installs a test's own CRD (`crd`, a CustomResourceDefinition as JSON) in the hub and
/// every member, and waits until it is Established everywhere.
pub async fn install_crd_everywhere(crd: &serde_json::Value) -> Result<()> {
    let lab = lab().await?;
    let name = crd["metadata"]["name"].as_str().unwrap_or("crd");
    let dir = std::env::temp_dir().join(format!("bulkhead-crd-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("crd.yaml"), serde_yaml::to_string(crd)?)?;
    for cluster in ["hub", "east", "west", "north"] {
        lab.install_crds(cluster, &dir)
            .await
            .with_context(|| format!("the {name} CRD in {cluster}"))?;
    }
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// A namespace created in several clusters for one test, deleted when dropped.
pub struct TestNamespace {
    pub name: String,
    /// Kubeconfigs of the clusters holding the namespace. Drop builds fresh clients from
    /// them: a client is bound to the runtime that created it, which Drop may be blocking.
    kubeconfigs: Vec<PathBuf>,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl TestNamespace {
    /// Creates `e2e-<prefix>-<unique>` in every cluster of `clusters`.
    pub async fn create(lab: &Lab, prefix: &str, clusters: &[&str]) -> Result<Self> {
        let name = format!(
            "e2e-{prefix}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let mut kubeconfigs = vec![];
        for cluster in clusters {
            let client = lab.inside_client(cluster).await?;
            let namespace: Namespace = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": {"bulkhead-e2e": "true"}}
            }))?;
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &namespace)
                .await
                .with_context(|| format!("creating namespace {name} in {cluster}"))?;
            kubeconfigs.push(lab.inside_kubeconfig(cluster));
        }
        Ok(TestNamespace { name, kubeconfigs })
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let name = self.name.clone();
        cleanup_blocking(std::mem::take(&mut self.kubeconfigs), move |client| {
            let name = name.clone();
            async move {
                let _ = Api::<Namespace>::all(client)
                    .delete(&name, &DeleteParams::background())
                    .await;
            }
        });
    }
}

/// Runs `cleanup` against each cluster from a `Drop` impl. Drop cannot await, and a
/// client is bound to the runtime that created it (which Drop may be blocking), so this
/// builds fresh clients from the kubeconfig files on a short-lived runtime of its own.
pub fn cleanup_blocking<F, Fut>(kubeconfigs: Vec<PathBuf>, cleanup: F)
where
    F: Fn(kube::Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let _ = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async {
            for kubeconfig in kubeconfigs {
                if let Ok(client) = client_from(&kubeconfig).await {
                    cleanup(client).await;
                }
            }
        });
    })
    .join();
}

/// A member cut off from the hub for as long as the guard lives.
pub struct Partition<'a> {
    lab: &'a Lab,
    member: String,
}

impl<'a> Partition<'a> {
    /// Partitions `member` (see [`Lab::partition`]).
    pub fn start(lab: &'a Lab, member: &str) -> Result<Self> {
        lab.partition(member)?;
        Ok(Partition {
            lab,
            member: member.to_string(),
        })
    }

    /// Heals now.
    pub fn heal(self) -> Result<()> {
        self.lab.heal(&self.member)
    }
}

impl Drop for Partition<'_> {
    fn drop(&mut self) {
        let _ = self.lab.heal(&self.member);
    }
}

/// Asserts that an API call was refused as invalid (422) with a message containing
/// `fragment`, and returns the message.
pub fn expect_invalid<T: std::fmt::Debug>(
    result: Result<T, kube::Error>,
    fragment: &str,
) -> String {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "expected 422 Invalid: {}", status.message);
            assert!(
                status.message.contains(fragment),
                "expected {fragment:?} in {:?}",
                status.message
            );
            status.message.clone()
        }
        other => panic!("expected the API server to refuse it as invalid, got {other:?}"),
    }
}

/// Asserts that an API call was refused by admission (a webhook denial arrives as 400,
/// 403 or 422 depending on the path) with a message containing `fragment`.
pub fn expect_invalid_or_forbidden<T: std::fmt::Debug>(
    result: Result<T, kube::Error>,
    fragment: &str,
) -> String {
    match result {
        Err(kube::Error::Api(status)) => {
            assert!(
                [400, 403, 422].contains(&status.code),
                "unexpected code {}: {}",
                status.code,
                status.message
            );
            assert!(
                status.message.contains(fragment),
                "expected {fragment:?} in {:?}",
                status.message
            );
            status.message.clone()
        }
        other => panic!("expected admission to refuse it, got {other:?}"),
    }
}

/// `GET path` on a plain-HTTP port of this host (probe and metrics servers): status and
/// body.
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await?;
    let status = raw.get(9..12).context("short response")?.parse()?;
    Ok((
        status,
        raw.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default(),
    ))
}
