//! `cargo xtask bench liveness`: node liveness between peers (ipam-gossip), simulated at scale
//! and real in the failover lab.
//!
//! **Simulated.** A warm cluster of `IPAM_BENCH_LIVENESS_MEMBERS` members (default 5,000) runs foca with the
//! default timings over a modelled LAN with 1 % loss on every packet, on a virtual clock, in
//! one thread, with a fixed seed (the run repeats exactly):
//!
//! - **quiet**: 30 s with nobody killed. `false_suspicions` counts probes that went
//!   unanswered anyway (each made a member suspect a live one), and the run prints the members
//!   wrongly declared dead; `gossip_bytes_per_node_per_s` is every packet's UDP payload, the
//!   envelope included, over members and seconds; `hellos_at_rest` the hellos said in those
//!   30 s (a member unheard for a probe period asks two live members for an answer).
//! - **kills**: 10 members killed one after another (no goodbye); for each, the time until
//!   every other member declared it dead. `detect_p50_s` and `detect_max_s` (the slowest of
//!   the ten: ten kills make no p99) over the kills.
//! - **sizes**: the same quiet traffic and 5 kills at 500 and 1,000 members, with the same
//!   timings in the same run, so whether traffic and detection stay flat with the cluster's
//!   size is measured, not remembered (`..._at_500`, `..._at_1000`).
//!
//! The reference printed next to it is the store-lease scheme: what the same cluster would cost
//! the store, computed from its timings (no store can be run at this size here).
//!
//! **Real.** The failover lab (`cargo xtask lab failover`: real etcd, an operator, three agents
//! and a client on one segment, the client requesting every 50 ms), its agents gossiping with
//! the default timings and the lease renewed every 10 s (the default):
//! - `failover_s`: median over 5 power losses of the node answering for the service IP (agent
//!   SIGKILLed, link cut) of the time until the client's requests are answered again;
//! - `failed_requests_pct`: failed requests from 5 s before to 30 s after each loss;
//! - `store_writes_per_node_per_s`: every write the nodes make at rest over 60 s, counted by a
//!   watch on every key of the store, per node and second (the operator's own lease renewal is
//!   one writer whatever the cluster's size, and printed apart).
//!
//! The same lab with store leases (the scheme without `[gossip]`) runs next to it as the
//! reference: 3 power losses and 20 s of writes at rest.
//!
//! `IPAM_BENCH_LIVENESS_PARTS=sim` or `=real` runs one part. Last line: `detect_p50_s=<f>
//! detect_max_s=<f> false_suspicions=<n> gossip_bytes_per_node_per_s=<n> members=<n>
//! hellos_at_rest=<n> detect_p50_s_at_500=<f> gossip_bytes_per_node_per_s_at_500=<n> (and `_at_1000`)
//! failover_s=<f> failed_requests_pct=<f> store_writes_per_node_per_s=<f>`.

use std::time::{Duration, Instant};

use ipam_gossip::{
    Keyring, Timing,
    sim::{NetworkModel, Simulation},
};
use ipam_tests::failover::{FailoverRig, KillFigures};

const QUIET: Duration = Duration::from_secs(30);
const KILLS: usize = 10;
/// Kills at each of the smaller sizes.
const SIZE_KILLS: usize = 5;
const SEED: u64 = 19;
const LAB_KILLS: usize = 5;
const REFERENCE_KILLS: usize = 3;
const BEFORE: Duration = Duration::from_secs(5);
const AFTER: Duration = Duration::from_secs(30);
/// The lab's grace period: a third of it is the default renewal, 10 s.
const LAB_GRACE_MS: u64 = 30_000;

fn main() {
    let parts = std::env::var("IPAM_BENCH_LIVENESS_PARTS").unwrap_or_else(|_| "sim,real".into());
    let sim = parts.contains("sim").then(simulated);
    let real = parts.contains("real").then(real);
    let mut last = Vec::new();
    if let Some(s) = sim {
        last.push(s);
    }
    if let Some(r) = real {
        last.push(r);
    }
    println!("{}", last.join(" "));
}

/// The failover lab with gossip, then with store leases; the headline figures.
fn real() -> String {
    println!("\nthe failover lab, agents gossiping (lease renewed every 10 s)");
    let mut rig = FailoverRig::start_gossip("blg", LAB_GRACE_MS);
    std::thread::sleep(Duration::from_secs(3));
    let (per_node, operator) = rig.writes_at_rest(Duration::from_secs(60));
    let gossip = rig.measure_kills(LAB_KILLS, BEFORE, AFTER);
    drop(rig);

    println!("\nreference: the same lab with store leases (node_lease_ms = 1500)");
    let mut reference = FailoverRig::start("bll");
    std::thread::sleep(Duration::from_secs(3));
    let (reference_per_node, _) = reference.writes_at_rest(Duration::from_secs(20));
    let leases: KillFigures = reference.measure_kills(REFERENCE_KILLS, BEFORE, AFTER);
    drop(reference);

    println!(
        "\n{:<14} {:>11} {:>16} {:>28}",
        "liveness", "failover_s", "failed_requests", "store writes/node/s at rest"
    );
    for (name, f, w) in [
        ("gossip", gossip, per_node),
        ("store leases", leases, reference_per_node),
    ] {
        println!(
            "{name:<14} {:>11.2} {:>15.2}% {w:>28.3}",
            f.failover_s, f.failed_requests_pct
        );
    }
    println!("the operator's lease (one writer per cluster): {operator:.2} writes/s");
    format!(
        "failover_s={:.2} failed_requests_pct={:.2} store_writes_per_node_per_s={per_node:.3}",
        gossip.failover_s, gossip.failed_requests_pct
    )
}

/// What one simulated size gave.
struct SizeFigures {
    bytes_per_node_per_s: f64,
    false_suspicions: usize,
    /// Hellos said at rest (a member unheard for a probe period asking for an answer).
    hellos: u64,
    /// Seconds until every other member declared a killed one dead, sorted.
    detect: Vec<f64>,
}

/// The simulated cluster; the headline figures, then the same at two smaller sizes.
fn simulated() -> String {
    let members: usize = std::env::var("IPAM_BENCH_LIVENESS_MEMBERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let timing = Timing::default();
    let network = NetworkModel {
        loss: 0.01,
        ..NetworkModel::default()
    };
    println!(
        "{members} members, 1% loss, latency {:?} + up to {:?} jitter",
        network.latency, network.jitter
    );
    println!("timings: {timing:?}");
    let main = simulate(members, KILLS, &timing, network.clone());
    let (p50, max) = (
        percentile(&main.detect, 0.50),
        percentile(&main.detect, 1.0),
    );

    // The scheme before: each node renews a store lease every 500 ms (node_lease_ms = 1500)
    // and every agent watches every node's lease.
    let lease_writes = members as f64 * 2.0;
    let lease_events = members as f64 * members as f64 * 2.0;
    println!(
        "reference, store leases at this size: {lease_writes:.0} store writes/s, {lease_events:.0} watch events/s; gossip: 0 store writes"
    );
    println!(
        "detect over {KILLS} kills: p50 {p50:.2} s, slowest {max:.2} s (ten kills make no p99)"
    );
    let mut line = format!(
        "detect_p50_s={p50:.2} detect_max_s={max:.2} false_suspicions={} gossip_bytes_per_node_per_s={:.0} members={members} hellos_at_rest={}",
        main.false_suspicions, main.bytes_per_node_per_s, main.hellos
    );
    println!("by size, same timings, same run:");
    println!(
        "  {members:>5} members: {:.0} bytes/node/s, detect p50 {p50:.2} s",
        main.bytes_per_node_per_s
    );
    for size in [500, 1000] {
        let figures = simulate(size, SIZE_KILLS, &timing, network.clone());
        let p50 = percentile(&figures.detect, 0.50);
        println!(
            "  {size:>5} members: {:.0} bytes/node/s, detect p50 {p50:.2} s",
            figures.bytes_per_node_per_s
        );
        line.push_str(&format!(
            " detect_p50_s_at_{size}={p50:.2} gossip_bytes_per_node_per_s_at_{size}={:.0}",
            figures.bytes_per_node_per_s
        ));
    }
    line
}

/// A warm cluster of `members`: `QUIET` at rest, then `kills` members killed one by one.
fn simulate(members: usize, kills: usize, timing: &Timing, network: NetworkModel) -> SizeFigures {
    let started = Instant::now();
    let keyring = Keyring::new(("bench", &[42; 32]), []).expect("a 32-byte key");
    let mut sim = Simulation::warm(members, timing.clone(), network, keyring, SEED);
    println!(
        "{members} members: warm start {:.1} s of real time",
        started.elapsed().as_secs_f64()
    );

    // Let the start-up timers spread out before counting.
    sim.run_for(Duration::from_secs(2));
    let quiet_from = sim.now();
    let bytes_before = sim.traffic().bytes;
    let hellos_said = |sim: &Simulation| -> u64 {
        (0..sim.len())
            .filter_map(|m| sim.peer(m))
            .map(|p| p.stats().hellos)
            .sum()
    };
    let hellos_before = hellos_said(&sim);
    let started = Instant::now();
    sim.run_for(QUIET);
    let bytes = sim.traffic().bytes - bytes_before;
    let hellos = hellos_said(&sim) - hellos_before;
    let false_suspicions = sim.suspicions_since(quiet_from);
    let mut wrongly_dead = sim.deaths_since(quiet_from);
    wrongly_dead.sort_by_key(|(_, id)| *id);
    wrongly_dead.dedup_by_key(|(_, id)| *id);
    let bytes_per_node_per_s = bytes as f64 / members as f64 / QUIET.as_secs_f64();
    println!(
        "quiet {:?} ({:.1} s real): {false_suspicions} suspicions, {} members wrongly declared dead, {bytes_per_node_per_s:.0} bytes/node/s, {hellos} hellos",
        QUIET,
        started.elapsed().as_secs_f64(),
        wrongly_dead.len(),
    );

    let mut detect = Vec::new();
    for k in 0..kills {
        let victim = (k * 7919 + 13) % members;
        let id = sim.id(victim);
        let killed_at = sim.now();
        sim.kill(victim);
        let declared = sim.run_until(Duration::from_secs(30), Duration::from_millis(10), |s| {
            s.declared_dead_by_all(id, killed_at).is_some()
        });
        // A member that missed the news learns it when it probes the dead one itself: counted
        // as the whole 30 s, so it shows in the slowest.
        let took = match sim.declared_dead_by_all(id, killed_at) {
            Some(at) if declared => (at - killed_at).as_secs_f64(),
            _ => 30.0,
        };
        println!(
            "kill {}: {id} declared dead by all {} others after {took:.2} s{}",
            k + 1,
            members - k - 1,
            if declared {
                ""
            } else {
                " (not all within 30 s)"
            }
        );
        detect.push(took);
        sim.run_for(Duration::from_millis(500));
    }
    detect.sort_by(f64::total_cmp);
    SizeFigures {
        bytes_per_node_per_s,
        false_suspicions,
        hellos,
        detect,
    }
}

/// The nearest-rank percentile of sorted `values`.
fn percentile(values: &[f64], p: f64) -> f64 {
    let rank = (p * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}
