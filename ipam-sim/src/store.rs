//! The modelled store: the objects the L2 decision reads, every write in one log (the store's
//! revision order), and each node's watch, which delivers the log in order after a delay of its
//! own and may stall (a failing watch) and catch up. What etcd and the API server guarantee is
//! kept: one order for all, no write seen before an earlier one; what they do not is drawn:
//! how late each node sees each write.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use ipam_core::{
    Family,
    lb::{
        announce::ReadyNodes,
        assign::assign,
        resources::{
            IpFamilyPolicy, L2PolicySpec, LbIpBlock, LbIpPool, LbIpPoolSpec, LbIpPoolStatus,
            ServiceSpec, ServiceStatus, ServiceType, TrafficPolicy,
        },
    },
    meta::Selector,
    resources::{NodeInterface, NodeIpam, NodeIpamSpec},
};
use rand::{Rng, rngs::StdRng};

/// A Service row, as the decision takes it.
pub type ServiceRow = (String, ServiceSpec, ServiceStatus);

/// One write.
#[derive(Debug, Clone)]
pub enum Change {
    Record(String, Box<NodeIpam>),
    Ready(String, BTreeSet<String>),
    /// A Service written (created, or its status by the operator).
    Service(Box<ServiceRow>),
    ServiceGone(String),
}

/// The store's objects as one reader sees them.
#[derive(Debug, Clone, Default)]
pub struct Objects {
    pub records: BTreeMap<String, NodeIpam>,
    /// In name order.
    pub services: Vec<ServiceRow>,
    pub policies: Vec<(String, L2PolicySpec)>,
    pub ready: ReadyNodes,
    pub pools: Vec<PoolRow>,
    /// Each Service's revision: the store's write count at its last write.
    pub service_revisions: BTreeMap<String, usize>,
}

/// A LoadBalancer IP pool, as LB-IPAM takes it.
pub type PoolRow = (String, LbIpPoolSpec, LbIpPoolStatus);

impl Objects {
    /// Applies one write, the store's `revision`-th.
    pub fn apply(&mut self, change: &Change, revision: usize) {
        match change {
            Change::Service(row) => {
                self.service_revisions.insert(row.0.clone(), revision);
                match self.services.binary_search_by(|s| s.0.cmp(&row.0)) {
                    Ok(i) => self.services[i] = (**row).clone(),
                    Err(i) => self.services.insert(i, (**row).clone()),
                }
            }
            Change::ServiceGone(name) => {
                self.service_revisions.remove(name);
                self.services.retain(|s| s.0 != *name);
                self.ready.remove(name);
            }
            Change::Record(name, record) => {
                self.records.insert(name.clone(), (**record).clone());
            }
            Change::Ready(service, nodes) if nodes.is_empty() => {
                self.ready.remove(service);
            }
            Change::Ready(service, nodes) => {
                self.ready.insert(service.clone(), nodes.clone());
            }
        }
    }
}

/// The name of node `i`.
pub fn node_name(i: usize) -> String {
    format!("node-{i}")
}

/// The number of the node named `name` ([`node_name`]'s), if it is one.
#[must_use]
pub fn node_index(name: &str) -> Option<usize> {
    let digits = name.strip_prefix("node-")?;
    let canonical =
        digits.bytes().all(|b| b.is_ascii_digit()) && (digits == "0" || !digits.starts_with('0'));
    canonical.then(|| digits.parse().ok()).flatten()
}

/// The objects at the start: a record per node (zone `a` or `b`, one interface `eth0` on the
/// shared segment), a policy for every node and one for zone `a` that selects the Services
/// labelled `zone: a`, two pools (`shared` for every namespace, `tenant-1-only` for namespace
/// `tenant-1`, which it serves first), and `services` Services, their IPs given by LB-IPAM
/// (`ipam_core::lb::assign`) as the operator would have before the run.
pub fn initial(nodes: usize, services: usize, rng: &mut StdRng) -> Objects {
    let mut objects = Objects::default();
    for i in 0..nodes {
        let zone = if i % 2 == 0 { "a" } else { "b" };
        let address = format!("10.77.{}.{}", i / 250, i % 250 + 1);
        let record = NodeIpam {
            spec: NodeIpamSpec {
                addresses: vec![address.parse().expect("an IPv4 address")],
                labels: [("zone".to_owned(), zone.to_owned())].into(),
                interfaces: vec![NodeInterface {
                    name: "eth0".into(),
                    addresses: vec![format!("{address}/16")],
                    mac: Some(format!("02:00:00:00:{:02x}:{:02x}", i / 256, i % 256)),
                }],
                ..NodeIpamSpec::default()
            },
            ..NodeIpam::default()
        };
        objects.records.insert(node_name(i), record);
    }
    objects.policies.push((
        "every-node".into(),
        policy(Selector::default(), Selector::default()),
    ));
    let mut zone_a = Selector::default();
    zone_a.match_labels.insert("zone".into(), "a".into());
    objects
        .policies
        .push(("zone-a".into(), policy(zone_a.clone(), zone_a)));
    // Tenant-2's own addresses for external IPs, never handed out by LB-IPAM.
    let mut external = pool("tenant-2-external", "10.80.0.0/28", &["tenant-2"], None);
    external.1.auto_assign = false;
    objects.pools = vec![
        pool("shared", "10.78.0.0/24", &[], None),
        pool("tenant-1-only", "10.79.0.0/28", &["tenant-1"], Some(0)),
        external,
    ];
    for s in 0..services {
        let (name, spec) = service(s);
        if spec.external_traffic_policy == TrafficPolicy::Local {
            let first = rng.random_range(0..nodes);
            let mut on = BTreeSet::from([node_name(first)]);
            if rng.random_bool(0.5) {
                on.insert(node_name(rng.random_range(0..nodes)));
            }
            objects.ready.insert(name.clone(), on);
        }
        objects
            .services
            .push((name, spec, ServiceStatus::default()));
    }
    objects.services.sort_by(|a, b| a.0.cmp(&b.0));
    let assigned = assign(&objects.pools, &objects.services);
    for (name, _, status) in &mut objects.services {
        if let Some(new) = assigned.services.get(name) {
            *status = new.clone();
        }
        objects.service_revisions.insert(name.clone(), 0);
    }
    objects
}

/// Service number `s`: in namespace `tenant-{(s / 5) % 3}`; every fifth shares a key with the
/// one before (same namespace); every third is `externalTrafficPolicy: Local`; the eighth and
/// ninth of each ten are labelled `zone: a` (the zone-a policy announces them). Every seventh
/// is also a ClusterIP Service listing two external IPs (`external_ips`).
pub fn service(s: usize) -> (String, ServiceSpec) {
    let name = format!("tenant-{}/svc-{s}", (s / 5) % 3);
    let mut spec = service_spec();
    if s % 7 == 6 {
        spec.service_type = ServiceType::ClusterIP;
        spec.external_ips = external_ips(s);
    }
    if s % 10 >= 8 {
        spec.labels.insert("zone".into(), "a".into());
    }
    if s % 5 >= 3 {
        spec.sharing_key = Some(format!("key-{}", s / 5));
    }
    if s % 3 == 2 {
        spec.external_traffic_policy = TrafficPolicy::Local;
    }
    (name, spec)
}

/// The external IPs Service `s` lists: a free address of the shared pool (any namespace's:
/// answered), and in turn: a node's address, an address of tenant-2's pool (answered only for
/// a Service of tenant-2), another Service's LoadBalancer IP (of the shared pool, which
/// LB-IPAM fills from its lowest address), an address in no pool.
fn external_ips(s: usize) -> Vec<std::net::IpAddr> {
    let refused = match (s / 7) % 4 {
        0 => format!("10.77.0.{}", s % 3 + 1),
        1 => format!("10.80.0.{}", s % 13 + 1),
        2 => format!("10.78.0.{}", s % 4 + 1),
        _ => format!("192.0.2.{}", s % 200 + 1),
    };
    [format!("10.78.0.{}", 200 + s % 50), refused]
        .iter()
        .map(|a| a.parse().expect("an IPv4 address"))
        .collect()
}

/// The pools as the decisions take them.
pub fn lb_pools(pools: &[PoolRow]) -> Vec<(String, LbIpPool)> {
    pools
        .iter()
        .map(|(name, spec, status)| {
            let pool = LbIpPool {
                labels: BTreeMap::new(),
                spec: spec.clone(),
                status: status.clone(),
            };
            (name.clone(), pool)
        })
        .collect()
}

fn pool(name: &str, cidr: &str, namespaces: &[&str], priority: Option<u32>) -> PoolRow {
    let spec = LbIpPoolSpec {
        blocks: vec![LbIpBlock {
            cidr: Some(cidr.into()),
            start: None,
            stop: None,
        }],
        namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
        priority,
        ..LbIpPoolSpec::default()
    };
    (name.into(), spec, LbIpPoolStatus::default())
}

fn policy(node_selector: Selector, service_selector: Selector) -> L2PolicySpec {
    L2PolicySpec {
        node_selector,
        service_selector,
        ip_pools: Vec::new(),
        ip_pool_selector: Selector::default(),
        interfaces: vec!["^eth0$".into()],
        load_balancer_ips: true,
        external_ips: true,
    }
}

fn service_spec() -> ServiceSpec {
    ServiceSpec {
        service_type: ServiceType::LoadBalancer,
        labels: BTreeMap::new(),
        ports: Vec::new(),
        load_balancer_class: None,
        requested_ips: Vec::new(),
        sharing_key: None,
        ip_families: vec![Family::V4],
        ip_family_policy: IpFamilyPolicy::SingleStack,
        external_ips: Vec::new(),
        external_traffic_policy: TrafficPolicy::default(),
        selector: BTreeMap::new(),
        conflict: None,
        sharing_cross_namespace: Vec::new(),
        pool: None,
        namespace_labels: BTreeMap::new(),
    }
}

/// The store: its objects now, and the log of writes since the start.
#[derive(Debug)]
pub struct Store {
    pub now: Objects,
    log: Vec<(Duration, Change)>,
}

impl Store {
    pub fn new(objects: Objects) -> Self {
        Self {
            now: objects,
            log: Vec::new(),
        }
    }

    /// Writes `change` at `at` (the store's order is the order of the calls).
    pub fn write(&mut self, at: Duration, change: Change) {
        self.now.apply(&change, self.log.len() + 1);
        self.log.push((at, change));
    }

    /// Writes a Service's status if the Service is still at `revision` (a conditional
    /// update, as every writer of the store makes); returns whether it was.
    pub fn write_status(&mut self, at: Duration, row: ServiceRow, revision: usize) -> bool {
        if self.now.service_revisions.get(&row.0) != Some(&revision) {
            return false;
        }
        self.write(at, Change::Service(Box::new(row)));
        true
    }

    /// How many writes so far: where a watch opened now starts.
    pub fn revision(&self) -> usize {
        self.log.len()
    }

    /// Node `name`'s record now.
    pub fn record(&self, name: &str) -> NodeIpam {
        self.now.records.get(name).cloned().unwrap_or_default()
    }
}

/// One node's watch: what it has delivered, and how late.
#[derive(Debug, Clone)]
pub struct WatchCursor {
    next: usize,
    /// How long after a write this watch delivers it.
    pub lag: Duration,
    /// Nothing is delivered before this (a failing watch, then its relist).
    pub stalled_until: Duration,
}

impl WatchCursor {
    /// A watch opened on `store` now, after listing it.
    pub fn open(store: &Store, lag: Duration) -> Self {
        Self {
            next: store.revision(),
            lag,
            stalled_until: Duration::ZERO,
        }
    }

    /// How many of the store's writes it has delivered: its copy's revision.
    pub fn delivered(&self) -> usize {
        self.next
    }

    /// When it delivers its next write of `store`'s, if there is one it has not delivered.
    #[must_use]
    pub fn next_at(&self, store: &Store) -> Option<Duration> {
        let (at, _) = store.log.get(self.next)?;
        Some((*at + self.lag).max(self.stalled_until))
    }

    /// The writes due at `now`, in order.
    pub fn due<'s>(
        &mut self,
        store: &'s Store,
        now: Duration,
    ) -> impl Iterator<Item = (usize, &'s Change)> + 's {
        let start = self.next;
        if now >= self.stalled_until {
            while let Some((at, _)) = store.log.get(self.next) {
                if *at + self.lag > now {
                    break;
                }
                self.next += 1;
            }
        }
        store.log[start..self.next]
            .iter()
            .enumerate()
            .map(move |(i, (_, c))| (start + i + 1, c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_name_gives_back_its_number_and_nothing_else_does() {
        for i in [0, 7, 10, 999] {
            assert_eq!(node_index(&node_name(i)), Some(i));
        }
        for other in ["node-", "node-07", "node-+7", "node-7a", "node7", "gateway"] {
            assert_eq!(node_index(other), None, "{other}");
        }
    }
}
