//! What the daemon needs to run as one of many: the store it shares with the other nodes and
//! operator replicas (one watch per kind, shared: `shared_watch`), the watches that wake its
//! controllers, and the operator role.

pub mod cache;
pub mod changes;
pub mod copies;
pub mod dead_nodes;
pub mod election;
pub mod events;
pub mod operator;
pub mod shared_watch;
pub mod store;
pub mod watched_reads;

pub use store::{ClusterStore, RecordNotWritten};
