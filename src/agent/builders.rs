//! The children of a MyDatabase, as pure functions of its spec and the read-only state.
//!
//! Read-only mode never touches the StatefulSet's pod template, so entering or leaving it
//! restarts no pod: it switches the read-write Service's selector to one no pod matches
//! and renders `default_transaction_read_only = on` in the ConfigMap.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, ExecAction,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PodSpec, PodTemplateSpec, Probe, Service,
    ServicePort, ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use crate::api::MyDatabase;

/// Label every pod, PVC and child of a database carries: its name.
pub const LABEL_DATABASE: &str = "example.com/database";
/// Label only a writable replica would carry. No pod carries it; the read-write Service
/// selects it while read-only, which leaves it without endpoints and restarts nothing.
pub const LABEL_ACCEPTS_WRITES: &str = "example.com/accepts-writes";
/// Default image repository; the tag is always `spec.version`.
pub const DEFAULT_IMAGE: &str = "postgres";
/// PostgreSQL's port.
pub const POSTGRES_PORT: i32 = 5432;

/// Why a database is read-only, if it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOnlyReason {
    /// `spec.readOnly` is true.
    Requested,
    /// The agent is fenced: the hub's lease went stale.
    HubUnreachable,
}

impl ReadOnlyReason {
    /// The condition reason.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadOnlyReason::Requested => "Requested",
            ReadOnlyReason::HubUnreachable => "HubUnreachable",
        }
    }
}

/// Whether `database` serves read-only: fencing wins the reason; `spec.readOnly` is never
/// cleared by unfencing.
pub fn read_only_reason(database: &MyDatabase, fenced: bool) -> Option<ReadOnlyReason> {
    if fenced {
        Some(ReadOnlyReason::HubUnreachable)
    } else if database.spec.read_only {
        Some(ReadOnlyReason::Requested)
    } else {
        None
    }
}

/// Names of a database's children.
pub fn headless_service_name(database: &str) -> String {
    format!("{database}-headless")
}
pub fn read_only_service_name(database: &str) -> String {
    format!("{database}-ro")
}
pub fn config_map_name(database: &str) -> String {
    format!("{database}-config")
}

/// Labels selecting the database's pods.
pub fn selector_labels(database: &MyDatabase) -> BTreeMap<String, String> {
    BTreeMap::from([(LABEL_DATABASE.to_string(), database.name_any())])
}

fn child_labels(database: &MyDatabase) -> BTreeMap<String, String> {
    let mut labels = selector_labels(database);
    labels.insert("app.kubernetes.io/name".into(), "postgresql".into());
    labels.insert("app.kubernetes.io/instance".into(), database.name_any());
    labels.insert(
        "app.kubernetes.io/managed-by".into(),
        "bulkhead-agent".into(),
    );
    labels
}

fn owner(database: &MyDatabase) -> OwnerReference {
    database
        .controller_owner_ref(&())
        .expect("a MyDatabase read from the API has a name and uid")
}

fn metadata(database: &MyDatabase, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: database.namespace(),
        labels: Some(child_labels(database)),
        owner_references: Some(vec![owner(database)]),
        ..Default::default()
    }
}

/// The image reference, `<repository>:<version>`.
pub fn image(database: &MyDatabase) -> String {
    let repository = database.spec.image.as_deref().unwrap_or(DEFAULT_IMAGE);
    format!("{repository}:{}", database.spec.version)
}

/// The StatefulSet running the database.
pub fn statefulset(database: &MyDatabase) -> StatefulSet {
    let name = database.name_any();
    let labels = child_labels(database);
    let container = Container {
        name: "postgres".into(),
        image: Some(image(database)),
        args: Some(vec![
            "-c".into(),
            "config_file=/etc/postgresql/postgresql.conf".into(),
        ]),
        env: Some(vec![EnvVar {
            name: "PGDATA".into(),
            value: Some("/var/lib/postgresql/data/pgdata".into()),
            ..Default::default()
        }]),
        ports: Some(vec![ContainerPort {
            name: Some("postgres".into()),
            container_port: POSTGRES_PORT,
            ..Default::default()
        }]),
        readiness_probe: Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec![
                    "pg_isready".into(),
                    "-h".into(),
                    "127.0.0.1".into(),
                    "-p".into(),
                    "5432".into(),
                ]),
            }),
            period_seconds: Some(5),
            timeout_seconds: Some(3),
            failure_threshold: Some(3),
            ..Default::default()
        }),
        resources: database.spec.resources.clone(),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "data".into(),
                mount_path: "/var/lib/postgresql/data".into(),
                ..Default::default()
            },
            VolumeMount {
                name: "config".into(),
                mount_path: "/etc/postgresql".into(),
                read_only: Some(true),
                ..Default::default()
            },
        ]),
        ..Default::default()
    };
    StatefulSet {
        metadata: metadata(database, name.clone()),
        spec: Some(StatefulSetSpec {
            replicas: Some(database.spec.replicas),
            service_name: Some(headless_service_name(&name)),
            selector: LabelSelector {
                match_labels: Some(selector_labels(database)),
                ..Default::default()
            },
            // Replicas start one after another, each Ready before the next.
            pod_management_policy: Some("OrderedReady".into()),
            revision_history_limit: Some(5),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                ..Default::default()
            }),
            // The StatefulSet never deletes a claim. whenDeleted: Delete would make the
            // claims owned by the StatefulSet, and the garbage collector would delete the
            // volumes whenever the MyDatabase goes, for any reason (the hub moving the copy
            // away included). Whether volumes are deleted is the finalizer's decision alone
            // (`spec.storage.reclaimPolicy` and who deleted the database; see
            // `volumes::reclaim_decision`). Scaling down keeps the data for a later scale-up.
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some("Retain".into()),
                    when_scaled: Some("Retain".into()),
                },
            ),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    volumes: Some(vec![Volume {
                        name: "config".into(),
                        config_map: Some(ConfigMapVolumeSource {
                            name: config_map_name(&name),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            },
            volume_claim_templates: Some(vec![PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some("data".into()),
                    labels: Some(selector_labels(database)),
                    ..Default::default()
                },
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    storage_class_name: database
                        .spec
                        .storage
                        .storage_class_name
                        .clone()
                        .filter(|c| !c.is_empty()),
                    resources: Some(VolumeResourceRequirements {
                        requests: Some(BTreeMap::from([(
                            "storage".to_string(),
                            Quantity(database.spec.storage.size.clone()),
                        )])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

fn service(
    database: &MyDatabase,
    name: String,
    selector: BTreeMap<String, String>,
    headless: bool,
) -> Service {
    Service {
        metadata: metadata(database, name),
        spec: Some(ServiceSpec {
            cluster_ip: headless.then(|| "None".to_string()),
            // The headless Service gives replicas stable DNS names while they start.
            publish_not_ready_addresses: headless.then_some(true),
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some("postgres".into()),
                port: POSTGRES_PORT,
                target_port: Some(IntOrString::String("postgres".into())),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The headless Service that names the StatefulSet's pods.
pub fn headless_service(database: &MyDatabase) -> Service {
    service(
        database,
        headless_service_name(&database.name_any()),
        selector_labels(database),
        true,
    )
}

/// The read-write Service `<name>`: every ready replica, or none while read-only.
pub fn read_write_service(database: &MyDatabase, read_only: Option<ReadOnlyReason>) -> Service {
    let mut selector = selector_labels(database);
    if read_only.is_some() {
        selector.insert(LABEL_ACCEPTS_WRITES.to_string(), "true".to_string());
    }
    service(database, database.name_any(), selector, false)
}

/// The read-only Service `<name>-ro`: every ready replica, always.
pub fn read_only_service(database: &MyDatabase) -> Service {
    service(
        database,
        read_only_service_name(&database.name_any()),
        selector_labels(database),
        false,
    )
}

/// The PostgreSQL settings rendered into the ConfigMap.
pub fn postgresql_conf(database: &MyDatabase, read_only: Option<ReadOnlyReason>) -> String {
    let mode = if read_only.is_some() { "on" } else { "off" };
    let reason = match read_only {
        Some(reason) => format!("read-only: {}", reason.as_str()),
        None => "read-write".to_string(),
    };
    format!(
        "# Managed by bulkhead-agent for MyDatabase {name}; edits are reverted.\n\
         # Mode: {reason}\n\
         listen_addresses = '*'\n\
         port = {port}\n\
         max_connections = 100\n\
         shared_buffers = 128MB\n\
         wal_level = replica\n\
         hot_standby = on\n\
         default_transaction_read_only = {mode}\n",
        name = database.name_any(),
        port = POSTGRES_PORT,
    )
}

/// The ConfigMap `<name>-config` holding `postgresql.conf`.
pub fn config_map(database: &MyDatabase, read_only: Option<ReadOnlyReason>) -> ConfigMap {
    ConfigMap {
        metadata: metadata(database, config_map_name(&database.name_any())),
        data: Some(BTreeMap::from([(
            "postgresql.conf".to_string(),
            postgresql_conf(database, read_only),
        )])),
        ..Default::default()
    }
}

/// The storage size an existing StatefulSet's claim template asks for.
pub fn claimed_storage(statefulset: &StatefulSet) -> Option<(String, Option<String>)> {
    let claim = statefulset
        .spec
        .as_ref()?
        .volume_claim_templates
        .as_ref()?
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some("data"))?;
    let spec = claim.spec.as_ref()?;
    let size = spec
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")?
        .0
        .clone();
    Some((size, spec.storage_class_name.clone()))
}

/// A refused storage change: what the StatefulSet has and what the spec asks for.
pub fn storage_change(database: &MyDatabase, existing: &StatefulSet) -> Option<String> {
    let (size, class) = claimed_storage(existing)?;
    let wanted_class = database
        .spec
        .storage
        .storage_class_name
        .clone()
        .filter(|c| !c.is_empty());
    let class_changed = wanted_class.is_some() && class != wanted_class;
    if size != database.spec.storage.size || class_changed {
        Some(format!(
            "spec.storage asks for {} ({}) but the volumes were created with {} ({}); StatefulSet volume claim templates cannot change, so the change is refused: create a new MyDatabase to resize or move the data",
            database.spec.storage.size,
            wanted_class.as_deref().unwrap_or("default class"),
            size,
            class.as_deref().unwrap_or("default class"),
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MyDatabaseSpec;

    fn database(spec: MyDatabaseSpec) -> MyDatabase {
        let mut database = MyDatabase::new("orders", spec);
        database.metadata.namespace = Some("shop".into());
        database.metadata.uid = Some("uid-1".into());
        database
    }

    fn orders() -> MyDatabase {
        database(MyDatabaseSpec {
            replicas: 3,
            version: "16".into(),
            ..Default::default()
        })
    }

    #[test]
    fn statefulset_matches_the_golden_expectation() {
        let sts = statefulset(&orders());
        let expected: serde_json::Value = serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": "orders",
                "namespace": "shop",
                "labels": {
                    "app.kubernetes.io/instance": "orders",
                    "app.kubernetes.io/managed-by": "bulkhead-agent",
                    "app.kubernetes.io/name": "postgresql",
                    "example.com/database": "orders"
                },
                "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "MyDatabase", "name": "orders", "uid": "uid-1", "controller": true}]
            },
            "spec": {
                "replicas": 3,
                "serviceName": "orders-headless",
                "podManagementPolicy": "OrderedReady",
                "revisionHistoryLimit": 5,
                "updateStrategy": {"type": "RollingUpdate"},
                "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
                "selector": {"matchLabels": {"example.com/database": "orders"}},
                "template": {
                    "metadata": {"labels": {
                        "app.kubernetes.io/instance": "orders",
                        "app.kubernetes.io/managed-by": "bulkhead-agent",
                        "app.kubernetes.io/name": "postgresql",
                        "example.com/database": "orders"
                    }},
                    "spec": {
                        "containers": [{
                            "name": "postgres",
                            "image": "postgres:16",
                            "args": ["-c", "config_file=/etc/postgresql/postgresql.conf"],
                            "env": [{"name": "PGDATA", "value": "/var/lib/postgresql/data/pgdata"}],
                            "ports": [{"name": "postgres", "containerPort": 5432}],
                            "readinessProbe": {
                                "exec": {"command": ["pg_isready", "-h", "127.0.0.1", "-p", "5432"]},
                                "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3
                            },
                            "volumeMounts": [
                                {"name": "data", "mountPath": "/var/lib/postgresql/data"},
                                {"name": "config", "mountPath": "/etc/postgresql", "readOnly": true}
                            ]
                        }],
                        "volumes": [{"name": "config", "configMap": {"name": "orders-config"}}]
                    }
                },
                "volumeClaimTemplates": [{
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "data", "labels": {"example.com/database": "orders"}},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
                }]
            }
        });
        assert_eq!(serde_json::to_value(&sts).unwrap(), expected);
    }

    /// The StatefulSet controller labels each claim it creates with the claim template's
    /// labels plus the selector's matchLabels: both must name the database, because the
    /// finalizer and the reuse step find the claims by `example.com/database=<name>`.
    #[test]
    fn claims_created_from_the_template_carry_the_database_label() {
        let sts = statefulset(&orders());
        let spec = sts.spec.unwrap();
        let template = &spec.volume_claim_templates.as_ref().unwrap()[0];
        assert_eq!(template.metadata.name.as_deref(), Some("data"));
        let template_labels = template.metadata.labels.as_ref().unwrap();
        assert_eq!(
            template_labels.get(LABEL_DATABASE).map(String::as_str),
            Some("orders")
        );
        let selector = spec.selector.match_labels.as_ref().unwrap();
        assert_eq!(
            selector.get(LABEL_DATABASE).map(String::as_str),
            Some("orders")
        );
    }

    #[test]
    fn the_statefulset_never_deletes_a_claim() {
        let mut db = orders();
        db.spec.storage.reclaim_policy = crate::api::mydatabase::ReclaimPolicy::Delete;
        let policy = statefulset(&db)
            .spec
            .unwrap()
            .persistent_volume_claim_retention_policy
            .unwrap();
        assert_eq!(policy.when_deleted.as_deref(), Some("Retain"));
        assert_eq!(policy.when_scaled.as_deref(), Some("Retain"));
    }

    #[test]
    fn image_repository_and_class_overrides() {
        let db = database(MyDatabaseSpec {
            image: Some("registry.local/postgres".into()),
            version: "15".into(),
            storage: crate::api::mydatabase::DatabaseStorage {
                size: "5Gi".into(),
                storage_class_name: Some("fast".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        let sts = statefulset(&db);
        let spec = sts.spec.unwrap();
        assert_eq!(
            spec.template.spec.unwrap().containers[0].image.as_deref(),
            Some("registry.local/postgres:15")
        );
        let claim = &spec.volume_claim_templates.unwrap()[0];
        let claim_spec = claim.spec.as_ref().unwrap();
        assert_eq!(claim_spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(
            claim_spec
                .resources
                .as_ref()
                .unwrap()
                .requests
                .as_ref()
                .unwrap()["storage"]
                .0,
            "5Gi"
        );
    }

    #[test]
    fn services_select_the_database_pods() {
        let db = orders();
        let headless = headless_service(&db);
        assert_eq!(headless.metadata.name.as_deref(), Some("orders-headless"));
        assert_eq!(
            headless.spec.as_ref().unwrap().cluster_ip.as_deref(),
            Some("None")
        );
        let rw = read_write_service(&db, None);
        assert_eq!(rw.metadata.name.as_deref(), Some("orders"));
        assert_eq!(
            rw.spec.as_ref().unwrap().selector.as_ref().unwrap(),
            &selector_labels(&db)
        );
        let ro = read_only_service(&db);
        assert_eq!(ro.metadata.name.as_deref(), Some("orders-ro"));
        assert_eq!(
            ro.spec.as_ref().unwrap().selector.as_ref().unwrap(),
            &selector_labels(&db)
        );
        assert_eq!(
            ro.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port,
            5432
        );
    }

    #[test]
    fn read_only_empties_the_read_write_service_and_changes_no_pod_template() {
        let db = orders();
        let rw = read_write_service(&db, Some(ReadOnlyReason::HubUnreachable));
        let selector = rw.spec.unwrap().selector.unwrap();
        assert_eq!(
            selector.get(LABEL_ACCEPTS_WRITES).map(String::as_str),
            Some("true")
        );
        // No pod carries the label, so the selector matches nothing...
        let pod_labels = statefulset(&db)
            .spec
            .unwrap()
            .template
            .metadata
            .unwrap()
            .labels
            .unwrap();
        assert!(!pod_labels.contains_key(LABEL_ACCEPTS_WRITES));
        // ...and the StatefulSet does not depend on read-only at all (no pod restarts).
        let mut read_only_spec = db.clone();
        read_only_spec.spec.read_only = true;
        assert_eq!(statefulset(&db), statefulset(&read_only_spec));
        // The read-only Service keeps selecting every replica.
        assert_eq!(read_only_service(&read_only_spec), read_only_service(&db));
    }

    #[test]
    fn config_map_renders_the_transaction_mode() {
        let db = orders();
        let writable = config_map(&db, None).data.unwrap()["postgresql.conf"].clone();
        assert!(
            writable.contains("default_transaction_read_only = off\n"),
            "{writable}"
        );
        let fenced = config_map(&db, Some(ReadOnlyReason::HubUnreachable))
            .data
            .unwrap()["postgresql.conf"]
            .clone();
        assert!(
            fenced.contains("default_transaction_read_only = on\n"),
            "{fenced}"
        );
        assert!(fenced.contains("read-only: HubUnreachable"));
        assert_eq!(
            config_map(&db, None).metadata.name.as_deref(),
            Some("orders-config")
        );
    }

    #[test]
    fn fencing_adds_to_read_only_and_never_clears_it() {
        let mut db = orders();
        assert_eq!(read_only_reason(&db, false), None);
        assert_eq!(
            read_only_reason(&db, true),
            Some(ReadOnlyReason::HubUnreachable)
        );
        db.spec.read_only = true;
        assert_eq!(
            read_only_reason(&db, false),
            Some(ReadOnlyReason::Requested)
        );
        assert_eq!(
            read_only_reason(&db, true),
            Some(ReadOnlyReason::HubUnreachable)
        );
    }

    #[test]
    fn storage_change_is_detected_against_the_existing_claim_template() {
        let db = orders();
        let existing = statefulset(&db);
        assert_eq!(storage_change(&db, &existing), None);
        let mut bigger = db.clone();
        bigger.spec.storage.size = "2Gi".into();
        let message = storage_change(&bigger, &existing).unwrap();
        assert!(
            message.contains("2Gi")
                && message.contains("1Gi")
                && message.contains("create a new MyDatabase"),
            "{message}"
        );
    }
}
