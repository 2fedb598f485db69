//! `[datapath]`, `[interfaces.*]` and `[[announcement]]`: the eBPF datapath and what it
//! answers for.

use std::{net::IpAddr, path::PathBuf, time::Duration};

use serde::Deserialize;

use super::DEFAULT_BPFFS_ROOT;

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

/// How the operator wants the responder attached to an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttachMode {
    /// TC on virtual devices (veth, bridges: measured faster there, see docs/datapath.md);
    /// native XDP on physical NICs, falling back to TC when the driver has no native XDP.
    #[default]
    Auto,
    /// XDP in the driver. On a veth, replies reach the peer only if the peer runs an XDP
    /// program of its own (GRO alone was not enough on kernel 6.18; see docs/datapath.md).
    XdpNative,
    /// XDP in generic (skb) mode: works everywhere, slower than both other forms.
    XdpGeneric,
    /// TC ingress (tcx link), replies redirected back out of the same interface.
    Tc,
}

/// Which eBPF log statements are kept, by level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
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
