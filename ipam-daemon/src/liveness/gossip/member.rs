//! The running member: it drives the sans-io `ipam_gossip::Peer` from a UDP socket and a timer,
//! turns what it learns into `Membership`, has the fence judged after every step (`fencing`),
//! and keeps the metrics and the `ipamctl members` snapshot current (`report`).

use std::{
    collections::{BTreeSet, HashMap},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use ipam_api::types::GossipMembers;

use ipam_core::store::Watch;

use crate::{cluster::ClusterStore, metrics::gossip::ReasonLabel};
use ipam_gossip::{Event, Now, Peer, PeerId, Settings, State, View};
use tokio::{
    net::UdpSocket,
    sync::{oneshot, watch},
};

use super::{
    Inputs, Membership, Outputs,
    directory::Directory,
    events::log_event,
    fencing::FenceKeeper,
    keys::KeyFiles,
    report::{Report, snapshot},
    start::{Started, publish, start},
    takeover::TakeoverHold,
};

/// How often keys are re-read, a lone member asks to join again, and the snapshot and gauges
/// are refreshed.
const HOUSEKEEPING: Duration = Duration::from_secs(1);
/// Seeds asked per attempt to join: any one that answers is enough.
const SEEDS_PER_JOIN: usize = 8;
/// The largest datagram; foca's own are far smaller.
const MAX_PACKET: usize = 65_536;

/// Runs the gossip until `stop`, then leaves the cluster.
pub(super) async fn run(inputs: Inputs, outputs: Outputs, mut stop: oneshot::Receiver<()>) {
    let started = tokio::select! {
        started = start(&inputs, &outputs) => started,
        _ = &mut stop => return,
    };
    let mut member = Member::new(&inputs, outputs, started);
    member.join();
    member.run(stop).await;
}

struct Member {
    peer: Peer,
    socket: UdpSocket,
    origin: Instant,
    directory: Directory,
    records: Watch,
    keys: KeyFiles,
    fence: FenceKeeper,
    takeover: TakeoverHold,
    membership: watch::Sender<Membership>,
    /// What the membership was last derived from (`Peer::membership_digest`), and the fence's
    /// view derived with it: rebuilt when the members' states, the records or the takeover
    /// hold change, not after every packet (that rebuild, O(members) allocations 50 times a
    /// second, was the agent's CPU that grew with the cluster).
    derived_from: Option<u64>,
    view: View,
    members: Arc<Mutex<GossipMembers>>,
    report: Report,
    /// Where the next join starts in the list of seeds, and when each kind of trouble was last
    /// logged (so a flood of bad packets is one line a minute).
    next_seed: usize,
    logged: HashMap<&'static str, Instant>,
    /// This agent's public key as its record must publish it, and the write that puts it back
    /// when the record is seen without it.
    published_key: String,
    republishing: Option<tokio::task::JoinHandle<()>>,
    republish: Republish,
    store: ClusterStore,
    node: String,
    /// The records refused as last reported (contested addresses, unreadable keys).
    refused_reported: Vec<String>,
}

impl Member {
    fn new(inputs: &Inputs, outputs: Outputs, started: Started) -> Self {
        let Started {
            socket,
            address,
            keyring,
            keys,
            key,
            directory,
            records,
        } = started;
        let published_key = key.public().to_string();
        let timing = inputs.settings.timing();
        // A start later than the last one at this address wins over its memory in the cluster.
        let generation = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX));
        let mut peer = Peer::new(
            PeerId::new(address, generation),
            Settings::new(&timing, directory.size()),
            keyring,
            key,
        );
        peer.set_signers(directory.signers());
        let Outputs {
            membership,
            fence,
            members,
        } = outputs;
        Self {
            peer,
            socket,
            origin: Instant::now(),
            directory,
            records,
            keys,
            fence: FenceKeeper::new(&timing, fence),
            takeover: TakeoverHold::new(timing.takeover_hold),
            membership,
            derived_from: None,
            view: View {
                members: 1,
                alive: 1,
            },
            members,
            report: Report::new(inputs.metrics.clone()),
            next_seed: 0,
            logged: HashMap::new(),
            published_key,
            republishing: None,
            republish: Republish::default(),
            store: inputs.store.clone(),
            node: inputs.node.clone(),
            refused_reported: Vec::new(),
        }
    }

    async fn run(&mut self, mut stop: oneshot::Receiver<()>) {
        let mut buf = vec![0; MAX_PACKET];
        let mut housekeeping = crate::clock::ticker(HOUSEKEEPING);
        self.report_refused_records();
        self.derive(Rebuild::Always);
        let _ = self.judge_fence();
        // One timer, moved only when the next deadline does: a new timer each step re-arms
        // the runtime's clock and wakes the thread once more for nothing, dozens of times a
        // second at rest.
        let timer = tokio::time::sleep_until(self.next_wakeup().into());
        tokio::pin!(timer);
        loop {
            let wake = tokio::time::Instant::from_std(self.next_wakeup());
            if timer.deadline() != wake {
                timer.as_mut().reset(wake);
            }
            tokio::select! {
                _ = &mut stop => {
                    self.leave().await;
                    return;
                }
                received = self.socket.recv_from(&mut buf) => match received {
                    Ok((len, from)) => self.receive(&buf[..len], from),
                    Err(e) => self.log_trouble("recv", || format!("gossip socket: {e}")),
                },
                () = &mut timer => self.peer.advance(self.now()),
                event = self.records.next() => {
                    self.directory.apply(event);
                    self.peer.set_signers(self.directory.signers());
                    self.report_refused_records();
                    self.keep_key_published();
                    self.derive(Rebuild::Always);
                }
                _ = housekeeping.tick() => self.housekeeping(),
            }
            self.send().await;
            // What the gossip decided this step: deaths and returns, the take-overs they allow,
            // the fence.
            let reopened = tracing::debug_span!("gossip_decision").in_scope(|| {
                self.absorb_events();
                let released = self.takeover.release(self.origin.elapsed());
                self.derive(if released {
                    Rebuild::Always
                } else {
                    Rebuild::IfChanged
                });
                self.judge_fence()
            });
            if reopened {
                // At once, well within the hand-over's wait before this node answers anything.
                self.peer.greet_the_dead(self.now());
                self.send().await;
            }
        }
    }

    fn now(&self) -> Now {
        let unix = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        Now {
            monotonic: self.origin.elapsed(),
            unix_micros: u64::try_from(unix.as_micros()).unwrap_or(u64::MAX),
        }
    }

    /// The protocol's next timer, the fence's next judgement, or the end of a takeover hold,
    /// whichever comes first.
    fn next_wakeup(&self) -> Instant {
        let now = self.origin.elapsed();
        let next = [
            self.peer.next_deadline(),
            self.fence.next_judgement(self.peer.contact(), now),
            self.takeover.next_release(),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(now + HOUSEKEEPING);
        self.origin + next.max(now)
    }

    /// Asks the next few seeds to let this member in.
    fn join(&mut self) {
        let seeds = self.directory.seeds(self.peer.id().addr.ip());
        if seeds.is_empty() {
            return;
        }
        let start = self.next_seed % seeds.len();
        let chosen: Vec<SocketAddr> = seeds
            .iter()
            .cycle()
            .skip(start)
            .take(SEEDS_PER_JOIN.min(seeds.len()))
            .copied()
            .collect();
        self.next_seed = start + chosen.len();
        tracing::debug!(seeds = ?chosen, "asking to join the gossip");
        let now = self.now();
        self.peer.join(now, chosen);
    }

    fn receive(&mut self, packet: &[u8], from: SocketAddr) {
        let now = self.now();
        if let Err(reason) = self.peer.receive(now, packet) {
            // Forged, replayed, foreign: counted in the metrics; logged now and then.
            self.log_trouble(reason.label(), || {
                format!("dropped a gossip packet from {from}: {reason}")
            });
        }
    }

    async fn send(&mut self) {
        for out in self.peer.take_outgoing() {
            if let Err(e) = self.socket.send_to(&out.packet, out.to).await {
                self.log_trouble("send", || format!("cannot send gossip to {}: {e}", out.to));
            }
        }
    }

    /// Logs `what` at most once a minute per `kind`.
    fn log_trouble(&mut self, kind: &'static str, what: impl FnOnce() -> String) {
        let due = self
            .logged
            .get(kind)
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(60));
        if due {
            self.logged.insert(kind, Instant::now());
            tracing::warn!("{} (further ones within a minute are only counted)", what());
        }
    }

    /// Deaths and returns: logged, counted, and held for the takeover. What they change in
    /// the membership is derived after (`derive`).
    fn absorb_events(&mut self) {
        let now = self.origin.elapsed();
        for event in self.peer.take_events() {
            match &event {
                Event::Down(id) => self.takeover.declared_dead(id.addr, now),
                Event::Up(id) | Event::Renamed { after: id, .. } => self.takeover.back(id.addr),
                _ => {}
            }
            log_event(
                &event,
                &self.peer,
                &self.directory,
                now,
                self.report.metrics(),
            );
        }
    }

    /// Derives the fence's view and the membership again, when what they come from changed
    /// (or `Rebuild::Always`: the records or the takeover hold changed, which the digest does
    /// not cover).
    fn derive(&mut self, rebuild: Rebuild) {
        let digest = self.peer.membership_digest();
        if rebuild == Rebuild::IfChanged && self.derived_from == Some(digest) {
            return;
        }
        self.derived_from = Some(digest);
        self.view = self.directory.view(self.alive_members());
        self.publish_membership();
    }

    /// The members held alive and unsuspected.
    fn alive_members(&self) -> Vec<SocketAddr> {
        self.peer
            .members()
            .filter(|(_, state)| *state == State::Alive)
            .map(|(id, _)| id.addr)
            .collect()
    }

    /// Who is alive for ownership: the members held alive, and those declared dead within the
    /// takeover hold.
    fn publish_membership(&mut self) {
        let active = self.directory.nodes_of(self.peer.active().map(|p| p.addr));
        let live = self.directory.nodes_of(
            self.peer
                .active()
                .map(|p| p.addr)
                .chain(self.takeover.held()),
        );
        // Without the takeover hold: that delay is for answering IPs; evidence is gathered at
        // once.
        // The nodes with a member in `wanted` and none in a state of `better`.
        let in_state = |wanted: State, better: &BTreeSet<String>| {
            self.directory
                .nodes_of(
                    self.peer
                        .members()
                        .filter(|(_, state)| *state == wanted)
                        .map(|(id, _)| id.addr),
                )
                .into_iter()
                .filter(|node| !better.contains(node))
                .map(|node| {
                    let addresses = self.directory.addresses_of(&node);
                    (node, addresses)
                })
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let alive = self.directory.nodes_of(
            self.peer
                .members()
                .filter(|(_, state)| *state == State::Alive)
                .map(|(id, _)| id.addr),
        );
        // Active members are the alive and the suspected ones.
        let down = in_state(State::Down, &active);
        let suspect = in_state(State::Suspect, &alive);
        let fresh = Membership {
            live,
            down,
            suspect,
        };
        self.membership.send_if_modified(|m| {
            let changed = *m != fresh;
            if changed {
                *m = fresh;
            }
            changed
        });
    }

    /// Judges the fence; whether it reopened.
    fn judge_fence(&mut self) -> bool {
        self.fence.judge(
            self.peer.contact(),
            self.origin.elapsed(),
            self.view,
            self.directory.counted_out(),
            self.report.metrics(),
        )
    }

    fn housekeeping(&mut self) {
        match self.keys.reload() {
            Ok(Some(keyring)) => {
                self.peer.set_keyring(keyring);
                tracing::info!("gossip keys reloaded");
            }
            Ok(None) => {}
            Err(e) => self.log_trouble("keys", || format!("keeping the gossip keys in use: {e}")),
        }
        if self.peer.active().next().is_none() && self.directory.view([]).members > 1 {
            self.join();
        }
        self.keep_key_published();
        // Once a second whatever the digest says: a change it cannot see lasts a second at most.
        self.derive(Rebuild::Always);
        self.report.count(&self.peer);
        let view = snapshot(
            &self.peer,
            &self.directory,
            self.origin.elapsed(),
            self.fence.why_silent(),
        );
        *self.members.lock().expect("members lock") = view;
    }

    /// Puts this agent's key back into its record when the record is seen without it or with
    /// another key: a writer of the previous release rewrote the whole record without it, or an
    /// old copy of the record was restored (a backup, an etcd snapshot). The agent that holds
    /// the gossip socket owns the record's key. Writes back off (up to 30 s) and the backoff is
    /// reset only once the key stayed for a minute, so that two agents with one node's name (a
    /// mistake, said in the log) write at most once each per 30 s instead of at every watch
    /// event. Nothing is judged until the watch has shown this agent's own first write (its
    /// copy of the records is from before it), or for [`OWN_WRITE_SEEN_WITHIN`].
    fn keep_key_published(&mut self) {
        let now = Instant::now();
        let published = self.directory.own_key() == Some(self.published_key.as_str());
        if published {
            self.republish.seen_own = true;
            let since = *self.republish.stable_since.get_or_insert(now);
            if now.duration_since(since) >= KEY_STABLE_AFTER {
                self.republish.backoff.reset();
            }
            return;
        }
        self.republish.stable_since = None;
        let running = self.republishing.as_ref().is_some_and(|t| !t.is_finished());
        let settled = self.republish.seen_own
            || now.duration_since(self.republish.started) >= OWN_WRITE_SEEN_WITHIN;
        if !settled || running || now < self.republish.next_at {
            return;
        }
        self.republish.next_at = now + self.republish.backoff.next_delay();
        let (node, found) = (
            self.node.clone(),
            self.directory.own_key().map(str::to_owned),
        );
        self.log_trouble("own_key", || match found {
            None => format!(
                "node {node}'s record does not publish this agent's gossip key: writing it again"
            ),
            Some(other) => format!(
                "node {node}'s record publishes gossip key {other}, not this agent's: writing \
                 this agent's again (an old copy of the record restored, or another agent \
                 running with this node's name)"
            ),
        });
        let (store, node, key) = (
            self.store.clone(),
            self.node.clone(),
            self.published_key.clone(),
        );
        self.republishing = Some(tokio::spawn(async move {
            if let Err(why) = publish(&store, &node, &key).await {
                tracing::debug!("cannot publish the gossip key in node {node}'s record: {why}");
            }
        }));
    }

    /// Logs each record whose gossip is refused (once per change) and sets the gauge.
    fn report_refused_records(&mut self) {
        let now = self.directory.refused_records();
        let gauge = |reason: &str, count: usize| {
            let label = ReasonLabel {
                reason: reason.to_owned(),
            };
            self.report
                .metrics()
                .refused_records
                .get_or_create(&label)
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        };
        gauge("contested_address", self.directory.contested().len());
        gauge("unreadable_key", self.directory.unreadable_keys().len());
        for line in now.iter().filter(|l| !self.refused_reported.contains(l)) {
            tracing::warn!("{line}");
        }
        self.refused_reported = now;
    }

    /// A clean stop: the others declare this member dead at once.
    async fn leave(&mut self) {
        let now = self.now();
        self.peer.leave(now);
        self.send().await;
        tracing::info!("left the gossip");
    }
}

/// How long this agent's key must stay in its record before a later write-back starts its
/// backoff afresh.
const KEY_STABLE_AFTER: Duration = Duration::from_secs(60);

/// How long after its start the member waits for its watch to show its own first write of the
/// key before it judges the record.
const OWN_WRITE_SEEN_WITHIN: Duration = Duration::from_secs(5);

/// When the key may next be written back, and what was seen of it.
struct Republish {
    next_at: Instant,
    backoff: ipam_core::backoff::Backoff,
    /// Whether the watch has shown this agent's own key once (its first write), and when the
    /// member started (a watch that never shows it is not waited for past
    /// [`OWN_WRITE_SEEN_WITHIN`]).
    seen_own: bool,
    started: Instant,
    /// Since when the record has shown this agent's key without a break.
    stable_since: Option<Instant>,
}

impl Default for Republish {
    fn default() -> Self {
        Self {
            next_at: Instant::now(),
            backoff: ipam_core::backoff::Backoff::new(Duration::from_secs(30)),
            seen_own: false,
            started: Instant::now(),
            stable_since: None,
        }
    }
}

impl Drop for Member {
    /// A write-back still running must not outlive this agent's member (a restart in the same
    /// process would have it put the old key back).
    fn drop(&mut self) {
        if let Some(task) = &self.republishing {
            task.abort();
        }
    }
}

/// Whether `Member::derive` may skip the work when the members' states did not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rebuild {
    IfChanged,
    Always,
}
