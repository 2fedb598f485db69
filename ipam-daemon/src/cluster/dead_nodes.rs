//! The operator's half of taking a dead node's pods out of their Services' endpoints, on
//! Kubernetes: the agents report in their records the nodes the gossip declared dead whose
//! kubelet is silent too (`liveness::dead_peers`); once a majority of the nodes report one, its
//! pods are set not ready (`ipam_kube::pod_readiness`), as the node lifecycle controller does
//! when its grace period (about 50 s) has passed. The EndpointSlice controller and kube-proxy
//! then stop sending the pods new connections within seconds of the node's death.
//!
//! The decision (the majority, the rate limit, once per death, the leader's moment) is
//! `ipam_core::dead_nodes::marking`, which `ipam-sim` runs too; this module follows the
//! records, feeds it, and carries out its plan: the pods' patches, the record's
//! `PODS_MARKED_NOT_READY` condition, the Events; the runtime tries a failed pass again with backoff. The patches test
//! the condition they change, so two replicas acting on the same reports mark each pod once.

use std::{sync::Arc, time::Duration};

use ipam_config::DeadNodeSettings;
use ipam_core::{
    dead_nodes::marking::{self, Marking, Plan, RateLimit, Said},
    resources::{NodeIpam, PODS_MARKED_NOT_READY},
    store::{StoreError, TypedStore as _},
};
use ipam_kube::{KubeStore, pod_readiness};
use tokio::{sync::watch, time::Instant};

use super::{
    ClusterStore,
    copies::{Copy, Wake},
    events::Events,
    operator::Leader,
};
use crate::{
    metrics::Metrics,
    runtime::{Controller, Next, Woken},
};

/// Why the marking's condition could not be written.
#[derive(Debug, thiserror::Error)]
enum NoteError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the record changed under each of {0} writes")]
    KeptChanging(usize),
}

/// Why a pass left some of its plan undone: each node and what failed for it; and when the
/// rest of the plan wants another pass (a rate limit's window, a mark held back), which a
/// failure must not push back.
#[derive(Debug)]
struct Unfinished {
    failed: Vec<String>,
    again: Option<Duration>,
}

impl std::fmt::Display for Unfinished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.failed.join("; "))
    }
}

/// What carries the decisions out.
struct Applier {
    store: KubeStore,
    /// Where the nodes' records are, for the marking's condition.
    records: ClusterStore,
    settings: DeadNodeSettings,
    events: Events,
}

/// Follows the node records for as long as the operator runs, marking the pods of the nodes
/// a majority reports dead. Only on Kubernetes: on another store it returns at once.
pub async fn run(
    store: ClusterStore,
    settings: DeadNodeSettings,
    events: Events,
    leader: watch::Receiver<Leader>,
    stop: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
) {
    let Some(kube) = store.kube().cloned() else {
        return;
    };
    let wake = Wake::default();
    let records = store.follow::<NodeIpam>(&wake, "dead nodes' reports").await;
    let marking = Marking::new(
        settings.mark_pods_not_ready,
        RateLimit::new(settings.max_nodes_per_window, settings.rate_window()),
    );
    let applier = Applier {
        store: kube,
        records: store.clone(),
        settings,
        events,
    };
    let controller = DeadNodes {
        store,
        records,
        wake,
        leader,
        stop,
        marking,
        applier,
    };
    crate::runtime::run(controller, metrics).await;
}

/// The marking, as a controller.
struct DeadNodes {
    store: ClusterStore,
    records: Copy<NodeIpam>,
    wake: Wake,
    leader: watch::Receiver<Leader>,
    stop: watch::Receiver<bool>,
    marking: Marking,
    applier: Applier,
}

impl Controller for DeadNodes {
    const NAME: &'static str = "dead_nodes";
    type Error = Unfinished;

    fn due_despite(error: &Unfinished) -> Option<Duration> {
        error.again
    }

    async fn pass(&mut self) -> Result<Next, Unfinished> {
        // Reports read from a copy the watch may have left behind (one its reporter has
        // retracted since, say) mark nothing: the watch's next event, a fresh list after an
        // error, brings the decision back.
        let plan = {
            let at = self.store.moment().await;
            let records = self.records.read(&at);
            records.is_fresh().then(|| {
                let confirmed =
                    marking::confirmed(records.iter().map(|r| (r.name.as_str(), &r.value)));
                let leader = self.leader.borrow().clone();
                self.marking
                    .decide(&confirmed, &leader, Instant::now().into_std())
            })
        };
        let Some(plan) = plan else {
            return Ok(Next::OnChange);
        };
        let again = self.applier.carry_out(plan, &mut self.marking).await?;
        Ok(again.map_or(Next::OnChange, Next::Within))
    }

    async fn changed(&mut self) -> Woken {
        tokio::select! {
            () = self.wake.changed() => Woken::Changed,
            _ = self.stop.changed() => Woken::Closed,
        }
    }
}

impl Applier {
    /// Carries `plan` out; how long until a held-back marking is decided again, or what
    /// failed (tried again with backoff).
    async fn carry_out(
        &mut self,
        plan: Plan,
        marking: &mut Marking,
    ) -> Result<Option<Duration>, Unfinished> {
        let Plan {
            clear,
            mark,
            may_mark,
            again,
            said,
        } = plan;
        for said in &said {
            self.say(said);
        }
        let mut failed = Vec::new();
        for node in clear {
            if let Err(e) = self.note_marked(&node, None).await {
                failed.push(format!(
                    "cannot clear the {PODS_MARKED_NOT_READY} condition of node {node}, no \
                     longer reported dead: {e}"
                ));
            }
        }
        let mut slots = may_mark;
        let mut held_back = false;
        for (node, why) in mark {
            if slots == 0 {
                // The rate limit is reached: decided again at once, which holds the rest
                // back and says so.
                held_back = true;
                break;
            }
            match self.mark(&node, &why).await {
                Ok(patched) => {
                    marking.marked(&node, patched.into_std());
                    slots -= 1;
                }
                Err(e) => failed.push(format!("{why}; cannot mark its pods not ready: {e}")),
            }
        }
        let again = if held_back {
            Some(Duration::ZERO)
        } else {
            again
        };
        if !failed.is_empty() {
            return Err(Unfinished { failed, again });
        }
        Ok(again)
    }

    fn say(&self, said: &Said) {
        match said {
            Said::MarkedBefore { node } => tracing::info!(
                node = node.as_str(),
                "node {node}'s pods were set not ready by an operator before this one (its \
                 record's {PODS_MARKED_NOT_READY} condition), on the reports that still \
                 stand: not marking them again, so a kubelet that restored them keeps the \
                 last word"
            ),
            Said::NoLongerDead { node } => tracing::info!(
                node = node.as_str(),
                "node {node} is no longer reported dead by a majority; its kubelet's status \
                 sync restores its pods' readiness"
            ),
            Said::NotMarkingOff { node, why } => tracing::warn!(
                node = node.as_str(),
                "{why}; not marking its pods not ready ([dead_nodes] mark_pods_not_ready is \
                 off): Kubernetes takes them out of their Services after its node grace period"
            ),
            Said::HeldBackByRate { node, why, wait } => tracing::warn!(
                node = node.as_str(),
                wait_ms = wait.as_millis() as u64,
                "{why}; not marking its pods not ready yet: {} nodes' pods were marked within \
                 [dead_nodes] rate_window_ms ({} ms), the most max_nodes_per_window allows",
                self.settings.max_nodes_per_window,
                self.settings.rate_window_ms
            ),
            Said::LeftToLeader { node, leader } => tracing::info!(
                node = node.as_str(),
                leader = ?leader,
                "leaving the marking of node {node}'s pods to the leading operator; marking \
                 them here in {} ms if it has not",
                marking::FOLLOWER_BACKUP_AFTER.as_millis()
            ),
        }
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
            let Some(conditions) = marking::with_marked_condition(&record.value, why) else {
                return Ok(());
            };
            let mut updated = record.value;
            updated.status.conditions = conditions;
            if self
                .records
                .update_status_unless_changed(node, &updated, &record.revision)
                .await?
            {
                return Ok(());
            }
        }
        Err(NoteError::KeptChanging(TRIES))
    }

    /// Sets `node`'s ready pods not ready; when they were (what the rate limit counts).
    async fn mark(&mut self, node: &str, why: &str) -> Result<Instant, kube::Error> {
        let message = format!(
            "{why}; set not ready by ipam-operator. If the node runs, its kubelet restores \
             this condition"
        );
        let started = Instant::now();
        let marked = pod_readiness::mark_pods_not_ready(&self.store, node, &message).await?;
        let patched = Instant::now();
        let took_ms = patched.duration_since(started).as_millis() as u64;
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
            return Ok(patched);
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
        Ok(patched)
    }
}
