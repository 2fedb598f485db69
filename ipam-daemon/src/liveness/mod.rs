//! Node liveness and fencing: who is alive, and the one rule that keeps two nodes from answering
//! one IP, "answer only while you may".
//!
//! - `fence`: whether this node may answer: its own lease was renewed within half the lease;
//! - `lease`: renewing this node's lease, on a thread of its own;
//! - `heartbeat`: the responders' heartbeat, written only while the fence allows: without it
//!   the responders go silent after `liveness_timeout`;
//! - `peers`: which other nodes are alive, from their leases as this node observes them.
//!
//! The two delays: this node stops answering once its lease is half a lease old (plus the
//! responders' `liveness_timeout`, kept below half a lease by the configuration check), and the
//! others take its IPs over only once they have seen its lease unrenewed for a whole lease. So
//! the old owner is silent before a new one starts answering.

pub mod fence;
pub mod heartbeat;
pub mod lease;
pub mod peers;

pub use fence::Fence;
pub use peers::LivePeers;
