//! `cargo xtask bench liveness`: node liveness between peers (ipam-gossip), simulated.
//!
//! A warm cluster of `IPAM_BENCH_LIVENESS_MEMBERS` members (default 5,000) runs foca with the
//! default timings over a modelled LAN with 1 % loss on every packet, on a virtual clock, in
//! one thread, with a fixed seed (the run repeats exactly):
//!
//! - **quiet**: 30 s with nobody killed. `false_suspicions` counts probes that went
//!   unanswered anyway (each made a member suspect a live one), and the run prints the members
//!   wrongly declared dead; `gossip_bytes_per_node_per_s` is every packet's UDP payload, the
//!   envelope included, over members and seconds.
//! - **kills**: 10 members killed one after another (no goodbye); for each, the time until
//!   every other member declared it dead. `detect_p50_s` and `detect_p99_s` over the kills.
//!
//! The reference printed next to it is the store-lease scheme the project ran before: what the
//! same cluster would cost the store, computed from its timings (no store can be run at this
//! size here). The real part of the benchmark (the failover lab with the gossip in the agents)
//! comes with the agents' gossip transport; until then `cargo xtask bench failover` measures
//! failover through the store.
//!
//! Last line: `detect_p50_s=<f> detect_p99_s=<f> false_suspicions=<n>
//! gossip_bytes_per_node_per_s=<n> members=<n>`.

use std::time::{Duration, Instant};

use ipam_gossip::{
    Keyring, Timing,
    sim::{NetworkModel, Simulation},
};

const QUIET: Duration = Duration::from_secs(30);
const KILLS: usize = 10;
const SEED: u64 = 19;

fn main() {
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

    let started = Instant::now();
    let keyring = Keyring::new(("bench", &[42; 32]), []).expect("a 32-byte key");
    let mut sim = Simulation::warm(members, timing.clone(), network, keyring, SEED);
    println!(
        "warm start: {:.1} s of real time",
        started.elapsed().as_secs_f64()
    );

    // Let the start-up timers spread out before counting.
    sim.run_for(Duration::from_secs(2));
    let quiet_from = sim.now();
    let bytes_before = sim.traffic().bytes;
    let started = Instant::now();
    sim.run_for(QUIET);
    let bytes = sim.traffic().bytes - bytes_before;
    let false_suspicions = sim.suspicions_since(quiet_from);
    let mut wrongly_dead = sim.deaths_since(quiet_from);
    wrongly_dead.sort_by_key(|(_, id)| *id);
    wrongly_dead.dedup_by_key(|(_, id)| *id);
    let bytes_per_node_per_s = bytes as f64 / members as f64 / QUIET.as_secs_f64();
    println!(
        "quiet {:?} ({:.1} s real): {false_suspicions} suspicions, {} members wrongly declared dead, {bytes_per_node_per_s:.0} bytes/node/s",
        QUIET,
        started.elapsed().as_secs_f64(),
        wrongly_dead.len(),
    );

    let mut detect = Vec::new();
    for k in 0..KILLS {
        let victim = (k * 7919 + 13) % members;
        let id = sim.id(victim);
        let killed_at = sim.now();
        sim.kill(victim);
        let declared = sim.run_until(Duration::from_secs(30), Duration::from_millis(10), |s| {
            s.declared_dead_by_all(id, killed_at).is_some()
        });
        // A member that missed the news learns it when it probes the dead one itself: counted
        // as the whole 30 s, so it shows in the p99.
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
    let p50 = percentile(&detect, 0.50);
    let p99 = percentile(&detect, 0.99);

    // The scheme before: each node renews a store lease every 500 ms (node_lease_ms = 1500)
    // and every agent watches every node's lease.
    let lease_writes = members as f64 * 2.0;
    let lease_events = members as f64 * members as f64 * 2.0;
    println!(
        "reference, store leases at this size: {lease_writes:.0} store writes/s, {lease_events:.0} watch events/s; gossip: 0 store writes"
    );
    println!(
        "detect over {KILLS} kills: p50 {p50:.2} s, p99 {p99:.2} s (the p99 of {KILLS} is their maximum)"
    );
    println!(
        "detect_p50_s={p50:.2} detect_p99_s={p99:.2} false_suspicions={false_suspicions} gossip_bytes_per_node_per_s={bytes_per_node_per_s:.0} members={members}"
    );
}

/// The nearest-rank percentile of sorted `values`.
fn percentile(values: &[f64], p: f64) -> f64 {
    let rank = (p * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}
