//! IPAM resources as stored (and, later, as Kubernetes CRDs): pools, per-node IPAM records and
//! the cluster's IPAM configuration. Field names follow Cilium's where users know them.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::{
    Cidr, Family,
    meta::Condition,
    pod::pool::{IpamMode, PodIpPoolSpec},
};
use crate::store::Resource;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PodIpPool {
    pub spec: PodIpPoolSpec,
    #[serde(default)]
    pub status: PoolStatus,
}

impl Resource for PodIpPool {
    const KIND: &'static str = "PodIPPool";
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PoolStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The spec the operator uses: the last one that passed validation and the in-use rules. A
    /// refused change leaves it as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_spec: Option<PodIpPoolSpec>,
    #[serde(default)]
    pub usage: Vec<FamilyUsageStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct FamilyUsageStatus {
    pub family: Family,
    pub cidrs: Vec<Cidr>,
    pub mask_size: u8,
    #[serde(with = "crate::count")]
    #[cfg_attr(feature = "schema", schemars(with = "crate::count::Schema"))]
    pub total_blocks: u128,
    #[serde(with = "crate::count")]
    #[cfg_attr(feature = "schema", schemars(with = "crate::count::Schema"))]
    pub used_blocks: u128,
}

/// One node's IPAM record (like CiliumNode.spec.ipam): what it asks for and what it holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct NodeIpam {
    #[serde(default)]
    pub spec: NodeIpamSpec,
    #[serde(default)]
    pub status: NodeIpamStatus,
}

/// The condition the operator sets on a node whose lease lapsed for the grace period (its
/// blocks went back to the pools). Liveness between the agents no longer counts such a node
/// among the members a majority is reckoned from.
pub const LEASE_LAPSED: &str = "LeaseLapsed";

/// The condition the operators set on a node whose pods they set not ready on the reports of
/// a majority (the daemon's `cluster::dead_nodes`), kept while the majority reports it: a
/// replica that takes over reads it and does not mark them again, so a kubelet that restored
/// them keeps the last word.
pub const PODS_MARKED_NOT_READY: &str = "PodsMarkedNotReady";

/// A node as the cluster itself knows it, apart from this project: on Kubernetes the core/v1
/// Node (read only). The operator keeps a node's blocks while its Node exists, however long its
/// lease has lapsed: a node that lost power or reboots keeps its pods' blocks until it is
/// deleted, as Kubernetes keeps a Node's podCIDRs (and Cilium a CiliumNode's). The other stores
/// have no such objects: there a node loses its blocks after the grace period.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterNode {
    /// The Node's `spec.podCIDRs`, those that are CIDRs (the API server takes some this
    /// project does not, such as one with host bits; they are left out, as the node's own
    /// agent leaves them out): the kubernetes IPAM mode's blocks. The controller manager sets
    /// them, and the API server lets no update change them once set; but while they are empty
    /// (before the controller manager's turn, or with it not assigning any) a node's own
    /// credentials may set them, so the routes take only those of the cluster's block size
    /// that no other Node has (the daemon's `routes::vouched_blocks`).
    #[serde(
        default,
        rename = "podCIDRs",
        deserialize_with = "entries_that_parse",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub pod_cidrs: Vec<Cidr>,
    /// The Node's addresses between nodes: its `status.addresses` of type InternalIP, in the
    /// order the Node lists them (those that are addresses). The kubelet writes them for its
    /// own Node only (NodeRestriction), or a cloud's node controller does: in the kubernetes
    /// IPAM mode the routes to a node's pods go through one of them, not through an address
    /// only its agent's record claims (the daemon's `routes::next_hops`).
    #[serde(
        default,
        deserialize_with = "entries_that_parse",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub addresses: Vec<IpAddr>,
}

/// The entries of a list that parse as `T` (CIDRs, addresses); other entries, and entries
/// that are not text, are left out.
fn entries_that_parse<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Entry {
        Text(String),
        Other(serde::de::IgnoredAny),
    }
    let entries = Option::<Vec<Entry>>::deserialize(d)?.unwrap_or_default();
    Ok(entries
        .iter()
        .filter_map(|e| match e {
            Entry::Text(text) => text.parse().ok(),
            Entry::Other(_) => None,
        })
        .collect())
}

impl Resource for ClusterNode {
    const KIND: &'static str = "Node";
}

impl NodeIpam {
    /// Whether the operator released this node for a lapsed lease (and it has not come back).
    pub fn lease_lapsed(&self) -> bool {
        self.status
            .conditions
            .iter()
            .any(|c| c.kind == LEASE_LAPSED && c.status)
    }

    /// The node's pod blocks, where other nodes route its pods' traffic: those the operator gave
    /// it from the pools (its status, which only the operator writes), and, in the kubernetes
    /// IPAM mode, its Node's podCIDRs (`vouched`: the cluster's word, not its agent's). A
    /// record's `spec.podCIDRs` is its agent's word alone (a copy of its Node's, in that mode)
    /// and is routed by no one: a compromised node could otherwise draw any prefix's traffic
    /// (docs/security.md).
    pub fn pod_blocks<'a>(
        &'a self,
        vouched: Option<&'a [Cidr]>,
    ) -> impl Iterator<Item = Cidr> + 'a {
        self.status
            .allocated
            .iter()
            .map(|b| b.cidr)
            .chain(vouched.into_iter().flatten().copied())
    }

    /// The podCIDRs this record's agent claims that its Node does not have: a copy gone
    /// stale for a moment, or a node that lies.
    pub fn pod_cidrs_beyond<'a>(
        &'a self,
        node: &'a ClusterNode,
    ) -> impl Iterator<Item = Cidr> + 'a {
        self.spec
            .pod_cidrs
            .iter()
            .copied()
            .filter(|c| !node.pod_cidrs.contains(c))
    }
}

impl Resource for NodeIpam {
    const KIND: &'static str = "NodeIPAM";
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct NodeIpamSpec {
    /// Multi-pool: blocks wanted per pool and family. Cluster-pool ignores it (one block per
    /// family of `default`); kubernetes mode uses `pod_cidrs` instead.
    #[serde(default)]
    pub pools: Vec<PoolRequest>,
    /// Kubernetes mode: the node's blocks as given by Node.spec.podCIDRs.
    #[serde(default, rename = "podCIDRs", alias = "podCidrs")]
    pub pod_cidrs: Vec<Cidr>,
    /// Blocks the node still holds from before its blocks were released (its lease had
    /// lapsed): the operator gives each back if it is still free, else lists it as lost.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reclaim: Vec<AllocatedBlock>,
    /// The node's own addresses on the network between nodes (one per family), where other
    /// nodes send traffic for this node's pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<std::net::IpAddr>,
    /// The node's labels (L2 announcement policies select nodes by them).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// The node's interfaces that are up, with their addresses: where it could announce
    /// Service IPs, and which subnets those reach.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<NodeInterface>,
    /// Interfaces this node's agent saw up with an address since it started that are not any
    /// more, with why: where it stopped answering for Service IPs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces_down: Vec<InterfaceDown>,
    /// Set by the node's agent as it stops for a restart (`[node] on_stop = "restart"`); the
    /// next agent clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarting: Option<RestartNotice>,
    /// Set by the node's agent as it stops for a leave (`[node] on_stop = "leave"`), its
    /// responders already silent: the other nodes reckon the gossip's majority without it, so
    /// that the nodes left behind by two of three leaving keep answering. The next agent
    /// clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left: Option<LeaveNotice>,
    /// Whether the node may announce Service IPs, as its own agent judged it.
    #[serde(default, skip_serializing_if = "NodeAnnouncing::is_default")]
    pub announcing: NodeAnnouncing,
    /// The public half of the key the node's agent signs its gossip with (`ed25519:` and 64
    /// hex digits), made at the agent's start and written here before its first packet: the
    /// others take gossip from this node's addresses only when signed with it. Absent from
    /// records of releases that do not sign (docs/security.md, "Gossip identity").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gossip_key: Option<String>,
    /// The release of the agent that wrote the record (`0.1.0`): during a rolling upgrade, which
    /// nodes run which. Absent from records written by releases before it was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// Other nodes this node's agent holds dead: declared dead by the gossip while this node
    /// held a majority, and silent on a second, independent signal (their kubelet's port). The
    /// operator takes a node's pods out of their Services' endpoints once a majority of the
    /// nodes report it (docs/kubernetes.md, "Dead nodes' endpoints").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers_down: Vec<PeerDown>,
}

/// One node another node's agent holds dead, and the evidence it has for it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PeerDown {
    pub node: String,
    /// What the second signal found, for people: `kubelet 10.0.0.3:10250: no answer within
    /// 300 ms`.
    pub evidence: String,
}

/// What a node's agent found about announcing from it: whether it is excluded (and why), and
/// what on the node gets in the way of announcing cleanly. Each agent judges its own node by
/// its own configuration and publishes the verdict, so that every agent decides ownership from
/// the same facts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct NodeAnnouncing {
    /// Why the node announces no Service IP (its exclusion label, NotReady, cordoned, network
    /// unavailable); none: it may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excluded: Option<String>,
    /// Problems that let clients see the wrong answer, with what to do (kube-proxy's IPVS mode
    /// without strictARP).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl NodeAnnouncing {
    pub fn is_default(&self) -> bool {
        self == &Self::default()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PoolRequest {
    pub pool: String,
    pub family: Family,
    /// Blocks the node wants to hold.
    pub needed: u32,
    /// Empty blocks the node gives back.
    #[serde(default)]
    pub release: Vec<Cidr>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct NodeIpamStatus {
    #[serde(default)]
    pub allocated: Vec<AllocatedBlock>,
    /// Blocks the node asked back that another node holds now: the node must stop using them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<AllocatedBlock>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AllocatedBlock {
    pub pool: String,
    pub cidr: Cidr,
}

/// The cluster's IPAM configuration (one object, named `cluster`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct IpamConfig {
    pub mode: IpamMode,
}

impl Resource for IpamConfig {
    const KIND: &'static str = "IpamConfig";
}

/// Name of the one `IpamConfig` object.
pub const CLUSTER: &str = "cluster";

/// The name of node `node`'s liveness lease (a `Lease` object the node's agent renews).
pub fn node_lease_name(node: &str) -> String {
    format!("node-{node}")
}

/// The name of the operators' leader-election lease.
pub const OPERATOR_LEASE: &str = "ipam-operator";

/// An interface of a node that is up, with its addresses (published in the node's record).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NodeInterface {
    pub name: String,
    /// Addresses with their prefix (`10.0.0.5/24`): what the interface's subnets are.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// Its MAC address (`02:00:0a:4d:00:01`): where a node that takes over one of this node's
    /// Service IPs passes on the connections this node still holds. Absent from records
    /// written by releases before it was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// A node's agent stopping for a restart: its responders go on answering for its Service IPs
/// for `withinMs`, and the other agents keep those IPs where they are for as long, counted
/// from when each sees the notice (so no clock is compared), unless the node is back in the
/// gossip sooner. If it is not back by then, they take its IPs over as from a dead node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RestartNotice {
    pub within_ms: u64,
    /// When the agent stopped (Unix milliseconds, its clock): tells one restart from the next,
    /// and people when it happened; an agent that starts while the restart is under way holds
    /// the node for what is left of `within_ms` from it (allowing a little clock skew).
    pub since_unix_ms: u64,
    /// The Service IPs its responders answer on while it restarts: the others leave them with
    /// it until it is back or its promise ends, whatever else changes meanwhile (a Local
    /// Service's endpoints moving, a node joining), since nothing of its own lets go of them.
    /// Written even when empty (a node answering nothing keeps nothing); absent from the
    /// notices of releases before the list, whose node keeps what the others see it own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answering: Option<Vec<std::net::IpAddr>>,
}

/// A node's agent stopped for a leave: silent, out of the gossip, counted by nobody's majority
/// until its next agent runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LeaveNotice {
    /// When the agent stopped (Unix milliseconds, its clock), for people.
    pub since_unix_ms: u64,
}

/// An interface a node announced from that it cannot announce from any more.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct InterfaceDown {
    pub name: String,
    /// For people: `no carrier (the link is lost)`, `set down`, `no address`, `gone (removed
    /// or renamed)`.
    pub why: String,
}

impl NodeInterface {
    /// The MAC address, if the record has a well-formed one.
    pub fn mac_octets(&self) -> Option<[u8; 6]> {
        let mut octets = [0u8; 6];
        let mut parts = self.mac.as_deref()?.split(':');
        for octet in &mut octets {
            *octet = u8::from_str_radix(parts.next()?, 16).ok()?;
        }
        parts.next().is_none().then_some(octets)
    }

    /// The subnets the interface's addresses are in.
    pub fn subnets(&self) -> impl Iterator<Item = Cidr> + '_ {
        self.addresses.iter().filter_map(|a| {
            let (ip, prefix) = a.split_once('/')?;
            let ip: std::net::IpAddr = ip.parse().ok()?;
            let prefix: u8 = prefix.parse().ok()?;
            let net = ipnet::IpNet::new(ip, prefix).ok()?.trunc();
            format!("{net}").parse().ok()
        })
    }
}

/// The nodes' records as one node's copy has them: what the decisions read of them (restart
/// notices, interfaces, labels, addresses).
pub trait NodeRecords {
    fn record(&self, node: &str) -> Option<&NodeIpam>;
    /// Every record, with its node's name.
    fn each(&self) -> Box<dyn Iterator<Item = (&str, &NodeIpam)> + '_>;
}

impl NodeRecords for std::collections::BTreeMap<String, NodeIpam> {
    fn record(&self, node: &str) -> Option<&NodeIpam> {
        self.get(node)
    }

    fn each(&self) -> Box<dyn Iterator<Item = (&str, &NodeIpam)> + '_> {
        Box::new(self.iter().map(|(name, record)| (name.as_str(), record)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Node is read whatever its podCIDRs hold (the API server takes some this project does
    /// not): the operator asks whether a node's Node exists, and one it could not read would
    /// stop its pass (hostile review).
    #[test]
    fn a_node_with_podcidrs_that_are_not_cidrs_still_reads() {
        let node: ClusterNode = serde_json::from_str(
            r#"{"podCIDRs": ["10.0.0.1/8", "10.244.1.0/24", 7, "fd00::/64"]}"#,
        )
        .expect("a Node with odd podCIDRs reads");
        let cidrs: Vec<String> = node.pod_cidrs.iter().map(ToString::to_string).collect();
        assert_eq!(cidrs, ["10.244.1.0/24", "fd00::/64"]);
        let node: ClusterNode =
            serde_json::from_str(r#"{"addresses": ["192.0.2.7", "node-7", 7, "fd00::7"]}"#)
                .expect("a Node with odd addresses reads");
        let addresses: Vec<String> = node.addresses.iter().map(ToString::to_string).collect();
        assert_eq!(addresses, ["192.0.2.7", "fd00::7"]);
        for empty in [r#"{}"#, r#"{"podCIDRs": null}"#] {
            let node: ClusterNode = serde_json::from_str(empty).expect(empty);
            assert!(node.pod_cidrs.is_empty(), "{empty}");
        }
    }

    #[test]
    fn an_interface_s_mac_reads_back_only_when_well_formed() {
        let with = |mac: Option<&str>| NodeInterface {
            name: "eth0".into(),
            addresses: vec!["10.0.0.5/24".into()],
            mac: mac.map(str::to_owned),
        };
        assert_eq!(
            with(Some("02:00:0a:4d:00:01")).mac_octets(),
            Some([2, 0, 0x0a, 0x4d, 0, 1])
        );
        for bad in [
            "02:00:0a:4d:00",
            "02:00:0a:4d:00:01:02",
            "02:00:0a:4d:00:zz",
            "",
        ] {
            assert_eq!(with(Some(bad)).mac_octets(), None, "{bad}");
        }
        assert_eq!(with(None).mac_octets(), None);
        // Records of releases before the field read as before.
        let old: NodeInterface =
            serde_json::from_str(r#"{"name":"eth0","addresses":["10.0.0.5/24"]}"#).unwrap();
        assert_eq!(old, with(None));
    }
}
