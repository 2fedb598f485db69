//! Gratuitous ARP and unsolicited neighbour advertisements, sent when an IP is first announced on
//! an interface so that neighbours update their caches at once instead of after their entries
//! expire (that is what makes a takeover take milliseconds, not minutes).

use std::{io, net::IpAddr};

use crate::net::{
    frames::{ARP_REPLY, ARP_REQUEST, ArpFrame, ETH_P_ARP, ETH_P_IPV6, NdpFrame},
    packet_socket::PacketSocket,
};

/// Announces on `ifindex` that `ip` is at `mac`.
///
/// For IPv4 both gratuitous forms are sent, request then reply: hosts and switches differ in
/// which one they honour (RFC 5227 prefers the request form, some gear only learns from replies).
pub fn announce(ifindex: u32, mac: [u8; 6], ip: IpAddr) -> io::Result<()> {
    match ip {
        IpAddr::V4(v4) => {
            let socket = PacketSocket::bind(ifindex, ETH_P_ARP)?;
            for op in [ARP_REQUEST, ARP_REPLY] {
                socket.send(&ArpFrame::gratuitous(mac, v4, op).to_bytes())?;
            }
        }
        IpAddr::V6(v6) => {
            let socket = PacketSocket::bind(ifindex, ETH_P_IPV6)?;
            socket.send(&NdpFrame::unsolicited_advert(mac, v6).to_bytes())?;
        }
    }
    Ok(())
}
