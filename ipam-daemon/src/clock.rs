//! The clock the eBPF side reads (`bpf_ktime_get*_ns` is CLOCK_MONOTONIC).

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC always exists on Linux");
    now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64
}
