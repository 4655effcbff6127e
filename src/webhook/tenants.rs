//! Per-tenant admission rules. The tenant of an object is its namespace's
//! `federation.example.com/tenant` label, and nothing else: tenants cannot edit namespaces,
//! so they cannot choose their tenant. An object that names another tenant in its own
//! annotation or label is denied ([`TenantSnapshot::resolve`], the single rule every
//! handler calls). Rules live in ConfigMaps in `bulkhead-system` labelled
//! `federation.example.com/tenant-policy: <tenant>` (key `policy.yaml`); the ConfigMap
//! `default-tenant-policy` holds the rules for tenants without their own. Rules and
//! namespace labels are watched and swapped in atomically as one [`TenantSnapshot`]; a
//! ConfigMap that does not parse is ignored (with an Event) and the previous rules stay.
//! Until both watches have listed once, the snapshot is not synced and tenant-governed
//! requests are denied (the webhook cannot yet tell which limits apply).

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
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
    /// Whether the tenant's PropagationPolicies may use `conflictResolution: Overwrite`
    /// (take over same-named objects that already exist in members, which the tenant may
    /// not own). Off unless its rules say so.
    #[serde(default)]
    pub allow_overwrite: bool,
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

/// An object's tenant and the rules that apply to it (no limits when the tenant has no
/// rules of its own and there is no `default-tenant-policy`).
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedTenant {
    pub name: String,
    pub rules: Arc<TenantRules>,
}

/// Everything admission knows about tenants at one moment, swapped in as one value so a
/// request sees rules and namespace labels from the same instant.
#[derive(Clone, Debug, Default)]
pub struct TenantSnapshot {
    pub rules: Arc<RuleSet>,
    /// Namespace name -> tenant (its `federation.example.com/tenant` label).
    pub namespace_tenants: Arc<HashMap<String, String>>,
    /// The rule ConfigMaps have been listed at least once.
    pub rules_synced: bool,
    /// The namespace labels have been listed at least once.
    pub namespaces_synced: bool,
}

impl TenantSnapshot {
    /// Both initial lists are in: tenant rules can be enforced.
    pub fn is_synced(&self) -> bool {
        self.rules_synced && self.namespaces_synced
    }

    /// What is still being listed, for logs, /readyz and denials.
    pub fn waiting_for(&self) -> Option<&'static str> {
        match (self.rules_synced, self.namespaces_synced) {
            (true, true) => None,
            (false, true) => Some("the tenant rule ConfigMaps"),
            (true, false) => Some("the namespace tenant labels"),
            (false, false) => Some("the tenant rule ConfigMaps and the namespace tenant labels"),
        }
    }

    /// The tenant a namespace belongs to, from its label.
    pub fn namespace_tenant(&self, namespace: &str) -> Option<&str> {
        self.namespace_tenants
            .get(namespace)
            .map(String::as_str)
            .filter(|t| !t.is_empty())
    }

    /// The rule: an object's tenant is its namespace's label. `object` names the object
    /// in messages; `metadata` is the incoming object's, `old` the stored one's on UPDATE.
    ///
    /// - Cluster-scoped objects (no namespace) have no tenant.
    /// - Until both watches have listed once, every namespaced request is denied: without
    ///   the rules and labels the webhook cannot tell which limits apply.
    /// - In a namespace that belongs to a tenant, a `federation.example.com/tenant`
    ///   annotation or label naming any other value is denied, naming the namespace's
    ///   tenant and the fix. A claim the stored object already carried is not a new claim
    ///   (it was admitted before the namespace moved, or before this rule): it grants
    ///   nothing, since only the namespace counts, and denying it would block the
    ///   controllers' own updates (finalizers) of that object.
    /// - In a namespace without a tenant the object has none, whatever it says (the hub
    ///   creates member namespaces without the label, and member copies carry the hub
    ///   template's label).
    pub fn resolve(
        &self,
        object: &str,
        namespace: Option<&str>,
        metadata: &ObjectMeta,
        old: Option<&ObjectMeta>,
    ) -> Result<Option<ResolvedTenant>, String> {
        let Some(namespace) = namespace.filter(|ns| !ns.is_empty()) else {
            return Ok(None);
        };
        if let Some(waiting) = self.waiting_for() {
            return Err(format!(
                "{object}: the admission webhook is still syncing its tenant rules (it has not yet listed {waiting}), so it cannot tell which tenant limits apply; retry in a few seconds"
            ));
        }
        let Some(tenant) = self.namespace_tenant(namespace) else {
            return Ok(None);
        };
        let claims = [
            (
                "metadata.annotations",
                "annotation",
                metadata.annotations.as_ref(),
                old.and_then(|o| o.annotations.as_ref()),
            ),
            (
                "metadata.labels",
                "label",
                metadata.labels.as_ref(),
                old.and_then(|o| o.labels.as_ref()),
            ),
        ];
        for (field, what, current, stored) in claims {
            let Some(claim) = current
                .and_then(|m| m.get(LABEL_TENANT))
                .filter(|c| !c.is_empty())
            else {
                continue;
            };
            let already_stored = stored.and_then(|m| m.get(LABEL_TENANT)) == Some(claim);
            if claim != tenant && !already_stored {
                return Err(format!(
                    "{object}: {field}[\"{LABEL_TENANT}\"] is {claim:?}, but namespace {namespace} belongs to tenant {tenant} (its {LABEL_TENANT} label decides the tenant, and only cluster admins can change it); remove the {what}, or set it to {tenant:?}"
                ));
            }
        }
        Ok(Some(ResolvedTenant {
            name: tenant.to_string(),
            rules: self.rules.for_tenant(tenant).unwrap_or_default(),
        }))
    }
}

/// What the admission handlers read, lock-free: the current [`TenantSnapshot`].
pub struct TenantRegistry {
    snapshot: ArcSwap<TenantSnapshot>,
    synced: tokio::sync::watch::Sender<bool>,
}

impl TenantRegistry {
    /// An empty registry, not synced: tenant-governed requests are denied until the
    /// watches have stored both lists.
    pub fn new() -> Arc<Self> {
        Arc::new(TenantRegistry {
            snapshot: ArcSwap::from_pointee(TenantSnapshot::default()),
            synced: tokio::sync::watch::Sender::new(false),
        })
    }

    /// The snapshot in force; a request uses one snapshot from start to end.
    pub fn snapshot(&self) -> Arc<TenantSnapshot> {
        self.snapshot.load_full()
    }

    /// Swaps in a whole new rule set, built from a complete list of the ConfigMaps (so
    /// the rules count as synced from now on).
    pub fn store_rules(&self, rules: RuleSet) {
        let rules = Arc::new(rules);
        self.update(|snapshot| {
            snapshot.rules = rules.clone();
            snapshot.rules_synced = true;
        });
    }

    /// Swaps in the namespace -> tenant map, built from a complete list of the labelled
    /// namespaces (so the labels count as synced from now on).
    pub fn store_namespaces(&self, tenants: HashMap<String, String>) {
        let tenants = Arc::new(tenants);
        self.update(|snapshot| {
            snapshot.namespace_tenants = tenants.clone();
            snapshot.namespaces_synced = true;
        });
    }

    fn update(&self, change: impl Fn(&mut TenantSnapshot)) {
        self.snapshot.rcu(|current| {
            let mut next = TenantSnapshot::clone(current);
            change(&mut next);
            next
        });
        let synced = self.snapshot.load().is_synced();
        self.synced.send_if_modified(|current| {
            let changed = *current != synced;
            *current = synced;
            changed
        });
    }

    /// The rule set in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.snapshot.load().rules.clone()
    }

    /// Returns once both watches have stored their initial list.
    pub async fn wait_until_synced(&self) {
        let mut synced = self.synced.subscribe();
        // The sender lives as long as `self`, so this only ends when synced.
        let _ = synced.wait_for(|synced| *synced).await;
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

/// Whether the reflector store holds a complete list after `event`: from the first
/// InitDone on, except while a relist is buffering (Init, InitApply), when it still shows
/// the previous complete list and nothing changed.
fn shows_a_complete_list<K>(event: &kube::runtime::watcher::Event<K>) -> bool {
    use kube::runtime::watcher::Event;
    matches!(event, Event::InitDone | Event::Apply(_) | Event::Delete(_))
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
    // The store shows the initial list (and every relist) only from the watcher's InitDone
    // event, atomically; Init and InitApply leave it as it was. So: recompute on InitDone,
    // Apply and Delete (never on touched objects alone, which skip InitDone), and count a
    // watch as synced from its first InitDone.
    let mut config_stream = config_stream.boxed();
    let mut namespace_stream = namespace_stream.boxed();
    let mut reported: HashMap<String, String> = HashMap::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            event = config_stream.next() => {
                match &event {
                    None => return,
                    Some(Err(error)) => { tracing::warn!(%error, "watching tenant rule ConfigMaps"); continue; }
                    Some(Ok(event)) if !shows_a_complete_list(event) => continue,
                    Some(Ok(_)) => {}
                }
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
                match &event {
                    None => return,
                    Some(Err(error)) => { tracing::warn!(%error, "watching namespace tenants"); continue; }
                    Some(Ok(event)) if !shows_a_complete_list(event) => continue,
                    Some(Ok(_)) => {}
                }
                let map = namespaces
                    .state()
                    .iter()
                    .filter_map(|ns| {
                        ns.labels()
                            .get(LABEL_TENANT)
                            .filter(|t| !t.is_empty())
                            .map(|t| (ns.name_any(), t.clone()))
                    })
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
    use serde_json::Value;
    use std::collections::BTreeMap;

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
        assert!(!TenantRules::default().allow_overwrite);
        assert!(parse_rules("allowOverwrite: true").unwrap().allow_overwrite);
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

    fn synced(namespaces: &[(&str, &str)], rules: &[(&str, &str)]) -> Arc<TenantRegistry> {
        let registry = TenantRegistry::new();
        registry.store_namespaces(
            namespaces
                .iter()
                .map(|(ns, t)| (ns.to_string(), t.to_string()))
                .collect(),
        );
        let sources: Vec<RuleSource> = rules
            .iter()
            .map(|(tenant, yaml)| RuleSource {
                name: format!("{tenant}-rules"),
                tenant: Some(tenant.to_string()),
                policy_yaml: Some(yaml.to_string()),
            })
            .collect();
        registry.store_rules(next_rules(&RuleSet::default(), &sources).0);
        registry
    }

    fn meta(annotation: Option<&str>, label: Option<&str>) -> ObjectMeta {
        let map = |value: Option<&str>| {
            value.map(|v| BTreeMap::from([(LABEL_TENANT.to_string(), v.to_string())]))
        };
        ObjectMeta {
            annotations: map(annotation),
            labels: map(label),
            ..Default::default()
        }
    }

    const OBJECT: &str = "MyDatabase shop/orders";

    #[test]
    fn the_tenant_is_the_namespace_label() {
        let registry = synced(&[("shop", "team-a")], &[("team-a", "maxReplicas: 3")]);
        let snapshot = registry.snapshot();
        let tenant = snapshot
            .resolve(OBJECT, Some("shop"), &meta(None, None), None)
            .unwrap()
            .unwrap();
        assert_eq!(tenant.name, "team-a");
        assert_eq!(tenant.rules.max_replicas, Some(3));
        assert_eq!(
            snapshot.resolve(OBJECT, Some("other"), &meta(None, None), None),
            Ok(None),
            "a namespace without the label has no tenant"
        );
        assert_eq!(
            snapshot.resolve(
                "ClusterPropagationPolicy p",
                None,
                &meta(Some("team-b"), None),
                None
            ),
            Ok(None),
            "cluster-scoped objects have no tenant"
        );
        // A tenant without rules (and no default) still is the tenant: no limits.
        let no_rules = synced(&[("lab", "team-c")], &[]);
        let tenant = no_rules
            .snapshot()
            .resolve(OBJECT, Some("lab"), &meta(None, None), None)
            .unwrap()
            .unwrap();
        assert_eq!(
            (tenant.name.as_str(), tenant.rules.as_ref()),
            ("team-c", &TenantRules::default())
        );
    }

    /// The attack of issue 16: a user in team-a's namespace writes `tenant: team-b` (or a
    /// tenant with no rules) to escape team-a's limits.
    #[test]
    fn an_object_cannot_claim_another_tenant() {
        let registry = synced(
            &[("shop", "team-a")],
            &[("team-a", "maxReplicas: 3"), ("team-b", "maxReplicas: 9")],
        );
        let snapshot = registry.snapshot();
        for claim in ["team-b", "no-such-tenant"] {
            let denial = snapshot
                .resolve(OBJECT, Some("shop"), &meta(Some(claim), None), None)
                .unwrap_err();
            assert!(
                denial.starts_with(OBJECT)
                    && denial.contains(&format!(
                        "metadata.annotations[\"{LABEL_TENANT}\"] is \"{claim}\""
                    ))
                    && denial.contains("namespace shop belongs to tenant team-a")
                    && denial.contains("remove the annotation"),
                "{denial}"
            );
            let denial = snapshot
                .resolve(OBJECT, Some("shop"), &meta(None, Some(claim)), None)
                .unwrap_err();
            assert!(
                denial.contains("metadata.labels") && denial.contains("remove the label"),
                "{denial}"
            );
        }
        // Naming the namespace's own tenant is fine, and so is an empty value.
        for fine in [meta(Some("team-a"), Some("team-a")), meta(Some(""), None)] {
            let tenant = snapshot.resolve(OBJECT, Some("shop"), &fine, None).unwrap();
            assert_eq!(tenant.unwrap().rules.max_replicas, Some(3));
        }
    }

    #[test]
    fn a_claim_the_stored_object_already_had_grants_nothing_and_is_not_denied() {
        let registry = synced(&[("shop", "team-a")], &[("team-a", "maxReplicas: 3")]);
        let snapshot = registry.snapshot();
        let stale = meta(Some("team-b"), Some("team-b"));
        let tenant = snapshot
            .resolve(OBJECT, Some("shop"), &stale, Some(&stale))
            .unwrap()
            .unwrap();
        assert_eq!(tenant.name, "team-a", "the namespace still decides");
        assert_eq!(tenant.rules.max_replicas, Some(3));
        // Changing it, or adding one on update, is a new claim.
        let changed = meta(Some("team-c"), Some("team-b"));
        assert!(
            snapshot
                .resolve(OBJECT, Some("shop"), &changed, Some(&stale))
                .is_err()
        );
        assert!(
            snapshot
                .resolve(OBJECT, Some("shop"), &stale, Some(&meta(None, None)))
                .is_err()
        );
    }

    #[test]
    fn in_a_namespace_without_tenant_a_claim_is_ignored() {
        let registry = synced(&[], &[("team-b", "maxReplicas: 9")]);
        assert_eq!(
            registry.snapshot().resolve(
                OBJECT,
                Some("shop"),
                &meta(Some("team-b"), Some("team-b")),
                None
            ),
            Ok(None)
        );
    }

    #[test]
    fn nothing_resolves_until_both_lists_are_in() {
        let registry = TenantRegistry::new();
        let denial = |registry: &TenantRegistry| {
            registry
                .snapshot()
                .resolve(OBJECT, Some("shop"), &meta(None, None), None)
                .unwrap_err()
        };
        let message = denial(&registry);
        assert!(
            message.starts_with(OBJECT)
                && message.contains("still syncing its tenant rules")
                && message.contains("retry"),
            "{message}"
        );
        registry.store_rules(RuleSet::default());
        assert!(denial(&registry).contains("namespace tenant labels"));
        assert!(!registry.snapshot().is_synced());
        registry.store_namespaces(HashMap::from([("shop".into(), "team-a".into())]));
        assert!(registry.snapshot().is_synced());
        assert!(
            registry
                .snapshot()
                .resolve(OBJECT, Some("shop"), &meta(None, None), None)
                .is_ok()
        );
    }

    #[tokio::test]
    async fn waiting_for_sync_ends_when_both_lists_are_in() {
        let registry = TenantRegistry::new();
        let waiter = tokio::spawn({
            let registry = registry.clone();
            async move { registry.wait_until_synced().await }
        });
        registry.store_namespaces(HashMap::new());
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        registry.store_rules(RuleSet::default());
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("synced")
            .unwrap();
        // Already synced: returns at once.
        registry.wait_until_synced().await;
    }

    #[test]
    fn only_complete_lists_are_published() {
        use kube::runtime::watcher::Event;
        assert!(!shows_a_complete_list(&Event::<()>::Init));
        assert!(!shows_a_complete_list(&Event::InitApply(())));
        assert!(shows_a_complete_list(&Event::<()>::InitDone));
        assert!(shows_a_complete_list(&Event::Apply(())));
        assert!(shows_a_complete_list(&Event::Delete(())));
    }

    async fn eventually(registry: &TenantRegistry, check: impl Fn(&TenantSnapshot) -> bool) {
        for _ in 0..1000 {
            if check(&registry.snapshot()) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("never: {:?}", registry.snapshot());
    }

    /// The watch itself, against a mocked API server: the registry counts as synced only
    /// once both initial lists are in (the InitDone of each), and then holds what they
    /// listed.
    #[tokio::test]
    async fn the_watch_is_synced_only_after_both_initial_lists() {
        use kube::client::Body;
        let (service, mut handle) =
            tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        let client = kube::Client::new(service, "default");
        let recorder = kube::runtime::events::Recorder::new(
            client.clone(),
            kube::runtime::events::Reporter {
                controller: "test".into(),
                instance: None,
            },
        );
        let registry = TenantRegistry::new();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(watch(
            client,
            "bulkhead-system".into(),
            registry.clone(),
            recorder,
            shutdown.clone(),
        ));
        let list = |kind: &str, items: Value| {
            http::Response::builder()
                .body(Body::from(
                    serde_json::to_vec(&serde_json::json!({
                        "apiVersion": "v1", "kind": kind,
                        "metadata": {"resourceVersion": "7"}, "items": items
                    }))
                    .unwrap(),
                ))
                .unwrap()
        };
        // Both watchers list first; answer the namespaces, hold the ConfigMaps. (Requests
        // not taken from the handle simply wait, as a watch does.)
        let mut config_list = None;
        let mut namespace_list = None;
        while config_list.is_none() || namespace_list.is_none() {
            let (request, respond) =
                tokio::time::timeout(std::time::Duration::from_secs(10), handle.next_request())
                    .await
                    .expect("a list request in time")
                    .expect("a request");
            let query = request.uri().query().unwrap_or_default().to_string();
            if request.uri().path() == "/api/v1/namespaces/bulkhead-system/configmaps" {
                config_list = Some(respond);
            } else {
                assert_eq!(request.uri().path(), "/api/v1/namespaces");
                assert!(
                    query.contains("labelSelector=federation.example.com%2Ftenant"),
                    "{query}"
                );
                namespace_list = Some(respond);
            }
        }
        namespace_list.unwrap().send_response(list(
            "NamespaceList",
            serde_json::json!([{"metadata": {"name": "shop", "labels": {LABEL_TENANT: "team-a"}}}]),
        ));
        eventually(&registry, |s| s.namespaces_synced).await;
        let snapshot = registry.snapshot();
        assert!(!snapshot.is_synced(), "the rules are not listed yet");
        assert_eq!(snapshot.namespace_tenant("shop"), Some("team-a"));
        assert!(
            snapshot
                .resolve(
                    "MyDatabase shop/a",
                    Some("shop"),
                    &ObjectMeta::default(),
                    None
                )
                .unwrap_err()
                .contains("still syncing")
        );
        config_list.unwrap().send_response(list(
            "ConfigMapList",
            serde_json::json!([{"metadata": {"name": "team-a-rules", "namespace": "bulkhead-system",
                                              "labels": {LABEL_TENANT_POLICY: "team-a"}},
                               "data": {"policy.yaml": "maxReplicas: 2"}}]),
        ));
        eventually(&registry, TenantSnapshot::is_synced).await;
        let tenant = registry
            .snapshot()
            .resolve(
                "MyDatabase shop/a",
                Some("shop"),
                &ObjectMeta::default(),
                None,
            )
            .unwrap()
            .unwrap();
        assert_eq!(tenant.name, "team-a");
        assert_eq!(tenant.rules.max_replicas, Some(2));
        shutdown.cancel();
        task.await.unwrap();
    }
}
