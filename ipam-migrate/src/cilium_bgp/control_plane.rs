//! Cilium's BGP control plane (`cilium.io/v2`): a CiliumBGPClusterConfig's peers take the
//! settings of the CiliumBGPPeerConfig they name, and a CiliumBGPAdvertisement goes to the peers
//! whose peer config selects it by label.

use std::{collections::BTreeMap, net::IpAddr};

use ipam_core::{
    lb::bgp::{BgpAdvertisementSpec, BgpPeerSpec},
    meta::Selector,
};
use serde_yaml_ng::Value;

use super::{
    PeerConfig, address_kinds_of, local_asn, peer_address, peer_asn, read_attributes,
    read_families, read_graceful_restart, read_multihop, read_secret_reference, read_timers,
    u16_field,
};
use crate::{
    fields::{Bad, Fields, selector},
    migration::{Migration, Report},
    source::{Pools, Source},
};

/// A peer of a CiliumBGPClusterConfig, as the index knows it.
#[derive(Debug)]
struct IndexedPeer {
    name: String,
    address: IpAddr,
    config: Option<String>,
}

/// What the conversion of one object needs to know of the others: the peer configurations by
/// name, the cluster configs' peers (to find who selects an advertisement), and Cilium's pools.
#[derive(Debug, Default)]
pub(crate) struct Index {
    /// `None`: malformed (its own conversion says why).
    peer_configs: BTreeMap<String, Option<PeerConfig>>,
    peers: Vec<IndexedPeer>,
    pools: Pools,
}

fn is_cilium(source: &Source) -> bool {
    matches!(source.group.as_str(), "cilium.io" | "")
}

impl Index {
    pub(crate) fn of(sources: &[Source]) -> Self {
        let mut index = Self {
            pools: Pools::of(sources, "cilium.io", "CiliumLoadBalancerIPPool"),
            ..Self::default()
        };
        let mut scratch = Migration::default();
        for source in sources.iter().filter(|s| is_cilium(s)) {
            match source.kind.as_str() {
                "CiliumBGPPeerConfig" => {
                    let mut report = Report::new(String::new(), &mut scratch);
                    let config = Fields::of("spec", source.spec.clone())
                        .and_then(|spec| peer_config(spec, &mut report))
                        .ok();
                    index.peer_configs.insert(source.name.clone(), config);
                }
                "CiliumBGPClusterConfig" => index.peers.extend(indexed_peers(&source.spec)),
                _ => {}
            }
        }
        index
    }

    /// The CiliumLoadBalancerIPPools of the input that `selector` selects.
    pub(super) fn pools_selected_by(&self, selector: &Selector) -> Vec<String> {
        self.pools.selected_by(selector).cloned().collect()
    }

    /// The converted peers whose configuration selects the advertisement object with `labels`.
    fn peers_selecting(&self, labels: &BTreeMap<String, String>) -> Vec<String> {
        let mut names: Vec<String> = self
            .peers
            .iter()
            .filter(|p| {
                p.config
                    .as_ref()
                    .and_then(|c| self.peer_configs.get(c))
                    .and_then(Option::as_ref)
                    .is_some_and(|c| c.selects(p.address, labels))
            })
            .map(|p| p.name.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

/// The peers of a cluster config's spec, read leniently (its own conversion reports errors).
fn indexed_peers(spec: &Value) -> Vec<IndexedPeer> {
    let seq = |v: Option<&Value>| v.and_then(Value::as_sequence).cloned().unwrap_or_default();
    seq(spec.get("bgpInstances"))
        .iter()
        .flat_map(|instance| seq(instance.get("peers")))
        .filter_map(|peer| {
            Some(IndexedPeer {
                name: peer.get("name")?.as_str()?.to_owned(),
                address: peer_address(peer.get("peerAddress")?.as_str()?).ok()?,
                config: peer
                    .get("peerConfigRef")
                    .and_then(|r| r.get("name"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            })
        })
        .collect()
}

/// A CiliumBGPPeerConfig's spec. It becomes part of every peer that names it; converted on its
/// own, it yields nothing but what it drops.
fn peer_config(mut spec: Fields, report: &mut Report) -> Result<PeerConfig, Bad> {
    let mut config = PeerConfig::default();
    if let Some(mut transport) = spec.fields("transport")? {
        if let Some(port) = u16_field(&mut transport, "peerPort")? {
            config.peer_port = port;
        }
        for key in ["localPort", "sourcePort"] {
            if let Some((path, _)) = transport.take(key) {
                report.dropped(path, "the session's own port is BIRD's choice");
            }
        }
        report.rest(transport);
    }
    if let Some(mut timers) = spec.fields("timers")? {
        read_timers(&mut timers, &mut config)?;
        report.rest(timers);
    }
    config.password_secret_ref = read_secret_reference(&mut spec, report)?;
    config.graceful_restart = read_graceful_restart(&mut spec, report)?;
    config.ebgp_multihop = read_multihop(&mut spec, "ebgpMultihop")?;
    config.families = read_families(&mut spec, report)?;
    report.rest(spec);
    Ok(config)
}

/// A CiliumBGPPeerConfig on its own: read for what it drops (its settings go into the peers
/// that name it).
pub(crate) fn peer_config_object(spec: Fields, report: &mut Report) -> Result<(), Bad> {
    peer_config(spec, report).map(|_| ())
}

/// A CiliumBGPClusterConfig: one BGPPeer for each peer of each instance.
pub(crate) fn cluster_config(
    mut spec: Fields,
    index: &Index,
    report: &mut Report,
) -> Result<Vec<(String, BgpPeerSpec)>, Bad> {
    let node_selector = match spec.take("nodeSelector") {
        Some((path, v)) => selector(&path, v)?,
        None => Selector::default(),
    };
    let mut peers = Vec::new();
    for (path, instance) in spec.list("bgpInstances")? {
        let mut instance = Fields::of(&path, instance)?;
        // Names the instance within Cilium only (its node overrides refer to it).
        instance.string("name")?;
        let local_asn = local_asn(&mut instance)?;
        if let Some((path, _)) = instance.take("localPort") {
            report.dropped(
                path,
                "each node's BIRD accepts sessions on the BGP port, 179",
            );
        }
        for (path, peer) in instance.list("peers")? {
            let mut peer = Fields::of(&path, peer)?;
            let name_path = peer.path_of("name");
            let name = peer
                .string("name")?
                .ok_or_else(|| Bad::new(name_path, "a peer needs its name"))?;
            let address_path = peer.path_of("peerAddress");
            let address = match peer.string("peerAddress")? {
                Some(text) => peer_address(&text).map_err(|why| Bad::new(address_path, why))?,
                None if peer.take("autoDiscovery").is_some() => {
                    report.dropped(
                        path,
                        "a peer found by autoDiscovery (the default gateway) is not converted: \
                         write its peerAddress",
                    );
                    continue;
                }
                None => return Err(Bad::new(address_path, "a peer needs its address")),
            };
            let peer_asn = peer_asn(&mut peer)?;
            let config = match peer.fields("peerConfigRef")? {
                None => {
                    report.note(format!(
                        "{path}: no peerConfigRef: Cilium's defaults, and no advertisement \
                         goes to this peer"
                    ));
                    PeerConfig::default()
                }
                Some(mut reference) => {
                    peer_config_of(&mut reference, index, report)?.unwrap_or_default()
                }
            };
            config.report_other_families(&path, address, report);
            report.rest(peer);
            let mut spec = config.spec(address, peer_asn, local_asn);
            spec.node_selector = node_selector.clone();
            peers.push((name, spec));
        }
        report.rest(instance);
    }
    report.rest(spec);
    Ok(peers)
}

/// `peerConfigRef`: the CiliumBGPPeerConfig it names, when the input holds it.
fn peer_config_of(
    reference: &mut Fields,
    index: &Index,
    report: &mut Report,
) -> Result<Option<PeerConfig>, Bad> {
    let path = reference.path_of("name");
    let name = reference
        .string("name")?
        .ok_or_else(|| Bad::new(&path, "a reference needs the name of a CiliumBGPPeerConfig"))?;
    for (key, expected) in [("group", "cilium.io"), ("kind", "CiliumBGPPeerConfig")] {
        let key_path = reference.path_of(key);
        if let Some(value) = reference.string(key)?
            && value != expected
        {
            return Err(Bad::new(
                key_path,
                format!("only {expected} is read here, not {value}"),
            ));
        }
    }
    let found = index.peer_configs.get(&name).cloned();
    if found.is_none() {
        report.dropped(
            path,
            format!(
                "the CiliumBGPPeerConfig {name} is not in the input: the peer is converted \
                 with Cilium's defaults and no advertisement goes to it; convert the two together"
            ),
        );
    }
    Ok(found.flatten())
}

/// A CiliumBGPAdvertisement: a BGPAdvertisement for each Service advertisement in it, sent to
/// the peers whose configuration selects the object.
pub(crate) fn advertisement(
    name: &str,
    labels: &BTreeMap<String, String>,
    mut spec: Fields,
    index: &Index,
    report: &mut Report,
) -> Result<Vec<(String, BgpAdvertisementSpec)>, Bad> {
    let peers = index.peers_selecting(labels);
    let mut converted = Vec::new();
    let entries = spec.list("advertisements")?;
    let services = entries
        .iter()
        .filter(|(_, e)| e.get("advertisementType").and_then(Value::as_str) == Some("Service"))
        .count();
    for (i, (path, entry)) in entries.into_iter().enumerate() {
        let entry = Fields::of(&path, entry)?;
        let Some(spec) = service_entry(&path, entry, &peers, report)? else {
            continue;
        };
        let name = if services == 1 {
            name.to_owned()
        } else {
            format!("{name}-{i}")
        };
        converted.push((name, spec));
    }
    report.rest(spec);
    Ok(converted)
}

/// One entry of a CiliumBGPAdvertisement: a BGPAdvertisement to `peers` for a `Service`
/// entry with a selector and an address kind; `None`, with a note or what was dropped, for
/// anything else.
fn service_entry(
    path: &str,
    mut entry: Fields,
    peers: &[String],
    report: &mut Report,
) -> Result<Option<BgpAdvertisementSpec>, Bad> {
    let type_path = entry.path_of("advertisementType");
    let kind = entry
        .string("advertisementType")?
        .ok_or_else(|| Bad::new(type_path, "needed: Service, PodCIDR, ..."))?;
    if kind != "Service" {
        report.dropped(
            path,
            format!(
                "{kind} routes are not advertised here: only Service IPs are (pods are routed \
                 between the nodes by the datapath)"
            ),
        );
        return Ok(None);
    }
    let (load_balancer_ips, external_ips) = match entry.fields("service")? {
        Some(mut service) => {
            let kinds =
                address_kinds_of(&mut service, "addresses", report)?.unwrap_or((false, false));
            report.rest(service);
            kinds
        }
        None => (false, false),
    };
    let service_selector = entry
        .take("selector")
        .map(|(path, v)| selector(&path, v))
        .transpose()?;
    let (communities, local_preference) = match entry.fields("attributes")? {
        Some(attributes) => read_attributes(attributes, report)?,
        None => (Vec::new(), None),
    };
    report.rest(entry);
    let Some(service_selector) = service_selector else {
        report.note(format!(
            "{path}: no selector, so it matches no Service in Cilium: not converted"
        ));
        return Ok(None);
    };
    if !load_balancer_ips && !external_ips {
        report.note(format!(
            "{path}: advertises neither LoadBalancerIP nor ExternalIP: not converted"
        ));
        return Ok(None);
    }
    if peers.is_empty() {
        report.note(format!(
            "{path}: no peer's CiliumBGPPeerConfig in the input selects this object, so it goes \
             to no peer: not converted (convert it together with the CiliumBGPClusterConfig and \
             CiliumBGPPeerConfigs)"
        ));
        return Ok(None);
    }
    Ok(Some(BgpAdvertisementSpec {
        ip_pools: Vec::new(),
        service_selector,
        node_selector: Selector::default(),
        peers: peers.to_vec(),
        communities,
        local_preference,
        load_balancer_ips,
        external_ips,
        ..BgpAdvertisementSpec::default()
    }))
}
