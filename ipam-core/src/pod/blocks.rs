//! The operator side of IPAM: cutting pools into per-node blocks ("where is a node's block
//! chosen"). Blocks are handed out lowest first; released ones are reused before fresh ones.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use thiserror::Error;

use crate::{
    Cidr, Family,
    pod::pool::{Pool, PoolError, check_update},
};

/// The blocks of one pool family, per CIDR.
#[derive(Debug, Clone)]
struct CidrBlocks {
    cidr: Cidr,
    /// Every block index at or above this one is free.
    next_fresh: u128,
    /// Free block indexes below `next_fresh` (released blocks), reused lowest first.
    released: BTreeSet<u128>,
    /// Block index -> node holding it.
    holders: HashMap<u128, String>,
}

impl CidrBlocks {
    fn new(cidr: Cidr) -> Self {
        Self {
            cidr,
            next_fresh: 0,
            released: BTreeSet::new(),
            holders: HashMap::new(),
        }
    }

    fn take_free(&mut self, mask: u8) -> Option<u128> {
        if let Some(i) = self.released.pop_first() {
            return Some(i);
        }
        (self.next_fresh < self.cidr.block_count(mask)).then(|| {
            self.next_fresh += 1;
            self.next_fresh - 1
        })
    }

    /// Marks `index` held (restoring a block from the store).
    fn mark(&mut self, index: u128, node: &str) {
        if index >= self.next_fresh {
            self.released.extend(self.next_fresh..index);
            self.next_fresh = index + 1;
        } else {
            self.released.remove(&index);
        }
        self.holders.insert(index, node.to_owned());
    }

    fn free(&mut self, index: u128) {
        if self.holders.remove(&index).is_some() {
            if index + 1 == self.next_fresh {
                self.next_fresh -= 1;
                // Fold released blocks at the top back into the fresh range.
                while self.next_fresh > 0 && self.released.remove(&(self.next_fresh - 1)) {
                    self.next_fresh -= 1;
                }
            } else {
                self.released.insert(index);
            }
        }
    }
}

#[derive(Debug, Clone)]
struct FamilyBlocks {
    mask: u8,
    cidrs: Vec<CidrBlocks>,
}

/// Capacity and usage of one pool family, for status output and errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyUsage {
    pub family: Family,
    pub cidrs: Vec<Cidr>,
    pub mask: u8,
    pub total_blocks: u128,
    pub used_blocks: u128,
    /// Nodes holding blocks, sorted.
    pub holders: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BlockError {
    #[error("pool {pool} does not exist; create it, or request blocks from an existing pool")]
    NoSuchPool { pool: String },
    #[error("pool {pool} has no {} CIDRs; add spec.{}.cidrs to it", family.name(), if *family == Family::V4 { "ipv4" } else { "ipv6" })]
    NoFamily { pool: String, family: Family },
    #[error(
        "pool {pool} ({}) is exhausted: node {node} gets no block. Its CIDRs {} cut into /{} blocks \
         give {} blocks and all {} are held, by {}. Append a CIDR to the pool's {} list: existing \
         blocks stay as they are and new nodes get blocks from it (make sure the network routes \
         it). A smaller mask size would not help: held blocks cannot be split",
        usage.family.name(),
        usage.cidrs.iter().map(Cidr::to_string).collect::<Vec<_>>().join(", "),
        usage.mask, usage.total_blocks, usage.used_blocks, holders_summary(&usage.holders),
        if usage.family == Family::V4 { "spec.ipv4.cidrs" } else { "spec.ipv6.cidrs" }
    )]
    Exhausted {
        pool: String,
        node: String,
        usage: Box<FamilyUsage>,
    },
    #[error("block {block} is not part of pool {pool}")]
    NotInPool { pool: String, block: Cidr },
    #[error("block {block} of pool {pool} is held by node {holder}, not by {node}")]
    HeldByOther {
        pool: String,
        block: Cidr,
        holder: String,
        node: String,
    },
    #[error(transparent)]
    Pool(Box<PoolError>),
}

impl From<PoolError> for BlockError {
    fn from(e: PoolError) -> Self {
        Self::Pool(Box::new(e))
    }
}

fn holders_summary(holders: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut s = holders
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if holders.len() > SHOWN {
        s.push_str(&format!(" and {} more nodes", holders.len() - SHOWN));
    }
    s
}

/// Blocks of every pool, and which node holds which.
#[derive(Debug, Clone, Default)]
pub struct BlockAllocator {
    pools: BTreeMap<String, (Pool, [Option<FamilyBlocks>; 2])>,
    /// node -> (pool, block) it holds: answers "which blocks has node X" without a scan.
    by_node: HashMap<String, BTreeSet<(String, Cidr)>>,
}

fn slot(family: Family) -> usize {
    match family {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

impl BlockAllocator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a pool, or updates one under the in-use rules of `pool::check_update`. Overlaps with
    /// other pools are the caller's to check (`pool::check_no_overlap`) since it holds them all.
    pub fn upsert_pool(&mut self, pool: Pool) -> Result<(), BlockError> {
        let name = pool.name.clone();
        match self.pools.get_mut(&name) {
            None => {
                let fams = [Family::V4, Family::V6].map(|f| {
                    pool.family(f).map(|fp| FamilyBlocks {
                        mask: fp.mask,
                        cidrs: fp.cidrs.iter().map(|c| CidrBlocks::new(*c)).collect(),
                    })
                });
                self.pools.insert(name, (pool, fams));
            }
            Some((old, fams)) => {
                let count = |c: &Cidr| {
                    fams[slot(c.family())]
                        .as_ref()
                        .and_then(|f| f.cidrs.iter().find(|b| b.cidr == *c))
                        .map_or(0, |b| b.holders.len())
                };
                check_update(old, &pool, count)?;
                for f in [Family::V4, Family::V6] {
                    let new_cidrs = pool.family(f).map(|p| p.cidrs.clone()).unwrap_or_default();
                    let entry = &mut fams[slot(f)];
                    match (entry.as_mut(), pool.family(f)) {
                        (_, None) => *entry = None,
                        (None, Some(fp)) => {
                            *entry = Some(FamilyBlocks {
                                mask: fp.mask,
                                cidrs: fp.cidrs.iter().map(|c| CidrBlocks::new(*c)).collect(),
                            });
                        }
                        (Some(fb), Some(fp)) => {
                            fb.mask = fp.mask;
                            let mut kept: Vec<CidrBlocks> = Vec::new();
                            for c in &new_cidrs {
                                kept.push(
                                    fb.cidrs
                                        .iter()
                                        .find(|b| b.cidr == *c)
                                        .cloned()
                                        .unwrap_or_else(|| CidrBlocks::new(*c)),
                                );
                            }
                            fb.cidrs = kept;
                        }
                    }
                }
                *old = pool;
            }
        }
        Ok(())
    }

    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.get(name).map(|(p, _)| p)
    }

    fn family_mut(&mut self, pool: &str, family: Family) -> Result<&mut FamilyBlocks, BlockError> {
        let (_, fams) = self
            .pools
            .get_mut(pool)
            .ok_or_else(|| BlockError::NoSuchPool {
                pool: pool.to_owned(),
            })?;
        fams[slot(family)]
            .as_mut()
            .ok_or_else(|| BlockError::NoFamily {
                pool: pool.to_owned(),
                family,
            })
    }

    /// Gives `node` one more block of `pool` in `family`.
    pub fn allocate(&mut self, node: &str, pool: &str, family: Family) -> Result<Cidr, BlockError> {
        let fb = self.family_mut(pool, family)?;
        let mask = fb.mask;
        let found = fb.cidrs.iter_mut().find_map(|cb| {
            let index = cb.take_free(mask)?;
            cb.holders.insert(index, node.to_owned());
            Some(cb.cidr.block(mask, index))
        });
        if let Some(block) = found {
            self.by_node
                .entry(node.to_owned())
                .or_default()
                .insert((pool.to_owned(), block));
            return Ok(block);
        }
        Err(BlockError::Exhausted {
            pool: pool.to_owned(),
            node: node.to_owned(),
            usage: Box::new(self.usage(pool, family)?),
        })
    }

    /// Every block `node` holds, with its pool.
    pub fn held_by_node(&self, node: &str) -> impl Iterator<Item = &(String, Cidr)> {
        self.by_node.get(node).into_iter().flatten()
    }

    /// The blocks `node` holds in `pool` and `family`, lowest first.
    pub fn blocks_of(&self, node: &str, pool: &str, family: Family) -> Vec<Cidr> {
        self.held_by_node(node)
            .filter(|(p, b)| p == pool && b.family() == family)
            .map(|(_, b)| *b)
            .collect()
    }

    /// Cluster-pool semantics: the node's one block, allocated on first request.
    pub fn ensure_one(
        &mut self,
        node: &str,
        pool: &str,
        family: Family,
    ) -> Result<Cidr, BlockError> {
        match self.blocks_of(node, pool, family).first() {
            Some(b) => Ok(*b),
            None => self.allocate(node, pool, family),
        }
    }

    /// Records that `node` holds `block` (rebuilding state from the store).
    pub fn restore(&mut self, node: &str, pool: &str, block: Cidr) -> Result<(), BlockError> {
        let fb = self.family_mut(pool, block.family())?;
        let mask = fb.mask;
        let not_in_pool = || BlockError::NotInPool {
            pool: pool.to_owned(),
            block,
        };
        if block.prefix() != mask {
            return Err(not_in_pool());
        }
        let cb = fb
            .cidrs
            .iter_mut()
            .find(|cb| cb.cidr.contains(block.network()))
            .ok_or_else(not_in_pool)?;
        let index = cb.cidr.block_index(mask, block.network());
        if let Some(holder) = cb.holders.get(&index)
            && holder != node
        {
            return Err(BlockError::HeldByOther {
                pool: pool.to_owned(),
                block,
                holder: holder.clone(),
                node: node.to_owned(),
            });
        }
        cb.mark(index, node);
        self.by_node
            .entry(node.to_owned())
            .or_default()
            .insert((pool.to_owned(), block));
        Ok(())
    }

    /// Returns `block` to the pool; releasing a block the node does not hold is a no-op.
    pub fn release(&mut self, node: &str, pool: &str, block: Cidr) -> Result<(), BlockError> {
        let fb = self.family_mut(pool, block.family())?;
        let mask = fb.mask;
        if let Some(cb) = fb
            .cidrs
            .iter_mut()
            .find(|cb| cb.cidr.contains(block.network()))
        {
            let index = cb.cidr.block_index(mask, block.network());
            if cb.holders.get(&index).is_some_and(|h| h == node) {
                cb.free(index);
                if let Some(held) = self.by_node.get_mut(node) {
                    held.remove(&(pool.to_owned(), block));
                }
            }
        }
        Ok(())
    }

    /// Capacity and usage of a pool family.
    pub fn usage(&self, pool: &str, family: Family) -> Result<FamilyUsage, BlockError> {
        let (_, fams) = self.pools.get(pool).ok_or_else(|| BlockError::NoSuchPool {
            pool: pool.to_owned(),
        })?;
        let fb = fams[slot(family)]
            .as_ref()
            .ok_or_else(|| BlockError::NoFamily {
                pool: pool.to_owned(),
                family,
            })?;
        let holders: BTreeSet<&String> = fb.cidrs.iter().flat_map(|c| c.holders.values()).collect();
        Ok(FamilyUsage {
            family,
            cidrs: fb.cidrs.iter().map(|c| c.cidr).collect(),
            mask: fb.mask,
            total_blocks: fb
                .cidrs
                .iter()
                .fold(0u128, |t, c| t.saturating_add(c.cidr.block_count(fb.mask))),
            used_blocks: fb.cidrs.iter().map(|c| c.holders.len() as u128).sum(),
            holders: holders.into_iter().cloned().collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::pool::{FamilySpec, PodIpPoolSpec, validate};

    fn pool(name: &str, cidrs: &[&str], mask: u8) -> Pool {
        validate(
            name,
            &PodIpPoolSpec {
                reserved: Vec::new(),
                reservations: Vec::new(),
                ipv4: Some(FamilySpec {
                    cidrs: cidrs.iter().map(std::string::ToString::to_string).collect(),
                    mask_size: mask,
                }),
                ipv6: None,
                namespaces: Vec::new(),
                namespace_selector: Default::default(),
                max_blocks_per_node: None,
            },
        )
        .unwrap()
    }

    /// The cluster-pool exhaustion seed: 10.244.0.0/16 cut in /24 serves exactly 256 nodes; node
    /// 257 gets an error that says what to do; appending a CIDR serves it without touching the
    /// others; changing the mask is refused.
    #[test]
    fn seed_cluster_pool_exhaustion() {
        let mut b = BlockAllocator::new();
        b.upsert_pool(pool("default", &["10.244.0.0/16"], 24))
            .unwrap();
        let mut first = Vec::new();
        for n in 1..=256 {
            first.push(
                b.ensure_one(&format!("node-{n}"), "default", Family::V4)
                    .unwrap(),
            );
        }
        assert_eq!(first[0].to_string(), "10.244.0.0/24");
        assert_eq!(first[255].to_string(), "10.244.255.0/24");
        let distinct: BTreeSet<_> = first.iter().collect();
        assert_eq!(distinct.len(), 256);

        let e = b.ensure_one("node-257", "default", Family::V4).unwrap_err();
        let msg = e.to_string();
        for want in [
            "pool default",
            "node-257",
            "10.244.0.0/16",
            "/24",
            "256 blocks",
            "all 256",
            "node-1,",
            "and 251 more",
            "Append a CIDR",
            "spec.ipv4.cidrs",
        ] {
            assert!(msg.contains(want), "{msg}\n  should contain {want:?}");
        }

        b.upsert_pool(pool("default", &["10.244.0.0/16", "10.245.0.0/16"], 24))
            .unwrap();
        assert_eq!(
            b.ensure_one("node-257", "default", Family::V4)
                .unwrap()
                .to_string(),
            "10.245.0.0/24"
        );
        for (n, block) in first.iter().enumerate() {
            assert_eq!(
                b.ensure_one(&format!("node-{}", n + 1), "default", Family::V4)
                    .unwrap(),
                *block
            );
        }

        let e = b
            .upsert_pool(pool("default", &["10.244.0.0/16", "10.245.0.0/16"], 25))
            .unwrap_err();
        assert!(
            matches!(&e, BlockError::Pool(p) if matches!(**p, PoolError::MaskInUse { .. })),
            "{e}"
        );
        let usage = b.usage("default", Family::V4).unwrap();
        assert_eq!((usage.total_blocks, usage.used_blocks), (512, 257));
    }

    #[test]
    fn released_blocks_are_reused_and_restore_rebuilds_state() {
        let mut b = BlockAllocator::new();
        b.upsert_pool(pool("tenant-a", &["10.250.0.0/24"], 26))
            .unwrap();
        let blocks: Vec<Cidr> = (0..4)
            .map(|i| {
                b.allocate(&format!("n{i}"), "tenant-a", Family::V4)
                    .unwrap()
            })
            .collect();
        assert!(b.allocate("n9", "tenant-a", Family::V4).is_err());
        b.release("n1", "tenant-a", blocks[1]).unwrap();
        b.release("n2", "tenant-a", blocks[1]).unwrap(); // not n2's: no-op
        assert_eq!(b.allocate("n9", "tenant-a", Family::V4).unwrap(), blocks[1]);

        let mut restored = BlockAllocator::new();
        restored
            .upsert_pool(pool("tenant-a", &["10.250.0.0/24"], 26))
            .unwrap();
        restored.restore("n3", "tenant-a", blocks[3]).unwrap();
        assert_eq!(
            restored.allocate("x", "tenant-a", Family::V4).unwrap(),
            blocks[0]
        );
        let e = restored
            .restore("other", "tenant-a", blocks[3])
            .unwrap_err()
            .to_string();
        assert!(e.contains("held by node n3"), "{e}");
    }
}
