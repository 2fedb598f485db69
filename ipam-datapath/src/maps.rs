//! Typed access to the responder's maps. String map names are only used here, through the
//! constants of `ipam-common`.

use std::{
    net::{IpAddr, Ipv6Addr},
    path::Path,
};

use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray, PerCpuHashMap, PerCpuValues};
use ipam_common::{
    l2::{L2Announcement, L2Handover, ResponderConfig, ResponderKey, ResponderStat},
    map_layouts, map_names,
};

use super::DatapathError;

/// Key of `ip` announced on `ifindex` (IPv4 stored IPv4-mapped, see `ipam-common`).
pub fn responder_key(ip: IpAddr, ifindex: u32) -> ResponderKey {
    match ip {
        IpAddr::V4(v4) => ResponderKey::v4(v4.octets(), ifindex),
        IpAddr::V6(v6) => ResponderKey::v6(v6.octets(), ifindex),
    }
}

fn key_ip(key: &ResponderKey) -> IpAddr {
    let v6 = Ipv6Addr::from(key.addr);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// One announcement as read back from the map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnouncementEntry {
    pub ip: IpAddr,
    pub ifindex: u32,
    pub mac: [u8; 6],
    /// Replies sent for this entry, summed over CPUs.
    pub replies: u64,
}

/// The responder's counters, summed over CPUs, in `ResponderStat` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResponderStats(pub [u64; ResponderStat::COUNT]);

impl ResponderStats {
    pub fn get(&self, stat: ResponderStat) -> u64 {
        self.0[stat as usize]
    }
}

/// The maps of the L2 responder the daemon writes or reads.
pub struct ResponderMaps {
    announcements: PerCpuHashMap<MapData, ResponderKey, L2Announcement>,
    config: Array<MapData, ResponderConfig>,
    stats: PerCpuArray<MapData, u64>,
    /// Absent from the pins of a release before hand-overs (read by `from_pins`).
    handovers: Option<Handovers>,
    nr_cpus: usize,
}

/// The hand-overs and their gate (both absent from the pins of releases before them).
struct Handovers {
    entries: HashMap<MapData, ResponderKey, L2Handover>,
    gate: Array<MapData, u32>,
}

impl ResponderMaps {
    /// Takes the maps out of a freshly loaded object, checking that maps reused from pins have
    /// the layout this build expects.
    pub(super) fn take(ebpf: &mut aya::Ebpf, maps_dir: &Path) -> Result<Self, DatapathError> {
        // Only the programs use the flows opened during hand-overs; its layout is checked.
        take_checked(ebpf, maps_dir, map_names::L2_HANDOVER_FLOWS)?;
        Self::from_maps(
            take_checked(ebpf, maps_dir, map_names::L2_RESPONDER)?,
            take_checked(ebpf, maps_dir, map_names::L2_RESPONDER_CONFIG)?,
            take_checked(ebpf, maps_dir, map_names::L2_RESPONDER_STATS)?,
            Some((
                take_checked(ebpf, maps_dir, map_names::L2_HANDOVER)?,
                take_checked(ebpf, maps_dir, map_names::L2_HANDOVER_GATE)?,
            )),
        )
    }

    /// Opens the maps pinned by a running (or stopped) daemon under `root`, e.g. for `ipamctl`.
    pub fn from_pins(root: &Path) -> Result<Self, DatapathError> {
        Self::from_maps(
            open_pinned(root, map_names::L2_RESPONDER)?,
            open_pinned(root, map_names::L2_RESPONDER_CONFIG)?,
            open_pinned(root, map_names::L2_RESPONDER_STATS)?,
            open_pinned(root, map_names::L2_HANDOVER)
                .ok()
                .zip(open_pinned(root, map_names::L2_HANDOVER_GATE).ok()),
        )
    }

    fn from_maps(
        announcements: Map,
        config: Map,
        stats: Map,
        handovers: Option<(Map, Map)>,
    ) -> Result<Self, DatapathError> {
        let nr_cpus =
            aya::util::nr_cpus().map_err(|(what, source)| DatapathError::Cpus { what, source })?;
        Ok(Self {
            announcements: PerCpuHashMap::try_from(announcements)
                .map_err(|e| map_error(map_names::L2_RESPONDER, e))?,
            config: Array::try_from(config)
                .map_err(|e| map_error(map_names::L2_RESPONDER_CONFIG, e))?,
            stats: PerCpuArray::try_from(stats)
                .map_err(|e| map_error(map_names::L2_RESPONDER_STATS, e))?,
            handovers: handovers.map(Handovers::try_from).transpose()?,
            nr_cpus,
        })
    }

    /// Announces `ip` on `ifindex`, answering with `mac`. Returns `true` when the entry is new or
    /// its MAC changed (the caller then sends a gratuitous announcement); an identical existing
    /// entry is left alone so its reply counters survive daemon restarts.
    pub fn announce(
        &mut self,
        ip: IpAddr,
        ifindex: u32,
        mac: [u8; 6],
    ) -> Result<bool, DatapathError> {
        let key = responder_key(ip, ifindex);
        if let Ok(existing) = self.announcements.get(&key, 0)
            && existing.iter().all(|v| v.mac == mac)
        {
            return Ok(false);
        }
        // The whole value, on every CPU, in one update: the datapath never sees half an entry.
        let values =
            PerCpuValues::try_from(vec![L2Announcement::new(mac); self.nr_cpus]).map_err(|e| {
                DatapathError::Cpus {
                    what: "per-CPU values",
                    source: e,
                }
            })?;
        self.announcements
            .insert(key, values, 0)
            .map_err(|e| map_error(map_names::L2_RESPONDER, e))?;
        Ok(true)
    }

    /// Stops answering for `ip` on `ifindex`. Withdrawing what is not announced is not an error.
    pub fn withdraw(&mut self, ip: IpAddr, ifindex: u32) -> Result<(), DatapathError> {
        removed_or_absent(self.announcements.remove(&responder_key(ip, ifindex)))
            .map_err(|e| map_error(map_names::L2_RESPONDER, e))
    }

    /// Passes on to `old_owner` (its MAC on the segment), until CLOCK_MONOTONIC `until_ns`, the
    /// TCP segments to `ip` on `ifindex` of connections not opened with this node: those the
    /// old owner still holds (`ipam_common::l2::L2Handover`).
    pub fn hand_over(
        &mut self,
        ip: IpAddr,
        ifindex: u32,
        old_owner: [u8; 6],
        until_ns: u64,
    ) -> Result<(), DatapathError> {
        let value = L2Handover {
            mac: old_owner,
            _pad: [0; 2],
            until_ns,
        };
        let handovers = self.handovers_mut()?;
        handovers
            .entries
            .insert(responder_key(ip, ifindex), value, 0)
            .map_err(|e| map_error(map_names::L2_HANDOVER, e))?;
        // Opened after the entry is in: a segment that finds the gate open finds the entry.
        handovers.set_gate(true)
    }

    /// Ends the hand-over of `ip` on `ifindex`, if any; the gate closes with the last one.
    pub fn end_handover(&mut self, ip: IpAddr, ifindex: u32) -> Result<(), DatapathError> {
        let handovers = self.handovers_mut()?;
        removed_or_absent(handovers.entries.remove(&responder_key(ip, ifindex)))
            .map_err(|e| map_error(map_names::L2_HANDOVER, e))?;
        if handovers.entries.keys().next().is_none() {
            handovers.set_gate(false)?;
        }
        Ok(())
    }

    fn handovers_mut(&mut self) -> Result<&mut Handovers, DatapathError> {
        self.handovers.as_mut().ok_or(DatapathError::MissingMap {
            name: map_names::L2_HANDOVER,
        })
    }

    /// Whether the responder looks TCP segments up in the hand-overs (`false` without them).
    pub fn handover_gate_open(&self) -> Result<bool, DatapathError> {
        let Some(handovers) = &self.handovers else {
            return Ok(false);
        };
        let open = handovers
            .gate
            .get(&0, 0)
            .map_err(|e| map_error(map_names::L2_HANDOVER_GATE, e))?;
        Ok(open != 0)
    }

    /// Every announcement with its reply count, sorted by interface then IP.
    pub fn list(&self) -> Result<Vec<AnnouncementEntry>, DatapathError> {
        let mut out = Vec::new();
        for item in &self.announcements {
            let (key, values) = item.map_err(|e| map_error(map_names::L2_RESPONDER, e))?;
            out.push(AnnouncementEntry {
                ip: key_ip(&key),
                ifindex: key.ifindex,
                mac: values.first().map(|v| v.mac).unwrap_or_default(),
                replies: values.iter().map(|v| v.replies).sum(),
            });
        }
        out.sort_by_key(|e| (e.ifindex, e.ip));
        Ok(out)
    }

    /// Writes the liveness gate as given (tests use it to make the heartbeat stale).
    pub fn write_config(&mut self, config: ResponderConfig) -> Result<(), DatapathError> {
        self.config
            .set(0, config, 0)
            .map_err(|e| map_error(map_names::L2_RESPONDER_CONFIG, e))
    }

    pub fn config(&self) -> Result<ResponderConfig, DatapathError> {
        self.config
            .get(&0, 0)
            .map_err(|e| map_error(map_names::L2_RESPONDER_CONFIG, e))
    }

    pub fn stats(&self) -> Result<ResponderStats, DatapathError> {
        let mut out = ResponderStats::default();
        for stat in ResponderStat::ALL {
            let values = self
                .stats
                .get(&(stat as u32), 0)
                .map_err(|e| map_error(map_names::L2_RESPONDER_STATS, e))?;
            out.0[stat as usize] = values.iter().sum();
        }
        Ok(out)
    }
}

/// A deletion that found its key gone counts as done. aya reports the kernel's ENOENT from
/// `bpf_map_delete_elem` as a failed syscall, not as `KeyNotFound`: after a reboot cleared the
/// bpffs, every DEL of a pod the agent still remembers met it, and the kubelet could never
/// tear those sandboxes down (found on the real-cluster lab).
pub(super) fn removed_or_absent(
    result: Result<(), aya::maps::MapError>,
) -> Result<(), aya::maps::MapError> {
    match result {
        Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(())
        }
        other => other,
    }
}

pub(super) fn map_error(name: &'static str, source: aya::maps::MapError) -> DatapathError {
    DatapathError::Map {
        name,
        source: Box::new(source),
    }
}

/// The liveness gate's map holds nothing a restart must keep (the daemon writes it at start), so
/// a pinned one with an older layout is unpinned and created afresh instead of refused. Links
/// adopted from the old daemon keep their old program, and with it the old map, until this
/// daemon swaps its program in: the responders keep answering through the upgrade.
pub(super) fn replace_outdated_config(maps_dir: &Path) -> Result<(), DatapathError> {
    let name = map_names::L2_RESPONDER_CONFIG;
    let path = maps_dir.join(name);
    let Ok(pinned) = MapData::from_pin(&path) else {
        return Ok(());
    };
    let want = map_layouts::of(name).ok_or(DatapathError::MissingMap { name })?;
    let info = pinned.info().map_err(|e| map_error(name, e))?;
    if info.key_size() == want.key_size && info.value_size() == want.value_size {
        return Ok(());
    }
    tracing::info!(
        map = name,
        found_value_size = info.value_size(),
        value_size = want.value_size,
        "liveness gate pinned by an older version: replacing it"
    );
    std::fs::remove_file(&path).map_err(|source| DatapathError::PinDir { path, source })
}

impl TryFrom<(Map, Map)> for Handovers {
    type Error = DatapathError;

    fn try_from((entries, gate): (Map, Map)) -> Result<Self, DatapathError> {
        Ok(Self {
            entries: HashMap::try_from(entries)
                .map_err(|e| map_error(map_names::L2_HANDOVER, e))?,
            gate: Array::try_from(gate).map_err(|e| map_error(map_names::L2_HANDOVER_GATE, e))?,
        })
    }
}

impl Handovers {
    fn set_gate(&mut self, open: bool) -> Result<(), DatapathError> {
        self.gate
            .set(0, u32::from(open), 0)
            .map_err(|e| map_error(map_names::L2_HANDOVER_GATE, e))
    }
}

/// Opens the map `name` pinned under `root` and checks its layout.
pub(super) fn open_pinned(root: &Path, name: &'static str) -> Result<Map, DatapathError> {
    let path = root.join("maps").join(name);
    let data = MapData::from_pin(&path).map_err(|source| DatapathError::NotPinned {
        name,
        path: path.clone(),
        source: Box::new(source),
    })?;
    let map = Map::from_map_data(data).map_err(|source| map_error(name, source))?;
    check_layout(name, &path, &map)?;
    Ok(map)
}

/// Takes the map `name` out of a freshly loaded object and checks its layout (a map reused from
/// a pin may have been created by another build).
pub(super) fn take_checked(
    ebpf: &mut aya::Ebpf,
    maps_dir: &Path,
    name: &'static str,
) -> Result<Map, DatapathError> {
    let map = ebpf
        .take_map(name)
        .ok_or(DatapathError::MissingMap { name })?;
    check_layout(name, &maps_dir.join(name), &map)?;
    Ok(map)
}

pub(super) fn check_layout(
    name: &'static str,
    path: &Path,
    map: &Map,
) -> Result<(), DatapathError> {
    let (Map::PerCpuHashMap(data)
    | Map::HashMap(data)
    | Map::Array(data)
    | Map::PerCpuArray(data)
    | Map::LpmTrie(data)
    | Map::LruHashMap(data)) = map
    else {
        return Err(DatapathError::MissingMap { name });
    };
    let info = data.info().map_err(|e| map_error(name, e))?;
    let want = map_layouts::of(name).ok_or(DatapathError::MissingMap { name })?;
    if info.key_size() != want.key_size || info.value_size() != want.value_size {
        return Err(DatapathError::MapLayout {
            name,
            path: path.to_owned(),
            found_key: info.key_size(),
            found_value: info.value_size(),
            want_key: want.key_size,
            want_value: want.value_size,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn a_key_already_gone_is_removed() {
        let syscall = |errno| {
            Err(aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                call: "bpf_map_delete_elem",
                io_error: std::io::Error::from_raw_os_error(errno),
            }))
        };
        const ENOENT: i32 = 2;
        const EPERM: i32 = 1;
        assert!(removed_or_absent(syscall(ENOENT)).is_ok());
        assert!(removed_or_absent(Err(aya::maps::MapError::KeyNotFound)).is_ok());
        assert!(removed_or_absent(Ok(())).is_ok());
        assert!(
            removed_or_absent(syscall(EPERM)).is_err(),
            "only a missing key is success"
        );
    }

    #[test]
    fn keys_round_trip_both_families() {
        for ip in ["192.0.2.7", "2001:db8::7", "::ffff:0:1"] {
            let ip: IpAddr = ip.parse().unwrap();
            let key = responder_key(ip, 3);
            assert_eq!(key.ifindex, 3);
            // `::ffff:0:1` is itself IPv4-mapped (0.0.0.1): it reads back as the v4 address,
            // which is the same key, so both spellings hit the same entry.
            let back = key_ip(&key);
            assert_eq!(responder_key(back, 3), key);
        }
        assert_eq!(
            key_ip(&responder_key("198.51.100.1".parse().unwrap(), 1)),
            IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1))
        );
    }
}
