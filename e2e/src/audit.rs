//! The local API server's audit log (`logs/audit.log`, JSON lines; the
//! policy records the operator ServiceAccounts' writes): who wrote what,
//! when, and whether the API server accepted it.

use std::path::Path;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

/// One write request as the API server audited it.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    /// The authenticated user (`system:serviceaccount:<ns>:<name>`).
    pub user: String,
    /// `create`, `update`, `patch`, `delete`, ….
    pub verb: String,
    /// The resource (`pods`, `leases`, `events`, …).
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// When the API server received the request.
    pub received: Timestamp,
    /// The HTTP status it answered.
    pub code: u16,
}

impl Write {
    /// Whether the API server carried it out (2xx).
    pub fn accepted(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

/// The writes in `text` (one audit event per line; the `ResponseComplete`
/// stage of each request, lines that are not audit events skipped).
pub fn parse(text: &str) -> Vec<Write> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["stage"] == "ResponseComplete")
        .filter_map(|e| {
            let s = |v: &Value| v.as_str().map(str::to_string);
            Some(Write {
                user: s(&e["user"]["username"])?,
                verb: s(&e["verb"])?,
                resource: s(&e["objectRef"]["resource"]).unwrap_or_default(),
                namespace: s(&e["objectRef"]["namespace"]),
                name: s(&e["objectRef"]["name"]),
                received: e["requestReceivedTimestamp"].as_str()?.parse().ok()?,
                code: e["responseStatus"]["code"].as_u64()?.try_into().ok()?,
            })
        })
        .collect()
}

/// The writes in the audit log at `path` (none when it cannot be read).
pub fn read(path: &Path) -> Vec<Write> {
    parse(&std::fs::read_to_string(path).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/n/pods","verb":"create","user":{"username":"system:serviceaccount:heterotrain-system:heterotrain-operator"},"objectRef":{"resource":"pods","namespace":"n","name":"j-0","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":201},"requestReceivedTimestamp":"2026-11-26T09:00:00.123456Z","stageTimestamp":"2026-11-26T09:00:00.200000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"b","stage":"ResponseStarted","verb":"patch","user":{"username":"u"},"objectRef":{"resource":"pods"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-26T09:00:01.000000Z"}
not json
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"c","stage":"ResponseComplete","verb":"update","user":{"username":"b"},"objectRef":{"resource":"leases","namespace":"heterotrain-system","name":"heterotrain-operator"},"responseStatus":{"metadata":{},"code":409},"requestReceivedTimestamp":"2026-11-26T09:00:02.5Z"}
"#;

    #[test]
    fn completed_writes_are_read_with_user_object_time_and_code() {
        let w = parse(LOG);
        assert_eq!(w.len(), 2, "{w:?}");
        assert_eq!(w[0].verb, "create");
        assert_eq!(w[0].resource, "pods");
        assert_eq!(w[0].name.as_deref(), Some("j-0"));
        assert!(w[0].accepted());
        assert_eq!(w[1].user, "b");
        assert!(!w[1].accepted(), "a 409 was refused");
        assert!(w[0].received < w[1].received);
    }
}
