//! Property over the etcd store: operator replicas (electing a leader through the store, some
//! stalling past their lease and coming back, each new term starting from an empty cache) and
//! node agents joining at random times, all as concurrent tasks against real etcd members,
//! never hand the same block to two nodes, and every node ends up with its block.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use ipam_core::{
    Cidr,
    pod::agent::NodeAgent,
    pod::multipool::Watermarks,
    pod::operator::Operator,
    pod::pool::{FamilySpec, IpamMode, PodIpPoolSpec},
    resources::{NodeIpam, OPERATOR_LEASE, PodIpPool, PoolStatus},
    store::{TypedStore, lease::LeaderElection},
};
use ipam_etcd::{EtcdStore, testing::EtcdCluster};
use rand::{Rng as _, SeedableRng as _};

const OPERATORS: u64 = 3;
const NODES: usize = 40;
const RUN: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_operators_and_agents_never_give_a_block_twice() {
    let store = Arc::new(
        EtcdStore::connect(EtcdCluster::shared_config("no-block-twice"))
            .await
            .unwrap(),
    );
    store
        .create_typed(
            "default",
            &PodIpPool {
                spec: PodIpPoolSpec {
                    reserved: Vec::new(),
                    reservations: Vec::new(),
                    ipv4: Some(FamilySpec {
                        cidrs: vec!["10.90.0.0/20".into()],
                        mask_size: 26,
                    }),
                    ipv6: None,
                    namespaces: Vec::new(),
                    namespace_selector: Default::default(),
                    max_blocks_per_node: None,
                },
                status: PoolStatus::default(),
            },
        )
        .await
        .unwrap();
    let end = Instant::now() + RUN;

    let operators: Vec<_> = (0..OPERATORS)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(i);
                let mut election = LeaderElection::new(
                    OPERATOR_LEASE,
                    &format!("op-{i}"),
                    Duration::from_millis(600),
                );
                let mut operator: Option<Operator> = None;
                let mut terms = 0;
                while Instant::now() < end {
                    match election.step(&*store).await {
                        Ok(ipam_core::store::lease::Leadership::Leading { acquired }) => {
                            if acquired || operator.is_none() {
                                terms += 1;
                                operator = Some(Operator::new(IpamMode::ClusterPool));
                            }
                        }
                        _ => operator = None,
                    }
                    if let Some(op) = operator.as_mut()
                        && election.is_leading()
                    {
                        op.set_deadline(election.leading_until());
                        let _ = op.reconcile(&*store).await;
                    }
                    // Now and then a replica stalls past its lease (a long GC pause, a frozen
                    // VM), then carries on as if nothing happened.
                    let pause = if rng.random_ratio(1, 15) { 900 } else { 60 };
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                terms
            })
        })
        .collect();

    let dir = tempfile::tempdir().unwrap();
    let agents: Vec<_> = (0..NODES)
        .map(|n| {
            let store = store.clone();
            let state = dir.path().join(format!("n{n}"));
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(100 + n as u64);
                tokio::time::sleep(Duration::from_millis(
                    rng.random_range(0..RUN.as_millis() as u64 / 2),
                ))
                .await;
                let (mut agent, _) = NodeAgent::open(
                    &state,
                    &format!("node-{n}"),
                    "default",
                    IpamMode::ClusterPool,
                    Watermarks { pre_allocate: 0 },
                    vec![],
                )
                .unwrap();
                while Instant::now() < end + Duration::from_secs(3) {
                    let _ = agent.sync(&*store).await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                agent.allocator().with(|a| a.blocks(ipam_core::Family::V4))
            })
        })
        .collect();

    let mut terms = 0;
    for o in operators {
        terms += o.await.unwrap();
    }
    // One replica keeps serving after the chaos, so every node gets its block.
    let settle = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut election =
                LeaderElection::new(OPERATOR_LEASE, "op-final", Duration::from_millis(600));
            let mut operator = Operator::new(IpamMode::ClusterPool);
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                if election.step(&*store).await.is_ok() && election.is_leading() {
                    operator.set_deadline(election.leading_until());
                    let _ = operator.reconcile(&*store).await;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut local: BTreeMap<String, Vec<Cidr>> = BTreeMap::new();
    for (n, a) in agents.into_iter().enumerate() {
        local.insert(format!("node-{n}"), a.await.unwrap());
    }
    settle.await.unwrap();
    assert!(
        terms > OPERATORS,
        "leadership changed hands ({terms} terms)"
    );

    let records = store.list_typed::<NodeIpam>().await.unwrap();
    let mut holder: BTreeMap<Cidr, String> = BTreeMap::new();
    for r in &records {
        for b in &r.value.status.allocated {
            if let Some(other) = holder.insert(b.cidr, r.name.clone()) {
                panic!("block {} given to {other} and to {}", b.cidr, r.name);
            }
        }
    }
    // The agents' own state agrees: no block is used on two nodes.
    let mut used: BTreeMap<Cidr, String> = BTreeMap::new();
    for (node, blocks) in &local {
        for b in blocks {
            if let Some(other) = used.insert(*b, node.clone()) {
                panic!("block {b} used on {other} and on {node}");
            }
        }
    }
    assert_eq!(records.len(), NODES);
    let served = records
        .iter()
        .filter(|r| r.value.status.allocated.len() == 1)
        .count();
    assert_eq!(served, NODES, "every node got its block");
}
