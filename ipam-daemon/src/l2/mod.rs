//! L2 announcements: making announced IPs reachable on a link.
//!
//! `announcer` turns the wanted set of (IP, interface) into responder map entries and
//! attachments; `gratuitous` tells the link when an IP starts being answered here.

pub mod announcer;
pub mod gratuitous;
