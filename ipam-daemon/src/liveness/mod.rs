//! Node liveness and fencing: who is alive, and the one rule that keeps two nodes from answering
//! one IP, "answer only while you may".
//!
//! - `fence`: whether this node may answer (from its lease, or from the gossip);
//! - `lease`: renewing this node's lease, on a thread of its own;
//! - `gossip`: liveness between the agents over UDP (`[gossip]`), with no store in the way;
//! - `heartbeat`: the responders' heartbeat, written only while the fence allows, and the
//!   responders silenced at once when it closes;
//! - `peers`: which other nodes are alive, from their leases or from the gossip;
//! - `dead_peers`: the nodes the gossip declared dead whose kubelet is silent too, reported in
//!   this node's record for the operator (on Kubernetes);
//! - `own_record`: the notes an agent writes in its node's record (a restart, a leave);
//! - `dead_flows`: the connections this node's kernel still sends to those nodes' pods, deleted
//!   while they never got an answer.
//!
//! The two delays, with leases: this node stops answering once its lease is half a lease old
//! (plus the responders' `liveness_timeout`, kept below half a lease by the configuration
//! check), and the others take its IPs over only once they have seen its lease unrenewed for a
//! whole lease.
//!
//! With gossip: a node that hears no other member for `fence_quiet` (350 ms) is silenced at
//! once, and a killed agent's responders stop after `liveness_timeout`; no member is declared
//! dead before `suspect_to_down` (400 ms) after it stopped answering, and the configuration
//! check keeps both delays below that one. docs/liveness.md has the reasoning and the figures.

pub mod dead_flows;
pub mod dead_peers;
pub mod fence;
pub mod gossip;
pub mod heartbeat;
pub mod lease;
pub mod leave;
pub mod own_record;
pub mod peers;
pub mod restart;

pub use fence::{Fence, FenceState, LeaseFence};
pub use peers::LivePeers;
