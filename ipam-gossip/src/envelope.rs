//! The authenticated envelope every gossip packet travels in.
//!
//! A host on the segment must not be able to declare a node dead, bring a dead one back, or
//! replay what it overheard. So every packet carries an HMAC-SHA256 under the cluster key, over
//! a header that names the sender and a sequence number:
//!
//! ```text
//!  0      2    3        7                    25          33                 n-32      n
//!  | "IG" | v1 | key id | sender (ip16, port) | sequence  | foca's message   | tag      |
//! ```
//!
//! - The **key id** (the first 4 bytes of the key's SHA-256) picks the key, so a receiver holding
//!   the old and the new key during a rotation checks one tag, not two.
//! - The **sequence** is the sender's wall clock in microseconds, forced to grow by at least one
//!   per packet. Receivers drop a packet whose sequence is more than [`MAX_CLOCK_SKEW`] away from
//!   their own clock (an old capture, even on a receiver that just restarted) or that they have
//!   already seen from that sender (a 64-packet window, as IPsec keeps). This asks the nodes'
//!   clocks to agree within the skew, which NTP gives any cluster (its certificates need it too).
//! - The sender is inside the tag: a replay cannot be passed off as coming from elsewhere.
//!
//! What the envelope does not do: hide the contents (membership is not secret on a node network)
//! or stop a holder of the key, that is a node of the cluster, from lying.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use ring::{digest, hmac};
use thiserror::Error;

const MAGIC: &[u8; 2] = b"IG";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 2 + 1 + 4 + 18 + 8;
const TAG_LEN: usize = 32;
/// Bytes the envelope adds to every message.
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;
/// The shortest key accepted: 256 bits, the hash's own size.
pub const MIN_KEY_LEN: usize = 32;
/// How far a packet's sequence (its sender's clock) may be from the receiver's clock.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(30);
const WINDOW: u64 = 64;

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
    #[error("signed with a key this node does not hold")]
    UnknownKey,
    #[error("the tag does not match: forged or corrupted")]
    BadTag,
    #[error("sent too long ago, or from a clock too far off")]
    Stale,
    #[error("already received")]
    Replayed,
    #[error("authentic, but not a message the protocol can read")]
    Malformed,
    #[error("authentic, but refused by the protocol (a message from this node itself, say)")]
    Refused,
}

impl Dropped {
    pub const ALL: [Dropped; 8] = [
        Dropped::Truncated,
        Dropped::NotGossip,
        Dropped::UnknownKey,
        Dropped::BadTag,
        Dropped::Stale,
        Dropped::Replayed,
        Dropped::Malformed,
        Dropped::Refused,
    ];

    /// A short name for metrics labels.
    pub fn label(self) -> &'static str {
        match self {
            Dropped::Truncated => "truncated",
            Dropped::NotGossip => "not_gossip",
            Dropped::UnknownKey => "unknown_key",
            Dropped::BadTag => "bad_tag",
            Dropped::Stale => "stale",
            Dropped::Replayed => "replayed",
            Dropped::Malformed => "malformed",
            Dropped::Refused => "refused",
        }
    }
}

/// Seals what this node sends and opens what it receives.
pub struct Envelope {
    keyring: Keyring,
    sender: SocketAddr,
    last_sequence: u64,
    seen: HashMap<SocketAddr, ReplayWindow>,
}

impl Envelope {
    pub fn new(keyring: Keyring, sender: SocketAddr) -> Self {
        Self {
            keyring,
            sender,
            last_sequence: 0,
            seen: HashMap::new(),
        }
    }

    /// Replaces the keys (a rotation step) without forgetting what was seen.
    pub fn set_keyring(&mut self, keyring: Keyring) {
        self.keyring = keyring;
    }

    /// `message` in an envelope, sent at `unix_micros`.
    pub fn seal(&mut self, unix_micros: u64, message: &[u8]) -> Vec<u8> {
        let sequence = unix_micros.max(self.last_sequence + 1);
        self.last_sequence = sequence;
        let mut packet = Vec::with_capacity(OVERHEAD + message.len());
        packet.extend_from_slice(MAGIC);
        packet.push(VERSION);
        packet.extend_from_slice(&self.keyring.sign.id);
        packet.extend_from_slice(&address_bytes(self.sender));
        packet.extend_from_slice(&sequence.to_be_bytes());
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
        if &packet[..2] != MAGIC || packet[2] != VERSION {
            return Err(Dropped::NotGossip);
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
        let sequence = u64::from_be_bytes(packet[25..33].try_into().expect("8 bytes"));
        let skew = u64::try_from(MAX_CLOCK_SKEW.as_micros()).unwrap_or(u64::MAX);
        if sequence.abs_diff(unix_micros) > skew {
            return Err(Dropped::Stale);
        }
        self.seen.entry(sender).or_default().admit(sequence)?;
        Ok((sender, &signed[HEADER_LEN..]))
    }
}

/// The sequences seen from one sender: the highest, and which of the 64 below it.
#[derive(Debug, Default)]
struct ReplayWindow {
    highest: u64,
    below: u64,
}

impl ReplayWindow {
    fn admit(&mut self, sequence: u64) -> Result<(), Dropped> {
        if sequence > self.highest {
            let shift = sequence - self.highest;
            self.below = if shift >= WINDOW {
                0
            } else {
                (self.below << shift) | (1 << (shift - 1))
            };
            self.highest = sequence;
            return Ok(());
        }
        let back = self.highest - sequence;
        if back == 0 || back > WINDOW {
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

    fn pair(a: Keyring, b: Keyring) -> (Envelope, Envelope) {
        (
            Envelope::new(a, "10.0.0.1:7946".parse().unwrap()),
            Envelope::new(b, "[fd00::2]:7946".parse().unwrap()),
        )
    }

    #[test]
    fn a_sealed_message_opens_once_with_its_sender_and_never_again() {
        let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
        let packet = a.seal(NOW, b"hello");
        assert_eq!(packet.len(), OVERHEAD + 5);
        let (sender, message) = b.open(NOW + 10, &packet).unwrap();
        assert_eq!(sender, "10.0.0.1:7946".parse().unwrap());
        assert_eq!(message, b"hello");
        assert_eq!(b.open(NOW + 20, &packet), Err(Dropped::Replayed));
        // The other way, over IPv6.
        let back = b.seal(NOW, b"hi");
        assert_eq!(
            a.open(NOW, &back).unwrap().0,
            "[fd00::2]:7946".parse().unwrap()
        );
    }

    #[test]
    fn forged_corrupted_foreign_stale_and_short_packets_are_dropped_for_their_reason() {
        let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
        let mut stranger = Envelope::new(keyring(&[9; 32], &[]), "10.0.0.1:7946".parse().unwrap());
        assert_eq!(
            b.open(NOW, &stranger.seal(NOW, b"x")),
            Err(Dropped::UnknownKey)
        );

        let packet = a.seal(NOW, b"you are dead");
        let mut flipped = packet.clone();
        flipped[OVERHEAD - TAG_LEN] ^= 1;
        assert_eq!(b.open(NOW, &flipped), Err(Dropped::BadTag));
        // A sender rewritten to pass the message off as another node's.
        let mut moved = packet.clone();
        moved[24] ^= 1;
        assert_eq!(b.open(NOW, &moved), Err(Dropped::BadTag));
        // A key id copied from the real key does not help without the key.
        let mut forged = stranger.seal(NOW, b"you are dead");
        forged[3..7].copy_from_slice(&packet[3..7]);
        assert_eq!(b.open(NOW, &forged), Err(Dropped::BadTag));

        let skew = u64::try_from(MAX_CLOCK_SKEW.as_micros()).unwrap();
        let old = a.seal(NOW, b"x");
        assert_eq!(b.open(NOW + skew + 1_000_000, &old), Err(Dropped::Stale));
        assert_eq!(
            b.open(NOW, &packet[..OVERHEAD - 1]),
            Err(Dropped::Truncated)
        );
        assert_eq!(b.open(NOW, &[0; OVERHEAD]), Err(Dropped::NotGossip));
        // None of that spoiled the genuine packet.
        assert!(b.open(NOW, &packet).is_ok());
    }

    #[test]
    fn reordered_packets_within_the_window_are_accepted_once_each() {
        let (mut a, mut b) = pair(keyring(&[1; 32], &[]), keyring(&[1; 32], &[]));
        let packets: Vec<_> = (0..70).map(|i| a.seal(NOW + i, b"m")).collect();
        b.open(NOW, &packets[69]).unwrap();
        for p in &packets[6..69] {
            b.open(NOW, p).unwrap();
        }
        for p in &packets[6..] {
            assert_eq!(b.open(NOW, p), Err(Dropped::Replayed));
        }
        // Older than the window: refused, as it cannot be told from a replay.
        assert_eq!(b.open(NOW, &packets[0]), Err(Dropped::Replayed));
    }

    #[test]
    fn a_rotation_accepts_old_and_new_and_signs_with_the_new() {
        let old = [3; 32];
        let new = [4; 32];
        let (mut rotated, mut not_yet) = pair(keyring(&new, &[&old]), keyring(&old, &[&new]));
        assert!(not_yet.open(NOW, &rotated.seal(NOW, b"a")).is_ok());
        assert!(rotated.open(NOW, &not_yet.seal(NOW, b"b")).is_ok());
        // Once the old key is dropped, packets signed with it are refused.
        rotated.set_keyring(keyring(&new, &[]));
        assert_eq!(
            rotated.open(NOW, &not_yet.seal(NOW + 1, b"c")),
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
