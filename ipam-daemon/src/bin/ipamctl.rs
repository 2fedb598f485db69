//! `ipamctl`: the operator's CLI.
use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};
use ipam_common::l2::ResponderStat;
use ipam_daemon::{
    clock,
    config::DEFAULT_BPFFS_ROOT,
    datapath::{Datapath, ResponderMaps, pinned_attachments},
    net::iface,
};

/// Inspect and manage the IPAM daemon of this node. Reads the daemon's pinned eBPF maps
/// directly, so it works while the daemon is running, restarting or stopped.
#[derive(Debug, Parser)]
#[command(version)]
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
    /// Manage the pinned datapath.
    Datapath {
        #[command(subcommand)]
        command: DatapathCommand,
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
    println!(
        "{:<40} {:<16} {:<18} {:>12}",
        "IP", "INTERFACE", "MAC", "REPLIES"
    );
    for e in &entries {
        println!(
            "{:<40} {:<16} {:<18} {:>12}",
            e.ip,
            iface::name(e.ifindex),
            iface::format_mac(&e.mac),
            e.replies
        );
    }
    if entries.is_empty() {
        println!("(no IP is announced)");
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
