//! The running member: it drives the sans-io `ipam_gossip::Peer` from a UDP socket and a timer,
//! turns what it learns into `Membership`, judges the fence after every step, and keeps the
//! metrics and the `ipamctl members` snapshot current.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use ipam_api::types::{GossipMember, GossipMembers};
use ipam_core::store::Watch;
use ipam_gossip::{Dropped, Event, Now, Peer, PeerId, Settings, Silenced, State, Stats};
use tokio::{net::UdpSocket, sync::oneshot};

use super::{
    Inputs, Membership, Outputs,
    directory::Directory,
    keys::KeyFiles,
    start::{Started, start},
};
use crate::{
    liveness::fence::FenceState,
    metrics::{
        Metrics,
        gossip::{DirectionLabel, ReasonLabel, StateLabel},
    },
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
    fence: ipam_gossip::Fence,
    outputs: Outputs,
    metrics: Arc<Metrics>,
    /// The peer's counters as last added to the metrics.
    counted: Stats,
    /// Where the next join starts in the list of seeds, and when each kind of trouble was last
    /// logged (so a flood of bad packets is one line a minute).
    next_seed: usize,
    logged: HashMap<&'static str, Instant>,
    /// The fence stays closed until it has been judged open for `reopen_after` without a break
    /// (since when, so far): a node coming back first learns who the others are.
    open_since: Option<Duration>,
    reopen_after: Duration,
}

impl Member {
    fn new(inputs: &Inputs, outputs: Outputs, started: Started) -> Self {
        let Started {
            socket,
            address,
            keyring,
            keys,
            directory,
            records,
        } = started;
        let timing = inputs.settings.timing();
        // A start later than the last one at this address wins over its memory in the cluster.
        let generation = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX));
        let peer = Peer::new(
            PeerId::new(address, generation),
            Settings::new(&timing, directory.size()),
            keyring,
        );
        Self {
            peer,
            socket,
            origin: Instant::now(),
            directory,
            records,
            keys,
            fence: timing.fence(),
            outputs,
            metrics: inputs.metrics.clone(),
            counted: Stats::default(),
            next_seed: 0,
            logged: HashMap::new(),
            open_since: None,
            reopen_after: timing.probe_period,
        }
    }

    async fn run(&mut self, mut stop: oneshot::Receiver<()>) {
        let mut buf = vec![0; MAX_PACKET];
        let mut housekeeping = crate::clock::ticker(HOUSEKEEPING);
        self.judge_fence();
        loop {
            let wake = self.next_wakeup();
            tokio::select! {
                _ = &mut stop => {
                    self.leave().await;
                    return;
                }
                received = self.socket.recv_from(&mut buf) => match received {
                    Ok((len, from)) => self.receive(&buf[..len], from),
                    Err(e) => self.log_trouble("recv", || format!("gossip socket: {e}")),
                },
                () = tokio::time::sleep_until(wake.into()) => self.peer.advance(self.now()),
                event = self.records.next() => {
                    self.directory.apply(event);
                    self.publish_membership();
                }
                _ = housekeeping.tick() => self.housekeeping(),
            }
            self.send().await;
            self.absorb_events();
            self.judge_fence();
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

    /// The protocol's next timer, the moment the fence would close if nothing is heard
    /// before, or the moment it may reopen, whichever comes first.
    fn next_wakeup(&self) -> Instant {
        let now = self.origin.elapsed();
        let mut next = self.peer.next_deadline().unwrap_or(now + HOUSEKEEPING);
        if let Some(ago) = self.peer.contact().heard_ago(now)
            && ago < self.fence.quiet
        {
            next = next.min(now + (self.fence.quiet - ago) + Duration::from_millis(1));
        }
        if let Some(since) = self.open_since
            && *self.outputs.fence.borrow() != FenceState::Open
        {
            next = next.min(since + self.reopen_after);
        }
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

    fn absorb_events(&mut self) {
        let mut changed = false;
        for event in self.peer.take_events() {
            changed |= self.log_event(&event);
        }
        if changed {
            self.publish_membership();
        }
    }

    /// Logs what the member learned; `true` when who is alive may have changed.
    fn log_event(&mut self, event: &Event) -> bool {
        let node = |id: &PeerId| {
            self.directory
                .node_at(id.addr)
                .unwrap_or("(no node record)")
                .to_owned()
        };
        match event {
            Event::Up(id) => tracing::info!(node = node(id), member = %id.addr, "member alive"),
            Event::Down(id) => {
                let now = self.origin.elapsed();
                let silent_for = self
                    .peer
                    .contact()
                    .last_heard_from(id.addr)
                    .map(|at| now.saturating_sub(at));
                if let Some(d) = silent_for {
                    self.metrics.gossip.detect_seconds.observe(d.as_secs_f64());
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
                return false;
            }
            Event::Connected => tracing::info!("joined the gossip"),
            Event::Alone => tracing::warn!("no other gossip member is alive"),
        }
        true
    }

    /// The members held alive and unsuspected.
    fn alive_members(&self) -> Vec<SocketAddr> {
        self.peer
            .members()
            .filter(|(_, state)| *state == State::Alive)
            .map(|(id, _)| id.addr)
            .collect()
    }

    fn publish_membership(&mut self) {
        let live = self.directory.nodes_of(self.peer.active().map(|p| p.addr));
        self.outputs.membership.send_if_modified(|m| {
            let changed = m.live != live;
            if changed {
                *m = Membership { live };
            }
            changed
        });
    }

    fn judge_fence(&mut self) {
        let now = self.origin.elapsed();
        let view = self.directory.view(self.alive_members());
        let verdict = self.fence.judge(self.peer.contact(), now, view);
        let state = match &verdict {
            Ok(()) => {
                let since = *self.open_since.get_or_insert(now);
                let closed = *self.outputs.fence.borrow() != FenceState::Open;
                if closed && now.saturating_sub(since) < self.reopen_after {
                    // Not yet: stays as it is, and the wakeup comes back for it.
                    return;
                }
                FenceState::Open
            }
            Err(why) => {
                self.open_since = None;
                FenceState::Closed(why.to_string())
            }
        };
        let metrics = &self.metrics.gossip;
        self.outputs.fence.send_if_modified(|current| {
            if *current == state {
                return false;
            }
            match &verdict {
                Ok(()) => {
                    tracing::info!("gossip fence open: this node may answer for its service IPs");
                    metrics.fence_open.set(1);
                }
                Err(why) => {
                    tracing::warn!("gossip fence closed, responders silent: {why}");
                    metrics.fence_open.set(0);
                    metrics
                        .fence_closings
                        .get_or_create(&ReasonLabel {
                            reason: silenced_label(why).to_owned(),
                        })
                        .inc();
                }
            }
            *current = state;
            true
        });
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
        self.publish_membership();
        self.count();
        self.snapshot();
    }

    /// Brings the metrics up to the peer's counters.
    fn count(&mut self) {
        let stats = self.peer.stats().clone();
        let gossip = &self.metrics.gossip;
        let direction = |d: &str| DirectionLabel {
            direction: d.to_owned(),
        };
        let grew = |now: u64, then: u64| now.saturating_sub(then);
        gossip
            .packets
            .get_or_create(&direction("sent"))
            .inc_by(grew(stats.sent_packets, self.counted.sent_packets));
        gossip
            .packets
            .get_or_create(&direction("received"))
            .inc_by(grew(stats.received_packets, self.counted.received_packets));
        gossip
            .bytes
            .get_or_create(&direction("sent"))
            .inc_by(grew(stats.sent_bytes, self.counted.sent_bytes));
        gossip
            .bytes
            .get_or_create(&direction("received"))
            .inc_by(grew(stats.received_bytes, self.counted.received_bytes));
        gossip
            .suspicions
            .inc_by(grew(stats.suspicions, self.counted.suspicions));
        for reason in Dropped::ALL {
            let added = grew(stats.dropped(reason), self.counted.dropped(reason));
            if added > 0 {
                gossip
                    .dropped
                    .get_or_create(&ReasonLabel {
                        reason: reason.label().to_owned(),
                    })
                    .inc_by(added);
            }
        }
        let mut by_state: HashMap<&str, i64> = [("alive", 0), ("suspect", 0), ("down", 0)].into();
        for (_, state) in self.peer.members() {
            *by_state.entry(state_label(state)).or_default() += 1;
        }
        for (state, count) in by_state {
            gossip
                .members
                .get_or_create(&StateLabel {
                    state: state.to_owned(),
                })
                .set(count);
        }
        self.counted = stats;
    }

    /// The view `ipamctl members` shows.
    fn snapshot(&self) {
        let now = self.origin.elapsed();
        let contact = self.peer.contact();
        let mut members: Vec<GossipMember> = self
            .peer
            .members()
            .map(|(id, state)| GossipMember {
                node: self.directory.node_at(id.addr).map(str::to_owned),
                address: id.addr.to_string(),
                generation: id.generation,
                state: state_label(state).to_owned(),
                last_heard_ms: contact
                    .last_heard_from(id.addr)
                    .map(|at| now.saturating_sub(at).as_millis() as u64),
            })
            .collect();
        members.sort_by(|a, b| (&a.node, &a.address).cmp(&(&b.node, &b.address)));
        let me = self.peer.id();
        *self.outputs.members.lock().expect("members lock") = GossipMembers {
            address: Some(me.addr.to_string()),
            generation: me.generation,
            silenced: match &*self.outputs.fence.borrow() {
                FenceState::Open => None,
                FenceState::Closed(why) => Some(why.clone()),
            },
            members,
        };
    }

    /// A clean stop: the others declare this member dead at once.
    async fn leave(&mut self) {
        let now = self.now();
        self.peer.leave(now);
        self.send().await;
        tracing::info!("left the gossip");
    }
}

fn state_label(state: State) -> &'static str {
    match state {
        State::Alive => "alive",
        State::Suspect => "suspect",
        State::Down => "down",
    }
}

fn silenced_label(why: &Silenced) -> &'static str {
    match why {
        Silenced::NeverHeard => "never_heard",
        Silenced::NothingHeard(_) => "nothing_heard",
        Silenced::ProbesUnanswered { .. } => "probes_unanswered",
        Silenced::Minority { .. } => "minority",
    }
}
