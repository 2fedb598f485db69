//! IPAM inside the standalone daemon: the embedded store, the mode check, pools from the
//! configuration, the operator and the node agent, the node's router and health addresses, and
//! the status it publishes for `ipamctl ipam status`.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, atomic::Ordering},
};

use ipam_core::{
    Family,
    agent::{AgentError, NodeAgent},
    backoff::Backoff,
    infra::{INFRA_RETRY_CAP, allocate_waiting},
    multipool::Watermarks,
    node::{HEALTH_OWNER, INGRESS_OWNER, ROUTER_OWNER},
    operator::{Operator, OperatorError, record_mode},
    resources::{NodeIpam, PodIpPool, PoolStatus},
    store::{StoreError, TypedStore, embedded::EmbeddedStore},
};

use super::{
    endpoints::Endpoints,
    host_network::HostNetwork,
    infra_state::InfraState,
    status::{PoolSummary, PublishedStatus, STATUS_FILE, write_status},
};
use crate::{api::server::Handler, config::IpamSettings, datapath::Datapath};

#[derive(Debug, thiserror::Error)]
pub enum IpamRuntimeError {
    #[error(transparent)]
    Operator(#[from] OperatorError),
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

pub struct IpamRuntime {
    settings: IpamSettings,
    store: Arc<EmbeddedStore>,
    operator: Operator,
    agent: NodeAgent,
    infra: Arc<Mutex<InfraState>>,
    /// What was last written to status.json: unchanged status is not written again.
    published: Option<PublishedStatus>,
    datapath: Arc<Mutex<Datapath>>,
    endpoints: Arc<Endpoints>,
    host: HostNetwork,
    passes: u64,
}

/// Endpoints are checked against the node's interfaces every this many passes (pods deleted
/// without CNI DEL leave entries behind until then).
const ENDPOINT_CHECK_PASSES: u64 = 20;

fn mkdir(path: &Path) -> Result<(), IpamRuntimeError> {
    std::fs::create_dir_all(path).map_err(|source| IpamRuntimeError::Dir {
        path: path.to_owned(),
        source,
    })
}

impl IpamRuntime {
    /// Opens the store and the node state, refuses a changed mode, writes the configured pools,
    /// and starts allocating the router and health addresses (waiting for a block if needed).
    pub async fn start(
        settings: IpamSettings,
        datapath: Arc<Mutex<Datapath>>,
    ) -> Result<Self, IpamRuntimeError> {
        if let Some(dir) = settings.store.parent() {
            mkdir(dir)?;
        }
        mkdir(&settings.state_dir)?;
        let store = Arc::new(EmbeddedStore::open(&settings.store)?);
        record_mode(&*store, settings.mode).await?;
        apply_pools(&*store, &settings).await?;
        let (agent, restored) = NodeAgent::open(
            &settings.state_dir,
            &settings.node_name,
            &settings.infra_pool,
            settings.mode,
            Watermarks {
                pre_allocate: settings.pre_allocate,
            },
            settings.pod_cidrs.clone(),
        )?;
        tracing::info!(
            node = settings.node_name.as_str(),
            mode = settings.mode.name(),
            blocks = restored.blocks,
            allocations = restored.allocations,
            "IPAM state restored"
        );
        let endpoints = Arc::new(
            Endpoints::open(datapath.clone(), &settings.state_dir)
                .map_err(IpamRuntimeError::Endpoints)?,
        );
        log_endpoint_report(&endpoints);
        let runtime = Self {
            operator: Operator::new(settings.mode),
            host: HostNetwork::new(settings.host_device.clone(), settings.uplinks.clone()),
            settings,
            store,
            agent,
            infra: Arc::new(Mutex::new(InfraState::default())),
            published: None,
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
        for family in self.settings.families.clone() {
            let alloc = self.agent.allocator();
            let demand = self.agent.demand();
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
            alloc: self.agent.allocator(),
            demand: self.agent.demand(),
            infra: self.infra.clone(),
            families: self.settings.families.clone(),
            pool: self.settings.infra_pool.clone(),
            endpoints: self.endpoints.clone(),
            gateway_ready: self.host.gateway_ready(),
            host_device: self.settings.host_device.clone(),
        };
        Arc::new(move |request| pods.handle(request))
    }

    /// Reload: new pools (a mode change needs a restart and is refused).
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
        apply_pools(&*self.store, &settings).await?;
        self.host.set_uplinks(settings.uplinks.clone());
        self.settings.pools = settings.pools;
        self.settings.uplinks = settings.uplinks;
        Ok(())
    }

    /// One pass of the operator and the agent, then the published status.
    pub async fn reconcile(&mut self) -> Result<(), IpamRuntimeError> {
        let report = self.operator.reconcile(&*self.store).await?;
        for (node, block) in &report.assigned {
            tracing::info!(node = node.as_str(), pool = block.pool.as_str(), cidr = %block.cidr, "block assigned");
        }
        self.agent.sync(&*self.store).await?;
        self.publish().await?;
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
        Ok(())
    }

    async fn publish(&mut self) -> Result<(), IpamRuntimeError> {
        let pools = self
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
        let node = self
            .store
            .get_typed::<NodeIpam>(&self.settings.node_name)
            .await?;
        let alloc = self.agent.allocator();
        let InfraState {
            addresses: infra,
            waiting,
        } = self.infra.lock().expect("infra lock").clone();
        let status = PublishedStatus {
            node: self.settings.node_name.clone(),
            mode: Some(self.settings.mode),
            pools,
            node_blocks: alloc.with(|a| {
                let mut b = a.blocks(Family::V4);
                b.extend(a.blocks(Family::V6));
                b
            }),
            node_conditions: node.map(|n| n.value.status.conditions).unwrap_or_default(),
            infra,
            waiting,
            allocations: alloc.with(|a| a.allocated(Family::V4) + a.allocated(Family::V6)),
        };
        // Passes run twice a second; the file changes only when the status does (or was removed).
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

/// Writes the configured pools into the store (creating or updating their specs).
async fn apply_pools<S: TypedStore>(
    store: &S,
    settings: &IpamSettings,
) -> Result<(), IpamRuntimeError> {
    for p in &settings.pools {
        loop {
            let result = match store.get_typed::<PodIpPool>(&p.name).await? {
                None => store
                    .create_typed(
                        &p.name,
                        &PodIpPool {
                            spec: p.spec.clone(),
                            status: PoolStatus::default(),
                        },
                    )
                    .await
                    .map(|_| ()),
                Some(cur) if cur.value.spec == p.spec => Ok(()),
                Some(cur) => {
                    let mut v = cur.value;
                    v.spec = p.spec.clone();
                    store
                        .update_typed(&p.name, &v, cur.revision)
                        .await
                        .map(|_| ())
                }
            };
            match result {
                Ok(()) => break,
                Err(StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
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
