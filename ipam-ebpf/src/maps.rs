//! The maps of the eBPF object. Their names (the static names) and capacities are defined in
//! `ipam-common`, which the daemon reads too.
use aya_ebpf::{
    btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, PerCpuHashMap},
    macros::btf_map,
};
use ipam_common::{
    l2::{
        L2_HANDOVER_CAPACITY, L2_HANDOVER_FLOWS_CAPACITY, L2_RESPONDER_CAPACITY, L2Announcement,
        L2Handover, ResponderConfig, ResponderKey, ResponderStat,
    },
    pod::{
        EndpointKey, FlowKey, POD_ENDPOINTS_CAPACITY, POD_ROUTES_CAPACITY, PodEndpoint, PodStat,
        RemoteRoute, RouteStat, STACK_FLOWS_CAPACITY, StackFlow,
    },
};

#[btf_map]
pub static L2_RESPONDER: PerCpuHashMap<ResponderKey, L2Announcement, L2_RESPONDER_CAPACITY> =
    PerCpuHashMap::new();

#[btf_map]
pub static L2_RESPONDER_CONFIG: Array<ResponderConfig, 1> = Array::new();

#[btf_map]
pub static L2_RESPONDER_STATS: PerCpuArray<u64, { ResponderStat::COUNT }> = PerCpuArray::new();

/// Adds one to a responder counter of this CPU.
#[inline(always)]
pub fn count(stat: ResponderStat) {
    if let Some(counter) = L2_RESPONDER_STATS.get_ptr_mut(stat as u32) {
        // SAFETY: per-CPU slot, only this program on this CPU writes it (no preemption in BPF).
        unsafe { *counter += 1 };
    }
}

/// IPs taken from a node that still runs: where their open connections go on to, until when.
#[btf_map]
pub static L2_HANDOVER: LruHashMap<ResponderKey, L2Handover, L2_HANDOVER_CAPACITY> =
    LruHashMap::new();

/// Not 0 while `L2_HANDOVER` may hold a hand-over (the daemon opens it after writing one, and
/// closes it once it ended the last).
#[btf_map]
pub static L2_HANDOVER_GATE: Array<u32, 1> = Array::new();

/// Connections opened with this node during a hand-over, which stay here.
#[btf_map]
pub static L2_HANDOVER_FLOWS: LruHashMap<FlowKey, u8, L2_HANDOVER_FLOWS_CAPACITY> =
    LruHashMap::new();

#[btf_map]
pub static POD_ENDPOINTS: HashMap<EndpointKey, PodEndpoint, POD_ENDPOINTS_CAPACITY> =
    HashMap::new();

#[btf_map]
pub static POD_DATAPATH_STATS: PerCpuArray<u64, { PodStat::COUNT }> = PerCpuArray::new();

/// Adds one to a pod datapath counter of this CPU.
#[inline(always)]
pub fn count_pod(stat: PodStat) {
    if let Some(counter) = POD_DATAPATH_STATS.get_ptr_mut(stat as u32) {
        // SAFETY: per-CPU slot, only this program on this CPU writes it (no preemption in BPF).
        unsafe { *counter += 1 };
    }
}

/// The other nodes' pod CIDRs (keys as `ipam_common::pod::RouteKey`: prefix length, then the
/// address, IPv4-mapped).
#[btf_map]
pub static POD_ROUTES: LpmTrie<[u8; 16], RemoteRoute, POD_ROUTES_CAPACITY> = LpmTrie::new();

#[btf_map]
pub static POD_ROUTE_STATS: PerCpuArray<u64, { RouteStat::COUNT }> = PerCpuArray::new();

/// Adds one to a routing counter of this CPU.
#[inline(always)]
pub fn count_route(stat: RouteStat) {
    if let Some(counter) = POD_ROUTE_STATS.get_ptr_mut(stat as u32) {
        // SAFETY: per-CPU slot, only this program on this CPU writes it (no preemption in BPF).
        unsafe { *counter += 1 };
    }
}

/// The replies that must take the kernel stack because their requests did (see
/// `pod_datapath`). Shared by every CPU: a request noted on one CPU is looked up on another.
#[btf_map]
pub static POD_STACK_FLOWS: LruHashMap<FlowKey, StackFlow, STACK_FLOWS_CAPACITY> =
    LruHashMap::new();
