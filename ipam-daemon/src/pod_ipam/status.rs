//! The status the daemon publishes after every IPAM pass, for `ipamctl ipam status`: one JSON
//! file in the state directory, replaced whole, so a reader never sees half of it.

use std::{collections::BTreeMap, io, net::IpAddr, path::Path};

use ipam_core::pod::agent::NodeAgent;
use ipam_core::{
    Cidr, Family, atomic_file, meta::Condition, pod::pool::IpamMode, resources::FamilyUsageStatus,
};
use serde::{Deserialize, Serialize};

use super::{IpamRuntimeError, PodIpam, infra::InfraState};

/// What `ipamctl ipam status` shows; written to `<state_dir>/status.json` after every pass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishedStatus {
    pub node: String,
    pub mode: Option<IpamMode>,
    pub pools: Vec<PoolSummary>,
    pub node_blocks: Vec<Cidr>,
    pub node_conditions: Vec<Condition>,
    /// purpose -> family -> address, e.g. router -> v4 -> 10.244.0.1.
    pub infra: BTreeMap<String, BTreeMap<Family, IpAddr>>,
    /// What the infra allocation waits for, if it waits.
    pub waiting: Option<String>,
    pub allocations: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolSummary {
    pub name: String,
    pub conditions: Vec<Condition>,
    pub usage: Vec<FamilyUsageStatus>,
}

pub const STATUS_FILE: &str = "status.json";

/// Publishes `status` under `state_dir`.
fn write_status(state_dir: &Path, status: &PublishedStatus) -> io::Result<()> {
    let json = serde_json::to_vec_pretty(status).expect("status serialises");
    atomic_file::replace(&state_dir.join(STATUS_FILE), &json).map(drop)
}

/// Reads the status the daemon published under `state_dir`.
pub fn read_status(state_dir: &Path) -> std::io::Result<PublishedStatus> {
    let bytes = std::fs::read(state_dir.join(STATUS_FILE))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

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
