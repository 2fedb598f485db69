//! One member of the gossip, without a socket or a clock of its own: foca, its timers and the
//! envelope. Every call says what time it is; what the member wants sent, when it wants to be
//! woken and what it learned are left to be collected. The daemon drives it from a UDP socket
//! and a timer; the simulator drives thousands of them over a modelled network, in one thread,
//! deterministically.

use std::{collections::HashSet, net::SocketAddr, sync::Arc, time::Duration};

use foca::{
    Codec, Foca, Member, Message, NoCustomBroadcast, Notification, PostcardCodec, Runtime, State,
    Timer,
};
use rand::{SeedableRng, rngs::StdRng};

use crate::{
    NodeKey, PeerId, Signers,
    contact::{Contact, Hello},
    envelope::{Dropped, Envelope, FORGET_AFTER, Keyring},
    timers::Timers,
};

/// What time it is, twice: the monotonic clock for the protocol's timers, the wall clock for the
/// envelope's sequence numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Since any fixed moment, the same for every call to one member.
    pub monotonic: Duration,
    pub unix_micros: u64,
}

/// What a member learned about the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A peer is alive (first heard of, or back).
    Up(PeerId),
    /// The cluster declared a peer dead.
    Down(PeerId),
    /// A peer restarted: its new identity replaces the old one at the same address.
    Renamed { before: PeerId, after: PeerId },
    /// This member probed `0` and got no answer, directly or through others: it now suspects it.
    Suspected(PeerId),
    /// This member was declared dead by the others and rejoined as a new generation.
    Rejoined(PeerId),
    /// Some peer knows this member: it is in the cluster.
    Connected,
    /// Every peer this member knew is gone.
    Alone,
}

/// A packet to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub to: SocketAddr,
    pub packet: Vec<u8>,
}

/// Counters since the member started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub sent_packets: u64,
    pub sent_bytes: u64,
    pub received_packets: u64,
    pub received_bytes: u64,
    /// Packets dropped, by reason (indexed as [`Dropped::ALL`]).
    pub dropped: [u64; Dropped::ALL.len()],
    /// Probes that went unanswered, each making this member suspect the probed peer.
    pub suspicions: u64,
    /// Hellos said after a silence (see [`Hello`]).
    pub hellos: u64,
    /// Packets not sent: no single record says how their recipient speaks (contested,
    /// unknown, or its key missing or unreadable), so it would drop them.
    pub unreachable: u64,
}

impl Stats {
    pub fn dropped(&self, reason: Dropped) -> u64 {
        self.dropped[reason as usize]
    }
}

/// How the member runs: foca's settings (see [`crate::Timing`]) and the seed of its random
/// choices (a fixed one makes a simulation repeat exactly).
pub struct Settings {
    pub protocol: foca::Config,
    /// When a member that has heard nothing asks a live member for an answer.
    pub hello: Hello,
    pub seed: Option<u64>,
}

impl Settings {
    pub fn new(timing: &crate::Timing, cluster_size: usize) -> Self {
        Self {
            protocol: timing.protocol(cluster_size),
            hello: timing.hello(),
            seed: None,
        }
    }
}

/// Members a rejoined member announces itself to; any one answering is enough.
const GREETINGS_AFTER_REJOIN: usize = 8;

/// Members held dead a member greets when its fence reopens ([`Peer::greet_the_dead`]): any
/// one of a healed partition's other side that answers is enough, and a few truly dead ones
/// among them cost a packet each.
const GREETINGS_OF_THE_DEAD: usize = 16;

/// Members one hello goes to: any one answering is enough, two make a lost packet matter less.
const HELLO_FANOUT: usize = 2;

/// How often a member forgets what it kept of addresses that are no longer members (see
/// [`Peer::remembered`]); each time costs a pass over the membership.
const FORGET_EVERY: Duration = Duration::from_secs(10);

/// What a member keeps per address besides foca's membership, which foca bounds itself (a
/// member declared dead is removed after its `remove_down_after`). Senders are the members and
/// those that left within [`FORGET_AFTER`] (and one [`FORGET_EVERY`]); recipients the members
/// and those sent to since the last pass (foca greets a couple of dead members now and then).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Remembered {
    /// Senders whose replay window the envelope keeps.
    pub senders: usize,
    /// Recipients whose counter the envelope keeps.
    pub recipients: usize,
    /// Senders whose last packet the contact keeps (the fence's input, "last heard").
    pub heard_from: usize,
}

type Protocol = Foca<PeerId, PostcardCodec, StdRng, NoCustomBroadcast>;

pub struct Peer {
    protocol: Protocol,
    envelope: Envelope,
    timers: Timers,
    collected: Collected,
    stats: Stats,
    contact: Contact,
    hello: Hello,
    last_hello: Option<Duration>,
    /// How many members held dead were greeted at reopenings: where the next greeting starts.
    dead_greeted: usize,
    /// When to next forget addresses that left (`forget_departed`).
    next_forget: Duration,
}

/// What calls left for the driver.
#[derive(Default)]
struct Collected {
    outgoing: Vec<Outgoing>,
    events: Vec<Event>,
}

impl Peer {
    /// A member at `id`, sealing with the cluster's `keyring` and signing with its own `key`
    /// (whose public half its record must publish). It takes no packet until it is given the
    /// records' word on who speaks for each address ([`Peer::set_signers`]).
    pub fn new(id: PeerId, settings: Settings, keyring: Keyring, key: NodeKey) -> Self {
        let rng = match settings.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => rand::make_rng(),
        };
        Self {
            protocol: Foca::new(id, settings.protocol, rng, PostcardCodec),
            envelope: Envelope::new(keyring, key, id.addr),
            timers: Timers::new(),
            collected: Collected::default(),
            stats: Stats::default(),
            contact: Contact::default(),
            hello: settings.hello,
            last_hello: None,
            dead_greeted: 0,
            next_forget: Duration::ZERO,
        }
    }

    pub fn id(&self) -> PeerId {
        *self.protocol.identity()
    }

    /// Asks `seeds` (addresses of other agents, from the store's node records) to let this
    /// member in; any one that answers is enough.
    pub fn join(&mut self, now: Now, seeds: impl IntoIterator<Item = SocketAddr>) {
        for addr in seeds {
            if addr == self.id().addr {
                continue;
            }
            // The seed's generation is not known yet: its answer carries its real identity.
            let seed = PeerId::new(addr, 0);
            let (protocol, mut sink) = self.split(now);
            // Only an oversized message fails to be sent; an announce never is one.
            let _ = protocol.announce(seed, &mut sink);
        }
        self.gossip_news(now);
    }

    /// Says hello to the members this one holds dead, up to [`GREETINGS_OF_THE_DEAD`] of
    /// them: call it when the fence reopens. After a partition heals, two members that each
    /// declared the other dead can both see a majority through a third (one that restarted,
    /// whose new generation both took): both fences open, and each takes the other's IPs
    /// after the hand-over's wait, answering them next to it (ipam-sim seed 253 at 3 nodes,
    /// 727 at 5). foca ignores what a member it holds dead says, so the two would learn of
    /// each other only at a periodic greeting (`reannounce_every`, 2 s). Greeted now, a member
    /// holding this one dead answers that it was declared dead (`TurnUndead`), and one that
    /// this one holds dead is told the same by foca: each rejoins as a new generation, its
    /// fence closes, and what it would have taken it never answers.
    ///
    /// Only members with a node record are greeted (the others cannot be sent to), and each
    /// reopening takes the next ones in turn: foca keeps members held dead for a day, and
    /// the same first few, long gone, would be greeted every time.
    pub fn greet_the_dead(&mut self, now: Now) {
        let dead: Vec<PeerId> = self
            .protocol
            .iter_membership_state()
            .filter(|m| m.state() == State::Down && self.envelope.can_reach(m.id().addr))
            .map(|m| *m.id())
            .collect();
        let to = in_turn(&dead, self.dead_greeted, GREETINGS_OF_THE_DEAD);
        self.dead_greeted = self.dead_greeted.wrapping_add(to.len());
        self.say_hello_to(now, to);
    }

    /// Announces this member to each of `to`, counted as hellos.
    fn say_hello_to(&mut self, now: Now, to: Vec<PeerId>) {
        let (protocol, mut sink) = self.split(now);
        for member in to {
            // Only an oversized message fails to be sent; an announce never is one.
            let _ = protocol.announce(member, &mut sink);
            sink.stats.hellos += 1;
        }
    }

    /// Learns `members` as alive without telling anyone: a warm start from known state.
    pub fn assume_alive(&mut self, now: Now, members: impl IntoIterator<Item = PeerId>) {
        let me = self.id();
        let members = members.into_iter().filter(|m| *m != me).map(Member::alive);
        let (protocol, mut sink) = self.split(now);
        let _ = protocol.apply_many(members, false, &mut sink);
        self.gossip_news(now);
    }

    /// Hands a received packet to the member.
    pub fn receive(&mut self, now: Now, packet: &[u8]) -> Result<(), Dropped> {
        self.stats.received_packets += 1;
        self.stats.received_bytes += packet.len() as u64;
        let events_before = self.collected.events.len();
        let outcome = self.open_and_handle(now, packet);
        self.gossip_news(now);
        match outcome {
            Ok(from) => {
                self.contact.heard(now.monotonic, from);
                if self.collected.events[events_before..]
                    .iter()
                    .any(|e| matches!(e, Event::Rejoined(_)))
                {
                    self.greet_after_rejoin(now);
                }
                Ok(())
            }
            Err(reason) => {
                self.stats.dropped[reason as usize] += 1;
                Err(reason)
            }
        }
    }

    /// A rejoined member starts disconnected, with its timers reset, and takes only messages
    /// addressed to its new name; foca announces that name by gossiping to the members it
    /// holds alive, under their old names. When those members rejoined too (both sides of a
    /// healed partition, each told by the other that it was declared dead), every such message
    /// is ignored and all of them wait, silent, for ever. An announce is taken by whatever
    /// identity now lives at the address, and its answer is addressed to the new name. The
    /// members held dead come after those held alive: after a heal, the member that said this
    /// one was dead is often one it holds dead itself ([`Peer::greet_the_dead`]), and the
    /// only one it could reach.
    fn greet_after_rejoin(&mut self, now: Now) {
        let members = || self.protocol.iter_membership_state();
        let alive = members().filter(|m| m.state() != State::Down);
        let dead = members().filter(|m| m.state() == State::Down);
        let addrs: Vec<SocketAddr> = alive
            .chain(dead)
            .map(|m| m.id().addr)
            .take(GREETINGS_AFTER_REJOIN)
            .collect();
        self.join(now, addrs);
    }

    /// The sender of an authentic packet the protocol took.
    fn open_and_handle(&mut self, now: Now, packet: &[u8]) -> Result<SocketAddr, Dropped> {
        let (from, message) = self.envelope.open(now.unix_micros, packet)?;
        // The envelope proves who sealed the packet; the protocol reads its sender from the
        // message's own header, and would answer, count alive or take an ack from whoever that
        // names. A node may speak only as itself: the two must be the same member.
        let header: foca::Header<PeerId> = PostcardCodec
            .decode_header(message)
            .map_err(|_| Dropped::Malformed)?;
        if header.src.addr != from {
            return Err(Dropped::Impersonating);
        }
        let (protocol, mut sink) = self.split(now);
        protocol
            .handle_data(message, &mut sink)
            .map_err(|e| match e {
                foca::Error::MalformedPacket | foca::Error::Decode(_) | foca::Error::DataTooBig => {
                    Dropped::Malformed
                }
                _ => Dropped::Refused,
            })
            .map(|()| from)
    }

    /// Runs every timer due by `now`.
    pub fn advance(&mut self, now: Now) {
        while let Some(timer) = self.timers.pop_due(now.monotonic, self.has_news()) {
            if self.refuted(&timer) {
                continue;
            }
            let (protocol, mut sink) = self.split(now);
            // Timer errors are about sending (oversized data), which foca's own messages are not.
            let _ = protocol.handle_timer(timer, &mut sink);
        }
        self.say_hello_if_silent(now);
        self.gossip_news(now);
        self.forget_departed(now);
    }

    /// Forgets, every [`FORGET_EVERY`], what the envelope and the contact keep of addresses
    /// that are no longer active members (declared dead, left, or never joined: a seed, a
    /// forged sender) and were silent for [`FORGET_AFTER`]. Members come and go (nodes
    /// replaced, addresses reused elsewhere): without this, a long-running member kept an entry
    /// per address it ever heard. A member is never forgotten, whatever its silence; the time
    /// bound is what keeps replays out (see [`crate::envelope`]).
    fn forget_departed(&mut self, now: Now) {
        if now.monotonic < self.next_forget {
            return;
        }
        self.next_forget = now.monotonic + FORGET_EVERY;
        let members: HashSet<SocketAddr> =
            self.protocol.iter_members().map(|m| m.id().addr).collect();
        let is_member = |addr: &SocketAddr| members.contains(addr);
        self.envelope.forget(now.unix_micros, is_member);
        self.contact.forget(now.monotonic, FORGET_AFTER, is_member);
    }

    /// How much per-address state this member keeps (see [`Remembered`]).
    pub fn remembered(&self) -> Remembered {
        let (senders, recipients) = self.envelope.remembered();
        Remembered {
            senders,
            recipients,
            heard_from: self.contact.senders_heard(),
        }
    }

    /// Whether this member keeps anything of what it received from `addr`: its replay window,
    /// or when it was last heard from. (A counter of what it sends to `addr` is kept only
    /// while `addr` is a member, or was sent to since the last pass.)
    pub fn remembers(&self, addr: SocketAddr) -> bool {
        self.envelope.remembers_sender(addr) || self.contact.last_heard_from(addr).is_some()
    }

    /// When this member is due to say hello next, if it is silent long enough.
    fn next_hello(&self) -> Option<Duration> {
        self.hello
            .next_at(self.contact.last_heard(), self.last_hello)
    }

    /// Asks members held alive for an answer when nothing was heard for a while (see
    /// [`Hello`]), taking the next ones in turn each time so that a second hello goes elsewhere
    /// when it can.
    fn say_hello_if_silent(&mut self, now: Now) {
        if self.next_hello().is_none_or(|at| at > now.monotonic) {
            return;
        }
        self.last_hello = Some(now.monotonic);
        let alive: Vec<PeerId> = self
            .protocol
            .iter_membership_state()
            .filter(|m| m.state() == State::Alive)
            .map(|m| *m.id())
            .collect();
        let to = in_turn(&alive, self.stats.hellos as usize, HELLO_FANOUT);
        self.say_hello_to(now, to);
    }

    /// Whether foca has changes to pass on.
    fn has_news(&self) -> bool {
        self.protocol.updates_backlog() > 0
    }

    /// A gossip round set aside for want of news is due again once there is some.
    fn gossip_news(&mut self, now: Now) {
        if self.has_news() {
            self.timers.news(now.monotonic);
        }
    }

    /// Whether `timer` would declare down a member that refuted its suspicion in the meantime.
    ///
    /// foca 2.0 then leaves the member alive, as it should, but still sends it the courtesy
    /// "you were declared down" (`TurnUndead`): the member believes it and rejoins as its next
    /// generation. Every refuted suspicion became a rejoin, so on a lossy link the identities
    /// churned and real deaths followed (a member suspected under its old name). Skipping the
    /// timer is otherwise what foca does with it: nothing.
    fn refuted(&self, timer: &Timer<PeerId>) -> bool {
        let Timer::ChangeSuspectToDown {
            member_id,
            incarnation,
            ..
        } = timer
        else {
            return false;
        };
        !self.protocol.iter_membership_state().any(|m| {
            m.id() == member_id && m.incarnation() == *incarnation && m.state() == State::Suspect
        })
    }

    /// When [`Peer::advance`] next has work.
    pub fn next_deadline(&self) -> Option<Duration> {
        [self.timers.next_at(), self.next_hello()]
            .into_iter()
            .flatten()
            .min()
    }

    pub fn take_outgoing(&mut self) -> Vec<Outgoing> {
        std::mem::take(&mut self.collected.outgoing)
    }

    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.collected.events)
    }

    /// Tells the cluster this member leaves (a clean stop): peers declare it down at once
    /// instead of after the suspicion delay.
    pub fn leave(&mut self, now: Now) {
        let (protocol, mut sink) = self.split(now);
        let _ = protocol.leave_cluster(&mut sink);
        self.gossip_news(now);
    }

    /// Every peer this member knows of, with what it believes of each.
    pub fn members(&self) -> impl Iterator<Item = (PeerId, State)> + '_ {
        self.protocol
            .iter_membership_state()
            .map(|m| (*m.id(), m.state()))
    }

    /// A summary of [`Peer::members`] that changes whenever a member joins, leaves, is renamed
    /// or changes state, whatever the order foca keeps them in: the daemon rebuilds what it
    /// derives from the membership (the fence's view, who is live) only when this changes,
    /// not after every packet. A sum of one hash per member: no allocation, no order.
    pub fn membership_digest(&self) -> u64 {
        use std::hash::{BuildHasher as _, BuildHasherDefault, DefaultHasher};
        let hasher = BuildHasherDefault::<DefaultHasher>::default();
        self.protocol.iter_membership_state().fold(0u64, |sum, m| {
            let state: u8 = match m.state() {
                State::Alive => 0,
                State::Suspect => 1,
                State::Down => 2,
            };
            sum.wrapping_add(hasher.hash_one((m.id(), state)))
        })
    }

    /// Peers this member holds alive (suspects included: SWIM counts them alive until they
    /// are declared dead).
    pub fn active(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.protocol.iter_members().map(|m| *m.id())
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The peers this member holds alive and does not suspect.
    pub fn alive(&self) -> usize {
        self.protocol
            .iter_membership_state()
            .filter(|m| m.state() == State::Alive)
            .count()
    }

    /// What this member heard lately: the fence's input.
    pub fn contact(&self) -> &Contact {
        &self.contact
    }

    pub fn set_keyring(&mut self, keyring: Keyring) {
        self.envelope.set_keyring(keyring);
    }

    /// Replaces the records' word on who speaks for each address (the records changed).
    pub fn set_signers(&mut self, signers: Arc<Signers>) {
        self.envelope.set_signers(signers);
    }

    fn split(&mut self, now: Now) -> (&mut Protocol, Sink<'_>) {
        (
            &mut self.protocol,
            Sink {
                now,
                envelope: &mut self.envelope,
                timers: &mut self.timers,
                collected: &mut self.collected,
                stats: &mut self.stats,
                contact: &mut self.contact,
            },
        )
    }
}

/// foca's side effects, turned into packets, timers and events.
struct Sink<'a> {
    now: Now,
    envelope: &'a mut Envelope,
    timers: &'a mut Timers,
    collected: &'a mut Collected,
    stats: &'a mut Stats,
    contact: &'a mut Contact,
}

impl Runtime<PeerId> for Sink<'_> {
    fn notify(&mut self, notification: Notification<'_, PeerId>) {
        let event = match notification {
            Notification::MemberUp(id) => Event::Up(*id),
            Notification::MemberDown(id) => Event::Down(*id),
            Notification::Rename(before, after) => Event::Renamed {
                before: *before,
                after: *after,
            },
            Notification::ProbeFailed(_, id) => {
                self.stats.suspicions += 1;
                self.contact.failed(self.now.monotonic, id.addr);
                Event::Suspected(*id)
            }
            Notification::Rejoin(id) => {
                self.contact.declared_dead();
                Event::Rejoined(*id)
            }
            Notification::Active => Event::Connected,
            Notification::Idle | Notification::Defunct => Event::Alone,
            Notification::DataReceived(header) => {
                if let Message::Ack(probe)
                | Message::ForwardedAck {
                    probe_number: probe,
                    ..
                } = header.message
                {
                    self.contact.answered(self.now.monotonic, probe);
                }
                return;
            }
            Notification::DataSent(_) => return,
        };
        self.collected.events.push(event);
    }

    fn send_to(&mut self, to: PeerId, data: &[u8]) {
        if !self.envelope.can_reach(to.addr) {
            self.stats.unreachable += 1;
            return;
        }
        let packet = self.envelope.seal(self.now.unix_micros, to.addr, data);
        self.stats.sent_packets += 1;
        self.stats.sent_bytes += packet.len() as u64;
        self.collected.outgoing.push(Outgoing {
            to: to.addr,
            packet,
        });
    }

    fn submit_after(&mut self, timer: Timer<PeerId>, after: Duration) {
        self.timers.submit(self.now.monotonic + after, timer);
    }
}

/// Up to `n` of `items`, from the `first`th on, wrapping round: the next ones in turn.
fn in_turn<T: Copy>(items: &[T], first: usize, n: usize) -> Vec<T> {
    (0..n.min(items.len()))
        .map(|i| items[first.wrapping_add(i) % items.len()])
        .collect()
}
