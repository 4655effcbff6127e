//! What `bulkhead join --install-agent` puts in a member: the agent's service account,
//! least-privilege RBAC and a Deployment running `bulkhead agent`.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, HTTPGetAction, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecurityContext, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::api::{LABEL_MANAGED_BY, SYSTEM_NAMESPACE};

/// Name of the agent's service account, ClusterRole, ClusterRoleBinding and Deployment.
pub const AGENT_NAME: &str = "bulkhead-agent";
/// Image used when `--agent-image` is not given.
pub const DEFAULT_AGENT_IMAGE: &str = crate::api::DEFAULT_IMAGE;

fn meta(namespaced: bool) -> ObjectMeta {
    ObjectMeta {
        name: Some(AGENT_NAME.into()),
        namespace: namespaced.then(|| SYSTEM_NAMESPACE.to_string()),
        labels: Some(BTreeMap::from([
            (LABEL_MANAGED_BY.to_string(), "bulkhead".to_string()),
            ("app.kubernetes.io/name".to_string(), AGENT_NAME.to_string()),
        ])),
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

/// The agent's service account.
pub fn service_account() -> ServiceAccount {
    ServiceAccount {
        metadata: meta(true),
        ..Default::default()
    }
}

/// What the agent may do: run MyDatabases (and their children), release or delete their
/// volumes, record Events, and read the hub's fencing Lease. Nothing else; see the table
/// in docs/clusters.md (a test compares the two).
pub fn cluster_role() -> ClusterRole {
    // Children are written by server-side apply (patch, and create for a new object)
    // and go with their owner through the garbage collector: no update, no delete.
    const APPLY: &[&str] = &["get", "list", "watch", "create", "patch"];
    ClusterRole {
        metadata: meta(false),
        rules: Some(vec![
            // patch: the finalizer (kube-runtime's helper patches metadata.finalizers).
            rule(
                &["example.com"],
                &["mydatabases"],
                &["get", "list", "watch", "patch"],
            ),
            rule(&["example.com"], &["mydatabases/status"], &["patch"]),
            // update on finalizers: children carry blockOwnerDeletion owner references.
            rule(&["example.com"], &["mydatabases/finalizers"], &["update"]),
            rule(&["apps"], &["statefulsets"], APPLY),
            rule(&[""], &["services"], APPLY),
            // The instance and application Secrets: made once, their data never changed
            // (get to read the token the instances share with the agent); patch: only
            // their owner reference, dropped when a deletion keeps the claims (the data
            // holds their passwords) and set again when a database of that name takes
            // them back.
            rule(&[""], &["secrets"], &["get", "create", "patch"]),
            // patch: each database pod's role label; delete: a version upgrade replaces
            // the database pods on an old template one at a time, by name with a UID
            // precondition (standbys first, the primary after a switchover).
            rule(
                &[""],
                &["pods"],
                &["get", "list", "watch", "patch", "delete"],
            ),
            rule(
                &[""],
                &["persistentvolumeclaims"],
                // patch: released claims are labelled and taken back; delete: only one
                // claim at a time, by name with a UID precondition (reclaimPolicy Delete).
                &["get", "list", "watch", "patch", "delete"],
            ),
            rule(&["events.k8s.io"], &["events"], &["create", "patch"]),
            rule(
                &["coordination.k8s.io"],
                &["leases"],
                &["get", "list", "watch"],
            ),
            rule(
                &["apiextensions.k8s.io"],
                &["customresourcedefinitions"],
                &["get", "list", "watch"],
            ),
        ]),
        ..Default::default()
    }
}

/// Binds the ClusterRole to the service account.
pub fn cluster_role_binding() -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: meta(false),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: AGENT_NAME.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: AGENT_NAME.into(),
            namespace: Some(SYSTEM_NAMESPACE.into()),
            ..Default::default()
        }]),
    }
}

/// The Deployment running `bulkhead agent` with `image`.
pub fn deployment(image: &str, extra_args: &[String]) -> Deployment {
    let labels = BTreeMap::from([("app.kubernetes.io/name".to_string(), AGENT_NAME.to_string())]);
    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("probes".into()),
            ..Default::default()
        }),
        period_seconds: Some(10),
        ..Default::default()
    };
    Deployment {
        metadata: meta(true),
        spec: Some(DeploymentSpec {
            // One agent per member: two would fight over the same MyDatabases.
            replicas: Some(1),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                match_expressions: None,
            },
            strategy: Some(k8s_openapi::api::apps::v1::DeploymentStrategy {
                type_: Some("Recreate".into()),
                rolling_update: None,
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(AGENT_NAME.into()),
                    // The `restricted` Pod Security level, as the chart's hub: the image's
                    // nonroot user, no privilege, the runtime's seccomp profile.
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(65532),
                        run_as_group: Some(65532),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            localhost_profile: None,
                        }),
                        ..Default::default()
                    }),
                    containers: vec![Container {
                        name: "agent".into(),
                        image: Some(image.into()),
                        args: Some(
                            [
                                "agent".into(),
                                "--probe-address".into(),
                                "0.0.0.0:8080".into(),
                                "--log-format".into(),
                                "json".into(),
                                // The database pods' init container copies `bulkhead
                                // instance` from the agent's own image.
                                format!("--instance-image={image}"),
                            ]
                            .into_iter()
                            .chain(extra_args.iter().cloned())
                            .collect(),
                        ),
                        ports: Some(vec![ContainerPort {
                            name: Some("probes".into()),
                            container_port: 8080,
                            ..Default::default()
                        }]),
                        readiness_probe: Some(probe("/readyz")),
                        liveness_probe: Some(probe("/healthz")),
                        security_context: Some(SecurityContext {
                            allow_privilege_escalation: Some(false),
                            read_only_root_filesystem: Some(true),
                            run_as_non_root: Some(true),
                            capabilities: Some(Capabilities {
                                drop: Some(vec!["ALL".into()]),
                                add: None,
                            }),
                            seccomp_profile: Some(SeccompProfile {
                                type_: "RuntimeDefault".into(),
                                localhost_profile: None,
                            }),
                            ..Default::default()
                        }),
                        resources: Some(ResourceRequirements {
                            requests: Some(BTreeMap::from([
                                ("cpu".to_string(), Quantity("50m".into())),
                                ("memory".to_string(), Quantity("64Mi".into())),
                            ])),
                            limits: Some(BTreeMap::from([(
                                "memory".to_string(),
                                Quantity("256Mi".into()),
                            )])),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_gets_least_privilege() {
        let role = cluster_role();
        let rules = role.rules.unwrap();
        let verbs_for = |resource: &str| -> Vec<String> {
            rules
                .iter()
                .filter(|r| {
                    r.resources
                        .as_ref()
                        .unwrap()
                        .contains(&resource.to_string())
                })
                .flat_map(|r| r.verbs.clone())
                .collect()
        };
        assert!(
            !verbs_for("leases").contains(&"update".to_string()),
            "the agent only reads the hub's lease"
        );
        assert!(
            !verbs_for("mydatabases").contains(&"delete".to_string()),
            "the agent never deletes a MyDatabase"
        );
        assert_eq!(
            verbs_for("secrets"),
            ["get", "create", "patch"],
            "Secrets: the databases' own, made once (patched only to keep them with kept claims); never listed, watched or deleted"
        );
        assert_eq!(
            verbs_for("pods"),
            ["get", "list", "watch", "patch", "delete"],
            "pods: their role label is patched, an upgrade deletes them one by one; never updated"
        );
        let claims = verbs_for("persistentvolumeclaims");
        assert!(
            claims.contains(&"patch".to_string()) && claims.contains(&"delete".to_string()),
            "released claims are labelled; reclaimPolicy Delete deletes them one by one"
        );
        assert!(
            !claims.contains(&"deletecollection".to_string()),
            "never a delete by label alone"
        );
    }

    #[test]
    fn one_agent_replica_with_probes_and_the_service_account() {
        let deployment = deployment(
            "registry.local/bulkhead:1",
            &["--external-address-annotation=example.net/address".into()],
        );
        let spec = deployment.spec.unwrap();
        assert_eq!(spec.replicas, Some(1));
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some(AGENT_NAME));
        let container = &pod.containers[0];
        assert_eq!(
            container.image.as_deref(),
            Some("registry.local/bulkhead:1")
        );
        assert_eq!(container.args.as_ref().unwrap()[0], "agent");
        assert!(
            container
                .args
                .as_ref()
                .unwrap()
                .contains(&"--instance-image=registry.local/bulkhead:1".to_string()),
            "database pods get `bulkhead instance` from the agent's own image"
        );
        assert_eq!(
            container.args.as_ref().unwrap().last().map(String::as_str),
            Some("--external-address-annotation=example.net/address"),
            "`join --agent-arg` adds to the agent's arguments"
        );
        assert!(container.readiness_probe.is_some() && container.liveness_probe.is_some());
        // What the `restricted` Pod Security level asks of a pod (a namespace enforcing it
        // admits the agent).
        let pod_security = pod.security_context.as_ref().unwrap();
        let container_security = container.security_context.as_ref().unwrap();
        assert_eq!(pod_security.run_as_non_root, Some(true));
        assert_eq!(
            pod_security
                .seccomp_profile
                .as_ref()
                .map(|p| p.type_.as_str()),
            Some("RuntimeDefault")
        );
        assert_eq!(container_security.allow_privilege_escalation, Some(false));
        assert_eq!(
            container_security
                .capabilities
                .as_ref()
                .and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_string()])
        );
    }
}
