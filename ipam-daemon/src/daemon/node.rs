//! The node's controllers, wired together. What flows between them:
//!
//! ```text
//!  config ──Configured─────────────┐
//!                                  ▼
//!  store ──▶ l2::owners ──ServiceAnswers──▶ l2::responder ──▶ lo, hand-overs, maps, frames
//!           (owners over liveness::LivePeers)
//!  UDP ◀─▶ liveness::gossip ──Membership──▶ LivePeers     ([gossip]; else the nodes' leases)
//!           liveness::gossip ──FenceState──▶ Fence       ([gossip]; else the node's lease)
//!  Fence ──▶ liveness::heartbeat ──▶ responders' heartbeat (silenced at once when it closes)
//!  liveness::lease ──▶ store                              (the node's lease: who holds blocks)
//!  Membership ──▶ liveness::dead_peers ──▶ node record    (dead peers whose kubelet is silent)
//!           liveness::dead_peers ──Reported──▶ dead_flows ──▶ conntrack (their unanswered flows)
//!  store ──▶ pod_ipam ──▶ local API (ipam-cni), host network, status.json, node record
//!  store ──▶ routes ──▶ route map
//!  node_record ──▶ node record                            (add-on mode: no [ipam], no pod_ipam)
//!  store ──▶ bgp::announcer ──▶ BIRD ──▶ routers           ([bgp]: routes per Service IP)
//! ```
//!
//! Each arrow is a typed value; no controller reaches into another's state.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use ipam_config::{Config, IpamSettings, NodeSettings, OnStop};
use ipam_core::store::TypedStore as _;
use ipam_datapath::Datapath;
use tokio::{sync::watch, task::JoinHandle};

use super::{
    DaemonError, OperatorTask, Role, check_add_on, check_mode, open_store,
    signals::{SignalEvent, Signals},
};
use crate::{
    bgp::BgpAnnouncer,
    cluster::{ClusterStore, events::Events},
    l2::{self, Configured, OwnedIp, OwnedIps, ServiceAnswers, announcer::AnnounceError},
    liveness::{
        self, Fence, LeaseFence,
        gossip::{self, Gossip},
        heartbeat::Timing,
        peers::PeersSource,
    },
    metrics::Observed,
    net::local_address::{Holder, LocalAddresses},
    pod_ipam::PodIpam,
};

/// Runs the node until SIGTERM or SIGINT. Pins stay in place on exit: the responders keep
/// answering until the liveness timeout passes, which is what lets a restart or upgrade go
/// unnoticed.
pub(super) async fn run(
    config_path: PathBuf,
    mut config: Config,
    role: Role,
    observed: Observed,
) -> Result<(), DaemonError> {
    config.check_fencing(&config_path)?;
    // After a stop for a restart whose promise still runs, the responders answer on until the
    // deadline the agent before left, and what they answer is this agent's to start from.
    let restarting =
        liveness::restart::promise_runs(&config.node.private_file(liveness::restart::PROMISE_FILE));
    let datapath = open_datapath(&config, role, &observed, restarting)?;
    let mut node =
        NodeControllers::start(&config, role, datapath.clone(), observed, restarting).await?;
    let mut signals = Signals::install()?;
    loop {
        tokio::select! {
            ended = &mut node.responder => return Err(responder_ended(ended)),
            event = signals.next() => match event {
                SignalEvent::Stop => break,
                SignalEvent::Reload => {
                    if let Some(new) = reloaded(&config_path, &config) {
                        node.reload(&new);
                        config = new;
                    }
                }
            },
        }
    }
    node.stop(&config, &datapath).await;
    Ok(())
}

/// Loads the datapath (adopting what a previous run pinned) and starts draining its log.
fn open_datapath(
    config: &Config,
    role: Role,
    observed: &Observed,
    restarting: bool,
) -> Result<Arc<Mutex<Datapath>>, DaemonError> {
    let log_level = crate::datapath_settings::ebpf_log_level(config.datapath.ebpf_log_level);
    let mut datapath = Datapath::open_with_log(&config.datapath.bpffs_root, log_level)?;
    if !restarting {
        datapath.heartbeat(config.datapath.liveness_timeout())?;
    }
    tracing::info!(
        role = role.name(),
        root = %datapath.root().display(),
        ebpf_log_level = ?config.datapath.ebpf_log_level,
        "datapath loaded"
    );
    observed.health.set("datapath", Ok(()));
    if let Some(log) = datapath.take_log() {
        tokio::spawn(ipam_datapath::ebpf_log::drain(log));
    }
    // Shared with the API (pod endpoints); every use is a few syscalls under the lock.
    Ok(Arc::new(Mutex::new(datapath)))
}

/// The configuration file anew, unless it cannot be read or changes what needs a restart.
fn reloaded(path: &Path, running: &Config) -> Option<Config> {
    match Config::load(path) {
        Ok(new) if new.datapath.bpffs_root != running.datapath.bpffs_root => {
            tracing::error!(
                "not reloading {}: datapath.bpffs_root changed, which needs a restart",
                path.display()
            );
            None
        }
        Ok(new) => {
            tracing::info!(config = %path.display(), "configuration reloaded");
            Some(new)
        }
        Err(e) => {
            tracing::error!("keeping the running configuration: {e}");
            None
        }
    }
}

fn responder_ended(
    ended: Result<Result<(), AnnounceError>, tokio::task::JoinError>,
) -> DaemonError {
    match ended {
        Ok(Err(e)) => e.into(),
        Ok(Ok(())) => DaemonError::ControllerEnded("responder"),
        Err(e) => {
            tracing::error!("the responder controller failed: {e}");
            DaemonError::ControllerEnded("responder")
        }
    }
}

fn timing(config: &Config) -> Timing {
    Timing {
        interval: config.datapath.heartbeat_interval(),
        liveness_timeout: config.datapath.liveness_timeout(),
    }
}

/// The node's running controllers, as the wiring reaches them: the inputs that follow a reload,
/// the operator beside them (standalone role), and the responder whose failure ends the daemon.
struct NodeControllers {
    configured: watch::Sender<Configured>,
    timing: watch::Sender<Timing>,
    ipam: Option<watch::Sender<IpamSettings>>,
    /// The add-on mode's node record follows `[node]` (with `[ipam]`, `ipam` carries it).
    node_settings: Option<watch::Sender<NodeSettings>>,
    operator: Option<OperatorTask>,
    gossip: Option<Gossip>,
    bgp: Option<BgpAnnouncer>,
    responder: JoinHandle<Result<(), AnnounceError>>,
    heartbeat: JoinHandle<()>,
    /// The node's fence, for a restart's promise (made only while it is open).
    fence: Option<Fence>,
    /// The shared store, when the node runs on one.
    store: Option<ClusterStore>,
    /// What the owners controller has the responders answer, for a restart's notice.
    services: watch::Receiver<ServiceAnswers>,
    /// Stops the owners controller's decisions before that list is read.
    owners_frozen: Option<Arc<Mutex<bool>>>,
    /// Clears a leave note in this node's record (`liveness::leave::clear_own`); stopped before
    /// a leave writes one.
    leave_clearing: Option<JoinHandle<()>>,
}

/// What the Service IP controllers start from and share with the responder.
struct ServiceIpState {
    /// The service IPs on `lo`, shared by both announcers.
    local_addresses: LocalAddresses,
    /// What the agent before this one answered, taken up as this node's own.
    inherited: OwnedIps,
    /// Where the owners controller hands the responder what this node answers (dropped when
    /// none runs: the responder then answers no Service IP).
    answers: watch::Sender<ServiceAnswers>,
}

/// What the cluster side of a node gives the announcement and liveness controllers.
struct ClusterSide {
    fence: Option<Fence>,
    /// Stops the owners controller's decisions (`l2::owners::Inputs::frozen`).
    owners_frozen: Option<Arc<Mutex<bool>>>,
    leave_clearing: Option<JoinHandle<()>>,
}

impl NodeControllers {
    async fn start(
        config: &Config,
        role: Role,
        datapath: Arc<Mutex<Datapath>>,
        observed: Observed,
        restarting: bool,
    ) -> Result<Self, DaemonError> {
        let inherited = if restarting {
            inherited_answers(config, &datapath)
        } else {
            OwnedIps::new()
        };
        // The service IPs on `lo`: one set for both announcers, which may hold an IP together.
        let local_addresses = LocalAddresses::start(
            config.node.announce.strict_arp,
            config
                .node
                .private_file(crate::net::local_address::RECORD_FILE),
        );
        if !config.announcements.is_empty() {
            local_addresses.ensure_strict_arp();
        }
        let (configured, configured_rx) = watch::channel(Configured::of(config));
        // Seeded with what the agent before answered after a restart: the responder's first
        // pass must not withdraw what a previous run announced and this one still wants
        // (answered without a gap).
        let (answers, services) = watch::channel(ServiceAnswers::at_start(inherited.clone()));
        // The node's links and addresses, followed once for every controller that reads them.
        let link_changes = crate::net::link_changes::follow();
        // The responder first: configured announcements are answered before the store is.
        let responder = tokio::spawn(l2::responder::run(
            datapath.clone(),
            l2::responder::Wanted {
                configured: configured_rx,
                services: services.clone(),
                local_addresses: local_addresses.clone(),
            },
            link_changes.clone(),
        ));
        let (on_store, cluster) = OnTheStore::start(
            NodeStart {
                config,
                role,
                datapath: &datapath,
                observed: &observed,
                link_changes,
            },
            ServiceIpState {
                local_addresses: local_addresses.clone(),
                inherited,
                answers,
            },
        )
        .await?;
        // Every announcer that runs has said so: the IPs an agent before left on `lo` go once
        // they have decided (at once with none).
        local_addresses.expected_all();
        let owners_frozen = cluster.owners_frozen.clone();
        let leave_clearing = cluster.leave_clearing;
        let (timing, timing_rx) = watch::channel(timing(config));
        let fence = cluster.fence.clone();
        let heartbeat = tokio::spawn(liveness::heartbeat::run(datapath, cluster.fence, timing_rx));
        let OnTheStore {
            ipam,
            node_settings,
            operator,
            gossip,
            bgp,
            store,
        } = on_store;
        Ok(Self {
            configured,
            timing,
            ipam,
            node_settings,
            operator,
            gossip,
            bgp,
            responder,
            heartbeat,
            fence,
            store,
            services,
            owners_frozen,
            leave_clearing,
        })
    }

    /// Stops as `[node] on_stop` says: for a leave, BGP withdrawn and the gossip left (the
    /// others answer for this node's IPs at once, its responders silent first); for a restart,
    /// BGP kept at routers with graceful restart and the IPs where they are, answered by the
    /// responders for the promised time (`liveness::restart`), with the gossip or the leases.
    async fn stop(mut self, config: &Config, datapath: &Mutex<Datapath>) {
        if let Some(op) = self.operator.take() {
            op.stop().await;
        }
        let on_stop = self.this_stop(config).await;
        if let Some(bgp) = self.bgp.take() {
            bgp.stop(on_stop).await;
        }
        let restart = on_stop == OnStop::Restart;
        let promised = restart && self.promise_restart(config, datapath).await;
        match (self.gossip.take(), promised) {
            (gossip, true) => {
                if let Some(gossip) = gossip {
                    gossip.abandon().await;
                }
                tracing::info!(
                    "stopping for a restart: the responders answer for this node's Service IPs \
                     for up to {} ms, and the other nodes keep them here until the next agent",
                    config.node.restart_within_ms
                );
            }
            // Leaving makes the others take the IPs over at once: this node must be silent
            // first.
            (Some(gossip), false) => {
                // The heartbeat first: a beat after the silence would have the responders
                // answer for another `liveness_timeout` while the others take over.
                // (A failed restart promise stopped it already: a finished task is not
                // awaited twice.)
                if !self.heartbeat.is_finished() {
                    self.heartbeat.abort();
                    let _ = (&mut self.heartbeat).await;
                }
                let silenced = datapath.lock().expect("datapath lock").silence();
                match silenced {
                    // Silent now: the others may reckon their majority without this node.
                    Ok(()) => {
                        if let Some(clearing) = self.leave_clearing.take() {
                            clearing.abort();
                            let _ = clearing.await;
                        }
                        if let Some(store) = &self.store {
                            liveness::leave::note(store, &config.node.name).await;
                        }
                    }
                    Err(e) => tracing::error!(
                        "cannot silence the responders before leaving the gossip; they answer \
                         for up to {} ms more: {e}",
                        config.datapath.liveness_timeout_ms
                    ),
                }
                gossip.leave().await;
                tracing::info!("stopping; responders silent, the other nodes answer for its IPs");
            }
            // A restart's promise failed, with leases: the others take the IPs over once the
            // node's lease lapses. Whatever step failed, the responders must be silent by then
            // (`liveness::restart`): silenced now, as for a leave with the gossip.
            (None, false) if restart && self.store.is_some() => {
                match datapath.lock().expect("datapath lock").silence() {
                    Ok(()) => tracing::info!(
                        "stopping; responders silent, the other nodes answer for its IPs once \
                         its lease lapses (node_lease_ms {} ms)",
                        config.cluster.node_lease_ms
                    ),
                    Err(e) => tracing::error!(
                        "cannot silence the responders after the restart promise failed; they \
                         answer until their last heartbeat runs out (liveness_timeout_ms {} \
                         ms): {e}",
                        config.datapath.liveness_timeout_ms
                    ),
                }
            }
            (None, false) => tracing::info!(
                "stopping; responders keep answering for up to {} ms, until the liveness timeout",
                config.datapath.liveness_timeout_ms
            ),
        }
    }

    /// What this stop is (`[node] on_stop`); for `auto`, a leave when the node's record says it
    /// may not announce or is gone, or (on Kubernetes) when the agent's DaemonSet is gone or
    /// being deleted (an uninstall); a restart otherwise (and when they cannot be read in time:
    /// a restart's promise needs the store, and falls back to a leave without it).
    async fn this_stop(&self, config: &Config) -> OnStop {
        let on_stop = config.node.on_stop;
        let (OnStop::Auto, Some(store)) = (on_stop, &self.store) else {
            let resolved = on_stop.resolve(None);
            match resolved {
                OnStop::Restart => tracing::info!("on_stop: stopping as for a restart"),
                OnStop::Leave | OnStop::Auto => tracing::info!("on_stop: stopping as for a leave"),
            }
            return resolved;
        };
        let node = config.node.name.as_str();
        let read = tokio::time::timeout(
            Duration::from_secs(2),
            store.get_typed::<ipam_core::resources::NodeIpam>(node),
        )
        .await;
        let excluded = match read {
            Ok(Ok(Some(record))) => match record.value.spec.announcing.excluded {
                Some(why) => Some(format!("the node may not announce ({why})")),
                None => uninstalling(store).await,
            },
            Ok(Ok(None)) => Some(format!("node {node}'s record is gone")),
            Ok(Err(e)) => {
                tracing::warn!(
                    "on_stop = \"auto\": cannot read node {node}'s record ({e}); stopping as for a restart"
                );
                None
            }
            Err(_) => {
                tracing::warn!(
                    "on_stop = \"auto\": node {node}'s record not read within 2 s; stopping as for a restart"
                );
                None
            }
        };
        let resolved = on_stop.resolve(excluded.as_deref());
        match &excluded {
            Some(why) => tracing::info!("on_stop = \"auto\": {why}: stopping as for a leave"),
            None => tracing::info!(
                "on_stop = \"auto\": the node may announce: stopping as for a restart"
            ),
        }
        resolved
    }

    /// Promises the cluster to be back (`liveness::restart`), the heartbeat stopped by the
    /// promise once its notice is written; whether the promise stands (else the stop is a
    /// leave).
    async fn promise_restart(&mut self, config: &Config, datapath: &Mutex<Datapath>) -> bool {
        let Some(store) = &self.store else {
            return false;
        };
        let file = config.node.private_file(liveness::restart::PROMISE_FILE);
        // No decision from now on (one under way is waited for): the IPs the notice lists are
        // all the responders answer, and none is taken while it is written.
        if let Some(frozen) = &self.owners_frozen {
            *frozen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        }
        let promised = liveness::restart::Promise {
            store,
            node: &config.node.name,
            within: config.node.restart_within(),
            file: &file,
            fence: self.fence.clone(),
            answering: self
                .services
                .borrow()
                .answers
                .answering
                .keys()
                .copied()
                .collect(),
        }
        .make(datapath, &mut self.heartbeat)
        .await;
        if let Err(e) = &promised {
            tracing::error!(
                "cannot stop for a restart ({e}): stopping as for a leave; its responders fall \
                 silent and the other nodes take this node's Service IPs over (at once with the \
                 gossip, once its lease lapses without)"
            );
        }
        promised.is_ok()
    }

    fn reload(&self, new: &Config) {
        if let (Some(ipam), Some(settings)) = (&self.ipam, &new.ipam) {
            ipam.send_replace(settings.clone());
        }
        if let Some(node) = &self.node_settings {
            node.send_replace(new.node.clone());
        }
        if let Some(op) = &self.operator {
            op.reload(new);
        }
        self.configured.send_replace(Configured::of(new));
        self.timing.send_replace(timing(new));
    }
}

/// The controllers that run over the store, as they were started.
#[derive(Default)]
struct OnTheStore {
    ipam: Option<watch::Sender<IpamSettings>>,
    node_settings: Option<watch::Sender<NodeSettings>>,
    operator: Option<OperatorTask>,
    gossip: Option<Gossip>,
    bgp: Option<BgpAnnouncer>,
    store: Option<ClusterStore>,
}

/// What every mode's controllers start from.
struct NodeStart<'a> {
    config: &'a Config,
    role: Role,
    datapath: &'a Arc<Mutex<Datapath>>,
    observed: &'a Observed,
    link_changes: watch::Receiver<u64>,
}

impl OnTheStore {
    /// The controllers over the store, as the mode asks: pod IPAM and the announcers with
    /// `[ipam]`, the node record and the announcers in the add-on mode, none standalone.
    async fn start(
        start: NodeStart<'_>,
        service_ips: ServiceIpState,
    ) -> Result<(Self, ClusterSide), DaemonError> {
        let NodeStart {
            config,
            role,
            datapath,
            observed,
            link_changes,
        } = start;
        let mut on_store = Self::default();
        let cluster = match config.ipam.clone() {
            Some(settings) => {
                let store = open_store(config, observed).await?;
                check_mode(&store, settings.mode).await?;
                on_store.start_operator_and_gossip(config, role, &store, observed);
                on_store
                    .start_pod_ipam(config, &settings, &store, datapath, observed, link_changes)
                    .await?;
                on_store.start_announcers(config, store, observed, service_ips)
            }
            None if config.is_add_on() => {
                let store = open_store(config, observed).await?;
                check_add_on(&store).await?;
                tracing::info!(
                    node = config.node.name.as_str(),
                    "add-on mode (no [ipam]): answering for the cluster's Service IPs only; no \
                     pod IPAM, no CNI, no pod datapath"
                );
                on_store.start_operator_and_gossip(config, role, &store, observed);
                on_store.start_node_record(config, &store, observed, link_changes)?;
                on_store.start_announcers(config, store, observed, service_ips)
            }
            None => ClusterSide::standalone(),
        };
        Ok((on_store, cluster))
    }

    /// The operator beside the node (standalone role), and the gossip (`[gossip]`).
    fn start_operator_and_gossip(
        &mut self,
        config: &Config,
        role: Role,
        store: &ClusterStore,
        observed: &Observed,
    ) {
        if role == Role::Standalone {
            self.operator = Some(OperatorTask::spawn(store.clone(), config, observed.clone()));
        }
        self.gossip = start_gossip(config, store, observed);
    }

    /// With `[ipam]`: pod IPAM.
    async fn start_pod_ipam(
        &mut self,
        config: &Config,
        settings: &IpamSettings,
        store: &ClusterStore,
        datapath: &Arc<Mutex<Datapath>>,
        observed: &Observed,
        link_changes: watch::Receiver<u64>,
    ) -> Result<(), DaemonError> {
        let pod_ipam = PodIpamStart {
            config,
            settings,
            store,
            datapath,
            observed,
            gossip: self.gossip.as_ref(),
            link_changes,
        };
        self.ipam = Some(start_pod_ipam(pod_ipam).await?);
        Ok(())
    }

    /// The add-on mode: Service IPs beside another CNI; the node's record is all it writes
    /// for itself.
    fn start_node_record(
        &mut self,
        config: &Config,
        store: &ClusterStore,
        observed: &Observed,
        link_changes: watch::Receiver<u64>,
    ) -> Result<(), DaemonError> {
        let (settings, settings_rx) = watch::channel(config.node.clone());
        self.node_settings = Some(settings);
        tokio::spawn(crate::node_record::run(
            store.clone(),
            settings_rx,
            observed.clone(),
            link_changes,
        ));
        serve_add_on_api(config, self.gossip.as_ref())?;
        Ok(())
    }

    /// BGP, and the cluster side of the L2 announcements and liveness (every mode on a store).
    fn start_announcers(
        &mut self,
        config: &Config,
        store: ClusterStore,
        observed: &Observed,
        service_ips: ServiceIpState,
    ) -> ClusterSide {
        self.bgp = start_bgp(config, &store, observed, &service_ips.local_addresses);
        self.store = Some(store.clone());
        start_cluster_side(config, store, observed, self.gossip.as_ref(), service_ips)
    }
}

impl ClusterSide {
    fn standalone() -> Self {
        Self {
            fence: None,
            owners_frozen: None,
            leave_clearing: None,
        }
    }
}

/// What pod IPAM starts from.
struct PodIpamStart<'a> {
    config: &'a Config,
    settings: &'a IpamSettings,
    store: &'a ClusterStore,
    datapath: &'a Arc<Mutex<Datapath>>,
    observed: &'a Observed,
    gossip: Option<&'a Gossip>,
    link_changes: watch::Receiver<u64>,
}

/// Restores pod IPAM, serves the local API from it, and starts its passes and the routes
/// between nodes. Returns where its settings go on a reload.
async fn start_pod_ipam(
    start: PodIpamStart<'_>,
) -> Result<watch::Sender<IpamSettings>, DaemonError> {
    let PodIpamStart {
        config,
        settings,
        store,
        datapath,
        observed,
        gossip,
        link_changes,
    } = start;
    let pod_ipam = PodIpam::start(
        settings.clone(),
        store.clone(),
        datapath.clone(),
        observed.clone(),
    )
    .await?;
    // State is restored by now: every answer of the API reflects it.
    let listener = crate::api::server::bind(
        &settings.socket,
        crate::api::server::Access::of(&config.node),
    )?;
    let handler = match gossip {
        Some(gossip) => gossip.api_handler(pod_ipam.api_handler()),
        None => pod_ipam.api_handler(),
    };
    tokio::spawn(crate::api::server::serve(listener, handler));
    tracing::info!(socket = %settings.socket.display(), "API listening");
    let (tx, rx) = watch::channel(settings.clone());
    tokio::spawn(pod_ipam.run(config.cluster.resync(), rx, link_changes));
    if let Some(uplink) = settings.uplinks.first() {
        tokio::spawn(crate::routes::run(
            store.clone(),
            settings.node_name.clone(),
            settings.mode,
            uplink.clone(),
            datapath.clone(),
            observed.metrics.clone(),
        ));
    }
    Ok(tx)
}

/// The add-on mode's local API: `ipamctl members` from the gossip; pod requests get an answer
/// saying why there is nothing to serve.
fn serve_add_on_api(config: &Config, gossip: Option<&Gossip>) -> Result<(), DaemonError> {
    let no_pod_ipam: crate::api::server::Handler = Arc::new(|_| {
        ipam_api::types::Response::error(
            ipam_api::types::ErrorCode::BadRequest,
            "this node runs in the add-on mode (no [ipam] section): it answers for Service IPs \
             only and serves no pod addresses; the node's CNI does",
        )
    });
    let handler = match gossip {
        Some(gossip) => gossip.api_handler(no_pod_ipam),
        None => no_pod_ipam,
    };
    let listener = crate::api::server::bind(
        &config.node.socket,
        crate::api::server::Access::of(&config.node),
    )?;
    tokio::spawn(crate::api::server::serve(listener, handler));
    tracing::info!(socket = %config.node.socket.display(), "API listening");
    Ok(())
}

/// On a shared store with `[gossip]`: the gossip, started before anything reads it; on
/// Kubernetes also the reports of the nodes it declares dead whose kubelet is silent too.
fn start_gossip(config: &Config, store: &ClusterStore, observed: &Observed) -> Option<Gossip> {
    let gossip_settings = config.gossip.clone().filter(|_| store.is_shared())?;
    let gossip = Gossip::spawn(gossip::Inputs {
        settings: gossip_settings,
        store: store.clone(),
        node: config.node.name.clone(),
        metrics: observed.metrics.clone(),
    });
    if store.kube().is_some() {
        let (reported, reported_rx) = watch::channel(Default::default());
        let inputs = liveness::dead_peers::Inputs {
            store: store.clone(),
            node: config.node.name.clone(),
            settings: config.dead_nodes.clone(),
            membership: gossip.membership.clone(),
            fence: gossip.fence.clone(),
            reported,
        };
        tokio::spawn(liveness::dead_peers::run(inputs, observed.metrics.clone()));
        if config.dead_nodes.mark_pods_not_ready {
            tokio::spawn(liveness::dead_flows::run(
                store.clone(),
                config.node.name.clone(),
                config.ipam.as_ref().map(|s| s.mode),
                reported_rx,
                observed.metrics.clone(),
            ));
        }
    }
    Some(gossip)
}

/// With `[bgp]`: the BGP announcer, which runs BIRD with this node's sessions.
fn start_bgp(
    config: &Config,
    store: &ClusterStore,
    observed: &Observed,
    local_addresses: &LocalAddresses,
) -> Option<BgpAnnouncer> {
    let settings = config.bgp.clone()?;
    local_addresses.expect(Holder::Bgp);
    tracing::info!(
        run_dir = %settings.run_dir.display(),
        "advertising Service IPs over BGP (BIRD) to the BGPPeers that select this node"
    );
    Some(BgpAnnouncer::spawn(crate::bgp::announcer::Inputs {
        store: store.clone(),
        node: config.node.name.clone(),
        addresses: config.node.addresses.clone(),
        settings,
        metrics: observed.metrics.clone(),
        health: observed.health.clone(),
        local_addresses: local_addresses.clone(),
    }))
}

/// On a shared store: the node's lease, the fence (the gossip's, else the lease's) and the
/// service IPs it owns.
fn start_cluster_side(
    config: &Config,
    store: ClusterStore,
    observed: &Observed,
    gossip: Option<&Gossip>,
    service_ips: ServiceIpState,
) -> ClusterSide {
    let ServiceIpState {
        local_addresses,
        inherited,
        answers,
    } = service_ips;
    if !store.is_shared() {
        // No peers to hold the node's IPs: a notice left behind ends at once.
        tokio::spawn(liveness::restart::clear_notice_once_live(
            store,
            config.node.name.clone(),
            None,
        ));
        return ClusterSide::standalone();
    }
    let lease_fence = gossip
        .is_none()
        .then(|| Arc::new(LeaseFence::new(config.cluster.node_lease())));
    liveness::lease::spawn(liveness::lease::Renewal {
        store: store.clone(),
        node: config.node.name.clone(),
        interval: config.cluster.node_renew_interval(gossip.is_some()),
        duration: config.cluster.node_lease(),
        fence: lease_fence.clone(),
        metrics: observed.metrics.clone(),
    });
    let (fence, peers) = match (gossip, lease_fence) {
        (Some(gossip), _) => (
            Fence::Gossip(gossip.fence.clone()),
            PeersSource::Gossip(gossip.membership.clone()),
        ),
        (None, Some(lease)) => (Fence::Lease(lease.clone()), PeersSource::Leases(lease)),
        (None, None) => unreachable!("a lease fence exists whenever there is no gossip"),
    };
    tokio::spawn(liveness::restart::clear_notice_once_live(
        store.clone(),
        config.node.name.clone(),
        Some(fence.clone()),
    ));
    // A leave note from the agent before keeps this one's fence closed until it is gone.
    let leave_clearing = gossip.is_some().then(|| {
        tokio::spawn(liveness::leave::clear_own(
            store.clone(),
            config.node.name.clone(),
        ))
    });
    local_addresses.expect(Holder::L2);
    let owners_frozen = Arc::new(Mutex::new(false));
    let events = Events::for_store(&store, "ipam-agent", &config.node.name);
    tokio::spawn(l2::owners::run(
        l2::owners::Inputs {
            store,
            node: config.node.name.clone(),
            peers,
            fence: fence.clone(),
            frozen: owners_frozen.clone(),
            metrics: observed.metrics.clone(),
            events: Arc::new(events),
            inherited,
        },
        l2::owners::Outputs { answers },
    ));
    ClusterSide {
        fence: Some(fence),
        owners_frozen: Some(owners_frozen),
        leave_clearing,
    }
}

/// On Kubernetes, why this stop is an uninstall (the agent's DaemonSet gone or being deleted),
/// if it is; `None` for a rollout, off Kubernetes, or when it cannot be told (said in the log:
/// `auto` then stops as for a restart, as before).
async fn uninstalling(store: &ClusterStore) -> Option<String> {
    let kube = store.kube()?;
    let Some(pod) = ipam_kube::workload::OwnPod::from_env() else {
        tracing::info!(
            "on_stop = \"auto\": POD_NAME and POD_NAMESPACE are not set (deploy/ sets them from \
             the downward API), so an uninstall cannot be told from a rollout"
        );
        return None;
    };
    match tokio::time::timeout(Duration::from_secs(2), kube.daemon_set_going(&pod)).await {
        Ok(Ok(going)) => going.map(|why| format!("{why}: an uninstall")),
        Ok(Err(e)) => {
            tracing::warn!(
                "on_stop = \"auto\": cannot read pod {}/{} or its DaemonSet ({e}); taking this \
                 stop for a rollout's",
                pod.namespace,
                pod.name
            );
            None
        }
        Err(_) => {
            tracing::warn!(
                "on_stop = \"auto\": pod {}/{} or its DaemonSet not read within 2 s; taking \
                 this stop for a rollout's",
                pod.namespace,
                pod.name
            );
            None
        }
    }
}

/// What the responders answer now (the configured IPs apart), the agent before this one having
/// stopped for a restart whose promise still runs (`liveness::restart`): this agent takes it
/// up as its own until its first decision.
fn inherited_answers(config: &Config, datapath: &Mutex<Datapath>) -> OwnedIps {
    let entries = match datapath.lock().expect("datapath lock").responder().list() {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!("cannot read what the responders answer after the restart: {e}");
            return OwnedIps::new();
        }
    };
    let configured: BTreeSet<IpAddr> = config.announcements.iter().map(|a| a.ip).collect();
    let mut inherited = OwnedIps::new();
    for entry in entries.iter().filter(|e| !configured.contains(&e.ip)) {
        let interface = ipam_netlink::iface::name(entry.ifindex);
        inherited
            .entry(entry.ip)
            .or_insert_with(|| OwnedIp {
                service: String::new(),
                interfaces: Vec::new(),
            })
            .interfaces
            .push(interface);
    }
    tracing::info!(
        ips = inherited.len(),
        "the agent before this one stopped for a restart: answering its Service IPs on without \
         a wait until this one has decided"
    );
    inherited
}
