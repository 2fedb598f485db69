//! Making a service IP locally deliverable: an address on `lo`, so the node accepts traffic for
//! it (services listening on it are reached), while only the responder answers ARP/NDP for it
//! (`arp_ignore` on the announcing interfaces).
//!
//! Both announcers put their IPs here, and one IP can be theirs together (a Service selected by
//! an L2AnnouncementPolicy and a BGPAdvertisement): the address stays while either holds it, so
//! one path letting go never takes it from under the other.
//!
//! Changes are made in order on a thread of their own: an address change can take the kernel
//! tens of milliseconds, and the runtime has leases to keep.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc},
};

use crate::net::iface;

/// Who holds a service IP on `lo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Holder {
    /// The L2 announcer, for an IP this node answers ARP/NDP for.
    L2,
    /// The BGP announcer, for an IP this node advertises.
    Bgp,
}

/// The service IPs on `lo`, shared by the announcers (clones are one set).
#[derive(Clone)]
pub struct LocalAddresses {
    shared: Arc<Mutex<Shared>>,
}

struct Shared {
    changes: mpsc::Sender<(IpAddr, bool)>,
    holders: Holders,
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
            shared: Arc::new(Mutex::new(Shared {
                changes,
                holders: Holders::default(),
                arp_ignore_set: BTreeSet::new(),
            })),
        }
    }

    /// The set; a panic elsewhere while holding it leaves it whole (each change is one step).
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `holder` takes `ip`: on `lo` unless already there for the other announcer, after making
    /// the kernel leave ARP for it on `interfaces` to the responder.
    pub fn add(&self, holder: Holder, ip: IpAddr, interfaces: &[String]) {
        let mut shared = self.lock();
        for i in interfaces {
            if shared.arp_ignore_set.insert(i.clone()) {
                set_arp_ignore(i);
            }
        }
        if shared.holders.take(holder, ip) {
            let _ = shared.changes.send((ip, true));
        }
    }

    /// `holder` lets `ip` go: off `lo` unless the other announcer still holds it.
    pub fn remove(&self, holder: Holder, ip: IpAddr) {
        let mut shared = self.lock();
        if shared.holders.release(holder, ip) {
            let _ = shared.changes.send((ip, false));
        }
        if let Some(others) = shared.holders.of(ip) {
            tracing::debug!(%ip, ?holder, ?others, "service IP kept on lo for the other announcer");
        }
    }
}

/// Who holds each IP.
#[derive(Debug, Default)]
struct Holders(BTreeMap<IpAddr, BTreeSet<Holder>>);

impl Holders {
    /// Whether `ip` was held by no one before (so it must be put on `lo`).
    fn take(&mut self, holder: Holder, ip: IpAddr) -> bool {
        let holders = self.0.entry(ip).or_default();
        let first = holders.is_empty();
        holders.insert(holder);
        first
    }

    /// Whether `holder` was the last to hold `ip` (so it must come off `lo`).
    fn release(&mut self, holder: Holder, ip: IpAddr) -> bool {
        let Some(holders) = self.0.get_mut(&ip) else {
            return false;
        };
        if !holders.remove(&holder) {
            return false;
        }
        if holders.is_empty() {
            self.0.remove(&ip);
            return true;
        }
        false
    }

    fn of(&self, ip: IpAddr) -> Option<&BTreeSet<Holder>> {
        self.0.get(&ip)
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

#[cfg(test)]
mod tests {
    use super::{Holder, Holders};

    #[test]
    fn an_ip_held_by_both_announcers_stays_until_both_let_go() {
        let ip = "198.51.100.7".parse().unwrap();
        let mut holders = Holders::default();
        assert!(
            holders.take(Holder::L2, ip),
            "the first holder puts it on lo"
        );
        assert!(!holders.take(Holder::Bgp, ip), "already there");
        assert!(!holders.take(Holder::Bgp, ip), "taking twice counts once");
        assert!(!holders.release(Holder::Bgp, ip), "L2 still answers for it");
        assert!(
            !holders.release(Holder::Bgp, ip),
            "released twice: no change"
        );
        assert!(
            holders.release(Holder::L2, ip),
            "the last holder takes it off"
        );
        assert!(
            !holders.release(Holder::L2, ip),
            "an IP nobody holds is left alone"
        );
        assert!(holders.take(Holder::Bgp, ip), "and can be taken again");
    }
}
