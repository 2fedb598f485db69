//! The `ipamd` main loop, for each role:
//! - `standalone` (the default): everything in one process: datapath, node agent, and the
//!   operator (on a shared store it takes part in the operators' election);
//! - `agent`: one per node: datapath, node agent, liveness lease, local API; no operator;
//! - `operator`: the cluster-wide controllers, any number of replicas, one leading; no datapath.
//!
//! This module only wires the controllers together (`node.rs` for the node's, `operator_task.rs`
//! for the operator's); each controller lives in its own module with typed inputs and outputs
//! (see docs/architecture.md).

mod node;
mod operator_task;
mod signals;

use std::path::PathBuf;

use ipam_config::{Config, ConfigError};
use ipam_datapath::DatapathError;
use ipam_store::OpenStoreError;
use thiserror::Error;

use self::{
    operator_task::OperatorTask,
    signals::{SignalEvent, Signals},
};
use crate::{cluster::ClusterStore, l2::announcer::AnnounceError, metrics::Observed};

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    #[error(transparent)]
    Announce(#[from] AnnounceError),
    #[error("cannot install signal handler: {0}")]
    Signal(std::io::Error),
    #[error(transparent)]
    Ipam(#[from] crate::pod_ipam::IpamRuntimeError),
    #[error(transparent)]
    Api(#[from] crate::api::server::ServerError),
    #[error(transparent)]
    Store(#[from] OpenStoreError),
    #[error(
        "the {role} role needs a store shared with the other nodes and operators: set [store] \
         kind = \"etcd\" with the members in [store.etcd] endpoints, or kind = \"kubernetes\""
    )]
    NeedsSharedStore { role: &'static str },
    #[error(
        "the cluster's store records the pod IPAM mode {mode}, and this configuration has no \
         [ipam] section (the add-on mode: Service IPs only): its operator would leave pods \
         without blocks and its nodes would take blocks they never use; add the [ipam] section \
         the cluster's other nodes and operators have, or use a store of its own (another \
         [store.etcd] prefix or [store.kubernetes] namespace)"
    )]
    AddOnOverPodIpam { mode: &'static str },
    #[error(transparent)]
    Mode(#[from] ipam_core::pod::pool::ModeMismatch),
    #[error("the {0} controller ended; restarting the daemon restores it")]
    ControllerEnded(&'static str),
    #[error(
        "cannot serve metrics on {address}: {source}; change [metrics] listen or free the port"
    )]
    Metrics {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// Refuses to start with another IPAM mode than the cluster's (that needs a migration, not a
/// restart). An unreachable store does not stop the start: the node serves from its blocks,
/// and the operator records the mode once it can.
pub(crate) async fn check_mode(
    store: &ClusterStore,
    mode: ipam_core::pod::pool::IpamMode,
) -> Result<(), DaemonError> {
    use ipam_core::{
        pod::pool::check_mode,
        resources::{CLUSTER, IpamConfig},
        store::TypedStore as _,
    };
    match store.get_typed::<IpamConfig>(CLUSTER).await {
        Ok(recorded) => Ok(check_mode(recorded.map(|r| r.value.mode), mode)?),
        Err(e) => {
            tracing::warn!(
                store = store.describe(),
                "cannot read the cluster's IPAM mode yet; checking it once the store answers: {e}"
            );
            Ok(())
        }
    }
}

/// Refuses the add-on mode (no `[ipam]`) in a cluster whose store records a pod IPAM mode: the
/// two cannot share a store. As `check_mode`, an unreachable store does not stop the start.
pub(crate) async fn check_add_on(store: &ClusterStore) -> Result<(), DaemonError> {
    use ipam_core::{
        resources::{CLUSTER, IpamConfig},
        store::TypedStore as _,
    };
    match store.get_typed::<IpamConfig>(CLUSTER).await {
        Ok(Some(recorded)) => Err(DaemonError::AddOnOverPodIpam {
            mode: recorded.value.mode.name(),
        }),
        Ok(None) => Ok(()),
        Err(e) => {
            tracing::warn!(
                store = store.describe(),
                "cannot read whether the cluster runs pod IPAM yet; going on in the add-on mode: {e}"
            );
            Ok(())
        }
    }
}

/// Which part of the system this process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Role {
    /// Datapath, node agent and operator in one process.
    #[default]
    Standalone,
    /// One per node: datapath and node agent.
    Agent,
    /// Cluster-wide controllers; replicas elect one leader.
    Operator,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Self::Standalone => "standalone",
            Self::Agent => "agent",
            Self::Operator => "operator",
        }
    }
}

/// Runs until SIGTERM or SIGINT. Pins stay in place on exit: the responders keep answering until
/// the liveness timeout passes, which is what lets a restart or upgrade go unnoticed.
pub async fn run(config_path: PathBuf, role: Role) -> Result<(), DaemonError> {
    let config = Config::load(&config_path)?;
    if role != Role::Standalone && !config.store.kind.is_shared() {
        return Err(DaemonError::NeedsSharedStore { role: role.name() });
    }
    let observed = Observed::default();
    if let Some(address) = config.metrics.listen {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|source| DaemonError::Metrics { address, source })?;
        tracing::info!(%address, "metrics and health endpoints listening (/metrics, /healthz, /readyz)");
        tokio::spawn(crate::metrics::serve(
            listener,
            observed.metrics.clone(),
            observed.health.clone(),
        ));
    }
    if role == Role::Operator {
        return run_operator(config_path, config, observed).await;
    }
    node::run(config_path, config, role, observed).await
}

/// The store of either role, with its shared watches counted in the metrics.
async fn open_store(config: &Config, observed: &Observed) -> Result<ClusterStore, DaemonError> {
    let store = ClusterStore::open(&config.store_settings()).await?;
    store.count_watches_in(observed);
    Ok(store)
}

async fn run_operator(
    config_path: PathBuf,
    mut config: Config,
    observed: Observed,
) -> Result<(), DaemonError> {
    let store = open_store(&config, &observed).await?;
    match &config.ipam {
        Some(ipam) => check_mode(&store, ipam.mode).await?,
        None => {
            check_add_on(&store).await?;
            tracing::info!("add-on mode (no [ipam]): LB-IPAM only, no pod IPAM");
        }
    }
    let task = OperatorTask::spawn(store, &config, observed);
    let mut signals = Signals::install()?;
    loop {
        match signals.next().await {
            SignalEvent::Stop => break,
            SignalEvent::Reload => match Config::load(&config_path) {
                Ok(new) => {
                    tracing::info!(config = %config_path.display(), "configuration reloaded");
                    task.reload(&new);
                    config = new;
                }
                Err(e) => tracing::error!("keeping the running configuration: {e}"),
            },
        }
    }
    tracing::info!(
        pod_ip_pools = config.ipam.map_or(0, |i| i.pools.len()),
        "operator stopping"
    );
    task.stop().await;
    Ok(())
}
