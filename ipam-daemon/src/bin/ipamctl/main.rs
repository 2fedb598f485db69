//! `ipamctl`: the operator's CLI.
use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};
use ipam_api::types::Mac;
use ipam_common::{l2::ResponderStat, pod::PodStat};
use ipam_daemon::{
    clock,
    config::DEFAULT_BPFFS_ROOT,
    daemon::endpoints::read_table,
    datapath::{Datapath, PodMaps, ResponderMaps, pinned_attachments},
    net::iface,
};

/// Inspect and manage the IPAM daemon of this node. The datapath commands read the daemon's
/// pinned eBPF maps directly, so they work while the daemon is running, restarting or stopped;
/// `ipam status` reads the status the daemon publishes after every IPAM pass.
#[derive(Debug, Parser)]
#[command(name = "ipamctl", version)]
struct Args {
    /// The daemon's bpffs root (datapath.bpffs_root in its configuration).
    #[arg(long, global = true, env = "IPAM_BPFFS_ROOT", default_value = DEFAULT_BPFFS_ROOT)]
    bpffs_root: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List announced IPs with their interface, MAC and number of ARP/NDP replies sent.
    Announcements,
    /// Show whether the responders are answering (daemon liveness), where they are attached,
    /// and their counters.
    Status,
    /// The pod datapath: every pod address in the endpoint map (host veth, pod MAC, and the pod
    /// or container it belongs to) and the counters (delivered, to the stack, spoofed packets
    /// dropped, ...).
    Endpoints {
        /// The daemon's ipam.state_dir (its endpoint table names the pod of each address).
        #[arg(long, default_value = "/var/lib/ipam/node")]
        state_dir: PathBuf,
    },
    /// Manage the pinned datapath.
    Datapath {
        #[command(subcommand)]
        command: DatapathCommand,
    },
    /// IP address management on this node.
    Ipam {
        #[command(subcommand)]
        command: IpamCommand,
    },
    /// Create or update objects (LoadBalancerIPPool, Service, L2AnnouncementPolicy, PodIPPool)
    /// from YAML documents, in the store of the daemon's configuration.
    Apply {
        /// The file with one or more YAML documents (`-` for standard input).
        #[arg(short, long)]
        file: PathBuf,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List objects of a kind: services (with their IPs and the node announcing each),
    /// lbpools, l2policies, podpools.
    Get {
        #[arg(value_enum)]
        kind: ObjectKind,
        /// Output: a table, or every field as json or yaml.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Who has this IP: a pod on this node, a node's address, a Service and the node announcing
    /// it, the node whose block holds it, or the pool it is free in. Says what it read.
    WhoHas {
        ip: std::net::IpAddr,
        /// The daemon's ipam.state_dir (taken from --config when that is given).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Pod IP pools with a usage bar, the blocks each node holds, what is refused or waited
    /// for; and the load-balancer pools' counts.
    Pools {
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(hide = true)]
    Completions { shell: clap_complete::Shell },
    /// Print the man page (roff).
    #[command(hide = true)]
    Man,
    /// Delete an object (services are named namespace/name).
    Delete {
        #[arg(value_enum)]
        kind: ObjectKind,
        name: String,
        #[command(flatten)]
        store: StoreArgs,
    },
}

#[derive(Debug, clap::Args)]
struct StoreArgs {
    /// The daemon's configuration file: its [store] says where the objects live.
    #[arg(
        short,
        long,
        env = "IPAMD_CONFIG",
        default_value = "/etc/ipam/ipamd.toml"
    )]
    config: PathBuf,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ObjectKind {
    Services,
    Lbpools,
    L2policies,
    Podpools,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(Debug, Subcommand)]
enum IpamCommand {
    /// Pools with capacity and usage, this node's blocks, router and health addresses, and what
    /// the node waits for (as the daemon last published it). With `--config` naming a cluster
    /// store (etcd), also every node's blocks and addresses and the leading operator, read
    /// from the store.
    Status {
        /// The daemon's ipam.state_dir (taken from `--config` when that is given).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// The daemon's configuration file: where its state and the cluster's store are.
        #[arg(short, long, env = "IPAMD_CONFIG")]
        config: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum DatapathCommand {
    /// Remove every pin: detaches the responders and drops all announcements. Stop the daemon
    /// first; a running daemon keeps its already loaded maps and programs until it restarts.
    Remove,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.command {
        Command::Announcements => announcements(&args.bpffs_root),
        Command::Status => status(&args.bpffs_root),
        Command::Endpoints { state_dir } => endpoints(&args.bpffs_root, &state_dir),
        Command::Ipam {
            command: IpamCommand::Status { state_dir, config },
        } => {
            let config = config
                .map(|path| ipam_daemon::config::Config::load(&path).map_err(anyhow::Error::from))
                .transpose()?;
            let state_dir = state_dir
                .or_else(|| {
                    config
                        .as_ref()
                        .and_then(|c| c.ipam.as_ref())
                        .map(|i| i.state_dir.clone())
                })
                .unwrap_or_else(|| PathBuf::from("/var/lib/ipam/node"));
            let local = ipam_status(&state_dir);
            match config {
                Some(c) if c.store.kind == ipam_daemon::config::StoreKind::Etcd => {
                    if let Err(e) = &local {
                        // An operator host has no node status; the cluster view still helps.
                        println!("(no node status here: {e})");
                    }
                    cluster_status(&c)
                }
                _ => local,
            }
        }
        Command::Apply { file, store } => objects_command(&store, async |s| apply(&s, &file).await),
        Command::Get {
            kind,
            output,
            store,
        } => objects_command(&store, async |s| get(&s, kind, output).await),
        Command::WhoHas {
            ip,
            state_dir,
            output,
            store,
        } => who_has(ip, state_dir, output, &store),
        Command::Pools { output, store } => {
            objects_command(&store, async |s| pools(&s, output).await)
        }
        Command::Completions { shell } => {
            use clap::CommandFactory as _;
            clap_complete::generate(
                shell,
                &mut Args::command(),
                "ipamctl",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Man => {
            use clap::CommandFactory as _;
            clap_mangen::Man::new(Args::command()).render(&mut std::io::stdout())?;
            Ok(())
        }
        Command::Delete { kind, name, store } => {
            objects_command(&store, async |s| delete(&s, kind, &name).await)
        }
        Command::Datapath {
            command: DatapathCommand::Remove,
        } => {
            Datapath::remove_pins(&args.bpffs_root)?;
            println!("removed every pin under {}", args.bpffs_root.display());
            Ok(())
        }
    }
}

fn announcements(root: &std::path::Path) -> anyhow::Result<()> {
    let maps = ResponderMaps::from_pins(root)?;
    let entries = maps.list()?;
    let mut rows = table(["IP", "INTERFACE", "MAC", "REPLIES"]);
    for e in &entries {
        rows.add_row([
            e.ip.to_string(),
            iface::name(e.ifindex),
            Mac(e.mac).to_string(),
            e.replies.to_string(),
        ]);
    }
    println!("{rows}");
    if entries.is_empty() {
        println!("(no IP is announced)");
    }
    Ok(())
}

fn endpoints(root: &std::path::Path, state_dir: &std::path::Path) -> anyhow::Result<()> {
    let maps = PodMaps::from_pins(root)?;
    let entries = maps.list()?;
    let persisted = read_table(state_dir).unwrap_or_else(|e| {
        eprintln!(
            "(cannot read the endpoint table under {}: {e}; owners not shown)",
            state_dir.display()
        );
        Vec::new()
    });
    let owner = |ip: &std::net::IpAddr| {
        persisted.iter().find(|e| e.ips.contains(ip)).map_or_else(
            || "?".to_owned(),
            |e| e.pod.clone().unwrap_or_else(|| e.id.owner()),
        )
    };
    let mut rows = table([
        "POD IP",
        "HOST VETH",
        "IFINDEX",
        "POD MAC",
        "GATEWAY MAC",
        "OWNER",
    ]);
    for (ip, e) in &entries {
        rows.add_row([
            ip.to_string(),
            iface::name(e.host_ifindex),
            e.host_ifindex.to_string(),
            Mac(e.pod_mac).to_string(),
            Mac(e.host_mac).to_string(),
            owner(ip),
        ]);
    }
    println!("{rows}");
    if entries.is_empty() {
        println!("(no pod endpoint)");
    }
    let stats = maps.stats()?;
    println!("counters:");
    for stat in PodStat::ALL {
        println!("  {:<20} {}", stat.name(), stats.get(stat));
    }
    Ok(())
}

fn status(root: &std::path::Path) -> anyhow::Result<()> {
    let maps = ResponderMaps::from_pins(root)?;
    let config = maps.config()?;
    let timeout = Duration::from_nanos(config.max_staleness_ns);
    if config.heartbeat_ns == 0 {
        println!("responders: SILENT (the daemon has never written a heartbeat)");
    } else {
        let age = Duration::from_nanos(clock::monotonic_ns().saturating_sub(config.heartbeat_ns));
        let state = if age <= timeout {
            "ANSWERING"
        } else {
            "SILENT (daemon not alive: start or fix ipamd)"
        };
        println!(
            "responders: {state}; last heartbeat {} ms ago, liveness timeout {} ms",
            age.as_millis(),
            timeout.as_millis()
        );
    }
    println!("attachments:");
    let attachments = pinned_attachments(root)?;
    for a in &attachments {
        let now = iface::index(&a.interface).ok();
        let note = if now == Some(a.ifindex) {
            ""
        } else {
            " (interface gone)"
        };
        println!(
            "  {} (ifindex {}): {}{note}",
            a.interface,
            a.ifindex,
            a.form.name()
        );
        if let Some(caveat) = a.caveat() {
            println!("    WARNING: {caveat}");
        }
    }
    if attachments.is_empty() {
        println!("  (none)");
    }
    let stats = maps.stats()?;
    println!("counters:");
    for stat in ResponderStat::ALL {
        println!("  {:<14} {}", stat.name(), stats.get(stat));
    }
    println!("announcements: {}", maps.list()?.len());
    Ok(())
}

fn ipam_status(state_dir: &std::path::Path) -> anyhow::Result<()> {
    let status = ipam_daemon::daemon::status::read_status(state_dir).map_err(|e| {
        anyhow::anyhow!(
            "cannot read the IPAM status under {}: {e}; is ipamd running with ipam.state_dir = {}?",
            state_dir.display(),
            state_dir.display()
        )
    })?;
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
    let blocks: Vec<String> = status.node_blocks.iter().map(ToString::to_string).collect();
    println!(
        "node blocks: {}",
        if blocks.is_empty() {
            "(none)".to_owned()
        } else {
            blocks.join(", ")
        }
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
            let cidrs: Vec<String> = u.cidrs.iter().map(ToString::to_string).collect();
            rows.add_row([
                pool.name.clone(),
                u.family.name().to_owned(),
                cidrs.join(","),
                format!("/{}", u.mask_size),
                format!("{}/{}", u.used_blocks, u.total_blocks),
                ready.to_owned(),
                message.to_owned(),
            ]);
        }
    }
    println!("{rows}");
    Ok(())
}

/// Every node's blocks, addresses and conditions, the pools' usage and the leading operator,
/// read from the cluster's store.
fn cluster_status(config: &ipam_daemon::config::Config) -> anyhow::Result<()> {
    use ipam_core::{
        resources::{NodeIpam, OPERATOR_LEASE},
        store::{TypedStore as _, lease::Lease},
    };
    use ipam_daemon::cluster::ClusterStore;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = ClusterStore::open(&config.store_settings()).await?;
        let nodes = store.list_typed::<NodeIpam>().await?;
        let leader = store
            .get_typed::<Lease>(OPERATOR_LEASE)
            .await?
            .map(|l| l.value.holder)
            .filter(|h| !h.is_empty());
        println!("\ncluster, read from {}:", store.describe());
        println!(
            "leading operator: {}",
            leader
                .as_deref()
                .unwrap_or("(none: no operator holds the lease)")
        );
        let mut rows = table(["NODE", "BLOCKS", "ADDRESSES", "READY", "MESSAGE"]);
        for n in &nodes {
            let blocks: Vec<String> = n
                .value
                .status
                .allocated
                .iter()
                .map(|b| b.cidr.to_string())
                .collect();
            let addresses: Vec<String> = n
                .value
                .spec
                .addresses
                .iter()
                .map(ToString::to_string)
                .collect();
            let ready = n.value.status.conditions.iter().all(|c| c.status);
            let message = n
                .value
                .status
                .conditions
                .first()
                .map_or("", |c| c.message.as_str());
            rows.add_row([
                n.name.clone(),
                if blocks.is_empty() {
                    "-".into()
                } else {
                    blocks.join(",")
                },
                if addresses.is_empty() {
                    "-".into()
                } else {
                    addresses.join(",")
                },
                if ready { "yes".into() } else { "NO".into() },
                message.to_owned(),
            ]);
        }
        println!("{rows}");
        println!("nodes: {}", nodes.len());
        Ok(())
    })
}

/// `who-has`: the local node's view, then the cluster store's when the configuration names one.
fn who_has(
    ip: std::net::IpAddr,
    state_dir: Option<PathBuf>,
    output: Output,
    store: &StoreArgs,
) -> anyhow::Result<()> {
    use ipam_daemon::cluster::who_has;
    let config = ipam_daemon::config::Config::load(&store.config).ok();
    let state_dir = state_dir
        .or_else(|| {
            config
                .as_ref()
                .and_then(|c| c.ipam.as_ref())
                .map(|i| i.state_dir.clone())
        })
        .unwrap_or_else(|| PathBuf::from("/var/lib/ipam/node"));
    let mut sources = vec![format!("this node's state under {}", state_dir.display())];
    let mut findings = who_has::local(ip, &state_dir);
    if let Some(c) = config.filter(|c| c.store.kind == ipam_daemon::config::StoreKind::Etcd) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let s = ipam_daemon::cluster::ClusterStore::open(&c.store_settings()).await?;
            sources.push(s.describe());
            for f in who_has::cluster(&s, ip).await? {
                if !findings.contains(&f) {
                    findings.push(f);
                }
            }
            Ok::<_, anyhow::Error>(())
        })?;
    }
    #[derive(serde::Serialize)]
    struct Answer<'a> {
        ip: std::net::IpAddr,
        read: &'a [String],
        findings: &'a [who_has::Finding],
    }
    let answer = Answer {
        ip,
        read: &sources,
        findings: &findings,
    };
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&answer)?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(&answer)?),
        Output::Table => {
            if findings.is_empty() {
                println!("{ip}: nobody has it, and no pool holds it");
            }
            for f in &findings {
                println!("{ip}: {f}");
            }
            println!("(read: {})", sources.join("; "));
        }
    }
    Ok(())
}

/// `pools`: usage, blocks per node, what is refused or waited for.
async fn pools(store: &ipam_daemon::cluster::ClusterStore, output: Output) -> anyhow::Result<()> {
    use ipam_core::{
        lb::resources::LbIpPool,
        resources::{NodeIpam, PodIpPool},
        store::TypedStore as _,
    };
    let pod_pools = store.list_typed::<PodIpPool>().await?;
    let nodes = store.list_typed::<NodeIpam>().await?;
    let lb_pools = store.list_typed::<LbIpPool>().await?;
    #[derive(serde::Serialize)]
    struct PoolView {
        name: String,
        kind: &'static str,
        usage: Vec<(String, u128, u128)>,
        blocks_by_node: std::collections::BTreeMap<String, Vec<String>>,
        problems: Vec<String>,
    }
    let mut views = Vec::new();
    for p in &pod_pools {
        let mut blocks_by_node: std::collections::BTreeMap<String, Vec<String>> =
            Default::default();
        for n in &nodes {
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
        for n in &nodes {
            for c in n.value.status.conditions.iter().filter(|c| !c.status) {
                if c.message.contains(&p.name) {
                    problems.push(format!("node {}: {}", n.name, c.message));
                }
            }
        }
        views.push(PoolView {
            name: p.name.clone(),
            kind: "pod",
            usage: p
                .value
                .status
                .usage
                .iter()
                .map(|u| (u.family.name().to_owned(), u.used_blocks, u.total_blocks))
                .collect(),
            blocks_by_node,
            problems,
        });
    }
    for p in &lb_pools {
        views.push(PoolView {
            name: p.name.clone(),
            kind: "load-balancer",
            usage: p
                .value
                .status
                .counts
                .iter()
                .map(|c| (c.family.name().to_owned(), c.used, c.total))
                .collect(),
            blocks_by_node: Default::default(),
            problems: p
                .value
                .status
                .conditions
                .iter()
                .filter(|c| !c.status && c.kind != "Conflict" || c.kind == "Conflict" && c.status)
                .map(|c| c.message.clone())
                .collect(),
        });
    }
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&views)?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(&views)?),
        Output::Table => {
            for v in &views {
                println!("{} pool {}", v.kind, v.name);
                for (family, used, total) in &v.usage {
                    let unit = if v.kind == "pod" { "blocks" } else { "IPs" };
                    println!(
                        "  {family:<5} {} {used}/{total} {unit}",
                        usage_bar(*used, *total)
                    );
                }
                for (node, blocks) in &v.blocks_by_node {
                    println!("  {node}: {}", blocks.join(", "));
                }
                for p in &v.problems {
                    println!("  ! {p}");
                }
            }
            println!("(read from {})", store.describe());
        }
    }
    Ok(())
}

/// `[#####.....]`: how full, in 20 steps.
fn usage_bar(used: u128, total: u128) -> String {
    let filled = if total == 0 {
        0
    } else {
        ((used * 20).div_ceil(total)).min(20) as usize
    };
    format!("[{}{}]", "#".repeat(filled), ".".repeat(20 - filled))
}

/// Opens the store of the daemon's configuration and runs `f` on it.
fn objects_command(
    args: &StoreArgs,
    f: impl AsyncFnOnce(ipam_daemon::cluster::ClusterStore) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let config = ipam_daemon::config::Config::load(&args.config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = ipam_daemon::cluster::ClusterStore::open(&config.store_settings())
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

async fn apply(
    store: &ipam_daemon::cluster::ClusterStore,
    file: &std::path::Path,
) -> anyhow::Result<()> {
    use std::io::Read as _;
    let (name, text) = if file == std::path::Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        ("standard input".to_owned(), text)
    } else {
        let text = std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
        (file.display().to_string(), text)
    };
    // Every document is checked before anything is written.
    let objects = ipam_daemon::cluster::objects::parse(&name, &text)?;
    for object in &objects {
        let created = ipam_daemon::cluster::objects::apply(store, object).await?;
        println!(
            "{} {}",
            object.describe(),
            if created { "created" } else { "configured" }
        );
    }
    Ok(())
}

async fn delete(
    store: &ipam_daemon::cluster::ClusterStore,
    kind: ObjectKind,
    name: &str,
) -> anyhow::Result<()> {
    use ipam_core::{
        lb::resources::{L2AnnouncementPolicy, LbIpPool, Service},
        resources::PodIpPool,
        store::{Resource, Store as _},
    };
    let kind = match kind {
        ObjectKind::Services => Service::KIND,
        ObjectKind::Lbpools => LbIpPool::KIND,
        ObjectKind::L2policies => L2AnnouncementPolicy::KIND,
        ObjectKind::Podpools => PodIpPool::KIND,
    };
    if store.get(kind, name).await?.is_none() {
        anyhow::bail!("{kind} {name} does not exist; `ipamctl get` lists them");
    }
    store.delete(kind, name, None).await?;
    println!("{kind} {name} deleted");
    Ok(())
}

/// Every object of `T`'s kind, as (name, value).
async fn named<T: ipam_core::store::Resource>(
    store: &ipam_daemon::cluster::ClusterStore,
) -> anyhow::Result<Vec<(String, T)>> {
    use ipam_core::store::TypedStore as _;
    Ok(store
        .list_typed::<T>()
        .await?
        .into_iter()
        .map(|v| (v.name, v.value))
        .collect())
}

async fn get(
    store: &ipam_daemon::cluster::ClusterStore,
    kind: ObjectKind,
    output: Output,
) -> anyhow::Result<()> {
    use ipam_core::{
        lb::resources::{L2AnnouncementPolicy, LbIpPool, Service},
        resources::PodIpPool,
    };
    fn show<T: serde::Serialize>(output: Output, items: &[(String, T)]) -> anyhow::Result<bool> {
        let map: std::collections::BTreeMap<&str, &T> =
            items.iter().map(|(n, v)| (n.as_str(), v)).collect();
        match output {
            Output::Table => return Ok(false),
            Output::Json => println!("{}", serde_json::to_string_pretty(&map)?),
            Output::Yaml => print!("{}", serde_yaml_ng::to_string(&map)?),
        }
        Ok(true)
    }
    let condition = |c: &[ipam_core::resources::Condition]| {
        c.iter()
            .find(|c| !c.status)
            .or(c.first())
            .map_or(String::new(), |c| {
                format!("{}={}: {}", c.kind, c.status, c.message)
            })
    };
    match kind {
        ObjectKind::Services => {
            let items = named::<Service>(store).await?;
            if show(output, &items)? {
                return Ok(());
            }
            let announcing = ipam_daemon::cluster::objects::announcing_nodes(store).await?;
            let mut rows = table(["SERVICE", "IPS", "ANNOUNCED BY", "CONDITION"]);
            for (name, s) in &items {
                let ips: Vec<String> = s.status.ingress.iter().map(ToString::to_string).collect();
                let by: Vec<String> = s
                    .status
                    .ingress
                    .iter()
                    .map(|ip| announcing.get(ip).cloned().unwrap_or_else(|| "-".into()))
                    .collect();
                rows.add_row([
                    name.clone(),
                    if ips.is_empty() {
                        "<pending>".into()
                    } else {
                        ips.join(",")
                    },
                    by.join(","),
                    condition(&s.status.conditions),
                ]);
            }
            println!("{rows}");
            println!(
                "(read from {}; the announcing node is derived from the node leases' renew times)",
                store.describe()
            );
        }
        ObjectKind::Lbpools => {
            let items = named::<LbIpPool>(store).await?;
            if show(output, &items)? {
                return Ok(());
            }
            let mut rows = table(["POOL", "DISABLED", "USED/TOTAL", "CONDITION"]);
            for (name, p) in &items {
                let counts: Vec<String> = p
                    .status
                    .counts
                    .iter()
                    .map(|c| format!("{} {}/{}", c.family.name(), c.used, c.total))
                    .collect();
                rows.add_row([
                    name.clone(),
                    p.spec.disabled.to_string(),
                    counts.join(", "),
                    condition(&p.status.conditions),
                ]);
            }
            println!("{rows}");
        }
        ObjectKind::L2policies => {
            let items = named::<L2AnnouncementPolicy>(store).await?;
            if show(output, &items)? {
                return Ok(());
            }
            let mut rows = table(["POLICY", "INTERFACES", "LB IPS", "EXTERNAL IPS"]);
            for (name, p) in &items {
                rows.add_row([
                    name.clone(),
                    p.spec.interfaces.join(","),
                    p.spec.load_balancer_ips.to_string(),
                    p.spec.external_ips.to_string(),
                ]);
            }
            println!("{rows}");
        }
        ObjectKind::Podpools => {
            let items = named::<PodIpPool>(store).await?;
            if show(output, &items)? {
                return Ok(());
            }
            let mut rows = table(["POOL", "CONDITION"]);
            for (name, p) in &items {
                rows.add_row([name.clone(), condition(&p.status.conditions)]);
            }
            println!("{rows}");
        }
    }
    Ok(())
}

/// A plain table: a header row, columns sized to their content, no borders (easy to read, grep
/// and paste into an issue).
fn table<const N: usize>(header: [&str; N]) -> comfy_table::Table {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
        .set_header(header);
    t
}
