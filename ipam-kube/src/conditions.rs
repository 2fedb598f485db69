//! The engine's conditions (`type`, `status: bool`, `message`) as Kubernetes'
//! `metav1.Condition`s and back. A condition written again with the same status keeps its
//! `lastTransitionTime`, so a controller that writes the same status every pass writes nothing.

use serde_json::{Value, json};

/// The status to write: the engine's, with Kubernetes conditions, times carried over from
/// `current` (the status the object has) where a condition did not change, and empty lists
/// left out.
pub(crate) fn to_kubernetes(engine: &Value, current: &Value) -> Value {
    let mut status = engine.clone();
    if let Some(conditions) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in conditions.iter_mut() {
            *c = condition_to_kubernetes(c, current);
        }
    }
    compact(status)
}

fn condition_to_kubernetes(c: &Value, current: &Value) -> Value {
    let kind = c["type"].as_str().unwrap_or("Ready");
    let status = if c["status"].as_bool().unwrap_or(false) {
        "True"
    } else {
        "False"
    };
    let carried = current["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|old| old["type"] == kind && old["status"] == status)
        .map(|old| old["lastTransitionTime"].clone())
        .filter(|t| t.is_string());
    json!({
        "type": kind,
        "status": status,
        "reason": reason(kind, status == "True"),
        "message": c["message"].as_str().unwrap_or(""),
        "lastTransitionTime": carried.unwrap_or_else(|| json!(now())),
    })
}

/// A CamelCase reason, as the API conventions want one: the condition's type when it holds,
/// `Not<Type>` when it does not.
fn reason(kind: &str, holds: bool) -> String {
    let word: String = kind.chars().filter(char::is_ascii_alphanumeric).collect();
    let word = if word.is_empty() {
        "Condition".to_owned()
    } else {
        word
    };
    if holds { word } else { format!("Not{word}") }
}

/// RFC 3339 in UTC to the second, the form of `metav1.Time`.
fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The engine's view of an object's status.
pub(crate) fn to_engine(status: &Value) -> Value {
    let mut status = status.clone();
    if let Some(conditions) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in conditions.iter_mut() {
            *c = json!({
                "type": c["type"],
                "status": c["status"] == "True",
                "message": c["message"].as_str().unwrap_or(""),
            });
        }
    }
    status
}

/// Whether writing `wanted` would change `current` (absent, null and empty mean the same).
pub(crate) fn same_status(wanted: &Value, current: &Value) -> bool {
    compact(wanted.clone()) == compact(current.clone())
}

/// Without top-level nulls and empty lists: the status as the API server keeps it after the
/// CRD's `omitempty`-like serialisation.
fn compact(status: Value) -> Value {
    match status {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
                .collect(),
        ),
        Value::Null => json!({}),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_round_trip_and_keep_their_transition_time() {
        let engine = json!({"conditions": [{"type": "Ready", "status": false, "message": "pool x is exhausted"}], "allocated": []});
        let first = to_kubernetes(&engine, &Value::Null);
        let c = &first["conditions"][0];
        assert_eq!(
            (c["status"].as_str(), c["reason"].as_str()),
            (Some("False"), Some("NotReady"))
        );
        assert!(first.get("allocated").is_none(), "{first}");
        let mut aged = first.clone();
        aged["conditions"][0]["lastTransitionTime"] = json!("2020-01-01T00:00:00Z");
        // Same status again: the old time stays, and nothing is to be written.
        let again = to_kubernetes(&engine, &aged);
        assert_eq!(
            again["conditions"][0]["lastTransitionTime"],
            "2020-01-01T00:00:00Z"
        );
        assert!(same_status(&again, &aged));
        // A transition gets a new time.
        let ready = json!({"conditions": [{"type": "Ready", "status": true, "message": "ok"}]});
        let moved = to_kubernetes(&ready, &aged);
        assert_ne!(
            moved["conditions"][0]["lastTransitionTime"],
            "2020-01-01T00:00:00Z"
        );
        assert_eq!(moved["conditions"][0]["reason"], "Ready");
        assert_eq!(
            to_engine(&moved)["conditions"][0],
            json!({"type": "Ready", "status": true, "message": "ok"})
        );
    }
}
