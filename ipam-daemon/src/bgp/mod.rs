//! Service IPs over BGP, for fabrics that L2 cannot reach: every node that may serve a
//! Service's IP advertises a host route for it to its routers, which spread flows over the
//! nodes (ECMP) and withdraw a node's routes when its session is lost.
//!
//! - `announcer`: the controller (what this node advertises, kept applied, sessions reported);
//! - `bird_config`: BIRD's configuration for it, written whole and applied without resetting
//!   unchanged sessions;
//! - `bird`: the BIRD process the agent runs;
//! - `passwords`: peers' passwords read from Secrets;
//! - `sessions`: what BIRD says of its sessions, and why one is down;
//! - `status`: what is reported of them (metrics, log, the BGPPeer's status and condition).
//!
//! The speaker is BIRD 2, not one written here; docs/bgp.md says why BIRD over FRR and GoBGP.

pub mod announcer;
pub mod bird;
pub mod bird_config;
mod passwords;
pub mod sessions;
mod status;

pub use announcer::BgpAnnouncer;
