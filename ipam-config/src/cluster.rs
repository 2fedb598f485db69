//! `[cluster]`: timings of the agent and operator roles.

use std::time::Duration;

use serde::Deserialize;

use super::node::default_node_name;

/// The `[cluster]` section: timings of the agent and operator roles.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSettings {
    /// A node's liveness lease lasts this long; the agent renews it three times as often (once
    /// every `node_renew_ms` with `[gossip]`).
    pub node_lease_ms: u64,
    /// With `[gossip]`, the lease is a slow backstop (who holds blocks), renewed this often.
    pub node_renew_ms: u64,
    /// A node whose lease stays unrenewed this long loses its blocks.
    pub node_grace_ms: u64,
    /// The leading operator's lease; another replica takes over this long after the leader
    /// stopped renewing it.
    pub operator_lease_ms: u64,
    /// Controllers react to the store's watches, and run a full pass this often regardless.
    pub resync_ms: u64,
    /// This operator replica's name in the election; defaults to host name and process id.
    pub identity: Option<String>,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            node_lease_ms: 15_000,
            node_renew_ms: 10_000,
            node_grace_ms: 60_000,
            operator_lease_ms: 15_000,
            resync_ms: 30_000,
            identity: None,
        }
    }
}

impl ClusterSettings {
    pub fn node_lease(&self) -> Duration {
        Duration::from_millis(self.node_lease_ms)
    }

    /// How often the agent renews its lease: a third of it, or `node_renew_ms` when the lease
    /// only backs the gossip up.
    pub fn node_renew_interval(&self, gossip: bool) -> Duration {
        if gossip {
            Duration::from_millis(self.node_renew_ms)
        } else {
            self.node_lease() / 3
        }
    }

    pub fn node_grace(&self) -> Duration {
        Duration::from_millis(self.node_grace_ms)
    }

    pub fn operator_lease(&self) -> Duration {
        Duration::from_millis(self.operator_lease_ms)
    }

    pub fn resync(&self) -> Duration {
        Duration::from_millis(self.resync_ms)
    }

    pub fn identity(&self) -> String {
        self.identity
            .clone()
            .unwrap_or_else(|| format!("{}-{}", default_node_name(), std::process::id()))
    }
}
