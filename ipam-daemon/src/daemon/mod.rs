//! The `ipamd` main loop, for each role:
//! - `standalone` (the default): everything in one process: datapath, node agent, and the
//!   operator (on a shared store it takes part in the operators' election);
//! - `agent`: one per node: datapath, node agent, liveness lease, local API; no operator;
//! - `operator`: the cluster-wide controllers, any number of replicas, one leading; no datapath.
//!
//! The datapath follows the configuration and proves liveness to the responders; IPAM runs when
//! the configuration has an `[ipam]` section.

pub mod endpoints;
mod host_network;
mod infra_state;
pub mod ipam;
mod pod_pools;
mod pods;
pub mod routes;
pub mod service_ips;
pub mod status;

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::{Notify, watch};

use thiserror::Error;
use tokio::signal::unix::{SignalKind, signal};

use ipam_core::backoff::Backoff;

use crate::{
    cluster::{
        ClusterStore,
        operator::{self as operator_role, OperatorSettings},
        store::OpenStoreError,
    },
    config::{Config, ConfigError},
    datapath::{Datapath, DatapathError, EbpfLog},
    l2::announcer::{self, AnnounceError, ReconcileReport},
    net::iface,
};

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
    Ipam(#[from] ipam::IpamRuntimeError),
    #[error(transparent)]
    Api(#[from] crate::api::server::ServerError),
    #[error(transparent)]
    Store(#[from] OpenStoreError),
    #[error(
        "the {role} role needs a store shared with the other nodes and operators: set [store] \
         kind = \"etcd\" with the members in [store.etcd] endpoints, or kind = \"kubernetes\""
    )]
    NeedsSharedStore { role: &'static str },
    #[error("the operator role needs an [ipam] section (mode and pools)")]
    OperatorWithoutIpam,
    #[error(transparent)]
    Mode(#[from] ipam_core::pool::ModeMismatch),
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
async fn check_mode(
    store: &ClusterStore,
    mode: ipam_core::pool::IpamMode,
) -> Result<(), DaemonError> {
    use ipam_core::{
        pool::check_mode,
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

/// How often the node's local IPAM pass runs (host device, routes, a pending block request).
const LOCAL_PASS: Duration = Duration::from_millis(500);

/// Longest wait between two attempts at an interface that is not there yet.
const RETRY_CAP: Duration = Duration::from_secs(10);

/// Runs until SIGTERM or SIGINT. Pins stay in place on exit: the responders keep answering until
/// the liveness timeout passes, which is what lets a restart or upgrade go unnoticed.
pub async fn run(config_path: PathBuf, role: Role) -> Result<(), DaemonError> {
    let config = Config::load(&config_path)?;
    if role != Role::Standalone && !config.store.kind.is_shared() {
        return Err(DaemonError::NeedsSharedStore { role: role.name() });
    }
    let observed = ipam::Observed::default();
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
    run_node(config_path, config, role, observed).await
}

/// Signals that stop or reload the daemon.
struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

enum SignalEvent {
    Stop,
    Reload,
}

impl Signals {
    fn install() -> Result<Self, DaemonError> {
        let install = |kind| signal(kind).map_err(DaemonError::Signal);
        Ok(Self {
            terminate: install(SignalKind::terminate())?,
            interrupt: install(SignalKind::interrupt())?,
            hangup: install(SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) -> SignalEvent {
        tokio::select! {
            _ = self.terminate.recv() => SignalEvent::Stop,
            _ = self.interrupt.recv() => SignalEvent::Stop,
            _ = self.hangup.recv() => SignalEvent::Reload,
        }
    }
}

/// The operator task beside the node's work, and how to reload and stop it.
struct OperatorTask {
    pools: watch::Sender<Vec<crate::config::PoolConfig>>,
    stop: watch::Sender<bool>,
    handle: tokio::task::JoinHandle<()>,
}

impl OperatorTask {
    fn spawn(store: ClusterStore, config: &Config, observed: ipam::Observed) -> Option<Self> {
        let ipam = config.ipam.as_ref()?;
        let (pools, pools_rx) = watch::channel(ipam.pools.clone());
        let (stop, stop_rx) = watch::channel(false);
        let settings = OperatorSettings {
            mode: ipam.mode,
            pools: ipam.pools.clone(),
            cluster: config.cluster.clone(),
            elect: store.is_shared(),
        };
        tracing::info!(
            store = store.describe(),
            elect = settings.elect,
            "operator starting"
        );
        let events = crate::cluster::events::Events::for_store(
            &store,
            "ipam-operator",
            &config.cluster.identity(),
        );
        let handle = tokio::spawn(operator_role::run(
            store, settings, pools_rx, stop_rx, observed, events,
        ));
        Some(Self {
            pools,
            stop,
            handle,
        })
    }

    fn reload(&self, config: &Config) {
        if let Some(ipam) = &config.ipam {
            let _ = self.pools.send(ipam.pools.clone());
        }
    }

    /// Stops the operator, giving it a moment to hand leadership over.
    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.handle).await;
    }
}

async fn run_operator(
    config_path: PathBuf,
    mut config: Config,
    observed: ipam::Observed,
) -> Result<(), DaemonError> {
    if config.ipam.is_none() {
        return Err(DaemonError::OperatorWithoutIpam);
    }
    let store = ClusterStore::open(&config.store_settings()).await?;
    check_mode(&store, config.ipam.as_ref().expect("checked above").mode).await?;
    let task = OperatorTask::spawn(store, &config, observed).expect("checked above");
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
        pools = config.ipam.map_or(0, |i| i.pools.len()),
        "operator stopping"
    );
    task.stop().await;
    Ok(())
}

async fn run_node(
    config_path: PathBuf,
    mut config: Config,
    role: Role,
    observed: ipam::Observed,
) -> Result<(), DaemonError> {
    config.check_fencing(&config_path)?;
    let mut datapath =
        Datapath::open_with_log(&config.datapath.bpffs_root, config.datapath.ebpf_log_level)?;
    datapath.heartbeat(config.datapath.liveness_timeout())?;
    tracing::info!(
        role = role.name(),
        root = %datapath.root().display(),
        ebpf_log_level = ?config.datapath.ebpf_log_level,
        "datapath loaded"
    );
    observed.health.set("datapath", Ok(()));
    if let Some(log) = datapath.take_log() {
        tokio::spawn(drain_ebpf_log(log));
    }
    // Shared with the API (pod endpoints); every use is a few syscalls under the lock.
    let datapath = Arc::new(Mutex::new(datapath));

    let mut retry = Backoff::new(RETRY_CAP);
    let mut retry_at = apply(&datapath, &config, None, &mut retry)?;
    let mut operator = None;
    let mut ipam = match config.ipam.clone() {
        Some(settings) => {
            let store = ClusterStore::open(&config.store_settings()).await?;
            check_mode(&store, settings.mode).await?;
            if role == Role::Standalone {
                operator = OperatorTask::spawn(store.clone(), &config, observed.clone());
            }
            let runtime = ipam::IpamRuntime::start(
                settings.clone(),
                store,
                &config.cluster,
                datapath.clone(),
                observed.clone(),
            )
            .await?;
            // State is restored by now: every answer of the API reflects it.
            let listener = crate::api::server::bind(&settings.socket)?;
            tokio::spawn(crate::api::server::serve(listener, runtime.api_handler()));
            tracing::info!(socket = %settings.socket.display(), "API listening");
            Some(runtime)
        }
        None => None,
    };
    let wake: Option<Arc<Notify>> = ipam.as_ref().map(|r| r.wake());
    let cluster = ipam.as_ref().and_then(|r| r.cluster());
    let mut silenced = false;
    let mut local_pass = tokio::time::interval(LOCAL_PASS);
    local_pass.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut resync = tokio::time::interval(config.cluster.resync());
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let mut signals = Signals::install()?;
    let mut heartbeat = tokio::time::interval(config.datapath.heartbeat_interval());
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        let retry_sleep = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let woken = async {
            match &wake {
                Some(w) => w.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = heartbeat.tick() => {
                // Fencing: without a fresh node lease the responders go silent, before any
                // other node may take this node's service IPs over.
                if let Some(c) = &cluster && !c.may_answer() {
                    if !silenced {
                        tracing::warn!("node lease not renewed in time: responders go silent until it is");
                        silenced = true;
                    }
                    continue;
                }
                if std::mem::take(&mut silenced) {
                    tracing::info!("node lease renewed: responders answer again");
                }
                let beat = datapath.lock().expect("datapath lock").heartbeat(config.datapath.liveness_timeout());
                if let Err(e) = beat {
                    tracing::error!("cannot write heartbeat, responders will go silent: {e}");
                }
            }
            () = async {
                match &cluster {
                    Some(c) => c.announcements.changed().await,
                    None => std::future::pending().await,
                }
            } => {
                let t = std::time::Instant::now();
                retry_at = apply(&datapath, &config, cluster.as_ref(), &mut retry)?;
                if t.elapsed() > Duration::from_millis(20) {
                    tracing::debug!(took_ms = t.elapsed().as_millis() as u64, "slow announcement apply");
                }
            }
            () = retry_sleep => {
                retry_at = apply(&datapath, &config, cluster.as_ref(), &mut retry)?;
            }
            _ = local_pass.tick(), if ipam.is_some() => {
                if let Some(runtime) = ipam.as_mut() {
                    let t = std::time::Instant::now();
                    runtime.local_pass().await;
                    if t.elapsed() > Duration::from_millis(20) {
                        // The runtime runs the API and the controllers too: say when it stalls.
                        tracing::debug!(took_ms = t.elapsed().as_millis() as u64, "slow local pass");
                    }
                }
            }
            () = woken => {
                if let Some(runtime) = ipam.as_mut() {
                    runtime.store_pass().await;
                }
            }
            _ = resync.tick(), if ipam.is_some() => {
                if let Some(runtime) = ipam.as_mut() {
                    runtime.store_pass().await;
                }
            }
            event = signals.next() => match event {
                SignalEvent::Stop => break,
                SignalEvent::Reload => match Config::load(&config_path) {
                    Ok(new) if new.datapath.bpffs_root != config.datapath.bpffs_root => {
                        tracing::error!(
                            "not reloading {}: datapath.bpffs_root changed, which needs a restart",
                            config_path.display()
                        );
                    }
                    Ok(new) => {
                        tracing::info!(config = %config_path.display(), "configuration reloaded");
                        if let (Some(runtime), Some(settings)) = (ipam.as_mut(), new.ipam.clone())
                            && let Err(e) = runtime.reload(settings).await
                        {
                            tracing::error!("IPAM reload failed: {e}");
                        }
                        if let Some(op) = &operator {
                            op.reload(&new);
                        }
                        config = new;
                        heartbeat = tokio::time::interval(config.datapath.heartbeat_interval());
                        retry.reset();
                        retry_at = apply(&datapath, &config, cluster.as_ref(), &mut retry)?;
                    }
                    Err(e) => tracing::error!("keeping the running configuration: {e}"),
                },
            },
        }
    }
    if let Some(op) = operator {
        op.stop().await;
    }
    tracing::info!(
        "stopping; responders keep answering for up to {} ms, until the liveness timeout",
        config.datapath.liveness_timeout_ms
    );
    Ok(())
}

/// Reconciles once (the configured announcements and, in a cluster, the service IPs this node
/// owns); returns when to try again if some interface could not be served.
fn apply(
    datapath: &Mutex<Datapath>,
    config: &Config,
    cluster: Option<&ipam::ClusterParts>,
    retry: &mut Backoff,
) -> Result<Option<tokio::time::Instant>, DaemonError> {
    let mut wanted = config.clone();
    if let Some(c) = cluster {
        for a in c.announcements.wanted() {
            if !wanted.announcements.contains(&a) {
                wanted.announcements.push(a);
            }
        }
    }
    let report = announcer::reconcile(&mut datapath.lock().expect("datapath lock"), &wanted)?;
    log_report(&report);
    if report.failed.is_empty() {
        retry.reset();
        return Ok(None);
    }
    let delay = retry.next_delay();
    for (interface, error) in &report.failed {
        tracing::warn!(
            interface = interface.as_str(),
            retry_in_ms = delay.as_millis() as u64,
            "waiting for interface: {error}"
        );
    }
    Ok(Some(tokio::time::Instant::now() + delay))
}

/// Moves the eBPF programs' log records into the daemon's log as they arrive. Runs for the life
/// of the process, which keeps the ring buffer (and so the programs' reference to it) alive.
async fn drain_ebpf_log(log: EbpfLog) {
    // SAFETY: the ring buffer's fd is owned by `log`, which the AsyncFd owns from here on; it
    // stays open and the same for the AsyncFd's whole life.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(log, tokio::io::Interest::READABLE)
    };
    let mut ready = match registered {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!("cannot watch the eBPF log ring buffer ({e}); eBPF log lines are lost");
            return;
        }
    };
    loop {
        match ready.readable_mut().await {
            Ok(mut guard) => {
                guard.get_inner_mut().flush();
                guard.clear_ready();
            }
            Err(e) => {
                tracing::warn!("eBPF log ring buffer failed ({e}); eBPF log lines are lost");
                return;
            }
        }
    }
}

fn log_report(report: &ReconcileReport) {
    for a in report.attachments.iter().filter(|a| !a.kept) {
        tracing::info!(
            interface = a.interface.as_str(),
            form = a.form.name(),
            adopted = a.adopted,
            "responder attached"
        );
        if let Some(caveat) = a.caveat() {
            tracing::warn!(interface = a.interface.as_str(), "{caveat}");
        }
    }
    for (ip, interface) in &report.announced {
        tracing::info!(%ip, interface = interface.as_str(), "announcing (gratuitous announcement sent)");
    }
    for (ip, ifindex) in &report.withdrawn {
        tracing::info!(%ip, interface = iface::name(*ifindex), "withdrawn");
    }
    for interface in &report.detached {
        tracing::info!(interface = interface.as_str(), "responder detached");
    }
    if !report.kept.is_empty() {
        tracing::info!(
            count = report.kept.len(),
            "announcements kept from the previous run"
        );
    }
}
