//! The BGP announcer: follows the peers, advertisements, pools, Services and endpoints in the
//! store, decides what this node advertises (`ipam_core::lb::bgp::node_advertisements`),
//! keeps BIRD configured with it, puts the advertised IPs on `lo`, and reports each session's
//! state in metrics, in the peer's status and in the daemon's health.
//!
//! A sibling of the L2 announcer: it reads the same Services, writes nothing they own, and
//! needs no liveness of the other nodes (a session's loss is the router's to see).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
    time::Duration,
};

use ipam_config::{BgpSettings, OnStop};
use ipam_core::{
    backoff::Backoff,
    lb::{
        bgp::{
            self as decision, BgpAdvertisement, BgpPeer, BgpPeerSpec, BgpSessionStatus,
            NodeAdvertisements, node_advertisements,
        },
        resources::{LbIpPool, Namespace, Service, ServiceEndpoints},
        rows,
    },
    resources::NodeIpam,
};
use tokio::sync::oneshot;
use tracing::Instrument as _;

use super::{
    bird::{Bird, BirdError},
    bird_config,
    passwords::Passwords,
    sessions::Session,
    status::Reports,
};
use crate::{
    cluster::{
        ClusterStore,
        copies::{Copy, Moment, Wake},
    },
    metrics::{Health, Metrics},
    net::local_address::{HeldBy, Holder, LocalAddresses},
};

/// Changes are gathered this long before BIRD is reconfigured: a burst of Service writes
/// costs one reconfiguration, not one each.
const SETTLE: Duration = Duration::from_millis(100);

/// What the announcer reads.
pub struct Inputs {
    pub store: ClusterStore,
    pub node: String,
    /// The node's addresses between nodes, for the default router ID.
    pub addresses: Vec<IpAddr>,
    pub settings: BgpSettings,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    /// The service IPs on `lo`, shared with the L2 announcer.
    pub local_addresses: LocalAddresses,
}

/// A stop's request: what it means, and where to say it is done.
type StopRequest = (OnStop, oneshot::Sender<()>);

/// The running announcer; `stop` ends it as the stop means (`OnStop`).
pub struct BgpAnnouncer {
    stop: oneshot::Sender<StopRequest>,
}

impl BgpAnnouncer {
    pub fn spawn(inputs: Inputs) -> Self {
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(run(inputs, stopped));
        Self { stop }
    }

    /// Stops BIRD and waits for it: for a leave with a Cease (the routers withdraw this node's
    /// routes at once) and the Service IPs off `lo`; for a restart without one (routers with
    /// graceful restart keep the routes) and the IPs left on `lo` for the traffic they bring.
    pub async fn stop(self, on_stop: OnStop) {
        let (done, wait) = oneshot::channel();
        if self.stop.send((on_stop, done)).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(6), wait).await;
        }
    }
}

/// The copies the decision is made from (`cluster::copies`: shared with the other controllers
/// that read the same kinds).
struct Seen {
    peers: Copy<BgpPeer>,
    advertisements: Copy<BgpAdvertisement>,
    pools: Copy<LbIpPool>,
    services: Copy<Service>,
    /// The namespaces' labels, which pools admit external IPs by.
    namespaces: Copy<Namespace>,
    endpoints: Copy<ServiceEndpoints>,
    nodes: Copy<NodeIpam>,
}

impl Seen {
    /// The copies of the kinds the announcer reads, `wake` woken when any changes.
    async fn follow(store: &ClusterStore, wake: &Wake) -> Self {
        const FOR: &str = "BGP";
        Self {
            peers: store.follow(wake, FOR).await,
            advertisements: store.follow(wake, FOR).await,
            pools: store.follow(wake, FOR).await,
            services: store.follow(wake, FOR).await,
            namespaces: store.follow(wake, FOR).await,
            endpoints: store.follow(wake, FOR).await,
            nodes: store.follow(wake, FOR).await,
        }
    }

    /// What `node` advertises, from the copies at `at`; and the node's addresses in its
    /// record (for the router ID).
    fn decide(&self, node: &str, at: &Moment) -> (NodeAdvertisements, Vec<IpAddr>) {
        let nodes = self.nodes.read(at);
        let record = nodes.get(node);
        let labels = record
            .map(|r| r.value.spec.labels.clone())
            .unwrap_or_default();
        let excluded = record.and_then(|r| r.value.spec.announcing.excluded.clone());
        let addresses = record
            .map(|r| r.value.spec.addresses.clone())
            .unwrap_or_default();
        let peers: Vec<(String, BgpPeerSpec)> = self
            .peers
            .read(at)
            .iter()
            .map(|p| (p.name.clone(), p.value.spec.clone()))
            .collect();
        let advertisements: Vec<_> = self
            .advertisements
            .read(at)
            .iter()
            .map(|a| (a.name.clone(), a.value.spec.clone()))
            .collect();
        let (pools, services, namespaces, endpoints) = (
            self.pools.read(at),
            self.services.read(at),
            self.namespaces.read(at),
            self.endpoints.read(at),
        );
        let wanted = node_advertisements(&decision::Inputs {
            node,
            labels: &labels,
            excluded: excluded.as_deref(),
            peers: &peers,
            advertisements: &advertisements,
            pools: &rows::labelled_pools(pools.iter()),
            services: &rows::services_in(services.iter(), namespaces.iter()),
            ready: &rows::ready_nodes(endpoints.iter()),
            records: &*nodes,
        });
        (wanted, addresses)
    }

    /// What `node` has reported of its session in each peer's status, at `at`.
    fn reported_by(&self, node: &str, at: &Moment) -> BTreeMap<String, BgpSessionStatus> {
        self.peers
            .read(at)
            .iter()
            .filter_map(|p| {
                let mine = p.value.status.nodes.iter().find(|n| n.node == node)?;
                Some((p.name.clone(), mine.clone()))
            })
            .collect()
    }
}

async fn run(inputs: Inputs, mut stop: oneshot::Receiver<StopRequest>) {
    let wake = Wake::default();
    let seen = Seen::follow(&inputs.store, &wake).await;
    let mut status_tick = crate::clock::ticker(Duration::from_millis(
        inputs.settings.status_interval_ms.max(100),
    ));
    let mut announcer = Announcer::new(inputs);
    // When the gathered changes are applied: set by the first change after an apply, not
    // pushed back by later ones (a steady stream of changes must not starve BIRD of them).
    let mut apply_at = Some(tokio::time::Instant::now());
    loop {
        let changed = |at: Option<tokio::time::Instant>| {
            at.or_else(|| Some(tokio::time::Instant::now() + SETTLE))
        };
        let due = apply_at.unwrap_or_else(tokio::time::Instant::now);
        tokio::select! {
            () = wake.changed() => apply_at = changed(apply_at),
            () = tokio::time::sleep_until(due), if apply_at.is_some() => {
                let span = tracing::info_span!("bgp_apply");
                apply_at = announcer.apply(&seen).instrument(span).await;
            }
            _ = status_tick.tick() => {
                if announcer.look(&seen).await {
                    apply_at = changed(apply_at);
                }
            }
            request = &mut stop => {
                let (on_stop, done) = match request {
                    Ok((on_stop, done)) => (on_stop, Some(done)),
                    Err(_) => (OnStop::Leave, None),
                };
                announcer.stop(on_stop).await;
                if let Some(done) = done {
                    let _ = done.send(());
                }
                return;
            }
        }
    }
}

/// What the announcer keeps between passes: BIRD, the addresses on `lo`, the reports, the
/// peers' passwords.
struct Announcer {
    store: ClusterStore,
    node: String,
    /// `[bgp] router_id`, else the node's first configured IPv4 address.
    configured_id: Option<Ipv4Addr>,
    speaker: Speaker,
    addresses: HeldBy,
    reports: Reports,
    passwords: Passwords,
    /// The peers held back for want of their password, with why.
    held: BTreeMap<String, String>,
    health: Arc<Health>,
}

impl Announcer {
    fn new(inputs: Inputs) -> Self {
        let Inputs {
            store,
            node,
            addresses,
            settings,
            metrics,
            health,
            local_addresses,
        } = inputs;
        Self {
            configured_id: settings.router_id.or_else(|| first_v4(&addresses)),
            speaker: Speaker::new(settings.clone(), node.clone(), metrics.clone()),
            addresses: HeldBy::new(local_addresses, Holder::Bgp),
            reports: Reports::new(node.clone(), store.clone(), metrics),
            passwords: Passwords::new(&settings.secret_namespace),
            held: BTreeMap::new(),
            store,
            node,
            health,
        }
    }

    /// Tells BIRD what `seen` asks of this node now; when to try again if it could not.
    async fn apply(&mut self, seen: &Seen) -> Option<tokio::time::Instant> {
        let (mut wanted, record) = seen.decide(&self.node, &self.store.moment().await);
        self.held = self.passwords.resolve(&self.store, &mut wanted).await;
        for (what, why) in &wanted.refused {
            tracing::warn!("BGP: {what} left out: {why}");
        }
        // New addresses on `lo` before BIRD hears of their routes (a router may send traffic
        // the moment a route reaches it); old ones off only once BIRD has withdrawn theirs.
        let ips = wanted.ips();
        self.addresses.take(&ips).await;
        // The router ID: configured, else the node's first IPv4 address (its record has the
        // Node's on Kubernetes), else BIRD's choice.
        let router_id = self.configured_id.or_else(|| first_v4(&record));
        match self.speaker.apply(wanted, router_id).await {
            Ok(()) => {
                self.addresses.keep_only(&ips);
                self.addresses.decided();
                self.health.set("bgp", Ok(()));
                None
            }
            Err(e) => {
                let wait = self.speaker.backoff.next_delay();
                tracing::error!("BGP: {e}; trying again in {wait:?}");
                self.health.set("bgp", Err(e.to_string()));
                Some(tokio::time::Instant::now() + wait)
            }
        }
    }

    /// Looks at BIRD and the sessions, and reports them; whether an apply is due (BIRD
    /// exited, or a password may have changed).
    async fn look(&mut self, seen: &Seen) -> bool {
        if self.speaker.exited() {
            return true;
        }
        let due = self.passwords.stale();
        if let Some(sessions) = self.speaker.sessions().await {
            let stored = seen.reported_by(&self.node, &self.store.moment().await);
            self.reports
                .publish(&self.speaker.wanted, &self.held, &sessions, &stored)
                .await;
        }
        due
    }

    /// BIRD stopped; for a leave the addresses off `lo` too. For a restart they stay: the
    /// routers that keep this node's routes go on sending it their traffic.
    async fn stop(&mut self, on_stop: OnStop) {
        self.speaker.stop(on_stop).await;
        if on_stop != OnStop::Restart {
            self.addresses.keep_only(&BTreeSet::new());
        }
    }
}

fn first_v4(addresses: &[IpAddr]) -> Option<Ipv4Addr> {
    addresses.iter().find_map(|a| match a {
        IpAddr::V4(v4) => Some(*v4),
        IpAddr::V6(_) => None,
    })
}

/// BIRD and what it was last told.
struct Speaker {
    settings: BgpSettings,
    node: String,
    metrics: Arc<Metrics>,
    bird: Option<Bird>,
    /// The configuration BIRD runs.
    running: Option<String>,
    wanted: NodeAdvertisements,
    backoff: Backoff,
}

impl Speaker {
    fn new(settings: BgpSettings, node: String, metrics: Arc<Metrics>) -> Self {
        Self {
            settings,
            node,
            metrics,
            bird: None,
            running: None,
            wanted: NodeAdvertisements::default(),
            backoff: Backoff::new(Duration::from_secs(30)),
        }
    }

    /// Brings BIRD in line with `wanted`: starts it, or reconfigures it if the configuration
    /// changed (nothing happens otherwise).
    async fn apply(
        &mut self,
        wanted: NodeAdvertisements,
        router_id: Option<Ipv4Addr>,
    ) -> Result<(), BirdError> {
        let config = bird_config::render(&self.node, router_id, &wanted);
        match &self.bird {
            None => {
                let bird = Bird::start(&self.settings, &config).await?;
                tracing::info!(
                    peers = wanted.peers.len(),
                    routes = wanted.ips().len(),
                    "BGP: BIRD started"
                );
                self.bird = Some(bird);
            }
            Some(_) if self.running.as_deref() == Some(&config) => {}
            Some(bird) => {
                bird.configure(&config).await?;
                self.metrics.bgp.reconfigurations.inc();
                tracing::info!(
                    peers = wanted.peers.len(),
                    routes = wanted.ips().len(),
                    "BGP: BIRD reconfigured"
                );
            }
        }
        self.running = Some(config);
        self.wanted = wanted;
        self.backoff.reset();
        Ok(())
    }

    /// Whether BIRD exited since the last look (it is then started again by `apply`).
    fn exited(&mut self) -> bool {
        let Some(status) = self.bird.as_mut().and_then(Bird::exited) else {
            return false;
        };
        tracing::error!("BGP: BIRD exited ({status}); starting it again");
        self.metrics.bgp.speaker_restarts.inc();
        self.bird = None;
        self.running = None;
        true
    }

    async fn sessions(&self) -> Option<BTreeMap<String, Session>> {
        match self.bird.as_ref()?.sessions().await {
            Ok(sessions) => Some(sessions),
            Err(e) => {
                tracing::warn!("BGP: cannot read the sessions' state: {e}");
                None
            }
        }
    }

    async fn stop(&mut self, on_stop: OnStop) {
        let Some(bird) = self.bird.take() else {
            return;
        };
        match on_stop {
            // `auto` is resolved before the stop reaches here; unresolved, a leave.
            OnStop::Leave | OnStop::Auto => bird.stop().await,
            OnStop::Restart => bird.stop_for_restart().await,
        }
    }
}
