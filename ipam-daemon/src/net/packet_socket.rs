//! Raw Ethernet frames on one interface (AF_PACKET), for gratuitous announcements, tests and
//! benchmarks.

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::Duration,
};

/// An AF_PACKET socket bound to one interface and one EtherType (or all with `ETH_P_ALL`).
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: u32,
}

pub const ETH_P_ALL: u16 = 0x0003;

impl PacketSocket {
    pub fn bind(ifindex: u32, ethertype: u16) -> io::Result<Self> {
        let proto = ethertype.to_be() as libc::c_int;
        // SAFETY: plain socket(2) call.
        let fd =
            unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor owned from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let addr = sockaddr(ifindex, ethertype);
        // SAFETY: `addr` is a valid sockaddr_ll of the size passed.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd, ifindex })
    }

    /// Sends one complete Ethernet frame.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        let addr = sockaddr(self.ifindex, 0);
        // SAFETY: the buffer and address are valid for the sizes passed.
        let rc = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&addr as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends `frames` with as few system calls as possible (`sendmmsg`); returns how many went out.
    pub fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
        let mut iovs: Vec<libc::iovec> = frames
            .iter()
            .map(|f| libc::iovec {
                iov_base: f.as_ptr() as *mut _,
                iov_len: f.len(),
            })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = iovs
            .iter_mut()
            .map(|iov| {
                // SAFETY: mmsghdr is plain data; zeroed is valid (no address: the bound one is used).
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_iov = iov;
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        // SAFETY: every header points at a live iovec over a live buffer.
        let rc =
            unsafe { libc::sendmmsg(self.fd.as_raw_fd(), msgs.as_mut_ptr(), msgs.len() as u32, 0) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(rc as usize)
    }

    /// Receives one frame arriving on the interface into `buf` (frames this host sends are
    /// skipped), waiting at most `timeout`; `Ok(None)` on timeout.
    pub fn recv(&self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            if rc == 0 {
                return Ok(None);
            }
            // SAFETY: sockaddr_ll is plain data.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut from_len = size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: buffer and address are valid for the sizes passed.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut from_len,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if from.sll_pkttype != libc::PACKET_OUTGOING {
                return Ok(Some(n as usize));
            }
        }
    }
}

fn sockaddr(ifindex: u32, ethertype: u16) -> libc::sockaddr_ll {
    // SAFETY: sockaddr_ll is plain data; zeroed is valid.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = ethertype.to_be();
    addr.sll_ifindex = ifindex as i32;
    addr.sll_halen = 6;
    addr
}
