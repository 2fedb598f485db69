//! `cargo xtask bench arp`: what an ARP answer costs and how many the responder sends per
//! second, each measured side by side with its reference in the same run.
//!
//! 1. ns per answered request: the XDP responder run 1,000,000 times through BPF_PROG_TEST_RUN on
//!    a request for an announced IP (one request per run: a run rewrites the frame into its
//!    reply, so repeating a run in place would measure the pass path of replies instead). The
//!    kernel's own timing per run is used; it includes the timer's cost, shown as the floor:
//!    the same harness on a frame the responder passes at its first check. Between the two, a
//!    request for an IP that is not announced (parsed, looked up, missed) shows what the parse
//!    and the map lookup cost, so the rest is what answering adds. The three are interleaved in
//!    rounds so that drift on a noisy machine hits them alike.
//! 2. replies per second: a flood of identical ARP requests (sendmmsg, batches of 64) from one
//!    namespace over a veth, answered by the kernel (address assigned to the interface) or by our
//!    responder (address announced, responder attached as `auto` picks on veth: TC), alternated
//!    over several rounds. Replies are counted on the sender's interface.
//! 3. what the eBPF log statements cost: a malformed request that reaches a debug statement, and
//!    the answered request, on a responder loaded with logs off and one loaded at debug level.
//! 4. what the responder adds to the TCP traffic of an interface it is attached to when no
//!    hand-over runs (docs/datapath.md, "Passed on"): a TCP segment to the announced IP, parsed
//!    and looked up in `L2_HANDOVER`, next to the floor.
//!
//! Last line: `arp_ns_per_reply=<f> arp_harness_floor_ns=<f> arp_rate_ratio_vs_kernel=<f>
//! tcp_segment_pass_ns=<f>`.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use aya::programs::{TestRun, TestRunOptions};
use ipam_daemon::net::{
    frames::{ArpFrame, ETH_P_ARP},
    packet_socket::PacketSocket,
};
use ipam_datapath::{AttachMode, Datapath, EbpfLogLevel};
use ipam_netlink::iface;
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
            .map(std::num::NonZero::get)
            .unwrap_or(0)
    );
    let PerRun {
        reply: reply_ns,
        miss: miss_ns,
        floor: floor_ns,
        malformed_log_off,
        malformed_log_debug,
        reply_log_debug,
        tcp_segment: tcp_ns,
    } = ns_per_reply();
    println!("BPF_PROG_TEST_RUN, {RUNS} runs each (kernel-measured time per run):");
    println!("  request for an announced IP, answered: {reply_ns:.1} ns");
    println!("  request for an IP not announced (parse + lookup, passed): {miss_ns:.1} ns");
    println!("  non-ARP frame, passed at the first check (timer floor): {floor_ns:.1} ns");
    println!(
        "  TCP segment to the announced IP, no hand-over (parse + the gate, passed): \
         {tcp_ns:.1} ns ({:.1} ns above the floor)",
        tcp_ns - floor_ns
    );
    println!(
        "  above the floor: {:.1} ns, of which parse + lookup {:.1} ns and answering {:.1} ns",
        reply_ns - floor_ns,
        miss_ns - floor_ns,
        reply_ns - miss_ns
    );
    println!("eBPF log statements (aya-log), level chosen at load:");
    println!(
        "  malformed ARP (reaches a debug statement): {malformed_log_off:.1} ns at level off, \
         {malformed_log_debug:.1} ns at level debug"
    );
    println!(
        "  answered request (no statement on the path): {reply_ns:.1} ns at level off, \
         {reply_log_debug:.1} ns at level debug"
    );

    let (ours, kernel) = flood();
    let ratio = median(&ours) / median(&kernel);
    println!(
        "ARP flood over a veth, {ROUNDS} alternating rounds of {} s, replies/s:",
        ROUND.as_secs()
    );
    println!("  kernel (address on the interface): {}", list(&kernel));
    println!("  our responder (TC, auto on veth):   {}", list(&ours));
    println!("  median ratio ours/kernel: {ratio:.2}");
    println!(
        "arp_ns_per_reply={reply_ns:.1} arp_harness_floor_ns={floor_ns:.1} \
         arp_rate_ratio_vs_kernel={ratio:.2} tcp_segment_pass_ns={tcp_ns:.1}"
    );
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

/// Mean kernel-measured ns per run of each frame kind.
struct PerRun {
    reply: f64,
    miss: f64,
    floor: f64,
    /// A malformed ARP message (hardware length 7), which reaches a debug log statement: with
    /// the programs loaded at level off (statements removed) and at level debug.
    malformed_log_off: f64,
    malformed_log_debug: f64,
    /// The answered request on the datapath loaded at level debug (no statement on that path).
    reply_log_debug: f64,
    /// A TCP segment (ACK) to the announced IP with no hand-over running: passed.
    tcp_segment: f64,
}

/// A responder loaded at `level`, announcing SERVICE on loopback (where BPF_PROG_TEST_RUN says
/// frames arrive), with a heartbeat that stays fresh for the whole benchmark.
fn responder(root: &BpffsRoot, level: EbpfLogLevel) -> Datapath {
    let mut dp = Datapath::open_with_log(&root.0, level).expect("load datapath");
    dp.responder()
        .announce(IpAddr::V4(SERVICE), 1, [2, 0, 0, 0, 0, 0x10])
        .expect("announce");
    dp.heartbeat(Duration::from_secs(3600)).expect("heartbeat");
    dp
}

/// Mean kernel-measured time of `runs` single runs of the XDP responder on `frame`.
fn time(dp: &mut Datapath, frame: &[u8], want: u32, runs: u32) -> Duration {
    let mut out = vec![0u8; 128];
    let mut total = Duration::ZERO;
    for _ in 0..runs {
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
    total
}

fn ns_per_reply() -> PerRun {
    let (root_off, root_debug) = (BpffsRoot::new(), BpffsRoot::new());
    let mut off = responder(&root_off, EbpfLogLevel::Off);
    let mut debug = responder(&root_debug, EbpfLogLevel::Debug);
    let mut debug_log = debug.take_log();
    let request = ArpFrame::request([2, 0, 0, 0, 0, 0x20], SENDER, SERVICE).to_bytes();
    let mut other = request.clone();
    // IEEE 802 local experimental: no parser of the responder looks past it.
    other[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    let tcp_segment = {
        let builder =
            etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 0x20], [2, 0, 0, 0, 0, 0x10])
                .ipv4(SENDER.octets(), SERVICE.octets(), 64)
                .tcp(40_000, 80, 1000, 64_000)
                .ack(1);
        let payload = b"GET / HTTP/1.1\r\n\r\n";
        let mut frame = Vec::with_capacity(builder.size(payload.len()));
        builder.write(&mut frame, payload).expect("a TCP segment");
        frame
    };
    let unannounced =
        ArpFrame::request([2, 0, 0, 0, 0, 0x20], SENDER, Ipv4Addr::new(10, 90, 0, 101)).to_bytes();
    let mut malformed = request.clone();
    malformed[18] = 7; // hardware address length
    const XDP_PASS: u32 = 2;
    const XDP_TX: u32 = 3;

    // Interleaved slices: drift on a noisy machine hits every kind alike.
    const SLICES: u32 = 10;
    let per_slice = RUNS / SLICES;
    let mut totals = [Duration::ZERO; 7];
    for _ in 0..SLICES {
        totals[0] += time(&mut off, &request, XDP_TX, per_slice);
        totals[1] += time(&mut off, &unannounced, XDP_PASS, per_slice);
        totals[2] += time(&mut off, &other, XDP_PASS, per_slice);
        totals[3] += time(&mut off, &malformed, XDP_PASS, per_slice);
        // The log's ring buffer (128 KiB) is drained between slices, not during one: once it is
        // full the remaining records of a slice are dropped at reserve, as in a flood.
        totals[4] += time(&mut debug, &malformed, XDP_PASS, per_slice);
        totals[5] += time(&mut debug, &request, XDP_TX, per_slice);
        totals[6] += time(&mut off, &tcp_segment, XDP_PASS, per_slice);
        if let Some(log) = &mut debug_log {
            log.flush();
        }
    }
    let per_run = |t: Duration| t.as_nanos() as f64 / f64::from(RUNS);
    PerRun {
        reply: per_run(totals[0]),
        miss: per_run(totals[1]),
        floor: per_run(totals[2]),
        malformed_log_off: per_run(totals[3]),
        malformed_log_debug: per_run(totals[4]),
        reply_log_debug: per_run(totals[5]),
        tcp_segment: per_run(totals[6]),
    }
}

/// Replies/s per round: (ours, kernel).
fn flood() -> (Vec<f64>, Vec<f64>) {
    let src = Netns::new("bsrc");
    let kernel_ns = Netns::new("bkrn");
    let ours_ns = Netns::new("bour");
    let root = BpffsRoot::new();
    veth(&src, "sk0", &kernel_ns, "dk0");
    veth(&src, "so0", &ours_ns, "do0");
    kernel_ns.add_address("dk0", &format!("{SERVICE}/24"));
    ours_ns.add_address("do0", "10.90.0.1/24");
    for dev in ["sk0", "so0"] {
        src.add_address(dev, &format!("{SENDER}/24"));
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
        dp.heartbeat(Duration::from_secs(3600)).expect("heartbeat");
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
