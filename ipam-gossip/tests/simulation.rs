//! The protocol under a simulated network, in one process, deterministic for a seed: what the
//! daemon relies on (a dead member declared dead by all, no flapping on a lossy network, a
//! partition's minority cut off, forged packets dropped), checked on virtual time.

use std::time::Duration;

use ipam_gossip::{
    Dropped, Event, Keyring, Latch, NodeKey, PeerId, Remembered, Silenced, State, Timing,
    envelope::{Envelope, FORGET_AFTER, MAX_CLOCK_SKEW, REANCHOR_AFTER},
    sim::{NetworkModel, Simulation, address},
};

const KEY: [u8; 32] = [7; 32];

fn keyring() -> Keyring {
    Keyring::new(("cluster", &KEY), []).unwrap()
}

fn cluster(size: usize, network: NetworkModel, seed: u64) -> Simulation {
    Simulation::warm(size, Timing::default(), network, keyring(), seed)
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

#[test]
fn a_quiet_cluster_suspects_no_one_and_its_traffic_does_not_grow_with_its_size() {
    let mut per_member = Vec::new();
    for size in [20, 200] {
        let mut sim = cluster(size, NetworkModel::default(), 1);
        sim.run_for(secs(10.0));
        assert_eq!(sim.suspicions_since(Duration::ZERO), 0);
        assert!(sim.deaths_since(Duration::ZERO).is_empty());
        let hellos: u64 = (0..size).map(|m| sim.peer(m).unwrap().stats().hellos).sum();
        assert_eq!(
            hellos, 0,
            "an answer to its own probe every period: no silence at rest"
        );
        per_member.push(sim.traffic().bytes as f64 / size as f64 / 10.0);
    }
    let (small, large) = (per_member[0], per_member[1]);
    assert!(
        large < small * 1.2,
        "bytes per member per second: {small:.0} at 20 members, {large:.0} at 200"
    );
}

#[test]
fn a_killed_member_is_declared_dead_by_every_other_within_ten_periods_and_the_suspicion() {
    let mut sim = cluster(100, NetworkModel::default(), 2);
    sim.run_for(secs(2.0));
    let victims = [sim.id(17), sim.id(63), sim.id(99)];
    for (victim, id) in [17, 63, 99].into_iter().zip(victims) {
        let killed_at = sim.now();
        sim.kill(victim);
        let all = sim.run_until(secs(10.0), secs(0.05), |s| {
            s.declared_dead_by_all(id, killed_at).is_some()
        });
        assert!(all, "{id} was not declared dead by every member");
        let took = sim.declared_dead_by_all(id, killed_at).unwrap() - killed_at;
        // Until someone probes it (about once a period: the chance that no one does for ten
        // periods is e^-10), the rest of that period, the suspicion countdown, the news
        // spreading.
        let bound = Timing::default().probe_period * 10 + Timing::default().suspect_to_down;
        assert!(took < bound, "{id} took {took:?}");
    }
    // Nobody else was declared dead on the way.
    assert!(
        sim.deaths_since(Duration::ZERO)
            .iter()
            .all(|(_, id)| victims.contains(id))
    );
}

#[test]
fn a_clean_stop_is_known_at_once_and_a_restart_comes_back_as_a_new_generation() {
    let mut sim = cluster(30, NetworkModel::default(), 3);
    sim.run_for(secs(1.0));
    let old = sim.id(5);
    let stopped_at = sim.now();
    sim.stop(5);
    assert!(sim.run_until(secs(2.0), secs(0.01), |s| {
        s.declared_dead_by_all(old, stopped_at).is_some()
    }));
    let took = sim.declared_dead_by_all(old, stopped_at).unwrap() - stopped_at;
    assert!(took < secs(0.5), "a goodbye took {took:?} to spread");

    sim.restart(5, old.generation + 1, &[0, 1]);
    let new = sim.id(5);
    assert!(sim.run_until(secs(5.0), secs(0.05), |s| {
        (0..s.len()).filter(|m| *m != 5).all(|m| {
            s.peer(m)
                .unwrap()
                .members()
                .any(|(id, state)| id == new && state == State::Alive)
        })
    }));
}

#[test]
fn the_membership_digest_stays_put_at_rest_and_moves_with_every_change_of_state() {
    let mut sim = cluster(30, NetworkModel::default(), 9);
    sim.run_for(secs(1.0));
    let digest = |s: &Simulation| s.peer(0).unwrap().membership_digest();
    // At rest foca reorders its members every probe round; the digest does not move.
    let at_rest = digest(&sim);
    for _ in 0..20 {
        sim.run_for(secs(0.25));
        assert_eq!(
            digest(&sim),
            at_rest,
            "the digest moved with nothing changed"
        );
    }
    // Suspected, then declared dead: each state a digest of its own.
    let victim = sim.id(7);
    sim.kill(7);
    let mut seen = vec![at_rest];
    let states = |s: &Simulation| {
        s.peer(0)
            .unwrap()
            .members()
            .find(|(id, _)| *id == victim)
            .map(|(_, state)| state)
    };
    let mut last_state = states(&sim);
    assert!(sim.run_until(secs(10.0), secs(0.01), |s| {
        let state = states(s);
        if state != last_state {
            last_state = state;
            let now = digest(s);
            assert!(
                !seen.contains(&now),
                "{victim} now {state:?}: digest seen before"
            );
            seen.push(now);
        }
        matches!(state, Some(State::Down) | None)
    }));
    assert!(seen.len() >= 2, "the death never changed the digest");
}

#[test]
fn a_member_on_a_lossy_jittery_link_is_suspected_but_never_declared_dead() {
    let mut sim = cluster(50, NetworkModel::default(), 4);
    // netem's "loss 20% delay 50ms 50ms" on one node's interface.
    sim.impair(
        7,
        NetworkModel {
            latency: Duration::from_millis(50),
            jitter: Duration::from_millis(50),
            loss: 0.2,
        },
    );
    sim.run_for(secs(120.0));
    let suspicions = sim.suspicions_since(Duration::ZERO);
    assert!(sim.traffic().lost > 100, "the link lost packets");
    assert_eq!(
        sim.deaths_since(Duration::ZERO),
        [],
        "{suspicions} suspicions, all refuted in time"
    );
    // A member declared dead while alive comes back as its next generation: foca reports that
    // as a rename, not a death, so a flap shows as a rejoin.
    let rejoins = sim
        .reports()
        .iter()
        .filter(|r| matches!(r.event, Event::Rejoined(_)))
        .count();
    assert_eq!(rejoins, 0, "{suspicions} suspicions");
}

/// The failover lab's shape: three members, one losing a fifth of its packets both ways (the
/// real test's iptables rule), no delay. Suspicions come about once a second here, so this is
/// where a refutation that does not get through shows: before the transmissions floor, a
/// member was declared dead about once a minute; before refuted suspicions were kept from
/// sending foca's "you were declared down", every refutation also ended in a rejoin.
#[test]
fn three_members_one_on_a_lossy_link_refute_every_suspicion_and_never_rejoin() {
    let mut sim = cluster(3, NetworkModel::default(), 5);
    sim.impair(
        0,
        NetworkModel {
            loss: 0.2,
            ..NetworkModel::default()
        },
    );
    sim.run_for(secs(300.0));
    let suspicions = sim.suspicions_since(Duration::ZERO);
    assert!(
        suspicions > 100,
        "the lossy link raised suspicions: {suspicions}"
    );
    assert_eq!(
        sim.deaths_since(Duration::ZERO),
        [],
        "{suspicions} suspicions"
    );
    let rejoins: Vec<_> = sim
        .reports()
        .iter()
        .filter(|r| matches!(r.event, Event::Rejoined(_)))
        .collect();
    assert!(rejoins.is_empty(), "{suspicions} suspicions: {rejoins:?}");
}

/// The real test's bad link with delay on top: the owner among three loses a fifth of its
/// packets and holds each for 0–100 ms, both ways, for five minutes. Nobody is declared dead
/// or rejoins, and the owner's own fence (as the daemon keeps it) is rarely closed: its probes
/// fail often here, but a member it failed to reach and then heard from is not out of reach.
/// (Counting every failed probe, it was silent a fifth of the time: the real test's defect.)
#[test]
fn an_owner_on_a_lossy_slow_link_among_three_stays_alive_and_rarely_silent() {
    for seed in 0..3 {
        let mut sim = cluster(3, NetworkModel::default(), 300 + seed);
        sim.impair(
            0,
            NetworkModel {
                latency: Duration::ZERO,
                jitter: Duration::from_millis(100),
                loss: 0.2,
            },
        );
        sim.run_for(secs(1.0));
        let mut watch = FenceWatch::start(&mut sim, &[0]);
        let seen = watch.run(&mut sim, secs(300.0))[0];
        let suspicions = sim.suspicions_since(Duration::ZERO);
        assert_eq!(sim.deaths_since(Duration::ZERO), [], "seed {seed}");
        assert!(
            !sim.reports()
                .iter()
                .any(|r| matches!(r.event, Event::Rejoined(_))),
            "seed {seed}: a rejoin"
        );
        let share = seen.closed.as_secs_f64() / 300.0;
        println!(
            "seed {seed}: {suspicions} suspicions, the owner silent {:?} of 300 s ({share:.4})",
            seen.closed
        );
        // 0–0.2 % on these seeds (0.7–1.5 % before a silent member said hello): a link this
        // bad leaves the owner's hellos, or their answers, lost or late now and then.
        assert!(share < 0.01, "seed {seed}: silent {:?}", seen.closed);
    }
}

#[test]
fn a_cut_off_minority_is_declared_dead_by_the_majority_and_sees_the_majority_dead() {
    let mut sim = cluster(5, NetworkModel::default(), 5);
    sim.run_for(secs(1.0));
    let cut_at = sim.now();
    sim.partition(&[&[3, 4]]);
    let (three, four) = (sim.id(3), sim.id(4));
    assert!(sim.run_until(secs(10.0), secs(0.05), |s| {
        s.declared_dead_by(three, 0..3, cut_at).is_some()
            && s.declared_dead_by(four, 0..3, cut_at).is_some()
    }));
    // Each side holds only itself alive.
    let active = |s: &Simulation, m: usize| -> Vec<PeerId> {
        let mut ids: Vec<PeerId> = s.peer(m).unwrap().active().collect();
        ids.sort();
        ids
    };
    assert_eq!(active(&sim, 3), [sim.id(4)]);
    assert_eq!(active(&sim, 0), [sim.id(1), sim.id(2)]);

    // Healed: everyone is back, as new generations where they were declared dead, within a
    // few of the hellos sent to members held dead (every `reannounce_every`).
    sim.heal();
    let healed_at = sim.now();
    assert!(sim.run_until(secs(10.0), secs(0.1), |s| {
        (0..5).all(|m| s.peer(m).unwrap().active().count() == 4)
    }));
    println!("healed after {:?}", sim.now() - healed_at);
}

#[test]
fn forged_and_replayed_packets_are_dropped_counted_and_change_nothing() {
    let mut sim = cluster(10, NetworkModel::default(), 6);
    sim.run_for(secs(1.0));
    // A host on the segment without the key, claiming to be member 1.
    let mut stranger = Envelope::new(
        Keyring::new(("guess", &[8; 32]), []).unwrap(),
        NodeKey::from_seed(&[8; 32]),
        address(1),
    );
    let forged = stranger.seal(1_800_000_001_000_000, address(0), b"member 2 is dead");
    assert_eq!(sim.inject(0, &forged), Err(Dropped::UnknownKey));
    assert_eq!(sim.inject(0, b"garbage"), Err(Dropped::Truncated));
    // Member 1's own keys, but a message foca cannot read.
    let mut insider = sim.sealer(1, address(1));
    let nonsense = insider.seal(1_800_000_001_000_000, address(0), &[0xff; 40]);
    assert_eq!(sim.inject(0, &nonsense), Err(Dropped::Malformed));
    assert_eq!(sim.inject(0, &nonsense), Err(Dropped::Replayed));
    // What member 1 sent to member 2, replayed to member 0: member 0 has never seen it, but it
    // was not sent to member 0.
    let to_two = insider.seal(1_800_000_001_000_000, address(2), &[0xff; 40]);
    assert_eq!(sim.inject(0, &to_two), Err(Dropped::Misaddressed));
    // Member 4's keys (a compromised node), naming member 1 as the sender: refused.
    let mut as_one = sim.sealer(4, address(1));
    let forged_by_four = as_one.seal(1_800_000_001_000_000, address(0), b"member 2 is dead");
    assert_eq!(sim.inject(0, &forged_by_four), Err(Dropped::UnknownSigner));
    let stats = sim.peer(0).unwrap().stats().clone();
    for (reason, count) in [
        (Dropped::UnknownKey, 1),
        (Dropped::Truncated, 1),
        (Dropped::Malformed, 1),
        (Dropped::Replayed, 1),
        (Dropped::Misaddressed, 1),
        (Dropped::UnknownSigner, 1),
    ] {
        assert_eq!(stats.dropped(reason), count, "{reason:?}");
    }
    sim.run_for(secs(2.0));
    assert!(sim.deaths_since(Duration::ZERO).is_empty());
    assert!(
        !sim.reports()
            .iter()
            .any(|r| matches!(r.event, Event::Down(_) | Event::Suspected(_)))
    );
}

/// A compromised member (4) seals, as itself, protocol messages whose own header names member
/// 1 as their sender: acks for every probe number (so that a dead member 1 would answer every
/// probe) and a ping. The envelope takes them (they are member 4's); the peer refuses them as
/// impersonating before the protocol reads them, and with member 1 dead it is declared dead all
/// the same.
#[test]
fn a_member_cannot_speak_as_another_inside_the_protocol() {
    use foca::{Codec, Header, Message, PostcardCodec};
    let mut sim = cluster(5, NetworkModel::default(), 14);
    sim.run_for(secs(1.0));
    let one = sim.id(1);
    sim.kill(1);
    let killed_at = sim.now();
    let mut mallory = sim.sealer(4, address(4));
    let mut impersonated = 0;
    let mut until = killed_at;
    while sim.now() < killed_at + secs(3.0) {
        for (to, probe) in (0..4)
            .filter(|m| *m != 1)
            .flat_map(|m| (0..=u8::MAX).map(move |p| (m, p)))
        {
            let mut message = Vec::new();
            let header = Header {
                src: one,
                src_incarnation: 0,
                dst: sim.id(to),
                message: if probe == 0 {
                    Message::Ping(0)
                } else {
                    Message::Ack(probe)
                },
            };
            PostcardCodec.encode_header(&header, &mut message).unwrap();
            let packet = mallory.seal(unix_micros(&sim), address(to), &message);
            assert_eq!(sim.inject(to, &packet), Err(Dropped::Impersonating));
            impersonated += 1;
        }
        until += secs(0.1);
        sim.run_for(until - sim.now());
    }
    assert!(impersonated > 1_000);
    assert!(
        sim.declared_dead_by_all(one, killed_at).is_some(),
        "member 1 kept alive by another member's word"
    );
    assert_eq!(
        sim.peer(0).unwrap().stats().dropped(Dropped::Impersonating) * 3,
        impersonated,
        "members 0, 2 and 3 each refused every one sent to them"
    );
}

/// The simulation's wall clock at virtual time zero (`sim.rs`).
const EPOCH_MICROS: u64 = 1_800_000_000_000_000;

fn unix_micros(sim: &Simulation) -> u64 {
    EPOCH_MICROS + u64::try_from(sim.now().as_micros()).unwrap()
}

/// What member `from`'s own agent could send with its clock far off or a bug: a packet to
/// member `to`, sent at `sent_at` with any `counter`, sealed with its keys (a message the
/// protocol cannot read: the envelope's window takes it before the protocol refuses it).
/// Since envelope v3 no other node can seal it: `forged_and_replayed_...` above.
fn forged(sim: &Simulation, from: usize, to: usize, sent_at: u64, counter: u64) -> Vec<u8> {
    sim.sealer(from, address(from))
        .seal_with_counter(sent_at, address(to), counter, &[0xff; 40])
}

/// Issue 56, item 6: one packet sealed with the cluster key, naming member 1 as its sender and
/// a counter near `u64::MAX`, made member 0 drop every packet of member 1 until it restarted
/// (since envelope v3 only member 1's own key can seal it).
/// Now it is dropped as ahead of the clock; and one at the edge of the skew (which cannot be
/// told from a sender's clock that far ahead) keeps member 1 out for the skew and the
/// re-anchoring at most. Nobody is declared dead meanwhile: the others' indirect probes carry
/// member 1's answers.
#[test]
fn a_counter_pushed_ahead_keeps_a_member_out_for_a_bounded_time_only() {
    let mut sim = cluster(5, NetworkModel::default(), 12);
    sim.run_for(secs(2.0));
    let heard = |s: &Simulation| {
        s.peer(0)
            .unwrap()
            .contact()
            .last_heard_from(address(1))
            .expect("member 1 heard")
    };
    let at = sim.now();
    let end_of_time = forged(&sim, 1, 0, unix_micros(&sim), u64::MAX - 1);
    assert_eq!(sim.inject(0, &end_of_time), Err(Dropped::Ahead));
    assert_eq!(sim.peer(0).unwrap().stats().dropped(Dropped::Ahead), 1);
    sim.run_for(secs(1.0));
    assert!(
        heard(&sim) > at,
        "member 0 no longer takes member 1's packets"
    );

    let at = sim.now();
    let skew = u64::try_from(MAX_CLOCK_SKEW.as_micros()).unwrap();
    let edge = forged(&sim, 1, 0, unix_micros(&sim), unix_micros(&sim) + skew);
    assert_eq!(sim.inject(0, &edge), Err(Dropped::Malformed));
    let back = sim.run_until(
        MAX_CLOCK_SKEW + REANCHOR_AFTER + secs(1.0),
        secs(0.1),
        |s| heard(s) > at,
    );
    assert!(
        back,
        "member 1 not heard again {:?} after a counter at the edge of the skew",
        sim.now() - at
    );
    println!("member 1 heard again {:?} after", heard(&sim) - at);
    assert!(sim.deaths_since(Duration::ZERO).is_empty());
}

/// Issue 56, item 9: a long-running member keeps per-address state (replay windows, counters,
/// when each sender was last heard) only for members and for those that left lately, while
/// members come and go for ten minutes; and forgetting one that left lets none of its packets
/// be replayed: captured while it lived and replayed the moment it is forgotten, the newest is
/// dropped as stale.
#[test]
fn a_long_running_member_forgets_members_that_left_and_still_drops_their_replays() {
    let mut sim = cluster(5, NetworkModel::default(), 13);
    sim.run_for(secs(1.0));
    let round = secs(10.0);
    let mut transient: Option<usize> = None;
    let mut left: Vec<(usize, Duration)> = Vec::new();
    let mut most = Remembered::default();
    let mut replayed = None;
    for r in 0..60 {
        // A member joins; the one that joined before it is stopped dead.
        let new = sim.add(&[1, 2]);
        if r == 0 {
            sim.capture(new, 0);
        }
        if let Some(old) = transient.replace(new) {
            sim.kill(old);
            left.push((old, sim.now()));
        }
        for _ in 0..10 {
            sim.run_for(round / 10);
            let peer = sim.peer(0).unwrap();
            let now = peer.remembered();
            most.senders = most.senders.max(now.senders);
            most.recipients = most.recipients.max(now.recipients);
            most.heard_from = most.heard_from.max(now.heard_from);
            // The first one to leave, replayed as soon as member 0 forgot it.
            let first = address(5);
            if replayed.is_none() && r > 0 && !peer.remembers(first) {
                let newest = sim.captured().last().expect("captured its packets").clone();
                replayed = Some((sim.now() - left[0].1, sim.inject(0, &newest)));
            }
        }
    }
    let (after, outcome) = replayed.expect("the first member to leave was never forgotten");
    assert_eq!(
        outcome,
        Err(Dropped::Stale),
        "replayed {after:?} after it left"
    );
    assert!(after > FORGET_AFTER, "forgotten {after:?} after it left");
    // Others: 4 of the first five and the one joined last. Left lately: one a round, for
    // FORGET_AFTER, a pass of forgetting and the time it takes to be declared dead.
    let lately = (FORGET_AFTER + round * 2).as_secs() / round.as_secs();
    let bound = 5 + usize::try_from(lately).unwrap();
    assert!(
        most.senders <= bound && most.heard_from <= bound,
        "{most:?} after 60 members came and went (bound {bound})"
    );
    // Foca greets two members it holds dead every `reannounce_every` (2 s): counters of those
    // greeted since the last pass (10 s) are kept too.
    assert!(most.recipients <= bound + 10, "{most:?}");
    let now = sim.now();
    for (member, at) in &left {
        if now - *at > FORGET_AFTER + round * 2 {
            assert!(
                !sim.peer(0).unwrap().remembers(address(*member)),
                "member {member} left {:?} ago and is still remembered",
                now - *at
            );
        }
    }
    println!("most remembered: {most:?}");
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let run = || {
        let mut sim = cluster(
            40,
            NetworkModel {
                loss: 0.05,
                ..NetworkModel::default()
            },
            7,
        );
        sim.kill(3);
        sim.run_for(secs(5.0));
        (sim.reports().to_vec(), sim.traffic().clone())
    };
    assert_eq!(run(), run());
}

/// The fences of some members as the daemon keeps them: judged every 10 ms, each held by its
/// `Latch` (closed at once, open again only after an unbroken open stretch).
struct FenceWatch {
    members: Vec<usize>,
    latches: Vec<Latch>,
}

impl FenceWatch {
    /// Starts watching `members`, and runs until their fences have opened.
    fn start(sim: &mut Simulation, members: &[usize]) -> Self {
        let timing = Timing::default();
        let mut watch = Self {
            members: members.to_vec(),
            latches: vec![Latch::new(timing.fence_reopen()); members.len()],
        };
        watch.run(sim, timing.fence_reopen() + POLL * 2);
        assert!(
            watch.latches.iter().all(Latch::is_open),
            "the fences opened"
        );
        watch
    }

    /// Runs for `limit`; how each fence was seen.
    fn run(&mut self, sim: &mut Simulation, limit: Duration) -> Vec<FenceSeen> {
        let mut seen = vec![FenceSeen::default(); self.members.len()];
        let end = sim.now() + limit;
        while sim.now() < end {
            sim.run_for(POLL);
            for (i, m) in self.members.iter().enumerate() {
                if self.latches[i].take(sim.now(), &sim.fence_verdict(*m)) {
                    seen[i].last_open = Some(sim.now());
                } else {
                    seen[i].first.get_or_insert(sim.now());
                    seen[i].closed += POLL;
                }
            }
        }
        seen
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct FenceSeen {
    /// When it was first seen closed.
    first: Option<Duration>,
    /// When it was last seen open.
    last_open: Option<Duration>,
    /// How long it was closed in all.
    closed: Duration,
}

/// When one of `by` first declared `victim` dead after `since`. (Pass the identity the member
/// had before the fault: one told it was declared dead rejoins as its next generation.)
fn first_declared_dead(
    sim: &Simulation,
    victim: PeerId,
    by: &[usize],
    since: Duration,
) -> Duration {
    sim.reports()
        .iter()
        .filter(|r| r.at >= since && by.contains(&r.member) && r.event == Event::Down(victim))
        .map(|r| r.at)
        .min()
        .unwrap_or_else(|| panic!("{victim} was never declared dead"))
}

/// The fence is polled every 10 ms: a closing is seen up to that late.
const POLL: Duration = Duration::from_millis(10);

#[test]
fn a_member_cut_off_goes_silent_before_anyone_declares_it_dead() {
    // The protocol's share of the margin (the survivors' takeover hold, the rest of it, is the
    // daemon's and not simulated here).
    let timing = Timing::default();
    let margin = timing.fencing_margin().unwrap() - timing.takeover_hold;
    for seed in 0..8 {
        let mut sim = cluster(3, NetworkModel::default(), 100 + seed);
        sim.run_for(secs(1.0));
        let mut watch = FenceWatch::start(&mut sim, &[2]);
        let cut_at = sim.now();
        sim.partition(&[&[2]]);
        let silent = watch.run(&mut sim, secs(3.0))[0]
            .first
            .expect("the cut-off member went silent");
        let declared = first_declared_dead(&sim, sim.id(2), &[0, 1], cut_at);
        assert!(
            silent + margin <= declared + POLL,
            "seed {seed}: silent {:?} after the cut, first declared dead {:?} after it",
            silent - cut_at,
            declared - cut_at
        );
    }
}

#[test]
fn a_minority_of_two_goes_silent_no_later_than_the_majority_declares_it_dead() {
    let hold = Timing::default().takeover_hold;
    for seed in 0..40 {
        let mut sim = cluster(5, NetworkModel::default(), 200 + seed);
        sim.run_for(secs(1.0));
        let mut watch = FenceWatch::start(&mut sim, &[3, 4]);
        let cut_at = sim.now();
        sim.partition(&[&[3, 4]]);
        let seen = watch.run(&mut sim, secs(3.0));
        for (member, seen) in [3, 4].into_iter().zip(seen) {
            let silent = seen
                .first
                .unwrap_or_else(|| panic!("seed {seed}: member {member} kept answering"));
            let declared = first_declared_dead(&sim, sim.id(member), &[0, 1, 2], cut_at);
            assert!(
                silent <= declared + POLL,
                "seed {seed}: member {member} silent {:?} after the cut, declared dead {:?} \
                 after it",
                silent - cut_at,
                declared - cut_at
            );
            // ... and it stays silent while the partition lasts, though its probes of its own
            // side succeed: its first signs age out, its suspicions of the other side land
            // before its fence may reopen, and then it sees no majority. (With a reopening
            // after one probe period, a few of these seeds answered again just after the
            // majority's takeover, as the real test saw.)
            let last_open = seen.last_open.unwrap_or(cut_at);
            assert!(
                last_open < silent,
                "seed {seed}: member {member} answered again {:?} after the cut (the majority \
                 may answer for it from {:?})",
                last_open - cut_at,
                declared + hold - cut_at
            );
        }
        for m in [3, 4] {
            assert!(
                matches!(sim.fence_verdict(m), Err(Silenced::Minority { .. })),
                "seed {seed}: member {m} after 3 s"
            );
        }
        // Once the minority is declared dead, the majority's probes are answered again.
        for m in 0..3 {
            assert_eq!(
                sim.fence_verdict(m),
                Ok(()),
                "seed {seed}: majority member {m}"
            );
        }
    }
}

/// A member that hears everyone but reaches no one (its outgoing gossip dropped): its probes
/// fail, yet it hears from the members it probed, so the failed probes do not count for its
/// fence; it goes silent when it learns the others declared it dead, which is before their
/// takeover hold has passed, and stays silent. Twenty members: it would take ten suspicions of
/// its own to see no majority.
#[test]
fn a_member_cut_one_way_goes_silent_when_declared_dead_before_anyone_takes_over() {
    let hold = Timing::default().takeover_hold;
    for seed in 0..8 {
        let mut sim = cluster(20, NetworkModel::default(), 400 + seed);
        sim.run_for(secs(1.0));
        let mut watch = FenceWatch::start(&mut sim, &[5]);
        let cut_at = sim.now();
        // Its identity before: once it hears it was declared dead it rejoins as the next.
        let id = sim.id(5);
        sim.mute(5);
        let seen = watch.run(&mut sim, secs(4.0))[0];
        let others: Vec<usize> = (0..20).filter(|m| *m != 5).collect();
        let declared = first_declared_dead(&sim, id, &others, cut_at);
        let silent = seen
            .first
            .unwrap_or_else(|| panic!("seed {seed}: the muted member kept answering"));
        println!(
            "seed {seed}: silent {:?} after the cut, declared dead {:?} after it",
            silent - cut_at,
            declared - cut_at
        );
        assert!(
            silent + hold / 2 <= declared + hold,
            "seed {seed}: silent {:?} after the cut, others may answer {:?} after it",
            silent - cut_at,
            declared + hold - cut_at
        );
        assert!(
            seen.last_open.is_none_or(|open| open < silent),
            "seed {seed}: it answered again"
        );
    }
}

#[test]
fn the_fence_stays_open_on_a_lossy_jittery_link_and_a_quiet_cluster() {
    let mut sim = cluster(
        50,
        NetworkModel {
            loss: 0.01,
            ..NetworkModel::default()
        },
        6,
    );
    sim.impair(
        7,
        NetworkModel {
            latency: Duration::from_millis(50),
            jitter: Duration::from_millis(50),
            loss: 0.2,
        },
    );
    sim.run_for(secs(1.0));
    let members: Vec<usize> = (0..50).collect();
    let mut watch = FenceWatch::start(&mut sim, &members);
    let seen = watch.run(&mut sim, secs(60.0));
    // A reachable member used to find itself unheard for a moment now and then (no one probed
    // it while its own probe went to the slow member), and its responders paused until the
    // fence reopened: 0.0010-0.0027 of the time over seeds 1-6. A member silent for a probe
    // period now says hello and is answered: none over seeds 1-6.
    let closed: Duration = seen.iter().map(|s| s.closed).sum();
    println!("silent {closed:?} of 50 members x 60 s");
    assert_eq!(closed, Duration::ZERO, "a reachable member went silent");
    assert_eq!(seen[7].first, None, "the member on the lossy link itself");
}

/// Three members, one stopping (killed, or away for a restart: it says nothing either way):
/// the two left hear each other only through their probes of each other, every other period
/// each, and the indirect probes of the silent one. When their phases lined up a healthy
/// member heard nothing for 400 ms, past the fence's `quiet`, and its fence closed while the
/// stopped member's IPs were not yet anyone else's (the rolling-restart test saw one IP
/// unanswered for 640 ms). A member silent for a probe period says hello and is answered.
#[test]
fn two_members_left_of_three_keep_their_fences_open_while_the_third_is_declared_dead() {
    let mut closed = Vec::new();
    for seed in 0..1000 {
        let mut sim = cluster(3, NetworkModel::default(), 900 + seed);
        // A warm cluster's members probe in step; as in a rolling restart, member 0 comes back
        // with a phase of its own, and the kill falls anywhere in the period.
        sim.run_for(secs(1.0));
        let generation = sim.id(0).generation;
        sim.kill(0);
        sim.run_for(secs(2.0) + Duration::from_millis(seed * 37 % 200));
        sim.restart(0, generation + 1, &[1, 2]);
        sim.run_for(secs(2.0) + Duration::from_millis(seed * 53 % 200));
        let mut watch = FenceWatch::start(&mut sim, &[0, 1]);
        let victim = sim.id(2);
        let killed_at = sim.now();
        sim.kill(2);
        let seen = watch.run(&mut sim, secs(3.0));
        first_declared_dead(&sim, victim, &[0, 1], killed_at);
        for (member, seen) in [0, 1].into_iter().zip(seen) {
            if let Some(first) = seen.first {
                closed.push(format!(
                    "seed {seed}: member {member} silent {:?} after the kill, for {:?} ({:?})",
                    first - killed_at,
                    seen.closed,
                    sim.fence_verdict(member)
                ));
            }
        }
        let hellos: u64 = [0, 1]
            .iter()
            .map(|m| sim.peer(*m).unwrap().stats().hellos)
            .sum();
        assert!(hellos <= 20, "seed {seed}: {hellos} hellos in 3 s");
    }
    assert!(closed.is_empty(), "{closed:#?}");
}
