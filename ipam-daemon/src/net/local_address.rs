//! Making a service IP locally deliverable: an address on `lo`, so the node accepts traffic for
//! it (services listening on it are reached), while only the responder answers ARP/NDP for it.
//!
//! By default the kernel answers ARP for any local address on any interface (`arp_ignore = 0`):
//! with a Service IP on `lo`, every node holding it (every node advertising it over BGP, say)
//! would answer for it on the segment. So the first IP put on `lo` sets
//! `net.ipv4.conf.all.arp_ignore = 1` (answer only for the asking interface's own addresses)
//! and `arp_announce = 2` (never name a non-interface address as an ARP request's sender),
//! as kube-proxy's strictARP does; `all` counts for every interface, also those made later.
//! `[node.announce] strict_arp = false` leaves the sysctls alone. IPv6 needs nothing: the
//! kernel answers neighbour solicitations only for addresses of the interface asked on.
//!
//! Both announcers put their IPs here, and one IP can be theirs together (a Service selected by
//! an L2AnnouncementPolicy and a BGPAdvertisement): the address stays while either holds it, so
//! one path letting go never takes it from under the other.
//!
//! Changes are made in order on a thread of their own: an address change can take the kernel
//! tens of milliseconds, and the runtime has leases to keep. [`LocalAddresses::applied`] waits
//! for the changes asked so far, for an announcer that must not draw traffic to an address
//! before the node accepts it.
//!
//! What is on `lo` outlives the agent: a restart leaves it on purpose (the responders and the
//! routers keep sending the traffic), a kill or a stop within an IP's linger by accident. So
//! the address thread records the IPs it put there in a file of the node's directory, and the
//! next agent takes those that no announcer took up off `lo` once every announcer that runs has
//! decided once (`expect`, `decided`, `expected_all`): IPs of Services deleted, or moved
//! elsewhere, while no agent ran. Addresses the agent did not put there (a host owner's, the
//! static `[[announcement]]`s') are never in the file, and never touched.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc},
};

use ipam_netlink::iface;

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

/// What the address thread is asked to do, in order.
enum Change {
    /// Put `ip` on `lo` (`present`) or take it off.
    Set { ip: IpAddr, present: bool },
    /// Say that every change asked before this one is done.
    Applied(tokio::sync::oneshot::Sender<()>),
}

struct Shared {
    changes: mpsc::Sender<Change>,
    holders: Holders,
    /// Whether to set the strict-ARP sysctls, and whether that was done.
    strict_arp: bool,
    strict_arp_set: bool,
    /// The IPs an agent before this one put on `lo`, until they are swept.
    left: BTreeSet<IpAddr>,
    /// The announcers that run and have not decided yet.
    undecided: BTreeSet<Holder>,
    /// Whether every announcer that runs was named (`expected_all`): until then an empty
    /// `undecided` does not mean they all decided.
    all_named: bool,
}

/// Where the IPs this agent put on `lo` are recorded for the next one, in the node's private
/// directory (`NodeSettings::private_file`), beside the restart promise.
pub const RECORD_FILE: &str = "service-ips-on-lo";

impl LocalAddresses {
    /// The set, empty; with `strict_arp` the first IP added sets the strict-ARP sysctls. The
    /// IPs put on `lo` are recorded in `record` (`RECORD_FILE`), and those an agent before
    /// left there are read from it, to be swept.
    pub fn start(strict_arp: bool, record: PathBuf) -> Self {
        let left = read_record(&record);
        if !left.is_empty() {
            tracing::info!(
                ips = left.len(),
                file = %record.display(),
                "Service IPs an agent before this one left on lo: those no announcer takes up \
                 again come off once every announcer has decided"
            );
        }
        let (changes, queue) = mpsc::channel::<Change>();
        let on_lo = left.clone();
        let spawned = std::thread::Builder::new()
            .name("service-ips-lo".into())
            .spawn(move || apply_changes(&queue, on_lo, &record));
        if let Err(e) = spawned {
            tracing::error!("cannot start the service IP address thread: {e}");
        }
        Self {
            shared: Arc::new(Mutex::new(Shared {
                changes,
                holders: Holders::default(),
                strict_arp,
                strict_arp_set: false,
                left,
                undecided: BTreeSet::new(),
                all_named: false,
            })),
        }
    }

    /// `holder` runs on this node: the IPs left on `lo` wait for its first decision.
    pub fn expect(&self, holder: Holder) {
        self.lock().undecided.insert(holder);
    }

    /// Every announcer that runs was named (`expect`): with none, the IPs left go at once.
    pub fn expected_all(&self) {
        let mut shared = self.lock();
        shared.all_named = true;
        Self::sweep_when_decided(&mut shared);
    }

    /// `holder` has made its first decision (later calls change nothing).
    pub fn decided(&self, holder: Holder) {
        let mut shared = self.lock();
        if shared.undecided.remove(&holder) {
            Self::sweep_when_decided(&mut shared);
        }
    }

    /// Once every announcer has decided: the IPs left on `lo` that none holds come off.
    fn sweep_when_decided(shared: &mut Shared) {
        if !shared.all_named || !shared.undecided.is_empty() || shared.left.is_empty() {
            return;
        }
        let left = std::mem::take(&mut shared.left);
        let swept: Vec<IpAddr> = left
            .into_iter()
            .filter(|ip| shared.holders.of(*ip).is_none())
            .collect();
        if swept.is_empty() {
            return;
        }
        tracing::info!(
            ips = ?swept,
            "taking Service IPs off lo that an agent before this one left there and no \
             announcer holds now"
        );
        for ip in swept {
            let _ = shared.changes.send(Change::Set { ip, present: false });
        }
    }

    /// The set; a panic elsewhere while holding it leaves it whole (each change is one step).
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `holder` takes `ip`: on `lo` unless already there for the other announcer, after making
    /// the kernel leave ARP for it to the responder.
    pub fn add(&self, holder: Holder, ip: IpAddr) {
        let mut shared = self.lock();
        Self::strict(&mut shared);
        if shared.holders.take(holder, ip) {
            let _ = shared.changes.send(Change::Set { ip, present: true });
        }
    }

    /// Returns once every change asked so far is made (or failed and was logged): an address
    /// added before this call is on `lo` when it returns. Returns at once if the address thread
    /// could not be started (said at start).
    pub async fn applied(&self) {
        let (done, applied) = tokio::sync::oneshot::channel();
        let sent = self.lock().changes.send(Change::Applied(done));
        if sent.is_ok() {
            let _ = applied.await;
        }
    }

    /// Sets the strict-ARP sysctls now (when configured to), for IPs this node answers for that
    /// reach `lo` by other ways: the configuration's static `[[announcement]]`s, whose address
    /// the host's owner puts there.
    pub fn ensure_strict_arp(&self) {
        Self::strict(&mut self.lock());
    }

    fn strict(shared: &mut Shared) {
        if shared.strict_arp && !shared.strict_arp_set {
            set_strict_arp();
            shared.strict_arp_set = true;
        }
    }

    /// `holder` lets `ip` go: off `lo` unless the other announcer still holds it.
    pub fn remove(&self, holder: Holder, ip: IpAddr) {
        let mut shared = self.lock();
        if shared.holders.release(holder, ip) {
            let _ = shared.changes.send(Change::Set { ip, present: false });
        }
        if let Some(others) = shared.holders.of(ip) {
            tracing::debug!(%ip, ?holder, ?others, "service IP kept on lo for the other announcer");
        }
    }
}

/// One announcer's share of the set: the IPs it holds, brought in line with what it wants.
pub struct HeldBy {
    addresses: LocalAddresses,
    holder: Holder,
    held: BTreeSet<IpAddr>,
}

impl HeldBy {
    pub fn new(addresses: LocalAddresses, holder: Holder) -> Self {
        Self {
            addresses,
            holder,
            held: BTreeSet::new(),
        }
    }

    /// Puts on `lo` those of `wanted` not held yet, and returns once they are there.
    pub async fn take(&mut self, wanted: &BTreeSet<IpAddr>) {
        if !self.queue(wanted).is_empty() {
            self.applied().await;
        }
    }

    /// Asks for those of `wanted` not held yet on `lo`, and returns them; `applied` says when
    /// they are there.
    pub fn queue(&mut self, wanted: &BTreeSet<IpAddr>) -> BTreeSet<IpAddr> {
        let new: BTreeSet<IpAddr> = wanted.difference(&self.held).copied().collect();
        for &ip in &new {
            self.addresses.add(self.holder, ip);
            self.held.insert(ip);
        }
        new
    }

    /// Returns once every change asked so far is made (`LocalAddresses::applied`).
    pub async fn applied(&self) {
        self.addresses.applied().await;
    }

    /// Lets go of the IPs held that `wanted` does not have (off `lo` unless the other
    /// announcer holds them).
    pub fn keep_only(&mut self, wanted: &BTreeSet<IpAddr>) {
        for ip in self.held.difference(wanted) {
            self.addresses.remove(self.holder, *ip);
        }
        self.held.retain(|ip| wanted.contains(ip));
    }

    /// This announcer has made its first decision (`LocalAddresses::decided`).
    pub fn decided(&self) {
        self.addresses.decided(self.holder);
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

/// The address thread: applies the changes in order, and after each burst records what is on
/// `lo` in `record`.
fn apply_changes(queue: &mpsc::Receiver<Change>, mut on_lo: BTreeSet<IpAddr>, record: &Path) {
    let mut recorded = on_lo.clone();
    while let Ok(first) = queue.recv() {
        let mut next = Some(first);
        while let Some(change) = next {
            match change {
                Change::Set { ip, present } => {
                    // A removal that failed stays recorded: the next agent tries again.
                    if set_on_lo(ip, present) {
                        if present {
                            on_lo.insert(ip);
                        } else {
                            on_lo.remove(&ip);
                        }
                    }
                }
                Change::Applied(done) => {
                    let _ = done.send(());
                }
            }
            next = queue.try_recv().ok();
        }
        if on_lo != recorded {
            write_record(record, &on_lo);
            recorded.clone_from(&on_lo);
        }
    }
}

/// The IPs recorded in `record`; none when it is missing or unreadable (said: the IPs left on
/// `lo` then stay there).
fn read_record(record: &Path) -> BTreeSet<IpAddr> {
    let text = match std::fs::read_to_string(record) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return BTreeSet::new(),
        Err(e) => {
            tracing::warn!(
                file = %record.display(),
                "cannot read which Service IPs the agent before put on lo ({e}): any it left \
                 there stay; remove them with `ip address del <ip>/32 dev lo`"
            );
            return BTreeSet::new();
        }
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| match l.trim().parse() {
            Ok(ip) => Some(ip),
            Err(_) => {
                tracing::warn!(
                    file = %record.display(),
                    line = l,
                    "not an IP address in the record of Service IPs on lo: line ignored"
                );
                None
            }
        })
        .collect()
}

/// Records `on_lo` in `record`, whole or not at all (written beside it, then renamed).
fn write_record(record: &Path, on_lo: &BTreeSet<IpAddr>) {
    let text: String = on_lo.iter().map(|ip| format!("{ip}\n")).collect();
    let partial = record.with_extension("partial");
    let written = std::fs::write(&partial, text).and_then(|()| std::fs::rename(&partial, record));
    if let Err(e) = written {
        tracing::warn!(
            file = %record.display(),
            "cannot record the Service IPs on lo ({e}): after a crash the next agent cannot \
             take off those no longer wanted"
        );
    }
}

/// Whether the change was made (a failure is logged).
fn set_on_lo(ip: IpAddr, present: bool) -> bool {
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
    if let Err(e) = &done {
        tracing::warn!(%ip, "cannot {} the service IP on lo: {e}", if present { "add" } else { "remove" });
    }
    done.is_ok()
}

/// Raises `net.ipv4.conf.all.arp_ignore` to 1 and `arp_announce` to 2 where they are lower
/// (a higher value set by the host's owner is stricter still, and kept).
fn set_strict_arp() {
    for (name, wanted) in [("arp_ignore", 1), ("arp_announce", 2)] {
        let path = format!("/proc/sys/net/ipv4/conf/all/{name}");
        let current: Option<u8> = std::fs::read_to_string(&path)
            .ok()
            .and_then(|v| v.trim().parse().ok());
        if current.is_some_and(|c| c >= wanted) {
            continue;
        }
        match std::fs::write(&path, wanted.to_string()) {
            Ok(()) => tracing::info!(
                "set net.ipv4.conf.all.{name} = {wanted} (was {current:?}): Service IPs on lo \
                 are answered by the responder alone ([node.announce] strict_arp)"
            ),
            Err(e) => tracing::warn!(
                "cannot set {path} to {wanted}: {e}; the kernel may answer ARP for Service IPs \
                 on every node that holds them. Set it yourself, or give the agent write access \
                 to /proc/sys/net"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::{Holder, Holders, read_record, write_record};

    #[test]
    fn the_record_of_ips_on_lo_reads_back_whole_and_skips_what_is_not_an_ip() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("service-ips-on-lo");
        assert!(read_record(&record).is_empty(), "no record: nothing left");
        let on_lo: BTreeSet<_> = ["198.51.100.7", "2001:db8::7"]
            .iter()
            .map(|ip| ip.parse().unwrap())
            .collect();
        write_record(&record, &on_lo);
        assert_eq!(read_record(&record), on_lo);
        assert!(!record.with_extension("partial").exists());
        std::fs::write(&record, "198.51.100.8\nnot an address\n\n").unwrap();
        assert_eq!(
            read_record(&record),
            BTreeSet::from(["198.51.100.8".parse().unwrap()])
        );
    }

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
