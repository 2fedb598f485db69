//! Permanent neighbour entries.

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
    route::RouteType,
};

use crate::{Netlink, NetlinkError};

impl Netlink {
    /// A permanent neighbour entry: `ip` is at `mac` on link `index`. No ARP or NDP is ever sent
    /// for it, and it never expires.
    pub fn add_permanent_neighbour(
        &self,
        index: u32,
        ip: IpAddr,
        mac: [u8; 6],
    ) -> Result<(), NetlinkError> {
        let mut message = NeighbourMessage::default();
        message.header.family = match ip {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        message.header.ifindex = index;
        message.header.state = NeighbourState::Permanent;
        message.header.kind = RouteType::Unspec;
        message
            .attributes
            .push(NeighbourAttribute::Destination(match ip {
                IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
                IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
            }));
        message
            .attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        self.socket
            .request(
                RouteNetlinkMessage::NewNeighbour(message),
                NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
            )
            .map(drop)
            .map_err(|e| {
                NetlinkError::new(format!("cannot add neighbour {ip} on link #{index}"), e)
            })
    }
}
