//! The node agent's IPAM controller: keeps the node's NodeIPAM record and its durable allocator
//! in line. It adds the blocks the operator assigned (or, in kubernetes mode, the node's
//! podCIDRs), asks for another block when addresses run short or a request waits, and gives
//! back empty blocks beyond the pre-allocation, but only once its allocations were restored.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::store::{StoreError, TypedStore, Versioned};
use crate::{
    Cidr, Family,
    pod::durable::{DurableAllocator, DurableError, RestoreReport},
    pod::multipool::{Watermarks, needs_block, releasable_blocks},
    pod::pool::IpamMode,
    resources::{AllocatedBlock, NodeIpam, NodeIpamSpec, PoolRequest},
};

/// The IPAM controller of one pool on a node. A node allocating from several pools (multi-pool
/// mode) runs one per pool over the same NodeIPAM record: each keeps the other pools' requests
/// and reclaims as they are, and lists are written in one order.
pub struct NodeAgent {
    node: String,
    pool: String,
    mode: IpamMode,
    watermarks: Watermarks,
    pod_cidrs: Vec<Cidr>,
    alloc: Arc<DurableAllocator>,
    /// Set when an allocation found no block: ask for one even with pre-allocation 0.
    demand: Arc<AtomicBool>,
    /// Blocks asked back from the operator; not used again while the request stands.
    releasing: BTreeSet<Cidr>,
    /// When each empty block was first seen empty.
    empty_since: BTreeMap<Cidr, Instant>,
    /// Blocks another node holds now, still in use here (logged once).
    retired: BTreeSet<Cidr>,
    /// What the node publishes about itself in its record; `None` until the node has looked
    /// (a record is never overwritten with facts not yet known: at an agent's start that
    /// emptied its interfaces and addresses for a moment, and every agent judged the node
    /// unable to announce).
    facts: Option<NodeFacts>,
    release_grace: Duration,
}

/// What a node says about itself in its record: its addresses between nodes (the others route
/// its pods there), its labels and its interfaces (L2 announcement policies select by them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub addresses: Vec<std::net::IpAddr>,
    pub labels: BTreeMap<String, String>,
    pub interfaces: Vec<crate::resources::NodeInterface>,
    /// Interfaces it announced from that it cannot any more, with why.
    pub interfaces_down: Vec<crate::resources::InterfaceDown>,
    /// Whether it may announce Service IPs, and what gets in the way.
    pub announcing: crate::resources::NodeAnnouncing,
    /// The agent's release ([`AGENT_VERSION`]).
    pub agent_version: String,
}

/// The release of this build's agent, written into its node's record.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

impl NodeFacts {
    fn published_in(&self, record: &NodeIpam) -> bool {
        self.addresses == record.spec.addresses
            && self.labels == record.spec.labels
            && self.interfaces == record.spec.interfaces
            && self.interfaces_down == record.spec.interfaces_down
            && self.announcing == record.spec.announcing
            && record.spec.agent_version.as_ref() == Some(&self.agent_version)
    }

    fn publish(&self, record: &mut NodeIpam) {
        record.spec.addresses = self.addresses.clone();
        record.spec.labels = self.labels.clone();
        record.spec.interfaces = self.interfaces.clone();
        record.spec.interfaces_down = self.interfaces_down.clone();
        record.spec.announcing = self.announcing.clone();
        record.spec.agent_version = Some(self.agent_version.clone());
        // A restart notice of the agent before is left alone: the agent ends it once the
        // others hear it (the daemon's `liveness::restart`), not at its first write, when
        // they may still count the node live from the agent before.
    }

    /// Writes the facts into `node`'s record, creating it (with no blocks) when there is none;
    /// `Ok(true)` once the record says so, `Ok(false)` when it changed under us (try again). This is the whole record of a node without pod IPAM (the add-on mode): the
    /// others find its labels, interfaces and gossip address there.
    pub async fn sync_record<S: TypedStore>(
        &self,
        store: &S,
        node: &str,
    ) -> Result<bool, StoreError> {
        let Some(record) = store.get_typed::<NodeIpam>(node).await? else {
            let mut fresh = NodeIpam::default();
            self.publish(&mut fresh);
            return match store.create_typed(node, &fresh).await {
                Ok(_) => Ok(true),
                Err(StoreError::AlreadyExists { .. }) => Ok(false),
                Err(e) => Err(e),
            };
        };
        if self.published_in(&record.value) {
            return Ok(true);
        }
        let mut updated = record.value;
        self.publish(&mut updated);
        store
            .update_unless_changed(node, &updated, &record.revision)
            .await
    }
}

/// How long a block must stay empty before it goes back: a fresh block is empty until the
/// request that asked for it takes its address, and pods come and go.
pub const RELEASE_GRACE: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Durable(#[from] DurableError),
}

impl NodeAgent {
    /// Opens the node's allocation state for `pool` under `state_dir` (restoring every
    /// allocation before anything else can happen).
    pub fn open(
        state_dir: &Path,
        node: &str,
        pool: &str,
        mode: IpamMode,
        watermarks: Watermarks,
        pod_cidrs: Vec<Cidr>,
    ) -> Result<(Self, RestoreReport), AgentError> {
        std::fs::create_dir_all(state_dir).map_err(|e| DurableError::Store {
            path: state_dir.to_owned(),
            source: Box::new(e),
        })?;
        let (alloc, report) =
            DurableAllocator::open(&state_dir.join(format!("{pool}.alloc.log")), node, pool)?;
        Ok((
            Self {
                node: node.to_owned(),
                pool: pool.to_owned(),
                mode,
                watermarks,
                pod_cidrs,
                alloc: Arc::new(alloc),
                demand: Arc::new(AtomicBool::new(false)),
                releasing: BTreeSet::new(),
                empty_since: BTreeMap::new(),
                retired: BTreeSet::new(),
                facts: None,
                release_grace: RELEASE_GRACE,
            },
            report,
        ))
    }

    pub fn allocator(&self) -> Arc<DurableAllocator> {
        self.alloc.clone()
    }

    /// The flag allocations set when they found no block, and clear once served.
    pub fn demand(&self) -> Arc<AtomicBool> {
        self.demand.clone()
    }

    /// What the node publishes about itself (written to its record on the next sync).
    pub fn set_facts(&mut self, facts: NodeFacts) {
        self.facts = Some(facts);
    }

    /// Whether `record` needs the node's facts written (never before they are known).
    fn facts_stale(&self, record: &NodeIpam) -> bool {
        self.facts.as_ref().is_some_and(|f| !f.published_in(record))
    }

    /// Writes the node's facts into `record`, when they are known.
    fn put_facts(&self, record: &mut NodeIpam) {
        if let Some(facts) = &self.facts {
            facts.publish(record);
        }
    }

    /// The node's blocks in the `kubernetes` mode, as the cluster assigned them (its Node's
    /// `spec.podCIDRs`); written to its record on the next sync.
    pub fn set_pod_cidrs(&mut self, pod_cidrs: Vec<Cidr>) {
        self.pod_cidrs = pod_cidrs;
    }

    /// Shortens the grace before empty blocks go back (tests).
    pub fn set_release_grace(&mut self, grace: Duration) {
        self.release_grace = grace;
    }

    /// One pass: read the node's record, take new blocks, request or return blocks.
    pub async fn sync<S: TypedStore>(&mut self, store: &S) -> Result<(), AgentError> {
        let Some(record) = store.get_typed::<NodeIpam>(&self.node).await? else {
            return self.create_record(store).await;
        };
        let assigned = self.assigned(&record.value);
        // The operator has released what we gave back once it is gone from the status.
        self.releasing.retain(|c| assigned.contains(c));
        let reclaim = match self.mode {
            IpamMode::Kubernetes => Vec::new(),
            _ => {
                // The record is shared with the node's agents of other pools: their entries
                // stay as they are.
                let mut all = self.of_other_pools(&record.value.spec.reclaim, |b| &b.pool);
                all.extend(self.reclaim(&record.value, &assigned)?);
                all.sort();
                all
            }
        };
        self.add_blocks(&assigned)?;
        if self.mode != IpamMode::MultiPool {
            return self.publish(store, &record, reclaim).await;
        }
        let mut requests = self.block_requests(&record.value)?;
        // One order for every agent of the node, so that they never undo each other's write.
        requests.sort_by(|a, b| (&a.pool, a.family).cmp(&(&b.pool, b.family)));
        if requests != record.value.spec.pools
            || reclaim != record.value.spec.reclaim
            || self.facts_stale(&record.value)
        {
            let mut updated = record.value.clone();
            updated.spec.pools = requests;
            updated.spec.reclaim = reclaim;
            self.put_facts(&mut updated);
            store
                .update_unless_changed(&self.node, &updated, &record.revision)
                .await?;
        }
        Ok(())
    }

    /// The node's record, created with its facts (another agent of the node may have been first).
    async fn create_record<S: TypedStore>(&self, store: &S) -> Result<(), AgentError> {
        let mut fresh = NodeIpam {
            spec: NodeIpamSpec {
                pod_cidrs: self.pod_cidrs.clone(),
                ..NodeIpamSpec::default()
            },
            ..NodeIpam::default()
        };
        self.put_facts(&mut fresh);
        match store.create_typed(&self.node, &fresh).await {
            Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// The blocks of this agent's pool the record gives the node.
    fn assigned(&self, record: &NodeIpam) -> BTreeSet<Cidr> {
        match self.mode {
            IpamMode::Kubernetes => record.spec.pod_cidrs.iter().copied().collect(),
            _ => record
                .status
                .allocated
                .iter()
                .filter(|b| b.pool == self.pool)
                .map(|b| b.cidr)
                .collect(),
        }
    }

    /// Adds the assigned blocks the allocator does not have yet (not those on their way back).
    fn add_blocks(&self, assigned: &BTreeSet<Cidr>) -> Result<(), AgentError> {
        for cidr in assigned {
            if !self.releasing.contains(cidr)
                && !self.alloc.with(|a| a.blocks(cidr.family()).contains(cidr))
            {
                self.alloc.add_block(*cidr)?;
                tracing::info!(node = self.node.as_str(), pool = self.pool.as_str(), %cidr, "block added");
            }
        }
        Ok(())
    }

    /// Outside multi-pool mode: writes the reclaim list, the node's facts and, in the
    /// kubernetes mode, its podCIDRs, when they differ from the record.
    async fn publish<S: TypedStore>(
        &self,
        store: &S,
        record: &Versioned<NodeIpam>,
        reclaim: Vec<AllocatedBlock>,
    ) -> Result<(), AgentError> {
        let cidrs_changed =
            self.mode == IpamMode::Kubernetes && record.value.spec.pod_cidrs != self.pod_cidrs;
        if reclaim != record.value.spec.reclaim || self.facts_stale(&record.value) || cidrs_changed
        {
            let mut updated = record.value.clone();
            updated.spec.reclaim = reclaim;
            if self.mode == IpamMode::Kubernetes {
                updated.spec.pod_cidrs = self.pod_cidrs.clone();
            }
            self.put_facts(&mut updated);
            store
                .update_unless_changed(&self.node, &updated, &record.revision)
                .await?;
        }
        Ok(())
    }

    /// Multi-pool mode: this pool's block requests per family (more when addresses run short
    /// or an allocation waits, fewer once empty blocks outlived the release grace), after the
    /// other pools' requests.
    fn block_requests(&mut self, record: &NodeIpam) -> Result<Vec<PoolRequest>, AgentError> {
        let demand = self.demand.load(Ordering::SeqCst);
        let now = Instant::now();
        let empty: BTreeSet<Cidr> = self.alloc.with(|a| {
            let mut e = a.empty_blocks(Family::V4);
            e.extend(a.empty_blocks(Family::V6));
            e.into_iter().collect()
        });
        self.empty_since.retain(|c, _| empty.contains(c));
        for c in &empty {
            self.empty_since.entry(*c).or_insert(now);
        }
        let mut requests = self.of_other_pools(&record.spec.pools, |r| &r.pool);
        for family in [Family::V4, Family::V6] {
            let held = self.alloc.with(|a| a.blocks(family).len()) as u32;
            let mut release: Vec<Cidr> = Vec::new();
            let wants_more = self
                .alloc
                .with(|a| needs_block(a, family, self.watermarks, demand));
            if !wants_more && !demand {
                let candidates = self
                    .alloc
                    .with(|a| releasable_blocks(a, family, self.watermarks, true));
                for cidr in candidates.into_iter().filter(|c| {
                    self.empty_since
                        .get(c)
                        .is_some_and(|t| now.duration_since(*t) >= self.release_grace)
                }) {
                    // Stop using it first, so no address is handed out from a block on its way back.
                    if self.alloc.remove_block(cidr)? {
                        self.releasing.insert(cidr);
                    }
                }
            }
            release.extend(self.releasing.iter().filter(|c| c.family() == family));
            let needed = self.alloc.with(|a| a.blocks(family).len()) as u32 + u32::from(wants_more);
            let previously = record
                .spec
                .pools
                .iter()
                .any(|r| r.pool == self.pool && r.family == family);
            if needed > 0 || held > 0 || !release.is_empty() || previously {
                requests.push(PoolRequest {
                    pool: self.pool.clone(),
                    family,
                    needed,
                    release,
                });
            }
        }
        Ok(requests)
    }
}

impl NodeAgent {
    /// The entries of a list in the node's record that belong to the node's other pools' agents:
    /// kept as they are when this agent writes its own.
    fn of_other_pools<T: Clone>(&self, entries: &[T], pool: impl Fn(&T) -> &String) -> Vec<T> {
        entries
            .iter()
            .filter(|e| *pool(e) != self.pool)
            .cloned()
            .collect()
    }

    /// The blocks this node holds that its record no longer lists (its lease lapsed while it
    /// was away and the operator released them): asked back, unless the operator said another
    /// node holds one now; such a block gives no new address and goes once it is empty.
    fn reclaim(
        &mut self,
        record: &NodeIpam,
        assigned: &BTreeSet<Cidr>,
    ) -> Result<Vec<AllocatedBlock>, AgentError> {
        let lost: BTreeSet<Cidr> = record
            .status
            .lost
            .iter()
            .filter(|b| b.pool == self.pool)
            .map(|b| b.cidr)
            .collect();
        let held: Vec<Cidr> = self.alloc.with(|a| {
            let mut held = a.blocks(Family::V4);
            held.extend(a.blocks(Family::V6));
            held
        });
        let mut reclaim = Vec::new();
        for cidr in held.into_iter().filter(|c| !assigned.contains(c)) {
            if !lost.contains(&cidr) {
                if !record.spec.reclaim.iter().any(|b| b.cidr == cidr) {
                    tracing::warn!(
                        node = self.node.as_str(),
                        pool = self.pool.as_str(),
                        %cidr,
                        "block held here is no longer assigned to this node (its lease lapsed \
                         while away); asking for it back"
                    );
                }
                reclaim.push(AllocatedBlock {
                    pool: self.pool.clone(),
                    cidr,
                });
                continue;
            }
            if self.alloc.remove_block(cidr)? {
                tracing::warn!(
                    node = self.node.as_str(),
                    %cidr,
                    "block was given to another node while this node was away; dropped it \
                     (no address of it was in use here)"
                );
            } else {
                let in_use = self.alloc.retire_block(cidr);
                if self.retired.insert(cidr) {
                    tracing::error!(
                        node = self.node.as_str(),
                        %cidr,
                        in_use,
                        "block was given to another node while this node was away, and {in_use} \
                         of its addresses are still in use here: they conflict with the other \
                         node's pods; delete and recreate the pods on this node that use them. \
                         No new address comes from this block."
                    );
                }
                // Still asked back: should the other node give it up, it returns here.
                reclaim.push(AllocatedBlock {
                    pool: self.pool.clone(),
                    cidr,
                });
            }
        }
        Ok(reclaim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        pod::operator::Operator,
        pod::pool::{FamilySpec, PodIpPoolSpec},
        resources::{PodIpPool, PoolStatus},
        store::embedded::EmbeddedStore,
    };

    async fn pass(op: &mut Operator, agent: &mut NodeAgent, store: &EmbeddedStore) {
        op.reconcile(store).await.unwrap();
        agent.sync(store).await.unwrap();
    }

    /// A fresh directory with an embedded store holding one IPv4 pool.
    async fn store_with_v4_pool(
        tag: &str,
        pool: &str,
        cidr: &str,
        mask: u8,
    ) -> (crate::test_util::TempPath, EmbeddedStore) {
        let dir = crate::test_util::TempPath::new(tag);
        std::fs::create_dir_all(&*dir).unwrap();
        let store = EmbeddedStore::open(&dir.join("store.redb")).unwrap();
        let spec = PodIpPoolSpec {
            reserved: Vec::new(),
            reservations: Vec::new(),
            ipv4: Some(FamilySpec {
                cidrs: vec![cidr.into()],
                mask_size: mask,
            }),
            ipv6: None,
            namespaces: Vec::new(),
            namespace_selector: Default::default(),
            max_blocks_per_node: None,
        };
        store
            .create_typed(
                pool,
                &PodIpPool {
                    spec,
                    status: PoolStatus::default(),
                },
            )
            .await
            .unwrap();
        (dir, store)
    }

    /// The add-on mode's record: created with the facts alone, rewritten only when they change,
    /// and what the operator wrote in its status kept.
    #[tokio::test]
    async fn a_node_without_pod_ipam_keeps_its_facts_in_its_record() {
        let dir = crate::test_util::TempPath::new("facts");
        std::fs::create_dir_all(&*dir).unwrap();
        let store = EmbeddedStore::open(&dir.join("store.redb")).unwrap();
        let mut facts = NodeFacts {
            addresses: vec!["10.0.0.1".parse().unwrap()],
            labels: BTreeMap::from([("zone".to_owned(), "a".to_owned())]),
            interfaces: Vec::new(),
            interfaces_down: Vec::new(),
            announcing: Default::default(),
            agent_version: AGENT_VERSION.into(),
        };
        assert!(facts.sync_record(&store, "n1").await.unwrap());
        let record = store.get_typed::<NodeIpam>("n1").await.unwrap().unwrap();
        assert!(facts.sync_record(&store, "n1").await.unwrap());
        let again = store.get_typed::<NodeIpam>("n1").await.unwrap().unwrap();
        assert_eq!(
            again.revision, record.revision,
            "nothing new, nothing written"
        );
        assert!(facts.published_in(&record.value));
        assert!(record.value.spec.pools.is_empty() && record.value.status.allocated.is_empty());
        let mut lapsed = record.value.clone();
        lapsed.status.conditions.push(crate::meta::Condition::new(
            "Checked",
            true,
            "by the operator",
        ));
        // A restart notice is the agent's to end once the others hear it, not the facts'.
        lapsed.spec.restarting = Some(crate::resources::RestartNotice {
            within_ms: 10_000,
            since_unix_ms: 1,
            answering: None,
        });
        store
            .update_typed("n1", &lapsed, &record.revision)
            .await
            .unwrap();
        facts.labels.insert("rack".to_owned(), "r1".to_owned());
        assert!(facts.sync_record(&store, "n1").await.unwrap());
        let record = store.get_typed::<NodeIpam>("n1").await.unwrap().unwrap();
        assert_eq!(record.value.spec.labels.len(), 2);
        assert_eq!(
            record.value.status, lapsed.status,
            "the status is the operator's"
        );
        assert_eq!(
            record.value.spec.restarting, lapsed.spec.restarting,
            "a restart notice outlives the next agent's first facts"
        );
    }

    #[tokio::test]
    async fn blocks_on_demand_and_back_only_after_the_grace_and_without_demand() {
        let (dir, store) = store_with_v4_pool("agent", "t", "10.70.0.0/24", 28).await;
        let mut operator = Operator::new(IpamMode::MultiPool);
        let (mut agent, _) = NodeAgent::open(
            &dir.join("node"),
            "n1",
            "t",
            IpamMode::MultiPool,
            Watermarks { pre_allocate: 0 },
            vec![],
        )
        .unwrap();
        pass(&mut operator, &mut agent, &store).await;
        assert!(
            agent.allocator().with(|a| a.blocks(Family::V4).is_empty()),
            "pre-allocation 0: nothing up front"
        );

        agent.demand().store(true, Ordering::SeqCst);
        for _ in 0..3 {
            pass(&mut operator, &mut agent, &store).await;
        }
        assert_eq!(agent.allocator().with(|a| a.blocks(Family::V4).len()), 1);

        // Still empty, grace not over, demand pending: kept.
        agent.set_release_grace(Duration::ZERO);
        pass(&mut operator, &mut agent, &store).await;
        assert_eq!(
            agent.allocator().with(|a| a.blocks(Family::V4).len()),
            1,
            "kept while a request waits"
        );

        let ip = agent.allocator().allocate("pod", Family::V4).unwrap();
        agent.demand().store(false, Ordering::SeqCst);
        agent.allocator().release("pod", Family::V4).unwrap();
        assert!("10.70.0.0/28".parse::<Cidr>().unwrap().contains(ip));
        for _ in 0..3 {
            pass(&mut operator, &mut agent, &store).await;
        }
        assert!(
            agent.allocator().with(|a| a.blocks(Family::V4).is_empty()),
            "empty block given back"
        );
        assert_eq!(
            operator
                .blocks()
                .usage("t", Family::V4)
                .unwrap()
                .used_blocks,
            0
        );
    }

    #[tokio::test]
    async fn kubernetes_mode_uses_the_nodes_pod_cidrs_only() {
        let dir = crate::test_util::TempPath::new("agent-k8s");
        std::fs::create_dir_all(&*dir).unwrap();
        let store = EmbeddedStore::open(&dir.join("store.redb")).unwrap();
        let cidrs: Vec<Cidr> = vec![
            "10.244.2.0/24".parse().unwrap(),
            "fd00:0:0:2::/64".parse().unwrap(),
        ];
        let (mut agent, _) = NodeAgent::open(
            &dir.join("node"),
            "worker",
            "default",
            IpamMode::Kubernetes,
            Watermarks { pre_allocate: 0 },
            cidrs.clone(),
        )
        .unwrap();
        let mut operator = Operator::new(IpamMode::Kubernetes);
        for _ in 0..2 {
            pass(&mut operator, &mut agent, &store).await;
        }
        let alloc = agent.allocator();
        let v4 = alloc.allocate("router", Family::V4).unwrap();
        let v6 = alloc.allocate("router", Family::V6).unwrap();
        assert_eq!(v4.to_string(), "10.244.2.1");
        assert_eq!(v6.to_string(), "fd00:0:0:2::1");
        let e = alloc
            .allocate_ip("x", "10.244.3.1".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not in any of its blocks") && e.contains("10.244.2.0/24"),
            "{e}"
        );
    }

    /// A node whose Node has no podCIDRs yet gets no block; when the cluster assigns them, the
    /// next sync records and uses them.
    #[tokio::test]
    async fn kubernetes_mode_takes_pod_cidrs_that_arrive_later() {
        let dir = crate::test_util::TempPath::new("agent-k8s-late");
        std::fs::create_dir_all(&*dir).unwrap();
        let store = EmbeddedStore::open(&dir.join("store.redb")).unwrap();
        let (mut agent, _) = NodeAgent::open(
            &dir.join("node"),
            "worker",
            "default",
            IpamMode::Kubernetes,
            Watermarks { pre_allocate: 0 },
            Vec::new(),
        )
        .unwrap();
        let mut operator = Operator::new(IpamMode::Kubernetes);
        for _ in 0..2 {
            pass(&mut operator, &mut agent, &store).await;
        }
        assert!(agent.allocator().allocate("router", Family::V4).is_err());
        agent.set_pod_cidrs(vec!["10.244.7.0/24".parse().unwrap()]);
        for _ in 0..2 {
            pass(&mut operator, &mut agent, &store).await;
        }
        let record = store
            .get_typed::<NodeIpam>("worker")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.value.spec.pod_cidrs[0].to_string(), "10.244.7.0/24");
        let router = agent.allocator().allocate("router", Family::V4).unwrap();
        assert_eq!(router.to_string(), "10.244.7.1");
    }

    /// Multi-pool: one agent per pool on one node, sharing the node's record. Each gets blocks
    /// of its own pool only, and once served they leave the record alone (no agent undoes
    /// another's write).
    #[tokio::test]
    async fn agents_of_two_pools_share_the_record_and_settle() {
        let (dir, store) = store_with_v4_pool("agent-pools", "infra", "10.71.0.0/24", 28).await;
        let tenant = PodIpPoolSpec {
            reserved: Vec::new(),
            reservations: Vec::new(),
            ipv4: Some(FamilySpec {
                cidrs: vec!["10.72.0.0/24".into()],
                mask_size: 27,
            }),
            ipv6: None,
            namespaces: Vec::new(),
            namespace_selector: Default::default(),
            max_blocks_per_node: None,
        };
        store
            .create_typed(
                "tenant",
                &PodIpPool {
                    spec: tenant,
                    status: PoolStatus::default(),
                },
            )
            .await
            .unwrap();
        let agent = |pool: &str| {
            NodeAgent::open(
                &dir.join("node"),
                "n1",
                pool,
                IpamMode::MultiPool,
                Watermarks { pre_allocate: 1 },
                vec![],
            )
            .unwrap()
            .0
        };
        let (mut infra, mut tenant) = (agent("infra"), agent("tenant"));
        let mut op = Operator::new(IpamMode::MultiPool);
        for _ in 0..4 {
            op.reconcile(&store).await.unwrap();
            infra.sync(&store).await.unwrap();
            tenant.sync(&store).await.unwrap();
        }
        let blocks = |a: &NodeAgent| a.allocator().with(|x| x.blocks(Family::V4));
        assert_eq!(blocks(&infra), vec!["10.71.0.0/28".parse().unwrap()]);
        assert_eq!(blocks(&tenant), vec!["10.72.0.0/27".parse().unwrap()]);
        let record = store.get_typed::<NodeIpam>("n1").await.unwrap().unwrap();
        let requests: Vec<(&str, Family)> = record
            .value
            .spec
            .pools
            .iter()
            .map(|r| (r.pool.as_str(), r.family))
            .collect();
        assert!(
            requests.contains(&("infra", Family::V4)) && requests.contains(&("tenant", Family::V4))
        );
        assert!(requests.is_sorted(), "{requests:?}");
        for _ in 0..3 {
            op.reconcile(&store).await.unwrap();
            infra.sync(&store).await.unwrap();
            tenant.sync(&store).await.unwrap();
        }
        let after = store.get_typed::<NodeIpam>("n1").await.unwrap().unwrap();
        assert_eq!(after.revision, record.revision, "settled: no more writes");
    }

    /// Node liveness through the store: a node whose lease lapses for the grace period loses
    /// its blocks (never sooner, and not after an operator restart); when it returns it gets
    /// them back if they are still free, else new ones, and a block another node took is no
    /// longer used for new addresses.
    #[tokio::test]
    async fn lapsed_nodes_lose_their_blocks_and_get_them_back_when_free() {
        use crate::{
            resources::{NodeIpamStatus, node_lease_name},
            store::lease::renew,
        };
        let (dir, store) =
            store_with_v4_pool("agent-liveness", "default", "10.80.0.0/24", 26).await;
        let grace = Duration::from_millis(400);
        let agent = |name: &str| {
            NodeAgent::open(
                &dir.join(name),
                name,
                "default",
                IpamMode::ClusterPool,
                Watermarks { pre_allocate: 0 },
                vec![],
            )
            .unwrap()
            .0
        };
        let beat = |name: &'static str| {
            let store = &store;
            async move {
                renew(store, &node_lease_name(name), name, grace)
                    .await
                    .unwrap();
            }
        };
        let mut op = Operator::new(IpamMode::ClusterPool).with_node_grace(grace);
        let (mut a, mut b) = (agent("a"), agent("b"));
        for _ in 0..3 {
            beat("a").await;
            beat("b").await;
            pass(&mut op, &mut a, &store).await;
            b.sync(&store).await.unwrap();
        }
        let block_of = |agent: &NodeAgent| agent.allocator().with(|x| x.blocks(Family::V4));
        let a_block = block_of(&a);
        assert_eq!(a_block.len(), 1);
        let pod_ip = a.allocator().allocate("pod-1", Family::V4).unwrap();

        // a goes silent; b keeps renewing. Short of the grace period nothing happens.
        let silent = Instant::now();
        while silent.elapsed() < grace / 2 {
            beat("b").await;
            let report = op.reconcile(&store).await.unwrap();
            assert!(report.released.is_empty());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // A restarted operator does not free a's blocks either: it has not waited yet.
        let mut op = Operator::new(IpamMode::ClusterPool).with_node_grace(grace);
        let restarted = Instant::now();
        let mut expired = Vec::new();
        while expired.is_empty() {
            beat("b").await;
            expired = op.reconcile(&store).await.unwrap().expired_nodes;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(restarted.elapsed() >= grace, "{:?}", restarted.elapsed());
        assert_eq!(expired, ["a"]);
        let record = store
            .get_typed::<NodeIpam>("a")
            .await
            .unwrap()
            .unwrap()
            .value;
        assert!(record.status.allocated.is_empty());
        assert!(
            record.status.conditions[0].message.contains("node-a"),
            "{:?}",
            record.status
        );
        assert_eq!(block_of(&b).len(), 1, "the live node kept its block");

        // a comes back while its block is still free: it gets it back, pod address intact.
        for _ in 0..3 {
            beat("a").await;
            beat("b").await;
            pass(&mut op, &mut a, &store).await;
        }
        let status: NodeIpamStatus = store
            .get_typed::<NodeIpam>("a")
            .await
            .unwrap()
            .unwrap()
            .value
            .status;
        assert_eq!(
            status.allocated.iter().map(|b| b.cidr).collect::<Vec<_>>(),
            a_block
        );
        assert_eq!(
            a.allocator().with(|x| x.lookup("pod-1", Family::V4)),
            Some(pod_ip)
        );

        // a lapses again, and a new node c takes its block meanwhile.
        let mut c = agent("c");
        let mut expired = Vec::new();
        while expired.is_empty() {
            beat("b").await;
            expired = op.reconcile(&store).await.unwrap().expired_nodes;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for _ in 0..3 {
            beat("b").await;
            beat("c").await;
            op.reconcile(&store).await.unwrap();
            c.sync(&store).await.unwrap();
        }
        assert_eq!(block_of(&c), a_block, "c got the freed block");
        // a returns: its old block is lost (in use by pod-1, so retired, not dropped), and it
        // gets a new block for new pods.
        for _ in 0..4 {
            beat("a").await;
            beat("b").await;
            beat("c").await;
            pass(&mut op, &mut a, &store).await;
        }
        let status = store
            .get_typed::<NodeIpam>("a")
            .await
            .unwrap()
            .unwrap()
            .value
            .status;
        assert_eq!(
            status.lost.iter().map(|b| b.cidr).collect::<Vec<_>>(),
            a_block
        );
        assert_eq!(status.allocated.len(), 1);
        assert_ne!(status.allocated[0].cidr, a_block[0]);
        let next = a.allocator().allocate("pod-2", Family::V4).unwrap();
        assert!(status.allocated[0].cidr.contains(next), "{next}");
        // Nor is any address of it given to a pod that asks for one by address: c hands them
        // out now.
        let asked = a_block[0].addr(40);
        let e = a.allocator().allocate_ip("pod-3", asked).unwrap_err();
        assert!(
            matches!(
                e,
                DurableError::Alloc(crate::pod::node::AllocError::Retired { .. })
            ),
            "{e}"
        );
        // Once pod-1 is gone, the lost block goes too.
        a.allocator().release("pod-1", Family::V4).unwrap();
        pass(&mut op, &mut a, &store).await;
        pass(&mut op, &mut a, &store).await;
        assert_eq!(block_of(&a), vec![status.allocated[0].cidr]);
        let status = store
            .get_typed::<NodeIpam>("a")
            .await
            .unwrap()
            .unwrap()
            .value
            .status;
        assert!(status.lost.is_empty(), "{status:?}");
    }

    /// Where the cluster knows its nodes (Kubernetes' Node objects), a node that lapses keeps
    /// its blocks as long as its Node exists, however long it is away (said once); once the
    /// Node is deleted, its blocks go back after the grace period as on the other stores.
    #[tokio::test]
    async fn a_lapsed_node_keeps_its_blocks_while_its_node_object_exists() {
        use crate::{
            resources::{ClusterNode, node_lease_name},
            store::lease::renew,
        };
        let (dir, store) =
            store_with_v4_pool("agent-node-object", "default", "10.81.0.0/24", 26).await;
        let grace = Duration::from_millis(300);
        let mut a = NodeAgent::open(
            &dir.join("a"),
            "a",
            "default",
            IpamMode::ClusterPool,
            Watermarks { pre_allocate: 0 },
            vec![],
        )
        .unwrap()
        .0;
        store
            .create_typed("a", &ClusterNode::default())
            .await
            .unwrap();
        let mut op = Operator::new(IpamMode::ClusterPool).with_node_grace(grace);
        for _ in 0..3 {
            renew(&store, &node_lease_name("a"), "a", grace)
                .await
                .unwrap();
            pass(&mut op, &mut a, &store).await;
        }
        let held = |store: &EmbeddedStore| {
            let store = store.clone();
            async move {
                store
                    .get_typed::<NodeIpam>("a")
                    .await
                    .unwrap()
                    .unwrap()
                    .value
                    .status
                    .allocated
                    .len()
            }
        };
        assert_eq!(held(&store).await, 1);

        // Silent for three grace periods: kept, and said once.
        let silent = Instant::now();
        let mut kept_reports = 0;
        while silent.elapsed() < grace * 3 {
            let report = op.reconcile(&store).await.unwrap();
            assert!(report.expired_nodes.is_empty(), "{report:?}");
            assert!(report.released.is_empty(), "{report:?}");
            kept_reports += report.kept_nodes.len();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(kept_reports, 1, "said once");
        assert_eq!(held(&store).await, 1, "its block is still its own");

        // The Node deleted: its blocks go back.
        crate::store::Store::delete(&store, "Node", "a", None)
            .await
            .unwrap();
        let report = op.reconcile(&store).await.unwrap();
        assert_eq!(report.expired_nodes, ["a"]);
        assert_eq!(held(&store).await, 0);
    }
}
