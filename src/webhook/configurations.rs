//! The Validating/MutatingWebhookConfigurations Bulkhead installs, with sensible
//! failure policies and selectors so that it never blocks kube-system.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};

/// Which side a cluster is on: the hub stores templates and policies; members run copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterRole {
    Hub,
    Member,
}

/// How the API server reaches the webhook.
#[derive(Clone, Debug)]
pub enum Endpoint {
    /// `https://host:port` (the lab: processes on the host).
    Url(String),
    /// A Service in the cluster (the Helm chart).
    Service {
        namespace: String,
        name: String,
        port: i32,
    },
}

/// Everything the configurations are built from.
#[derive(Clone, Debug)]
pub struct ConfigurationSpec {
    /// Base name; the objects are `<name>-validating` and `<name>-mutating`.
    pub name: String,
    pub endpoint: Endpoint,
    /// The CA bundle API servers trust for the webhook; `None` leaves the field to
    /// someone else (cert-manager's CA injector), never written by the webhook.
    pub ca_bundle_pem: Option<String>,
    /// An extra `key=value` requirement on namespaces and objects (tests scope the
    /// webhook to their own objects with it).
    pub selector_label: Option<(String, String)>,
}

const SYSTEM_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

fn client_config(spec: &ConfigurationSpec, path: &str) -> WebhookClientConfig {
    let ca_bundle = spec
        .ca_bundle_pem
        .as_ref()
        .map(|pem| ByteString(pem.as_bytes().to_vec()));
    match &spec.endpoint {
        Endpoint::Url(base) => WebhookClientConfig {
            url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            ca_bundle,
            service: None,
        },
        Endpoint::Service {
            namespace,
            name,
            port,
        } => WebhookClientConfig {
            service: Some(ServiceReference {
                namespace: namespace.clone(),
                name: name.clone(),
                path: Some(path.to_string()),
                port: Some(*port),
            }),
            ca_bundle,
            url: None,
        },
    }
}

fn namespace_selector(spec: &ConfigurationSpec) -> LabelSelector {
    let mut expressions = vec![LabelSelectorRequirement {
        key: "kubernetes.io/metadata.name".into(),
        operator: "NotIn".into(),
        values: Some(SYSTEM_NAMESPACES.iter().map(|s| s.to_string()).collect()),
    }];
    if let Some((key, value)) = &spec.selector_label {
        expressions.push(LabelSelectorRequirement {
            key: key.clone(),
            operator: "In".into(),
            values: Some(vec![value.clone()]),
        });
    }
    LabelSelector {
        match_expressions: Some(expressions),
        match_labels: None,
    }
}

fn object_selector(spec: &ConfigurationSpec, cluster_scoped: bool) -> Option<LabelSelector> {
    let (key, value) = spec.selector_label.as_ref()?;
    cluster_scoped.then(|| LabelSelector {
        match_labels: Some(BTreeMap::from([(key.clone(), value.clone())])),
        match_expressions: None,
    })
}

fn rule(group: &str, version: &str, resources: &[&str], operations: &[&str]) -> RuleWithOperations {
    RuleWithOperations {
        api_groups: Some(vec![group.into()]),
        api_versions: Some(vec![version.into()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        operations: Some(operations.iter().map(|o| o.to_string()).collect()),
        scope: None,
    }
}

struct Hook {
    name: &'static str,
    rules: Vec<RuleWithOperations>,
    failure_policy: &'static str,
    cluster_scoped: bool,
}

fn validating_hooks(role: ClusterRole) -> Vec<Hook> {
    let mut hooks = vec![Hook {
        name: "mydatabases.validate.example.com",
        rules: vec![rule(
            "example.com",
            "v1",
            &["mydatabases"],
            &["CREATE", "UPDATE"],
        )],
        failure_policy: "Fail",
        cluster_scoped: false,
    }];
    match role {
        ClusterRole::Hub => {
            hooks.push(Hook {
                name: "propagationpolicies.validate.federation.example.com",
                rules: vec![rule(
                    "federation.example.com",
                    "v1alpha1",
                    &["propagationpolicies"],
                    &["CREATE", "UPDATE"],
                )],
                failure_policy: "Fail",
                cluster_scoped: false,
            });
            hooks.push(Hook {
                name: "overridepolicies.validate.federation.example.com",
                rules: vec![rule(
                    "federation.example.com",
                    "v1alpha1",
                    &["overridepolicies"],
                    &["CREATE", "UPDATE"],
                )],
                failure_policy: "Fail",
                cluster_scoped: false,
            });
            hooks.push(Hook {
                name: "clusterscoped.validate.federation.example.com",
                rules: vec![rule(
                    "federation.example.com",
                    "v1alpha1",
                    &[
                        "clusterpropagationpolicies",
                        "clusteroverridepolicies",
                        "memberclusters",
                        "resourceinterpreters",
                    ],
                    &["CREATE", "UPDATE"],
                )],
                failure_policy: "Fail",
                cluster_scoped: true,
            });
        }
        ClusterRole::Member => hooks.push(Hook {
            // Not Bulkhead's own kind: never block a member's workloads if the webhook is down.
            name: "statefulsets.validate.example.com",
            rules: vec![rule("apps", "v1", &["statefulsets"], &["CREATE", "UPDATE"])],
            failure_policy: "Ignore",
            cluster_scoped: false,
        }),
    }
    hooks
}

fn mutating_hooks(role: ClusterRole) -> Vec<Hook> {
    let mut hooks = vec![Hook {
        name: "mydatabases.mutate.example.com",
        rules: vec![rule("example.com", "v1", &["mydatabases"], &["CREATE"])],
        failure_policy: "Fail",
        cluster_scoped: false,
    }];
    if role == ClusterRole::Hub {
        hooks.push(Hook {
            name: "propagationpolicies.mutate.federation.example.com",
            rules: vec![rule(
                "federation.example.com",
                "v1alpha1",
                &["propagationpolicies"],
                &["CREATE", "UPDATE"],
            )],
            failure_policy: "Fail",
            cluster_scoped: false,
        });
    }
    hooks
}

/// The ValidatingWebhookConfiguration for a cluster of `role`.
pub fn validating(spec: &ConfigurationSpec, role: ClusterRole) -> ValidatingWebhookConfiguration {
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(format!("{}-validating", spec.name)),
            ..Default::default()
        },
        webhooks: Some(
            validating_hooks(role)
                .into_iter()
                .map(|hook| ValidatingWebhook {
                    name: hook.name.into(),
                    admission_review_versions: vec!["v1".into()],
                    client_config: client_config(spec, "/validate"),
                    failure_policy: Some(hook.failure_policy.into()),
                    match_policy: Some("Equivalent".into()),
                    namespace_selector: (!hook.cluster_scoped).then(|| namespace_selector(spec)),
                    object_selector: object_selector(spec, hook.cluster_scoped),
                    rules: Some(hook.rules),
                    side_effects: "None".into(),
                    timeout_seconds: Some(5),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

/// The MutatingWebhookConfiguration for a cluster of `role`.
pub fn mutating(spec: &ConfigurationSpec, role: ClusterRole) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(format!("{}-mutating", spec.name)),
            ..Default::default()
        },
        webhooks: Some(
            mutating_hooks(role)
                .into_iter()
                .map(|hook| MutatingWebhook {
                    name: hook.name.into(),
                    admission_review_versions: vec!["v1".into()],
                    client_config: client_config(spec, "/mutate"),
                    failure_policy: Some(hook.failure_policy.into()),
                    match_policy: Some("Equivalent".into()),
                    namespace_selector: (!hook.cluster_scoped).then(|| namespace_selector(spec)),
                    object_selector: object_selector(spec, hook.cluster_scoped),
                    reinvocation_policy: Some("Never".into()),
                    rules: Some(hook.rules),
                    side_effects: "None".into(),
                    timeout_seconds: Some(5),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

/// Applies both configurations to a cluster (server-side apply, field manager
/// `bulkhead-webhook`).
pub async fn install(
    client: &kube::Client,
    spec: &ConfigurationSpec,
    role: ClusterRole,
) -> Result<(), kube::Error> {
    use kube::Api;
    use kube::api::{Patch, PatchParams};
    let params = PatchParams::apply("bulkhead-webhook").force();
    let validating_config = validating(spec, role);
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .patch(
            validating_config
                .metadata
                .name
                .as_deref()
                .unwrap_or_default(),
            &params,
            &Patch::Apply(&validating_config),
        )
        .await?;
    let mutating_config = mutating(spec, role);
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .patch(
            mutating_config.metadata.name.as_deref().unwrap_or_default(),
            &params,
            &Patch::Apply(&mutating_config),
        )
        .await?;
    Ok(())
}

/// The configurations of `spec` that do not exist in the cluster (deleted by someone).
pub async fn missing(
    client: &kube::Client,
    spec: &ConfigurationSpec,
) -> Result<Vec<String>, kube::Error> {
    use kube::Api;
    let validating_name = format!("{}-validating", spec.name);
    let mutating_name = format!("{}-mutating", spec.name);
    let mut missing = vec![];
    if Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get_opt(&validating_name)
        .await?
        .is_none()
    {
        missing.push(format!("ValidatingWebhookConfiguration {validating_name}"));
    }
    if Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get_opt(&mutating_name)
        .await?
        .is_none()
    {
        missing.push(format!("MutatingWebhookConfiguration {mutating_name}"));
    }
    Ok(missing)
}

/// Points the MyDatabase CRD's conversion at the webhook and serves `v1alpha1`. Writes
/// only when something differs, so it can be re-run to keep the caBundle current (for
/// example after the CRD was re-applied with `served: false`).
pub async fn ensure_conversion(
    client: &kube::Client,
    spec: &ConfigurationSpec,
) -> Result<bool, kube::Error> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceConversion, CustomResourceDefinition, WebhookClientConfig as CrdClientConfig,
        WebhookConversion,
    };
    use kube::Api;
    use kube::api::PostParams;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let config = client_config(spec, "/convert");
    let wanted = CustomResourceConversion {
        strategy: "Webhook".into(),
        webhook: Some(WebhookConversion {
            client_config: Some(CrdClientConfig {
                url: config.url,
                ca_bundle: config.ca_bundle,
                service: config.service.map(|s| {
                    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ServiceReference {
                        namespace: s.namespace,
                        name: s.name,
                        path: s.path,
                        port: s.port,
                    }
                }),
            }),
            conversion_review_versions: vec!["v1".into()],
        }),
    };
    for _ in 0..5 {
        let mut crd = api.get("mydatabases.example.com").await?;
        tracing::debug!(conversion = ?crd.spec.conversion, "current MyDatabase conversion");
        let served = crd.spec.versions.iter().all(|v| v.served);
        let wanted = keeping_an_injected_bundle(&wanted, crd.spec.conversion.as_ref());
        if served && crd.spec.conversion.as_ref() == Some(&wanted) {
            return Ok(false);
        }
        crd.spec.conversion = Some(wanted);
        for version in &mut crd.spec.versions {
            version.served = true;
        }
        tracing::debug!("configuring the MyDatabase conversion webhook");
        match api
            .replace("mydatabases.example.com", &PostParams::default(), &crd)
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => return Err(error),
        }
    }
    Ok(false)
}

/// The conversion to write: `wanted`, and when it carries no caBundle (cert-manager's CA
/// injector writes it), the caBundle the CRD holds now.
fn keeping_an_injected_bundle(
    wanted: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceConversion,
    current: Option<&k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceConversion>,
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceConversion {
    let mut wanted = wanted.clone();
    let injected = current
        .and_then(|c| c.webhook.as_ref())
        .and_then(|w| w.client_config.as_ref())
        .and_then(|c| c.ca_bundle.clone());
    if let Some(config) = wanted
        .webhook
        .as_mut()
        .and_then(|w| w.client_config.as_mut())
        .filter(|c| c.ca_bundle.is_none())
    {
        config.ca_bundle = injected;
    }
    wanted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ConfigurationSpec {
        ConfigurationSpec {
            name: "bulkhead".into(),
            endpoint: Endpoint::Url("https://127.0.0.1:9443".into()),
            ca_bundle_pem: Some("-----BEGIN CERTIFICATE-----\n".into()),
            selector_label: None,
        }
    }

    fn hub_hooks(spec: &ConfigurationSpec) -> Vec<ValidatingWebhook> {
        validating(spec, ClusterRole::Hub).webhooks.unwrap()
    }

    #[test]
    fn hub_and_member_get_the_right_hooks() {
        let hub = validating(&spec(), ClusterRole::Hub);
        let names: Vec<String> = hub.webhooks.unwrap().into_iter().map(|w| w.name).collect();
        assert!(names.iter().any(|n| n.starts_with("propagationpolicies")));
        assert!(names.iter().any(|n| n.starts_with("overridepolicies")));
        let cluster_scoped = hub_hooks(&spec())
            .into_iter()
            .find(|w| w.name.starts_with("clusterscoped"))
            .unwrap();
        assert!(
            cluster_scoped.rules.unwrap()[0]
                .resources
                .as_ref()
                .unwrap()
                .contains(&"clusteroverridepolicies".to_string())
        );
        assert!(!names.iter().any(|n| n.starts_with("statefulsets")));
        let member = validating(&spec(), ClusterRole::Member);
        let hooks = member.webhooks.unwrap();
        let statefulsets = hooks
            .iter()
            .find(|w| w.name.starts_with("statefulsets"))
            .unwrap();
        assert_eq!(
            statefulsets.failure_policy.as_deref(),
            Some("Ignore"),
            "never block members' workloads"
        );
    }

    #[test]
    fn never_blocks_kube_system_and_has_no_side_effects() {
        for hook in validating(&spec(), ClusterRole::Hub).webhooks.unwrap() {
            assert_eq!(hook.side_effects, "None");
            assert_eq!(hook.timeout_seconds, Some(5));
            assert_eq!(
                hook.client_config.url.as_deref(),
                Some("https://127.0.0.1:9443/validate")
            );
            if let Some(selector) = hook.namespace_selector {
                let expression = &selector.match_expressions.unwrap()[0];
                assert_eq!(expression.operator, "NotIn");
                assert!(
                    expression
                        .values
                        .as_ref()
                        .unwrap()
                        .contains(&"kube-system".to_string())
                );
            }
        }
    }

    #[test]
    fn service_endpoint_and_test_scoping() {
        let mut spec = spec();
        spec.endpoint = Endpoint::Service {
            namespace: "bulkhead-system".into(),
            name: "bulkhead-webhook".into(),
            port: 443,
        };
        spec.selector_label = Some(("e2e".into(), "ns1".into()));
        let config = mutating(&spec, ClusterRole::Hub);
        let hook = &config.webhooks.unwrap()[0];
        assert_eq!(
            hook.client_config.service.as_ref().unwrap().path.as_deref(),
            Some("/mutate")
        );
        assert_eq!(
            hook.namespace_selector
                .as_ref()
                .unwrap()
                .match_expressions
                .as_ref()
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn an_injected_ca_bundle_is_kept_and_an_own_one_wins() {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
            CustomResourceConversion, WebhookClientConfig as CrdClientConfig, WebhookConversion,
        };
        let conversion = |bundle: Option<&str>| CustomResourceConversion {
            strategy: "Webhook".into(),
            webhook: Some(WebhookConversion {
                client_config: Some(CrdClientConfig {
                    url: Some("https://127.0.0.1:9443/convert".into()),
                    ca_bundle: bundle.map(|b| ByteString(b.as_bytes().to_vec())),
                    service: None,
                }),
                conversion_review_versions: vec!["v1".into()],
            }),
        };
        // cert-manager's injector wrote one: the webhook (no bundle of its own) keeps it.
        assert_eq!(
            keeping_an_injected_bundle(&conversion(None), Some(&conversion(Some("injected")))),
            conversion(Some("injected"))
        );
        // The webhook publishes its own: that one is written.
        assert_eq!(
            keeping_an_injected_bundle(&conversion(Some("own")), Some(&conversion(Some("old")))),
            conversion(Some("own"))
        );
        assert_eq!(
            keeping_an_injected_bundle(&conversion(None), None),
            conversion(None)
        );
        // Without a bundle, the configurations leave the field out (server-side apply
        // then never owns it).
        let spec = ConfigurationSpec {
            ca_bundle_pem: None,
            ..spec()
        };
        assert!(client_config(&spec, "/validate").ca_bundle.is_none());
    }
}
