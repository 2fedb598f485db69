//! The L2 announcement responder: answers "who has IP X?" on an interface for the IPs announced
//! there, passes on to an IP's old owner the segments of connections it still holds for a
//! moment after a move (`handover`), and leaves every other frame to the kernel untouched.
//!
//! Written against a [`Frame`] so the XDP and TC entry points share every line of it.

mod arp;
mod handover;
mod liveness;
mod ndp;

use ipam_common::l2::ResponderKey;

use crate::packet::{ETH_P_ARP, ETH_P_IP, ETH_P_IPV6, EthHdr, Frame};

/// The responder map's key for an IPv4 address (its four wire bytes as a native `u32`), as
/// `ResponderKey::v4` makes it, written as five words. `ResponderKey::v4` zeroes the IPv4-mapped
/// prefix byte-wise: LLVM turns that into a call to a byte-by-byte `memset` subprogram, which
/// cost every ARP request a BPF-to-BPF call and return (`cargo xtask bench arp`).
#[inline(always)]
pub(crate) fn v4_key(addr: u32, ifindex: u32) -> ResponderKey {
    let words: [u32; 5] = [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff]), addr, ifindex];
    // SAFETY: `ResponderKey` is `repr(C)`, 20 bytes, 4-aligned, with no padding and no invalid
    // bit patterns: five `u32`s in memory order are its address bytes, then its ifindex.
    unsafe { core::mem::transmute::<[u32; 5], ResponderKey>(words) }
}

/// Proves the daemon alive: the responder answers until the configured staleness has passed.
#[inline(always)]
pub fn heartbeat() {
    liveness::beat();
}

/// What the entry point must do with the frame.
pub enum Verdict {
    /// Leave the frame to the kernel, unmodified.
    Pass,
    /// The frame was rewritten in place into a reply: send it back out of its ingress interface.
    Reply,
    /// The frame belongs to a connection the IP's old owner holds (`handover`): its Ethernet
    /// header was rewritten for it, send it back out of its ingress interface.
    HandOn,
}

/// Decides on one frame received on `ifindex`, rewriting it into a reply when it asks for an
/// announced IP.
#[inline(always)]
pub fn respond(frame: &mut Frame, ifindex: u32) -> Verdict {
    let Some(eth) = frame.ptr_at::<EthHdr>(0) else {
        return Verdict::Pass;
    };
    // SAFETY: `ptr_at` checked that the header lies within the frame.
    let ethertype = u16::from_be(unsafe { (*eth).ether_type });
    // VLAN-tagged frames (0x8100, 0x88a8) fall through to Pass: announcements are per interface,
    // and a tagged request belongs to the VLAN sub-interface, which has its own attachment.
    match ethertype {
        ETH_P_ARP => arp::respond(frame, ifindex),
        ETH_P_IP => handover::ipv4(frame, eth, ifindex),
        ETH_P_IPV6 => match handover::ipv6(frame, eth, ifindex) {
            Verdict::Pass => ndp::respond(frame, eth, ifindex),
            handed_on => handed_on,
        },
        _ => Verdict::Pass,
    }
}
