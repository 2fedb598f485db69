//! `ipamctl ipam status`: the node's state as the daemon last published it and, with a cluster
//! store in the configuration, every node's blocks and the leading operator from the store.

use std::{net::IpAddr, path::Path};

use ipam_config::Config;
use ipam_core::pod::published::{PublishedStatus, read_status};
use ipam_core::{
    Cidr,
    resources::{NodeIpam, OPERATOR_LEASE},
    store::{TypedStore as _, lease::Lease},
};
use ipam_store::AnyStore;
use serde::Serialize;

use crate::output::{Output, emit, joined, table};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    /// What the daemon of this node last published (absent on a host without a node agent).
    node: Option<PublishedStatus>,
    /// Why the node's status could not be read.
    node_error: Option<String>,
    cluster: Option<ClusterView>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterView {
    /// The store read, e.g. `etcd (http://10.0.0.1:2379) under /ipam`.
    read: String,
    leading_operator: Option<String>,
    nodes: Vec<NodeView>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NodeView {
    name: String,
    blocks: Vec<Cidr>,
    addresses: Vec<IpAddr>,
    ready: bool,
    message: String,
}

pub(crate) fn run(state_dir: &Path, config: Option<&Config>, output: Output) -> anyhow::Result<()> {
    let local = read_status(state_dir).map_err(|e| {
        format!(
            "cannot read the IPAM status under {}: {e}; is ipamd running with ipam.state_dir = {}?",
            state_dir.display(),
            state_dir.display()
        )
    });
    let cluster = match config {
        Some(c) if c.store.kind.is_shared() => Some(cluster_view(c)?),
        _ => None,
    };
    // Without a cluster view, a missing node status is the whole answer: fail with it.
    let (node, node_error) = match local {
        Ok(status) => (Some(status), None),
        Err(e) if cluster.is_none() => anyhow::bail!(e),
        Err(e) => (None, Some(e)),
    };
    let answer = Answer {
        node,
        node_error,
        cluster,
    };
    emit(output, &answer, |a| {
        if let Some(status) = &a.node {
            print_node(status);
        }
        if let Some(e) = &a.node_error {
            // An operator host has no node status; the cluster view still helps.
            println!("(no node status here: {e})");
        }
        if let Some(c) = &a.cluster {
            print_cluster(c);
        }
    })
}

fn print_node(status: &PublishedStatus) {
    let mode = status.mode.map_or("?", |m| m.name());
    println!(
        "node {}, mode {mode}, {} allocations",
        status.node, status.allocations
    );
    for (purpose, by_family) in &status.infra {
        for (family, ip) in by_family {
            println!("{purpose} {}: {ip}", family.name());
        }
    }
    if let Some(waiting) = &status.waiting {
        println!("WAITING: {waiting}");
    }
    let blocks = joined(&status.node_blocks);
    println!(
        "node blocks: {}",
        if blocks == "-" { "(none)" } else { &blocks }
    );
    for c in status.node_conditions.iter().filter(|c| !c.status) {
        println!("node not ready: {}", c.message);
    }
    let mut rows = table([
        "POOL",
        "FAMILY",
        "CIDRS",
        "MASK",
        "BLOCKS USED",
        "READY",
        "MESSAGE",
    ]);
    for pool in &status.pools {
        let ready = if pool.conditions.iter().all(|c| c.status) {
            "yes"
        } else {
            "NO"
        };
        let message = pool.conditions.first().map_or("", |c| c.message.as_str());
        if pool.usage.is_empty() {
            rows.add_row([&*pool.name, "-", "-", "-", "-", ready, message]);
        }
        for u in &pool.usage {
            rows.add_row([
                pool.name.clone(),
                u.family.name().to_owned(),
                joined(&u.cidrs),
                format!("/{}", u.mask_size),
                format!("{}/{}", u.used_blocks, u.total_blocks),
                ready.to_owned(),
                message.to_owned(),
            ]);
        }
    }
    println!("{rows}");
}

fn print_cluster(c: &ClusterView) {
    println!("\ncluster, read from {}:", c.read);
    println!(
        "leading operator: {}",
        c.leading_operator
            .as_deref()
            .unwrap_or("(none: no operator holds the lease)")
    );
    let mut rows = table(["NODE", "BLOCKS", "ADDRESSES", "READY", "MESSAGE"]);
    for n in &c.nodes {
        rows.add_row([
            n.name.clone(),
            joined(&n.blocks),
            joined(&n.addresses),
            if n.ready { "yes".into() } else { "NO".into() },
            n.message.clone(),
        ]);
    }
    println!("{rows}");
    println!("nodes: {}", c.nodes.len());
}

/// Every node's blocks, addresses and conditions and the leading operator, from the store.
fn cluster_view(config: &Config) -> anyhow::Result<ClusterView> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = AnyStore::open(&config.store_settings()).await?;
        let nodes = store.list_typed::<NodeIpam>().await?;
        let leading_operator = store
            .get_typed::<Lease>(OPERATOR_LEASE)
            .await?
            .map(|l| l.value.holder)
            .filter(|h| !h.is_empty());
        Ok(ClusterView {
            read: store.describe(),
            leading_operator,
            nodes: nodes
                .into_iter()
                .map(|n| {
                    let status = n.value.status;
                    NodeView {
                        blocks: status.allocated.iter().map(|b| b.cidr).collect(),
                        addresses: n.value.spec.addresses,
                        ready: status.conditions.iter().all(|c| c.status),
                        message: status
                            .conditions
                            .first()
                            .map(|c| c.message.clone())
                            .unwrap_or_default(),
                        name: n.name,
                    }
                })
                .collect(),
        })
    })
}
