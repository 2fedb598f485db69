//! The engine's `Lease` as a `coordination.k8s.io/v1` Lease's spec and back. Kubernetes counts
//! the duration in whole seconds: it is rounded up, which only ever makes another candidate
//! wait longer before it takes over.

use ipam_core::store::lease::Lease;
use k8s_openapi::{
    api::coordination::v1::LeaseSpec, apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp,
};

pub(crate) fn to_kubernetes(engine: &Lease) -> LeaseSpec {
    let seconds = engine.duration_ms.div_ceil(1000).max(1);
    LeaseSpec {
        holder_identity: Some(engine.holder.clone()).filter(|h| !h.is_empty()),
        lease_duration_seconds: Some(i32::try_from(seconds).unwrap_or(i32::MAX)),
        lease_transitions: Some(i32::try_from(engine.transitions).unwrap_or(i32::MAX)),
        renew_time: i64::try_from(engine.renew_time_ms)
            .ok()
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
            .map(MicroTime),
        ..LeaseSpec::default()
    }
}

pub(crate) fn to_engine(spec: &LeaseSpec) -> Lease {
    let non_negative = |n: Option<i32>| n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
    Lease {
        holder: spec.holder_identity.clone().unwrap_or_default(),
        duration_ms: non_negative(spec.lease_duration_seconds) * 1000,
        renew_time_ms: spec
            .renew_time
            .as_ref()
            .and_then(|t| u64::try_from(t.0.as_millisecond()).ok())
            .unwrap_or(0),
        transitions: non_negative(spec.lease_transitions),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_round_trips_with_its_duration_rounded_up() {
        let engine = Lease {
            holder: "op-1".into(),
            duration_ms: 1500,
            renew_time_ms: 1_764_500_000_123,
            transitions: 2,
        };
        let spec = to_kubernetes(&engine);
        let json = serde_json::to_value(&spec).expect("serialises");
        assert_eq!(json["leaseDurationSeconds"], 2);
        assert_eq!(json["renewTime"], "2025-11-30T10:53:20.123000Z");
        assert_eq!(json["holderIdentity"], "op-1");
        let back = to_engine(&spec);
        assert_eq!(
            back,
            Lease {
                duration_ms: 2000,
                ..engine
            }
        );
        let released = to_kubernetes(&Lease {
            holder: String::new(),
            ..back
        });
        assert_eq!(
            released.holder_identity, None,
            "a released lease has no holder"
        );
    }
}
