//! A whole federation on the lab for propagation and failover tests: the three members
//! joined with 1 s probes, a hub process, and one agent per member for the test's
//! namespace. Dropping it stops the processes, unjoins the members and removes the
//! namespace everywhere.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::agent_support::AgentProcess;
use crate::hub_support::{HubProcess, join, unjoin};
use crate::lab::Lab;
use crate::support::{TestNamespace, cleanup_blocking};
use crate::{Check, wait_for};
use bulkhead::api::resource_binding::ClusterPlacementStatus;
use bulkhead::api::{MemberCluster, ResourceBinding, is_condition_true};

/// The lab's members: (name, zone, region).
pub const MEMBERS: [(&str, &str, &str); 3] = [
    ("east", "zone-a", "region-1"),
    ("west", "zone-b", "region-1"),
    ("north", "zone-c", "region-2"),
];

/// Fencing lease the suites use: renewed every second, 3 s duration.
pub const LEASE_RENEW: &str = "1s";
pub const LEASE_DURATION_SECONDS: u64 = 3;

/// The template kinds the suites use, as API resources.
/// A StatefulSet template `name` with `replicas` and image `image`: one container mounting
/// a 1Gi claim `data` of the lab's `kwok-volume` class per replica.
pub fn statefulset_template(name: &str, replicas: i64, image: &str) -> Value {
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "app", "image": image,
                             "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}},
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "kwok-volume",
                         "resources": {"requests": {"storage": "1Gi"}}}
            }]
        }
    })
}

pub fn deployments() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&())
}
pub fn config_maps() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&())
}
pub fn statefulsets() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::apps::v1::StatefulSet>(&())
}
pub fn databases() -> ApiResource {
    ApiResource::erase::<bulkhead::api::MyDatabase>(&())
}
pub fn policies() -> ApiResource {
    ApiResource::erase::<bulkhead::api::PropagationPolicy>(&())
}

/// The federation; see the module documentation.
pub struct Federation {
    pub lab: Lab,
    pub hub: Client,
    /// Clients to each member from inside its zone (they work during a partition).
    pub members: BTreeMap<String, Client>,
    pub namespace: String,
    hub_process: Option<HubProcess>,
    hub_starts: u32,
    hub_args: Vec<String>,
    agents: Vec<AgentProcess>,
    hub_namespace: Option<TestNamespace>,
    /// Credentials of the hub process; `None`: the lab's admin.
    hub_kubeconfig: Option<std::path::PathBuf>,
}

impl Federation {
    /// Joins the members, creates the namespace on the hub only (members get it on
    /// demand from the hub), starts one agent per member and the hub with `extra_hub_args`,
    /// and waits for every member to be Ready.
    pub async fn start(prefix: &str, extra_hub_args: &[&str]) -> Result<Self> {
        Self::start_with_probes(prefix, extra_hub_args, &["1", "1"]).await
    }

    /// [`Federation::start`] with the members' probe `[interval, timeout]` in seconds (the
    /// suites use 1 s for fast failure detection; a load test wants the defaults, 5 and 3,
    /// so a busy machine is not taken for a failed member).
    pub async fn start_with_probes(
        prefix: &str,
        extra_hub_args: &[&str],
        probe: &[&str; 2],
    ) -> Result<Self> {
        Self::start_as(prefix, extra_hub_args, probe, None).await
    }

    /// [`Federation::start_with_probes`] with the hub process's credentials from
    /// `hub_kubeconfig` (default: the lab's admin), e.g. the Helm chart's service account.
    pub async fn start_as(
        prefix: &str,
        extra_hub_args: &[&str],
        probe: &[&str; 2],
        hub_kubeconfig: Option<std::path::PathBuf>,
    ) -> Result<Self> {
        Self::start_joined(prefix, extra_hub_args, probe, hub_kubeconfig, &[]).await
    }

    /// [`Federation::start_as`] with more `bulkhead join` arguments for every member (e.g.
    /// `--federate widgets.example.org`). Every test of a file must join alike: a join
    /// without them takes the permissions back.
    pub async fn start_joined(
        prefix: &str,
        extra_hub_args: &[&str],
        probe: &[&str; 2],
        hub_kubeconfig: Option<std::path::PathBuf>,
        join_extra: &[&str],
    ) -> Result<Self> {
        Self::start_full(
            prefix,
            extra_hub_args,
            probe,
            hub_kubeconfig,
            join_extra,
            false,
        )
        .await
    }

    /// [`Federation::start`] whose MyDatabases run real PostgreSQL on each member's
    /// database node (the lab runner). Without it their pods land on kwok's nodes: the
    /// API objects are all there, no server runs.
    pub async fn start_with_databases(prefix: &str, extra_hub_args: &[&str]) -> Result<Self> {
        Self::start_full(prefix, extra_hub_args, &["1", "1"], None, &[], true).await
    }

    async fn start_full(
        prefix: &str,
        extra_hub_args: &[&str],
        probe: &[&str; 2],
        hub_kubeconfig: Option<std::path::PathBuf>,
        join_extra: &[&str],
        real_databases: bool,
    ) -> Result<Self> {
        let lab = crate::support::lab().await?;
        lab.install_crds("hub", &crate::lab::crd_dir()).await?;
        for (name, zone, region) in MEMBERS {
            let output = join(
                &lab,
                name,
                zone,
                region,
                &[
                    &[
                        "--probe-interval-seconds",
                        probe[0],
                        "--probe-timeout-seconds",
                        probe[1],
                    ],
                    join_extra,
                ]
                .concat(),
            )?;
            anyhow::ensure!(output.status.success(), "join {name} failed");
        }
        let namespace = TestNamespace::create(&lab, prefix, &["hub"]).await?;
        let hub = lab.client("hub").await?;
        let mut members = BTreeMap::new();
        let mut agents = vec![];
        let lease_seconds = LEASE_DURATION_SECONDS.to_string();
        for (name, _, _) in MEMBERS {
            members.insert(name.to_string(), lab.inside_client(name).await?);
            let mut agent_args: Vec<String> = vec![
                "--lease-duration-seconds".into(),
                lease_seconds.clone(),
                "--unfence-after-seconds".into(),
                "2".into(),
            ];
            if real_databases {
                agent_args.extend(crate::lab::runner::agent_args());
            }
            let agent_args: Vec<&str> = agent_args.iter().map(String::as_str).collect();
            agents.push(AgentProcess::start(
                &lab,
                name,
                &namespace.name,
                &agent_args,
            )?);
        }
        let mut hub_args: Vec<String> = vec![
            "--identity".into(),
            format!("e2e-{prefix}"),
            "--lease-renew-interval".into(),
            LEASE_RENEW.into(),
            "--lease-duration".into(),
            format!("{LEASE_DURATION_SECONDS}s"),
        ];
        hub_args.extend(extra_hub_args.iter().map(|a| a.to_string()));
        let mut federation = Federation {
            lab,
            hub,
            members,
            namespace: namespace.name.clone(),
            hub_process: None,
            hub_starts: 0,
            hub_args,
            agents,
            hub_namespace: Some(namespace),
            hub_kubeconfig,
        };
        federation.start_hub()?;
        federation
            .wait_members_ready(Duration::from_secs(60))
            .await?;
        Ok(federation)
    }

    /// Starts the hub process (again); its log is `<lab>/hub/logs/<namespace>-hub-<n>.log`.
    pub fn start_hub(&mut self) -> Result<()> {
        self.hub_starts += 1;
        let log = format!("{}-hub-{}.log", self.namespace, self.hub_starts);
        let args: Vec<&str> = self.hub_args.iter().map(String::as_str).collect();
        let kubeconfig = self
            .hub_kubeconfig
            .clone()
            .unwrap_or_else(|| self.lab.kubeconfig("hub"));
        self.hub_process = Some(HubProcess::start_as(&self.lab, &kubeconfig, &log, &args)?);
        Ok(())
    }

    /// Kills the hub process (SIGKILL: no chance to clean anything up).
    pub fn kill_hub(&mut self) {
        self.hub_process = None;
    }

    /// The hub process id, while it runs.
    pub fn hub_pid(&self) -> Option<u32> {
        self.hub_process.as_ref().map(HubProcess::pid)
    }

    /// Starts another hub process with the federation's hub arguments but identity
    /// `identity` (for leader election tests); its log is
    /// `<lab>/hub/logs/<namespace>-<identity>.log`. The federation does not track it.
    pub fn start_another_hub(&self, identity: &str) -> Result<HubProcess> {
        let mut args = self.hub_args.clone();
        let at = args
            .iter()
            .position(|a| a == "--identity")
            .context("hub arguments without --identity")?;
        args[at + 1] = identity.to_string();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        HubProcess::start(
            &self.lab,
            &format!("{}-{identity}.log", self.namespace),
            &args,
        )
    }

    /// The arguments the federation runs its hub with, with identity `identity` (for a
    /// caller that runs hub replicas of its own, e.g. the chaos nemesis).
    pub fn hub_arguments(&self, identity: &str) -> Vec<String> {
        let mut args = self.hub_args.clone();
        if let Some(at) = args.iter().position(|a| a == "--identity") {
            args[at + 1] = identity.to_string();
        }
        args
    }

    /// Hands the federation's hub process over to the caller, who then stops and starts
    /// it (the federation no longer kills it when dropped).
    pub fn take_hub(&mut self) -> Option<HubProcess> {
        self.hub_process.take()
    }

    /// The identity the federation's own hub process runs with.
    pub fn hub_identity(&self) -> Option<&str> {
        let at = self.hub_args.iter().position(|a| a == "--identity")?;
        self.hub_args.get(at + 1).map(String::as_str)
    }

    /// The hub's `/metrics` text.
    pub async fn hub_metrics(&self) -> Result<String> {
        self.hub_process
            .as_ref()
            .context("hub not running")?
            .metrics()
            .await
    }

    /// Sum of a counter's samples in the hub's metrics whose line contains `filter`.
    pub async fn hub_counter(&self, name: &str, filter: &str) -> Result<f64> {
        let text = self.hub_metrics().await?;
        Ok(crate::hub_support::counter_sum(&text, name, filter))
    }

    /// Waits until every member is Ready on the hub.
    pub async fn wait_members_ready(&self, timeout: Duration) -> Result<()> {
        let members: Api<MemberCluster> = Api::all(self.hub.clone());
        wait_for("every member Ready", timeout, || {
            let members = members.clone();
            async move {
                match members.list(&Default::default()).await {
                    Ok(list) => {
                        let ready: Vec<String> = list
                            .items
                            .iter()
                            .filter(|m| {
                                m.status
                                    .as_ref()
                                    .is_some_and(|s| is_condition_true(&s.conditions, "Ready"))
                            })
                            .map(|m| m.name_any())
                            .collect();
                        if ready.len() == MEMBERS.len() {
                            Check::Done(())
                        } else {
                            Check::Waiting(format!("Ready: {ready:?}"))
                        }
                    }
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        })
        .await
    }

    /// The value of the hub's unlabelled metric sample `name` (e.g. `bulkhead_hub_synced`,
    /// `bulkhead_hub_queue_depth`), or `None` when the hub does not expose it.
    pub async fn hub_metric(&self, name: &str) -> Result<Option<f64>> {
        let text = self.hub_metrics().await?;
        Ok(metric_sample(&text, name))
    }

    /// Waits until the hub has settled: it is synced (`bulkhead_hub_synced 1`: every
    /// initial list read, every Ready member's copies listed, every template reconciled
    /// once), no template waits in its work queue (`bulkhead_hub_queue_depth 0`) and no
    /// member write is pending (`bulkhead_hub_pending_member_writes 0`), for a second
    /// without a break. Whatever the hub was going to decide from what it read has then
    /// been decided and written.
    pub async fn wait_settled(&self, timeout: Duration) -> Result<()> {
        const GAUGES: [(&str, f64); 3] = [
            ("bulkhead_hub_synced", 1.0),
            ("bulkhead_hub_queue_depth", 0.0),
            ("bulkhead_hub_pending_member_writes", 0.0),
        ];
        let quiet_since = std::sync::Mutex::new(None::<std::time::Instant>);
        wait_for("the hub to settle", timeout, || {
            let quiet = &quiet_since;
            async move {
                for (name, wanted) in GAUGES {
                    match self.hub_metric(name).await {
                        Ok(Some(value)) if value == wanted => {}
                        other => {
                            *quiet.lock().unwrap() = None;
                            return Check::Waiting(format!("{name} {other:?}"));
                        }
                    }
                }
                let since = *quiet
                    .lock()
                    .unwrap()
                    .get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= Duration::from_secs(1) {
                    Check::Done(())
                } else {
                    Check::Waiting("settled for less than a second".into())
                }
            }
        })
        .await
    }

    /// Waits until the hub's MemberCluster `name` has the condition `Ready` with status
    /// True (`ready`) or False (not `ready`; a missing condition is neither), and returns
    /// the MemberCluster as then seen.
    pub async fn wait_member_ready(
        &self,
        name: &str,
        ready: bool,
        timeout: Duration,
    ) -> Result<MemberCluster> {
        let api: Api<MemberCluster> = Api::all(self.hub.clone());
        let wanted = if ready { "True" } else { "False" };
        wait_for(
            &format!("MemberCluster {name} Ready={wanted} on the hub"),
            timeout,
            || {
                let api = api.clone();
                async move {
                    match api.get(name).await {
                        Ok(member) => {
                            let condition = member.status.as_ref().and_then(|s| {
                                s.conditions.iter().find(|c| c.type_ == "Ready").cloned()
                            });
                            match condition {
                                Some(c) if c.status == wanted => Check::Done(member),
                                Some(c) => Check::Waiting(format!(
                                    "Ready={} ({}: {})",
                                    c.status, c.reason, c.message
                                )),
                                None => Check::Waiting("no Ready condition".into()),
                            }
                        }
                        Err(e) => Check::Waiting(e.to_string()),
                    }
                }
            },
        )
        .await
    }

    /// The Events the hub recorded in the test namespace about the object `kind/name`
    /// (`regarding`), oldest first, as (reason, note) pairs. The hub's recorder writes
    /// `events.k8s.io/v1` Events (what `kubectl events` shows).
    pub async fn events_for(&self, kind: &str, name: &str) -> Result<Vec<(String, String)>> {
        let api = Api::<k8s_openapi::api::events::v1::Event>::namespaced(
            self.hub.clone(),
            &self.namespace,
        );
        let mut events: Vec<_> = api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                })
            })
            .collect();
        events.sort_by_key(|e| {
            (
                e.event_time.as_ref().map(|t| t.0),
                e.metadata.creation_timestamp.as_ref().map(|t| t.0),
            )
        });
        Ok(events
            .into_iter()
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect())
    }

    /// Waits until the hub has recorded an Event with `reason` about `kind/name`, and
    /// returns its note (the latest, when there are several).
    pub async fn wait_event(
        &self,
        kind: &str,
        name: &str,
        reason: &str,
        timeout: Duration,
    ) -> Result<String> {
        wait_for(
            &format!("an Event {reason} on {kind} {name}"),
            timeout,
            || async {
                match self.events_for(kind, name).await {
                    Ok(events) => match events.iter().rev().find(|(r, _)| r == reason) {
                        Some((_, note)) => Check::Done(note.clone()),
                        None => Check::Waiting(format!(
                            "reasons {:?}",
                            events.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>()
                        )),
                    },
                    Err(e) => Check::Waiting(e.to_string()),
                }
            },
        )
        .await
    }

    /// Waits until the hub's garbage collector (kube-controller-manager) tracks
    /// ResourceBindings, by creating a throwaway binding whose owner does not exist and
    /// waiting until it is collected. A controller manager that started before the CRDs
    /// were installed learns of a new kind only at its next resource resync (every 30 s);
    /// until then a `--cascade=foreground` deletion finds no dependents and deletes no
    /// binding. Tests of what the hub does when the garbage collector deletes a binding
    /// call this first.
    pub async fn wait_garbage_collector_tracks_bindings(&self, timeout: Duration) -> Result<()> {
        let api = Api::<ResourceBinding>::namespaced(self.hub.clone(), &self.namespace);
        let name = "e2e-garbage-collector-probe";
        let probe: ResourceBinding = serde_json::from_value(json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": name, "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "e2e-no-such-owner",
                "uid": "00000000-0000-0000-0000-000000000000"}]},
            "spec": {"resource": {"apiVersion": "v1", "kind": "ConfigMap", "name": "e2e-no-such-owner"}},
        }))?;
        api.create(&Default::default(), &probe)
            .await
            .context("creating the garbage collector's probe binding")?;
        let collected = wait_for(
            "the garbage collector to collect a binding without owner",
            timeout,
            || async {
                match api.get_opt(name).await {
                    Ok(None) => Check::Done(()),
                    Ok(Some(_)) => Check::Waiting("still there".into()),
                    Err(e) => Check::Waiting(e.to_string()),
                }
            },
        )
        .await;
        if collected.is_err() {
            let _ = api.delete(name, &Default::default()).await;
        }
        collected
    }

    /// The path of the hub's current log file (see [`Federation::start_hub`]).
    pub fn hub_log(&self) -> std::path::PathBuf {
        self.lab
            .log_dir("hub")
            .join(format!("{}-hub-{}.log", self.namespace, self.hub_starts))
    }

    /// Server-side applies an object to the hub in the test namespace.
    pub async fn apply(&self, resource: &ApiResource, object: Value) -> Result<DynamicObject> {
        let name = object["metadata"]["name"]
            .as_str()
            .context("object without a name")?
            .to_string();
        let api =
            Api::<DynamicObject>::namespaced_with(self.hub.clone(), &self.namespace, resource);
        api.patch(
            &name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&object),
        )
        .await
        .with_context(|| format!("applying {} {name} to the hub", resource.kind))
    }

    /// The partition suites' two templates: `web` (a Deployment, 6 replicas, weights
    /// 1:1:1) and `orders` (a MyDatabase, 2 replicas in east and west), each with a policy
    /// whose stateless failover tolerates `toleration_seconds`. Waits until web runs
    /// 2/2/2 and orders 1/1 (its member copies Ready).
    pub async fn run_web_and_orders(&self, toleration_seconds: u64) -> Result<()> {
        let failover =
            json!({"failover": {"stateless": {"tolerationSeconds": toleration_seconds}}});
        self.apply(
            &policies(),
            self.policy(
                "web",
                json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}]),
                json!({"replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted"}}),
                failover.clone(),
            ),
        )
        .await?;
        self
            .apply(
                &policies(),
                self.policy(
                    "orders",
                    json!([{"apiVersion": "example.com/v1", "kind": "MyDatabase", "name": "orders"}]),
                    json!({"clusterAffinity": {"clusterNames": ["east", "west"]},
                           "replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted"}}),
                    failover,
                ),
            )
            .await?;
        self.apply(
            &deployments(),
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                "spec": {"replicas": 6, "selector": {"matchLabels": {"app": "web"}},
                         "template": {"metadata": {"labels": {"app": "web"}},
                                      "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}
            }),
        )
        .await?;
        self
            .apply(
                &databases(),
                json!({"apiVersion": "example.com/v1", "kind": "MyDatabase", "metadata": {"name": "orders"},
                       "spec": {"replicas": 2, "version": "16", "storage": {"size": "1Gi"}}}),
            )
            .await?;
        self.wait_copies(
            &deployments(),
            "web",
            "2/2/2 Ready",
            Duration::from_secs(90),
            |c| ready_at(c, &[("east", 2), ("west", 2), ("north", 2)]),
        )
        .await?;
        self.wait_copies(
            &databases(),
            "orders",
            "east 1, west 1 Ready",
            Duration::from_secs(90),
            |c| ready_at(c, &[("east", 1), ("west", 1)]),
        )
        .await?;
        Ok(())
    }

    /// A policy selecting `kind/name` with `placement`.
    pub fn policy(&self, name: &str, selectors: Value, placement: Value, extra: Value) -> Value {
        let mut spec = json!({"resourceSelectors": selectors, "placement": placement});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        json!({
            "apiVersion": "federation.example.com/v1alpha1", "kind": "PropagationPolicy",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": spec,
        })
    }

    /// An API for `resource` in the test namespace of `cluster` ("hub" or a member).
    pub fn api(&self, cluster: &str, resource: &ApiResource) -> Api<DynamicObject> {
        let client = if cluster == "hub" {
            self.hub.clone()
        } else {
            self.members[cluster].clone()
        };
        Api::namespaced_with(client, &self.namespace, resource)
    }

    /// The binding of a template, if any.
    pub async fn binding(&self, name: &str) -> Result<Option<ResourceBinding>> {
        Ok(
            Api::<ResourceBinding>::namespaced(self.hub.clone(), &self.namespace)
                .get_opt(name)
                .await?,
        )
    }

    /// Waits for a binding to satisfy `check`.
    pub async fn wait_binding<T>(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&ResourceBinding) -> Option<T>,
    ) -> Result<T> {
        let api = Api::<ResourceBinding>::namespaced(self.hub.clone(), &self.namespace);
        let check = &check;
        wait_for(&format!("binding {name}: {what}"), timeout, || {
            let api = api.clone();
            async move {
                match api.get_opt(name).await {
                    Ok(Some(binding)) => match check(&binding) {
                        Some(value) => Check::Done(value),
                        None => Check::Waiting(describe_binding(&binding)),
                    },
                    Ok(None) => Check::Waiting("no binding yet".into()),
                    Err(e) => Check::Waiting(e.to_string()),
                }
            }
        })
        .await
    }

    /// The replicas the binding `name` gives each cluster now.
    pub async fn placement_of(&self, name: &str) -> Result<Vec<(String, i64)>> {
        let binding = self
            .binding(name)
            .await?
            .with_context(|| format!("no binding {name}"))?;
        Ok(binding_replicas(&binding))
    }

    /// Waits until the binding's status row for `cluster` satisfies `check`.
    pub async fn wait_row(
        &self,
        name: &str,
        cluster: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&ClusterPlacementStatus) -> bool,
    ) -> Result<ResourceBinding> {
        self.wait_binding(name, &format!("{cluster} {what}"), timeout, |b| {
            let rows = &b.status.as_ref()?.clusters;
            rows.iter()
                .any(|r| r.name == cluster && check(r))
                .then(|| b.clone())
        })
        .await
    }

    /// Each member's copy of `name`.
    pub async fn copies(&self, resource: &ApiResource, name: &str) -> Result<Vec<Copy>> {
        let clusters: Vec<&str> = self.members.keys().map(String::as_str).collect();
        self.copies_in(&clusters, resource, name).await
    }

    /// The copies of `name` in `clusters` only (e.g. while another member is down).
    pub async fn copies_in(
        &self,
        clusters: &[&str],
        resource: &ApiResource,
        name: &str,
    ) -> Result<Vec<Copy>> {
        let mut copies = vec![];
        for (cluster, client) in self
            .members
            .iter()
            .filter(|(c, _)| clusters.contains(&c.as_str()))
        {
            let api =
                Api::<DynamicObject>::namespaced_with(client.clone(), &self.namespace, resource);
            if let Some(object) = api.get_opt(name).await? {
                copies.push(Copy::of(cluster, &object));
            }
        }
        Ok(copies)
    }

    /// Waits until the member copies of `name` satisfy `check`.
    pub async fn wait_copies(
        &self,
        resource: &ApiResource,
        name: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&[Copy]) -> bool,
    ) -> Result<Vec<Copy>> {
        let clusters: Vec<&str> = self.members.keys().map(String::as_str).collect();
        self.wait_copies_in(&clusters, resource, name, what, timeout, check)
            .await
    }

    /// [`Federation::wait_copies`] looking at `clusters` only.
    pub async fn wait_copies_in(
        &self,
        clusters: &[&str],
        resource: &ApiResource,
        name: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&[Copy]) -> bool,
    ) -> Result<Vec<Copy>> {
        let check = &check;
        wait_for(
            &format!("{} {name}: {what}", resource.kind),
            timeout,
            || async move {
                match self.copies_in(clusters, resource, name).await {
                    Ok(copies) if check(&copies) => Check::Done(copies),
                    Ok(copies) => Check::Waiting(format!("{copies:?}")),
                    Err(e) => Check::Waiting(e.to_string()),
                }
            },
        )
        .await
    }

    /// UIDs of every object of `resource` in the test namespace of every member.
    pub async fn member_uids(&self, resource: &ApiResource) -> Result<BTreeMap<String, String>> {
        let mut uids = BTreeMap::new();
        for (cluster, client) in &self.members {
            let api =
                Api::<DynamicObject>::namespaced_with(client.clone(), &self.namespace, resource);
            for object in api.list(&ListParams::default()).await?.items {
                uids.insert(
                    format!("{cluster}/{}/{}", resource.kind, object.name_any()),
                    object.uid().unwrap_or_default(),
                );
            }
        }
        Ok(uids)
    }
}

/// One member copy as the tests see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Copy {
    pub cluster: String,
    pub replicas: Option<i64>,
    pub ready: i64,
    pub uid: String,
    pub managed: bool,
}

impl Copy {
    fn of(cluster: &str, object: &DynamicObject) -> Self {
        Copy {
            cluster: cluster.to_string(),
            replicas: object.data["spec"]["replicas"].as_i64(),
            ready: object.data["status"]["readyReplicas"].as_i64().unwrap_or(0),
            uid: object.uid().unwrap_or_default(),
            managed: object
                .labels()
                .get(bulkhead::api::LABEL_MANAGED_BY)
                .is_some_and(|v| v == "bulkhead"),
        }
    }
}

/// The value of the unlabelled sample `name` in Prometheus text, if present (HELP and
/// TYPE lines and samples of other metrics sharing the prefix are not it).
pub fn metric_sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (sample, value) = line.trim_end().split_once(' ')?;
        (sample == name).then(|| value.trim().parse().ok())?
    })
}

/// (cluster, replicas) pairs of copies, for comparisons.
pub fn placement(copies: &[Copy]) -> Vec<(String, i64)> {
    copies
        .iter()
        .map(|c| (c.cluster.clone(), c.replicas.unwrap_or(0)))
        .collect()
}

/// True when the copies are exactly `wanted` (cluster, replicas), all Ready.
pub fn ready_at(copies: &[Copy], wanted: &[(&str, i64)]) -> bool {
    copies.len() == wanted.len()
        && wanted.iter().all(|(cluster, replicas)| {
            copies.iter().any(|c| {
                c.cluster == *cluster && c.replicas == Some(*replicas) && c.ready == *replicas
            })
        })
}

/// A one-line summary of a binding for wait messages.
pub fn describe_binding(binding: &ResourceBinding) -> String {
    let clusters: Vec<String> = binding
        .spec
        .clusters
        .iter()
        .map(|c| format!("{}={}", c.name, c.replicas))
        .collect();
    let status = binding.status.clone().unwrap_or_default();
    let conditions: Vec<String> = status
        .conditions
        .iter()
        .map(|c| format!("{}={}({})", c.type_, c.status, c.reason))
        .collect();
    let rows: Vec<String> = status
        .clusters
        .iter()
        .map(|r| {
            format!(
                "{}: applied={} {:?} ready={} fenced={} pending={} {}",
                r.name,
                r.applied,
                r.health,
                r.ready_replicas,
                r.fenced,
                r.pending_cleanup,
                r.message.clone().unwrap_or_default()
            )
        })
        .collect();
    format!(
        "spec [{}] conditions [{}] rows [{}]",
        clusters.join(", "),
        conditions.join(", "),
        rows.join("; ")
    )
}

/// The replicas a binding gives each cluster.
pub fn binding_replicas(binding: &ResourceBinding) -> Vec<(String, i64)> {
    binding
        .spec
        .clusters
        .iter()
        .map(|c| (c.name.clone(), i64::from(c.replicas)))
        .collect()
}

/// Whether a binding condition is True.
pub fn binding_condition(binding: &ResourceBinding, condition: &str) -> bool {
    binding
        .status
        .as_ref()
        .is_some_and(|s| is_condition_true(&s.conditions, condition))
}

impl Drop for Federation {
    fn drop(&mut self) {
        self.hub_process = None;
        self.agents.clear();
        let _ = self.lab.heal_all();
        // The hub is gone: drop its finalizers so the namespace can go.
        let namespace = self.namespace.clone();
        cleanup_blocking(vec![self.lab.kubeconfig("hub")], move |client| {
            let namespace = namespace.clone();
            async move {
                for resource in [deployments(), config_maps(), statefulsets(), databases()] {
                    let api = Api::<DynamicObject>::namespaced_with(
                        client.clone(),
                        &namespace,
                        &resource,
                    );
                    if let Ok(list) = api.list(&ListParams::default()).await {
                        for object in list.items {
                            let _ = api
                                .patch(
                                    &object.name_any(),
                                    &PatchParams::default(),
                                    &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
                                )
                                .await;
                        }
                    }
                }
            }
        });
        self.hub_namespace = None;
        // Member copies go with the namespaces the hub created there.
        let namespace = self.namespace.clone();
        let members: Vec<_> = MEMBERS
            .iter()
            .map(|(name, _, _)| self.lab.inside_kubeconfig(name))
            .collect();
        cleanup_blocking(members, move |client| {
            let namespace = namespace.clone();
            async move {
                let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
                    .delete(&namespace, &Default::default())
                    .await;
            }
        });
        for (name, _, _) in MEMBERS {
            let _ = unjoin(&self.lab, name);
        }
    }
}
