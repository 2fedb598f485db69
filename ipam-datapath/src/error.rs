use std::path::PathBuf;

use thiserror::Error;

/// What can go wrong in the datapath; every variant names the object and says what to do.
#[derive(Debug, Error)]
pub enum DatapathError {
    #[error(
        "{path} is not on a BPF filesystem; mount one with `mount -t bpf bpf /sys/fs/bpf` (or run \
         `cargo xtask setup`), or point datapath.bpffs_root below a bpffs mount"
    )]
    NotBpffs { path: PathBuf },
    #[error("cannot create or use pin directory {path}: {source}")]
    PinDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot load the eBPF object with pins under {root}: {source}; if the pins were left by an \
         incompatible version, remove them with `ipamctl datapath remove` and start again"
    )]
    Load {
        root: PathBuf,
        source: Box<aya::EbpfError>,
    },
    #[error("the eBPF object has no program {name}; the build is broken, rebuild the daemon")]
    MissingProgram { name: &'static str },
    #[error("the kernel rejected eBPF program {program}: {source}")]
    Verifier {
        program: &'static str,
        source: Box<aya::programs::ProgramError>,
    },
    #[error(
        "map {name} pinned at {path} has key size {found_key} and value size {found_value}, but \
         this daemon needs {want_key} and {want_value}; it was left by an incompatible version: \
         remove the pins with `ipamctl datapath remove` (answers stop until the daemon is \
         started again)"
    )]
    MapLayout {
        name: &'static str,
        path: PathBuf,
        found_key: u32,
        found_value: u32,
        want_key: u32,
        want_value: u32,
    },
    #[error(
        "the eBPF object has no map {name} of the expected type; ipam-common and ipam-ebpf \
         disagree, rebuild the daemon"
    )]
    MissingMap { name: &'static str },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        source: Box<aya::maps::MapError>,
    },
    #[error(
        "map {name} is not pinned at {path}: {source}; is the daemon running with this bpffs root?"
    )]
    NotPinned {
        name: &'static str,
        path: PathBuf,
        source: Box<aya::maps::MapError>,
    },
    #[error("cannot attach {program} to interface {interface}: {source}")]
    Attach {
        interface: String,
        /// The program as its link pins name it, e.g. `l2_responder-tc`, `pod_from_container`.
        program: String,
        source: Box<aya::programs::ProgramError>,
    },
    #[error("cannot pin the {program} link of interface {interface} at {path}: {source}")]
    PinLink {
        program: String,
        interface: String,
        path: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("interface {interface}: {source}")]
    Interface {
        interface: String,
        source: std::io::Error,
    },
    #[error(
        "the heartbeat program did not run ({source}); the responders go silent when the \
         liveness timeout passes"
    )]
    Heartbeat {
        source: Box<aya::programs::ProgramError>,
    },
    #[error("cannot count CPUs ({what}): {source}")]
    Cpus {
        what: &'static str,
        source: std::io::Error,
    },
}
