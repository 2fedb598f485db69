//! `[dead_nodes]`: taking a dead node's pods out of their Services on the agents' evidence.

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;

/// The `[dead_nodes]` section. The agents report the nodes the gossip declared dead whose
/// kubelet's port gives no answer either; the operator marks the pods of a node that a majority
/// of the nodes report not ready, as the node lifecycle controller does after its grace period,
/// so kube-proxy stops sending them traffic within seconds instead of about a minute.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeadNodeSettings {
    /// Take a dead node's pods out of their Services: the operator sets them not ready, and
    /// each agent deletes its unanswered connections to them (`liveness::dead_flows`). Off,
    /// the agents still report (`ipamctl` and the node records show what they hold) and
    /// Kubernetes' own grace period applies.
    pub mark_pods_not_ready: bool,
    /// Agent: the port of the kubelet on every node, probed as the second signal.
    pub kubelet_port: u16,
    /// Agent: how long the probe waits for the kubelet's port to answer; silence that long is
    /// the evidence (a refusal is an answer: the node's kernel runs).
    pub probe_timeout_ms: u64,
    /// Operator: at most this many nodes' pods marked within `rate_window_ms`; more dead nodes
    /// wait for the window (or for the node lifecycle controller).
    pub max_nodes_per_window: usize,
    pub rate_window_ms: u64,
}

impl Default for DeadNodeSettings {
    fn default() -> Self {
        Self {
            mark_pods_not_ready: true,
            kubelet_port: 10250,
            probe_timeout_ms: 200,
            // The node lifecycle controller's own pace (`--node-eviction-rate`, 0.1 node/s).
            max_nodes_per_window: 1,
            rate_window_ms: 10_000,
        }
    }
}

impl DeadNodeSettings {
    pub(super) fn validate(&self, path: &std::path::Path) -> Result<(), ConfigError> {
        let refuse = |field, problem| ConfigError::DeadNodes {
            path: path.to_owned(),
            field,
            problem,
        };
        if !(1..=10_000).contains(&self.probe_timeout_ms) {
            return Err(refuse(
                "probe_timeout_ms",
                "must be between 1 and 10000: a kubelet's port on the network between nodes \
                 answers within milliseconds, and the probe delays the removal",
            ));
        }
        if self.kubelet_port == 0 {
            return Err(refuse(
                "kubelet_port",
                "must be the kubelet's port (10250 by default)",
            ));
        }
        if self.mark_pods_not_ready && (self.max_nodes_per_window == 0 || self.rate_window_ms == 0)
        {
            return Err(refuse(
                "max_nodes_per_window",
                "and rate_window_ms must be above 0 while mark_pods_not_ready is on; set \
                 mark_pods_not_ready = false to never act",
            ));
        }
        Ok(())
    }

    pub fn probe_timeout(&self) -> Duration {
        Duration::from_millis(self.probe_timeout_ms)
    }

    pub fn rate_window(&self) -> Duration {
        Duration::from_millis(self.rate_window_ms)
    }
}
