//! Load-balancer resources as stored (and as YAML for `ipamctl apply`): the pools Service IPs
//! come from, the Services, and the policies that say which nodes announce them. Field names
//! follow Kubernetes' and Cilium's where users know them.

use std::{collections::BTreeMap, net::IpAddr};

use serde::{Deserialize, Serialize};

use crate::{
    Family,
    meta::{Condition, Selector},
    store::Resource,
};

/// The `loadBalancerClass` this project serves; services without a class are served too.
pub const LB_CLASS: &str = "ipam-ebpf.io/l2";

/// The Service-specific half of `Selector`: Cilium's two labels of every Service.
impl Selector {
    /// Whether it selects `service` (`namespace/name`) with `labels`: over its labels and the
    /// two Cilium adds to every Service (`SERVICE_NAMESPACE_LABEL`, `SERVICE_NAME_LABEL`), so a
    /// Cilium user's selector keeps its meaning. Those two always come from the Service's
    /// name, whatever labels it carries: a Service of one tenant that labels itself with
    /// another's namespace must not get that tenant's pool, nor its announcements.
    /// Nothing is copied: the owner decision asks this for every Service on every pass.
    pub fn matches_service(&self, service: &str, labels: &BTreeMap<String, String>) -> bool {
        let (namespace, name) = service.split_once('/').unwrap_or(("default", service));
        self.matches_by(|key| match key {
            SERVICE_NAMESPACE_LABEL => Some(namespace),
            SERVICE_NAME_LABEL => Some(name),
            _ => labels.get(key).map(String::as_str),
        })
    }
}

/// A pool of Service IPs (like CiliumLoadBalancerIPPool).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LbIpPool {
    /// The pool's own labels (on Kubernetes its `metadata.labels`), which L2 policies' and BGP
    /// advertisements' `ipPoolSelector` select.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    pub spec: LbIpPoolSpec,
    #[serde(default)]
    pub status: LbIpPoolStatus,
}

impl Resource for LbIpPool {
    const KIND: &'static str = "LoadBalancerIPPool";
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LbIpPoolSpec {
    /// CIDRs or start/stop ranges, IPv4 and IPv6.
    pub blocks: Vec<LbIpBlock>,
    /// Which services may take IPs from it; empty: every service.
    #[serde(default)]
    pub service_selector: Selector,
    /// Also hand out the first and last address of each CIDR (network and broadcast for IPv4).
    #[serde(default, rename = "allowFirstLastIPs", alias = "allowFirstLastIps")]
    pub allow_first_last_ips: bool,
    /// Keeps its assignments, gives no new ones.
    #[serde(default)]
    pub disabled: bool,
    /// Hands out addresses to Services that do not ask for them (MetalLB's `autoAssign`);
    /// false: only IPs a Service asks for (expensive public addresses).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub auto_assign: bool,
    /// Never hands out an IPv4 address ending in .0 or .255 unless asked for (MetalLB's
    /// `avoidBuggyIPs`: some clients and middleboxes drop them).
    #[serde(
        default,
        skip_serializing_if = "std::ops::Not::not",
        rename = "avoidBuggyIPs",
        alias = "avoidBuggyIps"
    )]
    pub avoid_buggy_ips: bool,
    /// Only Services of these namespaces get its addresses (MetalLB's
    /// `serviceAllocation.namespaces`); empty: every namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Only Services of namespaces whose labels it selects get its addresses (MetalLB's
    /// `serviceAllocation.namespaceSelectors`); empty: every namespace. With `namespaces` too,
    /// a namespace must pass both.
    #[serde(default, skip_serializing_if = "Selector::is_empty")]
    pub namespace_selector: Selector,
    /// Among the pools that may give a Service a new IP, lower first (MetalLB's
    /// `serviceAllocation.priority`); pools without one come after those with, each in name
    /// order. IPs a Service holds never move to a pool of higher priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
}

/// A pool with no blocks, every control at the value a document that leaves it out gets (it
/// hands out addresses: `autoAssign` true).
impl Default for LbIpPoolSpec {
    fn default() -> Self {
        Self {
            blocks: Vec::new(),
            service_selector: Selector::default(),
            allow_first_last_ips: false,
            disabled: false,
            auto_assign: true,
            avoid_buggy_ips: false,
            namespaces: Vec::new(),
            namespace_selector: Selector::default(),
            priority: None,
        }
    }
}

/// The labels Cilium adds to every Service for selectors: its namespace and its name. Pool and
/// policy `serviceSelector`s match them beside the Service's own labels
/// (`Selector::matches_service`); they are derived from the Service's name and override a
/// label of the same key the Service carries.
pub const SERVICE_NAMESPACE_LABEL: &str = "io.kubernetes.service.namespace";
pub const SERVICE_NAME_LABEL: &str = "io.kubernetes.service.name";

/// Why `service` (`namespace/name`) carries a reserved label with a value other than the one
/// derived from its name, if it does: the label is ignored, and the Service is told so.
pub fn reserved_labels_ignored(service: &str, labels: &BTreeMap<String, String>) -> Option<String> {
    let (namespace, name) = service.split_once('/').unwrap_or(("default", service));
    let ignored: Vec<String> = [
        (SERVICE_NAMESPACE_LABEL, namespace),
        (SERVICE_NAME_LABEL, name),
    ]
    .into_iter()
    .filter_map(|(key, derived)| {
        let given = labels.get(key)?;
        (given != derived).then(|| format!("{key}={given} (it is {derived})"))
    })
    .collect();
    (!ignored.is_empty()).then(|| {
        format!(
            "the label {} is reserved: selectors see the value derived from the Service's \
             namespace and name, and the Service's own is ignored; remove it",
            ignored.join(" and ")
        )
    })
}

/// A Service's namespace, from its name (`namespace/name`).
pub fn namespace_of(service: &str) -> &str {
    service
        .split_once('/')
        .map_or("default", |(namespace, _)| namespace)
}

/// Whether Services `a` and `b` (`namespace/name`) may hold one address: of one namespace, or
/// each allowing the other's (`sharingCrossNamespace`). A sharing key is easy to guess, and an
/// IP shared with a stranger's Service sends it traffic meant for ours. LB-IPAM shares by it,
/// and the external IPs contest by it.
pub fn may_share(a: &str, a_spec: &ServiceSpec, b: &str, b_spec: &ServiceSpec) -> bool {
    let (a_ns, b_ns) = (namespace_of(a), namespace_of(b));
    let allows = |spec: &ServiceSpec, ns: &str| {
        spec.sharing_cross_namespace
            .iter()
            .any(|n| n == "*" || n == ns)
    };
    a_ns == b_ns || (allows(a_spec, b_ns) && allows(b_spec, a_ns))
}

fn is_true(b: &bool) -> bool {
    *b
}

impl LbIpPoolSpec {
    /// Whether the pool may give `service` (`namespace/name`) its addresses: its namespace is
    /// admitted, and the selector selects it (`Selector::matches_service`).
    pub fn serves(&self, service: &str, spec: &ServiceSpec) -> bool {
        self.admits(namespace_of(service), &spec.namespace_labels)
            && self.service_selector.matches_service(service, &spec.labels)
    }

    /// Whether Services of `namespace`, with `labels`, may have its addresses (`namespaces`,
    /// `namespaceSelector`; empty: all).
    pub fn admits(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        (self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace))
            && self.namespace_selector.matches(labels)
    }

    /// Whether `ip` lies in one of the blocks as written (validity is judged by LB-IPAM).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip_value = crate::cidr::ip_to_u128(ip);
        self.blocks.iter().any(|b| {
            b.bounds().is_some_and(|(family, first, last)| {
                family == Family::of(ip) && (first..=last).contains(&ip_value)
            })
        })
    }
}

/// A CIDR (`cidr`) or an inclusive range (`start`, `stop`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LbIpBlock {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<String>,
}

impl LbIpBlock {
    /// The block's family and first and last address as written (a CIDR whole, network and
    /// broadcast too); `None` when it does not parse (LB-IPAM reports those).
    pub fn bounds(&self) -> Option<(Family, u128, u128)> {
        use crate::cidr::ip_to_u128;
        match (&self.cidr, &self.start, &self.stop) {
            (Some(c), ..) => {
                let c = c.parse::<crate::Cidr>().ok()?;
                Some((c.family(), c.base(), c.last()))
            }
            (None, Some(a), Some(z)) => {
                let (a, z) = (a.parse::<IpAddr>().ok()?, z.parse::<IpAddr>().ok()?);
                (Family::of(a) == Family::of(z) && ip_to_u128(a) <= ip_to_u128(z))
                    .then(|| (Family::of(a), ip_to_u128(a), ip_to_u128(z)))
            }
            _ => None,
        }
    }

    /// The block as its user wrote it, for messages: `CIDR` or `START-STOP`.
    pub fn describe(&self) -> String {
        match (&self.cidr, &self.start, &self.stop) {
            (Some(cidr), ..) => cidr.clone(),
            (None, Some(start), Some(stop)) => format!("{start}-{stop}"),
            _ => "?".to_owned(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LbIpPoolStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub counts: Vec<LbFamilyCount>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LbFamilyCount {
    pub family: Family,
    #[serde(with = "crate::count")]
    #[cfg_attr(feature = "schema", schemars(with = "crate::count::Schema"))]
    pub total: u128,
    #[serde(with = "crate::count")]
    #[cfg_attr(feature = "schema", schemars(with = "crate::count::Schema"))]
    pub used: u128,
    #[serde(with = "crate::count")]
    #[cfg_attr(feature = "schema", schemars(with = "crate::count::Schema"))]
    pub available: u128,
}

/// A Service (the parts LB-IPAM and L2 announcements read); named `<namespace>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Service {
    pub spec: ServiceSpec,
    #[serde(default)]
    pub status: ServiceStatus,
}

impl Resource for Service {
    const KIND: &'static str = "Service";
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(rename = "type", default)]
    pub service_type: ServiceType,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub ports: Vec<ServicePort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer_class: Option<String>,
    /// IPs asked for (like the `lbipam.cilium.io/ips` annotation).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        rename = "requestedIPs",
        alias = "requestedIps"
    )]
    pub requested_ips: Vec<IpAddr>,
    /// Services with the same key share an IP when their ports do not clash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing_key: Option<String>,
    /// The pool it asks for by name (MetalLB's `metallb.io/address-pool`): its new IPs come
    /// from that pool only, also when the pool does not assign automatically, and an IP held
    /// outside it is given up for one of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The other namespaces whose Services may share its IP (Cilium's
    /// `lbipam.cilium.io/sharing-cross-namespace`; `*`: any). Two Services of different
    /// namespaces share only when each allows the other's: a sharing key alone is guessable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sharing_cross_namespace: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_families: Vec<Family>,
    #[serde(default)]
    pub ip_family_policy: IpFamilyPolicy,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        rename = "externalIPs",
        alias = "externalIps"
    )]
    pub external_ips: Vec<IpAddr>,
    /// `externalTrafficPolicy`: whether outside traffic may go to endpoints on any node.
    #[serde(default, skip_serializing_if = "TrafficPolicy::is_cluster")]
    pub external_traffic_policy: TrafficPolicy,
    /// The pods it sends to (`spec.selector`): services sharing an IP with the `Local` policy
    /// must select the same ones.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// Where the Service's own settings contradict each other (two annotations that ask for
    /// different IPs or sharing keys), as its store read them; the first in precedence is used,
    /// and the Service's condition says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict: Option<String>,
    /// The labels of the Service's namespace, for pools' `namespaceSelector`: never stored,
    /// filled by LB-IPAM from the `Namespace` objects (`Namespace::labels_of`).
    #[serde(skip)]
    pub namespace_labels: BTreeMap<String, String>,
}

/// A Service's `externalTrafficPolicy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum TrafficPolicy {
    /// To endpoints on any node (Kubernetes' default).
    #[default]
    Cluster,
    /// Only to endpoints on the node the traffic arrives at.
    Local,
}

impl TrafficPolicy {
    pub fn is_cluster(&self) -> bool {
        *self == Self::Cluster
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum ServiceType {
    #[default]
    LoadBalancer,
    ClusterIP,
    NodePort,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum IpFamilyPolicy {
    #[default]
    SingleStack,
    PreferDualStack,
    RequireDualStack,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ServicePort {
    pub port: u16,
    #[serde(default)]
    pub protocol: Protocol,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Protocol {
    #[default]
    TCP,
    UDP,
    SCTP,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ServiceStatus {
    /// The assigned IPs (Kubernetes' `status.loadBalancer.ingress`).
    #[serde(default)]
    pub ingress: Vec<IpAddr>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

impl ServiceSpec {
    /// Whether LB-IPAM of this project serves it.
    pub fn is_ours(&self) -> bool {
        self.service_type == ServiceType::LoadBalancer
            && self
                .load_balancer_class
                .as_deref()
                .is_none_or(|c| c == LB_CLASS)
    }

    /// The families it wants, in order of preference, and whether all are required.
    pub fn wanted_families(&self) -> (Vec<Family>, bool) {
        let first = self.ip_families.first().copied().unwrap_or(Family::V4);
        let other = match first {
            Family::V4 => Family::V6,
            Family::V6 => Family::V4,
        };
        match self.ip_family_policy {
            IpFamilyPolicy::SingleStack => (vec![first], true),
            IpFamilyPolicy::PreferDualStack => (vec![first, other], false),
            IpFamilyPolicy::RequireDualStack => (vec![first, other], true),
        }
    }
}

/// Where some of a Service's endpoints run: what the announcement of a Service with
/// `externalTrafficPolicy: Local` reads, since only a node with a ready endpoint of it may
/// answer (kube-proxy drops the traffic on the others). Named `<namespace>/<name>`; a Service
/// may have several (a Kubernetes store gives one per EndpointSlice), whose endpoints add up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ServiceEndpoints {
    pub spec: ServiceEndpointsSpec,
}

impl Resource for ServiceEndpoints {
    const KIND: &'static str = "ServiceEndpoints";
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ServiceEndpointsSpec {
    /// The Service, `<namespace>/<name>` (`ipamctl apply` fills it in from the object's
    /// namespace and name when it is left out).
    #[serde(default)]
    pub service: String,
    #[serde(default)]
    pub endpoints: Vec<ServiceEndpoint>,
}

/// One endpoint: the node it runs on, and whether it takes traffic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ServiceEndpoint {
    pub node_name: String,
    /// Kubernetes' `conditions.ready` (absent there means ready, as kube-proxy reads it).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub ready: bool,
}

/// A namespace's labels, which pools' `namespaceSelector`s select: on Kubernetes the core/v1
/// Namespaces (read only); on the other stores written with `ipamctl apply`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl Resource for Namespace {
    const KIND: &'static str = "Namespace";
}

/// The label Kubernetes gives every namespace: its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

impl Namespace {
    /// The labels of `namespace` from `known` (by name), with the name label Kubernetes sets on
    /// every namespace (set here too, so a selector on it means the same on every store).
    pub fn labels_of(
        known: &BTreeMap<String, Namespace>,
        namespace: &str,
    ) -> BTreeMap<String, String> {
        let labels = known
            .get(namespace)
            .map(|n| n.labels.clone())
            .unwrap_or_default();
        Self::with_name_label(labels, namespace)
    }

    /// `labels` of `namespace` with the name label, which is always its name (the API server
    /// forces it; it is forced here too, for a Namespace written on another store with a name
    /// label of another namespace, which would let a selector on it admit the wrong tenant).
    pub fn with_name_label(
        mut labels: BTreeMap<String, String>,
        namespace: &str,
    ) -> BTreeMap<String, String> {
        labels.insert(NAMESPACE_NAME_LABEL.to_owned(), namespace.to_owned());
        labels
    }
}

/// Whether `ip` lies in a pool chosen by `names` (empty: any name) and `selector` (empty: any
/// labels), as L2 policies' and BGP advertisements' `ipPools` and `ipPoolSelector` choose. With
/// neither set every IP passes, also one in no pool (a Service's `externalIPs`); with either,
/// only IPs of the chosen pools.
pub fn in_chosen_pool(
    ip: IpAddr,
    names: &[String],
    selector: &Selector,
    pools: &[(String, LbIpPool)],
) -> bool {
    (names.is_empty() && selector.is_empty())
        || pools
            .iter()
            .any(|(name, pool)| pool_chosen(name, pool, names, selector) && pool.spec.contains(ip))
}

/// Whether pool `name` is chosen by `names` (empty: any) and `selector` (empty: any).
pub fn pool_chosen(name: &str, pool: &LbIpPool, names: &[String], selector: &Selector) -> bool {
    (names.is_empty() || names.iter().any(|n| n == name)) && selector.matches(&pool.labels)
}

/// Which nodes announce which services' IPs, on which interfaces (like
/// CiliumL2AnnouncementPolicy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct L2AnnouncementPolicy {
    pub spec: L2PolicySpec,
}

impl Resource for L2AnnouncementPolicy {
    const KIND: &'static str = "L2AnnouncementPolicy";
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct L2PolicySpec {
    #[serde(default)]
    pub node_selector: Selector,
    #[serde(default)]
    pub service_selector: Selector,
    /// Only IPs of these LoadBalancerIPPools are announced (MetalLB's `ipAddressPools`);
    /// empty: every pool's.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        rename = "ipPools",
        alias = "ipAddressPools"
    )]
    pub ip_pools: Vec<String>,
    /// Only IPs of the pools whose labels it selects are announced (MetalLB's
    /// `ipAddressPoolSelectors`); empty: every pool's. With `ipPools` too, a pool must pass
    /// both, and the Service `serviceSelector`.
    #[serde(
        default,
        skip_serializing_if = "Selector::is_empty",
        rename = "ipPoolSelector"
    )]
    pub ip_pool_selector: Selector,
    /// Regular expressions over interface names (anchored); empty: every interface.
    #[serde(default)]
    pub interfaces: Vec<String>,
    /// Announce the Services' LoadBalancer IPs.
    #[serde(default = "yes", rename = "loadBalancerIPs", alias = "loadBalancerIps")]
    pub load_balancer_ips: bool,
    /// Announce the Services' external IPs.
    #[serde(default, rename = "externalIPs", alias = "externalIps")]
    pub external_ips: bool,
}

fn yes() -> bool {
    true
}
