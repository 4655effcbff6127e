//! The hub's side of a MyDatabase with replica clusters that talks to members: which
//! cluster holds the primary ([`replica_clusters`](super::replica_clusters)), and the
//! primary cluster's `<name>-instance` and `<name>-app` Secrets copied to every replica
//! cluster before its copy. A replica cluster's data is a copy of the primary cluster's,
//! so its instances need the same passwords; its agent would otherwise make its own.
//!
//! A replica cluster that already holds those Secrets with other values (a database of
//! its own ran there) is never overwritten: its copy is not applied, and the binding says
//! which Secrets to remove to make it a replica cluster.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

use crate::api::mydatabase::{AbortedSwitchover, DisasterPromotion, PlannedSwitchover};
use crate::api::resource_binding::TargetCluster;
use crate::api::{ANNOTATION_PROMOTE, ANNOTATION_SWITCHOVER_STARTED, ANNOTATION_SWITCHOVER_TO};
use crate::error::{ApiErrorKind, classify};
use crate::hub::federation::context::{Context, full_template};
use crate::hub::federation::placement::ClusterView;
use crate::hub::federation::propagation::ReplicaClusters;
use crate::hub::federation::replica_clusters::{
    Switchover, aborted_recorded, demoted_term, enabled, in_flight, lost_cluster, primary_cluster,
    promotion_refused, switchover,
};
use crate::hub::federation::scheduler::DesiredBinding;
use crate::hub::federation::writer::{ObjectKey, create_namespace, short};

/// Annotation on a Secret the hub copied to a replica cluster: the cluster it came from.
pub const ANNOTATION_COPIED_FROM: &str = "federation.example.com/copied-from";

/// The replica-cluster setup of a hub MyDatabase, with the Secrets copied where they are
/// missing; None for a database whose copies are independent, or placed nowhere yet.
/// Whether a disaster promotion that would be accepted waits: the lost cluster's agent
/// keeps its primaries writable until its Lease has been stale a full lease, so the
/// promotion waits until then, or it could make two primaries. The ask stays, nothing is
/// recorded, and the template is looked at again when the wait is over.
fn waits_for_the_fence(
    context: &Context,
    key: &ObjectKey,
    lost: &str,
    to: &str,
    refused: bool,
) -> bool {
    if refused {
        return false;
    }
    let Some(left) = context.state.evidence.may_still_write(lost) else {
        return false;
    };
    tracing::info!(namespace = %key.namespace, name = %key.name, %lost, %to, wait = ?left, "the disaster promotion waits until the lost cluster has certainly fenced itself (a full lease after the last renewal of its fencing Lease that succeeded)");
    context.queue.add_after(key.clone(), left);
    true
}

pub(super) async fn setup(
    context: &Context,
    key: &ObjectKey,
    resource: &ApiResource,
    template: &DynamicObject,
    desired: &DesiredBinding,
    views: &[ClusterView],
) -> Option<ReplicaClusters> {
    let mut value = full_template(template, context.bodies.get(key).as_deref());
    if !enabled(&value) {
        return None;
    }
    // Whether a member's copies are listed is read before its copy: one listed only
    // after that read counts as not listed (its copy may have been missed).
    let mut listed = BTreeSet::new();
    let mut copies: Vec<(String, _)> = vec![];
    for view in views {
        let Some(member) = context.caches.member(&view.name) else {
            continue;
        };
        if member.synced(resource) {
            listed.insert(view.name.clone());
        }
        if let Some(copy) = member.get(resource, &key.namespace, &key.name) {
            copies.push((view.name.clone(), copy));
        }
    }
    let order = policy_order(context, desired);
    let targets = &desired.spec.clusters;
    let primary = match primary_cluster(&value, targets, copies.iter().map(|(_, c)| &**c), &order) {
        Ok(None) => return None,
        Ok(Some(primary)) => primary,
        Err(why) => {
            return Some(ReplicaClusters {
                primary: Err(why),
                credentials: BTreeMap::new(),
                switchover: Switchover::None,
                switchover_started: None,
                term: 1,
                demoted_term: 1,
                listed,
            });
        }
    };
    let copy = |cluster: &str| {
        copies
            .iter()
            .find(|(name, _)| name == cluster)
            .map(|(_, c)| &**c)
    };
    let not_ready = |cluster: &str| {
        if !views.iter().any(|v| v.name == cluster && v.ready) {
            return Some("unreachable".to_string());
        }
        context.doubt(cluster)
    };
    let now = jiff::Timestamp::now();
    let mut term = value["status"]["primaryTerm"].as_u64().unwrap_or(1).max(1);
    let mut primary = primary;
    // A disaster promotion asked for (`bulkhead promote --accept-data-loss`): recorded
    // with the raised term before any copy is written under it, then the ask is removed.
    let promote = value["metadata"]["annotations"][ANNOTATION_PROMOTE]
        .as_str()
        .filter(|to| !to.is_empty())
        .map(str::to_string);
    let promote = promote.as_deref();
    // The cluster a promotion takes the primary from: the primary cluster, or the target
    // of a switchover that told it to promote.
    let lost = lost_cluster(&value, &primary).to_string();
    if promote == Some(primary.as_str()) && lost == primary {
        // Recorded already (the ask outlived its record): only the ask goes.
        if let Err(error) = remove_promote_ask(context, key, resource, template).await {
            tracing::warn!(namespace = %key.namespace, name = %key.name, %error, "cannot remove the promotion ask; tried again");
        }
    } else if let Some(to) = promote
        && !waits_for_the_fence(
            context,
            key,
            &lost,
            to,
            promotion_refused(&value, &primary, to, targets, &copy, &not_ready).is_some(),
        )
    {
        let refused = promotion_refused(&value, &primary, to, targets, &copy, &not_ready);
        let mut record = DisasterPromotion {
            from: lost.clone(),
            to: to.to_string(),
            time: now.to_string(),
            term: term + 1,
            refused: String::new(),
        };
        let fields = match &refused {
            // A switchover whose target was told to promote ends here: the target, lost,
            // rejoins under the raised term like a lost primary cluster.
            None => serde_json::json!({
                "primaryCluster": to,
                "primaryTerm": term + 1,
                "promotion": record,
                "abortedSwitchover": null,
                "switchover": null,
            }),
            Some(why) => {
                record.term = 0;
                record.refused = why.clone();
                serde_json::json!({"promotion": record})
            }
        };
        match patch_template_status(context, key, resource, template, fields.clone()).await {
            Ok(()) => {
                match &refused {
                    None => {
                        tracing::warn!(namespace = %key.namespace, name = %key.name, from = %lost, %to, term = term + 1, "disaster promotion recorded: what the lost cluster had not sent is lost");
                        primary = to.to_string();
                        term += 1;
                        // The rest of this reconcile decides from what is recorded now.
                        if let Some(fields) = fields.as_object() {
                            for (field, recorded) in fields {
                                value["status"][field] = recorded.clone();
                            }
                        }
                    }
                    Some(why) => {
                        tracing::warn!(namespace = %key.namespace, name = %key.name, %to, %why, "disaster promotion refused");
                    }
                }
                if let Err(error) = remove_promote_ask(context, key, resource, template).await {
                    tracing::warn!(namespace = %key.namespace, name = %key.name, %error, "cannot remove the promotion ask; tried again");
                }
            }
            Err(error) => {
                tracing::warn!(namespace = %key.namespace, name = %key.name, %error, "cannot record the disaster promotion; tried again");
            }
        }
    }
    let database = format!("{}/{}", key.namespace, key.name);
    let lacking = |term: u64| {
        let members = views.iter().map(|v| v.name.as_str());
        context
            .state
            .evidence
            .lacking_term(members, &database, term)
    };
    let mut switchover = switchover(
        &value,
        &primary,
        targets,
        &order,
        &copy,
        &not_ready,
        &lacking,
        now,
        context.switchover_deadline,
    );
    if switchover != Switchover::None {
        let marks = |cluster: &str| {
            copy(cluster).map(|c| {
                let a = c.annotations();
                (
                    a.get(ANNOTATION_SWITCHOVER_TO).cloned(),
                    a.get(ANNOTATION_SWITCHOVER_STARTED).cloned(),
                )
            })
        };
        tracing::debug!(namespace = %key.namespace, name = %key.name, %primary, stage = ?switchover, primary_copy = ?marks(&primary), "switchover");
    }
    match &switchover {
        Switchover::RaisingTerm { to, term: raised } => {
            // Recorded before any copy or Lease carries it; the old primary cluster's copy
            // keeps the term it was written under until it follows the new one.
            let record = PlannedSwitchover {
                from: primary.clone(),
                to: to.clone(),
                started: copy(&primary)
                    .and_then(|c| c.annotations().get(ANNOTATION_SWITCHOVER_STARTED).cloned())
                    .unwrap_or_default(),
                time: now.to_string(),
                term: *raised,
                promoting: String::new(),
            };
            let fields = serde_json::json!({"primaryTerm": raised, "switchover": record});
            match patch_template_status(context, key, resource, template, fields).await {
                Ok(()) => {
                    tracing::info!(namespace = %key.namespace, name = %key.name, from = %primary, %to, term = raised, "switchover: the new primary cluster has every write; primary term raised");
                    term = *raised;
                    switchover = Switchover::RecordingTerm {
                        to: to.clone(),
                        term: *raised,
                        lacking: lacking(*raised),
                    };
                }
                Err(error) => {
                    tracing::warn!(namespace = %key.namespace, name = %key.name, %error, "cannot record the switchover's primary term; tried again");
                }
            }
        }
        Switchover::Promoting { to }
            if in_flight(&value, &primary).is_some_and(|record| !record.promoting) =>
        {
            // Recorded before the new primary cluster is told: from then on the switchover
            // goes forward, even for a hub that restarts and cannot see that cluster.
            let fields = serde_json::json!({"switchover": {"promoting": now.to_string()}});
            match patch_template_status(context, key, resource, template, fields).await {
                Ok(()) => {
                    tracing::info!(namespace = %key.namespace, name = %key.name, from = %primary, %to, term, "switchover: every member holds the raised term; the new primary cluster is told to promote");
                }
                Err(error) => {
                    tracing::warn!(namespace = %key.namespace, name = %key.name, %error, "cannot record that the new primary cluster is told to promote; it is not told yet");
                    switchover = Switchover::RecordingTerm {
                        to: to.clone(),
                        term,
                        lacking: vec![],
                    };
                }
            }
        }
        Switchover::Done { to } => {
            // The new primary cluster runs its primary: recorded before anything follows it.
            match record_primary_cluster(context, key, resource, template, to).await {
                Ok(()) => {
                    tracing::info!(namespace = %key.namespace, name = %key.name, from = %primary, to = %to, "switchover done: the primary cluster is recorded");
                    primary = to.clone();
                    switchover = Switchover::None;
                }
                Err(error) => {
                    tracing::warn!(namespace = %key.namespace, name = %key.name, %error, "cannot record the new primary cluster; tried again");
                }
            }
        }
        Switchover::Aborting { to, .. } => {
            // Recorded before the old primary cluster takes writes again: otherwise the
            // next reconcile would start the same switchover at once.
            let message = switchover.describe(&primary).unwrap_or_default();
            if !aborted_recorded(&value, &primary, to) {
                let record = AbortedSwitchover {
                    from: primary.clone(),
                    to: to.clone(),
                    time: now.to_string(),
                    message: message.clone(),
                };
                // Its raised term stays; the record of it goes, so that nothing takes
                // this switchover for one under way.
                match patch_template_status(
                    context,
                    key,
                    resource,
                    template,
                    serde_json::json!({"abortedSwitchover": record, "switchover": null}),
                )
                .await
                {
                    Ok(()) => {
                        tracing::warn!(namespace = %key.namespace, name = %key.name, %message, "switchover aborted");
                    }
                    Err(error) => {
                        tracing::warn!(namespace = %key.namespace, name = %key.name, %error, "cannot record the aborted switchover; the old primary cluster stays read-only until it is");
                        switchover = Switchover::Demoting { to: to.clone() };
                    }
                }
            }
        }
        _ => {}
    }
    let aborted_to = value["status"]["abortedSwitchover"]["to"].as_str();
    if aborted_to.is_some()
        && value["spec"]["topology"]["primaryCluster"].as_str() != aborted_to
        && let Err(error) = patch_template_status(
            context,
            key,
            resource,
            template,
            serde_json::json!({"abortedSwitchover": null}),
        )
        .await
    {
        tracing::warn!(namespace = %key.namespace, name = %key.name, %error, "cannot clear the aborted switchover's record; tried again");
    }
    // The start is stamped once: as the copy shows it, as recorded with the raised term,
    // or as this hub stamped it (its copy cache may not show its own write yet).
    let switchover_started = {
        let mut starts = context
            .switchover_starts
            .lock()
            .expect("switchover starts lock");
        match switchover.started_to() {
            None => {
                starts.remove(key);
                None
            }
            Some(to) => {
                let started = copy(&primary)
                    .filter(|c| {
                        c.annotations()
                            .get(ANNOTATION_SWITCHOVER_TO)
                            .map(String::as_str)
                            == Some(to)
                    })
                    .and_then(|c| c.annotations().get(ANNOTATION_SWITCHOVER_STARTED).cloned())
                    .or_else(|| {
                        in_flight(&value, &primary)
                            .filter(|record| record.to == to && !record.started.is_empty())
                            .map(|record| record.started.to_string())
                    })
                    .or_else(|| {
                        starts
                            .get(key)
                            .filter(|(stamped_to, _)| stamped_to == to)
                            .map(|(_, started)| started.clone())
                    })
                    .unwrap_or_else(|| now.round(jiff::Unit::Second).unwrap_or(now).to_string());
                starts.insert(key.clone(), (to.to_string(), started.clone()));
                Some(started)
            }
        }
    };
    let credentials = copy_credentials(context, key, &primary, targets, views).await;
    // The old primary cluster's copy keeps the term it was written under while a
    // switchover moves the primary away: before the raise, as far as the hub knows.
    let demoted_term = demoted_term(&value, &primary, copy(&primary), term);
    Some(ReplicaClusters {
        primary: Ok(primary),
        credentials,
        switchover,
        switchover_started,
        term,
        demoted_term,
        listed,
    })
}

/// Removes the `federation.example.com/promote` ask from the hub template (its outcome is
/// in `status.promotion`).
async fn remove_promote_ask(
    context: &Context,
    key: &ObjectKey,
    resource: &ApiResource,
    template: &DynamicObject,
) -> Result<(), kube::Error> {
    let api = Api::<DynamicObject>::namespaced_with(context.hub.clone(), &key.namespace, resource);
    let written = api
        .patch(
            &template.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({
                "metadata": {"annotations": {ANNOTATION_PROMOTE: null}}
            })),
        )
        .await?;
    context.count_write("template");
    context.remember_template(key, written);
    Ok(())
}

/// Writes `status.primaryCluster` on the hub template, at once (not with the rest of the
/// status, which waits for the copies to settle): the next reconcile must find it.
async fn record_primary_cluster(
    context: &Context,
    key: &ObjectKey,
    resource: &ApiResource,
    template: &DynamicObject,
    cluster: &str,
) -> Result<(), kube::Error> {
    patch_template_status(
        context,
        key,
        resource,
        template,
        serde_json::json!({"primaryCluster": cluster}),
    )
    .await
}

/// Merges `fields` into the hub template's status at once, and remembers what was written.
async fn patch_template_status(
    context: &Context,
    key: &ObjectKey,
    resource: &ApiResource,
    template: &DynamicObject,
    fields: serde_json::Value,
) -> Result<(), kube::Error> {
    let api = Api::<DynamicObject>::namespaced_with(context.hub.clone(), &key.namespace, resource);
    let written = api
        .patch_status(
            &template.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({ "status": fields })),
        )
        .await?;
    context.count_write("template_status");
    context.remember_template(key, written);
    Ok(())
}

/// The policy's `clusterAffinity.clusterNames`, the order the primary cluster is chosen in.
fn policy_order(context: &Context, desired: &DesiredBinding) -> Vec<String> {
    let Some(reference) = desired.spec.policy.as_ref() else {
        return vec![];
    };
    let (policies, cluster_policies) = context.policies();
    let affinity = if reference.kind == "ClusterPropagationPolicy" {
        cluster_policies
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(reference.name.as_str()))
            .and_then(|p| p.spec.placement.cluster_affinity.as_ref())
            .map(|a| a.cluster_names.clone())
    } else {
        policies
            .iter()
            .find(|p| {
                p.metadata.name.as_deref() == Some(reference.name.as_str())
                    && p.metadata.namespace == reference.namespace
            })
            .and_then(|p| p.spec.placement.cluster_affinity.as_ref())
            .map(|a| a.cluster_names.clone())
    };
    affinity.unwrap_or_default()
}

/// For every replica cluster: its Secrets hold the primary cluster's (Ok), or why not.
async fn copy_credentials(
    context: &Context,
    key: &ObjectKey,
    primary: &str,
    targets: &[TargetCluster],
    views: &[ClusterView],
) -> BTreeMap<String, Result<(), String>> {
    let mut answers = BTreeMap::new();
    let mut source: Option<Result<Vec<Secret>, String>> = None;
    for target in targets.iter().filter(|t| t.name != primary) {
        let cluster = target.name.as_str();
        let memo = (key.clone(), cluster.to_string());
        let done = context
            .replica_credentials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&memo)
            .is_some_and(|from| from == primary);
        if done {
            answers.insert(cluster.to_string(), Ok(()));
            continue;
        }
        if !views.iter().any(|v| v.name == cluster && v.ready) {
            answers.insert(
                cluster.to_string(),
                Err(format!(
                    "a replica cluster of {primary}: {cluster} is unreachable; {primary}'s Secrets are copied here when it returns"
                )),
            );
            continue;
        }
        if source.is_none() {
            source = Some(read_source(context, key, primary).await);
        }
        let answer = match source.as_ref().expect("read just above") {
            Err(why) => Err(why.clone()),
            Ok(secrets) => match member_client(context, cluster) {
                None => Err(format!("{cluster} has no client yet")),
                Some(client) => copy_to(client, key, primary, cluster, secrets).await,
            },
        };
        if answer.is_ok() {
            context
                .replica_credentials
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(memo, primary.to_string());
        }
        answers.insert(cluster.to_string(), answer);
    }
    answers
}

fn member_client(context: &Context, cluster: &str) -> Option<Client> {
    context.state.registry.get(cluster)?.client().cloned()
}

fn secret_names(database: &str) -> [String; 2] {
    [
        crate::agent::builders::instance_secret_name(database),
        crate::agent::builders::app_secret_name(database),
    ]
}

/// The primary cluster's two Secrets, as its agent made them.
async fn read_source(
    context: &Context,
    key: &ObjectKey,
    primary: &str,
) -> Result<Vec<Secret>, String> {
    let client = member_client(context, primary)
        .ok_or_else(|| format!("the primary cluster {primary} has no client yet"))?;
    let api: Api<Secret> = Api::namespaced(client, &key.namespace);
    let mut secrets = vec![];
    for name in secret_names(&key.name) {
        match api.get_opt(&name).await {
            Ok(Some(secret)) if secret.data.as_ref().is_some_and(|d| !d.is_empty()) => {
                secrets.push(secret)
            }
            Ok(_) => {
                return Err(format!(
                    "a replica cluster of {primary}: waiting for {primary}'s agent to make the Secret {}/{name}",
                    key.namespace
                ));
            }
            Err(error) => {
                return Err(format!(
                    "a replica cluster of {primary}: cannot read the Secret {}/{name} in {primary}: {}",
                    key.namespace,
                    short(&error)
                ));
            }
        }
    }
    Ok(secrets)
}

/// Creates the primary cluster's Secrets in `cluster` where they are missing; one that
/// holds other values is left as it is, and the answer says how to resolve it.
async fn copy_to(
    client: Client,
    key: &ObjectKey,
    primary: &str,
    cluster: &str,
    secrets: &[Secret],
) -> Result<(), String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &key.namespace);
    for source in secrets {
        let name = source.metadata.name.clone().unwrap_or_default();
        let existing = match api.get_opt(&name).await {
            Ok(existing) => existing,
            Err(error) if classify(&error) == ApiErrorKind::NotFound => None,
            Err(error) => {
                return Err(format!(
                    "a replica cluster of {primary}: cannot read the Secret {}/{name} in {cluster}: {}",
                    key.namespace,
                    short(&error)
                ));
            }
        };
        match existing {
            Some(existing) if existing.data == source.data => continue,
            Some(_) => {
                return Err(format!(
                    "{cluster} already holds the Secret {ns}/{name} with other passwords (a database of its own ran there), so it cannot become a replica cluster of {primary}: its copy is left as it is. To make it one, save what its database holds if it matters, then delete the Secrets {ns}/{db}-instance and {ns}/{db}-app in {cluster} (and the MyDatabase {ns}/{db} there, if any); the hub then copies {primary}'s and creates the copy anew",
                    ns = key.namespace,
                    db = key.name,
                ));
            }
            None => {}
        }
        let copy = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(key.namespace.clone()),
                labels: source.metadata.labels.clone(),
                annotations: Some(BTreeMap::from([(
                    ANNOTATION_COPIED_FROM.to_string(),
                    primary.to_string(),
                )])),
                ..Default::default()
            },
            type_: source.type_.clone(),
            data: source.data.clone(),
            ..Default::default()
        };
        let mut created = api.create(&PostParams::default(), &copy).await;
        if matches!(&created, Err(error) if classify(error) == ApiErrorKind::NotFound) {
            // The namespace is not there yet: the copy would have made it.
            if let Err(error) = create_namespace(client.clone(), &key.namespace).await {
                return Err(format!(
                    "a replica cluster of {primary}: cannot create the namespace {} in {cluster}: {}",
                    key.namespace,
                    short(&error)
                ));
            }
            created = api.create(&PostParams::default(), &copy).await;
        }
        match created {
            Ok(_) => {
                tracing::info!(cluster, namespace = %key.namespace, secret = %name, from = primary, "copied the primary cluster's Secret to a replica cluster");
            }
            // Made in the meantime (its agent, or another hub): compared next time.
            Err(error) => {
                return Err(format!(
                    "a replica cluster of {primary}: cannot create the Secret {}/{name} in {cluster}: {}",
                    key.namespace,
                    short(&error)
                ));
            }
        }
    }
    Ok(())
}
