//! MetalLB's `metallb.io/v1beta1` IPAddressPool and L2Advertisement.

use std::net::IpAddr;

use ipam_core::{
    Cidr,
    lb::resources::{L2PolicySpec, LbIpBlock, LbIpPoolSpec},
    meta::Selector,
};

use crate::{
    fields::{Bad, Fields, canonical_ip, selector},
    migration::Report,
    source::Pools,
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

/// MetalLB's `ipAddressPools` and `ipAddressPoolSelectors` (a pool passes if it is named or
/// selected by any) as this project's `ipPools` and `ipPoolSelector` (a pool must pass each
/// that is set). Names alone, or one selector alone, are carried as they are; both, or several
/// selectors, become the names of the input's pools they choose (a pool labelled later is not
/// chosen: said in a note), or, without the pools in the input, are dropped.
pub(super) fn pool_choice(
    spec: &mut Fields,
    pools: &Pools,
    report: &mut Report,
) -> Result<(Vec<String>, Selector), Bad> {
    let names_path = spec.path_of("ipAddressPools");
    let selectors_path = spec.path_of("ipAddressPoolSelectors");
    let mut names: Vec<String> = spec.strings("ipAddressPools")?;
    let mut selectors = spec
        .list("ipAddressPoolSelectors")?
        .into_iter()
        .map(|(path, value)| selector(&path, value))
        .collect::<Result<Vec<_>, _>>()?;
    if names.is_empty() && selectors.len() == 1 {
        return Ok((Vec::new(), selectors.remove(0)));
    }
    if selectors.is_empty() {
        return Ok((names, Selector::default()));
    }
    if pools.labels.is_empty() {
        report.dropped(
            selectors_path,
            format!(
                "beside {}, its selectors cannot be written as one ipPoolSelector, and the \
                 pools they select are not in the input; convert the IPAddressPools with it",
                if names.is_empty() {
                    "each other".to_owned()
                } else {
                    names_path
                }
            ),
        );
        return Ok((names, Selector::default()));
    }
    let mut chosen: Vec<String> = Vec::new();
    for selector in &selectors {
        chosen.extend(pools.selected_by(selector).cloned());
    }
    report.note(format!(
        "{selectors_path} became the names of the pools they select in the input ({}): a \
         pool labelled later is not chosen",
        if chosen.is_empty() {
            "none".to_owned()
        } else {
            chosen.join(", ")
        }
    ));
    names.extend(chosen);
    // Nothing chosen means every pool, here as in MetalLB.
    names.sort();
    names.dedup();
    Ok((names, Selector::default()))
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
        // Written as this project writes addresses (`ccd`, not the input's `0ccd`).
        return Ok(LbIpBlock {
            cidr: None,
            start: Some(canonical_ip(start)),
            stop: Some(canonical_ip(stop)),
        });
    }
    let address = address.trim();
    let cidr = address.parse::<Cidr>().map_err(|e| {
        Bad::new(
            path,
            format!("{address:?} is neither a CIDR nor a range FIRST-LAST: {e}"),
        )
    })?;
    Ok(LbIpBlock {
        cidr: Some(cidr.to_string()),
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
    let (ip_pools, ip_pool_selector) = pool_choice(&mut spec, pools, report)?;
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
        ip_pools: ip_pools.clone(),
        ip_pool_selector: ip_pool_selector.clone(),
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
