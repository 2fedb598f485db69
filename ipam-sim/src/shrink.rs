//! Shrinking a failing run to the fewest events that still break the same invariant: chunks of
//! the events are left out, largest first, and a cut is kept whenever the run still fails. The
//! world's own randomness stays that of the seed, so the shrunk run replays exactly from the
//! seed and the events kept (`ipam-sim --seed S --events 2,5`).

use crate::{Outcome, run_events, scenario::Config};

/// The indices (into the seed's events) of a shrunk failing run, and its failure.
pub fn shrink(config: &Config, seed: u64, failed: &Outcome) -> (Vec<usize>, Outcome) {
    let Some(invariant) = failed.violation.as_ref().map(|v| v.invariant) else {
        return (Vec::new(), failed.clone());
    };
    let all = crate::scenario::events(config, seed);
    let mut kept: Vec<usize> = (0..all.len()).collect();
    let mut best = failed.clone();
    let mut chunk = kept.len().div_ceil(2).max(1);
    loop {
        let mut start = 0;
        let mut cut_any = false;
        while start < kept.len() {
            let trial: Vec<usize> = kept
                .iter()
                .enumerate()
                .filter(|(i, _)| *i < start || *i >= start + chunk)
                .map(|(_, e)| *e)
                .collect();
            let events: Vec<_> = trial.iter().map(|i| all[*i].clone()).collect();
            let outcome = run_events(config, seed, &events);
            if outcome
                .violation
                .as_ref()
                .is_some_and(|v| v.invariant == invariant)
            {
                kept = trial;
                best = outcome;
                cut_any = true;
            } else {
                start += chunk;
            }
        }
        if chunk == 1 && !cut_any {
            break;
        }
        chunk = (chunk / 2).max(1);
    }
    (kept, best)
}
