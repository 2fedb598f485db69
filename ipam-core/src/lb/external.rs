//! Which of the Services' `spec.externalIPs` this project answers for, over L2 and over BGP.
//!
//! Whoever may create a Service may list any address in `externalIPs`, and Kubernetes checks
//! none of them (the class of CVE-2020-8554): a gateway, a node's own address, another tenant's
//! Service IP. An address answered for on the segment draws its traffic to the cluster, so one
//! is answered for only where the cluster admin's pools give it to the Service:
//! - it lies in an LB pool that serves the Service, by the rules LB-IPAM hands addresses out by
//!   (`namespaces`, `namespaceSelector`, `serviceSelector`);
//! - LB-IPAM has not assigned it to another Service;
//! - it is no node's address (a record's `addresses` or an interface's);
//! - no Service of another namespace that may also have it lists it, unless each allows the
//!   other's namespace (`sharingCrossNamespace`, the rule of shared LB IPs). Only Services the
//!   pools admit contest an address: a tenant cannot silence another's by listing it.
//!
//! The rest is refused, and the refusal says why (the Service's `Announced` condition, an
//! Event). Every agent and the operator judge from the same objects with this one function, so
//! what the operator's condition says is what the agents do.

use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use super::resources::{LbIpPool, ServiceSpec, ServiceStatus, may_share, namespace_of};
use crate::resources::NodeIpam;

/// How many refusals, and how many other Services, a message names: a condition's message
/// must stay well inside the API's limit whatever a tenant lists.
const SHOWN: usize = 5;

/// A Service as the decisions read it: name (`namespace/name`), spec, status.
pub type ServiceRow = (String, ServiceSpec, ServiceStatus);

/// Why one external IP of a Service is not answered for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// LB-IPAM assigned it to this other Service.
    AssignedTo(String),
    /// It is an address of this node.
    NodeAddress(String),
    /// It lies in no LB pool.
    OutsidePools,
    /// It lies in these pools, and none of them serves the Service.
    NotServed(Vec<String>),
    /// These Services of other namespaces, admitted too, list it, and the two do not both allow
    /// sharing across their namespaces.
    Contested(Vec<String>),
}

impl Refusal {
    /// What the Service's condition and Event say of `ip` refused for `service`.
    pub fn message(&self, ip: IpAddr, service: &str) -> String {
        match self {
            Self::AssignedTo(other) => format!(
                "{ip} is not announced for this service: it is assigned to {other} by LB-IPAM, \
                 and an IP LB-IPAM assigned is answered only for the Services it is assigned \
                 to; remove it from spec.externalIPs"
            ),
            Self::NodeAddress(node) => format!(
                "external IP {ip} is not announced: it is an address of node {node}, and \
                 answering for it would take that node's own traffic; remove it from \
                 spec.externalIPs"
            ),
            Self::OutsidePools => format!(
                "external IP {ip} is not announced: it lies in no LBIPPool, and an external IP \
                 is answered for only inside a pool that serves the Service's namespace (anyone \
                 who may create a Service may list any address, CVE-2020-8554); ask the cluster \
                 admin for a pool holding it that serves namespace {}, or remove it from \
                 spec.externalIPs",
                namespace_of(service)
            ),
            Self::NotServed(pools) => format!(
                "external IP {ip} is not announced: it lies in pool {}, which does not serve \
                 this Service (its namespaces, namespaceSelector or serviceSelector leave out \
                 namespace {} or the Service); ask the cluster admin to let the pool serve it, \
                 or remove it from spec.externalIPs",
                pools.join(", "),
                namespace_of(service)
            ),
            Self::Contested(others) => format!(
                "external IP {ip} is not announced: {} of another namespace also list{} it, and \
                 Services of different namespaces share an address only when each allows the \
                 other's namespace in the annotation ipam-ebpf.io/sharing-cross-namespace; it \
                 is answered for none of them until they agree or all but one remove it",
                named(others),
                if others.len() == 1 { "s" } else { "" }
            ),
        }
    }
}

/// A few names, and how many more.
fn named(names: &[String]) -> String {
    match names.len() {
        n if n <= SHOWN => names.join(", "),
        n => format!("{} and {} more", names[..SHOWN].join(", "), n - SHOWN),
    }
}

/// The judgement of every Service's external IPs: those refused, by Service (index into the
/// rows judged), in the order listed.
#[derive(Debug, Default)]
pub struct ExternalIps {
    refused: BTreeMap<usize, Vec<(IpAddr, Refusal)>>,
}

/// Judges the external IPs of `services` against `pools` (as `rows::labelled_pools` gives
/// them) and the nodes' addresses, which `node_addresses` gives only if some Service lists an
/// external IP (at scale the decision runs often, and external IPs are rare). The Services'
/// `namespace_labels` must be filled (`rows::services_in`) for pools that select namespaces.
pub fn judge(
    services: &[ServiceRow],
    pools: &[(String, LbIpPool)],
    node_addresses: impl FnOnce() -> BTreeMap<IpAddr, String>,
) -> ExternalIps {
    let mut judged = ExternalIps::default();
    if services
        .iter()
        .all(|(_, spec, _)| spec.external_ips.is_empty())
    {
        return judged;
    }
    let nodes = node_addresses();
    let mut assigned: BTreeMap<IpAddr, Vec<usize>> = BTreeMap::new();
    for (i, (_, spec, status)) in services.iter().enumerate() {
        if spec.is_ours() {
            for ip in &status.ingress {
                assigned.entry(*ip).or_default().push(i);
            }
        }
    }
    // The listings that pass every rule but the contest, by IP.
    let mut admitted: BTreeMap<IpAddr, Vec<usize>> = BTreeMap::new();
    for (i, (name, spec, _)) in services.iter().enumerate() {
        let listed: BTreeSet<IpAddr> = spec.external_ips.iter().copied().collect();
        for ip in listed {
            let refusal = match assigned.get(&ip) {
                // Its own LB IP listed again: answered as its LB IP.
                Some(holders) if holders.contains(&i) => continue,
                Some(holders) => Some(Refusal::AssignedTo(services[holders[0]].0.clone())),
                None => nodes
                    .get(&ip)
                    .map(|node| Refusal::NodeAddress(node.clone()))
                    .or_else(|| pool_refusal(ip, name, spec, pools)),
            };
            match refusal {
                Some(refusal) => judged.refused.entry(i).or_default().push((ip, refusal)),
                None => admitted.entry(ip).or_default().push(i),
            }
        }
    }
    for (ip, listing) in admitted {
        // Most IPs are listed by one namespace; only then are pairs looked at.
        let first = namespace_of(&services[listing[0]].0);
        if listing
            .iter()
            .all(|&i| namespace_of(&services[i].0) == first)
        {
            continue;
        }
        for &i in &listing {
            let (name, spec, _) = &services[i];
            let others: Vec<String> = listing
                .iter()
                .filter(|&&j| {
                    let (other, other_spec, _) = &services[j];
                    !may_share(name, spec, other, other_spec)
                })
                .map(|&j| services[j].0.clone())
                .collect();
            if !others.is_empty() {
                judged
                    .refused
                    .entry(i)
                    .or_default()
                    .push((ip, Refusal::Contested(others)));
            }
        }
    }
    for refusals in judged.refused.values_mut() {
        refusals.sort_by_key(|(ip, _)| *ip);
    }
    judged
}

/// Why no pool lets `service` have `ip`, if none does.
fn pool_refusal(
    ip: IpAddr,
    service: &str,
    spec: &ServiceSpec,
    pools: &[(String, LbIpPool)],
) -> Option<Refusal> {
    let holding: Vec<&(String, LbIpPool)> =
        pools.iter().filter(|(_, p)| p.spec.contains(ip)).collect();
    if holding.is_empty() {
        return Some(Refusal::OutsidePools);
    }
    (!holding.iter().any(|(_, p)| p.spec.serves(service, spec)))
        .then(|| Refusal::NotServed(holding.iter().map(|(n, _)| n.clone()).collect()))
}

impl ExternalIps {
    /// `services` with the refused external IPs left out: borrowed when none is.
    pub fn admitted<'r>(&self, services: &'r [ServiceRow]) -> Cow<'r, [ServiceRow]> {
        if self.refused.is_empty() {
            return Cow::Borrowed(services);
        }
        let mut rows = services.to_vec();
        for (i, refusals) in &self.refused {
            let refused: BTreeSet<IpAddr> = refusals.iter().map(|(ip, _)| *ip).collect();
            rows[*i].1.external_ips.retain(|ip| !refused.contains(ip));
        }
        Cow::Owned(rows)
    }

    /// Each Service `told` selects with a refused external IP, and why: the first few
    /// refusals, `; `-joined, and how many more (a condition's message has a size limit, and a
    /// Service may list thousands).
    pub fn problems(
        &self,
        services: &[ServiceRow],
        told: impl Fn(&ServiceRow) -> bool,
    ) -> BTreeMap<String, String> {
        self.refused
            .iter()
            .filter(|(i, _)| told(&services[**i]))
            .map(|(i, refusals)| {
                let name = &services[*i].0;
                let mut said: Vec<String> = refusals
                    .iter()
                    .take(SHOWN)
                    .map(|(ip, refusal)| refusal.message(*ip, name))
                    .collect();
                if refusals.len() > SHOWN {
                    said.push(format!(
                        "and {} more external IPs refused",
                        refusals.len() - SHOWN
                    ));
                }
                (name.clone(), said.join("; "))
            })
            .collect()
    }

    /// The refusals of Service `index` (into the rows judged).
    pub fn refused(&self, index: usize) -> &[(IpAddr, Refusal)] {
        self.refused.get(&index).map_or(&[], Vec::as_slice)
    }
}

/// Every node's addresses, by the records: the node's `addresses` and its interfaces'.
pub fn node_addresses<'a>(
    records: impl IntoIterator<Item = (&'a str, &'a NodeIpam)>,
) -> BTreeMap<IpAddr, String> {
    let mut out = BTreeMap::new();
    for (node, record) in records {
        let on_interfaces = record.spec.interfaces.iter().flat_map(|i| {
            i.addresses
                .iter()
                .filter_map(|a| a.split('/').next()?.parse::<IpAddr>().ok())
        });
        for ip in record.spec.addresses.iter().copied().chain(on_interfaces) {
            out.entry(ip).or_insert_with(|| node.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests;
