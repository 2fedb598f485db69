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

use ipam_core::{
    pod::durable::DurableAllocator,
    pod::multipool::{PoolSource, admit, annotated_pool, network_pool},
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
    /// The pools in the store, as last read.
    /// Every pool of the store, with the namespaces it serves (empty: all).
    known: RwLock<Vec<(String, Vec<String>)>>,
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
        }
    }

    pub(super) fn own(&self) -> &str {
        &self.own
    }

    /// Makes `pool`'s allocator available to pods.
    pub(super) fn insert(&self, pool: &str, allocator: PoolAllocator) {
        self.open
            .write()
            .expect("pools lock")
            .insert(pool.to_owned(), allocator);
    }

    pub(super) fn set_known(&self, pools: Vec<(String, Vec<String>)>) {
        *self.known.write().expect("pools lock") = pools;
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
        let chosen = match annotated {
            Some((annotations, namespace, name)) => {
                let annotations = annotations.map_err(|e| NoPoolYet(e.to_string()))?;
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
        let serves = known
            .iter()
            .find(|(name, _)| *name == chosen.0)
            .map_or(&[][..], |(_, namespaces)| namespaces.as_slice());
        admit(who, namespace, chosen, serves).map_err(|e| NoPoolYet(e.to_string()))
    }
}
