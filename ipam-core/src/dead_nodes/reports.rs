//! An agent's reports of dead nodes (`spec.peersDown` in its record).
//!
//! Three rules keep a report from being wrong:
//! - only while the agent's fence is open, that is while it hears a majority: a node cut off
//!   with a minority sees the majority dead, and must not report it (the caller passes no
//!   membership while the fence is closed);
//! - only a node silent by a signal that a live host gives whatever its firewall does: each of
//!   its addresses is asked two ways at once, its kubelet's port and ARP/NDP on the segment
//!   (see [`Finding`]); a port that gives no answer, or an ICMP error, is no evidence alone;
//! - and the verdict fails closed: a node whose silence cannot be told from a firewall's (no
//!   address on a segment of this node) is not reported.
//!
//! The probe starts when the gossip first suspects a node, not when it declares it dead: a
//! finding no older than [`FRESH`] is the evidence when the verdict comes. A node held dead is
//! probed again every [`RECHECK`], so one that comes back before its agent is withdrawn.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    time::{Duration, Instant},
};

use crate::resources::PeerDown;

/// How often a node held dead is probed again.
pub const RECHECK: Duration = Duration::from_secs(5);
/// How long a probe's finding stands as evidence: a suspect probed this recently is not probed
/// again when the gossip declares it dead.
pub const FRESH: Duration = Duration::from_secs(1);

/// What the probe of one of a node's addresses found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The kubelet's port connected or refused, or the address answered ARP/NDP: the node's
    /// kernel runs.
    Answered(String),
    /// On a segment of this node, the address answered neither its kubelet's port nor
    /// ARP/NDP.
    Silent(String),
    /// The port gave no answer (or an ICMP error, which a firewall sends as readily as a
    /// router) and the segment could not be asked: no evidence either way.
    CannotTell(String),
}

/// What the probe of one node found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// An address on this node's segment answered neither its kubelet's port nor ARP/NDP, and
    /// no other address answered: the evidence.
    Silent(String),
    /// Something answered: the node runs.
    Answered(String),
    /// No address of the node is on a segment of this node, or none could be asked: its
    /// silence would prove nothing, so it is not reported.
    CannotTell(String),
    /// The node's record lists no address to probe.
    NoAddress,
}

/// The node's verdict from its addresses' findings: an answer from any address wins; else
/// silent only if every address was silent on a segment; one that could not be told makes
/// the whole node so (fail closed: its answer may have been the one missed).
pub fn verdict(findings: Vec<Finding>) -> Probe {
    if findings.is_empty() {
        return Probe::NoAddress;
    }
    let mut silences = Vec::new();
    let mut unknown = Vec::new();
    for finding in findings {
        match finding {
            Finding::Answered(answer) => return Probe::Answered(answer),
            Finding::Silent(evidence) => silences.push(evidence),
            Finding::CannotTell(why) => unknown.push(why),
        }
    }
    if unknown.is_empty() {
        Probe::Silent(silences.join("; "))
    } else {
        Probe::CannotTell(unknown.join("; "))
    }
}

/// The nodes the gossip holds dead or suspects, with their addresses between nodes (from
/// their records); both empty while this node's fence is closed.
#[derive(Debug, Clone, Copy)]
pub struct Suspicions<'a> {
    pub down: &'a BTreeMap<String, Vec<IpAddr>>,
    pub suspect: &'a BTreeMap<String, Vec<IpAddr>>,
}

/// What the probes found, and when: of the nodes the gossip suspects or holds dead.
#[derive(Debug, Default)]
pub struct Findings(BTreeMap<String, (Instant, Probe)>);

impl Findings {
    /// Forgets the nodes neither suspected nor held dead, and says which to probe at `now`:
    /// those held dead or suspected without a finding within [`FRESH`].
    pub fn to_probe(
        &mut self,
        gossip: Suspicions<'_>,
        now: Instant,
    ) -> BTreeMap<String, Vec<IpAddr>> {
        self.0
            .retain(|node, _| gossip.down.contains_key(node) || gossip.suspect.contains_key(node));
        gossip
            .down
            .iter()
            .chain(gossip.suspect)
            .filter(|(node, _)| {
                self.0
                    .get(*node)
                    .is_none_or(|(at, _)| now.saturating_duration_since(*at) >= FRESH)
            })
            .map(|(node, addresses)| (node.clone(), addresses.clone()))
            .collect()
    }

    /// Notes what the probes started at `at` found.
    pub fn note(&mut self, probed: BTreeMap<String, Probe>, at: Instant) {
        for (node, probe) in probed {
            self.0.insert(node, (at, probe));
        }
    }

    /// The findings of the nodes held dead.
    pub fn of(&self, down: &BTreeMap<String, Vec<IpAddr>>) -> BTreeMap<String, Probe> {
        down.keys()
            .filter_map(|node| Some((node.clone(), self.0.get(node)?.1.clone())))
            .collect()
    }

    /// When the nodes held dead must be probed again: [`RECHECK`] from `now` while any is.
    pub fn recheck(down: &BTreeMap<String, Vec<IpAddr>>) -> Option<Duration> {
        (!down.is_empty()).then_some(RECHECK)
    }
}

/// The reports: the silent nodes, with their evidence, in order.
pub fn reports_of(probes: &BTreeMap<String, Probe>) -> Vec<PeerDown> {
    probes
        .iter()
        .filter_map(|(node, probe)| match probe {
            Probe::Silent(evidence) => Some(PeerDown {
                node: node.clone(),
                evidence: evidence.clone(),
            }),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addresses(nodes: &[&str]) -> BTreeMap<String, Vec<IpAddr>> {
        nodes
            .iter()
            .map(|n| ((*n).to_owned(), vec!["10.0.0.9".parse().unwrap()]))
            .collect()
    }

    #[test]
    fn a_suspect_s_probe_stands_for_its_verdict_while_fresh() {
        let mut findings = Findings::default();
        let start = Instant::now();
        let none = BTreeMap::new();
        let suspect = addresses(&["b"]);
        let gossip = Suspicions {
            down: &none,
            suspect: &suspect,
        };
        assert_eq!(findings.to_probe(gossip, start).len(), 1);
        findings.note(
            [("b".to_owned(), Probe::Silent("silent".into()))].into(),
            start,
        );
        // Declared dead 400 ms later: the suspect's finding is the evidence, no new probe.
        let down = addresses(&["b"]);
        let gossip = Suspicions {
            down: &down,
            suspect: &none,
        };
        let later = start + Duration::from_millis(400);
        assert!(findings.to_probe(gossip, later).is_empty());
        assert_eq!(
            reports_of(&findings.of(&down)),
            [PeerDown {
                node: "b".into(),
                evidence: "silent".into()
            }]
        );
        // Past FRESH it is probed again.
        assert_eq!(findings.to_probe(gossip, start + FRESH).len(), 1);
        // Neither suspected nor dead: forgotten, and not reported.
        let gossip = Suspicions {
            down: &none,
            suspect: &none,
        };
        assert!(findings.to_probe(gossip, later).is_empty());
        assert!(findings.of(&down).is_empty());
    }

    /// Any address's answer makes the node run; silence on a segment at every address is
    /// evidence; with an address that cannot be told, the node is not reported.
    #[test]
    fn a_node_is_silent_only_on_a_segment_and_unknown_elsewhere() {
        let silent = || Finding::Silent("10.0.0.3: no answer, no ARP answer".into());
        let unknown = || Finding::CannotTell("10.9.0.3 is on no segment".into());
        let answered = || Finding::Answered("10.0.0.3 answers ARP".into());
        assert!(matches!(
            verdict(vec![unknown(), answered(), silent()]),
            Probe::Answered(_)
        ));
        assert!(
            matches!(verdict(vec![silent(), silent()]), Probe::Silent(e) if e.contains("no ARP"))
        );
        assert!(matches!(verdict(vec![unknown()]), Probe::CannotTell(_)));
        // An address that could not be told (its socket dropped frames, or no segment) may
        // have been the one to answer.
        assert!(matches!(
            verdict(vec![unknown(), silent()]),
            Probe::CannotTell(_)
        ));
        assert_eq!(verdict(vec![]), Probe::NoAddress);
        let reports = reports_of(&BTreeMap::from([(
            "c".to_owned(),
            verdict(vec![unknown(), unknown()]),
        )]));
        assert!(
            reports.is_empty(),
            "a node that cannot be told is reported: {reports:?}"
        );
    }

    #[test]
    fn only_silent_nodes_are_reported_in_order() {
        let probes: BTreeMap<String, Probe> = [
            ("c".to_owned(), Probe::Silent("c silent".into())),
            ("a".to_owned(), Probe::Silent("a silent".into())),
            ("b".to_owned(), Probe::Answered("refused".into())),
            ("d".to_owned(), Probe::CannotTell("routed".into())),
            ("e".to_owned(), Probe::NoAddress),
        ]
        .into();
        let nodes: Vec<String> = reports_of(&probes).into_iter().map(|r| r.node).collect();
        assert_eq!(nodes, ["a", "c"]);
    }
}
