//! Which nodes are alive, as this node sees them, from one of two sources:
//! - **leases** (no `[gossip]`): another node while its lease was renewed within a whole lease,
//!   as observed here (by the lease's revision changing, so clocks between nodes do not
//!   matter); this node itself while its fence allows and the watch has brought its own latest
//!   renewal (its view of the others is current). Every agent watches every Lease.
//! - **gossip**: the members the gossip holds alive (suspects included: a suspicion that is
//!   refuted in time moves nothing), mapped to nodes by their records' addresses. This node
//!   counts itself alive: whether it may *answer* is the fence's business, and a brief closing
//!   of it must not move IPs away and back. No Lease is watched.

use std::{sync::Arc, time::Instant};

use ipam_core::{
    resources::node_lease_name,
    store::{
        Watch,
        lease::{Lease, LeaseObserver},
    },
};
use tokio::sync::watch;

use super::{fence::LeaseFence, gossip::Membership};
use crate::cluster::{
    ClusterStore,
    cache::{Cache, watch_until_it_works},
};

/// Who is alive, by node name.
pub enum LivePeers {
    Leases(LeasePeers),
    Gossip {
        me: String,
        membership: watch::Receiver<Membership>,
    },
}

/// Where `LivePeers` learns who is alive.
pub enum PeersSource {
    Leases(Arc<LeaseFence>),
    Gossip(watch::Receiver<Membership>),
}

impl LivePeers {
    /// Starts following `source` (for leases, waiting with backoff until the store answers).
    pub async fn start(source: PeersSource, store: &ClusterStore, me: String) -> Self {
        match source {
            PeersSource::Leases(fence) => Self::Leases(LeasePeers::follow(store, me, fence).await),
            PeersSource::Gossip(membership) => Self::Gossip { me, membership },
        }
    }

    /// Waits for the next change of who is alive; `true` when it is worth deciding at once (a
    /// death or a return in the gossip), `false` for a lease renewal, which only updates the
    /// copy (renewals come by the thousand, and a lapse is noticed on the controller's tick).
    pub async fn changed(&mut self) -> bool {
        match self {
            Self::Leases(leases) => {
                leases.changed().await;
                false
            }
            Self::Gossip { membership, .. } => {
                if membership.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
                true
            }
        }
    }

    /// Whether this node has heard of any other alive yet: with the gossip, not before it has
    /// joined (the leases are read from the store, and always count).
    pub fn knows_others(&self) -> bool {
        match self {
            Self::Leases(_) => true,
            Self::Gossip { me, membership } => membership.borrow().live.iter().any(|n| n != me),
        }
    }

    /// Whether who is alive changes with time alone (a lease lapses with no event), so that
    /// the same inputs may decide differently later; the gossip says each change.
    pub fn decays(&self) -> bool {
        matches!(self, Self::Leases(_))
    }

    /// Whether `node` counts as alive at `now`.
    pub fn is_live(&mut self, node: &str, now: Instant) -> bool {
        match self {
            Self::Leases(leases) => leases.is_live(node, now),
            Self::Gossip { me, membership } => {
                node == me.as_str() || membership.borrow().live.contains(node)
            }
        }
    }
}

/// The nodes' leases as this node follows them.
pub struct LeasePeers {
    me: String,
    fence: Arc<LeaseFence>,
    watch: Watch,
    leases: Cache<Lease>,
    observer: LeaseObserver,
}

impl LeasePeers {
    /// Starts following the leases (waiting, with backoff, until the store answers).
    async fn follow(store: &ClusterStore, me: String, fence: Arc<LeaseFence>) -> Self {
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
    async fn changed(&mut self) {
        let event = self.watch.next().await;
        self.leases.apply(event);
    }

    fn is_live(&mut self, node: &str, now: Instant) -> bool {
        let lease = node_lease_name(node);
        let held = self.leases.get(&lease);
        self.observer
            .observe(&lease, held.map(|l| &l.revision), now);
        let unchanged = self.observer.unchanged_for(&lease, now);
        if node == self.me {
            // Live only with a current view of the others as well: the watch that brings their
            // renewals has brought this node's own latest one. A node whose renewals succeed
            // while its watch is stalled (a reconnect, a slow relist) would otherwise see every
            // other lease lapse and claim every IP. Half a lease: the others' last renewals
            // seen before the stall are at most a renewal interval (a third of a lease) older
            // than this node's, so it falls out of its own view before they do.
            return self.fence.may_answer() && held.is_some() && unchanged < self.fence.lease() / 2;
        }
        held.is_some() && unchanged < self.fence.lease()
    }
}
