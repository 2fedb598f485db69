//! Which nodes are alive, as this node sees them: itself while its fence allows, another node
//! while its lease was renewed within a whole lease, as observed here (by the lease's revision
//! changing, so clocks between nodes do not matter).

use std::{sync::Arc, time::Instant};

use ipam_core::{
    resources::node_lease_name,
    store::{
        Watch,
        lease::{Lease, LeaseObserver},
    },
};

use super::Fence;
use crate::cluster::{
    ClusterStore,
    cache::{Cache, watch_until_it_works},
};

/// The nodes' leases as this node follows them.
pub struct LivePeers {
    me: String,
    fence: Arc<Fence>,
    watch: Watch,
    leases: Cache<Lease>,
    observer: LeaseObserver,
}

impl LivePeers {
    /// Starts following the leases (waiting, with backoff, until the store answers).
    pub async fn follow(store: &ClusterStore, me: String, fence: Arc<Fence>) -> Self {
        let watch = watch_until_it_works::<Lease, _>(store, "node liveness").await;
        let leases = Cache::new(&watch.initial);
        Self {
            me,
            fence,
            watch,
            leases,
            observer: LeaseObserver::new(),
        }
    }

    /// Waits for the next change of a lease and takes it in.
    pub async fn changed(&mut self) {
        let event = self.watch.next().await;
        self.leases.apply(event);
    }

    /// Whether `node` counts as alive at `now`.
    pub fn is_live(&mut self, node: &str, now: Instant) -> bool {
        if node == self.me {
            return self.fence.may_answer();
        }
        let lease = node_lease_name(node);
        let held = self.leases.get(&lease);
        self.observer
            .observe(&lease, held.map(|l| &l.revision), now);
        held.is_some() && self.observer.unchanged_for(&lease, now) < self.fence.lease()
    }
}
