//! `ipam-cni`: the CNI plugin. Called by container runtimes (or by main plugins such as bridge
//! and ptp, as their IPAM plugin) with CNI_COMMAND and friends in the environment and the
//! network configuration on stdin; see the CNI specification. It asks ipamd (over its local API
//! socket, `ipam.socket` in the configuration, default /run/ipam/ipamd.sock) for the
//! attachment's addresses and never waits longer than `ipam.timeoutMs` (default 10000).
//!
//! Run by hand with `--help` for this text; every other use follows the CNI protocol.

use std::io::{Read as _, Write as _};

fn main() {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        println!(
            "ipam-cni: CNI IPAM plugin of the IPAM daemon.\n\n\
             Usage: invoked by a container runtime or a main CNI plugin, with CNI_COMMAND (ADD, \
             DEL, CHECK, VERSION, GC, STATUS), CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS \
             and CNI_PATH in the environment and the network configuration on stdin.\n\n\
             Configuration (in the main plugin's \"ipam\" section):\n  \
             \"type\": \"ipam-cni\"\n  \
             \"socket\": path of ipamd's API socket (default /run/ipam/ipamd.sock)\n  \
             \"timeoutMs\": how long to wait for ipamd (default 10000)\n\n\
             Errors are CNI error objects; code 11 (try again later) when ipamd is down or not \
             ready yet."
        );
        return;
    }
    let mut stdin = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let outcome = ipam_daemon::cni::plugin::run(|k| std::env::var(k).ok(), &stdin);
    if let Some(out) = outcome.stdout {
        let mut stdout = std::io::stdout();
        let _ = writeln!(stdout, "{out}");
    }
    std::process::exit(if outcome.success { 0 } else { 1 });
}
