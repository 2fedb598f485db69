//! The operator's controllers as a task beside the node's work (standalone role) or alone
//! (operator role), and how to reload and stop them.

use std::time::Duration;

use ipam_config::{Config, PoolConfig};
use tokio::sync::watch;

use crate::{
    cluster::{
        ClusterStore, dead_nodes,
        events::Events,
        operator::{self, OperatorSettings, PodIpamSettings},
    },
    metrics::Observed,
};

pub(super) struct OperatorTask {
    pools: watch::Sender<Vec<PoolConfig>>,
    stop: watch::Sender<bool>,
    handle: tokio::task::JoinHandle<()>,
}

impl OperatorTask {
    /// Starts the operator: pod IPAM and LB-IPAM with an `[ipam]` section, LB-IPAM alone
    /// without (the add-on mode).
    pub(super) fn spawn(store: ClusterStore, config: &Config, observed: Observed) -> Self {
        let pod_ip_pools = config.ipam.as_ref().map(|i| i.pools.clone());
        let (pools, pools_rx) = watch::channel(pod_ip_pools.unwrap_or_default());
        let (stop, stop_rx) = watch::channel(false);
        let (leader, leader_rx) = watch::channel(operator::Leader::Unknown);
        let settings = OperatorSettings {
            pod_ipam: config.ipam.as_ref().map(|ipam| PodIpamSettings {
                mode: ipam.mode,
                pools: ipam.pools.clone(),
            }),
            cluster: config.cluster.clone(),
            elect: store.is_shared(),
        };
        tracing::info!(
            store = store.describe(),
            elect = settings.elect,
            pod_ipam = settings.pod_ipam.is_some(),
            "operator starting"
        );
        if store.kube().is_some() {
            // Every replica, not only the leader (`dead_nodes` says why).
            let events = Events::for_store(&store, "ipam-operator", &config.cluster.identity());
            tokio::spawn(dead_nodes::run(
                store.clone(),
                config.dead_nodes.clone(),
                events,
                leader_rx,
                stop_rx.clone(),
                observed.metrics.clone(),
            ));
        }
        let events = Events::for_store(&store, "ipam-operator", &config.cluster.identity());
        let handle = tokio::spawn(operator::run(
            store, settings, pools_rx, leader, stop_rx, observed, events,
        ));
        Self {
            pools,
            stop,
            handle,
        }
    }

    pub(super) fn reload(&self, config: &Config) {
        if let Some(ipam) = &config.ipam {
            let _ = self.pools.send(ipam.pools.clone());
        }
    }

    /// Stops the operator, giving it a moment to hand leadership over.
    pub(super) async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.handle).await;
    }
}
