//! The contract between the eBPF programs (`ipam-ebpf`) and the daemon (`ipam-daemon`).
//!
//! It also holds [`Family`], the address family every crate shares.
//!
//! Everything else in here is `#[repr(C)]` with explicit padding and a compile-time size check, so
//! both sides agree on every byte. Map names and capacities live here and nowhere else.
#![no_std]

mod family;
pub mod l2;
pub mod pod;

pub use family::Family;

/// `::ffff:a.b.c.d`: how maps keyed by address store IPv4, so one key type serves both families
/// and a v4 key can never collide with a real v6 address.
pub const fn ipv4_mapped(octets: [u8; 4]) -> [u8; 16] {
    let mut addr = [0u8; 16];
    addr[10] = 0xff;
    addr[11] = 0xff;
    addr[12] = octets[0];
    addr[13] = octets[1];
    addr[14] = octets[2];
    addr[15] = octets[3];
    addr
}

/// Names of the maps in the eBPF object. They must equal the `static` names in `ipam-ebpf`
/// (BTF-defined maps take their name from the static); the daemon's loader fails with a clear
/// error when one is missing.
pub mod map_names {
    /// `(IP, ifindex) -> L2Announcement`: which IPs to answer ARP/NDP for, on which interface.
    pub const L2_RESPONDER: &str = "L2_RESPONDER";
    /// One `ResponderConfig` at index 0: liveness gate written by the daemon.
    pub const L2_RESPONDER_CONFIG: &str = "L2_RESPONDER_CONFIG";
    /// Per-CPU counters indexed by `l2::ResponderStat`.
    pub const L2_RESPONDER_STATS: &str = "L2_RESPONDER_STATS";
    /// LRU hash `(IP, ifindex) -> L2Handover`: IPs taken from a node that still runs, whose
    /// open connections go on to it for a while.
    pub const L2_HANDOVER: &str = "L2_HANDOVER";
    /// LRU hash `pod::FlowKey -> u8`: TCP connections opened with this node during a
    /// hand-over, which stay here.
    pub const L2_HANDOVER_FLOWS: &str = "L2_HANDOVER_FLOWS";
    /// One `u32` at index 0, not 0 while `L2_HANDOVER` may hold a hand-over: the responder
    /// looks a TCP segment up there only then (an array read the JIT inlines, instead of a
    /// hash lookup on every segment at rest).
    pub const L2_HANDOVER_GATE: &str = "L2_HANDOVER_GATE";
    /// `pod address -> PodEndpoint`: the pods of this node and where they live.
    pub const POD_ENDPOINTS: &str = "POD_ENDPOINTS";
    /// Per-CPU counters indexed by `pod::PodStat`.
    pub const POD_DATAPATH_STATS: &str = "POD_DATAPATH_STATS";
    /// LPM trie `remote pod CIDR -> RemoteRoute`: the other nodes' blocks and how to reach them.
    pub const POD_ROUTES: &str = "POD_ROUTES";
    /// Per-CPU counters indexed by `pod::RouteStat`.
    pub const POD_ROUTE_STATS: &str = "POD_ROUTE_STATS";
    /// LRU hash `pod::FlowKey -> pod::StackFlow`: replies that must go through the kernel stack
    /// because their requests did.
    pub const POD_STACK_FLOWS: &str = "POD_STACK_FLOWS";
}

/// Key and value sizes of every map, as the eBPF side declares them. The daemon refuses a pinned
/// map whose sizes differ (it was left by an incompatible build) instead of misreading it.
pub mod map_layouts {
    use core::mem::size_of;

    use super::{l2, map_names, pod};

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct MapLayout {
        pub name: &'static str,
        pub key_size: u32,
        pub value_size: u32,
    }

    const fn layout<K, V>(name: &'static str) -> MapLayout {
        MapLayout {
            name,
            key_size: size_of::<K>() as u32,
            value_size: size_of::<V>() as u32,
        }
    }

    /// Arrays are indexed by `u32`; counters are `u64` per CPU.
    pub const ALL: [MapLayout; 11] = [
        layout::<l2::ResponderKey, l2::L2Announcement>(map_names::L2_RESPONDER),
        layout::<u32, l2::ResponderConfig>(map_names::L2_RESPONDER_CONFIG),
        layout::<u32, u64>(map_names::L2_RESPONDER_STATS),
        layout::<l2::ResponderKey, l2::L2Handover>(map_names::L2_HANDOVER),
        layout::<pod::FlowKey, u8>(map_names::L2_HANDOVER_FLOWS),
        layout::<u32, u32>(map_names::L2_HANDOVER_GATE),
        layout::<pod::EndpointKey, pod::PodEndpoint>(map_names::POD_ENDPOINTS),
        layout::<u32, u64>(map_names::POD_DATAPATH_STATS),
        layout::<pod::RouteKey, pod::RemoteRoute>(map_names::POD_ROUTES),
        layout::<u32, u64>(map_names::POD_ROUTE_STATS),
        layout::<pod::FlowKey, pod::StackFlow>(map_names::POD_STACK_FLOWS),
    ];

    /// The layout of map `name`, if the object has such a map.
    pub fn of(name: &str) -> Option<MapLayout> {
        ALL.iter().copied().find(|l| l.name == name)
    }
}

/// Names of the programs in the eBPF object.
pub mod program_names {
    /// The responder attached with XDP (NICs with native XDP, or generic mode).
    pub const L2_RESPONDER_XDP: &str = "l2_responder_xdp";
    /// The same responder attached at TC ingress (veth and other virtual devices, where it is faster).
    pub const L2_RESPONDER_TC: &str = "l2_responder_tc";
    /// Never attached: the daemon runs it (`BPF_PROG_TEST_RUN`) to prove it is alive, which moves
    /// the responder's deadline forward from the kernel's own jiffies.
    pub const L2_HEARTBEAT: &str = "l2_heartbeat";
    /// TC ingress of each pod's host-side veth: what the pod sends (anti-spoofing, local delivery).
    pub const POD_FROM_CONTAINER: &str = "pod_from_container";
    /// TC ingress of the node's uplink: delivers traffic from other nodes' pods straight to
    /// local pods.
    pub const POD_FROM_UPLINK: &str = "pod_from_uplink";
    /// TC egress of each pod's host-side veth: notes the flows the kernel stack delivers to the
    /// pod, whose replies must go back through the stack.
    pub const POD_TO_CONTAINER: &str = "pod_to_container";
    /// TC egress of the node's uplink: notes the flows from local pods that the stack routed to
    /// other nodes' pods (after kube-proxy's DNAT), whose replies must come back through it.
    pub const POD_TO_UPLINK: &str = "pod_to_uplink";
}

#[cfg(test)]
mod tests {
    use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn ipv4_mapped_is_the_standard_mapping() {
        let mapped = ipv4_mapped([10, 1, 2, 3]);
        assert_eq!(
            Ipv6Addr::from(mapped).to_ipv4_mapped(),
            Some(Ipv4Addr::new(10, 1, 2, 3))
        );
    }

    #[test]
    fn every_map_has_one_layout_and_families_know_their_width() {
        for (i, layout) in map_layouts::ALL.iter().enumerate() {
            assert_eq!(map_layouts::of(layout.name), Some(*layout));
            assert!(map_layouts::ALL[..i].iter().all(|l| l.name != layout.name));
            assert!(layout.key_size > 0 && layout.value_size > 0);
        }
        assert_eq!(map_layouts::of("NO_SUCH_MAP"), None);
        assert_eq!(Family::of(IpAddr::V4(Ipv4Addr::LOCALHOST)).bits(), 32);
        assert_eq!(Family::of(IpAddr::V6(Ipv6Addr::LOCALHOST)).bits(), 128);
    }
}
