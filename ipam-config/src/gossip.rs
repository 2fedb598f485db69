//! `[gossip]`: node liveness between the agents.

use std::{net::IpAddr, path::PathBuf, time::Duration};

use serde::Deserialize;

/// The `[gossip]` section: agents tell each other who is alive over UDP, authenticated with a
/// cluster key, and the store keeps only a slow lease per node (docs/liveness.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GossipSettings {
    /// The UDP port every agent listens on, on its address between nodes.
    #[serde(default = "default_gossip_port")]
    pub port: u16,
    /// The address this agent gossips on; by default the first of its record's addresses
    /// (`[ipam] node_addresses`, else its Node's or its first uplink's).
    #[serde(default)]
    pub address: Option<IpAddr>,
    /// The cluster key this agent signs with (at least 32 bytes; a file mounted from a Secret).
    pub key_file: PathBuf,
    /// Keys accepted besides `key_file`'s, for a rotation (docs/liveness.md).
    #[serde(default)]
    pub also_accept_key_files: Vec<PathBuf>,
    #[serde(default = "default_probe_period_ms")]
    pub probe_period_ms: u64,
    #[serde(default = "default_probe_rtt_ms")]
    pub probe_rtt_ms: u64,
    #[serde(default = "default_indirect_probes")]
    pub indirect_probes: usize,
    /// A probed member that did not answer is declared dead this long later, unless it refutes.
    #[serde(default = "default_suspect_to_down_ms")]
    pub suspect_to_down_ms: u64,
    /// This agent's responders go silent after hearing no other member for this long; below
    /// `suspect_to_down_ms`, so a node cut off is silent before anyone takes its IPs over.
    #[serde(default = "default_fence_quiet_ms")]
    pub fence_quiet_ms: u64,
    /// ... or while most of its probes within this window went unanswered (a minority).
    #[serde(default = "default_fence_window_ms")]
    pub fence_window_ms: u64,
    /// The others wait this long after declaring a member dead before answering its IPs: a
    /// member cut off with a minority has gone silent by then.
    #[serde(default = "default_takeover_hold_ms")]
    pub takeover_hold_ms: u64,
}

pub const DEFAULT_GOSSIP_PORT: u16 = 7946;

fn default_gossip_port() -> u16 {
    DEFAULT_GOSSIP_PORT
}
fn default_probe_period_ms() -> u64 {
    millis(ipam_gossip::Timing::default().probe_period)
}
fn default_probe_rtt_ms() -> u64 {
    millis(ipam_gossip::Timing::default().probe_rtt)
}
fn default_indirect_probes() -> usize {
    ipam_gossip::Timing::default().indirect_probes
}
fn default_suspect_to_down_ms() -> u64 {
    millis(ipam_gossip::Timing::default().suspect_to_down)
}
fn default_fence_quiet_ms() -> u64 {
    millis(ipam_gossip::Timing::default().fence_quiet)
}
fn default_fence_window_ms() -> u64 {
    millis(ipam_gossip::Timing::default().fence_window)
}
fn default_takeover_hold_ms() -> u64 {
    millis(ipam_gossip::Timing::default().takeover_hold)
}
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl GossipSettings {
    /// The protocol's timings as configured.
    pub fn timing(&self) -> ipam_gossip::Timing {
        ipam_gossip::Timing {
            probe_period: Duration::from_millis(self.probe_period_ms),
            probe_rtt: Duration::from_millis(self.probe_rtt_ms),
            indirect_probes: self.indirect_probes,
            suspect_to_down: Duration::from_millis(self.suspect_to_down_ms),
            fence_quiet: Duration::from_millis(self.fence_quiet_ms),
            fence_window: Duration::from_millis(self.fence_window_ms),
            takeover_hold: Duration::from_millis(self.takeover_hold_ms),
            ..ipam_gossip::Timing::default()
        }
    }
}
