//! The liveness gate: answer only while the daemon has proved recently that it is alive.

use aya_ebpf::helpers::bpf_ktime_get_coarse_ns;
use ipam_common::l2::ResponderStat;

use crate::maps::{L2_RESPONDER_CONFIG, count};

/// `true` while the daemon's heartbeat is fresh. A stale (or never written) heartbeat silences
/// the responder, so a hung daemon cannot keep holding addresses it no longer manages.
#[inline(always)]
pub fn daemon_alive() -> bool {
    let Some(config) = L2_RESPONDER_CONFIG.get(0) else {
        return false;
    };
    // The coarse clock (jiffies resolution) is enough for a timeout measured in seconds and
    // costs a fraction of the precise one on the reply path.
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let alive = config.heartbeat_ns != 0
        && now.saturating_sub(config.heartbeat_ns) <= config.max_staleness_ns;
    if !alive {
        count(ResponderStat::StaleSkipped);
    }
    alive
}
