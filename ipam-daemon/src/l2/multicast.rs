//! Joining the solicited-node multicast group of every IPv6 address answered on an interface.
//!
//! A neighbour solicitation for an address goes to its solicited-node group (ff02::1:ffXX:XXXX,
//! the address's last 24 bits), and a NIC that filters multicast drops it unless the host
//! joined that group on it. The kernel joins for the addresses it holds on an interface; a
//! service IP lives on `lo`, so nothing joins for it on the uplink, and the solicitations never
//! reach the XDP responder (Cilium's L2 announcements had this bug). Here one socket holds a
//! membership per (group, interface) that some answered IPv6 address needs, by difference with
//! the last pass; the memberships go with the socket when the daemon stops.

use std::{
    collections::BTreeSet,
    io,
    net::{IpAddr, Ipv6Addr, UdpSocket},
};

use ipam_netlink::iface;
use thiserror::Error;

use crate::net::frames::solicited_node;

#[derive(Debug, Error)]
pub enum MembershipError {
    #[error(
        "cannot open a socket for multicast memberships: {0}; IPv6 service IPs are answered, \
         but a NIC that filters multicast may drop their neighbour solicitations (is IPv6 \
         disabled on this node?)"
    )]
    Socket(io::Error),
    #[error(
        "cannot {action} multicast group {group} on interface {interface}: {source}; \
         neighbour solicitations for the IPv6 service IPs there may be dropped by the NIC"
    )]
    Group {
        action: &'static str,
        group: Ipv6Addr,
        interface: String,
        source: io::Error,
    },
}

/// The memberships held, and the socket that holds them.
#[derive(Default)]
pub struct SolicitedNodeGroups {
    socket: Option<UdpSocket>,
    joined: BTreeSet<(Ipv6Addr, u32)>,
}

impl SolicitedNodeGroups {
    /// Holds exactly the groups that the IPv6 addresses of `answering` (IP, ifindex) need:
    /// joins the new ones, leaves the ones no longer needed. What fails is reported and tried
    /// again on the next pass.
    pub fn apply(
        &mut self,
        answering: impl IntoIterator<Item = (IpAddr, u32)>,
    ) -> Vec<MembershipError> {
        let wanted: BTreeSet<(Ipv6Addr, u32)> = answering
            .into_iter()
            .filter_map(|(ip, ifindex)| match ip {
                IpAddr::V6(v6) => Some((solicited_node(v6), ifindex)),
                IpAddr::V4(_) => None,
            })
            .collect();
        if wanted == self.joined {
            return Vec::new();
        }
        let socket = match membership_socket(&mut self.socket) {
            Ok(socket) => socket,
            Err(e) => return vec![MembershipError::Socket(e)],
        };
        let mut errors = Vec::new();
        let mut joined = BTreeSet::new();
        for &(group, ifindex) in self.joined.difference(&wanted) {
            if let Err(source) = socket.leave_multicast_v6(&group, ifindex) {
                // A group on an interface that is gone went with it.
                if iface::exists(ifindex) {
                    errors.push(group_error("leave", group, ifindex, source));
                    joined.insert((group, ifindex));
                }
            }
        }
        for &(group, ifindex) in wanted.intersection(&self.joined) {
            joined.insert((group, ifindex));
        }
        for &(group, ifindex) in wanted.difference(&self.joined) {
            match socket.join_multicast_v6(&group, ifindex) {
                Ok(()) => {
                    joined.insert((group, ifindex));
                }
                Err(source) => errors.push(group_error("join", group, ifindex, source)),
            }
        }
        self.joined = joined;
        errors
    }

    /// The groups held now, as (group, ifindex).
    pub fn joined(&self) -> &BTreeSet<(Ipv6Addr, u32)> {
        &self.joined
    }
}

/// The socket that holds the memberships, opened on first use.
fn membership_socket(socket: &mut Option<UdpSocket>) -> io::Result<&UdpSocket> {
    if socket.is_none() {
        // Memberships only: nothing is sent or read on it.
        *socket = Some(UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0))?);
    }
    Ok(socket.as_ref().expect("just opened"))
}

fn group_error(
    action: &'static str,
    group: Ipv6Addr,
    ifindex: u32,
    source: io::Error,
) -> MembershipError {
    MembershipError::Group {
        action,
        group,
        interface: iface::name(ifindex),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_needs_no_group_and_nothing_is_opened_for_it() {
        let mut groups = SolicitedNodeGroups::default();
        let errors = groups.apply([("10.0.0.1".parse().unwrap(), 1)]);
        assert!(errors.is_empty());
        assert!(groups.joined().is_empty());
        assert!(groups.socket.is_none());
    }
}
