//! The repository index (`POST /v2/repository/index`, gRPC
//! `RepositoryIndex`, `TRITONSERVER_ServerModelIndex`): the repository
//! thread's rows, rendered as JSON here for HTTP and the in-process API.

use serde_json::{json, Map, Value};

pub use crate::repository::manager::IndexEntry;

/// One row: `name` always; `version`, `state` and `reason` only when known.
pub fn entry_json(e: &IndexEntry) -> Value {
    let mut o = Map::new();
    o.insert("name".into(), json!(e.name));
    if let Some(v) = &e.version {
        o.insert("version".into(), json!(v));
    }
    if let Some(s) = e.state {
        o.insert("state".into(), json!(s));
    }
    if let Some(r) = &e.reason {
        o.insert("reason".into(), json!(r));
    }
    Value::Object(o)
}

/// The whole index, a JSON array of rows.
pub fn to_json(rows: &[IndexEntry]) -> Value {
    Value::Array(rows.iter().map(entry_json).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_leave_out_what_is_unknown() {
        let rows = [
            IndexEntry {
                name: "a".into(),
                version: Some("1".into()),
                state: Some("READY"),
                reason: None,
            },
            IndexEntry {
                name: "b".into(),
                version: None,
                state: None,
                reason: Some("why".into()),
            },
        ];
        assert_eq!(
            to_json(&rows).to_string(),
            r#"[{"name":"a","state":"READY","version":"1"},{"name":"b","reason":"why"}]"#
        );
    }
}
