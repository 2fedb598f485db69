//! The pools a node's pods take addresses from. The node's own pool (`[ipam] infra_pool`, where
//! its router address comes from) is always open. In multi-pool mode a pod's pool is, in order:
//! the one its `ipam-ebpf.io/ip-pool` annotation names, or its namespace's (on a Kubernetes
//! store); the one its network configuration names (`"pool"` in the CNI configuration, on any
//! store); the node's own. The first pod of a pool on a node makes the runtime open that pool's
//! allocator and ask for a block, and the ADD is answered "try again" until the block is there
//! (as when the node's own pool runs out).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, RwLock, atomic::AtomicBool},
    time::Duration,
};

use ipam_api::types::ErrorCode;
use ipam_core::{
    Cidr,
    lb::resources::Namespace,
    pod::durable::DurableAllocator,
    pod::multipool::{PoolSource, Tenants, admit, annotated_pool, network_pool},
};
use ipam_kube::pods::PodDirectory;

/// How long an ADD waits for the pod to reach the agent's cache (the CNI call comes right
/// after the pod is bound; the watch usually delivers it within milliseconds).
const POD_WAIT: Duration = Duration::from_secs(2);

/// One pool's allocator on this node and the flag its agent watches for block requests.
#[derive(Clone)]
pub(super) struct PoolAllocator {
    pub(super) alloc: Arc<DurableAllocator>,
    pub(super) demand: Arc<AtomicBool>,
}

impl PoolAllocator {
    pub(super) fn of(agent: &ipam_core::pod::agent::NodeAgent) -> Self {
        Self {
            alloc: agent.allocator(),
            demand: agent.demand(),
        }
    }
}

/// Why a pod cannot be given a pool now; the message names the pod and what to do.
#[derive(Debug)]
pub(super) struct NoPoolYet(pub(super) String);

pub(super) struct PodPools {
    /// The node's own pool: pods that name none, and every pod outside multi-pool mode.
    own: String,
    /// Whether pods may name other pools (multi-pool mode).
    multi_pool: bool,
    /// Where pods' annotations are read (multi-pool mode on a Kubernetes store).
    directory: Option<PodDirectory>,
    open: RwLock<BTreeMap<String, PoolAllocator>>,
    /// Pools pods asked for that are not open yet; the runtime opens them.
    wanted: Mutex<BTreeSet<String>>,
    /// Every pool of the store, as last read, with the namespaces it serves.
    known: RwLock<Vec<(String, Tenants)>>,
    /// The namespaces' labels, as last read from the store, when a pool selects namespaces by
    /// them and no directory follows the Namespaces (etcd, the embedded store).
    namespaces: RwLock<BTreeMap<String, Namespace>>,
    /// Each pool's addresses given only to pods that ask for them (its `reserved`).
    reserved: RwLock<BTreeMap<String, Vec<Cidr>>>,
}

impl PodPools {
    pub(super) fn new(own: &str, multi_pool: bool, directory: Option<PodDirectory>) -> Self {
        Self {
            own: own.to_owned(),
            multi_pool,
            directory,
            open: RwLock::default(),
            wanted: Mutex::default(),
            known: RwLock::default(),
            namespaces: RwLock::default(),
            reserved: RwLock::default(),
        }
    }

    pub(super) fn own(&self) -> &str {
        &self.own
    }

    /// Whether pods may take addresses from other pools than the node's own.
    pub(super) fn multi_pool(&self) -> bool {
        self.multi_pool
    }

    /// Makes `pool`'s allocator available to pods.
    pub(super) fn insert(&self, pool: &str, allocator: PoolAllocator) {
        // Held until the allocator is in `open`, so a `set_reserved` meanwhile (which takes
        // the same two locks in the same order) cannot miss it.
        let reserved = self.reserved.read().expect("pools lock");
        allocator
            .alloc
            .set_requested_only(reserved.get(pool).map_or(&[], Vec::as_slice));
        self.open
            .write()
            .expect("pools lock")
            .insert(pool.to_owned(), allocator);
        drop(reserved);
    }

    pub(super) fn set_known(&self, pools: Vec<(String, Tenants)>) {
        *self.known.write().expect("pools lock") = pools;
    }

    /// Every pool's reserved addresses, as last read from the store; applied to the open
    /// allocators at once, and to those opened later. Whether they changed.
    pub(super) fn set_reserved(&self, reserved: BTreeMap<String, Vec<Cidr>>) -> bool {
        let mut current = self.reserved.write().expect("pools lock");
        if *current == reserved {
            return false;
        }
        for (pool, allocator) in self.open.read().expect("pools lock").iter() {
            let cidrs = reserved.get(pool).map_or(&[][..], Vec::as_slice);
            allocator.alloc.set_requested_only(cidrs);
        }
        *current = reserved;
        true
    }

    /// The reserved addresses as last set.
    pub(super) fn reserved(&self) -> BTreeMap<String, Vec<Cidr>> {
        self.reserved.read().expect("pools lock").clone()
    }

    /// The addresses pod `pod` (`namespace/name`) asks for by annotation, on a Kubernetes
    /// store (elsewhere a pod has no annotations: the runtime passes them, see `Attachment`).
    /// A pod the agent cannot see yet is "try again" (the kubelet retries); an annotation that
    /// does not parse is the request's fault.
    pub(super) fn annotated_addresses(
        &self,
        who: &str,
        pod: Option<&str>,
    ) -> Result<Vec<std::net::IpAddr>, (ErrorCode, String)> {
        let (Some(directory), Some((namespace, name))) =
            (&self.directory, pod.and_then(|p| p.split_once('/')))
        else {
            return Ok(Vec::new());
        };
        let annotations = directory
            .annotations(namespace, name, POD_WAIT)
            .map_err(|e| (ErrorCode::NotReady, format!("{who}: {e}")))?;
        ipam_core::pod::fixed::annotated(who, &annotations.pod)
            .map_err(|e| (ErrorCode::BadRequest, e.to_string()))
    }

    /// Whether the store pass must read the namespaces' labels: a pool selects namespaces by
    /// them, and no directory follows the Namespaces.
    pub(super) fn needs_namespaces(&self) -> bool {
        self.multi_pool
            && self.directory.is_none()
            && self
                .known
                .read()
                .expect("pools lock")
                .iter()
                .any(|(_, tenants)| tenants.selects_by_labels())
    }

    pub(super) fn set_namespaces(&self, namespaces: BTreeMap<String, Namespace>) {
        *self.namespaces.write().expect("pools lock") = namespaces;
    }

    /// The pools pods asked for since the last call.
    pub(super) fn take_wanted(&self) -> BTreeSet<String> {
        std::mem::take(&mut *self.wanted.lock().expect("pools lock"))
    }

    /// `pool`'s allocator; when it is not open yet, the runtime is asked to open it.
    pub(super) fn allocator(&self, pool: &str) -> Option<PoolAllocator> {
        let found = self.open.read().expect("pools lock").get(pool).cloned();
        if found.is_none() {
            self.wanted
                .lock()
                .expect("pools lock")
                .insert(pool.to_owned());
        }
        found
    }

    /// Every open pool's allocator (a pod's addresses are looked for in each).
    pub(super) fn all(&self) -> Vec<(String, PoolAllocator)> {
        self.open
            .read()
            .expect("pools lock")
            .iter()
            .map(|(name, a)| (name.clone(), a.clone()))
            .collect()
    }

    /// The pool of an attachment: `who` in messages, `pod` (`namespace/name`) as the runtime
    /// passed it to the CNI plugin, `network` the pool its network configuration names. Blocks
    /// up to a few seconds while the pod is not in the agent's cache yet.
    pub(super) fn choose(
        &self,
        who: &str,
        pod: Option<&str>,
        network: Option<&str>,
    ) -> Result<(String, PoolSource), NoPoolYet> {
        if !self.multi_pool {
            return match network {
                Some(pool) if pool != self.own => Err(NoPoolYet(format!(
                    "{who}: the network configuration names pool {pool}, but pools per network \
                     or pod need the multi-pool mode; this node takes every pod address from \
                     pool {own}; remove \"pool\" from the CNI configuration",
                    own = self.own
                ))),
                _ => Ok((self.own.clone(), PoolSource::Fallback)),
            };
        }
        let annotated = match (&self.directory, pod.and_then(|p| p.split_once('/'))) {
            (Some(directory), Some((namespace, name))) => Some((
                directory.annotations(namespace, name, POD_WAIT),
                namespace,
                name,
            )),
            _ => None,
        };
        if annotated.is_none() && network.is_none() {
            return Ok((self.own.clone(), PoolSource::Fallback));
        }
        let known = self.known.read().expect("pools lock").clone();
        if known.is_empty() {
            return Err(NoPoolYet(format!(
                "{who}: the agent has not read the pools from the store yet; try again"
            )));
        }
        let names = known.iter().map(|(name, _)| name.as_str());
        let namespace = pod.and_then(|p| p.split_once('/')).map(|(ns, _)| ns);
        // The namespace's labels: from the directory on Kubernetes, else from the store pass.
        let mut labels = None;
        let chosen = match annotated {
            Some((annotations, namespace, name)) => {
                let annotations = annotations.map_err(|e| NoPoolYet(e.to_string()))?;
                labels = Some(Namespace::with_name_label(
                    annotations.namespace_labels.clone(),
                    namespace,
                ));
                annotated_pool(
                    namespace,
                    name,
                    &annotations.pod,
                    &annotations.namespace,
                    names.clone(),
                )
                .map_err(|e| NoPoolYet(e.to_string()))?
            }
            None => None,
        };
        let chosen = match (chosen, network) {
            (Some(chosen), _) => chosen,
            (None, Some(pool)) => {
                network_pool(who, pool, names).map_err(|e| NoPoolYet(e.to_string()))?
            }
            (None, None) => (self.own.clone(), PoolSource::Fallback),
        };
        let everyone = Tenants::default();
        let tenants = known
            .iter()
            .find(|(name, _)| *name == chosen.0)
            .map_or(&everyone, |(_, tenants)| tenants);
        let labels = namespace.map(|ns| {
            labels.unwrap_or_else(|| {
                Namespace::labels_of(&self.namespaces.read().expect("pools lock"), ns)
            })
        });
        let namespace = namespace.zip(labels.as_ref());
        admit(who, namespace, chosen, tenants).map_err(|e| NoPoolYet(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use ipam_core::meta::Selector;

    use super::*;

    /// Without a directory of Namespaces (etcd, the embedded store), a pool's namespaceSelector
    /// is judged on the labels the store pass read, with the name label every namespace has;
    /// the pass reads them only while a pool needs them.
    #[test]
    fn without_a_directory_the_labels_come_from_the_store_pass() {
        let pools = PodPools::new("default", true, None);
        let selector = |labels: serde_json::Value| -> Selector {
            serde_json::from_value(serde_json::json!({ "matchLabels": labels })).unwrap()
        };
        pools.set_known(vec![
            ("default".to_owned(), Tenants::default()),
            ("open".to_owned(), Tenants::default()),
        ]);
        assert!(!pools.needs_namespaces(), "no pool selects by labels");
        pools.set_known(vec![
            ("default".to_owned(), Tenants::default()),
            (
                "blue".to_owned(),
                Tenants {
                    namespaces: Vec::new(),
                    selector: selector(serde_json::json!({ "team": "blue" })),
                },
            ),
            (
                "paint-only".to_owned(),
                Tenants {
                    namespaces: Vec::new(),
                    selector: selector(
                        serde_json::json!({ "kubernetes.io/metadata.name": "paint" }),
                    ),
                },
            ),
        ]);
        assert!(pools.needs_namespaces());
        pools.set_namespaces(BTreeMap::from([(
            "paint".to_owned(),
            Namespace {
                labels: BTreeMap::from([("team".to_owned(), "blue".to_owned())]),
            },
        )]));
        let chosen = |pod: &str, network: &str| pools.choose("pod", Some(pod), Some(network));
        assert_eq!(
            chosen("paint/art", "blue").unwrap(),
            ("blue".to_owned(), PoolSource::NetworkConfig)
        );
        assert!(chosen("paint/art", "paint-only").is_ok(), "the name label");
        let NoPoolYet(refused) = chosen("plain/sneak", "blue").unwrap_err();
        assert!(
            refused.contains("plain's labels do not match it"),
            "{refused}"
        );
        assert!(chosen("plain/sneak", "paint-only").is_err());
        // Not a pod: a restricted pool is refused, the node's own is not.
        assert!(pools.choose("container c1", None, Some("blue")).is_err());
        assert!(pools.choose("container c1", None, None).is_ok());
    }
}
