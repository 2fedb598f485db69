//! Cross-node pod routing (native routing): every node learns the other nodes' blocks and
//! addresses from the store and keeps the datapath's route map in line with them, so the pod
//! programs send traffic for a remote pod straight out of the uplink towards the node that
//! holds its block. Entries follow nodes joining, changing blocks and leaving.
//!
//! The host's routing table gets the same routes (marked with `IPAM_ROUTE_PROTOCOL`): what the
//! host itself sends to another node's pod does not pass the pod programs. kube-proxy's
//! forwarding of a Service's traffic to an endpoint on another node is such traffic, as is
//! every host-network pod's; without these routes it left by the default route and was lost
//! (found on the real-cluster lab: a LoadBalancer IP answered only by its node's own pods).
//!
//! The controller keeps the records it has seen from its watch (no list per change) and
//! reprograms the map and the table by difference. The node's own addresses between nodes are found on the
//! first uplink and published in its record for the others.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use ipam_core::{Cidr, Family, pod::pool::IpamMode, resources::NodeIpam};
use ipam_datapath::{Datapath, RouteTarget};
use ipam_netlink::iface;

use crate::cluster::{
    ClusterStore,
    cache::{Cache, watch_until_it_works},
};

/// How often the map is checked against the records even without changes (an uplink that
/// appeared late, a map entry removed by hand).
const RECHECK: Duration = Duration::from_secs(5);

/// The routes this node wants: every block of every other node (as the cluster vouches for
/// it in IPAM mode `mode`: `NodeIpam::pod_blocks`) that published an address of the block's
/// family, through `uplink_ifindex`.
pub fn desired_routes(
    this_node: &str,
    mode: IpamMode,
    records: &BTreeMap<String, NodeIpam>,
    uplink_ifindex: u32,
) -> BTreeMap<Cidr, RouteTarget> {
    let mut out = BTreeMap::new();
    for (node, record) in records.iter().filter(|(n, _)| n.as_str() != this_node) {
        for cidr in record.pod_blocks(mode == IpamMode::Kubernetes) {
            let Some(next_hop) = record
                .spec
                .addresses
                .iter()
                .copied()
                .find(|a| Family::of(*a) == cidr.family())
            else {
                tracing::debug!(node = node.as_str(), %cidr, "no node address of the block's family; not routed");
                continue;
            };
            out.insert(
                cidr,
                RouteTarget {
                    next_hop,
                    uplink_ifindex,
                },
            );
        }
    }
    out
}

/// Follows every node's record and keeps the route map in line, for the life of the daemon.
pub async fn run(
    store: ClusterStore,
    node: String,
    mode: IpamMode,
    uplink: String,
    datapath: Arc<Mutex<Datapath>>,
) {
    let mut watch = watch_until_it_works::<NodeIpam, _>(&store, "pod routes").await;
    let mut records: Cache<NodeIpam> = Cache::new(&watch.initial);
    let mut programmed: BTreeMap<Cidr, RouteTarget> = BTreeMap::new();
    // Read from the table on the first pass: a restarted daemon finds its earlier routes.
    let mut in_kernel: Option<BTreeMap<Cidr, RouteTarget>> = None;
    let mut recheck = tokio::time::interval(RECHECK);
    loop {
        let current: BTreeMap<String, NodeIpam> = records
            .iter()
            .map(|r| (r.name.clone(), r.value.clone()))
            .collect();
        tracing::debug_span!("routes_pass", node = node.as_str(), nodes = current.len()).in_scope(
            || {
                program(
                    &node,
                    mode,
                    &uplink,
                    &current,
                    &mut programmed,
                    &mut in_kernel,
                    &datapath,
                );
            },
        );
        tokio::select! {
            event = watch.next() => records.apply(event),
            _ = recheck.tick() => {}
        }
    }
}

/// Brings the route map and the host's table in line with the records: adds, changes and
/// removes by difference.
fn program(
    node: &str,
    mode: IpamMode,
    uplink: &str,
    records: &BTreeMap<String, NodeIpam>,
    programmed: &mut BTreeMap<Cidr, RouteTarget>,
    in_kernel: &mut Option<BTreeMap<Cidr, RouteTarget>>,
    datapath: &Mutex<Datapath>,
) {
    let Ok(uplink_ifindex) = iface::index(uplink) else {
        // Logged by the host network's own checks; routes follow once the uplink exists.
        return;
    };
    let want = desired_routes(node, mode, records, uplink_ifindex);
    program_kernel(&want, in_kernel);
    if &want == programmed {
        return;
    }
    let mut dp = datapath.lock().expect("datapath lock");
    let routes = dp.routes();
    let stale: BTreeSet<Cidr> = programmed
        .keys()
        .filter(|c| !want.contains_key(c))
        .copied()
        .collect();
    for cidr in stale {
        match routes.remove(cidr) {
            Ok(()) => {
                tracing::info!(%cidr, "pod route removed");
                programmed.remove(&cidr);
            }
            Err(e) => tracing::warn!(%cidr, "cannot remove pod route: {e}"),
        }
    }
    for (cidr, target) in &want {
        if programmed.get(cidr) == Some(target) {
            continue;
        }
        match routes.insert(*cidr, *target) {
            Ok(()) => {
                tracing::info!(%cidr, next_hop = %target.next_hop, uplink, "pod route added");
                programmed.insert(*cidr, *target);
            }
            Err(e) => tracing::warn!(%cidr, "cannot add pod route: {e}"),
        }
    }
}

/// Brings the host's routes to other nodes' blocks in line with `want`. `installed` is what
/// this daemon put there; `None` until first read from the table (its protocol tells).
fn program_kernel(
    want: &BTreeMap<Cidr, RouteTarget>,
    installed: &mut Option<BTreeMap<Cidr, RouteTarget>>,
) {
    let netlink = match ipam_netlink::Netlink::open() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("cannot program the host's routes to other nodes' pods: {e}");
            return;
        }
    };
    let installed = match installed {
        Some(installed) => installed,
        None => match routes_of_ours(&netlink) {
            Ok(found) => installed.insert(found),
            Err(e) => {
                tracing::warn!("cannot read the host's routes to other nodes' pods: {e}");
                return;
            }
        },
    };
    let stale: Vec<Cidr> = installed
        .keys()
        .filter(|c| !want.contains_key(c))
        .copied()
        .collect();
    for cidr in stale {
        match netlink.delete_route(cidr.network(), cidr.prefix()) {
            Ok(()) => {
                tracing::info!(%cidr, "host route to another node's pods removed");
                installed.remove(&cidr);
            }
            Err(e) => tracing::warn!(%cidr, "{e}"),
        }
    }
    for (cidr, target) in want {
        if installed.get(cidr) == Some(target) {
            continue;
        }
        match netlink.add_route_by(
            cidr.network(),
            cidr.prefix(),
            target.next_hop,
            target.uplink_ifindex,
            ipam_netlink::IPAM_ROUTE_PROTOCOL,
        ) {
            Ok(()) => {
                tracing::info!(
                    %cidr,
                    next_hop = %target.next_hop,
                    "host route to another node's pods added"
                );
                installed.insert(*cidr, *target);
            }
            Err(e) => tracing::warn!(
                %cidr,
                "{e}; the host's own traffic to those pods (Services forwarded by kube-proxy, \
                 host-network pods) is not routed"
            ),
        }
    }
}

/// The routes of the host's main table that carry this daemon's protocol.
fn routes_of_ours(
    netlink: &ipam_netlink::Netlink,
) -> Result<BTreeMap<Cidr, RouteTarget>, ipam_netlink::NetlinkError> {
    let mut out = BTreeMap::new();
    for ipv6 in [false, true] {
        for route in netlink.routes(ipv6)? {
            if route.protocol != ipam_netlink::IPAM_ROUTE_PROTOCOL {
                continue;
            }
            let (Some(next_hop), Some(uplink_ifindex), Ok(cidr)) = (
                route.gateway,
                route.output,
                Cidr::new(route.destination, route.prefix_len),
            ) else {
                continue;
            };
            out.insert(
                cidr,
                RouteTarget {
                    next_hop,
                    uplink_ifindex,
                },
            );
        }
    }
    Ok(out)
}

/// The node's addresses between nodes: the global unicast addresses of `uplink`, one per
/// family (the first the kernel lists).
pub fn uplink_addresses(uplink: &str) -> Vec<IpAddr> {
    let Ok(index) = iface::index(uplink) else {
        return Vec::new();
    };
    let Ok(netlink) = ipam_netlink::Netlink::open() else {
        return Vec::new();
    };
    let Ok(addresses) = netlink.addresses(index) else {
        return Vec::new();
    };
    let mut out: Vec<IpAddr> = Vec::new();
    for (ip, _) in addresses {
        let usable = match ip {
            IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local(),
            IpAddr::V6(v6) => !v6.is_loopback() && !v6.is_unicast_link_local(),
        };
        if usable && !out.iter().any(|a| Family::of(*a) == Family::of(ip)) {
            out.push(ip);
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use ipam_core::resources::{AllocatedBlock, NodeIpamSpec, NodeIpamStatus};

    use super::*;

    fn record(addresses: &[&str], blocks: &[&str]) -> NodeIpam {
        NodeIpam {
            spec: NodeIpamSpec {
                addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
                ..Default::default()
            },
            status: NodeIpamStatus {
                allocated: blocks
                    .iter()
                    .map(|b| AllocatedBlock {
                        pool: "default".into(),
                        cidr: b.parse().unwrap(),
                    })
                    .collect(),
                ..Default::default()
            },
        }
    }

    #[test]
    fn other_nodes_blocks_go_to_their_address_of_the_same_family() {
        let records: BTreeMap<String, NodeIpam> = [
            (
                "a".to_owned(),
                record(
                    &["192.168.50.1", "fd50::1"],
                    &["10.244.0.0/24", "fd00::/120"],
                ),
            ),
            (
                "b".to_owned(),
                record(
                    &["192.168.50.2", "fd50::2"],
                    &["10.244.1.0/24", "fd00::100/120"],
                ),
            ),
            // No IPv6 address published: its IPv6 block cannot be routed.
            (
                "c".to_owned(),
                record(&["192.168.50.3"], &["10.244.2.0/24", "fd00::200/120"]),
            ),
        ]
        .into();
        let routes = desired_routes("a", IpamMode::ClusterPool, &records, 7);
        let shown: Vec<String> = routes
            .iter()
            .map(|(c, t)| format!("{c} via {} dev {}", t.next_hop, t.uplink_ifindex))
            .collect();
        assert_eq!(
            shown,
            [
                "10.244.1.0/24 via 192.168.50.2 dev 7",
                "10.244.2.0/24 via 192.168.50.3 dev 7",
                "fd00::100/120 via fd50::2 dev 7",
            ]
        );
    }

    /// A record's `spec.podCIDRs` (its agent's own word) is routed only in the kubernetes IPAM
    /// mode, where the agent copies them from its Node; in the pool modes only the blocks the
    /// operator wrote in the status are. A compromised node listing another node's block, or
    /// `0.0.0.0/1`, in its spec draws no traffic (issue 58).
    #[test]
    fn only_the_operator_s_blocks_are_routed_outside_the_kubernetes_mode() {
        let mut liar = record(&["192.168.50.9"], &["10.244.9.0/24"]);
        liar.spec.pod_cidrs = vec![
            "10.244.1.0/25".parse().unwrap(),
            "0.0.0.0/1".parse().unwrap(),
        ];
        let records: BTreeMap<String, NodeIpam> = [
            (
                "a".to_owned(),
                record(&["192.168.50.1"], &["10.244.0.0/24"]),
            ),
            (
                "b".to_owned(),
                record(&["192.168.50.2"], &["10.244.1.0/24"]),
            ),
            ("m".to_owned(), liar),
        ]
        .into();
        for mode in [IpamMode::ClusterPool, IpamMode::MultiPool] {
            let routed: Vec<String> = desired_routes("a", mode, &records, 7)
                .keys()
                .map(ToString::to_string)
                .collect();
            assert_eq!(routed, ["10.244.1.0/24", "10.244.9.0/24"], "{mode:?}");
        }
        // In the kubernetes mode the spec's podCIDRs are still taken as the agent copied them;
        // checking them against the Node objects (the controller manager's word) is open.
    }
}
