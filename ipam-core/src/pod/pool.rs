//! Pod IP pools: the spec users write (shaped like Cilium's CiliumPodIPPool), its validation, and
//! the rules for changing a pool that is in use.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::{Cidr, CidrError, Family, meta::Selector};

/// How pod IPs are managed cluster-wide. Recorded in cluster state on first start; a daemon
/// configured with another mode refuses to start (see `check_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum IpamMode {
    /// One pool (`default`), one block per node and family, CIDR list append-only.
    ClusterPool,
    /// Named pools, blocks on demand per node and pool.
    MultiPool,
    /// The node's block is given from outside (Node.spec.podCIDRs).
    Kubernetes,
}

impl IpamMode {
    pub const fn name(self) -> &'static str {
        match self {
            Self::ClusterPool => "cluster-pool",
            Self::MultiPool => "multi-pool",
            Self::Kubernetes => "kubernetes",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "this cluster's IPAM mode is {recorded}, but this daemon is configured for {configured}; the \
     mode of a running cluster cannot change in place (every node's blocks and pod addresses \
     belong to the old mode). Start the daemon with mode {recorded}, or migrate: build a new \
     cluster (or a new store) with mode {configured} and move the workloads to it"
)]
pub struct ModeMismatch {
    pub recorded: &'static str,
    pub configured: &'static str,
}

/// Refuses a mode different from the one recorded for the cluster.
pub fn check_mode(recorded: Option<IpamMode>, configured: IpamMode) -> Result<(), ModeMismatch> {
    match recorded {
        Some(r) if r != configured => Err(ModeMismatch {
            recorded: r.name(),
            configured: configured.name(),
        }),
        _ => Ok(()),
    }
}

/// A pool as written by users (YAML/JSON; `ipamctl apply` and CRs take the same document).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PodIpPoolSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<FamilySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<FamilySpec>,
    /// Only pods of these namespaces may name it (by annotation or network configuration), so
    /// that a tenant's pods cannot take another tenant's addresses; empty: every namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Only pods of namespaces whose labels it selects may name it (every namespace has the
    /// label `kubernetes.io/metadata.name` with its name); empty: every namespace. With
    /// `namespaces` too, a namespace must pass both.
    #[serde(default, skip_serializing_if = "Selector::is_empty")]
    pub namespace_selector: Selector,
    /// Addresses (or CIDRs) of the pool handed out only to pods that ask for them (the
    /// `ipam-ebpf.io/ip-addresses` annotation, or the CNI `ips` capability): what a pod with a
    /// fixed address keeps for itself while it is away.
    /// Pods of every namespace the pool serves may ask for them; `reservations` binds
    /// addresses to namespaces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved: Vec<String>,
    /// Addresses (or CIDRs) of the pool handed out only to pods that ask for them, and only to
    /// pods of the namespaces each names: a tenant's StatefulSet member keeps its address
    /// while it is away, and no other tenant's pod takes it by asking.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<Reservation>,
    /// The most blocks of each family one node may hold of the pool. A node asks for one more
    /// whenever its blocks fill, and its agent writes the request: without a bound, one node
    /// (or one compromised agent asking for every block) could take the whole pool. Default:
    /// as many blocks as hold 1,024 addresses, at least one ([`default_max_blocks_per_node`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub max_blocks_per_node: Option<u32>,
}

/// Addresses a node may hold of one pool and family when the pool does not say
/// (`maxBlocksPerNode`): more than a node runs pods (the kubelet's default is 110, and
/// clusters that raise it rarely pass 500), few enough that one node cannot take much of a
/// pool.
pub const DEFAULT_ADDRESSES_PER_NODE: u64 = 1024;

/// The blocks of `mask` in `family` that hold [`DEFAULT_ADDRESSES_PER_NODE`], at least one.
pub fn default_max_blocks_per_node(family: Family, mask: u8) -> u32 {
    // Masks are validated to blocks of at most 2^24 addresses; the bounds keep a mask that
    // was not from panicking.
    let per_block = 1u64 << u32::from(family.bits().saturating_sub(mask)).min(63);
    u32::try_from(DEFAULT_ADDRESSES_PER_NODE.div_ceil(per_block))
        .unwrap_or(u32::MAX)
        .max(1)
}

/// Addresses of a pool kept for the pods of some namespaces.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    /// Addresses or CIDRs of the pool.
    pub addresses: Vec<String>,
    /// The namespaces whose pods may ask for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// The namespaces, by their labels, whose pods may ask for them; with `namespaces` too, a
    /// namespace must pass both. One of the two is required.
    #[serde(default, skip_serializing_if = "Selector::is_empty")]
    pub namespace_selector: Selector,
}

impl PodIpPoolSpec {
    /// Every address handed out only on request, as CIDRs (an address alone is a /32 or
    /// /128): `reserved` and the `reservations`'; those that do not parse are left out
    /// (`validate` reports them).
    pub fn reserved_cidrs(&self) -> Vec<Cidr> {
        self.reserved
            .iter()
            .chain(self.reservations.iter().flat_map(|r| &r.addresses))
            .filter_map(|r| parse_reserved(r).ok())
            .collect()
    }

    /// The addresses bound to namespaces, as CIDRs, each with its reservation.
    pub fn bound_cidrs(&self) -> Vec<(Cidr, &Reservation)> {
        self.reservations
            .iter()
            .flat_map(|r| r.cidrs().into_iter().map(move |c| (c, r)))
            .collect()
    }
}

impl Reservation {
    /// Its addresses as CIDRs; those that do not parse are left out (`validate` reports them).
    pub fn cidrs(&self) -> Vec<Cidr> {
        self.addresses
            .iter()
            .filter_map(|a| parse_reserved(a).ok())
            .collect()
    }
}

/// A reserved entry: an address, or a CIDR.
fn parse_reserved(text: &str) -> Result<Cidr, CidrError> {
    match text.trim().parse::<std::net::IpAddr>() {
        Ok(ip) => Cidr::new(ip, Family::of(ip).bits()),
        Err(_) => text.trim().parse(),
    }
}

/// One family of a pool: its CIDRs, cut into blocks of `maskSize`. CIDRs may be appended; the
/// mask size of a pool in use cannot change (held blocks cannot be re-cut): the Kubernetes API
/// server refuses such a change by a validation rule, and over the other stores the operator
/// refuses it in the pool's status while the pool keeps its accepted spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schema",
    schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.maskSize == oldSelf.maskSize",
        "message": "maskSize cannot change: blocks already handed out cannot be re-cut; append CIDRs instead, or create another pool"
    }]))
)]
#[serde(rename_all = "camelCase")]
pub struct FamilySpec {
    #[cfg_attr(
        feature = "schema",
        schemars(extend("items" = { "type": "string", "format": "cidr" }), length(min = 1))
    )]
    pub cidrs: Vec<String>,
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 128)))]
    pub mask_size: u8,
}

/// A validated pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub name: String,
    pub v4: Option<FamilyPool>,
    pub v6: Option<FamilyPool>,
}

/// One family of a validated pool: its CIDRs, in order, and the per-node block size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyPool {
    pub cidrs: Vec<Cidr>,
    pub mask: u8,
    /// The most blocks of this family one node may hold.
    pub max_blocks_per_node: u32,
}

impl Pool {
    pub fn family(&self, family: Family) -> Option<&FamilyPool> {
        match family {
            Family::V4 => self.v4.as_ref(),
            Family::V6 => self.v6.as_ref(),
        }
    }

    fn families(&self) -> impl Iterator<Item = (Family, &FamilyPool)> {
        [(Family::V4, &self.v4), (Family::V6, &self.v6)]
            .into_iter()
            .filter_map(|(f, p)| p.as_ref().map(|p| (f, p)))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PoolError {
    #[error(
        "pool {pool}: maxBlocksPerNode is 0, so no node could have a block of it; give at least 1, \
         or leave it out for the default (blocks for 1,024 addresses)"
    )]
    NoBlockPerNode { pool: String },
    #[error("pool {pool}: {source}")]
    Cidr { pool: String, source: CidrError },
    #[error(
        "pool {pool}: {cidr} is an {} CIDR in the {} list; move it to spec.{}.cidrs",
        found.name(), list.name(), if *found == Family::V4 { "ipv4" } else { "ipv6" }
    )]
    WrongFamily {
        pool: String,
        cidr: Cidr,
        list: Family,
        found: Family,
    },
    #[error("pool {pool} has no CIDRs; give spec.ipv4 and/or spec.ipv6 at least one CIDR each")]
    Empty { pool: String },
    #[error("pool {pool}: reserved address {entry:?} is refused: {why}")]
    Reserved {
        pool: String,
        entry: String,
        why: String,
    },
    #[error("pool {pool}: spec.reservations[{index}] is refused: {why}")]
    Reservation {
        pool: String,
        index: usize,
        why: String,
    },
    #[error(
        "pool {pool}: {} mask size /{mask} is out of range; use /{} to /{}", family.name(),
        family.bits() - 24, family.bits()
    )]
    MaskOutOfRange {
        pool: String,
        family: Family,
        mask: u8,
    },
    #[error(
        "pool {pool}: mask size /{mask} is larger than CIDR {cidr}, so not one block fits; use a \
         mask of /{} or longer, or a larger CIDR", cidr.prefix()
    )]
    MaskLargerThanCidr { pool: String, cidr: Cidr, mask: u8 },
    #[error("pool {pool}: CIDRs {a} and {b} overlap (in {overlap}); remove one of them")]
    OverlapWithin {
        pool: String,
        a: Cidr,
        b: Cidr,
        overlap: Cidr,
    },
    #[error(
        "pool {pool}: CIDR {a} overlaps CIDR {b} of pool {other} (in {}); pools must not \
         overlap, or one address could be given twice: choose a CIDR outside {b}",
        a.overlap(b).unwrap_or(*a)
    )]
    OverlapBetween {
        pool: String,
        other: String,
        a: Cidr,
        b: Cidr,
    },
    #[error(
        "pool {pool}: CIDR {cidr} cannot be removed while {blocks} node block(s) come from it. \
         Safe procedure: append the replacement CIDR first, drain or replace the nodes holding \
         blocks in {cidr} so they release them, then remove {cidr}"
    )]
    CidrInUse {
        pool: String,
        cidr: Cidr,
        blocks: usize,
    },
    #[error(
        "pool {pool}: the {} mask size cannot change from /{old} to /{new} while {blocks} node \
         block(s) exist (existing blocks cannot be split or merged, and a smaller mask frees \
         nothing). To give more nodes blocks, append a CIDR instead; to really change the block \
         size, create a new pool with the new mask and move nodes to it",
        family.name()
    )]
    MaskInUse {
        pool: String,
        family: Family,
        old: u8,
        new: u8,
        blocks: usize,
    },
    #[error(
        "pool {pool}: the {} CIDR list must keep its existing CIDRs in their order ({old}); \
         append new CIDRs at the end", family.name()
    )]
    Reordered {
        pool: String,
        family: Family,
        old: String,
    },
}

/// Validates one pool on its own: CIDRs, families, mask sizes, overlaps inside the pool.
pub fn validate(name: &str, spec: &PodIpPoolSpec) -> Result<Pool, PoolError> {
    if spec.max_blocks_per_node == Some(0) {
        return Err(PoolError::NoBlockPerNode {
            pool: name.to_owned(),
        });
    }
    let mut pool = Pool {
        name: name.to_owned(),
        v4: validate_family(name, Family::V4, spec.ipv4.as_ref())?,
        v6: validate_family(name, Family::V6, spec.ipv6.as_ref())?,
    };
    for (family, f) in [(Family::V4, &mut pool.v4), (Family::V6, &mut pool.v6)] {
        if let Some(f) = f {
            f.max_blocks_per_node = spec
                .max_blocks_per_node
                .unwrap_or_else(|| default_max_blocks_per_node(family, f.mask));
        }
    }
    if pool.v4.is_none() && pool.v6.is_none() {
        return Err(PoolError::Empty {
            pool: name.to_owned(),
        });
    }
    let refuse = |entry: &str, why: String| PoolError::Reserved {
        pool: name.to_owned(),
        entry: entry.to_owned(),
        why,
    };
    // Each entry with where it came from (`None`: `reserved`), to tell a reservation's entry
    // that overlaps another (entries of `reserved` may overlap each other, as they always
    // could: they keep nothing for anyone).
    let mut seen: Vec<(Cidr, &str, Option<usize>)> = Vec::new();
    let entries = spec.reserved.iter().map(|e| (e, None)).chain(
        spec.reservations
            .iter()
            .enumerate()
            .flat_map(|(i, r)| r.addresses.iter().map(move |e| (e, Some(i)))),
    );
    for (entry, from) in entries {
        let reserved = parse_reserved(entry).map_err(|source| refuse(entry, source.to_string()))?;
        let inside = pool.family(reserved.family()).is_some_and(|f| {
            f.cidrs
                .iter()
                .any(|c| c.overlap(&reserved) == Some(reserved))
        });
        if !inside {
            return Err(refuse(
                entry,
                "it is not inside the pool's CIDRs; reserve addresses of the pool".into(),
            ));
        }
        let clash = seen.iter().find(|(c, _, other)| {
            (from.is_some() || other.is_some()) && c.overlap(&reserved).is_some()
        });
        if let Some((_, other_entry, other)) = clash {
            let place = |from: &Option<usize>| {
                from.map_or("reserved".to_owned(), |i| format!("reservations[{i}]"))
            };
            return Err(refuse(
                entry,
                format!(
                    "in {}, it overlaps {other_entry:?} of {}; an address is kept once, for one \
                     set of namespaces",
                    place(&from),
                    place(other)
                ),
            ));
        }
        seen.push((reserved, entry, from));
    }
    let refuse_reservation = |index: usize, why: &str| PoolError::Reservation {
        pool: name.to_owned(),
        index,
        why: why.to_owned(),
    };
    for (i, r) in spec.reservations.iter().enumerate() {
        if r.addresses.is_empty() {
            return Err(refuse_reservation(
                i,
                "it lists no addresses; give it the addresses it keeps",
            ));
        }
        if r.namespaces.is_empty() && r.namespace_selector.is_empty() {
            return Err(refuse_reservation(
                i,
                "it names no namespace; give it namespaces or a namespaceSelector (for \
                 addresses any namespace the pool serves may ask for, use reserved)",
            ));
        }
    }
    Ok(pool)
}

fn validate_family(
    pool: &str,
    family: Family,
    spec: Option<&FamilySpec>,
) -> Result<Option<FamilyPool>, PoolError> {
    let Some(spec) = spec else { return Ok(None) };
    if spec.cidrs.is_empty() {
        return Ok(None);
    }
    // Blocks of more than 2^24 addresses are not useful per node and would not fit the
    // allocator's bitmap; a mask beyond the family width is meaningless.
    if spec.mask_size > family.bits() || spec.mask_size < family.bits() - 24 {
        return Err(PoolError::MaskOutOfRange {
            pool: pool.to_owned(),
            family,
            mask: spec.mask_size,
        });
    }
    let mut cidrs: Vec<Cidr> = Vec::with_capacity(spec.cidrs.len());
    for text in &spec.cidrs {
        let cidr: Cidr = text.parse().map_err(|source| PoolError::Cidr {
            pool: pool.to_owned(),
            source,
        })?;
        if cidr.family() != family {
            return Err(PoolError::WrongFamily {
                pool: pool.to_owned(),
                cidr,
                list: family,
                found: cidr.family(),
            });
        }
        if spec.mask_size < cidr.prefix() {
            return Err(PoolError::MaskLargerThanCidr {
                pool: pool.to_owned(),
                cidr,
                mask: spec.mask_size,
            });
        }
        if let Some((a, overlap)) = cidrs.iter().find_map(|a| Some((*a, a.overlap(&cidr)?))) {
            return Err(PoolError::OverlapWithin {
                pool: pool.to_owned(),
                a,
                b: cidr,
                overlap,
            });
        }
        cidrs.push(cidr);
    }
    Ok(Some(FamilyPool {
        cidrs,
        mask: spec.mask_size,
        // Set by `validate`, which reads the pool's bound.
        max_blocks_per_node: 1,
    }))
}

/// Refuses `pool` when one of its CIDRs overlaps a CIDR of another pool in `others`.
pub fn check_no_overlap<'a>(
    pool: &Pool,
    others: impl IntoIterator<Item = &'a Pool>,
) -> Result<(), PoolError> {
    for other in others {
        if other.name == pool.name {
            continue;
        }
        for (family, mine) in pool.families() {
            let Some(theirs) = other.family(family) else {
                continue;
            };
            for a in &mine.cidrs {
                for b in &theirs.cidrs {
                    if a.overlaps(b) {
                        return Err(PoolError::OverlapBetween {
                            pool: pool.name.clone(),
                            other: other.name.clone(),
                            a: *a,
                            b: *b,
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// Checks that `new` may replace `old` given how many node blocks each of old's CIDRs holds:
/// CIDRs are append-only while in use, and the mask size is fixed while any block exists.
pub fn check_update(
    old: &Pool,
    new: &Pool,
    blocks_in: impl Fn(&Cidr) -> usize,
) -> Result<(), PoolError> {
    for family in [Family::V4, Family::V6] {
        let Some(old_f) = old.family(family) else {
            continue;
        };
        let in_use: BTreeMap<Cidr, usize> = old_f
            .cidrs
            .iter()
            .map(|c| (*c, blocks_in(c)))
            .filter(|(_, n)| *n > 0)
            .collect();
        let total: usize = in_use.values().sum();
        let new_cidrs = new
            .family(family)
            .map(|f| f.cidrs.as_slice())
            .unwrap_or(&[]);
        for (cidr, blocks) in &in_use {
            if !new_cidrs.contains(cidr) {
                return Err(PoolError::CidrInUse {
                    pool: old.name.clone(),
                    cidr: *cidr,
                    blocks: *blocks,
                });
            }
        }
        if total > 0 {
            let new_f = new
                .family(family)
                .expect("in-use CIDRs are kept, so the family is");
            if new_f.mask != old_f.mask {
                return Err(PoolError::MaskInUse {
                    pool: old.name.clone(),
                    family,
                    old: old_f.mask,
                    new: new_f.mask,
                    blocks: total,
                });
            }
            // Block indexes are positions in the CIDR list: keep the old list as a prefix.
            if !new_f.cidrs.starts_with(&old_f.cidrs) {
                return Err(PoolError::Reordered {
                    pool: old.name.clone(),
                    family,
                    old: old_f
                        .cidrs
                        .iter()
                        .map(Cidr::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v4: &[&str], mask4: u8, v6: &[&str], mask6: u8) -> PodIpPoolSpec {
        let f = |c: &[&str], m| {
            (!c.is_empty()).then(|| FamilySpec {
                cidrs: c.iter().map(std::string::ToString::to_string).collect(),
                mask_size: m,
            })
        };
        PodIpPoolSpec {
            reserved: Vec::new(),
            reservations: Vec::new(),
            ipv4: f(v4, mask4),
            ipv6: f(v6, mask6),
            namespaces: Vec::new(),
            namespace_selector: Default::default(),
            max_blocks_per_node: None,
        }
    }

    /// `maxBlocksPerNode` bounds each family; left out, the bound is blocks for 1,024
    /// addresses; 0 would starve every node and is refused with what to give instead.
    #[test]
    fn max_blocks_per_node_bounds_each_family_and_zero_is_refused() {
        let mut given = spec(&["10.0.0.0/16"], 26, &["fd00::/104"], 120);
        let defaulted = validate("p", &given).unwrap();
        assert_eq!(defaulted.v4.unwrap().max_blocks_per_node, 16);
        assert_eq!(defaulted.v6.unwrap().max_blocks_per_node, 4);
        given.max_blocks_per_node = Some(2);
        let bounded = validate("p", &given).unwrap();
        assert_eq!(bounded.v4.unwrap().max_blocks_per_node, 2);
        assert_eq!(bounded.v6.unwrap().max_blocks_per_node, 2);
        given.max_blocks_per_node = Some(0);
        let refused = validate("p", &given).unwrap_err().to_string();
        assert!(
            refused.contains("pool p: maxBlocksPerNode is 0"),
            "{refused}"
        );
    }

    #[test]
    fn valid_dual_stack_pool() {
        let p = validate(
            "default",
            &spec(&["10.244.0.0/16"], 24, &["fd00::/104"], 120),
        )
        .unwrap();
        assert_eq!(p.v4.unwrap().mask, 24);
        assert_eq!(p.v6.unwrap().cidrs[0].to_string(), "fd00::/104");
    }

    #[test]
    fn invalid_pools_get_errors_naming_pool_and_cidr() {
        let cases = [
            (spec(&["10.244.1.0/16"], 24, &[], 0), "host bits"),
            (
                spec(&["fd00::/104"], 24, &[], 0),
                "IPv6 CIDR in the IPv4 list",
            ),
            (
                spec(&["10.0.0.0/26"], 24, &[], 0),
                "larger than CIDR 10.0.0.0/26",
            ),
            (
                spec(&["10.0.0.0/8", "10.1.0.0/16"], 24, &[], 0),
                "overlap (in 10.1.0.0/16)",
            ),
            (spec(&["10.0.0.0/8"], 33, &[], 0), "out of range"),
            (spec(&[], 0, &[], 0), "has no CIDRs"),
        ];
        for (s, want) in cases {
            let e = validate("tenant-a", &s).unwrap_err().to_string();
            assert!(
                e.contains("tenant-a") && e.contains(want),
                "{e} should contain {want}"
            );
        }
    }

    #[test]
    fn overlapping_pools_name_both() {
        let a = validate("default", &spec(&["10.244.0.0/16"], 24, &[], 0)).unwrap();
        let b = validate("tenant-a", &spec(&["10.244.128.0/17"], 26, &[], 0)).unwrap();
        let e = check_no_overlap(&b, [&a]).unwrap_err().to_string();
        assert!(
            e.contains("tenant-a") && e.contains("default") && e.contains("10.244.128.0/17"),
            "{e}"
        );
        let c = validate("tenant-b", &spec(&["10.250.0.0/16"], 26, &[], 0)).unwrap();
        check_no_overlap(&c, [&a, &b]).unwrap();
    }

    #[test]
    fn in_use_pools_are_append_only_with_a_fixed_mask() {
        let old = validate("default", &spec(&["10.244.0.0/16"], 24, &[], 0)).unwrap();
        let used = |c: &Cidr| usize::from(c.to_string() == "10.244.0.0/16") * 256;
        let appended = validate(
            "default",
            &spec(&["10.244.0.0/16", "10.245.0.0/16"], 24, &[], 0),
        )
        .unwrap();
        check_update(&old, &appended, used).unwrap();

        let narrower = validate("default", &spec(&["10.244.0.0/16"], 25, &[], 0)).unwrap();
        let e = check_update(&old, &narrower, used).unwrap_err().to_string();
        assert!(
            e.contains("/24 to /25") && e.contains("append a CIDR"),
            "{e}"
        );

        let replaced = validate("default", &spec(&["10.245.0.0/16"], 24, &[], 0)).unwrap();
        let e = check_update(&old, &replaced, used).unwrap_err().to_string();
        assert!(
            e.contains("10.244.0.0/16") && e.contains("256 node block"),
            "{e}"
        );

        let prepended = validate(
            "default",
            &spec(&["10.245.0.0/16", "10.244.0.0/16"], 24, &[], 0),
        )
        .unwrap();
        assert!(matches!(
            check_update(&old, &prepended, used),
            Err(PoolError::Reordered { .. })
        ));

        // Not in use: anything goes.
        check_update(&old, &narrower, |_| 0).unwrap();
    }

    #[test]
    fn mode_change_is_refused_with_migration_advice() {
        check_mode(None, IpamMode::MultiPool).unwrap();
        check_mode(Some(IpamMode::MultiPool), IpamMode::MultiPool).unwrap();
        let e = check_mode(Some(IpamMode::Kubernetes), IpamMode::ClusterPool)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("kubernetes") && e.contains("cluster-pool") && e.contains("migrate"),
            "{e}"
        );
    }

    #[test]
    fn reservations_are_inside_the_pool_once_and_name_their_namespaces() {
        let reservation = |addresses: &[&str], namespaces: &[&str]| Reservation {
            addresses: addresses.iter().map(|a| (*a).to_owned()).collect(),
            namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
            namespace_selector: Selector::default(),
        };
        let with = |reserved: &[&str], reservations: Vec<Reservation>| {
            let mut s = spec(&["10.0.0.0/16"], 24, &[], 0);
            s.reserved = reserved.iter().map(|a| (*a).to_owned()).collect();
            s.reservations = reservations;
            validate("p", &s).map(|_| s)
        };
        let good = with(
            &["10.0.0.9"],
            vec![reservation(&["10.0.0.10", "10.0.1.0/28"], &["tenant-a"])],
        )
        .unwrap();
        assert_eq!(good.reserved_cidrs().len(), 3);
        let bound: Vec<String> = good
            .bound_cidrs()
            .iter()
            .map(|(c, r)| format!("{c} {}", r.namespaces.join(",")))
            .collect();
        assert_eq!(bound, ["10.0.0.10/32 tenant-a", "10.0.1.0/28 tenant-a"]);
        let refused = |reserved: &[&str], reservations: Vec<Reservation>| {
            with(reserved, reservations).unwrap_err().to_string()
        };
        let e = refused(&["10.0.1.5"], vec![reservation(&["10.0.1.0/28"], &["a"])]);
        assert!(
            e.contains("\"10.0.1.0/28\"") && e.contains("overlaps \"10.0.1.5\" of reserved"),
            "{e}"
        );
        // Entries of reserved alone may overlap, as they always could.
        assert!(with(&["10.0.0.0/28", "10.0.0.5"], Vec::new()).is_ok());
        let e = refused(
            &[],
            vec![
                reservation(&["10.0.0.10"], &["a"]),
                reservation(&["10.0.0.10"], &["b"]),
            ],
        );
        assert!(
            e.contains("reservations[0]") && e.contains("reservations[1]"),
            "{e}"
        );
        let e = refused(&[], vec![reservation(&["10.9.0.1"], &["a"])]);
        assert!(e.contains("not inside the pool"), "{e}");
        let e = refused(&[], vec![reservation(&["10.0.0.10"], &[])]);
        assert!(
            e.contains("spec.reservations[0] is refused") && e.contains("names no namespace"),
            "{e}"
        );
        let e = refused(&[], vec![reservation(&[], &["a"])]);
        assert!(e.contains("lists no addresses"), "{e}");
    }
}
