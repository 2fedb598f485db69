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
//!
//! The file is read and validated in one place (`Config::load`, below); each section's
//! settings are a file of this folder, next to the defaults they document.

mod bgp;
mod cluster;
mod datapath;
mod dead_nodes;
mod gossip;
mod ipam;
mod metrics;
mod node;
mod store;

pub use bgp::BgpSettings;
pub use cluster::ClusterSettings;
pub use datapath::{AnnouncementConfig, AttachMode, DatapathConfig, EbpfLogLevel, InterfaceConfig};
pub use dead_nodes::DeadNodeSettings;
pub use gossip::{DEFAULT_GOSSIP_PORT, GossipSettings};
use ipam::default_socket;
pub use ipam::default_store;
pub use ipam::{IpamSettings, PoolConfig};
pub use metrics::MetricsSettings;
use node::default_node_name;
pub use node::{AnnounceSettings, NodeSettings, OnStop};
pub use store::{KubernetesStoreSettings, StoreKind, StoreSettings};

use std::{collections::BTreeMap, net::IpAddr, path::PathBuf};

use serde::Deserialize;
use thiserror::Error;

/// Default bpffs directory that holds every map, program and link pin of the daemon.
pub const DEFAULT_BPFFS_ROOT: &str = "/sys/fs/bpf/ipam";

/// Where ipamd and ipamctl read the configuration file unless told otherwise.
pub const DEFAULT_CONFIG_FILE: &str = "/etc/ipam/ipamd.toml";

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
        "config file {path}: [node] restart_within_ms ({value}) must be between 1000 and 60000: \
         long enough for an agent to start again, short enough that a node that does not come \
         back is not answered for long"
    )]
    RestartWithin { path: PathBuf, value: u64 },
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
        if !node::RESTART_WITHIN_MS.contains(&self.node.restart_within_ms) {
            return Err(ConfigError::RestartWithin {
                path: path.to_owned(),
                value: self.node.restart_within_ms,
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
    use std::{path::Path, time::Duration};

    use ipam_core::{Family, pod::pool::IpamMode};

    use super::*;

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
    fn a_stop_is_a_leave_unless_said_to_be_a_restart() {
        assert_eq!(parse("").unwrap().node.on_stop, OnStop::Leave);
        let c = parse("[node]\non_stop = \"restart\"\n").unwrap();
        assert_eq!(c.node.on_stop, OnStop::Restart);
        let e = parse("[node]\non_stop = \"reboot\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("reboot") && e.contains("leave") && e.contains("restart"),
            "{e}"
        );
        // `auto`: a restart unless the node may not announce when it stops.
        let auto = parse("[node]\non_stop = \"auto\"\n").unwrap().node.on_stop;
        assert_eq!(auto, OnStop::Auto);
        assert_eq!(auto.resolve(None), OnStop::Restart);
        assert_eq!(auto.resolve(Some("its Node is cordoned")), OnStop::Leave);
        assert_eq!(OnStop::Restart.resolve(Some("cordoned")), OnStop::Restart);
        assert_eq!(OnStop::Leave.resolve(None), OnStop::Leave);
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
