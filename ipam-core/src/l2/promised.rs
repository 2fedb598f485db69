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
use crate::lb::announce::{Announcement, NodeView, ReadyNodes, owners, weight};

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
        let node = NodeView {
            name: h.node.to_owned(),
            labels: record.spec.labels.clone(),
            interfaces: record.spec.interfaces.clone(),
            excluded: record.spec.announcing.excluded.clone(),
            warnings: record.spec.announcing.warnings.clone(),
        };
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
