//! `cargo xtask bench <name>`: builds in release and runs the benchmark program of that name
//! (tests/src/bin/bench-<name>.rs; `sim` runs ipam-sim). Its last output line holds the
//! headline figures as `key=value` pairs.

use std::{collections::BTreeMap, process::Command};

use anyhow::{Context as _, bail};

use crate::cmd::{cargo, exec, target_dir};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum Name {
    /// ARP answers: ns per reply (BPF_PROG_TEST_RUN) and reply rate versus the kernel.
    Arp,
    /// Pod IP allocation: in memory, durable, cost at 1M vs 1k live, bytes each, 5,000 nodes.
    Alloc,
    /// CNI ADD latency of ipam-cni versus Debian's host-local, sequential and 100 concurrent.
    Cni,
    /// Pod-to-pod TCP request/response and throughput: TC datapath vs kernel routing vs a
    /// direct veth pair.
    Datapath,
    /// The cluster over real etcd: 5,000 nodes' blocks, store writes per pod ADD, operator
    /// failover, pod-to-pod across nodes versus kernel routing.
    Cluster,
    /// Service IP failover after a power loss, failed requests, store writes with 1,000
    /// services.
    Failover,
    /// Service IPs over BGP: a node's loss to its routes withdrawn on a real router, with BFD
    /// and without, and 1,000 Services to routes versus BIRD configured directly.
    Bgp,
    /// Node liveness between peers, simulated: 5,000 members at 1 % loss, time until a killed
    /// member is declared dead by all, false suspicions, gossip bytes per node.
    Liveness,
    /// Real agents at two sizes (50 and 100 by default) over etcd, gossiping: RSS, CPU, gossip
    /// packets and store writes per agent at rest, cold start, failover.
    Scale,
    /// Planned operations with both announcers: a rolling restart of every agent (failed
    /// requests over L2 and BGP, IP moves) and a dead NIC on an L2 owner (failover, failed
    /// requests).
    Rollout,
    /// Service IPs moving between live nodes at 10,000 Services under a stream of changes:
    /// ARP requests two MACs answered (aim 0), the gap of break before make, decision times.
    Handover,
    /// The seed's failover on a real Kubernetes cluster (as `lab kube`), with the dead nodes'
    /// pods set not ready on the agents' reports and without; needs KUBEBUILDER_ASSETS.
    KubeFailover,
    /// The whole-cluster simulator (ipam-sim): seeds per second at 3, 100 and 1,000 nodes,
    /// every instant checked; failing seeds listed, not shrunk. Needs no root.
    Sim,
}

/// The sizes `bench sim` runs, each with how many seeds (from seed 1, the same every run):
/// enough for a rate at the small sizes; one seed at 1,000 nodes takes most of the bench's
/// time (the daemon's decision costs that much there: docs/simulation.md, "How fast").
/// `IPAM_BENCH_SIM_SIZES=3:200,100:3` runs others.
const SIM_SIZES: &[(usize, u64)] = &[(3, 200), (100, 3), (1_000, 1)];

pub(crate) fn run(name: Name) -> anyhow::Result<()> {
    if matches!(name, Name::Sim) {
        return sim();
    }
    if matches!(name, Name::KubeFailover) {
        // The datapath under test runs from the image, built in release by the image step.
        let mut command = crate::lab::kube_program("bench-kube-failover")?;
        exec(cargo().args(["build", "--bins"]))?;
        return exec(&mut command);
    }
    let bin = match name {
        Name::Arp => "bench-arp",
        Name::Alloc => "bench-alloc",
        Name::Cni => "bench-cni",
        Name::Datapath => "bench-datapath",
        Name::Cluster => "bench-cluster",
        Name::Failover => "bench-failover",
        Name::Liveness => "bench-liveness",
        Name::Bgp => "bench-bgp",
        Name::Scale => "bench-scale",
        Name::Rollout => "bench-rollout",
        Name::Handover => "bench-handover",
        Name::KubeFailover | Name::Sim => unreachable!("run above"),
    };
    // Benchmarks may start the daemon and the plugin: build every binary in release.
    exec(cargo().args(["build", "--release", "--bins"]))?;
    let mut command = std::process::Command::new(target_dir()?.join("release").join(bin));
    if matches!(name, Name::Cni) {
        // The plugin as it is installed on nodes.
        command.env("IPAM_CNI_BIN", crate::build_cni::run()?);
    }
    exec(&mut command)
}

/// `bench sim`: ipam-sim in release at each of [`SIM_SIZES`], its own figures printed as it
/// gives them, and theirs gathered on one last line.
fn sim() -> anyhow::Result<()> {
    exec(cargo().args(["build", "--release", "-p", "ipam-sim", "--bin", "ipam-sim"]))?;
    let bin = target_dir()?.join("release").join("ipam-sim");
    let sizes = match std::env::var("IPAM_BENCH_SIM_SIZES") {
        Ok(list) => sim_sizes(&list)?,
        Err(_) => SIM_SIZES.to_vec(),
    };
    let mut rates = Vec::new();
    let (mut steps, mut failed) = (0u64, 0u64);
    for (nodes, seeds) in sizes {
        println!("== {nodes} nodes, {seeds} seeds from seed 1");
        let out = Command::new(&bin)
            .args(["--nodes", &nodes.to_string(), "--seeds", &seeds.to_string()])
            .arg("--no-shrink")
            .output()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        print!("{stdout}");
        // 1 is a seed that failed: a finding, printed above, not a failure of the bench.
        if !matches!(out.status.code(), Some(0 | 1)) {
            bail!(
                "ipam-sim at {nodes} nodes failed with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let figures: BTreeMap<&str, &str> = stdout
            .lines()
            .last()
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|pair| pair.split_once('='))
            .collect();
        let figure = |key: &str| {
            figures
                .get(key)
                .copied()
                .with_context(|| format!("ipam-sim at {nodes} nodes printed no {key}"))
        };
        rates.push(format!(
            "sim_seeds_per_s_{nodes}={}",
            figure("seeds_per_s")?
        ));
        steps += figure("steps_checked")?.parse::<u64>()?;
        failed += figure("failed")?.parse::<u64>()?;
    }
    println!("{} steps_checked={steps} failed={failed}", rates.join(" "));
    Ok(())
}

/// `3:200,100:3`: nodes and seeds, by size.
fn sim_sizes(list: &str) -> anyhow::Result<Vec<(usize, u64)>> {
    list.split(',')
        .map(|size| {
            let (nodes, seeds) = size
                .split_once(':')
                .with_context(|| format!("IPAM_BENCH_SIM_SIZES: {size} is not nodes:seeds"))?;
            Ok((nodes.trim().parse()?, seeds.trim().parse()?))
        })
        .collect()
}
