//! `[datapath]`, `[interfaces.*]` and `[[announcement]]`: the eBPF datapath and what it
//! answers for.

use std::{net::IpAddr, path::PathBuf, time::Duration};

use serde::Deserialize;

use super::DEFAULT_BPFFS_ROOT;
use crate::datapath::{AttachMode, EbpfLogLevel};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatapathConfig {
    pub bpffs_root: PathBuf,
    pub liveness_timeout_ms: u64,
    pub heartbeat_interval_ms: u64,
    /// Which log statements of the eBPF programs are kept (off, error, warn, info, debug,
    /// trace); applied when the programs are loaded, so a change needs a restart.
    pub ebpf_log_level: EbpfLogLevel,
}

impl Default for DatapathConfig {
    fn default() -> Self {
        Self {
            bpffs_root: PathBuf::from(DEFAULT_BPFFS_ROOT),
            liveness_timeout_ms: 3_000,
            heartbeat_interval_ms: 500,
            ebpf_log_level: EbpfLogLevel::Off,
        }
    }
}

impl DatapathConfig {
    pub fn liveness_timeout(&self) -> Duration {
        Duration::from_millis(self.liveness_timeout_ms)
    }

    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterfaceConfig {
    #[serde(default)]
    pub attach: AttachMode,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnnouncementConfig {
    pub ip: IpAddr,
    pub interface: String,
}
