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
        }
    }
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
