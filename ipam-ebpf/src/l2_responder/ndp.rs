//! NDP (RFC 4861): turn a neighbour solicitation for an announced IPv6 address into the
//! solicited neighbour advertisement, in place.
//!
//! Accepted solicitations are the two shapes hosts send: 24 bytes (no option, unicast only) and
//! 32 bytes (one source link-layer address option). The advertisement has the same length (a
//! target link-layer address option replaces the source one), so the frame never changes size.
//! Solicitations with other options (DAD nonces, SEND) are left to the kernel.

use aya_log_ebpf::debug;
use ipam_common::l2::{ResponderKey, ResponderStat};

use super::{Verdict, liveness};
use crate::{
    maps::{L2_RESPONDER, count},
    packet::{ETH_HLEN, EthHdr, Frame, IPV6_HLEN, Ipv6Hdr, is_group_mac},
};

/// An NS or NA message with room for one 8-byte link-layer address option.
#[repr(C)]
struct NdMessage<const LEN: usize> {
    bytes: [u8; LEN],
}

const IPPROTO_ICMPV6: u8 = 58;
const ND_NEIGHBOR_SOLICIT: u8 = 135;
const ND_NEIGHBOR_ADVERT: u8 = 136;
const OPT_SOURCE_LLADDR: u8 = 1;
const OPT_TARGET_LLADDR: u8 = 2;
/// Solicited + Override, Router clear: we own the address and want caches updated.
const NA_FLAGS: u8 = 0x60;

#[inline(always)]
pub fn respond(frame: &mut Frame, eth: *mut EthHdr, ifindex: u32) -> Verdict {
    let Some(ip6) = frame.ptr_at::<Ipv6Hdr>(ETH_HLEN) else {
        return Verdict::Pass;
    };
    // SAFETY: `ptr_at` checked the header lies within the frame.
    let ip6 = unsafe { &mut *ip6 };
    // Not IPv6 despite the ethertype: the kernel drops it, and so must an answer.
    if ip6.vcf[0] >> 4 != 6 {
        count(ResponderStat::Malformed);
        debug!(
            &(),
            "IPv6 ethertype on ifindex {}: IP version is not 6", ifindex
        );
        return Verdict::Pass;
    }
    if ip6.next_hdr != IPPROTO_ICMPV6 {
        return Verdict::Pass;
    }
    let Some(icmp_type) = frame.ptr_at::<u8>(ETH_HLEN + IPV6_HLEN) else {
        return Verdict::Pass;
    };
    // SAFETY: checked by `ptr_at`.
    if unsafe { *icmp_type } != ND_NEIGHBOR_SOLICIT {
        return Verdict::Pass;
    }
    match u16::from_be_bytes(ip6.payload_len) {
        24 => respond_sized::<24>(frame, eth, ip6, ifindex),
        32 => respond_sized::<32>(frame, eth, ip6, ifindex),
        _ => Verdict::Pass,
    }
}

#[inline(always)]
fn respond_sized<const LEN: usize>(
    frame: &mut Frame,
    eth: *mut EthHdr,
    ip6: &mut Ipv6Hdr,
    ifindex: u32,
) -> Verdict {
    let Some(msg) = frame.ptr_at::<NdMessage<LEN>>(ETH_HLEN + IPV6_HLEN) else {
        // The IPv6 payload length promises more bytes than the frame has: truncated.
        count(ResponderStat::Malformed);
        debug!(
            &(),
            "NS on ifindex {}: truncated (payload length {})", ifindex, LEN
        );
        return Verdict::Pass;
    };
    // SAFETY: `ptr_at` checked that the message lies within the frame; `eth` was checked before.
    let (eth, msg) = unsafe { (&mut *eth, &mut (*msg).bytes) };
    let Some(target) = solicited_target::<LEN>(ip6, msg, ifindex) else {
        return Verdict::Pass;
    };
    let key = ResponderKey::v6(target, ifindex);
    let Some(entry) = L2_RESPONDER.get_ptr_mut(key) else {
        return Verdict::Pass;
    };
    // SAFETY: a map value pointer of this CPU's slot, valid for this program run.
    let entry = unsafe { &mut *entry };
    let eth_for_us = if is_group_mac(&eth.dst_addr) {
        eth.dst_addr[0] == 0x33
            && eth.dst_addr[1] == 0x33
            && eth.dst_addr[2..6] == ip6.dst_addr[12..16]
    } else {
        eth.dst_addr == entry.mac
    };
    if !eth_for_us || !liveness::daemon_alive() {
        return Verdict::Pass;
    }
    advertise::<LEN>(eth, ip6, msg, target, entry.mac);
    entry.replies += 1;
    count(ResponderStat::NdpReplies);
    Verdict::Reply
}

/// The target of a valid neighbour solicitation (RFC 4861 7.1.1) addressed to it (its
/// solicited-node group, or itself); `None` for anything else, counted when malformed.
#[inline(always)]
fn solicited_target<const LEN: usize>(
    ip6: &Ipv6Hdr,
    msg: &[u8; LEN],
    ifindex: u32,
) -> Option<[u8; 16]> {
    if ip6.hop_limit != 255 || msg[1] != 0 || !checksum_ok(ip6, msg) {
        count(ResponderStat::Malformed);
        debug!(
            &(),
            "NS on ifindex {}: fails RFC 4861 validity checks (hop limit, code, checksum)", ifindex
        );
        return None;
    }
    // Duplicate address detection: the sender has no address yet and is not asking us.
    if ip6.src_addr == [0; 16] {
        return None;
    }
    let target: [u8; 16] = sub16(msg, 8);
    let multicast_dst = ip6.dst_addr[0] == 0xff;
    if ip6.src_addr[0] == 0xff || target[0] == 0xff {
        count(ResponderStat::Malformed);
        debug!(&(), "NS on ifindex {}: multicast source or target", ifindex);
        return None;
    }
    if LEN == 32 {
        if msg[24] != OPT_SOURCE_LLADDR || msg[25] != 1 {
            return None;
        }
    } else if multicast_dst {
        // A multicast solicitation from a specified source must carry its link-layer address.
        count(ResponderStat::Malformed);
        debug!(
            &(),
            "NS on ifindex {}: multicast without source link-layer address", ifindex
        );
        return None;
    }
    let addressed_to_target = if multicast_dst {
        is_solicited_node(&ip6.dst_addr, &target)
    } else {
        ip6.dst_addr == target
    };
    addressed_to_target.then_some(target)
}

/// Turns the solicitation into the advertisement of `target` at `mac`, in place, back to its
/// sender (with the target link-layer address option when the solicitation had room for it).
#[inline(always)]
fn advertise<const LEN: usize>(
    eth: &mut EthHdr,
    ip6: &mut Ipv6Hdr,
    msg: &mut [u8; LEN],
    target: [u8; 16],
    mac: [u8; 6],
) {
    eth.dst_addr = eth.src_addr;
    eth.src_addr = mac;
    ip6.vcf = [0x60, 0, 0, 0];
    ip6.hop_limit = 255;
    ip6.dst_addr = ip6.src_addr;
    ip6.src_addr = target;
    msg[0] = ND_NEIGHBOR_ADVERT;
    msg[2] = 0;
    msg[3] = 0;
    msg[4] = NA_FLAGS;
    msg[5] = 0;
    msg[6] = 0;
    msg[7] = 0;
    if LEN == 32 {
        msg[24] = OPT_TARGET_LLADDR;
        msg[25] = 1;
        msg[26] = mac[0];
        msg[27] = mac[1];
        msg[28] = mac[2];
        msg[29] = mac[3];
        msg[30] = mac[4];
        msg[31] = mac[5];
    }
    let sum = !fold(icmpv6_sum(ip6, msg));
    let sum = sum.to_be_bytes();
    msg[2] = sum[0];
    msg[3] = sum[1];
}

/// `ff02::1:ffXX:XXXX` formed from the low 24 bits of `target` (RFC 4291 2.7.1).
#[inline(always)]
fn is_solicited_node(dst: &[u8; 16], target: &[u8; 16]) -> bool {
    dst[0] == 0xff
        && dst[1] == 0x02
        && dst[2..11] == [0; 9]
        && dst[11] == 0x01
        && dst[12] == 0xff
        && dst[13..16] == target[13..16]
}

#[inline(always)]
fn sub16<const LEN: usize>(msg: &[u8; LEN], at: usize) -> [u8; 16] {
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = msg[at + i];
        i += 1;
    }
    out
}

#[inline(always)]
fn checksum_ok<const LEN: usize>(ip6: &Ipv6Hdr, msg: &[u8; LEN]) -> bool {
    fold(icmpv6_sum(ip6, msg)) == 0xffff
}

/// One's complement sum (unfolded) over the ICMPv6 pseudo-header and message (RFC 4443 2.3).
#[inline(always)]
fn icmpv6_sum<const LEN: usize>(ip6: &Ipv6Hdr, msg: &[u8; LEN]) -> u32 {
    let mut sum = sum_words(0, &ip6.src_addr);
    sum = sum_words(sum, &ip6.dst_addr);
    sum += LEN as u32 + IPPROTO_ICMPV6 as u32;
    sum_words(sum, msg)
}

#[inline(always)]
fn sum_words<const N: usize>(mut sum: u32, bytes: &[u8; N]) -> u32 {
    let mut i = 0;
    while i + 1 < N {
        sum += u16::from_be_bytes([bytes[i], bytes[i + 1]]) as u32;
        i += 2;
    }
    sum
}

#[inline(always)]
fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}
