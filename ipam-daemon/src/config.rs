//! The daemon's configuration file (TOML). Every field has a documented default, so an empty file
//! is a valid configuration that announces nothing.
//!
//! ```toml
//! [datapath]
//! bpffs_root = "/sys/fs/bpf/ipam"   # all pins of the daemon live below this directory
//! liveness_timeout_ms = 3000         # responders go silent this long after the last heartbeat
//! heartbeat_interval_ms = 500        # how often the daemon proves it is alive
//!
//! [interfaces.eth0]
//! attach = "auto"                    # auto | xdp-native | xdp-generic | tc
//!
//! [[announcement]]
//! ip = "192.0.2.10"
//! interface = "eth0"
//! ```

use std::{collections::BTreeMap, net::IpAddr, path::PathBuf, time::Duration};

use serde::Deserialize;
use thiserror::Error;

use ipam_core::{
    Cidr, Family,
    pod::pool::{IpamMode, PodIpPoolSpec},
};

use crate::datapath::{AttachMode, EbpfLogLevel};

/// Default bpffs directory that holds every map, program and link pin of the daemon.
pub const DEFAULT_BPFFS_ROOT: &str = "/sys/fs/bpf/ipam";

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub datapath: DatapathConfig,
    /// Per-interface settings; interfaces not listed use the defaults.
    #[serde(default)]
    pub interfaces: BTreeMap<String, InterfaceConfig>,
    /// IPs to answer ARP/NDP for, each on one interface.
    #[serde(default, rename = "announcement")]
    pub announcements: Vec<AnnouncementConfig>,
    /// Who this node is in the cluster: its name, labels and addresses between nodes.
    #[serde(default)]
    pub node: NodeSettings,
    /// Pod IP address management; absent means the daemon only announces: the configured
    /// IPs, and on a shared store the cluster's Service IPs (the add-on mode, beside another
    /// CNI).
    #[serde(default)]
    pub ipam: Option<IpamSettings>,
    /// Where the cluster state lives.
    #[serde(default)]
    pub store: StoreSettings,
    /// Timings of the cluster roles (leases, grace, resync).
    #[serde(default)]
    pub cluster: ClusterSettings,
    /// Prometheus metrics and health endpoints.
    #[serde(default)]
    pub metrics: MetricsSettings,
    /// Node liveness between the agents (a shared store only); absent: from the store's leases.
    #[serde(default)]
    pub gossip: Option<GossipSettings>,
    /// Service IPs advertised over BGP (a shared store only): the agent runs BIRD with the
    /// sessions of the BGPPeers that select this node (docs/bgp.md).
    #[serde(default)]
    pub bgp: Option<BgpSettings>,
    /// Taking a dead node's pods out of their Services' endpoints on the agents' evidence, on
    /// Kubernetes with `[gossip]` (docs/kubernetes.md, "Dead nodes' endpoints").
    #[serde(default)]
    pub dead_nodes: DeadNodeSettings,
}

/// The `[dead_nodes]` section. The agents report the nodes the gossip declared dead whose
/// kubelet's port gives no answer either; the operator marks the pods of a node that a majority
/// of the nodes report not ready, as the node lifecycle controller does after its grace period,
/// so kube-proxy stops sending them traffic within seconds instead of about a minute.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeadNodeSettings {
    /// Take a dead node's pods out of their Services: the operator sets them not ready, and
    /// each agent deletes its unanswered connections to them (`liveness::dead_flows`). Off,
    /// the agents still report (`ipamctl` and the node records show what they hold) and
    /// Kubernetes' own grace period applies.
    pub mark_pods_not_ready: bool,
    /// Agent: the port of the kubelet on every node, probed as the second signal.
    pub kubelet_port: u16,
    /// Agent: how long the probe waits for the kubelet's port to answer; silence that long is
    /// the evidence (a refusal is an answer: the node's kernel runs).
    pub probe_timeout_ms: u64,
    /// Operator: at most this many nodes' pods marked within `rate_window_ms`; more dead nodes
    /// wait for the window (or for the node lifecycle controller).
    pub max_nodes_per_window: usize,
    pub rate_window_ms: u64,
}

impl Default for DeadNodeSettings {
    fn default() -> Self {
        Self {
            mark_pods_not_ready: true,
            kubelet_port: 10250,
            probe_timeout_ms: 200,
            // The node lifecycle controller's own pace (`--node-eviction-rate`, 0.1 node/s).
            max_nodes_per_window: 1,
            rate_window_ms: 10_000,
        }
    }
}

impl DeadNodeSettings {
    fn validate(&self, path: &std::path::Path) -> Result<(), ConfigError> {
        let refuse = |field, problem| ConfigError::DeadNodes {
            path: path.to_owned(),
            field,
            problem,
        };
        if !(1..=10_000).contains(&self.probe_timeout_ms) {
            return Err(refuse(
                "probe_timeout_ms",
                "must be between 1 and 10000: a kubelet's port on the network between nodes \
                 answers within milliseconds, and the probe delays the removal",
            ));
        }
        if self.kubelet_port == 0 {
            return Err(refuse(
                "kubelet_port",
                "must be the kubelet's port (10250 by default)",
            ));
        }
        if self.mark_pods_not_ready && (self.max_nodes_per_window == 0 || self.rate_window_ms == 0)
        {
            return Err(refuse(
                "max_nodes_per_window",
                "and rate_window_ms must be above 0 while mark_pods_not_ready is on; set \
                 mark_pods_not_ready = false to never act",
            ));
        }
        Ok(())
    }

    pub fn probe_timeout(&self) -> Duration {
        Duration::from_millis(self.probe_timeout_ms)
    }

    pub fn rate_window(&self) -> Duration {
        Duration::from_millis(self.rate_window_ms)
    }
}

/// The `[bgp]` section: where the BIRD the agent runs lives, and its working directory.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BgpSettings {
    /// The BIRD 2 daemon (Debian: bird2).
    #[serde(default = "default_bird")]
    pub bird: PathBuf,
    /// Its control client.
    #[serde(default = "default_birdc")]
    pub birdc: PathBuf,
    /// BIRD's configuration, control socket and pid file; root-only (it holds passwords).
    #[serde(default = "default_bgp_run_dir")]
    pub run_dir: PathBuf,
    /// The BGP router ID; by default the node's first IPv4 address (`[node] addresses`), else
    /// BIRD's choice (the lowest IPv4 address of the node's interfaces).
    #[serde(default)]
    pub router_id: Option<std::net::Ipv4Addr>,
    /// How often the sessions' state is read for status, metrics and conditions.
    #[serde(default = "default_bgp_status_ms")]
    pub status_interval_ms: u64,
    /// The namespace of the Secrets BGPPeers name in `passwordSecretRef` (Kubernetes store):
    /// one that holds those Secrets alone, so the agents' `get` on Secrets reaches no other.
    #[serde(default = "default_bgp_secret_namespace")]
    pub secret_namespace: String,
}

fn default_bird() -> PathBuf {
    PathBuf::from("bird")
}
fn default_birdc() -> PathBuf {
    PathBuf::from("birdc")
}
fn default_bgp_run_dir() -> PathBuf {
    PathBuf::from("/run/ipam/bgp")
}
fn default_bgp_status_ms() -> u64 {
    1000
}
fn default_bgp_secret_namespace() -> String {
    "ipam-bgp-secrets".to_owned()
}

/// The `[gossip]` section: agents tell each other who is alive over UDP, authenticated with a
/// cluster key, and the store keeps only a slow lease per node (docs/liveness.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GossipSettings {
    /// The UDP port every agent listens on, on its address between nodes.
    #[serde(default = "default_gossip_port")]
    pub port: u16,
    /// The address this agent gossips on; by default the first of its record's addresses
    /// (`[ipam] node_addresses`, else its Node's or its first uplink's).
    #[serde(default)]
    pub address: Option<IpAddr>,
    /// The cluster key this agent signs with (at least 32 bytes; a file mounted from a Secret).
    pub key_file: PathBuf,
    /// Keys accepted besides `key_file`'s, for a rotation (docs/liveness.md).
    #[serde(default)]
    pub also_accept_key_files: Vec<PathBuf>,
    #[serde(default = "default_probe_period_ms")]
    pub probe_period_ms: u64,
    #[serde(default = "default_probe_rtt_ms")]
    pub probe_rtt_ms: u64,
    #[serde(default = "default_indirect_probes")]
    pub indirect_probes: usize,
    /// A probed member that did not answer is declared dead this long later, unless it refutes.
    #[serde(default = "default_suspect_to_down_ms")]
    pub suspect_to_down_ms: u64,
    /// This agent's responders go silent after hearing no other member for this long; below
    /// `suspect_to_down_ms`, so a node cut off is silent before anyone takes its IPs over.
    #[serde(default = "default_fence_quiet_ms")]
    pub fence_quiet_ms: u64,
    /// ... or while most of its probes within this window went unanswered (a minority).
    #[serde(default = "default_fence_window_ms")]
    pub fence_window_ms: u64,
    /// The others wait this long after declaring a member dead before answering its IPs: a
    /// member cut off with a minority has gone silent by then.
    #[serde(default = "default_takeover_hold_ms")]
    pub takeover_hold_ms: u64,
}

pub const DEFAULT_GOSSIP_PORT: u16 = 7946;

fn default_gossip_port() -> u16 {
    DEFAULT_GOSSIP_PORT
}
fn default_probe_period_ms() -> u64 {
    millis(ipam_gossip::Timing::default().probe_period)
}
fn default_probe_rtt_ms() -> u64 {
    millis(ipam_gossip::Timing::default().probe_rtt)
}
fn default_indirect_probes() -> usize {
    ipam_gossip::Timing::default().indirect_probes
}
fn default_suspect_to_down_ms() -> u64 {
    millis(ipam_gossip::Timing::default().suspect_to_down)
}
fn default_fence_quiet_ms() -> u64 {
    millis(ipam_gossip::Timing::default().fence_quiet)
}
fn default_fence_window_ms() -> u64 {
    millis(ipam_gossip::Timing::default().fence_window)
}
fn default_takeover_hold_ms() -> u64 {
    millis(ipam_gossip::Timing::default().takeover_hold)
}
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl GossipSettings {
    /// The protocol's timings as configured.
    pub fn timing(&self) -> ipam_gossip::Timing {
        ipam_gossip::Timing {
            probe_period: Duration::from_millis(self.probe_period_ms),
            probe_rtt: Duration::from_millis(self.probe_rtt_ms),
            indirect_probes: self.indirect_probes,
            suspect_to_down: Duration::from_millis(self.suspect_to_down_ms),
            fence_quiet: Duration::from_millis(self.fence_quiet_ms),
            fence_window: Duration::from_millis(self.fence_window_ms),
            takeover_hold: Duration::from_millis(self.takeover_hold_ms),
            ..ipam_gossip::Timing::default()
        }
    }
}

/// The `[metrics]` section: off unless `listen` is set (loopback is the usual choice; a
/// DaemonSet's probes reach the host's loopback).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    /// Where to serve `/metrics`, `/healthz` and `/readyz`, e.g. `127.0.0.1:9963`.
    #[serde(default)]
    pub listen: Option<std::net::SocketAddr>,
}

/// The `[store]` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    #[serde(default)]
    pub kind: StoreKind,
    /// The embedded store's file (`[ipam] store` sets it too, for older files).
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Required for `kind = "etcd"`.
    #[serde(default)]
    pub etcd: Option<ipam_etcd::EtcdConfig>,
    /// For `kind = "kubernetes"` (optional: the defaults suit the manifests in deploy/).
    #[serde(default)]
    pub kubernetes: KubernetesStoreSettings,
    /// Whose annotations on a Service are read, by prefix (default: this project's, Cilium
    /// LB-IPAM's and MetalLB's); the precedence is fixed (docs/migration.md).
    #[serde(default)]
    pub service_annotations: ipam_core::lb::annotations::AnnotationSources,
}

/// `[store.kubernetes]`: the API server is found by the usual rules (in a pod, its service
/// account; elsewhere `KUBECONFIG` or `~/.kube/config`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesStoreSettings {
    /// The namespace of the project's Leases and ConfigMap (where it is deployed).
    pub namespace: String,
}

impl Default for KubernetesStoreSettings {
    fn default() -> Self {
        Self {
            namespace: "ipam-system".to_owned(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// A database file on this node: one node, or a cluster run from one host.
    #[default]
    Embedded,
    /// etcd v3: several nodes and operator replicas share the state.
    Etcd,
    /// The Kubernetes API: custom resources (deploy/base/crds.yaml) and Leases.
    Kubernetes,
}

impl StoreKind {
    /// Whether other processes (nodes, operator replicas) can share the store.
    pub fn is_shared(self) -> bool {
        matches!(self, Self::Etcd | Self::Kubernetes)
    }
}

/// The `[cluster]` section: timings of the agent and operator roles.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSettings {
    /// A node's liveness lease lasts this long; the agent renews it three times as often (once
    /// every `node_renew_ms` with `[gossip]`).
    pub node_lease_ms: u64,
    /// With `[gossip]`, the lease is a slow backstop (who holds blocks), renewed this often.
    pub node_renew_ms: u64,
    /// A node whose lease stays unrenewed this long loses its blocks.
    pub node_grace_ms: u64,
    /// The leading operator's lease; another replica takes over this long after the leader
    /// stopped renewing it.
    pub operator_lease_ms: u64,
    /// Controllers react to the store's watches, and run a full pass this often regardless.
    pub resync_ms: u64,
    /// This operator replica's name in the election; defaults to host name and process id.
    pub identity: Option<String>,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            node_lease_ms: 15_000,
            node_renew_ms: 10_000,
            node_grace_ms: 60_000,
            operator_lease_ms: 15_000,
            resync_ms: 30_000,
            identity: None,
        }
    }
}

impl ClusterSettings {
    pub fn node_lease(&self) -> Duration {
        Duration::from_millis(self.node_lease_ms)
    }

    /// How often the agent renews its lease: a third of it, or `node_renew_ms` when the lease
    /// only backs the gossip up.
    pub fn node_renew_interval(&self, gossip: bool) -> Duration {
        if gossip {
            Duration::from_millis(self.node_renew_ms)
        } else {
            self.node_lease() / 3
        }
    }

    pub fn node_grace(&self) -> Duration {
        Duration::from_millis(self.node_grace_ms)
    }

    pub fn operator_lease(&self) -> Duration {
        Duration::from_millis(self.operator_lease_ms)
    }

    pub fn resync(&self) -> Duration {
        Duration::from_millis(self.resync_ms)
    }

    pub fn identity(&self) -> String {
        self.identity
            .clone()
            .unwrap_or_else(|| format!("{}-{}", default_node_name(), std::process::id()))
    }
}

/// The `[node]` section: who this node is, for the Service IPs it may answer for and for the
/// gossip. With `[ipam]` the same three may be given there as `node_name`, `node_labels` and
/// `node_addresses` (the older spelling); each in one place only.
#[derive(Debug, Clone, Default, Deserialize)]
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
}

impl NodeSettings {
    /// Who besides root may use the local API.
    pub fn api_access(&self) -> crate::api::server::Access {
        crate::api::server::Access {
            group: self.socket_group,
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

/// The `[ipam]` section (standalone role: operator and agent in this process, embedded store).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpamSettings {
    pub mode: IpamMode,
    /// This node's name in the cluster state (`[node] name`, which see; resolved on load).
    #[serde(default)]
    pub node_name: String,
    /// The embedded store (cluster state: pools, node records, mode).
    #[serde(default = "default_store")]
    pub store: PathBuf,
    /// Node-local allocation state and the published status (`status.json`).
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// The local API socket (`[node] socket`, which see; resolved on load).
    #[serde(default)]
    pub socket: PathBuf,
    /// Pool the router and health addresses come from (and, for now, pod addresses).
    #[serde(default = "default_infra_pool")]
    pub infra_pool: String,
    /// Families the node needs router and health addresses in.
    #[serde(default = "default_families")]
    pub families: Vec<Family>,
    /// Also allocate an ingress address per family (for an ingress/gateway proxy on the node).
    #[serde(default)]
    pub ingress: bool,
    /// Multi-pool: free addresses kept ready per family (0: blocks only on demand).
    #[serde(default)]
    pub pre_allocate: u64,
    /// Multi-pool: `pre_allocate` for the pools named here (Cilium's
    /// `ipam-multi-pool-pre-allocation`), the others keep `pre_allocate`: a busy tenant's pool
    /// keeps more addresses ready, a rarely used one none.
    #[serde(default)]
    pub pre_allocate_by_pool: BTreeMap<String, u64>,
    /// Kubernetes mode: the node's blocks (Node.spec.podCIDRs).
    #[serde(default)]
    pub pod_cidrs: Vec<Cidr>,
    /// The device the daemon creates and keeps that holds the node's router addresses (the pods'
    /// gateway), like Cilium's `cilium_host`.
    #[serde(default = "default_host_device")]
    pub host_device: String,
    /// Interfaces where traffic for local pods arrives from other hosts; the pod datapath is
    /// attached there so it reaches pods without the host's routing.
    #[serde(default)]
    pub uplinks: Vec<String>,
    /// The node's addresses on the network between nodes (one per family), where the other
    /// nodes route this node's pod CIDRs; by default the first uplink's addresses. Resolved
    /// with `[node] addresses` on load.
    #[serde(default)]
    pub node_addresses: Vec<IpAddr>,
    /// The node's labels (`[node] labels`, which see; resolved on load).
    #[serde(default)]
    pub node_labels: BTreeMap<String, String>,
    /// `[node.announce]`, for the node's record (resolved on load; not read from `[ipam]`).
    #[serde(skip)]
    pub announce: AnnounceSettings,
    /// Pools written to the store on start and on reload.
    #[serde(default, rename = "pool")]
    pub pools: Vec<PoolConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    #[serde(flatten)]
    pub spec: PodIpPoolSpec,
}

/// `NODE_NAME` when set (the DaemonSet passes the Kubernetes node name down: it need not be
/// the host name), else the host name.
fn default_node_name() -> String {
    if let Some(name) = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()) {
        return name;
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "node".to_owned())
}

fn default_host_device() -> String {
    "ipam_host".to_owned()
}

fn default_socket() -> PathBuf {
    PathBuf::from(ipam_api::DEFAULT_SOCKET)
}

pub(crate) fn default_store() -> PathBuf {
    PathBuf::from("/var/lib/ipam/store.redb")
}

impl IpamSettings {
    /// The free addresses the node keeps ready in `pool`, per family.
    pub fn pre_allocate_for(&self, pool: &str) -> u64 {
        self.pre_allocate_by_pool
            .get(pool)
            .copied()
            .unwrap_or(self.pre_allocate)
    }
}

fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/ipam/node")
}

fn default_infra_pool() -> String {
    "default".to_owned()
}

fn default_families() -> Vec<Family> {
    vec![Family::V4]
}

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

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error(
        "config file {path}: heartbeat_interval_ms ({interval}) must be greater than 0 and at most \
         half of liveness_timeout_ms ({timeout}), or one late heartbeat silences the responders; \
         raise liveness_timeout_ms or lower heartbeat_interval_ms"
    )]
    Heartbeat {
        path: PathBuf,
        interval: u64,
        timeout: u64,
    },
    #[error(
        "config file {path}: [store] kind = \"etcd\" needs a [store.etcd] section with the \
         members' client URLs in endpoints"
    )]
    EtcdMissing { path: PathBuf },
    #[error(
        "config file {path}: [datapath] liveness_timeout_ms ({timeout}) must be under half of \
         [cluster] node_lease_ms ({lease}): a node that cannot renew its lease must go silent \
         before another node may take its service IPs; lower liveness_timeout_ms or raise \
         node_lease_ms"
    )]
    Fencing {
        path: PathBuf,
        timeout: u64,
        lease: u64,
    },
    #[error(
        "config file {path}: [datapath] liveness_timeout_ms ({timeout}) and [gossip] \
         fence_quiet_ms ({quiet}) must both be under [gossip] suspect_to_down_ms ({suspicion}): \
         a killed or cut-off agent must go silent before another node may take its service IPs \
         over; for example liveness_timeout_ms = 300 with heartbeat_interval_ms = 100"
    )]
    GossipFencing {
        path: PathBuf,
        timeout: u64,
        quiet: u64,
        suspicion: u64,
    },
    #[error(
        "config file {path}: [cluster] node_renew_ms ({renew}) must be at most a third of \
         node_grace_ms ({grace}), or a node loses its blocks after one or two slow renewals"
    )]
    Renewal {
        path: PathBuf,
        renew: u64,
        grace: u64,
    },
    #[error(
        "config file {path}: [gossip] needs a shared store ([store] kind = \"etcd\" or \
         \"kubernetes\"): on one host there is no one to gossip with; remove [gossip]"
    )]
    GossipAlone { path: PathBuf },
    #[error("config file {path}: [dead_nodes] {field}: {problem}")]
    DeadNodes {
        path: PathBuf,
        field: &'static str,
        problem: &'static str,
    },
    #[error(
        "config file {path}: [cluster] node_grace_ms ({grace}) must be at least node_lease_ms \
         ({lease}), or nodes lose their blocks while their lease still holds"
    )]
    Grace {
        path: PathBuf,
        grace: u64,
        lease: u64,
    },
    #[error(
        "config file {path}: [node] {field} and [ipam] {older} (its older spelling) are both \
         set; keep [node] {field} only"
    )]
    NodeSetTwice {
        path: PathBuf,
        field: &'static str,
        older: &'static str,
    },
    #[error(
        "config file {path}: IP {ip} is announced twice on interface {interface}; remove one of \
         the [[announcement]] entries"
    )]
    DuplicateAnnouncement {
        path: PathBuf,
        ip: IpAddr,
        interface: String,
    },
    #[error(
        "config file {path}: IP {ip} on interface {interface} cannot be announced: {why}; \
         announce a unicast address"
    )]
    NotAnnounceable {
        path: PathBuf,
        ip: IpAddr,
        interface: String,
        why: &'static str,
    },
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses and validates config text; `path` only names the source in errors.
    pub fn parse(path: &std::path::Path, text: &str) -> Result<Self, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        config.resolve_node(path)?;
        config.validate(path)?;
        Ok(config)
    }

    /// One identity for the node, whichever section gave it: `[node]` and `[ipam]` end up
    /// with the same name, labels and addresses (the default name filled in).
    fn resolve_node(&mut self, path: &std::path::Path) -> Result<(), ConfigError> {
        let node = &mut self.node;
        if let Some(ipam) = self.ipam.as_mut() {
            let twice = |field, older| ConfigError::NodeSetTwice {
                path: path.to_owned(),
                field,
                older,
            };
            if !node.name.is_empty() && !ipam.node_name.is_empty() {
                return Err(twice("name", "node_name"));
            }
            if !node.labels.is_empty() && !ipam.node_labels.is_empty() {
                return Err(twice("labels", "node_labels"));
            }
            if !node.addresses.is_empty() && !ipam.node_addresses.is_empty() {
                return Err(twice("addresses", "node_addresses"));
            }
            if !node.socket.as_os_str().is_empty() && !ipam.socket.as_os_str().is_empty() {
                return Err(twice("socket", "socket"));
            }
            node.socket.push(&ipam.socket);
            node.name.push_str(&ipam.node_name);
            node.labels.append(&mut ipam.node_labels.clone());
            node.addresses.extend(ipam.node_addresses.iter().copied());
        }
        if node.name.is_empty() {
            node.name = default_node_name();
        }
        if node.socket.as_os_str().is_empty() {
            node.socket = default_socket();
        }
        if let Some(ipam) = self.ipam.as_mut() {
            ipam.announce = node.announce.clone();
            ipam.socket = node.socket.clone();
            ipam.node_name = node.name.clone();
            ipam.node_labels = node.labels.clone();
            ipam.node_addresses = node.addresses.clone();
        }
        Ok(())
    }

    /// Without `[ipam]` on a shared store: the node answers for the cluster's Service IPs and
    /// does nothing else (no pod IPAM, no CNI, no pod datapath, no change to its routes).
    pub fn is_add_on(&self) -> bool {
        self.ipam.is_none() && self.store.kind.is_shared()
    }

    fn validate(&self, path: &std::path::Path) -> Result<(), ConfigError> {
        let d = &self.datapath;
        if d.heartbeat_interval_ms == 0 || d.heartbeat_interval_ms * 2 > d.liveness_timeout_ms {
            return Err(ConfigError::Heartbeat {
                path: path.to_owned(),
                interval: d.heartbeat_interval_ms,
                timeout: d.liveness_timeout_ms,
            });
        }
        if self.store.kind == StoreKind::Etcd
            && self
                .store
                .etcd
                .as_ref()
                .is_none_or(|e| e.endpoints.is_empty())
        {
            return Err(ConfigError::EtcdMissing {
                path: path.to_owned(),
            });
        }
        if self.gossip.is_some() && !self.store.kind.is_shared() {
            return Err(ConfigError::GossipAlone {
                path: path.to_owned(),
            });
        }
        self.dead_nodes.validate(path)?;
        if self.cluster.node_grace_ms < self.cluster.node_lease_ms {
            return Err(ConfigError::Grace {
                path: path.to_owned(),
                grace: self.cluster.node_grace_ms,
                lease: self.cluster.node_lease_ms,
            });
        }
        let mut seen = std::collections::BTreeSet::new();
        for a in &self.announcements {
            if let Some(why) = not_announceable(a.ip) {
                return Err(ConfigError::NotAnnounceable {
                    path: path.to_owned(),
                    ip: a.ip,
                    interface: a.interface.clone(),
                    why,
                });
            }
            if !seen.insert((a.ip, a.interface.as_str())) {
                return Err(ConfigError::DuplicateAnnouncement {
                    path: path.to_owned(),
                    ip: a.ip,
                    interface: a.interface.clone(),
                });
            }
        }
        Ok(())
    }

    /// For a node on a shared store: its responders must go silent (liveness timeout after the
    /// last heartbeat, which stops at half a lease without renewal) before another node may take
    /// its service IPs over (a whole lease without renewal).
    pub fn check_fencing(&self, path: &std::path::Path) -> Result<(), ConfigError> {
        if !self.store.kind.is_shared() {
            return Ok(());
        }
        let timeout = self.datapath.liveness_timeout_ms;
        let Some(gossip) = &self.gossip else {
            if timeout * 2 >= self.cluster.node_lease_ms {
                return Err(ConfigError::Fencing {
                    path: path.to_owned(),
                    timeout,
                    lease: self.cluster.node_lease_ms,
                });
            }
            return Ok(());
        };
        // No member is declared dead sooner than `suspect_to_down` after it stopped answering:
        // a killed agent's responders (liveness timeout) and a cut-off one's fence (quiet) must
        // both be silent by then.
        let suspicion = gossip.suspect_to_down_ms;
        if timeout >= suspicion || gossip.fence_quiet_ms >= suspicion {
            return Err(ConfigError::GossipFencing {
                path: path.to_owned(),
                timeout,
                quiet: gossip.fence_quiet_ms,
                suspicion,
            });
        }
        if self.cluster.node_renew_ms.saturating_mul(3) > self.cluster.node_grace_ms {
            return Err(ConfigError::Renewal {
                path: path.to_owned(),
                renew: self.cluster.node_renew_ms,
                grace: self.cluster.node_grace_ms,
            });
        }
        Ok(())
    }

    /// The store as configured, with the embedded store's file resolved (`[store] path`, else
    /// `[ipam] store`, else the default).
    pub fn store_settings(&self) -> StoreSettings {
        let mut store = self.store.clone();
        if store.path.is_none() {
            store.path = Some(
                self.ipam
                    .as_ref()
                    .map_or_else(default_store, |i| i.store.clone()),
            );
        }
        store
    }

    /// The attach mode configured for `interface` (the default when it is not listed).
    pub fn attach_mode(&self, interface: &str) -> AttachMode {
        self.interfaces
            .get(interface)
            .map(|i| i.attach)
            .unwrap_or_default()
    }
}

/// Why an address can never be answered for on a link, or `None` when it can.
fn not_announceable(ip: IpAddr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("it is the unspecified address");
    }
    if ip.is_multicast() {
        return Some("it is a multicast address");
    }
    if ip.is_loopback() {
        return Some("it is a loopback address");
    }
    if let IpAddr::V4(v4) = ip
        && v4.is_broadcast()
    {
        return Some("it is the broadcast address");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(std::path::Path::new("test.toml"), text)
    }

    #[test]
    fn empty_file_is_valid_and_announces_nothing() {
        let c = parse("").unwrap();
        assert!(c.announcements.is_empty());
        assert_eq!(c.datapath.bpffs_root, PathBuf::from(DEFAULT_BPFFS_ROOT));
        assert_eq!(c.attach_mode("eth0"), AttachMode::Auto);
    }

    #[test]
    fn service_annotations_are_chosen_by_prefix() {
        let c = parse("").unwrap();
        assert!(
            c.store
                .service_annotations
                .reads("metallb.io/loadBalancerIPs")
        );
        let c = parse("[store]\nservice_annotations = [\"ipam-ebpf.io\", \"lbipam.cilium.io\"]\n")
            .unwrap();
        let sources = &c.store.service_annotations;
        assert!(sources.reads("lbipam.cilium.io/ips") && !sources.reads("metallb.io/address-pool"));
        let e = parse("[store]\nservice_annotations = [\"metallb\"]\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"metallb\"") && e.contains("metallb.universe.tf"),
            "{e}"
        );
    }

    #[test]
    fn pre_allocation_is_per_pool_where_named() {
        let c = parse(
            "[ipam]\nmode = \"multi-pool\"\npre_allocate = 4\n\
             [ipam.pre_allocate_by_pool]\ntenant-a = 16\nrare = 0\n",
        )
        .unwrap();
        let ipam = c.ipam.unwrap();
        assert_eq!(ipam.pre_allocate_for("tenant-a"), 16);
        assert_eq!(ipam.pre_allocate_for("rare"), 0);
        assert_eq!(ipam.pre_allocate_for("default"), 4);
    }

    #[test]
    fn full_file_parses() {
        let c = parse(
            r#"
            [datapath]
            bpffs_root = "/sys/fs/bpf/x"
            liveness_timeout_ms = 2000
            heartbeat_interval_ms = 200
            [interfaces.eth1]
            attach = "xdp-generic"
            [[announcement]]
            ip = "192.0.2.1"
            interface = "eth1"
            [[announcement]]
            ip = "2001:db8::1"
            interface = "eth1"
            "#,
        )
        .unwrap();
        assert_eq!(c.announcements.len(), 2);
        assert_eq!(c.attach_mode("eth1"), AttachMode::XdpGeneric);
        assert_eq!(c.datapath.liveness_timeout(), Duration::from_secs(2));
    }

    #[test]
    fn errors_name_the_file_and_the_object() {
        let dup = "[[announcement]]\nip = \"192.0.2.1\"\ninterface = \"eth0\"\n".repeat(2);
        let e = parse(&dup).unwrap_err().to_string();
        assert!(
            e.contains("test.toml") && e.contains("192.0.2.1") && e.contains("eth0"),
            "{e}"
        );

        let e = parse("[[announcement]]\nip = \"224.0.0.1\"\ninterface = \"eth0\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("multicast") && e.contains("224.0.0.1"), "{e}");

        let e = parse("[[announcement]]\nip = \"192.0.2.300\"\ninterface = \"eth0\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("test.toml"), "{e}");

        let e = parse("[datapath]\nliveness_timeout_ms = 500\nheartbeat_interval_ms = 400\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("heartbeat_interval_ms"), "{e}");

        let e = parse("[interfaces.eth0]\nattach = \"fast\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("fast"), "{e}");
    }

    #[test]
    fn ipam_section_parses_with_pools() {
        let c = parse(
            r#"
            [ipam]
            mode = "multi-pool"
            node_name = "worker-1"
            families = ["v4", "v6"]
            [[ipam.pool]]
            name = "default"
            ipv4 = { cidrs = ["10.244.0.0/16"], maskSize = 24 }
            ipv6 = { cidrs = ["fd00::/104"], maskSize = 120 }
            "#,
        )
        .unwrap();
        let ipam = c.ipam.unwrap();
        assert_eq!(ipam.mode, IpamMode::MultiPool);
        assert_eq!(ipam.families, vec![Family::V4, Family::V6]);
        assert_eq!(ipam.pools[0].spec.ipv6.as_ref().unwrap().mask_size, 120);
        assert_eq!(ipam.infra_pool, "default");
        assert_eq!(ipam.socket, PathBuf::from(ipam_api::DEFAULT_SOCKET));

        let e = parse("[ipam]\nmode = \"crd\"\n").unwrap_err().to_string();
        assert!(e.contains("crd") && e.contains("multi-pool"), "{e}");
        let e = parse("[ipam]\nmode = \"cluster-pool\"\nfamilies = [\"v5\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("v5"), "{e}");
    }

    #[test]
    fn gossip_section_defaults_and_the_fencing_checks() {
        let etcd =
            "[store]\nkind = \"etcd\"\n[store.etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n";
        let fast = "[datapath]\nliveness_timeout_ms = 300\nheartbeat_interval_ms = 100\n";
        let c = parse(&format!(
            "{fast}{etcd}[gossip]\nkey_file = \"/etc/ipam/gossip/key\"\n"
        ))
        .unwrap();
        let g = c.gossip.as_ref().unwrap();
        assert_eq!((g.port, g.address), (DEFAULT_GOSSIP_PORT, None));
        assert_eq!(g.timing(), ipam_gossip::Timing::default());
        assert_eq!(c.cluster.node_renew_interval(true), Duration::from_secs(10));
        c.check_fencing(Path::new("test.toml")).unwrap();

        // The responders' default timeout outlives the suspicion: a killed agent would still
        // answer when another takes over.
        let slow = parse(&format!("{etcd}[gossip]\nkey_file = \"/k\"\n")).unwrap();
        let e = slow
            .check_fencing(Path::new("test.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("liveness_timeout_ms (3000)") && e.contains("suspect_to_down_ms (400)"),
            "{e}"
        );
        let e = parse(&format!(
            "{fast}{etcd}[cluster]\nnode_renew_ms = 30000\n[gossip]\nkey_file = \"/k\"\n"
        ))
        .unwrap()
        .check_fencing(Path::new("test.toml"))
        .unwrap_err()
        .to_string();
        assert!(e.contains("node_renew_ms (30000)"), "{e}");
        let e = parse("[gossip]\nkey_file = \"/k\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("[gossip] needs a shared store"), "{e}");
    }

    #[test]
    fn store_and_cluster_sections() {
        let c = parse(
            r#"
            [store]
            kind = "etcd"
            [store.etcd]
            endpoints = ["http://127.0.0.1:2379", "http://127.0.0.1:22379"]
            prefix = "/lab"
            tls = { ca = "/etc/ipam/etcd-ca.pem", cert = "/etc/ipam/etcd.pem", key = "/etc/ipam/etcd-key.pem" }
            [cluster]
            node_lease_ms = 3000
            node_grace_ms = 10000
            "#,
        )
        .unwrap();
        let etcd = c.store.etcd.as_ref().unwrap();
        assert_eq!((c.store.kind, etcd.endpoints.len()), (StoreKind::Etcd, 2));
        assert_eq!(etcd.prefix, "/lab");
        assert_eq!(c.cluster.node_renew_interval(false), Duration::from_secs(1));
        assert_eq!(c.cluster.operator_lease_ms, 15_000);

        let e = parse("[store]\nkind = \"etcd\"\n").unwrap_err().to_string();
        assert!(e.contains("[store.etcd]") && e.contains("endpoints"), "{e}");
        let k = parse("[store]\nkind = \"kubernetes\"\n").unwrap();
        assert_eq!(
            (k.store.kind, k.store.kubernetes.namespace.as_str()),
            (StoreKind::Kubernetes, "ipam-system")
        );
        let k = parse(
            "[store]\nkind = \"kubernetes\"\n[store.kubernetes]\nnamespace = \"kube-system\"\n",
        )
        .unwrap();
        assert!(k.store.kind.is_shared() && k.store.kubernetes.namespace == "kube-system");
        let e = parse("[cluster]\nnode_lease_ms = 5000\nnode_grace_ms = 1000\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("node_grace_ms") && e.contains("5000"), "{e}");
        let e = parse("[store.etcd]\nendpoints = [\"x\"]\nport = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("port"), "{e}");
        // Older files name the embedded store's file in [ipam].
        let c = parse("[ipam]\nmode = \"cluster-pool\"\nstore = \"/x/s.redb\"\n").unwrap();
        assert_eq!(c.store_settings().path.unwrap(), PathBuf::from("/x/s.redb"));
    }

    #[test]
    fn the_node_is_one_identity_whichever_section_names_it() {
        let c = parse(
            "[node]\nname = \"n1\"\nlabels = { zone = \"a\" }\naddresses = [\"10.0.0.1\"]\n\
             [ipam]\nmode = \"cluster-pool\"\n",
        )
        .unwrap();
        let ipam = c.ipam.as_ref().unwrap();
        assert_eq!(
            (c.node.name.as_str(), ipam.node_name.as_str()),
            ("n1", "n1")
        );
        assert_eq!(ipam.node_labels.get("zone").map(String::as_str), Some("a"));
        assert_eq!(ipam.node_addresses, c.node.addresses);
        // The older spelling in [ipam] reaches [node].
        let c = parse(
            "[ipam]\nmode = \"cluster-pool\"\nnode_name = \"n2\"\nnode_labels = { r = \"1\" }\n",
        )
        .unwrap();
        assert_eq!(c.node.name, "n2");
        assert_eq!(c.node.labels.get("r").map(String::as_str), Some("1"));
        // Unnamed: the default name, the same in both.
        let c = parse("[ipam]\nmode = \"cluster-pool\"\n").unwrap();
        assert!(!c.node.name.is_empty());
        assert_eq!(c.node.name, c.ipam.unwrap().node_name);
        for (field, older) in [
            ("name = \"x\"", "node_name"),
            ("labels = { a = \"b\" }", "node_labels"),
            ("addresses = [\"10.0.0.1\"]", "node_addresses"),
            ("socket = \"/run/x.sock\"", "socket"),
        ] {
            let value = field.split_once(' ').unwrap().1;
            let text =
                format!("[node]\n{field}\n[ipam]\nmode = \"cluster-pool\"\n{older} {value}\n");
            let e = parse(&text).unwrap_err().to_string();
            let name = field.split(' ').next().unwrap();
            assert!(
                e.contains(&format!("[node] {name}")) && e.contains(&format!("[ipam] {older}")),
                "{e}"
            );
        }
        let c =
            parse("[node]\nsocket = \"/run/x.sock\"\n[ipam]\nmode = \"cluster-pool\"\n").unwrap();
        assert_eq!(c.ipam.unwrap().socket, PathBuf::from("/run/x.sock"));
    }

    #[test]
    fn without_ipam_on_a_shared_store_the_node_is_an_add_on() {
        let etcd =
            "[store]\nkind = \"etcd\"\n[store.etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n";
        assert!(parse(etcd).unwrap().is_add_on());
        assert!(
            !parse(&format!("{etcd}[ipam]\nmode = \"cluster-pool\"\n"))
                .unwrap()
                .is_add_on()
        );
        // One host without a store: the configured announcements only.
        assert!(!parse("").unwrap().is_add_on());
    }

    /// The configuration the README shows must stay valid.
    #[test]
    fn readme_example_parses() {
        let readme = include_str!("../../README.md");
        let start = readme
            .find("# /etc/ipam/ipamd.toml")
            .expect("README shows a config");
        let block = &readme[start..];
        let block = &block[..block.find("```").expect("end of the TOML block")];
        let c = parse(block).unwrap();
        assert_eq!(c.ipam.unwrap().pools[0].name, "default");
        assert_eq!(c.announcements.len(), 1);
    }
}
