//! The IPs a node held for a restart keeps: its responders answer them for its promise, and
//! nothing of its own lets go of them, so no other node may take them meanwhile, whatever else
//! changes (a Local Service's endpoints moving away, a node coming back that hashes higher).
//!
//! What the held node says it answers (its notice's `answering`) is its own word, and a node's
//! record is writable by that node: it is narrowed to the IPs it may announce (a policy selects
//! it for the IP's Service and it has an interface the policy names; endpoints aside, since
//! endpoints moving away is what the pin is for), on the interfaces it may announce them on.
//! (Narrowing it further to the IPs this node last saw it own was tried: a node whose last
//! decisions were made cut off from the others saw nothing right, and answered an IP next to the
//! restarting node's responders, ipam-sim seed 55.) A notice can thus keep, for its promise,
//! IPs its node may announce and did not answer; checking notices against the operator's word
//! is the security issue's work.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use super::view::View;
use crate::lb::{
    announce::{Announcement, ReadyNodes, owners, weight},
    rows,
};

/// One node held for a restart, as the decision pins its IPs.
pub struct Held<'a> {
    pub node: &'a str,
    /// The IPs its notice says its responders answer on.
    pub answering: Vec<IpAddr>,
}

/// Every pinned IP: the held node that keeps it, and the interfaces it answers on.
pub fn pins(view: &View<'_>, held: &[Held<'_>]) -> BTreeMap<IpAddr, (String, Vec<String>)> {
    let mut out: BTreeMap<IpAddr, (String, Vec<String>)> = BTreeMap::new();
    for h in held {
        let Some(record) = view.records.record(h.node) else {
            continue;
        };
        let node = rows::node_named(h.node, record);
        // Every Local Service ready on the held node: what it may announce, endpoints aside.
        let everywhere: ReadyNodes = view
            .services
            .iter()
            .map(|(name, _, _)| (name.clone(), BTreeSet::from([h.node.to_owned()])))
            .collect();
        let may: Vec<Announcement> = owners(
            view.policies,
            view.pools,
            view.services,
            &everywhere,
            &[node],
        );
        for a in may {
            if !h.answering.contains(&a.ip) {
                continue;
            }
            // Two held nodes saying one IP: the same one wins on every node.
            let better = out.get(&a.ip).is_none_or(|(other, _)| {
                (weight(a.ip, &a.node), a.node.as_str()) > (weight(a.ip, other), other.as_str())
            });
            if better {
                out.insert(a.ip, (a.node, a.interfaces));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{
        lb::resources::{
            IpFamilyPolicy, L2PolicySpec, ServiceSpec, ServiceStatus, ServiceType, TrafficPolicy,
        },
        meta::Selector,
        resources::{NodeInterface, NodeIpam, NodeIpamSpec},
    };

    fn record(zone: &str, interface: &str) -> NodeIpam {
        NodeIpam {
            spec: NodeIpamSpec {
                labels: [("zone".to_owned(), zone.to_owned())].into(),
                interfaces: vec![NodeInterface {
                    name: interface.into(),
                    addresses: vec!["10.0.0.5/24".into()],
                    mac: None,
                }],
                ..NodeIpamSpec::default()
            },
            ..NodeIpam::default()
        }
    }

    fn service(
        name: &str,
        ip: &str,
        label: (&str, &str),
        local: bool,
    ) -> (String, ServiceSpec, ServiceStatus) {
        let spec = ServiceSpec {
            service_type: ServiceType::LoadBalancer,
            labels: [(label.0.to_owned(), label.1.to_owned())].into(),
            ports: vec![],
            load_balancer_class: None,
            requested_ips: vec![],
            sharing_key: None,
            ip_families: vec![],
            ip_family_policy: IpFamilyPolicy::SingleStack,
            external_ips: vec![],
            external_traffic_policy: if local {
                TrafficPolicy::Local
            } else {
                TrafficPolicy::Cluster
            },
            selector: BTreeMap::new(),
            conflict: None,
            sharing_cross_namespace: Vec::new(),
            pool: None,
            namespace_labels: BTreeMap::new(),
        };
        let status = ServiceStatus {
            ingress: vec![ip.parse().unwrap()],
            ..ServiceStatus::default()
        };
        (name.into(), spec, status)
    }

    /// A notice is its node's own word: it keeps only the IPs its node may announce, on the
    /// interfaces it announces them on, and a Local Service's IP whatever its endpoints.
    #[test]
    fn a_notice_keeps_only_what_its_node_may_announce() {
        let mut zone_a = Selector::default();
        zone_a.match_labels.insert("zone".into(), "a".into());
        let mut web = Selector::default();
        web.match_labels.insert("tier".into(), "web".into());
        let policies = vec![
            (
                "web-on-every-node".to_owned(),
                L2PolicySpec {
                    node_selector: Selector::default(),
                    service_selector: web,
                    ip_pools: vec![],
                    ip_pool_selector: Selector::default(),
                    interfaces: vec![],
                    load_balancer_ips: true,
                    external_ips: false,
                },
            ),
            (
                "zone-a-only".to_owned(),
                L2PolicySpec {
                    node_selector: zone_a.clone(),
                    service_selector: zone_a,
                    ip_pools: vec![],
                    ip_pool_selector: Selector::default(),
                    interfaces: vec![],
                    load_balancer_ips: true,
                    external_ips: false,
                },
            ),
        ];
        // The web Service may be announced by every node; the zone-a one by zone-a nodes only.
        let services = vec![
            service("t1/web", "10.78.0.1", ("tier", "web"), false),
            service("t2/db", "10.78.0.2", ("zone", "a"), true),
        ];
        let records: BTreeMap<String, NodeIpam> = [
            ("node-b".to_owned(), record("b", "ens3")),
            ("node-a".to_owned(), record("a", "eth1")),
        ]
        .into();
        let view = View {
            policies: &policies,
            pools: &[],
            services: &services,
            ready: &ReadyNodes::new(),
            records: &records,
            records_fresh: true,
            fence_open: true,
        };
        let said: Vec<IpAddr> = vec![
            "10.78.0.1".parse().unwrap(),
            "10.78.0.2".parse().unwrap(),
            "10.99.0.9".parse().unwrap(),
        ];
        // node-b says it answers all three: it keeps the one it may announce, on its own
        // interface; not the zone-a Service's (another tenant's, which no policy lets it
        // announce), nor 10.99.0.9, no Service's.
        let pins = pins(
            &view,
            &[Held {
                node: "node-b",
                answering: said.clone(),
            }],
        );
        assert_eq!(
            pins.get(&"10.78.0.1".parse().unwrap()),
            Some(&("node-b".to_owned(), vec!["ens3".to_owned()]))
        );
        assert!(!pins.contains_key(&"10.78.0.2".parse().unwrap()));
        assert!(!pins.contains_key(&"10.99.0.9".parse().unwrap()));
        // node-a may announce the Local Service's IP (no ready endpoint anywhere: the pin is
        // for endpoints moving away) on its eth1.
        let pins_a = super::pins(
            &view,
            &[Held {
                node: "node-a",
                answering: said,
            }],
        );
        assert_eq!(
            pins_a.get(&"10.78.0.2".parse().unwrap()),
            Some(&("node-a".to_owned(), vec!["eth1".to_owned()]))
        );
    }
}
