//! The invariants, checked at every instant the world is looked at: between two of them
//! nothing changes but the passing of responders' deadlines, which only silences a node.

use std::{collections::BTreeMap, net::IpAddr, time::Duration};

use ipam_core::lb::{
    announce::{NodeView, owners},
    external, rows,
};

use super::{BOUND, World};
use crate::{
    check::{Invariant, Violation},
    store::node_index,
};

/// How often, once every IP must be answered by its owner, that is checked: an IP may be
/// answered by nobody for a moment while it moves (a hand-over's wait, a decision's length).
pub(super) const ANSWERED_EVERY: Duration = Duration::from_millis(100);

impl World {
    fn count(&mut self, invariant: Invariant) {
        *self.exercised.checks.entry(invariant.name()).or_default() += 1;
    }

    /// The invariants on what the datapaths answer now, and on the store if it changed.
    pub(super) fn check(&mut self) -> Result<(), Violation> {
        let now = self.now;
        // One answer per IP. A step with no instant looked at changes nothing, but responders
        // whose deadline passes stop answering: that never makes two answers of one.
        self.count(Invariant::OneAnswer);
        let mut answered: BTreeMap<IpAddr, usize> = BTreeMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if !n.answers(now) {
                continue;
            }
            for ip in &n.datapath.answering {
                if let Some(other) = answered.insert(*ip, i) {
                    return Err(self.violation(
                        Invariant::OneAnswer,
                        format!("{ip} answered by node-{other} and node-{i}"),
                    ));
                }
            }
        }
        // No address answered that no Service may have: judged on what the datapaths answer,
        // by the rules restated (`check::refused_listings`), not by the decision's own
        // function; worked out again only when the store changed.
        if self.refused_checked != Some(self.store.revision()) {
            self.refused_checked = Some(self.store.revision());
            self.refused = crate::check::refused_listings(&self.store.now);
        }
        self.count(Invariant::TenantPool);
        for (ip, what) in &self.refused {
            if let Some(node) = answered.get(ip) {
                return Err(self.violation(
                    Invariant::TenantPool,
                    format!("{ip} answered by node-{node}: {what}"),
                ));
            }
        }
        // The Services' addresses, after every write to the store.
        if self.addresses_checked != Some(self.store.revision()) {
            self.addresses_checked = Some(self.store.revision());
            self.count(Invariant::AddressOnce);
            self.count(Invariant::TenantPool);
            if let Some((invariant, what)) = crate::check::addresses(&self.store.now) {
                return Err(self.violation(invariant, what));
            }
        }
        if now >= self.settled_at && now.as_nanos().is_multiple_of(ANSWERED_EVERY.as_nanos()) {
            self.count(Invariant::Answered);
            let expected = self.expected_owners();
            for (ip, owner) in &expected {
                if answered.get(ip) != Some(owner) {
                    let by = answered
                        .get(ip)
                        .map_or("nobody".to_owned(), |n| format!("node-{n}"));
                    return Err(self.violation(
                        Invariant::Answered,
                        format!(
                            "{ip} answered by {by}, {:.1} s after the last disturbance; its \
                             owner among the eligible nodes is node-{owner}",
                            (now.saturating_sub(self.settled_at) + BOUND).as_secs_f64()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every IP's owner among the nodes that may answer now (powered, NIC up, an agent whose
    /// fence is open), from the store as it is: what every agent converges to.
    fn expected_owners(&self) -> BTreeMap<IpAddr, usize> {
        let eligible: Vec<NodeView> = self
            .nodes
            .iter()
            .filter(|n| {
                n.powered && n.nic_up && n.agent.as_ref().is_some_and(|a| a.latch.is_open())
            })
            .map(|n| rows::node_named(&n.name, &self.store.now.records[&n.name]))
            .collect();
        let objects = &self.store.now;
        let pools = crate::store::lb_pools(&objects.pools);
        let judged = external::judge(&objects.services, &pools, || {
            external::node_addresses(objects.records.iter().map(|(n, r)| (n.as_str(), r)))
        });
        owners(
            &objects.policies,
            &pools,
            &judged.admitted(&objects.services),
            &objects.ready,
            &eligible,
        )
        .into_iter()
        .filter_map(|a| Some((a.ip, node_index(&a.node)?)))
        .collect()
    }

    pub(super) fn violation(&self, invariant: Invariant, what: String) -> Violation {
        Violation {
            invariant,
            at: self.now,
            what,
            trace: self.trace.iter().cloned().collect(),
        }
    }
}
