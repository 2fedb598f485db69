//! What the BGP announcer reports of this node's sessions: the metrics, a log line when a
//! session comes up or goes down (with why), this node's entry in each BGPPeer's status and the
//! peer's `Established` condition over all its nodes.

use std::{collections::BTreeMap, sync::Arc};

use ipam_core::{
    lb::bgp::{BgpPeer, BgpSessionStatus, NodeAdvertisements},
    meta::Condition,
    store::{StoreError, TypedStore},
};

use super::{
    bird_config::protocol_name,
    sessions::{self, DownReason, Session},
};
use crate::{
    cluster::ClusterStore,
    metrics::{
        Metrics,
        bgp::{PeerLabel, PeerReasonLabel},
    },
};

/// Reports the sessions: metrics, log lines on changes, and this node's entry in each peer's
/// status.
pub(super) struct Reports {
    node: String,
    store: ClusterStore,
    metrics: Arc<Metrics>,
    last: BTreeMap<String, BgpSessionStatus>,
    /// Why each session that is down is down, as last decided.
    down: BTreeMap<String, (DownReason, String)>,
    md5_drops: u64,
}

impl Reports {
    pub(super) fn new(node: String, store: ClusterStore, metrics: Arc<Metrics>) -> Self {
        Self {
            node,
            store,
            metrics,
            last: BTreeMap::new(),
            down: BTreeMap::new(),
            md5_drops: sessions::md5_drops(),
        }
    }

    pub(super) async fn publish(
        &mut self,
        wanted: &NodeAdvertisements,
        held: &BTreeMap<String, String>,
        sessions: &BTreeMap<String, Session>,
        stored: &BTreeMap<String, BgpSessionStatus>,
    ) {
        let drops = sessions::md5_drops();
        let auth_failures = drops > self.md5_drops;
        self.md5_drops = drops;
        let mut now = BTreeMap::new();
        let mut down_now = BTreeMap::new();
        let reported = wanted
            .peers
            .iter()
            .map(|(name, spec)| (name, Some(spec)))
            .chain(held.keys().map(|name| (name, None)));
        for (name, spec) in reported {
            let session = sessions
                .get(&protocol_name(name))
                .cloned()
                .unwrap_or_else(|| Session {
                    state: "Idle".into(),
                    ..Session::default()
                });
            let down = match spec {
                // Held back: no session is opened without its password.
                None => Some((DownReason::PasswordUnavailable, held[name].clone())),
                Some(spec) => self.why_down(name, &session, spec.password.is_some(), auth_failures),
            };
            self.count(name, &session, down.as_ref());
            let status = BgpSessionStatus {
                node: self.node.clone(),
                state: session.state.clone(),
                routes_advertised: session.routes_exported,
                reason: down
                    .as_ref()
                    .map(|(reason, message)| format!("{}: {message}", reason.name()))
                    .unwrap_or_default(),
            };
            if let Some(down) = down {
                down_now.insert(name.clone(), down);
            }
            now.insert(name.clone(), status);
        }
        self.log_changes(&now);
        self.write_changes(&now, stored).await;
        self.last = now;
        self.down = down_now;
    }

    /// Why a session that should be up is not; `None` when it is established. A session
    /// still being opened keeps an authentication failure as its reason: the kernel's counters
    /// show one per attempt, not on every look.
    fn why_down(
        &self,
        peer: &str,
        session: &Session,
        has_password: bool,
        auth_failures: bool,
    ) -> Option<(DownReason, String)> {
        if session.is_established() {
            return None;
        }
        let down = sessions::why_down(session, has_password, auth_failures);
        match self.down.get(peer) {
            Some(before)
                if down.0 == DownReason::NoAnswer
                    && before.0 == DownReason::AuthenticationFailed =>
            {
                Some(before.clone())
            }
            _ => Some(down),
        }
    }

    /// The peer's session in the metrics: established, routes, and the reason it is down.
    fn count(&self, peer: &str, session: &Session, down: Option<&(DownReason, String)>) {
        let label = PeerLabel {
            peer: peer.to_owned(),
        };
        let m = &self.metrics.bgp;
        m.established
            .get_or_create(&label)
            .set(i64::from(session.is_established()));
        m.routes_advertised
            .get_or_create(&label)
            .set(i64::from(session.routes_exported));
        for reason in DownReason::ALL {
            m.session_down
                .get_or_create(&PeerReasonLabel {
                    peer: peer.to_owned(),
                    reason: reason.name().to_owned(),
                })
                .set(i64::from(down.is_some_and(|d| d.0 == reason)));
        }
    }

    /// A log line for each session whose state or reason changed since the last look.
    fn log_changes(&self, now: &BTreeMap<String, BgpSessionStatus>) {
        for (name, status) in now {
            let before = self.last.get(name);
            if before.map(|b| (&b.state, &b.reason)) == Some((&status.state, &status.reason)) {
                continue;
            }
            if status.state == "Established" {
                tracing::info!(
                    peer = name.as_str(),
                    routes = status.routes_advertised,
                    "BGP session established"
                );
            } else {
                tracing::warn!(
                    peer = name.as_str(),
                    state = status.state.as_str(),
                    "BGP session not established: {}",
                    status.reason
                );
            }
        }
    }

    /// This node's entry in each peer's status, written where the stored one (`stored`, by
    /// peer) differs.
    async fn write_changes(
        &self,
        now: &BTreeMap<String, BgpSessionStatus>,
        stored: &BTreeMap<String, BgpSessionStatus>,
    ) {
        for (name, status) in now {
            if stored.get(name) != Some(status)
                && let Err(e) = self.write_status(name, status).await
            {
                tracing::warn!(
                    peer = name.as_str(),
                    "cannot write the BGPPeer's status: {e}"
                );
            }
        }
    }

    /// Puts this node's session into the peer's status, and the peer's condition over all its
    /// nodes, retrying on conflicting writes of other nodes.
    async fn write_status(&self, peer: &str, mine: &BgpSessionStatus) -> Result<(), StoreError> {
        for _ in 0..5 {
            let Some(mut current) = self.store.get_typed::<BgpPeer>(peer).await? else {
                return Ok(());
            };
            let status = &mut current.value.status;
            put_own_entry(&mut status.nodes, mine);
            status.conditions = vec![established_condition(&status.nodes)];
            match self
                .store
                .update_status_typed(peer, &current.value, &current.revision)
                .await
            {
                Err(StoreError::Conflict { .. }) => continue,
                other => return other.map(|_| ()),
            }
        }
        Ok(())
    }
}

/// Puts `mine` in place of this node's entry, or where its name sorts among the others, and
/// leaves the other nodes' entries as they are, in their order: the admission policy
/// (`ipam-agent-own-bgp-session`) refuses a write that changes another node's entry, and
/// compares them in order.
fn put_own_entry(nodes: &mut Vec<BgpSessionStatus>, mine: &BgpSessionStatus) {
    if let Some(own) = nodes.iter_mut().find(|n| n.node == mine.node) {
        own.clone_from(mine);
        return;
    }
    let at = nodes.partition_point(|n| n.node < mine.node);
    nodes.insert(at, mine.clone());
}

/// `Established`: true while every node's session with the peer is up; else which are not,
/// and why.
fn established_condition(nodes: &[BgpSessionStatus]) -> Condition {
    let down: Vec<String> = nodes
        .iter()
        .filter(|n| n.state != "Established")
        .map(|n| format!("{} ({}): {}", n.node, n.state, n.reason))
        .collect();
    if down.is_empty() {
        Condition::new(
            "Established",
            true,
            format!("{} node(s) have their session up", nodes.len()),
        )
    } else {
        Condition::new(
            "Established",
            false,
            format!("sessions not up: {}", down.join("; ")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(node: &str, state: &str) -> BgpSessionStatus {
        BgpSessionStatus {
            node: node.into(),
            state: state.into(),
            routes_advertised: 0,
            reason: String::new(),
        }
    }

    /// This node's entry is replaced where it is, or put where its name sorts; the others stay
    /// as they are and where they are, even out of order (an admin's edit), which the
    /// admission policy compares in order (hostile review: re-sorting the whole list made
    /// every agent's write refused after one out-of-order edit).
    #[test]
    fn only_this_node_s_entry_moves() {
        let names = |nodes: &[BgpSessionStatus]| -> Vec<String> {
            nodes
                .iter()
                .map(|n| format!("{} {}", n.node, n.state))
                .collect()
        };
        let mut nodes = vec![entry("c", "Active"), entry("a", "Active")];
        put_own_entry(&mut nodes, &entry("b", "Established"));
        assert_eq!(
            names(&nodes)
                .into_iter()
                .filter(|n| !n.starts_with('b'))
                .collect::<Vec<_>>(),
            ["c Active", "a Active"]
        );
        put_own_entry(&mut nodes, &entry("b", "Idle"));
        assert_eq!(nodes.len(), 3);
        assert!(names(&nodes).contains(&"b Idle".to_owned()));
        let mut sorted = vec![entry("a", "Active"), entry("c", "Active")];
        put_own_entry(&mut sorted, &entry("b", "Established"));
        assert_eq!(names(&sorted), ["a Active", "b Established", "c Active"]);
    }
}
