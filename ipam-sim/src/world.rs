//! The modelled cluster and its clock: nodes, the store, the gossip (`ipam_gossip::sim`, the
//! protocol code the daemon runs over a modelled network), and the events of a run. Time moves
//! in steps of [`STEP`]; within a step the gossip runs on its own clock to the step's end, then
//! every node's agent takes its watch deliveries, judges its fence, beats, and decides when its
//! pace says so; after every step the invariants are checked on what the datapaths answer.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque},
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use ipam_core::{
    l2::{owners::Decider, pacing::DECISION, restarts::CLOCK_SKEW},
    lb::{
        announce::{NodeView, owners},
        rows,
    },
    resources::RestartNotice,
};
use ipam_gossip::{
    Event as GossipEvent, Keyring, Latch, Timing,
    sim::{NetworkModel, Simulation, address},
};
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::{
    check::{Invariant, Violation},
    node::{Agent, Datapath, HEARTBEAT, LIVENESS_TIMEOUT, Node},
    scenario::{Config, Event, Timed},
    store::{self, Change, Store, WatchCursor, node_name},
};

/// The model's step: every change of what a node answers happens on a step, so checking after
/// each step sees every instant two nodes answer one IP.
pub const STEP: Duration = Duration::from_millis(1);
/// How soon after the last disturbance (a fault's end, a restart promise's legitimate end)
/// every IP with an eligible node must be answered by its owner alone.
pub const BOUND: Duration = Duration::from_secs(6);
/// The wall clock at virtual time zero, in Unix ms.
const EPOCH_MS: u64 = 1_800_000_000_000;
/// How many happenings the trace keeps before a failure.
const TRACE: usize = 60;

/// How long the operators' lease lasts without a renewal: the leader renews it while its
/// agent runs and reaches the store; another node takes it once it lapsed.
const OPERATOR_LEASE: Duration = Duration::from_secs(3);
/// How often the leading operator runs LB-IPAM when its inputs changed.
const OPERATOR_PASS: Duration = Duration::from_millis(200);
/// How long a pass waits for the operator's copy to show its own last writes before it
/// reads the store itself (`cluster/watched_reads.rs`, `CATCH_UP`).
const CATCH_UP: Duration = Duration::from_secs(5);

/// The leading operator's LB-IPAM (`ipam_core::lb::assign`), run on the leader's copy of the
/// store with read-your-writes, its status writes conditional on the revision read.
#[derive(Debug, Default)]
struct Operator {
    leader: Option<usize>,
    lease_until: Duration,
    next_pass: Duration,
    /// The store revision of its last write, and when it was made: the next pass waits for
    /// the copy to show it (or [`CATCH_UP`]).
    last_write: Option<(usize, Duration)>,
    /// The copy's revision at the last pass: a pass with nothing new is skipped.
    decided_at: Option<usize>,
}

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
}

/// What happened in a run.
#[derive(Debug, Clone, Default)]
pub struct Exercised {
    /// Events applied, by kind.
    pub events: BTreeMap<&'static str, u64>,
    /// Invariant checks made, by invariant.
    pub checks: BTreeMap<&'static str, u64>,
    pub steps: u64,
    pub decisions: u64,
}

pub struct World {
    now: Duration,
    base: Instant,
    rng: StdRng,
    gossip: Simulation,
    by_addr: HashMap<SocketAddr, usize>,
    reports_seen: usize,
    nodes: Vec<Node>,
    store: Store,
    events: VecDeque<Timed>,
    due: BinaryHeap<Reverse<(Duration, u64, Due)>>,
    sequence: u64,
    network: BTreeMap<usize, NetworkFault>,
    network_ids: usize,
    /// When every IP must be answered by its owner: [`BOUND`] after the last disturbance.
    settled_at: Duration,
    end: Duration,
    trace: VecDeque<String>,
    operator: Operator,
    pub exercised: Exercised,
}

impl World {
    /// The world of `seed` with `events` (those of [`crate::scenario::events`], or a subset).
    pub fn new(config: &Config, seed: u64, events: &[Timed]) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let objects = store::initial(config.nodes, config.services, &mut rng);
        let keyring = Keyring::new(("sim", &[7; 32]), []).expect("a 32-byte key");
        let gossip = Simulation::warm(
            config.nodes,
            Timing::default(),
            NetworkModel::default(),
            keyring,
            seed,
        );
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
            });
        }
        let mut world = Self {
            now: Duration::ZERO,
            base,
            rng,
            gossip,
            by_addr,
            reports_seen: 0,
            nodes,
            store,
            events: events.iter().cloned().collect(),
            due: BinaryHeap::new(),
            sequence: 0,
            network: BTreeMap::new(),
            network_ids: 0,
            settled_at: BOUND,
            end: Duration::ZERO,
            trace: VecDeque::new(),
            operator: Operator::default(),
            exercised: Exercised::default(),
        };
        for i in 0..config.nodes {
            world.start_agent(i, false);
        }
        let last = events.iter().map(|e| e.at + e.event.lasting()).max();
        world.end =
            last.unwrap_or_default().max(Duration::from_secs(3)) + BOUND + Duration::from_secs(6);
        world
    }

    /// Runs to the end, or to the first broken invariant.
    pub fn run(&mut self) -> Result<(), Violation> {
        while self.now < self.end {
            self.step()?;
        }
        Ok(())
    }

    fn step(&mut self) -> Result<(), Violation> {
        self.now += STEP;
        self.exercised.steps += 1;
        self.gossip.run_for(STEP);
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
        self.follow_gossip_reports();
        for i in 0..self.nodes.len() {
            self.run_agent(i);
        }
        self.run_operator();
        self.check()
    }

    /// The operators' election and the leader's LB-IPAM pass.
    fn run_operator(&mut self) {
        let now = self.now;
        let reaches_store = |n: &Node| n.powered && n.nic_up && n.agent.is_some();
        match self.operator.leader {
            Some(l) if reaches_store(&self.nodes[l]) => {
                self.operator.lease_until = now + OPERATOR_LEASE;
            }
            _ if now < self.operator.lease_until => return,
            _ => {
                let Some(next) = (0..self.nodes.len()).find(|i| reaches_store(&self.nodes[*i]))
                else {
                    return;
                };
                self.operator = Operator {
                    leader: Some(next),
                    lease_until: now + OPERATOR_LEASE,
                    next_pass: now,
                    ..Operator::default()
                };
                self.note(format!("node-{next}'s operator leads"));
            }
        }
        let Some(l) = self.operator.leader else {
            return;
        };
        if now < self.operator.next_pass {
            return;
        }
        self.operator.next_pass = now + OPERATOR_PASS;
        let Some(agent) = self.nodes[l].agent.as_ref() else {
            return;
        };
        // Read your writes: a copy that has not shown the last write yet, or a stale one, is
        // left for the store itself once CATCH_UP has passed (or at once when stale).
        let shown = agent.watch.delivered();
        let stale = now < agent.watch.stalled_until;
        let behind = self
            .operator
            .last_write
            .is_some_and(|(revision, _)| shown < revision);
        let objects = if stale
            || self
                .operator
                .last_write
                .is_some_and(|(_, at)| behind && now >= at + CATCH_UP)
        {
            self.store.now.clone()
        } else if behind {
            return;
        } else {
            agent.copy.clone()
        };
        let read_at = if stale || behind {
            self.store.revision()
        } else {
            shown
        };
        if self.operator.decided_at == Some(read_at) {
            return;
        }
        self.operator.decided_at = Some(read_at);
        let assigned = ipam_core::lb::assign::assign(&objects.pools, &objects.services);
        for (name, spec, status) in &objects.services {
            let Some(new) = assigned.services.get(name).filter(|new| *new != status) else {
                continue;
            };
            let Some(revision) = objects.service_revisions.get(name).copied() else {
                continue;
            };
            let row = (name.clone(), spec.clone(), new.clone());
            if self.store.write_status(now, row, revision) {
                self.operator.last_write = Some((self.store.revision(), now));
                self.note(format!("operator: {name} gets {:?}", new.ingress));
            }
        }
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
        self.trace
            .push_back(format!("t={:>7.3}s {what}", self.now.as_secs_f64()));
    }

    /// The run's end moves past `end` + [`BOUND`], and the settled point too.
    fn disturbed_until(&mut self, end: Duration) {
        self.settled_at = self.settled_at.max(end + BOUND);
        self.end = self.end.max(end + BOUND + Duration::from_secs(2));
    }

    fn apply(&mut self, timed: Timed) {
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
        let agent = self.nodes[node].agent.as_mut().expect("checked above");
        agent.frozen = true;
        if let Some((_, plan)) = agent.deciding.take()
            && let Some(owned) = plan.owned
        {
            self.nodes[node].datapath.answering = owned.keys().copied().collect();
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
        let mut loss = 0;
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for fault in self.network.values() {
            match fault {
                NetworkFault::Partition(side) => groups.push(side.clone()),
                NetworkFault::Isolated(node) => groups.push(vec![*node]),
                NetworkFault::OneWay(_) => {}
                NetworkFault::Loss(per_mille) => loss = loss.max(*per_mille),
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
            loss: f64::from(loss) / 1000.0,
            ..NetworkModel::default()
        });
    }

    fn carry_out(&mut self, due: Due) {
        match due {
            Due::AgentStart { node, epoch } => {
                let n = &self.nodes[node];
                if n.powered && n.agent.is_none() && n.epoch == epoch {
                    let inherits = n.promise.is_some_and(|until| self.now < until);
                    self.start_agent(node, inherits);
                }
            }
            Due::PowerOn { node } => {
                let n = &mut self.nodes[node];
                if !n.powered {
                    n.powered = true;
                    n.nic_up = true;
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
            answering,
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
        });
    }

    /// Passes the gossip's news to each agent: a member declared dead is held for the
    /// takeover hold; any change of the membership is decided at once.
    fn follow_gossip_reports(&mut self) {
        let hold = Timing::default().takeover_hold;
        let reports = &self.gossip.reports()[self.reports_seen..];
        self.reports_seen += reports.len();
        for report in reports {
            let Some(agent) = self.nodes[report.member].agent.as_mut() else {
                continue;
            };
            match report.event {
                GossipEvent::Down(id) => {
                    if let Some(m) = self.by_addr.get(&id.addr) {
                        agent.held_dead.insert(*m, report.at + hold);
                    }
                    agent.decide_now = true;
                }
                GossipEvent::Up(id) | GossipEvent::Renamed { after: id, .. } => {
                    if let Some(m) = self.by_addr.get(&id.addr) {
                        agent.held_dead.remove(m);
                    }
                    agent.decide_now = true;
                }
                _ => {}
            }
        }
    }

    /// One step of node `i`'s agent.
    fn run_agent(&mut self, i: usize) {
        let now = self.now;
        let Some(mut agent) = self.nodes[i].agent.take() else {
            return;
        };
        // The watch; a failing one relists when it works again (a change, as the daemon's
        // shared watch tells its subscribers).
        if agent.watch.stalled_until > Duration::ZERO && now == agent.watch.stalled_until {
            agent.changed = true;
        }
        let mut records_changed = false;
        for (revision, change) in agent.watch.due(&self.store, now) {
            agent.copy.apply(change, revision);
            agent.changed = true;
            records_changed |= matches!(change, Change::Record(..));
        }
        if records_changed {
            agent
                .decider
                .records_changed(&agent.copy.records, self.at(now));
        }
        // Takeover holds that ended change who is live.
        let before = agent.held_dead.len();
        agent.held_dead.retain(|_, until| now < *until);
        if agent.held_dead.len() != before {
            agent.decide_now = true;
        }
        // The fence and the heartbeat.
        if now.as_millis().is_multiple_of(5) || agent.latch.is_open() {
            let was_open = agent.latch.is_open();
            let verdict = self.gossip.fence_verdict(i);
            let open = agent.latch.take(now, &verdict);
            if open && !was_open {
                self.note(format!("node-{i}'s fence opened"));
            }
            if open && !agent.opened_once {
                agent.opened_once = true;
                if agent.clears_notice {
                    agent.clears_notice = false;
                    let latency = self.write_latency();
                    self.schedule(latency, Due::NoticeCleared { node: i });
                }
            }
            if was_open && !open {
                self.nodes[i].datapath.deadline = self.nodes[i].datapath.deadline.min(now);
                self.note(format!("node-{i}'s fence closed: silenced"));
            }
        }
        if now >= agent.next_beat {
            agent.next_beat = now + HEARTBEAT;
            if agent.latch.is_open() {
                self.nodes[i].datapath.deadline = now + LIVENESS_TIMEOUT;
            }
        }
        // A decision that ends now is carried out.
        if agent
            .deciding
            .as_ref()
            .is_some_and(|(ends, _)| *ends <= now)
        {
            let (_, plan) = agent.deciding.take().expect("checked");
            if let Some(owned) = plan.owned {
                let answering: BTreeSet<IpAddr> = owned.keys().copied().collect();
                if answering == self.nodes[i].datapath.answering {
                    self.note(format!("node-{i} decided: answers the same"));
                } else {
                    self.note(format!("node-{i} answers {answering:?}"));
                }
                self.nodes[i].datapath.answering = answering;
            }
        }
        // A decision due now starts.
        let knows_others = self
            .gossip
            .peer(i)
            .is_some_and(|p| p.active().next().is_some());
        if agent.due(now)
            && !agent
                .decider
                .waits(agent.opened_once, knows_others, self.at(now))
        {
            let took = self.decision_length();
            let live = self.live_for(i, &agent);
            let at = self.at(now);
            agent.decide(now, at, took, &mut |node| live.contains(node));
            self.exercised.decisions += 1;
        }
        agent.tick_passed(now);
        self.nodes[i].agent = Some(agent);
    }

    fn decision_length(&mut self) -> Duration {
        if self.rng.random_bool(0.1) {
            Duration::from_millis(self.rng.random_range(5..=DECISION.as_millis() as u64))
        } else {
            Duration::from_millis(self.rng.random_range(0..=4))
        }
    }

    /// Who node `i` counts live: itself, the members its gossip holds active, and those
    /// declared dead within the takeover hold.
    fn live_for(&self, i: usize, agent: &Agent) -> BTreeSet<String> {
        let mut live = BTreeSet::from([node_name(i)]);
        if let Some(peer) = self.gossip.peer(i) {
            for id in peer.active() {
                if let Some(m) = self.by_addr.get(&id.addr) {
                    live.insert(node_name(*m));
                }
            }
        }
        live.extend(agent.held_dead.keys().map(|m| node_name(*m)));
        live
    }

    /// The invariants on what the datapaths answer now.
    fn check(&mut self) -> Result<(), Violation> {
        let now = self.now;
        *self
            .exercised
            .checks
            .entry(Invariant::OneAnswer.name())
            .or_default() += 1;
        let mut answered: BTreeMap<IpAddr, usize> = BTreeMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if !n.answers(now) {
                continue;
            }
            for ip in &n.datapath.answering {
                if let Some(other) = answered.insert(*ip, i) {
                    return Err(self.violation(
                        Invariant::OneAnswer,
                        format!("{ip} answered by node-{other} and node-{i}"),
                    ));
                }
            }
        }
        if now.as_millis().is_multiple_of(10) {
            *self
                .exercised
                .checks
                .entry(Invariant::AddressOnce.name())
                .or_default() += 1;
            *self
                .exercised
                .checks
                .entry(Invariant::TenantPool.name())
                .or_default() += 1;
            if let Some((invariant, what)) = crate::check::addresses(&self.store.now) {
                return Err(self.violation(invariant, what));
            }
        }
        if now >= self.settled_at && now.as_millis().is_multiple_of(100) {
            *self
                .exercised
                .checks
                .entry(Invariant::Answered.name())
                .or_default() += 1;
            let expected = self.expected_owners();
            for (ip, owner) in &expected {
                if answered.get(ip) != Some(owner) {
                    let by = answered
                        .get(ip)
                        .map_or("nobody".to_owned(), |n| format!("node-{n}"));
                    return Err(self.violation(
                        Invariant::Answered,
                        format!(
                            "{ip} answered by {by}, {:.1} s after the last disturbance; its \
                             owner among the eligible nodes is node-{owner}",
                            (now - self.settled_at + BOUND).as_secs_f64()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every IP's owner among the nodes that may answer now (powered, NIC up, an agent whose
    /// fence is open), from the store as it is: what every agent converges to.
    fn expected_owners(&self) -> BTreeMap<IpAddr, usize> {
        let eligible: Vec<NodeView> = self
            .nodes
            .iter()
            .filter(|n| {
                n.powered && n.nic_up && n.agent.as_ref().is_some_and(|a| a.latch.is_open())
            })
            .map(|n| rows::node_named(&n.name, &self.store.now.records[&n.name]))
            .collect();
        let objects = &self.store.now;
        owners(
            &objects.policies,
            &[],
            &objects.services,
            &objects.ready,
            &eligible,
        )
        .into_iter()
        .filter_map(|a| {
            let node = a.node.strip_prefix("node-")?.parse().ok()?;
            Some((a.ip, node))
        })
        .collect()
    }

    fn violation(&self, invariant: Invariant, what: String) -> Violation {
        Violation {
            invariant,
            at: self.now,
            what,
            trace: self.trace.iter().cloned().collect(),
        }
    }
}
