//! Publishing the node's IPAM status after every pass (`ipam_core::pod::published`, for
//! `ipamctl ipam status`).

use ipam_core::{
    Family,
    pod::{
        agent::NodeAgent,
        published::{PoolSummary, PublishedStatus, STATUS_FILE, write_status},
    },
};

use super::{IpamRuntimeError, PodIpam, infra::InfraState};

/// What the status shows of the store, as last read, and what was last written.
#[derive(Default)]
pub(super) struct StatusView {
    /// What was last written to status.json: unchanged status is not written again.
    pub(super) published: Option<PublishedStatus>,
    /// The pools and the node's conditions as last read from the store.
    pub(super) pools: Vec<PoolSummary>,
    pub(super) node_conditions: Vec<ipam_core::meta::Condition>,
}

impl PodIpam {
    /// Writes status.json from the node's state and what was last read from the store.
    pub(super) fn publish(&mut self) -> Result<(), IpamRuntimeError> {
        let allocators: Vec<_> = self
            .agents
            .by_pool
            .values()
            .map(NodeAgent::allocator)
            .collect();
        let InfraState {
            addresses: infra,
            waiting,
        } = self.infra.lock().expect("infra lock").clone();
        let status = PublishedStatus {
            node: self.settings.node_name.clone(),
            mode: Some(self.settings.mode),
            pools: self.status.pools.clone(),
            node_blocks: allocators
                .iter()
                .flat_map(|alloc| {
                    alloc.with(|a| {
                        let mut b = a.blocks(Family::V4);
                        b.extend(a.blocks(Family::V6));
                        b
                    })
                })
                .collect(),
            node_conditions: self.status.node_conditions.clone(),
            infra,
            waiting,
            allocations: allocators
                .iter()
                .map(|alloc| alloc.with(|a| a.allocated(Family::V4) + a.allocated(Family::V6)))
                .sum(),
        };
        // Local passes run twice a second; the file changes only when the status does (or was
        // removed).
        let file = self.settings.state_dir.join(STATUS_FILE);
        if self.status.published.as_ref() == Some(&status) && file.exists() {
            return Ok(());
        }
        write_status(&self.settings.state_dir, &status).map_err(|source| {
            IpamRuntimeError::Dir {
                path: file.clone(),
                source,
            }
        })?;
        self.status.published = Some(status);
        Ok(())
    }
}
