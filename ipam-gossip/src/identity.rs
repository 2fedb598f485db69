//! Who a peer is: the address its agent gossips on, and a generation that grows with every start
//! of the agent, so a restarted agent is a new identity that wins over its old one at the same
//! address instead of fighting the cluster's memory of it.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PeerId {
    /// Where the agent receives gossip: the node's address and the gossip port.
    pub addr: SocketAddr,
    /// Seconds since the Unix epoch when the agent started (plus one per rejoin after being
    /// declared down): later starts win.
    pub generation: u32,
}

impl PeerId {
    pub fn new(addr: SocketAddr, generation: u32) -> Self {
        Self { addr, generation }
    }
}

impl foca::Identity for PeerId {
    type Addr = SocketAddr;

    /// Declared down while alive (a partition that healed, a long pause): come back as the next
    /// generation rather than stay out of the cluster.
    fn renew(&self) -> Option<Self> {
        Some(Self::new(self.addr, self.generation.wrapping_add(1)))
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.generation > adversary.generation
    }
}

impl std::fmt::Display for PeerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.addr, self.generation)
    }
}
