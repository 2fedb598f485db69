//! L2 announcements: which Service IPs this node answers ARP/NDP for, and answering them on its
//! links.
//!
//! - `owners`: runs the decision of the cluster's Service IPs this node owns
//!   (`ipam_core::l2`: rendezvous hashing over the live nodes, the same answer on every node;
//!   break before make when an IP moves from a node that is still alive; restart holds) on
//!   the store's copies, and carries its plan out: the address each needs on `lo`, the owned
//!   IPs and the hand-overs (`HandedOver`, the connections the old owner still holds, passed
//!   on to it for a while) for the responder, Events;
//! - `configured`: the one producer of `Announcements`, from the IPs configured in the daemon's
//!   file and the owned service IPs;
//! - `announcements`: the values they agree on: the owned service IPs, and which IPs to answer
//!   on which interface, attached how;
//! - `announcer`: brings the responder maps and attachments in line with it, by difference;
//! - `responder`: the controller that runs the announcer whenever the value changes, retries
//!   interfaces that are not there yet, and tells the link;
//! - `gratuitous`: the frames that tell the link an IP is answered here now, the one place that
//!   sends them;
//! - `multicast`: the solicited-node groups the answered IPv6 addresses need on their
//!   interfaces, so a NIC that filters multicast lets their neighbour solicitations through.

pub mod announcements;
pub mod announcer;
pub mod configured;
pub mod gratuitous;
pub mod multicast;
pub mod owners;
pub mod responder;

pub use announcements::{Announcements, HandOn, HandedOver, OwnedIp, OwnedIps};
pub use configured::Configured;
