//! Node liveness between peers, with no store in the fast path.
//!
//! Every agent runs a member of a SWIM cluster (foca: probes, indirect probes, suspicion with
//! refutation, and changes spread on the back of every message). A dead node is declared dead
//! by every member within about a second, at any size, while each member's traffic stays
//! constant: one probe and about one answer per period, plus news when there is some.
//!
//! | module       | what it holds                                                      |
//! |--------------|--------------------------------------------------------------------|
//! | [`identity`] | [`PeerId`]: gossip address and generation                          |
//! | [`envelope`] | the authenticated, replay-proof envelope; [`Keyring`] and rotation |
//! | [`signing`]  | each agent's own key, and who speaks for each address ([`Signers`]) |
//! | [`timing`]   | [`Timing`]: probe, suspicion and gossip periods                    |
//! | [`contact`]  | what a member heard lately, and the [`Fence`] judged from it       |
//! | [`peer`]     | [`Peer`]: one member, sans-io (the caller brings packets and time)  |
//! | [`sim`]      | [`sim::Simulation`]: thousands of members on a modelled network     |
//!
//! Why foca: it is a library of the protocol alone (no sockets, no runtime, no clock), so the
//! same code runs in the daemon and, deterministically, in the simulator; its traffic per member
//! is constant. chitchat (scuttlebutt anti-entropy with a phi-accrual detector) was the other
//! candidate: it owns its UDP transport and tokio tasks, and each digest it sends lists every
//! node, so the bytes a node sends grow with the cluster.

pub mod contact;
pub mod envelope;
pub mod identity;
pub mod peer;
mod queue;
pub mod signing;
pub mod sim;
mod timers;
pub mod timing;

pub use contact::{Contact, Fence, Hello, Latch, Probes, Silenced, View};
pub use envelope::{Dropped, KeyError, Keyring};
pub use foca::State;
pub use identity::PeerId;
pub use peer::{Event, Now, Outgoing, Peer, Remembered, Settings, Stats};
pub use signing::{NodeKey, PublicKey, Signers, Speaker};
pub use timing::Timing;
