//! Node liveness between the agents (`[gossip]`): each agent is a member of a SWIM cluster
//! (`ipam_gossip`) over UDP on its address between nodes, and the store sees none of it.
//!
//! What the task publishes:
//! - `Membership`: the other nodes the gossip holds alive, which `l2::owners` hashes
//!   the service IPs over (through `LivePeers::Gossip`);
//! - `FenceState`: whether this node may answer, which `heartbeat` follows at once;
//! - a `GossipMembers` snapshot for `ipamctl members`, and the gossip metrics.
//!
//! - `keys`: the cluster key files, re-read so a rotation needs no restart;
//! - `directory`: the node records as gossip addresses (seeds, and the node behind a member);
//! - `member`: the running member: socket, timers, joining, the loop;
//! - `fencing`: the fence judged after every step, with its reopening held back;
//! - `events` and `report`: what the member learned, in the log, the metrics and the snapshot;
//! - `start`: what the member waits for before it can run (key, own address, socket).

mod directory;
mod events;
mod fencing;
mod keys;
mod member;
mod report;
mod start;
mod takeover;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use ipam_api::types::{GossipMembers, Request, Response};
use ipam_config::GossipSettings;
use tokio::sync::{oneshot, watch};

use super::fence::FenceState;
use crate::{api::server::Handler, cluster::ClusterStore, metrics::Metrics};

/// The other nodes the gossip holds alive (suspects included), and those it declared dead, by
/// node name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Membership {
    pub live: BTreeSet<String>,
    /// Declared dead (and not back as a newer generation), with their addresses between nodes
    /// from their records: where `dead_peers` looks for a second signal.
    pub down: BTreeMap<String, Vec<IpAddr>>,
    /// Suspected and not yet declared dead, with their addresses: `dead_peers` probes them at
    /// once, so that its evidence is ready when the verdict comes.
    pub suspect: BTreeMap<String, Vec<IpAddr>>,
}

/// What the gossip needs.
pub struct Inputs {
    pub settings: GossipSettings,
    pub store: ClusterStore,
    pub node: String,
    pub metrics: Arc<Metrics>,
}

/// The running gossip: what it publishes, and how to stop it.
pub struct Gossip {
    pub membership: watch::Receiver<Membership>,
    pub fence: watch::Receiver<FenceState>,
    members: Arc<Mutex<GossipMembers>>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

/// How long a clean stop waits for the leave to be sent.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(1);

/// Where the member sends what it publishes.
struct Outputs {
    membership: watch::Sender<Membership>,
    fence: watch::Sender<FenceState>,
    members: Arc<Mutex<GossipMembers>>,
}

impl Gossip {
    /// Starts the gossip. Until it has its key, its address and its socket it publishes no one
    /// alive and a closed fence, saying what it waits for.
    pub fn spawn(inputs: Inputs) -> Self {
        let (membership_tx, membership) = watch::channel(Membership::default());
        let (fence_tx, fence) = watch::channel(FenceState::Starting("gossip starting".into()));
        let members = Arc::new(Mutex::new(GossipMembers::default()));
        let outputs = Outputs {
            membership: membership_tx,
            fence: fence_tx,
            members: members.clone(),
        };
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(member::run(inputs, outputs, stop_rx));
        Self {
            membership,
            fence,
            members,
            stop: Some(stop_tx),
            task,
        }
    }

    /// Answers `ipamctl members` from the gossip, and everything else with `inner`.
    pub fn api_handler(&self, inner: Handler) -> Handler {
        let members = self.members.clone();
        Arc::new(move |request| match request {
            Request::Members => Response::Members(members.lock().expect("members lock").clone()),
            other => inner(other),
        })
    }

    /// A stop for a restart: no goodbye, so the others find this member gone only when its
    /// probes fail, and keep its IPs while its record's restart notice lasts
    /// (`liveness::restart`).
    pub async fn abandon(mut self) {
        // Cancelled before the stop channel closes: a closed channel would make it leave.
        self.task.abort();
        let _ = (&mut self.task).await;
        drop(self.stop.take());
    }

    /// A clean stop: tells the cluster this node leaves, so the others take its IPs over at
    /// once instead of after the suspicion delay.
    pub async fn leave(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(LEAVE_TIMEOUT, &mut self.task)
            .await
            .is_err()
        {
            tracing::warn!("the gossip did not finish leaving in time");
        }
    }
}
