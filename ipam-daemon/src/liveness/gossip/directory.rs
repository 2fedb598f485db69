//! Where each node gossips, from the node records in the store: the seeds to join through, and
//! the node behind each member's address.

use std::{
    collections::{BTreeSet, HashMap},
    net::{IpAddr, SocketAddr},
};

use ipam_core::resources::NodeIpam;
use ipam_gossip::View;

use crate::cluster::cache::Cache;

/// The node records, as addresses.
pub(super) struct Directory {
    me: String,
    port: u16,
    records: Cache<NodeIpam>,
    by_ip: HashMap<IpAddr, String>,
    /// The other nodes a majority is reckoned from (kept with the records: the fence asks
    /// after every packet, the records change rarely).
    counted: BTreeSet<String>,
}

impl Directory {
    pub(super) fn new(me: &str, port: u16, records: Cache<NodeIpam>) -> Self {
        let mut directory = Self {
            me: me.to_owned(),
            port,
            records,
            by_ip: HashMap::new(),
            counted: BTreeSet::new(),
        };
        directory.index();
        directory
    }

    /// Takes a change of the records in.
    pub(super) fn apply(
        &mut self,
        event: Result<ipam_core::store::WatchEvent, ipam_core::store::StoreError>,
    ) {
        self.records.apply(event);
        self.index();
    }

    fn index(&mut self) {
        self.by_ip = self
            .records
            .iter()
            .flat_map(|r| {
                r.value
                    .spec
                    .addresses
                    .iter()
                    .map(move |ip| (*ip, r.name.clone()))
            })
            .collect();
        self.counted = self
            .records
            .iter()
            .filter(|r| {
                r.name != self.me
                    && !r.value.spec.addresses.is_empty()
                    && !r.value.lease_lapsed()
                    && r.value.spec.left.is_none()
            })
            .map(|r| r.name.clone())
            .collect();
    }

    /// This node's own gossip address, by its record: its first address.
    pub(super) fn own_address(&self) -> Option<IpAddr> {
        self.records
            .get(&self.me)
            .and_then(|r| r.value.spec.addresses.first().copied())
    }

    /// `node`'s addresses between nodes, by its record.
    pub(super) fn addresses_of(&self, node: &str) -> Vec<IpAddr> {
        self.records
            .get(node)
            .map(|r| r.value.spec.addresses.clone())
            .unwrap_or_default()
    }

    /// The node gossiping at `addr`, if it is one of the records'.
    pub(super) fn node_at(&self, addr: SocketAddr) -> Option<&str> {
        self.by_ip.get(&addr.ip()).map(String::as_str)
    }

    /// Where the other nodes gossip: each one's first address of this node's family.
    pub(super) fn seeds(&self, family_of: IpAddr) -> Vec<SocketAddr> {
        self.records
            .iter()
            .filter(|r| r.name != self.me)
            .filter_map(|r| {
                r.value
                    .spec
                    .addresses
                    .iter()
                    .find(|ip| ip.is_ipv4() == family_of.is_ipv4())
            })
            .map(|ip| SocketAddr::new(*ip, self.port))
            .collect()
    }

    /// The cluster as the fence reckons a majority from it: every node with a record that lists
    /// an address (less those the operator released for a lapsed lease, and those whose agent
    /// left, `liveness::leave`), this one included;
    /// and of those, the ones among `alive` (members held alive and unsuspected), plus this one.
    pub(super) fn view(&self, alive: impl IntoIterator<Item = SocketAddr>) -> View {
        let alive = alive
            .into_iter()
            .filter_map(|a| self.node_at(a))
            .filter(|n| self.counted.contains(*n))
            .collect::<BTreeSet<_>>()
            .len();
        View {
            members: self.counted.len() + 1,
            alive: alive + 1,
        }
    }

    /// How many nodes there are (at least this one), to size the protocol's dissemination.
    pub(super) fn size(&self) -> usize {
        self.records.iter().count().max(1)
    }

    /// The nodes behind `members`' addresses.
    pub(super) fn nodes_of(
        &self,
        members: impl IntoIterator<Item = SocketAddr>,
    ) -> BTreeSet<String> {
        members
            .into_iter()
            .filter_map(|m| self.node_at(m))
            .map(str::to_owned)
            .collect()
    }
}
