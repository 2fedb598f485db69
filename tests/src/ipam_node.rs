//! A node running `ipamd` with IPAM (cluster-pool, one IPv4 pool) in a namespace of its own, for
//! tests and benchmarks that talk to the daemon's API or through `ipam-cni`.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use ipam_daemon::api::{
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
        let ns = Netns::new(tag);
        let root = BpffsRoot::new();
        let dir = TempDir::new(&format!("{tag}-"));
        let config = TempFile::new(tag, "toml");
        std::fs::write(
            &config.0,
            format!(
                "[datapath]\nbpffs_root = \"{}\"\n\n[ipam]\nmode = \"cluster-pool\"\nnode_name = \"{tag}\"\n\
                 store = \"{d}/store.redb\"\nstate_dir = \"{d}/node\"\nsocket = \"{d}/api/ipamd.sock\"\n\n\
                 [[ipam.pool]]\nname = \"default\"\nipv4 = {{ cidrs = [\"{cidr}\"], maskSize = {mask} }}\n",
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
