//! The L2 announcements' decisions, as pure functions of what a node knows and of the time it
//! is given (never read): who answers each Service IP, when an IP taken from a live node may
//! be answered, how long a restarting node keeps its IPs. The daemon's `l2::owners` runs them
//! on its copies of the store and carries their plans out (`lo`, the responder, Events);
//! `ipam-sim` runs the same functions on every node of a modelled cluster.
//!
//! - `owners`: one node's decision ([`owners::Decider`]), which returns a [`owners::Plan`];
//! - `pacing`: how often it is made, and the longest rest between two;
//! - `handover`: break before make between live nodes;
//! - `restarts`: nodes held live while their agents restart;
//! - `promised`: the IPs a node held for a restart keeps meanwhile;
//! - `view`: what a decision reads of the node's copies of the store.

pub mod handover;
pub mod owners;
pub mod pacing;
pub mod promised;
pub mod restarts;
pub mod view;

use std::{collections::BTreeMap, net::IpAddr, time::Instant};

/// The service IPs a node owns (`owners` decides them).
pub type OwnedIps = BTreeMap<IpAddr, OwnedIp>;

/// A service IP a node owns: whose it is, and the interfaces to answer on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedIp {
    pub service: String,
    pub interfaces: Vec<String>,
}

/// The IPs a node took from a node that still runs, by (IP, interface): whose connections
/// the responder passes on to the old owner, for a while (`owners` decides them).
pub type HandedOver = BTreeMap<(IpAddr, String), HandOn>;

/// Where, and until when, the responder passes on the segments of connections an IP's old
/// owner still holds (`ipam_common::l2::L2Handover`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandOn {
    /// The old owner's MAC on the interface's segment.
    pub old_owner: [u8; 6],
    pub until: Instant,
}

/// The nodes' records as one node's copy has them (in `resources`, since the BGP decision
/// reads them too).
pub use crate::resources::NodeRecords;
