//! `cargo xtask bench scale`: what one node's agent costs at rest, and whether anything grows
//! with the cluster, measured on real processes (docs/benchmarks.md, `scale`), in two halves:
//! - `etcd` (`etcd.rs`): at two sizes, that many real agents gossiping over real etcd, with
//!   the operator: each agent's RSS, CPU, gossip packets and store writes at rest, the cold
//!   start, a failover;
//! - `kubernetes` (`kube.rs`): 1,000 nodes (real agents and simulated ones) and 10,000
//!   LoadBalancer Services on the Kubernetes store, against a real kube-apiserver when
//!   `KUBEBUILDER_ASSETS` names one: the API server's requests at rest by client, verb and
//!   resource, each agent's bytes to and from it, the time to assign every Service an IP, the
//!   operator's cost.
//!
//! Settings: `IPAM_BENCH_SCALE_PARTS` (`etcd,kubernetes` by default), `IPAM_BENCH_SCALE_REST_S`
//! (each window at rest, 60 s by default), `IPAM_BENCH_SCALE_AGENTS` (the etcd half's sizes,
//! `50,100` by default: what a 2-CPU machine holds, 200 agents sharing two CPUs never settled;
//! give a larger machine `50,200`), `IPAM_BENCH_SCALE_KUBE_NODES`, `IPAM_BENCH_SCALE_SERVICES`,
//! `IPAM_BENCH_SCALE_KUBE_AGENTS` (1,000, 10,000 and 10 by default).
//!
//! Last line: `agents=<n> rss_mb_per_agent=… cpu_pct_per_agent=… packets_per_agent_per_s=…
//! store_writes_per_node_per_s=… cold_start_s=… cold_start_cpu_floor_s=… failover_s=…`, the same keys at each smaller
//! size with `_at_<n>` appended (so the ratio is visible), then the Kubernetes half's keys
//! (`kube_api=real|stand-in kube_nodes=… kube_services=… lb_assign_s=… operator_rss_mb=…
//! api_requests_per_s_at_rest=… agent_rx_bytes_per_s_at_rest=…` and more).

mod etcd;
mod kube;
mod procfs;

use std::time::Duration;

fn main() {
    let parts =
        std::env::var("IPAM_BENCH_SCALE_PARTS").unwrap_or_else(|_| "etcd,kubernetes".into());
    let parts: Vec<&str> = parts.split(',').map(str::trim).collect();
    if let Some(unknown) = parts.iter().find(|p| !["etcd", "kubernetes"].contains(p)) {
        panic!("IPAM_BENCH_SCALE_PARTS: {unknown:?} is neither etcd nor kubernetes");
    }
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
        "machine: {} CPUs, {} MB of memory",
        std::thread::available_parallelism().map_or(0, usize::from),
        procfs::mem_total_mb(),
    );
    let mut keys = Vec::new();
    if parts.contains(&"etcd") {
        let figures = etcd::run(&sizes, rest);
        let largest = figures.last().expect("one size at least");
        keys.push(format!("agents={} {}", largest.agents, largest.keys("")));
        keys.extend(
            figures[..figures.len() - 1]
                .iter()
                .map(|f| f.keys(&format!("_at_{}", f.agents))),
        );
    }
    if parts.contains(&"kubernetes") {
        keys.push(kube::run(rest).keys());
    }
    println!("{}", keys.join(" "));
}
