//! The (name, spec[, status]) rows LB-IPAM and the owner decision take, from stored objects:
//! the operator, every agent and `ipamctl` build them the same way.

use super::{
    announce::{NodeView, ReadyNodes},
    resources::{
        L2AnnouncementPolicy, L2PolicySpec, LbIpPool, LbIpPoolSpec, LbIpPoolStatus, Namespace,
        Service, ServiceEndpoints, ServiceSpec, ServiceStatus, namespace_of,
    },
};
use crate::{resources::NodeIpam, store::Versioned};
use std::collections::BTreeMap;

pub fn pools<'a>(
    objects: impl IntoIterator<Item = &'a Versioned<LbIpPool>>,
) -> Vec<(String, LbIpPoolSpec)> {
    objects
        .into_iter()
        .map(|p| (p.name.clone(), p.value.spec.clone()))
        .collect()
}

/// The pools as pool filters (`ipPools`, `ipPoolSelector`) see them: name, labels and spec
/// (the status left out: nothing that chooses by pool reads it).
pub fn labelled_pools<'a>(
    objects: impl IntoIterator<Item = &'a Versioned<LbIpPool>>,
) -> Vec<(String, LbIpPool)> {
    objects
        .into_iter()
        .map(|p| {
            let pool = LbIpPool {
                labels: p.value.labels.clone(),
                spec: p.value.spec.clone(),
                status: LbIpPoolStatus::default(),
            };
            (p.name.clone(), pool)
        })
        .collect()
}

/// The pools with their stored status, as LB-IPAM takes them (the status says which pools an
/// earlier pass accepted).
pub fn pools_with_status<'a>(
    objects: impl IntoIterator<Item = &'a Versioned<LbIpPool>>,
) -> Vec<(String, LbIpPoolSpec, LbIpPoolStatus)> {
    objects
        .into_iter()
        .map(|p| (p.name.clone(), p.value.spec.clone(), p.value.status.clone()))
        .collect()
}

pub fn policies<'a>(
    objects: impl IntoIterator<Item = &'a Versioned<L2AnnouncementPolicy>>,
) -> Vec<(String, L2PolicySpec)> {
    objects
        .into_iter()
        .map(|p| (p.name.clone(), p.value.spec.clone()))
        .collect()
}

pub fn services<'a>(
    objects: impl IntoIterator<Item = &'a Versioned<Service>>,
) -> Vec<(String, ServiceSpec, ServiceStatus)> {
    objects
        .into_iter()
        .map(|s| (s.name.clone(), s.value.spec.clone(), s.value.status.clone()))
        .collect()
}

/// The Services as LB-IPAM takes them: each with the labels of its namespace (for pools'
/// `namespaceSelector`), from `namespaces`.
pub fn services_in<'a>(
    objects: impl IntoIterator<Item = &'a Versioned<Service>>,
    namespaces: impl IntoIterator<Item = &'a Versioned<Namespace>>,
) -> Vec<(String, ServiceSpec, ServiceStatus)> {
    let known: BTreeMap<String, Namespace> = namespaces
        .into_iter()
        .map(|n| (n.name.clone(), n.value.clone()))
        .collect();
    let mut rows = services(objects);
    for (name, spec, _) in &mut rows {
        spec.namespace_labels = Namespace::labels_of(&known, namespace_of(name));
    }
    rows
}

/// A node as the owner decision sees it: its name, labels and interfaces.
pub fn node(record: &Versioned<NodeIpam>) -> NodeView {
    node_named(&record.name, &record.value)
}

/// Why a node whose agent left answers nothing.
pub const LEFT: &str = "its agent left (a drain, an uninstall): it answers nothing until its \
                        next agent starts";

/// Node `name` as the owner decision sees it, from its record.
pub fn node_named(name: &str, record: &NodeIpam) -> NodeView {
    NodeView {
        name: name.to_owned(),
        labels: record.spec.labels.clone(),
        interfaces: record.spec.interfaces.clone(),
        // A node whose agent left (`spec.left`, written once its responders are silent) is
        // still a live gossip member until its goodbye: an IP moved to it meanwhile would be
        // answered by nobody (the drain test lost a request so when two agents left at once).
        excluded: record
            .spec
            .left
            .as_ref()
            .map(|_| LEFT.to_owned())
            .or_else(|| record.spec.announcing.excluded.clone()),
        warnings: record.spec.announcing.warnings.clone(),
    }
}

/// The nodes with a ready endpoint of each Service, over all its endpoint objects.
pub fn ready_nodes<'a>(
    objects: impl IntoIterator<Item = &'a Versioned<ServiceEndpoints>>,
) -> ReadyNodes {
    let mut out = ReadyNodes::new();
    for o in objects {
        let ready = o.value.spec.endpoints.iter().filter(|e| e.ready);
        out.entry(o.value.spec.service.clone())
            .or_default()
            .extend(ready.map(|e| e.node_name.clone()));
    }
    out.retain(|_, nodes| !nodes.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        lb::{
            announce::{ReadyNodes, owners},
            fixtures,
        },
        resources::{LeaveNotice, NodeInterface, NodeIpamSpec},
    };

    /// A node whose record says its agent left owns no IP, though the gossip still counts it
    /// live (until its goodbye): every IP goes to the node that answers.
    #[test]
    fn a_node_whose_agent_left_owns_no_ip() {
        let record = |left: bool| NodeIpam {
            spec: NodeIpamSpec {
                interfaces: vec![NodeInterface {
                    name: "eth0".into(),
                    addresses: vec!["10.0.1.1/24".into()],
                    mac: None,
                }],
                left: left.then_some(LeaveNotice { since_unix_ms: 1 }),
                ..NodeIpamSpec::default()
            },
            ..NodeIpam::default()
        };
        let nodes = [
            node_named("a", &record(false)),
            node_named("b", &record(true)),
        ];
        assert_eq!(nodes[1].excluded.as_deref(), Some(LEFT));
        let policies = fixtures::policy_for_all();
        let services = fixtures::services(16);
        let all = owners(&policies, &[], &services, &ReadyNodes::new(), &nodes);
        assert_eq!(all.len(), 16);
        assert!(all.iter().all(|a| a.node == "a"), "{all:?}");
    }
}
