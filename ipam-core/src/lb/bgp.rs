//! Service IPs over BGP: the peers the nodes open sessions with, the advertisements that say
//! which Services' IPs are announced to them, and which routes one node advertises.
//!
//! Unlike L2 (one owner per IP, chosen by rendezvous hashing among the live nodes), every
//! eligible node announces every IP it may serve, and the router spreads flows over them
//! (ECMP). Liveness is the BGP session itself (hold timer or BFD): a node decides only for
//! itself, from its own labels and its own endpoints, so no node needs to know who else is alive.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use serde::{Deserialize, Serialize};

use super::{
    announce::ReadyNodes,
    external,
    resources::{LbIpPool, ServiceSpec, ServiceStatus, TrafficPolicy, in_chosen_pool, pool_chosen},
};
use crate::{
    Cidr, Family,
    cidr::{ip_to_u128, u128_to_ip},
    meta::{Condition, Selector},
    store::Resource,
};

/// A BGP neighbour the selected nodes open a session with (like MetalLB's BGPPeer and
/// Cilium's peer configuration). Cluster-wide: each selected node opens its own session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BgpPeer {
    pub spec: BgpPeerSpec,
    #[serde(default, skip_serializing_if = "BgpPeerStatus::is_empty")]
    pub status: BgpPeerStatus,
}

impl Resource for BgpPeer {
    const KIND: &'static str = "BGPPeer";
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BgpPeerSpec {
    /// The router's address; a session carries the Service IPs of its own family.
    pub peer_address: IpAddr,
    #[serde(rename = "peerASN")]
    pub peer_asn: u32,
    /// The nodes' AS number (MetalLB's `myASN`).
    #[serde(rename = "localASN", alias = "myASN")]
    pub local_asn: u32,
    #[serde(default = "bgp_port")]
    pub peer_port: u16,
    /// TCP MD5 signature (RFC 2385) shared with the router.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// The password from a Secret in the agents' namespace instead (Kubernetes store; the
    /// agents read it, and read it again when it changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<SecretKeyRef>,
    /// Accept the router's packets only with TTL 255 (GTSM, RFC 5082): the router must be on
    /// the nodes' segment and configured likewise.
    #[serde(default, skip_serializing_if = "is_false")]
    pub ttl_security: bool,
    /// For an eBGP router more than one hop away: the TTL of the session's packets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ebgp_multihop: Option<u8>,
    /// Which nodes open a session; empty: every node.
    #[serde(default)]
    pub node_selector: Selector,
    #[serde(default = "hold_time")]
    pub hold_time_seconds: u16,
    /// Defaults to a third of the hold time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_alive_time_seconds: Option<u16>,
    #[serde(default = "connect_retry")]
    pub connect_retry_time_seconds: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graceful_restart: Option<GracefulRestart>,
    /// Bidirectional Forwarding Detection: a session's loss seen in well under a second, where
    /// the router runs BFD too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd: Option<Bfd>,
}

/// A key of a Secret in the agents' namespace (the store's, `[store.kubernetes] namespace`): BGPPeers are
/// cluster-wide, so they name no namespace, and the agents may read Secrets of that one alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    pub name: String,
    #[serde(default = "password_key")]
    pub key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GracefulRestart {
    /// How long the router keeps a restarting node's routes.
    #[serde(default = "restart_time")]
    pub restart_time_seconds: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Bfd {
    #[serde(default = "bfd_interval")]
    pub receive_interval_ms: u32,
    #[serde(default = "bfd_interval")]
    pub transmit_interval_ms: u32,
    #[serde(default = "bfd_multiplier")]
    pub detect_multiplier: u8,
}

/// Each node's session with the peer, as its agent last saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BgpPeerStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<BgpSessionStatus>,
}

impl BgpPeerStatus {
    pub fn is_empty(&self) -> bool {
        self.conditions.is_empty() && self.nodes.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BgpSessionStatus {
    pub node: String,
    /// The BGP state (Idle, Connect, Active, OpenSent, OpenConfirm, Established).
    pub state: String,
    pub routes_advertised: u32,
    /// Why the session is not established, when it is not.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// Which Services' IPs are advertised, to which peers, from which nodes, with which
/// attributes (like MetalLB's BGPAdvertisement and Cilium's advertisement kinds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BgpAdvertisement {
    pub spec: BgpAdvertisementSpec,
}

impl Resource for BgpAdvertisement {
    const KIND: &'static str = "BGPAdvertisement";
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BgpAdvertisementSpec {
    /// LoadBalancerIPPools whose IPs are advertised; empty: every pool.
    #[serde(default, rename = "ipPools", alias = "ipAddressPools")]
    pub ip_pools: Vec<String>,
    /// Only IPs of the pools whose labels it selects are advertised (MetalLB's
    /// `ipAddressPoolSelectors`); empty: every pool's. With `ipPools` too, a pool must pass both.
    #[serde(default, skip_serializing_if = "Selector::is_empty")]
    pub ip_pool_selector: Selector,
    #[serde(default)]
    pub service_selector: Selector,
    /// Which nodes advertise; empty: every node that has a session.
    #[serde(default)]
    pub node_selector: Selector,
    /// BGPPeers the routes go to; empty: every peer.
    #[serde(default)]
    pub peers: Vec<String>,
    /// Communities: standard `ASN:value`, or large `ASN:value:value`.
    #[serde(default)]
    pub communities: Vec<String>,
    /// Sent to iBGP peers only (an eBGP peer ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_preference: Option<u32>,
    #[serde(default = "yes", rename = "loadBalancerIPs", alias = "loadBalancerIps")]
    pub load_balancer_ips: bool,
    #[serde(default, rename = "externalIPs", alias = "externalIps")]
    pub external_ips: bool,
    /// Advertise each IPv4 LoadBalancer IP as the network of this length that holds it
    /// (MetalLB's `aggregationLength`): one route for many Services where the fabric caps the
    /// number of routes. Unset or 32: a /32 per IP. Every address of such a network must lie in
    /// the pool block the IP came from; Services with `externalTrafficPolicy: Local`, and
    /// external IPs, keep their /32 (see docs/bgp.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregation_length: Option<u8>,
    /// The same for IPv6 (MetalLB's `aggregationLengthV6`); unset or 128: a /128 per IP.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "aggregationLengthV6"
    )]
    pub aggregation_length_v6: Option<u8>,
}

impl BgpAdvertisementSpec {
    /// The prefix length LoadBalancer IPs of `family` are advertised with.
    pub fn aggregation(&self, family: Family) -> u8 {
        match family {
            Family::V4 => self.aggregation_length.unwrap_or(32),
            Family::V6 => self.aggregation_length_v6.unwrap_or(128),
        }
    }
}

fn password_key() -> String {
    "password".into()
}
fn bgp_port() -> u16 {
    179
}
fn hold_time() -> u16 {
    90
}
fn connect_retry() -> u16 {
    5
}
fn restart_time() -> u16 {
    120
}
fn bfd_interval() -> u32 {
    300
}
fn bfd_multiplier() -> u8 {
    3
}
fn yes() -> bool {
    true
}
fn is_false(b: &bool) -> bool {
    !b
}

/// What is wrong with a peer's spec, for its condition and `ipamctl apply`.
pub fn check_peer(spec: &BgpPeerSpec) -> Result<(), String> {
    if spec.peer_asn == 0 || spec.local_asn == 0 {
        return Err("peerASN and localASN must be set (1 to 4294967295)".into());
    }
    if spec.hold_time_seconds != 0 && spec.hold_time_seconds < 3 {
        return Err(format!(
            "holdTimeSeconds {} is below 3, the least BGP allows (RFC 4271); 0 turns keepalives off",
            spec.hold_time_seconds
        ));
    }
    if let Some(k) = spec.keep_alive_time_seconds
        && spec.hold_time_seconds != 0
        && k >= spec.hold_time_seconds
    {
        return Err(format!(
            "keepAliveTimeSeconds {k} must be below holdTimeSeconds {}",
            spec.hold_time_seconds
        ));
    }
    if spec.ttl_security && spec.ebgp_multihop.is_some() {
        return Err(
            "ttlSecurity and ebgpMultihop exclude each other: GTSM needs the router \
                    one hop away"
                .into(),
        );
    }
    if spec.bfd.is_some() && spec.ebgp_multihop.is_some() {
        return Err(
            "bfd and ebgpMultihop exclude each other here: BFD across hops needs the \
                    session's local address fixed, which this version does not set"
                .into(),
        );
    }
    if spec.password.is_some() && spec.password_secret_ref.is_some() {
        return Err(
            "password and passwordSecretRef exclude each other: give the password one way".into(),
        );
    }
    if let Some(password) = &spec.password {
        check_password(password)?;
    }
    if let Some(bfd) = &spec.bfd
        && (bfd.detect_multiplier == 0
            || bfd.receive_interval_ms < 10
            || bfd.transmit_interval_ms < 10)
    {
        return Err("bfd: intervals must be at least 10 ms and detectMultiplier at least 1".into());
    }
    Ok(())
}

/// Whether `password` can be a session's TCP MD5 key here (the same rule for a password read
/// from a Secret).
pub fn check_password(password: &str) -> Result<(), String> {
    if password.is_empty() || password.len() > 80 || password.contains(['"', '\\', '\n']) {
        return Err(
            "the password must be 1 to 80 characters, without quotes, backslashes or \
                    line breaks (the TCP MD5 key limit is 80)"
                .into(),
        );
    }
    Ok(())
}

/// What is wrong with an advertisement's spec.
pub fn check_advertisement(spec: &BgpAdvertisementSpec) -> Result<(), String> {
    for c in &spec.communities {
        parse_community(c)?;
    }
    for (field, length, most) in [
        ("aggregationLength", spec.aggregation_length, 32),
        ("aggregationLengthV6", spec.aggregation_length_v6, 128),
    ] {
        if let Some(length) = length
            && length > most
        {
            return Err(format!(
                "{field} {length} is longer than an address ({most} bits); use 0 to {most}"
            ));
        }
    }
    Ok(())
}

/// Why the advertisement's aggregation cannot cover the pools it advertises: an aggregate
/// of one of their addresses would reach outside the block that holds it, and attract traffic
/// for addresses that are not the pool's (MetalLB refuses the same). Judged over the pools it
/// chooses (all, when it chooses none).
pub fn check_aggregation(
    spec: &BgpAdvertisementSpec,
    pools: &[(String, LbIpPool)],
) -> Result<(), String> {
    for (name, pool) in pools
        .iter()
        .filter(|(name, pool)| pool_chosen(name, pool, &spec.ip_pools, &spec.ip_pool_selector))
    {
        for block in &pool.spec.blocks {
            let Some((family, first, last)) = block.bounds() else {
                continue;
            };
            let length = spec.aggregation(family);
            if !aligned(family, first, last, length) {
                let field = match family {
                    Family::V4 => "aggregationLength",
                    Family::V6 => "aggregationLengthV6",
                };
                return Err(format!(
                    "{field} {length} is shorter than pool {name}'s block {} allows: the \
                     aggregate would cover addresses outside the pool; use a length of at least \
                     the block's prefix, or a block aligned to /{length}",
                    block.describe()
                ));
            }
        }
    }
    Ok(())
}

/// Whether every /`length` network holding an address of `first..=last` lies inside it.
fn aligned(family: Family, first: u128, last: u128, length: u8) -> bool {
    let bits = family.bits();
    let Some(size) = 1u128.checked_shl(u32::from(bits - length.min(bits))) else {
        // /0 of IPv6: only the whole space holds its own aggregate.
        return first == 0 && last == u128::MAX;
    };
    let end = u128::MAX >> (128 - u32::from(bits));
    first.is_multiple_of(size) && (last == end || last.wrapping_add(1).is_multiple_of(size))
}

/// The route `ip` is advertised as with prefix `length`.
fn aggregate(ip: IpAddr, length: u8) -> Cidr {
    let family = Family::of(ip);
    let host_bits = u32::from(family.bits() - length.min(family.bits()));
    let mask = u128::MAX.checked_shl(host_bits).unwrap_or(0);
    let network = u128_to_ip(family, ip_to_u128(ip) & mask);
    Cidr::new(network, length).expect("host bits are cleared")
}

/// The host route of `ip` (/32 or /128).
pub fn host_route(ip: IpAddr) -> Cidr {
    aggregate(ip, Family::of(ip).bits())
}

/// A BGP community a route carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Community {
    /// RFC 1997: `ASN:value`, both 16-bit.
    Standard(u16, u16),
    /// RFC 8092: `ASN:value:value`, each 32-bit (for 4-byte AS numbers).
    Large(u32, u32, u32),
}

impl std::fmt::Display for Community {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Standard(asn, value) => write!(f, "{asn}:{value}"),
            Self::Large(asn, first, second) => write!(f, "{asn}:{first}:{second}"),
        }
    }
}

/// A community as written: `ASN:value` (standard) or `ASN:value:value` (large; MetalLB's
/// `large:` prefix is read too).
pub fn parse_community(c: &str) -> Result<Community, String> {
    let bad = || {
        format!(
            "community {c:?} is neither `ASN:value` (two numbers from 0 to 65535) nor \
             `ASN:value:value` (a large community: three numbers from 0 to 4294967295)"
        )
    };
    let text = c.trim();
    let text = text.strip_prefix("large:").unwrap_or(text);
    let parts: Vec<&str> = text.split(':').map(str::trim).collect();
    match parts.as_slice() {
        [asn, value] if !c.trim().starts_with("large:") => Ok(Community::Standard(
            asn.parse().map_err(|_| bad())?,
            value.parse().map_err(|_| bad())?,
        )),
        [asn, first, second] => Ok(Community::Large(
            asn.parse().map_err(|_| bad())?,
            first.parse().map_err(|_| bad())?,
            second.parse().map_err(|_| bad())?,
        )),
        _ => Err(bad()),
    }
}

/// One route a node advertises to one peer, with its attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteAttributes {
    pub communities: BTreeSet<Community>,
    pub local_preference: Option<u32>,
    /// The Services the route's IPs belong to (for status and logs).
    pub services: BTreeSet<String>,
    /// The Service IPs the route carries: the IP of a host route, or those an aggregate holds.
    pub ips: BTreeSet<IpAddr>,
}

/// What one node advertises: its sessions, and for each peer the routes sent to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeAdvertisements {
    /// The peers this node opens a session with, by name.
    pub peers: BTreeMap<String, BgpPeerSpec>,
    /// Per peer, the routes advertised to it: a /32 or /128 per IP, or aggregates.
    pub routes: BTreeMap<String, BTreeMap<Cidr, RouteAttributes>>,
    /// Peers and advertisements left out, with why (bad specs).
    pub refused: Vec<(String, String)>,
}

impl NodeAdvertisements {
    /// Every Service IP advertised to some peer: the addresses the node must accept traffic
    /// for.
    pub fn ips(&self) -> BTreeSet<IpAddr> {
        self.routes
            .values()
            .flat_map(|r| r.values().flat_map(|route| route.ips.iter().copied()))
            .collect()
    }

    /// Every route advertised to some peer.
    pub fn prefixes(&self) -> BTreeSet<Cidr> {
        self.routes
            .values()
            .flat_map(|r| r.keys().copied())
            .collect()
    }
}

/// The inputs of one node's decision.
pub struct Inputs<'a> {
    pub node: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    /// Why the node announces nothing (drained or excluded), if so.
    pub excluded: Option<&'a str>,
    pub peers: &'a [(String, BgpPeerSpec)],
    pub advertisements: &'a [(String, BgpAdvertisementSpec)],
    pub pools: &'a [(String, LbIpPool)],
    /// The Services, with their namespaces' labels (`rows::services_in`): their external IPs
    /// are advertised only where `external::judge` admits them.
    pub services: &'a [(String, ServiceSpec, ServiceStatus)],
    pub ready: &'a ReadyNodes,
    /// The nodes' records: no node's address is advertised as a Service's external IP.
    pub records: &'a dyn crate::resources::NodeRecords,
}

/// What `inputs.node` advertises. A Service with `externalTrafficPolicy: Local` is advertised
/// only from nodes with a ready endpoint of it (kube-proxy drops its traffic elsewhere); any
/// other from every selected node. An excluded node keeps its sessions and advertises nothing,
/// so a drain withdraws its routes without tearing sessions down.
pub fn node_advertisements(inputs: &Inputs) -> NodeAdvertisements {
    let mut out = NodeAdvertisements::default();
    for (name, spec) in inputs.peers {
        // Objects stored before the stores checked names may still hold any name: such a peer
        // is refused alone, and every other peer goes on.
        let checked = match crate::names::invalid_name(name) {
            Some(why) => Err(format!("its name {why}; recreate it under a valid name")),
            None => check_peer(spec),
        };
        match checked {
            Ok(()) if spec.node_selector.matches(inputs.labels) => {
                out.peers.insert(name.clone(), spec.clone());
            }
            Ok(()) => {}
            Err(why) => out.refused.push((format!("BGPPeer {name}"), why)),
        }
    }
    if inputs.excluded.is_some() {
        return out;
    }
    let judged = external::judge(inputs.services, inputs.pools, || {
        external::node_addresses(inputs.records.each())
    });
    let services = judged.admitted(inputs.services);
    for (name, ad) in inputs.advertisements {
        if let Err(why) = check_advertisement(ad).and_then(|()| check_aggregation(ad, inputs.pools))
        {
            out.refused.push((format!("BGPAdvertisement {name}"), why));
            continue;
        }
        if ad.node_selector.matches(inputs.labels) {
            advertise(ad, inputs, &services, &mut out);
        }
    }
    out
}

/// The routes one advertisement of this node gives its peers: every selected Service's IPs
/// (its pool's aggregate, or a host route), to each peer of the IP's family it names.
fn advertise(
    ad: &BgpAdvertisementSpec,
    inputs: &Inputs,
    services: &[(String, ServiceSpec, ServiceStatus)],
    out: &mut NodeAdvertisements,
) {
    let communities: BTreeSet<Community> = ad
        .communities
        .iter()
        .filter_map(|c| parse_community(c).ok())
        .collect();
    let to: Vec<String> = out
        .peers
        .keys()
        .filter(|p| ad.peers.is_empty() || ad.peers.contains(p))
        .cloned()
        .collect();
    for (service, spec, status) in services {
        if !ad.service_selector.matches_service(service, &spec.labels) {
            continue;
        }
        let local = spec.external_traffic_policy == TrafficPolicy::Local;
        if local
            && !inputs
                .ready
                .get(service)
                .is_some_and(|r| r.contains(inputs.node))
        {
            continue;
        }
        for (ip, prefix) in service_routes(ad, inputs.pools, spec, status, local) {
            for peer in &to {
                if !same_family(ip, out.peers[peer].peer_address) {
                    continue;
                }
                let route = out
                    .routes
                    .entry(peer.clone())
                    .or_default()
                    .entry(prefix)
                    .or_default();
                route.communities.extend(communities.iter().copied());
                route.local_preference = route.local_preference.max(ad.local_preference);
                route.services.insert(service.clone());
                route.ips.insert(ip);
            }
        }
    }
}

/// A selected Service's (IP, route) pairs under `ad`: its LoadBalancer IPs from the chosen
/// pools, as the advertisement's aggregate, and its external IPs as host routes. A `Local`
/// Service keeps its host route: an aggregate from a node without its endpoints would draw
/// its traffic there, where kube-proxy drops it; the longer prefix from the nodes with
/// endpoints wins at the router.
fn service_routes<'a>(
    ad: &'a BgpAdvertisementSpec,
    pools: &'a [(String, LbIpPool)],
    spec: &'a ServiceSpec,
    status: &'a ServiceStatus,
    local: bool,
) -> impl Iterator<Item = (IpAddr, Cidr)> + 'a {
    let lb = status
        .ingress
        .iter()
        .filter(move |_| ad.load_balancer_ips && spec.is_ours())
        .filter(move |ip| in_chosen_pool(**ip, &ad.ip_pools, &ad.ip_pool_selector, pools))
        .map(move |ip| {
            let length = if local {
                Family::of(*ip).bits()
            } else {
                ad.aggregation(Family::of(*ip))
            };
            (*ip, aggregate(*ip, length))
        });
    let external = spec
        .external_ips
        .iter()
        .filter(move |_| ad.external_ips)
        .map(|ip| (*ip, host_route(*ip)));
    lb.chain(external)
}

fn same_family(a: IpAddr, b: IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

#[cfg(test)]
mod tests;
