//! Access reviews: what the process's own credentials may do, asked of the API server
//! before depending on it (`bulkhead join` checks its admin credentials; the hub checks
//! each template kind before watching it).

use anyhow::{Context, Result};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

/// The attributes that are denied, or an error when access reviews cannot be made.
pub async fn denied(client: &Client, wanted: Vec<ResourceAttributes>) -> Result<Vec<String>> {
    let api = Api::<SelfSubjectAccessReview>::all(client.clone());
    let mut denied = vec![];
    for attributes in wanted {
        let what = format!(
            "{} {}{}{}{}",
            attributes.verb.as_deref().unwrap_or_default(),
            attributes.resource.as_deref().unwrap_or_default(),
            attributes
                .subresource
                .as_deref()
                .map(|s| format!("/{s}"))
                .unwrap_or_default(),
            attributes
                .group
                .as_deref()
                .filter(|g| !g.is_empty())
                .map(|g| format!(".{g}"))
                .unwrap_or_default(),
            attributes
                .namespace
                .as_deref()
                .map(|n| format!(" in {n}"))
                .unwrap_or_default(),
        );
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(attributes),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .context("creating a SelfSubjectAccessReview (are the credentials valid?)")?;
        if !answer.status.is_some_and(|s| s.allowed) {
            denied.push(what);
        }
    }
    Ok(denied)
}
