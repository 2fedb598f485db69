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
    sync::{Arc, Mutex, PoisonError},
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
    store::Watch,
};
use tokio::sync::watch;

pub use ipam_core::l2::owners::LINGER;

use super::announcements::{OwnedIps, ServiceAnswers};
use crate::{
    cluster::{
        ClusterStore,
        cache::{Cache, watch_until_it_works},
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

/// The objects the decision is made from, kept current by their watches.
struct Seen {
    services: Cache<Service>,
    endpoints: Cache<ServiceEndpoints>,
    /// The nodes with a ready endpoint of each Service, from `endpoints`; rebuilt when they
    /// change, not on every decision (endpoints are the most numerous objects read).
    ready: ReadyNodes,
    policies: Cache<L2AnnouncementPolicy>,
    /// The pools, for policies that choose IPs by pool (`ipPools`, `ipPoolSelector`), and for
    /// the external IPs they admit.
    pools: Cache<LbIpPool>,
    /// The namespaces' labels, which pools admit external IPs by.
    namespaces: Cache<Namespace>,
    nodes: Cache<NodeIpam>,
}

impl Seen {
    fn endpoints_changed(&mut self) {
        self.ready = rows::ready_nodes(self.endpoints.iter());
    }
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
    let mut watches = Watches::open(&store).await;
    let mut peers = LivePeers::start(peers, &store, node.clone()).await;
    let mut seen = watches.seen();
    if inherited.is_empty() {
        // Nothing taken up: what an agent before left on `lo` is not this one's, and goes
        // now rather than at a first decision that waits for the fence to open.
        outputs.answers.send_modify(|a| a.decided = true);
    }
    let mut decider = Decider::new(
        &node,
        inherited,
        &seen.nodes,
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
    let mut fence_opened = false;
    loop {
        // Changes only update the copies; ownership is decided once per tick, whatever the
        // number of changes (a burst of service writes would otherwise cost a decision each).
        // A death or a return in the gossip is decided at once: it is what failover waits on.
        // At rest the tick is not even waited for (ten wake-ups a second for nothing).
        // Time alone changes a decision only at the instants the decider names: the tick runs
        // meanwhile, and decides once one has passed.
        let time_matters = peers.decays() || decider.next_due().is_some();
        tokio::select! {
            e = watches.services.next() => { seen.services.apply(e); pace.changed = true; continue; }
            e = watches.endpoints.next() => {
                seen.endpoints.apply(e);
                seen.endpoints_changed();
                pace.changed = true;
                continue;
            }
            e = watches.policies.next() => { seen.policies.apply(e); pace.changed = true; continue; }
            e = watches.pools.next() => { seen.pools.apply(e); pace.changed = true; continue; }
            e = watches.namespaces.next() => {
                seen.namespaces.apply(e);
                pace.changed = true;
                continue;
            }
            e = watches.nodes.next() => {
                seen.nodes.apply(e);
                decider.records_changed(&seen.nodes, Instant::now());
                pace.changed = true;
                continue;
            }
            () = fence.changed() => {}
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
        fence_opened |= fence.may_answer();
        if decider.waits(fence_opened, peers.knows_others(), Instant::now()) {
            continue;
        }
        let frozen = frozen.lock().unwrap_or_else(PoisonError::into_inner);
        if *frozen {
            continue;
        }
        let started = pace.deciding();
        let plan = tracing::debug_span!("service_ip_pass", node = applier.node.as_str())
            .in_scope(|| decide(&mut decider, &seen, &mut peers, started));
        applier.carry_out(plan);
        drop(frozen);
        let took = started.elapsed();
        pace.decided(took);
        applier
            .metrics
            .service_ip_decision_seconds
            .observe(took.as_secs_f64());
        warn_if_slow(took);
    }
}

/// One decision from the copies, at `now`.
fn decide(decider: &mut Decider, seen: &Seen, peers: &mut LivePeers, now: Instant) -> Plan {
    let (policies, pools, services) = (
        rows::policies(seen.policies.iter()),
        rows::labelled_pools(seen.pools.iter()),
        rows::services_in(seen.services.iter(), seen.namespaces.iter()),
    );
    let view = View {
        policies: &policies,
        pools: &pools,
        services: &services,
        ready: &seen.ready,
        records: &seen.nodes,
        records_fresh: seen.nodes.is_fresh(),
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

/// The store watches the controller follows, one per kind it reads.
struct Watches {
    services: Watch,
    endpoints: Watch,
    policies: Watch,
    pools: Watch,
    namespaces: Watch,
    nodes: Watch,
}

impl Watches {
    async fn open(store: &ClusterStore) -> Self {
        const FOR: &str = "service IPs";
        Self {
            services: watch_until_it_works::<Service, _>(store, FOR).await,
            endpoints: watch_until_it_works::<ServiceEndpoints, _>(store, FOR).await,
            policies: watch_until_it_works::<L2AnnouncementPolicy, _>(store, FOR).await,
            pools: watch_until_it_works::<LbIpPool, _>(store, FOR).await,
            namespaces: watch_until_it_works::<Namespace, _>(store, FOR).await,
            nodes: watch_until_it_works::<NodeIpam, _>(store, FOR).await,
        }
    }

    /// The copies, as the watches first listed them.
    fn seen(&self) -> Seen {
        let mut seen = Seen {
            services: Cache::new(&self.services.initial),
            endpoints: Cache::new(&self.endpoints.initial),
            ready: ReadyNodes::new(),
            policies: Cache::new(&self.policies.initial),
            pools: Cache::new(&self.pools.initial),
            namespaces: Cache::new(&self.namespaces.initial),
            nodes: Cache::new(&self.nodes.initial),
        };
        seen.endpoints_changed();
        seen
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
