//! The notes an agent keeps in its own node's record (`spec.restarting`, `spec.left`): each
//! written or cleared against the revision read, so a concurrent writer of the record (the
//! operator, the node's dead-peer reports) is never overwritten; the caller decides how often to
//! try again.

use ipam_core::{
    resources::{NodeIpam, NodeIpamSpec},
    store::{StoreError, TypedStore},
};

use crate::cluster::ClusterStore;

/// What came of one attempt at amending a node's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amended {
    /// The change went in.
    Written,
    /// The record already said so; nothing was written.
    AlreadySo,
    /// The record changed between the read and the write: read it again.
    Raced,
    /// The node has no record.
    Missing,
}

/// Reads `node`'s record, lets `change` amend its spec (it says whether it changed anything) and
/// writes it back unless the record changed meanwhile.
pub async fn amend(
    store: &ClusterStore,
    node: &str,
    change: impl FnOnce(&mut NodeIpamSpec) -> bool,
) -> Result<Amended, StoreError> {
    let Some(record) = store.get_typed::<NodeIpam>(node).await? else {
        return Ok(Amended::Missing);
    };
    let mut updated = record.value;
    if !change(&mut updated.spec) {
        return Ok(Amended::AlreadySo);
    }
    let written = store
        .update_unless_changed(node, &updated, &record.revision)
        .await?;
    Ok(if written {
        Amended::Written
    } else {
        Amended::Raced
    })
}

/// The error for a note that has no record to go in.
pub fn missing(node: &str) -> StoreError {
    StoreError::NotFound {
        kind: "NodeIPAM".into(),
        name: node.to_owned(),
    }
}
