//! The status a node's agent publishes after every IPAM pass, for `ipamctl ipam status`: one
//! JSON file in its state directory, replaced whole, so a reader never sees half of it. The
//! agent writes it; the CLI reads it, with the agent running or not.

use std::{collections::BTreeMap, io, net::IpAddr, path::Path};

use serde::{Deserialize, Serialize};

use crate::{
    Cidr, Family, atomic_file, meta::Condition, pod::pool::IpamMode, resources::FamilyUsageStatus,
};

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
pub fn write_status(state_dir: &Path, status: &PublishedStatus) -> io::Result<()> {
    let json = serde_json::to_vec_pretty(status).expect("status serialises");
    atomic_file::replace(&state_dir.join(STATUS_FILE), &json).map(drop)
}

/// Reads the status the daemon published under `state_dir`.
pub fn read_status(state_dir: &Path) -> io::Result<PublishedStatus> {
    let bytes = std::fs::read(state_dir.join(STATUS_FILE))?;
    serde_json::from_slice(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}
