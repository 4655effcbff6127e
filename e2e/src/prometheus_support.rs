//! A real Prometheus for the rollout tests (Debian's `prometheus`, installed by
//! `e2e/setup.sh`), scraping a tiny application's metrics endpoint served by the test
//! process: per member, the requests of the Deployment copy the test names, labelled by
//! cluster and by the revision the copy holds, with an error share and a latency the
//! copy's pod template says (`DEMO_ERROR_RATE`, `DEMO_LATENCY_SECONDS` in its first
//! container's env). A bad revision is then a template change, as it is for users.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::api::DynamicObject;
use kube::{Api, Client};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::agent_support::free_port;

/// A Prometheus server, killed when dropped.
pub struct Prometheus {
    child: Child,
    pub port: u16,
    _dir: PathBuf,
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (`host:port`) every second and waits until it
    /// is ready.
    pub async fn start(targets: &[String]) -> Result<Self> {
        let binary = which("prometheus")
            .context("prometheus is not installed: run e2e/setup.sh (Debian package prometheus)")?;
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("bulkhead-prometheus-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n- job_name: demo\n  static_configs:\n  - targets: [{}]\n",
            targets
                .iter()
                .map(|t| format!("'{t}'"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        std::fs::write(dir.join("prometheus.yml"), config)?;
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let child = Command::new(binary)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting prometheus")?;
        let prometheus = Self {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((200, _)) = http_get(port, "/-/ready").await {
                return Ok(prometheus);
            }
            if Instant::now() > deadline {
                bail!("prometheus on port {port} not ready within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The base URL a policy's analysis names.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// An instant query's first sample, if any.
    pub async fn query(&self, query: &str) -> Result<Option<f64>> {
        let encoded = bulkhead::hub::federation::analysis::url_encode(query);
        let (status, body) = http_get(self.port, &format!("/api/v1/query?query={encoded}")).await?;
        if status != 200 {
            bail!("prometheus answered {status}: {body}");
        }
        let answer: serde_json::Value = serde_json::from_str(&body)?;
        Ok(answer["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok()))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| PathBuf::from(dir).join(program))
        .find(|path| path.is_file())
}

/// A minimal HTTP/1.0 GET to 127.0.0.1:`port`: (status, body).
async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer))
        .await
        .context("no answer within 10 s")??;
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("not an HTTP answer")?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// What the demo application counted per (cluster, revision): requests, errors, and the
/// sum of their latencies.
#[derive(Default)]
struct Counted {
    requests: f64,
    errors: f64,
    latency_sum: f64,
    /// Requests per histogram bucket (`le`).
    buckets: BTreeMap<String, f64>,
}

/// What was counted per (cluster, revision), and when each member's copy was last read.
#[derive(Default)]
struct Counters {
    counted: BTreeMap<(String, String), Counted>,
    last_read: BTreeMap<String, Instant>,
}

/// The demo application's metrics endpoint, served until dropped.
pub struct DemoApp {
    pub port: u16,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for DemoApp {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Requests per second each Ready replica serves.
const REQUESTS_PER_REPLICA: f64 = 10.0;
const BUCKETS: [f64; 5] = [0.05, 0.1, 0.25, 0.5, 1.0];
/// How often each member's copy is read. The copies are read apart from the scrapes, so a
/// slow member API server never makes a scrape miss Prometheus's 1 s timeout.
const READ_EVERY: Duration = Duration::from_millis(500);

impl DemoApp {
    /// Serves `/metrics` for the Deployment `name` in `namespace` of every member.
    pub async fn start(
        members: BTreeMap<String, Client>,
        namespace: &str,
        name: &str,
    ) -> Result<Self> {
        Self::start_on(members, namespace, name, 0).await
    }

    /// [`DemoApp::start`] on 127.0.0.1:`port` (0: any free port).
    pub async fn start_on(
        members: BTreeMap<String, Client>,
        namespace: &str,
        name: &str,
        port: u16,
    ) -> Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let port = listener.local_addr()?.port();
        let state: Arc<Mutex<Counters>> = Arc::default();
        let mut tasks = vec![];
        for (cluster, client) in members {
            let (state, namespace, name) = (state.clone(), namespace.to_string(), name.to_string());
            tasks.push(tokio::spawn(async move {
                loop {
                    count(&cluster, &client, &state, &namespace, &name).await;
                    tokio::time::sleep(READ_EVERY).await;
                }
            }));
        }
        tasks.push(tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = state.clone();
                tokio::spawn(async move {
                    let mut request = [0u8; 4096];
                    let _ = stream.read(&mut request).await;
                    let body = render(&state);
                    let _ = stream
                        .write_all(
                            format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                body.len()
                            )
                            .as_bytes(),
                        )
                        .await;
                });
            }
        }));
        Ok(Self { port, tasks })
    }

    pub fn target(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// Reads `cluster`'s copy and counts the requests it served since its last read (at its
/// revision, error share and latency). A copy that cannot be read serves nothing.
async fn count(
    cluster: &str,
    client: &Client,
    state: &Mutex<Counters>,
    namespace: &str,
    name: &str,
) {
    let deployments = kube::api::ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &deployments);
    let copy = match tokio::time::timeout(Duration::from_secs(2), api.get_opt(name)).await {
        Ok(Ok(Some(copy))) => copy,
        _ => {
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            state.last_read.insert(cluster.to_string(), Instant::now());
            return;
        }
    };
    let revision = copy
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(bulkhead::api::rollout::ANNOTATION_REVISION).cloned())
        .unwrap_or_else(|| "none".into());
    let env = |key: &str| -> f64 {
        copy.data["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == key)
            .and_then(|e| e["value"].as_str()?.parse().ok())
            .unwrap_or(0.0)
    };
    let ready = copy.data["status"]["readyReplicas"].as_f64().unwrap_or(0.0);
    let error_rate = env("DEMO_ERROR_RATE").clamp(0.0, 1.0);
    let latency = env("DEMO_LATENCY_SECONDS").max(0.01);
    let now = Instant::now();
    let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
    let elapsed = state
        .last_read
        .insert(cluster.to_string(), now)
        .map_or(0.0, |last| (now - last).as_secs_f64());
    let served = ready * REQUESTS_PER_REPLICA * elapsed;
    let counted = state
        .counted
        .entry((cluster.to_string(), revision))
        .or_default();
    counted.requests += served;
    counted.errors += served * error_rate;
    counted.latency_sum += served * latency;
    for le in BUCKETS {
        *counted.buckets.entry(format!("{le}")).or_default() +=
            if latency <= le { served } else { 0.0 };
    }
}

/// Every series counted so far, in Prometheus's text format.
fn render(state: &Mutex<Counters>) -> String {
    let state = state.lock().unwrap_or_else(|p| p.into_inner());
    let mut text = String::from(
        "# TYPE demo_requests_total counter\n# TYPE demo_request_duration_seconds histogram\n",
    );
    for ((cluster, revision), counted) in &state.counted {
        let labels = format!("cluster=\"{cluster}\",revision=\"{revision}\"");
        let ok = counted.requests - counted.errors;
        text.push_str(&format!(
            "demo_requests_total{{{labels},code=\"200\"}} {ok}\n"
        ));
        text.push_str(&format!(
            "demo_requests_total{{{labels},code=\"500\"}} {}\n",
            counted.errors
        ));
        for (le, count) in &counted.buckets {
            text.push_str(&format!(
                "demo_request_duration_seconds_bucket{{{labels},le=\"{le}\"}} {count}\n"
            ));
        }
        text.push_str(&format!(
            "demo_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}\n",
            counted.requests
        ));
        text.push_str(&format!(
            "demo_request_duration_seconds_sum{{{labels}}} {}\ndemo_request_duration_seconds_count{{{labels}}} {}\n",
            counted.latency_sum, counted.requests
        ));
    }
    text
}
