//! The operator's IPAM controller: validates pools, keeps the block allocator in line with them,
//! and gives nodes the blocks their NodeIPAM records ask for. Results and errors go to the
//! status of the objects, in words that say what to do.
//!
//! Written against the `TypedStore` trait only, so it runs unchanged on every store.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use thiserror::Error;

use crate::store::{
    Revision, StoreError, TypedStore, Versioned,
    lease::{Lease, LeaseObserver},
};
use crate::{
    Family,
    meta::Condition,
    pod::blocks::{BlockAllocator, BlockError},
    pod::pool::{IpamMode, ModeMismatch, Pool, check_mode, check_no_overlap, validate},
    resources::{
        AllocatedBlock, CLUSTER, ClusterNode, FamilyUsageStatus, IpamConfig, NodeIpam,
        NodeIpamStatus, PodIpPool, PoolStatus, node_lease_name,
    },
};

#[derive(Debug, Error)]
pub enum OperatorError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Mode(#[from] ModeMismatch),
    #[error("stopped the pass: no longer the leading operator (the lease was not renewed in time)")]
    NotLeading,
}

/// Records the IPAM mode on first start and refuses a different one afterwards.
pub async fn record_mode<S: TypedStore>(store: &S, mode: IpamMode) -> Result<(), OperatorError> {
    loop {
        match store.get_typed::<IpamConfig>(CLUSTER).await? {
            Some(current) => return Ok(check_mode(Some(current.value.mode), mode)?),
            None => match store.create_typed(CLUSTER, &IpamConfig { mode }).await {
                Ok(_) => return Ok(()),
                // Another daemon recorded it first: check against what it recorded.
                Err(StoreError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e.into()),
            },
        }
    }
}

/// What one reconciliation did, for logs and tests.
#[derive(Debug, Default)]
pub struct Report {
    pub assigned: Vec<(String, AllocatedBlock)>,
    pub released: Vec<(String, AllocatedBlock)>,
    /// Blocks a returning node asked back and got.
    pub reclaimed: Vec<(String, AllocatedBlock)>,
    /// Blocks a returning node asked back that another node holds now.
    pub lost: Vec<(String, AllocatedBlock)>,
    /// Nodes whose lease lapsed for the grace period; their blocks went back to the pools.
    pub expired_nodes: Vec<String>,
    /// Nodes whose lease lapsed for the grace period in this pass, whose blocks stay theirs
    /// because the cluster still has their Node object (reported once per lapse).
    pub kept_nodes: Vec<String>,
    /// (object, message) for every object that is not ready.
    pub problems: Vec<(String, String)>,
    /// What went wrong for the first time in this pass (a problem already recorded in the
    /// object's status is not reported again): what monitoring counts and users are told.
    pub events: Vec<PoolEvent>,
    /// Every pool's blocks after the pass, by family.
    pub usage: Vec<(String, Vec<FamilyUsageStatus>)>,
}

/// Something users must see about a pod IP pool, reported once when it happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolEvent {
    /// A node asked for a block and the pool had none left.
    Exhausted {
        pool: String,
        family: Family,
        node: String,
    },
    /// The pool's spec was refused (invalid, overlapping, or a change that cannot be made);
    /// the pool keeps working with its last accepted spec, if any.
    Refused { pool: String, message: String },
}

impl PoolEvent {
    pub fn pool(&self) -> &str {
        match self {
            Self::Exhausted { pool, .. } | Self::Refused { pool, .. } => pool,
        }
    }

    /// A stable name for logs and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Exhausted { .. } => "exhausted",
            Self::Refused { .. } => "refused",
        }
    }
}

pub struct Operator {
    mode: IpamMode,
    blocks: BlockAllocator,
    restored: bool,
    /// Set in the cluster roles: how long a node's lease may stay unrenewed before its blocks
    /// go back to the pools.
    node_grace: Option<Duration>,
    leases: LeaseObserver,
    /// Lapsed nodes whose blocks are kept while their Node object exists (reported once).
    kept: BTreeSet<String>,
    /// The leading operator acts only until then (its leadership could lapse after).
    deadline: Option<Instant>,
}

const READY: &str = "Ready";

/// `ours` followed by the conditions of `record` that another controller owns (the dead-node
/// marking's, say): each controller writes only its own types.
fn with_others_kept(mut ours: Vec<Condition>, record: &NodeIpam) -> Vec<Condition> {
    ours.extend(
        record
            .status
            .conditions
            .iter()
            .filter(|c| c.kind != READY && c.kind != crate::resources::LEASE_LAPSED)
            .cloned(),
    );
    ours
}

/// Node statuses written at once, and how many of them a pass writes before it checks again
/// that it still leads.
const WRITES_IN_FLIGHT: usize = 64;
const WRITE_BATCH: usize = 512;

impl Operator {
    pub fn new(mode: IpamMode) -> Self {
        Self {
            mode,
            blocks: BlockAllocator::new(),
            restored: false,
            node_grace: None,
            leases: LeaseObserver::new(),
            kept: BTreeSet::new(),
            deadline: None,
        }
    }

    /// Frees the blocks of nodes whose liveness lease stayed unrenewed for `grace`, as seen by
    /// this operator: a restarted operator waits a full grace before it frees anything.
    pub fn with_node_grace(mut self, grace: Duration) -> Self {
        self.node_grace = Some(grace);
        self
    }

    /// Stops every pass that would write after `deadline` (the end of this operator's
    /// leadership, as far as it knows); `None` for a single operator without an election.
    pub fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    fn check_deadline(&self) -> Result<(), OperatorError> {
        match self.deadline {
            Some(d) if Instant::now() >= d => Err(OperatorError::NotLeading),
            _ => Ok(()),
        }
    }

    /// Whether the pools and blocks were restored from the store (on the first pass): until
    /// then a pass must read what the store holds, not a copy that may be behind it.
    pub fn restored(&self) -> bool {
        self.restored
    }

    pub fn blocks(&self) -> &BlockAllocator {
        &self.blocks
    }

    /// One pass over pools and nodes. Safe to run at any time and as often as wanted.
    pub async fn reconcile<S: TypedStore>(&mut self, store: &S) -> Result<Report, OperatorError> {
        let mut report = Report::default();
        let pools = store.list_typed::<PodIpPool>().await?;
        let nodes = store.list_typed::<NodeIpam>().await?;
        // Restore the pools as last accepted, then blocks held, before deciding anything new:
        // a restarted operator must not hand out a block twice.
        if !self.restored {
            for p in &pools {
                if let Some(spec) = &p.value.status.accepted_spec
                    && let Ok(pool) = validate(&p.name, spec)
                {
                    let _ = self.blocks.upsert_pool(pool);
                }
            }
            for n in &nodes {
                for b in &n.value.status.allocated {
                    if let Err(e) = self.blocks.restore(&n.name, &b.pool, b.cidr) {
                        report
                            .problems
                            .push((format!("NodeIPAM {}", n.name), e.to_string()));
                    }
                }
            }
            self.restored = true;
        }
        let statuses = self.judge_pools(&pools, &mut report);
        let expired = self.expired_nodes(store, &nodes, &mut report).await?;
        let mut writes = Vec::new();
        for node in &nodes {
            let _span = tracing::debug_span!("node", node = node.name.as_str()).entered();
            let write = if expired.contains(&node.name) {
                self.release_node(node, &mut report)
            } else {
                self.reconcile_node(node, &mut report)
            };
            writes.extend(write);
        }
        self.write_node_statuses(store, writes).await?;
        // One write per changed pool, conditions and usage together, after the nodes got their
        // blocks so the usage is current.
        for (p, mut status) in pools.iter().zip(statuses) {
            status.usage = self.usage(&p.name);
            report.usage.push((p.name.clone(), status.usage.clone()));
            if status != p.value.status {
                let mut updated = p.value.clone();
                updated.status = status;
                self.check_deadline()?;
                // A conflict means someone changed the pool: the next pass sees the change.
                store
                    .update_status_unless_changed(&p.name, &updated, &p.revision)
                    .await?;
            }
        }
        Ok(report)
    }

    /// Validates every pool and brings the block allocator in line; returns each pool's new
    /// status (conditions, accepted spec; usage is filled in later), in the order given.
    fn judge_pools(
        &mut self,
        pools: &[Versioned<PodIpPool>],
        report: &mut Report,
    ) -> Vec<PoolStatus> {
        let mut accepted: Vec<Pool> = Vec::new();
        let mut statuses = Vec::with_capacity(pools.len());
        for p in pools {
            let _span = tracing::debug_span!("pool", pool = p.name.as_str()).entered();
            let mut status = p.value.status.clone();
            let outcome = if self.mode == IpamMode::ClusterPool && p.name != "default" {
                Err(
                    "not used: cluster-pool mode takes addresses only from pool default; use \
                     multi-pool mode for named pools"
                        .to_owned(),
                )
            } else {
                validate(&p.name, &p.value.spec)
                    .map_err(|e| e.to_string())
                    .and_then(|pool| {
                        check_no_overlap(&pool, &accepted).map_err(|e| e.to_string())?;
                        self.blocks
                            .upsert_pool(pool.clone())
                            .map_err(|e| e.to_string())?;
                        Ok(pool)
                    })
            };
            match outcome {
                Ok(pool) => {
                    accepted.push(pool);
                    status.accepted_spec = Some(p.value.spec.clone());
                    status.conditions = vec![Condition::new(READY, true, "pool is in use")];
                }
                Err(message) => {
                    let already_told = p
                        .value
                        .status
                        .conditions
                        .iter()
                        .any(|c| !c.status && c.message == message);
                    if !already_told {
                        report.events.push(PoolEvent::Refused {
                            pool: p.name.clone(),
                            message: message.clone(),
                        });
                    }
                    // A refused change keeps the pool working with its last accepted spec.
                    if let Some(pool) = status
                        .accepted_spec
                        .as_ref()
                        .and_then(|s| validate(&p.name, s).ok())
                    {
                        accepted.push(pool);
                    }
                    report
                        .problems
                        .push((format!("PodIPPool {}", p.name), message.clone()));
                    status.conditions = vec![Condition::new(READY, false, message)];
                }
            }
            statuses.push(status);
        }
        statuses
    }

    /// The (pool, family, count) a node should hold in the current mode.
    fn wanted(&self, node: &NodeIpam) -> Vec<(String, Family, u32)> {
        match self.mode {
            IpamMode::ClusterPool => [Family::V4, Family::V6]
                .into_iter()
                .filter(|f| {
                    self.blocks
                        .pool("default")
                        .is_some_and(|p| p.family(*f).is_some())
                })
                .map(|f| ("default".to_owned(), f, 1))
                .collect(),
            // An agent asks for both families of every pool its pods use (it does not read the
            // pools): a family the pool does not have is not served, and is no problem of the
            // node's. A pool that does not exist is (the request says so in the node's status).
            IpamMode::MultiPool => node
                .spec
                .pools
                .iter()
                .filter(|r| {
                    self.blocks
                        .pool(&r.pool)
                        .is_none_or(|p| p.family(r.family).is_some())
                })
                .map(|r| (r.pool.clone(), r.family, r.needed))
                .collect(),
            // The node's blocks come from Node.spec.podCIDRs; nothing to hand out.
            IpamMode::Kubernetes => Vec::new(),
        }
    }

    /// Decides a node's blocks; returns its record with the new status, if the status changed.
    fn reconcile_node(
        &mut self,
        node: &Versioned<NodeIpam>,
        report: &mut Report,
    ) -> Option<Versioned<NodeIpam>> {
        let name = &node.name;
        let mut problems = Vec::new();
        // A returning node's old blocks first, so it gets them back rather than new ones.
        let (reclaimed, lost) = self.restore_reclaimed(node, report);
        self.release_returned(node, report, &mut problems);
        self.allocate_wanted(node, report, &mut problems);
        self.say_if_over_bound(&node.name, &mut problems);
        let mut allocated = self.held_by(node);
        allocated.extend(reclaimed);
        let conditions = if problems.is_empty() {
            vec![Condition::new(READY, true, "blocks assigned")]
        } else {
            for p in &problems {
                report
                    .problems
                    .push((format!("NodeIPAM {name}"), p.clone()));
            }
            vec![Condition::new(READY, false, problems.join("; "))]
        };
        let status = NodeIpamStatus {
            allocated: allocated.into_iter().collect(),
            lost,
            conditions: with_others_kept(conditions, &node.value),
        };
        (status != node.value.status).then(|| {
            let mut updated = node.clone();
            updated.value.status = status;
            updated
        })
    }

    /// Takes back the blocks a returning node still holds (its reclaim list): the ones restored,
    /// and the ones that cannot be (given to another node meanwhile).
    fn restore_reclaimed(
        &mut self,
        node: &Versioned<NodeIpam>,
        report: &mut Report,
    ) -> (Vec<AllocatedBlock>, Vec<AllocatedBlock>) {
        let name = &node.name;
        let mut reclaimed = Vec::new();
        let mut lost = Vec::new();
        for b in &node.value.spec.reclaim {
            match self.blocks.restore(name, &b.pool, b.cidr) {
                Ok(()) => {
                    if !node.value.status.allocated.contains(b) {
                        report.reclaimed.push((name.clone(), b.clone()));
                    }
                    reclaimed.push(b.clone());
                }
                Err(e) => {
                    if !node.value.status.lost.contains(b) {
                        report.lost.push((name.clone(), b.clone()));
                        tracing::warn!(node = name.as_str(), block = %b.cidr, "block cannot be given back: {e}");
                    }
                    lost.push(b.clone());
                }
            }
        }
        // Not bounded: a reclaimed block may hold addresses the node's pods still use, and one
        // refused would go to another node while they keep them (found by review). Beyond the
        // bound the node gets no new block, and its record says so (`say_if_over_bound`).
        (reclaimed, lost)
    }

    /// Says, for every pool and family of which `node` holds more blocks than the pool's
    /// bound, that it does and that it gets no new one: blocks it reclaimed on a return (given
    /// back whatever the bound, as its pods may use them), or given before the bound was
    /// lowered. Checked at every pass, so the condition stays while it holds more.
    fn say_if_over_bound(&self, node: &str, problems: &mut Vec<String>) {
        let mut held: BTreeMap<(String, Family), usize> = BTreeMap::new();
        for (pool, block) in self.blocks.held_by_node(node) {
            *held.entry((pool.clone(), block.family())).or_default() += 1;
        }
        for ((pool, family), held) in held {
            if let Some(max) = self
                .max_blocks_per_node(&pool, family)
                .filter(|max| held > *max as usize)
            {
                problems.push(format!(
                    "holds {held} {} blocks of pool {pool}, more than one node may ({max}, the \
                     pool's maxBlocksPerNode): blocks it reclaimed on a return, kept as its \
                     pods may use them, or given before the bound was lowered; it gets no new \
                     block of the pool while it holds more than {max} (raise maxBlocksPerNode \
                     if it runs that many pods)",
                    family.name()
                ));
            }
        }
    }

    /// The most blocks of `family` one node may hold of `pool` (none: no such pool or family,
    /// which the allocation reports by itself).
    fn max_blocks_per_node(&self, pool: &str, family: Family) -> Option<u32> {
        self.blocks
            .pool(pool)?
            .family(family)
            .map(|f| f.max_blocks_per_node)
    }

    /// Frees the blocks the node gives back.
    fn release_returned(
        &mut self,
        node: &Versioned<NodeIpam>,
        report: &mut Report,
        problems: &mut Vec<String>,
    ) {
        let name = &node.name;
        for request in &node.value.spec.pools {
            for cidr in &request.release {
                let held = self.blocks.blocks_of(name, &request.pool, cidr.family());
                if held.contains(cidr) {
                    self.blocks
                        .release(name, &request.pool, *cidr)
                        .map_err(|e| problems.push(e.to_string()))
                        .ok();
                    report.released.push((
                        name.clone(),
                        AllocatedBlock {
                            pool: request.pool.clone(),
                            cidr: *cidr,
                        },
                    ));
                }
            }
        }
    }

    /// Gives the node blocks until it holds as many as it asks for per pool and family; an
    /// exhausted pool is a problem, told once as an event.
    fn allocate_wanted(
        &mut self,
        node: &Versioned<NodeIpam>,
        report: &mut Report,
        problems: &mut Vec<String>,
    ) {
        let name = &node.name;
        for (pool, family, asked) in self.wanted(&node.value) {
            let needed = match self.max_blocks_per_node(&pool, family) {
                Some(max) if asked > max => {
                    problems.push(format!(
                        "asks for {asked} {} blocks of pool {pool}, more than one node may \
                         hold ({max}, the pool's maxBlocksPerNode): it gets no more than {max}; \
                         raise maxBlocksPerNode if this node runs that many pods",
                        family.name()
                    ));
                    max
                }
                _ => asked,
            };
            while self.blocks.blocks_of(name, &pool, family).len() < needed as usize {
                match self.blocks.allocate(name, &pool, family) {
                    Ok(cidr) => report.assigned.push((
                        name.clone(),
                        AllocatedBlock {
                            pool: pool.clone(),
                            cidr,
                        },
                    )),
                    Err(e) => {
                        // The message counts the holders, which change while the pool stays
                        // exhausted: the node's condition is matched on what stays the same.
                        let exhausted = format!("pool {pool} ({}) is exhausted", family.name());
                        let already_told = node
                            .value
                            .status
                            .conditions
                            .iter()
                            .any(|c| !c.status && c.message.contains(&exhausted));
                        if let BlockError::Exhausted { .. } = e
                            && !already_told
                        {
                            report.events.push(PoolEvent::Exhausted {
                                pool: pool.clone(),
                                family,
                                node: name.clone(),
                            });
                        }
                        problems.push(e.to_string());
                        break;
                    }
                }
            }
        }
    }

    /// The blocks the node holds: of the pools it asks for, and of pools it no longer asks for
    /// until it releases them.
    fn held_by(&self, node: &Versioned<NodeIpam>) -> BTreeSet<AllocatedBlock> {
        let name = &node.name;
        let mut allocated: BTreeSet<AllocatedBlock> = BTreeSet::new();
        for (pool, family, _) in self.wanted(&node.value) {
            for cidr in self.blocks.blocks_of(name, &pool, family) {
                allocated.insert(AllocatedBlock {
                    pool: pool.clone(),
                    cidr,
                });
            }
        }
        // Blocks held in pools the node no longer asks for stay listed until released.
        for b in &node.value.status.allocated {
            if self
                .blocks
                .blocks_of(name, &b.pool, b.cidr.family())
                .contains(&b.cidr)
            {
                allocated.insert(b.clone());
            }
        }
        allocated
    }

    /// Writes the nodes' new statuses, many at once: the store orders them, and a store like
    /// etcd commits concurrent writes together, so a thousand nodes joining do not wait for a
    /// thousand round trips one after the other. If a node changed its record meanwhile, its
    /// blocks stay held and the status is written on the next pass.
    async fn write_node_statuses<S: TypedStore>(
        &self,
        store: &S,
        writes: Vec<Versioned<NodeIpam>>,
    ) -> Result<(), OperatorError> {
        use futures_util::{StreamExt as _, TryStreamExt as _};
        for batch in writes.chunks(WRITE_BATCH) {
            self.check_deadline()?;
            // The futures are made here, not in a closure of the stream: a closure over the
            // borrowed records would not be provably Send for every lifetime.
            let pending: Vec<_> = batch
                .iter()
                .map(|n| store.update_status_unless_changed(&n.name, &n.value, &n.revision))
                .collect();
            futures_util::stream::iter(pending)
                .buffer_unordered(WRITES_IN_FLIGHT)
                .try_collect::<Vec<bool>>()
                .await?;
        }
        Ok(())
    }

    /// The nodes whose liveness lease has not changed for the grace period, as seen by this
    /// operator (never any without a grace period, as in the standalone role), and whose Node
    /// object, where the store has such objects (Kubernetes), is gone: a Node that still
    /// exists keeps its blocks however long it is away ([`ClusterNode`]).
    async fn expired_nodes<S: TypedStore>(
        &mut self,
        store: &S,
        nodes: &[Versioned<NodeIpam>],
        report: &mut Report,
    ) -> Result<BTreeSet<String>, OperatorError> {
        let Some(grace) = self.node_grace else {
            return Ok(BTreeSet::new());
        };
        let leases: std::collections::HashMap<String, Revision> = store
            .list_typed::<Lease>()
            .await?
            .into_iter()
            .map(|l| (l.name, l.revision))
            .collect();
        let now = Instant::now();
        let mut expired = BTreeSet::new();
        let mut kept = BTreeSet::new();
        for node in nodes {
            let lease = node_lease_name(&node.name);
            self.leases.observe(&lease, leases.get(&lease), now);
            if self.leases.unchanged_for(&lease, now) < grace {
                continue;
            }
            // Only a lapsed node is looked up: a pass reads no Node while all are alive.
            if store.get_typed::<ClusterNode>(&node.name).await?.is_some() {
                if !self.kept.contains(&node.name) {
                    report.kept_nodes.push(node.name.clone());
                }
                kept.insert(node.name.clone());
            } else {
                expired.insert(node.name.clone());
            }
        }
        self.kept = kept;
        Ok(expired)
    }

    /// Gives every block of a node whose lease lapsed back to the pools; its record says so.
    fn release_node(
        &mut self,
        node: &Versioned<NodeIpam>,
        report: &mut Report,
    ) -> Option<Versioned<NodeIpam>> {
        let name = &node.name;
        let grace = self.node_grace.unwrap_or_default();
        for b in &node.value.status.allocated {
            if self.blocks.release(name, &b.pool, b.cidr).is_ok() {
                report.released.push((name.clone(), b.clone()));
            }
        }
        let released = Condition::new(
            READY,
            false,
            format!(
                "node lease {} not renewed for {} s (the grace period): its blocks went back to \
                 the pools; the node's agent asks for them again when it returns",
                node_lease_name(name),
                grace.as_secs()
            ),
        );
        let lapsed = Condition::new(
            crate::resources::LEASE_LAPSED,
            true,
            "released by the operator",
        );
        let status = NodeIpamStatus {
            allocated: Vec::new(),
            lost: Vec::new(),
            conditions: with_others_kept(vec![released, lapsed], &node.value),
        };
        if status == node.value.status {
            return None;
        }
        if !node.value.status.allocated.is_empty() {
            report.expired_nodes.push(name.clone());
        }
        let mut updated = node.clone();
        updated.value.status = status;
        Some(updated)
    }

    fn usage(&self, pool: &str) -> Vec<FamilyUsageStatus> {
        [Family::V4, Family::V6]
            .into_iter()
            .filter_map(|f| self.blocks.usage(pool, f).ok())
            .map(|u| FamilyUsageStatus {
                family: u.family,
                cidrs: u.cidrs,
                mask_size: u.mask,
                total_blocks: u.total_blocks,
                used_blocks: u.used_blocks,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        Cidr,
        pod::pool::{FamilySpec, PodIpPoolSpec},
        resources::PoolRequest,
        store::embedded::EmbeddedStore,
    };

    fn temp(name: &str) -> crate::test_util::TempPath {
        crate::test_util::TempPath::new(&format!("operator-{name}.redb"))
    }

    fn v4_pool(cidrs: &[&str], mask: u8) -> PodIpPool {
        PodIpPool {
            spec: PodIpPoolSpec {
                reserved: Vec::new(),
                reservations: Vec::new(),
                ipv4: Some(FamilySpec {
                    cidrs: cidrs.iter().map(std::string::ToString::to_string).collect(),
                    mask_size: mask,
                }),
                ipv6: None,
                namespaces: Vec::new(),
                namespace_selector: Default::default(),
                max_blocks_per_node: None,
            },
            status: PoolStatus::default(),
        }
    }

    async fn set_pool(s: &EmbeddedStore, name: &str, pool: PodIpPool) {
        match s.get_typed::<PodIpPool>(name).await.unwrap() {
            None => {
                s.create_typed(name, &pool).await.unwrap();
            }
            Some(cur) => {
                let mut v = cur.value;
                v.spec = pool.spec;
                s.update_typed(name, &v, &cur.revision).await.unwrap();
            }
        }
    }

    async fn held(s: &EmbeddedStore, name: &str) -> BTreeSet<Cidr> {
        node_status(s, name)
            .await
            .allocated
            .iter()
            .map(|b| b.cidr)
            .collect()
    }

    async fn node_status(s: &EmbeddedStore, name: &str) -> NodeIpamStatus {
        s.get_typed::<NodeIpam>(name)
            .await
            .unwrap()
            .unwrap()
            .value
            .status
    }

    async fn pool_spec_and_status(s: &EmbeddedStore, name: &str) -> PodIpPool {
        s.get_typed::<PodIpPool>(name).await.unwrap().unwrap().value
    }

    /// A condition another controller set on a node's record (the dead-node marking's) outlives
    /// the operator's passes, a block assigned meanwhile among them: each writes its own types.
    #[tokio::test]
    async fn a_pass_keeps_the_conditions_another_controller_owns() {
        let path = temp("kept-conditions");
        let s = EmbeddedStore::open(&path).unwrap();
        record_mode(&s, IpamMode::ClusterPool).await.unwrap();
        set_pool(&s, "default", v4_pool(&["10.244.0.0/16"], 24)).await;
        let mut record = NodeIpam::default();
        let marked = Condition::new(
            crate::resources::PODS_MARKED_NOT_READY,
            true,
            "set not ready on the reports of a majority",
        );
        record.status.conditions.push(marked.clone());
        s.create_typed("node-1", &record).await.unwrap();
        let mut op = Operator::new(IpamMode::ClusterPool);
        op.reconcile(&s).await.unwrap();
        op.reconcile(&s).await.unwrap();
        let status = node_status(&s, "node-1").await;
        assert_eq!(status.allocated.len(), 1, "{status:?}");
        assert!(status.conditions.contains(&marked), "{status:?}");
        assert!(
            status
                .conditions
                .iter()
                .any(|c| c.kind == READY && c.status),
            "{status:?}"
        );
    }

    /// The cluster-pool seed through the store: 256 nodes served, node 257's record says why it
    /// has no block and what to do, appending a CIDR serves it without touching the others, a
    /// mask change is refused in the pool's status while the pool keeps working.
    #[tokio::test]
    async fn seed_cluster_pool_through_the_store() {
        let path = temp("seed");
        let s = EmbeddedStore::open(&path).unwrap();
        record_mode(&s, IpamMode::ClusterPool).await.unwrap();
        set_pool(&s, "default", v4_pool(&["10.244.0.0/16"], 24)).await;
        for n in 1..=257 {
            s.create_typed(&format!("node-{n:03}"), &NodeIpam::default())
                .await
                .unwrap();
        }
        let mut op = Operator::new(IpamMode::ClusterPool);
        let report = op.reconcile(&s).await.unwrap();
        assert_eq!(report.assigned.len(), 256);
        let first = node_status(&s, "node-001").await;
        assert_eq!(first.allocated[0].cidr.to_string(), "10.244.0.0/24");
        let failed = node_status(&s, "node-257").await;
        assert!(failed.allocated.is_empty());
        let msg = &failed.conditions[0].message;
        assert!(
            !failed.conditions[0].status
                && msg.contains("exhausted")
                && msg.contains("Append a CIDR"),
            "{msg}"
        );
        assert_eq!(
            report.events,
            vec![PoolEvent::Exhausted {
                pool: "default".into(),
                family: Family::V4,
                node: "node-257".into()
            }]
        );
        // Told once: the next pass finds it in the node's record.
        assert!(op.reconcile(&s).await.unwrap().events.is_empty());
        let pool = pool_spec_and_status(&s, "default").await;
        assert_eq!(
            (
                pool.status.usage[0].total_blocks,
                pool.status.usage[0].used_blocks
            ),
            (256, 256)
        );

        set_pool(
            &s,
            "default",
            v4_pool(&["10.244.0.0/16", "10.245.0.0/16"], 24),
        )
        .await;
        op.reconcile(&s).await.unwrap();
        assert_eq!(
            node_status(&s, "node-257").await.allocated[0]
                .cidr
                .to_string(),
            "10.245.0.0/24"
        );
        assert_eq!(node_status(&s, "node-001").await.allocated, first.allocated);

        set_pool(
            &s,
            "default",
            v4_pool(&["10.244.0.0/16", "10.245.0.0/16"], 25),
        )
        .await;
        let report = op.reconcile(&s).await.unwrap();
        let pool = pool_spec_and_status(&s, "default").await;
        assert!(!pool.status.conditions[0].status);
        assert!(
            pool.status.conditions[0].message.contains("/24 to /25"),
            "{:?}",
            pool.status
        );
        assert_eq!(
            pool.status.accepted_spec.unwrap().ipv4.unwrap().mask_size,
            24
        );
        assert!(report.assigned.is_empty());
        assert_eq!(
            report
                .events
                .iter()
                .map(|e| (e.pool(), e.reason()))
                .collect::<Vec<_>>(),
            [("default", "refused")]
        );
        assert!(op.reconcile(&s).await.unwrap().events.is_empty());
        // A new node is still served from the accepted /24 spec.
        s.create_typed("node-258", &NodeIpam::default())
            .await
            .unwrap();
        op.reconcile(&s).await.unwrap();
        assert_eq!(
            node_status(&s, "node-258").await.allocated[0]
                .cidr
                .to_string(),
            "10.245.1.0/24"
        );
    }

    #[tokio::test]
    async fn restarted_operator_never_gives_a_block_twice() {
        let path = temp("restart");
        let s = EmbeddedStore::open(&path).unwrap();
        set_pool(&s, "tenant-a", v4_pool(&["10.250.0.0/24"], 26)).await;
        let want = |n| NodeIpam {
            spec: crate::resources::NodeIpamSpec {
                pools: vec![PoolRequest {
                    pool: "tenant-a".into(),
                    family: Family::V4,
                    needed: n,
                    release: vec![],
                }],
                ..Default::default()
            },
            status: NodeIpamStatus::default(),
        };
        s.create_typed("a", &want(2)).await.unwrap();
        Operator::new(IpamMode::MultiPool)
            .reconcile(&s)
            .await
            .unwrap();
        // A new operator process: restores from the records, then serves b.
        s.create_typed("b", &want(2)).await.unwrap();
        Operator::new(IpamMode::MultiPool)
            .reconcile(&s)
            .await
            .unwrap();
        let (a, b) = (held(&s, "a").await, held(&s, "b").await);
        assert_eq!((a.len(), b.len()), (2, 2));
        assert!(a.is_disjoint(&b), "{a:?} {b:?}");
    }

    /// A node's record is its agent's word, and a compromised agent may ask for every block
    /// of a pool: it gets no more than the pool's `maxBlocksPerNode`, its record says why, and
    /// the other nodes are still served. Blocks it lists to reclaim are given back beyond the
    /// bound (its pods may use them: refused, they would go to another node), its record says
    /// so, and it gets no new block while over.
    #[tokio::test]
    async fn one_node_cannot_take_more_than_max_blocks_per_node_by_asking_or_reclaiming() {
        let path = temp("bounded");
        let s = EmbeddedStore::open(&path).unwrap();
        let mut bounded = v4_pool(&["10.252.0.0/24"], 28);
        bounded.spec.max_blocks_per_node = Some(3);
        set_pool(&s, "tenant-a", bounded).await;
        let request = |needed| PoolRequest {
            pool: "tenant-a".into(),
            family: Family::V4,
            needed,
            release: vec![],
        };
        let asking = |needed| NodeIpam {
            spec: crate::resources::NodeIpamSpec {
                pools: vec![request(needed)],
                ..Default::default()
            },
            status: NodeIpamStatus::default(),
        };
        s.create_typed("greedy", &asking(16)).await.unwrap();
        s.create_typed("honest", &asking(2)).await.unwrap();
        let mut op = Operator::new(IpamMode::MultiPool);
        op.reconcile(&s).await.unwrap();
        assert_eq!(held(&s, "greedy").await.len(), 3);
        assert_eq!(held(&s, "honest").await.len(), 2);
        let status = node_status(&s, "greedy").await;
        let ready = status.conditions.iter().find(|c| c.kind == READY).unwrap();
        assert!(
            !ready.status && ready.message.contains("maxBlocksPerNode"),
            "{ready:?}"
        );

        // Returning with 5 blocks to reclaim (a /28 each) and asking for 6: it keeps the 5,
        // gets no new one, and its record says it holds more than the bound.
        let listed: Vec<AllocatedBlock> = (6..11)
            .map(|i| AllocatedBlock {
                pool: "tenant-a".into(),
                cidr: format!("10.252.0.{}/28", i * 16).parse().unwrap(),
            })
            .collect();
        let mut returning = asking(6);
        returning.spec.reclaim = listed.clone();
        s.create_typed("returning", &returning).await.unwrap();
        op.reconcile(&s).await.unwrap();
        let status = node_status(&s, "returning").await;
        let kept: BTreeSet<_> = status.allocated.iter().cloned().collect();
        assert_eq!(kept, listed.iter().cloned().collect(), "{status:?}");
        let ready = status.conditions.iter().find(|c| c.kind == READY).unwrap();
        assert!(
            !ready.status
                && ready
                    .message
                    .contains("holds 5 IPv4 blocks of pool tenant-a"),
            "{ready:?}"
        );
        // Its agent drops from `reclaim` what the status now lists: the condition stays.
        let current = s.get_typed::<NodeIpam>("returning").await.unwrap().unwrap();
        let mut settled = current.value.clone();
        settled.spec.reclaim.clear();
        s.update_typed("returning", &settled, &current.revision)
            .await
            .unwrap();
        op.reconcile(&s).await.unwrap();
        let status = node_status(&s, "returning").await;
        let ready = status.conditions.iter().find(|c| c.kind == READY).unwrap();
        assert!(ready.message.contains("holds 5 IPv4 blocks"), "{ready:?}");
        // The others are still served.
        s.create_typed("late", &asking(3)).await.unwrap();
        op.reconcile(&s).await.unwrap();
        assert_eq!(held(&s, "late").await.len(), 3);
        assert_eq!(held(&s, "returning").await.len(), 5);

        // With no bound given, a pool of /28 blocks lets a node hold 64 (1,024 addresses).
        assert_eq!(
            crate::pod::pool::default_max_blocks_per_node(Family::V4, 28),
            64
        );
        assert_eq!(
            crate::pod::pool::default_max_blocks_per_node(Family::V6, 104),
            1
        );
    }

    /// A node asking a v4-only pool for an IPv6 block too (agents ask for both families) gets
    /// its v4 block and stays ready: no problem is reported for the family the pool lacks.
    #[tokio::test]
    async fn a_family_the_pool_lacks_is_not_a_problem_of_the_node() {
        let path = temp("family");
        let s = EmbeddedStore::open(&path).unwrap();
        set_pool(&s, "tenant-a", v4_pool(&["10.251.0.0/24"], 26)).await;
        let request = |family| PoolRequest {
            pool: "tenant-a".into(),
            family,
            needed: 1,
            release: vec![],
        };
        let record = NodeIpam {
            spec: crate::resources::NodeIpamSpec {
                pools: vec![request(Family::V4), request(Family::V6)],
                ..Default::default()
            },
            status: NodeIpamStatus::default(),
        };
        s.create_typed("a", &record).await.unwrap();
        let report = Operator::new(IpamMode::MultiPool)
            .reconcile(&s)
            .await
            .unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        let status = node_status(&s, "a").await;
        assert_eq!(status.allocated.len(), 1, "{status:?}");
        assert!(
            status.conditions.iter().all(|c| c.status),
            "{:?}",
            status.conditions
        );
    }

    #[tokio::test]
    async fn overlapping_pool_is_marked_and_mode_change_refused() {
        let path = temp("overlap");
        let s = EmbeddedStore::open(&path).unwrap();
        record_mode(&s, IpamMode::MultiPool).await.unwrap();
        let e = record_mode(&s, IpamMode::ClusterPool)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("multi-pool") && e.contains("cluster-pool"),
            "{e}"
        );
        set_pool(&s, "default", v4_pool(&["10.244.0.0/16"], 24)).await;
        set_pool(&s, "tenant-a", v4_pool(&["10.244.128.0/20"], 26)).await;
        let report = Operator::new(IpamMode::MultiPool)
            .reconcile(&s)
            .await
            .unwrap();
        let t = s
            .get_typed::<PodIpPool>("tenant-a")
            .await
            .unwrap()
            .unwrap()
            .value;
        let msg = &t.status.conditions[0].message;
        assert!(
            msg.contains("tenant-a") && msg.contains("default") && msg.contains("overlaps"),
            "{msg}"
        );
        assert_eq!(report.problems.len(), 1);
    }

    #[tokio::test]
    async fn cluster_pool_dual_stack_gives_one_block_per_family() {
        let path = temp("dual");
        let s = EmbeddedStore::open(&path).unwrap();
        let pool = PodIpPool {
            spec: PodIpPoolSpec {
                reserved: Vec::new(),
                reservations: Vec::new(),
                ipv4: Some(FamilySpec {
                    cidrs: vec!["10.244.0.0/16".into()],
                    mask_size: 24,
                }),
                ipv6: Some(FamilySpec {
                    cidrs: vec!["fd00::/104".into()],
                    mask_size: 120,
                }),
                namespaces: Vec::new(),
                namespace_selector: Default::default(),
                max_blocks_per_node: None,
            },
            status: PoolStatus::default(),
        };
        set_pool(&s, "default", pool).await;
        s.create_typed("n1", &NodeIpam::default()).await.unwrap();
        s.create_typed("n2", &NodeIpam::default()).await.unwrap();
        let mut op = Operator::new(IpamMode::ClusterPool);
        op.reconcile(&s).await.unwrap();
        op.reconcile(&s).await.unwrap();
        let n2: Vec<String> = node_status(&s, "n2")
            .await
            .allocated
            .iter()
            .map(|b| b.cidr.to_string())
            .collect();
        assert_eq!(n2, ["10.244.1.0/24", "fd00::100/120"]);
    }
}
