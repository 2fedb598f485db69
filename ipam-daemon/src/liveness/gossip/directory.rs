//! Where each node gossips, from the node records in the store: the seeds to join through, and
//! the node behind each member's address.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use ipam_core::resources::NodeIpam;
use ipam_gossip::{PublicKey, Signers, Speaker, View, signing::Contested};

use crate::cluster::cache::Cache;

/// The node records, as addresses.
pub(super) struct Directory {
    me: String,
    port: u16,
    records: Cache<NodeIpam>,
    /// The other nodes a majority is reckoned from (kept with the records: the fence asks
    /// after every packet, the records change rarely).
    counted: BTreeSet<String>,
    /// The other nodes whose records say their agent left (`liveness::leave`): counted only
    /// while their gossip member is alive all the same (a note that is stale, or written by
    /// someone else, takes no live node out of the count).
    left: BTreeSet<String>,
    /// Who speaks for each address, by the records' addresses and published keys.
    signers: Arc<Signers>,
    /// Addresses more than one record lists (nobody's, so nothing from them is taken), and the
    /// records whose key cannot be read.
    contested: Vec<Contested>,
    unreadable: Vec<(String, String)>,
}

impl Directory {
    pub(super) fn new(me: &str, port: u16, records: Cache<NodeIpam>) -> Self {
        let mut directory = Self {
            me: me.to_owned(),
            port,
            records,
            counted: BTreeSet::new(),
            left: BTreeSet::new(),
            signers: Arc::default(),
            contested: Vec::new(),
            unreadable: Vec::new(),
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
        let (left, counted): (Vec<_>, Vec<_>) = self
            .records
            .iter()
            .filter(|r| {
                r.name != self.me && !r.value.spec.addresses.is_empty() && !r.value.lease_lapsed()
            })
            .partition(|r| r.value.spec.left.is_some());
        self.counted = counted.into_iter().map(|r| r.name.clone()).collect();
        self.left = left.into_iter().map(|r| r.name.clone()).collect();
        self.index_signers();
    }

    /// Who speaks for each address: the one record listing it, with the key it publishes
    /// (none: an agent of the previous release, which does not sign).
    fn index_signers(&mut self) {
        let mut unreadable = Vec::new();
        let claims: Vec<(&str, &[IpAddr], Speaker)> = self
            .records
            .iter()
            .map(|r| {
                let spec = &r.value.spec;
                let speaker = match spec.gossip_key.as_deref().map(str::parse::<PublicKey>) {
                    None if spec.agent_version.is_none() => Speaker::Unsigned,
                    None => Speaker::Pending,
                    Some(Ok(key)) => Speaker::Signed(key),
                    Some(Err(e)) => {
                        unreadable.push((r.name.clone(), e.to_string()));
                        Speaker::Unreadable
                    }
                };
                (r.name.as_str(), spec.addresses.as_slice(), speaker)
            })
            .collect();
        let (signers, contested) = Signers::from_records(claims);
        self.signers = Arc::new(signers);
        self.contested = contested;
        self.unreadable = unreadable;
    }

    /// Who speaks for each address, for the envelope.
    pub(super) fn signers(&self) -> Arc<Signers> {
        self.signers.clone()
    }

    /// Addresses more than one record lists: packets from them are refused (a record that
    /// lists another node's address is wrong, or written by a compromised node).
    pub(super) fn contested(&self) -> &[Contested] {
        &self.contested
    }

    /// Records whose gossip key cannot be read, with why: nothing from their addresses is taken.
    pub(super) fn unreadable_keys(&self) -> &[(String, String)] {
        &self.unreadable
    }

    /// Each record whose gossip is refused, with why and what to do (the log, the metrics'
    /// count and `ipamctl members` say the same).
    pub(super) fn refused_records(&self) -> Vec<String> {
        let contested = self.contested.iter().map(|c| {
            format!(
                "address {} is listed by the records of {}: gossip from it is refused until only \
                 one of them lists it (a record listing another node's address is wrong or was \
                 written by a compromised node; a gone node's record is deleted with `kubectl \
                 delete nodeipam <node>`)",
                c.address,
                c.claimants.join(" and ")
            )
        });
        let unreadable = self.unreadable.iter().map(|(node, why)| {
            format!("node {node}'s record: {why}; gossip from its addresses is refused")
        });
        contested.chain(unreadable).collect()
    }

    /// The gossip key this node's own record publishes.
    pub(super) fn own_key(&self) -> Option<&str> {
        self.records
            .get(&self.me)
            .and_then(|r| r.value.spec.gossip_key.as_deref())
    }

    /// Whether this node's own record says its agent left (`liveness::leave`): the others do
    /// not count it in their majority until its agent clears the note.
    pub(super) fn counted_out(&self) -> bool {
        self.records
            .get(&self.me)
            .is_some_and(|r| r.value.spec.left.is_some())
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

    /// The node gossiping at `addr`, if one record alone lists it (a contested address is
    /// nobody's: nothing from it is taken, and no one is counted alive for it). The same table
    /// the envelope checks signatures against, so the two never name different nodes.
    pub(super) fn node_at(&self, addr: SocketAddr) -> Option<&str> {
        self.signers.claimant(addr.ip())
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
    /// left, `liveness::leave`, unless their member is alive all the same), this one included;
    /// and of those, the ones among `alive` (members held alive and unsuspected), plus this one.
    pub(super) fn view(&self, alive: impl IntoIterator<Item = SocketAddr>) -> View {
        let alive: BTreeSet<&str> = alive.into_iter().filter_map(|a| self.node_at(a)).collect();
        let left_but_alive = alive.iter().filter(|n| self.left.contains(**n)).count();
        let counted_alive = alive.iter().filter(|n| self.counted.contains(**n)).count();
        View {
            members: self.counted.len() + left_but_alive + 1,
            alive: counted_alive + left_but_alive + 1,
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

#[cfg(test)]
mod tests {
    use ipam_core::{
        resources::{LeaveNotice, NodeIpamSpec},
        store::{RawObject, Revision},
    };

    use super::*;

    fn record(name: &str, address: &str, left: bool) -> RawObject {
        let value = NodeIpam {
            spec: NodeIpamSpec {
                addresses: vec![address.parse().unwrap()],
                left: left.then_some(LeaveNotice { since_unix_ms: 1 }),
                ..Default::default()
            },
            ..Default::default()
        };
        RawObject {
            kind: "NodeIPAM".into(),
            name: name.into(),
            revision: Revision::Number(1),
            value: serde_json::to_vec(&value).unwrap(),
        }
    }

    /// Nodes a, b and c at 10.0.0.1-3, each noted as left or not.
    fn three_nodes(left: [bool; 3]) -> Vec<RawObject> {
        ["a", "b", "c"]
            .into_iter()
            .zip(left)
            .enumerate()
            .map(|(i, (name, left))| record(name, &format!("10.0.0.{}", i + 1), left))
            .collect()
    }

    fn directory(me: &str, records: &[RawObject]) -> Directory {
        Directory::new(me, 7946, Cache::new(records))
    }

    /// Two of three noted their leave: the third is a cluster of one, and answers.
    #[test]
    fn nodes_that_left_are_not_counted_in_the_majority() {
        let records = three_nodes([true, true, false]);
        let c = directory("c", &records);
        assert_eq!(
            c.view([]),
            View {
                members: 1,
                alive: 1
            }
        );
        assert!(!c.counted_out());
        let alive: SocketAddr = "10.0.0.1:7946".parse().unwrap();
        assert_eq!(
            c.view([alive]),
            View {
                members: 2,
                alive: 2
            },
            "a node whose record says it left is counted while its member is alive all the same"
        );
    }

    /// A returning node whose own record still says it left is counted out by the others:
    /// its fence must stay closed until its note is cleared.
    #[test]
    fn a_node_whose_own_record_says_it_left_is_counted_out() {
        let records = three_nodes([true, false, false]);
        assert!(directory("a", &records).counted_out());
        assert!(!directory("b", &records).counted_out());
        assert_eq!(
            directory("b", &records).view([]),
            View {
                members: 2,
                alive: 1
            }
        );
    }

    fn with_key(mut raw: RawObject, key: Option<&str>, extra: Option<&str>) -> RawObject {
        let mut value: NodeIpam = serde_json::from_slice(&raw.value).unwrap();
        value.spec.gossip_key = key.map(str::to_owned);
        if let Some(extra) = extra {
            value.spec.addresses.push(extra.parse().unwrap());
        }
        raw.value = serde_json::to_vec(&value).unwrap();
        raw
    }

    /// The records' keys decide who speaks for each address: a node's published key, none for
    /// a node of the previous release; an address a second record lists (here node c, listing
    /// a's address too) is nobody's, so a's gossip is refused and a counts as no member alive,
    /// and an unreadable key is neither signed nor unsigned.
    #[test]
    fn signers_come_from_the_records_and_a_contested_address_is_nobody_s() {
        let a_key = ipam_gossip::NodeKey::from_seed(&[1; 32]).public();
        let a_text = a_key.to_string();
        let records = three_nodes([false; 3]);
        let records = vec![
            with_key(records[0].clone(), Some(&a_text), None),
            with_key(records[1].clone(), None, None),
            with_key(records[2].clone(), Some("ed25519:xyz"), None),
        ];
        let mut starting = with_key(records[1].clone(), None, None);
        let mut value: NodeIpam = serde_json::from_slice(&starting.value).unwrap();
        value.spec.agent_version = Some("0.1.0".into());
        starting.value = serde_json::to_vec(&value).unwrap();
        let with_starting = [records[0].clone(), starting, records[2].clone()];
        assert_eq!(
            directory("a", &with_starting)
                .signers()
                .speaker("10.0.0.2".parse().unwrap()),
            Some(Speaker::Pending),
            "a record of a release that signs, without its key yet, is not taken as unsigned"
        );
        let b = directory("b", &records);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            b.signers().speaker(ip("10.0.0.1")),
            Some(Speaker::Signed(a_key))
        );
        assert_eq!(b.signers().speaker(ip("10.0.0.2")), Some(Speaker::Unsigned));
        assert_eq!(
            b.signers().speaker(ip("10.0.0.3")),
            Some(Speaker::Unreadable)
        );
        assert_eq!(b.unreadable_keys().len(), 1);
        assert!(b.unreadable_keys()[0].1.contains("ed25519:xyz"));
        assert_eq!(directory("a", &records).own_key(), Some(a_text.as_str()));
        assert_eq!(b.node_at(addr("10.0.0.1:7946")), Some("a"));

        let mut contested = records.clone();
        contested[2] = with_key(records[2].clone(), None, Some("10.0.0.1"));
        let b = directory("b", &contested);
        assert_eq!(b.signers().speaker(ip("10.0.0.1")), None);
        assert_eq!(b.contested().len(), 1);
        assert_eq!(b.contested()[0].claimants, ["a", "c"]);
        let said = b.refused_records();
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].starts_with("address 10.0.0.1 is listed by the records of a and c"),
            "{said:?}"
        );
        assert_eq!(b.node_at(addr("10.0.0.1:7946")), None);
        assert_eq!(
            b.view([addr("10.0.0.1:7946")]),
            View {
                members: 3,
                alive: 1
            },
            "nobody is counted alive for a contested address"
        );
        assert_eq!(
            b.view([addr("10.0.0.1:7946"), addr("10.0.0.3:7946")]),
            View {
                members: 3,
                alive: 2
            },
            "the contesting record's own address still counts it"
        );
    }

    /// A node gone (its lease lapsed) whose address a new node now uses: contested, nobody's,
    /// whatever the names' order (a compromised node listing a dead node's address must not
    /// speak for it), until the old record is deleted.
    #[test]
    fn a_lapsed_record_still_contests_its_addresses() {
        let new_key = ipam_gossip::NodeKey::from_seed(&[7; 32]).public();
        let records = three_nodes([false; 3]);
        let mut gone: NodeIpam = serde_json::from_slice(&records[2].value).unwrap();
        gone.spec.addresses = vec!["10.0.0.9".parse().unwrap()];
        gone.status.conditions.push(ipam_core::meta::Condition::new(
            ipam_core::resources::LEASE_LAPSED,
            true,
            "lapsed",
        ));
        let mut gone_record = record("z-gone", "10.0.0.9", false);
        gone_record.value = serde_json::to_vec(&gone).unwrap();
        let newcomer = with_key(
            record("a-new", "10.0.0.9", false),
            Some(&new_key.to_string()),
            None,
        );
        let all = [
            records[0].clone(),
            records[1].clone(),
            gone_record,
            newcomer,
        ];
        let b = directory("b", &all);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(b.contested().len(), 1);
        assert_eq!(b.contested()[0].claimants, ["a-new", "z-gone"]);
        assert_eq!(b.signers().speaker(ip("10.0.0.9")), None);
        assert_eq!(b.node_at(addr("10.0.0.9:7946")), None);
        assert_eq!(b.node_at(addr("10.0.0.1:7946")), Some("a"));
    }
}
