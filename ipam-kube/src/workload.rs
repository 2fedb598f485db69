//! What the agent's own workload says about a stop: a DaemonSet that is gone or being deleted
//! is an uninstall (its pods go for good), while a rollout replaces the pod and keeps the
//! DaemonSet. The agent learns its pod from the downward API (`POD_NAME`, `POD_NAMESPACE`) and
//! the DaemonSet from the pod's controller reference.

use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::Pod};
use kube::Api;

use crate::KubeStore;

/// Where the agent's pod is, as the downward API tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnPod {
    pub namespace: String,
    pub name: String,
}

impl OwnPod {
    /// From `POD_NAMESPACE` and `POD_NAME`; `None` unless both are set.
    pub fn from_env() -> Option<Self> {
        let get = |key| std::env::var(key).ok().filter(|v| !v.is_empty());
        Some(Self {
            namespace: get("POD_NAMESPACE")?,
            name: get("POD_NAME")?,
        })
    }
}

impl KubeStore {
    /// Why the DaemonSet running `pod` is going away (gone, or being deleted), if it is;
    /// `None` while it stays (a rollout), or when the pod has no DaemonSet controlling it.
    pub async fn daemon_set_going(&self, pod: &OwnPod) -> Result<Option<String>, kube::Error> {
        let pods: Api<Pod> = Api::namespaced(self.client(), &pod.namespace);
        let Some(found) = pods.get_opt(&pod.name).await? else {
            return Ok(None);
        };
        let Some(owner) = found
            .metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .find(|o| o.kind == "DaemonSet" && o.controller == Some(true))
        else {
            return Ok(None);
        };
        let daemon_sets: Api<DaemonSet> = Api::namespaced(self.client(), &pod.namespace);
        let what = format!("DaemonSet {}/{}", pod.namespace, owner.name);
        Ok(match daemon_sets.get_opt(&owner.name).await? {
            None => Some(format!("{what} is gone")),
            Some(ds) if ds.metadata.uid.as_deref() != Some(owner.uid.as_str()) => {
                Some(format!("{what} was deleted (one of its name runs anew)"))
            }
            Some(ds) if ds.metadata.deletion_timestamp.is_some() => {
                Some(format!("{what} is being deleted"))
            }
            Some(_) => None,
        })
    }
}
