//! This node's record as every announcer reads it: whether it may announce Service IPs
//! (`eligibility`), and the facts the others decide ownership and the gossip from (its labels,
//! its interfaces with their subnets, its address between nodes). L2 and BGP both read the
//! records; pod IPAM and this module write them.
//!
//! This module's controller is the add-on mode's writer: with no pod IPAM to keep the record,
//! it writes the facts and keeps them current. With `[ipam]` the pod IPAM controller writes the
//! same facts beside the node's blocks (`pod_ipam::node_facts`); exactly one of the two runs on
//! a node.

pub mod eligibility;
pub mod interfaces;

use std::{net::IpAddr, time::Duration};

use ipam_config::{AnnounceSettings, NodeSettings};
use ipam_core::pod::agent::NodeFacts;
use tokio::sync::watch;

use crate::{
    cluster::{ClusterStore, RecordNotWritten},
    metrics::Observed,
    runtime::{Controller, Next, Woken},
};

/// How often the interfaces are looked at again without a link or address change (netlink
/// says each one).
const RECHECK: Duration = Duration::from_secs(10);

/// Keeps the node's record for the life of the daemon. `settings` follows configuration
/// reloads: new labels (the exclusion label drains the node) and `[node.announce]` are
/// published at once; the name stays the one the node started with.
pub async fn run(
    store: ClusterStore,
    mut settings: watch::Receiver<NodeSettings>,
    observed: Observed,
    link_changes: watch::Receiver<u64>,
) {
    let node = settings.borrow_and_update().clone();
    let kube_node = store.kube().map(|s| s.follow_node(&node.name));
    let metrics = observed.metrics.clone();
    let record = NodeRecord {
        store,
        node,
        settings,
        kube_node,
        link_changes: Some(link_changes),
        observed,
        published: None,
        said_no_address: false,
        interfaces: interfaces::Interfaces::default(),
        seen: NodeFacts::default(),
    };
    crate::runtime::run(record, metrics).await;
}

/// The add-on mode's keeper of the node's record, as a controller.
struct NodeRecord {
    store: ClusterStore,
    node: NodeSettings,
    settings: watch::Receiver<NodeSettings>,
    kube_node: Option<watch::Receiver<Option<ipam_kube::node::NodeInfo>>>,
    /// Netlink's link and address changes; `None` once their watcher ended (the recheck
    /// looks at the interfaces still).
    link_changes: Option<watch::Receiver<u64>>,
    observed: Observed,
    /// The facts as last written.
    published: Option<NodeFacts>,
    said_no_address: bool,
    interfaces: interfaces::Interfaces,
    /// The facts as last judged, written or not.
    seen: NodeFacts,
}

impl Controller for NodeRecord {
    const NAME: &'static str = "node_record";
    type Error = RecordNotWritten;

    async fn pass(&mut self) -> Result<Next, RecordNotWritten> {
        let from_kube = self
            .kube_node
            .as_mut()
            .and_then(|n| n.borrow_and_update().clone());
        let judged = self
            .interfaces
            .look(&[])
            .unwrap_or_else(|| interfaces::Judged::as_in(&self.seen));
        let facts = facts(&self.node, from_kube, judged);
        let name = self.node.name.as_str();
        eligibility::report(
            name,
            &self.seen.announcing,
            &facts.announcing,
            &self.observed.health,
        );
        report_interfaces(name, &self.seen, &facts, &self.observed.metrics);
        self.seen = facts.clone();
        if facts.addresses.is_empty() && !self.said_no_address {
            tracing::warn!(
                node = name,
                "the node has no address between nodes: the gossip waits for one; set [node] \
                 addresses (on Kubernetes its Node's InternalIP is used)"
            );
        }
        self.said_no_address = facts.addresses.is_empty();
        if self.published.as_ref() == Some(&facts) {
            return Ok(Next::Within(RECHECK));
        }
        match facts.sync_record(&self.store, name).await {
            // Another writer was first: read and write again after a moment.
            Ok(false) => Ok(Next::Waiting),
            Ok(true) => {
                tracing::info!(
                    node = name,
                    addresses = ?facts.addresses,
                    interfaces = ?facts.interfaces.iter().map(|i| &i.name).collect::<Vec<_>>(),
                    "node record published (add-on mode: Service IPs only)"
                );
                self.published = Some(facts);
                Ok(Next::Within(RECHECK))
            }
            Err(source) => Err(RecordNotWritten {
                what: "its facts",
                node: name.to_owned(),
                store: self.store.describe(),
                source,
            }),
        }
    }

    async fn changed(&mut self) -> Woken {
        let node_changed = async {
            match self.kube_node.as_mut() {
                Some(n) => n.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        let link_changed = async {
            match self.link_changes.as_mut() {
                Some(l) => l.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            alive = link_changed => if !alive { self.link_changes = None },
            alive = node_changed => if !alive { self.kube_node = None },
            changed = self.settings.changed() => {
                let Ok(()) = changed else { return Woken::Closed };
                self.node = reloaded(&self.node, &self.settings.borrow_and_update());
            }
        }
        Woken::Changed
    }
}

/// The running settings with a reload's labels, addresses and `[node.announce]`; a new name is
/// refused (the node's record, leases and sessions are under the old one).
fn reloaded(running: &NodeSettings, new: &NodeSettings) -> NodeSettings {
    if new.name != running.name {
        tracing::error!(
            node = running.name.as_str(),
            "not renaming the node to {:?} on reload: its name changes only with a restart",
            new.name
        );
    }
    NodeSettings {
        name: running.name.clone(),
        socket: running.socket.clone(),
        ..new.clone()
    }
}

/// The node's facts: the configured addresses, else its Kubernetes Node's InternalIPs; its
/// Node's labels with the configured ones over them; every interface with an address but `lo`
/// (where the Service IPs it answers for are put); whether it may announce.
fn facts(
    node: &NodeSettings,
    from_kube: Option<ipam_kube::node::NodeInfo>,
    interfaces: interfaces::Judged,
) -> NodeFacts {
    let addresses: Vec<IpAddr> = if node.addresses.is_empty() {
        from_kube
            .as_ref()
            .map(|n| n.internal_addresses.clone())
            .unwrap_or_default()
    } else {
        node.addresses.clone()
    };
    facts_of(
        addresses,
        &node.labels,
        &node.announce,
        from_kube.as_ref(),
        interfaces,
    )
}

/// What a node publishes about itself, whichever controller keeps its record: `addresses`
/// between nodes, its Node's labels with the `configured` ones over them, whether it may
/// announce (its agent's verdict, `eligibility`), and its `interfaces` as judged.
pub(crate) fn facts_of(
    addresses: Vec<IpAddr>,
    configured: &std::collections::BTreeMap<String, String>,
    announce: &AnnounceSettings,
    from_kube: Option<&ipam_kube::node::NodeInfo>,
    interfaces: interfaces::Judged,
) -> NodeFacts {
    let mut labels = from_kube.map(|n| n.labels.clone()).unwrap_or_default();
    labels.extend(configured.clone());
    let announcing = eligibility::judge(announce, &labels, from_kube);
    NodeFacts {
        addresses,
        labels,
        interfaces: interfaces.usable,
        interfaces_down: interfaces.down,
        announcing,
        agent_version: ipam_core::pod::agent::AGENT_VERSION.to_owned(),
    }
}

/// Says in the log and the metrics which interfaces stopped (or started again) letting this
/// node announce.
pub(crate) fn report_interfaces(
    node: &str,
    before: &NodeFacts,
    now: &NodeFacts,
    metrics: &crate::metrics::Metrics,
) {
    let gauge = |interface: &str| {
        metrics
            .interfaces_down
            .get_or_create(&crate::metrics::InterfaceLabel {
                interface: interface.to_owned(),
            })
            .clone()
    };
    for down in &now.interfaces_down {
        gauge(&down.name).set(1);
        if !before.interfaces_down.contains(down) {
            tracing::warn!(
                node,
                interface = down.name.as_str(),
                "interface {} is {}: this node announces no Service IP on it; the IPs it \
                 answered there move to another node",
                down.name,
                down.why
            );
        }
    }
    for back in &before.interfaces_down {
        let usable = now.interfaces.iter().any(|i| i.name == back.name);
        if usable {
            gauge(&back.name).set(0);
            tracing::info!(
                node,
                interface = back.name.as_str(),
                "interface {} may announce again",
                back.name
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_reload_takes_new_labels_but_keeps_the_name() {
        let running = NodeSettings {
            name: "node-a".into(),
            ..NodeSettings::default()
        };
        let mut new = NodeSettings {
            name: "node-b".into(),
            ..NodeSettings::default()
        };
        new.labels
            .insert(eligibility::EXCLUSION_LABEL.into(), String::new());
        let reloaded = reloaded(&running, &new);
        assert_eq!(reloaded.name, "node-a");
        assert_eq!(reloaded.labels, new.labels);
    }

    #[test]
    fn configured_facts_win_over_the_kubernetes_node() {
        let kube = ipam_kube::node::NodeInfo {
            labels: BTreeMap::from([
                ("zone".to_owned(), "a".to_owned()),
                ("rack".to_owned(), "1".to_owned()),
            ]),
            internal_addresses: vec!["10.1.0.5".parse().unwrap()],
            ..Default::default()
        };
        let mut node = NodeSettings {
            name: "n1".to_owned(),
            labels: BTreeMap::from([("zone".to_owned(), "b".to_owned())]),
            ..NodeSettings::default()
        };
        let f = facts(&node, Some(kube.clone()), Default::default());
        assert_eq!(
            f.addresses, kube.internal_addresses,
            "the Node's InternalIP"
        );
        assert_eq!(
            f.labels["zone"], "b",
            "the configured label over the Node's"
        );
        assert_eq!(f.labels["rack"], "1");
        assert!(f.interfaces.iter().all(|i| i.name != "lo"));
        node.addresses = vec!["192.0.2.7".parse().unwrap()];
        assert_eq!(
            facts(&node, Some(kube), Default::default()).addresses,
            node.addresses
        );
        assert!(facts(&node, None, Default::default()).labels.len() == 1);
    }
}
