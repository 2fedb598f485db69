//! A node's allocations made durable: every allocation and release is acknowledged only after
//! the embedded database committed it with fsync, and concurrent requests share a commit (group
//! commit), so durability costs one fsync per batch rather than per request.
//!
//! On start the node's blocks and allocations are restored from the file before anything new is
//! allocated, so the router address and every pod's address survive restarts and SIGKILL.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Condvar, Mutex},
};

use redb::{Database, ReadableDatabase as _, ReadableTable as _, TableDefinition};
use thiserror::Error;

use super::{
    Cidr, Family,
    node::{AllocError, NodeAllocator},
};

const BLOCKS: TableDefinition<&str, &str> = TableDefinition::new("blocks");
const ALLOCATIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("allocations");

#[derive(Debug, Error)]
pub enum DurableError {
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error(
        "allocation state file {path}: {source}; the change was not made (nothing was \
         acknowledged). Check the disk and the file's permissions"
    )]
    Store {
        path: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// What restoring found.
#[derive(Debug, Default)]
pub struct RestoreReport {
    pub blocks: usize,
    pub allocations: usize,
    /// Persisted allocations that no longer fit (e.g. outside every block), with the reason.
    pub dropped: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
enum Op {
    Put { key: String, ip: IpAddr },
    Delete { key: String, ip: IpAddr },
    AddBlock { cidr: Cidr, pool: String },
    RemoveBlock { cidr: Cidr },
}

#[derive(Default)]
struct Log {
    pending: Vec<(u64, Op)>,
    next_seq: u64,
    durable_seq: u64,
    /// Sequence ranges whose commit failed, with the error text.
    failed: Vec<(u64, u64, String)>,
}

/// A node's allocator whose changes are durable when acknowledged.
pub struct DurableAllocator {
    path: PathBuf,
    db: Database,
    alloc: Mutex<NodeAllocator>,
    log: Mutex<Log>,
    committed: Condvar,
    commit: Mutex<()>,
}

fn key(owner: &str, family: Family) -> String {
    format!("{} {owner}", if family == Family::V4 { "4" } else { "6" })
}

fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

fn bytes_ip(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(b).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(b).ok()?)),
        _ => None,
    }
}

impl DurableAllocator {
    /// Opens (or creates) the state file and restores the node's blocks and allocations.
    pub fn open(
        path: &Path,
        node: &str,
        pool: &str,
    ) -> Result<(Self, RestoreReport), DurableError> {
        let store_err = |e: Box<dyn std::error::Error + Send + Sync>| DurableError::Store {
            path: path.to_owned(),
            source: e,
        };
        let db = Database::create(path).map_err(|e| store_err(e.into()))?;
        let mut alloc = NodeAllocator::new(node, pool);
        let mut report = RestoreReport::default();
        {
            let txn = db.begin_write().map_err(|e| store_err(e.into()))?;
            txn.open_table(BLOCKS).map_err(|e| store_err(e.into()))?;
            txn.open_table(ALLOCATIONS)
                .map_err(|e| store_err(e.into()))?;
            txn.commit().map_err(|e| store_err(e.into()))?;
        }
        let read = db.begin_read().map_err(|e| store_err(e.into()))?;
        let blocks = read.open_table(BLOCKS).map_err(|e| store_err(e.into()))?;
        for entry in blocks.iter().map_err(|e| store_err(e.into()))? {
            let (cidr, _pool) = entry.map_err(|e| store_err(e.into()))?;
            if let Ok(cidr) = cidr.value().parse::<Cidr>() {
                alloc.add_block(cidr);
                report.blocks += 1;
            }
        }
        let allocations = read
            .open_table(ALLOCATIONS)
            .map_err(|e| store_err(e.into()))?;
        for entry in allocations.iter().map_err(|e| store_err(e.into()))? {
            let (k, v) = entry.map_err(|e| store_err(e.into()))?;
            let (k, v) = (k.value().to_owned(), v.value().to_vec());
            let owner = k.split_once(' ').map(|(_, o)| o).unwrap_or(&k);
            match bytes_ip(&v).map(|ip| alloc.allocate_ip(owner, ip)) {
                Some(Ok(())) => report.allocations += 1,
                Some(Err(e)) => report.dropped.push((owner.to_owned(), e.to_string())),
                None => report
                    .dropped
                    .push((owner.to_owned(), "unreadable address".into())),
            }
        }
        for (owner, why) in &report.dropped {
            tracing::error!(
                owner = owner.as_str(),
                "persisted allocation not restored: {why}"
            );
        }
        Ok((
            Self {
                path: path.to_owned(),
                db,
                alloc: Mutex::new(alloc),
                log: Mutex::new(Log::default()),
                committed: Condvar::new(),
                commit: Mutex::new(()),
            },
            report,
        ))
    }

    /// Adds a block assigned by the operator, durably.
    pub fn add_block(&self, cidr: Cidr) -> Result<(), DurableError> {
        let seq = {
            let mut alloc = self.alloc.lock().expect("allocator lock");
            alloc.add_block(cidr);
            let pool = alloc.pool().to_owned();
            self.push(Op::AddBlock { cidr, pool })
        };
        self.wait_durable(seq)
    }

    /// Removes an empty block durably; `false` when it still holds allocations or is not held.
    pub fn remove_block(&self, cidr: Cidr) -> Result<bool, DurableError> {
        let seq = {
            let mut alloc = self.alloc.lock().expect("allocator lock");
            if !alloc.remove_block(cidr) {
                return Ok(false);
            }
            self.push(Op::RemoveBlock { cidr })
        };
        self.wait_durable(seq)?;
        Ok(true)
    }

    /// An address for `owner`, acknowledged once durable. Idempotent.
    pub fn allocate(&self, owner: &str, family: Family) -> Result<IpAddr, DurableError> {
        let (ip, seq) = {
            let mut alloc = self.alloc.lock().expect("allocator lock");
            if let Some(ip) = alloc.lookup(owner, family) {
                // Held already; its write may still be in flight from a concurrent request.
                (ip, self.log.lock().expect("log lock").next_seq)
            } else {
                let ip = alloc.allocate(owner, family)?;
                (
                    ip,
                    self.push(Op::Put {
                        key: key(owner, family),
                        ip,
                    }),
                )
            }
        };
        self.wait_durable(seq)?;
        Ok(ip)
    }

    /// Gives `ip` to `owner` (a requested address), durably.
    pub fn allocate_ip(&self, owner: &str, ip: IpAddr) -> Result<(), DurableError> {
        let seq = {
            let mut alloc = self.alloc.lock().expect("allocator lock");
            let known = alloc.lookup(owner, Family::of(ip)) == Some(ip);
            alloc.allocate_ip(owner, ip)?;
            if known {
                self.log.lock().expect("log lock").next_seq
            } else {
                self.push(Op::Put {
                    key: key(owner, Family::of(ip)),
                    ip,
                })
            }
        };
        self.wait_durable(seq)
    }

    /// Releases what `owner` holds in `family`, durably; releasing nothing is not an error.
    pub fn release(&self, owner: &str, family: Family) -> Result<Option<IpAddr>, DurableError> {
        let (ip, seq) = {
            let mut alloc = self.alloc.lock().expect("allocator lock");
            match alloc.release(owner, family) {
                Some(ip) => (
                    Some(ip),
                    self.push(Op::Delete {
                        key: key(owner, family),
                        ip,
                    }),
                ),
                None => (None, self.log.lock().expect("log lock").next_seq),
            }
        };
        self.wait_durable(seq)?;
        Ok(ip)
    }

    /// Runs `f` on the in-memory allocator (status, checks).
    pub fn with<T>(&self, f: impl FnOnce(&NodeAllocator) -> T) -> T {
        f(&self.alloc.lock().expect("allocator lock"))
    }

    /// Queues `op`; called with the allocator lock held so log order is memory order.
    fn push(&self, op: Op) -> u64 {
        let mut log = self.log.lock().expect("log lock");
        log.next_seq += 1;
        let seq = log.next_seq;
        log.pending.push((seq, op));
        seq
    }

    /// Returns once `seq` is committed (or its commit failed). Whoever finds no commit running
    /// commits everything queued so far, for every waiter.
    fn wait_durable(&self, seq: u64) -> Result<(), DurableError> {
        loop {
            {
                let log = self.log.lock().expect("log lock");
                if log.durable_seq >= seq {
                    return match log.failed.iter().find(|(a, b, _)| (*a..=*b).contains(&seq)) {
                        Some((_, _, e)) => Err(DurableError::Store {
                            path: self.path.clone(),
                            source: e.clone().into(),
                        }),
                        None => Ok(()),
                    };
                }
            }
            if let Ok(_committer) = self.commit.try_lock() {
                self.commit_pending();
            } else {
                let log = self.log.lock().expect("log lock");
                if log.durable_seq < seq {
                    let _ = self
                        .committed
                        .wait_timeout(log, std::time::Duration::from_millis(5))
                        .expect("log lock");
                }
            }
        }
    }

    fn commit_pending(&self) {
        let batch = std::mem::take(&mut self.log.lock().expect("log lock").pending);
        let Some(&(last, _)) = batch.last() else {
            return;
        };
        let first = batch[0].0;
        let result = self.write(&batch);
        if let Err(e) = &result {
            // Nothing of the batch is durable: undo it in memory so state matches the file.
            let mut alloc = self.alloc.lock().expect("allocator lock");
            for (_, op) in batch.iter().rev() {
                match op {
                    Op::Put { key, ip } => {
                        let owner = key.split_once(' ').map_or(key.as_str(), |(_, o)| o);
                        if alloc.lookup(owner, Family::of(*ip)) == Some(*ip) {
                            alloc.release(owner, Family::of(*ip));
                        }
                    }
                    Op::Delete { key, ip } => {
                        let owner = key.split_once(' ').map_or(key.as_str(), |(_, o)| o);
                        let _ = alloc.allocate_ip(owner, *ip);
                    }
                    Op::AddBlock { cidr, .. } => {
                        alloc.remove_block(*cidr);
                    }
                    Op::RemoveBlock { cidr } => alloc.add_block(*cidr),
                }
            }
            tracing::error!(path = %self.path.display(), "commit of {} change(s) failed: {e}", batch.len());
        }
        let mut log = self.log.lock().expect("log lock");
        if let Err(e) = result {
            log.failed.push((first, last, e));
        }
        log.durable_seq = last;
        self.committed.notify_all();
    }

    fn write(&self, batch: &[(u64, Op)]) -> Result<(), String> {
        let txn = self.db.begin_write().map_err(|e| e.to_string())?;
        {
            let mut allocations = txn.open_table(ALLOCATIONS).map_err(|e| e.to_string())?;
            let mut blocks = txn.open_table(BLOCKS).map_err(|e| e.to_string())?;
            for (_, op) in batch {
                match op {
                    Op::Put { key, ip } => {
                        allocations
                            .insert(key.as_str(), ip_bytes(*ip).as_slice())
                            .map_err(|e| e.to_string())?;
                    }
                    Op::Delete { key, .. } => {
                        allocations
                            .remove(key.as_str())
                            .map_err(|e| e.to_string())?;
                    }
                    Op::AddBlock { cidr, pool } => {
                        blocks
                            .insert(cidr.to_string().as_str(), pool.as_str())
                            .map_err(|e| e.to_string())?;
                    }
                    Op::RemoveBlock { cidr } => {
                        blocks
                            .remove(cidr.to_string().as_str())
                            .map_err(|e| e.to_string())?;
                    }
                }
            }
        }
        txn.commit().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::ipam::node::ROUTER_OWNER;

    fn temp(name: &str) -> crate::test_util::TempPath {
        crate::test_util::TempPath::new(&format!("durable-{name}.redb"))
    }

    #[test]
    fn allocations_and_router_ip_survive_reopening() {
        let path = temp("reopen");
        let router;
        let pods: Vec<IpAddr>;
        {
            let (d, report) = DurableAllocator::open(&path, "node-1", "default").unwrap();
            assert_eq!(report.allocations, 0);
            d.add_block("10.244.3.0/24".parse().unwrap()).unwrap();
            router = d.allocate(ROUTER_OWNER, Family::V4).unwrap();
            pods = (0..10)
                .map(|i| d.allocate(&format!("ns/p{i}"), Family::V4).unwrap())
                .collect();
            d.release("ns/p3", Family::V4).unwrap();
        }
        let (d, report) = DurableAllocator::open(&path, "node-1", "default").unwrap();
        assert_eq!((report.blocks, report.allocations), (1, 10));
        // Restored first, so the router keeps its address across restarts.
        assert_eq!(d.allocate(ROUTER_OWNER, Family::V4).unwrap(), router);
        assert_eq!(d.allocate("ns/p5", Family::V4).unwrap(), pods[5]);
        assert_eq!(d.with(|a| a.lookup("ns/p3", Family::V4)), None);
    }

    #[test]
    fn concurrent_allocations_share_commits_and_never_collide() {
        let path = temp("concurrent");
        let (d, _) = DurableAllocator::open(&path, "node-1", "default").unwrap();
        d.add_block("10.60.0.0/20".parse().unwrap()).unwrap();
        let d = Arc::new(d);
        let threads: Vec<_> = (0..16)
            .map(|t| {
                let d = d.clone();
                std::thread::spawn(move || {
                    (0..50)
                        .map(|i| {
                            (
                                format!("t{t}/p{i}"),
                                d.allocate(&format!("t{t}/p{i}"), Family::V4).unwrap(),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let acked: Vec<(String, IpAddr)> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let distinct: std::collections::HashSet<_> = acked.iter().map(|(_, ip)| ip).collect();
        assert_eq!(distinct.len(), 800);
        drop(d);
        let (reopened, report) = DurableAllocator::open(&path, "node-1", "default").unwrap();
        assert_eq!(report.allocations, 800);
        for (owner, ip) in acked {
            assert_eq!(reopened.with(|a| a.lookup(&owner, Family::V4)), Some(ip));
        }
    }
}
