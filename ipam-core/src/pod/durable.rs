//! A node's allocations made durable: every allocation and release is acknowledged only after
//! the allocation log (`alloclog`) wrote it with `fdatasync`, and concurrent requests share a
//! write (group commit), so durability costs one fsync per batch rather than per request.
//!
//! On start the node's blocks and allocations are restored from the file before anything new is
//! allocated, so the router address and every pod's address survive restarts and SIGKILL.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Condvar, Mutex},
};

use thiserror::Error;

use crate::{
    Cidr, Family,
    pod::alloclog::{AllocLog, Record},
    pod::node::{AllocError, NodeAllocator},
};

/// Log keys: blocks are `b <cidr>` (value: pool), allocations `4 <owner>` / `6 <owner>` (value:
/// the address's octets).
const BLOCK_PREFIX: &str = "b ";
/// Compaction runs once the log is this large and three times its live content.
const COMPACT_MIN_BYTES: u64 = 1 << 20;

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
    Put {
        key: String,
        ip: IpAddr,
    },
    Delete {
        key: String,
        ip: IpAddr,
    },
    /// The deletion of a renamed owner's old key (its new key was put just before).
    Rename {
        key: String,
        to: String,
        ip: IpAddr,
    },
    AddBlock {
        cidr: Cidr,
        pool: String,
    },
    RemoveBlock {
        cidr: Cidr,
    },
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
///
/// Lock order (a thread holding one of these only takes those after it):
/// `commit` → `log` → `alloc` → `log_state`; `stats` is a leaf taken alone. The split is the
/// group commit: allocations (`alloc`, then `log_state` to queue) never wait for a disk write,
/// which holds only `commit` and `log`; `committed` wakes the waiters when a batch is durable.
pub struct DurableAllocator {
    path: PathBuf,
    /// The log file; held while writing a batch or compacting.
    log: Mutex<AllocLog>,
    /// The in-memory allocator, the truth that acknowledged changes are made against.
    alloc: Mutex<NodeAllocator>,
    /// Changes queued for the next commit and how far commits have come.
    log_state: Mutex<Log>,
    committed: Condvar,
    /// Held by the one thread committing; the others wait on `committed`.
    commit: Mutex<()>,
    stats: Mutex<CommitStats>,
    compact_min_bytes: std::sync::atomic::AtomicU64,
}

/// How the group commit has gone: commits, changes written, time spent committing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    pub commits: u64,
    pub changes: u64,
    pub busy: std::time::Duration,
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
        let (log, replay) = AllocLog::open(path).map_err(|e| store_err(e.into()))?;
        if replay.torn_tail_bytes > 0 {
            tracing::warn!(path = %path.display(), bytes = replay.torn_tail_bytes, "cut off the unacknowledged end of the allocation log (a crash during a write)");
        }
        // Replay to the final state, then rebuild: blocks first, then the allocations in them.
        let mut blocks: std::collections::BTreeMap<String, Vec<u8>> =
            std::collections::BTreeMap::new();
        let mut allocations: std::collections::HashMap<String, Vec<u8>> =
            std::collections::HashMap::new();
        for record in replay.records {
            match record {
                Record::Put { key, value } if key.starts_with(BLOCK_PREFIX) => {
                    blocks.insert(key, value);
                }
                Record::Delete { key } if key.starts_with(BLOCK_PREFIX) => {
                    blocks.remove(&key);
                }
                Record::Put { key, value } => {
                    allocations.insert(key, value);
                }
                Record::Delete { key } => {
                    allocations.remove(&key);
                }
            }
        }
        let mut alloc = NodeAllocator::new(node, pool);
        let mut report = RestoreReport::default();
        for key in blocks.keys() {
            if let Ok(cidr) = key[BLOCK_PREFIX.len()..].parse::<Cidr>() {
                alloc.add_block(cidr);
                report.blocks += 1;
            }
        }
        for (k, v) in allocations {
            let owner = k.split_once(' ').map(|(_, o)| o).unwrap_or(&k);
            match bytes_ip(&v).map(|ip| alloc.restore_ip(owner, ip)) {
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
                log: Mutex::new(log),
                alloc: Mutex::new(alloc),
                log_state: Mutex::new(Log::default()),
                committed: Condvar::new(),
                commit: Mutex::new(()),
                stats: Mutex::new(CommitStats::default()),
                compact_min_bytes: std::sync::atomic::AtomicU64::new(COMPACT_MIN_BYTES),
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

    /// Stops new allocations from `cidr` (see `NodeAllocator::retire_block`); in memory only:
    /// the agent retires lost blocks again from the node's record after a restart.
    pub fn retire_block(&self, cidr: Cidr) -> u64 {
        self.alloc
            .lock()
            .expect("allocator lock")
            .retire_block(cidr)
    }

    /// An address for `owner`, acknowledged once durable. Idempotent.
    pub fn allocate(&self, owner: &str, family: Family) -> Result<IpAddr, DurableError> {
        let (ip, seq) = {
            let mut alloc = self.alloc.lock().expect("allocator lock");
            if let Some(ip) = alloc.lookup(owner, family) {
                // Held already; its write may still be in flight from a concurrent request.
                (ip, self.log_state.lock().expect("log lock").next_seq)
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

    /// Sets the addresses handed out only on request (a pool's `reserved`); nothing is
    /// logged: the pool's spec is read again on every start.
    pub fn set_requested_only(&self, cidrs: &[crate::Cidr]) {
        self.alloc
            .lock()
            .expect("allocator lock")
            .set_requested_only(cidrs);
    }

    /// Gives `ip` to `owner` (a requested address), durably.
    pub fn allocate_ip(&self, owner: &str, ip: IpAddr) -> Result<(), DurableError> {
        let seq = {
            let mut alloc = self.alloc.lock().expect("allocator lock");
            let known = alloc.lookup(owner, Family::of(ip)) == Some(ip);
            alloc.allocate_ip(owner, ip)?;
            if known {
                self.log_state.lock().expect("log lock").next_seq
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
                None => (None, self.log_state.lock().expect("log lock").next_seq),
            }
        };
        self.wait_durable(seq)?;
        Ok(ip)
    }

    /// Moves what `from` holds in `family` to `to`, keeping the address, durably (a migration of
    /// owner keys). The new key is written before the old one is deleted, in one batch: a crash
    /// between the two leaves both keys naming the address, and restoring keeps one of them.
    pub fn rename(
        &self,
        from: &str,
        to: &str,
        family: Family,
    ) -> Result<Option<IpAddr>, DurableError> {
        let (ip, seq) = {
            let mut alloc = self.alloc.lock().expect("allocator lock");
            match alloc.rename(from, to, family)? {
                Some(ip) => {
                    self.push(Op::Put {
                        key: key(to, family),
                        ip,
                    });
                    (
                        Some(ip),
                        self.push(Op::Rename {
                            key: key(from, family),
                            to: to.to_owned(),
                            ip,
                        }),
                    )
                }
                None => (None, self.log_state.lock().expect("log lock").next_seq),
            }
        };
        self.wait_durable(seq)?;
        Ok(ip)
    }

    /// Lowers the size at which the log may be compacted (tests exercise compaction with it).
    pub fn set_compact_min_bytes(&self, bytes: u64) {
        self.compact_min_bytes
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Commit statistics since the state file was opened.
    pub fn commit_stats(&self) -> CommitStats {
        *self.stats.lock().expect("stats lock")
    }

    /// Runs `f` on the in-memory allocator (status, checks).
    pub fn with<T>(&self, f: impl FnOnce(&NodeAllocator) -> T) -> T {
        f(&self.alloc.lock().expect("allocator lock"))
    }

    /// Queues `op`; called with the allocator lock held so log order is memory order.
    fn push(&self, op: Op) -> u64 {
        let mut log = self.log_state.lock().expect("log lock");
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
                let log = self.log_state.lock().expect("log lock");
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
                let log = self.log_state.lock().expect("log lock");
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
        let batch = std::mem::take(&mut self.log_state.lock().expect("log lock").pending);
        let Some(&(last, _)) = batch.last() else {
            return;
        };
        let first = batch[0].0;
        let started = std::time::Instant::now();
        let result = self.write(&batch);
        {
            let mut stats = self.stats.lock().expect("stats lock");
            stats.commits += 1;
            stats.changes += batch.len() as u64;
            stats.busy += started.elapsed();
        }
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
                        // Back to the pod that held it, even in a block retired since.
                        let _ = alloc.restore_ip(owner, *ip);
                    }
                    Op::Rename { key, to, ip } => {
                        // Undone in reverse order: this runs before the new key's Put is
                        // undone, so the address goes back to its old owner.
                        let owner = key.split_once(' ').map_or(key.as_str(), |(_, o)| o);
                        let _ = alloc.rename(to, owner, Family::of(*ip));
                        // The Put's undo then finds nothing of `to` to release.
                    }
                    Op::AddBlock { cidr, .. } => {
                        alloc.remove_block(*cidr);
                    }
                    Op::RemoveBlock { cidr } => alloc.add_block(*cidr),
                }
            }
            tracing::error!(path = %self.path.display(), "commit of {} change(s) failed: {e}", batch.len());
        }
        let ok = result.is_ok();
        {
            let mut log = self.log_state.lock().expect("log lock");
            if let Err(e) = result {
                // Every waiter of the batch gets the same error: keep its text.
                log.failed.push((first, last, e.to_string()));
            }
            log.durable_seq = last;
            self.committed.notify_all();
        }
        // Still holding the commit lock: no write can interleave with the compaction.
        if ok {
            self.maybe_compact();
        }
    }

    fn write(&self, batch: &[(u64, Op)]) -> std::io::Result<()> {
        let records: Vec<Record> = batch
            .iter()
            .map(|(_, op)| match op {
                Op::Put { key, ip } => Record::Put {
                    key: key.clone(),
                    value: ip_bytes(*ip),
                },
                Op::Delete { key, .. } | Op::Rename { key, .. } => {
                    Record::Delete { key: key.clone() }
                }
                Op::AddBlock { cidr, pool } => Record::Put {
                    key: format!("{BLOCK_PREFIX}{cidr}"),
                    value: pool.as_bytes().to_vec(),
                },
                Op::RemoveBlock { cidr } => Record::Delete {
                    key: format!("{BLOCK_PREFIX}{cidr}"),
                },
            })
            .collect();
        self.log.lock().expect("log file lock").append(&records)
    }

    /// Rewrites the log as a snapshot when it has grown well past its live content. Runs with
    /// the allocator locked and nothing queued, so the snapshot holds acknowledged state only.
    fn maybe_compact(&self) {
        let mut log = self.log.lock().expect("log file lock");
        if log.len()
            < self
                .compact_min_bytes
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        let alloc = self.alloc.lock().expect("allocator lock");
        if !self.log_state.lock().expect("log lock").pending.is_empty() {
            return;
        }
        let allocations = alloc.allocations();
        let live_estimate = allocations
            .iter()
            .map(|(o, _)| o.len() as u64 + 40)
            .sum::<u64>();
        if log.len() < 3 * live_estimate {
            return;
        }
        let mut snapshot = Vec::with_capacity(allocations.len() + 8);
        for family in [Family::V4, Family::V6] {
            for cidr in alloc.blocks(family) {
                snapshot.push(Record::Put {
                    key: format!("{BLOCK_PREFIX}{cidr}"),
                    value: alloc.pool().as_bytes().to_vec(),
                });
            }
        }
        for (owner, ip) in allocations {
            snapshot.push(Record::Put {
                key: key(&owner, Family::of(ip)),
                value: ip_bytes(ip),
            });
        }
        let before = log.len();
        match log.compact(&snapshot) {
            Ok(()) => {
                tracing::debug!(path = %self.path.display(), before, after = log.len(), "allocation log compacted");
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), "allocation log compaction failed (the log stays valid): {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::pod::node::ROUTER_OWNER;

    fn temp(name: &str) -> crate::test_util::TempPath {
        crate::test_util::TempPath::new(&format!("durable-{name}.log"))
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
    fn compaction_keeps_every_live_allocation_and_nothing_else() {
        let path = temp("compact");
        let kept: Vec<(String, IpAddr)>;
        {
            let (d, _) = DurableAllocator::open(&path, "node-1", "default").unwrap();
            d.set_compact_min_bytes(4096);
            d.add_block("10.44.0.0/22".parse().unwrap()).unwrap();
            for i in 0..2000 {
                d.allocate(&format!("churn/p{i}"), Family::V4).unwrap();
                if i % 10 != 0 {
                    d.release(&format!("churn/p{i}"), Family::V4).unwrap();
                }
            }
            kept = d.with(super::super::node::NodeAllocator::allocations);
            assert_eq!(kept.len(), 200);
            let size = std::fs::metadata(&*path).unwrap().len();
            // 3,800 records would take ~110 KB; compaction keeps the log within three times
            // the live content (~31 KB here) plus the batches since.
            assert!(size < 40_000, "the log was compacted ({size} bytes)");
        }
        let (d, report) = DurableAllocator::open(&path, "node-1", "default").unwrap();
        assert_eq!((report.blocks, report.allocations), (1, 200));
        for (owner, ip) in kept {
            assert_eq!(d.with(|a| a.lookup(&owner, Family::V4)), Some(ip));
        }
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
