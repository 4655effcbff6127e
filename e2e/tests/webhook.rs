//! Admission webhooks against the lab's real API servers: the API servers call
//! `bulkhead webhook` over TLS. The test scopes the webhook configurations to its own
//! namespace (and labelled cluster-scoped objects) and removes them afterwards.

use bulkhead_e2e::support::http_get;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use bulkhead::api::MyDatabase;
use bulkhead_e2e::agent_support::{bulkhead_binary, free_port};
use bulkhead_e2e::lab::{self, Lab};
use bulkhead_e2e::support::{self, TestNamespace};
use bulkhead_e2e::{Check, wait_for};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};

const SCOPE_LABEL: &str = "bulkhead-e2e/webhook";
const TENANT: &str = "team-e2e";

struct Webhook {
    child: Child,
    log: std::path::PathBuf,
    /// The probe server's port (/readyz, /metrics); 0 when the process has none we know.
    probe: u16,
}

impl Webhook {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Deletes the test's webhook configurations when dropped.
struct Configurations {
    name: String,
    kubeconfigs: Vec<std::path::PathBuf>,
}

impl Drop for Configurations {
    fn drop(&mut self) {
        let name = self.name.clone();
        support::cleanup_blocking(std::mem::take(&mut self.kubeconfigs), move |client| {
            let name = name.clone();
            async move {
                let _ = Api::<ValidatingWebhookConfiguration>::all(client.clone())
                    .delete(&format!("{name}-validating"), &DeleteParams::default())
                    .await;
                let _ = Api::<MutatingWebhookConfiguration>::all(client.clone())
                    .delete(&format!("{name}-mutating"), &DeleteParams::default())
                    .await;
                // Stop serving v1alpha1 again: with its webhook gone, the namespace
                // controller could not list MyDatabases in that version.
                let crd = bulkhead::api::mydatabase_crd();
                let _ = Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(client)
                    .patch("mydatabases.example.com", &PatchParams::apply("bulkhead-lab").force(), &Patch::Apply(&crd))
                    .await;
            }
        });
    }
}

/// Retries a dry-run create until admission denies it with `fragment` (the webhook may
/// still be starting or loading rules); returns the denial.
async fn wait_for_denial<K>(api: &Api<K>, object: &K, fragment: &str) -> Result<String>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait_for(
        &format!("a denial mentioning {fragment:?}"),
        Duration::from_secs(30),
        || async {
            match api
                .create(
                    &PostParams {
                        dry_run: true,
                        ..Default::default()
                    },
                    object,
                )
                .await
            {
                Err(kube::Error::Api(status)) if status.message.contains(fragment) => {
                    Check::Done(status.message.clone())
                }
                other => Check::Waiting(format!("{other:?}")),
            }
        },
    )
    .await
}

async fn label_namespace(
    client: &Client,
    namespace: &str,
    labels: serde_json::Value,
) -> Result<()> {
    Api::<Namespace>::all(client.clone())
        .patch(
            namespace,
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"labels": labels}})),
        )
        .await?;
    Ok(())
}

async fn tenant_rules(client: &Client, namespace: &str, name: &str, yaml: &str) -> Result<()> {
    tenant_rules_for(client, namespace, name, TENANT, yaml).await
}

async fn tenant_rules_for(
    client: &Client,
    namespace: &str,
    name: &str,
    tenant: &str,
    yaml: &str,
) -> Result<()> {
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": {"federation.example.com/tenant-policy": tenant}},
        "data": {"policy.yaml": yaml}
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .patch(name, &PatchParams::apply("e2e").force(), &Patch::Apply(&cm))
        .await?;
    Ok(())
}

fn database(name: &str, replicas: i32) -> Result<MyDatabase> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "example.com/v1", "kind": "MyDatabase",
        "metadata": {"name": name}, "spec": {"replicas": replicas, "version": "16"}
    }))?)
}

async fn start_webhook(
    lab: &Lab,
    ns: &str,
    rotate_seconds: u64,
) -> Result<(Webhook, Configurations, u16)> {
    start_webhook_with(lab, ns, rotate_seconds, &[]).await
}

async fn start_webhook_with(
    lab: &Lab,
    ns: &str,
    rotate_seconds: u64,
    extra: &[&str],
) -> Result<(Webhook, Configurations, u16)> {
    let port = free_port();
    let probe = free_port();
    let log = lab.log_dir("hub").join(format!("webhook-{ns}.log"));
    let child = Command::new(bulkhead_binary()?)
        .arg("webhook")
        .arg("--kubeconfig")
        .arg(lab.kubeconfig("hub"))
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--url",
            &format!("https://127.0.0.1:{port}"),
        ])
        .args(["--probe-address", &format!("127.0.0.1:{probe}")])
        .args(["--configure-hub", "--configure-member"])
        .arg(lab.inside_kubeconfig("east"))
        .args([
            "--configuration-name",
            &format!("e2e-{ns}"),
            "--selector-label",
            &format!("{SCOPE_LABEL}={ns}"),
        ])
        .args([
            "--tenant-namespace",
            ns,
            "--rotate-every-seconds",
            &rotate_seconds.to_string(),
        ])
        .args(extra)
        .env("RUST_LOG", "info,bulkhead=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let webhook = Webhook { child, log, probe };
    let configurations = Configurations {
        name: format!("e2e-{ns}"),
        kubeconfigs: vec![lab.inside_kubeconfig("hub"), lab.inside_kubeconfig("east")],
    };
    let hub = lab.client("hub").await?;
    wait_for(
        "webhook configurations installed",
        Duration::from_secs(30),
        || {
            let api = Api::<ValidatingWebhookConfiguration>::all(hub.clone());
            let name = format!("e2e-{ns}-validating");
            async move {
                match api.get_opt(&name).await {
                    Ok(Some(_)) => Check::Done(()),
                    Ok(None) => Check::Waiting("not yet".into()),
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await
    .with_context(|| format!("webhook log:\n{}", webhook.log_text()))?;
    Ok((webhook, configurations, port))
}

#[tokio::test]
async fn webhooks_validate_default_and_enforce_tenant_rules_through_real_apiservers() -> Result<()>
{
    let lab = support::lab().await?;
    for cluster in ["hub", "east"] {
        lab.install_crds(cluster, &lab::crd_dir()).await?;
    }
    let namespace = TestNamespace::create(&lab, "webhook", &["hub", "east"]).await?;
    let ns = namespace.name.as_str();
    let hub = lab.client("hub").await?;
    let east = lab.inside_client("east").await?;
    label_namespace(
        &hub,
        ns,
        serde_json::json!({SCOPE_LABEL: ns, "federation.example.com/tenant": TENANT}),
    )
    .await?;
    label_namespace(&east, ns, serde_json::json!({SCOPE_LABEL: ns})).await?;
    tenant_rules(
        &hub,
        ns,
        "rules",
        "maxReplicas: 3\nallowedVersions: [\"15\", \"16\"]\nallowedClusters: [east, west]\ndefaults: {image: registry.local/postgres, storageClassName: fast}\n",
    )
    .await?;
    let (webhook, _configurations, _) = start_webhook(&lab, ns, 3600).await?;

    let databases: Api<MyDatabase> = Api::namespaced(hub.clone(), ns);
    // The tenant's limit, enforced by the webhook (the schema allows 5).
    // The rules load within a moment of the webhook starting.
    let denial = wait_for_denial(&databases, &database("big", 5)?, "maxReplicas")
        .await
        .with_context(|| format!("webhook log:\n{}", webhook.log_text()))?;
    eprintln!("denial: {denial}");
    assert!(
        denial.contains(&format!("tenant {TENANT}")) && denial.contains("spec.replicas 5"),
        "{denial}"
    );

    // Defaults and the tenant label come from the mutating webhook.
    let created = databases
        .create(&PostParams::default(), &database("small", 2)?)
        .await?;
    assert_eq!(
        created.spec.image.as_deref(),
        Some("registry.local/postgres")
    );
    assert_eq!(
        created.spec.storage.storage_class_name.as_deref(),
        Some("fast")
    );
    assert_eq!(
        created
            .metadata
            .labels
            .unwrap_or_default()
            .get("federation.example.com/tenant")
            .map(String::as_str),
        Some(TENANT)
    );
    assert_eq!(created.spec.version, "16");

    // Policies: affinity narrowed to the tenant's clusters; malformed tolerations denied.
    let policies: Api<kube::api::DynamicObject> = Api::namespaced_with(
        hub.clone(),
        ns,
        &kube::discovery::ApiResource::erase::<bulkhead::api::PropagationPolicy>(&()),
    );
    let policy: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "federation.example.com/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": "open"},
        "spec": {"resourceSelectors": [{"apiVersion": "example.com/v1", "kind": "MyDatabase"}]}
    }))?;
    let created = policies.create(&PostParams::default(), &policy).await?;
    assert_eq!(
        created.data["spec"]["placement"]["clusterAffinity"]["clusterNames"],
        serde_json::json!(["east", "west"])
    );
    let bad_toleration: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "federation.example.com/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": "bad"},
        "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}],
                 "placement": {"clusterTolerations": [{"key": "k", "operator": "Sometimes"}]}}
    }))?;
    let message = support::expect_invalid_or_forbidden(
        policies
            .create(&PostParams::default(), &bad_toleration)
            .await,
        "clusterTolerations[0].operator",
    );
    eprintln!("denial: {message}");
    // A name pattern no Deployment can match: refused with the field and the fix.
    let bad_pattern: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "federation.example.com/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": "bad-pattern"},
        "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "Web_*"}]}
    }))?;
    let message = support::expect_invalid_or_forbidden(
        policies.create(&PostParams::default(), &bad_pattern).await,
        "spec.resourceSelectors[0].name pattern \"Web_*\" can never match a Deployment",
    );
    assert!(message.contains("write \"web-*\""), "{message}");
    eprintln!("denial: {message}");

    // Members: a StatefulSet without serviceName is rejected.
    let statefulset: StatefulSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "nameless"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}
    }))?;
    let statefulsets: Api<StatefulSet> = Api::namespaced(east.clone(), ns);
    let message = support::expect_invalid_or_forbidden(
        statefulsets
            .create(&PostParams::default(), &statefulset)
            .await,
        "spec.serviceName",
    );
    eprintln!("denial: {message}");

    // A rule change takes effect without restart.
    tenant_rules(
        &hub,
        ns,
        "rules",
        "maxReplicas: 6\nallowedVersions: [\"16\"]\n",
    )
    .await?;
    let started = Instant::now();
    wait_for(
        "new rules in force: replicas 5 allowed",
        Duration::from_secs(20),
        || {
            let databases = databases.clone();
            async move {
                match databases
                    .create(
                        &PostParams {
                            dry_run: true,
                            ..Default::default()
                        },
                        &database("big", 5).unwrap(),
                    )
                    .await
                {
                    Ok(_) => Check::Done(()),
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await?;
    eprintln!("rule change in force after {:?}", started.elapsed());

    // A ConfigMap that does not parse is ignored: the previous rules stay.
    tenant_rules(&hub, ns, "rules", "maxReplicas: [broken\n").await?;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(hub.clone(), ns);
    wait_for("InvalidTenantPolicy event", Duration::from_secs(20), || {
        let events = events.clone();
        async move {
            match events.list(&ListParams::default()).await {
                Ok(list)
                    if list
                        .items
                        .iter()
                        .any(|e| e.reason.as_deref() == Some("InvalidTenantPolicy")) =>
                {
                    Check::Done(())
                }
                Ok(list) => Check::Waiting(format!("{} events", list.items.len())),
                Err(e) => Check::Waiting(e.to_string()),
            }
        }
    })
    .await?;
    let message = support::expect_invalid_or_forbidden(
        databases
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &database("huge", 7)?,
            )
            .await,
        "maxReplicas 6",
    );
    eprintln!("previous rules still in force: {message}");
    drop(webhook);
    Ok(())
}

/// Issue 16: a user in a tenant's namespace used to escape its limits by writing another
/// tenant (or one without rules) into the object's own annotation. The tenant now comes
/// from the namespace label only; a claim to another tenant is denied, naming the
/// namespace's tenant and the fix, through the real API server.
#[tokio::test]
async fn an_object_cannot_claim_another_tenant_through_the_real_apiserver() -> Result<()> {
    let lab = support::lab().await?;
    lab.install_crds("hub", &lab::crd_dir()).await?;
    let namespace = TestNamespace::create(&lab, "webhook-claim", &["hub"]).await?;
    let ns = namespace.name.as_str();
    let hub = lab.client("hub").await?;
    label_namespace(
        &hub,
        ns,
        serde_json::json!({SCOPE_LABEL: ns, "federation.example.com/tenant": TENANT}),
    )
    .await?;
    // The namespace's tenant may have 2 replicas; another tenant (owning no namespace
    // here) may have 9.
    tenant_rules(&hub, ns, "rules", "maxReplicas: 2\n").await?;
    tenant_rules_for(&hub, ns, "other-rules", "team-other", "maxReplicas: 9\n").await?;
    // The configurations go in only after the rules and namespace labels are listed, so
    // from the first request on the rules are enforced and the webhook reports ready.
    let (webhook, _configurations, _) = start_webhook(&lab, ns, 3600).await?;
    let (status, body) = http_get(webhook.probe, "/readyz").await?;
    assert_eq!(
        status, 200,
        "/readyz once the configurations are installed: {body}"
    );
    assert!(
        webhook
            .log_text()
            .contains("tenant rules and namespace labels synced"),
        "{}",
        webhook.log_text()
    );

    let databases: Api<MyDatabase> = Api::namespaced(hub.clone(), ns);
    let claiming = |name: &str, field: &str, tenant: &str, replicas: i32| -> Result<MyDatabase> {
        let mut database = database(name, replicas)?;
        let claim = std::collections::BTreeMap::from([(
            "federation.example.com/tenant".to_string(),
            tenant.to_string(),
        )]);
        if field == "annotation" {
            database.metadata.annotations = Some(claim);
        } else {
            database.metadata.labels = Some(claim);
        }
        Ok(database)
    };
    // The attack: tenant team-other's annotation (more replicas), or a tenant without rules.
    for (claim, field) in [
        ("team-other", "annotation"),
        ("no-such-tenant", "annotation"),
        ("team-other", "label"),
    ] {
        let attack = claiming("escape", field, claim, 5)?;
        let denial = wait_for_denial(&databases, &attack, "belongs to tenant")
            .await
            .with_context(|| format!("webhook log:\n{}", webhook.log_text()))?;
        eprintln!("denial: {denial}");
        assert!(
            denial.contains(&format!("MyDatabase {ns}/escape"))
                && denial.contains(&format!("is \"{claim}\""))
                && denial.contains(&format!("namespace {ns} belongs to tenant {TENANT}"))
                && denial.contains(&format!("remove the {field}")),
            "{denial}"
        );
    }
    assert!(
        databases.get_opt("escape").await?.is_none(),
        "nothing was created"
    );

    // Naming the namespace's own tenant is allowed, and its limits apply.
    let message = support::expect_invalid_or_forbidden(
        databases
            .create(
                &PostParams::default(),
                &claiming("own", "annotation", TENANT, 5)?,
            )
            .await,
        "maxReplicas 2",
    );
    eprintln!("own tenant's limit: {message}");
    let created = databases
        .create(
            &PostParams::default(),
            &claiming("own", "annotation", TENANT, 2)?,
        )
        .await?;
    assert_eq!(
        created
            .metadata
            .labels
            .unwrap_or_default()
            .get("federation.example.com/tenant")
            .map(String::as_str),
        Some(TENANT),
        "the mutating webhook labels it with the namespace's tenant"
    );

    // An update cannot add the claim either.
    let message = support::expect_invalid_or_forbidden(
        databases
            .patch(
                "own",
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({
                    "metadata": {"annotations": {"federation.example.com/tenant": "team-other"}},
                    "spec": {"replicas": 5}
                })),
            )
            .await,
        "remove the annotation",
    );
    eprintln!("update denial: {message}");
    assert_eq!(databases.get("own").await?.spec.replicas, 2, "unchanged");
    drop(webhook);
    Ok(())
}

#[tokio::test]
async fn certificate_rotation_drops_no_request_and_a_down_webhook_never_blocks_members()
-> Result<()> {
    let lab = support::lab().await?;
    for cluster in ["hub", "east"] {
        lab.install_crds(cluster, &lab::crd_dir()).await?;
    }
    let namespace = TestNamespace::create(&lab, "webhook-tls", &["hub", "east"]).await?;
    let ns = namespace.name.as_str();
    let hub = lab.client("hub").await?;
    let east = lab.inside_client("east").await?;
    label_namespace(&hub, ns, serde_json::json!({SCOPE_LABEL: ns})).await?;
    label_namespace(&east, ns, serde_json::json!({SCOPE_LABEL: ns})).await?;
    let (mut webhook, _configurations, _) = start_webhook(&lab, ns, 1).await?;

    // Requests flow while the serving certificate is re-issued every second.
    let databases: Api<MyDatabase> = Api::namespaced(hub.clone(), ns);
    let started = Instant::now();
    let mut requests = 0;
    while started.elapsed() < Duration::from_secs(5) {
        databases
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &database("rotating", 2)?,
            )
            .await
            .with_context(|| {
                format!(
                    "request {requests} failed during rotation; webhook log:\n{}",
                    webhook.log_text()
                )
            })?;
        requests += 1;
    }
    let rotations = webhook
        .log_text()
        .matches("serving certificate rotated")
        .count();
    eprintln!(
        "{requests} admission requests during {rotations} certificate rotations, none failed"
    );
    assert!(
        rotations >= 3,
        "the certificate rotated while requests flowed ({rotations} rotations)"
    );

    // The webhook goes down: Bulkhead's own kinds fail closed, members' StatefulSets do not.
    webhook.stop();
    let statefulset: StatefulSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "still-allowed"},
        "spec": {"serviceName": "x", "selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}
    }))?;
    Api::<StatefulSet>::namespaced(east.clone(), ns)
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &statefulset,
        )
        .await
        .context(
            "failurePolicy Ignore: a member's StatefulSet is admitted while the webhook is down",
        )?;
    let config: ConfigMap = serde_json::from_value(
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("{ns}-probe")}}),
    )?;
    Api::<ConfigMap>::namespaced(east.clone(), "kube-system")
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &config,
        )
        .await
        .context("kube-system is never blocked")?;
    let closed = databases
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &database("closed", 2)?,
        )
        .await;
    assert!(
        closed.is_err(),
        "MyDatabase admission fails closed while the webhook is down"
    );
    Ok(())
}

/// The chart's default mode: two webhook processes (two replicas) keep their certificates
/// in one Secret. With a 60 s serving certificate and a 210 s CA, the serving certificate
/// is renewed every 40 s and the CA once (at 140 s, signing from 200 s, the old CA in the
/// bundle beside it until it expires at 210 s); admission requests through both webhooks
/// never fail meanwhile.
#[tokio::test]
async fn certificates_kept_in_a_secret_rotate_with_no_failed_admission() -> Result<()> {
    use k8s_openapi::api::core::v1::Secret;
    let lab = support::lab().await?;
    lab.install_crds("hub", &lab::crd_dir()).await?;
    let namespace = TestNamespace::create(&lab, "webhook-secret", &["hub"]).await?;
    let ns = namespace.name.as_str();
    let hub = lab.client("hub").await?;
    label_namespace(&hub, ns, serde_json::json!({SCOPE_LABEL: ns})).await?;
    let secret = format!("{ns}/webhook-certs");
    let secrets: Api<Secret> = Api::namespaced(hub.clone(), ns);
    let mut replicas = vec![];
    for replica in ["a", "b"] {
        let port = free_port();
        let log = lab
            .log_dir("hub")
            .join(format!("webhook-{ns}-{replica}.log"));
        let child = Command::new(bulkhead_binary()?)
            .arg("webhook")
            .arg("--kubeconfig")
            .arg(lab.kubeconfig("hub"))
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--url",
                &format!("https://127.0.0.1:{port}"),
                "--probe-address",
                &format!("127.0.0.1:{}", free_port()),
                "--configure-hub",
                "--configuration-name",
                &format!("e2e-{ns}-{replica}"),
                "--selector-label",
                &format!("{SCOPE_LABEL}={ns}"),
                "--tenant-namespace",
                ns,
                "--tls-secret",
                &secret,
                "--cert-sans",
                "127.0.0.1",
                "--serving-cert-validity-seconds",
                "60",
                "--ca-validity-seconds",
                "210",
            ])
            .env("RUST_LOG", "info,bulkhead=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        replicas.push((
            Webhook {
                child,
                log,
                probe: 0,
            },
            Configurations {
                name: format!("e2e-{ns}-{replica}"),
                kubeconfigs: vec![lab.inside_kubeconfig("hub")],
            },
        ));
    }
    let logs = |replicas: &Vec<(Webhook, Configurations)>| {
        replicas
            .iter()
            .map(|(w, _)| w.log_text())
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    // Both configurations carry the Secret's bundle.
    wait_for(
        "both webhook configurations carry the Secret's CA",
        Duration::from_secs(60),
        || {
            let configurations = Api::<ValidatingWebhookConfiguration>::all(hub.clone());
            let secrets = secrets.clone();
            async move {
                let Ok(Some(secret)) = secrets.get_opt("webhook-certs").await else {
                    return Check::Waiting("no Secret yet".into());
                };
                let bundle = secret.data.unwrap_or_default().get("ca.crt").cloned();
                for replica in ["a", "b"] {
                    let name = format!("e2e-{ns}-{replica}-validating");
                    match configurations.get_opt(&name).await {
                        Ok(Some(c)) => {
                            let carried = c
                                .webhooks
                                .unwrap_or_default()
                                .first()
                                .and_then(|w| w.client_config.ca_bundle.clone());
                            if carried != bundle {
                                return Check::Waiting(format!("{name} carries another bundle"));
                            }
                        }
                        other => return Check::Waiting(format!("{name}: {other:?}")),
                    }
                }
                Check::Done(())
            }
        },
    )
    .await
    .with_context(|| logs(&replicas))?;
    let first_bundle =
        secrets.get("webhook-certs").await?.data.unwrap_or_default()["ca.crt"].clone();

    let databases: Api<MyDatabase> = Api::namespaced(hub.clone(), ns);
    let started = Instant::now();
    let (mut requests, mut failures) = (0, vec![]);
    // The most CAs the bundle held at once (the old one stays beside the new until it
    // expires).
    let mut most_cas = 0;
    while started.elapsed() < Duration::from_secs(230) {
        if requests % 25 == 0
            && let Ok(Some(secret)) = secrets.get_opt("webhook-certs").await
        {
            let bundle = secret
                .data
                .unwrap_or_default()
                .get("ca.crt")
                .cloned()
                .unwrap_or_default();
            most_cas = most_cas.max(
                String::from_utf8_lossy(&bundle.0)
                    .matches("BEGIN CERTIFICATE")
                    .count(),
            );
        }
        match databases
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &database("rotating", 2)?,
            )
            .await
        {
            Ok(_) => {}
            Err(error) => {
                failures.push(format!("{:.1}s: {error}", started.elapsed().as_secs_f64()))
            }
        }
        requests += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let text = logs(&replicas);
    let renewals = text.matches("webhook certificates renewed").count();
    let bundle_now = secrets.get("webhook-certs").await?.data.unwrap_or_default()["ca.crt"].clone();
    eprintln!(
        "{requests} admission requests through two webhooks during {renewals} certificate renewals (the CA renewed: {}, at most {most_cas} CAs in the bundle at once), {} failed",
        bundle_now != first_bundle,
        failures.len()
    );
    ensure!(
        failures.is_empty(),
        "admission failed during rotation: {failures:#?}\n{text}"
    );
    ensure!(
        renewals >= 4,
        "the serving certificate was renewed at least 4 times in 230 s ({renewals})"
    );
    ensure!(
        bundle_now != first_bundle && most_cas == 2,
        "the CA was renewed and the old one kept beside it in the bundle (at most {most_cas} CAs)"
    );
    ensure!(
        text.contains("moves to the current CA"),
        "the serving certificate moved to the new CA:\n{text}"
    );
    Ok(())
}

#[tokio::test]
async fn mydatabase_v1alpha1_is_served_through_the_conversion_webhook() -> Result<()> {
    let lab = support::lab().await?;
    for cluster in ["hub", "east"] {
        lab.install_crds(cluster, &lab::crd_dir()).await?;
    }
    let namespace = TestNamespace::create(&lab, "convert", &["hub", "east"]).await?;
    let ns = namespace.name.as_str();
    let hub = lab.client("hub").await?;
    label_namespace(&hub, ns, serde_json::json!({SCOPE_LABEL: ns})).await?;
    let (webhook, _configurations, _) =
        start_webhook_with(&lab, ns, 3600, &["--conversion"]).await?;
    let alpha_resource = kube::discovery::ApiResource {
        group: "example.com".into(),
        version: "v1alpha1".into(),
        api_version: "example.com/v1alpha1".into(),
        kind: "MyDatabase".into(),
        plural: "mydatabases".into(),
    };
    let alpha: Api<kube::api::DynamicObject> =
        Api::namespaced_with(hub.clone(), ns, &alpha_resource);
    let v1: Api<MyDatabase> = Api::namespaced(hub.clone(), ns);

    // Written as v1 with fields v1alpha1 lacks, read as v1alpha1.
    let mut original = database("modern", 3)?;
    original.spec.image = Some("registry.local/postgres".into());
    original.spec.read_only = true;
    v1.create(&PostParams::default(), &original).await?;
    let as_alpha = wait_for("v1alpha1 served", Duration::from_secs(30), || {
        let alpha = alpha.clone();
        async move {
            match alpha.get("modern").await {
                Ok(object) => Check::Done(object),
                Err(e) => Check::Waiting(e.to_string()),
            }
        }
    })
    .await
    .with_context(|| format!("webhook log:\n{}", webhook.log_text()))?;
    assert_eq!(as_alpha.data["spec"]["instances"], 3);
    assert_eq!(as_alpha.data["spec"]["postgresVersion"], "16");
    assert_eq!(as_alpha.data["spec"]["storageSize"], "1Gi");
    // Round trip: read back as v1, every field is there.
    let back = v1.get("modern").await?;
    assert_eq!(back.spec, {
        let mut expected = original.spec.clone();
        expected.storage.size = "1Gi".into();
        expected
    });

    // Written as v1alpha1, read as v1.
    let old_style: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "example.com/v1alpha1", "kind": "MyDatabase",
        "metadata": {"name": "vintage"},
        "spec": {"instances": 2, "postgresVersion": "15", "storageSize": "2Gi", "storageClass": "fast"}
    }))?;
    alpha.create(&PostParams::default(), &old_style).await?;
    let modern = v1.get("vintage").await?;
    assert_eq!(modern.spec.replicas, 2);
    assert_eq!(modern.spec.version, "15");
    assert_eq!(modern.spec.storage.size, "2Gi");
    assert_eq!(
        modern.spec.storage.storage_class_name.as_deref(),
        Some("fast")
    );
    let annotations = modern.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key("example.com/v1-spec"),
        "{annotations:?}"
    );
    Ok(())
}

#[tokio::test]
async fn the_agent_can_serve_the_webhook_in_process() -> Result<()> {
    let lab = support::lab().await?;
    lab.install_crds("east", &lab::crd_dir()).await?;
    let namespace = TestNamespace::create(&lab, "agent-webhook", &["east"]).await?;
    let ns = namespace.name.as_str();
    let east = lab.inside_client("east").await?;
    label_namespace(&east, ns, serde_json::json!({SCOPE_LABEL: ns})).await?;
    let port = free_port();
    let url = format!("https://127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{port}");
    let name = format!("e2e-{ns}");
    let selector = format!("{SCOPE_LABEL}={ns}");
    let agent = bulkhead_e2e::agent_support::AgentProcess::start(
        &lab,
        "east",
        ns,
        &[
            "--no-fencing",
            "--webhook",
            "--listen",
            &listen,
            "--url",
            &url,
            "--configuration-name",
            &name,
            "--selector-label",
            &selector,
        ],
    )?;
    let _configurations = Configurations {
        name: name.clone(),
        kubeconfigs: vec![lab.inside_kubeconfig("east")],
    };
    let statefulset: StatefulSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "nameless"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}
    }))?;
    let statefulsets: Api<StatefulSet> = Api::namespaced(east.clone(), ns);
    let message = wait_for_denial(&statefulsets, &statefulset, "spec.serviceName")
        .await
        .with_context(|| format!("agent log:\n{}", agent.log_tail()))?;
    eprintln!("denial from the agent's in-process webhook: {message}");
    Ok(())
}

#[tokio::test]
async fn the_hub_can_serve_the_webhook_in_process() -> Result<()> {
    let lab = support::lab().await?;
    lab.install_crds("hub", &lab::crd_dir()).await?;
    let namespace = TestNamespace::create(&lab, "hub-webhook", &["hub"]).await?;
    let ns = namespace.name.as_str();
    let hub = lab.client("hub").await?;
    label_namespace(&hub, ns, serde_json::json!({SCOPE_LABEL: ns})).await?;
    let port = free_port();
    let name = format!("e2e-{ns}");
    let log = lab.log_dir("hub").join(format!("hub-{ns}.log"));
    let child = Command::new(bulkhead_binary()?)
        .arg("hub")
        .arg("--kubeconfig")
        .arg(lab.kubeconfig("hub"))
        .args(["--probe-address", &format!("127.0.0.1:{}", free_port())])
        .args([
            "--webhook",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--url",
            &format!("https://127.0.0.1:{port}"),
        ])
        .args([
            "--configuration-name",
            &name,
            "--selector-label",
            &format!("{SCOPE_LABEL}={ns}"),
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let hub_process = Webhook {
        child,
        log,
        probe: 0,
    };
    let _configurations = Configurations {
        name,
        kubeconfigs: vec![lab.inside_kubeconfig("hub")],
    };
    let policies: Api<kube::api::DynamicObject> = Api::namespaced_with(
        hub.clone(),
        ns,
        &kube::discovery::ApiResource::erase::<bulkhead::api::PropagationPolicy>(&()),
    );
    let weightless: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "federation.example.com/v1alpha1", "kind": "PropagationPolicy",
        "metadata": {"name": "weightless"},
        "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment"}],
                 "placement": {"clusterTolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}]}}
    }))?;
    let message = wait_for_denial(&policies, &weightless, "tolerationSeconds")
        .await
        .with_context(|| format!("hub log:\n{}", hub_process.log_text()))?;
    eprintln!("denial from the hub's in-process webhook: {message}");

    // Someone deletes the validating configuration: the hub creates it again once it is
    // missing at two of its checks (15 s apart), and goes on running; the rule holds again.
    let configurations = Api::<ValidatingWebhookConfiguration>::all(hub.clone());
    let validating = format!("e2e-{ns}-validating");
    configurations
        .delete(&validating, &Default::default())
        .await?;
    let deleted = std::time::Instant::now();
    wait_for(
        "the hub to create the deleted configuration again",
        Duration::from_secs(60),
        || {
            let configurations = configurations.clone();
            let validating = validating.clone();
            async move {
                match configurations.get_opt(&validating).await {
                    Ok(Some(_)) => Check::Done(()),
                    Ok(None) => Check::Waiting("deleted".into()),
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        },
    )
    .await
    .with_context(|| format!("hub log:\n{}", hub_process.log_text()))?;
    eprintln!(
        "the deleted webhook configuration was back {:?} later",
        deleted.elapsed()
    );
    wait_for_denial(&policies, &weightless, "tolerationSeconds").await?;
    Ok(())
}
