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
    /// Closed, never open since the gossip started, with what it waits for.
    Starting(String),
    Open,
    /// Closed after it was open, with why (for logs and `ipamctl members`).
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
                FenceState::Starting(why) | FenceState::Closed(why) => Some(why.clone()),
            },
        }
    }

    /// Whether the fence has been open since the agent started, whether or not it is now: a
    /// watch merges an opening and a closing that follow each other into one change, so a
    /// task that looks late would miss the opening; this does not.
    pub fn has_opened(&self) -> bool {
        match self {
            Self::Lease(lease) => lease.renewed_once(),
            Self::Gossip(state) => !matches!(*state.borrow(), FenceState::Starting(_)),
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

    /// Whether the lease was ever renewed: the fence opened then.
    pub fn renewed_once(&self) -> bool {
        self.renewed.lock().expect("fence lock").is_some()
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

    /// A first opening closed again before a task looked is still known to have happened:
    /// the watch merges the two changes into one (the L2 owners start looking only after
    /// listing what they read), but a closing after an opening is `Closed`, not `Starting`.
    #[test]
    fn a_fence_that_opened_says_so_after_it_closed_again() {
        let (tx, rx) = watch::channel(FenceState::Starting("gossip starting".into()));
        let fence = Fence::Gossip(rx);
        assert!(!fence.has_opened());
        tx.send_replace(FenceState::Starting(
            "no other member heard from yet".into(),
        ));
        assert!(!fence.has_opened(), "closed before it ever opened");
        tx.send_replace(FenceState::Open);
        tx.send_replace(FenceState::Closed("no majority in view".into()));
        assert!(fence.has_opened() && !fence.may_answer());

        let lease = Arc::new(LeaseFence::new(Duration::from_secs(2)));
        let fence = Fence::Lease(lease.clone());
        assert!(!fence.has_opened());
        lease.renewed(Instant::now() - Duration::from_secs(5));
        assert!(fence.has_opened() && !fence.may_answer());
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

        let (tx, rx) = watch::channel(FenceState::Starting("gossip starting".into()));
        let mut fence = Fence::Gossip(rx);
        let waiting = tokio::spawn(async move { fence.opened().await });
        tx.send_replace(FenceState::Starting(
            "no other member heard from yet".into(),
        ));
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
