//! Reading the member API servers' audit logs (`audit.k8s.io/v1` Events, one JSON object a
//! line; see the lab's `MEMBER_AUDIT_POLICY`): the hub's writes, with their request
//! bodies for the kinds that hold data.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::Value;

/// One audit event, with the fields the checker reads.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    #[serde(rename = "auditID")]
    pub audit_id: String,
    pub stage: String,
    /// create, update, patch (server-side apply too), delete, deletecollection, ...
    pub verb: String,
    pub user: AuditUser,
    /// The user the request acted as, when it impersonated one.
    #[serde(default)]
    pub impersonated_user: Option<AuditUser>,
    #[serde(default)]
    pub user_agent: Option<String>,
    #[serde(default)]
    pub object_ref: Option<AuditObjectRef>,
    #[serde(default)]
    pub response_status: Option<AuditResponseStatus>,
    /// The body sent (the apply patch, the DeleteOptions), at level Request and above.
    #[serde(default)]
    pub request_object: Option<Value>,
    /// The object as the API server returned it, at level RequestResponse.
    #[serde(default)]
    pub response_object: Option<Value>,
    /// When the API server received the request: the moment the checker judges it at.
    pub request_received_timestamp: jiff::Timestamp,
}

/// Who sent the request.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct AuditUser {
    #[serde(default)]
    pub username: String,
}

/// The object a request was about.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuditObjectRef {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    /// Empty for the core group.
    #[serde(default)]
    pub api_group: String,
    #[serde(default)]
    pub subresource: String,
}

/// The response's status code.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct AuditResponseStatus {
    #[serde(default)]
    pub code: Option<u16>,
}

impl AuditEvent {
    /// The HTTP status code of the response (0 when the log has none).
    pub fn code(&self) -> u16 {
        self.response_status
            .as_ref()
            .and_then(|s| s.code)
            .unwrap_or_default()
    }

    /// Whether the request succeeded (2xx).
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.code())
    }

    /// Who the request acted as: the impersonated user, or the one who sent it.
    pub fn acting_user(&self) -> &str {
        self.impersonated_user
            .as_ref()
            .map_or(&self.user.username, |u| &u.username)
    }

    /// `spec.replicas` of the object the write left (a Scale's for the scale
    /// subresource), when the response is logged.
    pub fn returned_replicas(&self) -> Option<i64> {
        self.response_object
            .as_ref()?
            .pointer("/spec/replicas")?
            .as_i64()
    }

    /// `spec.replicas` in the request body (an apply or merge patch that sets it).
    pub fn requested_replicas(&self) -> Option<i64> {
        self.request_object
            .as_ref()?
            .pointer("/spec/replicas")?
            .as_i64()
    }
}

/// One line of an audit log, parsed, with the cluster it came from and the line itself
/// (printed when the line is an offending request).
#[derive(Clone, Debug, PartialEq)]
pub struct AuditRecord {
    pub cluster: String,
    pub event: AuditEvent,
    pub line: String,
}

/// Parses one audit log line.
pub fn parse_line(line: &str) -> Result<AuditEvent, serde_json::Error> {
    serde_json::from_str(line)
}

/// The audit log files in `dir`: the rotated ones (`audit-<time>.log`, oldest first) and
/// the current `audit.log` last.
pub fn audit_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut rotated: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("audit-") && n.ends_with(".log"))
        })
        .collect();
    rotated.sort();
    let current = dir.join("audit.log");
    if current.is_file() {
        rotated.push(current);
    }
    Ok(rotated)
}

/// Every event of `cluster`'s audit logs in `dir`, in the order the API server received
/// the requests. A line that does not parse (the last one, cut by a kill) is counted, not
/// fatal.
pub fn read_cluster(cluster: &str, dir: &Path) -> Result<(Vec<AuditRecord>, usize)> {
    let mut records = vec![];
    let mut unreadable = 0;
    for path in audit_files(dir)? {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match parse_line(line) {
                Ok(event) => records.push(AuditRecord {
                    cluster: cluster.to_string(),
                    event,
                    line: line.to_string(),
                }),
                Err(_) => unreadable += 1,
            }
        }
    }
    records.sort_by_key(|r| r.event.request_received_timestamp);
    Ok((records, unreadable))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An audit line as kube-apiserver v1.36 writes it for a server-side apply of a
    /// StatefulSet copy by the hub (trimmed: the response object keeps what matters).
    pub const APPLY_LINE: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"RequestResponse","auditID":"5c1f6f1e-8f7e-4b59-9d8e-0f0c6d0b8a11","stage":"ResponseComplete","requestURI":"/apis/apps/v1/namespaces/e2e-chaos-1-0/statefulsets/sts-1?fieldManager=bulkhead-hub\u0026force=true","verb":"patch","user":{"username":"system:serviceaccount:bulkhead-system:bulkhead-hub","uid":"a1","groups":["system:serviceaccounts","system:serviceaccounts:bulkhead-system","system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"kube-rs/5.0.0","objectRef":{"resource":"statefulsets","namespace":"e2e-chaos-1-0","name":"sts-1","apiGroup":"apps","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":201},"requestObject":{"apiVersion":"apps/v1","kind":"StatefulSet","metadata":{"name":"sts-1","namespace":"e2e-chaos-1-0","labels":{"federation.example.com/managed-by":"bulkhead"}},"spec":{"replicas":2,"serviceName":"sts-1"}},"responseObject":{"kind":"StatefulSet","apiVersion":"apps/v1","metadata":{"name":"sts-1","uid":"u1","generation":1},"spec":{"replicas":2}},"requestReceivedTimestamp":"2026-11-30T10:00:01.123456Z","stageTimestamp":"2026-11-30T10:00:01.140001Z","annotations":{"authorization.k8s.io/decision":"allow"}}"#;

    /// A DELETE of a claim copy by the hub.
    pub const DELETE_LINE: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"RequestResponse","auditID":"0b4d","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/e2e-chaos-1-0/persistentvolumeclaims/web-1-data","verb":"delete","user":{"username":"system:serviceaccount:bulkhead-system:bulkhead-hub"},"objectRef":{"resource":"persistentvolumeclaims","namespace":"e2e-chaos-1-0","name":"web-1-data","apiVersion":"v1"},"responseStatus":{"metadata":{},"status":"Success","code":200},"requestObject":{"kind":"DeleteOptions","apiVersion":"meta.k8s.io/__internal","propagationPolicy":"Background"},"requestReceivedTimestamp":"2026-11-30T10:00:09.5Z","stageTimestamp":"2026-11-30T10:00:09.51Z"}"#;

    #[test]
    fn an_apply_line_gives_its_verb_object_replicas_code_and_time() {
        let event = parse_line(APPLY_LINE).unwrap();
        assert_eq!(event.verb, "patch");
        assert_eq!(
            event.user.username,
            "system:serviceaccount:bulkhead-system:bulkhead-hub"
        );
        let object = event.object_ref.clone().unwrap();
        assert_eq!(
            (object.api_group.as_str(), object.resource.as_str()),
            ("apps", "statefulsets")
        );
        assert_eq!(
            (object.namespace.as_str(), object.name.as_str()),
            ("e2e-chaos-1-0", "sts-1")
        );
        assert_eq!(event.code(), 201);
        assert!(event.succeeded());
        assert_eq!(event.requested_replicas(), Some(2));
        assert_eq!(
            event.request_received_timestamp.to_string(),
            "2026-11-30T10:00:01.123456Z"
        );
    }

    #[test]
    fn a_delete_line_of_the_core_group_has_an_empty_group() {
        let event = parse_line(DELETE_LINE).unwrap();
        assert_eq!(event.verb, "delete");
        assert_eq!(event.object_ref.as_ref().unwrap().api_group, "");
        assert_eq!(event.requested_replicas(), None);
        assert_eq!(event.code(), 200);
    }

    #[test]
    fn a_metadata_line_without_bodies_parses() {
        let line = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"x","stage":"ResponseComplete","requestURI":"/apis/coordination.k8s.io/v1/namespaces/bulkhead-system/leases/bulkhead-hub","verb":"patch","user":{"username":"system:serviceaccount:bulkhead-system:bulkhead-hub"},"objectRef":{"resource":"leases","namespace":"bulkhead-system","name":"bulkhead-hub","apiGroup":"coordination.k8s.io","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-11-30T10:00:00.000001Z","stageTimestamp":"2026-11-30T10:00:00.01Z"}"#;
        let event = parse_line(line).unwrap();
        assert_eq!(event.request_object, None);
        assert_eq!(event.object_ref.unwrap().resource, "leases");
    }

    #[test]
    fn rotated_files_come_first_and_a_cut_last_line_is_counted() {
        let dir = std::env::temp_dir().join(format!("chaos-audit-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("audit.log"),
            format!("{DELETE_LINE}\n{{\"kind\":\"Ev"),
        )
        .unwrap();
        std::fs::write(
            dir.join("audit-2026-11-30T09-00-00.000.log"),
            format!("{APPLY_LINE}\n"),
        )
        .unwrap();
        std::fs::write(dir.join("kube-apiserver.log"), "not audit\n").unwrap();
        let files = audit_files(&dir).unwrap();
        assert_eq!(files.len(), 2);
        assert!(files[1].ends_with("audit.log"));
        let (records, unreadable) = read_cluster("west", &dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(unreadable, 1);
        assert_eq!(records.len(), 2);
        assert_eq!(
            records[0].event.verb, "patch",
            "sorted by the time received"
        );
        assert_eq!(records[1].cluster, "west");
    }
}
