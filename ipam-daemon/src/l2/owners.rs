//! The cluster's Service IPs this node answers for: the runner and applier of
//! `ipam_core::l2::owners`.
//!
//! The decision itself is pure and lives in `ipam-core` (`Decider`: rendezvous hashing over the
//! live nodes, the hand-over between live nodes, restart holds, lingering IPs), where the
//! simulator (`ipam-sim`) runs it on every node of a modelled cluster. This file keeps the
//! copies it reads current (the store's watches, the live nodes as `liveness::LivePeers`
//! reports them: from the gossip, or from the nodes' leases), paces it, and hands its outcome
//! to the responder whole (`ServiceAnswers`), which carries it out (`lo`, hand-overs, maps, the
//! link told) in one place and one order; it tells users (Events) and keeps the metrics.

use std::{
    sync::{Arc, Mutex, PoisonError, RwLockReadGuard},
    time::{Duration, Instant, SystemTime},
};

use ipam_core::{
    l2::{
        NodeRecords,
        owners::{Decider, Plan, Taken, View},
        pacing::{DECISION, TICK, rest_after},
        restarts::unix_ms,
    },
    lb::{
        announce::ReadyNodes,
        resources::{L2AnnouncementPolicy, LbIpPool, Namespace, Service, ServiceEndpoints},
        rows,
    },
    resources::NodeIpam,
};
use tokio::sync::watch;

pub use ipam_core::l2::owners::LINGER;

use super::announcements::{OwnedIps, ServiceAnswers};
use crate::{
    cluster::{
        ClusterStore,
        cache::Cache,
        copies::{Copy, Moment, Wake},
        events::Events,
    },
    liveness::{Fence, LivePeers, peers::PeersSource},
    metrics::Metrics,
};

/// What the controller reads.
pub struct Inputs {
    pub store: ClusterStore,
    pub node: String,
    pub peers: PeersSource,
    pub metrics: Arc<Metrics>,
    /// The node's fence: no decision is made before it first opens (`Decider::waits`).
    pub fence: Fence,
    /// Set when the agent stops for a restart: no decision after it, so the IPs its notice
    /// lists are all the responders answer (`liveness::restart`). Held through each decision,
    /// so setting it waits for one under way.
    pub frozen: Arc<Mutex<bool>>,
    /// Where users are told which node answers (Events on a Kubernetes store).
    pub events: Arc<Events>,
    /// What the responders answer at the start because the agent before this one stopped for
    /// a restart and its promise runs (`liveness::restart`): taken up as this node's own,
    /// without a hand-over wait, until the first decision says otherwise. Empty otherwise.
    pub inherited: OwnedIps,
}

/// What the controller tells the others.
pub struct Outputs {
    /// What this node does for the Service IPs, for the responder to carry out; it starts at
    /// `ServiceAnswers::at_start(inherited)`.
    pub answers: watch::Sender<ServiceAnswers>,
}

/// The copies the decision is made from (`cluster::copies`: shared with the other
/// controllers that read the same kinds), and what is derived from them.
struct Seen {
    services: Copy<Service>,
    endpoints: Copy<ServiceEndpoints>,
    /// The nodes with a ready endpoint of each Service, from `endpoints`; rebuilt when they
    /// change, not on every decision (endpoints are the most numerous objects read).
    ready: ReadyNodes,
    policies: Copy<L2AnnouncementPolicy>,
    /// The pools, for policies that choose IPs by pool (`ipPools`, `ipPoolSelector`), and for
    /// the external IPs they admit.
    pools: Copy<LbIpPool>,
    /// The namespaces' labels, which pools admit external IPs by.
    namespaces: Copy<Namespace>,
    nodes: Copy<NodeIpam>,
}

impl Seen {
    /// The copies of the kinds the decision reads, `wake` woken when any changes.
    async fn follow(store: &ClusterStore, wake: &Wake) -> Self {
        const FOR: &str = "service IPs";
        let mut seen = Self {
            services: store.follow(wake, FOR).await,
            endpoints: store.follow(wake, FOR).await,
            ready: ReadyNodes::new(),
            policies: store.follow(wake, FOR).await,
            pools: store.follow(wake, FOR).await,
            namespaces: store.follow(wake, FOR).await,
            nodes: store.follow(wake, FOR).await,
        };
        seen.ready_again(&store.moment().await);
        seen
    }

    fn ready_again(&mut self, at: &Moment) {
        self.ready = rows::ready_nodes(self.endpoints.read(at).iter());
    }

    /// The copies at `at`, for one decision.
    fn read<'a>(&'a self, at: &'a Moment) -> Read<'a> {
        Read {
            services: self.services.read(at),
            policies: self.policies.read(at),
            pools: self.pools.read(at),
            namespaces: self.namespaces.read(at),
            nodes: self.nodes.read(at),
            ready: &self.ready,
        }
    }
}

/// What one decision reads: the copies at one moment.
struct Read<'a> {
    services: RwLockReadGuard<'a, Cache<Service>>,
    policies: RwLockReadGuard<'a, Cache<L2AnnouncementPolicy>>,
    pools: RwLockReadGuard<'a, Cache<LbIpPool>>,
    namespaces: RwLockReadGuard<'a, Cache<Namespace>>,
    nodes: RwLockReadGuard<'a, Cache<NodeIpam>>,
    ready: &'a ReadyNodes,
}

impl NodeRecords for Cache<NodeIpam> {
    fn record(&self, node: &str) -> Option<&NodeIpam> {
        self.get(node).map(|r| &r.value)
    }

    fn each(&self) -> Box<dyn Iterator<Item = (&str, &NodeIpam)> + '_> {
        Box::new(self.iter().map(|r| (r.name.as_str(), &r.value)))
    }
}

/// Runs the controller for the life of the daemon.
pub async fn run(inputs: Inputs, outputs: Outputs) {
    let Inputs {
        store,
        node,
        peers,
        mut fence,
        frozen,
        metrics,
        events,
        inherited,
    } = inputs;
    let wake = Wake::default();
    let mut seen = Seen::follow(&store, &wake).await;
    let mut peers = LivePeers::start(peers, &store, node.clone()).await;
    if inherited.is_empty() {
        // Nothing taken up: what an agent before left on `lo` is not this one's, and goes
        // now rather than at a first decision that waits for the fence to open.
        outputs.answers.send_modify(|a| a.decided = true);
    }
    let mut decider = Decider::new(
        &node,
        inherited,
        &*seen.nodes.read(&store.moment().await),
        Instant::now(),
        unix_ms(SystemTime::now()),
    );
    let mut applier = Applier {
        node,
        metrics,
        events,
        outputs,
    };
    let mut tick = crate::clock::ticker(TICK);
    let mut pace = Pace::new();
    // A closing of the fence seen since the last decision: the next decision is made as with
    // the fence closed even if it reopened meanwhile (a decision under way, one that waited),
    // so what the node answered is given up, never kept through a silence.
    let mut closing_seen = false;
    loop {
        // Changes only update the copies; ownership is decided once per tick, whatever the
        // number of changes (a burst of service writes would otherwise cost a decision each).
        // A death or a return in the gossip is decided at once: it is what failover waits on.
        // At rest the tick is not even waited for (ten wake-ups a second for nothing).
        // Time alone changes a decision only at the instants the decider names: the tick runs
        // meanwhile, and decides once one has passed.
        let time_matters = peers.decays() || decider.next_due().is_some();
        tokio::select! {
            () = wake.changed() => {
                // Restart notices are held from when they are seen, even while decisions
                // wait (the fence not open yet); the decision follows anything newer below.
                let at = store.moment().await;
                follow_copies(&mut seen, &mut decider, &at);
                drop(at);
                pace.changed = true;
                continue;
            }
            // Not before the fence first opened: the gossip's fence starts closed, and its
            // first verdicts are closings too (a give-up of the inherited IPs at every start).
            () = fence.changed() => {
                // `has_opened`, not what this loop saw: it starts after listing the kinds it
                // reads (seconds on a large cluster), and the watch may have merged a first
                // opening and a closing by then (found by review).
                closing_seen |= fence.has_opened() && !fence.may_answer();
            }
            decide_now = peers.changed() => {
                pace.changed = true;
                if !decide_now { continue }
            }
            _ = tick.tick(), if pace.changed || time_matters => {
                let due = pace.changed || peers.decays() || decider.due_by_time(Instant::now());
                if !due || !pace.rested() {
                    continue;
                }
            }
        }
        if decider.waits(fence.has_opened(), peers.knows_others(), Instant::now()) {
            continue;
        }
        let at = store.moment().await;
        let started = {
            let frozen = frozen.lock().unwrap_or_else(PoisonError::into_inner);
            if *frozen {
                continue;
            }
            let started = pace.deciding();
            // What is derived from the copies follows them at the moment decided at.
            follow_copies(&mut seen, &mut decider, &at);
            let copies = seen.read(&at);
            let fence_open = fence.may_answer() && !std::mem::take(&mut closing_seen);
            let plan = tracing::debug_span!("service_ip_pass", node = applier.node.as_str())
                .in_scope(|| decide(&mut decider, &copies, &mut peers, fence_open, started));
            applier.carry_out(plan);
            // Reopened already: decided again at the next tick, on the open fence.
            pace.changed |= !fence_open && fence.may_answer();
            started
        };
        drop(at);
        let took = started.elapsed();
        pace.decided(took);
        applier
            .metrics
            .service_ip_decision_seconds
            .observe(took.as_secs_f64());
        warn_if_slow(took);
    }
}

/// Brings what is derived from the copies (the ready nodes, the restart notices the decider
/// holds) in line with them at `at`, where they changed.
fn follow_copies(seen: &mut Seen, decider: &mut Decider, at: &Moment) {
    if seen.endpoints.changed() {
        seen.ready_again(at);
    }
    if seen.nodes.changed() {
        decider.records_changed(&*seen.nodes.read(at), Instant::now());
    }
}

/// One decision from the copies, at `now`, with the fence open or not (`fence_open`).
fn decide(
    decider: &mut Decider,
    seen: &Read<'_>,
    peers: &mut LivePeers,
    fence_open: bool,
    now: Instant,
) -> Plan {
    let (policies, pools, services) = (
        rows::policies(seen.policies.iter()),
        rows::labelled_pools(seen.pools.iter()),
        rows::services_in(seen.services.iter(), seen.namespaces.iter()),
    );
    let view = View {
        policies: &policies,
        pools: &pools,
        services: &services,
        ready: seen.ready,
        records: &*seen.nodes,
        records_fresh: seen.nodes.is_fresh(),
        fence_open,
    };
    decider.decide(&view, &mut |node| peers.is_live(node, now), now)
}

/// The hand-over's wait covers decisions up to `DECISION` only: beyond it, an old owner may
/// let go after the new one answers (two MACs), and the rest, capped, lets the decisions take
/// more than a `DUTY`th of a core.
fn warn_if_slow(took: Duration) {
    if took > DECISION {
        tracing::warn!(
            took_ms = took.as_millis() as u64,
            designed_for_ms = DECISION.as_millis() as u64,
            "slow service IP pass: longer than hand-overs between live nodes are timed for"
        );
    } else if took > Duration::from_millis(20) {
        tracing::debug!(took_ms = took.as_millis() as u64, "slow service IP pass");
    }
}

/// Hands a decision's outcome to the responder (the one applier of `lo`, the hand-overs and
/// the maps), and tells users and metrics what it took.
struct Applier {
    node: String,
    metrics: Arc<Metrics>,
    events: Arc<Events>,
    outputs: Outputs,
}

impl Applier {
    fn carry_out(&mut self, plan: Plan) {
        let Plan { answers, taken } = plan;
        self.outputs.answers.send_if_modified(|current| {
            let first = !current.decided;
            current.decided = true;
            match answers {
                Some(answers) => {
                    self.metrics
                        .service_ips_announced
                        .set(answers.answering.len() as i64);
                    current.answers = answers;
                    true
                }
                None => first,
            }
        });
        for t in &taken {
            self.metrics.count_service_ip_taken(t.from.kind());
        }
        self.metrics.service_ip_takeovers.inc_by(taken.len() as u64);
        tell_users(&self.events, &self.node, taken);
    }
}

/// When a tick decides: only after a change, or while time alone may change the outcome (at
/// 10,000 Services a decision is thousands of owners, ten times a second per agent); and under
/// a stream of changes at most a `DUTY`th of the time (ten a second took a core's tenth from
/// every agent while LB-IPAM assigned them).
struct Pace {
    /// Whether anything changed since the last decision (the first one is due).
    changed: bool,
    /// Until when a tick leaves a change for later.
    rested_until: Instant,
}

impl Pace {
    fn new() -> Self {
        Self {
            changed: true,
            rested_until: Instant::now(),
        }
    }

    /// Whether the last decision has rested long enough for the next.
    fn rested(&self) -> bool {
        Instant::now() >= self.rested_until
    }

    /// A decision starts: every change so far is in it.
    fn deciding(&mut self) -> Instant {
        self.changed = false;
        Instant::now()
    }

    /// A decision that took `took` ended: rest for it ([`rest_after`]).
    fn decided(&mut self, took: Duration) {
        self.rested_until = Instant::now() + rest_after(took);
    }
}

/// Tells users, on each Service, that this node answers for its IP now; off the controller's
/// path (an API call must not delay the next decision).
fn tell_users(events: &Arc<Events>, node: &str, taken: Vec<Taken>) {
    if taken.is_empty() || !events.publishes() {
        return;
    }
    let (events, node) = (events.clone(), node.to_owned());
    tokio::spawn(async move {
        for t in taken {
            events
                .service_ip_answered(
                    &t.owned.service,
                    t.ip,
                    &node,
                    &t.owned.interfaces,
                    t.reason,
                    &t.why,
                )
                .await;
        }
    });
}
