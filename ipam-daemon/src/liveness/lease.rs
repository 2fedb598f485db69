//! Renewing this node's liveness lease in the store, for as long as the daemon runs: one
//! conditional write per renewal. Without `[gossip]` the lease is how others know the node is
//! alive (renewed every third of it, and it feeds the fence); with it, the lease only says who
//! holds blocks (renewed every `node_renew_ms`, 10 s by default, like the kubelet's).
//!
//! The renewal runs on a thread of its own, with its own runtime and its own store connection:
//! nothing the rest of the daemon does (a slow netlink call, a program swap waiting for the
//! kernel) can delay it, and a delayed renewal would make the node look dead.

use std::{sync::Arc, time::Duration};

use ipam_core::{backoff::Backoff, resources::node_lease_name, store::lease::LeaseRenewal};

use tracing::Instrument as _;

use super::fence::LeaseFence;
use crate::{cluster::ClusterStore, metrics::Metrics};

/// Longest wait between two attempts to connect while the store is unreachable.
const CONNECT_RETRY_CAP: Duration = Duration::from_secs(10);

/// What the renewal needs.
pub struct Renewal {
    pub store: ClusterStore,
    pub node: String,
    pub interval: Duration,
    /// How long the lease lasts, as written in it.
    pub duration: Duration,
    /// The fence the renewals feed (without `[gossip]`).
    pub fence: Option<Arc<LeaseFence>>,
    pub metrics: Arc<Metrics>,
}

/// Starts renewing on a thread of its own.
pub fn spawn(renewal: Renewal) {
    let spawned = std::thread::Builder::new()
        .name("node-lease".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(
                        "cannot start the node lease's runtime: {e}; the node's responders stay \
                         silent and its blocks are reclaimed after the grace period"
                    );
                    return;
                }
            };
            runtime.block_on(async move {
                let store = connect(&renewal.store).await;
                renew(Renewal { store, ..renewal }).await;
            });
        });
    if let Err(e) = spawned {
        tracing::error!("cannot start the node lease's thread: {e}");
    }
}

/// A connection of the lease's own, retried until the store answers.
async fn connect(store: &ClusterStore) -> ClusterStore {
    let mut backoff = Backoff::new(CONNECT_RETRY_CAP);
    loop {
        match store.connect_again().await {
            Ok(s) => return s,
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::warn!(
                    retry_in_ms = delay.as_millis() as u64,
                    "cannot connect for the node lease: {e}"
                );
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Renews the lease every interval. Failures are logged once per outage; the operator frees the
/// node's blocks only after the grace period.
async fn renew(renewal: Renewal) {
    let Renewal {
        store,
        node,
        interval,
        duration,
        fence,
        metrics,
    } = renewal;
    let name = node_lease_name(&node);
    let mut lease = LeaseRenewal::new(&name, &node, duration);
    let mut tick = crate::clock::ticker(interval);
    let mut failing_since: Option<std::time::Instant> = None;
    loop {
        tick.tick().await;
        let asked = std::time::Instant::now();
        let renewed = lease
            .renew(&store)
            .instrument(tracing::debug_span!("node_lease", node = node.as_str()))
            .await;
        metrics
            .node_lease_renew_seconds
            .observe(asked.elapsed().as_secs_f64());
        Metrics::result(
            &metrics.node_lease_renewals,
            if renewed.is_ok() { "ok" } else { "error" },
        );
        match renewed {
            Ok(()) => {
                if let Some(fence) = &fence {
                    fence.renewed(asked);
                }
                tracing::debug!(
                    lease = name.as_str(),
                    took_ms = asked.elapsed().as_millis() as u64,
                    "node lease renewed"
                );
                if let Some(since) = failing_since.take() {
                    tracing::info!(
                        lease = name.as_str(),
                        after_ms = since.elapsed().as_millis() as u64,
                        "node lease renewed again"
                    );
                }
            }
            Err(e) => {
                if failing_since.is_none() {
                    failing_since = Some(std::time::Instant::now());
                    tracing::warn!(
                        lease = name.as_str(),
                        "cannot renew the node lease; the node keeps its blocks unless this lasts \
                         the grace period: {e}"
                    );
                }
            }
        }
    }
}
