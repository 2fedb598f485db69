//! Addresses on a link.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REPLACE};
use netlink_packet_route::{
    RouteNetlinkMessage,
    address::{AddressAttribute, AddressFlags, AddressMessage},
};
use rtnetlink::AddressMessageBuilder;

use crate::{Netlink, NetlinkError};

impl Netlink {
    /// Adds (or keeps) `ip/prefix_len` on link `index`, without duplicate address detection:
    /// the address is ours by allocation, and DAD would hold IPv6 back for a second or more.
    pub fn add_address(&self, index: u32, ip: IpAddr, prefix_len: u8) -> Result<(), NetlinkError> {
        let mut message = address_message(index, ip, prefix_len);
        if ip.is_ipv6() {
            message
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        self.socket
            .request(
                RouteNetlinkMessage::NewAddress(message),
                NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
            )
            .map(drop)
            .map_err(|e| {
                NetlinkError::new(
                    format!("cannot add address {ip}/{prefix_len} to link #{index}"),
                    e,
                )
            })
    }

    /// Removes `ip/prefix_len` from link `index`; removing what is not there is not an error.
    pub fn delete_address(
        &self,
        index: u32,
        ip: IpAddr,
        prefix_len: u8,
    ) -> Result<(), NetlinkError> {
        let message = address_message(index, ip, prefix_len);
        match self
            .socket
            .request(RouteNetlinkMessage::DelAddress(message), NLM_F_ACK)
        {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(nix::libc::EADDRNOTAVAIL) => Ok(()),
            Err(e) => Err(NetlinkError::new(
                format!("cannot remove address {ip}/{prefix_len} from link #{index}"),
                e,
            )),
        }
    }

    /// Addresses on link `index`, as (address, prefix length).
    pub fn addresses(&self, index: u32) -> Result<Vec<(IpAddr, u8)>, NetlinkError> {
        let answers = self
            .socket
            .request(
                RouteNetlinkMessage::GetAddress(AddressMessage::default()),
                NLM_F_DUMP,
            )
            .map_err(|e| NetlinkError::new(format!("cannot list addresses of link #{index}"), e))?;
        let mut out = Vec::new();
        for answer in answers {
            let RouteNetlinkMessage::NewAddress(msg) = answer else {
                continue;
            };
            if msg.header.index != index {
                continue;
            }
            for attr in &msg.attributes {
                if let AddressAttribute::Address(ip) = attr {
                    out.push((*ip, msg.header.prefix_len));
                }
            }
        }
        Ok(out)
    }
}

fn address_message(index: u32, ip: IpAddr, prefix_len: u8) -> AddressMessage {
    match ip {
        IpAddr::V4(v4) => AddressMessageBuilder::<Ipv4Addr>::new()
            .index(index)
            .address(v4, prefix_len)
            .build(),
        IpAddr::V6(v6) => AddressMessageBuilder::<Ipv6Addr>::new()
            .index(index)
            .address(v6, prefix_len)
            .build(),
    }
}
