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
    // a run of draws: any change of what the agents do (the dead-node reports each write,
    // say) changes the runs, so the seeds that show a finding move (1 and 184 showed this one
    // before the reports; 184 still does, on another IP: node-1, on the side of two, answers
    // when node-4 takes its IP).
    (184, "10.79.0.3 answered by node-1 and node-4"),
    // The same class: node-3, on the side of two of a second partition, still holds node-0
    // alive and answers when node-0 takes its IP (56 since the greeting of the dead at a
    // reopening changed the runs).
    (56, "10.79.0.1 answered by node-0 and node-3"),
    // A node whose store watch fails keeps answering a Local Service's IP after its
    // endpoints moved away (it cannot see the move); the new owner answers after the
    // hand-over's wait. (137, 143 and 198 before the reports; 198 still.)
    (198, "10.79.0.1 answered by node-1 and node-4"),
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

/// Seeds outside the range above in which the simulator found a failure that is fixed now,
/// each still run so that it stays fixed (docs/simulation.md, "What it found").
const FIXED: &[(usize, u64, &str)] = &[
    // Finding 5: kept or taken while its fence was closed, an IP was answered the moment the
    // fences reopened next to the owner the others chose.
    (3, 58, "a node cut off kept an IP through the cut"),
    (3, 263, "a node cut off kept an IP through the cut"),
    // Finding 7: after a heal, two nodes each held the other dead, both with a majority, and
    // both answered an IP (fixed by greeting the members held dead at a reopening).
    (3, 253, "two nodes each holding the other dead after a heal"),
    (5, 727, "two nodes each holding the other dead after a heal"),
];

#[test]
fn seeds_whose_findings_were_fixed_stay_fixed() {
    for (nodes, seed, finding) in FIXED {
        let outcome = run_seed(&Config::with_nodes(*nodes), *seed);
        assert!(
            outcome.violation.is_none(),
            "{nodes} nodes, seed {seed} ({finding}) fails again (replay: cargo xtask sim \
             --nodes {nodes} --seed {seed}):\n{}",
            outcome.violation.map(|v| v.to_string()).unwrap_or_default()
        );
    }
}

#[test]
fn a_seed_replays_exactly() {
    let config = Config::with_nodes(5);
    let first = run_seed(&config, 198);
    let again = run_seed(&config, 198);
    assert!(
        first.violation.is_some(),
        "seed 198 is one of the open findings"
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
/// failure at the same time. A seed that fails is among them (184 at 5 nodes, an open
/// finding).
#[test]
fn going_from_instant_to_instant_is_running_every_step() {
    let at_5: Vec<u64> = (1..=24).chain([184]).collect();
    let mut markings = 0;
    for (nodes, seeds) in [(3, (1..=8).collect()), (5, at_5), (12, (1..=3).collect())] {
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
            assert_eq!(fast.exercised.marked, slow.exercised.marked, "{at}");
            markings += fast.exercised.marked.len();
            assert!(
                fast.exercised.steps < slow.exercised.steps,
                "{at}: {} instants looked at, of {} steps",
                fast.exercised.steps,
                slow.exercised.steps
            );
        }
    }
    assert!(markings > 0, "no dead node marked in the seeds compared");
}

/// The dead-node marking on the daemon's decisions: a node that loses power has its pods set
/// not ready within seconds; a node whose agent is killed, or whose gossip a firewall cuts,
/// while its kubelet's port drops or rejects connections, is declared dead by the gossip and
/// never marked (its kernel answers ARP). The invariant checks each marking in every run; this
/// checks that the marking happens at all, and on whom.
#[test]
fn a_dead_node_is_marked_and_live_nodes_behind_a_firewall_are_not() {
    use std::time::Duration;

    use ipam_sim::{
        node::Kubelet,
        scenario::{Event, Timed},
        world::World,
    };

    let config = Config::with_nodes(5);
    let secs = Duration::from_secs;
    // Apart in time, so that each has a majority of reporters and the rate limit (one node
    // per 10 s) free: with either taken out, the invariant finds the marking of node-3 or
    // node-4 once the probe takes a filtered port's silence for death.
    let events = [
        Timed {
            at: secs(5),
            event: Event::PowerLoss {
                node: 1,
                back_after: None,
            },
        },
        Timed {
            at: secs(20),
            event: Event::GossipBlocked {
                node: 3,
                lasting: secs(15),
            },
        },
        Timed {
            at: secs(40),
            event: Event::Kill {
                node: 4,
                back_after: secs(10),
            },
        },
    ];
    // The first seed whose nodes 3 and 4 filter their kubelet's port, one each way.
    let (seed, mut world) = (1..=100)
        .map(|seed| (seed, World::new(&config, seed, &events)))
        .find(|(_, w)| w.kubelet(3) == Kubelet::Dropped && w.kubelet(4) == Kubelet::Rejected)
        .expect("a seed among the first 100 with those firewalls");
    if let Err(violation) = world.run() {
        panic!("seed {seed}: {violation}");
    }
    // node-1 may be marked again: its reports can fall under a majority and come back
    // (docs/simulation.md, open findings), which the invariant allows for a node still down.
    let marked = &world.exercised.marked;
    assert!(
        !marked.is_empty() && marked.iter().all(|(_, n)| n == "node-1"),
        "seed {seed}: {marked:?}"
    );
    let after = marked[0].0.saturating_sub(secs(5));
    assert!(
        after < secs(4),
        "seed {seed}: node-1's pods marked {after:?} after it lost power"
    );
}
