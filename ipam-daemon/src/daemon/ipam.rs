//! IPAM on a node: the node agent over the configured store, the node's liveness lease, the
//! router and health addresses, and the status it publishes for `ipamctl ipam status`. The
//! operator runs beside it in the standalone role (see `cluster::operator`), or elsewhere.
//!
//! The agent talks to the store when the store changes (a watch on its own record), when an
//! allocation found no block, and on a periodic resync: never once per pod. A pod ADD is served
//! from the node's blocks without any store round trip, so it works while the store is down.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use ipam_core::{
    Family,
    agent::{AgentError, NodeAgent, NodeFacts},
    backoff::Backoff,
    infra::{INFRA_RETRY_CAP, allocate_waiting},
    multipool::Watermarks,
    node::{HEALTH_OWNER, INGRESS_OWNER, ROUTER_OWNER},
    pool::IpamMode,
    resources::{NodeIpam, PodIpPool, PoolStatus, node_lease_name},
    store::{Resource as _, StoreError, TypedStore, lease},
};
use tokio::sync::Notify;

use super::{
    endpoints::Endpoints,
    host_network::HostNetwork,
    infra_state::InfraState,
    pod_pools::{PodPools, PoolAllocator},
    service_ips::{OwnLease, ServiceAnnouncements},
    status::{PoolSummary, PublishedStatus, STATUS_FILE, write_status},
};
use crate::{
    api::server::Handler,
    cluster::{
        ClusterStore,
        changes::{Interest, wake_on_changes},
    },
    config::{ClusterSettings, IpamSettings},
    datapath::Datapath,
};

#[derive(Debug, thiserror::Error)]
pub enum IpamRuntimeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error("cannot write IPAM state at {path}: {source}; check the state directory")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot restore the pod endpoints: {0}")]
    Endpoints(std::io::Error),
}

/// What a node in a cluster (shared store) has beyond the standalone node.
#[derive(Clone)]
pub struct ClusterParts {
    /// When the node last renewed its lease: the responders' heartbeat stops without it.
    pub own: Arc<OwnLease>,
    /// The service IPs this node answers for.
    pub announcements: Arc<ServiceAnnouncements>,
    pub node_lease: Duration,
}

impl ClusterParts {
    /// Whether the node may keep its responders answering: its lease was renewed within half
    /// the lease (others take over only after a whole lease without a renewal).
    pub fn may_answer(&self) -> bool {
        self.own.fresh(self.node_lease / 2)
    }
}

/// The metrics and readiness checks the runtime keeps current.
#[derive(Clone, Default)]
pub struct Observed {
    pub metrics: Arc<crate::metrics::Metrics>,
    pub health: Arc<crate::metrics::Health>,
}

pub struct IpamRuntime {
    observed: Observed,
    settings: IpamSettings,
    cluster: Option<ClusterParts>,
    store: ClusterStore,
    /// One agent per pool the node's pods take addresses from, the node's own pool
    /// (`infra_pool`) first among them; more only in multi-pool mode.
    agents: BTreeMap<String, NodeAgent>,
    /// The pools' allocators as the API handler sees them.
    pod_pools: Arc<PodPools>,
    /// Signalled when the node's record or a pool changed in the store.
    wake: Arc<Notify>,
    /// The last store pass failed: the next one waits for the backoff.
    store_retry: Backoff,
    store_retry_at: Option<tokio::time::Instant>,
    /// Since when an allocation has been waiting for a block (the demand flag was raised):
    /// the store pass that asks for it is made once, and the wait is measured.
    demand_since: Option<tokio::time::Instant>,
    infra: Arc<Mutex<InfraState>>,
    /// What was last written to status.json: unchanged status is not written again.
    published: Option<PublishedStatus>,
    /// The pools and the node's conditions as last read from the store.
    seen_pools: Vec<PoolSummary>,
    seen_node_conditions: Vec<ipam_core::resources::Condition>,
    /// What the node published about itself last.
    facts: NodeFacts,
    /// On a Kubernetes store: the node's Node (labels, addresses, `spec.podCIDRs`).
    kube_node: Option<tokio::sync::watch::Receiver<Option<ipam_kube::node::NodeInfo>>>,
    /// The podCIDRs last taken from the Node, to say once what is missing.
    kube_pod_cidrs: Option<Vec<String>>,
    datapath: Arc<Mutex<Datapath>>,
    endpoints: Arc<Endpoints>,
    host: HostNetwork,
    passes: u64,
}

/// Endpoints are checked against the node's interfaces every this many passes (pods deleted
/// without CNI DEL leave entries behind until then).
const ENDPOINT_CHECK_PASSES: u64 = 20;

/// The node's addresses between nodes are looked up every this many local passes.
const ADDRESS_CHECK_PASSES: u64 = 10;

/// Longest wait between two store passes while the store is unreachable.
const STORE_RETRY_CAP: Duration = Duration::from_secs(10);

fn mkdir(path: &Path) -> Result<(), IpamRuntimeError> {
    std::fs::create_dir_all(path).map_err(|source| IpamRuntimeError::Dir {
        path: path.to_owned(),
        source,
    })
}

impl IpamRuntime {
    /// Restores the node state (before anything else: every later answer reflects it), starts
    /// following the node's record and renewing its lease, and starts allocating the router
    /// and health addresses (waiting for a block if needed). Needs no store to be reachable.
    pub async fn start(
        settings: IpamSettings,
        store: ClusterStore,
        cluster: &ClusterSettings,
        datapath: Arc<Mutex<Datapath>>,
        observed: Observed,
    ) -> Result<Self, IpamRuntimeError> {
        mkdir(&settings.state_dir)?;
        let directory = match &store {
            ClusterStore::Kubernetes(s) if settings.mode == IpamMode::MultiPool => {
                Some(s.follow_pods(&settings.node_name))
            }
            _ => None,
        };
        let pod_pools = Arc::new(PodPools::new(
            &settings.infra_pool,
            settings.mode == IpamMode::MultiPool,
            directory,
        ));
        let mut agents = BTreeMap::new();
        // The node's own pool, and in multi-pool mode every other pool it held addresses of
        // before a restart: all restored before anything else.
        for pool in pools_to_restore(&settings)? {
            let agent = open_agent(&settings, &pool)?;
            pod_pools.insert(&pool, PoolAllocator::of(&agent));
            agents.insert(pool, agent);
        }
        let endpoints = Arc::new(
            Endpoints::open(datapath.clone(), &settings.state_dir)
                .map_err(IpamRuntimeError::Endpoints)?,
        );
        log_endpoint_report(&endpoints);
        let wake = wake_on_changes(
            store.clone(),
            vec![
                Interest::Named(NodeIpam::KIND, settings.node_name.clone()),
                Interest::All(PodIpPool::KIND),
            ],
        );
        if let Some(uplink) = settings.uplinks.first() {
            tokio::spawn(super::routes::run(
                store.clone(),
                settings.node_name.clone(),
                uplink.clone(),
                datapath.clone(),
            ));
        }
        let mut cluster_parts = None;
        if store.is_shared() {
            let own = Arc::new(OwnLease::default());
            let announcements = Arc::new(ServiceAnnouncements::default());
            spawn_lease_thread(
                store.clone(),
                settings.node_name.clone(),
                cluster.node_lease(),
                cluster.node_renew_interval(),
                own.clone(),
                observed.metrics.clone(),
            );
            tokio::spawn(super::service_ips::run(
                store.clone(),
                settings.node_name.clone(),
                cluster.node_lease(),
                own.clone(),
                announcements.clone(),
                observed.metrics.clone(),
            ));
            cluster_parts = Some(ClusterParts {
                own,
                announcements,
                node_lease: cluster.node_lease(),
            });
        }
        observed.health.set("restored", Ok(()));
        let kube_node = match &store {
            ClusterStore::Kubernetes(s) => Some(s.follow_node(&settings.node_name)),
            _ => None,
        };
        let runtime = Self {
            kube_node,
            kube_pod_cidrs: None,
            pod_pools,
            observed,
            cluster: cluster_parts,
            host: HostNetwork::new(settings.host_device.clone(), settings.uplinks.clone()),
            settings,
            store,
            agents,
            wake,
            store_retry: Backoff::new(STORE_RETRY_CAP),
            store_retry_at: None,
            demand_since: None,
            infra: Arc::new(Mutex::new(InfraState::default())),
            published: None,
            seen_pools: Vec::new(),
            seen_node_conditions: Vec::new(),
            facts: NodeFacts::default(),
            datapath,
            endpoints,
            passes: 0,
        };
        runtime.spawn_infra();
        Ok(runtime)
    }

    fn spawn_infra(&self) {
        let mut purposes = vec![ROUTER_OWNER, HEALTH_OWNER];
        if self.settings.ingress {
            purposes.push(INGRESS_OWNER);
        }
        // One task per family, router first: in a fresh block the router (the pods' gateway)
        // gets the first usable address, as users expect.
        let own = &self.agents[&self.settings.infra_pool];
        for family in self.settings.families.clone() {
            let alloc = own.allocator();
            let demand = own.demand();
            let infra = self.infra.clone();
            let pool = self.settings.infra_pool.clone();
            let purposes = purposes.clone();
            tokio::spawn(async move {
                for purpose in purposes {
                    let mut backoff = Backoff::new(INFRA_RETRY_CAP);
                    let ask = demand.clone();
                    let waiting = infra.clone();
                    let pool = pool.clone();
                    let result = allocate_waiting(
                        purpose,
                        family,
                        || alloc.allocate(purpose, family),
                        || {
                            ask.store(true, Ordering::SeqCst);
                            waiting.lock().expect("infra lock").waiting = Some(format!(
                                "{purpose} {} address: waiting for a block of pool {pool}",
                                family.name()
                            ));
                        },
                        &mut backoff,
                    )
                    .await;
                    let mut state = infra.lock().expect("infra lock");
                    match result {
                        Ok(ip) => {
                            demand.store(false, Ordering::SeqCst);
                            tracing::info!(purpose, %ip, "{} {purpose} address ready", family.name());
                            state
                                .addresses
                                .entry(purpose.to_owned())
                                .or_default()
                                .insert(family, ip);
                            state.waiting = None;
                        }
                        Err(e) => {
                            tracing::error!(
                                purpose,
                                "cannot allocate the {} {purpose} address: {e}",
                                family.name()
                            );
                            state.waiting = Some(format!("{purpose} {}: {e}", family.name()));
                        }
                    }
                }
            });
        }
    }

    /// The handler of the local API: pod allocations for CNI attachments.
    pub fn api_handler(&self) -> Handler {
        let pods = super::pods::PodAllocations {
            pools: self.pod_pools.clone(),
            infra: self.infra.clone(),
            families: self.settings.families.clone(),
            endpoints: self.endpoints.clone(),
            gateway_ready: self.host.gateway_ready(),
            host_device: self.settings.host_device.clone(),
            metrics: self.observed.metrics.clone(),
        };
        Arc::new(move |request| pods.handle(request))
    }

    /// Reload: new uplinks (a mode change needs a restart and is refused; pools go to the
    /// operator).
    pub async fn reload(&mut self, settings: IpamSettings) -> Result<(), IpamRuntimeError> {
        if settings.mode != self.settings.mode {
            tracing::error!(
                "not applying the new [ipam] section: the mode cannot change from {} to {} in a \
                 running cluster",
                self.settings.mode.name(),
                settings.mode.name()
            );
            return Ok(());
        }
        self.host.set_uplinks(settings.uplinks.clone());
        self.settings.pools = settings.pools;
        self.settings.uplinks = settings.uplinks;
        Ok(())
    }

    /// The node's cluster parts (lease, service IPs), on a shared store.
    pub fn cluster(&self) -> Option<ClusterParts> {
        self.cluster.clone()
    }

    /// Signalled when the store has something for the agent.
    pub fn wake(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// The local pass, twice a second: the host device and routes, endpoint checks, and a
    /// store pass when an allocation found no block (or a failed one's backoff is over).
    pub async fn local_pass(&mut self) {
        let routers: Vec<IpAddr> = self
            .infra
            .lock()
            .expect("infra lock")
            .addresses
            .get(ROUTER_OWNER)
            .map(|m| m.values().copied().collect())
            .unwrap_or_default();
        self.host
            .sync(&routers, &self.settings.families, &self.datapath);
        self.passes += 1;
        if self.passes.is_multiple_of(ENDPOINT_CHECK_PASSES) {
            log_endpoint_report(&self.endpoints);
        }
        if let Err(e) = self.publish() {
            tracing::warn!("cannot publish the IPAM status: {e}");
        }
        self.observe();
        let node_changed = self
            .kube_node
            .as_mut()
            .is_some_and(|n| n.has_changed().unwrap_or(false));
        if node_changed {
            self.take_pod_cidrs();
        }
        if node_changed || self.passes % ADDRESS_CHECK_PASSES == 1 {
            let facts = self.node_facts();
            if facts != self.facts {
                tracing::info!(
                    addresses = ?facts.addresses,
                    interfaces = ?facts.interfaces.iter().map(|i| &i.name).collect::<Vec<_>>(),
                    "node facts published"
                );
                self.facts = facts.clone();
                for agent in self.agents.values_mut() {
                    agent.set_facts(facts.clone());
                }
                self.store_pass().await;
            }
        }
        self.open_wanted_pools();
        let demand = self.demand();
        let retry_due = self
            .store_retry_at
            .is_some_and(|at| tokio::time::Instant::now() >= at);
        let new_demand = demand && self.demand_since.is_none();
        if new_demand {
            self.demand_since = Some(tokio::time::Instant::now());
        }
        if new_demand || retry_due {
            self.store_pass().await;
        }
        if !demand && let Some(since) = self.demand_since.take() {
            self.observed
                .metrics
                .block_request_wait_seconds
                .observe(since.elapsed().as_secs_f64());
        }
    }

    /// Whether an allocation of any pool waits for a block.
    fn demand(&self) -> bool {
        self.agents
            .values()
            .any(|a| a.demand().load(Ordering::SeqCst))
    }

    /// Opens the pools pods asked for since the last pass (multi-pool mode), each with a
    /// request for a block.
    fn open_wanted_pools(&mut self) {
        for pool in self.pod_pools.take_wanted() {
            if self.agents.contains_key(&pool) {
                continue;
            }
            match open_agent(&self.settings, &pool) {
                Ok(mut agent) => {
                    agent.set_facts(self.facts.clone());
                    agent.demand().store(true, Ordering::SeqCst);
                    self.pod_pools.insert(&pool, PoolAllocator::of(&agent));
                    tracing::info!(
                        pool = pool.as_str(),
                        "a pod asked for pool {pool}: asking for a block of it"
                    );
                    self.agents.insert(pool, agent);
                }
                Err(e) => tracing::error!(
                    pool = pool.as_str(),
                    "cannot open pool {pool} on this node: {e}"
                ),
            }
        }
    }

    /// A pass with the store: the agent's sync and the published status. Failures are
    /// logged and retried with backoff; the node keeps serving from its blocks meanwhile.
    pub async fn store_pass(&mut self) {
        if self
            .store_retry_at
            .is_some_and(|at| tokio::time::Instant::now() < at)
        {
            return;
        }
        let result = async {
            // One after the other: they share the node's record.
            for agent in self.agents.values_mut() {
                agent.sync(&self.store).await?;
            }
            self.refresh_from_store().await
        }
        .await;
        match result {
            Ok(()) => {
                if self.store_retry_at.take().is_some() {
                    tracing::info!(store = self.store.describe(), "store reachable again");
                }
                self.store_retry.reset();
                self.observed.health.set("store", Ok(()));
            }
            Err(e) => {
                self.observed
                    .metrics
                    .store_errors
                    .get_or_create(&crate::metrics::KindLabel {
                        kind: store_error_kind(&e).to_owned(),
                    })
                    .inc();
                self.observed.health.set(
                    "store",
                    Err(format!("{} unreachable: {e}", self.store.describe())),
                );
                let delay = self.store_retry.next_delay();
                tracing::warn!(
                    retry_in_ms = delay.as_millis() as u64,
                    "IPAM store pass failed (pods still get addresses from this node's blocks): {e}"
                );
                self.store_retry_at = Some(tokio::time::Instant::now() + delay);
            }
        }
    }

    /// The `kubernetes` mode's blocks from the Node's `spec.podCIDRs`, when they changed; says
    /// once what the node waits for while there are none.
    fn take_pod_cidrs(&mut self) {
        let Some(node) = self.kube_node.as_mut() else {
            return;
        };
        let info = node.borrow_and_update().clone();
        if self.settings.mode != IpamMode::Kubernetes {
            return;
        }
        let node_name = self.settings.node_name.as_str();
        let Some(info) = info else {
            tracing::warn!(
                node = node_name,
                "waiting for the Kubernetes Node {node_name}: the kubernetes IPAM mode takes the node's blocks from its spec.podCIDRs"
            );
            return;
        };
        if self.kube_pod_cidrs.as_ref() == Some(&info.pod_cidrs) {
            return;
        }
        self.kube_pod_cidrs = Some(info.pod_cidrs.clone());
        let mut cidrs = Vec::new();
        for text in &info.pod_cidrs {
            match text.parse::<ipam_core::Cidr>() {
                Ok(c) => cidrs.push(c),
                Err(e) => tracing::error!(node = node_name, "Node {node_name} spec.podCIDRs: {e}"),
            }
        }
        if cidrs.is_empty() {
            tracing::warn!(
                node = node_name,
                "Node {node_name} has no spec.podCIDRs yet: pods get no address until it does; \
                 the kube-controller-manager assigns them with --allocate-node-cidrs (or use the \
                 cluster-pool mode)"
            );
        } else {
            tracing::info!(node = node_name, cidrs = ?info.pod_cidrs, "blocks from the Node's spec.podCIDRs");
        }
        if let Some(agent) = self.agents.get_mut(&self.settings.infra_pool) {
            agent.set_pod_cidrs(cidrs);
        }
    }

    /// The node's addresses between nodes (as configured, else its Kubernetes Node's internal
    /// addresses, else the first uplink's), its labels (its Node's, and the configured ones
    /// over them), and its interfaces with addresses (not the loopback, not the pods' gateway
    /// device).
    fn node_facts(&self) -> NodeFacts {
        let node = self.kube_node.as_ref().and_then(|n| n.borrow().clone());
        let addresses = if !self.settings.node_addresses.is_empty() {
            self.settings.node_addresses.clone()
        } else if let Some(n) = node.as_ref().filter(|n| !n.internal_addresses.is_empty()) {
            n.internal_addresses.clone()
        } else {
            self.settings
                .uplinks
                .first()
                .map(|u| super::routes::uplink_addresses(u))
                .unwrap_or_default()
        };
        let mut labels = node.map(|n| n.labels).unwrap_or_default();
        labels.extend(self.settings.node_labels.clone());
        let host = &self.settings.host_device;
        let interfaces = super::routes::interfaces_with_addresses()
            .into_iter()
            .filter(|i| i.name != "lo" && &i.name != host && i.name != format!("{host}_peer"))
            .collect();
        NodeFacts {
            addresses,
            labels,
            interfaces,
        }
    }

    /// Brings the gauges and the datapath's counters up to date, and the pod network check.
    fn observe(&self) {
        use std::sync::atomic::Ordering;

        use crate::metrics::FamilyState;
        let m = &self.observed.metrics;
        for family in [Family::V4, Family::V6] {
            let (used, free) = self.agents.values().fold((0, 0), |(used, free), agent| {
                agent
                    .allocator()
                    .with(|a| (used + a.allocated(family) as u64, free + a.free(family)))
            });
            let label = |state: &str| FamilyState {
                family: family.name().to_owned(),
                state: state.to_owned(),
            };
            m.node_addresses
                .get_or_create(&label("capacity"))
                .set((used + free) as i64);
            m.node_addresses
                .get_or_create(&label("used"))
                .set(used as i64);
            m.node_addresses
                .get_or_create(&label("available"))
                .set(free as i64);
        }
        m.block_requests_pending.set(i64::from(self.demand()));
        for pool in &self.seen_pools {
            m.set_pool_usage(&pool.name, &pool.usage);
        }
        if let Ok(mut dp) = self.datapath.lock() {
            if let Ok(stats) = dp.pods().stats() {
                for stat in ipam_common::pod::PodStat::ALL {
                    m.pod_counter_total(stat.name(), stats.get(stat));
                }
            }
            if let Ok(entries) = dp.responder().list() {
                let mut by_ip: std::collections::BTreeMap<IpAddr, u64> = Default::default();
                for e in entries {
                    *by_ip.entry(e.ip).or_default() += e.replies;
                }
                for (ip, replies) in by_ip {
                    m.l2_replies_total(ip, replies);
                }
            }
        }
        let gateway = self.host.gateway_ready().load(Ordering::SeqCst);
        self.observed.health.set(
            "pod network",
            if gateway {
                Ok(())
            } else {
                Err(self
                    .infra
                    .lock()
                    .expect("infra lock")
                    .waiting
                    .clone()
                    .unwrap_or_else(|| {
                        "the router addresses are not on the host device yet".into()
                    }))
            },
        );
    }

    /// Reads what the status shows of the store (pools, the node's conditions).
    async fn refresh_from_store(&mut self) -> Result<(), IpamRuntimeError> {
        self.seen_pools = self
            .store
            .list_typed::<PodIpPool>()
            .await?
            .into_iter()
            .map(|p| {
                let PoolStatus {
                    conditions, usage, ..
                } = p.value.status;
                PoolSummary {
                    name: p.name,
                    conditions,
                    usage,
                }
            })
            .collect();
        self.pod_pools
            .set_known(self.seen_pools.iter().map(|p| p.name.clone()).collect());
        self.seen_node_conditions = self
            .store
            .get_typed::<NodeIpam>(&self.settings.node_name)
            .await?
            .map(|n| n.value.status.conditions)
            .unwrap_or_default();
        Ok(())
    }

    /// Writes status.json from the node's state and what was last read from the store.
    fn publish(&mut self) -> Result<(), IpamRuntimeError> {
        let allocators: Vec<_> = self.agents.values().map(NodeAgent::allocator).collect();
        let InfraState {
            addresses: infra,
            waiting,
        } = self.infra.lock().expect("infra lock").clone();
        let status = PublishedStatus {
            node: self.settings.node_name.clone(),
            mode: Some(self.settings.mode),
            pools: self.seen_pools.clone(),
            node_blocks: allocators
                .iter()
                .flat_map(|alloc| {
                    alloc.with(|a| {
                        let mut b = a.blocks(Family::V4);
                        b.extend(a.blocks(Family::V6));
                        b
                    })
                })
                .collect(),
            node_conditions: self.seen_node_conditions.clone(),
            infra,
            waiting,
            allocations: allocators
                .iter()
                .map(|alloc| alloc.with(|a| a.allocated(Family::V4) + a.allocated(Family::V6)))
                .sum(),
        };
        // Local passes run twice a second; the file changes only when the status does (or was
        // removed).
        let file = self.settings.state_dir.join(STATUS_FILE);
        if self.published.as_ref() == Some(&status) && file.exists() {
            return Ok(());
        }
        write_status(&self.settings.state_dir, &status).map_err(|source| {
            IpamRuntimeError::Dir {
                path: file.clone(),
                source,
            }
        })?;
        self.published = Some(status);
        Ok(())
    }
}

/// The allocation log of a pool on the node.
const ALLOC_LOG_SUFFIX: &str = ".alloc.log";

/// The pools whose state the node restores at start: its own, and in multi-pool mode every
/// pool it has an allocation log of.
fn pools_to_restore(settings: &IpamSettings) -> Result<Vec<String>, IpamRuntimeError> {
    let mut pools = vec![settings.infra_pool.clone()];
    if settings.mode != IpamMode::MultiPool {
        return Ok(pools);
    }
    let dir_error = |source| IpamRuntimeError::Dir {
        path: settings.state_dir.clone(),
        source,
    };
    for entry in std::fs::read_dir(&settings.state_dir).map_err(dir_error)? {
        let name = entry.map_err(dir_error)?.file_name();
        if let Some(pool) = name.to_str().and_then(|n| n.strip_suffix(ALLOC_LOG_SUFFIX))
            && !pools.iter().any(|p| p == pool)
        {
            pools.push(pool.to_owned());
        }
    }
    Ok(pools)
}

/// Opens (restoring) the node's allocator of `pool`.
fn open_agent(settings: &IpamSettings, pool: &str) -> Result<NodeAgent, IpamRuntimeError> {
    let (agent, restored) = NodeAgent::open(
        &settings.state_dir,
        &settings.node_name,
        pool,
        settings.mode,
        Watermarks {
            pre_allocate: settings.pre_allocate,
        },
        settings.pod_cidrs.clone(),
    )?;
    tracing::info!(
        node = settings.node_name.as_str(),
        mode = settings.mode.name(),
        pool,
        blocks = restored.blocks,
        allocations = restored.allocations,
        "IPAM state restored"
    );
    Ok(agent)
}

/// Runs the node lease's renewal on a thread of its own, with its own runtime and its own store
/// connection: nothing the rest of the daemon does (a slow netlink call, a program swap waiting
/// for the kernel) can delay it, and a delayed renewal would make the node look dead.
fn spawn_lease_thread(
    store: ClusterStore,
    node: String,
    duration: Duration,
    interval: Duration,
    own: Arc<OwnLease>,
    metrics: Arc<crate::metrics::Metrics>,
) {
    let spawned = std::thread::Builder::new()
        .name("node-lease".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(
                        "cannot start the node lease's runtime: {e}; renewing from the main one"
                    );
                    return;
                }
            };
            runtime.block_on(async move {
                let mut backoff = Backoff::new(STORE_RETRY_CAP);
                let store = loop {
                    match store.connect_again().await {
                        Ok(s) => break s,
                        Err(e) => {
                            let delay = backoff.next_delay();
                            tracing::warn!(
                                retry_in_ms = delay.as_millis() as u64,
                                "cannot connect for the node lease: {e}"
                            );
                            tokio::time::sleep(delay).await;
                        }
                    }
                };
                renew_node_lease(store, node, duration, interval, own, metrics).await;
            });
        });
    if let Err(e) = spawned {
        tracing::error!("cannot start the node lease's thread: {e}");
    }
}

/// A store error as a metric's label (a bounded set).
fn store_error_kind(e: &IpamRuntimeError) -> &'static str {
    match e {
        IpamRuntimeError::Store(StoreError::Backend { .. })
        | IpamRuntimeError::Agent(AgentError::Store(StoreError::Backend { .. })) => "unreachable",
        IpamRuntimeError::Store(StoreError::Conflict { .. })
        | IpamRuntimeError::Agent(AgentError::Store(StoreError::Conflict { .. })) => "conflict",
        IpamRuntimeError::Store(StoreError::Decode { .. })
        | IpamRuntimeError::Agent(AgentError::Store(StoreError::Decode { .. })) => "decode",
        _ => "other",
    }
}

/// Renews the node's liveness lease for as long as the daemon runs. Failures are logged once
/// per outage; the operator frees the node's blocks only after the grace period.
async fn renew_node_lease(
    store: ClusterStore,
    node: String,
    duration: Duration,
    interval: Duration,
    own: Arc<OwnLease>,
    metrics: Arc<crate::metrics::Metrics>,
) {
    let name = node_lease_name(&node);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing_since: Option<std::time::Instant> = None;
    loop {
        tick.tick().await;
        let asked = std::time::Instant::now();
        let renewed = lease::renew(&store, &name, &node, duration).await;
        metrics
            .node_lease_renew_seconds
            .observe(asked.elapsed().as_secs_f64());
        crate::metrics::Metrics::result(
            &metrics.node_lease_renewals,
            if renewed.is_ok() { "ok" } else { "error" },
        );
        match renewed {
            Ok(()) => {
                // Counted from before the write: others may count from when they saw it.
                own.renewed(asked);
                tracing::debug!(
                    lease = name.as_str(),
                    took_ms = asked.elapsed().as_millis() as u64,
                    "node lease renewed"
                );
                if let Some(since) = failing_since.take() {
                    tracing::info!(
                        lease = name.as_str(),
                        after_ms = since.elapsed().as_millis() as u64,
                        "node lease renewed again"
                    );
                }
            }
            Err(e) => {
                if failing_since.is_none() {
                    failing_since = Some(std::time::Instant::now());
                    tracing::warn!(
                        lease = name.as_str(),
                        "cannot renew the node lease; the node keeps its blocks unless this lasts \
                         the grace period: {e}"
                    );
                }
            }
        }
    }
}

/// Reconciles the endpoint table with the datapath and logs what changed.
fn log_endpoint_report(endpoints: &Endpoints) {
    match endpoints.reconcile() {
        Ok(report) => {
            for owner in &report.vanished {
                tracing::info!(owner = owner.as_str(), "endpoint's veth is gone; forgotten");
            }
            for ip in &report.stale_entries {
                tracing::info!(%ip, "endpoint map entry without endpoint removed");
            }
            if report.adopted > 0 {
                tracing::info!(
                    count = report.adopted,
                    "pod datapath links adopted from the previous run"
                );
            }
        }
        Err(e) => tracing::error!("cannot reconcile pod endpoints with the datapath: {e}"),
    }
}
