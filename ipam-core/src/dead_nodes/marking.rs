//! The operator's half: which dead nodes' pods to set not ready, and when.
//!
//! What guards it:
//! - a majority: more than half of the nodes with a record (those the operator released for a
//!   lapsed lease aside) must report the node ([`confirmed`]), so a node cut off with a
//!   minority, which sees everyone else dead, moves nothing;
//! - two independent signals in every report (`reports`);
//! - a rate limit: at most so many nodes within a window; the rest wait for the window or for
//!   the node lifecycle controller ([`RateLimit`]);
//! - once per death: the record's `PODS_MARKED_NOT_READY` condition says an operator marked
//!   the node's pods, so a replica taking over does not mark them again while the reports
//!   that made it stand, and a kubelet that restored them keeps the last word;
//! - nothing to undo: a node that was alive after all gets its pods' readiness back from its
//!   own kubelet's status sync.
//!
//! Every operator replica decides, not only the leader: the leader may have died with the
//! node. A replica that does not lead leaves the marking to the leader for
//! [`FOLLOWER_BACKUP_AFTER`] when the lease names the leader's node and that node is not the
//! dead one (the default identity is `<node>-<pid>`); otherwise it marks at once.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    time::{Duration, Instant},
};

use crate::{
    meta::Condition,
    resources::{NodeIpam, PODS_MARKED_NOT_READY},
    store::lease::Leader,
};

/// How long a replica that does not lead leaves a dead node's pods to a leader on another
/// node before marking them itself (finding them marked, it changes nothing): many times the
/// marking's own time (under 0.2 s), so only a leader that is stuck or cut off from the API
/// server leaves it the work.
pub const FOLLOWER_BACKUP_AFTER: Duration = Duration::from_secs(1);

/// One node's report of another: who reports it, and the evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub reporter: String,
    pub evidence: String,
}

/// The nodes a majority reports dead, and how many nodes the majority is of.
#[derive(Debug, Default)]
pub struct Confirmed {
    pub dead: BTreeMap<String, Vec<Report>>,
    /// The nodes counted: those with a record whose lease has not lapsed.
    pub nodes: usize,
    /// The nodes whose record says an operator set their pods not ready
    /// (`PODS_MARKED_NOT_READY`), this replica or one before it.
    pub marked: BTreeSet<String>,
}

/// The nodes a majority of `records` reports dead, with their reports. The nodes counted are
/// those with a record whose lease has not lapsed, the reported node included.
pub fn confirmed<'a>(records: impl IntoIterator<Item = (&'a str, &'a NodeIpam)>) -> Confirmed {
    let records: Vec<(&str, &NodeIpam)> = records.into_iter().collect();
    let marked = records
        .iter()
        .filter(|(_, r)| marked_condition(r).is_some_and(|c| c.status))
        .map(|(name, _)| (*name).to_owned())
        .collect();
    let counted: Vec<(&str, &NodeIpam)> = records
        .into_iter()
        .filter(|(_, r)| !r.lease_lapsed())
        .collect();
    let mut reported: BTreeMap<String, Vec<Report>> = BTreeMap::new();
    for (reporter, record) in &counted {
        for down in &record.spec.peers_down {
            if down.node != *reporter {
                reported.entry(down.node.clone()).or_default().push(Report {
                    reporter: (*reporter).to_owned(),
                    evidence: down.evidence.clone(),
                });
            }
        }
    }
    reported.retain(|_, reports| reports.len() * 2 > counted.len());
    Confirmed {
        dead: reported,
        nodes: counted.len(),
        marked,
    }
}

fn marked_condition(record: &NodeIpam) -> Option<&Condition> {
    record
        .status
        .conditions
        .iter()
        .find(|c| c.kind == PODS_MARKED_NOT_READY)
}

/// `record`'s conditions with the marking's set (`Some(why)`) or removed (`None`); `None` when
/// that changes nothing.
pub fn with_marked_condition(record: &NodeIpam, why: Option<&str>) -> Option<Vec<Condition>> {
    let before = &record.status.conditions;
    let mut after: Vec<Condition> = before
        .iter()
        .filter(|c| c.kind != PODS_MARKED_NOT_READY)
        .cloned()
        .collect();
    if let Some(why) = why {
        after.push(Condition::new(
            PODS_MARKED_NOT_READY,
            true,
            format!("{why}; its pods were set not ready by ipam-operator"),
        ));
    }
    (after != *before).then_some(after)
}

/// At most `max` actions within any `window`.
#[derive(Debug)]
pub struct RateLimit {
    max: usize,
    window: Duration,
    acted: VecDeque<Instant>,
}

impl RateLimit {
    /// With `max` 0 nothing ever goes ahead (the settings refuse it while marking is on).
    pub fn new(max: usize, window: Duration) -> Self {
        Self {
            max,
            window,
            acted: VecDeque::new(),
        }
    }

    /// How many actions may go ahead at `now`.
    pub fn free(&mut self, now: Instant) -> usize {
        while self
            .acted
            .front()
            .is_some_and(|at| now.saturating_duration_since(*at) >= self.window)
        {
            self.acted.pop_front();
        }
        self.max.saturating_sub(self.acted.len())
    }

    /// `None` when an action may go ahead at `now`; else how long until one may.
    pub fn wait(&mut self, now: Instant) -> Option<Duration> {
        if self.free(now) > 0 {
            return None;
        }
        let oldest = self
            .acted
            .get(self.acted.len() - self.max)
            .copied()
            .unwrap_or(now);
        Some(
            self.window
                .saturating_sub(now.saturating_duration_since(oldest)),
        )
    }

    pub fn record(&mut self, at: Instant) {
        self.acted.push_back(at);
    }
}

/// The node an operator's identity names, for the default identity `<node>-<pid>`; `None` for
/// an identity set by hand in another form.
pub fn identity_node(identity: &str) -> Option<&str> {
    let (node, pid) = identity.rsplit_once('-')?;
    (!node.is_empty() && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())).then_some(node)
}

/// Whether a replica leaves `dead`'s pods to the leader for a while: only when another
/// replica leads from a node known to be another than `dead`.
pub fn leave_to_leader(leader: &Leader, dead: &str) -> bool {
    match leader {
        Leader::Other(holder) => identity_node(holder).is_some_and(|node| node != dead),
        Leader::Us | Leader::Unknown => false,
    }
}

/// Something the decision says once, for the operator's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// The node's record says an operator before this one marked its pods, on reports that
    /// still stand: not marked again.
    MarkedBefore { node: String },
    /// The node is no longer reported dead by a majority: its kubelet restores its pods.
    NoLongerDead { node: String },
    /// Confirmed, but `mark_pods_not_ready` is off.
    NotMarkingOff { node: String, why: String },
    /// Confirmed, but the rate limit holds it back for `wait`.
    HeldBackByRate {
        node: String,
        why: String,
        wait: Duration,
    },
    /// Left to the leading replica for [`FOLLOWER_BACKUP_AFTER`].
    LeftToLeader { node: String, leader: Leader },
}

/// What one decision asks of the operator.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Nodes whose record's marking condition must go: the death it recorded is over.
    pub clear: Vec<String>,
    /// Nodes whose ready pods may be set not ready now, in order, with why (for the pods'
    /// condition, the record's and the Event): the first to succeed, up to `may_mark` of them,
    /// are marked, each told with [`Marking::marked`]; a failure takes no slot, so one node
    /// the API refuses holds none of the others back. The nodes left once the slots are full
    /// are decided again at once (and held back by the rate limit).
    pub mark: Vec<(String, String)>,
    /// How many of `mark` the rate limit lets through now.
    pub may_mark: usize,
    /// How long until time alone changes the decision (a rate limit's window, the leader's
    /// time).
    pub again: Option<Duration>,
    pub said: Vec<Said>,
}

/// What the operator's marking remembers between decisions.
#[derive(Debug)]
pub struct Marking {
    enabled: bool,
    limit: RateLimit,
    /// Nodes whose pods were marked, while a majority still reports them.
    marked: BTreeSet<String>,
    /// Nodes confirmed but not acted on (the setting off, or the rate limit), said once.
    held_back: BTreeSet<String>,
    /// Nodes left to the leader, since when.
    left_to_leader: BTreeMap<String, Instant>,
}

impl Marking {
    /// `enabled`: `[dead_nodes] mark_pods_not_ready`.
    pub fn new(enabled: bool, limit: RateLimit) -> Self {
        Self {
            enabled,
            limit,
            marked: BTreeSet::new(),
            held_back: BTreeSet::new(),
            left_to_leader: BTreeMap::new(),
        }
    }

    /// The decision on `confirmed` (read from a current copy of the records) at `now`, with
    /// `leader` as this replica last saw the lease.
    pub fn decide(&mut self, confirmed: &Confirmed, leader: &Leader, now: Instant) -> Plan {
        let Confirmed {
            dead,
            nodes,
            marked,
        } = confirmed;
        let mut plan = Plan::default();
        for node in marked {
            if !dead.contains_key(node) {
                // The episode is over: a later death of the node is a new one.
                plan.clear.push(node.clone());
            } else if self.marked.insert(node.clone()) {
                plan.said.push(Said::MarkedBefore { node: node.clone() });
            }
        }
        for node in self.marked.iter().filter(|n| !dead.contains_key(*n)) {
            plan.said.push(Said::NoLongerDead { node: node.clone() });
        }
        self.marked.retain(|n| dead.contains_key(n));
        self.held_back.retain(|n| dead.contains_key(n));
        self.left_to_leader.retain(|n, _| dead.contains_key(n));
        let again = |wait: Duration, plan: &mut Plan| {
            plan.again = Some(plan.again.map_or(wait, |a| a.min(wait)));
        };
        for (node, reports) in dead {
            if self.marked.contains(node) {
                continue;
            }
            let why = describe(node, reports, *nodes);
            if !self.enabled {
                if self.held_back.insert(node.clone()) {
                    plan.said.push(Said::NotMarkingOff {
                        node: node.clone(),
                        why,
                    });
                }
                continue;
            }
            if let Some(wait) = self.limit.wait(now) {
                if self.held_back.insert(node.clone()) {
                    plan.said.push(Said::HeldBackByRate {
                        node: node.clone(),
                        why,
                        wait,
                    });
                }
                again(wait, &mut plan);
                continue;
            }
            if leave_to_leader(leader, node) {
                let since = *self.left_to_leader.entry(node.clone()).or_insert_with(|| {
                    plan.said.push(Said::LeftToLeader {
                        node: node.clone(),
                        leader: leader.clone(),
                    });
                    now
                });
                let left = FOLLOWER_BACKUP_AFTER
                    .checked_sub(now.saturating_duration_since(since))
                    .filter(|w| !w.is_zero());
                if let Some(wait) = left {
                    again(wait, &mut plan);
                    continue;
                }
            }
            plan.mark.push((node.clone(), why));
        }
        plan.may_mark = self.limit.free(now).min(plan.mark.len());
        plan
    }

    /// `node`'s pods were set not ready at `at`: not again while the reports stand.
    pub fn marked(&mut self, node: &str, at: Instant) {
        self.limit.record(at);
        self.marked.insert(node.to_owned());
        self.held_back.remove(node);
    }
}

/// Why `node` counts as dead, for logs, events and the pods' condition.
pub fn describe(node: &str, reports: &[Report], nodes: usize) -> String {
    let evidence: Vec<String> = reports
        .iter()
        .map(|r| format!("{} ({})", r.reporter, r.evidence))
        .collect();
    format!(
        "node {node} is dead: {} of {nodes} nodes report it, each after the gossip declared it \
         dead and it answered neither its kubelet's port nor ARP/NDP: {}",
        reports.len(),
        evidence.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{LEASE_LAPSED, PeerDown};

    fn record(reports: &[&str]) -> NodeIpam {
        let mut record = NodeIpam::default();
        record.spec.peers_down = reports
            .iter()
            .map(|node| PeerDown {
                node: (*node).to_owned(),
                evidence: format!("kubelet {node}:10250: no answer within 300 ms"),
            })
            .collect();
        record
    }

    fn judged(records: &[(&str, NodeIpam)]) -> Vec<String> {
        confirmed(records.iter().map(|(n, r)| (*n, r)))
            .dead
            .into_keys()
            .collect()
    }

    #[test]
    fn a_follower_leaves_the_marking_to_a_leader_on_another_node() {
        let leader = |holder: &str| Leader::Other(holder.to_owned());
        // The default identity names the node: the leader on node-2 marks node-1's pods.
        assert!(leave_to_leader(&leader("node-2-4711"), "node-1"));
        // The leader died with the node: the follower marks at once.
        assert!(!leave_to_leader(&leader("node-1-4711"), "node-1"));
        // A node name that is a prefix of another is not confused with it.
        assert!(leave_to_leader(&leader("node-10-4711"), "node-1"));
        assert!(!leave_to_leader(&leader("node-1-5-88"), "node-1-5"));
        // An identity set by hand says no node: the follower cannot know, and marks at once.
        assert!(!leave_to_leader(&leader("operator-a"), "node-1"));
        assert!(!leave_to_leader(&leader("4711"), "node-1"));
        // Leading, or not knowing who leads: mark at once.
        assert!(!leave_to_leader(&Leader::Us, "node-1"));
        assert!(!leave_to_leader(&Leader::Unknown, "node-1"));
    }

    #[test]
    fn a_node_is_confirmed_only_by_a_majority_of_the_nodes() {
        // Three nodes, c dead: a and b report it.
        let both = [
            ("a", record(&["c"])),
            ("b", record(&["c"])),
            ("c", record(&[])),
        ];
        assert_eq!(judged(&both), ["c"]);
        // One report of three is a minority's view.
        let one = [
            ("a", record(&["c"])),
            ("b", record(&[])),
            ("c", record(&[])),
        ];
        assert!(judged(&one).is_empty());
        // A node cut off alone reports both others: still one reporter each.
        let alone = [
            ("a", record(&["b", "c"])),
            ("b", record(&[])),
            ("c", record(&[])),
        ];
        assert!(judged(&alone).is_empty());
        // Of two nodes, the survivor alone is no majority.
        let two = [("a", record(&["b"])), ("b", record(&[]))];
        assert!(judged(&two).is_empty());
        // A report of itself counts for nothing.
        let own = [
            ("a", record(&["a"])),
            ("b", record(&["a"])),
            ("c", record(&[])),
        ];
        assert!(judged(&own).is_empty());
    }

    #[test]
    fn released_nodes_are_not_counted() {
        let mut released = record(&[]);
        released.status.conditions.push(Condition {
            kind: LEASE_LAPSED.to_owned(),
            status: true,
            message: String::new(),
        });
        // Four records, one released: a and b are a majority of the three counted.
        let records = [
            ("a", record(&["c"])),
            ("b", record(&["c"])),
            ("c", record(&[])),
            ("d", released),
        ];
        let confirmed = confirmed(records.iter().map(|(n, r)| (*n, r)));
        assert_eq!(confirmed.nodes, 3);
        let reports = &confirmed.dead["c"];
        assert_eq!(reports.len(), 2);
        assert!(describe("c", reports, confirmed.nodes).contains("2 of 3 nodes report it"));
    }

    #[test]
    fn the_rate_limit_holds_back_within_the_window_and_frees_after() {
        let window = Duration::from_secs(60);
        let mut limit = RateLimit::new(2, window);
        let start = Instant::now();
        assert_eq!(limit.wait(start), None);
        assert_eq!(limit.free(start), 2);
        limit.record(start);
        assert_eq!(limit.wait(start + Duration::from_secs(1)), None);
        limit.record(start + Duration::from_secs(1));
        assert_eq!(limit.free(start + Duration::from_secs(1)), 0);
        assert_eq!(
            limit.wait(start + Duration::from_secs(10)),
            Some(Duration::from_secs(50))
        );
        assert_eq!(limit.wait(start + window), None);
        // None at all: nothing goes ahead, and nothing panics.
        let mut none = RateLimit::new(0, window);
        assert_eq!(none.free(start), 0);
        assert_eq!(none.wait(start), Some(window));
    }

    fn three_with_c_dead() -> [(&'static str, NodeIpam); 3] {
        [
            ("a", record(&["c"])),
            ("b", record(&["c"])),
            ("c", record(&[])),
        ]
    }

    #[test]
    fn a_death_is_marked_once_and_cleared_when_the_reports_go() {
        let start = Instant::now();
        let mut marking = Marking::new(true, RateLimit::new(1, Duration::from_secs(10)));
        let mut records = three_with_c_dead();
        let plan = marking.decide(
            &confirmed(records.iter().map(|(n, r)| (*n, r))),
            &Leader::Us,
            start,
        );
        assert_eq!(plan.mark.len(), 1);
        assert_eq!(plan.mark[0].0, "c");
        marking.marked("c", start);
        let conditions = with_marked_condition(&records[2].1, Some(&plan.mark[0].1)).unwrap();
        records[2].1.status.conditions = conditions;
        // Marked: the same reports mark nothing more.
        let again = marking.decide(
            &confirmed(records.iter().map(|(n, r)| (*n, r))),
            &Leader::Us,
            start + Duration::from_secs(1),
        );
        assert_eq!(again, Plan::default());
        // A replica taking over finds the record's condition and marks nothing.
        let mut successor = Marking::new(true, RateLimit::new(1, Duration::from_secs(10)));
        let plan = successor.decide(
            &confirmed(records.iter().map(|(n, r)| (*n, r))),
            &Leader::Us,
            start + Duration::from_secs(2),
        );
        assert!(plan.mark.is_empty(), "{plan:?}");
        assert_eq!(plan.said, [Said::MarkedBefore { node: "c".into() }]);
        // The reports go: the condition is cleared.
        records[0].1.spec.peers_down.clear();
        let plan = successor.decide(
            &confirmed(records.iter().map(|(n, r)| (*n, r))),
            &Leader::Us,
            start + Duration::from_secs(3),
        );
        assert_eq!(plan.clear, ["c"]);
        assert!(plan.mark.is_empty());
    }

    #[test]
    fn the_rate_limit_and_the_leader_hold_a_marking_back_for_a_while() {
        let start = Instant::now();
        let window = Duration::from_secs(10);
        // Two dead nodes of five, a limit of one per window: one now, one after the window.
        let records = [
            ("a", record(&["d", "e"])),
            ("b", record(&["d", "e"])),
            ("c", record(&["d", "e"])),
            ("d", record(&[])),
            ("e", record(&[])),
        ];
        let confirmed = confirmed(records.iter().map(|(n, r)| (*n, r)));
        let mut marking = Marking::new(true, RateLimit::new(1, window));
        let plan = marking.decide(&confirmed, &Leader::Us, start);
        assert_eq!((plan.mark.len(), plan.may_mark), (2, 1));
        // d's marking fails: it takes no slot, and e is marked in its place.
        assert_eq!(plan.mark[1].0, "e");
        marking.marked("e", start);
        let plan = marking.decide(&confirmed, &Leader::Us, start);
        assert!(plan.mark.is_empty());
        assert_eq!(plan.again, Some(window));
        assert!(
            matches!(&plan.said[..], [Said::HeldBackByRate { node, .. }] if node == "d"),
            "{plan:?}"
        );
        let plan = marking.decide(&confirmed, &Leader::Us, start + window);
        assert_eq!((plan.mark.len(), plan.may_mark), (1, 1));
        assert_eq!(plan.mark[0].0, "d");
        // A follower leaves it to a leader on another node, then marks.
        let mut follower = Marking::new(true, RateLimit::new(5, window));
        let leader = Leader::Other("a-4711".into());
        let plan = follower.decide(&confirmed, &leader, start);
        assert!(plan.mark.is_empty());
        assert_eq!(plan.again, Some(FOLLOWER_BACKUP_AFTER));
        let plan = follower.decide(&confirmed, &leader, start + FOLLOWER_BACKUP_AFTER);
        assert_eq!((plan.mark.len(), plan.may_mark), (2, 2));
        // Off: said once, never marked.
        let mut off = Marking::new(false, RateLimit::new(5, window));
        assert_eq!(off.decide(&confirmed, &Leader::Us, start).said.len(), 2);
        assert_eq!(off.decide(&confirmed, &Leader::Us, start), Plan::default());
    }
}
