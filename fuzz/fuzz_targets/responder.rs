//! The L2 responder (both attach forms) run on generated frames through BPF_PROG_TEST_RUN: the
//! forms agree, frames they do not answer pass untouched, every reply is the exact reply to a
//! valid request for an announced IP and the independent oracle accepts it
//! (`ipam_tests::responder_harness::Harness::check`). Needs root and bpffs, as the tests do.
//! The harness lives as long as the process, which exits without dropping it: its pins are under
//! `/sys/fs/bpf/ipam-fuzz-*`, which `cargo xtask fuzz` removes after the run.
#![no_main]

use std::sync::{Mutex, OnceLock};

use ipam_tests::{BpffsRoot, responder_harness::Harness};
use libfuzzer_sys::fuzz_target;

static HARNESS: OnceLock<Mutex<Harness>> = OnceLock::new();

/// The kernel's test-run harness refuses frames shorter than an Ethernet header (no NIC delivers
/// one either).
const ETH_HLEN: usize = 14;

fuzz_target!(|data: &[u8]| {
    if data.len() < ETH_HLEN {
        return;
    }
    let harness =
        HARNESS.get_or_init(|| Mutex::new(Harness::in_root(BpffsRoot::named("ipam-fuzz-"))));
    harness.lock().expect("harness lock").check(data);
});
