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
//! Counting it out is one member out of the majority's set at a time, as Raft changes its
//! membership one server at a time: a majority of the set with it and a majority of the set
//! without it always share a member, so nodes that have and have not seen the note yet cannot
//! both answer on two sides of a partition. The next agent clears the note once its fence has
//! opened (`restart::clear_notice_once_live`), and is counted again from then on.
//!
//! The note is best effort within [`WRITE_BUDGET`]: the stop must end well inside a pod's
//! termination grace period. Without it the others count the node until its lease lapses, as
//! before.

use std::time::{Duration, SystemTime};

use ipam_core::{
    resources::{LeaveNotice, NodeIpam},
    store::{StoreError, TypedStore},
};

use crate::cluster::ClusterStore;

/// The longest a leaving agent waits for its note to be written.
pub const WRITE_BUDGET: Duration = Duration::from_secs(1);
/// Attempts at writing the note against concurrent writers of the record.
const ATTEMPTS: usize = 3;

/// Notes in `node`'s record that its agent left, within [`WRITE_BUDGET`]; says what came of it.
/// Call it with the responders silent, before the gossip's goodbye.
pub async fn note(store: &ClusterStore, node: &str) {
    let since_unix_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let notice = LeaveNotice { since_unix_ms };
    match tokio::time::timeout(WRITE_BUDGET, write(store, node, &notice)).await {
        Ok(Ok(true)) => tracing::info!(
            node,
            "node {node}'s record says it left: the others reckon their majority without it"
        ),
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
        let Some(record) = store.get_typed::<NodeIpam>(node).await? else {
            return Err(StoreError::NotFound {
                kind: "NodeIPAM".into(),
                name: node.to_owned(),
            });
        };
        let mut updated = record.value;
        updated.spec.left = Some(notice.clone());
        if store
            .update_unless_changed(node, &updated, &record.revision)
            .await?
        {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use ipam_core::store::embedded::EmbeddedStore;

    use super::*;

    /// The note lands in the record, and the next agent's clearing (once its fence opened)
    /// takes it out again with the restart notice.
    #[tokio::test]
    async fn a_leave_is_noted_and_the_next_agent_clears_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("state.redb")).unwrap();
        store
            .create_typed("n1", &NodeIpam::default())
            .await
            .unwrap();
        let store = ClusterStore::from(ipam_store::AnyStore::Embedded(store));
        note(&store, "n1").await;
        let left = |store: ClusterStore| async move {
            store
                .get_typed::<NodeIpam>("n1")
                .await
                .unwrap()
                .unwrap()
                .value
                .spec
                .left
        };
        assert!(
            left(store.clone())
                .await
                .is_some_and(|n| n.since_unix_ms > 0)
        );
        super::super::restart::clear_notice_once_live(store.clone(), "n1".into(), None).await;
        assert_eq!(left(store).await, None);
    }

    /// A node with no record (deleted meanwhile) is told, not a panic, and writes nothing.
    #[tokio::test]
    async fn a_leave_without_a_record_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("state.redb")).unwrap();
        let store = ClusterStore::from(ipam_store::AnyStore::Embedded(store));
        note(&store, "gone").await;
        assert!(store.get_typed::<NodeIpam>("gone").await.unwrap().is_none());
    }
}
