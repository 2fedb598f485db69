//! Route netlink for what the pod network needs: veth pairs created straight into a pod's network
//! namespace, addresses, routes, permanent neighbours and the node's host device.
//!
//! Blocking on purpose. The CNI plugin makes a handful of requests per ADD, each answered by the
//! kernel in microseconds; an async runtime would cost more to start than the requests take. The
//! messages come from rtnetlink's builders and netlink-packet-route's types (field crates); this
//! module only sends them over a plain netlink socket and waits for the kernel's answer.
//!
//! A netlink socket belongs to the network namespace it was created in, so [`Netlink::open_in`]
//! creates its socket on a short-lived thread that has entered the target namespace; the rest of
//! the process never changes namespace.

mod socket;

use std::{
    fs::File,
    io,
    net::IpAddr,
    os::fd::{AsFd, AsRawFd},
    path::Path,
};

use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressAttribute, AddressFlags, AddressMessage},
    link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkMessage},
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
    route::{RouteScope, RouteType},
};
use rtnetlink::{AddressMessageBuilder, LinkMessageBuilder, LinkUnspec, RouteMessageBuilder};
use thiserror::Error;

use socket::RouteSocket;

/// A netlink operation that failed, with the object it was about.
#[derive(Debug, Error)]
#[error("{what}: {source}")]
pub struct NetlinkError {
    pub what: String,
    #[source]
    pub source: io::Error,
}

impl NetlinkError {
    fn new(what: impl Into<String>, source: io::Error) -> Self {
        Self {
            what: what.into(),
            source,
        }
    }

    /// The errno the kernel answered with, if it answered with one.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }

    /// The link (or namespace) is gone: what a tear-down wants anyway.
    pub fn is_no_such_device(&self) -> bool {
        self.errno() == Some(nix::libc::ENODEV)
    }
}

/// What the datapath needs to know of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    pub index: u32,
    pub name: String,
    pub mac: [u8; 6],
    pub mtu: u32,
    /// Administratively up and with a carrier.
    pub up: bool,
}

/// A netlink connection to one network namespace.
pub struct Netlink {
    socket: RouteSocket,
}

impl Netlink {
    /// A connection to the namespace of the calling thread.
    pub fn open() -> Result<Self, NetlinkError> {
        let socket = RouteSocket::open()
            .map_err(|e| NetlinkError::new("cannot open a route netlink socket", e))?;
        Ok(Self { socket })
    }

    /// A connection to the network namespace at `netns` (e.g. `/var/run/netns/<name>` or
    /// `/proc/<pid>/ns/net`).
    pub fn open_in(netns: &Path) -> Result<Self, NetlinkError> {
        let file = open_netns(netns)?;
        let made = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(io::Error::from)?;
                    RouteSocket::open()
                })
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("netns thread panicked")))
        });
        let socket = made.map_err(|e| {
            NetlinkError::new(
                format!(
                    "cannot open netlink in network namespace {}",
                    netns.display()
                ),
                e,
            )
        })?;
        Ok(Self { socket })
    }

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
        self.link_by_name(name)?.ok_or_else(|| {
            NetlinkError::new(
                format!("device {name} vanished right after creation"),
                io::ErrorKind::NotFound.into(),
            )
        })
    }

    pub fn set_up(&self, index: u32) -> Result<(), NetlinkError> {
        let message = LinkUnspec::new_with_index(index).up().build();
        self.socket
            .request(RouteNetlinkMessage::SetLink(message), NLM_F_ACK)
            .map(drop)
            .map_err(|e| NetlinkError::new(format!("cannot set link #{index} up"), e))
    }

    /// Deletes link `index` (a veth takes its peer with it).
    pub fn delete_link(&self, index: u32) -> Result<(), NetlinkError> {
        let message = LinkUnspec::new_with_index(index).build();
        self.socket
            .request(RouteNetlinkMessage::DelLink(message), NLM_F_ACK)
            .map(drop)
            .map_err(|e| NetlinkError::new(format!("cannot delete link #{index}"), e))
    }

    /// Adds (or keeps) `ip/prefix_len` on link `index`, without duplicate address detection:
    /// the address is ours by allocation, and DAD would hold IPv6 back for a second or more.
    pub fn add_address(&self, index: u32, ip: IpAddr, prefix_len: u8) -> Result<(), NetlinkError> {
        let mut message: AddressMessage = match ip {
            IpAddr::V4(v4) => AddressMessageBuilder::<std::net::Ipv4Addr>::new()
                .index(index)
                .address(v4, prefix_len)
                .build(),
            IpAddr::V6(v6) => AddressMessageBuilder::<std::net::Ipv6Addr>::new()
                .index(index)
                .address(v6, prefix_len)
                .build(),
        };
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
        let message: AddressMessage = match ip {
            IpAddr::V4(v4) => AddressMessageBuilder::<std::net::Ipv4Addr>::new()
                .index(index)
                .address(v4, prefix_len)
                .build(),
            IpAddr::V6(v6) => AddressMessageBuilder::<std::net::Ipv6Addr>::new()
                .index(index)
                .address(v6, prefix_len)
                .build(),
        };
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

fn invalid_route(what: String, e: impl std::fmt::Display) -> NetlinkError {
    NetlinkError::new(
        what,
        io::Error::new(io::ErrorKind::InvalidInput, e.to_string()),
    )
}

fn open_netns(path: &Path) -> Result<File, NetlinkError> {
    File::open(path).map_err(|e| {
        NetlinkError::new(
            format!("cannot open network namespace {}", path.display()),
            e,
        )
    })
}

fn link_info(msg: &LinkMessage) -> LinkInfo {
    let mut info = LinkInfo {
        index: msg.header.index,
        name: String::new(),
        mac: [0; 6],
        mtu: 0,
        up: msg.header.flags.contains(LinkFlags::Up)
            && msg.header.flags.contains(LinkFlags::LowerUp),
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(name) => info.name.clone_from(name),
            LinkAttribute::Address(mac) if mac.len() == 6 => info.mac.copy_from_slice(mac),
            LinkAttribute::Mtu(mtu) => info.mtu = *mtu,
            _ => {}
        }
    }
    info
}
