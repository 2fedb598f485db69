//! The leading operator's LB-IPAM (`ipam_core::lb::assign`), run on the leader's copy of the
//! store with read-your-writes, its status writes conditional on the revision read; and the
//! operators' election by a lease.

use std::time::Duration;

use ipam_core::dead_nodes::marking::Marking;

use super::World;
use crate::{check::Violation, node::Node, schedule::STEP};

/// How long the operators' lease lasts without a renewal: the leader renews it while its
/// agent runs and reaches the store; another node takes it once it lapsed.
const OPERATOR_LEASE: Duration = Duration::from_secs(3);
/// How often the leading operator runs LB-IPAM when its inputs changed.
const OPERATOR_PASS: Duration = Duration::from_millis(200);
/// How long a pass waits for the operator's copy to show its own last writes before it
/// reads the store itself (`cluster/watched_reads.rs`, `CATCH_UP`).
const CATCH_UP: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
pub(super) struct Operator {
    leader: Option<usize>,
    lease_until: Duration,
    /// Whether the leader reached the store at the last instant looked at: it renewed its
    /// lease at every step since, up to this one's.
    renewing: bool,
    next_pass: Duration,
    /// The store revision of its last write, and when it was made: the next pass waits for
    /// the copy to show it (or [`CATCH_UP`]).
    last_write: Option<(usize, Duration)>,
    /// The copy's revision at the last pass: a pass with nothing new is skipped.
    decided_at: Option<usize>,
    /// The dead nodes' marking, from the leader's first pass.
    pub(super) marking: Option<Marking>,
}

impl Operator {
    /// When the operators must be looked at again after `now` with nothing else happening:
    /// the leader's next pass, or the lapse of a lease its leader no longer renews. (With no
    /// node reaching the store, an election waits for one to reach it, which happens at an
    /// instant looked at anyway.)
    pub(super) fn next_instant(&self, now: Duration) -> Option<Duration> {
        match self.leader {
            Some(_) if self.renewing => Some(self.next_pass),
            _ => Some(self.lease_until).filter(|lapse| *lapse > now),
        }
    }
}

fn reaches_store(n: &Node) -> bool {
    n.powered && n.nic_up && n.agent.is_some()
}

impl World {
    /// The operators' election and the leader's passes: the dead nodes' marking, LB-IPAM.
    pub(super) fn run_operator(&mut self) -> Result<(), Violation> {
        let now = self.now;
        // Whether the leader reaches the store changes only at an instant looked at: if it
        // did at the last one, it renewed the lease at every step since.
        if self.operator.renewing {
            self.operator.lease_until = self
                .operator
                .lease_until
                .max(now.saturating_sub(STEP) + OPERATOR_LEASE);
        }
        self.operator.renewing = false;
        match self.operator.leader {
            Some(l) if reaches_store(&self.nodes[l]) => {
                self.operator.lease_until = now + OPERATOR_LEASE;
                self.operator.renewing = true;
            }
            _ if now < self.operator.lease_until => return Ok(()),
            _ => {
                let Some(next) = (0..self.nodes.len()).find(|i| reaches_store(&self.nodes[*i]))
                else {
                    return Ok(());
                };
                self.operator = Operator {
                    leader: Some(next),
                    lease_until: now + OPERATOR_LEASE,
                    renewing: true,
                    next_pass: now,
                    ..Operator::default()
                };
                self.note(format!("node-{next}'s operator leads"));
            }
        }
        let Some(l) = self.operator.leader else {
            return Ok(());
        };
        if now < self.operator.next_pass {
            return Ok(());
        }
        self.operator.next_pass = now + OPERATOR_PASS;
        self.run_marking(l)?;
        let Some(agent) = self.nodes[l].agent.as_ref() else {
            return Ok(());
        };
        // Read your writes: a copy that has not shown the last write yet, or a stale one, is
        // left for the store itself once CATCH_UP has passed (or at once when stale).
        let shown = agent.watch.delivered();
        let stale = now < agent.watch.stalled_until;
        let behind = self
            .operator
            .last_write
            .is_some_and(|(revision, _)| shown < revision);
        let from_store = stale
            || self
                .operator
                .last_write
                .is_some_and(|(_, at)| behind && now >= at + CATCH_UP);
        if behind && !from_store {
            return Ok(());
        }
        let read_at = if stale || behind {
            self.store.revision()
        } else {
            shown
        };
        if self.operator.decided_at == Some(read_at) {
            return Ok(());
        }
        self.operator.decided_at = Some(read_at);
        let objects = if from_store {
            self.store.now.clone()
        } else {
            agent.copy.clone()
        };
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
        Ok(())
    }
}
