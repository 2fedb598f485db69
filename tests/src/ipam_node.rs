//! A node running `ipamd` with IPAM (cluster-pool, one IPv4 pool) in a namespace of its own, for
//! tests and benchmarks that talk to the daemon's API or through `ipam-cni`.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use ipam_api::{
    client::call,
    types::{Request, Response},
};

use crate::{BpffsRoot, TempDir, TempFile, daemon::Daemon, netns::Netns};

pub struct IpamNode {
    pub ns: Netns,
    pub dir: TempDir,
    config: TempFile,
    _root: BpffsRoot,
}

impl IpamNode {
    /// Prepares the node: pool `default` over `cidr` cut into `/mask` blocks. No daemon yet.
    pub fn new(tag: &str, cidr: &str, mask: u8) -> Self {
        Self::with_ipam(
            tag,
            "",
            &format!(
                "families = [\"v4\"]\n\n[[ipam.pool]]\nname = \"default\"\n\
                 ipv4 = {{ cidrs = [\"{cidr}\"], maskSize = {mask} }}\n"
            ),
        )
    }

    /// As `new`, with `reserved` addresses of the pool (handed out only to pods asking for
    /// them), and addresses kept for the pods of some namespaces: `kept` is (address,
    /// namespace).
    pub fn with_reserved(
        tag: &str,
        cidr: &str,
        mask: u8,
        reserved: &[&str],
        kept: &[(&str, &str)],
    ) -> Self {
        let reservations: String = kept
            .iter()
            .map(|(address, namespace)| {
                format!(
                    "\n[[ipam.pool.reservations]]\naddresses = [\"{address}\"]\n\
                     namespaces = [\"{namespace}\"]\n"
                )
            })
            .collect();
        Self::with_ipam(
            tag,
            "",
            &format!(
                "families = [\"v4\"]\n\n[[ipam.pool]]\nname = \"default\"\n\
                 ipv4 = {{ cidrs = [\"{cidr}\"], maskSize = {mask} }}\nreserved = \
                 {reserved:?}\n{reservations}"
            ),
        )
    }

    /// As `new`, with the metrics and health endpoints on `127.0.0.1:9963` in the node's
    /// namespace.
    pub fn with_metrics(tag: &str, cidr: &str, mask: u8) -> Self {
        Self::with_ipam(
            tag,
            "\n[metrics]\nlisten = \"127.0.0.1:9963\"\n",
            &format!(
                "families = [\"v4\"]\n\n[[ipam.pool]]\nname = \"default\"\n\
                 ipv4 = {{ cidrs = [\"{cidr}\"], maskSize = {mask} }}\n"
            ),
        )
    }

    /// A dual-stack node: pool `default` with an IPv4 and an IPv6 CIDR, and the pod datapath on
    /// `uplinks`. The eBPF programs log at warn level, as an operator watching pods would set
    /// it: spoofed packets show in the daemon's log.
    pub fn dual_stack(tag: &str, v4: (&str, u8), v6: (&str, u8), uplinks: &[&str]) -> Self {
        Self::with_ipam(
            tag,
            "ebpf_log_level = \"warn\"\n",
            &format!(
                "families = [\"v4\", \"v6\"]\nuplinks = {uplinks:?}\n\n[[ipam.pool]]\nname = \"default\"\n\
                 ipv4 = {{ cidrs = [\"{}\"], maskSize = {} }}\n\
                 ipv6 = {{ cidrs = [\"{}\"], maskSize = {} }}\n",
                v4.0, v4.1, v6.0, v6.1
            ),
        )
    }

    fn with_ipam(tag: &str, datapath: &str, ipam: &str) -> Self {
        let ns = Netns::new(tag);
        let root = BpffsRoot::new();
        let dir = TempDir::new(&format!("{tag}-"));
        let config = TempFile::new(tag, "toml");
        std::fs::write(
            &config.0,
            format!(
                "[datapath]\nbpffs_root = \"{}\"\n{datapath}\n[ipam]\nmode = \"cluster-pool\"\nnode_name = \"{tag}\"\n\
                 store = \"{d}/store.redb\"\nstate_dir = \"{d}/node\"\nsocket = \"{d}/api/ipamd.sock\"\n{ipam}",
                root.0.display(),
                d = dir.0.display()
            ),
        )
        .expect("write ipamd config");
        Self {
            ns,
            dir,
            config,
            _root: root,
        }
    }

    /// The bpffs root of the node's datapath.
    pub fn bpffs_root(&self) -> &std::path::Path {
        &self._root.0
    }

    /// The daemon's API socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.0.join("api/ipamd.sock")
    }

    /// `true` when the daemon's API answers that it can serve allocations.
    pub fn ready(&self) -> bool {
        matches!(
            call(&self.socket(), &Request::Status, Duration::from_secs(1)),
            Ok(Response::Ready)
        )
    }

    /// Starts `ipamd` (again, after a kill: state carries over) and waits until it is ready.
    pub fn start_daemon(&self) -> Daemon {
        let daemon = Daemon::start(&self.ns, &self.config.0);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.ready() {
            assert!(
                Instant::now() < deadline,
                "ipamd never became ready:\n{}",
                daemon.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }
}
