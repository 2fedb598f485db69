//! The connections this node's kernel still sends to a dead node's pods. kube-proxy picks a
//! Service connection's endpoint once, in the flow's conntrack entry; a connection sent to a
//! pod on a node that has just died is never answered, and its entry stays in SYN_SENT for two
//! minutes. A new connection from the same client address and port (clients reuse ports) goes
//! to the dead pod again through that entry, long after the EndpointSlices and kube-proxy's
//! rules dropped it. kube-proxy clears such entries for UDP only.
//!
//! So while this node reports a node dead (`dead_peers`), it deletes the flows that never got
//! an answer from that node's pods: at once, every `FAST_EVERY` for `FAST_FOR` (kube-proxy's
//! rules change during that time, and until they do new entries keep coming), then every
//! `SLOW_EVERY` while the report stands (the endpoints may leave later, with the node lifecycle
//! controller). Only unanswered flows: a flow that had an answer is left to end as it would.
//! A report that was wrong costs at most handshakes in flight, which the client resends.
//!
//! The dead node's pods: the blocks in its record (this project's pod IPAM), and the kernel
//! routes through its addresses (another CNI's routes to its pods, in the add-on mode).

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use ipam_core::{
    Cidr,
    pod::pool::IpamMode,
    resources::{ClusterNode, NodeIpam},
    store::TypedStore as _,
};
use ipam_netlink::{Netlink, conntrack::Conntrack};
use tokio::sync::watch;

use crate::{
    cluster::ClusterStore,
    metrics::Metrics,
    runtime::{Controller, Next, Woken},
};

const FAST_EVERY: Duration = Duration::from_secs(1);
const FAST_FOR: Duration = Duration::from_secs(30);
const SLOW_EVERY: Duration = Duration::from_secs(10);

/// The nodes this node reports dead, with their addresses between nodes.
pub type Reported = BTreeMap<String, Vec<IpAddr>>;

/// A node held dead, as the sweep needs it.
struct Held {
    since: Instant,
    target: Target,
    deleted: usize,
}

/// Where a dead node's pods are: the blocks in its record when it was first reported, and its
/// addresses (the kernel's routes through them lead to its pods too).
#[derive(Clone)]
struct Target {
    node: String,
    blocks: Vec<Cidr>,
    addresses: Vec<IpAddr>,
}

/// Sweeps for the life of the daemon.
pub async fn run(
    store: ClusterStore,
    node: String,
    mode: Option<IpamMode>,
    reported: watch::Receiver<Reported>,
    metrics: Arc<Metrics>,
) {
    let sweeper = DeadFlows {
        store,
        node,
        mode,
        reported,
        metrics: metrics.clone(),
        held: BTreeMap::new(),
        conntrack: None,
        said: None,
    };
    crate::runtime::run(sweeper, metrics).await;
}

/// The sweeper, as a controller.
struct DeadFlows {
    store: ClusterStore,
    node: String,
    mode: Option<IpamMode>,
    reported: watch::Receiver<Reported>,
    metrics: Arc<Metrics>,
    held: BTreeMap<String, Held>,
    /// Opened at the first sweep, kept while it works.
    conntrack: Option<Conntrack>,
    /// The sweep's error as last logged: each one once.
    said: Option<String>,
}

impl Controller for DeadFlows {
    const NAME: &'static str = "dead_flows";
    /// A sweep that fails is logged once and tried again on its own schedule.
    type Error = std::convert::Infallible;

    async fn pass(&mut self) -> Result<Next, Self::Error> {
        let now = self.reported.borrow_and_update().clone();
        follow(&self.store, &self.node, self.mode, &mut self.held, now).await;
        if !self.held.is_empty() {
            let (opened, outcome) = sweep(self.conntrack.take(), &self.held).await;
            self.conntrack = opened;
            self.note(outcome);
        }
        let next = self
            .held
            .values()
            .map(|h| {
                if h.since.elapsed() < FAST_FOR {
                    FAST_EVERY
                } else {
                    SLOW_EVERY
                }
            })
            .min();
        Ok(next.map_or(Next::OnChange, Next::Within))
    }

    async fn changed(&mut self) -> Woken {
        match self.reported.changed().await {
            Ok(()) => Woken::Changed,
            Err(_) => Woken::Closed,
        }
    }
}

impl DeadFlows {
    /// Counts and says what a sweep deleted, or why it could not.
    fn note(&mut self, outcome: Result<BTreeMap<String, usize>, String>) {
        let node = self.node.as_str();
        match outcome {
            Ok(by_node) => {
                self.said = None;
                for (dead, deleted) in by_node.into_iter().filter(|(_, n)| *n > 0) {
                    let entry = self.held.get_mut(&dead).expect("swept only held nodes");
                    entry.deleted += deleted;
                    self.metrics
                        .dead_node_connections_deleted
                        .inc_by(deleted as u64);
                    tracing::info!(
                        node,
                        peer = dead.as_str(),
                        deleted,
                        "deleted {deleted} connections sent to dead node {dead}'s pods that \
                         never got an answer, so the clients' next connections from those \
                         ports follow kube-proxy's current rules"
                    );
                }
            }
            Err(e) if self.said.as_ref() != Some(&e) => {
                tracing::warn!(
                    node,
                    "cannot delete the connections sent to dead nodes' pods; clients \
                     reusing their ports may still reach those pods until the kernel's \
                     SYN_SENT timeout: {e}"
                );
                self.said = Some(e);
            }
            Err(_) => {}
        }
    }
}

/// Brings `held` in line with `reported`: a new node's blocks are read from its record once.
async fn follow(
    store: &ClusterStore,
    me: &str,
    mode: Option<IpamMode>,
    held: &mut BTreeMap<String, Held>,
    reported: Reported,
) {
    held.retain(|dead, h| {
        let stays = reported.contains_key(dead);
        if !stays && h.deleted > 0 {
            tracing::info!(
                node = me,
                peer = dead.as_str(),
                deleted = h.deleted,
                "no longer reporting {dead} dead: stopped deleting unanswered connections to \
                 its pods ({} deleted)",
                h.deleted
            );
        }
        stays
    });
    for (dead, addresses) in reported {
        if held.contains_key(&dead) {
            continue;
        }
        // In the kubernetes IPAM mode its blocks are its Node's podCIDRs (the record's copy
        // of them is its agent's word alone).
        // Those the routes take (`routes::vouched_blocks`): a Node whose podCIDRs are refused
        // there (another's block, `0.0.0.0/1`) gets no flows deleted for them either.
        let vouched = match mode {
            Some(IpamMode::Kubernetes) => match store.list_typed::<ClusterNode>().await {
                Ok(nodes) => {
                    let nodes = nodes.into_iter().map(|n| (n.name, n.value)).collect();
                    Some(
                        crate::routes::vouched_blocks(&nodes)
                            .blocks
                            .remove(&dead)
                            .unwrap_or_default(),
                    )
                }
                Err(e) => {
                    tracing::warn!(
                        node = me,
                        peer = dead.as_str(),
                        "cannot read the Nodes for {dead}'s pods' blocks; deleting unanswered \
                         connections only through its routes: {e}"
                    );
                    Some(Vec::new())
                }
            },
            _ => None,
        };
        let blocks = match store.get_typed::<NodeIpam>(&dead).await {
            Ok(Some(record)) => record.value.pod_blocks(vouched.as_deref()).collect(),
            Ok(None) => Vec::new(),
            Err(e) => {
                tracing::warn!(
                    node = me,
                    peer = dead.as_str(),
                    "cannot read {dead}'s record in {} for its pods' blocks; deleting \
                     unanswered connections only through its routes: {e}",
                    store.describe()
                );
                Vec::new()
            }
        };
        let target = Target {
            node: dead.clone(),
            blocks,
            addresses,
        };
        held.insert(
            dead,
            Held {
                since: Instant::now(),
                target,
                deleted: 0,
            },
        );
    }
}

/// One sweep, on a blocking thread (netlink requests block); hands the conntrack connection
/// back for the next, and says how many flows it deleted per node.
async fn sweep(
    conntrack: Option<Conntrack>,
    held: &BTreeMap<String, Held>,
) -> (Option<Conntrack>, Result<BTreeMap<String, usize>, String>) {
    let targets: Vec<Target> = held.values().map(|h| h.target.clone()).collect();
    let swept = tokio::task::spawn_blocking(move || {
        let conntrack = match conntrack {
            Some(c) => c,
            None => match Conntrack::open() {
                Ok(c) => c,
                Err(e) => return (None, Err(e.to_string())),
            },
        };
        let outcome = sweep_now(&conntrack, &targets);
        (Some(conntrack), outcome)
    })
    .await;
    swept.unwrap_or_else(|e| (None, Err(format!("the sweep's thread failed: {e}"))))
}

fn sweep_now(conntrack: &Conntrack, targets: &[Target]) -> Result<BTreeMap<String, usize>, String> {
    let routes = routes_through(targets).map_err(|e| e.to_string())?;
    let pods: Vec<(&str, Vec<Cidr>)> = targets
        .iter()
        .zip(routes)
        .map(|(target, via)| {
            let cidrs = target.blocks.iter().copied().chain(via).collect();
            (target.node.as_str(), cidrs)
        })
        .collect();
    let node_of = |ip: IpAddr| {
        pods.iter()
            .find(|(_, cidrs)| cidrs.iter().any(|c| c.contains(ip)))
            .map(|(node, _)| *node)
    };
    let deleted = conntrack
        .delete_unreplied(|ip| node_of(ip).is_some())
        .map_err(|e| e.to_string())?;
    let mut by_node = BTreeMap::new();
    for flow in deleted {
        if let Some(node) = node_of(flow.reply.source) {
            *by_node.entry(node.to_owned()).or_insert(0) += 1;
        }
    }
    Ok(by_node)
}

/// For each target, the destinations of the main table's routes through one of its addresses.
fn routes_through(targets: &[Target]) -> Result<Vec<Vec<Cidr>>, ipam_netlink::NetlinkError> {
    let netlink = Netlink::open()?;
    let mut routes = netlink.routes(false)?;
    routes.extend(netlink.routes(true)?);
    Ok(targets
        .iter()
        .map(|target| reached_through(&routes, &target.addresses))
        .collect())
}

/// The destinations of `routes` whose gateway is one of `addresses`: another CNI's routes to a
/// node's pods. A default route through the node is not a route to its pods.
fn reached_through(routes: &[ipam_netlink::RouteInfo], addresses: &[IpAddr]) -> Vec<Cidr> {
    routes
        .iter()
        .filter(|r| r.prefix_len > 0)
        .filter(|r| r.gateway.is_some_and(|g| addresses.contains(&g)))
        .filter_map(|r| Cidr::new(r.destination, r.prefix_len).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(destination: &str, prefix_len: u8, gateway: Option<&str>) -> ipam_netlink::RouteInfo {
        ipam_netlink::RouteInfo {
            destination: destination.parse().unwrap(),
            prefix_len,
            gateway: gateway.map(|g| g.parse().unwrap()),
            output: Some(2),
            blackhole: false,
            protocol: 4,
        }
    }

    /// The add-on mode's view of a dead node's pods: the other CNI's routes through its
    /// addresses, of both families, and nothing else.
    #[test]
    fn a_dead_node_s_pods_are_the_routes_through_its_addresses_but_a_default_route() {
        let routes = [
            route("10.200.3.0", 24, Some("10.77.0.13")),
            route("fd00:200:3::", 64, Some("fd77::13")),
            route("10.200.2.0", 24, Some("10.77.0.12")),
            route("0.0.0.0", 0, Some("10.77.0.13")),
            route("10.77.0.0", 24, None),
        ];
        let dead: Vec<IpAddr> = vec!["10.77.0.13".parse().unwrap(), "fd77::13".parse().unwrap()];
        let pods: Vec<String> = reached_through(&routes, &dead)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(pods, ["10.200.3.0/24", "fd00:200:3::/64"]);
    }
}
