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
//!    as far as the hand-over gate, next to the floor.
//! 5. the reply's parts, each a frame that stops at one step: the harness with an empty XDP
//!    program (`r0 = XDP_PASS; exit`, loaded here), our program passing at its first check, a
//!    gratuitous request (parsed and checked, passed before the lookup), a request for an IP not
//!    announced (+ the lookup), a request for the announced IP unicast to another station (+
//!    the lookup's hit: the key compared, the entry read), the same broadcast on a responder
//!    whose liveness gate is shut (+ the gate and its counter), and the answer. Each is timed cold (one run per syscall, as
//!    the reply must be) and, for the frames a run leaves unchanged, warm as well (`repeat`
//!    in place): the difference is what cold caches cost, which the machine's other load
//!    decides more than the program does. Beside them, the lookup floor: the harness and one
//!    lookup that finds its key in a map made like the responder's, in a program written here;
//!    no answer can cost less than that.
//!
//! Last line: `arp_ns_per_reply=<f> arp_harness_floor_ns=<f> arp_rate_ratio_vs_kernel=<f>
//! tcp_segment_pass_ns=<f> arp_empty_prog_ns=<f> arp_parse_ns=<f> arp_lookup_ns=<f>
//! arp_hit_ns=<f> arp_gate_ns=<f> arp_reply_above_floor_ns=<f> tcp_segment_above_floor_ns=<f>
//! arp_warm_floor_ns=<f> arp_warm_lookup_ns=<f> arp_warm_gate_ns=<f> arp_lookup_floor_ns=<f>
//! arp_lookup_floor_above_empty_ns=<f>` (the parts are cumulative times per run, like the
//! reply).

use std::{
    net::{IpAddr, Ipv4Addr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use aya::programs::{TestRun, TestRunOptions};
use ipam_common::l2::{L2_RESPONDER_CAPACITY, ResponderKey};
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
        empty: empty_ns,
        parse: parse_ns,
        gate: gate_ns,
        hit: hit_ns,
        lookup_floor: lookup_floor_ns,
        warm,
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
    println!(
        "the reply's parts, ns per run: cold (one run per syscall, as above) and warm \
         ({WARM_REPEAT} runs in place per syscall, frames a run leaves unchanged):"
    );
    println!(
        "  {:<52} {:>7} {:>7} {:>17}",
        "step", "cold", "warm", "cold above floor"
    );
    let row = |step: &str, cold: f64, warm: Option<f64>| {
        let warm = warm.map_or_else(|| "-".to_owned(), |w| format!("{w:.1}"));
        println!(
            "  {step:<52} {cold:>7.1} {warm:>7} {:>17.1}",
            cold - floor_ns
        );
    };
    row(
        "harness alone: an empty XDP program",
        empty_ns,
        Some(warm.empty),
    );
    row(
        "our program, passed at the first check (the floor)",
        floor_ns,
        Some(warm.floor),
    );
    row(
        "+ parse: gratuitous request, passed before the lookup",
        parse_ns,
        Some(warm.parse),
    );
    row(
        "+ lookup: request for an IP not announced",
        miss_ns,
        Some(warm.miss),
    );
    row(
        "+ hit: announced IP, unicast to another station",
        hit_ns,
        Some(warm.hit),
    );
    row(
        "+ gate: announced IP, liveness gate shut",
        gate_ns,
        Some(warm.gate),
    );
    row("+ answer: request answered (the reply)", reply_ns, None);
    row(
        "TCP segment, no hand-over (parse + hand-over gate)",
        tcp_ns,
        Some(warm.tcp),
    );
    row(
        "lookup floor: harness + one map lookup that hits",
        lookup_floor_ns,
        Some(warm.lookup_floor),
    );
    let lookup_cost = lookup_floor_ns - empty_ns;
    println!(
        "  the reply is {:.1} ns above the floor; the kernel's lookup of a key in a map like the \
         responder's costs {lookup_cost:.1} ns of that by itself (lookup floor minus the empty \
         program; warm {:.1}): the program's own work is {:.1} ns",
        reply_ns - floor_ns,
        warm.lookup_floor - warm.empty,
        reply_ns - floor_ns - lookup_cost
    );
    println!(
        "  cold minus warm (what cold caches cost): harness {:.1}, floor {:.1}, lookup {:.1}, \
         hit {:.1}, gate {:.1} ns",
        empty_ns - warm.empty,
        floor_ns - warm.floor,
        miss_ns - warm.miss,
        hit_ns - warm.hit,
        gate_ns - warm.gate
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
         arp_rate_ratio_vs_kernel={ratio:.2} tcp_segment_pass_ns={tcp_ns:.1} \
         arp_empty_prog_ns={empty_ns:.1} arp_parse_ns={parse_ns:.1} arp_lookup_ns={miss_ns:.1} \
         arp_hit_ns={hit_ns:.1} arp_gate_ns={gate_ns:.1} arp_reply_above_floor_ns={:.1} \
         tcp_segment_above_floor_ns={:.1} arp_warm_floor_ns={:.1} arp_warm_lookup_ns={:.1} \
         arp_warm_gate_ns={:.1} arp_lookup_floor_ns={lookup_floor_ns:.1} \
         arp_lookup_floor_above_empty_ns={lookup_cost:.1}",
        reply_ns - floor_ns,
        tcp_ns - floor_ns,
        warm.floor,
        warm.miss,
        warm.gate
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
    /// The harness with an empty XDP program.
    empty: f64,
    /// A gratuitous request: parsed and checked, passed before the lookup.
    parse: f64,
    /// A request for the announced IP on a responder whose liveness gate is shut.
    gate: f64,
    /// A request for the announced IP unicast to another station: found, passed before the gate.
    hit: f64,
    /// The harness and one lookup that finds its key in a map like the responder's.
    lookup_floor: f64,
    /// The frames a run leaves unchanged, timed `WARM_REPEAT` runs per syscall.
    warm: Warm,
}

/// Mean ns per run with warm caches (`repeat` in place).
#[derive(Default)]
struct Warm {
    empty: f64,
    floor: f64,
    parse: f64,
    miss: f64,
    lookup_floor: f64,
    hit: f64,
    gate: f64,
    tcp: f64,
}

const WARM_REPEAT: u32 = 10_000;

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

/// The kernel-measured mean ns per run of one syscall running the XDP responder `repeat`
/// times in place on `frame`.
fn time_warm(dp: &mut Datapath, frame: &[u8], want: u32, repeat: u32) -> f64 {
    let mut out = vec![0u8; 128];
    let r = dp
        .responder_xdp()
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            repeat,
            ..TestRunOptions::new()
        })
        .expect("test run");
    assert_eq!(r.return_value, want, "unexpected verdict");
    r.duration.as_nanos() as f64
}

/// Total kernel-measured time of `runs` single runs of the XDP responder on `frame`.
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
    let root_shut = BpffsRoot::new();
    let mut shut = responder(&root_shut, EbpfLogLevel::Off);
    shut.silence().expect("shut the liveness gate");
    let empty = RawXdp::empty();
    let lookup_floor = RawXdp::lookup_hit(&ResponderKey::v4(SERVICE.octets(), 1));
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
    // Unicast to another station: the lookup finds the IP, then the frame is passed before the
    // liveness gate.
    let mut elsewhere = request.clone();
    elsewhere[..6].copy_from_slice(&[2, 0, 0, 0, 0, 0x30]);
    // Sender IP == target IP: an announcement of the sender's own, passed before the lookup.
    let gratuitous = ArpFrame::request([2, 0, 0, 0, 0, 0x20], SERVICE, SERVICE).to_bytes();

    // Interleaved slices: drift on a noisy machine hits every kind alike.
    const SLICES: u32 = 10;
    let per_slice = RUNS / SLICES;
    let mut totals = [Duration::ZERO; 12];
    let mut warm = Warm::default();
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
        totals[7] += empty.time(&other, per_slice);
        totals[8] += time(&mut off, &gratuitous, XDP_PASS, per_slice);
        totals[9] += time(&mut shut, &request, XDP_PASS, per_slice);
        totals[10] += time(&mut off, &elsewhere, XDP_PASS, per_slice);
        totals[11] += lookup_floor.time(&other, per_slice);
        if let Some(log) = &mut debug_log {
            log.flush();
        }
        let slices = f64::from(SLICES);
        warm.empty += empty.time_warm(&other, WARM_REPEAT) / slices;
        warm.floor += time_warm(&mut off, &other, XDP_PASS, WARM_REPEAT) / slices;
        warm.parse += time_warm(&mut off, &gratuitous, XDP_PASS, WARM_REPEAT) / slices;
        warm.miss += time_warm(&mut off, &unannounced, XDP_PASS, WARM_REPEAT) / slices;
        warm.lookup_floor += lookup_floor.time_warm(&other, WARM_REPEAT) / slices;
        warm.hit += time_warm(&mut off, &elsewhere, XDP_PASS, WARM_REPEAT) / slices;
        warm.gate += time_warm(&mut shut, &request, XDP_PASS, WARM_REPEAT) / slices;
        warm.tcp += time_warm(&mut off, &tcp_segment, XDP_PASS, WARM_REPEAT) / slices;
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
        empty: per_run(totals[7]),
        parse: per_run(totals[8]),
        gate: per_run(totals[9]),
        hit: per_run(totals[10]),
        lookup_floor: per_run(totals[11]),
        warm,
    }
}

/// An XDP program written here in eBPF instructions and loaded with the bpf syscall, for the
/// floors the responder is measured against: the harness alone (`r0 = XDP_PASS; exit`) and the
/// harness plus the one thing every answer needs, a lookup that finds a key in a map made like
/// the responder's (`L2_RESPONDER`: per-CPU hash, 20-byte key, 16-byte value, same capacity).
struct RawXdp {
    prog: OwnedFd,
    /// The map the program looks up, if any (kept open for the program's life).
    _map: Option<OwnedFd>,
}

/// `union bpf_attr` for `BPF_PROG_LOAD`, as far as the fields used.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// `union bpf_attr` for `BPF_MAP_CREATE`, as far as the fields used.
#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// `union bpf_attr` for `BPF_MAP_UPDATE_ELEM`.
#[repr(C)]
struct MapUpdateAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `union bpf_attr` for `BPF_PROG_TEST_RUN`.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// The bpf syscall; its result, or the error it set.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a `bpf_attr` prefix for `cmd`, and what it points at outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr),
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned_fd(fd: libc::c_long) -> OwnedFd {
    // SAFETY: a new descriptor the kernel just returned, owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).expect("a descriptor")) }
}

/// One eBPF instruction: opcode, registers, offset, immediate.
const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    code as u64
        | ((dst | (src << 4)) as u64) << 8
        | (off as u16 as u64) << 16
        | (imm as u32 as u64) << 32
}

const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;
/// `r0 = XDP_PASS; exit`
const RETURN_PASS: [u64; 2] = [insn(0xb7, 0, 0, 0, XDP_PASS as i32), insn(0x95, 0, 0, 0, 0)];

impl RawXdp {
    fn load(insns: &[u64], map: Option<OwnedFd>) -> Self {
        const BPF_PROG_LOAD: libc::c_long = 5;
        const BPF_PROG_TYPE_XDP: u32 = 6;
        let license = c"GPL";
        let mut name = [0u8; 16];
        name[..9].copy_from_slice(b"bench_raw");
        let mut attr = ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_XDP,
            insn_cnt: u32::try_from(insns.len()).expect("a short program"),
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 0,
            log_size: 0,
            log_buf: 0,
            kern_version: 0,
            prog_flags: 0,
            prog_name: name,
        };
        let fd = bpf(BPF_PROG_LOAD, &mut attr).expect("load a raw XDP program");
        Self {
            prog: owned_fd(fd),
            _map: map,
        }
    }

    /// The harness alone.
    fn empty() -> Self {
        Self::load(&RETURN_PASS, None)
    }

    /// The harness and one lookup that finds `key` (the responder's key of SERVICE on ifindex
    /// 1) in a map made like `L2_RESPONDER`, its value read.
    fn lookup_hit(key: &ResponderKey) -> Self {
        const BPF_MAP_CREATE: libc::c_long = 0;
        const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
        const BPF_MAP_TYPE_PERCPU_HASH: u32 = 5;
        const VALUE_SIZE: usize = 16;
        let mut create = MapCreateAttr {
            map_type: BPF_MAP_TYPE_PERCPU_HASH,
            key_size: std::mem::size_of::<ResponderKey>() as u32,
            value_size: VALUE_SIZE as u32,
            max_entries: L2_RESPONDER_CAPACITY as u32,
            map_flags: 0,
        };
        let map =
            owned_fd(bpf(BPF_MAP_CREATE, &mut create).expect("create the lookup floor's map"));
        let map_fd = map.as_raw_fd();
        // A per-CPU value is given for every possible CPU.
        let values = vec![0u8; VALUE_SIZE * possible_cpus()];
        let mut update = MapUpdateAttr {
            map_fd: u32::try_from(map_fd).expect("fd"),
            _pad: 0,
            key: std::ptr::from_ref(key) as u64,
            value: values.as_ptr() as u64,
            flags: 0,
        };
        bpf(BPF_MAP_UPDATE_ELEM, &mut update).expect("fill the lookup floor's map");
        // The key's five words on the stack, as the responder builds it.
        // SAFETY: `ResponderKey` is repr(C), 20 bytes, 4-aligned, no padding.
        let words: [u32; 5] = unsafe { std::mem::transmute_copy(key) };
        let mut insns = Vec::new();
        for (i, w) in words.iter().enumerate() {
            // *(u32 *)(r10 - 20 + 4i) = w
            insns.push(insn(0x62, 10, 0, -20 + 4 * i as i16, *w as i32));
        }
        insns.extend([
            insn(0xbf, 2, 10, 0, 0),     // r2 = r10
            insn(0x07, 2, 0, 0, -20),    // r2 += -20
            insn(0x18, 1, 1, 0, map_fd), // r1 = the map (BPF_PSEUDO_MAP_FD)
            0,
            insn(0x85, 0, 0, 0, 1), // call bpf_map_lookup_elem
            insn(0x15, 0, 0, 1, 0), // if r0 == 0 goto +1
            insn(0x79, 1, 0, 8, 0), // r1 = *(u64 *)(r0 + 8): the value read
        ]);
        insns.extend(RETURN_PASS);
        Self::load(&insns, Some(map))
    }

    /// One syscall running the program `repeat` times on `frame`: the kernel's mean ns per run.
    fn run(&self, frame: &[u8], repeat: u32) -> u32 {
        const BPF_PROG_TEST_RUN: libc::c_long = 10;
        let mut out = [0u8; 128];
        let mut attr = TestRunAttr {
            prog_fd: u32::try_from(self.prog.as_raw_fd()).expect("fd"),
            data_size_in: u32::try_from(frame.len()).expect("frame length"),
            data_size_out: out.len() as u32,
            data_in: frame.as_ptr() as u64,
            data_out: out.as_mut_ptr() as u64,
            repeat,
            ..TestRunAttr::default()
        };
        bpf(BPF_PROG_TEST_RUN, &mut attr).expect("test run of a raw program");
        assert_eq!(attr.retval, XDP_PASS, "unexpected verdict");
        attr.duration
    }

    /// Total kernel-measured time of `runs` single runs on `frame`.
    fn time(&self, frame: &[u8], runs: u32) -> Duration {
        (0..runs)
            .map(|_| Duration::from_nanos(u64::from(self.run(frame, 1))))
            .sum()
    }

    /// The kernel-measured mean ns per run of one syscall running it `repeat` times.
    fn time_warm(&self, frame: &[u8], repeat: u32) -> f64 {
        f64::from(self.run(frame, repeat))
    }
}

/// The kernel's count of possible CPUs (what per-CPU map values are sized by).
fn possible_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").expect("possible CPUs");
    text.trim()
        .split(',')
        .map(|range| match range.split_once('-') {
            Some((a, b)) => b.parse::<usize>().expect("cpu") - a.parse::<usize>().expect("cpu") + 1,
            None => 1,
        })
        .sum()
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
