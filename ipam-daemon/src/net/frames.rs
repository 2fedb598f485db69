//! ARP and NDP frames: builders for what the daemon, the tests and the benchmarks send, and
//! parsers that check every field of what comes back.

use std::net::{Ipv4Addr, Ipv6Addr};

pub const BROADCAST: [u8; 6] = [0xff; 6];
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ARP_REQUEST: u16 = 1;
pub const ARP_REPLY: u16 = 2;
pub const ICMPV6_NS: u8 = 135;
pub const ICMPV6_NA: u8 = 136;

/// Length of an ARP frame without Ethernet padding.
pub const ARP_FRAME_LEN: usize = 42;

fn eth_header(dst: [u8; 6], src: [u8; 6], ethertype: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(86);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// An ARP packet for IPv4 over Ethernet, with its Ethernet addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpFrame {
    pub eth_dst: [u8; 6],
    pub eth_src: [u8; 6],
    pub op: u16,
    pub sender_mac: [u8; 6],
    pub sender_ip: Ipv4Addr,
    pub target_mac: [u8; 6],
    pub target_ip: Ipv4Addr,
}

impl ArpFrame {
    /// "Who has `target_ip`? Tell `sender_ip`", broadcast.
    pub fn request(sender_mac: [u8; 6], sender_ip: Ipv4Addr, target_ip: Ipv4Addr) -> Self {
        Self {
            eth_dst: BROADCAST,
            eth_src: sender_mac,
            op: ARP_REQUEST,
            sender_mac,
            sender_ip,
            target_mac: [0; 6],
            target_ip,
        }
    }

    /// A gratuitous ARP (sender = target = `ip`), broadcast, in request or reply form: tells
    /// every neighbour that `ip` is now at `mac`.
    ///
    /// The reply form carries `mac` as its target hardware address too, as RFC 5944 (4.6)
    /// asks: Linux takes a reply as gratuitous, and so overrides an entry it confirmed less
    /// than `locktime` (1 s) ago, only when that address equals the sender's; with the
    /// broadcast address there it ignored the reply within that second (the request form it
    /// takes in every state: REACHABLE, STALE, DELAY, PROBE). RFC 5227 has the request form's
    /// target hardware address zero.
    pub fn gratuitous(mac: [u8; 6], ip: Ipv4Addr, op: u16) -> Self {
        Self {
            eth_dst: BROADCAST,
            eth_src: mac,
            op,
            sender_mac: mac,
            sender_ip: ip,
            target_mac: if op == ARP_REPLY { mac } else { [0; 6] },
            target_ip: ip,
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut f = eth_header(self.eth_dst, self.eth_src, ETH_P_ARP);
        f.extend_from_slice(&1u16.to_be_bytes()); // Ethernet
        f.extend_from_slice(&0x0800u16.to_be_bytes()); // IPv4
        f.push(6);
        f.push(4);
        f.extend_from_slice(&self.op.to_be_bytes());
        f.extend_from_slice(&self.sender_mac);
        f.extend_from_slice(&self.sender_ip.octets());
        f.extend_from_slice(&self.target_mac);
        f.extend_from_slice(&self.target_ip.octets());
        f
    }

    /// Parses an Ethernet/IPv4 ARP frame; `None` for anything else.
    pub fn parse(f: &[u8]) -> Option<Self> {
        if f.len() < ARP_FRAME_LEN
            || u16::from_be_bytes([f[12], f[13]]) != ETH_P_ARP
            || f[14..20] != [0, 1, 0x08, 0x00, 6, 4]
        {
            return None;
        }
        let mac = |at: usize| -> [u8; 6] { f[at..at + 6].try_into().expect("6 bytes") };
        let ip = |at: usize| Ipv4Addr::new(f[at], f[at + 1], f[at + 2], f[at + 3]);
        Some(Self {
            eth_dst: mac(0),
            eth_src: mac(6),
            op: u16::from_be_bytes([f[20], f[21]]),
            sender_mac: mac(22),
            sender_ip: ip(28),
            target_mac: mac(32),
            target_ip: ip(38),
        })
    }
}

/// The solicited-node multicast address of `ip` (RFC 4291 2.7.1).
pub fn solicited_node(ip: Ipv6Addr) -> Ipv6Addr {
    let o = ip.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    )
}

/// The Ethernet multicast address an IPv6 multicast address maps to (RFC 2464 7).
pub fn ipv6_multicast_mac(ip: Ipv6Addr) -> [u8; 6] {
    let o = ip.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

/// A neighbour solicitation or advertisement with its Ethernet and IPv6 headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NdpFrame {
    pub eth_dst: [u8; 6],
    pub eth_src: [u8; 6],
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub hop_limit: u8,
    pub icmp_type: u8,
    /// Router, Solicited, Override flags (high bits of the first reserved byte); 0 in an NS.
    pub flags: u8,
    pub target: Ipv6Addr,
    /// The link-layer address option: source (type 1) in an NS, target (type 2) in an NA.
    pub lladdr_option: Option<(u8, [u8; 6])>,
    /// The ICMPv6 checksum as carried in the frame.
    pub checksum: u16,
}

/// Flags of a solicited advertisement for an address we own: Solicited + Override.
pub const NA_SOLICITED_OVERRIDE: u8 = 0x60;
/// Flags of an unsolicited advertisement on takeover: Override.
pub const NA_OVERRIDE: u8 = 0x20;

impl NdpFrame {
    /// A multicast neighbour solicitation for `target`, with the source link-layer option.
    pub fn solicitation(src_mac: [u8; 6], src: Ipv6Addr, target: Ipv6Addr) -> Self {
        let dst = solicited_node(target);
        Self {
            eth_dst: ipv6_multicast_mac(dst),
            eth_src: src_mac,
            src,
            dst,
            hop_limit: 255,
            icmp_type: ICMPV6_NS,
            flags: 0,
            target,
            lladdr_option: Some((1, src_mac)),
            checksum: 0,
        }
    }

    /// An unsolicited advertisement to all nodes: `ip` is now at `mac` (RFC 4861 7.2.6).
    pub fn unsolicited_advert(mac: [u8; 6], ip: Ipv6Addr) -> Self {
        let dst = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
        Self {
            eth_dst: ipv6_multicast_mac(dst),
            eth_src: mac,
            src: ip,
            dst,
            hop_limit: 255,
            icmp_type: ICMPV6_NA,
            flags: NA_OVERRIDE,
            target: ip,
            lladdr_option: Some((2, mac)),
            checksum: 0,
        }
    }

    fn icmp_bytes(&self) -> Vec<u8> {
        let mut m = vec![self.icmp_type, 0, 0, 0, self.flags, 0, 0, 0];
        m.extend_from_slice(&self.target.octets());
        if let Some((kind, mac)) = self.lladdr_option {
            m.push(kind);
            m.push(1);
            m.extend_from_slice(&mac);
        }
        m
    }

    /// Serialises the frame with a correct ICMPv6 checksum (the `checksum` field is ignored).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut msg = self.icmp_bytes();
        let sum = icmpv6_checksum(self.src, self.dst, &msg);
        msg[2..4].copy_from_slice(&sum.to_be_bytes());
        let mut f = eth_header(self.eth_dst, self.eth_src, ETH_P_IPV6);
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        f.push(58);
        f.push(self.hop_limit);
        f.extend_from_slice(&self.src.octets());
        f.extend_from_slice(&self.dst.octets());
        f.extend_from_slice(&msg);
        f
    }

    /// Parses an NS or NA with at most one link-layer option; `None` for anything else.
    pub fn parse(f: &[u8]) -> Option<Self> {
        if f.len() < 14 + 40 + 24
            || u16::from_be_bytes([f[12], f[13]]) != ETH_P_IPV6
            || f[14] >> 4 != 6
            || f[20] != 58
        {
            return None;
        }
        let payload_len = u16::from_be_bytes([f[18], f[19]]) as usize;
        // Only the two shapes read below: anything shorter would index past the message.
        if payload_len != 24 && payload_len != 32 {
            return None;
        }
        let msg = f.get(54..54 + payload_len)?;
        if msg[0] != ICMPV6_NS && msg[0] != ICMPV6_NA {
            return None;
        }
        let v6 = |b: &[u8]| Ipv6Addr::from(<[u8; 16]>::try_from(b).expect("16 bytes"));
        let lladdr_option = match payload_len {
            32 => Some((msg[24], msg[26..32].try_into().expect("6 bytes"))),
            _ => None,
        };
        Some(Self {
            eth_dst: f[0..6].try_into().expect("6 bytes"),
            eth_src: f[6..12].try_into().expect("6 bytes"),
            src: v6(&f[22..38]),
            dst: v6(&f[38..54]),
            hop_limit: f[21],
            icmp_type: msg[0],
            flags: msg[4],
            target: v6(&msg[8..24]),
            lladdr_option,
            checksum: u16::from_be_bytes([msg[2], msg[3]]),
        })
    }

    /// `true` when the carried checksum is the correct one for this frame's contents.
    pub fn checksum_valid(&self) -> bool {
        let mut msg = self.icmp_bytes();
        msg[2..4].copy_from_slice(&self.checksum.to_be_bytes());
        // Summing a message that includes its correct checksum gives 0 after complementing.
        icmpv6_checksum(self.src, self.dst, &msg) == 0
    }
}

/// The ICMPv6 checksum of `msg` (its checksum field zeroed, or not, see `checksum_valid`)
/// between `src` and `dst` (RFC 4443 2.3), computed the plain way as the reference the eBPF
/// code is tested against.
pub fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, msg: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut add = |bytes: &[u8]| {
        for chunk in bytes.chunks(2) {
            let hi = u64::from(chunk[0]);
            let lo = u64::from(chunk.get(1).copied().unwrap_or(0));
            sum += (hi << 8) | lo;
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&(msg.len() as u32).to_be_bytes());
    add(&[0, 0, 0, 58]);
    add(msg);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_solicited_node_group_keeps_the_last_24_bits() {
        let cases = [
            ("2001:db8::1", "ff02::1:ff00:1"),
            ("fd00:10:96::abcd:ef12", "ff02::1:ffcd:ef12"),
            ("fe80::1234:5678:9abc:def0", "ff02::1:ffbc:def0"),
        ];
        for (ip, group) in cases {
            assert_eq!(
                solicited_node(ip.parse().unwrap()),
                group.parse::<Ipv6Addr>().unwrap(),
                "{ip}"
            );
        }
    }

    #[test]
    fn arp_round_trips() {
        let req = ArpFrame::request(
            [2, 0, 0, 0, 0, 1],
            "192.0.2.1".parse().unwrap(),
            "192.0.2.9".parse().unwrap(),
        );
        let bytes = req.to_bytes();
        assert_eq!(bytes.len(), ARP_FRAME_LEN);
        assert_eq!(ArpFrame::parse(&bytes), Some(req));
        assert_eq!(ArpFrame::parse(&bytes[..41]), None);
    }

    #[test]
    fn ndp_round_trips_with_valid_checksum() {
        let ns = NdpFrame::solicitation(
            [2, 0, 0, 0, 0, 1],
            "2001:db8::1".parse().unwrap(),
            "2001:db8::abcd:9".parse().unwrap(),
        );
        let parsed = NdpFrame::parse(&ns.to_bytes()).unwrap();
        assert!(parsed.checksum_valid());
        assert_eq!(parsed.dst, "ff02::1:ffcd:9".parse::<Ipv6Addr>().unwrap());
        assert_eq!(parsed.eth_dst, [0x33, 0x33, 0xff, 0xcd, 0, 9]);
        let mut broken = ns.to_bytes();
        broken[70] ^= 1;
        assert!(!NdpFrame::parse(&broken).unwrap().checksum_valid());
    }

    #[test]
    fn ndp_frames_with_a_payload_length_of_another_shape_are_not_parsed() {
        let ns = NdpFrame::solicitation(
            [2, 0, 0, 0, 0, 1],
            "2001:db8::1".parse().unwrap(),
            "2001:db8::abcd:9".parse().unwrap(),
        )
        .to_bytes();
        // 78 bytes or more with a payload length of 0..24: once a panic at `msg[0]`.
        for payload_len in [0u16, 1, 8, 23, 25, 31, 33, 0xffff] {
            let mut frame = ns.clone();
            frame.resize(frame.len().max(14 + 40 + 24), 0);
            frame[18..20].copy_from_slice(&payload_len.to_be_bytes());
            assert!(
                NdpFrame::parse(&frame).is_none(),
                "payload length {payload_len}"
            );
        }
    }
}
