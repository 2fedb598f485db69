//! `ipamctl`: the operator's CLI.

mod bgp;
mod datapath;
mod ipam_status;
mod members;
mod migrate;
mod objects;
mod output;
mod who_has;

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use ipam_config::{Config, DEFAULT_BPFFS_ROOT};
use ipam_datapath::Datapath;

use crate::{
    objects::{ObjectKind, with_store},
    output::{Output, emit},
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
    /// Output: a human table, or the same answer as json or yaml (stable field names).
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
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
        #[arg(long, default_value = DEFAULT_STATE_DIR)]
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
    /// Create or update objects (LoadBalancerIPPool, Service, ServiceEndpoints,
    /// L2AnnouncementPolicy, BGPPeer, BGPAdvertisement, PodIPPool, Namespace) from YAML
    /// documents, in the store of the daemon's configuration.
    Apply {
        /// The file with one or more YAML documents (`-` for standard input).
        #[arg(short, long)]
        file: PathBuf,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List objects of a kind: services (with their IPs and the node announcing each),
    /// service-endpoints (the nodes each Service's endpoints run on), lbpools, l2policies,
    /// bgppeers, bgpadvertisements, podpools.
    Get {
        #[arg(value_enum)]
        kind: ObjectKind,
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
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Pod IP pools with a usage bar, the blocks each node holds, what is refused or waited
    /// for; and the load-balancer pools' counts.
    Pools {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// The gossip as this node's agent sees it: every member with its node, state and when it
    /// was last heard from, and whether this node may answer for its service IPs.
    Members {
        /// The agent's API socket (default: [ipam] socket of --config).
        #[arg(long)]
        socket: Option<PathBuf>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// BGP: every peer's session on every node (state, routes advertised, why it is down),
    /// as the agents last wrote it into the BGPPeers' status.
    Bgp {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Convert Cilium's (CiliumLoadBalancerIPPool, CiliumL2AnnouncementPolicy, CiliumPodIPPool)
    /// and MetalLB's (IPAddressPool, L2Advertisement) resources into this project's, printed as
    /// YAML for `kubectl apply` or `ipamctl apply`. What has no counterpart is listed on stderr
    /// and the exit code is 2. With `--check`, print instead each LoadBalancer Service of the
    /// store with its IPs now and under the converted pools (exit code 3 when one would change).
    Migrate {
        /// The file with the resources (`-` for standard input; `kubectl get -o yaml` lists too).
        #[arg(short, long)]
        file: PathBuf,
        /// Do not print the resources: check them against the Services of the store of
        /// `--config` (the converted pools alone, as after the switch), writing nothing.
        #[arg(long)]
        check: bool,
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

const DEFAULT_STATE_DIR: &str = "/var/lib/ipam/node";

#[derive(Debug, clap::Args)]
struct StoreArgs {
    /// The daemon's configuration file: its [store] says where the objects live.
    #[arg(
        short,
        long,
        env = "IPAMD_CONFIG",
        default_value = ipam_config::DEFAULT_CONFIG_FILE
    )]
    config: PathBuf,
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

/// The state directory given, else the configuration's, else the default.
fn state_dir(given: Option<PathBuf>, config: Option<&Config>) -> PathBuf {
    given
        .or_else(|| {
            config
                .and_then(|c| c.ipam.as_ref())
                .map(|i| i.state_dir.clone())
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let output = args.output;
    match args.command {
        Command::Announcements => datapath::announcements(&args.bpffs_root, output),
        Command::Status => datapath::status(&args.bpffs_root, output),
        Command::Endpoints { state_dir } => {
            datapath::endpoints(&args.bpffs_root, &state_dir, output)
        }
        Command::Ipam {
            command: IpamCommand::Status { state_dir, config },
        } => {
            let config = config.as_deref().map(Config::load).transpose()?;
            let dir = self::state_dir(state_dir, config.as_ref());
            ipam_status::run(&dir, config.as_ref(), output)
        }
        Command::Apply { file, store } => {
            // Service annotations are read as the store's setting says, as on Kubernetes.
            let sources = Config::load(&store.config)?.store.service_annotations;
            with_store(&store.config, async |s| {
                objects::apply(&s, &file, &sources, output).await
            })
        }
        Command::Get { kind, store } => with_store(&store.config, async |s| {
            objects::get(&s, kind, output).await
        }),
        Command::WhoHas {
            ip,
            state_dir,
            store,
        } => {
            // Without a configuration file, the local view alone still answers.
            let config = Config::load(&store.config).ok();
            let dir = self::state_dir(state_dir, config.as_ref());
            who_has::run(ip, dir, config.as_ref(), output)
        }
        Command::Pools { store } => {
            with_store(&store.config, async |s| objects::pools(&s, output).await)
        }
        Command::Bgp { store } => with_store(&store.config, async |s| bgp::run(&s, output).await),
        Command::Members { socket, store } => {
            members::run(&store.config, socket.as_deref(), output)
        }
        Command::Delete { kind, name, store } => with_store(&store.config, async |s| {
            objects::delete(&s, kind, &name, output).await
        }),
        Command::Migrate { file, check, store } => {
            let code = if check {
                migrate_check(&file, &store.config, output)?
            } else {
                migrate::run(&file)?
            };
            std::io::Write::flush(&mut std::io::stdout())?;
            std::process::exit(code)
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
            Ok(clap_mangen::Man::new(Args::command()).render(&mut std::io::stdout())?)
        }
        Command::Datapath {
            command: DatapathCommand::Remove,
        } => remove_pins(&args.bpffs_root, output),
    }
}

/// `ipamctl migrate --check`: the exit code of the verdicts on the store's Services.
fn migrate_check(file: &Path, config: &Path, output: Output) -> anyhow::Result<i32> {
    let migration = migrate::load(file)?;
    let mut code = 0;
    with_store(config, async |s| {
        code = migrate::check(&s, &migration, output).await?;
        Ok(())
    })?;
    Ok(code)
}

fn remove_pins(root: &Path, output: Output) -> anyhow::Result<()> {
    Datapath::remove_pins(root)?;
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Removed<'a> {
        removed_pins_under: &'a Path,
    }
    emit(
        output,
        &Removed {
            removed_pins_under: root,
        },
        |r| {
            println!("removed every pin under {}", r.removed_pins_under.display());
        },
    )
}
