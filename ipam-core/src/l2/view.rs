//! What one node's L2 decision reads of its copies of the store, and what it looks up there.

use std::collections::HashSet;

use super::NodeRecords;
use crate::lb::{
    announce::{NodeView, ReadyNodes},
    resources::{L2PolicySpec, LbIpPool, ServiceSpec, ServiceStatus, TrafficPolicy},
    rows,
};

/// What one node's decision reads: its copies of the store, as rows.
pub struct View<'a> {
    pub policies: &'a [(String, L2PolicySpec)],
    /// The pools, for policies that choose IPs by pool (`ipPools`, `ipPoolSelector`).
    pub pools: &'a [(String, LbIpPool)],
    /// The Services, with their namespaces' labels (`rows::services_in`): their external IPs
    /// are judged by the pools' namespace rules (`lb::external`).
    pub services: &'a [(String, ServiceSpec, ServiceStatus)],
    /// The nodes with a ready endpoint of each Service.
    pub ready: &'a ReadyNodes,
    pub records: &'a dyn NodeRecords,
    /// Whether the copy of the records follows the store (its watch works): a stale one may
    /// lack a restart notice.
    pub records_fresh: bool,
    /// Whether this node's fence lets its responders answer now. While it is closed (the node
    /// cut off from most of the others, or its lease not renewed) its view of who is live is
    /// its side's alone: the first decision with it closed gives up every IP, none takes an IP
    /// while it stays closed, and every IP taken after it reopens waits the hand-over
    /// (`Decider::decide`).
    pub fence_open: bool,
}

impl View<'_> {
    /// The Services announced only from nodes where their endpoints run.
    pub(super) fn local_services(&self) -> HashSet<&str> {
        self.services
            .iter()
            .filter(|(_, spec, _)| spec.external_traffic_policy == TrafficPolicy::Local)
            .map(|(name, _, _)| name.as_str())
            .collect()
    }

    /// Whether `service`, one of `local`, has no ready endpoint on `node`.
    pub(super) fn endpoints_left(&self, local: &HashSet<&str>, service: &str, node: &str) -> bool {
        local.contains(service) && !self.ready.get(service).is_some_and(|r| r.contains(node))
    }

    /// Of the interfaces an IP is announced on here (`on`), those `node` announced from and
    /// cannot any more, as its record says (`edge0: no carrier (the link is lost)`), if any.
    pub(super) fn interfaces_down(&self, node: &str, on: &[String]) -> Option<String> {
        let record = &self.records.record(node)?.spec;
        let down: Vec<String> = record
            .interfaces_down
            .iter()
            .filter(|d| on.contains(&d.name))
            .map(|d| format!("{}: {}", d.name, d.why))
            .collect();
        (!down.is_empty()).then(|| down.join(", "))
    }

    /// `node`'s MAC on the segment of `me`'s interface `interface`: that of its interface with
    /// an address in one of the same subnets, as the records say.
    pub(super) fn mac_on_segment(&self, node: &str, me: &str, interface: &str) -> Option<[u8; 6]> {
        let mine = self
            .records
            .record(me)?
            .spec
            .interfaces
            .iter()
            .find(|i| i.name == interface)?
            .subnets()
            .collect::<Vec<_>>();
        self.records
            .record(node)?
            .spec
            .interfaces
            .iter()
            .find(|i| i.subnets().any(|s| mine.contains(&s)))?
            .mac_octets()
    }

    /// The nodes of `live` as the owner decision sees them.
    pub(super) fn live_nodes(&self, live: &mut dyn FnMut(&str) -> bool) -> Vec<NodeView> {
        self.records
            .each()
            .filter(|(name, _)| live(name))
            .map(|(name, record)| rows::node_named(name, record))
            .collect()
    }
}
