//! The pass with the store: the agents' sync of the node's record, and what the status shows of
//! the store. A failed pass is retried with backoff; the node keeps serving from its blocks.

use std::{collections::BTreeMap, time::Duration};

use ipam_core::{
    backoff::Backoff,
    lb::resources::Namespace,
    pod::{agent::AgentError, multipool::Tenants, published::PoolSummary},
    resources::{NodeIpam, PodIpPool, PoolStatus},
    store::{StoreError, TypedStore as _},
};

use super::{IpamRuntimeError, PodIpam, reserved::PoolKeeps};

/// Longest wait between two store passes while the store is unreachable.
const STORE_RETRY_CAP: Duration = Duration::from_secs(10);

/// When the next store pass may run, and since when an allocation waits for a block.
pub(super) struct StoreSync {
    /// The last store pass failed: the next one waits for the backoff.
    pub(super) retry: Backoff,
    pub(super) retry_at: Option<tokio::time::Instant>,
    /// Since when an allocation has been waiting for a block (the demand flag was raised):
    /// the store pass that asks for it is made once, and the wait is measured.
    pub(super) demand_since: Option<tokio::time::Instant>,
}

impl Default for StoreSync {
    fn default() -> Self {
        Self {
            retry: Backoff::new(STORE_RETRY_CAP),
            retry_at: None,
            demand_since: None,
        }
    }
}

impl PodIpam {
    /// A pass with the store: the agent's sync and the published status. Failures are
    /// logged and retried with backoff; the node keeps serving from its blocks meanwhile.
    pub async fn store_pass(&mut self) {
        if self
            .sync
            .retry_at
            .is_some_and(|at| tokio::time::Instant::now() < at)
        {
            return;
        }
        let result = async {
            // One after the other: they share the node's record.
            for agent in self.agents.by_pool.values_mut() {
                agent.sync(&self.store).await?;
            }
            self.refresh_from_store().await
        }
        .await;
        match result {
            Ok(()) => {
                if self.sync.retry_at.take().is_some() {
                    tracing::info!(store = self.store.describe(), "store reachable again");
                }
                self.sync.retry.reset();
                self.observed.health.set("store", Ok(()));
            }
            Err(e) => {
                self.observed
                    .metrics
                    .store_errors
                    .get_or_create(&crate::metrics::KindLabel {
                        kind: store_error_kind(&e).to_owned(),
                    })
                    .inc();
                self.observed.health.set(
                    "store",
                    Err(format!("{} unreachable: {e}", self.store.describe())),
                );
                let delay = self.sync.retry.next_delay();
                tracing::warn!(
                    retry_in_ms = delay.as_millis() as u64,
                    "IPAM store pass failed (pods still get addresses from this node's blocks): {e}"
                );
                self.sync.retry_at = Some(tokio::time::Instant::now() + delay);
            }
        }
    }

    /// Reads what the status shows of the store (pools, the node's conditions).
    async fn refresh_from_store(&mut self) -> Result<(), IpamRuntimeError> {
        let pools = self.store.list_typed::<PodIpPool>().await?;
        self.agents.pod_pools.set_known(
            pools
                .iter()
                .map(|p| (p.name.clone(), Tenants::of(&p.value.spec)))
                .collect(),
        );
        // What the operator accepted: a pool change it refused (two reservations of one
        // address, one naming no namespace) keeps no one's addresses for anyone.
        let reserved: BTreeMap<String, PoolKeeps> = pools
            .iter()
            .filter_map(|p| {
                let accepted = p.value.status.accepted_spec.as_ref()?;
                Some((p.name.clone(), PoolKeeps::of(accepted)))
            })
            .collect();
        // The labels first, so that a selector never judges on labels older than itself.
        if self.agents.pod_pools.needs_namespaces(&reserved) {
            let namespaces = self.store.list_typed::<Namespace>().await?;
            self.agents
                .pod_pools
                .set_namespaces(namespaces.into_iter().map(|n| (n.name, n.value)).collect());
        }
        if self.agents.pod_pools.set_reserved(reserved) {
            // Kept across restarts: before its first look at the store, a restarted agent
            // must not hand a reserved address to a pod that did not ask for it, nor an
            // asked-for one to a pod it is not kept for.
            super::reserved::save(&self.settings.state_dir, &self.agents.pod_pools.reserved());
        }
        self.status.pools = pools
            .into_iter()
            .map(|p| {
                let PoolStatus {
                    conditions, usage, ..
                } = p.value.status;
                PoolSummary {
                    name: p.name,
                    conditions,
                    usage,
                }
            })
            .collect();
        self.status.node_conditions = self
            .store
            .get_typed::<NodeIpam>(&self.settings.node_name)
            .await?
            .map(|n| n.value.status.conditions)
            .unwrap_or_default();
        Ok(())
    }
}

/// A store error as a metric's label (a bounded set).
fn store_error_kind(e: &IpamRuntimeError) -> &'static str {
    match e {
        IpamRuntimeError::Store(StoreError::Backend { .. })
        | IpamRuntimeError::Agent(AgentError::Store(StoreError::Backend { .. })) => "unreachable",
        IpamRuntimeError::Store(StoreError::Conflict { .. })
        | IpamRuntimeError::Agent(AgentError::Store(StoreError::Conflict { .. })) => "conflict",
        IpamRuntimeError::Store(StoreError::Decode { .. })
        | IpamRuntimeError::Agent(AgentError::Store(StoreError::Decode { .. })) => "decode",
        _ => "other",
    }
}
