//! Per-tenant admission rules. A tenant is an object's `federation.example.com/tenant`
//! annotation, else its namespace's label of that name. Rules live in ConfigMaps in
//! `bulkhead-system` labelled `federation.example.com/tenant-policy: <tenant>` (key
//! `policy.yaml`); the ConfigMap `default-tenant-policy` holds the rules for tenants
//! without their own. Rules and namespace labels are watched and swapped in atomically;
//! a ConfigMap that does not parse is ignored (with an Event) and the previous rules stay.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::Deserialize;

use crate::api::LABEL_TENANT;

/// Label on rule ConfigMaps naming their tenant.
pub const LABEL_TENANT_POLICY: &str = "federation.example.com/tenant-policy";
/// The ConfigMap holding the rules for tenants without their own.
pub const DEFAULT_POLICY_NAME: &str = "default-tenant-policy";

/// One tenant's rules (`policy.yaml`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantRules {
    /// Most replicas per MyDatabase / per template.
    #[serde(default)]
    pub max_replicas: Option<i32>,
    /// PostgreSQL versions allowed; empty = any.
    #[serde(default)]
    pub allowed_versions: Vec<String>,
    /// Member clusters the tenant's workloads may use; empty = any.
    #[serde(default)]
    pub allowed_clusters: Vec<String>,
    /// Zones the tenant's workloads may use; empty = any.
    #[serde(default)]
    pub allowed_zones: Vec<String>,
    /// Defaults filled into the tenant's MyDatabases when unset.
    #[serde(default)]
    pub defaults: TenantDefaults,
}

/// Defaults a tenant's MyDatabases get.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantDefaults {
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub storage_class_name: Option<String>,
}

/// Parses `policy.yaml`, with an error that says what is wrong.
pub fn parse_rules(text: &str) -> Result<TenantRules, String> {
    serde_yaml::from_str::<Option<TenantRules>>(text)
        .map(Option::unwrap_or_default)
        .map_err(|e| e.to_string())
}

/// The rules in force: per tenant, plus the default.
#[derive(Clone, Debug, Default)]
pub struct RuleSet {
    pub tenants: HashMap<String, Arc<TenantRules>>,
    pub default: Option<Arc<TenantRules>>,
}

impl RuleSet {
    /// The rules for `tenant`: its own, else the default.
    pub fn for_tenant(&self, tenant: &str) -> Option<Arc<TenantRules>> {
        self.tenants
            .get(tenant)
            .cloned()
            .or_else(|| self.default.clone())
    }
}

/// What the admission handlers read: rules and namespace tenants, lock-free.
#[derive(Default)]
pub struct TenantRegistry {
    rules: ArcSwap<RuleSet>,
    namespace_tenants: ArcSwap<HashMap<String, String>>,
}

impl TenantRegistry {
    pub fn new() -> Arc<Self> {
        Arc::new(TenantRegistry::default())
    }

    /// The tenant of an object: its annotation, else its namespace's label.
    pub fn tenant_of(
        &self,
        annotations: Option<&BTreeMap<String, String>>,
        namespace: Option<&str>,
    ) -> Option<String> {
        annotations
            .and_then(|a| a.get(LABEL_TENANT))
            .filter(|t| !t.is_empty())
            .cloned()
            .or_else(|| namespace.and_then(|ns| self.namespace_tenants.load().get(ns).cloned()))
    }

    /// The rules for `tenant` (or the default rules).
    pub fn rules_for(&self, tenant: &str) -> Option<Arc<TenantRules>> {
        self.rules.load().for_tenant(tenant)
    }

    /// Swaps in a whole new rule set.
    pub fn store_rules(&self, rules: RuleSet) {
        self.rules.store(Arc::new(rules));
    }

    /// Swaps in the namespace -> tenant map.
    pub fn store_namespaces(&self, tenants: HashMap<String, String>) {
        self.namespace_tenants.store(Arc::new(tenants));
    }

    /// The rule set in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }
}

/// A rule ConfigMap, reduced to what matters.
#[derive(Clone, Debug)]
pub struct RuleSource {
    pub name: String,
    /// The tenant label, or None for `default-tenant-policy`.
    pub tenant: Option<String>,
    pub policy_yaml: Option<String>,
}

/// Builds the next rule set from the current ConfigMaps. A ConfigMap that does not parse
/// keeps its tenant's previous rules; the errors are returned for Events.
pub fn next_rules(previous: &RuleSet, sources: &[RuleSource]) -> (RuleSet, Vec<(String, String)>) {
    let mut next = RuleSet::default();
    let mut errors = vec![];
    for source in sources {
        let parsed = match &source.policy_yaml {
            Some(text) => parse_rules(text),
            None => Err("the ConfigMap has no key policy.yaml".to_string()),
        };
        let keep_previous = || match &source.tenant {
            Some(tenant) => previous.tenants.get(tenant).cloned(),
            None => previous.default.clone(),
        };
        let rules = match parsed {
            Ok(rules) => Some(Arc::new(rules)),
            Err(error) => {
                errors.push((source.name.clone(), error));
                keep_previous()
            }
        };
        if let Some(rules) = rules {
            match &source.tenant {
                Some(tenant) => {
                    next.tenants.insert(tenant.clone(), rules);
                }
                None => next.default = Some(rules),
            }
        }
    }
    (next, errors)
}

/// Watches the rule ConfigMaps in `namespace` and the tenant labels of namespaces, and
/// keeps `registry` up to date until shutdown.
pub async fn watch(
    client: kube::Client,
    namespace: String,
    registry: Arc<TenantRegistry>,
    recorder: kube::runtime::events::Recorder,
    shutdown: tokio_util::sync::CancellationToken,
) {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    use kube::{Api, ResourceExt};

    let (config_maps, config_writer) = reflector::store::<ConfigMap>();
    let config_stream = reflector(
        config_writer,
        watcher(
            Api::<ConfigMap>::namespaced(client.clone(), &namespace),
            watcher::Config::default(),
        ),
    )
    .default_backoff();
    let (namespaces, namespace_writer) = reflector::store::<Namespace>();
    let namespace_stream = reflector(
        namespace_writer,
        watcher(
            Api::<Namespace>::all(client),
            watcher::Config::default().labels(LABEL_TENANT),
        ),
    )
    .default_backoff();
    // Every watch event, not just touched objects: the store publishes a relist only at
    // its InitDone event.
    let mut config_stream = config_stream.boxed();
    let mut namespace_stream = namespace_stream.boxed();
    let mut reported: HashMap<String, String> = HashMap::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            event = config_stream.next() => {
                if let Some(Err(error)) = &event { tracing::warn!(%error, "watching tenant rule ConfigMaps"); }
                if event.is_none() { return; }
                let sources: Vec<RuleSource> = config_maps
                    .state()
                    .iter()
                    .filter_map(|cm| {
                        let tenant = cm.labels().get(LABEL_TENANT_POLICY).cloned();
                        if tenant.is_none() && cm.name_any() != DEFAULT_POLICY_NAME {
                            return None;
                        }
                        Some(RuleSource {
                            name: cm.name_any(),
                            tenant,
                            policy_yaml: cm.data.as_ref().and_then(|d| d.get("policy.yaml").cloned()),
                        })
                    })
                    .collect();
                let (next, errors) = next_rules(&registry.rules(), &sources);
                tracing::debug!(configmaps = sources.len(), tenants = next.tenants.len(), default = next.default.is_some(), "tenant rules reloaded");
                registry.store_rules(next);
                for (name, error) in errors {
                    if reported.get(&name) == Some(&error) {
                        continue;
                    }
                    tracing::warn!(configmap = %name, %error, "tenant rules ignored; the previous rules stay in force");
                    let reference = k8s_openapi::api::core::v1::ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("ConfigMap".into()),
                        namespace: Some(namespace.clone()),
                        name: Some(name.clone()),
                        ..Default::default()
                    };
                    let event = kube::runtime::events::Event {
                        type_: kube::runtime::events::EventType::Warning,
                        reason: "InvalidTenantPolicy".into(),
                        note: Some(format!("policy.yaml does not parse, so it is ignored and the previous rules stay in force: {error}")),
                        action: "LoadTenantPolicy".into(),
                        secondary: None,
                    };
                    let _ = recorder.publish(&event, &reference).await;
                    reported.insert(name, error);
                }
            }
            event = namespace_stream.next() => {
                if let Some(Err(error)) = &event { tracing::warn!(%error, "watching namespace tenants"); }
                if event.is_none() { return; }
                let map = namespaces
                    .state()
                    .iter()
                    .filter_map(|ns| ns.labels().get(LABEL_TENANT).map(|t| (ns.name_any(), t.clone())))
                    .collect();
                tracing::debug!(namespaces = ?map, "namespace tenants reloaded");
                registry.store_namespaces(map);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_policy() {
        let rules = parse_rules(
            "maxReplicas: 3\nallowedVersions: [\"15\", \"16\"]\nallowedClusters: [east, west]\nallowedZones: [zone-a]\ndefaults: {image: registry.local/postgres, storageClassName: fast}\n",
        )
        .unwrap();
        assert_eq!(rules.max_replicas, Some(3));
        assert_eq!(rules.allowed_clusters, ["east", "west"]);
        assert_eq!(
            rules.defaults.image.as_deref(),
            Some("registry.local/postgres")
        );
        assert_eq!(parse_rules("").unwrap(), TenantRules::default());
    }

    #[test]
    fn unknown_or_mistyped_fields_are_errors() {
        assert!(
            parse_rules("maxReplica: 3")
                .unwrap_err()
                .contains("maxReplica")
        );
        assert!(parse_rules("maxReplicas: lots").is_err());
    }

    #[test]
    fn a_broken_configmap_keeps_the_previous_rules() {
        let source = |yaml: &str| RuleSource {
            name: "team-a-rules".into(),
            tenant: Some("team-a".into()),
            policy_yaml: Some(yaml.into()),
        };
        let (first, errors) = next_rules(&RuleSet::default(), &[source("maxReplicas: 3")]);
        assert!(errors.is_empty());
        let (second, errors) = next_rules(&first, &[source("maxReplicas: [")]);
        assert_eq!(errors.len(), 1);
        assert_eq!(second.for_tenant("team-a").unwrap().max_replicas, Some(3));
        let (third, _) = next_rules(&second, &[source("maxReplicas: 5")]);
        assert_eq!(third.for_tenant("team-a").unwrap().max_replicas, Some(5));
    }

    #[test]
    fn default_rules_apply_to_tenants_without_their_own() {
        let sources = [
            RuleSource {
                name: DEFAULT_POLICY_NAME.into(),
                tenant: None,
                policy_yaml: Some("maxReplicas: 2".into()),
            },
            RuleSource {
                name: "b".into(),
                tenant: Some("team-b".into()),
                policy_yaml: Some("maxReplicas: 9".into()),
            },
        ];
        let (rules, _) = next_rules(&RuleSet::default(), &sources);
        assert_eq!(rules.for_tenant("team-a").unwrap().max_replicas, Some(2));
        assert_eq!(rules.for_tenant("team-b").unwrap().max_replicas, Some(9));
    }

    #[test]
    fn tenant_comes_from_the_annotation_then_the_namespace() {
        let registry = TenantRegistry::new();
        registry.store_namespaces(HashMap::from([("shop".to_string(), "team-a".to_string())]));
        assert_eq!(
            registry.tenant_of(None, Some("shop")).as_deref(),
            Some("team-a")
        );
        let annotations = BTreeMap::from([(LABEL_TENANT.to_string(), "team-b".to_string())]);
        assert_eq!(
            registry
                .tenant_of(Some(&annotations), Some("shop"))
                .as_deref(),
            Some("team-b")
        );
        assert_eq!(registry.tenant_of(None, Some("other")), None);
    }
}
