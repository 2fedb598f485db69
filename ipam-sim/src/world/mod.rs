//! The modelled cluster and its clock: nodes, the store, the gossip (`ipam_gossip::sim`, the
//! protocol code the daemon runs over a modelled network), and the events of a run. Time is
//! counted in steps of [`STEP`], and the world goes from one instant where something may happen
//! to the next (`schedule`): the gossip runs on its own clock to that instant, the events and
//! the things due then happen, every agent with something to do takes its watch deliveries,
//! judges its fence, beats, and decides when its pace says so (`agents`), the operator runs
//! (`operator`), and the invariants are checked on what the datapaths answer (`invariants`).

mod agents;
mod dead_nodes;
mod invariants;
mod operator;

pub use dead_nodes::EVIDENCE;

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque},
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use ipam_core::{
    l2::{owners::Decider, restarts::CLOCK_SKEW},
    resources::RestartNotice,
};
use ipam_gossip::{
    Keyring, Latch, Timing,
    sim::{NetworkModel, Simulation, address},
};
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::{
    check::Violation,
    node::{Agent, Datapath, Kubelet, LIVENESS_TIMEOUT, Node, Reporter},
    scenario::{Config, Event, Timed},
    schedule::{FenceChanges, STEP, Stepping, round_up, step_at_or_after},
    store::{self, Change, Store, WatchCursor, node_name},
};

/// How soon after the last disturbance (a fault's end, a restart promise's legitimate end)
/// every IP with an eligible node must be answered by its owner alone.
pub const BOUND: Duration = Duration::from_secs(6);
/// The wall clock at virtual time zero, in Unix ms.
const EPOCH_MS: u64 = 1_800_000_000_000;
/// How many happenings the trace keeps before a failure.
const TRACE: usize = 60;

/// Something the world does at a set time on its own (the ends of events).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    /// A node's next agent starts (void if the node's epoch moved on).
    AgentStart {
        node: usize,
        epoch: u64,
    },
    PowerOn {
        node: usize,
    },
    NicUp {
        node: usize,
    },
    /// A network fault ends.
    NetworkEnds {
        id: usize,
    },
    /// A stopping agent's restart notice reaches the store.
    NoticeWritten {
        node: usize,
        epoch: u64,
        started: Duration,
        within: Duration,
        /// What the responders answered when the stop began: the notice's list.
        answering: Vec<IpAddr>,
    },
    /// A restarted agent's clearing of its notice reaches the store.
    NoticeCleared {
        node: usize,
    },
}

/// A network fault in force.
#[derive(Debug, Clone)]
enum NetworkFault {
    Partition(Vec<usize>),
    OneWay(usize),
    Loss(u32),
    Isolated(usize),
    /// The node's gossip packets dropped by a firewall: cut off in the gossip alone.
    GossipBlocked(usize),
}

/// What happened in a run.
#[derive(Debug, Clone, Default)]
pub struct Exercised {
    /// Events applied, by kind.
    pub events: BTreeMap<&'static str, u64>,
    /// Invariant checks made, by invariant.
    pub checks: BTreeMap<&'static str, u64>,
    /// The instants the world was looked at and checked (with [`Stepping::EveryStep`], every
    /// step).
    pub steps: u64,
    /// How long the run lasted, in the model's time.
    pub simulated: Duration,
    pub decisions: u64,
    /// A hash of every happening noted, in order (the trace keeps the last few): two runs
    /// that differ in anything they noted differ here.
    pub happenings: u64,
    /// The nodes whose pods the operator set not ready, and when.
    pub marked: Vec<(Duration, String)>,
}

pub struct World {
    now: Duration,
    stepping: Stepping,
    base: Instant,
    rng: StdRng,
    gossip: Simulation,
    by_addr: HashMap<SocketAddr, usize>,
    reports_seen: usize,
    nodes: Vec<Node>,
    /// When each node's agent must be looked at next, with nothing changing it from outside.
    wakes: Vec<Duration>,
    store: Store,
    /// The store's revision when every watch's next delivery was last taken into `wakes`.
    store_followed: usize,
    /// The store's revision when the Services' addresses were last checked.
    addresses_checked: Option<usize>,
    /// The addresses no node may answer for (`check::refused_listings`), and the store's
    /// revision they were worked out at.
    refused: std::collections::BTreeMap<std::net::IpAddr, String>,
    refused_checked: Option<usize>,
    events: VecDeque<Timed>,
    due: BinaryHeap<Reverse<(Duration, u64, Due)>>,
    sequence: u64,
    network: BTreeMap<usize, NetworkFault>,
    network_ids: usize,
    /// When every IP must be answered by its owner: [`BOUND`] after the last disturbance.
    settled_at: Duration,
    end: Duration,
    trace: VecDeque<String>,
    operator: operator::Operator,
    reachability: dead_nodes::Reachability,
    pub exercised: Exercised,
}

impl World {
    /// The world of `seed` with `events` (those of [`crate::scenario::events`], or a subset).
    pub fn new(config: &Config, seed: u64, events: &[Timed]) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let objects = store::initial(config.nodes, config.services, &mut rng);
        let keyring = Keyring::new(("sim", &[7; 32]), []).expect("a 32-byte key");
        let mut gossip = Simulation::warm(
            config.nodes,
            Timing::default(),
            NetworkModel::default(),
            keyring,
            seed,
        );
        gossip.keep_steps();
        let by_addr = (0..config.nodes).map(|i| (address(i), i)).collect();
        let store = Store::new(objects);
        let base = Instant::now();
        let mut nodes = Vec::with_capacity(config.nodes);
        for i in 0..config.nodes {
            nodes.push(Node {
                name: node_name(i),
                powered: true,
                nic_up: true,
                datapath: Datapath::default(),
                agent: None,
                epoch: 0,
                generation: 2,
                promise: None,
                skew_ms: rng.random_range(-200..=200),
                kubelet: match rng.random_range(0..4) {
                    0 | 1 => Kubelet::Open,
                    2 => Kubelet::Dropped,
                    _ => Kubelet::Rejected,
                },
            });
        }
        let mut world = Self {
            now: Duration::ZERO,
            stepping: config.stepping,
            base,
            rng,
            gossip,
            by_addr,
            reports_seen: 0,
            nodes,
            wakes: vec![Duration::MAX; config.nodes],
            store,
            store_followed: 0,
            addresses_checked: None,
            refused: std::collections::BTreeMap::new(),
            refused_checked: None,
            events: events.iter().cloned().collect(),
            due: BinaryHeap::new(),
            sequence: 0,
            network: BTreeMap::new(),
            network_ids: 0,
            settled_at: BOUND,
            end: Duration::ZERO,
            trace: VecDeque::new(),
            operator: operator::Operator::default(),
            reachability: dead_nodes::Reachability::new(),
            exercised: Exercised {
                happenings: 0xcbf2_9ce4_8422_2325,
                ..Exercised::default()
            },
        };
        for i in 0..config.nodes {
            world.start_agent(i, false);
        }
        let last = events.iter().map(|e| e.at + e.event.lasting()).max();
        world.end =
            last.unwrap_or_default().max(Duration::from_secs(3)) + BOUND + Duration::from_secs(6);
        world
    }

    /// What node `node`'s firewall does to its kubelet's port (drawn from the seed).
    pub fn kubelet(&self, node: usize) -> Kubelet {
        self.nodes[node].kubelet
    }

    /// Runs to the end, or to the first broken invariant.
    pub fn run(&mut self) -> Result<(), Violation> {
        while self.now < self.end {
            let next = self.next_instant().min(self.end);
            self.instant(next)?;
        }
        Ok(())
    }

    /// The next instant at which anything may happen: a packet or a member's timer in the
    /// gossip, an event, something due, an agent or the operator with something to do, a
    /// check of every IP's owner. Every step between changes nothing (but the responders
    /// whose deadline passes, which only silences them).
    fn next_instant(&self) -> Duration {
        let after = self.now + STEP;
        if self.stepping == Stepping::EveryStep {
            return after;
        }
        let answered_check = round_up(self.settled_at.max(after), invariants::ANSWERED_EVERY);
        [
            self.gossip.next_event_at().map(step_at_or_after),
            self.events.front().map(|e| step_at_or_after(e.at)),
            self.due
                .peek()
                .map(|Reverse((at, _, _))| step_at_or_after(*at)),
            self.wakes.iter().min().copied(),
            self.operator.next_instant(self.now),
            Some(answered_check),
        ]
        .into_iter()
        .flatten()
        .min()
        .map_or(after, |next| next.max(after))
    }

    /// The world at `now`, after nothing happened since the last instant, and its check.
    fn instant(&mut self, now: Duration) -> Result<(), Violation> {
        self.gossip.run_for(now - self.now);
        self.now = now;
        self.exercised.steps += 1;
        self.exercised.simulated = now;
        while self.events.front().is_some_and(|e| e.at <= self.now) {
            let timed = self.events.pop_front().expect("peeked");
            self.apply(timed);
        }
        while self
            .due
            .peek()
            .is_some_and(|Reverse((at, _, _))| *at <= self.now)
        {
            let Reverse((_, _, due)) = self.due.pop().expect("peeked");
            self.carry_out(due);
        }
        self.follow_reachability();
        self.follow_gossip_reports();
        self.follow_gossip_steps();
        for i in 0..self.nodes.len() {
            if self.stepping == Stepping::EveryStep || self.wakes[i] <= now {
                self.run_agent(i);
            }
        }
        self.run_operator()?;
        self.follow_store();
        self.check()
    }

    fn at(&self, d: Duration) -> Instant {
        self.base + d
    }

    fn wall_ms(&self, node: usize) -> u64 {
        let ms = EPOCH_MS as i64 + self.now.as_millis() as i64 + self.nodes[node].skew_ms;
        u64::try_from(ms).unwrap_or(0)
    }

    fn schedule(&mut self, after: Duration, due: Due) {
        self.sequence += 1;
        self.due
            .push(Reverse((self.now + after, self.sequence, due)));
    }

    fn note(&mut self, what: String) {
        if self.trace.len() == TRACE {
            self.trace.pop_front();
        }
        let line = format!("t={:>7.3}s {what}", self.now.as_secs_f64());
        // FNV-1a, fixed here so that the hash means the same in every build.
        for byte in line.bytes().chain([b'\n']) {
            self.exercised.happenings ^= u64::from(byte);
            self.exercised.happenings = self.exercised.happenings.wrapping_mul(0x0100_0000_01b3);
        }
        self.trace.push_back(line);
    }

    /// The run's end moves past `end` + [`BOUND`], and the settled point too.
    fn disturbed_until(&mut self, end: Duration) {
        self.settled_at = self.settled_at.max(end + BOUND);
        self.end = self.end.max(end + BOUND + Duration::from_secs(2));
    }

    fn apply(&mut self, timed: Timed) {
        self.reachability.changed = true;
        *self.exercised.events.entry(timed.event.kind()).or_default() += 1;
        self.note(format!("event {:?}", timed.event));
        self.disturbed_until(self.now + timed.event.lasting());
        match timed.event {
            Event::PowerLoss { node, back_after } => {
                let n = &mut self.nodes[node];
                if !n.powered {
                    return;
                }
                n.powered = false;
                n.agent = None;
                n.epoch += 1;
                n.datapath = Datapath::default();
                n.promise = None;
                self.gossip.kill(node);
                if let Some(after) = back_after {
                    self.schedule(after, Due::PowerOn { node });
                }
            }
            Event::Kill { node, back_after } => {
                if self.stop_agent(node) {
                    self.gossip.kill(node);
                    let epoch = self.nodes[node].epoch;
                    self.schedule(back_after, Due::AgentStart { node, epoch });
                }
            }
            Event::StopForRestart {
                node,
                within,
                back_after,
            } => self.stop_for_restart(node, within, back_after),
            Event::StopToLeave { node, back_after } => {
                if self.stop_agent(node) {
                    self.nodes[node].datapath.deadline = self.now;
                    self.gossip.stop(node);
                    let epoch = self.nodes[node].epoch;
                    self.schedule(back_after, Due::AgentStart { node, epoch });
                }
            }
            Event::NicDown { node, lasting } => {
                if self.nodes[node].nic_up {
                    self.nodes[node].nic_up = false;
                    let id = self.network_fault(NetworkFault::Isolated(node));
                    self.schedule(lasting, Due::NetworkEnds { id });
                    self.schedule(lasting, Due::NicUp { node });
                    self.stall_watch(node, lasting);
                }
            }
            Event::Partition { side, lasting } => {
                let id = self.network_fault(NetworkFault::Partition(side));
                self.schedule(lasting, Due::NetworkEnds { id });
            }
            Event::OneWay { node, lasting } => {
                let id = self.network_fault(NetworkFault::OneWay(node));
                self.schedule(lasting, Due::NetworkEnds { id });
            }
            Event::GossipBlocked { node, lasting } => {
                let id = self.network_fault(NetworkFault::GossipBlocked(node));
                self.schedule(lasting, Due::NetworkEnds { id });
            }
            Event::Loss { per_mille, lasting } => {
                let id = self.network_fault(NetworkFault::Loss(per_mille));
                self.schedule(lasting, Due::NetworkEnds { id });
            }
            Event::WatchStall { node, lasting } => self.stall_watch(node, lasting),
            Event::ServiceCreated { service, requests } => {
                let (name, mut spec) = store::service(service);
                if self.store.now.service_revisions.contains_key(&name) {
                    return;
                }
                if let Some(of) = requests {
                    // Asks for the IP another Service holds (another tenant's, say).
                    let held = self
                        .store
                        .now
                        .services
                        .get(of % self.store.now.services.len().max(1));
                    spec.requested_ips = held
                        .and_then(|s| s.2.ingress.first().copied())
                        .into_iter()
                        .collect();
                }
                let row = (name, spec, Default::default());
                self.store.write(self.now, Change::Service(Box::new(row)));
            }
            Event::ServiceDeleted { service } => {
                let Some((name, _, _)) = self.store.now.services.get(service) else {
                    return;
                };
                let name = name.clone();
                self.store.write(self.now, Change::ServiceGone(name));
            }
            Event::EndpointsMove { service, to } => {
                let Some((name, _, _)) = self.store.now.services.get(service) else {
                    return;
                };
                let name = name.clone();
                let on = to.iter().map(|n| node_name(*n)).collect();
                self.store.write(self.now, Change::Ready(name, on));
            }
        }
    }

    fn stall_watch(&mut self, node: usize, lasting: Duration) {
        let until = self.now + lasting;
        if let Some(agent) = self.nodes[node].agent.as_mut() {
            agent.watch.stalled_until = agent.watch.stalled_until.max(until);
            self.wake(node);
        }
    }

    /// Ends the node's agent, if one runs; returns whether one did.
    fn stop_agent(&mut self, node: usize) -> bool {
        let n = &mut self.nodes[node];
        if n.agent.is_none() {
            return false;
        }
        n.agent = None;
        n.epoch += 1;
        true
    }

    /// The stopping half of a restart promise (`liveness::restart`): with its fence open, the
    /// agent writes the notice; once written, it extends its responders to `within` from
    /// before the write and leaves the gossip without a goodbye. With its fence closed it
    /// stops as for a leave.
    fn stop_for_restart(&mut self, node: usize, within: Duration, back_after: Option<Duration>) {
        let Some(agent) = self.nodes[node].agent.as_ref() else {
            return;
        };
        let fence_open = agent.latch.is_open();
        let epoch = self.nodes[node].epoch;
        if !fence_open {
            self.stop_agent(node);
            self.nodes[node].datapath.deadline = self.now;
            self.gossip.stop(node);
            if let Some(after) = back_after {
                let epoch = self.nodes[node].epoch;
                self.schedule(after, Due::AgentStart { node, epoch });
            }
            return;
        }
        // The owners controller stops deciding (one under way is waited for), then the list
        // is read.
        self.wake(node);
        let agent = self.nodes[node].agent.as_mut().expect("checked above");
        agent.frozen = true;
        if let Some((_, plan)) = agent.deciding.take()
            && let Some(answers) = plan.answers
        {
            self.nodes[node].datapath.answering = answers.answering.keys().copied().collect();
        }
        let latency = self.write_latency();
        let answering = self.nodes[node]
            .datapath
            .answering
            .iter()
            .copied()
            .collect();
        self.schedule(
            latency,
            Due::NoticeWritten {
                node,
                epoch,
                started: self.now,
                within,
                answering,
            },
        );
        if let Some(after) = back_after {
            // The next agent: the epoch after the one the write ends.
            self.schedule(
                after.max(latency),
                Due::AgentStart {
                    node,
                    epoch: epoch + 1,
                },
            );
        }
    }

    fn write_latency(&mut self) -> Duration {
        Duration::from_millis(self.rng.random_range(2..=30))
    }

    fn network_fault(&mut self, fault: NetworkFault) -> usize {
        self.network_ids += 1;
        self.network.insert(self.network_ids, fault);
        self.apply_network();
        self.network_ids
    }

    /// Brings the gossip's network in line with the faults in force.
    fn apply_network(&mut self) {
        self.gossip.heal();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for fault in self.network.values() {
            match fault {
                NetworkFault::Partition(side) => groups.push(side.clone()),
                NetworkFault::Isolated(node) | NetworkFault::GossipBlocked(node) => {
                    groups.push(vec![*node]);
                }
                NetworkFault::OneWay(_) | NetworkFault::Loss(_) => {}
            }
        }
        // A node isolated alone wins over a partition's side it is on.
        let mut group_of: BTreeMap<usize, usize> = BTreeMap::new();
        for (g, members) in groups.iter().enumerate() {
            for m in members {
                group_of.insert(*m, g);
            }
        }
        let mut by_group: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (m, g) in group_of {
            by_group.entry(g).or_default().push(m);
        }
        let slices: Vec<&[usize]> = by_group.values().map(Vec::as_slice).collect();
        self.gossip.partition(&slices);
        for fault in self.network.values() {
            if let NetworkFault::OneWay(node) = fault {
                self.gossip.mute(*node);
            }
        }
        self.gossip.set_network(NetworkModel {
            loss: self.loss(),
            ..NetworkModel::default()
        });
    }

    fn carry_out(&mut self, due: Due) {
        self.reachability.changed = true;
        match due {
            Due::AgentStart { node, epoch } => {
                let n = &self.nodes[node];
                if n.powered && n.agent.is_none() && n.epoch == epoch {
                    let inherits = n.promise.is_some_and(|until| self.now < until);
                    self.start_agent(node, inherits);
                }
            }
            Due::PowerOn { node } => {
                // A NIC that went down before the power and is not back yet stays down.
                let nic_down = self
                    .network
                    .values()
                    .any(|f| matches!(f, NetworkFault::Isolated(m) if *m == node));
                let n = &mut self.nodes[node];
                if !n.powered {
                    n.powered = true;
                    n.nic_up = !nic_down;
                    let epoch = n.epoch;
                    self.schedule(Duration::from_millis(500), Due::AgentStart { node, epoch });
                }
            }
            Due::NicUp { node } => self.nodes[node].nic_up = true,
            Due::NetworkEnds { id } => {
                self.network.remove(&id);
                self.apply_network();
            }
            Due::NoticeWritten {
                node,
                epoch,
                started,
                within,
                answering,
            } => self.notice_written(node, epoch, started, within, answering),
            Due::NoticeCleared { node } => {
                let mut record = self.store.record(&node_name(node));
                record.spec.restarting = None;
                self.store
                    .write(self.now, Change::Record(node_name(node), Box::new(record)));
                self.note(format!("node-{node}'s notice cleared"));
            }
        }
    }

    /// The notice is in the store: the promise is kept if the fence is still open (the
    /// responders extended, the gossip left without a goodbye); else it is withdrawn and the
    /// agent stops as for a leave.
    fn notice_written(
        &mut self,
        node: usize,
        epoch: u64,
        started: Duration,
        within: Duration,
        answering: Vec<IpAddr>,
    ) {
        let n = &self.nodes[node];
        if n.epoch != epoch || n.agent.is_none() {
            return;
        }
        let since_unix_ms = self.wall_ms(node) - (self.now - started).as_millis() as u64;
        let notice = RestartNotice {
            within_ms: within.as_millis() as u64,
            since_unix_ms,
            answering: Some(answering),
        };
        let mut record = self.store.record(&node_name(node));
        record.spec.restarting = Some(notice);
        self.store.write(
            self.now,
            Change::Record(node_name(node), Box::new(record.clone())),
        );
        let open = n.agent.as_ref().is_some_and(|a| a.latch.is_open());
        self.stop_agent(node);
        if open {
            let until = started + within;
            self.nodes[node].datapath.deadline = until;
            self.nodes[node].promise = Some(until);
            self.gossip.kill(node);
            self.note(format!(
                "node-{node} stopped for a restart within {within:?}"
            ));
            // The others hold it from when each sees the notice (at the latest when its watch
            // delivers it), or, starting later, for what is left of it.
            let seen_by = self
                .nodes
                .iter()
                .filter_map(|n| n.agent.as_ref())
                .map(|a| a.watch.stalled_until.max(self.now + a.watch.lag))
                .max()
                .unwrap_or(self.now);
            self.disturbed_until((seen_by + within).max(until + CLOCK_SKEW));
        } else {
            record.spec.restarting = None;
            self.store
                .write(self.now, Change::Record(node_name(node), Box::new(record)));
            self.nodes[node].datapath.deadline = self.now;
            self.gossip.stop(node);
            self.note(format!(
                "node-{node}'s fence closed during its stop: withdrawn"
            ));
        }
    }

    /// Starts node `node`'s agent, taking up a restart promise if `inherits`.
    fn start_agent(&mut self, node: usize, inherits: bool) {
        let lag = Duration::from_millis(self.rng.random_range(1..=100));
        let watch = WatchCursor::open(&self.store, lag);
        let copy = self.store.now.clone();
        let inherited = if inherits {
            self.nodes[node].answering_as_owned()
        } else {
            // The responder's first pass withdraws what the agent before answered, and the
            // datapath's first heartbeat is written at once.
            self.nodes[node].datapath = Datapath {
                answering: BTreeSet::new(),
                deadline: self.now + LIVENESS_TIMEOUT,
            };
            Default::default()
        };
        let now = self.at(self.now);
        let wall = self.wall_ms(node);
        let name = node_name(node);
        let decider = Decider::new(&name, inherited, &copy.records, now, wall);
        if self.now > Duration::ZERO {
            let generation = self.nodes[node].generation;
            self.nodes[node].generation += 1;
            let seeds: Vec<usize> = (0..self.nodes.len()).filter(|s| *s != node).collect();
            self.gossip.restart(node, generation, &seeds);
            self.note(format!(
                "node-{node}'s agent starts (takes up a promise: {inherits})"
            ));
        }
        let n = &mut self.nodes[node];
        n.promise = None;
        let first_tick = self.now + Duration::from_millis(self.rng.random_range(0..100));
        n.agent = Some(Agent {
            decider,
            copy,
            watch,
            latch: Latch::new(Timing::default().fence_reopen()),
            opened_once: false,
            clears_notice: inherits,
            next_beat: self.now,
            next_tick: first_tick,
            changed: true,
            decide_now: false,
            rested_until: self.now,
            deciding: None,
            frozen: false,
            held_dead: BTreeMap::new(),
            fence: FenceChanges::started(self.now),
            reporter: Reporter {
                dirty: true,
                ..Reporter::default()
            },
        });
        self.wake(node);
    }
}
