//! What `ipamd` exposes for monitoring (`[metrics] listen`): Prometheus metrics at `/metrics`,
//! and `/healthz` (the process answers) and `/readyz` (restored, store reachable, datapath in
//! place; the reason in the body when not), so a DaemonSet probe and a person see the same
//! thing.
//!
//! Names follow Prometheus' rules: an `ipam_` prefix, base units, `_total` on counters, and
//! labels of bounded cardinality (pool, family, result, counter name, announced IP).

pub mod bgp;
pub mod gossip;
mod http;

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::{Mutex, atomic::AtomicU64},
};

use ipam_core::{pod::operator::PoolEvent, resources::FamilyUsageStatus};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

pub use http::serve;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerResult {
    pub controller: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    pub controller: String,
}

/// How a family of histograms makes each new one.
type Buckets = fn() -> Histogram;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyState {
    pub family: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolFamilyState {
    pub pool: String,
    pub family: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolReason {
    pub pool: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CounterLabel {
    pub counter: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IpLabel {
    pub ip: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FromLabel {
    pub from: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FieldLabel {
    pub field: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InterfaceLabel {
    pub interface: String,
}

/// Every metric of the daemon, shared by the parts that move them.
pub struct Metrics {
    registry: Registry,
    pub pod_allocations: Family<ResultLabel, Counter>,
    pub pod_releases: Family<ResultLabel, Counter>,
    pub node_addresses: Family<FamilyState, Gauge>,
    pub pool_blocks: Family<PoolFamilyState, Gauge>,
    /// Addresses can exceed an i64 in an IPv6 pool: a float gauge.
    pub pool_addresses: Family<PoolFamilyState, Gauge<f64, AtomicU64>>,
    pub lb_pool_addresses: Family<PoolFamilyState, Gauge<f64, AtomicU64>>,
    pub pool_events: Family<PoolReason, Counter>,
    pub block_requests_pending: Gauge,
    pub block_request_wait_seconds: Histogram,
    pub node_lease_renewals: Family<ResultLabel, Counter>,
    pub node_lease_renew_seconds: Histogram,
    pub service_ips_announced: Gauge,
    pub service_ip_takeovers: Counter,
    pub service_ip_decision_seconds: Histogram,
    pub service_ips_taken: Family<FromLabel, Counter>,
    pub interfaces_down: Family<InterfaceLabel, Gauge>,
    /// Nodes whose record claims what the cluster does not vouch for, by field (refused).
    pub record_claims_refused: Family<FieldLabel, Gauge>,
    pub dead_node_connections_deleted: Counter,
    pub store_errors: Family<KindLabel, Counter>,
    pub store_watches: Family<KindLabel, Gauge>,
    pub store_watch_subscribers: Family<KindLabel, Gauge>,
    pub store_watch_stale: Family<KindLabel, Gauge>,
    pub store_watch_errors: Family<KindLabel, Counter>,
    pub operator_leader: Gauge,
    pub controller_passes: Family<ControllerResult, Counter>,
    pub controller_pass_seconds: Family<ControllerLabel, Histogram, Buckets>,
    pub pod_datapath_packets: Family<CounterLabel, Counter>,
    pub l2_replies: Family<IpLabel, Counter>,
    pub gossip: gossip::GossipMetrics,
    pub bgp: bgp::BgpMetrics,
    /// Datapath counters as last read, to add only what they grew by.
    seen_pod: Mutex<BTreeMap<String, u64>>,
    seen_replies: Mutex<HashMap<IpAddr, u64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ipam");
        let m = Self {
            pod_allocations: Family::default(),
            pod_releases: Family::default(),
            node_addresses: Family::default(),
            pool_blocks: Family::default(),
            pool_addresses: Family::default(),
            lb_pool_addresses: Family::default(),
            pool_events: Family::default(),
            block_requests_pending: Gauge::default(),
            block_request_wait_seconds: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.05, 2.0, 10),
            ),
            node_lease_renewals: Family::default(),
            node_lease_renew_seconds: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 14),
            ),
            service_ips_announced: Gauge::default(),
            service_ip_takeovers: Counter::default(),
            service_ip_decision_seconds: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.000_25, 2.0, 12),
            ),
            service_ips_taken: Family::default(),
            interfaces_down: Family::default(),
            record_claims_refused: Family::default(),
            dead_node_connections_deleted: Counter::default(),
            store_errors: Family::default(),
            store_watches: Family::default(),
            store_watch_subscribers: Family::default(),
            store_watch_stale: Family::default(),
            store_watch_errors: Family::default(),
            operator_leader: Gauge::default(),
            controller_passes: Family::default(),
            controller_pass_seconds: Family::new_with_constructor(|| {
                Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                    0.000_1, 4.0, 10,
                ))
            }),
            pod_datapath_packets: Family::default(),
            l2_replies: Family::default(),
            gossip: gossip::GossipMetrics::new(),
            bgp: bgp::BgpMetrics::default(),
            seen_pod: Mutex::new(BTreeMap::new()),
            seen_replies: Mutex::new(HashMap::new()),
            registry: Registry::default(),
        };
        m.register_pod_ipam(&mut registry);
        m.register_liveness_and_datapath(&mut registry);
        m.gossip.register(&mut registry);
        m.bgp.register(&mut registry);
        Self { registry, ..m }
    }

    /// The pod IPAM metrics: allocations, node and pool addresses, block requests.
    fn register_pod_ipam(&self, registry: &mut Registry) {
        registry.register(
            "pod_allocations",
            "Pod address requests (CNI ADD) by result: allocated, or the error code",
            self.pod_allocations.clone(),
        );
        registry.register(
            "pod_releases",
            "Pod address releases (CNI DEL) by result",
            self.pod_releases.clone(),
        );
        registry.register(
            "node_addresses",
            "Addresses of this node's blocks by family and state (capacity, used)",
            self.node_addresses.clone(),
        );
        registry.register(
            "pool_blocks",
            "Blocks of each pod IP pool by family and state (total, used), as the operator last wrote them",
            self.pool_blocks.clone(),
        );
        registry.register(
            "pool_addresses",
            "Addresses of each pod IP pool by family and state (capacity, used: in blocks held by nodes, available: in free blocks)",
            self.pool_addresses.clone(),
        );
        registry.register(
            "pool_events",
            "Pod IP pool events by pool and reason (exhausted: a node got no block; refused: the pool's spec was refused), each counted once when it happens",
            self.pool_events.clone(),
        );
        registry.register(
            "block_requests_pending",
            "1 while this node waits for a block it asked the operator for",
            self.block_requests_pending.clone(),
        );
        registry.register_with_unit(
            "block_request_wait",
            "How long this node waited for a block it asked for, from the request to the block",
            Unit::Seconds,
            self.block_request_wait_seconds.clone(),
        );
    }

    /// Liveness, service IPs, the store, the operator's election and the datapath's counters.
    fn register_liveness_and_datapath(&self, registry: &mut Registry) {
        registry.register(
            "lb_pool_addresses",
            "Addresses of each LoadBalancer IP pool by family and state (capacity, used, available), as the operator last counted them",
            self.lb_pool_addresses.clone(),
        );
        registry.register(
            "node_lease_renewals",
            "Renewals of this node's liveness lease by result",
            self.node_lease_renewals.clone(),
        );
        registry.register_with_unit(
            "node_lease_renew_duration",
            "How long a renewal of the node lease took",
            Unit::Seconds,
            self.node_lease_renew_seconds.clone(),
        );
        registry.register(
            "service_ips_announced",
            "Service IPs this node answers ARP/NDP for",
            self.service_ips_announced.clone(),
        );
        registry.register(
            "service_ip_takeovers",
            "Service IPs this node took over (started answering for)",
            self.service_ip_takeovers.clone(),
        );
        registry.register_with_unit(
            "service_ip_decision_duration",
            "How long one decision of which node answers each Service IP took; hand-overs between live nodes are timed for decisions up to 50 ms (longer ones are logged)",
            Unit::Seconds,
            self.service_ip_decision_seconds.clone(),
        );
        registry.register(
            "service_ips_taken",
            "Service IPs this node started answering for, by where each came from: dead_node (a failover), live_node (a move between live nodes: a node returned or joined, one was excluded, an endpoint or interface went), none (a new IP, or taken at the agent's start)",
            self.service_ips_taken.clone(),
        );
        registry.register(
            "interface_down",
            "1 while an interface this node announced Service IPs from is down, has no carrier, no address or is gone (its IPs answered by other nodes); 0 once it can announce again",
            self.interfaces_down.clone(),
        );
        registry.register(
            "node_record_claims_refused",
            "Nodes whose claims the routes refuse, in the kubernetes IPAM mode, by field: addresses (a record lists addresses its Node does not: no next hop), podCIDRs (a record claims podCIDRs its Node does not have), nodePodCIDRs (a Node's podCIDR not of the cluster's block size, or another Node's too); not routed",
            self.record_claims_refused.clone(),
        );
        registry.register(
            "dead_node_connections_deleted",
            "Connections to dead nodes' pods that never got an answer, deleted from this node's conntrack table so that clients reusing their ports follow kube-proxy's current rules",
            self.dead_node_connections_deleted.clone(),
        );
        registry.register(
            "store_errors",
            "Failed store passes by kind of failure",
            self.store_errors.clone(),
        );
        registry.register(
            "store_watches",
            "Watches this process holds on the store, by kind: one per kind, shared by every controller that follows it",
            self.store_watches.clone(),
        );
        registry.register(
            "store_watch_subscribers",
            "Controllers following each kind through the process's one watch of it",
            self.store_watch_subscribers.clone(),
        );
        registry.register(
            "store_watch_stale",
            "1 while the kind's watch is in trouble: its copy may be behind the store, lists are read from the store itself and destructive decisions wait",
            self.store_watch_stale.clone(),
        );
        registry.register(
            "store_watch_errors",
            "Errors the store's watch of the kind reported (each makes the process list the kind again, with backoff)",
            self.store_watch_errors.clone(),
        );
        registry.register(
            "controller_passes",
            "Passes of each controller of the daemon by result (ok, error: tried again with backoff)",
            self.controller_passes.clone(),
        );
        registry.register_with_unit(
            "controller_pass_duration",
            "How long one pass of each controller took: reading its inputs, deciding and carrying the decision out",
            Unit::Seconds,
            self.controller_pass_seconds.clone(),
        );
        registry.register(
            "operator_leader",
            "1 while this operator replica leads",
            self.operator_leader.clone(),
        );
        registry.register(
            "pod_datapath_packets",
            "Packets of the pod datapath by counter (delivered, to_stack, spoof_dropped, ...)",
            self.pod_datapath_packets.clone(),
        );
        registry.register(
            "l2_replies",
            "ARP/NDP replies sent by the responder, by announced IP",
            self.l2_replies.clone(),
        );
    }

    /// One pass of `controller`: whether it succeeded and how long it took.
    pub fn controller_pass(&self, controller: &str, ok: bool, took: std::time::Duration) {
        let result = if ok { "ok" } else { "error" };
        self.controller_passes
            .get_or_create(&ControllerResult {
                controller: controller.to_owned(),
                result: result.to_owned(),
            })
            .inc();
        self.controller_pass_seconds
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// The same metrics in Prometheus' classic text format (0.0.4), for scrapers and tools that
    /// do not ask for OpenMetrics: counters' HELP and TYPE name the `_total` series, and the
    /// OpenMetrics-only lines (`# UNIT`, `# EOF`) are left out.
    pub fn encode_text(&self) -> String {
        to_classic_text(&self.encode())
    }

    /// Brings a counter family fed from a datapath total up to `total`.
    pub fn pod_counter_total(&self, counter: &str, total: u64) {
        let mut seen = self.seen_pod.lock().expect("metrics lock");
        let last = seen.entry(counter.to_owned()).or_insert(0);
        // A restarted datapath starts its counters again: count from there.
        let delta = if total >= *last { total - *last } else { total };
        *last = total;
        self.pod_datapath_packets
            .get_or_create(&CounterLabel {
                counter: counter.to_owned(),
            })
            .inc_by(delta);
    }

    /// Brings an announced IP's reply counter up to `total`.
    pub fn l2_replies_total(&self, ip: IpAddr, total: u64) {
        let mut seen = self.seen_replies.lock().expect("metrics lock");
        let last = seen.entry(ip).or_insert(0);
        let delta = if total >= *last { total - *last } else { total };
        *last = total;
        self.l2_replies
            .get_or_create(&IpLabel { ip: ip.to_string() })
            .inc_by(delta);
    }

    /// A pool's blocks and addresses, by family, from its usage as the operator computed it.
    /// Pool-wide, an address counts as used once its block is held by a node: the operator
    /// sees blocks, and each node's exact use is `node_addresses`.
    pub fn set_pool_usage(&self, pool: &str, usage: &[FamilyUsageStatus]) {
        for u in usage {
            let label = |state: &str| PoolFamilyState {
                pool: pool.to_owned(),
                family: u.family.name().to_owned(),
                state: state.to_owned(),
            };
            for (state, n) in [("total", u.total_blocks), ("used", u.used_blocks)] {
                self.pool_blocks
                    .get_or_create(&label(state))
                    .set(n.min(i64::MAX as u128) as i64);
            }
            let per_block = 2f64.powi(i32::from(u.family.bits() - u.mask_size));
            let total = u.total_blocks as f64 * per_block;
            let used = u.used_blocks as f64 * per_block;
            for (state, n) in [
                ("capacity", total),
                ("used", used),
                ("available", total - used),
            ] {
                self.pool_addresses.get_or_create(&label(state)).set(n);
            }
        }
    }

    /// The LoadBalancer IP pools' counts, as the operator's last pass wrote them: the pools
    /// that no longer exist drop out.
    pub fn set_lb_pool_counts(
        &self,
        pools: &[(String, Vec<ipam_core::lb::resources::LbFamilyCount>)],
    ) {
        self.lb_pool_addresses.clear();
        for (pool, counts) in pools {
            for c in counts {
                for (state, n) in [
                    ("capacity", c.total),
                    ("used", c.used),
                    ("available", c.available),
                ] {
                    let label = PoolFamilyState {
                        pool: pool.clone(),
                        family: c.family.name().to_owned(),
                        state: state.to_owned(),
                    };
                    self.lb_pool_addresses.get_or_create(&label).set(n as f64);
                }
            }
        }
    }

    /// Counts a pool event (the operator reports each once, when it happens).
    pub fn pool_event(&self, event: &PoolEvent) {
        self.pool_events
            .get_or_create(&PoolReason {
                pool: event.pool().to_owned(),
                reason: event.reason().to_owned(),
            })
            .inc();
    }

    /// A Service IP this node started answering for, taken from `from` (`dead_node`,
    /// `live_node`, `none`).
    pub fn count_service_ip_taken(&self, from: &str) {
        self.service_ips_taken
            .get_or_create(&FromLabel {
                from: from.to_owned(),
            })
            .inc();
    }

    pub fn result(family: &Family<ResultLabel, Counter>, result: &str) {
        family
            .get_or_create(&ResultLabel {
                result: result.to_owned(),
            })
            .inc();
    }
}

fn to_classic_text(open_metrics: &str) -> String {
    let counters: std::collections::BTreeSet<&str> = open_metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open_metrics.len());
    for line in open_metrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// The metrics and readiness checks every controller keeps current, shared by all of them.
#[derive(Clone, Default)]
pub struct Observed {
    pub metrics: std::sync::Arc<Metrics>,
    pub health: std::sync::Arc<Health>,
}

/// What `/readyz` reports: every check by name, ready or the reason why not.
#[derive(Debug, Default)]
pub struct Health {
    checks: Mutex<BTreeMap<&'static str, Result<(), String>>>,
}

impl Health {
    pub fn set(&self, check: &'static str, state: Result<(), String>) {
        self.checks
            .lock()
            .expect("health lock")
            .insert(check, state);
    }

    /// Whether `check` was ever set.
    pub fn has(&self, check: &str) -> bool {
        self.checks.lock().expect("health lock").contains_key(check)
    }

    /// Ready when every check is (and there is at least one), with one line per check.
    pub fn report(&self) -> (bool, String) {
        let checks = self.checks.lock().expect("health lock");
        let ready = !checks.is_empty() && checks.values().all(Result::is_ok);
        let lines: Vec<String> = checks
            .iter()
            .map(|(name, state)| match state {
                Ok(()) => format!("ok {name}"),
                Err(why) => format!("NOT READY {name}: {why}"),
            })
            .collect();
        let body = if checks.is_empty() {
            "NOT READY: starting\n".to_owned()
        } else {
            lines.join("\n") + "\n"
        };
        (ready, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_text_names_counters_by_their_series() {
        let m = Metrics::new();
        Metrics::result(&m.pod_allocations, "ok");
        let text = m.encode_text();
        assert!(
            text.contains("# TYPE ipam_pod_allocations_total counter"),
            "{text}"
        );
        assert!(
            text.contains("# HELP ipam_pod_allocations_total Pod address"),
            "{text}"
        );
        assert!(
            text.contains("ipam_pod_allocations_total{result=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        assert!(m.encode().ends_with("# EOF\n"));
    }
}
