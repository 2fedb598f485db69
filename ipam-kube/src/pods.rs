//! The agent's view of the pods on its node and of every namespace, for multi-pool mode: a CNI
//! ADD names the pod, and the pod's pool comes from the pool annotation on the pod or its
//! namespace (`ipam_core::pod::multipool::annotated_pool`).
//!
//! Both are metadata-only watches kept in reflector caches: annotations live in the metadata,
//! and a node's pods are watched by `spec.nodeName`, so the agent never holds other nodes'
//! pods nor their specs.

use std::{collections::BTreeMap, fmt::Debug, sync::Arc, time::Duration};

use futures_util::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api,
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt as _,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};

use crate::KubeStore;

/// How often a lookup that waits for the caches looks again.
const LOOK_AGAIN: Duration = Duration::from_millis(25);

/// What decides a pod's pool: the pod's and its namespace's annotations (which pool it names),
/// and its namespace's labels (whether a pool with a `namespaceSelector` serves it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodAnnotations {
    pub pod: BTreeMap<String, String>,
    pub namespace: BTreeMap<String, String>,
    pub namespace_labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodLookupError {
    #[error(
        "the agent has not listed {what} from the Kubernetes API yet (its log says why if the \
         API is unreachable); try again"
    )]
    NotListed { what: String },
    #[error(
        "pod {namespace}/{pod} is not among the Pods the Kubernetes API lists on node {node} \
         (spec.nodeName={node}); if it was just scheduled here, try again, else check that the \
         agent's node name ({node}) is the Node's name"
    )]
    PodNotSeen {
        namespace: String,
        pod: String,
        node: String,
    },
    #[error(
        "namespace {namespace} of pod {namespace}/{pod} is not known to the agent yet; try again"
    )]
    NamespaceNotSeen { namespace: String, pod: String },
}

/// The node's pods and every namespace, as last seen; cheap to clone.
#[derive(Clone)]
pub struct PodDirectory {
    node: String,
    pods: Cache<Pod>,
    namespaces: Cache<Namespace>,
}

/// A reflector's store, and whether it has listed once.
#[derive(Clone)]
struct Cache<K: kube::Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<PartialObjectMeta<K>>,
    listed: Arc<std::sync::atomic::AtomicBool>,
    what: String,
}

impl<K> Cache<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + Debug + serde::de::DeserializeOwned + Send + Sync,
{
    /// Starts following `api` with `config`; the watcher relists and backs off on its own.
    fn follow(api: Api<PartialObjectMeta<K>>, config: watcher::Config, what: String) -> Self {
        let (store, writer) = reflector::store();
        let cache = Self {
            store,
            listed: Arc::default(),
            what,
        };
        let events = reflector::reflector(writer, watcher(api, config).default_backoff());
        tokio::spawn(drive(events, cache.clone()));
        cache
    }

    fn listed(&self) -> bool {
        self.listed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The annotations and labels of `key`, if it is held.
    fn meta(
        &self,
        key: &ObjectRef<PartialObjectMeta<K>>,
    ) -> Option<(BTreeMap<String, String>, BTreeMap<String, String>)> {
        self.store.get(key).map(|o| {
            (
                o.metadata.annotations.clone().unwrap_or_default(),
                o.metadata.labels.clone().unwrap_or_default(),
            )
        })
    }
}

/// Runs a reflector's stream for as long as the daemon runs, saying once per outage why it
/// cannot watch.
async fn drive<K, S>(events: S, cache: Cache<K>)
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
    S: Stream<Item = Result<watcher::Event<PartialObjectMeta<K>>, watcher::Error>>,
{
    let mut events = std::pin::pin!(events);
    let mut failing = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                if matches!(event, watcher::Event::InitDone) {
                    cache
                        .listed
                        .store(true, std::sync::atomic::Ordering::SeqCst);
                }
                if failing {
                    tracing::info!("watching {} again", cache.what);
                    failing = false;
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!("cannot watch {}, retrying with backoff: {e}", cache.what);
                    failing = true;
                }
            }
        }
    }
}

impl KubeStore {
    /// Follows the Pods bound to `node` and every Namespace (metadata only).
    pub fn follow_pods(&self, node: &str) -> PodDirectory {
        let pods = Cache::follow(
            Api::all(self.client()),
            watcher::Config::default().fields(&format!("spec.nodeName={node}")),
            format!("the Pods on node {node}"),
        );
        let namespaces = Cache::follow(
            Api::all(self.client()),
            watcher::Config::default(),
            "the Namespaces".to_owned(),
        );
        PodDirectory {
            node: node.to_owned(),
            pods,
            namespaces,
        }
    }
}

impl PodDirectory {
    /// The annotations of pod `namespace/pod` and of its namespace, and its namespace's labels.
    /// A pod the caches do not hold yet (the ADD can come before the watch delivers a pod just
    /// bound) is waited for up to `wait`. Blocks the calling thread: call it off the async runtime.
    pub fn annotations(
        &self,
        namespace: &str,
        pod: &str,
        wait: Duration,
    ) -> Result<PodAnnotations, PodLookupError> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            match self.try_annotations(namespace, pod) {
                Ok(found) => return Ok(found),
                Err(e) if std::time::Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(LOOK_AGAIN),
            }
        }
    }

    fn try_annotations(
        &self,
        namespace: &str,
        pod: &str,
    ) -> Result<PodAnnotations, PodLookupError> {
        for (listed, what) in [
            (self.pods.listed(), &self.pods.what),
            (self.namespaces.listed(), &self.namespaces.what),
        ] {
            if !listed {
                return Err(PodLookupError::NotListed { what: what.clone() });
            }
        }
        let (pod_annotations, _) = self
            .pods
            .meta(&ObjectRef::new(pod).within(namespace))
            .ok_or_else(|| PodLookupError::PodNotSeen {
                namespace: namespace.to_owned(),
                pod: pod.to_owned(),
                node: self.node.clone(),
            })?;
        let (namespace_annotations, namespace_labels) = self
            .namespaces
            .meta(&ObjectRef::new(namespace))
            .ok_or_else(|| PodLookupError::NamespaceNotSeen {
                namespace: namespace.to_owned(),
                pod: pod.to_owned(),
            })?;
        Ok(PodAnnotations {
            pod: pod_annotations,
            namespace: namespace_annotations,
            namespace_labels,
        })
    }
}
