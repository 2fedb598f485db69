//! Cilium's LB-IPAM, L2 announcement and multi-pool IPAM resources.

use ipam_core::{
    lb::resources::{L2PolicySpec, LbIpBlock, LbIpPoolSpec},
    meta::Selector,
    pod::pool::{FamilySpec, PodIpPoolSpec},
};

use crate::{
    fields::{Bad, Fields, canonical_cidr, canonical_ip, selector},
    migration::Report,
};

/// A CiliumLoadBalancerIPPool (`cilium.io/v2alpha1` or `v2`).
pub(super) fn lb_pool(mut spec: Fields, report: &mut Report) -> Result<LbIpPoolSpec, Bad> {
    let mut blocks = Vec::new();
    // `cidrs` is the name of Cilium's first versions, still read by Cilium.
    for key in ["blocks", "cidrs"] {
        for (path, item) in spec.list(key)? {
            let mut b = Fields::of(&path, item)?;
            let (cidr, start, stop) = (b.string("cidr")?, b.string("start")?, b.string("stop")?);
            blocks.push(match (cidr, start, stop) {
                (Some(cidr), None, None) => LbIpBlock {
                    cidr: Some(canonical_cidr(&cidr)),
                    ..LbIpBlock::default()
                },
                // A start alone is one address, as in Cilium.
                (None, Some(start), stop) => LbIpBlock {
                    cidr: None,
                    stop: Some(canonical_ip(stop.as_deref().unwrap_or(&start))),
                    start: Some(canonical_ip(&start)),
                },
                _ => {
                    return Err(Bad::new(
                        path,
                        "a block has either a cidr, or a start (and a stop)",
                    ));
                }
            });
            report.rest(b);
        }
    }
    if blocks.is_empty() {
        return Err(Bad::new(
            spec.path_of("blocks"),
            "a pool needs at least one block",
        ));
    }
    let service_selector = match spec.take("serviceSelector") {
        Some((path, v)) => selector(&path, v)?,
        None => Default::default(),
    };
    // Cilium hands out a CIDR's first and last addresses unless told "No"; written out here,
    // since this project's default is the other way (docs/migration.md says why).
    let allow_first_last_ips = match spec.take("allowFirstLastIPs") {
        None => true,
        Some((path, v)) => match v.as_str() {
            Some("Yes") => true,
            Some("No") => false,
            _ => match v.as_bool() {
                Some(b) => b,
                None => return Err(Bad::new(path, "expected \"Yes\" or \"No\"")),
            },
        },
    };
    let disabled = spec.bool("disabled")?.unwrap_or(false);
    report.rest(spec);
    Ok(LbIpPoolSpec {
        blocks,
        service_selector,
        allow_first_last_ips,
        disabled,
        auto_assign: true,
        avoid_buggy_ips: false,
        namespaces: Vec::new(),
        priority: None,
        namespace_selector: Default::default(),
    })
}

/// A CiliumL2AnnouncementPolicy.
pub(super) fn l2_policy(mut spec: Fields, report: &mut Report) -> Result<L2PolicySpec, Bad> {
    let node_selector = match spec.take("nodeSelector") {
        Some((path, v)) => selector(&path, v)?,
        None => Default::default(),
    };
    let service_selector = match spec.take("serviceSelector") {
        Some((path, v)) => selector(&path, v)?,
        None => Default::default(),
    };
    let mut interfaces = Vec::new();
    for (path, pattern) in spec
        .list("interfaces")?
        .into_iter()
        .map(|(path, v)| super::fields::string(&path, v).map(|s| (path, s)))
        .collect::<Result<Vec<_>, _>>()?
    {
        let anchored = anchored(&pattern);
        regex_lite::Regex::new(&anchored).map_err(|e| {
            Bad::new(
                &path,
                format!("{pattern:?} is not a regular expression here: {e}"),
            )
        })?;
        if anchored != pattern {
            report.note(format!(
                "{path}: Cilium searches interface names for {pattern:?}, this project matches \
                 whole names: written {anchored:?}, which matches the same interfaces"
            ));
        }
        interfaces.push(anchored);
    }
    // Cilium announces neither kind unless told; both written out.
    let external_ips = spec.bool("externalIPs")?.unwrap_or(false);
    let load_balancer_ips = spec.bool("loadBalancerIPs")?.unwrap_or(false);
    if !external_ips && !load_balancer_ips {
        report.note(
            "announces neither loadBalancerIPs nor externalIPs (as in Cilium, it does nothing)",
        );
    }
    report.rest(spec);
    Ok(L2PolicySpec {
        node_selector,
        service_selector,
        // Cilium's L2 policies choose Services, not pools.
        ip_pools: Vec::new(),
        ip_pool_selector: Selector::default(),
        interfaces,
        load_balancer_ips,
        external_ips,
    })
}

/// Cilium's interface patterns match anywhere in the name (Go's `MatchString`); this
/// project's match the whole name. `.*(?:p).*` matches the same names, anchors inside `p`
/// keeping their meaning; an end already anchored needs no `.*`.
fn anchored(pattern: &str) -> String {
    let starts = pattern.starts_with('^');
    let ends = pattern.ends_with('$') && !pattern.ends_with("\\$");
    let lead = if starts { "" } else { ".*" };
    let trail = if ends { "" } else { ".*" };
    if starts && ends {
        pattern.to_owned()
    } else {
        format!("{lead}(?:{pattern}){trail}")
    }
}

/// A CiliumPodIPPool: the same shape as a PodIPPool.
pub(super) fn pod_pool(mut spec: Fields, report: &mut Report) -> Result<PodIpPoolSpec, Bad> {
    let mut family = |key: &str| -> Result<Option<FamilySpec>, Bad> {
        let Some(mut f) = spec.fields(key)? else {
            return Ok(None);
        };
        let cidrs = f.strings("cidrs")?;
        let mask_size = f.u32("maskSize")?.ok_or_else(|| {
            Bad::new(
                f.path_of("maskSize"),
                "missing: the size of each node's block",
            )
        })?;
        let mask_size = u8::try_from(mask_size)
            .map_err(|_| Bad::new(f.path_of("maskSize"), "a prefix length is at most 128"))?;
        report.rest(f);
        let cidrs = cidrs.iter().map(|c| canonical_cidr(c)).collect();
        Ok(Some(FamilySpec { cidrs, mask_size }))
    };
    let ipv4 = family("ipv4")?;
    let ipv6 = family("ipv6")?;
    if ipv4.is_none() && ipv6.is_none() {
        return Err(Bad::new(spec.path_of("ipv4"), "a pool needs ipv4 or ipv6"));
    }
    report.rest(spec);
    Ok(PodIpPoolSpec {
        reserved: Vec::new(),
        reservations: Vec::new(),
        ipv4,
        ipv6,
        namespaces: Vec::new(),
        namespace_selector: Default::default(),
        max_blocks_per_node: None,
    })
}

#[cfg(test)]
mod tests {
    use super::anchored;

    #[test]
    fn interface_patterns_keep_their_matches() {
        let matches = |pattern: &str, name: &str| {
            regex_lite::Regex::new(&format!("^(?:{})$", anchored(pattern)))
                .unwrap()
                .is_match(name)
        };
        for (pattern, name, expected) in [
            ("eth0", "eth0", true),
            ("eth0", "veth0", true),
            ("eth0", "eth0.100", true),
            ("^eth[0-9]+", "eth12", true),
            ("^eth[0-9]+", "veth1", false),
            ("^eth[0-9]+", "eth1.7", true),
            ("bond0$", "xbond0", true),
            ("bond0$", "bond0.1", false),
            ("^en.*$", "enp1s0", true),
            ("a|^b", "xa", true),
            ("a|^b", "xb", false),
        ] {
            assert_eq!(matches(pattern, name), expected, "{pattern} on {name}");
        }
        assert_eq!(anchored("^en.*$"), "^en.*$");
    }
}
