//! Route netlink (rtnetlink) for what the pod network needs: veth pairs created straight into a
//! pod's network namespace, addresses, routes, permanent neighbours and the node's host device.
//!
//! A netlink socket belongs to the network namespace it was created in, so [`Netlink::open_in`]
//! creates its socket on a short-lived thread that has entered the target namespace; the rest of
//! the process never changes namespace.

use std::{
    fs::File,
    io,
    net::IpAddr,
    os::fd::{AsFd, AsRawFd},
    path::Path,
};

use futures_util::TryStreamExt;
use rtnetlink::{
    Handle, LinkMessageBuilder, LinkUnspec, RouteMessageBuilder,
    packet_route::{
        address::{AddressAttribute, AddressFlags},
        link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkMessage},
        neighbour::NeighbourState,
        route::RouteScope,
    },
};
use thiserror::Error;

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
}

fn to_io(e: rtnetlink::Error) -> io::Error {
    match e {
        rtnetlink::Error::NetlinkError(msg) => msg.to_io(),
        other => io::Error::other(other.to_string()),
    }
}

/// What the datapath needs to know of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    pub index: u32,
    pub name: String,
    pub mac: [u8; 6],
    pub mtu: u32,
}

/// A netlink connection to one network namespace. Needs a tokio runtime.
#[derive(Clone)]
pub struct Netlink {
    handle: Handle,
}

impl Netlink {
    /// A connection to the namespace of the calling thread.
    pub fn open() -> io::Result<Self> {
        let (connection, handle, _) = rtnetlink::new_connection()?;
        tokio::spawn(connection);
        Ok(Self { handle })
    }

    /// A connection to the network namespace at `netns` (e.g. `/var/run/netns/<name>` or
    /// `/proc/<pid>/ns/net`).
    pub fn open_in(netns: &Path) -> Result<Self, NetlinkError> {
        let file = open_netns(netns)?;
        let runtime = tokio::runtime::Handle::current();
        let made = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: plain syscall on a valid namespace fd; only this thread moves.
                    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    let _runtime = runtime.enter();
                    let (connection, handle, _) = rtnetlink::new_connection()?;
                    Ok((connection, handle))
                })
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("netns thread panicked")))
        });
        let (connection, handle) = made.map_err(|e| {
            NetlinkError::new(
                format!(
                    "cannot open netlink in network namespace {}",
                    netns.display()
                ),
                e,
            )
        })?;
        tokio::spawn(connection);
        Ok(Self { handle })
    }

    /// The link named `name`, or `None` when there is none.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<LinkInfo>, NetlinkError> {
        let mut links = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match links.try_next().await {
            Ok(Some(msg)) => Ok(Some(link_info(&msg))),
            Ok(None) => Ok(None),
            Err(e) => {
                let e = to_io(e);
                if e.raw_os_error() == Some(libc::ENODEV) {
                    Ok(None)
                } else {
                    Err(NetlinkError::new(format!("cannot read link {name}"), e))
                }
            }
        }
    }

    /// Creates a veth pair: `host_name` here, its peer named `peer_name` directly in the network
    /// namespace `peer_netns` (so the pod side never exists under a temporary name).
    pub async fn create_veth(
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
        self.add_veth(host_name, peer, Some(mtu))
            .await
            .map_err(|e| {
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
    async fn add_veth(&self, name: &str, peer: LinkMessage, mtu: Option<u32>) -> io::Result<()> {
        let mut builder = LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Veth)
            .name(name.to_owned())
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)));
        if let Some(mtu) = mtu {
            builder = builder.mtu(mtu);
        }
        self.handle
            .link()
            .add(builder.build())
            .execute()
            .await
            .map_err(to_io)
    }

    /// Creates the node's host device, a veth pair `name` / `peer` in this namespace (like
    /// Cilium's cilium_host / cilium_net; veth is there on every kernel, dummy is a module that
    /// may be missing), unless `name` exists. Returns `name`'s link.
    pub async fn ensure_host_pair(&self, name: &str, peer: &str) -> Result<LinkInfo, NetlinkError> {
        if let Some(link) = self.link_by_name(name).await? {
            return Ok(link);
        }
        let peer_message = LinkMessageBuilder::<LinkUnspec>::new()
            .name(peer.to_owned())
            .build();
        self.add_veth(name, peer_message, None)
            .await
            .map_err(|e| NetlinkError::new(format!("cannot create device {name}"), e))?;
        if let Some(peer) = self.link_by_name(peer).await? {
            self.set_up(peer.index).await?;
        }
        self.link_by_name(name).await?.ok_or_else(|| {
            NetlinkError::new(
                format!("device {name} vanished right after creation"),
                io::ErrorKind::NotFound.into(),
            )
        })
    }

    pub async fn set_up(&self, index: u32) -> Result<(), NetlinkError> {
        let message = LinkUnspec::new_with_index(index).up().build();
        self.handle
            .link()
            .set(message)
            .execute()
            .await
            .map_err(|e| NetlinkError::new(format!("cannot set link #{index} up"), to_io(e)))
    }

    /// Deletes link `index` (a veth takes its peer with it).
    pub async fn delete_link(&self, index: u32) -> Result<(), NetlinkError> {
        self.handle
            .link()
            .del(index)
            .execute()
            .await
            .map_err(|e| NetlinkError::new(format!("cannot delete link #{index}"), to_io(e)))
    }

    /// Adds (or keeps) `ip/prefix_len` on link `index`, without duplicate address detection:
    /// the address is ours by allocation, and DAD would hold IPv6 back for a second or more.
    pub async fn add_address(
        &self,
        index: u32,
        ip: IpAddr,
        prefix_len: u8,
    ) -> Result<(), NetlinkError> {
        let mut request = self.handle.address().add(index, ip, prefix_len).replace();
        if ip.is_ipv6() {
            request
                .message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        request.execute().await.map_err(|e| {
            NetlinkError::new(
                format!("cannot add address {ip}/{prefix_len} to link #{index}"),
                to_io(e),
            )
        })
    }

    /// Addresses on link `index`, as (address, prefix length).
    pub async fn addresses(&self, index: u32) -> Result<Vec<(IpAddr, u8)>, NetlinkError> {
        let mut out = Vec::new();
        let mut stream = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute();
        while let Some(msg) = stream.try_next().await.map_err(|e| {
            NetlinkError::new(format!("cannot list addresses of link #{index}"), to_io(e))
        })? {
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
    pub async fn add_route(
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
        self.handle
            .route()
            .add(builder.build())
            .replace()
            .execute()
            .await
            .map_err(|e| NetlinkError::new(what(), to_io(e)))
    }

    /// A permanent neighbour entry: `ip` is at `mac` on link `index`. No ARP or NDP is ever sent
    /// for it, and it never expires.
    pub async fn add_permanent_neighbour(
        &self,
        index: u32,
        ip: IpAddr,
        mac: [u8; 6],
    ) -> Result<(), NetlinkError> {
        self.handle
            .neighbours()
            .add(index, ip)
            .link_layer_address(&mac)
            .state(NeighbourState::Permanent)
            .replace()
            .execute()
            .await
            .map_err(|e| {
                NetlinkError::new(
                    format!("cannot add neighbour {ip} on link #{index}"),
                    to_io(e),
                )
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
