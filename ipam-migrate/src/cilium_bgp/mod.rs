//! Cilium's BGP kinds: the BGP control plane's `CiliumBGPClusterConfig`, with the
//! `CiliumBGPPeerConfig`s its peers name and the `CiliumBGPAdvertisement`s those select
//! (`cilium.io/v2`, `v2alpha1`), and the older `CiliumBGPPeeringPolicy` (`v2alpha1`).
//!
//! Cilium sends advertisements to peers by labels: a peer's configuration selects, per address
//! family, the advertisement objects whose routes it carries. Here a BGPAdvertisement names its
//! peers. So each of Cilium's Service advertisements becomes a BGPAdvertisement naming the
//! converted peers whose configuration selects it; one that no peer selects advertises nothing
//! in Cilium, and is not converted (a BGPAdvertisement naming no peer would go to every peer).
//! Where Cilium matches nothing without a selector (a Service advertisement's `selector`, a
//! policy's `serviceSelector`), nothing is converted either, and a note says so.

mod control_plane;
mod peering_policy;

use std::{collections::BTreeMap, net::IpAddr};

use ipam_core::{
    lb::bgp::{BgpPeerSpec, Community, GracefulRestart, SecretKeyRef, parse_community},
    meta::Selector,
};
use serde_yaml_ng::Value;

use crate::{
    fields::{self, Bad, Fields, selector},
    migration::Report,
};

pub(crate) use control_plane::{Index, advertisement, cluster_config, peer_config_object};
pub(crate) use peering_policy::peering_policy;

/// Cilium's defaults where a peer leaves a timer out (they differ from this project's: a
/// connect retry of 120 s, not 5 s), written out so that a converted peer behaves as before.
const CONNECT_RETRY_SECONDS: u16 = 120;
const HOLD_TIME_SECONDS: u16 = 90;
const RESTART_TIME_SECONDS: u16 = 120;

/// RFC 1997's well-known communities by the names Cilium accepts.
const WELL_KNOWN_COMMUNITIES: [(&str, &str); 14] = [
    ("internet", "0:0"),
    ("planned-shut", "65535:0"),
    ("accept-own", "65535:1"),
    ("route-filter-translated-v4", "65535:2"),
    ("route-filter-v4", "65535:3"),
    ("route-filter-translated-v6", "65535:4"),
    ("route-filter-v6", "65535:5"),
    ("llgr-stale", "65535:6"),
    ("no-llgr", "65535:7"),
    ("blackhole", "65535:666"),
    ("no-export", "65535:65281"),
    ("no-advertise", "65535:65282"),
    ("no-export-subconfed", "65535:65283"),
    ("no-peer", "65535:65284"),
];

/// An address family, as Cilium's `afi` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Ipv4,
    Ipv6,
}

impl Family {
    fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Self::Ipv4 } else { Self::Ipv6 }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
        }
    }
}

/// The session settings of a CiliumBGPPeerConfig (or of a policy's neighbour), Cilium's
/// defaults filled in.
#[derive(Debug, Clone)]
struct PeerConfig {
    peer_port: u16,
    hold_time_seconds: u16,
    keep_alive_time_seconds: Option<u16>,
    connect_retry_time_seconds: u16,
    graceful_restart: Option<GracefulRestart>,
    ebgp_multihop: Option<u8>,
    password_secret_ref: Option<SecretKeyRef>,
    /// Per family, which CiliumBGPAdvertisements its routes come from (none selected: none).
    families: Vec<(Family, Option<Selector>)>,
}

impl Default for PeerConfig {
    /// A peer without a configuration: Cilium's defaults, advertising nothing.
    fn default() -> Self {
        Self {
            peer_port: 179,
            hold_time_seconds: HOLD_TIME_SECONDS,
            keep_alive_time_seconds: None,
            connect_retry_time_seconds: CONNECT_RETRY_SECONDS,
            graceful_restart: None,
            ebgp_multihop: None,
            password_secret_ref: None,
            families: Vec::new(),
        }
    }
}

impl PeerConfig {
    fn spec(&self, peer_address: IpAddr, peer_asn: u32, local_asn: u32) -> BgpPeerSpec {
        BgpPeerSpec {
            peer_address,
            peer_asn,
            local_asn,
            peer_port: self.peer_port,
            password: None,
            password_secret_ref: self.password_secret_ref.clone(),
            ttl_security: false,
            ebgp_multihop: self.ebgp_multihop,
            node_selector: Selector::default(),
            hold_time_seconds: self.hold_time_seconds,
            keep_alive_time_seconds: self.keep_alive_time_seconds,
            connect_retry_time_seconds: self.connect_retry_time_seconds,
            graceful_restart: self.graceful_restart.clone(),
            bfd: None,
        }
    }

    /// Whether the session with a peer at `address` carries the routes of an advertisement
    /// object with `labels`: a family of the session's own selects it.
    fn selects(&self, address: IpAddr, labels: &BTreeMap<String, String>) -> bool {
        self.families.iter().any(|(family, selector)| {
            *family == Family::of(address) && selector.as_ref().is_some_and(|s| s.matches(labels))
        })
    }

    /// Reports the families of the other kind of address than the session's: Cilium carries
    /// them over the one session (multiprotocol BGP), this project opens one session per family.
    fn report_other_families(&self, at: &str, address: IpAddr, report: &mut Report) {
        for (family, _) in &self.families {
            if *family != Family::of(address) {
                report.dropped(
                    at,
                    format!(
                        "the {} family over a session with {address}: each session here carries \
                         the routes of its own family; add a peer at the router's {} address",
                        family.name(),
                        family.name()
                    ),
                );
            }
        }
    }
}

/// An address as Cilium writes a peer's: `10.0.0.1`, or in a policy `10.0.0.1/32`.
fn peer_address(text: &str) -> Result<IpAddr, String> {
    let (address, length) = match text.split_once('/') {
        Some((address, length)) => (address, Some(length)),
        None => (text, None),
    };
    let ip: IpAddr = address
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not an IP address"))?;
    let host = if ip.is_ipv4() { "32" } else { "128" };
    match length {
        Some(length) if length.trim() != host => Err(format!(
            "{text:?} is a network, not one router's address: write the router's address \
             (a /{host})"
        )),
        _ => Ok(ip),
    }
}

fn address_field(fields: &mut Fields, key: &str) -> Result<IpAddr, Bad> {
    let path = fields.path_of(key);
    let text = fields
        .string(key)?
        .ok_or_else(|| Bad::new(&path, "a peer needs its address"))?;
    peer_address(&text).map_err(|why| Bad::new(path, why))
}

fn u16_field(fields: &mut Fields, key: &str) -> Result<Option<u16>, Bad> {
    let path = fields.path_of(key);
    fields
        .u32(key)?
        .map(|n| u16::try_from(n).map_err(|_| Bad::new(path, format!("{n} is above 65535"))))
        .transpose()
}

/// The router's AS number; Cilium's 0 ("whatever the router sends") has no counterpart.
fn peer_asn(fields: &mut Fields) -> Result<u32, Bad> {
    let path = fields.path_of("peerASN");
    match fields.u32("peerASN")? {
        Some(asn) if asn > 0 => Ok(asn),
        _ => Err(Bad::new(
            path,
            "needed: the router's AS number (Cilium's 0, any AS the router sends, is not \
             accepted here)",
        )),
    }
}

fn local_asn(fields: &mut Fields) -> Result<u32, Bad> {
    let path = fields.path_of("localASN");
    match fields.u32("localASN")? {
        Some(asn) if asn > 0 => Ok(asn),
        _ => Err(Bad::new(path, "needed: the nodes' AS number")),
    }
}

/// The three timers, named alike in a peer config's `timers` and a policy's neighbour.
fn read_timers(fields: &mut Fields, config: &mut PeerConfig) -> Result<(), Bad> {
    if let Some(seconds) = u16_field(fields, "connectRetryTimeSeconds")? {
        config.connect_retry_time_seconds = seconds;
    }
    if let Some(seconds) = u16_field(fields, "holdTimeSeconds")? {
        config.hold_time_seconds = seconds;
    }
    config.keep_alive_time_seconds = u16_field(fields, "keepAliveTimeSeconds")?;
    Ok(())
}

fn read_graceful_restart(
    fields: &mut Fields,
    report: &mut Report,
) -> Result<Option<GracefulRestart>, Bad> {
    let Some(mut restart) = fields.fields("gracefulRestart")? else {
        return Ok(None);
    };
    let enabled = restart.bool("enabled")?.unwrap_or(false);
    let restart_time_seconds =
        u16_field(&mut restart, "restartTimeSeconds")?.unwrap_or(RESTART_TIME_SECONDS);
    report.rest(restart);
    Ok(enabled.then_some(GracefulRestart {
        restart_time_seconds,
    }))
}

/// Cilium's TTL for eBGP (1, the default: the router is one hop away).
fn read_multihop(fields: &mut Fields, key: &str) -> Result<Option<u8>, Bad> {
    let path = fields.path_of(key);
    match fields.u32(key)? {
        None | Some(0 | 1) => Ok(None),
        Some(ttl) => u8::try_from(ttl)
            .map(Some)
            .map_err(|_| Bad::new(path, format!("a TTL is at most 255, not {ttl}"))),
    }
}

/// `families`: each `{afi, safi, advertisements}`; only unicast is carried.
fn read_families(
    fields: &mut Fields,
    report: &mut Report,
) -> Result<Vec<(Family, Option<Selector>)>, Bad> {
    let mut families = Vec::new();
    for (path, family) in fields.list("families")? {
        let mut family = Fields::of(&path, family)?;
        let afi_path = family.path_of("afi");
        let afi = match family.string("afi")?.as_deref() {
            Some("ipv4") => Family::Ipv4,
            Some("ipv6") => Family::Ipv6,
            other => {
                return Err(Bad::new(
                    afi_path,
                    format!("expected ipv4 or ipv6, found {other:?}"),
                ));
            }
        };
        let safi = family.string("safi")?.unwrap_or_else(|| "unicast".into());
        if safi != "unicast" {
            report.dropped(
                path,
                format!("only unicast routes are advertised here, not {safi}"),
            );
            continue;
        }
        let advertisements = family
            .take("advertisements")
            .map(|(path, v)| selector(&path, v))
            .transpose()?;
        report.rest(family);
        families.push((afi, advertisements));
    }
    Ok(families)
}

/// `authSecretRef`: the Secret Cilium reads the password from (key `password`, in its BGP
/// secrets namespace), named in the converted peer; the Secret itself must be copied into the
/// namespace set aside for BGP passwords.
fn read_secret_reference(
    fields: &mut Fields,
    report: &mut Report,
) -> Result<Option<SecretKeyRef>, Bad> {
    let path = fields.path_of("authSecretRef");
    let Some(name) = fields.string("authSecretRef")? else {
        return Ok(None);
    };
    report.note(format!(
        "{path}: the password is read from the Secret {name} (key password) in the namespace set \
         aside for BGP passwords ([bgp] secret_namespace, ipam-bgp-secrets by default); Cilium read it from its \
         BGP secrets namespace (kube-system by default): copy the Secret there"
    ));
    Ok(Some(SecretKeyRef {
        name,
        key: "password".into(),
    }))
}

/// `addresses` (or a policy's `serviceAdvertisements`): whether LoadBalancer IPs and external
/// IPs are advertised (`None`: the list is absent); ClusterIPs are not here.
fn address_kinds_of(
    fields: &mut Fields,
    key: &str,
    report: &mut Report,
) -> Result<Option<(bool, bool)>, Bad> {
    let Some((path, value)) = fields.take(key) else {
        return Ok(None);
    };
    let Value::Sequence(items) = value else {
        return Err(Bad::new(path, "expected a list"));
    };
    let (mut lb, mut external) = (false, false);
    for (i, item) in items.into_iter().enumerate() {
        let item_path = format!("{path}[{i}]");
        match fields::string(&item_path, item)?.as_str() {
            "LoadBalancerIP" => lb = true,
            "ExternalIP" => external = true,
            "ClusterIP" => report.dropped(
                item_path,
                "ClusterIPs are not advertised here: they stay inside the cluster",
            ),
            other => {
                return Err(Bad::new(
                    item_path,
                    format!("expected LoadBalancerIP, ExternalIP or ClusterIP, found {other:?}"),
                ));
            }
        }
    }
    Ok(Some((lb, external)))
}

/// `communities` (standard, well-known, large) and `localPreference`, as Cilium writes the
/// attributes of an advertisement (and the policy's path attributes).
fn read_attributes(
    mut attributes: Fields,
    report: &mut Report,
) -> Result<(Vec<String>, Option<u32>), Bad> {
    let mut communities = Vec::new();
    if let Some(mut c) = attributes.fields("communities")? {
        for (path, value) in c.list("standard")? {
            communities.push(standard_community(&path, value)?);
        }
        for (path, value) in c.list("wellKnown")? {
            let name = fields::string(&path, value)?;
            let value = WELL_KNOWN_COMMUNITIES
                .iter()
                .find(|(known, _)| *known == name)
                .map(|(_, value)| (*value).to_owned())
                .ok_or_else(|| {
                    Bad::new(&path, format!("{name:?} is not a well-known community"))
                })?;
            communities.push(value);
        }
        for (path, value) in c.list("large")? {
            let text = fields::string(&path, value)?;
            match parse_community(&text) {
                Ok(large @ Community::Large(..)) => communities.push(large.to_string()),
                _ => {
                    return Err(Bad::new(
                        path,
                        format!("{text:?} is not a large community (ASN:value:value)"),
                    ));
                }
            }
        }
        report.rest(c);
    }
    let local_preference = attributes.u32("localPreference")?;
    report.rest(attributes);
    Ok((communities, local_preference))
}

/// A standard community: `ASN:value`, or the 32-bit number Cilium also accepts.
fn standard_community(path: &str, value: Value) -> Result<String, Bad> {
    let text = match value {
        Value::Number(n) => n.to_string(),
        other => fields::string(path, other)?,
    };
    if let Ok(n) = text.trim().parse::<u32>() {
        return Ok(format!("{}:{}", n >> 16, n & 0xffff));
    }
    match parse_community(&text) {
        Ok(standard @ Community::Standard(..)) => Ok(standard.to_string()),
        _ => Err(Bad::new(
            path,
            format!("{text:?} is not a standard community (ASN:value, or a 32-bit number)"),
        )),
    }
}
