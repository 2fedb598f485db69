//! Who may speak for an address: each agent's own signing key, and the table of the keys the
//! node records publish.
//!
//! The cluster key (the [`Keyring`](crate::Keyring)) proves a packet comes from a node of the
//! cluster; it cannot tell which, so a holder of it (one compromised node) could speak as any
//! member: declare nodes dead, refute their deaths, answer probes for them. So every agent also
//! signs what it sends with a key of its own (Ed25519), made at its start and held only in its
//! memory; its public half goes into the agent's own node record (which only that node may
//! write), and a receiver takes a packet naming a sender only if it is signed by the key that
//! sender's record publishes ([`Signers`]), and only if the protocol message inside names that
//! same sender ([`crate::Peer`]). A compromised node can then speak only as itself (and lie as
//! itself: docs/security.md).
//!
//! An address listed by two records is **contested** and nobody's: the directory cannot tell
//! which record is lying, so packets from it are refused and the conflict is reported. A node
//! on the segment could deny another its gossip as much by ARP alone; what it cannot do is speak
//! as it.

use std::{collections::HashMap, fmt, net::IpAddr, str::FromStr};

use ring::{
    digest, hmac,
    rand::{SecureRandom, SystemRandom},
    signature::{self, Ed25519KeyPair, KeyPair},
};
use thiserror::Error;

/// Bytes of an Ed25519 signature.
pub const SIGNATURE_LEN: usize = 64;
const PUBLIC_KEY_LEN: usize = 32;
/// How a public key is written in a record: `ed25519:` and its 32 bytes in hex.
const PREFIX: &str = "ed25519:";

/// The first four bytes of a public key's SHA-256: which key signed a packet (a hint that makes
/// an old or unknown key a clear error, not a bad signature), and which key a packet is sealed
/// for. Never trusted on its own: the signature is checked against the key itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyId(pub [u8; 4]);

/// A node's public signing key, as its record publishes it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey {
    scheme: Scheme,
    bytes: [u8; PUBLIC_KEY_LEN],
}

/// How a key signs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Scheme {
    /// Ed25519: what every agent uses, and the only scheme a record can name.
    Ed25519,
    /// The simulators' stand-in: a keyed hash of the same size under a secret that is also
    /// its public half. It proves nothing to anyone who holds the public half, so it is never
    /// read from a record (only `ed25519:` parses) and exists only where a simulator makes it
    /// ([`NodeKey::modelled`]): the simulators check interleavings, not the primitive, and an
    /// Ed25519 signature and check (47 µs) made a 3-node seed twelve times slower.
    Modelled,
}

impl PublicKey {
    pub fn id(&self) -> KeyId {
        let scheme = [match self.scheme {
            Scheme::Ed25519 => 0,
            Scheme::Modelled => 1,
        }];
        let mut hash = digest::Context::new(&digest::SHA256);
        hash.update(&self.bytes);
        if self.scheme != Scheme::Ed25519 {
            hash.update(&scheme);
        }
        let hash = hash.finish();
        let mut id = [0; 4];
        id.copy_from_slice(&hash.as_ref()[..4]);
        KeyId(id)
    }

    /// Whether `signature` is this key's over `message`.
    pub(crate) fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        match self.scheme {
            Scheme::Ed25519 => signature::UnparsedPublicKey::new(&signature::ED25519, &self.bytes)
                .verify(message, signature)
                .is_ok(),
            Scheme::Modelled => signature == modelled_signature(&self.bytes, message),
        }
    }
}

/// The simulators' stand-in signature: HMAC-SHA256 under the key, padded to a signature's size.
fn modelled_signature(key: &[u8; PUBLIC_KEY_LEN], message: &[u8]) -> [u8; SIGNATURE_LEN] {
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), message);
    let mut out = [0; SIGNATURE_LEN];
    out[..tag.as_ref().len()].copy_from_slice(tag.as_ref());
    out
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.scheme {
            Scheme::Ed25519 => PREFIX,
            Scheme::Modelled => "modelled:",
        })?;
        self.bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why a record's key cannot be read.
#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "gossip key {text:?} is not `{PREFIX}` and {len} hex digits; the record must be rewritten by \
     its node's agent",
    len = 2 * PUBLIC_KEY_LEN
)]
pub struct BadPublicKey {
    pub text: String,
}

impl FromStr for PublicKey {
    type Err = BadPublicKey;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || BadPublicKey {
            text: text.chars().take(80).collect(),
        };
        let hex = text.strip_prefix(PREFIX).ok_or_else(bad)?;
        if hex.len() != 2 * PUBLIC_KEY_LEN || !hex.is_ascii() {
            return Err(bad());
        }
        let mut bytes = [0; PUBLIC_KEY_LEN];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Self {
            scheme: Scheme::Ed25519,
            bytes,
        })
    }
}

/// This agent's signing key: made at its start, never written anywhere (a restart is a new
/// key, published before the agent's first packet).
pub struct NodeKey {
    signer: Signer,
    public: PublicKey,
}

enum Signer {
    Ed25519(Ed25519KeyPair),
    Modelled([u8; PUBLIC_KEY_LEN]),
}

impl NodeKey {
    /// A new random key.
    pub fn generate() -> Self {
        let mut seed = [0; 32];
        SystemRandom::new()
            .fill(&mut seed)
            .expect("the system's random source works");
        Self::from_seed(&seed)
    }

    /// The Ed25519 key made from `seed` (the same on every run: tests).
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        let pair = Ed25519KeyPair::from_seed_unchecked(seed).expect("any 32 bytes are a seed");
        let mut bytes = [0; PUBLIC_KEY_LEN];
        bytes.copy_from_slice(pair.public_key().as_ref());
        Self {
            signer: Signer::Ed25519(pair),
            public: PublicKey {
                scheme: Scheme::Ed25519,
                bytes,
            },
        }
    }

    /// The simulators' stand-in for a key made from `seed` (see `Scheme::Modelled`): the same
    /// bytes on the wire and the same checks, at the cost of a keyed hash. No record can name
    /// it, so no agent ever takes it.
    pub(crate) fn modelled(seed: &[u8; 32]) -> Self {
        Self {
            signer: Signer::Modelled(*seed),
            public: PublicKey {
                scheme: Scheme::Modelled,
                bytes: *seed,
            },
        }
    }

    pub fn public(&self) -> PublicKey {
        self.public
    }

    pub(crate) fn sign(&self, message: &[u8]) -> [u8; SIGNATURE_LEN] {
        match &self.signer {
            Signer::Ed25519(pair) => {
                let mut out = [0; SIGNATURE_LEN];
                out.copy_from_slice(pair.sign(message).as_ref());
                out
            }
            Signer::Modelled(key) => modelled_signature(key, message),
        }
    }
}

/// Shows the public key only.
impl fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeKey")
            .field("public", &self.public)
            .finish()
    }
}

/// Who speaks for one address, by the records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speaker {
    /// The one record listing the address publishes this key: packets from the address must
    /// be signed with it (envelope v3).
    Signed(PublicKey),
    /// The one record listing the address publishes no key: its agent is of the previous
    /// release, which neither signs nor checks signatures (envelope v2, during an upgrade).
    Unsigned,
    /// The record listing the address publishes a key that cannot be read: nothing from it is
    /// taken, signed or not (taking it unsigned would let a broken key turn the check off).
    Unreadable,
    /// The record listing the address is of a release that signs but publishes no key yet (its
    /// agent is starting): nothing from it is taken until it does.
    Pending,
}

/// The records' word on who speaks for each address, and which record that is. An address no
/// record lists, and one that two records list, is in no entry: nothing from it is taken, and
/// it is no node's.
#[derive(Clone, Debug, Default)]
pub struct Signers {
    speakers: HashMap<IpAddr, (Speaker, Option<String>)>,
}

/// An address two or more records list, and which.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contested {
    pub address: IpAddr,
    pub claimants: Vec<String>,
}

impl Signers {
    /// The table from each record's name, addresses and published key; and the addresses that
    /// more than one record lists (left out of the table).
    pub fn from_records<'a>(
        records: impl IntoIterator<Item = (&'a str, &'a [IpAddr], Speaker)>,
    ) -> (Self, Vec<Contested>) {
        let mut claims: HashMap<IpAddr, (Vec<String>, Speaker)> = HashMap::new();
        for (name, addresses, speaker) in records {
            for address in addresses {
                let claim = claims
                    .entry(*address)
                    .or_insert_with(|| (Vec::new(), speaker));
                if !claim.0.iter().any(|n| n == name) {
                    claim.0.push(name.to_owned());
                }
            }
        }
        let mut contested = Vec::new();
        let mut speakers = HashMap::with_capacity(claims.len());
        for (address, (mut claimants, speaker)) in claims {
            if claimants.len() == 1 {
                speakers.insert(address, (speaker, claimants.pop()));
            } else {
                claimants.sort();
                contested.push(Contested { address, claimants });
            }
        }
        contested.sort_by_key(|c| c.address);
        (Self { speakers }, contested)
    }

    /// Who speaks for `address`, if one record alone lists it.
    pub fn speaker(&self, address: IpAddr) -> Option<Speaker> {
        self.speakers.get(&address).map(|(speaker, _)| *speaker)
    }

    /// The record that alone lists `address`, if it was built from records.
    pub fn claimant(&self, address: IpAddr) -> Option<&str> {
        self.speakers
            .get(&address)
            .and_then(|(_, name)| name.as_deref())
    }

    pub fn len(&self) -> usize {
        self.speakers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.speakers.is_empty()
    }
}

impl FromIterator<(IpAddr, Speaker)> for Signers {
    fn from_iter<I: IntoIterator<Item = (IpAddr, Speaker)>>(entries: I) -> Self {
        Self {
            speakers: entries
                .into_iter()
                .map(|(address, speaker)| (address, (speaker, None)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_public_key_reads_back_what_it_writes_and_refuses_anything_else() {
        let key = NodeKey::from_seed(&[5; 32]).public();
        let text = key.to_string();
        assert!(
            text.starts_with("ed25519:") && text.len() == 8 + 64,
            "{text}"
        );
        assert_eq!(text.parse::<PublicKey>(), Ok(key));
        for bad in [
            "",
            "ed25519:",
            &text[8..],
            &text[..text.len() - 1],
            &format!("{}zz", &text[..text.len() - 2]),
            &format!("rsa:{}", &text[8..]),
        ] {
            assert!(bad.parse::<PublicKey>().is_err(), "{bad}");
        }
        let message = b"ping";
        let signature = NodeKey::from_seed(&[5; 32]).sign(message);
        assert!(key.verifies(message, &signature));
        assert!(!key.verifies(b"pong", &signature));
        assert!(
            !NodeKey::from_seed(&[6; 32])
                .public()
                .verifies(message, &signature)
        );
    }

    #[test]
    fn an_address_two_records_list_is_nobody_s() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let a = NodeKey::from_seed(&[1; 32]).public();
        let m = NodeKey::from_seed(&[2; 32]).public();
        let a_addresses = [ip("10.0.0.1"), ip("fd00::1")];
        let m_addresses = [ip("10.0.0.9"), ip("10.0.0.1")];
        let old = [ip("10.0.0.5")];
        let (signers, contested) = Signers::from_records([
            ("a", a_addresses.as_slice(), Speaker::Signed(a)),
            ("m", m_addresses.as_slice(), Speaker::Signed(m)),
            ("old", old.as_slice(), Speaker::Unsigned),
        ]);
        assert_eq!(
            contested,
            vec![Contested {
                address: ip("10.0.0.1"),
                claimants: vec!["a".into(), "m".into()]
            }]
        );
        assert_eq!(signers.speaker(ip("10.0.0.1")), None);
        assert_eq!(signers.claimant(ip("10.0.0.1")), None);
        assert_eq!(signers.speaker(ip("fd00::1")), Some(Speaker::Signed(a)));
        assert_eq!(signers.claimant(ip("fd00::1")), Some("a"));
        assert_eq!(signers.speaker(ip("10.0.0.9")), Some(Speaker::Signed(m)));
        assert_eq!(signers.speaker(ip("10.0.0.5")), Some(Speaker::Unsigned));
        assert_eq!(signers.speaker(ip("10.0.0.7")), None);
    }
}
