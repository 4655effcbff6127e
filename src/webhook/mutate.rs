//! Defaulting and tenant injection, as JSON patches computed from the incoming object.

use serde_json::{Value, json};

use super::tenants::TenantRules;
use crate::api::LABEL_TENANT;

/// Escapes a JSON-pointer token (`/` and `~`).
fn token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn is_unset(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

/// Patch operations for a MyDatabase: the tenant's defaults for an unset image and
/// storage class, and the tenant label.
pub fn mydatabase(object: &Value, tenant: Option<(&str, &TenantRules)>) -> Vec<Value> {
    let mut ops = vec![];
    let Some((tenant, rules)) = tenant else {
        return ops;
    };
    // A spec that is not an object gets no defaults: a patch into it could not apply, and
    // the schema validation after this webhook rejects it with its own message.
    if !object["spec"].is_object() {
        return tenant_label(object, tenant);
    }
    if let Some(image) = &rules.defaults.image
        && is_unset(&object["spec"]["image"])
    {
        ops.push(json!({"op": "add", "path": "/spec/image", "value": image}));
    }
    if let Some(class) = &rules.defaults.storage_class_name
        && is_unset(&object["spec"]["storage"]["storageClassName"])
    {
        if object["spec"]["storage"].is_object() {
            ops.push(
                json!({"op": "add", "path": "/spec/storage/storageClassName", "value": class}),
            );
        } else {
            ops.push(json!({"op": "add", "path": "/spec/storage", "value": {"size": "1Gi", "storageClassName": class}}));
        }
    }
    ops.extend(tenant_label(object, tenant));
    ops
}

fn tenant_label(object: &Value, tenant: &str) -> Vec<Value> {
    if object["metadata"]["labels"][LABEL_TENANT].as_str() == Some(tenant) {
        return vec![];
    }
    if object["metadata"]["labels"].is_object() {
        vec![
            json!({"op": "add", "path": format!("/metadata/labels/{}", token(LABEL_TENANT)), "value": tenant}),
        ]
    } else {
        vec![json!({"op": "add", "path": "/metadata/labels", "value": {LABEL_TENANT: tenant}})]
    }
}

/// Narrows `current` to `allowed`: the allowed list when nothing was asked, else the
/// intersection. Err when nothing of what was asked is allowed.
fn narrow(current: &[String], allowed: &[String]) -> Result<Vec<String>, Vec<String>> {
    if allowed.is_empty() {
        return Ok(current.to_vec());
    }
    if current.is_empty() {
        return Ok(allowed.to_vec());
    }
    let kept: Vec<String> = current
        .iter()
        .filter(|c| allowed.contains(c))
        .cloned()
        .collect();
    if kept.is_empty() {
        Err(current.to_vec())
    } else {
        Ok(kept)
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Patch operations narrowing a PropagationPolicy's clusterAffinity to its tenant's
/// allowed clusters and zones, or a denial naming the tenant and the rule.
pub fn policy(
    object: &str,
    policy: &Value,
    tenant: Option<(&str, &TenantRules)>,
) -> Result<Vec<Value>, String> {
    let Some((tenant, rules)) = tenant else {
        return Ok(vec![]);
    };
    if (rules.allowed_clusters.is_empty() && rules.allowed_zones.is_empty())
        || !policy["spec"].is_object()
    {
        // Nothing to narrow, or a spec the schema validation after this webhook rejects.
        return Ok(tenant_label(policy, tenant));
    }
    let affinity = &policy["spec"]["placement"]["clusterAffinity"];
    let clusters = narrow(&strings(&affinity["clusterNames"]), &rules.allowed_clusters).map_err(|asked| {
        format!(
            "{object}: spec.placement.clusterAffinity.clusterNames {asked:?} are all outside tenant {tenant}'s rule allowedClusters {:?}; name at least one allowed cluster, or leave clusterNames empty to get all of them",
            rules.allowed_clusters
        )
    })?;
    let zones = narrow(&strings(&affinity["zones"]), &rules.allowed_zones).map_err(|asked| {
        format!(
            "{object}: spec.placement.clusterAffinity.zones {asked:?} are all outside tenant {tenant}'s rule allowedZones {:?}; name at least one allowed zone, or leave zones empty to get all of them",
            rules.allowed_zones
        )
    })?;
    let mut narrowed = if affinity.is_object() {
        affinity.clone()
    } else {
        json!({})
    };
    if !clusters.is_empty() {
        narrowed["clusterNames"] = json!(clusters);
    }
    if !zones.is_empty() {
        narrowed["zones"] = json!(zones);
    }
    let mut ops = vec![];
    if &narrowed != affinity {
        if policy["spec"]["placement"].is_object() {
            ops.push(
                json!({"op": "add", "path": "/spec/placement/clusterAffinity", "value": narrowed}),
            );
        } else {
            ops.push(json!({"op": "add", "path": "/spec/placement", "value": {"clusterAffinity": narrowed}}));
        }
    }
    ops.extend(tenant_label(policy, tenant));
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(object: &Value, ops: Vec<Value>) -> Value {
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
        let mut out = object.clone();
        json_patch::patch(&mut out, &patch).unwrap();
        out
    }

    fn rules() -> TenantRules {
        super::super::tenants::parse_rules(
            "allowedClusters: [east, west]\nallowedZones: [zone-a, zone-b]\ndefaults: {image: registry.local/postgres, storageClassName: fast}",
        )
        .unwrap()
    }

    #[test]
    fn mydatabase_gets_tenant_defaults_and_label_only_when_unset() {
        let db =
            json!({"metadata": {"name": "a"}, "spec": {"replicas": 1, "storage": {"size": "1Gi"}}});
        let out = apply(&db, mydatabase(&db, Some(("team-a", &rules()))));
        assert_eq!(out["spec"]["image"], "registry.local/postgres");
        assert_eq!(out["spec"]["storage"]["storageClassName"], "fast");
        assert_eq!(out["metadata"]["labels"][LABEL_TENANT], "team-a");

        let explicit = json!({"metadata": {"name": "a", "labels": {"x": "y"}}, "spec": {"image": "mine", "storage": {"size": "1Gi", "storageClassName": "slow"}}});
        let out = apply(&explicit, mydatabase(&explicit, Some(("team-a", &rules()))));
        assert_eq!(out["spec"]["image"], "mine");
        assert_eq!(out["spec"]["storage"]["storageClassName"], "slow");
        assert_eq!(out["metadata"]["labels"]["x"], "y");
        assert_eq!(out["metadata"]["labels"][LABEL_TENANT], "team-a");
        assert!(mydatabase(&db, None).is_empty(), "no tenant, no change");
    }

    #[test]
    fn policy_affinity_is_narrowed_to_the_tenant() {
        let open = json!({"metadata": {"name": "p"}, "spec": {"placement": {}}});
        let out = apply(
            &open,
            policy("p", &open, Some(("team-a", &rules()))).unwrap(),
        );
        assert_eq!(
            out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
            json!(["east", "west"])
        );
        assert_eq!(
            out["spec"]["placement"]["clusterAffinity"]["zones"],
            json!(["zone-a", "zone-b"])
        );

        let asked = json!({"metadata": {"name": "p"}, "spec": {"placement": {"clusterAffinity": {"clusterNames": ["west", "north"]}}}});
        let out = apply(
            &asked,
            policy("p", &asked, Some(("team-a", &rules()))).unwrap(),
        );
        assert_eq!(
            out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
            json!(["west"])
        );

        let outside = json!({"metadata": {"name": "p"}, "spec": {"placement": {"clusterAffinity": {"clusterNames": ["north"]}}}});
        let denial = policy(
            "PropagationPolicy shop/p",
            &outside,
            Some(("team-a", &rules())),
        )
        .unwrap_err();
        assert!(
            denial.contains("tenant team-a") && denial.contains("allowedClusters"),
            "{denial}"
        );
    }

    #[test]
    fn label_keys_with_slashes_are_escaped() {
        assert_eq!(
            token("federation.example.com/tenant"),
            "federation.example.com~1tenant"
        );
    }
}
