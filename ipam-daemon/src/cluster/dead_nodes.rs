//! The operator's half of taking a dead node's pods out of their Services' endpoints, on
//! Kubernetes: the agents report in their records the nodes the gossip declared dead whose
//! kubelet is silent too (`liveness::dead_peers`); once a majority of the nodes report one, its
//! pods are set not ready (`ipam_kube::pod_readiness`), as the node lifecycle controller does
//! when its grace period (about 50 s) has passed. The EndpointSlice controller and kube-proxy
//! then stop sending the pods new connections within seconds of the node's death.
//!
//! What guards it:
//! - a majority: more than half of the nodes with a record (those the operator released for a
//!   lapsed lease aside) must report the node, so a node cut off with a minority, which sees
//!   everyone else dead, moves nothing; and each reporter reports only while its own gossip
//!   hears a majority;
//! - two independent signals in every report (the gossip, and the kubelet's port);
//! - a rate limit: at most `max_nodes_per_window` nodes within `rate_window_ms`; the rest wait
//!   for the window or for the node lifecycle controller, and the log says so;
//! - nothing to undo: a node that was alive after all gets its pods' readiness back from its
//!   own kubelet's status sync.
//!
//! Every operator replica runs this, not only the leader: the leader may have died with the
//! node, and a new one is elected only after `operator_lease_ms`. A replica that does not lead
//! leaves the marking to the leader for `FOLLOWER_BACKUP_AFTER` when the lease names the leader's
//! node and that node is not the dead one (the default identity is `<node>-<pid>`); otherwise
//! it marks at once. The patches test the condition they change, so two replicas acting on the
//! same reports mark each pod once; the wait only keeps the follower's patches from doubling
//! the API server's work in the tenth of a second the marking is timed by.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    time::Duration,
};

use ipam_config::DeadNodeSettings;
use ipam_core::{
    backoff::Backoff,
    meta::Condition,
    resources::{NodeIpam, PODS_MARKED_NOT_READY},
    store::{StoreError, TypedStore as _},
};
use ipam_kube::{KubeStore, pod_readiness};
use tokio::{sync::watch, time::Instant};

use super::{
    ClusterStore,
    cache::{Cache, watch_until_it_works},
    events::Events,
    operator::Leader,
};

/// Longest wait before a marking the API refused is tried again.
const RETRY_CAP: Duration = Duration::from_secs(10);

/// How long a replica that does not lead leaves a dead node's pods to a leader on another
/// node before marking them itself (finding them marked, it changes nothing): many times the
/// marking's own time (under 0.2 s), so only a leader that is stuck or cut off from the API
/// server leaves it the work.
const FOLLOWER_BACKUP_AFTER: Duration = Duration::from_secs(1);

/// The node an operator's identity names, for the default identity `<node>-<pid>`; `None` for
/// an identity set by hand in another form.
fn identity_node(identity: &str) -> Option<&str> {
    let (node, pid) = identity.rsplit_once('-')?;
    (!node.is_empty() && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())).then_some(node)
}

/// Whether this replica leaves `dead`'s pods to the leader for a while: only when another
/// replica leads from a node known to be another than `dead`.
fn leave_to_leader(leader: &Leader, dead: &str) -> bool {
    match leader {
        Leader::Other(holder) => identity_node(holder).is_some_and(|node| node != dead),
        Leader::Us | Leader::Unknown => false,
    }
}

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

/// At most `max` actions within any `window`.
struct RateLimit {
    max: usize,
    window: Duration,
    acted: VecDeque<Instant>,
}

impl RateLimit {
    fn new(max: usize, window: Duration) -> Self {
        Self {
            max,
            window,
            acted: VecDeque::new(),
        }
    }

    /// `None` when an action may go ahead at `now`; else how long until one may.
    fn wait(&mut self, now: Instant) -> Option<Duration> {
        while self
            .acted
            .front()
            .is_some_and(|at| now.duration_since(*at) >= self.window)
        {
            self.acted.pop_front();
        }
        if self.acted.len() < self.max {
            return None;
        }
        let oldest = *self.acted.front().expect("max is at least 1");
        Some(self.window.saturating_sub(now.duration_since(oldest)))
    }

    fn record(&mut self, now: Instant) {
        self.acted.push_back(now);
    }
}

/// Why the marking's condition could not be written.
#[derive(Debug, thiserror::Error)]
enum NoteError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the record changed under each of {0} writes")]
    KeptChanging(usize),
}

/// What the controller remembers between passes.
struct Marking {
    store: KubeStore,
    /// Where the nodes' records are, for the marking's condition.
    records: ClusterStore,
    settings: DeadNodeSettings,
    events: Events,
    limit: RateLimit,
    backoff: Backoff,
    /// Nodes whose pods were marked, while a majority still reports them.
    marked: BTreeSet<String>,
    /// Nodes confirmed but not acted on (the setting off, or the rate limit), said once.
    held_back: BTreeSet<String>,
    /// Who leads the operators.
    leader: watch::Receiver<Leader>,
    /// Nodes left to the leader, since when.
    left_to_leader: BTreeMap<String, Instant>,
}

/// Follows the node records for as long as the operator runs, marking the pods of the nodes
/// a majority reports dead. Only on Kubernetes: on another store it returns at once.
pub async fn run(
    store: ClusterStore,
    settings: DeadNodeSettings,
    events: Events,
    leader: watch::Receiver<Leader>,
    mut stop: watch::Receiver<bool>,
) {
    let Some(kube) = store.kube().cloned() else {
        return;
    };
    let mut watch = watch_until_it_works::<NodeIpam, _>(&store, "dead nodes' reports").await;
    let mut records = Cache::<NodeIpam>::new(&watch.initial);
    let mut marking = Marking {
        store: kube,
        records: store.clone(),
        limit: RateLimit::new(settings.max_nodes_per_window, settings.rate_window()),
        settings,
        events,
        backoff: Backoff::new(RETRY_CAP),
        marked: BTreeSet::new(),
        held_back: BTreeSet::new(),
        leader,
        left_to_leader: BTreeMap::new(),
    };
    loop {
        // Reports read from a copy the watch may have left behind (one its reporter has
        // retracted since, say) mark nothing: the watch's next event, a fresh list after an
        // error, brings the decision back.
        let again = if records.is_fresh() {
            let confirmed = confirmed(records.iter().map(|r| (r.name.as_str(), &r.value)));
            marking.pass(&confirmed).await
        } else {
            None
        };
        let again = async {
            match again {
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            event = watch.next() => records.apply(event),
            () = again => {}
            _ = stop.changed() => return,
        }
    }
}

impl Marking {
    /// Acts on `confirmed`; how long until a held-back or failed marking is tried again.
    async fn pass(&mut self, confirmed: &Confirmed) -> Option<Duration> {
        let Confirmed {
            dead,
            nodes,
            marked,
        } = confirmed;
        let mut again: Option<Duration> = None;
        for node in marked {
            if !dead.contains_key(node) {
                // The episode is over: a later death of the node is a new one.
                if let Err(e) = self.note_marked(node, None).await {
                    let wait = self.backoff.next_delay();
                    tracing::warn!(
                        node = node.as_str(),
                        retry_in_ms = wait.as_millis() as u64,
                        "cannot clear the {PODS_MARKED_NOT_READY} condition of node {node}, \
                         no longer reported dead, retrying: {e}"
                    );
                    again = Some(again.map_or(wait, |a| a.min(wait)));
                }
            } else if self.marked.insert(node.clone()) {
                tracing::info!(
                    node = node.as_str(),
                    "node {node}'s pods were set not ready by an operator before this one (its \
                     record's {PODS_MARKED_NOT_READY} condition), on the reports that still \
                     stand: not marking them again, so a kubelet that restored them keeps the \
                     last word"
                );
            }
        }
        for node in self.marked.iter().filter(|n| !dead.contains_key(*n)) {
            tracing::info!(
                node = node.as_str(),
                "node {node} is no longer reported dead by a majority; its kubelet's status \
                 sync restores its pods' readiness"
            );
        }
        self.marked.retain(|n| dead.contains_key(n));
        self.held_back.retain(|n| dead.contains_key(n));
        self.left_to_leader.retain(|n, _| dead.contains_key(n));
        for (node, reports) in dead {
            if self.marked.contains(node) {
                continue;
            }
            let why = describe(node, reports, *nodes);
            if !self.settings.mark_pods_not_ready {
                if self.held_back.insert(node.clone()) {
                    tracing::warn!(
                        node = node.as_str(),
                        "{why}; not marking its pods not ready ([dead_nodes] \
                         mark_pods_not_ready is off): Kubernetes takes them out of their \
                         Services after its node grace period"
                    );
                }
                continue;
            }
            if let Some(wait) = self.limit.wait(Instant::now()) {
                if self.held_back.insert(node.clone()) {
                    tracing::warn!(
                        node = node.as_str(),
                        wait_ms = wait.as_millis() as u64,
                        "{why}; not marking its pods not ready yet: {} nodes' pods were marked \
                         within [dead_nodes] rate_window_ms ({} ms), the most \
                         max_nodes_per_window allows",
                        self.settings.max_nodes_per_window,
                        self.settings.rate_window_ms
                    );
                }
                again = Some(again.map_or(wait, |a| a.min(wait)));
                continue;
            }
            if let Some(wait) = self.left_to_leader_for(node) {
                again = Some(again.map_or(wait, |a| a.min(wait)));
                continue;
            }
            match self.mark(node, &why).await {
                Ok(()) => {
                    self.backoff.reset();
                    self.held_back.remove(node);
                }
                Err(e) => {
                    let wait = self.backoff.next_delay();
                    tracing::warn!(
                        node = node.as_str(),
                        retry_in_ms = wait.as_millis() as u64,
                        "{why}; cannot mark its pods not ready, retrying: {e}"
                    );
                    again = Some(again.map_or(wait, |a| a.min(wait)));
                }
            }
        }
        again
    }

    /// How much longer `node`'s pods are left to the leader; `None` when this replica marks
    /// them now.
    fn left_to_leader_for(&mut self, node: &str) -> Option<Duration> {
        let leader = self.leader.borrow().clone();
        if !leave_to_leader(&leader, node) {
            return None;
        }
        let now = Instant::now();
        let since = *self
            .left_to_leader
            .entry(node.to_owned())
            .or_insert_with(|| {
                tracing::info!(
                    node,
                    leader = ?leader,
                    "leaving the marking of node {node}'s pods to the leading operator; marking \
                     them here in {} ms if it has not",
                    FOLLOWER_BACKUP_AFTER.as_millis()
                );
                now
            });
        FOLLOWER_BACKUP_AFTER
            .checked_sub(now.duration_since(since))
            .filter(|w| !w.is_zero())
    }

    /// Sets (`Some(why)`) or removes (`None`) the `PODS_MARKED_NOT_READY` condition of
    /// `node`'s record, the rest of it as read; a write that another writer beat is read and
    /// tried again, a few times.
    async fn note_marked(&self, node: &str, why: Option<&str>) -> Result<(), NoteError> {
        const TRIES: usize = 5;
        for _ in 0..TRIES {
            let Some(record) = self.records.get_typed::<NodeIpam>(node).await? else {
                return Ok(());
            };
            let mut updated = record.value;
            let before = updated.status.conditions.clone();
            updated
                .status
                .conditions
                .retain(|c| c.kind != PODS_MARKED_NOT_READY);
            if let Some(why) = why {
                updated.status.conditions.push(Condition::new(
                    PODS_MARKED_NOT_READY,
                    true,
                    format!("{why}; its pods were set not ready by ipam-operator"),
                ));
            }
            if updated.status.conditions == before
                || self
                    .records
                    .update_status_unless_changed(node, &updated, &record.revision)
                    .await?
            {
                return Ok(());
            }
        }
        Err(NoteError::KeptChanging(TRIES))
    }

    async fn mark(&mut self, node: &str, why: &str) -> Result<(), kube::Error> {
        let message = format!(
            "{why}; set not ready by ipam-operator. If the node runs, its kubelet restores \
             this condition"
        );
        let started = Instant::now();
        let marked = pod_readiness::mark_pods_not_ready(&self.store, node, &message).await?;
        self.limit.record(Instant::now());
        self.marked.insert(node.to_owned());
        let took_ms = started.elapsed().as_millis() as u64;
        // After the pods, so that the marking is not held up by it. Should it fail, a replica
        // that takes over before the node is no longer reported marks the pods once more.
        if let Err(e) = self.note_marked(node, Some(why)).await {
            tracing::warn!(
                node,
                "cannot set the {PODS_MARKED_NOT_READY} condition of node {node}: an operator \
                 replica taking over would mark its pods again: {e}"
            );
        }
        if marked.pods.is_empty() {
            // Another replica (or the node lifecycle controller) was first, or no pod was ready.
            tracing::info!(
                node,
                left_alone = marked.left_alone,
                took_ms,
                "{why}; none of its pods is ready any more: nothing to mark"
            );
            return Ok(());
        }
        tracing::warn!(
            node,
            pods = marked.pods.len(),
            left_alone = marked.left_alone,
            took_ms,
            "{why}; set its {} ready pods not ready, so their Services stop sending them \
             traffic",
            marked.pods.len()
        );
        let note = format!(
            "{why}; set {} pods not ready: {}",
            marked.pods.len(),
            marked.pods.join(", ")
        );
        self.events.pods_marked_not_ready(node, &note).await;
        Ok(())
    }
}

/// Why `node` counts as dead, for logs, events and the pods' condition.
fn describe(node: &str, reports: &[Report], nodes: usize) -> String {
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
    use ipam_core::{
        meta::Condition,
        resources::{LEASE_LAPSED, PeerDown},
    };

    use super::*;

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
        limit.record(start);
        assert_eq!(limit.wait(start + Duration::from_secs(1)), None);
        limit.record(start + Duration::from_secs(1));
        assert_eq!(
            limit.wait(start + Duration::from_secs(10)),
            Some(Duration::from_secs(50))
        );
        assert_eq!(limit.wait(start + window), None);
    }
}
