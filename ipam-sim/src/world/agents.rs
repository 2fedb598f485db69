//! Each node's agent at an instant: its watch, the gossip's news, its fence and heartbeat, and
//! its decisions; and when it must be looked at next.

use std::{collections::BTreeSet, net::IpAddr, time::Duration};

use ipam_core::l2::pacing::{DECISION, TICK};
use ipam_gossip::{Event as GossipEvent, Timing};
use rand::Rng;

use super::{Due, World};
use crate::{
    node::{Agent, HEARTBEAT, LIVENESS_TIMEOUT},
    schedule::{CLOSED_FENCE_EVERY, STEP, Stepping, round_up, step_at_or_after, tick_at_or_after},
    store::node_index,
};

impl World {
    /// Node `i`'s agent is looked at in this instant (something changed it from outside).
    pub(super) fn wake(&mut self, i: usize) {
        self.wakes[i] = self.wakes[i].min(self.now);
    }

    /// Passes the gossip's news to each agent: a member declared dead is held for the
    /// takeover hold; any change of the membership is decided at once.
    pub(super) fn follow_gossip_reports(&mut self) {
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
                // A suspicion changes nothing but what the dead-node reports probe.
                GossipEvent::Suspected(_) | GossipEvent::Rejoined(_) => {}
                _ => continue,
            }
            agent.reporter.dirty = true;
            self.wakes[report.member] = self.wakes[report.member].min(self.now);
        }
    }

    /// Tells each agent whose gossip member stepped since the last instant that its fence may
    /// judge otherwise now.
    pub(super) fn follow_gossip_steps(&mut self) {
        let window = Timing::default().fence().window;
        for (member, at) in self.gossip.take_steps() {
            if let Some(agent) = self.nodes[member].agent.as_mut() {
                agent.fence.stepped(at, window);
                let digest = self
                    .gossip
                    .peer(member)
                    .map(ipam_gossip::Peer::membership_digest);
                if digest != agent.reporter.membership {
                    agent.reporter.membership = digest;
                    agent.reporter.dirty = true;
                }
                self.wakes[member] = self.wakes[member].min(self.now);
            }
        }
    }

    /// Every agent's watch may deliver what the store took since the last instant.
    pub(super) fn follow_store(&mut self) {
        if self.store.revision() == self.store_followed {
            return;
        }
        self.store_followed = self.store.revision();
        for (i, n) in self.nodes.iter().enumerate() {
            if let Some(delivery) = n.agent.as_ref().and_then(|a| a.watch.next_at(&self.store)) {
                self.wakes[i] = self.wakes[i].min(delivery);
            }
        }
    }

    /// One instant of node `i`'s agent.
    pub(super) fn run_agent(&mut self, i: usize) {
        let now = self.now;
        let Some(mut agent) = self.nodes[i].agent.take() else {
            self.wakes[i] = Duration::MAX;
            return;
        };
        // The ticks that passed since it was last looked at decided nothing.
        agent.tick_passed(now.saturating_sub(STEP));
        // The watch; a failing one relists when it works again (a change, as the daemon's
        // shared watch tells its subscribers).
        if agent.watch.stalled_until > Duration::ZERO && now == agent.watch.stalled_until {
            agent.changed = true;
        }
        let mut records_changed = false;
        for (revision, change) in agent.watch.due(&self.store, now) {
            agent.copy.apply(change, revision);
            agent.changed = true;
            records_changed |= matches!(change, crate::store::Change::Record(..));
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
        self.judge_fence(i, &mut agent);
        self.run_reporter(i, &mut agent);
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
            if let Some(answers) = plan.answers {
                let answering: BTreeSet<IpAddr> = answers.answering.keys().copied().collect();
                if answering == self.nodes[i].datapath.answering {
                    self.note(format!("node-{i} decided: answers the same"));
                } else {
                    self.note(format!("node-{i} answers {answering:?}"));
                }
                self.nodes[i].datapath.answering = answering;
            }
        }
        // A decision due now starts.
        if agent.due(now, self.at(now)) {
            let knows_others = self
                .gossip
                .peer(i)
                .is_some_and(|p| p.active().next().is_some());
            if !agent
                .decider
                .waits(agent.opened_once, knows_others, self.at(now))
            {
                let took = self.decision_length();
                let live = self.live_for(i, &agent);
                let at = self.at(now);
                let mut is_live =
                    |node: &str| node_index(node).is_some_and(|n| live.get(n) == Some(&true));
                agent.decide(now, at, took, &mut is_live);
                self.exercised.decisions += 1;
            }
        }
        agent.tick_passed(now);
        self.wakes[i] = self.next_wake(i, &agent);
        self.nodes[i].agent = Some(agent);
    }

    /// Judges node `i`'s fence if it is judged at this step (every step while open, every
    /// fifth while closed) and anything may have changed its verdict since the last time.
    fn judge_fence(&mut self, i: usize, agent: &mut Agent) {
        let now = self.now;
        let on_grid =
            now.as_nanos().is_multiple_of(CLOSED_FENCE_EVERY.as_nanos()) || agent.latch.is_open();
        if !on_grid {
            return;
        }
        if self.stepping == Stepping::Instants
            && self.fence_change(i, agent).is_none_or(|t| t > now)
        {
            return;
        }
        agent.fence.judged(now);
        let was_open = agent.latch.is_open();
        let verdict = self.gossip.fence_verdict(i);
        let open = agent.latch.take(now, &verdict);
        if open && !was_open {
            self.note(format!("node-{i}'s fence opened"));
            // As the daemon's gossip member does at a reopening.
            self.gossip.greet_the_dead(i);
        }
        if open && !agent.opened_once {
            agent.opened_once = true;
            if agent.clears_notice {
                agent.clears_notice = false;
                let latency = self.write_latency();
                self.schedule(latency, Due::NoticeCleared { node: i });
            }
        }
        if was_open != open {
            agent.reporter.dirty = true;
            // The daemon's owners decide at every change of the fence, unpaced: the first
            // decision with it closed gives everything up (`Decider::decide`).
            agent.decide_now = true;
        }
        if was_open && !open {
            self.nodes[i].datapath.deadline = self.nodes[i].datapath.deadline.min(now);
            self.note(format!("node-{i}'s fence closed: silenced"));
        }
    }

    /// The first step since node `i`'s fence was last judged at which its verdict may have
    /// changed.
    fn fence_change(&self, i: usize, agent: &Agent) -> Option<Duration> {
        let quiet = Timing::default().fence().quiet;
        let quiet_ends = self
            .gossip
            .peer(i)
            .and_then(|p| p.contact().last_heard())
            .map(|heard| step_at_or_after(heard + quiet));
        agent
            .fence
            .next_change(quiet_ends, agent.latch.reopens_at())
    }

    /// When node `i`'s agent must be looked at again, with nothing changing it from outside:
    /// a delivery or the end of a failing watch, the end of a takeover hold, a judgement of
    /// its fence, its heartbeat, the end of its decision, or a tick that decides.
    fn next_wake(&self, i: usize, agent: &Agent) -> Duration {
        let now = self.now;
        let after = now + STEP;
        let fence = self.fence_change(i, agent).map(|t| {
            let t = t.max(after);
            if agent.latch.is_open() {
                t
            } else {
                round_up(t, CLOSED_FENCE_EVERY)
            }
        });
        let stall_ends = Some(agent.watch.stalled_until).filter(|t| *t > now);
        let hold_ends = agent.held_dead.values().min().map(|t| step_at_or_after(*t));
        let decision = if agent.deciding.is_some() || agent.frozen {
            None
        } else if agent.decide_now {
            // It waits (for its fence to open, or for the gossip to join): looked at again
            // at every step until it does not.
            Some(after)
        } else if agent.changed || !agent.held_dead.is_empty() {
            Some(tick_at_or_after(
                agent.next_tick,
                TICK,
                after.max(agent.rested_until),
            ))
        } else {
            // Time alone changes its decision at the instant the decider names: the first
            // tick at or after it decides.
            agent.decider.next_due().map(|due| {
                let due = due.saturating_duration_since(self.base);
                tick_at_or_after(
                    agent.next_tick,
                    TICK,
                    after.max(agent.rested_until).max(due),
                )
            })
        };
        [
            agent.watch.next_at(&self.store),
            stall_ends,
            hold_ends,
            fence,
            Some(agent.next_beat),
            agent.deciding.as_ref().map(|(ends, _)| *ends),
            agent.reporter.next_wake(),
            decision,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(Duration::MAX)
    }

    fn decision_length(&mut self) -> Duration {
        if self.rng.random_bool(0.1) {
            let longest = u64::try_from(DECISION.as_millis()).unwrap_or(u64::MAX);
            Duration::from_millis(self.rng.random_range(5..=longest))
        } else {
            Duration::from_millis(self.rng.random_range(0..=4))
        }
    }

    /// Who node `i` counts live, by node number: itself, the members its gossip holds active,
    /// and those declared dead within the takeover hold. (A decision asks about every node:
    /// a set of names cost more than the rest of the model at 1,000 nodes.)
    fn live_for(&self, i: usize, agent: &Agent) -> Vec<bool> {
        let mut live = vec![false; self.nodes.len()];
        live[i] = true;
        if let Some(peer) = self.gossip.peer(i) {
            for id in peer.active() {
                if let Some(m) = self.by_addr.get(&id.addr) {
                    live[*m] = true;
                }
            }
        }
        for m in agent.held_dead.keys() {
            live[*m] = true;
        }
        live
    }
}
