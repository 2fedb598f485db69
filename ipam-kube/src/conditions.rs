//! The engine's conditions (`type`, `status: bool`, `message`) as Kubernetes'
//! `metav1.Condition`s and back. A condition written again with the same status keeps its
//! `lastTransitionTime`, so a controller that writes the same status every pass writes nothing.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A condition as the engine stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EngineCondition {
    #[serde(rename = "type")]
    pub kind: String,
    pub status: bool,
    #[serde(default)]
    pub message: String,
}

/// The status to write: the engine's, with Kubernetes conditions, times carried over from
/// `current` (the status the object has) where a condition did not change, and empty lists
/// left out.
pub(crate) fn to_kubernetes(engine: &Value, current: &Value) -> Value {
    let mut status = engine.clone();
    if let Some(conditions) = status.get_mut("conditions") {
        let engine: Vec<EngineCondition> =
            serde_json::from_value(conditions.take()).unwrap_or_default();
        let current = current_conditions(current);
        *conditions = json!(kubernetes_conditions(&engine, &current));
    }
    compact(status)
}

/// The conditions of a status as Kubernetes has them (none where they do not parse).
pub(crate) fn current_conditions(status: &Value) -> Vec<Condition> {
    status
        .get("conditions")
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default()
}

/// Kubernetes conditions for the engine's, times carried over from `current` where the same
/// condition has the same status.
pub(crate) fn kubernetes_conditions(
    engine: &[EngineCondition],
    current: &[Condition],
) -> Vec<Condition> {
    engine
        .iter()
        .map(|c| {
            let status = if c.status { "True" } else { "False" };
            let carried = current
                .iter()
                .find(|old| old.type_ == c.kind && old.status == status)
                .map(|old| old.last_transition_time.clone());
            Condition {
                type_: c.kind.clone(),
                status: status.to_owned(),
                reason: reason(&c.kind, c.status),
                message: c.message.clone(),
                last_transition_time: carried.unwrap_or_else(now),
                observed_generation: None,
            }
        })
        .collect()
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

/// Now, to the second: `metav1.Time` is written in whole seconds, so a time read back compares
/// equal to the one written.
pub(crate) fn now() -> Time {
    let seconds = Timestamp::now().as_second();
    Time(Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// The engine's view of Kubernetes conditions.
pub(crate) fn engine_conditions(conditions: &[Condition]) -> Vec<EngineCondition> {
    conditions
        .iter()
        .map(|c| EngineCondition {
            kind: c.type_.clone(),
            status: c.status == "True",
            message: c.message.clone(),
        })
        .collect()
}

/// The engine's view of an object's status.
pub(crate) fn to_engine(status: &Value) -> Value {
    let mut status = status.clone();
    if let Some(conditions) = status.get_mut("conditions") {
        let kubernetes: Vec<Condition> =
            serde_json::from_value(conditions.take()).unwrap_or_default();
        *conditions = json!(engine_conditions(&kubernetes));
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
