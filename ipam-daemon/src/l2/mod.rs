//! L2 announcements on this node's links: the datapath side of answering ARP/NDP for IPs.
//!
//! - `announcements`: the value every producer of announced IPs agrees on: which IPs to answer
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
pub mod gratuitous;
pub mod multicast;
pub mod responder;

pub use announcements::Announcements;
