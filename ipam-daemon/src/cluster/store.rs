//! The store the daemon runs on (`ipam_store::AnyStore`, as the configuration names it), with
//! one watch per kind shared by every clone (`shared_watch`), and one typed copy per kind for
//! the controllers that read it (`copies`).

use std::sync::Arc;

use ipam_config::StoreSettings;
use ipam_core::store::{RawObject, Resource, Revision, Store, StoreError, Watch};
use ipam_kube::KubeStore;
use ipam_store::{AnyStore, OpenStoreError};

use super::{
    copies::{Copies, Copy, Moment, Wake},
    shared_watch::SharedWatches,
};
use crate::metrics::Observed;

/// The store, cloned into every controller; its watches and copies are shared among the
/// clones.
#[derive(Clone)]
pub struct ClusterStore {
    store: AnyStore,
    watches: Arc<SharedWatches>,
    copies: Arc<Copies>,
}

impl From<AnyStore> for ClusterStore {
    fn from(store: AnyStore) -> Self {
        Self {
            watches: Arc::new(SharedWatches::new(store.describe())),
            copies: Arc::default(),
            store,
        }
    }
}

impl ClusterStore {
    /// The Kubernetes store, when it is one (for what only Kubernetes has: Nodes, Pods,
    /// Events, Secrets).
    pub fn kube(&self) -> Option<&KubeStore> {
        self.store.kube()
    }

    /// Counts the shared watches in `observed`'s metrics (`ipam_store_watches`, and
    /// `ipam_store_watch_stale` for a kind whose watch is in trouble), and fails its
    /// readiness while one has been in trouble too long (`shared_watch`).
    pub fn count_watches_in(&self, observed: &Observed) {
        self.watches.count_in(observed);
    }

    /// The process's copy of `T`'s kind, for a controller woken by `wake` when it changes
    /// (`copies`); waits, retrying and saying so for `for_what`, until the store first lists it.
    pub async fn follow<T: Resource + 'static>(&self, wake: &Wake, for_what: &str) -> Copy<T> {
        self.copies.follow::<T, _>(self, wake, for_what).await
    }

    /// The copies as they are now: none changes until the moment is dropped (`copies`).
    pub async fn moment(&self) -> Moment {
        self.copies.moment().await
    }

    pub async fn open(settings: &StoreSettings) -> Result<Self, OpenStoreError> {
        AnyStore::open(settings).await.map(Self::from)
    }

    /// A second connection to the same store, for a task that must not share the first one's
    /// runtime (the node lease, renewed from a thread of its own): its watches are its own too.
    pub async fn connect_again(&self) -> Result<Self, OpenStoreError> {
        self.store.connect_again().await.map(Self::from)
    }

    /// Whether other processes (other nodes, operator replicas) share this store.
    pub fn is_shared(&self) -> bool {
        self.store.is_shared()
    }

    /// Where the state lives, for logs and `ipamctl`.
    pub fn describe(&self) -> String {
        self.store.describe()
    }
}

/// Everything goes to the backend, but for `watch`: the kind's shared watch.
impl Store for ClusterStore {
    async fn get(&self, kind: &str, name: &str) -> Result<Option<RawObject>, StoreError> {
        self.store.get(kind, name).await
    }

    async fn list(&self, kind: &str) -> Result<Vec<RawObject>, StoreError> {
        self.store.list(kind).await
    }

    async fn create(&self, kind: &str, name: &str, value: Vec<u8>) -> Result<Revision, StoreError> {
        self.store.create(kind, name, value).await
    }

    async fn update(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        expected: &Revision,
    ) -> Result<Revision, StoreError> {
        self.store.update(kind, name, value, expected).await
    }

    async fn update_status(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        expected: &Revision,
    ) -> Result<Revision, StoreError> {
        self.store.update_status(kind, name, value, expected).await
    }

    async fn delete(
        &self,
        kind: &str,
        name: &str,
        expected: Option<&Revision>,
    ) -> Result<(), StoreError> {
        self.store.delete(kind, name, expected).await
    }

    async fn watch(&self, kind: &str) -> Result<Watch, StoreError> {
        self.watches.watch(&self.store, kind).await
    }
}

/// A write into a node's record that the store refused: what was written, whose record, and
/// which store, for the runtime to log with when it tries again.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {what} into node {node}'s record in {store}: {source}")]
pub struct RecordNotWritten {
    pub what: &'static str,
    pub node: String,
    pub store: String,
    pub source: StoreError,
}
