//! Asking "who has IP X?" on a link, as a neighbour would, and reading the answer.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use ipam_daemon::net::{
    frames::{ARP_REPLY, ArpFrame, ETH_P_ARP, ETH_P_IPV6, ICMPV6_NA, NdpFrame},
    packet_socket::PacketSocket,
};
use ipam_netlink::iface;

/// A neighbour on one interface of the current thread's namespace.
pub struct Resolver {
    socket_arp: PacketSocket,
    socket_nd: PacketSocket,
    mac: [u8; 6],
}

impl Resolver {
    pub fn new(dev: &str) -> Self {
        let ifindex = iface::index(dev).expect("resolver interface");
        Self {
            socket_arp: PacketSocket::bind(ifindex, ETH_P_ARP).expect("ARP socket"),
            socket_nd: PacketSocket::bind(ifindex, ETH_P_IPV6).expect("IPv6 socket"),
            mac: iface::mac(dev).expect("resolver MAC"),
        }
    }

    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Sends an ARP request for `target` carrying an 802.1Q tag with `vid`, as a host on that
    /// VLAN behind this interface would. Built by hand on the raw socket: the tag goes between
    /// the MAC addresses and the ARP ethertype.
    pub fn send_tagged_arp(&self, sender: Ipv4Addr, target: Ipv4Addr, vid: u16) {
        let untagged = ArpFrame::request(self.mac, sender, target).to_bytes();
        let mut frame = untagged[..12].to_vec();
        frame.extend_from_slice(&0x8100u16.to_be_bytes());
        frame.extend_from_slice(&(vid & 0x0fff).to_be_bytes());
        frame.extend_from_slice(&untagged[12..]);
        self.socket_arp
            .send(&frame)
            .expect("send tagged ARP request");
    }

    /// Sends an ARP request for `target` and returns the first reply from it within `timeout`.
    pub fn arp(&self, sender: Ipv4Addr, target: Ipv4Addr, timeout: Duration) -> Option<ArpFrame> {
        self.socket_arp
            .send(&ArpFrame::request(self.mac, sender, target).to_bytes())
            .expect("send ARP request");
        // A reply to this request, not a gratuitous announcement (those are addressed to the
        // announced IP itself).
        self.next_arp(timeout, |f| {
            f.op == ARP_REPLY && f.sender_ip == target && f.target_ip == sender
        })
    }

    /// Sends an ARP request for `target` and returns the MAC of every reply to it within
    /// `window` (a second answer would be a second node claiming the IP).
    pub fn arp_all(&self, sender: Ipv4Addr, target: Ipv4Addr, window: Duration) -> Vec<[u8; 6]> {
        self.socket_arp
            .send(&ArpFrame::request(self.mac, sender, target).to_bytes())
            .expect("send ARP request");
        let deadline = Instant::now() + window;
        let mut macs = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if let Some(f) = self.next_arp(left, |f| {
                f.op == ARP_REPLY && f.sender_ip == target && f.target_mac == self.mac
            }) {
                macs.push(f.sender_mac);
            }
        }
        macs
    }

    /// Waits for an ARP frame matching `want`.
    pub fn next_arp(
        &self,
        timeout: Duration,
        want: impl Fn(&ArpFrame) -> bool,
    ) -> Option<ArpFrame> {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 2048];
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let n = self.socket_arp.recv(&mut buf, left).expect("recv")?;
            if let Some(f) = ArpFrame::parse(&buf[..n])
                && want(&f)
            {
                return Some(f);
            }
        }
    }

    /// Sends a multicast neighbour solicitation for `target` and returns the advertisement.
    pub fn ndp(&self, src: Ipv6Addr, target: Ipv6Addr, timeout: Duration) -> Option<NdpFrame> {
        self.solicit(src, target);
        self.next_advertisement(src, target, timeout)
    }

    /// Sends a neighbour solicitation for `target` and returns the link-layer address of every
    /// advertisement answering it within `window` (a second would be a second node claiming
    /// the IP).
    pub fn ndp_all(&self, src: Ipv6Addr, target: Ipv6Addr, window: Duration) -> Vec<[u8; 6]> {
        self.solicit(src, target);
        let deadline = Instant::now() + window;
        let mut macs = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if let Some(f) = self.next_advertisement(src, target, left) {
                macs.push(f.lladdr_option.map_or(f.eth_src, |(_, mac)| mac));
            }
        }
        macs
    }

    fn solicit(&self, src: Ipv6Addr, target: Ipv6Addr) {
        self.socket_nd
            .send(&NdpFrame::solicitation(self.mac, src, target).to_bytes())
            .expect("send NS");
    }

    /// Waits for the advertisement of `target` answering a solicitation from `src`.
    fn next_advertisement(
        &self,
        src: Ipv6Addr,
        target: Ipv6Addr,
        timeout: Duration,
    ) -> Option<NdpFrame> {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 2048];
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let n = self.socket_nd.recv(&mut buf, left).expect("recv")?;
            if let Some(f) = NdpFrame::parse(&buf[..n])
                && f.icmp_type == ICMPV6_NA
                && f.target == target
                // Addressed to this solicitation, not an unsolicited advertisement to all nodes.
                && f.dst == src
            {
                return Some(f);
            }
        }
    }
}
