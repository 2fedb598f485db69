//! How often a member on a lossy link is wrongly declared dead in a small cluster: the figures
//! behind the transmissions floor in `timing.rs` and docs/liveness.md.
//! `cargo run --release -p ipam-gossip --example lossy_link`.
//!
//! Clusters of 3 and 5 members on a quiet LAN, one of them losing `LOSS` (default 0.2) of its
//! packets both ways (the failover test's iptables rule), for `MINUTES` (default 60) of
//! virtual time per seed, 4 seeds: suspicions raised, false deaths (a live member declared
//! dead, counted once however many declared it) and rejoins.

use std::{collections::HashSet, time::Duration};

use ipam_gossip::{
    Event, Keyring, Timing,
    sim::{NetworkModel, Simulation},
};

fn main() {
    let keyring = Keyring::new(("lossy", &[7; 32]), []).expect("a 32-byte key");
    let env = |name: &str, default: f64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let loss = env("LOSS", 0.2);
    let minutes = env("MINUTES", 60.0);
    println!("| members | loss | simulated | suspicions | false deaths | rejoins |");
    println!("|---|---|---|---|---|---|");
    for size in [3, 5] {
        let (mut suspicions, mut deaths, mut rejoins) = (0, 0, 0);
        for seed in 0..4 {
            let mut sim = Simulation::warm(
                size,
                Timing::default(),
                NetworkModel::default(),
                keyring.clone(),
                seed,
            );
            sim.impair(
                0,
                NetworkModel {
                    loss,
                    ..NetworkModel::default()
                },
            );
            sim.run_for(Duration::from_secs_f64(minutes * 60.0));
            suspicions += sim.suspicions_since(Duration::ZERO);
            let dead: HashSet<_> = sim
                .deaths_since(Duration::ZERO)
                .into_iter()
                .map(|(_, id)| id)
                .collect();
            deaths += dead.len();
            rejoins += sim
                .reports()
                .iter()
                .filter(|r| matches!(r.event, Event::Rejoined(_)))
                .count();
        }
        println!(
            "| {size} | {:.0} % | {:.0} min | {suspicions} | {deaths} | {rejoins} |",
            loss * 100.0,
            minutes * 4.0
        );
    }
}
