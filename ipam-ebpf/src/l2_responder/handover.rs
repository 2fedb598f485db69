//! Connections open at a move between live nodes. The node an IP moved from keeps it on `lo`
//! for a while (the daemon's `l2::owners::LINGER`) and still holds the connections clients
//! opened with it; a client that follows the new owner's gratuitous ARP in the middle of one
//! sends its next segments here, where the kernel knows no such connection and would reset it.
//! For as long as the daemon says (`L2_HANDOVER`), segments of connections not opened here go
//! on to the old owner instead, on the same segment, rewritten only in their Ethernet header.
//! A connection is this node's when its SYN came here while this node answered for the IP or
//! was handed it (`L2_HANDOVER_FLOWS`, least recently used forgotten first): so an IP that
//! moves away and back within the old owner's linger keeps the connections opened on either
//! side. Everything else (UDP, ICMP, fragments) stays here, as before.

use aya_ebpf::helpers::bpf_ktime_get_ns;
use ipam_common::{ipv4_mapped, l2::ResponderKey, pod::FlowKey};

use super::Verdict;
use crate::{
    maps::{L2_HANDOVER, L2_HANDOVER_FLOWS, L2_HANDOVER_GATE, L2_RESPONDER},
    packet::{ETH_HLEN, EthHdr, Frame, IPV6_HLEN, Ipv4Hdr, Ipv6Hdr, is_group_mac},
};

const IPPROTO_TCP: u8 = 6;
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

/// The first 14 bytes of a TCP header: ports, sequence numbers, data offset and flags.
#[repr(C)]
struct TcpStart {
    ports: [[u8; 2]; 2],
    seq: [u8; 4],
    ack: [u8; 4],
    offset: u8,
    flags: u8,
}
const _: () = assert!(core::mem::size_of::<TcpStart>() == 14);

/// An IPv4 frame: passed on to the old owner if it belongs to a connection opened there.
#[inline(always)]
pub fn ipv4(frame: &mut Frame, eth: *mut EthHdr, ifindex: u32) -> Verdict {
    let Some(ip) = frame.ptr_at::<Ipv4Hdr>(ETH_HLEN) else {
        return Verdict::Pass;
    };
    // SAFETY: `ptr_at` checked that the header lies within the frame.
    let ip = unsafe { &*ip };
    // Fragments stay: only the first carries the ports.
    if ip.proto != IPPROTO_TCP || u16::from_be_bytes(ip.frags) & 0x3fff != 0 {
        return Verdict::Pass;
    }
    let key = super::v4_key(u32::from_ne_bytes(ip.dst_addr), ifindex);
    let header_len = usize::from(ip.vihl & 0x0f) << 2;
    hand_on(
        frame,
        eth,
        key,
        ipv4_mapped(ip.src_addr),
        ETH_HLEN + header_len,
    )
}

/// An IPv6 frame whose next header is TCP (no extension headers): as [`ipv4`].
#[inline(always)]
pub fn ipv6(frame: &mut Frame, eth: *mut EthHdr, ifindex: u32) -> Verdict {
    let Some(ip6) = frame.ptr_at::<Ipv6Hdr>(ETH_HLEN) else {
        return Verdict::Pass;
    };
    // SAFETY: `ptr_at` checked that the header lies within the frame.
    let ip6 = unsafe { &*ip6 };
    if ip6.next_hdr != IPPROTO_TCP {
        return Verdict::Pass;
    }
    let key = ResponderKey::v6(ip6.dst_addr, ifindex);
    hand_on(frame, eth, key, ip6.src_addr, ETH_HLEN + IPV6_HLEN)
}

/// The connection a segment from `src` to `key`'s IP belongs to.
#[inline(always)]
fn flow(src: [u8; 16], key: &ResponderKey, tcp: &TcpStart) -> FlowKey {
    FlowKey {
        src,
        dst: key.addr,
        src_port: tcp.ports[0],
        dst_port: tcp.ports[1],
        proto: IPPROTO_TCP,
        _pad: [0; 3],
    }
}

#[inline(always)]
fn hand_on(
    frame: &mut Frame,
    eth: *mut EthHdr,
    key: ResponderKey,
    src: [u8; 16],
    tcp_at: usize,
) -> Verdict {
    let Some(tcp) = frame.ptr_at::<TcpStart>(tcp_at) else {
        return Verdict::Pass;
    };
    // SAFETY: `ptr_at` checked that the header lies within the frame.
    let tcp = unsafe { &*tcp };
    let handing_over = handovers_may_run();
    if tcp.flags & (TCP_SYN | TCP_ACK) == TCP_SYN {
        let flow = flow(src, &key, tcp);
        // A connection opened with this node: it stays here. A full table forgets the
        // least recently used, so the insert cannot fail for room.
        if L2_RESPONDER.get_ptr(key).is_some()
            || (handing_over && L2_HANDOVER.get_ptr(key).is_some())
        {
            let _ = L2_HANDOVER_FLOWS.insert(flow, 1u8, 0);
        }
        return Verdict::Pass;
    }
    // At rest every other segment costs the gate's read alone.
    if !handing_over {
        return Verdict::Pass;
    }
    // SAFETY: the value is copied out at once.
    let Some(handover) = (unsafe { L2_HANDOVER.get(key) }).copied() else {
        return Verdict::Pass;
    };
    // Only while this node answers for the IP there: a node that gave it up (or never took
    // it) passes nothing on, so two nodes can never pass a frame back and forth.
    // SAFETY: plain helper call.
    if unsafe { bpf_ktime_get_ns() } >= handover.until_ns || L2_RESPONDER.get_ptr(key).is_none() {
        return Verdict::Pass;
    }
    // SAFETY: only whether it is there is read.
    if unsafe { L2_HANDOVER_FLOWS.get(flow(src, &key, tcp)) }.is_some() {
        return Verdict::Pass;
    }
    // SAFETY: the caller's header pointer, checked by `ptr_at`.
    let eth = unsafe { &mut *eth };
    // Never back to where it came from, and only frames sent to this node.
    if eth.src_addr == handover.mac || is_group_mac(&eth.dst_addr) {
        return Verdict::Pass;
    }
    eth.src_addr = eth.dst_addr;
    eth.dst_addr = handover.mac;
    Verdict::HandOn
}

/// Whether a hand-over may run (`L2_HANDOVER_GATE`): a read of an array's one element, which
/// the JIT inlines, where a hash lookup of the segment's IP costs tens of nanoseconds.
#[inline(always)]
fn handovers_may_run() -> bool {
    L2_HANDOVER_GATE.get(0).is_some_and(|open| *open != 0)
}
