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
    namespaces: &[Versioned<Namespace>],
) -> Vec<(String, ServiceSpec, ServiceStatus)> {
    let known: BTreeMap<String, Namespace> = namespaces
        .iter()
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

/// Node `name` as the owner decision sees it, from its record.
pub fn node_named(name: &str, record: &NodeIpam) -> NodeView {
    NodeView {
        name: name.to_owned(),
        labels: record.spec.labels.clone(),
        interfaces: record.spec.interfaces.clone(),
        excluded: record.spec.announcing.excluded.clone(),
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
