//! What a node's agent learns from its Kubernetes Node: the labels L2 announcement policies
//! select nodes by, its addresses, and `spec.podCIDRs` (the node's blocks in the `kubernetes`
//! IPAM mode, allocated by the controller manager).

use std::{collections::BTreeMap, net::IpAddr};

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    runtime::{WatchStreamExt as _, watcher},
};
use tokio::sync::watch;

use crate::KubeStore;

/// The Node as the agent uses it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub labels: BTreeMap<String, String>,
    /// `status.addresses` of type InternalIP.
    pub internal_addresses: Vec<IpAddr>,
    /// `spec.podCIDRs`, as written (the engine parses them).
    pub pod_cidrs: Vec<String>,
    /// The `Ready` condition: `Some(false)` when False or Unknown (the kubelet stopped
    /// reporting), `None` before the kubelet first reported.
    pub ready: Option<bool>,
    /// `spec.unschedulable`: cordoned (`kubectl cordon`, `kubectl drain`).
    pub unschedulable: bool,
    /// The `NetworkUnavailable` condition is True (the node's network is not set up).
    pub network_unavailable: bool,
}

impl NodeInfo {
    fn of(node: &Node) -> Self {
        Self {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            internal_addresses: node
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .into_iter()
                .flatten()
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse().ok())
                .collect(),
            pod_cidrs: node
                .spec
                .as_ref()
                .and_then(|s| s.pod_cidrs.clone())
                .unwrap_or_default(),
            ready: condition(node, "Ready").map(|status| status == "True"),
            unschedulable: node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            network_unavailable: condition(node, "NetworkUnavailable") == Some("True"),
        }
    }
}

/// The status ("True", "False", "Unknown") of the Node's condition `kind`, if it has one.
fn condition<'a>(node: &'a Node, kind: &str) -> Option<&'a str> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.as_str())
}

impl KubeStore {
    /// Follows the Node `name`: the receiver holds its latest state (`None` until it is seen,
    /// or when it is deleted). The watcher retries with backoff while the API is unreachable.
    pub fn follow_node(&self, name: &str) -> watch::Receiver<Option<NodeInfo>> {
        let (tx, rx) = watch::channel(None);
        let api: Api<Node> = Api::all(self.client());
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let name = name.to_owned();
        tokio::spawn(async move {
            let mut events = watcher(api, config).default_backoff().boxed();
            let mut reported = false;
            while let Some(event) = events.next().await {
                // The field selector already narrows the watch; the name is checked again so a
                // server that ignores it cannot mix nodes up.
                let update = match event {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n))
                        if n.metadata.name.as_deref() == Some(name.as_str()) =>
                    {
                        Some(Some(NodeInfo::of(&n)))
                    }
                    Ok(watcher::Event::Delete(n))
                        if n.metadata.name.as_deref() == Some(name.as_str()) =>
                    {
                        Some(None)
                    }
                    Ok(_) => None,
                    Err(e) => {
                        if !reported {
                            tracing::warn!(
                                node = name.as_str(),
                                "cannot watch the Kubernetes Node, retrying: {e}"
                            );
                            reported = true;
                        }
                        None
                    }
                };
                if let Some(info) = update {
                    reported = false;
                    tx.send_if_modified(|current| {
                        let changed = *current != info;
                        *current = info;
                        changed
                    });
                }
                if tx.is_closed() {
                    return;
                }
            }
        });
        rx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_s_readiness_cordon_and_network_as_the_agent_reads_them() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "n1", "labels": { "zone": "a" } },
            "spec": { "unschedulable": true, "podCIDRs": ["10.0.1.0/24"] },
            "status": {
                "addresses": [{ "type": "InternalIP", "address": "10.1.0.5" }],
                "conditions": [
                    { "type": "NetworkUnavailable", "status": "True" },
                    { "type": "Ready", "status": "Unknown" }
                ]
            }
        }))
        .unwrap();
        let info = NodeInfo::of(&node);
        assert_eq!(info.ready, Some(false), "Unknown is not ready");
        assert!(info.unschedulable && info.network_unavailable);
        assert_eq!(
            info.internal_addresses,
            ["10.1.0.5".parse::<IpAddr>().unwrap()]
        );
        let fresh: Node = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "n2" }
        }))
        .unwrap();
        let info = NodeInfo::of(&fresh);
        assert_eq!(info.ready, None, "not reported yet");
        assert!(!info.unschedulable && !info.network_unavailable);
    }
}
