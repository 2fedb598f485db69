//! `ipamd`: the node daemon.
use std::path::PathBuf;

use clap::Parser;
use ipam_daemon::daemon::Role;

/// The IPAM daemon. On a node it loads the eBPF datapath, keeps it pinned under its bpffs root,
/// and answers ARP and IPv6 neighbour solicitations for the IPs announced in its configuration
/// file. With an `[ipam]` section it also manages addresses: pools and per-node blocks
/// (operator), the node's router and health addresses and pod addresses (agent), served to
/// `ipam-cni` over a root-only local API socket.
///
/// Roles: `standalone` runs all of it in one process (embedded store by default); in a cluster
/// sharing an etcd store, every node runs `--role agent` and one or more replicas run
/// `--role operator`, of which one leads.
///
/// Signals: SIGHUP reloads the configuration file (a bad file is reported and the running
/// configuration kept); SIGTERM and SIGINT stop the daemon, leaving the datapath pinned so that
/// answers continue until the liveness timeout and a restarted daemon picks up where it left off.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Configuration file (TOML). See docs/configuration.md for every setting and its default.
    #[arg(
        short,
        long,
        env = "IPAMD_CONFIG",
        default_value = ipam_config::DEFAULT_CONFIG_FILE
    )]
    config: PathBuf,
    /// Which part of the system this process is.
    #[arg(long, env = "IPAMD_ROLE", value_enum, default_value_t = Role::Standalone)]
    role: Role,
    /// Log filter, e.g. `info`, `debug` or `ipam_daemon=debug` (RUST_LOG syntax).
    #[arg(long, env = "IPAMD_LOG", default_value = "info")]
    log: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ipam_daemon::logging::init(&args.log)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(ipam_daemon::daemon::run(args.config, args.role))?;
    Ok(())
}
