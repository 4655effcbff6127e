//! The nemesis: runs a [`Schedule`](super::schedule::Schedule)'s faults and operations
//! against a federation on the lab, recording each with its time in the
//! [`Timeline`](super::timeline::Timeline).
//!
//! Faults run concurrently, each in its own future (start, wait its duration, end);
//! operations run one after another, each at its time or as soon as the one before is
//! done. Two faults may cut the same member (a partition and the hub isolated): the
//! member's external address is cut by the first and healed by the last
//! ([`NetworkCuts`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::converge::api_resource;
use super::rules::TemplateRef;
use super::schedule::{
    Fault, Operation, PlannedFault, PlannedOperation, TemplateKind, claim_of, config_of,
};
use super::templates;
use super::timeline::{Event, Timeline};
use crate::federation::metric_sample;
use crate::hub_support::HubProcess;
use crate::lab::Lab;

/// Field manager of the templates the nemesis writes on the hub (a user's).
const USER_FIELD_MANAGER: &str = "chaos-user";
/// Field manager of a person's edits of member copies.
const MEMBER_EDITOR: &str = "chaos-member-edit";
/// Name of the Shard interpreter (cluster-scoped).
pub const SHARD_INTERPRETER: &str = "chaos-shards";
/// How long one operation may take before it is recorded as failed.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(20);

/// How long federating the new kind may take: the CRD is installed in every member,
/// retried for up to two minutes each while one is down or cut off.
const FEDERATE_TIMEOUT: Duration = Duration::from_secs(300);

/// One `bulkhead hub --leader-elect` replica the nemesis runs, kills, freezes and starts.
struct HubReplica {
    identity: String,
    arguments: Vec<String>,
    process: Option<HubProcess>,
    starts: u32,
    paused: bool,
}

/// The hub replicas (two), sharing one leader Lease.
pub struct HubReplicas {
    lab: Lab,
    replicas: Vec<HubReplica>,
}

impl HubReplicas {
    /// The replicas `(identity, arguments)`; `running` is a process already started for
    /// the first one (the federation's own hub), the others are started now.
    pub fn start(
        lab: &Lab,
        replicas: Vec<(String, Vec<String>)>,
        running: Option<HubProcess>,
    ) -> Result<Self> {
        let mut hubs = HubReplicas {
            lab: lab.clone(),
            replicas: replicas
                .into_iter()
                .map(|(identity, arguments)| HubReplica {
                    identity,
                    arguments,
                    process: None,
                    starts: 0,
                    paused: false,
                })
                .collect(),
        };
        if let Some(first) = hubs.replicas.first_mut() {
            first.process = running;
            first.starts = u32::from(first.process.is_some());
        }
        for index in 0..hubs.replicas.len() {
            if hubs.replicas[index].process.is_none() {
                hubs.start_replica(index)?;
            }
        }
        Ok(hubs)
    }

    /// The identities, in order.
    pub fn identities(&self) -> Vec<String> {
        self.replicas.iter().map(|r| r.identity.clone()).collect()
    }

    fn start_replica(&mut self, index: usize) -> Result<()> {
        let replica = &mut self.replicas[index];
        replica.starts += 1;
        let log = format!("chaos-{}-{}.log", replica.identity, replica.starts);
        let arguments: Vec<&str> = replica.arguments.iter().map(String::as_str).collect();
        replica.process = Some(HubProcess::start(&self.lab, &log, &arguments)?);
        replica.paused = false;
        Ok(())
    }

    /// Whether replica `index` says it leads (`bulkhead_hub_leader 1`); None when it does
    /// not answer within a second (dead or frozen).
    async fn says_it_leads(&self, index: usize) -> Option<bool> {
        let replica = &self.replicas[index];
        let process = replica.process.as_ref().filter(|_| !replica.paused)?;
        let text = tokio::time::timeout(Duration::from_secs(1), process.metrics())
            .await
            .ok()?
            .ok()?;
        Some(metric_sample(&text, "bulkhead_hub_leader") == Some(1.0))
    }

    /// The replica that leads now, if one says so.
    pub async fn leader(&self) -> Option<usize> {
        for index in 0..self.replicas.len() {
            if self.says_it_leads(index).await == Some(true) {
                return Some(index);
            }
        }
        None
    }

    /// The leader's identity, if one leads.
    pub async fn leader_identity(&self) -> Option<String> {
        let index = self.leader().await?;
        Some(self.replicas[index].identity.clone())
    }

    /// Waits up to `timeout` for a leader; without one, the first running replica that is
    /// not frozen (so a fault on "the leader" always hits a hub).
    async fn leader_or_any(&self, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(index) = self.leader().await {
                return Some(index);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.replicas
            .iter()
            .position(|r| r.process.is_some() && !r.paused)
    }

    fn pid(&self, index: usize) -> Result<nix::unistd::Pid> {
        let process = self.replicas[index]
            .process
            .as_ref()
            .context("the replica is not running")?;
        Ok(nix::unistd::Pid::from_raw(process.pid() as i32))
    }

    fn signal(&self, index: usize, signal: nix::sys::signal::Signal) -> Result<()> {
        nix::sys::signal::kill(self.pid(index)?, signal)
            .with_context(|| format!("sending {signal} to hub {}", self.replicas[index].identity))
    }

    /// Resumes frozen replicas and starts dead ones; returns what it did.
    pub fn ensure_running(&mut self) -> Result<Vec<String>> {
        let mut done = vec![];
        for index in 0..self.replicas.len() {
            if self.replicas[index].paused {
                self.signal(index, nix::sys::signal::Signal::SIGCONT)?;
                self.replicas[index].paused = false;
                done.push(format!("resumed {}", self.replicas[index].identity));
            }
            if self.replicas[index].process.is_none() {
                self.start_replica(index)?;
                done.push(format!("started {}", self.replicas[index].identity));
            }
        }
        Ok(done)
    }

    /// Stops every replica (SIGKILL; a frozen one first resumed so it dies at once).
    pub fn stop_all(&mut self) {
        for index in 0..self.replicas.len() {
            if self.replicas[index].paused {
                let _ = self.signal(index, nix::sys::signal::Signal::SIGCONT);
                self.replicas[index].paused = false;
            }
            self.replicas[index].process = None;
        }
    }

    /// Each replica's log files, for the report.
    pub fn logs(&self) -> Vec<PathBuf> {
        self.replicas
            .iter()
            .flat_map(|r| {
                (1..=r.starts).map(|n| {
                    self.lab
                        .log_dir("hub")
                        .join(format!("chaos-{}-{n}.log", r.identity))
                })
            })
            .collect()
    }
}

/// Reference counts of the reasons each member's external address is cut.
#[derive(Default)]
pub struct NetworkCuts {
    reasons: std::sync::Mutex<BTreeMap<String, usize>>,
}

impl NetworkCuts {
    /// One more reason to cut `member`; the first cuts it.
    fn cut(&self, lab: &Lab, timeline: &Timeline, member: &str) -> Result<()> {
        let mut reasons = self.reasons.lock().unwrap();
        let count = reasons.entry(member.to_string()).or_default();
        if *count == 0 {
            lab.partition(member)?;
            timeline.record(Event::NetworkCut {
                member: member.to_string(),
            });
        }
        *count += 1;
        Ok(())
    }

    /// One reason fewer; the last heals it.
    fn heal(&self, lab: &Lab, timeline: &Timeline, member: &str) -> Result<()> {
        let mut reasons = self.reasons.lock().unwrap();
        let count = reasons.entry(member.to_string()).or_default();
        *count = count.saturating_sub(1);
        if *count == 0 {
            lab.heal(member)?;
            timeline.record(Event::NetworkHealed {
                member: member.to_string(),
            });
        }
        Ok(())
    }
}

/// What the nemesis holds of each template it wrote: its replicas and revision.
#[derive(Clone, Copy, Debug, Default)]
struct TemplateState {
    replicas: i64,
    revision: u32,
}

/// The nemesis; see the module documentation.
pub struct Nemesis<'a> {
    pub lab: &'a Lab,
    pub hub: Client,
    /// In-zone clients of the members (they work while a member is cut off), acting as
    /// a person editing copies there ([`crate::lab::MEMBER_EDITOR_USER`]).
    pub members: &'a BTreeMap<String, Client>,
    pub namespace: String,
    pub timeline: &'a Timeline,
    pub hubs: tokio::sync::Mutex<HubReplicas>,
    /// Where the Shard CRD is written for installing it.
    pub work_dir: PathBuf,
    network: NetworkCuts,
    templates: std::sync::Mutex<BTreeMap<TemplateRef, TemplateState>>,
    /// Held through an API server restart, from the kill until the member's components
    /// run again: the plan keeps restarts apart by their planned durations, but bringing
    /// a server back takes longer than planned, and a second restart thrown meanwhile
    /// found no server to kill (a run ended without a verdict so).
    apiserver_restart: tokio::sync::Mutex<()>,
}

impl<'a> Nemesis<'a> {
    /// The nemesis for the federation's `namespace`.
    pub fn new(
        lab: &'a Lab,
        hub: Client,
        members: &'a BTreeMap<String, Client>,
        namespace: &str,
        timeline: &'a Timeline,
        hubs: HubReplicas,
        work_dir: PathBuf,
    ) -> Self {
        Nemesis {
            lab,
            hub,
            members,
            namespace: namespace.to_string(),
            timeline,
            hubs: tokio::sync::Mutex::new(hubs),
            work_dir,
            network: NetworkCuts::default(),
            templates: Default::default(),
            apiserver_restart: tokio::sync::Mutex::new(()),
        }
    }

    /// Runs fault number `number` at its time from `start`: begins it, waits its duration,
    /// ends it.
    pub async fn run_fault(
        &self,
        number: usize,
        planned: PlannedFault,
        start: Instant,
    ) -> Result<()> {
        tokio::time::sleep_until((start + planned.start).into()).await;
        let fault = planned.fault.to_string();
        // An API server restart waits for the one still being undone (it begins late).
        let _restart = match planned.fault {
            Fault::RestartApiserver { .. } => {
                let waited = Instant::now();
                let guard = self.apiserver_restart.lock().await;
                if waited.elapsed() > Duration::from_millis(100) {
                    self.timeline.note(format!(
                        "fault #{number} ({fault}) begins {:.1} s late: the previous API server restart was still being undone",
                        waited.elapsed().as_secs_f64()
                    ));
                }
                Some(guard)
            }
            _ => None,
        };
        self.timeline.record(Event::FaultStarted {
            number,
            fault: fault.clone(),
        });
        let result = self.throw(planned).await;
        if let Err(error) = &result {
            self.timeline
                .note(format!("fault #{number} ({fault}) went wrong: {error:#}"));
        }
        self.timeline.record(Event::FaultEnded { number, fault });
        result
    }

    async fn throw(&self, planned: PlannedFault) -> Result<()> {
        match planned.fault {
            Fault::Partition { .. } | Fault::IsolateHub => {
                let members = planned.fault.members();
                for member in &members {
                    self.network.cut(self.lab, self.timeline, member)?;
                }
                tokio::time::sleep(planned.duration).await;
                for member in &members {
                    self.network.heal(self.lab, self.timeline, member)?;
                }
            }
            Fault::RestartApiserver { member } => {
                self.lab.kill_component(member, "kube-apiserver")?;
                self.timeline.record(Event::ApiserverDown {
                    member: member.to_string(),
                });
                tokio::time::sleep(planned.duration).await;
                let mut attempt = 1;
                loop {
                    match self.lab.restart_component(member, "kube-apiserver").await {
                        Ok(()) => break,
                        Err(error) if attempt < 3 => {
                            self.timeline.note(format!(
                                "{member}: kube-apiserver did not come back ({error:#}); trying again"
                            ));
                            attempt += 1;
                            // A half-started server may hold the port: stop it first.
                            let _ = self.lab.kill_component(member, "kube-apiserver");
                            tokio::time::sleep(Duration::from_secs(2)).await;
                        }
                        Err(error) => return Err(error),
                    }
                }
                self.timeline.record(Event::ApiserverUp {
                    member: member.to_string(),
                });
                self.restart_member_components(member).await?;
            }
            Fault::KillLeader => {
                let identity = {
                    let mut hubs = self.hubs.lock().await;
                    let index = hubs
                        .leader_or_any(Duration::from_secs(10))
                        .await
                        .context("no hub replica runs")?;
                    hubs.replicas[index].process = None;
                    hubs.replicas[index].identity.clone()
                };
                self.timeline.record(Event::HubKilled {
                    identity: identity.clone(),
                });
                tokio::time::sleep(planned.duration).await;
                let mut hubs = self.hubs.lock().await;
                let index = hubs
                    .replicas
                    .iter()
                    .position(|r| r.identity == identity)
                    .context("replica vanished")?;
                hubs.start_replica(index)?;
                self.timeline.record(Event::HubStarted { identity });
            }
            Fault::PauseLeader => {
                use nix::sys::signal::Signal;
                let (index, identity) = {
                    let mut hubs = self.hubs.lock().await;
                    let index = hubs
                        .leader_or_any(Duration::from_secs(10))
                        .await
                        .context("no hub replica runs")?;
                    hubs.signal(index, Signal::SIGSTOP)?;
                    hubs.replicas[index].paused = true;
                    (index, hubs.replicas[index].identity.clone())
                };
                self.timeline.record(Event::HubPaused {
                    identity: identity.clone(),
                });
                tokio::time::sleep(planned.duration).await;
                let mut hubs = self.hubs.lock().await;
                hubs.signal(index, Signal::SIGCONT)?;
                hubs.replicas[index].paused = false;
                self.timeline.record(Event::HubResumed { identity });
            }
        }
        Ok(())
    }

    /// Restarts the components of `member` that talk to its API server, after it came
    /// back: kube-controller-manager and kube-scheduler (in a real cluster they run with
    /// leader election and restart when their API server is gone past the renew deadline;
    /// the lab runs them without, and seen here a controller manager that lived through
    /// the restart kept failing on a stale pod for minutes), and kwok (v0.8 does not play
    /// a stage again when the API server lost its write: seen here, a pod left
    /// Ready=False for good after its status patch died with the server, where a real
    /// kubelet reports its pods' status again after reconnecting). A component that
    /// dies at start (kwok has an upstream race, see the lab) is started again. The
    /// member's agent, Bulkhead's own, is left alone: how it recovers is under test.
    async fn restart_member_components(&self, member: &str) -> Result<()> {
        for component in ["kube-controller-manager", "kube-scheduler", "kwok"] {
            let mut attempt = 1;
            loop {
                if self.lab.component_running(member, component) {
                    self.lab.kill_component(member, component)?;
                }
                self.lab.restart_component(member, component).await?;
                tokio::time::sleep(Duration::from_secs(2)).await;
                if self.lab.component_running(member, component) {
                    break;
                }
                if attempt == 3 {
                    bail!("{member}'s {component} does not stay up");
                }
                self.timeline.note(format!(
                    "{member}: {component} exited at start (attempt {attempt}); starting it again"
                ));
                attempt += 1;
            }
        }
        self.timeline.note(format!(
            "{member}: kube-controller-manager, kube-scheduler and kwok restarted"
        ));
        Ok(())
    }

    /// Runs the operations, each at its time from `start` (or right after the one before,
    /// when that one ran late). An operation that fails is recorded, not fatal: users'
    /// requests fail too while a member is down.
    pub async fn run_operations(&self, operations: &[PlannedOperation], start: Instant) {
        for planned in operations {
            tokio::time::sleep_until((start + planned.at).into()).await;
            self.operate(&planned.operation).await;
        }
    }

    /// Runs one operation and records how it went.
    pub async fn operate(&self, operation: &Operation) {
        // Installing a kind takes as long as its slowest member (a user goes on until the
        // CRD is in every member): its own retries bound it.
        let timeout = match operation {
            Operation::FederateShards => FEDERATE_TIMEOUT,
            _ => OPERATION_TIMEOUT,
        };
        let outcome = match tokio::time::timeout(timeout, self.execute(operation)).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(error)) => format!("FAILED: {error:#}"),
            Err(_) => format!("FAILED: no answer within {timeout:?}"),
        };
        self.timeline.record(Event::Operation {
            description: operation.to_string(),
            outcome,
        });
    }

    fn hub_api(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.hub.clone(), &self.namespace, resource)
    }

    async fn apply_template(&self, kind: TemplateKind, name: &str) -> Result<()> {
        let state = self
            .templates
            .lock()
            .unwrap()
            .get(&TemplateRef {
                kind,
                name: name.to_string(),
            })
            .copied()
            .unwrap_or_default();
        let object = templates::template(kind, name, state.replicas, state.revision);
        self.hub_api(&api_resource(kind))
            .patch(
                name,
                &PatchParams::apply(USER_FIELD_MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
            .with_context(|| format!("applying {} {name} to the hub", kind.kind()))?;
        Ok(())
    }

    fn set_state(&self, kind: TemplateKind, name: &str, change: impl FnOnce(&mut TemplateState)) {
        let mut templates = self.templates.lock().unwrap();
        change(
            templates
                .entry(TemplateRef {
                    kind,
                    name: name.to_string(),
                })
                .or_default(),
        );
    }

    async fn execute(&self, operation: &Operation) -> Result<String> {
        match operation {
            Operation::Create {
                kind,
                name,
                replicas,
            } => {
                if *kind == TemplateKind::Deployment {
                    for (dependency, dependency_name) in [
                        (TemplateKind::ConfigMap, config_of(name)),
                        (TemplateKind::Claim, claim_of(name)),
                    ] {
                        self.set_state(dependency, &dependency_name, |_| {});
                        self.apply_template(dependency, &dependency_name).await?;
                    }
                }
                self.set_state(*kind, name, |s| s.replicas = *replicas);
                self.apply_template(*kind, name).await?;
            }
            Operation::Scale {
                kind,
                name,
                replicas,
            } => {
                self.set_state(*kind, name, |s| s.replicas = *replicas);
                self.apply_template(*kind, name).await?;
            }
            Operation::Edit {
                kind,
                name,
                revision,
            } => {
                self.set_state(*kind, name, |s| s.revision = *revision);
                self.apply_template(*kind, name).await?;
            }
            Operation::Delete { kind, name } => {
                self.timeline.record(Event::TemplateDeleted {
                    kind: *kind,
                    name: name.clone(),
                });
                self.hub_api(&api_resource(*kind))
                    .delete(name, &DeleteParams::default())
                    .await
                    .with_context(|| format!("deleting {} {name} on the hub", kind.kind()))?;
                self.templates.lock().unwrap().remove(&TemplateRef {
                    kind: *kind,
                    name: name.clone(),
                });
            }
            Operation::ScaleCopy {
                member,
                kind,
                name,
                replicas,
            } => {
                let api = self.member_api(member, *kind)?;
                let patch = Patch::Merge(json!({"spec": {"replicas": replicas}}));
                let params = PatchParams {
                    field_manager: Some(MEMBER_EDITOR.into()),
                    ..Default::default()
                };
                // As `kubectl scale` does, through the scale subresource where the kind
                // has one.
                let result = if *kind == TemplateKind::Shard {
                    api.patch(name, &params, &patch).await.map(|_| ())
                } else {
                    api.patch_scale(name, &params, &patch).await.map(|_| ())
                };
                return member_outcome(result);
            }
            Operation::EditCopy {
                member,
                kind,
                name,
                mark,
            } => {
                let api = self.member_api(member, *kind)?;
                let edit = templates::copy_edit(*kind, *mark).context("no edit for the kind")?;
                let patch = if templates::edit_is_strategic(*kind) {
                    Patch::Strategic(edit)
                } else {
                    Patch::Merge(edit)
                };
                let params = PatchParams {
                    field_manager: Some(MEMBER_EDITOR.into()),
                    ..Default::default()
                };
                let result = api.patch(name, &params, &patch).await.map(|_| ());
                return member_outcome(result);
            }
            Operation::DeleteCopy { member, kind, name } => {
                let api = self.member_api(member, *kind)?;
                let result = api.delete(name, &DeleteParams::default()).await.map(|_| ());
                return member_outcome(result);
            }
            Operation::FederateShards => self.federate_shards().await?,
        }
        Ok("ok".to_string())
    }

    fn member_api(&self, member: &str, kind: TemplateKind) -> Result<Api<DynamicObject>> {
        let client = self
            .members
            .get(member)
            .with_context(|| format!("no member {member}"))?;
        Ok(Api::namespaced_with(
            client.clone(),
            &self.namespace,
            &api_resource(kind),
        ))
    }

    /// Installs the Shard CRD in the hub and every member (retrying while a member's API
    /// server is down), then its interpreter and a policy.
    async fn federate_shards(&self) -> Result<()> {
        let dir = self.work_dir.join("shard-crd");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("shards.yaml"),
            serde_yaml::to_string(&templates::shard_crd())?,
        )?;
        for cluster in ["hub", "east", "west", "north"] {
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                match self.lab.install_crds(cluster, &dir).await {
                    Ok(_) => break,
                    Err(error) if Instant::now() < deadline => {
                        self.timeline.note(format!(
                            "the Shard CRD in {cluster}: {error:#}; trying again"
                        ));
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                    Err(error) => return Err(error),
                }
            }
        }
        let interpreters = ApiResource::erase::<bulkhead::api::ResourceInterpreter>(&());
        Api::<DynamicObject>::all_with(self.hub.clone(), &interpreters)
            .patch(
                SHARD_INTERPRETER,
                &PatchParams::apply(USER_FIELD_MANAGER).force(),
                &Patch::Apply(templates::shard_interpreter(SHARD_INTERPRETER)),
            )
            .await
            .context("applying the Shard interpreter")?;
        self.apply_policy(TemplateKind::Shard).await
    }

    /// Applies the policy for `kind` (see [`templates::policy`]).
    pub async fn apply_policy(&self, kind: TemplateKind) -> Result<()> {
        let policies = ApiResource::erase::<bulkhead::api::PropagationPolicy>(&());
        let policy = templates::policy(&self.namespace, kind);
        let name = policy["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        self.hub_api(&policies)
            .patch(
                &name,
                &PatchParams::apply(USER_FIELD_MANAGER).force(),
                &Patch::Apply(&policy),
            )
            .await
            .with_context(|| format!("applying policy {name}"))?;
        Ok(())
    }

    /// Notes every change of leader in the timeline, polling every second until `running`
    /// turns false.
    pub async fn watch_leader(&self, running: &AtomicBool) {
        let mut last: Option<Option<String>> = None;
        while running.load(Ordering::SeqCst) {
            let leader = self.hubs.lock().await.leader_identity().await;
            if last.as_ref() != Some(&leader) {
                self.timeline.note(match &leader {
                    Some(identity) => format!("leader: {identity}"),
                    None => "leader: none answers as leader".to_string(),
                });
                last = Some(leader);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Heals every cut (the run is over), checking that no fault left one behind.
    pub fn heal_everything(&self) -> Result<()> {
        let reasons = self.network.reasons.lock().unwrap();
        let left: Vec<&String> = reasons
            .iter()
            .filter(|(_, count)| **count > 0)
            .map(|(member, _)| member)
            .collect();
        if !left.is_empty() {
            bail!("faults ended but left {left:?} cut off");
        }
        Ok(())
    }
}

/// How an operation on a member copy went: a copy that is not there is no failure.
fn member_outcome(result: Result<(), kube::Error>) -> Result<String> {
    match result {
        Ok(()) => Ok("ok".to_string()),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            Ok("no copy there (404)".to_string())
        }
        Err(error) => Err(error.into()),
    }
}
