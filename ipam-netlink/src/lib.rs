//! Route netlink for what the pod network needs: veth pairs created straight into a pod's network
//! namespace, bridges, addresses, routes, permanent neighbours and the node's host device; and
//! named network namespaces, as `ip netns` makes them.
//!
//! Blocking on purpose. The CNI plugin makes a handful of requests per ADD, each answered by the
//! kernel in microseconds; an async runtime would cost more to start than the requests take. The
//! messages come from rtnetlink's builders and netlink-packet-route's types (field crates); this
//! crate only sends them over a plain netlink socket and waits for the kernel's answer.
//!
//! A netlink socket belongs to the network namespace it was created in, so [`Netlink::open_in`]
//! creates its socket on a short-lived thread that has entered the target namespace; the rest of
//! the process never changes namespace.
//!
//! | module        | what it asks the kernel                                   |
//! |---------------|-----------------------------------------------------------|
//! | [`link`]      | links: list, veth pairs, bridges, up/down, ports, delete  |
//! | [`address`]   | addresses on a link                                       |
//! | [`route`]     | routes out of a link, via a gateway, blackholes; dumps    |
//! | [`neighbour`] | permanent neighbour entries                               |
//! | [`netns`]     | named network namespaces under `/run/netns`               |
//! | [`conntrack`] | connection tracking: list flows, delete unanswered ones   |
//! | [`events`]    | link and address changes, as the kernel announces them   |
//! | [`iface`]     | interfaces by name and index, hardware address, driver    |

pub mod address;
pub mod conntrack;
pub mod events;
pub mod iface;
pub mod link;
pub mod neighbour;
pub mod netns;
pub mod route;
mod socket;

use std::{fs::File, io, os::fd::AsFd, path::Path};

use thiserror::Error;

pub use events::LinkEvents;
pub use link::LinkInfo;
pub use route::{IPAM_ROUTE_PROTOCOL, RouteInfo};
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
        let socket = in_netns(netns, RouteSocket::open)?;
        Ok(Self { socket })
    }
}

/// Runs `make` on a short-lived thread that has entered the network namespace at `netns`: a
/// socket made there stays bound to that namespace.
pub(crate) fn in_netns<T: Send>(
    netns: &Path,
    make: impl FnOnce() -> io::Result<T> + Send,
) -> Result<T, NetlinkError> {
    let file = open_netns(netns)?;
    let made = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(io::Error::from)?;
                make()
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("netns thread panicked")))
    });
    made.map_err(|e| {
        NetlinkError::new(
            format!(
                "cannot open netlink in network namespace {}",
                netns.display()
            ),
            e,
        )
    })
}

fn open_netns(path: &Path) -> Result<File, NetlinkError> {
    File::open(path).map_err(|e| {
        NetlinkError::new(
            format!("cannot open network namespace {}", path.display()),
            e,
        )
    })
}
