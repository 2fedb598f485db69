//! L2 announcements: which Service IPs this node answers ARP/NDP for, and answering them on its
//! links.
//!
//! - `owners`: runs the decision of the cluster's Service IPs this node owns
//!   (`ipam_core::l2`: rendezvous hashing over the live nodes, the same answer on every node;
//!   break before make when an IP moves from a node that is still alive; restart holds) on
//!   the store's copies, and hands the responder its outcome whole (`ServiceAnswers`: the IPs
//!   answered, those on `lo`, the hand-overs); tells users (Events) and metrics;
//! - `configured`: what the daemon's file says (IPs, attach modes), and the `Announcements`
//!   it makes with the owned Service IPs;
//! - `announcements`: the values they agree on: the Service IPs handed over, and which IPs to
//!   answer on which interface, attached how;
//! - `announcer`: brings the responder maps and attachments in line with them, by difference;
//! - `responder`: the one applier: `lo`, the hand-overs, the maps (through the announcer) and
//!   the link told, in the order that keeps one answer per IP, whenever either value or the
//!   links change; retries interfaces that are not there yet;
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

pub use announcements::{
    Announcements, Answers, HandOn, HandedOver, OwnedIp, OwnedIps, ServiceAnswers,
};
pub use configured::Configured;
