//! `ipamctl get`'s tables, one per kind: a line per object, its first false condition (or
//! its first) last.

use std::{collections::BTreeMap, net::IpAddr};

use ipam_core::{
    lb::{
        bgp::{BgpAdvertisement, BgpPeer},
        resources::{L2AnnouncementPolicy, LbIpPool, Service, ServiceEndpoints},
    },
    meta::Condition,
    resources::PodIpPool,
};

use crate::output::table;

pub(super) fn services(items: &BTreeMap<String, Service>, announcing: &BTreeMap<IpAddr, String>) {
    let mut rows = table(["SERVICE", "IPS", "ANNOUNCED BY", "CONDITION"]);
    for (name, s) in items {
        let ips: Vec<String> = s.status.ingress.iter().map(ToString::to_string).collect();
        let by: Vec<String> = s
            .status
            .ingress
            .iter()
            .map(|ip| announcing.get(ip).cloned().unwrap_or_else(|| "-".into()))
            .collect();
        rows.add_row([
            name.clone(),
            if ips.is_empty() {
                "<pending>".into()
            } else {
                ips.join(",")
            },
            by.join(","),
            condition(&s.status.conditions),
        ]);
    }
    println!("{rows}");
}

pub(super) fn service_endpoints(items: &BTreeMap<String, ServiceEndpoints>) {
    let mut rows = table(["ENDPOINTS", "SERVICE", "READY ON", "NOT READY ON"]);
    for (name, e) in items {
        let on = |ready: bool| {
            let nodes: Vec<&str> = e
                .spec
                .endpoints
                .iter()
                .filter(|p| p.ready == ready)
                .map(|p| p.node_name.as_str())
                .collect();
            nodes.join(",")
        };
        rows.add_row([name.clone(), e.spec.service.clone(), on(true), on(false)]);
    }
    println!("{rows}");
}

pub(super) fn lb_pools(items: &BTreeMap<String, LbIpPool>) {
    let mut rows = table(["POOL", "DISABLED", "USED/TOTAL", "CONDITION"]);
    for (name, p) in items {
        let counts: Vec<String> = p
            .status
            .counts
            .iter()
            .map(|c| format!("{} {}/{}", c.family.name(), c.used, c.total))
            .collect();
        rows.add_row([
            name.clone(),
            p.spec.disabled.to_string(),
            counts.join(", "),
            condition(&p.status.conditions),
        ]);
    }
    println!("{rows}");
}

pub(super) fn l2_policies(items: &BTreeMap<String, L2AnnouncementPolicy>) {
    let mut rows = table(["POLICY", "INTERFACES", "LB IPS", "EXTERNAL IPS"]);
    for (name, p) in items {
        rows.add_row([
            name.clone(),
            p.spec.interfaces.join(","),
            p.spec.load_balancer_ips.to_string(),
            p.spec.external_ips.to_string(),
        ]);
    }
    println!("{rows}");
}

pub(super) fn bgp_peers(items: &BTreeMap<String, BgpPeer>) {
    let mut rows = table([
        "PEER",
        "ADDRESS",
        "PEER ASN",
        "LOCAL ASN",
        "BFD",
        "CONDITION",
    ]);
    for (name, p) in items {
        rows.add_row([
            name.clone(),
            p.spec.peer_address.to_string(),
            p.spec.peer_asn.to_string(),
            p.spec.local_asn.to_string(),
            p.spec.bfd.is_some().to_string(),
            condition(&p.status.conditions),
        ]);
    }
    println!("{rows}");
}

pub(super) fn bgp_advertisements(items: &BTreeMap<String, BgpAdvertisement>) {
    let mut rows = table(["ADVERTISEMENT", "POOLS", "PEERS", "COMMUNITIES"]);
    let all = |list: &[String]| {
        if list.is_empty() {
            "(all)".to_owned()
        } else {
            list.join(",")
        }
    };
    for (name, a) in items {
        rows.add_row([
            name.clone(),
            all(&a.spec.ip_pools),
            all(&a.spec.peers),
            a.spec.communities.join(","),
        ]);
    }
    println!("{rows}");
}

pub(super) fn pod_pools(items: &BTreeMap<String, PodIpPool>) {
    let mut rows = table(["POOL", "CONDITION"]);
    for (name, p) in items {
        rows.add_row([name.clone(), condition(&p.status.conditions)]);
    }
    println!("{rows}");
}

/// The first false condition, or the first: `Type=status: message`.
pub(super) fn condition(c: &[Condition]) -> String {
    c.iter()
        .find(|c| !c.status)
        .or(c.first())
        .map_or(String::new(), |c| {
            format!("{}={}: {}", c.kind, c.status, c.message)
        })
}
