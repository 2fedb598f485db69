//! Which node answers ARP/NDP for each Service IP. Every node computes the same answer from the
//! same inputs: the policies, the services' assigned IPs, and the nodes that are alive (their
//! leases, observed locally) with their labels and interfaces. The owner of an IP is the eligible
//! node with the highest rendezvous hash of (IP, node): when a node dies only its IPs move, and
//! no per-service object is written (one lease per node, whatever the number of services).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use super::resources::{
    L2PolicySpec, LbIpPool, ServiceSpec, ServiceStatus, TrafficPolicy, in_chosen_pool, pool_chosen,
};
use crate::{Cidr, resources::NodeInterface};

/// The nodes with a ready endpoint of each Service (`<namespace>/<name>`): a Service with
/// `externalTrafficPolicy: Local` is announced only from one of them, since kube-proxy sends
/// its traffic only to endpoints on the node it arrives at and drops it where there is none.
pub type ReadyNodes = BTreeMap<String, BTreeSet<String>>;

/// A node as the announcement decision sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub interfaces: Vec<NodeInterface>,
    /// Why the node announces nothing (its agent's verdict), if it does not.
    pub excluded: Option<String>,
    /// What on the node makes clients see other answers than the owner's.
    pub warnings: Vec<String>,
}

/// One IP to announce: who, for which service, on which of the owner's interfaces.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Announcement {
    pub ip: IpAddr,
    pub service: String,
    pub node: String,
    pub interfaces: Vec<String>,
}

/// A policy with its interface patterns compiled.
struct Policy<'a> {
    spec: &'a L2PolicySpec,
    patterns: Vec<regex_lite::Regex>,
}

impl Policy<'_> {
    fn interfaces<'n>(&self, node: &'n NodeView) -> Vec<&'n NodeInterface> {
        node.interfaces
            .iter()
            .filter(|i| {
                self.patterns.is_empty() || self.patterns.iter().any(|p| p.is_match(&i.name))
            })
            .collect()
    }
}

/// Compiles the policies' interface patterns; a bad pattern is reported with its policy.
fn compile<'a>(policies: &'a [(String, L2PolicySpec)]) -> (Vec<Policy<'a>>, Vec<(String, String)>) {
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for (name, spec) in policies {
        let compiled: Result<Vec<_>, _> = spec
            .interfaces
            .iter()
            .map(|p| regex_lite::Regex::new(&format!("^(?:{p})$")).map_err(|e| (p, e)))
            .collect();
        match compiled {
            Ok(patterns) => ok.push(Policy { spec, patterns }),
            Err((p, e)) => bad.push((
                name.clone(),
                format!("interface pattern {p:?} is not a regular expression: {e}"),
            )),
        }
    }
    (ok, bad)
}

/// The rendezvous weight of `node` for `ip`: FNV-1a over both, then a 64-bit finaliser. Fixed
/// here (not std's hasher, which may change between Rust releases) so that nodes running
/// different builds during an upgrade still agree.
pub fn weight(ip: IpAddr, node: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes: Vec<u8> = match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    for b in bytes.iter().chain([0xffu8].iter()).chain(node.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // splitmix64's finaliser spreads FNV's low-entropy high bits.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Who announces each IP among the `live` nodes. IPs no live node may announce are absent.
///
/// The LoadBalancer IPs are those of the Services LB-IPAM serves; `externalIPs` are a user's
/// own addresses, announced for a Service of any type or class (a policy opts in with
/// `externalIPs: true`), as kube-proxy serves them on every type.
///
/// A Service with `externalTrafficPolicy: Local` is announced only by a node in `ready` for
/// it; its IPs go unannounced while it has no ready endpoint on a live node.
///
/// An IP is decided once, whoever holds it: Services sharing it (a sharing key, or one
/// externalIP listed by several) get one owner, a node that may answer for every one of them
/// that a policy announces, and it answers on every interface any of them is announced on
/// there. Deciding per Service gave each its own owner when their policies or endpoints
/// differed: two MACs for one IP. With no such node the IP is not announced at all
/// (`announce_problems` says why, naming the others), rather than by two nodes.
///
/// Every external IP of `services` is taken as given: callers pass only those
/// `external::judge` admits (inside a pool serving the Service, not another Service's
/// LB-IPAM IP, no node's address, not contested across namespaces). Else a tenant could list
/// another's IP with a Service no node may answer for and silence it, or draw a gateway's
/// traffic. An IP no Service is assigned is shared by the Services listing it as above.
pub fn owners(
    policies: &[(String, L2PolicySpec)],
    pools: &[(String, LbIpPool)],
    services: &[(String, ServiceSpec, ServiceStatus)],
    ready: &ReadyNodes,
    live: &[NodeView],
) -> Vec<Announcement> {
    decide(policies, pools, services, ready, live).announced
}

/// What `decide` found: the announcements, and the shared IPs left unannounced because no node
/// may answer for all the Services holding them, with the nodes that may answer for each alone.
struct Decided {
    announced: Vec<Announcement>,
    disagreeing: BTreeMap<IpAddr, Vec<(String, Vec<String>)>>,
}

fn decide(
    policies: &[(String, L2PolicySpec)],
    pools: &[(String, LbIpPool)],
    services: &[(String, ServiceSpec, ServiceStatus)],
    ready: &ReadyNodes,
    live: &[NodeView],
) -> Decided {
    let (policies, _) = compile(policies);
    let on = OnNodes::new(&policies, live);
    // Each IP with the Services holding it (index, and whether it is one of its externalIPs).
    let mut held: BTreeMap<IpAddr, Vec<(usize, bool)>> = BTreeMap::new();
    for (i, (_, spec, status)) in services.iter().enumerate() {
        let load_balancer_ips = status.ingress.iter().filter(|_| spec.is_ours());
        let ips = load_balancer_ips
            .map(|ip| (*ip, false))
            .chain(spec.external_ips.iter().map(|ip| (*ip, true)));
        for (ip, external) in ips {
            let holders = held.entry(ip).or_default();
            // Services come in order, so one listing an IP twice is the last holder so far
            // (checking only the last keeps an externalIP listed by every Service linear).
            if holders.last().is_none_or(|(j, _)| *j != i) {
                holders.push((i, external));
            }
        }
    }
    let mut out = Decided {
        announced: Vec::new(),
        disagreeing: BTreeMap::new(),
    };
    for (ip, holders) in held {
        // What does not depend on the node is judged once per IP and Service, not per node.
        // A Service no policy announces (BGP's alone, say) is not L2's and leaves the choice
        // to the others.
        let announced: Vec<Holder> = holders
            .into_iter()
            .filter_map(|(i, external)| {
                let (name, spec, _) = &services[i];
                let serving: Vec<usize> = (0..policies.len())
                    .filter(|p| {
                        let p = policies[*p].spec;
                        p.service_selector.matches_service(name, &spec.labels)
                            && if external {
                                p.external_ips
                            } else {
                                p.load_balancer_ips
                            }
                            && in_chosen_pool(ip, &p.ip_pools, &p.ip_pool_selector, pools)
                    })
                    .collect();
                (!serving.is_empty()).then_some(Holder {
                    name,
                    serving,
                    local: spec.external_traffic_policy == TrafficPolicy::Local,
                    ready_on: ready.get(name),
                })
            })
            .collect();
        if announced.is_empty() {
            continue;
        }
        // The owner is chosen on the weights alone; its interfaces are gathered once it is
        // known (gathering them for every candidate cost most of a decision at scale).
        let best = (0..live.len())
            .filter(|n| announced.iter().all(|h| h.may_answer(&on, *n)))
            .map(|n| (weight(ip, &live[n].name), live[n].name.as_str(), n))
            .max();
        match best {
            Some((_, _, n)) => {
                let interfaces: BTreeSet<&str> = announced
                    .iter()
                    .flat_map(|h| h.interfaces(&on, n))
                    .collect();
                let interfaces: Vec<String> = interfaces.into_iter().map(str::to_owned).collect();
                for holder in &announced {
                    out.announced.push(Announcement {
                        ip,
                        service: holder.name.to_owned(),
                        node: live[n].name.clone(),
                        interfaces: interfaces.clone(),
                    });
                }
            }
            // Only on failure, so the cost of naming each Service's nodes is paid rarely.
            None if announced.len() > 1 => {
                let alone = announced
                    .iter()
                    .map(|holder| {
                        let nodes = (0..live.len())
                            .filter(|n| holder.may_answer(&on, *n))
                            .map(|n| live[n].name.clone())
                            .collect();
                        (holder.name.to_owned(), nodes)
                    })
                    .collect();
                out.disagreeing.insert(ip, alone);
            }
            None => {}
        }
    }
    out.announced.sort();
    out
}

/// The interfaces each policy announces on at each live node: empty where the node is
/// excluded, the policy does not select it, or none of its interfaces match. Worked out once
/// per decision, so the interface patterns are matched once per (policy, node), not once per
/// (IP, node).
struct OnNodes<'n> {
    /// `[policy][node]`, in the order of the compiled policies and the live nodes.
    interfaces: Vec<Vec<Vec<&'n str>>>,
    /// The live nodes' names, by index.
    names: Vec<&'n str>,
}

impl<'n> OnNodes<'n> {
    fn new(policies: &[Policy], live: &'n [NodeView]) -> Self {
        let interfaces = policies
            .iter()
            .map(|p| {
                live.iter()
                    .map(|node| {
                        if node.excluded.is_some() || !p.spec.node_selector.matches(&node.labels) {
                            return Vec::new();
                        }
                        p.interfaces(node)
                            .into_iter()
                            .map(|i| i.name.as_str())
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let names = live.iter().map(|n| n.name.as_str()).collect();
        Self { interfaces, names }
    }
}

/// A Service holding an IP that at least one policy announces.
struct Holder<'s> {
    name: &'s str,
    /// The policies that announce this IP for it, whatever the node (indices of the compiled
    /// policies).
    serving: Vec<usize>,
    /// Whether it has `externalTrafficPolicy: Local`: then only a node in `ready_on`, with
    /// a ready endpoint of it, may answer.
    local: bool,
    ready_on: Option<&'s BTreeSet<String>>,
}

impl Holder<'_> {
    /// Whether live node `n` may answer for this Service: not excluded, an endpoint there
    /// under `Local`, and a policy serving it that selects the node with a matching interface.
    fn may_answer(&self, on: &OnNodes, n: usize) -> bool {
        let endpoint_there = !self.local || self.ready_on.is_some_and(|r| r.contains(on.names[n]));
        endpoint_there
            && self
                .serving
                .iter()
                .any(|p| !on.interfaces[*p][n].is_empty())
    }

    /// The interfaces on which live node `n` answers for this Service (none when it may not).
    fn interfaces<'n>(&self, on: &OnNodes<'n>, n: usize) -> impl Iterator<Item = &'n str> {
        self.serving
            .iter()
            .flat_map(move |p| on.interfaces[*p][n].iter().copied())
    }
}

/// For each service with a LoadBalancer IP: why the L2 announcement of its IPs fails or may
/// mislead clients, judged over all `nodes` alive or not; absent when it is fine. No node may
/// answer (every candidate excluded, or none selected by a policy with a matching interface:
/// MetalLB's silent failure when every node carries the exclusion label), or a node reports a
/// problem that makes its kernel answer too (kube-proxy's IPVS mode without strictARP). A
/// Service with `externalTrafficPolicy: Local` and no ready endpoint on a node that may answer
/// is told so (Cilium and MetalLB stay silent then). External IPs refused are told by
/// `external::ExternalIps::problems`; `services` are the admitted ones, as for `owners`.
pub fn announce_problems(
    policies: &[(String, L2PolicySpec)],
    pools: &[(String, LbIpPool)],
    services: &[(String, ServiceSpec, ServiceStatus)],
    ready: &ReadyNodes,
    nodes: &[NodeView],
) -> BTreeMap<String, String> {
    let decided = decide(policies, pools, services, ready, nodes);
    let announced: BTreeSet<(IpAddr, &str)> = decided
        .announced
        .iter()
        .map(|a| (a.ip, a.service.as_str()))
        .collect();
    let excluded: Vec<String> = nodes
        .iter()
        .filter_map(|n| n.excluded.as_ref().map(|why| format!("{} ({why})", n.name)))
        .collect();
    let warnings: Vec<String> = nodes
        .iter()
        .flat_map(|n| {
            n.warnings
                .iter()
                .map(move |w| format!("node {}: {w}", n.name))
        })
        .collect();
    let mut out = BTreeMap::new();
    for (name, spec, status) in services {
        if !spec.is_ours() {
            continue;
        }
        let unanswered = status
            .ingress
            .iter()
            .find(|ip| !announced.contains(&(**ip, name.as_str())));
        let local = spec.external_traffic_policy == TrafficPolicy::Local;
        let ready_on: Vec<&str> = ready
            .get(name)
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        // A shared IP no node may answer for although this Service alone could be answered.
        let disagreeing = unanswered.and_then(|ip| {
            let alone = decided.disagreeing.get(ip)?;
            let mine = alone.iter().find(|(s, _)| s == name)?;
            (!mine.1.is_empty()).then_some((ip, alone))
        });
        let problem = match unanswered {
            Some(_) if let Some((ip, alone)) = disagreeing => {
                shared_without_owner(*ip, name, alone)
            }
            Some(ip) if local && ready_on.is_empty() => format!(
                "no node may answer for {ip}: the service has externalTrafficPolicy Local and no \
                 ready endpoint on any node (kube-proxy would drop its traffic everywhere); it \
                 is announced as soon as one of its pods is ready"
            ),
            Some(ip) if local => format!(
                "no node may answer for {ip}: the service has externalTrafficPolicy Local, so \
                 only the nodes with a ready endpoint ({}) may, and none of them is both \
                 allowed to announce and selected by an L2AnnouncementPolicy that matches the \
                 service and one of its interfaces{}",
                ready_on.join(", "),
                if excluded.is_empty() {
                    String::new()
                } else {
                    format!(" (excluded: {})", excluded.join(", "))
                }
            ),
            Some(ip) if excluded.is_empty() => format!(
                "no node may answer for {ip}: none of the {} node(s) is selected by an \
                 L2AnnouncementPolicy that matches the service and one of the node's interfaces",
                nodes.len()
            ),
            Some(ip) => format!(
                "no node may answer for {ip}: {} excluded ({}); the others are not selected by \
                 an L2AnnouncementPolicy that matches the service and one of their interfaces",
                excluded.len(),
                excluded.join(", ")
            ),
            None if !warnings.is_empty() && !status.ingress.is_empty() => warnings.join("; "),
            None => continue,
        };
        out.insert(name.clone(), problem);
    }
    out
}

/// Why `service`'s shared `ip` is not announced: no node may answer for every Service holding
/// it (`alone`: each with the nodes that may answer for it alone). One IP has one owner on its
/// segment, so rather than two nodes answering (two MACs for one IP), none does.
fn shared_without_owner(ip: IpAddr, service: &str, alone: &[(String, Vec<String>)]) -> String {
    // A few names are enough to see the disagreement; thousands would drown the message.
    const SHOWN: usize = 5;
    let names = |nodes: &[String]| match nodes.len() {
        0 => "no node (its own Announced condition says why)".to_owned(),
        n if n <= SHOWN => nodes.join(", "),
        n => format!("{} and {} more", nodes[..SHOWN].join(", "), n - SHOWN),
    };
    let others: Vec<&str> = alone
        .iter()
        .filter(|(s, _)| s != service)
        .map(|(s, _)| s.as_str())
        .collect();
    let each: Vec<String> = alone
        .iter()
        .map(|(s, nodes)| format!("{s} from {}", names(nodes)))
        .collect();
    format!(
        "no node may answer for {ip}: it is shared with service {}, and one IP is answered by \
         one node, which must be allowed to answer for every Service holding it; none is \
         (each alone may be answered: {}). Make the L2AnnouncementPolicies that select these \
         Services select at least one node in common with a matching interface (with \
         externalTrafficPolicy Local, that node must also run a ready endpoint of each), or \
         stop sharing the IP",
        others.join(", "),
        each.join("; ")
    )
}

/// Pools whose addresses lie outside the subnet of every interface a policy that may announce
/// them announces on (the seed's silently unreachable pool), with the warning to show; and
/// policies with a bad interface pattern. A policy that chooses pools (`ipPools`,
/// `ipPoolSelector`) counts only for those. Judged over all nodes, alive or not.
pub fn unreachable_pools(
    pools: &[(String, LbIpPool)],
    policies: &[(String, L2PolicySpec)],
    nodes: &[NodeView],
) -> (BTreeMap<String, String>, Vec<(String, String)>) {
    let (compiled, bad) = compile(policies);
    // Each node's subnets each policy announces on, found once (interface patterns, subnets)
    // and shared by every pool: in node order, then policy order.
    let reach: Vec<(&Policy, Vec<(Cidr, String)>)> = nodes
        .iter()
        .flat_map(|node| {
            compiled
                .iter()
                .filter(|p| p.spec.node_selector.matches(&node.labels))
                .map(move |p| {
                    let on = p
                        .interfaces(node)
                        .into_iter()
                        .flat_map(|i| {
                            i.subnets()
                                .map(move |s| (s, format!("{} on {}", i.name, node.name)))
                        })
                        .collect();
                    (p, on)
                })
        })
        .collect();
    let mut out = BTreeMap::new();
    for (name, pool) in pools {
        // A pool no policy announces is not L2's to judge (BGP may advertise it).
        let chosen =
            |p: &Policy| pool_chosen(name, pool, &p.spec.ip_pools, &p.spec.ip_pool_selector);
        if !compiled.iter().any(chosen) {
            continue;
        }
        let mut subnets: BTreeMap<Cidr, Vec<String>> = BTreeMap::new();
        for (_, on) in reach.iter().filter(|(p, _)| chosen(p)) {
            for (s, where_) in on {
                subnets.entry(*s).or_default().push(where_.clone());
            }
        }
        if let Some(why) = outside_every_subnet(pool, &subnets) {
            out.insert(name.clone(), why);
        }
    }
    (out, bad)
}

/// Why the pool's addresses outside every subnet in `subnets` (with where each is announced)
/// will not be reached; `None` when every block is inside one.
fn outside_every_subnet(pool: &LbIpPool, subnets: &BTreeMap<Cidr, Vec<String>>) -> Option<String> {
    let mut outside = Vec::new();
    for block in &pool.spec.blocks {
        let Some((family, first, last)) = block.bounds() else {
            continue;
        };
        let (first, last) = (
            crate::cidr::u128_to_ip(family, first),
            crate::cidr::u128_to_ip(family, last),
        );
        let inside = subnets
            .keys()
            .any(|s| s.contains(first) && s.contains(last));
        if !inside {
            outside.push(format!("{first}-{last}"));
        }
    }
    if outside.is_empty() {
        return None;
    }
    let announced: Vec<String> = subnets
        .iter()
        .map(|(s, on)| format!("{s} ({})", on.join(", ")))
        .collect();
    Some(format!(
        "addresses {} are outside the subnet of every interface an L2 announcement policy \
         announces them on ({}): clients on those links will not reach them; use a range \
         inside one of those subnets",
        outside.join(", "),
        if announced.is_empty() {
            "none".to_owned()
        } else {
            announced.join("; ")
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        Family,
        lb::resources::{IpFamilyPolicy, LbIpBlock, LbIpPoolSpec, ServiceType},
        meta::Selector,
    };

    fn node(name: &str, zone: &str, ifaces: &[(&str, &str)]) -> NodeView {
        NodeView {
            name: name.into(),
            labels: [("zone".to_owned(), zone.to_owned())].into(),
            interfaces: ifaces
                .iter()
                .map(|(n, a)| NodeInterface {
                    name: (*n).into(),
                    addresses: vec![(*a).into()],
                    mac: None,
                })
                .collect(),
            excluded: None,
            warnings: Vec::new(),
        }
    }

    fn none() -> ReadyNodes {
        ReadyNodes::new()
    }

    fn policy(zone: Option<&str>, interfaces: &[&str]) -> (String, L2PolicySpec) {
        let mut node_selector = Selector::default();
        if let Some(z) = zone {
            node_selector.match_labels.insert("zone".into(), z.into());
        }
        (
            "p".into(),
            L2PolicySpec {
                node_selector,
                service_selector: Selector::default(),
                ip_pools: Vec::new(),
                ip_pool_selector: Selector::default(),
                interfaces: interfaces.iter().map(|s| (*s).to_owned()).collect(),
                load_balancer_ips: true,
                external_ips: false,
            },
        )
    }

    fn services(n: usize, family: Family) -> Vec<(String, ServiceSpec, ServiceStatus)> {
        (0..n)
            .map(|i| {
                let ip: IpAddr = match family {
                    Family::V4 => format!("10.77.0.{}", 100 + i % 150).parse().unwrap(),
                    Family::V6 => format!("fd77::{:x}", 0x100 + i).parse().unwrap(),
                };
                (
                    format!("ns/s{i}"),
                    ServiceSpec {
                        service_type: ServiceType::LoadBalancer,
                        labels: Default::default(),
                        ports: vec![],
                        load_balancer_class: None,
                        requested_ips: vec![],
                        sharing_key: None,
                        ip_families: vec![family],
                        ip_family_policy: IpFamilyPolicy::SingleStack,
                        external_ips: vec![],
                        external_traffic_policy: Default::default(),
                        selector: Default::default(),
                        conflict: None,
                        sharing_cross_namespace: Vec::new(),
                        pool: None,
                        namespace_labels: Default::default(),
                    },
                    ServiceStatus {
                        ingress: vec![ip],
                        conditions: vec![],
                    },
                )
            })
            .collect()
    }

    #[test]
    fn one_owner_per_ip_spread_and_only_the_dead_nodes_ips_move() {
        for family in [Family::V4, Family::V6] {
            let nodes: Vec<NodeView> = (0..3)
                .map(|i| node(&format!("n{i}"), "a", &[("eth0", "10.77.0.1/24")]))
                .collect();
            let svcs = services(150, family);
            let all = owners(&[policy(None, &["eth.*"])], &[], &svcs, &none(), &nodes);
            assert_eq!(all.len(), 150);
            let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
            for a in &all {
                *per_node.entry(a.node.as_str()).or_default() += 1;
                assert_eq!(a.interfaces, ["eth0"]);
            }
            assert!(per_node.values().all(|n| *n > 30), "{per_node:?}");
            // n1 dies: exactly its IPs move, each to a survivor.
            let survivors = [nodes[0].clone(), nodes[2].clone()];
            let after = owners(&[policy(None, &["eth.*"])], &[], &svcs, &none(), &survivors);
            for (before, now) in all.iter().zip(&after) {
                assert_eq!(before.ip, now.ip);
                if before.node == "n1" {
                    assert_ne!(now.node, "n1");
                } else {
                    assert_eq!(before.node, now.node, "{} moved needlessly", before.ip);
                }
            }
        }
    }

    /// A policy for one tenant's Services (by the derived namespace label) does not announce
    /// the IP of another tenant's Service that carries that label itself, in either family.
    #[test]
    fn a_service_claiming_another_namespace_by_label_is_not_announced_for_it() {
        for family in [Family::V4, Family::V6] {
            let nodes = [node("a", "east", &[("eth0", "10.77.0.1/24")])];
            let mut tenant = policy(None, &[]);
            tenant.1.service_selector.match_labels.insert(
                crate::lb::resources::SERVICE_NAMESPACE_LABEL.into(),
                "tenant-one".into(),
            );
            let mut svcs = services(2, family);
            svcs[0].0 = "tenant-two/web".into();
            svcs[0].1.labels.insert(
                crate::lb::resources::SERVICE_NAMESPACE_LABEL.into(),
                "tenant-one".into(),
            );
            svcs[1].0 = "tenant-one/web".into();
            let announced = owners(&[tenant], &[], &svcs, &none(), &nodes);
            let ips: Vec<IpAddr> = announced.iter().map(|a| a.ip).collect();
            assert_eq!(ips, svcs[1].2.ingress, "{family:?}: {announced:?}");
        }
    }

    #[test]
    fn node_selector_and_interface_patterns_decide_who_may_announce() {
        let nodes = [
            node("a", "east", &[("eth0", "10.77.0.1/24")]),
            node("b", "west", &[("eth0", "10.77.0.2/24")]),
            node("c", "east", &[("bond0", "10.77.0.3/24")]),
        ];
        let svcs = services(20, Family::V4);
        let owners = owners(
            &[policy(Some("east"), &["eth[0-9]+"])],
            &[],
            &svcs,
            &none(),
            &nodes,
        );
        assert!(owners.iter().all(|a| a.node == "a"), "{owners:?}");
        let nobody = super::owners(&[policy(Some("north"), &[])], &[], &svcs, &none(), &nodes);
        assert!(nobody.is_empty());
    }

    /// externalIPs are announced for a Service of every type and class once a policy opts in;
    /// the LoadBalancer IPs only for the Services LB-IPAM serves. In v4 and v6.
    #[test]
    fn external_ips_are_announced_on_every_service_type_load_balancer_ips_only_on_ours() {
        for (family, external, foreign) in [
            (Family::V4, "192.0.2.7", "10.77.0.250"),
            (Family::V6, "2001:db8::7", "fd77::250"),
        ] {
            let nodes = [node("a", "east", &[("eth0", "10.77.0.1/24")])];
            let mut with_external = policy(None, &[]);
            with_external.1.external_ips = true;
            let mut svcs = services(4, family);
            let ip: IpAddr = external.parse().unwrap();
            svcs[0].1.service_type = ServiceType::ClusterIP;
            svcs[1].1.service_type = ServiceType::NodePort;
            svcs[2].1.load_balancer_class = Some("other.example/lb".into());
            for s in &mut svcs[..3] {
                s.1.external_ips = vec![ip];
                // A status this project did not write: not announced.
                s.2.ingress = vec![foreign.parse().unwrap()];
            }
            let got = owners(&[with_external.clone()], &[], &svcs, &none(), &nodes);
            let announced: BTreeSet<(IpAddr, &str)> =
                got.iter().map(|a| (a.ip, a.service.as_str())).collect();
            let expected = BTreeSet::from([
                (ip, "ns/s0"),
                (ip, "ns/s1"),
                (ip, "ns/s2"),
                (svcs[3].2.ingress[0], "ns/s3"),
            ]);
            assert_eq!(announced, expected, "{family:?}");
            // Without the policy's opt-in, only the LoadBalancer IP.
            let got = owners(&[policy(None, &[])], &[], &svcs, &none(), &nodes);
            assert_eq!(got.len(), 1, "{got:?}");
            assert_eq!(got[0].service, "ns/s3");
        }
    }

    /// An excluded node owns nothing, whatever its weight; its IPs go to the next node, and
    /// the others keep theirs. In v4 and v6.
    #[test]
    fn an_excluded_node_owns_nothing_and_only_its_ips_move() {
        for family in [Family::V4, Family::V6] {
            let mut nodes: Vec<NodeView> = (0..3)
                .map(|i| node(&format!("n{i}"), "a", &[("eth0", "10.77.0.1/24")]))
                .collect();
            let svcs = services(60, family);
            let policies = [policy(None, &[])];
            let before = owners(&policies, &[], &svcs, &none(), &nodes);
            nodes[1].excluded = Some("cordoned".into());
            let after = owners(&policies, &[], &svcs, &none(), &nodes);
            assert_eq!(after.len(), 60);
            for (b, a) in before.iter().zip(&after) {
                assert_ne!(a.node, "n1");
                if b.node != "n1" {
                    assert_eq!(a.node, b.node, "{} moved needlessly", a.ip);
                }
            }
        }
    }

    /// The silent failure made loud: a service no node may answer for says why, naming the
    /// excluded nodes; a node's warning reaches every service; a service that is fine has none.
    #[test]
    fn a_service_no_node_may_announce_says_why() {
        for family in [Family::V4, Family::V6] {
            let mut nodes = vec![
                node("a", "east", &[("eth0", "10.77.0.1/24")]),
                node("b", "west", &[("eth0", "10.77.0.2/24")]),
            ];
            let svcs = services(2, family);
            let policies = [policy(Some("east"), &[])];
            assert!(announce_problems(&policies, &[], &svcs, &none(), &nodes).is_empty());
            nodes[0].excluded =
                Some("label node.kubernetes.io/exclude-from-external-load-balancers".into());
            let problems = announce_problems(&policies, &[], &svcs, &none(), &nodes);
            assert_eq!(problems.len(), 2);
            let p = &problems["ns/s0"];
            assert!(
                p.contains("no node may answer")
                    && p.contains("a (label node.kubernetes.io/exclude"),
                "{p}"
            );
            nodes[0].excluded = None;
            nodes[1].warnings = vec!["kube-proxy IPVS without strictARP".into()];
            let problems = announce_problems(&policies, &[], &svcs, &none(), &nodes);
            assert!(
                problems["ns/s1"].starts_with("node b: kube-proxy IPVS"),
                "{problems:?}"
            );
            let nobody =
                announce_problems(&[policy(Some("north"), &[])], &[], &svcs, &none(), &nodes);
            assert!(
                nobody["ns/s0"].contains("none of the 2 node(s)"),
                "{nobody:?}"
            );
        }
    }

    /// externalTrafficPolicy Local: only a node with a ready endpoint answers, the best of
    /// them by weight; the endpoint moving moves the IP; none anywhere leaves it unannounced,
    /// and the problem says which case it is. Cluster services ignore endpoints. In v4 and v6.
    #[test]
    fn local_traffic_policy_announces_only_from_nodes_with_a_ready_endpoint() {
        for family in [Family::V4, Family::V6] {
            let mut nodes: Vec<NodeView> = (0..3)
                .map(|i| node(&format!("n{i}"), "a", &[("eth0", "10.77.0.1/24")]))
                .collect();
            let mut svcs = services(40, family);
            for s in &mut svcs[..20] {
                s.1.external_traffic_policy = TrafficPolicy::Local;
            }
            let policies = [policy(None, &[])];
            let on = |names: &[&str]| -> ReadyNodes {
                svcs.iter()
                    .map(|s| {
                        let nodes = names.iter().map(|n| (*n).to_owned()).collect();
                        (s.0.clone(), nodes)
                    })
                    .collect()
            };
            let cluster_owners = |got: &[Announcement]| -> Vec<(IpAddr, String)> {
                got.iter()
                    .filter(|a| svcs[20..].iter().any(|s| s.0 == a.service))
                    .map(|a| (a.ip, a.node.clone()))
                    .collect()
            };
            let unconstrained = owners(&policies, &[], &svcs, &none(), &nodes);
            let is_local = |a: &&Announcement| svcs[..20].iter().any(|s| s.0 == a.service);

            let got = owners(&policies, &[], &svcs, &on(&["n1"]), &nodes);
            assert!(
                got.iter().filter(is_local).all(|a| a.node == "n1"),
                "{got:?}"
            );
            assert_eq!(got.iter().filter(is_local).count(), 20);
            assert_eq!(cluster_owners(&got), cluster_owners(&unconstrained));

            // Endpoints on two nodes: each IP goes to the heavier of the two.
            let got = owners(&policies, &[], &svcs, &on(&["n0", "n2"]), &nodes);
            for a in got.iter().filter(is_local) {
                let best = ["n0", "n2"]
                    .into_iter()
                    .max_by_key(|n| (weight(a.ip, n), *n))
                    .unwrap();
                assert_eq!(a.node, best, "{}", a.ip);
            }

            // The endpoint moves to n2: every Local IP follows it.
            let got = owners(&policies, &[], &svcs, &on(&["n2"]), &nodes);
            assert!(got.iter().filter(is_local).all(|a| a.node == "n2"));

            // An endpoint on an excluded node does not make it announce.
            nodes[2].excluded = Some("cordoned".into());
            let got = owners(&policies, &[], &svcs, &on(&["n2"]), &nodes);
            assert_eq!(got.iter().filter(is_local).count(), 0, "{got:?}");
            let problems = announce_problems(&policies, &[], &svcs, &on(&["n2"]), &nodes);
            let p = &problems["ns/s0"];
            assert!(
                p.contains("externalTrafficPolicy Local")
                    && p.contains("(n2)")
                    && p.contains("excluded: n2 (cordoned)"),
                "{p}"
            );
            nodes[2].excluded = None;

            // No ready endpoint anywhere: unannounced, and the Service is told why.
            let got = owners(&policies, &[], &svcs, &none(), &nodes);
            assert_eq!(got.iter().filter(is_local).count(), 0);
            let problems = announce_problems(&policies, &[], &svcs, &none(), &nodes);
            assert_eq!(problems.len(), 20, "{problems:?}");
            assert!(
                problems["ns/s3"].contains("no ready endpoint on any node"),
                "{problems:?}"
            );
            assert!(!problems.contains_key("ns/s25"));
        }
    }

    #[test]
    fn a_pool_outside_every_announced_subnet_is_flagged() {
        let nodes = [node("a", "east", &[("eth0", "10.77.0.1/24")])];
        let pool = |cidr: &str| LbIpPool {
            labels: BTreeMap::new(),
            spec: LbIpPoolSpec {
                blocks: vec![LbIpBlock {
                    cidr: Some(cidr.into()),
                    ..Default::default()
                }],
                ..LbIpPoolSpec::default()
            },
            status: Default::default(),
        };
        let pools = [
            ("inside".to_owned(), pool("10.77.0.192/27")),
            ("outside".to_owned(), pool("172.18.250.0/24")),
        ];
        let (flagged, bad) = unreachable_pools(&pools, &[policy(None, &["eth0"])], &nodes);
        assert!(bad.is_empty());
        assert_eq!(flagged.keys().collect::<Vec<_>>(), ["outside"]);
        let m = &flagged["outside"];
        assert!(
            m.contains("172.18.250.0-172.18.250.255") && m.contains("10.77.0.0/24 (eth0 on a)"),
            "{m}"
        );
        let (_, bad) = unreachable_pools(&pools, &[policy(None, &["eth("])], &nodes);
        assert!(bad[0].1.contains("eth("), "{bad:?}");
    }

    /// A pool of `first..=last` (strings), with `labels`.
    fn ranged(first: &str, last: &str, labels: &[(&str, &str)]) -> LbIpPool {
        LbIpPool {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            spec: LbIpPoolSpec {
                blocks: vec![LbIpBlock {
                    start: Some(first.into()),
                    stop: Some(last.into()),
                    ..Default::default()
                }],
                ..LbIpPoolSpec::default()
            },
            status: Default::default(),
        }
    }

    /// Two pools on two segments: a policy per segment chooses its pool, one by name, one by
    /// the pool's labels; each IP is announced on its own segment's interface only, and an IP
    /// in neither pool by neither policy. In v4 and v6.
    #[test]
    fn a_policy_that_chooses_pools_announces_only_their_ips() {
        for (family, [low, mid, high, end]) in [
            (
                Family::V4,
                ["10.77.0.100", "10.77.0.104", "10.77.0.105", "10.77.0.109"],
            ),
            (
                Family::V6,
                ["fd77::100", "fd77::104", "fd77::105", "fd77::109"],
            ),
        ] {
            let pools = [
                ("core".to_owned(), ranged(low, mid, &[])),
                ("edge".to_owned(), ranged(high, end, &[("segment", "edge")])),
            ];
            let nodes = [node(
                "n0",
                "a",
                &[("eth0", "10.77.0.1/24"), ("eth1", "10.79.0.1/24")],
            )];
            let (_, mut by_name) = policy(None, &["eth0"]);
            by_name.ip_pools = vec!["core".into()];
            let (_, mut by_label) = policy(None, &["eth1"]);
            by_label.ip_pool_selector.match_labels =
                [("segment".to_owned(), "edge".to_owned())].into();
            let policies = [("core".to_owned(), by_name), ("edge".to_owned(), by_label)];
            // s0-s4 in core, s5-s9 in edge, s10 in no pool.
            let svcs = services(11, family);
            let got = owners(&policies, &pools, &svcs, &none(), &nodes);
            assert_eq!(got.len(), 10, "{got:?}");
            for a in &got {
                let wanted = if pools[0].1.spec.contains(a.ip) {
                    "eth0"
                } else {
                    "eth1"
                };
                assert_eq!(a.interfaces, [wanted], "{a:?}");
            }
            assert!(!got.iter().any(|a| a.service == "ns/s10"));
            // The pool filters and the service selector must all pass.
            let mut policies = policies;
            policies[1].1.service_selector.match_labels =
                [("app".to_owned(), "none".to_owned())].into();
            let got = owners(&policies, &pools, &svcs, &none(), &nodes);
            assert!(got.iter().all(|a| a.interfaces == ["eth0"]), "{got:?}");
        }
    }

    /// A pool is judged only by the policies that announce it: edge's range lies outside
    /// eth0's subnet, the only interface of the policy that chooses it, and is flagged even
    /// though another policy's eth1 holds it; a pool no policy chooses is not judged.
    #[test]
    fn a_pool_is_judged_by_the_policies_that_choose_it() {
        let nodes = [node(
            "n0",
            "a",
            &[("eth0", "10.77.0.1/24"), ("eth1", "10.79.0.1/24")],
        )];
        let pools = [
            ("edge".to_owned(), ranged("10.79.0.10", "10.79.0.20", &[])),
            (
                "bgp-only".to_owned(),
                ranged("198.51.100.1", "198.51.100.9", &[]),
            ),
        ];
        let (_, mut wrong) = policy(None, &["eth0"]);
        wrong.ip_pools = vec!["edge".into()];
        let (_, mut other) = policy(None, &["eth1"]);
        other.ip_pools = vec!["elsewhere".into()];
        let policies = [("wrong".to_owned(), wrong), ("other".to_owned(), other)];
        let (flagged, _) = unreachable_pools(&pools, &policies, &nodes);
        assert_eq!(flagged.keys().collect::<Vec<_>>(), ["edge"]);
        assert!(
            flagged["edge"].contains("10.77.0.0/24 (eth0 on n0)"),
            "{flagged:?}"
        );
    }

    /// Policies and Services.
    type Rows = (
        Vec<(String, L2PolicySpec)>,
        Vec<(String, ServiceSpec, ServiceStatus)>,
    );

    /// Two Services sharing each IP (s{2k} and s{2k+1}), `a` selected by the policy of the
    /// nodes labelled `a` on eth0, `b` by that of the nodes labelled `b` on eth1.
    fn shared_on_two_policies(family: Family, pairs: usize) -> Rows {
        let mut svcs = services(2 * pairs, family);
        for (i, s) in svcs.iter_mut().enumerate() {
            let team = if i % 2 == 0 { "a" } else { "b" };
            s.1.labels.insert("team".into(), team.into());
            s.1.sharing_key = Some(format!("key{}", i / 2));
        }
        for i in 0..pairs {
            svcs[2 * i + 1].2.ingress = svcs[2 * i].2.ingress.clone();
        }
        let policies = ["a", "b"]
            .into_iter()
            .zip(["eth0", "eth1"])
            .map(|(team, iface)| {
                let (_, mut spec) = policy(None, &[iface]);
                spec.node_selector = Selector::default();
                spec.node_selector
                    .match_labels
                    .insert(team.into(), "yes".into());
                spec.service_selector
                    .match_labels
                    .insert("team".into(), team.into());
                (team.to_owned(), spec)
            })
            .collect();
        (policies, svcs)
    }

    /// A node with labels `teams` (each `<team>: yes`) and interfaces eth0 and eth1.
    fn team_node(name: &str, teams: &[&str]) -> NodeView {
        let mut n = node(
            name,
            "z",
            &[("eth0", "10.77.0.1/24"), ("eth1", "10.79.0.1/24")],
        );
        n.labels = teams
            .iter()
            .map(|t| ((*t).to_owned(), "yes".to_owned()))
            .collect();
        n
    }

    /// For each IP, the nodes announcing it.
    fn owners_by_ip(got: &[Announcement]) -> BTreeMap<IpAddr, BTreeSet<&str>> {
        let mut by_ip: BTreeMap<IpAddr, BTreeSet<&str>> = BTreeMap::new();
        for a in got {
            by_ip.entry(a.ip).or_default().insert(a.node.as_str());
        }
        by_ip
    }

    /// Services sharing an IP on two policies with other node selectors and interfaces: one
    /// owner per IP, a node both policies select, answering on both policies' interfaces;
    /// without such a node the IP is announced by none (never by two), and each Service is
    /// told which other Service it shares with and what to do. In v4 and v6.
    #[test]
    fn services_sharing_an_ip_on_two_policies_get_one_owner_for_it() {
        for family in [Family::V4, Family::V6] {
            let (policies, svcs) = shared_on_two_policies(family, 20);
            let nodes = [
                team_node("only-a", &["a"]),
                team_node("only-b", &["b"]),
                team_node("both", &["a", "b"]),
                team_node("both-too", &["a", "b"]),
            ];
            let got = owners(&policies, &[], &svcs, &none(), &nodes);
            assert_eq!(
                got.len(),
                40,
                "{family:?}: every Service announced: {got:?}"
            );
            for (ip, on) in owners_by_ip(&got) {
                assert_eq!(on.len(), 1, "{family:?}: {ip} has owners {on:?}");
                assert!(on.iter().all(|n| n.starts_with("both")), "{ip}: {on:?}");
            }
            assert!(
                got.iter().all(|a| a.interfaces == ["eth0", "eth1"]),
                "{got:?}"
            );
            // The owner is the heavier of the nodes both select: a node either policy alone
            // selects never answers, whatever its weight.
            for a in &got {
                let best = ["both", "both-too"]
                    .into_iter()
                    .max_by_key(|n| (weight(a.ip, n), *n))
                    .unwrap();
                assert_eq!(a.node, best, "{a:?}");
            }
            assert!(announce_problems(&policies, &[], &svcs, &none(), &nodes).is_empty());

            // No node both policies select: nobody answers, and both Services say why.
            let apart = [team_node("only-a", &["a"]), team_node("only-b", &["b"])];
            let got = owners(&policies, &[], &svcs, &none(), &apart);
            assert!(got.is_empty(), "{family:?}: two owners or one: {got:?}");
            let problems = announce_problems(&policies, &[], &svcs, &none(), &apart);
            assert_eq!(problems.len(), 40, "{problems:?}");
            let p = &problems["ns/s0"];
            assert!(
                p.contains("shared with service ns/s1")
                    && p.contains("ns/s0 from only-a; ns/s1 from only-b")
                    && p.contains("select at least one node in common")
                    && p.contains("stop sharing"),
                "{p}"
            );
            assert!(
                problems["ns/s1"].contains("shared with service ns/s0"),
                "{problems:?}"
            );
        }
    }

    /// Services sharing an IP with externalTrafficPolicy Local whose ready endpoints differ
    /// (one moved before the other): the owner has an endpoint of both; with no such node,
    /// nobody answers. A shared IP whose Services agree keeps the owner it would have alone, so
    /// this costs no move. In v4 and v6.
    #[test]
    fn shared_local_services_are_announced_only_where_both_have_an_endpoint() {
        for family in [Family::V4, Family::V6] {
            let nodes: Vec<NodeView> = (0..4)
                .map(|i| node(&format!("n{i}"), "a", &[("eth0", "10.77.0.1/24")]))
                .collect();
            let pairs = 20;
            let mut svcs = services(2 * pairs, family);
            for i in 0..pairs {
                svcs[2 * i + 1].2.ingress = svcs[2 * i].2.ingress.clone();
            }
            for s in &mut svcs {
                s.1.external_traffic_policy = TrafficPolicy::Local;
            }
            let policies = [policy(None, &[])];
            let ready = |even: &[&str], odd: &[&str]| -> ReadyNodes {
                svcs.iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let on = if i % 2 == 0 { even } else { odd };
                        (s.0.clone(), on.iter().map(|n| (*n).to_owned()).collect())
                    })
                    .collect()
            };
            let got = owners(
                &policies,
                &[],
                &svcs,
                &ready(&["n0", "n2"], &["n1", "n2"]),
                &nodes,
            );
            assert_eq!(got.len(), 40, "{got:?}");
            assert!(got.iter().all(|a| a.node == "n2"), "{family:?}: {got:?}");

            let got = owners(&policies, &[], &svcs, &ready(&["n0"], &["n1"]), &nodes);
            assert!(got.is_empty(), "{family:?}: {got:?}");
            let problems =
                announce_problems(&policies, &[], &svcs, &ready(&["n0"], &["n1"]), &nodes);
            assert!(
                problems["ns/s2"].contains("shared with service ns/s3")
                    && problems["ns/s2"].contains("ns/s2 from n0; ns/s3 from n1"),
                "{problems:?}"
            );

            // Agreeing Services: the owner each IP has when one Service holds it.
            let all = ["n0", "n1", "n2", "n3"];
            let shared = owners(&policies, &[], &svcs, &ready(&all, &all), &nodes);
            let alone: Vec<_> = svcs.iter().step_by(2).cloned().collect();
            let single = owners(&policies, &[], &alone, &ready(&all, &all), &nodes);
            let of = |got: &[Announcement]| -> BTreeMap<IpAddr, String> {
                got.iter().map(|a| (a.ip, a.node.clone())).collect()
            };
            assert_eq!(of(&shared), of(&single));
        }
    }

    /// A Service no L2 policy announces (BGP's alone, say) does not stop the one sharing its
    /// IP from being announced; it is still reported unannounced itself.
    #[test]
    fn a_sharing_service_no_policy_announces_leaves_the_ip_to_the_others() {
        let (mut policies, svcs) = shared_on_two_policies(Family::V4, 5);
        policies.truncate(1);
        let nodes = [team_node("only-a", &["a"]), team_node("only-b", &["b"])];
        let got = owners(&policies, &[], &svcs, &none(), &nodes);
        assert_eq!(got.len(), 5, "{got:?}");
        assert!(
            got.iter()
                .all(|a| a.node == "only-a" && a.service.ends_with(['0', '2', '4', '6', '8']))
        );
        let problems = announce_problems(&policies, &[], &svcs, &none(), &nodes);
        assert!(
            problems["ns/s1"].contains("none of the 2 node(s)"),
            "{problems:?}"
        );
    }

    /// A tenant's Service listing another's assigned IP in `externalIPs` (the policy announces
    /// externalIPs) with no node that may answer for it (Local with no endpoint, or labels that
    /// pick a policy on other nodes only) leaves that IP the owner it has alone, is not
    /// announced for it, and is told why, whatever its type: the decision runs on what
    /// `external::judge` admits, as the agents and the operator run it. In v4 and v6.
    #[test]
    fn another_services_assigned_ip_in_external_ips_does_not_move_its_owner() {
        for family in [Family::V4, Family::V6] {
            let nodes: Vec<NodeView> = (0..4)
                .map(|i| node(&format!("n{i}"), "a", &[("eth0", "10.77.0.1/24")]))
                .collect();
            let mut everywhere = policy(None, &[]);
            everywhere.1.external_ips = true;
            // Another policy, on nodes that do not exist, for Services labelled `elsewhere`.
            let mut elsewhere = policy(Some("nowhere"), &[]);
            elsewhere.0 = "elsewhere".into();
            elsewhere.1.external_ips = true;
            elsewhere
                .1
                .service_selector
                .match_labels
                .insert("elsewhere".into(), "yes".into());
            everywhere.1.service_selector.match_expressions.push(
                crate::meta::SelectorRequirement {
                    key: "elsewhere".into(),
                    operator: crate::meta::SelectorOperator::DoesNotExist,
                    values: Vec::new(),
                },
            );
            let policies = [everywhere, elsewhere];
            let victim = services(1, family);
            let ip = victim[0].2.ingress[0];
            let alone = owners(&policies, &[], &victim, &none(), &nodes);
            assert_eq!(alone.len(), 1, "{alone:?}");
            for (tenant_type, local) in [
                (ServiceType::ClusterIP, true),
                (ServiceType::LoadBalancer, true),
                (ServiceType::ClusterIP, false),
            ] {
                let mut evil = services(2, family).remove(1);
                evil.0 = "evil/x".into();
                evil.1.service_type = tenant_type;
                evil.1.external_ips = vec![ip];
                if local {
                    evil.1.external_traffic_policy = TrafficPolicy::Local;
                } else {
                    evil.1.labels.insert("elsewhere".into(), "yes".into());
                }
                if tenant_type != ServiceType::LoadBalancer {
                    evil.2.ingress.clear();
                }
                let both = [victim[0].clone(), evil];
                // A pool holding the IP and serving every namespace: only the assignment
                // stands in the way.
                let pool: LbIpPool = serde_json::from_value(serde_json::json!({
                    "spec": { "blocks": [{ "start": ip.to_string(), "stop": ip.to_string() }] }
                }))
                .unwrap();
                let pools = [("all".to_owned(), pool)];
                let judged = crate::lb::external::judge(&both, &pools, BTreeMap::new);
                let admitted = judged.admitted(&both);
                let got = owners(&policies, &[], &admitted, &none(), &nodes);
                let case = format!("{family:?} {tenant_type:?} local={local}");
                let for_ip: Vec<_> = got.iter().filter(|a| a.ip == ip).collect();
                assert_eq!(for_ip, [&alone[0]], "{case}: {got:?}");
                let problems = announce_problems(&policies, &[], &admitted, &none(), &nodes);
                assert!(!problems.contains_key("ns/s0"), "{case}: {problems:?}");
                let refused = judged.problems(&both, |_| true);
                assert!(!refused.contains_key("ns/s0"), "{case}: {refused:?}");
                let p = &refused["evil/x"];
                assert!(
                    p.contains(&format!("{ip} is not announced for this service"))
                        && p.contains("assigned to ns/s0 by LB-IPAM")
                        && p.contains("remove it from spec.externalIPs"),
                    "{case}: {p}"
                );
            }
        }
    }

    /// Many Services listing one externalIP: one owner, and a decision that stays linear.
    #[test]
    fn an_external_ip_many_services_list_has_one_owner() {
        let nodes: Vec<NodeView> = (0..5)
            .map(|i| node(&format!("n{i}"), "a", &[("eth0", "10.77.0.1/24")]))
            .collect();
        let mut with_external = policy(None, &[]);
        with_external.1.external_ips = true;
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let mut svcs = services(2000, Family::V4);
        for s in &mut svcs {
            s.1.external_ips = vec![ip, ip];
        }
        let got = owners(&[with_external], &[], &svcs, &none(), &nodes);
        let by_ip = owners_by_ip(&got);
        assert_eq!(by_ip[&ip].len(), 1, "{:?}", by_ip[&ip]);
        assert_eq!(got.iter().filter(|a| a.ip == ip).count(), 2000);
    }
}
