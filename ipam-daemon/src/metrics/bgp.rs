//! The BGP announcer's metrics: each session's state and the routes sent over it.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabel {
    pub peer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerReasonLabel {
    pub peer: String,
    pub reason: String,
}

#[derive(Default)]
pub struct BgpMetrics {
    pub established: Family<PeerLabel, Gauge>,
    pub routes_advertised: Family<PeerLabel, Gauge>,
    pub session_down: Family<PeerReasonLabel, Gauge>,
    pub reconfigurations: Counter,
    pub speaker_restarts: Counter,
}

impl BgpMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let bgp = registry.sub_registry_with_prefix("bgp");
        bgp.register(
            "session_established",
            "1 while this node's BGP session with the peer is Established",
            self.established.clone(),
        );
        bgp.register(
            "routes_advertised",
            "Service IP routes this node sends the peer",
            self.routes_advertised.clone(),
        );
        bgp.register(
            "session_down",
            "1 for the reason this node's session with the peer is not up (ASNMismatch, AuthenticationFailed, ConnectionRefused, NotDirectlyConnected, Unreachable, NoAnswer, SessionLost)",
            self.session_down.clone(),
        );
        bgp.register(
            "reconfigurations",
            "Times BIRD was given a new configuration (sessions that did not change stay up)",
            self.reconfigurations.clone(),
        );
        bgp.register(
            "speaker_restarts",
            "Times BIRD had exited and was started again",
            self.speaker_restarts.clone(),
        );
    }
}
