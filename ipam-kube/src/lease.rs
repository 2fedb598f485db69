//! The engine's `Lease` as a `coordination.k8s.io/v1` Lease's spec and back. Kubernetes counts
//! the duration in whole seconds: it is rounded up, which only ever makes another candidate
//! wait longer before it takes over.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

pub(crate) fn to_kubernetes(engine: &Value) -> Value {
    let duration_ms = engine["durationMs"].as_u64().unwrap_or(0);
    let renew_ms = engine["renewTimeMs"].as_i64().unwrap_or(0);
    let mut spec = json!({
        "leaseDurationSeconds": duration_ms.div_ceil(1000).max(1),
        "leaseTransitions": engine["transitions"].as_u64().unwrap_or(0),
    });
    if let Some(holder) = engine["holder"].as_str().filter(|h| !h.is_empty()) {
        spec["holderIdentity"] = json!(holder);
    }
    if let Ok(at) = Timestamp::from_millisecond(renew_ms) {
        // metav1.MicroTime: RFC 3339 with microseconds.
        spec["renewTime"] = json!(at.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string());
    }
    spec
}

pub(crate) fn to_engine(spec: Option<&Value>) -> Value {
    let spec = spec.cloned().unwrap_or(Value::Null);
    let renew_ms = spec["renewTime"]
        .as_str()
        .and_then(|t| t.parse::<Timestamp>().ok())
        .map_or(0, |t| t.as_millisecond().max(0));
    json!({
        "holder": spec["holderIdentity"].as_str().unwrap_or(""),
        "durationMs": spec["leaseDurationSeconds"].as_u64().unwrap_or(0) * 1000,
        "renewTimeMs": renew_ms,
        "transitions": spec["leaseTransitions"].as_u64().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_round_trips_with_its_duration_rounded_up() {
        let engine = json!({"holder": "op-1", "durationMs": 1500, "renewTimeMs": 1_764_500_000_123i64, "transitions": 2});
        let spec = to_kubernetes(&engine);
        assert_eq!(spec["leaseDurationSeconds"], 2);
        assert_eq!(spec["renewTime"], "2025-11-30T10:53:20.123000Z");
        let back = to_engine(Some(&spec));
        assert_eq!(
            back,
            json!({"holder": "op-1", "durationMs": 2000, "renewTimeMs": 1_764_500_000_123i64, "transitions": 2})
        );
    }
}
