//! The operators' election on a task of its own: it renews the lease every `renew_interval`
//! whatever the operator's passes are doing. In the operator's own loop a pass held the renewal
//! up: on an API server taking 50 writes a second, a pass writing LB-IPAM's statuses outlasted
//! the renewal deadline, and the operator re-acquired its leadership (and restored its state
//! from the store) every 10 s while 10,000 new Services waited for their IPs.
//!
//! The operator acts only while `Elected::leading` holds (until its deadline, which ends
//! `renew_deadline` after the last renewal), and starts a new term, restoring from the store,
//! whenever the election says it acquired the lease anew.

use std::time::{Duration, Instant};

use ipam_core::{
    resources::OPERATOR_LEASE,
    store::{
        Store,
        lease::{LeaderElection, Leadership},
    },
};
use tokio::{sync::watch, task::JoinHandle};

use crate::metrics::Observed;

/// Who leads the operators, as this replica last saw the lease.
pub use ipam_core::store::lease::Leader;

/// What the operator's loop knows of its leadership.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Elected {
    /// Until when this replica may act as the leader, if it leads.
    pub until: Option<Instant>,
    /// Counts the terms: a new one each time the lease is acquired anew.
    pub term: u64,
}

impl Elected {
    /// Whether this replica may act as the leader now.
    pub fn leading(&self) -> bool {
        self.until.is_some_and(|until| Instant::now() < until)
    }
}

/// The running election: its state, and the task (which hands the lease over when `stop`
/// turns true, then ends).
pub struct Election {
    pub elected: watch::Receiver<Elected>,
    pub task: JoinHandle<()>,
}

impl Election {
    /// No election: a single operator, which leads for as long as it runs.
    pub fn none() -> Self {
        let (_, elected) = watch::channel(Elected::default());
        Self {
            elected,
            task: tokio::spawn(async {}),
        }
    }
}

/// Starts electing `identity` with leases of `lease`; who leads goes to `leader`.
pub fn spawn<S: Store + 'static>(
    store: S,
    identity: String,
    lease: Duration,
    leader: watch::Sender<Leader>,
    observed: Observed,
    mut stop: watch::Receiver<bool>,
) -> Election {
    let (elected, receiver) = watch::channel(Elected::default());
    let task = tokio::spawn(async move {
        let mut election = LeaderElection::new(OPERATOR_LEASE, &identity, lease);
        let mut tick = crate::clock::ticker(election.renew_interval());
        let mut term = 0;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => {
                    if election.is_leading() {
                        hand_over(&store, &mut election).await;
                    }
                    elected.send_replace(Elected { until: None, term });
                    return;
                }
            }
            let stepped = step(&store, &mut election, &leader).await;
            if matches!(stepped, Ok(true)) {
                term += 1;
            }
            observed.health.set("store", stepped.map(|_| ()));
            observed
                .metrics
                .operator_leader
                .set(i64::from(election.is_leading()));
            elected.send_replace(Elected {
                until: election.leading_until(),
                term,
            });
        }
    });
    Election {
        elected: receiver,
        task,
    }
}

/// One step of the election; `Ok(true)` when this replica just acquired the lease.
async fn step<S: Store>(
    store: &S,
    election: &mut LeaderElection,
    leader: &watch::Sender<Leader>,
) -> Result<bool, String> {
    let identity = election.identity().to_owned();
    let identity = identity.as_str();
    let was_leading = election.is_leading();
    let stepped = election.step(store).await;
    leader.send_replace(match &stepped {
        Ok(Leadership::Leading { .. }) => Leader::Us,
        Ok(Leadership::Following { holder }) if !holder.is_empty() => Leader::Other(holder.clone()),
        Ok(Leadership::Following { .. }) | Err(_) => Leader::Unknown,
    });
    match stepped {
        Ok(Leadership::Leading { acquired }) => {
            if acquired {
                tracing::info!(
                    identity,
                    "leading the operators; restoring state before deciding"
                );
            }
            Ok(acquired)
        }
        Ok(Leadership::Following { holder }) => {
            if was_leading {
                tracing::warn!(
                    identity,
                    leader = holder.as_str(),
                    "no longer leading the operators"
                );
            }
            Ok(false)
        }
        Err(e) => {
            tracing::warn!(identity, "cannot renew the operator lease: {e}");
            if was_leading && !election.is_leading() {
                tracing::warn!(
                    identity,
                    "stopped leading: the lease could not be renewed in time"
                );
            }
            Err(format!("cannot reach the store: {e}"))
        }
    }
}

/// Gives the operator lease up on a clean stop, so another replica leads at once.
async fn hand_over<S: Store>(store: &S, election: &mut LeaderElection) {
    match election.release(store).await {
        Ok(()) => tracing::info!(
            identity = election.identity(),
            "operator leadership handed over"
        ),
        Err(e) => tracing::warn!(
            "cannot release the operator lease, another replica takes over when it lapses: {e}"
        ),
    }
}
