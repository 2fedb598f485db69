//! The pod datapath: what happens to a packet a pod sends, and to a packet for a pod that comes
//! in from the uplink.
//!
//! - A packet for a pod of this node is handed straight to that pod (`bpf_redirect_peer` into
//!   its veth peer), skipping the host's routing, neighbour and qdisc layers.
//! - A packet for a pod of another node (a block in the route map) is routed out of the uplink
//!   towards that node with `bpf_redirect_neigh`: the kernel resolves the next hop's MAC, and
//!   the host's routing table is not consulted.
//! - Everything else goes to the kernel stack (host addresses, the outside).
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
use ipam_common::pod::{EndpointKey, PodEndpoint, PodStat, RemoteRoute, RouteStat};

use crate::{
    maps::{POD_ENDPOINTS, POD_ROUTES, count_pod, count_route},
    packet::{ETH_HLEN, ETH_P_ARP, ETH_P_IP, ETH_P_IPV6, EthHdr, Frame, Ipv4Hdr, Ipv6Hdr},
};

/// Longest prefix of a packet the datapath reads: Ethernet + IPv6 header.
pub const HEADROOM: u32 = (ETH_HLEN + crate::packet::IPV6_HLEN) as u32;

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
            to_stack_unless_local(match deliver_v4(eth, ip) {
                Verdict::Stack => route_v4(ip),
                delivered => delivered,
            })
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
            to_stack_unless_local(match deliver_v6(eth, ip6) {
                Verdict::Stack => route_v6(ip6),
                delivered => delivered,
            })
        }
        ETH_P_ARP => {
            count_pod(PodStat::ToStack);
            Verdict::Stack
        }
        _ => dropped(PodStat::UnsupportedDropped),
    }
}

/// A frame that came in on the node's uplink: delivered directly when it is for a local pod.
#[inline(always)]
pub fn from_uplink(frame: &mut Frame) -> Verdict {
    let Some(eth) = frame.ptr_at::<EthHdr>(0) else {
        return Verdict::Stack;
    };
    // SAFETY: `ptr_at` checked that the header lies within the frame.
    let ethertype = u16::from_be(unsafe { (*eth).ether_type });
    match ethertype {
        ETH_P_IP => match frame.ptr_at::<Ipv4Hdr>(ETH_HLEN) {
            // SAFETY: bounds checked by `ptr_at`.
            Some(ip) => deliver_v4(unsafe { &mut *eth }, unsafe { &mut *ip }),
            None => Verdict::Stack,
        },
        ETH_P_IPV6 => match frame.ptr_at::<Ipv6Hdr>(ETH_HLEN) {
            // SAFETY: bounds checked by `ptr_at`.
            Some(ip6) => deliver_v6(unsafe { &mut *eth }, unsafe { &mut *ip6 }),
            None => Verdict::Stack,
        },
        _ => Verdict::Stack,
    }
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
    match POD_ENDPOINTS.get_ptr(source) {
        // SAFETY: the map returned a valid pointer to the value.
        Some(endpoint) => unsafe { (*endpoint).host_ifindex == ifindex },
        None => false,
    }
}

#[inline(always)]
fn deliver_v4(eth: &mut EthHdr, ip: &mut Ipv4Hdr) -> Verdict {
    let Some(endpoint) = POD_ENDPOINTS.get_ptr(EndpointKey::v4(ip.dst_addr)) else {
        return Verdict::Stack;
    };
    // A packet at the end of its life is the kernel's to answer (ICMP time exceeded).
    if ip.ttl <= 1 {
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
fn deliver_v6(eth: &mut EthHdr, ip6: &mut Ipv6Hdr) -> Verdict {
    let Some(endpoint) = POD_ENDPOINTS.get_ptr(EndpointKey::v6(ip6.dst_addr)) else {
        return Verdict::Stack;
    };
    if ip6.hop_limit <= 1 {
        return Verdict::Stack;
    }
    ip6.hop_limit -= 1;
    // SAFETY: the map returned a valid pointer to the value.
    hand_over(eth, unsafe { &*endpoint })
}

/// A packet for a pod of another node: its hop limit counted down, routed to that node.
#[inline(always)]
fn route_v4(ip: &mut Ipv4Hdr) -> Verdict {
    let key = Key::new(128, ipam_common::ipv4_mapped(ip.dst_addr));
    let Some(route) = POD_ROUTES.get(&key) else {
        return Verdict::Stack;
    };
    if ip.ttl <= 1 {
        count_route(RouteStat::HopLimitToStack);
        return Verdict::Stack;
    }
    let old = u16::from_be_bytes([ip.ttl, ip.proto]);
    ip.ttl -= 1;
    let new = u16::from_be_bytes([ip.ttl, ip.proto]);
    ip.check = checksum_update(u16::from_be_bytes(ip.check), old, new).to_be_bytes();
    count_route(RouteStat::Forwarded);
    Verdict::Forward { route: *route }
}

#[inline(always)]
fn route_v6(ip6: &mut Ipv6Hdr) -> Verdict {
    let key = Key::new(128, ip6.dst_addr);
    let Some(route) = POD_ROUTES.get(&key) else {
        return Verdict::Stack;
    };
    if ip6.hop_limit <= 1 {
        count_route(RouteStat::HopLimitToStack);
        return Verdict::Stack;
    }
    ip6.hop_limit -= 1;
    count_route(RouteStat::Forwarded);
    Verdict::Forward { route: *route }
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
