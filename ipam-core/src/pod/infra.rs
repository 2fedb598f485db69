//! Router, health and ingress addresses of a node: the allocations the node itself needs before
//! any pod can start.
//!
//! The Cilium multi-pool deadlock (a pool with pre-allocation 0 gives a new node no block, the
//! router IP allocation fails with "pool not (yet) available", the agent exits, restarts, and
//! fails again forever) is handled here: a missing block is a condition time fixes. The
//! allocation asks upstream for a block and waits with exponential backoff (500 ms, x1.5, ±10 %,
//! capped), saying what it waits for; it succeeds as soon as a block arrives. Any other error
//! fails at once with its cause.

use std::{net::IpAddr, time::Duration};

use crate::backoff::Backoff;
use crate::{Family, pod::durable::DurableError, pod::node::AllocError};

/// Errors that can mean "the node has no block yet" (the one condition worth waiting for).
pub trait NoBlockYet: std::fmt::Display {
    fn no_block(&self) -> Option<&AllocError>;
}

impl NoBlockYet for AllocError {
    fn no_block(&self) -> Option<&AllocError> {
        matches!(self, AllocError::NoBlock { .. }).then_some(self)
    }
}

impl NoBlockYet for DurableError {
    fn no_block(&self) -> Option<&AllocError> {
        match self {
            DurableError::Alloc(e) => e.no_block(),
            DurableError::Store { .. } => None,
        }
    }
}

/// Longest wait between two attempts.
pub const INFRA_RETRY_CAP: Duration = Duration::from_secs(30);

/// Allocates the `purpose` address (`router`, `health`, `ingress`) of `family` with
/// `try_allocate`, calling `request_block` and waiting whenever the node has no block yet.
pub async fn allocate_waiting<E: NoBlockYet>(
    purpose: &str,
    family: Family,
    mut try_allocate: impl FnMut() -> Result<IpAddr, E>,
    mut request_block: impl FnMut(),
    backoff: &mut Backoff,
) -> Result<IpAddr, E> {
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match try_allocate() {
            Ok(ip) => {
                if attempt > 1 {
                    tracing::info!(purpose, %ip, attempt, "{} {purpose} address allocated after waiting for a block", family.name());
                }
                return Ok(ip);
            }
            Err(e) if e.no_block().is_some() => {
                let Some(AllocError::NoBlock { node, pool, family }) = e.no_block() else {
                    unreachable!("no_block returns NoBlock")
                };
                // Tell the operator there is demand (pre-allocation 0 gives no block otherwise).
                request_block();
                let delay = backoff.next_delay();
                tracing::warn!(
                    purpose,
                    node = node.as_str(),
                    pool = pool.as_str(),
                    attempt,
                    retry_in_ms = delay.as_millis() as u64,
                    "waiting for the operator to assign an {} block of pool {pool} to node {node} \
                     before the {purpose} address can be allocated; requested one",
                    family.name()
                );
                tokio::time::sleep(delay).await;
            }
            Err(other) => return Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    };

    use super::*;
    use crate::{
        Cidr,
        pod::blocks::BlockAllocator,
        pod::node::{NodeAllocator, ROUTER_OWNER},
        pod::pool::{FamilySpec, PodIpPoolSpec, validate},
    };

    /// A node with pre-allocation 0: no block at start; an operator that assigns one only when
    /// asked, after `delay` (None: never).
    struct Cluster {
        node: Mutex<NodeAllocator>,
        operator: Mutex<BlockAllocator>,
        requests: AtomicU32,
    }

    fn cluster() -> Arc<Cluster> {
        let mut operator = BlockAllocator::new();
        let pool = validate(
            "hrz",
            &PodIpPoolSpec {
                reserved: Vec::new(),
                reservations: Vec::new(),
                ipv4: Some(FamilySpec {
                    cidrs: vec!["10.60.0.0/16".into()],
                    mask_size: 26,
                }),
                ipv6: None,
                namespaces: Vec::new(),
                namespace_selector: Default::default(),
                max_blocks_per_node: None,
            },
        )
        .unwrap();
        operator.upsert_pool(pool).unwrap();
        Arc::new(Cluster {
            node: Mutex::new(NodeAllocator::new("node-1", "hrz")),
            operator: Mutex::new(operator),
            requests: AtomicU32::new(0),
        })
    }

    fn try_router(c: &Cluster) -> Result<IpAddr, AllocError> {
        c.node.lock().unwrap().allocate(ROUTER_OWNER, Family::V4)
    }

    fn spawn_operator(c: &Arc<Cluster>, delay: Duration) {
        let c = c.clone();
        tokio::spawn(async move {
            while c.requests.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(delay).await;
            let block: Cidr = c
                .operator
                .lock()
                .unwrap()
                .allocate("node-1", "hrz", Family::V4)
                .unwrap();
            c.node.lock().unwrap().add_block(block);
        });
    }

    #[tokio::test(start_paused = true)]
    async fn router_ip_waits_for_a_block_that_arrives_later() {
        let c = cluster();
        spawn_operator(&c, Duration::from_secs(4));
        let start = tokio::time::Instant::now();
        let mut backoff = Backoff::new(INFRA_RETRY_CAP);
        let ip = allocate_waiting(
            "router",
            Family::V4,
            || try_router(&c),
            || {
                c.requests.fetch_add(1, Ordering::SeqCst);
            },
            &mut backoff,
        )
        .await
        .unwrap();
        assert_eq!(ip.to_string(), "10.60.0.1");
        let waited = start.elapsed();
        // Block at ~4 s; the retry after it comes within one backoff step (< 4 s at this point).
        assert!(
            waited >= Duration::from_secs(4) && waited < Duration::from_secs(8),
            "{waited:?}"
        );
        assert!(
            c.requests.load(Ordering::SeqCst) >= 3,
            "asked upstream on every miss"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn another_error_in_the_middle_fails_at_once() {
        let attempts = AtomicU32::new(0);
        let mut backoff = Backoff::new(INFRA_RETRY_CAP);
        let err = allocate_waiting(
            "health",
            Family::V4,
            || {
                let n = attempts.fetch_add(1, Ordering::SeqCst);
                if n < 2 {
                    Err(AllocError::NoBlock {
                        node: "node-1".into(),
                        pool: "hrz".into(),
                        family: Family::V4,
                    })
                } else {
                    Err(AllocError::Full {
                        node: "node-1".into(),
                        pool: "hrz".into(),
                        family: Family::V4,
                        used: 62,
                        blocks: vec!["10.60.0.0/26".parse().unwrap()],
                    })
                }
            },
            || {},
            &mut backoff,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, AllocError::Full { .. }), "{err}");
        assert_eq!(
            attempts.load(Ordering::SeqCst),
            3,
            "no retry after a non-pool error"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_block_that_never_comes_is_waited_for_without_giving_up() {
        let c = cluster();
        let mut backoff = Backoff::new(INFRA_RETRY_CAP);
        let attempts = AtomicU32::new(0);
        let waiting = allocate_waiting(
            "router",
            Family::V4,
            || {
                attempts.fetch_add(1, Ordering::SeqCst);
                try_router(&c)
            },
            || {},
            &mut backoff,
        );
        // An hour of simulated time: still waiting, never an error, delays capped at 30 s.
        let outcome = tokio::time::timeout(Duration::from_secs(3600), waiting).await;
        assert!(outcome.is_err(), "must still be waiting, not return");
        let n = attempts.load(Ordering::SeqCst);
        // ~13 attempts to reach the cap, then one per ≤30 s: well over 100 in an hour.
        assert!((100..=200).contains(&n), "{n} attempts");
    }
}
