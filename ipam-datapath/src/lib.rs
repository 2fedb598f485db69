//! The datapath: loads the eBPF object (built from `ipam-ebpf` by this crate's `build.rs`),
//! keeps every map, program link and pin under one bpffs root owned by the daemon, and reuses
//! those pins on restart so answers never stop while the daemon restarts or upgrades. `ipamctl`
//! reads the same pins (`from_pins`), with the daemon running or not.
//!
//! Layout under the root (default `/sys/fs/bpf/ipam`):
//! - `maps/<MAP_NAME>`: maps, reused as they are by the next daemon (state survives restarts);
//! - `links/l2_responder-<form>-<interface>-<ifindex>` and `links/<pod program>-<interface>-<ifindex>`:
//!   attachments (`links`), adopted by the next daemon, which swaps in its freshly loaded program
//!   atomically (`bpf_link_update`).

mod attach;
mod bpffs;
pub mod clock;
pub mod ebpf_log;
mod error;
mod links;
mod maps;
mod pod_attach;
mod pod_maps;
mod route_maps;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    programs::{SchedClassifier, TestRun as _, TestRunOptions, Xdp},
};
use ipam_common::{map_names, program_names};

pub use attach::{AttachForm, AttachMode, Attachment, pinned_attachments};
pub use ebpf_log::{EbpfLog, EbpfLogLevel};
pub use error::DatapathError;
pub use maps::{AnnouncementEntry, ResponderMaps, ResponderStats, responder_key};
pub use pod_attach::{PodLink, PodProgram, pinned_pod_links, unpin_pod_link};
pub use pod_maps::{PodMaps, PodStats, endpoint_key};
pub use route_maps::{RouteMaps, RouteTarget};

/// The eBPF object built by `build.rs` from `ipam-ebpf`.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ipam-ebpf"));

/// The loaded datapath of one daemon.
pub struct Datapath {
    root: PathBuf,
    /// The programs' log ring buffer until the daemon takes it (`take_log`).
    log: Option<EbpfLog>,
    ebpf: Ebpf,
    responder: ResponderMaps,
    pods: PodMaps,
    routes: RouteMaps,
    /// Responder attachments this process made or adopted, by interface.
    responders: std::collections::BTreeMap<String, Attachment>,
}

impl Datapath {
    /// Loads the datapath with its pins under `root`, creating them on first start and reusing
    /// them (with their entries) on every later start. The programs' log statements are off.
    pub fn open(root: &Path) -> Result<Self, DatapathError> {
        Self::open_with_log(root, EbpfLogLevel::Off)
    }

    /// As `open`, keeping the programs' log statements up to `log_level` (read them with
    /// [`Datapath::take_log`]).
    pub fn open_with_log(root: &Path, log_level: EbpfLogLevel) -> Result<Self, DatapathError> {
        bpffs::prepare_root(root)?;
        let maps_dir = root.join("maps");
        maps::replace_outdated_config(&maps_dir)?;
        let mut loader = EbpfLoader::new();
        ebpf_log::set_level(&mut loader, log_level);
        for name in [
            map_names::L2_RESPONDER,
            map_names::L2_RESPONDER_CONFIG,
            map_names::L2_RESPONDER_STATS,
            map_names::L2_HANDOVER,
            map_names::L2_HANDOVER_FLOWS,
            map_names::L2_HANDOVER_GATE,
            map_names::POD_ENDPOINTS,
            map_names::POD_DATAPATH_STATS,
            map_names::POD_ROUTES,
            map_names::POD_ROUTE_STATS,
            map_names::POD_STACK_FLOWS,
        ] {
            loader.map_pin_path(name, maps_dir.join(name));
        }
        let mut ebpf = loader
            .load(EBPF_OBJECT)
            .map_err(|source| DatapathError::Load {
                root: root.to_owned(),
                source: Box::new(source),
            })?;
        // The ring buffer the programs log into, taken before they load (they reference it).
        let log = EbpfLog::take(&mut ebpf);
        for name in [
            program_names::L2_RESPONDER_XDP,
            program_names::L2_RESPONDER_TC,
            program_names::L2_HEARTBEAT,
            program_names::POD_FROM_CONTAINER,
            program_names::POD_FROM_UPLINK,
            program_names::POD_TO_CONTAINER,
            program_names::POD_TO_UPLINK,
        ] {
            load_program(&mut ebpf, name)?;
        }
        let responder = ResponderMaps::take(&mut ebpf, &maps_dir)?;
        let pods = PodMaps::take(&mut ebpf, &maps_dir)?;
        let routes = RouteMaps::take(&mut ebpf, &maps_dir)?;
        Ok(Self {
            root: root.to_owned(),
            log,
            ebpf,
            responder,
            pods,
            routes,
            responders: std::collections::BTreeMap::new(),
        })
    }

    /// The reader of the programs' log records, for the daemon to drain. Whoever takes it must
    /// keep it as long as the datapath is loaded.
    pub fn take_log(&mut self) -> Option<EbpfLog> {
        self.log.take()
    }

    /// The bpffs directory holding this datapath's pins.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The responder's maps: announcements, liveness gate and counters.
    pub fn responder(&mut self) -> &mut ResponderMaps {
        &mut self.responder
    }

    /// The pod datapath's maps: endpoints and counters.
    pub fn pods(&mut self) -> &mut PodMaps {
        &mut self.pods
    }

    /// The cross-node route map: other nodes' pod CIDRs.
    pub fn routes(&mut self) -> &mut RouteMaps {
        &mut self.routes
    }

    /// The responder in its XDP form (also what `BPF_PROG_TEST_RUN` tests and benchmarks run).
    pub fn responder_xdp(&mut self) -> &mut Xdp {
        program_mut(&mut self.ebpf, program_names::L2_RESPONDER_XDP)
    }

    /// Proves the daemon alive now: the responders answer until `max_staleness` has passed
    /// without another heartbeat. The staleness is kept in ticks (rounded down, so the deadline
    /// never falls later than asked) and the kernel's heartbeat program sets the deadline from
    /// its own jiffies.
    pub fn heartbeat(&mut self, max_staleness: Duration) -> Result<(), DatapathError> {
        let max_staleness_ns: u64 = max_staleness.as_nanos().try_into().unwrap_or(u64::MAX);
        let mut config = self.responder.config()?;
        if config.max_staleness_ns != max_staleness_ns || config.staleness_jiffies == 0 {
            config.max_staleness_ns = max_staleness_ns;
            config.staleness_jiffies = max_staleness_ns / clock::jiffy_ns();
            self.responder.write_config(config)?;
        }
        // The program needs a frame to run on; it does not look at it.
        let frame = [0u8; 14];
        let heartbeat = program_mut::<Xdp>(&mut self.ebpf, program_names::L2_HEARTBEAT);
        heartbeat
            .test_run(TestRunOptions {
                data_in: Some(&frame),
                ..TestRunOptions::new()
            })
            .map(drop)
            .map_err(|source| DatapathError::Heartbeat {
                source: Box::new(source),
            })
    }

    /// Silences the responders now, as if the last heartbeat had run out: the fence closed.
    /// The next heartbeat lets them answer again.
    pub fn silence(&mut self) -> Result<(), DatapathError> {
        let mut config = self.responder.config()?;
        config.deadline_jiffies = 0;
        self.responder.write_config(config)
    }

    /// The responder in its TC form.
    pub fn responder_tc(&mut self) -> &mut SchedClassifier {
        program_mut(&mut self.ebpf, program_names::L2_RESPONDER_TC)
    }

    /// Removes every pin of the datapath: detaches all programs and drops all maps (once this
    /// process exits). Used to uninstall, and by tests to leave nothing behind.
    pub fn remove_pins(root: &Path) -> Result<(), DatapathError> {
        bpffs::remove_root(root)
    }
}

fn load_program(ebpf: &mut Ebpf, name: &'static str) -> Result<(), DatapathError> {
    let program = ebpf
        .program_mut(name)
        .ok_or(DatapathError::MissingProgram { name })?;
    let loaded = match program {
        aya::programs::Program::Xdp(p) => p.load(),
        aya::programs::Program::SchedClassifier(p) => p.load(),
        _ => return Err(DatapathError::MissingProgram { name }),
    };
    loaded.map_err(|source| DatapathError::Verifier {
        program: name,
        source: Box::new(source),
    })
}

/// The programs are checked to exist and have the right type in `open`, so a miss here is a bug.
fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> &'a mut T
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program>,
{
    let program = ebpf
        .program_mut(name)
        .expect("program checked in Datapath::open");
    program
        .try_into()
        .unwrap_or_else(|_| panic!("program {name} has the type checked in Datapath::open"))
}
