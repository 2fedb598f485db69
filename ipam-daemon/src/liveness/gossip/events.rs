//! What the member learned, said in the log (and a death's detection time in the metrics).

use std::time::Duration;

use ipam_gossip::{Event, Peer, PeerId};

use super::directory::Directory;
use crate::metrics::gossip::GossipMetrics;

/// Logs `event`.
pub(super) fn log_event(
    event: &Event,
    peer: &Peer,
    directory: &Directory,
    now: Duration,
    metrics: &GossipMetrics,
) {
    let node = |id: &PeerId| {
        directory
            .node_at(id.addr)
            .unwrap_or("(no node record)")
            .to_owned()
    };
    match event {
        Event::Up(id) => tracing::info!(node = node(id), member = %id.addr, "member alive"),
        Event::Down(id) => {
            let silent_for = peer
                .contact()
                .last_heard_from(id.addr)
                .map(|at| now.saturating_sub(at));
            if let Some(d) = silent_for {
                metrics.detect_seconds.observe(d.as_secs_f64());
            }
            tracing::warn!(
                node = node(id),
                member = %id.addr,
                silent_ms = silent_for.map(|d| d.as_millis() as u64),
                "member declared dead: its service IPs move to the others"
            );
        }
        Event::Renamed { before, after } => tracing::info!(
            node = node(after),
            member = %after.addr,
            before = before.generation,
            after = after.generation,
            "member restarted"
        ),
        Event::Rejoined(id) => tracing::warn!(
            generation = id.generation,
            "this node was declared dead by the others while alive; rejoined"
        ),
        Event::Suspected(id) => {
            tracing::debug!(node = node(id), member = %id.addr, "probe unanswered: suspect");
        }
        Event::Connected => tracing::info!("joined the gossip"),
        Event::Alone => tracing::warn!("no other gossip member is alive"),
    }
}
