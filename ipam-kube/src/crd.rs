//! The project's resources as Kubernetes custom resources, their CRDs generated from these
//! types (`deploy/base/crds.yaml` is generated from them; a test fails when it drifts).
//!
//! Group `ipam-ebpf.io`, version `v1alpha1`, every kind cluster-scoped. The specs are the
//! engine's own types (the same documents `ipamctl apply` takes); the statuses are the engine's
//! with Kubernetes conditions (`metav1.Condition`: status `True`/`False`, a CamelCase reason, a
//! last transition time), and are written through the status subresource.

// Each `printcolumn(...)` of a `#[kube]` attribute is its own column; clippy reads their
// repeated `type_ = "string"` as one attribute given twice.
#![allow(clippy::duplicated_attributes)]

use ipam_core::{
    lb::{
        bgp::{BgpAdvertisementSpec, BgpPeerSpec, BgpSessionStatus},
        resources::{L2PolicySpec, LbFamilyCount, LbIpPoolSpec},
    },
    pod::pool::PodIpPoolSpec,
    resources::{AllocatedBlock, FamilyUsageStatus, NodeIpamSpec},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "ipam-ebpf.io";
pub const VERSION: &str = "v1alpha1";

/// A pool of pod addresses, cut into per-node blocks (the engine's `PodIPPool`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ipam-ebpf.io",
    version = "v1alpha1",
    kind = "PodIPPool",
    plural = "podippools",
    shortname = "pipp",
    status = "PodIPPoolStatus",
    doc = "A pool of pod addresses, cut into blocks that the operator hands to nodes",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "IPv4 CIDRs", type_ = "string", json_path = ".spec.ipv4.cidrs"),
    printcolumn(
        name = "IPv4 Mask",
        type_ = "integer",
        json_path = ".spec.ipv4.maskSize"
    ),
    printcolumn(
        name = "IPv4 Blocks Used",
        type_ = "string",
        json_path = ".status.usage[?(@.family==\"v4\")].usedBlocks"
    ),
    printcolumn(
        name = "IPv4 Blocks",
        type_ = "string",
        json_path = ".status.usage[?(@.family==\"v4\")].totalBlocks"
    ),
    printcolumn(
        name = "IPv6 CIDRs",
        type_ = "string",
        json_path = ".spec.ipv6.cidrs",
        priority = "1"
    ),
    printcolumn(
        name = "IPv6 Blocks Used",
        type_ = "string",
        json_path = ".status.usage[?(@.family==\"v6\")].usedBlocks",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct PodIPPoolSpec {
    #[serde(flatten)]
    pub pool: PodIpPoolSpec,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodIPPoolStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The spec the operator uses: the last one that passed validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_spec: Option<PodIpPoolSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<FamilyUsageStatus>,
}

/// One node's IPAM record: what the node asks for (spec, written by its agent) and the blocks
/// it holds (status, written by the operator). Named after the node.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ipam-ebpf.io",
    version = "v1alpha1",
    kind = "NodeIPAM",
    plural = "nodeipams",
    shortname = "nipam",
    status = "NodeIPAMStatus",
    doc = "One node's IPAM record: the blocks it asks for and the blocks it holds",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Blocks",
        type_ = "string",
        json_path = ".status.allocated[*].cidr"
    ),
    printcolumn(name = "Addresses", type_ = "string", json_path = ".spec.addresses"),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].message",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct NodeIPAMSpec {
    #[serde(flatten)]
    pub node: NodeIpamSpec,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeIPAMStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocated: Vec<AllocatedBlock>,
    /// Blocks the node asked back that another node holds now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<AllocatedBlock>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A pool of Service IPs (LB-IPAM).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ipam-ebpf.io",
    version = "v1alpha1",
    kind = "LoadBalancerIPPool",
    plural = "loadbalancerippools",
    shortname = "lbipp",
    status = "LoadBalancerIPPoolStatus",
    doc = "A pool of IPs for Services of type LoadBalancer",
    printcolumn(name = "Disabled", type_ = "boolean", json_path = ".spec.disabled"),
    printcolumn(
        name = "Conflicting",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Conflict\")].status"
    ),
    printcolumn(
        name = "Reachable",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Reachable\")].status"
    ),
    printcolumn(
        name = "IPv4 Used",
        type_ = "string",
        json_path = ".status.counts[?(@.family==\"v4\")].used"
    ),
    printcolumn(
        name = "IPv4 Total",
        type_ = "string",
        json_path = ".status.counts[?(@.family==\"v4\")].total"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct LoadBalancerIPPoolSpec {
    #[serde(flatten)]
    pub pool: LbIpPoolSpec,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIPPoolStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counts: Vec<LbFamilyCount>,
}

/// Which nodes answer ARP/NDP for which Services' IPs, on which interfaces.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ipam-ebpf.io",
    version = "v1alpha1",
    kind = "L2AnnouncementPolicy",
    plural = "l2announcementpolicies",
    shortname = "l2ap",
    doc = "Which nodes answer ARP/NDP for which Services' IPs, on which interfaces",
    printcolumn(name = "Interfaces", type_ = "string", json_path = ".spec.interfaces"),
    printcolumn(
        name = "LB IPs",
        type_ = "boolean",
        json_path = ".spec.loadBalancerIPs"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct L2AnnouncementPolicySpec {
    #[serde(flatten)]
    pub policy: L2PolicySpec,
}

/// A BGP neighbour the selected nodes open sessions with.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ipam-ebpf.io",
    version = "v1alpha1",
    kind = "BGPPeer",
    plural = "bgppeers",
    shortname = "bgpp",
    status = "BGPPeerStatus",
    doc = "A BGP neighbour (router) the selected nodes advertise Service IPs to",
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.peerAddress"),
    printcolumn(name = "ASN", type_ = "integer", json_path = ".spec.peerASN"),
    printcolumn(
        name = "Established",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Established\")].status"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Established\")].message",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct BGPPeerSpec {
    #[serde(flatten)]
    pub peer: BgpPeerSpec,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BGPPeerStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Each node's session, as its agent last saw it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["node"]))]
    pub nodes: Vec<BgpSessionStatus>,
}

/// Which Services' IPs go to which BGP peers, from which nodes, with which attributes.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ipam-ebpf.io",
    version = "v1alpha1",
    kind = "BGPAdvertisement",
    plural = "bgpadvertisements",
    shortname = "bgpa",
    doc = "Which Services' IPs are advertised over BGP, to which peers, from which nodes",
    printcolumn(name = "Pools", type_ = "string", json_path = ".spec.ipPools"),
    printcolumn(name = "Peers", type_ = "string", json_path = ".spec.peers"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct BGPAdvertisementSpec {
    #[serde(flatten)]
    pub advertisement: BgpAdvertisementSpec,
}

type Crd =
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// Every CRD of the project, in the order they are installed.
pub fn all() -> Vec<Crd> {
    use kube::CustomResourceExt as _;
    vec![
        PodIPPool::crd(),
        NodeIPAM::crd(),
        LoadBalancerIPPool::crd(),
        L2AnnouncementPolicy::crd(),
        BGPPeer::crd(),
        BGPAdvertisement::crd(),
    ]
    .into_iter()
    .map(with_old_spellings)
    .collect()
}

/// Keeps each renamed field's old spelling in the schema (`ipam_core::spelling`), marked
/// deprecated: the API server prunes fields its schema does not name, also from objects it
/// reads back from etcd, so without it an object written with the old spelling would lose the
/// field instead of being read with a note. Neither spelling carries a schema default: the
/// server would fill in the new name beside an old one the user wrote, and the two would
/// disagree; the engine's own defaults apply instead when a field is absent.
fn with_old_spellings(crd: Crd) -> Crd {
    let kind = crd.spec.names.kind.clone();
    let mut value = serde_json::to_value(&crd).expect("a CRD serialises");
    for version in value["spec"]["versions"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        for renamed in ipam_core::spelling::RENAMED
            .iter()
            .filter(|r| r.kind == kind)
        {
            let properties = &mut version["schema"]["openAPIV3Schema"]["properties"]
                [renamed.parent]["properties"];
            let Some(new) = properties.get_mut(renamed.new) else {
                panic!(
                    "{kind}: the renamed field {} is not in the schema",
                    renamed.new
                )
            };
            if let Some(new) = new.as_object_mut() {
                new.remove("default");
            }
            let mut old = new.clone();
            old["description"] = serde_json::Value::String(format!(
                "Deprecated: the old spelling of {}, still read. Write {} instead.",
                renamed.new, renamed.new
            ));
            properties[renamed.old] = old;
        }
    }
    serde_json::from_value(value).expect("the CRD with its old spellings deserialises")
}

/// The CRDs as one multi-document YAML file: what `deploy/base/crds.yaml` holds.
pub fn yaml() -> String {
    let mut out = String::from(
        "# Generated from the Rust types in ipam-kube/src/crd.rs; do not edit by hand.\n\
         # Regenerate with: IPAM_WRITE_CRDS=1 cargo test -p ipam-kube --test crds\n",
    );
    for crd in all() {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&crd).expect("a CRD serialises"));
    }
    out
}
