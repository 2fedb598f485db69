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
    lb::resources::Namespace,
    pod::durable::DurableAllocator,
    pod::multipool::{Labels, PoolSource, Tenants, admit, annotated_pool, network_pool},
};
use ipam_kube::pods::PodDirectory;

use super::reserved::PoolKeeps;

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
    /// What each pool keeps, and for whom: addresses given only to pods that ask for them
    /// (its `reserved` and `reservations`), who its addresses are for.
    reserved: RwLock<BTreeMap<String, PoolKeeps>>,
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
            .set_requested_only(reserved.get(pool).map_or(&[], |k| &k.requested_only));
        self.open
            .write()
            .expect("pools lock")
            .insert(pool.to_owned(), allocator);
        drop(reserved);
    }

    pub(super) fn set_known(&self, pools: Vec<(String, Tenants)>) {
        *self.known.write().expect("pools lock") = pools;
    }

    /// What every pool keeps, and for whom, as last read from the store; the reserved
    /// addresses applied to the open allocators at once, and to those opened later. Whether
    /// anything changed.
    pub(super) fn set_reserved(&self, reserved: BTreeMap<String, PoolKeeps>) -> bool {
        let mut current = self.reserved.write().expect("pools lock");
        if *current == reserved {
            return false;
        }
        for (pool, allocator) in self.open.read().expect("pools lock").iter() {
            let cidrs = reserved.get(pool).map_or(&[][..], |k| &k.requested_only);
            allocator.alloc.set_requested_only(cidrs);
        }
        *current = reserved;
        true
    }

    /// What the pools keep, as last set.
    pub(super) fn reserved(&self) -> BTreeMap<String, PoolKeeps> {
        self.reserved.read().expect("pools lock").clone()
    }

    /// Whether `who`, pod `pod` (`namespace/name`), may be given the `requested` addresses of
    /// `pool`: the pool must serve its namespace (the node's own pool too: asking for an
    /// address is naming its pool), and an address a reservation keeps must be kept for it.
    /// Why not, said to the user: "try again" while the agent has not read who the pool's
    /// addresses are for (fail closed), a refusal with the reason otherwise.
    pub(super) fn check_tenancy(
        &self,
        who: &str,
        pod: Option<&str>,
        pool: &str,
        requested: &[std::net::IpAddr],
    ) -> Result<(), (ErrorCode, String)> {
        if requested.is_empty() {
            return Ok(());
        }
        let Some(tenancy) = self
            .reserved
            .read()
            .expect("pools lock")
            .get(pool)
            .map(PoolKeeps::tenancy)
        else {
            return Err((
                ErrorCode::NotReady,
                format!(
                    "{who}: asks for {requested:?} of pool {pool}, and this agent has not yet \
                     read the pool as the operator accepted it, so it cannot tell which \
                     namespaces its addresses are for; try again (if this lasts, the agent's \
                     log says whether the store is reachable, and the pool's status whether \
                     the operator accepted it)"
                ),
            ));
        };
        let namespace = pod.and_then(|p| p.split_once('/'));
        let labels = match namespace {
            Some((namespace, name)) if tenancy.selects_by_labels() => {
                self.namespace_labels(who, namespace, name)?
            }
            Some((namespace, _)) => Namespace::with_name_label(Labels::new(), namespace),
            None => Labels::new(),
        };
        let namespace = namespace.map(|(namespace, _)| (namespace, &labels));
        for ip in requested {
            if let Some(why) = tenancy.refusal(who, pool, *ip, namespace) {
                return Err((ErrorCode::BadRequest, why));
            }
        }
        Ok(())
    }

    /// The labels of pod `name`'s namespace: from the pods' directory on Kubernetes (waiting
    /// for the pod as `choose` does), else as the store pass last read them.
    fn namespace_labels(
        &self,
        who: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Labels, (ErrorCode, String)> {
        match &self.directory {
            Some(directory) => {
                let annotations = directory
                    .annotations(namespace, name, POD_WAIT)
                    .map_err(|e| (ErrorCode::NotReady, format!("{who}: {e}")))?;
                Ok(Namespace::with_name_label(
                    annotations.namespace_labels.clone(),
                    namespace,
                ))
            }
            // A namespace not read yet could match a selector that excludes labels
            // (`NotIn`, `DoesNotExist`) on its name label alone: wait for it.
            None => {
                let known = self.namespaces.read().expect("pools lock");
                if !known.contains_key(namespace) {
                    return Err((
                        ErrorCode::NotReady,
                        format!(
                            "{who}: the agent has not read namespace {namespace}'s labels from \
                             the store yet, which decide whether its pods may have the \
                             address asked for; try again"
                        ),
                    ));
                }
                Ok(Namespace::labels_of(&known, namespace))
            }
        }
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

    /// Whether the store pass must read the namespaces' labels: a pool (or one of `keeps`'
    /// reservations) selects namespaces by them, and no directory follows the Namespaces.
    pub(super) fn needs_namespaces(&self, keeps: &BTreeMap<String, PoolKeeps>) -> bool {
        let pools_select = self.multi_pool
            && self
                .known
                .read()
                .expect("pools lock")
                .iter()
                .any(|(_, tenants)| tenants.selects_by_labels());
        let keeps_select = keeps.values().any(|k| k.tenancy().selects_by_labels());
        self.directory.is_none() && (pools_select || keeps_select)
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
        assert!(
            !pools.needs_namespaces(&BTreeMap::new()),
            "no pool selects by labels"
        );
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
        assert!(pools.needs_namespaces(&BTreeMap::new()));
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

    /// An asked-for address a reservation keeps, judged on the namespace's labels: a pool
    /// not read yet, or a namespace whose labels are not read yet, is "try again" (even for a
    /// selector its name label alone would pass); a read namespace is judged on its labels;
    /// other addresses of the pool go to whoever asks.
    #[test]
    fn an_asked_address_waits_for_the_labels_and_is_judged_on_them() {
        use ipam_core::pod::pool::Reservation;

        let pools = PodPools::new("default", false, None);
        let ip = |s: &str| vec![s.parse::<std::net::IpAddr>().unwrap()];
        let check = |pod: &str, address: &str| {
            pools.check_tenancy(&format!("pod {pod}"), Some(pod), "default", &ip(address))
        };
        assert!(matches!(
            check("blue/x", "10.0.0.10"),
            Err((ErrorCode::NotReady, _))
        ));
        let not_red: Selector = serde_json::from_value(serde_json::json!({
            "matchExpressions": [{ "key": "team", "operator": "NotIn", "values": ["red"] }]
        }))
        .unwrap();
        let keeps = BTreeMap::from([(
            "default".to_owned(),
            PoolKeeps {
                requested_only: vec!["10.0.0.10/32".parse().unwrap()],
                reservations: vec![Reservation {
                    addresses: vec!["10.0.0.10".into()],
                    namespaces: Vec::new(),
                    namespace_selector: not_red,
                }],
                ..PoolKeeps::default()
            },
        )]);
        assert!(pools.needs_namespaces(&keeps), "cluster-pool mode too");
        pools.set_reserved(keeps);
        let (code, why) = check("blue/x", "10.0.0.10").unwrap_err();
        assert!(
            matches!(code, ErrorCode::NotReady) && why.contains("namespace blue's labels"),
            "{why}"
        );
        let team = |t: &str| Namespace {
            labels: BTreeMap::from([("team".to_owned(), t.to_owned())]),
        };
        pools.set_namespaces(BTreeMap::from([
            ("blue".to_owned(), team("blue")),
            ("red".to_owned(), team("red")),
        ]));
        assert!(check("blue/x", "10.0.0.10").is_ok());
        let (code, why) = check("red/x", "10.0.0.10").unwrap_err();
        assert!(
            matches!(code, ErrorCode::BadRequest)
                && why.contains("pod red/x")
                && why.contains("10.0.0.10")
                && why.contains("namespaceSelector"),
            "{why}"
        );
        assert!(check("red/x", "10.0.0.11").is_ok(), "not reserved");
    }
}
