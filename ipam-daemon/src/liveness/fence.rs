//! The fencing rule's one home: whether this node may answer for its service IPs now.
//!
//! Two sources, one per way of knowing who is alive:
//! - **the store lease** (no `[gossip]`): answer only while the node's own lease was renewed
//!   within half the lease. Others take over only after a whole lease without a renewal, so the
//!   half between the two is the margin in which the old owner has gone silent.
//! - **the gossip** (`[gossip]`): answer only while the gossip's fence is open (see
//!   `ipam_gossip::contact`): the node hears other members and most of its probes are answered.
//!   The gossip task closes it; the heartbeat reacts at once by silencing the responders.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::sync::{Notify, watch};

/// Whether, and why not, this node may answer.
#[derive(Debug, Clone)]
pub enum Fence {
    Lease(Arc<LeaseFence>),
    Gossip(watch::Receiver<FenceState>),
}

/// The gossip fence's state as the gossip task last judged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceState {
    Open,
    /// Closed, with why (for logs and `ipamctl members`).
    Closed(String),
}

impl Fence {
    /// Whether this node may answer for its service IPs now.
    pub fn may_answer(&self) -> bool {
        match self {
            Self::Lease(lease) => lease.may_answer(),
            Self::Gossip(state) => *state.borrow() == FenceState::Open,
        }
    }

    /// Why this node may not answer, when it may not.
    pub fn why_silent(&self) -> Option<String> {
        match self {
            Self::Lease(lease) if !lease.may_answer() => {
                Some("node lease not renewed in time".to_owned())
            }
            Self::Lease(_) => None,
            Self::Gossip(state) => match &*state.borrow() {
                FenceState::Open => None,
                FenceState::Closed(why) => Some(why.clone()),
            },
        }
    }

    /// Waits until the fence may have changed: the gossip's at once; the lease's is polled.
    pub async fn changed(&mut self) {
        match self {
            Self::Lease(_) => std::future::pending().await,
            Self::Gossip(state) => {
                if state.changed().await.is_err() {
                    // The gossip task is gone (the daemon is stopping): nothing changes now.
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// Waits until this node may answer (at once if it may already).
    pub async fn opened(&mut self) {
        loop {
            match self {
                Self::Lease(lease) => {
                    // Registered before the check, so a renewal between the two is not missed.
                    let renewal = lease.renewals.notified();
                    if lease.may_answer() {
                        return;
                    }
                    renewal.await;
                }
                Self::Gossip(state) => {
                    if *state.borrow_and_update() == FenceState::Open {
                        return;
                    }
                    if state.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }
}

/// When this node last renewed its lease, and how long a lease lasts.
#[derive(Debug)]
pub struct LeaseFence {
    renewed: Mutex<Option<Instant>>,
    lease: Duration,
    /// Woken at every renewal, for those waiting for the fence to open.
    renewals: Notify,
}

impl LeaseFence {
    pub fn new(lease: Duration) -> Self {
        Self {
            renewed: Mutex::new(None),
            lease,
            renewals: Notify::new(),
        }
    }

    /// Records a renewal, counted from when it was asked for (others may count from when they
    /// saw it, which is later).
    pub fn renewed(&self, asked_at: Instant) {
        *self.renewed.lock().expect("fence lock") = Some(asked_at);
        self.renewals.notify_waiters();
    }

    /// Whether this node may answer for its service IPs now.
    pub fn may_answer(&self) -> bool {
        self.renewed
            .lock()
            .expect("fence lock")
            .is_some_and(|at| at.elapsed() < self.lease / 2)
    }

    /// How long a node's lease lasts: others count a node dead after this long unrenewed.
    pub fn lease(&self) -> Duration {
        self.lease
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_only_within_half_a_lease_of_a_renewal() {
        let fence = LeaseFence::new(Duration::from_secs(2));
        assert!(!fence.may_answer(), "never renewed");
        fence.renewed(Instant::now());
        assert!(fence.may_answer());
        fence.renewed(Instant::now() - Duration::from_millis(999));
        assert!(fence.may_answer());
        fence.renewed(Instant::now() - Duration::from_secs(1));
        assert!(!fence.may_answer(), "half a lease old");
    }

    #[tokio::test]
    async fn waiting_for_the_fence_to_open_ends_at_the_first_renewal_or_open_state() {
        let lease = Arc::new(LeaseFence::new(Duration::from_secs(2)));
        let mut fence = Fence::Lease(lease.clone());
        let waiting = tokio::spawn(async move { fence.opened().await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "never renewed");
        lease.renewed(Instant::now());
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("opened at the renewal")
            .unwrap();

        let (tx, rx) = watch::channel(FenceState::Closed("gossip starting".into()));
        let mut fence = Fence::Gossip(rx);
        let waiting = tokio::spawn(async move { fence.opened().await });
        tx.send_replace(FenceState::Closed("no other member heard from yet".into()));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "still closed");
        tx.send_replace(FenceState::Open);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("opened with the gossip's fence")
            .unwrap();
    }

    #[test]
    fn the_gossip_fence_is_what_the_gossip_task_last_said() {
        let (tx, rx) = watch::channel(FenceState::Closed("no other member heard from yet".into()));
        let fence = Fence::Gossip(rx);
        assert!(!fence.may_answer());
        assert_eq!(
            fence.why_silent().as_deref(),
            Some("no other member heard from yet")
        );
        tx.send_replace(FenceState::Open);
        assert!(fence.may_answer());
        assert_eq!(fence.why_silent(), None);
    }
}
