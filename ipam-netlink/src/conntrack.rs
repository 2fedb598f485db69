//! The kernel's connection tracking table over ctnetlink: list the flows, and delete those that
//! never got an answer from a set of addresses.
//!
//! Why the node agent needs it: kube-proxy DNATs a Service's new connection to one endpoint,
//! and the kernel remembers that choice in the flow's conntrack entry. A connection sent to a
//! pod on a node that has just died gets no answer, and its entry stays in SYN_SENT for
//! `nf_conntrack_tcp_timeout_syn_sent` (120 s). A later connection from the same client address
//! and port matches that entry and goes to the dead pod again, whatever kube-proxy's rules say
//! by then. kube-proxy deletes such entries for UDP only; the agents delete them for a node
//! they hold dead.
//!
//! The messages are built by hand: they are a netlink header, a four-byte netfilter header and
//! nested attributes, and no maintained crate speaks ctnetlink's conntrack messages.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
    sync::atomic::{AtomicU32, Ordering},
};

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use crate::NetlinkError;

// From linux/netfilter/nfnetlink.h and nfnetlink_conntrack.h.
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NFNETLINK_V0: u8 = 0;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_PROTOINFO: u16 = 4;
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;

const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;

/// `IPS_SEEN_REPLY`: a packet went the reply way.
const IPS_SEEN_REPLY: u32 = 1 << 1;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x01;
const NLM_F_MULTI: u16 = 0x02;
const NLM_F_ACK: u16 = 0x04;
const NLM_F_DUMP: u16 = 0x100 | 0x200;
const NLA_TYPE_MASK: u16 = 0x3fff;
const NLA_F_NESTED: u16 = 0x8000;
const HEADER: usize = 16;

/// One direction of a flow: addresses and, for TCP, UDP and SCTP, ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuple {
    pub source: IpAddr,
    pub destination: IpAddr,
    pub protocol: u8,
    pub source_port: Option<u16>,
    pub destination_port: Option<u16>,
}

/// One conntrack entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    /// As the first packet went: from the client to the address it asked for.
    pub original: Tuple,
    /// As an answer would come: after DNAT its source is the endpoint the flow was sent to.
    pub reply: Tuple,
    /// Whether anything came back.
    pub replied: bool,
    /// TCP's state (`TCP_CONNTRACK_*`: 1 is SYN_SENT, 3 ESTABLISHED).
    pub tcp_state: Option<u8>,
    id: Option<u32>,
    zone: Option<u16>,
    /// The original tuple as the kernel sent it: what a delete names the entry by.
    original_raw: Vec<u8>,
}

/// `TCP_CONNTRACK_SYN_SENT`.
pub const TCP_SYN_SENT: u8 = 1;

/// A ctnetlink connection to the network namespace it was opened in.
pub struct Conntrack {
    socket: Socket,
    sequence: AtomicU32,
}

impl Conntrack {
    /// A connection to the calling thread's network namespace.
    pub fn open() -> Result<Self, NetlinkError> {
        Self::open_socket().map_err(|e| NetlinkError::new("cannot open a ctnetlink socket", e))
    }

    /// A connection to the network namespace at `netns`.
    pub fn open_in(netns: &Path) -> Result<Self, NetlinkError> {
        crate::in_netns(netns, Self::open_socket)
    }

    fn open_socket() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(Self {
            socket,
            sequence: AtomicU32::new(1),
        })
    }

    /// Every flow of both families.
    pub fn flows(&self) -> Result<Vec<Flow>, NetlinkError> {
        let what = || "cannot list the conntrack table".to_owned();
        let answers = self
            .request(IPCTNL_MSG_CT_GET, NLM_F_DUMP, &[])
            .map_err(|e| NetlinkError::new(what(), e))?;
        Ok(answers.iter().filter_map(|m| parse_flow(m)).collect())
    }

    /// Deletes the flows that never got an answer and whose reply would come from an address
    /// `from` accepts; returns those deleted. A flow that ended meanwhile is not an error.
    pub fn delete_unreplied(
        &self,
        from: impl Fn(IpAddr) -> bool,
    ) -> Result<Vec<Flow>, NetlinkError> {
        let mut deleted = Vec::new();
        for flow in self
            .flows()?
            .into_iter()
            .filter(|f| !f.replied && from(f.reply.source))
        {
            match self.delete(&flow) {
                Ok(()) => deleted.push(flow),
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => {}
                Err(e) => {
                    return Err(NetlinkError::new(
                        format!(
                            "cannot delete the conntrack entry of {} -> {} (sent to {})",
                            flow.original.source, flow.original.destination, flow.reply.source
                        ),
                        e,
                    ));
                }
            }
        }
        Ok(deleted)
    }

    /// Deletes `flow`, named by its original tuple, its zone and its id (so an entry that
    /// replaced it meanwhile is left alone).
    fn delete(&self, flow: &Flow) -> io::Result<()> {
        let mut attributes = Vec::new();
        attribute(
            &mut attributes,
            CTA_TUPLE_ORIG | NLA_F_NESTED,
            &flow.original_raw,
        );
        if let Some(zone) = flow.zone {
            attribute(&mut attributes, CTA_ZONE, &zone.to_be_bytes());
        }
        if let Some(id) = flow.id {
            attribute(&mut attributes, CTA_ID, &id.to_be_bytes());
        }
        let family = match flow.original.source {
            IpAddr::V4(_) => nix::libc::AF_INET,
            IpAddr::V6(_) => nix::libc::AF_INET6,
        } as u8;
        self.request_in(family, IPCTNL_MSG_CT_DELETE, NLM_F_ACK, &attributes)
            .map(drop)
    }

    fn request(&self, kind: u16, flags: u16, attributes: &[u8]) -> io::Result<Vec<Vec<u8>>> {
        self.request_in(nix::libc::AF_UNSPEC as u8, kind, flags, attributes)
    }

    /// Sends one request and collects the answer's payloads (after the netlink header).
    fn request_in(
        &self,
        family: u8,
        kind: u16,
        flags: u16,
        attributes: &[u8],
    ) -> io::Result<Vec<Vec<u8>>> {
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let length = HEADER + 4 + attributes.len();
        let mut message = Vec::with_capacity(length);
        message.extend_from_slice(&(length as u32).to_ne_bytes());
        message.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | kind).to_ne_bytes());
        message.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
        message.extend_from_slice(&sequence.to_ne_bytes());
        message.extend_from_slice(&0u32.to_ne_bytes());
        message.extend_from_slice(&[family, NFNETLINK_V0, 0, 0]);
        message.extend_from_slice(attributes);
        self.socket.send(&message, 0)?;

        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut answers = Vec::new();
        loop {
            let (datagram, _) = self.socket.recv_from_full()?;
            let mut rest = &datagram[..];
            while rest.len() >= HEADER {
                let length = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
                if length < HEADER || length > rest.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "ctnetlink message with a bad length",
                    ));
                }
                let kind = u16::from_ne_bytes(rest[4..6].try_into().unwrap());
                let message_flags = u16::from_ne_bytes(rest[6..8].try_into().unwrap());
                let message_sequence = u32::from_ne_bytes(rest[8..12].try_into().unwrap());
                let payload = &rest[HEADER..length];
                rest = &rest[length.next_multiple_of(4).min(rest.len())..];
                if message_sequence != sequence {
                    continue;
                }
                match kind {
                    NLMSG_DONE => return Ok(answers),
                    NLMSG_ERROR => {
                        let code = payload
                            .get(0..4)
                            .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
                            .unwrap_or(0);
                        return if code == 0 {
                            Ok(answers)
                        } else {
                            Err(io::Error::from_raw_os_error(-code))
                        };
                    }
                    _ => {
                        answers.push(payload.to_vec());
                        if !dump && message_flags & NLM_F_MULTI == 0 {
                            return Ok(answers);
                        }
                    }
                }
            }
        }
    }
}

/// Appends one attribute, padded to four bytes.
fn attribute(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    out.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len().next_multiple_of(4), 0);
}

/// The attributes in `bytes`, as (type without flags, value).
fn attributes(mut bytes: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if bytes.len() < 4 {
            return None;
        }
        let length = u16::from_ne_bytes([bytes[0], bytes[1]]) as usize;
        let kind = u16::from_ne_bytes([bytes[2], bytes[3]]) & NLA_TYPE_MASK;
        if length < 4 || length > bytes.len() {
            return None;
        }
        let value = &bytes[4..length];
        bytes = &bytes[length.next_multiple_of(4).min(bytes.len())..];
        Some((kind, value))
    })
}

fn find(bytes: &[u8], kind: u16) -> Option<&[u8]> {
    attributes(bytes).find(|(k, _)| *k == kind).map(|(_, v)| v)
}

fn be_u16(value: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(value.get(0..2)?.try_into().ok()?))
}

fn be_u32(value: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(value.get(0..4)?.try_into().ok()?))
}

/// One flow from a conntrack message's payload (netfilter header, then attributes); `None` for
/// what is not a flow of IPv4 or IPv6.
fn parse_flow(payload: &[u8]) -> Option<Flow> {
    let attributes = payload.get(4..)?;
    let original_raw = find(attributes, CTA_TUPLE_ORIG)?;
    let status = find(attributes, CTA_STATUS).and_then(be_u32).unwrap_or(0);
    let tcp_state = find(attributes, CTA_PROTOINFO)
        .and_then(|p| find(p, CTA_PROTOINFO_TCP))
        .and_then(|t| find(t, CTA_PROTOINFO_TCP_STATE))
        .and_then(|s| s.first().copied());
    Some(Flow {
        original: parse_tuple(original_raw)?,
        reply: parse_tuple(find(attributes, CTA_TUPLE_REPLY)?)?,
        replied: status & IPS_SEEN_REPLY != 0,
        tcp_state,
        id: find(attributes, CTA_ID).and_then(be_u32),
        zone: find(attributes, CTA_ZONE).and_then(be_u16),
        original_raw: original_raw.to_vec(),
    })
}

fn parse_tuple(bytes: &[u8]) -> Option<Tuple> {
    let ip = find(bytes, CTA_TUPLE_IP)?;
    let v4 = |kind| -> Option<IpAddr> {
        let octets: [u8; 4] = find(ip, kind)?.try_into().ok()?;
        Some(Ipv4Addr::from(octets).into())
    };
    let v6 = |kind| -> Option<IpAddr> {
        let octets: [u8; 16] = find(ip, kind)?.try_into().ok()?;
        Some(Ipv6Addr::from(octets).into())
    };
    let (source, destination) = match (v4(CTA_IP_V4_SRC), v4(CTA_IP_V4_DST)) {
        (Some(s), Some(d)) => (s, d),
        _ => (v6(CTA_IP_V6_SRC)?, v6(CTA_IP_V6_DST)?),
    };
    let proto = find(bytes, CTA_TUPLE_PROTO)?;
    Some(Tuple {
        source,
        destination,
        protocol: *find(proto, CTA_PROTO_NUM)?.first()?,
        source_port: find(proto, CTA_PROTO_SRC_PORT).and_then(be_u16),
        destination_port: find(proto, CTA_PROTO_DST_PORT).and_then(be_u16),
    })
}
