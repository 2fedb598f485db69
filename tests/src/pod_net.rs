//! A dual-stack node running `ipamd` with the pod datapath, pods added through `ipam-cni` as a
//! container runtime adds them, and a client host behind the node's uplink.
//!
//! Addresses: pods from 10.250.0.0/16 (/24 blocks) and fd00:250::/104 (/120 blocks); the uplink
//! link is 192.168.250.0/24 and fd01::/64 (node .1 / ::1, client .2 / ::2). Every namespace is
//! the test's own and goes away on drop.

use std::time::Duration;

use ipam_api::{
    client::call,
    types::{Request, Response},
};
use serde_json::{Value, json};

use crate::{
    cni::run_cni,
    daemon::Daemon,
    ipam_node::IpamNode,
    netns::{Netns, veth},
    workspace_binary,
};

pub const UPLINK: &str = "up0";
pub const CLIENT_V4: &str = "192.168.250.2";
pub const CLIENT_V6: &str = "fd01::2";

pub struct PodNode {
    pub ipam: IpamNode,
    pub daemon: Option<Daemon>,
    /// A host on the node's uplink that routes the pod CIDRs to the node.
    pub client: Netns,
}

/// One pod: its namespace, CNI identity and addresses.
pub struct Pod {
    pub ns: Netns,
    pub container: String,
    pub v4: String,
    pub v6: String,
    pub result: Value,
}

impl PodNode {
    pub fn start(tag: &str) -> Self {
        let ipam = IpamNode::dual_stack(
            tag,
            ("10.250.0.0/16", 24),
            ("fd00:250::/104", 120),
            &[UPLINK],
        );
        let client = Netns::new(&format!("{tag}c"));
        veth(&ipam.ns, UPLINK, &client, "ext0");
        ipam.ns.add_address(UPLINK, "192.168.250.1/24");
        ipam.ns.add_address(UPLINK, "fd01::1/64");
        client.add_address("ext0", &format!("{CLIENT_V4}/24"));
        client.add_address("ext0", &format!("{CLIENT_V6}/64"));
        client.route_via("10.250.0.0/16", "192.168.250.1");
        client.route_via("fd00:250::/104", "fd01::1");
        let daemon = Some(ipam.start_daemon());
        Self {
            ipam,
            daemon,
            client,
        }
    }

    /// The network configuration with `ipam-cni` as the main plugin.
    pub fn conf(&self) -> Value {
        json!({
            "cniVersion": "1.1.0",
            "name": "podnet",
            "type": "ipam-cni",
            "socket": self.ipam.socket(),
            "timeoutMs": 5000,
            "mtu": 1500,
        })
    }

    /// Runs `ipam-cni` in the node's namespace, as the runtime would.
    pub fn cni(&self, command: &str, container: &str, pod: Option<&Netns>) -> (bool, Value) {
        run_cni(
            &workspace_binary("ipam-cni"),
            Some(&self.ipam.ns),
            command,
            container,
            "eth0",
            pod,
            &self.conf(),
        )
    }

    /// A new pod namespace wired by CNI ADD.
    pub fn add_pod(&self, tag: &str) -> Pod {
        let ns = Netns::new(tag);
        let container = format!("ctr-{}", ns.name);
        let (ok, result) = self.cni("ADD", &container, Some(&ns));
        assert!(ok, "CNI ADD of {tag}: {result}");
        let (v4, v6) = result_addresses(&result);
        Pod {
            ns,
            container,
            v4,
            v6,
            result,
        }
    }

    /// The datapath's counters by name, from the daemon's API.
    pub fn stats(&self) -> Vec<(String, u64)> {
        match call(
            &self.ipam.socket(),
            &Request::Endpoints,
            Duration::from_secs(5),
        ) {
            Ok(Response::Endpoints { stats, .. }) => stats,
            other => panic!("endpoints: {other:?}"),
        }
    }

    /// A datapath counter read straight from the pinned map (works with the daemon stopped).
    pub fn stat_from_pins(&self, name: &str) -> u64 {
        let stats = ipam_datapath::PodMaps::from_pins(self.ipam.bpffs_root())
            .expect("pinned pod maps")
            .stats()
            .expect("pod stats");
        ipam_common::pod::PodStat::ALL
            .iter()
            .find(|s| s.name() == name)
            .map(|s| stats.get(*s))
            .unwrap_or_else(|| panic!("no counter {name}"))
    }

    pub fn stat(&self, name: &str) -> u64 {
        self.stats()
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no counter {name}"))
            .1
    }
}

/// The pod's first two addresses (IPv4, IPv6) from a CNI ADD result, without prefix lengths.
pub fn result_addresses(result: &Value) -> (String, String) {
    let address = |i: usize| {
        result["ips"][i]["address"]
            .as_str()
            .unwrap_or_else(|| panic!("no address {i} in {result}"))
            .split('/')
            .next()
            .unwrap()
            .to_owned()
    };
    (address(0), address(1))
}

/// The first address of a CNI ADD result, without its prefix length.
pub fn result_address(result: &Value) -> Option<String> {
    result["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .map(str::to_owned)
}

/// `true` when `from` gets an echo reply from `to` within a few seconds.
pub fn reaches(from: &Netns, to: &str) -> bool {
    from.command("ping")
        .args(["-c", "1", "-w", "3", "-q", to])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `true` when `from` gets an echo reply from `to` when sending from `source`.
pub fn reaches_from(from: &Netns, source: &str, to: &str) -> bool {
    from.command("ping")
        .args(["-c", "2", "-w", "2", "-q", "-I", source, to])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// One TCP exchange, as an application sees it: a server in `server` listening on `port` (every
/// address, both families) answers `pong` to `ping`; the client in `client` connects to `to`
/// (a pod's address, or a Service address that the node DNATs to the server). `Err` says what
/// failed, within a few seconds at most.
pub fn tcp_exchange(
    client: &Netns,
    server: &Netns,
    port: u16,
    to: std::net::SocketAddr,
) -> Result<(), String> {
    use std::io::{Read, Write};
    let deadline = std::time::Instant::now() + Duration::from_secs(4);
    // `[::]` takes IPv4 too (the namespace's bindv6only is the kernel's default, off).
    let listener = server.run(move || {
        let listener = std::net::TcpListener::bind((std::net::Ipv6Addr::UNSPECIFIED, port))?;
        listener.set_nonblocking(true)?;
        Ok::<_, std::io::Error>(listener)
    });
    let listener = listener.map_err(|e| format!("listen on port {port}: {e}"))?;
    let served = std::thread::spawn(move || {
        while std::time::Instant::now() < deadline {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    stream.set_nonblocking(false).ok();
                    stream.set_read_timeout(Some(Duration::from_secs(2))).ok();
                    let mut ask = [0u8; 4];
                    if stream.read_exact(&mut ask).is_ok() && &ask == b"ping" {
                        let _ = stream.write_all(b"pong");
                    }
                    return;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => return,
            }
        }
    });
    let answer = client.run(move || {
        let mut stream = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(3))
            .map_err(|e| format!("connect to {to}: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(3)))
            .map_err(|e| e.to_string())?;
        stream
            .write_all(b"ping")
            .map_err(|e| format!("send to {to}: {e}"))?;
        let mut answer = [0u8; 4];
        stream
            .read_exact(&mut answer)
            .map_err(|e| format!("answer from {to}: {e}"))?;
        if &answer == b"pong" {
            Ok(())
        } else {
            Err(format!("{to} answered {answer:?}"))
        }
    });
    let _ = served.join();
    answer
}
