//! The agent's half of taking a dead node's pods out of their Services' endpoints: the nodes
//! the gossip declared dead, checked on a second, independent signal (the node's own kernel,
//! asked on its segment), published in this node's record (`spec.peersDown`), where the
//! operator counts the reports (`cluster::dead_nodes`), and handed to `dead_flows`, which
//! deletes this node's unanswered connections to their pods.
//!
//! What makes a report (the fence, a second signal a live host gives whatever its firewall
//! does, failing closed, the suspect's fresh finding, the recheck) is decided by
//! `ipam_core::dead_nodes::reports`, which `ipam-sim` runs too; this module does the probing:
//! each address is asked two ways at once, a connection to the kubelet's port (accepted or
//! refused, it is an answer: the node's kernel runs), and ARP requests (IPv6: neighbour
//! solicitations) on the segment the address is on (`net::neighbour`). A port that gives no
//! answer, or an ICMP error (a host whose firewall rejects 10250 with "administratively
//! prohibited" sends one, and so does a router), is no evidence alone: Kubernetes documents
//! 10250 as reachable from the control plane only. Each probe costs the kubelet a line in its
//! log (a TLS handshake cut short), hence not more often than the recheck.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use ipam_config::DeadNodeSettings;
use ipam_core::{
    dead_nodes::reports::{Finding, Findings, Probe, Suspicions, reports_of, verdict},
    resources::{NodeIpam, PeerDown},
    store::{StoreError, TypedStore as _},
};
use tokio::sync::watch;

use super::{fence::FenceState, gossip::Membership};
use crate::{
    cluster::{ClusterStore, RecordNotWritten},
    metrics::Metrics,
    net::neighbour::Solicited,
    runtime::{Controller, Next, Woken},
};

pub struct Inputs {
    pub store: ClusterStore,
    pub node: String,
    pub settings: DeadNodeSettings,
    pub membership: watch::Receiver<Membership>,
    pub fence: watch::Receiver<FenceState>,
    /// The nodes this node reports, with their addresses: where `dead_flows` sweeps.
    pub reported: watch::Sender<super::dead_flows::Reported>,
}

/// Keeps this node's reports for the life of the daemon.
pub async fn run(inputs: Inputs, metrics: Arc<Metrics>) {
    let reports = DeadPeers {
        inputs,
        published: None,
        verdicts: BTreeMap::new(),
        findings: Findings::default(),
    };
    crate::runtime::run(reports, metrics).await;
}

/// The reports' keeper, as a controller.
struct DeadPeers {
    inputs: Inputs,
    /// The reports as last written to the record.
    published: Option<Vec<PeerDown>>,
    /// Each node's verdict as last logged.
    verdicts: BTreeMap<String, Probe>,
    findings: Findings,
}

impl Controller for DeadPeers {
    const NAME: &'static str = "dead_peers";
    type Error = RecordNotWritten;
    /// The reports take a dead node's pods out of their Services: retried sooner than most.
    const RETRY_CAP: Duration = Duration::from_secs(5);

    async fn pass(&mut self) -> Result<Next, RecordNotWritten> {
        let inputs = &mut self.inputs;
        let open = *inputs.fence.borrow_and_update() == FenceState::Open;
        let (down, suspect) = if open {
            let membership = inputs.membership.borrow_and_update();
            (membership.down.clone(), membership.suspect.clone())
        } else {
            (BTreeMap::new(), BTreeMap::new())
        };
        let now = tokio::time::Instant::now().into_std();
        let gossip = Suspicions {
            down: &down,
            suspect: &suspect,
        };
        let stale = self.findings.to_probe(gossip, now);
        let probed = probe_all(&stale, &inputs.settings).await;
        self.findings.note(probed, now);
        let probes = self.findings.of(&down);
        log_changes(&inputs.node, &mut self.verdicts, &probes);
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
        let recheck = Findings::recheck(&down).map_or(Next::OnChange, Next::Within);
        if self.published.as_ref() == Some(&reports) {
            return Ok(recheck);
        }
        match publish(&inputs.store, &inputs.node, &reports).await {
            Ok(Published::Written) => {
                self.published = Some(reports);
                Ok(recheck)
            }
            // Another writer of the record was first: read it again at once.
            Ok(Published::Changed) => Ok(Next::Now),
            // The controller that keeps the record has not made it yet.
            Ok(Published::NoRecord) => Ok(Next::Waiting),
            Err(source) => Err(RecordNotWritten {
                what: "the nodes it holds dead",
                node: inputs.node.clone(),
                store: inputs.store.describe(),
                source,
            }),
        }
    }

    async fn changed(&mut self) -> Woken {
        let inputs = &mut self.inputs;
        let alive = tokio::select! {
            changed = inputs.membership.changed() => changed.is_ok(),
            changed = inputs.fence.changed() => changed.is_ok(),
        };
        if alive { Woken::Changed } else { Woken::Closed }
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
}
