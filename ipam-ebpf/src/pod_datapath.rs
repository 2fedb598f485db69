//! The pod datapath: what happens to a packet a pod sends, and to a packet for a pod that comes
//! in from the uplink.
//!
//! - A packet for a pod of this node is handed straight to that pod (`bpf_redirect_peer` into
//!   its veth peer), skipping the host's routing, neighbour and qdisc layers.
//! - A packet for a pod of another node (a block in the route map) is routed out of the uplink
//!   towards that node with `bpf_redirect_neigh`: the kernel resolves the next hop's MAC, and
//!   the host's routing table is not consulted.
//! - Everything else goes to the kernel stack (host addresses, the outside).
//! - Traffic from the uplink is delivered straight only when it comes from another node's pod:
//!   the reply of such a packet goes straight back (it is for a remote pod), so this node's
//!   conntrack sees neither direction. Anything else (another host, kube-proxy's forwarded
//!   Service traffic) takes the stack, where the reply will go too.
//! - A flow whose request the stack delivered to a pod (after kube-proxy's DNAT of a ClusterIP,
//!   say) is noted on the way out (`to_container`, `to_uplink`) in the stack-flow table, and its
//!   replies go back through the stack: conntrack then sees both directions, undoes the NAT, and
//!   does not call the reply INVALID (which kube-proxy's rules drop).
//! - A packet from a pod must carry one of that pod's addresses as its source, and arrive on that
//!   pod's veth; anything else is dropped and counted (no spoofing).
//!
//! Spoof drops are also logged (aya-log, warn level) when the daemon's `ebpf_log_level` lets
//! them through; at the default level (off) the log statements are removed at load time.
//!
//! Written against a [`Frame`] like the responder; the entry points only pull headers into the
//! linear area and turn the [`Verdict`] into a TC action.

use aya_ebpf::btf_maps::lpm_trie::Key;
use aya_log_ebpf::warn;
use ipam_common::pod::{
    EndpointKey, FlowKey, PodEndpoint, PodStat, RemoteRoute, RouteStat, StackFlow,
};

use crate::{
    maps::{POD_ENDPOINTS, POD_ROUTES, POD_STACK_FLOWS, count_pod, count_route},
    packet::{
        ETH_HLEN, ETH_P_ARP, ETH_P_IP, ETH_P_IPV6, EthHdr, Frame, IPV6_HLEN, Ipv4Hdr, Ipv6Hdr,
    },
};

/// Prefix of a packet the programs make sure is in the linear area: Ethernet + IPv6 header.
/// The transport ports of the flow key are read only where the linear area already holds them,
/// as it does whenever the stack built the packet or GRO merged it; pulling them in as well
/// would copy payload into the head of every bulk TCP packet (measured: throughput fell to
/// 0.80 of kernel routing with the ports pulled, `cargo xtask bench datapath`).
pub const HEADROOM: u32 = (ETH_HLEN + IPV6_HLEN) as u32;

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_SCTP: u8 = 132;

/// What the entry point must do with the frame.
pub enum Verdict {
    /// Leave it to the kernel stack, unmodified.
    Stack,
    /// Drop it (already counted).
    Drop,
    /// The frame was rewritten for a local pod: redirect it into the peer of this host-side veth.
    Deliver { host_ifindex: u32 },
    /// For a pod on another node: send it out of the uplink towards that node.
    Forward { route: RemoteRoute },
}

/// A frame a pod sent, received on its host-side veth `ifindex`.
#[inline(always)]
pub fn from_container(frame: &mut Frame, ifindex: u32) -> Verdict {
    let Some(eth) = frame.ptr_at::<EthHdr>(0) else {
        return dropped(PodStat::UnsupportedDropped);
    };
    // SAFETY: `ptr_at` checked that the header lies within the frame.
    let ethertype = u16::from_be(unsafe { (*eth).ether_type });
    match ethertype {
        ETH_P_IP => {
            let Some(ip) = frame.ptr_at::<Ipv4Hdr>(ETH_HLEN) else {
                return dropped(PodStat::UnsupportedDropped);
            };
            // SAFETY: bounds checked by `ptr_at`; the pointers are to distinct headers.
            let (eth, ip) = unsafe { (&mut *eth, &mut *ip) };
            if !sent_by(EndpointKey::v4(ip.src_addr), ifindex) {
                let source = u32::from_be_bytes(ip.src_addr);
                warn!(
                    &(),
                    "pod on ifindex {}: dropped packet from spoofed source {:i}", ifindex, source
                );
                return dropped(PodStat::SpoofDropped);
            }
            let verdict = if let Some(endpoint) = local_pod(EndpointKey::v4(ip.dst_addr)) {
                deliver_v4(frame, eth, ip, endpoint)
            } else if let Some(route) = remote_pod_v4(ip.dst_addr) {
                route_v4(frame, ip, route)
            } else {
                Verdict::Stack
            };
            to_stack_unless_local(verdict)
        }
        ETH_P_IPV6 => {
            let Some(ip6) = frame.ptr_at::<Ipv6Hdr>(ETH_HLEN) else {
                return dropped(PodStat::UnsupportedDropped);
            };
            // SAFETY: as above.
            let (eth, ip6) = unsafe { (&mut *eth, &mut *ip6) };
            // Neighbour discovery, DAD and MLD use link-local or unspecified sources towards
            // link-scoped destinations; they never leave the link, so there is nothing to spoof.
            if is_link_scoped_source(&ip6.src_addr) && is_link_scoped_destination(&ip6.dst_addr) {
                count_pod(PodStat::ToStack);
                return Verdict::Stack;
            }
            if !sent_by(EndpointKey::v6(ip6.src_addr), ifindex) {
                let source = ip6.src_addr;
                warn!(
                    &(),
                    "pod on ifindex {}: dropped packet from spoofed source {:i}", ifindex, source
                );
                return dropped(PodStat::SpoofDropped);
            }
            let verdict = if let Some(endpoint) = local_pod(EndpointKey::v6(ip6.dst_addr)) {
                deliver_v6(frame, eth, ip6, endpoint)
            } else if let Some(route) = remote_pod_v6(ip6.dst_addr) {
                route_v6(frame, ip6, route)
            } else {
                Verdict::Stack
            };
            to_stack_unless_local(verdict)
        }
        ETH_P_ARP => {
            count_pod(PodStat::ToStack);
            Verdict::Stack
        }
        _ => dropped(PodStat::UnsupportedDropped),
    }
}

/// A frame that came in on the node's uplink: delivered directly when it is for a local pod and
/// from another node's pod (so that its reply, which goes straight back, skips this node's
/// stack as the request did).
#[inline(always)]
pub fn from_uplink(frame: &mut Frame) -> Verdict {
    let Some(eth) = frame.ptr_at::<EthHdr>(0) else {
        return Verdict::Stack;
    };
    // SAFETY: `ptr_at` checked that the header lies within the frame.
    let ethertype = u16::from_be(unsafe { (*eth).ether_type });
    match ethertype {
        ETH_P_IP => {
            let Some(ip) = frame.ptr_at::<Ipv4Hdr>(ETH_HLEN) else {
                return Verdict::Stack;
            };
            // SAFETY: bounds checked by `ptr_at`; the pointers are to distinct headers.
            let (eth, ip) = unsafe { (&mut *eth, &mut *ip) };
            match local_pod(EndpointKey::v4(ip.dst_addr)) {
                Some(endpoint) if remote_pod_v4(ip.src_addr).is_some() => {
                    deliver_v4(frame, eth, ip, endpoint)
                }
                _ => Verdict::Stack,
            }
        }
        ETH_P_IPV6 => {
            let Some(ip6) = frame.ptr_at::<Ipv6Hdr>(ETH_HLEN) else {
                return Verdict::Stack;
            };
            // SAFETY: as above.
            let (eth, ip6) = unsafe { (&mut *eth, &mut *ip6) };
            match local_pod(EndpointKey::v6(ip6.dst_addr)) {
                Some(endpoint) if remote_pod_v6(ip6.src_addr).is_some() => {
                    deliver_v6(frame, eth, ip6, endpoint)
                }
                _ => Verdict::Stack,
            }
        }
        _ => Verdict::Stack,
    }
}

/// A packet the kernel stack sends into a local pod (TC egress of the pod's host-side veth;
/// only the stack sends there, deliveries go straight to the peer). When it comes from a pod,
/// the pod's reply would otherwise go straight back past the stack: note the flow.
#[inline(always)]
pub fn to_container(frame: &Frame, ifindex: u32) {
    let Some(flow) = flow_of(frame) else {
        return;
    };
    if local_pod(EndpointKey::v6(flow.src)).is_some() || remote_pod(flow.src).is_some() {
        note_stack_flow(&flow, ifindex);
    }
}

/// A packet leaving through the uplink (TC egress). One the stack routed from a local pod to
/// another node's pod (kube-proxy DNATed a Service to it) has a reply that would come back
/// straight into the pod: note the flow. `forwarded` packets are the pod program's own
/// (`FORWARDED_MARK`), whose replies come back straight as they should.
#[inline(always)]
pub fn to_uplink(frame: &Frame, ifindex: u32, forwarded: bool) {
    if forwarded {
        return;
    }
    let Some(flow) = flow_of(frame) else {
        return;
    };
    if local_pod(EndpointKey::v6(flow.src)).is_some() && remote_pod(flow.dst).is_some() {
        note_stack_flow(&flow, ifindex);
    }
}

/// Remembers that the replies of `request` must take the stack (refreshing is not needed: the
/// table forgets least recently used entries first, and a lookup counts as a use).
#[inline(always)]
fn note_stack_flow(request: &FlowKey, egress_ifindex: u32) {
    let reply = request.reversed();
    if POD_STACK_FLOWS.get_ptr(reply).is_none() {
        // A full table evicts its least recently used entry; a failed insert only loses the
        // shortcut protection for this flow, so there is nothing to do about it here.
        let _ = POD_STACK_FLOWS.insert(reply, StackFlow { egress_ifindex }, 0);
    }
}

/// Whether the stack carried this packet's request, so that the packet must take it too.
#[inline(always)]
fn stack_carried(frame: &Frame) -> bool {
    match flow_of(frame) {
        Some(flow) => POD_STACK_FLOWS.get_ptr(flow).is_some(),
        None => false,
    }
}

/// The flow key of an IPv4 or IPv6 packet; `None` for anything else.
#[inline(always)]
fn flow_of(frame: &Frame) -> Option<FlowKey> {
    let eth = frame.ptr_at::<EthHdr>(0)?;
    // SAFETY: `ptr_at` checked that the header lies within the frame.
    let ethertype = u16::from_be(unsafe { (*eth).ether_type });
    let mut flow = FlowKey {
        src: [0; 16],
        dst: [0; 16],
        src_port: [0; 2],
        dst_port: [0; 2],
        proto: 0,
        _pad: [0; 3],
    };
    let ports_at = match ethertype {
        ETH_P_IP => {
            let ip = frame.ptr_at::<Ipv4Hdr>(ETH_HLEN)?;
            // SAFETY: bounds checked by `ptr_at`.
            let ip = unsafe { &*ip };
            flow.src = ipam_common::ipv4_mapped(ip.src_addr);
            flow.dst = ipam_common::ipv4_mapped(ip.dst_addr);
            flow.proto = ip.proto;
            // A fragment (more to come, or not the first) is keyed without ports: only the
            // first carries them.
            let fragmented = u16::from_be_bytes(ip.frags) & 0x3fff != 0;
            let header_len = usize::from(ip.vihl & 0x0f) << 2;
            (!fragmented).then_some(ETH_HLEN + header_len)
        }
        ETH_P_IPV6 => {
            let ip6 = frame.ptr_at::<Ipv6Hdr>(ETH_HLEN)?;
            // SAFETY: bounds checked by `ptr_at`.
            let ip6 = unsafe { &*ip6 };
            flow.src = ip6.src_addr;
            flow.dst = ip6.dst_addr;
            flow.proto = ip6.next_hdr;
            Some(ETH_HLEN + IPV6_HLEN)
        }
        _ => return None,
    };
    if let Some(at) = ports_at
        && matches!(flow.proto, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP)
        && let Some(ports) = frame.ptr_at::<[[u8; 2]; 2]>(at)
    {
        // SAFETY: bounds checked by `ptr_at`.
        let ports = unsafe { &*ports };
        flow.src_port = ports[0];
        flow.dst_port = ports[1];
    }
    Some(flow)
}

#[inline(always)]
fn dropped(stat: PodStat) -> Verdict {
    count_pod(stat);
    Verdict::Drop
}

#[inline(always)]
fn to_stack_unless_local(verdict: Verdict) -> Verdict {
    if let Verdict::Stack = verdict {
        count_pod(PodStat::ToStack);
    }
    verdict
}

/// Is `source` an address of the pod whose host-side veth is `ifindex`?
#[inline(always)]
fn sent_by(source: EndpointKey, ifindex: u32) -> bool {
    match local_pod(source) {
        // SAFETY: the map returned a valid pointer to the value.
        Some(endpoint) => unsafe { (*endpoint).host_ifindex == ifindex },
        None => false,
    }
}

#[inline(always)]
fn local_pod(addr: EndpointKey) -> Option<*const PodEndpoint> {
    POD_ENDPOINTS.get_ptr(addr)
}

/// The route to the node whose block holds `addr` (IPv4-mapped, or IPv6). A pointer into the
/// map, copied only when the packet is forwarded: a copy carried through the branches that do
/// not forward lets the compiler merge paths the verifier then finds uninitialised.
#[inline(always)]
fn remote_pod(addr: [u8; 16]) -> Option<*const RemoteRoute> {
    POD_ROUTES
        .get(&Key::new(128, addr))
        .map(|route| route as *const RemoteRoute)
}

#[inline(always)]
fn remote_pod_v4(addr: [u8; 4]) -> Option<*const RemoteRoute> {
    remote_pod(ipam_common::ipv4_mapped(addr))
}

#[inline(always)]
fn remote_pod_v6(addr: [u8; 16]) -> Option<*const RemoteRoute> {
    remote_pod(addr)
}

/// Straight into the local pod, unless the stack carried the flow's request (then its reply
/// must take the stack too) or the packet's hop limit runs out here.
#[inline(always)]
fn deliver_v4(
    frame: &Frame,
    eth: &mut EthHdr,
    ip: &mut Ipv4Hdr,
    endpoint: *const PodEndpoint,
) -> Verdict {
    // A packet at the end of its life is the kernel's to answer (ICMP time exceeded).
    if ip.ttl <= 1 || stack_carried(frame) {
        return Verdict::Stack;
    }
    let old = u16::from_be_bytes([ip.ttl, ip.proto]);
    ip.ttl -= 1;
    let new = u16::from_be_bytes([ip.ttl, ip.proto]);
    ip.check = checksum_update(u16::from_be_bytes(ip.check), old, new).to_be_bytes();
    // SAFETY: the map returned a valid pointer to the value.
    hand_over(eth, unsafe { &*endpoint })
}

#[inline(always)]
fn deliver_v6(
    frame: &Frame,
    eth: &mut EthHdr,
    ip6: &mut Ipv6Hdr,
    endpoint: *const PodEndpoint,
) -> Verdict {
    if ip6.hop_limit <= 1 || stack_carried(frame) {
        return Verdict::Stack;
    }
    ip6.hop_limit -= 1;
    // SAFETY: the map returned a valid pointer to the value.
    hand_over(eth, unsafe { &*endpoint })
}

/// A packet for a pod of another node: its hop limit counted down, routed to that node, unless
/// the stack carried the flow's request.
#[inline(always)]
fn route_v4(frame: &Frame, ip: &mut Ipv4Hdr, route: *const RemoteRoute) -> Verdict {
    if ip.ttl <= 1 {
        count_route(RouteStat::HopLimitToStack);
        return Verdict::Stack;
    }
    if stack_carried(frame) {
        return Verdict::Stack;
    }
    let old = u16::from_be_bytes([ip.ttl, ip.proto]);
    ip.ttl -= 1;
    let new = u16::from_be_bytes([ip.ttl, ip.proto]);
    ip.check = checksum_update(u16::from_be_bytes(ip.check), old, new).to_be_bytes();
    count_route(RouteStat::Forwarded);
    // SAFETY: the map returned a valid pointer to the value.
    Verdict::Forward {
        route: unsafe { *route },
    }
}

#[inline(always)]
fn route_v6(frame: &Frame, ip6: &mut Ipv6Hdr, route: *const RemoteRoute) -> Verdict {
    if ip6.hop_limit <= 1 {
        count_route(RouteStat::HopLimitToStack);
        return Verdict::Stack;
    }
    if stack_carried(frame) {
        return Verdict::Stack;
    }
    ip6.hop_limit -= 1;
    count_route(RouteStat::Forwarded);
    // SAFETY: the map returned a valid pointer to the value.
    Verdict::Forward {
        route: unsafe { *route },
    }
}

/// Addresses the frame from the pod's gateway to the pod, for redirection into its veth peer.
#[inline(always)]
fn hand_over(eth: &mut EthHdr, endpoint: &PodEndpoint) -> Verdict {
    eth.dst_addr = endpoint.pod_mac;
    eth.src_addr = endpoint.host_mac;
    count_pod(PodStat::Delivered);
    Verdict::Deliver {
        host_ifindex: endpoint.host_ifindex,
    }
}

/// RFC 1624 (eqn. 3): the header checksum after one 16-bit word changed from `old` to `new`.
#[inline(always)]
fn checksum_update(check: u16, old: u16, new: u16) -> u16 {
    let mut sum = u32::from(!check) + u32::from(!old) + u32::from(new);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// fe80::/10 or `::`.
#[inline(always)]
fn is_link_scoped_source(addr: &[u8; 16]) -> bool {
    (addr[0] == 0xfe && addr[1] & 0xc0 == 0x80) || addr.iter().all(|b| *b == 0)
}

/// fe80::/10 or multicast (ff00::/8).
#[inline(always)]
fn is_link_scoped_destination(addr: &[u8; 16]) -> bool {
    (addr[0] == 0xfe && addr[1] & 0xc0 == 0x80) || addr[0] == 0xff
}
