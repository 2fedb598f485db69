//! `[store]`: where the cluster state lives.

use std::path::PathBuf;

use serde::Deserialize;

/// The `[store]` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    #[serde(default)]
    pub kind: StoreKind,
    /// The embedded store's file (`[ipam] store` sets it too, for older files).
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Required for `kind = "etcd"`.
    #[serde(default)]
    pub etcd: Option<ipam_etcd::EtcdConfig>,
    /// For `kind = "kubernetes"` (optional: the defaults suit the manifests in deploy/).
    #[serde(default)]
    pub kubernetes: KubernetesStoreSettings,
    /// Whose annotations on a Service are read, by prefix (default: this project's, Cilium
    /// LB-IPAM's and MetalLB's); the precedence is fixed (docs/migration.md).
    #[serde(default)]
    pub service_annotations: ipam_core::lb::annotations::AnnotationSources,
}

/// `[store.kubernetes]`: the API server is found by the usual rules (in a pod, its service
/// account; elsewhere `KUBECONFIG` or `~/.kube/config`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesStoreSettings {
    /// The namespace of the project's Leases and ConfigMap (where it is deployed).
    pub namespace: String,
}

impl Default for KubernetesStoreSettings {
    fn default() -> Self {
        Self {
            namespace: "ipam-system".to_owned(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// A database file on this node: one node, or a cluster run from one host.
    #[default]
    Embedded,
    /// etcd v3: several nodes and operator replicas share the state.
    Etcd,
    /// The Kubernetes API: custom resources (deploy/base/crds.yaml) and Leases.
    Kubernetes,
}

impl StoreKind {
    /// Whether other processes (nodes, operator replicas) can share the store.
    pub fn is_shared(self) -> bool {
        matches!(self, Self::Etcd | Self::Kubernetes)
    }
}
