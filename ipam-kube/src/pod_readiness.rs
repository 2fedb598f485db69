//! Taking a dead node's pods out of their Services' endpoints, the way the node lifecycle
//! controller does when it gives up on a node: each pod's `Ready` condition set to `False`
//! through the `pods/status` subresource. The EndpointSlice controller then marks their
//! endpoints not ready, and kube-proxy stops sending them new connections.
//!
//! Nothing here restores readiness: a node that was alive after all has its kubelet's status
//! sync write its pods' real conditions back (within its 10 s status sync), and a node that
//! comes back does the same as it starts.
//!
//! The pods change in two waves, a tenth of a second apart, so that the EndpointSlice
//! controller writes their slices at once instead of after its one-second backoff
//! ([`mark_pods_not_ready`]).
//!
//! Each pod is changed by a JSON patch that first tests the condition it changes (its index,
//! type and status `True`): a pod whose conditions changed meanwhile, or one already not
//! ready, is left alone. The test makes two operator replicas acting on the same reports
//! harmless.

use std::{collections::BTreeSet, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;

use crate::KubeStore;

/// The reason the marked pods' `Ready` condition carries.
pub const NOT_READY_REASON: &str = "NodeDeadByPeers";

/// What a marking did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Marked {
    /// `namespace/name` of each pod set not ready.
    pub pods: Vec<String>,
    /// Pods on the node that were not ready already (or changed meanwhile).
    pub left_alone: usize,
}

/// How long after the first wave of patches the second goes: longer than the EndpointSlice
/// controller takes to see its own write of the slices the first wave changed (milliseconds).
pub const SECOND_WAVE_AFTER: Duration = Duration::from_millis(100);

/// Sets `Ready` to `False` on every pod of `node` that is ready, with `message` saying why.
///
/// The pods go in two waves, each patched at once. The EndpointSlice controller syncs a
/// Service at its first pod's change and writes the slices; a change that arrives before its
/// cache has seen that write finds the cache stale, and the controller retries only after a
/// second (its backoff). The pods of a node change within tens of milliseconds, so all but
/// the first few would wait that second. Hence the second wave: one pod of each set of labels
/// (so of each Service the pods belong to) held back and patched `SECOND_WAVE_AFTER` the
/// first wave, when the controller's cache has caught up. Its change makes the controller sync
/// at once, with every pod of the node not ready: the slices are right about a tenth of a
/// second after the first wave instead of a second. kube-proxy applies the two writes at once
/// (it allows two syncs in a row before its `minSyncPeriod` applies).
pub async fn mark_pods_not_ready(
    store: &KubeStore,
    node: &str,
    message: &str,
) -> Result<Marked, kube::Error> {
    let pods: Api<Pod> = Api::all(store.client());
    // From the API server's cache: the patches test what they change, so a copy a moment old
    // does no harm, and a read from etcd would delay the marking.
    let on_node = ListParams::default()
        .fields(&format!("spec.nodeName={node}"))
        .match_any();
    let now = crate::conditions::now();
    let mut marked = Marked::default();
    let mut ready = Vec::new();
    for pod in pods.list(&on_node).await?.items {
        match ready_condition_index(&pod) {
            Some(index) => ready.push((pod, index)),
            None => marked.left_alone += 1,
        }
    }
    let (first, second) = waves(ready);
    let patch = |(pod, index): ReadyPod| patch_not_ready(store, pod, index, &now, message);
    let first_wave = futures_util::future::join_all(first.into_iter().map(patch)).await;
    let held_back = !first_wave.is_empty();
    marked.note(first_wave)?;
    if held_back {
        tokio::time::sleep(SECOND_WAVE_AFTER).await;
    }
    marked.note(futures_util::future::join_all(second.into_iter().map(patch)).await)?;
    Ok(marked)
}

/// A ready pod, with the index of its `Ready` condition.
type ReadyPod = (Pod, usize);

/// The pods in two waves: all but one of each set of labels, then those.
fn waves(ready: Vec<ReadyPod>) -> (Vec<ReadyPod>, Vec<ReadyPod>) {
    let mut seen = BTreeSet::new();
    ready
        .into_iter()
        .partition(|(pod, _)| !seen.insert(pod.metadata.labels.clone().unwrap_or_default()))
}

/// One pod's `Ready` condition (at `index`) set to `False`; `None` for a pod without a name.
async fn patch_not_ready(
    store: &KubeStore,
    pod: Pod,
    index: usize,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    message: &str,
) -> Option<(String, Result<Pod, kube::Error>)> {
    let (Some(namespace), Some(name)) = (pod.metadata.namespace, pod.metadata.name) else {
        return None;
    };
    let path = format!("/status/conditions/{index}");
    let patch: json_patch::Patch = serde_json::from_value(json!([
        { "op": "test", "path": format!("{path}/type"), "value": "Ready" },
        { "op": "test", "path": format!("{path}/status"), "value": "True" },
        { "op": "replace", "path": format!("{path}/status"), "value": "False" },
        { "op": "add", "path": format!("{path}/lastTransitionTime"), "value": now },
        { "op": "add", "path": format!("{path}/reason"), "value": NOT_READY_REASON },
        { "op": "add", "path": format!("{path}/message"), "value": message },
    ]))
    .expect("a JSON patch");
    let api: Api<Pod> = Api::namespaced(store.client(), &namespace);
    let done = api
        .patch_status(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await;
    Some((format!("{namespace}/{name}"), done))
}

impl Marked {
    /// Counts a wave's patches; the first error other than "changed meanwhile" or "gone" ends
    /// the marking.
    fn note(
        &mut self,
        wave: Vec<Option<(String, Result<Pod, kube::Error>)>>,
    ) -> Result<(), kube::Error> {
        for (pod, done) in wave.into_iter().flatten() {
            match done {
                Ok(_) => self.pods.push(pod),
                // The test failed (the pod changed meanwhile) or it is gone: nothing to do.
                Err(kube::Error::Api(e)) if e.code == 422 || e.code == 404 => self.left_alone += 1,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The index of the pod's `Ready` condition when it is `True`.
fn ready_condition_index(pod: &Pod) -> Option<usize> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .position(|c| c.type_ == "Ready")
        .filter(|i| conditions[*i].status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, app: &str) -> ReadyPod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.labels = Some([("app".to_owned(), app.to_owned())].into());
        (pod, 0)
    }

    /// One pod of each set of labels is held back for the second wave: every Service of the
    /// node's pods gets a change after the first wave.
    #[test]
    fn one_pod_of_each_set_of_labels_goes_second() {
        let ready = vec![
            pod("web-1", "web"),
            pod("web-2", "web"),
            pod("db-1", "db"),
            pod("web-3", "web"),
        ];
        let (first, second) = waves(ready);
        let names = |wave: &[ReadyPod]| -> Vec<String> {
            wave.iter()
                .map(|(p, _)| p.metadata.name.clone().unwrap())
                .collect()
        };
        assert_eq!(names(&first), ["web-2", "web-3"]);
        assert_eq!(names(&second), ["web-1", "db-1"]);
    }
}
