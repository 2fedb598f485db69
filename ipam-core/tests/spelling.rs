//! The spelling table against the stored types themselves: every renamed field reads under
//! both names and writes under the new one. Here rather than beside the table, which sits below
//! the resources it names.

use ipam_core::{
    lb::resources::{L2PolicySpec, LbIpPoolSpec, ServiceSpec},
    resources::NodeIpamSpec,
    spelling::{RENAMED, Renamed},
};
use serde_json::{Value, json};

/// Each renamed field reads under both names, and writes under the new one only.
#[test]
fn every_renamed_field_reads_both_spellings_and_writes_the_new_one() {
    fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(spec: Value, r: &Renamed) {
        let typed: T = serde_json::from_value(spec.clone())
            .unwrap_or_else(|e| panic!("{} {} does not read: {e}", r.kind, r.old));
        let written = serde_json::to_value(&typed).expect("serialises");
        assert!(
            written.get(r.old).is_none(),
            "{} written as {}",
            r.new,
            r.old
        );
        assert!(
            written.get(r.new).is_some(),
            "{} not written: {written}",
            r.new
        );
    }
    for r in RENAMED {
        let value = match r.old {
            "allowFirstLastIps" | "loadBalancerIps" => json!(true),
            "podCidrs" => json!(["10.1.0.0/24"]),
            "externalIps" if r.kind == "L2AnnouncementPolicy" => json!(true),
            _ => json!(["10.1.0.1"]),
        };
        for name in [r.old, r.new] {
            let mut spec = match r.kind {
                "LoadBalancerIPPool" => json!({ "blocks": [] }),
                _ => json!({}),
            };
            spec[name] = value.clone();
            match r.kind {
                "LoadBalancerIPPool" => round_trip::<LbIpPoolSpec>(spec, r),
                "Service" => round_trip::<ServiceSpec>(spec, r),
                "L2AnnouncementPolicy" => round_trip::<L2PolicySpec>(spec, r),
                "NodeIPAM" => round_trip::<NodeIpamSpec>(spec, r),
                other => panic!("a rename of {other} has no test"),
            }
        }
    }
}
