//! What the node says about itself in its record (addresses between nodes, labels, interfaces),
//! and in the `kubernetes` mode the blocks its Kubernetes Node was given.

use ipam_core::{pod::agent::NodeFacts, pod::pool::IpamMode};

use super::PodIpam;
use crate::node_record::interfaces::Judged;

/// On a Kubernetes store: the node's Node (labels, addresses, `spec.podCIDRs`).
#[derive(Default)]
pub(super) struct KubeNode {
    pub(super) node: Option<tokio::sync::watch::Receiver<Option<ipam_kube::node::NodeInfo>>>,
    /// The podCIDRs last taken from the Node, to say once what is missing.
    pub(super) pod_cidrs: Option<Vec<String>>,
}

impl PodIpam {
    /// The `kubernetes` mode's blocks from the Node's `spec.podCIDRs`, when they changed; says
    /// once what the node waits for while there are none.
    pub(super) fn take_pod_cidrs(&mut self) {
        let Some(node) = self.kube_node.node.as_mut() else {
            return;
        };
        let info = node.borrow_and_update().clone();
        if self.settings.mode != IpamMode::Kubernetes {
            return;
        }
        let node_name = self.settings.node_name.as_str();
        let Some(info) = info else {
            tracing::warn!(
                node = node_name,
                "waiting for the Kubernetes Node {node_name}: the kubernetes IPAM mode takes the node's blocks from its spec.podCIDRs"
            );
            return;
        };
        if self.kube_node.pod_cidrs.as_ref() == Some(&info.pod_cidrs) {
            return;
        }
        self.kube_node.pod_cidrs = Some(info.pod_cidrs.clone());
        let mut cidrs = Vec::new();
        for text in &info.pod_cidrs {
            match text.parse::<ipam_core::Cidr>() {
                Ok(c) => cidrs.push(c),
                Err(e) => tracing::error!(node = node_name, "Node {node_name} spec.podCIDRs: {e}"),
            }
        }
        if cidrs.is_empty() {
            tracing::warn!(
                node = node_name,
                "Node {node_name} has no spec.podCIDRs yet: pods get no address until it does; \
                 the kube-controller-manager assigns them with --allocate-node-cidrs (or use the \
                 cluster-pool mode)"
            );
        } else {
            tracing::info!(node = node_name, cidrs = ?info.pod_cidrs, "blocks from the Node's spec.podCIDRs");
        }
        if let Some(agent) = self.agents.by_pool.get_mut(&self.settings.infra_pool) {
            agent.set_pod_cidrs(cidrs);
        }
    }

    /// The node's addresses between nodes (as configured, else its Kubernetes Node's internal
    /// addresses, else the first uplink's), its labels (its Node's, and the configured ones
    /// over them), and its interfaces with addresses (not the loopback, not the pods' gateway
    /// device).
    pub(super) fn node_facts(&mut self) -> NodeFacts {
        let node = self
            .kube_node
            .node
            .as_ref()
            .and_then(|n| n.borrow().clone());
        let addresses = if !self.settings.node_addresses.is_empty() {
            self.settings.node_addresses.clone()
        } else if let Some(n) = node.as_ref().filter(|n| !n.internal_addresses.is_empty()) {
            n.internal_addresses.clone()
        } else {
            self.settings
                .uplinks
                .first()
                .map(|u| crate::routes::uplink_addresses(u))
                .unwrap_or_default()
        };
        let host = &self.settings.host_device;
        let interfaces = self
            .interfaces
            .look(&[host.as_str(), &format!("{host}_peer")])
            .unwrap_or_else(|| Judged::as_in(&self.agents.facts));
        crate::node_record::facts_of(
            addresses,
            &self.settings.node_labels,
            &self.settings.announce,
            node.as_ref(),
            interfaces,
        )
    }
}
