//! MetalLB's BGP kinds: `BGPPeer` (metallb.io/v1beta2), `BGPAdvertisement` (v1beta1), with the
//! `BFDProfile`s and `Community` aliases they name, read from the same input.

use std::collections::BTreeMap;

use ipam_core::{
    lb::bgp::{
        Bfd, BgpAdvertisementSpec, BgpPeerSpec, GracefulRestart, SecretKeyRef, parse_community,
    },
    meta::Selector,
};
use serde_yaml_ng::Value;

use crate::{
    fields::{Bad, Fields},
    metallb,
    migration::Report,
    source::{Pools, Source},
};

/// The BFDProfiles and Community aliases of the input.
#[derive(Debug, Default)]
pub(super) struct Named {
    bfd_profiles: BTreeMap<String, Value>,
    /// Community alias name -> `ASN:value`.
    communities: BTreeMap<String, String>,
}

impl Named {
    pub(super) fn of(sources: &[Source]) -> Self {
        let mut named = Self::default();
        for s in sources
            .iter()
            .filter(|s| matches!(s.group.as_str(), "metallb.io" | ""))
        {
            match s.kind.as_str() {
                "BFDProfile" => {
                    named.bfd_profiles.insert(s.name.clone(), s.spec.clone());
                }
                "Community" => {
                    let aliases = s.spec.get("communities").and_then(Value::as_sequence);
                    for alias in aliases.into_iter().flatten() {
                        if let (Some(name), Some(value)) = (
                            alias.get("name").and_then(Value::as_str),
                            alias.get("value").and_then(Value::as_str),
                        ) {
                            named.communities.insert(name.to_owned(), value.to_owned());
                        }
                    }
                }
                _ => {}
            }
        }
        named
    }
}

/// MetalLB's durations (`90s`, `1m30s`, `500ms`) in whole seconds.
fn seconds(path: &str, text: &str) -> Result<u16, Bad> {
    let bad = || {
        Bad::new(
            path,
            format!("{text:?} is not a duration such as 90s or 1m30s"),
        )
    };
    let mut total = 0f64;
    let mut rest = text.trim();
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (number, tail) = rest.split_at(digits);
        let number: f64 = number.parse().map_err(|_| bad())?;
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        total += number
            * match unit {
                "h" => 3600.0,
                "m" => 60.0,
                "s" => 1.0,
                "ms" => 0.001,
                _ => return Err(bad()),
            };
        rest = tail;
    }
    u16::try_from(total.round() as u64).map_err(|_| bad())
}

fn duration(spec: &mut Fields, key: &str) -> Result<Option<u16>, Bad> {
    let path = spec.path_of(key);
    spec.string(key)?
        .map(|text| seconds(&path, &text))
        .transpose()
}

/// A BGPPeer.
pub(super) fn peer(
    mut spec: Fields,
    named: &Named,
    report: &mut Report,
) -> Result<BgpPeerSpec, Bad> {
    let address_path = spec.path_of("peerAddress");
    let peer_address = spec
        .string("peerAddress")?
        .ok_or_else(|| Bad::new(&address_path, "a peer needs its address"))?;
    let peer_address = peer_address.parse().map_err(|_| {
        Bad::new(
            &address_path,
            format!("{peer_address:?} is not an IP address"),
        )
    })?;
    let asn = |spec: &mut Fields, key: &str| -> Result<u32, Bad> {
        let path = spec.path_of(key);
        spec.u32(key)?
            .ok_or_else(|| Bad::new(path, "needed: the AS number"))
    };
    let peer_asn = asn(&mut spec, "peerASN")?;
    let local_asn = asn(&mut spec, "myASN")?;
    let peer_port = spec.u32("peerPort")?.map_or(179, |p| p as u16);
    let hold_time_seconds = duration(&mut spec, "holdTime")?.unwrap_or(90);
    let keep_alive_time_seconds = duration(&mut spec, "keepaliveTime")?;
    let connect_retry_time_seconds = duration(&mut spec, "connectTime")?.unwrap_or(5);
    let password = spec.string("password")?;
    let password_secret_ref = match spec.fields("passwordSecret")? {
        None => None,
        Some(secret) => Some(password_secret(secret, report)?),
    };
    let ebgp_multihop = spec.bool("ebgpMultiHop")?.unwrap_or(false).then_some(255);
    let graceful_restart = spec
        .bool("enableGracefulRestart")?
        .unwrap_or(false)
        .then_some(GracefulRestart {
            restart_time_seconds: 120,
        });
    let bfd = match spec.take("bfdProfile") {
        None => None,
        Some((path, value)) => {
            let name = super::fields::string(&path, value)?;
            bfd_profile(&path, &name, named, report)?
        }
    };
    let node_selector = one_node_selector(&mut spec, report)?;
    report_dropped_peer_fields(&mut spec, report);
    report.rest(spec);
    Ok(BgpPeerSpec {
        peer_address,
        peer_asn,
        local_asn,
        peer_port,
        password,
        password_secret_ref,
        ttl_security: false,
        ebgp_multihop,
        node_selector,
        hold_time_seconds,
        keep_alive_time_seconds,
        connect_retry_time_seconds,
        graceful_restart,
        bfd,
    })
}

/// A BGPPeer's `passwordSecret`: the Secret is read from the namespace set aside for BGP
/// passwords, with a note saying where MetalLB read it.
fn password_secret(mut secret: Fields, report: &mut Report) -> Result<SecretKeyRef, Bad> {
    let path = secret.path_of("name");
    let name = secret
        .string("name")?
        .ok_or_else(|| Bad::new(path, "a Secret reference needs the Secret's name"))?;
    let namespace = secret.string("namespace")?.unwrap_or_default();
    report.rest(secret);
    report.note(format!(
        "spec.passwordSecret: the password is read from the Secret {name} (key password) in \
         the namespace set aside for BGP passwords ([bgp] secret_namespace, ipam-bgp-secrets \
         by default); MetalLB read it from {}: copy the Secret there",
        if namespace.is_empty() {
            "its own namespace".to_owned()
        } else {
            namespace
        }
    ));
    Ok(SecretKeyRef {
        name,
        key: "password".into(),
    })
}

/// A BGPPeer's fields with no counterpart here, each reported with why.
fn report_dropped_peer_fields(spec: &mut Fields, report: &mut Report) {
    for (key, why) in [
        (
            "sourceAddress",
            "the session's source address is BIRD's choice (the address on the way to the peer)",
        ),
        (
            "routerID",
            "the router ID is per node here: [bgp] router_id in the agent's configuration",
        ),
        ("vrf", "sessions run in the node's main routing table"),
        (
            "disableMP",
            "each session carries its own family's routes, as with disableMP",
        ),
        ("dynamicASN", "give peerASN"),
    ] {
        if let Some((path, _)) = spec.take(key) {
            report.dropped(path, why);
        }
    }
}

/// The BFDProfile `name`: its intervals and multiplier; the rest reported as dropped.
fn bfd_profile(
    path: &str,
    name: &str,
    named: &Named,
    report: &mut Report,
) -> Result<Option<Bfd>, Bad> {
    let Some(profile) = named.bfd_profiles.get(name) else {
        report.dropped(
            path,
            format!(
                "the BFDProfile {name} is not in the input: convert it with the peer, or write \
                 spec.bfd of the converted BGPPeer"
            ),
        );
        return Ok(None);
    };
    let mut fields = Fields::of(&format!("BFDProfile {name}.spec"), profile.clone())?;
    let bfd = Bfd {
        receive_interval_ms: fields.u32("receiveInterval")?.unwrap_or(300),
        transmit_interval_ms: fields.u32("transmitInterval")?.unwrap_or(300),
        detect_multiplier: fields.u32("detectMultiplier")?.map_or(3, |m| m as u8),
    };
    for key in ["echoMode", "echoInterval", "passiveMode", "minimumTtl"] {
        if let Some((path, _)) = fields.take(key) {
            report.dropped(
                path,
                "BIRD's BFD here runs without echo, passive mode or TTL limits",
            );
        }
    }
    report.rest(fields);
    Ok(Some(bfd))
}

/// MetalLB's `nodeSelectors` (any of them) as one selector; several cannot be one.
fn one_node_selector(spec: &mut Fields, report: &mut Report) -> Result<Selector, Bad> {
    metallb::one_selector(
        spec,
        "nodeSelectors",
        report,
        "nodeSelector: the converted object selects every node; write one selector that covers \
         them",
    )
}

/// A BGPAdvertisement.
pub(super) fn advertisement(
    mut spec: Fields,
    pools: &Pools,
    named: &Named,
    report: &mut Report,
) -> Result<BgpAdvertisementSpec, Bad> {
    let (ip_pools, ip_pool_selector) = super::metallb::pool_choice(&mut spec, pools, report)?;
    let mut communities = Vec::new();
    let community_path = spec.path_of("communities");
    for (i, community) in spec.strings("communities")?.into_iter().enumerate() {
        let value = named
            .communities
            .get(&community)
            .cloned()
            .unwrap_or(community);
        match parse_community(&value) {
            // Written as this project does (MetalLB's `large:` prefix dropped).
            Ok(community) => communities.push(community.to_string()),
            Err(why) => report.dropped(
                format!("{community_path}[{i}]"),
                format!("{why}, and no Community alias of that name is in the input"),
            ),
        }
    }
    let local_preference = spec.u32("localPref")?;
    let node_selector = one_node_selector(&mut spec, report)?;
    let peers = spec.strings("peers")?;
    // MetalLB's default (a host route) is written as no aggregation; the rest is checked
    // against the pools by the agents, as MetalLB does.
    let mut aggregation = |key: &str, host: u8| -> Result<Option<u8>, Bad> {
        let path = spec.path_of(key);
        let length = spec.u32(key)?.map(|length| {
            u8::try_from(length)
                .ok()
                .filter(|l| *l <= host)
                .ok_or_else(|| Bad::new(path, format!("{length} is longer than /{host}")))
        });
        Ok(length.transpose()?.filter(|l| *l != host))
    };
    let aggregation_length = aggregation("aggregationLength", 32)?;
    let aggregation_length_v6 = aggregation("aggregationLengthV6", 128)?;
    report.rest(spec);
    Ok(BgpAdvertisementSpec {
        ip_pools,
        ip_pool_selector,
        service_selector: Selector::default(),
        node_selector,
        peers,
        communities,
        local_preference,
        // MetalLB advertises LoadBalancer IPs only.
        load_balancer_ips: true,
        external_ips: false,
        aggregation_length,
        aggregation_length_v6,
    })
}

#[cfg(test)]
mod tests {
    use super::seconds;

    #[test]
    fn metallb_durations_in_seconds() {
        assert_eq!(seconds("p", "90s"), Ok(90));
        assert_eq!(seconds("p", "1m30s"), Ok(90));
        assert_eq!(seconds("p", "3s"), Ok(3));
        assert!(seconds("p", "soon").is_err());
    }
}
