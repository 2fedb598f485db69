//! Cilium's and MetalLB's resources converted into this project's: CiliumLoadBalancerIPPool,
//! CiliumL2AnnouncementPolicy, CiliumPodIPPool, CiliumBGPClusterConfig with the
//! CiliumBGPPeerConfigs and CiliumBGPAdvertisements it leads to, CiliumBGPPeeringPolicy;
//! IPAddressPool, L2Advertisement, BGPPeer, BGPAdvertisement with the BFDProfiles and
//! Communities they name. Pure functions from YAML to `ipam_core` objects: `ipamctl migrate`
//! reads the file, calls `read` and `convert`, and prints the result.
//!
//! Every field of the input is either carried over or reported as dropped, with why
//! (`Migration::dropped`); what is carried over in another form is noted.
//!
//! - `source`: the input as read, document by document;
//! - `migration`: what a conversion produces, and the `Report` each converter fills;
//! - `fields`: reading a YAML mapping field by field, so that what is not read is known;
//! - one module per source system: `cilium`, `cilium_bgp`, `metallb`, `metallb_bgp`;
//! - `examples`: inputs in the shapes of those projects' documentation.

mod cilium;
mod cilium_bgp;
mod error;
pub mod examples;
mod fields;
mod metallb;
mod metallb_bgp;
mod migration;
mod source;

use std::collections::BTreeMap;

pub use error::MigrateError;
pub use migration::{Converted, Dropped, Migration, Target};
pub use source::{Source, read};

use migration::Report;
use source::Pools;

/// The kinds read, for messages.
const READ_KINDS: &str = "CiliumLoadBalancerIPPool, CiliumL2AnnouncementPolicy, CiliumPodIPPool, \
                          CiliumBGPClusterConfig, CiliumBGPPeerConfig, CiliumBGPAdvertisement, \
                          CiliumBGPPeeringPolicy (cilium.io) and IPAddressPool, \
                          L2Advertisement, BGPPeer, BGPAdvertisement, BFDProfile, Community \
                          (metallb.io)";

/// What the converters of one input share: the objects others name or select.
struct Context {
    /// MetalLB's IPAddressPools, which its advertisements select.
    pools: Pools,
    /// MetalLB's BFDProfiles and Communities, which its peers and advertisements name.
    named: metallb_bgp::Named,
    /// Cilium's BGP objects, which its cluster configs and peering policies lead to.
    cilium_index: cilium_bgp::Index,
}

/// Converts every object of `sources`. An object of the wrong shape stops it all (nothing half
/// converted is printed); fields and objects without a counterpart are reported in the result.
pub fn convert(sources: &[Source]) -> Result<Migration, MigrateError> {
    let mut migration = Migration::default();
    let context = Context {
        pools: Pools::of(sources, "metallb.io", "IPAddressPool"),
        named: metallb_bgp::Named::of(sources),
        cilium_index: cilium_bgp::Index::of(sources),
    };
    for source in sources {
        let mut report = Report::new(source.describe(), &mut migration);
        let converted = convert_object(source, &context, &mut report)?;
        add(&mut migration, source, converted)?;
    }
    Ok(migration)
}

/// One object's conversion: by its kind, in its group (or with none, as both projects'
/// kinds differ).
fn convert_object(
    source: &Source,
    context: &Context,
    report: &mut Report,
) -> Result<Vec<(String, Target)>, MigrateError> {
    let group = source.group.as_str();
    let mut converted = None;
    if matches!(group, "cilium.io" | "") {
        converted = cilium_object(source, context, report)?;
    }
    if converted.is_none() && matches!(group, "metallb.io" | "") {
        converted = metallb_object(source, context, report)?;
    }
    Ok(converted.unwrap_or_else(|| {
        report.dropped(
            "(the whole object)",
            format!(
                "{} is not a kind ipamctl migrate converts; it reads {READ_KINDS}",
                source.kind
            ),
        );
        Vec::new()
    }))
}

/// A Cilium object's conversion; `None` for a kind Cilium does not have.
fn cilium_object(
    source: &Source,
    context: &Context,
    report: &mut Report,
) -> Result<Option<Vec<(String, Target)>>, MigrateError> {
    let one = |target: Target| Some(vec![(source.name.clone(), target)]);
    let fail = |bad| source.error(bad);
    let index = &context.cilium_index;
    Ok(match source.kind.as_str() {
        "CiliumLoadBalancerIPPool" => one(Target::LbPool(
            cilium::lb_pool(source.spec()?, report).map_err(fail)?,
        )),
        "CiliumL2AnnouncementPolicy" => one(Target::L2Policy(
            cilium::l2_policy(source.spec()?, report).map_err(fail)?,
        )),
        "CiliumPodIPPool" => one(Target::PodPool(
            cilium::pod_pool(source.spec()?, report).map_err(fail)?,
        )),
        "CiliumBGPClusterConfig" => Some(
            cilium_bgp::cluster_config(source.spec()?, index, report)
                .map_err(fail)?
                .into_iter()
                .map(|(name, spec)| (name, Target::BgpPeer(Box::new(spec))))
                .collect(),
        ),
        // Its settings go into the peers that name it; read for what it drops.
        "CiliumBGPPeerConfig" => {
            cilium_bgp::peer_config_object(source.spec()?, report).map_err(fail)?;
            Some(Vec::new())
        }
        "CiliumBGPAdvertisement" => Some(
            cilium_bgp::advertisement(&source.name, &source.labels, source.spec()?, index, report)
                .map_err(fail)?
                .into_iter()
                .map(|(name, spec)| (name, Target::BgpAdvertisement(spec)))
                .collect(),
        ),
        "CiliumBGPPeeringPolicy" => Some(
            cilium_bgp::peering_policy(&source.name, source.spec()?, index, report)
                .map_err(fail)?,
        ),
        "CiliumBGPNodeConfigOverride" => {
            report.dropped(
                "(the whole object)",
                "per-node settings: a node's router ID is [bgp] router_id in its agent's \
                 configuration; its local address and port are BIRD's choice",
            );
            Some(Vec::new())
        }
        "CiliumBGPNodeConfig" => {
            report.dropped(
                "(the whole object)",
                "Cilium's operator writes it from the CiliumBGPClusterConfigs: convert those",
            );
            Some(Vec::new())
        }
        _ => None,
    })
}

/// A MetalLB object's conversion; `None` for a kind MetalLB does not have.
fn metallb_object(
    source: &Source,
    context: &Context,
    report: &mut Report,
) -> Result<Option<Vec<(String, Target)>>, MigrateError> {
    let one = |target: Target| Some(vec![(source.name.clone(), target)]);
    let fail = |bad| source.error(bad);
    let Context { pools, named, .. } = context;
    Ok(match source.kind.as_str() {
        "IPAddressPool" => one(Target::LbPool(
            metallb::address_pool(source.spec()?, report).map_err(fail)?,
        )),
        "L2Advertisement" => Some(
            metallb::l2_advertisement(&source.name, source.spec()?, pools, report)
                .map_err(fail)?
                .into_iter()
                .map(|(name, spec)| (name, Target::L2Policy(spec)))
                .collect(),
        ),
        "BGPPeer" => one(Target::BgpPeer(Box::new(
            metallb_bgp::peer(source.spec()?, named, report).map_err(fail)?,
        ))),
        "BGPAdvertisement" => one(Target::BgpAdvertisement(
            metallb_bgp::advertisement(source.spec()?, pools, named, report).map_err(fail)?,
        )),
        // Read where a BGPPeer or BGPAdvertisement names them; nothing of their own.
        "BFDProfile" | "Community" => Some(Vec::new()),
        _ => None,
    })
}

/// Adds one object's converted objects, refusing two of one kind and name.
fn add(
    migration: &mut Migration,
    source: &Source,
    converted: Vec<(String, Target)>,
) -> Result<(), MigrateError> {
    for (name, target) in converted {
        let from = source.describe();
        if let Some(first) = migration
            .converted
            .iter()
            .find(|c| c.name == name && c.target.kind() == target.kind())
        {
            return Err(MigrateError::Clash {
                kind: target.kind(),
                name,
                first: first.from.clone(),
                second: from,
            });
        }
        let labels = match target {
            Target::LbPool(_) => source.labels.clone(),
            _ => BTreeMap::new(),
        };
        migration.converted.push(Converted {
            name,
            target,
            from,
            labels,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
