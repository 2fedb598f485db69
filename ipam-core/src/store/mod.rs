//! The resource store every controller is written against: get, list, watch, create,
//! update-if-revision (optimistic concurrency), delete, and leases on top of them.
//!
//! Objects are JSON documents addressed by (kind, name), each with the store revision of its
//! last change. Implementations: `embedded` (an ACID database file, the default for one node);
//! etcd and Kubernetes stores implement the same trait (revision = mod_revision /
//! resourceVersion), so controllers do not change with the store.

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod embedded;
pub mod lease;

use std::future::Future;

use serde::{Serialize, de::DeserializeOwned};
use thiserror::Error;

/// Which version of an object (or of the whole store) something was read at, as the store
/// names it. Controllers only keep revisions, compare them for equality and hand them back
/// with a write: etcd's and the embedded store's are numbers, while a Kubernetes
/// resourceVersion is an opaque string that clients must not parse or order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Revision {
    Number(u64),
    Opaque(String),
}

impl Revision {
    /// The number, for the stores whose revisions are numbers.
    pub fn number(&self) -> Option<u64> {
        match self {
            Self::Number(n) => Some(*n),
            Self::Opaque(_) => None,
        }
    }
}

impl From<u64> for Revision {
    fn from(n: u64) -> Self {
        Self::Number(n)
    }
}

impl std::fmt::Display for Revision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Opaque(s) => f.write_str(s),
        }
    }
}

/// An object as stored: kind, name, revision of its last change, JSON value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawObject {
    pub kind: String,
    pub name: String,
    pub revision: Revision,
    pub value: Vec<u8>,
}

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// Created or updated.
    Put(RawObject),
    Deleted {
        kind: String,
        name: String,
        revision: Revision,
    },
    /// Every object of the kind as of `revision`, after the watch could not follow each change
    /// (it fell behind, or the store compacted the revisions it needed): anything not in
    /// `objects` is gone. The watch goes on from `revision`.
    Resync {
        kind: String,
        revision: Revision,
        objects: Vec<RawObject>,
    },
}

impl WatchEvent {
    pub fn kind(&self) -> &str {
        match self {
            Self::Put(o) => &o.kind,
            Self::Deleted { kind, .. } | Self::Resync { kind, .. } => kind,
        }
    }

    pub fn revision(&self) -> &Revision {
        match self {
            Self::Put(o) => &o.revision,
            Self::Deleted { revision, .. } | Self::Resync { revision, .. } => revision,
        }
    }
}

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("{kind} {name} does not exist")]
    NotFound { kind: String, name: String },
    #[error(
        "{kind} {name:?} cannot be stored: its name {why}; rename it (every store takes the \
         names Kubernetes takes)"
    )]
    InvalidName {
        kind: String,
        name: String,
        why: String,
    },
    #[error("{kind} {name} already exists; update it instead, or delete it first")]
    AlreadyExists { kind: String, name: String },
    #[error(
        "{kind} {name} was changed by someone else (it is at revision {actual}, the change was \
         based on revision {expected}); read it again and re-apply the change"
    )]
    Conflict {
        kind: String,
        name: String,
        expected: Revision,
        actual: Revision,
    },
    #[error("{kind} {name} is not a valid {kind}: {source}")]
    Decode {
        kind: String,
        name: String,
        source: serde_json::Error,
    },
    #[error("store {location}: {source}")]
    Backend {
        location: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// A watch: the objects at the start, then every later change of the kind, in order. The
/// store's own task feeds it; it follows the store across restarts, lost connections and
/// compactions (with a `Resync`), so a watch never has to be restarted by its user.
pub struct Watch {
    pub initial: Vec<RawObject>,
    /// The store revision `initial` was read at.
    pub revision: Revision,
    events: tokio::sync::mpsc::Receiver<Result<WatchEvent, StoreError>>,
}

/// How many changes a watch buffers before its feeding task waits for the reader.
pub const WATCH_BUFFER: usize = 1024;

impl Watch {
    /// A watch fed through `events` by a store's task.
    pub fn new(
        initial: Vec<RawObject>,
        revision: Revision,
        events: tokio::sync::mpsc::Receiver<Result<WatchEvent, StoreError>>,
    ) -> Self {
        Self {
            initial,
            revision,
            events,
        }
    }

    /// The next change. An error reports trouble the store is already retrying (an
    /// unreachable etcd, say): the watch goes on after it, resuming where it was.
    pub async fn next(&mut self) -> Result<WatchEvent, StoreError> {
        match self.events.recv().await {
            Some(event) => event,
            // The store is gone: nothing will change any more.
            None => std::future::pending().await,
        }
    }

    /// A change if one is ready now.
    pub fn try_next(&mut self) -> Option<Result<WatchEvent, StoreError>> {
        self.events.try_recv().ok()
    }
}

/// `Err(InvalidName)` unless `name` is a name Kubernetes would take (see `crate::names`): the
/// check the etcd and embedded stores make before creating an object.
pub fn check_name(kind: &str, name: &str) -> Result<(), StoreError> {
    match crate::names::invalid_name(name) {
        Some(why) => Err(StoreError::InvalidName {
            kind: kind.to_owned(),
            name: name.to_owned(),
            why,
        }),
        None => Ok(()),
    }
}

/// The store interface. Writes are durable when they return.
pub trait Store: Send + Sync {
    fn get(
        &self,
        kind: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<RawObject>, StoreError>> + Send;
    fn list(&self, kind: &str) -> impl Future<Output = Result<Vec<RawObject>, StoreError>> + Send;
    /// Creates `kind/name`; fails with `AlreadyExists`. Returns the new revision.
    fn create(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
    ) -> impl Future<Output = Result<Revision, StoreError>> + Send;
    /// Replaces `kind/name` if it is still at `expected` revision; fails with `Conflict`.
    fn update(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        expected: &Revision,
    ) -> impl Future<Output = Result<Revision, StoreError>> + Send;
    /// Writes the status of `kind/name` alone, if it is still at `expected` revision; fails
    /// with `Conflict`. `value` is the whole object, as for `update`; a store that keeps an
    /// object whole writes it whole. The Kubernetes store writes only the status subresource:
    /// the spec of such a kind is the user's (applied with kubectl, without the fields the
    /// engine fills with defaults), and the writers of a status have no right to change it.
    fn update_status(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        expected: &Revision,
    ) -> impl Future<Output = Result<Revision, StoreError>> + Send;
    /// Deletes `kind/name` (if at `expected`, when given). Deleting nothing is not an error.
    fn delete(
        &self,
        kind: &str,
        name: &str,
        expected: Option<&Revision>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn watch(&self, kind: &str) -> impl Future<Output = Result<Watch, StoreError>> + Send;
}

/// A kind of resource with a typed value.
pub trait Resource: Serialize + DeserializeOwned + Send + Sync {
    const KIND: &'static str;
}

/// A typed object and the revision it was read at.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned<T> {
    pub name: String,
    pub revision: Revision,
    pub value: T,
}

pub fn decode<T: Resource>(o: &RawObject) -> Result<Versioned<T>, StoreError> {
    crate::spelling::note_old_spellings(&o.kind, &o.name, &o.value);
    Ok(Versioned {
        name: o.name.clone(),
        revision: o.revision.clone(),
        value: serde_json::from_slice(&o.value).map_err(|source| StoreError::Decode {
            kind: o.kind.clone(),
            name: o.name.clone(),
            source,
        })?,
    })
}

fn encode<T: Resource>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("resources serialise to JSON")
}

/// Typed access on any store.
pub trait TypedStore: Store {
    fn get_typed<T: Resource>(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Versioned<T>>, StoreError>> + Send {
        async move {
            self.get(T::KIND, name)
                .await?
                .as_ref()
                .map(decode)
                .transpose()
        }
    }

    fn list_typed<T: Resource>(
        &self,
    ) -> impl Future<Output = Result<Vec<Versioned<T>>, StoreError>> + Send {
        async move { self.list(T::KIND).await?.iter().map(decode).collect() }
    }

    fn create_typed<T: Resource>(
        &self,
        name: &str,
        value: &T,
    ) -> impl Future<Output = Result<Revision, StoreError>> + Send {
        let bytes = encode(value);
        async move { self.create(T::KIND, name, bytes).await }
    }

    fn update_typed<T: Resource>(
        &self,
        name: &str,
        value: &T,
        expected: &Revision,
    ) -> impl Future<Output = Result<Revision, StoreError>> + Send {
        let bytes = encode(value);
        let expected = expected.clone();
        async move { self.update(T::KIND, name, bytes, &expected).await }
    }

    /// Writes the status of `value` (`Store::update_status`) if `name` is still at `expected`.
    fn update_status_typed<T: Resource>(
        &self,
        name: &str,
        value: &T,
        expected: &Revision,
    ) -> impl Future<Output = Result<Revision, StoreError>> + Send {
        let bytes = encode(value);
        let expected = expected.clone();
        async move { self.update_status(T::KIND, name, bytes, &expected).await }
    }

    /// As `update_unless_changed`, writing the status alone (`Store::update_status`).
    fn update_status_unless_changed<T: Resource>(
        &self,
        name: &str,
        value: &T,
        expected: &Revision,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let bytes = encode(value);
        let expected = expected.clone();
        async move {
            match self.update_status(T::KIND, name, bytes, &expected).await {
                Ok(_) => Ok(true),
                Err(StoreError::Conflict { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        }
    }

    /// Writes `value` if `name` is still at `expected`. `Ok(false)` when someone changed it in
    /// the meantime: controllers then skip the write, and their next pass sees the change.
    fn update_unless_changed<T: Resource>(
        &self,
        name: &str,
        value: &T,
        expected: &Revision,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let bytes = encode(value);
        let expected = expected.clone();
        async move {
            match self.update(T::KIND, name, bytes, &expected).await {
                Ok(_) => Ok(true),
                Err(StoreError::Conflict { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

impl<S: Store> TypedStore for S {}
