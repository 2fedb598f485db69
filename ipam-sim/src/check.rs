//! The invariants, and what a broken one reports.

use std::{fmt, time::Duration};

/// What must hold at every step (checked wherever anything may have changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariant {
    /// Never two nodes answering one IP on the segment (two MACs for one IP).
    OneAnswer,
    /// Every IP with an eligible node answered by its owner alone, within
    /// [`crate::world::BOUND`] after the last disturbance.
    Answered,
    /// No IP held by two Services, but by Services that may share it (the same sharing key,
    /// namespaces that allow each other, the same traffic policy).
    AddressOnce,
    /// No Service holds an IP of a pool that does not serve its namespace.
    TenantPool,
    /// No node's pods set not ready unless the node was down or cut off from a majority of
    /// the nodes within [`crate::world::EVIDENCE`]; and never twice for one death (a kubelet
    /// that restored them keeps the last word).
    NoLiveNodeMarked,
}

impl Invariant {
    pub fn name(self) -> &'static str {
        match self {
            Self::OneAnswer => "one answer per IP",
            Self::Answered => "every IP answered by its owner",
            Self::AddressOnce => "no address held twice",
            Self::TenantPool => "no tenant given another's address",
            Self::NoLiveNodeMarked => "no live node's pods marked not ready",
        }
    }
}

/// A broken invariant: which, when, what was seen, and what happened just before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: Invariant,
    pub at: Duration,
    pub what: String,
    /// The last happenings before it, oldest first.
    pub trace: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "broken at t={:.3}s: {}: {}",
            self.at.as_secs_f64(),
            self.invariant.name(),
            self.what
        )?;
        writeln!(f, "what happened before:")?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// What breaks [`Invariant::AddressOnce`] or [`Invariant::TenantPool`] in `objects`, if
/// anything.
pub fn addresses(objects: &crate::store::Objects) -> Option<(Invariant, String)> {
    use std::collections::BTreeMap;

    use ipam_core::lb::resources::namespace_of;

    let mut holders: BTreeMap<std::net::IpAddr, Vec<&crate::store::ServiceRow>> = BTreeMap::new();
    for row in &objects.services {
        for ip in &row.2.ingress {
            holders.entry(*ip).or_default().push(row);
        }
    }
    for (ip, rows) in &holders {
        let first = rows[0];
        for other in &rows[1..] {
            let shares = first.1.sharing_key.is_some()
                && first.1.sharing_key == other.1.sharing_key
                && namespace_of(&first.0) == namespace_of(&other.0)
                && first.1.external_traffic_policy == other.1.external_traffic_policy;
            if !shares {
                return Some((
                    Invariant::AddressOnce,
                    format!(
                        "{ip} held by {} and {}, which may not share it",
                        first.0, other.0
                    ),
                ));
            }
        }
        for row in rows {
            let namespace = namespace_of(&row.0);
            let served = objects.pools.iter().any(|(_, spec, _)| {
                (spec.namespaces.is_empty() || spec.namespaces.iter().any(|n| n == namespace))
                    && spec
                        .blocks
                        .iter()
                        .filter_map(ipam_core::lb::resources::LbIpBlock::bounds)
                        .any(|(_, first, last)| {
                            (first..=last).contains(&ipam_core::cidr::ip_to_u128(*ip))
                        })
            });
            if !served {
                return Some((
                    Invariant::TenantPool,
                    format!(
                        "{} (namespace {namespace}) holds {ip}, in no pool serving its namespace",
                        row.0
                    ),
                ));
            }
        }
    }
    None
}

/// The addresses no node may answer for, each with why: held by no Service (`status`), and
/// refused to every Service listing it in `externalIPs` by the rules that do not change with
/// time (no pool containing it serves the Service's namespace, or it is a node's address).
/// Restated here rather than taken from `ipam_core::lb::external`, so that a wrong judgement
/// there shows. An address no Service holds or lists any more is not a tenant's matter (the
/// agents' copies lag the store).
pub fn refused_listings(
    objects: &crate::store::Objects,
) -> std::collections::BTreeMap<std::net::IpAddr, String> {
    use std::collections::{BTreeMap, BTreeSet};

    use ipam_core::lb::resources::namespace_of;

    let held: BTreeSet<std::net::IpAddr> = objects
        .services
        .iter()
        .flat_map(|s| s.2.ingress.iter().copied())
        .collect();
    let mut listing: BTreeMap<std::net::IpAddr, Vec<&str>> = BTreeMap::new();
    for (name, spec, _) in &objects.services {
        for ip in spec.external_ips.iter().filter(|ip| !held.contains(ip)) {
            listing.entry(*ip).or_default().push(name);
        }
    }
    let node_of = |ip: std::net::IpAddr| {
        let text = ip.to_string();
        objects.records.iter().find_map(|(name, r)| {
            let on_interface = r.spec.interfaces.iter().any(|i| {
                i.addresses
                    .iter()
                    .any(|a| a.split('/').next() == Some(text.as_str()))
            });
            (r.spec.addresses.contains(&ip) || on_interface).then_some(name)
        })
    };
    listing
        .into_iter()
        .filter_map(|(ip, services)| {
            let node = node_of(ip);
            let admitted = |service: &str| {
                let namespace = namespace_of(service);
                objects.pools.iter().any(|(_, spec, _)| {
                    spec.contains(ip)
                        && (spec.namespaces.is_empty()
                            || spec.namespaces.iter().any(|n| n == namespace))
                })
            };
            if node.is_none() && services.iter().any(|s| admitted(s)) {
                return None;
            }
            let why = match node {
                Some(name) => format!("it is {name}'s address, listed by {}", services.join(", ")),
                None => format!(
                    "listed in externalIPs by {}, and no pool containing it serves their \
                     namespaces",
                    services.join(", ")
                ),
            };
            Some((ip, why))
        })
        .collect()
}
