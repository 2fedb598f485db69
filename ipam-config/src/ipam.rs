//! `[ipam]`: pod IP address management, its pools and the node's local API.

use std::{collections::BTreeMap, net::IpAddr, path::PathBuf};

use serde::Deserialize;

use ipam_core::{
    Cidr, Family,
    pod::pool::{IpamMode, PodIpPoolSpec},
};

use super::AnnounceSettings;

/// The `[ipam]` section (standalone role: operator and agent in this process, embedded store).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpamSettings {
    pub mode: IpamMode,
    /// This node's name in the cluster state (`[node] name`, which see; resolved on load).
    #[serde(default)]
    pub node_name: String,
    /// The embedded store (cluster state: pools, node records, mode).
    #[serde(default = "default_store")]
    pub store: PathBuf,
    /// Node-local allocation state and the published status (`status.json`).
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// The local API socket (`[node] socket`, which see; resolved on load).
    #[serde(default)]
    pub socket: PathBuf,
    /// Pool the router and health addresses come from (and, for now, pod addresses).
    #[serde(default = "default_infra_pool")]
    pub infra_pool: String,
    /// Families the node needs router and health addresses in.
    #[serde(default = "default_families")]
    pub families: Vec<Family>,
    /// Also allocate an ingress address per family (for an ingress/gateway proxy on the node).
    #[serde(default)]
    pub ingress: bool,
    /// Multi-pool: free addresses kept ready per family (0: blocks only on demand).
    #[serde(default)]
    pub pre_allocate: u64,
    /// Multi-pool: `pre_allocate` for the pools named here (Cilium's
    /// `ipam-multi-pool-pre-allocation`), the others keep `pre_allocate`: a busy tenant's pool
    /// keeps more addresses ready, a rarely used one none.
    #[serde(default)]
    pub pre_allocate_by_pool: BTreeMap<String, u64>,
    /// Kubernetes mode: the node's blocks (Node.spec.podCIDRs).
    #[serde(default)]
    pub pod_cidrs: Vec<Cidr>,
    /// The device the daemon creates and keeps that holds the node's router addresses (the pods'
    /// gateway), like Cilium's `cilium_host`.
    #[serde(default = "default_host_device")]
    pub host_device: String,
    /// Interfaces where traffic for local pods arrives from other hosts; the pod datapath is
    /// attached there so it reaches pods without the host's routing.
    #[serde(default)]
    pub uplinks: Vec<String>,
    /// The node's addresses on the network between nodes (one per family), where the other
    /// nodes route this node's pod CIDRs; by default the first uplink's addresses. Resolved
    /// with `[node] addresses` on load.
    #[serde(default)]
    pub node_addresses: Vec<IpAddr>,
    /// The node's labels (`[node] labels`, which see; resolved on load).
    #[serde(default)]
    pub node_labels: BTreeMap<String, String>,
    /// `[node.announce]`, for the node's record (resolved on load; not read from `[ipam]`).
    #[serde(skip)]
    pub announce: AnnounceSettings,
    /// Pools written to the store on start and on reload.
    #[serde(default, rename = "pool")]
    pub pools: Vec<PoolConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    #[serde(flatten)]
    pub spec: PodIpPoolSpec,
}

fn default_host_device() -> String {
    "ipam_host".to_owned()
}

pub(super) fn default_socket() -> PathBuf {
    PathBuf::from(ipam_api::DEFAULT_SOCKET)
}

pub fn default_store() -> PathBuf {
    PathBuf::from("/var/lib/ipam/store.redb")
}

impl IpamSettings {
    /// The free addresses the node keeps ready in `pool`, per family.
    pub fn pre_allocate_for(&self, pool: &str) -> u64 {
        self.pre_allocate_by_pool
            .get(pool)
            .copied()
            .unwrap_or(self.pre_allocate)
    }
}

fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/ipam/node")
}

fn default_infra_pool() -> String {
    "default".to_owned()
}

fn default_families() -> Vec<Family> {
    vec![Family::V4]
}
