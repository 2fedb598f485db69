//! The gossip's metrics: members by state, suspicions, traffic, dropped packets by reason, the
//! fence, and how long a death took to be known here.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    pub direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

pub struct GossipMetrics {
    pub members: Family<StateLabel, Gauge>,
    pub suspicions: Counter,
    pub hellos: Counter,
    pub packets: Family<DirectionLabel, Counter>,
    pub bytes: Family<DirectionLabel, Counter>,
    pub dropped: Family<ReasonLabel, Counter>,
    pub fence_open: Gauge,
    pub fence_closings: Family<ReasonLabel, Counter>,
    pub detect_seconds: Histogram,
    /// Node records whose gossip identity is refused, by reason (`contested_address`,
    /// `unreadable_key`).
    pub refused_records: Family<ReasonLabel, Gauge>,
}

impl Default for GossipMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl GossipMetrics {
    pub fn new() -> Self {
        Self {
            detect_seconds: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.1, 1.5, 12),
            ),
            members: Family::default(),
            suspicions: Counter::default(),
            hellos: Counter::default(),
            packets: Family::default(),
            bytes: Family::default(),
            dropped: Family::default(),
            fence_open: Gauge::default(),
            fence_closings: Family::default(),
            refused_records: Family::default(),
        }
    }

    pub fn register(&self, registry: &mut Registry) {
        let gossip = registry.sub_registry_with_prefix("gossip");
        gossip.register(
            "members",
            "Members of the gossip as this node sees them, by state (alive, suspect, down)",
            self.members.clone(),
        );
        gossip.register(
            "suspicions",
            "Probes of this node that went unanswered, each making it suspect the probed member",
            self.suspicions.clone(),
        );
        gossip.register(
            "hellos",
            "Hellos this node said after hearing no member for a probe period and more, each \
             asking a live member for an answer before the fence's quiet rule would silence it",
            self.hellos.clone(),
        );
        gossip.register(
            "packets",
            "Gossip packets by direction (sent, received)",
            self.packets.clone(),
        );
        gossip.register_with_unit(
            "traffic",
            "Gossip bytes by direction (sent, received)",
            Unit::Bytes,
            self.bytes.clone(),
        );
        gossip.register(
            "dropped_packets",
            "Received gossip packets dropped, by reason (bad_tag, unknown_key, replayed, ...)",
            self.dropped.clone(),
        );
        gossip.register(
            "fence_open",
            "1 while this node may answer for its service IPs, 0 while its responders are silent",
            self.fence_open.clone(),
        );
        gossip.register(
            "fence_closings",
            "Times the fence silenced this node's responders, by reason",
            self.fence_closings.clone(),
        );
        gossip.register(
            "refused_records",
            "Node records whose gossip this node refuses, by reason: contested_address (an \
             address another record lists too; counted per address) or unreadable_key",
            self.refused_records.clone(),
        );
        gossip.register_with_unit(
            "detect_duration",
            "From the last packet heard from a member to it being declared dead here",
            Unit::Seconds,
            self.detect_seconds.clone(),
        );
    }
}
