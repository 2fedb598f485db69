//! The fence over many seeds, as the daemon keeps it (`Fence` judged, `Latch` held), in the two
//! cases where it is hardest to get right:
//!
//! - **a minority of two cut off from three**: how long after the cut each minority member goes
//!   silent, and whether it answers again at any moment after the first majority member may
//!   take its IPs over (its death known there plus the takeover hold): an overlap;
//! - **the owner on a bad link among three**: 20 % loss and 0–100 ms of delay on its packets
//!   both ways (the real test's link), for how long and how often it silences itself.
//!
//! `FENCE_SEEDS=1000 cargo run --release -p ipam-gossip --example fence_study`; `REOPEN_MS=200`
//! holds a closed fence for one probe period instead of `Timing::fence_reopen` (the behaviour
//! before it: a few minorities answer again just after the majority took over).

use std::time::Duration;

use ipam_gossip::{
    Event, Keyring, Latch, Silenced, Timing,
    sim::{NetworkModel, Simulation},
};

const STEP: Duration = Duration::from_millis(5);

fn main() {
    let seeds: u64 = std::env::var("FENCE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    minority(seeds);
    lossy_owner(seeds.min(20));
}

fn keyring() -> Keyring {
    Keyring::new(("cluster", &[7; 32]), []).unwrap()
}

/// Judges member `m`'s fence now and feeds its latch: whether it is open, and the verdict.
fn judge(sim: &Simulation, m: usize, latch: &mut Latch) -> (bool, Result<(), Silenced>) {
    let verdict = sim.fence_verdict(m);
    (latch.take(sim.now(), &verdict), verdict)
}

fn minority(seeds: u64) {
    let timing = Timing::default();
    let mut overlapping = 0;
    let mut worst = Duration::ZERO;
    let mut margins = Vec::new();
    for seed in 0..seeds {
        let mut sim = Simulation::warm(5, timing.clone(), NetworkModel::default(), keyring(), seed);
        let mut latches = [3, 4].map(|_| Latch::new(reopen_after()));
        let run = |sim: &mut Simulation, latches: &mut [Latch; 2], for_: Duration| {
            let mut seen = [Vec::new(), Vec::new()];
            let end = sim.now() + for_;
            while sim.now() < end {
                sim.run_for(STEP);
                for (i, m) in [3, 4].into_iter().enumerate() {
                    let open = judge(sim, m, &mut latches[i]).0;
                    seen[i].push((sim.now(), open));
                }
            }
            seen
        };
        run(&mut sim, &mut latches, Duration::from_secs(2));
        let cut_at = sim.now();
        sim.partition(&[&[3, 4]]);
        let seen = run(&mut sim, &mut latches, Duration::from_secs(3));
        for (i, m) in [3, 4].into_iter().enumerate() {
            let id = sim.id(m);
            let takeover = sim
                .reports()
                .iter()
                .filter(|r| r.at >= cut_at && r.member < 3 && r.event == Event::Down(id))
                .map(|r| r.at + timing.takeover_hold)
                .min()
                .expect("the majority declared the minority dead");
            let silent = seen[i]
                .iter()
                .find(|(_, open)| !open)
                .map_or(sim.now(), |(t, _)| *t);
            margins.push(takeover.as_millis() as i64 - silent.as_millis() as i64);
            let open_after: Vec<Duration> = seen[i]
                .iter()
                .filter(|(t, open)| *open && *t >= takeover)
                .map(|(t, _)| *t)
                .collect();
            let after = open_after.len() as u32 * STEP;
            if !after.is_zero() {
                overlapping += 1;
                worst = worst.max(after);
                let reopened = open_after[0] - cut_at;
                println!(
                    "seed {seed} member {m}: answering {after:?} after the takeover at {:?} \
                     (from {reopened:?} after the cut)",
                    takeover - cut_at
                );
            }
        }
    }
    margins.sort();
    let pct = |p: usize| margins[(margins.len() - 1) * p / 100];
    println!(
        "minority: {overlapping} of {} members answered after the takeover (worst {worst:?}); \
         silent before the takeover by min {} ms, p10 {} ms, median {} ms",
        margins.len(),
        pct(0),
        pct(10),
        pct(50)
    );
}

fn lossy_owner(seeds: u64) {
    let timing = Timing::default();
    let minutes = 5;
    let mut closed_total = Duration::ZERO;
    let mut closings = 0;
    let mut reasons = std::collections::BTreeMap::<&str, u32>::new();
    for seed in 0..seeds {
        let mut sim = Simulation::warm(3, timing.clone(), NetworkModel::default(), keyring(), seed);
        sim.impair(
            0,
            NetworkModel {
                latency: Duration::ZERO,
                jitter: Duration::from_millis(100),
                loss: 0.2,
            },
        );
        let mut latch = Latch::new(reopen_after());
        let end = sim.now() + Duration::from_secs(60 * minutes);
        let mut was_open = true;
        let mut started = false;
        while sim.now() < end {
            sim.run_for(STEP);
            let (open, verdict) = judge(&sim, 0, &mut latch);
            started |= open;
            if started && !open {
                closed_total += STEP;
                if was_open {
                    closings += 1;
                    *reasons.entry(rule(&verdict)).or_default() += 1;
                }
            }
            was_open = open;
        }
    }
    let share = closed_total.as_secs_f64() / (seeds * minutes * 60) as f64;
    println!(
        "lossy owner among three, {seeds} x {minutes} min: silent {closed_total:?} ({share:.5}), \
         {closings} closings {reasons:?}"
    );
}

/// Which rule closed a fence.
fn rule(verdict: &Result<(), Silenced>) -> &'static str {
    match verdict {
        Ok(()) => "none",
        Err(Silenced::NeverHeard | Silenced::NothingHeard(_)) => "nothing heard",
        Err(Silenced::ProbesUnanswered { .. }) => "probes unanswered",
        Err(Silenced::DeclaredDead) => "declared dead",
        Err(Silenced::Minority { .. }) => "minority",
        Err(Silenced::CountedOut) => "counted out",
    }
}

fn reopen_after() -> Duration {
    std::env::var("REOPEN_MS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or_else(|| Timing::default().fence_reopen(), Duration::from_millis)
}
