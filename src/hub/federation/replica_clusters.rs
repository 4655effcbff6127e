//! Replica clusters across the federation (`spec.topology.acrossClusters: ReplicaClusters`
//! on a hub MyDatabase, docs/mydatabase.md), pure: which member cluster holds the
//! primary, where the others stream from, and how far behind they are.
//!
//! The primary cluster is chosen once and then recorded twice: in an annotation on every
//! copy the hub applies (written with the copies themselves, so no copy acts on a choice
//! that is not recorded) and in the template's `status.primaryCluster`. A recorded choice
//! wins over `spec.topology.primaryCluster` and over the placement: moving the primary
//! with a changed field would leave two clusters that each believe they hold it.

use kube::api::DynamicObject;
use serde_json::Value;

use crate::api::ANNOTATION_PRIMARY_CLUSTER;
use crate::api::instance::parse_lsn;
use crate::api::mydatabase::ReplicaSource;
use crate::api::resource_binding::TargetCluster;

/// A hub MyDatabase (as JSON) asks for replica clusters, or has a recorded primary
/// cluster (which keeps its copies replica clusters).
pub fn enabled(template: &Value) -> bool {
    let topology = &template["spec"]["topology"];
    topology["acrossClusters"] == "ReplicaClusters"
        || topology["primaryCluster"].is_string()
        || template["status"]["primaryCluster"].is_string()
}

/// The primary cluster recorded on a copy.
pub fn recorded_on(copy: &DynamicObject) -> Option<&str> {
    copy.metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_PRIMARY_CLUSTER)
        .map(String::as_str)
        .filter(|c| !c.is_empty())
}

/// The cluster that holds the primary of a template with replica clusters: the one
/// recorded in its status, else on its copies, else `spec.topology.primaryCluster`, else
/// the first placed cluster in `order` (the policy's `clusterAffinity.clusterNames`), the
/// others by name. `Err` says why none can be chosen; `Ok(None)`: nothing is placed yet.
pub fn primary_cluster<'a>(
    template: &Value,
    targets: &[TargetCluster],
    copies: impl IntoIterator<Item = &'a DynamicObject>,
    order: &[String],
) -> Result<Option<String>, String> {
    if let Some(recorded) = template["status"]["primaryCluster"].as_str() {
        return Ok(Some(recorded.to_string()));
    }
    let mut on_copies: Vec<&str> = copies.into_iter().filter_map(recorded_on).collect();
    on_copies.sort_unstable();
    on_copies.dedup();
    match on_copies[..] {
        [] => {}
        [one] => return Ok(Some(one.to_string())),
        _ => {
            return Err(format!(
                "the copies record different primary clusters ({}); set status.primaryCluster on the hub template to the one that holds the primary",
                on_copies.join(", ")
            ));
        }
    }
    let placed: Vec<&str> = targets
        .iter()
        .filter(|t| t.replicas > 0)
        .map(|t| t.name.as_str())
        .collect();
    if let Some(named) = template["spec"]["topology"]["primaryCluster"].as_str() {
        if placed.contains(&named) {
            return Ok(Some(named.to_string()));
        }
        return Err(format!(
            "spec.topology.primaryCluster names {named}, which the placement does not include ({}); name one of those clusters, or place the database in {named}",
            if placed.is_empty() {
                "no cluster yet".to_string()
            } else {
                placed.join(", ")
            }
        ));
    }
    let mut ranked = placed;
    ranked.sort_by_key(|cluster| {
        (
            order
                .iter()
                .position(|o| o == cluster)
                .unwrap_or(usize::MAX),
            *cluster,
        )
    });
    Ok(ranked.first().map(|c| c.to_string()))
}

/// Where the other clusters reach a copy's primary, as its agent published it
/// (`status.endpoint`); None until it has, or when what it wrote is not an address.
pub fn endpoint(copy: &DynamicObject) -> Option<ReplicaSource> {
    let source: ReplicaSource =
        serde_json::from_value(copy.data["status"]["endpoint"].clone()).ok()?;
    let valid = !source.host.is_empty()
        && source.host.len() <= 253
        && source
            .host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '-'))
        && (1..=65535).contains(&source.port);
    valid.then_some(source)
}

/// The WAL position a member copy's recorded primary last reported (a primary's write
/// position; in a replica cluster, what its designated primary has received).
fn primary_position(status: &Value) -> Option<u64> {
    let primary = status["primary"].as_str()?;
    status["instances"]
        .as_array()?
        .iter()
        .find(|i| i["name"] == primary)
        .and_then(|i| i["lsn"].as_str())
        .and_then(parse_lsn)
}

/// How many bytes of WAL a replica cluster is behind the primary cluster, from the
/// positions both last reported (0 when the replica reports the later one: the two are
/// read at different moments).
pub fn lag_bytes(primary: &Value, replica: &Value) -> Option<u64> {
    Some(primary_position(primary)?.saturating_sub(primary_position(replica)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn target(name: &str, replicas: i32) -> TargetCluster {
        TargetCluster {
            name: name.into(),
            replicas,
        }
    }

    fn copy(annotation: Option<&str>, status: Value) -> DynamicObject {
        let mut object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "MyDatabase",
            "metadata": {"name": "orders"}, "status": status
        }))
        .unwrap();
        if let Some(cluster) = annotation {
            object
                .annotations_mut()
                .insert(ANNOTATION_PRIMARY_CLUSTER.into(), cluster.into());
        }
        object
    }

    use kube::ResourceExt;

    #[test]
    fn replica_clusters_are_asked_for_or_kept_once_recorded() {
        assert!(!enabled(&json!({"spec": {"replicas": 2}})));
        assert!(!enabled(
            &json!({"spec": {"topology": {"acrossClusters": "Independent"}}})
        ));
        assert!(enabled(
            &json!({"spec": {"topology": {"acrossClusters": "ReplicaClusters"}}})
        ));
        assert!(enabled(
            &json!({"spec": {"topology": {"primaryCluster": "west"}}})
        ));
        assert!(
            enabled(&json!({"spec": {}, "status": {"primaryCluster": "east"}})),
            "a recorded primary cluster keeps the copies replica clusters"
        );
    }

    #[test]
    fn the_first_placed_cluster_in_the_policys_order_holds_the_primary() {
        let template = json!({"spec": {"topology": {"acrossClusters": "ReplicaClusters"}}});
        let targets = [target("east", 1), target("north", 1), target("west", 1)];
        let order = ["west".to_string(), "east".to_string()];
        assert_eq!(
            primary_cluster(&template, &targets, [], &order),
            Ok(Some("west".into()))
        );
        assert_eq!(
            primary_cluster(&template, &targets, [], &[]),
            Ok(Some("east".into())),
            "by name when the policy names none"
        );
        let emptied = [target("east", 0), target("west", 1)];
        assert_eq!(
            primary_cluster(&template, &emptied, [], &[]),
            Ok(Some("west".into())),
            "a cluster given no replicas holds nothing"
        );
        assert_eq!(primary_cluster(&template, &[], [], &[]), Ok(None));
    }

    #[test]
    fn a_recorded_primary_cluster_wins_over_the_field_and_the_placement() {
        let targets = [target("east", 1), target("west", 1)];
        let template = json!({"spec": {"topology": {"primaryCluster": "west"}}});
        assert_eq!(
            primary_cluster(&template, &targets, [], &[]),
            Ok(Some("west".into()))
        );
        let on_copies = [copy(Some("east"), json!({})), copy(Some("east"), json!({}))];
        assert_eq!(
            primary_cluster(&template, &targets, &on_copies, &[]),
            Ok(Some("east".into())),
            "the copies' record wins over a changed field"
        );
        let recorded = json!({"spec": {"topology": {"primaryCluster": "west"}},
                              "status": {"primaryCluster": "north"}});
        assert_eq!(
            primary_cluster(&recorded, &targets, &on_copies, &[]),
            Ok(Some("north".into())),
            "the status's record wins, even out of the placement"
        );
        let split = [copy(Some("east"), json!({})), copy(Some("west"), json!({}))];
        let error = primary_cluster(&template, &targets, &split, &[]).unwrap_err();
        assert!(error.contains("east, west") && error.contains("status.primaryCluster"));
    }

    #[test]
    fn a_primary_cluster_outside_the_placement_is_refused_with_the_fix() {
        let template = json!({"spec": {"topology": {"primaryCluster": "south"}}});
        let error = primary_cluster(&template, &[target("east", 1)], [], &[]).unwrap_err();
        assert!(
            error.contains("spec.topology.primaryCluster names south")
                && error.contains("(east)")
                && error.contains("place the database in south"),
            "{error}"
        );
    }

    #[test]
    fn the_endpoint_is_read_only_when_it_is_an_address() {
        let good = copy(
            None,
            json!({"endpoint": {"host": "10.0.0.4", "port": 5432}}),
        );
        assert_eq!(
            endpoint(&good),
            Some(ReplicaSource {
                host: "10.0.0.4".into(),
                port: 5432
            })
        );
        for bad in [
            json!({}),
            json!({"endpoint": {"host": "", "port": 5432}}),
            json!({"endpoint": {"host": "a b", "port": 5432}}),
            json!({"endpoint": {"host": "10.0.0.4", "port": 0}}),
            json!({"endpoint": {"host": "10.0.0.4", "port": "x"}}),
        ] {
            assert_eq!(endpoint(&copy(None, bad.clone())), None, "{bad}");
        }
    }

    #[test]
    fn lag_is_the_primary_clusters_position_minus_the_replicas() {
        let primary = json!({"primary": "orders-0", "instances": [
            {"name": "orders-1", "lsn": "0/2000000"},
            {"name": "orders-0", "lsn": "1/0"}]});
        let replica = json!({"primary": "orders-1", "instances": [
            {"name": "orders-1", "lsn": "0/FFFFF000"}]});
        assert_eq!(lag_bytes(&primary, &replica), Some(0x1000));
        assert_eq!(lag_bytes(&replica, &primary), Some(0), "never negative");
        assert_eq!(lag_bytes(&primary, &json!({"primary": "orders-1"})), None);
        assert_eq!(
            lag_bytes(&json!({"instances": []}), &replica),
            None,
            "no recorded primary, no position"
        );
    }
}
