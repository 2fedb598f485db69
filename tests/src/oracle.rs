//! Replies judged by an independent packet library (etherparse), not by the frame code that the
//! daemon and the tests share: a mistake made twice by one hand would otherwise pass unseen.

use etherparse::{
    ArpOperation, ArpPacketSlice, EtherType, Ethernet2HeaderSlice, Icmpv6Slice, Icmpv6Type,
    IpNumber, Ipv6HeaderSlice,
};

/// Checks that `reply` answers the ARP `request` for `our_mac`, as RFC 826 says: to the asker,
/// from us, operation reply, our MAC for the address asked for, the asker's addresses as target.
/// "The asker" is the request's sender hardware address, which is where Linux sends its replies
/// too, even when the frame's Ethernet source differs (a proxy or a bridge in between).
pub fn check_arp_reply(request: &[u8], reply: &[u8], our_mac: [u8; 6]) -> Result<(), String> {
    let (_, req) = arp(request).map_err(|e| format!("request: {e}"))?;
    let (eth, arp) = arp(reply).map_err(|e| format!("reply: {e}"))?;
    let want = |ok: bool, what: &str| if ok { Ok(()) } else { Err(what.to_owned()) };
    want(
        eth.destination()[..] == *req.sender_hw_addr(),
        "not sent to the asker's hardware address",
    )?;
    want(eth.source() == our_mac, "not sent from the announcing MAC")?;
    want(
        arp.operation() == ArpOperation::REPLY,
        "operation is not reply",
    )?;
    want(
        arp.hw_addr_type() == req.hw_addr_type() && arp.proto_addr_type() == req.proto_addr_type(),
        "address types differ from the request's",
    )?;
    want(arp.sender_hw_addr() == our_mac, "sender MAC is not ours")?;
    want(
        arp.sender_protocol_addr() == req.target_protocol_addr(),
        "sender IP is not the address asked for",
    )?;
    want(
        arp.target_hw_addr() == req.sender_hw_addr()
            && arp.target_protocol_addr() == req.sender_protocol_addr(),
        "target is not the asker",
    )
}

fn arp(frame: &[u8]) -> Result<(Ethernet2HeaderSlice<'_>, ArpPacketSlice<'_>), String> {
    let eth = Ethernet2HeaderSlice::from_slice(frame).map_err(|e| e.to_string())?;
    if eth.ether_type() != EtherType::ARP {
        return Err(format!("ethertype {:?} is not ARP", eth.ether_type()));
    }
    let arp = ArpPacketSlice::from_slice(&frame[eth.slice().len()..]).map_err(|e| e.to_string())?;
    Ok((eth, arp))
}

/// Checks that `reply` is the neighbour advertisement RFC 4861 asks for in answer to the
/// solicitation `request`: from us to the asker, hop limit 255, a valid ICMPv6 checksum,
/// solicited and override set, the target asked for, and our MAC as target link-layer address.
pub fn check_neighbour_advertisement(
    request: &[u8],
    reply: &[u8],
    our_mac: [u8; 6],
) -> Result<(), String> {
    let (req_eth, req_ip, req_icmp) = icmpv6(request).map_err(|e| format!("request: {e}"))?;
    let (eth, ip, icmp) = icmpv6(reply).map_err(|e| format!("reply: {e}"))?;
    let want = |ok: bool, what: &str| if ok { Ok(()) } else { Err(what.to_owned()) };
    want(
        eth.destination() == req_eth.source() && eth.source() == our_mac,
        "Ethernet addresses are not us -> asker",
    )?;
    let Icmpv6Type::NeighborSolicitation = req_icmp.icmp_type() else {
        return Err("the request is not a neighbour solicitation".into());
    };
    let asked_for: [u8; 16] = req_icmp
        .payload()
        .get(..16)
        .and_then(|t| t.try_into().ok())
        .ok_or("solicitation without a target")?;
    want(ip.destination() == req_ip.source(), "not sent to the asker")?;
    want(
        ip.source() == asked_for,
        "not sent from the address asked for",
    )?;
    want(ip.hop_limit() == 255, "hop limit is not 255")?;
    want(
        icmp.is_checksum_valid(ip.source(), ip.destination()),
        "ICMPv6 checksum does not verify",
    )?;
    let Icmpv6Type::NeighborAdvertisement(flags) = icmp.icmp_type() else {
        return Err(format!(
            "ICMPv6 type {:?} is not an advertisement",
            icmp.icmp_type()
        ));
    };
    want(
        flags.solicited && flags.r#override && !flags.router,
        "flags are not solicited+override",
    )?;
    let payload = icmp.payload();
    want(payload.get(..16) == Some(&asked_for[..]), "target differs")?;
    // Option 2 (target link-layer address), length 1 (8 bytes): our MAC.
    want(
        payload.get(16..18) == Some(&[2, 1][..]) && payload.get(18..24) == Some(&our_mac[..]),
        "no target link-layer address option with our MAC",
    )
}

type Icmpv6Frame<'a> = (
    Ethernet2HeaderSlice<'a>,
    Ipv6HeaderSlice<'a>,
    Icmpv6Slice<'a>,
);

fn icmpv6(frame: &[u8]) -> Result<Icmpv6Frame<'_>, String> {
    let eth = Ethernet2HeaderSlice::from_slice(frame).map_err(|e| e.to_string())?;
    if eth.ether_type() != EtherType::IPV6 {
        return Err(format!("ethertype {:?} is not IPv6", eth.ether_type()));
    }
    let rest = &frame[eth.slice().len()..];
    let ip = Ipv6HeaderSlice::from_slice(rest).map_err(|e| e.to_string())?;
    if ip.next_header() != IpNumber::IPV6_ICMP {
        return Err("not ICMPv6 (or behind extension headers)".into());
    }
    let end = (ip.slice().len() + usize::from(ip.payload_length())).min(rest.len());
    let icmp = Icmpv6Slice::from_slice(&rest[ip.slice().len()..end]).map_err(|e| e.to_string())?;
    Ok((eth, ip, icmp))
}
