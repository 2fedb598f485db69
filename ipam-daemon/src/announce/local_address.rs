//! Making a service IP locally deliverable: an address on `lo`, so the node accepts traffic for
//! it (services listening on it are reached), while only the responder answers ARP/NDP for it
//! (`arp_ignore` on the announcing interfaces).
//!
//! Changes are made in order on a thread of their own: an address change can take the kernel
//! tens of milliseconds, and the runtime has leases to keep.

use std::{collections::BTreeSet, net::IpAddr, sync::mpsc};

use crate::net::iface;

/// Adds and removes service IPs on `lo`.
pub struct LocalAddresses {
    changes: mpsc::Sender<(IpAddr, bool)>,
    arp_ignore_set: BTreeSet<String>,
}

impl LocalAddresses {
    pub fn start() -> Self {
        let (changes, queue) = mpsc::channel::<(IpAddr, bool)>();
        let spawned = std::thread::Builder::new()
            .name("service-ips-lo".into())
            .spawn(move || {
                for (ip, present) in queue {
                    set_on_lo(ip, present);
                }
            });
        if let Err(e) = spawned {
            tracing::error!("cannot start the service IP address thread: {e}");
        }
        Self {
            changes,
            arp_ignore_set: BTreeSet::new(),
        }
    }

    /// Puts `ip` on `lo`, after making the kernel leave ARP for it on `interfaces` to the
    /// responder.
    pub fn add(&mut self, ip: IpAddr, interfaces: &[String]) {
        for i in interfaces {
            if self.arp_ignore_set.insert(i.clone()) {
                set_arp_ignore(i);
            }
        }
        let _ = self.changes.send((ip, true));
    }

    pub fn remove(&mut self, ip: IpAddr) {
        let _ = self.changes.send((ip, false));
    }
}

fn set_on_lo(ip: IpAddr, present: bool) {
    let prefix = if ip.is_ipv4() { 32 } else { 128 };
    let done = ipam_netlink::Netlink::open().and_then(|nl| {
        let lo = iface::index("lo").map_err(|e| ipam_netlink::NetlinkError {
            what: "cannot find lo".into(),
            source: e,
        })?;
        if present {
            nl.add_address(lo, ip, prefix)
        } else {
            nl.delete_address(lo, ip, prefix)
        }
    });
    if let Err(e) = done {
        tracing::warn!(%ip, "cannot {} the service IP on lo: {e}", if present { "add" } else { "remove" });
    }
}

/// The kernel answers ARP for any local address on any interface by default; with
/// `arp_ignore = 1` it answers only for addresses of the interface asked on, so the service IPs on
/// `lo` are answered by the responder alone.
fn set_arp_ignore(interface: &str) {
    let path = format!("/proc/sys/net/ipv4/conf/{interface}/arp_ignore");
    if let Err(e) = std::fs::write(&path, "1") {
        tracing::warn!(
            interface,
            "cannot set {path}: {e}; the kernel may answer ARP for service IPs too"
        );
    }
}
