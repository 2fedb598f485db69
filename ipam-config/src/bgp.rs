//! `[bgp]`: the BIRD the agent runs for the Service IPs it advertises.

use std::path::PathBuf;

use serde::Deserialize;

/// The `[bgp]` section: where the BIRD the agent runs lives, and its working directory.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BgpSettings {
    /// The BIRD 2 daemon (Debian: bird2).
    #[serde(default = "default_bird")]
    pub bird: PathBuf,
    /// Its control client.
    #[serde(default = "default_birdc")]
    pub birdc: PathBuf,
    /// BIRD's configuration, control socket and pid file; root-only (it holds passwords).
    #[serde(default = "default_bgp_run_dir")]
    pub run_dir: PathBuf,
    /// The BGP router ID; by default the node's first IPv4 address (`[node] addresses`), else
    /// BIRD's choice (the lowest IPv4 address of the node's interfaces).
    #[serde(default)]
    pub router_id: Option<std::net::Ipv4Addr>,
    /// How often the sessions' state is read for status, metrics and conditions.
    #[serde(default = "default_bgp_status_ms")]
    pub status_interval_ms: u64,
    /// The namespace of the Secrets BGPPeers name in `passwordSecretRef` (Kubernetes store):
    /// one that holds those Secrets alone, so the agents' `get` on Secrets reaches no other.
    #[serde(default = "default_bgp_secret_namespace")]
    pub secret_namespace: String,
}

fn default_bird() -> PathBuf {
    PathBuf::from("bird")
}
fn default_birdc() -> PathBuf {
    PathBuf::from("birdc")
}
fn default_bgp_run_dir() -> PathBuf {
    PathBuf::from("/run/ipam/bgp")
}
fn default_bgp_status_ms() -> u64 {
    1000
}
fn default_bgp_secret_namespace() -> String {
    "ipam-bgp-secrets".to_owned()
}
