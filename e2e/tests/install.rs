//! The Helm chart (`charts/bulkhead`) on the lab: it lints, renders with the default and
//! the full values into objects the hub API server accepts (server-side dry run), its
//! schema refuses wrong values, its RBAC is the table in docs/operations.md, and a hub
//! process holding nothing but a token of the chart's service account propagates, fails
//! over and heals with zero `forbidden` answers. Then `helm upgrade` changes a CRD, and
//! `helm uninstall` (crds.keep) leaves CRDs, templates and member copies in place.
//!
//! The lab's hub has no kubelet: the chart's Deployment is created but never runs, and the
//! hub process runs beside the API server with the chart's credentials instead.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bulkhead::api::mydatabase::DatabasePhase;
use bulkhead_e2e::Lab;
use bulkhead_e2e::agent_support::free_port;
use bulkhead_e2e::federation::{Federation, databases, deployments, ready_at};
use bulkhead_e2e::support::Partition;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::PostParams;
use serde::Deserialize;
use serde_json::{Value, json};

const RELEASE: &str = "bulkhead";
const NAMESPACE: &str = "bulkhead-system";
/// The chart's ServiceAccount with release name `bulkhead`.
const SERVICE_ACCOUNT: &str = "bulkhead";
const TOLERATION_SECONDS: u64 = 5;
/// A printer column description the upgrade test changes in a copy of the chart.
const UPGRADED_DESCRIPTION: &str = "Failure domain (as upgraded by e2e)";

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/bulkhead")
}

/// Runs a lab binary (helm, kubectl) against the hub as admin, with `stdin`; echoes it.
fn run(lab: &Lab, program: &str, args: &[&str], stdin: Option<&str>) -> Result<Output> {
    use std::io::Write;
    let mut child = Command::new(lab.bin.join(program))
        .args(args)
        .env("KUBECONFIG", lab.kubeconfig("hub"))
        .env("HELM_CACHE_HOME", lab.root.join("helm/cache"))
        .env("HELM_CONFIG_HOME", lab.root.join("helm/config"))
        .env("HELM_DATA_HOME", lab.root.join("helm/data"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program}"))?;
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .context("stdin")?
            .write_all(text.as_bytes())?;
    }
    drop(child.stdin.take());
    let output = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!(
        "$ {program} {}\n{}{}",
        args.join(" "),
        if stdout.len() > 2000 {
            format!("({} bytes of output)\n", stdout.len())
        } else {
            stdout.to_string()
        },
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(output)
}

fn succeed(lab: &Lab, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let output = run(lab, program, args, stdin)?;
    ensure!(
        output.status.success(),
        "{program} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

fn template(lab: &Lab, extra: &[&str]) -> Result<String> {
    let chart = chart_dir().display().to_string();
    let mut args = vec!["template", RELEASE, &chart, "--namespace", NAMESPACE];
    args.extend(extra);
    succeed(lab, "helm", &args, None)
}

/// The rendered documents, parsed.
fn documents(rendered: &str) -> Result<Vec<Value>> {
    let mut out = vec![];
    for document in serde_yaml::Deserializer::from_str(rendered) {
        let value = Value::deserialize(document)?;
        if !value.is_null() {
            out.push(value);
        }
    }
    Ok(out)
}

fn ensure_namespace(lab: &Lab) -> Result<()> {
    let manifest = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n");
    succeed(lab, "kubectl", &["apply", "-f", "-"], Some(&manifest))?;
    Ok(())
}

#[tokio::test]
async fn the_chart_lints_renders_for_the_api_server_and_refuses_wrong_values() -> Result<()> {
    let lab = bulkhead_e2e::support::lab().await?;
    let chart = chart_dir().display().to_string();
    let full = chart_dir()
        .join("ci/full-values.yaml")
        .display()
        .to_string();
    succeed(&lab, "helm", &["lint", "--strict", &chart], None)?;
    succeed(
        &lab,
        "helm",
        &["lint", "--strict", &chart, "-f", &full],
        None,
    )?;
    // Off the default path, the optional pieces render too (the lab lacks their CRDs).
    for (name, set) in [
        (
            "cert-manager",
            "webhook.certificates.mode=certManager,metrics.serviceMonitor.enabled=true",
        ),
        (
            "process certificates",
            "webhook.certificates.mode=process,replicaCount=1",
        ),
        (
            "no webhook, no leader election",
            "webhook.enabled=false,leaderElection.enabled=false,replicaCount=1,crds.install=false",
        ),
    ] {
        let rendered = template(&lab, &["--set", set])?;
        ensure!(
            rendered.contains("kind: Deployment"),
            "{name}: no Deployment"
        );
    }

    // Real schema validation: the API server's, in a dry run.
    ensure_namespace(&lab)?;
    for values in [None, Some(full.as_str())] {
        let rendered = match values {
            None => template(&lab, &[])?,
            Some(file) => template(&lab, &["-f", file])?,
        };
        let applied = succeed(
            &lab,
            "kubectl",
            &["apply", "--dry-run=server", "-f", "-"],
            Some(&rendered),
        )?;
        let kinds = documents(&rendered)?.len();
        ensure!(
            applied.lines().count() == kinds,
            "{values:?}: the dry run answered {} lines for {kinds} objects:\n{applied}",
            applied.lines().count()
        );
    }

    // The schema refuses a wrong type, an unknown top-level key and an unknown mode.
    for (set, fragment) in [
        ("replicaCount=two", "replicaCount"),
        ("replicas=2", "additional properties 'replicas' not allowed"),
        ("webhook.certificates.mode=selfSigned", "mode"),
        ("leaderElection.enabled=maybe", "enabled"),
        // Inside the Kubernetes-shaped values too.
        ("resources.requests.cpu=lots", "/resources/requests/cpu"),
        ("tolerations[0].operator=Maybe", "/tolerations/0/operator"),
        ("hub.extraEnv[0].value=x", "/hub/extraEnv/0"),
        (
            "topologySpreadConstraints[0].maxSkew=1",
            "whenUnsatisfiable",
        ),
        (
            "protectBindings.extraWriters[0]=it's",
            "/protectBindings/extraWriters/0",
        ),
    ] {
        let args = [
            "template",
            RELEASE,
            &chart,
            "--namespace",
            NAMESPACE,
            "--set",
            set,
        ];
        let output = run(&lab, "helm", &args, None)?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        ensure!(!output.status.success(), "{set} was accepted");
        ensure!(
            stderr.contains("values don't meet the specifications of the schema")
                && stderr.contains(fragment),
            "{set}: not refused by the schema: {stderr}"
        );
    }
    // Two replicas that would publish different CAs are refused with the reason.
    let output = run(
        &lab,
        "helm",
        &[
            "template",
            RELEASE,
            &chart,
            "--set",
            "webhook.certificates.mode=process",
        ],
        None,
    )?;
    ensure!(
        !output.status.success()
            && String::from_utf8_lossy(&output.stderr).contains("needs replicaCount 1"),
        "mode=process with 2 replicas was accepted"
    );
    Ok(())
}

/// The ClusterRole's and the Roles' rules as rendered with the defaults.
fn rendered_rules(rendered: &str) -> Result<Vec<(String, Vec<PolicyRule>)>> {
    let mut out = vec![];
    for document in documents(rendered)? {
        let kind = document["kind"].as_str().unwrap_or_default().to_string();
        if kind == "ClusterRole" || kind == "Role" {
            let rules: Vec<PolicyRule> = serde_json::from_value(document["rules"].clone())?;
            out.push((kind, rules));
        }
    }
    Ok(out)
}

#[tokio::test]
async fn the_chart_grants_exactly_the_documented_permissions() -> Result<()> {
    let lab = bulkhead_e2e::Lab::from_env();
    let rendered = template(&lab, &[])?;
    let docs = std::fs::read_to_string(chart_dir().join("../../docs/operations.md"))?;
    let roles = rendered_rules(&rendered)?;
    ensure!(
        roles.len() == 3,
        "expected a ClusterRole and two Roles (leader election, webhook certificates): {roles:?}"
    );
    for (kind, rules) in roles {
        for rule in &rules {
            for list in [&rule.api_groups, &rule.resources, &rule.resource_names] {
                ensure!(
                    !list.iter().flatten().any(|item| item.contains('*')),
                    "{kind}: a wildcard in {rule:?}"
                );
            }
            ensure!(
                !rule
                    .verbs
                    .iter()
                    .any(|v| v == "*" || v == "escalate" || v == "bind" || v == "impersonate"),
                "{kind}: {rule:?}"
            );
        }
        let table = bulkhead::cli::join::rules_table(&rules);
        ensure!(
            docs.contains(&table),
            "docs/operations.md must list the chart's {kind} exactly:\n{table}"
        );
    }
    Ok(())
}

/// The chart's account's requests in the hub API server's audit log from byte `from` on:
/// (all of them, the refused ones as `verb resource/subresource name: code`, the
/// resources it wrote (a verb other than get, list, watch) with success).
fn audited_requests(
    lab: &Lab,
    from: u64,
) -> Result<(usize, Vec<String>, std::collections::BTreeSet<String>)> {
    let user = format!("system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}");
    let text = std::fs::read(lab.hub_audit_log()).context("the hub's audit log")?;
    let text = String::from_utf8_lossy(&text[usize::try_from(from)?.min(text.len())..]).to_string();
    let mut total = 0;
    let mut refused = vec![];
    let mut written = std::collections::BTreeSet::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if event["user"]["username"] != user.as_str() {
            continue;
        }
        total += 1;
        let code = event["responseStatus"]["code"].as_i64().unwrap_or_default();
        let verb = event["verb"].as_str().unwrap_or_default();
        if (200..300).contains(&code) && !["get", "list", "watch"].contains(&verb) {
            written.insert(
                event["objectRef"]["resource"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
        }
        if code == 401 || code == 403 {
            let object = &event["objectRef"];
            refused.push(format!(
                "{} {}/{} {}: {code}",
                event["verb"].as_str().unwrap_or_default(),
                object["resource"].as_str().unwrap_or_default(),
                object["subresource"].as_str().unwrap_or_default(),
                object["name"].as_str().unwrap_or_default(),
            ));
        }
    }
    Ok((total, refused, written))
}

fn audit_log_size(lab: &Lab) -> u64 {
    std::fs::metadata(lab.hub_audit_log())
        .map(|m| m.len())
        .unwrap_or(0)
}

/// A kubeconfig for the hub whose only credential is a fresh token of the chart's
/// ServiceAccount (TokenRequest, one hour).
async fn service_account_kubeconfig(lab: &Lab, hub: &kube::Client) -> Result<PathBuf> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let answer = Api::<ServiceAccount>::namespaced(hub.clone(), NAMESPACE)
        .create_token_request(SERVICE_ACCOUNT, &PostParams::default(), &request)
        .await
        .context("TokenRequest for the chart's ServiceAccount")?;
    let token = answer
        .status
        .and_then(|s| s.token)
        .context("empty TokenRequest")?;
    let admin: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(lab.kubeconfig("hub"))?)?;
    let cluster = admin["clusters"][0]["cluster"].clone();
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "hub", "cluster": serde_json::to_value(cluster)?}],
        "users": [{"name": "chart-service-account", "user": {"token": token}}],
        "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "chart-service-account"}}],
        "current-context": "hub",
    });
    let path = lab.root.join("hub/chart-service-account.kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig)?)?;
    Ok(path)
}

/// Uninstalls the release and removes what the hub process changed outside it (the
/// MyDatabase conversion it pointed at itself), even when the test fails half-way.
struct Release {
    lab: Lab,
}

impl Drop for Release {
    fn drop(&mut self) {
        let _ = run(
            &self.lab,
            "helm",
            &[
                "uninstall",
                RELEASE,
                "--namespace",
                NAMESPACE,
                "--ignore-not-found",
            ],
            None,
        );
        for kind in [
            "validatingwebhookconfiguration",
            "mutatingwebhookconfiguration",
        ] {
            let name = if kind.starts_with("validating") {
                "bulkhead-validating"
            } else {
                "bulkhead-mutating"
            };
            let _ = run(
                &self.lab,
                "kubectl",
                &["delete", kind, name, "--ignore-not-found"],
                None,
            );
        }
        let _ = run(
            &self.lab,
            "kubectl",
            &[
                "patch",
                "crd",
                "mydatabases.example.com",
                "--type=merge",
                "-p",
                r#"{"spec":{"conversion":{"strategy":"None","webhook":null}}}"#,
            ],
            None,
        );
    }
}

async fn crd(hub: &kube::Client, name: &str) -> Result<CustomResourceDefinition> {
    Ok(Api::<CustomResourceDefinition>::all(hub.clone())
        .get(name)
        .await?)
}

#[tokio::test]
async fn the_hub_with_the_charts_service_account_propagates_and_fails_over_without_a_forbidden_request()
-> Result<()> {
    let lab = bulkhead_e2e::support::lab().await?;
    let hub = lab.client("hub").await?;
    let chart = chart_dir().display().to_string();
    let webhook_port = free_port();
    let webhook_url = format!("https://127.0.0.1:{webhook_port}");

    // Install. The lab applied the CRDs before (other suites): the chart takes them over.
    let release = Release { lab: lab.clone() };
    let install_args = [
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--take-ownership",
        "--set-json",
        "webhook.certificates.extraIpAddresses=[\"127.0.0.1\"]",
    ];
    let mut args = vec!["install", RELEASE, chart.as_str()];
    args.extend(install_args);
    succeed(&lab, "helm", &args, None)?;
    for name in bulkhead::hub::HUB_CRDS {
        let crd = crd(&hub, name).await?;
        let annotations = crd.metadata.annotations.unwrap_or_default();
        ensure!(
            annotations
                .get("helm.sh/resource-policy")
                .map(String::as_str)
                == Some("keep"),
            "{name} is not kept on uninstall: {annotations:?}"
        );
    }

    // The hub process with only the chart's credentials, its webhook certificate kept
    // in the chart mode's Secret as the chart's Deployment asks (the lab's API server
    // reaches it by URL, not through the Service).
    let kubeconfig = service_account_kubeconfig(&lab, &hub).await?;
    let tls_secret = format!("{NAMESPACE}/{RELEASE}-webhook-certs");
    let hub_args = [
        "--webhook",
        "--listen",
        &format!("127.0.0.1:{webhook_port}"),
        "--url",
        &webhook_url,
        "--tls-secret",
        &tls_secret,
        "--cert-sans",
        "127.0.0.1",
        "--conversion",
        "--configuration-name",
        RELEASE,
        // Admission only for the suites' namespaces, so nothing else in the lab waits on
        // this process.
        "--selector-label",
        "bulkhead-e2e=true",
    ]
    .map(String::from);
    let hub_args: Vec<&str> = hub_args.iter().map(String::as_str).collect();
    let audit_from = audit_log_size(&lab);
    let mut federation =
        Federation::start_as("install", &hub_args, &["1", "1"], Some(kubeconfig)).await?;

    // Propagation: a Deployment divided 2/2/2 and a MyDatabase in east and west, the
    // database through the webhook (mutation fills its defaults).
    federation.run_web_and_orders(TOLERATION_SECONDS).await?;
    // The certificates the webhook served them with: issued by the process, with the
    // chart's Role, into the chart mode's Secret.
    let certificates = Api::<Secret>::namespaced(hub.clone(), NAMESPACE)
        .get(&format!("{RELEASE}-webhook-certs"))
        .await
        .context("the hub process did not create the webhook certificate Secret")?;
    let keys: Vec<String> = certificates.data.unwrap_or_default().into_keys().collect();
    ensure!(
        ["ca.crt", "ca.key", "tls.crt", "tls.key"]
            .iter()
            .all(|k| keys.iter().any(|key| key == k)),
        "the certificate Secret holds {keys:?}"
    );
    // Bindings are the hub's: the chart's admission policy refuses anyone else's write,
    // even the lab's admin (the hub process writes as the chart's ServiceAccount).
    let bindings =
        Api::<bulkhead::api::ResourceBinding>::namespaced(hub.clone(), &federation.namespace);
    let refused = bindings
        .patch(
            "web-deployment",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"spec": {"clusters": [{"name": "north", "replicas": 6}]}}),
            ),
        )
        .await;
    let message = format!("{refused:?}");
    ensure!(
        refused.is_err() && message.contains("only the Bulkhead hub"),
        "an admin's edit of a binding's clusters was not refused: {message}"
    );
    let refused = bindings
        .delete("web-deployment", &kube::api::DeleteParams::default())
        .await;
    ensure!(
        format!("{refused:?}").contains("may not DELETE"),
        "an admin's delete of a binding was not refused: {refused:?}"
    );
    let orders_ready = serde_json::to_value(DatabasePhase::Ready)?;
    bulkhead_e2e::wait_for(
        "the hub's MyDatabase status Ready (written by the chart's account)",
        Duration::from_secs(60),
        || {
            let api = federation.api("hub", &databases());
            let wanted = orders_ready.clone();
            async move {
                match api.get("orders").await {
                    Ok(db) if db.data["status"]["phase"] == wanted => bulkhead_e2e::Check::Done(()),
                    Ok(db) => bulkhead_e2e::Check::Waiting(db.data["status"].to_string()),
                    Err(e) => bulkhead_e2e::Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await?;

    // Failover: east cut off, web's replicas move to west and north; heal, back to 2/2/2.
    let partition = Partition::start(&federation.lab, "east")?;
    federation
        .wait_copies_in(
            &["west", "north"],
            &deployments(),
            "web",
            "3/3 Ready in west and north",
            Duration::from_secs(90),
            |c| ready_at(c, &[("west", 3), ("north", 3)]),
        )
        .await?;
    partition.heal()?;
    federation
        .wait_copies(
            &deployments(),
            "web",
            "2/2/2 Ready after the heal",
            Duration::from_secs(120),
            |c| ready_at(c, &[("east", 2), ("west", 2), ("north", 2)]),
        )
        .await?;

    // Not one request of the hub was refused.
    let (requests, refused, written) = audited_requests(&lab, audit_from)?;
    let log = std::fs::read_to_string(federation.hub_log())?;
    let forbidden_lines: Vec<&str> = log
        .lines()
        .filter(|l| l.to_lowercase().contains("forbidden"))
        .collect();
    eprintln!(
        "install: the hub made {requests} requests with the chart's account, {} refused (audit log); {} log lines mention forbidden",
        refused.len(),
        forbidden_lines.len()
    );
    ensure!(
        requests >= 20,
        "the audit log shows only {requests} requests of the chart's account: is the hub audited?"
    );
    ensure!(
        refused.is_empty() && forbidden_lines.is_empty(),
        "the chart's account was refused: {refused:#?}; log lines: {forbidden_lines:#?}"
    );
    // The finalizer's admission policy is the chart's account's to keep.
    ensure!(
        written.contains("mutatingadmissionpolicies")
            && written.contains("mutatingadmissionpolicybindings"),
        "the hub wrote its MutatingAdmissionPolicy with the chart's account (wrote: {written:?})"
    );
    federation.kill_hub();

    // Upgrade with a changed CRD (a new chart version's CRDs): helm updates it in place.
    let copy = lab.root.join("hub/chart-upgrade");
    let _ = std::fs::remove_dir_all(&copy);
    let status = Command::new("cp")
        .arg("-r")
        .arg(chart_dir())
        .arg(&copy)
        .status()?;
    ensure!(status.success(), "copying the chart failed");
    let crd_file = copy.join("files/crds/federation.example.com_memberclusters.yaml");
    let text = std::fs::read_to_string(&crd_file)?;
    ensure!(text.contains("description: Failure domain\n"));
    std::fs::write(
        &crd_file,
        text.replacen(
            "description: Failure domain\n",
            &format!("description: {UPGRADED_DESCRIPTION}\n"),
            1,
        ),
    )?;
    let copy_text = copy.display().to_string();
    let mut args = vec!["upgrade", RELEASE, copy_text.as_str()];
    args.extend(install_args.iter().filter(|a| **a != "--create-namespace"));
    succeed(&lab, "helm", &args, None)?;
    let upgraded = crd(&hub, "memberclusters.federation.example.com").await?;
    let description = upgraded.spec.versions[0]
        .additional_printer_columns
        .as_ref()
        .and_then(|columns| columns.first())
        .and_then(|column| column.description.clone());
    ensure!(
        description.as_deref() == Some(UPGRADED_DESCRIPTION),
        "helm upgrade did not update the CRD: {description:?}"
    );

    // Uninstall: the CRDs stay, and with them the templates; member copies stay too.
    succeed(
        &lab,
        "helm",
        &["uninstall", RELEASE, "--namespace", NAMESPACE],
        None,
    )?;
    for name in bulkhead::hub::HUB_CRDS {
        crd(&hub, name)
            .await
            .with_context(|| format!("CRD {name} gone after uninstall"))?;
    }
    federation.api("hub", &deployments()).get("web").await?;
    federation.api("hub", &databases()).get("orders").await?;
    for member in ["east", "west", "north"] {
        federation
            .api(member, &deployments())
            .get("web")
            .await
            .with_context(|| format!("web's copy in {member} gone after uninstall"))?;
    }
    for member in ["east", "west"] {
        federation
            .api(member, &databases())
            .get("orders")
            .await
            .with_context(|| format!("orders' copy in {member} gone after uninstall"))?;
    }
    ensure!(
        Api::<ServiceAccount>::namespaced(hub.clone(), NAMESPACE)
            .get_opt(SERVICE_ACCOUNT)
            .await?
            .is_none(),
        "the chart's ServiceAccount outlived the release"
    );
    ensure!(
        Api::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>::all(
            hub.clone()
        )
        .get_opt("bulkhead-validating")
        .await?
        .is_none(),
        "the webhook configuration outlived the release (it would block the API)"
    );
    drop(federation);
    drop(release);
    // Later suites apply config/crd again; leave the generated description behind.
    lab.install_crds("hub", &bulkhead_e2e::lab::crd_dir())
        .await?;
    Ok(())
}

/// The PersistentVolumeClaims of MyDatabase `orders` in `namespace` of `member`.
async fn orders_claims(
    federation: &Federation,
    member: &str,
    namespace: &str,
) -> Result<Vec<String>> {
    let client = federation.lab.inside_client(member).await?;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client, namespace)
        .list(&kube::api::ListParams::default())
        .await?;
    Ok(claims
        .items
        .into_iter()
        .map(|c| c.metadata.name.unwrap_or_default())
        .filter(|name| name.starts_with("data-orders-"))
        .collect())
}

/// Waits until namespace `name` is gone from the hub (deleted, every finalizer released).
async fn wait_namespace_gone(hub: &kube::Client, name: &str, within: Duration) -> Result<()> {
    let api = Api::<Namespace>::all(hub.clone());
    bulkhead_e2e::wait_for(
        &format!("namespace {name} gone from the hub"),
        within,
        || {
            let api = api.clone();
            async move {
                match api.get_opt(name).await {
                    Ok(None) => bulkhead_e2e::Check::Done(()),
                    Ok(Some(n)) => bulkhead_e2e::Check::Waiting(format!(
                        "{:?}",
                        n.status.and_then(|s| s.conditions).unwrap_or_default()
                    )),
                    Err(e) => bulkhead_e2e::Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await
}

/// The rows of `member`'s `status.pendingCleanups` as `Kind/namespace/name`.
async fn pending_rows(hub: &kube::Client, member: &str) -> Result<Vec<String>> {
    let cluster = Api::<bulkhead::api::MemberCluster>::all(hub.clone())
        .get(member)
        .await?;
    let mut rows: Vec<String> = cluster
        .status
        .map(|s| s.pending_cleanups)
        .unwrap_or_default()
        .into_iter()
        .map(|r| format!("{}/{}/{}", r.kind, r.namespace, r.name))
        .collect();
    rows.sort();
    Ok(rows)
}

#[tokio::test]
async fn a_namespace_deleted_on_the_hub_finishes_and_its_copies_follow_even_with_a_member_cut_off()
-> Result<()> {
    let lab = bulkhead_e2e::support::lab().await?;
    let hub = lab.client("hub").await?;
    let chart = chart_dir().display().to_string();
    // The chart with its binding protection (the admission policy that refused the
    // namespace controller), the hub running with the chart's account.
    let _release = Release { lab: lab.clone() };
    succeed(
        &lab,
        "helm",
        &[
            "install",
            RELEASE,
            chart.as_str(),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--take-ownership",
        ],
        None,
    )?;
    let kubeconfig = service_account_kubeconfig(&lab, &hub).await?;
    let mut federation = Federation::start_as("nsdel", &[], &["1", "1"], Some(kubeconfig)).await?;
    let first = federation.namespace.clone();

    // 1. Every member Ready. A Deployment divided 2/2/2 and a MyDatabase in east and west.
    federation.run_web_and_orders(TOLERATION_SECONDS).await?;
    let claims_before = [
        orders_claims(&federation, "east", &first).await?,
        orders_claims(&federation, "west", &first).await?,
    ];
    ensure!(
        claims_before.iter().all(|c| !c.is_empty()),
        "orders has claims in east and west: {claims_before:?}"
    );
    // A tenant (any user but the hub and the API server's controllers, here with every
    // RBAC permission) still cannot delete a binding in a namespace that stays.
    let tenant = lab.editor_client("hub").await?;
    let refused = Api::<bulkhead::api::ResourceBinding>::namespaced(tenant, &first)
        .delete("web-deployment", &kube::api::DeleteParams::default())
        .await;
    ensure!(
        format!("{refused:?}").contains("may not DELETE"),
        "a tenant's delete of a binding was not refused: {refused:?}"
    );
    Api::<Namespace>::all(hub.clone())
        .delete(&first, &kube::api::DeleteParams::default())
        .await?;
    let asked = std::time::Instant::now();
    wait_namespace_gone(&hub, &first, Duration::from_secs(60)).await?;
    eprintln!(
        "namespace {first} gone from the hub {:.1} s after the delete",
        asked.elapsed().as_secs_f64()
    );
    for member in ["east", "west", "north"] {
        let client = federation.lab.inside_client(member).await?;
        for resource in [deployments(), databases()] {
            let left =
                Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), &first, &resource)
                    .list(&kube::api::ListParams::default())
                    .await?;
            ensure!(
                left.items.is_empty(),
                "{member} still holds {} copies: {:?}",
                resource.kind,
                left.items
                    .iter()
                    .map(|o| o.metadata.name.clone())
                    .collect::<Vec<_>>()
            );
        }
    }
    // reclaimPolicy Retain (the default): the claims stay.
    let claims_after = [
        orders_claims(&federation, "east", &first).await?,
        orders_claims(&federation, "west", &first).await?,
    ];
    ensure!(
        claims_after == claims_before,
        "the claims were kept: before {claims_before:?}, after {claims_after:?}"
    );

    // 2. The same with east cut off during the delete, in a namespace of its own (with
    // agents of its own: an agent serves one namespace).
    let second = bulkhead_e2e::support::TestNamespace::create(&lab, "nsdel-cut", &["hub"]).await?;
    let lease = bulkhead_e2e::federation::LEASE_DURATION_SECONDS.to_string();
    let _agents = ["east", "west", "north"]
        .iter()
        .map(|member| {
            bulkhead_e2e::agent_support::AgentProcess::start(
                &lab,
                member,
                &second.name,
                &[
                    "--lease-duration-seconds",
                    &lease,
                    "--unfence-after-seconds",
                    "2",
                ],
            )
        })
        .collect::<Result<Vec<_>>>()?;
    federation.namespace = second.name.clone();
    federation.run_web_and_orders(TOLERATION_SECONDS).await?;
    let east_claims = orders_claims(&federation, "east", &second.name).await?;
    let partition = Partition::start(&federation.lab, "east")?;
    federation
        .wait_member_ready("east", false, Duration::from_secs(60))
        .await?;
    Api::<Namespace>::all(hub.clone())
        .delete(&second.name, &kube::api::DeleteParams::default())
        .await?;
    let asked = std::time::Instant::now();
    wait_namespace_gone(&hub, &second.name, Duration::from_secs(60)).await?;
    eprintln!(
        "namespace {} gone from the hub {:.1} s after the delete, east cut off",
        second.name,
        asked.elapsed().as_secs_f64()
    );
    let rows = pending_rows(&hub, "east").await?;
    let expected = vec![
        format!("Deployment/{}/web", second.name),
        format!("MyDatabase/{}/orders", second.name),
    ];
    ensure!(
        rows == expected,
        "east's pendingCleanups: {rows:?}, expected {expected:?}"
    );
    for (member, resource, name) in [
        ("west", deployments(), "web"),
        ("north", deployments(), "web"),
        ("west", databases(), "orders"),
    ] {
        ensure!(
            federation
                .api(member, &resource)
                .get_opt(name)
                .await?
                .is_none(),
            "{member} still holds {name}"
        );
    }
    for (resource, name) in [(deployments(), "web"), (databases(), "orders")] {
        ensure!(
            federation
                .api("east", &resource)
                .get_opt(name)
                .await?
                .is_some(),
            "east's {name} was kept while it was cut off"
        );
    }
    partition.heal()?;
    bulkhead_e2e::wait_for(
        "east's copies deleted and its rows gone after the heal",
        Duration::from_secs(90),
        || async {
            let web = federation.api("east", &deployments()).get_opt("web").await;
            let orders = federation.api("east", &databases()).get_opt("orders").await;
            let rows = pending_rows(&hub, "east").await;
            match (web, orders, rows) {
                (Ok(None), Ok(None), Ok(rows)) if rows.is_empty() => bulkhead_e2e::Check::Done(()),
                (web, orders, rows) => bulkhead_e2e::Check::Waiting(format!(
                    "web {:?}, orders {:?}, rows {rows:?}",
                    web.map(|w| w.is_some()),
                    orders.map(|o| o.is_some())
                )),
            }
        },
    )
    .await?;
    let east_after = orders_claims(&federation, "east", &second.name).await?;
    ensure!(
        !east_claims.is_empty() && east_after == east_claims,
        "east's claims were kept: before {east_claims:?}, after {east_after:?}"
    );
    Ok(())
}
