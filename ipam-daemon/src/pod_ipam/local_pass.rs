//! The local pass, twice a second: the host device and routes, endpoint checks, the node's
//! facts, the pools pods asked for, and a store pass when an allocation waits for a block.

use std::{net::IpAddr, sync::atomic::Ordering};

use ipam_core::pod::node::ROUTER_OWNER;

use super::{PodIpam, log_endpoint_report, pools::PoolAllocator, restore::open_agent};

/// Endpoints are checked against the node's interfaces every this many passes (pods deleted
/// without CNI DEL leave entries behind until then).
const ENDPOINT_CHECK_PASSES: u64 = 20;

/// The node's addresses between nodes are looked up every this many local passes.
const ADDRESS_CHECK_PASSES: u64 = 10;

impl PodIpam {
    /// The local pass, twice a second: the host device and routes, endpoint checks, and a
    /// store pass when an allocation found no block (or a failed one's backoff is over).
    pub async fn local_pass(&mut self) {
        let routers: Vec<IpAddr> = self
            .infra
            .lock()
            .expect("infra lock")
            .addresses
            .get(ROUTER_OWNER)
            .map(|m| m.values().copied().collect())
            .unwrap_or_default();
        self.host
            .sync(&routers, &self.settings.families, &self.datapath);
        self.passes += 1;
        if self.passes.is_multiple_of(ENDPOINT_CHECK_PASSES) {
            log_endpoint_report(&self.endpoints);
        }
        if let Err(e) = self.publish() {
            tracing::warn!("cannot publish the IPAM status: {e}");
        }
        self.observe();
        let node_changed = self
            .kube_node
            .node
            .as_mut()
            .is_some_and(|n| n.has_changed().unwrap_or(false));
        if node_changed {
            self.take_pod_cidrs();
        }
        if node_changed || self.passes % ADDRESS_CHECK_PASSES == 1 || self.facts_due {
            self.facts_due = false;
            let facts = self.node_facts();
            crate::node_record::eligibility::report(
                &self.settings.node_name,
                &self.agents.facts.announcing,
                &facts.announcing,
                &self.observed.health,
            );
            crate::node_record::report_interfaces(
                &self.settings.node_name,
                &self.agents.facts,
                &facts,
                &self.observed.metrics,
            );
            if facts != self.agents.facts {
                tracing::info!(
                    addresses = ?facts.addresses,
                    interfaces = ?facts.interfaces.iter().map(|i| &i.name).collect::<Vec<_>>(),
                    "node facts published"
                );
                self.agents.facts = facts.clone();
                for agent in self.agents.by_pool.values_mut() {
                    agent.set_facts(facts.clone());
                }
                self.store_pass().await;
            }
        }
        let opened = self.open_wanted_pools();
        let demand = self.demand();
        let retry_due = self
            .sync
            .retry_at
            .is_some_and(|at| tokio::time::Instant::now() >= at);
        let new_demand = demand && self.sync.demand_since.is_none();
        if new_demand {
            self.sync.demand_since = Some(tokio::time::Instant::now());
        }
        // A pool opened now asks for its block at once, even while another pool's request
        // is still waiting (its demand is not new, but this pool's is).
        if new_demand || opened || retry_due {
            self.store_pass().await;
        }
        if !demand && let Some(since) = self.sync.demand_since.take() {
            self.observed
                .metrics
                .block_request_wait_seconds
                .observe(since.elapsed().as_secs_f64());
        }
    }

    /// Whether an allocation of any pool waits for a block.
    pub(super) fn demand(&self) -> bool {
        self.agents
            .by_pool
            .values()
            .any(|a| a.demand().load(Ordering::SeqCst))
    }

    /// Opens the pools pods asked for since the last pass (multi-pool mode), each with a
    /// request for a block; whether it opened any.
    fn open_wanted_pools(&mut self) -> bool {
        let mut opened = false;
        for pool in self.agents.pod_pools.take_wanted() {
            if self.agents.by_pool.contains_key(&pool) {
                continue;
            }
            match open_agent(&self.settings, &pool) {
                Ok(mut agent) => {
                    agent.set_facts(self.agents.facts.clone());
                    agent.demand().store(true, Ordering::SeqCst);
                    self.agents
                        .pod_pools
                        .insert(&pool, PoolAllocator::of(&agent));
                    tracing::info!(
                        pool = pool.as_str(),
                        "a pod asked for pool {pool}: asking for a block of it"
                    );
                    self.agents.by_pool.insert(pool, agent);
                    opened = true;
                }
                Err(e) => tracing::error!(
                    pool = pool.as_str(),
                    "cannot open pool {pool} on this node: {e}"
                ),
            }
        }
        opened
    }
}
