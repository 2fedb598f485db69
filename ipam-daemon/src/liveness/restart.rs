//! A stop for a restart (`[node] on_stop = "restart"`) on the L2 side: the agent promises to be
//! back within `[node] restart_within_ms`, and the cluster keeps its Service IPs where they are
//! meanwhile, so a rolling upgrade moves no IP and costs no request.
//!
//! The promise is kept by both sides, with no clock compared between nodes:
//! 1. the stopping agent, its fence open, writes the notice into its node's record
//!    (`spec.restarting`), within [`write_budget`] and while the fence stays open; its heartbeat
//!    task beats on meanwhile (only while the fence is open), so the responders do not run on a
//!    last beat that may lapse during the write (a `liveness_timeout` shorter than the write);
//! 2. then it stops the heartbeat task and, the fence still open, extends its responders'
//!    deadline to `within` from *before* step 1 (one heartbeat with the staleness left);
//! 3. then leaves the gossip without a goodbye (with leases, its lease is left to lapse).
//!
//! Each other agent holds the node's IPs for `within` from when *it* sees the notice, which is
//! after step 1 began: its hold ends no sooner than the responders fall silent, so two nodes
//! never answer one IP. Until step 2 the responders run on the last heartbeat, under the
//! fencing rule like any node's (silent before another node may take its IPs over): a promise
//! that fails (a store that does not answer in time, a fence that closes) has extended
//! nothing; once the write has begun, the store may hold the notice whatever the error, so it
//! is withdrawn (tried for [`WITHDRAW_BUDGET`]: left there it would hold the node live at every
//! agent that saw it, its IPs answered by nobody, for `within`); then the caller silences the
//! responders and stops as for a leave. Extending them
//! first, as this did before, left them answering for `within` (up to 60 s) after a failed
//! write while the others took the IPs over after one node lease: two MACs for one IP. The
//! fence open at step 2 means the others cannot have taken the IPs over without the notice: with
//! leases its last renewal is under half a lease old, and they wait a whole one; with the gossip
//! its member still answers. The next agent keeps the responders answering until its fence first opens
//! (`heartbeat`), takes the IPs up as its own without a hand-over wait, and clears the notice
//! once its fence has opened; the others drop their hold once the notice is cleared and the
//! node is live. If it is not back in time, the responders fall silent and the others take the
//! IPs over as from a dead node.
//!
//! Why the notice is cleared only once the fence has opened: until the others have heard the
//! next agent (its gossip member answered, or its lease renewed), they may still count the node
//! live from the agent before, whose silence they have not noticed yet. A notice cleared then
//! ends their hold on that stale liveness, and when the silence is noticed (the gossip declares
//! the old member dead, the old renewal lapses) they take the IPs over while the next agent
//! answers them too: two MACs for one IP. An open fence means the others hear this agent.

use std::{
    path::Path,
    sync::Mutex,
    time::{Duration, Instant, SystemTime},
};

use ipam_core::{
    backoff::Backoff,
    resources::{NodeIpamSpec, RestartNotice},
    store::StoreError,
};
use ipam_datapath::Datapath;
use tokio::task::JoinHandle;

use super::{
    Fence,
    own_record::{self, Amended},
};
use crate::cluster::ClusterStore;

/// Attempts at writing the notice against concurrent writers of the record.
const ATTEMPTS: usize = 3;
/// The longest wait between attempts at ending a notice the store did not take.
const RETRY_CAP: Duration = Duration::from_secs(5);
/// The longest a stopping agent waits for its notice to be written, whatever `within`: the stop
/// must end well inside a pod's termination grace period (30 s by default).
const WRITE_CAP: Duration = Duration::from_secs(5);
/// The longest a stopping agent tries to withdraw its notice after a failed promise.
const WITHDRAW_BUDGET: Duration = Duration::from_secs(2);
/// How often a lease fence is looked at while the notice is written (it has no events).
const FENCE_POLL: Duration = Duration::from_millis(10);

/// How long the notice write may take for a promise of `within`: half of it, so that at least
/// half the promise is left to the next agent, and at most [`WRITE_CAP`]. Safety does not rest
/// on it (the fence does: step 2 is made only while it is open); it bounds the stop.
pub fn write_budget(within: Duration) -> Duration {
    (within / 2).min(WRITE_CAP)
}

/// Where a stopping agent leaves the end of its promise for the next one, in the node's
/// private directory (`NodeSettings::private_file`). In CLOCK_MONOTONIC nanoseconds, the same
/// clock for every process of the host.
pub const PROMISE_FILE: &str = "restart-promise";

/// At the start: whether the agent before this one stopped for a restart and its promise still
/// runs (its responders still answer: this agent takes up what they answer without a wait).
/// The file goes either way.
pub fn promise_runs(file: &Path) -> bool {
    let until = std::fs::read_to_string(file)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok());
    let _ = std::fs::remove_file(file);
    until.is_some_and(|until| ipam_datapath::clock::monotonic_ns() < until)
}

/// A promise to be back within `within`, made for `node` through `store` (and the datapath's
/// responders, [`Promise::make`]), and left in `file` for the next agent.
pub struct Promise<'a> {
    pub store: &'a ClusterStore,
    pub node: &'a str,
    pub within: Duration,
    pub file: &'a Path,
    /// The node's fence (the lease's or the gossip's): the promise is made only while it is
    /// open.
    pub fence: Option<Fence>,
    /// The Service IPs the responders answer on, written in the notice: the others leave them
    /// here while the node is held, whatever else changes.
    pub answering: Vec<std::net::IpAddr>,
}

impl Promise<'_> {
    /// Steps 1 and 2, the file written first; `heartbeat` (the heartbeat task) runs through
    /// step 1 and is stopped just before step 2, and on every path out. On an error the file
    /// is gone again and the responders were not extended; the caller silences them all the
    /// same (the datapath's state after a failed step is not known) and stops as for a leave.
    pub async fn make(
        &self,
        datapath: &Mutex<Datapath>,
        heartbeat: &mut JoinHandle<()>,
    ) -> Result<(), String> {
        self.make_with(heartbeat, |left| {
            datapath
                .lock()
                .expect("datapath lock")
                .heartbeat(left)
                .map_err(|e| format!("cannot extend the responders' deadline: {e}"))
        })
        .await
    }

    /// [`Self::make`], the responders extended by `extend` (for the staleness left).
    async fn make_with(
        &self,
        heartbeat: &mut JoinHandle<()>,
        extend: impl FnOnce(Duration) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut beating = Some(heartbeat);
        let mut writing = false;
        let made = self
            .keep_promising(&mut beating, &mut writing, extend)
            .await;
        if let Some(heartbeat) = beating {
            stop(heartbeat).await;
        }
        if let Err(e) = &made {
            let _ = std::fs::remove_file(self.file);
            // The store may have taken the notice whatever the error (a write cut short by
            // the budget or the fence, an answer lost, a later step failed): left there, it
            // would hold this node live at every agent that saw it, for `within`, while the
            // caller silences the responders: its IPs answered by nobody.
            if writing {
                self.withdraw_notice(e).await;
            }
        }
        made
    }

    /// Clears the notice after a failed promise, within [`WITHDRAW_BUDGET`] (the stop must
    /// end), before the caller silences the responders.
    async fn withdraw_notice(&self, failed: &str) {
        let (store, node) = (self.store, self.node);
        let tries = async {
            let mut backoff = Backoff::new(Duration::from_millis(250));
            loop {
                match try_clear_notice(store, node).await {
                    Ok(Some(_)) => return,
                    Ok(None) => continue,
                    Err(_) => tokio::time::sleep(backoff.next_delay()).await,
                }
            }
        };
        match tokio::time::timeout(WITHDRAW_BUDGET, tries).await {
            Ok(()) => tracing::warn!(
                node,
                "the restart promise failed ({failed}): node {node}'s restart notice is \
                 withdrawn (or was never written), so the other nodes follow its liveness and \
                 take its Service IPs over once it stops"
            ),
            Err(_) => tracing::error!(
                node,
                "the restart promise failed ({failed}), and node {node}'s restart notice could \
                 not be withdrawn from {} within {} s: the other nodes that saw it hold this \
                 node live, and leave its Service IPs unanswered, for up to [node] \
                 restart_within_ms ({} ms) or until its next agent's fence opens",
                store.describe(),
                WITHDRAW_BUDGET.as_secs(),
                self.within.as_millis()
            ),
        }
    }

    async fn keep_promising(
        &self,
        heartbeat: &mut Option<&mut JoinHandle<()>>,
        writing: &mut bool,
        extend: impl FnOnce(Duration) -> Result<(), String>,
    ) -> Result<(), String> {
        let (store, node, file) = (self.store, self.node, self.file);
        // The next agent trusts the promise until `until`, the responders answer until
        // `started` and `within`, and the others hold the node from when they see the notice,
        // after both.
        let until = ipam_datapath::clock::monotonic_ns()
            .saturating_add(u64::try_from(self.within.as_nanos()).unwrap_or(u64::MAX));
        let started = Instant::now();
        self.fence_open("before its restart notice was written")?;
        std::fs::write(file, format!("{until}\n"))
            .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
        let budget = write_budget(self.within);
        *writing = true;
        tokio::select! {
            written = self.write_notice() => written?,
            () = tokio::time::sleep(budget) => {
                return Err(format!(
                    "the restart notice was not written into node {node}'s record in {} \
                     within {} ms (half of [node] restart_within_ms, at most {} s): the store \
                     is slow or unreachable",
                    store.describe(),
                    budget.as_millis(),
                    WRITE_CAP.as_secs()
                ));
            }
            why = closes(self.fence.clone()) => {
                return Err(format!(
                    "node {node} may no longer answer ({why}) while its restart notice was \
                     written: the others may take its Service IPs over before they see it"
                ));
            }
        }
        // The heartbeat beat (while the fence was open) through the write, so the responders
        // did not run on a last beat meanwhile; it stops now, before the fence is looked at
        // for the last time, so that no beat of its own comes after the extension.
        if let Some(heartbeat) = heartbeat.take() {
            stop(heartbeat).await;
        }
        self.fence_open("once its restart notice was written")?;
        let left = self.within.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(format!(
                "node {node}'s restart notice took longer than [node] restart_within_ms ({} ms) \
                 to write",
                self.within.as_millis()
            ));
        }
        extend(left)
    }

    /// An error saying why, when the node's fence is closed `when`.
    fn fence_open(&self, when: &str) -> Result<(), String> {
        match self.fence.as_ref().and_then(Fence::why_silent) {
            None => Ok(()),
            Some(why) => Err(format!(
                "node {} may not answer {when} ({why}): its responders must not go on \
                 answering while the others may take its Service IPs over",
                self.node
            )),
        }
    }

    /// Step 1, against concurrent writers of the record.
    async fn write_notice(&self) -> Result<(), String> {
        let (store, node) = (self.store, self.node);
        let notice = RestartNotice {
            within_ms: u64::try_from(self.within.as_millis()).unwrap_or(u64::MAX),
            since_unix_ms: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            answering: Some(self.answering.clone()),
        };
        for _ in 0..ATTEMPTS {
            match write_notice(store, node, &notice).await {
                Ok(true) => return Ok(()),
                Ok(false) => continue,
                Err(e) => {
                    return Err(format!(
                        "cannot write the restart notice into node {node}'s record in {}: {e}",
                        store.describe()
                    ));
                }
            }
        }
        Err(format!(
            "node {node}'s record kept changing while the restart notice was written"
        ))
    }
}

/// Stops the heartbeat task, and waits until it has (a beat under way is over).
async fn stop(heartbeat: &mut JoinHandle<()>) {
    heartbeat.abort();
    let _ = heartbeat.await;
}

/// Waits until `fence` closes, and says why; never without one.
async fn closes(fence: Option<Fence>) -> String {
    let Some(mut fence) = fence else {
        return std::future::pending().await;
    };
    loop {
        if let Some(why) = fence.why_silent() {
            return why;
        }
        match fence {
            // A lease fence closes with time, with no event.
            Fence::Lease(_) => tokio::time::sleep(FENCE_POLL).await,
            Fence::Gossip(_) => fence.changed().await,
        }
    }
}

/// Whether the notice went in (`false`: the record changed meanwhile, try again).
async fn write_notice(
    store: &ClusterStore,
    node: &str,
    notice: &RestartNotice,
) -> Result<bool, StoreError> {
    let note = |spec: &mut NodeIpamSpec| {
        spec.restarting = Some(notice.clone());
        true
    };
    match own_record::amend(store, node, note).await? {
        Amended::Written | Amended::AlreadySo => Ok(true),
        Amended::Raced => Ok(false),
        Amended::Missing => Err(own_record::missing(node)),
    }
}

/// At the start of every agent with a store, once this node may answer (`fence`, none without
/// peers): a restart notice left in the node's record (by the agent before, whether or not this
/// one found its promise) is over, since this agent runs and the others hear it. They drop
/// their hold once this node is live in their view too. Until then the notice holds this node
/// live in this agent's own view as well, as it promised.
pub async fn clear_notice_once_live(store: ClusterStore, node: String, fence: Option<Fence>) {
    if let Some(mut fence) = fence {
        fence.opened().await;
    }
    clear_notice(&store, &node).await;
}

/// Clears `node`'s restart notice, if its record has one, retrying with backoff while the
/// store cannot be reached (until then the others hold the node live, at most for the
/// notice's time, and then follow its liveness as for any node).
async fn clear_notice(store: &ClusterStore, node: &str) {
    let mut backoff = Backoff::new(RETRY_CAP);
    let mut said = false;
    loop {
        match try_clear_notice(store, node).await {
            Ok(Some(ended)) => {
                if ended {
                    tracing::info!(
                        node,
                        "node {node}'s restart notice ended: the others hear this agent, which \
                         answers for the node's Service IPs"
                    );
                }
                return;
            }
            Ok(None) => continue,
            Err(e) => {
                if !std::mem::replace(&mut said, true) {
                    tracing::warn!(
                        node,
                        "cannot end node {node}'s restart notice in {} ({e}); retrying",
                        store.describe()
                    );
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// One attempt: whether a notice was there and ended, `None` when the record changed
/// meanwhile (try again). Against the revision read, so a notice write still under way (cut
/// short at this end) either lands before and is ended, or finds the record changed.
async fn try_clear_notice(store: &ClusterStore, node: &str) -> Result<Option<bool>, StoreError> {
    let cleared = own_record::amend(store, node, |spec| spec.restarting.take().is_some()).await?;
    Ok(match cleared {
        Amended::Written => Some(true),
        Amended::AlreadySo | Amended::Missing => Some(false),
        Amended::Raced => None,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering::SeqCst},
    };

    use ipam_core::{
        resources::NodeIpam,
        store::{TypedStore, embedded::EmbeddedStore},
    };

    use super::*;
    use crate::liveness::LeaseFence;

    async fn store_with(node: &str) -> (tempfile::TempDir, ClusterStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("state.redb")).unwrap();
        store
            .create_typed(node, &NodeIpam::default())
            .await
            .unwrap();
        (
            dir,
            ClusterStore::from(ipam_store::AnyStore::Embedded(store)),
        )
    }

    async fn notice_of(store: &ClusterStore, node: &str) -> Option<RestartNotice> {
        let record = store.get_typed::<NodeIpam>(node).await.unwrap().unwrap();
        record.value.spec.restarting
    }

    /// A stand-in for the heartbeat task: runs until aborted, and then calls `stopped`.
    fn heartbeat(stopped: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
        struct OnDrop<F: FnOnce()>(Option<F>);
        impl<F: FnOnce()> Drop for OnDrop<F> {
            fn drop(&mut self) {
                if let Some(f) = self.0.take() {
                    f();
                }
            }
        }
        let guard = OnDrop(Some(stopped));
        tokio::spawn(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        })
    }

    fn open_lease() -> Arc<LeaseFence> {
        let lease = Arc::new(LeaseFence::new(Duration::from_secs(60)));
        lease.renewed(Instant::now());
        lease
    }

    fn promise<'a>(
        store: &'a ClusterStore,
        file: &'a Path,
        lease: &Arc<LeaseFence>,
    ) -> Promise<'a> {
        Promise {
            store,
            node: "node-0",
            within: Duration::from_secs(10),
            file,
            fence: Some(Fence::Lease(lease.clone())),
            answering: Vec::new(),
        }
    }

    /// The heartbeat beats on through the notice write (the responders must not run on its
    /// last beat meanwhile), and is stopped before the responders are extended (no beat of its
    /// own after the extension).
    #[tokio::test]
    async fn the_heartbeat_is_stopped_by_the_promise_just_before_the_extension() {
        let (dir, store) = store_with("node-0").await;
        let file = dir.path().join(PROMISE_FILE);
        let lease = open_lease();
        let stopped = Arc::new(AtomicBool::new(false));
        let mut beating = heartbeat({
            let stopped = stopped.clone();
            move || stopped.store(true, SeqCst)
        });
        let mut extended = None;
        promise(&store, &file, &lease)
            .make_with(&mut beating, |left| {
                assert!(
                    stopped.load(SeqCst),
                    "the heartbeat stopped before the extension"
                );
                extended = Some(left);
                Ok(())
            })
            .await
            .unwrap();
        assert!(extended.is_some_and(|left| left > Duration::from_secs(9)));
        assert!(beating.is_finished());
        assert!(notice_of(&store, "node-0").await.is_some());
        assert!(file.exists());
    }

    /// The notice went into the store, then the fence closed (here as the heartbeat stops):
    /// the promise fails, and the notice is withdrawn, or the others would hold the silenced
    /// node live for `within` with nobody answering its IPs.
    #[tokio::test]
    async fn a_promise_whose_fence_closes_once_the_notice_is_in_withdraws_it() {
        let (dir, store) = store_with("node-0").await;
        let file = dir.path().join(PROMISE_FILE);
        let lease = open_lease();
        let mut beating = heartbeat({
            let lease = lease.clone();
            move || lease.renewed(Instant::now() - Duration::from_secs(60))
        });
        let made = promise(&store, &file, &lease)
            .make_with(&mut beating, |_| panic!("extended with the fence closed"))
            .await;
        assert!(made.unwrap_err().contains("may not answer"));
        assert_eq!(notice_of(&store, "node-0").await, None);
        assert!(!file.exists());
        assert!(beating.is_finished());
    }

    /// The notice is in and the fence open, but the extension fails: the notice is withdrawn.
    #[tokio::test]
    async fn a_promise_whose_extension_fails_withdraws_its_notice() {
        let (dir, store) = store_with("node-0").await;
        let file = dir.path().join(PROMISE_FILE);
        let lease = open_lease();
        let mut beating = heartbeat(|| {});
        let made = promise(&store, &file, &lease)
            .make_with(&mut beating, |_| Err("no datapath".to_owned()))
            .await;
        assert_eq!(made.unwrap_err(), "no datapath");
        assert_eq!(notice_of(&store, "node-0").await, None);
        assert!(!file.exists());
    }

    #[test]
    fn the_notice_write_leaves_at_least_half_the_promise_and_at_most_five_seconds() {
        assert_eq!(
            write_budget(Duration::from_secs(1)),
            Duration::from_millis(500)
        );
        assert_eq!(write_budget(Duration::from_secs(60)), WRITE_CAP);
    }

    /// The write is cut short when the lease fence closes (half a lease after the last
    /// renewal, with no event): from then on the others may take the IPs over within half a
    /// lease, and the responders must not be extended.
    #[tokio::test]
    async fn a_notice_write_ends_when_the_lease_fence_closes() {
        let lease = Arc::new(LeaseFence::new(Duration::from_millis(200)));
        lease.renewed(Instant::now());
        let started = Instant::now();
        let why = tokio::time::timeout(
            Duration::from_secs(5),
            closes(Some(Fence::Lease(lease.clone()))),
        )
        .await
        .expect("closed");
        assert!(why.contains("lease"), "{why}");
        assert!(started.elapsed() >= Duration::from_millis(90));
        // Without a fence (no store: no promise is made), it never closes.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), closes(None))
                .await
                .is_err()
        );
    }
}
