//! The signals that stop (SIGTERM, SIGINT) or reload (SIGHUP) the daemon.

use tokio::signal::unix::{Signal, SignalKind, signal};

use super::DaemonError;

pub(super) struct Signals {
    terminate: Signal,
    interrupt: Signal,
    hangup: Signal,
}

pub(super) enum SignalEvent {
    Stop,
    Reload,
}

impl Signals {
    pub(super) fn install() -> Result<Self, DaemonError> {
        let install = |kind| signal(kind).map_err(DaemonError::Signal);
        Ok(Self {
            terminate: install(SignalKind::terminate())?,
            interrupt: install(SignalKind::interrupt())?,
            hangup: install(SignalKind::hangup())?,
        })
    }

    pub(super) async fn next(&mut self) -> SignalEvent {
        tokio::select! {
            _ = self.terminate.recv() => SignalEvent::Stop,
            _ = self.interrupt.recv() => SignalEvent::Stop,
            _ = self.hangup.recv() => SignalEvent::Reload,
        }
    }
}
