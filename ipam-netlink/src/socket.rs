//! One route netlink request and the kernel's complete answer, over a blocking socket.

use std::{
    io,
    sync::atomic::{AtomicU32, Ordering},
};

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_MULTIPART, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

pub(crate) struct RouteSocket {
    socket: Socket,
    sequence: AtomicU32,
}

impl RouteSocket {
    /// A route netlink socket in the calling thread's network namespace.
    pub(crate) fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        // Extended acks make the kernel's error messages more precise; older kernels lack them.
        let _ = socket.set_ext_ack(true);
        Ok(Self {
            socket,
            sequence: AtomicU32::new(1),
        })
    }

    /// Sends `message` with `flags` (plus NLM_F_REQUEST) and collects the answer: every message
    /// of a dump until its end, the single answer of a plain get, or nothing for an acked change.
    /// A negative acknowledgement becomes the kernel's errno.
    pub(crate) fn request(
        &self,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let mut request = NetlinkMessage::from(message);
        request.header.flags = NLM_F_REQUEST | flags;
        request.header.sequence_number = sequence;
        request.finalize();
        let mut buffer = vec![0; request.buffer_len()];
        request.serialize(&mut buffer);
        self.socket.send(&buffer, 0)?;

        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let acked = flags & NLM_F_ACK != 0;
        let mut answers = Vec::new();
        loop {
            let (datagram, _) = self.socket.recv_from_full()?;
            let mut rest = &datagram[..];
            while !rest.is_empty() {
                let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(rest)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let length = message.header.length as usize;
                if length == 0 || length > rest.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "netlink message with a bad length",
                    ));
                }
                // Messages are 4-byte aligned in a datagram.
                rest = &rest[length.next_multiple_of(4).min(rest.len())..];
                if message.header.sequence_number != sequence {
                    continue;
                }
                let multipart = message.header.flags & NLM_F_MULTIPART != 0;
                match message.payload {
                    NetlinkPayload::Done(_) => return Ok(answers),
                    NetlinkPayload::Error(error) if error.code.is_some() => {
                        return Err(error.to_io());
                    }
                    // A positive acknowledgement ends a change.
                    NetlinkPayload::Error(_) => return Ok(answers),
                    NetlinkPayload::InnerMessage(inner) => {
                        answers.push(inner);
                        if !dump && !acked && !multipart {
                            return Ok(answers);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}
