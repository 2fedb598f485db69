//! The agent side of IPAM: addresses for pods, the router, health and ingress inside the
//! blocks a node holds ("where is a pod's address chosen").
//!
//! Address rules, per block:
//! - IPv4 blocks of 4 addresses or more never hand out their first (network) and last
//!   (broadcast) address; /31 and /32 blocks use every address (RFC 3021).
//! - IPv6 blocks never hand out their first address (the subnet-router anycast address).
//! - The router (gateway) address is an ordinary allocation owned by `router`, so it survives
//!   restarts like any other (restored before anything new is allocated).
//!
//! Memory: one bit per address of each block in use (bitmaps grow as addresses are used) plus
//! one map entry per owner.

use std::net::IpAddr;

use thiserror::Error;

use crate::{
    Cidr, Family,
    cidr::ip_to_u128,
    pod::owners::{MAX_OWNER_LEN, OwnerIndex, Slot},
};

/// Largest block the node allocator manages in full; larger blocks (an IPv6 /64 from
/// Node.spec.podCIDRs) use their first 2^24 addresses.
pub const MAX_BLOCK_ADDRESSES: u128 = 1 << 24;

/// Owner of the router address of a node.
pub const ROUTER_OWNER: &str = "router";
/// Owner of the health-check address of a node.
pub const HEALTH_OWNER: &str = "health";
/// Owner of the ingress address of a node.
pub const INGRESS_OWNER: &str = "ingress";

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AllocError {
    /// The node has no block of this family yet: a condition time fixes (the operator assigns
    /// one); callers wait with backoff instead of failing.
    #[error(
        "node {node} has no {} block of pool {pool} yet; waiting for the operator to assign one",
        family.name()
    )]
    NoBlock {
        node: String,
        pool: String,
        family: Family,
    },
    #[error(
        "node {node}: every {} address of pool {pool} on this node is in use ({used} in blocks {}); \
         the node needs another block (multi-pool requests one on demand)",
        family.name(), blocks.iter().map(Cidr::to_string).collect::<Vec<_>>().join(", ")
    )]
    Full {
        node: String,
        pool: String,
        family: Family,
        used: u64,
        blocks: Vec<Cidr>,
    },
    #[error("node {node}: {ip} is not in any of its blocks of pool {pool} ({}); request an address from them", blocks.iter().map(Cidr::to_string).collect::<Vec<_>>().join(", "))]
    OutsideBlocks {
        node: String,
        pool: String,
        ip: IpAddr,
        blocks: Vec<Cidr>,
    },
    #[error("node {node}: {ip} is the {what} address of block {block} and is never handed out")]
    Reserved {
        node: String,
        ip: IpAddr,
        what: &'static str,
        block: Cidr,
    },
    #[error(
        "node {node}: {ip} is already allocated to {holder}; release it there first or choose another address"
    )]
    Taken {
        node: String,
        ip: IpAddr,
        holder: String,
    },
    #[error(
        "node {node}: an owner name must be 1 to {MAX_OWNER_LEN} bytes (got {len}); use the pod's \
         namespace/name or the container id"
    )]
    BadOwner { node: String, len: usize },
    /// The address lies in a block this node lost while it was away (another node holds it
    /// now and hands its addresses out): giving it here would put one address on two pods.
    #[error(
        "node {node}: {ip} is in block {block}, which another node holds now (this node lost it \
         while away; the pods here still using its addresses keep them, but none is handed out \
         again); ask for an address in this node's other blocks of pool {pool} ({}), or run the \
         pod on the node that holds {block}",
        blocks.iter().map(Cidr::to_string).collect::<Vec<_>>().join(", ")
    )]
    Retired {
        node: String,
        pool: String,
        ip: IpAddr,
        block: Cidr,
        blocks: Vec<Cidr>,
    },
    #[error("node {node}: {owner} already holds {held}; release it before requesting {requested}")]
    OwnerHoldsOther {
        node: String,
        owner: String,
        held: IpAddr,
        requested: IpAddr,
    },
}

/// One block and which of its addresses are in use.
#[derive(Debug, Clone)]
struct Block {
    cidr: Cidr,
    /// Offsets [first, last] may be handed out.
    first: u64,
    last: u64,
    /// One bit per offset; grows as needed.
    bits: Vec<u64>,
    used: u64,
    /// Word index where the next search starts (next-fit keeps allocation O(1) amortised).
    cursor: usize,
    /// Another node holds this block now: its addresses in use stay, no new one is given.
    retired: bool,
}

impl Block {
    fn new(cidr: Cidr) -> Self {
        let size = cidr.size().min(MAX_BLOCK_ADDRESSES) as u64;
        let (first, last) = match cidr.family() {
            Family::V4 if size >= 4 => (1, size - 2),
            Family::V4 => (0, size - 1),
            Family::V6 => (1, size - 1),
        };
        Self {
            cidr,
            first,
            last,
            bits: Vec::new(),
            used: 0,
            retired: false,
            cursor: 0,
        }
    }

    fn capacity(&self) -> u64 {
        (self.last + 1).saturating_sub(self.first)
    }

    fn is_set(&self, off: u64) -> bool {
        self.bits
            .get((off / 64) as usize)
            .is_some_and(|w| w & (1 << (off % 64)) != 0)
    }

    fn set(&mut self, off: u64) {
        let word = (off / 64) as usize;
        if self.bits.len() <= word {
            self.bits.resize(word + 1, 0);
        }
        self.bits[word] |= 1 << (off % 64);
        self.used += 1;
    }

    fn clear(&mut self, off: u64) {
        if let Some(w) = self.bits.get_mut((off / 64) as usize)
            && *w & (1 << (off % 64)) != 0
        {
            *w &= !(1 << (off % 64));
            self.used -= 1;
            self.cursor = self.cursor.min((off / 64) as usize);
        }
    }

    /// Takes the lowest free offset at or after the cursor, wrapping once, passing over the
    /// offsets `skip` names (addresses handed out only on request).
    fn take(&mut self, skip: impl Fn(u64) -> bool) -> Option<u64> {
        if self.used >= self.capacity() {
            return None;
        }
        let words = (self.last / 64 + 1) as usize;
        for step in 0..words {
            let wi = (self.cursor + step) % words;
            let word = self.bits.get(wi).copied().unwrap_or(0);
            if word == u64::MAX {
                continue;
            }
            // Lowest clear bit of this word that lies in [first, last].
            let mut free = !word;
            while free != 0 {
                let bit = u64::from(free.trailing_zeros());
                let off = wi as u64 * 64 + bit;
                if off > self.last {
                    break;
                }
                if off >= self.first && !skip(off) {
                    self.set(off);
                    self.cursor = wi;
                    return Some(off);
                }
                free &= free - 1;
            }
        }
        None
    }

    fn reserved_role(&self, off: u64) -> Option<&'static str> {
        if off >= self.first && off <= self.last {
            return None;
        }
        Some(match (self.cidr.family(), off == 0) {
            (Family::V4, true) => "network",
            (Family::V4, false) => "broadcast",
            (Family::V6, _) => "subnet-router anycast",
        })
    }
}

/// The addresses of one node in one pool, both families.
#[derive(Debug, Clone)]
pub struct NodeAllocator {
    node: String,
    pool: String,
    blocks: Vec<Block>,
    /// Owner -> slot, one index per family (V4, V6).
    owners: [OwnerIndex; 2],
    /// Addresses given only to an owner that asks for them (`allocate_ip`), never by
    /// `allocate`: a pool's `reserved` addresses, as family, first and last address.
    requested_only: Vec<(Family, u128, u128)>,
}

fn fam_index(f: Family) -> usize {
    match f {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

impl NodeAllocator {
    pub fn new(node: &str, pool: &str) -> Self {
        Self {
            node: node.to_owned(),
            pool: pool.to_owned(),
            blocks: Vec::new(),
            owners: [OwnerIndex::default(), OwnerIndex::default()],
            requested_only: Vec::new(),
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn pool(&self) -> &str {
        &self.pool
    }

    /// Adds a block the operator assigned. Adding a block twice is a no-op.
    pub fn add_block(&mut self, cidr: Cidr) {
        if !self.blocks.iter().any(|b| b.cidr == cidr) {
            self.blocks.push(Block::new(cidr));
        }
    }

    /// Removes an empty block (returning it to the operator); `false` when it still has
    /// allocations or is not held.
    pub fn remove_block(&mut self, cidr: Cidr) -> bool {
        let Some(i) = self.blocks.iter().position(|b| b.cidr == cidr) else {
            return false;
        };
        if self.blocks[i].used > 0 {
            return false;
        }
        // Slots index blocks by position: only the last block can go without renumbering,
        // so swap it into place and renumber the owners that pointed at it.
        let last = self.blocks.len() - 1;
        self.blocks.swap_remove(i);
        if i != last {
            for index in &mut self.owners {
                index.renumber_block(last as u32, i as u32);
            }
        }
        true
    }

    /// Stops handing out addresses from `cidr` (another node holds it now); the addresses in
    /// use stay until their owners release them, then the block can be removed. Returns how
    /// many addresses of it are in use.
    pub fn retire_block(&mut self, cidr: Cidr) -> u64 {
        self.blocks
            .iter_mut()
            .find(|b| b.cidr == cidr)
            .map_or(0, |b| {
                b.retired = true;
                b.used
            })
    }

    pub fn blocks(&self, family: Family) -> Vec<Cidr> {
        self.blocks
            .iter()
            .filter(|b| b.cidr.family() == family)
            .map(|b| b.cidr)
            .collect()
    }

    /// Blocks of `family` with no allocation, which a multi-pool node may release.
    pub fn empty_blocks(&self, family: Family) -> Vec<Cidr> {
        self.blocks
            .iter()
            .filter(|b| b.cidr.family() == family && b.used == 0)
            .map(|b| b.cidr)
            .collect()
    }

    /// Free addresses of `family` over all blocks.
    pub fn free(&self, family: Family) -> u64 {
        self.blocks
            .iter()
            .filter(|b| b.cidr.family() == family)
            .map(|b| b.capacity() - b.used)
            .sum()
    }

    /// Live allocations of `family`.
    pub fn allocated(&self, family: Family) -> usize {
        self.owners[fam_index(family)].len()
    }

    fn ip_of(&self, slot: Slot) -> IpAddr {
        self.blocks[slot.block as usize]
            .cidr
            .addr(u128::from(slot.offset))
    }

    /// The address `owner` holds in `family`, if any.
    pub fn lookup(&self, owner: &str, family: Family) -> Option<IpAddr> {
        self.owners[fam_index(family)]
            .get(owner)
            .map(|s| self.ip_of(s))
    }

    /// Sets the addresses given only to an owner that asks for them by address (a pool's
    /// `reserved`); those already held stay with their owners.
    pub fn set_requested_only(&mut self, cidrs: &[Cidr]) {
        self.requested_only = cidrs
            .iter()
            .map(|c| (c.family(), c.base(), c.last()))
            .collect();
    }

    /// An address of `family` for `owner`; the same owner asking again gets the same address.
    /// Reserved addresses (`set_requested_only`) are passed over.
    pub fn allocate(&mut self, owner: &str, family: Family) -> Result<IpAddr, AllocError> {
        self.check_owner(owner)?;
        if let Some(ip) = self.lookup(owner, family) {
            return Ok(ip);
        }
        let mut any_block = false;
        let reserved = &self.requested_only;
        for (i, block) in self.blocks.iter_mut().enumerate() {
            if block.cidr.family() != family {
                continue;
            }
            any_block = true;
            if block.retired {
                continue;
            }
            let base = block.cidr.base();
            let skip = |off: u64| {
                let ip = base + u128::from(off);
                reserved
                    .iter()
                    .any(|(f, first, last)| *f == family && (*first..=*last).contains(&ip))
            };
            if let Some(off) = block.take(skip) {
                let slot = Slot {
                    block: i as u32,
                    offset: off as u32,
                };
                self.owners[fam_index(family)].insert(owner, slot);
                return Ok(self.ip_of(slot));
            }
        }
        if !any_block {
            return Err(AllocError::NoBlock {
                node: self.node.clone(),
                pool: self.pool.clone(),
                family,
            });
        }
        Err(AllocError::Full {
            node: self.node.clone(),
            pool: self.pool.clone(),
            family,
            used: self.allocated(family) as u64,
            blocks: self.blocks(family),
        })
    }

    /// Gives `ip` to `owner`, who asked for it by address. Idempotent for the same owner and
    /// address. An address of a retired block is refused (see [`AllocError::Retired`]), unless
    /// `owner` holds it already.
    pub fn allocate_ip(&mut self, owner: &str, ip: IpAddr) -> Result<(), AllocError> {
        self.take_ip(owner, ip, true)
    }

    /// Gives `ip` back to `owner`, who held it before: a restart restoring its allocations, or
    /// a failed commit undoing a release. Unlike [`Self::allocate_ip`] it takes addresses of
    /// retired blocks too: the pod holds the address whichever node holds the block now.
    pub fn restore_ip(&mut self, owner: &str, ip: IpAddr) -> Result<(), AllocError> {
        self.take_ip(owner, ip, false)
    }

    fn take_ip(&mut self, owner: &str, ip: IpAddr, requested: bool) -> Result<(), AllocError> {
        self.check_owner(owner)?;
        let family = Family::of(ip);
        if let Some(held) = self.lookup(owner, family) {
            if held == ip {
                return Ok(());
            }
            return Err(AllocError::OwnerHoldsOther {
                node: self.node.clone(),
                owner: owner.to_owned(),
                held,
                requested: ip,
            });
        }
        let Some((bi, block)) = self
            .blocks
            .iter()
            .enumerate()
            .find(|(_, b)| b.cidr.contains(ip))
        else {
            return Err(AllocError::OutsideBlocks {
                node: self.node.clone(),
                pool: self.pool.clone(),
                ip,
                blocks: self.blocks(family),
            });
        };
        let off = ip_to_u128(ip) - block.cidr.base();
        if off >= MAX_BLOCK_ADDRESSES {
            return Err(AllocError::OutsideBlocks {
                node: self.node.clone(),
                pool: self.pool.clone(),
                ip,
                blocks: self.blocks(family),
            });
        }
        let off = off as u64;
        if requested && block.retired {
            // Another node hands this block's addresses out now: the address may be its pod's
            // already, or become one's later.
            return Err(AllocError::Retired {
                node: self.node.clone(),
                pool: self.pool.clone(),
                ip,
                block: block.cidr,
                blocks: self
                    .blocks
                    .iter()
                    .filter(|b| b.cidr.family() == family && !b.retired)
                    .map(|b| b.cidr)
                    .collect(),
            });
        }
        if let Some(what) = block.reserved_role(off) {
            return Err(AllocError::Reserved {
                node: self.node.clone(),
                ip,
                what,
                block: block.cidr,
            });
        }
        if block.is_set(off) {
            let holder = self.owners[fam_index(family)]
                .iter()
                .find(|(_, s)| s.block as usize == bi && u64::from(s.offset) == off)
                .map(|(o, _)| o.to_owned())
                .unwrap_or_default();
            return Err(AllocError::Taken {
                node: self.node.clone(),
                ip,
                holder,
            });
        }
        self.blocks[bi].set(off);
        self.owners[fam_index(family)].insert(
            owner,
            Slot {
                block: bi as u32,
                offset: off as u32,
            },
        );
        Ok(())
    }

    /// Releases what `owner` holds in `family`; releasing nothing is not an error.
    pub fn release(&mut self, owner: &str, family: Family) -> Option<IpAddr> {
        let slot = self.owners[fam_index(family)].remove(owner)?;
        let ip = self.ip_of(slot);
        self.blocks[slot.block as usize].clear(u64::from(slot.offset));
        Some(ip)
    }

    /// Moves what `from` holds in `family` to `to`, keeping the address; `None` when `from`
    /// holds nothing there. `to` must hold nothing in `family`.
    pub fn rename(
        &mut self,
        from: &str,
        to: &str,
        family: Family,
    ) -> Result<Option<IpAddr>, AllocError> {
        self.check_owner(to)?;
        let index = &mut self.owners[fam_index(family)];
        if let Some(held) = index.get(to) {
            return Err(AllocError::OwnerHoldsOther {
                node: self.node.clone(),
                owner: to.to_owned(),
                held: self.ip_of(held),
                requested: self.lookup(from, family).unwrap_or(self.ip_of(held)),
            });
        }
        let Some(slot) = index.remove(from) else {
            return Ok(None);
        };
        index.insert(to, slot);
        Ok(Some(self.ip_of(slot)))
    }

    fn check_owner(&self, owner: &str) -> Result<(), AllocError> {
        if owner.is_empty() || owner.len() > MAX_OWNER_LEN {
            return Err(AllocError::BadOwner {
                node: self.node.clone(),
                len: owner.len(),
            });
        }
        Ok(())
    }

    /// Every (owner, address), for status output and checks.
    pub fn allocations(&self) -> Vec<(String, IpAddr)> {
        self.owners
            .iter()
            .flat_map(|m| m.iter().map(|(o, s)| (o.to_owned(), self.ip_of(s))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn allocation_is_idempotent_and_skips_reserved_addresses() {
        let mut n = NodeAllocator::new("node-1", "default");
        let e = n.allocate("ns/a eth0", Family::V4).unwrap_err();
        assert!(matches!(e, AllocError::NoBlock { .. }), "{e}");
        n.add_block(c("10.244.1.0/30"));
        let a = n.allocate("ns/a eth0", Family::V4).unwrap();
        assert_eq!(a.to_string(), "10.244.1.1");
        assert_eq!(n.allocate("ns/a eth0", Family::V4).unwrap(), a);
        assert_eq!(
            n.allocate("ns/b eth0", Family::V4).unwrap().to_string(),
            "10.244.1.2"
        );
        let full = n.allocate("ns/c eth0", Family::V4).unwrap_err().to_string();
        assert!(
            full.contains("node-1") && full.contains("10.244.1.0/30"),
            "{full}"
        );
        assert_eq!(n.release("ns/a eth0", Family::V4), Some(a));
        assert_eq!(n.release("ns/a eth0", Family::V4), None);
        assert_eq!(n.allocate("ns/c eth0", Family::V4).unwrap(), a);

        let e = n
            .allocate_ip("x", "10.244.1.3".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("broadcast"), "{e}");
        let e = n
            .allocate_ip("x", "10.244.1.0".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("network"), "{e}");
        let e = n
            .allocate_ip("x", "10.244.1.2".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("ns/b eth0"), "{e}");
        let e = n
            .allocate_ip("x", "10.9.9.9".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not in any of its blocks"), "{e}");
    }

    /// Reserved addresses are never handed out by `allocate`, only to an owner that asks for
    /// one by address; released, they are reserved again. In v4 and v6.
    #[test]
    fn reserved_addresses_go_only_to_who_asks_for_them() {
        for (block, reserved, first_free) in [
            ("10.244.1.0/29", "10.244.1.2/31", "10.244.1.1"),
            ("fd00:1::/125", "fd00:1::2/127", "fd00:1::1"),
        ] {
            let mut n = NodeAllocator::new("node-1", "default");
            n.add_block(c(block));
            n.set_requested_only(&[c(reserved)]);
            let family = c(block).family();
            assert_eq!(n.allocate("a", family).unwrap().to_string(), first_free);
            let asked: IpAddr = c(reserved).network();
            n.allocate_ip("fixed", asked).unwrap();
            assert_eq!(n.lookup("fixed", family), Some(asked));
            assert_eq!(n.release("fixed", family), Some(asked));
            // Released: still never handed out unasked, whoever asks next.
            let mut others = Vec::new();
            while let Ok(ip) = n.allocate(&format!("o{}", others.len()), family) {
                others.push(ip);
            }
            assert!(
                !others.iter().any(|ip| c(reserved).contains(*ip)),
                "{others:?}"
            );
            assert!(matches!(
                n.allocate("more", family),
                Err(AllocError::Full { .. })
            ));
            n.allocate_ip("fixed-again", asked).unwrap();
        }
    }

    /// A node back after its grace period keeps the block it lost for the pods still using
    /// it, but the block's new node hands its addresses out: a pod asking for one of them by
    /// address is refused, with the node, the address, the block and what to do, and gets it
    /// neither then nor later; the pods that hold their addresses keep them (asking again,
    /// restoring after a restart).
    #[test]
    fn a_retired_block_gives_no_requested_address() {
        let mut n = NodeAllocator::new("node-1", "default");
        n.add_block(c("10.244.1.0/24"));
        n.add_block(c("10.244.2.0/24"));
        let kept = n.allocate("ns/old eth0", Family::V4).unwrap();
        assert!(c("10.244.1.0/24").contains(kept), "{kept}");
        assert_eq!(n.retire_block(c("10.244.1.0/24")), 1);

        let asked: IpAddr = "10.244.1.77".parse().unwrap();
        let e = n.allocate_ip("ns/new eth0", asked).unwrap_err();
        assert!(matches!(e, AllocError::Retired { .. }), "{e}");
        let msg = e.to_string();
        for part in [
            "node-1",
            "10.244.1.77",
            "10.244.1.0/24",
            "another node holds",
            "10.244.2.0/24",
            "run the pod on the node that holds",
        ] {
            assert!(msg.contains(part), "{part:?} missing from: {msg}");
        }
        assert_eq!(
            n.lookup("ns/new eth0", Family::V4),
            None,
            "refused holds nothing"
        );
        assert!(
            n.allocations().iter().all(|(_, ip)| *ip != asked),
            "{:?}",
            n.allocations()
        );
        // Nothing unasked comes from it either; the other block serves.
        let any = n.allocate("ns/new eth0", Family::V4).unwrap();
        assert!(c("10.244.2.0/24").contains(any), "{any}");
        // The pod that held its address keeps it: asking again is not a new request.
        n.allocate_ip("ns/old eth0", kept).unwrap();
        // A restart (or an undone release) restores it into the retired block.
        assert_eq!(n.release("ns/old eth0", Family::V4), Some(kept));
        n.restore_ip("ns/old eth0", kept).unwrap();
        assert_eq!(n.lookup("ns/old eth0", Family::V4), Some(kept));
        // Released for good, the address is still not handed out again.
        n.release("ns/old eth0", Family::V4);
        assert!(matches!(
            n.allocate_ip("ns/third eth0", kept),
            Err(AllocError::Retired { .. })
        ));
    }

    #[test]
    fn dual_stack_and_ipv6_rules() {
        let mut n = NodeAllocator::new("node-1", "default");
        n.add_block(c("10.244.1.0/24"));
        n.add_block(c("fd00::100/120"));
        let v4 = n.allocate("pod", Family::V4).unwrap();
        let v6 = n.allocate("pod", Family::V6).unwrap();
        assert_eq!(
            (v4.to_string(), v6.to_string()),
            ("10.244.1.1".into(), "fd00::101".into())
        );
        assert_eq!(n.free(Family::V6), 254);
        // A /31 uses both addresses; a /64 is capped but works.
        let mut p = NodeAllocator::new("p", "x");
        p.add_block(c("10.0.0.0/31"));
        assert_eq!(p.allocate("a", Family::V4).unwrap().to_string(), "10.0.0.0");
        assert_eq!(p.allocate("b", Family::V4).unwrap().to_string(), "10.0.0.1");
        p.add_block(c("fd00:1::/64"));
        assert_eq!(p.free(Family::V6), (MAX_BLOCK_ADDRESSES - 1) as u64);
    }

    #[test]
    fn a_node_with_63_pods_holds_two_26_blocks_and_empty_ones_can_go() {
        // Multi-pool seed: /26 blocks have 62 usable addresses.
        let mut n = NodeAllocator::new("node-1", "tenant-a");
        n.add_block(c("10.250.0.0/26"));
        for i in 0..62 {
            n.allocate(&format!("tenant-a/p{i}"), Family::V4).unwrap();
        }
        assert!(matches!(
            n.allocate("tenant-a/p62", Family::V4),
            Err(AllocError::Full { .. })
        ));
        n.add_block(c("10.250.0.64/26"));
        let ip = n.allocate("tenant-a/p62", Family::V4).unwrap();
        assert!(c("10.250.0.64/26").contains(ip));
        assert_eq!(n.blocks(Family::V4).len(), 2);
        n.release("tenant-a/p62", Family::V4);
        assert_eq!(n.empty_blocks(Family::V4), vec![c("10.250.0.64/26")]);
        assert!(!n.remove_block(c("10.250.0.0/26")), "a block in use stays");
        assert!(n.remove_block(c("10.250.0.64/26")));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u8),
        Release(u8),
        Specific(u8, u8),
        AddBlock(u8),
        RemoveEmpty,
        Restart,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => any::<u8>().prop_map(|o| Op::Alloc(o % 80)),
            3 => any::<u8>().prop_map(|o| Op::Release(o % 80)),
            1 => (any::<u8>(), any::<u8>()).prop_map(|(o, b)| Op::Specific(o % 80, b)),
            1 => any::<u8>().prop_map(|b| Op::AddBlock(b % 4)),
            1 => Just(Op::RemoveEmpty),
            1 => Just(Op::Restart),
        ]
    }

    proptest! {
        /// Any sequence of allocate, release, specific requests, block changes and restarts
        /// (rebuilding from the list of allocations, as the persisted state does) never yields
        /// a duplicate address, an address outside the node's blocks, or a reserved address.
        #[test]
        fn never_a_duplicate_or_an_address_outside_the_blocks(ops in proptest::collection::vec(op(), 1..300)) {
            let blocks: Vec<Cidr> = ["10.1.0.0/28", "10.1.0.16/29", "10.1.0.64/27", "10.1.0.128/30"].iter().map(|s| c(s)).collect();
            let mut n = NodeAllocator::new("n", "p");
            n.add_block(blocks[0]);
            for op in ops {
                match op {
                    Op::Alloc(o) => { let _ = n.allocate(&format!("o{o}"), Family::V4); }
                    Op::Release(o) => { n.release(&format!("o{o}"), Family::V4); }
                    Op::Specific(o, b) => {
                        let ip: IpAddr = format!("10.1.0.{b}").parse().unwrap();
                        let _ = n.allocate_ip(&format!("o{o}"), ip);
                    }
                    Op::AddBlock(i) => n.add_block(blocks[i as usize]),
                    Op::RemoveEmpty => {
                        if let Some(b) = n.empty_blocks(Family::V4).first() { n.remove_block(*b); }
                    }
                    Op::Restart => {
                        let mut fresh = NodeAllocator::new("n", "p");
                        for b in n.blocks(Family::V4) { fresh.add_block(b); }
                        for (owner, ip) in n.allocations() { fresh.allocate_ip(&owner, ip).unwrap(); }
                        n = fresh;
                    }
                }
                let all = n.allocations();
                let ips: HashSet<IpAddr> = all.iter().map(|(_, ip)| *ip).collect();
                prop_assert_eq!(ips.len(), all.len(), "duplicate address in {:?}", all);
                let held = n.blocks(Family::V4);
                for (owner, ip) in &all {
                    let block = held.iter().find(|b| b.contains(*ip));
                    prop_assert!(block.is_some(), "{} holds {} outside {:?}", owner, ip, held);
                    let b = block.unwrap();
                    let off = ip_to_u128(*ip) - b.base();
                    prop_assert!(off != 0 && off != b.size() - 1, "{} got reserved {}", owner, ip);
                }
                prop_assert_eq!(n.free(Family::V4) as usize + all.len(),
                    held.iter().map(|b| b.size() as usize - 2).sum::<usize>());
            }
        }
    }
}
