//! ARP (RFC 826): turn a request for an announced IPv4 address into the reply, in place.

use aya_log_ebpf::debug;
use ipam_common::l2::{ResponderKey, ResponderStat};

use super::{Verdict, liveness};
use crate::{
    maps::{L2_RESPONDER, count},
    packet::{ETH_HLEN, EthHdr, Frame, is_broadcast_mac, is_group_mac},
};

/// ARP for IPv4 over Ethernet; other hardware/protocol types are not ours to answer.
#[repr(C)]
struct ArpEthIpv4 {
    htype: [u8; 2],
    ptype: [u8; 2],
    hlen: u8,
    plen: u8,
    oper: [u8; 2],
    sha: [u8; 6],
    spa: [u8; 4],
    tha: [u8; 6],
    tpa: [u8; 4],
}

const HTYPE_ETHERNET: u16 = 1;
const PTYPE_IPV4: u16 = 0x0800;
const OP_REQUEST: u16 = 1;
const OP_REPLY: u16 = 2;

#[inline(always)]
pub fn respond(frame: &mut Frame, eth: *mut EthHdr, ifindex: u32) -> Verdict {
    let Some(arp) = frame.ptr_at::<ArpEthIpv4>(ETH_HLEN) else {
        count(ResponderStat::Malformed);
        debug!(
            &(),
            "ARP on ifindex {}: shorter than an Ethernet/IPv4 ARP message", ifindex
        );
        return Verdict::Pass;
    };
    // SAFETY: `ptr_at` checked both headers lie within the frame; the verifier re-checks it.
    let (eth, arp) = unsafe { (&mut *eth, &mut *arp) };

    if u16::from_be_bytes(arp.htype) != HTYPE_ETHERNET
        || u16::from_be_bytes(arp.ptype) != PTYPE_IPV4
        || arp.hlen != 6
        || arp.plen != 4
    {
        count(ResponderStat::Malformed);
        debug!(
            &(),
            "ARP on ifindex {}: not Ethernet/IPv4 address types", ifindex
        );
        return Verdict::Pass;
    }
    if u16::from_be_bytes(arp.oper) != OP_REQUEST {
        return Verdict::Pass;
    }
    // RFC 5227 probes (sender 0.0.0.0) and gratuitous ARP (sender == target) announce the
    // sender's own state; they are not questions to us.
    if arp.spa == [0; 4] || arp.spa == arp.tpa {
        return Verdict::Pass;
    }
    if is_group_mac(&arp.sha) {
        count(ResponderStat::Malformed);
        debug!(
            &(),
            "ARP on ifindex {}: sender hardware address is a group MAC", ifindex
        );
        return Verdict::Pass;
    }

    let key = ResponderKey::v4(arp.tpa, ifindex);
    let Some(entry) = L2_RESPONDER.get_ptr_mut(key) else {
        return Verdict::Pass;
    };
    // SAFETY: a map value pointer of this CPU's slot, valid for this program run.
    let entry = unsafe { &mut *entry };
    // A request unicast to some other station (seen in promiscuous mode) is not for us.
    if !is_broadcast_mac(&eth.dst) && eth.dst != entry.mac {
        return Verdict::Pass;
    }
    if !liveness::daemon_alive() {
        return Verdict::Pass;
    }

    let requester_mac = arp.sha;
    let requester_ip = arp.spa;
    let announced_ip = arp.tpa;
    eth.dst = requester_mac;
    eth.src = entry.mac;
    arp.oper = OP_REPLY.to_be_bytes();
    arp.tha = requester_mac;
    arp.tpa = requester_ip;
    arp.sha = entry.mac;
    arp.spa = announced_ip;

    entry.replies += 1;
    count(ResponderStat::ArpReplies);
    Verdict::Reply
}
