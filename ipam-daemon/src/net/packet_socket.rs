//! Raw Ethernet frames on one interface (AF_PACKET), for gratuitous announcements, tests and
//! benchmarks.

use std::{
    io,
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    time::Duration,
};

use nix::{
    poll::{PollFd, PollFlags, PollTimeout, poll},
    sys::socket::{
        AddressFamily, LinkAddr, MsgFlags, SockFlag, SockType, SockaddrLike as _, bind, recvfrom,
        sendto, socket,
    },
};

/// An AF_PACKET socket bound to one interface and one EtherType (or all with `ETH_P_ALL`).
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: u32,
}

pub const ETH_P_ALL: u16 = 0x0003;

impl PacketSocket {
    pub fn bind(ifindex: u32, ethertype: u16) -> io::Result<Self> {
        // Protocol 0 receives nothing until the bind below names the EtherType (nix's protocol
        // enum has no variant per EtherType).
        let fd = socket(
            AddressFamily::Packet,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        bind(fd.as_raw_fd(), &link_addr(ifindex, ethertype))?;
        Ok(Self { fd, ifindex })
    }

    /// A socket that only sends, on `ifindex`. It is never bound, so it receives nothing and
    /// costs no RCU grace period to open or close (binding one to an EtherType does), which
    /// matters when a takeover announces a hundred IPs at once.
    pub fn sender(ifindex: u32) -> io::Result<Self> {
        let fd = socket(
            AddressFamily::Packet,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        Ok(Self { fd, ifindex })
    }

    /// Sends one complete Ethernet frame.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        sendto(
            self.fd.as_raw_fd(),
            frame,
            &link_addr(self.ifindex, 0),
            MsgFlags::empty(),
        )?;
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

    /// Keeps only the frames `program` (classic BPF, run by the kernel on each frame) accepts,
    /// so that a reader waiting for one kind of frame is not flooded by the others.
    pub fn filter(&self, program: &[libc::sock_filter]) -> io::Result<()> {
        let fprog = libc::sock_fprog {
            len: u16::try_from(program.len())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "filter too long"))?,
            filter: program.as_ptr().cast_mut(),
        };
        // SAFETY: `fprog` points at `program`, alive for the call; the kernel copies it.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                (&fprog as *const libc::sock_fprog).cast(),
                size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// How many frames the socket had to drop (its receive buffer full) since the last call.
    pub fn drops(&self) -> io::Result<u32> {
        // SAFETY: tpacket_stats is plain data; zeroed is valid.
        let mut stats: libc::tpacket_stats = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: `stats` and `len` are valid for writes of the size given.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut stats as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stats.tp_drops)
    }

    /// Receives one frame arriving on the interface into `buf` (frames this host sends are
    /// skipped), waiting at most `timeout`; `Ok(None)` on timeout.
    pub fn recv(&self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            if poll(&mut fds, PollTimeout::from(ms))? == 0 {
                return Ok(None);
            }
            let (n, from) = recvfrom::<LinkAddr>(self.fd.as_raw_fd(), buf)?;
            if from.is_none_or(|a| a.pkttype() != libc::PACKET_OUTGOING) {
                return Ok(Some(n));
            }
        }
    }
}

/// The link-layer address of `ifindex` for `ethertype`, as bind and sendto take it.
fn link_addr(ifindex: u32, ethertype: u16) -> LinkAddr {
    // SAFETY: sockaddr_ll is plain data; zeroed is valid.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = ethertype.to_be();
    addr.sll_ifindex = ifindex as i32;
    addr.sll_halen = 6;
    // SAFETY: a complete sockaddr_ll of the size given.
    unsafe {
        LinkAddr::from_raw(
            (&addr as *const libc::sockaddr_ll).cast(),
            Some(size_of::<libc::sockaddr_ll>() as u32),
        )
    }
    .expect("a sockaddr_ll is a link address")
}
