//! The trade-off between detection time and robustness, for a few timings: the table in
//! docs/liveness.md. `cargo run --release -p ipam-gossip --example timing_sweep`.
//!
//! Per timing and seed (`SWEEP_SEEDS`, default 4): 50 members, one of them on a link with 20 % loss and 50 to
//! 100 ms of delay, for 60 s: suspicions, flaps (a member declared dead while alive, back as its
//! next generation) and members left declared dead. Then 3 members, 5 kills
//! of one member (restarted in between): time until both others declared it dead.

use std::time::Duration;

use ipam_gossip::{
    Event, Keyring, Timing,
    sim::{NetworkModel, Simulation},
};

/// (probe period, probe rtt, suspicion) in ms, and indirect probes.
const TIMINGS: [(u64, u64, u64, usize); 6] = [
    (200, 60, 400, 4),
    (200, 60, 1000, 4),
    (400, 150, 800, 4),
    (200, 30, 400, 6),
    (200, 30, 400, 8),
    (200, 30, 1000, 8),
];

fn main() {
    let keyring = Keyring::new(("sweep", &[7; 32]), []).expect("a 32-byte key");
    let seeds: u64 = std::env::var("SWEEP_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    println!(
        "| period / rtt / suspicion (ms), indirect probes | suspicions | flaps (rejoins) | wrongly dead | 3-member detection, median / max (s) |"
    );
    println!("|---|---|---|---|---|");
    for (period, rtt, suspicion, indirect) in TIMINGS {
        let timing = Timing {
            probe_period: Duration::from_millis(period),
            probe_rtt: Duration::from_millis(rtt),
            suspect_to_down: Duration::from_millis(suspicion),
            indirect_probes: indirect,
            ..Timing::default()
        };
        let (mut wrongly_dead, mut suspicions, mut flaps, mut detect) = (0, 0, 0, Vec::new());
        for seed in 0..seeds {
            let mut sim = Simulation::warm(
                50,
                timing.clone(),
                NetworkModel::default(),
                keyring.clone(),
                seed,
            );
            sim.impair(
                7,
                NetworkModel {
                    latency: Duration::from_millis(50),
                    jitter: Duration::from_millis(50),
                    loss: 0.2,
                },
            );
            sim.run_for(Duration::from_secs(60));
            let mut dead = sim.deaths_since(Duration::ZERO);
            dead.sort_by_key(|(_, id)| *id);
            dead.dedup_by_key(|(_, id)| *id);
            wrongly_dead += dead.len();
            suspicions += sim.suspicions_since(Duration::ZERO);
            // Declared dead while alive, and back as the next generation: foca reports a
            // rename, not a death, so a flap shows as a rejoin.
            flaps += sim
                .reports()
                .iter()
                .filter(|r| matches!(r.event, Event::Rejoined(_)))
                .count();
            detect.extend(kills(&timing, &keyring, seed));
        }
        detect.sort_by(f64::total_cmp);
        println!(
            "| {period} / {rtt} / {suspicion}, {indirect} | {suspicions} | {flaps} | {wrongly_dead} | {:.2} / {:.2} |",
            detect[detect.len() / 2],
            detect[detect.len() - 1]
        );
    }
}

/// Seconds until a killed member of three is declared dead by the other two, five times.
fn kills(timing: &Timing, keyring: &Keyring, seed: u64) -> Vec<f64> {
    let mut sim = Simulation::warm(
        3,
        timing.clone(),
        NetworkModel::default(),
        keyring.clone(),
        seed,
    );
    sim.run_for(Duration::from_secs(2));
    let mut took = Vec::new();
    for _ in 0..5 {
        let id = sim.id(2);
        let killed_at = sim.now();
        sim.kill(2);
        sim.run_until(Duration::from_secs(10), Duration::from_millis(10), |s| {
            s.declared_dead_by_all(id, killed_at).is_some()
        });
        let at = sim
            .declared_dead_by_all(id, killed_at)
            .expect("declared dead within 10 s");
        took.push((at - killed_at).as_secs_f64());
        sim.restart(2, id.generation + 1, &[0]);
        sim.run_for(Duration::from_secs(3));
    }
    took
}
