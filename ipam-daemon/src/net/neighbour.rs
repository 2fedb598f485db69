//! Asking a segment who holds an address: ARP requests for IPv4, neighbour solicitations for
//! IPv6, sent on the interface whose subnet holds the address, and any frame back from that
//! address taken as the answer.
//!
//! A host answers these from its kernel whatever its packet filter does to TCP or UDP
//! (iptables and nftables' inet tables never see ARP, and a host that filters its own
//! neighbour discovery cannot be reached at all), and only a host that runs answers them. That
//! makes the silence of a neighbour on its own segment evidence that it is down, where the
//! silence of a port, or an ICMP error, is not: a firewall gives both.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use ipam_netlink::Netlink;

use super::{
    frames::{ARP_REPLY, ARP_REQUEST, ArpFrame, ETH_P_ARP, ETH_P_IPV6, ICMPV6_NA, NdpFrame},
    packet_socket::PacketSocket,
};

/// What asking the segment for an address found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Solicited {
    /// The host holding the address answered from `mac` on `interface`: it runs.
    Answered { interface: String, mac: [u8; 6] },
    /// The address is on `interface`'s segment and nothing answered `attempts` requests sent
    /// within `waited`.
    Unanswered {
        interface: String,
        attempts: u32,
        waited: Duration,
    },
    /// Nothing can be told: the address is on no segment of this host (it is reached through
    /// a router, which answers for it whether the host runs or not), or the requests could
    /// not be sent. The reason says which.
    CannotTell(String),
}

/// Asks the segment holding `ip` for it, `attempts` times spread evenly over `timeout`, and
/// returns at the first answer or once `timeout` has passed. Blocking: run it off the async
/// runtime.
pub fn solicit(ip: IpAddr, attempts: u32, timeout: Duration) -> Solicited {
    let segment = match segment_of(ip) {
        Ok(Some(segment)) => segment,
        Ok(None) => {
            return Solicited::CannotTell(format!(
                "{ip} is on no segment of this node (no address of an interface that is up \
                 has a subnet holding it): a router answers for it whether its host runs or not"
            ));
        }
        Err(e) => return Solicited::CannotTell(format!("cannot find the segment of {ip}: {e}")),
    };
    match ask(&segment, ip, attempts.max(1), timeout) {
        Ok(Some(mac)) => Solicited::Answered {
            interface: segment.name,
            mac,
        },
        Ok(None) => Solicited::Unanswered {
            interface: segment.name,
            attempts: attempts.max(1),
            waited: timeout,
        },
        Err(e) => Solicited::CannotTell(format!("cannot ask for {ip} on {}: {e}", segment.name)),
    }
}

/// An interface of this host whose subnet holds the address asked for, with this host's
/// address on it (the requests' sender).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Segment {
    index: u32,
    name: String,
    mac: [u8; 6],
    local: IpAddr,
}

fn segment_of(ip: IpAddr) -> Result<Option<Segment>, ipam_netlink::NetlinkError> {
    let netlink = Netlink::open()?;
    let mut best: Option<(u8, Segment)> = None;
    for link in netlink.links()? {
        // Loopback's MAC is all zeros, and nothing on it is a neighbour.
        if !link.up || link.mac == [0; 6] {
            continue;
        }
        let addresses = netlink.addresses(link.index)?;
        let Some((local, prefix)) = sender_for(ip, &addresses) else {
            continue;
        };
        // The longest prefix wins, as the kernel's connected routes choose (a /24 on a
        // bridge over a /16 on the uplink holding it).
        if best.as_ref().is_none_or(|(longest, _)| prefix > *longest) {
            let segment = Segment {
                index: link.index,
                name: link.name,
                mac: link.mac,
                local,
            };
            best = Some((prefix, segment));
        }
    }
    Ok(best.map(|(_, segment)| segment))
}

/// This interface's address to ask for `ip` from, and the length of the longest of its
/// subnets that holds `ip`, if one does: for IPv6 its link-local address where it has one
/// (what neighbour discovery sends from), else the matching one.
fn sender_for(ip: IpAddr, addresses: &[(IpAddr, u8)]) -> Option<(IpAddr, u8)> {
    let &(matching, prefix) = addresses
        .iter()
        .filter(|&&(local, prefix)| local != ip && same_subnet(local, ip, prefix))
        .max_by_key(|&&(_, prefix)| prefix)?;
    let link_local = addresses.iter().find_map(|&(local, _)| match local {
        IpAddr::V6(v6) if ip.is_ipv6() && v6.is_unicast_link_local() => Some(local),
        _ => None,
    });
    Some((link_local.unwrap_or(matching), prefix))
}

/// `true` when `a` and `b` share their first `prefix` bits, a prefix that leaves room for a
/// neighbour (a /32 or /128 holds only the host itself).
fn same_subnet(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) if prefix < 32 => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) if prefix < 128 => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

/// Sends the requests and waits for the answer: the MAC of the first frame from `ip`.
fn ask(
    segment: &Segment,
    ip: IpAddr,
    attempts: u32,
    timeout: Duration,
) -> std::io::Result<Option<[u8; 6]>> {
    let (ethertype, request) = match (ip, segment.local) {
        (IpAddr::V4(target), IpAddr::V4(local)) => (ETH_P_ARP, arp_request(segment, local, target)),
        (IpAddr::V6(target), IpAddr::V6(local)) => (
            ETH_P_IPV6,
            NdpFrame::solicitation(segment.mac, local, target).to_bytes(),
        ),
        _ => unreachable!("sender_for picks an address of the target's family"),
    };
    // Bound before the first request goes out, so that no answer comes before the socket;
    // filtered so that a busy segment (every IPv6 frame of the link reaches an ETH_P_IPV6
    // socket) or an ARP storm cannot fill its buffer and crowd the answer out.
    let socket = PacketSocket::bind(segment.index, ethertype)?;
    socket.filter(&answer_filter(ip))?;
    socket.drops()?;
    let started = Instant::now();
    let mut buf = [0u8; 1514];
    for k in 0..attempts {
        socket.send(&request)?;
        let next = started + timeout * (k + 1) / attempts;
        loop {
            let left = next.saturating_duration_since(Instant::now());
            let Some(n) = socket.recv(&mut buf, left)? else {
                break;
            };
            if let Some(mac) = answer_from(ip, segment.mac, &buf[..n]) {
                return Ok(Some(mac));
            }
        }
    }
    // An answer may have been among frames the socket dropped: that silence proves nothing.
    match socket.drops()? {
        0 => Ok(None),
        dropped => Err(std::io::Error::other(format!(
            "the probe's socket dropped {dropped} frames, an answer among them maybe"
        ))),
    }
}

/// A classic BPF program that keeps the frames that may answer for `ip`: ARP frames whose
/// sender is `ip`; ICMPv6 neighbour advertisements for `ip` right after the IPv6 header. An
/// advertisement behind extension headers is refused: Linux, BSD and Windows send none, but a
/// stack that did would look silent (fail open) to this probe. `answer_from` checks the rest.
fn answer_filter(ip: IpAddr) -> Vec<libc::sock_filter> {
    const LD_W: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const LD_B: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    let op = |code, k| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    // Loads at `offset` and compares with `value`, on to the next pair if equal.
    let checks: Vec<(u16, u32, u32)> = match ip {
        // The ARP sender's protocol address: Ethernet 14 + ARP header 8 + sender MAC 6.
        IpAddr::V4(v4) => vec![(LD_W, 28, u32::from(v4))],
        IpAddr::V6(v6) => {
            // Next header (IPv6 byte 6), ICMPv6 type (after the 40-byte header), target.
            let mut checks = vec![(LD_B, 20, 58), (LD_B, 54, u32::from(ICMPV6_NA))];
            for (i, word) in v6.octets().chunks(4).enumerate() {
                let word = u32::from_be_bytes(word.try_into().expect("4 bytes"));
                checks.push((LD_W, 62 + 4 * i as u32, word));
            }
            checks
        }
    };
    let mut program = Vec::new();
    let pairs = checks.len();
    for (i, (load, offset, value)) in checks.into_iter().enumerate() {
        program.push(op(load, offset));
        // On a mismatch, jump over the remaining pairs and the accept to the refusal.
        let to_refusal = u8::try_from(2 * (pairs - i - 1) + 1).expect("a short program");
        program.push(libc::sock_filter {
            code: JEQ,
            jt: 0,
            jf: to_refusal,
            k: value,
        });
    }
    program.push(op(RET, u32::from(u16::MAX)));
    program.push(op(RET, 0));
    program
}

fn arp_request(segment: &Segment, local: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    ArpFrame::request(segment.mac, local, target).to_bytes()
}

/// The sender's MAC when `frame` shows the host holding `ip` running: an ARP reply or request
/// it sent (it may be asking for this node while this node asks for it), or a neighbour
/// advertisement for `ip`. Frames from this interface's own MAC never count.
fn answer_from(ip: IpAddr, own_mac: [u8; 6], frame: &[u8]) -> Option<[u8; 6]> {
    match ip {
        IpAddr::V4(ip) => {
            let arp = ArpFrame::parse(frame)?;
            (matches!(arp.op, ARP_REPLY | ARP_REQUEST)
                && arp.sender_ip == ip
                && arp.sender_mac != own_mac)
                .then_some(arp.sender_mac)
        }
        IpAddr::V6(ip) => {
            let ndp = NdpFrame::parse(frame)?;
            (ndp.icmp_type == ICMPV6_NA
                && ndp.target == ip
                && ndp.eth_src != own_mac
                && ndp.checksum_valid())
            .then_some(ndp.eth_src)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn only_an_address_of_a_shared_subnet_is_on_a_segment() {
        let addresses = [(ip("10.1.0.2"), 24), (ip("192.0.2.7"), 32)];
        assert_eq!(
            sender_for(ip("10.1.0.9"), &addresses),
            Some((ip("10.1.0.2"), 24))
        );
        // The longest subnet that holds it.
        let nested = [(ip("10.0.0.1"), 16), (ip("10.0.1.1"), 24)];
        assert_eq!(
            sender_for(ip("10.0.1.9"), &nested),
            Some((ip("10.0.1.1"), 24))
        );
        // Reached through a router: no segment, nothing to tell.
        assert_eq!(sender_for(ip("10.2.0.9"), &addresses), None);
        // A /32 holds only the host itself.
        assert_eq!(sender_for(ip("192.0.2.8"), &addresses), None);
        // The node's own address is no neighbour.
        assert_eq!(sender_for(ip("10.1.0.2"), &[(ip("10.1.0.2"), 32)]), None);
    }

    #[test]
    fn ipv6_asks_from_the_link_local_address() {
        let addresses = [(ip("fd00::2"), 64), (ip("fe80::1"), 64)];
        assert_eq!(
            sender_for(ip("fd00::9"), &addresses),
            Some((ip("fe80::1"), 64))
        );
        assert_eq!(sender_for(ip("fd01::9"), &addresses), None);
    }

    /// The filter's jumps land where they should: each mismatch on the refusal, the last
    /// match on the acceptance.
    #[test]
    fn the_answer_filter_refuses_at_the_first_mismatch() {
        for target in [ip("10.1.0.9"), ip("fd00::9")] {
            let program = answer_filter(target);
            let refusal = program.len() - 1;
            assert_eq!(program[refusal].k, 0);
            assert_eq!(program[refusal - 1].k, u32::from(u16::MAX));
            for (pc, insn) in program.iter().enumerate().filter(|(_, i)| i.jf != 0) {
                assert_eq!(pc + 1 + usize::from(insn.jf), refusal, "{target} at {pc}");
            }
        }
    }

    #[test]
    fn only_a_frame_from_the_address_asked_for_is_an_answer() {
        let ours = [2, 0, 0, 0, 0, 1];
        let theirs = [2, 0, 0, 0, 0, 2];
        let peer: Ipv4Addr = "10.1.0.9".parse().unwrap();
        let node: Ipv4Addr = "10.1.0.2".parse().unwrap();
        let mut reply = ArpFrame::request(theirs, peer, node);
        reply.op = ARP_REPLY;
        let answer = |frame: ArpFrame| answer_from(IpAddr::V4(peer), ours, &frame.to_bytes());
        assert_eq!(answer(reply), Some(theirs));
        // Its own request for this node counts too.
        assert_eq!(answer(ArpFrame::request(theirs, peer, node)), Some(theirs));
        // Another host's request for it, or this node's own, does not.
        let other = ArpFrame::request(theirs, "10.1.0.8".parse().unwrap(), peer);
        assert_eq!(answer(other), None);
        assert_eq!(answer(ArpFrame::request(ours, peer, peer)), None);
    }
}
