//! `ipam-cni`: the CNI plugin. Called by container runtimes (or by main plugins such as bridge
//! and ptp, as their IPAM plugin) with CNI_COMMAND and friends in the environment and the
//! network configuration on stdin; see the CNI specification.

use std::io::{Read as _, Write as _};

use clap::Parser;

/// CNI plugin of the IPAM daemon (CNI 1.0.0 and 1.1.0; results in 0.3.x/0.4.0 shape too).
///
/// A container runtime, or a main plugin delegating IPAM, runs it with CNI_COMMAND (ADD, DEL,
/// CHECK, VERSION, GC, STATUS), CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS and CNI_PATH in
/// the environment and the network configuration on stdin. It takes no arguments of its own.
///
/// As the main plugin ("type": "ipam-cni") it creates the pod's veth pair, addresses, routes and
/// MTU and registers the pod with ipamd. As an IPAM plugin ("ipam": {"type": "ipam-cni"}) it only
/// hands out the addresses. Configuration keys (top level for the main plugin, in the "ipam"
/// section otherwise): "socket", the path of ipamd's API socket (default /run/ipam/ipamd.sock);
/// "timeoutMs", how long to wait for ipamd (default 10000); "mtu" (main plugin, default 1500).
///
/// Errors are CNI error objects on stdout; code 11 (try again later) when ipamd is down, went
/// away mid-request or is not ready yet.
#[derive(Parser)]
#[command(version)]
struct Args {}

fn main() {
    // A runtime passes no arguments; parse only when a person does, so the plugin's start-up
    // stays at process exec plus the request.
    if std::env::args_os().len() > 1 {
        Args::parse();
    }
    let mut stdin = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let outcome = ipam_cni::plugin::run(|k| std::env::var(k).ok(), &stdin);
    if let Some(out) = outcome.stdout {
        let mut stdout = std::io::stdout();
        let _ = writeln!(stdout, "{out}");
    }
    std::process::exit(if outcome.success { 0 } else { 1 });
}
