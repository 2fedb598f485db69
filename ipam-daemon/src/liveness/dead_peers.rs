//! The agent's half of taking a dead node's pods out of their Services' endpoints: the nodes
//! the gossip declared dead, checked on a second, independent signal (the node's own kernel,
//! asked on its segment), published in this node's record (`spec.peersDown`), where the
//! operator counts the reports (`cluster::dead_nodes`), and handed to `dead_flows`, which
//! deletes this node's unanswered connections to their pods.
//!
//! Three rules keep a report from being wrong:
//! - only while this node's fence is open, that is while it hears a majority: a node cut off
//!   with a minority sees the majority dead, and must not report it;
//! - only a node silent by a signal that a live host gives whatever its firewall does. Each
//!   address is probed two ways at once: a connection to the kubelet's port (accepted or
//!   refused, it is an answer: the node's kernel runs), and ARP requests (IPv6: neighbour
//!   solicitations) on the segment the address is on (`net::neighbour`), which a running
//!   kernel answers whatever its packet filter does to TCP. A port that gives no answer, or
//!   an ICMP error (a host whose firewall rejects 10250 with "administratively prohibited"
//!   sends one, and so does a router), is no evidence alone: a host that drops or rejects
//!   the kubelet's port is often a live one, since Kubernetes documents 10250 as reachable
//!   from the control plane only. A node is silent only when an address on one of this
//!   node's segments answered neither.
//! - and the probe fails closed: a node none of whose addresses is on a segment of this node
//!   (reached through a router) cannot be told apart from a firewalled one, and is not
//!   reported; Kubernetes' own grace period applies to it.
//!
//! The probe starts when the gossip first suspects a node, not when it declares it dead: a
//! silent answer no older than `FRESH` is the evidence when the verdict comes, so the report
//! follows the verdict at once instead of a probe timeout later. A suspect that answers, or
//! is cleared, is not reported.
//!
//! While any node is held dead it is probed again every `RECHECK`: a node that comes back
//! before its agent does is withdrawn, and one whose kubelet answered the first probe but
//! died after is reported. Each probe costs the kubelet a line in its log (a TLS handshake
//! cut short), hence not more often.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use ipam_config::DeadNodeSettings;
use ipam_core::{
    backoff::Backoff,
    resources::{NodeIpam, PeerDown},
    store::{StoreError, TypedStore as _},
};
use tokio::sync::watch;

use super::{fence::FenceState, gossip::Membership};
use crate::{cluster::ClusterStore, net::neighbour::Solicited};

/// How often a node held dead is probed again.
const RECHECK: Duration = Duration::from_secs(5);
/// How long a probe's finding stands as evidence: a suspect probed this recently is not probed
/// again when the gossip declares it dead.
const FRESH: Duration = Duration::from_secs(1);
/// Longest wait between two writes the store refused.
const RETRY_CAP: Duration = Duration::from_secs(5);

pub struct Inputs {
    pub store: ClusterStore,
    pub node: String,
    pub settings: DeadNodeSettings,
    pub membership: watch::Receiver<Membership>,
    pub fence: watch::Receiver<FenceState>,
    /// The nodes this node reports, with their addresses: where `dead_flows` sweeps.
    pub reported: watch::Sender<super::dead_flows::Reported>,
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

/// Keeps this node's reports for the life of the daemon.
pub async fn run(mut inputs: Inputs) {
    let mut published: Option<Vec<PeerDown>> = None;
    let mut verdicts: BTreeMap<String, Probe> = BTreeMap::new();
    let mut findings = Findings::default();
    let mut backoff = Backoff::new(RETRY_CAP);
    loop {
        let open = *inputs.fence.borrow_and_update() == FenceState::Open;
        let (down, suspect) = if open {
            let membership = inputs.membership.borrow_and_update();
            (membership.down.clone(), membership.suspect.clone())
        } else {
            (BTreeMap::new(), BTreeMap::new())
        };
        let now = tokio::time::Instant::now();
        findings.forget_all_but(&down, &suspect);
        let stale = findings.to_probe(&down, &suspect, now);
        let probed = probe_all(&stale, &inputs.settings).await;
        findings.note(probed, now);
        let probes = findings.of(&down);
        log_changes(&inputs.node, &mut verdicts, &probes);
        let reports = reports_of(&probes);
        let reported: super::dead_flows::Reported = reports
            .iter()
            .map(|r| {
                (
                    r.node.clone(),
                    down.get(&r.node).cloned().unwrap_or_default(),
                )
            })
            .collect();
        inputs.reported.send_if_modified(|held| {
            let changed = *held != reported;
            *held = reported;
            changed
        });
        let mut wait = if down.is_empty() { None } else { Some(RECHECK) };
        if published.as_ref() != Some(&reports) {
            match publish(&inputs.store, &inputs.node, &reports).await {
                Ok(Published::Written) => {
                    published = Some(reports);
                    backoff.reset();
                }
                // Another writer of the record was first: read it again at once.
                Ok(Published::Changed) => wait = Some(Duration::ZERO),
                // The controller that keeps the record has not made it yet.
                Ok(Published::NoRecord) => wait = Some(backoff.next_delay()),
                Err(e) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(
                        node = inputs.node.as_str(),
                        retry_in_ms = delay.as_millis() as u64,
                        "cannot write the nodes this node holds dead to its record in {}, \
                         retrying: {e}",
                        inputs.store.describe()
                    );
                    wait = Some(delay);
                }
            }
        }
        let recheck = async {
            match wait {
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = recheck => {}
            changed = inputs.membership.changed() => if changed.is_err() { return },
            changed = inputs.fence.changed() => if changed.is_err() { return },
        }
    }
}

/// What the probes found, and when: of the nodes the gossip suspects or holds dead.
#[derive(Default)]
struct Findings(BTreeMap<String, (tokio::time::Instant, Probe)>);

impl Findings {
    /// Forgets the nodes neither suspected nor held dead.
    fn forget_all_but(
        &mut self,
        down: &BTreeMap<String, Vec<IpAddr>>,
        suspect: &BTreeMap<String, Vec<IpAddr>>,
    ) {
        self.0
            .retain(|node, _| down.contains_key(node) || suspect.contains_key(node));
    }

    /// The nodes to probe now: those held dead or suspected without a finding within `FRESH`.
    fn to_probe(
        &self,
        down: &BTreeMap<String, Vec<IpAddr>>,
        suspect: &BTreeMap<String, Vec<IpAddr>>,
        now: tokio::time::Instant,
    ) -> BTreeMap<String, Vec<IpAddr>> {
        down.iter()
            .chain(suspect)
            .filter(|(node, _)| {
                self.0
                    .get(*node)
                    .is_none_or(|(at, _)| now.duration_since(*at) >= FRESH)
            })
            .map(|(node, addresses)| (node.clone(), addresses.clone()))
            .collect()
    }

    /// Notes what the probes started at `at` found.
    fn note(&mut self, probed: BTreeMap<String, Probe>, at: tokio::time::Instant) {
        for (node, probe) in probed {
            self.0.insert(node, (at, probe));
        }
    }

    /// The findings of the nodes held dead.
    fn of(&self, down: &BTreeMap<String, Vec<IpAddr>>) -> BTreeMap<String, Probe> {
        down.keys()
            .filter_map(|node| Some((node.clone(), self.0.get(node)?.1.clone())))
            .collect()
    }
}

/// Probes every node in `down` at once.
async fn probe_all(
    down: &BTreeMap<String, Vec<IpAddr>>,
    settings: &DeadNodeSettings,
) -> BTreeMap<String, Probe> {
    let probes = down.iter().map(|(node, addresses)| async move {
        let probe = probe(addresses, settings.kubelet_port, settings.probe_timeout()).await;
        (node.clone(), probe)
    });
    futures_util::future::join_all(probes)
        .await
        .into_iter()
        .collect()
}

/// Connection attempts on each address, and neighbour requests, started evenly within the
/// probe timeout. A lost SYN or SYN-ACK would otherwise make a live node silent (TCP resends a
/// SYN only after a second): on a link losing a fifth of its packets each way one attempt goes
/// unanswered about one time in three, three attempts about one time in twenty.
const ATTEMPTS_PER_ADDRESS: u32 = 3;

/// Probes each of `addresses` at once, its kubelet's `port` and its segment; silent only if
/// no address answered and one on this node's segment answered neither within `timeout`. A
/// dead node costs the full timeout and no more; a live one answers its neighbour requests
/// within a round trip.
pub async fn probe(addresses: &[IpAddr], port: u16, timeout: Duration) -> Probe {
    if addresses.is_empty() {
        return Probe::NoAddress;
    }
    let findings = futures_util::future::join_all(
        addresses.iter().map(|ip| probe_address(*ip, port, timeout)),
    )
    .await;
    verdict(findings)
}

/// What one address said.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Finding {
    Answered(String),
    Silent(String),
    CannotTell(String),
}

/// The node's verdict from its addresses' findings: an answer from any address wins; else
/// silent only if every address was silent on a segment; one that could not be told makes
/// the whole node so (fail closed: its answer may have been the one missed).
fn verdict(findings: Vec<Finding>) -> Probe {
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

async fn probe_address(ip: IpAddr, port: u16, timeout: Duration) -> Finding {
    let neighbour = async move {
        tokio::task::spawn_blocking(move || {
            crate::net::neighbour::solicit(ip, ATTEMPTS_PER_ADDRESS, timeout)
        })
        .await
        .unwrap_or_else(|e| {
            Solicited::CannotTell(format!("the neighbour probe of {ip} failed: {e}"))
        })
    };
    let (kubelet, neighbour) = tokio::join!(kubelet_port(ip, port, timeout), neighbour);
    let silence = match kubelet {
        Err(answer) => return Finding::Answered(answer),
        Ok(silence) => silence,
    };
    match neighbour {
        Solicited::Answered { interface, mac } => Finding::Answered(format!(
            "{ip} answers ARP/NDP on {interface} from {} (its kubelet's port is filtered: \
             {silence})",
            ipam_api::types::Mac(mac)
        )),
        Solicited::Unanswered {
            interface,
            attempts,
            waited,
        } => Finding::Silent(format!(
            "{silence}, and {ip} answered none of {attempts} ARP/NDP requests on {interface} \
             within {} ms",
            waited.as_millis()
        )),
        Solicited::CannotTell(why) => Finding::CannotTell(format!("{silence}, but {why}")),
    }
}

/// Connects to `port` on `ip`, `ATTEMPTS_PER_ADDRESS` times, staggered: `Err` with what
/// answered, `Ok` with the silence (no answer within `timeout` of the first, or an ICMP error,
/// which a firewall or a router sends as readily as a dead host's neighbour).
async fn kubelet_port(ip: IpAddr, port: u16, timeout: Duration) -> Result<String, String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let target = SocketAddr::new(ip, port);
    let attempts = (0..ATTEMPTS_PER_ADDRESS).map(|k| async move {
        tokio::time::sleep(timeout * k / ATTEMPTS_PER_ADDRESS).await;
        attempt(target, deadline).await
    });
    let results = futures_util::future::join_all(attempts).await;
    match results.iter().find_map(|r| r.clone().err()) {
        Some(answer) => Err(answer),
        // Every attempt said the same or timed out: the first says it for all.
        None => Ok(format!(
            "{} ({ATTEMPTS_PER_ADDRESS} attempts)",
            results[0].clone().unwrap_or_default()
        )),
    }
}

/// One connection to `target` before `deadline`: `Err` with what answered, `Ok` with the
/// silence.
async fn attempt(target: SocketAddr, deadline: tokio::time::Instant) -> Result<String, String> {
    let started = tokio::time::Instant::now();
    match tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect(target)).await {
        Ok(Ok(_)) => Err(format!("kubelet {target}: connected")),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Err(format!(
            "kubelet {target}: refused (the node's kernel answers)"
        )),
        // Unreachable: this node's neighbour request went unanswered, or an ICMP error came
        // back (from a firewall of the node itself as readily as from a router): the
        // neighbour probe tells which. Any other error is not evidence of anything.
        Ok(Err(e)) if is_unreachable(&e) => Ok(format!("kubelet {target}: unreachable ({e})")),
        Ok(Err(e)) => Err(format!("kubelet {target}: {e}")),
        Err(_) => Ok(format!(
            "kubelet {target}: no answer within {} ms",
            deadline.duration_since(started).as_millis()
        )),
    }
}

fn is_unreachable(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH)
    )
}

/// The reports: the silent nodes, with their evidence, in order.
fn reports_of(probes: &BTreeMap<String, Probe>) -> Vec<PeerDown> {
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

/// Says what changed in the verdicts: each node held dead by the gossip once, with what its
/// kubelet's port said, and once more when it is no longer held dead.
fn log_changes(me: &str, verdicts: &mut BTreeMap<String, Probe>, probes: &BTreeMap<String, Probe>) {
    for (node, probe) in probes {
        let same_kind = verdicts
            .get(node)
            .is_some_and(|v| std::mem::discriminant(v) == std::mem::discriminant(probe));
        if same_kind {
            continue;
        }
        match probe {
            Probe::Silent(evidence) => tracing::warn!(
                node = me,
                peer = node.as_str(),
                "reporting {node} dead: the gossip declared it dead and {evidence}"
            ),
            Probe::Answered(answer) => tracing::info!(
                node = me,
                peer = node.as_str(),
                "not reporting {node} dead: the gossip declared it dead but {answer}; its \
                 agent may be down while the node runs"
            ),
            Probe::CannotTell(why) => tracing::warn!(
                node = me,
                peer = node.as_str(),
                "not reporting {node} dead: the gossip declared it dead, but whether it runs \
                 cannot be told from here ({why}); Kubernetes' own grace period applies to \
                 its pods"
            ),
            Probe::NoAddress => tracing::warn!(
                node = me,
                peer = node.as_str(),
                "not reporting {node} dead: its record lists no address to probe its kubelet at"
            ),
        }
    }
    let gone: BTreeSet<String> = verdicts
        .keys()
        .filter(|n| !probes.contains_key(*n))
        .cloned()
        .collect();
    for node in gone {
        if matches!(verdicts.remove(&node), Some(Probe::Silent(_))) {
            tracing::info!(
                node = me,
                peer = node.as_str(),
                "no longer reporting {node} dead: the gossip holds it alive again, or this node \
                 no longer hears a majority"
            );
        }
    }
    verdicts.extend(probes.clone());
}

/// What a write of the reports came to.
enum Published {
    Written,
    /// The record changed between the read and the write.
    Changed,
    /// The record does not exist yet (the controller that keeps it creates it).
    NoRecord,
}

/// Writes `reports` into this node's record, the rest of it as read.
async fn publish(
    store: &ClusterStore,
    node: &str,
    reports: &[PeerDown],
) -> Result<Published, StoreError> {
    let Some(record) = store.get_typed::<NodeIpam>(node).await? else {
        return Ok(Published::NoRecord);
    };
    if record.value.spec.peers_down == reports {
        return Ok(Published::Written);
    }
    let mut updated = record.value;
    updated.spec.peers_down = reports.to_vec();
    let written = store
        .update_unless_changed(node, &updated, &record.revision)
        .await?;
    Ok(if written {
        Published::Written
    } else {
        Published::Changed
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_listening_or_refusing_port_is_an_answer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = listener.local_addr().unwrap().port();
        let loopback = ["127.0.0.1".parse().unwrap()];
        let timeout = Duration::from_millis(300);
        assert!(matches!(
            probe(&loopback, open, timeout).await,
            Probe::Answered(a) if a.contains("connected")
        ));
        drop(listener);
        assert!(matches!(
            probe(&loopback, open, timeout).await,
            Probe::Answered(a) if a.contains("refused")
        ));
        assert_eq!(probe(&[], open, timeout).await, Probe::NoAddress);
    }

    /// A suspect probed at once is not probed again when it is declared dead within `FRESH`,
    /// and its finding is the verdict's evidence; later, or once it is neither suspected nor
    /// dead, it is probed anew.
    #[test]
    fn a_suspect_s_probe_stands_for_its_verdict_while_fresh() {
        let addresses = vec!["10.0.0.3".parse().unwrap()];
        let one = |node: &str| BTreeMap::from([(node.to_owned(), addresses.clone())]);
        let none = BTreeMap::new();
        let start = tokio::time::Instant::now();
        let mut findings = Findings::default();
        assert_eq!(findings.to_probe(&none, &one("c"), start).len(), 1);
        let silent = Probe::Silent("kubelet 10.0.0.3:10250: no answer".into());
        findings.note(BTreeMap::from([("c".to_owned(), silent.clone())]), start);

        let declared = start + FRESH / 2;
        findings.forget_all_but(&one("c"), &none);
        assert!(findings.to_probe(&one("c"), &none, declared).is_empty());
        assert_eq!(
            findings.of(&one("c")),
            BTreeMap::from([("c".to_owned(), silent)])
        );

        assert_eq!(findings.to_probe(&one("c"), &none, start + FRESH).len(), 1);
        findings.forget_all_but(&none, &none);
        assert!(findings.of(&one("c")).is_empty());
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
        let probes = BTreeMap::from([
            ("b".to_owned(), Probe::Silent("kubelet b: no answer".into())),
            (
                "a".to_owned(),
                Probe::Silent("kubelet a: unreachable".into()),
            ),
            ("c".to_owned(), Probe::Answered("kubelet c: refused".into())),
            ("d".to_owned(), Probe::NoAddress),
        ]);
        let reports = reports_of(&probes);
        let nodes: Vec<&str> = reports.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(nodes, ["a", "b"]);
        assert_eq!(reports[0].evidence, "kubelet a: unreachable");
    }
}
