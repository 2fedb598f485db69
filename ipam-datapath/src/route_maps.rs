//! Typed access to the cross-node route map (other nodes' pod CIDRs → how to reach them) and
//! its counters.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv6Addr},
    path::Path,
};

use aya::maps::{
    Map, MapData, PerCpuArray,
    lpm_trie::{Key, LpmTrie},
};
use ipam_common::{
    map_names,
    pod::{AF_INET, AF_INET6, RemoteRoute, RouteStat},
};
use ipam_core::{Cidr, Family};

use super::{
    DatapathError,
    maps::{map_error, open_pinned, removed_or_absent, take_checked},
};

/// Where one remote pod CIDR goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RouteTarget {
    pub next_hop: IpAddr,
    pub uplink_ifindex: u32,
}

pub struct RouteMaps {
    routes: LpmTrie<MapData, [u8; 16], RemoteRoute>,
    stats: PerCpuArray<MapData, u64>,
}

/// The trie key of `cidr`: IPv4 mapped into `::ffff:0:0/96`, its prefix moved along.
fn route_key(cidr: Cidr) -> Key<[u8; 16]> {
    match cidr.network() {
        IpAddr::V4(v4) => Key::new(96 + u32::from(cidr.prefix()), v4.to_ipv6_mapped().octets()),
        IpAddr::V6(v6) => Key::new(u32::from(cidr.prefix()), v6.octets()),
    }
}

fn key_cidr(key: &Key<[u8; 16]>) -> Option<Cidr> {
    let v6 = Ipv6Addr::from(key.data());
    let prefix = key.prefix_len();
    let text = match v6.to_ipv4_mapped() {
        Some(v4) if prefix >= 96 => format!("{v4}/{}", prefix - 96),
        _ => format!("{v6}/{prefix}"),
    };
    text.parse().ok()
}

impl RouteMaps {
    pub(super) fn take(ebpf: &mut aya::Ebpf, maps_dir: &Path) -> Result<Self, DatapathError> {
        Self::from_maps(
            take_checked(ebpf, maps_dir, map_names::POD_ROUTES)?,
            take_checked(ebpf, maps_dir, map_names::POD_ROUTE_STATS)?,
        )
    }

    /// Opens the maps pinned by a running (or stopped) daemon under `root`.
    pub fn from_pins(root: &Path) -> Result<Self, DatapathError> {
        Self::from_maps(
            open_pinned(root, map_names::POD_ROUTES)?,
            open_pinned(root, map_names::POD_ROUTE_STATS)?,
        )
    }

    fn from_maps(routes: Map, stats: Map) -> Result<Self, DatapathError> {
        Ok(Self {
            routes: LpmTrie::try_from(routes).map_err(|e| map_error(map_names::POD_ROUTES, e))?,
            stats: PerCpuArray::try_from(stats)
                .map_err(|e| map_error(map_names::POD_ROUTE_STATS, e))?,
        })
    }

    /// Routes `cidr` to `target`. The next hop must be of the CIDR's family.
    pub fn insert(&mut self, cidr: Cidr, target: RouteTarget) -> Result<(), DatapathError> {
        let (next_hop, family) = match target.next_hop {
            IpAddr::V4(v4) => (v4.to_ipv6_mapped().octets(), AF_INET),
            IpAddr::V6(v6) => (v6.octets(), AF_INET6),
        };
        debug_assert_eq!(Family::of(target.next_hop), cidr.family());
        let value = RemoteRoute {
            next_hop,
            family,
            uplink_ifindex: target.uplink_ifindex,
        };
        self.routes
            .insert(&route_key(cidr), value, 0)
            .map_err(|e| map_error(map_names::POD_ROUTES, e))
    }

    /// Forgets `cidr`; removing what is not there is not an error.
    pub fn remove(&mut self, cidr: Cidr) -> Result<(), DatapathError> {
        removed_or_absent(self.routes.remove(&route_key(cidr)))
            .map_err(|e| map_error(map_names::POD_ROUTES, e))
    }

    /// Every route in the map.
    pub fn list(&self) -> Result<BTreeMap<Cidr, RouteTarget>, DatapathError> {
        let mut out = BTreeMap::new();
        for item in &self.routes {
            let (key, value) = item.map_err(|e| map_error(map_names::POD_ROUTES, e))?;
            let Some(cidr) = key_cidr(&key) else {
                continue;
            };
            let v6 = Ipv6Addr::from(value.next_hop);
            let next_hop = match value.family {
                AF_INET => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
                _ => IpAddr::V6(v6),
            };
            out.insert(
                cidr,
                RouteTarget {
                    next_hop,
                    uplink_ifindex: value.uplink_ifindex,
                },
            );
        }
        Ok(out)
    }

    /// The counters, summed over CPUs, in `RouteStat` order.
    pub fn stats(&self) -> Result<[u64; RouteStat::COUNT], DatapathError> {
        let mut out = [0; RouteStat::COUNT];
        for stat in RouteStat::ALL {
            let values = self
                .stats
                .get(&(stat as u32), 0)
                .map_err(|e| map_error(map_names::POD_ROUTE_STATS, e))?;
            out[stat as usize] = values.iter().sum();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_in_both_families() {
        for text in [
            "10.244.3.0/24",
            "fd00::100/120",
            "10.0.0.0/8",
            "fd00:1::/64",
        ] {
            let cidr: Cidr = text.parse().unwrap();
            assert_eq!(key_cidr(&route_key(cidr)), Some(cidr), "{text}");
        }
        assert_eq!(route_key("10.1.2.0/24".parse().unwrap()).prefix_len(), 120);
    }
}
