//! A stop for a leave, on the store's side: before its gossip member says goodbye, the agent
//! notes in its node's record that it left (`spec.left`), its responders already silent.
//!
//! Why: the fence reckons a majority over the node records (`gossip::directory`). Without the
//! note a node that left is counted as a member that is not alive, so two of three agents
//! leaving (a drain of two nodes, an uninstall under way) leave the third a minority of one: it
//! fell silent for every Service IP until the operator released the others' leases (about
//! 7 s in the tests' fast settings), and clients whose neighbour entry aged meanwhile lost
//! requests. A node that left answers nothing and is out of the gossip, so leaving it out of
//! the count takes no answer away from anyone that could overlap with it.
//!
//! Safety rests on a node with the note never answering: if every node the note counts out is
//! silent, the nodes that answer are all counted by everyone, and two sides of a partition
//! cannot both hold more than half of them, whatever notes each side has seen. So:
//! - the note is written only once the responders are silent (the heartbeat stopped first,
//!   `daemon::node`), and
//! - the next agent keeps its fence closed while its own record shows the note
//!   (`Silenced::CountedOut`), and clears it at its start ([`clear_own`]), and again whenever
//!   it shows up (a write cut short by the budget may land later). It answers once the others
//!   count it, like a node whose record is new.
//!
//! The note is best effort within [`WRITE_BUDGET`]: the stop must end well inside a pod's
//! termination grace period. Without it the others count the node until its lease lapses, as
//! before.

use std::time::{Duration, SystemTime};

use ipam_core::{
    backoff::Backoff,
    resources::{LeaveNotice, NodeIpam, NodeIpamSpec},
    store::{RawObject, StoreError, TypedStore, WatchEvent, decode},
};

use super::own_record::{self, Amended};
use crate::cluster::{ClusterStore, cache::watch_until_it_works};

/// The longest a leaving agent waits for its note to be written.
pub const WRITE_BUDGET: Duration = Duration::from_secs(1);
/// How long a leaving agent waits between its note and its goodbye, for the note to reach the
/// others' watches first (a few ms on etcd, tens on an API server): a goodbye that comes first
/// leaves a node that counts on the note a minority until it comes, its fence closed for
/// `fence_reopen` (the drain test saw it one run in two with no wait). Its IPs are answered by
/// nobody meanwhile (its responders are silent already), which clients' neighbour entries
/// cover.
pub const SETTLE: Duration = Duration::from_millis(200);
/// Attempts at writing the note against concurrent writers of the record.
const ATTEMPTS: usize = 3;
/// The longest wait between attempts at clearing the note while the store does not answer.
const RETRY_CAP: Duration = Duration::from_secs(5);

/// Notes in `node`'s record that its agent left, within [`WRITE_BUDGET`]; says what came of it.
/// Call it with the responders silent, before the gossip's goodbye; once the note is in, it
/// waits [`SETTLE`] for the others to see it.
pub async fn note(store: &ClusterStore, node: &str) {
    let since_unix_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let notice = LeaveNotice { since_unix_ms };
    match tokio::time::timeout(WRITE_BUDGET, write(store, node, &notice)).await {
        Ok(Ok(true)) => {
            tracing::info!(
                node,
                "node {node}'s record says it left: the others reckon their majority without it"
            );
            tokio::time::sleep(SETTLE).await;
        }
        Ok(Ok(false)) => tracing::warn!(
            node,
            "node {node}'s record kept changing while its leave was noted ({ATTEMPTS} \
             attempts): the others count it until its lease lapses"
        ),
        Ok(Err(e)) => tracing::warn!(
            node,
            "cannot note node {node}'s leave in {} ({e}): the others count it until its \
             lease lapses",
            store.describe()
        ),
        Err(_) => tracing::warn!(
            node,
            "node {node}'s leave not noted in {} within {} ms: the others count it until its \
             lease lapses",
            store.describe(),
            WRITE_BUDGET.as_millis()
        ),
    }
}

/// Whether the note went in.
async fn write(store: &ClusterStore, node: &str, notice: &LeaveNotice) -> Result<bool, StoreError> {
    for _ in 0..ATTEMPTS {
        let note = |spec: &mut NodeIpamSpec| {
            spec.left = Some(notice.clone());
            true
        };
        match own_record::amend(store, node, note).await? {
            Amended::Written | Amended::AlreadySo => return Ok(true),
            Amended::Raced => continue,
            Amended::Missing => return Err(own_record::missing(node)),
        }
    }
    Ok(false)
}

/// For the life of the agent: clears a leave note in `node`'s record at the start, and again
/// whenever one shows up, retrying with backoff while the store does not answer (the fence stays
/// closed meanwhile, `Silenced::CountedOut`).
pub async fn clear_own(store: ClusterStore, node: String) {
    let mut watch = watch_until_it_works::<NodeIpam, _>(&store, "this node's leave note").await;
    let noted = |o: &RawObject| {
        o.name == node && decode::<NodeIpam>(o).is_ok_and(|r| r.value.spec.left.is_some())
    };
    if watch.initial.iter().any(noted) {
        clear(&store, &node).await;
    }
    loop {
        let seen = match watch.next().await {
            Ok(WatchEvent::Put(o)) => noted(&o),
            Ok(WatchEvent::Resync { objects, .. }) => objects.iter().any(noted),
            Ok(WatchEvent::Deleted { .. }) => false,
            // A watch in trouble is listed again by the shared watch; read the record meanwhile.
            Err(_) => read_noted(&store, &node).await,
        };
        if seen {
            clear(&store, &node).await;
        }
    }
}

/// Whether `node`'s record, read from the store, holds a leave note (no, when it cannot be read:
/// the watch brings it once the store answers).
async fn read_noted(store: &ClusterStore, node: &str) -> bool {
    matches!(
        store.get_typed::<NodeIpam>(node).await,
        Ok(Some(r)) if r.value.spec.left.is_some()
    )
}

/// Clears `node`'s leave note, retrying with backoff until it is gone.
async fn clear(store: &ClusterStore, node: &str) {
    let mut backoff = Backoff::new(RETRY_CAP);
    let mut said = false;
    loop {
        match try_clear(store, node).await {
            Ok(true) => {
                tracing::info!(
                    node,
                    "node {node}'s leave note cleared: the others count it in their majority \
                     again, and it may answer once its fence opens"
                );
                return;
            }
            Ok(false) => continue,
            Err(e) => {
                if !std::mem::replace(&mut said, true) {
                    tracing::warn!(
                        node,
                        "cannot clear node {node}'s leave note in {} ({e}); its responders stay \
                         silent until it is cleared; retrying",
                        store.describe()
                    );
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// One attempt: whether the note is gone (`false`: the record changed meanwhile, try again).
async fn try_clear(store: &ClusterStore, node: &str) -> Result<bool, StoreError> {
    let cleared = own_record::amend(store, node, |spec| spec.left.take().is_some()).await?;
    Ok(cleared != Amended::Raced)
}

#[cfg(test)]
mod tests {
    use ipam_core::store::embedded::EmbeddedStore;

    use super::*;

    /// The note lands in the record; the next agent clears it at its start, and again when a
    /// note shows up later (a write cut short by its budget that landed after the clear).
    #[tokio::test]
    async fn a_leave_is_noted_and_the_next_agent_clears_it_whenever_it_shows() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("state.redb")).unwrap();
        for node in ["n1", "n2"] {
            store
                .create_typed(node, &NodeIpam::default())
                .await
                .unwrap();
        }
        let store = ClusterStore::from(ipam_store::AnyStore::Embedded(store));
        let left = async |node: &str| {
            store
                .get_typed::<NodeIpam>(node)
                .await
                .unwrap()
                .unwrap()
                .value
                .spec
                .left
        };
        note(&store, "n1").await;
        note(&store, "n2").await;
        assert!(left("n1").await.is_some_and(|n| n.since_unix_ms > 0));
        let clearing = tokio::spawn(clear_own(store.clone(), "n1".into()));
        let gone = async |node: &str| {
            for _ in 0..200 {
                if left(node).await.is_none() {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        };
        assert!(gone("n1").await, "the note cleared at the start");
        note(&store, "n1").await;
        assert!(gone("n1").await, "a late note cleared too");
        assert!(
            left("n2").await.is_some(),
            "another node's note is not this agent's"
        );
        clearing.abort();
    }
}
