//! The authenticated envelope every gossip packet travels in.
//!
//! A host on the segment must not be able to declare a node dead, bring a dead one back, or
//! replay what it overheard; and a node of the cluster must not be able to speak as another.
//! So every packet is signed by its sender's own key (Ed25519, [`crate::signing`]) and carries
//! a tag under the cluster key (HMAC-SHA256, cut to 12 bytes), over a header that names the
//! sender, the recipient's key, the time it was sent and a counter (version 3):
//!
//! ```text
//!  0      2    3        7           11                    29             33        41        49     n-76        n-12  n
//!  | "IG" | v3 | key id | signer id | sender (ip16, port) | recipient id | sent at | counter | foca | signature | tag |
//! ```
//!
//! - The **key id** (the first 4 bytes of the cluster key's SHA-256) picks the cluster key, so
//!   a receiver holding the old and the new key during a rotation checks one tag, not two. The
//!   **tag** is cheap to check (a fifth of a microsecond), so a stranger's flood costs the
//!   receiver that, not a signature check (thirty): it is the gate, the signature the proof.
//! - The **signature** is the sender's key's over the header, the message and the recipient's
//!   whole address (not sent: the receiver puts its own). A receiver takes it only with the
//!   key the sender's record publishes for that address ([`Signers`]); the **signer id** (the
//!   first 4 bytes of that key's SHA-256) only says which key the sender used, so that an old
//!   or unknown one is told from a forgery. The **recipient id** is the receiver's own key's id:
//!   a packet sealed for another member is dropped before any check that costs.
//! - **Sent at** is the sender's wall clock in microseconds. Receivers drop a packet sent more
//!   than [`MAX_CLOCK_SKEW`] away from their own clock: an old capture, even on a receiver that
//!   just restarted. This asks the nodes' clocks to agree within the skew, which NTP gives any
//!   cluster (its certificates need it too).
//! - The **counter** is the sender's count of packets to this recipient: it grows by one per
//!   packet sealed for it, from the sender's clock at its first packet to it, and it starts
//!   again from the clock once it is [`REANCHOR_AFTER`] behind it (so a counter is never ahead
//!   of its sender's clock, and a restarted sender starts above everything it sent before,
//!   unless it sent more than one packet per microsecond). Receivers keep, per sender, the
//!   highest counter and which of the [`REPLAY_WINDOW`] below it they have seen, as IPsec does:
//!   a packet seen before is dropped, and so is one more than [`REPLAY_WINDOW`] packets older
//!   than the newest, which cannot be told from a replay. The window is kept per sender address
//!   and key, and touched only by a packet whose signature is that key's: no other node can
//!   move it (what was taken unsigned from an address, before its record published a key, has
//!   a window of its own). Counted per recipient, the window is packets sent to this member: at the
//!   gossip's rates to one peer (tens a second) it takes reordering over about a second,
//!   whatever the cluster's size.
//! - A counter more than [`MAX_CLOCK_SKEW`] **ahead** of the receiver's clock is dropped: no
//!   sender's counter is ahead of its clock. Without that bound one packet naming a sender and
//!   a counter near `u64::MAX` moved that sender's window to the end of time (by version 2, any
//!   holder of the cluster key could seal it). With it, the most such a packet does is push the
//!   window to the clock and the skew, and only its own sender can now seal it.
//! - What a receiver keeps of a sender is forgotten once the sender is no longer a member and
//!   was silent for [`FORGET_AFTER`] (see [`Envelope::forget`]): twice the skew, so every
//!   packet it ever took from that sender is stale by then and a replay is dropped as such.
//!
//! Version 3 adds 125 bytes to a message (version 2: 91), which keeps the gossip within its
//! aim of 2,048 bytes per node and second (docs/benchmarks.md, "liveness").
//!
//! **Version 2** (the previous release: no signature, the recipient's address, a 32-byte tag)
//! is still spoken with a peer whose record publishes no key: sent to it, and taken from its
//! address. From an address whose record publishes a key it is dropped (`unsigned`): the
//! record says that agent signs, so an unsigned packet in its name is a forgery. The next
//! release drops version 2 (docs/liveness.md, "Upgrading").
//!
//! What the envelope does not do: hide the contents (membership is not secret on a node network)
//! or stop a node from lying as itself.

mod keyring;
#[cfg(test)]
mod tests;
mod window;

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv6Addr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use ring::hmac;
use thiserror::Error;

pub use keyring::{KeyError, Keyring};
use window::ReplayWindow;

use crate::signing::{KeyId, NodeKey, SIGNATURE_LEN, Signers, Speaker};

const MAGIC: &[u8; 2] = b"IG";
/// The shortest key accepted: 256 bits, the hash's own size.
pub const MIN_KEY_LEN: usize = 32;
/// How far a packet's sequence (its sender's clock) may be from the receiver's clock.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(30);
/// How many packets below the newest from a sender may still arrive (reordered) and be taken.
pub const REPLAY_WINDOW: u64 = 64;
/// A sender's counter to one recipient starts again from its clock once it is this far behind
/// it. This bounds how long a counter pushed ahead (up to [`MAX_CLOCK_SKEW`]) keeps a sender's
/// packets out; each restart costs at most a packet reordered across it.
pub const REANCHOR_AFTER: Duration = Duration::from_secs(10);
/// How long after its last packet a sender that is no longer a member is forgotten: twice the
/// skew. A packet taken at the receiver's time `t` was sent at most [`MAX_CLOCK_SKEW`] after
/// `t` (by the sender's clock), so past `t` and twice the skew it is stale: forgetting the
/// sender's window then lets no replay through.
pub const FORGET_AFTER: Duration = Duration::from_secs(2 * MAX_CLOCK_SKEW.as_secs());

/// Where each field of one version's header is.
struct Layout {
    version: u8,
    sender: usize,
    recipient: usize,
    recipient_len: usize,
    sent_at: usize,
    header: usize,
    signature: usize,
    tag: usize,
}

impl Layout {
    const fn overhead(&self) -> usize {
        self.header + self.signature + self.tag
    }
}

/// Version 3: signed by the sender's own key, sealed for the recipient's key.
const V3: Layout = Layout {
    version: 3,
    sender: 11,
    recipient: 29,
    recipient_len: 4,
    sent_at: 33,
    header: 49,
    signature: SIGNATURE_LEN,
    tag: 12,
};
/// Version 2, the previous release's: the cluster key alone.
const V2: Layout = Layout {
    version: 2,
    sender: 7,
    recipient: 25,
    recipient_len: 18,
    sent_at: 43,
    header: 59,
    signature: 0,
    tag: 32,
};
/// Bytes the envelope adds to every message.
pub const OVERHEAD: usize = V3.overhead();
/// Bytes the previous release's envelope adds, still sent to its agents.
pub const OVERHEAD_V2: usize = V2.overhead();

/// Why a packet was dropped. Every reason is counted; none stops the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum Dropped {
    #[error("shorter than an envelope")]
    Truncated,
    #[error("not a gossip envelope")]
    NotGossip,
    #[error("a gossip envelope of another version: the sender runs an incompatible release")]
    OtherVersion,
    #[error("signed with a cluster key this node does not hold")]
    UnknownKey,
    #[error("the tag does not match: forged or corrupted")]
    BadTag,
    #[error("sent too long ago, or from a clock too far off")]
    Stale,
    #[error(
        "a counter further ahead of this node's clock than the allowed skew: forged, or a \
         sender's clock far off"
    )]
    Ahead,
    #[error("already received")]
    Replayed,
    #[error(
        "sealed for another member (a capture replayed here, or a packet for this node's agent \
         before a restart)"
    )]
    Misaddressed,
    #[error(
        "from an address that no node record, or more than one, lists: a node whose record is \
         not seen yet, an address two records claim, or a stranger"
    )]
    UnknownSender,
    #[error(
        "signed with a key that the sender's record does not publish: its agent restarted and \
         its record is not seen yet, or a node speaks for another"
    )]
    UnknownSigner,
    #[error("the signature is not the sender's key's: a node of the cluster speaking for another")]
    BadSignature,
    #[error(
        "unsigned, from an address whose record publishes a key: a node of the cluster speaking \
         for another, or an agent downgraded past the release that signs"
    )]
    Unsigned,
    #[error(
        "authentic, but the protocol message inside names another member as its sender: a node \
         of the cluster speaking for another"
    )]
    Impersonating,
    #[error("authentic, but not a message the protocol can read")]
    Malformed,
    #[error("authentic, but refused by the protocol (a message from this node itself, say)")]
    Refused,
}

impl Dropped {
    pub const ALL: [Dropped; 16] = [
        Dropped::Truncated,
        Dropped::NotGossip,
        Dropped::OtherVersion,
        Dropped::UnknownKey,
        Dropped::BadTag,
        Dropped::Stale,
        Dropped::Ahead,
        Dropped::Replayed,
        Dropped::Misaddressed,
        Dropped::UnknownSender,
        Dropped::UnknownSigner,
        Dropped::BadSignature,
        Dropped::Unsigned,
        Dropped::Impersonating,
        Dropped::Malformed,
        Dropped::Refused,
    ];

    /// A short name for metrics labels.
    pub fn label(self) -> &'static str {
        match self {
            Dropped::Truncated => "truncated",
            Dropped::NotGossip => "not_gossip",
            Dropped::OtherVersion => "other_version",
            Dropped::UnknownKey => "unknown_key",
            Dropped::BadTag => "bad_tag",
            Dropped::Stale => "stale",
            Dropped::Ahead => "ahead",
            Dropped::Replayed => "replayed",
            Dropped::Misaddressed => "misaddressed",
            Dropped::UnknownSender => "unknown_sender",
            Dropped::UnknownSigner => "unknown_signer",
            Dropped::BadSignature => "bad_signature",
            Dropped::Unsigned => "unsigned",
            Dropped::Impersonating => "impersonating",
            Dropped::Malformed => "malformed",
            Dropped::Refused => "refused",
        }
    }
}

/// Seals what this node sends and opens what it receives.
pub struct Envelope {
    keyring: Keyring,
    /// This agent's own key: it signs what this member seals, and its id is what the others
    /// seal for.
    key: NodeKey,
    key_id: KeyId,
    /// Who speaks for each address, by the records.
    signers: Arc<Signers>,
    /// This member's address: the sender of what it seals, the recipient of what it opens.
    me: SocketAddr,
    /// The counter of the last packet sealed for each recipient.
    counters: HashMap<SocketAddr, u64>,
    /// A replay window per sender and the key it signs with (none: version 2).
    seen: HashMap<(SocketAddr, Option<KeyId>), ReplayWindow>,
}

impl Envelope {
    /// An envelope for the member at `me`, signing with `key`, that takes nothing until it is
    /// given the records' [`Signers`].
    pub fn new(keyring: Keyring, key: NodeKey, me: SocketAddr) -> Self {
        Self {
            keyring,
            key_id: key.public().id(),
            key,
            signers: Arc::default(),
            me,
            counters: HashMap::new(),
            seen: HashMap::new(),
        }
    }

    /// Replaces the keys (a rotation step) without forgetting what was seen.
    pub fn set_keyring(&mut self, keyring: Keyring) {
        self.keyring = keyring;
    }

    /// Replaces the records' word on who speaks for each address.
    pub fn set_signers(&mut self, signers: Arc<Signers>) {
        self.signers = signers;
    }

    /// Whether anything sealed for `recipient` could be taken there: its record alone lists it
    /// and says how it speaks (a key, or none for the previous release). Nothing is sent to an
    /// address that is contested, unknown, or whose record's key is missing or unreadable: it
    /// would only be counted as a drop there.
    pub fn can_reach(&self, recipient: SocketAddr) -> bool {
        matches!(
            self.signers.speaker(recipient.ip()),
            Some(Speaker::Signed(_) | Speaker::Unsigned)
        )
    }

    /// `message` in an envelope to `recipient`, sent at `unix_micros`: signed (version 3) when
    /// the recipient's record publishes a key, else as the previous release seals it.
    pub fn seal(&mut self, unix_micros: u64, recipient: SocketAddr, message: &[u8]) -> Vec<u8> {
        let from_clock = unix_micros.max(1);
        let counter = match self.counters.get(&recipient) {
            // One more, while that stays close behind the clock. Far behind, start again from
            // the clock: a window pushed ahead by a forged packet is passed within
            // REANCHOR_AFTER of the clock passing it. Far ahead (this clock was set back by
            // more than the skew), receivers would drop it as ahead: start again too.
            Some(&last)
                if unix_micros.saturating_sub(last) <= micros(REANCHOR_AFTER)
                    && last <= unix_micros.saturating_add(micros(MAX_CLOCK_SKEW)) =>
            {
                last.saturating_add(1)
            }
            _ => from_clock,
        };
        self.counters.insert(recipient, counter);
        self.seal_with_counter(unix_micros, recipient, counter, message)
    }

    /// `message` in an envelope to `recipient`, sent at `unix_micros` with any `counter`, this
    /// envelope's own counters untouched (`seal` uses it with the next counter): what its
    /// sender could seal with a clock far off or a bug (tests bound what that costs the
    /// receivers).
    pub fn seal_with_counter(
        &self,
        unix_micros: u64,
        recipient: SocketAddr,
        counter: u64,
        message: &[u8],
    ) -> Vec<u8> {
        match self.signers.speaker(recipient.ip()) {
            Some(Speaker::Signed(key)) => {
                self.sealed_v3(unix_micros, recipient, key.id(), counter, message)
            }
            _ => self.sealed_v2(unix_micros, recipient, counter, message),
        }
    }

    fn sealed_v3(
        &self,
        unix_micros: u64,
        recipient: SocketAddr,
        recipient_key: KeyId,
        counter: u64,
        message: &[u8],
    ) -> Vec<u8> {
        let to = address_bytes(recipient);
        let mut packet = Vec::with_capacity(V3.overhead() + message.len() + to.len());
        packet.extend_from_slice(MAGIC);
        packet.push(V3.version);
        packet.extend_from_slice(&self.keyring.sign.id);
        packet.extend_from_slice(&self.key_id.0);
        packet.extend_from_slice(&address_bytes(self.me));
        packet.extend_from_slice(&recipient_key.0);
        packet.extend_from_slice(&unix_micros.to_be_bytes());
        packet.extend_from_slice(&counter.to_be_bytes());
        packet.extend_from_slice(message);
        // The recipient's address is signed and tagged but not sent: its receiver puts its own.
        let signature = with_suffix(&mut packet, &to, |signed| self.key.sign(signed));
        packet.extend_from_slice(&signature);
        let tag = with_suffix(&mut packet, &to, |tagged| {
            hmac::sign(&self.keyring.sign.hmac, tagged)
        });
        packet.extend_from_slice(&tag.as_ref()[..V3.tag]);
        packet
    }

    fn sealed_v2(
        &self,
        unix_micros: u64,
        recipient: SocketAddr,
        counter: u64,
        message: &[u8],
    ) -> Vec<u8> {
        let mut packet = Vec::with_capacity(V2.overhead() + message.len());
        packet.extend_from_slice(MAGIC);
        packet.push(V2.version);
        packet.extend_from_slice(&self.keyring.sign.id);
        packet.extend_from_slice(&address_bytes(self.me));
        packet.extend_from_slice(&address_bytes(recipient));
        packet.extend_from_slice(&unix_micros.to_be_bytes());
        packet.extend_from_slice(&counter.to_be_bytes());
        packet.extend_from_slice(message);
        let tag = hmac::sign(&self.keyring.sign.hmac, &packet);
        packet.extend_from_slice(tag.as_ref());
        packet
    }

    /// The message inside `packet`, received at `unix_micros`, and its sender; or why the packet
    /// is dropped. Only an authentic packet changes what this envelope remembers. The cheap
    /// checks come first: a stranger's packet costs a tag, never a signature check.
    pub fn open<'p>(
        &mut self,
        unix_micros: u64,
        packet: &'p [u8],
    ) -> Result<(SocketAddr, &'p [u8]), Dropped> {
        if packet.len() < OVERHEAD_V2.min(OVERHEAD) {
            return Err(Dropped::Truncated);
        }
        if &packet[..2] != MAGIC {
            return Err(Dropped::NotGossip);
        }
        let layout = match packet[2] {
            3 => &V3,
            2 => &V2,
            _ => return Err(Dropped::OtherVersion),
        };
        if packet.len() < layout.overhead() {
            return Err(Dropped::Truncated);
        }
        let key = self
            .keyring
            .accept
            .iter()
            .find(|k| k.id == packet[3..7])
            .ok_or(Dropped::UnknownKey)?;
        let me = address_bytes(self.me);
        let (body, tag) = packet.split_at(packet.len() - layout.tag);
        let recipient = &packet[layout.recipient..layout.recipient + layout.recipient_len];
        let sender = address_from(&packet[layout.sender..layout.sender + 18]);
        match layout.version {
            3 => {
                if recipient != self.key_id.0 {
                    return Err(Dropped::Misaddressed);
                }
                let mut expected = hmac::Context::with_key(&key.hmac);
                expected.update(body);
                expected.update(&me);
                if !equal_in_constant_time(&expected.sign().as_ref()[..V3.tag], tag) {
                    return Err(Dropped::BadTag);
                }
            }
            _ => {
                hmac::verify(&key.hmac, body, tag).map_err(|_| Dropped::BadTag)?;
                if recipient != me {
                    return Err(Dropped::Misaddressed);
                }
            }
        }
        let sent_at = read_u64(packet, layout.sent_at);
        let counter = read_u64(packet, layout.sent_at + 8);
        let skew = micros(MAX_CLOCK_SKEW);
        if sent_at.abs_diff(unix_micros) > skew {
            return Err(Dropped::Stale);
        }
        // No sender's counter runs ahead of its clock, nor its clock more than the skew ahead
        // of this one: such a counter would only push the sender's window out of its reach.
        if counter > unix_micros.saturating_add(skew) {
            return Err(Dropped::Ahead);
        }
        // Every member gossips on the same port: another port of a node's address is nobody.
        let speaker = (sender.port() == self.me.port())
            .then(|| self.signers.speaker(sender.ip()))
            .flatten();
        let message_end = body.len() - layout.signature;
        let signer = match (layout.version, speaker) {
            (_, None) => return Err(Dropped::UnknownSender),
            (3, Some(Speaker::Signed(public))) => {
                let id = public.id();
                if id.0 != packet[7..11] {
                    return Err(Dropped::UnknownSigner);
                }
                let signed = [&body[..message_end], &me].concat();
                if !public.verifies(&signed, &body[message_end..]) {
                    return Err(Dropped::BadSignature);
                }
                Some(id)
            }
            (3, Some(_)) => return Err(Dropped::UnknownSigner),
            (_, Some(Speaker::Unsigned)) => None,
            (_, Some(_)) => return Err(Dropped::Unsigned),
        };
        // A window per sender and key: what was taken unsigned from an address (or under an
        // agent's earlier key) cannot push the window its signed packets go through. A new key
        // of a sender (its agent restarted) replaces the windows of its earlier ones, which the
        // signature check refuses from now on: a sender keeps one window, however often it
        // restarts.
        if signer.is_some() && !self.seen.contains_key(&(sender, signer)) {
            self.seen.retain(|(s, _), _| *s != sender);
        }
        self.seen
            .entry((sender, signer))
            .or_default()
            .admit(counter, unix_micros)?;
        Ok((sender, &body[layout.header..message_end]))
    }

    /// Forgets, at `unix_micros`, what it keeps of addresses `is_member` says are no longer
    /// members: a sender's window once [`FORGET_AFTER`] has passed since the last packet taken
    /// from it, when everything it ever sent is stale (a replay is dropped as such, not taken
    /// as new by an empty window); a recipient's counter at once, as the next packet to it then
    /// starts from the clock, above every counter sent to it before.
    pub fn forget(&mut self, unix_micros: u64, is_member: impl Fn(&SocketAddr) -> bool) {
        self.seen.retain(|(sender, _), window| {
            is_member(sender) || window.taken_within(unix_micros, micros(FORGET_AFTER))
        });
        self.counters.retain(|recipient, _| is_member(recipient));
    }

    /// How many senders (windows) and recipients (counters) this envelope keeps.
    pub fn remembered(&self) -> (usize, usize) {
        (self.seen.len(), self.counters.len())
    }

    /// Whether this envelope keeps a replay window of `sender`.
    pub fn remembers_sender(&self, sender: SocketAddr) -> bool {
        self.seen.keys().any(|(s, _)| *s == sender)
    }
}

/// What `f` makes of `packet` with `suffix` after it, `packet` left as it was.
fn with_suffix<T>(packet: &mut Vec<u8>, suffix: &[u8], f: impl FnOnce(&[u8]) -> T) -> T {
    let len = packet.len();
    packet.extend_from_slice(suffix);
    let out = f(packet);
    packet.truncate(len);
    out
}

/// Whether two tags are equal, in a time that does not depend on where they differ.
fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len()
        && std::hint::black_box(a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y))) == 0
}

fn read_u64(packet: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(packet[at..at + 8].try_into().expect("8 bytes"))
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn address_bytes(addr: SocketAddr) -> [u8; 18] {
    let ip = match addr.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let mut out = [0; 18];
    out[..16].copy_from_slice(&ip.octets());
    out[16..].copy_from_slice(&addr.port().to_be_bytes());
    out
}

fn address_from(bytes: &[u8]) -> SocketAddr {
    let octets: [u8; 16] = bytes[..16].try_into().expect("16 bytes");
    let v6 = Ipv6Addr::from(octets);
    let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
    SocketAddr::new(ip, u16::from_be_bytes([bytes[16], bytes[17]]))
}
