//! `cargo xtask bench arp`: what an ARP answer costs and how many the responder sends per
//! second, each measured side by side with its reference in the same run.
//!
//! 1. ns per answered request: the XDP responder run 1,000,000 times through BPF_PROG_TEST_RUN on
//!    a request for an announced IP (one request per run: a run rewrites the frame into its
//!    reply, so repeating a run in place would measure the pass path of replies instead). The
//!    kernel's own timing per run is used; it includes the timer's cost, shown as the floor:
//!    the same harness on a frame the responder passes at its first check.
//! 2. replies per second: a flood of identical ARP requests (sendmmsg, batches of 64) from one
//!    namespace over a veth, answered by the kernel (address assigned to the interface) or by our
//!    responder (address announced, responder attached as `auto` picks on veth: TC), alternated
//!    over several rounds. Replies are counted on the sender's interface.
//!
//! Last line: `arp_ns_per_reply=<f> arp_rate_ratio_vs_kernel=<f>`.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use aya::programs::{TestRun, TestRunOptions};
use ipam_daemon::{
    datapath::{AttachMode, Datapath},
    net::{frames::ArpFrame, frames::ETH_P_ARP, iface, packet_socket::PacketSocket},
};
use ipam_tests::{
    BpffsRoot,
    netns::{Netns, veth},
};

const RUNS: u32 = 1_000_000;
const ROUNDS: usize = 3;
const ROUND: Duration = Duration::from_secs(2);
const SERVICE: Ipv4Addr = Ipv4Addr::new(10, 90, 0, 100);
const SENDER: Ipv4Addr = Ipv4Addr::new(10, 90, 0, 2);

fn main() {
    println!(
        "environment: kernel {}, {} CPUs",
        kernel(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    let (reply_ns, floor_ns) = ns_per_reply();
    println!("BPF_PROG_TEST_RUN, {RUNS} runs each (kernel-measured time per run):");
    println!("  request for an announced IP, answered: {reply_ns:.1} ns");
    println!("  non-ARP frame, passed at the first check (timer floor): {floor_ns:.1} ns");

    let (ours, kernel) = flood();
    let ratio = median(&ours) / median(&kernel);
    println!(
        "ARP flood over a veth, {ROUNDS} alternating rounds of {} s, replies/s:",
        ROUND.as_secs()
    );
    println!("  kernel (address on the interface): {}", list(&kernel));
    println!("  our responder (TC, auto on veth):   {}", list(&ours));
    println!("  median ratio ours/kernel: {ratio:.2}");
    println!("arp_ns_per_reply={reply_ns:.1} arp_rate_ratio_vs_kernel={ratio:.2}");
}

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn list(v: &[f64]) -> String {
    v.iter()
        .map(|r| format!("{:.0}k", r / 1000.0))
        .collect::<Vec<_>>()
        .join(", ")
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Mean kernel-measured ns per run: (answered request, passed non-ARP frame).
fn ns_per_reply() -> (f64, f64) {
    let root = BpffsRoot::new();
    let mut dp = Datapath::open(&root.0).expect("load datapath");
    let mac = [2, 0, 0, 0, 0, 0x10];
    // BPF_PROG_TEST_RUN delivers frames as if received on loopback (ifindex 1).
    dp.responder()
        .announce(IpAddr::V4(SERVICE), 1, mac)
        .expect("announce");
    dp.responder()
        .heartbeat(Duration::from_secs(3600))
        .expect("heartbeat");
    let request = ArpFrame::request([2, 0, 0, 0, 0, 0x20], SENDER, SERVICE).to_bytes();
    let mut other = request.clone();
    other[12..14].copy_from_slice(&0x0800u16.to_be_bytes());

    let mut time = |frame: &[u8], want: u32| -> f64 {
        let mut out = vec![0u8; 128];
        let mut total = Duration::ZERO;
        for _ in 0..RUNS {
            let r = dp
                .responder_xdp()
                .test_run(TestRunOptions {
                    data_in: Some(frame),
                    data_out: Some(&mut out),
                    ..TestRunOptions::new()
                })
                .expect("test run");
            assert_eq!(r.return_value, want, "unexpected verdict");
            total += r.duration;
        }
        total.as_nanos() as f64 / RUNS as f64
    };
    let reply = time(&request, 3);
    let floor = time(&other, 2);
    (reply, floor)
}

/// Replies/s per round: (ours, kernel).
fn flood() -> (Vec<f64>, Vec<f64>) {
    let src = Netns::new("bsrc");
    let kernel_ns = Netns::new("bkrn");
    let ours_ns = Netns::new("bour");
    let root = BpffsRoot::new();
    veth(&src, "sk0", &kernel_ns, "dk0");
    veth(&src, "so0", &ours_ns, "do0");
    kernel_ns.ip(&["addr", "add", &format!("{SERVICE}/24"), "dev", "dk0"]);
    ours_ns.ip(&["addr", "add", "10.90.0.1/24", "dev", "do0"]);
    for dev in ["sk0", "so0"] {
        src.ip(&["addr", "add", &format!("{SENDER}/24"), "dev", dev]);
    }
    let pin_root = root.0.clone();
    ours_ns.run(move || {
        let mut dp = Datapath::open(&pin_root).expect("datapath");
        let attached = dp
            .attach_responder("do0", AttachMode::Auto)
            .expect("attach");
        let mac = iface::mac("do0").expect("mac");
        dp.responder()
            .announce(IpAddr::V4(SERVICE), attached.ifindex, mac)
            .expect("announce");
        dp.responder()
            .heartbeat(Duration::from_secs(3600))
            .expect("heartbeat");
    });

    let (mut ours, mut kernel) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        kernel.push(src.run(|| flood_round("sk0")));
        ours.push(src.run(|| flood_round("so0")));
    }
    (ours, kernel)
}

/// Floods `dev` with ARP requests for ROUND; returns replies received per second.
fn flood_round(dev: &str) -> f64 {
    let ifindex = iface::index(dev).expect("ifindex");
    let mac = iface::mac(dev).expect("mac");
    let socket = PacketSocket::bind(ifindex, ETH_P_ARP).expect("socket");
    let frame = ArpFrame::request(mac, SENDER, SERVICE).to_bytes();
    let batch: Vec<&[u8]> = (0..64).map(|_| frame.as_slice()).collect();
    let before = rx_packets(dev);
    let start = Instant::now();
    let mut sent = 0usize;
    while start.elapsed() < ROUND {
        sent += socket.send_batch(&batch).unwrap_or(0);
    }
    let elapsed = start.elapsed();
    std::thread::sleep(Duration::from_millis(100));
    let replies = rx_packets(dev) - before;
    let rate = replies as f64 / elapsed.as_secs_f64();
    println!(
        "    {dev}: sent {sent}, replies {replies} ({:.1}% answered), {:.0} replies/s",
        100.0 * replies as f64 / sent.max(1) as f64,
        rate
    );
    rate
}

/// Packets received by `dev` in this thread's namespace.
fn rx_packets(dev: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/thread-self/net/dev").expect("net/dev");
    text.lines()
        .find_map(|l| {
            let (name, rest) = l.split_once(':')?;
            (name.trim() == dev).then(|| rest.split_whitespace().nth(1)?.parse().ok())?
        })
        .expect("interface in /proc/net/dev")
}
