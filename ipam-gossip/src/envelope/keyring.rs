//! The cluster keys: one to sign with, every one a packet may be signed with, and rotation.

use ring::{digest, hmac};
use thiserror::Error;

use super::MIN_KEY_LEN;

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
pub(super) struct Key {
    pub(super) id: [u8; 4],
    pub(super) hmac: hmac::Key,
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
    pub(super) sign: Key,
    pub(super) accept: Vec<Key>,
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
