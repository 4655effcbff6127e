//! Cleanups that outlive their namespace on the hub (`MemberCluster.status.pendingCleanups`).
//!
//! A template deleted during a partition keeps its cleanup finalizer until the cut-off
//! member is back, so the copy there is deleted by the one rule that deletes copies: the
//! template was deleted. When the template goes with its namespace, that finalizer would
//! keep the namespace `Terminating` for as long as the partition lasts. So once every copy
//! left to delete is in a member that is not Ready, and the namespace is being deleted,
//! the hub writes one row per such copy into that member's status and lets the template
//! (and its binding) go. When the member is back, the row is worked off as the finalizer
//! would have been, and removed.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ApiResource, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::api::MemberCluster;
use crate::api::member_cluster::PendingCleanup;
use crate::error::{ApiErrorKind, classify};

/// The field manager of `status.pendingCleanups`.
pub const FIELD_MANAGER: &str = "bulkhead-hub-cleanups";

/// Attempts of one read-modify-apply against concurrent writers of the same list.
const ATTEMPTS: usize = 5;

/// The template a row names, as the hub keys it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl<'a> Named<'a> {
    /// The template of kind `resource` at `namespace/name`.
    pub fn of(resource: &'a ApiResource, namespace: &'a str, name: &'a str) -> Self {
        Named {
            api_version: &resource.api_version,
            kind: &resource.kind,
            namespace,
            name,
        }
    }

    fn matches(&self, row: &PendingCleanup) -> bool {
        row.api_version == self.api_version
            && row.kind == self.kind
            && row.namespace == self.namespace
            && row.name == self.name
    }
}

/// The members that hold a row for `named`.
pub fn recorded(members: &[Arc<MemberCluster>], named: &Named<'_>) -> Vec<String> {
    members
        .iter()
        .filter(|m| {
            m.status
                .as_ref()
                .is_some_and(|s| s.pending_cleanups.iter().any(|row| named.matches(row)))
        })
        .map(|m| m.name_any())
        .collect()
}

/// Every row of every member: what the hub must look at again when it starts or a member
/// comes back.
pub fn all_rows(members: &[Arc<MemberCluster>]) -> Vec<PendingCleanup> {
    members
        .iter()
        .filter_map(|m| m.status.as_ref())
        .flat_map(|s| s.pending_cleanups.iter().cloned())
        .collect()
}

/// The clusters whose cleanup may be handed to their MemberCluster: every cluster still
/// pending, when none of them is Ready (a Ready member's copy is deleted now, as for any
/// template; its delete, or its listing, is what the template waits for). None when the
/// template must keep waiting.
pub fn handover(pending: &[String], ready: impl Fn(&str) -> bool) -> Option<Vec<String>> {
    if pending.is_empty() || pending.iter().any(|cluster| ready(cluster)) {
        return None;
    }
    let mut clusters = pending.to_vec();
    clusters.sort();
    clusters.dedup();
    Some(clusters)
}

/// Whether `namespace` on the hub is being deleted (or is already gone).
pub async fn namespace_going(hub: &Client, namespace: &str) -> Result<bool, kube::Error> {
    let found = Api::<Namespace>::all(hub.clone())
        .get_opt(namespace)
        .await?;
    Ok(found.is_none_or(|n| n.metadata.deletion_timestamp.is_some()))
}

/// `rows` with `add` in it (an existing row of the same template kept, with its time) and
/// without the rows `remove` matches.
fn merged(
    rows: &[PendingCleanup],
    add: Option<&PendingCleanup>,
    remove: Option<&Named<'_>>,
) -> Vec<PendingCleanup> {
    let mut out: Vec<PendingCleanup> = rows
        .iter()
        .filter(|row| !remove.is_some_and(|named| named.matches(row)))
        .cloned()
        .collect();
    if let Some(add) = add {
        let named = Named {
            api_version: &add.api_version,
            kind: &add.kind,
            namespace: &add.namespace,
            name: &add.name,
        };
        if !out.iter().any(|row| named.matches(row)) {
            out.push(add.clone());
        }
    }
    out
}

/// A row for the template `resource` `namespace/name` (uid `uid`), dated now.
pub fn row(
    resource: &ApiResource,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> PendingCleanup {
    PendingCleanup {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        template_uid: uid.map(str::to_string),
        since: Some(Time(jiff::Timestamp::now())),
    }
}

/// Adds `add` to, or removes the rows `remove` names from, `cluster`'s list: read, then
/// applied with the resourceVersion read, so a concurrent change of the list is read
/// again, never overwritten. Nothing is written when the list already says so.
pub async fn change(
    hub: &Client,
    cluster: &str,
    add: Option<&PendingCleanup>,
    remove: Option<&Named<'_>>,
) -> Result<(), kube::Error> {
    let api = Api::<MemberCluster>::all(hub.clone());
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some(member) = api.get_opt(cluster).await? else {
            // Unjoined meanwhile: its copies are unjoin's to clean up (or keep).
            return Ok(());
        };
        let rows = member
            .status
            .as_ref()
            .map(|s| s.pending_cleanups.clone())
            .unwrap_or_default();
        let wanted = merged(&rows, add, remove);
        if wanted == rows {
            return Ok(());
        }
        let body = json!({
            "apiVersion": "federation.example.com/v1alpha1",
            "kind": "MemberCluster",
            "metadata": {"name": cluster, "resourceVersion": member.resource_version()},
            "status": {"pendingCleanups": wanted},
        });
        match api
            .patch_status(
                cluster,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(error) if classify(&error) == ApiErrorKind::Conflict && attempt < ATTEMPTS => {}
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named_row(name: &str) -> PendingCleanup {
        PendingCleanup {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: "shop".into(),
            name: name.into(),
            template_uid: Some(format!("uid-{name}")),
            since: None,
        }
    }

    #[test]
    fn a_row_is_added_once_and_removed_by_its_template_alone() {
        let web = named_row("web");
        let api = named_row("api");
        let once = merged(&[], Some(&web), None);
        assert_eq!(once, vec![web.clone()]);
        // Added again (a retried handover): still one row, the first one kept.
        let mut later = web.clone();
        later.since = Some(Time(jiff::Timestamp::now()));
        assert_eq!(merged(&once, Some(&later), None), once);
        let both = merged(&once, Some(&api), None);
        assert_eq!(both.len(), 2);
        let removed = merged(
            &both,
            None,
            Some(&Named {
                api_version: "apps/v1",
                kind: "Deployment",
                namespace: "shop",
                name: "web",
            }),
        );
        assert_eq!(removed, vec![api]);
        // Another kind of the same name is another template.
        let config = merged(
            &both,
            None,
            Some(&Named {
                api_version: "v1",
                kind: "ConfigMap",
                namespace: "shop",
                name: "web",
            }),
        );
        assert_eq!(config, both);
    }

    #[test]
    fn a_cleanup_is_handed_over_only_when_every_pending_cluster_is_cut_off() {
        let ready = |cluster: &str| cluster == "west";
        assert_eq!(handover(&["east".into()], ready), Some(vec!["east".into()]));
        assert_eq!(
            handover(&["north".into(), "east".into(), "east".into()], ready),
            Some(vec!["east".into(), "north".into()])
        );
        // West is Ready: its copy is deleted now (or is being deleted); the template waits.
        assert_eq!(handover(&["east".into(), "west".into()], ready), None);
        // Nothing pending: nothing to hand over (the cleanup is done).
        assert_eq!(handover(&[], ready), None);
    }
}
