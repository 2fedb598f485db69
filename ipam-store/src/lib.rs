//! The store a configuration names: the embedded database file (one node, the default), etcd,
//! or the Kubernetes API (many nodes sharing pools). The daemon wraps it to share its watches;
//! `ipamctl` reads and writes through it directly.

use std::sync::Arc;

use ipam_config::{StoreKind, StoreSettings, default_store};
use ipam_core::store::{RawObject, Revision, Store, StoreError, Watch, embedded::EmbeddedStore};
use ipam_etcd::{EtcdError, EtcdStore};
use ipam_kube::KubeStore;

/// One of the three stores, as the configuration names it.
#[derive(Clone)]
pub enum AnyStore {
    Embedded(EmbeddedStore),
    /// Boxed: the etcd client is large, and the store is cloned into every task.
    Etcd(Arc<EtcdStore>),
    Kubernetes(KubeStore),
}

#[derive(Debug, thiserror::Error)]
pub enum OpenStoreError {
    #[error(transparent)]
    Embedded(#[from] StoreError),
    #[error("cannot use the etcd store: {0}")]
    Etcd(#[from] EtcdError),
    #[error(
        "cannot reach the Kubernetes API: {0}; in a pod, check its service account; elsewhere \
         set KUBECONFIG or write ~/.kube/config"
    )]
    Kubernetes(#[source] kube::Error),
    #[error("cannot create the directory of the embedded store {path}: {source}")]
    Dir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

impl AnyStore {
    /// The Kubernetes store, when it is one (for what only Kubernetes has: Nodes, Pods,
    /// Events, Secrets).
    pub fn kube(&self) -> Option<&KubeStore> {
        match self {
            Self::Kubernetes(s) => Some(s),
            Self::Embedded(_) | Self::Etcd(_) => None,
        }
    }

    /// Whether other processes (other nodes, operator replicas) share this store.
    pub fn is_shared(&self) -> bool {
        matches!(self, Self::Etcd(_) | Self::Kubernetes(_))
    }

    /// Where the state lives, for logs and `ipamctl`.
    pub fn describe(&self) -> String {
        match self {
            Self::Embedded(_) => "embedded store".to_owned(),
            Self::Etcd(s) => format!(
                "etcd {} (prefix {})",
                s.config().endpoint_list(),
                s.config().prefix
            ),
            Self::Kubernetes(s) => s.describe(),
        }
    }

    /// Opens the store `settings` name; the embedded store's directory is created if missing.
    pub async fn open(settings: &StoreSettings) -> Result<Self, OpenStoreError> {
        match settings.kind {
            StoreKind::Embedded => {
                let path = settings.path.clone().unwrap_or_else(default_store);
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir).map_err(|source| OpenStoreError::Dir {
                        path: dir.to_owned(),
                        source,
                    })?;
                }
                Ok(Self::Embedded(EmbeddedStore::open(&path)?))
            }
            StoreKind::Etcd => {
                let config = settings
                    .etcd
                    .clone()
                    .expect("configuration validation requires [store.etcd] for kind etcd");
                Ok(Self::Etcd(Arc::new(EtcdStore::connect(config).await?)))
            }
            StoreKind::Kubernetes => {
                // In a pod its service account, else KUBECONFIG or ~/.kube/config.
                let client = kube::Client::try_default()
                    .await
                    .map_err(OpenStoreError::Kubernetes)?;
                Ok(Self::Kubernetes(
                    KubeStore::new(client, &settings.kubernetes.namespace)
                        .with_service_annotations(settings.service_annotations.clone()),
                ))
            }
        }
    }

    /// A second connection to the same store, for a task that must not share the first one's
    /// runtime (the node lease, renewed from a thread of its own).
    pub async fn connect_again(&self) -> Result<Self, OpenStoreError> {
        match self {
            Self::Embedded(s) => Ok(Self::Embedded(s.clone())),
            Self::Etcd(s) => Ok(Self::Etcd(Arc::new(
                EtcdStore::connect(s.config().clone()).await?,
            ))),
            // A client of its own: a clone would share connections driven by the first
            // client's runtime.
            Self::Kubernetes(s) => {
                let client = kube::Client::try_default()
                    .await
                    .map_err(OpenStoreError::Kubernetes)?;
                Ok(Self::Kubernetes(
                    KubeStore::new(client, s.namespace())
                        .with_service_annotations(s.service_annotations().clone()),
                ))
            }
        }
    }
}

impl Store for AnyStore {
    async fn get(&self, kind: &str, name: &str) -> Result<Option<RawObject>, StoreError> {
        match self {
            Self::Embedded(s) => s.get(kind, name).await,
            Self::Etcd(s) => s.get(kind, name).await,
            Self::Kubernetes(s) => s.get(kind, name).await,
        }
    }

    async fn list(&self, kind: &str) -> Result<Vec<RawObject>, StoreError> {
        match self {
            Self::Embedded(s) => s.list(kind).await,
            Self::Etcd(s) => s.list(kind).await,
            Self::Kubernetes(s) => s.list(kind).await,
        }
    }

    async fn create(&self, kind: &str, name: &str, value: Vec<u8>) -> Result<Revision, StoreError> {
        match self {
            Self::Embedded(s) => s.create(kind, name, value).await,
            Self::Etcd(s) => s.create(kind, name, value).await,
            Self::Kubernetes(s) => s.create(kind, name, value).await,
        }
    }

    async fn update(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        expected: &Revision,
    ) -> Result<Revision, StoreError> {
        match self {
            Self::Embedded(s) => s.update(kind, name, value, expected).await,
            Self::Etcd(s) => s.update(kind, name, value, expected).await,
            Self::Kubernetes(s) => s.update(kind, name, value, expected).await,
        }
    }

    async fn update_status(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        expected: &Revision,
    ) -> Result<Revision, StoreError> {
        match self {
            Self::Embedded(s) => s.update_status(kind, name, value, expected).await,
            Self::Etcd(s) => s.update_status(kind, name, value, expected).await,
            Self::Kubernetes(s) => s.update_status(kind, name, value, expected).await,
        }
    }

    async fn delete(
        &self,
        kind: &str,
        name: &str,
        expected: Option<&Revision>,
    ) -> Result<(), StoreError> {
        match self {
            Self::Embedded(s) => s.delete(kind, name, expected).await,
            Self::Etcd(s) => s.delete(kind, name, expected).await,
            Self::Kubernetes(s) => s.delete(kind, name, expected).await,
        }
    }

    async fn watch(&self, kind: &str) -> Result<Watch, StoreError> {
        match self {
            Self::Embedded(s) => s.watch(kind).await,
            Self::Etcd(s) => s.watch(kind).await,
            Self::Kubernetes(s) => s.watch(kind).await,
        }
    }
}
