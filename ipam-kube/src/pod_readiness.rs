//! Taking a dead node's pods out of their Services' endpoints, the way the node lifecycle
//! controller does when it gives up on a node: each pod's `Ready` condition set to `False`
//! through the `pods/status` subresource. The EndpointSlice controller then marks their
//! endpoints not ready, and kube-proxy stops sending them new connections.
//!
//! Nothing here restores readiness: a node that was alive after all has its kubelet's status
//! sync write its pods' real conditions back (within its 10 s status sync), and a node that
//! comes back does the same as it starts.
//!
//! Each pod is changed by a JSON patch that first tests the condition it changes (its index,
//! type and status `True`): a pod whose conditions changed meanwhile, or one already not
//! ready, is left alone. The test makes two operator replicas acting on the same reports
//! harmless.

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

/// Sets `Ready` to `False` on every pod of `node` that is ready, with `message` saying why.
/// The pods are patched at once: the sooner the last one is out, the sooner the EndpointSlice
/// controller writes the slices without them.
pub async fn mark_pods_not_ready(
    store: &KubeStore,
    node: &str,
    message: &str,
) -> Result<Marked, kube::Error> {
    let pods: Api<Pod> = Api::all(store.client());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let now = crate::conditions::now();
    let mut marked = Marked::default();
    let mut patches = Vec::new();
    for pod in pods.list(&on_node).await?.items {
        let Some(index) = ready_condition_index(&pod) else {
            marked.left_alone += 1;
            continue;
        };
        let (Some(namespace), Some(name)) = (pod.metadata.namespace, pod.metadata.name) else {
            continue;
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
        patches.push(async move {
            let done = api
                .patch_status(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await;
            (format!("{namespace}/{name}"), done)
        });
    }
    for (pod, done) in futures_util::future::join_all(patches).await {
        match done {
            Ok(_) => marked.pods.push(pod),
            // The test failed (the pod changed meanwhile) or it is gone: nothing to do.
            Err(kube::Error::Api(e)) if e.code == 422 || e.code == 404 => marked.left_alone += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(marked)
}

/// The index of the pod's `Ready` condition when it is `True`.
fn ready_condition_index(pod: &Pod) -> Option<usize> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .position(|c| c.type_ == "Ready")
        .filter(|i| conditions[*i].status == "True")
}
