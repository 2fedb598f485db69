//! The liveness gate: answer only while the daemon has proved recently that it is alive.

use aya_ebpf::helpers::{bpf_jiffies64, bpf_ktime_get_ns};
use ipam_common::l2::ResponderStat;

use crate::maps::{L2_RESPONDER_CONFIG, count};

/// `true` until the deadline the daemon's last heartbeat set. A missed deadline (or none ever
/// set) silences the responder, so a hung daemon cannot keep holding addresses it no longer
/// manages.
#[inline(always)]
pub fn daemon_alive() -> bool {
    let Some(config) = L2_RESPONDER_CONFIG.get(0) else {
        return false;
    };
    // Inlined by the verifier into a load of `jiffies`: no helper call on the reply path.
    // SAFETY: helper without arguments.
    let alive = unsafe { bpf_jiffies64() } <= config.deadline_jiffies;
    if !alive {
        count(ResponderStat::StaleSkipped);
    }
    alive
}

/// The heartbeat: moves the deadline `staleness_jiffies` past now. Runs only when the daemon
/// runs the `l2_heartbeat` program.
#[inline(always)]
pub fn beat() {
    if let Some(config) = L2_RESPONDER_CONFIG.get_ptr_mut(0) {
        // SAFETY: the map's only value, valid for this run; the daemon is the only other writer
        // and it is the one running this program.
        let config = unsafe { &mut *config };
        // SAFETY: helpers without arguments.
        let (jiffies, now_ns) = unsafe { (bpf_jiffies64(), bpf_ktime_get_ns()) };
        config.deadline_jiffies = jiffies.saturating_add(config.staleness_jiffies);
        config.heartbeat_ns = now_ns;
    }
}
