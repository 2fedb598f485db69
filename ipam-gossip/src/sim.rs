//! Thousands of members in one thread over a modelled network: latency, jitter, loss and
//! partitions, on a virtual clock, deterministic for a seed. The protocol code is the one the
//! daemon runs ([`Peer`]); only the sockets and the clock are modelled.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap},
    net::{Ipv4Addr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use rand::{RngExt, SeedableRng, rngs::StdRng};

use crate::{
    Event, Keyring, NodeKey, Now, Peer, PeerId, PublicKey, Settings, Signers, Silenced, Speaker,
    Timing, View,
    envelope::{Dropped, Envelope},
    queue::Queue,
};

/// The network between the members.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkModel {
    pub latency: Duration,
    /// Added to the latency: uniform between zero and this.
    pub jitter: Duration,
    /// The chance that any one packet is lost.
    pub loss: f64,
}

impl Default for NetworkModel {
    /// A quiet LAN.
    fn default() -> Self {
        Self {
            latency: Duration::from_micros(200),
            jitter: Duration::from_micros(100),
            loss: 0.0,
        }
    }
}

/// Something a member learned, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub at: Duration,
    pub member: usize,
    pub event: Event,
}

/// Totals over the whole run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Traffic {
    pub packets: u64,
    pub bytes: u64,
    pub lost: u64,
}

/// Wall clock of the simulated world at virtual time zero.
const EPOCH_MICROS: u64 = 1_800_000_000_000_000;
const PORT: u16 = 7946;

pub struct Simulation {
    now: Duration,
    timing: Timing,
    keyring: Keyring,
    seed: u64,
    members: Vec<Member>,
    by_addr: HashMap<SocketAddr, usize>,
    network: NetworkModel,
    rng: StdRng,
    wakeups: BinaryHeap<Reverse<(Duration, usize)>>,
    in_flight: Queue<Delivery>,
    reports: Vec<Report>,
    traffic: Traffic,
    /// Packets from one member to another kept as they are delivered (`capture`).
    capture: Option<(usize, usize)>,
    captured: Vec<Vec<u8>>,
    /// Each step of a member (a packet handled, its timers run, a join, a leave) and when,
    /// while kept (`keep_steps`): what a member knows changes only at its steps.
    steps: Option<Vec<(usize, Duration)>>,
    /// Who speaks for each address: every member's last key, as the node records would say.
    signers: Arc<Signers>,
}

struct Member {
    peer: Option<Peer>,
    /// The public key of its agent's last start, as its record would publish it, and the seed
    /// it was made from.
    published: PublicKey,
    key_seed: [u8; 32],
    /// This member's own link, when it is worse than the network's.
    link: Option<NetworkModel>,
    /// Packets only pass between members of the same group.
    group: u32,
    /// The earliest wake-up queued for this member.
    armed: Option<Duration>,
    /// Its packets are lost, while it still receives (a one-way cut).
    muted: bool,
}

impl Simulation {
    /// `size` members that already know each other (a warm cluster, as after every agent read
    /// the node records), all signing with `keyring`.
    pub fn warm(
        size: usize,
        timing: Timing,
        network: NetworkModel,
        keyring: Keyring,
        seed: u64,
    ) -> Self {
        let mut sim = Self {
            now: Duration::ZERO,
            timing,
            keyring,
            seed,
            members: Vec::with_capacity(size),
            by_addr: HashMap::with_capacity(size),
            network,
            rng: StdRng::seed_from_u64(seed),
            wakeups: BinaryHeap::new(),
            in_flight: Queue::new(),
            reports: Vec::new(),
            traffic: Traffic::default(),
            capture: None,
            captured: Vec::new(),
            steps: None,
            signers: Arc::default(),
        };
        let ids: Vec<PeerId> = (0..size).map(|i| PeerId::new(address(i), 1)).collect();
        for (index, id) in ids.iter().enumerate() {
            let (peer, published, key_seed) = sim.new_peer(*id, index);
            sim.by_addr.insert(id.addr, index);
            sim.members.push(Member {
                peer: Some(peer),
                published,
                key_seed,
                link: None,
                group: 0,
                armed: None,
                muted: false,
            });
        }
        sim.publish_keys();
        let now = sim.clock();
        for index in 0..size {
            let peer = sim.members[index].peer.as_mut().expect("just started");
            peer.assume_alive(now, ids.iter().copied());
            // What a warm start learned is not news.
            peer.take_events();
            sim.collect(index);
        }
        sim
    }

    /// Gives every running member the records' word on who speaks for each address: each
    /// member's key from its last start (as if every watch saw every record at once).
    fn publish_keys(&mut self) {
        self.signers = Arc::new(
            self.members
                .iter()
                .enumerate()
                .map(|(i, m)| (address(i).ip(), Speaker::Signed(m.published)))
                .collect(),
        );
        for member in &mut self.members {
            if let Some(peer) = member.peer.as_mut() {
                peer.set_signers(self.signers.clone());
            }
        }
    }

    /// A member at `id` with a key of its own (made from the seed, the member and the
    /// generation: the same on every run, a new one at every start), and that key's public
    /// half. The key is the simulators' stand-in for Ed25519 (`NodeKey::modelled`): the same
    /// bytes and checks at a keyed hash's cost; the envelope's own tests and the real-netns
    /// tests check the real signatures.
    fn new_peer(&self, id: PeerId, index: usize) -> (Peer, PublicKey, [u8; 32]) {
        let mut key_seed = [0; 32];
        key_seed[..8].copy_from_slice(&self.seed.to_le_bytes());
        key_seed[8..16].copy_from_slice(&(index as u64).to_le_bytes());
        key_seed[16..20].copy_from_slice(&id.generation.to_le_bytes());
        let key = NodeKey::modelled(&key_seed);
        let public = key.public();
        let settings = Settings {
            protocol: self
                .timing
                .protocol(self.members.capacity().max(self.members.len())),
            hello: self.timing.hello(),
            seed: Some(self.seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        };
        let mut peer = Peer::new(id, settings, self.keyring.clone(), key);
        peer.set_signers(self.signers.clone());
        (peer, public, key_seed)
    }

    /// An envelope that seals with member `member`'s keys (the cluster key and its own), as
    /// the records stand, naming `from` as the sender: its own address, or another member's
    /// for what a compromised node would forge.
    pub fn sealer(&self, member: usize, from: SocketAddr) -> Envelope {
        let m = &self.members[member];
        let mut envelope =
            Envelope::new(self.keyring.clone(), NodeKey::modelled(&m.key_seed), from);
        envelope.set_signers(self.signers.clone());
        envelope
    }

    pub fn now(&self) -> Duration {
        self.now
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn id(&self, member: usize) -> PeerId {
        self.members[member]
            .peer
            .as_ref()
            .map_or_else(|| PeerId::new(address(member), 0), Peer::id)
    }

    pub fn peer(&self, member: usize) -> Option<&Peer> {
        self.members[member].peer.as_ref()
    }

    /// How `member`'s fence judges now, as the daemon's would with a node record for every
    /// member of the simulation.
    pub fn fence_verdict(&self, member: usize) -> Result<(), Silenced> {
        let peer = self.peer(member).expect("a running member");
        let view = View {
            members: self.len(),
            alive: peer.alive() + 1,
        };
        self.timing.fence().judge(peer.contact(), self.now, view)
    }

    pub fn is_alive(&self, member: usize) -> bool {
        self.members[member].peer.is_some()
    }

    pub fn set_network(&mut self, network: NetworkModel) {
        self.network = network;
    }

    /// Gives `member` a link of its own (netem on its interface): packets to and from it see
    /// `link` instead of the network's model.
    pub fn impair(&mut self, member: usize, link: NetworkModel) {
        self.members[member].link = Some(link);
    }

    /// Stops `member` dead: no goodbye, packets to it vanish.
    pub fn kill(&mut self, member: usize) {
        self.members[member].peer = None;
        self.members[member].armed = None;
    }

    /// Stops `member` cleanly: it tells the cluster it leaves.
    pub fn stop(&mut self, member: usize) {
        let now = self.clock();
        if let Some(peer) = self.members[member].peer.as_mut() {
            peer.leave(now);
        }
        self.collect(member);
        self.kill(member);
    }

    /// Starts `member` again as a new generation, joining through `seeds`.
    pub fn restart(&mut self, member: usize, generation: u32, seeds: &[usize]) {
        let id = PeerId::new(address(member), generation);
        let (peer, published, key_seed) = self.new_peer(id, member + generation as usize);
        self.members[member].peer = Some(peer);
        self.members[member].published = published;
        self.members[member].key_seed = key_seed;
        // Its record publishes the new key before its first packet.
        self.publish_keys();
        let now = self.clock();
        let peer = self.members[member].peer.as_mut().expect("just started");
        peer.join(now, seeds.iter().map(|s| address(*s)));
        self.collect(member);
    }

    /// A new member at a new address (the next of [`address`]), joining through `seeds`, as a
    /// node added to the cluster; returns its index.
    pub fn add(&mut self, seeds: &[usize]) -> usize {
        let index = self.members.len();
        let id = PeerId::new(address(index), 1);
        let (peer, published, key_seed) = self.new_peer(id, index);
        self.by_addr.insert(id.addr, index);
        self.members.push(Member {
            peer: Some(peer),
            published,
            key_seed,
            link: None,
            group: 0,
            armed: None,
            muted: false,
        });
        self.publish_keys();
        let now = self.clock();
        let peer = self.members[index].peer.as_mut().expect("just started");
        peer.join(now, seeds.iter().map(|s| address(*s)));
        self.collect(index);
        index
    }

    /// Keeps a copy of every packet from `from` delivered to `to` from now on (what a host on
    /// the segment could capture, to replay later with [`Simulation::inject`]).
    pub fn capture(&mut self, from: usize, to: usize) {
        self.capture = Some((from, to));
        self.captured.clear();
    }

    /// The packets captured so far, oldest first.
    pub fn captured(&self) -> &[Vec<u8>] {
        &self.captured
    }

    /// Splits the network: members in different groups no longer reach each other. Members
    /// not listed form group 0.
    pub fn partition(&mut self, groups: &[&[usize]]) {
        for member in &mut self.members {
            member.group = 0;
        }
        for (g, members) in groups.iter().enumerate() {
            for m in *members {
                self.members[*m].group = u32::try_from(g + 1).unwrap_or(u32::MAX);
            }
        }
    }

    /// Cuts `member` one way: it still hears everyone, nobody hears it (a firewall dropping
    /// its outgoing gossip).
    pub fn mute(&mut self, member: usize) {
        self.members[member].muted = true;
    }

    /// Undoes every partition and one-way cut.
    pub fn heal(&mut self) {
        self.partition(&[]);
        for member in &mut self.members {
            member.muted = false;
        }
    }

    /// Has `member` greet the members it holds dead now, as a daemon does when its fence
    /// reopens ([`Peer::greet_the_dead`]).
    pub fn greet_the_dead(&mut self, member: usize) {
        let now = self.clock();
        if let Some(peer) = self.members[member].peer.as_mut() {
            peer.greet_the_dead(now);
            self.collect(member);
        }
    }

    /// Delivers `packet` to `member` now, as from a host on the segment.
    pub fn inject(&mut self, member: usize, packet: &[u8]) -> Result<(), Dropped> {
        let now = self.clock();
        let outcome = match self.members[member].peer.as_mut() {
            Some(peer) => peer.receive(now, packet),
            None => return Ok(()),
        };
        self.collect(member);
        outcome
    }

    /// When the next packet arrives or the next member timer may fire, if any: nothing in the
    /// simulation changes before then unless the caller changes it. (A timer re-armed earlier
    /// leaves its old wake-up queued: that one may change nothing.)
    pub fn next_event_at(&self) -> Option<Duration> {
        let wakeup = self.wakeups.peek().map(|Reverse((at, _))| *at);
        [self.in_flight.next_at(), wakeup]
            .into_iter()
            .flatten()
            .min()
    }

    /// Keeps, from now on, every step of every member with its time, for [`Self::take_steps`]:
    /// a caller that judges members (their fence, say) need only judge again those that
    /// stepped.
    pub fn keep_steps(&mut self) {
        self.steps.get_or_insert_with(Vec::new);
    }

    /// The steps kept since the last call, oldest first (none unless [`Self::keep_steps`]).
    pub fn take_steps(&mut self) -> Vec<(usize, Duration)> {
        self.steps.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Runs the world for `duration` of virtual time.
    pub fn run_for(&mut self, duration: Duration) {
        let end = self.now + duration;
        loop {
            let delivery = self.in_flight.next_at();
            let wakeup = self.wakeups.peek().map(|Reverse((at, _))| *at);
            let next = match (delivery, wakeup) {
                (Some(d), Some(w)) => d.min(w),
                (Some(t), None) | (None, Some(t)) => t,
                (None, None) => break,
            };
            if next > end {
                break;
            }
            self.now = next;
            if delivery == Some(next) {
                let d = self.in_flight.pop_due(next).expect("due now");
                if self.capture == Some((d.from, d.to)) {
                    self.captured.push(d.packet.clone());
                }
                self.deliver(d.to, &d.packet);
            } else {
                let Reverse((at, member)) = self.wakeups.pop().expect("peeked");
                self.wake(member, at);
            }
        }
        self.now = end;
    }

    /// Runs until `done` holds (checked every `step`) or `limit` passes; returns whether it held.
    pub fn run_until(
        &mut self,
        limit: Duration,
        step: Duration,
        mut done: impl FnMut(&Self) -> bool,
    ) -> bool {
        let end = self.now + limit;
        while self.now < end {
            if done(self) {
                return true;
            }
            self.run_for(step);
        }
        done(self)
    }

    pub fn reports(&self) -> &[Report] {
        &self.reports
    }

    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }

    /// When every member alive now, but `victim`, had declared `victim` dead; `None` while
    /// some have not.
    pub fn declared_dead_by_all(&self, victim: PeerId, since: Duration) -> Option<Duration> {
        let others = (0..self.members.len())
            .filter(|m| self.members[*m].peer.is_some() && Some(*m) != self.index_of(victim));
        self.declared_dead_by(victim, others, since)
    }

    /// When every one of `members` had declared `victim` dead; `None` while some have not.
    pub fn declared_dead_by(
        &self,
        victim: PeerId,
        members: impl IntoIterator<Item = usize>,
        since: Duration,
    ) -> Option<Duration> {
        let mut when: HashMap<usize, Duration> = HashMap::new();
        for r in self.reports.iter().filter(|r| r.at >= since) {
            if r.event == Event::Down(victim) {
                when.entry(r.member).or_insert(r.at);
            }
        }
        let mut last = since;
        for member in members {
            last = last.max(*when.get(&member)?);
        }
        Some(last)
    }

    /// Suspicions raised (probes that failed) since `since`.
    pub fn suspicions_since(&self, since: Duration) -> usize {
        self.reports
            .iter()
            .filter(|r| r.at >= since && matches!(r.event, Event::Suspected(_)))
            .count()
    }

    /// Members declared dead since `since`, as (who declared, whom).
    pub fn deaths_since(&self, since: Duration) -> Vec<(usize, PeerId)> {
        self.reports
            .iter()
            .filter(|r| r.at >= since)
            .filter_map(|r| match r.event {
                Event::Down(id) => Some((r.member, id)),
                _ => None,
            })
            .collect()
    }

    fn index_of(&self, id: PeerId) -> Option<usize> {
        self.by_addr.get(&id.addr).copied()
    }

    fn clock(&self) -> Now {
        Now {
            monotonic: self.now,
            unix_micros: EPOCH_MICROS + u64::try_from(self.now.as_micros()).unwrap_or(u64::MAX),
        }
    }

    fn wake(&mut self, member: usize, at: Duration) {
        if self.members[member].armed != Some(at) {
            return; // a stale wake-up: an earlier one already ran this member's timers
        }
        self.members[member].armed = None;
        let now = self.clock();
        if let Some(peer) = self.members[member].peer.as_mut() {
            peer.advance(now);
        }
        self.collect(member);
    }

    fn deliver(&mut self, member: usize, packet: &[u8]) {
        let now = self.clock();
        if let Some(peer) = self.members[member].peer.as_mut() {
            // Drops are counted by the member; the simulation has nothing to add.
            let _ = peer.receive(now, packet);
            self.collect(member);
        }
    }

    /// Takes what `member` left behind: packets onto the network, events into the reports,
    /// its next timer into the wake-up queue.
    fn collect(&mut self, member: usize) {
        let Some(peer) = self.members[member].peer.as_mut() else {
            return;
        };
        if let Some(steps) = self.steps.as_mut() {
            steps.push((member, self.now));
        }
        let outgoing = peer.take_outgoing();
        let events = peer.take_events();
        let deadline = peer.next_deadline();
        for event in events {
            self.reports.push(Report {
                at: self.now,
                member,
                event,
            });
        }
        if let Some(due) = deadline
            && self.members[member].armed.is_none_or(|armed| due < armed)
        {
            self.members[member].armed = Some(due);
            self.wakeups.push(Reverse((due, member)));
        }
        let (group, muted) = (self.members[member].group, self.members[member].muted);
        for out in outgoing {
            self.traffic.packets += 1;
            self.traffic.bytes += out.packet.len() as u64;
            let Some(&to) = self.by_addr.get(&out.to) else {
                continue;
            };
            let link = self.members[member]
                .link
                .as_ref()
                .or(self.members[to].link.as_ref())
                .unwrap_or(&self.network);
            if self.members[to].group != group || muted || self.rng.random_bool(link.loss) {
                self.traffic.lost += 1;
                continue;
            }
            let delay = link.latency + link.jitter.mul_f64(self.rng.random::<f64>());
            self.in_flight.push(
                self.now + delay,
                Delivery {
                    from: member,
                    to,
                    packet: out.packet,
                },
            );
        }
    }
}

/// Member `i`'s gossip address: 10.0.0.0/8 in order, one port.
pub fn address(i: usize) -> SocketAddr {
    let host = u32::try_from(i + 1).expect("fewer than 2^32 members");
    SocketAddr::new(Ipv4Addr::from(0x0a00_0000 | host).into(), PORT)
}

/// A packet on its way to a member.
struct Delivery {
    from: usize,
    to: usize,
    packet: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use foca::State;

    /// After a cut heals, a member greeting those it holds dead (as a daemon does when its
    /// fence reopens) is told at once that they hold it dead too: it rejoins as its next
    /// generation, finds them, and they take it in, all within 100 ms. Without the greeting
    /// only the periodic hello to dead members (every 2 s) would tell it; meanwhile two
    /// members each holding the other dead, both with a majority through a third, both
    /// answered for each other's IPs (ipam-sim seed 253 at 3 nodes, whose run the whole-cluster
    /// simulator checks; here the greeter is the side of one, whose fence the daemon would
    /// keep closed, which shows the exchange alone).
    #[test]
    fn greeting_the_dead_after_a_heal_rejoins_a_member_at_once() {
        let keyring = Keyring::new(("sim", &[7; 32]), []).expect("a 32-byte key");
        let mut sim = Simulation::warm(3, Timing::default(), NetworkModel::default(), keyring, 5);
        sim.run_for(Duration::from_secs(1));
        sim.partition(&[&[0, 1], &[2]]);
        sim.run_for(Duration::from_secs(3));
        let state = |sim: &Simulation, of: usize, member: usize| {
            let id = sim.id(member);
            sim.peer(of)
                .expect("running")
                .members()
                .find(|(m, _)| *m == id)
                .map(|(_, state)| state)
        };
        assert_eq!(state(&sim, 0, 2), Some(State::Down), "0 holds 2 dead");
        assert_eq!(state(&sim, 2, 0), Some(State::Down), "2 holds 0 dead");
        let before = sim.id(2);
        sim.heal();
        sim.greet_the_dead(2);
        sim.run_for(Duration::from_millis(100));
        assert!(sim.id(2).generation > before.generation, "2 rejoined");
        assert_eq!(
            state(&sim, 0, 2),
            Some(State::Alive),
            "0 took 2's new generation"
        );
        assert_eq!(state(&sim, 2, 0), Some(State::Alive), "2 found 0 again");
    }

    /// What a caller skipping from one event to the next relies on: nothing happens before
    /// `next_event_at`, and a member not among the steps kept has heard nothing new.
    #[test]
    fn a_member_changes_only_at_the_steps_kept_and_nothing_happens_before_the_next_event() {
        let keyring = Keyring::new(("sim", &[7; 32]), []).expect("a 32-byte key");
        let mut sim = Simulation::warm(5, Timing::default(), NetworkModel::default(), keyring, 3);
        sim.keep_steps();
        let seen = |sim: &Simulation, m: usize| {
            let peer = sim.peer(m).expect("running");
            (peer.contact().last_heard(), peer.alive())
        };
        let mut before: Vec<_> = (0..5).map(|m| seen(&sim, m)).collect();
        let mut stepped_in = 0;
        for ms in 1..=2_000 {
            if ms == 700 {
                sim.kill(4);
            }
            let end = Duration::from_millis(ms);
            let next = sim.next_event_at().expect("timers always run");
            assert!(next > sim.now(), "an event in the past at {ms} ms");
            sim.run_for(end - sim.now());
            let steps = sim.take_steps();
            assert!(
                steps
                    .iter()
                    .all(|(_, at)| *at <= end && *at > end - Duration::from_millis(1))
            );
            if next > end {
                assert!(steps.is_empty(), "a step before the next event, at {ms} ms");
            }
            stepped_in += usize::from(!steps.is_empty());
            for (m, was) in before.iter_mut().enumerate().take(4) {
                let now = seen(&sim, m);
                if !steps.iter().any(|(s, _)| *s == m) {
                    assert_eq!(now, *was, "member {m} changed without a step at {ms} ms");
                }
                *was = now;
            }
        }
        assert!(stepped_in >= 10, "steps within {stepped_in} ms of 2,000");
        assert!(before[0].1 < 4, "member 4 was seen die");
    }
}
