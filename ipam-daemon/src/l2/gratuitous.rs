//! Gratuitous ARP and unsolicited neighbour advertisements, sent when an IP is first announced on
//! an interface so that neighbours update their caches at once instead of after their entries
//! expire (that is what makes a takeover take milliseconds, not minutes).

use std::{
    cell::RefCell,
    collections::{HashMap, hash_map::Entry},
    io,
    net::IpAddr,
};

use crate::net::{
    frames::{ARP_REPLY, ARP_REQUEST, ArpFrame, NdpFrame},
    packet_socket::PacketSocket,
};

/// Announces on `ifindex` that `ip` is at `mac`.
///
/// For IPv4 both gratuitous forms are sent, request then reply: hosts and switches differ in
/// which one they honour (RFC 5227 prefers the request form, some gear only learns from replies).
pub fn announce(ifindex: u32, mac: [u8; 6], ip: IpAddr) -> io::Result<()> {
    match ip {
        IpAddr::V4(v4) => with_sender(ifindex, |socket| {
            for op in [ARP_REQUEST, ARP_REPLY] {
                socket.send(&ArpFrame::gratuitous(mac, v4, op).to_bytes())?;
            }
            Ok(())
        }),
        IpAddr::V6(v6) => with_sender(ifindex, |socket| {
            socket.send(&NdpFrame::unsolicited_advert(mac, v6).to_bytes())
        }),
    }
}

/// Runs `send` on this thread's send-only packet socket for `ifindex`, opened the first time and
/// kept: closing a packet socket waits for an RCU grace period, and a takeover of a hundred IPs
/// with repeated announcements would otherwise spend seconds in it. A socket whose send fails
/// is dropped and opened anew next time (its interface may have gone and come back).
fn with_sender(ifindex: u32, send: impl FnOnce(&PacketSocket) -> io::Result<()>) -> io::Result<()> {
    thread_local! {
        static SENDERS: RefCell<HashMap<u32, PacketSocket>> = RefCell::new(HashMap::new());
    }
    SENDERS.with(|senders| {
        let mut senders = senders.borrow_mut();
        let socket = match senders.entry(ifindex) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(PacketSocket::sender(ifindex)?),
        };
        let sent = send(socket);
        if sent.is_err() {
            senders.remove(&ifindex);
        }
        sent
    })
}
