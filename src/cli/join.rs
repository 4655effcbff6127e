//! `bulkhead join` and `bulkhead unjoin`: register a member cluster with the hub and
//! remove it again.
//!
//! `join` checks everything before it writes anything on the hub: the member answers,
//! the credentials may do what joining needs, and the name is not taken by another
//! cluster (kube-system namespace UIDs). It then installs what the hub needs in the member
//! (namespace, service account, least-privilege RBAC, CRDs), mints a token for that
//! service account, proves the token works, and only then stores the Secret and the
//! MemberCluster on the hub. The hub never receives the admin credentials the user passed.

use crate::access::denied;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::ResourceAttributes;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, Config, CustomResourceExt, ResourceExt};
use serde::Serialize;

use crate::api::member_cluster::{MemberClusterSpec, ProbeSpec, SecretReference};
use crate::api::{LABEL_MANAGED_BY, MemberCluster, MyDatabase, SYSTEM_NAMESPACE};
use crate::hub::membership::members::{KUBECONFIG_KEY, client_from_kubeconfig};
use crate::process::{ClientOptions, connect};

/// Label on a MemberCluster naming the UID of the member's kube-system namespace, which
/// tells a re-join of the same cluster from a different cluster reusing the name.
pub const LABEL_CLUSTER_ID: &str = "federation.example.com/cluster-id";
/// Name of the service account, ClusterRole, ClusterRoleBinding, Role and RoleBinding
/// `join` creates in the member.
pub use crate::hub::membership::tokens::HUB_ACCOUNT;
/// Field manager of everything `join` applies.
pub const JOIN_FIELD_MANAGER: &str = "bulkhead-join";
/// Default lifetime asked for the hub's token: one year. Re-join to rotate it.
pub const DEFAULT_TOKEN_SECONDS: i64 = 365 * 24 * 3600;

/// `bulkhead join` options.
#[derive(clap::Args, Debug)]
pub struct JoinOptions {
    /// Name of the member on the hub (a DNS label, e.g. `east`).
    pub name: String,
    /// Kubeconfig with admin credentials for the member. Its server address and CA are
    /// what the hub will use, so pass the address the hub can reach.
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// Context in the member kubeconfig (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// The member's zone (failure domain), e.g. `zone-a`.
    #[arg(long)]
    pub zone: String,
    /// The member's region.
    #[arg(long)]
    pub region: Option<String>,
    /// Kubeconfig of the hub API server (default: $KUBECONFIG, ~/.kube/config).
    #[arg(long)]
    pub hub_kubeconfig: Option<PathBuf>,
    /// Context in the hub kubeconfig.
    #[arg(long)]
    pub hub_context: Option<String>,
    /// spec.probe.intervalSeconds of the MemberCluster.
    #[arg(long, default_value_t = 5)]
    pub probe_interval_seconds: i32,
    /// spec.probe.timeoutSeconds.
    #[arg(long, default_value_t = 3)]
    pub probe_timeout_seconds: i32,
    /// spec.probe.failureThreshold.
    #[arg(long, default_value_t = 3)]
    pub failure_threshold: i32,
    /// spec.probe.successThreshold.
    #[arg(long, default_value_t = 2)]
    pub success_threshold: i32,
    /// Lifetime asked for the hub's service-account token (the member may grant less).
    #[arg(long, default_value_t = DEFAULT_TOKEN_SECONDS)]
    pub token_expiration_seconds: i64,
    /// Also install the agent in the member: service account, RBAC and a Deployment
    /// running `bulkhead agent`.
    #[arg(long)]
    pub install_agent: bool,
    /// Image for the agent Deployment.
    #[arg(long, default_value = super::agent_install::DEFAULT_AGENT_IMAGE)]
    pub agent_image: String,
    /// One more `bulkhead agent` argument for the installed agent (repeatable), e.g.
    /// `--agent-arg=--external-address-annotation=example.net/external-address`.
    #[arg(long, allow_hyphen_values = true)]
    pub agent_arg: Vec<String>,
    /// Accept a member kubeconfig that sets `insecure-skip-tls-verify: true` or a plain
    /// `http://` server. Without this flag `join` refuses it: the hub's member token would
    /// go to an unverified server, or travel unencrypted.
    /// With it, the MemberCluster records the choice (`spec.insecureSkipTLSVerify`), shown
    /// by `bulkhead get clusters` and the `TLSVerified=False` condition.
    #[arg(long)]
    pub insecure_skip_tls_verify: bool,
    /// Another template kind the hub may write in this member, as `<resource>.<group>`
    /// (e.g. `widgets.example.org`, `jobs.batch`; a core resource alone, e.g.
    /// `serviceaccounts`). Repeatable; run `join` again to add kinds later.
    #[arg(long = "federate", value_name = "RESOURCE.GROUP")]
    pub federate: Vec<String>,
    /// A namespace of the member the hub may never write in, besides `kube-*` and
    /// `bulkhead-system` (repeatable): a name, or a prefix ending in `*`. Enforced by the
    /// member's API server (the ValidatingAdmissionPolicy `bulkhead-hub-guard`).
    #[arg(long = "protect-namespace", value_name = "NAMESPACE")]
    pub protect_namespaces: Vec<String>,
}

/// `bulkhead unjoin` options.
#[derive(clap::Args, Debug)]
pub struct UnjoinOptions {
    /// Name of the member on the hub.
    pub name: String,
    /// Also remove what `join` created in the member (RBAC, service account, the
    /// `bulkhead-system` namespace with the fencing Lease). CRDs stay: deleting them would
    /// delete every MyDatabase in the member.
    #[arg(long, requires = "kubeconfig")]
    pub cleanup: bool,
    /// Admin kubeconfig of the member (needed with --cleanup).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Context in the member kubeconfig.
    #[arg(long)]
    pub context: Option<String>,
    /// Kubeconfig of the hub API server.
    #[arg(long)]
    pub hub_kubeconfig: Option<PathBuf>,
    /// Context in the hub kubeconfig.
    #[arg(long)]
    pub hub_context: Option<String>,
}

/// How to reach the member: what goes into the hub's kubeconfig besides the token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberEndpoint {
    pub server: String,
    /// Base64 of the PEM CA bundle, as kubeconfigs carry it.
    pub certificate_authority_data: Option<String>,
    pub tls_server_name: Option<String>,
    pub insecure_skip_tls_verify: bool,
}

#[derive(Serialize)]
struct KubeconfigFile<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'a str,
    clusters: Vec<serde_json::Value>,
    users: Vec<serde_json::Value>,
    contexts: Vec<serde_json::Value>,
    #[serde(rename = "current-context")]
    current_context: &'a str,
}

/// The kubeconfig the hub stores for a member: the member's server and CA, and the hub
/// service account's token as the only credential.
pub fn service_account_kubeconfig(member: &str, endpoint: &MemberEndpoint, token: &str) -> String {
    let mut cluster = serde_json::json!({"server": endpoint.server});
    if let Some(ca) = &endpoint.certificate_authority_data {
        cluster["certificate-authority-data"] = ca.clone().into();
    }
    if let Some(name) = &endpoint.tls_server_name {
        cluster["tls-server-name"] = name.clone().into();
    }
    if endpoint.insecure_skip_tls_verify {
        cluster["insecure-skip-tls-verify"] = true.into();
    }
    let user = format!("{HUB_ACCOUNT}@{member}");
    let file = KubeconfigFile {
        api_version: "v1",
        kind: "Config",
        clusters: vec![serde_json::json!({"name": member, "cluster": cluster})],
        users: vec![serde_json::json!({"name": user, "user": {"token": token}})],
        contexts: vec![serde_json::json!({
            "name": member,
            "context": {"cluster": member, "user": user, "namespace": SYSTEM_NAMESPACE}
        })],
        current_context: member,
    };
    serde_yaml::to_string(&file).expect("a kubeconfig always serializes")
}

/// The endpoint of the chosen context in a kubeconfig file.
fn member_endpoint(path: &Path, context: Option<&str>) -> Result<MemberEndpoint> {
    let kubeconfig = Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let context_name = context
        .map(str::to_string)
        .or_else(|| kubeconfig.current_context.clone())
        .with_context(|| format!("{} has no current context; pass --context", path.display()))?;
    let cluster_name = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .with_context(|| format!("{} has no context {context_name:?}", path.display()))?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.clone())
        .with_context(|| format!("{} has no cluster {cluster_name:?}", path.display()))?;
    let server = cluster
        .server
        .clone()
        .with_context(|| format!("cluster {cluster_name:?} has no server"))?;
    let certificate_authority_data = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(data), _) => Some(data.clone()),
        (None, Some(file)) => {
            let file = path.parent().unwrap_or(Path::new(".")).join(file);
            let pem = std::fs::read(&file)
                .with_context(|| format!("reading certificate authority {}", file.display()))?;
            Some(base64::engine::general_purpose::STANDARD.encode(pem))
        }
        (None, None) => None,
    };
    Ok(MemberEndpoint {
        server,
        certificate_authority_data,
        tls_server_name: cluster.tls_server_name.clone(),
        insecure_skip_tls_verify: cluster.insecure_skip_tls_verify.unwrap_or(false),
    })
}

async fn member_client(path: &Path, context: Option<&str>) -> Result<Client> {
    let kubeconfig = Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .with_context(|| format!("loading kubeconfig {}", path.display()))?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(20));
    Ok(Client::try_from(config)?)
}

async fn hub_client(path: &Option<PathBuf>, context: &Option<String>) -> Result<Client> {
    let options = ClientOptions {
        kubeconfig: path.clone(),
        context: context.clone(),
    };
    let client = connect(&options).await.context("connecting to the hub")?;
    tokio::time::timeout(Duration::from_secs(10), client.apiserver_version())
        .await
        .map_err(|_| anyhow::anyhow!("the hub API server did not answer within 10 s"))?
        .context("the hub API server does not answer")?;
    Ok(client)
}

/// UID of the member's kube-system namespace: the cluster's identity.
async fn cluster_id(client: &Client) -> Result<String> {
    let namespace = Api::<Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .context("reading namespace kube-system")?;
    namespace
        .metadata
        .uid
        .context("namespace kube-system has no uid")
}

/// What the credentials must be allowed to do for `join` to succeed.
fn join_permissions() -> Vec<ResourceAttributes> {
    let attr = |verb: &str, group: &str, resource: &str, sub: Option<&str>, ns: Option<&str>| {
        ResourceAttributes {
            verb: Some(verb.into()),
            group: Some(group.into()),
            resource: Some(resource.into()),
            subresource: sub.map(Into::into),
            namespace: ns.map(Into::into),
            ..Default::default()
        }
    };
    let ns = Some(SYSTEM_NAMESPACE);
    vec![
        attr("get", "", "namespaces", None, None),
        attr("create", "", "namespaces", None, None),
        attr("create", "", "serviceaccounts", None, ns),
        attr("patch", "", "serviceaccounts", None, ns),
        attr("create", "", "serviceaccounts", Some("token"), ns),
        attr(
            "create",
            "rbac.authorization.k8s.io",
            "clusterroles",
            None,
            None,
        ),
        attr(
            "patch",
            "rbac.authorization.k8s.io",
            "clusterroles",
            None,
            None,
        ),
        attr(
            "create",
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            None,
            None,
        ),
        attr(
            "patch",
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            None,
            None,
        ),
        attr("create", "rbac.authorization.k8s.io", "roles", None, ns),
        attr(
            "create",
            "rbac.authorization.k8s.io",
            "rolebindings",
            None,
            ns,
        ),
        attr(
            "create",
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            None,
            None,
        ),
        attr(
            "patch",
            "admissionregistration.k8s.io",
            "validatingadmissionpolicies",
            None,
            None,
        ),
        attr(
            "patch",
            "admissionregistration.k8s.io",
            "validatingadmissionpolicybindings",
            None,
            None,
        ),
        attr(
            "patch",
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            None,
            None,
        ),
    ]
}

fn managed_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(LABEL_MANAGED_BY.to_string(), "bulkhead".to_string())])
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        labels: Some(managed_labels()),
        ..Default::default()
    }
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..Default::default()
    }
}

/// The cluster-wide permissions of the hub's service account in a member: what
/// propagation, status aggregation, identity and capacity need, nothing more; see the
/// table in docs/clusters.md (a test compares the two). Kubernetes RBAC cannot exclude
/// namespaces from a ClusterRole, so the propagated kinds are writable in every namespace
/// (the hub itself never writes to `kube-*` or `bulkhead-system`); and it cannot limit
/// `create` by name, so any namespace may be created.
pub fn hub_cluster_role() -> ClusterRole {
    // Copies are written by server-side apply (patch, and create for a new object),
    // read for conflicts (get), watched (list, watch) and deleted: no update.
    const COPIES: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];
    ClusterRole {
        metadata: meta(HUB_ACCOUNT, None),
        rules: Some(vec![
            // The cluster's identity (duplicate MemberClusters are refused by it).
            PolicyRule {
                resource_names: Some(vec!["kube-system".to_string()]),
                ..rule(&[""], &["namespaces"], &["get"])
            },
            // Namespaces of copies, created on demand.
            rule(&[""], &["namespaces"], &["create"]),
            rule(&["apps"], &["deployments", "statefulsets"], COPIES),
            rule(&[""], &["configmaps", "secrets", "services"], COPIES),
            rule(&["example.com"], &["mydatabases"], COPIES),
            // Capacity: one list of each.
            rule(&[""], &["nodes", "pods"], &["list"]),
        ]),
        ..Default::default()
    }
}

/// Reads `<resource>.<group>` (or a core `<resource>`) as given to `--federate`.
pub fn federated_resource(text: &str) -> Result<(String, String)> {
    let (resource, group) = text.split_once('.').unwrap_or((text, ""));
    let label = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            && !s.starts_with(['-', '.'])
            && !s.ends_with(['-', '.'])
    };
    if !label(resource) || !(group.is_empty() || label(group)) || text.ends_with('.') {
        bail!(
            "--federate {text}: give the resource (plural, lower case) and its group, e.g. `widgets.example.org` or `jobs.batch`"
        );
    }
    Ok((resource.to_string(), group.to_string()))
}

/// [`hub_cluster_role`] plus the kinds of `--federate`.
pub fn hub_cluster_role_with(federate: &[String]) -> Result<ClusterRole> {
    const COPIES: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];
    let mut role = hub_cluster_role();
    let rules = role.rules.get_or_insert_with(Vec::new);
    for text in federate {
        let (resource, group) = federated_resource(text)?;
        rules.push(rule(&[group.as_str()], &[resource.as_str()], COPIES));
    }
    Ok(role)
}

/// The hub's permissions inside `bulkhead-system`: renewing the fencing Lease (applied:
/// patch, and create the first time), and minting new tokens for its own service account
/// (only that one) before the one it holds expires.
pub fn hub_lease_role() -> Role {
    Role {
        metadata: meta(HUB_ACCOUNT, Some(SYSTEM_NAMESPACE)),
        rules: Some(vec![
            rule(&["coordination.k8s.io"], &["leases"], &["create", "patch"]),
            PolicyRule {
                resource_names: Some(vec![HUB_ACCOUNT.to_string()]),
                ..rule(&[""], &["serviceaccounts/token"], &["create"])
            },
        ]),
    }
}

/// A Markdown table of RBAC rules, as docs/clusters.md lists them (a test keeps the two
/// equal, so any widening must be documented).
pub fn rules_table(rules: &[PolicyRule]) -> String {
    let mut out = String::from("| API group | resources | names | verbs |\n|---|---|---|---|\n");
    for rule in rules {
        let join = |items: &Option<Vec<String>>| items.as_deref().unwrap_or_default().join(", ");
        let groups: Vec<String> = rule
            .api_groups
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|g| {
                if g.is_empty() {
                    "core".to_string()
                } else {
                    g.clone()
                }
            })
            .collect();
        let names = join(&rule.resource_names);
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            groups.join(", "),
            join(&rule.resources),
            if names.is_empty() {
                "any".to_string()
            } else {
                names
            },
            rule.verbs.join(", ")
        ));
    }
    out
}

fn hub_subject() -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: HUB_ACCOUNT.into(),
        namespace: Some(SYSTEM_NAMESPACE.into()),
        ..Default::default()
    }
}

async fn apply<K>(api: &Api<K>, name: &str, object: &K) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + Serialize + std::fmt::Debug,
    K::DynamicType: Default,
{
    api.patch(
        name,
        &PatchParams::apply(JOIN_FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .with_context(|| format!("applying {} {name}", K::kind(&Default::default())))
    .map(|_| ())
}

/// Installs the agent's service account, RBAC and Deployment in the member.
async fn install_agent(member: &Client, image: &str, extra_args: &[String]) -> Result<()> {
    use super::agent_install as agent;
    use k8s_openapi::api::apps::v1::Deployment;
    apply(
        &Api::<ServiceAccount>::namespaced(member.clone(), SYSTEM_NAMESPACE),
        agent::AGENT_NAME,
        &agent::service_account(),
    )
    .await?;
    apply(
        &Api::<ClusterRole>::all(member.clone()),
        agent::AGENT_NAME,
        &agent::cluster_role(),
    )
    .await?;
    apply(
        &Api::<ClusterRoleBinding>::all(member.clone()),
        agent::AGENT_NAME,
        &agent::cluster_role_binding(),
    )
    .await?;
    apply(
        &Api::<Deployment>::namespaced(member.clone(), SYSTEM_NAMESPACE),
        agent::AGENT_NAME,
        &agent::deployment(image, extra_args),
    )
    .await?;
    Ok(())
}

/// Installs the namespace, service account, RBAC and CRDs in the member.
async fn install_in_member(member: &Client, federate: &[String]) -> Result<()> {
    // A namespace left terminating by a recent unjoin refuses new content: wait it out.
    let namespaces = Api::<Namespace>::all(member.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while namespaces
        .get_opt(SYSTEM_NAMESPACE)
        .await?
        .is_some_and(|ns| ns.metadata.deletion_timestamp.is_some())
    {
        if tokio::time::Instant::now() > deadline {
            bail!(
                "namespace {SYSTEM_NAMESPACE} in the member is still terminating after 60 s; wait for it to go and join again"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    apply(
        &Api::<Namespace>::all(member.clone()),
        SYSTEM_NAMESPACE,
        &Namespace {
            metadata: meta(SYSTEM_NAMESPACE, None),
            ..Default::default()
        },
    )
    .await?;
    apply(
        &Api::<ServiceAccount>::namespaced(member.clone(), SYSTEM_NAMESPACE),
        HUB_ACCOUNT,
        &ServiceAccount {
            metadata: meta(HUB_ACCOUNT, Some(SYSTEM_NAMESPACE)),
            ..Default::default()
        },
    )
    .await?;
    apply(
        &Api::<ClusterRole>::all(member.clone()),
        HUB_ACCOUNT,
        &hub_cluster_role_with(federate)?,
    )
    .await?;
    apply(
        &Api::<ClusterRoleBinding>::all(member.clone()),
        HUB_ACCOUNT,
        &ClusterRoleBinding {
            metadata: meta(HUB_ACCOUNT, None),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "ClusterRole".into(),
                name: HUB_ACCOUNT.into(),
            },
            subjects: Some(vec![hub_subject()]),
        },
    )
    .await?;
    apply(
        &Api::<Role>::namespaced(member.clone(), SYSTEM_NAMESPACE),
        HUB_ACCOUNT,
        &hub_lease_role(),
    )
    .await?;
    apply(
        &Api::<RoleBinding>::namespaced(member.clone(), SYSTEM_NAMESPACE),
        HUB_ACCOUNT,
        &RoleBinding {
            metadata: meta(HUB_ACCOUNT, Some(SYSTEM_NAMESPACE)),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "Role".into(),
                name: HUB_ACCOUNT.into(),
            },
            subjects: Some(vec![hub_subject()]),
        },
    )
    .await?;
    let crds = Api::<CustomResourceDefinition>::all(member.clone());
    let crd = MyDatabase::crd();
    let crd_name = crd.name_any();
    apply(&crds, &crd_name, &crd).await?;
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(crds, &crd_name, conditions::is_crd_established()),
    )
    .await
    .with_context(|| format!("CRD {crd_name} not Established in the member after 30 s"))??;
    Ok(())
}

/// Applies the ValidatingAdmissionPolicy that keeps the hub's account out of `kube-*`,
/// `bulkhead-system` and `protected` in the member (`member_guard`). A member whose API
/// server does not serve the kind (Kubernetes < 1.30) is told and joined without it.
async fn install_guard(member: &Client, name: &str, protected: &[String]) -> Result<()> {
    use super::member_guard;
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let policy = apply(
        &Api::<ValidatingAdmissionPolicy>::all(member.clone()),
        member_guard::NAME,
        &member_guard::policy(protected),
    )
    .await;
    if let Err(error) = &policy
        && error
            .chain()
            .any(|e| matches!(e.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 404))
    {
        eprintln!(
            "warning: member {name} does not serve ValidatingAdmissionPolicies (Kubernetes >= 1.30 does): the hub's account is kept out of kube-* and {SYSTEM_NAMESPACE} there only by the hub itself"
        );
        return Ok(());
    }
    policy?;
    apply(
        &Api::<ValidatingAdmissionPolicyBinding>::all(member.clone()),
        member_guard::NAME,
        &member_guard::binding(),
    )
    .await?;
    eprintln!(
        "the hub may not write in kube-*, {SYSTEM_NAMESPACE}{} of {name} (ValidatingAdmissionPolicy {})",
        protected
            .iter()
            .map(|p| format!(", {p}"))
            .collect::<String>(),
        member_guard::NAME
    );
    Ok(())
}

/// Mints a token for the hub's service account; returns it and its expiry.
async fn mint_token(member: &Client, seconds: i64) -> Result<(String, String)> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(seconds),
            ..Default::default()
        }),
        ..Default::default()
    };
    let answer = Api::<ServiceAccount>::namespaced(member.clone(), SYSTEM_NAMESPACE)
        .create_token_request(HUB_ACCOUNT, &PostParams::default(), &request)
        .await
        .context("requesting a token for service account bulkhead-system/bulkhead-hub")?;
    let status = answer
        .status
        .context("the TokenRequest came back without a token")?;
    let token = status
        .token
        .filter(|t| !t.is_empty())
        .context("the TokenRequest came back without a token")?;
    let expires = status
        .expiration_timestamp
        .map(|t| t.0.to_string())
        .unwrap_or_else(|| "at an unknown time".into());
    Ok((token, expires))
}

/// Proves the stored kubeconfig works: TLS with the CA, the token, and the Lease rights.
async fn verify_hub_kubeconfig(text: &str) -> Result<()> {
    let (client, server) = client_from_kubeconfig(text)
        .await
        .map_err(anyhow::Error::msg)
        .context("the generated kubeconfig is not usable")?;
    let lease = ResourceAttributes {
        verb: Some("patch".into()),
        group: Some("coordination.k8s.io".into()),
        resource: Some("leases".into()),
        namespace: Some(SYSTEM_NAMESPACE.into()),
        name: Some("bulkhead-hub".into()),
        ..Default::default()
    };
    let deployments = ResourceAttributes {
        verb: Some("create".into()),
        group: Some("apps".into()),
        resource: Some("deployments".into()),
        namespace: Some("default".into()),
        ..Default::default()
    };
    let refused = denied(&client, vec![lease, deployments])
        .await
        .with_context(|| format!("the hub's token does not work against {server}"))?;
    if !refused.is_empty() {
        bail!(
            "the hub's service account cannot {} in the member; RBAC was not applied as expected",
            refused.join(", ")
        );
    }
    Ok(())
}

/// Runs `bulkhead join`.
pub async fn join(options: &JoinOptions) -> Result<()> {
    // A wrong --federate or --protect-namespace is refused before anything is changed.
    hub_cluster_role_with(&options.federate)?;
    super::member_guard::check_protected(&options.protect_namespaces)?;
    let name = &options.name;
    let endpoint = member_endpoint(&options.kubeconfig, options.context.as_deref())?;
    if crate::hub::membership::credentials::is_plain_http(&endpoint.server)
        && !options.insecure_skip_tls_verify
    {
        bail!(
            "{} points member {name} at {} over plain HTTP: the hub's token would travel unencrypted; use the member's https:// address, or pass --insecure-skip-tls-verify to accept it (recorded on the MemberCluster); nothing was changed",
            options.kubeconfig.display(),
            endpoint.server
        );
    }
    if endpoint.insecure_skip_tls_verify && !options.insecure_skip_tls_verify {
        bail!(
            "{} sets insecure-skip-tls-verify for member {name}: the hub's token would go to an unverified server; add the member's CA (certificate-authority-data) to the kubeconfig, or pass --insecure-skip-tls-verify to accept it (recorded on the MemberCluster); nothing was changed",
            options.kubeconfig.display()
        );
    }
    let member = member_client(&options.kubeconfig, options.context.as_deref()).await?;

    let version = tokio::time::timeout(Duration::from_secs(15), member.apiserver_version())
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "cannot reach member {name} at {}: no answer within 15 s; nothing was changed",
                endpoint.server
            )
        })?
        .map_err(|error| match error {
            kube::Error::Api(status) if status.code == 401 || status.code == 403 => anyhow::anyhow!(
                "member {name} at {} rejects the credentials in {} ({} {}); nothing was changed",
                endpoint.server,
                options.kubeconfig.display(),
                status.code,
                status.message
            ),
            error => anyhow::Error::new(error).context(format!(
                "cannot reach member {name} at {}; nothing was changed",
                endpoint.server
            )),
        })?;
    let refused = denied(&member, join_permissions()).await.with_context(|| {
        format!("cannot check the credentials for member {name}; nothing was changed")
    })?;
    if !refused.is_empty() {
        bail!(
            "the credentials in {} may not do what joining needs ({}); nothing was changed",
            options.kubeconfig.display(),
            refused.join(", ")
        );
    }
    let id = cluster_id(&member).await?;

    let hub = hub_client(&options.hub_kubeconfig, &options.hub_context).await?;
    let members = Api::<MemberCluster>::all(hub.clone());
    let existing = members
        .get_opt(name)
        .await
        .context("reading MemberClusters on the hub (are the CRDs installed there?)")?;
    if let Some(existing) = &existing {
        match existing.labels().get(LABEL_CLUSTER_ID) {
            Some(other) if other == &id => {}
            Some(other) => bail!(
                "the name {name} is taken on the hub by a different cluster (kube-system uid {other}, this one is {id}); unjoin it first or choose another name; nothing was changed"
            ),
            None => bail!(
                "MemberCluster {name} exists on the hub but was not created by `bulkhead join` (no {LABEL_CLUSTER_ID} label); delete it or choose another name; nothing was changed"
            ),
        }
    }
    let same_cluster = members
        .list(&ListParams::default().labels(&format!("{LABEL_CLUSTER_ID}={id}")))
        .await
        .context("listing MemberClusters on the hub")?;
    if let Some(other) = same_cluster.items.iter().find(|m| &m.name_any() != name) {
        bail!(
            "this cluster is already joined as {}; unjoin it first; nothing was changed",
            other.name_any()
        );
    }

    eprintln!(
        "joining {name} ({}, {}) as {}",
        endpoint.server,
        version.git_version,
        if existing.is_some() {
            "an update"
        } else {
            "a new member"
        }
    );
    install_in_member(&member, &options.federate)
        .await
        .with_context(|| {
            format!("installing the hub's access in member {name}; nothing was changed on the hub")
        })?;
    install_guard(&member, name, &options.protect_namespaces)
        .await
        .with_context(|| {
            format!("installing the hub's namespace guard in member {name}; nothing was changed on the hub")
        })?;
    if options.install_agent {
        install_agent(&member, &options.agent_image, &options.agent_arg)
            .await
            .with_context(|| {
                format!("installing the agent in member {name}; nothing was changed on the hub")
            })?;
        eprintln!(
            "installed the agent in {name} (Deployment {SYSTEM_NAMESPACE}/bulkhead-agent, image {})",
            options.agent_image
        );
    }
    let (token, expires) = mint_token(&member, options.token_expiration_seconds).await?;
    let kubeconfig = service_account_kubeconfig(name, &endpoint, &token);
    verify_hub_kubeconfig(&kubeconfig)
        .await
        .context("nothing was changed on the hub")?;

    apply(
        &Api::<Namespace>::all(hub.clone()),
        SYSTEM_NAMESPACE,
        &Namespace {
            metadata: meta(SYSTEM_NAMESPACE, None),
            ..Default::default()
        },
    )
    .await
    .context("creating namespace bulkhead-system on the hub")?;
    let secret_name = format!("member-{name}");
    let mut secret_meta = meta(&secret_name, Some(SYSTEM_NAMESPACE));
    secret_meta
        .labels
        .get_or_insert_default()
        .insert(LABEL_CLUSTER_ID.to_string(), id.clone());
    let secret = Secret {
        metadata: secret_meta,
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            KUBECONFIG_KEY.to_string(),
            ByteString(kubeconfig.into_bytes()),
        )])),
        ..Default::default()
    };
    apply(
        &Api::<Secret>::namespaced(hub.clone(), SYSTEM_NAMESPACE),
        &secret_name,
        &secret,
    )
    .await?;
    let mut cluster = MemberCluster::new(
        name,
        MemberClusterSpec {
            secret_ref: SecretReference {
                namespace: SYSTEM_NAMESPACE.into(),
                name: secret_name.clone(),
            },
            zone: options.zone.clone(),
            region: options.region.clone(),
            taints: vec![],
            probe: ProbeSpec {
                interval_seconds: options.probe_interval_seconds,
                timeout_seconds: options.probe_timeout_seconds,
                failure_threshold: options.failure_threshold,
                success_threshold: options.success_threshold,
            },
            // Plain HTTP skips TLS altogether: the same consent, recorded alike.
            insecure_skip_tls_verify: endpoint.insecure_skip_tls_verify
                || crate::hub::membership::credentials::is_plain_http(&endpoint.server),
        },
    );
    cluster.metadata.labels = Some(BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), "bulkhead".to_string()),
        (LABEL_CLUSTER_ID.to_string(), id.clone()),
    ]));
    apply(&members, name, &cluster).await?;
    println!(
        "member {name} joined: MemberCluster {name} (zone {}), Secret {SYSTEM_NAMESPACE}/{secret_name} (token of {SYSTEM_NAMESPACE}/{HUB_ACCOUNT}, expires {expires}), cluster id {id}",
        options.zone
    );
    Ok(())
}

/// Runs `bulkhead unjoin`.
pub async fn unjoin(options: &UnjoinOptions) -> Result<()> {
    let name = &options.name;
    let hub = hub_client(&options.hub_kubeconfig, &options.hub_context).await?;
    let members = Api::<MemberCluster>::all(hub.clone());
    let existing = members
        .get_opt(name)
        .await
        .context("reading the MemberCluster")?;

    let member = match (&options.kubeconfig, options.cleanup) {
        (Some(path), true) => {
            let member = member_client(path, options.context.as_deref()).await?;
            let id = tokio::time::timeout(Duration::from_secs(15), cluster_id(&member))
                .await
                .map_err(|_| anyhow::anyhow!("member {name} does not answer; unjoin without --cleanup to remove it from the hub only"))??;
            if let Some(recorded) = existing
                .as_ref()
                .and_then(|m| m.labels().get(LABEL_CLUSTER_ID))
                && recorded != &id
            {
                bail!(
                    "{} points at a different cluster (kube-system uid {id}) than member {name} ({recorded}); nothing was changed",
                    path.display()
                );
            }
            Some(member)
        }
        _ => None,
    };

    let secret_name = existing
        .as_ref()
        .filter(|m| m.spec.secret_ref.namespace == SYSTEM_NAMESPACE)
        .map(|m| m.spec.secret_ref.name.clone())
        .unwrap_or_else(|| format!("member-{name}"));
    match members.delete(name, &DeleteParams::default()).await {
        Ok(_) => eprintln!("deleted MemberCluster {name}"),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            eprintln!("MemberCluster {name} was already gone")
        }
        Err(error) => return Err(error).context("deleting the MemberCluster"),
    }
    let secrets = Api::<Secret>::namespaced(hub, SYSTEM_NAMESPACE);
    match secrets.delete(&secret_name, &DeleteParams::default()).await {
        Ok(_) => eprintln!("deleted Secret {SYSTEM_NAMESPACE}/{secret_name}"),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(error) => return Err(error).context("deleting the member's Secret"),
    }

    if let Some(member) = member {
        let ignore_missing = |result: Result<(), kube::Error>, what: &str| match result {
            Ok(()) => {
                eprintln!("deleted {what} in {name}");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(error) => {
                Err(anyhow::Error::new(error).context(format!("deleting {what} in {name}")))
            }
        };
        let dp = DeleteParams::default();
        ignore_missing(
            Api::<ClusterRoleBinding>::all(member.clone())
                .delete(HUB_ACCOUNT, &dp)
                .await
                .map(|_| ()),
            "ClusterRoleBinding bulkhead-hub",
        )?;
        ignore_missing(
            Api::<ClusterRole>::all(member.clone())
                .delete(HUB_ACCOUNT, &dp)
                .await
                .map(|_| ()),
            "ClusterRole bulkhead-hub",
        )?;
        ignore_missing(
            Api::<ClusterRoleBinding>::all(member.clone())
                .delete(super::agent_install::AGENT_NAME, &dp)
                .await
                .map(|_| ()),
            "ClusterRoleBinding bulkhead-agent",
        )?;
        ignore_missing(
            Api::<ClusterRole>::all(member.clone())
                .delete(super::agent_install::AGENT_NAME, &dp)
                .await
                .map(|_| ()),
            "ClusterRole bulkhead-agent",
        )?;
        ignore_missing(
            Api::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding>::all(member.clone())
                .delete(super::member_guard::NAME, &dp)
                .await
                .map(|_| ()),
            "ValidatingAdmissionPolicyBinding bulkhead-hub-guard",
        )?;
        ignore_missing(
            Api::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy>::all(
                member.clone(),
            )
            .delete(super::member_guard::NAME, &dp)
            .await
            .map(|_| ()),
            "ValidatingAdmissionPolicy bulkhead-hub-guard",
        )?;
        let namespaces = Api::<Namespace>::all(member.clone());
        ignore_missing(
            namespaces.delete(SYSTEM_NAMESPACE, &dp).await.map(|_| ()),
            "namespace bulkhead-system (service accounts, Role, RoleBinding, Lease, agent Deployment)",
        )?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while namespaces.get_opt(SYSTEM_NAMESPACE).await?.is_some() {
            if tokio::time::Instant::now() > deadline {
                bail!("namespace bulkhead-system in {name} is still terminating after 60 s");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!(
            "namespace bulkhead-system in {name} is gone; CRDs were kept (deleting them would delete every MyDatabase)"
        );
    }
    println!("member {name} unjoined");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> MemberEndpoint {
        MemberEndpoint {
            server: "https://127.0.1.1:16410".into(),
            certificate_authority_data: Some("Q0EK".into()),
            tls_server_name: None,
            insecure_skip_tls_verify: false,
        }
    }

    #[test]
    fn the_hub_kubeconfig_holds_server_ca_and_the_token_only() {
        let text = service_account_kubeconfig("east", &endpoint(), "the-token");
        let parsed = Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(parsed.current_context.as_deref(), Some("east"));
        let cluster = parsed.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.1.1:16410"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0EK"));
        let user = parsed.auth_infos[0].auth_info.as_ref().unwrap();
        assert!(user.token.is_some());
        assert!(user.client_certificate_data.is_none() && user.client_key_data.is_none());
        assert!(text.contains("the-token"));
        assert!(!text.contains("insecure-skip-tls-verify"));
    }

    #[test]
    fn member_endpoint_reads_the_chosen_context() {
        let dir = std::env::temp_dir().join(format!("bulkhead-join-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.crt"), b"PEM").unwrap();
        let path = dir.join("config");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: a\n  cluster:\n    server: https://a:1\n    certificate-authority-data: QUFB\n- name: b\n  cluster:\n    server: https://b:2\n    certificate-authority: ca.crt\n    tls-server-name: b.local\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: ca\n  context: {cluster: a, user: u}\n- name: cb\n  context: {cluster: b, user: u}\ncurrent-context: ca\n",
        )
        .unwrap();
        let a = member_endpoint(&path, None).unwrap();
        assert_eq!(a.server, "https://a:1");
        assert_eq!(a.certificate_authority_data.as_deref(), Some("QUFB"));
        let b = member_endpoint(&path, Some("cb")).unwrap();
        assert_eq!(b.server, "https://b:2");
        assert_eq!(b.certificate_authority_data.as_deref(), Some("UEVN"));
        assert_eq!(b.tls_server_name.as_deref(), Some("b.local"));
        assert!(member_endpoint(&path, Some("nope")).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_hub_gets_least_privilege() {
        let role = hub_cluster_role();
        let rules = role.rules.unwrap();
        for rule in &rules {
            assert!(!rule.verbs.contains(&"*".to_string()), "{rule:?}");
            assert!(!rule.resources.as_ref().unwrap().contains(&"*".to_string()));
        }
        let read_only = rules
            .iter()
            .find(|r| r.resources.as_ref().unwrap().contains(&"nodes".to_string()))
            .unwrap();
        assert_eq!(read_only.verbs, ["list"]);
        assert!(
            rules
                .iter()
                .all(|r| !r.verbs.contains(&"update".to_string())),
            "server-side apply needs no update"
        );
        let lease = hub_lease_role();
        assert_eq!(lease.metadata.namespace.as_deref(), Some(SYSTEM_NAMESPACE));
        let lease_rules = lease.rules.unwrap();
        assert_eq!(lease_rules[0].resources.as_ref().unwrap(), &["leases"]);
    }

    #[test]
    fn more_kinds_for_the_hub_are_named_by_resource_and_group() {
        let role = hub_cluster_role_with(&["widgets.example.org".into(), "serviceaccounts".into()])
            .unwrap();
        let rules = role.rules.unwrap();
        let widgets = &rules[rules.len() - 2];
        assert_eq!(widgets.api_groups.as_deref().unwrap(), ["example.org"]);
        assert_eq!(widgets.resources.as_deref().unwrap(), ["widgets"]);
        assert!(
            widgets.verbs.contains(&"patch".to_string())
                && !widgets.verbs.contains(&"*".to_string())
        );
        assert_eq!(rules[rules.len() - 1].api_groups.as_deref().unwrap(), [""]);
        for bad in ["Widgets.example.org", "*", "", "widgets.", ".x", "a b"] {
            let error = hub_cluster_role_with(&[bad.to_string()])
                .unwrap_err()
                .to_string();
            assert!(error.contains("--federate"), "{bad}: {error}");
        }
    }

    #[test]
    fn the_docs_list_exactly_these_permissions() {
        let docs = include_str!("../../docs/clusters.md");
        for (what, rules) in [
            ("the hub's ClusterRole", hub_cluster_role().rules.unwrap()),
            (
                "the hub's Role in bulkhead-system",
                hub_lease_role().rules.unwrap(),
            ),
            (
                "the agent's ClusterRole",
                super::super::agent_install::cluster_role().rules.unwrap(),
            ),
        ] {
            let table = rules_table(&rules);
            assert!(
                docs.contains(&table),
                "docs/clusters.md must list {what} exactly:\n{table}"
            );
        }
    }

    #[test]
    fn an_applied_member_cluster_carries_no_status() {
        let cluster = MemberCluster::new(
            "east",
            MemberClusterSpec {
                secret_ref: SecretReference::default(),
                zone: "zone-a".into(),
                region: None,
                taints: vec![],
                probe: ProbeSpec::default(),
                insecure_skip_tls_verify: false,
            },
        );
        let json = serde_json::to_value(&cluster).unwrap();
        assert!(
            json["spec"].get("insecureSkipTLSVerify").is_none(),
            "verification is the default and is not written"
        );
        assert!(json.get("status").is_none(), "{json}");
        assert!(
            json["spec"].get("taints").is_none(),
            "join must not own the taints"
        );
    }
}
