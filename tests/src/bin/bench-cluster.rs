//! `cargo xtask bench cluster`: the cluster over real etcd, on this machine, in one run:
//! - `blocks_5000_nodes_s`: 5,000 simulated agents (light store clients writing their node
//!   records, not processes) join at once; seconds until every one holds a block, served by a
//!   real `ipamd --role operator`;
//! - `store_writes_per_pod_add`: etcd writes per pod ADD (through `ipam-cni` and a real agent)
//!   in steady state, counted from a watch on every key of the cluster; the node lease's
//!   renewals are shown beside it (they do not depend on pods);
//! - `operator_failover_s`: the leading operator SIGKILLed while a node waits for a block;
//!   seconds until the new leader served it (median of several kills);
//! - `xnode_rr_ratio_vs_kernel`, `xnode_throughput_ratio_vs_kernel`: pod to pod on two nodes,
//!   TCP request/response and bulk throughput through our datapath (`bpf_redirect_neigh` out,
//!   `bpf_redirect_peer` in) over plain kernel routing with static routes over the same links
//!   (programs detached), interleaved rounds.
//!
//! Last line: `blocks_5000_nodes_s=… store_writes_per_pod_add=… operator_failover_s=…
//! xnode_rr_ratio_vs_kernel=… xnode_throughput_ratio_vs_kernel=…`

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use futures_util::StreamExt as _;
use ipam_core::{
    resources::NodeIpam,
    store::{Resource as _, TypedStore as _, lease::Lease},
};
use ipam_datapath::{RouteMaps, pinned_pod_links, unpin_pod_link};
use ipam_tests::{
    cluster::{Cluster, ClusterPod, OPERATOR_LEASE_MS, nodes_holding_blocks, wait_until},
    tcp_bench::{RUN, median, tcp_rr, throughput},
};

const SIMULATED_NODES: usize = 5000;
const POD_ADDS: usize = 20;
const FAILOVERS: usize = 3;
const ROUNDS: usize = 3;

/// Pools large enough for 5,000 nodes (IPv4 /24 blocks of a /8, IPv6 /120 blocks of a /96).
const BIG_POOLS: &str = "[[ipam.pool]]\nname = \"default\"\n\
    ipv4 = { cidrs = [\"10.0.0.0/8\"], maskSize = 24 }\n\
    ipv6 = { cidrs = [\"fd00:240::/96\"], maskSize = 120 }\n";

fn main() {
    // The simulated nodes renew no lease: a grace period longer than the run keeps them.
    let mut c = Cluster::start_with("bcl", 2, BIG_POOLS, 600_000);
    let a = c.add_node("bcl");
    let b = c.add_node("bcl");
    wait_until(
        Duration::from_secs(30),
        "both nodes ready",
        || c.nodes.iter().all(ipam_tests::cluster::ClusterNode::ready),
        || format!("{:?}", c.blocks()),
    );
    let pod_a = c.nodes[a].add_pod("bca");
    let pod_b = c.nodes[b].add_pod("bcb");

    let (writes_per_add, lease_writes) = store_writes_per_pod_add(&c, a);
    println!(
        "store writes per pod ADD: {writes_per_add:.3} over {POD_ADDS} ADDs \
         (node lease renewals meanwhile: {lease_writes}, one per {} ms whatever the pods do)",
        ipam_tests::cluster::NODE_LEASE_MS / 3
    );

    let failover = operator_failover(&mut c);
    println!(
        "operator failover: {failover:.2} s median of {FAILOVERS} leader kills \
         (operator_lease_ms={OPERATOR_LEASE_MS}: a successor waits one lease after the last \
         renewal it saw)"
    );

    let blocks = blocks_for_simulated_nodes(&c);
    println!(
        "{SIMULATED_NODES} simulated nodes joining at once held their blocks after {blocks:.2} s"
    );

    let (rr, bulk) = cross_node(&mut c, a, b, &pod_a, &pod_b);
    println!(
        "blocks_5000_nodes_s={blocks:.2} store_writes_per_pod_add={writes_per_add:.3} \
         operator_failover_s={failover:.2} xnode_rr_ratio_vs_kernel={rr:.3} \
         xnode_throughput_ratio_vs_kernel={bulk:.3}"
    );
}

/// Writes to etcd while `POD_ADDS` pods are added on node `n`, by kind of object, from a watch
/// on every key of the cluster. Returns (writes per ADD other than leases, lease writes).
fn store_writes_per_pod_add(c: &Cluster, n: usize) -> (f64, u64) {
    // Steady state: the node's blocks and addresses are written, its agent settled.
    std::thread::sleep(Duration::from_secs(2));
    let mut pods = Vec::new();
    let by_kind = c.count_writes(|| {
        pods = (0..POD_ADDS)
            .map(|i| c.nodes[n].add_pod(&format!("bw{i}")))
            .collect::<Vec<ClusterPod>>();
        // Let anything the ADDs would cause reach the store.
        std::thread::sleep(Duration::from_secs(1));
    });
    drop(pods);
    println!("  writes during the ADDs, by kind: {by_kind:?}");
    let lease = by_kind.get(Lease::KIND).copied().unwrap_or(0);
    let other: u64 = by_kind.values().sum::<u64>() - lease;
    (other as f64 / POD_ADDS as f64, lease)
}

/// Kills the leading operator while a simulated node waits for its block; seconds until the
/// new leader served it. The killed replica is started again each time.
fn operator_failover(c: &mut Cluster) -> f64 {
    let mut times = Vec::new();
    for k in 0..FAILOVERS {
        let leader = c.leader().expect("a leader");
        let index = (0..c.operators.len())
            .find(|i| {
                c.operator_log(*i)
                    .lines()
                    .filter(|l| l.contains("leading the operators"))
                    .any(|l| l.contains(&leader))
            })
            .expect("the leader among the replicas");
        c.operators[index].take().unwrap().kill();
        let killed = Instant::now();
        let name = format!("pending-{k}");
        c.with_store({
            let name = name.clone();
            async move |s| s.create_typed(&name, &NodeIpam::default()).await.unwrap()
        });
        wait_until(
            Duration::from_secs(60),
            "the pending node's block from the new leader",
            || c.blocks().get(&name).is_some_and(|b| !b.is_empty()),
            || c.operator_log(1 - index),
        );
        let took = killed.elapsed().as_secs_f64();
        println!("  kill {}: served after {took:.2} s", k + 1);
        times.push(took);
        c.operators[index] = Some(c.start_operator());
        // Let the restarted replica settle as a follower.
        std::thread::sleep(Duration::from_secs(1));
    }
    median(times)
}

/// 5,000 node records written at once; seconds until every one holds a block.
fn blocks_for_simulated_nodes(c: &Cluster) -> f64 {
    c.with_store(async |store| {
        let started = Instant::now();
        let creates: Vec<_> = (0..SIMULATED_NODES)
            .map(|i| {
                let store = &store;
                async move {
                    store
                        .create_typed(&format!("sim-{i:05}"), &NodeIpam::default())
                        .await
                }
            })
            .collect();
        let created: Vec<_> = futures_util::stream::iter(creates)
            .buffer_unordered(256)
            .collect()
            .await;
        assert!(created.iter().all(Result::is_ok), "every record written");
        let written = started.elapsed();
        loop {
            let served = nodes_holding_blocks(&store, "sim-").await;
            if served == SIMULATED_NODES {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "only {served} of {SIMULATED_NODES} served after 2 minutes"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!(
            "  records written in {:.2} s; all served after {:.2} s",
            written.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
        started.elapsed().as_secs_f64()
    })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Setup {
    Ebpf,
    Kernel,
}

/// Pod A on node `a` to pod B on node `b`: (request/response ratio, throughput ratio), ours
/// over kernel routing, medians of interleaved rounds.
fn cross_node(
    c: &mut Cluster,
    a: usize,
    b: usize,
    pod_a: &ClusterPod,
    pod_b: &ClusterPod,
) -> (f64, f64) {
    // Nobody frees blocks or moves routes while the agents are stopped for the measurement.
    for op in &mut c.operators {
        if let Some(d) = op.take() {
            d.kill();
        }
    }
    let blocks = c.blocks();
    let mut results: Vec<(Setup, f64, f64)> = Vec::new();
    for round in 1..=ROUNDS {
        println!("round {round}/{ROUNDS}");
        // Agents started (programs attached, routes in the map), then stopped: the datapath
        // runs on its own.
        for n in [a, b] {
            if round > 1 {
                c.nodes[n].start();
            }
            c.nodes[n].daemon.take().unwrap().kill();
        }
        let before = forwarded(c, a);
        let (r, t) = measure(pod_a, pod_b);
        assert!(
            forwarded(c, a) > before,
            "the ebpf round went through the route map"
        );
        println!(
            "  ebpf:   {r:.0} round trips/s, {:.2} Gbit/s",
            t * 8.0 / 1e9
        );
        results.push((Setup::Ebpf, r, t));

        for n in [a, b] {
            let root = c.nodes[n].bpffs_root().to_owned();
            // Every pod program, both directions: the kernel alone from here on.
            for link in pinned_pod_links(&root).expect("pinned links") {
                unpin_pod_link(&root, &link).expect("unpin pod link");
            }
        }
        static_routes(c, &blocks, true);
        std::thread::sleep(Duration::from_millis(500));
        let before = forwarded(c, a);
        let (r, t) = measure(pod_a, pod_b);
        assert_eq!(
            forwarded(c, a),
            before,
            "the kernel round bypassed the programs"
        );
        println!(
            "  kernel: {r:.0} round trips/s, {:.2} Gbit/s",
            t * 8.0 / 1e9
        );
        results.push((Setup::Kernel, r, t));
        static_routes(c, &blocks, false);
    }
    let pick = |s: Setup, f: fn(&(Setup, f64, f64)) -> f64| {
        median(results.iter().filter(|x| x.0 == s).map(f).collect())
    };
    let (rr_e, rr_k) = (pick(Setup::Ebpf, |x| x.1), pick(Setup::Kernel, |x| x.1));
    let (t_e, t_k) = (pick(Setup::Ebpf, |x| x.2), pick(Setup::Kernel, |x| x.2));
    println!("median of {ROUNDS} rounds ({} s each):", RUN.as_secs());
    println!("  request/response: ebpf {rr_e:.0}/s  kernel {rr_k:.0}/s");
    println!(
        "  throughput:       ebpf {:.2}  kernel {:.2} Gbit/s",
        t_e * 8.0 / 1e9,
        t_k * 8.0 / 1e9
    );
    (rr_e / rr_k, t_e / t_k)
}

fn measure(a: &ClusterPod, b: &ClusterPod) -> (f64, f64) {
    (tcp_rr(&a.ns, &b.ns, &b.v4), throughput(&a.ns, &b.ns, &b.v4))
}

fn forwarded(c: &Cluster, n: usize) -> u64 {
    RouteMaps::from_pins(c.nodes[n].bpffs_root())
        .and_then(|m| m.stats())
        .map(|s| s[ipam_common::pod::RouteStat::Forwarded as usize])
        .unwrap_or(0)
}

/// The kernel's way: a static route on every node to every other node's blocks.
/// Adds them when `add`, else deletes them.
fn static_routes(c: &Cluster, blocks: &BTreeMap<String, Vec<ipam_core::Cidr>>, add: bool) {
    for (i, node) in c.nodes.iter().enumerate() {
        for (j, other) in c.nodes.iter().enumerate() {
            if i == j {
                continue;
            }
            let (v4, v6) = ipam_tests::cluster::node_addresses(j);
            for cidr in blocks.get(&other.name).into_iter().flatten() {
                let via = match cidr.family() {
                    ipam_core::Family::V4 => &v4,
                    ipam_core::Family::V6 => &v6,
                };
                if add {
                    node.ns.route_via(&cidr.to_string(), via);
                } else {
                    node.ns.delete_route(&cidr.to_string());
                }
            }
        }
    }
}
