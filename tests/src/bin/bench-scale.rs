//! `cargo xtask bench scale`: what one node's agent costs at rest, and whether anything grows
//! with the cluster, measured on real processes: at each size, that many `ipamd --role agent`
//! processes, each in its own network namespace on one bridge, over real etcd (three members),
//! gossiping (`[gossip]`), with pod IPAM and one operator, exactly as the failover lab runs
//! them (docs/benchmarks.md, `scale`).
//!
//! At each size:
//! - `cold_start_s`: every agent started at once; seconds until every node holds a block of
//!   the pool and every agent holds every other one alive in its gossip;
//! - at rest for `IPAM_BENCH_SCALE_REST_S` seconds (60 by default), from /proc and the agents'
//!   own metrics: `rss_mb_per_agent` (VmRSS at the end, mean), `cpu_pct_per_agent` (user +
//!   system time over the window, mean, in % of one core), `packets_per_agent_per_s` (gossip
//!   packets sent), and from the store: `store_writes_per_node_per_s` (every write by a node,
//!   counted by a watch on every key; the operator's own lease renewal apart);
//! - `failover_s`: a LoadBalancer Service's IP answered by one node, a client requesting every
//!   50 ms; its owner loses power (agent SIGKILLed, link cut); seconds until the client's
//!   requests are answered again, median of 3 losses.
//!
//! The segment is widened to a /16 for the nodes (`Cluster::widen_segment`), which makes
//! room for 250 nodes per /24 from 10.77.1.0.
//!
//! Sizes: `IPAM_BENCH_SCALE_AGENTS` (default `50,100`, what a 2-CPU machine holds: 200 agents
//! sharing two CPUs never settled, docs/benchmarks.md; give a larger machine `50,200`), the
//! largest last. Last line:
//! `agents=<n> rss_mb_per_agent=… cpu_pct_per_agent=… packets_per_agent_per_s=…
//! store_writes_per_node_per_s=… cold_start_s=… failover_s=…`, then the same keys at each smaller
//! size with `_at_<n>` appended, so the ratio is visible.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use ipam_tests::{
    cluster::{Cluster, POOLS, wait_until},
    failover::FailoverRig,
};

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
struct Figures {
    agents: usize,
    rss_mb_per_agent: f64,
    cpu_pct_per_agent: f64,
    packets_per_agent_per_s: f64,
    store_writes_per_node_per_s: f64,
    cold_start_s: f64,
    failover_s: f64,
}

impl Figures {
    fn keys(&self, suffix: &str) -> String {
        format!(
            "rss_mb_per_agent{suffix}={:.1} cpu_pct_per_agent{suffix}={:.2} \
             packets_per_agent_per_s{suffix}={:.2} store_writes_per_node_per_s{suffix}={:.3} \
             cold_start_s{suffix}={:.2} failover_s{suffix}={:.2}",
            self.rss_mb_per_agent,
            self.cpu_pct_per_agent,
            self.packets_per_agent_per_s,
            self.store_writes_per_node_per_s,
            self.cold_start_s,
            self.failover_s,
        )
    }
}

fn main() {
    let mut sizes: Vec<usize> = std::env::var("IPAM_BENCH_SCALE_AGENTS")
        .unwrap_or_else(|_| "50,100".into())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("IPAM_BENCH_SCALE_AGENTS: sizes such as 50,200")
        })
        .collect();
    sizes.sort_unstable();
    let rest = Duration::from_secs(
        std::env::var("IPAM_BENCH_SCALE_REST_S")
            .map(|s| s.parse().expect("IPAM_BENCH_SCALE_REST_S: seconds"))
            .unwrap_or(60),
    );
    println!(
        "machine: {} CPUs, {} MB of memory; agents gossip (default timings), lease renewed \
         every {} s; at rest for {} s; the host's neighbour tables raised to {NEIGHBOURS} \
         entries for the run",
        std::thread::available_parallelism().map_or(0, usize::from),
        mem_total_mb(),
        GRACE_MS / 3000,
        rest.as_secs()
    );
    let limits = NeighbourLimits::raise(NEIGHBOURS);
    let figures: Vec<Figures> = sizes.iter().map(|&n| measure(n, rest)).collect();
    drop(limits);
    let largest = figures.last().expect("one size at least");
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
    let smaller: Vec<String> = figures[..figures.len() - 1]
        .iter()
        .map(|f| f.keys(&format!("_at_{}", f.agents)))
        .collect();
    println!(
        "agents={} {} {}",
        largest.agents,
        largest.keys(""),
        smaller.join(" ")
    );
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

    let cold_start_s = cold_start(&mut c);
    std::thread::sleep(Duration::from_secs(10));
    let at_rest = at_rest(&c, rest);

    let mut rig = FailoverRig::around(c, &tag);
    let kills = rig.measure_kills(KILLS, BEFORE, AFTER);
    Figures {
        agents,
        cold_start_s,
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
/// other one alive.
fn cold_start(c: &mut Cluster) -> f64 {
    let agents = c.nodes.len();
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
    println!(
        "cold start: {agents} agents launched in {:.2} s; every block after {:.2} s; every \
         agent sees all alive after {:.2} s",
        launched.as_secs_f64(),
        blocks_at.unwrap_or_default().as_secs_f64(),
        all.as_secs_f64()
    );
    all.as_secs_f64()
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
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let ticks_per_s = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as f64,
        _ => 100.0,
    };
    let cpu: Vec<f64> = before
        .0
        .iter()
        .zip(&after.0)
        .map(|(b, a)| 100.0 * (a - b) as f64 / ticks_per_s / seconds)
        .collect();
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
        failover_s: 0.0,
    }
}

/// The other agents this agent's gossip holds alive.
fn alive_peers(metrics: &str) -> f64 {
    metric(metrics, "ipam_gossip_members", "state=\"alive\"")
}

/// The sum of `name`'s samples whose labels contain `labels` (all of them for "").
fn metric(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            n == name && rest.contains(labels)
        })
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

/// utime + stime of each process, in clock ticks.
fn cpu_ticks(pids: &[i32]) -> Vec<u64> {
    pids.iter()
        .map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            // The fields after the command name, which is in parentheses and may hold spaces.
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map(|(_, rest)| rest.split_whitespace().collect())
                .unwrap_or_default();
            // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
            let field = |i: usize| {
                fields
                    .get(i)
                    .and_then(|f| f.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            field(11) + field(12)
        })
        .collect()
}

fn rss_mb(pid: i32) -> f64 {
    proc_status_kb(&format!("/proc/{pid}/status"), "VmRSS:") / 1024.0
}

fn mem_total_mb() -> u64 {
    (proc_status_kb("/proc/meminfo", "MemTotal:") / 1024.0) as u64
}

fn proc_status_kb(file: &str, key: &str) -> f64 {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
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

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// "mean (min–max)".
fn spread(v: &[f64]) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    format!("{:.2} ({min:.2}–{max:.2})", mean(v))
}
