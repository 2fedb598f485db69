//! How late a minority cut off by a partition goes silent, against when the majority first
//! declares it dead: the fencing rule wants it silent before the majority answers for it
//! (declared dead, then `takeover_hold`). Found by the whole-cluster simulator (ipam-sim); this
//! shows it on the gossip alone.
//!
//! `cargo run --release -p ipam-gossip --example minority_lateness -- <members> <minority>`
//! (default 5 2): 400 cuts at varied times and sides; prints how many of the minority's
//! members went silent after they were first declared dead, and by how much.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use ipam_gossip::{
    Event, Keyring, Timing,
    sim::{NetworkModel, Simulation},
};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("two numbers: members and minority size"))
        .collect();
    let (members, minority) = match args[..] {
        [m, k] if k * 2 < m && k > 0 => (m, k),
        [] => (5, 2),
        _ => panic!("<members> <minority>, the minority less than half"),
    };
    let hold = Timing::default().takeover_hold;
    let (mut late, mut after_hold, mut total) = (0, 0, 0);
    let mut by_100ms: BTreeMap<u128, u32> = BTreeMap::new();
    for seed in 0..400u64 {
        let keyring = Keyring::new(("study", &[7; 32]), []).expect("a 32-byte key");
        let mut sim = Simulation::warm(
            members,
            Timing::default(),
            NetworkModel::default(),
            keyring,
            seed,
        );
        sim.run_for(Duration::from_millis(1_000 + (seed * 37) % 3_000));
        let cut = sim.now();
        let side: Vec<usize> = (0..minority)
            .map(|i| (seed as usize * 7 + i * 3) % members)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        sim.partition(&[&side]);
        let mut silent = vec![None; side.len()];
        for _ in 0..2_000 {
            sim.run_for(Duration::from_millis(1));
            for (k, m) in side.iter().copied().enumerate() {
                if silent[k].is_none() && sim.fence_verdict(m).is_err() {
                    silent[k] = Some(sim.now() - cut);
                }
            }
        }
        for (k, m) in side.iter().copied().enumerate() {
            total += 1;
            let id = sim.id(m);
            let declared = sim
                .reports()
                .iter()
                .filter(|r| r.at >= cut && r.event == Event::Down(id))
                .map(|r| r.at - cut)
                .min();
            if let (Some(s), Some(d)) = (silent[k], declared)
                && s > d
            {
                late += 1;
                after_hold += u32::from(s > d + hold);
                *by_100ms.entry((s - d).as_millis() / 100 * 100).or_default() += 1;
            }
        }
    }
    println!(
        "{members} members, minority {minority}: {late} of {total} cut-off members went silent \
         after the majority declared them dead, {after_hold} after its takeover hold ({} ms) \
         too: two answers for their IPs. Lateness by 100 ms: {by_100ms:?}",
        hold.as_millis()
    );
}
