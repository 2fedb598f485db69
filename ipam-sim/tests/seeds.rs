//! A fixed range of seeds of the whole-cluster simulation, on every `cargo xtask test`: each
//! run's events are drawn from its seed, and every instant where anything may change is
//! checked (see docs/simulation.md). `cargo xtask sim --seeds N` runs more.

use ipam_sim::{run_seed, scenario::Config, schedule::Stepping, shrink::shrink};

/// Seeds in which the simulator found failures that are not fixed yet, each with what it
/// found; docs/simulation.md ("Open findings") says more. Each is still run, and must fail
/// the same way: a fix makes it pass, and it is then taken off this list.
const OPEN: &[(u64, &str)] = &[
    // A minority cut off by a partition closes its fence up to two probe periods after the
    // majority declared it dead; the takeover hold (200 ms) does not cover it. The gossip's
    // own simulator shows it without this model (`examples/minority_lateness.rs`). A seed is
    // a run of draws: a change of how often the agents decide (each decision's length is a
    // draw) changes the run, so 184 now fails on another IP, in the same way (node-1, on the
    // side of two, still answers when node-2 takes its IP).
    (1, "10.78.0.4 answered by node-0 and node-4"),
    (184, "10.78.0.1 answered by node-1 and node-2"),
    // A node cut off decides on its own view while its fence is closed, and its hand-over
    // wait may run out while it is silent: it answers what it took when the fence reopens,
    // next to the owner the others chose. Not deciding while the fence is closed fixed this
    // and broke a real test (a returning node then answered its old IPs at once).
    (18, "10.79.0.3 answered by node-1 and node-4"),
    // A node whose store watch fails keeps answering a Local Service's IP after its
    // endpoints moved away (it cannot see the move); the new owner answers after the
    // hand-over's wait.
    (137, "10.78.0.3 answered by node-2 and node-3"),
    (143, "10.79.0.1 answered by node-3 and node-4"),
    (198, "10.79.0.1 answered by node-1 and node-4"),
    // After partitions and deaths, live nodes keep a closed fence for over 6 s: an IP
    // answered by nobody. Likely the model (members counted for a majority: every node ever
    // started, where the daemon counts records with an unlapsed lease); not settled.
    (68, "10.79.0.3 answered by nobody"),
];

#[test]
fn a_range_of_seeds_breaks_no_invariant_at_5_nodes() {
    let config = Config::with_nodes(5);
    let mut failures = Vec::new();
    for seed in 1..=200 {
        let outcome = run_seed(&config, seed);
        let open = OPEN.iter().find(|(s, _)| *s == seed);
        match (&outcome.violation, open) {
            (None, None) => {}
            (Some(v), Some((_, what))) if v.to_string().contains(what) => {}
            (None, Some(_)) => failures.push(format!(
                "seed {seed} passes now: take it off OPEN, and its finding off docs/simulation.md"
            )),
            (Some(_), _) => {
                let (kept, shrunk) = shrink(&config, seed, &outcome);
                failures.push(format!(
                    "seed {seed} fails (replay: cargo xtask sim --nodes 5 --seed {seed} --events \
                     {kept:?}):\n{}",
                    shrunk.violation.map(|v| v.to_string()).unwrap_or_default()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_seed_replays_exactly() {
    let config = Config::with_nodes(5);
    let first = run_seed(&config, 137);
    let again = run_seed(&config, 137);
    assert!(
        first.violation.is_some(),
        "seed 137 is one of the open findings"
    );
    assert_eq!(first.violation, again.violation);
    assert_eq!(first.exercised.steps, again.exercised.steps);
    assert_eq!(first.exercised.decisions, again.exercised.decisions);
    assert_eq!(first.exercised.happenings, again.exercised.happenings);
}

/// The world goes from one instant where something may happen to the next, and looks only at
/// the agents with something to do (`ipam_sim::schedule`). Each run must be the one it is
/// when every step of 1 ms is run with every agent at each: the same happenings in the same
/// order (every decision, answer, fence and event, hashed), the same decisions, the same
/// failure at the same time. Seeds that fail are among them (1 and 18 at 5 nodes).
#[test]
fn going_from_instant_to_instant_is_running_every_step() {
    for (nodes, seeds) in [(3, 1..=8), (5, 1..=24), (12, 1..=3)] {
        let instants = Config::with_nodes(nodes);
        let every_step = Config {
            stepping: Stepping::EveryStep,
            ..instants.clone()
        };
        for seed in seeds {
            let fast = run_seed(&instants, seed);
            let slow = run_seed(&every_step, seed);
            let at = format!("{nodes} nodes, seed {seed}");
            assert_eq!(fast.violation, slow.violation, "{at}");
            assert_eq!(fast.exercised.decisions, slow.exercised.decisions, "{at}");
            assert_eq!(fast.exercised.happenings, slow.exercised.happenings, "{at}");
            assert_eq!(fast.exercised.simulated, slow.exercised.simulated, "{at}");
            assert!(
                fast.exercised.steps < slow.exercised.steps,
                "{at}: {} instants looked at, of {} steps",
                fast.exercised.steps,
                slow.exercised.steps
            );
        }
    }
}
