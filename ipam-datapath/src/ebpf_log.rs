//! Log lines from the eBPF programs (aya-log): the rare events worth one, such as a spoofed packet
//! a pod sent (warn) or a malformed frame that reached a deep check (debug).
//!
//! The level is chosen when the object is loaded: it becomes a constant in the programs'
//! read-only data, so the verifier removes every log statement above it and a disabled level
//! costs nothing at run time (`cargo xtask bench arp` measures it). The records arrive over a
//! ring buffer and go to the daemon's own log (the `log` facade, which its tracing subscriber
//! receives) with the target `ipam_ebpf`.

use aya::{Ebpf, EbpfLoader};
use aya_log::EbpfLogger;

/// Which log statements of the eBPF programs are kept, by level (the configuration's
/// `[datapath] ebpf_log_level`, which the daemon maps onto this).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum EbpfLogLevel {
    /// None: every log statement is removed at load time.
    #[default]
    Off,
    Error,
    /// Spoofed packets dropped by the pod datapath.
    Warn,
    Info,
    /// Also malformed ARP/NDP frames seen by the responder.
    Debug,
    Trace,
}

/// Sets the level the object is loaded with.
pub(super) fn set_level(loader: &mut EbpfLoader<'_>, level: EbpfLogLevel) {
    // Frozen read-only data: the verifier sees the level as a constant.
    loader.override_global(aya_log::LEVEL, as_global(level), true);
}

/// The value aya-log-ebpf compares its statements' levels with (0 keeps none). A `'static`
/// reference because the loader keeps what it is given until it loads.
fn as_global(level: EbpfLogLevel) -> &'static u8 {
    const _: () = assert!(
        aya_log::Level::Error as u8 == 1 && aya_log::Level::Trace as u8 == 5,
        "aya-log's level numbering changed"
    );
    match level {
        EbpfLogLevel::Off => &0,
        EbpfLogLevel::Error => &1,
        EbpfLogLevel::Warn => &2,
        EbpfLogLevel::Info => &3,
        EbpfLogLevel::Debug => &4,
        EbpfLogLevel::Trace => &5,
    }
}

/// The reader of the programs' log ring buffer. It must live as long as the programs: dropping
/// it closes the ring buffer, which the programs reference.
pub struct EbpfLog(EbpfLogger<&'static dyn log::Log>);

impl EbpfLog {
    pub(super) fn take(ebpf: &mut Ebpf) -> Option<Self> {
        match EbpfLogger::init(ebpf) {
            Ok(logger) => Some(Self(logger)),
            Err(e) => {
                tracing::warn!("eBPF log records cannot be read ({e}); the datapath runs without");
                None
            }
        }
    }

    /// Writes every record waiting in the ring buffer to the daemon's log.
    pub fn flush(&mut self) {
        self.0.flush();
    }
}

impl std::os::fd::AsRawFd for EbpfLog {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

/// Moves the eBPF programs' log records into the daemon's log as they arrive. Runs for the life
/// of the process, which keeps the ring buffer (and so the programs' reference to it) alive.
pub async fn drain(log: EbpfLog) {
    // SAFETY: the ring buffer's fd is owned by `log`, which the AsyncFd owns from here on; it
    // stays open and the same for the AsyncFd's whole life.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(log, tokio::io::Interest::READABLE)
    };
    let mut ready = match registered {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!("cannot watch the eBPF log ring buffer ({e}); eBPF log lines are lost");
            return;
        }
    };
    loop {
        match ready.readable_mut().await {
            Ok(mut guard) => {
                guard.get_inner_mut().flush();
                guard.clear_ready();
            }
            Err(e) => {
                tracing::warn!("eBPF log ring buffer failed ({e}); eBPF log lines are lost");
                return;
            }
        }
    }
}
