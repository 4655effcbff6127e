//! `bulkhead rollout status|promote|pause|resume|abort|undo|history <kind>/<name>`: a
//! template's rollout (docs/rollouts.md). Commands are an annotation on the template
//! (users own templates; ResourceBindings are the hub's), carried out once each by the
//! hub; `undo` puts the template's content back to an earlier revision, which is then
//! rolled out like any change.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::ControllerRevision;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::api::ResourceBinding;
use crate::api::rollout::{
    ANNOTATION_ROLLOUT_COMMAND, LABEL_REVISION_OF, RolloutPhase, RolloutStatus,
};
use crate::process::{ClientOptions, connect};

/// `bulkhead rollout` options.
#[derive(clap::Args, Debug)]
pub struct RolloutOptions {
    #[command(subcommand)]
    pub action: RolloutAction,
}

/// A template: `<kind>/<name>` (kind as kubectl takes it: `deployment`, `deploy`,
/// `mydatabase`, `statefulsets.apps`), in a namespace.
#[derive(clap::Args, Debug)]
pub struct Target {
    #[command(flatten)]
    pub client: ClientOptions,
    /// `<kind>/<name>`, e.g. `deployment/web`.
    pub template: String,
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
}

/// What to do.
#[derive(clap::Subcommand, Debug)]
pub enum RolloutAction {
    /// The rollout: revision, wave, phase, each cluster's revision, the analysis.
    Status {
        #[command(flatten)]
        target: Target,
        /// Print it again whenever it changes, until the rollout is over.
        #[arg(short, long)]
        watch: bool,
    },
    /// The current wave counts as passed (its health wait, analysis or pause skipped).
    Promote(Target),
    /// Stop at the current wave.
    Pause(Target),
    /// Go on after `pause` (or judge a wave again after a failed analysis with
    /// `onFailure: Pause`).
    Resume(Target),
    /// Roll every updated wave back to the stable revision.
    Abort(Target),
    /// Put the template back to an earlier revision (default: the stable one); it is
    /// rolled out like any change.
    Undo {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        to_revision: Option<i64>,
    },
    /// The revisions the hub keeps.
    History(Target),
}

/// Runs a `bulkhead rollout` command.
pub async fn run(options: &RolloutOptions) -> Result<()> {
    match &options.action {
        RolloutAction::Status { target, watch } => status(target, *watch).await,
        RolloutAction::Promote(t) => command(t, "promote").await,
        RolloutAction::Pause(t) => command(t, "pause").await,
        RolloutAction::Resume(t) => command(t, "resume").await,
        RolloutAction::Abort(t) => command(t, "abort").await,
        RolloutAction::Undo {
            target,
            to_revision,
        } => undo(target, *to_revision).await,
        RolloutAction::History(t) => history(t).await,
    }
}

/// The template's API resource and name, from `<kind>/<name>`.
async fn resolve(client: &Client, template: &str) -> Result<(ApiResource, String)> {
    let (kind, name) = template
        .split_once('/')
        .with_context(|| format!("`{template}`: give <kind>/<name>, e.g. deployment/web"))?;
    let kind = kind.to_lowercase();
    let (kind, group) = kind.split_once('.').unwrap_or((kind.as_str(), ""));
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .context("discovering the hub's API")?;
    for api_group in discovery.groups() {
        if !group.is_empty() && api_group.name() != group {
            continue;
        }
        for (resource, capabilities) in api_group.recommended_resources() {
            let matches = resource.kind.to_lowercase() == kind
                || resource.plural == kind
                || short_names(&resource.plural).contains(&kind);
            if matches && capabilities.scope == Scope::Namespaced {
                return Ok((resource, name.to_string()));
            }
        }
    }
    bail!("`{template}`: the hub serves no namespaced kind `{kind}`")
}

/// kubectl's short names of the built-in kinds this command is most used with.
fn short_names(plural: &str) -> &'static [&'static str] {
    match plural {
        "deployments" => &["deploy", "deployment"],
        "statefulsets" => &["sts"],
        "configmaps" => &["cm"],
        "mydatabases" => &["mydb", "db"],
        _ => &[],
    }
}

fn binding_name(resource: &ApiResource, name: &str) -> String {
    crate::hub::federation::scheduler::binding_name(name, &resource.kind)
}

async fn rollout_of(
    client: &Client,
    target: &Target,
) -> Result<(ApiResource, String, Option<RolloutStatus>)> {
    let (resource, name) = resolve(client, &target.template).await?;
    let binding = Api::<ResourceBinding>::namespaced(client.clone(), &target.namespace)
        .get_opt(&binding_name(&resource, &name))
        .await?;
    let Some(binding) = binding else {
        bail!(
            "{} {}/{} has no ResourceBinding: no policy selects it",
            resource.kind,
            target.namespace,
            name
        );
    };
    Ok((resource, name, binding.status.and_then(|s| s.rollout)))
}

/// The `rollout status` text.
pub fn describe(status: &RolloutStatus) -> String {
    let mut out = format!(
        "revision {} (stable {}): {:?}, wave {} of {}{}\n",
        status.revision,
        status.stable_revision,
        status.phase,
        (status.wave + 1).min(status.waves),
        status.waves,
        status
            .wave_name
            .as_ref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default()
    );
    if let Some(reason) = &status.pause_reason {
        out.push_str(&format!("paused: {reason}\n"));
    }
    if !status.waiting_for.is_empty() {
        out.push_str(&format!("waiting for: {}\n", status.waiting_for.join(", ")));
    }
    if let Some(failed) = status.failed_revision {
        out.push_str(&format!("failed revision: {failed}\n"));
    }
    if !status.message.is_empty() {
        out.push_str(&format!("{}\n", status.message));
    }
    out.push_str("  CLUSTER   WAVE   REVISION   RUNNING\n");
    for cluster in &status.clusters {
        out.push_str(&format!(
            "  {:<9} {:<6} {:<10} {}\n",
            cluster.name,
            cluster.wave + 1,
            cluster.revision,
            cluster
                .running
                .map(|r| r.to_string())
                .unwrap_or_else(|| "-".into())
        ));
    }
    for (i, measurement) in status.analysis.iter().enumerate() {
        let metrics: Vec<String> = measurement
            .metrics
            .iter()
            .map(|m| {
                format!(
                    "{} {:?}{}",
                    m.name,
                    m.values,
                    m.message
                        .as_ref()
                        .map(|x| format!(" ({x})"))
                        .unwrap_or_default()
                )
            })
            .collect();
        out.push_str(&format!(
            "  analysis {}: {} {}\n",
            i + 1,
            if measurement.passed {
                "passed"
            } else {
                "FAILED"
            },
            metrics.join(", ")
        ));
    }
    out
}

async fn status(target: &Target, watch: bool) -> Result<()> {
    let client = connect(&target.client).await?;
    let mut last = String::new();
    loop {
        let (resource, name, status) = rollout_of(&client, target).await?;
        let Some(status) = status else {
            bail!(
                "{} {}/{} has no rollout: its policy has no spec.rollout",
                resource.kind,
                target.namespace,
                name
            );
        };
        let text = describe(&status);
        if text != last {
            print!("{text}");
            if watch {
                println!();
            }
            last = text;
        }
        let over = matches!(
            status.phase,
            RolloutPhase::Completed | RolloutPhase::RolledBack | RolloutPhase::Aborted
        );
        if !watch || over {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn command(target: &Target, verb: &str) -> Result<()> {
    let client = connect(&target.client).await?;
    let (resource, name, status) = rollout_of(&client, target).await?;
    if status.is_none() {
        bail!(
            "{} {}/{} has no rollout: its policy has no spec.rollout",
            resource.kind,
            target.namespace,
            name
        );
    }
    let id = jiff::Timestamp::now().as_nanosecond().to_string();
    let api = Api::<DynamicObject>::namespaced_with(client, &target.namespace, &resource);
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION_ROLLOUT_COMMAND: format!("{verb} {id}")}}})),
    )
    .await
    .with_context(|| format!("annotating {} {}/{name}", resource.kind, target.namespace))?;
    println!(
        "{verb}: asked the hub ({} {}/{name}); `bulkhead rollout status` shows when it is done",
        resource.kind, target.namespace
    );
    Ok(())
}

async fn revisions(
    client: &Client,
    target: &Target,
    resource: &ApiResource,
    name: &str,
) -> Result<Vec<ControllerRevision>> {
    let label = crate::hub::federation::copies::binding_label(
        &target.namespace,
        &binding_name(resource, name),
    );
    let mut list = Api::<ControllerRevision>::namespaced(client.clone(), &target.namespace)
        .list(&ListParams::default().labels(&format!("{LABEL_REVISION_OF}={label}")))
        .await?
        .items;
    list.sort_by_key(|r| r.revision);
    Ok(list)
}

async fn history(target: &Target) -> Result<()> {
    let client = connect(&target.client).await?;
    let (resource, name, status) = rollout_of(&client, target).await?;
    let list = revisions(&client, target, &resource, &name).await?;
    println!("REVISION   CREATED                  NOTE");
    for revision in list {
        let note = match &status {
            Some(s)
                if s.revision == revision.revision && s.stable_revision == revision.revision =>
            {
                "current, stable"
            }
            Some(s) if s.revision == revision.revision => "current",
            Some(s) if s.stable_revision == revision.revision => "stable",
            Some(s) if s.failed_revision == Some(revision.revision) => "failed",
            _ => "",
        };
        println!(
            "{:<10} {:<24} {note}",
            revision.revision,
            revision
                .metadata
                .creation_timestamp
                .map(|t| t.0.to_string())
                .unwrap_or_default()
        );
    }
    Ok(())
}

async fn undo(target: &Target, to: Option<i64>) -> Result<()> {
    let client = connect(&target.client).await?;
    let (resource, name, status) = rollout_of(&client, target).await?;
    let to = to
        .or(status.as_ref().map(|s| s.stable_revision))
        .context("no rollout recorded: give --to-revision")?;
    let list = revisions(&client, target, &resource, &name).await?;
    let Some(revision) = list.into_iter().find(|r| r.revision == to) else {
        bail!("revision {to} is not kept (see `bulkhead rollout history`)");
    };
    let content = revision.data.context("the revision has no data")?.0;
    let api = Api::<DynamicObject>::namespaced_with(client, &target.namespace, &resource);
    let current = api.get(&name).await?;
    // Every top-level field of the revision replaces the template's (its metadata
    // stays, and its replica count: a scale is no part of a revision).
    let mut patch = vec![];
    for (field, value) in content.as_object().into_iter().flatten() {
        if matches!(
            field.as_str(),
            "apiVersion" | "kind" | "metadata" | "status"
        ) {
            continue;
        }
        let mut value = value.clone();
        if field == "spec"
            && let Some(replicas) = current.data["spec"].get("replicas")
        {
            value["replicas"] = replicas.clone();
        }
        patch.push(json!({"op": "add", "path": format!("/{field}"), "value": value}));
    }
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Json::<Value>(serde_json::from_value(Value::Array(patch))?),
    )
    .await
    .with_context(|| {
        format!(
            "putting {} {}/{name} back to revision {to}",
            resource.kind, target.namespace
        )
    })?;
    println!(
        "{} {}/{name}: back to the content of revision {to}; it is rolled out like any change",
        resource.kind, target.namespace
    );
    Ok(())
}
