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

use ipam_core::{
    Cidr, Family,
    pod::pool::IpamMode,
    resources::{ClusterNode, NodeIpam},
};
use ipam_datapath::{Datapath, RouteTarget};
use ipam_netlink::iface;

use crate::{
    cluster::{
        ClusterStore,
        copies::{Copy, Wake},
    },
    metrics::{FieldLabel, Metrics},
    runtime::{Controller, Next, Woken},
};

/// How often the map is checked against the records even without changes (an uplink that
/// appeared late, a map entry removed by hand).
const RECHECK: Duration = Duration::from_secs(5);

/// The routes this node wants: every block of every other node that has a next hop of the
/// block's family, through `uplink_ifindex`. A node's blocks are those the cluster vouches for
/// (`NodeIpam::pod_blocks`): the operator's, and in the kubernetes IPAM mode its Node's
/// podCIDRs (`vouched`, by node: `vouched_blocks`, given only in that mode). Its next hops are
/// in that mode those its Node vouches for (`hops`: `next_hops`); in the pool modes the
/// addresses its record lists.
pub fn desired_routes(
    this_node: &str,
    records: &BTreeMap<String, NodeIpam>,
    vouched: Option<&Vouched>,
    hops: Option<&NextHops>,
    uplink_ifindex: u32,
) -> BTreeMap<Cidr, RouteTarget> {
    let addresses_of = |node: &str, record: &'_ NodeIpam| -> Vec<IpAddr> {
        match hops {
            Some(hops) => hops.by_node.get(node).cloned().unwrap_or_default(),
            None => record.spec.addresses.clone(),
        }
    };
    // Another node's next hop that is this node's own address would be a route through
    // itself (a liar's kubelet listing this node's address in its Node).
    let own: Vec<IpAddr> = records
        .get(this_node)
        .map(|r| [addresses_of(this_node, r), r.spec.addresses.clone()].concat())
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    for (node, record) in records.iter().filter(|(n, _)| n.as_str() != this_node) {
        let blocks = vouched.map(|v| v.blocks.get(node).map_or(&[][..], Vec::as_slice));
        let addresses = addresses_of(node, record);
        for cidr in record.pod_blocks(blocks) {
            let Some(next_hop) = addresses
                .iter()
                .copied()
                .find(|a| Family::of(*a) == cidr.family())
            else {
                tracing::debug!(node = node.as_str(), %cidr, "no next hop of the block's family; not routed");
                continue;
            };
            if own.contains(&next_hop) {
                tracing::debug!(node = node.as_str(), %cidr, %next_hop, "the next hop is this node's own address; not routed");
                continue;
            }
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

/// Where each node's pods are routed through, in the kubernetes IPAM mode.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct NextHops {
    /// Each node's next hops, at most one per family.
    pub by_node: BTreeMap<String, Vec<IpAddr>>,
    /// The addresses a node's record lists that are not taken, by node.
    pub refused: BTreeMap<String, Vec<IpAddr>>,
    /// The next hops taken on the record's word alone (a family its Node lists no InternalIP
    /// of), by node.
    pub unvouched: BTreeMap<String, Vec<IpAddr>>,
}

/// Each node's next hops in the kubernetes IPAM mode, per family: where its Node lists
/// InternalIPs of the family (`ClusterNode::addresses`: the kubelet's word for its own Node,
/// or the cloud's), the first of them its record lists too (its agent's choice, `[node]
/// addresses`), else the Node's first. An address the record lists that its Node does not,
/// in such a family, is refused and named: the agent alone cannot send the other nodes'
/// traffic for its pods to a gateway or to another host. Another Node listing the same
/// address takes nothing from it: each node is routed through its own Node's word, so a
/// liar's kubelet can misroute only its own pods' traffic.
///
/// Where its Node lists no InternalIP of the family (a kubelet given one `--node-ip` on a
/// dual-stack node, a Node whose addresses a cloud controller has not filled in yet), the
/// record's is taken, on the agent's word alone (`unvouched`, named), whoever else lists it:
/// a record or a Node listing another node's address takes nothing from that node, and
/// misroutes at most its own pods' traffic (a node never routes through its own address,
/// `desired_routes`). A record with no Node (one deleted) has no next hop.
pub fn next_hops(
    records: &BTreeMap<String, NodeIpam>,
    nodes: &BTreeMap<String, ClusterNode>,
) -> NextHops {
    let mut out = NextHops::default();
    for (name, record) in records {
        let Some(node) = nodes.get(name) else {
            continue;
        };
        let vouched = &node.addresses;
        let vouches_for = |a: &IpAddr| vouched.iter().any(|v| Family::of(*v) == Family::of(*a));
        // In a family its Node vouches for, only the Node's addresses; in another, the
        // record's, whoever else lists them: refusing an address another node lists would let
        // a liar listing an honest node's address cut that node's routes.
        let taken = |a: &&IpAddr| !vouches_for(a) || vouched.contains(a);
        let mut hops: Vec<IpAddr> = Vec::new();
        for address in record.spec.addresses.iter().filter(taken).chain(vouched) {
            if !hops.iter().any(|h| Family::of(*h) == Family::of(*address)) {
                hops.push(*address);
            }
        }
        let refused: Vec<IpAddr> = record
            .spec
            .addresses
            .iter()
            .filter(|a| !taken(a))
            .copied()
            .collect();
        // A next hop of a family the Node does not vouch for can only be the record's.
        let unvouched: Vec<IpAddr> = hops.iter().filter(|a| !vouches_for(a)).copied().collect();
        for (found, into) in [(refused, &mut out.refused), (unvouched, &mut out.unvouched)] {
            if !found.is_empty() {
                into.insert(name.clone(), found);
            }
        }
        if !hops.is_empty() {
            out.by_node.insert(name.clone(), hops);
        }
    }
    out
}

/// The Nodes' podCIDRs as routes take them, in the kubernetes IPAM mode.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Vouched {
    /// Each node's podCIDRs that are routed.
    pub blocks: BTreeMap<String, Vec<Cidr>>,
    /// The podCIDRs left out, by node, each with why.
    pub refused: BTreeMap<String, Vec<(Cidr, String)>>,
}

/// Each Node's podCIDRs as routes take them. The controller manager gives every node a block
/// of one size per family (its `--node-cidr-mask-size`), but while a Node's podCIDRs are empty
/// its node's own credentials may set them. So a block is routed only if it is of the size
/// most Nodes' blocks are (per family; of two sizes as common, the smaller block) and no other
/// Node has it: a node that claims another's block, a /25 of it or `0.0.0.0/1` draws none of
/// its traffic (at worst the other node's block is refused with it, named in the log, until an
/// admin deals with the liar). Neither the Nodes' age nor their names decide: a node may claim
/// a block before the controller manager gives it to a newer node.
pub fn vouched_blocks(nodes: &BTreeMap<String, ClusterNode>) -> Vouched {
    let mut sizes: BTreeMap<(bool, u8), usize> = BTreeMap::new();
    let mut claimants: BTreeMap<Cidr, Vec<&str>> = BTreeMap::new();
    for (name, node) in nodes {
        let mut own: Vec<Cidr> = node.pod_cidrs.clone();
        own.sort();
        own.dedup();
        for cidr in own {
            *sizes
                .entry((cidr.network().is_ipv4(), cidr.prefix()))
                .or_default() += 1;
            claimants.entry(cidr).or_default().push(name);
        }
    }
    // Per family, the most common size; on a tie the longer prefix (the smaller block).
    let mut block_size: BTreeMap<bool, (usize, u8)> = BTreeMap::new();
    for (&(v4, prefix), &count) in &sizes {
        let best = block_size.entry(v4).or_insert((count, prefix));
        if (count, prefix) > *best {
            *best = (count, prefix);
        }
    }
    let mut out = Vouched::default();
    for (cidr, names) in claimants {
        let size = block_size[&cidr.network().is_ipv4()].1;
        let why = if cidr.prefix() != size {
            Some(format!("not of the cluster's block size, /{size}"))
        } else if names.len() > 1 {
            Some(format!("claimed by the Nodes {}", names.join(", ")))
        } else {
            None
        };
        for name in names {
            match &why {
                Some(why) => out
                    .refused
                    .entry(name.to_owned())
                    .or_default()
                    .push((cidr, why.clone())),
                None => out.blocks.entry(name.to_owned()).or_default().push(cidr),
            }
        }
    }
    out
}

/// The podCIDRs each node's record claims beyond what its Node has (the kubernetes IPAM mode),
/// by node: routed by no one. A record without a Node is not judged (a Node deleted before
/// its record).
pub fn refused_claims(
    records: &BTreeMap<String, NodeIpam>,
    nodes: &BTreeMap<String, ClusterNode>,
) -> BTreeMap<String, Vec<Cidr>> {
    records
        .iter()
        .filter_map(|(name, record)| {
            let node = nodes.get(name)?;
            let beyond: Vec<Cidr> = record.pod_cidrs_beyond(node).collect();
            (!beyond.is_empty()).then(|| (name.clone(), beyond))
        })
        .collect()
}

/// Follows every node's record (and in the kubernetes IPAM mode every Node) and keeps the
/// route map in line, for the life of the daemon.
pub async fn run(
    store: ClusterStore,
    node: String,
    mode: IpamMode,
    uplink: String,
    datapath: Arc<Mutex<Datapath>>,
    metrics: Arc<Metrics>,
) {
    let wake = Wake::default();
    let records = store.follow::<NodeIpam>(&wake, "pod routes").await;
    let nodes = match mode {
        IpamMode::Kubernetes => Some(store.follow::<ClusterNode>(&wake, "pod routes").await),
        _ => None,
    };
    let routes = Routes {
        store,
        node,
        uplink,
        datapath,
        wake,
        records,
        nodes,
        refused: Refused::new(metrics.clone()),
        programmed: BTreeMap::new(),
        in_kernel: None,
    };
    crate::runtime::run(routes, metrics).await;
}

/// The routes' keeper, as a controller.
struct Routes {
    store: ClusterStore,
    node: String,
    uplink: String,
    datapath: Arc<Mutex<Datapath>>,
    wake: Wake,
    records: Copy<NodeIpam>,
    /// The Nodes, in the kubernetes IPAM mode: the blocks and the next hops.
    nodes: Option<Copy<ClusterNode>>,
    refused: Refused,
    programmed: BTreeMap<Cidr, RouteTarget>,
    /// Read from the table on the first pass: a restarted daemon finds its earlier routes.
    in_kernel: Option<BTreeMap<Cidr, RouteTarget>>,
}

impl Controller for Routes {
    const NAME: &'static str = "routes";
    /// A route that cannot be written is logged and tried again at the next recheck.
    type Error = std::convert::Infallible;

    async fn pass(&mut self) -> Result<Next, Self::Error> {
        let (current, nodes) = {
            let at = self.store.moment().await;
            let current: BTreeMap<String, NodeIpam> = self
                .records
                .read(&at)
                .iter()
                .map(|r| (r.name.clone(), r.value.clone()))
                .collect();
            let nodes: Option<BTreeMap<String, ClusterNode>> = self.nodes.as_ref().map(|n| {
                n.read(&at)
                    .iter()
                    .map(|r| (r.name.clone(), r.value.clone()))
                    .collect()
            });
            (current, nodes)
        };
        let vouched = nodes.as_ref().map(|nodes| {
            let vouched = vouched_blocks(nodes);
            self.refused
                .follow(refused_claims(&current, nodes), &vouched.refused);
            vouched
        });
        let hops = nodes.as_ref().map(|nodes| {
            let hops = next_hops(&current, nodes);
            self.refused.follow_addresses(&hops);
            hops
        });
        tracing::debug!(
            node = self.node.as_str(),
            nodes = current.len(),
            "routes pass"
        );
        let want = |uplink_ifindex| {
            desired_routes(
                &self.node,
                &current,
                vouched.as_ref(),
                hops.as_ref(),
                uplink_ifindex,
            )
        };
        program(
            &self.uplink,
            want,
            &mut self.programmed,
            &mut self.in_kernel,
            &self.datapath,
        );
        Ok(Next::Within(RECHECK))
    }

    async fn changed(&mut self) -> Woken {
        self.wake.changed().await;
        Woken::Changed
    }
}

/// The claims refused, as last said: each change is logged once, and the metric counts the
/// nodes refused, by what: `podCIDRs` a record claims beyond its Node's, `nodePodCIDRs` a
/// Node has that are not routed (`vouched_blocks`), `addresses` a record lists that its Node
/// does not (`next_hops`).
struct Refused {
    claims: BTreeMap<String, Vec<Cidr>>,
    nodes: BTreeMap<String, Vec<(Cidr, String)>>,
    addresses: BTreeMap<String, Vec<IpAddr>>,
    unvouched: BTreeMap<String, Vec<IpAddr>>,
    metrics: Arc<Metrics>,
}

impl Refused {
    fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            claims: BTreeMap::new(),
            nodes: BTreeMap::new(),
            addresses: BTreeMap::new(),
            unvouched: BTreeMap::new(),
            metrics,
        }
    }

    /// Says which addresses of the records are not next hops, and which are on the record's
    /// word alone, once per change.
    fn follow_addresses(&mut self, hops: &NextHops) {
        if hops.unvouched != self.unvouched {
            for (node, addresses) in hops
                .unvouched
                .iter()
                .filter(|(n, a)| self.unvouched.get(*n) != Some(a))
            {
                let said: Vec<String> = addresses.iter().map(ToString::to_string).collect();
                tracing::info!(
                    peer = node.as_str(),
                    "node {node}'s pods are routed through {} on its record's word alone: its \
                     Node lists no InternalIP of that family (give its kubelet a --node-ip of \
                     every family it uses)",
                    said.join(", ")
                );
            }
            self.unvouched.clone_from(&hops.unvouched);
        }
        let refused = &hops.refused;
        if *refused == self.addresses {
            return;
        }
        for (node, addresses) in refused
            .iter()
            .filter(|(n, a)| self.addresses.get(*n) != Some(a))
        {
            let said: Vec<String> = addresses.iter().map(ToString::to_string).collect();
            tracing::warn!(
                peer = node.as_str(),
                "node {node}'s record lists addresses its pods are not routed through ({}): \
                 each is not its Node's InternalIP, in a family its Node lists one of, or is \
                 another node's. If node {node} is configured with [node] addresses, give its \
                 kubelet the same (--node-ip); else its agent writes what its Node does not \
                 say: check that node",
                said.join(", ")
            );
        }
        for node in self.addresses.keys().filter(|n| !refused.contains_key(*n)) {
            tracing::info!(
                peer = node.as_str(),
                "node {node}'s record lists only addresses it is routed through again"
            );
        }
        self.count("addresses", refused.len());
        self.addresses.clone_from(refused);
    }

    fn follow(
        &mut self,
        claims: BTreeMap<String, Vec<Cidr>>,
        nodes: &BTreeMap<String, Vec<(Cidr, String)>>,
    ) {
        if claims != self.claims {
            for (node, beyond) in claims
                .iter()
                .filter(|(n, b)| self.claims.get(*n) != Some(b))
            {
                let claimed: Vec<String> = beyond.iter().map(ToString::to_string).collect();
                tracing::warn!(
                    peer = node.as_str(),
                    refused = ?claimed,
                    "node {node}'s record claims podCIDRs its Node does not have ({}): not \
                     routed. Only the Node's podCIDRs are; if the record is not a copy a moment \
                     behind, node {node}'s agent writes what it was not given: check that node",
                    claimed.join(", ")
                );
            }
            self.count("podCIDRs", claims.len());
            self.claims = claims;
        }
        if *nodes != self.nodes {
            for (node, cidrs) in nodes.iter().filter(|(n, c)| self.nodes.get(*n) != Some(c)) {
                let said: Vec<String> = cidrs
                    .iter()
                    .map(|(cidr, why)| format!("{cidr}: {why}"))
                    .collect();
                tracing::warn!(
                    peer = node.as_str(),
                    "Node {node}'s podCIDRs not routed ({}). PodCIDRs are the controller \
                     manager's to set, but a node's own credentials can set them while they are \
                     empty: check node {node}, the other Nodes named, and how their Nodes got \
                     their podCIDRs",
                    said.join("; ")
                );
            }
            for node in self.nodes.keys().filter(|n| !nodes.contains_key(*n)) {
                tracing::info!(
                    peer = node.as_str(),
                    "Node {node}'s podCIDRs are all routed again"
                );
            }
            self.count("nodePodCIDRs", nodes.len());
            self.nodes.clone_from(nodes);
        }
    }

    fn count(&self, field: &str, nodes: usize) {
        self.metrics
            .record_claims_refused
            .get_or_create(&FieldLabel {
                field: field.into(),
            })
            .set(nodes as i64);
    }
}

/// Brings the route map and the host's table in line with the records: adds, changes and
/// removes by difference.
fn program(
    uplink: &str,
    want: impl FnOnce(u32) -> BTreeMap<Cidr, RouteTarget>,
    programmed: &mut BTreeMap<Cidr, RouteTarget>,
    in_kernel: &mut Option<BTreeMap<Cidr, RouteTarget>>,
    datapath: &Mutex<Datapath>,
) {
    let Ok(uplink_ifindex) = iface::index(uplink) else {
        // Logged by the host network's own checks; routes follow once the uplink exists.
        return;
    };
    let want = want(uplink_ifindex);
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
        let routes = desired_routes("a", &records, None, None, 7);
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

    /// A record's `spec.podCIDRs` (its agent's own word) is routed by no one: in the pool modes
    /// only the blocks the operator wrote in the status are, and in the kubernetes IPAM mode
    /// the Node's podCIDRs (the controller manager's word, which no node's credentials can
    /// change). A compromised node listing another node's block, or `0.0.0.0/1`, in its spec
    /// draws no traffic, and is named (issue 58).
    #[test]
    fn only_what_the_cluster_vouches_for_is_routed() {
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
            ("m".to_owned(), liar.clone()),
        ]
        .into();
        let routed: Vec<String> = desired_routes("a", &records, None, None, 7)
            .keys()
            .map(ToString::to_string)
            .collect();
        assert_eq!(routed, ["10.244.1.0/24", "10.244.9.0/24"]);

        // The kubernetes mode: m's Node has 10.245.9.0/24, its record's spec claims more.
        let node = |cidrs: &[&str]| ClusterNode {
            pod_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
            addresses: Vec::new(),
        };
        let mut records = records;
        for r in records.values_mut() {
            r.status.allocated.clear();
        }
        records.get_mut("b").unwrap().spec.pod_cidrs = vec!["10.245.1.0/24".parse().unwrap()];
        records
            .get_mut("m")
            .unwrap()
            .spec
            .pod_cidrs
            .push("10.245.9.0/24".parse().unwrap());
        let nodes: BTreeMap<String, ClusterNode> = [
            ("a".to_owned(), node(&["10.245.0.0/24"])),
            ("b".to_owned(), node(&["10.245.1.0/24"])),
            ("m".to_owned(), node(&["10.245.9.0/24"])),
        ]
        .into();
        let routed: Vec<String> =
            desired_routes("a", &records, Some(&vouched_blocks(&nodes)), None, 7)
                .keys()
                .map(ToString::to_string)
                .collect();
        assert_eq!(routed, ["10.245.1.0/24", "10.245.9.0/24"]);
        let refused = refused_claims(&records, &nodes);
        assert_eq!(
            refused
                .iter()
                .map(|(n, c)| {
                    let c: Vec<String> = c.iter().map(ToString::to_string).collect();
                    format!("{n}: {}", c.join(", "))
                })
                .collect::<Vec<_>>(),
            ["m: 10.244.1.0/25, 0.0.0.0/1"]
        );
    }

    /// In the kubernetes IPAM mode a node's pods are routed through an InternalIP its Node
    /// lists, not one only its record claims: a compromised m listing b's address and the
    /// gateway's draws nothing to them, and is named. A Node listing another node's address
    /// takes nothing from that node (y's kubelet lists x's), nor makes that node route
    /// through itself (w's lists a's). A family the Node lists no address of is routed
    /// through the record's (a kubelet with one --node-ip on a dual-stack node), and another
    /// node listing the same takes nothing from it (e lists b's, f d's); a record without a
    /// Node is not routed (issue 58;
    /// hostile reviews: a rule that gave a contested address to neither Node let a liar cut
    /// any node's routes, and so did refusing, in a family no Node vouches for, an address
    /// another record lists).
    #[test]
    fn next_hops_are_the_addresses_the_nodes_vouch_for() {
        let node = |addresses: &[&str]| ClusterNode {
            pod_cidrs: Vec::new(),
            addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
        };
        let records: BTreeMap<String, NodeIpam> = [
            ("a", record(&["192.168.50.1"], &["10.244.0.0/24"])),
            // Its IPv6 next hop is its Node's: the record lists none.
            (
                "b",
                record(&["192.168.50.2"], &["10.244.1.0/24", "fd00::100/120"]),
            ),
            // Its Node lists no IPv6 address: the record's is taken.
            (
                "d",
                record(
                    &["192.168.50.4", "fd50::4"],
                    &["10.244.4.0/24", "fd00::400/120"],
                ),
            ),
            (
                "m",
                record(&["192.168.50.2", "192.168.50.254"], &["10.244.9.0/24"]),
            ),
            // Its Node lists no IPv6 address, and its record lists b's: taken, b keeps it.
            (
                "e",
                record(
                    &["192.168.50.5", "fd50::2"],
                    &["10.244.5.0/24", "fd00::500/120"],
                ),
            ),
            // It lists d's IPv6 address, which only d's record lists: it takes nothing from d.
            (
                "f",
                record(
                    &["192.168.50.6", "fd50::4"],
                    &["10.244.6.0/24", "fd00::600/120"],
                ),
            ),
            // Its kubelet lists a's address in its Node: not a route a takes through itself.
            ("w", record(&["192.168.50.1"], &["10.244.23.0/24"])),
            ("x", record(&["192.168.50.7"], &["10.244.7.0/24"])),
            ("y", record(&["192.168.50.8"], &["10.244.8.0/24"])),
            ("z", record(&["192.168.50.26"], &["10.244.26.0/24"])),
        ]
        .into_iter()
        .map(|(n, r)| (n.to_owned(), r))
        .collect();
        let nodes: BTreeMap<String, ClusterNode> = [
            ("a", node(&["192.168.50.1"])),
            ("b", node(&["192.168.50.2", "fd50::2"])),
            ("d", node(&["192.168.50.4"])),
            ("e", node(&["192.168.50.5"])),
            ("f", node(&["192.168.50.6"])),
            ("m", node(&["192.168.50.9"])),
            ("w", node(&["192.168.50.1"])),
            ("x", node(&["192.168.50.7"])),
            ("y", node(&["192.168.50.8", "192.168.50.7"])),
        ]
        .into_iter()
        .map(|(n, a)| (n.to_owned(), a))
        .collect();
        let hops = next_hops(&records, &nodes);
        let refused: Vec<String> = hops
            .refused
            .iter()
            .flat_map(|(n, a)| a.iter().map(move |a| format!("{n} {a}")))
            .collect();
        assert_eq!(refused, ["m 192.168.50.2", "m 192.168.50.254"]);
        let unvouched: Vec<String> = hops
            .unvouched
            .iter()
            .flat_map(|(n, a)| a.iter().map(move |a| format!("{n} {a}")))
            .collect();
        assert_eq!(unvouched, ["d fd50::4", "e fd50::2", "f fd50::4"]);
        let routed: Vec<String> = desired_routes("a", &records, None, Some(&hops), 7)
            .iter()
            .map(|(c, t)| format!("{c} via {}", t.next_hop))
            .collect();
        assert_eq!(
            routed,
            [
                "10.244.1.0/24 via 192.168.50.2",
                "10.244.4.0/24 via 192.168.50.4",
                "10.244.5.0/24 via 192.168.50.5",
                "10.244.6.0/24 via 192.168.50.6",
                "10.244.7.0/24 via 192.168.50.7",
                "10.244.8.0/24 via 192.168.50.8",
                "10.244.9.0/24 via 192.168.50.9",
                "fd00::100/120 via fd50::2",
                "fd00::400/120 via fd50::4",
                "fd00::500/120 via fd50::2",
                "fd00::600/120 via fd50::4",
            ]
        );
    }

    /// While a Node's podCIDRs are empty its node's own credentials may set them: a Node that
    /// sets another node's block (before the controller manager gives it to that node, say), a
    /// /25 of it or `0.0.0.0/1` draws none of that traffic, whatever the Nodes' ages or names
    /// (hostile review: an "older Node keeps it" rule handed a newer node's block to a liar).
    #[test]
    fn a_node_claiming_another_s_block_or_a_wider_prefix_draws_none_of_it() {
        let node = |cidrs: &[&str]| ClusterNode {
            pod_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
            addresses: Vec::new(),
        };
        let nodes: BTreeMap<String, ClusterNode> = [
            // The liar, with z's block, a /25 of c's, and half the Internet.
            (
                "a".to_owned(),
                node(&["10.245.9.0/24", "10.245.2.0/25", "0.0.0.0/1", "fd00:1::/64"]),
            ),
            ("b".to_owned(), node(&["10.245.1.0/24", "fd00:2::/64"])),
            ("c".to_owned(), node(&["10.245.2.0/24", "fd00:3::/64"])),
            ("z".to_owned(), node(&["10.245.9.0/24"])),
        ]
        .into();
        let vouched = vouched_blocks(&nodes);
        let shown = |m: &BTreeMap<String, Vec<Cidr>>| -> Vec<String> {
            m.iter()
                .flat_map(|(n, cs)| cs.iter().map(move |c| format!("{n} {c}")))
                .collect()
        };
        assert_eq!(
            shown(&vouched.blocks),
            [
                "a fd00:1::/64",
                "b 10.245.1.0/24",
                "b fd00:2::/64",
                "c 10.245.2.0/24",
                "c fd00:3::/64",
            ]
        );
        let refused: Vec<String> = vouched
            .refused
            .iter()
            .flat_map(|(n, cs)| cs.iter().map(move |(c, why)| format!("{n} {c}: {why}")))
            .collect();
        assert_eq!(
            refused,
            [
                "a 0.0.0.0/1: not of the cluster's block size, /24",
                "a 10.245.2.0/25: not of the cluster's block size, /24",
                "a 10.245.9.0/24: claimed by the Nodes a, z",
                "z 10.245.9.0/24: claimed by the Nodes a, z",
            ]
        );
        let records: BTreeMap<String, NodeIpam> = ["a", "b", "c", "z"]
            .iter()
            .enumerate()
            .map(|(i, n)| {
                (
                    (*n).to_owned(),
                    record(&[&format!("192.168.50.{}", i + 1)], &[]),
                )
            })
            .collect();
        let routed: Vec<String> = desired_routes("c", &records, Some(&vouched), None, 7)
            .iter()
            .map(|(c, t)| format!("{c} via {}", t.next_hop))
            .collect();
        assert_eq!(routed, ["10.245.1.0/24 via 192.168.50.2"]);
    }
}
