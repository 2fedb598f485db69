//! Taking dead nodes' pods out of their Services: each agent reports the nodes its gossip
//! declared dead that a probe finds silent (`ipam_core::dead_nodes::reports`, the daemon's
//! decision), and the leading operator marks the pods of a node a majority reports
//! (`ipam_core::dead_nodes::marking`). The probe itself is modelled on the network of the run
//! ([`World::probe`]); and which nodes could be reached, whatever the gossip believes, is
//! followed to check each marking ([`Reachability`]).

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use ipam_core::{
    dead_nodes::{
        marking::{self, Marking, RateLimit},
        reports::{Finding, Findings, Probe, Suspicions, reports_of, verdict},
    },
    resources::{NodeIpam, PeerDown},
    store::lease::Leader,
};
use ipam_gossip::State;
use rand::Rng;

use super::{NetworkFault, World};
use crate::{
    check::{Invariant, Violation},
    node::{Agent, Kubelet, Probing},
    store::{Change, node_index, node_name},
};

/// How long a silence found by a probe may stand as a report after the node answers again:
/// a suspect's finding stands for `FRESH` (1 s) when the gossip declares it dead (and the
/// pass that takes it up may wait 0.2 s for its other probes), a report until the recheck
/// (5 s) and its probe (0.2 s), then the write reaches the operator's copy (0.1 s) and its
/// next pass (0.2 s): 6.7 s, and a margin. A node marked later than this after it was last
/// down or cut off from a majority was marked while it ran. (A reporter that cannot write, its
/// NIC down or its agent dead, leaves its report longer; a majority of them is needed.)
pub const EVIDENCE: Duration = Duration::from_secs(8);
/// `[dead_nodes] probe_timeout_ms`, as deployed.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// How long a probe a node answers takes (a round trip on the segment).
const ANSWER_TIME: Duration = Duration::from_millis(1);
/// Connection attempts and neighbour requests per probe (`dead_peers`'s
/// `ATTEMPTS_PER_ADDRESS`).
const ATTEMPTS: u32 = 3;
/// How long an agent whose NIC is down waits before it writes its reports again.
const WRITE_RETRY: Duration = Duration::from_millis(500);
/// `[dead_nodes]` as deployed: one node's pods per 10 s at most.
const MARKS_PER_WINDOW: usize = 1;
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// Which nodes were down or cut off from a majority of the nodes, and when last: what the
/// network did, not what anyone believed.
#[derive(Debug, Default)]
pub(super) struct Reachability {
    /// Since when each node has been cut off, while it is.
    cut_since: Vec<Option<Duration>>,
    /// When each node was last cut off.
    cut_ended: Vec<Option<Duration>>,
    /// Power, NICs or the network changed since it was last followed.
    pub(super) changed: bool,
}

impl Reachability {
    /// To be followed at the first instant.
    pub(super) fn new() -> Self {
        Self {
            changed: true,
            ..Self::default()
        }
    }
}

/// The address a node's record gives between nodes.
pub(super) fn node_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        10,
        0,
        u8::try_from(i >> 8).unwrap_or(u8::MAX),
        (i & 0xff) as u8,
    ))
}

impl World {
    /// Whether `a` and `b` can exchange packets now (whatever the gossip's own port does).
    fn linked(&self, a: usize, b: usize) -> bool {
        self.on_network(a)
            && self.on_network(b)
            && self.network.values().all(|fault| match fault {
                NetworkFault::Partition(side) => side.contains(&a) == side.contains(&b),
                _ => true,
            })
    }

    /// Whether node `n` can exchange packets with anyone: powered, its NIC up, its packets
    /// not cut one way.
    fn on_network(&self, n: usize) -> bool {
        let node = &self.nodes[n];
        node.powered && node.nic_up && !self.muted(n)
    }

    fn muted(&self, n: usize) -> bool {
        self.network
            .values()
            .any(|fault| matches!(fault, NetworkFault::OneWay(m) if *m == n))
    }

    /// The chance a packet between nodes is lost (the worst loss fault in force).
    pub(super) fn loss(&self) -> f64 {
        let per_mille = self
            .network
            .values()
            .filter_map(|fault| match fault {
                NetworkFault::Loss(per_mille) => Some(*per_mille),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        f64::from(per_mille) / 1000.0
    }

    /// Follows which nodes are cut off, if anything that decides it changed.
    pub(super) fn follow_reachability(&mut self) {
        if !self.reachability.changed {
            return;
        }
        self.reachability.changed = false;
        let n = self.nodes.len();
        let r = &mut self.reachability;
        r.cut_since.resize(n, None);
        r.cut_ended.resize(n, None);
        // Nodes on the same side of every partition, up, reach each other.
        let partitions: Vec<&Vec<usize>> = self
            .network
            .values()
            .filter_map(|fault| match fault {
                NetworkFault::Partition(side) => Some(side),
                _ => None,
            })
            .collect();
        let side_of =
            |x: usize| -> Vec<bool> { partitions.iter().map(|p| p.contains(&x)).collect() };
        let up: Vec<bool> = (0..n).map(|x| self.on_network(x)).collect();
        let mut reach: BTreeMap<Vec<bool>, usize> = BTreeMap::new();
        for x in (0..n).filter(|x| up[*x]) {
            *reach.entry(side_of(x)).or_default() += 1;
        }
        let now = self.now;
        let r = &mut self.reachability;
        for (x, up) in up.iter().enumerate() {
            let cut = !up || reach.get(&side_of(x)).copied().unwrap_or(0) * 2 <= n;
            match (cut, r.cut_since[x]) {
                (true, None) => r.cut_since[x] = Some(now),
                (false, Some(_)) => {
                    r.cut_since[x] = None;
                    r.cut_ended[x] = Some(now);
                }
                _ => {}
            }
        }
    }

    /// When node `x` was last down or cut off from a majority (now, if it is).
    fn last_cut_off(&self, x: usize) -> Option<Duration> {
        let r = &self.reachability;
        if r.cut_since.get(x).copied().flatten().is_some() {
            return Some(self.now);
        }
        r.cut_ended.get(x).copied().flatten()
    }

    /// What node `from`'s probe of node `to` finds, and how long it takes: connection
    /// attempts to its kubelet's port and neighbour requests, each a round trip that the
    /// network of the run may lose.
    fn probe(&mut self, from: usize, to: usize) -> (Probe, Duration) {
        let ip = node_ip(to);
        let linked = self.linked(from, to);
        let loss = self.loss();
        let round_trips = |rng: &mut rand::rngs::StdRng| {
            linked
                && (0..ATTEMPTS)
                    .any(|_| loss == 0.0 || rng.random::<f64>() >= 1.0 - (1.0 - loss).powi(2))
        };
        let kubelet = self.nodes[to].kubelet;
        let finding = if kubelet == Kubelet::Open && round_trips(&mut self.rng) {
            Finding::Answered(format!("kubelet {ip}:10250: connected"))
        } else {
            let silence = if kubelet == Kubelet::Rejected && linked {
                format!("kubelet {ip}:10250: unreachable (administratively prohibited)")
            } else {
                format!(
                    "kubelet {ip}:10250: no answer within {} ms",
                    PROBE_TIMEOUT.as_millis()
                )
            };
            if round_trips(&mut self.rng) {
                Finding::Answered(format!(
                    "{ip} answers ARP on eth0 (its kubelet's port is filtered: {silence})"
                ))
            } else {
                Finding::Silent(format!(
                    "{silence}, and {ip} answered none of {ATTEMPTS} ARP requests on eth0"
                ))
            }
        };
        let probe = verdict(vec![finding]);
        let took = if matches!(probe, Probe::Answered(_)) {
            ANSWER_TIME
        } else {
            PROBE_TIMEOUT
        };
        (probe, took)
    }

    /// The nodes node `i`'s gossip member holds dead (and no newer generation of them
    /// active) and those it suspects (and none alive), with their addresses: the daemon's
    /// `Membership`.
    fn suspicions(
        &self,
        i: usize,
    ) -> (BTreeMap<String, Vec<IpAddr>>, BTreeMap<String, Vec<IpAddr>>) {
        let (mut down, mut suspect) = (BTreeMap::new(), BTreeMap::new());
        let Some(peer) = self.gossip.peer(i) else {
            return (down, suspect);
        };
        // Per node: alive, suspect, down, for any of its generations.
        let mut states: BTreeMap<usize, [bool; 3]> = BTreeMap::new();
        for (id, state) in peer.members() {
            let Some(m) = self.by_addr.get(&id.addr) else {
                continue;
            };
            let seen = states.entry(*m).or_default();
            match state {
                State::Alive => seen[0] = true,
                State::Suspect => seen[1] = true,
                State::Down => seen[2] = true,
            }
        }
        for (m, [alive, suspected, dead]) in states {
            if dead && !alive && !suspected {
                down.insert(node_name(m), vec![node_ip(m)]);
            } else if suspected && !alive {
                suspect.insert(node_name(m), vec![node_ip(m)]);
            }
        }
        (down, suspect)
    }

    /// Node `i`'s reporting at this instant: a pass whose probes ended is carried out (its
    /// reports written), and a new one starts if the membership or the fence changed since
    /// the last began, or the recheck is due.
    pub(super) fn run_reporter(&mut self, i: usize, agent: &mut Agent) {
        let now = self.now;
        if let Some(probing) = &agent.reporter.probing {
            if probing.ends > now {
                return;
            }
            let probing = agent.reporter.probing.take().expect("checked");
            self.finish_reporting(i, agent, probing);
        }
        let recheck = agent.reporter.recheck_at.is_some_and(|t| t <= now);
        if !agent.reporter.dirty && !recheck {
            return;
        }
        agent.reporter.dirty = false;
        agent.reporter.recheck_at = None;
        let (down, suspect) = if agent.latch.is_open() {
            self.suspicions(i)
        } else {
            Default::default()
        };
        let started = self.at(now);
        let gossip = Suspicions {
            down: &down,
            suspect: &suspect,
        };
        let to_probe = agent.reporter.findings.to_probe(gossip, started);
        let mut found = BTreeMap::new();
        let mut longest = Duration::ZERO;
        for node in to_probe.keys() {
            let Some(target) = node_index(node) else {
                continue;
            };
            let (probe, took) = self.probe(i, target);
            longest = longest.max(took);
            found.insert(node.clone(), probe);
        }
        let probing = Probing {
            ends: now + longest,
            started,
            down,
            found,
        };
        if longest.is_zero() {
            self.finish_reporting(i, agent, probing);
        } else {
            agent.reporter.probing = Some(probing);
        }
    }

    fn finish_reporting(&mut self, i: usize, agent: &mut Agent, probing: Probing) {
        let reporter = &mut agent.reporter;
        reporter.findings.note(probing.found, probing.started);
        let reports = reports_of(&reporter.findings.of(&probing.down));
        reporter.recheck_at = Findings::recheck(&probing.down).map(|wait| self.now + wait);
        if reporter.published.as_ref() == Some(&reports) {
            return;
        }
        if !self.nodes[i].nic_up {
            reporter.recheck_at = Some(self.now + WRITE_RETRY);
            return;
        }
        let name = node_name(i);
        let mut record = self.store.record(&name);
        if record.spec.peers_down != reports {
            self.note(format!("node-{i} reports {:?}", nodes_of(&reports)));
            record.spec.peers_down = reports.clone();
            self.store
                .write(self.now, Change::Record(name, Box::new(record)));
        }
        reporter.published = Some(reports);
    }

    /// The leading operator's marking, on `leader`'s copy of the records when it is current:
    /// each node it marks is checked against what the network did.
    pub(super) fn run_marking(&mut self, leader: usize) -> Result<(), Violation> {
        let now = self.now;
        let Some(agent) = self.nodes[leader].agent.as_ref() else {
            return Ok(());
        };
        if now < agent.watch.stalled_until {
            return Ok(());
        }
        let confirmed = marking::confirmed(
            agent
                .copy
                .records
                .iter()
                .map(|(name, record)| (name.as_str(), record)),
        );
        let at = self.at(now);
        let plan = self
            .operator
            .marking
            .get_or_insert_with(|| {
                Marking::new(true, RateLimit::new(MARKS_PER_WINDOW, RATE_WINDOW))
            })
            .decide(&confirmed, &Leader::Us, at);
        for node in plan.clear {
            self.write_marked(&node, None);
        }
        // Every marking succeeds here: the first `may_mark`; the rest are decided again at
        // the next pass, and held back.
        for (node, why) in plan.mark.into_iter().take(plan.may_mark) {
            self.check_marking(&node)?;
            self.note(format!("operator marks {node}'s pods not ready"));
            self.exercised.marked.push((now, node.clone()));
            if let Some(marking) = self.operator.marking.as_mut() {
                marking.marked(&node, at);
            }
            self.write_marked(&node, Some(&why));
        }
        Ok(())
    }

    fn write_marked(&mut self, node: &str, why: Option<&str>) {
        let mut record: NodeIpam = self.store.record(node);
        if let Some(conditions) = marking::with_marked_condition(&record, why) {
            record.status.conditions = conditions;
            self.store
                .write(self.now, Change::Record(node.to_owned(), Box::new(record)));
        }
    }

    /// [`Invariant::NoLiveNodeMarked`] for a marking of `node`'s pods now.
    fn check_marking(&mut self, node: &str) -> Result<(), Violation> {
        *self
            .exercised
            .checks
            .entry(Invariant::NoLiveNodeMarked.name())
            .or_default() += 1;
        let already = self
            .store
            .record(node)
            .status
            .conditions
            .iter()
            .any(|c| c.kind == ipam_core::resources::PODS_MARKED_NOT_READY && c.status);
        if already {
            return Err(self.violation(
                Invariant::NoLiveNodeMarked,
                format!("{node}'s pods marked again: its record says an operator marked them"),
            ));
        }
        let Some(x) = node_index(node) else {
            return Ok(());
        };
        let last = self.last_cut_off(x);
        if last.is_none_or(|at| self.now.saturating_sub(at) > EVIDENCE) {
            let since = last.map_or("the start".to_owned(), |at| {
                format!("t={:.3}s", at.as_secs_f64())
            });
            return Err(self.violation(
                Invariant::NoLiveNodeMarked,
                format!(
                    "{node}'s pods marked not ready while it ran and reached a majority of the \
                     nodes since {since}"
                ),
            ));
        }
        Ok(())
    }
}

fn nodes_of(reports: &[PeerDown]) -> Vec<&str> {
    reports.iter().map(|r| r.node.as_str()).collect()
}
