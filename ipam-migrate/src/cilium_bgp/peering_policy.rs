//! Cilium's older CiliumBGPPeeringPolicy (`cilium.io/v2alpha1`): peers and what they carry in
//! one object, per virtual router.

use ipam_core::{
    lb::bgp::{BgpAdvertisementSpec, BgpPeerSpec},
    meta::Selector,
};
use serde_yaml_ng::Value;

use super::{
    Index, PeerConfig, address_field, address_kinds_of, local_asn, peer_asn, read_attributes,
    read_families, read_graceful_restart, read_multihop, read_secret_reference, read_timers,
    u16_field,
};
use crate::{
    fields::{Bad, Fields, selector},
    migration::{Report, Target},
};

/// A CiliumBGPPeeringPolicy: a BGPPeer per neighbour, and per virtual router a BGPAdvertisement
/// of its Services to its neighbours (and one per neighbour path attribute that selects pools).
pub(crate) fn peering_policy(
    policy: &str,
    mut spec: Fields,
    index: &Index,
    report: &mut Report,
) -> Result<Vec<(String, Target)>, Bad> {
    let node_selector = match spec.take("nodeSelector") {
        Some((path, v)) => selector(&path, v)?,
        None => Selector::default(),
    };
    let routers = spec.list("virtualRouters")?;
    let policy = Policy {
        name: policy,
        node_selector,
        several_routers: routers.len() > 1,
        index,
    };
    let mut out = Vec::new();
    for (path, router) in routers {
        let router = Fields::of(&path, router)?;
        out.extend(policy.virtual_router(&path, router, report)?);
    }
    report.rest(spec);
    Ok(out)
}

/// What every virtual router of one policy shares.
struct Policy<'a> {
    name: &'a str,
    node_selector: Selector,
    /// Several routers: each advertisement is named after its router's ASN.
    several_routers: bool,
    index: &'a Index,
}

impl Policy<'_> {
    /// One virtual router: a BGPPeer per neighbour, and the advertisements of its Services.
    fn virtual_router(
        &self,
        path: &str,
        mut router: Fields,
        report: &mut Report,
    ) -> Result<Vec<(String, Target)>, Bad> {
        let local_asn = local_asn(&mut router)?;
        for key in ["exportPodCIDR", "podIPPoolSelector"] {
            if let Some((path, value)) = router.take(key)
                && value != Value::Bool(false)
            {
                report.dropped(
                    path,
                    "pod addresses are not advertised here: the datapath routes them between \
                     the nodes",
                );
            }
        }
        let service_selector = router
            .take("serviceSelector")
            .map(|(path, v)| selector(&path, v))
            .transpose()?;
        let (load_balancer_ips, external_ips) =
            address_kinds_of(&mut router, "serviceAdvertisements", report)?
                .unwrap_or((true, false));
        let mut out = Vec::new();
        let mut neighbours = Vec::new();
        let mut attributed = Vec::new();
        for (path, neighbour) in router.list("neighbors")? {
            let neighbour = Fields::of(&path, neighbour)?;
            let (name, spec, attributes) = self.neighbour(&path, neighbour, local_asn, report)?;
            out.push((name.clone(), Target::BgpPeer(Box::new(spec))));
            neighbours.push(name);
            attributed.extend(attributes);
        }
        report.rest(router);
        let Some(service_selector) = service_selector else {
            report.note(format!(
                "{path}: no serviceSelector, so it advertises no Service in Cilium: no \
                 BGPAdvertisement"
            ));
            return Ok(out);
        };
        if neighbours.is_empty() || !(load_balancer_ips || external_ips) {
            return Ok(out);
        }
        let base = BgpAdvertisementSpec {
            ip_pools: Vec::new(),
            service_selector,
            node_selector: Selector::default(),
            peers: neighbours,
            communities: Vec::new(),
            local_preference: None,
            load_balancer_ips,
            external_ips,
            ..BgpAdvertisementSpec::default()
        };
        // Routes from several advertisements to one peer carry the union of their communities
        // and the highest local preference: the attributes ride on advertisements of their own.
        for attributes in attributed {
            let spec = BgpAdvertisementSpec {
                ip_pools: attributes.pools,
                peers: vec![attributes.neighbour],
                communities: attributes.communities,
                local_preference: attributes.local_preference,
                // Pools hold LoadBalancer IPs only.
                external_ips: false,
                ..base.clone()
            };
            out.push((attributes.name, Target::BgpAdvertisement(spec)));
        }
        let ad_name = if self.several_routers {
            format!("{}-{local_asn}", self.name)
        } else {
            self.name.to_owned()
        };
        out.push((ad_name, Target::BgpAdvertisement(base)));
        Ok(out)
    }

    /// One neighbour: its BGPPeer (named `<policy>-<address>`), and the path attributes it
    /// asks for some pools' routes.
    fn neighbour(
        &self,
        path: &str,
        mut neighbour: Fields,
        local_asn: u32,
        report: &mut Report,
    ) -> Result<(String, BgpPeerSpec, Vec<PathAttributes>), Bad> {
        let address = address_field(&mut neighbour, "peerAddress")?;
        let peer_asn = peer_asn(&mut neighbour)?;
        let mut config = PeerConfig::default();
        if let Some(port) = u16_field(&mut neighbour, "peerPort")? {
            config.peer_port = port;
        }
        read_timers(&mut neighbour, &mut config)?;
        config.password_secret_ref = read_secret_reference(&mut neighbour, report)?;
        config.graceful_restart = read_graceful_restart(&mut neighbour, report)?;
        config.ebgp_multihop = read_multihop(&mut neighbour, "eBGPMultihopTTL")?;
        config.families = read_families(&mut neighbour, report)?;
        config.report_other_families(path, address, report);
        let name = format!(
            "{}-{}",
            self.name,
            address.to_string().replace(['.', ':'], "-")
        );
        let mut attributed = Vec::new();
        for (path, attributes) in neighbour.list("advertisedPathAttributes")? {
            if let Some(ad) = path_attributes(&path, attributes, &name, self.index, report)? {
                attributed.push(ad);
            }
        }
        report.rest(neighbour);
        let mut spec = config.spec(address, peer_asn, local_asn);
        spec.node_selector = self.node_selector.clone();
        Ok((name, spec, attributed))
    }
}

/// A neighbour's path attributes for the routes of some LoadBalancer pools.
struct PathAttributes {
    /// `<neighbour>-attributes-<i>`.
    name: String,
    neighbour: String,
    /// The pools selected (none: every pool).
    pools: Vec<String>,
    communities: Vec<String>,
    local_preference: Option<u32>,
}

/// One of a neighbour's `advertisedPathAttributes`: for LoadBalancer pools, the attributes and
/// the pools they apply to; other selector types dropped.
fn path_attributes(
    path: &str,
    value: Value,
    neighbour: &str,
    index: &Index,
    report: &mut Report,
) -> Result<Option<PathAttributes>, Bad> {
    let mut fields = Fields::of(path, value)?;
    let selector_type = fields.string("selectorType")?.unwrap_or_default();
    if selector_type != "CiliumLoadBalancerIPPool" {
        report.dropped(
            path,
            format!("attributes of {selector_type} routes: only Service IPs are advertised here"),
        );
        return Ok(None);
    }
    let pools = match fields.take("selector") {
        None => Vec::new(),
        Some((path, v)) => {
            let pools = index.pools_selected_by(&selector(&path, v)?);
            if pools.is_empty() {
                report.dropped(
                    path,
                    "selects no CiliumLoadBalancerIPPool of the input: convert the pools with \
                     the policy",
                );
                return Ok(None);
            }
            pools
        }
    };
    // The attributes sit beside the selector, in the shape of an advertisement's attributes.
    let (communities, local_preference) = read_attributes(fields, report)?;
    let item = path
        .rsplit('[')
        .next()
        .unwrap_or("0]")
        .trim_end_matches(']');
    Ok(Some(PathAttributes {
        name: format!("{neighbour}-attributes-{item}"),
        neighbour: neighbour.to_owned(),
        pools,
        communities,
        local_preference,
    }))
}
