//! What the member shows: the gossip metrics, brought up to the peer's counters, and the view
//! `ipamctl members` reads.

use std::{collections::HashMap, sync::Arc, time::Duration};

use ipam_api::types::{GossipMember, GossipMembers};
use ipam_gossip::{Dropped, Peer, State, Stats};

use super::directory::Directory;
use crate::metrics::gossip::{DirectionLabel, GossipMetrics, ReasonLabel, StateLabel};

/// The metrics, and the peer's counters as last added to them.
pub(super) struct Report {
    metrics: Arc<crate::metrics::Metrics>,
    counted: Stats,
}

impl Report {
    pub(super) fn new(metrics: Arc<crate::metrics::Metrics>) -> Self {
        Self {
            metrics,
            counted: Stats::default(),
        }
    }

    pub(super) fn metrics(&self) -> &GossipMetrics {
        &self.metrics.gossip
    }

    /// Brings the metrics up to the peer's counters and membership.
    pub(super) fn count(&mut self, peer: &Peer) {
        let stats = peer.stats().clone();
        let gossip = &self.metrics.gossip;
        let before = &self.counted;
        let grew = |now: u64, then: u64| now.saturating_sub(then);
        for (family, direction, added) in [
            (
                &gossip.packets,
                "sent",
                grew(stats.sent_packets, before.sent_packets),
            ),
            (
                &gossip.packets,
                "received",
                grew(stats.received_packets, before.received_packets),
            ),
            (
                &gossip.bytes,
                "sent",
                grew(stats.sent_bytes, before.sent_bytes),
            ),
            (
                &gossip.bytes,
                "received",
                grew(stats.received_bytes, before.received_bytes),
            ),
        ] {
            let label = DirectionLabel {
                direction: direction.to_owned(),
            };
            family.get_or_create(&label).inc_by(added);
        }
        gossip
            .suspicions
            .inc_by(grew(stats.suspicions, before.suspicions));
        gossip.hellos.inc_by(grew(stats.hellos, before.hellos));
        for reason in Dropped::ALL {
            let added = grew(stats.dropped(reason), before.dropped(reason));
            if added > 0 {
                let label = ReasonLabel {
                    reason: reason.label().to_owned(),
                };
                gossip.dropped.get_or_create(&label).inc_by(added);
            }
        }
        let mut by_state: HashMap<&str, i64> = [("alive", 0), ("suspect", 0), ("down", 0)].into();
        for (_, state) in peer.members() {
            *by_state.entry(state_label(state)).or_default() += 1;
        }
        for (state, count) in by_state {
            let label = StateLabel {
                state: state.to_owned(),
            };
            gossip.members.get_or_create(&label).set(count);
        }
        self.counted = stats;
    }
}

/// The gossip as `ipamctl members` shows it, at `now` on the member's clock.
pub(super) fn snapshot(
    peer: &Peer,
    directory: &Directory,
    now: Duration,
    silenced: Option<String>,
) -> GossipMembers {
    let contact = peer.contact();
    let mut members: Vec<GossipMember> = peer
        .members()
        .map(|(id, state)| GossipMember {
            node: directory.node_at(id.addr).map(str::to_owned),
            address: id.addr.to_string(),
            generation: id.generation,
            state: state_label(state).to_owned(),
            last_heard_ms: contact
                .last_heard_from(id.addr)
                .map(|at| now.saturating_sub(at).as_millis() as u64),
        })
        .collect();
    members.sort_by(|a, b| (&a.node, &a.address).cmp(&(&b.node, &b.address)));
    let me = peer.id();
    GossipMembers {
        address: Some(me.addr.to_string()),
        generation: me.generation,
        silenced,
        members,
        refused: directory.refused_records(),
    }
}

fn state_label(state: State) -> &'static str {
    match state {
        State::Alive => "alive",
        State::Suspect => "suspect",
        State::Down => "down",
    }
}
