//! Where a detection's time goes, kill by kill: until the dead member is first suspected (someone
//! probed it and the probe's period ran out), until the first member declares it dead (the
//! suspicion's countdown), until every member has (the news spreading).
//!
//! `MEMBERS=5000 KILLS=10 cargo run --release -p ipam-gossip --example detect_parts`
//! (`GOSSIP_EVERY_MS`, `GOSSIP_FANOUT` and `PROBE_PERIOD_MS` try other settings.)

use std::time::{Duration, Instant};

use ipam_gossip::{
    Event, Keyring, Timing,
    sim::{NetworkModel, Simulation},
};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let members = env("MEMBERS", 1000) as usize;
    let kills = env("KILLS", 10) as usize;
    let default = Timing::default();
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let timing = Timing {
        gossip_every: Duration::from_millis(env("GOSSIP_EVERY_MS", millis(default.gossip_every))),
        gossip_fanout: env("GOSSIP_FANOUT", default.gossip_fanout as u64) as usize,
        probe_period: Duration::from_millis(env("PROBE_PERIOD_MS", millis(default.probe_period))),
        ..default.clone()
    };
    let network = NetworkModel {
        loss: 0.01,
        ..NetworkModel::default()
    };
    let keyring = Keyring::new(("study", &[42; 32]), []).expect("a 32-byte key");
    let started = Instant::now();
    let mut sim = Simulation::warm(members, timing.clone(), network, keyring, env("SEED", 19));
    sim.run_for(Duration::from_secs(2));
    eprintln!("warm in {:.0} s", started.elapsed().as_secs_f64());
    let mut parts = Vec::new();
    for k in 0..kills {
        let victim = (k * 7919 + 13) % members;
        let id = sim.id(victim);
        let killed_at = sim.now();
        sim.kill(victim);
        sim.run_until(Duration::from_secs(30), Duration::from_millis(10), |s| {
            s.declared_dead_by_all(id, killed_at).is_some()
        });
        let first = |event: Event| {
            sim.reports()
                .iter()
                .filter(|r| r.at >= killed_at && r.event == event)
                .map(|r| (r.at - killed_at).as_secs_f64())
                .fold(f64::INFINITY, f64::min)
        };
        let suspected = first(Event::Suspected(id));
        let down = first(Event::Down(id));
        let all = sim
            .declared_dead_by_all(id, killed_at)
            .map_or(30.0, |at| (at - killed_at).as_secs_f64());
        println!(
            "kill {}: suspected {suspected:.2} s, first down {down:.2} s, all {all:.2} s \
             (spread {:.2} s)",
            k + 1,
            all - down
        );
        parts.push((suspected, down, all));
        sim.run_for(Duration::from_millis(500));
    }
    let median = |f: fn(&(f64, f64, f64)) -> f64| {
        let mut v: Vec<f64> = parts.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[v.len() - 1])
    };
    let (s50, smax) = median(|p| p.0);
    let (a50, amax) = median(|p| p.2);
    let (sp50, spmax) = median(|p| p.2 - p.1);
    println!(
        "{members} members, gossip every {:?} to {}: suspected median {s50:.2} max {smax:.2}; \
         spread median {sp50:.2} max {spmax:.2}; all median {a50:.2} max {amax:.2}",
        timing.gossip_every, timing.gossip_fanout
    );
}
