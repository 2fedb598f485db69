//! Typed access to the pod datapath's maps: the endpoint map (pod address → where the pod lives)
//! and its counters.

use std::{net::IpAddr, path::Path};

use aya::maps::{HashMap, Map, MapData, PerCpuArray};
use ipam_common::{
    map_names,
    pod::{EndpointKey, PodEndpoint, PodStat},
};

use super::{
    DatapathError,
    maps::{map_error, open_pinned, removed_or_absent, take_checked},
};

/// Key of a pod address (IPv4 stored IPv4-mapped, see `ipam-common`).
pub fn endpoint_key(ip: IpAddr) -> EndpointKey {
    match ip {
        IpAddr::V4(v4) => EndpointKey::v4(v4.octets()),
        IpAddr::V6(v6) => EndpointKey::v6(v6.octets()),
    }
}

fn key_ip(key: &EndpointKey) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(key.addr);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// The pod datapath's counters, summed over CPUs, in `PodStat` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodStats(pub [u64; PodStat::COUNT]);

impl PodStats {
    pub fn get(&self, stat: PodStat) -> u64 {
        self.0[stat as usize]
    }
}

/// The two maps of the pod datapath.
pub struct PodMaps {
    endpoints: HashMap<MapData, EndpointKey, PodEndpoint>,
    stats: PerCpuArray<MapData, u64>,
}

impl PodMaps {
    pub(super) fn take(ebpf: &mut aya::Ebpf, maps_dir: &Path) -> Result<Self, DatapathError> {
        Self::from_maps(
            take_checked(ebpf, maps_dir, map_names::POD_ENDPOINTS)?,
            take_checked(ebpf, maps_dir, map_names::POD_DATAPATH_STATS)?,
        )
    }

    /// Opens the maps pinned by a running (or stopped) daemon under `root`, e.g. for `ipamctl`.
    pub fn from_pins(root: &Path) -> Result<Self, DatapathError> {
        Self::from_maps(
            open_pinned(root, map_names::POD_ENDPOINTS)?,
            open_pinned(root, map_names::POD_DATAPATH_STATS)?,
        )
    }

    fn from_maps(endpoints: Map, stats: Map) -> Result<Self, DatapathError> {
        Ok(Self {
            endpoints: HashMap::try_from(endpoints)
                .map_err(|e| map_error(map_names::POD_ENDPOINTS, e))?,
            stats: PerCpuArray::try_from(stats)
                .map_err(|e| map_error(map_names::POD_DATAPATH_STATS, e))?,
        })
    }

    /// Points `ip` at a local pod. Rewriting an identical entry is skipped.
    pub fn insert(&mut self, ip: IpAddr, endpoint: PodEndpoint) -> Result<(), DatapathError> {
        let key = endpoint_key(ip);
        if self.endpoints.get(&key, 0).ok() == Some(endpoint) {
            return Ok(());
        }
        self.endpoints
            .insert(key, endpoint, 0)
            .map_err(|e| map_error(map_names::POD_ENDPOINTS, e))
    }

    /// Forgets `ip`; removing what is not there is not an error.
    pub fn remove(&mut self, ip: IpAddr) -> Result<(), DatapathError> {
        removed_or_absent(self.endpoints.remove(&endpoint_key(ip)))
            .map_err(|e| map_error(map_names::POD_ENDPOINTS, e))
    }

    /// Every entry, sorted by address.
    pub fn list(&self) -> Result<Vec<(IpAddr, PodEndpoint)>, DatapathError> {
        let mut out = Vec::new();
        for item in &self.endpoints {
            let (key, value) = item.map_err(|e| map_error(map_names::POD_ENDPOINTS, e))?;
            out.push((key_ip(&key), value));
        }
        out.sort_by_key(|(ip, _)| *ip);
        Ok(out)
    }

    pub fn stats(&self) -> Result<PodStats, DatapathError> {
        let mut out = PodStats::default();
        for stat in PodStat::ALL {
            let values = self
                .stats
                .get(&(stat as u32), 0)
                .map_err(|e| map_error(map_names::POD_DATAPATH_STATS, e))?;
            out.0[stat as usize] = values.iter().sum();
        }
        Ok(out)
    }
}
