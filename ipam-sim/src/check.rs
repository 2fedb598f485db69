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
