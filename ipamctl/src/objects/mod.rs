//! The commands on the cluster's objects (`apply`, `get`, `delete`, `pools`), in the store of
//! the daemon's configuration.

pub(crate) mod parse;
mod tables;

use std::{collections::BTreeMap, path::Path};

use ipam_config::Config;
use ipam_core::{
    lb::annotations::AnnotationSources,
    lb::{
        bgp::{BgpAdvertisement, BgpPeer},
        resources::{L2AnnouncementPolicy, LbIpPool, Service, ServiceEndpoints},
    },
    resources::{NodeIpam, PodIpPool},
    store::{Resource, Store as _, TypedStore as _, Versioned},
};
use ipam_store::AnyStore;
use serde::Serialize;

use crate::output::{Output, emit, usage_bar};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum ObjectKind {
    Services,
    /// Where each Service's endpoints run (`ServiceEndpoints`).
    ServiceEndpoints,
    Lbpools,
    L2policies,
    Bgppeers,
    Bgpadvertisements,
    Podpools,
}

impl ObjectKind {
    fn store_kind(self) -> &'static str {
        match self {
            Self::Services => Service::KIND,
            Self::ServiceEndpoints => ServiceEndpoints::KIND,
            Self::Lbpools => LbIpPool::KIND,
            Self::L2policies => L2AnnouncementPolicy::KIND,
            Self::Bgppeers => BgpPeer::KIND,
            Self::Bgpadvertisements => BgpAdvertisement::KIND,
            Self::Podpools => PodIpPool::KIND,
        }
    }
}

/// Opens the store of the daemon's configuration and runs `f` on it.
pub(crate) fn with_store(
    config: &Path,
    f: impl AsyncFnOnce(AnyStore) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let config = Config::load(config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = AnyStore::open(&config.store_settings())
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "{e}; with the embedded store, ipamctl can reach the objects only while \
                     ipamd is stopped (it holds the database file)"
                )
            })?;
        f(store).await
    })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Applied {
    kind: &'static str,
    name: String,
    /// `created` or `configured`.
    result: &'static str,
}

/// The text of `file` (`-`: standard input) and the name to give it in messages.
pub(crate) fn read_input(file: &Path) -> anyhow::Result<(String, String)> {
    use std::io::Read as _;
    if file == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        Ok(("standard input".to_owned(), text))
    } else {
        let text = std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
        Ok((file.display().to_string(), text))
    }
}

pub(crate) async fn apply(
    store: &AnyStore,
    file: &Path,
    sources: &AnnotationSources,
    output: Output,
) -> anyhow::Result<()> {
    let (name, text) = read_input(file)?;
    // Every document is checked before anything is written.
    let parsed = parse::parse(&name, &text, sources)?;
    for note in &parsed.notes {
        eprintln!("note: {note}");
    }
    let mut applied = Vec::with_capacity(parsed.objects.len());
    for object in &parsed.objects {
        let created = parse::apply(store, object).await?;
        applied.push(Applied {
            kind: object.kind(),
            name: object.name().to_owned(),
            result: if created { "created" } else { "configured" },
        });
    }
    emit(output, &applied, |applied| {
        for a in applied {
            println!("{} {} {}", a.kind, a.name, a.result);
        }
    })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Deleted<'a> {
    kind: &'static str,
    name: &'a str,
}

pub(crate) async fn delete(
    store: &AnyStore,
    kind: ObjectKind,
    name: &str,
    output: Output,
) -> anyhow::Result<()> {
    let kind = kind.store_kind();
    if store.get(kind, name).await?.is_none() {
        anyhow::bail!("{kind} {name} does not exist; `ipamctl get` lists them");
    }
    store.delete(kind, name, None).await?;
    emit(output, &Deleted { kind, name }, |d| {
        println!("{} {} deleted", d.kind, d.name);
    })
}

/// Every object of `T`'s kind, by name.
pub(crate) async fn named<T: Resource>(store: &AnyStore) -> anyhow::Result<BTreeMap<String, T>> {
    Ok(store
        .list_typed::<T>()
        .await?
        .into_iter()
        .map(|v| (v.name, v.value))
        .collect())
}

/// The condition to show in a table: the first failing one, else the first.
/// `get`: JSON and YAML give every object whole, by name, as stored.
pub(crate) async fn get(store: &AnyStore, kind: ObjectKind, output: Output) -> anyhow::Result<()> {
    match kind {
        ObjectKind::Services => {
            let items = named::<Service>(store).await?;
            let announcing = parse::announcing_nodes(store).await?;
            emit(output, &items, |items| {
                tables::services(items, &announcing);
                println!(
                    "(read from {}; the announcing node is derived from the node leases' renew times)",
                    store.describe()
                );
            })
        }
        ObjectKind::ServiceEndpoints => emit(
            output,
            &named::<ServiceEndpoints>(store).await?,
            tables::service_endpoints,
        ),
        ObjectKind::Lbpools => emit(output, &named::<LbIpPool>(store).await?, tables::lb_pools),
        ObjectKind::L2policies => emit(
            output,
            &named::<L2AnnouncementPolicy>(store).await?,
            tables::l2_policies,
        ),
        ObjectKind::Bgppeers => emit(output, &named::<BgpPeer>(store).await?, tables::bgp_peers),
        ObjectKind::Bgpadvertisements => emit(
            output,
            &named::<BgpAdvertisement>(store).await?,
            tables::bgp_advertisements,
        ),
        ObjectKind::Podpools => emit(output, &named::<PodIpPool>(store).await?, tables::pod_pools),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PoolView {
    name: String,
    /// `pod` or `load-balancer`.
    kind: &'static str,
    usage: Vec<FamilyCount>,
    blocks_by_node: BTreeMap<String, Vec<String>>,
    /// What is refused or waited for, in words.
    problems: Vec<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FamilyCount {
    family: &'static str,
    used: u128,
    total: u128,
    /// `blocks` for a pod pool, `IPs` for a load-balancer pool.
    unit: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Pools {
    read: String,
    pools: Vec<PoolView>,
}

/// `pools`: usage, blocks per node, what is refused or waited for.
/// A pod pool: its blocks' usage, which node holds which block, and what is refused.
fn pod_pool_view(p: &Versioned<PodIpPool>, nodes: &[Versioned<NodeIpam>]) -> PoolView {
    let mut blocks_by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in nodes {
        for b in n.value.status.allocated.iter().filter(|b| b.pool == p.name) {
            blocks_by_node
                .entry(n.name.clone())
                .or_default()
                .push(b.cidr.to_string());
        }
    }
    let mut problems: Vec<String> = p
        .value
        .status
        .conditions
        .iter()
        .filter(|c| !c.status)
        .map(|c| c.message.clone())
        .collect();
    for n in nodes {
        for c in n.value.status.conditions.iter().filter(|c| !c.status) {
            if c.message.contains(&p.name) {
                problems.push(format!("node {}: {}", n.name, c.message));
            }
        }
    }
    PoolView {
        name: p.name.clone(),
        kind: "pod",
        usage: p
            .value
            .status
            .usage
            .iter()
            .map(|u| FamilyCount {
                family: u.family.name(),
                used: u.used_blocks,
                total: u.total_blocks,
                unit: "blocks",
            })
            .collect(),
        blocks_by_node,
        problems,
    }
}

/// A LoadBalancer pool: its IPs' usage and what is refused.
fn lb_pool_view(p: &Versioned<LbIpPool>) -> PoolView {
    PoolView {
        name: p.name.clone(),
        kind: "load-balancer",
        usage: p
            .value
            .status
            .counts
            .iter()
            .map(|c| FamilyCount {
                family: c.family.name(),
                used: c.used,
                total: c.total,
                unit: "IPs",
            })
            .collect(),
        blocks_by_node: BTreeMap::new(),
        // A Conflict condition is a problem when true; any other when false.
        problems: p
            .value
            .status
            .conditions
            .iter()
            .filter(|c| (c.kind == "Conflict") == c.status)
            .map(|c| c.message.clone())
            .collect(),
    }
}

pub(crate) async fn pools(store: &AnyStore, output: Output) -> anyhow::Result<()> {
    let pod_pools = store.list_typed::<PodIpPool>().await?;
    let nodes = store.list_typed::<NodeIpam>().await?;
    let lb_pools = store.list_typed::<LbIpPool>().await?;
    let mut views: Vec<PoolView> = pod_pools.iter().map(|p| pod_pool_view(p, &nodes)).collect();
    views.extend(lb_pools.iter().map(lb_pool_view));
    let answer = Pools {
        read: store.describe(),
        pools: views,
    };
    emit(output, &answer, |answer| {
        for v in &answer.pools {
            println!("{} pool {}", v.kind, v.name);
            for u in &v.usage {
                println!(
                    "  {:<5} {} {}/{} {}",
                    u.family,
                    usage_bar(u.used, u.total),
                    u.used,
                    u.total,
                    u.unit
                );
            }
            for (node, blocks) in &v.blocks_by_node {
                println!("  {node}: {}", blocks.join(", "));
            }
            for p in &v.problems {
                println!("  ! {p}");
            }
        }
        println!("(read from {})", answer.read);
    })
}
