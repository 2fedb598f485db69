//! A deterministic simulator of the whole cluster's L2 announcements.
//!
//! Every node runs the decision functions the daemon runs (`ipam_core::l2`: owners by
//! rendezvous hashing, hand-overs between live nodes, restart holds, lingering IPs), over its
//! own modelled copy of the store (`store`: one write order, per-node watch delays, failing
//! watches), with the gossip's own protocol code over a modelled network (`ipam_gossip::sim`:
//! latency, loss, partitions, one-way cuts) deciding who is live and when a node's fence
//! silences it, and the daemon's heartbeat and restart promise modelled on top (`node`). One
//! seed gives one run: no threads, no clock read, every random draw from the seed. Faults and
//! object changes are drawn from it (`scenario`); time is counted in steps of 1 ms, and the
//! world goes from one instant where something may happen to the next (`schedule`), where the
//! invariants are checked on what each node's responders answer (`check`); a failing run is
//! shrunk to the fewest events that still fail (`shrink`).
//!
//! See docs/simulation.md for what it models, what it checks, and what it found.

pub mod check;
pub mod node;
pub mod scenario;
pub mod schedule;
pub mod shrink;
pub mod store;
pub mod world;

use scenario::{Config, Timed};

pub use check::{Invariant, Violation};
pub use world::Exercised;

/// How one run ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub violation: Option<Violation>,
    pub exercised: Exercised,
}

/// Runs `seed` with its own events.
pub fn run_seed(config: &Config, seed: u64) -> Outcome {
    run_events(config, seed, &scenario::events(config, seed))
}

/// Runs `seed`'s world with `events` (its own, or a subset of them).
pub fn run_events(config: &Config, seed: u64, events: &[Timed]) -> Outcome {
    let mut world = world::World::new(config, seed, events);
    let violation = world.run().err();
    Outcome {
        violation,
        exercised: world.exercised,
    }
}
