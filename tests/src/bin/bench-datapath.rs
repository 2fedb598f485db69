//! `cargo xtask bench datapath`: two pods on one node, wired by `ipam-cni` as the main plugin.
//! TCP request/response rate (1 byte each way, TCP_NODELAY) and bulk throughput from pod A to
//! pod B, measured in three set-ups in the same run, interleaved over several rounds:
//! - `ebpf`: our TC datapath (the pods' host veths run `pod_from_container`, which hands packets
//!   to the other pod with `bpf_redirect_peer`);
//! - `kernel`: the same veths with the programs detached: plain kernel routing (forwarding,
//!   host routes, permanent neighbours);
//! - `direct`: a second veth pair joining the two pod namespaces directly: the practical limit.
//!
//! The daemon is stopped while measuring (the datapath does not need it); it is started again to
//! re-attach the programs for each `ebpf` round.
//!
//! Last line: `tcp_rr_ratio_vs_kernel=<f> throughput_ratio_vs_kernel=<f>
//! throughput_ratio_vs_direct_veth=<f>` (ours / reference; higher is better).

use std::time::Duration;

use ipam_datapath::{pinned_pod_links, unpin_pod_link};
use ipam_tests::{
    pod_net::{Pod, PodNode},
    tcp_bench::{RUN, median, tcp_rr, throughput},
};

const ROUNDS: usize = 3;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Setup {
    Ebpf,
    Kernel,
    Direct,
}

/// Detaches the pod programs from the pods' veths (kernel routing from then on).
fn detach_pod_programs(node: &PodNode) {
    let root = node.ipam.bpffs_root();
    for link in pinned_pod_links(root).expect("pinned links") {
        if link.program.on_pod_veth() {
            unpin_pod_link(root, &link).expect("unpin pod link");
        }
    }
}

fn main() {
    let mut node = PodNode::start("bench");
    let a = node.add_pod("bpoda");
    let b = node.add_pod("bpodb");
    // The practical limit: the same two namespaces joined directly.
    ipam_tests::netns::veth(&a.ns, "direct0", &b.ns, "direct0");
    a.ns.add_address("direct0", "10.251.0.1/24");
    b.ns.add_address("direct0", "10.251.0.2/24");
    node.daemon.take().unwrap().kill();

    let mut rr: Vec<(Setup, f64)> = Vec::new();
    let mut bulk: Vec<(Setup, f64)> = Vec::new();
    let measure = |setup: Setup, a: &Pod, b: &Pod, rr: &mut Vec<_>, bulk: &mut Vec<_>| {
        let addr = if setup == Setup::Direct {
            "10.251.0.2"
        } else {
            b.v4.as_str()
        };
        let r = tcp_rr(&a.ns, &b.ns, addr);
        let t = throughput(&a.ns, &b.ns, addr);
        println!(
            "  {setup:?}: {r:.0} round trips/s, {:.2} Gbit/s",
            t * 8.0 / 1e9
        );
        rr.push((setup, r));
        bulk.push((setup, t));
    };
    for round in 1..=ROUNDS {
        println!("round {round}/{ROUNDS}");
        if round > 1 {
            // Re-attach the programs: the daemon adopts nothing (pins are gone) and attaches anew.
            node.daemon = Some(node.ipam.start_daemon());
            node.daemon.take().unwrap().kill();
        }
        let delivered = node.stat_from_pins("delivered");
        measure(Setup::Ebpf, &a, &b, &mut rr, &mut bulk);
        assert!(
            node.stat_from_pins("delivered") > delivered,
            "the ebpf round went through bpf_redirect_peer"
        );
        detach_pod_programs(&node);
        // The kernel releases an unpinned link asynchronously: let it go before counting.
        std::thread::sleep(Duration::from_millis(500));
        let delivered = node.stat_from_pins("delivered");
        measure(Setup::Kernel, &a, &b, &mut rr, &mut bulk);
        assert_eq!(
            node.stat_from_pins("delivered"),
            delivered,
            "the kernel round bypassed the programs"
        );
        measure(Setup::Direct, &a, &b, &mut rr, &mut bulk);
    }
    let pick = |v: &[(Setup, f64)], s: Setup| {
        median(v.iter().filter(|(x, _)| *x == s).map(|(_, r)| *r).collect())
    };
    let (rr_ebpf, rr_kernel, rr_direct) = (
        pick(&rr, Setup::Ebpf),
        pick(&rr, Setup::Kernel),
        pick(&rr, Setup::Direct),
    );
    let (t_ebpf, t_kernel, t_direct) = (
        pick(&bulk, Setup::Ebpf),
        pick(&bulk, Setup::Kernel),
        pick(&bulk, Setup::Direct),
    );
    println!("median of {ROUNDS} rounds ({}s each):", RUN.as_secs());
    println!(
        "  request/response: ebpf {rr_ebpf:.0}/s  kernel {rr_kernel:.0}/s  direct {rr_direct:.0}/s"
    );
    println!(
        "  throughput:       ebpf {:.2}  kernel {:.2}  direct {:.2} Gbit/s",
        t_ebpf * 8.0 / 1e9,
        t_kernel * 8.0 / 1e9,
        t_direct * 8.0 / 1e9
    );
    println!(
        "tcp_rr_ratio_vs_kernel={:.3} throughput_ratio_vs_kernel={:.3} throughput_ratio_vs_direct_veth={:.3}",
        rr_ebpf / rr_kernel,
        t_ebpf / t_kernel,
        t_ebpf / t_direct
    );
}
