//! The modelled store: the objects the L2 decision reads, every write in one log (the store's
//! revision order), and each node's watch, which delivers the log in order after a delay of its
//! own and may stall (a failing watch) and catch up. What etcd and the API server guarantee is
//! kept: one order for all, no write seen before an earlier one; what they do not is drawn:
//! how late each node sees each write.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use ipam_core::{
    lb::{
        announce::ReadyNodes,
        resources::{
            IpFamilyPolicy, L2PolicySpec, ServiceSpec, ServiceStatus, ServiceType, TrafficPolicy,
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
}

/// The store's objects as one reader sees them.
#[derive(Debug, Clone, Default)]
pub struct Objects {
    pub records: BTreeMap<String, NodeIpam>,
    pub services: Vec<ServiceRow>,
    pub policies: Vec<(String, L2PolicySpec)>,
    pub ready: ReadyNodes,
}

impl Objects {
    /// Applies one write.
    pub fn apply(&mut self, change: &Change) {
        match change {
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

/// The objects at the start: a record per node (zone `a` or `b`, one interface `eth0` on the
/// shared segment), a policy for every node and one for zone `a` that selects the Services
/// labelled `zone: a`, and `services` Services: every fifth shares the IP of the one before
/// (with a label of its own every tenth, so that the two are announced by different policies),
/// every third is `externalTrafficPolicy: Local` with a ready endpoint on one or two nodes.
pub fn initial(nodes: usize, services: usize, rng: &mut StdRng) -> Objects {
    let mut objects = Objects::default();
    for i in 0..nodes {
        let zone = if i % 2 == 0 { "a" } else { "b" };
        let record = NodeIpam {
            spec: NodeIpamSpec {
                labels: [("zone".to_owned(), zone.to_owned())].into(),
                interfaces: vec![NodeInterface {
                    name: "eth0".into(),
                    addresses: vec![format!("10.77.{}.{}/16", i / 250, i % 250 + 1)],
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
    let mut ip = 0u32;
    for s in 0..services {
        let shares = s % 5 == 4;
        if !shares {
            ip += 1;
        }
        let address = IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 78, 0, 0)) + ip));
        let name = format!("tenant-{}/svc-{s}", s % 3);
        let mut spec = service_spec();
        if s % 10 == 9 || (s % 10 == 8 && services > 9) {
            spec.labels.insert("zone".into(), "a".into());
        }
        if shares {
            spec.sharing_key = Some(format!("key-{ip}"));
        }
        if s % 3 == 2 {
            spec.external_traffic_policy = TrafficPolicy::Local;
            let first = rng.random_range(0..nodes);
            let mut on = BTreeSet::from([node_name(first)]);
            if rng.random_bool(0.5) {
                on.insert(node_name(rng.random_range(0..nodes)));
            }
            objects.ready.insert(name.clone(), on);
        }
        let status = ServiceStatus {
            ingress: vec![address],
            ..ServiceStatus::default()
        };
        objects.services.push((name, spec, status));
    }
    // Shared IPs share a sharing key with the Service before them.
    for s in 0..services {
        if s % 5 == 4 {
            let key = objects.services[s].1.sharing_key.clone();
            objects.services[s - 1].1.sharing_key = key;
        }
    }
    objects
}

fn policy(node_selector: Selector, service_selector: Selector) -> L2PolicySpec {
    L2PolicySpec {
        node_selector,
        service_selector,
        ip_pools: Vec::new(),
        ip_pool_selector: Selector::default(),
        interfaces: vec!["^eth0$".into()],
        load_balancer_ips: true,
        external_ips: false,
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
        ip_families: Vec::new(),
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
        self.now.apply(&change);
        self.log.push((at, change));
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

    /// The writes due at `now`, in order.
    pub fn due<'s>(&mut self, store: &'s Store, now: Duration) -> &'s [(Duration, Change)] {
        if now < self.stalled_until {
            return &[];
        }
        let start = self.next;
        while let Some((at, _)) = store.log.get(self.next) {
            if *at + self.lag > now {
                break;
            }
            self.next += 1;
        }
        &store.log[start..self.next]
    }
}
