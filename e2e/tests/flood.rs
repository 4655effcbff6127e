//! Lab benchmark for hostile clients of the hub's webhook (issue 29): a hub with its
//! in-process webhook, joined to the lab's members, while clients flood the webhook's
//! port. It prints numbers and asserts only what the limits promise (every flooding
//! connection closed, the lease never lapsing long enough for an agent to fence), never
//! time; `#[ignore]`d in `make test`, run by `make bench-lab` (release hub) or
//! `e2e/run-e2e.sh --test flood --ignored bench_ --nocapture`. docs/benchmarks.md keeps
//! the figures.
//!
//! - 2,000 slow connections at once: 1,000 that connect and send nothing, 1,000 that
//!   finish the TLS handshake and send request headers that never end;
//! - 16 concurrent reviews of just under 4 MiB each, three rounds.
//!
//! Measured meanwhile: the hub's RSS (`/proc/<pid>/status`), the longest gap between two
//! renewals of the fencing Lease seen in each member, and the webhook's answers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use bulkhead_e2e::agent_support::free_port;
use bulkhead_e2e::bench::{LeaseWatch, rss_mib};
use bulkhead_e2e::federation::{Federation, LEASE_DURATION_SECONDS};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::Api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SILENT: usize = 1_000;
const SLOW_HEADERS: usize = 1_000;
const BODIES: usize = 16;
const BODY_BYTES: usize = 4 * 1024 * 1024 - 4 * 1024;

/// A TLS client trusting the webhook's CA.
fn connector(ca_pem: &[u8]) -> Result<tokio_rustls::TlsConnector> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(certificate?)?;
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Reads until the server closes the connection; how long that took.
async fn until_closed<S: tokio::io::AsyncRead + Unpin>(mut stream: S, since: Instant) -> Duration {
    let mut buffer = [0u8; 512];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return since.elapsed(),
            Ok(_) => {}
        }
    }
}

/// One review of about `BODY_BYTES`: an AdmissionReview of a ConfigMap carrying one large
/// value (read, parsed and allowed; nothing about it is reviewed).
fn large_review(uid: usize) -> Vec<u8> {
    let filler = "x".repeat(BODY_BYTES - 1024);
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("flood-{uid}"),
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "namespace": "default", "name": "big", "operation": "CREATE",
            "userInfo": {"username": "flood"},
            "object": {"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "big", "namespace": "default"},
                       "data": {"big": filler}}
        }
    }))
    .expect("JSON")
}

/// POSTs `body` to /validate over TLS; the HTTP status (0: no answer).
async fn post(
    address: std::net::SocketAddr,
    connector: tokio_rustls::TlsConnector,
    body: Vec<u8>,
) -> u16 {
    let Ok(tcp) = TcpStream::connect(address).await else {
        return 0;
    };
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let Ok(mut tls) = connector.connect(name, tcp).await else {
        return 0;
    };
    let head = format!(
        "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if tls.write_all(head.as_bytes()).await.is_err() || tls.write_all(&body).await.is_err() {
        return 0;
    }
    let _ = tls.flush().await;
    let mut raw = Vec::new();
    let _ = tls.read_to_end(&mut raw).await;
    String::from_utf8_lossy(&raw)
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Samples the hub's RSS every 100 ms until `stop`; the largest seen.
fn watch_rss(pid: u32, stop: Arc<std::sync::atomic::AtomicBool>) -> tokio::task::JoinHandle<f64> {
    tokio::spawn(async move {
        let mut most: f64 = 0.0;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            if let Some(rss) = rss_mib(pid) {
                most = most.max(rss);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        most
    })
}

#[tokio::test]
#[ignore = "a lab benchmark: make bench-lab"]
async fn bench_webhook_flood() -> Result<()> {
    // Room for the flood's sockets in this process.
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 16_384, 16_384)
        .context("raising the open-files limit")?;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let url = format!("https://127.0.0.1:{port}");
    let configuration = format!("e2e-flood-{}", std::process::id());
    let federation = Federation::start(
        "flood",
        &[
            "--webhook",
            "--listen",
            &listen,
            "--url",
            &url,
            "--configuration-name",
            &configuration,
            // Admission for nothing in the lab: the flood is the only client.
            "--selector-label",
            "bulkhead-e2e-flood=none",
        ],
    )
    .await?;
    let pid = federation.hub_pid().context("hub pid")?;
    let configurations = Api::<ValidatingWebhookConfiguration>::all(federation.hub.clone());
    let ca = bulkhead_e2e::wait_for(
        "the webhook's configuration (its CA)",
        Duration::from_secs(60),
        || {
            let configurations = configurations.clone();
            let name = format!("{configuration}-validating");
            async move {
                match configurations.get_opt(&name).await {
                    Ok(Some(c)) => match c
                        .webhooks
                        .and_then(|w| w.into_iter().next())
                        .and_then(|w| w.client_config.ca_bundle)
                    {
                        Some(ca) => bulkhead_e2e::Check::Done(ca.0),
                        None => bulkhead_e2e::Check::Waiting("no caBundle".into()),
                    },
                    Ok(None) => bulkhead_e2e::Check::Waiting("not yet".into()),
                    Err(e) => bulkhead_e2e::Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await?;
    let connector = connector(&ca)?;
    let address: std::net::SocketAddr = listen.parse()?;
    let mut leases = LeaseWatch::start(&federation);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let baseline = rss_mib(pid).unwrap_or_default();
    let began = Instant::now();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rss = watch_rss(pid, stop.clone());

    // 2,000 slow connections at once.
    let flood_started = Instant::now();
    let mut slow = vec![];
    for _ in 0..SILENT {
        let stream = TcpStream::connect(address).await?;
        slow.push(tokio::spawn(until_closed(stream, flood_started)));
    }
    for _ in 0..SLOW_HEADERS {
        let connector = connector.clone();
        slow.push(tokio::spawn(async move {
            let Ok(tcp) = TcpStream::connect(address).await else {
                return flood_started.elapsed();
            };
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
            let Ok(mut tls) = connector.connect(name, tcp).await else {
                // Refused at the cap, or the handshake cut: closed.
                return flood_started.elapsed();
            };
            let _ = tls
                .write_all(b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                .await;
            let _ = tls.flush().await;
            until_closed(tls, flood_started).await
        }));
    }
    let mut closed: Vec<Duration> = vec![];
    for task in slow {
        closed.push(task.await?);
    }
    closed.sort();
    let all_closed = *closed.last().context("no connection")?;
    let within_30 = closed
        .iter()
        .filter(|d| **d <= Duration::from_secs(30))
        .count();

    // 16 reviews of just under 4 MiB at once, three rounds.
    let mut statuses: Vec<u16> = vec![];
    let bodies_started = Instant::now();
    for round in 0..3 {
        let posts: Vec<_> = (0..BODIES)
            .map(|i| {
                tokio::spawn(post(
                    address,
                    connector.clone(),
                    large_review(round * BODIES + i),
                ))
            })
            .collect();
        for p in posts {
            statuses.push(p.await?);
        }
    }
    let bodies_took = bodies_started.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let peak = rss.await?;
    let after = rss_mib(pid).unwrap_or_default();
    let lease = leases.stats(began, Instant::now());

    let ok = statuses.iter().filter(|s| **s == 200).count();
    let busy = statuses.iter().filter(|s| **s == 503).count();
    println!(
        "| {} slow connections ({SILENT} silent, {SLOW_HEADERS} with endless headers) | all closed {:.1} s after they opened; {within_30} of {} within 30 s |",
        SILENT + SLOW_HEADERS,
        all_closed.as_secs_f64(),
        closed.len()
    );
    println!(
        "| {} reviews of {:.1} MiB, {BODIES} at a time | {ok} answered 200, {busy} 503, {} other; {:.1} s for all |",
        statuses.len(),
        BODY_BYTES as f64 / 1024.0 / 1024.0,
        statuses.len() - ok - busy,
        bodies_took.as_secs_f64()
    );
    println!(
        "| hub RSS | {baseline:.0} MiB before, {peak:.0} MiB at most during the floods, {after:.0} MiB 5 s after |"
    );
    println!("| fencing Lease during the floods | {} |", lease.describe());
    ensure!(
        within_30 == closed.len(),
        "every flooding connection closed within 30 s ({within_30} of {})",
        closed.len()
    );
    let longest = lease.max_gap.values().max().copied().unwrap_or_default();
    ensure!(
        longest < Duration::from_secs(LEASE_DURATION_SECONDS),
        "a member went {longest:?} without a renewal: its agent would have fenced"
    );
    ensure!(ok > 0, "the webhook answered none of the large reviews");
    // The configurations go with the namespace's hub; remove them (a flood's webhook
    // must not outlive the test).
    for suffix in ["validating", "mutating"] {
        let name = format!("{configuration}-{suffix}");
        let _ = match suffix {
            "validating" => configurations
                .delete(&name, &Default::default())
                .await
                .map(|_| ()),
            _ => Api::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>::all(
                federation.hub.clone(),
            )
            .delete(&name, &Default::default())
            .await
            .map(|_| ()),
        };
    }
    drop(federation);
    Ok(())
}
