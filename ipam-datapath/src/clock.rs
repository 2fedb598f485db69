//! The clocks the eBPF side reads: `bpf_ktime_get*_ns` is CLOCK_MONOTONIC, and `bpf_jiffies64`
//! counts ticks of the coarse clocks' resolution.

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    nanoseconds(
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .expect("CLOCK_MONOTONIC always exists on Linux"),
    )
}

/// The length of one kernel tick (a jiffy), which is the resolution of the coarse clocks.
pub fn jiffy_ns() -> u64 {
    nanoseconds(
        nix::time::clock_getres(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
            .expect("CLOCK_MONOTONIC_COARSE always exists on Linux"),
    )
    .max(1)
}

fn nanoseconds(t: nix::sys::time::TimeSpec) -> u64 {
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}
