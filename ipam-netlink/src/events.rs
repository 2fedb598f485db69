//! Changes to the namespace's links and addresses as the kernel announces them (rtnetlink's
//! multicast groups). The notifications are only a reason to look again: the caller reads the
//! links and addresses it cares for anew, so a notification lost to an overrun costs nothing but
//! the overrun itself, which counts as a change too.

use std::{
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd},
    path::Path,
};

use netlink_sys::{Socket, protocols::NETLINK_ROUTE};

use crate::{NetlinkError, in_netns};

/// rtnetlink's groups for links (state, carrier, name, creation and removal) and for IPv4 and
/// IPv6 addresses (`RTNLGRP_LINK`, `RTNLGRP_IPV4_IFADDR`, `RTNLGRP_IPV6_IFADDR`).
const GROUPS: [u32; 3] = [1, 5, 9];

/// A non-blocking socket subscribed to link and address changes; wait for it to be readable
/// (its file descriptor), then [`LinkEvents::drain`] it.
pub struct LinkEvents {
    socket: Socket,
}

impl LinkEvents {
    /// Subscribes in the calling thread's network namespace.
    pub fn open() -> Result<Self, NetlinkError> {
        Self::subscribe()
            .map_err(|e| NetlinkError::new("cannot follow link and address changes", e))
    }

    /// Subscribes in the namespace at `netns`.
    pub fn open_in(netns: &Path) -> Result<Self, NetlinkError> {
        in_netns(netns, Self::subscribe)
    }

    fn subscribe() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        for group in GROUPS {
            socket.add_membership(group)?;
        }
        socket.set_non_blocking(true)?;
        Ok(Self { socket })
    }

    /// Reads every notification waiting; how many datagrams there were. An overrun (the kernel
    /// dropped notifications for want of room) is one more.
    pub fn drain(&mut self) -> io::Result<usize> {
        let mut buffer = [0u8; 16 * 1024];
        let mut count = 0;
        loop {
            // SAFETY: the buffer is valid for its length for the whole call.
            let read = unsafe {
                libc::recv(
                    self.socket.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if read >= 0 {
                count += 1;
                continue;
            }
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EAGAIN) => return Ok(count),
                Some(libc::ENOBUFS) => count += 1,
                Some(libc::EINTR) => {}
                _ => return Err(error),
            }
        }
    }
}

impl AsRawFd for LinkEvents {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

impl AsFd for LinkEvents {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}
