//! Routes: out of a link, via a gateway, blackholes; and a dump of the main table.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REPLACE};
use netlink_packet_route::{
    RouteNetlinkMessage,
    route::{
        RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope,
        RouteType,
    },
};
use rtnetlink::RouteMessageBuilder;

use crate::{Netlink, NetlinkError};

/// A route of the main table, as a dump shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInfo {
    pub destination: IpAddr,
    pub prefix_len: u8,
    pub gateway: Option<IpAddr>,
    /// The link it leaves by; none for a blackhole.
    pub output: Option<u32>,
    pub blackhole: bool,
    /// Who installed it (`rtm_protocol`: 2 the kernel, 3 boot, 4 static, or a routing
    /// daemon's own number).
    pub protocol: u8,
}

/// The `rtm_protocol` of the routes ipamd installs towards other nodes' pod blocks, so that
/// a restarted daemon tells its own stale routes from everyone else's (`ip route show proto
/// 0x49`). 73: no number the kernel or iproute2's `rt_protos` assigns.
pub const IPAM_ROUTE_PROTOCOL: u8 = 0x49;

impl Netlink {
    /// Routes `destination/prefix_len` out of link `index`, through `gateway` when given, else
    /// directly on the link (scope link). Replaces a route to the same destination.
    pub fn add_route(
        &self,
        destination: IpAddr,
        prefix_len: u8,
        gateway: Option<IpAddr>,
        index: u32,
    ) -> Result<(), NetlinkError> {
        let what = || {
            format!(
                "cannot route {destination}/{prefix_len}{} via link #{index}",
                gateway.map(|g| format!(" via {g}")).unwrap_or_default()
            )
        };
        let mut builder = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(destination, prefix_len)
            .map_err(|e| invalid_route(what(), e))?
            .output_interface(index);
        builder = match gateway {
            Some(gateway) => builder
                .gateway(gateway)
                .map_err(|e| invalid_route(what(), e))?,
            None => builder.scope(RouteScope::Link),
        };
        self.socket
            .request(
                RouteNetlinkMessage::NewRoute(builder.build()),
                NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
            )
            .map(drop)
            .map_err(|e| NetlinkError::new(what(), e))
    }

    /// Routes `destination/prefix_len` through `gateway`, out of whichever link reaches the
    /// gateway. Replaces a route to the same destination.
    pub fn add_gateway_route(
        &self,
        destination: IpAddr,
        prefix_len: u8,
        gateway: IpAddr,
    ) -> Result<(), NetlinkError> {
        let what = || format!("cannot route {destination}/{prefix_len} via {gateway}");
        let message = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(destination, prefix_len)
            .and_then(|b| b.gateway(gateway))
            .map_err(|e| invalid_route(what(), e))?
            .build();
        self.change_route(message, what)
    }

    /// Routes `destination/prefix_len` through `gateway` on link `index`, marked with `protocol`
    /// (`ip route replace ... proto <protocol>`). Replaces a route to the same destination.
    pub fn add_route_by(
        &self,
        destination: IpAddr,
        prefix_len: u8,
        gateway: IpAddr,
        index: u32,
        protocol: u8,
    ) -> Result<(), NetlinkError> {
        let what =
            || format!("cannot route {destination}/{prefix_len} via {gateway} on link #{index}");
        let message = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(destination, prefix_len)
            .and_then(|b| b.gateway(gateway))
            .map_err(|e| invalid_route(what(), e))?
            .output_interface(index)
            .protocol(RouteProtocol::from(protocol))
            .build();
        self.change_route(message, what)
    }

    /// Drops everything to `destination/prefix_len` (`ip route add blackhole`).
    pub fn add_blackhole_route(
        &self,
        destination: IpAddr,
        prefix_len: u8,
    ) -> Result<(), NetlinkError> {
        let what = || format!("cannot add blackhole route {destination}/{prefix_len}");
        let message = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(destination, prefix_len)
            .map_err(|e| invalid_route(what(), e))?
            .kind(RouteType::BlackHole)
            .build();
        self.change_route(message, what)
    }

    /// Deletes the route to `destination/prefix_len` from the main table, whatever its kind
    /// and next hop; deleting what is not there is not an error.
    pub fn delete_route(&self, destination: IpAddr, prefix_len: u8) -> Result<(), NetlinkError> {
        let what = || format!("cannot delete route {destination}/{prefix_len}");
        // Unspecified kind and protocol, and scope "nowhere", match any route to the prefix.
        let message = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(destination, prefix_len)
            .map_err(|e| invalid_route(what(), e))?
            .kind(RouteType::Unspec)
            .protocol(RouteProtocol::Unspec)
            .scope(RouteScope::NoWhere)
            .build();
        match self
            .socket
            .request(RouteNetlinkMessage::DelRoute(message), NLM_F_ACK)
        {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(nix::libc::ESRCH) => Ok(()),
            Err(e) => Err(NetlinkError::new(what(), e)),
        }
    }

    /// The main table's routes of one family: IPv6 when `ipv6`, else IPv4.
    pub fn routes(&self, ipv6: bool) -> Result<Vec<RouteInfo>, NetlinkError> {
        let request = if ipv6 {
            RouteMessageBuilder::<Ipv6Addr>::new().build()
        } else {
            RouteMessageBuilder::<Ipv4Addr>::new().build()
        };
        let answers = self
            .socket
            .request(RouteNetlinkMessage::GetRoute(request), NLM_F_DUMP)
            .map_err(|e| NetlinkError::new("cannot list routes", e))?;
        Ok(answers
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(route)
                    if route.header.table == RouteHeader::RT_TABLE_MAIN =>
                {
                    Some(route_info(route, ipv6))
                }
                _ => None,
            })
            .collect())
    }

    fn change_route(
        &self,
        message: RouteMessage,
        what: impl FnOnce() -> String,
    ) -> Result<(), NetlinkError> {
        self.socket
            .request(
                RouteNetlinkMessage::NewRoute(message),
                NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
            )
            .map(drop)
            .map_err(|e| NetlinkError::new(what(), e))
    }
}

fn route_info(message: &RouteMessage, ipv6: bool) -> RouteInfo {
    let unspecified = if ipv6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    let mut info = RouteInfo {
        destination: unspecified,
        prefix_len: message.header.destination_prefix_length,
        gateway: None,
        output: None,
        blackhole: message.header.kind == RouteType::BlackHole,
        protocol: u8::from(message.header.protocol),
    };
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Destination(address) => {
                info.destination = ip_of(address).unwrap_or(unspecified);
            }
            RouteAttribute::Gateway(address) => info.gateway = ip_of(address),
            RouteAttribute::Oif(index) => info.output = Some(*index),
            _ => {}
        }
    }
    info
}

fn ip_of(address: &RouteAddress) -> Option<IpAddr> {
    match address {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn invalid_route(what: String, e: impl std::fmt::Display) -> NetlinkError {
    NetlinkError::new(
        what,
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
    )
}
