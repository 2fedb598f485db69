//! `[node]`: who this node is, and `[node.announce]`: when it may announce Service IPs.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
};

use serde::Deserialize;

/// The `[node]` section: who this node is, for the Service IPs it may answer for and for the
/// gossip. With `[ipam]` the same three may be given there as `node_name`, `node_labels` and
/// `node_addresses` (the older spelling); each in one place only.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSettings {
    /// The node's name in the cluster state; defaults to `NODE_NAME`, else the host name.
    #[serde(default)]
    pub name: String,
    /// The node's labels: L2 announcement policies select the nodes that may announce by them
    /// (on a Kubernetes store, added over its Node's labels).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The node's addresses on the network between nodes (one per family): where the others
    /// gossip with it. By default its Kubernetes Node's InternalIPs (or, with `[ipam]`, its
    /// first uplink's addresses).
    #[serde(default)]
    pub addresses: Vec<IpAddr>,
    /// The local API socket (`ipamctl`, and with `[ipam]` `ipam-cni`); its directory must be
    /// root-only. Defaults to /run/ipam/ipamd.sock.
    #[serde(default)]
    pub socket: PathBuf,
    /// The gid of a group whose members may use the local API besides root (the socket is
    /// then mode 0660 and of that group). Leave it out for root only.
    #[serde(default)]
    pub socket_group: Option<u32>,
    /// When the node stops announcing Service IPs (`[node.announce]`).
    #[serde(default)]
    pub announce: AnnounceSettings,
    /// What a stop of the agent (SIGTERM) means: a leave, or a restart.
    #[serde(default)]
    pub on_stop: OnStop,
    /// For a restart (with the gossip or the leases): how long the stopping agent's responders go on answering
    /// for its Service IPs, and the other agents keep them where they are, waiting for the next
    /// agent (1,000 to 60,000 ms).
    #[serde(default = "default_restart_within_ms")]
    pub restart_within_ms: u64,
}

/// The bounds of `[node] restart_within_ms`: long enough for an agent to start, short enough
/// that a node that never comes back is not answered for long.
pub(crate) const RESTART_WITHIN_MS: std::ops::RangeInclusive<u64> = 1_000..=60_000;

fn default_restart_within_ms() -> u64 {
    10_000
}

impl NodeSettings {
    pub fn restart_within(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.restart_within_ms)
    }

    /// The file `name` in the node's private directory, beside the API socket: what one agent
    /// leaves for the next (the restart promise, the Service IPs it put on `lo`).
    pub fn private_file(&self, name: &str) -> PathBuf {
        self.socket
            .parent()
            .unwrap_or(Path::new("/run/ipam"))
            .join(name)
    }
}

/// What a stop of the agent means (`[node] on_stop`). The agent cannot tell an upgrade from an
/// uninstall by its signal: say which stops are restarts. A configuration reload (SIGHUP)
/// before the stop changes it for that stop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnStop {
    /// The node leaves (uninstall, drain, a node going away): BGP sessions close with a Cease
    /// and routers withdraw its routes at once.
    #[default]
    Leave,
    /// The agent comes back (an upgrade, a restart of the DaemonSet or the service): BIRD
    /// stops without a Cease, so routers with graceful restart (`gracefulRestart` on the
    /// BGPPeer, and the router's helper mode) keep this node's routes for the peer's
    /// `restartTimeSeconds`; the Service IPs stay on `lo`, so the node goes on taking their
    /// traffic; the next agent resumes with the same routes and ends the restart
    /// (End-of-RIB). If no agent comes back, routers drop the routes when the restart time
    /// runs out.
    Restart,
    /// A restart, unless the node may not announce when its agent stops (its record's
    /// `spec.announcing.excluded`: the exclusion label, or a cordoned, NotReady or
    /// network-unavailable Node as `[node.announce]` says), or its record is gone, or (on
    /// Kubernetes) the agent's DaemonSet is gone or being deleted: then a leave. So a
    /// DaemonSet rollout restarts, and a node drained by the exclusion label (or cordoned,
    /// with `exclude_cordoned`) before its agent stops, or an uninstall, leaves.
    Auto,
}

impl OnStop {
    /// What this stop is: `Leave` or `Restart`; for `Auto`, a leave when `excluded` says why
    /// the node may not announce (or that its record is gone), a restart otherwise.
    pub fn resolve(self, excluded: Option<&str>) -> Self {
        match (self, excluded) {
            (Self::Auto, Some(_)) => Self::Leave,
            (Self::Auto, None) => Self::Restart,
            (stop, _) => stop,
        }
    }
}

impl Default for NodeSettings {
    fn default() -> Self {
        Self {
            name: String::new(),
            labels: BTreeMap::new(),
            addresses: Vec::new(),
            socket: PathBuf::new(),
            socket_group: None,
            announce: AnnounceSettings::default(),
            on_stop: OnStop::default(),
            restart_within_ms: default_restart_within_ms(),
        }
    }
}

/// The `[node.announce]` table: which states of the node keep it from announcing Service IPs.
/// The defaults are MetalLB's, so a cluster moving over behaves the same.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AnnounceSettings {
    /// Honour the label `node.kubernetes.io/exclude-from-external-load-balancers` (MetalLB
    /// does, unless started with `--ignore-exclude-lb`).
    pub exclusion_label: bool,
    /// Stop while the Kubernetes Node's `NetworkUnavailable` condition is True (MetalLB does).
    pub exclude_network_unavailable: bool,
    /// Stop while the Kubernetes Node is NotReady (MetalLB does not: its speakers' liveness
    /// decides, as the gossip does here).
    pub exclude_not_ready: bool,
    /// Stop while the Kubernetes Node is cordoned, as when it is drained (MetalLB does not).
    pub exclude_cordoned: bool,
    /// Set `net.ipv4.conf.all.arp_ignore = 1` and `arp_announce = 2` (what kube-proxy's
    /// strictARP sets) when the first Service IP goes on `lo`, so the kernel never answers ARP
    /// for it on any interface and never sends it as an ARP request's sender: only the
    /// responder of the one owner answers. With `false` the agent leaves the sysctls to you
    /// (and still reports kube-proxy's IPVS mode without strictARP on every Service).
    pub strict_arp: bool,
}

impl Default for AnnounceSettings {
    fn default() -> Self {
        Self {
            exclusion_label: true,
            exclude_network_unavailable: true,
            exclude_not_ready: false,
            exclude_cordoned: false,
            strict_arp: true,
        }
    }
}

/// `NODE_NAME` when set (the DaemonSet passes the Kubernetes node name down: it need not be
/// the host name), else the host name.
pub(super) fn default_node_name() -> String {
    if let Some(name) = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()) {
        return name;
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "node".to_owned())
}
