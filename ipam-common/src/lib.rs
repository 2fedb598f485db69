//! The contract between the eBPF programs (`ipam-ebpf`) and the daemon (`ipam-daemon`).
//!
//! Everything in here is `#[repr(C)]` with explicit padding and a compile-time size check, so
//! both sides agree on every byte. Map names and capacities live here and nowhere else.
#![no_std]

pub mod l2;

/// Names of the maps in the eBPF object. They must equal the `static` names in `ipam-ebpf`
/// (BTF-defined maps take their name from the static); the daemon's loader fails with a clear
/// error when one is missing.
pub mod map_names {
    /// `(IP, ifindex) -> L2Announcement`: which IPs to answer ARP/NDP for, on which interface.
    pub const L2_RESPONDER: &str = "L2_RESPONDER";
    /// One `ResponderConfig` at index 0: liveness gate written by the daemon.
    pub const L2_RESPONDER_CONFIG: &str = "L2_RESPONDER_CONFIG";
    /// Per-CPU counters indexed by `l2::ResponderStat`.
    pub const L2_RESPONDER_STATS: &str = "L2_RESPONDER_STATS";
}

/// Names of the programs in the eBPF object.
pub mod program_names {
    /// The responder attached with XDP (NICs with native XDP, or generic mode).
    pub const L2_RESPONDER_XDP: &str = "l2_responder_xdp";
    /// The same responder attached at TC ingress (veth and other virtual devices, where it is faster).
    pub const L2_RESPONDER_TC: &str = "l2_responder_tc";
}
