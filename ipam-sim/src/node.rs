//! One node: its machine (power, NIC), its datapath (what the responders answer, until when
//! their heartbeat lets them), and its agent when one runs: the daemon's decision
//! (`ipam_core::l2::owners::Decider`) over the agent's copies of the store, paced as the
//! daemon paces it, with the fence and the heartbeat as the daemon keeps them.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::{Duration, Instant},
};

use ipam_core::{
    dead_nodes::reports::{Findings, Probe},
    l2::{
        OwnedIp, OwnedIps,
        owners::{Decider, Plan, View},
        pacing::{TICK, rest_after},
    },
    resources::PeerDown,
};
use ipam_gossip::Latch;

use crate::{
    schedule::FenceChanges,
    store::{Objects, WatchCursor},
};

/// The daemon's heartbeat as deployed (`deploy/base/config.yaml`).
pub const HEARTBEAT: Duration = Duration::from_millis(100);
pub const LIVENESS_TIMEOUT: Duration = Duration::from_millis(300);

/// What the responders of a node answer, and until when.
#[derive(Debug, Clone, Default)]
pub struct Datapath {
    pub answering: BTreeSet<IpAddr>,
    /// The responders answer only before this (their heartbeat's deadline).
    pub deadline: Duration,
}

/// A running agent.
#[derive(Debug)]
pub struct Agent {
    pub decider: Decider,
    pub copy: Objects,
    pub watch: WatchCursor,
    pub latch: Latch,
    /// Whether the fence has opened since the agent started: before, a closed fence neither
    /// beats nor silences (the responders run on what the agent before left).
    pub opened_once: bool,
    /// Whether the agent took up a restart promise whose notice it clears once its fence opens.
    pub clears_notice: bool,
    pub next_beat: Duration,
    pub next_tick: Duration,
    /// Whether anything changed since the last decision.
    pub changed: bool,
    /// Whether the membership changed: decided at once.
    pub decide_now: bool,
    pub rested_until: Duration,
    /// A decision under way: when it ends, and its plan.
    pub deciding: Option<(Duration, Plan)>,
    /// Stopping for a restart: no decision any more.
    pub frozen: bool,
    /// Members declared dead within the takeover hold, until when (the survivors' half of
    /// fencing, as the daemon's gossip task keeps it).
    pub held_dead: BTreeMap<usize, Duration>,
    /// What may have changed the fence's verdict since it was last judged.
    pub fence: FenceChanges,
    /// Its reports of dead nodes (`ipam_core::dead_nodes::reports`).
    pub reporter: Reporter,
}

/// An agent's reporting of dead nodes, as the daemon's `liveness::dead_peers` runs it: on a
/// change of the gossip's membership or of the fence, or at the recheck, it probes the nodes
/// held dead or suspected that have no fresh finding (all at once, waiting for the slowest),
/// then writes the silent ones into its record.
#[derive(Debug, Default)]
pub struct Reporter {
    pub findings: Findings,
    /// Probes under way: when they end, the membership they were started on, and what they
    /// found.
    pub probing: Option<Probing>,
    /// What its record says (none written yet by this agent).
    pub published: Option<Vec<PeerDown>>,
    /// The membership or the fence changed since the last pass.
    pub dirty: bool,
    /// The gossip member's membership (`Peer::membership_digest`) when last looked at: the
    /// daemon derives the dead and the suspects again whenever it changes.
    pub membership: Option<u64>,
    /// When the nodes held dead are probed again.
    pub recheck_at: Option<Duration>,
}

/// Probes started together.
#[derive(Debug)]
pub struct Probing {
    pub ends: Duration,
    pub started: Instant,
    pub down: BTreeMap<String, Vec<IpAddr>>,
    pub found: BTreeMap<String, Probe>,
}

impl Reporter {
    /// When it must run next with nothing changing outside.
    pub fn next_wake(&self) -> Option<Duration> {
        match &self.probing {
            Some(probing) => Some(probing.ends),
            None => self.recheck_at,
        }
    }
}

/// What a node's firewall does to connections to its kubelet's port from other nodes. ARP
/// (and NDP) is answered by its kernel whatever the firewall does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kubelet {
    /// Open: a connection is accepted.
    Open,
    /// Dropped: no answer (Kubernetes documents 10250 as for the control plane only).
    Dropped,
    /// Rejected with an ICMP error, as a router would send for a dead host.
    Rejected,
}

impl Agent {
    /// Whether a tick decides now (`TICK` boundaries, after the rest, when something changed
    /// or time matters), or a membership change does.
    pub fn due(&self, now: Duration, at: Instant) -> bool {
        if self.deciding.is_some() || self.frozen {
            return false;
        }
        if self.decide_now {
            return true;
        }
        now >= self.next_tick && self.wants_a_tick(at) && now >= self.rested_until
    }

    /// Whether a tick at `at` decides, once rested: something changed, a takeover hold runs,
    /// or time alone changes the decision by then (a hand-over's wait, a restart's hold, an
    /// IP that lingers: `Decider::next_due`).
    pub fn wants_a_tick(&self, at: Instant) -> bool {
        self.changed || !self.held_dead.is_empty() || self.decider.due_by_time(at)
    }

    /// Starts a decision at `now` (`at` as an `Instant`) taking `took`: its plan is carried out
    /// when it ends.
    pub fn decide(
        &mut self,
        now: Duration,
        at: Instant,
        took: Duration,
        live: &mut dyn FnMut(&str) -> bool,
    ) {
        self.changed = false;
        self.decide_now = false;
        let pools = crate::store::lb_pools(&self.copy.pools);
        let view = View {
            policies: &self.copy.policies,
            pools: &pools,
            services: &self.copy.services,
            ready: &self.copy.ready,
            records: &self.copy.records,
            records_fresh: now >= self.watch.stalled_until,
            fence_open: self.latch.is_open(),
        };
        let plan = self.decider.decide(&view, live, at);
        self.deciding = Some((now + took, plan));
        self.rested_until = now + took + rest_after(took);
    }

    /// Moves the tick on past `now`.
    pub fn tick_passed(&mut self, now: Duration) {
        while self.next_tick <= now {
            self.next_tick += TICK;
        }
    }
}

/// One node of the modelled cluster.
#[derive(Debug)]
pub struct Node {
    pub name: String,
    pub powered: bool,
    pub nic_up: bool,
    pub datapath: Datapath,
    pub agent: Option<Agent>,
    /// Bumped whenever the agent goes: a pending start of an earlier one is void.
    pub epoch: u64,
    /// The gossip generation of the next agent.
    pub generation: u32,
    /// A restart promise the agent before left (the promise file): until when it runs.
    pub promise: Option<Duration>,
    /// How far this node's wall clock is from true time, in ms.
    pub skew_ms: i64,
    /// Its firewall's rule for the kubelet's port.
    pub kubelet: Kubelet,
}

impl Node {
    /// Whether the node answers `ip` now, as a client on the segment sees it.
    pub fn answers(&self, now: Duration) -> bool {
        self.powered && self.nic_up && now < self.datapath.deadline
    }

    /// What the responders answer, as the decision's `OwnedIps` (what an agent taking up a
    /// restart promise starts from: the map holds no Service names).
    pub fn answering_as_owned(&self) -> OwnedIps {
        self.datapath
            .answering
            .iter()
            .map(|ip| {
                let owned = OwnedIp {
                    service: String::new(),
                    interfaces: vec!["eth0".into()],
                };
                (*ip, owned)
            })
            .collect()
    }
}
