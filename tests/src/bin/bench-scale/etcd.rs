//! The etcd half: at each size, that many `ipamd --role agent` processes, each in its own
//! network namespace on one bridge, over real etcd (three members), gossiping (`[gossip]`),
//! with pod IPAM and one operator, exactly as the failover lab runs them.
//!
//! At each size:
//! - `cold_start_s`: every agent started at once; seconds until every node holds a block of
//!   the pool and every agent holds every other one alive in its gossip; beside it
//!   `cold_start_cpu_floor_s`, the CPU time the agents used to get there spread over every CPU
//!   of the machine, which no cold start on it can beat;
//! - at rest for the rest window, from /proc and the agents' own metrics: `rss_mb_per_agent`
//!   (VmRSS at the end, mean), `cpu_pct_per_agent` (user + system time over the window, mean,
//!   in % of one core), `packets_per_agent_per_s` (gossip packets sent), and from the store:
//!   `store_writes_per_node_per_s` (every write by a node, counted by a watch on every key;
//!   the operator's own lease renewal apart);
//! - `failover_s`: a LoadBalancer Service's IP answered by one node, a client requesting every
//!   50 ms; its owner loses power (agent SIGKILLed, link cut); seconds until the client's
//!   requests are answered again, median of 3 losses.
//!
//! The segment is widened to a /16 for the nodes (`Cluster::widen_segment`), which makes
//! room for 250 nodes per /24 from 10.77.1.0.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use ipam_tests::{
    cluster::{Cluster, POOLS, wait_until},
    failover::FailoverRig,
};

use crate::procfs::{cpu_pct, cpu_ticks, machine_ticks, mean, metric, rss_mb, spread, ticks_per_s};

/// Where every agent serves its metrics, in its own namespace.
const METRICS_PORT: u16 = 9963;
/// As the failover lab with gossip: the node lease renewed every 10 s (the default).
const GRACE_MS: u64 = 30_000;
/// The kernel's neighbour tables are one per host, shared by every namespace: each agent that
/// gossips with N others holds N entries, so N agents on one host need N² (the default limit,
/// 1,024, overflowed at 50 agents and the membership never settled). Raised for the run
/// (`NeighbourLimits`) and put back after: a limit of the one kernel, not of the nodes.
const NEIGHBOURS: u64 = 131_072;
const KILLS: usize = 3;
const BEFORE: Duration = Duration::from_secs(3);
const AFTER: Duration = Duration::from_secs(15);

/// One size's figures.
#[derive(Debug, Clone)]
pub(crate) struct Figures {
    pub(crate) agents: usize,
    rss_mb_per_agent: f64,
    cpu_pct_per_agent: f64,
    packets_per_agent_per_s: f64,
    store_writes_per_node_per_s: f64,
    cold_start_s: f64,
    /// The agents' CPU time to start over this machine's CPUs: no cold start here is shorter.
    cold_start_cpu_floor_s: f64,
    failover_s: f64,
}

impl Figures {
    pub(crate) fn keys(&self, suffix: &str) -> String {
        format!(
            "rss_mb_per_agent{suffix}={:.1} cpu_pct_per_agent{suffix}={:.2} \
             packets_per_agent_per_s{suffix}={:.2} store_writes_per_node_per_s{suffix}={:.3} \
             cold_start_s{suffix}={:.2} cold_start_cpu_floor_s{suffix}={:.2} \
             failover_s{suffix}={:.2}",
            self.rss_mb_per_agent,
            self.cpu_pct_per_agent,
            self.packets_per_agent_per_s,
            self.store_writes_per_node_per_s,
            self.cold_start_s,
            self.cold_start_cpu_floor_s,
            self.failover_s,
        )
    }
}

/// Every size in `sizes` (smallest first), each at rest for `rest`; prints the table.
pub(crate) fn run(sizes: &[usize], rest: Duration) -> Vec<Figures> {
    println!(
        "etcd: agents gossip (default timings), lease renewed every {} s; at rest for {} s; \
         the host's neighbour tables raised to {NEIGHBOURS} entries for the run",
        GRACE_MS / 3000,
        rest.as_secs()
    );
    let limits = NeighbourLimits::raise(NEIGHBOURS);
    let figures: Vec<Figures> = sizes.iter().map(|&n| measure(n, rest)).collect();
    drop(limits);
    println!(
        "\n{:>7} {:>8} {:>7} {:>9} {:>10} {:>10} {:>10}",
        "agents", "RSS MB", "CPU %", "packets/s", "writes/s", "cold s", "failover s"
    );
    for f in &figures {
        println!(
            "{:>7} {:>8.1} {:>7.2} {:>9.2} {:>10.3} {:>10.2} {:>10.2}",
            f.agents,
            f.rss_mb_per_agent,
            f.cpu_pct_per_agent,
            f.packets_per_agent_per_s,
            f.store_writes_per_node_per_s,
            f.cold_start_s,
            f.failover_s
        );
    }
    figures
}

fn measure(agents: usize, rest: Duration) -> Figures {
    println!("\n== {agents} agents");
    let tag = format!("bs{agents}");
    let mut c = Cluster::start_with(&tag, 1, POOLS, GRACE_MS);
    c.enable_gossip();
    c.widen_segment();
    let made = Instant::now();
    let metrics = format!("[metrics]\nlisten = \"127.0.0.1:{METRICS_PORT}\"\n");
    for _ in 0..agents {
        c.prepare_node(&tag, &metrics);
    }
    println!(
        "{agents} namespaces with their links made in {:.1} s",
        made.elapsed().as_secs_f64()
    );

    let (cold_start_s, cold_start_cpu_floor_s) = cold_start(&mut c);
    std::thread::sleep(Duration::from_secs(10));
    let at_rest = at_rest(&c, rest);

    let mut rig = FailoverRig::around(c, &tag);
    let kills = rig.measure_kills(KILLS, BEFORE, AFTER);
    Figures {
        agents,
        cold_start_s,
        cold_start_cpu_floor_s,
        failover_s: kills.failover_s,
        ..at_rest
    }
}

/// The host's neighbour table limits (`gc_thresh1..3` of IPv4 and IPv6), raised while it
/// lives and put back on drop.
struct NeighbourLimits {
    saved: Vec<(String, String)>,
}

impl NeighbourLimits {
    fn raise(to: u64) -> Self {
        let mut saved = Vec::new();
        for family in ["ipv4", "ipv6"] {
            for (k, value) in [(1, to / 4), (2, to / 2), (3, to)] {
                let file = format!("/proc/sys/net/{family}/neigh/default/gc_thresh{k}");
                let old = std::fs::read_to_string(&file).expect("read a neighbour limit");
                std::fs::write(&file, value.to_string()).expect("raise a neighbour limit");
                saved.push((file, old.trim().to_owned()));
            }
        }
        Self { saved }
    }
}

impl Drop for NeighbourLimits {
    fn drop(&mut self) {
        for (file, old) in self.saved.iter().rev() {
            let _ = std::fs::write(file, old);
        }
    }
}

/// Starts every agent at once; seconds until every node has a block and every agent sees every
/// other one alive, and the least that can take on this machine: the CPU time the agents used
/// to get there, spread over every CPU.
fn cold_start(c: &mut Cluster) -> (f64, f64) {
    let agents = c.nodes.len();
    let machine_before = machine_ticks();
    let start = Instant::now();
    for node in &mut c.nodes {
        node.launch();
    }
    let launched = start.elapsed();
    let mut blocks_at = None;
    wait_until(
        Duration::from_secs(600),
        "every node's block and every agent seeing all others alive",
        || {
            let blocks = c.blocks();
            if blocks_at.is_none() && blocks.values().filter(|b| !b.is_empty()).count() == agents {
                blocks_at = Some(start.elapsed());
            }
            blocks_at.is_some()
                && c.nodes.iter().all(|n| {
                    n.metrics(METRICS_PORT)
                        .is_some_and(|m| alive_peers(&m) + 1.0 >= agents as f64)
                })
        },
        || {
            let short: Vec<String> = c
                .nodes
                .iter()
                .map(|n| {
                    let alive = n.metrics(METRICS_PORT).map(|m| alive_peers(&m));
                    format!("{}: {alive:?}", n.name)
                })
                .collect();
            format!("alive members seen by each agent: {}", short.join(", "))
        },
    );
    let all = start.elapsed();
    let machine_after = machine_ticks();
    let pids: Vec<i32> = c
        .nodes
        .iter()
        .filter_map(ipam_tests::cluster::ClusterNode::pid)
        .collect();
    let agents_cpu_s = cpu_ticks(&pids).iter().sum::<u64>() as f64 / ticks_per_s();
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let floor = agents_cpu_s / cpus as f64;
    let busy = 100.0 * machine_after.0.saturating_sub(machine_before.0) as f64
        / machine_after.1.saturating_sub(machine_before.1).max(1) as f64;
    println!(
        "cold start: {agents} agents launched in {:.2} s; every block after {:.2} s; every \
         agent sees all alive after {:.2} s. The agents used {agents_cpu_s:.1} CPU-seconds to \
         get there (each loads and verifies the eBPF programs, restores, joins): at least \
         {floor:.2} s on this machine's {cpus} CPUs, which were {busy:.0} % busy meanwhile",
        launched.as_secs_f64(),
        blocks_at.unwrap_or_default().as_secs_f64(),
        all.as_secs_f64()
    );
    (all.as_secs_f64(), floor)
}

/// What the agents cost over `window` at rest.
fn at_rest(c: &Cluster, window: Duration) -> Figures {
    let agents = c.nodes.len();
    let pids: Vec<i32> = c
        .nodes
        .iter()
        .map(|n| n.pid().expect("agent runs"))
        .collect();
    let sent = |c: &Cluster| -> Vec<f64> {
        c.nodes
            .iter()
            .map(|n| {
                let m = n.metrics(METRICS_PORT).expect("agent metrics answer");
                metric(&m, "ipam_gossip_packets_total", "direction=\"sent\"")
            })
            .collect()
    };
    let suspicions = |c: &Cluster| -> f64 {
        c.nodes
            .iter()
            .filter_map(|n| n.metrics(METRICS_PORT))
            .map(|m| metric(&m, "ipam_gossip_suspicions_total", ""))
            .sum()
    };
    let mut before = (Vec::new(), Vec::new(), 0.0);
    let mut after = (Vec::new(), Vec::new(), 0.0);
    let started = Instant::now();
    let writes = c.count_writes_by(true, || {
        before = (cpu_ticks(&pids), sent(c), suspicions(c));
        std::thread::sleep(window);
        after = (cpu_ticks(&pids), sent(c), suspicions(c));
    });
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_pct(&before.0, &after.0, seconds);
    let packets: Vec<f64> = before
        .1
        .iter()
        .zip(&after.1)
        .map(|(b, a)| (a - b) / seconds)
        .collect();
    let rss: Vec<f64> = pids.iter().map(|&p| rss_mb(p)).collect();
    let operator_writes: u64 = writes
        .iter()
        .filter(|(key, _)| key.as_str() == "/Lease/ipam-operator")
        .map(|(_, n)| n)
        .sum();
    let node_writes = writes.values().sum::<u64>() - operator_writes;
    let watches = c.nodes[0]
        .metrics(METRICS_PORT)
        .map(|m| metric(&m, "ipam_store_watches", ""))
        .unwrap_or_default();
    let operator_rss = c
        .operators
        .first()
        .and_then(Option::as_ref)
        .map_or(0.0, |d| rss_mb(d.pid()));
    println!(
        "at rest for {seconds:.0} s: RSS {} MB; CPU {} % of one core; gossip packets sent {} \
         per s; {:.0} suspicions in all; store writes by the nodes {node_writes} (operator \
         lease {operator_writes}), by kind: {:?}; store watches of one agent {watches:.0}; \
         operator RSS {operator_rss:.1} MB",
        spread(&rss),
        spread(&cpu),
        spread(&packets),
        after.2 - before.2,
        by_kind(&writes),
    );
    Figures {
        agents,
        rss_mb_per_agent: mean(&rss),
        cpu_pct_per_agent: mean(&cpu),
        packets_per_agent_per_s: mean(&packets),
        store_writes_per_node_per_s: node_writes as f64 / agents as f64 / seconds,
        cold_start_s: 0.0,
        cold_start_cpu_floor_s: 0.0,
        failover_s: 0.0,
    }
}

/// The other agents this agent's gossip holds alive.
fn alive_peers(metrics: &str) -> f64 {
    metric(metrics, "ipam_gossip_members", "state=\"alive\"")
}

fn by_kind(writes: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let mut kinds = BTreeMap::new();
    for (key, n) in writes {
        let kind = key
            .trim_start_matches('/')
            .split('/')
            .next()
            .unwrap_or_default();
        *kinds.entry(kind.to_owned()).or_default() += n;
    }
    kinds
}
