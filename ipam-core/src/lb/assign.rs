//! LB-IPAM: which Service gets which IP, from the pools and the services as they are. A pure
//! function of its inputs, so the operator can run it on every pass, and every rule has a
//! table test.
//!
//! Rules:
//! - a pool that is invalid, or whose own blocks overlap, is not used (its status says why and
//!   names the blocks);
//! - of two pools that overlap, the one already in use keeps serving and the newcomer is
//!   flagged `Conflict` and not used: adding a pool never moves an IP a Service holds. A pool
//!   is in use when its stored status says it was accepted (Ready, no Conflict) on an earlier
//!   pass; between two pools of the same standing (both new, say, applied together) the one
//!   first in name order wins;
//! - a disabled pool keeps its assignments and gives no new ones;
//! - a service keeps each IP it holds while the IP is in a usable pool that selects it; an IP
//!   that left every such pool is replaced, and the service's condition says so (never a
//!   silently dead address);
//! - every requested IP must lie in an enabled pool that selects the service and be free (or
//!   shared); each one the service cannot have is named in its condition;
//! - a service asking for a pool by name (`pool`) gets new IPs from it only, also when it does
//!   not assign automatically, and gives up an IP it holds elsewhere;
//! - services with the same sharing key share an IP when their ports do not clash and their
//!   traffic policies (and, with `Local`, their selectors) agree;
//! - services of different namespaces share only when both allow the other's namespace
//!   (`sharingCrossNamespace`);
//! - a pool serves the Services its `serviceSelector` selects (over their labels and Cilium's
//!   `io.kubernetes.service.namespace`/`.name`) in its `namespaces` (all when empty);
//! - new IPs are the lowest free address of the first enabled pool that serves the service and
//!   has the family, by `priority` (lower first, pools without one after) then name; first and
//!   last address of each CIDR only with `allowFirstLastIPs`;
//! - a Service that leaves LB-IPAM (another type or class) gives its IPs back at once: its
//!   status loses the IPs and the condition LB-IPAM wrote, so no two Services claim one IP.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use super::resources::{LbFamilyCount, LbIpPoolSpec, LbIpPoolStatus, ServiceSpec, ServiceStatus};
use crate::{
    Cidr, Family,
    cidr::{ip_to_u128, u128_to_ip},
    meta::Condition,
};

/// The condition types LB-IPAM writes.
pub const READY: &str = "Ready";
pub const CONFLICT: &str = "Conflict";
pub const IP_ASSIGNED: &str = "IPAssigned";
/// The condition a pool (and its services) get when no announced interface reaches it; the
/// operator's controller writes it beside LB-IPAM's.
pub const REACHABLE: &str = "Reachable";
/// The condition a service gets saying whether a node may answer for its IPs, and whether
/// something on the nodes gets in the way (the operator's controller writes it).
pub const ANNOUNCED: &str = "Announced";
/// The condition a service gets while two of its annotations disagree (the operator's
/// controller writes it).
pub const ANNOTATIONS_AGREE: &str = "AnnotationsAgree";

/// The condition a Service gets while it carries a reserved label (`io.kubernetes.service.*`)
/// with a value other than the derived one, which selectors ignore.
pub const LABELS_ACCEPTED: &str = "LabelsAccepted";

/// An inclusive range of usable addresses of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    family: Family,
    first: u128,
    last: u128,
}

impl Range {
    fn contains(&self, ip: IpAddr) -> bool {
        Family::of(ip) == self.family && (self.first..=self.last).contains(&ip_to_u128(ip))
    }

    fn overlaps(&self, other: &Range) -> bool {
        self.family == other.family && self.first <= other.last && other.first <= self.last
    }

    /// How many addresses the range holds; the whole IPv6 space (2^128) does not fit a u128
    /// and counts as `u128::MAX`, the counters' ceiling (see docs/service-ips.md).
    fn size(&self) -> u128 {
        (self.last - self.first).saturating_add(1)
    }
}

struct UsablePool<'a> {
    name: &'a str,
    spec: &'a LbIpPoolSpec,
    ranges: Vec<Range>,
}

impl UsablePool<'_> {
    fn contains(&self, ip: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(ip))
    }

    fn has(&self, family: Family) -> bool {
        self.ranges.iter().any(|r| r.family == family)
    }
}

/// Why a pool is not used.
enum Unusable {
    /// A block is not valid.
    Invalid(String),
    /// Two of its own blocks cover the same addresses.
    SelfOverlap(String),
}

/// The pools' usable ranges, or why they cannot be used.
fn pool_ranges(name: &str, spec: &LbIpPoolSpec) -> Result<Vec<Range>, Unusable> {
    let ranges = parse_pool(name, spec).map_err(Unusable::Invalid)?;
    // Whole blocks are compared: a CIDR's first and last address count even when left out.
    let whole = LbIpPoolSpec {
        allow_first_last_ips: true,
        ..spec.clone()
    };
    let blocks = parse_pool(name, &whole).map_err(Unusable::Invalid)?;
    for (i, a) in blocks.iter().enumerate() {
        if let Some(j) = blocks[i + 1..].iter().position(|b| b.overlaps(a)) {
            let j = i + 1 + j;
            return Err(Unusable::SelfOverlap(format!(
                "pool {name}: block {i} ({}) and block {j} ({}) overlap; none of its blocks is \
                 used until one of them is removed or narrowed",
                spec.blocks[i].describe(),
                spec.blocks[j].describe()
            )));
        }
    }
    Ok(ranges)
}

/// Whether the pool's stored status says an earlier pass accepted it: Ready and no Conflict.
fn accepted(status: &LbIpPoolStatus) -> bool {
    let has = |kind: &str| status.conditions.iter().any(|c| c.kind == kind && c.status);
    has(READY) && !has(CONFLICT)
}

/// The pools' usable ranges, or why a block is not valid.
fn parse_pool(name: &str, spec: &LbIpPoolSpec) -> Result<Vec<Range>, String> {
    if spec.blocks.is_empty() {
        return Err(format!(
            "pool {name} has no blocks; give spec.blocks a cidr or a start/stop range"
        ));
    }
    let mut ranges = Vec::new();
    for (i, block) in spec.blocks.iter().enumerate() {
        let range = match (&block.cidr, &block.start, &block.stop) {
            (Some(cidr), None, None) => {
                let cidr: Cidr = cidr
                    .parse()
                    .map_err(|e| format!("pool {name} block {i}: {e}"))?;
                let (base, last) = (cidr.base(), cidr.last());
                // The first and last address of a CIDR (network and broadcast in IPv4) are
                // left out unless asked for; a /31, /32, /127 or /128 keeps them all.
                let (first, last) = if spec.allow_first_last_ips || cidr.host_bits() <= 1 {
                    (base, last)
                } else {
                    (base + 1, last - 1)
                };
                Range {
                    family: cidr.family(),
                    first,
                    last,
                }
            }
            (None, Some(start), Some(stop)) => {
                let parse = |s: &str| {
                    s.parse::<IpAddr>()
                        .map_err(|_| format!("pool {name} block {i}: {s:?} is not an IP address"))
                };
                let (start, stop) = (parse(start)?, parse(stop)?);
                if Family::of(start) != Family::of(stop) {
                    return Err(format!(
                        "pool {name} block {i}: start {start} and stop {stop} are of different families"
                    ));
                }
                if ip_to_u128(start) > ip_to_u128(stop) {
                    return Err(format!(
                        "pool {name} block {i}: start {start} is after stop {stop}; swap them"
                    ));
                }
                Range {
                    family: Family::of(start),
                    first: ip_to_u128(start),
                    last: ip_to_u128(stop),
                }
            }
            _ => {
                return Err(format!(
                    "pool {name} block {i}: give either cidr, or start and stop"
                ));
            }
        };
        ranges.push(range);
    }
    Ok(ranges)
}

/// What LB-IPAM decided: the new status of every service it serves and of every pool.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    pub services: BTreeMap<String, ServiceStatus>,
    pub pools: BTreeMap<String, LbIpPoolStatus>,
}

/// Why two services may not share an IP although their sharing keys agree: one IP is answered
/// by one node, so their traffic policies must agree, and with `Local` (only that node's
/// endpoints) they must select the same pods (Cilium and MetalLB refuse the same).
fn policies_disagree(a: &ServiceSpec, b: &ServiceSpec) -> Option<String> {
    use super::resources::TrafficPolicy;
    if a.external_traffic_policy != b.external_traffic_policy {
        return Some(format!(
            "their externalTrafficPolicy differ ({:?} and {:?}); give both the same policy",
            a.external_traffic_policy, b.external_traffic_policy
        ));
    }
    (a.external_traffic_policy == TrafficPolicy::Local && a.selector != b.selector).then(|| {
        "with externalTrafficPolicy Local they must select the same pods, and their selectors \
         differ; give both the same selector, or use the Cluster policy"
            .to_owned()
    })
}

/// Why two services of different namespaces may not share an IP although their sharing keys
/// agree: each must allow the other's namespace (a key is easy to guess, and an IP shared with a
/// stranger's Service sends it traffic meant for ours).
fn namespaces_disagree(
    a: &str,
    a_spec: &ServiceSpec,
    b: &str,
    b_spec: &ServiceSpec,
) -> Option<String> {
    use super::resources::{may_share, namespace_of};
    (!may_share(a, a_spec, b, b_spec)).then(|| {
        format!(
            "the two are in namespaces {} and {}, and Services of different namespaces share \
             only when each allows the other's: list the other's namespace (or *) in the \
             annotation ipam-ebpf.io/sharing-cross-namespace of both",
            namespace_of(a),
            namespace_of(b)
        )
    })
}

/// Who holds which IP so far in this pass.
#[derive(Default)]
struct Holders<'a> {
    by_ip: BTreeMap<IpAddr, Vec<(&'a str, &'a ServiceSpec)>>,
    /// Per range (family, first, last): below this address every one is held or avoided.
    /// Holders only grow within a pass, so the search for a free address resumes there: from
    /// the range's start each time, 10,000 new Services cost 50 million lookups a pass.
    searched_to: std::cell::RefCell<BTreeMap<(bool, u128, u128), u128>>,
}

impl<'a> Holders<'a> {
    /// Why `spec` cannot hold `ip`, or `None` if it can (free, or shared without a clash).
    fn refuses(&self, ip: IpAddr, name: &str, spec: &ServiceSpec) -> Option<String> {
        let holders = self.by_ip.get(&ip)?;
        for (other, other_spec) in holders.iter().filter(|(n, _)| *n != name) {
            match (&spec.sharing_key, &other_spec.sharing_key) {
                (Some(a), Some(b)) if a == b => {
                    if let Some(why) = namespaces_disagree(name, spec, other, other_spec) {
                        return Some(format!(
                            "{ip} is shared with service {other} (sharing key {a}), but {why}"
                        ));
                    }
                    if let Some(why) = policies_disagree(spec, other_spec) {
                        return Some(format!(
                            "{ip} is shared with service {other} (sharing key {a}), but {why}"
                        ));
                    }
                    let clash = spec.ports.iter().find(|p| other_spec.ports.contains(p));
                    if let Some(p) = clash {
                        return Some(format!(
                            "{ip} is shared with service {other} (sharing key {a}), but both use \
                             port {}/{:?}; change one of the ports or the sharing key",
                            p.port, p.protocol
                        ));
                    }
                }
                _ => {
                    return Some(format!(
                        "{ip} is taken by service {other}; give both the same sharing key (and \
                         ports that do not clash) to share it"
                    ));
                }
            }
        }
        None
    }

    /// Where the search for a free address of `range` may start.
    fn search_from(&self, range: &Range) -> u128 {
        let key = (range.family == Family::V4, range.first, range.last);
        self.searched_to
            .borrow()
            .get(&key)
            .copied()
            .unwrap_or(range.first)
    }

    /// Every address of `range` below `n` is held or avoided.
    fn searched(&self, range: &Range, n: u128) {
        let key = (range.family == Family::V4, range.first, range.last);
        self.searched_to.borrow_mut().insert(key, n);
    }

    fn hold(&mut self, ip: IpAddr, name: &'a str, spec: &'a ServiceSpec) {
        let holders = self.by_ip.entry(ip).or_default();
        if !holders.iter().any(|(n, _)| *n == name) {
            holders.push((name, spec));
        }
    }
}

/// Assigns IPs to `services` from `pools` (name, spec, stored status). Services of another
/// class or type are left out of the result (their status is not LB-IPAM's to write), unless
/// their status still holds what LB-IPAM wrote: that is cleared.
pub fn assign(
    pools: &[(String, LbIpPoolSpec, LbIpPoolStatus)],
    services: &[(String, ServiceSpec, ServiceStatus)],
) -> Assignment {
    assign_settling(pools, services, false)
}

/// As `assign`; with `settling` (the set of pools changed a moment ago) an IP a Service holds
/// that lies in no pool at all is kept for now instead of given up: pools applied together
/// reach the store one by one, and a pass between two of them must not renumber the Services
/// of the later ones (a migration applies every pool of the old controller at once).
pub fn assign_settling(
    pools: &[(String, LbIpPoolSpec, LbIpPoolStatus)],
    services: &[(String, ServiceSpec, ServiceStatus)],
    settling: bool,
) -> Assignment {
    let mut out = Assignment::default();
    let usable = usable_pools(pools, &mut out);
    for (name, _, status) in services.iter().filter(|(_, s, _)| !s.is_ours()) {
        if let Some(cleared) = released(status) {
            out.services.insert(name.clone(), cleared);
        }
    }
    let mut ours: Vec<&(String, ServiceSpec, ServiceStatus)> =
        services.iter().filter(|(_, s, _)| s.is_ours()).collect();
    ours.sort_by(|a, b| a.0.cmp(&b.0));
    let mut holders = Holders::default();
    // Kept IPs first, for every service, so a new assignment never takes an IP someone holds.
    let Kept { mut ips, mut notes } = keep_held(&ours, &usable, &mut holders, settling);
    // An external IP a pool gives a Service (`lb::external`) is in use: handed to no other
    // Service unasked, and refused to one that asks for it as any held IP is (else a tenant
    // takes another's external IP by asking for it). After the kept IPs: listing an IP never
    // takes it from the Service LB-IPAM gave it to.
    for (name, spec, _) in services {
        for ip in &spec.external_ips {
            if usable
                .iter()
                .any(|p| p.contains(*ip) && p.spec.serves(name, spec))
            {
                holders.hold(*ip, name, spec);
            }
        }
    }
    for (name, spec, _) in &ours {
        let _span = tracing::trace_span!("service", service = name.as_str()).entered();
        let kept = ips.remove(name.as_str()).unwrap_or_default();
        let notes = notes.remove(name.as_str()).unwrap_or_default();
        let status = complete(&usable, &mut holders, name, spec, kept, notes);
        out.services.insert(name.clone(), status);
    }
    count(&usable, &holders, &mut out);
    out
}

/// The pools that may give IPs, pools in use first (so a newcomer never takes addresses from
/// one), then by name; every pool's condition goes into `out`.
fn usable_pools<'a>(
    pools: &'a [(String, LbIpPoolSpec, LbIpPoolStatus)],
    out: &mut Assignment,
) -> Vec<UsablePool<'a>> {
    let mut usable: Vec<UsablePool> = Vec::new();
    let mut sorted: Vec<&(String, LbIpPoolSpec, LbIpPoolStatus)> = pools.iter().collect();
    sorted.sort_by(|a, b| accepted(&b.2).cmp(&accepted(&a.2)).then(a.0.cmp(&b.0)));
    for (name, spec, _) in sorted {
        let condition = match pool_ranges(name, spec) {
            Err(Unusable::Invalid(message)) => Condition::new(READY, false, message),
            Err(Unusable::SelfOverlap(message)) => Condition::new(CONFLICT, true, message),
            Ok(ranges) => {
                let clash = usable.iter().find_map(|u| {
                    u.ranges
                        .iter()
                        .any(|r| ranges.iter().any(|s| s.overlaps(r)))
                        .then_some(u.name)
                });
                match clash {
                    Some(other) => Condition::new(
                        CONFLICT,
                        true,
                        format!(
                            "pool {name} overlaps pool {other}, which was there first; it is not \
                             used until the overlap is removed"
                        ),
                    ),
                    None => {
                        usable.push(UsablePool { name, spec, ranges });
                        Condition::new(
                            READY,
                            true,
                            if spec.disabled {
                                "disabled: keeps its assignments, gives no new ones"
                            } else {
                                "in use"
                            },
                        )
                    }
                }
            }
        };
        out.pools.insert(
            name.clone(),
            LbIpPoolStatus {
                conditions: vec![condition],
                counts: Vec::new(),
            },
        );
    }

    usable
}

/// The IPs services keep from their stored status, and why the others were given up.
#[derive(Default)]
struct Kept<'a> {
    ips: BTreeMap<&'a str, Vec<IpAddr>>,
    notes: BTreeMap<&'a str, Vec<String>>,
}

/// Which of the IPs the services hold they keep (recorded in `holders`), and why not the
/// others.
fn keep_held<'a>(
    ours: &[&'a (String, ServiceSpec, ServiceStatus)],
    usable: &[UsablePool],
    holders: &mut Holders<'a>,
    settling: bool,
) -> Kept<'a> {
    let mut kept: BTreeMap<&str, Vec<IpAddr>> = BTreeMap::new();
    let mut notes: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (name, spec, status) in ours.iter().copied() {
        let (families, _) = spec.wanted_families();
        for ip in &status.ingress {
            let selected = usable
                .iter()
                .any(|p| p.contains(*ip) && p.spec.serves(name, spec));
            let in_no_pool = || !usable.iter().any(|p| p.contains(*ip));
            let reason = if !families.contains(&Family::of(*ip)) {
                Some(format!(
                    "{ip} is of a family the service no longer asks for"
                ))
            } else if !selected && settling && in_no_pool() {
                // Kept while the pools settle (`assign_settling`); judged again after.
                holders.refuses(*ip, name, spec)
            } else if !selected {
                Some(format!(
                    "{ip} is no longer in a pool that selects this service"
                ))
            } else if !spec.requested_ips.is_empty() && !spec.requested_ips.contains(ip) {
                Some(format!("{ip} is not among the requested IPs"))
            } else if let Some(asked) = spec
                .pool
                .as_deref()
                .filter(|asked| !usable.iter().any(|p| p.name == *asked && p.contains(*ip)))
            {
                Some(format!(
                    "{ip} is not in pool {asked}, which the service asks for"
                ))
            } else {
                holders.refuses(*ip, name, spec)
            };
            match reason {
                None => {
                    holders.hold(*ip, name, spec);
                    kept.entry(name).or_default().push(*ip);
                }
                Some(why) => notes
                    .entry(name)
                    .or_default()
                    .push(format!("gave up {why}")),
            }
        }
    }

    Kept { ips: kept, notes }
}

/// A service's status: the IPs it kept, and a new one for every family it still lacks.
fn complete<'a>(
    usable: &[UsablePool],
    holders: &mut Holders<'a>,
    name: &'a str,
    spec: &'a ServiceSpec,
    mut ips: Vec<IpAddr>,
    notes: Vec<String>,
) -> ServiceStatus {
    let (families, all_required) = spec.wanted_families();
    let mut problems = Vec::new();
    // Every requested IP of a wanted family, each taken or named in the condition.
    let mut requested: Vec<IpAddr> = spec
        .requested_ips
        .iter()
        .copied()
        .filter(|ip| families.contains(&Family::of(*ip)) && !ips.contains(ip))
        .collect();
    let mut seen = BTreeSet::new();
    requested.retain(|ip| seen.insert(*ip));
    let enabled = enabled_for(usable, name, spec);
    for ip in requested {
        match take_requested(&enabled, usable, holders, name, spec, ip) {
            Ok(()) => {
                holders.hold(ip, name, spec);
                ips.push(ip);
            }
            Err(why) => problems.push(why),
        }
    }
    for family in families {
        if spec
            .requested_ips
            .iter()
            .any(|ip| Family::of(*ip) == family)
        {
            // Asked for by IP: taken above, or named in `problems`.
            continue;
        }
        if ips.iter().any(|ip| Family::of(*ip) == family) {
            continue;
        }
        match new_ip(&enabled, holders, name, spec, family) {
            Ok(ip) => {
                holders.hold(ip, name, spec);
                ips.push(ip);
            }
            Err(why) => problems.push(why),
        }
    }
    ips.sort();
    let assigned = if all_required {
        problems.is_empty()
    } else {
        !ips.is_empty()
    };
    let mut message = notes;
    if problems.is_empty() {
        message.push(if ips.is_empty() {
            "no IP".to_owned()
        } else {
            format!(
                "assigned {}",
                ips.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        });
    } else {
        message.extend(problems);
    }
    ServiceStatus {
        ingress: ips,
        conditions: vec![Condition::new(IP_ASSIGNED, assigned, message.join("; "))],
    }
}

/// An IPv4 address ending in .0 or .255, which some clients and middleboxes drop.
fn buggy(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V4(v4) if matches!(v4.octets()[3], 0 | 255))
}

/// How many addresses of `range` `buggy` would name (IPv4 only).
fn buggy_in(range: &Range) -> u128 {
    if range.family != Family::V4 {
        return 0;
    }
    // Numbers n in [first, last] with n % 256 == r, for r = 0 and 255.
    let upto = |n: u128, r: u128| if n < r { 0 } else { (n - r) / 256 + 1 };
    let between = |r| {
        upto(range.last, r)
            - if range.first == 0 {
                0
            } else {
                upto(range.first - 1, r)
            }
    };
    between(0) + between(255)
}

/// Each usable pool's counts per family, from the IPs held.
fn count(usable: &[UsablePool], holders: &Holders, out: &mut Assignment) {
    for pool in usable {
        let mut counts = Vec::new();
        for family in [Family::V4, Family::V6] {
            let ranges: Vec<&Range> = pool.ranges.iter().filter(|r| r.family == family).collect();
            if ranges.is_empty() {
                continue;
            }
            // Saturating: the ranges of one pool may add up past u128 (two halves of the
            // IPv6 space); the count then stops at the ceiling instead of wrapping.
            let total = ranges
                .iter()
                .map(|r| r.size())
                .fold(0u128, u128::saturating_add);
            let held: Vec<&IpAddr> = holders
                .by_ip
                .keys()
                .filter(|ip| ranges.iter().any(|r| r.contains(**ip)))
                .collect();
            let used = held.len() as u128;
            // With avoidBuggyIPs the .0 and .255 addresses are never handed out unasked:
            // they are not available, and count as used only when a service asked for one.
            let available = if pool.spec.avoid_buggy_ips {
                let avoided: u128 = ranges.iter().map(|r| buggy_in(r)).sum();
                let held_avoided = held.iter().filter(|ip| buggy(***ip)).count() as u128;
                total.saturating_sub(avoided + (used - held_avoided))
            } else {
                total.saturating_sub(used)
            };
            counts.push(LbFamilyCount {
                family,
                total,
                used,
                available,
            });
        }
        if let Some(status) = out.pools.get_mut(pool.name) {
            status.counts = counts;
        }
    }
}

/// The status of a Service that left LB-IPAM, if LB-IPAM's IPs and condition are still in it:
/// without them and without the operator's other condition (anyone else's kept). A status
/// without our condition was never ours (another controller's Service) and is left alone.
fn released(status: &ServiceStatus) -> Option<ServiceStatus> {
    if !status.conditions.iter().any(|c| c.kind == IP_ASSIGNED) {
        return None;
    }
    Some(ServiceStatus {
        ingress: Vec::new(),
        conditions: status
            .conditions
            .iter()
            .filter(|c| {
                ![
                    IP_ASSIGNED,
                    REACHABLE,
                    ANNOUNCED,
                    ANNOTATIONS_AGREE,
                    LABELS_ACCEPTED,
                ]
                .contains(&c.kind.as_str())
            })
            .cloned()
            .collect(),
    })
}

/// The pools that may give a service new IPs, or why none may (the pool it asks for cannot).
type Enabled<'u, 'p> = Result<Vec<&'u UsablePool<'p>>, String>;

/// The pools that may give `name` new IPs: enabled, serving it, and the one it asks for if it
/// asks for one (an error naming that pool when it cannot). Decided once per service and pass.
fn enabled_for<'p, 'u>(
    usable: &'u [UsablePool<'p>],
    name: &str,
    spec: &ServiceSpec,
) -> Enabled<'u, 'p> {
    let enabled: Vec<&UsablePool> = usable
        .iter()
        .filter(|p| !p.spec.disabled && p.spec.serves(name, spec))
        .filter(|p| spec.pool.as_deref().is_none_or(|asked| p.name == asked))
        .collect();
    match spec.pool.as_deref() {
        Some(asked) if enabled.is_empty() => Err(pool_refused(usable, name, spec, asked)),
        _ => Ok(enabled),
    }
}

/// Takes the requested `ip` for the service if an enabled pool serving it has it and it is
/// free (or shared); else says why not, naming the IP.
fn take_requested(
    enabled: &Enabled,
    usable: &[UsablePool],
    holders: &Holders,
    name: &str,
    spec: &ServiceSpec,
    ip: IpAddr,
) -> Result<(), String> {
    let enabled = enabled.as_ref().map_err(Clone::clone)?;
    if !enabled.iter().any(|p| p.contains(ip)) {
        return Err(not_served(usable, name, spec, ip));
    }
    match holders.refuses(ip, name, spec) {
        None => Ok(()),
        Some(why) => Err(format!("requested IP {why}")),
    }
}

/// Why the pool `asked` (by name) gives `service` nothing at all.
fn pool_refused(usable: &[UsablePool], service: &str, spec: &ServiceSpec, asked: &str) -> String {
    match usable.iter().find(|p| p.name == asked) {
        None => format!(
            "the service asks for pool {asked}, which does not exist or is not usable (its \
             conditions say why); fix the pool, or the annotation"
        ),
        Some(p) if p.spec.disabled => {
            format!("the service asks for pool {asked}, which is disabled (it gives no new IPs)")
        }
        Some(p) if !p.spec.serves(service, spec) => format!(
            "the service asks for pool {asked}, which does not serve it (its namespaces or \
             serviceSelector leave the service out)"
        ),
        Some(_) => format!("the service asks for pool {asked}"),
    }
}

/// Why the pools do not give `service` the IP it asked for: which pool holds it and what keeps
/// that pool from serving the service, or that none does.
fn not_served(usable: &[UsablePool], service: &str, spec: &ServiceSpec, ip: IpAddr) -> String {
    let Some(pool) = usable.iter().find(|p| p.contains(ip)) else {
        return format!("requested IP {ip} is outside every pool");
    };
    let namespace = super::resources::namespace_of(service);
    let why = if let Some(asked) = spec.pool.as_deref().filter(|asked| *asked != pool.name) {
        format!("is not pool {asked}, the one the service asks for")
    } else if pool.spec.disabled {
        "is disabled (it gives no new IPs)".to_owned()
    } else if !pool.spec.admits(namespace, &spec.namespace_labels) {
        if pool.spec.namespace_selector.matches(&spec.namespace_labels) {
            format!(
                "serves only the namespaces {}, not {namespace}",
                pool.spec.namespaces.join(", ")
            )
        } else {
            format!(
                "serves only namespaces its namespaceSelector selects, and {namespace}'s labels \
                 do not match it"
            )
        }
    } else {
        "does not select this service (its serviceSelector)".to_owned()
    };
    format!("requested IP {ip} is in pool {}, which {why}", pool.name)
}

/// A new IP of `family` for a service that asks for no IP (`take_requested` takes those): a
/// shared one, or the lowest free.
fn new_ip(
    enabled: &Enabled,
    holders: &Holders,
    name: &str,
    spec: &ServiceSpec,
    family: Family,
) -> Result<IpAddr, String> {
    let enabled = enabled.as_ref().map_err(Clone::clone)?;
    if !spec.requested_ips.is_empty() {
        // Each requested IP was tried on its own (`take_requested`); a family with none asked.
        return Err(format!("no requested IP is an {} address", family.name()));
    }
    if spec.sharing_key.is_some() {
        let shared = holders.by_ip.iter().find_map(|(ip, list)| {
            (Family::of(*ip) == family
                && list.iter().any(|(_, s)| s.sharing_key == spec.sharing_key)
                && enabled.iter().any(|p| p.contains(*ip))
                && holders.refuses(*ip, name, spec).is_none())
            .then_some(*ip)
        });
        if let Some(ip) = shared {
            return Ok(ip);
        }
    }
    // A pool the service asks for by name serves it even without autoAssign.
    let mut candidates: Vec<&&UsablePool> = enabled
        .iter()
        .filter(|p| p.has(family) && (p.spec.auto_assign || spec.pool.is_some()))
        .collect();
    // Lower priority first, pools without one after, then by name.
    candidates.sort_by_key(|p| (p.spec.priority.is_none(), p.spec.priority, p.name));
    if candidates.is_empty() {
        let asked_only: Vec<&str> = enabled
            .iter()
            .filter(|p| p.has(family) && !p.spec.auto_assign)
            .map(|p| p.name)
            .collect();
        if !asked_only.is_empty() {
            return Err(format!(
                "pool {} selects this service but hands out only the {} addresses a service \
                 asks for (autoAssign: false); ask for one of its IPs, or use a pool that \
                 assigns automatically",
                asked_only.join(", "),
                family.name()
            ));
        }
        return Err(format!(
            "no enabled pool with {} addresses selects this service; add one, or labels the \
             service a pool selects",
            family.name()
        ));
    }
    for pool in &candidates {
        for range in pool.ranges.iter().filter(|r| r.family == family) {
            let mut n = holders.search_from(range);
            loop {
                let ip = u128_to_ip(family, n);
                let avoided = pool.spec.avoid_buggy_ips && buggy(ip);
                if !avoided && !holders.by_ip.contains_key(&ip) {
                    holders.searched(range, n);
                    return Ok(ip);
                }
                if n == range.last {
                    holders.searched(range, n);
                    break;
                }
                n += 1;
            }
        }
    }
    let names: BTreeSet<&str> = candidates.iter().map(|p| p.name).collect();
    Err(format!(
        "pool {} exhausted: every {} address is assigned; add a block to it or another pool",
        names.into_iter().collect::<Vec<_>>().join(", "),
        family.name()
    ))
}
