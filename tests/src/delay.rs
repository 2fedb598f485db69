//! Delay and jitter on chosen packets, without netem: this kernel has no `sch_netem` (and no
//! module loading), but it has NFQUEUE. iptables hands the matching packets of a namespace to
//! a queue; a thread in that namespace holds each one for a random time and then lets it go
//! on (the verdict "accept"), out of order when the draws say so, as netem's jitter does.
//!
//! The queue speaks nfnetlink directly (a handful of fixed layouts from
//! `linux/netfilter/nfnetlink_queue.h`): bind, receive packet ids (metadata only, no payload),
//! send verdicts. `--queue-bypass` on the rules lets packets through untouched whenever no
//! thread is bound, so a stopped or failed delay never blackholes a node.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use rand::Rng;

use crate::netns::{Netns, command_in};

/// iptables' match and target that drop a random share (`probability`, "0.2") of the packets
/// a rule matches: netem's `loss`, which this kernel lacks too.
pub fn random_loss(probability: &str) -> [&str; 8] {
    [
        "-m",
        "statistic",
        "--mode",
        "random",
        "--probability",
        probability,
        "-j",
        "DROP",
    ]
}

/// Where a [`Delay`] catches packets: UDP to its port, entering and leaving the namespace (the
/// gossip sends from and to the same port, so this is both directions of it).
const CHAINS: [(&str, &str); 2] = [("INPUT", "--dport"), ("OUTPUT", "--dport")];

pub struct Delay {
    ns_name: String,
    ns_path: PathBuf,
    port: u16,
    queue: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<io::Result<u64>>>,
}

impl Delay {
    /// Holds every UDP packet to `port` entering or leaving `ns` for a uniform draw between
    /// `min` and `max` (netem's `delay 50ms 50ms` is 0–100 ms), through NFQUEUE `queue`.
    /// Packets a rule before these drops (a loss rule) never reach the queue.
    pub fn start(ns: &Netns, port: u16, queue: u16, min: Duration, max: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let stop = stop.clone();
            ns.spawn(move || {
                let mut q = match NfQueue::bind(queue) {
                    Ok(q) => {
                        let _ = ready_tx.send(Ok(()));
                        q
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return Err(e);
                    }
                };
                q.hold(min, max, &stop)
            })
        };
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("NFQUEUE {queue} in {}: {e}", ns.name),
            Err(_) => panic!("NFQUEUE {queue} in {}: the thread died", ns.name),
        }
        let delay = Self {
            ns_name: ns.name.clone(),
            ns_path: ns.path(),
            port,
            queue,
            stop,
            thread: Some(thread),
        };
        delay.rules("-A");
        delay
    }

    /// Takes the rules away and stops the thread; how many packets it held.
    pub fn stop(mut self) -> u64 {
        match self.release() {
            Some(Ok(Ok(held))) => held,
            Some(Ok(Err(e))) => panic!("NFQUEUE {} in {}: {e}", self.queue, self.ns_name),
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            None => 0,
        }
    }

    /// Removes the rules, then has the thread let go of what it holds and waits for it; `None`
    /// once done.
    fn release(&mut self) -> Option<std::thread::Result<io::Result<u64>>> {
        let thread = self.thread.take()?;
        self.rules("-D");
        self.stop.store(true, Ordering::SeqCst);
        Some(thread.join())
    }

    fn rules(&self, action: &str) {
        for (chain, port) in CHAINS {
            let status = command_in(&self.ns_path, "iptables")
                .args([action, chain, "-p", "udp", port, &self.port.to_string()])
                .args(["-j", "NFQUEUE", "--queue-num", &self.queue.to_string()])
                .arg("--queue-bypass")
                .status()
                .expect("run iptables");
            assert!(
                status.success() || action == "-D",
                "iptables {action} {chain} NFQUEUE in {}",
                self.ns_name
            );
        }
    }
}

impl Drop for Delay {
    /// On a failed test, the rules go (bypass would pass packets anyway) and the thread lets
    /// go of what it holds.
    fn drop(&mut self) {
        let _ = self.release();
    }
}

const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_META: u8 = 1;
const NF_ACCEPT: u32 = 1;
const NLMSG_ERROR: u16 = 2;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// One bound queue: a netlink socket in the namespace of the thread that made it.
struct NfQueue {
    socket: OwnedFd,
    queue: u16,
    seq: u32,
}

impl NfQueue {
    fn bind(queue: u16) -> io::Result<Self> {
        // SAFETY: plain socket(2); the descriptor is owned at once.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                NETLINK_NETFILTER,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut q = Self {
            socket,
            queue,
            seq: 0,
        };
        let mut cmd = Vec::new();
        // struct nfqnl_msg_config_cmd { u8 command; u8 pad; __be16 pf; }
        attr(&mut cmd, NFQA_CFG_CMD, &[NFQNL_CFG_CMD_BIND, 0, 0, 0]);
        // struct nfqnl_msg_config_params { __be32 copy_range; u8 copy_mode; } (packed)
        let mut params = 0u32.to_be_bytes().to_vec();
        params.push(NFQNL_COPY_META);
        attr(&mut cmd, NFQA_CFG_PARAMS, &params);
        q.send(NFQNL_MSG_CONFIG, libc::NLM_F_ACK as u16, &cmd)?;
        q.expect_ack()?;
        q.set_nonblocking()?;
        Ok(q)
    }

    /// Receives packet ids and lets each go after its draw, until `stop`; the count held.
    fn hold(&mut self, min: Duration, max: Duration, stop: &AtomicBool) -> io::Result<u64> {
        let mut rng = rand::rng();
        let mut due: BinaryHeap<Reverse<(Instant, u32)>> = BinaryHeap::new();
        let mut held = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let stopping = stop.load(Ordering::SeqCst);
            loop {
                match self.recv(&mut buf) {
                    Ok(n) => {
                        for id in packet_ids(&buf[..n]) {
                            let wait = if max > min {
                                rng.random_range(min..=max)
                            } else {
                                min
                            };
                            due.push(Reverse((Instant::now() + wait, id)));
                            held += 1;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // The kernel dropped packets the queue had no room for: loss, not a fault.
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => continue,
                    Err(e) => return Err(e),
                }
            }
            let now = Instant::now();
            while let Some(Reverse((at, id))) = due.peek().copied() {
                if at > now && !stopping {
                    break;
                }
                due.pop();
                self.verdict(id)?;
            }
            if stopping && due.is_empty() {
                return Ok(held);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn verdict(&mut self, id: u32) -> io::Result<()> {
        // struct nfqnl_msg_verdict_hdr { __be32 verdict; __be32 id; }
        let mut body = Vec::new();
        let mut hdr = NF_ACCEPT.to_be_bytes().to_vec();
        hdr.extend_from_slice(&id.to_be_bytes());
        attr(&mut body, NFQA_VERDICT_HDR, &hdr);
        self.send(NFQNL_MSG_VERDICT, 0, &body)
    }

    fn send(&mut self, kind: u16, flags: u16, attrs: &[u8]) -> io::Result<()> {
        self.seq += 1;
        let len = 16 + 4 + attrs.len();
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&(len as u32).to_ne_bytes());
        msg.extend_from_slice(&((NFNL_SUBSYS_QUEUE << 8) | kind).to_ne_bytes());
        msg.extend_from_slice(&(libc::NLM_F_REQUEST as u16 | flags).to_ne_bytes());
        msg.extend_from_slice(&self.seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        // struct nfgenmsg { u8 family; u8 version; __be16 res_id; }
        msg.extend_from_slice(&[libc::AF_UNSPEC as u8, 0]);
        msg.extend_from_slice(&self.queue.to_be_bytes());
        msg.extend_from_slice(attrs);
        // SAFETY: a zeroed sockaddr_nl is the kernel's address once the family is set.
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: the buffer and the address outlive the call; lengths are theirs.
        let sent = unsafe {
            libc::sendto(
                self.socket.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                std::ptr::from_ref(&kernel).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe {
            libc::recv(
                self.socket.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    fn expect_ack(&self) -> io::Result<()> {
        let mut buf = vec![0u8; 8192];
        let n = self.recv(&mut buf)?;
        let buf = &buf[..n];
        if buf.len() >= 20 && u16::from_ne_bytes([buf[4], buf[5]]) == NLMSG_ERROR {
            let code = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
            return if code == 0 {
                Ok(())
            } else {
                Err(io::Error::from_raw_os_error(-code))
            };
        }
        Err(io::Error::other(
            "no acknowledgement for the queue's binding",
        ))
    }

    fn set_nonblocking(&self) -> io::Result<()> {
        let fd = self.socket.as_raw_fd();
        // SAFETY: fcntl(2) on a descriptor this struct owns.
        let ok = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) >= 0
        };
        if ok {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Appends one netlink attribute, padded to four bytes.
fn attr(out: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(out.len().next_multiple_of(4), 0);
}

/// The packet ids of the queued-packet messages in one datagram.
fn packet_ids(mut buf: &[u8]) -> Vec<u32> {
    let mut ids = Vec::new();
    while buf.len() >= 16 {
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len < 16 || len > buf.len() {
            break;
        }
        let kind = u16::from_ne_bytes([buf[4], buf[5]]);
        if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET && len >= 20 {
            let mut attrs = &buf[20..len];
            while attrs.len() >= 4 {
                let alen = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
                let akind = u16::from_ne_bytes([attrs[2], attrs[3]]) & NLA_TYPE_MASK;
                if alen < 4 || alen > attrs.len() {
                    break;
                }
                // struct nfqnl_msg_packet_hdr { __be32 packet_id; __be16 hw_protocol; u8 hook; }
                if akind == NFQA_PACKET_HDR && alen >= 8 {
                    ids.push(u32::from_be_bytes([attrs[4], attrs[5], attrs[6], attrs[7]]));
                }
                attrs = &attrs[alen.next_multiple_of(4).min(attrs.len())..];
            }
        }
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
    }
    ids
}
