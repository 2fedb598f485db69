//! `ipamctl who-has <IP>`: everything that knows an address, in one answer: a pod on this node
//! (from the endpoint table), the node's router, health or ingress address (its published
//! status), a Service and the node announcing it, the node whose block holds it, a node's own
//! address between nodes, or the pool that would hold it and that it is free.

use std::{net::IpAddr, path::Path};

use ipam_core::{
    Cidr,
    lb::resources::{LbIpPool, Service},
    resources::{NodeIpam, PodIpPool},
    store::{StoreError, TypedStore},
};
use serde::Serialize;

use ipam_api::endpoint_table;
use ipam_core::pod::published::read_status;

/// One thing that knows the address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(
    tag = "what",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase"
)]
pub(crate) enum Finding {
    /// A pod on the local node holds it.
    Pod {
        node: String,
        pod: Option<String>,
        container: String,
        interface: String,
    },
    /// The local node's router, health or ingress address.
    NodeAddress { node: String, purpose: String },
    /// A node's own address on the network between nodes.
    NodeUplink { node: String },
    /// A Service's IP, and the node answering ARP/NDP for it.
    Service {
        service: String,
        announced_by: Option<String>,
        /// Nodes that cannot announce from some interface they announced from before, with
        /// which and why (`node-1: edge0: no carrier (the link is lost)`).
        interfaces_down: Vec<String>,
    },
    /// Inside a block a node holds.
    Block {
        node: String,
        pool: String,
        block: Cidr,
    },
    /// Inside a pool, in no block or service: free.
    FreeInPool { pool: String, kind: String },
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pod {
                node,
                pod,
                container,
                interface,
            } => write!(
                f,
                "pod {} on node {node} (container {container}, interface {interface})",
                pod.as_deref().unwrap_or("(name not given by the runtime)")
            ),
            Self::NodeAddress { node, purpose } => {
                write!(f, "the {purpose} address of node {node}")
            }
            Self::NodeUplink { node } => write!(f, "node {node}'s address between nodes"),
            Self::Service {
                service,
                announced_by,
                interfaces_down,
            } => {
                write!(
                    f,
                    "the IP of service {service}, announced by {}",
                    announced_by
                        .as_deref()
                        .unwrap_or("no node (none is live and eligible)")
                )?;
                if !interfaces_down.is_empty() {
                    write!(
                        f,
                        "; not announced where an interface is down ({})",
                        interfaces_down.join("; ")
                    )?;
                }
                Ok(())
            }
            Self::Block { node, pool, block } => {
                write!(f, "in block {block} of pool {pool}, held by node {node}")
            }
            Self::FreeInPool { pool, kind } => {
                write!(
                    f,
                    "free: in {kind} pool {pool}, but no node or service holds it"
                )
            }
        }
    }
}

/// What this node knows of `ip` (its endpoint table and published status under `state_dir`).
pub(crate) fn local(ip: IpAddr, state_dir: &Path) -> Vec<Finding> {
    let mut out = Vec::new();
    let status = read_status(state_dir).ok();
    let node = status
        .as_ref()
        .map_or_else(|| "(this node)".to_owned(), |s| s.node.clone());
    for e in endpoint_table::read(state_dir).unwrap_or_default() {
        if e.ips.contains(&ip) {
            out.push(Finding::Pod {
                node: node.clone(),
                pod: e.pod.clone(),
                container: e.id.container_id.clone(),
                interface: e.id.ifname.clone(),
            });
        }
    }
    if let Some(s) = &status {
        for (purpose, by_family) in &s.infra {
            if by_family.values().any(|a| *a == ip) {
                out.push(Finding::NodeAddress {
                    node: node.clone(),
                    purpose: purpose.clone(),
                });
            }
        }
    }
    out
}

/// What the cluster's store knows of `ip`.
pub(crate) async fn cluster<S: TypedStore>(
    store: &S,
    ip: IpAddr,
) -> Result<Vec<Finding>, StoreError> {
    let mut out = Vec::new();
    let services = store.list_typed::<Service>().await?;
    let announcing = crate::objects::parse::announcing_nodes(store).await?;
    let nodes = store.list_typed::<NodeIpam>().await?;
    let interfaces_down: Vec<String> = nodes
        .iter()
        .flat_map(|n| {
            n.value
                .spec
                .interfaces_down
                .iter()
                .map(|d| format!("{}: {}: {}", n.name, d.name, d.why))
        })
        .collect();
    for s in &services {
        if s.value.status.ingress.contains(&ip) || s.value.spec.external_ips.contains(&ip) {
            out.push(Finding::Service {
                service: s.name.clone(),
                announced_by: announcing.get(&ip).cloned(),
                interfaces_down: interfaces_down.clone(),
            });
        }
    }
    let mut in_block = false;
    for n in &nodes {
        if n.value.spec.addresses.contains(&ip) {
            out.push(Finding::NodeUplink {
                node: n.name.clone(),
            });
        }
        for b in n
            .value
            .status
            .allocated
            .iter()
            .filter(|b| b.cidr.contains(ip))
        {
            in_block = true;
            out.push(Finding::Block {
                node: n.name.clone(),
                pool: b.pool.clone(),
                block: b.cidr,
            });
        }
    }
    if !in_block && out.is_empty() {
        for p in store.list_typed::<PodIpPool>().await? {
            let cidrs = [&p.value.spec.ipv4, &p.value.spec.ipv6]
                .into_iter()
                .flatten()
                .flat_map(|f| f.cidrs.iter());
            if cidrs
                .filter_map(|c| c.parse::<Cidr>().ok())
                .any(|c| c.contains(ip))
            {
                out.push(Finding::FreeInPool {
                    pool: p.name,
                    kind: "pod".into(),
                });
            }
        }
        for p in store.list_typed::<LbIpPool>().await? {
            let inside = p.value.spec.contains(ip);
            if inside {
                out.push(Finding::FreeInPool {
                    pool: p.name,
                    kind: "load-balancer".into(),
                });
            }
        }
    }
    Ok(out)
}
