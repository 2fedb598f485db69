//! Gratuitous ARP and unsolicited neighbour advertisements, sent when an IP is first announced on
//! an interface so that neighbours update their caches at once instead of after their entries
//! expire (that is what makes a takeover take milliseconds, not minutes). One goes out when an
//! IP starts being answered, and a few more over the next seconds so that a lost frame does not
//! strand clients; `Repeats` keeps that schedule. Nothing else in the daemon sends them.

use std::{
    cell::RefCell,
    collections::{BTreeSet, HashMap, hash_map::Entry},
    io,
    net::IpAddr,
    time::Duration,
};

use tokio::time::Instant;

use super::announcer::Answered;

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

/// Announcements after the first, counted from it.
const REPEAT_AFTER: [Duration; 4] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

/// The announcements still to repeat: (when, IP, ifindex, MAC).
#[derive(Debug, Default)]
pub struct Repeats {
    pending: BTreeSet<(Instant, IpAddr, u32, [u8; 6])>,
}

impl Repeats {
    /// Tells the link at once that `answered` is here, and schedules the repeats.
    pub fn start(&mut self, answered: &Answered) {
        send_logged(answered.ifindex, answered.mac, answered.ip);
        let now = Instant::now();
        for after in REPEAT_AFTER {
            self.pending
                .insert((now + after, answered.ip, answered.ifindex, answered.mac));
        }
    }

    /// Drops the repeats of an IP no longer answered on `ifindex`.
    pub fn stop(&mut self, ip: IpAddr, ifindex: u32) {
        self.pending.retain(|&(_, p, i, _)| (p, i) != (ip, ifindex));
    }

    /// When the next repeat is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.pending.first().map(|&(at, ..)| at)
    }

    /// Sends the repeats that are due.
    pub fn send_due(&mut self) {
        let now = Instant::now();
        while let Some(&(at, ip, ifindex, mac)) = self.pending.first() {
            if at > now {
                break;
            }
            self.pending.pop_first();
            send_logged(ifindex, mac, ip);
        }
    }
}

/// Sends one announcement; a failure is not fatal (neighbours still learn the address from the
/// first reply), so it is only logged.
fn send_logged(ifindex: u32, mac: [u8; 6], ip: IpAddr) {
    if let Err(e) = announce(ifindex, mac, ip) {
        tracing::debug!(%ip, ifindex, "gratuitous announcement not sent: {e}");
    }
}
