//! The authenticated envelope every gossip packet travels in.
//!
//! A host on the segment must not be able to declare a node dead, bring a dead one back, or
//! replay what it overheard. So every packet carries an HMAC-SHA256 under the cluster key, over
//! a header that names the sender, the recipient, the time it was sent and a counter:
//!
//! ```text
//!  0      2    3        7                    25                      43        51        59     n-32  n
//!  | "IG" | v2 | key id | sender (ip16, port) | recipient (ip16, port) | sent at | counter | foca | tag |
//! ```
//!
//! - The **key id** (the first 4 bytes of the key's SHA-256) picks the key, so a receiver holding
//!   the old and the new key during a rotation checks one tag, not two.
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
//!   than the newest, which cannot be told from a replay. Counted per recipient, the window is
//!   packets sent to this member: at the gossip's rates to one peer (tens a second) it takes
//!   reordering over about a second, whatever the cluster's size.
//! - A counter more than [`MAX_CLOCK_SKEW`] **ahead** of the receiver's clock is dropped: no
//!   sender's counter is ahead of its clock. Without that bound one packet sealed by a holder of
//!   the key, naming another member as its sender and a counter near `u64::MAX`, moved that
//!   sender's window to the end of time: every real packet of it was dropped as replayed until
//!   the receiver restarted (a key rotation keeps the windows). With it, the most such a packet
//!   does is push the window to the clock and the skew; the sender's counter passes that at its
//!   first restart from the clock after it, so the sender is heard again within
//!   [`MAX_CLOCK_SKEW`] and [`REANCHOR_AFTER`] (and its packets still reach the receiver
//!   through the others' indirect probes meanwhile).
//! - What a receiver keeps of a sender is forgotten once the sender is no longer a member and
//!   was silent for [`FORGET_AFTER`] (see [`Envelope::forget`]): twice the skew, so every
//!   packet it ever took from that sender is stale by then and a replay is dropped as such.
//! - The sender and the recipient are inside the tag: a replay cannot be passed off as coming
//!   from elsewhere, and a packet sent to one member and replayed to another is dropped there
//!   (each member's window only covers what was sent to it, so without the recipient a packet
//!   from A to C would be new to B).
//!
//! What the envelope does not do: hide the contents (membership is not secret on a node network)
//! or stop a holder of the key, that is a node of the cluster, from lying.
//!
//! Version 1 (no recipient, the clock as the sequence) is not accepted: members of the two
//! versions do not hear each other (see docs/liveness.md, "Upgrading").

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use ring::{digest, hmac};
use thiserror::Error;

const MAGIC: &[u8; 2] = b"IG";
const VERSION: u8 = 2;
const HEADER_LEN: usize = 2 + 1 + 4 + 18 + 18 + 8 + 8;
const TAG_LEN: usize = 32;
/// Bytes the envelope adds to every message.
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;
/// The shortest key accepted: 256 bits, the hash's own size.
pub const MIN_KEY_LEN: usize = 32;
/// How far a packet's sequence (its sender's clock) may be from the receiver's clock.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(30);
/// How many packets below the newest from a sender may still arrive (reordered) and be taken.
pub const REPLAY_WINDOW: u64 = 64;
/// A sender's counter to one recipient starts again from its clock once it is this far behind
/// it. This bounds how long a counter pushed ahead (up to [`MAX_CLOCK_SKEW`]) by a key holder
/// keeps a sender's packets out; each restart costs at most a packet reordered across it.
pub const REANCHOR_AFTER: Duration = Duration::from_secs(10);
/// How long after its last packet a sender that is no longer a member is forgotten: twice the
/// skew. A packet taken at the receiver's time `t` was sent at most [`MAX_CLOCK_SKEW`] after
/// `t` (by the sender's clock), so past `t` and twice the skew it is stale: forgetting the
/// sender's window then lets no replay through.
pub const FORGET_AFTER: Duration = Duration::from_secs(2 * MAX_CLOCK_SKEW.as_secs());

/// Why a cluster key was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum KeyError {
    #[error(
        "gossip key {name} is {len} bytes; it must be at least {MIN_KEY_LEN} random bytes \
         (generate one with `head -c 32 /dev/urandom | base64`)"
    )]
    TooShort { name: String, len: usize },
    #[error("gossip keys {first} and {second} are the same key; remove one")]
    Duplicate { first: String, second: String },
}

/// A cluster key and its id.
#[derive(Clone)]
struct Key {
    id: [u8; 4],
    hmac: hmac::Key,
}

impl Key {
    fn new(name: &str, secret: &[u8]) -> Result<Self, KeyError> {
        if secret.len() < MIN_KEY_LEN {
            return Err(KeyError::TooShort {
                name: name.to_owned(),
                len: secret.len(),
            });
        }
        let hash = digest::digest(&digest::SHA256, secret);
        let mut id = [0; 4];
        id.copy_from_slice(&hash.as_ref()[..4]);
        Ok(Self {
            id,
            hmac: hmac::Key::new(hmac::HMAC_SHA256, secret),
        })
    }
}

/// The keys of a cluster: one to sign with, and every key a packet may be signed with. A
/// rotation adds the new key as accepted on every node, then makes it the signing key, then
/// drops the old one.
#[derive(Clone)]
pub struct Keyring {
    sign: Key,
    accept: Vec<Key>,
}

/// Shows the keys' ids (the first bytes of their SHA-256), never the keys.
impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex = |id: &[u8; 4]| id.iter().map(|b| format!("{b:02x}")).collect::<String>();
        f.debug_struct("Keyring")
            .field("sign", &hex(&self.sign.id))
            .field(
                "accept",
                &self.accept.iter().map(|k| hex(&k.id)).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Keyring {
    /// `sign` signs and is accepted; `also_accept` are accepted too. Names are for errors
    /// (a file or a Secret's key).
    pub fn new<'a>(
        sign: (&str, &[u8]),
        also_accept: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<Self, KeyError> {
        let signing = Key::new(sign.0, sign.1)?;
        let mut accept = vec![signing.clone()];
        let mut names = vec![sign.0.to_owned()];
        for (name, secret) in also_accept {
            let key = Key::new(name, secret)?;
            if let Some(at) = accept.iter().position(|k| k.id == key.id) {
                return Err(KeyError::Duplicate {
                    first: names[at].clone(),
                    second: name.to_owned(),
                });
            }
            accept.push(key);
            names.push(name.to_owned());
        }
        Ok(Self {
            sign: signing,
            accept,
        })
    }
}

/// Why a packet was dropped. Every reason is counted; none stops the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum Dropped {
    #[error("shorter than an envelope")]
    Truncated,
    #[error("not a gossip envelope")]
    NotGossip,
    #[error("a gossip envelope of another version: the sender runs an incompatible release")]
    OtherVersion,
    #[error("signed with a key this node does not hold")]
    UnknownKey,
    #[error("the tag does not match: forged or corrupted")]
    BadTag,
    #[error("sent too long ago, or from a clock too far off")]
    Stale,
    #[error(
        "a counter further ahead of this node's clock than the allowed skew: forged by a holder \
         of the key, or a sender's clock far off"
    )]
    Ahead,
    #[error("already received")]
    Replayed,
    #[error("authentic, but sent to another member")]
    Misaddressed,
    #[error("authentic, but not a message the protocol can read")]
    Malformed,
    #[error("authentic, but refused by the protocol (a message from this node itself, say)")]
    Refused,
}

impl Dropped {
    pub const ALL: [Dropped; 11] = [
        Dropped::Truncated,
        Dropped::NotGossip,
        Dropped::OtherVersion,
        Dropped::UnknownKey,
        Dropped::BadTag,
        Dropped::Stale,
        Dropped::Ahead,
        Dropped::Replayed,
        Dropped::Misaddressed,
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
            Dropped::Malformed => "malformed",
            Dropped::Refused => "refused",
        }
    }
}

/// Seals what this node sends and opens what it receives.
pub struct Envelope {
    keyring: Keyring,
    /// This member's address: the sender of what it seals, the recipient of what it opens.
    me: SocketAddr,
    /// The counter of the last packet sealed for each recipient.
    counters: HashMap<SocketAddr, u64>,
    seen: HashMap<SocketAddr, ReplayWindow>,
}

impl Envelope {
    pub fn new(keyring: Keyring, me: SocketAddr) -> Self {
        Self {
            keyring,
            me,
            counters: HashMap::new(),
            seen: HashMap::new(),
        }
    }

    /// Replaces the keys (a rotation step) without forgetting what was seen.
    pub fn set_keyring(&mut self, keyring: Keyring) {
        self.keyring = keyring;
    }

    /// `message` in an envelope to `recipient`, sent at `unix_micros`.
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
        self.sealed(unix_micros, recipient, counter, message)
    }

    /// `message` in an envelope to `recipient`, sent at `unix_micros` with `counter`.
    fn sealed(
        &self,
        unix_micros: u64,
        recipient: SocketAddr,
        counter: u64,
        message: &[u8],
    ) -> Vec<u8> {
        let mut packet = Vec::with_capacity(OVERHEAD + message.len());
        packet.extend_from_slice(MAGIC);
        packet.push(VERSION);
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
    /// is dropped. Only an authentic packet changes what this envelope remembers.
    pub fn open<'p>(
        &mut self,
        unix_micros: u64,
        packet: &'p [u8],
    ) -> Result<(SocketAddr, &'p [u8]), Dropped> {
        if packet.len() < OVERHEAD {
            return Err(Dropped::Truncated);
        }
        if &packet[..2] != MAGIC {
            return Err(Dropped::NotGossip);
        }
        if packet[2] != VERSION {
            return Err(Dropped::OtherVersion);
        }
        let key = self
            .keyring
            .accept
            .iter()
            .find(|k| k.id == packet[3..7])
            .ok_or(Dropped::UnknownKey)?;
        let (signed, tag) = packet.split_at(packet.len() - TAG_LEN);
        hmac::verify(&key.hmac, signed, tag).map_err(|_| Dropped::BadTag)?;
        let sender = address_from(&packet[7..25]);
        if address_from(&packet[25..43]) != self.me {
            return Err(Dropped::Misaddressed);
        }
        let sent_at = u64::from_be_bytes(packet[43..51].try_into().expect("8 bytes"));
        let counter = u64::from_be_bytes(packet[51..59].try_into().expect("8 bytes"));
        let skew = micros(MAX_CLOCK_SKEW);
        if sent_at.abs_diff(unix_micros) > skew {
            return Err(Dropped::Stale);
        }
        // No sender's counter runs ahead of its clock, nor its clock more than the skew ahead
        // of this one: such a counter would only push the sender's window out of its reach.
        if counter > unix_micros.saturating_add(skew) {
            return Err(Dropped::Ahead);
        }
        self.seen
            .entry(sender)
            .or_default()
            .admit(counter, unix_micros)?;
        Ok((sender, &signed[HEADER_LEN..]))
    }

    /// Forgets, at `unix_micros`, what it keeps of addresses `is_member` says are no longer
    /// members: a sender's window once [`FORGET_AFTER`] has passed since the last packet taken
    /// from it, when everything it ever sent is stale (a replay is dropped as such, not taken
    /// as new by an empty window); a recipient's counter at once, as the next packet to it then
    /// starts from the clock, above every counter sent to it before.
    pub fn forget(&mut self, unix_micros: u64, is_member: impl Fn(&SocketAddr) -> bool) {
        self.seen.retain(|sender, window| {
            is_member(sender)
                || unix_micros.saturating_sub(window.last_taken) <= micros(FORGET_AFTER)
        });
        self.counters.retain(|recipient, _| is_member(recipient));
    }

    /// How many senders (windows) and recipients (counters) this envelope keeps.
    pub fn remembered(&self) -> (usize, usize) {
        (self.seen.len(), self.counters.len())
    }

    /// Whether this envelope keeps a replay window of `sender`.
    pub fn remembers_sender(&self, sender: SocketAddr) -> bool {
        self.seen.contains_key(&sender)
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The counters seen from one sender: the highest, and which of the [`REPLAY_WINDOW`] below it
/// (bit `k - 1` of `below` is the counter `highest - k`); and when (the receiver's clock) the
/// last packet was taken from it. A fixed size per sender, whatever it sends.
#[derive(Debug, Default)]
struct ReplayWindow {
    highest: u64,
    below: u64,
    last_taken: u64,
}

impl ReplayWindow {
    /// Takes `counter`, received at `unix_micros`, unless it was seen or is too old to tell.
    fn admit(&mut self, counter: u64, unix_micros: u64) -> Result<(), Dropped> {
        self.check_and_mark(counter)?;
        self.last_taken = self.last_taken.max(unix_micros);
        Ok(())
    }

    fn check_and_mark(&mut self, counter: u64) -> Result<(), Dropped> {
        if counter > self.highest {
            let shift = counter - self.highest;
            // The old highest becomes bit `shift - 1`; past the window it falls out, with
            // everything below it.
            self.below = if shift > REPLAY_WINDOW {
                0
            } else {
                let shifted = u32::try_from(shift)
                    .ok()
                    .and_then(|s| self.below.checked_shl(s))
                    .unwrap_or(0);
                shifted | (1 << (shift - 1))
            };
            self.highest = counter;
            return Ok(());
        }
        let back = self.highest - counter;
        if back == 0 || back > REPLAY_WINDOW {
            return Err(Dropped::Replayed);
        }
        let bit = 1 << (back - 1);
        if self.below & bit != 0 {
            return Err(Dropped::Replayed);
        }
        self.below |= bit;
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000_000;

    fn keyring(sign: &[u8; 32], accept: &[&[u8; 32]]) -> Keyring {
        Keyring::new(("new", sign), accept.iter().map(|k| ("old", k.as_slice()))).unwrap()
    }

    const A: &str = "10.0.0.1:7946";
    const B: &str = "[fd00::2]:7946";
    const C: &str = "10.0.0.3:7946";

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn pair(a: Keyring, b: Keyring) -> (Envelope, Envelope) {
        (Envelope::new(a, addr(A)), Envelope::new(b, addr(B)))
    }

    #[test]
    fn a_sealed_message_opens_once_with_its_sender_and_never_again() {
        let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
        let packet = a.seal(NOW, addr(B), b"hello");
        assert_eq!(packet.len(), OVERHEAD + 5);
        let (sender, message) = b.open(NOW + 10, &packet).unwrap();
        assert_eq!(sender, addr(A));
        assert_eq!(message, b"hello");
        assert_eq!(b.open(NOW + 20, &packet), Err(Dropped::Replayed));
        // The other way, over IPv6.
        let back = b.seal(NOW, addr(A), b"hi");
        assert_eq!(a.open(NOW, &back).unwrap().0, addr(B));
    }

    #[test]
    fn forged_corrupted_foreign_stale_and_short_packets_are_dropped_for_their_reason() {
        let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
        let mut stranger = Envelope::new(keyring(&[9; 32], &[]), addr(A));
        assert_eq!(
            b.open(NOW, &stranger.seal(NOW, addr(B), b"x")),
            Err(Dropped::UnknownKey)
        );

        let packet = a.seal(NOW, addr(B), b"you are dead");
        let mut flipped = packet.clone();
        flipped[OVERHEAD - TAG_LEN] ^= 1;
        assert_eq!(b.open(NOW, &flipped), Err(Dropped::BadTag));
        // A sender rewritten to pass the message off as another node's.
        let mut moved = packet.clone();
        moved[24] ^= 1;
        assert_eq!(b.open(NOW, &moved), Err(Dropped::BadTag));
        // A key id copied from the real key does not help without the key.
        // A recipient rewritten to deliver it to another member.
        let mut redirected = packet.clone();
        redirected[42] ^= 1;
        assert_eq!(b.open(NOW, &redirected), Err(Dropped::BadTag));
        let mut forged = stranger.seal(NOW, addr(B), b"you are dead");
        forged[3..7].copy_from_slice(&packet[3..7]);
        assert_eq!(b.open(NOW, &forged), Err(Dropped::BadTag));

        let skew = u64::try_from(MAX_CLOCK_SKEW.as_micros()).unwrap();
        let old = a.seal(NOW, addr(B), b"x");
        assert_eq!(b.open(NOW + skew + 1_000_000, &old), Err(Dropped::Stale));
        assert_eq!(
            b.open(NOW, &packet[..OVERHEAD - 1]),
            Err(Dropped::Truncated)
        );
        assert_eq!(b.open(NOW, &[0; OVERHEAD]), Err(Dropped::NotGossip));
        let mut version_one = packet.clone();
        version_one[2] = 1;
        assert_eq!(b.open(NOW, &version_one), Err(Dropped::OtherVersion));
        // None of that spoiled the genuine packet.
        assert!(b.open(NOW, &packet).is_ok());
    }

    #[test]
    fn a_packet_to_one_member_replayed_to_another_is_dropped_there() {
        let ring = || keyring(&[1; 32], &[]);
        let (mut a, mut b) = pair(ring(), ring());
        let mut c = Envelope::new(ring(), addr(C));
        let to_c = a.seal(NOW, addr(C), b"ping");
        assert_eq!(b.open(NOW, &to_c), Err(Dropped::Misaddressed));
        // B's window was not touched: A's next packet to B is taken, and C takes its own.
        assert!(b.open(NOW, &a.seal(NOW, addr(B), b"ping")).is_ok());
        assert_eq!(c.open(NOW, &to_c).unwrap().0, addr(A));
    }

    #[test]
    fn reordered_packets_within_the_window_are_accepted_once_each() {
        let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
        // Sealed over two seconds of the sender's clock: the window counts packets, not time.
        let packets: Vec<_> = (0..70)
            .map(|i| a.seal(NOW + i * 30_000, addr(B), b"m"))
            .collect();
        let at = NOW + 70 * 30_000;
        b.open(at, &packets[69]).unwrap();
        // Every one of the 64 before the newest still arrives, in any order.
        for p in packets[5..69].iter().rev() {
            b.open(at, p).unwrap();
        }
        for p in &packets[5..] {
            assert_eq!(b.open(at, p), Err(Dropped::Replayed));
        }
        // 65 behind the newest: out of the window, refused as it cannot be told from a replay.
        assert_eq!(b.open(at, &packets[4]), Err(Dropped::Replayed));
    }

    #[test]
    fn a_jump_of_exactly_the_window_keeps_the_previous_newest_refused() {
        let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
        let packets: Vec<_> = (0..=REPLAY_WINDOW)
            .map(|i| a.seal(NOW + i, addr(B), b"m"))
            .collect();
        b.open(NOW, &packets[0]).unwrap();
        // The newest is exactly REPLAY_WINDOW ahead: the first is at the window's edge.
        b.open(NOW, &packets[REPLAY_WINDOW as usize]).unwrap();
        assert_eq!(b.open(NOW, &packets[0]), Err(Dropped::Replayed));
        // Those in between were never seen: each is taken once.
        b.open(NOW, &packets[1]).unwrap();
        assert_eq!(b.open(NOW, &packets[1]), Err(Dropped::Replayed));
    }

    /// A holder of the key seals one packet naming A as its sender with a counter near the end
    /// of time: dropped as ahead, and A's packets are taken as before. (Before, it moved A's
    /// window there, and every real packet of A was dropped as replayed until B restarted.)
    #[test]
    fn a_counter_ahead_of_the_clock_by_more_than_the_skew_is_dropped_and_changes_nothing() {
        let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
        let mallory = Envelope::new(keyring(&[1; 32], &[]), addr(A));
        b.open(NOW, &a.seal(NOW, addr(B), b"m")).unwrap();
        let skew = micros(MAX_CLOCK_SKEW);
        for counter in [u64::MAX - 1, u64::MAX, NOW + skew + 1] {
            let forged = mallory.sealed(NOW, addr(B), counter, b"you are dead");
            assert_eq!(b.open(NOW, &forged), Err(Dropped::Ahead), "{counter}");
        }
        for at in [NOW + 1, NOW + 2] {
            assert!(b.open(at, &a.seal(at, addr(B), b"m")).is_ok());
        }
        // At the edge of the skew it cannot be told from a sender whose clock is that far
        // ahead: taken (the next test bounds what that costs).
        let edge = mallory.sealed(NOW, addr(B), NOW + skew, b"x");
        assert!(b.open(NOW, &edge).is_ok());
    }

    /// The most a forged counter can do: push A's window to the clock and the skew. A's
    /// counter starts again from its clock once it is REANCHOR_AFTER behind it, so B takes A's
    /// packets again within the skew and REANCHOR_AFTER; none of A's packets is ever ahead.
    #[test]
    fn a_window_pushed_to_the_edge_of_the_skew_takes_its_sender_again_within_a_bound() {
        let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
        let mallory = Envelope::new(keyring(&[1; 32], &[]), addr(A));
        let skew = micros(MAX_CLOCK_SKEW);
        let second = 1_000_000;
        b.open(NOW, &a.seal(NOW, addr(B), b"m")).unwrap();
        let forged = mallory.sealed(NOW, addr(B), NOW + skew, b"x");
        b.open(NOW, &forged).unwrap();
        // A sends a packet every half second, as a member probing B would.
        let mut back = None;
        for step in 1..200 {
            let at = NOW + step * second / 2;
            match b.open(at, &a.seal(at, addr(B), b"m")) {
                Ok(_) => {
                    back = Some(at);
                    break;
                }
                Err(e) => assert_eq!(e, Dropped::Replayed, "at {}", at - NOW),
            }
        }
        let back = back.expect("A's packets are never taken again") - NOW;
        let bound = skew + micros(REANCHOR_AFTER) + second / 2;
        assert!(back <= bound, "taken again after {back} µs (bound {bound})");

        // A's clock set back by more than the skew after it ran ahead: its counter starts
        // again from the clock rather than stay where B would drop it as ahead.
        let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
        let ahead = a.seal(NOW + 3 * skew, addr(B), b"m");
        assert_eq!(b.open(NOW, &ahead), Err(Dropped::Stale));
        assert!(b.open(NOW, &a.seal(NOW, addr(B), b"m")).is_ok());
    }

    /// A sender that is no longer a member is forgotten once every packet taken from it is
    /// stale, not sooner: its packets replayed after that are dropped as stale, never taken as
    /// new by an empty window. A member is never forgotten.
    #[test]
    fn a_forgotten_sender_s_packets_replayed_are_still_dropped() {
        let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
        let skew = micros(MAX_CLOCK_SKEW);
        let forget = micros(FORGET_AFTER);
        // The worst case: A's clock at the edge of the skew ahead of B's.
        let packets: Vec<_> = (0..3)
            .map(|i| {
                let p = a.seal(NOW + skew + i, addr(B), b"m");
                b.open(NOW + i, &p).unwrap();
                p
            })
            .collect();
        let last_taken = NOW + 2;
        let _ = b.seal(NOW, addr(A), b"back");
        b.forget(last_taken + 10 * forget, |_| true);
        assert!(b.remembers_sender(addr(A)), "a member is kept");
        b.forget(last_taken + forget, |_| false);
        assert!(
            b.remembers_sender(addr(A)),
            "kept until all it sent is stale"
        );
        assert_eq!(
            b.open(last_taken + forget, &packets[2]),
            Err(Dropped::Replayed)
        );
        let later = last_taken + forget + 1;
        b.forget(later, |_| false);
        assert!(!b.remembers_sender(addr(A)));
        assert_eq!(b.remembered(), (0, 0));
        for p in &packets {
            assert_eq!(b.open(later, p), Err(Dropped::Stale));
        }
        // A, sending again, is taken.
        assert!(b.open(later, &a.seal(later, addr(B), b"m")).is_ok());
    }

    #[test]
    fn a_restarted_sender_is_heard_and_its_old_packets_are_not() {
        let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
        let before: Vec<_> = (0..3).map(|_| a.seal(NOW, addr(B), b"m")).collect();
        for p in &before {
            b.open(NOW, p).unwrap();
        }
        // The same member a second later, as a new process: its counter starts from its clock.
        let mut restarted = Envelope::new(keyring(&[1; 32], &[]), addr(A));
        let after = restarted.seal(NOW + 1_000_000, addr(B), b"m");
        assert!(b.open(NOW + 1_000_000, &after).is_ok());
        assert_eq!(b.open(NOW + 1_000_000, &before[2]), Err(Dropped::Replayed));
    }

    #[test]
    fn a_rotation_accepts_old_and_new_and_signs_with_the_new() {
        let old = [3; 32];
        let new = [4; 32];
        let (mut rotated, mut not_yet) = pair(keyring(&new, &[&old]), keyring(&old, &[&new]));
        assert!(not_yet.open(NOW, &rotated.seal(NOW, addr(B), b"a")).is_ok());
        assert!(rotated.open(NOW, &not_yet.seal(NOW, addr(A), b"b")).is_ok());
        // Once the old key is dropped, packets signed with it are refused.
        rotated.set_keyring(keyring(&new, &[]));
        assert_eq!(
            rotated.open(NOW, &not_yet.seal(NOW + 1, addr(A), b"c")),
            Err(Dropped::UnknownKey)
        );
    }

    #[test]
    fn short_and_duplicate_keys_are_refused_by_name() {
        let short = Keyring::new(("gossip.key", &[1; 16]), []).err().unwrap();
        assert!(
            short.to_string().contains("gossip.key is 16 bytes"),
            "{short}"
        );
        let twice = Keyring::new(("a", &[1; 32]), [("b", [1; 32].as_slice())])
            .err()
            .unwrap();
        assert_eq!(
            twice,
            KeyError::Duplicate {
                first: "a".into(),
                second: "b".into()
            }
        );
    }
}
