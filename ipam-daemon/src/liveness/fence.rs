//! The fencing rule's one home: a node answers for service IPs only while its own lease was
//! renewed within half the lease. Others take over only after a whole lease without a renewal,
//! so the half between the two is the margin in which the old owner has gone silent.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

/// When this node last renewed its lease, and how long a lease lasts.
#[derive(Debug)]
pub struct Fence {
    renewed: Mutex<Option<Instant>>,
    lease: Duration,
}

impl Fence {
    pub fn new(lease: Duration) -> Self {
        Self {
            renewed: Mutex::new(None),
            lease,
        }
    }

    /// Records a renewal, counted from when it was asked for (others may count from when they
    /// saw it, which is later).
    pub fn renewed(&self, asked_at: Instant) {
        *self.renewed.lock().expect("fence lock") = Some(asked_at);
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
        let fence = Fence::new(Duration::from_secs(2));
        assert!(!fence.may_answer(), "never renewed");
        fence.renewed(Instant::now());
        assert!(fence.may_answer());
        fence.renewed(Instant::now() - Duration::from_millis(999));
        assert!(fence.may_answer());
        fence.renewed(Instant::now() - Duration::from_secs(1));
        assert!(!fence.may_answer(), "half a lease old");
    }
}
