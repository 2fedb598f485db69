//! Types of the pod datapath: which addresses belong to which local pod, and its counters.

/// Maximum number of pod addresses (all families) one node can hold in the endpoint map.
pub const POD_ENDPOINTS_CAPACITY: usize = 65_536;

/// Key of the endpoint map: one pod address, IPv4 stored IPv4-mapped (`::ffff:a.b.c.d`) as in
/// the responder map, so one map serves both families.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EndpointKey {
    /// The address in network byte order.
    pub addr: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<EndpointKey>() == 16);

impl EndpointKey {
    /// Key for an IPv4 address given as its four octets.
    pub const fn v4(octets: [u8; 4]) -> Self {
        Self {
            addr: crate::ipv4_mapped(octets),
        }
    }

    /// Key for an IPv6 address given as its sixteen octets.
    pub const fn v6(octets: [u8; 16]) -> Self {
        Self { addr: octets }
    }
}

/// Value of the endpoint map: where a local pod address lives and how to hand it a frame.
///
/// Written by the daemon when a pod is registered (CNI ADD), removed on CNI DEL.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodEndpoint {
    /// The host side of the pod's veth pair: frames for the pod are redirected to its peer, and
    /// frames from the pod must arrive on it (anti-spoofing).
    pub host_ifindex: u32,
    /// MAC address of the pod's interface (destination of delivered frames).
    pub pod_mac: [u8; 6],
    /// MAC address of the host side (source of delivered frames: the pod's gateway).
    pub host_mac: [u8; 6],
}
const _: () = assert!(core::mem::size_of::<PodEndpoint>() == 16);

/// Maximum number of remote pod CIDRs (blocks of other nodes, all families) in the route map.
pub const POD_ROUTES_CAPACITY: usize = 65_536;

/// Key of the route map as the kernel's LPM trie reads it: a prefix length in bits, then the
/// address, IPv4 stored IPv4-mapped like the endpoint key (so an IPv4 /24 has prefix 96 + 24).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteKey {
    pub prefix_len: u32,
    pub addr: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<RouteKey>() == 20);

/// Address family numbers of `bpf_redir_neigh.nh_family` (Linux's AF_INET and AF_INET6).
pub const AF_INET: u32 = 2;
pub const AF_INET6: u32 = 10;

/// Value of the route map: where a remote pod CIDR lives.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRoute {
    /// The node that holds the block, as the next hop: IPv4-mapped for `AF_INET`.
    pub next_hop: [u8; 16],
    /// `AF_INET` or `AF_INET6`: the family of `next_hop`.
    pub family: u32,
    /// The uplink the node is reached through; the kernel resolves the next hop's MAC there.
    pub uplink_ifindex: u32,
}
const _: () = assert!(core::mem::size_of::<RemoteRoute>() == 24);

/// Capacity of the stack-flow table (least recently used entries make room for new ones).
pub const STACK_FLOWS_CAPACITY: usize = 65_536;

/// One direction of a flow between a pod address and another address, as the stack-flow table
/// keys it: addresses IPv4-mapped like the endpoint key, ports as on the wire (zero for
/// protocols without ports and for IP fragments).
///
/// The table holds the *reply* direction of each flow whose request the kernel stack delivered
/// to a pod (after kube-proxy's DNAT, say). Such a reply must go back through the stack too, or
/// the node's conntrack would see half a connection: it could not undo the NAT, and it would
/// call the reply INVALID (which kube-proxy drops).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub src_port: [u8; 2],
    pub dst_port: [u8; 2],
    /// The IP protocol number (IPv6: the next header after the fixed header).
    pub proto: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<FlowKey>() == 40);

impl FlowKey {
    /// The same flow seen from the other end: the key a reply of this packet carries.
    pub const fn reversed(&self) -> Self {
        Self {
            src: self.dst,
            dst: self.src,
            src_port: self.dst_port,
            dst_port: self.src_port,
            proto: self.proto,
            _pad: [0; 3],
        }
    }
}

/// Value of the stack-flow table: where the stack sent the request whose reply the key is.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackFlow {
    /// The interface the request left through (a pod's host-side veth or an uplink).
    pub egress_ifindex: u32,
}
const _: () = assert!(core::mem::size_of::<StackFlow>() == 4);

/// The `skb->mark` the pod program gives a packet it forwards to another node, so that the
/// uplink's egress program tells it from a packet the stack routed there. Set and cleared within
/// one node's transmit path (no netfilter hook runs between the two), so it meets no other
/// user of marks.
pub const FORWARDED_MARK: u32 = 0x1f0a_0000;

/// Indexes of the cross-node routing counters.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteStat {
    /// Packets from local pods sent to another node's pod (`bpf_redirect_neigh`).
    Forwarded = 0,
    /// Packets for a remote pod left to the kernel because their hop limit ran out.
    HopLimitToStack = 1,
}

impl RouteStat {
    pub const COUNT: usize = 2;
    pub const ALL: [RouteStat; Self::COUNT] = [Self::Forwarded, Self::HopLimitToStack];

    pub const fn name(self) -> &'static str {
        match self {
            Self::Forwarded => "forwarded",
            Self::HopLimitToStack => "hop_limit_to_stack",
        }
    }
}

/// Indexes of the pod datapath's per-CPU counters.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodStat {
    /// Packets delivered straight into a local pod (`bpf_redirect_peer`).
    Delivered = 0,
    /// Packets left to the kernel stack (host addresses, other nodes, outside).
    ToStack = 1,
    /// Packets from a pod whose source address is not one of that pod's addresses: dropped.
    SpoofDropped = 2,
    /// Frames from a pod that are neither IP nor ARP: dropped.
    UnsupportedDropped = 3,
}

impl PodStat {
    /// Number of counters (size of the stats map).
    pub const COUNT: usize = 4;
    /// All counters, in index order.
    pub const ALL: [PodStat; Self::COUNT] = [
        Self::Delivered,
        Self::ToStack,
        Self::SpoofDropped,
        Self::UnsupportedDropped,
    ];

    /// A short name for CLIs and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::ToStack => "to_stack",
            Self::SpoofDropped => "spoof_dropped",
            Self::UnsupportedDropped => "unsupported_dropped",
        }
    }
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain-old-data, `#[repr(C)]`, every bit pattern valid, no implicit padding
    // (sizes asserted above).
    unsafe impl aya::Pod for super::EndpointKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PodEndpoint {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RemoteRoute {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::FlowKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::StackFlow {}
}
