//! The children of a MyDatabase, as pure functions of its spec and the read-only state.
//!
//! Each pod runs `bulkhead instance` (copied from the agent's image by an init container)
//! as the database container's entrypoint: it owns PostgreSQL and takes its role
//! (primary or hot standby) from the agent (`instances.rs`). The agent labels each pod
//! with its role; the Services select by that label. Read-only mode never touches the
//! StatefulSet's pod template, so entering or leaving it restarts no pod: the read-write
//! Services switch to a selector no pod matches at once, and the agent demotes the
//! primary (the server itself then refuses writes).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, Secret, SecretVolumeSource, SecurityContext, Service,
    ServicePort, ServiceSpec, Toleration, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use crate::api::MyDatabase;
use crate::api::instance::{INSTANCE_PORT, Role};

/// Label every pod, PVC and child of a database carries: its name.
pub const LABEL_DATABASE: &str = "example.com/database";
/// Label only a writable replica would carry. No pod carries it; the read-write Services
/// select it while read-only, which leaves them without endpoints at once (before the
/// primary is demoted) and restarts nothing.
pub const LABEL_ACCEPTS_WRITES: &str = "example.com/accepts-writes";
/// The role the agent gave a pod: `primary` or `standby` (set by the agent on the pod).
pub const LABEL_ROLE: &str = "example.com/role";
/// Default image repository; the tag is always `spec.version`.
pub const DEFAULT_IMAGE: &str = "postgres";
/// PostgreSQL's port.
pub const POSTGRES_PORT: i32 = 5432;
/// The user id PostgreSQL runs as in the `postgres` images.
pub const POSTGRES_UID: i64 = 999;
/// Where the init container puts the `bulkhead` binary for the database container.
pub const CONTROLLER_DIR: &str = "/controller";
/// Where the instance Secret is mounted.
pub const INSTANCE_SECRET_DIR: &str = "/etc/bulkhead/instance";
/// Where the application Secret is mounted.
pub const APP_SECRET_DIR: &str = "/etc/bulkhead/app";
/// The data volume's mount path and the data directory in it.
pub const DATA_MOUNT: &str = "/var/lib/postgresql/data";
pub const PGDATA: &str = "/var/lib/postgresql/data/pgdata";
/// The application user and database every MyDatabase gets (in the `<name>-app` Secret).
pub const APP_USER: &str = "app";
pub const APP_DATABASE: &str = "app";

/// Why a database is read-only, if it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOnlyReason {
    /// `spec.readOnly` is true.
    Requested,
    /// The agent is fenced: the hub's lease went stale.
    HubUnreachable,
    /// `spec.topology.replicaOf`: a replica cluster streams another cluster's primary.
    ReplicaCluster,
    /// A switchover or a disaster promotion raised the federation's primary term past
    /// the one this copy was written under (the hub's Lease says so): another cluster
    /// holds, or is about to hold, the primary.
    Deposed,
}

impl ReadOnlyReason {
    /// The condition reason.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadOnlyReason::Requested => "Requested",
            ReadOnlyReason::HubUnreachable => "HubUnreachable",
            ReadOnlyReason::ReplicaCluster => crate::api::mydatabase::REASON_REPLICA_CLUSTER,
            ReadOnlyReason::Deposed => "Deposed",
        }
    }

    /// In words, for the instances' status.
    pub fn words(self) -> &'static str {
        match self {
            ReadOnlyReason::Requested => "spec.readOnly is true",
            ReadOnlyReason::HubUnreachable => "the hub's lease is stale",
            ReadOnlyReason::ReplicaCluster => "a replica cluster of another cluster's primary",
            ReadOnlyReason::Deposed => {
                "the hub raised the primary term past the one this copy was written under (a switchover or bulkhead promote moved the primary); read-only until the hub writes this copy anew"
            }
        }
    }

    /// Whether no instance may be primary for this reason (a replica cluster has none to
    /// fence: its designated primary streams on).
    pub fn fences(self) -> bool {
        self != ReadOnlyReason::ReplicaCluster
    }
}

/// The federation's primary term of each database (`namespace/name`) whose term a
/// switchover or a disaster promotion raised, as the hub's Lease in this cluster last said.
pub type PrimaryTerms = std::collections::BTreeMap<String, u64>;

/// The primary term a copy was written under (annotation
/// `federation.example.com/primary-term`; absent: 1).
pub fn copy_term(database: &MyDatabase) -> u64 {
    database
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::api::ANNOTATION_PRIMARY_TERM))
        .and_then(|t| t.parse().ok())
        .unwrap_or(1)
}

/// Whether `database` serves read-only: fencing wins the reason; `spec.readOnly` is never
/// cleared by unfencing; a replica cluster is read-only for as long as it is one; a copy
/// written under a lower primary term than `terms` has for it is deposed.
pub fn read_only_reason(
    database: &MyDatabase,
    fenced: bool,
    terms: &PrimaryTerms,
) -> Option<ReadOnlyReason> {
    let key = format!(
        "{}/{}",
        database.metadata.namespace.as_deref().unwrap_or_default(),
        database.metadata.name.as_deref().unwrap_or_default()
    );
    let deposed = terms
        .get(&key)
        .is_some_and(|term| *term > copy_term(database));
    if fenced {
        Some(ReadOnlyReason::HubUnreachable)
    } else if deposed {
        Some(ReadOnlyReason::Deposed)
    } else if database.spec.read_only {
        Some(ReadOnlyReason::Requested)
    } else if replica_source(database).is_some() {
        Some(ReadOnlyReason::ReplicaCluster)
    } else {
        None
    }
}

/// Where a replica cluster's designated primary streams from (`spec.topology.replicaOf`).
pub fn replica_source(database: &MyDatabase) -> Option<crate::api::instance::Upstream> {
    let source = database.spec.topology.as_ref()?.replica_of.as_ref()?;
    Some(crate::api::instance::Upstream {
        host: source.host.clone(),
        port: u16::try_from(source.port).ok()?,
        external: true,
    })
}

/// Names of a database's children.
/// The StatefulSet's replicas: `spec.replicas`, except while a scale-down would remove the
/// recorded primary's pod: then up to that pod, until the instance loop has switched the
/// primary over to an instance that stays (`roles`).
pub fn statefulset_replicas(database: &MyDatabase) -> i32 {
    let wanted = database.spec.replicas;
    match recorded_primary_ordinal(database) {
        Some(ordinal) if wanted > 0 && ordinal >= wanted => ordinal + 1,
        _ => wanted,
    }
}

/// The ordinal of the pod `status.primary` names.
fn recorded_primary_ordinal(database: &MyDatabase) -> Option<i32> {
    let primary = database.status.as_ref()?.primary.as_deref()?;
    let ordinal = primary.strip_prefix(&format!("{}-", database.name_any()))?;
    ordinal.parse().ok()
}

pub fn headless_service_name(database: &str) -> String {
    format!("{database}-headless")
}
pub fn read_write_service_name(database: &str) -> String {
    format!("{database}-rw")
}
pub fn read_only_service_name(database: &str) -> String {
    format!("{database}-ro")
}
pub fn any_instance_service_name(database: &str) -> String {
    format!("{database}-r")
}
/// The ConfigMap older agents rendered (`default_transaction_read_only`); deleted now.
pub fn legacy_config_map_name(database: &str) -> String {
    format!("{database}-config")
}
/// Passwords of `postgres` and `streaming_replica`, and the token only the agent and the
/// instances know.
pub fn instance_secret_name(database: &str) -> String {
    format!("{database}-instance")
}
/// The lease a database pod's instance manager was started with (`--agent-lease=` in its
/// container's command or arguments): a pod created before the agent's flag changed
/// keeps its own until it is replaced, and its primary demotes itself by that one.
pub fn pod_agent_lease(pod: &k8s_openapi::api::core::v1::Pod) -> Option<std::time::Duration> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.command.iter().flatten().chain(c.args.iter().flatten()))
        .find_map(|arg| arg.strip_prefix("--agent-lease="))
        .and_then(|value| crate::hub::parse_duration(value).ok())
}

/// The application's credentials, as CloudNativePG names them.
pub fn app_secret_name(database: &str) -> String {
    format!("{database}-app")
}

/// Labels selecting the database's pods.
pub fn selector_labels(database: &MyDatabase) -> BTreeMap<String, String> {
    BTreeMap::from([(LABEL_DATABASE.to_string(), database.name_any())])
}

/// The label value of a role.
pub fn role_label(role: Role) -> &'static str {
    match role {
        Role::Primary => "primary",
        Role::Standby => "standby",
    }
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

/// What the agent's own settings put into every database pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSettings {
    /// The image holding the `bulkhead` binary (the agent's own image), copied into each
    /// database pod by an init container.
    pub instance_image: String,
    /// A primary whose agent has been silent this long demotes itself: the agent's lease.
    pub agent_lease_seconds: f64,
    /// Node labels database pods must run on (dedicated database nodes).
    pub node_selector: BTreeMap<String, String>,
    /// Taint keys database pods tolerate.
    pub tolerations: Vec<String>,
}

impl Default for PodSettings {
    fn default() -> Self {
        PodSettings {
            instance_image: crate::api::DEFAULT_IMAGE.to_string(),
            agent_lease_seconds: 10.0,
            node_selector: BTreeMap::new(),
            tolerations: vec![],
        }
    }
}

fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("instance".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(2),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

fn secret_volume(name: &str, secret: String) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret),
            // Readable by PostgreSQL's group (fsGroup) only.
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The StatefulSet running the database.
pub fn statefulset(database: &MyDatabase, settings: &PodSettings) -> StatefulSet {
    let name = database.name_any();
    let labels = child_labels(database);
    let binary = format!("{CONTROLLER_DIR}/bulkhead");
    let bootstrap = Container {
        name: "bootstrap".into(),
        image: Some(settings.instance_image.clone()),
        command: Some(vec![
            "bulkhead".into(),
            "copy-binary".into(),
            binary.clone(),
        ]),
        volume_mounts: Some(vec![mount("controller", CONTROLLER_DIR, false)]),
        security_context: Some(container_security()),
        ..Default::default()
    };
    let container = Container {
        name: "postgres".into(),
        image: Some(image(database)),
        command: Some(vec![
            binary,
            "instance".into(),
            format!("--pgdata={PGDATA}"),
            format!("--secrets-dir={INSTANCE_SECRET_DIR}"),
            format!("--app-secret-dir={APP_SECRET_DIR}"),
            format!("--socket-dir={CONTROLLER_DIR}/run"),
            format!("--port={POSTGRES_PORT}"),
            format!("--api-address=0.0.0.0:{INSTANCE_PORT}"),
            format!("--agent-lease={}s", settings.agent_lease_seconds),
        ]),
        env: Some(vec![EnvVar {
            name: "POD_NAME".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.name".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ports: Some(vec![
            ContainerPort {
                name: Some("postgres".into()),
                container_port: POSTGRES_PORT,
                ..Default::default()
            },
            ContainerPort {
                name: Some("instance".into()),
                container_port: i32::from(INSTANCE_PORT),
                ..Default::default()
            },
        ]),
        // Ready: PostgreSQL accepts connections (as primary or standby).
        readiness_probe: Some(http_probe("/readyz", 2, 3)),
        // The instance manager answers; PostgreSQL's own restarts are its business.
        liveness_probe: Some(http_probe("/healthz", 10, 6)),
        resources: database.spec.resources.clone(),
        security_context: Some(container_security()),
        volume_mounts: Some(vec![
            mount("data", DATA_MOUNT, false),
            mount("controller", CONTROLLER_DIR, false),
            mount("instance-secret", INSTANCE_SECRET_DIR, true),
            mount("app-secret", APP_SECRET_DIR, true),
        ]),
        ..Default::default()
    };
    StatefulSet {
        metadata: metadata(database, name.clone()),
        spec: Some(StatefulSetSpec {
            replicas: Some(statefulset_replicas(database)),
            service_name: Some(headless_service_name(&name)),
            selector: LabelSelector {
                match_labels: Some(selector_labels(database)),
                ..Default::default()
            },
            // Replicas start one after another, each Ready before the next: a standby's
            // base backup needs a running primary.
            pod_management_policy: Some("OrderedReady".into()),
            revision_history_limit: Some(5),
            // The agent replaces the pods of a new template itself, standbys first and
            // the primary after a switchover (`upgrade::next`): the StatefulSet's own
            // rolling update goes by ordinal and would restart the primary whenever its
            // turn came.
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".into()),
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
                    init_containers: Some(vec![bootstrap]),
                    containers: vec![container],
                    security_context: Some(PodSecurityContext {
                        fs_group: Some(POSTGRES_UID),
                        run_as_non_root: Some(true),
                        seccomp_profile: Some(k8s_openapi::api::core::v1::SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    // A fast shutdown of PostgreSQL fits well inside this.
                    termination_grace_period_seconds: Some(30),
                    node_selector: (!settings.node_selector.is_empty())
                        .then(|| settings.node_selector.clone()),
                    tolerations: (!settings.tolerations.is_empty()).then(|| {
                        settings
                            .tolerations
                            .iter()
                            .map(|key| Toleration {
                                key: Some(key.clone()),
                                operator: Some("Exists".into()),
                                ..Default::default()
                            })
                            .collect()
                    }),
                    volumes: Some(vec![
                        Volume {
                            name: "controller".into(),
                            empty_dir: Some(EmptyDirVolumeSource::default()),
                            ..Default::default()
                        },
                        secret_volume("instance-secret", instance_secret_name(&name)),
                        secret_volume("app-secret", app_secret_name(&name)),
                    ]),
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

/// The `restricted` Pod Security level's container settings, as PostgreSQL's user.
fn container_security() -> SecurityContext {
    SecurityContext {
        run_as_user: Some(POSTGRES_UID),
        run_as_group: Some(POSTGRES_UID),
        run_as_non_root: Some(true),
        allow_privilege_escalation: Some(false),
        capabilities: Some(k8s_openapi::api::core::v1::Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        ..Default::default()
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

/// The read-write Services, `<name>-rw` and `<name>` (kept for clients of older
/// versions): the primary only, and none while read-only.
pub fn read_write_services(
    database: &MyDatabase,
    read_only: Option<ReadOnlyReason>,
) -> [Service; 2] {
    let mut selector = selector_labels(database);
    selector.insert(LABEL_ROLE.into(), role_label(Role::Primary).into());
    if read_only.is_some() {
        selector.insert(LABEL_ACCEPTS_WRITES.to_string(), "true".to_string());
    }
    let name = database.name_any();
    [
        service(
            database,
            read_write_service_name(&name),
            selector.clone(),
            false,
        ),
        service(database, name, selector, false),
    ]
}

/// The read-only Service `<name>-ro`: the standbys (a fenced database's every instance).
pub fn read_only_service(database: &MyDatabase) -> Service {
    let mut selector = selector_labels(database);
    selector.insert(LABEL_ROLE.into(), role_label(Role::Standby).into());
    service(
        database,
        read_only_service_name(&database.name_any()),
        selector,
        false,
    )
}

/// `<name>-r`: any ready instance, for reads that may go to the primary too.
pub fn any_instance_service(database: &MyDatabase) -> Service {
    service(
        database,
        any_instance_service_name(&database.name_any()),
        selector_labels(database),
        false,
    )
}

/// A random password or token: 32 URL-safe characters.
pub fn random_secret() -> String {
    use base64::Engine;
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn secret(database: &MyDatabase, name: String, data: BTreeMap<String, String>) -> Secret {
    Secret {
        metadata: metadata(database, name),
        type_: Some("Opaque".into()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// The instance Secret, made once with new random values (the agent never overwrites an
/// existing one: the data directories hold these passwords).
pub fn instance_secret(database: &MyDatabase) -> Secret {
    secret(
        database,
        instance_secret_name(&database.name_any()),
        BTreeMap::from([
            ("superuser-password".into(), random_secret()),
            ("replication-password".into(), random_secret()),
            ("token".into(), random_secret()),
        ]),
    )
}

/// The application Secret `<name>-app` (keys `username`, `password`, `dbname`, `host`,
/// `port`, `uri`), made once: `host` is the read-write Service.
pub fn app_secret(database: &MyDatabase) -> Secret {
    let name = database.name_any();
    let namespace = database.namespace().unwrap_or_default();
    let password = random_secret();
    let host = format!("{}.{namespace}.svc", read_write_service_name(&name));
    secret(
        database,
        app_secret_name(&name),
        BTreeMap::from([
            ("username".into(), APP_USER.into()),
            ("password".into(), password.clone()),
            ("dbname".into(), APP_DATABASE.into()),
            ("host".into(), host.clone()),
            ("port".into(), POSTGRES_PORT.to_string()),
            (
                "uri".into(),
                format!("postgresql://{APP_USER}:{password}@{host}:{POSTGRES_PORT}/{APP_DATABASE}"),
            ),
        ]),
    )
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

    fn settings() -> PodSettings {
        PodSettings {
            instance_image: "registry.local/bulkhead:1.2.3".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_scale_down_keeps_the_primary_s_pod_until_it_is_switched_over() {
        let mut db = orders();
        db.spec.replicas = 1;
        assert_eq!(statefulset_replicas(&db), 1, "no primary recorded yet");
        db.status = Some(crate::api::MyDatabaseStatus {
            primary: Some("orders-2".into()),
            term: 2,
            ..Default::default()
        });
        assert_eq!(statefulset_replicas(&db), 3, "orders-2 stays");
        assert_eq!(
            statefulset(&db, &settings()).spec.unwrap().replicas,
            Some(3)
        );
        db.status.as_mut().unwrap().primary = Some("orders-0".into());
        assert_eq!(statefulset_replicas(&db), 1, "switched over: the pods go");
        db.spec.replicas = 0;
        db.status.as_mut().unwrap().primary = Some("orders-2".into());
        assert_eq!(
            statefulset_replicas(&db),
            0,
            "scaled to zero: every pod stops"
        );
    }

    #[test]
    fn a_pods_own_agent_lease_is_read_from_its_command() {
        let db = orders();
        let template = statefulset(
            &db,
            &PodSettings {
                agent_lease_seconds: 30.0,
                ..Default::default()
            },
        )
        .spec
        .unwrap()
        .template;
        let pod = k8s_openapi::api::core::v1::Pod {
            spec: template.spec,
            ..Default::default()
        };
        assert_eq!(
            pod_agent_lease(&pod),
            Some(std::time::Duration::from_secs(30))
        );
        assert_eq!(pod_agent_lease(&Default::default()), None);
    }

    #[test]
    fn statefulset_matches_the_golden_expectation() {
        let sts = statefulset(&orders(), &settings());
        let labels = serde_json::json!({
            "app.kubernetes.io/instance": "orders",
            "app.kubernetes.io/managed-by": "bulkhead-agent",
            "app.kubernetes.io/name": "postgresql",
            "example.com/database": "orders"
        });
        let security = serde_json::json!({
            "runAsUser": 999, "runAsGroup": 999, "runAsNonRoot": true,
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}
        });
        let expected: serde_json::Value = serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": "orders",
                "namespace": "shop",
                "labels": labels,
                "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "MyDatabase", "name": "orders", "uid": "uid-1", "controller": true}]
            },
            "spec": {
                "replicas": 3,
                "serviceName": "orders-headless",
                "podManagementPolicy": "OrderedReady",
                "revisionHistoryLimit": 5,
                "updateStrategy": {"type": "OnDelete"},
                "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
                "selector": {"matchLabels": {"example.com/database": "orders"}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "initContainers": [{
                            "name": "bootstrap",
                            "image": "registry.local/bulkhead:1.2.3",
                            "command": ["bulkhead", "copy-binary", "/controller/bulkhead"],
                            "securityContext": security,
                            "volumeMounts": [{"name": "controller", "mountPath": "/controller"}]
                        }],
                        "containers": [{
                            "name": "postgres",
                            "image": "postgres:16",
                            "command": [
                                "/controller/bulkhead", "instance",
                                "--pgdata=/var/lib/postgresql/data/pgdata",
                                "--secrets-dir=/etc/bulkhead/instance",
                                "--app-secret-dir=/etc/bulkhead/app",
                                "--socket-dir=/controller/run",
                                "--port=5432",
                                "--api-address=0.0.0.0:8000",
                                "--agent-lease=10s"
                            ],
                            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                            "ports": [
                                {"name": "postgres", "containerPort": 5432},
                                {"name": "instance", "containerPort": 8000}
                            ],
                            "readinessProbe": {
                                "httpGet": {"path": "/readyz", "port": "instance"},
                                "periodSeconds": 2, "timeoutSeconds": 2, "failureThreshold": 3
                            },
                            "livenessProbe": {
                                "httpGet": {"path": "/healthz", "port": "instance"},
                                "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 6
                            },
                            "securityContext": security,
                            "volumeMounts": [
                                {"name": "data", "mountPath": "/var/lib/postgresql/data"},
                                {"name": "controller", "mountPath": "/controller"},
                                {"name": "instance-secret", "mountPath": "/etc/bulkhead/instance", "readOnly": true},
                                {"name": "app-secret", "mountPath": "/etc/bulkhead/app", "readOnly": true}
                            ]
                        }],
                        "securityContext": {"fsGroup": 999, "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                        "terminationGracePeriodSeconds": 30,
                        "volumes": [
                            {"name": "controller", "emptyDir": {}},
                            {"name": "instance-secret", "secret": {"secretName": "orders-instance", "defaultMode": 288}},
                            {"name": "app-secret", "secret": {"secretName": "orders-app", "defaultMode": 288}}
                        ]
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
        let sts = statefulset(&orders(), &settings());
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
        let policy = statefulset(&db, &settings())
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
        let sts = statefulset(&db, &settings());
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

    fn selector(service: &Service) -> BTreeMap<String, String> {
        service.spec.as_ref().unwrap().selector.clone().unwrap()
    }

    #[test]
    fn services_select_by_the_role_the_agent_labels_each_pod_with() {
        let db = orders();
        let headless = headless_service(&db);
        assert_eq!(headless.metadata.name.as_deref(), Some("orders-headless"));
        assert_eq!(
            headless.spec.as_ref().unwrap().cluster_ip.as_deref(),
            Some("None")
        );
        let primary = BTreeMap::from([
            (LABEL_DATABASE.to_string(), "orders".to_string()),
            (LABEL_ROLE.to_string(), "primary".to_string()),
        ]);
        let [rw, legacy] = read_write_services(&db, None);
        assert_eq!(rw.metadata.name.as_deref(), Some("orders-rw"));
        assert_eq!(selector(&rw), primary);
        assert_eq!(
            legacy.metadata.name.as_deref(),
            Some("orders"),
            "`<name>` keeps working as the read-write Service"
        );
        assert_eq!(selector(&legacy), primary);
        let ro = read_only_service(&db);
        assert_eq!(ro.metadata.name.as_deref(), Some("orders-ro"));
        assert_eq!(selector(&ro)[LABEL_ROLE], "standby");
        let any = any_instance_service(&db);
        assert_eq!(any.metadata.name.as_deref(), Some("orders-r"));
        assert_eq!(selector(&any), selector_labels(&db));
        assert_eq!(
            ro.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port,
            5432
        );
    }

    #[test]
    fn read_only_empties_the_read_write_services_and_changes_no_pod_template() {
        let db = orders();
        for rw in read_write_services(&db, Some(ReadOnlyReason::HubUnreachable)) {
            assert_eq!(
                selector(&rw).get(LABEL_ACCEPTS_WRITES).map(String::as_str),
                Some("true"),
                "{:?}",
                rw.metadata.name
            );
        }
        // No pod carries the label, so the selector matches nothing...
        let pod_labels = statefulset(&db, &settings())
            .spec
            .unwrap()
            .template
            .metadata
            .unwrap()
            .labels
            .unwrap();
        assert!(!pod_labels.contains_key(LABEL_ACCEPTS_WRITES));
        assert!(
            !pod_labels.contains_key(LABEL_ROLE),
            "the role is the agent's label on each pod, never the template's"
        );
        // ...and the StatefulSet does not depend on read-only at all (no pod restarts).
        let mut read_only_spec = db.clone();
        read_only_spec.spec.read_only = true;
        assert_eq!(
            statefulset(&db, &settings()),
            statefulset(&read_only_spec, &settings())
        );
        assert_eq!(read_only_service(&read_only_spec), read_only_service(&db));
    }

    fn secret_data(secret: &Secret) -> BTreeMap<String, String> {
        secret
            .data
            .clone()
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
            .collect()
    }

    #[test]
    fn the_secrets_hold_fresh_random_credentials_and_the_app_uri_names_the_rw_service() {
        let db = orders();
        let instance = secret_data(&instance_secret(&db));
        assert_eq!(
            instance.keys().collect::<Vec<_>>(),
            ["replication-password", "superuser-password", "token"]
        );
        assert_ne!(instance["token"], instance["superuser-password"]);
        assert_eq!(instance["token"].len(), 32);
        assert_ne!(
            secret_data(&instance_secret(&db))["token"],
            instance["token"],
            "each Secret made is new"
        );
        let app = secret_data(&app_secret(&db));
        assert_eq!(app["username"], "app");
        assert_eq!(app["dbname"], "app");
        assert_eq!(app["host"], "orders-rw.shop.svc");
        assert_eq!(app["port"], "5432");
        assert_eq!(
            app["uri"],
            format!(
                "postgresql://app:{}@orders-rw.shop.svc:5432/app",
                app["password"]
            )
        );
        assert_eq!(app_secret(&db).metadata.name.as_deref(), Some("orders-app"));
    }

    #[test]
    fn a_replica_cluster_is_read_only_and_its_read_write_services_have_no_endpoints() {
        let mut db = orders();
        db.spec.topology = Some(crate::api::mydatabase::DatabaseTopology {
            replica_of: Some(crate::api::mydatabase::ReplicaSource {
                host: "10.201.101.4".into(),
                port: 5432,
            }),
            ..Default::default()
        });
        let reason = read_only_reason(&db, false, &PrimaryTerms::new());
        assert_eq!(reason, Some(ReadOnlyReason::ReplicaCluster));
        assert!(!ReadOnlyReason::ReplicaCluster.fences());
        assert_eq!(
            read_only_reason(&db, true, &PrimaryTerms::new()),
            Some(ReadOnlyReason::HubUnreachable),
            "a fence still says so"
        );
        assert_eq!(
            read_write_services(&db, reason),
            read_write_services(&db, Some(ReadOnlyReason::Requested))
        );
        assert_eq!(
            replica_source(&db).map(|u| (u.host, u.port, u.external)),
            Some(("10.201.101.4".into(), 5432, true))
        );
    }

    /// A copy written under a lower primary term than the hub's Lease carries for it
    /// takes no write, fenced or not; written anew under that term it follows its spec.
    #[test]
    fn a_copy_under_a_lower_primary_term_is_deposed() {
        let mut db = orders();
        db.metadata.namespace = Some("shop".into());
        let terms = PrimaryTerms::from([("shop/orders".to_string(), 2)]);
        assert_eq!(
            read_only_reason(&db, false, &terms),
            Some(ReadOnlyReason::Deposed)
        );
        assert!(ReadOnlyReason::Deposed.fences());
        let other = PrimaryTerms::from([("shop/ledger".to_string(), 2)]);
        assert_eq!(read_only_reason(&db, false, &other), None);
        db.metadata.annotations = Some(
            [(
                crate::api::ANNOTATION_PRIMARY_TERM.to_string(),
                "2".to_string(),
            )]
            .into(),
        );
        assert_eq!(read_only_reason(&db, false, &terms), None);
        assert_eq!(
            read_only_reason(&db, true, &terms),
            Some(ReadOnlyReason::HubUnreachable)
        );
    }

    #[test]
    fn fencing_adds_to_read_only_and_never_clears_it() {
        let mut db = orders();
        assert_eq!(read_only_reason(&db, false, &PrimaryTerms::new()), None);
        assert_eq!(
            read_only_reason(&db, true, &PrimaryTerms::new()),
            Some(ReadOnlyReason::HubUnreachable)
        );
        db.spec.read_only = true;
        assert_eq!(
            read_only_reason(&db, false, &PrimaryTerms::new()),
            Some(ReadOnlyReason::Requested)
        );
        assert_eq!(
            read_only_reason(&db, true, &PrimaryTerms::new()),
            Some(ReadOnlyReason::HubUnreachable)
        );
    }

    #[test]
    fn storage_change_is_detected_against_the_existing_claim_template() {
        let db = orders();
        let existing = statefulset(&db, &settings());
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
