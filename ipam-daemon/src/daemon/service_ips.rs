//! Service IPs on this node: which of the cluster's LoadBalancer IPs this node answers for.
//!
//! Every agent derives the owner of each IP from the same inputs (services, policies, node
//! records, and the live-node set from the node leases it observes) with rendezvous hashing
//! (`ipam_core::lb::announce`), so a node's death moves its IPs with no per-service write. When
//! this node becomes the owner of an IP it:
//! - makes the IP locally deliverable (an address on `lo`, with `arp_ignore` on the announcing
//!   interfaces so the kernel does not answer ARP for it itself),
//! - hands the (IP, interface) pairs to the main loop, which writes them into the responder
//!   (the first gratuitous announcement goes out then),
//! - sends more gratuitous announcements over the first seconds, so that a lost one does not
//!   strand clients.
//!
//! Fencing: the node counts as alive to itself only while its own lease was renewed within half
//! the lease; the main loop stops the responders' heartbeat at the same moment, so they go silent
//! (after `liveness_timeout`) before any other node may take over (a full lease later).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use ipam_core::{
    lb::{
        announce::{NodeView, owners},
        resources::{L2AnnouncementPolicy, Service},
        rows,
    },
    resources::{NodeIpam, node_lease_name},
    store::lease::{Lease, LeaseObserver},
};
use tokio::sync::Notify;

use crate::{
    cluster::{
        ClusterStore,
        cache::{Cache, watch_until_it_works},
    },
    config::AnnouncementConfig,
    net::iface,
};

/// How often ownership is recomputed (lease lapses change nothing in the store to wake us).
const TICK: Duration = Duration::from_millis(100);
/// Gratuitous announcements after the first (sent when the responder entry is written).
const REANNOUNCE_AFTER: [Duration; 4] = [
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
];

/// When this node last renewed its own lease, shared by the renewal task, this controller and
/// the main loop's heartbeat.
#[derive(Debug, Default)]
pub struct OwnLease {
    renewed: Mutex<Option<Instant>>,
}

impl OwnLease {
    pub fn renewed(&self, at: Instant) {
        *self.renewed.lock().expect("own lease lock") = Some(at);
    }

    /// Renewed within `max_age`.
    pub fn fresh(&self, max_age: Duration) -> bool {
        self.renewed
            .lock()
            .expect("own lease lock")
            .is_some_and(|at| at.elapsed() < max_age)
    }
}

/// The service IPs this node should answer for, for the main loop.
#[derive(Debug, Default)]
pub struct ServiceAnnouncements {
    wanted: Mutex<Vec<AnnouncementConfig>>,
    changed: Notify,
}

impl ServiceAnnouncements {
    pub fn wanted(&self) -> Vec<AnnouncementConfig> {
        self.wanted.lock().expect("announcements lock").clone()
    }

    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

/// Runs the controller for the life of the daemon.
pub async fn run(
    store: ClusterStore,
    node: String,
    node_lease: Duration,
    own: Arc<OwnLease>,
    out: Arc<ServiceAnnouncements>,
    metrics: Arc<crate::metrics::Metrics>,
) {
    let mut services_watch = watch_until_it_works::<Service, _>(&store, "service IPs").await;
    let mut policies_watch =
        watch_until_it_works::<L2AnnouncementPolicy, _>(&store, "service IPs").await;
    let mut nodes_watch = watch_until_it_works::<NodeIpam, _>(&store, "service IPs").await;
    let mut leases_watch = watch_until_it_works::<Lease, _>(&store, "service IPs").await;
    let mut services: Cache<Service> = Cache::new(&services_watch.initial);
    let mut policies: Cache<L2AnnouncementPolicy> = Cache::new(&policies_watch.initial);
    let mut nodes: Cache<NodeIpam> = Cache::new(&nodes_watch.initial);
    let mut leases: Cache<Lease> = Cache::new(&leases_watch.initial);
    let mut observer = LeaseObserver::new();
    let mut state = Owned::default();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Changes only update the copies; ownership is decided once per tick, whatever the
        // number of changes (a burst of service writes would otherwise cost a decision each).
        tokio::select! {
            e = services_watch.next() => { services.apply(e); continue; }
            e = policies_watch.next() => { policies.apply(e); continue; }
            e = nodes_watch.next() => { nodes.apply(e); continue; }
            e = leases_watch.next() => { leases.apply(e); continue; }
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let pass_started = now;
        let live: Vec<NodeView> = nodes
            .iter()
            .filter(|r| {
                let lease = node_lease_name(&r.name);
                observer.observe(&lease, leases.get(&lease).map(|l| &l.revision), now);
                if r.name == node {
                    own.fresh(node_lease / 2)
                } else {
                    leases.get(&lease).is_some() && observer.unchanged_for(&lease, now) < node_lease
                }
            })
            .map(rows::node)
            .collect();
        let mine: BTreeMap<IpAddr, (String, Vec<String>)> = owners(
            &rows::policies(policies.iter()),
            &rows::services(services.iter()),
            &live,
        )
        .into_iter()
        .filter(|a| a.node == node)
        .map(|a| (a.ip, (a.service, a.interfaces)))
        .collect();
        let taken = state.follow(&mine, &out);
        metrics.service_ip_takeovers.inc_by(taken);
        metrics.service_ips_announced.set(state.ips.len() as i64);
        state.reannounce(now);
        if pass_started.elapsed() > Duration::from_millis(20) {
            tracing::debug!(
                took_ms = pass_started.elapsed().as_millis() as u64,
                "slow service IP pass"
            );
        }
    }
}

/// What this node owns now, and the announcements still to repeat.
struct Owned {
    ips: BTreeMap<IpAddr, Vec<String>>,
    /// (when, IP) of gratuitous announcements still to send.
    pending: BTreeSet<(Instant, IpAddr)>,
    arp_ignore_set: BTreeSet<String>,
    /// Adds and removes the service IPs on `lo`, in order, on a thread of its own: an address
    /// change can take the kernel tens of milliseconds, and the runtime has leases to keep.
    addresses: std::sync::mpsc::Sender<(IpAddr, bool)>,
}

impl Default for Owned {
    fn default() -> Self {
        let (addresses, changes) = std::sync::mpsc::channel::<(IpAddr, bool)>();
        let spawned = std::thread::Builder::new()
            .name("service-ips-lo".into())
            .spawn(move || {
                for (ip, present) in changes {
                    local_address(ip, present);
                }
            });
        if let Err(e) = spawned {
            tracing::error!("cannot start the service IP address thread: {e}");
        }
        Self {
            ips: BTreeMap::new(),
            pending: BTreeSet::new(),
            arp_ignore_set: BTreeSet::new(),
            addresses,
        }
    }
}

impl Owned {
    /// Follows what this node owns now; returns how many IPs it took over.
    fn follow(
        &mut self,
        mine: &BTreeMap<IpAddr, (String, Vec<String>)>,
        out: &ServiceAnnouncements,
    ) -> u64 {
        let wanted: BTreeMap<IpAddr, Vec<String>> = mine
            .iter()
            .map(|(ip, (_, interfaces))| (*ip, interfaces.clone()))
            .collect();
        if wanted == self.ips {
            return 0;
        }
        let now = Instant::now();
        let mut taken = 0;
        for (ip, interfaces) in &wanted {
            if self.ips.contains_key(ip) {
                continue;
            }
            for i in interfaces {
                if self.arp_ignore_set.insert(i.clone()) {
                    set_arp_ignore(i);
                }
            }
            let _ = self.addresses.send((*ip, true));
            taken += 1;
            for after in REANNOUNCE_AFTER {
                self.pending.insert((now + after, *ip));
            }
            tracing::info!(%ip, service = mine[ip].0.as_str(), ?interfaces, "service IP taken over: answering for it");
        }
        for ip in self.ips.keys().filter(|ip| !wanted.contains_key(ip)) {
            let _ = self.addresses.send((*ip, false));
            self.pending.retain(|(_, p)| p != ip);
            tracing::info!(%ip, "service IP given up: another node answers for it now");
        }
        self.ips = wanted;
        let pairs = self
            .ips
            .iter()
            .flat_map(|(ip, interfaces)| {
                interfaces.iter().map(|i| AnnouncementConfig {
                    ip: *ip,
                    interface: i.clone(),
                })
            })
            .collect();
        *out.wanted.lock().expect("announcements lock") = pairs;
        out.changed.notify_one();
        taken
    }

    /// Sends the gratuitous announcements that are due.
    fn reannounce(&mut self, now: Instant) {
        while let Some(&(at, ip)) = self.pending.first() {
            if at > now {
                break;
            }
            self.pending.pop_first();
            for interface in self.ips.get(&ip).into_iter().flatten() {
                let sent = iface::index(interface).and_then(|index| {
                    let mac = iface::mac(interface)?;
                    crate::l2::gratuitous::announce(index, mac, ip)
                });
                if let Err(e) = sent {
                    tracing::debug!(%ip, interface = interface.as_str(), "gratuitous announcement not sent: {e}");
                }
            }
        }
    }
}

/// Adds or removes `ip` on `lo`, so the node accepts traffic for it (services listening on it are
/// reached) while only the responder answers ARP/NDP for it.
fn local_address(ip: IpAddr, present: bool) {
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
