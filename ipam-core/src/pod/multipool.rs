//! Multi-pool decisions on the node: which pool a pod's address comes from, and when the node
//! asks for another block or gives an empty one back.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::{
    Cidr, Family,
    meta::Selector,
    pod::{node::NodeAllocator, pool::PodIpPoolSpec},
};

/// Pod or namespace annotation naming the pool to allocate from.
pub const POOL_ANNOTATION: &str = "ipam-ebpf.io/ip-pool";

/// Where the chosen pool came from, for logs and events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolSource {
    PodAnnotation,
    NamespaceAnnotation,
    /// The pod's network configuration (`"pool"` in the CNI configuration).
    NetworkConfig,
    /// Nothing names one: the node's own pool.
    Fallback,
    /// The attachment already holds an address of the pool (a repeated ADD).
    Held,
}

impl PoolSource {
    /// As logged: where the pool's name was found.
    pub const fn name(&self) -> &'static str {
        match self {
            Self::PodAnnotation => "pod annotation",
            Self::NamespaceAnnotation => "namespace annotation",
            Self::NetworkConfig => "network configuration",
            Self::Fallback => "node's pool",
            Self::Held => "addresses it already holds",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PoolChoiceError {
    #[error(
        "pod {namespace}/{pod}: its {source_name} annotation {POOL_ANNOTATION}={pool} names a pool \
         that does not exist (pools: {known}); fix the annotation or create the pool"
    )]
    UnknownPool {
        namespace: String,
        pod: String,
        source_name: &'static str,
        pool: String,
        known: String,
    },
    #[error(
        "{who}: the network configuration names pool {pool}, which does not exist (pools: \
         {known}); fix \"pool\" in the CNI configuration or create the pool"
    )]
    UnknownNetworkPool {
        who: String,
        pool: String,
        known: String,
    },
    #[error("{who}: its {source_name} names pool {pool}, which {why}")]
    NotAdmitted {
        who: String,
        source_name: &'static str,
        pool: String,
        /// Which namespaces the pool serves, why the pod's is not one, and what to do.
        why: String,
    },
}

/// The labels of a namespace, by key.
pub type Labels = BTreeMap<String, String>;

/// Which namespaces' pods may take a pool's addresses (`namespaces` and `namespaceSelector`;
/// both empty: every namespace).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tenants {
    pub namespaces: Vec<String>,
    pub selector: Selector,
}

impl Tenants {
    pub fn of(spec: &PodIpPoolSpec) -> Self {
        Self {
            namespaces: spec.namespaces.clone(),
            selector: spec.namespace_selector.clone(),
        }
    }

    /// The namespaces a reservation keeps its addresses for.
    pub fn of_reservation(reservation: &crate::pod::pool::Reservation) -> Self {
        Self {
            namespaces: reservation.namespaces.clone(),
            selector: reservation.namespace_selector.clone(),
        }
    }

    /// Whether namespaces' labels are needed to tell (the pool has a `namespaceSelector`).
    pub fn selects_by_labels(&self) -> bool {
        !self.selector.is_empty()
    }

    fn listed(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
    }

    /// Why pods of `namespace` (`None`: a container that is not a pod), with `labels`, may not
    /// take the pool's addresses, with what to do; `None` when they may.
    pub(crate) fn refusal(&self, namespace: Option<(&str, &Labels)>) -> Option<String> {
        self.refusal_of(namespace, Kept::Pool)
    }

    /// As [`Tenants::refusal`], for a reservation's addresses.
    pub(crate) fn refusal_of_reserved(&self, namespace: Option<(&str, &Labels)>) -> Option<String> {
        self.refusal_of(namespace, Kept::Reservation)
    }

    fn refusal_of(&self, namespace: Option<(&str, &Labels)>, kept: Kept) -> Option<String> {
        let Some((namespace, labels)) = namespace else {
            return (!self.namespaces.is_empty() || self.selects_by_labels()).then(|| match kept {
                Kept::Pool => "serves only pods of some namespaces; it is not a pod: take the \
                               node's pool (remove \"pool\" from its network configuration) \
                               or an unrestricted one"
                    .to_owned(),
                Kept::Reservation => "keeps them for pods of some namespaces; it is not a pod: \
                                      ask for an address that is not reserved"
                    .to_owned(),
            });
        };
        if !self.listed(namespace) {
            let listed = self.namespaces.join(", ");
            return Some(match kept {
                Kept::Pool => format!(
                    "serves only pods of the namespaces {listed}, not {namespace}; name a pool of \
                     its own namespace, or add the namespace to the pool's namespaces"
                ),
                Kept::Reservation => format!(
                    "keeps them for pods of the namespaces {listed}, not {namespace}; ask for an \
                     address that is not reserved, or add the namespace to the reservation's \
                     namespaces"
                ),
            });
        }
        if !self.selector.matches(labels) {
            return Some(match kept {
                Kept::Pool => format!(
                    "serves only pods of namespaces its namespaceSelector selects, and \
                     {namespace}'s labels do not match it; name a pool of its own namespace, or \
                     label the namespace as the selector asks"
                ),
                Kept::Reservation => format!(
                    "keeps them for pods of namespaces its namespaceSelector selects, and \
                     {namespace}'s labels do not match it; ask for an address that is not \
                     reserved, or label the namespace as the selector asks"
                ),
            });
        }
        None
    }
}

/// What a set of tenants keeps addresses in, for what a refusal advises.
#[derive(Debug, Clone, Copy)]
enum Kept {
    Pool,
    Reservation,
}

/// Checks that pods of `namespace` with its labels (`None`: a container that is not a pod) may
/// take addresses of `pool`, chosen from `source`, given who the pool serves. The node's own
/// pool, taken when nothing names one, is not restricted.
pub fn admit(
    who: &str,
    namespace: Option<(&str, &Labels)>,
    (pool, source): (String, PoolSource),
    tenants: &Tenants,
) -> Result<(String, PoolSource), PoolChoiceError> {
    if source == PoolSource::Fallback {
        return Ok((pool, source));
    }
    match tenants.refusal(namespace) {
        None => Ok((pool, source)),
        Some(why) => Err(PoolChoiceError::NotAdmitted {
            who: who.to_owned(),
            source_name: source.name(),
            pool,
            why,
        }),
    }
}

/// The pool a network configuration names, checked against the pools.
pub fn network_pool<'a>(
    who: &str,
    pool: &str,
    pools: impl IntoIterator<Item = &'a str> + Clone,
) -> Result<(String, PoolSource), PoolChoiceError> {
    if pools.clone().into_iter().any(|p| p == pool) {
        return Ok((pool.to_owned(), PoolSource::NetworkConfig));
    }
    Err(PoolChoiceError::UnknownNetworkPool {
        who: who.to_owned(),
        pool: pool.to_owned(),
        known: pools.into_iter().collect::<Vec<_>>().join(", "),
    })
}

/// The pool a pod's own annotation names, else its namespace's; `None` when neither does.
pub fn annotated_pool<'a>(
    namespace: &str,
    pod: &str,
    pod_annotations: &BTreeMap<String, String>,
    namespace_annotations: &BTreeMap<String, String>,
    pools: impl IntoIterator<Item = &'a str> + Clone,
) -> Result<Option<(String, PoolSource)>, PoolChoiceError> {
    for (annotations, source, source_name) in [
        (pod_annotations, PoolSource::PodAnnotation, "pod"),
        (
            namespace_annotations,
            PoolSource::NamespaceAnnotation,
            "namespace",
        ),
    ] {
        if let Some(pool) = annotations.get(POOL_ANNOTATION) {
            if !pools.clone().into_iter().any(|p| p == pool) {
                return Err(PoolChoiceError::UnknownPool {
                    namespace: namespace.to_owned(),
                    pod: pod.to_owned(),
                    source_name,
                    pool: pool.clone(),
                    known: pools.clone().into_iter().collect::<Vec<_>>().join(", "),
                });
            }
            return Ok(Some((pool.clone(), source)));
        }
    }
    Ok(None)
}

/// Pre-allocation settings of a pool on a node (Cilium's multi-pool `pre-allocate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermarks {
    /// Free addresses the node keeps ready; 0 means blocks are requested only on demand.
    pub pre_allocate: u64,
}

/// `true` when the node should ask the operator for another block of `family`: it has fewer
/// free addresses than the pre-allocation, or none at all while a request is waiting.
pub fn needs_block(node: &NodeAllocator, family: Family, w: Watermarks, demand: bool) -> bool {
    let free = node.free(family);
    free < w.pre_allocate || (demand && free == 0)
}

/// Empty blocks the node may give back while keeping `pre_allocate` free addresses. Nothing is
/// released before the node's allocations were restored after a restart (`restored`): until
/// then an empty-looking block may hold addresses of running pods.
pub fn releasable_blocks(
    node: &NodeAllocator,
    family: Family,
    w: Watermarks,
    restored: bool,
) -> Vec<Cidr> {
    if !restored {
        return Vec::new();
    }
    let mut free = node.free(family);
    let mut out = Vec::new();
    for block in node.empty_blocks(family).into_iter().rev() {
        let capacity = node_block_capacity(block);
        if free.saturating_sub(capacity) >= w.pre_allocate {
            free -= capacity;
            out.push(block);
        }
    }
    out
}

fn node_block_capacity(block: Cidr) -> u64 {
    // Mirrors the node allocator's address rules (docs in node.rs).
    let size = block.size().min(crate::pod::node::MAX_BLOCK_ADDRESSES) as u64;
    match block.family() {
        Family::V4 if size >= 4 => size - 2,
        Family::V4 => size,
        Family::V6 => size - 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        pod::blocks::BlockAllocator,
        pod::node::AllocError,
        pod::pool::{FamilySpec, PodIpPoolSpec, validate},
    };

    fn ann(pool: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(POOL_ANNOTATION.to_owned(), pool.to_owned())])
    }

    #[test]
    fn pool_comes_from_the_pod_then_its_namespace() {
        let pools = ["default", "tenant-a"];
        let none = BTreeMap::new();
        let chosen = |pod: &BTreeMap<String, String>, ns: &BTreeMap<String, String>| {
            annotated_pool("shop", "web", pod, ns, pools)
        };
        assert_eq!(
            chosen(&none, &ann("tenant-a")).unwrap(),
            Some(("tenant-a".into(), PoolSource::NamespaceAnnotation))
        );
        assert_eq!(
            chosen(&ann("default"), &ann("tenant-a")).unwrap(),
            Some(("default".into(), PoolSource::PodAnnotation))
        );
        assert_eq!(chosen(&none, &none).unwrap(), None, "nothing named");
        let e = chosen(&none, &ann("tenant-b")).unwrap_err().to_string();
        assert!(
            e.contains("shop/web")
                && e.contains("namespace annotation")
                && e.contains("tenant-b")
                && e.contains("default, tenant-a"),
            "{e}"
        );
    }

    #[test]
    fn a_network_names_a_pool_that_must_exist() {
        let pools = ["default", "tenant-a"];
        assert_eq!(
            network_pool("container c1", "tenant-a", pools).unwrap(),
            ("tenant-a".into(), PoolSource::NetworkConfig)
        );
        let e = network_pool("container c1", "tenant-b", pools)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("container c1")
                && e.contains("pool tenant-b")
                && e.contains("default, tenant-a")
                && e.contains("CNI configuration"),
            "{e}"
        );
    }

    /// The multi-pool seed: a tenant pool chosen by namespace annotation, /26 blocks (62
    /// addresses), on-demand blocks; 63 pods need two blocks, and when the pods go the empty
    /// block goes back, but never before the node restored its allocations.
    #[test]
    fn seed_tenant_pool_63_pods_two_blocks() {
        let mut operator = BlockAllocator::new();
        for (name, cidr) in [("default", "10.244.0.0/16"), ("tenant-a", "10.250.0.0/16")] {
            let spec = PodIpPoolSpec {
                reserved: Vec::new(),
                reservations: Vec::new(),
                ipv4: Some(FamilySpec {
                    cidrs: vec![cidr.into()],
                    mask_size: 26,
                }),
                ipv6: None,
                namespaces: Vec::new(),
                namespace_selector: Default::default(),
                max_blocks_per_node: None,
            };
            operator
                .upsert_pool(validate(name, &spec).unwrap())
                .unwrap();
        }
        let (pool, _) = annotated_pool(
            "tenant-a",
            "web-0",
            &BTreeMap::new(),
            &ann("tenant-a"),
            ["default", "tenant-a"],
        )
        .unwrap()
        .expect("the namespace names the pool");
        let mut node = NodeAllocator::new("worker-1", &pool);
        let w = Watermarks { pre_allocate: 0 };
        assert!(
            !needs_block(&node, Family::V4, w, false),
            "pre-allocation 0: no block up front"
        );
        for i in 0..63 {
            let owner = format!("tenant-a/web-{i}");
            loop {
                match node.allocate(&owner, Family::V4) {
                    Ok(ip) => {
                        assert!("10.250.0.0/16".parse::<Cidr>().unwrap().contains(ip));
                        break;
                    }
                    Err(AllocError::NoBlock { .. } | AllocError::Full { .. }) => {
                        assert!(needs_block(&node, Family::V4, w, true));
                        node.add_block(operator.allocate("worker-1", &pool, Family::V4).unwrap());
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        assert_eq!(node.blocks(Family::V4).len(), 2);
        assert_eq!(
            operator.blocks_of("worker-1", "tenant-a", Family::V4).len(),
            2
        );
        assert!(
            operator
                .blocks_of("worker-1", "default", Family::V4)
                .is_empty(),
            "no block of an unused pool"
        );

        node.release("tenant-a/web-62", Family::V4);
        assert!(
            releasable_blocks(&node, Family::V4, w, false).is_empty(),
            "not before restore"
        );
        let empty = releasable_blocks(&node, Family::V4, w, true);
        assert_eq!(empty.len(), 1);
        assert!(node.remove_block(empty[0]));
        operator.release("worker-1", "tenant-a", empty[0]).unwrap();
        assert_eq!(
            operator.usage("tenant-a", Family::V4).unwrap().used_blocks,
            1
        );

        // With pre-allocation 62 the last empty block is kept.
        let keep = Watermarks { pre_allocate: 62 };
        node.add_block(
            operator
                .allocate("worker-1", "tenant-a", Family::V4)
                .unwrap(),
        );
        assert!(releasable_blocks(&node, Family::V4, keep, true).is_empty());
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// A pool restricted to namespaces serves only their pods, whichever way they name it; the
    /// node's own pool (named by nothing) is not restricted; a container that is not a pod may
    /// not name a restricted pool.
    #[test]
    fn a_restricted_pool_serves_only_its_namespaces() {
        let tenants = Tenants {
            namespaces: vec!["shop".to_owned(), "pay".to_owned()],
            ..Tenants::default()
        };
        let none = Labels::new();
        for source in [
            PoolSource::PodAnnotation,
            PoolSource::NamespaceAnnotation,
            PoolSource::NetworkConfig,
        ] {
            let chosen = ("tenant".to_owned(), source.clone());
            assert!(admit("p", Some(("pay", &none)), chosen.clone(), &tenants).is_ok());
            assert!(
                admit(
                    "p",
                    Some(("other", &none)),
                    chosen.clone(),
                    &Tenants::default()
                )
                .is_ok(),
                "unrestricted"
            );
            let e = admit(
                "pod other/web",
                Some(("other", &none)),
                chosen.clone(),
                &tenants,
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("pod other/web")
                    && e.contains(
                        "names pool tenant, which serves only pods of the namespaces \
                                   shop, pay, not other"
                    ),
                "{e}"
            );
            let e = admit("container c1", None, chosen, &tenants)
                .unwrap_err()
                .to_string();
            assert!(e.contains("it is not a pod"), "{e}");
        }
        let own = ("default".to_owned(), PoolSource::Fallback);
        assert!(admit("p", Some(("other", &none)), own, &tenants).is_ok());
    }

    /// A pool with a namespaceSelector serves the pods of the namespaces it selects by their
    /// labels; with namespaces listed too, a namespace must pass both.
    #[test]
    fn a_namespace_selector_serves_the_namespaces_whose_labels_it_selects() {
        let selector: Selector =
            serde_json::from_value(serde_json::json!({ "matchLabels": { "tenant": "blue" } }))
                .unwrap();
        let by_labels = Tenants {
            namespaces: Vec::new(),
            selector: selector.clone(),
        };
        let both = Tenants {
            namespaces: vec!["shop".to_owned()],
            selector,
        };
        let blue = labels(&[("tenant", "blue")]);
        let red = labels(&[("tenant", "red")]);
        let chosen = ("blue".to_owned(), PoolSource::PodAnnotation);
        // (tenants, namespace, labels, admitted)
        let table = [
            (&by_labels, "shop", &blue, true),
            (&by_labels, "shop", &red, false),
            (&by_labels, "pay", &Labels::new(), false),
            (&both, "shop", &blue, true),
            (&both, "pay", &blue, false),
            (&both, "shop", &red, false),
        ];
        for (tenants, namespace, labels, admitted) in table {
            let got = admit(
                "pod x/web",
                Some((namespace, labels)),
                chosen.clone(),
                tenants,
            );
            assert_eq!(
                got.is_ok(),
                admitted,
                "{namespace} {labels:?} {tenants:?}: {got:?}"
            );
        }
        let e = admit(
            "pod pay/web",
            Some(("pay", &red)),
            chosen.clone(),
            &by_labels,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("names pool blue, which serves only pods of namespaces its namespaceSelector selects, and pay's labels do not match it")
                && e.contains("label the namespace"),
            "{e}"
        );
        assert!(admit("container c1", None, chosen, &by_labels).is_err());
    }
}
