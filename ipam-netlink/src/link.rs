//! Links: list them, create veth pairs and bridges, set them up or down, join a bridge, delete.

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
    path::Path,
};

use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkMessage},
};
use rtnetlink::{LinkBridge, LinkMessageBuilder, LinkUnspec};

use crate::{Netlink, NetlinkError, open_netns};

/// What the datapath needs to know of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    pub index: u32,
    pub name: String,
    pub mac: [u8; 6],
    pub mtu: u32,
    /// Administratively up and with a carrier.
    pub up: bool,
    /// Administratively up (`ip link set up`), with a carrier or not.
    pub admin_up: bool,
    /// The bridge (or other controller) this link is a port of.
    pub controller: Option<u32>,
}

impl Netlink {
    /// Every link of the namespace.
    pub fn links(&self) -> Result<Vec<LinkInfo>, NetlinkError> {
        let answers = self
            .socket
            .request(
                RouteNetlinkMessage::GetLink(LinkMessage::default()),
                NLM_F_DUMP,
            )
            .map_err(|e| NetlinkError::new("cannot list links", e))?;
        Ok(answers
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(link) => Some(link_info(link)),
                _ => None,
            })
            .collect())
    }

    /// The link named `name`, or `None` when there is none.
    pub fn link_by_name(&self, name: &str) -> Result<Option<LinkInfo>, NetlinkError> {
        let request = LinkUnspec::new_with_name(name).build();
        match self
            .socket
            .request(RouteNetlinkMessage::GetLink(request), 0)
        {
            Ok(answers) => Ok(answers.iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(link) => Some(link_info(link)),
                _ => None,
            })),
            Err(e) if e.raw_os_error() == Some(nix::libc::ENODEV) => Ok(None),
            Err(e) => Err(NetlinkError::new(format!("cannot read link {name}"), e)),
        }
    }

    /// Creates a veth pair: `host_name` here, its peer named `peer_name` directly in the network
    /// namespace `peer_netns` (so the pod side never exists under a temporary name).
    pub fn create_veth(
        &self,
        host_name: &str,
        peer_name: &str,
        peer_netns: &Path,
        mtu: u32,
    ) -> Result<(), NetlinkError> {
        let netns = open_netns(peer_netns)?;
        let peer = LinkMessageBuilder::<LinkUnspec>::new()
            .name(peer_name.to_owned())
            .mtu(mtu)
            .setns_by_fd(netns.as_fd().as_raw_fd())
            .build();
        self.add_veth(host_name, peer, Some(mtu)).map_err(|e| {
            NetlinkError::new(
                format!(
                    "cannot create veth pair {host_name} / {peer_name} (in {})",
                    peer_netns.display()
                ),
                e,
            )
        })
    }

    /// Adds a veth `name` whose peer is described by `peer`.
    fn add_veth(&self, name: &str, peer: LinkMessage, mtu: Option<u32>) -> io::Result<()> {
        let mut builder = LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Veth)
            .name(name.to_owned())
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)));
        if let Some(mtu) = mtu {
            builder = builder.mtu(mtu);
        }
        self.socket
            .request(
                RouteNetlinkMessage::NewLink(builder.build()),
                NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
            )
            .map(drop)
    }

    /// Creates the node's host device, a veth pair `name` / `peer` in this namespace (like
    /// Cilium's cilium_host / cilium_net; veth is there on every kernel, dummy is a module that
    /// may be missing), unless `name` exists. Returns `name`'s link.
    pub fn ensure_host_pair(&self, name: &str, peer: &str) -> Result<LinkInfo, NetlinkError> {
        if let Some(link) = self.link_by_name(name)? {
            return Ok(link);
        }
        let peer_message = LinkMessageBuilder::<LinkUnspec>::new()
            .name(peer.to_owned())
            .build();
        self.add_veth(name, peer_message, None)
            .map_err(|e| NetlinkError::new(format!("cannot create device {name}"), e))?;
        if let Some(peer) = self.link_by_name(peer)? {
            self.set_up(peer.index)?;
        }
        self.created(name)
    }

    /// Creates a bridge named `name`, up, with the MAC `address`. Returns its link.
    ///
    /// The address is given because a bridge left to choose takes the lowest of its ports'
    /// MACs and changes it whenever a port with a lower one joins: the hosts on the segment
    /// keep the old one in their neighbour tables, and the bridge's own traffic stalls
    /// until they probe it again.
    pub fn create_bridge(&self, name: &str, address: [u8; 6]) -> Result<LinkInfo, NetlinkError> {
        self.socket
            .request(
                RouteNetlinkMessage::NewLink(
                    LinkBridge::new(name).address(address.to_vec()).build(),
                ),
                NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
            )
            .map_err(|e| NetlinkError::new(format!("cannot create bridge {name}"), e))?;
        self.created(name)
    }

    /// The link `name` that was just created.
    fn created(&self, name: &str) -> Result<LinkInfo, NetlinkError> {
        self.link_by_name(name)?.ok_or_else(|| {
            NetlinkError::new(
                format!("device {name} vanished right after creation"),
                io::ErrorKind::NotFound.into(),
            )
        })
    }

    pub fn set_up(&self, index: u32) -> Result<(), NetlinkError> {
        self.set_link(LinkUnspec::new_with_index(index).up(), || {
            format!("cannot set link #{index} up")
        })
    }

    pub fn set_down(&self, index: u32) -> Result<(), NetlinkError> {
        self.set_link(LinkUnspec::new_with_index(index).down(), || {
            format!("cannot set link #{index} down")
        })
    }

    /// Makes link `index` a port of the bridge `bridge`.
    pub fn set_controller(&self, index: u32, bridge: u32) -> Result<(), NetlinkError> {
        self.set_link(LinkUnspec::new_with_index(index).controller(bridge), || {
            format!("cannot make link #{index} a port of link #{bridge}")
        })
    }

    fn set_link(
        &self,
        change: LinkMessageBuilder<LinkUnspec>,
        what: impl FnOnce() -> String,
    ) -> Result<(), NetlinkError> {
        self.socket
            .request(RouteNetlinkMessage::SetLink(change.build()), NLM_F_ACK)
            .map(drop)
            .map_err(|e| NetlinkError::new(what(), e))
    }

    /// Deletes link `index` (a veth takes its peer with it).
    pub fn delete_link(&self, index: u32) -> Result<(), NetlinkError> {
        let message = LinkUnspec::new_with_index(index).build();
        self.socket
            .request(RouteNetlinkMessage::DelLink(message), NLM_F_ACK)
            .map(drop)
            .map_err(|e| NetlinkError::new(format!("cannot delete link #{index}"), e))
    }
}

fn link_info(msg: &LinkMessage) -> LinkInfo {
    let mut info = LinkInfo {
        index: msg.header.index,
        name: String::new(),
        mac: [0; 6],
        mtu: 0,
        up: msg.header.flags.contains(LinkFlags::Up)
            && msg.header.flags.contains(LinkFlags::LowerUp),
        admin_up: msg.header.flags.contains(LinkFlags::Up),
        controller: None,
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(name) => info.name.clone_from(name),
            LinkAttribute::Address(mac) if mac.len() == 6 => info.mac.copy_from_slice(mac),
            LinkAttribute::Mtu(mtu) => info.mtu = *mtu,
            LinkAttribute::Controller(index) => info.controller = Some(*index),
            _ => {}
        }
    }
    info
}
