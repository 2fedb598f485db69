//! Inputs of the owner decision shared by tests: one policy that announces every
//! LoadBalancer IP on every node, and Services holding `10.0.0.1` and up.

use super::resources::{L2PolicySpec, ServiceSpec, ServiceStatus};

/// One L2AnnouncementPolicy with every default: every node, every Service, every interface.
pub(crate) fn policy_for_all() -> Vec<(String, L2PolicySpec)> {
    vec![(
        "all".to_owned(),
        serde_json::from_str("{}").expect("an empty policy"),
    )]
}

/// `count` LoadBalancer Services, `default/s<i>` holding `10.0.0.<i>`.
pub(crate) fn services(count: u8) -> Vec<(String, ServiceSpec, ServiceStatus)> {
    let spec: ServiceSpec =
        serde_json::from_str(r#"{"type": "LoadBalancer"}"#).expect("a LoadBalancer Service");
    (1..=count)
        .map(|i| {
            let status = ServiceStatus {
                ingress: vec![format!("10.0.0.{i}").parse().expect("an IPv4 address")],
                ..Default::default()
            };
            (format!("default/s{i}"), spec.clone(), status)
        })
        .collect()
}
