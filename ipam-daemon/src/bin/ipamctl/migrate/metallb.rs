//! MetalLB's `metallb.io/v1beta1` IPAddressPool and L2Advertisement.

use std::net::IpAddr;

use ipam_core::{
    Cidr,
    lb::resources::{L2PolicySpec, LbIpBlock, LbIpPoolSpec, Selector},
};

use super::{
    Pools, Report,
    fields::{Bad, Fields, selector},
};

/// An IPAddressPool.
pub(super) fn address_pool(mut spec: Fields, report: &mut Report) -> Result<LbIpPoolSpec, Bad> {
    let mut blocks = Vec::new();
    for (path, address) in spec.list("addresses")? {
        let address = super::fields::string(&path, address)?;
        blocks.push(block(&path, &address)?);
    }
    if blocks.is_empty() {
        return Err(Bad::new(
            spec.path_of("addresses"),
            "a pool needs at least one address",
        ));
    }
    let auto_assign = spec.bool("autoAssign")?.unwrap_or(true);
    let avoid_buggy_ips = spec.bool("avoidBuggyIPs")?.unwrap_or(false);
    let (mut namespaces, mut priority) = (Vec::new(), None);
    let (mut service_selector, mut namespace_selector) = (Selector::default(), Selector::default());
    if let Some(mut allocation) = spec.fields("serviceAllocation")? {
        priority = allocation.u32("priority")?;
        namespaces = allocation.strings("namespaces")?;
        namespace_selector = one_selector(
            &mut allocation,
            "namespaceSelectors",
            report,
            "namespaceSelector; the converted pool serves every namespace: write one selector \
             that covers them, or list the namespaces in spec.namespaces",
        )?;
        service_selector = one_selector(
            &mut allocation,
            "serviceSelectors",
            report,
            "serviceSelector; the converted pool serves every Service: write one selector that \
             covers them (for example matchExpressions with In)",
        )?;
        report.rest(allocation);
    }
    report.rest(spec);
    Ok(LbIpPoolSpec {
        blocks,
        service_selector,
        // MetalLB hands out every address of a CIDR, the first and last too.
        allow_first_last_ips: true,
        disabled: false,
        auto_assign,
        avoid_buggy_ips,
        namespaces,
        priority,
        namespace_selector,
    })
}

/// MetalLB's list of selectors `key` (any of them) as this project's one selector: none, the
/// one, or (several) none with the list reported as dropped, `instead` saying what that means.
pub(super) fn one_selector(
    allocation: &mut Fields,
    key: &str,
    report: &mut Report,
    instead: &str,
) -> Result<Selector, Bad> {
    let path = allocation.path_of(key);
    let mut selectors = allocation.list(key)?;
    match selectors.len() {
        0 => Ok(Selector::default()),
        1 => {
            let (path, value) = selectors.remove(0);
            selector(&path, value)
        }
        n => {
            report.dropped(
                path,
                format!("{n} selectors (any of them) cannot be one {instead}"),
            );
            Ok(Selector::default())
        }
    }
}

/// `10.0.0.0/24`, or a range `10.0.0.1-10.0.0.9` (spaces around the dash allowed).
fn block(path: &str, address: &str) -> Result<LbIpBlock, Bad> {
    if let Some((start, stop)) = address.split_once('-') {
        let (start, stop) = (start.trim(), stop.trim());
        for ip in [start, stop] {
            ip.parse::<IpAddr>().map_err(|_| {
                Bad::new(path, format!("{ip:?} in {address:?} is not an IP address"))
            })?;
        }
        return Ok(LbIpBlock {
            cidr: None,
            start: Some(start.to_owned()),
            stop: Some(stop.to_owned()),
        });
    }
    let address = address.trim();
    address.parse::<Cidr>().map_err(|e| {
        Bad::new(
            path,
            format!("{address:?} is neither a CIDR nor a range FIRST-LAST: {e}"),
        )
    })?;
    Ok(LbIpBlock {
        cidr: Some(address.to_owned()),
        ..LbIpBlock::default()
    })
}

/// An L2Advertisement: one policy, or one per node selector (MetalLB's list means any of them;
/// policies here add up the same way).
pub(super) fn l2_advertisement(
    name: &str,
    mut spec: Fields,
    pools: &Pools,
    report: &mut Report,
) -> Result<Vec<(String, L2PolicySpec)>, Bad> {
    let pool_path = spec.path_of("ipAddressPools");
    let mut selected: Vec<String> = spec.strings("ipAddressPools")?;
    let by_selector = spec.list("ipAddressPoolSelectors")?;
    let restricted = !selected.is_empty() || !by_selector.is_empty();
    for (path, value) in by_selector {
        selected.extend(pools.selected_by(&selector(&path, value)?).cloned());
    }
    if restricted {
        let left_out: Vec<&String> = pools
            .labels
            .keys()
            .filter(|p| !selected.contains(p))
            .collect();
        if pools.labels.is_empty() {
            report.dropped(
                pool_path,
                "the pools it names are not in the input, and policies here select Services, not \
                 pools: the converted policy announces the IPs of every pool; convert the \
                 IPAddressPools with it to know whether that changes anything",
            );
        } else if !left_out.is_empty() {
            report.dropped(
                pool_path,
                format!(
                    "policies here select Services, not pools: the converted policy also \
                     announces the IPs of {}; give it a serviceSelector if those pools serve \
                     other Services",
                    left_out
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
    }
    let interfaces = spec
        .strings("interfaces")?
        .iter()
        .map(|name| regex_lite::escape(name))
        .collect::<Vec<_>>();
    let node_selectors = spec
        .list("nodeSelectors")?
        .into_iter()
        .map(|(path, v)| selector(&path, v))
        .collect::<Result<Vec<_>, _>>()?;
    report.rest(spec);
    let policy = |node_selector: Selector| L2PolicySpec {
        node_selector,
        service_selector: Selector::default(),
        interfaces: interfaces.clone(),
        // MetalLB announces LoadBalancer IPs only.
        load_balancer_ips: true,
        external_ips: false,
    };
    Ok(match node_selectors.len() {
        0 => vec![(name.to_owned(), policy(Selector::default()))],
        1 => vec![(
            name.to_owned(),
            policy(node_selectors.into_iter().next().unwrap_or_default()),
        )],
        n => {
            report.note(format!(
                "its {n} nodeSelectors (any of them) became {n} policies, {name}-1 to {name}-{n}"
            ));
            node_selectors
                .into_iter()
                .enumerate()
                .map(|(i, s)| (format!("{name}-{}", i + 1), policy(s)))
                .collect()
        }
    })
}
