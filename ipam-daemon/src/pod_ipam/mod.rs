//! Pod IPAM on a node: the node agents over the configured store, the router and health
//! addresses, the local API's pod allocations, the host side of the pod network, and the status
//! published for `ipamctl ipam status`.
//!
//! The controller talks to the store when the store changes (a watch on its own record and the
//! pools), when an allocation found no block, and on a periodic resync: never once per pod. A
//! pod ADD is served from the node's blocks without any store round trip, so it works while the
//! store is down. Its passes, each in its own module:
//! - `restore`: the node's allocations, restored before anything else;
//! - `local_pass`: twice a second, the host network, endpoint checks, pools pods asked for;
//! - `store_pass`: the agents' sync with the store, retried with backoff;
//! - `node_facts`: what the node publishes about itself, and the Node's podCIDRs;
//! - `infra`: the router, health and ingress addresses;
//! - `observe`, `status`: metrics, readiness, and status.json;
//! - `api`, `pools`: the local API's pod allocations and the pools they come from;
//! - `host_network`: the host device, forwarding and the uplinks' pod program.

pub mod api;
pub mod host_network;
pub mod infra;
mod local_pass;
mod node_facts;
mod observe;
pub mod pools;
mod reserved;
mod restore;
pub mod status;
mod store_pass;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use ipam_config::IpamSettings;
use ipam_core::{
    pod::{
        agent::{AgentError, NodeAgent, NodeFacts},
        pool::IpamMode,
    },
    resources::{NodeIpam, PodIpPool},
    store::{Resource as _, StoreError},
};
use ipam_datapath::Datapath;
use tokio::sync::{Notify, watch};
use tracing::Instrument as _;

use self::{
    host_network::HostNetwork,
    infra::InfraState,
    node_facts::KubeNode,
    pools::{PodPools, PoolAllocator},
    restore::{mkdir, open_agent, pools_to_restore},
    status::StatusView,
    store_pass::StoreSync,
};
use crate::{
    api::server::Handler,
    cluster::{
        ClusterStore,
        changes::{Interest, wake_on_changes},
    },
    endpoints::Endpoints,
    metrics::Observed,
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

/// How often the local pass runs (host device, routes, a pending block request).
const LOCAL_PASS: Duration = Duration::from_millis(500);

/// The node's agents, one per pool its pods take addresses from.
struct Agents {
    /// The node's own pool (`infra_pool`) first among them; more only in multi-pool mode.
    by_pool: BTreeMap<String, NodeAgent>,
    /// The pools' allocators as the API handler sees them.
    pod_pools: Arc<PodPools>,
    /// What the node published about itself last.
    facts: NodeFacts,
}

/// The pod IPAM controller of a node.
pub struct PodIpam {
    observed: Observed,
    settings: IpamSettings,
    store: ClusterStore,
    agents: Agents,
    sync: StoreSync,
    infra: Arc<Mutex<InfraState>>,
    status: StatusView,
    kube_node: KubeNode,
    datapath: Arc<Mutex<Datapath>>,
    endpoints: Arc<Endpoints>,
    host: HostNetwork,
    passes: u64,
    /// A reload or a link changed what the node publishes about itself: look again on the
    /// next pass.
    facts_due: bool,
    /// The node's interfaces, as its record lists them.
    interfaces: crate::node_record::interfaces::Interfaces,
}

impl PodIpam {
    /// Restores the node state (before anything else: every later answer reflects it), and
    /// starts allocating the router and health addresses (waiting for a block if needed). Needs
    /// no store to be reachable.
    pub async fn start(
        settings: IpamSettings,
        store: ClusterStore,
        datapath: Arc<Mutex<Datapath>>,
        observed: Observed,
    ) -> Result<Self, IpamRuntimeError> {
        mkdir(&settings.state_dir)?;
        // The pods of this node, for their annotations: the pool they name (multi-pool mode)
        // and the addresses they ask for (every mode).
        let directory = store.kube().map(|s| s.follow_pods(&settings.node_name));
        let pod_pools = Arc::new(PodPools::new(
            &settings.infra_pool,
            settings.mode == IpamMode::MultiPool,
            directory,
        ));
        pod_pools.set_reserved(reserved::load(&settings.state_dir));
        let mut by_pool = BTreeMap::new();
        // The node's own pool, and in multi-pool mode every other pool it held addresses of
        // before a restart: all restored before anything else.
        for pool in pools_to_restore(&settings)? {
            let agent = open_agent(&settings, &pool)?;
            pod_pools.insert(&pool, PoolAllocator::of(&agent));
            by_pool.insert(pool, agent);
        }
        let endpoints = Arc::new(
            Endpoints::open(datapath.clone(), &settings.state_dir)
                .map_err(IpamRuntimeError::Endpoints)?,
        );
        log_endpoint_report(&endpoints);
        observed.health.set("restored", Ok(()));
        let kube_node = KubeNode {
            node: store.kube().map(|s| s.follow_node(&settings.node_name)),
            pod_cidrs: None,
        };
        let runtime = Self {
            kube_node,
            observed,
            host: HostNetwork::new(settings.host_device.clone(), settings.uplinks.clone()),
            settings,
            store,
            agents: Agents {
                by_pool,
                pod_pools,
                facts: NodeFacts::default(),
            },
            sync: StoreSync::default(),
            infra: Arc::new(Mutex::new(InfraState::default())),
            status: StatusView::default(),
            datapath,
            endpoints,
            passes: 0,
            facts_due: false,
            interfaces: Default::default(),
        };
        runtime.spawn_infra();
        Ok(runtime)
    }

    /// The handler of the local API: pod allocations for CNI attachments.
    pub fn api_handler(&self) -> Handler {
        let pods = api::PodAllocations {
            pools: self.agents.pod_pools.clone(),
            infra: self.infra.clone(),
            families: self.settings.families.clone(),
            endpoints: self.endpoints.clone(),
            gateway_ready: self.host.gateway_ready(),
            host_device: self.settings.host_device.clone(),
            metrics: self.observed.metrics.clone(),
        };
        Arc::new(move |request| pods.handle(request))
    }

    /// Reload: new uplinks, node labels, addresses and `[node.announce]` (a mode change needs
    /// a restart and is refused; pools go to the operator).
    fn reload(&mut self, settings: IpamSettings) {
        if settings.mode != self.settings.mode {
            tracing::error!(
                "not applying the new [ipam] section: the mode cannot change from {} to {} in a \
                 running cluster",
                self.settings.mode.name(),
                settings.mode.name()
            );
            return;
        }
        self.host.set_uplinks(settings.uplinks.clone());
        self.settings.pools = settings.pools;
        self.settings.uplinks = settings.uplinks;
        // Published by the next local pass (the exclusion label drains the node without a
        // restart).
        self.facts_due = settings.node_labels != self.settings.node_labels
            || settings.node_addresses != self.settings.node_addresses
            || settings.announce != self.settings.announce;
        self.settings.node_labels = settings.node_labels;
        self.settings.node_addresses = settings.node_addresses;
        self.settings.announce = settings.announce;
    }

    /// Runs the passes for the life of the daemon: the local pass twice a second, a store pass
    /// when the store has something for the node and on every resync. `settings` follows
    /// configuration reloads.
    pub async fn run(
        mut self,
        resync: Duration,
        mut settings: watch::Receiver<IpamSettings>,
        mut link_changes: watch::Receiver<u64>,
    ) {
        let wake: Arc<Notify> = wake_on_changes(
            self.store.clone(),
            vec![
                Interest::Named(NodeIpam::KIND, self.settings.node_name.clone()),
                Interest::All(PodIpPool::KIND),
            ],
        );
        let mut local = crate::clock::ticker(LOCAL_PASS);
        let mut resync = crate::clock::ticker(resync);
        let node = self.settings.node_name.clone();
        loop {
            tokio::select! {
                _ = local.tick() => {
                    let started = std::time::Instant::now();
                    self.local_pass()
                        .instrument(tracing::debug_span!("pod_ipam_local_pass", node = node.as_str()))
                        .await;
                    if started.elapsed() > Duration::from_millis(20) {
                        tracing::debug!(took_ms = started.elapsed().as_millis() as u64, "slow local pass");
                    }
                }
                // A link or an address changed: the node's facts (where it may announce)
                // and the host device are looked at now, not at the next recheck.
                _ = link_changes.changed() => {
                    self.facts_due = true;
                    self.local_pass()
                        .instrument(tracing::debug_span!("pod_ipam_local_pass", node = node.as_str()))
                        .await;
                }
                () = wake.notified() => self.store_pass_traced().await,
                _ = resync.tick() => self.store_pass_traced().await,
                changed = settings.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let new = settings.borrow_and_update().clone();
                    self.reload(new);
                }
            }
        }
    }

    async fn store_pass_traced(&mut self) {
        let span = tracing::debug_span!(
            "pod_ipam_store_pass",
            node = self.settings.node_name.as_str()
        );
        self.store_pass().instrument(span).await;
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
