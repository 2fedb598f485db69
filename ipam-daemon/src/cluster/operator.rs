//! The operator role: the cluster-wide IPAM controllers (pod IP pools, blocks and node liveness
//! when the cluster runs pod IPAM; LB-IPAM always), run by any number of replicas of which
//! exactly one leads, through a lease in the store.
//!
//! A replica that becomes leader starts from an empty cache: its first pass restores the pools
//! and every block held from the store before it decides anything, and it frees no node's
//! blocks before it has itself seen that node's lease unrenewed for the whole grace period.

use std::time::Duration;

use ipam_config::{ClusterSettings, PoolConfig};
use ipam_core::{
    backoff::Backoff,
    lb::{
        controller as lb_ipam,
        resources::{L2AnnouncementPolicy, LbIpPool, Namespace, Service, ServiceEndpoints},
    },
    pod::operator::{Operator, OperatorError, PoolEvent, Report, record_mode},
    pod::pool::IpamMode,
    resources::{NodeIpam, PodIpPool},
    store::{Resource as _, Store, TypedStore, lease::Lease},
};
use tokio::sync::watch;
use tracing::Instrument as _;

pub use super::election::Leader;
use super::{
    election::{self, Elected, Election},
    watched_reads::{Followed, WatchedReads},
};

/// Longest wait between two attempts while the store is unreachable.
const RETRY_CAP: Duration = Duration::from_secs(10);

/// What an operator replica needs to know.
#[derive(Debug, Clone)]
pub struct OperatorSettings {
    /// Pod IPAM, or none in the add-on mode (LB-IPAM only).
    pub pod_ipam: Option<PodIpamSettings>,
    pub cluster: ClusterSettings,
    /// Whether other replicas may run: then it leads only while it holds the lease.
    pub elect: bool,
}

/// The cluster's pod IPAM, as the operator runs it.
#[derive(Debug, Clone)]
pub struct PodIpamSettings {
    pub mode: IpamMode,
    /// Pools from the configuration, written to the store on start and on reload.
    pub pools: Vec<PoolConfig>,
}

/// Runs the operator until `stop` turns true; on a clean stop it hands leadership over.
/// Who leads goes to `leader` at each step of the election.
pub async fn run<S: Store + Clone + 'static>(
    store: S,
    settings: OperatorSettings,
    mut pools: watch::Receiver<Vec<PoolConfig>>,
    leader: watch::Sender<Leader>,
    mut stop: watch::Receiver<bool>,
    observed: crate::metrics::Observed,
    events: super::events::Events,
) {
    let identity = settings.cluster.identity();
    // Mode and pools first: every later decision depends on them.
    if !prepare(&store, &settings, &mut stop).await {
        return;
    }
    let (reads, wake) = WatchedReads::follow(store.clone(), FOLLOWED);
    let Election {
        mut elected,
        task: election,
    } = start_election(&store, &settings, leader, &observed, &stop);
    let mut office = Office::default();
    // Node leases lapse without any change to wake us: look at them this often.
    let mut liveness_tick = tokio::time::interval(settings.cluster.node_grace() / 4);
    let mut resync = tokio::time::interval(settings.cluster.resync());
    let mut last_lb = LastLb::default();
    let mut due = Due::default();
    loop {
        let retry = sleep_until(due.retry_at);
        let settled = sleep_until(office.settled_at());
        tokio::select! {
            // A pass left work for the next (LB-IPAM's writes per pass): at once, with the
            // election's tick as likely to be taken first when it is due.
            () = std::future::ready(()), if due.now() && office.term.is_some()
                && (!settings.elect || elected.borrow().leading()) => {}
            () = settled => due.dirty = true,
            changed = elected.changed(), if settings.elect => {
                if changed.is_err() { return; }
                let now = *elected.borrow_and_update();
                due.dirty |= office.follow(now, &settings);
            }
            () = wake.notified() => due.dirty = true,
            _ = liveness_tick.tick() => due.dirty = true,
            _ = resync.tick() => due.dirty = true,
            () = retry => { due.retry_at = None; due.dirty = true; }
            changed = pools.changed() => {
                if changed.is_err() { return; }
                let new = pools.borrow_and_update().clone();
                reload_pools(&store, &settings, &new).await;
            }
            _ = stop.changed() => {
                // The election hands the lease over before it ends.
                let _ = election.await;
                return;
            }
        }
        if !settings.elect && office.term.is_none() {
            office.term = Some(new_term(&settings));
        }
        if !due.now() {
            continue;
        }
        let Some(term) = acting_term(&mut office.term, &elected.borrow(), settings.elect) else {
            continue;
        };
        let reports = Reports {
            observed: &observed,
            events: &events,
            last_lb: &mut last_lb,
        };
        let passed = pass(&reads, term, reports)
            .instrument(tracing::info_span!(
                "operator_pass",
                identity = identity.as_str()
            ))
            .await;
        due.settle(passed, &observed);
    }
}

/// Starts the election, or without one (a single operator) nothing that is ever elected,
/// and a term that never ends.
fn start_election<S: Store + Clone + 'static>(
    store: &S,
    settings: &OperatorSettings,
    leader: watch::Sender<Leader>,
    observed: &crate::metrics::Observed,
    stop: &watch::Receiver<bool>,
) -> Election {
    if !settings.elect {
        return Election::none();
    }
    election::spawn(
        store.clone(),
        settings.cluster.identity(),
        settings.cluster.operator_lease(),
        leader,
        observed.clone(),
        stop.clone(),
    )
}

/// The controller in office, and the election term it was started for.
#[derive(Default)]
struct Office {
    term: Option<Term>,
    elected_term: Option<u64>,
}

impl Office {
    /// Follows the election; says whether a pass is due. Leadership lost ends the term; a
    /// new election term starts a fresh controller, which restores pools and blocks from the
    /// store on its first pass whatever a previous term of ours left in memory. A renewal
    /// changes nothing.
    ///
    /// Leading is judged when the value is read, not when the election sent it: a pass that
    /// outlasts the deadline sees a lapse, and the renewal then in flight may keep the same
    /// election term. So a lapse forgets the term too, and leading again starts a fresh
    /// controller; keeping the number while dropping the controller left a leader that never
    /// acted again, and said nothing.
    fn follow(&mut self, now: Elected, settings: &OperatorSettings) -> bool {
        if !now.leading() {
            self.term = None;
            self.elected_term = None;
            return false;
        }
        if self.elected_term == Some(now.term) {
            return false;
        }
        self.elected_term = Some(now.term);
        self.term = Some(new_term(settings));
        true
    }

    /// When the pools will have settled, if a pass kept IPs while they did: a pass follows.
    fn settled_at(&self) -> Option<tokio::time::Instant> {
        let settling = self.term.as_ref()?.lb_settling.awaiting()?;
        Some(tokio::time::Instant::from_std(settling))
    }
}

/// Sleeps until `at`; forever without one.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The term that may act now: the one in office, while this replica leads (always without an
/// election), with its pod IPAM's deadline set to the end of the leadership.
fn acting_term<'t>(
    operator: &'t mut Option<Term>,
    elected: &Elected,
    elect: bool,
) -> Option<&'t mut Term> {
    let term = operator.as_mut()?;
    if elect && !elected.leading() {
        return None;
    }
    if let Some(op) = term.pod_ipam.as_mut() {
        op.set_deadline(if elect { elected.until } else { None });
    }
    Some(term)
}

/// Writes the pools of a reloaded configuration; an operator without `[ipam]` refuses them.
async fn reload_pools<S: Store>(store: &S, settings: &OperatorSettings, pools: &[PoolConfig]) {
    if settings.pod_ipam.is_none() {
        if !pools.is_empty() {
            tracing::error!(
                "not writing the reloaded pod IP pools: this operator started without [ipam] \
                 (the add-on mode); restart it to run pod IPAM"
            );
        }
        return;
    }
    if let Err(e) = apply_pools(store, pools).await {
        tracing::error!("cannot write the reloaded pools, keeping the old ones: {e}");
    }
}

/// What the operator's passes read, each followed by one watch whose copy the passes list
/// from (`WatchedReads`); a change of one that `wakes` is reason for a pass.
const FOLLOWED: &[Followed] = &[
    Followed {
        kind: PodIpPool::KIND,
        wakes: true,
    },
    Followed {
        kind: NodeIpam::KIND,
        wakes: true,
    },
    Followed {
        kind: LbIpPool::KIND,
        wakes: true,
    },
    Followed {
        kind: Service::KIND,
        wakes: true,
    },
    Followed {
        kind: ServiceEndpoints::KIND,
        wakes: true,
    },
    Followed {
        kind: L2AnnouncementPolicy::KIND,
        wakes: true,
    },
    // Their labels, which pools' namespaceSelectors select.
    Followed {
        kind: Namespace::KIND,
        wakes: true,
    },
    // The node leases, renewed every few seconds each: read for lapses, which the liveness
    // timer looks for; a renewal is no reason for a pass.
    Followed {
        kind: Lease::KIND,
        wakes: false,
    },
];

/// Whether a pass is due: something changed since the last good one, and no failed one's
/// backoff is running.
struct Due {
    dirty: bool,
    retry_at: Option<tokio::time::Instant>,
    backoff: Backoff,
}

impl Default for Due {
    fn default() -> Self {
        Self {
            dirty: true,
            retry_at: None,
            backoff: Backoff::new(RETRY_CAP),
        }
    }
}

impl Due {
    fn now(&self) -> bool {
        self.dirty && self.retry_at.is_none()
    }

    /// Takes a pass's result: done (or another due at once, `Ok(true)`), or retried after the
    /// backoff.
    fn settle(&mut self, passed: Result<bool, OperatorError>, observed: &crate::metrics::Observed) {
        match passed {
            Ok(more) => {
                self.dirty = more;
                self.backoff.reset();
            }
            Err(OperatorError::NotLeading) => {
                tracing::warn!("operator pass stopped: leadership could not be renewed in time");
            }
            Err(e) => {
                observed.health.set("store", Err(e.to_string()));
                let delay = self.backoff.next_delay();
                tracing::error!(
                    retry_in_ms = delay.as_millis() as u64,
                    "operator pass failed, retrying: {e}"
                );
                self.retry_at = Some(tokio::time::Instant::now() + delay);
            }
        }
    }
}

/// With pod IPAM: records the IPAM mode and writes the configured pools, retrying with backoff until both
/// are done; false when told to stop first. A changed mode is a configuration error; it will
/// not fix itself, but the operator does not crash-loop over it either: it says so and waits.
async fn prepare<S: Store>(
    store: &S,
    settings: &OperatorSettings,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let mut backoff = Backoff::new(RETRY_CAP);
    loop {
        let Some(pod_ipam) = &settings.pod_ipam else {
            return true;
        };
        let prepared = async {
            record_mode(store, pod_ipam.mode).await?;
            apply_pools(store, &pod_ipam.pools).await?;
            Ok::<_, OperatorError>(())
        };
        let Err(e) = prepared.await else {
            return true;
        };
        let delay = backoff.next_delay();
        tracing::error!(
            retry_in_ms = delay.as_millis() as u64,
            "operator waiting: {e}"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return false,
        }
    }
}

/// Where a pass reports what it found.
struct Reports<'a> {
    observed: &'a crate::metrics::Observed,
    events: &'a super::events::Events,
    /// The LB-IPAM problems last reported, so each is told once.
    last_lb: &'a mut LastLb,
}

/// What the previous LB-IPAM pass reported, so that the log says what changed, not the same
/// every pass.
#[derive(Default)]
struct LastLb {
    problems: Vec<(String, String)>,
    dormant: bool,
}

/// The controllers of one term of leadership, fresh at each: pod IPAM (which restores pools
/// and blocks from the store on its first pass) when the cluster runs it. LB-IPAM keeps only
/// when the pools last changed (`PoolSettling`).
struct Term {
    pod_ipam: Option<Operator>,
    lb_settling: lb_ipam::PoolSettling,
    /// The generation of LB-IPAM's inputs its last complete pass decided from: a pass with the
    /// same inputs is skipped (at 10,000 Services a pass is seconds of CPU, and the liveness
    /// timer and pod IPAM's changes wake the operator often).
    lb_decided: Option<u64>,
}

/// What LB-IPAM decides from.
const LB_INPUTS: &[&str] = &[
    LbIpPool::KIND,
    Service::KIND,
    ServiceEndpoints::KIND,
    L2AnnouncementPolicy::KIND,
    NodeIpam::KIND,
    Namespace::KIND,
];

/// One pass of the leading operator: pod IPAM, then LB-IPAM, and what they found reported.
/// Reads come from the watches' copies, except a new term's first pod IPAM pass, which
/// restores from the store itself. `Ok(true)` when another pass is due at once (LB-IPAM wrote
/// as many statuses as one pass writes, and more are due).
async fn pass<S: Store + Clone + 'static>(
    reads: &WatchedReads<S>,
    term: &mut Term,
    reports: Reports<'_>,
) -> Result<bool, OperatorError> {
    let report = match term.pod_ipam.as_mut() {
        Some(op) if op.restored() => Some(op.reconcile(reads).await?),
        Some(op) => Some(op.reconcile(&reads.reading_the_store()).await?),
        None => None,
    };
    let inputs = reads.generation(LB_INPUTS);
    let unchanged =
        inputs.is_some() && inputs == term.lb_decided && term.lb_settling.awaiting().is_none();
    let lb = if unchanged {
        lb_ipam::LbReport::default()
    } else {
        let lb = lb_ipam::reconcile(reads, &mut term.lb_settling).await?;
        term.lb_decided = inputs.filter(|_| !lb.unfinished);
        lb
    };
    let Reports {
        observed,
        events,
        last_lb,
    } = reports;
    observed.health.set("store", Ok(()));
    if let Some(report) = report {
        log_report(&report);
        for (pool, usage) in &report.usage {
            observed.metrics.set_pool_usage(pool, usage);
        }
        for event in &report.events {
            observed.metrics.pool_event(event);
            events.pool_event(event).await;
        }
    }
    if unchanged {
        return Ok(false);
    }
    observed.metrics.set_lb_pool_counts(&lb.pool_counts);
    for (object, problem) in log_lb_report(&lb, last_lb) {
        events.lb_problem(&object, &problem).await;
    }
    Ok(lb.unfinished)
}

fn new_term(settings: &OperatorSettings) -> Term {
    let pod_ipam = settings.pod_ipam.as_ref().map(|pod| {
        let op = Operator::new(pod.mode);
        if settings.elect {
            op.with_node_grace(settings.cluster.node_grace())
        } else {
            op
        }
    });
    Term {
        pod_ipam,
        lb_settling: lb_ipam::PoolSettling::default(),
        lb_decided: None,
    }
}

fn log_report(report: &Report) {
    for (node, b) in &report.assigned {
        tracing::info!(node = node.as_str(), pool = b.pool.as_str(), cidr = %b.cidr, "block assigned");
    }
    for (node, b) in &report.released {
        tracing::info!(node = node.as_str(), pool = b.pool.as_str(), cidr = %b.cidr, "block released");
    }
    for (node, b) in &report.reclaimed {
        tracing::info!(node = node.as_str(), pool = b.pool.as_str(), cidr = %b.cidr, "returning node got its block back");
    }
    for (node, b) in &report.lost {
        tracing::warn!(node = node.as_str(), pool = b.pool.as_str(), cidr = %b.cidr, "returning node asked for a block another node holds now; it gets a new one");
    }
    for node in &report.kept_nodes {
        tracing::warn!(
            node = node.as_str(),
            "node lease lapsed for the grace period; its blocks stay its own while its Node \
             object exists (delete the Node to give them back)"
        );
    }
    for node in &report.expired_nodes {
        tracing::warn!(
            node = node.as_str(),
            "node lease lapsed for the grace period; its blocks went back to the pools"
        );
    }
    for event in &report.events {
        match event {
            PoolEvent::Exhausted { pool, family, node } => tracing::error!(
                pool = pool.as_str(),
                node = node.as_str(),
                "pod IP pool has no {} block left for a node that asked for one",
                family.name()
            ),
            PoolEvent::Refused { pool, message } => {
                tracing::error!(pool = pool.as_str(), "pod IP pool spec refused: {message}");
            }
        }
    }
    for (object, problem) in &report.problems {
        tracing::warn!(object = object.as_str(), "{problem}");
    }
}

/// Logs new Service IPs, problems when they change (not on every pass), and when LB-IPAM
/// falls dormant or wakes; returns the problems that were not there on the previous pass.
fn log_lb_report(report: &lb_ipam::LbReport, last: &mut LastLb) -> Vec<(String, String)> {
    if report.dormant != last.dormant {
        if report.dormant {
            tracing::info!(
                "LB-IPAM waits for a LoadBalancerIPPool: until one exists it changes no Service \
                 (the IPs another controller gave them stay)"
            );
        } else {
            tracing::info!("LB-IPAM serves Services: a LoadBalancerIPPool exists");
        }
        last.dormant = report.dormant;
    }
    for (service, ips) in &report.assigned {
        tracing::info!(service = service.as_str(), ?ips, "service IPs assigned");
    }
    if report.problems == last.problems {
        return Vec::new();
    }
    for (object, problem) in &report.problems {
        tracing::warn!(object = object.as_str(), "{problem}");
    }
    let new = report
        .problems
        .iter()
        .filter(|p| !last.problems.contains(p))
        .cloned()
        .collect();
    last.problems = report.problems.clone();
    new
}

/// Writes the configured pools into the store (creating or updating their specs).
pub async fn apply_pools<S: TypedStore>(
    store: &S,
    pools: &[PoolConfig],
) -> Result<(), ipam_core::store::StoreError> {
    use ipam_core::{resources::PoolStatus, store::StoreError};
    for p in pools {
        loop {
            let result = match store.get_typed::<PodIpPool>(&p.name).await? {
                None => store
                    .create_typed(
                        &p.name,
                        &PodIpPool {
                            spec: p.spec.clone(),
                            status: PoolStatus::default(),
                        },
                    )
                    .await
                    .map(|_| ()),
                Some(cur) if cur.value.spec == p.spec => Ok(()),
                Some(cur) => {
                    let mut v = cur.value;
                    v.spec = p.spec.clone();
                    store
                        .update_typed(&p.name, &v, &cur.revision)
                        .await
                        .map(|_| ())
                }
            };
            match result {
                Ok(()) => break,
                Err(StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod office_tests {
    use std::time::{Duration, Instant};

    use super::{Elected, Office, OperatorSettings};

    fn settings() -> OperatorSettings {
        OperatorSettings {
            pod_ipam: None,
            cluster: ipam_config::ClusterSettings::default(),
            elect: true,
        }
    }

    fn elected(term: u64, leading: bool) -> Elected {
        let until = if leading {
            Instant::now() + Duration::from_secs(60)
        } else {
            Instant::now() - Duration::from_millis(1)
        };
        Elected {
            until: Some(until),
            term,
        }
    }

    /// A pass that outlasts the lease's deadline sees this replica not leading; the renewal
    /// under way then succeeds within the same election term. The operator must act again:
    /// it once kept the term's number and dropped its controller, and from then on led
    /// without acting, silently (a node's blocks were never freed after an etcd outage).
    #[test]
    fn a_lapse_seen_between_two_renewals_of_one_term_does_not_leave_the_office_empty() {
        let settings = settings();
        let mut office = Office::default();
        assert!(office.follow(elected(1, true), &settings), "a first term");
        assert!(office.term.is_some());
        assert!(!office.follow(elected(1, true), &settings), "a renewal");
        assert!(!office.follow(elected(1, false), &settings), "a lapse");
        assert!(office.term.is_none(), "nothing acts while not leading");
        assert!(
            office.follow(elected(1, true), &settings),
            "leading again: a fresh controller, restored from the store"
        );
        assert!(office.term.is_some());
    }
}
