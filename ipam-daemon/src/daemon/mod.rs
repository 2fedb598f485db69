//! The `ipamd` main loop for the standalone role: keep the datapath in line with the
//! configuration, prove liveness to the responders, and run IPAM (operator and agent) when the
//! configuration has an `[ipam]` section.

pub mod endpoints;
mod host_network;
mod infra_state;
pub mod ipam;
mod pods;
pub mod status;

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use thiserror::Error;
use tokio::signal::unix::{SignalKind, signal};

use ipam_core::backoff::Backoff;

use crate::{
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
}

/// How often IPAM reconciles (operator and agent) in the standalone role.
const IPAM_PASS: Duration = Duration::from_millis(500);

/// Longest wait between two attempts at an interface that is not there yet.
const RETRY_CAP: Duration = Duration::from_secs(10);

/// Runs until SIGTERM or SIGINT. Pins stay in place on exit: the responders keep answering until
/// the liveness timeout passes, which is what lets a restart or upgrade go unnoticed.
pub async fn run(config_path: PathBuf) -> Result<(), DaemonError> {
    let mut config = Config::load(&config_path)?;
    let mut datapath =
        Datapath::open_with_log(&config.datapath.bpffs_root, config.datapath.ebpf_log_level)?;
    datapath.heartbeat(config.datapath.liveness_timeout())?;
    tracing::info!(
        root = %datapath.root().display(),
        ebpf_log_level = ?config.datapath.ebpf_log_level,
        "datapath loaded"
    );
    if let Some(log) = datapath.take_log() {
        tokio::spawn(drain_ebpf_log(log));
    }
    // Shared with the API (pod endpoints); every use is a few syscalls under the lock.
    let datapath = Arc::new(Mutex::new(datapath));

    let mut retry = Backoff::new(RETRY_CAP);
    let mut retry_at = apply(&datapath, &config, &mut retry)?;
    let mut ipam = match config.ipam.clone() {
        Some(settings) => {
            let runtime = ipam::IpamRuntime::start(settings.clone(), datapath.clone()).await?;
            // State is restored by now: every answer of the API reflects it.
            let listener = crate::api::server::bind(&settings.socket)?;
            tokio::spawn(crate::api::server::serve(listener, runtime.api_handler()));
            tracing::info!(socket = %settings.socket.display(), "API listening");
            Some(runtime)
        }
        None => None,
    };
    let mut ipam_pass = tokio::time::interval(IPAM_PASS);
    ipam_pass.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let mut terminate = signal(SignalKind::terminate()).map_err(DaemonError::Signal)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(DaemonError::Signal)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(DaemonError::Signal)?;
    let mut heartbeat = tokio::time::interval(config.datapath.heartbeat_interval());
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        let retry_sleep = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = heartbeat.tick() => {
                let beat = datapath.lock().expect("datapath lock").heartbeat(config.datapath.liveness_timeout());
                if let Err(e) = beat {
                    tracing::error!("cannot write heartbeat, responders will go silent: {e}");
                }
            }
            () = retry_sleep => {
                retry_at = apply(&datapath, &config, &mut retry)?;
            }
            _ = ipam_pass.tick(), if ipam.is_some() => {
                if let Some(runtime) = ipam.as_mut()
                    && let Err(e) = runtime.reconcile().await
                {
                    // Store trouble is retried on the next pass; the daemon does not exit.
                    tracing::error!("IPAM pass failed, retrying: {e}");
                }
            }
            _ = hangup.recv() => {
                match Config::load(&config_path) {
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
                        config = new;
                        heartbeat = tokio::time::interval(config.datapath.heartbeat_interval());
                        retry.reset();
                        retry_at = apply(&datapath, &config, &mut retry)?;
                    }
                    Err(e) => tracing::error!("keeping the running configuration: {e}"),
                }
            }
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    tracing::info!(
        "stopping; responders keep answering for up to {} ms, until the liveness timeout",
        config.datapath.liveness_timeout_ms
    );
    Ok(())
}

/// Reconciles once; returns when to try again if some interface could not be served.
fn apply(
    datapath: &Mutex<Datapath>,
    config: &Config,
    retry: &mut Backoff,
) -> Result<Option<tokio::time::Instant>, DaemonError> {
    let report = announcer::reconcile(&mut datapath.lock().expect("datapath lock"), config)?;
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
    for a in &report.attachments {
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
